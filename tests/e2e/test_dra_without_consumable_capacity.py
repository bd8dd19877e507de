"""End to end on a cluster whose API server lacks consumable capacity (kube-apiserver 1.34/1.35 with the
`DRAConsumableCapacity` gate off: the local API server's `--feature-gates DRAConsumableCapacity=false`
drops `allowMultipleAllocations`, request policies, capacity requests and `distinctAttribute`).

The DRA node daemon sees its slice come back without `allowMultipleAllocations`, publishes whole GPUs
instead and says so once (a Warning Event on its Node); a whole-GPU pod, translated by the webhook, gets a
whole GPU with all of its memory; a slice of a GPU cannot be expressed there, and the webhook says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException

from hami_api import dra
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.kubelet.config import CONTAINERS_FILE
from hami_sim.kubelet.runtime import read_containers
from tests.builders import gpu_pod
from tests.waiting import wait_for

NODE = "gpu-old"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec(
        nodes=(NodeSpec(NODE, (GPUSpec("NVIDIA A100-SXM4-40GB"),) * 2, mode="dra"),),
        apiserver_args=("--feature-gates", "DRAConsumableCapacity=false"),
    )
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def apis(cluster: Cluster) -> Iterator[tuple[Any, Any]]:
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    finally:
        api_client.close()


def test_the_node_publishes_whole_gpus_and_says_why_once(apis: tuple[Any, Any]) -> None:
    core, resource = apis

    def whole_gpus() -> list[Any] | None:
        items = resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
        devices = [d for s in items for d in s.spec.devices or []]
        if len(devices) == 2 and all(d.allow_multiple_allocations is None for d in devices):
            return devices
        return None

    devices = wait_for(whole_gpus, 30, "the slice with whole GPUs")
    assert all(d.capacity["memory"].request_policy is None for d in devices)

    def warned() -> list[Any]:
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}").items
        return [e for e in events if e.reason == "DRAConsumableCapacityUnavailable"]

    (event,) = wait_for(warned, 30, "the Warning Event on the Node")
    assert event.type == "Warning" and "DRAConsumableCapacity" in event.message
    assert (event.count or 1) == 1


def test_a_whole_gpu_pod_gets_a_whole_gpu_and_a_slice_is_refused_with_the_reason(
    cluster: Cluster, apis: tuple[Any, Any]
) -> None:
    core, resource = apis
    core.create_namespaced_pod("default", gpu_pod("whole", gpus=1))

    def running() -> Any:
        pod = core.read_namespaced_pod("whole", "default")
        return pod if pod.status.phase == "Running" else None

    pod = wait_for(running, 60, "the whole-GPU pod Running")
    env = read_containers(cluster.kubelet_dir(NODE) / CONTAINERS_FILE).env(pod.metadata.uid, "main")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40960m"
    assert env.get("CUDA_DEVICE_SM_LIMIT_0", env.get("CUDA_DEVICE_SM_LIMIT")) == "100"
    (claim,) = resource.list_namespaced_resource_claim("default").items
    (result,) = claim.status.allocation.devices.results
    assert result.driver == dra.DRIVER and result.share_id is None and result.consumed_capacity is None

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("default", gpu_pod("slice", gpus=1, gpumem=4000, gpucores=30))
    assert "DRAConsumableCapacity" in refused.value.body
