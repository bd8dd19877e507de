"""hami_control.devices.cambricon: HAMi's Cambricon MLU backend, its Go tests
(pkg/device/cambricon/device_test.go, v2.10.0) transcribed case by case, plus the quota rule, the
device-config section and property tests of the request reader and the capacity inventory."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_gpu_policy, decode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_control.devices.base import (
    DSMLU_LOCK,
    DeviceRequest,
    FitContext,
    LockKind,
    NodeHealth,
    Picked,
    QuotaEntry,
    Unfit,
)
from hami_control.devices.cambricon import (
    COMMON_WORD,
    DSMLU_ASSIGNED,
    DSMLU_PROFILE,
    FLAG_COUNT,
    Cambricon,
    build,
    collapsed_usage,
    names,
    quota_fits,
)
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container

MEM = "cambricon.com/mlu.smlu.vmemory"
CORES = "cambricon.com/mlu.smlu.vcore"
NOW = datetime(2026, 8, 21, 12, 0, tzinfo=UTC)

# The Go tests build the backend with the `--cambricon-mlu-name` default, cambricon.com/mlu.
MLU = Cambricon(names(count=FLAG_COUNT))


def usage(
    id: str,
    *,
    index: int = 0,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    totalmem: int = 1280,
    totalcore: int = 100,
    usedcores: int = 0,
    health: bool = True,
) -> GPUUsage:
    """A Go test's DeviceUsage: the inventory entry and the injected Used/Usedmem/Usedcores."""
    info = GPUInfo(id, index, count, totalmem, totalcore, COMMON_WORD, 0, "", health)
    return GPUUsage(info, used, usedmem, usedcores)


def context(annotations: Mapping[str, str] | None = None, **extra: Any) -> FitContext:
    """The pod of a Go Fit test; its `hami.io/gpu-scheduler-policy` annotation is the policy chain."""
    annos = dict(annotations or {})
    pod = {"metadata": {"annotations": annos}}
    policy = annos.get("hami.io/gpu-scheduler-policy")
    chain = decode_gpu_policy(policy) if policy else FitContext(pod).policy
    if extra:
        return FitContext(pod, policy=chain, **extra)
    return FitContext(pod, policy=chain)


# --- Test_GetNodeDevices ---------------------------------------------------------------------------------


def test_node_devices_are_made_up_from_capacity() -> None:
    # HAMi pkg/device/cambricon/device_test.go Test_GetNodeDevices "test with valid configuration"
    node = {"metadata": {"name": "test"}, "status": {"capacity": {CORES: "1", MEM: "1"}}}
    assert MLU.node_devices(node) == (
        GPUInfo(
            id="test-cambricon-mlu-0",
            index=0,
            count=100,
            devmem=25600,
            devcore=100,
            type="MLU",
            numa=0,
            health=True,
        ),
    )


def test_node_devices_one_per_hundred_cores_with_memory_shared_out() -> None:
    # (ours) two cards: vcore 200, vmemory 4096 -> 2 devices of 4096 * 256 * 100 / 200 MiB
    node = {"metadata": {"name": "n"}, "status": {"capacity": {CORES: "200", MEM: "4096"}}}
    devices = MLU.node_devices(node)
    assert devices is not None
    assert [(d.id, d.index, d.devmem) for d in devices] == [
        ("n-cambricon-mlu-0", 0, 524288),
        ("n-cambricon-mlu-1", 1, 524288),
    ]
    # ceil(vcore / 100): 250 cores make 3 devices
    node["status"]["capacity"][CORES] = "250"  # type: ignore[index]
    assert len(MLU.node_devices(node) or ()) == 3


