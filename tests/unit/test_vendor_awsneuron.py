"""hami_control.devices.awsneuron: HAMi's pkg/device/awsneuron/device_test.go (v2.10.0) transcribed case
by case, plus the pure design of cores per device, the config section and property tests."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import awsneuron
from hami_control.devices.awsneuron import (
    ALLOCATED,
    ASSIGNED_INDEX,
    ASSIGNED_NODE,
    PREDICATE_TIME,
    RESOURCE_TYPE,
    WHOLE_DEVICE,
    AWSNeuron,
    add_core_usage,
    count_mask_available,
    graph_select,
    split_core_request,
)
from hami_control.devices.base import (
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    custom_text,
)
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container, node

COUNT = "aws.amazon.com/neuron"
CORE = "aws.amazon.com/neuroncore"
INT32_MAX = 2**31 - 1
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)

VENDOR = AWSNeuron(awsneuron.names())


def pod_with(annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "annotations": dict(annotations or {})}}


def context(annotations: Mapping[str, str] | None = None) -> FitContext:
    annotations = dict(annotations or {})
    mutex = annotations.get("hami.io/gpu-scheduler-policy") == "mutex"
    return FitContext(pod_with(annotations), policy=(GPUPolicy.MUTEX,) if mutex else (GPUPolicy.SPREAD,))


def aws_device(  # noqa: PLR0917
    id: str, index: int, used: int, count: int, totalcore: int, usedcores: int, node_type: str, health: bool
) -> GPUUsage:
    """HAMi's makeAWSDeviceUsage."""
    info = GPUInfo(
        id=id,
        index=index,
        count=count,
        devmem=0,
        devcore=totalcore,
        type="AWSNeuron",
        health=health,
        custom=custom_text({"AWSNodeType": node_type}),
    )
    return GPUUsage(info, used=used, usedcores=usedcores)


def device_usages(
    node_type: str, used: Mapping[int, int] | None = None, health: bool = True
) -> list[GPUUsage]:
    """HAMi's makeDeviceUsages: 16 devices, the node type on index 0 only."""
    used = used or {}
    return [
        GPUUsage(
            GPUInfo(
                id=f"d{i}",
                index=i,
                count=2,
                devcore=3,
                type="AWSNeuron",
                health=health,
                custom=custom_text({"AWSNodeType": node_type}) if i == 0 else "",
            ),
            used=used.get(i, 0),
        )
        for i in range(16)
    ]


def picked(result: Picked | Unfit) -> Picked:
    assert isinstance(result, Picked), result
    return result


def unfit(result: Picked | Unfit) -> Unfit:
    assert isinstance(result, Unfit), result
    return result


# --- Test_MutateAdmission ------------------------------------------------------------------------------

MUTATE_CASES: list[tuple[str, dict[str, Any], Admission]] = [
    ("set neuron number", container(limits={COUNT: "2"}), Admission(True)),
    ("set request-only neuron number", container(requests={COUNT: "2"}), Admission(True)),
    (
        "reject request-only neuron number that overflows device count",
        container(requests={COUNT: str(INT32_MAX + 1)}),
        Admission(False, "aws.amazon.com/neuron must not exceed 2147483647"),
    ),
    ("set neuron cores", container(limits={CORE: "2"}), Admission(True)),
    (
        "reject odd neuron core count greater than one",
        container(limits={CORE: "3"}),
        Admission(False, "aws.amazon.com/neuroncore must be 1 or a multiple of 2, got 3"),
    ),
    (
        "reject request-only odd neuron core count greater than one",
        container(requests={CORE: "3"}),
        Admission(False, "aws.amazon.com/neuroncore must be 1 or a multiple of 2, got 3"),
    ),
    (
        "reject zero neuron core count",
        container(limits={CORE: "0"}),
        Admission(False, "aws.amazon.com/neuroncore must be greater than 0"),
    ),
    (
        "reject negative neuron core count",
        container(limits={CORE: "-2"}),
        Admission(False, "aws.amazon.com/neuroncore must be greater than 0"),
    ),
    (
        "reject neuron core count that overflows device count",
        container(limits={CORE: str(INT32_MAX * 2 + 2)}),
        Admission(False, "aws.amazon.com/neuroncore must not exceed 4294967294"),
    ),
    ("no neuron devices", container(limits={}), Admission(False)),
]


