"""Which GPUs of one node a pod gets, HAMi's NVIDIA Fit (reference §4), pure.

Per container, every GPU is checked in HAMi's order and the first rule it breaks is its reason:
out of service (`CardNotHealth`, `CardCordoned`), `nvidia.com/use-gputype`/`nouse-gputype` and
`nvidia.com/vgpu-mode` (`CardTypeMismatch`), `use-gpuuuid`/`nouse-gpuuuid` (`CardUuidMismatch`), no free
slot (`CardTimeSlicingExhausted`), mutex policy on a used GPU (`ExclusiveDeviceAllocateConflict`), the
namespace quota (`ResourceQuotaNotFit`), free memory (`CardInsufficientMemory`), free cores
(`CardInsufficientCore`), 100 cores asked on a used GPU of 100 cores (`ExclusiveDeviceAllocateConflict`),
no cores asked on a GPU whose cores are all taken (`CardComputeUnitsExhausted`). With `numa-bind`, all GPUs
of a container must share a NUMA node (`NumaNotFit`). A node with fewer GPUs than a container asks for,
or fewer GPUs than asked that pass the static type/mode/UUID rules, can never fit: `NodeInsufficientDevice`
and `unresolvable`.

Containers are placed in kubelet's admission order: init containers, then regular ones (the
annotation's order), modelling what really runs together and kubelet's device reuse
(`hami_api.containers`). A container's GPUs are distinct. Each container is checked against the node's
usage plus the slices of the sidecars (restartable init containers) and regular containers placed
before it: a plain init container runs alone (beside the sidecars started before it), regular
containers run together and may share a GPU. Kubelet hands a container the devices earlier init
containers of the pod held before it takes new ones (`ReusePool`); such a container is placed on those
GPUs, so the GPU the scheduler accounts is the GPU kubelet records and the container sees. When that GPU
cannot take it, the pod is placed again with the GPU ruled out for the init container's new devices
(counted under the reason the later container got). When kubelet may take any few of more pooled
devices (an init container with more GPUs than a later one), the scheduler picks among them like
among free GPUs, and hami-node accepts a different pick only within the pod's footprint.

Order of the GPUs tried, from the GPU policy chain (earlier policies sort first, ties go to the next,
then NUMA node, then inventory order): binpack = busiest first, spread = idlest first (by
`score.gpu_score`, request included), numa = lowest NUMA node first, mutex = idle GPUs only,
topology-aware = of all fitting GPUs, the set with the highest summed pair score (one GPU: the one with
the lowest summed score to the others, keeping well-linked GPUs free).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import combinations
from math import comb

from hami_api.containers import ContainerKind, ReusePool, Token, kinds_of
from hami_api.resources import ContainerRequest
from hami_api.types import (
    ContainerAllocation,
    DeviceSelector,
    GPUPolicy,
    GPUSlice,
    PodAllocation,
    ScoringWeights,
)
from hami_control.quota import QuotaUsage
from hami_control.score import gpu_score
from hami_control.usage import GPUUsage, NodeGPUs, with_slices


class Reason(StrEnum):
    """HAMi's filter failure vocabulary."""

    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    NUMA_NOT_FIT = "NumaNotFit"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"


NO_SELECTOR = DeviceSelector()
DEFAULT_WEIGHTS = ScoringWeights()

QuotaCheck = Callable[[QuotaUsage], bool]
"""Whether the namespace can take a pod holding this much (its GPU memory and cores so far, candidate GPU
included, init containers at their peak). The caller closes over the namespace's limits and usage."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The chosen GPUs: one entry per container, init containers first (empty for a container without
    GPUs), ready for the allocation annotations."""

    allocation: PodAllocation


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why the pod does not fit the node: (reason, number of GPUs that failed for it), most frequent
    first; `gpus` is the node's GPU count; `unresolvable` when no change in usage can make it fit."""

    reasons: tuple[tuple[Reason, int], ...]
    gpus: int
    unresolvable: bool = False
    container: int = 0
    """Index (init containers first) of the container that did not fit."""

    @property
    def message(self) -> str:
        """HAMi's summary, e.g. "2/4 CardInsufficientMemory, 2/4 CardTypeMismatch"."""
        return ", ".join(f"{count}/{self.gpus} {reason.value}" for reason, count in self.reasons)