@pytest.mark.parametrize(
    "capacity",
    [{}, {MEM: "10"}, {CORES: "0", MEM: "10"}, {CORES: "1.5", MEM: "10"}],
    ids=["none", "memory only", "zero cores", "cores not whole"],
)
def test_no_cores_capacity_is_no_inventory(capacity: dict[str, str]) -> None:
    # HAMi: GetNodeDevices fails with "device not found <cores resource>"
    assert MLU.node_devices({"metadata": {"name": "n"}, "status": {"capacity": capacity}}) is None


def test_memory_per_device_beyond_int32_is_a_wire_format_error() -> None:
    node = {"metadata": {"name": "n"}, "status": {"capacity": {CORES: "100", MEM: "100000000"}}}
    with pytest.raises(WireFormatError, match=r"status.capacity\[cambricon.com/mlu.smlu.vmemory\]"):
        MLU.node_devices(node)


def test_health_is_always_good_and_always_updates() -> None:
    # HAMi CambriconDevices.CheckHealth returns (true, true)
    assert MLU.node_health({}, NOW) == NodeHealth(True, True)


@given(
    cores=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12), st.none()),
    memory=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12), st.none()),
)
def test_capacity_inventory_returns_devices_or_raises_wire_format_error(cores: Any, memory: Any) -> None:
    capacity = {k: v for k, v in ((CORES, cores), (MEM, memory)) if v is not None}
    node = {"metadata": {"name": "n"}, "status": {"capacity": capacity}}
    try:
        devices = MLU.node_devices(node)
    except WireFormatError:
        return
    for d in devices or ():
        assert d.count == 100
        assert d.devcore == 100
        assert 0 <= d.devmem <= 2**31 - 1


# --- Test_MutateAdmission ------------------------------------------------------------------------------


def test_mutate_finds_the_count_limit_and_changes_nothing() -> None:
    # HAMi pkg/device/cambricon/device_test.go Test_MutateAdmission "set to resources limits"
    ctr = container(limits={FLAG_COUNT: "1"})
    before = repr(ctr)
    pod: dict[str, Any] = {}
    assert MLU.mutate(ctr, pod).found
    assert repr(ctr) == before
    assert pod == {}


def test_mutate_ignores_a_count_in_requests_only() -> None:
    # (ours) MutateAdmission reads limits only
    assert not MLU.mutate(container(limits={}, requests={FLAG_COUNT: "1"}), {}).found


# --- Test_checkType ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("MLU", True, id='Test_checkType "the same type"'),
        pytest.param("TEST", False, id='Test_checkType "the different type"'),
    ],
)
def test_type_check_compares_the_request_type_with_mlu(request_type: str, allowed: bool) -> None:
    # HAMi pkg/device/cambricon/device_test.go Test_checkType (empty DeviceUsage: its Type is not read)
    device = GPUUsage(GPUInfo("d"))
    assert MLU.type_allowed({}, device, DeviceRequest(1, request_type)) is allowed


# --- Test_GenerateResourceRequests ---------------------------------------------------------------------


