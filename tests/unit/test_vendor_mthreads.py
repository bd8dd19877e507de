"""hami_control.devices.mthreads: HAMi's Moore Threads backend (pkg/device/mthreads/device.go, v2.10.0),
its Go tests (pkg/device/mthreads/device_test.go) transcribed case by case, plus property tests of the
request reader and the capacity inventory."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import GPU_SCHEDULER_POLICY, decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import mthreads
from hami_control.devices.base import (
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
)
from hami_control.devices.config import load_device_config, parse_device_config
from hami_control.devices.standard import CARD_NOT_FOUND_CUSTOM_FILTER_RULE
from hami_control.usage import GPUUsage
from tests.builders import container, pod

VENDOR = mthreads.Mthreads(mthreads.names())
CW = mthreads.COMMON_WORD
COUNT = "mthreads.com/vgpu"
MEMORY = "mthreads.com/sgpu-memory"
CORES = "mthreads.com/sgpu-core"
GO = "HAMi pkg/device/mthreads/device_test.go"
NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
NOW_NS = "1772366400123456000"


def device(
    uid: str,
    *,
    index: int = 0,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    devmem: int = 1280,
    usedcores: int = 0,
    devcore: int = 100,
    health: bool = True,
    type: str = CW,
) -> GPUUsage:
    """A device with Go's DeviceUsage fields injected (Used, Count, Usedmem, Totalmem, Usedcores, ...)."""
    info = GPUInfo(uid, index=index, count=count, devmem=devmem, devcore=devcore, type=type, health=health)
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def req(nums: int, memreq: int = 512, pct: int = 0, cores: int = 50, typ: str = CW) -> DeviceRequest:
    return DeviceRequest(nums, typ, memreq=memreq, mem_percentage=pct, coresreq=cores)


def context(annotations: dict[str, str] | None = None, **kwargs: Any) -> FitContext:
    """The pod of a Go Fit test: its annotations, and the policy chain HAMi reads from them."""
    annotations = annotations or {}
    policy = annotations.get(GPU_SCHEDULER_POLICY)
    chain = decode_gpu_policy(policy) if policy else (GPUPolicy.SPREAD,)
    return FitContext({"metadata": {"annotations": annotations}}, policy=chain, **kwargs)


def capacity_node(values: dict[str, Any], name: str = "test") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": values}}


# --- names, health, lock -------------------------------------------------------------------------------


def test_names_are_hamis_keys() -> None:
    names = VENDOR.names
    assert (names.common_word, names.family) == ("Mthreads", "mthreads")
    assert (names.count, names.memory, names.cores) == (COUNT, MEMORY, CORES)
    assert names.memory_factor == 512  # GetResourceNames MemoryFactor
    assert names.to_allocate == ""  # InRequestDevices is registered but PatchAnnotations never writes it
    assert names.allocated == "hami.io/mthreads-vgpu-devices-allocated"
    assert (names.register, names.handshake) == ("", "")
    assert (names.use_uuid, names.nouse_uuid) == ("mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid")


def test_lock_and_release_take_no_node_lock() -> None:
    # HAMi LockNode / ReleaseNodeLock return nil: no lock annotation
    assert VENDOR.names.lock is LockKind.NONE
    assert VENDOR.names.lock_annotation == ""


def test_health_is_always_true_and_updates() -> None:
    # HAMi CheckHealth returns (true, true) whatever the node
    assert VENDOR.names.health is HealthRule.ALWAYS
    assert VENDOR.node_health({}, NOW) == NodeHealth(True, True)


# --- Test_MutateAdmission ------------------------------------------------------------------------------

