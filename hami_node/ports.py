"""The seams inside the node daemon: what the gRPC plugin needs from the Kubernetes side, and what the
Kubernetes side needs from the GPU side. The plugin and health code depend on these protocols, not on
`kubeapi.py`, so they are tested with plain in-memory implementations and never touch the network."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hami_api.types import ContainerAllocation, GPUInfo
from hami_node.allocation import PendingPod, PodMatch

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

ObserverFactory = Callable[[], "BaseObserver"]
"""Makes the watchdog observer a file watch runs on (watchdog's `Observer` by default; a host running
many daemons in one process passes observers that share inotify instances, see hami_sim.nodehost)."""


class PodSource(Protocol):
    """The pods bound to this node that wait for devices, fed by a watch: a pod the watch shows costs no
    API call; one it does not show yet costs one read of the node's pods, never a wait.

    Thread-safe: the gRPC server calls it from its worker threads."""

    def match(self, device_count: int, admitted: PodMatch | None = None) -> PodMatch:
        """The pending pod whose next unallocated device container asks for exactly `device_count`
        GPUs (`allocation.match_pending_pod`). When the watch shows none, the node's pods are read from
        the API server once (kubelet only admits pods it saw bound here, so the API server has them).
        `admitted`: what `admitting` found for the GetPreferredAllocation kubelet sent just before,
        for the same devices; taken as it is (no second lookup, no API call) while the pod still waits
        here with that container next. Raises `AllocationError` (`NoPendingPodError`,
        `CountMismatchError`, `AmbiguousPodError`) saying which pods wait with which counts, and why
        pods bound here do not."""
        ...

    def admitting(self, device_count: int) -> PodMatch | None:
        """The container a GetPreferredAllocation of `device_count` devices is for (looked up and
        confirmed as `match` does), or None when it cannot be told (never raises): its GPUs steer
        kubelet's choice, and the Allocate that follows for the devices chosen takes it as `admitted`."""
        ...

    def pod_object(self, pod: PendingPod) -> dict[str, object]:
        """The pod as Kubernetes JSON, as last seen by the watch (for container names, env, uid)."""
        ...

    def allocated(self, match: PodMatch, granted: ContainerAllocation | None = None) -> None:
        """Record that `match`'s container got its devices (`granted`: what it really got, when that
        differs from the scheduler's choice, see `allocation.grant_container`); when it completes the
        pod, report `hami.io/bind-phase=success`, with the allocation annotations rewritten when a
        container moved (asynchronously: never blocks the RPC on the API server)."""
        ...

    def failed(self, pod: PendingPod | None, reason: str, event_reason: str = "") -> None:
        """Report `hami.io/bind-phase=failed` for `pod` (None: nothing to patch, only log); with
        `event_reason`, also a Warning Event on the pod with `reason` as its message."""
        ...


class InventorySink(Protocol):
    """Where the GPU inventory goes: the Node's `hami.io/node-nvidia-register` annotation."""

    def publish(self, gpus: Sequence[GPUInfo]) -> None:
        """The current inventory (health included). Called on every change; cheap and non-blocking:
        the writer coalesces and writes within 1 s, and re-checks it periodically."""
        ...


@dataclass(frozen=True, slots=True)
class PodName:
    """A pod on this node as the metrics name it: its namespace, name and (regular, not init)
    container names, which HAMi's vGPU monitor matches the `<pod uid>_<container>` directories to."""

    namespace: str
    name: str
    containers: tuple[str, ...]


class PodDirectory(Protocol):
    """The pods on this node by UID, as the pod watch shows them (`pods.PodTracker`). Thread-safe."""

    def pod_name(self, uid: str) -> PodName | None:
        """The pod with this UID on this node, None when the watch does not show it (deleted, or not
        yet listed)."""
        ...


@dataclass(frozen=True, slots=True)
class AllocatedContainer:
    """A container Allocate answered for: its pod, the host directory mounted at `<hook>/vgpu`, the
    file HAMi-core will keep its region in (`cache_file`, in `cache_dir`), its GPUs with their memory
    (MiB) and core (%) limits, and its `CUDA_TASK_PRIORITY` (None: unset)."""

    pod_uid: str
    container: str
    cache_dir: str
    cache_file: str
    devices: tuple[tuple[str, int, int], ...]
    priority: int | None


class PluginObserver(Protocol):
    """What the device plugin reports as it serves (`monitor.exporter.NodeMetrics` counts it; the fake
    backend's simulator starts a container on `container_allocated`). Called from the gRPC threads and
    the plugin manager's thread; must not block."""

    def allocate_done(self, seconds: float, ok: bool) -> None:
        """One Allocate RPC answered (`ok`) or failed, after `seconds`."""
        ...

    def container_allocated(self, container: AllocatedContainer) -> None: ...

    def list_and_watch_sent(self) -> None:
        """One ListAndWatch response (a device list) sent to kubelet."""
        ...

    def registration(self, ok: bool) -> None:
        """One attempt to register with kubelet, succeeded or failed."""
        ...
