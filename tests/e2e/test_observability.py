"""The local cluster shows what it runs: every node daemon serves /metrics on its own port
(`Cluster.node_metrics_url`) with live values (per GPU from the fake backend, per container from the
HAMi-core shared region files the fake backend writes for the pods it allocated), and `kubectl hami top`
(the console script, and kubectl's plugin through PATH) shows the numbers of the node register and pod
allocation annotations. A health port taken between the pick and a daemon's start moves the daemon to
another one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_api.annotations import DEVICES_ALLOCATED, NODE_REGISTER, decode_node_register, decode_pod_allocation
from hami_sim.cluster import Cluster, ClusterSpec
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

MIB = 1024 * 1024
PODS = {  # name: (GPUs, gpumem MiB per GPU, gpucores per GPU)
    "small": (1, 2000, 20),
    "medium": (1, 6000, 30),
    "two-gpus": (2, 4000, 25),
}
POD_NODE, SPARE_NODE = "gpu-node-2", "gpu-node-1"
"""The pods run on one node; the other's daemon is restarted (its simulated containers would stop)."""
Series = dict[tuple[str, str], float]
"""(pod, device_uuid) -> value, of namespace default, container main. (`vdevice_index` is the GPU's
index in the container, in kubelet's order of its devices, which need not be the annotation's.)"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster.up(ClusterSpec.uniform(2, 2), tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        for name, (gpus, gpumem, gpucores) in PODS.items():
            body = gpu_pod(
                name,
                gpus=gpus,
                gpumem=gpumem,
                gpucores=gpucores,
                node_selector={"kubernetes.io/hostname": POD_NODE},
            )
            api.create_namespaced_pod("default", body)

        def all_running() -> bool:
            pods = [api.read_namespaced_pod(name, "default") for name in PODS]
            return all(
                p.status.phase == "Running" and DEVICES_ALLOCATED in p.metadata.annotations for p in pods
            )

        wait_for(all_running, 60, "the pods to run with their GPUs allocated", interval=0.2)
        yield api


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] of one /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def containers(page: dict[str, list[tuple[dict[str, str], float]]], name: str) -> Series:
    return {
        (labels["pod"], labels["device_uuid"]): value
        for labels, value in page.get(name, [])
        if labels["namespace"] == "default" and labels["container"] == "main"
    }


def allocations(core: Any) -> dict[str, tuple[str, list[tuple[str, int, int]]]]:
    """pod -> (node, [(GPU uuid, MiB, cores)]) from the pods' allocation annotations."""
    out = {}
    for name in PODS:
        pod = core.read_namespaced_pod(name, "default")
        (container,) = decode_pod_allocation(pod.metadata.annotations[DEVICES_ALLOCATED]).containers
        out[name] = (pod.spec.node_name, [(d.uuid, d.usedmem, d.usedcores) for d in container.devices])
    return out


def live_containers(cluster: Cluster, core: Any) -> dict[str, Series]:
    """Per node, the `hami_vgpu_memory_used_bytes` of our containers, once every allocated device of
    every pod shows one above 0 (the fake backend writes the regions every 5 s)."""
    expected = {(pod, uuid) for pod, (_, devices) in allocations(core).items() for uuid, _, _ in devices}

    last: dict[str, Series] = {}

    def scraped() -> dict[str, Series] | None:
        used = {
            node: containers(scrape(cluster.node_metrics_url(node)), "hami_vgpu_memory_used_bytes")
            for node in cluster.node_names
        }
        last.update(used)
        seen = {key for series in used.values() for key, value in series.items() if value > 0}
        return used if expected <= seen else None

    what = "every container's memory used on /metrics"
    return wait_for(
        scraped, 30, what, interval=0.5, detail=lambda: f"expected {sorted(expected)}, got {last}"
    )


def test_each_node_daemon_serves_metrics_of_every_gpu_it_registered(cluster: Cluster, core: Any) -> None:
    for node in cluster.node_names:
        gpus = decode_node_register(core.read_node(node).metadata.annotations[NODE_REGISTER])
        page = scrape(cluster.node_metrics_url(node))
        totals = {labels["device_uuid"]: value for labels, value in page["hami_node_gpu_memory_total_bytes"]}
        assert totals == {g.id: g.devmem * MIB for g in gpus}
        healthy = {labels["device_uuid"]: value for labels, value in page["hami_node_gpu_healthy"]}
        assert healthy == {g.id: 1.0 for g in gpus}
        used = page["hami_host_gpu_memory_used_bytes"]
        assert {labels["device_uuid"] for labels, _ in used} == {g.id for g in gpus}
        assert all(labels["node"] == node and labels["zone"] == "vGPU" for labels, _ in used)
    wide = cluster.status().render(wide=True)
    assert all(cluster.node_metrics_url(node) in wide for node in cluster.node_names)


