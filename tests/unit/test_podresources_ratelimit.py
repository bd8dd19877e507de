"""The PodResources server's rate limit is golang.org/x/time/rate's Limiter.Allow with kubelet's numbers
(100 per second, bursts of 10): full at start, one token per 1/rate seconds, never more than the burst.
The bucket is hami_kube's (`flowcontrol.TokenBucket.try_accept`), the one the API client waits on."""

from __future__ import annotations

import pytest

from hami_kube.flowcontrol import TokenBucket
from hami_sim.kubelet.podresources.server import DEFAULT_BURST_TOKENS, DEFAULT_QPS


def allowed(bucket: TokenBucket, now: float, calls: int) -> int:
    return sum(bucket.try_accept(now) for _ in range(calls))


def test_kubelets_numbers() -> None:
    assert (DEFAULT_QPS, DEFAULT_BURST_TOKENS) == (100.0, 10)


def test_a_full_bucket_serves_the_burst_then_refuses() -> None:
    bucket = TokenBucket(DEFAULT_QPS, DEFAULT_BURST_TOKENS, now=5.0)
    assert allowed(bucket, 5.0, 11) == 10


def test_one_token_comes_back_every_hundredth_of_a_second() -> None:
    bucket = TokenBucket(100.0, 10, now=0.0)
    assert allowed(bucket, 0.0, 10) == 10
    assert allowed(bucket, 0.005, 1) == 0
    assert allowed(bucket, 0.0101, 2) == 1
    assert allowed(bucket, 0.0501, 10) == 4


def test_an_idle_bucket_holds_no_more_than_the_burst() -> None:
    bucket = TokenBucket(100.0, 10, now=0.0)
    assert allowed(bucket, 0.0, 10) == 10
    assert allowed(bucket, 1000.0, 20) == 10


def test_a_clock_going_back_adds_nothing() -> None:
    bucket = TokenBucket(100.0, 10, now=10.0)
    assert allowed(bucket, 10.0, 10) == 10
    assert allowed(bucket, 9.0, 1) == 0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 10), (100.0, 0), (-1.0, 1)])
def test_a_bucket_that_could_never_serve_is_refused(rate: float, burst: int) -> None:
    refused = r"token bucket: (qps must be a positive number|burst must be at least 1)"
    with pytest.raises(ValueError, match=refused):
        TokenBucket(rate, burst, now=0.0)
