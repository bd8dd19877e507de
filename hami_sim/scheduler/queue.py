"""kube-scheduler's scheduling queue (`PriorityQueue`), pure: every method takes `now` (seconds on any
monotonic clock), nothing here reads a clock or sleeps.

- **activeQ**: pods ready to try, highest `spec.priority` first, then the earliest enqueue time
  (kube's PrioritySort), then arrival order.
- **backoffQ**: pods waiting out their backoff: `initial * 2**(attempts-1)`, capped at `maximum`,
  counted from the end of the failed attempt (kube's `podInitialBackoffSeconds` 1 /
  `podMaxBackoffSeconds` 10). `pop` moves the expired ones to activeQ first.
- **unschedulable pool**: pods no node could take. They stay until `move_all` (a cluster event that may
  make them fit: node added or changed, an assigned pod deleted or finished, an assumed pod forgotten
  after a failed bind), or after `unschedulable_timeout` (kube's 5 minutes). A moved pod goes to
  backoffQ while its backoff lasts, else to activeQ.
- A pod that failed with an error (extender error, failed bind) goes to backoffQ, never to the pool.
- In-flight: a popped pod is in flight until `done` (scheduled: it leaves the queue), `unschedulable`,
  `gate` (turned away before its attempt, as kube's PreEnqueue: the attempt does not count) or `error`.
  A cluster event during its attempt (kube's moveRequestCycle) sends an unschedulable pod to backoffQ
  instead of the pool, so the event is not lost. Updates and deletes during the attempt are kept and
  applied when it comes back.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

JSON = dict[str, Any]

UNSCHEDULABLE_TIMEOUT_S = 300.0
"""kube's `podMaxInUnschedulablePodsDuration`."""


class State(Enum):
    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"
    IN_FLIGHT = "in-flight"


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def pod_priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def backoff_duration(attempts: int, initial: float, maximum: float) -> float:
    """kube's `calculateBackoffDuration`: 0 before any attempt, then initial, doubling, capped."""
    if attempts <= 0:
        return 0.0
    duration = initial
    for _ in range(1, attempts):
        if duration > maximum - duration:
            return maximum
        duration += duration
    return min(duration, maximum)


