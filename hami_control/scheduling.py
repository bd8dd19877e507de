"""The scheduler extender as a service: the pure `/filter` and `/prioritize` logic (extender.py) and the
binder, wired to the watch-fed cluster cache, the vectorised GPU table, the quota view, events and
metrics. The HTTP routes (server.py) hand request bodies here and send back what comes out.

- Before answering, the GPU table takes the nodes the cache changed since the last request
  (`ClusterCache.drain_changed`), so a request costs O(changed nodes) to catch up, never a rebuild.
- The pod of each filter is remembered (by UID, the last `REMEMBERED_PODS`), because kube-scheduler's
  `/bind` names only the pod; a bind for a pod not remembered reads it from the API once.
- Quota: the pod being filtered is already counted in its namespace's usage (the webhook assumed it and
  the watch shows it Pending), so the view given to the filter subtracts the pod's own request; else a
  pod asking exactly the remaining quota would never fit.
- A filter that leaves no node writes a `FilteringFailed` event on the pod (rate-limited by the
  recorder) with the reasons, the way HAMi does.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from hami_api.annotations import decode_node_lock
from hami_api.errors import WireFormatError
from hami_api.types import NodeLock
from hami_control.binder import Binder, EventRecorder
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.extender import ExtenderArgsError, PodAsk, filter_pod, prioritize_pod, read_pod_ask
from hami_control.gputable import GPUTable
from hami_control.metrics import ControlMetrics
from hami_control.quota import QuotaLimits, QuotaUsage, QuotaView, pod_quota_usage

log = logging.getLogger(__name__)

REMEMBERED_PODS = 10_000

PodReader = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(namespace, name) -> the pod's JSON from the API, None when it does not exist."""


class _QuotaWithoutPod:
    """The namespace's usage minus the pod being filtered (it counts once bound, as everything else)."""

    def __init__(self, view: QuotaView, namespace: str, own: QuotaUsage) -> None:
        self.view, self.namespace, self.own = view, namespace, own

    def limits(self, namespace: str) -> QuotaLimits:
        return self.view.limits(namespace)

    def used(self, namespace: str) -> QuotaUsage:
        used = self.view.used(namespace)
        if namespace != self.namespace:
            return used
        return QuotaUsage(max(0, used.memory - self.own.memory), max(0, used.cores - self.own.cores))


