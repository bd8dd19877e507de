"""hami_control.devices.kunlun: HAMi's Kunlunxin whole-XPU and vXPU backends, transcribed from HAMi
v2.10.0 pkg/device/kunlun/device_test.go and vdevice_test.go (each case cites its Go test), plus the
positional caveat (the selection reads device Index, not list order), build() and property tests."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import decode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices.base import (
    MUTEX_LOCK,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
)
from hami_control.devices.config import load_device_config, parse_device_config
from hami_control.devices.kunlun import (
    BAIDU_NOUSE_UUID,
    BAIDU_USE_UUID,
    DEVICE_SELECTION,
    NOUSE_UUID,
    USE_UUID,
    XPU_MEMORY,
    Kunlun,
    KunlunVXPU,
    build,
    fit_vxpu,
    names,
    trim_memory,
    vxpu_names,
)
from hami_control.usage import GPUUsage
from tests.builders import container, pod

KUNLUN = Kunlun(names())
VXPU = KunlunVXPU(vxpu_names())
NOW = datetime(2026, 3, 1, 12, 0, 0)
AWARE_NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

XPU_COUNT = "kunlunxin.com/xpu"
VCOUNT = "kunlunxin.com/vxpu"
VMEM = "kunlunxin.com/vxpu-memory"


def dev(
    index: int,
    *,
    used: int = 0,
    usedmem: int = 0,
    usedcores: int = 0,
    health: bool = True,
    devmem: int = 0,
    devcore: int = 0,
    count: int = 0,
    type: str = "kunlun",
    id: str | None = None,
) -> GPUUsage:
    """HAMi's DeviceUsage as the Go tests build it (Index, Used, Usedmem, Totalmem, Health, ...)."""
    info = GPUInfo(
        id=id if id is not None else f"xpu-{index}",
        index=index,
        count=count,
        devmem=devmem,
        devcore=devcore,
        type=type,
        health=health,
    )
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def ctx(annotations: Mapping[str, str] | None = None, *, mutex: bool = False) -> FitContext:
    policy = (GPUPolicy.MUTEX,) if mutex else (GPUPolicy.SPREAD,)
    return FitContext(pod=pod(annotations=annotations), policy=policy)


def whole_request(nums: int) -> DeviceRequest:
    return DeviceRequest(nums, "kunlun", 0, 100, 0)


