"""The planner's cluster: nodes and GPUs kept as hami-control keeps them, pods placed by a policy through
the real fit and score code (`hami_control.fit`, `gputable`, `score`, `frag`). No processes, no sockets.

State: one `usage.NodeGPUs` per node (what `cache.ClusterCache` hands the extender) and the extender's
`gputable.GPUTable` over them, rewritten row by row as pods come and go; beside them the free CPU and
memory of each node (kube-scheduler's NodeResourcesFit, which the paper's simulator models too) and, per
node, the fragmentation terms of `frag` (free milli per GPU, per task shape), recomputed only for the
node that changed.

One pod (`Cluster.place`):
1. Which nodes fit: the CPU and memory left (kube-scheduler's NodeResourcesFit), searched as
   kube-scheduler searches (`_sample`: above 100 nodes, from where the last search stopped until
   `percentageOfNodesToScore` of them pass; not for `fragmentation`), then `gputable.evaluate` (the
   extender's vectorised `fit_pod` verdicts). A CPU-only pod needs CPU and memory only.
2. Which node: by the policy (`POLICIES`):
   - `binpack`, `spread`, `topology`, `fragmentation-extender`: what kube-scheduler with hami-control as
     its extender does (`Policy.choice` "scheduler"; docs/planning.md, "Faithfulness"): per node, the
     scheduler stand-in's own score (NodeResourcesFit LeastAllocated, 0..100, `least_allocated`, equal to
     `hami_sim.scheduler.fit.least_allocated_score`) plus the extender's /prioritize score x the extender
     weight x 10 (`fit.extender_score`); the highest total wins, among equal ones one at random
     (kube-scheduler's selectHost). The extender score is hami-control's own: `gputable.node_scores`
     (equal to `score.node_priority`; 0..10 whole numbers) with node policy binpack/spread/binpack and
     GPU policy binpack/spread/topology-aware, and for `fragmentation-extender` the extender's
     fragmentation path (`gputable.fragmentation_scores`, else `score.node_priority` of fit_pod's choice,
     node by node, as `extender.prioritize_nodes`) over the GPU part of the mix, which is all the extender
     sees. `best_rows` gives the nodes of the best total, `place_on` places a task on a given node: the
     steps the faithfulness test drives with the local cluster's choices.
   - `fragmentation-best` (`BEST`): as `fragmentation-extender`, but among the nodes an extender /filter
     narrowed to the least fragmenting ones keeps (`_least_fragmenting`, `frag.least_growth`: the exact
     growth for the extender's mix learned with each shape's CPU, a shape hosted only where the node's
     free CPU takes it); kube-scheduler's total chooses among them. Not an extender setting yet
     (docs/planning.md, "A decisive extender").
   - `hami`: HAMi v2.10's own choice (HAMi pkg/scheduler/score.go `calcScore`, policy/node_policy.go
     `ComputeDefaultScore`, scheduler.go `Filter`): the node's usage before the pod,
     `10 x (used/count + usedcores/totalcore + usedmem/totalmem)` as float32, the highest under binpack
     (HAMi's default node policy), GPU policy spread (HAMi's default); HAMi takes the last node of its
     sorted list, so among equal scores the last candidate. HAMi's Filter answers with that one node
     (`ExtenderFilterResult{NodeNames: &[]string{m.NodeID}}`), so kube-scheduler's own scores never
     choose among GPU pods' nodes.
   - `fragmentation`: the paper's FGD as its simulator runs it: the node and GPU where the node's
     fragmentation for the workload's mix (with CPU) grows least, scored as the simulator scores it
     (`frag.simulator_score`, whole numbers 0..100); among equal scores the node whose name sorts first,
     then its GPU of the lowest index (`_first_by_name`). More than the extender's 0..10 answer inside
     kube-scheduler's total can carry (`fragmentation-extender` is what the extender sends).
   CPU-only pods go where kube-scheduler's LeastAllocated puts them (the extender is not asked about pods
   that ask no GPU), except under `fragmentation`, which scores them the same way, as the paper does.
3. Which GPUs: `fit.fit_pod` on the chosen node with the policy's GPU policy (for `fragmentation` the
   GPU chosen in step 2, passed as `nvidia.com/use-gpuuuid`, so fit_pod checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hami_api.containers import ContainerKind, footprint_slices
from hami_api.mig import MIG_MODELS
from hami_api.mig_alloc import MIG_MODE, MigAllocation
from hami_api.resources import ContainerRequest
from hami_api.types import DeviceSelector, GPUInfo, GPUPolicy, GPUSlice, NodePolicy
from hami_control.fit import NO_SELECTOR, Fit, fit_pod
from hami_control.frag import (
    MILLI,
    TaskMix,
    TaskShape,
    after_change,
    arrays,
    combine,
    cpu_only_scores,
    first_best,
    free_milli_arrays,
    gpu_free_milli,
    shape_terms,
    simulator_score,
)
from hami_control.gputable import (
    Evaluation,
    GPUTable,
    SimpleAsk,
    evaluate,
    fragmentation_best_scores,
    fragmentation_growth,
    fragmentation_scores,
    free_milli_rows,
    node_scores,
    score_inputs,
    simple_ask,
)
from hami_control.score import MAX_SCORE, node_priority
from hami_control.usage import NodeGPUs, with_slices, without_slices
from hami_node.mig_manager import register_mig
from hami_sim.plan import (
    DEFAULT_EXTENDER_WEIGHT,
    DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE,
    EXTRA_POLICY_NAMES,
    INSTALL_EXTENDER_WEIGHT,
    INSTALL_PERCENTAGE_OF_NODES_TO_SCORE,
    POLICY_NAMES,
)
from hami_sim.plan.inputs import NodeSpec, Task, mig_model_name
from hami_sim.scheduler.fit import num_feasible_nodes_to_find

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


SCHEDULER = "scheduler"
HAMI = "hami"
FGD = "fgd"
BEST = "best"
INSTALL = "install"
MAX_NODE_SCORE = 100
"""kube-scheduler's MaxNodeScore (the range of its own plugins' scores)."""
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY_MIB = 200
"""kube-scheduler's non-zero requests for scoring a container that asks no CPU / memory (100m, 200Mi)."""


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    node: NodePolicy | None
    """None: HAMi's own node choice."""
    gpu: tuple[GPUPolicy, ...]
    choice: str = SCHEDULER
    """How the node is chosen: `SCHEDULER` (kube-scheduler's own score + the extender's x weight),
    `BEST` (the same among the nodes the extender's /filter keeps under `--fragmentation-filter best`),
    `HAMI` (HAMi's Filter keeps one node) or `FGD` (the paper's exact growth)."""


