"""hami_control.fit against kubelet's init-container device reuse: the GPU the scheduler accounts for
each container is the GPU kubelet hands it (checked with an independent model of kubelet's pool), and
sidecars are counted beside the containers that run with them."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.containers import ContainerKind, footprint, footprint_slices, kinds_of
from hami_api.resources import ContainerRequest
from hami_api.types import ContainerAllocation, GPUPolicy, GPUSlice, PodAllocation
from hami_control.fit import Fit, FitFailure, Reason, fit_pod
from hami_control.usage import NodeGPUs, with_slices
from tests.builders import gpu_info, node_gpus

Pod = list[tuple[ContainerRequest | None, bool]]


a100 = functools.partial(gpu_info, devmem=40000, type="NVIDIA-A100")
"""The GPUs these tests place on: A100s of 40000 MiB split 10 ways, `GPU-<index>`."""


def req(mem: int, nums: int = 1, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=mem, mem_percentage=None, coresreq=cores)


def busy(n: NodeGPUs, uuid: str, mem: int) -> NodeGPUs:
    return with_slices(n, [GPUSlice(uuid, mem, 0)])


def uuids(result: object) -> list[tuple[str, ...]]:
    assert isinstance(result, Fit), result
    return [c.uuids for c in result.allocation]


def kubelet_gpus(
    allocation: PodAllocation, kinds: Sequence[ContainerKind], rng: random.Random
) -> tuple[list[list[str]], list[bool]]:
    """What kubelet hands each container, modelled on kubernetes pkg/kubelet/cm/devicemanager/manager.go
    independently of `hami_api.containers`: reusable devices first (any of them at random when there are
    more than needed), then new devices, steered by GetPreferredAllocation to the allocation's GPUs not
    covered yet. Returns the GPUs per container and, per container, whether its draw was random."""
    pool: list[tuple[str, str]] = []  # (device id, GPU)
    got: list[list[str]] = []
    random_draw: list[bool] = []
    for index, container in enumerate(allocation):
        n = len(container.devices)
        random_draw.append(len(pool) > n > 0)
        if n == 0:
            got.append([])
            continue
        taken = rng.sample(pool, n) if len(pool) > n else list(pool)
        want = list(container.uuids)
        for _, g in taken:
            if g in want:
                want.remove(g)
        new = [(f"{g}/{index}", g) for g in want[: n - len(taken)]]
        if kinds[index] is ContainerKind.INIT:
            pool.extend(new)
        else:
            pool = [d for d in pool if d not in taken]
        got.append([g for _, g in (*taken, *new)])
    return got, random_draw


def test_app_container_is_placed_on_the_gpu_its_init_container_held() -> None:
    # Binpack would put the app container on the busier GPU-0; kubelet hands it the init's GPU-1.
    n = busy(node_gpus(a100(0), a100(1)), "GPU-0", 20000)
    pod: Pod = [(req(30000), True), (req(10000), False)]
    got = fit_pod(n, pod, policy=(GPUPolicy.BINPACK,))
    assert uuids(got) == [("GPU-1",), ("GPU-1",)]


def test_init_container_moves_to_a_gpu_its_app_container_can_follow_it_to() -> None:
    # Binpack tries GPU-0 first for the init container, but the app container (which kubelet makes
    # reuse the init's device) does not fit there: both go to GPU-1.
    n = busy(node_gpus(a100(0), a100(1)), "GPU-0", 25000)
    pod: Pod = [(req(5000), True), (req(30000), False)]
    got = fit_pod(n, pod, policy=(GPUPolicy.BINPACK,))
    assert uuids(got) == [("GPU-1",), ("GPU-1",)]


def test_pod_whose_app_container_fits_no_gpu_fails_with_its_reason_counted() -> None:
    n = busy(busy(node_gpus(a100(0), a100(1)), "GPU-0", 25000), "GPU-1", 25000)
    got = fit_pod(n, [(req(5000), True), (req(30000), False)])
    assert isinstance(got, FitFailure)
    assert got.reasons == ((Reason.CARD_INSUFFICIENT_MEMORY, 2),)
    assert got.container == 0


def test_second_init_container_reuses_the_first_ones_gpu() -> None:
    n = busy(node_gpus(a100(0), a100(1)), "GPU-0", 1000)
    pod: Pod = [(req(2000), True), (req(3000), True), (req(1000), False)]
    assert uuids(fit_pod(n, pod, policy=(GPUPolicy.SPREAD,))) == [("GPU-1",)] * 3


def test_app_container_asking_more_gpus_than_the_init_takes_its_gpu_plus_new_ones() -> None:
    n = node_gpus(a100(0), a100(1), a100(2))
    got = fit_pod(n, [(req(1000), True), (req(1000, nums=2), False)], policy=(GPUPolicy.SPREAD,))
    init, app = uuids(got)
    assert init[0] in app and len(set(app)) == 2


def test_second_app_container_is_free_once_the_first_took_the_reused_device() -> None:
    n = busy(node_gpus(a100(0), a100(1)), "GPU-1", 30000)
    # The init container goes to the idle GPU-0 (spread) and app 1 reuses its device there; app 2 gets
    # a new device, and only GPU-0 still has room for it beside app 1.
    pod: Pod = [(req(1000), True), (req(20000), False), (req(15000), False)]
    got = fit_pod(n, pod, policy=(GPUPolicy.SPREAD,))
    assert uuids(got) == [("GPU-0",), ("GPU-0",), ("GPU-0",)]


def test_sidecar_keeps_its_gpu_and_counts_beside_the_app_containers() -> None:
    # One 40000 MiB GPU: a plain init container of 25000 and an app container of 25000 take turns on
    # it, but a sidecar of 25000 runs beside the app container, so the two need two GPUs.
    one_gpu = node_gpus(a100(0))
    assert uuids(fit_pod(one_gpu, [(req(25000), True), (req(25000), False)])) == [("GPU-0",), ("GPU-0",)]
    got = fit_pod(one_gpu, [(req(25000), True), (req(25000), False)], sidecars={0})
    assert isinstance(got, FitFailure)
    assert got.reasons == ((Reason.CARD_INSUFFICIENT_MEMORY, 1),)
    assert uuids(
        fit_pod(node_gpus(a100(0), a100(1)), [(req(25000), True), (req(25000), False)], sidecars={0})
    ) in (
        [("GPU-0",), ("GPU-1",)],
        [("GPU-1",), ("GPU-0",)],
    )


def test_sidecar_footprint_adds_to_the_app_phase_and_to_later_init_containers() -> None:
    allocation = PodAllocation(
        (
            ContainerAllocation((GPUSlice("GPU-0", 1000, 10),)),  # sidecar
            ContainerAllocation((GPUSlice("GPU-0", 5000, 0),)),  # init, runs beside the sidecar
            ContainerAllocation((GPUSlice("GPU-0", 2000, 20),)),  # app
        )
    )
    kinds = (ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP)
    held = footprint_slices(allocation, kinds)
    # Slots: 2 (sidecar + init, or sidecar + app); memory: max(1000 + 5000, 1000 + 2000);
    # cores: max(10 + 0, 10 + 20). The app phase's slices stay, the init phase's extra rides on the first.
    assert held == (GPUSlice("GPU-0", 1000 + 3000, 10), GPUSlice("GPU-0", 2000, 20))
    assert footprint(allocation, kinds) == {"GPU-0": (2, 6000, 30)}


# --- property: the fit always agrees with kubelet -----------------------------------------------------

kinds_st = st.sampled_from([ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP])
requests_st = st.builds(
    ContainerRequest,
    nums=st.integers(1, 3),
    memreq=st.integers(500, 20000),
    mem_percentage=st.none(),
    coresreq=st.sampled_from([0, 10, 30, 50]),
)
containers_st = st.lists(st.tuples(st.one_of(st.none(), requests_st), kinds_st), min_size=1, max_size=5).map(
    lambda cs: sorted(cs, key=lambda c: c[1] is ContainerKind.APP)  # init containers first
)


def node_from_draw(gpus: list[tuple[int, int, int]]) -> NodeGPUs:
    """(slots, MiB, MiB already used by one other pod) per GPU."""
    return node_gpus(
        *(a100(i, devmem=mem, count=count) for i, (count, mem, _) in enumerate(gpus)),
        slices=[GPUSlice(f"GPU-{i}", min(used, mem), 0) for i, (_, mem, used) in enumerate(gpus) if used],
    )


nodes_st = st.lists(
    st.tuples(st.integers(2, 6), st.integers(8000, 40000), st.integers(0, 30000)), min_size=1, max_size=5
).map(node_from_draw)


@settings(max_examples=400, deadline=None)
@given(nodes_st, containers_st, st.sampled_from([GPUPolicy.SPREAD, GPUPolicy.BINPACK]), st.integers(0, 2**32))
def test_every_container_gets_from_kubelet_the_gpu_it_was_accounted_on(
    n: NodeGPUs,
    containers: list[tuple[ContainerRequest | None, ContainerKind]],
    policy: GPUPolicy,
    seed: int,
) -> None:
    pod: Pod = [(r, kind is not ContainerKind.APP) for r, kind in containers]
    sidecars = {i for i, (_, kind) in enumerate(containers) if kind is ContainerKind.SIDECAR}
    got = fit_pod(n, pod, policy=(policy,), sidecars=sidecars)
    if isinstance(got, FitFailure):
        return
    kinds = kinds_of([init for _, init in pod], sidecars)
    handed, random_draw = kubelet_gpus(got.allocation, kinds, random.Random(seed))
    for index, (container, gpus) in enumerate(zip(got.allocation, handed, strict=True)):
        if not random_draw[index] and not any(random_draw[:index]):
            assert sorted(gpus) == sorted(container.uuids), (index, got.allocation)
    state = with_slices(n, footprint_slices(got.allocation, kinds))
    for g in state.gpus:
        assert g.used <= g.info.count and g.usedmem <= g.info.devmem and g.usedcores <= g.info.devcore
