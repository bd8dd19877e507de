"""End to end: the demo's workloads (`examples/demo/`, unchanged pod specs) through DRA on the demo's
cluster with every node in DRA mode (`hami-sim demo --mode dra`): the webhook translates them to claims,
the scheduler stand-in allocates the claims itself, the node daemons prepare them. Every pod the
device-plugin demo runs lands, with the same HAMi-core limits, except the one asking
`gpumem-percentage` without a GPU model, which DRA cannot express and the webhook refuses saying what to
write instead; quota and privileged pods are refused as on the device-plugin path; no GPU is given more
than it has; the usage table reads from the slices and claims."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_api.quantity import quantity_value
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.demo import EXAMPLES, _create, _documents, container_env, usage_table
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

EXPECTED = {
    ("ai-team", "inference-a"),
    ("ai-team", "inference-b"),
    ("default", "training"),
    ("default", "pipeline"),
    ("default", "agent"),
    ("default", "t4-only"),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    a100, t4 = GPUSpec("NVIDIA A100-SXM4-80GB"), GPUSpec("NVIDIA Tesla T4", 15360)
    spec = ClusterSpec(
        nodes=(NodeSpec("gpu-a", (a100,) * 4), NodeSpec("gpu-b", (a100,) * 4), NodeSpec("gpu-t4", (t4,) * 4))
    ).with_mode("dra")
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def test_demo_workloads_land_through_dra_with_the_device_plugin_paths_limits(
    cluster: Cluster, core: Any
) -> None:
    refused: dict[str, str] = {}
    for doc in _documents(Path(EXAMPLES)):
        message = _create(core.api_client, doc)
        if message is not None:
            refused[doc["metadata"]["name"]] = message
    assert set(refused) == {"notebook", "batch-embed", "debug-privileged"}
    assert "gpumem-percentage 25 cannot be translated" in refused["notebook"]
    assert "Write nvidia.com/gpumem" in refused["notebook"]
    assert (
        "GPU memory quota exceeded (used 16000 / limit 30000 MiB, this pod asks 16000)"
        in refused["batch-embed"]
    )
    assert "privileged" in refused["debug-privileged"]

    def running() -> dict[tuple[str, str], Any] | None:
        pods = {(p.metadata.namespace, p.metadata.name): p for p in core.list_pod_for_all_namespaces().items}
        done = all(key in pods and pods[key].status.phase == "Running" for key in EXPECTED)
        return pods if done else None

    pods = wait_for(running, 90, "every translatable demo pod Running")
    assert all(pods[key].spec.resource_claims for key in EXPECTED)
    assert pods[("default", "t4-only")].spec.node_name == "gpu-t4"

    env = container_env(cluster, core, "ai-team", "inference-a", "server")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m" and env["CUDA_DEVICE_SM_LIMIT"] == "25"
    training = container_env(cluster, core, "default", "training", "trainer")
    whole = "15360m" if pods[("default", "training")].spec.node_name == "gpu-t4" else "81920m"
    assert training["CUDA_DEVICE_MEMORY_LIMIT_0"] == training["CUDA_DEVICE_MEMORY_LIMIT_1"] == whole
    limits = {
        c: container_env(cluster, core, "default", "pipeline", c)["CUDA_DEVICE_MEMORY_LIMIT_0"]
        for c in ("warm-cache", "server", "embedder")
    }
    assert limits == {"warm-cache": "6000m", "server": "10000m", "embedder": "4000m"}

    resource = client.ResourceV1Api(core.api_client)
    capacity: dict[str, tuple[int, int]] = {}
    for item in resource.list_resource_slice().items:
        for device in item.spec.devices:
            capacity[f"{item.spec.pool.name}/{device.name}"] = (
                quantity_value(device.capacity["memory"].value),
                quantity_value(device.capacity["cores"].value),
            )
    used: dict[str, list[int]] = {}
    for claim in resource.list_resource_claim_for_all_namespaces().items:
        for result in claim.status.allocation.devices.results:
            consumed = result.consumed_capacity or {}
            entry = used.setdefault(f"{result.pool}/{result.device}", [0, 0])
            entry[0] += quantity_value(consumed["memory"])
            entry[1] += quantity_value(consumed["cores"])
    for device, (memory, cores) in used.items():
        assert memory <= capacity[device][0] and cores <= capacity[device][1], device

    table = usage_table(core, resource)
    full = f"{whole[:-1]}/{whole[:-1]}"
    assert "gpu-t4" in table and table.count(full) >= 2  # training's two whole GPUs
