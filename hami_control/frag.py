"""GPU fragmentation relative to a workload's task mix, and the fragmentation-gradient-descent choice. Pure.

The measure is the one of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC'23, section 4; the authors' simulator computes it in
hkust-adsl/kubernetes-scheduler-simulator pkg/utils/frag.go `NodeGpuShareFragAmount`). GPU amounts are in
milli-GPUs (1000 = one whole GPU). For a node with free amounts f_g on its GPUs and one task type m
(`milli` of each of `gpus` GPUs, optionally CPU, memory and the GPU models it accepts):

- the node cannot host m (a model m does not accept, too little CPU or memory, fewer than `gpus` GPUs with
  f_g >= milli): every free milli of the node is a fragment, F_n(m) = sum_g f_g;
- it can: the GPUs that cannot hold m's share are the fragments, F_n(m) = sum over f_g < milli of f_g.

The node's fragmentation for the mix M is the expected fragment of a task drawn from it,
F_n(M) = sum_m p_m F_n(m), and the cluster's the sum over its nodes. FGD places a task on the node and GPUs
where F_n(M) grows least. The paper's mix also holds CPU-only tasks, for which every free GPU milli is a
fragment whatever the node does; their term moves by the same amount for every placement of a GPU task
(and not at all for a CPU-only one), so the mixes here leave them out of F_n(M) and keep only their share
(`TaskMix.cpu_share`), which the simulator's whole-number score does feel (`simulator_score`).

A GPU's free amount, as hami-control accounts GPUs (`free_milli`): 0 when it is out of service or has no
free slot, else the smaller of its free cores and its free memory as shares of the whole GPU.

The extender learns its mix from the GPU pods it observes (`frag_mix`, `--fragmentation-mix observed`)
with `DEFAULT_MIX` as the prior, or uses a configured one: `DEFAULT_MIX` is the GPU task mix of
Alibaba's OpenB production trace (the most common shapes covering 95% of its GPU tasks, the
simulator's `GetTypicalPods` rule). `hami-sim plan` learns the mix of the workload it replays
(`mix_from_tasks`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity
from hami_api.resources import ContainerRequest
from hami_control.usage import GPUUsage, NodeGPUs

MILLI = 1000
"""Milli-GPUs of one whole GPU."""
POPULARITY = 0.95
"""`mix_from_tasks` keeps the most common task shapes covering this share of the tasks (the simulator's
DefaultTypicalPodPopularityThreshold)."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class MixError(ValueError):
    """A task mix that cannot be used; the message names the entry and the value."""


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """One task type of a mix: `milli` of each of `gpus` GPUs (`milli` 1000 when `gpus` > 1), the CPU
    (milli-cores) and memory (MiB) it needs on the node (0: not checked) and the GPU models it accepts
    (empty: any)."""

    gpus: int
    milli: int
    cpu_milli: int = 0
    memory_mib: int = 0
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise MixError(f"task shape: gpus must be at least 1, got {self.gpus}")
        if not 0 < self.milli <= MILLI:
            raise MixError(f"task shape: milli must be 1..{MILLI}, got {self.milli}")
        if self.gpus > 1 and self.milli != MILLI:
            raise MixError(f"task shape: a task of {self.gpus} GPUs takes whole GPUs, got milli {self.milli}")


@dataclass(frozen=True, slots=True)
class TaskMix:
    """Task shapes and their probabilities (normalised, summing to 1). A value: equal mixes score alike.

    `cpu_share`: the share of CPU-only tasks in the workload's typical tasks as the paper's simulator
    counts them (0 for a configured mix). They do not change F_n(M) here (see the module note), only
    `simulator_score`."""

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]
    cpu_share: float = 0.0

    def __post_init__(self) -> None:
        if not self.shapes or len(self.shapes) != len(self.weights):
            raise MixError("task mix: needs at least one shape, with one weight each")
        if any(w <= 0 for w in self.weights):
            raise MixError(f"task mix: weights must be positive, got {list(self.weights)}")
        if not 0 <= self.cpu_share < 1:
            raise MixError(f"task mix: the CPU-only share must be 0 to under 1, got {self.cpu_share}")

    @staticmethod
    def of(counts: Iterable[tuple[TaskShape, float]], cpu_only: float = 0.0) -> TaskMix:
        """A mix from (shape, count or weight) pairs, merged per shape and normalised; ordered by weight
        (heaviest first, then by shape) so that equal inputs give equal mixes. `cpu_only`: the count of
        CPU-only tasks beside them (`cpu_share`)."""
        merged: dict[TaskShape, float] = {}
        for shape, weight in counts:
            merged[shape] = merged.get(shape, 0.0) + weight
        ordered = sorted(merged.items(), key=lambda item: (-item[1], item[0]))
        total = sum(w for _, w in ordered)
        if total <= 0:
            raise MixError("task mix: no task shape with a positive weight")
        share = cpu_only / (total + cpu_only) if cpu_only > 0 else 0.0
        return TaskMix(tuple(s for s, _ in ordered), tuple(w / total for _, w in ordered), share)

    def text(self) -> str:
        """The `parse_mix` form (weights as percentages; a shape's CPU as `/Nm`)."""
        return ",".join(
            f"{f'{s.gpus}x' if s.gpus > 1 else ''}{s.milli}{f'/{s.cpu_milli}m' if s.cpu_milli else ''}"
            f":{100 * w:.4g}"
            for s, w in zip(self.shapes, self.weights, strict=True)
        )