POLICIES: dict[str, Policy] = {
    "binpack": Policy("binpack", NodePolicy.BINPACK, (GPUPolicy.BINPACK,)),
    "spread": Policy("spread", NodePolicy.SPREAD, (GPUPolicy.SPREAD,)),
    "topology": Policy("topology", NodePolicy.BINPACK, (GPUPolicy.TOPOLOGY_AWARE,)),
    "hami": Policy("hami", None, (GPUPolicy.SPREAD,), HAMI),
    "fragmentation": Policy("fragmentation", NodePolicy.FRAGMENTATION, (GPUPolicy.FRAGMENTATION,), FGD),
    "fragmentation-extender": Policy(
        "fragmentation-extender", NodePolicy.FRAGMENTATION, (GPUPolicy.FRAGMENTATION,)
    ),
    "fragmentation-best": Policy(
        "fragmentation-best", NodePolicy.FRAGMENTATION, (GPUPolicy.FRAGMENTATION,), BEST
    ),
    "fragmentation-install": Policy(
        "fragmentation-install", NodePolicy.FRAGMENTATION, (GPUPolicy.FRAGMENTATION,), INSTALL
    ),
}
if tuple(POLICIES) != POLICY_NAMES + EXTRA_POLICY_NAMES:  # pragma: no cover - kept in step by hand
    raise ImportError("hami_sim.plan.POLICY_NAMES and engine.POLICIES differ")
APP = (ContainerKind.APP,)


MIG_POLICIES = ("binpack", "spread", "topology", "hami")
"""The policies that place pods on MIG nodes (`NodeSpec.mig`): those whose node choice is hami-control's
/filter and /prioritize (node by node on MIG GPUs, as the extender's `_fit_slow`) or HAMi's own; the
fragmentation policies measure free milli-GPUs, which a MIG GPU does not have."""


@dataclass(frozen=True, slots=True)
class Placement:
    row: int
    slices: tuple[GPUSlice, ...]
    task: Task
    mig: tuple[MigAllocation, ...] = ()
    """The MIG devices (profile, placement) fit_pod reserved on MIG GPUs (`hami.io/vgpu-mig-allocations`)."""


def mig_gpu_info(spec: NodeSpec, index: int) -> GPUInfo:
    """GPU `index` of a MIG node as hami-node registers it in operating mode mig (hami_node.devices
    `inventory_entry`, hami_node.mig_manager `register_mig` without an allowlist: every base profile of
    the model's table with its placements and HAMi's core %, count = the most instances of a profile,
    devmem the whole GPU's memory, devcore 100, mode "mig")."""
    name = mig_model_name(spec.model)
    if name is None:
        raise ValueError(f"node {spec.name}: model {spec.model!r} has no MIG profile table")
    model = MIG_MODELS[name]
    reg = register_mig(model.profiles, model.name, None)
    if reg is None:  # pragma: no cover - every table has base profiles
        raise ValueError(f"node {spec.name}: model {spec.model!r} registers no MIG profile")
    return GPUInfo(
        id=f"{spec.name}-gpu{index}",
        index=index,
        count=reg.count,
        devmem=model.memory_mib,
        devcore=100,
        type=spec.model,
        numa=index // -(-spec.gpus // max(spec.numa_nodes, 1)),
        mode=MIG_MODE,
        health=True,
        mig_profiles=reg.profiles,
    )


