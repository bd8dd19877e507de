"""MIG through DRA end to end on `hami-sim` (every component a real process, real protocols): one node in
DRA mode with an A100-SXM4-40GB in MIG mode (no MIG device yet) and one out of MIG mode. hami-node
publishes the MIG GPU's partitions (KEP-4815 counters, NVIDIA's split layout) under its own driver
beside the whole GPU; ResourceClaims of DeviceClass `mig.<driver>` select a profile; the scheduler
stand-in allocates them with the pool's counters; the kubelet stand-in's NodePrepareResources makes
hami-node create the MIG device in the fake backend (its layout file `<inventory>.mig.json`), and the
container gets `NVIDIA_VISIBLE_DEVICES=MIG-...`; deleting the pod and its claim unprepares it, which
destroys the MIG device and frees the counters.

The cases of the issue (part G), in one small cluster: a 1g.5gb claim allocates, is prepared and runs
(then goes, and its instance with it); two 3g.20gb claims take both halves of the GPU and a third stays
unschedulable until one of them goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hami_api import dra
from hami_node.dra.slices import MIG_DEVICE_CLASS_SELF
from hami_node.gpu.fake import MIG_STATE_SUFFIX
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.kubelet.config import CONTAINERS_FILE
from hami_sim.kubelet.runtime import read_containers
from hami_sim.scheduler.config import DEFAULT_PROFILE
from tests.waiting import wait_for

NODE = "mig-dra"
NS = "default"
A100 = "NVIDIA A100-SXM4-40GB"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec(nodes=(NodeSpec(NODE, (GPUSpec(A100, mig=True), GPUSpec(A100)), mode="dra"),))
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def apis(cluster: Cluster) -> Iterator[tuple[Any, Any]]:
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    finally:
        api_client.close()


def claim_body(name: str, profile: str) -> dict[str, Any]:
    selector = f"device.attributes['{dra.DRIVER}'].profile == '{profile}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": MIG_DEVICE_CLASS_SELF,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def pod_body(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": DEFAULT_PROFILE,
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "mig"}]}}],
            "resourceClaims": [{"name": "mig", "resourceClaimName": claim}],
        },
    }


def start(apis: tuple[Any, Any], name: str, profile: str) -> None:
    core, resource = apis
    resource.create_namespaced_resource_claim(NS, claim_body(name, profile))
    core.create_namespaced_pod(NS, pod_body(name, name))


def stop(apis: tuple[Any, Any], name: str) -> None:
    core, resource = apis
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(
        lambda: name not in {p.metadata.name for p in core.list_namespaced_pod(NS).items}, 60, f"{name} gone"
    )
    # The API server answers a Status (the claim is gone at once): not the object the client would decode.
    resource.delete_namespaced_resource_claim(name, NS, _preload_content=False)


def running(core: Any, name: str) -> Any:
    def done() -> Any:
        pod = core.read_namespaced_pod(name, NS)
        return pod if pod.status.phase == "Running" else None

    return wait_for(
        done, 60, f"pod {name} Running", detail=lambda: str(core.read_namespaced_pod(name, NS).status)
    )


def mig_layout(cluster: Cluster) -> list[tuple[str, int, str]]:
    """(profile, start, MIG UUID) of every MIG device the node's fake backend holds."""
    path = Path(str(cluster.inventory_path(NODE)) + MIG_STATE_SUFFIX)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return sorted(
        (str(d["profile"]), int(d["start"]), str(d["uuid"]))
        for gpu in data["gpus"].values()
        for d in gpu.get("devices") or []
    )


def env(cluster: Cluster, pod: Any) -> dict[str, str]:
    containers = read_containers(cluster.kubelet_dir(NODE) / CONTAINERS_FILE)
    return containers.env(pod.metadata.uid, "main")


def test_mig_partitions_are_published_beside_the_whole_gpu_in_the_split_layout(
    cluster: Cluster, apis: tuple[Any, Any]
) -> None:
    _, resource = apis

    def slices() -> list[Any] | None:
        items = resource.list_resource_slice(
            field_selector=f"spec.nodeName={NODE},spec.driver={dra.DRIVER}"
        ).items
        return items if len(items) == 3 else None

    items = wait_for(slices, 60, "the node's three slices")
    counters = [s for s in items if s.spec.shared_counters]
    assert [c.name for c in counters[0].spec.shared_counters] == ["gpu-0-counter-set"]
    devices = sorted(len(s.spec.devices or []) for s in items)
    assert devices == [0, 1, 25]
    whole = next(s for s in items if len(s.spec.devices or []) == 1)
    assert whole.spec.devices[0].name == dra.device_name(1)
    assert {s.spec.pool.resource_slice_count for s in items} == {3}
    assert len({s.spec.pool.generation for s in items}) == 1


def test_a_1g5gb_claim_gets_a_mig_device_that_unprepare_destroys(
    cluster: Cluster, apis: tuple[Any, Any]
) -> None:
    core, _ = apis
    start(apis, "one-g", "1g.5gb")
    pod = running(core, "one-g")
    layout = mig_layout(cluster)
    assert [(p, s) for p, s, _ in layout] == [("1g.5gb", layout[0][1])]
    assert env(cluster, pod)["NVIDIA_VISIBLE_DEVICES"] == layout[0][2]
    assert layout[0][2].startswith("MIG-")
    stop(apis, "one-g")
    wait_for(lambda: mig_layout(cluster) == [], 30, "the MIG device destroyed at Unprepare")


def test_two_3g20gb_claims_take_both_halves_and_a_third_waits_until_one_goes(
    cluster: Cluster, apis: tuple[Any, Any]
) -> None:
    core, _ = apis
    start(apis, "half-a", "3g.20gb")
    start(apis, "half-b", "3g.20gb")
    pods = {n: running(core, n) for n in ("half-a", "half-b")}
    layout = mig_layout(cluster)
    assert [(p, s) for p, s, _ in layout] == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert {env(cluster, p)["NVIDIA_VISIBLE_DEVICES"] for p in pods.values()} == {u for _, _, u in layout}

    start(apis, "half-c", "3g.20gb")

    def unschedulable() -> bool:
        conditions = core.read_namespaced_pod("half-c", NS).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_for(unschedulable, 60, "half-c unschedulable")
    assert len(mig_layout(cluster)) == 2

    stop(apis, "half-a")
    third = running(core, "half-c")
    assert [(p, s) for p, s, _ in mig_layout(cluster)] == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert env(cluster, third)["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    for name in ("half-b", "half-c"):
        stop(apis, name)
    wait_for(lambda: mig_layout(cluster) == [], 30, "every MIG device destroyed")