def both(values: Mapping[str, str]) -> Any:
    return container(limits=values, requests=values)


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(container(limits={}, requests={}), None, id="don't set to limits and request"),
        pytest.param(
            both({FLAG_COUNT: "1", MEM: "1000", CORES: "2"}),
            DeviceRequest(1, "MLU", 256000, 0, 2),
            id="resourcecoresname,resourcecountname and resourcememoryname set to limits and request",
        ),
        pytest.param(
            both({FLAG_COUNT: "1", MEM: "1000"}),
            DeviceRequest(1, "MLU", 256000, 0, 100),
            id="resourcememoryname don't set to limits and requests",
        ),
        pytest.param(
            both({FLAG_COUNT: "1", CORES: "2"}),
            DeviceRequest(1, "MLU", 0, 100, 2),
            id="resourcecoresname don't set to limits and requests",
        ),
        pytest.param(
            container(limits={FLAG_COUNT: "1", MEM: "16Gi"}),
            None,
            id="memory overflowing int32 is rejected, not truncated to zero",
        ),
        pytest.param(
            container(limits={FLAG_COUNT: "1", MEM: "16.0Gi"}),
            None,
            id="decimal-form memory request is rejected, not treated as zero",
        ),
    ],
)
def test_request_reads_count_vmemory_times_256_and_cores(ctr: Any, want: DeviceRequest | None) -> None:
    # HAMi pkg/device/cambricon/device_test.go Test_GenerateResourceRequests (case name = id)
    assert MLU.request(ctr) == want


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        ({FLAG_COUNT: "1", MEM: "8388607"}, DeviceRequest(1, "MLU", 2147483392, 0, 100)),
        ({FLAG_COUNT: "1", MEM: "8388608"}, None),
        ({FLAG_COUNT: "1", MEM: "-1"}, None),
        ({FLAG_COUNT: "1", MEM: "0"}, DeviceRequest(1, "MLU", 0, 100, 100)),
        ({FLAG_COUNT: "1", CORES: "1.5"}, DeviceRequest(1, "MLU", 0, 100, 100)),
        ({FLAG_COUNT: "0"}, None),
        ({FLAG_COUNT: "-1"}, None),
        ({FLAG_COUNT: "4294967297"}, DeviceRequest(1, "MLU", 0, 100, 100)),
        ({FLAG_COUNT: "1", CORES: "-5"}, None),
    ],
    ids=[
        "memory at MaxInt32/256",
        "memory above MaxInt32/256",
        "negative memory",
        "zero memory asks the whole device",
        "cores not whole: default",
        "zero count",
        "negative count",
        "count wraps like Go's int32()",
        "negative cores",
    ],
)
def test_request_edges(limits: dict[str, str], want: DeviceRequest | None) -> None:
    # (ours) the bounds of HAMi's GenerateResourceRequests
    assert MLU.request(container(limits=limits)) == want


QUANTITY = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["1.5", "16Gi", "16.0Gi", "1e3", "1k", "-0", "abc", "", "0.5m"]),
)


@given(count=QUANTITY, memory=st.one_of(st.none(), QUANTITY), cores=st.one_of(st.none(), QUANTITY))
def test_request_is_never_negative(count: Any, memory: Any, cores: Any) -> None:
    limits = {FLAG_COUNT: count}
    if memory is not None:
        limits[MEM] = memory
    if cores is not None:
        limits[CORES] = cores
    got = MLU.request(container(limits=limits))
    if got is not None:
        assert 0 < got.nums <= 2**31 - 1
        assert 0 <= got.memreq <= 2**31 - 1
        assert 0 <= got.coresreq <= 2**31 - 1
        assert got.mem_percentage in (0, 100)


# --- Test_PatchAnnotations -----------------------------------------------------------------------------

TO_ALLOCATE = "hami.io/cambricon-mlu-devices-to-allocate"
ALLOCATED = "hami.io/cambricon-mlu-devices-allocated"
DEVICE_0 = GPUSlice("device-0", 256000, 1, "MLU")


@pytest.mark.parametrize(
    ("devices", "want"),
    [
        pytest.param(
            PodAllocation((ContainerAllocation((DEVICE_0,)),)),
            {
                DSMLU_ASSIGNED: "false",
                DSMLU_PROFILE: "0_1_1000",
                TO_ALLOCATE: "device-0,MLU,256000,1:;",
                ALLOCATED: "device-0,MLU,256000,1:;",
            },
            id="exist device",
        ),
        pytest.param(PodAllocation(), {}, id="no device"),
        pytest.param(
            PodAllocation((ContainerAllocation(), ContainerAllocation((DEVICE_0,)))),
            {
                DSMLU_ASSIGNED: "false",
                DSMLU_PROFILE: "0_1_1000",
                TO_ALLOCATE: ";device-0,MLU,256000,1:;",
                ALLOCATED: ";device-0,MLU,256000,1:;",
            },
            id="leading container without device",
        ),
    ],
)
def test_pod_annotations_write_the_devices_and_the_dsmlu_profile(
    devices: PodAllocation, want: dict[str, str]
) -> None:
    # HAMi pkg/device/cambricon/device_test.go Test_PatchAnnotations (case name = id)
    assert MLU.pod_annotations({}, devices, node="n", now=NOW) == want


