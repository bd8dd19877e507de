"""hami_control.devices.metax: MetaX whole GPUs (Metax-GPU) and the registry entry of both MetaX backends,
with HAMi's own tests (pkg/device/metax/device_test.go, v2.10.0) transcribed case by case. The sGPU
backend is in test_vendor_metax_sgpu.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import decode_gpu_policy, decode_pod_allocation, encode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_control.devices import metax, metax_sgpu
from hami_control.devices.base import (
    MUTEX_LOCK,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    Picked,
    Unfit,
)
from hami_control.devices.config import load_device_config
from hami_control.usage import GPUUsage
from tests.builders import node

GPU = metax.MetaxGPU(metax.names())
CW = metax.COMMON_WORD
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def device(
    uuid: str,
    *,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    mem: int = 128,
    usedcores: int = 0,
    cores: int = 100,
    health: bool = True,
) -> GPUUsage:
    """HAMi's DeviceUsage as the Go tests inject it (Used/Usedmem/Usedcores set directly)."""
    info = GPUInfo(uuid, index=0, count=count, devmem=mem, devcore=cores, type=CW, numa=0, health=health)
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def request(nums: int = 1, memreq: int = 512, pct: int = 0, cores: int = 50, kind: str = CW) -> DeviceRequest:
    return DeviceRequest(nums, kind, memreq, pct, cores)


def context(annotations: dict[str, str] | None = None, **kwargs: Any) -> FitContext:
    """The pod of the Go test (its annotations); the mutex policy as the scheduler reads it from there."""
    annotations = annotations or {}
    policy = annotations.get("hami.io/gpu-scheduler-policy")
    if policy is not None:
        kwargs["policy"] = decode_gpu_policy(policy)
    return FitContext(pod={"metadata": {"annotations": annotations}}, **kwargs)


def slices_of(*uuids: str, cores: int = 1, mem: int = 1000) -> PodAllocation:
    return PodAllocation((ContainerAllocation(tuple(GPUSlice(u, mem, cores, CW) for u in uuids)),))


# --- names, lock, health (the data) -----------------------------------------------------------------------


def test_the_names_are_hamis_metax_gpu_keys_with_no_lock_and_no_handshake() -> None:
    # HAMi pkg/device/metax/device.go InitMetaxDevice, LockNode/ReleaseNodeLock (both return nil)
    names = GPU.names
    assert (names.common_word, names.family, names.count) == ("Metax-GPU", "metax", "metax-tech.com/gpu")
    assert (names.memory, names.cores, names.memory_factor) == ("", "", 0)
    assert names.to_allocate == "hami.io/metax-gpu-devices-to-allocate"
    assert names.allocated == "hami.io/metax-gpu-devices-allocated"
    assert (names.inventory, names.health, names.handshake) == (Inventory.CUSTOM, HealthRule.CAPACITY, "")
    assert (names.lock, names.lock_annotation) == (LockKind.NONE, "")
    assert (names.use_uuid, names.nouse_uuid, names.use_type, names.nouse_type) == ("", "", "", "")
    assert GPU.policy_neutral is False