def _scheduling_relevant(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What an update must change to requeue an unschedulable pod (kube's `isPodUpdated` ignores status
    and resourceVersion-like metadata), plus `status.resourceClaimStatuses` (kube's
    UpdatePodGeneratedResourceClaim event: the claim controller named a generated claim)."""
    meta = pod.get("metadata") or {}
    return (
        pod.get("spec"),
        meta.get("labels"),
        meta.get("annotations"),
        meta.get("deletionTimestamp"),
        (pod.get("status") or {}).get("resourceClaimStatuses"),
    )


@dataclass(slots=True)
class QueuedPod:
    key: str
    pod: JSON
    timestamp: float
    """When it last entered the queue (activeQ order; backoff counts from here after a failure)."""
    attempts: int = 0
    initial_attempt: float | None = None
    state: State = State.ACTIVE
    seq: int = 0
    cycle_moves: int = 0
    """`moves` when this attempt started (in flight only)."""
    updated_in_flight: bool = False
    deleted_in_flight: bool = False
    unschedulable_since: float = 0.0
    backoff_expiry: float = 0.0
    last_error: str = ""

    @property
    def priority(self) -> int:
        return pod_priority(self.pod)


@dataclass
class SchedulingQueue:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 10.0
    unschedulable_timeout_s: float = UNSCHEDULABLE_TIMEOUT_S
    pods: dict[str, QueuedPod] = field(default_factory=dict)
    moves: int = 0
    """Cluster events that moved the pool so far (kube's moveRequestCycle)."""
    _active: list[tuple[int, float, int, str]] = field(default_factory=list)
    _backoff: list[tuple[float, int, str]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _leftover_at: float = math.inf
    """When the oldest pool member reaches the unschedulable timeout (inf: none)."""

    # --- what the informers feed ------------------------------------------------------------------

    def add(self, pod: JSON, now: float) -> None:
        """A pending pod appeared or changed (add or update, idempotent)."""
        key = pod_key(pod)
        qp = self.pods.get(key)
        if qp is None:
            qp = QueuedPod(key, pod, now)
            self.pods[key] = qp
            self._to_active(qp, now, stamp=False)
            return
        old_relevant = _scheduling_relevant(qp.pod)
        old_priority = qp.priority
        qp.pod = pod
        if qp.state is State.IN_FLIGHT:
            changed = qp.deleted_in_flight or _scheduling_relevant(pod) != old_relevant
            qp.updated_in_flight = qp.updated_in_flight or changed
            qp.deleted_in_flight = False  # deleted and created again during the attempt
        elif qp.state is State.ACTIVE:
            if qp.priority != old_priority:
                self._to_active(qp, now, stamp=False)
        elif qp.state is State.UNSCHEDULABLE and _scheduling_relevant(pod) != old_relevant:
            self._move(qp, now)

    def delete(self, key: str) -> None:
        """The pod is gone, bound elsewhere or terminal: forget it."""
        qp = self.pods.get(key)
        if qp is None:
            return
        if qp.state is State.IN_FLIGHT:
            qp.deleted_in_flight = True
            return
        del self.pods[key]  # heap entries go stale and are skipped

    def move_all(self, now: float) -> int:
        """A cluster event that may make unschedulable pods fit: move the pool to backoffQ/activeQ.
        Returns how many pods moved."""
        self.moves += 1
        moved = 0
        for qp in list(self.pods.values()):
            if qp.state is State.UNSCHEDULABLE:
                self._move(qp, now)
                moved += 1
        return moved

    # --- the scheduling loop -------------------------------------------------------------------------

    def pop(self, now: float) -> QueuedPod | None:
        """The next pod to try (its attempt counted), or None when activeQ is empty."""
        self.flush(now)
        while self._active:
            _, _, seq, key = heapq.heappop(self._active)
            qp = self.pods.get(key)
            if qp is None or qp.state is not State.ACTIVE or qp.seq != seq:
                continue
            qp.state = State.IN_FLIGHT
            qp.attempts += 1
            if qp.initial_attempt is None:
                qp.initial_attempt = now
            qp.cycle_moves = self.moves
            qp.updated_in_flight = False
            return qp
        return None

    def done(self, qp: QueuedPod) -> None:
        """Scheduled (assumed on a node): it leaves the queue."""
        if self.pods.get(qp.key) is qp:
            del self.pods[qp.key]

    def unschedulable(self, qp: QueuedPod, now: float, message: str = "") -> State | None:
        """No node fits: to the pool, or to backoffQ if an event came during the attempt (or the pod
        itself changed). Returns where it went (None: it was deleted meanwhile)."""
        qp.last_error = message
        if not self._readmit(qp):
            return None
        qp.timestamp = now
        if self.moves > qp.cycle_moves or qp.updated_in_flight:
            self._to_backoff(qp, now)
        else:
            qp.state = State.UNSCHEDULABLE
            qp.unschedulable_since = now
            if self.unschedulable_timeout_s > 0:
                self._leftover_at = min(self._leftover_at, now + self.unschedulable_timeout_s)
        return qp.state

    def gate(self, qp: QueuedPod, now: float, message: str = "") -> State | None:
        """A PreEnqueue plugin turned the pod away before its attempt (kube: it never reaches activeQ):
        the attempt does not count, and the pod waits in the pool for an event, with no backoff."""
        qp.attempts -= 1
        if qp.attempts == 0:
            qp.initial_attempt = None
        return self.unschedulable(qp, now, message)

    def error(self, qp: QueuedPod, now: float, message: str = "") -> State | None:
        """The attempt failed with an error (extender error, bind failure): to backoffQ."""
        qp.last_error = message
        if not self._readmit(qp):
            return None
        qp.timestamp = now
        self._to_backoff(qp, now)
        return qp.state

    def flush(self, now: float) -> None:
        """Backoffs that ended go to activeQ; pool members older than the timeout are moved."""
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, key = heapq.heappop(self._backoff)
            qp = self.pods.get(key)
            if qp is not None and qp.state is State.BACKOFF and qp.seq == seq:
                self._to_active(qp, now, stamp=False)
        if now >= self._leftover_at:
            self._leftover_at = math.inf
            for qp in list(self.pods.values()):
                if qp.state is State.UNSCHEDULABLE:
                    if now - qp.unschedulable_since >= self.unschedulable_timeout_s:
                        self._move(qp, now)
                    else:
                        self._leftover_at = min(
                            self._leftover_at, qp.unschedulable_since + self.unschedulable_timeout_s
                        )

    def next_wakeup(self, now: float) -> float | None:
        """Seconds until `pop` may return something without new input (None: never)."""
        while self._active:
            _, _, seq, key = self._active[0]
            qp = self.pods.get(key)
            if qp is not None and qp.state is State.ACTIVE and qp.seq == seq:
                return 0.0
            heapq.heappop(self._active)
        at = self._leftover_at
        while self._backoff:
            expiry, seq, key = self._backoff[0]
            qp = self.pods.get(key)
            if qp is not None and qp.state is State.BACKOFF and qp.seq == seq:
                at = min(at, expiry)
                break
            heapq.heappop(self._backoff)
        return None if at == math.inf else max(0.0, at - now)

    def backoff_expiry(self, qp: QueuedPod) -> float:
        return qp.timestamp + backoff_duration(qp.attempts, self.initial_backoff_s, self.max_backoff_s)

    def lengths(self) -> dict[str, int]:
        counts = {state.value: 0 for state in State}
        for qp in self.pods.values():
            counts[qp.state.value] += 1
        return counts

    # --- internals ---------------------------------------------------------------------------------

    def _readmit(self, qp: QueuedPod) -> bool:
        """Bring a pod whose attempt ended back under the queue's control; False if it was deleted."""
        current = self.pods.get(qp.key)
        if qp.deleted_in_flight or (current is not None and current is not qp):
            if current is qp:
                del self.pods[qp.key]
            return False
        self.pods[qp.key] = qp
        return True

    def _move(self, qp: QueuedPod, now: float) -> None:
        if now < self.backoff_expiry(qp):
            self._to_backoff(qp, now)
        else:
            self._to_active(qp, now, stamp=True)

    def _to_active(self, qp: QueuedPod, now: float, *, stamp: bool) -> None:
        if stamp:
            qp.timestamp = now
        qp.state = State.ACTIVE
        qp.seq = next(self._seq)
        heapq.heappush(self._active, (-qp.priority, qp.timestamp, qp.seq, qp.key))

    def _to_backoff(self, qp: QueuedPod, now: float) -> None:
        qp.state = State.BACKOFF
        qp.seq = next(self._seq)
        qp.backoff_expiry = self.backoff_expiry(qp)
        if qp.backoff_expiry <= now:
            self._to_active(qp, now, stamp=False)
            return
        heapq.heappush(self._backoff, (qp.backoff_expiry, qp.seq, qp.key))
