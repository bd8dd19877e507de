"""The device plugin over real gRPC on real Unix sockets: a stand-in kubelet (Registration service that
dials back, asks for options and follows ListAndWatch, as kubelet does), the fake GPU backend with the
real health loop, and in-memory pods. Registration, ListAndWatch contents and updates, Allocate,
GetPreferredAllocation, kubelet restarts, SIGHUP, stop."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_api.annotations import decode_pod_allocation
from hami_api.types import ContainerAllocation
from hami_node.allocation import (
    AllocationError,
    PendingPod,
    PodMatch,
    match_pending_pod,
)
from hami_node.config import NodeConfig
from hami_node.devices import DeviceState
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import generate_inventory
from hami_node.health import HealthMonitor
from hami_node.plugin.api import api_pb2, api_pb2_grpc, constants
from hami_node.plugin.manager import PluginManager, SignalHandlers, install_signal_handlers
from hami_node.plugin.registration import CHANNEL_OPTIONS, RegistrationError, check_serving, register
from hami_node.plugin.server import PluginServer, PluginServerError, plugin_options
from tests.builders import container, pod
from tests.inotify_masks import READS_AND_CLOSES, inotify_masks
from tests.waiting import wait_for

TIMEOUT = 10.0
PROMPT_S = 5.0
"""Bound for "reacts to an event, does not wait for a poll" (polls here are 60 s apart). The 1 s goals
themselves are measured by bench/node.py, not asserted by timed tests."""
SPLIT = 3
INVENTORY = generate_inventory(2, seed="node-a")
A, B = (g.uuid for g in INVENTORY.gpus)
CACHE_ID = "5a9c7c8e-7d1b-4c6e-9d7e-2f0b1c3d4e5f"


# --- stand-ins: pods and kubelet ---------------------------------------------------------------------


class MemoryPods:
    """A `PodSource` over pending pods held in memory: what the pod watch shows, and what only the API
    server has (read on a miss, as `pods.PodTracker` does)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._cond = threading.Condition()
        self._pods: dict[str, tuple[PendingPod, dict[str, Any]]] = {}
        self._api_only: dict[str, tuple[PendingPod, dict[str, Any]]] = {}
        self.allocations: list[tuple[str, int]] = []
        self.granted: list[ContainerAllocation | None] = []
        self.completed: list[str] = []
        self.failures: list[tuple[str | None, str, str]] = []
        self.misses = 0
        self.admitted: list[PodMatch | None] = []
        """What each `match` call was handed as `admitted`."""

    def add(
        self,
        name: str,
        annotation: str,
        containers: list[str],
        init: tuple[str, ...] = (),
        *,
        watched: bool = True,
    ) -> PendingPod:
        """A pending pod; `watched=False`: only the API server has it (the watch lags)."""
        uid = f"uid-{name}"
        pending = PendingPod("team", name, uid, decode_pod_allocation(annotation))
        obj = pod(
            name,
            *(container(c) for c in containers),
            namespace="team",
            uid=uid,
            init=[container(c) for c in init],
        )
        with self._cond:
            (self._pods if watched else self._api_only)[pending.key] = (pending, obj)
            self._cond.notify_all()
        return pending

    def _pending(self) -> list[PendingPod]:
        return [pod for pod, _ in self._pods.values()]

    def match(self, device_count: int, admitted: PodMatch | None = None) -> PodMatch:
        with self._cond:
            self.admitted.append(admitted)
            found = match_pending_pod(self._pending(), device_count)
            if isinstance(found, PodMatch):
                return found
            self.misses += 1
            self._pods.update(self._api_only)
            self._api_only.clear()
            found = match_pending_pod(self._pending(), device_count)
            if isinstance(found, PodMatch):
                return found
            raise found.error(self.node)

    def admitting(self, device_count: int) -> PodMatch | None:
        with self._cond:
            try:
                found = match_pending_pod(self._pending(), device_count)
            except AllocationError:
                return None
            return found if isinstance(found, PodMatch) else None

    def pod_object(self, pod: PendingPod) -> dict[str, object]:
        with self._cond:
            return self._pods[pod.key][1]

    def allocated(self, match: PodMatch, granted: ContainerAllocation | None = None) -> None:
        with self._cond:
            pod, obj = self._pods[match.pod.key]
            self.allocations.append((pod.key, match.entry))
            self.granted.append(granted)
            if match.completes_pod:
                del self._pods[pod.key]
                self.completed.append(pod.key)
            else:
                self._pods[pod.key] = (pod.with_allocated(match.entry, granted), obj)

    def failed(self, pod: PendingPod | None, reason: str, event_reason: str = "") -> None:
        with self._cond:
            self.failures.append((pod.key if pod else None, reason, event_reason))


