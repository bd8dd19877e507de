"""kube-scheduler extender `/bind`: choose the pod's GPUs on the node kube-scheduler picked and bind it
with one Binding whose annotations carry the choice. All I/O sits behind the protocols below (the
Kubernetes adapters and the HTTP route live elsewhere); everything here runs on one event loop.

Wire types (`k8s.io/kube-scheduler/extender/v1`, no json tags, so Go field names):
`ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}` in (`read_binding_args`),
`ExtenderBindingResult{Error}` out. The extender service (`scheduling.Extender`) reads the arguments and
finds the pod's GPU ask (its scheduling cycle, the pod store, or the API), then calls `Binder.bind` with
them, and `Binder.fail` / `Binder.refuse` for a bind that cannot get that far: the wiring goes one way,
extender -> binder. Nothing here raises on input: anything wrong comes back in `Error`, naming the field
and value.

**Choices made earlier.** The extender may hand over the GPU choice its filter or prioritize made for
this node (`cycle.Choice`). It is used instead of fitting again exactly when the node's GPUs are those it
was made on (`ClusterCache.generation` unchanged, checked at the moment of use), so the decision is the
one a fresh fit would make; otherwise the pod is fitted again.

**Annotations** (HAMi v2.10 names and formats; HAMi writes the first four at filter time and the last
two just before the Binding, we write them all on the Binding, which the API server copies to the pod):
`hami.io/vgpu-devices-to-allocate` and `hami.io/vgpu-devices-allocated` (the same string),
`hami.io/vgpu-node`, `hami.io/vgpu-time` (unix seconds), `hami.io/bind-phase=allocating`,
`hami.io/bind-time` (unix seconds); beyond HAMi, `hami.io/bind-node-lock: none` when the bind took no
`hami.io/mutex.lock` (the node daemon then has no lock to release and does not read the Node). A pod
without a GPU ask gets a plain Binding without annotations.

**Pending window** (instead of HAMi's five-minute node lock). kubelet's Allocate names no pod, so the
node daemon tells the pods bound to its node but not yet allocated apart by the GPU counts of their
containers. A pod may therefore enter a node's window only if none of its containers asks the same GPU
count as a container of a pod already pending there; on a node whose daemon reads the pod kubelet is
admitting from kubelet's PodResources API (`identifies`: the node says
`hami.io/node-pod-identification: podresources`, hami_node/plugin/kubelet_pods.py) GPU counts may meet,
and only the other vendors' keys (one pod per vendor, `vendor_key`) keep pods apart. A pod leaves the
window when the watch shows its `hami.io/bind-phase` as success or failed, when it is deleted
(`pod_changed`), when its bind fails, or after `allocate_timeout_s` (`sweep`; its slices stay counted,
since the pod still exists). A bind that the window does not admit waits in memory (woken by those
events, no polling) for at most `bind_wait_s`, then fails with a message saying which pod it waited
for; kube-scheduler retries it.

**Foreign node lock.** Other HAMi components may hold `hami.io/mutex.lock` on a node
(`<RFC3339>,<ns>,<pod>`). A lock younger than `node_lock_expiry_s` (HAMi's 5 min, by the wall clock)
that does not name the pod being bound is waited for like the window (woken by `node_changed`, or at
its expiry). We never write or take over a lock.

**Atomicity.** Between the last check of the window and the lock, reading the node's GPUs, fitting (or
checking the earlier choice), assuming the pod (`PodStore.assume`, which counts its slices in the GPU
cache at once) and entering the window there is no `await`, so concurrent binds onto one node can never
both take the same capacity. Any failure after that point (the API server's answer, an exception,
cancellation) that is a definite refusal (a 4xx: the pod is bound elsewhere, gone, another UID)
forgets the assumption and releases the window before returning; when the outcome is unknown (no
answer, a 5xx, a client timeout, cancellation: the Binding may have been committed) both stay until the
watch shows the pod or `sweep` expires them (`allocate_timeout_s`), and a 409 naming this very node
means an earlier Binding of the pod landed: bound.
Model: the bind/Allocate protocol this takes part in is checked exhaustively in `protocol_model.py`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from hami_api._wire import format_rfc3339
from hami_api.annotations import (
    BIND_NODE_LOCK,
    BIND_NODE_LOCK_NONE,
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    VGPU_TIME,
    encode_bind_phase,
    encode_node_lock,
    encode_pod_allocation,
    encode_unix_time,
    encode_vgpu_node,
)
from hami_api.containers import ContainerKind, footprint_slices
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, encode_mig_allocations
from hami_api.resources import ContainerRequest
from hami_api.types import BindPhase, GPUSlice, NodeLock, PodAllocation
from hami_control.cache import ClusterCache
from hami_control.cycle import Choice
from hami_control.devices.base import MUTEX_LOCK
from hami_control.extender import ExtenderArgsError, PodAsk, failure_reason, fit_with_vendors
from hami_control.fit import Fit

log = logging.getLogger(__name__)

NODE_LOCK_EXPIRY_S = 300.0
"""HAMi's `--node-lock-timeout` default (5 min): an older `hami.io/mutex.lock` is stale and ignored."""

