"""The compiled Device Plugin API descriptor matches kubelet's v1beta1 API field for field.

The table below is the contract from k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/api.proto
(see shared/reference/kubelet.md §1). Any field that is renamed, renumbered, retyped, relabelled,
added or dropped in proto/deviceplugin/v1beta1/api.proto fails here.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2

from hami_node.plugin.api import api_pb2, constants

FDP = descriptor_pb2.FieldDescriptorProto

# (message, field, number, type, label). type is a scalar name, a ".v1beta1.<Message>" reference,
# or "map<key, value>" for a map field (checked through its generated *Entry message).
FIELDS: tuple[tuple[str, str, int, str, str], ...] = (
    ("DevicePluginOptions", "pre_start_required", 1, "bool", "optional"),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, "bool", "optional"),
    ("RegisterRequest", "version", 1, "string", "optional"),
    ("RegisterRequest", "endpoint", 2, "string", "optional"),
    ("RegisterRequest", "resource_name", 3, "string", "optional"),
    ("RegisterRequest", "options", 4, ".v1beta1.DevicePluginOptions", "optional"),
    ("ListAndWatchResponse", "devices", 1, ".v1beta1.Device", "repeated"),
    ("TopologyInfo", "nodes", 1, ".v1beta1.NUMANode", "repeated"),
    ("NUMANode", "ID", 1, "int64", "optional"),
    ("Device", "ID", 1, "string", "optional"),
    ("Device", "health", 2, "string", "optional"),
    ("Device", "topology", 3, ".v1beta1.TopologyInfo", "optional"),
    ("PreStartContainerRequest", "devices_ids", 1, "string", "repeated"),
    (
        "PreferredAllocationRequest",
        "container_requests",
        1,
        ".v1beta1.ContainerPreferredAllocationRequest",
        "repeated",
    ),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, "string", "repeated"),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, "string", "repeated"),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, "int32", "optional"),
    (
        "PreferredAllocationResponse",
        "container_responses",
        1,
        ".v1beta1.ContainerPreferredAllocationResponse",
        "repeated",
    ),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, "string", "repeated"),
    ("AllocateRequest", "container_requests", 1, ".v1beta1.ContainerAllocateRequest", "repeated"),
    ("ContainerAllocateRequest", "devices_ids", 1, "string", "repeated"),
    ("AllocateResponse", "container_responses", 1, ".v1beta1.ContainerAllocateResponse", "repeated"),
    ("ContainerAllocateResponse", "envs", 1, "map<string, string>", "repeated"),
    ("ContainerAllocateResponse", "mounts", 2, ".v1beta1.Mount", "repeated"),
    ("ContainerAllocateResponse", "devices", 3, ".v1beta1.DeviceSpec", "repeated"),
    ("ContainerAllocateResponse", "annotations", 4, "map<string, string>", "repeated"),
    ("ContainerAllocateResponse", "cdi_devices", 5, ".v1beta1.CDIDevice", "repeated"),
    ("Mount", "container_path", 1, "string", "optional"),
    ("Mount", "host_path", 2, "string", "optional"),
    ("Mount", "read_only", 3, "bool", "optional"),
    ("DeviceSpec", "container_path", 1, "string", "optional"),
    ("DeviceSpec", "host_path", 2, "string", "optional"),
    ("DeviceSpec", "permissions", 3, "string", "optional"),
    ("CDIDevice", "name", 1, "string", "optional"),
)

# Messages without fields.
EMPTY_MESSAGES = frozenset({"Empty", "PreStartContainerResponse"})

# (full method path, request type, response type, server streaming).
METHODS: tuple[tuple[str, str, str, bool], ...] = (
    (constants.REGISTER_METHOD, "v1beta1.RegisterRequest", "v1beta1.Empty", False),
    (
        constants.GET_DEVICE_PLUGIN_OPTIONS_METHOD,
        "v1beta1.Empty",
        "v1beta1.DevicePluginOptions",
        False,
    ),
    (constants.LIST_AND_WATCH_METHOD, "v1beta1.Empty", "v1beta1.ListAndWatchResponse", True),
    (
        constants.GET_PREFERRED_ALLOCATION_METHOD,
        "v1beta1.PreferredAllocationRequest",
        "v1beta1.PreferredAllocationResponse",
        False,
    ),
    (constants.ALLOCATE_METHOD, "v1beta1.AllocateRequest", "v1beta1.AllocateResponse", False),
    (
        constants.PRE_START_CONTAINER_METHOD,
        "v1beta1.PreStartContainerRequest",
        "v1beta1.PreStartContainerResponse",
        False,
    ),
)

SCALAR_NAMES = {
    FDP.TYPE_BOOL: "bool",
    FDP.TYPE_STRING: "string",
    FDP.TYPE_INT32: "int32",
    FDP.TYPE_INT64: "int64",
}
LABEL_NAMES = {
    FDP.LABEL_OPTIONAL: "optional",
    FDP.LABEL_REPEATED: "repeated",
    FDP.LABEL_REQUIRED: "required",
}


def file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def map_entry_type(message: descriptor_pb2.DescriptorProto, field: FDP) -> str | None:
    """ "map<k, v>" when ``field`` is a map field of ``message``, else None."""
    if field.type != FDP.TYPE_MESSAGE:
        return None
    prefix = f".v1beta1.{message.name}."
    if not field.type_name.startswith(prefix):
        return None
    entry_name = field.type_name[len(prefix) :]
    entries = [nested for nested in message.nested_type if nested.name == entry_name]
    assert len(entries) == 1, f"{message.name}.{field.name}: nested type {entry_name} not found"
    entry = entries[0]
    assert entry.options.map_entry, f"{message.name}.{field.name}: {entry_name} is not a map entry"
    by_number = {f.number: f for f in entry.field}
    assert sorted(by_number) == [1, 2], f"{entry_name}: map entry fields {sorted(by_number)}"
    key, value = by_number[1], by_number[2]
    assert (key.name, value.name) == ("key", "value"), f"{entry_name}: {key.name}, {value.name}"
    assert key.label == value.label == FDP.LABEL_OPTIONAL, f"{entry_name}: map entry labels"
    return f"map<{SCALAR_NAMES[key.type]}, {SCALAR_NAMES[value.type]}>"


def describe_type(message: descriptor_pb2.DescriptorProto, field: FDP) -> str:
    map_type = map_entry_type(message, field)
    if map_type is not None:
        return map_type
    if field.type == FDP.TYPE_MESSAGE:
        return field.type_name
    assert field.type in SCALAR_NAMES, f"{message.name}.{field.name}: unexpected type {field.type}"
    return SCALAR_NAMES[field.type]


def test_file_header() -> None:
    proto = file_proto()
    assert proto.syntax == "proto3"
    assert proto.package == "v1beta1"
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert proto.options.go_package == "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
    assert list(proto.dependency) == [], "the API imports no other proto files"
    assert list(proto.enum_type) == []
    assert list(proto.extension) == []


def test_every_field_matches_the_table() -> None:
    proto = file_proto()
    actual = []
    for message in proto.message_type:
        for field in message.field:
            actual.append(
                (
                    message.name,
                    field.name,
                    field.number,
                    describe_type(message, field),
                    LABEL_NAMES[field.label],
                )
            )
    missing = sorted(set(FIELDS) - set(actual))
    extra = sorted(set(actual) - set(FIELDS))
    assert not missing and not extra, f"missing from descriptor: {missing}\nnot in table: {extra}"
    assert len(actual) == len(FIELDS)


def test_message_set_is_exact() -> None:
    proto = file_proto()
    names = [message.name for message in proto.message_type]
    assert len(names) == len(set(names))
    assert set(names) == {row[0] for row in FIELDS} | EMPTY_MESSAGES
    for message in proto.message_type:
        if message.name in EMPTY_MESSAGES:
            assert list(message.field) == [], f"{message.name} must have no fields"
        nested = [n for n in message.nested_type if not n.options.map_entry]
        assert nested == [], f"{message.name}: unexpected nested messages {[n.name for n in nested]}"
        assert list(message.enum_type) == [], f"{message.name}: unexpected enums"
        assert list(message.oneof_decl) == [], f"{message.name}: unexpected oneof / proto3 optional"


def test_scalar_fields_use_implicit_presence() -> None:
    """proto3 singular scalars carry no `optional` keyword upstream, so they have no presence."""
    for message_name, field_name, _number, type_name, label in FIELDS:
        field = api_pb2.DESCRIPTOR.message_types_by_name[message_name].fields_by_name[field_name]
        assert field.containing_oneof is None
        if label == "optional" and not type_name.startswith("."):
            assert not field.has_presence, f"{message_name}.{field_name} must not be `optional`"


def test_map_fields_are_maps_at_runtime() -> None:
    response = api_pb2.ContainerAllocateResponse(envs={"A": "1"}, annotations={"k": "v"})
    assert dict(response.envs) == {"A": "1"}
    assert dict(response.annotations) == {"k": "v"}


def test_services_and_methods() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert set(services) == {"Registration", "DevicePlugin"}
    assert services["Registration"].full_name == constants.REGISTRATION_SERVICE
    assert services["DevicePlugin"].full_name == constants.DEVICE_PLUGIN_SERVICE
    actual = []
    for service in services.values():
        for method in service.methods:
            assert not method.client_streaming, f"{method.full_name} must not be client streaming"
            actual.append(
                (
                    f"/{service.full_name}/{method.name}",
                    method.input_type.full_name,
                    method.output_type.full_name,
                    method.server_streaming,
                )
            )
    assert sorted(actual) == sorted(METHODS)


def test_wire_encoding_of_a_known_message() -> None:
    """Field numbers and wire types reach the bytes: compare against a hand-encoded payload."""
    message = api_pb2.RegisterRequest(
        version="v1beta1",
        endpoint="a.sock",
        resource_name="x/y",
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    expected = b"\x0a\x07v1beta1" + b"\x12\x06a.sock" + b"\x1a\x03x/y" + b"\x22\x02\x10\x01"
    assert message.SerializeToString(deterministic=True) == expected
    cdi = api_pb2.ContainerAllocateResponse(cdi_devices=[api_pb2.CDIDevice(name="v/g=1")])
    assert cdi.SerializeToString() == b"\x2a\x07\x0a\x05v/g=1"
