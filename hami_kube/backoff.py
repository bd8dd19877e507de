"""One backoff policy: exponential, capped, with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: the n-th failure in a row waits
    `min(maximum, initial * factor**(n-1))`, shortened by up to `jitter` (a random fraction)."""

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


DEFAULT_RETRY = RetryPolicy()

__all__ = ["DEFAULT_RETRY", "RetryPolicy"]
