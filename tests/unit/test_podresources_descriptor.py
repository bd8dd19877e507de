"""The compiled PodResources API descriptor matches kubelet's v1 API field for field.

The table below is the contract from k8s.io/kubelet pkg/apis/podresources/v1/api.proto (kubernetes/kubelet
63b3249). Any field that is renamed, renumbered, retyped, relabelled, added or dropped in
proto/podresources/v1/api.proto fails here, and so does a service or method name that clients such as
dcgm-exporter would not find (`/v1.PodResourcesLister/List`).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2

from hami_sim.kubelet.podresources import api_pb2

FDP = descriptor_pb2.FieldDescriptorProto

# (message, field, number, type, label); type is a scalar name or a ".v1.<Message>" reference.
FIELDS: tuple[tuple[str, str, int, str, str], ...] = (
    ("AllocatableResourcesResponse", "devices", 1, ".v1.ContainerDevices", "repeated"),
    ("AllocatableResourcesResponse", "cpu_ids", 2, "int64", "repeated"),
    ("AllocatableResourcesResponse", "memory", 3, ".v1.ContainerMemory", "repeated"),
    ("ListPodResourcesResponse", "pod_resources", 1, ".v1.PodResources", "repeated"),
    ("PodResources", "name", 1, "string", "optional"),
    ("PodResources", "namespace", 2, "string", "optional"),
    ("PodResources", "containers", 3, ".v1.ContainerResources", "repeated"),
    ("PodResources", "cpu_ids", 4, "int64", "repeated"),
    ("PodResources", "memory", 5, ".v1.ContainerMemory", "repeated"),
    ("ContainerResources", "name", 1, "string", "optional"),
    ("ContainerResources", "devices", 2, ".v1.ContainerDevices", "repeated"),
    ("ContainerResources", "cpu_ids", 3, "int64", "repeated"),
    ("ContainerResources", "memory", 4, ".v1.ContainerMemory", "repeated"),
    ("ContainerResources", "dynamic_resources", 5, ".v1.DynamicResource", "repeated"),
    ("ContainerMemory", "memory_type", 1, "string", "optional"),
    ("ContainerMemory", "size", 2, "uint64", "optional"),
    ("ContainerMemory", "topology", 3, ".v1.TopologyInfo", "optional"),
    ("ContainerDevices", "resource_name", 1, "string", "optional"),
    ("ContainerDevices", "device_ids", 2, "string", "repeated"),
    ("ContainerDevices", "topology", 3, ".v1.TopologyInfo", "optional"),
    ("TopologyInfo", "nodes", 1, ".v1.NUMANode", "repeated"),
    ("NUMANode", "ID", 1, "int64", "optional"),
    ("DynamicResource", "claim_name", 2, "string", "optional"),
    ("DynamicResource", "claim_namespace", 3, "string", "optional"),
    ("DynamicResource", "claim_resources", 4, ".v1.ClaimResource", "repeated"),
    ("ClaimResource", "cdi_devices", 1, ".v1.CDIDevice", "repeated"),
    ("ClaimResource", "driver_name", 2, "string", "optional"),
    ("ClaimResource", "pool_name", 3, "string", "optional"),
    ("ClaimResource", "device_name", 4, "string", "optional"),
    ("ClaimResource", "share_id", 5, "string", "optional"),
    ("CDIDevice", "name", 1, "string", "optional"),
    ("GetPodResourcesRequest", "pod_name", 1, "string", "optional"),
    ("GetPodResourcesRequest", "pod_namespace", 2, "string", "optional"),
    ("GetPodResourcesResponse", "pod_resources", 1, ".v1.PodResources", "optional"),
)

EMPTY_MESSAGES = frozenset({"AllocatableResourcesRequest", "ListPodResourcesRequest"})

# The one scalar upstream declares with proto3 `optional` (explicit presence).
EXPLICIT_PRESENCE = frozenset({("ClaimResource", "share_id")})

# (method, request, response); none streams.
METHODS: tuple[tuple[str, str, str], ...] = (
    ("List", "v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse"),
    ("GetAllocatableResources", "v1.AllocatableResourcesRequest", "v1.AllocatableResourcesResponse"),
    ("Get", "v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse"),
)

SCALAR_NAMES = {
    FDP.TYPE_STRING: "string",
    FDP.TYPE_INT64: "int64",
    FDP.TYPE_UINT64: "uint64",
}
LABEL_NAMES = {FDP.LABEL_OPTIONAL: "optional", FDP.LABEL_REPEATED: "repeated"}


def file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def test_file_header_is_upstreams_package_v1() -> None:
    proto = file_proto()
    assert proto.syntax == "proto3"
    assert proto.package == "v1"
    assert proto.options.go_package == "k8s.io/kubelet/pkg/apis/podresources/v1"
    assert list(proto.dependency) == []
    assert list(proto.enum_type) == []
    assert list(proto.extension) == []


def test_every_field_matches_the_upstream_table() -> None:
    actual = []
    for message in file_proto().message_type:
        for field in message.field:
            type_name = field.type_name if field.type == FDP.TYPE_MESSAGE else SCALAR_NAMES[field.type]
            actual.append((message.name, field.name, field.number, type_name, LABEL_NAMES[field.label]))
    missing = sorted(set(FIELDS) - set(actual))
    extra = sorted(set(actual) - set(FIELDS))
    assert not missing and not extra, f"missing from descriptor: {missing}\nnot in table: {extra}"
    assert len(actual) == len(FIELDS)


def test_message_set_is_exact_with_no_nested_types_or_enums() -> None:
    proto = file_proto()
    names = [message.name for message in proto.message_type]
    assert len(names) == len(set(names))
    assert set(names) == {row[0] for row in FIELDS} | EMPTY_MESSAGES
    for message in proto.message_type:
        if message.name in EMPTY_MESSAGES:
            assert list(message.field) == []
        assert list(message.nested_type) == [] and list(message.enum_type) == []


def test_only_share_id_has_explicit_presence() -> None:
    for message_name, field_name, _number, type_name, label in FIELDS:
        field = api_pb2.DESCRIPTOR.message_types_by_name[message_name].fields_by_name[field_name]
        if label == "optional" and not type_name.startswith("."):
            assert field.has_presence == ((message_name, field_name) in EXPLICIT_PRESENCE), field_name


def test_service_is_v1_pod_resources_lister_with_three_unary_methods() -> None:
    (service,) = file_proto().service
    assert service.name == "PodResourcesLister"
    assert api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"
    got = [
        (m.name, m.input_type.lstrip("."), m.output_type.lstrip("."), m.client_streaming, m.server_streaming)
        for m in service.method
    ]
    assert got == [(name, req, resp, False, False) for name, req, resp in METHODS]