def vxpu_request(nums: int, memreq: int) -> DeviceRequest:
    return DeviceRequest(nums, "XPU", memreq, 0, memreq * 100 // XPU_MEMORY)


def picked_indexes(result: Picked | Unfit) -> list[int]:
    assert isinstance(result, Picked), result
    return [int(c["index"]) for c in result.custom]


def unfit(result: Picked | Unfit) -> str:
    assert isinstance(result, Unfit), result
    return result.message


def free_by_mask(used: Sequence[int], *, health: bool = True) -> list[GPUUsage]:
    return [dev(i, used=1 if i in used else 0, health=health) for i in range(8)]


# --- device_test.go: Test_graphSelect (graghSelect with FitXPU) through Kunlun.fit -----------------------

GRAPH_SELECT: list[tuple[str, list[int], int, list[int]]] = [
    # (Go sub-case name, used indexes, Nums, want1)
    ("full allocate", [], 8, [0, 1, 2, 3, 4, 5, 6, 7]),
    ("full allocate not success", [5], 8, []),
    ("allocate 2 cards", [5], 2, [4, 6]),
    ("allocate 1 card (5 used)", [5], 1, [4]),
    ("allocate 1 card (6,7 used)", [6, 7], 1, [4]),
    ("allocate 2 card according to interconnect", [0, 1, 2, 4, 5, 6], 2, [3, 7]),
    ("allocate 4 cards according to interconnect when have 5 cards", [2, 3, 7], 4, [0, 1, 4, 5]),
    (
        "allocate 4 cards according to interconnect when have 6 cards, leave 2 cards unconnected",
        [3, 6],
        4,
        [0, 1, 4, 5],
    ),
    (
        "allocate 4 cards according to interconnect when have 6 cards, leave 2 cards connected",
        [2, 6],
        4,
        [0, 1, 4, 5],
    ),
]


@pytest.mark.parametrize(
    ("used", "nums", "want"),
    [c[1:] for c in GRAPH_SELECT],
    ids=[f"Test_graphSelect/{c[0]}" for c in GRAPH_SELECT],
)
def test_whole_xpu_fit_selects_hami_graph_select_positions(
    used: list[int], nums: int, want: list[int]
) -> None:
    # HAMi pkg/device/kunlun/device_test.go Test_graphSelect (graghSelect(d, c, FitXPU))
    result = KUNLUN.fit(free_by_mask(used), whole_request(nums), ctx())
    if want:
        assert picked_indexes(result) == want
        assert isinstance(result, Picked)
        assert [s.uuid for s in result.slices] == [f"xpu-{i}" for i in want]
    else:
        assert unfit(result) == "1/8 NumaNotFit"


@pytest.mark.parametrize("order", ["reversed", "shuffled", "used-first"])
@pytest.mark.parametrize(
    ("used", "nums", "want"),
    [c[1:] for c in GRAPH_SELECT],
    ids=[f"Test_graphSelect/{c[0]}" for c in GRAPH_SELECT],
)
def test_whole_xpu_fit_reads_positions_by_index_not_list_order(
    used: list[int], nums: int, want: list[int], order: str
) -> None:
    # The scheduler sorts devices by score before Fit; the wings are the devices' Indexes all the same.
    devices = free_by_mask(used)
    if order == "reversed":
        devices.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(devices)
    else:
        devices.sort(key=lambda d: -d.used)
    result = KUNLUN.fit(devices, whole_request(nums), ctx())
    if want:
        assert picked_indexes(result) == want
    else:
        assert unfit(result) == "1/8 NumaNotFit"


def test_whole_xpu_fit_records_the_whole_device_memory_and_cores() -> None:
    # HAMi device.go Fit: ContainerDevice{Usedmem: Totalmem, Usedcores: Totalcore, Type: request.Type}
    devices = [dev(i, devmem=98304, devcore=100, count=100) for i in range(8)]
    result = KUNLUN.fit(devices, whole_request(1), ctx())
    assert isinstance(result, Picked)
    assert result.slices == (GPUSlice("xpu-0", 98304, 100, "kunlun"),)


def test_whole_xpu_fit_skips_unhealthy_devices() -> None:
    # HAMi device.go FitXPU: Used == 0 && Health; the left wing (3 free) is the tighter one for 1 device
    devices = [dev(i, health=i != 0) for i in range(8)]
    assert picked_indexes(KUNLUN.fit(devices, whole_request(1), ctx())) == [1]


@pytest.mark.parametrize("nums", [3, 5, 6, 7, 9])
def test_whole_xpu_fit_refuses_counts_the_topology_has_no_shape_for(nums: int) -> None:
    # HAMi topo.go graghSelect: only 1, 2, 4 and 8 have a branch
    assert unfit(KUNLUN.fit(free_by_mask([]), whole_request(nums), ctx())) == "1/8 NumaNotFit"


# --- device_test.go: Test_graphSelectVXPU (graghSelect with FitVXPU) through KunlunVXPU.fit --------------

_T = 98304
GRAPH_SELECT_VXPU: list[tuple[str, list[tuple[int, int]], int, list[int]]] = [
    # (Go sub-case name, (Used, Usedmem) per index 0-7, Nums, want1); Memreq 24576, Totalmem 98304
    ("full allocate with unused devices", [(0, 0)] * 8, 8, [0, 1, 2, 3, 4, 5, 6, 7]),
    (
        "allocate with matching memory requirements",
        [(0, 0), (1, 24576), (0, 0), (2, 49152), (0, 0), (1, 49152), (0, 0), (0, 0)],
        4,
        [0, 1, 2, 3],
    ),
    (
        "allocate with mixed memory requirements",
        [(0, 0), (2, 49152), (0, 0), (1, 49152), (0, 0), (1, 24576), (0, 0), (0, 0)],
        4,
        [4, 5, 6, 7],
    ),
    ("no suitable devices due to memory mismatch", [(1, 49152)] * 8, 2, []),
    (
        "allocate 1 card with matching memory",
        [(1, 24576), (1, 24576), (1, 49152), (0, 0), (0, 0), (1, 24576), (0, 0), (0, 0)],
        1,
        [0],
    ),
    (
        "allocate 2 cards with different memory requirements",
        [(0, 0), (2, 49152), (1, 24576), (1, 49152), (0, 0), (0, 0), (1, 24576), (0, 0)],
        2,
        [0, 1],
    ),
]


@pytest.mark.parametrize(
    ("usage", "nums", "want"),
    [c[1:] for c in GRAPH_SELECT_VXPU],
    ids=[f"Test_graphSelectVXPU/{c[0]}" for c in GRAPH_SELECT_VXPU],
)
def test_vxpu_fit_selects_hami_graph_select_positions(
    usage: list[tuple[int, int]], nums: int, want: list[int]
) -> None:
    # HAMi pkg/device/kunlun/device_test.go Test_graphSelectVXPU (graghSelect(d, c, FitVXPU))
    devices = [dev(i, used=u, usedmem=m, devmem=_T, type="XPU") for i, (u, m) in enumerate(usage)]
    result = VXPU.fit(devices, vxpu_request(nums, 24576), ctx())
    if want:
        assert picked_indexes(result) == want
        random.Random(3).shuffle(devices)
        assert picked_indexes(VXPU.fit(devices, vxpu_request(nums, 24576), ctx())) == want
    else:
        assert unfit(result) == "1/8 NumaNotFit"


def test_vxpu_fit_records_the_request_memory_and_cores() -> None:
    # HAMi vdevice.go Fit: ContainerDevice{Usedmem: request.Memreq, Usedcores: request.Coresreq}
    devices = [dev(i, devmem=_T, type="XPU") for i in range(8)]
    result = VXPU.fit(devices, vxpu_request(1, 49152), ctx())
    assert isinstance(result, Picked)
    assert result.slices == (GPUSlice("xpu-0", 49152, 50, "XPU"),)


# --- device_test.go: the Fit reasons -----------------------------------------------------------------------


def test_vxpu_fit_shares_a_used_device_by_default_but_not_under_mutex() -> None:
    # HAMi device_test.go TestKunlunVDevices_Fit_Mutex
    devices = [dev(i, used=1, usedmem=24576, devmem=_T, type="XPU") for i in range(8)]
    req = DeviceRequest(1, "", 24576)
    assert isinstance(VXPU.fit(devices, req, ctx()), Picked)
    mutex = ctx({"hami.io/gpu-scheduler-policy": "mutex"}, mutex=True)
    assert unfit(VXPU.fit(devices, req, mutex)) == "8/8 ExclusiveDeviceAllocateConflict"


def test_vxpu_fit_under_mutex_takes_an_idle_device() -> None:
    # HAMi vdevice.go Fit: mutex keeps d.Used == 0 && FitVXPU
    devices = [dev(i, used=0 if i == 6 else 1, usedmem=0 if i == 6 else 24576, devmem=_T) for i in range(8)]
    assert picked_indexes(VXPU.fit(devices, vxpu_request(1, 24576), ctx(mutex=True))) == [6]


def test_vxpu_fit_reports_numa_not_fit_once_when_no_device_has_the_memory() -> None:
    # HAMi device_test.go TestKunlunVDevices_Fit_NumaNotFit
    devices = [dev(i, devmem=1024, health=False) for i in range(8)]
    assert unfit(VXPU.fit(devices, DeviceRequest(1, "", 2048), ctx())) == "1/8 NumaNotFit"


def test_whole_xpu_fit_reports_numa_not_fit_once_when_every_device_is_used() -> None:
    # HAMi device_test.go TestKunlunDevices_Fit_NumaNotFit
    devices = [dev(i, used=1, health=False) for i in range(8)]
    assert unfit(KUNLUN.fit(devices, whole_request(1), ctx())) == "1/8 NumaNotFit"


def _uuid_devices(count: int) -> list[GPUUsage]:
    return [dev(i, count=count, devmem=XPU_MEMORY, devcore=100, id=f"xpu-{i}") for i in range(8)]


ALL = ",".join(f"xpu-{i}" for i in range(8))


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param(
            {BAIDU_USE_UUID: "xpu-5"}, "xpu-5", id="TestKunlunDevices_Fit_UseUUID/legacy annotation"
        ),
        pytest.param(
            {USE_UUID: "xpu-3"}, "xpu-3", id="TestKunlunDevices_Fit_UseUUID/new standard annotation"
        ),
        pytest.param(
            {"hami.io/use-xpu-uuid": "xpu-6"}, "xpu-6", id="TestKunlunDevices_Fit_UseUUID/the literal key"
        ),
    ],
)
def test_whole_xpu_fit_takes_the_device_the_use_uuid_annotation_names(
    annotations: dict[str, str], want: str
) -> None:
    # HAMi device_test.go TestKunlunDevices_Fit_UseUUID
    result = KUNLUN.fit(_uuid_devices(1), whole_request(1), ctx(annotations))
    assert isinstance(result, Picked)
    assert [s.uuid for s in result.slices] == [want]


