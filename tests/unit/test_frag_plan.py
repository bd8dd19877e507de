"""The planner's `fragmentation` policy as the paper's simulator runs FGD (hkust-adsl/kubernetes-scheduler-
simulator): its task mix (`frag.mix_from_tasks` with CPU-only tasks in the popularity cut), its whole-number
score (`frag.simulator_score`) and its tie-break (node name, then GPU index), checked against a brute force
that scores every (node, GPU) one at a time with the scalar measure and the real fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.containers import ContainerKind, footprint_slices
from hami_api.resources import ContainerRequest
from hami_api.types import DeviceSelector, GPUPolicy
from hami_control.fit import Fit, fit_pod
from hami_control.frag import (
    MixError,
    TaskMix,
    TaskShape,
    fragmentation,
    mix_from_tasks,
    node_free,
    parse_mix,
    simulator_score,
)
from hami_control.usage import with_slices
from hami_sim.plan.engine import POLICIES, Cluster
from hami_sim.plan.experiments import workload_mix
from hami_sim.plan.inputs import NodeSpec, Task

# --- the mix ------------------------------------------------------------------------------------------------


def test_cpu_only_tasks_take_part_in_the_popularity_cut_and_only_their_share_is_kept() -> None:
    shapes = [TaskShape(1, 1000)] * 50 + [TaskShape(1, 500)] * 5 + [TaskShape(1, 100)] * 4
    alone = mix_from_tasks(shapes)
    assert alone.shapes == (TaskShape(1, 1000), TaskShape(1, 500), TaskShape(1, 100))
    assert alone.cpu_share == 0
    # 41 CPU-only tasks: 50 + 41 + 5 of 100 tasks reach 95%, so the 100-milli shape is cut.
    mix = mix_from_tasks(shapes, cpu_only=[2000] * 41)
    assert mix.shapes == (TaskShape(1, 1000), TaskShape(1, 500))
    assert mix.weights == pytest.approx((50 / 55, 5 / 55))
    assert mix.cpu_share == pytest.approx(41 / 96)


def test_the_cut_goes_on_until_it_holds_a_gpu_shape() -> None:
    mix = mix_from_tasks([TaskShape(1, 300, 1000)], cpu_only=[4000] * 99)
    assert mix.shapes == (TaskShape(1, 300, 1000),)
    assert mix.cpu_share == pytest.approx(0.99)


def test_the_workload_mix_has_cpu_and_no_memory_as_the_simulators_pod_resource() -> None:
    tasks = [Task("a", 4000, 30000, 1, 470), Task("b", 4000, 15000, 1, 470), Task("c", 8000, 1, 0, 0)]
    mix = workload_mix(tasks)
    assert mix.shapes == (TaskShape(1, 470, 4000),)
    assert mix.cpu_share == pytest.approx(1 / 3)


def test_a_cpu_only_share_outside_0_to_1_is_refused() -> None:
    with pytest.raises(MixError, match="CPU-only share"):
        TaskMix((TaskShape(1, 500),), (1.0,), 1.0)


# --- the score ----------------------------------------------------------------------------------------------


def sigmoid_score(growth: float, taken: int, cpu_share: float) -> int:
    """fgd_score.go, written out: int64(sigmoid((before - after) / 1000) * 100)."""
    x = -((1 - cpu_share) * growth - cpu_share * taken) / 1000
    return int(1 / (1 + math.exp(-x)) * 100)


def test_the_simulator_score_is_the_sigmoid_of_the_fragmentation_it_saves() -> None:
    mix = parse_mix("500:1")
    got = simulator_score(np.array([0.0, -1000.0, 1000.0, 50.0, 1e-12]), np.zeros(5, dtype=np.int64), mix)
    assert got.tolist() == [50, 73, 26, 48, 50]
    half = TaskMix(mix.shapes, mix.weights, 0.5)
    # Half the simulator's mix is CPU-only tasks: every milli the pod takes is half a milli less fragment.
    assert int(simulator_score(np.array([0.0]), np.array([1000]), half)[0]) == 62


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(-8000, 8000, allow_nan=False), min_size=1, max_size=20),
    st.integers(0, 8000),
    st.floats(0, 0.9),
)
def test_the_vectorised_score_equals_the_scalar_one_and_falls_as_the_growth_rises(
    growth: list[float], taken: int, cpu_share: float
) -> None:
    mix = TaskMix((TaskShape(1, 500),), (1.0,), cpu_share)
    g = np.round(np.array(growth), 6)
    got = simulator_score(g, np.full(len(g), taken, dtype=np.int64), mix)
    assert got.tolist() == [sigmoid_score(x, taken, cpu_share) for x in g.tolist()]
    assert all(0 <= s <= 100 for s in got.tolist())
    order = np.argsort(g, kind="stable")
    assert np.all(np.diff(got[order]) <= 0)


# --- the planner's choice = brute force -------------------------------------------------------------------


def brute_force(cluster: Cluster, task: Task) -> tuple[str, int] | None:
    """Every (node, GPU) the real fit takes, scored one at a time with the scalar measure; the best
    score, then the first node name, then the lowest GPU index. CPU-only tasks: every node, GPU -1."""
    best: tuple[tuple[int, str, int], tuple[str, int]] | None = None
    for row, spec in enumerate(cluster.specs):
        if cluster.cpu_free[row] < task.cpu_milli or cluster.mem_free[row] < task.memory_mib:
            continue
        node = cluster.nodes[row]
        rows = np.array([row])
        before = float(fragmentation(node_free(node), cluster.mix, cluster.host_ok(rows)[0]))
        host_after = cluster.host_ok(rows, task.cpu_milli, task.memory_mib)[0]
        options: list[tuple[int, float, int]] = []
        if task.num_gpu == 0:
            after = float(fragmentation(node_free(node), cluster.mix, host_after))
            options.append((-1, after, 0))
        else:
            percent = task.share // 10
            request = ContainerRequest(1, 0, percent, percent)
            for gpu in node.gpus:
                got = fit_pod(
                    node,
                    ((request, False),),
                    selector=DeviceSelector(use_uuids=(gpu.id,)),
                    policy=(GPUPolicy.BINPACK,),
                    mix=cluster.mix,
                )
                if not isinstance(got, Fit):
                    continue
                placed = with_slices(node, footprint_slices(got.allocation, (ContainerKind.APP,)))
                after = float(fragmentation(node_free(placed), cluster.mix, host_after))
                options.append((gpu.info.index, after, int(node_free(node).sum() - node_free(placed).sum())))
        for index, after, taken in options:
            score = int(simulator_score(np.array([after - before]), np.array([taken]), cluster.mix)[0])
            key = (-score, spec.name, index)
            if best is None or key < best[0]:
                best = (key, (spec.name, index))
    return None if best is None else best[1]


@st.composite
def small_clusters(draw: st.DrawFn) -> tuple[list[NodeSpec], list[Task]]:
    names = draw(st.permutations([f"node-{c}" for c in "abcde"]))
    nodes = [
        NodeSpec(
            names[i],
            draw(st.sampled_from([4000, 8000, 16000])),
            262144,
            draw(st.integers(1, 4)),
            draw(st.sampled_from(["T4", "V100M32"])),
        )
        for i in range(draw(st.integers(2, 5)))
    ]
    tasks = [
        Task(
            f"t{i}",
            draw(st.sampled_from([0, 1000, 2000, 4000])),
            1024,
            gpus := draw(st.sampled_from([1, 1, 1, 0])),
            draw(st.integers(1, 10)) * 100 if gpus else 0,
        )
        for i in range(draw(st.integers(1, 14)))
    ]
    return nodes, [*tasks, Task("gpu", 1000, 1024, 1, 500)]


@settings(max_examples=60, deadline=None)
@given(small_clusters(), st.integers(0, 3))
def test_fgd_places_each_task_where_the_brute_force_scalar_score_is_best(
    case: tuple[list[NodeSpec], list[Task]], seed: int
) -> None:
    nodes, tasks = case
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES["fragmentation"], seed)
    for task in tasks:
        want = brute_force(cluster, task)
        got = cluster.place(task)
        if want is None:
            assert got is None
            continue
        assert got is not None
        name = cluster.specs[got.row].name
        index = (
            -1
            if not got.slices
            else next(g.info.index for g in cluster.nodes[got.row].gpus if g.id == got.slices[0].uuid)
        )
        assert (name, index) == want


@settings(max_examples=30, deadline=None)
@given(small_clusters(), st.randoms(use_true_random=False), st.integers(0, 3), st.integers(0, 3))
def test_fgd_placements_do_not_depend_on_the_node_order_or_the_seed(
    case: tuple[list[NodeSpec], list[Task]], shuffle: object, seed_a: int, seed_b: int
) -> None:
    nodes, tasks = case
    shuffled = list(nodes)
    shuffle.shuffle(shuffled)  # type: ignore[attr-defined]
    mix = workload_mix(tasks)
    a = Cluster(nodes, mix, POLICIES["fragmentation"], seed_a)
    b = Cluster(shuffled, mix, POLICIES["fragmentation"], seed_b)
    for task in tasks:
        pa, pb = a.place(task), b.place(task)
        assert (pa is None) == (pb is None)
        if pa is not None and pb is not None:
            assert a.specs[pa.row].name == b.specs[pb.row].name
            assert [s.uuid for s in pa.slices] == [s.uuid for s in pb.slices]


def test_equal_nodes_are_taken_in_name_order_and_their_gpus_in_index_order() -> None:
    nodes = [NodeSpec("node-b", 64000, 262144, 2, "T4"), NodeSpec("node-a", 64000, 262144, 2, "T4")]
    tasks = [Task("x", 1000, 1024, 1, 500), Task("cpu", 1000, 1024, 0, 0)]
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES["fragmentation"], seed=3)
    first = cluster.place(tasks[0])
    assert first is not None and cluster.specs[first.row].name == "node-a"
    assert [s.uuid for s in first.slices] == ["node-a-gpu0"]
    cpu = cluster.place(tasks[1])
    assert cpu is not None and cluster.specs[cpu.row].name == "node-a"


def test_the_report_names_the_cpu_only_share_of_the_mix() -> None:
    from hami_sim.plan.report import describe_mix

    mix = mix_from_tasks([TaskShape(1, 1000, 2000)] * 55, cpu_only=[2000] * 45)
    assert (
        describe_mix(mix) == "1 GPU + 2 CPU 100.0% (beside them, CPU-only tasks: 45.0% of the typical tasks)"
    )
    assert "CPU-only" not in describe_mix(parse_mix("500:1"))
