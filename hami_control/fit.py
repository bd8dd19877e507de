"""Which GPUs of one node a pod gets, HAMi's NVIDIA Fit (HAMi pkg/device/nvidia/device.go
`Fit`, pkg/scheduler/policy/gpu_policy.go `Less`, pkg/device/common/common.go `GenReason`), pure.

Per container, HAMi sorts the node's GPUs by the GPU policy and then walks the sorted list *from the
end*, so the GPU tried first is the last one in sort order; a multi-GPU container's GPUs are listed in
the order they were found. Every GPU is checked in HAMi's order and the first rule it breaks is its
reason: out of service (`CardNotHealth`, `CardCordoned`), `nvidia.com/use-gputype`/`nouse-gputype` and
`nvidia.com/vgpu-mode` (`CardTypeMismatch`), with `numa-bind` the NUMA grouping (below),
`use-gpuuuid`/`nouse-gpuuuid` (`CardUuidMismatch`), no free slot (`CardTimeSlicingExhausted`), mutex
policy on a used GPU (`ExclusiveDeviceAllocateConflict`), the namespace quota (`ResourceQuotaNotFit`),
free memory (`CardInsufficientMemory`), free cores (`CardInsufficientCore`), 100 cores asked on a used GPU
of 100 cores (`ExclusiveDeviceAllocateConflict`), no cores asked on a GPU whose cores are all taken
(`CardComputeUnitsExhausted`). The walk stops as soon as the container has its GPUs (topology-aware:
every GPU is walked, then the best set is picked). When it ends short, the GPUs found so far count as
`AllocatedCardsInsufficientRequest`. With `numa-bind`, the GPUs found form a run on one NUMA node: a GPU
on another NUMA node starts a new run, and the GPUs of the abandoned run count as `NumaNotFit`.

Sort (HAMi's `DeviceUsageList.Less`; Go's sort is an insertion sort, stable, up to 12 GPUs, so ties
keep the order the list had): one policy: binpack = by GPU score ascending then NUMA node ascending
(walked from the end: busiest first), spread (and any other single policy) = by score descending then
NUMA ascending (idlest first); mutex = by slots used descending then NUMA ascending (idle GPUs first);
with `numa-bind`, binpack = NUMA descending then score ascending, spread = NUMA ascending then score
descending. Fragmentation (ours, not HAMi's) = by the growth of the node's fragmentation for the task mix
with one slice of the request on the GPU (`frag.gpu_growth`), descending, then NUMA ascending (walked
from the end: the GPU whose use fragments the node least first); with `numa-bind`, NUMA as binpack.
A chain (`binpack,numa`, or `numa` alone): the binpack/spread/numa keys in the order
written (numa ascending; spread when none is named; numa first under `numa-bind`), then the GPU index.
A container's list starts as the previous regular container left it (HAMi sorts one copy of the node in
place for all of them); init containers start from inventory order (HAMi sorts a fresh copy for each).
The GPU score is `score.gpu_score` (HAMi's formula with the request counted, see `score`).

FailedNodes text (`FitFailure.message`): HAMi's GenReason, `<GPUs>/<node's GPUs> <Reason>` per reason,
sorted as text (so "10/16 X" comes before "2/16 Y"), joined by ", ", for the first container that does
not fit. A container asking more GPUs than the node has: `NodeInsufficientDevice`, no counts (HAMi
checks it before Fit). Unresolvable (no change in usage can help, `FitFailure.unresolvable`): a container
asks more GPUs than the node has, or than pass the type/mode/UUID rules.

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
among free GPUs, and hami-node accepts a different pick only within the pod's footprint. Under
`numa-bind`, the new GPUs of a container that holds reused ones must be on their NUMA node.

Dynamic MIG (HAMi v2.10, pkg/device/nvidia/device.go `Fit`, `CustomFilterRule`, `selectMigCandidate`,
`AddResourceUsage`; pkg/scheduler/score.go `isMIGRequest`): a GPU whose register `mode` is "mig" passes
every rule above and then needs a MIG profile for the request at a free placement: the container's
devices already found on that GPU are replayed first, then the request (`mig_alloc.replay_mig`), else
`CardMigTopologyInfeasible`. After a fit on a MIG GPU the same GPU is tried again (HAMi's `i++`), so one
container may take several MIG devices of one GPU; and a MIG request (`nvidia.com/vgpu-mode` absent or
naming mig, on a node with a MIG GPU) is not refused for asking more devices than the node has GPUs.
A MIG device holds the profile's memory and cores (its slice), and its profile and placement go to
`Fit.mig` (`hami.io/vgpu-mig-allocations`). Where we differ from HAMi, on purpose:
- 100 % of a MIG GPU (also what a pod with no memory request gets, `defaultMemory` 0) asks its
  largest profile's memory: the whole-GPU profile (7g.40gb on an A100-40GB). HAMi asks devmem x 100 %,
  more than any profile (7g.40gb is 40192 MiB of 40960), so such a pod never schedules. Other
  percentages are HAMi's (50 % of a GPU is half its memory, whatever its profiles).
- The namespace quota counts the profile's memory and cores (what the pod holds once placed), not the
  request.
- Every container's MIG placements stay taken for the later containers of the pod, a plain init
  container's included (its instance lives until the pod ends: hami-node destroys the instances no live
  pod holds); HAMi fits app containers on a copy without the init containers' placements, so an
  overlapping profile fails at Allocate.

Topology-aware (HAMi's computeWorstSingleCard / computeBestCombination over the GPUs found, in walk
order, first best on ties): one GPU = the one with the lowest summed pair score to the others found
(keeping well-linked GPUs free), several = the set with the highest summed pair score.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import combinations
from math import comb

from hami_api.containers import ContainerKind, ReusePool, Token, kinds_of
from hami_api.mig_alloc import MIG_MODE, MigAllocation, replay_mig
from hami_api.resources import ContainerRequest
from hami_api.types import (
    ContainerAllocation,
    DeviceSelector,
    GPUPolicy,
    GPUSlice,
    MigPlacement,
    MigProfile,
    PodAllocation,
    ScoringWeights,
)
from hami_control.devices.podfit import VendorFit
from hami_control.frag import DEFAULT_MIX, TaskMix, gpu_growth
from hami_control.quota import QuotaUsage
from hami_control.score import gpu_score
from hami_control.usage import GPUUsage, NodeGPUs, with_mig, with_slices


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
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"


NO_SELECTOR = DeviceSelector()
DEFAULT_WEIGHTS = ScoringWeights()

QuotaCheck = Callable[[QuotaUsage], bool]
"""Whether the namespace can take a pod holding this much (its GPU memory and cores so far, candidate GPU
included, init containers at their peak). The caller closes over the namespace's limits and usage."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The chosen GPUs: one entry per container, init containers first (empty for a container without
    GPUs), ready for the allocation annotations; `vendors`: the other vendors' devices, when the pod
    asks some (`hami_control.devices.podfit`)."""

    allocation: PodAllocation
    vendors: VendorFit | None = None
    mig: tuple[MigAllocation, ...] = ()
    """The MIG devices (profile and placement) of containers placed on mig-mode GPUs, in container then
    device order: what `hami.io/vgpu-mig-allocations` carries."""


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why the pod does not fit the node: (reason, number of GPUs that failed for it) in the order of
    HAMi's text; `gpus` is the node's GPU count; `unresolvable` when no change in usage can make it fit."""

    reasons: tuple[tuple[Reason, int], ...]
    gpus: int
    unresolvable: bool = False
    container: int = 0
    """Index (init containers first) of the container that did not fit."""
    text: str = ""
    """The text of a failure another vendor's Fit gave (HAMi's GenReason over its devices); "" for
    NVIDIA's, which `reasons` carries."""

    @property
    def message(self) -> str:
        """HAMi's summary, e.g. "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit", or
        "NodeInsufficientDevice" alone for a container asking more GPUs than the node has."""
        return self.text or reasons_text(self.reasons, self.gpus)