def test_dsmlu_profile_takes_the_index_fit_recorded() -> None:
    # (ours) Fit records each device's Index (HAMi's ContainerDevice.Idx) in Picked.custom
    devices = (usage("n-cambricon-mlu-0", index=0), usage("n-cambricon-mlu-1", index=1))
    picked = MLU.fit(devices, DeviceRequest(1, "MLU", 512, 0, 30), context())
    assert isinstance(picked, Picked)
    allocation = PodAllocation((ContainerAllocation(picked.slices),))
    out = MLU.pod_annotations({}, allocation, node="n", now=NOW, custom=[picked.custom])
    assert out[DSMLU_PROFILE] == "1_30_2"
    assert out[TO_ALLOCATE] == "n-cambricon-mlu-1,MLU,512,30:;"
    # without Fit's record, the index comes from the made-up id
    assert MLU.pod_annotations({}, allocation, node="n", now=NOW)[DSMLU_PROFILE] == "1_30_2"
    assert decode_pod_allocation(out[ALLOCATED], ALLOCATED) == allocation


# --- Test_setNodeLock, Test_LockNode, Test_ReleaseNodeLock ---------------------------------------------


@pytest.mark.parametrize(
    "go_case",
    [
        "Test_setNodeLock",
        'Test_LockNode "node is not locked"',
        'Test_LockNode "node is already locked within 2 minutes"',
        'Test_LockNode "lock time expired (more than 2 minutes)"',
        'Test_LockNode "invalid lock time format"',
        'Test_ReleaseNodeLock "no annotation — lock not present"',
        'Test_ReleaseNodeLock "annotation without lock key"',
        'Test_ReleaseNodeLock "lock present — successfully released"',
        'Test_ReleaseNodeLock "stale caller — lock on server but not on caller node"',
        'Test_ReleaseNodeLock "node not found"',
        'Test_ReleaseNodeLock "patch error — retry succeeds"',
        'Test_ReleaseNodeLock "lock already removed during retry"',
        'Test_ReleaseNodeLock "re-get fails during retry"',
    ],
)
def test_the_node_lock_is_cambricons_dsmlu_annotation(go_case: str) -> None:
    # HAMi pkg/device/cambricon/device_test.go <go_case>: the lock itself (fake client, RFC3339 stamp,
    # 2-minute expiry, retries) is the binder's; the backend's part is which lock, here the data.
    assert MLU.names.lock is LockKind.DSMLU
    assert MLU.names.lock_annotation == DSMLU_LOCK == "cambricon.com/dsmlu.lock"
    # setupTest's pod: the lock is taken only when a regular container asks MLUs
    ctr = container(
        limits={FLAG_COUNT: "1", MEM: "2048", CORES: "100"},
        requests={FLAG_COUNT: "1", MEM: "2048", CORES: "100"},
    )
    assert MLU.request(ctr) == DeviceRequest(1, "MLU", 524288, 0, 100)


# --- TestDevices_Fit -----------------------------------------------------------------------------------