def parse_mix(text: str) -> TaskMix:
    """`[Nx]MILLI[/CPU]:WEIGHT,...`, e.g. `1000:48,810:13,470:9,2x1000:3`: a task of MILLI milli-GPUs (N
    whole GPUs with `Nx1000`) drawn with relative weight WEIGHT; `/CPU` (a quantity of cores, `4` or
    `500m`) the CPU its pod asks, which only `--fragmentation-filter best` measures. Raises `MixError`
    naming the entry."""
    pairs: list[tuple[TaskShape, float]] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        where = f"task mix entry {i + 1} {part!r}"
        shape_text, sep, weight_text = part.partition(":")
        if not sep:
            raise MixError(f"{where}: expected [Nx]MILLI:WEIGHT")
        shape_text, slash, cpu_text = shape_text.partition("/")
        cpu = 0
        if slash:
            try:
                cpu = math.ceil(parse_quantity(cpu_text.strip()) * MILLI)
            except (QuantityError, ValueError):
                raise MixError(f"{where}: CPU {cpu_text.strip()!r} is not a quantity of cores") from None
            if cpu < 0:
                raise MixError(f"{where}: CPU must not be negative, got {cpu_text.strip()!r}")
        count_text, x, milli_text = shape_text.strip().rpartition("x")
        try:
            gpus = int(count_text) if x else 1
            milli = int(milli_text)
            weight = float(weight_text)
        except ValueError:
            raise MixError(f"{where}: expected whole numbers N and MILLI and a number WEIGHT") from None
        if not weight > 0:
            raise MixError(f"{where}: the weight must be positive, got {weight_text.strip()!r}")
        try:
            pairs.append((TaskShape(gpus, milli, cpu), weight))
        except MixError as err:
            raise MixError(f"{where}: {err}") from None
    return TaskMix.of(pairs)


DEFAULT_MIX_TEXT = "1000:3911,810:1078,470:750,320:328,650:253,230:140,460:128,590:75,160:74"
"""The GPU tasks of OpenB's default trace (openb_pod_list_default.csv), by count: the shapes covering 95%."""
DEFAULT_MIX = parse_mix(DEFAULT_MIX_TEXT)


def mix_from_tasks(
    shapes: Iterable[TaskShape], popularity: float = POPULARITY, cpu_only: Iterable[int] = ()
) -> TaskMix:
    """The mix of a workload (one shape per GPU task): the most common shapes covering `popularity` of the
    tasks, renormalised (the simulator's `GetTypicalPods`, pkg/utils/frag.go).

    `cpu_only`: the CPU (milli-cores) of each task that asks no GPU. The simulator counts those tasks too,
    each CPU size a shape of its own (`typicalPodsConfig.isInvolvedCpuPods`, true in the paper's runs:
    scripts/generate_config_and_run.py), so they take part in the popularity cut; the mix keeps only their
    share (`TaskMix.cpu_share`; see the module note). The cut goes on past `popularity` until it holds a
    GPU shape."""
    counts: Counter[tuple[int, int, int, int, tuple[str, ...]]] = Counter(
        (s.gpus, s.milli, s.cpu_milli, s.memory_mib, s.models) for s in shapes
    )
    if not counts:
        raise MixError("task mix: the workload has no GPU task")
    counts.update((0, 0, cpu, 0, ()) for cpu in cpu_only)
    total = sum(counts.values())
    kept: list[tuple[TaskShape, float]] = []
    covered = 0
    kept_cpu = 0
    for key, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if covered >= popularity * total and kept:
            break
        if key[0] > 0:
            kept.append((TaskShape(*key), n))
        else:
            kept_cpu += n
        covered += n
    return TaskMix.of(kept, kept_cpu)


