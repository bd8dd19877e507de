"""hami_kube.events against the local API server: an Event as tools/record writes it, identical events
counted on the first with a PATCH (and created again when it was deleted), similar ones combined, the
spam filter per source and object, refused writes abandoned and unanswered ones tried again, the
queue flushed on stop, and the threaded recorder fed from other threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hami_kube.backoff import RetryPolicy
from hami_kube.blocking import BlockingKubeApi
from hami_kube.client import KubeApi
from hami_kube.events import COMBINED_PREFIX, EventRecorder, EventSource
from hami_kube.flowcontrol import RateLimiter
from tests.clocks import FakeTime
from tests.conftest import ApiServerHandle
from tests.control_server_util import LoopThread
from tests.integration.scripted_http import Answer, ScriptedServer
from tests.waiting import wait_for

SOURCE = EventSource("hami-node", "node-1")
FAST = RetryPolicy(initial=0.01, maximum=0.02)


@dataclass
class Rig:
    loop: LoopThread
    api: KubeApi
    core_v1: Any
    apiserver: ApiServerHandle

    def recorder(self, source: EventSource = SOURCE, **options: Any) -> EventRecorder:
        async def make() -> EventRecorder:
            recorder = EventRecorder(self.api, source, retry=FAST, **options)
            recorder.start()
            return recorder

        return self.loop.call(make)

    def record(self, recorder: EventRecorder, *calls: tuple[Any, ...], **options: Any) -> None:
        """Record each (namespace, name, uid, type, reason, message) on the loop; wait until written."""

        async def run() -> bool:
            for call in calls:
                recorder.record(*call, **options)
            return await recorder.wait_idle(10.0)

        assert self.loop.call(run)

    def events(self, name: str) -> list[Any]:
        items = self.core_v1.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        ).items
        return sorted(items, key=lambda e: e.metadata.name)

    def counter(self, verb: str) -> int:
        return self.apiserver.runner.counters().get((verb, "events", ""), 0)


@pytest.fixture
def rig(apiserver: ApiServerHandle, core_v1: Any) -> Iterator[Rig]:
    loop = LoopThread()
    api = loop.call(lambda: KubeApi.connect(apiserver.kubeconfig, qps=0))
    try:
        yield Rig(loop, api, core_v1, apiserver)
    finally:
        loop.call(api.close)
        loop.close()


def pod_event(message: str = "it failed", reason: str = "Failed", name: str = "p") -> tuple[Any, ...]:
    return ("default", name, f"uid-{name}", "Warning", reason, message)


def test_an_event_is_written_with_the_fields_of_tools_record(rig: Rig) -> None:
    recorder = rig.recorder(wall_clock=lambda: 1_800_000_000.5)
    rig.record(recorder, pod_event(), action="Allocate", resource_version="7")
    (event,) = rig.events("p")
    assert event.metadata.name == f"p.{1_800_000_000_500_000_000:x}"
    assert (event.type, event.reason, event.message, event.count, event.action) == (
        "Warning",
        "Failed",
        "it failed",
        1,
        "Allocate",
    )
    assert (event.source.component, event.source.host) == ("hami-node", "node-1")
    assert (event.reporting_component, event.reporting_instance) == ("hami-node", "node-1")
    ref = event.involved_object
    assert (ref.kind, ref.namespace, ref.name, ref.uid, ref.resource_version) == (
        "Pod",
        "default",
        "p",
        "uid-p",
        "7",
    )
    assert event.first_timestamp == event.last_timestamp and recorder.sent == 1


def test_identical_events_are_one_event_whose_count_is_patched(rig: Rig) -> None:
    recorder = rig.recorder()
    rig.record(recorder, pod_event(), pod_event(), pod_event())
    (event,) = rig.events("p")
    assert event.count == 3 and event.message == "it failed"
    assert (rig.counter("create"), rig.counter("patch"), recorder.sent, recorder.patched) == (1, 2, 3, 2)
    # Deleted meanwhile (events expire): the next one is created again, with the count it has reached.
    rig.core_v1.delete_namespaced_event(event.metadata.name, "default")
    rig.record(recorder, pod_event())
    (again,) = rig.events("p")
    assert again.count == 4 and rig.counter("create") == 2


def test_from_the_tenth_similar_message_they_are_combined_into_one_event(rig: Rig) -> None:
    recorder = rig.recorder()
    rig.record(recorder, *(pod_event(f"message {i}") for i in range(12)))
    events = rig.events("p")
    combined = [e for e in events if e.message.startswith(COMBINED_PREFIX)]
    assert len(events) == 10 and len(combined) == 1
    assert combined[0].message == COMBINED_PREFIX + "message 11" and combined[0].count == 3
    assert sorted(e.message for e in events if e not in combined) == [f"message {i}" for i in range(9)]


def test_a_source_writes_at_most_25_events_about_one_object_then_one_every_5_minutes(rig: Rig) -> None:
    now = [0.0]
    recorder = rig.recorder(clock=lambda: now[0])
    rig.record(recorder, *(pod_event(reason=f"Reason{i}") for i in range(27)))
    rig.record(recorder, pod_event(name="q"))  # another object: its own bucket
    assert (len(rig.events("p")), recorder.skipped, len(rig.events("q"))) == (25, 2, 1)
    now[0] = 300.0
    rig.record(recorder, pod_event(reason="Later"), pod_event(reason="TooSoon"))
    assert [e.reason for e in rig.events("p")].count("Later") == 1 and recorder.skipped == 3


def test_a_refused_event_is_abandoned_and_counted(rig: Rig) -> None:
    recorder = rig.recorder()
    rig.record(recorder, ("no-such-namespace", "p", "u", "Warning", "Failed", "lost"))
    assert (recorder.failed, recorder.sent, rig.counter("create")) == (1, 0, 1)  # tried once


def test_an_unanswered_write_is_tried_again_and_every_try_is_bounded(rig: Rig) -> None:
    async def main() -> tuple[list[str], int, int, int]:
        dropped = Answer(drop=True)
        async with (
            ScriptedServer([dropped, dropped, Answer(201, b"{}")]) as server,
            KubeApi(server.url, None, qps=0) as api,
        ):
            recorder = EventRecorder(api, SOURCE, retry=FAST)
            recorder.start()
            recorder.record(*pod_event())
            assert await recorder.wait_idle(10.0)
            written = (recorder.sent, recorder.failed)
            # A server that never answers: 3 tries, then given up.
            server.script[:] = [dropped] * 10
            short = EventRecorder(api, SOURCE, retry=FAST, max_tries=3)
            short.start()
            short.record(*pod_event("other"))
            assert await short.wait_idle(10.0)
            await recorder.stop()
            await short.stop()
            return [m for m, _, _ in server.requests], *written, short.failed

    methods, sent, failed, gave_up = rig.loop.call(main)
    assert methods == ["POST"] * 6 and (sent, failed, gave_up) == (1, 0, 1)


def test_events_take_tokens_of_their_own_not_the_clients(apiserver: ApiServerHandle, rig: Rig) -> None:
    time = FakeTime()

    async def main() -> tuple[int, bool]:
        limiter = RateLimiter(1.0, 1, clock=time.clock, sleep=time.sleep)
        async with await KubeApi.connect(apiserver.kubeconfig, limiter=limiter) as api:
            recorder = EventRecorder(api, SOURCE, qps=1000.0, burst=2)
            recorder.start()
            for i in range(4):
                recorder.record(*pod_event(reason=f"R{i}"))
            assert await recorder.wait_idle(10.0)
            await recorder.stop()
            await api.get("/api/v1/namespaces/default/events")  # the client's one token is still there
            own = recorder._b.limiter
            return recorder.sent, own is not None and own is not limiter

    assert rig.loop.call(main) == (4, True) and time.slept == []


def test_stop_lets_the_queued_events_out_first(rig: Rig) -> None:
    recorder = rig.recorder()

    async def main() -> None:
        for i in range(5):
            recorder.record(*pod_event(reason=f"R{i}"))
        await recorder.stop(grace_s=10.0)
        recorder.record(*pod_event(reason="After"))  # queued, never written: the task is gone

    rig.loop.call(main)
    assert len(rig.events("p")) == 5 and recorder.queued == 1


def test_the_threaded_recorder_takes_events_from_any_thread(apiserver: ApiServerHandle, core_v1: Any) -> None:
    bridge = BlockingKubeApi.connect(apiserver.kubeconfig, name="events-kube-loop")
    try:
        recorder = bridge.event_recorder(SOURCE, retry=FAST)
        other = recorder.with_source(EventSource("hami-device-plugin"))
        threads = [
            threading.Thread(target=recorder.record, args=pod_event(reason=f"R{i}", name=f"p{i}"))
            for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        other.record("", "node-1", "node-uid", "Warning", "AsymmetricGPUP2PLink", "links", kind="Node")
        assert recorder.wait_idle(10.0) and (recorder.sent, other.sent) == (5, 5)  # one queue, one count
        node_events = core_v1.list_namespaced_event(
            "default", field_selector="involvedObject.kind=Node"
        ).items
        assert [(e.source.component, e.involved_object.name) for e in node_events] == [
            ("hami-device-plugin", "node-1")
        ]
        assert len(core_v1.list_namespaced_event("default").items) == 5
    finally:
        bridge.close()
    recorder.record(*pod_event())  # after close: dropped quietly, never raised
    wait_for(lambda: not bridge.loop.is_running(), what="the loop to stop")
