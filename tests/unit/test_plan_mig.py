"""`hami-sim plan` with MIG nodes and the MIG-against-slices comparison, on small samples written here."""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.mig import A100_SXM4_40GB
from hami_api.mig_alloc import MIG_MODE
from hami_sim.plan.cli import run
from hami_sim.plan.engine import POLICIES, Cluster, mig_gpu_info
from hami_sim.plan.experiments import MemoryResult, memory_tasks, mig_vs_slices, workload_mix
from hami_sim.plan.inputs import InputError, NodeSpec, Task, read_nodes_yaml, read_workload_yaml

GIB = 1024


def a100_nodes(count: int = 2, gpus: int = 2) -> list[NodeSpec]:
    return [NodeSpec(f"a100-{i}", 64000, 262144, gpus, "A100-40GB", 40960) for i in range(count)]


def memory_task(name: str, mib: int) -> Task:
    return Task(name, 0, 0, 1, min(990, max(10, mib * 1000 // 40960 // 10 * 10)), gpu_memory_mib=mib)


def test_mig_gpu_info_registers_the_base_profiles_with_hami_core_percent_and_most_instances() -> None:
    gpu = mig_gpu_info(NodeSpec("n", 1000, 1000, 1, "A100-40GB", 40960, mig=True), 0)
    assert gpu.mode == MIG_MODE
    assert gpu.count == 7
    assert gpu.devmem == 40960
    assert gpu.devcore == 100
    names = [p.name for p in gpu.mig_profiles]
    assert names == [p.name for p in A100_SXM4_40GB.profiles if p.is_base]
    one = next(p for p in gpu.mig_profiles if p.name == "1g.5gb")
    assert one.core == 15  # ceil(14 * 100 / 98), HAMi register.go
    assert len(one.placements) == 7


def test_yaml_pool_with_mig_true_reads_a_mig_node_with_the_tables_memory(tmp_path: Path) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text(
        "nodes:\n  - {pool: m, count: 2, gpus: 8, model: A100-40GB, cpu_milli: 1, memory_mib: 1, mig: true}\n"
    )
    nodes = read_nodes_yaml(f)
    assert [n.mig for n in nodes] == [True, True]
    assert nodes[0].gpu_memory_mib == 40960


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ("model: T4, mig: true", "nodes[0].mig: model 'T4' has no MIG profile table"),
        ("model: A100-40GB, mig: yes-please", "nodes[0].mig: got 'yes-please', expected true or false"),
        ("model: A100-40GB, mig: true, split: 4", "nodes[0].split: not allowed with mig: true"),
        (
            "model: 910B4, vendor: ascend, mig: true",
            "nodes[0].mig: got true, expected false for vendor ascend",
        ),
    ],
)
def test_yaml_mig_pool_errors_name_the_field_and_value(tmp_path: Path, pool: str, words: str) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text(f"nodes:\n  - {{pool: m, count: 1, gpus: 8, cpu_milli: 1, memory_mib: 1, {pool}}}\n")
    with pytest.raises(InputError, match=re.escape(words)):
        read_nodes_yaml(f)


def test_workload_gpu_memory_mib_is_refused_on_a_whole_gpu_mix(tmp_path: Path) -> None:
    f = tmp_path / "mix.yaml"
    f.write_text(
        "horizon_s: 3600\npods:\n  - {name: t, rate_per_hour: 10, num_gpu: 2, gpu_memory_mib: 100}\n"
    )
    with pytest.raises(
        InputError, match=r"pods\[0\]\.gpu_memory_mib: got 100, expected only on a share task"
    ):
        read_workload_yaml(f, 1)


def test_cluster_refuses_a_fragmentation_policy_on_mig_nodes() -> None:
    nodes = [NodeSpec("m", 1000, 1000, 1, "A100-40GB", 40960, mig=True)]
    tasks = [memory_task("t", 4096)]
    with pytest.raises(ValueError, match="policy fragmentation: does not place pods on MIG nodes"):
        Cluster(nodes, workload_mix(tasks), POLICIES["fragmentation"], 1)


def test_mig_node_takes_the_smallest_profile_holding_the_memory_and_release_frees_the_placement() -> None:
    nodes = [NodeSpec("m", 1000, 1000, 1, "A100-40GB", 40960, mig=True)]
    tasks = [memory_task("a", 4096), memory_task("b", 15000), memory_task("c", 30000)]
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES["binpack"], 1)
    a = cluster.place(tasks[0])
    b = cluster.place(tasks[1])
    assert a is not None and b is not None
    assert [m.profile for m in a.mig] == ["1g.5gb"]
    assert [m.profile for m in b.mig] == ["3g.20gb"]
    assert cluster.place(tasks[2]) is None  # 7g.40gb needs every slice
    cluster.release(a)
    cluster.release(b)
    c = cluster.place(tasks[2])
    assert c is not None and [m.profile for m in c.mig] == ["7g.40gb"]