@dataclass(frozen=True, slots=True)
class MixArrays:
    """A mix as arrays over its T shapes."""

    milli: IntArray
    gpus: IntArray
    p: FloatArray
    cpu: IntArray
    memory: IntArray


@lru_cache(maxsize=16)
def arrays(mix: TaskMix) -> MixArrays:
    shapes = mix.shapes
    return MixArrays(
        np.array([s.milli for s in shapes], dtype=np.int64),
        np.array([s.gpus for s in shapes], dtype=np.int64),
        np.array(mix.weights, dtype=np.float64),
        np.array([s.cpu_milli for s in shapes], dtype=np.int64),
        np.array([s.memory_mib for s in shapes], dtype=np.int64),
    )


# --- free amounts -----------------------------------------------------------------------------------------


def free_milli_arrays(  # noqa: PLR0917 (the columns of a GPU table, named)
    count: IntArray,
    used: IntArray,
    devmem: IntArray,
    usedmem: IntArray,
    devcore: IntArray,
    usedcores: IntArray,
    in_service: BoolArray,
) -> IntArray:
    """Per GPU, the milli-GPUs free (see the module note), over arrays of any shape."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cores = np.where(devcore > 0, (devcore - usedcores) * MILLI // np.maximum(devcore, 1), MILLI)
        mem = np.where(devmem > 0, (devmem - usedmem) * MILLI // np.maximum(devmem, 1), MILLI)
    free = np.clip(np.minimum(cores, mem), 0, MILLI)
    return np.where(in_service & (used < count), free, 0).astype(np.int64)


def gpu_free_milli(gpu: GPUUsage) -> int:
    """One GPU's free milli-GPUs (`free_milli_arrays` for one GPU)."""
    if not gpu.healthy or gpu.cordoned or gpu.used >= gpu.info.count:
        return 0
    info = gpu.info
    cores = (info.devcore - gpu.usedcores) * MILLI // info.devcore if info.devcore > 0 else MILLI
    mem = (info.devmem - gpu.usedmem) * MILLI // info.devmem if info.devmem > 0 else MILLI
    return max(0, min(cores, mem, MILLI))


def node_free(node: NodeGPUs) -> IntArray:
    return np.array([gpu_free_milli(g) for g in node.gpus], dtype=np.int64)


# --- the measure ------------------------------------------------------------------------------------------


def shape_terms(free: IntArray, mix: MixArrays) -> tuple[IntArray, IntArray]:
    """For free amounts `(..., W)`: per shape `(..., T)`, the milli on GPUs too small for its share
    (`small`) and how many GPUs can hold its share (`holding`)."""
    f = free[..., :, None]
    too_small = f < mix.milli
    small = np.where(too_small, f, 0).sum(axis=-2)
    holding = np.count_nonzero(~too_small, axis=-2)
    return small.astype(np.int64), holding.astype(np.int64)


def combine(
    small: IntArray, holding: IntArray, total: IntArray, mix: MixArrays, host_ok: BoolArray | None = None
) -> FloatArray:
    """F_n(M) from `shape_terms` and the total free milli `(...)`; `host_ok` `(..., T)` says per shape
    whether the node's model, CPU and memory accept it (None: yes)."""
    fits = holding >= mix.gpus
    if host_ok is not None:
        fits = fits & host_ok
    return _expected(np.where(fits, small, total[..., None]), mix)


def _expected(per_shape: IntArray, mix: MixArrays) -> FloatArray:
    """sum_m p_m F(m) over the last axis; a per-row sum, so every row gets the same float operations
    whatever the leading shape (the extender's vectorised scores equal the node-by-node ones)."""
    result: FloatArray = (per_shape * mix.p).sum(axis=-1)
    return result


def after_change(  # noqa: PLR0917 (the node's terms and the change, named)
    small: IntArray,
    holding: IntArray,
    total: IntArray,
    was: IntArray,
    now: IntArray,
    mix: TaskMix,
    host_ok: BoolArray | None = None,
) -> FloatArray:
    """F_n(M) after one GPU's free amount goes from `was` to `now` `(...)`, from the node's `shape_terms`
    `(..., T)` and total free `(...)` before (shapes broadcast)."""
    a = arrays(mix)
    f, nf = was[..., None], now[..., None]
    small2 = small - np.where(f < a.milli, f, 0) + np.where(nf < a.milli, nf, 0)
    holding2 = holding - (f >= a.milli) + (nf >= a.milli)
    fits = holding2 >= a.gpus
    if host_ok is not None:
        fits = fits & host_ok
    return _expected(np.where(fits, small2, (total - was + now)[..., None]), a)