# HAMi pkg/device/awsneuron/device_test.go Test_MutateAdmission, every case (the id is the Go name)
@pytest.mark.parametrize(("name", "ctr", "want"), MUTATE_CASES, ids=[c[0] for c in MUTATE_CASES])
def test_mutate_admission_finds_and_refuses_with_hamis_texts(
    name: str, ctr: dict[str, Any], want: Admission
) -> None:
    pod = pod_with()
    before = (repr(ctr), repr(pod))
    assert VENDOR.mutate(ctr, pod) == want
    assert (repr(ctr), repr(pod)) == before  # HAMi's MutateAdmission changes nothing


def test_mutate_admission_refuses_a_count_that_is_not_a_whole_number() -> None:
    # validateResourceRequest's first text (no Go case reaches it)
    assert VENDOR.mutate(container(limits={COUNT: "1500m"}), pod_with()) == Admission(
        False, "aws.amazon.com/neuron must be an integer"
    )


# --- Test_GetNodeDevices -------------------------------------------------------------------------------


def neuron_node(
    name: str = "test", devices: Any = 1, cores: Any = 2, instance: str | None = "inf2"
) -> dict[str, Any]:
    """HAMi's test node, built with `node`: `devices` Neuron devices and `cores` NeuronCores in its
    capacity (None: not listed), `instance` as its instance-type label (None: no label)."""
    capacity = {k: v for k, v in ((COUNT, devices), (CORE, cores)) if v is not None}
    labels = {} if instance is None else {"node.kubernetes.io/instance-type": instance}
    return node(name, labels=labels, capacity=capacity)


# HAMi pkg/device/awsneuron/device_test.go Test_GetNodeDevices "get node device"
def test_get_node_devices_synthesises_one_device_per_neuron_with_a_core_mask() -> None:
    assert VENDOR.node_devices(neuron_node()) == (
        GPUInfo(
            id="test-AWSNeuron-0",
            index=0,
            count=2,
            devmem=0,
            devcore=3,
            type="AWSNeuron",
            numa=0,
            health=True,
            custom='{"AWSNodeType":"inf2"}',
        ),
    )


def test_get_node_devices_uses_each_nodes_own_cores_per_device() -> None:
    # HAMi keeps the first node's value for every node ("sticky"); here each node counts its own.
    trn = VENDOR.node_devices(neuron_node("a", devices="16", cores="32", instance="trn1.32xlarge"))
    inf1 = VENDOR.node_devices(neuron_node("b", devices="4", cores="16", instance="inf1.6xlarge"))
    assert trn is not None
    assert inf1 is not None
    assert [(d.id, d.index, d.count, d.devcore) for d in trn[:2]] == [
        ("a-AWSNeuron-0", 0, 2, 3),
        ("a-AWSNeuron-1", 1, 2, 3),
    ]
    assert len(trn) == 16
    assert {(d.count, d.devcore) for d in inf1} == {(4, 15)}


@pytest.mark.parametrize(
    "capacity",
    [None, "0", "1500m", "x"],
    ids=["absent", "zero", "not whole", "not a quantity"],
)
def test_get_node_devices_is_none_without_a_whole_device_count(capacity: Any) -> None:
    # HAMi: "device not found aws.amazon.com/neuron"
    assert VENDOR.node_devices(neuron_node(devices=capacity)) is None


def test_get_node_devices_without_cores_or_label_gives_zero_core_devices_of_unknown_type() -> None:
    got = VENDOR.node_devices(neuron_node(devices="2", cores=None, instance=None))
    assert got is not None
    assert [(d.count, d.devcore, d.custom) for d in got] == [(0, 0, '{"AWSNodeType":""}')] * 2


@pytest.mark.parametrize(
    ("devices", "cores", "where"),
    [("2000", "4000", COUNT), ("1", "-2", CORE), ("1", "64", CORE)],
    ids=["too many devices", "negative cores", "mask wider than int32"],
)
def test_get_node_devices_refuses_capacities_it_cannot_synthesise(
    devices: str, cores: str, where: str
) -> None:
    with pytest.raises(WireFormatError) as info:
        VENDOR.node_devices(neuron_node(devices=devices, cores=cores))
    assert info.value.annotation == f"status.capacity[{where}]"