@dataclass
class Registration:
    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions
    updates: queue.Queue[api_pb2.ListAndWatchResponse | None] = field(default_factory=queue.Queue)
    """Every ListAndWatch message, then None when the stream ends."""

    def next_update(self, timeout_s: float = TIMEOUT) -> api_pb2.ListAndWatchResponse | None:
        return self.updates.get(timeout=timeout_s)


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """Kubelet's side: serves Registration on kubelet.sock; on Register it dials the plugin back, calls
    GetDevicePluginOptions, answers, and follows ListAndWatch in a thread. `reject` fails the next
    Register calls with that message."""

    def __init__(self, directory: Path, socket_name: str = "kubelet.sock") -> None:
        self.directory = directory
        self.socket_name = socket_name
        self.registrations: queue.Queue[Registration] = queue.Queue()
        self.reject: list[str] = []
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def socket(self) -> Path:
        return self.directory / self.socket_name

    def start(self) -> FakeKubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        assert server.add_insecure_port(f"unix://{self.socket}") == 1
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait(TIMEOUT)
        with self._lock:
            channels, self._channels = self._channels, []
            threads, self._threads = self._threads, []
        for channel in channels:
            channel.close()  # ends the ListAndWatch streams
        for thread in threads:
            thread.join(TIMEOUT)
            assert not thread.is_alive()

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        if self.reject:
            context.abort(grpc.StatusCode.UNAVAILABLE, self.reject.pop(0))
        if request.version not in constants.SUPPORTED_VERSIONS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        channel = grpc.insecure_channel(
            f"unix://{self.directory / request.endpoint}", options=CHANNEL_OPTIONS
        )
        stub = api_pb2_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=TIMEOUT, wait_for_ready=True)
        registration = Registration(request, options)
        stream = stub.ListAndWatch(api_pb2.Empty())

        def follow() -> None:
            try:
                for update in stream:
                    registration.updates.put(update)
            except grpc.RpcError:
                pass
            finally:
                registration.updates.put(None)

        thread = threading.Thread(target=follow, daemon=True)
        with self._lock:
            self._channels.append(channel)
            self._threads.append(thread)
        thread.start()
        self.registrations.put(registration)
        return api_pb2.Empty()


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class PrefaceRecorder:
    """A Unix socket at `path` in front of a gRPC server at `target`: relays every connection both ways
    and records its first bytes (up to the 24 of an HTTP/2 client preface; fewer when the client hung
    up before sending them). A gRPC server logs an error for each connection that is not HTTP/2
    (kubelet's grpc-go: "failed to receive the preface from client")."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path = path
        self.target = target
        self.first_bytes: list[bytes] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._accepter = threading.Thread(target=self._accept, name="preface-recorder", daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._sockets.append(conn)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        head = b""
        try:
            while len(head) < len(HTTP2_PREFACE):
                chunk = conn.recv(len(HTTP2_PREFACE) - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:
            pass
        with self._lock:
            self.first_bytes.append(head)
            if self._closed or len(head) < len(HTTP2_PREFACE):
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sockets.append(upstream)
        try:
            upstream.connect(str(self.target))
            upstream.sendall(head)
        except OSError:
            return
        back = threading.Thread(target=self._pump, args=(upstream, conn), daemon=True)
        with self._lock:
            self._threads.append(back)
        back.start()
        self._pump(conn, upstream)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepter.join(TIMEOUT)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(TIMEOUT)
            assert not thread.is_alive()
        self.path.unlink(missing_ok=True)


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes: a short directory of our own."""
    path = Path(tempfile.mkdtemp(prefix="hami-dp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet_dir(short_dir: Path) -> Path:
    path = short_dir / "dp"
    path.mkdir()
    return path


@pytest.fixture
def node_config(kubelet_dir: Path, short_dir: Path) -> NodeConfig:
    hook = short_dir / "hook"
    hook.mkdir()
    return NodeConfig(
        node_name="node-a",
        kubelet_dir=kubelet_dir,
        hook_path=str(hook),
        device_split_count=SPLIT,
        allocate_wait_seconds=0.2,
        health_recovery_seconds=0,
    )


@dataclass
class Node:
    """A running hami-node without the API server: backend, health loop, state, pods, plugin manager."""

    config: NodeConfig
    backend: FakeBackend
    state: DeviceState
    monitor: HealthMonitor
    pods: MemoryPods
    manager: PluginManager

    def channel(self) -> grpc.Channel:
        """A client channel to the plugin (kubelet's side of Allocate)."""
        return grpc.insecure_channel(f"unix://{self.config.socket_path}", options=CHANNEL_OPTIONS)


def start_node(config: NodeConfig, **manager: Any) -> Node:
    backend = FakeBackend(INVENTORY)
    state = DeviceState(config)
    monitor = HealthMonitor(backend, state, config, event_wait_s=0.05)
    monitor.start()
    pods = MemoryPods(config.node_name)
    plugin = PluginManager(
        config,
        state,
        pods,
        server_factory=lambda: PluginServer(config, state, pods, new_id=lambda: CACHE_ID),
        retry_initial_s=manager.pop("retry_initial_s", 0.05),
        retry_max_s=manager.pop("retry_max_s", 0.2),
        **manager,
    )
    plugin.start()
    return Node(config, backend, state, monitor, pods, plugin)


def stop_node(node: Node) -> None:
    node.manager.stop()
    node.monitor.stop()


@pytest.fixture
def kubelet(kubelet_dir: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(kubelet_dir).start()
    yield k
    k.stop()


@pytest.fixture
def node(node_config: NodeConfig, kubelet: FakeKubelet) -> Iterator[Node]:
    n = start_node(node_config)
    assert n.manager.wait_registered(0, TIMEOUT)
    yield n
    stop_node(n)


def devices(update: api_pb2.ListAndWatchResponse | None) -> list[tuple[str, str]]:
    assert update is not None, "the ListAndWatch stream ended"
    return [(d.ID, d.health) for d in update.devices]


def drain(registration: Registration) -> int:
    """Wait for the registration's stream to end; how many updates it still had."""
    count = 0
    while registration.next_update() is not None:
        count += 1
    return count


def ids(gpu: str) -> list[str]:
    return [f"{gpu}-{i}" for i in range(SPLIT)]


HEALTHY = constants.HEALTHY
UNHEALTHY = constants.UNHEALTHY


# --- registration and ListAndWatch ------------------------------------------------------------------


def test_registers_with_the_options_it_serves(node: Node, kubelet: FakeKubelet) -> None:
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    assert registration.request.version == "v1beta1"
    assert registration.request.endpoint == "hami-nvidia-gpu.sock"
    assert registration.request.resource_name == "nvidia.com/gpu"
    expected = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
    assert registration.request.options == expected
    assert registration.options == expected
    assert plugin_options() == expected
    assert node.manager.wait_registered(0, TIMEOUT)
    assert node.manager.registered


def test_list_and_watch_lists_split_count_devices_per_gpu(node: Node, kubelet: FakeKubelet) -> None:
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    first = registration.next_update()
    assert devices(first) == [(i, HEALTHY) for i in ids(A) + ids(B)]
    assert first is not None and all(not d.HasField("topology") for d in first.devices)


def test_list_and_watch_attaches_numa_when_enabled(node_config: NodeConfig, kubelet: FakeKubelet) -> None:
    n = start_node(replace(node_config, enable_numa_topology=True))
    try:
        first = kubelet.registrations.get(timeout=TIMEOUT).next_update()
        assert first is not None
        numa = {g.uuid: g.numa_node for g in INVENTORY.gpus}
        assert [(d.ID, [x.ID for x in d.topology.nodes]) for d in first.devices] == [
            (i, [numa[gpu]]) for gpu in (A, B) for i in ids(gpu)
        ]
    finally:
        stop_node(n)


def test_an_xid_reaches_kubelet_as_the_next_list_and_watch_update(node: Node, kubelet: FakeKubelet) -> None:
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    registration.next_update()
    node.backend.inject_xid(B, 79)
    update = registration.next_update(PROMPT_S)
    assert devices(update) == [(i, HEALTHY) for i in ids(A)] + [(i, UNHEALTHY) for i in ids(B)]


def test_nvml_failure_fences_every_device_for_kubelet(node: Node, kubelet: FakeKubelet) -> None:
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    registration.next_update()
    node.backend.set_failing(True)
    assert devices(registration.next_update(PROMPT_S)) == [(i, UNHEALTHY) for i in ids(A) + ids(B)]
    node.backend.set_failing(False)
    node.monitor.retry_now()
    assert devices(registration.next_update()) == [(i, HEALTHY) for i in ids(A) + ids(B)]


# --- Allocate -----------------------------------------------------------------------------------------


def allocate(channel: grpc.Channel, *device_ids: str) -> api_pb2.ContainerAllocateResponse:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )
    response: api_pb2.AllocateResponse = api_pb2_grpc.DevicePluginStub(channel).Allocate(
        request, timeout=TIMEOUT
    )
    assert len(response.container_responses) == 1
    return response.container_responses[0]


def mounts(response: api_pb2.ContainerAllocateResponse) -> list[tuple[str, str, bool]]:
    return [(m.container_path, m.host_path, m.read_only) for m in response.mounts]


def test_allocate_a_single_gpu_container(node: Node) -> None:
    node.pods.add("one", f"{B},NVIDIA,3000,30:;", ["main"])
    hook = node.config.hook_path
    with node.channel() as channel:
        response = allocate(channel, f"{B}-2")  # the replica kubelet picked does not matter
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": B,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{hook}/vgpu/{CACHE_ID}.cache",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    cache_dir = f"{hook}/vgpu/containers/uid-one_main"
    assert mounts(response) == [
        (f"{hook}/vgpu/libvgpu.so", f"{hook}/vgpu/libvgpu.so", True),
        (f"{hook}/vgpu", cache_dir, False),
        ("/tmp/vgpulock", "/tmp/vgpulock", False),
        ("/etc/ld.so.preload", f"{hook}/vgpu/ld.so.preload", True),
    ]
    assert os.path.isdir(cache_dir)
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o777
    assert node.pods.allocations == [("team/one", 0)]
    assert node.pods.completed == ["team/one"]
    assert node.pods.failures == []


def test_allocate_multi_gpu_and_multi_container_pods(node: Node) -> None:
    node.pods.add("two", f";{A},NVIDIA,1000,10:{B},NVIDIA,2000,20:;{A},NVIDIA,500,5:;", ["a", "b"], ("init",))
    with node.channel() as channel:
        first = allocate(channel, f"{A}-0", f"{B}-1")
        second = allocate(channel, f"{A}-3")
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert (first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], first.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "1000m",
        "2000m",
    )
    assert first.envs["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert (second.envs["NVIDIA_VISIBLE_DEVICES"], second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (A, "500m")
    hook = node.config.hook_path
    assert (f"{hook}/vgpu", f"{hook}/vgpu/containers/uid-two_a", False) in mounts(first)
    assert (f"{hook}/vgpu", f"{hook}/vgpu/containers/uid-two_b", False) in mounts(second)
    assert node.pods.allocations == [("team/two", 1), ("team/two", 2)]
    assert node.pods.completed == ["team/two"]


def test_allocate_takes_a_pod_only_the_api_server_has_yet_without_waiting(node: Node) -> None:
    node.pods.add("late", f"{A},NVIDIA,1000,10:;", ["main"], watched=False)
    with node.channel() as channel:
        response = allocate(channel, f"{A}-0")
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == A
    assert node.pods.misses == 1
    assert node.pods.completed == ["team/late"]


def test_allocate_without_a_pending_pod_fails_with_unknown(node: Node) -> None:
    with node.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        allocate(channel, f"{A}-0")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert "no pod bound to node node-a is waiting for GPUs" in (caught.value.details() or "")
    assert len(node.pods.failures) == 1
    assert node.pods.failures[0][0] is None


def test_allocate_on_an_unhealthy_gpu_fails_and_reports_the_pod(node: Node, kubelet: FakeKubelet) -> None:
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    registration.next_update()
    node.backend.inject_xid(B, 79)
    assert registration.next_update() is not None  # the health loop has marked B
    node.pods.add("bad", f"{B},NVIDIA,1000,10:;", ["main"])
    with node.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        allocate(channel, f"{A}-0")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    details = caught.value.details() or ""
    assert "pod team/bad" in details and "unhealthy" in details
    assert node.pods.failures == [("team/bad", details, "")]
    assert node.pods.allocations == []


def test_allocate_with_a_count_mismatch_or_unknown_device(node: Node) -> None:
    node.pods.add("pair", f"{A},NVIDIA,1000,10:{B},NVIDIA,1000,10:;", ["main"])
    with node.channel() as channel:
        with pytest.raises(grpc.RpcError) as caught:
            allocate(channel, f"{A}-0")
        assert caught.value.code() == grpc.StatusCode.UNKNOWN
        assert "team/pair (next container: 2 GPU(s))" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            allocate(channel, f"{A}-0", "GPU-nope-1")
        assert "GPU-nope" in (caught.value.details() or "")
        assert "pod team/pair" in (caught.value.details() or "")
    assert [pod for pod, _, _ in node.pods.failures] == [None, "team/pair"]


def test_allocate_mig_ids_get_a_plain_nvidia_response(node: Node) -> None:
    with node.channel() as channel:
        response = allocate(channel, "MIG-1234", "MIG-5678")
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-1234,MIG-5678"}
    assert node.pods.failures == []


def test_prestart_and_preferred_allocation(node: Node) -> None:
    node.pods.add("steer", f"{B},NVIDIA,1000,10:;", ["main"])
    with node.channel() as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        assert (
            stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[f"{A}-0"]), timeout=TIMEOUT)
            == api_pb2.PreStartContainerResponse()
        )
        everything = ids(A) + ids(B)
        steered = stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=everything, allocation_size=1
                    )
                ]
            ),
            timeout=TIMEOUT,
        )
        assert [list(r.deviceIDs) for r in steered.container_responses] == [[f"{B}-0"]]
        spread = stub.GetPreferredAllocation(  # no pod waits for 2: spread over the GPUs
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=everything, allocation_size=2
                    )
                ]
            ),
            timeout=TIMEOUT,
        )
        assert sorted(i.rsplit("-", 1)[0] for i in spread.container_responses[0].deviceIDs) == sorted([A, B])
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[f"{A}-0"], allocation_size=2
                        )
                    ]
                ),
                timeout=TIMEOUT,
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_allocate_of_the_devices_a_preferred_allocation_answered_gets_what_it_found(node: Node) -> None:
    """kubelet's order (devicesToAllocate, then Allocate of the devices chosen): the container the
    preference found is handed to the lookup once, for exactly those devices (in any order)."""
    node.pods.add("two", f"{B},NVIDIA,1000,10:;{A},NVIDIA,1000,10:;", ["c0", "c1"])
    everything = ids(A) + ids(B)

    def prefer(stub: api_pb2_grpc.DevicePluginStub) -> list[str]:
        answer = stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=everything, allocation_size=1
                    )
                ]
            ),
            timeout=TIMEOUT,
        )
        return list(answer.container_responses[0].deviceIDs)

    def allocate(stub: api_pb2_grpc.DevicePluginStub, devices: list[str]) -> None:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=devices)
        stub.Allocate(request, timeout=TIMEOUT)

    with node.channel() as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        chosen = prefer(stub)
        assert chosen == [f"{B}-0"]
        allocate(stub, chosen)
        first = node.pods.admitted[-1]
        assert first is not None and (first.pod.name, first.entry) == ("two", 0)
        chosen = prefer(stub)
        assert chosen == [f"{A}-0"]
        allocate(stub, [f"{A}-1"])  # not what it answered: looked up afresh
        assert node.pods.admitted[-1] is None
    assert node.pods.completed == ["team/two"]


