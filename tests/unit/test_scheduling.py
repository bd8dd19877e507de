"""hami_control.scheduling.Extender: the service around the pure filter/prioritize and the binder,
without HTTP: requests that cannot be read, the GPU table kept up with the cache, the pod's cycle (its ask
read once at filter and reused by prioritize and bind, its GPU choices reused while the node and the
resourceVersion hold), the pod found for its bind in its cycle, the store or (once) the API, the
FilteringFailed event, the pod's own quota usage left out of its namespace's, binds on a replica without
a binder, and the node lock annotation."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from hami_api.annotations import (
    DEVICES_ALLOCATED,
    VGPU_NODE,
    decode_pod_allocation,
    encode_node_lock,
    encode_pod_allocation,
)
from hami_api.types import ContainerAllocation, GPUSlice, NodeLock, PodAllocation
from hami_control import scheduling
from hami_control.binder import Binder, BindRejected
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, FailedNodes
from hami_control.cycle import CycleStates
from hami_control.extender import PodAsk
from hami_control.fit import Fit
from hami_control.pod_store import PodStore
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.scheduling import Extender
from hami_control.usage import NodeGPUs
from tests.builders import FixedQuota, Json, container, gpu_info, node, pod

CONFIG = ControlConfig()


def registered_node(name: str, gpus: int = 1, devmem: int = 16000) -> Json:
    """Node `name` with `gpus` GPUs `<name>-g<i>` of 4 slots and `devmem` MiB each."""
    infos = [gpu_info(i, id=f"{name}-g{i}", count=4, devmem=devmem, type="NVIDIA-T4") for i in range(gpus)]
    return node(name, infos)


def cuda_container(name: str = "c", mem: int = 4000) -> Json:
    """A `cuda` container (with an env var) asking for one GPU of `mem` MiB."""
    return container(name, gpus=1, gpumem=mem, image="cuda", env={"X": "1"})


def ns_pod(name: str = "p", uid: str = "u-1", mem: int = 4000) -> Json:
    """The pod `ns/<name>` asking for one GPU of `mem` MiB."""
    return pod(name, cuda_container(mem=mem), namespace="ns", uid=uid)


def body(p: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"Pod": p, "NodeNames": names})


@dataclass
class Events:
    recorded: list[tuple[str, ...]] = field(default_factory=list)

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        self.recorded.append((namespace, name, uid, type_, reason, message))


def extender(*nodes: dict[str, Any], **options: Any) -> Extender:
    cache = ClusterCache()
    for n in nodes:
        cache.node_upserted(n)
    return Extender(CONFIG, cache, PodStore(CONFIG, cache), **options)


def test_bodies_that_are_not_json_get_an_error_answer_not_an_exception() -> None:
    ext = extender(registered_node("a"))
    result = ext.filter(b"{nope")
    assert result["Error"].startswith("ExtenderArgs: body is not JSON")
    assert result["NodeNames"] is None and result["FailedNodes"] == {}
    assert ext.prioritize(b"[") == []
    answer = asyncio.run(ext.bind(b"{"))
    assert answer["Error"].startswith("ExtenderBindingArgs: body is not JSON")


def test_a_replica_without_a_binder_says_it_does_not_bind() -> None:
    ext = extender(registered_node("a"))
    assert asyncio.run(ext.bind(orjson.dumps({"PodName": "p"}))) == {"Error": "this replica does not bind"}


def test_each_request_sees_the_nodes_the_cache_changed_since_the_last_one() -> None:
    ext = extender(registered_node("a"))
    assert ext.filter(body(ns_pod(), ["a", "b"]))["NodeNames"] == ["a"]
    ext.cache.node_upserted(registered_node("b"))
    assert ext.filter(body(ns_pod(), ["a", "b"]))["NodeNames"] == ["a", "b"]
    ext.cache.node_deleted("a")
    assert ext.filter(body(ns_pod(), ["a", "b"]))["NodeNames"] == ["b"]


def test_the_filtered_pods_ask_is_kept_for_its_bind() -> None:
    ext = extender(registered_node("a"))
    ext.filter(body(ns_pod(uid="u-7"), ["a"]))
    cycle = ext.cycles.get("u-7")
    assert cycle is not None and cycle.ask is not None and cycle.ask.requests[0][0] is not None
    assert cycle.ask.requests[0][0].memreq == 4000
    ask = asyncio.run(ext.pod_ask("ns", "p", "u-7"))  # no API read: there is no reader
    assert ask is not None and ask.name == "p"


def test_a_pod_not_remembered_is_read_once_and_its_uid_must_match() -> None:
    reads: list[tuple[str, str]] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append((namespace, name))
        return ns_pod(name, uid="u-new") if name == "p" else None

    ext = extender(registered_node("a"), read_pod=read)
    assert asyncio.run(ext.pod_ask("ns", "p", "u-new")) is not None
    with pytest.raises(LookupError, match=r"pod ns/p not found with UID u-old \(it has u-new\)"):
        asyncio.run(ext.pod_ask("ns", "p", "u-old"))
    with pytest.raises(LookupError, match="pod ns/gone not found"):
        asyncio.run(ext.pod_ask("ns", "gone", "u-x"))
    assert reads == [("ns", "p"), ("ns", "p"), ("ns", "gone")]
    with pytest.raises(LookupError, match="pod ns/p not found"):
        asyncio.run(extender(registered_node("a")).pod_ask("ns", "p", "u-1"))  # no reader at all


def test_no_fitting_node_records_filtering_failed_with_the_first_five_reasons() -> None:
    nodes = [registered_node(f"n{i}", devmem=2000) for i in range(7)]
    events = Events()
    ext = extender(*nodes, events=events)
    result = ext.filter(body(ns_pod(), [f"n{i}" for i in range(7)]))
    assert result["NodeNames"] == []
    ((namespace, name, uid, type_, reason, message),) = events.recorded
    assert (namespace, name, uid, type_, reason) == ("ns", "p", "u-1", "Warning", "FilteringFailed")
    assert message.startswith("no GPU node fits: n0: 1/1 CardInsufficientMemory; n1: ")
    assert message.endswith(" (and 2 more)") and message.count("CardInsufficientMemory") == 5
    assert ext.filter(body(ns_pod(), []))["NodeNames"] == [] and len(events.recorded) == 1  # no candidates


def test_the_filtered_pod_does_not_count_against_its_own_quota() -> None:
    # The webhook assumed the pod and the watch shows it Pending: 4000 of the 8000 used are its own.
    full = extender(registered_node("a"), quota=FixedQuota(QuotaLimits(memory=8000), QuotaUsage(memory=8000)))
    assert full.filter(body(ns_pod(mem=4000), ["a"]))["NodeNames"] == ["a"]
    # One MiB more used by others and it no longer fits.
    over = extender(registered_node("a"), quota=FixedQuota(QuotaLimits(memory=8000), QuotaUsage(memory=8001)))
    assert over.filter(body(ns_pod(mem=4000), ["a"]))["FailedNodes"] == {"a": "1/1 ResourceQuotaNotFit"}


def test_node_locks_come_from_the_annotation_and_a_bad_one_is_ignored() -> None:
    held = NodeLock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC), "ns", "p")
    lock = Extender.node_lock_from({"a": encode_node_lock(held), "b": "not a time", "c": ""})
    assert lock("a") == held
    assert lock("b") is None and lock("c") is None and lock("d") is None


# --- requests that cannot be read ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "ExtenderArgs: expected a JSON object, got a list"),
        ({"NodeNames": ["a"]}, "ExtenderArgs.Pod: missing"),
        ({"Pod": ns_pod()}, "ExtenderArgs: neither Nodes nor NodeNames is given"),
        ({"Pod": "p", "NodeNames": ["a"]}, "ExtenderArgs.Pod: expected a Pod object, got a string"),
        ({"Pod": ns_pod(mem=-1), "NodeNames": ["a"]}, "pod ns/p: "),
    ],
)
def test_filter_and_prioritize_answer_unreadable_requests_without_raising(
    args: object, expected: str
) -> None:
    ext = extender(registered_node("a"))
    result = ext.filter(orjson.dumps(args))
    assert result["Error"].startswith(expected) and result["NodeNames"] is None
    scores = ext.prioritize(orjson.dumps(args))
    assert scores in ([], [{"Host": "a", "Score": 0}])  # kube-scheduler ignores a failed prioritize


def test_bind_arguments_that_cannot_be_read_are_a_bad_request() -> None:
    ext, binder, writer = bound_extender()
    answer = asyncio.run(ext.bind(orjson.dumps({"PodName": "p", "PodNamespace": "ns", "Node": "a"})))
    assert answer == {"Error": "ExtenderBindingArgs.PodUID: missing"}
    assert binder.outcomes == {"bad_request": 1} and writer.calls == []


# --- the pod's cycle: its ask and GPU choices, from filter to bind ----------------------------------------


@dataclass
class Writer:
    """BindingWriter: records (name, node, annotations); `reject` raises once for that pod name."""

    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    reject: dict[str, BindRejected] = field(default_factory=dict)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.calls.append((name, node, dict(annotations)))
        if name in self.reject:
            raise self.reject.pop(name)


def bound_extender(*nodes: dict[str, Any], **options: Any) -> tuple[Extender, Binder, Writer]:
    """An extender with a binder over nodes (default: `a` with two GPUs)."""
    ext = extender(*(nodes or (registered_node("a", gpus=2),)), **options)
    writer = Writer()
    ext.binder = Binder(ext.cache, ext.pods, writer, Events(), node_lock=lambda _node: None)
    return ext, ext.binder, writer


def two_containers(
    uid: str = "u-2", version: str = "1", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod with two GPU containers: fitted node by node (the GPU table covers one), so its cycle keeps
    a choice per node."""
    return pod(
        "p",
        cuda_container("c", 4000),
        cuda_container("d", 2000),
        namespace="ns",
        uid=uid,
        resource_version=version,
        annotations=dict(annotations or {}),
    )