def test_whole_xpu_fit_does_not_fall_back_when_the_named_device_is_absent() -> None:
    # HAMi device_test.go TestKunlunDevices_Fit_UseUUID "asking for a card that is not on the node"
    result = KUNLUN.fit(_uuid_devices(1), whole_request(1), ctx({USE_UUID: "xpu-99"}))
    assert unfit(result) == "8/8 CardUuidMismatch"


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(BAIDU_NOUSE_UUID, id="TestKunlunDevices_Fit_NoUseUUID/legacy annotation"),
        pytest.param(NOUSE_UUID, id="TestKunlunDevices_Fit_NoUseUUID/new standard annotation"),
    ],
)
def test_whole_xpu_fit_refuses_when_nouse_uuid_excludes_every_device(key: str) -> None:
    # HAMi device_test.go TestKunlunDevices_Fit_NoUseUUID
    assert unfit(KUNLUN.fit(_uuid_devices(1), whole_request(1), ctx({key: ALL}))) == "8/8 CardUuidMismatch"


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({USE_UUID: "xpu-3"}, "xpu-3", id="TestKunlunVDevices_Fit_UUIDAnnotations/standard hami"),
        pytest.param(
            {BAIDU_USE_UUID: "xpu-2"}, "xpu-2", id="TestKunlunVDevices_Fit_UUIDAnnotations/legacy baidu"
        ),
        pytest.param(
            {NOUSE_UUID: ALL}, None, id="TestKunlunVDevices_Fit_UUIDAnnotations/standard hami nouse"
        ),
        pytest.param(
            {BAIDU_NOUSE_UUID: ALL}, None, id="TestKunlunVDevices_Fit_UUIDAnnotations/legacy baidu nouse"
        ),
    ],
)
def test_vxpu_fit_follows_both_uuid_annotation_pairs(annotations: dict[str, str], want: str | None) -> None:
    # HAMi device_test.go TestKunlunVDevices_Fit_UUIDAnnotations
    result = VXPU.fit(_uuid_devices(10), DeviceRequest(1, "XPU", XPU_MEMORY), ctx(annotations))
    if want is None:
        assert "CardUuidMismatch" in unfit(result)
        assert unfit(result) == "8/8 CardUuidMismatch"
    else:
        assert isinstance(result, Picked)
        assert result.slices[0].uuid == want