DANGLING_LOCK_GRACE_S = 5.0
"""A younger lock's pod may not be in the pod watch yet (HAMi GETs it; we read the watch's store): only an
older lock is judged dangling by its pod's absence."""

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_SHOWN = 80


# --- the edges ------------------------------------------------------------------------------------------


class BindRejected(Exception):
    """The API server did not bind: `status` is its HTTP status (409 conflict, 404 not found, ...; 0 when
    the request did not get an answer), `reason` its Status reason (`Conflict`, `NotFound`, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")

    def __reduce__(self) -> tuple[type[BindRejected], tuple[int, str, str]]:
        return (type(self), (self.status, self.reason, self.message))


class AllocatingPod(Protocol):
    """What `Binder.adopt_allocating` and `Binder.pod_event` read of a watched pod (`pod_store.PodRecord`
    is one)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def node_name(self) -> str: ...
    @property
    def terminal(self) -> bool: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def requests(self) -> Sequence[ContainerRequest | None]: ...
    @property
    def mixed(self) -> bool:
        """It asks NVIDIA GPUs and another vendor's devices."""
        ...

    @property
    def running(self) -> bool: ...


class BindingWriter(Protocol):
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """POST pods/<name>/binding (target node, metadata.annotations, metadata.uid as precondition).
        Raises `BindRejected` when the API server says no."""
        ...


class NodeLocker(Protocol):
    async def lock(self, node: str, annotation: str, value: str) -> None:
        """Set a lock annotation on the Node (a merge patch). Raises `BindRejected` when refused."""
        ...

    async def unlock(self, node: str, annotation: str) -> None:
        """Remove a lock annotation from the Node (a merge patch)."""
        ...


class EventRecorder(Protocol):
    def record(  # noqa: PLR0917 (the lead's adapter signature)
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str
    ) -> None:
        """Emit an event on the pod; fire and forget."""
        ...


class Assumptions(Protocol):
    """Where a bound pod is counted until the watch confirms it (`pod_store.PodStore`)."""

    def assume(
        self,
        uid: str,
        node: str,
        allocation: PodAllocation,
        kinds: Sequence[ContainerKind],
        now: float,
        *,
        namespace: str = "",
        name: str = "",
        extra: tuple[GPUSlice, ...] = (),
        annotations: tuple[tuple[str, str], ...] = (),
        mig: tuple[MigAllocation, ...] = (),
    ) -> None: ...

    def forget(self, uid: str) -> None: ...

    def expire(self, now: float, ttl: float) -> list[str]: ...

    def find(self, namespace: str, name: str) -> AllocatingPod | None: ...


NodeLockSource = Callable[[str], NodeLock | None]
"""The node's `hami.io/mutex.lock`, decoded, if any."""


# --- the pending window ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A pod bound to `node` that the node daemon has not answered yet."""

    uid: str
    node: str
    counts: frozenset[int]
    """The GPU counts of its containers that ask for GPUs."""
    since: float
    who: str = ""
    """`namespace/name`, for messages."""


class PendingWindow:
    """Per node, the pods bound but not yet allocated. Pure: `now` is passed in (any monotonic scale)."""

    def __init__(self) -> None:
        self._entries: dict[str, PendingEntry] = {}
        self._by_node: dict[str, dict[str, PendingEntry]] = {}

    def blocked(self, node: str, counts: frozenset[int] | set[int]) -> str | None:
        """The uid of a pod pending on `node` with a container asking one of `counts` GPUs, if any
        (the one that entered first)."""
        for entry in self._by_node.get(node, {}).values():
            if not entry.counts.isdisjoint(counts):
                return entry.uid
        return None

    def enter(
        self, node: str, uid: str, counts: frozenset[int] | set[int], now: float, who: str = ""
    ) -> None:
        """Add `uid` to `node`'s window (moving it if it is pending elsewhere)."""
        self.release(uid)
        entry = PendingEntry(uid, node, frozenset(counts), now, who)
        self._entries[uid] = entry
        self._by_node.setdefault(node, {})[uid] = entry

    def release(self, uid: str) -> PendingEntry | None:
        """Take `uid` out of its window; returns its entry (None when it was not pending)."""
        entry = self._entries.pop(uid, None)
        if entry is None:
            return None
        on_node = self._by_node[entry.node]
        del on_node[uid]
        if not on_node:
            del self._by_node[entry.node]
        return entry

    def expire(self, now: float, timeout: float) -> list[str]:
        """Release the entries older than `timeout`; returns their uids, oldest first."""
        stale = sorted(
            (e for e in self._entries.values() if now - e.since > timeout), key=lambda e: (e.since, e.uid)
        )
        for entry in stale:
            self.release(entry.uid)
        return [entry.uid for entry in stale]

    def pending(self, node: str) -> tuple[str, ...]:
        """The uids pending on `node`, in the order they entered."""
        return tuple(self._by_node.get(node, {}))

    def entry(self, uid: str) -> PendingEntry | None:
        return self._entries.get(uid)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[PendingEntry]:
        return iter(list(self._entries.values()))


