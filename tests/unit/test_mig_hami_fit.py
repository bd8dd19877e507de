"""HAMi v2.10's dynamic MIG in the scheduler: `fit.fit_pod` on mig-mode GPUs and the usage rebuild
from pods' MIG reservations (`usage.with_slices` with `mig`).

Transcribed from HAMi v2.10.0 (commit 4707fb02), each test citing its Go test:
- pkg/device/nvidia/mig_capability_test.go: TestAddResourceUsageUsesReportedProfileAndPlacement,
  TestCustomFilterUsesReportedPlacementCapacity, TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs,
  TestFitUsesEffectivePercentageMemoryForMigPlacement.
- pkg/device/nvidia/device_test.go: TestFit_MigPercentageRequestRejectsUndersizedTemplate (v2.10's form:
  a MIG GPU without a profile big enough), TestCustomFilterRule_NonMig.
- pkg/scheduler/mig_allocation_test.go: TestIsMIGRequest,
  TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU,
  TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU,
  TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU,
  TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement,
  TestGetNodesUsageFailsClosedWithoutMigAllocation, TestGetNodesUsageRestoresUnconsumedMigReservations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, VGPU_MODE, VGPU_NODE
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations, overlaps
from hami_api.resources import ContainerRequest
from hami_api.types import BindPhase, DeviceSelector, GPUInfo, GPUSlice, MigPlacement, MigProfile
from hami_control.binder import Binder
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.fit import Fit, FitFailure, Reason, fit_pod, is_mig_request
from hami_control.pod_store import PodStore
from hami_control.scheduling import Extender
from hami_control.usage import GPUUsage, NodeGPUs, with_slices, without_slices
from tests.builders import Json, gpu_info, node, pod

MIG = DeviceSelector(modes=("mig",))
HAMI_CORE = DeviceSelector(modes=("hami-core",))


def _at(starts: range | tuple[int, ...], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(s, size) for s in starts)


# mig_capability_test.go a100MigProfiles()
A100_TEST = (
    MigProfile("1g.5gb", 5120, 14, 1, _at(range(7), 1)),
    MigProfile("2g.10gb", 10240, 28, 2, _at((0, 2, 4), 2)),
    MigProfile("3g.20gb", 20480, 42, 3, _at((0, 4), 4)),
)

# What HAMi's plugin registers for an A100-SXM4-40GB with the chart's allowlist (memory from NVML,
# core = ceil(SM*100/98)): section 5 of the notes.
A100_40GB = (
    MigProfile("1g.5gb", 4864, 15, 1, _at(range(7), 1)),
    MigProfile("2g.10gb", 9856, 29, 2, _at((0, 2, 4), 2)),
    MigProfile("3g.20gb", 19968, 43, 3, _at((0, 4), 4)),
    MigProfile("7g.40gb", 40192, 100, 7, _at((0,), 8)),
)


def _gpu(
    uuid: str = "GPU-a",
    profiles: tuple[MigProfile, ...] = A100_TEST,
    *,
    mode: str = "mig",
    in_use: tuple[MigPlacement, ...] = (),
    used: int = 0,
    usedmem: int = 0,
    usedcores: int = 0,
    count: int = 7,
    devmem: int = 40960,
) -> GPUUsage:
    info = GPUInfo(
        uuid, count=count, devmem=devmem, devcore=100, type="NVIDIA-A100-SXM4-40GB", mode=mode, health=True,
        mig_profiles=profiles if mode == "mig" else (),
    )  # fmt: skip
    return GPUUsage(info, used, usedmem, usedcores, mig_in_use=in_use)


def _node(*gpus: GPUUsage) -> NodeGPUs:
    return NodeGPUs("node1", gpus)


def _ask(
    nums: int = 1, memreq: int = 0, percentage: int | None = None, cores: int = 0
) -> list[tuple[ContainerRequest | None, bool]]:
    return [(ContainerRequest(nums, memreq, percentage, cores), False)]


THREE_2G = _at((0, 2, 4), 2)


def test_a_mig_device_takes_the_reported_profile_memory_cores_and_placement() -> None:
    # mig_capability_test.go TestAddResourceUsageUsesReportedProfileAndPlacement: 10000 MiB -> 2g.10gb,
    # (10240, 28), placement {0,2}; the physical UUID is kept.
    fit = fit_pod(_node(_gpu()), _ask(memreq=10000), selector=MIG)
    assert isinstance(fit, Fit)
    assert fit.allocation.slices() == (GPUSlice("GPU-a", 10240, 28),)
    assert fit.mig == (MigAllocation(0, 0, "GPU-a", "2g.10gb", MigPlacement(0, 2)),)


def test_a_fourth_2g_does_not_fit_but_a_1g_takes_the_last_placement() -> None:
    # mig_capability_test.go TestCustomFilterUsesReportedPlacementCapacity
    node = _node(_gpu(in_use=THREE_2G, used=3, usedmem=30720, usedcores=84))
    failure = fit_pod(node, _ask(memreq=10000), selector=MIG)
    assert isinstance(failure, FitFailure)
    assert failure.message == "1/1 CardMigTopologyInfeasible"
    fit = fit_pod(node, _ask(memreq=5000), selector=MIG)
    assert isinstance(fit, Fit)
    assert fit.mig[0].placement == MigPlacement(6, 1)


def test_devices_queued_on_another_gpu_do_not_take_this_gpus_placement() -> None:
    # mig_capability_test.go TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs: GPU-a has one 1g
    # placement left, GPU-b is empty. Two 1g devices: one on each GPU; then with GPU-b full too, the
    # second device finds no placement (two on GPU-a do not fit its single one).
    full_b = _gpu("GPU-b", in_use=(*THREE_2G, MigPlacement(6, 1)), used=4)
    a = _gpu("GPU-a", in_use=THREE_2G, used=3)
    fit = fit_pod(_node(a, _gpu("GPU-b")), _ask(nums=2, memreq=5000), selector=MIG)
    assert isinstance(fit, Fit)
    assert [d.gpu_uuid for d in fit.mig] in (["GPU-a", "GPU-b"], ["GPU-b", "GPU-a"], ["GPU-b", "GPU-b"])
    failure = fit_pod(_node(a, full_b), _ask(nums=2, memreq=5000), selector=MIG)
    assert isinstance(failure, FitFailure)
    assert Reason.CARD_MIG_TOPOLOGY_INFEASIBLE in dict(failure.reasons)


def test_a_percentage_is_of_the_gpu_memory_and_no_1g_serves_25_percent() -> None:
    # mig_capability_test.go TestFitUsesEffectivePercentageMemoryForMigPlacement: 25 % of 40960 with three
    # 2g in use (30720 MiB) passes the memory rule and finds no profile.
    node = _node(_gpu(in_use=THREE_2G, used=3, usedmem=30720))
    failure = fit_pod(node, _ask(percentage=25), selector=MIG)
    assert isinstance(failure, FitFailure)
    assert failure.message == "1/1 CardMigTopologyInfeasible"


def test_a_mig_gpu_whose_profiles_are_all_too_small_does_not_fit() -> None:
    # device_test.go TestFit_MigPercentageRequestRejectsUndersizedTemplate (v2.10: profiles, not templates):
    # 50 % of 8192 MiB with only a 1024 MiB profile.
    tiny = (MigProfile("1g.5gb", 1024, 14, 1, _at((0,), 1)),)
    node = _node(_gpu(profiles=tiny, count=1, devmem=8192))
    failure = fit_pod(node, _ask(percentage=50, cores=10), selector=MIG)
    assert isinstance(failure, FitFailure)
    assert failure.message == "1/1 CardMigTopologyInfeasible"


def test_a_gpu_not_in_mig_mode_has_no_mig_rule() -> None:
    # device_test.go TestCustomFilterRule_NonMig
    fit = fit_pod(_node(_gpu(mode="")), _ask(memreq=4000))
    assert isinstance(fit, Fit)
    assert fit.mig == ()
    assert fit.allocation.slices() == (GPUSlice("GPU-a", 4000, 0),)


def test_is_mig_request_follows_the_vgpu_mode_annotation_and_the_nodes_gpus() -> None:
    # mig_allocation_test.go TestIsMIGRequest (the non-NVIDIA sub-case is not ours: fit_pod is NVIDIA's)
    mig_node, core_node = _node(_gpu()), _node(_gpu(mode="hami-core"))
    assert not is_mig_request(mig_node, HAMI_CORE)  # explicit HAMi-core mode
    assert is_mig_request(mig_node, DeviceSelector())  # MIG mode without the annotation
    assert is_mig_request(mig_node, MIG)  # MIG mode annotation
    assert not is_mig_request(core_node, MIG)  # no MIG device


def test_one_container_takes_two_mig_devices_of_one_gpu_at_distinct_placements() -> None:
    # mig_allocation_test.go TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU: two 4000 MiB devices
    # on a single GPU with seven 1g placements (HAMi's i++ revisit).
    profiles = (MigProfile("1g.5gb", 5120, 14, 1, _at(range(7), 1)),)
    fit = fit_pod(_node(_gpu(profiles=profiles)), _ask(nums=2, memreq=4000), selector=MIG)
    assert isinstance(fit, Fit)
    assert [s.uuid for s in fit.allocation.slices()] == ["GPU-a", "GPU-a"]
    assert [d.placement for d in fit.mig] == [MigPlacement(6, 1), MigPlacement(5, 1)]
    assert [(d.container_index, d.device_index) for d in fit.mig] == [(0, 0), (0, 1)]


def test_two_devices_on_a_gpu_with_one_placement_fail_with_hamis_reasons() -> None:
    # mig_allocation_test.go TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU: reason
    # CardMigTopologyInfeasible counted once (the revisit), beside AllocatedCardsInsufficientRequest.
    profiles = (MigProfile("1g.5gb", 5120, 14, 1, _at((6,), 1)),)
    failure = fit_pod(_node(_gpu(profiles=profiles)), _ask(nums=2, memreq=4000), selector=MIG)
    assert isinstance(failure, FitFailure)
    assert failure.message == "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible"
    assert not failure.unresolvable


def test_two_gpus_asked_of_a_one_gpu_hami_core_node_is_node_insufficient_device() -> None:
    # mig_allocation_test.go TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU
    failure = fit_pod(_node(_gpu(mode="hami-core")), _ask(nums=2, memreq=4000), selector=HAMI_CORE)
    assert isinstance(failure, FitFailure)
    assert failure.message == "NodeInsufficientDevice"
    assert failure.unresolvable


def test_a_hami_core_pod_skips_mig_gpus_as_card_type_mismatch() -> None:
    # device.go checkType: the annotation exists and does not contain the GPU's mode
    failure = fit_pod(_node(_gpu()), _ask(memreq=4000), selector=HAMI_CORE)
    assert isinstance(failure, FitFailure)
    assert failure.message == "1/1 CardTypeMismatch"


def test_a_pod_without_the_annotation_may_land_on_a_mig_gpu_and_gets_a_profile() -> None:
    # HAMi: without nvidia.com/vgpu-mode a pod may land on either mode (and then gets a MIG device)
    fit = fit_pod(_node(_gpu()), _ask(memreq=4000))
    assert isinstance(fit, Fit)
    assert fit.mig[0].profile == "1g.5gb"


def test_no_memory_request_takes_the_whole_gpu_profile_where_hami_never_schedules() -> None:
    # Ours (fit module note): 100 % (what no gpumem becomes with defaultMemory 0) asks at most the largest
    # profile's memory, so the pod gets 7g.40gb; HAMi asks 40960 MiB > 40192 and fails.
    fit = fit_pod(_node(_gpu(profiles=A100_40GB)), _ask(percentage=100), selector=MIG)
    assert isinstance(fit, Fit)
    assert fit.mig == (MigAllocation(0, 0, "GPU-a", "7g.40gb", MigPlacement(0, 8)),)
    assert fit.allocation.slices() == (GPUSlice("GPU-a", 40192, 100),)


def test_later_containers_never_overlap_an_earlier_containers_placement() -> None:
    # Ours: every container's MIG instance lives as long as the pod, plain init containers included.
    profiles = (MigProfile("3g.20gb", 20480, 42, 3, _at((0, 4), 4)),)
    requests: list[tuple[ContainerRequest | None, bool]] = [
        (ContainerRequest(1, 20000, None, 0), True),
        (ContainerRequest(1, 20000, None, 0), False),
    ]
    fit = fit_pod(_node(_gpu(profiles=profiles)), requests, selector=MIG)
    assert isinstance(fit, Fit)
    assert [(d.container_index, d.placement) for d in fit.mig] == [
        (0, MigPlacement(4, 4)),
        (1, MigPlacement(0, 4)),
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 45000), min_size=1, max_size=9), st.integers(1, 3))
def test_mig_devices_placed_one_pod_after_another_never_overlap(memories: list[int], nums: int) -> None:
    node = _node(_gpu(profiles=A100_40GB), _gpu("GPU-b", profiles=A100_40GB))
    placed: list[MigAllocation] = []
    for mem in memories:
        fit = fit_pod(node, _ask(nums=nums, memreq=mem), selector=MIG)
        if isinstance(fit, FitFailure):
            continue
        node = with_slices(node, fit.allocation.slices(), fit.mig)
        placed.extend(fit.mig)
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            assert a.gpu_uuid != b.gpu_uuid or not overlaps(a.placement, b.placement)
    for gpu in node.gpus:
        assert gpu.healthy


# --- usage rebuild (HAMi pkg/scheduler/scheduler.go getNodesUsage) -----------------------------------------


def _one_1g(starts: tuple[int, ...] = (6,)) -> GPUUsage:
    profiles = (MigProfile("1g.5gb", 5120, 14, 1, _at(starts, 1)),)
    return _gpu(profiles=profiles)


def test_usage_restores_a_reservation_by_profile_and_placement() -> None:
    # mig_allocation_test.go TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement
    reservation = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1), "MIG-a", 7, 0)
    node = with_slices(_node(_one_1g()), [GPUSlice("GPU-a", 5120, 14)], [reservation])
    (gpu,) = node.gpus
    assert gpu.mig_in_use == (MigPlacement(6, 1),)
    assert gpu.healthy
    assert (gpu.used, gpu.usedmem, gpu.usedcores) == (1, 5120, 14)


def test_usage_fails_a_mig_gpu_closed_when_a_pod_on_it_has_no_reservation() -> None:
    # mig_allocation_test.go TestGetNodesUsageFailsClosedWithoutMigAllocation; and back in service when the
    # pod leaves (ours).
    slices = [GPUSlice("GPU-a", 5120, 14)]
    node = with_slices(_node(_one_1g()), slices)
    assert not node.gpus[0].healthy
    assert without_slices(node, slices).gpus[0].healthy


def test_usage_restores_reservations_beyond_the_pods_slices() -> None:
    # mig_allocation_test.go TestGetNodesUsageRestoresUnconsumedMigReservations: two reservations, one slice
    reservations = [
        MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1)),
        MigAllocation(0, 1, "GPU-a", "1g.5gb", MigPlacement(5, 1)),
    ]
    node = with_slices(_node(_one_1g((5, 6))), [GPUSlice("GPU-a", 5120, 14)], reservations)
    (gpu,) = node.gpus
    assert gpu.healthy
    assert gpu.mig_in_use == (MigPlacement(6, 1), MigPlacement(5, 1))


def test_usage_fails_a_hami_core_gpu_closed_that_a_reservation_names() -> None:
    # scheduler.go getNodesUsage: "found a mig task running on a hami-core GPU" -> Health=false
    reservation = [MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1))]
    slices = [GPUSlice("GPU-a", 5120, 14)]
    node = with_slices(_node(_gpu(mode="hami-core")), slices, reservation)
    assert not node.gpus[0].healthy
    assert node.gpus[0].mig_in_use == ()
    assert without_slices(node, slices, reservation).gpus[0].healthy


def test_usage_ignores_a_reservation_on_a_gpu_the_node_does_not_have() -> None:
    # Ours: HAMi fails every mig GPU of the node closed ("unconsumed MIG reservations reference an unknown
    # device"); a UUID names one physical GPU, so no placement here is taken by it.
    reservation = [MigAllocation(0, 0, "GPU-gone", "1g.5gb", MigPlacement(6, 1))]
    node = with_slices(_node(_one_1g()), [GPUSlice("GPU-gone", 5120, 14)], reservation)
    assert node.gpus[0].healthy
    assert node.gpus[0].mig_in_use == ()


def test_releasing_a_pod_frees_its_placements() -> None:
    reservation = [MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1))]
    slices = [GPUSlice("GPU-a", 5120, 14)]
    node = with_slices(_node(_one_1g()), slices, reservation)
    released = without_slices(node, slices, reservation)
    assert released.gpus[0] == _one_1g()


# --- through the extender, in process (filter, bind, the pod store) -----------------------------------------


@dataclass
class Writer:
    """The Binding writer: records what the binder sends (as tests/unit/test_vendor_extender.py)."""

    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.calls.append((name, node, dict(annotations)))


class _Events:
    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        pass


def _mig_service() -> tuple[Extender, Writer]:
    """hami-control's extender service in process over one node with an A100-40GB in mig mode."""
    config = ControlConfig()
    a100 = gpu_info(
        0, id="GPU-a", count=7, devmem=40960, type="NVIDIA-A100-SXM4-40GB", mode="mig", mig_profiles=A100_40GB
    )
    cache = ClusterCache(config.requests.names, config.registry.vendors)
    cache.node_upserted(node("m", [a100]))
    ext = Extender(config, cache, PodStore(config, cache))
    writer = Writer()
    ext.binder = Binder(ext.cache, ext.pods, writer, _Events(), node_lock=lambda _node: None)
    return ext, writer


