"""hami_sim.plan: the planner's inputs (OpenB CSV, YAML, their errors), the placement engine through the
real fit and score code, both experiments, determinism, the report and the command line. Every trace here
is a small sample the test writes; the real OpenB data is never read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami_control.frag import TaskShape, mix_from_tasks
from hami_sim.main import main
from hami_sim.plan.engine import POLICIES, Cluster, gpu_mix
from hami_sim.plan.experiments import SCHEDULER_DEFAULTS, extender_mix, inflation, replay, workload_mix
from hami_sim.plan.inputs import (
    InputError,
    NodeSpec,
    Task,
    read_nodes,
    read_pods_csv,
    read_workload_yaml,
)
from hami_sim.plan.report import RunInfo, at_arrival, write_report

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i},32000,131072,{2 if i % 2 else 4},{'T4' if i % 3 else 'V100M32'}\n" for i in range(8)
)
PODS_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def pods_csv(n: int = 60) -> str:
    shapes = [(1, 1000), (1, 500), (1, 250), (2, 1000), (0, 0), (1, 700), (1, 300)]
    rows = []
    for i in range(n):
        gpus, milli = shapes[i % len(shapes)]
        spec = "V100M32" if i % 11 == 0 and gpus else ""
        rows.append(
            f"pod-{i},{2000 + 500 * (i % 4)},8192,{gpus},{milli},{spec},LS,Running,{10 * i},{10 * i + 300},"
        )
    return PODS_HEADER + "\n".join(rows) + "\n"


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(pods_csv())
    return nodes, pods


# --- inputs -----------------------------------------------------------------------------------------------


def test_openb_csv_maps_shares_whole_gpus_and_cpu_only_tasks(trace: tuple[Path, Path]) -> None:
    nodes = read_nodes(trace[0])
    assert len(nodes) == 8 and nodes[0] == NodeSpec("node-0", 32000, 131072, 4, "V100M32", 32768, 10)
    tasks = read_pods_csv(trace[1])
    by_name = {t.name: t for t in tasks}
    assert by_name["pod-1"].gpu_request == 500 and by_name["pod-1"].share == 500
    assert by_name["pod-3"].gpu_request == 2000 and by_name["pod-3"].share == 1000
    assert by_name["pod-4"].gpu_request == 0
    assert by_name["pod-0"].models == ("V100M32",)
    assert by_name["pod-2"].creation == 20 and by_name["pod-2"].deletion == 320


def test_the_five_column_pod_list_of_multigpu50_is_read(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,8,1000\nb,1000,1024,1,460\n")
    tasks = read_pods_csv(path)
    assert [(t.num_gpu, t.share, t.deletion) for t in tasks] == [(8, 1000, None), (1, 460, None)]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\n", "line 1: header: missing column(s) gpu_milli"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,x,0\n", "line 2: num_gpu: got 'x'"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,1200\n",
            "line 2: gpu_milli: got '1200'",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,0\n", "expected 1..1000 for num_gpu 1"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,455\n", "expected a multiple of 10"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,-5,1024,1,400\n", "line 2: cpu_milli: got '-5'"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\na,1,1,1,400,50,20\n",
            "line 2: deletion_time: got '20', expected >= creation_time 50",
        ),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pod"),
    ],
)
def test_pod_csv_errors_name_file_line_field_and_value(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_pods_csv(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_node_csv_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1024,2,T4\na,1000,1024,2,T4\n")
    with pytest.raises(InputError, match=r"line 3: sn: got 'a', expected a new node name"):
        read_nodes(path)
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1024,2,\n")
    with pytest.raises(InputError, match=r"line 2: model: got '', expected the GPU model"):
        read_nodes(path)


def test_yaml_node_pools_and_workload(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "nodes:\n"
        "  - {pool: a, count: 3, gpus: 8, model: A100, cpu_milli: 96000, memory_mib: 500000}\n"
        "  - {pool: t, count: 2, gpus: 2, model: T4, cpu_milli: 32000, memory_mib: 100000, split: 4}\n"
    )
    nodes = read_nodes(pools)
    assert [n.name for n in nodes] == ["a-0", "a-1", "a-2", "t-0", "t-1"]
    assert nodes[0].gpu_memory_mib == 81920 and nodes[3].split == 4
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "horizon_s: 36000\n"
        "pods:\n"
        "  - {name: nb, rate_per_hour: 6, duration_s: 1800, num_gpu: 1, gpu_milli: 250, cpu_milli: 1000}\n"
        "  - {name: train, rate_per_hour: 1, num_gpu: 4, models: [A100]}\n"
    )
    tasks = read_workload_yaml(mix, seed=3)
    assert tasks == read_workload_yaml(mix, seed=3)
    assert [t.creation for t in tasks] == sorted(t.creation for t in tasks)
    nb = [t for t in tasks if t.name.startswith("nb")]
    train = [t for t in tasks if t.name.startswith("train")]
    assert 30 <= len(nb) <= 90 and train and all(t.deletion is None and t.share == 1000 for t in train)
    assert all(t.deletion == pytest.approx(t.creation + 1800) for t in nb)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nodes: 3\n", "line 1: nodes: expected a list"),
        ("nodes:\n  - pool: a\n    model: T4\n    count: 0\n", "line 4: nodes[0].count: got 0, expected a"),
        (
            "nodes:\n  - {pool: a, count: 1, gpus: 1, cpu_milli: 1, memory_mib: 1}\n",
            "nodes[0].model: missing",
        ),
        ("other: 1\n", "nodes: missing"),
        ("[1, 2]\n", "expected a mapping at the top"),
    ],
)
def test_yaml_node_errors_name_line_field_and_value(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_nodes(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_yaml_workload_errors_name_line_field_and_value(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(
        "horizon_s: 100\npods:\n  - name: x\n    rate_per_hour: 1\n    num_gpu: 2\n    gpu_milli: 500\n"
    )
    with pytest.raises(InputError, match=r"line 6: pods\[0\].gpu_milli: got 500, expected 1000"):
        read_workload_yaml(path, 1)
    path.write_text("horizon_s: -1\npods: []\n")
    with pytest.raises(InputError, match=r"line 1: workload.horizon_s: got -1, expected seconds > 0"):
        read_workload_yaml(path, 1)


# --- the engine -------------------------------------------------------------------------------------------


def one_gpu_nodes(n: int) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", 64000, 262144, 1, "T4") for i in range(n)]


def share(name: str, milli: int) -> Task:
    return Task(name, 0, 0, 1, milli)


def test_fragmentation_places_what_binpack_and_hami_strand() -> None:
    # Two one-GPU nodes; 0.5, 0.3, 0.5, 0.7 arrive in that order. Packing puts 0.3 beside the first 0.5
    # (0.2 left that nothing uses), so the second 0.5 takes the other GPU and 0.7 finds no room.
    # Fragmentation keeps the 0.3 off the half-full GPU (its 0.5 still fits a 0.5 task) and all fit.
    tasks = [share("a", 500), share("b", 300), share("c", 500), share("d", 700)]
    mix = workload_mix(tasks)
    placed = {}
    for policy in ("binpack", "hami", "fragmentation"):
        cluster = Cluster(one_gpu_nodes(2), mix, POLICIES[policy], seed=1)
        placed[policy] = [cluster.place(t) is not None for t in tasks]
    assert placed["binpack"] == [True, True, True, False]
    assert placed["hami"] == [True, True, True, False]
    assert placed["fragmentation"] == [True, True, True, True]


def test_placements_go_through_fit_and_release_restores_the_node() -> None:
    tasks = [share("a", 500), Task("w", 1000, 1024, 2, 1000)]
    nodes = [NodeSpec("big", 8000, 65536, 4, "T4"), NodeSpec("small", 8000, 65536, 1, "T4")]
    for policy in POLICIES:
        cluster = Cluster(nodes, workload_mix(tasks), POLICIES[policy], seed=7)
        before = list(cluster.nodes)
        # The one-GPU node can never host the mix's 2-GPU shape: its idle GPU is half a fragment.
        assert cluster.cluster_fragmentation() == pytest.approx(0.5)
        got = [cluster.place(t) for t in tasks]
        assert all(p is not None for p in got)
        whole = got[1]
        assert whole is not None and whole.row == 0 and len(whole.slices) == 2
        assert {s.usedcores for s in whole.slices} == {100}
        assert cluster.allocated == 2500
        for p in reversed(got):
            assert p is not None
            cluster.release(p)
        assert cluster.nodes == before and cluster.allocated == 0
        assert int(cluster.cpu_free.sum()) == 16000
        assert cluster.cluster_fragmentation() == pytest.approx(0.5)


def test_cpu_and_memory_and_model_are_checked() -> None:
    nodes = [NodeSpec("t4", 2000, 4096, 1, "T4"), NodeSpec("v100", 8000, 65536, 1, "V100M32")]
    tasks = [Task("cpu-heavy", 4000, 1024, 1, 500), Task("wants-t4", 100, 100, 1, 200, ("T4",))]
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES["binpack"], seed=1)
    heavy = cluster.place(tasks[0])
    assert heavy is not None and heavy.row == 1
    t4 = cluster.place(tasks[1])
    assert t4 is not None and t4.row == 0
    assert cluster.place(Task("too-big", 99999, 1, 0, 0)) is None


def test_fragmentation_best_fills_the_gpu_its_node_cpu_strands_where_the_gpu_only_measure_spreads() -> None:
    # Two equal one-GPU nodes; a CPU-only task takes most of one node's CPU, so that node can no longer
    # host the mix's 4-CPU GPU task: its idle GPU is all fragment. The extender's GPU-only measure sees
    # two idle GPUs alike and kube-scheduler's LeastAllocated sends the next GPU pod to the emptier node;
    # with CPU in the measure, /filter keeps only the node whose stranded GPU the pod uses.
    nodes = [NodeSpec("a", 16000, 65536, 1, "T4"), NodeSpec("b", 16000, 65536, 1, "T4")]
    typical = [Task(f"t{i}", 4000, 1024, 1, 500) for i in range(10)]
    cpu_hog, small = Task("hog", 14000, 1024, 0, 0), Task("small", 1000, 1024, 1, 500)
    rows = {}
    for policy in ("fragmentation-extender", "fragmentation-best"):
        learned = extender_mix(typical, cpu=policy == "fragmentation-best")
        cluster = Cluster(nodes, workload_mix(typical), POLICIES[policy], seed=3, extender_mix=learned)
        hog = cluster.place(cpu_hog)
        got = cluster.place(small)
        assert hog is not None and got is not None
        rows[policy] = (hog.row, got.row)
    assert rows["fragmentation-extender"][0] != rows["fragmentation-extender"][1]
    assert rows["fragmentation-best"][0] == rows["fragmentation-best"][1]


# --- experiments ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_inflation_is_deterministic_for_a_seed(trace: tuple[Path, Path], policy: str) -> None:
    nodes, tasks = read_nodes(trace[0]), read_pods_csv(trace[1])
    a = inflation(nodes, tasks, policy, seed=5, max_arrival=1.2)
    b = inflation(nodes, tasks, policy, seed=5, max_arrival=1.2)
    assert a.arrived == b.arrived and a.allocation == b.allocation and a.frag_gpus == b.frag_gpus
    assert a.arrived[-1] >= 1.2
    assert all(x <= y + 1e-12 for x, y in zip(a.allocation, a.arrived, strict=True))
    assert a.allocation == sorted(a.allocation)  # nothing leaves
    assert at_arrival(a, 100) is not None


def test_replay_holds_pending_pods_until_a_departure_frees_room() -> None:
    nodes = one_gpu_nodes(1)
    tasks = [
        Task("first", 0, 0, 1, 1000, (), 0.0, 10.0),
        Task("second", 0, 0, 1, 1000, (), 5.0, 20.0),
        Task("gives-up", 0, 0, 1, 1000, (), 6.0, 8.0),
    ]
    for policy in POLICIES:
        r = replay(nodes, tasks, policy, seed=1)
        assert r.pending_s == [0.0, 5.0]
        assert r.never == 1


def test_replay_is_deterministic(trace: tuple[Path, Path]) -> None:
    nodes, tasks = read_nodes(trace[0]), read_pods_csv(trace[1])
    a = replay(nodes, tasks, "fragmentation", seed=2)
    b = replay(nodes, tasks, "fragmentation", seed=2)
    assert (
        a.pending_s == b.pending_s and a.frag_gpus == b.frag_gpus and len(a.pending_s) + a.never == len(tasks)
    )


# --- report and command line ------------------------------------------------------------------------------


def test_report_files(tmp_path: Path, trace: tuple[Path, Path]) -> None:
    nodes, tasks = read_nodes(trace[0]), read_pods_csv(trace[1])
    results = [inflation(nodes, tasks, p, seed=1) for p in ("binpack", "fragmentation")]
    info = RunInfo("n.csv", "p.csv", "inflation", 1, sum(n.gpus for n in nodes), len(nodes), len(tasks), "x")
    doc = write_report(tmp_path / "out", info, results, steps=(50, 100))
    assert set(doc["policies"]) == {"binpack", "fragmentation"}
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["policies"]["binpack"]["unallocated_gpus_at_saturation"] is not None
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| fragmentation |" in md
    for chart in doc["charts"]:
        assert (tmp_path / "out" / chart).read_bytes()[:4] == b"\x89PNG"


def test_command_line_writes_the_report(tmp_path: Path, trace: tuple[Path, Path]) -> None:
    out = tmp_path / "out"
    argv = ["plan", "--nodes", str(trace[0]), "--pods", str(trace[1]), "--policies", "spread,fragmentation"]
    rc = main([*argv, "--experiment", "replay", "--out", str(out), "--seed", "3", "--no-charts"])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    assert list(doc["policies"]) == ["spread", "fragmentation"] and doc["run"]["experiment"] == "replay"


def test_command_line_errors(
    tmp_path: Path, trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,z,0\n")
    rc = main(["plan", "--nodes", str(trace[0]), "--pods", str(bad), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert f"{bad} line 2: num_gpu: got 'z'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--nodes", str(trace[0]), "--pods", str(bad), "--out", "o", "--policies", "best"])
    assert "unknown policy best" in capsys.readouterr().err
    for option, value, words in (
        ("--max-arrival", "-5", "--max-arrival: expected a percentage of capacity above 0, got '-5'"),
        ("--max-arrival", "nan", "--max-arrival: expected a percentage of capacity above 0, got 'nan'"),
        ("--split-count", "0", "--split-count: expected a whole number of at least 1, got '0'"),
        ("--extender-weight", "0", "--extender-weight: expected a whole number of at least 1, got '0'"),
        ("--percentage-of-nodes-to-score", "150", "expected a whole percentage 0..100, got '150'"),
    ):
        with pytest.raises(SystemExit):
            main(["plan", "--nodes", str(trace[0]), "--pods", str(trace[1]), "--out", "o", option, value])
        assert words in capsys.readouterr().err


def test_the_planning_examples_read_and_replay() -> None:
    root = Path(__file__).resolve().parents[2] / "examples" / "planning"
    nodes = read_nodes(root / "pools.yaml")
    tasks = read_workload_yaml(root / "workload.yaml", seed=1)
    assert sum(n.gpus for n in nodes) == 16 * 8 + 24 * 2
    result = replay(nodes, tasks[:300], "fragmentation", seed=1)
    assert len(result.pending_s) + result.never == 300


def test_the_extenders_learned_mix_keeps_multi_gpu_shapes_the_papers_cut_drops_by_cpu_size() -> None:
    # 120 one-GPU halves of one CPU size; 40 four-GPU tasks, each of its own CPU size. The paper's rule
    # (workload_mix) counts (GPUs, share, CPU) shapes, so every four-GPU shape is rare and falls out of its
    # 95% cut; the extender learns (GPUs, share) only and keeps 4x1000 as a quarter of the mix.
    tasks = [Task(f"half-{i}", 4000, 1024, 1, 500) for i in range(120)]
    tasks += [Task(f"four-{i}", 1000 * (i + 1), 1024, 4, 1000) for i in range(40)]
    learned = extender_mix(tasks)
    assert learned == mix_from_tasks([TaskShape(1, 500)] * 120 + [TaskShape(4, 1000)] * 40)
    assert dict(zip(learned.shapes, learned.weights, strict=True))[TaskShape(4, 1000)] == pytest.approx(0.25)
    papers = gpu_mix(workload_mix(tasks))
    assert dict(zip(papers.shapes, papers.weights, strict=True)).get(TaskShape(4, 1000), 0) < 0.25
    # fragmentation-extender scores against the learned mix; the other policies keep the paper's.
    cluster = SCHEDULER_DEFAULTS.cluster([], workload_mix(tasks), "fragmentation-extender", 1, learned)
    assert cluster.gpu_mix == learned