FIT_CASES = [
    pytest.param(
        [usage("dev-0", totalmem=128), usage("dev-1", totalmem=128)],
        DeviceRequest(1, "MLU", 64, 0, 50),
        {},
        ["dev-1"],
        "",
        id="fit success",
    ),
    pytest.param(
        [usage("dev-0", totalmem=128)],
        DeviceRequest(1, "MLU", 512, 0, 50),
        {},
        [],
        "1/1 CardInsufficientMemory",
        id="fit fail: memory not enough",
    ),
    pytest.param(
        [usage("dev-0", totalmem=1024, usedcores=100)],
        DeviceRequest(1, "MLU", 512, 0, 50),
        {},
        [],
        "1/1 CardInsufficientCore",
        id="fit fail: core not enough",
    ),
    pytest.param(
        [usage("dev-0", totalmem=128)],
        DeviceRequest(1, "OtherType", 512, 0, 50),
        {},
        [],
        "1/1 CardTypeMismatch",
        id="fit fail: type mismatch",
    ),
    pytest.param(
        [usage("dev-1")],
        DeviceRequest(2, "MLU", 512, 0, 50),
        {"cambricon.com/use-gpuuuid": "dev-0"},
        [],
        "1/1 CardUuidMismatch",
        id="fit fail: user assign use uuid mismatch",
    ),
    pytest.param(
        [usage("dev-0")],
        DeviceRequest(2, "MLU", 512, 0, 50),
        {"cambricon.com/nouse-gpuuuid": "dev-0"},
        [],
        "1/1 CardUuidMismatch",
        id="fit fail: user assign no use uuid match",
    ),
    pytest.param(
        [usage("dev-0", used=100)],
        DeviceRequest(1, "MLU", 512, 0, 50),
        {},
        [],
        "1/1 CardTimeSlicingExhausted",
        id="fit fail: card overused",
    ),
    pytest.param(
        [usage("dev-0")],
        DeviceRequest(1, "MLU", 512, 0, 120),
        {},
        ["dev-0"],
        "",
        id="fit success: but core limit can't exceed 100",
    ),
    pytest.param(
        [usage("dev-0", used=20)],
        DeviceRequest(1, "MLU", 512, 0, 100),
        {},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
        id="fit fail:  card exclusively",
    ),
    pytest.param(
        [usage("dev-0", used=20, usedcores=100)],
        DeviceRequest(1, "MLU", 512, 0, 0),
        {},
        [],
        "1/1 CardComputeUnitsExhausted",
        id="fit fail:  CardComputeUnitsExhausted",
    ),
    pytest.param(
        [usage("dev-0", used=20, usedcores=10)],
        DeviceRequest(2, "MLU", 512, 0, 20),
        {},
        [],
        "1/1 AllocatedCardsInsufficientRequest",
        id="fit fail:  AllocatedCardsInsufficientRequest",
    ),
    pytest.param(
        [usage("dev-0", used=20, usedcores=10)],
        DeviceRequest(1, "MLU", 0, 10, 20),
        {},
        ["dev-0"],
        "",
        id="fit success:  memory percentage",
    ),
    pytest.param(
        [usage("dev-0", used=1, totalmem=128)],
        DeviceRequest(1, "MLU", 64, 0, 50),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
        id="mutex policy rejects used device",
    ),
    pytest.param(
        [usage("dev-0"), usage("dev-1", index=1)],
        DeviceRequest(3, "MLU", 512, 0, 20),
        {},
        [],
        "2/2 AllocatedCardsInsufficientRequest",
        id="fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards",
    ),
    pytest.param(
        [usage("dev-0", totalmem=128, health=False)],
        DeviceRequest(1, "MLU", 64, 0, 50),
        {},
        [],
        "1/1 CardNotHealth",
        id="fit fail: CardNotHealth",
    ),
]


@pytest.mark.parametrize(("devices", "request_", "annotations", "want_ids", "want_reason"), FIT_CASES)
def test_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage],
    request_: DeviceRequest,
    annotations: dict[str, str],
    want_ids: list[str],
    want_reason: str,
) -> None:
    # HAMi pkg/device/cambricon/device_test.go TestDevices_Fit (case name = id)
    result = MLU.fit(devices, request_, context(annotations))
    if want_ids:
        assert isinstance(result, Picked), result
        assert [s.uuid for s in result.slices] == want_ids
        assert all(s.vendor == "MLU" for s in result.slices)
    else:
        assert isinstance(result, Unfit), result
        assert result.message == want_reason