def body(p: Json, names: list[str]) -> bytes:
    return orjson.dumps({"Pod": p, "NodeNames": names})


def bind_args(p: Json, target: str) -> bytes:
    meta = p["metadata"]
    return orjson.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": target}
    )


def _mig_pod(name: str, **limits: str) -> Json:
    resources = {"limits": {"nvidia.com/gpu": "1", **limits}}
    return pod(
        name,
        {"name": "c", "image": "cuda", "resources": resources},
        namespace="ns",
        uid=f"u-{name}",
        annotations={VGPU_MODE: "mig"},
    )


def test_the_extender_places_mig_pods_by_profile_and_writes_hamis_annotations_at_bind() -> None:
    ext, writer = _mig_service()
    small, middle, half = (
        _mig_pod("small", **{"nvidia.com/gpumem": "4000"}),
        _mig_pod("middle", **{"nvidia.com/gpumem": "10000"}),
        _mig_pod("half", **{"nvidia.com/gpumem-percentage": "50"}),
    )
    assert ext.filter(body(small, ["m"]))["NodeNames"] == ["m"]
    assert asyncio.run(ext.bind(bind_args(small, "m"))) == {"Error": ""}
    (_, target, annotations) = writer.calls[0]
    assert target == "m"
    assert annotations[DEVICES_TO_ALLOCATE] == "GPU-a,NVIDIA,4864,15:;"
    assert annotations[DEVICES_ALLOCATED] == "GPU-a,NVIDIA,4864,15:;"
    assert annotations[MIG_ALLOCATIONS] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    assert ext.binder is not None
    ext.binder.pod_changed("u-small", BindPhase.SUCCESS.value)  # hami-node allocated it: window closed
    # 10000 MiB: 2g.10gb has 9856, so 3g.20gb; its high placement {4,4} overlaps the 1g at 6.
    assert ext.filter(body(middle, ["m"]))["NodeNames"] == ["m"]
    assert asyncio.run(ext.bind(bind_args(middle, "m"))) == {"Error": ""}
    (mig,) = decode_mig_allocations(writer.calls[1][2][MIG_ALLOCATIONS])
    assert (mig.profile, mig.placement) == ("3g.20gb", MigPlacement(0, 4))
    # 50 % is 20480 MiB: HAMi's memory rule comes first (40960 - 4864 - 19968 MiB are free).
    result = ext.filter(body(half, ["m"]))
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"m": "1/1 CardInsufficientMemory"}
    # 15000 MiB passes it, and finds no placement: the 3g.20gb left at {4,4} overlaps the 1g at 6.
    wide = _mig_pod("wide", **{"nvidia.com/gpumem": "15000"})
    assert ext.filter(body(wide, ["m"]))["FailedNodes"] == {"m": "1/1 CardMigTopologyInfeasible"}
    gpus = ext.cache.node_gpus("m")
    assert gpus is not None
    assert gpus.gpus[0].mig_in_use == (MigPlacement(6, 1), MigPlacement(0, 4))
    assert (gpus.gpus[0].used, gpus.gpus[0].usedmem) == (2, 4864 + 19968)


