"""hami_kube's pure event and flow-control logic: the correlator (client-go's tools/record
events_cache.go: aggregation, counting by patch, the spam filter), the token bucket (util/flowcontrol),
the recorder's record-time limits and names, and the client's retry rules (rest/with_retry.go)."""

from __future__ import annotations

import asyncio
import errno
import itertools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_kube.client import probable_eof, retry_after
from hami_kube.events import (
    COMBINED_PREFIX,
    Correlated,
    CorrelatorOptions,
    Event,
    EventCorrelator,
    EventLimits,
    EventRecorder,
    EventSource,
    ObjectRef,
    event_name,
    new_event,
)
from hami_kube.flowcontrol import RateLimiter, TokenBucket, rate_limiter

SOURCE = EventSource("kubelet", "node-1")
WALL = 1_800_000_000.0


def pod_ref(name: str = "p", uid: str = "u1") -> ObjectRef:
    return ObjectRef("Pod", name, "ns", uid)


_NANOS = itertools.count(1)


def event(
    message: str = "m", reason: str = "Failed", ref: ObjectRef | None = None, wall: float = WALL
) -> Event:
    """A Warning Event with a name of its own (as the recorder gives every event)."""
    return new_event(ref or pod_ref(), "Warning", reason, message, SOURCE, wall, unix_nanos=next(_NANOS))


@dataclass
class Server:
    """The API server as the correlator's writes see it: events by name."""

    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    creates: int = 0
    patches: int = 0

    def write(self, correlator: EventCorrelator, result: Correlated) -> None:
        if result.patch is not None:
            assert result.event.name in self.events, "a patch names an event written before"
            stored = self.events[result.event.name]
            assert result.patch["count"] > stored["count"], "the count only goes up"
            stored.update(result.patch)
            self.patches += 1
            answer = stored
        else:
            assert result.event.name not in self.events
            answer = result.event.body()
            self.events[result.event.name] = answer
            self.creates += 1
        correlator.update_state(result.event, answer)

    def counts(self) -> list[tuple[str, int]]:
        return sorted((e["message"], e["count"]) for e in self.events.values())


# --- counting identical events ------------------------------------------------------------------------------


def test_identical_events_are_counted_on_the_first_by_patch() -> None:
    correlator, server = EventCorrelator(), Server()
    results = []
    for second in range(3):
        result = correlator.correlate(event(wall=WALL + second), float(second))
        assert result is not None
        server.write(correlator, result)
        results.append(result)
    first, second, third = results
    assert first.patch is None and first.event.count == 1
    assert second.event.name == third.event.name == first.event.name
    assert second.patch == {"count": 2, "lastTimestamp": "2027-01-15T08:00:01Z", "message": "m"}
    assert third.patch is not None and third.patch["count"] == 3
    assert third.event.first_timestamp == "2027-01-15T08:00:00Z"
    assert (server.creates, server.patches, server.counts()) == (1, 2, [("m", 3)])


def test_events_differing_in_source_object_type_or_reason_are_not_counted_together() -> None:
    correlator = EventCorrelator()
    variants = [
        event(),
        event(ref=pod_ref("q", "u2")),
        event(reason="Other"),
        new_event(pod_ref(), "Normal", "Failed", "m", SOURCE, WALL),
        new_event(pod_ref(), "Warning", "Failed", "m", EventSource("kubelet", "node-2"), WALL),
    ]
    results = [correlator.correlate(v, 0.0) for v in variants]
    assert all(r is not None and r.patch is None for r in results)


# --- aggregation --------------------------------------------------------------------------------------------


def test_from_the_tenth_distinct_message_similar_events_are_combined_into_one() -> None:
    correlator, server = EventCorrelator(), Server()
    for i in range(12):
        result = correlator.correlate(event(f"message {i}", wall=WALL + i), float(i))
        assert result is not None
        server.write(correlator, result)
    combined = [e for e in server.events.values() if e["message"].startswith(COMBINED_PREFIX)]
    assert len(server.events) == 10 and len(combined) == 1
    assert combined[0]["message"] == COMBINED_PREFIX + "message 11" and combined[0]["count"] == 3
    assert combined[0]["reason"] == "Failed" and combined[0]["involvedObject"] == pod_ref().to_json()
    assert sorted(e["message"] for e in server.events.values() if e not in combined) == [
        f"message {i}" for i in range(9)
    ]