def test_vxpu_fit_under_mutex_reports_the_conflict_before_a_uuid_mismatch() -> None:
    # HAMi vdevice.go Fit: ExclusiveDeviceAllocateConflict, then CardUuidMismatch only when no reason yet
    devices = [dev(i, used=1, usedmem=24576, devmem=_T) for i in range(8)]
    result = VXPU.fit(devices, vxpu_request(1, 24576), ctx({USE_UUID: "xpu-1"}, mutex=True))
    assert unfit(result) == "8/8 ExclusiveDeviceAllocateConflict"


# --- device_test.go: Test_ScoreNode -------------------------------------------------------------------


def _pod_allocation(*containers: Sequence[int], vendor: str = "kunlun") -> PodAllocation:
    return PodAllocation(
        tuple(
            ContainerAllocation(tuple(GPUSlice(f"n1-kunlun-{i}", 0, 0, vendor) for i in c))
            for c in containers
        )
    )


def test_score_node_rewards_filling_the_node_scenario_1() -> None:
    # HAMi device_test.go Test_ScoreNode "Scenario 1": prev 0-3 used, pod takes 0-7, binpack -> 3000
    previous = [dev(i, used=1, id=f"n1-kunlun-{i}") for i in range(4)]
    score = KUNLUN.score_node({}, _pod_allocation(range(8)), previous, "binpack")
    assert score == 3000.0


def test_score_node_scores_a_single_device_on_an_empty_node_zero_scenario_2() -> None:
    # HAMi device_test.go Test_ScoreNode "Scenario 2": no previous usage, pod takes 0, spread -> 0
    assert KUNLUN.score_node({}, _pod_allocation([0]), [], "spread") == 0.0


def test_score_node_is_zero_on_a_node_with_other_device_types() -> None:
    # HAMi device.go ScoreNode: a previous device whose Type lacks "kunlun" gives 0
    previous = [dev(0, used=1, id="n1-kunlun-0"), dev(1, type="XPU", id="x")]
    assert KUNLUN.score_node({}, _pod_allocation([1]), previous, "binpack") == 0.0
    assert KUNLUN.score_node({}, _pod_allocation([1], vendor="XPU"), previous[:1], "binpack") == 0.0


def test_score_node_reads_the_pod_device_indexes_from_the_node_devices() -> None:
    # prev [0] (bubble 3), pod [1] -> current [1] (bubble 3): unchanged -> 2000
    previous = [dev(i, used=1 if i == 0 else 0, id=f"gpu-{i}") for i in range(8)]
    allocation = PodAllocation((ContainerAllocation((GPUSlice("gpu-5", 0, 0, "kunlun"),)),))
    assert KUNLUN.score_node({}, allocation, previous, "binpack") == 2000.0


# --- device.go: the whole-XPU node, request, usage and annotations (no Go test of their own) -----------


def _node(capacity: Any, name: str = "n1") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": {XPU_COUNT: capacity}}}


def test_whole_xpu_inventory_is_synthesized_from_capacity_with_numa_halves() -> None:
    # HAMi device.go GetNodeDevices
    devices = KUNLUN.node_devices(_node("8"))
    assert devices is not None
    assert [d.id for d in devices] == [f"n1-kunlun-{i}" for i in range(8)]
    assert [d.numa for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {(d.count, d.devmem, d.devcore, d.type, d.health) for d in devices} == {
        (100, 98304, 100, "kunlun", True)
    }
    assert [d.index for d in devices] == list(range(8))
    odd = KUNLUN.node_devices(_node("3"))
    assert odd is not None
    assert [d.numa for d in odd] == [0, 1, 1]


@pytest.mark.parametrize("capacity", [None, "0", "-2"])
def test_whole_xpu_inventory_is_none_without_a_positive_capacity(capacity: Any) -> None:
    # HAMi device.go GetNodeDevices: "device not found" when the count is absent or 0
    node = {"metadata": {"name": "n1"}, "status": {"capacity": {}}} if capacity is None else _node(capacity)
    assert KUNLUN.node_devices(node) is None


@pytest.mark.parametrize("capacity", ["1.5", "lots", "1e30", ["8"]])
def test_whole_xpu_inventory_refuses_a_capacity_that_is_not_a_device_count(capacity: Any) -> None:
    with pytest.raises(WireFormatError, match=r"status\.capacity\[kunlunxin\.com/xpu\]"):
        KUNLUN.node_devices(_node(capacity))


def test_whole_xpu_health_is_always_good_and_needs_no_handshake() -> None:
    # HAMi device.go CheckHealth (true, true); LockNode/ReleaseNodeLock/NodeCleanUp do nothing
    assert KUNLUN.node_health(_node("8"), NOW) == NodeHealth(True, True)
    assert KUNLUN.names.lock is LockKind.NONE
    assert KUNLUN.names.lock_annotation == ""
    assert KUNLUN.names.handshake == ""


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        (container(limits={XPU_COUNT: "2"}), DeviceRequest(2, "kunlun", 0, 100, 0)),
        (container(requests={XPU_COUNT: "1"}), DeviceRequest(1, "kunlun", 0, 100, 0)),
        (container(limits={XPU_COUNT: "0"}), None),
        (container(limits={XPU_COUNT: "1.5"}), None),
        (container(limits={"nvidia.com/gpu": "1"}), None),
    ],
)
def test_whole_xpu_request_asks_whole_devices(ctr: dict[str, Any], want: DeviceRequest | None) -> None:
    # HAMi device.go GenerateResourceRequests: Nums n, Memreq 0, MemPercentagereq 100, Coresreq 0
    assert KUNLUN.request(ctr) == want