def metax_node(
    capacity: Any = None, name: str = "test", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """HAMi's test node, built with `node`: `capacity` MetaX GPUs in its capacity (None: an empty
    capacity), `annotations` (default none)."""
    gpus = {} if capacity is None else {"metax-tech.com/gpu": capacity}
    return node(name, annotations=dict(annotations or {}), capacity=gpus)


@pytest.mark.parametrize(
    ("capacity", "healthy"),
    [("2", True), ("0", False), (None, False), ("-1", False)],
    ids=["two cards", "zero", "absent", "negative"],
)
def test_the_node_is_healthy_while_its_capacity_is_above_zero_and_always_updates(
    capacity: str | None, healthy: bool
) -> None:
    # HAMi pkg/device/metax/device.go CheckHealth: (count > 0, true)
    health = GPU.node_health(metax_node(capacity), NOW)
    assert (health.healthy, health.update, health.handshake) == (healthy, True, None)


# --- GetNodeDevices ---------------------------------------------------------------------------------------


def test_get_node_devices_synthesises_one_whole_device_per_capacity_unit() -> None:
    # HAMi pkg/device/metax/device_test.go TestGetNodeDevices "Test with valid node" (its expected Count
    # 100 is not asserted there; device.go writes Count 1)
    assert GPU.node_devices(metax_node("1")) == (
        GPUInfo("test-metax-0", index=0, count=1, devmem=65536, devcore=100, type="Metax-GPU", health=True),
    )


def test_get_node_devices_names_each_device_after_the_node_and_its_index() -> None:
    got = GPU.node_devices(metax_node("3", name="n1"))
    assert got is not None
    assert [(d.id, d.index) for d in got] == [("n1-metax-0", 0), ("n1-metax-1", 1), ("n1-metax-2", 2)]


@pytest.mark.parametrize("capacity", [None, "0", "1.5", "abc"], ids=["absent", "zero", "fraction", "garbage"])
def test_get_node_devices_has_none_without_a_whole_positive_capacity(capacity: str | None) -> None:
    # device.go GetNodeDevices: AsInt64 not ok, or 0 -> "device not found"
    assert GPU.node_devices(metax_node(capacity)) is None


def test_get_node_devices_of_a_negative_capacity_is_empty() -> None:
    assert GPU.node_devices(metax_node("-2")) == ()


def test_an_absurd_capacity_is_refused_rather_than_synthesised() -> None:
    with pytest.raises(WireFormatError, match=r"status.capacity\[metax-tech.com/gpu\]"):
        GPU.node_devices(metax_node("1000000000"))


@given(st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=20), st.floats(allow_nan=True), st.none()))
@settings(max_examples=300)
def test_get_node_devices_of_any_capacity_value_gives_devices_none_or_a_wire_format_error(raw: Any) -> None:
    try:
        got = GPU.node_devices(metax_node(raw))
    except WireFormatError:
        return
    assert got is None or all(d.count == 1 and d.devmem == 65536 for d in got)


# --- MutateAdmission ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "found"),
    [
        pytest.param({"metax-tech.com/gpu": "1"}, True, id="set to resources limits"),
        pytest.param({}, False, id="don't set to resources limits"),
    ],
)
def test_mutate_admission_finds_a_container_that_limits_the_count_resource_and_changes_nothing(
    limits: dict[str, str], found: bool
) -> None:
    # HAMi pkg/device/metax/device_test.go Test_MutateAdmission (both cases)
    container: dict[str, Any] = {"name": "c", "resources": {"limits": dict(limits)}}
    pod: dict[str, Any] = {"metadata": {}}
    admission = GPU.mutate(container, pod)
    assert (admission.found, admission.error) == (found, "")
    assert container == {"name": "c", "resources": {"limits": limits}}
    assert pod == {"metadata": {}}


# --- GenerateResourceRequests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(
            {"limits": {"metax-tech.com/gpu": "1"}, "requests": {"metax-tech.com/gpu": "1"}},
            DeviceRequest(1, "Metax-GPU", 0, 100, 100),
            id="resource set to limit and request",
        ),
        pytest.param({"limits": {}, "requests": {}}, None, id="resource don't set to limit and request"),
    ],
)
def test_generate_resource_requests_asks_whole_devices(
    resources: dict[str, Any], expected: DeviceRequest | None
) -> None:
    # HAMi pkg/device/metax/device_test.go Test_GenerateResourceRequests (both cases)
    assert GPU.request({"name": "c", "resources": resources}) == expected


def test_generate_resource_requests_reads_requests_when_limits_do_not_name_the_count() -> None:
    container = {"resources": {"requests": {"metax-tech.com/gpu": "2"}}}
    assert GPU.request(container) == DeviceRequest(2, "Metax-GPU", 0, 100, 100)


@pytest.mark.parametrize("count", ["0", "-1", "2147483648", "1.5", "x"])
def test_generate_resource_requests_is_none_for_a_count_outside_1_to_int32(count: str) -> None:
    # HAMi's Resourcereqs drops Nums <= 0; a count above int32 (HAMi: truncated) is refused here
    assert GPU.request({"resources": {"limits": {"metax-tech.com/gpu": count}}}) is None