# --- reading the arguments ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindingArgs:
    namespace: str
    name: str
    uid: str
    node: str

    @property
    def who(self) -> str:
        return f"{self.namespace}/{self.name}"


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # JSON nested past the recursion limit; an int past 4,300 digits
        return f"<{type(value).__name__} nested too deep or too long to show>"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def read_binding_args(args: object) -> BindingArgs:
    """ExtenderBindingArgs JSON -> BindingArgs. Raises `ExtenderArgsError` naming the field and value."""
    if not isinstance(args, Mapping):
        raise ExtenderArgsError(f"ExtenderBindingArgs: expected a JSON object, got {_shown(args)}")
    values: dict[str, str] = {}
    for key, what in (
        ("PodNamespace", "a namespace"),
        ("PodName", "a pod name"),
        ("PodUID", "a pod UID"),
        ("Node", "a node name"),
    ):
        value = args.get(key)
        if value is None:
            raise ExtenderArgsError(f"ExtenderBindingArgs.{key}: missing")
        if not isinstance(value, str) or not value or value != value.strip():
            raise ExtenderArgsError(f"ExtenderBindingArgs.{key}: expected {what}, got {_shown(value)}")
        values[key] = value
    node = values["Node"]
    if len(node) > 253 or not _DNS_SUBDOMAIN.fullmatch(node):
        raise ExtenderArgsError(
            f"ExtenderBindingArgs.Node: expected a node name (a lowercase DNS subdomain), got {_shown(node)}"
        )
    return BindingArgs(values["PodNamespace"], values["PodName"], values["PodUID"], node)


_VENDOR_KEYS: dict[int, str] = {}
"""Window keys of the other vendors (negative, so never a GPU count) -> their common word."""


def vendor_key(word: str) -> int:
    """The pending-window key of a vendor: at most one pod per vendor is being allocated on a node at a
    time, as HAMi's node lock has it for the vendors' own device plugins (which find the pod to
    allocate by node and bind phase, not by device counts)."""
    key = -1 - zlib.crc32(word.encode())
    _VENDOR_KEYS[key] = word
    return key


def gpu_counts(ask: PodAsk) -> frozenset[int]:
    """The GPU counts (`nvidia.com/gpu`) of the pod's containers that ask for GPUs, init ones included,
    and the window key of each other vendor it asks (`vendor_key`)."""
    counts = frozenset(
        request.nums for request, _ in ask.requests if request is not None and request.nums > 0
    )
    if ask.vendors is None:
        return counts
    return counts | {vendor_key(word) for word in ask.vendors.words}


def _shown_keys(keys: Iterable[int]) -> str:
    return ", ".join(_VENDOR_KEYS.get(k, str(k)) for k in sorted(keys, key=lambda k: (k < 0, abs(k))))


def binding_annotations(
    allocation: PodAllocation,
    node: str,
    unix_now: int,
    *,
    nvidia: bool = True,
    mig: Sequence[MigAllocation] = (),
) -> dict[str, str]:
    """The annotations a GPU pod's Binding carries (see the module docstring), with NVIDIA GPUs
    `hami.io/bind-node-lock: none` (for hami-node; `_write` drops it for a pod whose bind takes
    `hami.io/mutex.lock`); NVIDIA's device
    annotations only when the pod asks NVIDIA GPUs (`nvidia`), and with MIG devices (`mig`, `Fit.mig`)
    `hami.io/vgpu-mig-allocations` beside them, as HAMi's PatchAnnotations (the device annotations
    then carry each MIG device's profile memory and cores on its physical GPU)."""
    stamp = encode_unix_time(unix_now)
    devices: dict[str, str] = {}
    if nvidia:
        text = encode_pod_allocation(allocation)
        devices = {DEVICES_TO_ALLOCATE: text, DEVICES_ALLOCATED: text}
        if mig:
            devices[MIG_ALLOCATIONS] = encode_mig_allocations(mig)
    return {
        **devices,
        VGPU_NODE: encode_vgpu_node(node),
        VGPU_TIME: stamp,
        BIND_PHASE: encode_bind_phase(BindPhase.ALLOCATING),
        BIND_TIME: stamp,
        **({BIND_NODE_LOCK: BIND_NODE_LOCK_NONE} if nvidia else {}),
    }


def vendor_annotations(ask: PodAsk, fit: Fit, node: str, unix_now: float) -> dict[str, str]:
    """What the other vendors write on the pod for their devices (HAMi's PatchAnnotations)."""
    if ask.vendors is None or fit.vendors is None:
        return {}
    pod = ask.vendors.pod(ask.namespace, ask.name)
    now = datetime.fromtimestamp(unix_now, tz=UTC)
    by_word = {v.names.common_word: v for v in ask.vendors.vendors}
    out: dict[str, str] = {}
    for word, devices in fit.vendors.allocations.items():
        vendor = by_word.get(word)
        if vendor is not None:
            custom = fit.vendors.custom.get(word, ())
            out.update(vendor.pod_annotations(pod, devices, node=node, now=now, custom=custom))
    return out