def test_whole_xpu_webhook_finds_only_containers_with_the_count_limit() -> None:
    # HAMi device.go MutateAdmission: the limit only, nothing mutated
    ctr = container(requests={XPU_COUNT: "1"})
    assert not KUNLUN.mutate(ctr, pod()).found
    ctr = container(limits={XPU_COUNT: "1"})
    assert KUNLUN.mutate(ctr, pod()).found
    assert ctr == container(limits={XPU_COUNT: "1"})


def test_whole_xpu_usage_counts_the_slot_only() -> None:
    # HAMi device.go AddResourceUsage: n.Used++
    device = dev(0, devmem=98304, devcore=100)
    after = KUNLUN.add_usage(device, GPUSlice("xpu-0", 98304, 100, "kunlun"))
    assert (after.used, after.usedmem, after.usedcores) == (1, 0, 0)


def test_whole_xpu_annotations_carry_the_allocation_and_the_device_indexes_of_the_last_container() -> None:
    # HAMi device.go PatchAnnotations: hami.io/kunlun-allocated and BAIDU_COM_DEVICE_IDX
    devices = _pod_allocation([0, 1], [], [4, 5, 6, 7])
    out = KUNLUN.pod_annotations(pod(), devices, node="n1", now=AWARE_NOW)
    assert out == {
        "hami.io/kunlun-allocated": "n1-kunlun-0,kunlun,0,0:n1-kunlun-1,kunlun,0,0:;;"
        "n1-kunlun-4,kunlun,0,0:n1-kunlun-5,kunlun,0,0:n1-kunlun-6,kunlun,0,0:n1-kunlun-7,kunlun,0,0:;",
        DEVICE_SELECTION: "4,5,6,7",
    }
    assert decode_pod_allocation(out["hami.io/kunlun-allocated"]) == devices


def test_whole_xpu_annotations_take_the_indexes_from_fit() -> None:
    devices = [dev(i, devmem=98304, devcore=100, id=f"card-{i}") for i in range(8)]
    result = KUNLUN.fit(devices, whole_request(2), ctx())
    assert isinstance(result, Picked)
    allocation = PodAllocation((ContainerAllocation(result.slices),))
    out = KUNLUN.pod_annotations(pod(), allocation, node="n1", now=AWARE_NOW, custom=[result.custom])
    assert out[DEVICE_SELECTION] == "0,1"
    assert out["hami.io/kunlun-allocated"] == "card-0,kunlun,98304,100:card-1,kunlun,98304,100:;"


def test_whole_xpu_annotations_are_empty_without_devices() -> None:
    assert (
        KUNLUN.pod_annotations(
            pod(),
            PodAllocation((ContainerAllocation(),)),
            node="n1",
            now=AWARE_NOW,
        )
        == {}
    )


# --- vdevice_test.go -----------------------------------------------------------------------------------


def test_vxpu_names_are_hamis() -> None:
    # HAMi vdevice_test.go Test_InitKunlunVDevice, Test_CommonWord, Test_KunlunVDevices_GetResourceNames
    n = VXPU.names
    assert (n.common_word, n.count, n.memory, n.cores) == ("XPU", VCOUNT, VMEM, "")
    assert n.to_allocate == "hami.io/xpu-devices-to-allocate"
    assert n.allocated == "hami.io/xpu-devices-allocated"
    assert n.handshake == "hami.io/node-handshake-xpu"
    assert (n.register, n.inventory, n.health) == (
        "hami.io/node-register-xpu",
        Inventory.JSON,
        HealthRule.HANDSHAKE,
    )
    # "Calling again must not panic and must not clobber": building twice gives the same names
    assert build(load_device_config(None, lambda _: ""))[1].names == n


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param(0, 24576, id="Test_trimMemory/zero"),
        pytest.param(24576, 24576, id="Test_trimMemory/at first threshold"),
        pytest.param(24577, 49152, id="Test_trimMemory/just above first threshold"),
        pytest.param(49152, 49152, id="Test_trimMemory/at second threshold"),
        pytest.param(49153, XPU_MEMORY, id="Test_trimMemory/just above second threshold"),
        pytest.param(200000, XPU_MEMORY, id="Test_trimMemory/far above"),
    ],
)
def test_trim_memory_rounds_up_to_a_vxpu_size(value: int, want: int) -> None:
    # HAMi vdevice_test.go Test_trimMemory
    assert trim_memory(value) == want