FitResult = Fit | FitFailure


@dataclass(frozen=True, slots=True)
class _Ask:
    request: ContainerRequest
    init: bool


def _static_reason(gpu: GPUUsage, selector: DeviceSelector) -> Reason | None:
    """Rules no change in usage can lift."""
    if not selector.type_allowed(gpu.info.type) or not selector.mode_allowed(gpu.info.mode):
        return Reason.CARD_TYPE_MISMATCH
    if not selector.uuid_allowed(gpu.id):
        return Reason.CARD_UUID_MISMATCH
    return None


def _reason(
    gpu: GPUUsage,
    request: ContainerRequest,
    selector: DeviceSelector,
    mutex: bool,
) -> Reason | None:
    """The first rule `gpu` breaks for one slice of `request`, in HAMi's order, or None."""
    if not gpu.healthy:
        return Reason.CARD_NOT_HEALTH
    if gpu.cordoned:
        return Reason.CARD_CORDONED
    static = _static_reason(gpu, selector)
    if static is not None:
        return static
    info = gpu.info
    if info.count <= gpu.used:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if mutex and gpu.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    mem = request.memory_on(info.devmem)
    if gpu.free_mem < mem:
        return Reason.CARD_INSUFFICIENT_MEMORY
    if gpu.free_cores < request.coresreq:
        return Reason.CARD_INSUFFICIENT_CORE
    if info.devcore == 100 and request.coresreq == 100 and gpu.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if request.coresreq == 0 and gpu.usedcores >= info.devcore > 0:
        return Reason.CARD_COMPUTE_UNITS_EXHAUSTED
    return None


def _order(
    gpus: Sequence[GPUUsage], request: ContainerRequest, policy: Sequence[GPUPolicy], weights: ScoringWeights
) -> list[GPUUsage]:
    """The GPUs in the order the policy chain tries them."""

    def key(gpu: GPUUsage) -> tuple[float, ...]:
        parts: list[float] = []
        for p in policy:
            if p is GPUPolicy.BINPACK:
                parts.append(-gpu_score(gpu, request, weights))
            elif p is GPUPolicy.SPREAD:
                parts.append(gpu_score(gpu, request, weights))
            elif p is GPUPolicy.NUMA:
                parts.append(gpu.info.numa)
            elif p is GPUPolicy.MUTEX:
                parts.append(1 if gpu.used else 0)
        parts.extend((gpu.info.numa, gpu.info.index))
        return tuple(parts)

    return sorted(gpus, key=key)


_MAX_COMBINATIONS = 20_000
"""Above this many candidate sets, topology-aware grows its set greedily instead of trying them all."""


def _topology_pick(
    node: NodeGPUs, fitting: Sequence[GPUUsage], nums: int, held: Sequence[GPUUsage] = ()
) -> list[GPUUsage]:
    """HAMi's topology-aware choice of `nums` GPUs among `fitting`; with `held` GPUs (reused ones the
    container already has), the completion best linked to them and among itself."""

    def total(group: Sequence[GPUUsage]) -> int:
        return sum(node.pair_score(a.id, b.id) for a, b in combinations((*held, *group), 2))

    if nums == 1 and not held:
        # The least-linked GPU, keeping well-linked ones for multi-GPU pods; ties keep policy order.
        best = min(fitting, key=lambda g: sum(node.pair_score(g.id, o.id) for o in fitting if o.id != g.id))
        return [best]
    if comb(len(fitting), nums) <= _MAX_COMBINATIONS:
        best_group = max(combinations(fitting, nums), key=total)  # first maximum: policy order on ties
        return list(best_group)
    chosen = list(held) if held else [fitting[0]]
    while len(chosen) < nums + len(held):
        rest = [g for g in fitting if g not in chosen]
        chosen.append(max(rest, key=lambda g: sum(node.pair_score(g.id, c.id) for c in chosen)))
    return chosen[len(held) :]


