"""A small scriptable device plugin for the kubelet stand-in's tests: a real gRPC server on a real
Unix socket (sync grpc, its own threads), recording every call it gets."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from hami_node.plugin.api import api_pb2, api_pb2_grpc, constants

TIMEOUT = 10.0
_END = object()


def devices(
    *ids: str, unhealthy: Sequence[str] = (), numa: dict[str, int] | None = None
) -> list[api_pb2.Device]:
    result = []
    for device_id in ids:
        device = api_pb2.Device(
            ID=device_id, health=constants.UNHEALTHY if device_id in unhealthy else constants.HEALTHY
        )
        if numa and device_id in numa:
            device.topology.nodes.append(api_pb2.NUMANode(ID=numa[device_id]))
        result.append(device)
    return result


@dataclass
class Calls:
    options: list[float] = field(default_factory=list)
    allocate: list[list[list[str]]] = field(default_factory=list)
    preferred: list[tuple[list[str], list[str], int]] = field(default_factory=list)
    pre_start: list[list[str]] = field(default_factory=list)


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """Serves `resource` on `<directory>/<endpoint>`; `set_devices` pushes a full list to open streams."""

    def __init__(
        self,
        directory: Path,
        endpoint: str = "fake.sock",
        *,
        preferred: bool = False,
        pre_start: bool = False,
        initial: Sequence[api_pb2.Device] = (),
    ) -> None:
        self.directory = directory
        self.endpoint = endpoint
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        self.calls = Calls()
        self.options_called = threading.Event()
        self.allocate_error: str | None = None
        self.pre_start_error: str | None = None
        self.prefer: Callable[[list[str], list[str], int], list[str]] = lambda avail, must, size: list(
            reversed(avail)
        )[:size]
        self.empty_allocate = False
        self.allocate_entered = threading.Event()
        self.allocate_gate: threading.Event | None = None
        """When set, Allocate waits for this event before it answers."""
        self._devices = list(initial)
        self._streams: list[queue.Queue[object]] = []
        self._lock = threading.Lock()
        self.streams_opened = threading.Semaphore(0)
        self.server: grpc.Server | None = None

    # --- server side -------------------------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        import time

        self.calls.options.append(time.monotonic())
        self.options_called.set()
        return self.options

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        stream: queue.Queue[object] = queue.Queue()
        with self._lock:
            self._streams.append(stream)
            stream.put(list(self._devices))
        context.add_callback(lambda: stream.put(_END))
        self.streams_opened.release()
        try:
            while True:
                item = stream.get(timeout=60)
                if item is _END:
                    return
                assert isinstance(item, list)
                yield api_pb2.ListAndWatchResponse(devices=item)
        finally:
            with self._lock:
                self._streams.remove(stream)

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        answers = []
        for c in request.container_requests:
            avail, must = list(c.available_deviceIDs), list(c.must_include_deviceIDs)
            self.calls.preferred.append((avail, must, c.allocation_size))
            answers.append(
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=self.prefer(avail, must, c.allocation_size)
                )
            )
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        self.calls.allocate.append([list(c.devices_ids) for c in request.container_requests])
        self.allocate_entered.set()
        if self.allocate_gate is not None:
            self.allocate_gate.wait(TIMEOUT)
        if self.allocate_error is not None:
            context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        if self.empty_allocate:
            return api_pb2.AllocateResponse()
        responses = [
            api_pb2.ContainerAllocateResponse(
                envs={"FAKE_DEVICES": ",".join(c.devices_ids), "FAKE_COUNT": str(len(c.devices_ids))},
                mounts=[api_pb2.Mount(container_path="/fake", host_path="/opt/fake", read_only=True)],
                devices=[
                    api_pb2.DeviceSpec(container_path="/dev/fake0", host_path="/dev/fake0", permissions="rw")
                ],
                annotations={"fake.example.com/ids": ",".join(c.devices_ids)},
            )
            for c in request.container_requests
        ]
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.pre_start.append(list(request.devices_ids))
        if self.pre_start_error is not None:
            context.abort(grpc.StatusCode.UNKNOWN, self.pre_start_error)
        return api_pb2.PreStartContainerResponse()

    # --- test side ---------------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.directory / self.endpoint

    def serve(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        assert server.add_insecure_port(f"unix://{self.socket}") == 1, f"cannot bind {self.socket}"
        server.start()
        self.server = server

    def stop(self) -> None:
        """Stop serving: open ListAndWatch streams end (the kubelet sees the plugin die)."""
        self.end_streams()
        server, self.server = self.server, None
        if server is not None:
            server.stop(grace=None).wait(TIMEOUT)

    def set_devices(self, new: Sequence[api_pb2.Device]) -> None:
        with self._lock:
            self._devices = list(new)
            for stream in self._streams:
                stream.put(list(new))

    def end_streams(self) -> None:
        with self._lock:
            for stream in self._streams:
                stream.put(_END)

    def wait_stream(self) -> None:
        assert self.streams_opened.acquire(timeout=TIMEOUT), "no ListAndWatch stream was opened"

    def register(
        self,
        resource: str = "example.com/dev",
        *,
        version: str = constants.VERSION,
        endpoint: str | None = None,
    ) -> None:
        """Register with the kubelet in `directory` (raises grpc.RpcError when refused)."""
        kubelet_socket = self.directory / "kubelet.sock"
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=version,
                    endpoint=endpoint if endpoint is not None else self.endpoint,
                    resource_name=resource,
                    options=self.options,
                ),
                timeout=30,
            )
