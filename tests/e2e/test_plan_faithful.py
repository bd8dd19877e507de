"""Faithfulness of `hami-sim plan`: the same small workload, one pod at a time, through the full local
cluster (API server, scheduler stand-in with the shipped KubeSchedulerConfiguration, hami-control's
extender and binder, kubelets and hami-node daemons) and through the planner gives the same placements,
for binpack, spread and the extender's fragmentation policy (docs/planning.md, "Faithfulness").

kube-scheduler breaks equal totals at random, so the comparison is step by step and "up to ties": before
each pod the planner names its best nodes (`Cluster.best_rows`); the pod is created and waited for
(Running, bind-phase success) before the next, so the cluster sees the planner's order; the node the
cluster chose must be one of the planner's best, the GPUs it got (the pod's devices annotation) those the
planner's fit picks on that node (`Cluster.place_on`), which then follows the cluster. At the end of each
policy the GPU usage per node and GPU is the same in both. The nodes differ in GPUs, CPU and memory, so
ties are rare. One cluster serves the three policies (the pods carry the policy annotations); a second
one runs hami-control with `--fragmentation-filter best` and a mix with CPU per shape for
`fragmentation-best`, whose /filter answers only the least fragmenting nodes from the CPU the pods on
each node request (docs/planning.md, "A decisive extender"). A third runs the fragmentation component as
shipped (daemonset/components/fragmentation: its KubeSchedulerConfiguration with the second, ignorable
extender entry, and hami-control's flags from its kustomization) for `fragmentation-install`: every pod,
CPU-only ones included, goes to the one node hami-control's /filter or /cpu-filter answers, which must be
the planner's one node (docs/planning.md, "The install")."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    decode_pod_allocation,
)
from hami_control.frag import parse_mix
from hami_node.gpu.inventory import load_inventory
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.plan import inputs
from hami_sim.plan.engine import POLICIES
from hami_sim.plan.engine import Cluster as Planner
from tests.builders import container, pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

GIB = 1024
T4, A40, A80 = ("Tesla T4", 15360), ("NVIDIA A100-SXM4-40GB", 40960), ("NVIDIA A100-SXM4-80GB", 81920)
# (name, GPUs, model, CPU milli, memory MiB): every node a different size.
SIZES = [
    ("fa-1", 1, T4, 8000, 32 * GIB),
    ("fa-2", 2, A40, 16000, 64 * GIB),
    ("fa-3", 4, A40, 24000, 96 * GIB),
    ("fa-4", 4, A80, 32000, 128 * GIB),
    ("fa-5", 8, A80, 48000, 192 * GIB),
]
SPLIT = 10
NUMA_NODES = 2  # the fake inventory's default layout
MIX_TEXT = "1000:40,500:25,250:20,2x1000:10,4x1000:5"
CPU_MIX_TEXT = "1000/4:40,500/2:25,250/1:20,2x1000/8:10,4x1000/16:5"
"""The same shapes with their pods' CPU, for `--fragmentation-filter best`."""
# (GPUs, milli-GPU each): shares, whole GPUs, several GPUs, CPU only.
SHAPES = [(1, 250)] * 3 + [(1, 500)] * 3 + [(1, 300)] * 2 + [(1, 700)] * 2 + [(1, 1000)] * 2
SHAPES += [(2, 1000), (4, 1000), (0, 0), (0, 0)]
POLICY_ANNOTATIONS = {
    "binpack": ("binpack", "binpack"),
    "spread": ("spread", "spread"),
    "fragmentation-extender": ("fragmentation", "fragmentation"),
    "fragmentation-best": ("fragmentation", "fragmentation"),
    "fragmentation-install": ("fragmentation", "fragmentation"),
}
COMPONENT = Path(__file__).resolve().parents[2] / "daemonset" / "components" / "fragmentation"


def component_flags() -> list[str]:
    """The hami-control flags the fragmentation component's kustomization adds (its `add` ops on args)."""
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    return [
        str(op["value"])
        for patch in kustomization["patches"]
        for op in yaml.safe_load(patch["patch"])
        if op["op"] == "add" and op["path"].endswith("/args/-")
    ]


