"""`hami-node` as a separate process, with the fake GPU backend, the kubelet stand-in and the local API
server, all over real sockets: registration and the Node's inventory, Allocate for single- and
multi-container pods, Xid -> Unhealthy -> recovery, NVML failure -> fencing -> recovery, kubelet
restart, the API server going away and coming back, start-up errors, SIGTERM, and an Allocate with no
pod to match."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_control.binder import binding_annotations
from hami_node.gpu.inventory import Inventory, NvmlMode, generate_inventory, write_inventory
from hami_sim.kubelet import read_checkpoint
from tests.apiserver_util import create_and_bind
from tests.builders import allocation, container
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import (
    NAMESPACE,
    REPO_ROOT,
    RESOURCE,
    NodeRig,
    bind_phase,
    daemon_env,
    healthy_ids,
    inventory_health,
    make_rig,
    node_inventory,
    node_rig,
    pod_patches,
    run_daemon_once,
    unhealthy_ids,
    virtual_ids,
)
from tests.waiting import wait_for, wait_node, wait_pod

NODE = "gpu-node-1"


def node_gpus() -> Inventory:
    """Three A100s (NUMA 0, 0, 1) and a T4 whose NUMA node is unknown and whose name lacks "NVIDIA"."""
    inventory = generate_inventory(4, seed=NODE)
    t4 = replace(inventory.gpus[3], model="Tesla T4", memory_mib=15360, numa_node=None)
    return replace(inventory, gpus=(*inventory.gpus[:3], t4))


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    yield from make_rig(NODE, apiserver.kubeconfig, node_gpus())


def node_rv(core_v1: Any) -> str:
    return str(core_v1.read_node(NODE).metadata.resource_version)


def wait_registered_annotation(rig: NodeRig, core_v1: Any, timeout: float = 10.0) -> Any:
    return wait_node(
        core_v1, NODE, lambda n: inventory_health(n) == dict.fromkeys(rig.uuids, True), timeout=timeout
    )


# --- 1. registration ---------------------------------------------------------------------------------


def test_registration_devices_node_resources_and_inventory_annotation(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon()
    resource = rig.kubelet.snapshot().resource(RESOURCE)
    assert resource is not None and resource.connected and resource.registrations == 1
    assert [d.ID for d in resource.devices] == [f"{u}-{i}" for u in rig.uuids for i in range(10)]
    assert resource.healthy == {f"{u}-{i}" for u in rig.uuids for i in range(10)}
    assert not resource.unhealthy
    assert all(not d.HasField("topology") for d in resource.devices)  # NUMA topology is off by default
    assert resource.options is not None and resource.options.get_preferred_allocation_available
    assert not resource.options.pre_start_required

    node = wait_node(core_v1, NODE, lambda n: (n.status.allocatable or {}).get(RESOURCE) == "40")
    assert node.status.capacity[RESOURCE] == "40"
    node = wait_node(core_v1, NODE, lambda n: node_inventory(n) is not None)
    gpus = rig.inventory.gpus
    assert node_inventory(node) == tuple(
        GPUInfo(id=g.uuid, index=g.index, count=10, devmem=m, devcore=100, type=t, numa=numa,
                mode="hami-core", health=True)
        for g, m, t, numa in zip(
            gpus,
            [81920, 81920, 81920, 15360],
            ["NVIDIA A100-SXM4-80GB"] * 3 + ["NVIDIA-Tesla T4"],
            [0, 0, 1, 0],  # 4 GPUs over 2 NUMA nodes: 0, 0, 1, 1; the T4's is unknown and reads 0
            strict=True,
        )
    )  # fmt: skip
    # The annotation is HAMi v2.10's JSON form, byte for byte what hami_api encodes.
    text = node.metadata.annotations[ann.NODE_REGISTER]
    assert text == ann.encode_node_register(node_inventory(node) or ())
    assert text.startswith('[{"id":"GPU-')


# --- 2. Allocate, one container ------------------------------------------------------------------------


def test_single_container_pod_gets_hami_envs_and_mounts(
    rig: NodeRig, apiserver: ApiServerHandle, core_v1: Any
) -> None:
    rig.start_daemon()
    gpu = rig.uuids[1]
    choice = allocation([(gpu, 4000, 30)])
    uid = create_and_bind(core_v1, "one", NODE, [container("main", gpus=1)], choice)
    result = rig.kubelet.wait_for_pod(NAMESPACE, "one", timeout=20)
    assert result.admitted, result.message
    pod = wait_pod(core_v1, "one", lambda p: bind_phase(p) == "success")
    assert pod.status.phase == "Running"

    hook = str(rig.hook_path)
    (entry,) = rig.kubelet.checkpoint().for_container(uid, "main")
    assert entry.resource_name == RESOURCE
    # GetPreferredAllocation steered kubelet to a virtual device of the scheduled GPU.
    assert len(entry.all_device_ids) == 1 and entry.all_device_ids[0] in virtual_ids(gpu, 10)
    envs = dict(entry.response.envs)
    cache = envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    prefix = f"{hook}/vgpu/"
    assert cache.startswith(prefix) and cache.endswith(".cache") and "/" not in cache[len(prefix) :]
    mounts = [(m.container_path, m.host_path, m.read_only) for m in entry.response.mounts]
    assert mounts == [
        (f"{hook}/vgpu/libvgpu.so", f"{hook}/vgpu/libvgpu.so", True),
        (f"{hook}/vgpu", f"{hook}/vgpu/containers/{uid}_main", False),
        ("/tmp/vgpulock", "/tmp/vgpulock", False),
        ("/etc/ld.so.preload", f"{hook}/vgpu/ld.so.preload", True),
    ]
    assert not entry.response.annotations and not entry.response.cdi_devices
    # The container's cache directory exists on the host, mode 0777, as HAMi makes it.
    cache_dir = rig.hook_path / "vgpu" / "containers" / f"{uid}_main"
    assert cache_dir.is_dir() and cache_dir.stat().st_mode & 0o777 == 0o777
    assert len(pod_patches(apiserver.runner, "one")) == 1


# --- 3. Allocate, init + several containers -------------------------------------------------------------


def test_multi_container_pod_gets_each_container_its_slices_and_one_patch(
    rig: NodeRig, apiserver: ApiServerHandle, core_v1: Any
) -> None:
    rig.start_daemon()
    g0, _, g2, g3 = rig.uuids
    # Entries: init containers first, then the app containers in order; "nogpu" has an empty entry.
    # c1 is on the init container's GPU: kubelet makes it reuse that device (the scheduler's fit knows).
    choice = allocation(
        [(g0, 2000, 10)],  # init "prepare"
        [(g0, 3000, 20)],  # "c1"
        [],  # "nogpu"
        [(g2, 1000, 30), (g3, 5000, 30)],  # "c2", two GPUs
    )
    uid = create_and_bind(
        core_v1,
        "multi",
        NODE,
        [
            container("c1", gpus=1),
            container("nogpu"),
            container("c2", gpus=2, env={"CUDA_DISABLE_CONTROL": "true"}),
        ],
        choice,
        init=[container("prepare", gpus=1)],
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "multi", timeout=20)
    assert result.admitted, result.message
    pod = wait_pod(core_v1, "multi", lambda p: bind_phase(p) == "success")
    assert pod.status.phase == "Running"

    checkpoint = rig.kubelet.checkpoint()
    assert sorted(e.container_name for e in checkpoint.entries if e.pod_uid == uid) == ["c1", "c2", "prepare"]
    expected = {
        "prepare": (g0, {"CUDA_DEVICE_MEMORY_LIMIT_0": "2000m", "CUDA_DEVICE_SM_LIMIT": "10"}),
        "c1": (g0, {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "20"}),
        "c2": (
            f"{g2},{g3}",
            {
                "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
                "CUDA_DEVICE_MEMORY_LIMIT_1": "5000m",
                "CUDA_DEVICE_SM_LIMIT": "30",
            },
        ),
    }
    caches = set()
    for name, (visible, limits) in expected.items():
        envs = checkpoint.container_envs(uid, name)
        caches.add(envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE"))
        assert envs == {"NVIDIA_VISIBLE_DEVICES": visible, **limits, "LIBCUDA_LOG_LEVEL": "1"}, name
        (entry,) = checkpoint.for_container(uid, name)
        mounts = {m.container_path: m.host_path for m in entry.response.mounts}
        assert mounts[f"{rig.hook_path}/vgpu"].endswith(f"/{uid}_{name}")
        # CUDA_DISABLE_CONTROL=true in the container: no ld.so.preload, as HAMi.
        assert ("/etc/ld.so.preload" in mounts) == (name != "c2"), name
    assert len(caches) == 3  # each container its own shared-cache file
    # Kubelet's own choice of virtual devices: every container's devices are on its scheduled GPUs,
    # c1 reusing the finished init container's device, as kubelet does.
    held = {name: checkpoint.for_container(uid, name)[0].all_device_ids for name in expected}
    assert {name: {i.rsplit("-", 1)[0] for i in ids} for name, ids in held.items()} == {
        "prepare": {g0},
        "c1": {g0},
        "c2": {g2, g3},
    }
    assert held["c1"] == held["prepare"]

    patches = pod_patches(apiserver.runner, "multi")
    assert len(patches) == 1, patches
    assert apiserver.runner.counters().get(("patch", "pods", ""), 0) == 1


def test_a_container_kubelet_hands_a_gpu_its_pod_was_not_accounted_for_is_refused_with_an_event(
    rig: NodeRig, core_v1: Any
) -> None:
    """HAMi's scheduler would put c1 on g1 beside an init container on g0; kubelet reuses the init's
    device on g0 for c1, and c1 asks more than the init held there: refused, never a silent swap."""
    rig.start_daemon()
    g0, g1, _, _ = rig.uuids
    choice = allocation([(g0, 2000, 10)], [(g1, 3000, 20)])
    create_and_bind(
        core_v1,
        "swap",
        NODE,
        [container("c1", gpus=1)],
        choice,
        init=[container("prepare", gpus=1)],
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "swap", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert f"pod {NAMESPACE}/swap, container 'c1': kubelet chose device(s) on GPU(s) {g0}" in result.message
    assert f"the scheduler placed the container on {g1}" in result.message
    pod = wait_pod(core_v1, "swap", lambda p: bind_phase(p) == "failed")

    def mismatch_events() -> list[Any]:
        events = core_v1.list_namespaced_event(NAMESPACE, field_selector="involvedObject.name=swap").items
        return [e for e in events if e.reason == "AllocateGPUMismatch"]

    # The event recorder writes on its own, not in step with the bind-phase patch.
    wait_for(lambda: bool(mismatch_events()), 10, "the AllocateGPUMismatch Event")
    mismatch = mismatch_events()
    assert len(mismatch) == 1 and mismatch[0].type == "Warning"
    assert g0 in mismatch[0].message and g1 in mismatch[0].message and "'c1'" in mismatch[0].message
    assert mismatch[0].source.component == "hami-node" and mismatch[0].involved_object.uid == pod.metadata.uid


def test_an_app_container_kubelet_gives_another_init_device_of_its_pod_moves_there_and_is_recorded(
    rig: NodeRig, core_v1: Any
) -> None:
    """An init container on g0 and g1, an app container planned on g0: kubelet takes either of the
    two reusable devices (Go map order). Whichever it takes, the container sees that GPU and the pod's
    annotation says so; a move gets a Normal event. Several pods, so both outcomes show."""
    rig.start_daemon()
    g0, g1, _, _ = rig.uuids
    choice = allocation([(g0, 4000, 10), (g1, 4000, 10)], [(g0, 3000, 10)])
    moved = 0
    for i in range(8):
        name = f"pair-{i}"
        uid = create_and_bind(
            core_v1,
            name,
            NODE,
            [container("app", gpus=1)],
            choice,
            init=[container("prepare", gpus=2)],
        )
        result = rig.kubelet.wait_for_pod(NAMESPACE, name, timeout=20)
        assert result.admitted, result.message
        pod = wait_pod(core_v1, name, lambda p: bind_phase(p) == "success")
        (entry,) = read_checkpoint(rig.kubelet.config.checkpoint_path).for_container(uid, "app")
        (kubelet_gpu,) = {i.rsplit("-", 1)[0] for i in entry.all_device_ids}
        envs = dict(entry.response.envs)
        recorded = ann.decode_pod_allocation(pod.metadata.annotations[ann.DEVICES_ALLOCATED])
        assert envs["NVIDIA_VISIBLE_DEVICES"] == kubelet_gpu
        assert recorded.containers[1].uuids == (kubelet_gpu,)
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
        if kubelet_gpu == g1:
            moved += 1

            def own_events(name: str = name) -> list[str]:
                events = core_v1.list_namespaced_event(
                    NAMESPACE, field_selector=f"involvedObject.name={name}"
                ).items
                return [e.reason for e in events if e.source.component == "hami-node"]

            wait_for(lambda: bool(own_events()), 10, f"an Event from hami-node about {name}")
            assert own_events() == ["AllocateGPUReassigned"]
        core_v1.delete_namespaced_pod(name, NAMESPACE)
    assert 0 < moved < 8


# --- 4. Xid -> Unhealthy -> recovery ---------------------------------------------------------------------


def test_xid_marks_the_gpu_unhealthy_then_it_recovers(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon("--health-recovery-seconds", "1.5")
    wait_registered_annotation(rig, core_v1)
    sick, others = rig.uuids[2], rig.uuids[:2] + rig.uuids[3:]
    since = node_rv(core_v1)
    started = time.monotonic()
    rig.emit_xid("xid-79", sick, 79)
    snapshot = rig.wait_devices(lambda r: unhealthy_ids(r, sick) == virtual_ids(sick, 10), 5.0)
    took = time.monotonic() - started
    # Prompt, not polled (the fake's file watch and the event loop react in ms); the 1 s goal itself is
    # measured by bench/node.py, not asserted by a timed test that a loaded CI machine could fail.
    assert took < 5.0, f"Xid -> Unhealthy in the stand-in took {took:.3f}s"
    resource = snapshot.resource(RESOURCE)
    assert resource is not None and all(healthy_ids(resource, u) == virtual_ids(u, 10) for u in others)
    # The Node's annotation shows that GPU unhealthy (seen even if it has recovered by now).
    unhealthy = {**dict.fromkeys(rig.uuids, True), sick: False}
    wait_node(core_v1, NODE, lambda n: inventory_health(n) == unhealthy, since=since)
    # Quiet and answering for 1.5 s: Healthy again, in the stand-in and on the Node.
    rig.wait_devices(lambda r: r.allocatable == 40, 10.0)
    assert time.monotonic() - started >= 1.5
    wait_registered_annotation(rig, core_v1)


def test_ignored_xid_changes_nothing(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon("--health-recovery-seconds", "1")
    wait_registered_annotation(rig, core_v1)
    before = rig.kubelet.snapshot().resource(RESOURCE)
    assert before is not None
    since = node_rv(core_v1)
    rig.emit_xid("xid-13", rig.uuids[0], 13)  # a graphics engine exception: the application's fault
    # Proof the daemon read the edit: it logs the ignored event.
    wait_for(
        lambda: any("Xid 13" in line and ": ignored" in line for line in rig.daemon.log_text().splitlines()),
        5.0,
        "the daemon to log the ignored Xid",
    )
    # A fault that is acted on, after it, is the first change kubelet and the Node see.
    rig.emit_xid("xid-48", rig.uuids[1], 48)
    rig.wait_devices(lambda r: r.allocatable == 30, 5.0)
    after = rig.kubelet.snapshot().resource(RESOURCE)
    assert after is not None and after.updates == before.updates + 1
    assert after.unhealthy == virtual_ids(rig.uuids[1], 10)
    changed = wait_node(
        core_v1, NODE, lambda n: inventory_health(n) != dict.fromkeys(rig.uuids, True), since=since
    )
    assert inventory_health(changed) == {**dict.fromkeys(rig.uuids, True), rig.uuids[1]: False}


# --- 5. NVML failure -> fencing -> recovery ----------------------------------------------------------


def test_nvml_failure_fences_every_gpu_and_recovers(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon()
    wait_registered_annotation(rig, core_v1)
    rig.set_nvml(NvmlMode.FAILING)
    rig.wait_devices(lambda r: r.allocatable == 0 and r.capacity == 40 and r.connected, 5.0)
    node = wait_node(core_v1, NODE, lambda n: inventory_health(n) == dict.fromkeys(rig.uuids, False))
    assert len(node_inventory(node) or ()) == 4  # the GPUs stay listed, unhealthy: no phantom capacity
    wait_node(core_v1, NODE, lambda n: (n.status.allocatable or {}).get(RESOURCE) == "0")
    assert core_v1.read_node(NODE).status.capacity[RESOURCE] == "40"

    rig.set_nvml(NvmlMode.OK)
    rig.wait_devices(lambda r: r.allocatable == 40, 15.0)
    wait_registered_annotation(rig, core_v1)
    wait_node(core_v1, NODE, lambda n: (n.status.allocatable or {}).get(RESOURCE) == "40")


# --- 6. kubelet restart ------------------------------------------------------------------------------


def test_kubelet_restart_re_registers(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon()
    before = rig.kubelet.snapshot().resource(RESOURCE)
    assert before is not None
    started = time.monotonic()
    rig.kubelet.restart()
    rig.wait_devices(
        lambda r: r.registrations > before.registrations and r.connected and r.allocatable == 40, 10.0
    )
    took = time.monotonic() - started
    assert took < 5.0, f"re-registration took {took:.2f}s"
    assert rig.plugin_socket.exists()
    # The restarted kubelet admits GPU pods through the new registration.
    gpu = rig.uuids[0]
    create_and_bind(
        core_v1,
        "after-restart",
        NODE,
        [container("main", gpus=1)],
        allocation([(gpu, 1000, 10)]),
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "after-restart", timeout=20)
    assert result.admitted, result.message
    wait_pod(core_v1, "after-restart", lambda p: bind_phase(p) == "success")

    # SIGHUP restarts the plugin the same way: a new server, registered again.
    registrations = rig.wait_devices(lambda r: r.connected).resource(RESOURCE)
    assert registrations is not None
    rig.daemon.process.send_signal(signal.SIGHUP)
    rig.wait_devices(
        lambda r: r.registrations > registrations.registrations and r.connected and r.allocatable == 40, 10.0
    )
    assert rig.daemon.alive(), rig.daemon.describe()


def test_kubelet_absent_at_start(apiserver: ApiServerHandle, core_v1: Any) -> None:
    with node_rig(NODE, apiserver.kubeconfig, node_gpus(), start_kubelet=False) as rig:
        daemon = rig.start_daemon(wait=False)
        wait_for(lambda: "waiting for kubelet" in daemon.log_text(), 20.0, "the daemon to wait for kubelet")
        assert not rig.kubelet_dir.exists()
        # kubelet comes up (its directory and kubelet.sock are created): the daemon registers.
        rig.kubelet.start()
        rig.wait_devices(lambda r: r.connected and r.allocatable == 40, 10.0)
        assert daemon.alive(), daemon.describe()
        # The Node appeared only now (the stand-in creates it): the inventory annotation follows.
        wait_registered_annotation(rig, core_v1, timeout=40.0)


# --- 7. the API server goes away and comes back ----------------------------------------------------------


def test_api_server_down_plugin_keeps_serving_and_catches_up(
    rig: NodeRig, apiserver: ApiServerHandle, core_v1: Any
) -> None:
    rig.start_daemon("--health-recovery-seconds", "0")  # no recovery: the change must still be due
    wait_registered_annotation(rig, core_v1)
    runner = apiserver.runner
    port = runner.port
    runner.stop()
    try:
        # kubelet is still served: the devices stay Healthy and a health change still arrives.
        rig.wait_devices(lambda r: r.connected and r.allocatable == 40, 2.0)
        sick = rig.uuids[3]
        rig.emit_xid("xid-62", sick, 62)
        rig.wait_devices(lambda r: unhealthy_ids(r, sick) == virtual_ids(sick, 10) and r.connected, 5.0)
        assert rig.daemon.alive(), rig.daemon.describe()
    finally:
        runner.start()
    assert runner.port == port
    # The daemon writes the changed inventory once the server answers again.
    wait_node(
        core_v1,
        NODE,
        lambda n: inventory_health(n) == {**dict.fromkeys(rig.uuids, True), sick: False},
        timeout=20.0,
    )
    # ... and its pod watch is back: a pod bound now is allocated.
    gpu = rig.uuids[0]
    create_and_bind(
        core_v1,
        "after-outage",
        NODE,
        [container("main", gpus=1)],
        allocation([(gpu, 2000, 20)]),
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "after-outage", timeout=30)
    assert result.admitted, result.message
    wait_pod(core_v1, "after-outage", lambda p: bind_phase(p) == "success", timeout=20.0)

    # A pod scheduled onto the GPU that went bad meanwhile fails loudly instead of starting unlimited.
    create_and_bind(
        core_v1,
        "on-sick-gpu",
        NODE,
        [container("main", gpus=1)],
        allocation([(sick, 2000, 20)]),
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "on-sick-gpu", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    assert f"assigned GPU {sick}, which is unhealthy" in result.message, result.message
    assert "default/on-sick-gpu" in result.message, result.message
    wait_pod(core_v1, "on-sick-gpu", lambda p: bind_phase(p) == "failed")


def test_api_server_absent_at_start(apiserver: ApiServerHandle, core_v1: Any) -> None:
    runner = apiserver.runner
    with node_rig(NODE, apiserver.kubeconfig, node_gpus()) as rig:
        runner.stop()
        try:
            rig.start_daemon()  # kubelet is served without the API server
        finally:
            runner.start()
        wait_registered_annotation(rig, core_v1)  # within the reporter's backoff
        create_and_bind(
            core_v1,
            "late",
            NODE,
            [container("main", gpus=1)],
            allocation([(rig.uuids[0], 1000, 10)]),
        )
        result = rig.kubelet.wait_for_pod(NAMESPACE, "late", timeout=30)
        assert result.admitted, result.message
        wait_pod(core_v1, "late", lambda p: bind_phase(p) == "success", timeout=20.0)


# --- 8. start-up errors -----------------------------------------------------------------------------


def _one_line_error(result: Any) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return str(lines[0])


def test_bad_inventory_exits_2_naming_file_entry_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "gpus.yaml"
    bad.write_text(
        "gpus:\n"
        "  - {uuid: GPU-a0, model: NVIDIA A100-SXM4-80GB, memory: 81920}\n"
        '  - {uuid: GPU-a1, model: NVIDIA A100-SXM4-80GB, memory: "80GB"}\n'
    )
    base = ["--node-name", NODE, "--gpu-backend", "fake", "--kubelet-dir", str(tmp_path / "dp")]
    line = _one_line_error(run_daemon_once(*base, "--fake-inventory", str(bad)))
    assert str(bad) in line and "gpus[1].memory" in line and '"80GB"' in line, line

    missing = tmp_path / "nope.yaml"
    line = _one_line_error(run_daemon_once(*base, "--fake-inventory", str(missing)))
    assert str(missing) in line, line

    line = _one_line_error(run_daemon_once(*base))
    assert "fake-inventory" in line or "inventory" in line, line


def test_bad_config_exits_2_naming_file_key_or_flag(tmp_path: Path) -> None:
    inventory = tmp_path / "gpus.yaml"
    write_inventory(inventory, generate_inventory(1, seed="x"))
    config = tmp_path / "node-config.yaml"
    config.write_text(f"nodeName: {NODE}\ndeviceSplitCount: ten\n")
    line = _one_line_error(run_daemon_once("--config-file", str(config)))
    assert str(config) in line and "line 2" in line and "deviceSplitCount" in line and '"ten"' in line, line

    config.write_text(f"nodeName: {NODE}\ndeviceSplitCuont: 4\n")
    line = _one_line_error(run_daemon_once("--config-file", str(config)))
    assert "deviceSplitCuont" in line and "deviceSplitCount" in line, line  # names it, suggests the fix

    line = _one_line_error(run_daemon_once("--node-name", NODE, "--device-split-count", "0"))
    assert "--device-split-count" in line and "0" in line, line

    line = _one_line_error(run_daemon_once("--gpu-backend", "fake", "--fake-inventory", str(inventory)))
    assert "node" in line.lower(), line  # no node name

    line = _one_line_error(run_daemon_once("--node-name", NODE, "--no-such-flag"))
    assert "--no-such-flag" in line, line

    line = _one_line_error(
        run_daemon_once(
            "--node-name", NODE, "--gpu-backend", "fake", "--fake-inventory", str(inventory),
            "--kubelet-dir", str(tmp_path / "dp"), "--kubeconfig", str(tmp_path / "missing-kubeconfig"),
        )
    )  # fmt: skip
    assert "missing-kubeconfig" in line, line

    line = _one_line_error(run_daemon_once("--node-name", NODE, "--mig-strategy", "single"))
    assert "MIG is not supported" in line, line  # refused, rather than advertising GPUs it cannot split


# --- 9. SIGTERM ------------------------------------------------------------------------------------------


def test_sigterm_stops_cleanly_and_removes_the_socket(rig: NodeRig) -> None:
    daemon = rig.start_daemon()
    assert rig.plugin_socket.exists()
    started = time.monotonic()
    code = daemon.terminate(timeout=15.0)
    assert code == 0, daemon.describe()
    assert time.monotonic() - started < 10.0
    assert not rig.plugin_socket.exists()
    assert "Traceback" not in daemon.log_text(), daemon.describe()
    # kubelet saw the stream end: every device unhealthy, capacity kept (its grace period).
    rig.wait_devices(lambda r: not r.connected and r.allocatable == 0 and r.capacity == 40, 5.0)


# --- 10. Allocate with no pod to match -----------------------------------------------------------------


def test_allocate_without_a_matching_pod_fails_the_pod(rig: NodeRig, core_v1: Any) -> None:
    rig.start_daemon("--allocate-wait-seconds", "0.5")
    create_and_bind(core_v1, "unscheduled", NODE, [container("main", gpus=1)])  # no HAMi annotations
    result = rig.kubelet.wait_for_pod(NAMESPACE, "unscheduled", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    pod = core_v1.read_namespaced_pod("unscheduled", NAMESPACE)
    assert pod.status.phase == "Failed" and pod.status.reason == "UnexpectedAdmissionError"
    message = pod.status.message
    assert message.startswith("Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = ")
    assert (
        f"for pod {NAMESPACE}/unscheduled, which is bound to node {NODE} without a {ann.BIND_PHASE}"
        in message
    )

    # Marked allocating but without hami.io/vgpu-node: skipped, and the error says why.
    annotations = binding_annotations(allocation([(rig.uuids[0], 1000, 10)]), NODE, int(time.time()))
    del annotations[ann.VGPU_NODE]
    create_and_bind(core_v1, "half-annotated", NODE, [container("main", gpus=1)], annotations=annotations)
    result = rig.kubelet.wait_for_pod(NAMESPACE, "half-annotated", timeout=20)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    message = core_v1.read_namespaced_pod("half-annotated", NAMESPACE).status.message
    assert "default/half-annotated" in message and ann.VGPU_NODE in message, message
    # A GPU pod that is scheduled properly still runs afterwards.
    create_and_bind(
        core_v1,
        "good",
        NODE,
        [container("main", gpus=1)],
        allocation([(rig.uuids[0], 1000, 10)]),
    )
    assert rig.kubelet.wait_for_pod(NAMESPACE, "good", timeout=20).admitted
    checkpoint = read_checkpoint(rig.kubelet.config.checkpoint_path)
    assert {e.container_name for e in checkpoint.entries} == {"main"}


def test_a_pod_no_hami_scheduler_placed_is_refused_at_once_and_the_pod_behind_it_runs(
    rig: NodeRig, core_v1: Any
) -> None:
    """Allocate never waits for the pod watch: with --allocate-wait-seconds 30, a GPU pod another
    scheduler bound here is refused at once, naming it (the deadline below is a third of that wait),
    and the HAMi pod bound right after it, asking as many GPUs, is not mistaken for it: it is admitted
    with its own GPU."""
    rig.start_daemon("--allocate-wait-seconds", "30")
    create_and_bind(core_v1, "foreign", NODE, [container("main", gpus=1)])  # no HAMi annotations
    create_and_bind(
        core_v1,
        "behind",
        NODE,
        [container("main", gpus=1)],
        allocation([(rig.uuids[1], 1000, 10)]),
    )
    result = rig.kubelet.wait_for_pod(NAMESPACE, "foreign", timeout=10)
    assert not result.admitted and result.reason == "UnexpectedAdmissionError", result
    assert f"for pod {NAMESPACE}/foreign, which is bound to node {NODE} without a" in result.message
    assert rig.kubelet.wait_for_pod(NAMESPACE, "behind", timeout=10).admitted


# --- the Kubernetes side's footprint -------------------------------------------------------------------

_NO_KUBERNETES_CHILD = """
import json, sys
from pathlib import Path
from hami_node.config import load_config
from hami_node.main import start_daemon
daemon = start_daemon(load_config(sys.argv[1:], {}, lambda p: Path(p).read_text(encoding="utf-8")))
try:
    print("started", flush=True)
    sys.stdin.readline()
    loaded = sorted(m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes."))
    print(json.dumps({"kubernetes": loaded, "hami_kube": "hami_kube.blocking" in sys.modules}), flush=True)
finally:
    daemon.stop()
"""


def test_a_running_daemon_has_imported_no_kubernetes_module(rig: NodeRig, core_v1: Any) -> None:
    args = [*rig.base_args(), "--device-split-count", "10"]
    child = subprocess.Popen(
        [sys.executable, "-c", _NO_KUBERNETES_CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=daemon_env(),
        cwd=REPO_ROOT,
    )
    try:
        # Up and using the API: registered with kubelet, the inventory written on the Node.
        rig.wait_devices(lambda r: r.connected and r.allocatable == 40, 30.0)
        wait_registered_annotation(rig, core_v1, timeout=30.0)
        out, err = child.communicate("\n", timeout=30.0)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10.0)
    assert child.returncode == 0, err
    assert out.splitlines()[0] == "started"
    assert json.loads(out.splitlines()[-1]) == {"kubernetes": [], "hami_kube": True}
