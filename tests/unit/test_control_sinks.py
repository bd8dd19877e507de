"""hami_control.gpu_sinks and .writers: the watch sinks that feed the extender's GPU cache (pods and
nodes, relists, the node lock annotation, hooks) and hami-control's event limits on the recorder."""

from __future__ import annotations

from typing import Any

from hami_api.annotations import NODE_LOCK, NODE_REGISTER, encode_node_register
from hami_api.types import GPUInfo
from hami_control.cache import ClusterCache
from hami_control.gpu_sinks import FanoutSink, GPUNodeSink, GPUPodSink
from hami_control.writers import EVENT_COMPONENT, event_recorder
from hami_kube.events import EventLimits, EventRecorder, EventSource


def node(name: str, lock: str | None = None) -> dict[str, Any]:
    annotations = {
        NODE_REGISTER: encode_node_register([GPUInfo(f"{name}-g0", 0, 2, 1000, 100, "T", 0, "", True)])
    }
    if lock is not None:
        annotations[NODE_LOCK] = lock
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": "2"}},
    }


def pod(uid: str, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid}, "spec": {}, "status": {"phase": phase}}


class Recorder:
    def __init__(self) -> None:
        self.replaced: list[int] = []
        self.applied: list[tuple[str, str]] = []

    def begin_replace(self) -> None:
        self.replaced.append(0)

    def add_page(self, items: Any) -> None:
        self.replaced[-1] += len(items)

    def end_replace(self) -> None:
        pass

    def apply(self, kind: str, obj: Any) -> None:
        self.applied.append((kind, obj["metadata"]["name"]))


def test_node_sink_registers_tracks_locks_and_relists() -> None:
    cache = ClusterCache()
    sink = GPUNodeSink(cache)
    seen: list[str] = []
    sink.hooks.append(seen.append)
    sink.begin_replace()  # a list in two pages
    sink.add_page([node("a")])
    sink.add_page([node("b", lock="2026-11-22T03:00:00Z,ns,p")])
    sink.end_replace()
    assert sorted(cache.nodes()) == ["a", "b"]
    assert sink.locks == {"b": "2026-11-22T03:00:00Z,ns,p"}
    sink.apply("MODIFIED", node("b"))
    assert sink.locks == {}
    sink.replace([node("a")])  # b is gone from the relist
    assert list(cache.nodes()) == ["a"]
    sink.apply("DELETED", node("a"))
    assert list(cache.nodes()) == []
    assert seen == ["a", "b", "b", "a", "a"]


def test_pod_sink_drops_pods_missing_from_a_relist_and_calls_hooks() -> None:
    cache = ClusterCache()
    sink = GPUPodSink(cache)
    calls: list[tuple[str, bool]] = []
    sink.hooks.append(lambda uid, _pod, deleted: calls.append((uid, deleted)))
    sink.hooks.append(lambda *_: (_ for _ in ()).throw(RuntimeError("a broken hook is logged, not raised")))
    sink.replace([pod("u1"), pod("u2")])
    sink.apply("DELETED", pod("u1"))
    assert calls == [("u1", False), ("u2", False), ("u1", True)]


def test_fanout_feeds_every_sink() -> None:
    a, b = Recorder(), Recorder()
    fan = FanoutSink(a, b)
    fan.replace([pod("x")])
    fan.apply("ADDED", pod("y"))
    assert a.replaced == b.replaced == [1]
    assert a.applied == b.applied == [("ADDED", "y")]


def test_event_recorder_limits_per_pod_reason_and_overall() -> None:
    now = [0.0]
    recorder = EventRecorder(
        None,  # type: ignore[arg-type]  # nothing is sent: the queue is only filled
        EventSource(EVENT_COMPONENT, reporting_instance="hami-control-0"),
        limits=EventLimits(per_object_s=10.0, per_second=1.0, burst=3, queue=100),
        clock=lambda: now[0],
        wall_clock=lambda: 1_800_000_000.0,
    )
    recorder.record("ns", "p", "u", "Normal", "BindingSucceed", "ok")
    recorder.record("ns", "p", "u", "Normal", "BindingSucceed", "again")  # same pod and reason: dropped
    recorder.record("ns", "p", "u", "Warning", "BindingFailed", "other reason")
    recorder.record("ns", "q", "u2", "Normal", "BindingSucceed", "ok")
    recorder.record("ns", "r", "u3", "Normal", "BindingSucceed", "burst spent")  # no token left
    assert (recorder.queued, recorder.dropped) == (3, 2)
    now[0] = 10.0  # tokens refilled, the per-pod window passed
    recorder.record("ns", "p", "u", "Normal", "BindingSucceed", "later")
    assert recorder.queued == 4
    event = recorder._b.queue.get_nowait().body()
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u",
    }
    # Named as client-go names events: the object's name and the time in nanoseconds, in hex.
    assert event["metadata"] == {"name": f"p.{1_800_000_000 * 10**9:x}", "namespace": "ns"}
    assert event["firstTimestamp"] == "2027-01-15T08:00:00Z"
    assert event["source"] == {"component": "hami-scheduler"}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("hami-scheduler", "hami-control-0")


def test_hami_controls_recorder_keeps_its_limits() -> None:
    recorder = event_recorder(None, "hami-control-0")  # type: ignore[arg-type]
    assert recorder._b.limits == EventLimits(per_object_s=10.0, per_second=20.0, burst=50, queue=1000)
    assert recorder.source == EventSource("hami-scheduler", reporting_instance="hami-control-0")