def test_fit_records_memory_the_clamped_cores_and_the_percentage_memory() -> None:
    # TestDevices_Fit "fit success: but core limit can't exceed 100" and "fit success:  memory percentage"
    clamped = MLU.fit([usage("dev-0")], DeviceRequest(1, "MLU", 512, 0, 120), context())
    assert isinstance(clamped, Picked)
    assert clamped.slices == (GPUSlice("dev-0", 512, 100, "MLU"),)
    percent = MLU.fit([usage("dev-0", used=20, usedcores=10)], DeviceRequest(1, "MLU", 0, 10, 20), context())
    assert isinstance(percent, Picked)
    assert percent.slices == (GPUSlice("dev-0", 128, 20, "MLU"),)


# --- TestDevices_Fit_ResourceQuotaWholeCardRequest and the quota rule ----------------------------------


def test_fit_refuses_a_whole_card_request_beyond_the_namespace_quota() -> None:
    # HAMi pkg/device/cambricon/device_test.go TestDevices_Fit_ResourceQuotaWholeCardRequest
    # (limits.cambricon.com/mlu.smlu.vmemory: 50, i.e. 50 x 256 MiB as the entry carries it; the request
    # omits memory)
    ctx = context(quota={MEM: QuotaEntry(used=0, limit=50 * 256)})
    result = MLU.fit([usage("dev-0", totalmem=40960)], DeviceRequest(1, "MLU", 0, 100, 10), ctx)
    assert isinstance(result, Unfit)
    assert result.message == "1/1 ResourceQuotaNotFit"


def test_quota_counts_devices_already_taken_for_the_container_and_the_pod() -> None:
    # (ours) fitQuota's hypothetical usage: earlier containers + this container's picks + the candidate
    devices = [usage("d0", totalmem=8192), usage("d1", index=1, totalmem=8192)]
    request = DeviceRequest(2, "MLU", 1024, 0, 10)
    fits = MLU.fit(devices, request, context(quota={MEM: QuotaEntry(0, 8 * 256)}))  # 2048 MiB
    assert isinstance(fits, Picked)
    tight = MLU.fit(devices, request, context(quota={MEM: QuotaEntry(1, 8 * 256)}))
    assert isinstance(tight, Unfit)
    # the second device would take the pod to 2049 MiB: one found, one refused on quota
    assert tight.message == "1/2 AllocatedCardsInsufficientRequest, 1/2 ResourceQuotaNotFit"
    earlier = {"MLU": PodAllocation((ContainerAllocation((GPUSlice("d0", 1024, 10, "MLU"),)),))}
    one = MLU.fit(devices, DeviceRequest(1, "MLU", 1024, 0, 10), context(quota={MEM: QuotaEntry(0, 8 * 256)}))
    assert isinstance(one, Picked)
    refused = MLU.fit(devices, request, context(quota={MEM: QuotaEntry(0, 8 * 256)}, allocated=earlier))
    assert isinstance(refused, Unfit)
    assert "ResourceQuotaNotFit" in refused.message


def test_quota_on_cores_and_no_quota_without_a_limit() -> None:
    # (ours) FitQuota: cores against limits.<cores resource>; an entry without a limit does not refuse
    request = DeviceRequest(1, "MLU", 64, 0, 60)
    refused = MLU.fit([usage("d")], request, context(quota={CORES: QuotaEntry(used=50, limit=100)}))
    assert isinstance(refused, Unfit)
    assert refused.message == "1/1 ResourceQuotaNotFit"
    assert isinstance(MLU.fit([usage("d")], request, context(quota={CORES: QuotaEntry(used=500)})), Picked)
    assert isinstance(MLU.fit([usage("d")], request, context(quota={})), Picked)


