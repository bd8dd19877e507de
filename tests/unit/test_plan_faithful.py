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
from hami_control.extender import (
    NOT_LEAST_FRAGMENTING,
    Candidates,
    HostCPU,
    PodAsk,
    cpu_filter_nodes,
    filter_nodes,
    prioritize_nodes,
)
from hami_control.fit import NO_SELECTOR
from hami_control.frag import TaskMix, TaskShape, parse_mix
from hami_control.usage import NodeGPUs
from hami_node.gpu.inventory import generate_inventory
from hami_sim.plan import DEFAULT_EXTENDER_WEIGHT, DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE
from hami_sim.plan.engine import BEST, POLICIES, Cluster, gpu_mix, gpu_request
from hami_sim.plan.inputs import NodeSpec, Task
from hami_sim.scheduler import SchedulerStandIn
from hami_sim.scheduler import fit as kube
from hami_sim.scheduler.config import load_configuration, load_scheduler_config

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
SCHEDULED = ("binpack", "spread", "topology", "fragmentation-extender", "fragmentation-best")
CPU_MIX = TaskMix.of(
    [
        (TaskShape(1, 1000, 4000), 40),
        (TaskShape(1, 500, 2000), 25),
        (TaskShape(1, 250, 1000), 20),
        (TaskShape(2, 1000, 8000), 10),
        (TaskShape(4, 1000, 16000), 5),
    ]
)
"""A mix learned with each shape's CPU (`--fragmentation-filter best`)."""
NARROWED: list[str] = []
"""Nodes the extender's /filter left out under `--fragmentation-filter best` (`stand_in_totals`)."""


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
    request = gpu_request(task)
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
    if policy.choice == BEST:
        # The extender's /filter over the nodes kube-scheduler's own filters pass keeps exactly the nodes
        # the planner scores (kube-scheduler scores only those).
        feasible = [
            spec.name
            for r, spec in enumerate(cluster.specs)
            if cluster.cpu_free[r] >= task.cpu_milli and cluster.mem_free[r] >= task.memory_mib
        ]
        free = {spec.name: int(cluster.cpu_free[r]) for r, spec in enumerate(cluster.specs)}
        narrow = HostCPU(free.get, task.cpu_milli)
        result = filter_nodes(
            extender_ask, Candidates(tuple(feasible)), View(cluster), table=cluster.table, narrow=narrow
        )
        assert sorted(result["NodeNames"]) == sorted(names)
        NARROWED.extend(n for n, why in result["FailedNodes"].items() if why == NOT_LEAST_FRAGMENTING)
    # Vectorised (with the GPU table, as the service answers) and node by node must agree.
    answer = prioritize_nodes(extender_ask, Candidates(names), View(cluster), table=cluster.table)
    assert answer == prioritize_nodes(extender_ask, Candidates(names), View(cluster))
    pairs = [(a["Host"], a["Score"]) for a in answer]
    return kube.combine_scores(own, [(pairs, weight)])


def test_the_default_extender_weight_and_node_share_are_the_shipped_configurations() -> None:
    config = load_configuration(ROOT / "daemonset" / "scheduler" / "kube-scheduler-config.yaml")
    assert [e.weight for e in config.extenders] == [DEFAULT_EXTENDER_WEIGHT]
    (profile,) = config.profiles
    shipped = profile.percentage_of_nodes_to_score or config.percentage_of_nodes_to_score
    assert shipped == DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE


def many_nodes(n: int) -> list[NodeSpec]:
    # Listed out of name order: the search goes by name, as the stand-in's cache lists nodes.
    return [NodeSpec(f"m{i:03d}", 4000 if i % 3 else 1000, 16384, 1, "T4", 15360) for i in reversed(range(n))]


def test_above_100_nodes_only_the_first_feasible_ones_from_the_last_stop_are_scored() -> None:
    # 150 nodes, every third one with 1 CPU: kube's adaptive share of 150 nodes is 100 feasible nodes.
    cluster = Cluster(many_nodes(150), MIX, POLICIES["binpack"], seed=1)
    assert cluster.sample_size == 100
    name = {r: int(cluster.specs[r].name[1:]) for r in range(150)}
    big = Task(
        "big", 2000, 1024, 1, 500
    )  # fits the 100 nodes of 4 CPUs only: all of them, every node searched
    rows, _ = cluster.score_nodes(big)
    assert sorted(name[r] for r in rows) == [i for i in range(150) if i % 3]
    small = Task("small", 500, 1024, 1, 500)  # fits all: the first 100 by name
    rows, _ = cluster.score_nodes(small)
    assert sorted(name[r] for r in rows) == list(range(100))
    got = cluster.place(small)
    assert got is not None and name[got.row] < 100
    assert cluster.next_start == 100  # the next search starts after the last node looked at
    rows, _ = cluster.score_nodes(small)
    assert sorted(name[r] for r in rows) == list(range(50)) + list(range(100, 150))
    # A pod that fits nowhere looks at every node: the start stays.
    assert cluster.place(Task("huge", 99999, 1, 0, 0)) is None
    assert cluster.next_start == 100
    every = Cluster(many_nodes(150), MIX, POLICIES["binpack"], seed=1, percentage_of_nodes_to_score=100)
    assert len(every.score_nodes(small)[0]) == 150