# --- kubelet restarts, SIGHUP, stop --------------------------------------------------------------------


def test_kubelet_restart_re_registers_and_streams_every_device_healthy(
    node: Node, kubelet: FakeKubelet
) -> None:
    old = kubelet.registrations.get(timeout=TIMEOUT)
    assert old.next_update() is not None
    assert node.manager.wait_registered(0, TIMEOUT)
    count = node.manager.registrations
    kubelet.stop()  # kubelet goes away (its socket with it) ...
    for path in node.config.kubelet_dir.iterdir():  # ... and wipes every socket when it starts again
        path.unlink()
    kubelet.start()
    fresh = kubelet.registrations.get(timeout=PROMPT_S)
    assert node.manager.wait_registered(count, TIMEOUT)
    assert old.next_update() is None  # the old stream ended
    assert devices(fresh.next_update()) == [(i, HEALTHY) for i in ids(A) + ids(B)]
    assert node.config.socket_path.exists()
    assert node.manager.restarts >= 1


def test_sighup_restarts_and_re_registers(node: Node, kubelet: FakeKubelet) -> None:
    first = kubelet.registrations.get(timeout=TIMEOUT)
    assert node.manager.wait_registered(0, TIMEOUT)
    with SignalHandlers(node.manager) as signals:
        os.kill(os.getpid(), signal.SIGHUP)
        again = kubelet.registrations.get(timeout=TIMEOUT)
        assert node.manager.wait_registered(1, TIMEOUT)
        assert node.manager.restarts == 1
        assert drain(first) <= 1  # the old server's stream ended before re-registering
        assert again.next_update() is not None
        assert signals.wait_for_shutdown(0) is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.wait_for_shutdown(TIMEOUT) == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) != signals._on_term  # restored
    assert node.manager.registrations == 2


