"""Kubelet's PodResources API v1 (`v1.PodResourcesLister`), served by the stand-in on
`<dir>/pod-resources/kubelet.sock` with what its device manager recorded.

What kubelet does, and where it says so (kubernetes, read at pkg/kubelet):

- `List` (apis/podresources/server_v1.go): the active pods (`GetActivePods`: admitted, not terminal,
  kubelet.go and kubelet_pods.go `filterOutInactivePods`), after `UpdateAllocatedDevices`. Per pod its
  restartable init containers (sidecars) then its app containers, in spec order; plain init containers
  are not listed. Per container, `GetDevices(podUID, containerName)`.
- `Get`: the pod of that namespace and name known to kubelet (`podManager.GetPodByName`, terminal pods
  included), listed as in `List`; an unknown pod is the plain Go error
  `pod <name> in namespace <namespace> not found`, which gRPC sends as code Unknown.
- `GetAllocatableResources`: `GetAllocatableDevices`, the healthy devices of every resource.
- Devices are converted by cm/container_manager.go `containerDevicesFromResourceDeviceInstances`: one
  `ContainerDevices` per (device, NUMA node), a single device ID in each; a device without topology gets
  one entry without `topology`. A container's devices come from the NUMA-keyed record made at Allocate
  (devicemanager/pod_devices.go `getContainerDevices`), the allocatable ones from the device as the
  plugin sent it.
- Kubelet walks Go maps for the pods, resources and devices, so no order is promised; the stand-in
  shuffles them from its own seeded RNG so that a client relying on an order fails here too.
- `dynamic_resources` of a container (cm/container_manager_linux.go `GetDynamicResources`, through the
  DRA manager's `GetContainerClaimInfos`): one `DynamicResource` per claim the container lists, in the
  pod's claim order, with one `ClaimResource` per prepared device (driver, pool, device, share ID and
  that device's CDI IDs; kubelet accumulates the CDI IDs of a driver's earlier devices into each later
  one, the stand-in does not). A claim missing from the cache gives the container none (kubelet logs
  it and answers none).
- CPU IDs, memory blocks and pod-level resources are empty: the stand-in has no CPU or memory manager
  (kubelet's are empty too with the `none` policies).
- Every call first passes kubelet's rate limit (apis/grpc/ratelimit.go, `DefaultQPS` 100 and
  `DefaultBurstTokens` 10 in apis/podresources): over it, code ResourceExhausted
  `rejected by rate limit`.
- The socket: `util.CreateListener` (pkg/kubelet/util/util_unix.go) unlinks a stale socket, creates the
  directory with mode 0750, listens on a temporary name and renames it into place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import grpc

from hami_kube.flowcontrol import TokenBucket
from hami_node.plugin.api import api_pb2 as dp
from hami_sim.kubelet.checkpoint import NO_TOPOLOGY
from hami_sim.kubelet.dra.checkpoint import ClaimInfoState
from hami_sim.kubelet.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

JSON = dict[str, Any]

DEFAULT_QPS = 100.0
"""Kubelet's podresources DefaultQPS."""

DEFAULT_BURST_TOKENS = 10
"""Kubelet's podresources DefaultBurstTokens."""

RATE_LIMITED = "rejected by rate limit"
"""Kubelet's ErrorLimitExceeded message (code ResourceExhausted)."""


def pod_not_found(namespace: str, name: str) -> str:
    """Kubelet's error for `Get` of a pod it does not know."""
    return f"pod {name} in namespace {namespace} not found"


class PodsProvider(Protocol):
    """The pod side kubelet's PodResources server reads (its PodsProvider)."""

    @property
    def synced(self) -> bool: ...

    def active_pods(self) -> list[JSON]: ...

    def pod_by_name(self, namespace: str, name: str) -> JSON | None: ...


class DevicesProvider(Protocol):
    """The device side kubelet's PodResources server reads (its DevicesProvider)."""

    def container_devices_by_numa(
        self, pod_uid: str, container: str
    ) -> dict[str, dict[int, tuple[str, ...]]]: ...

    def allocatable_devices(self) -> dict[str, list[dp.Device]]: ...

    def retain_pods(self, active: Iterable[str]) -> None: ...


class DynamicResourcesProvider(Protocol):
    """The DRA side kubelet's PodResources server reads (its DynamicResourcesProvider)."""

    def container_claims(self, pod: JSON, container: JSON) -> list[ClaimInfoState]: ...


def dynamic_resources(claims: Iterable[ClaimInfoState]) -> list[api_pb2.DynamicResource]:
    """Claims as kubelet reports them: per claim, one ClaimResource per prepared device (drivers sorted)."""
    result = []
    for claim in claims:
        resources = [
            api_pb2.ClaimResource(
                cdi_devices=[api_pb2.CDIDevice(name=i) for i in device.cdi_device_ids],
                driver_name=driver,
                pool_name=device.pool_name,
                device_name=device.device_name,
                share_id=device.share_id,
            )
            for driver in sorted(claim.driver_state)
            for device in claim.driver_state[driver]
        ]
        result.append(
            api_pb2.DynamicResource(
                claim_name=claim.claim_name, claim_namespace=claim.namespace, claim_resources=resources
            )
        )
    return result


def _entry(resource: str, device_id: str, numa: int | None) -> api_pb2.ContainerDevices:
    entry = api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])
    if numa is not None:
        entry.topology.nodes.append(api_pb2.NUMANode(ID=numa))
    return entry