@settings(max_examples=300, deadline=None)
@given(
    devices=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12), st.none()),
    cores=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12), st.none()),
)
def test_get_node_devices_returns_devices_or_raises_wire_format_error(devices: Any, cores: Any) -> None:
    try:
        got = VENDOR.node_devices(neuron_node(devices=devices, cores=cores))
    except WireFormatError:
        return
    assert got is None or all(d.count >= 0 and d.devcore == (1 << d.count) - 1 for d in got)


def test_node_health_is_always_healthy_and_lock_and_handshake_are_none() -> None:
    # HAMi's CheckHealth (true, true), LockNode/ReleaseNodeLock return nil, NodeCleanUp does nothing.
    assert VENDOR.node_health({}, NOW) == NodeHealth(True, True)
    names = VENDOR.names
    assert (names.health, names.lock, names.lock_annotation, names.handshake) == (
        HealthRule.ALWAYS,
        LockKind.NONE,
        "",
        "",
    )
    assert (names.inventory, names.register, names.to_allocate, names.allocated) == (
        Inventory.CUSTOM,
        "",
        "",
        "hami.io/aws-neuron-devices-allocated",
    )
    assert (names.common_word, names.resources) == ("AWSNeuron", (COUNT, CORE))
    assert (names.use_uuid, names.nouse_uuid) == (
        "aws.amazon.com/use-neuron-uuid",
        "aws.amazon.com/nouse-neuron-uuid",
    )


# --- Test_PatchAnnotations -----------------------------------------------------------------------------


def alloc(*containers: Sequence[GPUSlice]) -> PodAllocation:
    return PodAllocation(tuple(ContainerAllocation(tuple(c)) for c in containers))


def slice_(uuid: str, cores: int = 3) -> GPUSlice:
    return GPUSlice(uuid, 0, cores, "AWSNeuron")


def rec(index: int) -> dict[str, Any]:
    return {"index": index, "coresPerDevice": 2, "awsusageinfo": 3}


def spec_pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if inits is not None:
        spec["initContainers"] = inits
    return {"metadata": {"name": "p"}, "spec": spec}


PATCH_CASES: list[tuple[str, dict[str, Any], PodAllocation, list[list[dict[str, Any]]], dict[str, str]]] = [
    (
        "neuron device",
        spec_pod([container(limits={COUNT: "2"})]),
        alloc([slice_("test1"), slice_("test2")]),
        [[rec(0), rec(1)]],
        {ALLOCATED: "test1,AWSNeuron,0,3:test2,AWSNeuron,0,3:;", ASSIGNED_INDEX: "0,1"},
    ),
    (
        "neuroncore device",
        spec_pod([container(limits={CORE: "2"})]),
        alloc([slice_("test1")]),
        [[rec(0)]],
        {ALLOCATED: "test1,AWSNeuron,0,3:;", ASSIGNED_INDEX: "0,1", RESOURCE_TYPE: CORE},
    ),
    (
        "init container neuron device",
        spec_pod([{}], inits=[container(limits={COUNT: "1"})]),
        alloc([slice_("test1")], []),
        [[rec(0)], []],
        {ALLOCATED: "test1,AWSNeuron,0,3:;;", ASSIGNED_INDEX: "0"},
    ),
]


# HAMi pkg/device/awsneuron/device_test.go Test_PatchAnnotations, every case (coresPerAWSNeuron = 2 there,
# `coresPerDevice` 2 in Fit's record here). The Go test compares AWS_NEURON_IDS, the predicate node ("")
# and NEURON_RESOURCE_TYPE; its expected allocated text ("...0,2:test2...;") is never compared (it looks
# up result["AWSNeuron"]), so the allocated value asserted here is EncodePodSingleDevice's.
@pytest.mark.parametrize(
    ("name", "pod", "devices", "custom", "want"), PATCH_CASES, ids=[c[0] for c in PATCH_CASES]
)
def test_patch_annotations_writes_allocated_ids_resource_type_and_the_predicate_keys(
    name: str,
    pod: dict[str, Any],
    devices: PodAllocation,
    custom: list[list[dict[str, Any]]],
    want: dict[str, str],
) -> None:
    got = VENDOR.pod_annotations(pod, devices, node="", now=NOW, custom=custom)
    expected = {**want, ASSIGNED_NODE: "", "NEURON_ALLOCATED": "false", PREDICATE_TIME: got[PREDICATE_TIME]}
    assert got == expected
    assert got[PREDICATE_TIME] == str(int(NOW.timestamp()) * 10**9)


