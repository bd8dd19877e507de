"""core/v1 Events, written the way client-go's event recorder writes them (tools/record): the one event
writer of hami-py.

`EventRecorder.record(...)` never blocks and never raises: it checks the optional record-time limits
(`EventLimits`), builds the Event and puts it on a bounded queue (1000, client-go's maxQueuedEvents);
a full queue drops it. One background task takes the events in order and, as `recordToSink` does
(tools/record/event.go), passes each through the `EventCorrelator` (tools/record/events_cache.go), then
writes it:

- Aggregation (`EventAggregator`): events that differ only in their message, from the same source
  about the same object with the same type and reason: from the 10th distinct message within 10
  minutes on, they become one event whose message is "(combined from similar events): <message>".
- De-duplication (`eventLogger`): an event identical to one already written (same source, object,
  type, reason and message) is not created again: the existing one gets a strategic merge PATCH of its
  `count`, `lastTimestamp` and `message`. A PATCH answered 404 (the event expired) creates it again.
- Spam filter (`EventSourceObjectSpamFilter`): per source and object (and type), a token bucket of 25
  events refilled one per 5 minutes; an event over it is skipped.
- A write that gets no answer is tried again (12 tries in all, as `maxTriesPerEvent`, waiting between
  tries up to client-go's 10 s); one the server refuses (any HTTP status) is abandoned and logged.
- The writes take tokens of a bucket of their own (50 a second, bursts of 100), not of the client's:
  kubelet and kube-scheduler write Events through a client of their own, so Events never hold back
  the calls that do the work (a Binding, a status patch).

An Event is named `<object name>.<wall-clock nanoseconds in hex>` (tools/record/util
`GenerateEventName`; a UUID when that is not a valid name), in the object's namespace ("default" for
a cluster-scoped object). Its `source` is the recorder's `EventSource` (component, host); as
`generateEvent` does, `reportingComponent` is the component and `reportingInstance` the host (or the
instance the source names). `action` and `eventTime` are set only when asked for.

Correlation is pure (`EventCorrelator`, its time passed in); the I/O is `EventRecorder` on an asyncio
loop. Threads use `hami_kube.blocking.ThreadedEventRecorder`, which hands each event to this loop.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from hami_kube.backoff import RetryPolicy
from hami_kube.client import JSONDict, KubeApi, PatchType
from hami_kube.errors import KubeApiError
from hami_kube.flowcontrol import RateLimiter, TokenBucket, rate_limiter

log = logging.getLogger(__name__)

COMBINED_PREFIX = "(combined from similar events): "
"""events_cache.go EventAggregatorByReasonMessageFunc."""
MESSAGE_LIMIT = 1024
"""Messages are cut to this many characters (the bound events.k8s.io/v1 puts on `note`)."""
MAX_TRIES = 12
"""event.go maxTriesPerEvent."""
EVENTS_QPS = 50.0
EVENTS_BURST = 100
"""The writes of Events take tokens of a bucket of their own, not of the client's: kubelet and
kube-scheduler write Events through a client of their own (kubelet's eventRecordQPS/eventBurst
defaults), so Events never hold back the calls that do the work."""
EVENT_RETRY = RetryPolicy(initial=1.0, maximum=10.0, factor=2.0, jitter=0.5)
"""The wait between tries of an unanswered write, capped at event.go's 10 s sleep (whose first sleep is
randomised, as the jitter does here)."""

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# --- what an event is ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The `involvedObject` of an Event (a core/v1 ObjectReference)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"
    resource_version: str = ""
    field_path: str = ""

    def to_json(self) -> JSONDict:
        """The reference as the API has it (empty fields left out, as Go's omitempty does)."""
        out: JSONDict = {"apiVersion": self.api_version, "kind": self.kind}
        if self.namespace:
            out["namespace"] = self.namespace
        out["name"] = self.name
        for key, value in (
            ("uid", self.uid),
            ("resourceVersion", self.resource_version),
            ("fieldPath", self.field_path),
        ):
            if value:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class EventSource:
    """Who writes the events: `source.component` and `source.host`, `reportingComponent` (the component)
    and `reportingInstance` (`reporting_instance`, else the host, as tools/record's `generateEvent`)."""

    component: str
    host: str = ""
    reporting_instance: str | None = None

    def __post_init__(self) -> None:
        if not self.component:
            raise ValueError("event source: component must not be empty")

    @property
    def instance(self) -> str:
        return self.host if self.reporting_instance is None else self.reporting_instance


@dataclass(frozen=True, slots=True)
class Event:
    """One core/v1 Event as the correlator sees it. Timestamps are RFC 3339 strings (seconds, as
    metav1.Time), `event_time` an RFC 3339 string with microseconds (metav1.MicroTime) or ""."""

    namespace: str
    name: str
    regarding: ObjectRef
    type: str
    reason: str
    message: str
    source: EventSource
    first_timestamp: str
    last_timestamp: str
    count: int = 1
    action: str = ""
    event_time: str = ""
    resource_version: str = ""

    def body(self) -> JSONDict:
        """The Event as the API takes it."""
        metadata: JSONDict = {"name": self.name, "namespace": self.namespace}
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        out: JSONDict = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": self.regarding.to_json(),
            "type": self.type,
            "reason": self.reason,
            "message": self.message,
            "source": {
                "component": self.source.component,
                **({"host": self.source.host} if self.source.host else {}),
            },
            "reportingComponent": self.source.component,
            "reportingInstance": self.source.instance,
            "firstTimestamp": self.first_timestamp,
            "lastTimestamp": self.last_timestamp,
            "count": self.count,
        }
        if self.action:
            out["action"] = self.action
        if self.event_time:
            out["eventTime"] = self.event_time
        return out