def after_each_gpu(
    free: IntArray, newfree: IntArray, mix: TaskMix, host_ok: BoolArray | None = None
) -> FloatArray:
    """For free amounts `(N, W)`: F_n(M) `(N, W)` with GPU g's free amount replaced by `newfree[:, g]`
    (one slice more on g)."""
    small, holding = shape_terms(free, arrays(mix))
    host = None if host_ok is None else host_ok[:, None, :]
    total = free.sum(axis=-1)[:, None]
    return after_change(small[:, None, :], holding[:, None, :], total, free, newfree, mix, host)


def fragmentation(free: IntArray, mix: TaskMix, host_ok: BoolArray | None = None) -> FloatArray:
    """F_n(M) in milli-GPUs for free amounts `(..., W)` (GPUs past a node's last count as 0 free)."""
    a = arrays(mix)
    small, holding = shape_terms(free, a)
    return combine(small, holding, free.sum(axis=-1), a, host_ok)


def least_growth(  # noqa: PLR0917 (the candidates' GPUs, the ask and the hosts, named)
    free: IntArray,
    newfree: IntArray,
    passing: BoolArray,
    nums: int,
    mix: TaskMix,
    cpu_free: IntArray,
    cpu_asked: int,
) -> FloatArray:
    """Per node `(N,)`: the least growth of F_n(M) (milli-GPUs, rounded to 1e-6) that a pod of `nums` GPUs
    causes, with CPU in the measure: a shape counts as hosted only where the node's free CPU takes its
    `cpu_milli`, before (`cpu_free`) and after the pod (`cpu_free - cpu_asked`). `free` / `newfree` `(N, W)`:
    each GPU's free milli now and with one slice of the pod on it; `passing`: the GPUs that take a slice.
    One GPU: the best passing GPU. Several: whole GPUs (their free amount goes from 1000 to 0; a share
    under 1000 on several GPUs is not measured: inf). inf where the node cannot take the pod. What
    `--fragmentation-filter best` narrows the extender's /filter answer by (docs/planning.md, "A decisive
    extender")."""
    a = arrays(mix)
    small, holding = shape_terms(free, a)
    total = free.sum(axis=-1)
    before = combine(small, holding, total, a, cpu_free[:, None] >= a.cpu)
    host_after = (cpu_free - cpu_asked)[:, None] >= a.cpu
    if nums == 1:
        after = after_each_gpu(free, newfree, mix, host_after)
        growth = np.where(passing, np.round(after - before[:, None], 6), np.inf)
        least: FloatArray = growth.min(axis=1, initial=np.inf)
        return least
    whole = passing & (free == MILLI) & (newfree == 0)
    after = combine(small, holding - nums, total - MILLI * nums, a, host_after)
    result: FloatArray = np.where(whole.sum(axis=1) >= nums, np.round(after - before, 6), np.inf)
    return result


SIMULATOR_MAX_SCORE = 100
"""kube-scheduler's MaxNodeScore, the top of `simulator_score`."""


