"""The seams inside the node daemon: what the gRPC plugin needs from the Kubernetes side, and what the
Kubernetes side needs from the GPU side. The plugin and health code depend on these protocols, not on
`kube.py`, so they are tested with plain in-memory implementations and never touch the network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hami_api.types import GPUInfo
from hami_node.allocation import PendingPod, PodMatch


class PodSource(Protocol):
    """The pods bound to this node that wait for devices, fed by a watch (never an API call per RPC).

    Thread-safe: the gRPC server calls it from its worker threads."""

    def match(self, device_count: int, timeout_s: float) -> PodMatch:
        """The pending pod whose next unallocated device container asks for exactly `device_count`
        GPUs (`allocation.match_pending_pod`), waiting up to `timeout_s` for the watch to show it.
        Raises `AllocationError` (`NoPendingPodError`, `CountMismatchError`, `AmbiguousPodError`)."""
        ...

    def steering_gpus(self, device_count: int) -> tuple[str, ...]:
        """GPU UUIDs chosen for the container a GetPreferredAllocation of `device_count` is for, or ()."""
        ...

    def pod_object(self, pod: PendingPod) -> dict[str, object]:
        """The pod as Kubernetes JSON, as last seen by the watch (for container names, env, uid)."""
        ...

    def allocated(self, match: PodMatch) -> None:
        """Record that `match`'s container got its devices; when it completes the pod, report
        `hami.io/bind-phase=success` (asynchronously: never blocks the RPC on the API server)."""
        ...

    def failed(self, pod: PendingPod | None, reason: str) -> None:
        """Report `hami.io/bind-phase=failed` for `pod` (None: nothing to patch, only log)."""
        ...


class InventorySink(Protocol):
    """Where the GPU inventory goes: the Node's `hami.io/node-nvidia-register` annotation."""

    def publish(self, gpus: Sequence[GPUInfo]) -> None:
        """The current inventory (health included). Called on every change; cheap and non-blocking:
        the writer coalesces and writes within 1 s, and re-checks it periodically."""
        ...