MUTATE_CASES: list[tuple[str, dict[str, Any], dict[str, Any], Admission]] = [
    (
        "set to resources limit",
        container(limits={COUNT: "2", MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(True),
    ),
    ("count over one without pod annotations", container(limits={COUNT: "2"}), {}, Admission(True)),
    (
        "count over one requested without limits",
        container(requests={COUNT: "2"}),
        pod(annotations={}),
        Admission(True),
    ),
    (
        "count one requested without limits",
        container(requests={COUNT: "1"}),
        pod(annotations={}),
        Admission(True),
    ),
    (
        "don't set to count limit",
        container(limits={MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(False),
    ),
    (
        "don't set to memory limit",
        container(limits={COUNT: "1", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(True),
    ),
    (
        "count less than one",
        container(limits={COUNT: "1", MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(True),
    ),
    (
        "memory no exist legalMemoryslices",
        container(limits={COUNT: "1", MEMORY: "3", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(True, mthreads.MEMORY_ERROR),
    ),
    (
        "count set to zero is rejected",
        container(limits={COUNT: "0", MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(False, "mthreads.com/vgpu must be greater than 0"),
    ),
    (
        "count set to negative is rejected",
        container(limits={COUNT: "-1", MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(False, "mthreads.com/vgpu must be greater than 0"),
    ),
    (
        "request-only count set to zero is rejected",
        container(requests={COUNT: "0", MEMORY: "2", CORES: "1"}),
        pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"}),
        Admission(False, "mthreads.com/vgpu must be greater than 0"),
    ),
]


@pytest.mark.parametrize(
    ("ctr", "the_pod", "want"),
    [pytest.param(c, p, w, id=f'{GO} Test_MutateAdmission "{name}"') for name, c, p, w in MUTATE_CASES],
)
def test_mutate_answers_found_and_hamis_error_text(
    ctr: dict[str, Any], the_pod: dict[str, Any], want: Admission
) -> None:
    assert VENDOR.mutate(ctr, the_pod) == want


def test_mutate_count_over_one_sets_cores_memory_and_the_pod_annotation() -> None:
    # HAMi Test_MutateAdmission "set to resources limit": the limits are overwritten with n x 16 / n x 96
    ctr = container(limits={COUNT: "2", MEMORY: "2", CORES: "1"})
    the_pod = pod(annotations={mthreads.REQUEST_GPU_NUM: "test123"})
    VENDOR.mutate(ctr, the_pod)
    assert ctr["resources"]["limits"] == {COUNT: "2", MEMORY: "192", CORES: "32"}
    assert the_pod["metadata"]["annotations"] == {mthreads.REQUEST_GPU_NUM: "2"}


def test_mutate_count_over_one_creates_the_pod_annotations_and_the_limits() -> None:
    # HAMi Test_MutateAdmission "count over one without pod annotations" / "... requested without limits"
    ctr = container(requests={COUNT: "3"})
    the_pod: dict[str, Any] = {}
    VENDOR.mutate(ctr, the_pod)
    assert ctr["resources"]["limits"] == {MEMORY: "288", CORES: "48"}
    assert the_pod == {"metadata": {"annotations": {mthreads.REQUEST_GPU_NUM: "3"}}}


def test_mutate_count_one_without_a_memory_limit_gets_a_whole_gpu() -> None:
    # HAMi Test_MutateAdmission "don't set to memory limit" / "count one requested without limits"
    ctr = container(limits={COUNT: "1", CORES: "1"})
    the_pod = pod(annotations={})
    VENDOR.mutate(ctr, the_pod)
    assert ctr["resources"]["limits"] == {COUNT: "1", MEMORY: "96", CORES: "16"}
    assert the_pod == pod(annotations={})
    requested = container(requests={COUNT: "1"})
    VENDOR.mutate(requested, pod(annotations={}))
    assert requested["resources"]["limits"] == {MEMORY: "96", CORES: "16"}


def test_mutate_count_one_with_a_legal_memory_changes_nothing() -> None:
    # HAMi Test_MutateAdmission "count less than one"
    ctr = container(limits={COUNT: "1", MEMORY: "2", CORES: "1"})
    the_pod = pod(annotations={})
    before = copy.deepcopy((ctr, the_pod))
    assert VENDOR.mutate(ctr, the_pod) == Admission(True)
    assert (ctr, the_pod) == before


@pytest.mark.parametrize("memory", ["2", "4", "8", "16", "32", "64", "96"])
def test_mutate_accepts_every_legal_memory(memory: str) -> None:
    assert VENDOR.mutate(container(limits={COUNT: "1", MEMORY: memory}), pod()) == Admission(True)


@pytest.mark.parametrize("memory", ["1", "3", "97", "2.5", "2Ki"])
def test_mutate_refuses_other_memory_values_with_hamis_text(memory: str) -> None:
    assert VENDOR.mutate(container(limits={COUNT: "1", MEMORY: memory}), pod()) == Admission(
        True, "sGPU memory request value is invalid, valid values are [2, 4, 8, 16, 32, 64, 96]"
    )


def test_mutate_reads_the_memory_limit_only() -> None:
    # Go reads ctr.Resources.Limits[memory] only: a memory request is as if absent
    ctr = container(limits={COUNT: "1"}, requests={MEMORY: "3"})
    assert VENDOR.mutate(ctr, pod()) == Admission(True)
    assert ctr["resources"]["limits"] == {COUNT: "1", MEMORY: "96", CORES: "16"}


def test_mutate_error_names_the_configured_count_resource() -> None:
    vendor = mthreads.Mthreads(mthreads.names(count="example.com/vgpu"))
    assert vendor.mutate(container(limits={"example.com/vgpu": "0"}), pod()) == Admission(
        False, "example.com/vgpu must be greater than 0"
    )


def test_mutate_fractional_count_rounds_up_like_go_value() -> None:
    # count.Value() rounds 0.5 up to 1: a count of one, not a refusal
    ctr = container(limits={COUNT: "500m"})
    assert VENDOR.mutate(ctr, pod()) == Admission(True)
    assert ctr["resources"]["limits"][MEMORY] == "96"


def test_mutate_unreadable_count_is_refused_not_crashed() -> None:
    assert VENDOR.mutate(container(limits={COUNT: "lots"}), pod()) == Admission(
        False, "mthreads.com/vgpu must be greater than 0"
    )


# --- Test_GetNodeDevices -------------------------------------------------------------------------------


def test_node_devices_from_capacity() -> None:
    # HAMi pkg/device/mthreads/device_test.go Test_GetNodeDevices "get node device"
    got = VENDOR.node_devices(capacity_node({MEMORY: "1", CORES: "1"}))
    assert got == (
        GPUInfo("test-mthreads-0", index=0, count=100, devmem=8192, devcore=16, type=CW, health=True),
    )


def test_node_devices_one_per_16_cores_with_the_memory_shared_out() -> None:
    got = VENDOR.node_devices(capacity_node({MEMORY: "192", CORES: "32"}, name="n1"))
    assert got is not None
    assert [(d.id, d.index, d.devmem, d.devcore) for d in got] == [
        ("n1-mthreads-0", 0, 49152, 16),
        ("n1-mthreads-1", 1, 49152, 16),
    ]


def test_node_devices_rounds_a_partial_gpu_up() -> None:
    # Go's loop `i*16 < cores`: 17 cores are 2 devices
    got = VENDOR.node_devices(capacity_node({MEMORY: "96", CORES: "17"}))
    assert got is not None and len(got) == 2


@pytest.mark.parametrize("values", [{}, {MEMORY: "96"}, {CORES: "0", MEMORY: "96"}])
def test_node_devices_without_cores_capacity_is_no_inventory(values: dict[str, str]) -> None:
    # HAMi: "device not found mthreads.com/sgpu-core" (an error, no devices)
    assert VENDOR.node_devices(capacity_node(values)) is None


def test_node_devices_non_whole_cores_is_no_inventory_and_non_whole_memory_counts_zero() -> None:
    # HAMi: `cores, ok := ...AsInt64(); if !ok` -> "device not found"; `memoryTotal, _ :=` -> 0
    assert VENDOR.node_devices(capacity_node({CORES: "1.5", MEMORY: "96"})) is None
    got = VENDOR.node_devices(capacity_node({CORES: "16", MEMORY: "1.5"}))
    assert got is not None and [d.devmem for d in got] == [0]


@pytest.mark.parametrize(
    ("values", "resource"),
    [
        ({CORES: "16385"}, CORES),
        ({CORES: "1", MEMORY: "262144"}, MEMORY),
        ({CORES: "1", MEMORY: "-1"}, MEMORY),
    ],
)
def test_node_devices_unusable_capacity_raises_wire_format_error(
    values: dict[str, str], resource: str
) -> None:
    with pytest.raises(WireFormatError) as err:
        VENDOR.node_devices(capacity_node(values))
    assert err.value.annotation == f"status.capacity[{resource}]"


def test_node_devices_negative_cores_are_no_devices() -> None:
    assert VENDOR.node_devices(capacity_node({CORES: "-16"})) == ()


@given(cores=st.integers(-(2**63), 2**63 - 1), memory=st.integers(-(2**63), 2**63 - 1))
def test_node_devices_either_returns_devices_or_raises_wire_format_error(cores: int, memory: int) -> None:
    try:
        got = VENDOR.node_devices(capacity_node({CORES: str(cores), MEMORY: str(memory)}))
    except WireFormatError:
        return
    assert got is None or all(0 <= d.devmem <= 2**31 - 1 and d.devcore == 16 for d in got)


# --- Test_PatchAnnotations -----------------------------------------------------------------------------


def test_pod_annotations_write_allocated_index_time_and_node() -> None:
    # HAMi pkg/device/mthreads/device_test.go Test_PatchAnnotations "exist device"
    # (HAMi's annoinput has no hami.io/vgpu-node there, so predicate-node is ""; here it is the node given)
    devices = PodAllocation((ContainerAllocation((GPUSlice("test1", 1000, 1, CW),)),))
    got = VENDOR.pod_annotations({}, devices, node="", now=NOW, custom=(({"index": 0},),))
    assert got == {
        "hami.io/mthreads-vgpu-devices-allocated": "test1,Mthreads,1000,1:;",
        "mthreads.com/gpu-index": "0",
        "mthreads.com/predicate-time": NOW_NS,
        "mthreads.com/predicate-node": "",
    }


def test_pod_annotations_index_is_the_last_container_with_devices() -> None:
    devices = PodAllocation(
        (
            ContainerAllocation((GPUSlice("n1-mthreads-1", 512, 8, CW),)),
            ContainerAllocation(
                (GPUSlice("n1-mthreads-3", 512, 8, CW), GPUSlice("n1-mthreads-2", 512, 8, CW))
            ),
            ContainerAllocation(),
        )
    )
    got = VENDOR.pod_annotations({}, devices, node="n1", now=NOW)
    assert got["mthreads.com/gpu-index"] == "3,2"  # from the ids when Fit recorded nothing
    assert got["mthreads.com/predicate-node"] == "n1"
    assert got["hami.io/mthreads-vgpu-devices-allocated"] == (
        "n1-mthreads-1,Mthreads,512,8:;n1-mthreads-3,Mthreads,512,8:n1-mthreads-2,Mthreads,512,8:;;"
    )


def test_pod_annotations_without_devices_write_nothing() -> None:
    assert VENDOR.pod_annotations({}, PodAllocation((ContainerAllocation(),)), node="n1", now=NOW) == {}


# --- Test_checkType ------------------------------------------------------------------------------------
# Go's checkType compares the request's Type with "Mthreads" and ignores the device; here `type_allowed`
# also holds the `strings.Contains(dev.Type, k.Type)` check Fit makes just before it, so the device is a
# Mthreads one.


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param(CW, True, id=f'{GO} Test_checkType "the same type"'),
        pytest.param("test111", False, id=f'{GO} Test_checkType "the different type"'),
        pytest.param("mthreads", False, id="case-sensitive"),
        pytest.param("Mthread", False, id="contained in the device Type but not the common word"),
    ],
)
def test_type_allowed_needs_the_exact_common_word(request_type: str, allowed: bool) -> None:
    assert VENDOR.type_allowed({}, device("d"), req(1, typ=request_type)) is allowed


# --- Test_GenerateResourceRequests ---------------------------------------------------------------------

REQUEST_CASES: list[tuple[str, dict[str, Any], DeviceRequest | None]] = [
    (
        "all resources set to limit and request",
        container(
            limits={COUNT: "1", MEMORY: "1000", CORES: "1"}, requests={COUNT: "1", MEMORY: "1000", CORES: "1"}
        ),
        DeviceRequest(1, CW, memreq=512000, mem_percentage=0, coresreq=1),
    ),
    (
        "all resources don't set to limit,count don't set to request",
        container(limits={}, requests={MEMORY: "1000", CORES: "1"}),
        None,
    ),
    (
        "all resources don't set to limit,cores and memory don't set to request",
        container(limits={}, requests={COUNT: "1"}),
        DeviceRequest(1, CW, memreq=0, mem_percentage=100, coresreq=0),
    ),
    (
        "count set to zero with memory and cores",
        container(limits={COUNT: "0", MEMORY: "1000", CORES: "1"}),
        None,
    ),
    (
        "count set to negative with memory and cores",
        container(limits={COUNT: "-1", MEMORY: "1000", CORES: "1"}),
        None,
    ),
    (
        "count overflowing int32 with memory and cores",
        container(limits={COUNT: "4294967296", MEMORY: "1000", CORES: "1"}),
        None,
    ),
    (
        "memory overflowing int32 is rejected, not truncated to zero",
        container(limits={COUNT: "1", MEMORY: "16Gi", CORES: "1"}),
        None,
    ),
    (
        "decimal-form memory request is rejected, not treated as zero",
        container(limits={COUNT: "1", MEMORY: "16.0Gi", CORES: "1"}),
        None,
    ),
]


@pytest.mark.parametrize(
    ("ctr", "want"),
    [pytest.param(c, w, id=f'{GO} Test_GenerateResourceRequests "{name}"') for name, c, w in REQUEST_CASES],
)
def test_request_matches_hamis_container_device_request(
    ctr: dict[str, Any], want: DeviceRequest | None
) -> None:
    assert VENDOR.request(ctr) == want


def test_request_divides_memory_and_cores_by_the_count() -> None:
    # Memreq int32(mem*512)/n, Coresreq core/n (Go's int32 division)
    got = VENDOR.request(container(limits={COUNT: "3", MEMORY: "192", CORES: "50"}))
    assert got == DeviceRequest(3, CW, memreq=32768, mem_percentage=0, coresreq=16)


def test_request_memory_at_the_int32_bound_is_kept() -> None:
    most = (2**31 - 1) // 512
    assert VENDOR.request(container(limits={COUNT: "1", MEMORY: str(most)})) == DeviceRequest(
        1, CW, most * 512, 0, 0
    )
    assert VENDOR.request(container(limits={COUNT: "1", MEMORY: str(most + 1)})) is None


def test_request_unreadable_cores_count_as_zero() -> None:
    # corenums, ok := core.AsInt64(): not ok leaves Coresreq 0
    got = VENDOR.request(container(limits={COUNT: "1", CORES: "1500m"}))
    assert got == DeviceRequest(1, CW, memreq=0, mem_percentage=100, coresreq=0)


def test_request_negative_cores_are_no_request() -> None:
    # Go would hand Fit a negative Coresreq; here such a container asks nothing
    assert VENDOR.request(container(limits={COUNT: "1", CORES: "-4"})) is None


QUANTITIES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["0", "1", "16Gi", "1.5", "500m", "1e3", "abc", "", "-0"]),
)


@given(count=QUANTITIES, memory=QUANTITIES, cores=QUANTITIES, in_limits=st.booleans())
def test_request_is_never_negative_for_any_quantity(
    count: str, memory: str, cores: str, in_limits: bool
) -> None:
    values = {COUNT: count, MEMORY: memory, CORES: cores}
    got = VENDOR.request(container(limits=values) if in_limits else container(requests=values))
    if got is not None:
        assert 0 < got.nums <= 2**31 - 1
        assert 0 <= got.memreq <= 2**31 - 1
        assert 0 <= got.coresreq <= 2**31 - 1
        assert got.type == CW


@given(count=QUANTITIES, memory=QUANTITIES, cores=QUANTITIES)
def test_mutate_never_crashes_and_refuses_only_with_hamis_texts(count: str, memory: str, cores: str) -> None:
    got = VENDOR.mutate(container(limits={COUNT: count, MEMORY: memory, CORES: cores}), pod())
    assert got.error in ("", mthreads.MEMORY_ERROR, "mthreads.com/vgpu must be greater than 0")


# --- Test_CustomFilterRule -----------------------------------------------------------------------------


def placed(*uuids: str) -> dict[str, PodAllocation]:
    """What earlier containers of the pod were given (HAMi's `allocated` PodDevices)."""
    return {CW: PodAllocation((ContainerAllocation(tuple(GPUSlice(u, 0, 0, CW) for u in uuids)),))}


@pytest.mark.parametrize(
    ("earlier", "want"),
    [
        pytest.param("test123", None, id=f'{GO} Test_CustomFilterRule "allocate device"'),
        pytest.param(
            "test456",
            CARD_NOT_FOUND_CUSTOM_FILTER_RULE,
            id=f'{GO} Test_CustomFilterRule "don\'t allocate device"',
        ),
    ],
)
def test_custom_filter_rule_keeps_the_pod_on_one_device(earlier: str, want: str | None) -> None:
    got = VENDOR.extra_reason(
        device("test123"), req(1, memreq=0, cores=0), 0, context(allocated=placed(earlier))
    )
    assert got == want


def test_fit_refuses_a_second_device_for_a_later_container() -> None:
    devices = [device("dev-0"), device("dev-1", index=1)]
    got = VENDOR.fit(devices, req(1), context(allocated=placed("dev-0")))
    assert isinstance(got, Picked) and [s.uuid for s in got.slices] == ["dev-0"]
    got = VENDOR.fit([device("dev-1", index=1)], req(1), context(allocated=placed("dev-0")))
    assert got == Unfit({CARD_NOT_FOUND_CUSTOM_FILTER_RULE: 1}, 1)


def test_fit_counts_a_capacity_reason_before_the_custom_filter_rule() -> None:
    # HAMi checks customFilterRule after memory and cores
    got = VENDOR.fit([device("dev-1", usedmem=1280)], req(1), context(allocated=placed("dev-0")))
    assert isinstance(got, Unfit) and got.message == "1/1 CardInsufficientMemory"


# --- TestDevices_Fit -----------------------------------------------------------------------------------

FIT_CASES: list[tuple[str, list[GPUUsage], DeviceRequest, dict[str, str], list[str] | str]] = [
    (
        "fit success",
        [device("dev-0", devmem=128), device("dev-1", devmem=128)],
        req(1, memreq=64),
        {},
        ["dev-1"],
    ),
    ("fit fail: memory not enough", [device("dev-0", devmem=128)], req(1), {}, "1/1 CardInsufficientMemory"),
    (
        "fit fail: core not enough",
        [device("dev-0", devmem=1024, usedcores=100)],
        req(1),
        {},
        "1/1 CardInsufficientCore",
    ),
    (
        "fit fail: type mismatch",
        [device("dev-0", devmem=128)],
        req(1, typ="OtherType"),
        {},
        "1/1 CardTypeMismatch",
    ),
    (
        "fit fail: user assign use uuid mismatch",
        [device("dev-1")],
        req(2),
        {"mthreads.ai/use-gpuuuid": "dev-0"},
        "1/1 CardUuidMismatch",
    ),
    (
        "fit fail: user assign no use uuid match",
        [device("dev-0")],
        req(2),
        {"mthreads.ai/nouse-gpuuuid": "dev-0"},
        "1/1 CardUuidMismatch",
    ),
    ("fit fail: card overused", [device("dev-0", used=100)], req(1), {}, "1/1 CardTimeSlicingExhausted"),
    ("fit success: but core limit can't exceed 100", [device("dev-0")], req(1, cores=120), {}, ["dev-0"]),
    (
        "fit fail:  card exclusively",
        [device("dev-0", used=20)],
        req(1, cores=100),
        {},
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    (
        "fit fail:  CardComputeUnitsExhausted",
        [device("dev-0", used=20, usedcores=100)],
        req(1, cores=0),
        {},
        "1/1 CardComputeUnitsExhausted",
    ),
    (
        "fit fail:  AllocatedCardsInsufficientRequest",
        [device("dev-0", used=20, usedcores=10)],
        req(2, cores=20),
        {},
        "1/1 AllocatedCardsInsufficientRequest",
    ),
    (
        "fit success:  memory percentage",
        [device("dev-0", used=20, usedcores=10)],
        req(1, memreq=0, pct=10, cores=20),
        {},
        ["dev-0"],
    ),
    (
        "mutex policy rejects used device",
        [device("dev-0", used=1, count=2, devmem=128)],
        req(1, memreq=64),
        {GPU_SCHEDULER_POLICY: "mutex"},
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    (
        "fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards",
        [device("dev-0"), device("dev-1", index=1)],
        req(3, cores=20),
        {},
        "2/2 AllocatedCardsInsufficientRequest",
    ),
    ("fit fail: CardNotHealth", [device("dev-0", health=False)], req(1), {}, "1/1 CardNotHealth"),
]


@pytest.mark.parametrize(
    ("devices", "request_", "annotations", "want"),
    [pytest.param(d, r, a, w, id=f'{GO} TestDevices_Fit "{name}"') for name, d, r, a, w in FIT_CASES],
)
def test_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage], request_: DeviceRequest, annotations: dict[str, str], want: list[str] | str
) -> None:
    got = VENDOR.fit(devices, request_, context(annotations))
    if isinstance(want, str):
        assert isinstance(got, Unfit)
        assert got.message == want
    else:
        assert isinstance(got, Picked)
        assert [s.uuid for s in got.slices] == want


def test_fit_records_memory_cores_type_and_index() -> None:
    # TestDevices_Fit "fit success: but core limit can't exceed 100" / "memory percentage": the slice
    got = VENDOR.fit([device("dev-0", index=5)], req(1, cores=120), context())
    assert got == Picked((GPUSlice("dev-0", 512, 100, CW),), ({"index": 5},))
    got = VENDOR.fit([device("dev-0", used=20, usedcores=10)], req(1, memreq=0, pct=10, cores=20), context())
    assert isinstance(got, Picked) and got.slices == (GPUSlice("dev-0", 128, 20, CW),)


def test_fit_type_check_is_case_sensitive_containment() -> None:
    got = VENDOR.fit([device("dev-0", type="MTHREADS")], req(1), context())
    assert isinstance(got, Unfit) and got.message == "1/1 CardTypeMismatch"


# --- TestDevices_AddResourceUsage ----------------------------------------------------------------------


def test_add_usage_counts_one_task_its_memory_and_cores() -> None:
    # HAMi pkg/device/mthreads/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    got = VENDOR.add_usage(device("dev-0", usedcores=15, usedmem=2000), GPUSlice("dev-0", 1024, 50, CW))
    assert (got.used, got.usedmem, got.usedcores) == (1, 3024, 65)


# --- build ---------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = mthreads.build(load_device_config(None, lambda _path: ""))
    assert isinstance(vendor, mthreads.Mthreads)
    assert vendor.names == mthreads.names()


def test_build_reads_the_configured_names() -> None:
    text = (
        "mthreads:\n  resourceCountName: a.com/v\n  resourceMemoryName: a.com/m\n"
        "  resourceCoreName: a.com/c\n"
    )
    (vendor,) = mthreads.build(parse_device_config(text, "dc.yaml"))
    assert (vendor.names.count, vendor.names.memory, vendor.names.cores) == ("a.com/v", "a.com/m", "a.com/c")


def test_build_refuses_a_bad_value_naming_key_and_line() -> None:
    text = "mthreads:\n  resourceCountName: mthreads.com/vgpu\n  resourceCoreName: [a, b]\n"
    with pytest.raises(ConfigError) as err:
        mthreads.build(parse_device_config(text, "dc.yaml"))
    assert err.value.key == "mthreads.resourceCoreName"
    assert err.value.line == 3
    assert "dc.yaml line 3" in str(err.value)


def test_build_refuses_an_unknown_key_with_a_suggestion() -> None:
    text = "mthreads:\n  resourceCountNam: mthreads.com/vgpu\n"
    with pytest.raises(ConfigError) as err:
        mthreads.build(parse_device_config(text, "dc.yaml"))
    assert err.value.key == "mthreads.resourceCountNam"
    assert "resourceCountName" in str(err.value)
