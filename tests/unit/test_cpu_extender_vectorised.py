"""The fast paths of `--fragmentation-filter one` (issue 28) answer exactly what the plain computation
answers: FGD's score for a pod that asks no GPU measured only where the pod changes which shapes a node's
free CPU hosts, the tie-break down to the tied nodes, the GPU table's kept free amounts, the nodes' free
CPU read in one pass, and so `/cpu-filter`'s one node, on random clusters."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.resources import ContainerRequest
from hami_api.types import GPUInfo, GPUPolicy, GPUSlice
from hami_control.cache import ClusterCache
from hami_control.config import load_config
from hami_control.extender import UNKNOWN_CPU, Candidates, HostCPU, cpu_filter_nodes
from hami_control.fit import NO_SELECTOR
from hami_control.frag import (
    MILLI,
    TaskMix,
    TaskShape,
    best_scores,
    cpu_only_scores,
    cpu_only_scores_dense,
    first_best,
    first_best_scalar,
    free_milli_arrays,
    node_free,
)
from hami_control.gputable import (
    GPUTable,
    IntArray,
    _free_before_after,
    distinct_rows,
    evaluate,
    fragmentation_best_scores,
    free_milli_rows,
    free_total_rows,
    simple_ask,
)
from hami_control.pod_store import PodStore
from hami_control.scheduling import Extender
from hami_control.usage import NodeGPUs
from tests.builders import container, gpu_info, node, node_gpus, pod

ONE = [
    "--insecure-http",
    "--node-scheduler-policy=fragmentation",
    "--gpu-scheduler-policy=fragmentation",
    "--fragmentation-filter=one",
]


@st.composite
def mixes(draw: st.DrawFn) -> TaskMix:
    shapes: list[tuple[TaskShape, float]] = []
    for _ in range(draw(st.integers(1, 5))):
        gpus = draw(st.sampled_from((1, 1, 2)))
        milli = MILLI if gpus > 1 else draw(st.sampled_from((100, 250, 500, 810, 1000)))
        cpu = draw(st.sampled_from((0, 1000, 4000, 8000, 16000)))
        shapes.append((TaskShape(gpus, milli, cpu), draw(st.integers(1, 9))))
    return TaskMix.of(shapes, draw(st.sampled_from((0, 0, 1, 5))))


@st.composite
def free_amounts(draw: st.DrawFn, n: int) -> IntArray:
    width = draw(st.integers(1, 8))
    cells = draw(
        st.lists(st.sampled_from((0, 0, 100, 190, 500, 1000)), min_size=n * width, max_size=n * width)
    )
    return np.array(cells, dtype=np.int64).reshape(n, width)


def cpu_values(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(
        st.sampled_from((0, 1000, 3000, 4000, 5000, 8000, 12000, 16000, UNKNOWN_CPU)), min_size=n, max_size=n
    )


@settings(max_examples=300, deadline=None)
@given(st.data(), mixes(), st.integers(1, 12), st.sampled_from((0, 500, 1000, 4000, 8000)))
def test_cpu_only_scores_measured_where_hosts_change_equal_every_node_measured(
    data: st.DataObject, mix: TaskMix, n: int, asked: int
) -> None:
    free = data.draw(free_amounts(n))
    cpu_free = np.array(data.draw(cpu_values(n)), dtype=np.int64)
    assert (
        cpu_only_scores(free, mix, cpu_free, asked).tolist()
        == cpu_only_scores_dense(free, mix, cpu_free, asked).tolist()
    )


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 12), st.booleans())
def test_first_best_vectorised_picks_what_the_scalar_tie_break_picks(
    data: st.DataObject, n: int, with_fullness: bool
) -> None:
    score = np.array(data.draw(st.lists(st.integers(48, 51), min_size=n, max_size=n)), dtype=np.int64)
    names = data.draw(st.lists(st.sampled_from(("a", "b", "c", "n1", "n10", "n2")), min_size=n, max_size=n))
    total = None
    if with_fullness:
        total = np.array(data.draw(st.lists(st.sampled_from((0, 500, 1000)), min_size=n, max_size=n)))
    assert first_best(score, names, total) == first_best_scalar(score, names, total)


@st.composite
def gpu_nodes(draw: st.DrawFn, name: str) -> NodeGPUs:
    gpus: list[GPUInfo] = []
    slices: list[GPUSlice] = []
    for i in range(draw(st.integers(0, 5))):
        info = gpu_info(
            i,
            id=f"{name}-g{i}",
            count=draw(st.integers(1, 4)),
            devmem=draw(st.sampled_from((16000, 81920))),
            devcore=draw(st.sampled_from((100, 0))),
            health=draw(st.booleans() | st.just(True)),
        )
        gpus.append(info)
        for _ in range(draw(st.integers(0, info.count))):
            slices.append(
                GPUSlice(info.id, draw(st.sampled_from((0, 4000, 8000))), draw(st.sampled_from((0, 30, 100))))
            )
    cordoned = draw(st.lists(st.sampled_from([g.id for g in gpus]), max_size=1)) if gpus else []
    return node_gpus(*gpus, name=name, cordon=cordoned, slices=slices)


def direct_free(table: GPUTable, rows: IntArray) -> IntArray:
    """Each GPU's free milli-GPUs computed from the table's columns now (what `free_milli` keeps)."""
    t = table
    at = np.maximum(rows, 0)
    free = free_milli_arrays(
        t.count[at],
        t.used[at],
        t.devmem[at],
        t.usedmem[at],
        t.devcore[at],
        t.usedcores[at],
        t.present[at] & t.healthy[at] & ~t.cordoned[at],
    )
    result: IntArray = np.where((rows >= 0)[:, None], free, 0)
    return result


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 25))
def test_the_tables_kept_free_amounts_equal_the_columns_after_any_writes(
    data: st.DataObject, steps: int
) -> None:
    table = GPUTable()
    names = [f"n{i}" for i in range(6)]
    for _ in range(steps):
        name = data.draw(st.sampled_from(names))
        if data.draw(st.integers(0, 4)) == 0:
            table.remove_node(name)
        else:
            table.set_node(data.draw(gpu_nodes(name)))
        if data.draw(st.booleans()):  # read between writes, or not
            asked = [*names, "absent"]
            rows = table.rows(asked)
            assert free_milli_rows(table, rows).tolist() == direct_free(table, rows).tolist()
            assert free_total_rows(table, rows).tolist() == direct_free(table, rows).sum(axis=1).tolist()


@dataclass
class Cluster:
    """Nodes (some with no allocatable CPU, some with GPUs) and pods with CPU requests bound to them."""

    gpus: dict[str, NodeGPUs] = field(default_factory=dict)
    allocatable: dict[str, int | None] = field(default_factory=dict)
    pods: list[tuple[str, str, int, str]] = field(default_factory=list)
    """(uid, node, CPU milli-cores, phase)."""


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    c = Cluster()
    for i in range(draw(st.integers(1, 8))):
        name = f"n{i}"
        c.allocatable[name] = draw(st.sampled_from((None, 8000, 16000, 32000)))
        if draw(st.booleans()):
            c.gpus[name] = draw(gpu_nodes(name))
    for j in range(draw(st.integers(0, 12))):
        c.pods.append(
            (
                f"u{j}",
                draw(st.sampled_from(sorted(c.allocatable))),
                draw(st.sampled_from((500, 1000, 4000, 8000))),
                draw(st.sampled_from(("Running", "Running", "Succeeded"))),
            )
        )
    return c


def extender_of(c: Cluster) -> tuple[Extender, dict[str, NodeGPUs]]:
    config = load_config(ONE, {}, lambda _p: "")
    cache = ClusterCache()
    for name, cpu in c.allocatable.items():
        cache.node_upserted(node(name, [], allocatable={} if cpu is None else {"cpu": f"{cpu}m"}))
    store = PodStore(config, cache)
    for uid, on, cpu, phase in c.pods:
        requests = {"cpu": f"{cpu}m"}
        store.apply("ADDED", pod(uid, container("c", requests=requests), uid=uid, node_name=on, phase=phase))
    ext = Extender(config, cache, store)
    ext.table.sync(c.gpus, c.gpus.get)
    return ext, c.gpus


def cpu_pod_json(uid: str, on: str, cpu: int, phase: str) -> dict[str, object]:
    return pod(uid, container("c", requests={"cpu": f"{cpu}m"}), uid=uid, node_name=on, phase=phase)


@settings(max_examples=200, deadline=None)
@given(clusters(), st.data(), st.integers(1, 8))
def test_the_free_cpu_index_equals_free_cpu_node_by_node_between_any_events(
    c: Cluster, data: st.DataObject, steps: int
) -> None:
    """Reads between pods bound, finished, deleted and relisted, nodes resized, deleted and added."""
    ext, _ = extender_of(c)
    every = [*c.allocatable, "n-new", "absent"]
    pods = {uid: (on, cpu, phase) for uid, on, cpu, phase in c.pods}
    for step in range(steps):
        names = data.draw(st.lists(st.sampled_from(every), max_size=10))
        if data.draw(st.booleans()):
            names = sorted(c.allocatable)  # the same candidate list again (its slots kept)
        assert ext.cpu_free_of(names).tolist() == HostCPU(ext.cpu_free, 0).free_of(names).tolist()
        event = data.draw(st.sampled_from(("bind", "finish", "delete", "relist", "resize", "drop", "add")))
        if event == "bind" or not pods:
            uid = f"s{step}"
            pods[uid] = (
                data.draw(st.sampled_from(every)),
                data.draw(st.sampled_from((500, 4000))),
                "Running",
            )
            ext.pods.apply("ADDED", cpu_pod_json(uid, *pods[uid]))
        elif event in {"finish", "delete"}:
            uid = data.draw(st.sampled_from(sorted(pods)))
            on, cpu, _ = pods.pop(uid) if event == "delete" else pods[uid]
            if event == "finish":
                pods[uid] = (on, cpu, "Succeeded")
            ext.pods.apply(
                "DELETED" if event == "delete" else "MODIFIED", cpu_pod_json(uid, on, cpu, "Succeeded")
            )
        elif event == "relist":
            kept = data.draw(st.lists(st.sampled_from(sorted(pods)), unique=True))
            pods = {uid: pods[uid] for uid in kept}
            ext.pods.replace([cpu_pod_json(uid, *pods[uid]) for uid in kept])
        elif event in {"resize", "add"}:
            name = "n-new" if event == "add" else data.draw(st.sampled_from(sorted(c.allocatable)))
            size = data.draw(st.sampled_from((None, 4000, 64000)))
            ext.cache.node_upserted(node(name, [], allocatable={} if size is None else {"cpu": f"{size}m"}))
        else:
            ext.cache.node_deleted(data.draw(st.sampled_from(every)))


@settings(max_examples=200, deadline=None)
@given(clusters(), mixes(), st.data())
def test_cpu_filter_keeps_the_node_the_plain_computation_chooses(
    c: Cluster, mix: TaskMix, data: st.DataObject
) -> None:
    """The reference: every node's free GPU amounts from its `NodeGPUs` GPU by GPU (`frag.node_free`),
    its free CPU node by node, every node measured, the tie-break one candidate at a time."""
    ext, gpus = extender_of(c)
    names = data.draw(st.lists(st.sampled_from([*c.allocatable, "absent"]), min_size=2, max_size=10))
    asked = data.draw(st.sampled_from((500, 1000, 4000, 8000)))
    answer = cpu_filter_nodes(
        Candidates(tuple(names)), ext.table, mix, HostCPU(ext.cpu_free, asked, True, ext.cpu_free_of)
    )
    width = max((len(g.gpus) for g in gpus.values()), default=0) or 1
    free = np.zeros((len(names), width), dtype=np.int64)
    for i, name in enumerate(names):
        if name in gpus:
            amounts = node_free(gpus[name])
            free[i, : len(amounts)] = amounts
    cpu = np.array([UNKNOWN_CPU if (v := ext.cpu_free(n)) is None else v for n in names], dtype=np.int64)
    score = cpu_only_scores_dense(free, mix, cpu, asked)
    expected = names[first_best_scalar(score, names, free.sum(axis=1))]
    assert answer["NodeNames"] == [expected]
    assert answer["FailedNodes"] == {} and answer["Error"] == ""


@settings(max_examples=100, deadline=None)
@given(
    st.lists(gpu_nodes("kind"), min_size=1, max_size=4),
    st.data(),
    mixes(),
    st.sampled_from(((1, 4000, None, 30), (1, 0, 50, 0), (2, 0, 100, 100))),
)
def test_gpu_pod_scores_from_one_candidate_of_each_kind_equal_every_candidate_scored(
    kinds: list[NodeGPUs], data: st.DataObject, mix: TaskMix, ask: tuple[int, int, int | None, int]
) -> None:
    """`--fragmentation-filter one`'s scores for a GPU pod over 65-150 candidates of a few kinds (GPUs and
    free CPU): scoring one of each kind and spreading the scores equals scoring every candidate."""
    n = data.draw(st.integers(65, 150))
    table = GPUTable()
    for i in range(n):
        kind = kinds[data.draw(st.integers(0, len(kinds) - 1))]
        table.set_node(node_gpus(*(g.info for g in kind.gpus), name=f"n{i}", slices=list(kind_slices(kind))))
    request = ContainerRequest(*ask)
    simple = simple_ask(table, ((request, False),), NO_SELECTOR, (GPUPolicy.BINPACK,), None)
    assert simple is not None
    ev = evaluate(table, table.rows([f"n{i}" for i in range(n)]), simple)
    cpu_free = np.array(data.draw(cpu_values(n)), dtype=np.int64)
    asked = data.draw(st.sampled_from((0, 1000, 4000)))
    free, newfree, passing = _free_before_after(table, ev, request)
    every = best_scores(free, newfree, passing, request.nums, mix, cpu_free, asked)
    assert fragmentation_best_scores(table, ev, request, mix, cpu_free, asked).tolist() == every.tolist()


def kind_slices(kind: NodeGPUs) -> list[GPUSlice]:
    """The slices that make another node like `kind` (its GPUs' use, by GPU index)."""
    return [
        GPUSlice(g.info.id, g.usedmem // max(g.used, 1), g.usedcores // max(g.used, 1))
        for g in kind.gpus
        for _ in range(g.used)
    ]


def test_distinct_rows_gives_each_rows_kind_and_one_row_of_each() -> None:
    rows = np.array([[1, 2], [3, 4], [1, 2], [1, 2], [0, 0]], dtype=np.int64)
    flags = np.array([True, False, True, True, False])
    got = distinct_rows((rows, flags))
    assert got is not None
    first, which = got
    assert sorted(first.tolist()) == [0, 1, 4]
    assert rows[first][which].tolist() == rows.tolist() and flags[first][which].tolist() == flags.tolist()
