"""A controller's work queue with client-go's guarantees (k8s.io/client-go/util/workqueue/queue.go):

- a key is queued at most once however often it is added while it waits (the `dirty` set);
- a key a worker holds (`get` until `done`) is never handed to a second worker: added meanwhile, it is
  only marked dirty, and `done` queues it again, so the change that came during the sync is still seen
  by one more sync, after the first.

The second guarantee is what lets a controller run many workers: two workers syncing one pod at once
each see it without the claim the other is creating, and both create one (issue 31: the
controller-manager stand-in made two ResourceClaims for one pod when a relist re-added a pod key its
first sync was still working on; kubelet then refused the pod for good).

`add_after` is the delaying queue's AddAfter (delaying_queue.go), used for retries with backoff.
Pure asyncio, one event loop; no clock other than the loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._order: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._shut_down = False

    def add(self, key: K) -> None:
        """Queue `key` unless it already waits; if a worker holds it, queue it when that worker is done."""
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._order.put_nowait(key)

    def add_after(self, key: K, delay_s: float) -> None:
        """`add(key)` after `delay_s` seconds of the running loop's clock (at once when <= 0)."""
        if delay_s <= 0:
            self.add(key)
            return

        def fire() -> None:
            self._timers.discard(handle)
            self.add(key)

        handle = asyncio.get_running_loop().call_later(delay_s, fire)
        self._timers.add(handle)

    async def get(self) -> K:
        """The next key, held by the caller until `done(key)`."""
        key = await self._order.get()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def done(self, key: K) -> None:
        """The caller's sync of `key` is over; a key added during it is queued again now."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._order.put_nowait(key)

    def shut_down(self) -> None:
        """No more adds; pending retry timers are cancelled."""
        self._shut_down = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return self._order.qsize()

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)
