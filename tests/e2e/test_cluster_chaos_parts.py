"""The local cluster's parts for chaos runs, end to end on one node with 2 fake A100s in scale mode (its
kubelet and its hami-node inside host processes; hami-node recovers a GPU after a 2 s quiet period):

- `Cluster.kill` drops a node's kubelet stand-in and hami-node inside their hosts (SIGKILL-like) and a
  process (the scheduler) with SIGKILL; `start_component` brings each back and a new GPU pod runs.
- A pod annotated `sim.hami.io/run-seconds` with restartPolicy Never ends Succeeded; hami-control and
  kubelet let go of its GPUs, and the next pod gets them.
- `inject_gpu_fault` / `clear_gpu_fault` round trip through the node's fake inventory: an Xid turns a GPU
  unhealthy in the node's register annotation; one whose NVML calls fail too stays so past the quiet
  period, and recovers once cleared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hami_api.annotations import BIND_PHASE, DEVICES_ALLOCATED, NODE_REGISTER, decode_node_register
from hami_node.gpu.inventory import NvmlMode, load_inventory
from hami_sim.cluster import Cluster, ClusterError, ClusterSpec
from hami_sim.kubelet import read_checkpoint
from hami_sim.kubelet.pods import RUN_SECONDS
from tests.builders import gpu_pod
from tests.e2e.e2e_util import control_metrics, core_v1
from tests.waiting import wait_for

NODE = "gpu-node-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec.uniform(1, 2, split=4, scale=True, node_args=("--health-recovery-seconds", "2"))
    with Cluster.up(spec, tmp_path_factory.mktemp("chaos-parts") / ".hami-sim") as running:
        yield running


@pytest.fixture
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api
        for pod in api.list_namespaced_pod("default").items:
            api.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
        wait_for(lambda: not api.list_namespaced_pod("default").items, 30, "every pod to go")


def phase(core: Any, name: str) -> str:
    pod = core.read_namespaced_pod(name, "default")
    running = pod.status.phase == "Running" and (pod.metadata.annotations or {}).get(BIND_PHASE) == "success"
    return "Running" if running else str(pod.status.phase)


def gpu_health(core: Any, index: int) -> bool:
    annotations = core.read_node(NODE).metadata.annotations or {}
    (gpu,) = [g for g in decode_node_register(annotations[NODE_REGISTER]) if g.index == index]
    return bool(gpu.health)


def test_killed_node_parts_and_scheduler_come_back_with_start_component(cluster: Cluster, core: Any) -> None:
    cluster.kill("hami-node/gpu-node-1")
    cluster.kill("kubelet/gpu-node-1")
    assert not (cluster.kubelet_dir(NODE) / "kubelet.sock").exists()
    with pytest.raises(ClusterError, match="nothing of it runs in this host"):
        cluster.kill("kubelet/gpu-node-1")
    cluster.kill("scheduler")
    assert not cluster.procs["scheduler"].alive()
    with pytest.raises(ClusterError, match="scheduler is not running"):
        cluster.kill("scheduler")
    with pytest.raises(ClusterError, match="cannot be killed"):
        cluster.kill("apiserver")
    core.create_namespaced_pod("default", gpu_pod("after-kills", gpumem=1000))
    cluster.start_component("kubelet/gpu-node-1")
    cluster.start_component("hami-node/gpu-node-1")
    cluster.start_component("scheduler")
    wait_for(lambda: phase(core, "after-kills") == "Running", 60, "the pod to run after the restarts")
    assert cluster.status().ok


def test_a_completed_pods_gpus_are_let_go_and_go_to_the_next_pod(cluster: Cluster, core: Any) -> None:
    whole: dict[str, Any] = {"gpus": 2, "gpumem_percentage": 100}
    batch = gpu_pod("batch", **whole, annotations={RUN_SECONDS: "2"}, restartPolicy="Never")
    uid = core.create_namespaced_pod("default", batch).metadata.uid
    wait_for(lambda: phase(core, "batch") == "Running", 30, "the batch pod to run")
    wait_for(lambda: phase(core, "batch") == "Succeeded", 30, "the batch pod to succeed")
    (status,) = core.read_namespaced_pod("batch", "default").status.container_statuses
    assert (status.state.terminated.exit_code, status.state.terminated.reason) == (0, "Completed")
    # Both let go of its GPUs: hami-control's usage (its /metrics) and kubelet's checkpoint.
    # The two are independent: kubelet writes the pod's status, then frees its devices, and hami-control
    # acts on the status it watched; either may come first.
    wait_for(lambda: 'pod="batch"' not in control_metrics(cluster), 10, "hami-control to drop its usage")
    checkpoint_file = cluster.kubelet_dir(NODE) / "kubelet_internal_checkpoint"
    wait_for(
        lambda: read_checkpoint(checkpoint_file).for_container(uid, "main") == [],
        10,
        "kubelet's checkpoint to let go of the batch pod's devices",
    )
    core.create_namespaced_pod("default", gpu_pod("next", **whole))
    wait_for(lambda: phase(core, "next") == "Running", 30, "the next pod to get both GPUs")
    after = core.read_namespaced_pod("next", "default")
    assert after.metadata.annotations[DEVICES_ALLOCATED].count("NVIDIA") == 2


def test_gpu_faults_round_trip_through_the_fake_inventory(cluster: Cluster, core: Any) -> None:
    path = cluster.inventory_path(NODE)
    # GPU 0: an Xid, and its NVML calls fail (its probe too), so it cannot recover; GPU 1: an Xid alone.
    cluster.inject_gpu_fault(NODE, 0, "unhealthy")
    cluster.inject_gpu_fault(NODE, 0, "xid")
    cluster.inject_gpu_fault(NODE, 1, "xid", xid=48)
    inventory = load_inventory(path)
    assert [(e.kind.value, e.xid, e.gpu) for e in inventory.events] == [
        ("xid", 79, inventory.gpus[0].uuid),
        ("xid", 48, inventory.gpus[1].uuid),
    ]
    wait_for(
        lambda: not gpu_health(core, 0) and not gpu_health(core, 1), 10, "the Xids to mark both unhealthy"
    )
    cluster.clear_gpu_fault(NODE, 1)
    wait_for(lambda: gpu_health(core, 1), 30, "GPU 1 to recover after the quiet period")
    assert not gpu_health(core, 0), "GPU 0 recovered while failing its probe"
    cluster.clear_gpu_fault(NODE, 0)
    inventory = load_inventory(path)
    assert inventory.events == () and all(g.healthy and not g.lost for g in inventory.gpus)
    wait_for(lambda: gpu_health(core, 0), 30, "GPU 0 to recover once cleared")

    cluster.inject_gpu_fault(NODE, None, "nvml-failing")
    assert load_inventory(path).nvml is NvmlMode.FAILING
    cluster.clear_gpu_fault(NODE, None)
    assert load_inventory(path).nvml is NvmlMode.OK
    with pytest.raises(ClusterError, match="kind: expected one of xid"):
        cluster.inject_gpu_fault(NODE, 0, "melted")
    with pytest.raises(ClusterError, match="gpu_index: node gpu-node-1 has no GPU with index 7"):
        cluster.inject_gpu_fault(NODE, 7, "lost")
    with pytest.raises(ClusterError, match="gpu_index: nvml-failing is about the whole node"):
        cluster.inject_gpu_fault(NODE, 0, "nvml-failing")
