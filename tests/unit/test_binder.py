"""hami_control.binder: the pending window (table tests), the bind verb end to end (through the extender
service, as kube-scheduler calls it) against a real ClusterCache and PodStore with fake API edges
(annotations decoded back, assumption and rollback, waiting for the window and for a foreign node lock,
bad input, sweeping), and a property: concurrent binds onto one node never put a GPU over its memory,
cores or slots."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_api.annotations import (
    BIND_NODE_LOCK,
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    VGPU_TIME,
    decode_bind_phase,
    decode_pod_allocation,
    decode_unix_time,
    decode_vgpu_node,
)
from hami_api.containers import footprint_slices, init_kinds
from hami_api.resources import ContainerRequest
from hami_api.types import BindPhase, GPUInfo, GPUSlice, NodeLock, PodAllocation
from hami_control.binder import (
    Binder,
    BindRejected,
    PendingWindow,
    binding_annotations,
    gpu_counts,
    read_binding_args,
)
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.extender import ExtenderArgsError, read_pod_ask
from hami_control.pod_store import PodStore, pod_record
from hami_control.scheduling import Extender
from hami_control.usage import NodeGPUs, with_slices
from tests.builders import Json, container, gpu_info, gpu_usage, node, pod

T = TypeVar("T")
CONFIG = ControlConfig()
WALL = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DEADLINE = 5.0
"""Seconds any awaited condition may take before the test fails (never reached when all is well)."""


def peak(allocation: PodAllocation, inits: int) -> tuple[GPUSlice, ...]:
    """The footprint of a pod whose first `inits` containers are plain init containers."""
    return footprint_slices(allocation, init_kinds(inits, len(allocation)))


# --- builders --------------------------------------------------------------------------------------------


def gpu_container(
    name: str = "c", gpus: int | str | None = 1, mem: int | None = 4000, cores: int | None = None
) -> Json:
    """A container asking for `gpus` GPUs of `mem` MiB (and `cores`) each: one GPU of 4000 MiB unless told."""
    return container(name, gpus=gpus, gpumem=mem, gpucores=cores)


def pending_pod(name: str, *containers: Json) -> Json:
    """A Pending pod `default/<name>` with uid `uid-<name>`: `containers`, else one `gpu_container()`."""
    return pod(
        name, *(containers or (gpu_container(),)), namespace="default", uid=f"uid-{name}", phase="Pending"
    )


def args(pod: Mapping[str, Any], node: str = "n1") -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


@dataclass
class Call:
    namespace: str
    name: str
    uid: str
    node: str
    annotations: dict[str, str]


@dataclass
class Writer:
    """BindingWriter: records every call; `reject[name]` raises, `gate` holds calls until set."""

    calls: list[Call] = field(default_factory=list)
    reject: dict[str, BaseException] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    after: Callable[[Call], None] | None = None

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        call = Call(namespace, name, uid, node, dict(annotations))
        self.calls.append(call)
        if self.gate is not None:
            await self.gate.wait()
        if name in self.reject:
            raise self.reject[name]
        if self.after is not None:
            self.after(call)


@dataclass
class Events:
    seen: list[tuple[str, str, str, str]] = field(default_factory=list)

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        self.seen.append((f"{namespace}/{name}", type_, reason, message))


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    """A binder over a real ClusterCache with one node `n1` and the PodStore feeding it, the extender
    that calls it, and their fake edges."""

    cache: ClusterCache
    store: PodStore
    pods: dict[tuple[str, str], dict[str, Any]]
    writer: Writer
    events: Events
    locks: dict[str, NodeLock]
    clock: Clock
    binder: Binder
    ext: Extender

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A pod the watch shows (the store has it)."""
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.store.apply("ADDED", pod)
        return pod

    async def bind(self, body: object) -> dict[str, Any]:
        """`/bind` with this ExtenderBindingArgs body, as kube-scheduler sends it."""
        return await self.ext.bind(orjson.dumps(body))

    def deleted(self, namespace: str, name: str, uid: str) -> None:
        """The watch's DELETED event for the pod."""
        self.store.apply("DELETED", {"metadata": {"namespace": namespace, "name": name, "uid": uid}})


def world(
    gpus: Sequence[GPUInfo] = (gpu_info(0, count=4), gpu_info(1, count=4)),
    *,
    bind_wait_s: float = DEADLINE * 2,
    allocate_timeout_s: float = 30.0,
    wall: Callable[[], float] = lambda: WALL,
) -> World:
    cache = ClusterCache()
    cache.node_upserted(node("n1", gpus, resource_version="1"))
    store = PodStore(CONFIG, cache)
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    locks: dict[str, NodeLock] = {}
    writer, events, clock = Writer(), Events(), Clock()
    binder = Binder(
        cache,
        store,
        writer,
        events,
        node_lock=locks.get,
        allocate_timeout_s=allocate_timeout_s,
        bind_wait_s=bind_wait_s,
        clock=clock,
        wall_clock=wall,
    )
    return World(
        cache,
        store,
        pods,
        writer,
        events,
        locks,
        clock,
        binder,
        Extender(CONFIG, cache, store, binder=binder),
    )


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, DEADLINE * 4))


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until `condition` holds (fails after DEADLINE seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0)