def test_patch_annotations_names_the_node_and_writes_nanoseconds() -> None:
    now = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    got = VENDOR.pod_annotations(
        spec_pod([container(limits={COUNT: "1"})]), alloc([slice_("n-AWSNeuron-3")]), node="node-a", now=now
    )
    assert got[ASSIGNED_NODE] == "node-a"
    assert re.fullmatch(r"[0-9]{19}", got[PREDICATE_TIME])
    assert got[PREDICATE_TIME].endswith("123456000")
    assert got[ASSIGNED_INDEX] == "3"  # no Fit record: the index of `<node>-AWSNeuron-<i>`


def test_patch_annotations_core_ids_follow_the_mask_bits_and_accumulate_over_containers() -> None:
    # HAMi appends to one list across containers and rewrites AWS_NEURON_IDS after each one.
    pod = spec_pod([container(limits={CORE: "1"}), container(limits={CORE: "1"})])
    devices = alloc([slice_("x", cores=1)], [slice_("y", cores=2)])
    custom = [[{"index": 1, "coresPerDevice": 2}], [{"index": 1, "coresPerDevice": 2}]]
    got = VENDOR.pod_annotations(pod, devices, node="n", now=NOW, custom=custom)
    assert got[ASSIGNED_INDEX] == "2,3"
    assert got[RESOURCE_TYPE] == CORE


def test_patch_annotations_for_requests_only_count_reads_the_core_mask() -> None:
    # HAMi looks for the count in limits only; a requests-only count falls to the core branch.
    pod = spec_pod([container(requests={COUNT: "1"})])
    got = VENDOR.pod_annotations(pod, alloc([slice_("x")]), node="n", now=NOW, custom=[[rec(2)]])
    assert (got[ASSIGNED_INDEX], got[RESOURCE_TYPE]) == ("4,5", CORE)


def test_patch_annotations_writes_nothing_without_devices() -> None:
    assert VENDOR.pod_annotations(spec_pod([{}]), alloc([]), node="n", now=NOW) == {}


# --- Test_checkType ------------------------------------------------------------------------------------


# HAMi pkg/device/awsneuron/device_test.go Test_checkType "the same type" / "the different type"
@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [("AWSNeuron", True), ("test111", False)],
    ids=["the same type", "the different type"],
)
def test_check_type_accepts_only_the_awsneuron_request(request_type: str, allowed: bool) -> None:
    device = aws_device("d", 0, 0, 2, 3, 0, "trn", True)
    assert VENDOR.type_allowed({}, device, DeviceRequest(1, request_type)) is allowed


# --- Test_GenerateResourceRequests ---------------------------------------------------------------------

REQUEST_CASES: list[tuple[str, dict[str, Any], DeviceRequest | None]] = [
    (
        "allocate neuron device",
        container(limits={COUNT: "1"}, requests={COUNT: "1"}),
        # HAMi: Coresreq = coresPerAWSNeuron (2 in the test); here WHOLE_DEVICE, which Fit turns into the
        # chosen device's own cores per device (test_a_device_count_request_takes_all_cores_of_the_device)
        DeviceRequest(1, "AWSNeuron", 0, 0, WHOLE_DEVICE),
    ),
    (
        "reject request-only neuron number that overflows device count when admission is bypassed",
        container(requests={COUNT: str(INT32_MAX + 1)}),
        None,
    ),
    (
        "allocate neuron core",
        container(limits={CORE: "1"}, requests={CORE: "1"}),
        DeviceRequest(1, "AWSNeuron", 0, 0, 1),
    ),
    (
        "reject odd neuron core request when admission is bypassed",
        container(limits={CORE: "3"}, requests={CORE: "3"}),
        None,
    ),
    (
        "reject request-only odd neuron core request when admission is bypassed",
        container(requests={CORE: "3"}),
        None,
    ),
    ("reject zero neuron core request when admission is bypassed", container(limits={CORE: "0"}), None),
    ("reject negative neuron core request when admission is bypassed", container(limits={CORE: "-2"}), None),
    (
        "reject neuron core request that overflows device count when admission is bypassed",
        container(limits={CORE: str(INT32_MAX * 2 + 2)}),
        None,
    ),
]