def node_locks(ask: PodAsk) -> tuple[str, ...]:
    """The node lock annotations a pod's bind takes (HAMi's LockNode, over the vendors in sorted common
    word order): those of the vendors a regular container asks whose lock is not NONE."""
    if ask.vendors is None:
        return ()
    kinds = ask.kinds
    asked = {
        word
        for index, container in enumerate(ask.vendors.requests)
        if kinds[index] is ContainerKind.APP
        for word, _ in container
    }
    locks = {
        v.names.lock_annotation
        for v in ask.vendors.vendors
        if v.names.common_word in asked and v.names.lock_annotation
    }
    return tuple(sorted(locks))


def vendor_expectations(ask: PodAsk, fit: Fit) -> dict[str, str]:
    """What the vendors expect of their devices once this placement is written (Metax sGPU's QoS
    policies: HAMi's JitteryQosCache, filled by its PatchAnnotations)."""
    if ask.vendors is None or fit.vendors is None:
        return {}
    pod = ask.vendors.pod(ask.namespace, ask.name)
    by_word = {v.names.common_word: v for v in ask.vendors.vendors}
    out: dict[str, str] = {}
    for word, devices in fit.vendors.allocations.items():
        vendor = by_word.get(word)
        if vendor is not None:
            out.update(vendor.placement_expectations(pod, devices, fit.vendors.custom.get(word, ())))
    return out


def vendor_slices(ask: PodAsk, fit: Fit) -> tuple[GPUSlice, ...]:
    """The other vendors' devices the pod holds at its busiest (init containers one at a time)."""
    if fit.vendors is None:
        return ()
    return tuple(s for a in fit.vendors.allocations.values() for s in footprint_slices(a, ask.kinds))


def _gpus_text(allocation: PodAllocation, others: Iterable[GPUSlice] = ()) -> str:
    seen: list[str] = []
    for s in (*allocation.slices(), *others):
        if s.uuid not in seen:
            seen.append(s.uuid)
    return ",".join(seen)


def _seconds(value: float) -> str:
    return f"{value:g} s"


# --- the binder -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Obstacle:
    """Why a pod cannot enter its node's window yet."""

    message: str
    outcome: str
    wake_in: float | None = None
    """Seconds until it goes away by itself (a lock expiring), if known."""


class _Failed(Exception):
    """A bind that ends with `Error` (internal control flow)."""

    def __init__(self, outcome: str, message: str, event: bool = True) -> None:
        self.outcome = outcome
        self.message = message
        self.event = event
        super().__init__(message)