def container_devices(
    by_resource: Mapping[str, Mapping[int, Iterable[str]]],
) -> list[api_pb2.ContainerDevices]:
    """A container's recorded devices as kubelet reports them: one entry per (device, NUMA node), no
    topology for a device recorded under `NO_TOPOLOGY`."""
    return [
        _entry(resource, device_id, None if numa == NO_TOPOLOGY else numa)
        for resource, by_numa in by_resource.items()
        for numa, ids in by_numa.items()
        for device_id in ids
    ]


def allocatable_devices(by_resource: Mapping[str, Iterable[dp.Device]]) -> list[api_pb2.ContainerDevices]:
    """Plugin devices as kubelet reports them: one entry per NUMA node the plugin gave, one without
    topology when it gave none. A device whose topology is present but lists no node yields no entry,
    as in kubelet (it loops over the nodes of a non-nil topology)."""
    entries = []
    for resource, devices in by_resource.items():
        for device in devices:
            if not device.HasField("topology"):
                entries.append(_entry(resource, device.ID, None))
                continue
            entries.extend(_entry(resource, device.ID, node.ID) for node in device.topology.nodes)
    return entries


def listed_containers(pod: Mapping[str, Any]) -> list[str]:
    """The containers kubelet lists for a pod: restartable init containers (sidecars), then app
    containers, in spec order (server_v1.go skips init containers that are not restartable)."""
    spec = pod.get("spec") or {}
    sidecars = [c["name"] for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return [*sidecars, *(c["name"] for c in spec.get("containers") or [])]


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self._server = server

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPodResourcesResponse:
        await self._server.admit(context)
        return self._server.list_pods()

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocatableResourcesResponse:
        await self._server.admit(context)
        return self._server.allocatable()

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.GetPodResourcesResponse:
        await self._server.admit(context)
        resources = self._server.get_pod(request.pod_namespace, request.pod_name)
        if resources is None:
            await context.abort(
                grpc.StatusCode.UNKNOWN, pod_not_found(request.pod_namespace, request.pod_name)
            )
        return api_pb2.GetPodResourcesResponse(pod_resources=resources)


class PodResourcesServer:
    """One node's PodResources server on the caller's asyncio loop: `await start()`, `await stop()`
    (again and again: a kubelet restart is a stop and a start)."""

    def __init__(
        self,
        socket: Path,
        devices: DevicesProvider,
        pods: PodsProvider | None,
        *,
        seed: int | str,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST_TOKENS,
        clock: Callable[[], float] = time.monotonic,
        dynamic: DynamicResourcesProvider | None = None,
    ) -> None:
        self.socket = socket
        self._devices = devices
        self._pods = pods
        self._dynamic = dynamic
        self._rng = random.Random(seed)
        self._clock = clock
        self._limiter = TokenBucket(qps, burst, clock())
        self._server: grpc.aio.Server | None = None

    # ------------------------------------------------------------------------------ serving

    async def start(self) -> None:
        """Listen as kubelet's CreateListener does: unlink a stale socket, create the directory (0750),
        listen on a temporary name in it and rename that into place."""
        if self._server is not None:
            return
        directory = self.socket.parent
        created = not directory.exists()
        directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        if created:
            directory.chmod(0o750)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        temporary = directory / f".{self.socket.name}.{secrets.token_hex(4)}"
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        if server.add_insecure_port(f"unix://{temporary}") == 0:
            raise OSError(f"cannot listen on {temporary} (for {self.socket})")
        try:
            await server.start()
            os.rename(temporary, self.socket)
        except BaseException:
            await server.stop(None)
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise
        self._server = server
        log.info("serving the PodResources API on %s", self.socket)

    async def stop(self) -> None:
        """Stop serving and remove the socket (kubelet leaves it behind when it exits; its next start
        unlinks it)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def admit(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Kubelet's rate limit, checked before every call."""
        if not self._limiter.try_accept(self._clock()):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)

    # ------------------------------------------------------------------------------ answers

    def _shuffled(self, items: list[Any]) -> list[Any]:
        """Go map order: random on every walk."""
        self._rng.shuffle(items)
        return items

    def _pod_resources(self, pod: JSON) -> api_pb2.PodResources:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        spec = pod.get("spec") or {}
        by_name = {
            c.get("name"): c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        }
        return api_pb2.PodResources(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            containers=[
                api_pb2.ContainerResources(
                    name=name,
                    devices=self._shuffled(
                        container_devices(self._devices.container_devices_by_numa(uid, name))
                    ),
                    dynamic_resources=(
                        dynamic_resources(self._dynamic.container_claims(pod, by_name[name]))
                        if self._dynamic is not None
                        else []
                    ),
                )
                for name in listed_containers(pod)
            ],
        )

    def list_pods(self) -> api_pb2.ListPodResourcesResponse:
        if self._pods is None:
            return api_pb2.ListPodResourcesResponse()
        active = self._pods.active_pods()
        if self._pods.synced:
            # UpdateAllocatedDevices: free what pods no longer active hold (kubelet skips it until
            # its pod sources are ready).
            self._devices.retain_pods(str((p.get("metadata") or {}).get("uid") or "") for p in active)
        return api_pb2.ListPodResourcesResponse(
            pod_resources=self._shuffled([self._pod_resources(pod) for pod in active])
        )

    def get_pod(self, namespace: str, name: str) -> api_pb2.PodResources | None:
        pod = None if self._pods is None else self._pods.pod_by_name(namespace, name)
        return None if pod is None else self._pod_resources(pod)

    def allocatable(self) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse(
            devices=self._shuffled(allocatable_devices(self._devices.allocatable_devices()))
        )