def test_running_containers_use_memory_within_their_gpumem_limit(cluster: Cluster, core: Any) -> None:
    live_containers(cluster, core)
    for pod, (node, devices) in allocations(core).items():
        page = scrape(cluster.node_metrics_url(node))
        used = containers(page, "hami_vgpu_memory_used_bytes")
        limits = containers(page, "hami_vgpu_memory_limit_bytes")
        indexes = {
            labels["vdevice_index"]
            for labels, _ in page["hami_vgpu_memory_used_bytes"]
            if labels["pod"] == pod
        }
        assert indexes == {str(i) for i in range(len(devices))}
        for uuid, mib, _ in devices:
            key = (pod, uuid)
            assert mib == PODS[pod][1]
            assert limits[key] == mib * MIB, f"{pod} on {uuid}"
            assert 0 < used[key] <= limits[key], f"{pod} on {uuid}: {used[key]} of {limits[key]}"
            legacy = {  # HAMi's names before v2.9, labelled as HAMi labels them
                (labels["podname"], labels["deviceuuid"]): value
                for labels, value in page["vGPU_device_memory_usage_in_bytes"]
                if labels["podnamespace"] == "default" and labels["ctrname"] == "main"
            }
            assert legacy[key] == used[key]


def test_container_memory_used_changes_between_scrapes(cluster: Cluster, core: Any) -> None:
    first = live_containers(cluster, core)

    def changed() -> bool:
        now = {
            node: containers(scrape(cluster.node_metrics_url(node)), "hami_vgpu_memory_used_bytes")
            for node in cluster.node_names
        }
        return all(now[node][key] != value for node, series in first.items() for key, value in series.items())

    wait_for(changed, 30, "every container's memory used to change", interval=1.0)


def test_gpu_memory_used_is_the_sum_of_its_containers(cluster: Cluster, core: Any) -> None:
    live_containers(cluster, core)

    def consistent() -> bool:  # one scrape between two of the daemon's 5 s rounds
        for node in cluster.node_names:
            page = scrape(cluster.node_metrics_url(node))
            sums: dict[str, float] = {}
            for (_, uuid), value in containers(page, "hami_vgpu_memory_used_bytes").items():
                sums[uuid] = sums.get(uuid, 0.0) + value
            gpus = {labels["device_uuid"]: value for labels, value in page["hami_host_gpu_memory_used_bytes"]}
            if gpus != {uuid: sums.get(uuid, 0.0) for uuid in gpus}:
                return False
        return True

    wait_for(consistent, 30, "each GPU's memory used to be its containers' sum", interval=0.5)


def expected_top(cluster: Cluster, core: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(node, GPU uuid) -> what `top -o json` must show, from the annotations alone."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for node in cluster.node_names:
        for g in decode_node_register(core.read_node(node).metadata.annotations[NODE_REGISTER]):
            out[node, g.id] = {
                "index": g.index,
                "slices": {"used": 0, "total": g.count},
                "memoryMiB": {"used": 0, "total": g.devmem},
                "cores": {"used": 0, "total": g.devcore},
                "pods": [],
            }
    for pod, (node, devices) in sorted(allocations(core).items()):
        for uuid, mib, cores in devices:
            gpu = out[node, uuid]
            gpu["slices"]["used"] += 1
            gpu["memoryMiB"]["used"] += mib
            gpu["cores"]["used"] += cores
            gpu["pods"].append({"namespace": "default", "name": pod, "memoryMiB": mib, "cores": cores})
    return out


def shown(top: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    keys = ("index", "slices", "memoryMiB", "cores", "pods")
    return {(n["name"], g["uuid"]): {k: g[k] for k in keys} for n in top["nodes"] for g in n["gpus"]}


def test_kubectl_hami_top_shows_the_numbers_of_the_annotations(cluster: Cluster, core: Any) -> None:
    script = Path(sys.executable).parent / "kubectl-hami"
    result = subprocess.run(
        [str(script), "top", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    top = json.loads(result.stdout)
    assert all(n["counted"] and n["mode"] == "device-plugin" for n in top["nodes"])
    assert all(g["health"] == "ok" for n in top["nodes"] for g in n["gpus"])
    assert shown(top) == expected_top(cluster, core)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_runs_the_plugin_from_path(cluster: Cluster, core: Any) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    result = subprocess.run(
        ["kubectl", "hami", "top", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert shown(json.loads(result.stdout)) == expected_top(cluster, core)


def test_a_node_daemon_whose_port_was_taken_moves_to_another(cluster: Cluster, core: Any) -> None:
    node = SPARE_NODE
    old = cluster.node_metrics_url(node)
    cluster.stop_component(f"hami-node/{node}")
    port = int(old.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        cluster.start_component(f"hami-node/{node}")
        new = cluster.node_metrics_url(node)
        assert new != old
        assert Cluster.load(cluster.state_dir).node_metrics_url(node) == new  # in cluster.json
        wait_for(lambda: "hami_node_gpu_healthy" in scrape(new), 30, f"{new} to answer", interval=0.5)
    cluster.wait_ready(60)
