"""The scheduler extender as a service: the pure `/filter` and `/prioritize` logic (extender.py) and the
binder, wired to the watch-fed stores (the pod store, the GPU cache), the vectorised GPU table, the quota
view, events and metrics. The HTTP routes (server.py) hand request bodies here and send back what comes
out.

- Before answering, the GPU table takes the nodes the cache changed since the last request
  (`ClusterCache.drain_changed`), so a request costs O(changed nodes) to catch up, never a rebuild; so
  do the per-node answers kept for recent asks (`gputable.RowCache`), and, when the filter measures
  hosts by their free CPU, the nodes whose free CPU changed are touched in the table for them.
- A request's candidate list is read once per distinct list (`extender.CandidateLists`), and the nodes
  a filter answers are kept as the list kube-scheduler's /prioritize names next. The routes send the
  answers as written JSON (`filter_json`, `prioritize_json`); `filter` and `prioritize` give the same
  answers as objects.
- One scheduling cycle per pod (`cycle.CycleStates`, kube-scheduler's CycleState): the first verb that
  sees a pod (normally `/filter`) reads its GPU ask and its own quota usage, keyed by uid and
  resourceVersion; `/prioritize` and `/bind` reuse them. The GPU choices made node by node are kept
  with the node's generation and reused by a later verb while the node is unchanged (see cycle.py).
- `/bind` names only the pod: its ask comes from its cycle, else from the pod store (every pod is
  watched; a store copy of another resourceVersion replaces the cycle unless the ask is the same), else
  (watch lag) from one API read, whose UID must be the one asked for. Then the binder binds; the wiring
  goes one way, extender -> binder.
- Quota: the pod being filtered is already counted in its namespace's usage (the webhook assumed it and
  the watch shows it Pending), so the view given to the filter subtracts the pod's own request; else a
  pod asking exactly the remaining quota would never fit. The check itself is taken fresh per request.
- A filter that leaves no node writes a `FilteringFailed` event on the pod (rate-limited by the
  recorder) with the reasons, the way HAMi does.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from hami_api.annotations import decode_node_lock
from hami_api.errors import WireFormatError
from hami_api.types import NodeLock, NodePolicy
from hami_control.binder import Binder, BindingArgs, EventRecorder, read_binding_args
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, FailedNodes, FragmentationFilter
from hami_control.cycle import CycleStates, PodCycle, pod_identity
from hami_control.extender import (
    UNKNOWN_CPU,
    CandidateLists,
    Candidates,
    ExtenderArgsError,
    FilterAnswer,
    HostCPU,
    NodeFit,
    PodAsk,
    PrioritizeAnswer,
    cpu_filter_nodes,
    filter_answer,
    filter_error,
    pass_through,
    prioritize_answer,
    read_candidates,
    read_pod_ask,
    zero_scores,
)
from hami_control.frag import TaskMix
from hami_control.gputable import FreeCPU, GPUTable, IntArray, RowCache
from hami_control.metrics import ControlMetrics
from hami_control.pod_store import PodStore, pod_cpu_milli
from hami_control.quota import QuotaLimits, QuotaUsage, QuotaView, requests_quota_usage, vendor_requests_usage

log = logging.getLogger(__name__)

PodReader = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(namespace, name) -> the pod's JSON from the API, None when it does not exist."""

_ZERO = QuotaUsage()


class QuotaWithoutPod:
    """The namespace's usage minus the pod being filtered (it counts once bound, as everything else)."""

    def __init__(self, view: QuotaView, namespace: str, own: QuotaUsage) -> None:
        self.view, self.namespace, self.own = view, namespace, own

    def limits(self, namespace: str) -> QuotaLimits:
        return self.view.limits(namespace)

    def used(self, namespace: str) -> QuotaUsage:
        used = self.view.used(namespace)
        if namespace != self.namespace:
            return used
        rest = used - self.own
        return QuotaUsage(max(0, rest.memory), max(0, rest.cores), rest.others)


def _filter_error(message: str) -> FilterAnswer:
    return FilterAnswer(Candidates(()), (), error=message)