@pytest.mark.parametrize(
    ("ctr", "found", "memory"),
    [
        pytest.param(container(resources={}), False, None, id="Test_MutateAdmission/no vcount limit"),
        pytest.param(
            container(limits={VCOUNT: "1"}), True, None, id="Test_MutateAdmission/vcount without vmemory"
        ),
        pytest.param(
            container(limits={VCOUNT: "1", VMEM: "30000"}, requests={}),
            True,
            "49152",
            id="Test_MutateAdmission/vcount with vmemory gets trimmed",
        ),
        pytest.param(
            container(limits={VCOUNT: "1", VMEM: "30000"}),
            True,
            "49152",
            id="Test_MutateAdmission/vcount with vmemory and nil requests does not panic",
        ),
    ],
)
def test_vxpu_webhook_trims_the_memory_limit_and_copies_it_to_requests(
    ctr: dict[str, Any], found: bool, memory: str | None
) -> None:
    # HAMi vdevice_test.go Test_MutateAdmission
    before = {k: dict(v) for k, v in ctr["resources"].items()}
    admission = VXPU.mutate(ctr, pod())
    assert admission.found is found
    assert admission.error == ""
    if memory is None:
        assert ctr["resources"] == before
    else:
        assert ctr["resources"]["limits"][VMEM] == memory
        assert ctr["resources"]["requests"][VMEM] == memory


def test_vxpu_webhook_overwrites_an_existing_memory_request() -> None:
    ctr = container(limits={VCOUNT: "1", VMEM: "100"}, requests={VMEM: "99999", "cpu": "1"})
    assert VXPU.mutate(ctr, pod()).found
    assert ctr["resources"] == {
        "limits": {VCOUNT: "1", VMEM: "24576"},
        "requests": {VMEM: "24576", "cpu": "1"},
    }


def test_vxpu_handshake_unknown_registers_and_asks_again() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_CheckHealth "unknown handshake state patches node"
    node = {"metadata": {"name": "n", "annotations": {"hami.io/node-handshake-xpu": "Unknown"}}}
    assert VXPU.node_health(node, NOW) == NodeHealth(True, True, "Requesting_2026-03-01 12:00:00")


def test_vxpu_handshake_requesting_recently_is_still_online() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_CheckHealth "requesting state recently set is still online"
    node = {
        "metadata": {
            "name": "n",
            "annotations": {"hami.io/node-handshake-xpu": "Requesting_2026-03-01 11:59:50"},
        }
    }
    assert VXPU.node_health(node, NOW) == NodeHealth(True, False)


def test_vxpu_node_cleanup_deletes_the_handshake_annotation() -> None:
    # HAMi vdevice_test.go Test_NodeCleanUp: the caller deletes names.handshake (fake client in Go)
    assert VXPU.names.handshake == "hami.io/node-handshake-xpu"


def test_vxpu_inventory_without_the_annotation_is_none() -> None:
    # HAMi vdevice_test.go Test_GetNodeDevices "annotation missing"
    assert VXPU.node_devices({"metadata": {"name": "n"}}) is None


def test_vxpu_inventory_that_is_not_json_is_a_wire_format_error() -> None:
    # HAMi vdevice_test.go Test_GetNodeDevices "invalid json"
    with pytest.raises(WireFormatError, match=r"hami\.io/node-register-xpu"):
        VXPU.node_devices({"metadata": {"annotations": {"hami.io/node-register-xpu": "not-json"}}})


def test_vxpu_inventory_empty_list_has_no_devices() -> None:
    # HAMi vdevice_test.go Test_GetNodeDevices "empty device list" (HAMi: error "no device found on node")
    assert VXPU.node_devices({"metadata": {"annotations": {"hami.io/node-register-xpu": "[]"}}}) == ()


def test_vxpu_inventory_decodes_the_devices() -> None:
    # HAMi vdevice_test.go Test_GetNodeDevices "valid devices get vendor tagged"
    text = '[{"id":"xpu-0","index":0,"count":1,"devmem":98304,"devcore":100,"type":"XPU","health":true}]'
    devices = VXPU.node_devices({"metadata": {"annotations": {"hami.io/node-register-xpu": text}}})
    assert devices == (
        GPUInfo(id="xpu-0", index=0, count=1, devmem=98304, devcore=100, type="XPU", health=True),
    )


def test_vxpu_annotations_write_both_keys() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_PatchAnnotations "with devices"
    devices = PodAllocation((ContainerAllocation((GPUSlice("xpu-0", 24576, 100, "XPU"),)),))
    out = VXPU.pod_annotations(pod(), devices, node="n1", now=AWARE_NOW)
    assert out == {
        "hami.io/xpu-devices-to-allocate": "xpu-0,XPU,24576,100:;",
        "hami.io/xpu-devices-allocated": "xpu-0,XPU,24576,100:;",
    }


def test_vxpu_annotations_are_empty_without_devices() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_PatchAnnotations "no devices for this type"
    assert VXPU.pod_annotations(pod(), PodAllocation(), node="n1", now=AWARE_NOW) == {}


VCOUNT_POD = {"spec": {"containers": [container(limits={VCOUNT: "1"})]}}


