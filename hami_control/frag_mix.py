"""The fragmentation policies' task mix learned from the GPU pods hami-control observes. Pure: no clock,
no I/O; the caller passes the time and the cluster's typical GPU memory.

Issue 17 asks for fragmentation "for the workload's observed request mix" (Weng et al., ATC'23: the mix
is the workload's typical tasks). `--fragmentation-mix observed` (the default) learns it:

- **Tasks.** Every pod the pod store sees for the first time adds one task per GPU container that
  runs beside the others (regular containers and restartable init containers; plain init containers run
  alone, before them, and are left out). A task's shape is `frag.TaskShape(gpus, milli)` read from the
  container's request as hami-control accounts it (`ContainerRequest`, `task_shape`): `milli` is the
  larger of its memory and its cores as shares of one GPU (a memory percentage p gives 10 p; MiB are
  taken against the cluster's most common GPU memory, the caller's `devmem`; cores c % give 10 c),
  rounded up, 1..1000. A task of several GPUs with less than a whole GPU each has no `TaskShape` (the
  paper's tasks of several GPUs take whole ones) and is not counted. Shapes carry no GPU models: the
  extender measures fragmentation from the GPUs alone (`frag.node_fragmentation`), where a model would
  only split one shape's count in two.
- **Window.** The last `window` tasks (`MixLearner.observe`, O(1)): memory is bounded by the window,
  however many pods come and go.
- **The mix.** Every `interval_s` at most (`MixLearner.refresh(now, devmem)`, off the request path), the
  window's shapes go through `frag.mix_from_tasks` (the most common shapes covering `frag.POPULARITY` of
  the tasks, the paper simulator's rule). Until the window holds `min_tasks` tasks with a shape, the
  configured mix (the prior; OpenB's by default) stays in use.
- **Stability.** A learned mix replaces the one in use only when some shape's probability moved by
  `MIX_TOLERANCE` or more (a shape entering or leaving counts with its whole probability): a steady
  workload keeps one `TaskMix` value, so the per-cycle asks, the GPU choices reused across verbs and
  `frag.arrays`' cache (all keyed on the mix's value) keep hitting, and a change is worth its log line.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from hami_api.resources import ContainerRequest
from hami_control.frag import DEFAULT_MIX, MILLI, MixError, TaskMix, TaskShape, mix_from_tasks, parse_mix

OBSERVED = "observed"
"""The `--fragmentation-mix` value that learns the mix (`observed`, or `observed:MIX` with a prior)."""
MIX_TOLERANCE = 0.02
"""How far (in probability) some shape must move before a learned mix replaces the one in use."""
PERCENT_MILLI = MILLI // 100
"""Milli-GPUs per percent of a GPU."""
DEFAULT_WINDOW = 1000
DEFAULT_MIN_TASKS = 100
DEFAULT_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class ObservedMix:
    """`--fragmentation-mix observed[:MIX]`: learn the mix from the pods observed, `prior` until enough
    were seen."""

    prior: TaskMix = DEFAULT_MIX

    def text(self) -> str:
        return OBSERVED if self.prior == DEFAULT_MIX else f"{OBSERVED}:{self.prior.text()}"


OBSERVED_DEFAULT = ObservedMix()
"""`--fragmentation-mix observed`, the default: learned, OpenB's mix until enough pods were seen."""

MixSetting = TaskMix | ObservedMix
"""What `--fragmentation-mix` says: a fixed mix, or learn one (`ObservedMix`)."""


def parse_mix_setting(text: str) -> MixSetting:
    """`observed`, `observed:MIX` (learn, with MIX as the prior) or `MIX` (fixed; `frag.parse_mix`).
    Raises `MixError` naming the entry."""
    head, sep, rest = text.strip().partition(":")
    if head.strip().lower() != OBSERVED:
        return parse_mix(text)
    if not sep:
        return ObservedMix()
    if not rest.strip():
        raise MixError(f"{OBSERVED}: expected a prior mix after the colon, e.g. observed:1000:50,500:50")
    return ObservedMix(parse_mix(rest))


def configured_mix(setting: MixSetting) -> TaskMix:
    """The fixed mix, or the prior of a learned one: the mix in use before any pod was observed."""
    return setting.prior if isinstance(setting, ObservedMix) else setting


