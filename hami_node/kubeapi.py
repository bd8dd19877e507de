"""The node daemon's calls to the Kubernetes API, as paths and patch types over hami_kube's blocking
bridge (`hami_kube.blocking.BlockingKubeApi`: one asyncio loop on a daemon thread): `NodeApi` is the
`pods.PodPatcher` of the bind-phase writer and the `reporter.NodeAnnotationClient` of the inventory
reporter, `NodeApi.event_recorder` the daemon's one `hami_kube.events` recorder on that loop, and
`watch_node_pods` runs the `hami_kube` reflector of the pods bound to this node into a
`PodEventHandler` (`pods.PodTracker`). In DRA mode (`hami_node.dra`) `NodeApi` also reads
ResourceClaims and pods for NodePrepareResources and writes the node's ResourceSlices, and
`watch_node_slices` runs the reflector of the node's slices of the driver into the slice publisher.

Threading. The writers and the Allocate miss path call `NodeApi` from their own threads and block
until the answer or the call's timeout; the reflector's deliveries run on the loop's thread (the
tracker locks its table). Nothing here is called from an RPC handler except the miss path's one read
of the node's pods, bounded by `--allocate-wait-seconds`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote

from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.blocking import BlockingKubeApi, ThreadedEventRecorder, ThreadedReflector
from hami_kube.client import JSONDict, component_user_agent
from hami_kube.errors import KubeApiError
from hami_kube.events import EventSource
from hami_kube.reflector import ListSink

REQUEST_TIMEOUT_S = 15.0
KUBE_API_QPS = 50.0
KUBE_API_BURST = 100
"""The client-side rate limit of the daemon's Kubernetes client when its caller names none (the daemon
passes `--kube-api-qps` / `--kube-api-burst`, whose defaults are these): kubelet's (KubeletConfiguration
kubeAPIQPS/kubeAPIBurst), whose per-pod path the daemon shares. A GPU pod costs the daemon two calls
(the bind-phase patch, the read of the Node for HAMi's lock): client-go's default 5/10, which HAMi's
device plugin runs with, held an 80-pod burst on one node back for 14 s (10/20 did too); at 50/100 it
takes as long as without a limit."""
RESOURCE_API = "/apis/resource.k8s.io/v1"
EVENT_COMPONENT = "hami-node"
"""The `source.component` of the daemon's Events about pods; the host is the node, as kubelet's."""


def connect(
    kubeconfig: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    qps: float = KUBE_API_QPS,
    burst: int = KUBE_API_BURST,
    user_agent: str | None = None,
) -> BlockingKubeApi:
    """The daemon's client: from the kubeconfig file `--kubeconfig` / `KUBECONFIG` named (resolved by the
    daemon's config), or, when None, from the in-cluster service account and the API server's address
    in `environ` (`NodeConfig.in_cluster_env`; none when None); `user_agent`: the User-Agent (None:
    `component_user_agent("hami-node")`). Raises `KubeConfigError`."""
    return BlockingKubeApi.connect(
        kubeconfig,
        environ=dict(environ or {}),
        name="hami-node-kube",
        request_timeout_s=request_timeout_s,
        qps=qps,
        burst=burst,
        user_agent=user_agent or component_user_agent(EVENT_COMPONENT),
    )


def event_source(node_name: str) -> EventSource:
    """The source of the daemon's Events about pods: `hami-node` on this node (reportingInstance the
    node, as kubelet's Events)."""
    return EventSource(EVENT_COMPONENT, node_name)


def _name(name: str) -> str:
    return quote(name, safe="")


_T = TypeVar("_T")


class NodeApi:
    """The few calls the node daemon makes, each returning plain Kubernetes JSON or raising
    `KubeApiError`. Thread-safe (every call goes through the bridge's loop). `on_error(verb, status)`
    hears of each call that failed (the metrics count them; the reflectors' errors are theirs)."""

    def __init__(self, bridge: BlockingKubeApi) -> None:
        self.bridge = bridge
        self.on_error: Callable[[str, int], None] | None = None

    def _call(self, verb: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except KubeApiError as err:
            if self.on_error is not None:
                self.on_error(verb, err.status)
            raise

    @classmethod
    def connect(
        cls,
        kubeconfig: Path | None,
        *,
        environ: Mapping[str, str] | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        qps: float = KUBE_API_QPS,
        burst: int = KUBE_API_BURST,
        user_agent: str | None = None,
    ) -> NodeApi:
        """Calls over a bridge of their own (`connect()`); `close()` ends it. Raises `KubeConfigError`."""
        return cls(
            connect(
                kubeconfig,
                environ=environ,
                request_timeout_s=request_timeout_s,
                qps=qps,
                burst=burst,
                user_agent=user_agent,
            )
        )

    def close(self) -> None:
        """Close the bridge: its event recorders, its reflectors, the client and the loop's thread."""
        self.bridge.close()

    def event_recorder(self, node_name: str) -> ThreadedEventRecorder:
        """The daemon's event recorder, running on the bridge's loop (`close()` stops it): Events about
        pods from `event_source(node_name)`; `with_source` gives the other sources the same queue."""
        return self.bridge.event_recorder(event_source(node_name))

    def get_node(self, name: str) -> JSONDict:
        return self._call("get", lambda: self.bridge.get(f"/api/v1/nodes/{_name(name)}"))

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> JSONDict:
        """Merge-patch the Node's labels (None deletes a key): NVIDIA's modes write GPU feature
        discovery's sharing labels here (`hami_node.nvidia.plugin`)."""
        body = {"metadata": {"labels": dict(labels)}}
        return self._call("patch", lambda: self.bridge.patch(f"/api/v1/nodes/{_name(name)}", body))

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> JSONDict:
        """Merge-patch the Node's annotations (None deletes a key). With `resource_version` the patch
        applies only to that version of the Node (409 Conflict otherwise)."""
        meta: JSONDict = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return self._call(
            "patch", lambda: self.bridge.patch(f"/api/v1/nodes/{_name(name)}", {"metadata": meta})
        )

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSONDict:
        """Merge-patch a pod's annotations (None deletes a key). With `resource_version` the patch
        applies only to that version of the pod (409 Conflict otherwise)."""
        path = f"/api/v1/namespaces/{_name(namespace)}/pods/{_name(name)}"
        meta: JSONDict = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return self._call("patch", lambda: self.bridge.patch(path, {"metadata": meta}))

    def get_pod(self, namespace: str, name: str, timeout_s: float | None = None) -> JSONDict:
        """The pod (`timeout_s` bounds the call instead of the client's request timeout)."""
        path = f"/api/v1/namespaces/{_name(namespace)}/pods/{_name(name)}"
        return self._call("get", lambda: self.bridge.get(path, timeout_s=timeout_s))

    # --- DRA ----------------------------------------------------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> JSONDict:
        path = f"{RESOURCE_API}/namespaces/{_name(namespace)}/resourceclaims/{_name(name)}"
        return self._call("get", lambda: self.bridge.get(path))

    def list_resource_slices(self, field_selector: str) -> list[JSONDict]:
        """The ResourceSlices matching `field_selector` (`slice_selector`)."""
        body = self._call(
            "list",
            lambda: self.bridge.get(f"{RESOURCE_API}/resourceslices", {"fieldSelector": field_selector}),
        )
        items = body.get("items")
        if not isinstance(items, list):
            raise KubeApiError(0, "BadResponse", "resource slice list without items")
        return [item for item in items if isinstance(item, dict)]

    def create_resource_slice(self, body: JSONDict) -> JSONDict:
        return self._call(
            "create", lambda: self.bridge.request("POST", f"{RESOURCE_API}/resourceslices", body)
        )

    def update_resource_slice(self, name: str, body: JSONDict) -> JSONDict:
        """PUT the slice (its metadata.resourceVersion must be the stored one: 409 Conflict otherwise)."""
        path = f"{RESOURCE_API}/resourceslices/{_name(name)}"
        return self._call("update", lambda: self.bridge.request("PUT", path, body))

    def delete_resource_slice(self, name: str, uid: str = "", resource_version: str = "") -> None:
        """DELETE the slice, only if it still has this UID and version when given (preconditions, as the
        helper's removeSlices); 404 is done already."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: JSONDict = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if preconditions:
            body["preconditions"] = preconditions
        path = f"{RESOURCE_API}/resourceslices/{_name(name)}"

        def delete() -> None:
            try:
                self.bridge.request("DELETE", path, body)
            except KubeApiError as err:
                if not err.not_found:
                    raise

        self._call("delete", delete)

    def list_pods(self, field_selector: str, timeout_s: float | None = None) -> tuple[list[JSONDict], str]:
        """Pods of all namespaces matching `field_selector`, and the list's resourceVersion (`timeout_s`
        bounds the call instead of the client's request timeout)."""
        body = self._call(
            "list",
            lambda: self.bridge.get("/api/v1/pods", {"fieldSelector": field_selector}, timeout_s=timeout_s),
        )
        items = body.get("items")
        version = (body.get("metadata") or {}).get("resourceVersion") or ""
        if not isinstance(items, list) or not version:
            raise KubeApiError(0, "BadResponse", "pod list without items or resourceVersion")
        return [item for item in items if isinstance(item, dict)], str(version)


class PodEventHandler(Protocol):
    """Receives the pods bound to this node (`pods.PodTracker` is one). Called on the loop's thread."""

    def pods_listed(self, pods: Sequence[JSONDict]) -> None:
        """The complete set of pods now (after a list or relist): replaces what was known."""
        ...

    def pod_event(self, kind: str, pod: JSONDict) -> None:
        """One change: `kind` is ADDED, MODIFIED or DELETED."""
        ...


def watch_node_pods(
    bridge: BlockingKubeApi,
    node_name: str,
    handler: PodEventHandler,
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    watch_timeout_s: int = 300,
    start: bool = True,
) -> ThreadedReflector:
    """List, then watch, the pods with `spec.nodeName=<node>` into `handler`, until stopped: a dropped
    watch resumes from the last version seen, 410 Gone relists, other errors back off (`Reflector`).
    Returns at once (with `start` False, before it runs); `wait_synced()` waits for the first list."""
    return bridge.start_reflector(
        f"pods on {node_name}",
        "/api/v1/pods",
        ListSink(handler.pods_listed, handler.pod_event),
        retry=retry,
        watch_timeout_s=watch_timeout_s,
        params={"fieldSelector": f"spec.nodeName={node_name}"},
        start=start,
    )


def slice_selector(node_name: str, driver: str) -> str:
    """The field selector of the node's slices of a driver (kubelet's, for wiping them)."""
    return f"spec.nodeName={node_name},spec.driver={driver}"


class SliceEventHandler(Protocol):
    """Receives the node's slices of the driver (`dra.publisher.SlicePublisher` is one); called on the
    loop's thread."""

    def slices_listed(self, slices: Sequence[JSONDict]) -> None: ...

    def slice_event(self, kind: str, slice_: JSONDict) -> None: ...


def watch_node_slices(
    bridge: BlockingKubeApi,
    node_name: str,
    driver: str,
    handler: SliceEventHandler,
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    watch_timeout_s: int = 300,
    start: bool = True,
) -> ThreadedReflector:
    """List, then watch, the ResourceSlices with `spec.nodeName=<node>,spec.driver=<driver>` into
    `handler`, as `watch_node_pods` does for pods."""
    return bridge.start_reflector(
        f"resource slices of {driver} on {node_name}",
        f"{RESOURCE_API}/resourceslices",
        ListSink(handler.slices_listed, handler.slice_event),
        retry=retry,
        watch_timeout_s=watch_timeout_s,
        params={"fieldSelector": slice_selector(node_name, driver)},
        start=start,
    )


__all__ = [
    "EVENT_COMPONENT",
    "KUBE_API_BURST",
    "KUBE_API_QPS",
    "RESOURCE_API",
    "NodeApi",
    "PodEventHandler",
    "SliceEventHandler",
    "connect",
    "event_source",
    "slice_selector",
    "watch_node_pods",
    "watch_node_slices",
]