def simulator_score(growth: FloatArray, taken: IntArray, mix: TaskMix) -> IntArray:
    """FGD's node score as the paper's simulator computes it (pkg/simulator/plugin/fgd_score.go
    `calculateGpuShareFragExtendScore`): `int64(sigmoid((F_before - F_after) / 1000) x 100)`, higher is
    better, for placements that grow F_n(M) by `growth` and take `taken` milli-GPUs of the node's free
    total. The simulator's F_n also holds the CPU-only tasks of its mix, for which every free milli is a
    fragment: its growth is `(1 - c) x growth - c x taken` with c the mix's `cpu_share`. The whole numbers
    0..100 tie placements whose growth differs by less than about 40 milli-GPUs; the simulator takes the
    first node by name among them (`hami_sim.plan.engine`)."""
    c = mix.cpu_share
    # Rounded first (as score.growth_score), so sums in another order cannot tip a score across a whole
    # number: a growth of exactly 0 scores 50 however it was summed.
    x = -((1 - c) * np.round(growth, 6) - c * taken) / MILLI
    with np.errstate(over="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-x))
    return np.floor(sigmoid * SIMULATOR_MAX_SCORE).astype(np.int64)


NO_PLACEMENT = -1
"""`best_scores`' score of a node that cannot take the pod (below every `simulator_score`)."""


def best_scores(  # noqa: PLR0917 (the candidates' GPUs, the ask and the hosts, named)
    free: IntArray,
    newfree: IntArray,
    passing: BoolArray,
    nums: int,
    mix: TaskMix,
    cpu_free: IntArray,
    cpu_asked: int,
) -> IntArray:
    """Per node `(N,)`: FGD's score (`simulator_score`, 0..100, higher is better) of the pod's best
    placement there, with CPU in the measure as `least_growth` (a shape hosted only where the node's free
    CPU takes it, before and after the pod's `cpu_asked`); `NO_PLACEMENT` where the node cannot take it.
    One GPU: the best of the passing GPUs (growth and the milli it takes from that GPU). Several: whole
    GPUs. What `--fragmentation-filter one` answers the best node of (docs/planning.md, "The install")."""
    a = arrays(mix)
    small, holding = shape_terms(free, a)
    total = free.sum(axis=-1)
    before = combine(small, holding, total, a, cpu_free[:, None] >= a.cpu)
    host_after = (cpu_free - cpu_asked)[:, None] >= a.cpu
    if nums == 1:
        after = after_each_gpu(free, newfree, mix, host_after)
        score = simulator_score(after - before[:, None], free - newfree, mix)
        best: IntArray = np.where(passing, score, NO_PLACEMENT).max(axis=1, initial=NO_PLACEMENT)
        return best
    whole = passing & (free == MILLI) & (newfree == 0)
    after = combine(small, holding - nums, total - MILLI * nums, a, host_after)
    score = simulator_score(after - before, np.full(len(free), MILLI * nums, dtype=np.int64), mix)
    result: IntArray = np.where(whole.sum(axis=1) >= nums, score, NO_PLACEMENT)
    return result


def cpu_only_hosts(mix: TaskMix, cpu_free: IntArray, cpu_asked: int) -> tuple[BoolArray, BoolArray]:
    """Per node and shape `(N, T)`: whether the node's free CPU hosts the shape before (`cpu_free`) and
    after a pod asking `cpu_asked` milli-cores and no GPU."""
    a = arrays(mix)
    return cpu_free[:, None] >= a.cpu, (cpu_free - cpu_asked)[:, None] >= a.cpu


def cpu_only_changed(before: BoolArray, after: BoolArray) -> IntArray:
    """The nodes (positions) where a CPU-only pod changes which shapes the free CPU hosts
    (`cpu_only_hosts`): the only ones whose fragmentation it can grow. Elsewhere F_n(M) after is F_n(M)
    before, the same float operations on the same values, so the growth is exactly 0."""
    changed: IntArray = np.flatnonzero((before != after).any(axis=1))
    return changed


def cpu_only_growth(free: IntArray, mix: TaskMix, before: BoolArray, after: BoolArray) -> FloatArray:
    """Per node `(N,)` of `free` `(N, W)`: F_n(M) with the shapes `after` hosts less F_n(M) with those
    `before` hosts (`cpu_only_hosts`, the same nodes)."""
    a = arrays(mix)
    small, holding = shape_terms(free, a)
    total = free.sum(axis=-1)
    growth: FloatArray = combine(small, holding, total, a, after) - combine(small, holding, total, a, before)
    return growth


def cpu_only_scores(free: IntArray, mix: TaskMix, cpu_free: IntArray, cpu_asked: int) -> IntArray:
    """Per node `(N,)`: FGD's score (`simulator_score`) of placing a pod that asks `cpu_asked` milli-cores
    and no GPU: its CPU changes which of the mix's shapes the node's free CPU still hosts, so the node's
    fragmentation grows where a shape loses its host (the paper's simulator scores such pods the same
    way). A node without GPUs (`free` all 0) scores as no growth. See `cpu_only_scores_at`."""
    return cpu_only_scores_at(free.__getitem__, mix, cpu_free, cpu_asked)


def cpu_only_scores_at(
    free_at: Callable[[IntArray], IntArray], mix: TaskMix, cpu_free: IntArray, cpu_asked: int
) -> IntArray:
    """`cpu_only_scores` with the nodes' free GPU amounts read only where needed: `free_at(positions)`
    gives `(len(positions), W)`. Only the nodes where a shape loses its host are measured
    (`cpu_only_changed`; the others grow by exactly 0): the same scores as measuring every node, which
    `cpu_only_scores_dense` does and a property test compares with."""
    before, after = cpu_only_hosts(mix, cpu_free, cpu_asked)
    changed = cpu_only_changed(before, after)
    growth = np.zeros(len(cpu_free), dtype=np.float64)
    if len(changed):
        growth[changed] = cpu_only_growth(free_at(changed), mix, before[changed], after[changed])
    return simulator_score(growth, np.zeros(len(cpu_free), dtype=np.int64), mix)


def cpu_only_scores_dense(free: IntArray, mix: TaskMix, cpu_free: IntArray, cpu_asked: int) -> IntArray:
    """`cpu_only_scores` with every node measured (the reference its property test compares with)."""
    before, after = cpu_only_hosts(mix, cpu_free, cpu_asked)
    growth = cpu_only_growth(free, mix, before, after)
    return simulator_score(growth, np.zeros(len(free), dtype=np.int64), mix)


def first_best(score: IntArray, names: Sequence[str], free_total: IntArray | None = None) -> int:
    """The index of the best `score`; among equal ones the fuller node (the fewest free milli-GPUs,
    `free_total`, when given), then the node whose name sorts first. The name is the paper's simulator's
    tie-break (its kube-scheduler fork's `selectHost`); the fuller node first is ours, what FGD ignores
    (OpenB default at 100% arrival: 294 unallocated GPUs against 313 by name alone; docs/planning.md, "The
    install"). kube-scheduler's own random tie-break (pkg/scheduler/schedule_one.go `selectHost`) cannot
    undo it when /filter answers that one node. Vectorised down to the nodes tied on both numbers (the
    same index as `first_best_scalar`, which its property test compares with)."""
    ties = np.flatnonzero(score == score.max())
    if free_total is not None and len(ties) > 1:
        fullness = free_total[ties]
        ties = ties[fullness == fullness.min()]
    if len(ties) == 1:
        return int(ties[0])
    return int(min(ties.tolist(), key=names.__getitem__))


def first_best_scalar(score: IntArray, names: Sequence[str], free_total: IntArray | None = None) -> int:
    """`first_best` one candidate at a time (the reference its property test compares with)."""
    ties = np.flatnonzero(score == score.max()).tolist()
    if free_total is None:
        return min(ties, key=lambda i: names[i])
    return min(ties, key=lambda i: (int(free_total[i]), names[i]))


def node_fragmentation(node: NodeGPUs, mix: TaskMix = DEFAULT_MIX) -> float:
    """The node's F_n(M) in milli-GPUs, from its GPUs alone (no CPU or memory: what the extender sees)."""
    return float(fragmentation(node_free(node), mix))


def gpu_growth(
    node: NodeGPUs, gpus: Sequence[GPUUsage], request: ContainerRequest, mix: TaskMix = DEFAULT_MIX
) -> FloatArray:
    """For each GPU of `gpus` (GPUs of `node`): how much F_n(M) grows with one slice of `request` more on
    it (negative: it shrinks). What the `fragmentation` GPU policy sorts by."""
    free = node_free(node)
    newfree = free.copy()
    for col, gpu in enumerate(node.gpus):
        newfree[col] = gpu_free_milli(gpu.plus(1, request.memory_on(gpu.info.devmem), request.coresreq))
    after = after_each_gpu(free[None, :], newfree[None, :], mix)[0]
    at = {g.id: i for i, g in enumerate(node.gpus)}
    growth: FloatArray = after[[at[g.id] for g in gpus]] - fragmentation(free, mix)
    return growth


__all__ = [
    "DEFAULT_MIX",
    "DEFAULT_MIX_TEXT",
    "MILLI",
    "NO_PLACEMENT",
    "POPULARITY",
    "SIMULATOR_MAX_SCORE",
    "MixArrays",
    "MixError",
    "TaskMix",
    "TaskShape",
    "after_change",
    "after_each_gpu",
    "arrays",
    "best_scores",
    "combine",
    "cpu_only_changed",
    "cpu_only_growth",
    "cpu_only_hosts",
    "cpu_only_scores",
    "cpu_only_scores_at",
    "cpu_only_scores_dense",
    "first_best",
    "first_best_scalar",
    "fragmentation",
    "free_milli_arrays",
    "gpu_free_milli",
    "gpu_growth",
    "least_growth",
    "mix_from_tasks",
    "node_fragmentation",
    "node_free",
    "parse_mix",
    "simulator_score",
]