def reasons_text(reasons: Sequence[tuple[Reason, int]], gpus: int) -> str:
    """HAMi's GenReason: `<count>/<gpus> <Reason>` per reason, sorted as text, joined by ", "."""
    if not reasons or reasons[0][0] is Reason.NODE_INSUFFICIENT_DEVICE:
        return Reason.NODE_INSUFFICIENT_DEVICE.value
    return ", ".join(sorted(f"{count}/{gpus} {reason.value}" for reason, count in reasons))


FitResult = Fit | FitFailure


@dataclass(frozen=True, slots=True)
class _Ask:
    request: ContainerRequest
    init: bool


def _type_allowed(gpu: GPUUsage, selector: DeviceSelector) -> bool:
    """`nvidia.com/use-gputype`/`nouse-gputype` and `nvidia.com/vgpu-mode`."""
    return selector.type_allowed(gpu.info.type) and selector.mode_allowed(gpu.info.mode)


def _service_reason(gpu: GPUUsage, selector: DeviceSelector) -> Reason | None:
    """HAMi's first checks, before its NUMA grouping: health, cordon, type and mode."""
    if not gpu.healthy:
        return Reason.CARD_NOT_HEALTH
    if gpu.cordoned:
        return Reason.CARD_CORDONED
    if not _type_allowed(gpu, selector):
        return Reason.CARD_TYPE_MISMATCH
    return None


