"""`hami-node` in NVIDIA's modes (`--config-file` naming NVIDIA's config file v1) as a separate process,
with the fake GPU backend, the kubelet stand-in and the local API server, over real sockets: one device
plugin per NVIDIA resource on NVIDIA's socket names, Allocate answered from kubelet's IDs (no pod
annotation), NVIDIA's error for two replicas with failRequestsGreaterThanOne, health fanned out to the
replicas, GFD's labels on the Node, and start-up refusals (hami-core slicing beside NVIDIA's sharing,
an invalid single layout), and the cdi-cri strategy with NVIDIA's CDI spec written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_node.cdi import SPEC_FILE_NAME
from hami_node.gpu.inventory import generate_inventory
from tests.apiserver_util import create_and_bind
from tests.builders import container
from tests.cdi_util import spec_problems
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import NAMESPACE, NodeDaemonProcess, NodeRig, make_rig, run_daemon_once
from tests.waiting import wait_node

NODE = "nv-node-1"
A100 = "NVIDIA A100-SXM4-40GB"
SHARED = "nvidia.com/gpu.shared"
MIG_1G = "nvidia.com/mig-1g.5gb"
MIG_3G = "nvidia.com/mig-3g.20gb"

TIME_SLICING = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
"""A user's NVIDIA config file, unchanged: MIG strategy mixed, whole GPUs time-sliced 4 ways."""

GPUS: dict[str, Any] = {
    "gpus": [
        {"uuid": "GPU-aaaa", "model": "Tesla T4", "memory": 15360},
        {
            "uuid": "GPU-bbbb",
            "model": A100,
            "memory": 40960,
            "mig": {
                "enabled": True,
                "devices": [{"profile": "3g.20gb", "start": 4}, {"profile": "1g.5gb", "start": 0}],
            },
        },
    ]
}


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    for r in make_rig(NODE, apiserver.kubeconfig, generate_inventory(1, seed=NODE)):
        r.inventory_path.write_text(yaml.safe_dump(GPUS))
        yield r


def config_file(rig: NodeRig, text: str) -> Path:
    path = rig.base / "inv" / "nvidia.yaml"
    path.write_text(text)
    return path


def start(rig: NodeRig, text: str) -> None:
    args = [*rig.base_args(), "--config-file", str(config_file(rig, text))]
    rig.daemons.append(NodeDaemonProcess(args, rig.base / "logs" / f"hami-node-{len(rig.daemons)}.log"))


def resource_ids(rig: NodeRig, name: str, count: int, timeout: float = 30.0) -> list[str]:
    def ready(snapshot: Any) -> bool:
        r = snapshot.resource(name)
        return r is not None and r.connected and r.allocatable == count == r.capacity

    try:
        snapshot = rig.kubelet.wait_for_devices(ready, timeout)
    except TimeoutError:
        raise AssertionError(f"{name} not served with {count} devices\n{rig.daemon.describe()}") from None
    resource = snapshot.resource(name)
    assert resource is not None
    return sorted(d.ID for d in resource.devices)


