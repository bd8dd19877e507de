"""Which pod kubelet is admitting, read from its PodResources API (`v1.PodResourcesLister/List` on
`<kubelet root>/pod-resources/kubelet.sock`).

kubelet's Allocate names no pod, but kubelet's own state does, while the RPC runs:

- kubelet adds a pod to its pod manager before it admits it, and admits its pods one at a time
  (pkg/kubelet/kubelet.go `HandlePodAdditions`: `podManager.AddPod`, then the admit handlers, among them
  the topology/device admit handler that calls Allocate for each container, init containers first);
- it records a container's devices only once that container's Allocate answered
  (pkg/kubelet/cm/devicemanager/manager.go `allocateContainerResources`: `podDevices.insert` after the
  RPC returned);
- `List` answers kubelet's active pods, the pod manager's pods less the terminal ones
  (pkg/kubelet/apis/podresources/server_v1.go: `GetActivePods`; kubelets before 1.29 listed every pod of
  the pod manager, terminal ones included), each with its app and sidecar containers and the devices
  recorded for each (plain init containers are not listed).

So during an Allocate, the pod being admitted is listed, and its container being allocated holds no
device of the resource yet; a pod admitted earlier holds its devices; a pod bound later is not listed
yet. `PodTracker` (hami_node/pods.py) takes only such a pod's container as kubelet's. List has no pod
UID: a pod deleted and created again under the same name is told apart by the GET of the pod the
tracker still makes (`PodTracker._confirm`).

Kubelet limits the API to 100 calls a second with a burst of 10 (apis/grpc/ratelimit.go,
`DefaultQPS`, `DefaultBurstTokens`; over it: ResourceExhausted `rejected by rate limit`): the client
keeps to a budget a little under it (`CLIENT_QPS`, `CLIENT_BURST`), waiting for a token rather than
being refused, and tries again after a refusal (another client of the node may spend the budget too)
until its deadline. So a node admits at most about 95 pods a second through this lookup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from hami_kube.flowcontrol import TokenBucket
from hami_node.plugin.podresources import api_pb2, api_pb2_grpc

KUBELET_QPS = 100.0
"""kubelet's PodResources rate limit (podresources `DefaultQPS`)."""
KUBELET_BURST = 10
"""kubelet's PodResources burst (podresources `DefaultBurstTokens`)."""
CLIENT_QPS = 95.0
CLIENT_BURST = 9
"""The client's own budget, a little under kubelet's: its bucket and kubelet's start at different times
and see the calls at different moments, so the same numbers would sometimes be refused."""
REFUSED_RETRY_S = 0.01
"""Pause before trying again after kubelet's `rejected by rate limit` (one token's worth at 100/s)."""


@dataclass(frozen=True, slots=True)
class KubeletPod:
    """A pod kubelet lists as active: its containers (app and sidecar ones) and, per container, the
    IDs of the resource's devices kubelet recorded for it (empty: none yet)."""

    namespace: str
    name: str
    devices: Mapping[str, frozenset[str]]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class KubeletPodsError(Exception):
    """kubelet's PodResources API did not answer (no socket, a timeout, an error)."""


def kubelet_pods(response: api_pb2.ListPodResourcesResponse, resource: str) -> list[KubeletPod]:
    """The pods of a List answer, with the devices of `resource` per container."""
    pods = []
    for listed in response.pod_resources:
        devices = {
            container.name: frozenset(
                device_id
                for entry in container.devices
                if entry.resource_name == resource
                for device_id in entry.device_ids
            )
            for container in listed.containers
        }
        pods.append(KubeletPod(listed.namespace or "default", listed.name, devices))
    return pods


class KubeletPods:
    """A client of kubelet's PodResources API: `list()` the active pods. Thread-safe; `close()` ends the
    channel (gRPC reconnects by itself when kubelet restarts and serves the socket again)."""

    def __init__(
        self,
        socket: Path,
        resource: str,
        *,
        timeout_s: float = 5.0,
        qps: float = CLIENT_QPS,
        burst: int = CLIENT_BURST,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.socket = socket
        self.resource = resource
        self._timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._bucket = TokenBucket(qps, burst, clock())
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        self.calls = 0
        """List calls sent."""
        self.refused = 0
        """Calls kubelet refused for its rate limit (each tried again)."""

    def close(self) -> None:
        self._channel.close()

    def list(self) -> list[KubeletPod]:
        """kubelet's active pods now. Raises `KubeletPodsError` when no answer comes within the timeout
        (the rate limit's waits included)."""
        deadline = self._clock() + self._timeout_s
        while True:
            with self._lock:
                wait = self._bucket.reserve(self._clock())
            if wait > 0:
                self._sleep(wait)
            left = deadline - self._clock()
            if left <= 0:
                raise KubeletPodsError(f"no answer from kubelet's PodResources API at {self.socket} in time")
            self.calls += 1
            try:
                response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=left)
            except grpc.RpcError as err:
                code = getattr(err, "code", None)
                refused = callable(code) and code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                if refused and deadline - self._clock() > REFUSED_RETRY_S:
                    self.refused += 1
                    self._sleep(REFUSED_RETRY_S)
                    continue
                raise KubeletPodsError(
                    f"kubelet's PodResources API at {self.socket}: {_describe(err)}"
                ) from None
            return kubelet_pods(response, self.resource)


def _describe(err: grpc.RpcError) -> str:
    """`CODE: details` of a failed call (the errors calls raise are also `grpc.Call`s)."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    name = code().name if callable(code) else "error"
    return f"{name}: {details() if callable(details) else err}"


def admitting(listed: Sequence[KubeletPod], key: str, container: str, gpu_containers: Sequence[str]) -> bool:
    """Whether kubelet can be admitting pod `key`'s `container` now: the pod is listed, and the container
    holds none of the resource's devices yet (a container not listed, a plain init container: none of
    the pod's listed `gpu_containers` holds any, as kubelet allocates init containers first)."""
    found = next((p for p in listed if p.key == key), None)
    if found is None:
        return False
    if container in found.devices:
        return not found.devices[container]
    return not any(found.devices.get(name) for name in gpu_containers)


__all__ = [
    "CLIENT_BURST",
    "CLIENT_QPS",
    "KUBELET_BURST",
    "KUBELET_QPS",
    "KubeletPod",
    "KubeletPods",
    "KubeletPodsError",
    "admitting",
    "kubelet_pods",
]