@dataclass(slots=True)
class _PodQuota:
    """The pod's quota usage while its containers are fitted: regular containers add up, init
    containers count at their peak (HAMi's fitQuota, with the pod's own earlier GPUs included)."""

    check: QuotaCheck
    regular: QuotaUsage = field(default_factory=QuotaUsage)
    init_peak: QuotaUsage = field(default_factory=QuotaUsage)

    def ok(self, container: QuotaUsage, init: bool) -> bool:
        """Whether the namespace can take the pod with `container` (its GPUs so far, candidate included)."""
        if init:
            regular = self.regular
            inits = QuotaUsage(
                max(self.init_peak.memory, container.memory), max(self.init_peak.cores, container.cores)
            )
        else:
            regular, inits = self.regular + container, self.init_peak
        usage = QuotaUsage(max(regular.memory, inits.memory), max(regular.cores, inits.cores))
        return self.check(usage)

    def add(self, container: QuotaUsage, init: bool) -> None:
        if init:
            self.init_peak = QuotaUsage(
                max(self.init_peak.memory, container.memory), max(self.init_peak.cores, container.cores)
            )
        else:
            self.regular += container


def _fit_container(
    node: NodeGPUs,
    ask: _Ask,
    selector: DeviceSelector,
    policy: Sequence[GPUPolicy],
    *,
    weights: ScoringWeights,
    quota: _PodQuota | None,
    held: Sequence[GPUUsage] = (),
    excluded: Mapping[str, Reason] | None = None,
) -> list[GPUUsage] | dict[Reason, int]:
    """The GPUs for one container's new devices, or the count of GPUs per reason. `held` are the GPUs
    it already has (devices kubelet reuses from earlier containers of the pod): they count towards its
    GPU count and are not tried again. `excluded` rules GPUs out for the new devices, with the reason."""
    request = ask.request
    needed = request.nums - len(held)
    reasons: dict[Reason, int] = {}
    fitting: list[GPUUsage] = []
    held_ids = {g.id for g in held}
    # this container's GPUs so far, for the quota (HAMi's fitQuota)
    taken = sum((QuotaUsage(request.memory_on(g.info.devmem), request.coresreq) for g in held), QuotaUsage())
    mutex = GPUPolicy.MUTEX in policy
    topology = GPUPolicy.TOPOLOGY_AWARE in policy
    numas = {g.info.numa for g in held}
    if selector.numa_bind and len(numas) > 1:
        return {Reason.NUMA_NOT_FIT: len(held)}
    greedy = not topology and not selector.numa_bind
    if needed <= 0:
        return []
    for gpu in _order(node.gpus, request, policy, weights):
        if gpu.id in held_ids:
            continue
        reason = excluded.get(gpu.id) if excluded else None
        if reason is None:
            reason = _reason(gpu, request, selector, mutex)
        if reason is None and quota is not None:
            here = taken + QuotaUsage(request.memory_on(gpu.info.devmem), request.coresreq)
            if not quota.ok(here, ask.init):
                reason = Reason.RESOURCE_QUOTA_NOT_FIT
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        fitting.append(gpu)
        if greedy:
            taken += QuotaUsage(request.memory_on(gpu.info.devmem), request.coresreq)
            if len(fitting) == needed:
                return fitting
    if selector.numa_bind:
        by_numa: dict[int, list[GPUUsage]] = {}
        for gpu in fitting:
            by_numa.setdefault(gpu.info.numa, []).append(gpu)
        groups = [  # in policy order of first GPU; the NUMA node of held GPUs when there are any
            g for numa, g in by_numa.items() if len(g) >= needed and (not numas or numa in numas)
        ]
        if not groups:
            if len(fitting) >= needed:
                reasons[Reason.NUMA_NOT_FIT] = len(fitting)
            fitting = []
        else:
            fitting = groups[0]
    if len(fitting) < needed:
        if not reasons:
            reasons[Reason.NODE_INSUFFICIENT_DEVICE] = len(node.gpus)
        return reasons
    chosen = _topology_pick(node, fitting, needed, held) if topology else fitting[:needed]
    if quota is not None and not greedy:
        mem = sum(request.memory_on(g.info.devmem) for g in (*held, *chosen))
        if not quota.ok(QuotaUsage(mem, request.coresreq * request.nums), ask.init):
            return {Reason.RESOURCE_QUOTA_NOT_FIT: len(chosen)}
    return chosen