def test_similar_events_are_new_again_after_ten_quiet_minutes() -> None:
    correlator = EventCorrelator()
    for i in range(10):
        correlator.correlate(event(f"m{i}"), float(i))
    quiet = correlator.correlate(event("m-late"), 9.0 + 601.0)
    assert quiet is not None and not quiet.event.message.startswith(COMBINED_PREFIX)


# --- the spam filter ----------------------------------------------------------------------------------------


def test_a_source_may_write_25_events_about_an_object_then_one_every_5_minutes() -> None:
    correlator = EventCorrelator()
    written = [correlator.correlate(event(reason=f"R{i}"), 0.0) for i in range(27)]
    assert sum(r is not None for r in written) == 25 and written[25] is None and written[26] is None
    # per object:
    assert correlator.correlate(event(reason="R-other", ref=pod_ref("q", "u2")), 0.0) is not None
    assert correlator.correlate(event(reason="R27"), 299.0) is None
    assert correlator.correlate(event(reason="R28"), 300.0) is not None
    assert correlator.correlate(event(reason="R29"), 300.0) is None


@st.composite
def event_streams(draw: st.DrawFn) -> list[tuple[int, int, int, float]]:
    """(object, reason, message, seconds since the last one) of a stream of events."""
    return draw(
        st.lists(
            st.tuples(
                st.integers(0, 2),
                st.integers(0, 2),
                st.integers(0, 14),
                st.sampled_from([0.0, 0.5, 30.0, 700.0]),
            ),
            max_size=120,
        )
    )


@given(event_streams())
def test_every_event_is_counted_exactly_once_on_the_events_written(
    stream: list[tuple[int, int, int, float]],
) -> None:
    """Without the spam filter acting, the counts of the events written add up to the events recorded,
    whatever was combined or counted, and every patch names an event written before."""
    correlator = EventCorrelator(CorrelatorOptions(spam_burst=10_000))
    server, now = Server(), 0.0
    for obj, reason, message, gap in stream:
        now += gap
        result = correlator.correlate(event(f"m{message}", f"R{reason}", pod_ref(f"p{obj}", f"u{obj}")), now)
        assert result is not None
        server.write(correlator, result)
    assert sum(e["count"] for e in server.events.values()) == len(stream)


@given(event_streams())
def test_the_spam_filter_never_lets_more_than_its_burst_through_at_once(
    stream: list[tuple[int, int, int, float]],
) -> None:
    correlator = EventCorrelator(CorrelatorOptions(spam_burst=5, spam_qps=1 / 300))
    through: dict[int, int] = {}
    for obj, reason, message, _ in stream:  # no time passes: no refill
        result = correlator.correlate(event(f"m{message}", f"R{reason}", pod_ref(f"p{obj}", f"u{obj}")), 0.0)
        through[obj] = through.get(obj, 0) + (result is not None)
    assert all(n <= 5 for n in through.values())


def test_correlator_options_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="max_events >= 1"):
        CorrelatorOptions(max_events=0)
    with pytest.raises(ValueError, match="spam_burst >= 1"):
        CorrelatorOptions(spam_burst=0)


# --- names and bodies ---------------------------------------------------------------------------------------


def test_events_are_named_after_the_object_and_the_time_in_hex_or_a_uuid() -> None:
    assert event_name("gpu-pod", 0x1234) == "gpu-pod.1234"
    odd = event_name("Not_A_Name", 1)
    assert len(odd) == 36 and odd.count("-") == 4
    assert len(event_name("a" * 250, 1 << 60)) == 36