# --- the pending window ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "node", "counts", "blocker"),
    [
        ({"a": ("n1", {1})}, "n1", {1}, "a"),
        ({"a": ("n1", {1, 2})}, "n1", {2}, "a"),
        ({"a": ("n1", {1})}, "n1", {2}, None),
        ({"a": ("n1", {1})}, "n2", {1}, None),
        ({"a": ("n1", {2}), "b": ("n1", {1, 4})}, "n1", {3, 4}, "b"),
        ({"a": ("n1", {1}), "b": ("n1", {1})}, "n1", {1}, "a"),
        ({}, "n1", {1}, None),
        ({"a": ("n1", {1})}, "n1", set(), None),
    ],
)
def test_window_blocks_only_the_same_gpu_count_on_the_same_node(
    pending: dict[str, tuple[str, set[int]]], node: str, counts: set[int], blocker: str | None
) -> None:
    window = PendingWindow()
    for uid, (at, c) in pending.items():
        window.enter(at, uid, c, 0.0)
    assert window.blocked(node, counts) == blocker


def test_window_release_enter_and_pending() -> None:
    window = PendingWindow()
    window.enter("n1", "a", {1}, 1.0, "ns/a")
    window.enter("n1", "b", {2}, 2.0)
    window.enter("n2", "c", {1}, 3.0)
    assert window.pending("n1") == ("a", "b") and window.pending("n2") == ("c",) and len(window) == 3
    entry = window.entry("a")
    assert entry is not None and (entry.node, entry.counts, entry.since, entry.who) == (
        "n1",
        {1},
        1.0,
        "ns/a",
    )
    released = window.release("a")
    assert released is not None and released.uid == "a"
    assert window.release("a") is None  # twice: no-op
    assert window.blocked("n1", {1}) is None and window.pending("n1") == ("b",)
    window.enter("n3", "b", {2}, 4.0)  # moving keeps one entry
    assert window.pending("n1") == () and window.pending("n3") == ("b",) and len(window) == 2
    assert window.release("ghost") is None


@pytest.mark.parametrize(
    ("now", "timeout", "expired", "left"),
    [
        (10.0, 5.0, ["a", "b"], ["c"]),
        (10.0, 8.0, ["a"], ["b", "c"]),
        (10.0, 9.0, [], ["a", "b", "c"]),  # exactly the timeout is not yet expired
        (100.0, 1.0, ["a", "b", "c"], []),
    ],
)
def test_window_expire(now: float, timeout: float, expired: list[str], left: list[str]) -> None:
    window = PendingWindow()
    window.enter("n1", "b", {1}, 3.0)
    window.enter("n2", "a", {1}, 1.0)
    window.enter("n1", "c", {2}, 8.0)
    assert window.expire(now, timeout) == expired
    assert sorted(e.uid for e in window) == left


# --- reading the arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (None, "ExtenderBindingArgs: expected a JSON object, got None"),
        ([], "ExtenderBindingArgs: expected a JSON object, got []"),
        ({"PodNamespace": "ns", "PodUID": "u", "Node": "n1"}, "ExtenderBindingArgs.PodName: missing"),
        ({"PodName": "p", "PodUID": "u", "Node": "n1"}, "ExtenderBindingArgs.PodNamespace: missing"),
        ({"PodName": "p", "PodNamespace": "ns", "Node": "n1"}, "ExtenderBindingArgs.PodUID: missing"),
        ({"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}, "ExtenderBindingArgs.Node: missing"),
        (
            {"PodName": 7, "PodNamespace": "ns", "PodUID": "u", "Node": "n1"},
            "PodName: expected a pod name, got 7",
        ),
        (
            {"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "n1"},
            "PodUID: expected a pod UID, got ''",
        ),
        (
            {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "Bad_Node"},
            "ExtenderBindingArgs.Node: expected a node name (a lowercase DNS subdomain), got 'Bad_Node'",
        ),
        (
            {"PodName": "p", "PodNamespace": " ns", "PodUID": "u", "Node": "n1"},
            "PodNamespace: expected a namespace",
        ),
    ],
)
def test_bad_arguments_come_back_in_error(body: object, expected: str) -> None:
    w = world()
    result = run(w.bind(body))
    assert set(result) == {"Error"} and expected in result["Error"]
    with pytest.raises(ExtenderArgsError, match="ExtenderBindingArgs"):
        read_binding_args(body)
    assert w.writer.calls == [] and w.events.seen == []
    assert w.binder.outcomes == {"bad_request": 1}


def test_unknown_pod_and_unreadable_pod() -> None:
    w = world()
    result = run(w.bind({"PodName": "ghost", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}))
    assert result == {"Error": "pod default/ghost not found"}
    bad = w.add(pending_pod("bad", gpu_container(gpus="x", mem=None)))
    result = run(w.bind(args(bad)))
    assert "pod default/bad" in result["Error"] and "'x'" in result["Error"]
    assert w.writer.calls == []
    assert w.binder.outcomes == {"not_found": 1, "bad_request": 1}
    assert [e[:3] for e in w.events.seen] == [("default/bad", "Warning", "BindingFailed")]


def test_a_failing_pod_read_is_an_error_not_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    w = world()

    async def broken(namespace: str, name: str) -> dict[str, Any] | None:
        raise OSError("informer not synced")

    w.ext.read_pod = broken  # the pod is not in the store: the extender reads it from the API
    with caplog.at_level(logging.CRITICAL, logger="hami_control.scheduling"):
        result = run(w.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}))
    assert result == {"Error": "reading pod default/p failed: OSError: informer not synced"}
    assert w.binder.outcomes == {"api_error": 1}


# --- binding ------------------------------------------------------------------------------------------------