def test_a_hami_core_pod_is_not_placed_on_a_mig_node() -> None:
    ext, _ = _mig_service()
    p = _mig_pod("core", **{"nvidia.com/gpumem": "4000"})
    p["metadata"]["annotations"] = {VGPU_MODE: "hami-core"}
    assert ext.filter(body(p, ["m"]))["FailedAndUnresolvableNodes"] == {"m": "1/1 CardTypeMismatch"}


def test_a_watched_pod_holds_its_mig_placements_and_frees_them_when_deleted() -> None:
    ext, _ = _mig_service()
    bound = _mig_pod("w", **{"nvidia.com/gpumem": "4000"})
    bound["metadata"]["annotations"] = {
        VGPU_MODE: "mig",
        VGPU_NODE: "m",
        DEVICES_ALLOCATED: "GPU-a,NVIDIA,4864,15:;",
        MIG_ALLOCATIONS: '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":3,"size":1},"migUUID":"MIG-x","gpuInstanceID":9,"computeInstanceID":0}]',
    }
    bound["spec"]["nodeName"] = "m"
    ext.pods.apply("ADDED", bound)
    gpus = ext.cache.node_gpus("m")
    assert gpus is not None and gpus.gpus[0].mig_in_use == (MigPlacement(3, 1),)
    assert gpus.gpus[0].healthy
    ext.pods.apply("DELETED", bound)
    gpus = ext.cache.node_gpus("m")
    assert gpus is not None and gpus.gpus[0].mig_in_use == () and gpus.gpus[0].used == 0


