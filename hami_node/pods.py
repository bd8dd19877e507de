"""The pods bound to this node that wait for devices, kept in memory from the pod watch, and the
bind-phase patches that report how their Allocate went (`PodTracker`, the `ports.PodSource` of the
plugin).

Which pods wait (HAMi's rule, fitted to our bind protocol): phase Pending (or not set yet), not being
deleted, `hami.io/bind-phase=allocating` (the scheduler writes it; we write `success` or `failed`),
`hami.io/vgpu-node` naming this node, and a `hami.io/vgpu-devices-to-allocate` that decodes and still
names at least one GPU. HAMi also takes `success` pods, because its plugin blanks the to-allocate
entries as it consumes them; we patch once at the end and leave the annotation as the scheduler wrote
it, so a `success` pod has nothing left to allocate and is not waiting. A pod bound here whose
annotations do not decode (or name another node) is skipped, with the reason logged once per value;
Allocate's error then mentions it.

Which pod kubelet admits: with kubelet's PodResources API (`kubelet`, `plugin.kubelet_pods`), the one
kubelet lists whose next device container holds no device yet (kubelet adds a pod to its pod manager
before it admits it, and records a container's devices once its Allocate answered), so pods asking as
many GPUs may wait here together (the node says so, `hami.io/node-pod-identification`, and hami-control
binds them); when kubelet lists a pod the watch has not shown, the watch is behind kubelet's, and the
node's pods are read from the API first. Without it, the one waiting pod whose next container asks as
many GPUs (hami-control keeps the pods pending on a node apart by those counts).

A pod so matched is confirmed with a GET (`_confirm`, as HAMi's plugin reads the pod at every
Allocate): the watch may still show a pod deleted or ended whose window the control plane has released,
with a pod asking as many GPUs bound here since; PodResources names no UID, so a pod created again under
a deleted one's name, and a pod a kubelet before 1.29 lists after rejecting it, are told apart by it too.
A match the GET does not confirm is dropped and the lookup repeats (two matches: each is confirmed).
One lookup serves one container: GetPreferredAllocation's (kubelet sends it just before the container's
Allocate, whose devices it steers), taken by that Allocate as `admitted` with no second lookup; an
Allocate without one looks up itself. A request the watch cannot answer (the watch lags behind the bind
kubelet saw, or the pod never was a HAMi pod) costs one read of the node's pods from the API server,
bounded by `read_timeout_s`; what it finds waiting is added (fresh: not confirmed again), and if still
nothing fits, Allocate fails at once with the pods that wait (and their GPU counts) and why the other
pods bound here do not. Nothing ever waits for the watch.

Writes never block Allocate: `allocated()`/`failed()` queue them, and one writer thread sends them in
order, retrying with backoff while the API server is unreachable. Per pod it sends ONE merge patch of
`hami.io/bind-phase` (carrying the rewritten allocation annotations when a container got other GPUs of
its pod than planned, see `allocation.grant_container`), then releases HAMi's node lock
(`hami.io/mutex.lock` = `<time>,<ns>,<pod>`) if, and only if, it names that pod: a GET of the Node and a
patch guarded by the Node's resourceVersion, so a lock taken meanwhile by another pod is never removed
(skipped for a pod whose bind took none, `hami.io/bind-node-lock: none`).
Events (a container moved to another GPU of its pod, a refused mismatch) go to the daemon's event
recorder (`hami_kube.events`, on the client's loop), which writes them on its own.
Model: this side of the bind/Allocate protocol is modelled in `hami_control/protocol_model.py`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami_api import annotations as ann
from hami_api.errors import QuantityError, WireFormatError
from hami_api.mig_alloc import MIG_ALLOCATIONS
from hami_api.quantity import quantity_value
from hami_api.resources import pod_container_names
from hami_api.types import BindPhase, ContainerAllocation
from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.errors import KubeApiError
from hami_node.allocation import (
    REASON_GPU_REASSIGNED,
    AllocationError,
    AmbiguousPodError,
    ForeignPodError,
    NoPendingPod,
    NoPendingPodError,
    PendingPod,
    PodMatch,
    match_pending_pod,
    same_slices,
)
from hami_node.plugin.kubelet_pods import KubeletPod, KubeletPodsError
from hami_node.plugin.kubelet_pods import admitting as kubelet_admitting
from hami_node.ports import PodName

log = logging.getLogger(__name__)

JSONDict = dict[str, Any]


class PodPatcher(Protocol):
    """The API calls the tracker's writer makes (`kubeapi.NodeApi` is one). Errors: `KubeApiError`."""

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Mapping[str, Any]: ...

    def get_node(self, name: str) -> Mapping[str, Any]: ...

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]: ...

    def list_pods(
        self, field_selector: str, timeout_s: float | None = None
    ) -> tuple[list[JSONDict], str]: ...

    def get_pod(self, namespace: str, name: str, timeout_s: float | None = None) -> Mapping[str, Any]: ...


class KubeletPodSource(Protocol):
    """kubelet's PodResources list (`plugin.kubelet_pods.KubeletPods` is one). Raises `KubeletPodsError`."""

    def list(self) -> Sequence[KubeletPod]: ...