# HAMi pkg/device/awsneuron/device_test.go Test_GenerateResourceRequests, every case (None = Nums 0)
@pytest.mark.parametrize(("name", "ctr", "want"), REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_generate_resource_requests(name: str, ctr: dict[str, Any], want: DeviceRequest | None) -> None:
    assert VENDOR.request(ctr) == want


def test_a_core_count_above_two_is_split_into_two_core_devices() -> None:
    assert VENDOR.request(container(limits={CORE: "6"})) == DeviceRequest(3, "AWSNeuron", 0, 0, 2)


@settings(max_examples=300, deadline=None)
@given(
    resource=st.sampled_from([COUNT, CORE]),
    value=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20)),
    in_limits=st.booleans(),
)
def test_request_is_none_or_positive_and_agrees_with_the_webhook(
    resource: str, value: Any, in_limits: bool
) -> None:
    ctr = container(limits={resource: value}) if in_limits else container(requests={resource: value})
    got = VENDOR.request(ctr)
    admission = VENDOR.mutate(ctr, pod_with())
    assert admission.found == (got is not None)
    assert admission.found != bool(admission.error)
    if got is not None:
        assert 0 < got.nums <= INT32_MAX
        assert got.memreq == 0
        assert got.mem_percentage == 0
        assert 0 <= got.coresreq <= 2


# --- Test_splitCoreRequest -----------------------------------------------------------------------------

SPLIT_CASES: list[tuple[str, int, int, tuple[int, int, str]]] = [
    ("single core takes one device", 2, 1, (1, 1, "")),
    ("a full device is one device", 2, 2, (1, 2, "")),
    ("whole devices divide evenly", 2, 6, (3, 2, "")),
    (
        "odd count above one has no representable shape",
        2,
        3,
        (0, 0, "aws.amazon.com/neuroncore must be 1 or a multiple of 2, got 3"),
    ),
    ("per-device cores above the addressable limit are bounded", 4, 4, (2, 2, "")),
    ("unknown per-device cores falls back to the addressable limit", 0, 4, (2, 2, "")),
    (
        "device count stays within int32",
        1,
        INT32_MAX + 1,
        (0, 0, "aws.amazon.com/neuroncore needs 2147483648 devices, which exceeds the maximum of 2147483647"),
    ),
]


# HAMi pkg/device/awsneuron/device_test.go Test_splitCoreRequest, every case (its coresPerAWSNeuron is the
# cores_per_device argument; the vendor itself always passes the default, 2)
@pytest.mark.parametrize(
    ("name", "per_device", "cores", "want"), SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES]
)
def test_split_core_request(name: str, per_device: int, cores: int, want: tuple[int, int, str]) -> None:
    assert split_core_request(cores, CORE, per_device) == want


# --- Test_countMaskAvailable ---------------------------------------------------------------------------


# HAMi pkg/device/awsneuron/device_test.go Test_countMaskAvailable "test 3" / "test 2" / "test 1" / "test 0"
@pytest.mark.parametrize(
    ("mask", "bits"), [(3, 2), (2, 1), (1, 1), (0, 0)], ids=["test 3", "test 2", "test 1", "test 0"]
)
def test_count_mask_available_counts_set_bits(mask: int, bits: int) -> None:
    assert count_mask_available(mask) == bits


def test_add_core_usage_gives_the_free_bits_of_a_two_core_mask() -> None:
    # HAMi's addCoreUsage (no Go test): idle 2 -> 3, idle 1 -> 1, core 0 taken -> 2, core 1 taken -> 1
    assert [add_core_usage(0, 2), add_core_usage(0, 1), add_core_usage(1, 1), add_core_usage(2, 1)] == [
        3,
        1,
        2,
        1,
    ]


# --- Test_graphSelect ----------------------------------------------------------------------------------

