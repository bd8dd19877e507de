"""End to end on `hami-sim` (every component a real process, real protocols): the demo's workloads,
created through the official client as a user would, land exactly as expected (node, GPUs, annotations,
the env in the kubelet stand-in's checkpoint, what its PodResources API lists, Running), the quota and
privileged pods are refused with their messages, every GPU stays within its limits, and deleting pods
frees capacity so a pending pod runs within seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    decode_node_register,
    decode_pod_allocation,
)
from hami_node.plugin.api.constants import CHECKPOINT_FILE
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.demo import EXAMPLES, _create, _documents, container_env, usage_table
from hami_sim.kubelet.checkpoint import read_checkpoint
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.podresources import api_pb2 as podresources_pb2
from hami_sim.kubelet.podresources import api_pb2_grpc as podresources_grpc
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    a100, t4 = GPUSpec("NVIDIA A100-SXM4-80GB"), GPUSpec("NVIDIA Tesla T4", 15360)
    spec = ClusterSpec(
        nodes=(NodeSpec("gpu-a", (a100,) * 4), NodeSpec("gpu-b", (a100,) * 4), NodeSpec("gpu-t4", (t4,) * 4))
    )
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def allocation_of(pod: Any) -> list[list[tuple[str, int, int]]]:
    text = (pod.metadata.annotations or {}).get(DEVICES_ALLOCATED, "")
    return [
        [(s.uuid, s.usedmem, s.usedcores) for s in c.devices] for c in decode_pod_allocation(text).containers
    ]


def pod_resources(cluster: Cluster, node: str) -> dict[tuple[str, str], dict[str, list[str]]]:
    """What the node's kubelet stand-in lists on its PodResources socket, as a node agent (dcgm-exporter)
    reads it: per pod, per listed container, its device IDs."""
    socket = KubeletConfig(node, cluster.kubelet_dir(node)).pod_resources_socket
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        response = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=30, wait_for_ready=True)
    return {
        (p.namespace, p.name): {
            c.name: sorted({i for d in c.devices for i in d.device_ids}) for c in p.containers
        }
        for p in response.pod_resources
    }


def test_demo_workloads_land_as_expected(cluster: Cluster, core: Any) -> None:
    refused: dict[str, str] = {}
    for doc in _documents(Path(EXAMPLES)):
        message = _create(core.api_client, doc)
        if message is not None:
            refused[doc["metadata"]["name"]] = message
    assert set(refused) == {"batch-embed", "debug-privileged"}
    assert (
        "GPU memory quota exceeded (used 16000 / limit 30000 MiB, this pod asks 16000)"
        in refused["batch-embed"]
    )
    assert "privileged" in refused["debug-privileged"]

    expected = {
        ("ai-team", "inference-a"),
        ("ai-team", "inference-b"),
        ("default", "notebook"),
        ("default", "training"),
        ("default", "pipeline"),
        ("default", "agent"),
        ("default", "t4-only"),
    }

    def running() -> bool:
        pods = {(p.metadata.namespace, p.metadata.name): p for p in core.list_pod_for_all_namespaces().items}
        return all(
            key in pods
            and pods[key].status.phase == "Running"
            and (pods[key].metadata.annotations or {}).get(BIND_PHASE) == "success"
            for key in expected
        )

    wait_for(running, 60, "every demo pod Running with bind-phase=success")
    pods = {(p.metadata.namespace, p.metadata.name): p for p in core.list_pod_for_all_namespaces().items}

    sizes: dict[str, int] = {}
    for node in core.list_node().items:
        for gpu in decode_node_register(node.metadata.annotations[NODE_REGISTER]):
            sizes[gpu.id] = gpu.devmem
    training = allocation_of(pods[("default", "training")])
    training_node = pods[("default", "training")].spec.node_name
    assert len(training[0]) == 2 and all(mem == sizes[g] and cores == 100 for g, mem, cores in training[0])
    t4 = pods[("default", "t4-only")]
    assert t4.spec.node_name == "gpu-t4"
    # The demo's table (`kubectl hami top`'s): every pod on its GPUs, training's two GPUs full.
    table = usage_table(core).splitlines()
    assert all(any(f"{ns}/{name}" in line for line in table) for ns, name in expected)
    for gpu, mem, _ in training[0]:
        (line,) = [line for line in table if f"..{gpu[-8:]}" in line and line.startswith(training_node)]
        assert f"{mem}/{mem}" in line and "default/training" in line
    notebook = allocation_of(pods[("default", "notebook")])[0]
    assert notebook[0][1] == sizes[notebook[0][0]] * 25 // 100 and notebook[0][2] == 30
    pipeline = allocation_of(pods[("default", "pipeline")])
    assert [len(c) for c in pipeline] == [1, 1, 1]  # init, server, embedder: a GPU slice each
    assert [c[0][1] for c in pipeline] == [6000, 10000, 4000]
    assert pipeline[1][0][0] == pipeline[0][0][0]  # kubelet hands the server the init's device
    agent = allocation_of(pods[("default", "agent")])
    assert [c[0][1] for c in agent] == [3000, 2000, 12000]
    # Kubelet hands the sidecar (admitted next) the init container's device; the sidecar keeps it, so
    # the app container gets a new one.
    assert agent[1][0][0] == agent[0][0][0]

    # Kubelet's PodResources List on each node: exactly the demo pods, each on its node, with its sidecars
    # and app containers (plain init containers are not listed, as in kubelet).
    listed: dict[tuple[str, str], tuple[str, dict[str, list[str]]]] = {}
    for node in cluster.node_names:
        for key, containers in pod_resources(cluster, node).items():
            assert key not in listed, f"{key} listed on {listed[key][0]} and {node}"
            listed[key] = (node, containers)
    assert set(listed) == expected

    # For every container: what PodResources lists (device IDs -> GPU UUIDs) = the GPU kubelet recorded
    # (checkpoint) = the GPU it sees (env from Allocate) = the GPU the scheduler accounted (the pod's
    # allocation annotation).
    for (namespace, name), pod in pods.items():
        if (namespace, name) not in expected:
            continue
        checkpoint = read_checkpoint(cluster.kubelet_dir(pod.spec.node_name) / CHECKPOINT_FILE)
        inits = pod.spec.init_containers or []
        sidecars = [c.name for c in inits if c.restart_policy == "Always"]
        node, reported = listed[(namespace, name)]
        assert node == pod.spec.node_name, name
        assert list(reported) == sidecars + [c.name for c in pod.spec.containers], name
        names = [c.name for c in inits] + [c.name for c in pod.spec.containers]
        for container, entry in zip(names, allocation_of(pod), strict=True):
            held = checkpoint.for_container(pod.metadata.uid, container)
            listed_gpus = (
                sorted(i.rsplit("-", 1)[0] for i in reported[container]) if container in reported else None
            )
            if not entry:
                assert held == [] and listed_gpus in (None, []), (name, container)
                continue
            (record,) = held
            recorded = sorted(i.rsplit("-", 1)[0] for i in record.all_device_ids)
            seen = sorted(record.response.envs["NVIDIA_VISIBLE_DEVICES"].split(","))
            assert recorded == seen == sorted(g for g, _, _ in entry), (name, container)
            if container in reported:
                assert listed_gpus == recorded, (name, container)
            else:
                assert container in {c.name for c in inits} and container not in sidecars, (name, container)

    env = container_env(cluster, core, "ai-team", "inference-a", "server")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m" and env["CUDA_DEVICE_SM_LIMIT"] == "25"
    uuid = allocation_of(pods[("ai-team", "inference-a")])[0][0][0]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid

    # No GPU over its memory, cores or slots (regular containers and sidecars; init containers have
    # finished).
    per_gpu: dict[str, list[int]] = {}
    for pod in pods.values():
        inits = pod.spec.init_containers or []
        running = [
            c
            for i, c in enumerate(allocation_of(pod))
            if i >= len(inits) or inits[i].restart_policy == "Always"
        ]
        for c in running:
            for gpu, mem, cores in c:
                used = per_gpu.setdefault(gpu, [0, 0, 0])
                used[0] += 1
                used[1] += mem
                used[2] += cores
    for gpu, (slots, mem, cores) in per_gpu.items():
        assert slots <= 10 and cores <= 100 and mem <= sizes[gpu], (gpu, slots, mem, cores)


def test_deleting_pods_frees_capacity_for_a_pending_pod(cluster: Cluster, core: Any) -> None:
    """With the demo pods gone, a pod takes all four T4s exclusively; a second one waits (FailedScheduling
    with the extender's reasons) and runs within 10 s of the first being deleted."""
    for pod in core.list_pod_for_all_namespaces().items:
        core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_pod_for_all_namespaces().items, 30, "the demo pods to go")

    def phase(name: str) -> str:
        return str(core.read_namespaced_pod(name, "default").status.phase)

    t4_only = {"nvidia.com/use-gputype": "T4"}
    core.create_namespaced_pod("default", gpu_pod("first", gpus=4, annotations=t4_only))
    wait_for(lambda: phase("first") == "Running", 30, "the first pod to run")
    core.create_namespaced_pod("default", gpu_pod("second", gpus=4, annotations=t4_only))

    def refused() -> bool:
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=second").items
        return any(e.reason == "FailedScheduling" for e in events)

    wait_for(refused, 30, "the second pod to be found unschedulable")
    assert phase("second") == "Pending"
    core.delete_namespaced_pod("first", "default", grace_period_seconds=0)
    freed = time.monotonic()
    wait_for(lambda: phase("second") == "Running", 15, "the second pod to run once the first is gone")
    assert time.monotonic() - freed < 10
