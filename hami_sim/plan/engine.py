"""The planner's cluster: nodes and GPUs kept as hami-control keeps them, pods placed by a policy through
the real fit and score code (`hami_control.fit`, `gputable`, `score`, `frag`). No processes, no sockets.

State: one `usage.NodeGPUs` per node (what `cache.ClusterCache` hands the extender) and the extender's
`gputable.GPUTable` over them, rewritten row by row as pods come and go; beside them the free CPU and
memory of each node (kube-scheduler's NodeResourcesFit, which the paper's simulator models too) and, per
node, the fragmentation terms of `frag` (free milli per GPU, per task shape), recomputed only for the
node that changed.

One pod (`Cluster.place`):
1. Which nodes fit: `gputable.evaluate` (the extender's vectorised `fit_pod` verdicts) and the CPU and
   memory left. A CPU-only pod needs CPU and memory only.
2. Which node: by the policy (`POLICIES`):
   - `binpack`, `spread`, `topology`: the extender's /prioritize score (`gputable.node_scores`, equal to
     `score.node_priority`; 0..10 whole numbers) with node policy binpack/spread/binpack and GPU policy
     binpack/spread/topology-aware; among the best, one at random (kube-scheduler's selectHost).
   - `hami`: HAMi v2.10's own choice (HAMi pkg/scheduler/score.go `calcScore`, policy/node_policy.go
     `ComputeDefaultScore`, scheduler.go `Filter`): the node's usage before the pod,
     `10 x (used/count + usedcores/totalcore + usedmem/totalmem)` as float32, the highest under binpack
     (HAMi's default node policy), GPU policy spread (HAMi's default); HAMi takes the last node of its
     sorted list, so among equal scores the last candidate.
   - `fragmentation`: the paper's FGD as its simulator runs it: the node and GPU where the node's
     fragmentation for the workload's mix (with CPU) grows least, scored as the simulator scores it
     (`frag.simulator_score`, whole numbers 0..100); among equal scores the node whose name sorts first,
     then its GPU of the lowest index (`_first_by_name`).
   CPU-only pods go where kube-scheduler's LeastAllocated puts them (most free CPU and memory share),
   except under `fragmentation`, which scores them the same way, as the paper does (in a real cluster
   the extender does not see pods that ask no GPU).
3. Which GPUs: `fit.fit_pod` on the chosen node with the policy's GPU policy (for `fragmentation` the
   GPU chosen in step 2, passed as `nvidia.com/use-gpuuuid`, so fit_pod checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hami_api.containers import ContainerKind, footprint_slices
from hami_api.resources import ContainerRequest
from hami_api.types import DeviceSelector, GPUInfo, GPUPolicy, GPUSlice, NodePolicy
from hami_control.fit import NO_SELECTOR, Fit, fit_pod
from hami_control.frag import (
    MILLI,
    TaskMix,
    after_change,
    arrays,
    combine,
    free_milli_arrays,
    gpu_free_milli,
    shape_terms,
    simulator_score,
)
from hami_control.gputable import GPUTable, evaluate, node_scores, score_inputs, simple_ask
from hami_control.score import node_priority
from hami_control.usage import NodeGPUs, with_slices, without_slices
from hami_sim.plan import POLICY_NAMES
from hami_sim.plan.inputs import NodeSpec, Task

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    node: NodePolicy | None
    """None: HAMi's own node choice."""
    gpu: tuple[GPUPolicy, ...]


POLICIES: dict[str, Policy] = {
    "binpack": Policy("binpack", NodePolicy.BINPACK, (GPUPolicy.BINPACK,)),
    "spread": Policy("spread", NodePolicy.SPREAD, (GPUPolicy.SPREAD,)),
    "topology": Policy("topology", NodePolicy.BINPACK, (GPUPolicy.TOPOLOGY_AWARE,)),
    "hami": Policy("hami", None, (GPUPolicy.SPREAD,)),
    "fragmentation": Policy("fragmentation", NodePolicy.FRAGMENTATION, (GPUPolicy.FRAGMENTATION,)),
}
if tuple(POLICIES) != POLICY_NAMES:  # pragma: no cover - kept in step by hand
    raise ImportError("hami_sim.plan.POLICY_NAMES and engine.POLICIES differ")
APP = (ContainerKind.APP,)
_TIE = 1e-6


@dataclass(frozen=True, slots=True)
class Placement:
    row: int
    slices: tuple[GPUSlice, ...]
    task: Task


def _gpu_request(task: Task) -> ContainerRequest | None:
    if task.num_gpu <= 0:
        return None
    percent = task.share // 10
    return ContainerRequest(task.num_gpu, 0, percent, percent)


