"""hami-control's watch-driven caches and writers over the one access layer (`hami_kube`: client,
reflector, errors, backoff): the caches the webhook and the extender read (pods, ResourceQuotas, the
cluster's GPUs), the Binding writer and the event recorder.

Reflectors. Each cache is fed by a `hami_kube.reflector.Reflector` (list, then watch with bookmarks;
resume, relist on 410, backoff). `synced` is set after the first list; /readyz waits for it.

Quota usage (`PodCache`, `ClusterQuotaView`). Each pod's quota usage is computed once per watch event
(`quota.pod_quota_usage`) and added to / removed from its namespace's running total, so a quota check
is two dictionary lookups, never a walk over pods. Every non-terminal pod counts (Pending included);
Succeeded and Failed pods and deleted pods do not.

Assumed admissions. Between the webhook allowing a pod and the watch showing it there is a window
(the API server still has to store it, then the event has to arrive). A burst of creates inside that
window would each see the same usage and could overshoot the quota together. So the webhook route calls
`ClusterQuotaView.assume()` for every pod it admits (not for dry runs), synchronously, before it
answers: the usage is recorded against the namespace under the pod's name (or, for `generateName` pods,
whose final name is chosen by the API server after admission, under the generateName prefix). The
entry is dropped when the watch shows a new pod of that name (or one with that generateName), or after
`assume_ttl_s` (60 s) when the pod never appears (another webhook denied it, the create failed). A
check therefore counts watched usage + assumed usage: a burst cannot overshoot; a failed create holds
its quota for at most the TTL.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api import annotations as ann
from hami_api.resources import ContainerRequest, pod_requests
from hami_control.binder import BindRejected
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.quota import (
    QuotaLimitError,
    QuotaLimits,
    QuotaUsage,
    allocation_quota_usage,
    limits_from_resource_quota,
    pod_quota_usage,
)
from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.client import JSONDict, KubeApi
from hami_kube.errors import KubeApiError
from hami_kube.reflector import Lister, Reflector, WatchSink, replace_all

log = logging.getLogger(__name__)

# --- the pod cache ----------------------------------------------------------------------------------------

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
KEPT_ANNOTATIONS = (
    ann.DEVICES_TO_ALLOCATE,
    ann.DEVICES_ALLOCATED,
    ann.VGPU_NODE,
    ann.VGPU_TIME,
    ann.BIND_PHASE,
    ann.BIND_TIME,
)
"""The pod annotations the cache keeps (HAMi's allocation and bind bookkeeping)."""

PodKey = tuple[str, str]
"""(namespace, name)."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the control plane keeps of one pod (the rest of the object is dropped)."""

    namespace: str
    name: str
    uid: str
    phase: str
    node_name: str
    scheduler_name: str
    resource_version: str
    requests: tuple[ContainerRequest | None, ...]
    """Per container, init containers first; empty when the pod's resources do not parse."""
    annotations: Mapping[str, str]
    """The `KEPT_ANNOTATIONS` the pod carries."""
    usage: QuotaUsage
    """What the pod counts against its namespace's GPU quota (zero when terminal or GPU-less)."""
    init_containers: int = 0

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def asks_gpu(self) -> bool:
        return any(r is not None for r in self.requests)


_ZERO = QuotaUsage()


def pod_record(pod: Mapping[str, Any], config: ControlConfig) -> PodRecord:
    """Distil a pod (plain JSON) into a `PodRecord`. Never raises on bad resources or annotations: a pod
    whose GPU resources do not parse asks nothing, a bad allocation annotation falls back to the request."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    raw_annotations = meta.get("annotations") or {}
    kept = {k: str(raw_annotations[k]) for k in KEPT_ANNOTATIONS if k in raw_annotations}
    phase = str(status.get("phase") or "Pending")
    try:
        requests = pod_requests(pod, config.resource_names, config.request_defaults)
        usage = _ZERO if phase in TERMINAL_PHASES else pod_quota_usage(pod, config)
    except ValueError as err:
        log.debug(
            "pod %s/%s: GPU resources not understood (%s); counted as asking none", namespace, name, err
        )
        requests, usage = (), _ZERO
    init_containers = len(spec.get("initContainers") or ()) if isinstance(spec, Mapping) else 0
    allocated = kept.get(ann.DEVICES_ALLOCATED)
    if allocated and phase not in TERMINAL_PHASES:
        try:
            allocation = ann.decode_pod_allocation(allocated, ann.DEVICES_ALLOCATED)
            usage = allocation_quota_usage(allocation, init_containers)
        except ValueError as err:
            log.debug("pod %s/%s: %s; quota counts its request instead", namespace, name, err)
    return PodRecord(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        phase=phase,
        node_name=str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else "",
        scheduler_name=str(spec.get("schedulerName") or "") if isinstance(spec, Mapping) else "",
        resource_version=str(meta.get("resourceVersion") or ""),
        requests=requests,
        annotations=kept,
        usage=usage,
        init_containers=init_containers,
    )


PodListener = Callable[[PodRecord | None, PodRecord | None], None]
"""Called with (old, new) on every change: (None, new) added, (old, None) deleted."""


@dataclass(slots=True)
class _Assumed:
    """One admitted pod not yet seen by the watch: keyed by its name, or by its generateName prefix."""

    key: str
    by_name: bool
    usage: QuotaUsage
    expires_at: float
    live: bool = True


class _AssumedInNamespace:
    """A namespace's assumed admissions with their running total. Entries are found by name (dict) or
    generateName (FIFO per prefix) and expire in admission order, so every operation is O(1) amortised
    however many admissions wait (a dropped entry is only marked; its expiry unlinks it)."""

    __slots__ = ("by_generate_name", "by_name", "order", "total")

    def __init__(self) -> None:
        self.total = _ZERO
        self.order: collections.deque[_Assumed] = collections.deque()
        self.by_name: dict[str, _Assumed] = {}
        self.by_generate_name: dict[str, collections.deque[_Assumed]] = {}

    def add(self, entry: _Assumed) -> None:
        if entry.by_name:
            old = self.by_name.get(entry.key)
            if old is not None:
                self.drop(old)
            self.by_name[entry.key] = entry
        else:
            self.by_generate_name.setdefault(entry.key, collections.deque()).append(entry)
        self.order.append(entry)
        self.total += entry.usage

    def drop(self, entry: _Assumed) -> None:
        if not entry.live:
            return
        entry.live = False
        self.total -= entry.usage
        if entry.by_name:
            if self.by_name.get(entry.key) is entry:
                del self.by_name[entry.key]
        else:
            queue = self.by_generate_name.get(entry.key)
            if queue is not None:
                while queue and not queue[0].live:
                    queue.popleft()
                if not queue:
                    del self.by_generate_name[entry.key]

    def expire(self, now: float) -> None:
        order = self.order
        while order and (order[0].expires_at <= now or not order[0].live):
            self.drop(order.popleft())

    def seen(self, name: str, generate_name: str) -> None:
        entry = self.by_name.get(name)
        if entry is None and generate_name:
            queue = self.by_generate_name.get(generate_name)
            entry = next((e for e in queue if e.live), None) if queue else None
        if entry is not None:
            self.drop(entry)

    @property
    def empty(self) -> bool:
        return not self.order


class PodCache:
    """Every pod of the cluster as a `PodRecord`, and each namespace's quota usage kept as a running
    total (see the module docstring, also for the assumed admissions). A `WatchSink` for a `Reflector`."""

    def __init__(
        self,
        config: ControlConfig,
        *,
        assume_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.assume_ttl_s = assume_ttl_s
        self.clock = clock
        self._pods: dict[PodKey, PodRecord] = {}
        self._used: dict[str, QuotaUsage] = {}
        self._assumed: dict[str, _AssumedInNamespace] = {}
        self._listeners: list[PodListener] = []
        self._fresh: dict[PodKey, PodRecord] = {}

    # reading

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, namespace: str, name: str) -> PodRecord | None:
        return self._pods.get((namespace, name))

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def used(self, namespace: str) -> QuotaUsage:
        """The namespace's usage: watched non-terminal pods plus admissions not yet seen by the watch."""
        used = self._used.get(namespace, _ZERO)
        assumed = self._assumed.get(namespace)
        if assumed is not None:
            assumed.expire(self.clock())
            if assumed.empty:
                del self._assumed[namespace]
            else:
                used += assumed.total
        return used

    def assumed(self, namespace: str) -> int:
        """How many admissions of the namespace are still waiting for the watch (for tests and logs)."""
        assumed = self._assumed.get(namespace)
        if assumed is None:
            return 0
        assumed.expire(self.clock())
        return sum(1 for a in assumed.order if a.live)

    def add_listener(self, listener: PodListener) -> None:
        self._listeners.append(listener)

    # admissions

    def assume(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> None:
        """Count `usage` for a pod the webhook just admitted until the watch shows it (or the TTL ends).
        `name` is "" for pods named by `generate_name` (the API server picks the name after admission)."""
        if usage.memory <= 0 and usage.cores <= 0:
            return
        if name and (namespace, name) in self._pods:
            return  # already visible (cannot happen for a CREATE, but never count twice)
        key, by_name = (name, True) if name else (generate_name, False)
        assumed = self._assumed.get(namespace)
        if assumed is None:
            assumed = self._assumed[namespace] = _AssumedInNamespace()
        assumed.add(_Assumed(key, by_name, usage, self.clock() + self.assume_ttl_s))

    def _seen(self, pod: Mapping[str, Any], namespace: str, name: str) -> None:
        """A pod appeared in the watch: drop the admission assumed for it (by name, else by generateName)."""
        assumed = self._assumed.get(namespace)
        if assumed is None:
            return
        assumed.seen(name, str((pod.get("metadata") or {}).get("generateName") or ""))
        assumed.expire(self.clock())
        if assumed.empty:
            del self._assumed[namespace]

    # the watch

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._fresh = {}

    def add_page(self, items: Sequence[JSONDict]) -> None:
        fresh = self._fresh
        for pod in items:
            record = pod_record(pod, self.config)
            fresh[record.key] = record
            if record.key not in self._pods:
                self._seen(pod, record.namespace, record.name)

    def end_replace(self) -> None:
        fresh, self._fresh = self._fresh, {}
        old_pods, self._pods = self._pods, fresh
        self._used = {}
        for record in fresh.values():
            self._add_usage(record)
        if self._listeners:
            for key, old in old_pods.items():
                if key not in fresh:
                    self._notify(old, None)
            for key, new in fresh.items():
                old_record = old_pods.get(key)
                if old_record is None or old_record.resource_version != new.resource_version:
                    self._notify(old_record, new)

    def apply(self, kind: str, obj: JSONDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._pods.get(key)
        if kind == "DELETED":
            if old is None:
                return
            del self._pods[key]
            self._remove_usage(old)
            self._notify(old, None)
            return
        record = pod_record(obj, self.config)
        if old is None:
            self._seen(obj, record.namespace, record.name)
        else:
            self._remove_usage(old)
        self._pods[key] = record
        self._add_usage(record)
        self._notify(old, record)

    def _add_usage(self, record: PodRecord) -> None:
        if record.usage.memory or record.usage.cores:
            self._used[record.namespace] = self._used.get(record.namespace, _ZERO) + record.usage

    def _remove_usage(self, record: PodRecord) -> None:
        if record.usage.memory or record.usage.cores:
            left = self._used.get(record.namespace, _ZERO) - record.usage
            if left.memory or left.cores:
                self._used[record.namespace] = left
            else:
                self._used.pop(record.namespace, None)

    def _notify(self, old: PodRecord | None, new: PodRecord | None) -> None:
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("a pod cache listener failed")


# --- the ResourceQuota cache ------------------------------------------------------------------------------


class QuotaCache:
    """Each namespace's GPU limits, the tightest over its ResourceQuotas (recomputed per event for that
    namespace only). A quota whose GPU values do not parse is logged and left out. A `WatchSink`."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self._quotas: dict[PodKey, QuotaLimits] = {}
        self._limits: dict[str, QuotaLimits] = {}
        self._pages: list[JSONDict] = []

    def limits(self, namespace: str) -> QuotaLimits:
        return self._limits.get(namespace, _UNLIMITED)

    def namespaces(self) -> Iterable[str]:
        """The namespaces with a GPU limit."""
        return list(self._limits)

    def __len__(self) -> int:
        return len(self._quotas)

    def _limits_of(self, obj: Mapping[str, Any]) -> QuotaLimits:
        try:
            return limits_from_resource_quota(obj, self.config)
        except QuotaLimitError as err:
            log.warning("%s; this quota's GPU limits are ignored", err)
            return _UNLIMITED

    def _recompute(self, namespace: str) -> None:
        limits = _UNLIMITED
        for (ns, _name), quota in self._quotas.items():
            if ns == namespace:
                limits = limits.tightest(quota)
        if limits.unlimited:
            self._limits.pop(namespace, None)
        else:
            self._limits[namespace] = limits

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._pages = []

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._pages.extend(items)  # ResourceQuotas are few

    def end_replace(self) -> None:
        items, self._pages = self._pages, []
        self._quotas = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            self._quotas[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = self._limits_of(
                obj
            )
        self._limits = {}
        for namespace in {ns for ns, _ in self._quotas}:
            self._recompute(namespace)

    def apply(self, kind: str, obj: JSONDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == "DELETED":
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = self._limits_of(obj)
        self._recompute(key[0])


_UNLIMITED = QuotaLimits()


class ClusterQuotaView:
    """The `quota.QuotaView` the webhook reads: limits from the ResourceQuota cache, usage from the pod
    cache (watched + assumed). With quota enforcement off it answers "unlimited" and watches no quotas."""

    def __init__(self, pods: PodCache, quotas: QuotaCache | None) -> None:
        self.pods = pods
        self.quotas = quotas

    def limits(self, namespace: str) -> QuotaLimits:
        return self.quotas.limits(namespace) if self.quotas is not None else _UNLIMITED

    def namespaces(self) -> Iterable[str]:
        """The namespaces with a GPU limit (for the quota metrics)."""
        return self.quotas.namespaces() if self.quotas is not None else ()

    def used(self, namespace: str) -> QuotaUsage:
        return self.pods.used(namespace)

    def assume(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> None:
        self.pods.assume(namespace, name, generate_name, usage)


# --- writes: bindings and events -------------------------------------------------------------------------


class KubeBindingWriter:
    """`binder.BindingWriter` over the API: one POST pods/<name>/binding whose annotations the API
    server copies onto the pod, with the pod's UID as precondition (a pod deleted and re-created under
    the same name gets 409, not someone else's GPUs)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        metadata: JSONDict = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)
        except KubeApiError as err:
            raise BindRejected(err.status, err.reason, err.message) from None


@dataclass(frozen=True, slots=True)
class EventLimits:
    """Event rate limits: per pod and reason at most one event per `per_object_s`; overall a token
    bucket of `burst` events refilled at `per_second`. Dropped events are counted, never queued."""

    per_object_s: float = 10.0
    per_second: float = 20.0
    burst: int = 50
    queue: int = 1000


class KubeEventRecorder:
    """`binder.EventRecorder` over the API: core/v1 Events on the pod, written by one background task so
    a slow API server never delays a bind. Rate-limited (`EventLimits`); `sent`/`dropped` count them."""

    def __init__(
        self,
        api: KubeApi,
        *,
        component: str = "hami-scheduler",
        instance: str = "",
        limits: EventLimits = EventLimits(),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.component = component
        self.instance = instance
        self.limits = limits
        self.clock = clock
        self.wall_clock = wall_clock
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._last: collections.OrderedDict[tuple[str, str, str], float] = collections.OrderedDict()
        self._tokens = float(limits.burst)
        self._refilled = clock()
        self._queue: asyncio.Queue[JSONDict] = asyncio.Queue(limits.queue)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="events")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _admit(self, key: tuple[str, str, str]) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.limits.per_object_s:
            return False
        self._tokens = min(
            float(self.limits.burst), self._tokens + (now - self._refilled) * self.limits.per_second
        )
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > 10_000:
            self._last.popitem(last=False)
        return True

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        if not self._admit((namespace, name, reason)):
            self.dropped += 1
            return
        stamp = datetime.datetime.fromtimestamp(self.wall_clock(), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        event: JSONDict = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", event)
                self.sent += 1
            except KubeApiError as err:
                self.failed += 1
                log.debug(
                    "event %s on %s not written: %s", event["reason"], event["involvedObject"]["name"], err
                )


# --- the extender's cluster cache, fed by the same watches ----------------------------------------------


class FanoutSink:
    """One reflector feeding several sinks (the pods watch feeds the quota cache and the GPU cache)."""

    def __init__(self, *sinks: WatchSink) -> None:
        self.sinks = sinks

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        for sink in self.sinks:
            sink.begin_replace()

    def add_page(self, items: Sequence[JSONDict]) -> None:
        for sink in self.sinks:
            sink.add_page(items)

    def end_replace(self) -> None:
        for sink in self.sinks:
            sink.end_replace()

    def apply(self, kind: str, obj: JSONDict) -> None:
        for sink in self.sinks:
            sink.apply(kind, obj)


PodHook = Callable[[str, JSONDict, bool], None]
"""(uid, pod, deleted) after the GPU cache took a pod event: the binder's window watches bind-phase."""
NodeHook = Callable[[str], None]
"""(node name) after the GPU cache took a node event."""


class GPUPodSink:
    """Pods -> `ClusterCache` (their GPU slices), then the hooks."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.hooks: list[PodHook] = []
        self._listed: set[str] = set()

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._listed = set()

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._listed |= self.cache.pods_listed(items)
        for pod in items:
            self._notify(pod, False)

    def end_replace(self) -> None:
        listed, self._listed = self._listed, set()
        self.cache.pods_not_listed(listed)

    def apply(self, kind: str, obj: JSONDict) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            self.cache.pod_deleted(
                str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
            )
        else:
            self.cache.pod_upserted(obj)
        self._notify(obj, kind == "DELETED")

    def _notify(self, pod: JSONDict, deleted: bool) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        for hook in self.hooks:
            try:
                hook(uid, pod, deleted)
            except Exception:
                log.exception("a pod hook failed")


class GPUNodeSink:
    """Nodes -> `ClusterCache` (their GPUs), HAMi's node lock annotation kept per node, then the hooks."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.locks: dict[str, str] = {}
        """node -> raw `hami.io/mutex.lock` value, for nodes that carry one."""
        self.hooks: list[NodeHook] = []
        self._listed: set[str] = set()
        self._locks: dict[str, str] = {}

    def _note_lock(self, name: str, obj: JSONDict | None) -> None:
        value = ((obj or {}).get("metadata") or {}).get("annotations", {}) or {}
        lock = value.get(ann.NODE_LOCK) if isinstance(value, dict) else None
        if isinstance(lock, str) and lock:
            self.locks[name] = lock
        else:
            self.locks.pop(name, None)

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._listed = set()
        self._locks = {}

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._listed |= self.cache.nodes_listed(items)
        for node in items:
            name = str((node.get("metadata") or {}).get("name") or "")
            lock = ((node.get("metadata") or {}).get("annotations") or {}).get(ann.NODE_LOCK)
            if isinstance(lock, str) and lock:
                self._locks[name] = lock
            self._notify(name)

    def end_replace(self) -> None:
        listed, self._listed = self._listed, set()
        self.cache.nodes_not_listed(listed)
        self.locks.clear()
        self.locks.update(self._locks)
        self._locks = {}

    def apply(self, kind: str, obj: JSONDict) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self.cache.node_deleted(name)
            self._note_lock(name, None)
        else:
            self.cache.node_upserted(obj)
            self._note_lock(name, obj)
        self._notify(name)

    def _notify(self, name: str) -> None:
        for hook in self.hooks:
            try:
                hook(name)
            except Exception:
                log.exception("a node hook failed")


# --- everything watched -----------------------------------------------------------------------------------


class ClusterCaches:
    """The reflectors and caches hami-control runs: pods always, ResourceQuotas when quotas are enforced.
    `start()` launches them on the running loop; `readiness()` is what /readyz reports."""

    def __init__(
        self,
        api: Lister,
        config: ControlConfig,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
    ) -> None:
        self.config = config
        self.pods = PodCache(config)
        self.quotas = QuotaCache(config) if config.enforce_quota else None
        self.quota_view = ClusterQuotaView(self.pods, self.quotas)
        self.gpus = ClusterCache(config.resource_names)
        self.gpu_pods = GPUPodSink(self.gpus)
        self.gpu_nodes = GPUNodeSink(self.gpus)
        self.reflectors = [
            Reflector(
                api,
                "pods",
                "/api/v1/pods",
                FanoutSink(self.pods, self.gpu_pods),
                retry=retry,
                watch_timeout_s=watch_timeout_s,
            ),
            Reflector(
                api, "nodes", "/api/v1/nodes", self.gpu_nodes, retry=retry, watch_timeout_s=watch_timeout_s
            ),
        ]
        if self.quotas is not None:
            self.reflectors.append(
                Reflector(
                    api,
                    "resourcequotas",
                    "/api/v1/resourcequotas",
                    self.quotas,
                    retry=retry,
                    watch_timeout_s=watch_timeout_s,
                )
            )
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self._tasks:
            return
        started = time.monotonic()
        for reflector in self.reflectors:
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{reflector.name}"))
        self._tasks.append(asyncio.create_task(self._report_synced(started), name="watch-synced"))

    async def _report_synced(self, started: float) -> None:
        await self.wait_synced()
        quotas = f", {len(self.quotas)} ResourceQuotas" if self.quotas is not None else ""
        log.info(
            "caches synced in %.0f ms: %d pods, %d GPU nodes%s",
            (time.monotonic() - started) * 1000,
            len(self.pods),
            self.gpus.stats().nodes,
            quotas,
        )

    async def wait_synced(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))

    async def resync(self, names: Sequence[str] = ("pods", "nodes")) -> None:
        """Rebuild the named caches from a fresh list (a new leader does, before it answers): their
        reflectors are restarted without a resourceVersion, and this returns once they have listed."""
        for reflector in self.reflectors:
            if reflector.name not in names:
                continue
            task = next((t for t in self._tasks if t.get_name() == f"watch-{reflector.name}"), None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._tasks.remove(task)
            reflector.resource_version = None
            reflector.synced.clear()
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{reflector.name}"))
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors if r.name in names))

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def readiness(self) -> dict[str, bool]:
        return {r.name: r.synced.is_set() for r in self.reflectors}

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "KEPT_ANNOTATIONS",
    "TERMINAL_PHASES",
    "ClusterCaches",
    "ClusterQuotaView",
    "EventLimits",
    "FanoutSink",
    "GPUNodeSink",
    "GPUPodSink",
    "KubeBindingWriter",
    "KubeEventRecorder",
    "PodCache",
    "PodListener",
    "PodRecord",
    "QuotaCache",
    "pod_record",
]
