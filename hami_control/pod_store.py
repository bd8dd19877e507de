"""The control plane's pod store: one `PodRecord` per pod (what is kept of it), updated once per watch
event, and the namespace quota usage derived from it.

Quota usage (`PodCache`, `quota_store.ClusterQuotaView`). Each pod's quota usage is computed once per
watch event (`quota.pod_quota_usage`) and added to / removed from its namespace's running total, so a
quota check is two dictionary lookups, never a walk over pods. Every non-terminal pod counts (Pending
included); Succeeded and Failed pods and deleted pods do not.

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

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api import annotations as ann
from hami_api.resources import ContainerRequest, pod_requests
from hami_control.cache import TERMINAL_PHASES
from hami_control.config import ControlConfig
from hami_control.quota import (
    QuotaUsage,
    allocation_quota_usage,
    pod_quota_usage,
)
from hami_kube.client import JSONDict
from hami_kube.reflector import replace_all

log = logging.getLogger(__name__)


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
        requests = pod_requests(pod, config.requests.names, config.requests.defaults)
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


__all__ = [
    "KEPT_ANNOTATIONS",
    "PodCache",
    "PodKey",
    "PodListener",
    "PodRecord",
    "pod_record",
]
