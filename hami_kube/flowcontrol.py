"""Client-side rate limiting as client-go's `util/flowcontrol` (throttle.go) does it: a token bucket that
starts full with `burst` tokens and refills `qps` tokens a second (golang.org/x/time/rate underneath).

- `TokenBucket`: the pure bucket, the time passed in (`try_accept` for a passive filter, as the event
  spam filter uses `NewTokenBucketPassiveRateLimiterWithClock`; `reserve` for a waiting one).
- `RateLimiter`: `await wait()` waits for a token, as `NewTokenBucketRateLimiter(qps, burst).Wait(ctx)`
  does for every request of a rest client (client-go rest/request.go `tryThrottle`); the clock and the
  sleep are injectable so tests measure the waits without timing anything.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

DEFAULT_QPS = 5.0
"""client-go's rest.DefaultQPS: what a client that names no limit gets."""
DEFAULT_BURST = 10
"""client-go's rest.DefaultBurst."""


class TokenBucket:
    """`burst` tokens, refilled at `qps` a second; never more than `burst`. Not thread-safe."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        if not math.isfinite(qps) or qps <= 0:
            raise ValueError(f"token bucket: qps must be a positive number, got {qps!r}")
        if burst < 1:
            raise ValueError(f"token bucket: burst must be at least 1 when qps > 0, got {burst!r}")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = now

    def _advance(self, now: float) -> None:
        if now > self._last:  # a clock that goes back refills nothing (x/time/rate does the same)
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now

    def tokens(self, now: float) -> float:
        """The tokens available at `now` (negative while reservations wait)."""
        self._advance(now)
        return self._tokens

    def try_accept(self, now: float) -> bool:
        """Take one token if one is there now (flowcontrol's TryAccept)."""
        self._advance(now)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def reserve(self, now: float) -> float:
        """Take one token now or in the future: the seconds to wait before using it (0: at once)."""
        self._advance(now)
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def give_back(self, now: float) -> None:
        """Return a reserved token that was not used (a cancelled wait)."""
        self._advance(now)
        self._tokens = min(float(self.burst), self._tokens + 1)


class RateLimiter:
    """Requests wait for a token of a `TokenBucket` (client-go's `tokenBucketRateLimiter.Wait`).
    Counts the calls that waited and the seconds waited (`throttled`, `waited_s`)."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self.bucket = TokenBucket(qps, burst, clock())
        self.throttled = 0
        """Calls that had to wait for a token."""
        self.waited_s = 0.0
        """Seconds waited for tokens, all calls together."""

    async def wait(self) -> float:
        """Wait until a token is ours; the seconds waited. A cancelled wait gives its token back."""
        delay = self.bucket.reserve(self._clock())
        if delay <= 0:
            return 0.0
        self.throttled += 1
        try:
            await self._sleep(delay)
        except BaseException:
            self.bucket.give_back(self._clock())
            raise
        self.waited_s += delay
        return delay


def rate_limiter(
    qps: float,
    burst: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RateLimiter | None:
    """The limiter for `qps` and `burst` as a rest.Config reads them: None (no limit) when qps <= 0.
    Raises ValueError naming the bad value (a burst below 1 with qps > 0, a qps that is not a number)."""
    if math.isnan(qps):
        raise ValueError(f"kube API qps must be a number, got {qps!r}")
    if qps <= 0:
        return None
    return RateLimiter(qps, burst, clock=clock, sleep=sleep)


__all__ = ["DEFAULT_BURST", "DEFAULT_QPS", "RateLimiter", "TokenBucket", "rate_limiter"]
