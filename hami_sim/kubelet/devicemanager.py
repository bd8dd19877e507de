"""Kubelet's device manager, as a stand-in: Registration on `kubelet.sock`, one endpoint per resource
following ListAndWatch, device choice and Allocate per container, PreStartContainer, the checkpoint,
and a kubelet "restart".

Everything runs on one asyncio loop (grpc.aio), so many managers can share a loop; nothing here is
global. The behaviour follows kubelet's pkg/kubelet/cm/devicemanager (see docs/kubelet-standin.md).
Model: device choice and the checkpoint are modelled in `hami_control/protocol_model.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import stat
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from hami_node.plugin.api import api_pb2, api_pb2_grpc, constants
from hami_node.plugin.registration import CHANNEL_OPTIONS
from hami_sim.kubelet import resources as msg
from hami_sim.kubelet.allocation import PodDevices
from hami_sim.kubelet.checkpoint import (
    NO_TOPOLOGY,
    CheckpointEncoder,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from hami_sim.kubelet.config import KubeletConfig

log = logging.getLogger(__name__)


class RegistrationError(Exception):
    """Register refused; the text goes back to the plugin (gRPC code Unknown, as kubelet's Go error)."""


class AllocationError(Exception):
    """Admission-time device failure; the text is kubelet's error (goes into the pod's message)."""


class PreStartError(Exception):
    """PreStartContainer failed; the container cannot start."""


@dataclass(frozen=True)
class ResourceState:
    """One resource as the device manager sees it at a moment."""

    name: str
    devices: tuple[api_pb2.Device, ...]
    healthy: frozenset[str]
    unhealthy: frozenset[str]
    options: api_pb2.DevicePluginOptions | None
    connected: bool
    """An endpoint is registered and its ListAndWatch stream is open."""
    registrations: int
    """Successful Register calls for this resource since the manager was created."""
    updates: int
    """ListAndWatch messages received for this resource since the manager was created."""

    @property
    def capacity(self) -> int:
        return len(self.healthy) + len(self.unhealthy)

    @property
    def allocatable(self) -> int:
        return len(self.healthy)


@dataclass(frozen=True)
class Snapshot:
    generation: int
    resources: Mapping[str, ResourceState]
    allocated: Mapping[str, frozenset[str]]
    """Devices held by pods, per resource."""

    def resource(self, name: str) -> ResourceState | None:
        return self.resources.get(name)


@dataclass(eq=False)
class _Endpoint:
    resource: str
    channel: grpc.aio.Channel | None
    stub: Any
    options: api_pb2.DevicePluginOptions | None
    stopped_at: float | None = None
    task: asyncio.Task[None] | None = None
    expiry: asyncio.TimerHandle | None = None

    async def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.close(None)


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        try:
            await self._manager.register(request)
        except RegistrationError as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return api_pb2.Empty()


def _rpc_error_text(exc: grpc.aio.AioRpcError) -> str:
    return msg.go_rpc_error(exc.code(), exc.details())


class PluginCallFailed(Exception):
    """A device-plugin RPC failed; the text is grpc-go's error, as kubelet quotes it."""


CONNECTION_CLOSING = msg.go_rpc_error(grpc.StatusCode.CANCELLED, "grpc: the client connection is closing")
"""grpc-go's error for a call on a connection closed under it."""

_Response = TypeVar("_Response")


async def call_plugin(start: Callable[[], Awaitable[_Response]]) -> _Response:
    """Start and await one device-plugin RPC.

    When a plugin's ListAndWatch ends, kubelet closes its connection; calls in flight on it fail
    with Canceled, and so they do here. grpc-python instead cancels them, and awaiting a cancelled
    call raises asyncio.CancelledError in the caller, which would end the caller's task (a node's
    pod admission) as if that task had been cancelled. A call started on a closed channel raises
    UsageError. Both become `PluginCallFailed`; the task's own cancellation still propagates.
    """
    try:
        return await start()
    except grpc.aio.AioRpcError as exc:
        raise PluginCallFailed(_rpc_error_text(exc)) from None
    except grpc.aio.UsageError:
        raise PluginCallFailed(CONNECTION_CLOSING) from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        raise PluginCallFailed(CONNECTION_CLOSING) from None


class DeviceManager:
    """One node's device manager. Start it on a running loop; all methods run on that loop."""

    def __init__(self, config: KubeletConfig) -> None:
        self.config = config
        self.directory = Path(config.directory)
        self._server: grpc.aio.Server | None = None
        self._serving_generation = 0
        self._endpoints: dict[str, _Endpoint] = {}
        self._all_devices: dict[str, dict[str, api_pb2.Device]] = {}
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._removed: set[str] = set()
        self._pod_devices = PodDevices()
        self._checkpoint_encoder = CheckpointEncoder()
        self._reuse: dict[str, dict[str, set[str]]] = {}
        self._reserved: dict[str, set[str]] = {}
        self.seed = config.seed if config.seed is not None else zlib.crc32(config.node_name.encode())
        """The seed of the Go map order the device manager walks device sets in."""
        self._rng = random.Random(self.seed)
        self._registrations: dict[str, int] = {}
        self._updates: dict[str, int] = {}
        self._changed: asyncio.Condition | None = None
        self._generation = 0
        self._listeners: list[Callable[[], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.had_checkpoint = False
        """Whether a checkpoint was found at start (kubelet resets the Node's extended resources
        when it was not: ShouldResetExtendedResourceCapacity)."""

    # ------------------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Create the directory (0750), delete stale sockets, load the checkpoint, serve Registration."""
        self._changed = asyncio.Condition()
        created = not self.directory.exists()
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        if created:
            self.directory.chmod(0o750)
        self.had_checkpoint = self.config.checkpoint_path.exists()
        self._load_checkpoint()
        await self._serve()

    async def stop(self) -> None:
        """Stop serving, close every endpoint, remove kubelet.sock. Device state stays in memory."""
        await self._stop_serving()
        await self._close_endpoints()
        for endpoint in self._endpoints.values():
            if endpoint.expiry is not None:
                endpoint.expiry.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.config.kubelet_socket.unlink()

    async def restart(self) -> None:
        """What a kubelet restart does to device plugins: kubelet.sock goes away, every Unix socket in
        the directory is deleted (the checkpoint stays), state is rebuilt from the checkpoint (resources
        come back with no devices until their plugin registers again; pods keep their devices) and
        Registration is served on a fresh kubelet.sock."""
        await self._stop_serving()
        await self._close_endpoints()
        self._endpoints.clear()
        self._all_devices.clear()
        self._healthy.clear()
        self._unhealthy.clear()
        self._reserved.clear()
        self._load_checkpoint()
        self._notify()
        await self._serve()

    async def _serve(self) -> None:
        self._cleanup_sockets()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        socket = self.config.kubelet_socket
        if server.add_insecure_port(f"unix://{socket}") == 0:
            raise OSError(f"cannot listen on {socket}")
        await server.start()
        self._server = server
        self._serving_generation += 1
        log.info("node %s: device manager serving Registration on %s", self.config.node_name, socket)

    async def _stop_serving(self) -> None:
        server, self._server = self._server, None
        self._serving_generation += 1
        if server is not None:
            await server.stop(None)

    async def _close_endpoints(self) -> None:
        for endpoint in list(self._endpoints.values()):
            await endpoint.close()

    def _cleanup_sockets(self) -> None:
        """Kubelet's CleanupPluginDirectory: remove every Unix socket, keep files and directories."""
        for entry in os.scandir(self.directory):
            try:
                if entry.name != constants.CHECKPOINT_FILE and stat.S_ISSOCK(
                    entry.stat(follow_symlinks=False).st_mode
                ):
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue

    def _load_checkpoint(self) -> None:
        path = self.config.checkpoint_path
        if not path.exists():
            return
        try:
            checkpoint = read_checkpoint(path)
        except CheckpointError as exc:
            # As kubelet: "Continue after failing to read checkpoint file. Device allocation info may NOT
            # be up-to-date" (pkg/kubelet/cm/devicemanager/manager.go, Start): nothing of it is used, and
            # the next write replaces it. The error names the file and what is wrong with it.
            log.error(
                "node %s: continue after failing to read the device checkpoint (%s); device allocation "
                "info may not be up-to-date",
                self.config.node_name,
                exc,
            )
            return
        self._pod_devices = PodDevices.from_entries(checkpoint.entries)
        loop = asyncio.get_running_loop()
        for resource in checkpoint.registered_devices:
            # Capacity stays 0 until the plugin registers again (kubelet's stopped endpoints).
            self._healthy[resource] = set()
            self._unhealthy[resource] = set()
            self._all_devices[resource] = {}
            endpoint = _Endpoint(resource, None, None, None, stopped_at=loop.time())
            endpoint.expiry = loop.call_later(self.config.endpoint_stop_grace, self._expire, endpoint)
            self._endpoints[resource] = endpoint

    # ------------------------------------------------------------------------------ registration

    async def register(self, request: api_pb2.RegisterRequest) -> None:
        """Kubelet's Register: check, dial, GetDevicePluginOptions, then install the endpoint."""
        resource = request.resource_name
        log.info(
            "node %s: registration request for %s (endpoint %s)",
            self.config.node_name,
            resource,
            request.endpoint,
        )
        if request.version not in constants.SUPPORTED_VERSIONS:
            raise RegistrationError(msg.unsupported_version(request.version))
        if not msg.is_extended_resource_name(resource):
            raise RegistrationError(msg.invalid_resource_name(resource))
        generation = self._serving_generation
        socket = self.directory / request.endpoint
        # Its own subchannel: a dial that failed earlier (a plugin that restarted) must not leave this
        # one in gRPC's shared reconnect backoff, which grows past a second.
        channel = grpc.aio.insecure_channel(f"unix://{socket}", options=CHANNEL_OPTIONS)
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), self.config.dial_timeout)
            except TimeoutError:
                raise RegistrationError("failed to dial device plugin: context deadline exceeded") from None
            stub = api_pb2_grpc.DevicePluginStub(channel)
            try:
                options = await call_plugin(
                    functools.partial(
                        stub.GetDevicePluginOptions, api_pb2.Empty(), timeout=self.config.rpc_timeout
                    )
                )
            except PluginCallFailed as exc:
                raise RegistrationError(f"failed to get device plugin options: {exc}") from None
            if generation != self._serving_generation:
                raise RegistrationError("kubelet restarted during registration; register again")
        except BaseException:
            await channel.close(None)
            raise
        old = self._endpoints.get(resource)
        endpoint = _Endpoint(resource, channel, stub, options)
        self._endpoints[resource] = endpoint
        self._removed.discard(resource)
        self._registrations[resource] = self._registrations.get(resource, 0) + 1
        endpoint.task = asyncio.create_task(self._follow(endpoint), name=f"listandwatch-{resource}")
        if old is not None:
            # The old stream's end must not touch the new endpoint: it is no longer the current one.
            await old.close()
        log.info("node %s: registered device plugin for %s", self.config.node_name, resource)
        self._notify()

    async def _follow(self, endpoint: _Endpoint) -> None:
        error = "EOF"
        try:
            async for response in endpoint.stub.ListAndWatch(api_pb2.Empty()):
                if self._endpoints.get(endpoint.resource) is not endpoint:
                    return
                self._update_devices(endpoint.resource, response.devices)
        except grpc.aio.AioRpcError as exc:
            error = _rpc_error_text(exc)
        if self._endpoints.get(endpoint.resource) is endpoint:
            log.warning(
                "node %s: listAndWatch ended unexpectedly for device plugin %s with error %s",
                self.config.node_name,
                endpoint.resource,
                error,
            )
            self._disconnected(endpoint)

    def _update_devices(self, resource: str, devices: Sequence[api_pb2.Device]) -> None:
        """A ListAndWatch message fully replaces the resource's devices."""
        all_devices: dict[str, api_pb2.Device] = {}
        healthy: set[str] = set()
        unhealthy: set[str] = set()
        for device in devices:
            all_devices[device.ID] = device
            (healthy if device.health == constants.HEALTHY else unhealthy).add(device.ID)
        healthy -= unhealthy  # a duplicated ID with mixed health counts as unhealthy
        self._all_devices[resource] = all_devices
        self._healthy[resource] = healthy
        self._unhealthy[resource] = unhealthy
        self._updates[resource] = self._updates.get(resource, 0) + 1
        self._write_checkpoint()
        self._notify()

    def _disconnected(self, endpoint: _Endpoint) -> None:
        """Kubelet's PluginDisconnected: every device unhealthy, capacity kept, the grace clock starts."""
        resource = endpoint.resource
        self._unhealthy[resource] = self._unhealthy.get(resource, set()) | self._healthy.get(resource, set())
        self._healthy[resource] = set()
        loop = asyncio.get_running_loop()
        endpoint.stopped_at = loop.time()
        endpoint.task = None
        endpoint.expiry = loop.call_later(self.config.endpoint_stop_grace, self._expire, endpoint)
        channel, endpoint.channel = endpoint.channel, None
        if channel is not None:
            self._background(channel.close(None))
        self._write_checkpoint()
        self._notify()

    def _expire(self, endpoint: _Endpoint) -> None:
        """A stopped endpoint past the grace period: the resource is dropped (capacity written as 0)."""
        resource = endpoint.resource
        if self._endpoints.get(resource) is not endpoint or endpoint.stopped_at is None:
            return
        log.info("node %s: dropping resource %s, its plugin stayed away", self.config.node_name, resource)
        del self._endpoints[resource]
        self._healthy.pop(resource, None)
        self._unhealthy.pop(resource, None)
        self._all_devices.pop(resource, None)
        self._removed.add(resource)
        self._write_checkpoint()
        self._notify()

    # ------------------------------------------------------------------------------ state

    def snapshot(self) -> Snapshot:
        names = set(self._healthy) | set(self._endpoints)
        states = {}
        for name in sorted(names):
            endpoint = self._endpoints.get(name)
            states[name] = ResourceState(
                name=name,
                devices=tuple(self._all_devices.get(name, {}).values()),
                healthy=frozenset(self._healthy.get(name, ())),
                unhealthy=frozenset(self._unhealthy.get(name, ())),
                options=endpoint.options if endpoint is not None else None,
                connected=endpoint is not None and endpoint.stopped_at is None,
                registrations=self._registrations.get(name, 0),
                updates=self._updates.get(name, 0),
            )
        allocated = {k: frozenset(v) for k, v in self._pod_devices.devices().items()}
        return Snapshot(self._generation, states, allocated)

    def capacity(self) -> dict[str, tuple[int, int]]:
        """(capacity, allocatable) per resource, as the node status setter writes them; a resource
        dropped after the grace period reads (0, 0)."""
        result = {name: (0, 0) for name in self._removed}
        for name, healthy in self._healthy.items():
            result[name] = (len(healthy) + len(self._unhealthy.get(name, ())), len(healthy))
        return result

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (on the loop) after every change of devices or allocations."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        self._generation += 1
        for callback in list(self._listeners):
            callback()
        condition = self._changed
        if condition is not None:
            self._background(self._wake(condition))

    def _background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _wake(condition: asyncio.Condition) -> None:
        async with condition:
            condition.notify_all()

    async def wait_for(self, predicate: Callable[[Snapshot], bool], seconds: float) -> Snapshot:
        """Wait until `predicate(snapshot)` holds; TimeoutError after `seconds`."""
        condition = self._changed
        if condition is None:
            raise RuntimeError("the device manager is not started")
        result: list[Snapshot] = []

        def check() -> bool:
            snapshot = self.snapshot()
            if predicate(snapshot):
                result.append(snapshot)
                return True
            return False

        async with condition:
            await asyncio.wait_for(condition.wait_for(check), seconds)
        return result[-1]

    def _write_checkpoint(self) -> None:
        registered = {name: sorted(devices) for name, devices in self._healthy.items()}
        try:
            write_checkpoint(
                self.config.checkpoint_path, self._pod_devices.entries(), registered, self._checkpoint_encoder
            )
        except OSError as exc:
            log.error("node %s: failed to write the device checkpoint: %s", self.config.node_name, exc)

    def is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self._healthy or resource in self._pod_devices.devices()

    def container_devices(self, pod_uid: str, container: str) -> dict[str, tuple[str, ...]]:
        return {
            name: tuple(sorted(held.ids))
            for name, held in self._pod_devices.container_resources(pod_uid, container).items()
        }

    def container_devices_by_numa(
        self, pod_uid: str, container: str
    ) -> dict[str, dict[int, tuple[str, ...]]]:
        """Kubelet's GetDevices(podUID, containerName) as the PodResources API reads it: per resource, the
        container's devices by NUMA node (`NO_TOPOLOGY` for none) as recorded at Allocate, i.e. the
        checkpoint's DeviceIDs. A resource recorded with no device is left out, as kubelet's
        getContainerDevices leaves it out (kubernetes pkg/kubelet/cm/devicemanager/pod_devices.go)."""
        return {
            name: dict(held.device_ids)
            for name, held in self._pod_devices.container_resources(pod_uid, container).items()
            if held.device_ids
        }

    def allocatable_devices(self) -> dict[str, list[api_pb2.Device]]:
        """Kubelet's GetAllocatableDevices: every device a plugin listed that is healthy now, as the
        plugin sent it (topology included), per resource; `allDevices.Filter(healthyDevices)`
        (kubernetes pkg/kubelet/cm/devicemanager/manager.go). A resource whose plugin is gone has no
        healthy device left, so it lists none."""
        return {
            name: [device for device_id, device in self._all_devices[name].items() if device_id in healthy]
            for name, healthy in self._healthy.items()
            if name in self._all_devices
        }

    def pod_response(
        self, pod_uid: str, container: str, resource: str
    ) -> api_pb2.ContainerAllocateResponse | None:
        held = self._pod_devices.container_resources(pod_uid, container).get(resource)
        return None if held is None else held.response

    # ------------------------------------------------------------------------------ pods

    def retain_pods(self, active: Iterable[str]) -> None:
        """Kubelet's UpdateAllocatedDevices: free the devices of every pod not in `active`."""
        keep = set(active)
        gone = self._pod_devices.pods() - keep
        for uid in list(self._reuse):
            if uid not in keep:
                del self._reuse[uid]
        if gone and self._pod_devices.delete(gone):
            self._write_checkpoint()
            self._notify()

    def remove_pod(self, pod_uid: str) -> None:
        self._reuse.pop(pod_uid, None)
        if self._pod_devices.delete([pod_uid]):
            self._write_checkpoint()
            self._notify()

    async def allocate(
        self,
        pod_uid: str,
        container: str,
        limits: Mapping[str, int],
        *,
        init: bool = False,
        restartable: bool = False,
    ) -> None:
        """Kubelet's Allocate(pod, container): for each device-plugin resource in the container's
        limits, choose devices and call the plugin's Allocate (one RPC, one ContainerAllocateRequest).
        Init containers' devices go to the pod's reuse pool (restartable ones keep theirs)."""
        for uid in list(self._reuse):
            if uid != pod_uid:
                del self._reuse[uid]
        reuse = self._reuse.setdefault(pod_uid, {})
        for resource, needed in limits.items():
            if not self.is_device_plugin_resource(resource):
                continue
            await self._allocate_resource(pod_uid, container, resource, needed, reuse.get(resource, set()))
        held = self._pod_devices.container_resources(pod_uid, container)
        for resource, devices in held.items():
            pool = reuse.setdefault(resource, set())
            if init and not restartable:
                pool |= devices.ids
            else:
                pool -= devices.ids

    async def _allocate_resource(
        self, pod_uid: str, container: str, resource: str, required: int, reusable: set[str]
    ) -> None:
        chosen = await self._devices_to_allocate(pod_uid, container, resource, required, reusable)
        if not chosen:
            return
        chosen = self._go_order(chosen)  # kubelet sends allocDevices.UnsortedList()
        try:
            endpoint = self._endpoints.get(resource)
            if endpoint is None:
                raise AllocationError(f"unknown Device Plugin {resource}")
            if endpoint.stopped_at is not None or endpoint.stub is None:
                raise AllocationError(msg.endpoint_stopped(resource))
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            )
            stub = endpoint.stub
            try:
                response = await call_plugin(
                    functools.partial(stub.Allocate, request, timeout=self.config.rpc_timeout)
                )
            except PluginCallFailed as exc:
                raise AllocationError(str(exc)) from None
            if not response.container_responses:
                raise AllocationError(
                    "no containers return in allocation response "
                    "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"
                )
        finally:
            self._reserved.pop(resource, None)
        by_numa: dict[int, list[str]] = {}
        devices = self._all_devices.get(resource, {})
        for device_id in chosen:
            device = devices.get(device_id)
            nodes = [n.ID for n in device.topology.nodes] if device is not None else []
            for numa in nodes or [NO_TOPOLOGY]:
                by_numa.setdefault(numa, []).append(device_id)
        self._pod_devices.insert(
            pod_uid,
            container,
            resource,
            {k: tuple(v) for k, v in by_numa.items()},
            response.container_responses[0],
        )
        self._write_checkpoint()
        self._notify()

    def _go_order(self, devices: Iterable[str]) -> list[str]:
        """The order Go walks a set (a map) of device IDs in: random each time (the runtime starts a
        map iteration at a random bucket and offset), here from the stand-in's seeded RNG."""
        out = sorted(devices)
        self._rng.shuffle(out)
        return out

    async def _devices_to_allocate(
        self, pod_uid: str, container: str, resource: str, required: int, reusable: set[str]
    ) -> list[str]:
        """Kubelet's devicesToAllocate without a topology manager (no NUMA hints): reusable devices of
        the pod's init containers first (any of them, in Go map order, when there are more than
        needed), then the plugin's preferred allocation, then free healthy devices in Go map order
        (kubernetes pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate and its
        allocateRemainingFrom over sets.Set)."""
        needed = required
        existing = self._pod_devices.container_devices(pod_uid, container, resource)
        if existing is not None:
            needed -= len(existing)
            if needed != 0:
                raise AllocationError(
                    f"pod {pod_uid} container {container} changed request for resource {resource} "
                    f"from {len(existing)} to {required}"
                )
        healthy = self._healthy.get(resource)
        if healthy is None:
            raise AllocationError(msg.unregistered_device(resource))
        if not healthy:
            raise AllocationError(msg.no_healthy_devices(resource))
        if existing and not existing <= healthy:
            raise AllocationError(msg.previously_allocated_unhealthy(resource))
        if needed <= 0:
            return []
        chosen: list[str] = []

        def take_from(candidates: Iterable[str]) -> bool:
            nonlocal needed
            for device in candidates:
                if needed == 0:
                    break
                if device not in chosen:
                    chosen.append(device)
                    needed -= 1
            return needed == 0

        if take_from(self._go_order(reusable)):
            return self._reserve(resource, chosen)
        in_use = self._pod_devices.devices().get(resource, set()) | self._reserved.get(resource, set())
        available = self._go_order(d for d in healthy if d not in in_use and d not in chosen)
        if len(available) < needed:
            raise AllocationError(msg.devices_unavailable(resource, needed, len(available)))
        preferred = await self._preferred(resource, available, list(chosen), required)
        allowed = set(available)
        if not take_from(d for d in preferred if d in allowed):
            take_from(self._go_order(available))
        return self._reserve(resource, chosen)

    def _reserve(self, resource: str, chosen: list[str]) -> list[str]:
        self._reserved.setdefault(resource, set()).update(chosen)
        return chosen

    async def _preferred(
        self, resource: str, available: list[str], chosen: list[str], size: int
    ) -> list[str]:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise AllocationError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.get_preferred_allocation_available:
            return []
        if endpoint.stopped_at is not None or endpoint.stub is None:
            error = msg.endpoint_stopped(resource)
            raise AllocationError(f"device plugin GetPreferredAllocation rpc failed with err: {error}")
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=self._go_order([*chosen, *available]),
                    must_include_deviceIDs=self._go_order(chosen),
                    allocation_size=size,
                )
            ]
        )
        stub = endpoint.stub
        try:
            response = await call_plugin(
                functools.partial(stub.GetPreferredAllocation, request, timeout=self.config.rpc_timeout)
            )
        except PluginCallFailed as exc:
            raise AllocationError(
                f"device plugin GetPreferredAllocation rpc failed with err: {exc}"
            ) from None
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def pre_start_container(self, pod_uid: str, container: str) -> None:
        """PreStartContainer for each resource of the container whose plugin asked for it (30 s)."""
        for resource, held in self._pod_devices.container_resources(pod_uid, container).items():
            endpoint = self._endpoints.get(resource)
            if endpoint is None:
                raise PreStartError(f"endpoint not found in cache for a registered resource: {resource}")
            if endpoint.options is None or not endpoint.options.pre_start_required:
                continue
            if endpoint.stopped_at is not None or endpoint.stub is None:
                error = msg.endpoint_stopped(resource)
            else:
                request = api_pb2.PreStartContainerRequest(devices_ids=sorted(held.ids))
                stub = endpoint.stub
                try:
                    await call_plugin(
                        functools.partial(
                            stub.PreStartContainer, request, timeout=self.config.pre_start_timeout
                        )
                    )
                    continue
                except PluginCallFailed as exc:
                    error = str(exc)
            raise PreStartError(f"device plugin PreStartContainer rpc failed with err: {error}")