class Binder:
    """The extender's bind verb; see the module docstring. Single event loop, not thread-safe."""

    def __init__(
        self,
        cache: ClusterCache,
        pods: Assumptions,
        writer: BindingWriter,
        events: EventRecorder,
        *,
        node_lock: NodeLockSource,
        allocate_timeout_s: float = 30.0,
        bind_wait_s: float = 10.0,
        node_lock_expiry_s: float = NODE_LOCK_EXPIRY_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        locker: NodeLocker | None = None,
        identifies: Callable[[str], bool] = lambda _node: False,
    ) -> None:
        if allocate_timeout_s <= 0 or bind_wait_s <= 0 or node_lock_expiry_s <= 0:
            raise ValueError(
                f"timeouts must be > 0: allocate_timeout_s={allocate_timeout_s}, bind_wait_s={bind_wait_s}, "
                f"node_lock_expiry_s={node_lock_expiry_s}"
            )
        self._cache = cache
        self._pods = pods
        self._writer = writer
        self._events = events
        self._node_lock = node_lock
        self._locker = locker
        self._identifies = identifies
        self.allocate_timeout_s = allocate_timeout_s
        self.bind_wait_s = bind_wait_s
        self.node_lock_expiry_s = node_lock_expiry_s
        self._clock = clock
        self._wall_clock = wall_clock
        self.window = PendingWindow()
        self.outcomes: collections.Counter[str] = collections.Counter()
        """Binds by outcome: success, success_plain, no_fit, unregistered, conflict, not_found, api_error,
        wait_timeout, lock_timeout, bad_request."""
        self.reused = 0
        """Binds that took the choice their filter or prioritize made instead of fitting again."""
        self._in_flight: dict[str, str] = {}
        """uid -> node of the binds between reading their arguments and their answer."""
        self._wakeups: dict[str, asyncio.Event] = {}
        self._waiting = 0
        self._bad_lock_logged: dict[str, str] = {}

    # --- metrics ---------------------------------------------------------------------------------------

    def pending_count(self, node: str | None = None) -> int:
        """Pods bound but not yet answered by their node daemon (on `node`, or everywhere)."""
        return len(self.window) if node is None else len(self.window.pending(node))

    def waiting_count(self) -> int:
        """Binds waiting for a node's window or lock right now."""
        return self._waiting

    # --- watch input -----------------------------------------------------------------------------------

    def pod_changed(self, uid: str, bind_phase: str | None, deleted: bool = False) -> None:
        """A pod event: `hami.io/bind-phase` success or failed, or the pod's deletion, ends its window."""
        if not deleted and bind_phase not in (BindPhase.SUCCESS.value, BindPhase.FAILED.value):
            return
        entry = self.window.release(uid)
        if entry is None:
            return
        why = "deleted" if deleted else f"bind-phase {bind_phase}"
        log.info("pod %s on node %s allocated (%s); node window released", entry.who, entry.node, why)
        self._wake(entry.node)

    def pod_event(self, old: AllocatingPod | None, new: AllocatingPod | None) -> None:
        """A pod store change (a `pod_store.PodListener`): its bind phase, or its end, may release its
        node's window. A pod kubelet rejected (Failed before any Allocate) never gets a bind-phase answer:
        its window is released as for a deleted pod.

        A pod the watch shows newly allocating on a node (bound there by an earlier run of this process,
        or by another replica) that is not in a window enters its node's window, as `adopt_allocating`
        does for a new leader: the first list after a restart brings every such pod, so a restarted
        single replica (no leader election) never binds a pod with the same GPU count next to one its
        previous run bound (the node daemon could not tell their Allocate calls apart;
        `protocol_model`'s trace "restart control" without election)."""
        if new is None:
            if old is not None:
                self.pod_changed(old.uid, None, deleted=True)
            return
        phase = new.annotations.get(BIND_PHASE)
        if new.mixed and phase == BindPhase.SUCCESS.value and not new.running:
            # Another vendor's plugin writes success once its own part is done (HAMi's
            # PodAllocationTrySuccess reads its own annotation only): hami-node may still be allocating
            # the GPUs, so the window holds until the pod runs (or fails, or is deleted).
            phase = None
        self.pod_changed(new.uid, phase, new.terminal)
        kept = self.window.entry(new.uid)
        if kept is not None and new.node_name and new.node_name != kept.node:
            # bound elsewhere (a bind whose outcome was unknown did not land; someone else bound it)
            self.window.release(new.uid)
            log.info("pod %s is bound to node %s, not %s: node window released", kept.who, new.node_name,
                     kept.node)  # fmt: skip
            self._wake(kept.node)
        if (
            _allocating(new)
            and not (old is not None and _allocating(old) and old.node_name == new.node_name)
            and self.window.entry(new.uid) is None
        ):
            counts = frozenset(r.nums for r in new.requests if r is not None and r.nums > 0)
            self.adopt(new.node_name, new.uid, counts, f"{new.namespace}/{new.name}")

    def adopt(self, node: str, uid: str, counts: frozenset[int], who: str = "") -> None:
        """Put a pod bound by someone else (the previous leader) and not yet answered by its node daemon
        into the node's pending window, as if bound here just now."""
        self.window.enter(node, uid, counts, self._clock(), who)

    def adopt_allocating(self, pods: Iterable[AllocatingPod]) -> int:
        """A new leader takes over the pods the previous one bound that their node daemons have not
        answered yet (`hami.io/bind-phase=allocating`): each enters its node's pending window. Returns
        how many."""
        adopted = 0
        for pod in pods:
            if not _allocating(pod):
                continue
            counts = frozenset(r.nums for r in pod.requests if r is not None and r.nums > 0)
            self.adopt(pod.node_name, pod.uid, counts, f"{pod.namespace}/{pod.name}")
            adopted += 1
        return adopted

    def reset(self) -> None:
        """Forget every pending window (this replica stopped leading); waiting binds are woken."""
        for entry in list(self.window):
            self.window.release(entry.uid)
        self._wake_all()

    def node_changed(self, node: str) -> None:
        """A node event (its `hami.io/mutex.lock` may have changed): wake the binds waiting for it."""
        self._wake(node)

    # --- sweeping --------------------------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """Release window entries older than `allocate_timeout_s` and expire cache assumptions no watch
        confirmed within it; returns the uids affected (window ones first)."""
        now = self._clock()
        released: dict[str, PendingEntry] = {}
        for entry in list(self.window):
            if now - entry.since > self.allocate_timeout_s:
                self.window.release(entry.uid)
                released[entry.uid] = entry
                log.warning(
                    "pod %s on node %s: no allocation answer from the node within %s; node window released "
                    "(its GPUs stay counted while the pod exists)",
                    entry.who,
                    entry.node,
                    _seconds(self.allocate_timeout_s),
                )
        expired = self._pods.expire(now, self.allocate_timeout_s)
        for uid in expired:
            known = released.get(uid)
            log.warning(
                "pod %s on node %s: bind not confirmed by the pod watch within %s; its GPUs are no longer "
                "counted",
                known.who if known is not None else f"uid {uid}",
                known.node if known is not None else "?",
                _seconds(self.allocate_timeout_s),
            )
        if released or expired:
            self._wake_all()
        return [*released, *(uid for uid in expired if uid not in released)]

    async def run_sweeper(self, interval_s: float = 1.0) -> None:
        """Call `sweep` every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.sweep()
            except Exception:
                log.exception("binder sweep failed")

    # --- bind ------------------------------------------------------------------------------------------

    async def bind(
        self, request: BindingArgs, ask: PodAsk | None, choice: Choice | None = None
    ) -> dict[str, Any]:
        """Bind the pod of `request` (its GPU ask `ask`, None for none) -> ExtenderBindingResult JSON.
        `choice`: the GPU choice an earlier verb made for `request.node`, used if the node is unchanged."""
        if request.uid in self._in_flight:
            message = (
                f"pod {request.who} (uid {request.uid}) is already being bound to node "
                f"{self._in_flight[request.uid]}"
            )
            self.outcomes["conflict"] += 1
            log.warning("bind of pod %s to node %s refused: %s", request.who, request.node, message)
            return {"Error": message}
        self._in_flight[request.uid] = request.node
        try:
            if ask is None:
                return await self._bind_plain(request)
            try:
                fit = await self._reserve(request, ask, choice)
            except _Failed as failed:
                return self._fail(request, failed)
            refused = await self._lock_node(request, ask)
            if refused is not None:
                self._rollback(request)
                return self._fail(request, refused)
            return await self._write(request, ask, fit)
        finally:
            del self._in_flight[request.uid]

    def refuse(self, err: ExtenderArgsError) -> dict[str, Any]:
        """ExtenderBindingArgs that cannot be read (`read_binding_args` said why)."""
        self.outcomes["bad_request"] += 1
        log.warning("bind refused: %s", err)
        return {"Error": str(err)}

    def fail(self, request: BindingArgs, outcome: str, message: str, *, event: bool = True) -> dict[str, Any]:
        """A bind that failed before it got here (the pod not found or unreadable): counted under
        `outcome`, logged, and a BindingFailed event on the pod when `event`."""
        return self._fail(request, _Failed(outcome, message, event))

    async def _bind_plain(self, request: BindingArgs) -> dict[str, Any]:
        try:
            await self._writer.bind(request.namespace, request.name, request.uid, request.node, {})
        except BindRejected as err:
            return self._fail(request, _rejected(request, err, False))
        except Exception as err:
            log.exception("bind of pod %s to node %s failed", request.who, request.node)
            return self._fail(request, _Failed("api_error", _api_error(request, err), False))
        self.outcomes["success_plain"] += 1
        log.info("bound pod %s (no GPU request) to node %s", request.who, request.node)
        return {"Error": ""}

    async def _reserve(self, request: BindingArgs, ask: PodAsk, choice: Choice | None) -> Fit:
        """Wait until the node admits the pod, then (no await from the last check on) fit it, assume it
        in the cache and enter it in the node's window. Raises `_Failed`."""
        uid, node = request.uid, request.node
        pending = self.window.entry(uid)
        if pending is not None:
            raise _Failed(
                "conflict",
                f"pod {request.who} is already bound to node {pending.node} and waiting for its GPUs to be "
                f"allocated there",
            )
        counts = gpu_counts(ask)
        self._fit(request, ask, choice)  # fail fast: waiting frees no GPU memory
        obstacle = self._obstacle(request, counts)
        if obstacle is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.bind_wait_s
            log.info("bind of pod %s to node %s waits: %s", request.who, node, obstacle.message)
            self._waiting += 1
            try:
                while obstacle is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise _Failed(
                            obstacle.outcome,
                            f"node {node} busy: {obstacle.message} (waited {_seconds(self.bind_wait_s)}); "
                            f"kube-scheduler will retry",
                        )
                    timeout = remaining if obstacle.wake_in is None else min(remaining, obstacle.wake_in)
                    wakeup = self._wakeups.get(node)
                    if wakeup is None:
                        wakeup = self._wakeups[node] = asyncio.Event()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), max(timeout, 0.0))
                    obstacle = self._obstacle(request, counts)
            finally:
                self._waiting -= 1
        # From here to window.enter: no await.
        fit = self._fit(request, ask, choice)
        if choice is not None and fit is choice.fit:
            self.reused += 1
        allocation = fit.allocation
        now = self._clock()
        self._pods.assume(
            uid,
            node,
            allocation,
            ask.kinds,
            now,
            namespace=request.namespace,
            name=request.name,
            extra=vendor_slices(ask, fit),
            mig=fit.mig,
            annotations=ask.vendors.annotations
            if ask.vendors is not None and ask.vendors.uses_device_pods
            else (),
        )
        self.window.enter(node, uid, counts, now, request.who)
        return fit

    def _fit(self, request: BindingArgs, ask: PodAsk, choice: Choice | None) -> Fit:
        gpus = self._cache.node_gpus(request.node)
        vendor = self._cache.vendor_devices(request.node) if ask.vendors is not None else None
        if gpus is None and (ask.asks_nvidia or vendor is None):
            reason = self._cache.unregistered_reason(request.node) or "node unregistered"
            raise _Failed("unregistered", f"cannot bind pod {request.who} to node {request.node}: {reason}")
        if choice is not None and choice.generation == self._cache.generation(request.node):
            return choice.fit  # made on these very GPUs: the fit a fresh one would give
        result = (
            ask.fit(gpus) if ask.vendors is None else fit_with_vendors(ask, self._cache, request.node, gpus)
        )
        if not isinstance(result, Fit):
            raise _Failed(
                "no_fit", f"pod {request.who} no longer fits node {request.node}: {failure_reason(result)}"
            )
        return result

    def _obstacle(self, request: BindingArgs, counts: frozenset[int]) -> _Obstacle | None:
        node = request.node
        if self._identifies(node):  # kubelet's PodResources API names the pod: GPU counts may meet
            counts = frozenset(key for key in counts if key < 0)
        blocker = self.window.blocked(node, counts)
        if blocker is not None:
            entry = self.window.entry(blocker)
            who = entry.who if entry is not None and entry.who else f"uid {blocker}"
            shared = counts & entry.counts if entry is not None else counts
            return _Obstacle(
                f"pod {who} with the same GPU count ({_shown_keys(shared)}) is still being allocated",
                "wait_timeout",
            )
        lock = self._foreign_lock(request)
        if lock is not None:
            holder = f"pod {lock.namespace}/{lock.pod}" if lock.pod else "another HAMi component"
            left = lock.time.timestamp() + self.node_lock_expiry_s - self._wall_clock()
            return _Obstacle(
                f"hami.io/mutex.lock held by {holder} since {_when(lock.time)}, "
                f"stale after {_seconds(self.node_lock_expiry_s)}",
                "lock_timeout",
                max(left, 0.0),
            )
        return None

    def _foreign_lock(self, request: BindingArgs) -> NodeLock | None:
        node = request.node
        try:
            lock = self._node_lock(node)
        except Exception as err:
            text = f"{type(err).__name__}: {err}"
            if self._bad_lock_logged.get(node) != text:
                log.warning("node %s: hami.io/mutex.lock ignored: %s", node, text)
                self._bad_lock_logged[node] = text
            return None
        if lock is None:
            return None
        if lock.namespace == request.namespace and lock.pod == request.name:
            return None  # taken for this very pod (by a HAMi scheduler): not in our way
        age = self._wall_clock() - lock.time.timestamp()
        if lock.pod and age > DANGLING_LOCK_GRACE_S:
            holder = self._pods.find(lock.namespace, lock.pod)
            if holder is None or holder.terminal:
                # HAMi's LockNode (pkg/util/nodelock/nodelock.go): a lock whose pod is not found is dangling
                # and taken over. A terminal holder too (beyond HAMi): it never reaches Allocate, so no
                # plugin releases its lock and HAMi would wait the full expiry.
                return None
        if age >= self.node_lock_expiry_s:
            return None
        return lock

    async def _write(self, request: BindingArgs, ask: PodAsk, fit: Fit) -> dict[str, Any]:
        """Send the Binding. Only a definite refusal (`_refused`) rolls the reservation back; when the
        outcome is unknown (no answer, a 5xx, a client timeout, an unexpected error, cancellation) the
        Binding may have been committed, so the assumption and the window entry stay until the watch
        shows the pod (bound: they become its watched allocation and its window; deleted or bound
        elsewhere: dropped) or `sweep` expires them after `allocate_timeout_s`
        (`protocol_model.py`, "committed, answer lost")."""
        allocation = fit.allocation
        try:
            wall = self._wall_clock()
            annotations = binding_annotations(
                allocation, request.node, int(wall), nvidia=ask.asks_nvidia, mig=fit.mig
            )
            annotations.update(vendor_annotations(ask, fit, request.node, wall))
            if MUTEX_LOCK in node_locks(ask):  # HAMi's plugin of that vendor, or hami-node, releases it
                annotations.pop(BIND_NODE_LOCK, None)
            await self._writer.bind(request.namespace, request.name, request.uid, request.node, annotations)
        except BindRejected as err:
            if _landed(err, request.node):
                log.info(
                    "bind of pod %s to node %s: the API server says it is already bound there (an earlier "
                    "Binding whose answer was lost): bound",
                    request.who,
                    request.node,
                )
            elif _refused(err):
                self._rollback(request)
                await self._unlock_node(request, ask)
                return self._fail(request, _rejected(request, err, True))
            else:
                self._keep(request, str(err))
                return self._fail(request, _rejected(request, err, True))
        except Exception as err:
            log.exception("bind of pod %s to node %s failed", request.who, request.node)
            self._keep(request, f"{type(err).__name__}: {err}")
            return self._fail(request, _Failed("api_error", _api_error(request, err)))
        except BaseException:
            self._keep(request, "cancelled")
            raise
        self._cache.expect(vendor_expectations(ask, fit))
        gpus = _gpus_text(allocation, vendor_slices(ask, fit))
        self.outcomes["success"] += 1
        log.info("bound pod %s to node %s with GPUs %s", request.who, request.node, gpus)
        self._event(
            request,
            "Normal",
            "BindingSucceed",
            f"Successfully assigned {request.who} GPUs {gpus} to {request.node}",
        )
        return {"Error": ""}

    async def _lock_node(self, request: BindingArgs, ask: PodAsk) -> _Failed | None:
        """HAMi's LockNode for the other vendors' device plugins, which find the pod to allocate through
        the node lock (pkg/util/util.go `GetPendingPod`) and release it once allocated: the vendors
        whose regular containers the pod asks and that lock (`node_locks`). NVIDIA's pods need none
        (hami-node matches them by the pending window). A refused lock fails the bind."""
        if self._locker is None:
            return None
        now = datetime.fromtimestamp(self._wall_clock(), tz=UTC)
        for annotation in node_locks(ask):
            if annotation == MUTEX_LOCK:
                value = encode_node_lock(NodeLock(now, request.namespace, request.name))
            else:
                value = format_rfc3339(now)
            try:
                await self._locker.lock(request.node, annotation, value)
            except BindRejected as err:
                return _Failed("lock_error", f"cannot lock node {request.node} ({annotation}): {err}")
            except Exception as err:
                log.exception("locking node %s for pod %s failed", request.node, request.who)
                return _Failed("lock_error", f"cannot lock node {request.node} ({annotation}): {err}")
        return None

    async def _unlock_node(self, request: BindingArgs, ask: PodAsk) -> None:
        """HAMi's releaseAllDevices on a failed bind: the locks `_lock_node` took for the pod go."""
        if self._locker is None:
            return
        for annotation in node_locks(ask):
            try:
                await self._locker.unlock(request.node, annotation)
            except Exception:
                log.exception("unlocking node %s for pod %s failed", request.node, request.who)

    def _keep(self, request: BindingArgs, why: str) -> None:
        """The Binding's outcome is unknown: keep the reservation for the watch or the sweep."""
        log.warning(
            "bind of pod %s to node %s: outcome unknown (%s); its GPUs stay counted and its node window "
            "held until the pod watch shows it or %s pass",
            request.who,
            request.node,
            why,
            _seconds(self.allocate_timeout_s),
        )

    def _rollback(self, request: BindingArgs) -> None:
        self._pods.forget(request.uid)
        if self.window.release(request.uid) is not None:
            self._wake(request.node)

    def _fail(self, request: BindingArgs, failed: _Failed) -> dict[str, Any]:
        self.outcomes[failed.outcome] += 1
        log.warning(
            "bind of pod %s to node %s failed (%s): %s",
            request.who,
            request.node,
            failed.outcome,
            failed.message,
        )
        if failed.event:
            self._event(request, "Warning", "BindingFailed", failed.message)
        return {"Error": failed.message}

    def _event(self, request: BindingArgs, type_: str, reason: str, message: str) -> None:
        try:
            self._events.record(request.namespace, request.name, request.uid, type_, reason, message)
        except Exception:
            log.exception("event %s for pod %s could not be recorded", reason, request.who)

    # --- waking ----------------------------------------------------------------------------------------

    def _wake(self, node: str) -> None:
        wakeup = self._wakeups.pop(node, None)
        if wakeup is not None:
            wakeup.set()

    def _wake_all(self) -> None:
        wakeups, self._wakeups = self._wakeups, {}
        for wakeup in wakeups.values():
            wakeup.set()


