"""`SchedulerRunner`: one `SchedulerStandIn` on its own event loop in a thread, with blocking helpers
(tests, benchmarks, the local cluster). Every wait takes a timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from hami_sim.scheduler.config import SchedulerConfig
from hami_sim.scheduler.standin import SchedulerStandIn

log = logging.getLogger(__name__)

T = TypeVar("T")


class SchedulerRunner:
    """>>> with SchedulerRunner(config, kubeconfig, seed=1) as scheduler:  # doctest: +SKIP
    ...     scheduler.wait_for(lambda s: s.counters.scheduled >= 10, timeout=10)
    """

    def __init__(self, config: SchedulerConfig, kubeconfig: str | Path | None = None, **options: Any) -> None:
        self.config = config
        self.standin = SchedulerStandIn(config, kubeconfig, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def start(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            return
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"scheduler-{self.config.scheduler_name}", daemon=True
        )
        self._thread.start()
        try:
            ready.result(timeout)
        except BaseException:
            self.stop()
            raise

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        self._stop = asyncio.Event()
        try:
            await self.standin.start()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self.standin.stop()

    def stop(self, timeout: float = 30.0) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("scheduler %s did not stop within %.1fs", self.config.scheduler_name, timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> SchedulerRunner:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
        """Run `factory()` on the scheduler's loop and return its result."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the scheduler stand-in is not running")
        return asyncio.run_coroutine_threadsafe(factory(), loop).result(timeout)

    def snapshot(self) -> dict[str, Any]:
        async def take() -> dict[str, Any]:
            return self.standin.snapshot()

        return self.run(take)

    def wait_for(self, predicate: Callable[[SchedulerStandIn], bool], timeout: float = 10.0) -> None:
        """Block until `predicate(standin)` holds (evaluated on the scheduler's loop); TimeoutError."""
        self.run(lambda: self.standin.wait_for(predicate, timeout), timeout + 5)