def test_success_writes_one_binding_with_the_allocation_and_assumes_it() -> None:
    w = world()
    p = w.add(
        pending_pod("p", gpu_container("a", gpus=1, mem=4000, cores=30), gpu_container("b", gpus=2, mem=1000))
    )
    assert run(w.bind(args(p))) == {"Error": ""}

    assert len(w.writer.calls) == 1
    call = w.writer.calls[0]
    assert (call.namespace, call.name, call.uid, call.node) == ("default", "p", "uid-p", "n1")
    ann = call.annotations
    assert set(ann) == {
        DEVICES_TO_ALLOCATE,
        DEVICES_ALLOCATED,
        VGPU_NODE,
        VGPU_TIME,
        BIND_PHASE,
        BIND_TIME,
        BIND_NODE_LOCK,
    }
    assert ann[BIND_NODE_LOCK] == "none"  # no hami.io/mutex.lock taken: the node daemon reads no Node
    assert ann[DEVICES_TO_ALLOCATE] == ann[DEVICES_ALLOCATED]
    allocation = decode_pod_allocation(ann[DEVICES_TO_ALLOCATE])
    assert [len(c) for c in allocation] == [1, 2]
    assert [(s.usedmem, s.usedcores) for s in allocation.containers[0]] == [(4000, 30)]
    assert {s.usedmem for s in allocation.containers[1]} == {1000}
    assert decode_vgpu_node(ann[VGPU_NODE]) == "n1"
    assert decode_unix_time(ann[VGPU_TIME], VGPU_TIME) == decode_unix_time(ann[BIND_TIME]) == int(WALL)
    assert decode_bind_phase(ann[BIND_PHASE]) is BindPhase.ALLOCATING
    assert ann == binding_annotations(allocation, "n1", int(WALL))

    holding = w.cache.holding("uid-p")
    assert holding is not None and holding.assumed and holding.node == "n1"
    assert holding.slices == peak(allocation, 0)
    assert w.binder.window.pending("n1") == ("uid-p",) and w.binder.pending_count() == 1
    assert w.binder.outcomes == {"success": 1}
    ((who, type_, reason, message),) = w.events.seen
    assert (who, type_, reason) == ("default/p", "Normal", "BindingSucceed")
    assert message.startswith("Successfully assigned default/p GPUs GPU-") and message.endswith(" to n1")


def test_gpu_counts_of_all_gpu_containers() -> None:
    p = pending_pod(
        "p", gpu_container("a", gpus=1), gpu_container("b", gpus=None, mem=None), gpu_container("c", gpus=3)
    )
    ask = read_pod_ask(p, CONFIG)
    assert ask is not None and gpu_counts(ask) == {1, 3}


def test_pod_without_gpu_request_gets_a_plain_binding() -> None:
    w = world()
    p = w.add(pending_pod("plain", container("c", limits={"cpu": "1"})))
    assert run(w.bind(args(p, "any-node"))) == {"Error": ""}
    assert [(c.name, c.node, c.annotations) for c in w.writer.calls] == [("plain", "any-node", {})]
    assert w.binder.pending_count() == 0 and w.cache.holding("uid-plain") is None
    assert w.binder.outcomes == {"success_plain": 1} and w.events.seen == []


def test_no_longer_fits_assumes_nothing() -> None:
    w = world()
    p = w.add(pending_pod("big", gpu_container(mem=20000)))
    result = run(w.bind(args(p)))
    assert result == {"Error": "pod default/big no longer fits node n1: 2/2 CardInsufficientMemory"}
    assert w.writer.calls == [] and w.cache.holding("uid-big") is None and w.binder.pending_count() == 0
    assert gpu_usage(w.cache, "GPU-0") == (0, 0, 0)
    assert w.binder.outcomes == {"no_fit": 1}
    assert w.events.seen == [("default/big", "Warning", "BindingFailed", result["Error"])]


def test_unregistered_node() -> None:
    w = world()
    p = w.add(pending_pod("p"))
    result = run(w.bind(args(p, "n2")))
    assert result["Error"].startswith("cannot bind pod default/p to node n2: node unregistered")
    assert w.writer.calls == [] and w.binder.outcomes == {"unregistered": 1}