def _allocating(pod: AllocatingPod) -> bool:
    """Bound to a node and waiting for its node daemon's answer (`hami.io/bind-phase=allocating`)."""
    return (
        bool(pod.node_name) and not pod.terminal and pod.annotations.get(BIND_PHASE) == BindPhase.ALLOCATING
    )


def _when(moment: datetime) -> str:
    """RFC 3339, as the lock itself spells it."""
    return encode_node_lock(NodeLock(moment))


def _api_error(request: BindingArgs, err: Exception) -> str:
    return f"binding pod {request.who} to node {request.node} failed: {type(err).__name__}: {err}"


_ASSIGNED = re.compile(r'is already assigned to node "([^"]*)"')


def _landed(err: BindRejected, node: str) -> bool:
    """A 409 saying the pod is already assigned to `node` itself: kube-apiserver's Binding refusal for a
    bound pod names its node (pkg/registry/core/pod/storage/storage.go, `setPodNodeAndMetadata`: "pod %v
    is already assigned to node %q", wrapped in a Conflict by `assignPod`). Only this binder binds a
    GPU pod, and a pod in a window is never bound again, so it is this bind's own Binding that landed:
    sent again by the client after an answer that was lost or a 5xx with Retry-After (client-go's
    with_retry.go, as `hami_kube.client`), or by an earlier bind whose outcome was unknown."""
    found = _ASSIGNED.search(err.message) if err.status == 409 else None
    return found is not None and found.group(1) == node