def _slices(gpus: Sequence[GPUUsage], request: ContainerRequest) -> tuple[GPUSlice, ...]:
    return tuple(GPUSlice(g.id, request.memory_on(g.info.devmem), request.coresreq) for g in gpus)


def _failure(node: NodeGPUs, reasons: dict[Reason, int], unresolvable: bool, container: int) -> FitFailure:
    ranked = tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0].value)))
    return FitFailure(ranked, len(node.gpus), unresolvable, container)


@dataclass(frozen=True, slots=True)
class _Conflict:
    """Container `container` must reuse a device that container `creator` got new on `gpu`, and does not
    fit there: place again with `gpu` ruled out for `creator`'s new devices."""

    creator: int
    gpu: str
    reason: Reason
    container: int


def _held_reason(
    held: Sequence[GPUUsage],
    ask: _Ask,
    selector: DeviceSelector,
    policy: Sequence[GPUPolicy],
    quota: _PodQuota | None,
) -> tuple[int, Reason] | None:
    """The first GPU (index in `held`) a container cannot use for a device kubelet makes it reuse, and why."""
    request = ask.request
    mutex = GPUPolicy.MUTEX in policy
    taken = QuotaUsage()
    for i, gpu in enumerate(held):
        reason = _reason(gpu, request, selector, mutex)
        taken += QuotaUsage(request.memory_on(gpu.info.devmem), request.coresreq)
        if reason is None and quota is not None and not quota.ok(taken, ask.init):
            reason = Reason.RESOURCE_QUOTA_NOT_FIT
        if reason is not None:
            return i, reason
    if selector.numa_bind and len({g.info.numa for g in held}) > 1:
        return len(held) - 1, Reason.NUMA_NOT_FIT
    return None


def _place(
    node: NodeGPUs,
    asks: Sequence[_Ask | None],
    kinds: Sequence[ContainerKind],
    *,
    selector: DeviceSelector,
    policy: Sequence[GPUPolicy],
    weights: ScoringWeights,
    quota: QuotaCheck | None,
    excluded: Mapping[int, Mapping[str, Reason]],
) -> Fit | FitFailure | _Conflict:
    """One pass over the containers in kubelet's admission order (see `fit_pod`)."""
    pool = ReusePool()
    token_gpu: dict[Token, str] = {}
    pod_quota = None if quota is None else _PodQuota(quota)
    placed = node  # the node with the slices of the sidecars and app containers placed so far
    chosen: list[ContainerAllocation] = [ContainerAllocation() for _ in asks]
    for index, ask in enumerate(asks):
        if ask is None:
            continue
        request = ask.request
        by_id = {g.id: g for g in placed.gpus}
        offered, exact = pool.offer(request.nums)
        if exact:
            taken = offered
            held = [by_id[token_gpu[t]] for t in taken]
            bad = _held_reason(held, ask, selector, policy, pod_quota)
            if bad is not None:
                at, reason = bad
                return _Conflict(taken[at][0], held[at].id, reason, index)
        else:
            # Kubelet takes any `nums` of the pooled devices: choose which as for new devices. If it
            # takes others, hami-node accepts them only within the pod's footprint (see allocation.py).
            pooled = replace(placed, gpus=tuple(by_id[token_gpu[t]] for t in offered))
            got = _fit_container(pooled, ask, selector, policy, weights=weights, quota=pod_quota)
            if isinstance(got, dict):
                return _failure(node, got, False, index)
            picked = {g.id for g in got}
            taken = tuple(t for t in offered if token_gpu[t] in picked)
            held = [by_id[token_gpu[t]] for t in taken]
        new = _fit_container(
            placed,
            ask,
            selector,
            policy,
            weights=weights,
            quota=pod_quota,
            held=held,
            excluded=excluded.get(index),
        )
        if isinstance(new, dict):
            return _failure(node, new, False, index)
        slices = _slices((*held, *new), request)
        chosen[index] = ContainerAllocation(slices)
        for token, gpu in zip(pool.settle(index, kinds[index], taken, request.nums), new, strict=True):
            token_gpu[token] = gpu.id
        if pod_quota is not None:
            used = QuotaUsage(sum(s.usedmem for s in slices), sum(s.usedcores for s in slices))
            pod_quota.add(used, ask.init)
        if kinds[index].concurrent:
            placed = with_slices(placed, slices)
    return Fit(PodAllocation(tuple(chosen)))