def _slot_reason(gpu: GPUUsage, selector: DeviceSelector, mutex: bool) -> Reason | None:
    """After the NUMA grouping, before the quota: UUID, free slot, mutex."""
    if not selector.uuid_allowed(gpu.id):
        return Reason.CARD_UUID_MISMATCH
    if gpu.info.count <= gpu.used:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if mutex and gpu.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    return None


def _capacity_reason(gpu: GPUUsage, request: ContainerRequest, mem: int | None = None) -> Reason | None:
    """After the quota: memory (`mem` MiB, default the request's on this GPU), cores, exclusivity, a GPU
    whose cores are all taken."""
    info = gpu.info
    if gpu.free_mem < (request.memory_on(info.devmem) if mem is None else mem):
        return Reason.CARD_INSUFFICIENT_MEMORY
    if gpu.free_cores < request.coresreq:
        return Reason.CARD_INSUFFICIENT_CORE
    if info.devcore == 100 and request.coresreq == 100 and gpu.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if request.coresreq == 0 and gpu.usedcores >= info.devcore > 0:
        return Reason.CARD_COMPUTE_UNITS_EXHAUSTED
    return None


def mig_memory(gpu: GPUUsage, request: ContainerRequest) -> int:
    """MiB a request asks of a MIG GPU: HAMi's memreq or percentage of the GPU's memory, with 100 % its
    largest profile's (the module note: the whole-GPU profile)."""
    mem = request.memory_on(gpu.info.devmem)
    if request.memreq == 0 and request.mem_percentage == 100 and gpu.info.mig_profiles:
        mem = min(mem, max(p.memory_mb for p in gpu.info.mig_profiles))
    return mem


def _mig_picks(gpu: GPUUsage, memories: Sequence[int]) -> list[tuple[MigProfile, MigPlacement]] | None:
    """HAMi's CustomFilterRule replay on a MIG GPU: each memory in turn over the placements in use."""
    return replay_mig(gpu.info.mig_profiles, gpu.mig_in_use, memories)


