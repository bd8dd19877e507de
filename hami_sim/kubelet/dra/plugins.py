"""Kubelet's DRA plugin manager, as a stand-in (kubernetes pkg/kubelet/cm/dra/plugin/
dra_plugin_manager.go and dra_plugin.go): the registered plugins of each DRA driver, their gRPC
connections, the calls kubelet makes, and the wiping of the node's ResourceSlices.

- Several plugins (endpoints) may be registered for one driver (a rolling update of the driver's
  DaemonSet); a second registration of the same endpoint is refused (`endpoint ... already registered
  for DRA driver plugin ...`). `get` prefers the most recently registered plugin whose connection is up,
  else the most recent one; none at all: `DRA driver X is not registered`.
- Each plugin's connection is watched (kubelet's grpc stats handler: ConnBegin / ConnEnd); a driver none
  of whose plugins is connected is not usable. When a driver becomes unusable, its ResourceSlices on this
  node are deleted after `wiping_delay` (30 s) unless a plugin connects meanwhile.
- At start kubelet deletes every ResourceSlice of the node (no driver has registered yet, and pods
  could be scheduled to devices nobody serves). The deletion is a DELETE of the collection with field
  selectors `spec.nodeName=<node>` (and `spec.driver=<driver>`), after the Node was read, retried with
  backoff (1 s doubling, jitter 0.2, capped at 5 min, 100 tries); NotFound for the collection is done.
- NodePrepareResources / NodeUnprepareResources go to the service chosen at registration
  (`v1.DRAPlugin` or `v1beta1.DRAPlugin`; a v1beta1 answer has no share IDs), each with a 45 s deadline
  (defaultClientCallTimeout). Failures read as grpc-go prints them (`rpc error: code = ... desc = ...`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import grpc

from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2 as v1beta1_pb2
from hami_node.dra.api.v1beta1 import api_pb2_grpc as v1beta1_grpc
from hami_sim.kubelet.devicemanager import PluginCallFailed, call_plugin
from hami_sim.kubelet.dra.checkpoint import PreparedDevice
from hami_sim.kubelet.dra.registration import V1_SERVICE, V1BETA1_SERVICE, RegistrationRefused

log = logging.getLogger(__name__)

_T = TypeVar("_T")

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
WIPE_RETRY = RetryPolicy(initial=1.0, maximum=300.0, factor=2.0, jitter=0.2)
"""dra_plugin_manager.go wipeResourceSlices' backoff (1 s, factor 2, jitter 0.2, cap 5 min)."""
WIPE_ATTEMPTS = 100

PLUGIN_CHANNEL_OPTIONS = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
)
"""The connection to a plugin's DRA socket: reconnects on its own (as kubelet asks gRPC to after
ConnEnd), backing off to 5 s (gRPC's default, which kubelet keeps, grows to 2 min)."""

_STUBS: Mapping[str, tuple[ModuleType, Callable[[grpc.aio.Channel], Any]]] = {
    V1_SERVICE: (v1_pb2, v1_grpc.DRAPluginStub),
    V1BETA1_SERVICE: (v1beta1_pb2, v1beta1_grpc.DRAPluginStub),
}


class DriverNotRegistered(Exception):
    """`get` found no plugin; the message is kubelet's."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as NodePrepareResources / NodeUnprepareResources name it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PrepareResult:
    """A plugin's answer for one claim."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(eq=False)