@dataclass(frozen=True, slots=True)
class LearningSettings:
    """How the mix is learned (`--fragmentation-mix-window`, `-min-tasks`, `-interval`)."""

    window: int = DEFAULT_WINDOW
    """The last this many GPU tasks observed make the mix."""
    min_tasks: int = DEFAULT_MIN_TASKS
    """The prior stays in use until the window holds this many tasks with a shape."""
    interval_s: float = DEFAULT_INTERVAL_S
    """Seconds between two recomputations of the mix, at least."""
    tolerance: float = MIX_TOLERANCE
    cpu: bool = False
    """Each task shape with its pod's CPU request (`--fragmentation-filter best`, which measures a node's
    free CPU against it)."""
    cpu_only: bool = False
    """Pods that ask no GPU count too, as CPU-only tasks (`--fragmentation-filter one`): they take part in
    the 95% cut, and the mix keeps their share (`TaskMix.cpu_share`, which FGD's score feels), as the
    paper's simulator learns its typical pods (`frag.mix_from_tasks`)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window: must be at least 1, got {self.window}")
        if not 1 <= self.min_tasks <= self.window:
            raise ValueError(f"min_tasks: must be 1..window ({self.window}), got {self.min_tasks}")
        if not self.interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {self.interval_s}")
        if not 0 <= self.tolerance <= 1:
            raise ValueError(f"tolerance: must be 0..1, got {self.tolerance}")


class MixSource(StrEnum):
    """Where the mix in use comes from (the metrics' `source` label)."""

    CONFIGURED = "configured"
    OBSERVED = "observed"


@dataclass(frozen=True, slots=True)
class MixInUse:
    """The mix the fragmentation policies use now, where it comes from and how many observed tasks it
    was learned from (0 for the configured one)."""

    mix: TaskMix
    source: MixSource
    tasks: int = 0

    def text(self) -> str:
        if self.source is MixSource.CONFIGURED:
            return f"configured mix {self.mix.text()}"
        return f"observed mix of the last {self.tasks} GPU tasks {self.mix.text()}"


def shape_label(shape: TaskShape) -> str:
    """A shape as `frag.parse_mix` writes it (`470`, `2x1000`), with its CPU where it has one (`470/4000m`,
    shapes learned under `--fragmentation-filter best`): the metrics' `shape` label."""
    label = f"{shape.gpus}x{shape.milli}" if shape.gpus > 1 else str(shape.milli)
    return f"{label}/{shape.cpu_milli}m" if shape.cpu_milli else label


def task_shape(request: ContainerRequest, devmem: int) -> TaskShape | None:
    """The task shape of one container's request (see the module note); `devmem` is the MiB a memory
    request in MiB is a share of (0: unknown, such requests then have no shape). None when the request
    has no shape."""
    if request.nums < 1:
        return None
    if request.mem_percentage is not None and request.memreq <= 0:
        memory = request.mem_percentage * PERCENT_MILLI
    elif request.memreq > 0:
        if devmem <= 0:
            return None
        memory = -(-request.memreq * MILLI // devmem)
    else:
        memory = 0
    milli = min(MILLI, max(1, memory, request.coresreq * PERCENT_MILLI))
    if request.nums > 1 and milli < MILLI:
        return None
    return TaskShape(request.nums, milli)


def pod_tasks(
    requests: Iterable[tuple[ContainerRequest | None, bool]], sidecars: frozenset[int] = frozenset()
) -> tuple[ContainerRequest, ...]:
    """The GPU tasks of a pod: the requests of its regular containers and restartable init containers
    (`requests`: (request or None, is init) per container, init containers first, as the pod store keeps
    them; `sidecars`: the restartable init containers' indexes)."""
    return tuple(
        request
        for i, (request, init) in enumerate(requests)
        if request is not None and (not init or i in sidecars)
    )


def distance(a: TaskMix, b: TaskMix) -> float:
    """The largest change of one shape's probability between two mixes (a shape in one only counts
    with its whole probability)."""
    pa = dict(zip(a.shapes, a.weights, strict=True))
    pb = dict(zip(b.shapes, b.weights, strict=True))
    return max(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in pa.keys() | pb.keys())


@dataclass(slots=True)
class MixLearner:
    """The window of observed tasks and the mix in use (see the module note). Single owner, not
    thread-safe."""

    prior: TaskMix
    settings: LearningSettings = field(default_factory=LearningSettings)
    _window: collections.deque[tuple[ContainerRequest | None, int]] = field(init=False)
    _counts: collections.Counter[tuple[ContainerRequest | None, int]] = field(
        init=False, default_factory=collections.Counter
    )
    """Per (request, CPU milli-cores of its pod, 0 unless `settings.cpu`): tasks in the window; a CPU-only
    task (`settings.cpu_only`) has request None."""
    _seen: int = field(init=False, default=0)
    _learned_at: tuple[int, int] | None = field(init=False, default=None)
    """(tasks seen, devmem) at the last recomputation: nothing to do while both are the same."""
    _next_at: float = field(init=False, default=float("-inf"))
    _in_use: MixInUse = field(init=False)

    def __post_init__(self) -> None:
        self._window = collections.deque(maxlen=self.settings.window)
        self._in_use = MixInUse(self.prior, MixSource.CONFIGURED)

    @property
    def in_use(self) -> MixInUse:
        return self._in_use

    @property
    def seen(self) -> int:
        """Tasks observed in all (the window holds the last `settings.window` of them)."""
        return self._seen

    def __len__(self) -> int:
        """Tasks in the window."""
        return len(self._window)

    @property
    def needs_memory(self) -> bool:
        """Whether a task of the window asks GPU memory in MiB (its shape needs `refresh`'s `devmem`)."""
        return any(request is not None and request.memreq > 0 for request, _ in self._counts)

    def observe_cpu_only(self, cpu_milli: int) -> None:
        """One more CPU-only task (a pod asking no GPU seen for the first time, asking `cpu_milli`);
        nothing unless `settings.cpu_only`."""
        if self.settings.cpu_only:
            self._add((None, cpu_milli))

    def observe(self, request: ContainerRequest, cpu_milli: int = 0) -> None:
        """One more task (a GPU container of a pod seen for the first time, whose pod asks `cpu_milli`);
        the oldest leaves a full window."""
        self._add((request, cpu_milli if self.settings.cpu else 0))

    def _add(self, task: tuple[ContainerRequest | None, int]) -> None:
        window = self._window
        if len(window) == window.maxlen:
            old = window[0]
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]
        window.append(task)
        self._counts[task] += 1
        self._seen += 1

    def observe_pod(
        self,
        requests: Iterable[tuple[ContainerRequest | None, bool]],
        sidecars: frozenset[int] = frozenset(),
        cpu_milli: int = 0,
    ) -> None:
        """Every GPU task of a pod seen for the first time (`pod_tasks`); `cpu_milli`: the pod's CPU."""
        for request in pod_tasks(requests, sidecars):
            self.observe(request, cpu_milli)

    def learned(self, devmem: int) -> MixInUse | None:
        """The mix of the window now (None while fewer than `min_tasks` of its tasks have a shape)."""
        shapes: collections.Counter[TaskShape] = collections.Counter()
        cpu_only: collections.Counter[int] = collections.Counter()
        for (request, cpu), n in self._counts.items():
            if request is None:
                cpu_only[cpu] += n
                continue
            shape = task_shape(request, devmem)
            if shape is not None:
                shapes[TaskShape(shape.gpus, shape.milli, cpu) if cpu else shape] += n
        tasks = shapes.total()
        if tasks < self.settings.min_tasks:
            return None
        return MixInUse(
            mix_from_tasks(shapes.elements(), cpu_only=cpu_only.elements()), MixSource.OBSERVED, tasks
        )

    def refresh(self, now: float, devmem: int) -> MixInUse | None:
        """Recompute the mix if `settings.interval_s` has passed since the last time (`now`: the caller's
        clock, seconds) and tasks came or the GPU memory changed since; returns the new mix in use when
        it changed, else None."""
        if now < self._next_at:
            return None
        self._next_at = now + self.settings.interval_s
        state = (self._seen, devmem)
        if state == self._learned_at:
            return None
        self._learned_at = state
        # Too few tasks with a shape (yet, or again): the prior.
        learned = self.learned(devmem) or MixInUse(self.prior, MixSource.CONFIGURED)
        current = self._in_use
        if learned.source is current.source and (
            learned.source is MixSource.CONFIGURED
            or distance(learned.mix, current.mix) < self.settings.tolerance
        ):
            return None
        self._in_use = learned
        return learned


def most_common_memory(memories: Iterable[int]) -> int:
    """The GPU memory (MiB) most GPUs have (ties: the larger), 0 for none: what `task_shape` takes a
    request in MiB against."""
    counts = collections.Counter(m for m in memories if m > 0)
    if not counts:
        return 0
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_MIN_TASKS",
    "DEFAULT_WINDOW",
    "MIX_TOLERANCE",
    "OBSERVED",
    "OBSERVED_DEFAULT",
    "LearningSettings",
    "MixInUse",
    "MixLearner",
    "MixSetting",
    "MixSource",
    "ObservedMix",
    "configured_mix",
    "distance",
    "most_common_memory",
    "parse_mix_setting",
    "pod_tasks",
    "shape_label",
    "task_shape",
]