def _mig_take(gpu: GPUUsage, request: ContainerRequest, before: int) -> tuple[int | None, QuotaUsage, bool]:
    """For the request's next device on `gpu`, after `before` devices of the container already there: the
    MiB its memory rule checks (None: the request's own), what it takes (a MIG profile's memory and cores
    on a MIG GPU) and whether a MIG profile fits at a free placement (True on other GPUs)."""
    if not gpu.is_mig:
        return None, QuotaUsage(request.memory_on(gpu.info.devmem), request.coresreq), True
    mem = mig_memory(gpu, request)
    picks = _mig_picks(gpu, [mem] * (before + 1))
    if picks is None:
        return mem, QuotaUsage(mem, request.coresreq), False
    profile = picks[-1][0]
    return mem, QuotaUsage(profile.memory_mb, profile.core), True


def _mig_reason(fits: bool) -> Reason | None:
    """HAMi's CustomFilterRule verdict on a MIG GPU, its last rule."""
    return None if fits else Reason.CARD_MIG_TOPOLOGY_INFEASIBLE


def is_mig_request(node: NodeGPUs, selector: DeviceSelector) -> bool:
    """HAMi's isMIGRequest: the pod's `nvidia.com/vgpu-mode` is absent or names mig, and the node has a
    MIG GPU."""
    return node.has_mig and selector.mode_allowed(MIG_MODE)


_SORT_KEYS = (GPUPolicy.BINPACK, GPUPolicy.SPREAD, GPUPolicy.NUMA, GPUPolicy.FRAGMENTATION)


