"""HAMi v2.10's dynamic MIG on the node, over real gRPC on a real Unix socket: the device plugin with
`MigSupport` (the MIG instance manager over the fake backend's A100-40GB in MIG mode), the real pod
tracker fed by the pod watch of the local API server, and pods bound the way hami-control binds them
(`hami.io/vgpu-mig-allocations` beside the device annotations). Read back through the official client.

Transcribed from HAMi pkg/device-plugin/nvidiadevice/nvinternal/plugin/:
- server_test.go `TestSelectPreferredDeviceIDsWithPhysicalMIGReservations`: GetPreferredAllocation picks
  one device of each physical GPU the pod's reservations name.
Left out: alloc_refactor_test.go `TestAllocate_MIG_Success`, `TestAllocate_MIG_FailRequestsGreaterThanOne`
and `TestAllocate_MIG_UnknownDevice` give HAMi's plugin a resource manager that lists MIG device IDs
(HAMi's mig-strategy modes), which in hami-py is `hami_node.nvidia` (NVIDIA's modes, tests/integration/
test_nvidia_modes.py). The hami-core/mig plugin here lists `<GPU-UUID>-<i>` IDs only and answers any
MIG ID with a plain `NVIDIA_VISIBLE_DEVICES` (tests/integration/test_plugin_grpc.py
`test_allocate_mig_ids_get_a_plain_nvidia_response`), where HAMi would refuse an unlisted one with
`unknown device` (noted in docs/nvidia-sharing.md).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami_api.types import MigPlacement
from hami_kube.backoff import RetryPolicy
from hami_kube.blocking import ThreadedReflector
from hami_node.allocation import VISIBLE_DEVICES_ENV
from hami_node.config import NodeConfig, OperatingMode
from hami_node.devices import DeviceState
from hami_node.gpu.fake import FakeBackend
from hami_node.kubeapi import NodeApi, watch_node_pods
from hami_node.mig_manager import MigKey, MigManager, MigReconciler, discover_registrations, prime_from_pods
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.registration import CHANNEL_OPTIONS
from hami_node.plugin.server import MigSupport, PluginServer
from hami_node.pods import PodTracker
from tests.apiserver_util import bind
from tests.builders import allocation_annotations, gpu_pod, node
from tests.waiting import wait_for

NODE = "mig-node"
NS = "default"
A100 = "NVIDIA A100-SXM4-40GB"
GPU_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_B = "GPU-03f69c50-207a-2038-9b45-23cac89cb67b"
GPU_C = "GPU-03f69c50-207a-2038-9b45-23cac89cb67c"
SPLIT = 7
FAST = RetryPolicy(initial=0.05, maximum=0.3)
DEADLINE_S = 10.0


@dataclass
class MigNode:
    """hami-node in operating mode mig without its process: backend, state, tracker, watch, plugin."""

    config: NodeConfig
    backend: FakeBackend
    kube: NodeApi
    tracker: PodTracker
    watch: ThreadedReflector
    manager: MigManager
    reconciler: MigReconciler
    server: PluginServer

    def stub(self) -> tuple[grpc.Channel, api_pb2_grpc.DevicePluginStub]:
        channel = grpc.insecure_channel(f"unix://{self.config.socket_path}", options=CHANNEL_OPTIONS)
        return channel, api_pb2_grpc.DevicePluginStub(channel)

    def allocate(self, *ids: str) -> api_pb2.AllocateResponse:
        channel, stub = self.stub()
        with channel:
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
            )
            response: api_pb2.AllocateResponse = stub.Allocate(request, timeout=DEADLINE_S)
            return response


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay short (108 bytes): a directory right under /tmp."""
    path = Path(tempfile.mkdtemp(prefix="hami-mig-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fake_backend(directory: Path) -> FakeBackend:
    inventory = directory / "inventory.yaml"
    gpus = [{"uuid": uuid, "model": A100, "memory": 40960, "mig": True} for uuid in (GPU_A, GPU_B, GPU_C)]
    inventory.write_text(yaml.safe_dump({"gpus": gpus}))
    backend = FakeBackend(inventory, watch=False)
    backend.init()
    return backend


def start_mig_node(kubeconfig: Path, directory: Path, backend: FakeBackend) -> MigNode:
    """hami-node's start in mode mig (hami_node/main.py `_mig_parts`): registrations, the live pods'
    instances adopted, then the plugin serving."""
    config = NodeConfig(
        node_name=NODE,
        kubelet_dir=directory / "dp",
        hook_path=str(directory / "hook"),
        device_split_count=SPLIT,
        operating_mode=OperatingMode.MIG,
        allocate_wait_seconds=2.0,
    )
    state = DeviceState(config)
    state.set_gpus(backend.list_gpus(), 0.0)
    state.set_mig(discover_registrations(backend, backend.list_gpus(), None))
    kube = NodeApi.connect(kubeconfig)
    tracker = PodTracker(NODE, kube, retry=FAST, read_timeout_s=2.0)
    watch = watch_node_pods(kube.bridge, NODE, tracker, retry=FAST)
    tracker.start()
    watch.start()
    assert watch.wait_synced(DEADLINE_S)
    manager = MigManager(backend)

    def node_pods() -> list[dict[str, Any]]:
        return kube.list_pods(f"spec.nodeName={NODE}")[0]

    assert prime_from_pods(manager, node_pods(), {g.uuid for g in backend.list_gpus()}) == []
    reconciler = MigReconciler(manager, node_pods)
    server = PluginServer(config, state, tracker, mig=MigSupport(manager, kube, reconciler))
    server.start()
    return MigNode(config, backend, kube, tracker, watch, manager, reconciler, server)


def stop_mig_node(n: MigNode) -> None:
    n.server.stop()
    n.watch.stop()
    n.tracker.stop()
    n.kube.close()


@pytest.fixture
def mig_node(apiserver: Any, core_v1: Any, short_dir: Path) -> Iterator[MigNode]:
    (short_dir / "dp").mkdir()
    (short_dir / "hook").mkdir()
    core_v1.create_node(node(NODE))
    n = start_mig_node(apiserver.kubeconfig, short_dir, fake_backend(short_dir))
    try:
        yield n
    finally:
        stop_mig_node(n)


def reservation(gpu: str, profile: str, start: int, size: int, *, device: int = 0) -> MigAllocation:
    return MigAllocation(0, device, gpu, profile, MigPlacement(start, size))


def bind_mig_pod(core_v1: Any, name: str, devices: str, *reservations: MigAllocation, gpus: int = 1) -> None:
    """Create a pod and bind it as hami-control's binder does for a MIG GPU: the device annotations and
    `hami.io/vgpu-mig-allocations` ride on the Binding."""
    core_v1.create_namespaced_pod(NS, gpu_pod(name, gpus=gpus, annotations={"nvidia.com/vgpu-mode": "mig"}))
    annotations = allocation_annotations(NODE, devices, bound_at=1767225600)
    annotations[MIG_ALLOCATIONS] = encode_mig_allocations(reservations)
    bind(core_v1, NS, name, NODE, annotations=annotations)


def recorded(core_v1: Any, name: str) -> tuple[MigAllocation, ...]:
    annotations = core_v1.read_namespaced_pod(name, NS).metadata.annotations or {}
    return decode_mig_allocations(annotations.get(MIG_ALLOCATIONS, ""))


def bind_phase(core_v1: Any, name: str) -> str:
    annotations = core_v1.read_namespaced_pod(name, NS).metadata.annotations or {}
    return str(annotations.get("hami.io/bind-phase", ""))


# --- Allocate creates, records, answers ---------------------------------------------------------------


def test_allocate_creates_the_reserved_instance_records_it_on_the_pod_and_answers_its_mig_uuid(
    mig_node: MigNode, core_v1: Any
) -> None:
    bind_mig_pod(core_v1, "small", f"{GPU_A},NVIDIA,4864,15:;", reservation(GPU_A, "1g.5gb", 6, 1))

    response = mig_node.allocate(f"{GPU_A}-0")

    (device,) = mig_node.backend.mig_devices(GPU_A)
    assert (device.profile, device.placement.start, device.placement.size) == ("1g.5gb", 6, 1)
    (answer,) = response.container_responses
    assert dict(answer.envs) == {VISIBLE_DEVICES_ENV: device.uuid}
    assert list(answer.mounts) == [] and list(answer.devices) == []
    (entry,) = recorded(core_v1, "small")
    assert (entry.mig_uuid, entry.gpu_instance_id, entry.compute_instance_id) == (
        device.uuid,
        device.gpu_instance_id,
        device.compute_instance_id,
    )
    wait_for(lambda: bind_phase(core_v1, "small") == "success", DEADLINE_S, "bind-phase success")


def test_allocate_of_two_mig_devices_on_two_gpus_creates_both_in_device_order(
    mig_node: MigNode, core_v1: Any
) -> None:
    bind_mig_pod(
        core_v1,
        "two",
        f"{GPU_A},NVIDIA,19968,43:{GPU_B},NVIDIA,9856,29:;",
        reservation(GPU_A, "3g.20gb", 4, 4),
        reservation(GPU_B, "2g.10gb", 0, 2, device=1),
        gpus=2,
    )

    response = mig_node.allocate(f"{GPU_A}-0", f"{GPU_B}-0")

    (on_a,) = mig_node.backend.mig_devices(GPU_A)
    (on_b,) = mig_node.backend.mig_devices(GPU_B)
    assert dict(response.container_responses[0].envs) == {VISIBLE_DEVICES_ENV: f"{on_a.uuid},{on_b.uuid}"}
    assert [e.mig_uuid for e in recorded(core_v1, "two")] == [on_a.uuid, on_b.uuid]


def test_a_failed_identity_patch_destroys_the_instance_it_created_and_fails_the_pod(
    mig_node: MigNode, core_v1: Any, apiserver: Any
) -> None:
    bind_mig_pod(core_v1, "unlucky", f"{GPU_A},NVIDIA,9856,29:;", reservation(GPU_A, "2g.10gb", 2, 2))
    wait_for(lambda: mig_node.tracker.waiting() != (), DEADLINE_S, "the watch to bring the pod")
    apiserver.runner.set_faults(
        {"seed": 1, "rules": [{"name": "patch", "fault": "error", "verbs": ["patch"], "resources": ["pods"]}]}
    )
    try:
        with pytest.raises(grpc.RpcError) as failed:
            mig_node.allocate(f"{GPU_A}-0")
    finally:
        apiserver.runner.clear_faults()

    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert "pod default/unlucky: record MIG runtime placement" in str(failed.value.details())
    assert mig_node.backend.mig_devices(GPU_A) == () and mig_node.manager.managed() == {}
    assert not recorded(core_v1, "unlucky")[0].runtime_ready
    wait_for(lambda: bind_phase(core_v1, "unlucky") == "failed", DEADLINE_S, "bind-phase failed")


def test_a_second_allocate_of_the_same_container_after_a_restart_creates_nothing_new(
    apiserver: Any, core_v1: Any, short_dir: Path
) -> None:
    """hami-node restarts after creating the instance and recording it, and kubelet asks again (its own
    deadline passed, the pod is still `allocating`): the restarted daemon adopts the instance from the
    pod's runtime identity (HAMi server.go primeMigManagerFromAnnotations, migmgr.go AdoptAllocation) and
    answers the same MIG device; nothing more is created (migmgr.go EnsureAllocation)."""
    (short_dir / "dp").mkdir()
    (short_dir / "hook").mkdir()
    core_v1.create_node(node(NODE))
    backend = fake_backend(short_dir)
    first_node = start_mig_node(apiserver.kubeconfig, short_dir, backend)
    try:
        bind_mig_pod(core_v1, "again", f"{GPU_A},NVIDIA,4864,15:;", reservation(GPU_A, "1g.5gb", 5, 1))
        first = first_node.allocate(f"{GPU_A}-0")
        wait_for(lambda: bind_phase(core_v1, "again") == "success", DEADLINE_S, "bind-phase success")
    finally:
        stop_mig_node(first_node)
    core_v1.patch_namespaced_pod(
        "again", NS, {"metadata": {"annotations": {"hami.io/bind-phase": "allocating"}}}
    )
    restarted = start_mig_node(apiserver.kubeconfig, short_dir, backend)
    try:
        assert list(restarted.manager.managed()) == [MigKey(GPU_A, "1g.5gb", 5, 1)]
        second = restarted.allocate(f"{GPU_A}-1")
        assert restarted.manager.created == 0
    finally:
        stop_mig_node(restarted)

    assert second.container_responses[0].envs == first.container_responses[0].envs
    assert len(backend.mig_devices(GPU_A)) == 1


def test_the_reconciler_destroys_the_instance_once_its_pod_is_deleted(
    mig_node: MigNode, core_v1: Any
) -> None:
    bind_mig_pod(core_v1, "kept", f"{GPU_A},NVIDIA,4864,15:;", reservation(GPU_A, "1g.5gb", 6, 1))
    mig_node.allocate(f"{GPU_A}-0")
    bind_mig_pod(core_v1, "gone", f"{GPU_B},NVIDIA,19968,43:;", reservation(GPU_B, "3g.20gb", 0, 4))
    mig_node.allocate(f"{GPU_B}-0")
    assert mig_node.reconciler.reconcile_once() == []

    core_v1.delete_namespaced_pod("gone", NS, grace_period_seconds=0)
    gone = mig_node.reconciler.reconcile_once()

    assert [(k.gpu_uuid, k.profile) for k in gone] == [(GPU_B, "3g.20gb")]
    assert mig_node.backend.mig_devices(GPU_B) == ()
    assert [d.profile for d in mig_node.backend.mig_devices(GPU_A)] == ["1g.5gb"]


def test_a_reservation_at_a_placement_nvml_refuses_fails_naming_gpu_and_placement(
    mig_node: MigNode, core_v1: Any
) -> None:
    bind_mig_pod(core_v1, "odd", f"{GPU_C},NVIDIA,9856,29:;", reservation(GPU_C, "2g.10gb", 1, 2))

    with pytest.raises(grpc.RpcError) as failed:
        mig_node.allocate(f"{GPU_C}-0")

    assert "invalid placement {Start:1 Size:2} for profile 2g.10gb on GPU " + GPU_C in str(
        failed.value.details()
    )
    assert mig_node.backend.mig_devices(GPU_C) == ()


# --- HAMi's tests ---------------------------------------------------------------------------------------


def test_preferred_allocation_takes_one_device_of_each_gpu_the_reservations_name(
    mig_node: MigNode, core_v1: Any
) -> None:
    """HAMi server_test.go TestSelectPreferredDeviceIDsWithPhysicalMIGReservations: kubelet offers two
    devices of GPU a and one each of b and c; the pod's MIG reservations are on a, b and c."""
    bind_mig_pod(
        core_v1,
        "three",
        f"{GPU_A},NVIDIA,4864,15:{GPU_B},NVIDIA,4864,15:{GPU_C},NVIDIA,4864,15:;",
        reservation(GPU_A, "1g.5gb", 6, 1),
        reservation(GPU_B, "1g.5gb", 6, 1, device=1),
        reservation(GPU_C, "1g.5gb", 6, 1, device=2),
        gpus=3,
    )
    wait_for(lambda: mig_node.tracker.waiting() != (), DEADLINE_S, "the watch to bring the pod")
    available = [f"{GPU_A}-0", f"{GPU_A}-1", f"{GPU_B}-0", f"{GPU_C}-0"]
    channel, stub = mig_node.stub()
    with channel:
        response = stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=3
                    )
                ]
            ),
            timeout=DEADLINE_S,
        )
    assert sorted(response.container_responses[0].deviceIDs) == [f"{GPU_A}-0", f"{GPU_B}-0", f"{GPU_C}-0"]
