"""The caches' pause of the garbage collector while they list (issue 29): off from `start()`, back on
once the lists are in or after `collector_pause_limit_s` when the API server never answers, and on
after `stop()` whatever happened."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Mapping
from typing import Any

from hami_control.caches import ClusterCaches
from hami_control.config import ControlConfig, ServerSettings


class SilentApi:
    """An API server that never answers a list (a `Lister`)."""

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        raise AssertionError("no watch before a list")
        yield  # pragma: no cover


async def collector_after(limit_s: float, wait_s: float) -> tuple[bool, bool, bool]:
    """(enabled right after start, enabled after `wait_s`, enabled after stop)."""
    caches = ClusterCaches(
        SilentApi(), ControlConfig(server=ServerSettings(insecure_http=True)), collector_pause_limit_s=limit_s
    )
    caches.start()
    at_start = gc.isenabled()
    deadline = asyncio.get_running_loop().time() + wait_s
    # a condition with a deadline: the collector's state has no event to wait on
    while not gc.isenabled() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    later = gc.isenabled()
    await caches.stop()
    return at_start, later, gc.isenabled()


def test_the_collector_is_off_while_the_caches_list_and_on_again_after_the_limit_or_stop() -> None:
    assert gc.isenabled()
    assert asyncio.run(collector_after(limit_s=0.05, wait_s=5.0)) == (False, True, True)
    assert asyncio.run(collector_after(limit_s=3600.0, wait_s=0.1)) == (False, False, True)