GRAPH_CASES: list[tuple[str, str, dict[int, int], int, list[int]]] = [
    ("full allocate", "inf2", {}, 16, list(range(16))),
    ("8 allocate fail", "trn", {7: 1, 13: 1}, 8, []),
    ("8 allocate success", "trn", {7: 1}, 8, list(range(8, 16))),
    ("8 allocate", "inf", {5: 1, 14: 1}, 8, list(range(6, 14))),
]


# HAMi pkg/device/awsneuron/device_test.go Test_graphSelect, every case: the positions, then the same
# devices through Fit (a request for that many devices), or NumaNotFit when there is no run
@pytest.mark.parametrize(
    ("name", "node_type", "used", "count", "want"), GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES]
)
def test_graph_select(name: str, node_type: str, used: dict[int, int], count: int, want: list[int]) -> None:
    devices = device_usages(node_type, used)
    assert graph_select(devices, count) == want
    result = VENDOR.fit(devices, DeviceRequest(count, "AWSNeuron", 0, 0, 2), context())
    if want:
        got = picked(result)
        assert [s.uuid for s in got.slices] == [f"d{i}" for i in want]
        assert {(s.usedmem, s.usedcores, s.vendor) for s in got.slices} == {(0, 3, "AWSNeuron")}
        assert [c["index"] for c in got.custom] == want
    else:
        assert unfit(result).message == "1/16 NumaNotFit"


def test_graph_select_on_unhealthy_devices_finds_no_run() -> None:
    assert graph_select(device_usages("inf2", health=False), 4) == []


def test_graph_select_outside_inf_takes_only_aligned_power_sizes() -> None:
    assert graph_select(device_usages("trn"), 2) == []
    assert graph_select(device_usages("inf2"), 2) == [0, 1]


def test_graph_select_maps_positions_to_device_indexes_as_hami_does() -> None:
    # HAMi checks positions in the sorted list, then takes the devices whose Index equals them.
    devices = list(reversed(device_usages("inf2")))
    devices[0], devices[15] = devices[15], devices[0]  # index 0 (with the node type) first
    got = picked(VENDOR.fit(devices, DeviceRequest(2, "AWSNeuron", 0, 0, 2), context()))
    assert [s.uuid for s in got.slices] == ["d0", "d1"]


# --- TestDevices_Fit -----------------------------------------------------------------------------------