def gpu_mix(mix: TaskMix) -> TaskMix:
    """`mix` as the extender takes it (`--fragmentation-mix`): the GPU part of each shape, merged."""
    return TaskMix.of((TaskShape(s.gpus, s.milli), w) for s, w in zip(mix.shapes, mix.weights, strict=True))


def gpu_request(task: Task) -> ContainerRequest | None:
    """The extender's view of a task's GPU ask: `num_gpu` GPUs, each `share // 10` percent of memory and cores
    (None: CPU only); a share task with `gpu_memory_mib` asks those MiB and no cores (`nvidia.com/gpumem`
    alone)."""
    if task.num_gpu <= 0:
        return None
    if task.gpu_memory_mib > 0 and task.num_gpu == 1:
        return ContainerRequest(1, task.gpu_memory_mib, None, 0)
    percent = task.share // 10
    return ContainerRequest(task.num_gpu, 0, percent, percent)


class Cluster:
    """Nodes, their GPUs and what is placed on them; `place` and `release` pods."""

    def __init__(
        self,
        specs: Sequence[NodeSpec],
        mix: TaskMix,
        policy: Policy,
        seed: int,
        *,
        extender_weight: int = DEFAULT_EXTENDER_WEIGHT,
        percentage_of_nodes_to_score: int | None = DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE,
        extender_mix: TaskMix | None = None,
    ) -> None:
        if policy.choice == INSTALL:  # the component's kube-scheduler configuration
            extender_weight = INSTALL_EXTENDER_WEIGHT
            percentage_of_nodes_to_score = INSTALL_PERCENTAGE_OF_NODES_TO_SCORE
        if extender_weight < 1:
            raise ValueError(f"extender_weight: expected a positive whole number, got {extender_weight}")
        percentage = percentage_of_nodes_to_score
        if percentage is not None and not 0 <= percentage <= 100:
            raise ValueError(f"percentage_of_nodes_to_score: expected 0..100 (0: adaptive), got {percentage}")
        self.specs = list(specs)
        self.mix = mix
        self.mixa = arrays(mix)
        self.gpu_mix = extender_mix if extender_mix is not None else gpu_mix(mix)
        """The mix the extender's fragmentation policy uses (`fragmentation-extender`): `extender_mix`, the
        one it learns (`experiments.extender_mix`), or `mix` given as `--fragmentation-mix` (GPU shapes
        only)."""
        self.policy = policy
        self.extender_weight = extender_weight
        self.rng = np.random.default_rng(seed)
        self.table = GPUTable()
        self.nodes: list[NodeGPUs] = []
        if any(s.mig for s in self.specs) and policy.name not in MIG_POLICIES:
            raise ValueError(
                f"policy {policy.name}: does not place pods on MIG nodes; "
                f"expected one of {', '.join(MIG_POLICIES)}"
            )
        for spec in self.specs:
            if spec.mig:
                node = NodeGPUs.of(spec.name, [mig_gpu_info(spec, i) for i in range(spec.gpus)])
                self.nodes.append(node)
                self.table.set_node(node)
                continue
            gpus = [
                GPUInfo(
                    id=f"{spec.name}-gpu{i}",
                    index=i,
                    count=spec.split,
                    devmem=spec.gpu_memory_mib,
                    devcore=100,
                    type=spec.model,
                    numa=i // -(-spec.gpus // max(spec.numa_nodes, 1)),
                    health=True,
                )
                for i in range(spec.gpus)
            ]
            node = NodeGPUs.of(spec.name, gpus)
            self.nodes.append(node)
            self.table.set_node(node)
        self.rows = self.table.rows([s.name for s in self.specs])
        if not np.array_equal(self.rows, np.arange(len(self.specs))):
            raise ValueError("node names must be distinct")
        self.sample_size = num_feasible_nodes_to_find(percentage, len(self.specs))
        """Feasible nodes kube-scheduler looks for before it scores (`percentageOfNodesToScore`)."""
        self.name_order = np.array(
            sorted(range(len(self.specs)), key=lambda r: self.specs[r].name), dtype=np.int64
        )
        """The scheduler stand-in's node order (its cache lists nodes by name)."""
        self.next_start = 0
        """Where kube-scheduler's next search for feasible nodes starts (an index into `name_order`)."""
        self.name_rank = np.empty(len(self.specs), dtype=np.int64)
        """Per node, the place of its name in lexicographic order (`_first_by_name`)."""
        self.name_rank[sorted(range(len(self.specs)), key=lambda i: self.specs[i].name)] = np.arange(
            len(self.specs)
        )
        self.cpu_cap = np.array([s.cpu_milli for s in self.specs], dtype=np.int64)
        self.mem_cap = np.array([s.memory_mib for s in self.specs], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.cpu_scored = np.zeros(len(self.specs), dtype=np.int64)
        self.mem_scored = np.zeros(len(self.specs), dtype=np.int64)
        """CPU and memory of the placed pods with kube-scheduler's non-zero defaults (what it scores)."""
        models = sorted({s.model for s in self.specs})
        model_of = {m: i for i, m in enumerate(models)}
        self.model_id = np.array([model_of[s.model] for s in self.specs], dtype=np.int64)
        self.model_ok = np.array(
            [
                [
                    not shape.models or DeviceSelector(use_types=shape.models).type_allowed(m)
                    for shape in mix.shapes
                ]
                for m in models
            ],
            dtype=np.bool_,
        ).reshape(len(models), len(mix.shapes))
        self._scored: dict[tuple[ContainerRequest, DeviceSelector], dict[int, int]] = {}
        """The extender's fragmentation score per ask and node, while the node's GPUs stay as they are."""
        self.gpus_total = int(sum(s.gpus for s in self.specs))
        self.allocated = 0
        """Milli-GPUs the placed pods asked (the trace's unit)."""
        n = len(self.specs)
        self.free = np.zeros((n, self.table.width), dtype=np.int64)
        self.small = np.zeros((n, len(mix.shapes)), dtype=np.int64)
        self.holding = np.zeros((n, len(mix.shapes)), dtype=np.int64)
        self.node_frag = np.zeros(n, dtype=np.float64)
        """F_n(M) of each node as it is (kept per node)."""
        self._refresh(np.arange(n))
        self._hash = (
            np.random.default_rng(0).integers(1, 2**62, size=self.table.width + 4, dtype=np.int64) | 1
        )

    # --- state ---------------------------------------------------------------------------------------------

    def _refresh(self, rows: IntArray) -> None:
        t = self.table
        if self.free.shape[1] != t.width:  # pragma: no cover - the table is as wide as the widest node
            raise RuntimeError("GPU table width changed")
        free = free_milli_arrays(
            t.count[rows],
            t.used[rows],
            t.devmem[rows],
            t.usedmem[rows],
            t.devcore[rows],
            t.usedcores[rows],
            t.present[rows] & t.healthy[rows] & ~t.cordoned[rows],
        )
        self.free[rows] = free
        self.small[rows], self.holding[rows] = shape_terms(free, self.mixa)
        self.node_frag[rows] = self._frag(rows)

    def _set(self, row: int, node: NodeGPUs) -> None:
        self.nodes[row] = node
        for scored in self._scored.values():
            scored.pop(row, None)
        self.table.set_node(node)
        free = np.zeros((1, self.free.shape[1]), dtype=np.int64)
        free[0, : len(node.gpus)] = [gpu_free_milli(g) for g in node.gpus]
        self.free[row] = free[0]
        small, holding = shape_terms(free, self.mixa)
        self.small[row], self.holding[row] = small[0], holding[0]

    def host_ok(self, rows: IntArray, cpu: int = 0, mem: int = 0) -> BoolArray:
        """(rows, shapes): whether each node's model, CPU and memory (less `cpu`, `mem`) take each shape."""
        ok = self.model_ok[self.model_id[rows]]
        ok = ok & ((self.cpu_free[rows] - cpu)[:, None] >= self.mixa.cpu)
        ok = ok & ((self.mem_free[rows] - mem)[:, None] >= self.mixa.memory)
        result: BoolArray = ok
        return result

    def _frag(self, rows: IntArray) -> FloatArray:
        return combine(
            self.small[rows], self.holding[rows], self.free[rows].sum(axis=1), self.mixa, self.host_ok(rows)
        )

    def fragmentation(self) -> FloatArray:
        """F_n(M) per node (milli-GPUs)."""
        return self.node_frag.copy()

    def cluster_fragmentation(self) -> float:
        """Sum of F_n(M), in GPUs."""
        return float(self.node_frag.sum()) / MILLI

    # --- placing -------------------------------------------------------------------------------------------

    def _pick(self, tied: IntArray) -> int:
        """One of the equally good rows, at random (kube-scheduler's selectHost)."""
        return int(tied[0] if len(tied) == 1 else tied[self.rng.integers(len(tied))])

    def _first_by_name(self, rows: IntArray, score: IntArray, gpu: IntArray | None = None) -> int:
        """The index into `rows` (nodes; with `gpu`, the GPU index of each entry) of the best score; among
        equal ones the node whose name sorts first, then the lowest GPU index. So the paper's simulator
        breaks FGD's ties: its kube-scheduler fork takes the smallest node name among equal scores
        (hkust-adsl/kubernetes-scheduler-simulator vendor/k8s.io/kubernetes/pkg/scheduler/core/
        generic_scheduler.go `selectHost`, from github.com/mental2008/kubernetes v1.20.5-minor) and FGD
        the first GPU of the node's best score (pkg/simulator/plugin/fgd_score.go
        `calculateGpuShareFragExtendScore`). kube-scheduler itself takes one at random; on OpenB's
        gpushare100 that leaves about a third more GPUs unallocated (docs/planning.md, Results)."""
        ties = np.flatnonzero(score == score.max())
        keys = (self.name_rank[rows[ties]],) if gpu is None else (gpu[ties], self.name_rank[rows[ties]])
        return int(ties[np.lexsort(keys)[0]])

    def place(self, task: Task) -> Placement | None:
        """Place `task` by the policy, or None when no node takes it."""
        if self.policy.choice == FGD:
            return self._place_fgd(task)
        best = self.best_rows(task)
        if len(best) == 0:
            self.next_start = self._sample(task)[1]
            return None
        return self.place_on(task, self._pick(best))

    def _sample(self, task: Task) -> tuple[BoolArray, int]:
        """kube-scheduler's search for feasible nodes (its own filters: CPU and memory here): from
        `next_start` in name order until `sample_size` pass (hami_sim.scheduler.standin `_filter`,
        kube's `findNodesThatPassFilters`). (the nodes found, where the next search starts)."""
        ok: BoolArray = (self.cpu_free >= task.cpu_milli) & (self.mem_free >= task.memory_mib)
        n = len(ok)
        if self.sample_size >= n:
            return ok, self.next_start
        order = self.name_order[(self.next_start + np.arange(n)) % n]
        passed = ok[order]
        found = np.cumsum(passed)
        processed = n if found[-1] < self.sample_size else int(np.searchsorted(found, self.sample_size)) + 1
        sampled = np.zeros(n, dtype=np.bool_)
        sampled[order[:processed]] = passed[:processed]
        return sampled, (self.next_start + processed) % n

    def score_nodes(self, task: Task) -> tuple[IntArray, IntArray]:
        """(rows of the nodes that take `task`, each one's total as kube-scheduler ranks them) for the
        `SCHEDULER` and `HAMI` choices (HAMi: only its one node, total 0). See the module note."""
        if self.policy.choice == FGD:
            raise ValueError(f"policy {self.policy.name}: picks node and GPU together, not by node score")
        request = gpu_request(task)
        ok_host = self._sample(task)[0]
        if request is None:
            cand = np.flatnonzero(ok_host)
            if self.policy.choice == INSTALL and len(cand) > 1:
                cand = self._install_cpu_only(task, cand)
            return cand, self.least_allocated(cand, task)
        selector = DeviceSelector(use_types=task.models) if task.models else NO_SELECTOR
        simple = simple_ask(self.table, ((request, False),), selector, self.policy.gpu, None)
        if simple is None:  # pragma: no cover - one container, no numa-bind, no quota: always covered
            raise RuntimeError("the GPU table does not cover the pod")
        ev = evaluate(self.table, self.rows, simple)
        fits = ev.fits & ok_host
        slow = np.zeros(len(fits), dtype=np.bool_) if ev.slow is None else ev.slow & ok_host
        for row in np.flatnonzero(slow).tolist():  # MIG nodes: fit_pod node by node (extender `_fit_slow`)
            got = fit_pod(self.nodes[row], ((request, False),), selector=selector, policy=self.policy.gpu)
            fits[row] = isinstance(got, Fit)
        cand = np.flatnonzero(fits)
        if len(cand) == 0:
            return cand, np.zeros(0, dtype=np.int64)
        if self.policy.choice == BEST:
            cand = self._least_fragmenting(task, request, cand)
        if self.policy.choice == INSTALL and len(cand) > 1:
            cand = self._install_gpu(task, request, cand, slow[cand])
        if self.policy.choice == HAMI:
            return np.array([self._hami(cand)], dtype=np.int64), np.zeros(1, dtype=np.int64)
        extender = self._extender_scores(request, selector, simple, ev, cand)
        for i in np.flatnonzero(slow[cand]).tolist():  # the extender's `_slow_rows`: node by node
            extender[i] = self._priority(int(cand[i]), request, selector)
        total: IntArray = self.least_allocated(cand, task) + extender * self.extender_weight * (
            MAX_NODE_SCORE // MAX_SCORE
        )
        return cand, total

    def best_rows(self, task: Task) -> IntArray:
        """The rows of the nodes kube-scheduler would choose among for `task` (the best total; kube
        breaks the tie at random), empty when none takes it. Not for the `FGD` choice."""
        cand, total = self.score_nodes(task)
        if len(cand) == 0:
            return cand
        result: IntArray = cand[total == total.max()]
        return result

    def place_on(self, task: Task, row: int) -> Placement:
        """Place `task` on the node of `row`, its GPUs as fit_pod picks them under the policy's GPU
        policy. ValueError when the node does not take it."""
        name = self.specs[row].name
        if self.cpu_free[row] < task.cpu_milli or self.mem_free[row] < task.memory_mib:
            raise ValueError(f"task {task.name}: node {name} has too little CPU or memory left")
        if self.policy.choice != FGD:
            self.next_start = self._sample(task)[1]
        request = gpu_request(task)
        if request is None:
            return self._apply(row, (), task)
        selector = DeviceSelector(use_types=task.models) if task.models else NO_SELECTOR
        mix = self.mix if self.policy.choice == HAMI else self.gpu_mix
        requests = ((request, False),)
        got = fit_pod(self.nodes[row], requests, selector=selector, policy=self.policy.gpu, mix=mix)
        if not isinstance(got, Fit):
            raise ValueError(f"task {task.name}: node {name} does not take it: {got.message}")
        return self._apply(row, footprint_slices(got.allocation, APP), task, got.mig)

    def _least_fragmenting(self, task: Task, request: ContainerRequest, cand: IntArray) -> IntArray:
        """The candidates the extender's /filter keeps under `--fragmentation-filter best`: those where
        the node's fragmentation for the extender's mix, with CPU in the measure, grows least
        (`frag.least_growth`; each node's free CPU is its allocatable less the requests of every pod on
        it, which hami-control's pod store watches)."""
        selector = DeviceSelector(use_types=task.models) if task.models else NO_SELECTOR
        simple = simple_ask(self.table, ((request, False),), selector, self.policy.gpu, None)
        if simple is None:  # pragma: no cover - one container, no numa-bind, no quota: always covered
            raise RuntimeError("the GPU table does not cover the pod")
        asked = evaluate(self.table, cand, simple)
        growth = fragmentation_growth(
            self.table, asked, request, self.gpu_mix, self.cpu_free[cand], task.cpu_milli
        )
        result: IntArray = cand[growth == growth.min()]
        return result

    def _install_gpu(
        self, task: Task, request: ContainerRequest, cand: IntArray, slow: BoolArray
    ) -> IntArray:
        """What the first extender entry's /filter answers under `--fragmentation-filter one`
        (`extender._least_fragmenting`): the one candidate of FGD's best score for the extender's mix with
        CPU in the measure (`gputable.fragmentation_best_scores`), the fuller node on ties, then the first
        by name (`frag.first_best`).
        Nodes fitted node by node (MIG) are not narrowed, as in the extender."""
        fast = cand[~slow]
        if len(fast) <= 1:
            return cand
        selector = DeviceSelector(use_types=task.models) if task.models else NO_SELECTOR
        simple = simple_ask(self.table, ((request, False),), selector, self.policy.gpu, None)
        if simple is None:  # pragma: no cover - one container, no numa-bind, no quota: always covered
            raise RuntimeError("the GPU table does not cover the pod")
        asked = evaluate(self.table, fast, simple)
        score = fragmentation_best_scores(
            self.table, asked, request, self.gpu_mix, self.cpu_free[fast], task.cpu_milli
        )
        names = [self.specs[r].name for r in fast.tolist()]
        chosen = fast[first_best(score, names, self.free[fast].sum(axis=1))]
        result: IntArray = np.sort(np.concatenate([cand[slow], [chosen]])).astype(np.int64)
        return result

    def _install_cpu_only(self, task: Task, cand: IntArray) -> IntArray:
        """What the second extender entry's /cpu-filter answers for a pod that asks no GPU
        (`extender.cpu_filter_nodes`): the one candidate of FGD's best score, the fuller node on ties, then
        the first by name."""
        free = free_milli_rows(self.table, cand)
        score = cpu_only_scores(free, self.gpu_mix, self.cpu_free[cand], task.cpu_milli)
        names = [self.specs[r].name for r in cand.tolist()]
        result: IntArray = cand[[first_best(score, names, free.sum(axis=1))]]
        return result

    def _extender_scores(
        self,
        request: ContainerRequest,
        selector: DeviceSelector,
        simple: SimpleAsk,
        ev: Evaluation,
        cand: IntArray,
    ) -> IntArray:
        """hami-control's /prioritize scores (0..10) of the candidates, as `extender.prioritize_nodes`
        computes them: vectorised where it is, fit_pod's choice node by node where it is not."""
        node_policy = self.policy.node
        if node_policy is None:  # pragma: no cover - HAMI choice only
            raise RuntimeError("no node policy")
        if node_policy is NodePolicy.FRAGMENTATION:
            return self._fragmentation_scores(request, selector, simple, cand)
        slice_mem, sums = score_inputs(self.table, ev)
        scores = node_scores(slice_mem, sums, request, node_policy)[cand]
        exact = np.flatnonzero(slice_mem[cand] < 0)  # a percentage over GPUs of different sizes
        for i in exact.tolist():
            scores[i] = self._priority(int(cand[i]), request, selector)
        return scores

    def _priority(self, row: int, request: ContainerRequest, selector: DeviceSelector) -> int:
        """`PodAsk.priority` of fit_pod's choice on one node (the extender's node-by-node path)."""
        node, policy, mix = self.nodes[row], self.policy, self.gpu_mix
        got = fit_pod(node, ((request, False),), selector=selector, policy=policy.gpu, mix=mix)
        if not isinstance(got, Fit) or policy.node is None:  # pragma: no cover - the table said it fits
            return 0
        return node_priority(node, footprint_slices(got.allocation, APP), policy.node, mix)

    def _fragmentation_scores(
        self, request: ContainerRequest, selector: DeviceSelector, simple: SimpleAsk, cand: IntArray
    ) -> IntArray:
        """The extender's fragmentation scores: `gputable.fragmentation_scores` for a one-GPU pod under the
        fragmentation GPU policy (node by node where it says so), else node by node. A node's score
        depends on its GPUs and the ask alone (the same per-row operations whatever the other rows), so
        it is kept per ask until the node's GPUs change (`_set`): an unchanged node is not scored again."""
        cache = self._scored.setdefault((request, selector), {})
        missing = [r for r in cand.tolist() if r not in cache]
        if missing:
            rows = np.array(missing, dtype=np.int64)
            if request.nums == 1 and self.policy.gpu == (GPUPolicy.FRAGMENTATION,):
                asked = evaluate(self.table, rows, simple)
                scores, slow = fragmentation_scores(self.table, asked, request, self.gpu_mix)
                fresh = scores.tolist()
                for i in np.flatnonzero(slow).tolist():
                    fresh[i] = self._priority(missing[i], request, selector)
            else:
                fresh = [self._priority(r, request, selector) for r in missing]
            cache.update(zip(missing, fresh, strict=True))
        return np.array([cache[r] for r in cand.tolist()], dtype=np.int64)

    def least_allocated(self, rows: IntArray, task: Task) -> IntArray:
        """kube-scheduler's NodeResourcesFit LeastAllocated score (0..100) of each node for `task`,
        vectorised `hami_sim.scheduler.fit.least_allocated_score`: per resource with a capacity,
        `(capacity - requested) x 100 // capacity` (0 when over), requested with the non-zero defaults;
        the mean (integer) over CPU and memory."""
        cpu = self.cpu_scored[rows] + (task.cpu_milli or DEFAULT_MILLI_CPU)
        mem = self.mem_scored[rows] + (task.memory_mib or DEFAULT_MEMORY_MIB)
        total = np.zeros(len(rows), dtype=np.int64)
        weights = np.zeros(len(rows), dtype=np.int64)
        for cap, req in ((self.cpu_cap[rows], cpu), (self.mem_cap[rows], mem)):
            has = cap > 0
            score = np.where(req > cap, 0, (cap - req) * MAX_NODE_SCORE // np.maximum(cap, 1))
            total += np.where(has, score, 0)
            weights += has
        result: IntArray = np.where(weights > 0, total // np.maximum(weights, 1), 0)
        return result

    def _place_fgd(self, task: Task) -> Placement | None:
        """The `FGD` choice: node and GPU where the fragmentation grows least."""
        request = gpu_request(task)
        ok_host = (self.cpu_free >= task.cpu_milli) & (self.mem_free >= task.memory_mib)
        if request is None:
            cand = np.flatnonzero(ok_host)
            if len(cand) == 0:
                return None
            row = self._cpu_only(task, cand)
            return self._apply(row, (), task)
        selector = DeviceSelector(use_types=task.models) if task.models else NO_SELECTOR
        requests = ((request, False),)
        simple = simple_ask(self.table, requests, selector, self.policy.gpu, None)
        if simple is None:  # pragma: no cover - one container, no numa-bind, no quota: always covered
            raise RuntimeError("the GPU table does not cover the pod")
        ev = evaluate(self.table, self.rows, simple)
        fits = ev.fits & ok_host
        cand = np.flatnonzero(fits)
        if len(cand) == 0:
            return None
        gpu_policy = self.policy.gpu
        row, uuid = self._fgd(task, request, cand, ev.code[cand] == 0, ev.mem[cand])
        if uuid is not None:
            selector = DeviceSelector(use_types=task.models, use_uuids=(uuid,))
            gpu_policy = (GPUPolicy.BINPACK,)  # one GPU allowed: the order does not matter
        got = fit_pod(self.nodes[row], requests, selector=selector, policy=gpu_policy, mix=self.mix)
        if not isinstance(got, Fit):  # pragma: no cover - evaluate said it fits
            raise RuntimeError(
                f"fit_pod disagrees with the GPU table on {self.specs[row].name}: {got.message}"
            )
        return self._apply(row, footprint_slices(got.allocation, APP), task)

    def _apply(
        self, row: int, slices: tuple[GPUSlice, ...], task: Task, mig: tuple[MigAllocation, ...] = ()
    ) -> Placement:
        self.cpu_free[row] -= task.cpu_milli
        self.mem_free[row] -= task.memory_mib
        self.cpu_scored[row] += task.cpu_milli or DEFAULT_MILLI_CPU
        self.mem_scored[row] += task.memory_mib or DEFAULT_MEMORY_MIB
        if slices:
            self._set(row, with_slices(self.nodes[row], slices, mig))
        self.node_frag[row] = self._frag(np.array([row]))[0]
        self.allocated += task.gpu_request
        return Placement(row, slices, task, mig)

    def release(self, placement: Placement) -> None:
        row, task = placement.row, placement.task
        self.cpu_free[row] += task.cpu_milli
        self.mem_free[row] += task.memory_mib
        self.cpu_scored[row] -= task.cpu_milli or DEFAULT_MILLI_CPU
        self.mem_scored[row] -= task.memory_mib or DEFAULT_MEMORY_MIB
        if placement.slices:
            self._set(row, without_slices(self.nodes[row], placement.slices, placement.mig))
        self.node_frag[row] = self._frag(np.array([row]))[0]
        self.allocated -= task.gpu_request

    def _cpu_only(self, task: Task, cand: IntArray) -> int:
        """The `FGD` choice for a pod that asks no GPU: scored by the growth of its node's fragmentation
        (its CPU changes which shapes the node can host), as the paper's simulator scores it. (Under the
        other choices such a pod never reaches the extender: `score_nodes` ranks it by LeastAllocated.)"""
        before = self.node_frag[cand]
        after = combine(
            self.small[cand],
            self.holding[cand],
            self.free[cand].sum(axis=1),
            self.mixa,
            self.host_ok(cand, task.cpu_milli, task.memory_mib),
        )
        score = simulator_score(after - before, np.zeros(len(cand), dtype=np.int64), self.mix)
        return int(cand[self._first_by_name(cand, score)])

    def _hami(self, cand: IntArray) -> int:
        sums = self.table.sums[cand].astype(np.float32)
        used, count, usedcores, devcore, usedmem, devmem = (sums[:, k] for k in range(6))
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.float32(10) * (used / count + usedcores / devcore + usedmem / devmem)
        score = np.where((count > 0) & (devcore > 0) & (devmem > 0), score, np.float32(0))
        best = score.max()
        return int(cand[np.flatnonzero(score == best)[-1]])

    def _fgd(
        self, task: Task, request: ContainerRequest, cand: IntArray, passing: BoolArray, mem: IntArray
    ) -> tuple[int, str | None]:
        """The node (and, for a one-GPU pod, the GPU) where the fragmentation grows least."""
        a = self.mixa
        before = self.node_frag[cand]
        free = self.free[cand]
        total = free.sum(axis=1)
        if request.nums > 1:  # whole idle GPUs: their free amount goes from 1000 to 0
            host = self.host_ok(cand, task.cpu_milli, task.memory_mib)
            holding = self.holding[cand] - request.nums
            after = combine(self.small[cand], holding, total - MILLI * request.nums, a, host)
            taken = np.full(len(cand), MILLI * request.nums, dtype=np.int64)
            score = simulator_score(after - before, taken, self.mix)
            return int(cand[self._first_by_name(cand, score)]), None
        # One-GPU pod: a growth per (node, GPU that passes). Pairs with the same node state (its free
        # amounts as a multiset, the shapes it hosts before and after) and the same GPU change score
        # alike: compute each distinct one once (keyed by a 64-bit hash of those values).
        t = self.table
        newfree = free_milli_arrays(
            t.count[cand],
            t.used[cand] + 1,
            t.devmem[cand],
            t.usedmem[cand] + mem,
            t.devcore[cand],
            t.usedcores[cand] + request.coresreq,
            t.present[cand] & t.healthy[cand] & ~t.cordoned[cand],
        )
        host = self.host_ok(cand, task.cpu_milli, task.memory_mib)
        bits = np.int64(1) << (np.arange(host.shape[1], dtype=np.int64) % 62)
        w = self._hash
        width = free.shape[1]
        node_key = (
            np.sort(free, axis=1) @ w[:width]
            + (host @ bits) * w[width]
            + (self.host_ok(cand) @ bits) * w[width + 1]
        )
        cc, gg = np.nonzero(passing)
        was, now = free[cc, gg], newfree[cc, gg]
        _, first, which = np.unique(
            node_key[cc] + was * w[width + 2] + now * w[width + 3], return_index=True, return_inverse=True
        )
        pc = cc[first]
        rows = cand[pc]
        after = after_change(
            self.small[rows], self.holding[rows], total[pc], was[first], now[first], self.mix, host[pc]
        )
        score = simulator_score(after - before[pc], was[first] - now[first], self.mix)[which.ravel()]
        i = self._first_by_name(cand[cc], score, gg)
        row = int(cand[cc[i]])
        return row, self.nodes[row].gpus[int(gg[i])].id


__all__ = [
    "FGD",
    "HAMI",
    "INSTALL",
    "MIG_POLICIES",
    "POLICIES",
    "SCHEDULER",
    "Cluster",
    "Placement",
    "Policy",
    "gpu_mix",
    "gpu_request",
    "mig_gpu_info",
]