def test_time_slicing_and_mixed_mig_serve_nvidias_resources_and_allocate_from_kubelets_ids(
    rig: NodeRig, core_v1: Any
) -> None:
    start(rig, TIME_SLICING)
    assert resource_ids(rig, SHARED, 4) == [f"GPU-aaaa::{i}" for i in range(4)]
    mig_ids = resource_ids(rig, MIG_1G, 1) + resource_ids(rig, MIG_3G, 1)
    assert all(i.startswith("MIG-") for i in mig_ids)
    sockets = sorted(p.name for p in rig.kubelet_dir.glob("nvidia-*.sock"))
    assert sockets == ["nvidia-gpu.shared.sock", "nvidia-mig-1g.5gb.sock", "nvidia-mig-3g.20gb.sock"]
    assert not (rig.kubelet_dir / "hami-nvidia-gpu.sock").exists()

    # A pod kube-scheduler placed (no HAMi annotation): Allocate answers from kubelet's IDs.
    uid = create_and_bind(core_v1, "ts", NODE, [container("main", limits={SHARED: "1"})])
    result = rig.kubelet.wait_for_pod(NAMESPACE, "ts", timeout=20)
    assert result.admitted, (result, rig.daemon.describe())
    (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
    assert entry.resource_name == SHARED and entry.all_device_ids[0].startswith("GPU-aaaa::")
    assert dict(entry.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}

    uid = create_and_bind(core_v1, "mig", NODE, [container("main", limits={MIG_1G: "1"})])
    result = rig.kubelet.wait_for_pod(NAMESPACE, "mig", timeout=20)
    assert result.admitted, (result, rig.daemon.describe())
    (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
    (mig_id,) = resource_ids(rig, MIG_1G, 1)
    assert dict(entry.response.envs) == {"NVIDIA_VISIBLE_DEVICES": mig_id}

    # Two replicas with failRequestsGreaterThanOne: NVIDIA's text in UnexpectedAdmissionError.
    create_and_bind(core_v1, "two", NODE, [container("main", limits={SHARED: "2"})])
    result = rig.kubelet.wait_for_pod(NAMESPACE, "two", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    message = core_v1.read_namespaced_pod("two", NAMESPACE).status.message
    assert (
        'invalid allocation request for "nvidia.com/gpu.shared": invalid request: maximum request size '
        "for shared resources is 1; found 2"
    ) in message, message

    # GFD's labels on the Node; no HAMi inventory annotation.
    node = wait_node(
        core_v1, NODE, lambda n: (n.metadata.labels or {}).get("nvidia.com/gpu.replicas") == "4", timeout=20
    )
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"  # renameByDefault: no -SHARED (GFD)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.5gb.count"] == "1" and labels["nvidia.com/mig-3g.20gb.count"] == "1"
    assert "hami.io/node-nvidia-register" not in (node.metadata.annotations or {})


def test_an_xid_on_a_gpu_makes_all_its_replicas_unhealthy_and_leaves_the_other_gpus_mig_devices(
    rig: NodeRig, core_v1: Any
) -> None:
    start(rig, TIME_SLICING)
    resource_ids(rig, SHARED, 4)
    resource_ids(rig, MIG_1G, 1)  # every plugin registered before the fault
    xid = {**GPUS, "events": [{"id": "x1", "kind": "xid", "gpu": "GPU-aaaa", "xid": 79}]}
    rig.inventory_path.write_text(yaml.safe_dump(xid))

    def all_down(snapshot: Any) -> bool:
        r = snapshot.resource(SHARED)
        return r is not None and len(r.unhealthy) == 4

    snapshot = rig.kubelet.wait_for_devices(all_down, 20.0)
    mig = snapshot.resource(MIG_1G)
    assert mig is not None and mig.allocatable == 1  # the A100's MIG devices stay healthy


def test_hami_core_slicing_beside_nvidias_sharing_is_refused_with_which_to_choose(tmp_path: Path) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(TIME_SLICING)
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(yaml.safe_dump(GPUS))
    result = run_daemon_once(
        "--node-name", NODE, "--gpu-backend", "fake", "--fake-inventory", str(inventory),
        "--config-file", str(path), "--device-split-count", "10",
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "would share the same GPUs two ways; choose one" in result.stderr
    assert "device_split_count (flag --device-split-count)" in result.stderr
    assert "Traceback" not in result.stderr


CDI_CRI = """\
version: v1
flags:
  migStrategy: mixed
  plugin:
    deviceListStrategy: cdi-cri
"""
"""A user's NVIDIA config file with the cdi-cri device-list strategy: whole GPUs and MIG devices as CDI
devices in the CRI response."""


def test_cdi_cri_hands_kubelet_cdi_devices_the_written_nvidia_spec_defines(
    rig: NodeRig, core_v1: Any
) -> None:
    spec_dir = rig.base / "cdi"
    args = [
        *rig.base_args(),
        "--config-file",
        str(config_file(rig, CDI_CRI)),
        "--cdi-spec-dir",
        str(spec_dir),
    ]
    rig.daemons.append(NodeDaemonProcess(args, rig.base / "logs" / "hami-node-cdi.log"))
    assert resource_ids(rig, "nvidia.com/gpu", 1) == ["GPU-aaaa"]
    (mig_id,) = resource_ids(rig, MIG_1G, 1)

    spec = json.loads((spec_dir / SPEC_FILE_NAME).read_bytes())
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu" and spec_problems(spec) == []
    defined = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}

    for name, resource, device_id in (("whole", "nvidia.com/gpu", "GPU-aaaa"), ("mig", MIG_1G, mig_id)):
        uid = create_and_bind(core_v1, name, NODE, [container("main", limits={resource: "1"})])
        result = rig.kubelet.wait_for_pod(NAMESPACE, name, timeout=20)
        assert result.admitted, (result, rig.daemon.describe())
        (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
        names = [d.name for d in entry.response.cdi_devices]
        assert names == [f"k8s.device-plugin.nvidia.com/gpu={device_id}"]
        assert set(names) <= defined
        assert "NVIDIA_VISIBLE_DEVICES" not in dict(entry.response.envs)
    mig_nodes = next(d for d in spec["devices"] if d["name"] == mig_id)["containerEdits"]["deviceNodes"]
    assert mig_nodes[0]["path"] == "/dev/nvidia1"
    assert (
        all(n["path"].startswith("/dev/nvidia-caps/nvidia-cap") for n in mig_nodes[1:])
        and len(mig_nodes) == 3
    )