def _sort(
    gpus: Sequence[GPUUsage],
    request: ContainerRequest,
    policy: Sequence[GPUPolicy],
    weights: ScoringWeights,
    numa_bind: bool,
    *,
    node: NodeGPUs,
    mix: TaskMix,
) -> list[GPUUsage]:
    """HAMi's sort of the GPUs (gpu_policy.go `Less`, see the module note), stable over `gpus`' order.
    Fit walks the result from the end."""
    score = {g.id: gpu_score(g, request, weights) for g in gpus}
    less_growth: dict[str, float] = {}
    if GPUPolicy.FRAGMENTATION in policy:
        # Negated growth: sorted ascending and walked from the end, the least growth is tried first.
        growth = gpu_growth(node, gpus, request, mix)
        less_growth = {g.id: -float(x) for g, x in zip(gpus, growth, strict=True)}
    if tuple(policy) == (GPUPolicy.FRAGMENTATION,):
        score = less_growth
    if len(policy) <= 1 and tuple(policy) != (GPUPolicy.NUMA,):
        single = policy[0] if policy else GPUPolicy.SPREAD
        binpack = single in {GPUPolicy.BINPACK, GPUPolicy.FRAGMENTATION}
        if single is GPUPolicy.MUTEX:
            return sorted(gpus, key=lambda g: (-g.used, g.info.numa))
        if numa_bind:
            if binpack:
                return sorted(gpus, key=lambda g: (-g.info.numa, score[g.id]))
            return sorted(gpus, key=lambda g: (g.info.numa, -score[g.id]))
        if binpack:
            return sorted(gpus, key=lambda g: (score[g.id], g.info.numa))
        return sorted(gpus, key=lambda g: (-score[g.id], g.info.numa))
    chain = [p for p in policy if p in _SORT_KEYS] or [GPUPolicy.SPREAD]
    if numa_bind and chain[0] is not GPUPolicy.NUMA:
        chain = [GPUPolicy.NUMA, *(p for p in chain if p is not GPUPolicy.NUMA)]

    def key(gpu: GPUUsage) -> tuple[float, ...]:
        parts: list[float] = []
        for p in chain:
            if p is GPUPolicy.FRAGMENTATION:
                parts.append(less_growth[gpu.id])
            elif p is GPUPolicy.BINPACK:
                parts.append(score[gpu.id])
            elif p is GPUPolicy.SPREAD:
                parts.append(-score[gpu.id])
            else:
                parts.append(gpu.info.numa)
        parts.append(gpu.info.index)
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
    walk: Sequence[GPUUsage],
    ask: _Ask,
    selector: DeviceSelector,
    policy: Sequence[GPUPolicy],
    *,
    node: NodeGPUs,
    quota: _PodQuota | None,
    held: Sequence[GPUUsage] = (),
    excluded: Mapping[str, Reason] | None = None,
) -> list[GPUUsage] | dict[Reason, int]:
    """HAMi's Fit loop for one container's new devices over `walk` (the GPUs in the order tried): the
    GPUs, or the count of GPUs per reason. `held` are the GPUs it already has (devices kubelet reuses
    from earlier containers of the pod): they count towards its GPU count and are not tried again.
    `excluded` rules GPUs out for the new devices, with the reason."""
    request = ask.request
    needed = request.nums - len(held)
    if needed <= 0:
        return []
    reasons: dict[Reason, int] = {}
    held_ids = {g.id for g in held}
    mutex = GPUPolicy.MUTEX in policy
    topology = GPUPolicy.TOPOLOGY_AWARE in policy
    numa_bind = selector.numa_bind
    held_numas = {g.info.numa for g in held}
    if numa_bind and len(held_numas) > 1:
        return {Reason.NUMA_NOT_FIT: len(held)}
    run_numa = next(iter(held_numas)) if held_numas else None
    found: list[GPUUsage] = []
    taken: list[QuotaUsage] = []
    """Per GPU found, what it takes (the request's memory and cores, a MIG profile's on a MIG GPU)."""
    held_take = [QuotaUsage(request.memory_on(g.info.devmem), request.coresreq) for g in held]

    def with_gpu(take: QuotaUsage) -> QuotaUsage:
        """This container's GPUs so far and the candidate (HAMi's fitQuota counts the GPUs found so far)."""
        total = QuotaUsage()
        for part in (*held_take, *taken, take):
            total += part
        return total

    at = 0
    while at < len(walk):
        gpu = walk[at]
        at += 1
        if gpu.id in held_ids:
            continue
        reason = excluded.get(gpu.id) if excluded else None
        if reason is None:
            reason = _service_reason(gpu, selector)
        if reason is None and numa_bind and gpu.info.numa != run_numa:
            if held:
                reason = Reason.NUMA_NOT_FIT  # the new GPUs must join the reused ones' NUMA node
            else:  # HAMi: a GPU on another NUMA node starts a new run
                if found and not topology:
                    reasons[Reason.NUMA_NOT_FIT] = reasons.get(Reason.NUMA_NOT_FIT, 0) + len(found)
                found = []
                taken = []
                run_numa = gpu.info.numa
        if reason is None:
            reason = _slot_reason(gpu, selector, mutex)
        mem, take, mig_ok = _mig_take(gpu, request, sum(1 for g in found if g.id == gpu.id))
        if reason is None and quota is not None and not quota.ok(with_gpu(take), ask.init):
            reason = Reason.RESOURCE_QUOTA_NOT_FIT
        if reason is None:
            reason = _capacity_reason(gpu, request, mem) or _mig_reason(mig_ok)
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        found.append(gpu)
        taken.append(take)
        if not topology and len(found) == needed:
            return found
        if gpu.is_mig:
            at -= 1  # HAMi's `i++` after a fit on a MIG GPU: the same GPU is tried again
    if topology and len(found) >= needed:
        return found if len(found) == needed else _topology_pick(node, found, needed, held)
    if found:
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
    if not reasons:
        reasons[Reason.NODE_INSUFFICIENT_DEVICE] = len(node.gpus)
    return reasons


