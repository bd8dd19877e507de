"""One vendor device-plugin stand-in: the I/O around `hami_sim.vendors.inventory` and `.allocate`, all on
the caller's asyncio loop (so many can share one loop: `hami_sim.nodehost` hosts them in scale mode).

- At start: the node's devices from the fake device list (`DeviceSpec`); the Node's inventory
  annotations and labels written (a merge patch, retried until the kubelet stand-in has created the
  Node), as the plugins' register loops do, and again every `register_period_s` (HAMi's plugins: 30 s);
- one DevicePlugin gRPC server per resource on `<kubelet dir>/<socket>-<resource>.sock`
  (grpc.aio): GetDevicePluginOptions answers no PreStartContainer and no GetPreferredAllocation (none
  of the plugins offers it), ListAndWatch sends the advertised devices once and holds the stream until
  the stand-in stops, Allocate is `VendorPlugin.allocate`;
- each resource registered with the kubelet (`Registration.Register` on kubelet.sock, v1beta1), again
  whenever kubelet.sock is created anew (a kubelet restart; polled every second);
- Allocate: one GET of the Node (its lock annotation) and one LIST of the node's pods, the pod picked
  and the container answered by the pure code, then the pod patched (merge patches: the plugin's
  annotations, then `hami.io/bind-phase`) and HAMi's node lock released when it names the pod. Requests
  are served one at a time. A failure answers gRPC UNKNOWN with the plugin's message.

Everything goes through `hami_kube.client.KubeApi` (the one Kubernetes layer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from hami_kube.client import KubeApi, PatchType, component_user_agent
from hami_kube.errors import KubeApiError
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.api.constants import VERSION
from hami_node.plugin.registration import CHANNEL_OPTIONS
from hami_sim.vendors import READY_MARKER
from hami_sim.vendors import allocate as alloc
from hami_sim.vendors.inventory import Device, advertised, node_devices, node_metadata
from hami_sim.vendors.table import MUTEX_LOCK, DeviceSpec, Flow

log = logging.getLogger(__name__)

USER_AGENT_COMPONENT = "hami-sim-vendor-plugin"
REGISTER_PERIOD_S = 30.0
"""HAMi's plugins write their inventory every 30 s (watchAndRegister / WatchAndRegister)."""
KUBELET_POLL_S = 1.0
START_TIMEOUT_S = 60.0
REGISTER_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    kubelet_dir: Path
    devices: DeviceSpec
    kubeconfig: Path | None = None
    register_period_s: float = REGISTER_PERIOD_S

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    def socket_for(self, resource: str) -> Path:
        suffix = resource.rsplit("/", 1)[-1].replace(".", "-")
        base = self.devices.name(self.devices.table.socket or self.devices.vendor)
        return self.kubelet_dir / f"{base}-{suffix}.sock"


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, plugin: VendorPlugin, resource: str) -> None:
        self._plugin = plugin
        self._resource = resource

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        ids = self._plugin.advertised[self._resource]
        yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health="Healthy") for i in ids])
        await self._plugin.stopping.wait()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreferredAllocationResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not supported")
        raise AssertionError("unreachable")  # abort raises

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        try:
            return await self._plugin.allocate(self._resource, request)
        except alloc.AllocateFailed as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
            raise AssertionError("unreachable") from None

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def to_proto(answer: alloc.Answer) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(answer.envs),
        mounts=[api_pb2.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in answer.mounts],
        devices=[
            api_pb2.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in answer.devices
        ],
    )


def lock_holder(value: str | None) -> str:
    """`<ns>/<pod>` of HAMi's node lock `<time>,<ns>,<pod>` ("" for none or another form)."""
    parts = (value or "").split(",")
    return f"{parts[1]}/{parts[2]}" if len(parts) == 3 and parts[1] and parts[2] else ""