def test_signal_handlers_for_an_event_waiting_main_thread(node: Node, kubelet: FakeKubelet) -> None:
    kubelet.registrations.get(timeout=TIMEOUT)
    assert node.manager.wait_registered(0, TIMEOUT)
    shutdown = threading.Event()
    restore = install_signal_handlers(node.manager, shutdown)
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        kubelet.registrations.get(timeout=TIMEOUT)
        assert node.manager.wait_registered(1, TIMEOUT)
        assert not shutdown.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert shutdown.wait(TIMEOUT)
    finally:
        restore()
    assert not any(t.name == "hami-signal-relay" for t in threading.enumerate())


def test_request_restart_is_the_same_restart(node: Node, kubelet: FakeKubelet) -> None:
    kubelet.registrations.get(timeout=TIMEOUT)
    node.manager.request_restart("test")
    kubelet.registrations.get(timeout=TIMEOUT)
    assert node.manager.wait_registered(1, TIMEOUT)


def test_stop_removes_the_socket_and_ends_the_stream(node_config: NodeConfig, kubelet: FakeKubelet) -> None:
    n = start_node(node_config)
    registration = kubelet.registrations.get(timeout=TIMEOUT)
    assert registration.next_update() is not None
    assert node_config.socket_path.exists()
    stop_node(n)
    assert not node_config.socket_path.exists()
    assert registration.next_update() is None
    n.manager.stop()  # idempotent


