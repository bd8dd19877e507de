"""`hami-node` as a separate process (fake GPUs, kubelet stand-in, local API server) serving /metrics on its
health endpoint: per-GPU metrics from the start, and after kubelet's Allocate for a pod, that container's
metrics with live values from the simulated HAMi-core region, under HAMi's vGPU monitor names."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_node.gpu.inventory import generate_inventory
from tests.apiserver_util import create_and_bind
from tests.builders import allocation, container
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import NAMESPACE, NodeRig, make_rig
from tests.waiting import wait_for

NODE = "gpu-node-metrics"
MIB = 1024 * 1024

# HAMi's vGPU monitor families (Project-HAMi/HAMi cmd/vGPUmonitor/metrics.go, v2.10: the descriptors
# built with prometheus.NewDesc, and with --legacy-metrics those of initLegacyDescriptors), with their
# label names. The MIG families (hami_mig_device_info, MigInfo) are left out: no MIG support here.
_HOST = ("node", "device_index", "device_uuid", "device_type")
_CTR = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
_LEGACY_HOST = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
_LEGACY_CTR = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
HAMI_FAMILIES = {
    "hami_host_gpu_memory_used_bytes": _HOST,
    "hami_host_gpu_utilization_ratio": _HOST,
    "hami_host_gpu_memory_controller_utilization_ratio": ("device_index", "device_uuid", "device_type"),
    "hami_vgpu_memory_used_bytes": _CTR,
    "hami_vgpu_memory_limit_bytes": _CTR,
    "hami_container_device_memory_bytes": _CTR,
    "hami_container_device_utilization_ratio": _CTR,
    "hami_container_last_kernel_elapsed_seconds": _CTR,
    "hami_vgpu_memory_context_bytes": _CTR,
    "hami_vgpu_memory_module_bytes": _CTR,
    "hami_vgpu_memory_buffer_bytes": _CTR,
    "HostGPUMemoryUsage": _LEGACY_HOST,
    "HostCoreUtilization": _LEGACY_HOST,
    "vGPU_device_memory_usage_in_bytes": _LEGACY_CTR,
    "vGPU_device_memory_limit_in_bytes": _LEGACY_CTR,
    "Device_memory_desc_of_container": (*_LEGACY_CTR, "context", "module", "data", "offset"),
    "Device_utilization_desc_of_container": _LEGACY_CTR,
    "Device_last_kernel_of_container": _LEGACY_CTR,
}
"""Every one of these is registered by HAMi under `WrapRegistererWith({"zone": "vGPU"})`."""


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    yield from make_rig(NODE, apiserver.kubeconfig, generate_inventory(2, seed=NODE))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    found = [v for d, v in samples.get(name, []) if all(d.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_node_metrics_show_each_gpu_and_after_allocate_the_container_s_live_usage(
    rig: NodeRig, core_v1: Any
) -> None:
    port = free_port()
    rig.start_daemon("--health-bind", f"127.0.0.1:{port}")
    gpus = rig.inventory.gpus

    # Kubelet lists the devices while it handles the Register call; the daemon counts the registration
    # once the call's answer is back, which may come after: scrape once it has.
    def registered() -> Samples | None:
        samples = scrape(port)
        return samples if one(samples, "hami_node_registrations_total", result="success") >= 1 else None

    first = wait_for(registered, what="hami-node to count its registration")
    for g in gpus:
        labels = {"node": NODE, "device_index": str(g.index), "device_uuid": g.uuid}
        assert one(first, "hami_node_gpu_healthy", **labels) == 1
        assert one(first, "hami_node_gpu_memory_total_bytes", **labels) == g.memory_mib * MIB
        assert one(first, "hami_host_gpu_memory_used_bytes", **labels, zone="vGPU") == 0
        assert one(first, "HostGPUMemoryUsage", nodeid=NODE, deviceuuid=g.uuid, zone="vGPU") == 0
    assert one(first, "hami_node_registrations_total", result="success") >= 1
    assert one(first, "hami_node_list_and_watch_updates_total") >= 1

    gpu = gpus[1]
    choice = allocation([(gpu.uuid, 3000, 30)])
    create_and_bind(
        core_v1, "busy", NODE, [container("main", gpus=1, env={"CUDA_TASK_PRIORITY": "0"})], choice
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "busy", timeout=20)
    assert result.admitted, result.message

    def container_metrics() -> Samples | None:
        samples = scrape(port)
        return samples if any(v > 0 for _, v in samples.get("hami_vgpu_memory_used_bytes", [])) else None

    # Allocate creates the region as HAMi-core initialises it (no process: 0 bytes used); the simulator
    # writes a process's usage on the container monitor's next round (every 5 s).
    got = wait_for(container_metrics, 20.0, "the container's metrics", interval=0.5)
    labels = {"namespace": NAMESPACE, "pod": "busy", "container": "main", "vdevice_index": "0"}
    labels |= {"device_uuid": gpu.uuid, "zone": "vGPU"}
    used = one(got, "hami_vgpu_memory_used_bytes", **labels)
    assert one(got, "hami_vgpu_memory_limit_bytes", **labels) == 3000 * MIB
    assert 0.2 * 3000 * MIB - MIB <= used <= 0.8 * 3000 * MIB
    assert 0 < one(got, "hami_container_device_utilization_ratio", **labels) <= 30
    assert 0 <= one(got, "hami_container_last_kernel_elapsed_seconds", **labels) <= 30
    legacy = {"podnamespace": NAMESPACE, "podname": "busy", "ctrname": "main", "deviceuuid": gpu.uuid}
    assert one(got, "vGPU_device_memory_usage_in_bytes", **legacy) == used

    # The fake GPU's own usage is its containers' sum (both change on each round: a scrape between the
    # round's file write and its hand-over to the backend may see them differ, the next agrees).
    def agreeing() -> bool:
        samples = scrape(port)
        host = one(samples, "hami_host_gpu_memory_used_bytes", device_uuid=gpu.uuid)
        return host == one(samples, "hami_vgpu_memory_used_bytes", **labels) > 0

    wait_for(agreeing, 10.0, "the GPU's memory used to equal its container's", interval=0.2)
    assert one(got, "hami_node_allocate_duration_seconds_count", result="success") == 1

    # Every HAMi family is exported, with HAMi's label names (and its zone).
    for name, label_names in HAMI_FAMILIES.items():
        assert name in got, f"{name} is not exported"
        for sample_labels, _ in got[name]:
            assert set(sample_labels) == {*label_names, "zone"}, (name, sample_labels)
            assert sample_labels["zone"] == "vGPU"