class VendorPlugin:
    """`await start()`, `await stop()`. A given `api` is shared, not closed; one made from the
    kubeconfig is owned."""

    def __init__(self, config: PluginConfig, api: KubeApi | None = None) -> None:
        self.config = config
        self.spec = config.devices
        self.devices: tuple[Device, ...] = node_devices(config.node_name, config.devices)
        self.advertised: dict[str, tuple[str, ...]] = advertised(config.devices, self.devices)
        self.stopping = asyncio.Event()
        self._api = api
        self._owns_api = False
        self._servers: dict[str, grpc.aio.Server] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self._consumed: dict[str, int] = {}
        """`Flow.ALLOCATED`: containers done per pod uid."""
        self._dsmlu: dict[str, tuple[alloc.Answer, int]] = {}
        """Cambricon: the answer and sMLU instance of the pod whose first Allocate came (dynamicSmlu)."""
        self._instances = 0
        self.allocations = 0
        """Allocate calls answered (for tests)."""

    @property
    def name(self) -> str:
        return f"{self.spec.table.key} plugin of node {self.config.node_name}"

    # --- life cycle -----------------------------------------------------------------------------------

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Write the inventory, serve every resource and register it; raises `OSError`/`KubeApiError`/
        `TimeoutError` when that cannot be done within `timeout_s` (everything started is stopped)."""
        try:
            if self._api is None:
                self._api = await KubeApi.connect(
                    self.config.kubeconfig, user_agent=component_user_agent(USER_AGENT_COMPONENT)
                )
                self._owns_api = True
            async with asyncio.timeout(timeout_s):
                await self._write_inventory(retry=True)
                for resource in self.advertised:
                    await self._serve(resource)
                await self._register_all(retry=True)
        except BaseException:
            await self.stop()
            raise
        self._tasks.append(asyncio.create_task(self._register_loop(), name=f"{self.name} register"))
        self._tasks.append(asyncio.create_task(self._kubelet_watch(), name=f"{self.name} kubelet watch"))
        log.info(
            "%s: %s: %s",
            READY_MARKER,
            self.name,
            ", ".join(f"{r} x{len(i)}" for r, i in self.advertised.items()),
        )

    async def stop(self) -> None:
        self.stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for resource, server in list(self._servers.items()):
            await server.stop(0.5)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.socket_for(resource))
        self._servers.clear()
        if self._owns_api and self._api is not None:
            await self._api.close()
            self._api = None
            self._owns_api = False

    async def _serve(self, resource: str) -> None:
        path = self.config.socket_for(resource)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self, resource), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._servers[resource] = server

    # --- the Node -------------------------------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise RuntimeError("the plugin is not started")
        return self._api

    async def _write_inventory(self, *, retry: bool) -> None:
        annotations, labels = node_metadata(self.spec, self.devices, datetime.now(UTC))
        if not annotations and not labels:
            return
        metadata: dict[str, Any] = {}
        if annotations:
            metadata["annotations"] = annotations
        if labels:
            metadata["labels"] = labels
        delay = 0.05
        while True:
            try:
                await self.api.patch(f"/api/v1/nodes/{self.config.node_name}", {"metadata": metadata})
                return
            except KubeApiError as exc:
                if not retry or (exc.status not in (0, 404, 409, 429) and exc.status < 500):
                    raise
                log.debug("%s: node inventory not written yet: %s", self.name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _register_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.register_period_s)
            try:
                await self._write_inventory(retry=False)
            except KubeApiError as exc:
                log.warning("%s: writing the inventory failed: %s", self.name, exc)

    # --- the kubelet ----------------------------------------------------------------------------------

    async def _register_all(self, *, retry: bool) -> None:
        for resource in self.advertised:
            delay = 0.05
            while True:
                try:
                    await self._register(resource)
                    break
                except (grpc.aio.AioRpcError, OSError) as exc:
                    if not retry:
                        raise
                    log.debug("%s: registering %s: %s", self.name, resource, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _register(self, resource: str) -> None:
        if not self.config.kubelet_socket.exists():
            raise FileNotFoundError(f"{self.config.kubelet_socket} does not exist")
        request = api_pb2.RegisterRequest(
            version=VERSION,
            endpoint=self.config.socket_for(resource).name,
            resource_name=resource,
            options=api_pb2.DevicePluginOptions(),
        )
        async with grpc.aio.insecure_channel(
            f"unix://{self.config.kubelet_socket}", options=CHANNEL_OPTIONS
        ) as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                request, timeout=REGISTER_TIMEOUT_S, wait_for_ready=True
            )
        log.info("%s: registered %s with the kubelet", self.name, resource)

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = self.config.kubelet_socket.stat()
        except OSError:
            return None
        return st.st_ino, st.st_ctime_ns

    async def _kubelet_watch(self) -> None:
        """Register again when kubelet.sock is made anew (a kubelet restart), as the plugins do."""
        seen = self._kubelet_identity()
        while True:
            await asyncio.sleep(KUBELET_POLL_S)
            now = self._kubelet_identity()
            if now is None or now == seen:
                continue
            try:
                for resource in list(self._servers):
                    await self._servers.pop(resource).stop(0.5)
                    await self._serve(resource)  # kubelet's restart deleted every plugin socket
                await self._register_all(retry=False)
                seen = now
            except (grpc.aio.AioRpcError, OSError) as exc:
                log.warning("%s: registering again after a kubelet restart failed: %s", self.name, exc)

    # --- Allocate -------------------------------------------------------------------------------------

    async def allocate(self, resource: str, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Answer the kubelet's Allocate on `resource` (see the module docstring); `AllocateFailed`."""
        async with self._lock:
            responses = []
            for container in request.container_requests:
                answer = await self._allocate_one(resource, list(container.devices_ids))
                responses.append(to_proto(answer))
            self.allocations += 1
            return api_pb2.AllocateResponse(container_responses=responses)

    async def _allocate_one(self, resource: str, ids: list[str]) -> alloc.Answer:
        node_name = self.config.node_name
        table = self.spec.table
        if not alloc.is_primary(self.spec, resource):
            return alloc.Answer()
        try:
            node = await self.api.get(f"/api/v1/nodes/{node_name}")
            listed = await self.api.get(
                "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node_name}"}
            )
        except KubeApiError as exc:
            raise alloc.AllocateFailed(f"get pending pod error: {exc}") from None
        pods = list(listed.get("items") or [])
        lock_value = alloc.annotations_of(node).get(table.lock) if table.lock == MUTEX_LOCK else None
        pod = alloc.pick_pod(
            pods, node_name, self.spec, lock_pod=lock_holder(lock_value), consumed=self._consumed
        )
        uid = alloc.pod_uid(pod)
        if table.flow is Flow.DSMLU:
            return await self._allocate_dsmlu(pod, node, resource, ids)
        try:
            outcome = alloc.allocate_container(
                pod,
                node_name,
                self.spec,
                self.devices,
                resource=resource,
                device_ids=ids,
                node_pods=pods,
                consumed=self._consumed.get(uid, 0),
            )
        except alloc.AllocateFailed as exc:
            log.warning("%s: Allocate for pod %s failed: %s", self.name, alloc.pod_key(pod), exc)
            await self._finish(pod, node, alloc.FAILED)
            raise
        if table.flow is Flow.ALLOCATED:
            self._consumed[uid] = outcome.consumed
        try:
            if outcome.patch:
                await self._patch_pod(pod, outcome.patch)
        except KubeApiError as exc:
            await self._finish(pod, node, alloc.FAILED)
            raise alloc.AllocateFailed(f"erase allocated containers annotation: {exc}") from None
        log.info(
            "%s: Allocate %s: pod %s container %s: %s",
            self.name,
            resource,
            alloc.pod_key(pod),
            outcome.container or "?",
            dict(outcome.answer.envs),
        )
        if outcome.done:
            self._consumed.pop(uid, None)
        if outcome.success:
            await self._finish(pod, node, alloc.SUCCESS)
        return outcome.answer

    async def _allocate_dsmlu(
        self, pod: Mapping[str, Any], node: Mapping[str, Any], resource: str, ids: list[str]
    ) -> alloc.Answer:
        """Cambricon's allocateDynamicSmlu: the first call makes the instance, the second reports it."""
        uid = alloc.pod_uid(pod)
        known = self._dsmlu.pop(uid, None)
        if known is None:
            self._dsmlu.clear()  # cleanDsmluRecord: the map holds one pod
            self._instances += 1
            outcome = alloc.allocate_container(
                pod,
                self.config.node_name,
                self.spec,
                self.devices,
                resource=resource,
                device_ids=ids,
                instance=self._instances,
            )
            self._dsmlu[uid] = (outcome.answer, self._instances)
            return outcome.answer
        answer, instance = known
        try:
            await self._patch_pod(pod, alloc.dsmlu_assigned(pod, instance))
        except KubeApiError as exc:
            raise alloc.AllocateFailed(f"patchPodAnnotation {exc}") from None
        if self.spec.table.lock in alloc.annotations_of(node):
            with contextlib.suppress(KubeApiError):
                await self.api.patch(
                    f"/api/v1/nodes/{self.config.node_name}",
                    {"metadata": {"annotations": {self.spec.table.lock: None}}},
                )
        return answer

    async def _patch_pod(self, pod: Mapping[str, Any], annotations: Mapping[str, str | None]) -> None:
        meta = pod.get("metadata") or {}
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
        await self.api.patch(path, {"metadata": {"annotations": dict(annotations)}}, PatchType.MERGE)

    async def _finish(self, pod: Mapping[str, Any], node: Mapping[str, Any], phase: str) -> None:
        """PodAllocationSuccess / PodAllocationFailed: the bind phase, then HAMi's node lock released
        when it names the pod (nodelock.ReleaseNodeLock)."""
        try:
            await self._patch_pod(pod, alloc.bind_phase(phase))
        except KubeApiError as exc:
            log.error(
                "%s: patching pod %s bind-phase=%s failed: %s", self.name, alloc.pod_key(pod), phase, exc
            )
            return
        table = self.spec.table
        value = alloc.annotations_of(node).get(table.lock) if table.lock == MUTEX_LOCK else None
        if value is not None and lock_holder(value) == alloc.pod_key(pod):
            try:
                await self.api.patch(
                    f"/api/v1/nodes/{self.config.node_name}",
                    {"metadata": {"annotations": {table.lock: None}}},
                )
            except KubeApiError as exc:
                log.error("%s: releasing the node lock failed: %s", self.name, exc)


__all__ = ["READY_MARKER", "PluginConfig", "VendorPlugin", "lock_holder", "to_proto"]