def test_quota_comes_before_memory_in_the_order_of_reasons() -> None:
    # (ours) HAMi checks fitQuota before the device's free memory
    ctx = context(quota={MEM: QuotaEntry(0, 256)})
    result = MLU.fit([usage("d", totalmem=128)], DeviceRequest(1, "MLU", 512, 0, 0), ctx)
    assert isinstance(result, Unfit)
    assert result.message == "1/1 ResourceQuotaNotFit"


def test_quota_fits_compares_with_the_limit_as_the_entry_carries_it() -> None:
    # The entry's memory limit is already x 256 (limits_from_resource_quota multiplies, as FitQuota does)
    table = MLU.names
    assert quota_fits({MEM: QuotaEntry(0, 256)}, table, 256, 0)
    assert not quota_fits({MEM: QuotaEntry(0, 256)}, table, 257, 0)
    assert not quota_fits({MEM: QuotaEntry(0, 0)}, table, 1, 0)  # an explicit 0 blocks everything
    assert quota_fits({MEM: QuotaEntry(10**9, None)}, table, 1, 0)


def test_collapsed_usage_takes_the_init_peak_against_the_regular_sum() -> None:
    # (ours) HAMi CollapseInitContainerUsage, per device uuid
    init = [GPUSlice("a", 300, 30)]
    init2 = [GPUSlice("a", 100, 50), GPUSlice("b", 10, 1)]
    app = [GPUSlice("a", 100, 10)]
    app2 = [GPUSlice("a", 100, 10)]
    assert collapsed_usage([init, init2, app, app2], 2) == (300 + 10, 50 + 1)
    assert collapsed_usage([init, init2, app, app2], 0) == (600 + 10, 100 + 1)


# --- TestDevices_AddResourceUsage ----------------------------------------------------------------------


def test_add_usage_adds_a_slot_memory_and_cores() -> None:
    # HAMi pkg/device/cambricon/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    device = GPUUsage(GPUInfo("dev-0"), used=0, usedmem=2000, usedcores=15)
    got = MLU.add_usage(device, GPUSlice("dev-0", 1024, 50, "MLU"))
    assert (got.used, got.usedmem, got.usedcores) == (1, 3024, 65)


# --- the device config ---------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = build(parse_device_config("", "device-config.yaml"))
    assert isinstance(vendor, Cambricon)
    table = vendor.names
    assert (table.common_word, table.count, table.memory, table.cores, table.memory_factor) == (
        "MLU",
        "cambricon.com/vmlu",
        MEM,
        CORES,
        256,
    )
    assert (table.to_allocate, table.allocated) == (TO_ALLOCATE, ALLOCATED)
    assert (table.use_uuid, table.nouse_uuid) == ("cambricon.com/use-gpuuuid", "cambricon.com/nouse-gpuuuid")
    assert table.handshake == ""
    assert table.register == ""


def test_build_reads_the_file_section() -> None:
    text = "cambricon:\n  resourceCountName: cambricon.com/mlu\n"
    (vendor,) = build(parse_device_config(text, "device-config.yaml"))
    assert vendor.names.count == FLAG_COUNT
    assert vendor.names.memory == MEM


@pytest.mark.parametrize(
    ("text", "key", "line", "reason"),
    [
        (
            "cambricon:\n  resourceCountName: x\n  resourceCoreName: ''\n",
            "cambricon.resourceCoreName",
            3,
            "must name",
        ),
        ("cambricon:\n  resourceMemoryName: [a]\n", "cambricon.resourceMemoryName", 2, "must be a string"),
        (
            "cambricon:\n  resourceCountName: x\n  resourceCountname: y\n",
            "cambricon.resourceCountname",
            3,
            "not a known key",
        ),
    ],
    ids=["empty cores name", "memory name not a string", "misspelt key"],
)
def test_build_refuses_a_bad_value_naming_key_and_line(text: str, key: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(parse_device_config(text, "device-config.yaml"))
    assert info.value.key == key
    assert info.value.line == line
    assert reason in info.value.reason
    assert "device-config.yaml" in str(info.value)
