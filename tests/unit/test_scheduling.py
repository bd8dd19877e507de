"""hami_control.scheduling.Extender: the service around the pure filter/prioritize, without HTTP: bodies
that are not JSON, the GPU table kept up with the cache, the filtered pod remembered (slimmed) for its
bind, the FilteringFailed event, the pod's own quota usage left out of its namespace's, binds on a
replica without a binder, and the node lock annotation."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from hami_api.annotations import NODE_REGISTER, encode_node_lock, encode_node_register
from hami_api.types import GPUInfo, NodeLock
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.scheduling import Extender

CONFIG = ControlConfig()


def node(name: str, gpus: int = 1, devmem: int = 16000) -> dict[str, Any]:
    infos = [
        GPUInfo(f"{name}-g{i}", i, 4, devmem, 100, "NVIDIA-T4", 0, "hami-core", True) for i in range(gpus)
    ]
    return {
        "metadata": {"name": name, "annotations": {NODE_REGISTER: encode_node_register(infos)}},
        "status": {"allocatable": {"nvidia.com/gpu": str(4 * gpus)}},
    }


def pod(name: str = "p", uid: str = "u-1", mem: int = 4000) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "managedFields": [{"manager": "kubectl"}]},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "cuda",
                    "env": [{"name": "X", "value": "1"}],
                    "resources": {"limits": limits},
                }
            ]
        },
    }


def body(p: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"Pod": p, "NodeNames": names})


@dataclass
class Events:
    recorded: list[tuple[str, ...]] = field(default_factory=list)

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        self.recorded.append((namespace, name, uid, type_, reason, message))


@dataclass
class Quota:
    limit: QuotaLimits
    usage: QuotaUsage

    def limits(self, namespace: str) -> QuotaLimits:
        return self.limit

    def used(self, namespace: str) -> QuotaUsage:
        return self.usage


def extender(*nodes: dict[str, Any], **options: Any) -> Extender:
    cache = ClusterCache()
    for n in nodes:
        cache.node_upserted(n)
    return Extender(CONFIG, cache, **options)


def test_bodies_that_are_not_json_get_an_error_answer_not_an_exception() -> None:
    ext = extender(node("a"))
    result = ext.filter(b"{nope")
    assert result["Error"].startswith("ExtenderArgs: body is not JSON")
    assert result["NodeNames"] is None and result["FailedNodes"] == {}
    assert ext.prioritize(b"[") == []
    answer = asyncio.run(ext.bind(b"{"))
    assert answer["Error"].startswith("ExtenderBindingArgs: body is not JSON")


def test_a_replica_without_a_binder_says_it_does_not_bind() -> None:
    ext = extender(node("a"))
    assert asyncio.run(ext.bind(orjson.dumps({"PodName": "p"}))) == {"Error": "this replica does not bind"}


def test_each_request_sees_the_nodes_the_cache_changed_since_the_last_one() -> None:
    ext = extender(node("a"))
    assert ext.filter(body(pod(), ["a", "b"]))["NodeNames"] == ["a"]
    ext.cache.node_upserted(node("b"))
    assert ext.filter(body(pod(), ["a", "b"]))["NodeNames"] == ["a", "b"]
    ext.cache.node_deleted("a")
    assert ext.filter(body(pod(), ["a", "b"]))["NodeNames"] == ["b"]


def test_the_filtered_pod_is_remembered_slim_for_its_bind() -> None:
    ext = extender(node("a"))
    ext.filter(body(pod(uid="u-7"), ["a"]))
    remembered = ext._pods["u-7"]
    assert "managedFields" not in remembered["metadata"]
    assert remembered["spec"]["containers"] == [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}
    ]
    ask = asyncio.run(ext.pod_ask("ns", "p", "u-7"))  # no API read: there is no reader
    assert ask is not None and ask.name == "p"


def test_a_pod_not_remembered_is_read_once_and_its_uid_must_match() -> None:
    reads: list[tuple[str, str]] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append((namespace, name))
        return pod(name, uid="u-new") if name == "p" else None

    ext = extender(node("a"), read_pod=read)
    assert asyncio.run(ext.pod_ask("ns", "p", "u-new")) is not None
    with pytest.raises(LookupError, match=r"pod ns/p not found with UID u-old \(it has u-new\)"):
        asyncio.run(ext.pod_ask("ns", "p", "u-old"))
    with pytest.raises(LookupError, match="pod ns/gone not found"):
        asyncio.run(ext.pod_ask("ns", "gone", "u-x"))
    assert reads == [("ns", "p"), ("ns", "p"), ("ns", "gone")]
    with pytest.raises(LookupError, match="pod ns/p not found"):
        asyncio.run(extender(node("a")).pod_ask("ns", "p", "u-1"))  # no reader at all


def test_no_fitting_node_records_filtering_failed_with_the_first_five_reasons() -> None:
    nodes = [node(f"n{i}", devmem=2000) for i in range(7)]
    events = Events()
    ext = extender(*nodes, events=events)
    result = ext.filter(body(pod(), [f"n{i}" for i in range(7)]))
    assert result["NodeNames"] == []
    ((namespace, name, uid, type_, reason, message),) = events.recorded
    assert (namespace, name, uid, type_, reason) == ("ns", "p", "u-1", "Warning", "FilteringFailed")
    assert message.startswith("no GPU node fits: n0: 1/1 CardInsufficientMemory; n1: ")
    assert message.endswith(" (and 2 more)") and message.count("CardInsufficientMemory") == 5
    assert ext.filter(body(pod(), []))["NodeNames"] == [] and len(events.recorded) == 1  # no candidates


def test_the_filtered_pod_does_not_count_against_its_own_quota() -> None:
    # The webhook assumed the pod and the watch shows it Pending: 4000 of the 8000 used are its own.
    full = extender(node("a"), quota=Quota(QuotaLimits(memory=8000), QuotaUsage(memory=8000)))
    assert full.filter(body(pod(mem=4000), ["a"]))["NodeNames"] == ["a"]
    # One MiB more used by others and it no longer fits.
    over = extender(node("a"), quota=Quota(QuotaLimits(memory=8000), QuotaUsage(memory=8001)))
    assert over.filter(body(pod(mem=4000), ["a"]))["FailedNodes"] == {"a": "1/1 ResourceQuotaNotFit"}


def test_node_locks_come_from_the_annotation_and_a_bad_one_is_ignored() -> None:
    held = NodeLock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC), "ns", "p")
    lock = Extender.node_lock_from({"a": encode_node_lock(held), "b": "not a time", "c": ""})
    assert lock("a") == held
    assert lock("b") is None and lock("c") is None and lock("d") is None
