"""hami_control.fit: HAMi's NVIDIA fit rules, one table row per rule and reason, policies, containers,
quota, and property tests that a fit never overfills a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.containers import footprint_slices, init_kinds
from hami_api.resources import ContainerRequest
from hami_api.types import DeviceSelector, GPUPairScore, GPUPolicy, GPUSlice, PodAllocation
from hami_control.fit import Fit, FitFailure, Reason, fit_pod
from hami_control.quota import QuotaUsage
from hami_control.usage import GPUUsage, NodeGPUs, with_slices, without_slices
from tests.builders import gpu_info, node_gpus


def peak(allocation: PodAllocation, inits: int) -> tuple[GPUSlice, ...]:
    """The footprint of a pod whose first `inits` containers are plain init containers."""
    return footprint_slices(allocation, init_kinds(inits, len(allocation)))


def req(nums: int = 1, mem: int = 1000, pct: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def one(r: ContainerRequest) -> list[tuple[ContainerRequest | None, bool]]:
    return [(r, False)]


def used(n: NodeGPUs, uuid: str, slots: int = 1, mem: int = 0, cores: int = 0) -> NodeGPUs:
    return with_slices(n, [GPUSlice(uuid, mem // slots, cores // slots)] * slots)


def failure(result: object) -> FitFailure:
    assert isinstance(result, FitFailure), result
    return result


def uuids(result: object) -> list[tuple[str, ...]]:
    assert isinstance(result, Fit), result
    return [c.uuids for c in result.allocation]


# --- one row per rule ------------------------------------------------------------------------------------

TWO = node_gpus(gpu_info(0), gpu_info(1))

REASON_CASES: list[tuple[str, NodeGPUs, ContainerRequest, DeviceSelector, Reason]] = [
    ("unhealthy", node_gpus(gpu_info(0, health=False)), req(), DeviceSelector(), Reason.CARD_NOT_HEALTH),
    ("cordoned", node_gpus(gpu_info(0), cordon=["GPU-0"]), req(), DeviceSelector(), Reason.CARD_CORDONED),
    (
        "slots",
        used(node_gpus(gpu_info(0, count=2)), "GPU-0", 2),
        req(),
        DeviceSelector(),
        Reason.CARD_TIME_SLICING_EXHAUSTED,
    ),
    (
        "memory",
        used(node_gpus(gpu_info(0)), "GPU-0", 1, 15500),
        req(mem=1000),
        DeviceSelector(),
        Reason.CARD_INSUFFICIENT_MEMORY,
    ),
    (
        "percentage",
        used(node_gpus(gpu_info(0)), "GPU-0", 1, 9000),
        req(mem=0, pct=50),
        DeviceSelector(),
        Reason.CARD_INSUFFICIENT_MEMORY,
    ),
    (
        "cores",
        used(node_gpus(gpu_info(0)), "GPU-0", 1, 0, 70),
        req(cores=40),
        DeviceSelector(),
        Reason.CARD_INSUFFICIENT_CORE,
    ),
    (
        "exclusive",
        used(node_gpus(gpu_info(0)), "GPU-0", 1, 100, 0),
        req(cores=100),
        DeviceSelector(),
        Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    ),
    (
        "zero cores on full",
        used(node_gpus(gpu_info(0)), "GPU-0", 1, 100, 100),
        req(cores=0),
        DeviceSelector(),
        Reason.CARD_COMPUTE_UNITS_EXHAUSTED,
    ),
]


@pytest.mark.parametrize(
    ("name", "n", "r", "selector", "reason"), REASON_CASES, ids=[c[0] for c in REASON_CASES]
)
def test_each_rule_gives_its_reason(
    name: str, n: NodeGPUs, r: ContainerRequest, selector: DeviceSelector, reason: Reason
) -> None:
    got = failure(fit_pod(n, one(r), selector=selector))
    assert got.reasons == ((reason, 1),)
    assert not got.unresolvable
    assert got.message == f"1/1 {reason.value}"


STATIC_CASES: list[tuple[str, DeviceSelector, Reason]] = [
    ("use-gputype", DeviceSelector(use_types=("a100",)), Reason.CARD_TYPE_MISMATCH),
    ("nouse-gputype", DeviceSelector(nouse_types=("t4",)), Reason.CARD_TYPE_MISMATCH),
    ("vgpu-mode", DeviceSelector(modes=("mig",)), Reason.CARD_TYPE_MISMATCH),
    ("use-gpuuuid", DeviceSelector(use_uuids=("GPU-9",)), Reason.CARD_UUID_MISMATCH),
    ("nouse-gpuuuid", DeviceSelector(nouse_uuids=("GPU-0", "GPU-1")), Reason.CARD_UUID_MISMATCH),
]


@pytest.mark.parametrize(("name", "selector", "reason"), STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_selector_mismatch_is_unresolvable(name: str, selector: DeviceSelector, reason: Reason) -> None:
    got = failure(fit_pod(TWO, one(req()), selector=selector))
    assert got.reasons == ((reason, 2),)
    assert got.unresolvable


def test_type_match_is_case_insensitive_substring() -> None:
    n = node_gpus(gpu_info(0, type="NVIDIA-A100-SXM4-80GB"), gpu_info(1))
    assert uuids(fit_pod(n, one(req()), selector=DeviceSelector(use_types=("a100",)))) == [("GPU-0",)]
    assert uuids(fit_pod(n, one(req()), selector=DeviceSelector(nouse_types=("A100",)))) == [("GPU-1",)]
    assert uuids(fit_pod(n, one(req()), selector=DeviceSelector(use_uuids=("GPU-1",)))) == [("GPU-1",)]


def test_too_few_gpus_is_unresolvable() -> None:
    got = failure(fit_pod(TWO, one(req(nums=3))))
    assert got.reasons == ((Reason.NODE_INSUFFICIENT_DEVICE, 2),)
    assert got.unresolvable


def test_mutex_policy_skips_used_gpus() -> None:
    n = used(TWO, "GPU-0")
    assert uuids(fit_pod(n, one(req()), policy=(GPUPolicy.MUTEX,))) == [("GPU-1",)]
    got = failure(fit_pod(used(n, "GPU-1"), one(req()), policy=(GPUPolicy.MUTEX,)))
    assert got.reasons == ((Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, 2),)


def test_reasons_are_counted_per_gpu_and_ranked() -> None:
    n = node_gpus(gpu_info(0), gpu_info(1), gpu_info(2, health=False), cordon=["GPU-1"])
    n = used(n, "GPU-0", 1, 16000)
    got = failure(fit_pod(n, one(req(nums=2))))
    assert got.message == "1/3 CardCordoned, 1/3 CardInsufficientMemory, 1/3 CardNotHealth"
    assert not got.unresolvable


def test_enough_memory_on_the_boundary() -> None:
    n = used(node_gpus(gpu_info(0)), "GPU-0", 1, 15000, 60)
    assert isinstance(fit_pod(n, one(req(mem=1000, cores=40))), Fit)


def test_percentage_is_of_the_chosen_gpu() -> None:
    n = node_gpus(gpu_info(0, devmem=8000), gpu_info(1, devmem=40000))
    got = fit_pod(n, one(req(nums=2, mem=0, pct=25)))
    assert isinstance(got, Fit)
    assert {s.uuid: s.usedmem for s in got.allocation.slices()} == {"GPU-0": 2000, "GPU-1": 10000}


def test_exclusive_needs_totalcore_100() -> None:
    # HAMi tests Totalcore == 100: with deviceCoreScaling 2 a 100-core ask may share.
    n = used(node_gpus(gpu_info(0, devcore=200)), "GPU-0", 1, 100, 50)
    assert isinstance(fit_pod(n, one(req(cores=100))), Fit)


# --- numa-bind -------------------------------------------------------------------------------------------


def test_numa_bind_keeps_a_container_on_one_numa_node() -> None:
    n = node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=1), gpu_info(2, numa=1))
    got = fit_pod(n, one(req(nums=2)), selector=DeviceSelector(numa_bind=True))
    assert sorted(uuids(got)[0]) == ["GPU-1", "GPU-2"]


def test_numa_bind_counts_the_abandoned_run_as_numa_not_fit_and_the_last_as_allocated_insufficient() -> None:
    # HAMi's score_test "numa not fit": GPU-1 (NUMA 1) is found first, GPU-0 (NUMA 0) starts a new run.
    n = node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=1))
    got = failure(fit_pod(n, one(req(nums=2)), selector=DeviceSelector(numa_bind=True)))
    assert got.reasons == ((Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST, 1), (Reason.NUMA_NOT_FIT, 1))
    assert got.message == "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"
    assert isinstance(fit_pod(n, one(req(nums=2))), Fit)


# --- policies --------------------------------------------------------------------------------------------


def test_binpack_picks_busiest_spread_idlest() -> None:
    n = used(node_gpus(gpu_info(0), gpu_info(1), gpu_info(2)), "GPU-1", 1, 8000, 30)
    assert uuids(fit_pod(n, one(req()), policy=(GPUPolicy.BINPACK,))) == [("GPU-1",)]
    # GPU-0 and GPU-2 tie: HAMi walks the sorted list from the end, so the later one
    assert uuids(fit_pod(n, one(req()), policy=(GPUPolicy.SPREAD,))) == [("GPU-2",)]


def test_binpack_counts_the_request_on_gpus_of_different_size() -> None:
    # Same usage, different sizes: the request fills the small GPU more, so binpack prefers it.
    n = node_gpus(gpu_info(0, devmem=80000), gpu_info(1, devmem=8000))
    assert uuids(fit_pod(n, one(req(mem=4000)), policy=(GPUPolicy.BINPACK,))) == [("GPU-1",)]
    assert uuids(fit_pod(n, one(req(mem=4000)), policy=(GPUPolicy.SPREAD,))) == [("GPU-0",)]


def test_numa_policy_chain_sorts_by_numa_first_and_hami_tries_the_highest_numa_node_first() -> None:
    # lessByChain sorts NUMA ascending; Fit walks from the end, so NUMA 1 is tried before NUMA 0.
    n = used(node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=1)), "GPU-0", 1, 8000)
    assert uuids(fit_pod(n, one(req()), policy=(GPUPolicy.NUMA, GPUPolicy.BINPACK))) == [("GPU-1",)]
    assert uuids(fit_pod(n, one(req()), policy=(GPUPolicy.BINPACK, GPUPolicy.NUMA))) == [("GPU-0",)]


@pytest.mark.parametrize("policy", [(GPUPolicy.SPREAD,), (GPUPolicy.BINPACK,), (GPUPolicy.TOPOLOGY_AWARE,)])
def test_equal_gpus_are_taken_from_the_end_of_the_list_and_listed_in_the_order_found(
    policy: tuple[GPUPolicy, ...],
) -> None:
    # HAMi's Fit walks the sorted GPUs from the end; equal GPUs keep inventory order (a stable sort).
    n = node_gpus(*(gpu_info(i) for i in range(4)))
    assert uuids(fit_pod(n, one(req()), policy=policy))[0] in (("GPU-3",), ("GPU-0",))
    if policy != (GPUPolicy.TOPOLOGY_AWARE,):  # topology-aware: the least-linked one, see below
        assert uuids(fit_pod(n, one(req()), policy=policy)) == [("GPU-3",)]
        assert uuids(fit_pod(n, one(req(nums=2)), policy=policy)) == [("GPU-3", "GPU-2")]
    assert uuids(fit_pod(n, one(req(nums=3)), policy=(GPUPolicy.SPREAD,))) == [("GPU-3", "GPU-2", "GPU-1")]


def test_equal_scores_are_broken_by_numa_node_then_inventory_order() -> None:
    # score ties sort NUMA ascending, so from the end: the highest NUMA node, then the last GPU.
    n = node_gpus(gpu_info(0, numa=1), gpu_info(1, numa=0), gpu_info(2, numa=1), gpu_info(3, numa=0))
    assert uuids(fit_pod(n, one(req(nums=2)), policy=(GPUPolicy.SPREAD,))) == [("GPU-2", "GPU-0")]
    assert uuids(fit_pod(n, one(req(nums=2)), policy=(GPUPolicy.BINPACK,))) == [("GPU-2", "GPU-0")]


def test_mutex_takes_idle_gpus_highest_numa_node_first() -> None:
    n = used(
        node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=1), gpu_info(2, numa=0), gpu_info(3, numa=1)),
        "GPU-3",
        1,
        1000,
    )
    assert uuids(fit_pod(n, one(req(nums=2)), policy=(GPUPolicy.MUTEX,))) == [("GPU-1", "GPU-2")]


def test_numa_bind_binpack_takes_the_lowest_numa_group_spread_the_highest() -> None:
    # HAMi's numa-bind sort: binpack = NUMA descending (walked from the end: NUMA 0 first), spread = NUMA
    # ascending (NUMA 1 first); the group order wins over the scores (GPU-2 on NUMA 1 is the busiest).
    n = used(
        node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=0), gpu_info(2, numa=1), gpu_info(3, numa=1)),
        "GPU-2",
        1,
        8000,
    )
    bind = DeviceSelector(numa_bind=True)
    binpack = fit_pod(n, one(req(nums=2)), selector=bind, policy=(GPUPolicy.BINPACK,))
    assert uuids(binpack) == [("GPU-1", "GPU-0")]
    spread = fit_pod(n, one(req(nums=2)), selector=bind, policy=(GPUPolicy.SPREAD,))
    assert uuids(spread) == [("GPU-3", "GPU-2")]
    # in a chain, NUMA goes first under numa-bind, and NUMA ascending is tried from the end
    chain = fit_pod(n, one(req(nums=2)), selector=bind, policy=(GPUPolicy.BINPACK, GPUPolicy.NUMA))
    assert uuids(chain) == [("GPU-2", "GPU-3")]


def test_numa_bind_fills_a_group_found_later_and_counts_the_abandoned_runs() -> None:
    # spread walks NUMA 1 (one free GPU), then NUMA 0 (two free): the NUMA 1 run is abandoned.
    n = used(
        node_gpus(gpu_info(0, numa=0), gpu_info(1, numa=0), gpu_info(2, numa=1), gpu_info(3, numa=1)),
        "GPU-3",
        1,
        16000,
    )
    got = fit_pod(n, one(req(nums=2)), selector=DeviceSelector(numa_bind=True))
    assert uuids(got) == [("GPU-1", "GPU-0")]
    n = used(n, "GPU-0", 1, 16000)
    got = failure(fit_pod(n, one(req(nums=2)), selector=DeviceSelector(numa_bind=True)))
    assert got.message == "1/4 AllocatedCardsInsufficientRequest, 1/4 NumaNotFit, 2/4 CardInsufficientMemory"


def test_reason_text_sorts_as_text_like_go() -> None:
    # "10/12" sorts before "2/12": HAMi's GenReason sorts the formatted strings.
    gpus = [gpu_info(i, type="NVIDIA-A100") for i in range(10)] + [
        gpu_info(i, devmem=1000) for i in range(10, 12)
    ]
    got = failure(fit_pod(node_gpus(*gpus), one(req(mem=2000)), selector=DeviceSelector(use_types=("T4",))))
    assert got.message == "10/12 CardTypeMismatch, 2/12 CardInsufficientMemory"


def test_a_container_asking_more_gpus_than_the_node_has_says_node_insufficient_device_without_counts() -> (
    None
):
    got = failure(fit_pod(TWO, one(req(nums=3))))
    assert (got.message, got.unresolvable) == ("NodeInsufficientDevice", True)
    # an earlier container that does not fit is what HAMi reports; the node stays unresolvable
    got = failure(fit_pod(TWO, [(req(mem=20000), True), (req(nums=3), False)]))
    assert (got.message, got.unresolvable, got.container) == ("2/2 CardInsufficientMemory", True, 0)


def test_topology_aware_picks_best_linked_set() -> None:
    pairs = [
        GPUPairScore.of("GPU-0", {"GPU-1": 10, "GPU-2": 10, "GPU-3": 10}),
        GPUPairScore.of("GPU-1", {"GPU-0": 10, "GPU-2": 200, "GPU-3": 10}),
        GPUPairScore.of("GPU-2", {"GPU-0": 10, "GPU-1": 200, "GPU-3": 10}),
        GPUPairScore.of("GPU-3", {"GPU-0": 10, "GPU-1": 10, "GPU-2": 10}),
    ]
    n = NodeGPUs.of("n1", [gpu_info(i) for i in range(4)], (), pairs)
    topo = (GPUPolicy.TOPOLOGY_AWARE,)
    # In the order found (walking from the end): GPU-2 before GPU-1.
    assert uuids(fit_pod(n, one(req(nums=2)), policy=topo)) == [("GPU-2", "GPU-1")]
    # One GPU: the least linked, keeping the good pair free; GPU-3 and GPU-0 tie, GPU-3 is found first.
    assert uuids(fit_pod(n, one(req(nums=1)), policy=topo)) == [("GPU-3",)]


# --- containers ------------------------------------------------------------------------------------------


def test_containers_share_gpus_but_not_within_a_container() -> None:
    n = node_gpus(gpu_info(0, count=2), gpu_info(1, count=2))
    got = fit_pod(n, [(req(nums=2), False), (req(nums=2), False)])
    assert [sorted(c) for c in uuids(got)] == [["GPU-0", "GPU-1"], ["GPU-0", "GPU-1"]]
    assert isinstance(fit_pod(n, [(req(nums=2), False)] * 3), FitFailure)


def test_second_container_sees_the_first() -> None:
    n = node_gpus(gpu_info(0))
    got = failure(fit_pod(n, [(req(mem=10000), False), (req(mem=10000), False)]))
    assert got.reasons == ((Reason.CARD_INSUFFICIENT_MEMORY, 1),)
    assert got.container == 1


def test_init_containers_fit_at_peak() -> None:
    n = node_gpus(gpu_info(0))
    got = fit_pod(n, [(req(mem=12000), True), (req(mem=10000), False), (None, False)])
    assert isinstance(got, Fit)
    assert uuids(got) == [("GPU-0",), ("GPU-0",), ()]
    held = peak(got.allocation, 1)
    assert held == (GPUSlice("GPU-0", 12000, 0),)
    assert with_slices(n, held).gpus[0].usedmem == 12000


def test_no_gpu_containers_fit_anywhere() -> None:
    assert uuids(fit_pod(NodeGPUs("empty"), [(None, False)])) == [()]
    assert uuids(fit_pod(TWO, [(None, True), (None, False)])) == [(), ()]


# --- quota -----------------------------------------------------------------------------------------------


def test_quota_rejects_per_gpu() -> None:
    asked: list[QuotaUsage] = []

    def limit(usage: QuotaUsage) -> bool:
        asked.append(usage)
        return usage.memory <= 1500

    got = failure(fit_pod(TWO, one(req(nums=2, mem=1000)), quota=limit))
    assert got.message == "1/2 AllocatedCardsInsufficientRequest, 1/2 ResourceQuotaNotFit"
    assert QuotaUsage(2000, 0) in asked
    assert isinstance(fit_pod(TWO, one(req(nums=1, mem=1000)), quota=limit), Fit)


def test_quota_counts_init_at_peak() -> None:
    def limit(usage: QuotaUsage) -> bool:
        return usage.memory <= 3000

    pod = [(req(mem=3000), True), (req(mem=1500), False), (req(mem=1500), False)]
    assert isinstance(fit_pod(TWO, pod, quota=limit), Fit)
    pod = [(req(mem=3001), True), (req(mem=1000), False)]
    assert isinstance(fit_pod(TWO, pod, quota=limit), FitFailure)


# --- properties ------------------------------------------------------------------------------------------

gpu_infos = st.builds(
    lambda i, count, mem, core, numa, health: gpu_info(
        i, count=count, devmem=mem, devcore=core, numa=numa, health=health
    ),
    st.just(0),
    st.integers(1, 4),
    st.integers(1000, 32000),
    st.sampled_from([100, 200]),
    st.integers(0, 1),
    st.booleans(),
)
nodes = st.lists(gpu_infos, min_size=1, max_size=5).map(
    lambda gs: NodeGPUs.of("n", [replace(g, id=f"GPU-{i}", index=i) for i, g in enumerate(gs)])
)
requests = st.builds(
    ContainerRequest,
    nums=st.integers(1, 3),
    memreq=st.integers(0, 20000),
    mem_percentage=st.one_of(st.none(), st.integers(1, 100)),
    coresreq=st.integers(0, 100),
).map(lambda r: r if r.memreq or r.mem_percentage else replace(r, mem_percentage=100))
pods = st.lists(st.tuples(st.one_of(st.none(), requests), st.booleans()), min_size=1, max_size=3).map(
    lambda cs: sorted(cs, key=lambda c: not c[1])
)
policies = st.lists(st.sampled_from(list(GPUPolicy)), min_size=1, max_size=2, unique=True)


def assert_within_limits(n: NodeGPUs) -> None:
    for g in n.gpus:
        assert 0 <= g.used <= g.info.count, g
        assert 0 <= g.usedmem <= g.info.devmem, g
        assert 0 <= g.usedcores <= g.info.devcore, g


def assert_rules(n: NodeGPUs, pod: list[tuple[ContainerRequest | None, bool]], fit: Fit) -> None:
    for (r, _), container in zip(pod, fit.allocation, strict=True):
        if r is None:
            assert not container.devices
            continue
        assert len(set(container.uuids)) == len(container.devices) == r.nums
        for s in container.devices:
            g = n.gpu(s.uuid)
            assert g is not None and g.healthy and not g.cordoned
            assert s.usedcores == r.coresreq and s.usedmem == r.memory_on(g.info.devmem)


def inits(pod: Sequence[tuple[ContainerRequest | None, bool]]) -> int:
    return sum(1 for _, init in pod if init)


@settings(max_examples=300, deadline=None)
@given(nodes, pods, policies, st.booleans())
def test_fit_never_overfills(
    n: NodeGPUs, pod: list[tuple[ContainerRequest | None, bool]], policy: list[GPUPolicy], numa: bool
) -> None:
    got = fit_pod(n, pod, policy=policy, selector=DeviceSelector(numa_bind=numa))
    if isinstance(got, FitFailure):
        assert got.reasons and all(count > 0 for _, count in got.reasons)
        return
    assert_rules(n, pod, got)
    assert_within_limits(with_slices(n, peak(got.allocation, inits(pod))))


@settings(max_examples=150, deadline=None)
@given(nodes, st.lists(st.tuples(pods, st.booleans()), min_size=1, max_size=12), policies)
def test_fits_and_releases_keep_invariants(
    n: NodeGPUs, steps: list[tuple[list[tuple[ContainerRequest | None, bool]], bool]], policy: list[GPUPolicy]
) -> None:
    placed: list[tuple[GPUSlice, ...]] = []
    state = n
    for pod, release in steps:
        if release and placed:
            state = without_slices(state, placed.pop(0))
        got = fit_pod(state, pod, policy=policy)
        if isinstance(got, Fit):
            held = peak(got.allocation, inits(pod))
            state = with_slices(state, held)
            placed.append(held)
        assert_within_limits(state)
    for held in placed:
        state = without_slices(state, held)
    assert state == n


def test_gpu_usage_accessors() -> None:
    g = GPUUsage(gpu_info(0), used=2, usedmem=1000, usedcores=30)
    assert (g.free_slots, g.free_mem, g.free_cores, g.healthy) == (8, 15000, 70, True)
    assert not replace(g, unhealthy=True).healthy
    assert with_slices(TWO, [GPUSlice("GPU-x", 1, 1)]) == TWO
