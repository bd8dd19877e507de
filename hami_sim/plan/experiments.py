"""The two experiments of `hami-sim plan`.

- Workload inflation (the paper's section 5 experiment, as its simulator runs it): tasks drawn from the
  trace with a seed (a random order of the whole list, then another, ...) arrive one by one and never
  leave, until the GPU they asked reaches `max_arrival` of the cluster's GPUs; a task no node takes stays
  unplaced. Recorded per task: the arrived GPU request and the allocated GPU share of capacity, and at
  every percent of arrival the cluster's fragmentation.
- Time replay: tasks arrive at their creation time and leave at their deletion time (a task still
  pending then leaves the queue unplaced). A task that does not fit waits; pending tasks are tried again,
  oldest first, after each departure (kube-scheduler moves unschedulable pods back on such events); per
  round, a task whose shape already failed is not tried again. Recorded: the pending time of each task
  and the fragmentation and allocation over time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hami_control.frag import MILLI, TaskMix, TaskShape, mix_from_tasks
from hami_control.frag_mix import task_shape
from hami_sim.plan import DEFAULT_EXTENDER_WEIGHT, DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE
from hami_sim.plan.engine import BEST, POLICIES, Cluster, Placement, gpu_request
from hami_sim.plan.inputs import NodeSpec, Task
from hami_sim.progress import ProgressBar


@dataclass(frozen=True)
class SchedulerModel:
    """The kube-scheduler settings the planner models (docs/planning.md, "Faithfulness"); by default
    those of daemonset/scheduler/kube-scheduler-config.yaml."""

    extender_weight: int = DEFAULT_EXTENDER_WEIGHT
    percentage_of_nodes_to_score: int | None = DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE

    def cluster(
        self,
        nodes: Sequence[NodeSpec],
        mix: TaskMix,
        policy: str,
        seed: int,
        extender_mix: TaskMix | None = None,
    ) -> Cluster:
        return Cluster(
            nodes,
            mix,
            POLICIES[policy],
            seed,
            extender_weight=self.extender_weight,
            percentage_of_nodes_to_score=self.percentage_of_nodes_to_score,
            extender_mix=extender_mix,
        )


SCHEDULER_DEFAULTS = SchedulerModel()


def workload_mix(tasks: Sequence[Task]) -> TaskMix:
    """The mix the fragmentation policy measures against, learned from the workload as the paper's
    simulator does (`frag.mix_from_tasks`): task shapes (GPUs, share, CPU, models; no memory, as the
    simulator's pkg/type/resource.go `PodResource` has none), the most common ones covering 95% of all
    tasks, CPU-only ones counted in the cut, then left out."""
    return mix_from_tasks(
        (TaskShape(t.num_gpu, t.share, t.cpu_milli, 0, t.models) for t in tasks if t.num_gpu > 0),
        cpu_only=[t.cpu_milli for t in tasks if t.num_gpu <= 0],
    )


def extender_mix(tasks: Sequence[Task], cpu: bool = False) -> TaskMix:
    """The mix hami-control's extender learns from these tasks' pods (`--fragmentation-mix observed`, its
    default; `frag_mix.task_shape` of each GPU task's request, the 95% rule over GPU tasks only, no CPU),
    in its steady state: every task in its window. Not `workload_mix`'s GPU part: the paper's rule cuts
    shapes that differ in CPU, which drops multi-GPU shapes of many CPU sizes that the extender, which
    sees GPUs only, keeps. `cpu`: each shape with its task's CPU request, as the extender learns under
    `--fragmentation-filter best` (the pod's CPU request beside its GPU shape)."""
    shapes = (
        (task_shape(r, 0), t.cpu_milli if cpu else 0) for t in tasks if (r := gpu_request(t)) is not None
    )
    return mix_from_tasks(TaskShape(s.gpus, s.milli, c) for s, c in shapes if s is not None)


def _mixes(tasks: Sequence[Task], mix: TaskMix | None, policy: str) -> tuple[TaskMix, TaskMix | None]:
    """(the planner's fragmentation mix, the extender's): learned from the workload (with each shape's CPU
    for `fragmentation-best`), or `mix` given for both (the extender then configured with it)."""
    if mix is not None:
        return mix, None
    return workload_mix(tasks), extender_mix(tasks, cpu=POLICIES[policy].choice == BEST)


@dataclass
class InflationResult:
    policy: str
    arrived: list[float] = field(default_factory=list)
    """Per arriving task: GPU request arrived so far, as a share of the cluster's GPUs."""
    allocation: list[float] = field(default_factory=list)
    """Per arriving task: GPU allocated, as a share of the cluster's GPUs."""
    frag_arrived: list[float] = field(default_factory=list)
    frag_gpus: list[float] = field(default_factory=list)
    """The cluster's fragmentation (GPUs) at each percent of arrival."""
    failed: int = 0
    seconds: float = 0.0
    tasks: int = 0


def inflation(  # noqa: PLR0917 (the experiment's inputs, named)
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    policy: str,
    seed: int,
    max_arrival: float = 1.3,
    mix: TaskMix | None = None,
    progress: bool = False,
    scheduler: SchedulerModel = SCHEDULER_DEFAULTS,
) -> InflationResult:
    mix, learned = _mixes(tasks, mix, policy)
    cluster = scheduler.cluster(nodes, mix, policy, seed, learned)
    capacity = cluster.gpus_total * MILLI
    target = max_arrival * capacity
    rng = np.random.default_rng(seed)
    out = InflationResult(policy)
    target_gpus = int(target) // MILLI
    bar = ProgressBar(target_gpus, label=f"inflation {policy}".ljust(24), unit="GPUs", enabled=progress)
    arrived = 0
    next_sample = 0.0
    order: list[int] = []
    while arrived < target:
        if not order:
            order = rng.permutation(len(tasks)).tolist()[::-1]
            if not any(t.gpu_request for t in tasks):
                break
        task = tasks[order.pop()]
        if cluster.place(task) is None and task.gpu_request:
            out.failed += 1
        arrived += task.gpu_request
        out.tasks += 1
        out.arrived.append(arrived / capacity)
        out.allocation.append(cluster.allocated / capacity)
        if arrived / capacity >= next_sample:
            out.frag_arrived.append(arrived / capacity)
            out.frag_gpus.append(cluster.cluster_fragmentation())
            next_sample += 0.01
        bar.update(min(arrived // MILLI, target_gpus))
    out.seconds = bar.close()
    return out


@dataclass
class ReplayResult:
    policy: str
    pending_s: list[float] = field(default_factory=list)
    """Per task placed: seconds between its arrival and its placement."""
    never: int = 0
    """Tasks that left (or the trace ended) before they were placed."""
    times: list[float] = field(default_factory=list)
    frag_gpus: list[float] = field(default_factory=list)
    allocation: list[float] = field(default_factory=list)
    seconds: float = 0.0
    tasks: int = 0


def _shape(task: Task) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (task.num_gpu, task.share, task.cpu_milli, task.memory_mib, task.models)


def replay(  # noqa: PLR0917 (the experiment's inputs, named)
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    policy: str,
    seed: int,
    mix: TaskMix | None = None,
    progress: bool = False,
    samples: int = 400,
    scheduler: SchedulerModel = SCHEDULER_DEFAULTS,
) -> ReplayResult:
    mix, learned = _mixes(tasks, mix, policy)
    cluster = scheduler.cluster(nodes, mix, policy, seed, learned)
    capacity = cluster.gpus_total * MILLI
    out = ReplayResult(policy, tasks=len(tasks))
    arrivals = sorted(range(len(tasks)), key=lambda i: (tasks[i].creation, i))
    if not arrivals:
        return out
    start, end = (
        tasks[arrivals[0]].creation,
        max(t.deletion or t.creation for t in tasks),
    )
    step = max((end - start) / samples, 1e-9)
    next_sample = start
    # Events: (time, kind, seq, index); kind 0 = departure (frees first), 1 = arrival.
    events: list[tuple[float, int, int, int]] = [(tasks[i].creation, 1, n, i) for n, i in enumerate(arrivals)]
    heapq.heapify(events)
    seq = len(events)
    placed: dict[int, Placement] = {}
    pending: dict[int, None] = {}  # insertion-ordered: oldest first
    gone: set[int] = set()
    bar = ProgressBar(len(tasks), label=f"replay {policy}".ljust(24), unit="tasks", enabled=progress)
    handled = 0

    def schedule(i: int, now: float) -> bool:
        got = cluster.place(tasks[i])
        if got is None:
            return False
        placed[i] = got
        out.pending_s.append(now - tasks[i].creation)
        return True

    while events:
        now, kind, _, i = heapq.heappop(events)
        while now >= next_sample:
            out.times.append(next_sample)
            out.frag_gpus.append(cluster.cluster_fragmentation())
            out.allocation.append(cluster.allocated / capacity)
            next_sample += step
        if kind == 1:
            handled += 1
            deletion = tasks[i].deletion
            if deletion is not None:
                heapq.heappush(events, (deletion, 0, seq, i))
                seq += 1
            if not schedule(i, now):
                pending[i] = None
            bar.update(handled)
            continue
        if i in placed:
            cluster.release(placed.pop(i))
        elif i in pending:
            del pending[i]
            gone.add(i)
            continue
        failed_shapes: set[tuple[int, int, int, int, tuple[str, ...]]] = set()
        for j in list(pending):
            shape = _shape(tasks[j])
            if shape in failed_shapes:
                continue
            if schedule(j, now):
                del pending[j]
            else:
                failed_shapes.add(shape)
    out.never = len(gone) + len(pending)
    out.seconds = bar.close()
    return out


__all__ = [
    "SCHEDULER_DEFAULTS",
    "InflationResult",
    "ReplayResult",
    "SchedulerModel",
    "extender_mix",
    "inflation",
    "replay",
    "workload_mix",
]
