"""HAMi v2.10's dynamic MIG end to end on `hami-sim` (every component a real process, real protocols):
one node whose fake inventory has three A100-SXM4-40GB in MIG mode (no MIG device yet) and whose
operating mode is `mig` (the spec's per-node `operating_mode`, `mode: mig` in an inventory file: hami-sim
writes HAMi's `nodeconfig` for the node and starts its hami-node with `--config-file`). Pods opting in
with `nvidia.com/vgpu-mode: mig` go webhook -> extender (HAMi's profile and placement pick, written to
`hami.io/vgpu-mig-allocations`) -> bind -> the kubelet stand-in's Allocate, where hami-node creates the
reserved MIG instance in the fake backend (its layout file `<inventory>.mig.json`), records its runtime
identity on the pod and answers `NVIDIA_VISIBLE_DEVICES=MIG-...`. Deleting a pod: the reconciler (every
5 s) destroys its instance.

The issue's cases (part H), in one small cluster: 4000 MiB takes 1g.5gb (4864 MiB); 10000 MiB takes
3g.20gb (2g.10gb's 9856 MiB is short); 50 % (20480 MiB) takes 7g.40gb, a whole GPU (3g.20gb's 19968 MiB
is short, as HAMi decides).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_api.mig_alloc import MIG_ALLOCATIONS, decode_mig_allocations
from hami_node.gpu.fake import MIG_STATE_SUFFIX
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.kubelet.config import CONTAINERS_FILE
from hami_sim.kubelet.runtime import read_containers
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

NODE = "mig-hami"
NS = "default"
A100 = "NVIDIA A100-SXM4-40GB"
MIG_MODE = {"nvidia.com/vgpu-mode": "mig"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("mig")
    # The node's own operating mode: hami-sim writes HAMi's nodeconfig (operatingmode: mig) for it.
    spec = ClusterSpec(nodes=(NodeSpec(NODE, (GPUSpec(A100, mig=True),) * 3, operating_mode="mig"),))
    with Cluster.up(spec, root / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def mig_layout(cluster: Cluster) -> list[tuple[str, str, int, str]]:
    """(GPU UUID, profile, start, MIG UUID) of every MIG device the node's fake backend holds."""
    path = Path(str(cluster.inventory_path(NODE)) + MIG_STATE_SUFFIX)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return sorted(
        (str(gpu), str(d["profile"]), int(d["start"]), str(d["uuid"]))
        for gpu, state in data["gpus"].items()
        for d in state.get("devices") or []
    )


def running(core: Any, name: str) -> Any:
    def done() -> Any:
        pod = core.read_namespaced_pod(name, NS)
        return pod if pod.status.phase == "Running" else None

    return wait_for(
        done, 60, f"pod {name} Running", detail=lambda: str(core.read_namespaced_pod(name, NS).status)
    )


def visible_devices(cluster: Cluster, pod: Any) -> str:
    containers = read_containers(cluster.kubelet_dir(NODE) / CONTAINERS_FILE)
    return containers.env(pod.metadata.uid, "main")["NVIDIA_VISIBLE_DEVICES"]


def test_mig_pods_get_the_profile_hami_picks_created_at_allocate_and_destroyed_after_them(
    cluster: Cluster, core: Any
) -> None:
    asks: dict[str, dict[str, Any]] = {
        "four-gb": {"gpumem": 4000},
        "ten-gb": {"gpumem": 10000},
        "half": {"gpumem_percentage": 50},
    }
    for name, ask in asks.items():
        core.create_namespaced_pod(NS, gpu_pod(name, gpus=1, annotations=MIG_MODE, **ask))
    pods = {name: running(core, name) for name in asks}

    layout = mig_layout(cluster)
    by_uuid = {uuid: (gpu, profile) for gpu, profile, _, uuid in layout}
    profiles = {}
    for name, pod in pods.items():
        uuid = visible_devices(cluster, pod)
        assert uuid.startswith("MIG-") and uuid in by_uuid, (name, uuid, layout)
        profiles[name] = by_uuid[uuid][1]
        (entry,) = decode_mig_allocations(pod.metadata.annotations[MIG_ALLOCATIONS])
        assert (entry.mig_uuid, entry.gpu_uuid, entry.profile) == (uuid, *by_uuid[uuid])
    assert profiles == {"four-gb": "1g.5gb", "ten-gb": "3g.20gb", "half": "7g.40gb"}
    assert len(layout) == 3

    core.delete_namespaced_pod("ten-gb", NS, grace_period_seconds=0)
    wait_for(
        lambda: sorted(p for _, p, _, _ in mig_layout(cluster)) == ["1g.5gb", "7g.40gb"],
        30,
        "the reconciler to destroy ten-gb's 3g.20gb",
        detail=lambda: str(mig_layout(cluster)),
    )
    for name in ("four-gb", "half"):
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: mig_layout(cluster) == [], 30, "every MIG instance destroyed")
