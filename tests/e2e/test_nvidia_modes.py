"""NVIDIA's sharing modes as nodes of the local cluster (`hami-sim up` with a node's `nvidia` config),
every part a real process speaking the real protocols, in scale mode (the kubelets in one host process,
the node daemons in another: hami_sim.nodehost): a T4 node time-sliced 4 ways with NVIDIA's config file
(renameByDefault, failRequestsGreaterThanOne), an A100-SXM4-40GB node with NVIDIA's MIG strategy
mixed and three MIG devices made before start (3g.20gb, 2g.10gb, 1g.5gb), one with strategy single (two
3g.20gb served as `nvidia.com/gpu`), one with strategy none (a MIG-enabled A100 served whole) and one
with strategy mixed and its 1g.5gb devices time-sliced 2 ways (MIG with time-slicing).

Pods asking NVIDIA's resources are not hami-control's: its webhook leaves them with `schedulerName:
default-scheduler`, the default-scheduler stand-in places them by NodeResourcesFit from the Nodes'
allocatable (kube-scheduler's path with NVIDIA's plugin), and hami-node answers Allocate from kubelet's
device IDs as NVIDIA's plugin does (tests/integration/test_nvidia_modes.py has the same daemon beside a
lone kubelet stand-in). A pod asking plain `nvidia.com/gpu` is HAMi's (the extender manages that name)
and never lands on these nodes: the extender does not know them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_node.gpu.inventory import FakeMigInstance, load_inventory
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.kubelet.config import CONTAINERS_FILE
from hami_sim.kubelet.runtime import read_containers
from tests.builders import container, gpu_pod, pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

NS = "default"
TS_NODE = "ts-a"
MIG_NODE = "mig-a"
SINGLE_NODE = "single-a"
NONE_NODE = "none-a"
MIG_TS_NODE = "migts-a"
MIG_TS_CONFIG = """version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
"""
IGNORE = {"hami.io/webhook": "ignore"}
"""Keeps a pod asking plain nvidia.com/gpu out of HAMi's webhook: default-scheduler places it."""
SHARED = "nvidia.com/gpu.shared"
MIG_1G = "nvidia.com/mig-1g.5gb"
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "demo-nvidia" / "config"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("nvidia-modes")
    mig = (FakeMigInstance("3g.20gb", 0), FakeMigInstance("2g.10gb", 4), FakeMigInstance("1g.5gb", 6))
    halves = (FakeMigInstance("3g.20gb", 0), FakeMigInstance("3g.20gb", 4))
    sevenths = (FakeMigInstance("1g.5gb", 0), FakeMigInstance("1g.5gb", 1))
    ts = CONFIGS / "time-slicing.yaml"
    mixed = CONFIGS / "mig-mixed.yaml"
    spec = ClusterSpec(
        nodes=(
            NodeSpec(
                TS_NODE, (GPUSpec("Tesla T4"),), nvidia_config=ts.read_text(), nvidia_config_source=str(ts)
            ),
            NodeSpec(
                MIG_NODE,
                (GPUSpec("NVIDIA A100-SXM4-40GB", mig_devices=mig),),
                nvidia_config=mixed.read_text(),
                nvidia_config_source=str(mixed),
            ),
            NodeSpec(
                SINGLE_NODE,
                (GPUSpec("NVIDIA A100-SXM4-40GB", mig_devices=halves),),
                nvidia_config="version: v1\nflags:\n  migStrategy: single\n",
            ),
            NodeSpec(
                NONE_NODE,
                (GPUSpec("NVIDIA A100-SXM4-40GB", mig_devices=halves[:1]),),
                nvidia_config="version: v1\nflags:\n  migStrategy: none\n",
            ),
            NodeSpec(
                MIG_TS_NODE,
                (GPUSpec("NVIDIA A100-SXM4-40GB", mig_devices=sevenths),),
                nvidia_config=MIG_TS_CONFIG,
            ),
        ),
        scale=True,
    )
    with Cluster.up(spec, root / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def phase(core: Any, name: str, want: str) -> Any:
    def done() -> Any:
        found = core.read_namespaced_pod(name, NS)
        return found if found.status.phase == want else None

    return wait_for(
        done, 60, f"pod {name} {want}", detail=lambda: str(core.read_namespaced_pod(name, NS).status)
    )


def visible_devices(cluster: Cluster, node: str, found: Any, name: str) -> str:
    containers = read_containers(cluster.kubelet_dir(node) / CONTAINERS_FILE)
    return containers.env(found.metadata.uid, name)["NVIDIA_VISIBLE_DEVICES"]


def test_pods_asking_nvidias_resources_run_through_the_default_scheduler_with_nvidias_allocate(
    cluster: Cluster, core: Any
) -> None:
    core.create_namespaced_pod(NS, pod("shared", container("main", limits={SHARED: "1"})))
    core.create_namespaced_pod(NS, pod("mig-small", container("main", limits={MIG_1G: "1"})))
    core.create_namespaced_pod(NS, pod("two", container("main", limits={SHARED: "2"})))

    shared = phase(core, "shared", "Running")
    assert shared.spec.scheduler_name == "default-scheduler" and shared.spec.node_name == TS_NODE
    (t4,) = load_inventory(cluster.inventory_path(TS_NODE)).gpus
    assert visible_devices(cluster, TS_NODE, shared, "main") == t4.uuid

    small = phase(core, "mig-small", "Running")
    assert small.spec.node_name == MIG_NODE
    assert visible_devices(cluster, MIG_NODE, small, "main").startswith("MIG-")

    # Two replicas with failRequestsGreaterThanOne: NodeResourcesFit lets it on (2 <= 4), NVIDIA's
    # Allocate refuses it, and kubelet fails the pod with UnexpectedAdmissionError.
    two = phase(core, "two", "Failed")
    assert two.status.reason == "UnexpectedAdmissionError", two.status
    assert (
        'invalid allocation request for "nvidia.com/gpu.shared": invalid request: maximum request size '
        "for shared resources is 1; found 2"
    ) in two.status.message

    # A pod asking plain nvidia.com/gpu is HAMi's: the webhook sends it to hami-scheduler, whose
    # extender knows no node in NVIDIA's modes, so it stays Pending.
    core.create_namespaced_pod(NS, gpu_pod("hami-gpu", gpus=1))

    def refused() -> Any:
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=hami-gpu").items
        return next((e for e in events if e.reason == "FailedScheduling"), None)

    wait_for(refused, 30, "hami-gpu refused by the scheduler")
    hami_gpu = core.read_namespaced_pod("hami-gpu", NS)
    assert hami_gpu.spec.scheduler_name == "hami-scheduler" and not hami_gpu.spec.node_name


def test_the_nodes_carry_gfd_labels_and_kubectl_hami_top_counts_their_resources(
    cluster: Cluster, core: Any
) -> None:
    phase(core, "shared", "Running")
    phase(core, "mig-small", "Running")
    labels = core.read_node(TS_NODE).metadata.labels
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"  # renamed: no -SHARED (GFD)
    labels = core.read_node(MIG_NODE).metadata.labels
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    counts = {k: labels.get(f"nvidia.com/mig-{k}.count") for k in ("1g.5gb", "2g.10gb", "3g.20gb")}
    assert counts == {"1g.5gb": "1", "2g.10gb": "1", "3g.20gb": "1"}

    script = Path(sys.executable).parent / "kubectl-hami"
    result = subprocess.run(
        [str(script), "top", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    resources = {
        (name, r["name"]): (r["allocatable"], r["allocated"])
        for name, n in nodes.items()
        for r in n["nvidia"]["resources"]
    }
    assert resources == {
        (TS_NODE, SHARED): (4, 1),
        (MIG_NODE, MIG_1G): (1, 1),
        (MIG_NODE, "nvidia.com/mig-2g.10gb"): (1, 0),
        (MIG_NODE, "nvidia.com/mig-3g.20gb"): (1, 0),
        (SINGLE_NODE, "nvidia.com/gpu"): (2, 0),  # their pods come in the next test
        (NONE_NODE, "nvidia.com/gpu"): (1, 0),
        (MIG_TS_NODE, "nvidia.com/mig-1g.5gb.shared"): (4, 0),
    }
    assert nodes[MIG_NODE]["nvidia"]["migStrategy"] == "mixed"

    status = cluster.status()
    assert status.ok, status.render()
    rows = {n.name: n for n in status.nodes or ()}
    assert rows[TS_NODE].gpus == "gpu.shared=4" and rows[TS_NODE].nvidia_mode


def test_mig_strategies_single_and_none_serve_nvidia_gpu_as_nvidias_plugin_does(
    cluster: Cluster, core: Any
) -> None:
    """Strategy single: every MIG device is one `nvidia.com/gpu` and Allocate answers MIG UUIDs; strategy
    none: the MIG-enabled GPU is one whole `nvidia.com/gpu` answered by its GPU UUID (NVIDIA's
    internal/rm/device_map.go). Both pods keep HAMi's webhook out (plain nvidia.com/gpu is HAMi's)."""
    on = "kubernetes.io/hostname"
    gpu2 = container("main", limits={"nvidia.com/gpu": "2"})
    gpu1 = container("main", limits={"nvidia.com/gpu": "1"})
    core.create_namespaced_pod(NS, pod("single", gpu2, labels=IGNORE, node_selector={on: SINGLE_NODE}))
    core.create_namespaced_pod(NS, pod("whole", gpu1, labels=IGNORE, node_selector={on: NONE_NODE}))

    single = phase(core, "single", "Running")
    assert single.spec.scheduler_name == "default-scheduler"
    ids = visible_devices(cluster, SINGLE_NODE, single, "main").split(",")
    assert len(ids) == 2 and all(i.startswith("MIG-") for i in ids), ids
    assert core.read_node(SINGLE_NODE).status.allocatable["nvidia.com/gpu"] == "2"
    labels = core.read_node(SINGLE_NODE).metadata.labels
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"

    whole = phase(core, "whole", "Running")
    (a100,) = load_inventory(cluster.inventory_path(NONE_NODE)).gpus
    assert visible_devices(cluster, NONE_NODE, whole, "main") == a100.uuid
    assert core.read_node(NONE_NODE).status.allocatable["nvidia.com/gpu"] == "1"


def test_mig_devices_time_sliced_are_replicas_of_mig_devices_answered_by_their_mig_uuid(
    cluster: Cluster, core: Any
) -> None:
    """NVIDIA's MIG with time-slicing: each 1g.5gb device becomes 2 replicas `MIG-<uuid>::<n>` under
    `nvidia.com/mig-1g.5gb.shared` (renameByDefault); Allocate strips the replica suffix
    (internal/rm/allocate.go uniqueDeviceIDsFromAnnotatedDeviceIDs); GFD labels the MIG resource's
    replicas and strategy (internal/lm/resource.go)."""
    shared = container("main", limits={"nvidia.com/mig-1g.5gb.shared": "1"})
    core.create_namespaced_pod(NS, pod("mig-replica", shared))
    found = phase(core, "mig-replica", "Running")
    assert found.spec.node_name == MIG_TS_NODE
    answered = visible_devices(cluster, MIG_TS_NODE, found, "main")
    assert answered.startswith("MIG-") and "::" not in answered
    labels = core.read_node(MIG_TS_NODE).metadata.labels
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert core.read_node(MIG_TS_NODE).status.allocatable["nvidia.com/mig-1g.5gb.shared"] == "4"
