"""The planner's node choice is the whole scheduler's: kube-scheduler's own score (the scheduler
stand-in's `fit.least_allocated_score`) plus hami-control's /prioritize answer (`extender.prioritize_nodes`)
x the extender weight x 10, combined as the stand-in combines them (`fit.combine_scores`). Checked step by
step on a small mixed inventory against those functions themselves; the e2e twin
(tests/e2e/test_plan_faithful.py) checks it against the running local cluster."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from hami_api.types import ScoringWeights
from hami_control.extender import Candidates, PodAsk, prioritize_nodes
from hami_control.fit import NO_SELECTOR
from hami_control.frag import TaskMix, TaskShape, parse_mix
from hami_control.usage import NodeGPUs
from hami_node.gpu.inventory import generate_inventory
from hami_sim.plan import DEFAULT_EXTENDER_WEIGHT
from hami_sim.plan.engine import POLICIES, Cluster, _gpu_request, gpu_mix
from hami_sim.plan.inputs import NodeSpec, Task
from hami_sim.scheduler import fit as kube
from hami_sim.scheduler.config import load_configuration

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
NODES = [
    NodeSpec("n1", 8000, 32768, 1, "T4", 15360, numa_nodes=2),
    NodeSpec("n2", 16000, 65536, 2, "A100", 40960, numa_nodes=2),
    NodeSpec("n3", 24000, 98304, 4, "A100", 40960, numa_nodes=2),
    NodeSpec("n4", 32000, 131072, 4, "A100", 81920, numa_nodes=2),
    NodeSpec("n5", 48000, 196608, 8, "A100", 81920, numa_nodes=2),
]
MIX = parse_mix("1000:40,500:25,250:20,2x1000:10,4x1000:5")
SCHEDULED = ("binpack", "spread", "topology", "fragmentation-extender")


def random_tasks(rng: random.Random, n: int) -> list[Task]:
    shapes = [(1, 250), (1, 500), (1, 300), (1, 1000), (2, 1000), (4, 1000), (0, 0), (1, 700)]
    out = []
    for i in range(n):
        gpus, milli = rng.choice(shapes)
        cpu = rng.choice([0, 500, 1000, 2000, 4000])
        mem = rng.choice([0, 1024, 4096, 8192])
        out.append(Task(f"t{i}", cpu, mem, gpus, milli))
    return out


class View:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def node_gpus(self, name: str) -> NodeGPUs | None:
        return next(n for n in self.cluster.nodes if n.name == name)

    def unregistered_reason(self, name: str) -> str | None:
        return None


def kube_pod(task: Task) -> dict[str, object]:
    requests = {}
    if task.cpu_milli:
        requests["cpu"] = f"{task.cpu_milli}m"
    if task.memory_mib:
        requests["memory"] = f"{task.memory_mib}Mi"
    return {"spec": {"containers": [{"name": "main", "resources": {"requests": requests}}]}}


def node_info(cluster: Cluster, row: int) -> kube.NodeInfo:
    spec = cluster.specs[row]
    info = kube.NodeInfo(spec.name)
    info.allocatable = {"cpu": spec.cpu_milli, "memory": spec.memory_mib * MIB, "pods": 110}
    info.non_zero_requested = [int(cluster.cpu_scored[row]), int(cluster.mem_scored[row]) * MIB]
    return info


def stand_in_totals(cluster: Cluster, task: Task, rows: list[int], weight: int) -> dict[str, int]:
    """What the scheduler stand-in adds up for these feasible nodes, with hami-control's own answer."""
    ask = kube.PodAsk.of(kube_pod(task))
    own = {cluster.specs[r].name: kube.least_allocated_score(ask, node_info(cluster, r)) for r in rows}
    request = _gpu_request(task)
    if request is None:  # not the extender's pod (kube's IsInterested)
        return own
    policy = cluster.policy
    assert policy.node is not None
    extender_ask = PodAsk(
        "default",
        task.name,
        ((request, False),),
        NO_SELECTOR,
        policy.gpu,
        policy.node,
        ScoringWeights(),
        None,
        frozenset(),
        cluster.gpu_mix,
    )
    names = tuple(cluster.specs[r].name for r in rows)
    # Vectorised (with the GPU table, as the service answers) and node by node must agree.
    answer = prioritize_nodes(extender_ask, Candidates(names), View(cluster), table=cluster.table)
    assert answer == prioritize_nodes(extender_ask, Candidates(names), View(cluster))
    pairs = [(a["Host"], a["Score"]) for a in answer]
    return kube.combine_scores(own, [(pairs, weight)])


def test_the_default_extender_weight_is_the_shipped_configurations() -> None:
    config = load_configuration(ROOT / "daemonset" / "scheduler" / "kube-scheduler-config.yaml")
    assert [e.weight for e in config.extenders] == [DEFAULT_EXTENDER_WEIGHT]