FIT_CASES: list[tuple[str, list[GPUUsage], DeviceRequest, dict[str, str], list[str], str]] = [
    (
        "fit success",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True), aws_device("dev-1", 0, 0, 12, 3, 0, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {},
        ["dev-1"],
        "",
    ),
    (
        "fit fail: memory not enough",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True)],
        DeviceRequest(2, "AWSNeuron", 0, 0, 2),
        {},
        [],
        "1/1 NumaNotFit",
    ),
    (
        "fit fail: core not enough",
        [aws_device("dev-0", 0, 0, 2, 3, 1, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {},
        [],
        "1/1 CardInsufficientCore",
    ),
    (
        "fit fail: type mismatch",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True)],
        DeviceRequest(1, "OtherType", 0, 0, 2),
        {},
        [],
        "1/1 CardTypeMismatch",
    ),
    (
        "fit fail: user assign use uuid mismatch",
        [aws_device("dev-1", 0, 0, 2, 3, 0, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {"aws.amazon.com/use-neuron-uuid": "dev-0"},
        [],
        "1/1 CardUuidMismatch",
    ),
    (
        "fit fail: user assign no use uuid match",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {"aws.amazon.com/nouse-neuron-uuid": "dev-0"},
        [],
        "1/1 CardUuidMismatch",
    ),
    (
        "fit fail: card overused",
        [aws_device("dev-0", 0, 2, 2, 3, 0, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {},
        [],
        "1/1 CardTimeSlicingExhausted",
    ),
    (
        "mutex policy rejects used device",
        [aws_device("dev-0", 0, 1, 2, 3, 0, "trn", True)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    (
        "fit fail: NumaNotFit with multiple devices",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True), aws_device("dev-1", 1, 0, 2, 3, 0, "trn", True)],
        DeviceRequest(2, "AWSNeuron", 0, 0, 2),
        {},
        [],
        "1/2 NumaNotFit",
    ),
    (
        "fit fail: CardNotHealth",
        [aws_device("dev-0", 0, 0, 2, 3, 0, "trn", False)],
        DeviceRequest(1, "AWSNeuron", 0, 0, 2),
        {},
        [],
        "1/1 CardNotHealth",
    ),
]


# HAMi pkg/device/awsneuron/device_test.go TestDevices_Fit, every case (the id is the Go name)
@pytest.mark.parametrize(
    ("name", "devices", "request_", "annotations", "want_ids", "want_reason"),
    FIT_CASES,
    ids=[c[0] for c in FIT_CASES],
)
def test_devices_fit(  # noqa: PLR0917
    name: str,
    devices: list[GPUUsage],
    request_: DeviceRequest,
    annotations: dict[str, str],
    want_ids: list[str],
    want_reason: str,
) -> None:
    result = VENDOR.fit(devices, request_, context(annotations))
    if want_ids:
        assert [s.uuid for s in picked(result).slices] == want_ids
    else:
        assert unfit(result).message == want_reason


def test_fit_success_takes_both_cores_as_mask_three_and_records_index() -> None:
    # HAMi TestDevices_Fit "fit success", what the Go test does not look at: the slice and its record
    devices = [
        aws_device("dev-0", 0, 0, 2, 3, 0, "trn", True),
        aws_device("dev-1", 0, 0, 12, 3, 0, "trn", True),
    ]
    got = picked(VENDOR.fit(devices, DeviceRequest(1, "AWSNeuron", 0, 0, 2), context()))
    assert got.slices == (GPUSlice("dev-1", 0, 3, "AWSNeuron"),)
    assert got.custom == ({"index": 0, "coresPerDevice": 12, "awsusageinfo": 3},)


def test_a_device_count_request_takes_all_cores_of_the_device() -> None:
    request = VENDOR.request(container(limits={COUNT: "1"}))
    assert request is not None
    idle = aws_device("n-AWSNeuron-0", 0, 0, 2, 3, 0, "inf2", True)
    half = aws_device("n-AWSNeuron-1", 1, 1, 2, 3, 1, "inf2", True)
    assert picked(VENDOR.fit([idle], request, context())).slices == (GPUSlice(idle.id, 0, 3, "AWSNeuron"),)
    assert unfit(VENDOR.fit([half], request, context())).message == "1/1 CardInsufficientCore"


def test_single_cores_share_a_device_bit_by_bit() -> None:
    request = VENDOR.request(container(limits={CORE: "1"}))
    assert request is not None
    device = aws_device("n-AWSNeuron-0", 0, 0, 2, 3, 0, "inf2", True)
    first = picked(VENDOR.fit([device], request, context())).slices[0]
    assert first.usedcores == 1
    device = VENDOR.add_usage(device, first)
    second = picked(VENDOR.fit([device], request, context())).slices[0]
    assert second.usedcores == 2
    device = VENDOR.add_usage(device, second)
    assert (device.used, device.usedcores) == (2, 3)
    assert unfit(VENDOR.fit([device], request, context())).message == "1/1 CardTimeSlicingExhausted"


# --- build ---------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = awsneuron.build(parse_device_config("", "device-config.yaml"))
    assert isinstance(vendor, AWSNeuron)
    assert vendor.names == awsneuron.names()


def test_build_reads_its_section() -> None:
    text = "awsneuron:\n  resourceCountName: example.com/neuron\n  resourceCoreName: example.com/core\n"
    (vendor,) = awsneuron.build(parse_device_config(text, "device-config.yaml"))
    assert (vendor.names.count, vendor.names.cores) == ("example.com/neuron", "example.com/core")


def test_build_refuses_a_bad_value_naming_key_and_line() -> None:
    text = "awsneuron:\n  resourceCountName: aws.amazon.com/neuron\n  resourceCoreName: [a, b]\n"
    with pytest.raises(ConfigError) as info:
        awsneuron.build(parse_device_config(text, "device-config.yaml"))
    assert (info.value.key, info.value.line) == ("awsneuron.resourceCoreName", 3)
    assert "must be a string" in str(info.value)


def test_build_refuses_an_unknown_key() -> None:
    text = "awsneuron:\n  resourceCountNam: aws.amazon.com/neuron\n"
    with pytest.raises(ConfigError) as info:
        awsneuron.build(parse_device_config(text, "device-config.yaml"))
    assert (info.value.key, info.value.line) == ("awsneuron.resourceCountNam", 2)