_NO_PRIORITIES = PrioritizeAnswer((), ())
"""The answer to a prioritize request that cannot be read: an empty HostPriorityList."""


def _error_body(message: str) -> dict[str, Any]:
    return {"Error": message}


def _decode(body: bytes) -> Any:
    return orjson.loads(body)


def _lookup_text(request: BindingArgs, err: LookupError) -> str:
    text = str(err.args[0]) if err.args else ""
    if not text:
        return f"pod {request.who} not found"
    return text if request.who in text else f"pod {request.who}: {text}"


class Extender:
    """`/filter`, `/prioritize` and `/bind` over the live stores. Not thread-safe: one event loop."""

    def __init__(
        self,
        config: ControlConfig,
        cache: ClusterCache,
        pods: PodStore,
        *,
        binder: Binder | None = None,
        quota: QuotaView | None = None,
        metrics: ControlMetrics | None = None,
        events: EventRecorder | None = None,
        read_pod: PodReader | None = None,
        cycles: CycleStates | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.pods = pods
        self.binder = binder
        self.quota = quota
        self.metrics = metrics
        self.events = events
        self.read_pod = read_pod
        self.cycles = cycles if cycles is not None else CycleStates()
        self.table = GPUTable()
        self.rows_cache = RowCache(self.table)
        """The table's per-node answers for the recent asks, caught up with the nodes changed since."""
        self.candidate_lists = CandidateLists()
        """The last candidate lists, by the JSON of their names."""
        self.free_cpu = FreeCPU(self._cpu_of, UNKNOWN_CPU)
        """Each node's free CPU as arrays (`cpu_free_of`)."""
        self._zeros: tuple[tuple[str, ...], list[dict[str, Any]]] | None = None
        """The last `/cpu-prioritize` answer and its candidates (read-only once returned)."""
        self.mix: TaskMix = config.scheduling.configured_mix
        """The fragmentation policies' task mix for the cycles started from now on (`frag_mix`'s learned
        mix replaces it; a cycle keeps the mix it started with)."""

    # --- the cache and the table ----------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the GPU table up to the cache (only the nodes changed since last time), and when the
        filter measures hosts by their free CPU, the free CPU too (its changed nodes touched in the table,
        so that `rows_cache` computes them again)."""
        changed = self.cache.drain_changed()
        if changed:
            self.table.sync(changed, self.cache.node_gpus)
        if self.config.scheduling.fragmentation_filter.measures_cpu:
            self._sync_cpu()

    def _sync_cpu(self) -> None:
        changed = self.cache.drain_cpu_changed() | self.pods.drain_cpu_changed()
        if changed:
            self.free_cpu.update(changed)
            self.table.touch(changed)

    # --- the pod's cycle ------------------------------------------------------------------------------

    def _start(self, uid: str, resource_version: str, ask: PodAsk | None) -> PodCycle:
        own = _ZERO
        if ask is not None:
            own = requests_quota_usage(ask.requests)
            if ask.vendors is not None:
                vendors = ask.vendors
                own += vendor_requests_usage(vendors.by_container, vendors.inits, vendors.vendors)
        return self.cycles.start(uid, resource_version, ask, own)

    def _cycle(self, pod: object) -> PodCycle:
        """The cycle of the pod in a filter or prioritize request: kept when it has this resourceVersion
        (or reads to the same ask), else started. Raises `ExtenderArgsError` for an unreadable pod."""
        uid, version = pod_identity(pod)
        cycle = self.cycles.get(uid) if uid else None
        if cycle is not None and version and cycle.resource_version == version:
            return cycle
        ask = read_pod_ask(pod, self.config, mix=self.mix)
        if cycle is not None and cycle.ask == ask:
            cycle.resource_version = version  # another version, the same ask: its choices still hold
            return cycle
        return self._start(uid, version, ask)

    def _ask(self, cycle: PodCycle) -> PodAsk | None:
        """The cycle's ask, checked against its namespace's quota as it is now (its own usage left out)."""
        ask = cycle.ask
        if ask is None:
            return None
        view = self.quota
        if (
            view is not None
            and self.config.quota.enforce
            and (cycle.own.memory or cycle.own.cores or cycle.own.others)
        ):
            view = QuotaWithoutPod(view, ask.namespace, cycle.own)
        return ask.under_quota(view, self.config)

    def _fitter(self, cycle: PodCycle, ask: PodAsk | None) -> NodeFit | None:
        return cycle.fitter(ask, self.cache.generation, self.cache) if ask is not None else None

    # --- the verbs ------------------------------------------------------------------------------------

    def filter(self, body: bytes) -> dict[str, Any]:
        """`POST /filter`: the ExtenderFilterResult (`filter_json` writes the same answer)."""
        return self._filter_body(body).as_dict()

    def filter_json(self, body: bytes) -> bytes:
        """`filter`'s answer as the route sends it (`FilterAnswer.as_json`). The nodes it answers are
        kept as a candidate list: kube-scheduler names them in its /prioritize request next."""
        answer = self._filter_body(body)
        written = answer.as_json()
        answered = answer.answered()
        if answered is not None and len(answered.names) > 1:
            self.candidate_lists.remember(answered)
        return written

    def _filter_body(self, body: bytes) -> FilterAnswer:
        started = time.perf_counter()
        try:
            args, candidates = self.candidate_lists.read(body)
        except orjson.JSONDecodeError as err:
            return _filter_error(f"ExtenderArgs: body is not JSON: {err}")
        self.sync()
        reasons: collections.Counter[str] = collections.Counter()
        result = self._filter(args, candidates, reasons)
        if self.metrics is not None:
            self.metrics.observe_filter(time.perf_counter() - started, reasons)
        return result

    def _filter(
        self, args: object, candidates: Candidates | None, reasons: collections.Counter[str]
    ) -> FilterAnswer:
        try:
            if candidates is None:
                candidates = read_candidates(args)
            assert isinstance(args, Mapping)  # read_candidates checked it
            pod = args.get("Pod")
            cycle = self._cycle(pod)
        except ExtenderArgsError as err:
            log.debug("filter: %s", err)
            return _filter_error(str(err))
        ask = self._ask(cycle)
        narrow = None
        how = self.config.scheduling.fragmentation_filter
        if how.measures_cpu and isinstance(pod, Mapping):
            narrow = HostCPU(
                self.cpu_free, pod_cpu_milli(pod), how is FragmentationFilter.ONE, self.cpu_free_of
            )
        result = filter_answer(
            ask,
            candidates,
            self.cache,
            table=self.table,
            reasons=reasons,
            fit=self._fitter(cycle, ask),
            narrow=narrow,
            cache=self.rows_cache,
        )
        if not result.fits_any:
            if self.events is not None:
                self._filtering_failed(pod, result.as_dict())
        elif self.config.scheduling.failed_nodes is FailedNodes.WHEN_NONE_FIT:
            result.without_failed()
        return result

    @property
    def decides_cpu_only(self) -> bool:
        """Whether `/cpu-filter` chooses the node of pods that ask no GPU: under the fragmentation node
        policy with `--fragmentation-filter one` (the fragmentation component's settings); else it passes
        every node through."""
        scheduling = self.config.scheduling
        return (
            scheduling.node_policy is NodePolicy.FRAGMENTATION
            and scheduling.fragmentation_filter is FragmentationFilter.ONE
        )

    def cpu_filter(self, body: bytes) -> dict[str, Any]:
        """`POST /cpu-filter`, the second extender entry of the fragmentation component (kube-scheduler
        calls it for every pod that requests or limits CPU: `managedResources: [{name: cpu}]`, its
        `IsInterested`, pkg/scheduler/extender.go). A pod that asks no GPU gets the one node of FGD's
        best score (`extender.cpu_filter_nodes`) when `decides_cpu_only`; every other pod (a GPU pod,
        which the first entry's /filter decides), a pod it cannot read, and every pod when it does not
        decide, gets every candidate back, so the two entries never fight and a bad answer here never
        keeps a pod from scheduling. The entry is `ignorable`: with hami-control down or not leading,
        kube-scheduler skips it (`IsIgnorable`, schedule_one.go `findNodesThatPassExtenders`)."""
        started = time.perf_counter()
        try:
            args = _decode(body)
            candidates = read_candidates(args)
        except (orjson.JSONDecodeError, ExtenderArgsError) as err:
            return filter_error(f"ExtenderArgs: {err}")
        assert isinstance(args, Mapping)  # read_candidates checked it
        pod = args.get("Pod")
        result: dict[str, Any] | None = None
        if self.decides_cpu_only and isinstance(pod, Mapping):
            try:
                asks = read_pod_ask(pod, self.config, mix=self.mix) is not None
            except ExtenderArgsError as err:
                log.debug("cpu-filter: %s", err)
                asks = True  # not read: not decided here
            if not asks:
                self.sync()
                narrow = HostCPU(self.cpu_free, pod_cpu_milli(pod), one=True, free_array=self.cpu_free_of)
                result = cpu_filter_nodes(candidates, self.table, self.mix, narrow)
        if result is None:
            result = pass_through(candidates)
        if self.metrics is not None:
            self.metrics.observe_filter(time.perf_counter() - started, collections.Counter())
        return result

    def cpu_prioritize(self, body: bytes) -> list[dict[str, Any]]:
        """`POST /cpu-prioritize`: 0 for every candidate (the decision is `/cpu-filter`'s, which answers
        one node; 0 adds nothing to kube-scheduler's total)."""
        try:
            names = read_candidates(_decode(body)).names
        except (orjson.JSONDecodeError, ExtenderArgsError):
            return []
        last = self._zeros
        if last is None or last[0] != names:  # kube-scheduler sends the same candidates pod after pod
            last = self._zeros = (names, zero_scores(Candidates(names)))
        return last[1]

    def cpu_free(self, node: str) -> int | None:
        """The node's allocatable CPU less what the watched pods on it request (milli-cores; None:
        unknown). `--fragmentation-filter best` measures hosts by it."""
        allocatable = self.cache.cpu_allocatable(node)
        return None if allocatable is None else allocatable - self.pods.node_cpu_requested(node)

    def cpu_free_of(self, names: Sequence[str]) -> IntArray:
        """`cpu_free` of every node of `names` (an unknown allocatable: `extender.UNKNOWN_CPU`), from the
        free-CPU index (`gputable.FreeCPU`) brought up to the cache and the pod store first: ~0.1 ms for
        5,000 nodes, against ~8 ms for 5,000 calls of `cpu_free`."""
        self._sync_cpu()
        return self.free_cpu.of(names)

    def _cpu_of(self, node: str) -> tuple[int | None, int]:
        return self.cache.cpu_allocatable(node), self.pods.node_cpu_requested(node)

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
        """`POST /prioritize`: the HostPriorityList (`prioritize_json` writes the same answer)."""
        return self._prioritize_body(body).as_list()

    def prioritize_json(self, body: bytes) -> bytes:
        """`prioritize`'s answer as the route sends it (`PrioritizeAnswer.as_json`)."""
        return self._prioritize_body(body).as_json()

    def _prioritize_body(self, body: bytes) -> PrioritizeAnswer:
        started = time.perf_counter()
        try:
            args, candidates = self.candidate_lists.read(body)
        except orjson.JSONDecodeError:
            return _NO_PRIORITIES
        self.sync()
        result = self._prioritize(args, candidates)
        if self.metrics is not None:
            self.metrics.observe_prioritize(time.perf_counter() - started)
        return result

    def _prioritize(self, args: object, candidates: Candidates | None) -> PrioritizeAnswer:
        try:
            if candidates is None:
                candidates = read_candidates(args)
        except ExtenderArgsError as err:
            log.debug("prioritize: %s", err)
            return _NO_PRIORITIES
        assert isinstance(args, Mapping)  # read_candidates checked it
        try:
            cycle = self._cycle(args.get("Pod"))
        except ExtenderArgsError as err:
            log.debug("prioritize: %s", err)
            return prioritize_answer(None, candidates, self.cache, table=self.table)
        ask = self._ask(cycle)
        result = prioritize_answer(
            ask, candidates, self.cache, table=self.table, fit=self._fitter(cycle, ask), cache=self.rows_cache
        )
        self.cycles.scored(cycle, result.hosts, result.scores)
        return result

    async def bind(self, body: bytes) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            args = _decode(body)
        except orjson.JSONDecodeError as err:
            result = _error_body(f"ExtenderBindingArgs: body is not JSON: {err}")
            outcome = "bad_request"
        else:
            binder = self.binder
            if binder is None:
                return _error_body("this replica does not bind")
            self.sync()
            before = dict(binder.outcomes)
            result = await self._bind(binder, args)
            changed = [k for k, v in binder.outcomes.items() if v != before.get(k, 0)]
            outcome = changed[0] if len(changed) == 1 else ("success" if not result.get("Error") else "error")
        if self.metrics is not None:
            self.metrics.observe_bind(time.perf_counter() - started, outcome)
        return result

    async def _bind(self, binder: Binder, args: object) -> dict[str, Any]:
        try:
            request = read_binding_args(args)
        except ExtenderArgsError as err:
            return binder.refuse(err)
        try:
            cycle = await self._bind_cycle(request.namespace, request.name, request.uid)
        except LookupError as err:
            return binder.fail(request, "not_found", _lookup_text(request, err), event=False)
        except ExtenderArgsError as err:
            return binder.fail(request, "bad_request", str(err))
        except Exception as err:
            log.exception("reading pod %s for its bind to node %s failed", request.who, request.node)
            text = f"reading pod {request.who} failed: {type(err).__name__}: {err}"
            return binder.fail(request, "api_error", text, event=False)
        ask = self._ask(cycle)
        choice = cycle.choice(request.node, ask.quota) if ask is not None else None
        return await binder.bind(request, ask, choice)

    async def _bind_cycle(self, namespace: str, name: str, uid: str) -> PodCycle:
        """The cycle of the pod kube-scheduler asks to bind (see the module docstring). Raises
        `LookupError` for a pod not found, `ExtenderArgsError` for an unreadable one."""
        cycle = self.cycles.get(uid)
        record = self.pods.get(uid)
        if record is not None:
            version = record.resource_version
            if cycle is not None and version and cycle.resource_version == version:
                return cycle
            ask = record.ask(self.config, mix=self.mix)
            if cycle is not None and cycle.ask == ask:
                return cycle  # the store has another version of the pod, with the same ask
            return self._start(uid, version, ask)
        if cycle is not None:
            return cycle  # the watch has not shown the pod yet: the copy its filter read
        pod = await self._read(namespace, name, uid)
        return self._start(uid, pod_identity(pod)[1], read_pod_ask(pod, self.config, mix=self.mix))

    async def _read(self, namespace: str, name: str, uid: str) -> Mapping[str, Any]:
        """The pod from the API (neither its cycle nor the store has it). Raises `LookupError`."""
        if self.read_pod is None:
            raise LookupError(f"pod {namespace}/{name} not found")
        pod = await self.read_pod(namespace, name)
        if pod is None:
            raise LookupError(f"pod {namespace}/{name} not found")
        found = pod_identity(pod)[0]
        if uid and found and found != uid:
            raise LookupError(f"pod {namespace}/{name} not found with UID {uid} (it has {found})")
        return pod

    async def pod_ask(self, namespace: str, name: str, uid: str) -> PodAsk | None:
        """The GPU ask `/bind` would use for the pod (for tests and tools): its cycle's, the store's, or
        one API read's. Raises `LookupError` for a pod not found, `ExtenderArgsError` for an unreadable
        one."""
        return self._ask(await self._bind_cycle(namespace, name, uid))

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


__all__ = ["Extender", "ExtenderArgsError", "PodReader", "QuotaWithoutPod"]
