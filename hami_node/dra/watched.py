"""The pods bound to this node as the daemon's pod watch last delivered them (`WatchedPods`, the
`kubeapi.PodEventHandler` that `kubeapi.watch_node_pods` feeds, the one `hami_kube` reflector), for
NodePrepareResources to read a new claim's pods from memory instead of one GET per pod.

kubelet calls Prepare for a pod it learnt of from its own watch of the pods bound to its node
(pkg/kubelet/config/apiserver.go: the field selector spec.nodeName), and the pod was bound before that,
so this daemon's watch of the same pods has, nearly always, seen it already. A pod from here is used only
when it can stand for the pod read now (`pod`): the watch has listed once and is not failing, the pod
has the UID the claim's `status.reservedFor` names (a pod's `spec.resourceClaims` and its containers'
`resources.claims` are immutable), and the claims it asks through templates have their generated names
in its status (`claims.claim_names_resolved`; the one field Prepare reads that is written after the pod
is created). Otherwise the caller reads the pod as before. Nothing here waits for the watch.

Only pods that name claims are kept (a pod in a claim's `reservedFor` references the claim). The watch
delivers on the client's loop thread; `pod` is called from the gRPC handlers' threads: the table is
under a lock, and each pod is the object the watch delivered (never changed afterwards).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami_node.dra.claims import claim_names_resolved
from hami_node.pods import pod_key


def _names_claims(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


class WatchedPods:
    """See the module docstring. `healthy()` says whether the watch is working now (the wiring: its
    reflector has no failure in a row); while it is not, `pod` answers None."""

    def __init__(self, healthy: Callable[[], bool] = lambda: True) -> None:
        self.healthy = healthy
        self._lock = threading.Lock()
        self._pods: dict[str, Mapping[str, Any]] = {}
        """By `pods.pod_key` (`namespace/name`)."""
        self._synced = False

    @property
    def synced(self) -> bool:
        """Whether the watch has listed the pods at least once (since start, or since `forget`)."""
        return self._synced

    # --- kubeapi.PodEventHandler (the loop's thread) ---------------------------------------------------

    def pods_listed(self, pods: Sequence[Mapping[str, Any]]) -> None:
        table = {pod_key(pod): pod for pod in pods if _names_claims(pod)}
        with self._lock:
            self._pods = table
            self._synced = True

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        with self._lock:
            if kind != "DELETED" and _names_claims(pod):
                self._pods[key] = pod
                return
            held = self._pods.get(key)
            # A DELETED of an older pod of the same name does not remove the one that replaced it.
            if held is not None and _uid(held) == _uid(pod):
                del self._pods[key]

    def forget(self) -> None:
        """The watch stopped: answer None until it lists again."""
        with self._lock:
            self._pods = {}
            self._synced = False

    # --- Prepare's lookup (any thread) -----------------------------------------------------------------

    def pod(self, namespace: str, name: str, uid: str) -> Mapping[str, Any] | None:
        """The pod `namespace/name` with UID `uid` as the watch delivered it, when it can stand for the
        pod read now (see the module docstring); None: read it."""
        with self._lock:
            if not self._synced:
                return None
            pod = self._pods.get(f"{namespace}/{name}")
        if pod is None or _uid(pod) != uid or not claim_names_resolved(pod) or not self.healthy():
            return None
        return pod


def _uid(pod: Mapping[str, Any]) -> object:
    meta = pod.get("metadata")
    return meta.get("uid") if isinstance(meta, Mapping) else None


__all__ = ["WatchedPods"]