def bind_args(p: dict[str, Any], target: str = "a") -> bytes:
    meta = p["metadata"]
    return orjson.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": target}
    )


def allocation_of(writer: Writer) -> PodAllocation:
    ((_, _, annotations),) = writer.calls
    return decode_pod_allocation(annotations[DEVICES_ALLOCATED], DEVICES_ALLOCATED)


class FitCounter:
    """Counts `PodAsk.fit` calls (the GPU choices actually computed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = PodAsk.fit

        def counted(ask: PodAsk, gpus: NodeGPUs | None, vendor: NodeGPUs | None = None) -> Any:
            self.calls += 1
            return real(ask, gpus, vendor)

        monkeypatch.setattr(PodAsk, "fit", counted)


def test_filter_then_prioritize_then_bind_fit_once_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    ext, binder, writer = bound_extender(registered_node("a", gpus=2), registered_node("b", gpus=2))
    fits = FitCounter(monkeypatch)
    p = two_containers()
    assert ext.filter(body(p, ["a", "b"]))["NodeNames"] == ["a", "b"]
    assert fits.calls == 2
    scores = ext.prioritize(body(p, ["a", "b"]))
    assert [s["Host"] for s in scores] == ["a", "b"] and fits.calls == 2  # filter's choices reused
    cycle = ext.cycles.get("u-2")
    assert cycle is not None and set(cycle.choices) == {"a", "b"}
    chosen = cycle.choices["a"].fit.allocation
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert fits.calls == 2 and binder.reused == 1  # nor fitted again at bind: the node did not change
    assert allocation_of(writer) == chosen


def test_the_reused_choice_is_what_a_fresh_fit_gives() -> None:
    ext, binder, writer = bound_extender()
    p = two_containers()
    ext.filter(body(p, ["a"]))
    gpus = ext.cache.node_gpus("a")
    ask = asyncio.run(ext.pod_ask("ns", "p", "u-2"))
    assert gpus is not None and ask is not None
    fresh = ask.fit(gpus)
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert binder.reused == 1 and isinstance(fresh, Fit) and allocation_of(writer) == fresh.allocation


def test_a_node_that_changed_after_filter_is_fitted_again_at_bind() -> None:
    ext, binder, writer = bound_extender()
    p = two_containers()
    ext.filter(body(p, ["a"]))
    cycle = ext.cycles.get("u-2")
    assert cycle is not None
    assert {s.uuid for c in cycle.choices["a"].fit.allocation for s in c} == {"a-g0", "a-g1"}  # spread
    # Another pod takes every slot of a-g0: the node's generation moves on.
    other = ns_pod("other", uid="u-other")
    slots = PodAllocation(tuple(ContainerAllocation((GPUSlice("a-g0", 1, 0),)) for _ in range(4)))
    other["metadata"]["annotations"] = {VGPU_NODE: "a", DEVICES_ALLOCATED: encode_pod_allocation(slots)}
    other["spec"]["containers"] = [other["spec"]["containers"][0]] * 4
    ext.pods.apply("ADDED", other)
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert binder.reused == 0
    assert {s.uuid for c in allocation_of(writer) for s in c} == {"a-g1"}


def test_a_new_resource_version_with_another_ask_drops_the_choices() -> None:
    ext, binder, writer = bound_extender()
    p = two_containers(version="1")
    ext.filter(body(p, ["a"]))
    # The watch shows the pod at resourceVersion 2, now asking for GPU a-g1 only.
    pinned = two_containers(version="2", annotations={"nvidia.com/use-gpuuuid": "a-g1"})
    ext.pods.apply("MODIFIED", pinned)
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert binder.reused == 0
    assert {s.uuid for c in allocation_of(writer) for s in c} == {"a-g1"}


def test_a_new_resource_version_with_the_same_ask_keeps_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    ext, binder, _ = bound_extender()
    fits = FitCounter(monkeypatch)
    ext.filter(body(two_containers(version="1"), ["a"]))
    ext.prioritize(body(two_containers(version="2"), ["a"]))  # a status update: the same ask
    ext.pods.apply("MODIFIED", two_containers(version="3"))
    assert asyncio.run(ext.bind(bind_args(two_containers()))) == {"Error": ""}
    assert fits.calls == 1 and binder.reused == 1


def test_the_ask_is_read_again_only_for_a_new_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = extender(registered_node("a"))
    reads: list[str] = []
    real = scheduling.read_pod_ask

    def counted(pod: object, config: ControlConfig, quota: Any = None, *, mix: Any = None) -> Any:
        reads.append(pod["metadata"]["resourceVersion"])  # type: ignore[index]
        return real(pod, config, quota, mix=mix)

    monkeypatch.setattr(scheduling, "read_pod_ask", counted)
    p = ns_pod(uid="u-9")
    p["metadata"]["resourceVersion"] = "7"
    ext.filter(body(p, ["a"]))
    ext.prioritize(body(p, ["a"]))
    p["metadata"]["resourceVersion"] = "8"
    ext.prioritize(body(p, ["a"]))
    assert reads == ["7", "8"]


def test_bind_finds_a_watched_pod_in_the_store_without_an_api_read() -> None:
    reads: list[str] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return None

    ext, binder, writer = bound_extender(read_pod=read)
    p = ns_pod(uid="u-w")
    ext.pods.apply("ADDED", p)
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert reads == [] and len(writer.calls) == 1 and binder.outcomes == {"success": 1}


def test_bind_of_an_unseen_pod_reads_it_from_the_api_once() -> None:
    reads: list[str] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return ns_pod(name, uid="u-new")

    ext, _, writer = bound_extender(read_pod=read)
    p = ns_pod(uid="u-new")
    # the first Binding is refused (a 429 is never handled: rolled back, so the retry binds at once)
    writer.reject["p"] = BindRejected(429, "TooManyRequests", "too many requests, etcd")
    assert "etcd" in asyncio.run(ext.bind(bind_args(p)))["Error"]
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}  # kube-scheduler's retry
    assert reads == ["p"] and len(writer.calls) == 2


def test_a_changed_quota_usage_between_filter_and_bind_fits_again() -> None:
    usage = FixedQuota(QuotaLimits(memory=100_000), QuotaUsage(memory=6000))
    ext, binder, writer = bound_extender(quota=usage)
    p = two_containers()
    ext.filter(body(p, ["a"]))
    usage.usage = QuotaUsage(memory=7000)  # another pod of the namespace was admitted meanwhile
    assert asyncio.run(ext.bind(bind_args(p))) == {"Error": ""}
    assert binder.reused == 0 and len(writer.calls) == 1


def test_cycles_are_bounded_and_keep_only_the_best_scored_choices() -> None:
    nodes = [registered_node(f"n{i}", gpus=2) for i in range(5)]
    ext = extender(*nodes, cycles=CycleStates(max_pods=2, max_choices=2))
    names = [f"n{i}" for i in range(5)]
    for uid in ("u-a", "u-b", "u-c"):
        ext.filter(body(two_containers(uid=uid), names))
    assert len(ext.cycles) == 2 and ext.cycles.get("u-a") is None
    cycle = ext.cycles.get("u-c")
    assert cycle is not None and len(cycle.choices) == 5  # the latest keeps every choice until scored
    ext.prioritize(body(two_containers(uid="u-c"), names))
    assert len(cycle.choices) == 2
    older = ext.cycles.get("u-b")
    assert older is not None and older.choices == {}  # never scored, and no longer the latest


@pytest.mark.parametrize("named", [FailedNodes.WHEN_NONE_FIT, FailedNodes.ALWAYS])
def test_failed_nodes_are_named_always_or_only_when_no_node_fits_and_both_writers_agree(
    named: FailedNodes,
) -> None:
    config = replace(CONFIG, scheduling=replace(CONFIG.scheduling, failed_nodes=named))
    small = [registered_node(f"s{i:02}", devmem=2000) for i in range(30)]
    big = [registered_node(f"b{i:02}", gpus=2) for i in range(10)]
    cache = ClusterCache()
    for n in small + big:
        cache.node_upserted(n)
    ext = Extender(config, cache, PodStore(config, cache))
    names = [n["metadata"]["name"] for n in small + big]
    fits = ext.filter(body(ns_pod(), names))
    assert fits == orjson.loads(ext.filter_json(body(ns_pod(), names)))
    assert fits["NodeNames"] == [f"b{i:02}" for i in range(10)]
    if named is FailedNodes.ALWAYS:
        assert fits["FailedNodes"] == {f"s{i:02}": "1/1 CardInsufficientMemory" for i in range(30)}
    else:
        assert fits["FailedNodes"] == {} and fits["FailedAndUnresolvableNodes"] == {}
    # A pod that fits nowhere gets every node's reason in both settings.
    huge = ns_pod("huge", "u-huge", mem=20000)
    none = ext.filter(body(huge, names))
    assert none == orjson.loads(ext.filter_json(body(huge, names)))
    assert none["NodeNames"] == [] and len(none["FailedNodes"]) == 40
    assert none["FailedNodes"]["s00"] == "1/1 CardInsufficientMemory"
    assert none["FailedNodes"]["b00"] == "2/2 CardInsufficientMemory"