def test_waits_for_kubelet_and_registers_when_it_appears(node_config: NodeConfig, kubelet_dir: Path) -> None:
    n = start_node(node_config, fallback_poll_s=60.0)  # only the watch can wake it in time
    kubelet = FakeKubelet(kubelet_dir)
    try:
        assert n.manager.registrations == 0
        kubelet.start()
        kubelet.registrations.get(timeout=PROMPT_S)
    finally:
        stop_node(n)
        kubelet.stop()


def remove_directory(path: Path) -> None:
    """rmtree, again while the plugin (seeing its socket go) re-creates it in the directory."""
    deadline = time.monotonic() + TIMEOUT
    while path.exists():
        assert time.monotonic() < deadline, f"{path} cannot be removed"
        shutil.rmtree(path, ignore_errors=True)


def test_kubelet_directory_absent_at_start(node_config: NodeConfig, kubelet_dir: Path) -> None:
    kubelet_dir.rmdir()
    n = start_node(node_config, fallback_poll_s=60.0)
    kubelet = FakeKubelet(kubelet_dir)
    try:
        kubelet_dir.mkdir()  # seen through the parent's watch
        kubelet.start()
        kubelet.registrations.get(timeout=PROMPT_S)
        assert n.manager.wait_registered(0, TIMEOUT)
    finally:
        stop_node(n)
        kubelet.stop()
    assert not node_config.socket_path.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads inotify watches from /proc")
