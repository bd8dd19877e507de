"""The two experiments of `hami-sim plan`.

- Workload inflation (the paper's section 5 experiment, as its simulator runs it): tasks drawn from the
  trace with a seed (a random order of the whole list, then another, ...) arrive one by one and never
  leave, until the GPU they asked reaches `max_arrival` of the cluster's GPUs; a task no node takes stays
  unplaced. Recorded per task: the arrived GPU request and the allocated GPU share of capacity, and at
  every percent of arrival the cluster's fragmentation.
- MIG against slices (`mig_vs_slices`): the same tasks, in the same seeded order, arrive on the same
  nodes twice, once with their GPUs in MIG mode (HAMi's dynamic MIG: each pod gets the smallest profile
  holding its memory at a free placement) and once as hami-core slices (the memory as asked), never
  leaving, until the GPU memory they asked reaches `max_arrival` of the nodes' GPU memory. Recorded: pods
  placed and not, GPU memory asked by the placed pods, allocated (MIG: the profile's memory), left
  unallocated, and the curve of allocated memory against arrived.
- Time replay: tasks arrive at their creation time and leave at their deletion time (a task still
  pending then leaves the queue unplaced). A task that does not fit waits; pending tasks are tried again,
  oldest first, after each departure (kube-scheduler moves unschedulable pods back on such events); per
  round, a task whose shape already failed is not tried again. Recorded: the pending time of each task
  and the fragmentation and allocation over time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hami_control.frag import MILLI, TaskMix, TaskShape, mix_from_tasks
from hami_control.frag_mix import task_shape
from hami_sim.plan import DEFAULT_EXTENDER_WEIGHT, DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE
from hami_sim.plan.engine import BEST, INSTALL, MIG_POLICIES, POLICIES, Cluster, Placement, gpu_request
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


def extender_mix(tasks: Sequence[Task], cpu: bool = False, cpu_only: bool = False) -> TaskMix:
    """The mix hami-control's extender learns from these tasks' pods (`--fragmentation-mix observed`, its
    default; `frag_mix.task_shape` of each GPU task's request, the 95% rule over GPU tasks only, no CPU),
    in its steady state: every task in its window. Not `workload_mix`'s GPU part: the paper's rule cuts
    shapes that differ in CPU, which drops multi-GPU shapes of many CPU sizes that the extender, which
    sees GPUs only, keeps. `cpu`: each shape with its task's CPU request, as the extender learns under
    `--fragmentation-filter best` (the pod's CPU request beside its GPU shape). `cpu_only`: the tasks that
    ask no GPU count too, as the extender learns them under `--fragmentation-filter one` (in the 95% cut,
    then kept as the mix's `cpu_share`)."""
    shapes = (
        (task_shape(r, 0), t.cpu_milli if cpu else 0) for t in tasks if (r := gpu_request(t)) is not None
    )
    return mix_from_tasks(
        (TaskShape(s.gpus, s.milli, c) for s, c in shapes if s is not None),
        cpu_only=[t.cpu_milli for t in tasks if t.num_gpu <= 0] if cpu_only else (),
    )


def _mixes(tasks: Sequence[Task], mix: TaskMix | None, policy: str) -> tuple[TaskMix, TaskMix | None]:
    """(the planner's fragmentation mix, the extender's): learned from the workload (with each shape's CPU
    for `fragmentation-best`), or `mix` given for both (the extender then configured with it)."""
    if mix is not None:
        return mix, None
    choice = POLICIES[policy].choice
    return workload_mix(tasks), extender_mix(tasks, cpu=choice in {BEST, INSTALL}, cpu_only=choice == INSTALL)


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


MIB_PER_GIB = 1024


def memory_tasks(tasks: Sequence[Task], gpu_memory_mib: int) -> list[Task]:
    """The GPU tasks of `tasks` as a memory-only workload on GPUs of `gpu_memory_mib`: a share task asks
    `gpu_milli/1000` of that memory in MiB and no cores (`nvidia.com/gpumem` alone; one it already asks in
    MiB keeps it), whole-GPU tasks stay whole GPUs (100 % of memory and cores); CPU, host memory and the
    model constraint dropped (the comparison is about GPU memory alone); CPU-only tasks left out."""
    out: list[Task] = []
    for t in tasks:
        if t.num_gpu <= 0:
            continue
        memory = t.gpu_memory_mib
        if t.num_gpu == 1 and t.share < MILLI and not memory:
            memory = max(1, t.share * gpu_memory_mib // MILLI)
        out.append(replace(t, cpu_milli=0, memory_mib=0, models=(), gpu_memory_mib=memory))
    return out


def task_memory(task: Task, gpu_memory_mib: int) -> int:
    """MiB of GPU memory `task` asks in all on GPUs of `gpu_memory_mib` (`gpu_request`'s memory x GPUs)."""
    request = gpu_request(task)
    return 0 if request is None else request.nums * request.memory_on(gpu_memory_mib)


@dataclass
class MemoryResult:
    """One side of `mig_vs_slices`: the nodes' GPUs in MIG mode (`mode` "mig") or sliced ("slices")."""

    mode: str
    policy: str
    capacity_mib: int = 0
    """GPU memory of the nodes (the GPUs' whole memory, as NVML reports it)."""
    arrived: list[float] = field(default_factory=list)
    """Per arriving task: GPU memory asked so far, as a share of `capacity_mib`."""
    allocation: list[float] = field(default_factory=list)
    """Per arriving task: GPU memory allocated, as a share of `capacity_mib`."""
    tasks: int = 0
    placed: int = 0
    unplaced: int = 0
    asked_mib: int = 0
    """GPU memory the placed pods asked."""
    allocated_mib: int = 0
    """GPU memory allocated to them (a MIG pod holds its profile's memory)."""
    profiles: dict[str, int] = field(default_factory=dict)
    """MIG profiles handed out, by name (MIG side)."""
    placements: list[Placement] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unallocated_mib(self) -> int:
        return self.capacity_mib - self.allocated_mib

    @property
    def not_asked_mib(self) -> int:
        """Allocated but not asked: what MIG's rounding up to a profile costs."""
        return self.allocated_mib - self.asked_mib


def _memory_run(  # noqa: PLR0917 (the experiment's inputs, named)
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    mode: str,
    policy: str,
    seed: int,
    max_arrival: float,
    progress: bool,
    scheduler: SchedulerModel,
) -> MemoryResult:
    cluster = scheduler.cluster(nodes, workload_mix(tasks), policy, seed)  # no fragmentation policy here
    memory_of = {n.name: n.gpu_memory_mib for n in nodes}
    capacity = sum(n.gpus * n.gpu_memory_mib for n in nodes)
    gpu_memory = nodes[0].gpu_memory_mib
    out = MemoryResult(mode, policy, capacity)
    target = max_arrival * capacity
    rng = np.random.default_rng(seed)
    bar = ProgressBar(
        int(target) // MIB_PER_GIB, label=f"{mode} {policy}".ljust(24), unit="GiB", enabled=progress
    )
    arrived = 0
    order: list[int] = []
    while arrived < target and tasks:
        if not order:
            order = rng.permutation(len(tasks)).tolist()[::-1]
        task = tasks[order.pop()]
        got = cluster.place(task)
        out.tasks += 1
        asked = task_memory(task, gpu_memory)
        arrived += asked
        if got is None:
            out.unplaced += 1
        else:
            out.placed += 1
            out.placements.append(got)
            out.asked_mib += task_memory(task, memory_of[cluster.specs[got.row].name])
            out.allocated_mib += sum(s.usedmem for s in got.slices)
            for m in got.mig:
                out.profiles[m.profile] = out.profiles.get(m.profile, 0) + 1
        out.arrived.append(arrived / capacity)
        out.allocation.append(out.allocated_mib / capacity)
        bar.update(min(arrived, int(target)) // MIB_PER_GIB)
    out.seconds = bar.close()
    return out


def mig_vs_slices(  # noqa: PLR0917 (the experiment's inputs, named)
    nodes: Sequence[NodeSpec],
    tasks: Sequence[Task],
    policy: str = "binpack",
    seed: int = 42,
    max_arrival: float = 1.0,
    progress: bool = False,
    scheduler: SchedulerModel = SCHEDULER_DEFAULTS,
) -> tuple[MemoryResult, MemoryResult]:
    """(MIG, slices) on the same workload: `nodes` with every GPU in MIG mode, then as hami-core slices;
    `tasks` as `memory_tasks` makes them for the nodes' GPU memory. The nodes must be of one MIG-capable
    model (ValueError otherwise)."""
    from hami_sim.plan.inputs import mig_model_name

    if policy not in MIG_POLICIES:
        raise ValueError(f"policy {policy}: expected one of {', '.join(MIG_POLICIES)} for MIG against slices")
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    models = sorted({n.model for n in gpu_nodes})
    if len(models) != 1 or mig_model_name(models[0]) is None:
        raise ValueError(
            f"nodes: expected GPU nodes of one MIG-capable model (A100-40GB, A100-80GB, H100, H200, A30), "
            f"got {', '.join(models) or 'none'}"
        )
    gpu_memory = gpu_nodes[0].gpu_memory_mib
    work = memory_tasks(tasks, gpu_memory)
    if not work:
        raise ValueError("tasks: no GPU task to compare with")
    mig = [replace(n, mig=True) for n in gpu_nodes]
    sliced = [replace(n, mig=False) for n in gpu_nodes]
    return (
        _memory_run(mig, work, "mig", policy, seed, max_arrival, progress, scheduler),
        _memory_run(sliced, work, "slices", policy, seed, max_arrival, progress, scheduler),
    )


__all__ = [
    "SCHEDULER_DEFAULTS",
    "InflationResult",
    "MemoryResult",
    "ReplayResult",
    "SchedulerModel",
    "extender_mix",
    "inflation",
    "memory_tasks",
    "mig_vs_slices",
    "replay",
    "task_memory",
    "workload_mix",
]