_QUANTITY = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "e-3"]),
    ),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=12),
)


@given(limit=_QUANTITY, req=_QUANTITY)
@settings(max_examples=300)
def test_a_request_never_has_a_negative_or_out_of_range_field(limit: Any, req: Any) -> None:
    got = GPU.request(
        {"resources": {"limits": {"metax-tech.com/gpu": limit}, "requests": {GPU.names.count: req}}}
    )
    if got is not None:
        assert 1 <= got.nums <= 2**31 - 1
        assert (got.memreq, got.mem_percentage, got.coresreq) == (0, 100, 100)


# --- checkType, custom filter rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "allowed"),
    [
        pytest.param("Metax-GPU", True, id="node type the same as device"),
        pytest.param("test", False, id="node type the different from device"),
    ],
)
def test_check_type_accepts_only_the_metax_gpu_request_type(kind: str, allowed: bool) -> None:
    # HAMi pkg/device/metax/device_test.go Test_checkType (both cases; the numa result is always false)
    empty = GPUUsage(GPUInfo("d"))
    assert GPU.type_allowed({}, empty, request(kind=kind)) is allowed


@pytest.mark.parametrize(
    ("uuid", "expected"),
    [
        pytest.param("test-0000", "", id="allocated id is same as device id"),
        pytest.param(
            "test-1111", "1/1 CardNotFoundCustomFilterRule", id="allocated id is different from device id"
        ),
    ],
)
def test_every_container_of_a_pod_must_get_the_device_its_earlier_containers_got(
    uuid: str, expected: str
) -> None:
    # HAMi pkg/device/metax/device_test.go Test_CustomFilterRule, through Fit's `allocated`
    allocated = {CW: slices_of("test-0000")}
    got = GPU.fit(
        [device(uuid, mem=65536)], request(memreq=0, pct=100, cores=100), context(allocated=allocated)
    )
    if expected:
        assert isinstance(got, Unfit) and got.message == expected
    else:
        assert isinstance(got, Picked) and [s.uuid for s in got.slices] == [uuid]


def test_the_same_device_rule_is_checked_after_memory_and_cores() -> None:
    allocated = {CW: slices_of("other")}
    got = GPU.fit([device("d", usedmem=128)], request(memreq=64), context(allocated=allocated))
    assert isinstance(got, Unfit) and got.message == "1/1 CardInsufficientMemory"


# --- Fit ----------------------------------------------------------------------------------------------------

FIT_CASES: list[Any] = [
    pytest.param([device("dev-0"), device("dev-1")], request(memreq=64), {}, ["dev-1"], "", id="fit success"),
    pytest.param(
        [device("dev-0")], request(), {}, None, "1/1 CardInsufficientMemory", id="fit fail: memory not enough"
    ),
    pytest.param(
        [device("dev-0", mem=1024, usedcores=100)],
        request(),
        {},
        None,
        "1/1 CardInsufficientCore",
        id="fit fail: core not enough",
    ),
    pytest.param(
        [device("dev-0")],
        request(kind="OtherType"),
        {},
        None,
        "1/1 CardTypeMismatch",
        id="fit fail: type mismatch",
    ),
    pytest.param(
        [device("dev-0", used=100, mem=1280)],
        request(),
        {},
        None,
        "1/1 CardTimeSlicingExhausted",
        id="fit fail: card overused",
    ),
    pytest.param(
        [device("dev-0", mem=1280)],
        request(cores=120),
        {},
        ["dev-0"],
        "",
        id="fit success: but core limit can't exceed 100",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280)],
        request(cores=100),
        {},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id="fit fail:  card exclusively",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=100)],
        request(cores=0),
        {},
        None,
        "1/1 CardComputeUnitsExhausted",
        id="fit fail:  CardComputeUnitsExhausted",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=10)],
        request(nums=2, cores=20),
        {},
        None,
        "1/1 AllocatedCardsInsufficientRequest",
        id="fit fail:  AllocatedCardsInsufficientRequest",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=10)],
        request(memreq=0, pct=10, cores=20),
        {},
        ["dev-0"],
        "",
        id="fit success:  memory percentage",
    ),
    pytest.param(
        [device("dev-0", used=1)],
        request(memreq=64),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id="mutex policy rejects used device",
    ),
    pytest.param(
        [device("dev-0", mem=1280, health=False)],
        request(),
        {},
        None,
        "1/1 CardNotHealth",
        id="fit fail: CardNotHealth",
    ),
]


