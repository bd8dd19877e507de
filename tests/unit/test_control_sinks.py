"""hami_control.gpu_sinks and .writers: the node watch's sink that feeds the extender's GPU cache (relists,
the node lock annotation, hooks) and the event recorder's rate limits. (The pods watch feeds the pod
store: test_pod_store.py.)"""

from __future__ import annotations

from hami_api.annotations import NODE_LOCK
from hami_control.cache import ClusterCache
from hami_control.gpu_sinks import GPUNodeSink
from hami_control.writers import EVENT_COMPONENT, event_recorder
from hami_kube.events import EventLimits, EventRecorder, EventSource
from tests.builders import Json, gpu_info, node


def registered_node(name: str, lock: str | None = None) -> Json:
    """Node `name` with one GPU `<name>-g0` of 2 slots, and the node lock annotation `lock` when given."""
    gpus = [gpu_info(0, id=f"{name}-g0", count=2, devmem=1000)]
    return node(name, gpus, annotations={NODE_LOCK: lock} if lock is not None else None)


def test_node_sink_registers_tracks_locks_and_relists() -> None:
    cache = ClusterCache()
    sink = GPUNodeSink(cache)
    seen: list[str] = []
    sink.hooks.append(seen.append)
    sink.begin_replace()  # a list in two pages
    sink.add_page([registered_node("a")])
    sink.add_page([registered_node("b", lock="2026-11-22T03:00:00Z,ns,p")])
    sink.end_replace()
    assert sorted(cache.nodes()) == ["a", "b"]
    assert sink.locks == {"b": "2026-11-22T03:00:00Z,ns,p"}
    sink.apply("MODIFIED", registered_node("b"))
    assert sink.locks == {}
    sink.replace([registered_node("a")])  # b is gone from the relist
    assert list(cache.nodes()) == ["a"]
    sink.apply("DELETED", registered_node("a"))
    assert list(cache.nodes()) == []
    assert seen == ["a", "b", "b", "a", "a"]


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
