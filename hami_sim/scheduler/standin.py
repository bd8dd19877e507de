"""`SchedulerStandIn`: kube-scheduler for one profile, on the caller's asyncio loop.

One scheduling cycle at a time, as kube-scheduler: pop the next pod, run the own filters over the nodes
(starting where the last cycle stopped, `percentageOfNodesToScore`), then each interested extender's
filter in order; one feasible node is taken as is, several are scored (least-allocated 0..100 + each
extender's `score * weight * 10`) and the best wins (ties: seeded random). The pod is then *assumed* on
that node and bound in the background (extender `bind`, or a Binding POSTed by the stand-in), at most
`max_in_flight_binds` at a time, while the next pod is scheduled.

Failures: no fitting node -> the unschedulable pool (kube's FitError message as a `FailedScheduling`
Warning event and the `PodScheduled=False/Unschedulable` condition); an extender error or a failed bind
-> backoffQ (event and `SchedulerError`). A successful bind writes kube's `Scheduled` event. Events go
to the one event recorder (`hami_kube.events`: client-go's aggregation, counting and spam filter) and
condition patches to background workers, so neither slows the cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi, PatchType, component_user_agent
from hami_kube.errors import KubeApiError
from hami_kube.events import EventLimits, EventRecorder, EventSource
from hami_kube.reflector import ListSink, Reflector
from hami_sim.scheduler.cache import ClusterCache
from hami_sim.scheduler.config import SchedulerConfig
from hami_sim.scheduler.dra.allocator import AllocationError, new_share_id
from hami_sim.scheduler.dra.binding import ClaimBindError, pre_bind, unreserve
from hami_sim.scheduler.dra.plugin import ClaimGate, CycleState, DynamicResources, has_claims
from hami_sim.scheduler.extender import ExtenderError, HTTPExtender, close_all
from hami_sim.scheduler.fit import (
    NO_NODES_AVAILABLE,
    NodeInfo,
    PodAsk,
    combine_scores,
    filter_node,
    fit_error_message,
    least_allocated_score,
    num_feasible_nodes_to_find,
    select_host,
    truncate_message,
)
from hami_sim.scheduler.queue import QueuedPod, SchedulingQueue, pod_key

log = logging.getLogger("hami_sim.scheduler")

JSON = dict[str, Any]
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
"""kube-scheduler's pod informer leaves terminal pods out."""
_RETRY = RetryPolicy(initial=0.2, maximum=10.0)
START_TIMEOUT_S = 60.0
"""How long `start` keeps listing again after answers worth another try (5xx, 429, no answer)."""
USER_AGENT_COMPONENT = "hami-sim-scheduler"
"""The component name in the User-Agent of the scheduler stand-in's API calls."""
KUBE_API_QPS = 50.0
KUBE_API_BURST = 100
"""kube-scheduler's client-side rate limit (the ClientConnection defaults of its configuration)."""
"""The watches' backoff: 0.2 s doubling to 10 s (the stand-in reconnects fast after an API restart)."""
DRA_PATHS = (
    ("resourceclaims", "/apis/resource.k8s.io/v1/resourceclaims"),
    ("resourceslices", "/apis/resource.k8s.io/v1/resourceslices"),
    ("deviceclasses", "/apis/resource.k8s.io/v1/deviceclasses"),
)
"""What the DynamicResources plugin watches (kube-scheduler's informers)."""
DRA_NOT_SERVED = (
    "resource.k8s.io/v1 is not served by the API server: pods with resource claims cannot be scheduled"
)


async def _first_list(reflector: Reflector, deadline: float) -> None:
    """The reflector's first list, tried again with its backoff after an answer worth another try (a
    5xx, a 429, no answer) until `deadline` (loop time), as kube-scheduler's informers keep listing
    until their caches sync (client-go tools/cache/reflector.go ListAndWatch under wait.BackoffUntil,
    WaitForCacheSync in cmd/kube-scheduler/app/server.go). Raises the last `KubeApiError` otherwise."""
    loop = asyncio.get_running_loop()
    backoff = reflector.retry.backoff()
    while True:
        try:
            await reflector.list()
            return
        except KubeApiError as err:
            delay = backoff.next()
            if not err.retriable or err.status == 401 or loop.time() + delay > deadline:
                raise
            log.warning("listing %s: %s; listing again in %.1f s", reflector.path, err, delay)
            await asyncio.sleep(delay)