class MigPodApi(Protocol):
    """The API calls of HAMi's dynamic MIG on the node (`kubeapi.NodeApi` is one). Errors:
    `KubeApiError`."""

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> Mapping[str, Any]: ...

    def get_pod(self, namespace: str, name: str, timeout_s: float | None = None) -> Mapping[str, Any]: ...

    def list_pods(
        self, field_selector: str, timeout_s: float | None = None
    ) -> tuple[list[JSONDict], str]: ...


MIG_PATCH_ATTEMPTS = 3
"""Tries of the runtime identity patch when the pod changed in between (409 Conflict)."""


def record_mig_identity(
    api: MigPodApi,
    pod: Mapping[str, Any],
    identify: Callable[[Mapping[str, Any]], str],
) -> str:
    """Write the MIG runtime identity onto the pod (HAMi's annotateMigRuntimeInfo): a merge patch of
    `hami.io/vgpu-mig-allocations` carrying the pod's resourceVersion, so it never overwrites a newer
    annotation. `identify(pod)` returns the annotation's new value for that copy of the pod (raising
    to give up). On a conflict the pod is read again and the value recomputed, up to
    `MIG_PATCH_ATTEMPTS` times. Returns the value written. Raises `KubeApiError` or what `identify`
    raises."""
    current = pod
    for attempt in range(MIG_PATCH_ATTEMPTS):
        meta = _meta(current)
        value = identify(current)
        version = meta.get("resourceVersion")
        try:
            api.patch_pod_annotations(
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                {MIG_ALLOCATIONS: value},
                version if isinstance(version, str) else None,
            )
            return value
        except KubeApiError as err:
            if err.status != 409 or attempt + 1 == MIG_PATCH_ATTEMPTS:
                raise
            current = api.get_pod(str(meta.get("namespace", "")), str(meta.get("name", "")))
    raise AssertionError("unreachable")


class PodEvents(Protocol):
    """Where the tracker's Events about pods go (`hami_kube.blocking.ThreadedEventRecorder` is one):
    called with the tracker's lock held, so it must neither block nor raise."""

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, action: str = ""
    ) -> None: ...


EVENT_ACTION = "Allocate"
"""The `action` of the tracker's Events."""


# --- which pods wait (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rejected:
    """A pod bound to this node and marked `allocating` whose annotations cannot be used."""

    reason: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _pod_name(obj: Mapping[str, Any]) -> PodName:
    meta = _meta(obj)
    spec = obj.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    names = tuple(
        str(c["name"]) for c in containers or () if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    )
    return PodName(str(meta.get("namespace") or ""), str(meta.get("name") or ""), names)


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def waiting_pod(obj: Mapping[str, Any], node: str) -> PendingPod | Rejected | None:
    """The pod as a `PendingPod` if it waits for devices on `node`; `Rejected` (with the reason) if it
    is marked allocating here but its annotations are unusable; None if it does not wait.

    A pod that asks NVIDIA GPUs and another vendor's devices may read `success` while kubelet admits it:
    the other vendor's plugin (HAMi's, `PodAllocationTrySuccess`) writes it when its own part is done,
    and kubelet then asks us for ours. So a `success` pod still waits here while kubelet has not admitted
    it yet (no container status) and its entries are not all allocated; a pod this daemon finished is
    left out by the tracker (`_finished`), one it finished before a restart is admitted already."""
    meta = _meta(obj)
    name, uid = meta.get("name"), meta.get("uid")
    if not isinstance(name, str) or not name or meta.get("deletionTimestamp"):
        return None
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase not in (None, "", "Pending"):
        return None
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    bind_phase = annotations.get(ann.BIND_PHASE)
    if bind_phase != BindPhase.ALLOCATING and not (bind_phase == BindPhase.SUCCESS and _admitting(obj)):
        return None
    vgpu_node = annotations.get(ann.VGPU_NODE)
    if vgpu_node != node:
        if vgpu_node is None:
            return Rejected(f"it has no {ann.VGPU_NODE} annotation")
        return Rejected(f"{ann.VGPU_NODE}={vgpu_node!r} names another node than {node!r}")
    text = annotations.get(ann.DEVICES_TO_ALLOCATE)
    if not isinstance(text, str):
        return Rejected(f"it has no {ann.DEVICES_TO_ALLOCATE} annotation")
    try:
        allocation = ann.decode_pod_allocation(text)
    except WireFormatError as err:
        return Rejected(str(err))
    if allocation.next_pending() is None:
        return None
    namespace = meta.get("namespace") or "default"
    return PendingPod(str(namespace), name, uid if isinstance(uid, str) else "", allocation)


def _lock_possible(obj: Mapping[str, Any]) -> bool:
    """Whether the pod may hold HAMi's node lock: unless its bind says it took none
    (`hami.io/bind-node-lock: none`, hami-control's binder for a pod whose vendors take no mutex lock)."""
    annotations = _meta(obj).get("annotations")
    return not (
        isinstance(annotations, Mapping) and annotations.get(ann.BIND_NODE_LOCK) == ann.BIND_NODE_LOCK_NONE
    )