def _devices(
    gpus: Sequence[GPUUsage], request: ContainerRequest, container: int
) -> tuple[tuple[GPUSlice, ...], tuple[MigAllocation, ...]]:
    """A container's slices on `gpus` (in order) and its MIG devices: on a MIG GPU the profile HAMi's
    AddResourceUsage picks (its memory and cores), replayed over the placements in use and the
    container's earlier devices on that GPU."""
    slices: list[GPUSlice] = []
    mig: list[MigAllocation] = []
    on_gpu: dict[str, list[int]] = {}
    for device, g in enumerate(gpus):
        if not g.is_mig:
            slices.append(GPUSlice(g.id, request.memory_on(g.info.devmem), request.coresreq))
            continue
        memories = on_gpu.setdefault(g.id, [])
        memories.append(mig_memory(g, request))
        picks = _mig_picks(g, memories)
        if picks is None:  # cannot happen: fit checked this very replay
            raise AssertionError(f"MIG replay on {g.id} no longer fits {memories}")
        profile, placement = picks[-1]
        slices.append(GPUSlice(g.id, profile.memory_mb, profile.core))
        mig.append(MigAllocation(container, device, g.id, profile.name, placement))
    return tuple(slices), tuple(mig)


def _failure(node: NodeGPUs, reasons: dict[Reason, int], unresolvable: bool, container: int) -> FitFailure:
    gpus = len(node.gpus)
    ranked = tuple(sorted(reasons.items(), key=lambda item: f"{item[1]}/{gpus} {item[0].value}"))
    return FitFailure(ranked, gpus, unresolvable, container)


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
    """The first GPU (index in `held`) a container cannot use for a device kubelet makes it reuse, and why
    (the rules in Fit's order)."""
    request = ask.request
    mutex = GPUPolicy.MUTEX in policy
    taken = QuotaUsage()
    for i, gpu in enumerate(held):
        mem, take, mig_ok = _mig_take(gpu, request, sum(1 for g in held[:i] if g.id == gpu.id))
        taken += take
        reason = _service_reason(gpu, selector) or _slot_reason(gpu, selector, mutex)
        if reason is None and quota is not None and not quota.ok(taken, ask.init):
            reason = Reason.RESOURCE_QUOTA_NOT_FIT
        if reason is None:
            reason = _capacity_reason(gpu, request, mem) or _mig_reason(mig_ok)
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
    mix: TaskMix,
) -> Fit | FitFailure | _Conflict:
    """One pass over the containers in kubelet's admission order (see `fit_pod`)."""
    pool = ReusePool()
    token_gpu: dict[Token, str] = {}
    pod_quota = None if quota is None else _PodQuota(quota)
    placed = node  # the node with the slices of the sidecars and app containers placed so far
    chosen: list[ContainerAllocation] = [ContainerAllocation() for _ in asks]
    mig: list[MigAllocation] = []
    mig_request = is_mig_request(node, selector)
    inventory = tuple(g.id for g in node.gpus)
    app_order = inventory  # HAMi sorts one copy of the node in place for all regular containers
    for index, ask in enumerate(asks):
        if ask is None:
            continue
        request = ask.request
        if request.nums > len(node.gpus) and not mig_request:  # HAMi's fitInDevices, before Fit
            return _failure(node, {Reason.NODE_INSUFFICIENT_DEVICE: len(node.gpus)}, True, index)
        by_id = {g.id: g for g in placed.gpus}
        regular = kinds[index] is ContainerKind.APP
        ranked = _sort(
            [by_id[i] for i in (app_order if regular else inventory)],
            request,
            policy,
            weights,
            selector.numa_bind,
            node=placed,
            mix=mix,
        )
        if regular:
            app_order = tuple(g.id for g in ranked)
        walk = ranked[::-1]
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
            pooled = {token_gpu[t] for t in offered}
            got = _fit_container(
                [g for g in walk if g.id in pooled], ask, selector, policy, node=placed, quota=pod_quota
            )
            if isinstance(got, dict):
                return _failure(node, got, False, index)
            picked = [g.id for g in got]
            chosen_tokens: list[Token] = []
            for gpu_id in picked:
                chosen_tokens.append(
                    next(t for t in offered if token_gpu[t] == gpu_id and t not in chosen_tokens)
                )
            taken = tuple(chosen_tokens)
            held = list(got)
        new = _fit_container(
            walk,
            ask,
            selector,
            policy,
            node=placed,
            quota=pod_quota,
            held=held,
            excluded=excluded.get(index),
        )
        if isinstance(new, dict):
            return _failure(node, new, False, index)
        slices, devices = _devices((*held, *new), request, index)
        chosen[index] = ContainerAllocation(slices)
        if devices:
            mig.extend(devices)
            # A MIG instance lives as long as the pod: later containers never overlap it (module note).
            placed = with_mig(placed, ((d.gpu_uuid, d.placement) for d in devices))
        for token, gpu in zip(pool.settle(index, kinds[index], taken, request.nums), new, strict=True):
            token_gpu[token] = gpu.id
        if pod_quota is not None:
            used = QuotaUsage(sum(s.usedmem for s in slices), sum(s.usedcores for s in slices))
            pod_quota.add(used, ask.init)
        if kinds[index].concurrent:
            placed = with_slices(placed, slices)
    return Fit(PodAllocation(tuple(chosen)), mig=tuple(mig))