@pytest.mark.parametrize("weight", [1, 3, 20])
@pytest.mark.parametrize("policy", SCHEDULED)
def test_the_planners_totals_are_the_stand_in_scores_plus_the_extenders_answer(
    policy: str, weight: int
) -> None:
    rng = random.Random(f"{policy}-{weight}")
    cluster = Cluster(NODES, MIX, POLICIES[policy], seed=3, extender_weight=weight)
    placed = 0
    for task in random_tasks(rng, 60):
        rows, totals = cluster.score_nodes(task)
        expected = stand_in_totals(cluster, task, rows.tolist(), weight)
        assert {cluster.specs[r].name: int(t) for r, t in zip(rows, totals, strict=True)} == expected, task
        best = cluster.best_rows(task)
        if len(best) == 0:
            assert cluster.place(task) is None
            continue
        top = max(expected.values())
        assert sorted(cluster.specs[r].name for r in best) == sorted(
            h for h, s in expected.items() if s == top
        )
        got = cluster.place(task)
        assert got is not None and got.row in best.tolist()
        placed += 1
    assert placed >= 15


def test_least_allocated_is_kubes_for_any_usage_and_the_non_zero_defaults() -> None:
    rng = random.Random(5)
    nodes = [
        NodeSpec(f"n{i}", rng.choice([0, 1000, 7777, 64000]), rng.choice([0, 512, 99999]), 0, "T4")
        for i in range(40)
    ]
    cluster = Cluster(nodes, MIX, POLICIES["binpack"], seed=1)
    cluster.cpu_scored[:] = [rng.randrange(0, 90000) for _ in nodes]
    cluster.mem_scored[:] = [rng.randrange(0, 120000) for _ in nodes]
    for _ in range(50):
        task = Task("t", rng.choice([0, 1, 250, 5000]), rng.choice([0, 1, 300, 4096]), 0, 0)
        ask = kube.PodAsk.of(kube_pod(task))
        rows = np.arange(len(nodes))
        want = [kube.least_allocated_score(ask, node_info(cluster, r)) for r in rows.tolist()]
        assert cluster.least_allocated(rows, task).tolist() == want


def test_a_large_weight_lets_the_extender_decide_and_leastallocated_only_break_its_ties() -> None:
    # Two idle nodes, one bigger in CPU and memory: LeastAllocated prefers the big one, binpack's extender
    # the one its pod fills more (the one-GPU node). Weight 1 lets LeastAllocated win; 11 (one extender
    # point = 110 > LeastAllocated's whole range) gives the extender's choice.
    nodes = [NodeSpec("small", 4000, 16384, 1, "T4", 15360), NodeSpec("big", 64000, 262144, 8, "T4", 15360)]
    task = Task("half", 2000, 8192, 1, 500)
    chosen = {}
    for weight in (1, 11):
        cluster = Cluster(nodes, MIX, POLICIES["binpack"], seed=1, extender_weight=weight)
        chosen[weight] = [cluster.specs[r].name for r in cluster.best_rows(task)]
    assert chosen == {1: ["big"], 11: ["small"]}


def test_hami_keeps_one_node_and_fgd_has_no_node_score() -> None:
    task = Task("a", 1000, 1024, 1, 500)
    hami = Cluster(NODES, MIX, POLICIES["hami"], seed=1)
    assert len(hami.best_rows(task)) == 1
    fgd = Cluster(NODES, MIX, POLICIES["fragmentation"], seed=1)
    with pytest.raises(ValueError, match="fragmentation: picks node and GPU together"):
        fgd.best_rows(task)


def test_place_on_takes_the_given_node_or_says_why_not() -> None:
    cluster = Cluster(NODES, MIX, POLICIES["spread"], seed=1)
    got = cluster.place_on(Task("w", 1000, 1024, 4, 1000), 4)
    assert got.row == 4 and len(got.slices) == 4
    with pytest.raises(ValueError, match="task big: node n1 does not take it"):
        cluster.place_on(Task("big", 1000, 1024, 2, 1000), 0)
    with pytest.raises(ValueError, match="task hungry: node n1 has too little CPU or memory left"):
        cluster.place_on(Task("hungry", 9000, 1024, 0, 0), 0)


def test_the_extenders_mix_is_the_gpu_part_of_the_planners() -> None:
    mix = TaskMix.of(
        [(TaskShape(1, 500, 1000, 10), 2.0), (TaskShape(1, 500, 8000, 10), 1.0), (TaskShape(2, 1000), 1.0)]
    )
    assert gpu_mix(mix) == parse_mix("500:75,2x1000:25")
    assert gpu_mix(MIX) == MIX


def test_planner_gpus_sit_on_the_numa_nodes_of_the_fake_inventory() -> None:
    cluster = Cluster(NODES, MIX, POLICIES["binpack"], seed=1)
    for spec, node in zip(NODES, cluster.nodes, strict=True):
        fake = generate_inventory(spec.gpus, spec.name)
        assert [g.info.numa for g in node.gpus] == [g.numa_node for g in fake.gpus]


def test_the_command_line_takes_the_extender_weight(tmp_path: Path) -> None:
    from hami_sim.main import main

    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,32768,2,T4\nn2,16000,65536,4,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},1000,1024,1,500\n" for i in range(12))
    )
    out = tmp_path / "out"
    argv = ["plan", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out), "--no-charts"]
    assert main([*argv, "--policies", "binpack", "--extender-weight", "11"]) == 0
    assert "extender weight 11" in (out / "report.md").read_text()
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--extender-weight", "0"])
    assert exc.value.code == 2