def workload() -> list[inputs.Task]:
    """24 pods of mixed shapes and CPU/memory asks (12.2 of the 19 GPUs; all fit under each policy; the
    seed is one whose pods tell the shipped extender weight from a dominant one, see the last test)."""
    rng = random.Random(175)
    return [
        inputs.Task(
            f"p{i:02d}",
            rng.choice([500, 1000, 2000, 3000]),
            rng.choice([1, 2, 4, 8]) * GIB,
            *rng.choice(SHAPES),
        )
        for i in range(24)
    ]


def planner_nodes() -> list[inputs.NodeSpec]:
    return [
        inputs.NodeSpec(name, cpu, memory, gpus, model, gpu_memory, split=SPLIT, numa_nodes=NUMA_NODES)
        for name, gpus, (model, gpu_memory), cpu, memory in SIZES
    ]


def local_cluster(
    tmp_path_factory: pytest.TempPathFactory, *control_args: str, scheduler_config: Path | None = None
) -> Cluster:
    nodes = tuple(
        NodeSpec(name, (GPUSpec(model, gpu_memory),) * gpus, cpu=f"{cpu}m", memory=f"{memory}Mi")
        for name, gpus, (model, gpu_memory), cpu, memory in SIZES
    )
    spec = ClusterSpec(
        nodes, split=SPLIT, scale=False, control_args=control_args, scheduler_config=scheduler_config
    )
    return Cluster.up(spec, tmp_path_factory.mktemp("faithful") / ".hami-sim")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory, "--fragmentation-mix", MIX_TEXT) as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def planner(policy: str, extender_weight: int = 1) -> Planner:
    """The planner as the local cluster is configured for `policy`."""
    learned = parse_mix(CPU_MIX_TEXT) if policy in {"fragmentation-best", "fragmentation-install"} else None
    return Planner(
        planner_nodes(),
        parse_mix(MIX_TEXT),
        POLICIES[policy],
        seed=1,
        extender_weight=extender_weight,
        extender_mix=learned,
    )


def task_pod(task: inputs.Task, policy: str) -> dict[str, Any]:
    """The pod the planner's task stands for: its CPU and memory requests and, for a GPU task, the
    planner's request (`engine.gpu_request`): N GPUs, each share% of memory and cores."""
    percent = task.share // 10
    main = container(
        gpus=task.num_gpu or None,
        gpumem_percentage=percent or None,
        gpucores=percent or None,
        requests={"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"},
    )
    node_policy, gpu_policy = POLICY_ANNOTATIONS[policy]
    annotations = {NODE_SCHEDULER_POLICY: node_policy, GPU_SCHEDULER_POLICY: gpu_policy}
    return pod(f"{policy}-{task.name}", main, annotations=annotations, scheduler_name="hami-scheduler")


def placed(core: Any, name: str, gpu_task: bool) -> Any:
    def done() -> Any:
        got = core.read_namespaced_pod(name, "default")
        if got.status.phase != "Running":
            return None
        bound = (got.metadata.annotations or {}).get(BIND_PHASE) == "success"
        return got if bound or not gpu_task else None

    return wait_for(done, 30, f"pod {name} Running (bind-phase success for a GPU pod)")


def gpu_indexes(cluster: Cluster) -> dict[str, int]:
    """Fake GPU UUID -> its index on its node."""
    return {g.uuid: g.index for name, *_ in SIZES for g in load_inventory(cluster.inventory_path(name)).gpus}


def remove_all(core: Any) -> None:
    for item in core.list_namespaced_pod("default").items:
        core.delete_namespaced_pod(item.metadata.name, "default", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod("default").items, 30, "every pod to go")


@pytest.mark.parametrize("policy", ["binpack", "spread", "fragmentation-extender"])
def test_the_local_cluster_places_a_workload_where_the_planner_does(
    cluster: Cluster, core: Any, policy: str
) -> None:
    follow(cluster, core, policy)