@pytest.mark.parametrize(("devices", "req", "annotations", "picked", "reason"), FIT_CASES)
def test_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage],
    req: DeviceRequest,
    annotations: dict[str, str],
    picked: list[str] | None,
    reason: str,
) -> None:
    # HAMi pkg/device/metax/device_test.go TestMetaxDevices_Fit (all 12 cases, ids = Go's names)
    got = GPU.fit(devices, req, context(annotations))
    if picked is None:
        assert isinstance(got, Unfit), got
        assert got.message == reason
    else:
        assert isinstance(got, Picked), got
        assert [s.uuid for s in got.slices] == picked
        assert all(s.vendor == "Metax-GPU" for s in got.slices)


def test_fit_records_the_request_type_memory_and_clamped_cores() -> None:
    got = GPU.fit([device("dev-0", mem=1280)], request(cores=120), context())
    assert got == Picked((GPUSlice("dev-0", 512, 100, "Metax-GPU"),))


# --- AddResourceUsage, PatchAnnotations --------------------------------------------------------------------


def test_add_resource_usage_adds_one_slot_its_memory_and_its_cores() -> None:
    # HAMi pkg/device/metax/device_test.go TestMetaxDevices_AddResourceUsage "test add resource usage"
    before = GPUUsage(GPUInfo("dev-0"), used=0, usedmem=2000, usedcores=15)
    after = GPU.add_usage(before, GPUSlice("dev-0", 1024, 50, CW))
    assert (after.used, after.usedmem, after.usedcores) == (1, 3024, 65)


def test_pod_annotations_write_the_pod_device_string_under_both_metax_gpu_keys() -> None:
    devices = PodAllocation(
        (ContainerAllocation(), ContainerAllocation((GPUSlice("n-metax-1", 65536, 100, CW),)))
    )
    out = GPU.pod_annotations({}, devices, node="n", now=NOW)
    text = ";n-metax-1,Metax-GPU,65536,100:;"
    assert out == {"hami.io/metax-gpu-devices-to-allocate": text, "hami.io/metax-gpu-devices-allocated": text}
    assert decode_pod_allocation(text) == devices
    assert encode_pod_allocation(devices) == text


def test_pod_annotations_of_a_pod_without_metax_gpus_are_empty() -> None:
    assert GPU.pod_annotations({}, PodAllocation((ContainerAllocation(),)), node="n", now=NOW) == {}


# --- ScoreNode ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "devices", "policy", "score"),
    [
        pytest.param(
            {"metax-tech.com/gpu.topology.losses": '{"1":100,"2":200}'},
            slices_of("test-0", "test-1"),
            "binpack",
            1800.0,
            id="policy is binpack",
        ),
        pytest.param(
            {"metax-tech.com/gpu.topology.scores": '{"1":100,"2":200}'},
            slices_of("test-0"),
            "spread",
            1900.0,
            id="policy is spread",
        ),
    ],
)
def test_score_node_is_2000_minus_the_topology_value_for_the_pods_device_count(
    annotations: dict[str, str], devices: PodAllocation, policy: str, score: float
) -> None:
    # HAMi pkg/device/metax/device_test.go Test_ScoreNode (both cases)
    assert GPU.score_node(metax_node(annotations=annotations), devices, [], policy) == score


TABLE = '{"1":0,"2":110,"3":270,"4":540,"5":580,"6":730,"7":930,"8":1240}'