@pytest.mark.parametrize(
    ("spec", "locks"),
    [
        pytest.param({}, False, id="Test_KunlunVDevices_LockNode/no containers requesting xpu"),
        pytest.param(VCOUNT_POD["spec"], True, id="Test_KunlunVDevices_LockNode/container requesting xpu"),
        pytest.param(
            {}, False, id="Test_KunlunVDevices_ReleaseNodeLock/no containers requesting xpu leaves lock"
        ),
        pytest.param(
            VCOUNT_POD["spec"],
            True,
            id="Test_KunlunVDevices_ReleaseNodeLock/container requesting xpu releases",
        ),
    ],
)
def test_vxpu_lock_is_hamis_mutex_taken_only_for_a_container_asking_vxpu(
    spec: dict[str, Any], locks: bool
) -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_LockNode / _ReleaseNodeLock: the binder takes (releases)
    # names.lock_annotation when a regular container's request is not None (fake client in Go).
    assert VXPU.names.lock is LockKind.MUTEX
    assert VXPU.names.lock_annotation == MUTEX_LOCK == "hami.io/mutex.lock"
    asks = any(VXPU.request(c) is not None for c in spec.get("containers", []))
    assert asks is locks


@pytest.mark.parametrize(
    ("type_", "allowed"),
    [
        pytest.param("XPU", True, id="Test_KunlunVDevices_CheckType/matching type"),
        pytest.param("other", False, id="Test_KunlunVDevices_CheckType/different type"),
    ],
)
def test_vxpu_type_check_wants_the_common_word_exactly(type_: str, allowed: bool) -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_CheckType
    assert VXPU.type_allowed({}, dev(0), DeviceRequest(1, type_)) is allowed


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(
            container(), None, id="Test_KunlunVDevices_GenerateResourceRequests/no vcount requested"
        ),
        pytest.param(
            container(limits={VCOUNT: "1"}),
            DeviceRequest(1, "XPU", XPU_MEMORY, 100, 100),
            id="Test_KunlunVDevices_GenerateResourceRequests/vcount without memory defaults to full device",
        ),
        pytest.param(
            container(requests={VCOUNT: "2", VMEM: "24576"}),
            DeviceRequest(2, "XPU", 24576, 0, 25),
            id="Test_KunlunVDevices_GenerateResourceRequests/vcount with memory from requests fallback",
        ),
        pytest.param(
            container(limits={VCOUNT: "1", VMEM: "30000"}),
            DeviceRequest(1, "XPU", 49152, 0, 50),
            id="trimmed",
        ),
        pytest.param(
            container(limits={VCOUNT: "1", VMEM: "1.5"}),
            DeviceRequest(1, "XPU", XPU_MEMORY, 100, 100),
            id="frac",
        ),
    ],
)
def test_vxpu_request_is_a_vxpu_size_with_proportional_cores(
    ctr: dict[str, Any], want: DeviceRequest | None
) -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_GenerateResourceRequests
    assert VXPU.request(ctr) == want


def test_vxpu_score_node_is_zero() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_ScoreNode
    assert VXPU.score_node({}, PodAllocation(), [], "binpack") == 0.0


def test_vxpu_usage_adds_the_slot_memory_and_cores() -> None:
    # HAMi vdevice_test.go Test_KunlunVDevices_AddResourceUsage
    after = VXPU.add_usage(dev(0, used=1, usedcores=10, usedmem=1000), GPUSlice("xpu-0", 2000, 20, "XPU"))
    assert (after.used, after.usedcores, after.usedmem) == (2, 30, 3000)


@pytest.mark.parametrize(
    ("device", "memreq", "want"),
    [
        pytest.param(
            dev(0, usedmem=90000, devmem=_T, health=False), 20000, False, id="would exceed total memory"
        ),
        pytest.param(dev(0, devmem=_T), 24576, True, id="idle device always fits"),
        pytest.param(
            dev(0, used=2, usedmem=49152, devmem=_T), 24576, True, id="shared with matching average"
        ),
        pytest.param(
            dev(0, used=1, usedmem=49152, devmem=_T, health=False),
            24576,
            False,
            id="shared with mismatched average",
        ),
        pytest.param(dev(0, devmem=_T, health=False), 24576, False, id="unhealthy device is rejected"),
        pytest.param(
            dev(0, used=1, usedmem=49152, devmem=_T), 24576, False, id="healthy, mismatched average"
        ),
        pytest.param(dev(0, usedmem=90000, devmem=_T), 20000, False, id="healthy, would exceed total memory"),
    ],
)
def test_fit_vxpu_checks_health_memory_and_the_shared_size(device: GPUUsage, memreq: int, want: bool) -> None:
    # HAMi vdevice_test.go Test_FitVXPU_direct (the first five ids; the last two with Health true)
    assert fit_vxpu(device, DeviceRequest(1, "XPU", memreq)) is want


# --- build() ---------------------------------------------------------------------------------------------


def test_build_with_the_chart_defaults_gives_whole_xpu_then_vxpu() -> None:
    whole, vxpu = build(load_device_config(None, lambda _: ""))
    assert isinstance(whole, Kunlun)
    assert isinstance(vxpu, KunlunVXPU)
    assert whole.names == names()
    assert (whole.names.common_word, whole.names.count, whole.names.allocated) == (
        "kunlun",
        XPU_COUNT,
        "hami.io/kunlun-allocated",
    )
    assert (whole.names.to_allocate, whole.names.register, whole.names.health) == ("", "", HealthRule.ALWAYS)
    assert vxpu.names == vxpu_names()