def test_the_decisive_extender_places_a_workload_where_the_planner_does(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    args = ("--fragmentation-mix", CPU_MIX_TEXT, "--fragmentation-filter", "best")
    with local_cluster(tmp_path_factory, *args) as running, core_v1(running) as api:
        follow(running, api, "fragmentation-best")


def test_the_fragmentation_install_places_every_pod_where_the_planner_does(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The shipped component (its scheduler configuration and flags; the mix fixed, as the planner's):
    CPU-only pods too go to the one node the planner names."""
    args = (*component_flags(), "--fragmentation-mix", CPU_MIX_TEXT)
    assert "--fragmentation-filter=one" in args
    config = COMPONENT / "kube-scheduler-config.yaml"
    with local_cluster(tmp_path_factory, *args, scheduler_config=config) as running, core_v1(running) as api:
        follow(running, api, "fragmentation-install")


def follow(cluster: Cluster, core: Any, policy: str) -> None:
    """Create the workload's pods one at a time; each lands on one of the planner's best nodes, on the
    GPUs its fit picks there; at the end the usage per GPU is the planner's."""
    remove_all(core)
    planner_ = planner(policy)
    names = [s.name for s in planner_.specs]
    index_of = gpu_indexes(cluster)
    usage: dict[tuple[str, int], list[int]] = {}
    for task in workload():
        rows, totals = planner_.score_nodes(task)
        best = [names[r] for r in planner_.best_rows(task)]
        assert best, f"{task}: the planner finds no node; the workload must fit"
        if policy == "fragmentation-install":  # hami-control answers one node, CPU-only pods included
            assert len(best) == 1, f"{task}: the install answers one node, the planner has {best}"
        name = f"{policy}-{task.name}"
        core.create_namespaced_pod("default", task_pod(task, policy))
        got = placed(core, name, task.num_gpu > 0)
        node = got.spec.node_name
        scores = {names[r]: int(t) for r, t in zip(rows, totals, strict=True)}
        assert node in best, f"{name}: the cluster chose {node}, the planner's best {best} (totals {scores})"
        text = (got.metadata.annotations or {}).get(DEVICES_ALLOCATED, "")
        slices = (
            [s for c in decode_pod_allocation(text).containers for s in c.devices] if task.num_gpu else []
        )
        cluster_gpus = [index_of[s.uuid] for s in slices]
        placement = planner_.place_on(task, names.index(node))
        on_node = {g.info.id: g.info.index for g in planner_.nodes[placement.row].gpus}
        assert cluster_gpus == [on_node[s.uuid] for s in placement.slices], f"{name} on {node}"
        for s in slices:
            used = usage.setdefault((node, index_of[s.uuid]), [0, 0, 0])
            used[0] += 1
            used[1] += s.usedmem
            used[2] += s.usedcores
    planned = {
        (node.name, g.info.index): [g.used, g.usedmem, g.usedcores]
        for node in planner_.nodes
        for g in node.gpus
        if g.used
    }
    assert usage == planned


@pytest.mark.parametrize("policy", ["binpack", "spread", "fragmentation-extender"])
def test_the_workload_tells_the_shipped_extender_weight_from_a_dominant_one(policy: str) -> None:
    """The comparison above has power: on this workload a planner whose extender score outweighs
    LeastAllocated's whole range (weight 11: one extender point is 110) misses the shipped weight's
    (1) choice at some step, for every policy (a planner that ignored kube-scheduler's own score, as
    this one did before, would fail the test)."""
    shipped = planner(policy)
    dominant = planner(policy, extender_weight=11)
    missed = 0
    for task in workload():
        got = shipped.place(task)
        assert got is not None
        missed += got.row not in dominant.best_rows(task).tolist()
        dominant.place_on(task, got.row)
    assert missed > 0


def test_the_workload_tells_the_decisive_extender_from_the_shipped_one() -> None:
    """The decisive extender's comparison has power: on this workload its /filter leaves fitting nodes
    out at some step, and its choice is not always one the shipped fragmentation policy would make."""
    best, shipped = planner("fragmentation-best"), planner("fragmentation-extender")
    narrowed = differs = 0
    for task in workload():
        kept = best.best_rows(task)
        narrowed += len(best.score_nodes(task)[0]) < len(shipped.score_nodes(task)[0])
        differs += not set(kept.tolist()) & set(shipped.best_rows(task).tolist())
        got = best.place(task)
        assert got is not None
        shipped.place_on(task, got.row)
    assert narrowed > 0 and differs > 0
