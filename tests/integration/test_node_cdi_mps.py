"""`hami-node` as a separate process (fake GPUs, kubelet stand-in, local API server) for issue 13, items 5 and
6: with a cdi-* device-list strategy the daemon writes a CDI spec that defines every name Allocate returns
(and keeps it current across restarts, removing it once no CDI strategy is configured); operating mode mps
connects containers to an MPS control daemon, or refuses to pretend it does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hami_node.cdi import CDI_KIND, SPEC_FILE_NAME
from hami_node.gpu.inventory import generate_inventory, write_inventory
from tests.apiserver_util import create_and_bind
from tests.builders import allocation, container
from tests.cdi_util import spec_problems
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import NAMESPACE, NodeRig, bind_phase, make_rig, node_inventory, run_daemon_once
from tests.waiting import wait_node, wait_pod

NODE = "gpu-node-cdi"


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    yield from make_rig(NODE, apiserver.kubeconfig, generate_inventory(3, seed=NODE))


def spec_devices(path: Path) -> list[tuple[str, str]]:
    spec = json.loads(path.read_text())
    assert spec_problems(spec) == [], spec
    assert spec["kind"] == CDI_KIND
    return [(d["name"], d["containerEdits"]["deviceNodes"][0]["path"]) for d in spec["devices"]]


def test_cdi_strategy_writes_a_spec_defining_every_name_allocate_returns(rig: NodeRig, core_v1: Any) -> None:
    spec_dir = rig.base / "cdi"
    spec_path = spec_dir / SPEC_FILE_NAME
    cdi = ("--device-list-strategy", "cdi-cri,cdi-annotations", "--cdi-spec-dir", str(spec_dir))
    rig.start_daemon(*cdi)
    gpus = rig.inventory.gpus
    assert spec_devices(spec_path) == [(g.uuid, f"/dev/nvidia{g.minor}") for g in gpus]

    choice = allocation([(gpus[0].uuid, 2000, 20), (gpus[2].uuid, 2000, 20)])
    uid = create_and_bind(core_v1, "cdi", NODE, [container("main", gpus=2)], choice)
    result = rig.kubelet.wait_for_pod(NAMESPACE, "cdi", timeout=20)
    assert result.admitted, result.message
    (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
    defined = {f"{CDI_KIND}={name}" for name, _ in spec_devices(spec_path)}
    names = [d.name for d in entry.response.cdi_devices]
    assert names == [f"{CDI_KIND}={gpus[0].uuid}", f"{CDI_KIND}={gpus[2].uuid}"]
    assert set(names) <= defined
    (annotated,) = entry.response.annotations.values()
    assert set(annotated.split(",")) == set(names)
    # HAMi-core's per-container edits stay in the response (kubelet passes them with every strategy).
    assert entry.response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert "NVIDIA_VISIBLE_DEVICES" not in entry.response.envs

    # Stopped: the spec stays (kubelet restarts admitted containers without Allocate).
    rig.daemon.stop()
    assert spec_path.exists()
    # Restarted after a GPU went away: the spec no longer defines it.
    rig.write_inventory(replace(rig.inventory, gpus=gpus[:2], links=()))
    rig.start_daemon(*cdi)
    assert spec_devices(spec_path) == [(g.uuid, f"/dev/nvidia{g.minor}") for g in gpus[:2]]
    rig.daemon.stop()
    # Restarted without a CDI strategy: the spec it left is removed, other files are not.
    (spec_dir / "vendor.yaml").write_text("cdiVersion: 0.3.0\n")
    rig.start_daemon("--cdi-spec-dir", str(spec_dir))
    assert sorted(p.name for p in spec_dir.iterdir()) == ["vendor.yaml"]


def test_cdi_spec_dir_that_cannot_be_written_stops_start_up_naming_it(
    apiserver: ApiServerHandle, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    inventory = tmp_path / "gpus.yaml"
    write_inventory(inventory, generate_inventory(1, seed="x"))
    result = run_daemon_once(
        "--node-name", "n", "--gpu-backend", "fake", "--fake-inventory", str(inventory),
        "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(tmp_path / "k"),
        "--device-list-strategy", "cdi-cri", "--cdi-spec-dir", str(blocker / "cdi"),
    )  # fmt: skip
    assert result.returncode == 2, result
    assert str(blocker / "cdi") in result.stderr and "CDI spec" in result.stderr, result.stderr


def test_mps_mode_without_an_mps_root_exits_2_naming_the_setting() -> None:
    result = run_daemon_once("--node-name", "n", "--operating-mode", "mps")
    assert result.returncode == 2
    assert "operating mode mps" in result.stderr and "--mps-root" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_mps_mode_connects_containers_to_the_mps_daemon_only_while_it_runs(
    rig: NodeRig, core_v1: Any
) -> None:
    root = rig.base / "mps"
    (root / "nvidia.com/gpu/pipe").mkdir(parents=True)
    (root / "shm").mkdir()
    rig.start_daemon(
        "--operating-mode", "mps", "--mps-root", str(root), "--cdi-annotation-prefix", "cdi.example.com/"
    )
    # The setting that changes nothing is named at start-up.
    assert "cdi-annotation-prefix: the CDI annotation prefix has no effect" in rig.daemon.log_text()
    node = wait_node(core_v1, NODE, lambda n: node_inventory(n) is not None)
    assert {g.mode for g in node_inventory(node) or ()} == {"mps"}

    gpu = rig.uuids[1]
    choice = allocation([(gpu, 3000, 30)])
    create_and_bind(core_v1, "early", NODE, [container("main", gpus=1)], choice)
    result = rig.kubelet.wait_for_pod(NAMESPACE, "early", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    message = core_v1.read_namespaced_pod("early", NAMESPACE).status.message
    assert "the MPS control daemon for nvidia.com/gpu is not running" in message, message
    assert str(root / "nvidia.com/gpu/.started") in message

    (root / "nvidia.com/gpu/.started").write_text("")  # what NVIDIA's mps-control-daemon writes
    uid = create_and_bind(core_v1, "shared", NODE, [container("main", gpus=1)], choice)
    assert rig.kubelet.wait_for_pod(NAMESPACE, "shared", timeout=20).admitted
    wait_pod(core_v1, "shared", lambda p: bind_phase(p) == "success")
    (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
    assert entry.response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert entry.response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"  # HAMi-core's limits as well
    mounts = {(m.container_path, m.host_path) for m in entry.response.mounts}
    assert ("/mps/nvidia.com/gpu/pipe", f"{root}/nvidia.com/gpu/pipe") in mounts
    assert ("/dev/shm", f"{root}/shm") in mounts