def test_the_kubelet_directory_watches_ask_inotify_for_no_reads_opens_or_closes(
    node_config: NodeConfig, kubelet_dir: Path
) -> None:
    # Issue 29: every daemon watches the kubelet directory's parent; with opens and closes asked for, each
    # listing of any entry woke them all (a scale-mode process of 250 daemons timed Allocates out).
    kubelet = FakeKubelet(kubelet_dir).start()
    n = start_node(node_config, fallback_poll_s=60.0)
    try:
        kubelet.registrations.get(timeout=TIMEOUT)
        for directory in (kubelet_dir, kubelet_dir.parent):
            masks = wait_for(lambda d=directory: inotify_masks(d), what=f"a watch on {directory}")
            assert all(mask & READS_AND_CLOSES == 0 for mask in masks), (directory, [hex(m) for m in masks])
    finally:
        stop_node(n)
        kubelet.stop()


def test_kubelet_directory_removed_and_created_again(node_config: NodeConfig, kubelet_dir: Path) -> None:
    kubelet = FakeKubelet(kubelet_dir).start()
    n = start_node(node_config, fallback_poll_s=60.0)
    try:
        kubelet.registrations.get(timeout=TIMEOUT)
        assert n.manager.wait_registered(0, TIMEOUT)
        kubelet.stop()
        remove_directory(kubelet_dir)  # the directory's own watch dies with it
        kubelet_dir.mkdir()
        kubelet.start()
        kubelet.registrations.get(timeout=TIMEOUT)  # seen through the parent's watch
        assert n.manager.wait_registered(1, TIMEOUT)
        assert node_config.socket_path.exists()
    finally:
        stop_node(n)
        kubelet.stop()