def test_the_search_for_feasible_nodes_is_the_stand_ins() -> None:
    """Step by step against the scheduler stand-in's own search (`SchedulerStandIn._filter`, run on its
    node infos), over 230 nodes of assorted CPU and memory and pods that fill them: the same nodes found,
    and the same place to start the next search."""
    rng = random.Random(11)
    specs = [
        NodeSpec(
            f"w{rng.randrange(10**6):06d}-{i}",
            rng.choice([2000, 4000, 8000]),
            rng.choice([4096, 16384]),
            0,
            "T4",
        )
        for i in range(230)
    ]
    cluster = Cluster(specs, MIX, POLICIES["binpack"], seed=1)
    standin = SchedulerStandIn(
        load_scheduler_config(ROOT / "daemonset" / "scheduler" / "kube-scheduler-config.yaml")
    )
    infos = {r: node_info(cluster, r) for r in range(len(specs))}
    ordered = sorted(infos.values(), key=lambda i: i.name)
    row_of = {cluster.specs[r].name: r for r in infos}
    placed = 0
    for i in range(700):
        task = Task(f"t{i}", rng.choice([1000, 2000, 3000]), rng.choice([512, 2048]), 0, 0)
        pod = kube_pod(task)
        ask = kube.PodAsk.of(pod)
        feasible, _ = standin._filter(pod, ask, ordered)
        rows, _ = cluster.score_nodes(task)
        assert sorted(row_of[n.name] for n in feasible) == sorted(rows.tolist()), i
        if not feasible:
            assert cluster.place(task) is None
        else:
            chosen = rng.choice(feasible)
            cluster.place_on(task, row_of[chosen.name])
            chosen.add_pod(ask)
            placed += 1
        assert cluster.next_start == standin._next_start, i
    assert 100 < placed < 600


def test_hami_sees_only_the_nodes_kube_scheduler_found() -> None:
    cluster = Cluster(many_nodes(150), MIX, POLICIES["hami"], seed=1)
    cluster.next_start = 120
    (row,) = cluster.best_rows(Task("a", 500, 1024, 1, 500)).tolist()
    assert int(cluster.specs[row].name[1:]) in set(range(120, 150)) | set(range(70))


@pytest.mark.parametrize("weight", [1, 3, 20])
@pytest.mark.parametrize("policy", SCHEDULED)
def test_the_planners_totals_are_the_stand_in_scores_plus_the_extenders_answer(
    policy: str, weight: int
) -> None:
    rng = random.Random(f"{policy}-{weight}")
    learned = CPU_MIX if POLICIES[policy].choice == BEST else None
    cluster = Cluster(NODES, MIX, POLICIES[policy], seed=3, extender_weight=weight, extender_mix=learned)
    placed = 0
    NARROWED.clear()
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
    assert bool(NARROWED) == (learned is not None)


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
    assert (
        main(
            [
                *argv,
                "--policies",
                "binpack",
                "--extender-weight",
                "11",
                "--percentage-of-nodes-to-score",
                "30",
            ]
        )
        == 0
    )
    text = (out / "report.md").read_text()
    assert "extender weight 11; percentage of nodes to score 30" in text
    for bad in (["--extender-weight", "0"], ["--percentage-of-nodes-to-score", "101"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, *bad])
        assert exc.value.code == 2


INSTALL_MIX = TaskMix.of(zip(CPU_MIX.shapes, CPU_MIX.weights, strict=True), cpu_only=0.25)
"""A mix learned under `--fragmentation-filter one`: each shape's CPU, a fifth of the tasks CPU-only."""


def test_the_install_places_every_pod_on_the_one_node_the_extenders_two_entries_answer() -> None:
    """`fragmentation-install`, step by step over a mixed workload: the planner's one node is what
    hami-control answers over the nodes kube-scheduler's own filters pass (every one of them:
    percentageOfNodesToScore 100): /filter under `--fragmentation-filter one` for a GPU pod, /cpu-filter
    for a pod that asks no GPU, each with the nodes' free CPU as the pod store counts it."""
    cluster = Cluster(NODES, MIX, POLICIES["fragmentation-install"], seed=3, extender_mix=INSTALL_MIX)
    assert (cluster.extender_weight, cluster.sample_size) == (11, len(NODES))
    policy = cluster.policy
    assert policy.node is not None
    kinds = {"gpu": 0, "cpu": 0}
    for task in random_tasks(random.Random("install"), 80):
        best = cluster.best_rows(task)
        feasible = tuple(
            spec.name
            for r, spec in enumerate(cluster.specs)
            if cluster.cpu_free[r] >= task.cpu_milli and cluster.mem_free[r] >= task.memory_mib
        )
        free = {spec.name: int(cluster.cpu_free[r]) for r, spec in enumerate(cluster.specs)}
        narrow = HostCPU(free.get, task.cpu_milli, one=True)
        request = gpu_request(task)
        if request is None:
            answer = cpu_filter_nodes(Candidates(feasible), cluster.table, cluster.gpu_mix, narrow)
            kinds["cpu"] += 1
        else:
            ask = PodAsk(
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
            answer = filter_nodes(
                ask, Candidates(feasible), View(cluster), table=cluster.table, narrow=narrow
            )
            kinds["gpu"] += 1
        assert [cluster.specs[r].name for r in best] == (answer["NodeNames"] or []), task
        if len(best):
            got = cluster.place(task)
            assert got is not None and got.row == int(best[0])
    assert min(kinds.values()) >= 5
