"""The compiled kubelet DRA protocol descriptors match upstream's field for field.

The tables below are the contract from kubernetes/kubelet 63b3249 (see shared/reference/dra.md §1):
pkg/apis/dra/v1/api.proto, pkg/apis/dra/v1beta1/api.proto, pkg/apis/pluginregistration/v1/api.proto and
pkg/apis/dra-health/v1alpha1/api.proto. The kubelet dials these services by their full gRPC names
(`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`, `/pluginregistration.Registration/GetInfo`,
`/v1alpha1.DRAResourceHealth/NodeWatchResources`), so a package, service, method, message or field that is
renamed, renumbered, retyped, relabelled, added or dropped in proto/ fails here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2

from hami_node.dra.api.health.v1alpha1 import api_pb2 as health_v1alpha1
from hami_node.dra.api.health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from hami_node.dra.api.registration import api_pb2 as registration
from hami_node.dra.api.registration import api_pb2_grpc as registration_grpc
from hami_node.dra.api.v1 import api_pb2 as dra_v1
from hami_node.dra.api.v1 import api_pb2_grpc as dra_v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2 as dra_v1beta1
from hami_node.dra.api.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc

FDP = descriptor_pb2.FieldDescriptorProto

# (message, field, number, type, label). type is a scalar name, a "<package>.<Message or Enum>" reference,
# or "map<key, <value>>" for a map field (checked through its generated *Entry message).
Field = tuple[str, str, int, str, str]
# (method, request, response, server streaming); no method streams from the client.
Method = tuple[str, str, str, bool]


@dataclass(frozen=True)
class Api:
    module: ModuleType
    package: str
    go_package: str
    service: str
    methods: tuple[Method, ...]
    fields: tuple[Field, ...]
    empty_messages: frozenset[str]
    explicit_presence: frozenset[tuple[str, str]] = frozenset()
    enums: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()


def dra_fields(p: str, *, share_id: bool) -> tuple[Field, ...]:
    """The DRAPlugin messages of package ``p``; v1beta1 is v1 without Device.share_id."""
    return (
        ("NodePrepareResourcesRequest", "claims", 1, f"{p}.Claim", "repeated"),
        (
            "NodePrepareResourcesResponse",
            "claims",
            1,
            f"map<string, {p}.NodePrepareResourceResponse>",
            "repeated",
        ),
        ("NodePrepareResourceResponse", "devices", 1, f"{p}.Device", "repeated"),
        ("NodePrepareResourceResponse", "error", 2, "string", "optional"),
        ("Device", "request_names", 1, "string", "repeated"),
        ("Device", "pool_name", 2, "string", "optional"),
        ("Device", "device_name", 3, "string", "optional"),
        ("Device", "cdi_device_ids", 4, "string", "repeated"),
        *((("Device", "share_id", 5, "string", "optional"),) if share_id else ()),
        ("NodeUnprepareResourcesRequest", "claims", 1, f"{p}.Claim", "repeated"),
        (
            "NodeUnprepareResourcesResponse",
            "claims",
            1,
            f"map<string, {p}.NodeUnprepareResourceResponse>",
            "repeated",
        ),
        ("NodeUnprepareResourceResponse", "error", 1, "string", "optional"),
        ("Claim", "namespace", 1, "string", "optional"),
        ("Claim", "uid", 2, "string", "optional"),
        ("Claim", "name", 3, "string", "optional"),
    )


def dra_methods(p: str) -> tuple[Method, ...]:
    return (
        (
            "NodePrepareResources",
            f"{p}.NodePrepareResourcesRequest",
            f"{p}.NodePrepareResourcesResponse",
            False,
        ),
        (
            "NodeUnprepareResources",
            f"{p}.NodeUnprepareResourcesRequest",
            f"{p}.NodeUnprepareResourcesResponse",
            False,
        ),
    )


DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"

APIS: dict[str, Api] = {
    "dra-v1": Api(
        module=dra_v1,
        package=DRA_V1,
        go_package="k8s.io/kubelet/pkg/apis/dra/v1",
        service="DRAPlugin",
        methods=dra_methods(DRA_V1),
        fields=dra_fields(DRA_V1, share_id=True),
        empty_messages=frozenset(),
        # `optional string share_id = 5;` upstream: the one scalar with explicit presence.
        explicit_presence=frozenset({("Device", "share_id")}),
    ),
    "dra-v1beta1": Api(
        module=dra_v1beta1,
        package=DRA_V1BETA1,
        go_package="k8s.io/kubelet/pkg/apis/dra/v1beta1",
        service="DRAPlugin",
        methods=dra_methods(DRA_V1BETA1),
        fields=dra_fields(DRA_V1BETA1, share_id=False),
        empty_messages=frozenset(),
    ),
    "pluginregistration": Api(
        module=registration,
        package="pluginregistration",
        go_package="k8s.io/kubelet/pkg/apis/pluginregistration/v1",
        service="Registration",
        methods=(
            ("GetInfo", "pluginregistration.InfoRequest", "pluginregistration.PluginInfo", False),
            (
                "NotifyRegistrationStatus",
                "pluginregistration.RegistrationStatus",
                "pluginregistration.RegistrationStatusResponse",
                False,
            ),
        ),
        fields=(
            ("PluginInfo", "type", 1, "string", "optional"),
            ("PluginInfo", "name", 2, "string", "optional"),
            ("PluginInfo", "endpoint", 3, "string", "optional"),
            ("PluginInfo", "supported_versions", 4, "string", "repeated"),
            ("RegistrationStatus", "plugin_registered", 1, "bool", "optional"),
            ("RegistrationStatus", "error", 2, "string", "optional"),
        ),
        empty_messages=frozenset({"RegistrationStatusResponse", "InfoRequest"}),
    ),
    "dra-health-v1alpha1": Api(
        module=health_v1alpha1,
        package="v1alpha1",
        go_package="k8s.io/kubelet/pkg/apis/dra-health/v1alpha1",
        service="DRAResourceHealth",
        methods=(
            (
                "NodeWatchResources",
                "v1alpha1.NodeWatchResourcesRequest",
                "v1alpha1.NodeWatchResourcesResponse",
                True,
            ),
        ),
        fields=(
            ("DeviceIdentifier", "pool_name", 1, "string", "optional"),
            ("DeviceIdentifier", "device_name", 2, "string", "optional"),
            ("DeviceHealth", "device", 1, "v1alpha1.DeviceIdentifier", "optional"),
            ("DeviceHealth", "health", 2, "v1alpha1.HealthStatus", "optional"),
            ("DeviceHealth", "last_updated_time", 3, "int64", "optional"),
            ("DeviceHealth", "health_check_timeout_seconds", 4, "int64", "optional"),
            ("DeviceHealth", "message", 5, "string", "optional"),
            ("NodeWatchResourcesResponse", "devices", 1, "v1alpha1.DeviceHealth", "repeated"),
        ),
        empty_messages=frozenset({"NodeWatchResourcesRequest"}),
        enums=(("HealthStatus", (("UNKNOWN", 0), ("HEALTHY", 1), ("UNHEALTHY", 2))),),
    ),
}

SCALAR_NAMES = {
    FDP.TYPE_BOOL: "bool",
    FDP.TYPE_STRING: "string",
    FDP.TYPE_INT64: "int64",
}
LABEL_NAMES = {FDP.LABEL_OPTIONAL: "optional", FDP.LABEL_REPEATED: "repeated", FDP.LABEL_REQUIRED: "required"}


def file_proto(api: Api) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api.module.DESCRIPTOR.CopyToProto(proto)
    return proto


def describe_type(api: Api, message: descriptor_pb2.DescriptorProto, field: FDP) -> str:
    """The table's spelling of ``field``'s type: a map, a message or enum reference, or a scalar."""
    if field.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM):
        entry_prefix = f".{api.package}.{message.name}."
        if field.type_name.startswith(entry_prefix):
            entry_name = field.type_name[len(entry_prefix) :]
            (entry,) = [n for n in message.nested_type if n.name == entry_name]
            assert entry.options.map_entry, f"{message.name}.{field.name}: {entry_name} is not a map entry"
            key, value = sorted(entry.field, key=lambda f: f.number)
            assert (key.name, key.number, value.name, value.number) == ("key", 1, "value", 2)
            return f"map<{SCALAR_NAMES[key.type]}, {describe_type(api, entry, value)}>"
        return field.type_name.removeprefix(".")
    assert field.type in SCALAR_NAMES, f"{message.name}.{field.name}: unexpected type {field.type}"
    return SCALAR_NAMES[field.type]


@pytest.fixture(params=sorted(APIS))
def api(request: pytest.FixtureRequest) -> Api:
    return APIS[request.param]


def test_file_header_is_upstreams_package(api: Api) -> None:
    proto = file_proto(api)
    assert proto.syntax == "proto3"
    assert proto.package == api.package
    assert proto.options.go_package == api.go_package
    assert list(proto.dependency) == [], "the API imports no other proto files"
    assert list(proto.extension) == []


def test_every_field_matches_the_upstream_table(api: Api) -> None:
    actual = [
        (message.name, field.name, field.number, describe_type(api, message, field), LABEL_NAMES[field.label])
        for message in file_proto(api).message_type
        for field in message.field
    ]
    missing = sorted(set(api.fields) - set(actual))
    extra = sorted(set(actual) - set(api.fields))
    assert not missing and not extra, f"missing from descriptor: {missing}\nnot in table: {extra}"
    assert len(actual) == len(api.fields)


def test_message_set_is_exact(api: Api) -> None:
    proto = file_proto(api)
    names = [message.name for message in proto.message_type]
    assert len(names) == len(set(names))
    assert set(names) == {row[0] for row in api.fields} | api.empty_messages
    for message in proto.message_type:
        if message.name in api.empty_messages:
            assert list(message.field) == [], f"{message.name} must have no fields"
        nested = [n.name for n in message.nested_type if not n.options.map_entry]
        assert nested == [], f"{message.name}: unexpected nested messages {nested}"
        assert list(message.enum_type) == [], f"{message.name}: unexpected nested enums"


def test_enums_match_upstream(api: Api) -> None:
    actual = tuple(
        (enum.name, tuple((value.name, value.number) for value in enum.value))
        for enum in file_proto(api).enum_type
    )
    assert actual == api.enums


def test_only_upstreams_optional_scalars_have_explicit_presence(api: Api) -> None:
    for message_name, field_name, _number, type_name, label in api.fields:
        field = api.module.DESCRIPTOR.message_types_by_name[message_name].fields_by_name[field_name]
        if label == "optional" and type_name in {*SCALAR_NAMES.values(), f"{api.package}.HealthStatus"}:
            expected = (message_name, field_name) in api.explicit_presence
            assert field.has_presence == expected, f"{message_name}.{field_name}: has_presence"


def test_service_and_methods_have_upstreams_full_names(api: Api) -> None:
    (service,) = file_proto(api).service
    assert service.name == api.service
    full_name = f"{api.package}.{api.service}"
    assert api.module.DESCRIPTOR.services_by_name[api.service].full_name == full_name
    got = [
        (m.name, m.input_type.removeprefix("."), m.output_type.removeprefix("."), m.server_streaming)
        for m in service.method
    ]
    assert got == list(api.methods)
    assert not any(m.client_streaming for m in service.method)


GRPC_MODULES = {
    "dra-v1": dra_v1_grpc,
    "dra-v1beta1": dra_v1beta1_grpc,
    "pluginregistration": registration_grpc,
    "dra-health-v1alpha1": health_v1alpha1_grpc,
}


@pytest.mark.parametrize("name", sorted(APIS))
def test_grpc_stubs_call_the_full_method_paths_the_kubelet_uses(name: str) -> None:
    api = APIS[name]
    source = inspect.getsource(GRPC_MODULES[name])
    for method, *_ in api.methods:
        assert f"'/{api.package}.{api.service}/{method}'" in source, method


def test_share_id_round_trips_with_presence_on_v1_only() -> None:
    device = dra_v1.Device(pool_name="node-1", device_name="gpu-0", share_id="")
    assert device.HasField("share_id"), "an explicitly set empty share_id is still present"
    decoded = dra_v1.Device.FromString(device.SerializeToString())
    assert decoded.HasField("share_id") and decoded.share_id == ""
    assert not dra_v1.Device(pool_name="p").HasField("share_id")
    # A v1beta1 peer (or a 1.34 kubelet) parses the same bytes, keeping field 5 as unknown.
    old = dra_v1beta1.Device.FromString(
        dra_v1.Device(device_name="gpu-0", share_id="s-1").SerializeToString()
    )
    assert old.device_name == "gpu-0"
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name