def test_our_socket_removed_serves_again(node: Node, kubelet: FakeKubelet) -> None:
    kubelet.registrations.get(timeout=TIMEOUT)
    node.config.socket_path.unlink()
    kubelet.registrations.get(timeout=TIMEOUT)
    assert node.config.socket_path.exists()


def test_registration_failures_are_retried(node_config: NodeConfig, kubelet: FakeKubelet) -> None:
    kubelet.reject = ["kubelet is busy", "kubelet is still busy"]
    n = start_node(node_config)
    try:
        kubelet.registrations.get(timeout=TIMEOUT)
        assert kubelet.reject == []
        assert n.manager.wait_registered(0, TIMEOUT)
        assert n.manager.registrations == 1
    finally:
        stop_node(n)


# --- the parts on their own -----------------------------------------------------------------------------


def test_register_reports_what_failed(node_config: NodeConfig, kubelet: FakeKubelet) -> None:
    state = DeviceState(node_config)
    server = PluginServer(node_config, state, MemoryPods("node-a"))
    with pytest.raises(RegistrationError, match=r"the plugin is not serving: .* does not exist"):
        check_serving(node_config.socket_path, timeout_s=0.2)
    server.start()
    try:
        kubelet.reject = ["nope"]
        with pytest.raises(RegistrationError, match=r"refused to register nvidia.com/gpu.*UNAVAILABLE: nope"):
            register(kubelet.socket, node_config.socket_path, "nvidia.com/gpu")
        register(kubelet.socket, node_config.socket_path, "nvidia.com/gpu")
        registration = kubelet.registrations.get(timeout=TIMEOUT)
        assert registration.request.endpoint == node_config.socket_name
        with pytest.raises(RegistrationError, match=r"kubelet is not serving: .*gone\.sock does not exist"):
            register(node_config.kubelet_dir / "gone.sock", node_config.socket_path, "nvidia.com/gpu")
    finally:
        server.stop()