def rfc3339(wall_s: float) -> str:
    """A metav1.Time (whole seconds, UTC)."""
    return datetime.datetime.fromtimestamp(wall_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(wall_s: float) -> str:
    """A metav1.MicroTime (microseconds, UTC)."""
    return datetime.datetime.fromtimestamp(wall_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_name(object_name: str, unix_nanos: int) -> str:
    """tools/record/util GenerateEventName: `<name>.<nanoseconds in hex>`, or a UUID when that is not a
    valid object name (a DNS subdomain of at most 253 characters)."""
    name = f"{object_name}.{unix_nanos:x}"
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return str(uuid.uuid4())
    return name


def new_event(  # noqa: PLR0917
    regarding: ObjectRef,
    type_: str,
    reason: str,
    message: str,
    source: EventSource,
    wall_s: float,
    *,
    unix_nanos: int | None = None,
    action: str = "",
    event_time: bool = False,
) -> Event:
    """An Event about `regarding` happening at `wall_s` (tools/record `makeEvent` and `generateEvent`):
    count 1, first and last timestamp now, named from the object and `unix_nanos` (else `wall_s`)."""
    stamp = rfc3339(wall_s)
    nanos = unix_nanos if unix_nanos is not None else int(wall_s * 1e9)
    return Event(
        namespace=regarding.namespace or "default",
        name=event_name(regarding.name, nanos),
        regarding=regarding,
        type=type_,
        reason=reason,
        message=message[:MESSAGE_LIMIT],
        source=source,
        first_timestamp=stamp,
        last_timestamp=stamp,
        action=action,
        event_time=rfc3339_micro(wall_s) if event_time else "",
    )


# --- correlation (pure) ----------------------------------------------------------------------------------


def _object_key(event: Event) -> tuple[str, ...]:
    ref = event.regarding
    return (event.source.component, event.source.host, ref.kind, ref.namespace, ref.name)


def event_key(event: Event) -> Hashable:
    """events_cache.go getEventKey: source, object (with field path, uid and API version), type, reason
    and message. Equal keys are the same event, counted instead of created again."""
    ref = event.regarding
    return (
        *_object_key(event),
        ref.field_path,
        ref.uid,
        ref.api_version,
        event.type,
        event.reason,
        event.message,
    )


def spam_key(event: Event) -> Hashable:
    """events_cache.go getSpamKey: source, object and type."""
    ref = event.regarding
    return (*_object_key(event), ref.uid, ref.api_version, event.type)


def aggregate_key(event: Event) -> Hashable:
    """events_cache.go EventAggregatorByReasonFunc: everything but the message (the local key)."""
    ref = event.regarding
    return (
        *_object_key(event),
        ref.uid,
        ref.api_version,
        event.type,
        event.reason,
        event.source.component,
        event.source.instance,
    )


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """k8s.io/utils/lru: at most `size` entries, the least recently used evicted."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: collections.OrderedDict[K, V] = collections.OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def add(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class CorrelatorOptions:
    """events_cache.go's defaults (CorrelatorOptions): aggregate after `max_events` distinct messages
    within `max_interval_s`; a spam bucket of `spam_burst` refilled at `spam_qps`; LRU caches of
    `cache_size` entries."""

    max_events: int = 10
    max_interval_s: float = 600.0
    spam_burst: int = 25
    spam_qps: float = 1.0 / 300.0
    cache_size: int = 4096

    def __post_init__(self) -> None:
        if self.max_events < 1 or self.max_interval_s <= 0:
            raise ValueError(
                f"event correlator: need max_events >= 1 and max_interval_s > 0, got {self.max_events}, "
                f"{self.max_interval_s}"
            )
        if self.spam_burst < 1 or self.spam_qps <= 0 or self.cache_size < 1:
            raise ValueError(
                f"event correlator: need spam_burst >= 1, spam_qps > 0 and cache_size >= 1, got {self}"
            )


@dataclass(slots=True)
class _Aggregate:
    messages: dict[str, None]
    """The distinct messages seen (insertion-ordered; client-go's set pops any, this pops the oldest)."""
    last: float


@dataclass(frozen=True, slots=True)
class _Logged:
    """eventLog: what was last written under a key."""

    count: int
    first_timestamp: str
    name: str
    resource_version: str


@dataclass(frozen=True, slots=True)
class Correlated:
    """What to write: `event`, created, or with `patch` (a strategic merge patch) applied to the event
    of that name already written."""

    event: Event
    patch: JSONDict | None = None


class EventCorrelator:
    """tools/record EventCorrelator: aggregation, de-duplication and the spam filter. Pure: the caller
    passes the time (`now`, seconds of a monotonic clock). Not thread-safe."""

    def __init__(self, options: CorrelatorOptions | None = None) -> None:
        self.options = options or CorrelatorOptions()
        size = self.options.cache_size
        self._aggregates: _Lru[Hashable, _Aggregate] = _Lru(size)
        self._logged: _Lru[Hashable, _Logged] = _Lru(size)
        self._spam: _Lru[Hashable, TokenBucket] = _Lru(size)

    def _aggregate(self, event: Event, now: float) -> tuple[Event, Hashable]:
        """EventAggregator.EventAggregate: the event to write and its cache key."""
        key = aggregate_key(event)
        record = self._aggregates.get(key)
        if record is None or now - record.last > self.options.max_interval_s:
            record = _Aggregate({}, now)
        record.messages[event.message] = None
        record.last = now
        self._aggregates.add(key, record)
        if len(record.messages) < self.options.max_events:
            return event, event_key(event)
        del record.messages[next(iter(record.messages))]  # never grow past max_events
        combined = replace(
            event,
            message=(COMBINED_PREFIX + event.message)[:MESSAGE_LIMIT],
            first_timestamp=event.last_timestamp,
            count=1,
            resource_version="",
        )
        return combined, key

    def _observe(self, event: Event, key: Hashable) -> Correlated:
        """eventLogger.eventObserve: a repeat of a logged event becomes a patch of that event."""
        last = self._logged.get(key)
        patch: JSONDict | None = None
        if last is not None and last.count > 0:
            event = replace(
                event,
                name=last.name,
                resource_version=last.resource_version,
                first_timestamp=last.first_timestamp,
                count=last.count + 1,
            )
            # strategicpatch.CreateTwoWayMergePatch of the event without and with these three fields.
            patch = {"count": event.count, "lastTimestamp": event.last_timestamp, "message": event.message}
        self._logged.add(key, _Logged(event.count, event.first_timestamp, event.name, event.resource_version))
        return Correlated(event, patch)

    def _filtered(self, event: Event, now: float) -> bool:
        """EventSourceObjectSpamFilter.Filter: True when the source+object bucket is empty."""
        key = spam_key(event)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = TokenBucket(self.options.spam_qps, self.options.spam_burst, now)
        accepted = bucket.try_accept(now)
        self._spam.add(key, bucket)
        return not accepted

    def correlate(self, event: Event, now: float) -> Correlated | None:
        """EventCorrelate: what to write for `event`, or None when the spam filter drops it (it is still
        counted: a later repeat patches the count past it, as client-go does)."""
        aggregated, key = self._aggregate(event, now)
        observed = self._observe(aggregated, key)
        if self._filtered(observed.event, now):
            return None
        return observed

    def update_state(self, written: Event, answer: JSONDict) -> None:
        """UpdateState: remember the server's name, resourceVersion, count and first timestamp of the
        event written (`answer` is the API server's copy)."""
        meta = answer.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        count = answer.get("count")
        self._logged.add(
            event_key(written),
            _Logged(
                count if isinstance(count, int) and count > 0 else written.count,
                str(answer.get("firstTimestamp") or written.first_timestamp),
                str(meta.get("name") or written.name),
                str(meta.get("resourceVersion") or ""),
            ),
        )


# --- the recorder ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventLimits:
    """Limits checked when an event is recorded, before it is queued (an event over them is dropped and
    counted, never queued): at most one event per object and reason per `per_object_s` (0: no such
    limit); overall a token bucket of `burst` events refilled at `per_second` (0: none); `queue`
    events waiting at most (event.go's maxQueuedEvents)."""

    per_object_s: float = 0.0
    per_second: float = 0.0
    burst: int = 50
    queue: int = 1000

    def __post_init__(self) -> None:
        if self.per_object_s < 0 or self.per_second < 0 or self.queue < 1:
            raise ValueError(f"event limits: need per_object_s >= 0, per_second >= 0, queue >= 1, got {self}")
        if self.per_second > 0 and self.burst < 1:
            raise ValueError(f"event limits: burst must be >= 1 when per_second > 0, got {self.burst}")


class _Broadcaster:
    """What the recorders of one writer share: the queue, the correlator, the limits, the counters and
    the background task (tools/record's eventBroadcasterImpl with one sink)."""

    def __init__(  # noqa: PLR0917
        self,
        api: KubeApi,
        limits: EventLimits,
        correlator: EventCorrelator,
        retry: RetryPolicy,
        max_tries: int,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random,
        limiter: RateLimiter | None,
    ) -> None:
        self.api = api
        self.limiter = limiter
        self.limits = limits
        self.correlator = correlator
        self.retry = retry
        self.max_tries = max_tries
        self.clock = clock
        self.wall_clock = wall_clock
        self.rng = rng
        self.queue: asyncio.Queue[Event] = asyncio.Queue(limits.queue)
        self.bucket = TokenBucket(limits.per_second, limits.burst, clock()) if limits.per_second > 0 else None
        self.last_by_object: collections.OrderedDict[Hashable, float] = collections.OrderedDict()
        self.last_nanos = 0
        self.task: asyncio.Task[None] | None = None
        self.sent = 0
        self.patched = 0
        self.dropped = 0
        self.skipped = 0
        self.failed = 0


class EventRecorder:
    """Records core/v1 Events about objects, as `source`, written by one background task (`start()`,
    `await stop()`). Call on the loop that runs it; `record` never blocks and never raises.

    Counters (shared with the recorders made by `with_source`): `sent` (created or patched; `patched`
    of them patched), `dropped` (over `EventLimits` or the queue full), `skipped` (spam filter),
    `failed` (refused by the server, or no answer after every try)."""

    def __init__(
        self,
        api: KubeApi,
        source: EventSource,
        *,
        limits: EventLimits | None = None,
        correlator: CorrelatorOptions | None = None,
        retry: RetryPolicy = EVENT_RETRY,
        max_tries: int = MAX_TRIES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        event_time: bool = False,
        rng: random.Random | None = None,
        qps: float = EVENTS_QPS,
        burst: int = EVENTS_BURST,
        _shared: _Broadcaster | None = None,
    ) -> None:
        """`clock` (monotonic seconds) times the limits and the correlator; `wall_clock` (Unix seconds)
        stamps and names the events. `event_time` also sets `eventTime` (as events written through
        events.k8s.io read back). `qps`/`burst`: the writes' own token bucket (qps <= 0: the client's)."""
        if max_tries < 1:
            raise ValueError(f"event recorder: max_tries must be >= 1, got {max_tries}")
        self.source = source
        self.event_time = event_time
        self._b = _shared or _Broadcaster(
            api,
            limits or EventLimits(),
            EventCorrelator(correlator),
            retry,
            max_tries,
            clock,
            wall_clock,
            rng or random.Random(),
            rate_limiter(qps, burst),
        )

    def with_source(self, source: EventSource, *, event_time: bool | None = None) -> EventRecorder:
        """A recorder for another source that shares this one's queue, task, correlator and counters
        (tools/record: one broadcaster, a recorder per source)."""
        b = self._b
        return EventRecorder(
            b.api,
            source,
            event_time=self.event_time if event_time is None else event_time,
            _shared=b,
        )

    # -- counters -------------------------------------------------------------------------------------

    @property
    def sent(self) -> int:
        return self._b.sent

    @property
    def patched(self) -> int:
        return self._b.patched

    @property
    def dropped(self) -> int:
        return self._b.dropped

    @property
    def skipped(self) -> int:
        return self._b.skipped

    @property
    def failed(self) -> int:
        return self._b.failed

    @property
    def queued(self) -> int:
        """Events waiting to be written."""
        return self._b.queue.qsize()

    # -- life cycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background task (on the running loop); idempotent."""
        b = self._b
        if b.task is None or b.task.done():
            b.task = asyncio.get_running_loop().create_task(
                self._run(), name=f"events-{self.source.component}"
            )

    async def stop(self, grace_s: float = 0.0) -> None:
        """Wait up to `grace_s` for the queued events to be written, then end the task (what is left
        is not written)."""
        b = self._b
        task, b.task = b.task, None
        if task is None:
            return
        if grace_s > 0 and not task.done():
            try:
                await asyncio.wait_for(b.queue.join(), grace_s)
            except TimeoutError:
                log.info("events: stopping with %d not written", b.queue.qsize())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Whether every queued event has been handled (written, abandoned or skipped) within
        `timeout_s`."""
        try:
            await asyncio.wait_for(self._b.queue.join(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- recording ------------------------------------------------------------------------------------

    def record(  # noqa: PLR0917
        self,
        namespace: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        *,
        kind: str = "Pod",
        api_version: str = "v1",
        resource_version: str = "",
        action: str = "",
    ) -> None:
        """Record an event about the object `kind` `namespace`/`name` (namespace "" for a
        cluster-scoped one: the event goes to "default"); fire and forget."""
        self.emit(
            ObjectRef(kind, name, namespace, uid, api_version, resource_version),
            type_,
            reason,
            message,
            action=action,
        )

    def emit(self, regarding: ObjectRef, type_: str, reason: str, message: str, *, action: str = "") -> None:
        """Record an event about `regarding` (see `record`); never raises."""
        try:
            self._emit(regarding, type_, reason, message, action)
        except Exception:
            self._b.dropped += 1
            log.exception("event %s about %s %s not recorded", reason, regarding.kind, regarding.name)

    def _emit(self, regarding: ObjectRef, type_: str, reason: str, message: str, action: str) -> None:
        b = self._b
        if type_ not in ("Normal", "Warning"):  # tools/record/util ValidateEventType
            log.error("event %s about %s: unsupported type %r, not recorded", reason, regarding.name, type_)
            b.dropped += 1
            return
        if not self._admit(regarding, reason):
            b.dropped += 1
            log.debug(
                "event %s about %s/%s over the limits, dropped", reason, regarding.namespace, regarding.name
            )
            return
        wall = b.wall_clock()
        nanos = max(int(wall * 1e9), b.last_nanos + 1)  # unique names even from a coarse clock
        b.last_nanos = nanos
        event = new_event(
            regarding,
            type_,
            reason,
            message,
            self.source,
            wall,
            unix_nanos=nanos,
            action=action,
            event_time=self.event_time,
        )
        try:
            b.queue.put_nowait(event)
        except asyncio.QueueFull:
            b.dropped += 1
            level = logging.WARNING if b.dropped & (b.dropped - 1) == 0 else logging.DEBUG
            log.log(
                level,
                "events: too many queued (%d), dropped %s about %s",
                b.queue.maxsize,
                reason,
                regarding.name,
            )

    def _admit(self, regarding: ObjectRef, reason: str) -> bool:
        b = self._b
        limits = b.limits
        if limits.per_object_s <= 0 and b.bucket is None:
            return True
        now = b.clock()
        key = (regarding.kind, regarding.namespace, regarding.name, reason)
        last = b.last_by_object.get(key)
        if limits.per_object_s > 0 and last is not None and now - last < limits.per_object_s:
            return False
        if b.bucket is not None and not b.bucket.try_accept(now):
            return False
        if limits.per_object_s > 0:
            b.last_by_object[key] = now
            b.last_by_object.move_to_end(key)
            while len(b.last_by_object) > 10_000:
                b.last_by_object.popitem(last=False)
        return True

    # -- writing --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        b = self._b
        while True:
            event = await b.queue.get()
            try:
                await self._write(event)
            except Exception:
                b.failed += 1
                log.exception(
                    "event %s about %s: writing it failed unexpectedly", event.reason, event.regarding.name
                )
            finally:
                b.queue.task_done()

    async def _write(self, event: Event) -> None:
        """event.go recordToSink: correlate, then try up to `max_tries` times."""
        b = self._b
        result = b.correlator.correlate(event, b.clock())
        if result is None:
            b.skipped += 1
            log.debug("event %s about %s: over the spam filter, skipped", event.reason, event.regarding.name)
            return
        backoff = b.retry.backoff(b.rng)
        for tries in range(1, b.max_tries + 1):
            done = await self._try(result)
            if done:
                return
            if tries == b.max_tries:
                b.failed += 1
                log.error(
                    "event %s about %s not written: no answer after %d tries",
                    event.reason,
                    event.regarding.name,
                    tries,
                )
                return
            await asyncio.sleep(backoff.next())

    async def _try(self, result: Correlated) -> bool:
        """event.go recordEvent: True when finished (written, or refused for good)."""
        b = self._b
        event = result.event
        path = f"/api/v1/namespaces/{event.namespace}/events"
        try:
            answer: JSONDict | None = None
            if result.patch is not None:
                try:
                    answer = await b.api.patch(
                        f"{path}/{event.name}", result.patch, PatchType.STRATEGIC, limiter=b.limiter
                    )
                except KubeApiError as err:
                    if not err.not_found:
                        raise
            if answer is None:
                event = replace(event, resource_version="")
                answer = await b.api.request("POST", path, event.body(), limiter=b.limiter)
            else:
                b.patched += 1
        except KubeApiError as err:
            if err.status == 0:
                log.debug(
                    "event %s about %s: no answer (%s), will try again",
                    event.reason,
                    event.regarding.name,
                    err,
                )
                return False
            b.failed += 1
            # AlreadyExists quietly, as event.go; the others at the 1st, 2nd, 4th, 8th ... refusal, so an
            # API server that refuses every Event (no RBAC rule) does not flood the log.
            loud = err.status != 409 and b.failed & (b.failed - 1) == 0
            log.log(
                logging.WARNING if loud else logging.DEBUG,
                "event %s about %s refused (not retried; %d refused so far): %s",
                event.reason,
                event.regarding.name,
                b.failed,
                err,
            )
            return True
        b.sent += 1
        b.correlator.update_state(event, answer)
        return True


__all__ = [
    "COMBINED_PREFIX",
    "Correlated",
    "CorrelatorOptions",
    "Event",
    "EventCorrelator",
    "EventLimits",
    "EventRecorder",
    "EventSource",
    "ObjectRef",
    "aggregate_key",
    "event_key",
    "event_name",
    "new_event",
    "spam_key",
]