def fit_pod(
    node: NodeGPUs,
    requests: Sequence[tuple[ContainerRequest | None, bool]],
    *,
    selector: DeviceSelector = NO_SELECTOR,
    policy: Sequence[GPUPolicy] = (GPUPolicy.SPREAD,),
    quota: QuotaCheck | None = None,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
    sidecars: Collection[int] = (),
    mix: TaskMix = DEFAULT_MIX,
) -> FitResult:
    """Fit a pod on `node`. `requests` has one (request or None, is init container) per container, init
    containers first (`hami_api.resources.pod_requests` order); `sidecars` are the indexes of the
    restartable init containers. `policy` is the GPU policy chain (`mix`: the task mix of the
    fragmentation GPU policy). The namespace quota is checked per
    GPU like HAMi (before memory and cores).

    Containers are placed in kubelet's admission order (the annotation's order), each against the node
    with the sidecars and app containers placed before it (what runs beside it). A container that
    kubelet makes reuse devices of earlier init containers (`hami_api.containers.ReusePool`) is placed
    on their GPUs; when such a GPU cannot take it, the pod is placed again with that GPU ruled out for
    the init container, so the scheduler's GPU is always the one kubelet records. The reasons are those
    of the first container that does not fit, as HAMi reports them."""
    kinds = kinds_of([init for _, init in requests], sidecars)
    # The quota counts every init container at its peak, sidecars included (HAMi's fitQuota).
    asks = [None if r is None else _Ask(r, init) for r, init in requests]
    # GPUs no change in usage can rule out for the pod (type, mode, UUID).
    eligible = sum(1 for g in node.gpus if _type_allowed(g, selector) and selector.uuid_allowed(g.id))
    # No change in usage helps a container asking more GPUs than the node has, or than pass its rules.
    unresolvable = any(a is not None and a.request.nums > eligible for a in asks)
    if is_mig_request(node, selector):  # several MIG devices of one GPU: only no eligible GPU is final
        unresolvable = eligible == 0 and any(a is not None for a in asks)
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
            mix=mix,
        )
        if isinstance(outcome, FitFailure):
            return replace(outcome, unresolvable=unresolvable)
        if isinstance(outcome, Fit):
            return outcome
        rules = excluded.setdefault(outcome.creator, {})
        if outcome.gpu in rules:  # cannot happen (the GPU was ruled out); never loop on it
            return _failure(node, {outcome.reason: 1}, unresolvable, outcome.container)
        rules[outcome.gpu] = outcome.reason


__all__ = [
    "Fit",
    "FitFailure",
    "FitResult",
    "QuotaCheck",
    "Reason",
    "fit_pod",
    "is_mig_request",
    "mig_memory",
    "reasons_text",
]