def test_memory_tasks_scale_shares_onto_the_gpu_memory_and_drop_cpu_only_tasks() -> None:
    tasks = [Task("s", 4000, 8192, 1, 250, ("V100M16",)), Task("w", 1, 1, 2, 1000), Task("c", 1000, 1, 0, 0)]
    got = memory_tasks(tasks, 40960)
    assert [(t.name, t.gpu_memory_mib, t.cpu_milli, t.memory_mib, t.models) for t in got] == [
        ("s", 10240, 0, 0, ()),
        ("w", 0, 0, 0, ()),
    ]


def _check_invariants(mig: MemoryResult, sliced: MemoryResult) -> None:
    on_gpu: dict[str, list[tuple[int, int]]] = {}
    for placement in mig.placements:
        for m in placement.mig:
            on_gpu.setdefault(m.gpu_uuid, []).append((m.placement.start, m.placement.size))
    for placed in on_gpu.values():
        for (s1, n1), (s2, n2) in combinations(placed, 2):
            assert not (s1 < s2 + n2 and s2 < s1 + n1), f"overlapping placements {placed}"
    assert mig.allocated_mib >= mig.asked_mib
    assert sliced.allocated_mib == sliced.asked_mib
    assert mig.tasks == sliced.tasks


def test_mig_vs_slices_synthetic_mix_invariants_and_slices_place_at_least_as_many() -> None:
    sizes = [4096, 8192, 12288, 16384, 24576]
    tasks = [memory_task(f"t{i}", sizes[i % len(sizes)]) for i in range(40)]
    mig, sliced = mig_vs_slices(a100_nodes(), tasks, "binpack", 7)
    _check_invariants(mig, sliced)
    assert sliced.placed >= mig.placed
    assert mig.not_asked_mib > 0  # 12 GiB and 24 GiB round up to 3g.20gb and 7g.40gb


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([2048, 4864, 9000, 9856, 16000, 19968, 30000]), min_size=1, max_size=30),
    seed=st.integers(0, 10),
    policy=st.sampled_from(["binpack", "spread", "hami"]),
)
def test_mig_vs_slices_never_overlaps_placements_and_never_allocates_less_than_asked(
    sizes: list[int], seed: int, policy: str
) -> None:
    tasks = [memory_task(f"t{i}", m) for i, m in enumerate(sizes)]
    mig, sliced = mig_vs_slices(a100_nodes(1, 2), tasks, policy, seed)
    _check_invariants(mig, sliced)


def test_mig_vs_slices_refuses_nodes_without_a_mig_model() -> None:
    nodes = [NodeSpec("t", 1000, 1000, 2, "T4", 15360)]
    with pytest.raises(ValueError, match="nodes: expected GPU nodes of one MIG-capable model"):
        mig_vs_slices(nodes, [memory_task("a", 1000)])


def test_cli_mig_vs_slices_writes_the_table_and_the_chart(tmp_path: Path) -> None:
    nodes = tmp_path / "pools.yaml"
    nodes.write_text(
        "nodes:\n  - {pool: a, count: 2, gpus: 2, model: A100-40GB, cpu_milli: 9, memory_mib: 9}\n"
    )
    pods = tmp_path / "pods.csv"
    rows = [f"p{i},1000,1024,1,{(i % 5 + 1) * 100}" for i in range(30)] + ["w,1000,1024,2,1000"]
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "\n".join(rows) + "\n")
    import argparse

    from hami_sim.plan.cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "plan",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--experiment",
            "mig-vs-slices",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
    )
    assert run(args) == 0
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(doc["modes"]) == {"mig", "slices"}
    assert "| mig |" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "mig-vs-slices.png").exists()


def test_cli_mig_vs_slices_refuses_a_fragmentation_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "pools.yaml"
    nodes.write_text(
        "nodes:\n  - {pool: a, count: 1, gpus: 1, model: A100-40GB, cpu_milli: 9, memory_mib: 9}\n"
    )
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,100\n")
    import argparse

    from hami_sim.plan.cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "plan",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--experiment",
            "mig-vs-slices",
            "--policies",
            "fragmentation",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--no-charts",
        ]
    )
    assert run(args) == 2
    assert (
        "--policies: got fragmentation, expected one of binpack, spread, topology, hami"
        in capsys.readouterr().err
    )
