"""hami_kube's client-side flow control over real sockets: the rate limiter against the local API server
(a burst beyond `burst` waits, measured by an injected clock, never by wall time; a watch opens without
a token), and client-go's retries against a tiny scripted HTTP server on loopback, since the local API
server has no way to answer 429 or drop a connection on demand (a 429 with Retry-After is retried for
any verb, a 5xx without it is not, a GET lost to a closed connection is retried and a POST is not, the
wait never runs past the call's timeout, a watch's opening is retried too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_kube.flowcontrol import RateLimiter
from tests.clocks import FakeTime
from tests.conftest import ApiServerHandle
from tests.control_server_util import LoopThread
from tests.integration.scripted_http import Answer, ScriptedServer, retry_after

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


# --- rate limiting, against the local API server ------------------------------------------------------------


def test_requests_beyond_the_burst_wait_for_a_token_each(
    apiserver: ApiServerHandle, loop: LoopThread
) -> None:
    time = FakeTime()

    async def main() -> tuple[list[float], list[float]]:
        limiter = RateLimiter(2.0, 3, clock=time.clock, sleep=time.sleep)
        async with await KubeApi.connect(apiserver.kubeconfig, limiter=limiter) as api:
            for _ in range(5):
                await api.get(CONFIGMAPS)
            one_by_one = list(time.slept)
            time.slept.clear()
            time.now += 10.0  # the bucket fills up again (to its burst, no more)
            time.advance = False  # all six take their tokens at the same instant
            await asyncio.gather(*(api.get(CONFIGMAPS) for _ in range(6)))
            return one_by_one, sorted(time.slept)

    one_by_one, together = loop.call(main)
    assert one_by_one == [0.5, 0.5]  # 3 at once, then one every 1/qps
    assert together == [0.5, 1.0, 1.5]  # concurrent calls queue up behind each other's tokens
    assert apiserver.runner.counters()[("list", "configmaps", "")] == 11


def test_opening_a_watch_takes_no_token(apiserver: ApiServerHandle, loop: LoopThread) -> None:
    time = FakeTime()

    async def main() -> None:
        limiter = RateLimiter(1.0, 1, clock=time.clock, sleep=time.sleep)
        async with await KubeApi.connect(apiserver.kubeconfig, limiter=limiter) as api:
            version = (await api.get(CONFIGMAPS))["metadata"]["resourceVersion"]
            for _ in range(3):
                async with api.watch(CONFIGMAPS, version, timeout_s=1):
                    pass

    loop.call(main)
    assert time.slept == [] and apiserver.runner.counters()[("watch", "configmaps", "")] == 3


def test_no_limit_with_qps_zero_and_bad_settings_are_named(loop: LoopThread) -> None:
    async def main() -> None:
        async with KubeApi("http://127.0.0.1:1", None, qps=0) as api:
            assert api.limiter is None
        with pytest.raises(ValueError, match="burst must be at least 1 when qps > 0, got 0"):
            KubeApi("http://127.0.0.1:1", None, qps=5, burst=0)
        with pytest.raises(ValueError, match="max_retries must be >= 0, got -1"):
            KubeApi("http://127.0.0.1:1", None, max_retries=-1)

    loop.call(main)


# --- retries, against a scripted server ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scripted(
    *script: Answer, **options: object
) -> AsyncIterator[tuple[ScriptedServer, KubeApi, FakeTime]]:
    time = FakeTime()
    async with ScriptedServer(list(script)) as server:
        api = KubeApi(server.url, None, qps=0, sleep=time.sleep, **options)  # type: ignore[arg-type]
        async with api:
            yield server, api, time


def test_a_429_with_retry_after_is_waited_out_and_sent_again_for_any_verb(loop: LoopThread) -> None:
    async def main() -> None:
        async with scripted(retry_after(429, "2"), Answer(201, b'{"ok": true}')) as (server, api, time):
            answer = await api.request("POST", CONFIGMAPS, {"metadata": {"name": "a"}})
        assert answer == {"ok": True} and time.slept == [2.0] and api.retries == 1
        assert [(m, b) for m, _, b in server.requests] == [("POST", b'{"metadata":{"name":"a"}}')] * 2

        async with scripted(retry_after(503, "0"), retry_after(500, "1")) as (server, api, time):
            assert await api.get(CONFIGMAPS) == {}
        assert time.slept == [0.0, 1.0] and len(server.requests) == 3

    loop.call(main)


def test_a_5xx_without_retry_after_and_retries_past_max_retries_are_final(loop: LoopThread) -> None:
    async def main() -> None:
        async with scripted(Answer(503, b"{}")) as (server, api, time):
            with pytest.raises(KubeApiError) as info:
                await api.get(CONFIGMAPS)
        assert info.value.status == 503 and len(server.requests) == 1 and time.slept == []

        async with scripted(*[retry_after(429, "1")] * 5, max_retries=3) as (server, api, time):
            with pytest.raises(KubeApiError) as info:
                await api.get(CONFIGMAPS)
        assert (info.value.status, info.value.reason) == (429, "TooManyRequests")
        assert len(server.requests) == 4 and time.slept == [1.0, 1.0, 1.0]

    loop.call(main)


def test_a_retry_after_beyond_the_calls_timeout_is_not_waited_for(loop: LoopThread) -> None:
    async def main() -> None:
        async with scripted(retry_after(429, "60")) as (server, api, time):
            with pytest.raises(KubeApiError) as info:
                await api.request("GET", CONFIGMAPS, timeout_s=5.0)
        assert info.value.status == 429 and time.slept == [] and len(server.requests) == 1

    loop.call(main)


def test_a_get_lost_to_a_closed_connection_is_sent_again_a_post_is_not(loop: LoopThread) -> None:
    async def main() -> None:
        # The first loss aiohttp's transport retries at once (as Go's transport does a replayable request
        # on a connection the server closed); the second is client-go's: again after 1 s.
        lost = Answer(drop=True)
        async with scripted(lost, lost, Answer(200, b'{"items": []}')) as (server, api, time):
            assert await api.get(CONFIGMAPS) == {"items": []}
        assert time.slept == [1.0] and [m for m, _, _ in server.requests] == ["GET"] * 3

        async with scripted(Answer(drop=True)) as (server, api, time):
            with pytest.raises(KubeApiError) as info:
                await api.request("POST", CONFIGMAPS, {"metadata": {"name": "a"}})
        assert info.value.status == 0 and time.slept == [] and len(server.requests) == 1

    loop.call(main)


def test_opening_a_watch_is_retried_after_a_429(loop: LoopThread) -> None:
    stream = b'{"type": "ADDED", "object": {"metadata": {"name": "a"}}}\n'

    async def main() -> None:
        async with (
            scripted(retry_after(429, "1"), Answer(200, stream)) as (server, api, time),
            api.watch(CONFIGMAPS, "1", timeout_s=5) as events,
        ):
            seen = [e async for e in events]
        assert seen == [{"type": "ADDED", "object": {"metadata": {"name": "a"}}}]
        assert time.slept == [1.0] and len(server.requests) == 2

    loop.call(main)
