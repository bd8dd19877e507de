"""Smoke test of the generated Device Plugin stubs over real gRPC on real Unix sockets."""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from hami_node.plugin.api import api_pb2, api_pb2_grpc, constants

TIMEOUT = 10.0


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """A trivial device plugin: two ListAndWatch updates, Allocate echoes what it was asked."""

    def __init__(self) -> None:
        self.stream_ended = threading.Event()

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        done = threading.Event()
        context.add_callback(done.set)
        try:
            topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)])
            yield api_pb2.ListAndWatchResponse(
                devices=[
                    api_pb2.Device(ID="GPU-a", health=constants.HEALTHY, topology=topology),
                    api_pb2.Device(ID="GPU-b", health=constants.HEALTHY),
                ]
            )
            yield api_pb2.ListAndWatchResponse(
                devices=[
                    api_pb2.Device(ID="GPU-a", health=constants.HEALTHY, topology=topology),
                    api_pb2.Device(ID="GPU-b", health=constants.UNHEALTHY),
                ]
            )
            # Like a real plugin, keep the stream open until the kubelet side goes away.
            done.wait(TIMEOUT)
        finally:
            self.stream_ended.set()

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            ids = ",".join(container.devices_ids)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": ids},
                    mounts=[api_pb2.Mount(container_path="/usr/lib/x", host_path="/opt/x", read_only=True)],
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw"
                        )
                    ],
                    annotations={"example.com/ids": ids},
                    cdi_devices=[
                        api_pb2.CDIDevice(name=f"example.com/gpu={i}") for i in container.devices_ids
                    ],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """Kubelet's Registration service: like kubelet, dial the plugin back before answering."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.registrations: queue.Queue[tuple[api_pb2.RegisterRequest, api_pb2.DevicePluginOptions]] = (
            queue.Queue()
        )

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        if request.version not in constants.SUPPORTED_VERSIONS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        target = f"unix://{self.socket_dir / request.endpoint}"
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
            options = api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                api_pb2.Empty(), timeout=TIMEOUT
            )
        self.registrations.put((request, options))
        return api_pb2.Empty()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A short path of our own: Unix socket paths are limited to ~107 bytes.
    path = Path(tempfile.mkdtemp(prefix="hami-dp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_server(socket_path: Path) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port(f"unix://{socket_path}")
    assert port == 1, f"could not bind {socket_path}"
    return server


@pytest.fixture
def plugin(socket_dir: Path) -> Iterator[tuple[FakePlugin, Path]]:
    socket_path = socket_dir / "hami-test.sock"
    servicer = FakePlugin()
    server = start_server(socket_path)
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
    server.start()
    try:
        yield servicer, socket_path
    finally:
        server.stop(grace=None).wait(TIMEOUT)


@pytest.fixture
def plugin_channel(plugin: tuple[FakePlugin, Path]) -> Iterator[grpc.Channel]:
    _, socket_path = plugin
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
        yield channel


def test_get_device_plugin_options(plugin_channel: grpc.Channel) -> None:
    stub = api_pb2_grpc.DevicePluginStub(plugin_channel)
    options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=TIMEOUT)
    assert options == api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


def test_list_and_watch_streams_updates(
    plugin: tuple[FakePlugin, Path], plugin_channel: grpc.Channel
) -> None:
    servicer, _ = plugin
    stub = api_pb2_grpc.DevicePluginStub(plugin_channel)
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=TIMEOUT)
    try:
        first = next(stream)
        second = next(stream)
    finally:
        stream.cancel()
    assert [(d.ID, d.health) for d in first.devices] == [
        ("GPU-a", constants.HEALTHY),
        ("GPU-b", constants.HEALTHY),
    ]
    assert [n.ID for n in first.devices[0].topology.nodes] == [0]
    assert not first.devices[1].HasField("topology")
    assert [(d.ID, d.health) for d in second.devices] == [
        ("GPU-a", constants.HEALTHY),
        ("GPU-b", constants.UNHEALTHY),
    ]
    assert servicer.stream_ended.wait(TIMEOUT), "server stream did not see the client cancel"


def test_allocate_returns_envs_mounts_and_cdi_devices(plugin_channel: grpc.Channel) -> None:
    stub = api_pb2_grpc.DevicePluginStub(plugin_channel)
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-a", "GPU-b"])]
    )
    response = stub.Allocate(request, timeout=TIMEOUT)
    assert len(response.container_responses) == 1
    container = response.container_responses[0]
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert dict(container.annotations) == {"example.com/ids": "GPU-a,GPU-b"}
    assert [(m.container_path, m.host_path, m.read_only) for m in container.mounts] == [
        ("/usr/lib/x", "/opt/x", True)
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw")
    ]
    assert [c.name for c in container.cdi_devices] == ["example.com/gpu=GPU-a", "example.com/gpu=GPU-b"]


def test_unimplemented_rpc_reports_unimplemented(plugin_channel: grpc.Channel) -> None:
    stub = api_pb2_grpc.DevicePluginStub(plugin_channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=["GPU-a"]),
            timeout=constants.KUBELET_PRESTART_CONTAINER_RPC_TIMEOUT_SECONDS,
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_register_with_kubelet_socket(socket_dir: Path, plugin: tuple[FakePlugin, Path]) -> None:
    _, plugin_socket = plugin
    kubelet = FakeKubelet(socket_dir)
    kubelet_socket = socket_dir / Path(constants.KUBELET_SOCKET).name
    server = start_server(kubelet_socket)
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
            options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)
            reply = api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=constants.VERSION,
                    endpoint=plugin_socket.name,
                    resource_name="example.com/gpu",
                    options=options,
                ),
                timeout=TIMEOUT,
            )
            assert reply == api_pb2.Empty()
            with pytest.raises(grpc.RpcError) as caught:
                api_pb2_grpc.RegistrationStub(channel).Register(
                    api_pb2.RegisterRequest(version="v1alpha", endpoint=plugin_socket.name),
                    timeout=TIMEOUT,
                )
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(grace=None).wait(TIMEOUT)
    request, dialled_options = kubelet.registrations.get(timeout=TIMEOUT)
    assert request.version == "v1beta1"
    assert request.endpoint == "hami-test.sock"
    assert request.resource_name == "example.com/gpu"
    assert request.options == options
    assert dialled_options == options
    assert kubelet.registrations.empty()
