"""Clocks for tests that must not wait for real: `FakeTime` moves only when something sleeps on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class FakeTime:
    """A clock that moves only when slept on (or not at all, `advance` False): the waits are recorded,
    nothing waits for real."""

    now: float = 0.0
    slept: list[float] = field(default_factory=list)
    advance: bool = True

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.advance:
            self.now += seconds
        await asyncio.sleep(0)
