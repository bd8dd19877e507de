"""One backoff policy: exponential, capped, with jitter; and `Backoff`, the state of one retry loop
that follows it (for a thread that retries on its own)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: the n-th failure in a row waits
    `min(maximum, initial * factor**(n-1))`, shortened by up to `jitter` (a random fraction), so clients
    that lost the API server together do not come back in lockstep."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"retry policy: need 0 < initial <= maximum, got {self.initial}, {self.maximum}")
        if self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"retry policy: need factor >= 1 and 0 <= jitter < 1, got {self}")

    def delay(self, failures: int, rng: random.Random) -> float:
        """The wait after `failures` (>= 1) failures in a row."""
        base = min(self.maximum, self.initial * self.factor ** min(failures - 1, 64))
        return base * (1 - self.jitter * rng.random())

    def backoff(self, rng: random.Random | None = None) -> Backoff:
        """A fresh retry loop's state under this policy."""
        return Backoff(self, rng)


DEFAULT_RETRY = RetryPolicy()


class Backoff:
    """The state of one retry loop (not shared between threads): `next()` after a failure, `reset()`
    after a success."""

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.failures = 0
        """Failures in a row so far."""
        self._rng = rng or random.Random()

    def next(self) -> float:
        """Count one more failure; the wait before the next try."""
        self.failures += 1
        return self.policy.delay(self.failures, self._rng)

    def reset(self) -> int:
        """Back to the first delay; returns how many failures in a row there were."""
        failures, self.failures = self.failures, 0
        return failures

    def report_level(self) -> int:
        """The log level for the failure about to be counted: WARNING for the 1st, 2nd, 4th, 8th ... in
        a row, DEBUG for the others, so an API server that stays down does not flood the log."""
        n = self.failures + 1
        return logging.WARNING if n & (n - 1) == 0 else logging.DEBUG


__all__ = ["DEFAULT_RETRY", "Backoff", "RetryPolicy"]
