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

Containers: a container's GPUs are distinct. Regular containers are fitted one after the other, each
against the node's usage including the earlier containers of the pod, so they may share a GPU. Init
containers run one at a time before the regular ones, so each is fitted alone against the node's usage
without the pod (its peak, see `usage.peak_slices`).

Order of the GPUs tried, from the GPU policy chain (earlier policies sort first, ties go to the next,
then NUMA node, then inventory order): binpack = busiest first, spread = idlest first (by
`score.gpu_score`, request included), numa = lowest NUMA node first, mutex = idle GPUs only,
topology-aware = of all fitting GPUs, the set with the highest summed pair score (one GPU: the one with
the lowest summed score to the others, keeping well-linked GPUs free).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import combinations
from math import comb

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


def _topology_pick(node: NodeGPUs, fitting: Sequence[GPUUsage], nums: int) -> list[GPUUsage]:
    def total(group: Sequence[GPUUsage]) -> int:
        return sum(node.pair_score(a.id, b.id) for a, b in combinations(group, 2))

    if nums == 1:
        # The least-linked GPU, keeping well-linked ones for multi-GPU pods; ties keep policy order.
        best = min(fitting, key=lambda g: sum(node.pair_score(g.id, o.id) for o in fitting if o.id != g.id))
        return [best]
    if comb(len(fitting), nums) <= _MAX_COMBINATIONS:
        best_group = max(combinations(fitting, nums), key=total)  # first maximum: policy order on ties
        return list(best_group)
    chosen = [fitting[0]]
    while len(chosen) < nums:
        rest = [g for g in fitting if g not in chosen]
        chosen.append(max(rest, key=lambda g: sum(node.pair_score(g.id, c.id) for c in chosen)))
    return chosen


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
) -> list[GPUUsage] | dict[Reason, int]:
    """The GPUs for one container, or the count of GPUs per reason."""
    request = ask.request
    reasons: dict[Reason, int] = {}
    fitting: list[GPUUsage] = []
    taken = QuotaUsage()  # this container's GPUs so far, for the quota (HAMi's fitQuota)
    mutex = GPUPolicy.MUTEX in policy
    topology = GPUPolicy.TOPOLOGY_AWARE in policy
    greedy = not topology and not selector.numa_bind
    for gpu in _order(node.gpus, request, policy, weights):
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
            if len(fitting) == request.nums:
                return fitting
    if selector.numa_bind:
        by_numa: dict[int, list[GPUUsage]] = {}
        for gpu in fitting:
            by_numa.setdefault(gpu.info.numa, []).append(gpu)
        groups = [g for g in by_numa.values() if len(g) >= request.nums]  # in policy order of first GPU
        if not groups:
            if len(fitting) >= request.nums:
                reasons[Reason.NUMA_NOT_FIT] = len(fitting)
            fitting = []
        else:
            fitting = groups[0]
    if len(fitting) < request.nums:
        if not reasons:
            reasons[Reason.NODE_INSUFFICIENT_DEVICE] = len(node.gpus)
        return reasons
    chosen = _topology_pick(node, fitting, request.nums) if topology else fitting[: request.nums]
    if quota is not None and not greedy:
        mem = sum(request.memory_on(g.info.devmem) for g in chosen)
        if not quota.ok(QuotaUsage(mem, request.coresreq * len(chosen)), ask.init):
            return {Reason.RESOURCE_QUOTA_NOT_FIT: len(chosen)}
    return chosen


def _slices(gpus: Sequence[GPUUsage], request: ContainerRequest) -> tuple[GPUSlice, ...]:
    return tuple(GPUSlice(g.id, request.memory_on(g.info.devmem), request.coresreq) for g in gpus)


def _failure(node: NodeGPUs, reasons: dict[Reason, int], unresolvable: bool, container: int) -> FitFailure:
    ranked = tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0].value)))
    return FitFailure(ranked, len(node.gpus), unresolvable, container)


def fit_pod(
    node: NodeGPUs,
    requests: Sequence[tuple[ContainerRequest | None, bool]],
    *,
    selector: DeviceSelector = NO_SELECTOR,
    policy: Sequence[GPUPolicy] = (GPUPolicy.SPREAD,),
    quota: QuotaCheck | None = None,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
) -> FitResult:
    """Fit a pod on `node`. `requests` has one (request or None, is init container) per container, init
    containers first (`hami_api.resources.pod_requests` order). `policy` is the GPU policy chain.
    The namespace quota is checked per GPU like HAMi (before memory and cores)."""
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

    pod_quota = None if quota is None else _PodQuota(quota)
    placed = node
    chosen: list[ContainerAllocation] = [ContainerAllocation() for _ in asks]
    # Regular containers first (cumulative), then each init container alone against the bare node.
    order = [i for i, a in enumerate(asks) if a is not None and not a.init]
    order += [i for i, a in enumerate(asks) if a is not None and a.init]
    for index in order:
        ask = asks[index]
        assert ask is not None
        against = node if ask.init else placed
        got = _fit_container(against, ask, selector, policy, weights=weights, quota=pod_quota)
        if isinstance(got, dict):
            return _failure(node, got, False, index)
        slices = _slices(got, ask.request)
        chosen[index] = ContainerAllocation(slices)
        if pod_quota is not None:
            used = QuotaUsage(sum(s.usedmem for s in slices), sum(s.usedcores for s in slices))
            pod_quota.add(used, ask.init)
        if not ask.init:
            placed = with_slices(placed, slices)
    return Fit(PodAllocation(tuple(chosen)))


__all__ = ["Fit", "FitFailure", "FitResult", "QuotaCheck", "Reason", "fit_pod"]
