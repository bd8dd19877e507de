"""End to end on `hami-sim`: a burst of 80 one-GPU pods (1000 to 1790 MiB, each its own size), created
through the official client as a user would and without a schedulerName, onto one node with 8 GPUs split
10 ways (exactly 80 slots). The node's daemon reads kubelet's PodResources API, so hami-control binds
pods asking as many GPUs there together, and the daemon answers each Allocate with the pod kubelet
admits. Every pod runs with `bind-phase=success`, kubelet's checkpoint records for it the GPU its
annotation names, its container sees that GPU with its own memory limit and its own cache directory
(the Allocate answer was built for it, not for another pod asking one GPU too), no GPU holds more than
its 10 slots, its memory or its cores, and the API writes per scheduled pod stay at the Binding plus the
node daemon's one bind-phase patch. The time from the first create to the last pod Running is printed
(bench/e2e.py --burst measures it; on the 2-core development VM with other sessions running it is not
asserted).

The writes come from the API server stand-in's request log (`GET /hami-sim/requests`, read through the
official client's `call_api`). Per burst pod we count, by verb, resource and subresource:
- `create pods` (the user's create, reported, not part of the bound),
- `create pods/binding` (hami-control's bind: the GPU choice travels in the Binding's annotations),
- `patch|update pods` (the pod object itself: hami-node's bind-phase patch; anything else would show),
and assert bindings + pod patches/updates <= 2 per pod. Writes to `pods/status` (the kubelet stand-in
setting Running), events and node writes (hami-control's node lock) are reported but not bounded.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_POD_IDENTIFICATION,
    NODE_REGISTER,
    decode_node_register,
    decode_pod_allocation,
)
from hami_node.plugin.api.constants import CHECKPOINT_FILE
from hami_sim.cluster import Cluster, ClusterSpec
from hami_sim.kubelet.checkpoint import read_checkpoint
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

PODS = 80
GPUS = 8
SPLIT = 10
POD_MEMORY_MIB = 1000
"""The first pod's; pod i asks 10 MiB more than pod i - 1."""
PREFIX = "burst-"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec.uniform(1, GPUS, split=SPLIT)
    with Cluster.up(spec, tmp_path_factory.mktemp("burst") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def request_log(core: Any) -> list[dict[str, Any]]:
    """The API server stand-in's latest requests (its debug path, through the official client)."""
    api_client = core.api_client
    url = api_client.configuration.host + "/hami-sim/requests?limit=10000"
    response = api_client.call_api("GET", url, header_params={"Accept": "application/json"})
    assert response.status == 200, response.status
    body = json.loads(response.read())
    items: list[dict[str, Any]] = body["items"]
    return items


def test_a_burst_of_80_pods_fills_an_8_gpu_node(cluster: Cluster, core: Any) -> None:
    names = [f"{PREFIX}{i:02d}" for i in range(PODS)]
    started = time.monotonic()
    for i, name in enumerate(names):
        core.create_namespaced_pod("default", gpu_pod(name, gpumem=POD_MEMORY_MIB + 10 * i))
    created = time.monotonic() - started

    def all_running() -> list[Any] | None:
        pods = [p for p in core.list_namespaced_pod("default").items if p.metadata.name.startswith(PREFIX)]
        done = len(pods) == PODS and all(
            p.status.phase == "Running" and (p.metadata.annotations or {}).get(BIND_PHASE) == "success"
            for p in pods
        )
        return pods if done else None

    pods = wait_for(all_running, 120, f"{PODS} pods Running with bind-phase=success", interval=0.05)
    elapsed = time.monotonic() - started
    print(
        f"\nburst: {PODS} pods created in {created:.2f} s, "
        f"all Running (bind-phase=success) after {elapsed:.2f} s"
    )

    # Every GPU within its slots, memory and cores, as the node registered them.
    (node,) = core.list_node().items
    assert node.metadata.annotations[NODE_POD_IDENTIFICATION] == "podresources"
    registered = {g.id: g for g in decode_node_register(node.metadata.annotations[NODE_REGISTER])}
    assert len(registered) == GPUS
    checkpoint = read_checkpoint(cluster.kubelet_dir(node.metadata.name) / CHECKPOINT_FILE)
    used: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for pod in pods:
        name = pod.metadata.name
        assert pod.spec.scheduler_name == "hami-scheduler"
        assert pod.spec.node_name == node.metadata.name
        allocation = decode_pod_allocation(pod.metadata.annotations[DEVICES_ALLOCATED], DEVICES_ALLOCATED)
        slices = [s for c in allocation.containers for s in c.devices]
        memory = POD_MEMORY_MIB + 10 * names.index(name)
        assert len(slices) == 1 and slices[0].usedmem == memory, (name, slices)
        # kubelet's record = what the container sees = what the scheduler accounted, for this very pod
        (record,) = checkpoint.for_container(pod.metadata.uid, "main")
        assert [i.rsplit("-", 1)[0] for i in record.all_device_ids] == [slices[0].uuid], name
        envs = record.response.envs
        assert (envs["NVIDIA_VISIBLE_DEVICES"], envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
            slices[0].uuid,
            f"{memory}m",
        ), name
        assert any(
            m.host_path.endswith(f"/containers/{pod.metadata.uid}_main") for m in record.response.mounts
        )
        for s in slices:
            assert s.uuid in registered, (pod.metadata.name, s.uuid)
            used[s.uuid][0] += 1
            used[s.uuid][1] += s.usedmem
            used[s.uuid][2] += s.usedcores
    for uuid, (slots, mem, cores) in used.items():
        gpu = registered[uuid]
        assert slots <= gpu.count and mem <= gpu.devmem and cores <= gpu.devcore, (uuid, slots, mem, cores)
    assert sum(slots for slots, _m, _c in used.values()) == PODS

    # API writes per scheduled pod, from the API server's request log.
    ours = set(names)
    writes: collections.Counter[tuple[str, str]] = collections.Counter()
    others: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for rec in request_log(core):
        verb, resource, sub, name = rec["verb"], rec["resource"], rec["subresource"], rec["name"]
        if verb not in ("create", "update", "patch", "delete"):
            continue
        # A create's name is in its body, not its path: the log has "" (only this test creates pods).
        if resource == "pods" and (name in ours or (verb == "create" and not name and not sub)):
            writes[(verb, sub)] += 1
        else:
            others[(verb, resource, sub)] += 1
    pod_creates = writes[("create", "")]
    bindings = writes[("create", "binding")]
    pod_patches = writes[("patch", "")] + writes[("update", "")]
    status_writes = writes[("patch", "status")] + writes[("update", "status")]
    per_pod = (bindings + pod_patches) / PODS
    print(
        f"burst: writes per pod: {per_pod:.2f} (bindings {bindings}, pod patches/updates {pod_patches}); "
        f"also pod creates {pod_creates}, pods/status writes {status_writes}; other writes {dict(others)}"
    )
    assert pod_creates == PODS and bindings == PODS, writes  # the log covers the whole burst
    assert per_pod <= 2, writes