def _refused(err: BindRejected) -> bool:
    """The API server answered and did not commit the Binding: a 4xx (409 already bound elsewhere,
    being deleted or another UID; 404 gone; 400/403/422; 429, rejected before it was handled). No
    answer (status 0), 408 and every 5xx (a timeout may come after the write was committed) leave the
    outcome unknown."""
    return 400 <= err.status < 500 and err.status != 408


def _rejected(request: BindingArgs, err: BindRejected, gpu: bool) -> _Failed:
    server = f"{err.reason}: {err.message}" if err.reason else err.message
    if err.status == 409:
        return _Failed(
            "conflict",
            f"pod {request.who} was not bound to node {request.node}: it is already bound or its UID "
            f"changed (uid {request.uid}); API server: {server}",
            gpu,
        )
    if err.status == 404:
        return _Failed(
            "not_found", f"pod {request.who} was not bound to node {request.node}: {server}", False
        )
    where = f"API server answered {err.status}" if err.status else "no answer from the API server"
    return _Failed(
        "api_error", f"binding pod {request.who} to node {request.node} failed ({where}): {server}", gpu
    )


__all__ = [
    "NODE_LOCK_EXPIRY_S",
    "AllocatingPod",
    "Assumptions",
    "BindRejected",
    "Binder",
    "BindingArgs",
    "BindingWriter",
    "EventRecorder",
    "NodeLockSource",
    "PendingEntry",
    "PendingWindow",
    "binding_annotations",
    "gpu_counts",
    "read_binding_args",
]