def _admitting(obj: Mapping[str, Any]) -> bool:
    """Whether kubelet has not reported any container of the pod yet (it is still admitting it)."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return True
    return not status.get("containerStatuses") and not status.get("initContainerStatuses")


def not_waiting_reason(obj: Mapping[str, Any], node: str) -> str | None:
    """Why a pod bound to `node` does not wait for devices here (for Allocate's error), or None when it
    does wait (or is not bound here)."""
    meta = _meta(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName") != node:
        return None
    if meta.get("deletionTimestamp"):
        return "it is being deleted"
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase not in (None, "", "Pending"):
        return f"it is {phase}"
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    bind_phase = annotations.get(ann.BIND_PHASE)
    if bind_phase is None:
        return f"it has no {ann.BIND_PHASE} annotation: the HAMi scheduler did not place it"
    if bind_phase != BindPhase.ALLOCATING and not (bind_phase == BindPhase.SUCCESS and _admitting(obj)):
        return f"{ann.BIND_PHASE}={bind_phase}"
    verdict = waiting_pod(obj, node)
    if isinstance(verdict, Rejected):
        return verdict.reason
    if verdict is None:
        return "its GPUs are all allocated"
    return None


def lost_success(obj: Mapping[str, Any], node: str) -> bool:
    """Whether a pod on `node` runs (phase Running, not being deleted) but still says
    `hami.io/bind-phase=allocating`: kubelet runs a pod only when every Allocate of its containers
    succeeded (it rejects the pod otherwise), so its success patch was lost, by a restart of this
    daemon between the answer and the patch (`hami_control/protocol_model.py`, "restart daemon")."""
    meta = _meta(obj)
    spec = obj.get("spec")
    status = obj.get("status")
    annotations = meta.get("annotations")
    return (
        isinstance(spec, Mapping)
        and spec.get("nodeName") == node
        and not meta.get("deletionTimestamp")
        and isinstance(status, Mapping)
        and status.get("phase") == "Running"
        and isinstance(annotations, Mapping)
        and annotations.get(ann.BIND_PHASE) == BindPhase.ALLOCATING
        and annotations.get(ann.VGPU_NODE) == node
    )


def foreign_gpu_counts(obj: Mapping[str, Any], node: str, resource: str) -> frozenset[int] | None:
    """The GPU counts the containers of a pod bound to `node` ask for (`resource` limits), when the pod
    waits for kubelet's admission but the HAMi scheduler did not place it (no `hami.io/bind-phase`):
    kubelet will call Allocate for it, and hami-node has nothing to give it. None for any other pod."""
    meta = _meta(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName") != node or meta.get("deletionTimestamp"):
        return None
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    if status.get("phase") not in (None, "", "Pending") or status.get("containerStatuses"):
        return None  # running, finished, or admitted already (kubelet reports its containers)
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and ann.BIND_PHASE in annotations:
        return None
    counts: set[int] = set()
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            limits = resources.get("limits") if isinstance(resources, Mapping) else None
            value = limits.get(resource) if isinstance(limits, Mapping) else None
            if value is None:
                continue
            try:
                count = quantity_value(value)
            except QuantityError:
                continue
            if count > 0:
                counts.add(count)
    return frozenset(counts) or None


# --- the tracker -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    pod: PendingPod
    obj: JSONDict


_DELETED_KEPT = 1024

WRITE_DELAY_S = 0.003
"""How long a bind-phase write waits after it is queued, so the Allocate reply that queued it leaves
first (see `PodTracker._write_loop`). Kept short: the control plane's per-node pending window waits for
this write before it binds the next pod with the same GPU count there."""


@dataclass(slots=True)
class _Write:
    """A pod's outcome (`phase`, with `annotations` patched along)."""

    namespace: str
    name: str
    uid: str
    phase: BindPhase
    queued_at: float = 0.0
    pod_patched: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    lock_possible: bool = True
    """Whether the pod may hold HAMi's node lock (False: its bind said it took none,
    `hami.io/bind-node-lock: none`, so the Node is not read)."""


class PodTracker:
    """`ports.PodSource` fed by `kubeapi.watch_node_pods` (it is a `kubeapi.PodEventHandler`). Thread-safe.

    `start()` starts the writer thread; `stop()` ends it (queued writes not yet sent are logged and
    dropped; `flush()` first to wait for them)."""

    def __init__(
        self,
        node_name: str,
        patcher: PodPatcher,
        *,
        events: PodEvents | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        write_delay_s: float = WRITE_DELAY_S,
        read_timeout_s: float = 5.0,
        resource_name: str = "nvidia.com/gpu",
        kubelet: KubeletPodSource | None = None,
    ) -> None:
        """`events` records the Events about pods (None: they are only logged). `kubelet`: kubelet's
        PodResources API (`plugin.kubelet_pods.KubeletPods`): an Allocate is then answered only with the
        pod kubelet lists as being admitted, so pods asking as many GPUs may wait here together (None:
        they are told apart by their GPU counts alone, and the control plane keeps them apart)."""
        self.node_name = node_name
        self._kubelet = kubelet
        self._resource_name = resource_name
        self._write_delay_s = write_delay_s
        self._read_timeout_s = read_timeout_s
        self._events = events
        self._patcher = patcher
        self._retry = retry
        self._cond = threading.Condition()
        self._pending: dict[str, _Entry] = {}
        self._rejected: dict[str, tuple[str, str]] = {}
        """uid -> (key, reason) of pods marked allocating here with unusable annotations."""
        self._foreign: dict[str, tuple[str, frozenset[int]]] = {}
        """uid -> (key, GPU counts) of GPU pods bound here, not yet admitted, that HAMi did not place."""
        self._arrival: dict[str, int] = {}
        """uid -> when the watch first showed the pod bound here (an order, as kubelet's own watch sees
        pods arrive and admits them), for the waiting and the foreign pods."""
        self._arrivals = 0
        self._consumed: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Foreign pods an Allocate was refused for (kubelet rejects them now; their status follows)."""
        self._gone_keys: collections.OrderedDict[str, None] = collections.OrderedDict()
        """namespace/name of the last pods the watch showed deleted (`_unknown`)."""
        self._deleted: collections.OrderedDict[str, None] = collections.OrderedDict()
        """UIDs of the last pods the watch saw deleted: a read of the node's pods that raced with the
        deletion must not bring them back."""
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()
        """UIDs of the last pods this daemon finished (bind-phase success or failed). A pod's outcome is
        final for its UID: a copy that still shows it allocating (the watch has not shown our patch yet,
        or a read of the node's pods raced it) never makes it wait again."""
        self._names: dict[str, PodName] = {}
        """uid -> namespace, name and containers of every pod the watch shows on this node."""
        self._writes: collections.deque[_Write] = collections.deque()
        self._writing = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.patches_sent = 0
        """bind-phase patches that succeeded."""
        self.locks_released = 0
        self.misses = 0
        """Requests the watch could not answer (each cost one read of the node's pods)."""
        self.confirms = 0
        """GETs of a pod the watch matched (`_confirm`)."""
        self.stale = 0
        """Matches the API no longer confirmed (the watch lagged behind the pod's deletion or end)."""
        self.admitted = 0
        """Allocates answered with the container their GetPreferredAllocation found (no second lookup)."""
        self.kubelet_lists = 0
        """Reads of kubelet's PodResources list (one per lookup when `kubelet` is set)."""

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._write_loop, name="hami-pod-writer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the pod writer thread did not stop within %.1fs", timeout)
        with self._cond:
            if self._writes:
                log.warning(
                    "stopping with %d bind-phase write(s) not sent: %s",
                    len(self._writes),
                    ", ".join(f"{w.namespace}/{w.name}={w.phase}" for w in self._writes),
                )
                self._writes.clear()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write has been sent (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._writes or self._writing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # -- the watch side (kubeapi.PodEventHandler) ----------------------------------------------------

    def pods_listed(self, pods: Sequence[JSONDict]) -> None:
        with self._cond:
            old = self._pending
            self._pending = {}
            self._names = {}
            present: set[str] = set()
            for obj in pods:
                uid = _meta(obj).get("uid")
                if isinstance(uid, str):
                    present.add(uid)
                    self._names[uid] = _pod_name(obj)
                self._observe(obj, old.get(pod_key(obj)))
            for uid in [u for u in self._rejected if u not in present]:
                del self._rejected[uid]
            for uid in [u for u in self._foreign if u not in present]:
                del self._foreign[uid]
            for uid in [u for u in self._arrival if u not in present]:
                del self._arrival[uid]

    def pod_event(self, kind: str, pod: JSONDict) -> None:
        with self._cond:
            if kind == "DELETED":
                key, uid = pod_key(pod), _meta(pod).get("uid")
                entry = self._pending.get(key)
                if entry is not None and (not uid or entry.pod.uid == uid):
                    del self._pending[key]
                if isinstance(uid, str):
                    self._names.pop(uid, None)
                    self._rejected.pop(uid, None)
                    self._foreign.pop(uid, None)
                    self._arrival.pop(uid, None)
                    self._deleted[uid] = None
                    while len(self._deleted) > _DELETED_KEPT:
                        self._deleted.popitem(last=False)
                self._gone_keys[key] = None
                while len(self._gone_keys) > _DELETED_KEPT:
                    self._gone_keys.popitem(last=False)
            else:
                uid = _meta(pod).get("uid")
                if isinstance(uid, str) and uid:
                    self._names[uid] = _pod_name(pod)
                self._observe(pod, self._pending.pop(pod_key(pod), None))

    def _observe(self, obj: JSONDict, before: _Entry | None) -> None:
        """Put `obj` in the table if it waits (keeping what was allocated of it); lock held."""
        key = pod_key(obj)
        uid = str(_meta(obj).get("uid") or "")
        counts = foreign_gpu_counts(obj, self.node_name, self._resource_name)
        if counts is None:
            self._foreign.pop(uid, None)
        elif uid not in self._consumed:
            self._foreign[uid] = (key, counts)
            self._arrive(uid)
        if uid and uid not in self._finished and lost_success(obj, self.node_name):
            self._recover_success(obj, uid)
            return
        verdict = waiting_pod(obj, self.node_name)
        if not isinstance(verdict, PendingPod) and uid not in self._foreign:
            self._arrival.pop(uid, None)
        if uid in self._finished and isinstance(verdict, PendingPod):
            return  # a copy from before our bind-phase patch (the watch's, or a read that raced it)
        if isinstance(verdict, Rejected):
            if self._rejected.get(uid) != (key, verdict.reason):
                log.warning(
                    "pod %s is bound to node %s for GPUs but is skipped: %s",
                    key,
                    self.node_name,
                    verdict.reason,
                )
            self._rejected[uid] = (key, verdict.reason)
            return
        self._rejected.pop(uid, None)
        if verdict is None:
            return
        pod = verdict
        if before is not None and before.pod.uid == pod.uid and before.pod.allocation == pod.allocation:
            pod = before.pod
        self._pending[key] = _Entry(pod, obj)
        self._arrive(uid)

    def _recover_success(self, obj: JSONDict, uid: str) -> None:
        """Queue the success patch of a pod kubelet runs that still says allocating (`lost_success`);
        lock held."""
        meta = _meta(obj)
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        log.info(
            "pod %s/%s runs on %s but still says %s=%s (its answer was lost): writing %s",
            namespace,
            name,
            self.node_name,
            ann.BIND_PHASE,
            BindPhase.ALLOCATING,
            BindPhase.SUCCESS,
        )
        entry = self._pending.get(pod_key(obj))
        if entry is not None and entry.pod.uid == uid:
            del self._pending[pod_key(obj)]
        self._arrival.pop(uid, None)
        self._finished[uid] = None
        while len(self._finished) > _DELETED_KEPT:
            self._finished.popitem(last=False)
        self._writes.append(
            _Write(
                namespace, name, uid, BindPhase.SUCCESS, time.monotonic(), lock_possible=_lock_possible(obj)
            )
        )
        self._cond.notify_all()

    def _arrive(self, uid: str) -> None:
        if uid not in self._arrival:
            self._arrivals += 1
            self._arrival[uid] = self._arrivals

    def pod_name(self, uid: str) -> PodName | None:
        """`ports.PodDirectory`: the pod with this UID as the watch shows it."""
        with self._cond:
            return self._names.get(uid)

    # -- the plugin side (ports.PodSource) -------------------------------------------------------------

    def waiting(self) -> tuple[PendingPod, ...]:
        """The pods waiting for devices now, by key."""
        with self._cond:
            return tuple(self._pending[k].pod for k in sorted(self._pending))

    def _candidates(self) -> Iterable[PendingPod]:
        return [e.pod for e in self._pending.values()]

    def match(self, device_count: int, admitted: PodMatch | None = None) -> PodMatch:
        if admitted is not None:
            with self._cond:
                entry = self._pending.get(admitted.pod.key)
                if (
                    entry is not None
                    and entry.pod.uid == admitted.pod.uid
                    and entry.pod.next_entry() == admitted.entry
                    and len(entry.pod.allocation.containers[admitted.entry]) == device_count
                ):
                    self.admitted += 1
                    return PodMatch(entry.pod, admitted.entry)
        return self._match(device_count, allocate=True)

    def _match(self, device_count: int, *, allocate: bool) -> PodMatch:
        """The watch's answer, confirmed by a GET of the pod (`_confirm`); a match the API no longer
        confirms is dropped and the lookup repeats. A miss costs one read of the node's pods (what it
        adds is fresh: not read again). Two matches are each confirmed: ambiguous only if both still
        wait."""
        fresh: set[str] = set()
        listed: list[JSONDict] | None = None
        read_error = ""
        kubelet = self._kubelet_pods() if self._kubelet is not None else None
        if kubelet is not None and self._unknown(kubelet):
            # kubelet has pods the watch has not shown: it is behind kubelet's, read the API first
            before = {p.uid for p in self.waiting()}
            listed, read_error = self._read_node_pods()
            fresh.update(p.uid for p in self.waiting() if p.uid not in before)
        while True:
            ambiguous: AmbiguousPodError | None = None
            found: PodMatch | NoPendingPod | None = None
            candidates: list[PendingPod] = []
            with self._cond:
                try:
                    found = self._resolve(device_count, allocate, kubelet)
                except AmbiguousPodError as err:
                    ambiguous = err
                    candidates = [self._pending[k].pod for k in err.pods if k in self._pending]
                if isinstance(found, NoPendingPod) and listed is not None:
                    raise self._no_match_error(found, listed, read_error, kubelet)
            if ambiguous is not None:
                stale = [p for p in candidates if p.uid not in fresh]
                confirmed = [p for p in stale if self._confirm(p)]
                fresh.update(p.uid for p in confirmed)
                if len(confirmed) == len(stale):
                    raise ambiguous
                continue
            if isinstance(found, PodMatch):
                if found.pod.uid in fresh or self._confirm(found.pod):
                    return found
                continue
            before = {p.uid for p in self.waiting()}
            listed, read_error = self._read_node_pods()
            fresh.update(p.uid for p in self.waiting() if p.uid not in before)

    def _confirm(self, pod: PendingPod) -> bool:
        """Whether the API server still shows `pod` waiting here: the watch may lag behind a deletion
        or an end (kubelet rejected it, it was deleted) that the control plane has seen, and then let a
        pod with the same GPU count be bound here, whose Allocate this one would take
        (`hami_control/protocol_model.py`, "a deleted pod the node daemon still sees"). As HAMi's
        plugin, which reads the pending pod at every Allocate (pkg/device-plugin/nvidiadevice/
        nvinternal/plugin/server.go `Allocate` -> pkg/util/util.go `GetPendingPod`). Gone, being
        deleted, no longer Pending or allocating, another UID or another node: False, and the watch's
        copy is replaced by what the API said. A failed read keeps the watch's answer (logged): the
        API server being away must not fail every admission."""
        self.confirms += 1
        try:
            obj: Mapping[str, Any] | None = self._patcher.get_pod(
                pod.namespace, pod.name, self._read_timeout_s
            )
        except KubeApiError as err:
            if err.status != 404:
                log.warning("Allocate: confirming pod %s failed, answering from the watch: %s", pod.key, err)
                return True
            obj = None
        verdict = waiting_pod(obj, self.node_name) if obj is not None else None
        spec = obj.get("spec") if obj is not None else None
        if (
            isinstance(verdict, PendingPod)
            and verdict.uid == pod.uid
            and isinstance(spec, Mapping)
            and spec.get("nodeName") == self.node_name
        ):
            return True
        self.stale += 1
        why = (
            "gone"
            if obj is None
            else (not_waiting_reason(obj, self.node_name) or "not the pod the watch showed")
        )
        log.info("Allocate: pod %s no longer waits here (%s); its watch copy dropped", pod.key, why)
        with self._cond:
            self._drop(pod, obj)
        return False

    def _drop(self, pod: PendingPod, obj: Mapping[str, Any] | None) -> None:
        """Replace the watch's copy of `pod` (waiting) with what the API server said; lock held."""
        entry = self._pending.get(pod.key)
        if entry is not None and entry.pod.uid == pod.uid:
            del self._pending[pod.key]
        same = obj is not None and _meta(obj).get("uid") == pod.uid
        if same:
            assert obj is not None
            self._observe(dict(obj), None)
        else:  # gone (or another pod under its name): as a DELETED event of it
            self._arrival.pop(pod.uid, None)
            self._deleted[pod.uid] = None
            while len(self._deleted) > _DELETED_KEPT:
                self._deleted.popitem(last=False)
            if obj is not None:
                self._observe(dict(obj), None)

    def _kubelet_pods(self) -> list[KubeletPod]:
        """What kubelet's PodResources API lists now (`plugin.kubelet_pods`); on no answer, Allocate
        fails: pods asking as many GPUs may wait here together, and only kubelet can say which one it
        admits."""
        assert self._kubelet is not None
        self.kubelet_lists += 1
        try:
            return list(self._kubelet.list())
        except KubeletPodsError as err:
            raise NoPendingPodError(
                f"cannot tell which pod kubelet is admitting on node {self.node_name}: {err}"
            ) from None

    def _unknown(self, kubelet: Sequence[KubeletPod]) -> bool:
        """Whether kubelet lists a pod the watch has not shown (by namespace and name): the watch is
        behind kubelet's. A pod the watch showed deleted is not one (kubelet lists it until it has
        stopped it: the watch is ahead there)."""
        with self._cond:
            known = {f"{n.namespace or 'default'}/{n.name}" for n in self._names.values()}
            return any(p.key not in known and p.key not in self._gone_keys for p in kubelet)

    def _admitted_by_kubelet(
        self, pod: PendingPod, obj: Mapping[str, Any], kubelet: Sequence[KubeletPod]
    ) -> bool:
        """Whether kubelet can be admitting `pod`'s next container now (`plugin.kubelet_pods.admitting`)."""
        entry = pod.next_entry()
        names = pod_container_names(obj)
        if entry is None or entry >= len(names):
            return False
        gpu = [names[i] for i, c in enumerate(pod.allocation.containers) if c.devices and i < len(names)]
        return kubelet_admitting(kubelet, pod.key, names[entry], gpu)

    def _resolve(
        self, count: int, allocate: bool, kubelet: Sequence[KubeletPod] | None = None
    ) -> PodMatch | NoPendingPod:
        """The waiting pod kubelet's request for `count` devices is for; lock held.

        With kubelet's PodResources list (`kubelet`), only the pod kubelet lists as being admitted is a
        candidate (`_admitted_by_kubelet`): a foreign GPU pod it lists so is the one kubelet admits.
        Without it: kubelet admits the pods bound to its node one at a time, in the order it sees them
        arrive, which is the order this daemon's watch sees them arrive too. A GPU pod the HAMi
        scheduler did not place (`foreign_gpu_counts`) that arrived before the waiting pod asking as
        many is the one kubelet admits: `ForeignPodError` (nothing to give it; the waiting pod keeps
        waiting), and from an Allocate (`allocate`), that pod is taken out of the running, as kubelet
        now rejects it."""
        if kubelet is None:
            candidates = self._candidates()
        else:
            candidates = [
                e.pod for e in self._pending.values() if self._admitted_by_kubelet(e.pod, e.obj, kubelet)
            ]
        found = match_pending_pod(candidates, count)
        never = 1 << 62
        ahead = [
            (self._arrival.get(uid, 0), key, uid)
            for uid, (key, counts) in self._foreign.items()
            if count in counts
            and (kubelet is None or any(p.key == key and not any(p.devices.values()) for p in kubelet))
        ]
        if kubelet is not None and isinstance(found, PodMatch):
            return found
        if not ahead:
            return found
        arrived, key, uid = min(ahead)
        if isinstance(found, PodMatch) and self._arrival.get(found.pod.uid, never) < arrived:
            return found
        if allocate:
            del self._foreign[uid]
            self._consumed[uid] = None
            while len(self._consumed) > _DELETED_KEPT:
                self._consumed.popitem(last=False)
        behind = f"; {found.pod.key}, bound after it, keeps waiting" if isinstance(found, PodMatch) else ""
        raise ForeignPodError(
            f"kubelet asked for {count} device(s) for pod {key}, which is bound to node {self.node_name} "
            f"without a {ann.BIND_PHASE} annotation: the HAMi scheduler did not place it, so hami-node has "
            "no GPU slices for it (was it created with another schedulerName, or while the HAMi webhook "
            f"was not called?){behind}"
        )

    def _read_node_pods(self) -> tuple[list[JSONDict], str]:
        """A miss: read this node's pods from the API server once (the watch may lag behind the bind
        kubelet saw) and take in the ones that wait and the watch has not shown. Returns the pods read
        and the read's error text ("" when it worked)."""
        self.misses += 1
        try:
            pods, _ = self._patcher.list_pods(f"spec.nodeName={self.node_name}", self._read_timeout_s)
        except KubeApiError as err:
            log.warning("Allocate: reading the pods of node %s failed: %s", self.node_name, err)
            return [], str(err)
        with self._cond:
            known = {e.pod.uid for e in self._pending.values()}
            for obj in pods:
                uid = _meta(obj).get("uid")
                if uid not in known and uid not in self._deleted:
                    if isinstance(uid, str) and uid and uid not in self._names:
                        self._names[uid] = _pod_name(obj)
                    self._observe(obj, None)
        return pods, ""

    def _no_match_error(
        self,
        found: NoPendingPod,
        listed: Sequence[JSONDict] = (),
        read_error: str = "",
        kubelet: Sequence[KubeletPod] | None = None,
    ) -> AllocationError:
        error = found.error(self.node_name)
        extra: list[str] = []
        if kubelet is not None:
            shown = sorted(p.key for p in kubelet if not any(p.devices.values()))
            extra.append(
                "kubelet's PodResources API lists as not yet given devices: "
                + (
                    ", ".join(shown[:5]) + (f" (and {len(shown) - 5} more)" if len(shown) > 5 else "")
                    or "none"
                )
            )
        if self._rejected:
            extra.append(
                "pods skipped for unusable annotations: "
                + "; ".join(f"{key}: {reason}" for key, reason in sorted(self._rejected.values()))
            )
        rejected = {key for key, _ in self._rejected.values()}
        others = sorted(
            (pod_key(obj), why)
            for obj in listed
            if pod_key(obj) not in rejected and (why := not_waiting_reason(obj, self.node_name)) is not None
        )
        if others:
            listed_why = "; ".join(f"{key}: {why}" for key, why in others[:5])
            more = f" (and {len(others) - 5} more)" if len(others) > 5 else ""
            extra.append(f"pods bound here that do not wait for GPUs: {listed_why}{more}")
        if read_error:
            extra.append(f"the API server could not be asked for this node's pods: {read_error}")
        if not extra:
            return error
        return type(error)(f"{error.message}; {'; '.join(extra)}", error.pod)

    def admitting(self, device_count: int) -> PodMatch | None:
        try:
            return self._match(device_count, allocate=False)
        except (AllocationError, ValueError):
            return None

    def pod_object(self, pod: PendingPod) -> dict[str, object]:
        with self._cond:
            entry = self._pending.get(pod.key)
            if entry is None or entry.pod.uid != pod.uid:
                raise KeyError(f"pod {pod.key} (uid {pod.uid}) is not waiting for devices any more")
            return entry.obj

    def allocated(self, match: PodMatch, granted: ContainerAllocation | None = None) -> None:
        with self._cond:
            entry = self._pending.get(match.pod.key)
            current = entry.pod if entry is not None and entry.pod.uid == match.pod.uid else match.pod
            planned = current.current.containers[match.entry]
            updated = current.with_allocated(match.entry, granted)
            if granted is not None and not same_slices(granted, planned):
                names = pod_container_names(entry.obj) if entry is not None else ()
                container = repr(names[match.entry]) if match.entry < len(names) else f"#{match.entry}"
                message = (
                    f"container {container} got GPU(s) {', '.join(granted.uuids)} where the scheduler "
                    f"planned {', '.join(planned.uuids)}: kubelet reused other devices of the pod's init "
                    "containers; the pod holds no more than the scheduler accounted, and "
                    f"{ann.DEVICES_ALLOCATED} will say so"
                )
                log.info("pod %s: %s", match.pod.key, message)
                self._event(current, "Normal", REASON_GPU_REASSIGNED, message)
            if updated.next_entry() is not None:
                if entry is not None and entry.pod.uid == match.pod.uid:
                    entry.pod = updated
                return
            self._finish(updated, BindPhase.SUCCESS)
        log.info("pod %s: every GPU container allocated on %s", match.pod.key, self.node_name)

    def failed(self, pod: PendingPod | None, reason: str, event_reason: str = "") -> None:
        if pod is None:
            log.warning("Allocate failed on node %s (no pod to mark): %s", self.node_name, reason)
            return
        log.warning("Allocate failed for pod %s on node %s: %s", pod.key, self.node_name, reason)
        with self._cond:
            if event_reason:
                self._event(pod, "Warning", event_reason, reason)
            self._finish(pod, BindPhase.FAILED)

    def _event(self, pod: PendingPod, event_type: str, reason: str, message: str) -> None:
        """Record an Event about `pod` (lock held: the recorder neither blocks nor raises)."""
        if self._events is not None:
            self._events.record(
                pod.namespace, pod.name, pod.uid, event_type, reason, message, action=EVENT_ACTION
            )

    def _finish(self, pod: PendingPod, phase: BindPhase) -> None:
        """Take `pod` out of the table and queue its outcome; lock held."""
        entry = self._pending.get(pod.key)
        lock_possible = True
        if entry is not None and entry.pod.uid == pod.uid:
            del self._pending[pod.key]
            lock_possible = _lock_possible(entry.obj)
        if pod.uid:
            self._finished[pod.uid] = None
            while len(self._finished) > _DELETED_KEPT:
                self._finished.popitem(last=False)
        extra: dict[str, str] = {}
        if phase is BindPhase.SUCCESS and pod.granted is not None and pod.granted != pod.allocation:
            text = ann.encode_pod_allocation(pod.granted)
            extra = {ann.DEVICES_ALLOCATED: text, ann.DEVICES_TO_ALLOCATE: text}
        self._writes.append(
            _Write(
                pod.namespace,
                pod.name,
                pod.uid,
                phase,
                time.monotonic(),
                annotations=extra,
                lock_possible=lock_possible,
            )
        )
        self._cond.notify_all()

    # -- the writer -----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        backoff = self._retry.backoff()
        while True:
            with self._cond:
                while not self._writes and not self._stopping:
                    self._cond.wait()
                # Not urgent: let the Allocate that queued the write answer kubelet first (the
                # write's HTTP call would otherwise compete with the reply for the GIL and CPU).
                while (
                    not self._stopping
                    and (wait := self._writes[0].queued_at + self._write_delay_s - time.monotonic()) > 0
                ):
                    self._cond.wait(wait)
                if self._stopping:
                    return
                write = self._writes[0]
                self._writing = True
            try:
                done = self._send(write, backoff.report_level())
            except Exception:
                log.exception("pod %s/%s: bind-phase write failed unexpectedly", write.namespace, write.name)
                done = False
            with self._cond:
                self._writing = False
                if done:
                    self._writes.popleft()
                    if (failures := backoff.reset()) > 1:
                        log.info(
                            "bind-phase writes: the API server answers again after %d failures", failures
                        )
                self._cond.notify_all()
                if done:
                    continue
                delay = backoff.next()
                deadline = time.monotonic() + delay
                while not self._stopping and (remaining := deadline - time.monotonic()) > 0:
                    self._cond.wait(remaining)

    def _send(self, write: _Write, level: int) -> bool:
        """One try at `write`; True when it is finished (sent, or pointless to retry)."""
        key = f"{write.namespace}/{write.name}"
        if not write.pod_patched:
            try:
                self._patcher.patch_pod_annotations(
                    write.namespace, write.name, {**write.annotations, ann.BIND_PHASE: write.phase.value}
                )
            except KubeApiError as err:
                if err.retriable:
                    log.log(
                        level,
                        "pod %s: writing %s=%s failed, will retry: %s",
                        key,
                        ann.BIND_PHASE,
                        write.phase,
                        err,
                    )
                    return False
                log.error("pod %s: cannot write %s=%s: %s", key, ann.BIND_PHASE, write.phase, err)
            else:
                self.patches_sent += 1
                log.info("pod %s: %s=%s", key, ann.BIND_PHASE, write.phase)
            write.pod_patched = True
        if not write.lock_possible:
            return True
        return self._release_node_lock(write, level)

    def _release_node_lock(self, write: _Write, level: int) -> bool:
        """Remove HAMi's node lock if it names the pod; True when finished."""
        try:
            node = self._patcher.get_node(self.node_name)
            meta = _meta(node)
            annotations = meta.get("annotations")
            text = annotations.get(ann.NODE_LOCK) if isinstance(annotations, Mapping) else None
            if not isinstance(text, str):
                return True
            try:
                lock = ann.decode_node_lock(text)
            except WireFormatError as err:
                log.debug("node %s: leaving a lock that does not decode: %s", self.node_name, err)
                return True
            if (lock.namespace, lock.pod) != (write.namespace, write.name):
                return True
            version = meta.get("resourceVersion")
            self._patcher.patch_node_annotations(
                self.node_name, {ann.NODE_LOCK: None}, version if isinstance(version, str) else None
            )
        except KubeApiError as err:
            if err.retriable:
                log.log(level, "node %s: releasing the lock of pod %s/%s failed, will retry: %s",
                        self.node_name, write.namespace, write.name, err)  # fmt: skip
                return False
            log.error(
                "node %s: cannot release the lock of pod %s/%s: %s",
                self.node_name,
                write.namespace,
                write.name,
                err,
            )
            return True
        self.locks_released += 1
        log.info(
            "node %s: released %s held by pod %s/%s",
            self.node_name,
            ann.NODE_LOCK,
            write.namespace,
            write.name,
        )
        return True


__all__ = [
    "EVENT_ACTION",
    "PodEvents",
    "PodPatcher",
    "PodTracker",
    "Rejected",
    "lost_success",
    "pod_key",
    "waiting_pod",
]