def test_build_reads_the_resource_names_and_keeps_defaults_for_missing_keys() -> None:
    config = parse_device_config("kunlun:\n  resourceCountName: example.com/xpu\n", "dc.yaml")
    whole, vxpu = build(config)
    assert whole.names.count == "example.com/xpu"
    assert (vxpu.names.count, vxpu.names.memory) == (VCOUNT, VMEM)


def test_build_refuses_a_bad_value_naming_key_and_line() -> None:
    text = "kunlun:\n  resourceCountName: kunlunxin.com/xpu\n  resourceVCountName: [a, b]\n"
    with pytest.raises(ConfigError) as err:
        build(parse_device_config(text, "dc.yaml"))
    assert err.value.key == "kunlun.resourceVCountName"
    assert err.value.line == 3
    assert "must be a string" in str(err.value)


def test_build_refuses_an_unknown_key_with_a_suggestion() -> None:
    text = "kunlun:\n  resourceVMemoryNam: x\n"
    with pytest.raises(ConfigError) as err:
        build(parse_device_config(text, "dc.yaml"))
    assert err.value.key == "kunlun.resourceVMemoryNam"
    assert err.value.line == 2
    assert "resourceVMemoryName" in str(err.value)


# --- properties ----------------------------------------------------------------------------------------

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
QUANTITY = st.one_of(
    INT64.map(str), INT64, st.text(max_size=12), st.sampled_from(["1e30", "1.5", "2Ki", "-0"])
)


@settings(max_examples=300, deadline=None)
@given(count=QUANTITY, memory=st.one_of(st.none(), QUANTITY), in_limits=st.booleans())
def test_requests_are_never_negative_for_any_quantity(count: Any, memory: Any, in_limits: bool) -> None:
    values = {XPU_COUNT: count, VCOUNT: count} | ({VMEM: memory} if memory is not None else {})
    ctr = container(limits=values) if in_limits else container(requests=values)
    for vendor in (KUNLUN, VXPU):
        req = vendor.request(ctr)
        if req is not None:
            assert 0 < req.nums <= 2**31 - 1
            assert req.memreq >= 0
            assert req.coresreq >= 0
    vreq = VXPU.request(ctr)
    assert vreq is None or (vreq.memreq, vreq.coresreq) in ((24576, 25), (49152, 50), (XPU_MEMORY, 100))


@settings(max_examples=300, deadline=None)
@given(memory=st.one_of(QUANTITY, st.floats(allow_nan=False, allow_infinity=False)))
def test_vxpu_webhook_never_crashes_and_leaves_a_vxpu_size_or_the_unreadable_value(memory: Any) -> None:
    ctr = container(limits={VCOUNT: "1", VMEM: memory})
    assert VXPU.mutate(ctr, pod()).found
    after = ctr["resources"]["limits"][VMEM]
    if after in ("24576", "49152", "98304"):
        assert ctr["resources"]["requests"][VMEM] == after
    else:
        assert after == memory
        assert "requests" not in ctr["resources"]


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(st.text(max_size=40), st.sampled_from(['[{"id":"a"}]', "[{}]", '[{"id":1}]', "{}", "[1]"]))
)
def test_vxpu_inventory_decodes_or_raises_a_wire_format_error(text: str) -> None:
    node = {"metadata": {"annotations": {"hami.io/node-register-xpu": text}}}
    try:
        devices = VXPU.node_devices(node)
    except WireFormatError:
        return
    assert devices is not None
    assert all(isinstance(d, GPUInfo) for d in devices)


@settings(max_examples=300, deadline=None)
@given(capacity=st.one_of(QUANTITY, st.floats(), st.none(), st.lists(st.integers(), max_size=2)))
def test_whole_xpu_inventory_is_devices_none_or_a_wire_format_error(capacity: Any) -> None:
    try:
        devices = KUNLUN.node_devices(_node(capacity))
    except WireFormatError:
        return
    assert devices is None or 0 < len(devices) <= 1024


@settings(max_examples=300, deadline=None)
@given(
    used=st.lists(st.booleans(), min_size=8, max_size=8),
    nums=st.integers(min_value=0, max_value=9),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_whole_xpu_fit_picks_nums_free_distinct_devices_whatever_the_list_order(
    used: list[bool], nums: int, seed: int
) -> None:
    devices = [dev(i, used=int(u)) for i, u in enumerate(used)]
    result = KUNLUN.fit(devices, whole_request(nums), ctx())
    shuffled = list(devices)
    random.Random(seed).shuffle(shuffled)
    assert KUNLUN.fit(shuffled, whole_request(nums), ctx()) == result
    if isinstance(result, Picked):
        indexes = picked_indexes(result)
        assert len(indexes) == len(set(indexes)) == nums
        assert not any(used[i] for i in indexes)
    else:
        assert result.message == "1/8 NumaNotFit"


def test_whole_xpu_annotations_refuse_a_device_whose_index_is_unknown() -> None:
    allocation = PodAllocation((ContainerAllocation((GPUSlice("foreign", 0, 0, "kunlun"),)),))
    with pytest.raises(ValueError, match="foreign"):
        KUNLUN.pod_annotations(pod(), allocation, node="n1", now=AWARE_NOW)
