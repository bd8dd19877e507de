"""`hami-sim plan` with node pools of other vendors (issue 26): `vendor:` in the YAML pools and pod mixes,
the devices' model written `<VENDOR>-<model>`, and each pod kept to its own vendor's devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_sim.plan.engine import POLICIES, Cluster
from hami_sim.plan.experiments import workload_mix
from hami_sim.plan.inputs import InputError, keep_vendors_apart, read_nodes, read_workload_yaml

POOLS = """\
nodes:
  - {pool: a100, count: 2, gpus: 4, model: A100, cpu_milli: 64000, memory_mib: 262144}
  - {pool: npu, vendor: Ascend, count: 2, gpus: 4, model: 910B4, gpu_memory_mib: 32768,
     cpu_milli: 64000, memory_mib: 262144}
"""

MIX = """\
horizon_s: 3600
pods:
  - {name: gpu, rate_per_hour: 30, num_gpu: 1, gpu_milli: 500, cpu_milli: 1000}
  - {name: npu, rate_per_hour: 30, num_gpu: 1, gpu_milli: 500, cpu_milli: 1000, vendor: ascend}
  - {name: npu-b4, rate_per_hour: 10, num_gpu: 2, cpu_milli: 1000, vendor: ascend, models: [910B4]}
"""


def test_a_vendor_pool_writes_its_model_with_the_vendors_prefix(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    nodes = read_nodes(path)
    assert [(n.name, n.vendor, n.model) for n in nodes] == [
        ("a100-0", "nvidia", "A100"),
        ("a100-1", "nvidia", "A100"),
        ("npu-0", "ascend", "ASCEND-910B4"),
        ("npu-1", "ascend", "ASCEND-910B4"),
    ]


def test_a_vendors_pod_mix_asks_its_vendors_models_and_nvidia_pods_keep_to_nvidia(tmp_path: Path) -> None:
    (tmp_path / "pools.yaml").write_text(POOLS)
    (tmp_path / "mix.yaml").write_text(MIX)
    nodes = read_nodes(tmp_path / "pools.yaml")
    tasks = keep_vendors_apart(nodes, read_workload_yaml(tmp_path / "mix.yaml", seed=1))
    by_mix = {t.name.rsplit("-", 1)[0]: t.models for t in tasks}
    assert by_mix == {"gpu": ("A100",), "npu": ("ASCEND-",), "npu-b4": ("ASCEND-910B4",)}


def test_an_unknown_vendor_names_the_file_line_and_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(
        "nodes:\n  - {pool: x, vendor: tpu, count: 1, gpus: 1, model: v5, cpu_milli: 1, memory_mib: 1}\n"
    )
    with pytest.raises(InputError) as err:
        read_nodes(path)
    assert "nodes[0].vendor" in str(err.value) and "tpu" in str(err.value) and "ascend" in str(err.value)


@pytest.mark.parametrize("policy", ["binpack", "spread", "hami"])
def test_every_pod_lands_on_its_own_vendors_devices(tmp_path: Path, policy: str) -> None:
    (tmp_path / "pools.yaml").write_text(POOLS)
    (tmp_path / "mix.yaml").write_text(MIX)
    nodes = read_nodes(tmp_path / "pools.yaml")
    tasks = keep_vendors_apart(nodes, read_workload_yaml(tmp_path / "mix.yaml", seed=1))
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES[policy], seed=1)
    placed = 0
    for task in tasks:
        placement = cluster.place(task)
        if placement is None:
            continue
        placed += 1
        vendor = nodes[placement.row].vendor
        assert vendor == ("ascend" if task.name.startswith("npu") else "nvidia"), task.name
    assert placed > 10