@pytest.mark.parametrize(
    ("error", "outcome", "expected", "event"),
    [
        (
            BindRejected(
                409,
                "Conflict",
                'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n2"',
            ),
            "conflict",
            "it is already bound or its UID changed (uid uid-p); API server: Conflict: Operation cannot be",
            True,
        ),
        (
            BindRejected(
                409, "Conflict", "Precondition failed: UID in precondition: uid-p, UID in object meta: x"
            ),
            "conflict",
            "it is already bound or its UID changed (uid uid-p); API server: Conflict: Precondition failed",
            True,
        ),
        (
            BindRejected(404, "NotFound", 'pods "p" not found'),
            "not_found",
            'NotFound: pods "p" not found',
            False,
        ),
        (
            BindRejected(422, "Invalid", "Binding.target.name: Required value"),
            "api_error",
            "(API server answered 422): Invalid: Binding.target.name: Required value",
            True,
        ),
        (
            BindRejected(429, "TooManyRequests", "too many requests"),
            "api_error",
            "(API server answered 429): TooManyRequests: too many requests",
            True,
        ),
    ],
)
def test_refused_binding_forgets_and_releases(
    error: Exception, outcome: str, expected: str, event: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A 4xx is a definite refusal (nothing was committed): the reservation is rolled back at once."""
    w = world()
    p = w.add(pending_pod("p"))
    w.writer.reject["p"] = error
    with caplog.at_level(logging.CRITICAL, logger="hami_control.binder"):
        result = run(w.bind(args(p)))
    assert expected in result["Error"] and "default/p" in result["Error"]
    assert len(w.writer.calls) == 1
    assert w.cache.holding("uid-p") is None and gpu_usage(w.cache, "GPU-0") == (0, 0, 0)
    assert gpu_usage(w.cache, "GPU-1") == (0, 0, 0)
    assert w.binder.pending_count() == 0
    assert w.binder.outcomes == {outcome: 1}
    assert [e[1:3] for e in w.events.seen] == ([("Warning", "BindingFailed")] if event else [])


UNKNOWN_OUTCOMES = [
    (BindRejected(0, "ConnectionReset", "peer closed"), "(no answer from the API server)"),
    (BindRejected(0, "Timeout", "no answer within 30 s"), "(no answer from the API server)"),
    (BindRejected(500, "InternalError", "etcd"), "(API server answered 500): InternalError: etcd"),
    (BindRejected(504, "Timeout", "request timed out"), "(API server answered 504): Timeout: request"),
    (RuntimeError("adapter bug"), "failed: RuntimeError: adapter bug"),
]


def assert_kept(w: World, uid: str = "uid-p") -> None:
    """The reservation of a bind whose outcome is unknown: assumed on n1, pending in n1's window."""
    held = w.cache.holding(uid)
    assert held is not None and held.assumed and held.node == "n1"
    assert w.binder.window.pending("n1") == (uid,)


@pytest.mark.parametrize(("error", "expected"), UNKNOWN_OUTCOMES)
def test_a_binding_whose_outcome_is_unknown_keeps_its_reservation_until_the_sweep(
    error: Exception, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No answer, a 5xx or an unexpected error: the Binding may have been committed
    (`protocol_model`, "committed, answer lost"), so its GPUs stay counted and its window entry held; a
    retry of the pod is refused (and sends nothing) until `sweep` expires the reservation (the API never
    showed the pod bound), after which it binds again."""
    w = world(allocate_timeout_s=30.0)
    p = w.add(pending_pod("p"))
    w.writer.reject["p"] = error
    with caplog.at_level(logging.CRITICAL, logger="hami_control.binder"):
        result = run(w.bind(args(p)))
        assert expected in result["Error"] and "default/p" in result["Error"]
        assert w.binder.outcomes == {"api_error": 1}
        assert [e[1:3] for e in w.events.seen] == [("Warning", "BindingFailed")]
        assert_kept(w)
        assert sorted([gpu_usage(w.cache, "GPU-0"), gpu_usage(w.cache, "GPU-1")]) == [(0, 0, 0), (1, 4000, 0)]
        retry = run(w.bind(args(p)))
        assert retry["Error"].startswith("pod default/p is already bound to node n1 and waiting")
        w.clock.now += 31
        assert w.binder.sweep() == ["uid-p"]
        assert w.cache.holding("uid-p") is None and w.binder.pending_count() == 0
        del w.writer.reject["p"]
        assert run(w.bind(args(p))) == {"Error": ""}
    assert len(w.writer.calls) == 2  # the refused retry sent nothing
    assert w.binder.outcomes == {"api_error": 1, "conflict": 1, "success": 1}


@pytest.mark.parametrize("where", ["n1", "n2", "deleted"])
def test_the_watch_settles_a_binding_whose_outcome_was_unknown(where: str) -> None:
    """The pod shows up bound on n1 (the Binding was committed: its allocation replaces the assumption,
    its window entry stays until the node daemon answers), bound to n2 (someone else bound it: both
    dropped) or deleted (both dropped)."""
    w = world()
    w.store.add_listener(w.binder.pod_event)  # as main wires them
    p = w.add(pending_pod("p"))
    w.writer.reject["p"] = BindRejected(0, "ConnectionReset", "peer closed")
    assert "no answer" in run(w.bind(args(p)))["Error"]
    assert_kept(w)
    if where == "deleted":
        w.deleted("default", "p", "uid-p")
        assert w.cache.holding("uid-p") is None and w.binder.pending_count() == 0
        return
    annotations = w.writer.calls[0].annotations if where == "n1" else {}
    meta = dict(p["metadata"], annotations=annotations)
    w.store.apply("MODIFIED", dict(p, metadata=meta, spec=dict(p["spec"], nodeName=where)))
    held = w.cache.holding("uid-p")
    if where == "n1":
        assert held is not None and not held.assumed and held.node == "n1"
        assert w.binder.window.pending("n1") == ("uid-p",)
    else:
        assert held is None and w.binder.pending_count() == 0


def test_a_conflict_naming_the_same_node_is_the_bindings_own_success() -> None:
    """kube-apiserver answers 409 "pod p is already assigned to node "n1"" to a Binding sent again after
    its first one landed (the answer lost): the pod is bound where we bound it."""
    w = world()
    p = w.add(pending_pod("p"))
    w.writer.reject["p"] = BindRejected(
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"',
    )
    assert run(w.bind(args(p))) == {"Error": ""}
    assert_kept(w)
    assert w.binder.outcomes == {"success": 1}
    assert [e[1:3] for e in w.events.seen] == [("Normal", "BindingSucceed")]


def test_a_cancelled_binding_keeps_its_reservation() -> None:
    """Cancelled while the Binding is in flight (kube-scheduler gave up on the HTTP call): whether it
    was committed is unknown, so the reservation stays for the watch or the sweep."""
    w = world()
    p = w.add(pending_pod("p"))

    async def scenario() -> None:
        w.writer.gate = asyncio.Event()
        task = asyncio.create_task(w.bind(args(p)))
        await until(lambda: len(w.writer.calls) == 1, "the binding call")
        assert_kept(w)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert_kept(w)
    w.clock.now += 31
    assert w.binder.sweep() == ["uid-p"]
    assert w.cache.holding("uid-p") is None and w.binder.pending_count() == 0


def test_a_second_bind_of_the_same_pod_is_refused() -> None:
    w = world()
    p = w.add(pending_pod("p"))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        w.writer.gate = asyncio.Event()
        first = asyncio.create_task(w.bind(args(p)))
        await until(lambda: len(w.writer.calls) == 1, "the binding call")
        in_flight = await w.bind(args(p))
        w.writer.gate.set()
        done = await first
        again = await w.bind(args(p))  # bound and still pending on n1
        return in_flight, done, again

    in_flight, done, again = run(scenario())
    assert in_flight == {"Error": "pod default/p (uid uid-p) is already being bound to node n1"}
    assert done == {"Error": ""}
    assert again["Error"].startswith("pod default/p is already bound to node n1 and waiting")
    assert len(w.writer.calls) == 1
    assert w.binder.outcomes == {"success": 1, "conflict": 2}


def test_event_recorder_failure_does_not_fail_the_bind(caplog: pytest.LogCaptureFixture) -> None:
    w = world()
    p = w.add(pending_pod("p"))

    def broken(*_: object) -> None:
        raise RuntimeError("events down")

    w.events.record = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.CRITICAL, logger="hami_control.binder"):
        assert run(w.bind(args(p))) == {"Error": ""}


# --- the pending window in the binder ----------------------------------------------------------------------


def test_same_gpu_count_waits_until_the_first_pod_is_allocated() -> None:
    w = world()
    p1, p2 = w.add(pending_pod("p1")), w.add(pending_pod("p2"))

    async def scenario() -> dict[str, Any]:
        assert await w.bind(args(p1)) == {"Error": ""}
        second = asyncio.create_task(w.bind(args(p2)))
        await until(lambda: w.binder.waiting_count() == 1, "the second bind to wait")
        w.binder.pod_changed("uid-p1", BindPhase.ALLOCATING.value)  # not an answer yet
        w.binder.pod_changed("uid-p2", BindPhase.SUCCESS.value)  # not pending: no-op
        w.binder.node_changed("n1")  # a spurious wake-up changes nothing
        await until(lambda: w.binder.waiting_count() == 1, "the second bind to wait again")
        assert not second.done() and len(w.writer.calls) == 1
        w.binder.pod_changed("uid-p1", BindPhase.SUCCESS.value)
        return await second

    assert run(scenario()) == {"Error": ""}
    assert [c.name for c in w.writer.calls] == ["p1", "p2"]
    assert w.binder.window.pending("n1") == ("uid-p2",)
    assert w.binder.waiting_count() == 0


@pytest.mark.parametrize("release", ["failed", "deleted"])
def test_failed_or_deleted_pod_releases_the_window(release: str) -> None:
    w = world()
    p1, p2 = w.add(pending_pod("p1")), w.add(pending_pod("p2"))

    async def scenario() -> dict[str, Any]:
        await w.bind(args(p1))
        second = asyncio.create_task(w.bind(args(p2)))
        await until(lambda: w.binder.waiting_count() == 1, "the second bind to wait")
        if release == "deleted":
            w.deleted("default", "p1", "uid-p1")
            w.binder.pod_changed("uid-p1", None, deleted=True)
        else:
            w.binder.pod_changed("uid-p1", "failed")
        return await second

    assert run(scenario()) == {"Error": ""}
    assert w.binder.window.pending("n1") == ("uid-p2",)


def test_same_gpu_count_times_out_with_a_clear_error() -> None:
    w = world(bind_wait_s=0.2)
    p1, p2 = (
        w.add(pending_pod("p1")),
        w.add(pending_pod("p2", gpu_container(gpus=1), gpu_container("d", gpus=2))),
    )

    async def scenario() -> dict[str, Any]:
        await w.bind(args(p1))
        return await w.bind(args(p2))

    result = run(scenario())
    assert result == {
        "Error": "node n1 busy: pod default/p1 with the same GPU count (1) is still being allocated "
        "(waited 0.2 s); kube-scheduler will retry"
    }
    assert w.cache.holding("uid-p2") is None and w.binder.window.pending("n1") == ("uid-p1",)
    assert w.binder.outcomes == {"success": 1, "wait_timeout": 1}
    assert w.events.seen[-1] == ("default/p2", "Warning", "BindingFailed", result["Error"])


def test_a_pod_that_can_never_fit_fails_without_waiting() -> None:
    w = world(bind_wait_s=DEADLINE * 10)  # waiting would time the test out
    p1, p2 = (
        w.add(pending_pod("p1", gpu_container(mem=15000))),
        w.add(pending_pod("p2", gpu_container(gpus=2, mem=15000))),
    )
    assert run(w.bind(args(p1))) == {"Error": ""}
    assert "no longer fits" in run(w.bind(args(p2)))["Error"]


def test_different_gpu_counts_bind_concurrently() -> None:
    w = world()
    one, two = (
        w.add(pending_pod("one", gpu_container(gpus=1))),
        w.add(pending_pod("two", gpu_container(gpus=2, mem=1000))),
    )
    same = w.add(pending_pod("same", gpu_container(gpus=1, mem=1000)))

    async def scenario() -> list[dict[str, Any]]:
        gate = w.writer.gate = asyncio.Event()
        tasks = [asyncio.create_task(w.bind(args(p))) for p in (one, two, same)]
        # `one` and `two` are both inside the API call at once; `same` waits for `one`.
        await until(lambda: len(w.writer.calls) == 2 and w.binder.waiting_count() == 1, "two binding calls")
        assert {c.name for c in w.writer.calls} == {"one", "two"}
        gate.set()
        await until(lambda: tasks[0].done() and tasks[1].done(), "the first two binds")
        assert not tasks[2].done()
        w.binder.pod_changed("uid-one", "success")
        return list(await asyncio.gather(*tasks))

    assert run(scenario()) == [{"Error": ""}] * 3
    assert w.binder.window.pending("n1") == ("uid-two", "uid-same")


def test_a_failed_binding_wakes_the_waiting_pod() -> None:
    w = world()
    p1, p2 = w.add(pending_pod("p1")), w.add(pending_pod("p2"))
    w.writer.reject["p1"] = BindRejected(409, "Conflict", "already assigned")

    async def scenario() -> list[dict[str, Any]]:
        gate = w.writer.gate = asyncio.Event()
        first = asyncio.create_task(w.bind(args(p1)))
        await until(lambda: len(w.writer.calls) == 1, "the first binding call")
        second = asyncio.create_task(w.bind(args(p2)))
        await until(lambda: w.binder.waiting_count() == 1, "the second bind to wait")
        gate.set()
        return list(await asyncio.gather(first, second))

    first, second = run(scenario())
    assert "already bound" in first["Error"] and second == {"Error": ""}
    assert w.binder.window.pending("n1") == ("uid-p2",)


# --- foreign node lock --------------------------------------------------------------------------------------


def lock_at(seconds_before: float, namespace: str = "kube-system", pod: str = "other") -> NodeLock:
    return NodeLock(datetime.fromtimestamp(WALL - seconds_before, UTC), namespace, pod)


def holder(w: World, phase: str = "Pending") -> None:
    """The pod `lock_at`'s lock names, as the watch shows it."""
    w.add(pod("other", gpu_container(), namespace="kube-system", uid="uid-other", phase=phase))


def test_a_foreign_lock_is_waited_for_until_the_node_changes() -> None:
    w = world()
    p = w.add(pending_pod("p"))
    holder(w)
    w.locks["n1"] = lock_at(10)

    async def scenario() -> dict[str, Any]:
        task = asyncio.create_task(w.bind(args(p)))
        await until(lambda: w.binder.waiting_count() == 1, "the bind to wait for the lock")
        w.binder.node_changed("n2")  # another node: still waiting
        await until(lambda: w.binder.waiting_count() == 1, "the bind to keep waiting")
        assert w.writer.calls == []
        del w.locks["n1"]
        w.binder.node_changed("n1")
        return await task

    assert run(scenario()) == {"Error": ""}
    assert "n1" not in w.locks  # we never write a lock


def test_a_held_lock_times_out_naming_the_holder() -> None:
    w = world(bind_wait_s=0.2)
    p = w.add(pending_pod("p"))
    holder(w)
    w.locks["n1"] = lock_at(10)
    result = run(w.bind(args(p)))
    assert result == {
        "Error": "node n1 busy: hami.io/mutex.lock held by pod kube-system/other since 2025-12-31T23:59:50Z, "
        "stale after 300 s (waited 0.2 s); kube-scheduler will retry"
    }
    assert w.binder.outcomes == {"lock_timeout": 1} and w.writer.calls == []
    legacy = world(bind_wait_s=0.05)
    legacy.locks["n1"] = NodeLock(datetime.fromtimestamp(WALL, UTC))
    p = legacy.add(pending_pod("p"))
    assert "held by another HAMi component since 2026-01-01T00:00:00Z" in run(legacy.bind(args(p)))["Error"]


@pytest.mark.parametrize(
    "lock",
    [
        lock_at(300),  # exactly expired
        lock_at(3600),
        lock_at(5, "default", "p"),  # taken for this very pod
    ],
)
def test_an_expired_or_own_lock_is_ignored(lock: NodeLock) -> None:
    w = world(bind_wait_s=DEADLINE * 10)
    w.locks["n1"] = lock
    p = w.add(pending_pod("p"))
    assert run(w.bind(args(p))) == {"Error": ""}


def test_a_lock_whose_pod_is_gone_or_over_is_dangling_and_ignored_as_hamis_lock_node_does() -> None:
    gone = world(bind_wait_s=DEADLINE * 10)
    gone.locks["n1"] = lock_at(10)  # kube-system/other: not in the pod watch
    assert run(gone.bind(args(gone.add(pending_pod("p"))))) == {"Error": ""}
    over = world(bind_wait_s=DEADLINE * 10)
    holder(over, phase="Failed")
    over.locks["n1"] = lock_at(10)
    assert run(over.bind(args(over.add(pending_pod("p"))))) == {"Error": ""}


def test_a_young_lock_whose_pod_the_watch_has_not_shown_yet_is_waited_for() -> None:
    w = world(bind_wait_s=0.05)
    w.locks["n1"] = lock_at(4)  # within DANGLING_LOCK_GRACE_S: its pod may still be on its way
    assert "held by pod kube-system/other" in run(w.bind(args(w.add(pending_pod("p")))))["Error"]
    assert w.writer.calls == []


def test_a_lock_that_expires_while_waiting_wakes_the_bind() -> None:
    start = time.monotonic()
    w = world(wall=lambda: WALL + (time.monotonic() - start))
    w.locks["n1"] = lock_at(300 - 0.05)  # expires 50 ms from now
    p = w.add(pending_pod("p"))
    assert run(w.bind(args(p))) == {"Error": ""}


def test_an_unreadable_lock_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    w = world()
    p = w.add(pending_pod("p"))

    def broken(node: str) -> NodeLock | None:
        raise ValueError("hami.io/mutex.lock: bad time")

    w.binder._node_lock = broken
    with caplog.at_level(logging.WARNING, logger="hami_control.binder"):
        assert run(w.bind(args(p))) == {"Error": ""}
    assert any("mutex.lock ignored" in r.getMessage() for r in caplog.records)


# --- sweeping -----------------------------------------------------------------------------------------------


def test_sweep_releases_old_entries_and_expires_unconfirmed_assumptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world(allocate_timeout_s=30.0)
    p1, p2, p3 = (
        w.add(pending_pod("p1")),
        w.add(pending_pod("p2", gpu_container(gpus=2))),
        w.add(pending_pod("p3")),
    )

    async def scenario() -> dict[str, Any]:
        await w.bind(args(p1))
        w.clock.now += 10
        await w.bind(args(p2))
        # The watch confirms p2: its slices stay counted once its window entry expires.
        call = w.writer.calls[1]
        confirmed = dict(p2, metadata=dict(p2["metadata"], annotations=call.annotations))
        w.store.apply("MODIFIED", confirmed)
        third = asyncio.create_task(w.bind(args(p3)))
        await until(lambda: w.binder.waiting_count() == 1, "p3 to wait for p1")
        w.clock.now += 20.5  # p1 is 30.5 s old, p2 20.5 s
        with caplog.at_level(logging.WARNING, logger="hami_control.binder"):
            assert w.binder.sweep() == ["uid-p1"]
        return await third

    assert run(scenario()) == {"Error": ""}
    messages = [r.getMessage() for r in caplog.records]
    assert any("default/p1 on node n1: no allocation answer" in m and "30 s" in m for m in messages)
    assert any("default/p1 on node n1: bind not confirmed" in m for m in messages)
    assert w.cache.holding("uid-p1") is None  # never confirmed: expired in the cache too
    held = w.cache.holding("uid-p2")
    assert held is not None and not held.assumed
    assert w.binder.window.pending("n1") == ("uid-p2", "uid-p3")
    w.clock.now += 31
    assert w.binder.sweep() == ["uid-p2", "uid-p3"]
    assert w.cache.holding("uid-p2") is not None and w.cache.holding("uid-p3") is None
    assert w.binder.sweep() == []


def test_run_sweeper_sweeps_until_cancelled() -> None:
    w = world(allocate_timeout_s=1.0)
    p = w.add(pending_pod("p"))

    async def scenario() -> None:
        await w.bind(args(p))
        w.clock.now += 2
        task = asyncio.create_task(w.binder.run_sweeper(0.001))
        await until(lambda: w.binder.pending_count() == 0, "the sweeper")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_bad_timeouts_are_refused() -> None:
    w = world()
    with pytest.raises(ValueError, match="bind_wait_s=0"):
        Binder(w.cache, w.store, w.writer, w.events, node_lock=w.locks.get, bind_wait_s=0)


# --- property: concurrent binds never overcommit a GPU -----------------------------------------------------

PROPERTY_GPUS = (gpu_info(0, count=3, devmem=8000), gpu_info(1, count=3, devmem=8000))


@st.composite
def pod_specs(draw: st.DrawFn) -> list[tuple[int, int, int, bool, bool]]:
    """Per pod: (GPUs, MiB per GPU, cores per GPU, the API server refuses it, deleted after phase 1)."""
    return draw(
        st.lists(
            st.tuples(
                st.integers(1, 2),
                st.integers(1000, 6000),
                st.sampled_from([0, 0, 10, 30, 60]),
                st.sampled_from([False, False, False, True]),
                st.booleans(),
            ),
            min_size=1,
            max_size=10,
        )
    )


def over_capacity(cache: ClusterCache) -> list[str]:
    gpus = cache.node_gpus("n1")
    assert gpus is not None
    return [
        f"{g.id}: {g.used}/{g.info.count} slots, {g.usedmem}/{g.info.devmem} MiB, "
        f"{g.usedcores}/{g.info.devcore} cores"
        for g in gpus.gpus
        if not (
            0 <= g.used <= g.info.count
            and 0 <= g.usedmem <= g.info.devmem
            and 0 <= g.usedcores <= g.info.devcore
        )
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod_specs(), pod_specs())
def test_concurrent_binds_never_overcommit_a_gpu(
    first: list[tuple[int, int, int, bool, bool]], second: list[tuple[int, int, int, bool, bool]]
) -> None:
    w = world(PROPERTY_GPUS)
    bound: dict[str, dict[str, Any]] = {}
    violations: list[str] = []  # collected, not asserted: the binder would take an assertion for an API error

    def daemon(call: Call) -> None:
        """The API server copies the annotations, the watch sees them, the node daemon allocates soon."""
        violations.extend(over_capacity(w.cache))
        pod = w.pods[(call.namespace, call.name)]
        confirmed = dict(pod, metadata=dict(pod["metadata"], annotations=call.annotations))
        confirmed["spec"] = dict(pod["spec"], nodeName=call.node)
        bound[call.uid] = confirmed
        loop = asyncio.get_running_loop()
        loop.call_soon(w.store.apply, "MODIFIED", confirmed)
        loop.call_soon(w.binder.pod_changed, call.uid, "success")

    w.writer.after = daemon

    async def phase(specs: list[tuple[int, int, int, bool, bool]], tag: str) -> list[dict[str, Any]]:
        pods = []
        for i, (nums, mem, cores, refused, _) in enumerate(specs):
            pods.append(w.add(pending_pod(f"{tag}{i}", gpu_container(gpus=nums, mem=mem, cores=cores))))
            if refused:
                w.writer.reject[f"{tag}{i}"] = BindRejected(409, "Conflict", "already assigned")
        results = await asyncio.gather(*(w.bind(args(p)) for p in pods))
        violations.extend(over_capacity(w.cache))
        return list(results)

    async def scenario() -> None:
        results = await phase(first, "a")
        for i, (spec, result) in enumerate(zip(first, results, strict=True)):
            if spec[3]:  # refused by the API server, unless it did not fit in the first place
                assert "already bound" in result["Error"] or "no longer fits" in result["Error"]
            if spec[4] and result == {"Error": ""}:
                w.deleted("default", f"a{i}", f"uid-a{i}")
                w.binder.pod_changed(f"uid-a{i}", None, deleted=True)
                del bound[f"uid-a{i}"]
        violations.extend(over_capacity(w.cache))
        await phase(second, "b")
        await until(lambda: w.binder.pending_count() == 0, "every pod allocated")

    run(scenario())
    assert violations == []
    # What the cache counts is exactly what the pods that were bound (and not deleted) hold.
    base = NodeGPUs.of("n1", PROPERTY_GPUS)
    expected = base
    for bound_pod in bound.values():
        allocation = decode_pod_allocation(
            bound_pod["metadata"]["annotations"][DEVICES_ALLOCATED], DEVICES_ALLOCATED
        )
        expected = with_slices(expected, peak(allocation, 0))
    assert w.cache.node_gpus("n1") == expected


@dataclass(frozen=True)
class Watched:
    """A watched pod as `Binder.adopt_allocating` reads it (the fields of kube.PodRecord it uses)."""

    uid: str
    node_name: str
    phase: str = "allocating"
    terminal: bool = False
    requests: tuple[ContainerRequest | None, ...] = (
        ContainerRequest(nums=2, memreq=1000, mem_percentage=None, coresreq=0),
    )
    namespace: str = "default"
    mixed: bool = False
    running: bool = False

    @property
    def name(self) -> str:
        return f"pod-{self.uid}"

    @property
    def annotations(self) -> dict[str, str]:
        return {"hami.io/bind-phase": self.phase} if self.phase else {}


def test_a_new_leader_adopts_only_the_pods_still_allocating_on_a_node() -> None:
    w = world()
    pods = [
        Watched("a", "n1"),
        Watched("b", "n1", phase="success"),
        Watched("c", "n1", terminal=True),
        Watched("d", ""),
        Watched("e", "n1", phase=""),
        Watched(
            "f", "n1", requests=(None, ContainerRequest(nums=1, memreq=0, mem_percentage=50, coresreq=0))
        ),
    ]
    assert w.binder.adopt_allocating(pods) == 2
    assert w.binder.window.pending("n1") == ("a", "f")
    assert {e.uid: e.counts for e in w.binder.window} == {"a": frozenset({2}), "f": frozenset({1})}


def test_a_pod_the_watch_shows_newly_allocating_enters_its_node_window() -> None:
    """protocol_model's "restart control" trace without leader election: the restarted replica's first
    list shows a pod its previous run bound, still allocating; without a window entry a pod with the
    same GPU count was bound next to it and the node daemon handed the first pod's GPUs to the second."""
    w = world()
    w.binder.pod_event(None, Watched("a", "n1"))
    assert w.binder.window.pending("n1") == ("a",)
    assert {e.uid: e.counts for e in w.binder.window} == {"a": frozenset({2})}
    # Swept after its timeout: a later event of the same allocating pod does not bring it back.
    w.binder.window.release("a")
    w.binder.pod_event(Watched("a", "n1"), Watched("a", "n1"))
    # Neither do pods that are answered, ended or unbound.
    for other in (Watched("b", "n1", phase="success"), Watched("c", "n1", terminal=True), Watched("d", "")):
        w.binder.pod_event(None, other)
    assert len(w.binder.window) == 0


def test_a_pod_asking_nvidia_and_another_vendor_keeps_its_window_until_it_runs() -> None:
    """The other vendor's plugin writes success once its own devices are allocated (HAMi's
    PodAllocationTrySuccess reads its own annotation only), while hami-node may still have the GPUs to
    allocate: a pod with the same GPU count bound next to it would make hami-node's Allocate ambiguous."""
    w = world()
    w.binder.pod_event(None, Watched("a", "n1", mixed=True))
    w.binder.pod_event(Watched("a", "n1", mixed=True), Watched("a", "n1", phase="success", mixed=True))
    assert w.binder.window.pending("n1") == ("a",)
    running = Watched("a", "n1", phase="success", mixed=True, running=True)
    w.binder.pod_event(Watched("a", "n1", phase="success", mixed=True), running)
    assert len(w.binder.window) == 0


@pytest.mark.parametrize(
    ("pod", "deleted", "released"),
    [
        ({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, False, True),
        ({"metadata": {"annotations": {"hami.io/bind-phase": "failed"}}}, False, True),
        ({"metadata": {"annotations": {"hami.io/bind-phase": "allocating"}}}, False, False),
        ({"metadata": {}, "status": {"phase": "Failed"}}, False, True),  # kubelet rejected it
        ({"metadata": {}, "status": {"phase": "Running"}}, False, False),
        ({"metadata": {}}, True, True),
    ],
)
def test_pod_events_release_the_window_on_an_answer_a_rejection_or_a_deletion(
    pod: dict[str, Any], deleted: bool, released: bool
) -> None:
    w = world()
    w.binder.adopt("n1", "u", frozenset({1}), "default/p")
    record = pod_record({**pod, "metadata": {**pod["metadata"], "uid": "u"}}, CONFIG)
    if deleted:
        w.binder.pod_event(record, None)
    else:
        w.binder.pod_event(None, record)
    assert (w.binder.window.pending("n1") == ()) is released