class Cluster:
    """Nodes, their GPUs and what is placed on them; `place` and `release` pods."""

    def __init__(self, specs: Sequence[NodeSpec], mix: TaskMix, policy: Policy, seed: int) -> None:
        self.specs = list(specs)
        self.mix = mix
        self.mixa = arrays(mix)
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.table = GPUTable()
        self.nodes: list[NodeGPUs] = []
        for spec in self.specs:
            gpus = [
                GPUInfo(
                    id=f"{spec.name}-gpu{i}",
                    index=i,
                    count=spec.split,
                    devmem=spec.gpu_memory_mib,
                    devcore=100,
                    type=spec.model,
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
        self.name_rank = np.empty(len(self.specs), dtype=np.int64)
        """Per node, the place of its name in lexicographic order (`_first_by_name`)."""
        self.name_rank[sorted(range(len(self.specs)), key=lambda i: self.specs[i].name)] = np.arange(
            len(self.specs)
        )
        self.cpu_cap = np.array([s.cpu_milli for s in self.specs], dtype=np.int64)
        self.mem_cap = np.array([s.memory_mib for s in self.specs], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
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

    def _pick(
        self, candidates: IntArray, values: npt.NDArray[np.float64] | IntArray, lowest: bool = False
    ) -> int:
        """One of the candidates with the best value, at random (kube-scheduler's selectHost)."""
        v = values.astype(np.float64)
        best = v.min() if lowest else v.max()
        tied = candidates[np.abs(v - best) <= _TIE]
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
        request = _gpu_request(task)
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
        policy = self.policy
        gpu_policy = policy.gpu
        if policy.node is NodePolicy.FRAGMENTATION:
            row, uuid = self._fgd(task, request, cand, ev.code[cand] == 0, ev.mem[cand])
            if uuid is not None:
                selector = DeviceSelector(use_types=task.models, use_uuids=(uuid,))
                gpu_policy = (GPUPolicy.BINPACK,)  # one GPU allowed: the order does not matter
        elif policy.node is None:
            row = self._hami(cand)
        else:
            slice_mem, sums = score_inputs(self.table, ev)
            scores = node_scores(slice_mem, sums, request, policy.node)[cand]
            exact = np.flatnonzero(slice_mem[cand] < 0)
            for i in exact.tolist():  # a percentage over GPUs of different sizes: score fit_pod's choice
                got = fit_pod(
                    self.nodes[cand[i]], requests, selector=selector, policy=policy.gpu, mix=self.mix
                )
                if isinstance(got, Fit):
                    scores[i] = node_priority(
                        self.nodes[cand[i]], footprint_slices(got.allocation, APP), policy.node
                    )
            row = self._pick(cand, scores)
        got = fit_pod(self.nodes[row], requests, selector=selector, policy=gpu_policy, mix=self.mix)
        if not isinstance(got, Fit):  # pragma: no cover - evaluate said it fits
            raise RuntimeError(
                f"fit_pod disagrees with the GPU table on {self.specs[row].name}: {got.message}"
            )
        return self._apply(row, footprint_slices(got.allocation, APP), task)

    def _apply(self, row: int, slices: tuple[GPUSlice, ...], task: Task) -> Placement:
        self.cpu_free[row] -= task.cpu_milli
        self.mem_free[row] -= task.memory_mib
        if slices:
            self._set(row, with_slices(self.nodes[row], slices))
        self.node_frag[row] = self._frag(np.array([row]))[0]
        self.allocated += task.gpu_request
        return Placement(row, slices, task)

    def release(self, placement: Placement) -> None:
        row, task = placement.row, placement.task
        self.cpu_free[row] += task.cpu_milli
        self.mem_free[row] += task.memory_mib
        if placement.slices:
            self._set(row, without_slices(self.nodes[row], placement.slices))
        self.node_frag[row] = self._frag(np.array([row]))[0]
        self.allocated -= task.gpu_request

    def _cpu_only(self, task: Task, cand: IntArray) -> int:
        if self.policy.node is NodePolicy.FRAGMENTATION:
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
        # kube-scheduler's NodeResourcesFit LeastAllocated: mean free share of CPU and memory, 0..100.
        with np.errstate(divide="ignore", invalid="ignore"):
            cpu = np.where(
                self.cpu_cap[cand] > 0, (self.cpu_free[cand] - task.cpu_milli) * 100 // self.cpu_cap[cand], 0
            )
            mem = np.where(
                self.mem_cap[cand] > 0, (self.mem_free[cand] - task.memory_mib) * 100 // self.mem_cap[cand], 0
            )
        return self._pick(cand, (cpu + mem) // 2)

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


__all__ = ["POLICIES", "Cluster", "Placement", "Policy"]