def _slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What `read_pod_ask` reads of a pod (identity, annotations, containers' names and resources): a
    remembered pod then costs ~1 KB instead of the whole object (managedFields, env, volumes ...)."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = spec if isinstance(spec, Mapping) else {}
    slim_spec: dict[str, Any] = {}
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        if isinstance(containers, list):
            slim_spec[key] = [
                {k: c[k] for k in ("name", "resources", "restartPolicy") if k in c}
                if isinstance(c, Mapping)
                else c
                for c in containers
            ]
    return {
        "metadata": {k: meta[k] for k in ("namespace", "name", "uid", "annotations") if k in meta},
        "spec": slim_spec,
    }


def _error_body(message: str, *, bind: bool = False) -> dict[str, Any]:
    if bind:
        return {"Error": message}
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def _decode(body: bytes) -> Any:
    return orjson.loads(body)


class Extender:
    """`/filter`, `/prioritize` and `/bind` over the live caches. Not thread-safe: one event loop."""

    def __init__(
        self,
        config: ControlConfig,
        cache: ClusterCache,
        *,
        quota: QuotaView | None = None,
        metrics: ControlMetrics | None = None,
        events: EventRecorder | None = None,
        read_pod: PodReader | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.quota = quota
        self.metrics = metrics
        self.events = events
        self.read_pod = read_pod
        self.table = GPUTable()
        self.binder: Binder | None = None
        self._pods: collections.OrderedDict[str, Mapping[str, Any]] = collections.OrderedDict()

    # --- the cache and the table ----------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the GPU table up to the cache (only the nodes changed since last time)."""
        changed = self.cache.drain_changed()
        if changed:
            self.table.sync(changed, self.cache.node_gpus)

    def _quota_for(self, pod: object) -> QuotaView | None:
        if self.quota is None or not self.config.quota.enforce or not isinstance(pod, Mapping):
            return self.quota
        meta = pod.get("metadata")
        namespace = str(meta.get("namespace") or "default") if isinstance(meta, Mapping) else "default"
        try:
            own = pod_quota_usage(pod, self.config)
        except ValueError:
            return self.quota
        return _QuotaWithoutPod(self.quota, namespace, own) if own.memory or own.cores else self.quota

    def _remember(self, pod: object) -> None:
        if not isinstance(pod, Mapping):
            return
        meta = pod.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if isinstance(uid, str) and uid:
            self._pods[uid] = _slim(pod)
            self._pods.move_to_end(uid)
            while len(self._pods) > REMEMBERED_PODS:
                self._pods.popitem(last=False)

    # --- the verbs ------------------------------------------------------------------------------------

    def filter(self, body: bytes) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            args = _decode(body)
        except orjson.JSONDecodeError as err:
            return _error_body(f"ExtenderArgs: body is not JSON: {err}")
        self.sync()
        pod = args.get("Pod") if isinstance(args, Mapping) else None
        reasons: collections.Counter[str] = collections.Counter()
        result = filter_pod(
            args, self.cache, self.config, self._quota_for(pod), table=self.table, reasons=reasons
        )
        if not result["Error"]:
            self._remember(pod)
            if self.events is not None and not (result["NodeNames"] or (result["Nodes"] or {}).get("items")):
                self._filtering_failed(pod, result)
        if self.metrics is not None:
            self.metrics.observe_filter(time.perf_counter() - started, reasons)
        return result

    def _filtering_failed(self, pod: object, result: Mapping[str, Any]) -> None:
        if not isinstance(pod, Mapping) or self.events is None:
            return
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            return
        failed = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
        if not failed:
            return  # a pod without GPU request, or no candidates at all
        shown = "; ".join(f"{node}: {why}" for node, why in list(failed.items())[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        self.events.record(
            str(meta.get("namespace") or "default"),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
            "Warning",
            "FilteringFailed",
            f"no GPU node fits: {shown}{more}",
        )

    def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        started = time.perf_counter()
        try:
            args = _decode(body)
        except orjson.JSONDecodeError:
            return []
        self.sync()
        pod = args.get("Pod") if isinstance(args, Mapping) else None
        result = prioritize_pod(args, self.cache, self.config, self._quota_for(pod), table=self.table)
        if self.metrics is not None:
            self.metrics.observe_prioritize(time.perf_counter() - started)
        return result

    async def bind(self, body: bytes) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            args = _decode(body)
        except orjson.JSONDecodeError as err:
            result = _error_body(f"ExtenderBindingArgs: body is not JSON: {err}", bind=True)
            outcome = "bad_request"
        else:
            if self.binder is None:
                return _error_body("this replica does not bind", bind=True)
            self.sync()
            before = dict(self.binder.outcomes)
            result = await self.binder.bind(args)
            changed = [k for k, v in self.binder.outcomes.items() if v != before.get(k, 0)]
            outcome = changed[0] if len(changed) == 1 else ("success" if not result.get("Error") else "error")
        if self.metrics is not None:
            self.metrics.observe_bind(time.perf_counter() - started, outcome)
        return result

    # --- for the binder -------------------------------------------------------------------------------

    async def pod_ask(self, namespace: str, name: str, uid: str) -> PodAsk | None:
        """The GPU ask of the pod kube-scheduler asks to bind (`binder.AskSource`)."""
        pod = self._pods.get(uid) if uid else None
        if pod is None:
            if self.read_pod is None:
                raise LookupError(f"pod {namespace}/{name} not found")
            pod = await self.read_pod(namespace, name)
            if pod is None:
                raise LookupError(f"pod {namespace}/{name} not found")
            meta = pod.get("metadata")
            found = str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""
            if uid and found and found != uid:
                raise LookupError(f"pod {namespace}/{name} not found with UID {uid} (it has {found})")
        return read_pod_ask(pod, self.config, self._quota_for(pod))

    @staticmethod
    def node_lock_from(locks: Mapping[str, str]) -> Callable[[str], NodeLock | None]:
        """`binder.NodeLockSource` over the node watch's raw lock annotations."""

        def lock(node: str) -> NodeLock | None:
            text = locks.get(node)
            if not text:
                return None
            try:
                return decode_node_lock(text)
            except WireFormatError as err:
                log.debug("node %s: lock annotation ignored: %s", node, err)
                return None

        return lock


__all__ = ["REMEMBERED_PODS", "Extender", "ExtenderArgsError", "PodReader"]
