"""End to end on `hami-sim`: a node whose fake GPUs have an NVLink pair and PCIe-only pairs. hami-node
publishes HAMi's pair scores on the Node (`hami.io/node-nvidia-score`), and hami-control's
topology-aware GPU policy (`hami.io/gpu-scheduler-policy: topology-aware`) reads them: a 2-GPU pod lands
on the NVLink pair, and a 1-GPU pod on a GPU the NVLink pair does not need."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    GPU_SCHEDULER_POLICY,
    NODE_PAIR_SCORE,
    decode_pair_scores,
    decode_pod_allocation,
)
from hami_node.gpu import TopologyLevel
from hami_node.gpu.inventory import LinkGroup, load_inventory
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

NODE = "gpu-topo"
TOPOLOGY_AWARE = {GPU_SCHEDULER_POLICY: "topology-aware"}
# Four GPUs on NUMA nodes 0, 0, 1, 1: 0-1 and 2-3 each under one PCIe switch, 1-2 joined by 4 NVLinks.
LINKS = (
    LinkGroup((0, 1), level=TopologyLevel.SINGLE_SWITCH),
    LinkGroup((2, 3), level=TopologyLevel.SINGLE_SWITCH),
    LinkGroup((1, 2), nvlinks=4),
)
# HAMi's scores: one PCIe switch 50; across NUMA nodes 10, plus 4 x 100 for the NVLinks.
SCORES = {(0, 1): 50, (2, 3): 50, (1, 2): 410, (0, 2): 10, (0, 3): 10, (1, 3): 10}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec((NodeSpec(NODE, (GPUSpec("NVIDIA A100-SXM4-80GB"),) * 4, LINKS),))
    with Cluster.up(spec, tmp_path_factory.mktemp("topo") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def uuids(cluster: Cluster) -> list[str]:
    return [g.uuid for g in load_inventory(cluster.inventory_path(NODE)).gpus]


def placed(core: Any, name: str) -> list[str]:
    """The GPUs the pod runs on, once it runs with bind-phase=success."""

    def running() -> Any:
        pod = core.read_namespaced_pod(name, "default")
        annotations = pod.metadata.annotations or {}
        return pod if pod.status.phase == "Running" and annotations.get(BIND_PHASE) == "success" else None

    pod = wait_for(running, 60, f"pod {name} Running with bind-phase=success")
    allocation = decode_pod_allocation(pod.metadata.annotations[DEVICES_ALLOCATED])
    assert pod.spec.node_name == NODE
    return [s.uuid for c in allocation.containers for s in c.devices]


def test_the_node_carries_hamis_pair_scores(cluster: Cluster, core: Any) -> None:
    ids = uuids(cluster)
    text = core.read_node(NODE).metadata.annotations[NODE_PAIR_SCORE]
    table = {s.uuid: s.as_dict() for s in decode_pair_scores(text)}
    assert list(table) == ids
    for (i, j), score in SCORES.items():
        assert table[ids[i]][ids[j]] == table[ids[j]][ids[i]] == score, (i, j)


def test_topology_aware_pods_land_by_link(cluster: Cluster, core: Any) -> None:
    ids = uuids(cluster)
    core.create_namespaced_pod("default", gpu_pod("one-gpu", gpus=1, annotations=TOPOLOGY_AWARE))
    one = placed(core, "one-gpu")
    # One GPU: the least-linked one (0 or 3), keeping the NVLink pair for multi-GPU pods.
    assert len(one) == 1 and one[0] in (ids[0], ids[3])
    core.create_namespaced_pod("default", gpu_pod("two-gpus", gpus=2, annotations=TOPOLOGY_AWARE))
    assert sorted(placed(core, "two-gpus")) == sorted([ids[1], ids[2]])  # the NVLink pair