def test_an_event_body_carries_the_source_and_the_reporting_fields_as_tools_record() -> None:
    body = new_event(pod_ref(), "Normal", "Started", "x" * 2000, SOURCE, WALL, action="Allocate").body()
    assert body["source"] == {"component": "kubelet", "host": "node-1"}
    assert (body["reportingComponent"], body["reportingInstance"]) == ("kubelet", "node-1")
    assert body["metadata"]["namespace"] == "ns" and body["action"] == "Allocate"
    assert len(body["message"]) == 1024 and "eventTime" not in body and body["count"] == 1
    node = new_event(ObjectRef("Node", "n1", uid="u"), "Warning", "X", "y", EventSource("dp"), WALL).body()
    assert node["metadata"]["namespace"] == "default" and node["source"] == {"component": "dp"}
    assert node["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}
    timed = new_event(pod_ref(), "Normal", "Scheduled", "y", SOURCE, WALL + 0.25, event_time=True).body()
    assert timed["eventTime"] == "2027-01-15T08:00:00.250000Z"


# --- the recorder's record-time rules -----------------------------------------------------------------------


def test_record_never_raises_and_drops_what_it_cannot_take() -> None:
    recorder = EventRecorder(None, SOURCE, limits=EventLimits(queue=2), wall_clock=lambda: WALL)  # type: ignore[arg-type]
    recorder.record("ns", "p", "u", "Bogus", "R", "m")  # not Normal or Warning: dropped
    for i in range(3):
        recorder.record("ns", "p", "u", "Normal", "R", f"m{i}")
    assert (recorder.queued, recorder.dropped) == (2, 2)
    names = [recorder._b.queue.get_nowait().name for _ in range(2)]
    assert len(set(names)) == 2, "a clock that does not move still gives every event its own name"


def test_event_limits_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="per_object_s >= 0"):
        EventLimits(per_object_s=-1)
    with pytest.raises(ValueError, match="burst must be >= 1"):
        EventLimits(per_second=1.0, burst=0)
    with pytest.raises(ValueError, match="component must not be empty"):
        EventSource("")


# --- the token bucket ---------------------------------------------------------------------------------------


@given(
    qps=st.floats(0.5, 50.0),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0.0, 2.0), max_size=200),
)
def test_a_token_bucket_never_lets_more_through_than_its_burst_and_refill(
    qps: float, burst: int, gaps: list[float]
) -> None:
    bucket, now, accepted = TokenBucket(qps, burst, 0.0), 0.0, 0
    for gap in gaps:
        now += gap
        accepted += bucket.try_accept(now)
        assert accepted <= burst + qps * now + 1e-9


def test_reservations_past_the_burst_wait_one_refill_each() -> None:
    bucket = TokenBucket(2.0, 3, 0.0)
    assert [bucket.reserve(0.0) for _ in range(6)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]
    bucket.give_back(0.0)  # a cancelled wait returns its token
    assert bucket.reserve(0.0) == 1.5


def test_rate_limiter_settings_as_a_rest_config_reads_them() -> None:
    assert rate_limiter(0, 0) is None and rate_limiter(-1, 10) is None  # qps <= 0: no limit
    assert isinstance(rate_limiter(5, 10), RateLimiter)
    with pytest.raises(ValueError, match="burst must be at least 1"):
        rate_limiter(5, 0)
    with pytest.raises(ValueError, match="qps must be a number"):
        rate_limiter(float("nan"), 10)


def test_a_rate_limiter_waits_through_its_sleep_and_counts_the_waits() -> None:
    clock = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    async def main() -> None:
        limiter = RateLimiter(4.0, 2, clock=lambda: clock[0], sleep=sleep)
        for _ in range(4):
            await limiter.wait()
        assert (limiter.throttled, limiter.waited_s) == (2, 0.5)

    asyncio.run(main())
    assert slept == [0.25, 0.25]


# --- the client's retry rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "header", "wait"),
    [
        (429, "3", 3.0),
        (503, "0", 0.0),
        (504, " 2 ", 2.0),
        (500, None, None),  # no Retry-After: final
        (404, "1", None),  # not a 429 or 5xx
        (409, "1", None),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", None),  # a date is not read (client-go reads seconds)
        (429, "-1", None),
        (429, "1.5", None),
    ],
)
def test_retry_after_only_for_429_and_5xx_with_whole_seconds(
    status: int, header: str | None, wait: float | None
) -> None:
    headers = {} if header is None else {"Retry-After": header}
    assert retry_after(status, headers) == wait


def test_probable_eof_is_a_reset_or_closed_connection_not_a_refusal_or_timeout() -> None:
    assert probable_eof(aiohttp.ServerDisconnectedError())
    assert probable_eof(ConnectionResetError(errno.ECONNRESET, "reset by peer"))
    assert probable_eof(aiohttp.ClientOSError(errno.ECONNRESET, "reset"))
    assert probable_eof(BrokenPipeError(errno.EPIPE, "broken pipe"))
    assert not probable_eof(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert not probable_eof(TimeoutError())