def test_every_connection_registration_opens_starts_with_the_http2_preface(node_config: NodeConfig) -> None:
    state = DeviceState(node_config)
    server = PluginServer(node_config, state, MemoryPods("node-a"))
    directory = node_config.kubelet_dir
    kubelet = FakeKubelet(directory, socket_name="real-kubelet.sock")
    server.start()
    kubelet.start()
    plugin_front = PrefaceRecorder(directory / "front.sock", node_config.socket_path)
    kubelet_front = PrefaceRecorder(directory / "kubelet.sock", kubelet.socket)
    try:
        register(kubelet_front.path, plugin_front.path, "nvidia.com/gpu")
        registration = kubelet.registrations.get(timeout=TIMEOUT)
        assert registration.request.endpoint == "front.sock"  # kubelet's dial-back went through it too
        assert registration.next_update() is not None
    finally:
        kubelet.stop()
        plugin_front.close()
        kubelet_front.close()
        server.stop()
    assert kubelet_front.first_bytes and plugin_front.first_bytes
    for head in kubelet_front.first_bytes + plugin_front.first_bytes:
        assert head == HTTP2_PREFACE, f"a connection that is not HTTP/2 began with {head!r}"


def test_a_socket_nothing_listens_on_is_reported_after_the_deadline(node_config: NodeConfig) -> None:
    stale = node_config.kubelet_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stale))  # the file stays, nothing listens: what a crashed server leaves behind
    with pytest.raises(
        RegistrationError,
        match=r"the plugin is not serving: nothing accepted a connection on .*stale\.sock within 0\.3 s",
    ):
        check_serving(stale, timeout_s=0.3)
    server = PluginServer(node_config, DeviceState(node_config), MemoryPods("node-a"))
    server.start()
    try:
        with pytest.raises(
            RegistrationError,
            match=r"kubelet is not serving: nothing accepted a connection on .*stale\.sock within 0\.3 s "
            r"\(waited to call Register\)",
        ):
            register(stale, node_config.socket_path, "nvidia.com/gpu", register_timeout_s=0.3)
        not_a_socket = node_config.kubelet_dir / "plain-file"
        not_a_socket.write_text("")
        with pytest.raises(RegistrationError, match=r"kubelet is not serving: .*plain-file is not a socket"):
            register(not_a_socket, node_config.socket_path, "nvidia.com/gpu")
    finally:
        server.stop()


def test_server_cannot_bind_a_missing_directory(short_dir: Path, node_config: NodeConfig) -> None:
    config = replace(node_config, kubelet_dir=short_dir / "missing")
    server = PluginServer(config, DeviceState(config), MemoryPods("node-a"))
    with pytest.raises(PluginServerError, match="cannot serve on"):
        server.start()
    assert not server.serving