def test_a_watched_pod_on_a_mig_gpu_with_a_bad_reservation_takes_the_gpu_out_of_service() -> None:
    # HAMi's getNodesUsage drops an undecodable annotation, then "MIG Pod lacks a matching profile/placement
    # reservation" sets Health=false; here until the pod leaves.
    ext, _ = _mig_service()
    bound = _mig_pod("w", **{"nvidia.com/gpumem": "4000"})
    bound["metadata"]["annotations"] = {
        VGPU_MODE: "mig",
        VGPU_NODE: "m",
        DEVICES_ALLOCATED: "GPU-a,NVIDIA,4864,15:;",
        MIG_ALLOCATIONS: '[{"containerIndex":0}]',
    }
    bound["spec"]["nodeName"] = "m"
    ext.pods.apply("ADDED", bound)
    gpus = ext.cache.node_gpus("m")
    assert gpus is not None and not gpus.gpus[0].healthy
    assert ext.filter(body(_mig_pod("next", **{"nvidia.com/gpumem": "4000"}), ["m"]))["FailedNodes"] == {
        "m": "1/1 CardNotHealth"
    }
    ext.pods.apply("DELETED", bound)
    gpus = ext.cache.node_gpus("m")
    assert gpus is not None and gpus.gpus[0].healthy