def fit_pod(
    node: NodeGPUs,
    requests: Sequence[tuple[ContainerRequest | None, bool]],
    *,
    selector: DeviceSelector = NO_SELECTOR,
    policy: Sequence[GPUPolicy] = (GPUPolicy.SPREAD,),
    quota: QuotaCheck | None = None,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
    sidecars: Collection[int] = (),
) -> FitResult:
    """Fit a pod on `node`. `requests` has one (request or None, is init container) per container, init
    containers first (`hami_api.resources.pod_requests` order); `sidecars` are the indexes of the
    restartable init containers. `policy` is the GPU policy chain. The namespace quota is checked per
    GPU like HAMi (before memory and cores).

    Containers are placed in kubelet's admission order (the annotation's order), each against the node
    with the sidecars and app containers placed before it (what runs beside it). A container that
    kubelet makes reuse devices of earlier init containers (`hami_api.containers.ReusePool`) is placed
    on their GPUs; when such a GPU cannot take it, the pod is placed again with that GPU ruled out for
    the init container, so the scheduler's GPU is always the one kubelet records."""
    kinds = kinds_of([init for _, init in requests], sidecars)
    # The quota counts every init container at its peak, sidecars included (HAMi's fitQuota).
    asks = [None if r is None else _Ask(r, init) for r, init in requests]
    eligible = sum(1 for g in node.gpus if _static_reason(g, selector) is None)
    # Up front: a container asking more GPUs than the node could ever offer it.
    for index, ask in enumerate(asks):
        if ask is None:
            continue
        if len(node.gpus) < ask.request.nums:
            return _failure(node, {Reason.NODE_INSUFFICIENT_DEVICE: len(node.gpus)}, True, index)
        if eligible < ask.request.nums:
            reasons: dict[Reason, int] = {}
            for g in node.gpus:
                static = _static_reason(g, selector)
                if static is not None:
                    reasons[static] = reasons.get(static, 0) + 1
            return _failure(node, reasons, True, index)

    excluded: dict[int, dict[str, Reason]] = {}
    while True:  # each round rules out one more (container, GPU) pair, so it ends
        outcome = _place(
            node,
            asks,
            kinds,
            selector=selector,
            policy=policy,
            weights=weights,
            quota=quota,
            excluded=excluded,
        )
        if not isinstance(outcome, _Conflict):
            return outcome
        rules = excluded.setdefault(outcome.creator, {})
        if outcome.gpu in rules:  # cannot happen (the GPU was ruled out); never loop on it
            return _failure(node, {outcome.reason: 1}, False, outcome.container)
        rules[outcome.gpu] = outcome.reason


__all__ = ["Fit", "FitFailure", "FitResult", "QuotaCheck", "Reason", "fit_pod"]