class DraPlugin:
    """One registered plugin of a driver."""

    driver: str
    endpoint: str
    service: str
    call_timeout: float
    channel: grpc.aio.Channel
    connected: bool = False
    monitor: asyncio.Task[None] | None = field(default=None, repr=False)

    def _stub(self) -> tuple[ModuleType, Any]:
        module, stub = _STUBS[self.service]
        return module, stub(self.channel)

    async def node_prepare_resources(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources: the plugin's answer per claim UID; raises `PluginCallFailed` (grpc-go's
        text) when the call itself fails."""
        module, stub = self._stub()
        request = module.NodePrepareResourcesRequest(
            claims=[module.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = await call_plugin(
            functools.partial(stub.NodePrepareResources, request, timeout=self.call_timeout)
        )
        return {uid: _prepare_result(answer) for uid, answer in response.claims.items()}

    async def node_unprepare_resources(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: the plugin's error per claim UID ("" for success)."""
        module, stub = self._stub()
        request = module.NodeUnprepareResourcesRequest(
            claims=[module.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = await call_plugin(
            functools.partial(stub.NodeUnprepareResources, request, timeout=self.call_timeout)
        )
        return {uid: str(answer.error) for uid, answer in response.claims.items()}


def _prepare_result(answer: Any) -> PrepareResult:
    devices = []
    for device in answer.devices:
        has_share = "share_id" in type(device).DESCRIPTOR.fields_by_name and device.HasField("share_id")
        devices.append(
            PreparedDevice(
                pool_name=str(device.pool_name),
                device_name=str(device.device_name),
                share_id=str(device.share_id) if has_share else None,
                request_names=tuple(device.request_names),
                cdi_device_ids=tuple(device.cdi_device_ids),
            )
        )
    return PrepareResult(tuple(devices), str(answer.error))


class DraPluginManager:
    """The registered DRA plugins of one node, on the caller's loop. `start()` begins the start-up
    wipe of the node's ResourceSlices; `stop()` closes every connection and cancels pending wipes."""

    def __init__(
        self,
        node_name: str,
        api: KubeApi | None,
        *,
        wiping_delay: float,
        call_timeout: float,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self._api = api
        self.wiping_delay = wiping_delay
        self.call_timeout = call_timeout
        self._on_change = on_change
        self._store: dict[str, list[DraPlugin]] = {}
        self._pending_wipes: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._rng = random.Random()
        self._wipes = itertools.count(1)
        self.wiped: list[str] = []
        """Drivers whose slices were deleted, in order ("" = all of the node's), for tests and logs."""

    # ------------------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Kubelet's start: delete all of the node's ResourceSlices, in the background."""
        self._background(self._wipe(""), "wipe-all")

    async def stop(self) -> None:
        for task in [*self._pending_wipes.values(), *self._tasks]:
            task.cancel()
        for task in [*self._pending_wipes.values(), *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pending_wipes.clear()
        self._tasks.clear()
        plugins = [p for ps in self._store.values() for p in ps]
        self._store.clear()
        for plugin in plugins:
            await self._close(plugin)

    def _background(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"dra-{self.node_name}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------ registry

    def add(self, driver: str, endpoint: str, service: str) -> DraPlugin:
        """RegisterPlugin's `add`: a new plugin for `driver`; its connection starts at once."""
        plugins = self._store.setdefault(driver, [])
        if any(p.endpoint == endpoint for p in plugins):
            raise RegistrationRefused(
                f"endpoint {endpoint} already registered for DRA driver plugin {driver}"
            )
        channel = grpc.aio.insecure_channel(f"unix://{endpoint}", options=PLUGIN_CHANNEL_OPTIONS)
        plugin = DraPlugin(driver, endpoint, service, self.call_timeout, channel)
        plugins.append(plugin)
        plugin.monitor = asyncio.get_running_loop().create_task(
            self._monitor(plugin), name=f"dra-{self.node_name}-conn-{driver}"
        )
        log.info(
            "node %s: registered DRA plugin %s at %s (%s, %d plugin(s))",
            self.node_name,
            driver,
            endpoint,
            service,
            len(plugins),
        )
        self._sync(driver)
        return plugin

    async def remove(self, driver: str, endpoint: str) -> None:
        """DeRegisterPlugin: forget the plugin of `driver` at `endpoint` and close its connection."""
        plugins = self._store.get(driver, [])
        plugin = next((p for p in plugins if p.endpoint == endpoint), None)
        if plugin is None:
            return
        plugins.remove(plugin)
        if not plugins:
            del self._store[driver]
        log.info("node %s: unregistered DRA plugin %s at %s", self.node_name, driver, endpoint)
        self._sync(driver)
        await self._close(plugin)

    async def _close(self, plugin: DraPlugin) -> None:
        monitor, plugin.monitor = plugin.monitor, None
        if monitor is not None:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
        await plugin.channel.close(None)

    def get(self, driver: str) -> DraPlugin:
        """GetPlugin: the newest connected plugin of `driver`, else its newest one."""
        if not driver:
            raise DriverNotRegistered("DRA driver name is empty")
        plugins = self._store.get(driver)
        if not plugins:
            raise DriverNotRegistered(f"DRA driver {driver} is not registered")
        for plugin in reversed(plugins):
            if plugin.connected:
                return plugin
        return plugins[-1]

    def plugins(self) -> dict[str, list[DraPlugin]]:
        """Every registered plugin per driver, oldest first."""
        return {driver: list(plugins) for driver, plugins in self._store.items()}

    def pending_wipes(self) -> set[str]:
        """Drivers whose ResourceSlices will be deleted when their wiping delay runs out."""
        return set(self._pending_wipes)

    def usable(self, driver: str) -> bool:
        """Whether a plugin of `driver` is connected."""
        return any(p.connected for p in self._store.get(driver, ()))

    async def _monitor(self, plugin: DraPlugin) -> None:
        """Follow the plugin's connection; gRPC reconnects on its own when asked (`try_to_connect`)."""
        channel = plugin.channel
        state = channel.get_state(try_to_connect=True)
        while True:
            connected = state is grpc.ChannelConnectivity.READY
            if connected != plugin.connected:
                plugin.connected = connected
                log.info(
                    "node %s: DRA plugin %s at %s %s",
                    self.node_name,
                    plugin.driver,
                    plugin.endpoint,
                    "connected" if connected else "disconnected",
                )
                self._sync(plugin.driver)
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    # ------------------------------------------------------------------------------ wiping

    def _sync(self, driver: str) -> None:
        """After any change of a driver's plugins: cancel its pending wipe when it is usable, else make
        sure one is pending (an earlier one keeps its time)."""
        if self._on_change is not None:
            self._on_change()
        if self._api is None:
            return
        if self.usable(driver):
            pending = self._pending_wipes.pop(driver, None)
            if pending is not None:
                pending.cancel()
            return
        if driver in self._pending_wipes:
            return
        task = asyncio.get_running_loop().create_task(
            self._delayed_wipe(driver), name=f"dra-{self.node_name}-wipe-{driver}"
        )
        self._pending_wipes[driver] = task

    async def _delayed_wipe(self, driver: str) -> None:
        try:
            await asyncio.sleep(self.wiping_delay)
            log.info(
                "node %s: no plugin of DRA driver %s connected for %.0f s: deleting its ResourceSlices",
                self.node_name,
                driver,
                self.wiping_delay,
            )
            await self._wipe(driver)
        finally:
            if self._pending_wipes.get(driver) is asyncio.current_task():
                del self._pending_wipes[driver]

    async def _wipe(self, driver: str) -> None:
        """wipeResourceSlices: read the Node (retry while it does not exist), then DELETE the collection
        of its slices (of `driver`, or all); retry with backoff until it worked."""
        api = self._api
        if api is None:
            return
        selector = f"spec.nodeName={self.node_name}" + (f",spec.driver={driver}" if driver else "")
        for attempt in range(1, WIPE_ATTEMPTS + 1):
            try:
                await api.get(f"/api/v1/nodes/{self.node_name}")
            except KubeApiError as exc:
                if exc.status != 404:
                    log.warning("node %s: cannot read the Node before wiping slices: %s", self.node_name, exc)
            else:
                if await self._delete_slices(api, selector):
                    self.wiped.append(driver)
                    return
            await asyncio.sleep(WIPE_RETRY.delay(attempt, self._rng))

    async def _delete_slices(self, api: KubeApi, selector: str) -> bool:
        try:
            await api.request("DELETE", RESOURCE_SLICES, params={"fieldSelector": selector})
        except KubeApiError as exc:
            if exc.status == 404:
                log.debug("node %s: no ResourceSlices to delete (%s)", self.node_name, exc)
                return True
            log.info(
                "node %s: deleting ResourceSlices (%s) failed, retrying: %s", self.node_name, selector, exc
            )
            return False
        log.info("node %s: deleted ResourceSlices (%s)", self.node_name, selector)
        return True


async def call_prepare(plugin: DraPlugin, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
    """`plugin.node_prepare_resources`, its failure as kubelet words it."""
    return await _call("NodePrepareResources", plugin.node_prepare_resources(claims))


async def call_unprepare(plugin: DraPlugin, claims: Sequence[ClaimRef]) -> dict[str, str]:
    return await _call("NodeUnprepareResources", plugin.node_unprepare_resources(claims))


class PluginRpcFailed(Exception):
    """A NodePrepareResources / NodeUnprepareResources call failed: `<method>: rpc error: ...`."""


async def _call(method: str, call: Awaitable[_T]) -> _T:
    try:
        return await call
    except PluginCallFailed as exc:
        raise PluginRpcFailed(f"{method}: {exc}") from None