class SchedulerStartError(RuntimeError):
    """The stand-in cannot start (API server unreachable, extender TLS files); the message says why."""


@dataclass
class SchedulerCounters:
    attempts: int = 0
    scheduled: int = 0
    """Pods bound (extender or own Binding)."""
    unschedulable: int = 0
    """Attempts that found no node."""
    errors: int = 0
    """Attempts that failed with an error (extender filter error)."""
    bind_failures: int = 0
    writes_failed: int = 0
    """Status writes (PodScheduled conditions) that failed."""
    writes_dropped: int = 0
    """Status writes dropped with their queue full."""
    waiting: int = 0
    """Times a pod was turned away before its attempt because a ResourceClaim of it is missing (kube's
    DynamicResources PreEnqueue)."""
    claims_allocated: int = 0
    """ResourceClaims allocated and reserved by PreBind."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One logged outcome: `result` is scheduled, unschedulable, error, bind-failed or waiting (a claim of
    the pod is missing)."""

    pod: str
    result: str
    node: str = ""
    message: str = ""
    attempt: int = 0
    at: float = 0.0


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SchedulerStandIn:
    """>>> standin = SchedulerStandIn(load_scheduler_config("kube-scheduler-config.yaml"), "kubeconfig")
    ... await standin.start(); ...; await standin.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kubeconfig: str | Path | None = None,
        *,
        seed: int | None = None,
        max_in_flight_binds: int = 16,
        clock: Callable[[], float] = time.monotonic,
        record_events: bool = True,
        writers: int = 4,
        dra: bool = True,
        share_id: Callable[[], str] = new_share_id,
        kube_api_qps: float = KUBE_API_QPS,
        kube_api_burst: int = KUBE_API_BURST,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if max_in_flight_binds < 1:
            raise ValueError(f"max_in_flight_binds must be at least 1, got {max_in_flight_binds}")
        self.kube_api_qps = kube_api_qps
        self.start_timeout_s = start_timeout_s
        self.kube_api_burst = kube_api_burst
        self.config = config
        self.kubeconfig = kubeconfig if kubeconfig is not None else (config.kubeconfig or None)
        self.max_in_flight_binds = max_in_flight_binds
        self.record_events = record_events
        self._clock = clock
        self._rng = random.Random(seed)
        self._writers = writers
        self.queue = SchedulingQueue(config.pod_initial_backoff_s, config.pod_max_backoff_s)
        self.cache = ClusterCache()
        self.counters = SchedulerCounters()
        self.decisions: deque[Decision] = deque(maxlen=2000)
        self.extenders: list[HTTPExtender] = []
        self.ignored_resources = config.ignored_resources
        self.instance = f"{config.scheduler_name}-{socket.gethostname()}"
        self._pending: dict[str, JSON] = {}
        self._said: dict[str, str] = {}
        """Per waiting pod, the reason last logged at info level: a pod that waits is logged when its
        reason changes, not at every attempt (the other attempts log at debug level)."""
        self._client: KubeApi | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._binds: set[asyncio.Task[None]] = set()
        self._slots: asyncio.Semaphore | None = None
        self._wakeup: asyncio.Event | None = None
        self._progress: asyncio.Event | None = None
        self._writes: asyncio.Queue[Callable[[], Awaitable[None]]] | None = None
        self._events: EventRecorder | None = None
        self._next_start = 0
        self._running = False
        self.dra = DynamicResources(share_id=share_id)
        """kube's DynamicResources plugin (claims, slices, classes, assumed allocations)."""
        self.dra_enabled = dra
        """Watch resource.k8s.io/v1 and allocate claims; switched off at start when the API server does
        not serve it."""

    # --- life cycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, list nodes and pods, start watching and scheduling. Raises SchedulerStartError,
        `config.ConfigError` (extender TLS files) or `kube.KubeConfigError`."""
        if self._running:
            return
        self.extenders = [HTTPExtender(e) for e in self.config.extenders]
        self._slots = asyncio.Semaphore(self.max_in_flight_binds)
        self._wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._writes = asyncio.Queue(maxsize=10_000)
        client = await KubeApi.connect(
            self.kubeconfig,
            max_connections=64,
            qps=self.kube_api_qps,
            burst=self.kube_api_burst,
            user_agent=component_user_agent(USER_AGENT_COMPONENT),
        )
        self._client = client
        self._events = EventRecorder(
            client,
            EventSource(self.config.scheduler_name, reporting_instance=self.instance),
            limits=EventLimits(queue=10_000),
            event_time=True,
        )
        self._events.start()
        nodes = Reflector(
            client, "nodes", "/api/v1/nodes", ListSink(self._replace_nodes, self._on_node), retry=_RETRY
        )
        pods = Reflector(
            client,
            "pods",
            "/api/v1/pods",
            ListSink(self._replace_pods, self._on_pod),
            retry=_RETRY,
            params={"fieldSelector": POD_SELECTOR},
        )
        dra = self._dra_reflectors(client) if self.dra_enabled else []
        try:
            deadline = asyncio.get_running_loop().time() + self.start_timeout_s
            for reflector in (*dra, nodes, pods):
                try:
                    await _first_list(reflector, deadline)
                except KubeApiError as err:
                    if reflector in dra and err.not_found:
                        log.warning("%s", DRA_NOT_SERVED)
                        self.dra_enabled, dra = False, []
                        continue
                    raise SchedulerStartError(
                        f"cannot list {reflector.path} from the API server at {client.host}: {err}"
                    ) from None
            for extender in self.extenders:
                await extender.open()
        except BaseException:
            await self._close()
            raise
        self._running = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            *(loop.create_task(r.run(), name=f"scheduler-{r.name}") for r in dra),
            loop.create_task(nodes.run(), name="scheduler-nodes"),
            loop.create_task(pods.run(), name="scheduler-pods"),
            loop.create_task(self._schedule_loop(), name="scheduler-loop"),
            *(
                loop.create_task(self._write_loop(), name=f"scheduler-writer-{i}")
                for i in range(self._writers)
            ),
        ]
        for note in self.config.notes:
            log.info("note: %s", note)
        log.info(
            "scheduler %s started: %d nodes, %d pending pods, extenders: %s, DRA: %s",
            self.config.scheduler_name,
            len(self.cache.candidates()),
            len(self._pending),
            ", ".join(e.name for e in self.extenders) or "none",
            self._dra_summary(),
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop scheduling, let in-flight binds finish (up to `grace_s`), flush queued writes (up to
        `grace_s`), close connections."""
        if not self._running:
            await self._close()
            return
        self._running = False
        loop_task = next((t for t in self._tasks if t.get_name() == "scheduler-loop"), None)
        if loop_task is not None:
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
        if self._binds:
            _, late = await asyncio.wait(set(self._binds), timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._writes is not None and not self._writes.empty():
            try:
                await asyncio.wait_for(self._writes.join(), grace_s)
            except TimeoutError:
                log.warning("stopping with %d status writes not done", self._writes.qsize())
        if self._events is not None:
            await self._events.stop(grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._close()
        log.info("scheduler %s stopped", self.config.scheduler_name)

    async def _close(self) -> None:
        if self._events is not None:
            await self._events.stop()
        await close_all(self.extenders)
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- in-process observation --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Counters, queue lengths, in-flight binds and extender latencies (seconds)."""
        events = self._events
        return {
            **asdict(self.counters),
            "events_written": events.sent if events is not None else 0,
            "events_dropped": events.dropped if events is not None else 0,
            "queue": self.queue.lengths(),
            "binds_in_flight": len(self._binds),
            "extenders": {
                self._stats_key(e): {verb: s.snapshot() for verb, s in e.stats.items()}
                for e in self.extenders
            },
        }

    def _stats_key(self, extender: HTTPExtender) -> str:
        """An extender's name (its URL, as kube names it); entries sharing a URL (the fragmentation
        component's two) after the first get `#<index in extenders>` added, so none hides another."""
        first = next(e for e in self.extenders if e.name == extender.name)
        return extender.name if first is extender else f"{extender.name}#{extender.config.index}"

    async def wait_for(self, predicate: Callable[[SchedulerStandIn], bool], seconds: float = 10.0) -> None:
        """Return once `predicate(self)` holds (checked after every decision and cache change);
        TimeoutError after `seconds`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not predicate(self):
            progress = self._progress
            remaining = deadline - loop.time()
            if progress is None or remaining <= 0:
                raise TimeoutError(f"scheduler condition not met within {seconds}s: {self.snapshot()}")
            try:
                await asyncio.wait_for(progress.wait(), remaining)
            except TimeoutError:
                continue

    def _notify(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = asyncio.Event()

    def _kick(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _dra_summary(self) -> str:
        if not self.dra_enabled:
            return "off"
        plugin = self.dra
        return f"{len(plugin.inventory)} slices, {len(plugin.claims)} claims, {len(plugin.classes)} classes"

    # --- informer handlers (synchronous, on the loop) ---------------------------------------------------

    def _dra_reflectors(self, client: KubeApi) -> list[Reflector]:
        plugin = self.dra
        sinks = {
            "resourceclaims": (plugin.replace_claims, plugin.set_claim, plugin.delete_claim),
            "resourceslices": (plugin.replace_slices, plugin.set_slice, plugin.delete_slice),
            "deviceclasses": (plugin.replace_classes, plugin.set_class, plugin.delete_class),
        }
        reflectors = []
        for name, path in DRA_PATHS:
            replace, changed, deleted = sinks[name]
            reflectors.append(
                Reflector(
                    client,
                    name,
                    path,
                    ListSink(self._dra_replace(replace), self._dra_event(changed, deleted)),
                    retry=_RETRY,
                )
            )
        return reflectors

    def _dra_replace(self, replace: Callable[[Sequence[JSON]], None]) -> Callable[[Sequence[JSON]], None]:
        def handle(items: Sequence[JSON]) -> None:
            replace(items)
            self.queue.move_all(self._clock())
            self._kick()
            self._notify()

        return handle

    def _dra_event(
        self, changed: Callable[[JSON], bool], deleted: Callable[[JSON], bool]
    ) -> Callable[[str, JSON], None]:
        """A claim, slice or class event: the plugin's state first, then the unschedulable pool moves when
        kube's DynamicResources registers the event (claim added, deallocated or released; slice or
        class added or changed)."""

        def handle(kind: str, obj: JSON) -> None:
            moves = deleted(obj) if kind == "DELETED" else changed(obj)
            if moves:
                self.queue.move_all(self._clock())
                self._kick()
            self._notify()

        return handle

    def _replace_nodes(self, items: Sequence[JSON]) -> None:
        self.cache.replace_nodes(items)
        self.queue.move_all(self._clock())
        self._kick()
        self._notify()

    def _on_node(self, kind: str, node: JSON) -> None:
        if kind == "DELETED":
            self.cache.delete_node(str((node.get("metadata") or {}).get("name") or ""))
        elif self.cache.set_node(node):
            self.queue.move_all(self._clock())
            self._kick()
        self._notify()

    def _ours(self, pod: JSON) -> bool:
        spec = pod.get("spec") or {}
        return (
            spec.get("schedulerName") == self.config.scheduler_name
            and not spec.get("nodeName")
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
        )

    def _replace_pods(self, items: Sequence[JSON]) -> None:
        now = self._clock()
        assigned = [p for p in items if (p.get("spec") or {}).get("nodeName")]
        pending = {pod_key(p): p for p in items if self._ours(p)}
        self.cache.replace_assigned(assigned)
        for key in [k for k, e in self.cache.pods.items() if e.assumed and k not in pending]:
            self.cache.forget(key)
        for key in set(self._pending) - set(pending):
            self.queue.delete(key)
        self._pending = pending
        self._said = {k: v for k, v in self._said.items() if k in pending}
        for key, pod in sorted(
            pending.items(), key=lambda kv: str((kv[1].get("metadata") or {}).get("creationTimestamp"))
        ):
            if not self.cache.is_assumed(key):
                self.queue.add(pod, now)
        self.queue.move_all(now)
        self._kick()
        self._notify()

    def _on_pod(self, kind: str, pod: JSON) -> None:
        key = pod_key(pod)
        now = self._clock()
        if kind == "DELETED":
            self._pending.pop(key, None)
            self._said.pop(key, None)
            self.queue.delete(key)
            if self.cache.delete_pod(key):
                self.queue.move_all(now)
                self._kick()
        elif (pod.get("spec") or {}).get("nodeName"):
            self._pending.pop(key, None)
            self._said.pop(key, None)
            self.queue.delete(key)
            self.cache.set_assigned(pod)
        elif self._ours(pod):
            self._pending[key] = pod
            if not self.cache.is_assumed(key):
                self.queue.add(pod, now)
                self._kick()
        else:
            self._pending.pop(key, None)
            self._said.pop(key, None)
            self.queue.delete(key)
        self._notify()

    # --- the scheduling loop -------------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        assert self._slots is not None and self._wakeup is not None
        while True:
            await self._slots.acquire()
            now = self._clock()
            qp = self.queue.pop(now)
            if qp is None:
                self._slots.release()
                self._wakeup.clear()
                delay = self.queue.next_wakeup(now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                continue
            binding = False
            try:
                binding = await self._schedule_one(qp)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.exception("scheduling %s failed unexpectedly", qp.key)
                self._failed(qp, f"internal error: {err}", error=True)
            finally:
                if not binding:
                    self._slots.release()
                self._notify()

    async def _schedule_one(self, qp: QueuedPod) -> bool:
        """One cycle; True when a bind was started (it then owns the bind slot)."""
        pod = qp.pod
        self.counters.attempts += 1
        started = time.perf_counter()
        nodes = self.cache.candidates()
        if not nodes:
            self._failed(qp, NO_NODES_AVAILABLE, error=False)
            return False
        claims: CycleState | None = None
        if has_claims(pod):
            proceed, claims = self._dra_pre_filter(qp, len(nodes))
            if not proceed:
                return False
        ask = PodAsk.of(pod)
        try:
            feasible, reasons = self._filter(pod, ask, nodes, claims)
        except AllocationError as err:
            self._failed(qp, str(err), error=True)
            return False
        feasible_or_error = await self._extenders_filter(pod, feasible, reasons)
        if isinstance(feasible_or_error, str):
            self._failed(qp, feasible_or_error, error=True)
            return False
        feasible = feasible_or_error
        if not feasible:
            self._failed(qp, fit_error_message(len(nodes), reasons), error=False)
            return False
        if len(feasible) == 1:
            host = feasible[0].name
        else:
            host = await self._prioritize(pod, ask, feasible, claims)
        if qp.deleted_in_flight:  # deleted, or bound by someone else, while it was being scheduled
            self.queue.done(qp)
            return False
        if not self._running:
            self.queue.error(qp, self._clock(), "scheduler stopping")
            return False
        if claims is not None:
            try:
                self.dra.reserve(claims, host)
            except AllocationError as err:
                self._failed(qp, str(err), error=True)
                return False
        self.cache.assume(pod, host, ask)
        self.queue.done(qp)
        task = asyncio.get_running_loop().create_task(
            self._bind(
                qp, pod, host, feasible=len(feasible), total=len(nodes), started=started, claims=claims
            )
        )
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        return True

    async def _extenders_filter(
        self, pod: JSON, feasible: list[NodeInfo], reasons: dict[str, list[str]]
    ) -> list[NodeInfo] | str:
        """Each interested extender's filter in turn: the nodes left (their reasons added to `reasons`),
        or the error that ends the cycle."""
        for extender in self.extenders:
            if not feasible:
                break
            if not extender.config.is_interested(pod):
                continue
            try:
                answer = await extender.filter(pod, [(n.name, n.node) for n in feasible])
            except ExtenderError as err:
                if extender.config.ignorable:
                    log.info("skipping ignorable extender %s: %s", extender.name, err)
                    continue
                return str(err)
            for name, message in answer.failed_unresolvable.items():
                reasons[name] = [message]
            for name, message in answer.failed.items():
                if name not in answer.failed_unresolvable:
                    reasons[name] = [message]
            by_name = {n.name: n for n in feasible}
            feasible = [by_name[name] for name in answer.nodes if name in by_name]
        return feasible

    def _dra_pre_filter(self, qp: QueuedPod, total: int) -> tuple[bool, CycleState | None]:
        """The DynamicResources plugin's PreEnqueue and PreFilter for a pod with claims: (True, its cycle
        state), or (False, None) when the attempt ends here: a claim is missing (the pod waits in the pool,
        its attempt not counted, no event, as kube's PreEnqueue), the pod is unschedulable on every node
        (FitError with the PreFilter message) or an error."""
        now = self._clock()
        try:
            if not self.dra_enabled:
                raise ClaimGate(DRA_NOT_SERVED)
            try:
                self.dra.pod_claims(qp.pod)
            except ClaimGate as gate:
                self.counters.attempts -= 1
                self.counters.waiting += 1
                self.queue.gate(qp, now, str(gate))
                self._decide(Decision(qp.key, "waiting", "", str(gate), qp.attempts, now))
                self._log_wait(qp.key, f"waiting: {gate}", "waiting %s: %s", qp.key, gate)
                return False, None
            return True, self.dra.pre_filter(qp.pod)
        except ClaimGate as gate:
            self._failed(qp, f"0/{total} nodes are available: {gate}.", error=False)
        except AllocationError as err:
            self._failed(qp, str(err), error=True)
        return False, None

    def _filter(
        self, pod: JSON, ask: PodAsk, nodes: list[NodeInfo], claims: CycleState | None = None
    ) -> tuple[list[NodeInfo], dict[str, list[str]]]:
        """Own filters from where the last cycle stopped, until enough feasible nodes are found; the
        DynamicResources filter (the claims' allocation on the node) comes last, as in kube's default
        profile. AllocationError aborts the cycle."""
        total = len(nodes)
        wanted = num_feasible_nodes_to_find(self.config.percentage_of_nodes_to_score, total)
        start = self._next_start % total
        feasible: list[NodeInfo] = []
        reasons: dict[str, list[str]] = {}
        processed = 0
        for i in range(total):
            node = nodes[(start + i) % total]
            processed += 1
            failed = filter_node(pod, ask, node, self.ignored_resources)
            if not failed and claims is not None:
                failed = self.dra.filter(claims, node)
            if failed:
                reasons[node.name] = failed
            else:
                feasible.append(node)
                if len(feasible) >= wanted:
                    break
        self._next_start = (start + processed) % total
        return feasible, reasons

    async def _prioritize(
        self, pod: JSON, ask: PodAsk, feasible: list[NodeInfo], claims: CycleState | None = None
    ) -> str:
        own = {n.name: least_allocated_score(ask, n) for n in feasible}
        if claims is not None:
            for name, score in self.dra.scores(claims, own).items():
                own[name] += score
        interested = [e for e in self.extenders if e.config.is_interested(pod)]
        pairs = [(n.name, n.node) for n in feasible]
        answers: list[tuple[Sequence[tuple[str, int]], int]] = []
        results = await asyncio.gather(
            *(e.prioritize(pod, pairs) for e in interested), return_exceptions=True
        )
        for extender, result in zip(interested, results, strict=True):
            if isinstance(result, ExtenderError):
                log.debug("extender %s prioritize failed (ignored, as kube does): %s", extender.name, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        return select_host(combine_scores(own, answers), self._rng)

    async def _bind(
        self,
        qp: QueuedPod,
        pod: JSON,
        host: str,
        *,
        feasible: int,
        total: int,
        started: float,
        claims: CycleState | None = None,
    ) -> None:
        assert self._slots is not None
        key = qp.key
        try:
            error = await self._pre_bind(claims)
            if error is None:
                error = await self._bind_call(pod, host)
            if error is not None and claims is not None and self._client is not None:
                for problem in await unreserve(self._client, self.dra, claims):
                    log.info("%s", problem)
            if error is None:
                self.counters.scheduled += 1
                meta = pod.get("metadata") or {}
                self._event(
                    pod,
                    "Normal",
                    "Scheduled",
                    "Binding",
                    f"Successfully assigned {meta.get('namespace')}/{meta.get('name')} to {host}",
                )
                self._decide(Decision(key, "scheduled", host, "", qp.attempts, self._clock()))
                self._said.pop(key, None)
                log.info(
                    "scheduled %s -> %s (feasible %d/%d, attempt %d, %.1f ms)%s",
                    key,
                    host,
                    feasible,
                    total,
                    qp.attempts,
                    (time.perf_counter() - started) * 1000,
                    ""
                    if claims is None
                    else " claims "
                    + ",".join(str((c.get("metadata") or {}).get("name")) for c in claims.claims),
                )
                return
            self.counters.bind_failures += 1
            now = self._clock()
            if self.cache.forget(key):
                self.queue.move_all(now)
            latest = self._pending.get(key)
            self._decide(Decision(key, "bind-failed", host, error, qp.attempts, now))
            log.info("binding %s to %s failed (attempt %d): %s", key, host, qp.attempts, error)
            if latest is None:
                return  # deleted or bound meanwhile (e.g. the extender bound it but its answer was lost)
            qp.pod = latest
            self.queue.error(qp, now, error)
            self._record_failure(latest, error, "SchedulerError")
        finally:
            self._slots.release()
            self._kick()
            self._notify()

    async def _pre_bind(self, claims: CycleState | None) -> str | None:
        """DynamicResources PreBind: allocate and reserve the pod's claims; the error or None."""
        if claims is None:
            return None
        if self._client is None:
            return "no API client"
        try:
            await pre_bind(self._client, self.dra, claims)
        except ClaimBindError as err:
            return str(err)
        self.counters.claims_allocated += len(claims.allocations)
        return None

    async def _bind_call(self, pod: JSON, host: str) -> str | None:
        """Bind through the first interested binder extender, else POST the Binding; the error or None."""
        for extender in self.extenders:
            if not extender.is_binder or not extender.config.is_interested(pod):
                continue
            try:
                await extender.bind(pod, host)
                return None
            except ExtenderError as err:
                if extender.config.ignorable:
                    log.info("skipping ignorable extender %s in bind: %s", extender.name, err)
                    continue
                return str(err)
        client = self._client
        if client is None:
            return "no API client"
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace") or "default", meta.get("name")
        try:
            await client.bind(namespace, str(name), host, uid=str(meta.get("uid") or ""))
        except KubeApiError as err:
            return err.message or str(err)
        return None

    # --- failures, events, conditions -----------------------------------------------------------------

    def _failed(self, qp: QueuedPod, message: str, *, error: bool) -> None:
        now = self._clock()
        if error:
            self.counters.errors += 1
            where = self.queue.error(qp, now, message)
        else:
            self.counters.unschedulable += 1
            where = self.queue.unschedulable(qp, now, message)
        self._decide(Decision(qp.key, "error" if error else "unschedulable", "", message, qp.attempts, now))
        outcome = "error scheduling" if error else "unschedulable"
        self._log_wait(
            qp.key,
            f"{outcome}: {message}",
            "%s %s (attempt %d, -> %s): %s",
            outcome,
            qp.key,
            qp.attempts,
            where.value if where else "dropped",
            message,
        )
        if where is not None:
            self._record_failure(qp.pod, message, "SchedulerError" if error else "Unschedulable")

    def _log_wait(self, key: str, reason: str, text: str, *args: Any) -> None:
        """Log an attempt that left the pod waiting: at info level when its reason differs from the one
        logged last for it (the first attempt included), else at debug level. kube-scheduler logs each
        failed attempt at a verbosity a cluster does not run with by default; a pod retried at every
        cluster event made this stand-in write a line per waiting pod per cycle (issue 31)."""
        if self._said.get(key) == reason:
            log.debug(text, *args)
            return
        self._said[key] = reason
        log.info(text, *args)

    def _decide(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def _record_failure(self, pod: JSON, message: str, reason: str) -> None:
        self._event(pod, "Warning", "FailedScheduling", "Scheduling", message)
        self._condition(pod, reason, message)

    def _submit(self, write: Callable[[], Awaitable[None]]) -> None:
        if self._writes is None or not self.record_events:
            return
        try:
            self._writes.put_nowait(write)
        except asyncio.QueueFull:
            self.counters.writes_dropped += 1

    def _event(self, pod: JSON, kind: str, reason: str, action: str, message: str) -> None:
        """An Event about the pod through the scheduler's event recorder (`hami_kube.events`)."""
        if self._events is None or not self.record_events:
            return
        meta = pod.get("metadata") or {}
        self._events.record(
            str(meta.get("namespace") or "default"),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
            kind,
            reason,
            truncate_message(message),
            resource_version=str(meta.get("resourceVersion") or ""),
            action=action,
        )

    def _condition(self, pod: JSON, reason: str, message: str) -> None:
        """PodScheduled=False with the reason and message, when it differs from what the pod shows."""
        conditions = (pod.get("status") or {}).get("conditions") or ()
        old = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "PodScheduled"), None)
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
            "False",
            reason,
            message,
        ):
            return
        transition = (
            old.get("lastTransitionTime") if old is not None and old.get("status") == "False" else None
        )
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": transition or _now_rfc3339(),
        }
        meta = pod.get("metadata") or {}
        path = f"/api/v1/namespaces/{meta.get('namespace') or 'default'}/pods/{meta.get('name')}/status"

        async def write() -> None:
            assert self._client is not None
            await self._client.patch(path, {"status": {"conditions": [condition]}}, PatchType.STRATEGIC)

        self._submit(write)

    async def _write_loop(self) -> None:
        assert self._writes is not None
        while True:
            write = await self._writes.get()
            try:
                await write()
            except KubeApiError as err:
                self.counters.writes_failed += 1
                log.debug("event/status write failed: %s", err)
            except Exception:
                self.counters.writes_failed += 1
                log.exception("event/status write failed unexpectedly")
            finally:
                self._writes.task_done()