@pytest.mark.parametrize(
    ("count", "value"), [(1, 0), (2, 110), (3, 270), (4, 540), (5, 580), (6, 730), (7, 930), (8, 1240)]
)
def test_parse_metax_annos_reads_the_value_for_the_number_of_devices(count: int, value: int) -> None:
    # HAMi pkg/device/metax/device_test.go TestParseMetaxAnnos (all 8 cases: index 1..8 of one table)
    assert metax.topology_value(TABLE, count) == float(value)
    devices = slices_of(*(f"d{i}" for i in range(count)))
    losses = metax_node(annotations={metax.TOPOLOGY_LOSSES: TABLE})
    assert GPU.score_node(losses, devices, [], "binpack") == 2000.0 - value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"1":5}', 0.0),  # no key for 2 devices
        ('{"2":1.5}', 0.0),  # not an int: Go's Unmarshal fails
        ('{"x":1,"2":7}', 0.0),  # a bad key spoils the whole map
        ("[1,2]", 0.0),
        ("null", 0.0),
        ("", 0.0),
        ('{"2":3,"+2":9}', 9.0),  # ParseInt reads "+2" as 2; the later one wins
    ],
)
def test_a_topology_table_that_does_not_give_a_value_counts_zero(text: str, value: float) -> None:
    assert metax.topology_value(text, 2) == value


def test_score_node_is_zero_without_the_annotation_or_for_another_policy() -> None:
    both = metax_node(annotations={metax.TOPOLOGY_LOSSES: '{"1":1}', metax.TOPOLOGY_SCORES: '{"1":2}'})
    assert GPU.score_node(metax_node(), slices_of("a"), [], "binpack") == 0.0
    assert GPU.score_node(both, slices_of("a"), [], "topology-aware") == 0.0
    assert GPU.score_node(both, slices_of("a"), [], "spread") == 1998.0


@given(st.text(max_size=60), st.integers(0, 16))
@settings(max_examples=300)
def test_a_topology_table_never_raises(text: str, count: int) -> None:
    assert isinstance(metax.topology_value(text, count), float)


# --- build --------------------------------------------------------------------------------------------------


def _read(text: str) -> Any:
    return lambda _path: text


def test_build_with_the_charts_defaults_gives_both_metax_vendors() -> None:
    gpu, sgpu = metax.build(load_device_config(None, _read("")))
    assert isinstance(gpu, metax.MetaxGPU) and isinstance(sgpu, metax_sgpu.MetaxSGPU)
    assert gpu.names.count == "metax-tech.com/gpu"
    assert (sgpu.names.count, sgpu.names.memory, sgpu.names.cores, sgpu.names.memory_factor) == (
        "metax-tech.com/sgpu",
        "metax-tech.com/vmemory",
        "metax-tech.com/vcore",
        1024,
    )
    assert sgpu.topology_aware is False  # the chart's quoted "false"
    assert sgpu.names.lock_annotation == MUTEX_LOCK


def test_build_reads_the_files_metax_section_and_takes_the_charts_value_for_a_missing_key() -> None:
    text = (
        "metax:\n  resourceCountName: example.com/gpu\n  resourceVCoreName: example.com/vcore\n"
        "  sgpuTopologyAware: true\n"
    )
    gpu, sgpu = metax.build(load_device_config(Path("dc.yaml"), _read(text)))
    assert gpu.names.count == "example.com/gpu"
    assert (sgpu.names.count, sgpu.names.cores) == ("metax-tech.com/sgpu", "example.com/vcore")
    assert isinstance(sgpu, metax_sgpu.MetaxSGPU) and sgpu.topology_aware is True


def test_build_refuses_a_bad_value_naming_key_line_and_value() -> None:
    text = "metax:\n  resourceCountName: metax-tech.com/gpu\n  sgpuTopologyAware: maybe\n"
    with pytest.raises(ConfigError) as err:
        metax.build(load_device_config(Path("dc.yaml"), _read(text)))
    assert (err.value.key, err.value.line, err.value.value) == ("metax.sgpuTopologyAware", 3, '"maybe"')
    assert "dc.yaml line 3" in str(err.value) and "true or false" in str(err.value)


def test_build_refuses_an_unknown_key_in_the_metax_section() -> None:
    text = "metax:\n  resourceVCountNam: metax-tech.com/sgpu\n"
    with pytest.raises(ConfigError) as err:
        metax.build(load_device_config(Path("dc.yaml"), _read(text)))
    assert err.value.key == "metax.resourceVCountNam" and err.value.line == 2
    assert "resourceVCountName" in str(err.value)
