"""One reflector: list, then watch, one resource into a `WatchSink`, until cancelled (client-go's
Reflector, fed to one store per resource).

The list is paged (`limit`/`continue`, 500 objects a page as client-go and kubectl), so a large cluster is
never parsed at once; the watch starts from the list's resourceVersion with bookmarks. A watch that ends
(server timeout, dropped connection) resumes from the last resourceVersion seen; 410 Gone (that version
left the server's history) relists at once; any other error waits with `RetryPolicy`'s backoff, unless
the attempt delivered a list or a change first (a watch cut mid-stream after events resumes at once, as
client-go's reflector treats an unexpected EOF as the end of a watch that made progress:
tools/cache/reflector.go handleWatch, apimachinery watch/streamwatcher.go). A sink that fails on one
event is logged and the watch goes on. `synced` is set after the first list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.client import JSONDict
from hami_kube.errors import KubeApiError

log = logging.getLogger(__name__)


class WatchSink(Protocol):
    """What a reflector feeds (called on the event loop)."""

    def begin_replace(self) -> None:
        """A list starts: the pages that follow are the complete set of objects now."""
        ...

    def add_page(self, items: Sequence[JSONDict]) -> None:
        """One page of the list (a paged list never holds all objects parsed at once)."""
        ...

    def end_replace(self) -> None:
        """The list is complete: whatever it did not name is gone."""
        ...

    def apply(self, kind: str, obj: JSONDict) -> None:
        """One change: `kind` is ADDED, MODIFIED or DELETED."""
        ...


def replace_all(sink: WatchSink, items: Sequence[JSONDict]) -> None:
    """A whole list in one page."""
    sink.begin_replace()
    sink.add_page(items)
    sink.end_replace()


class ListSink:
    """A `WatchSink` over two callables, for a store that takes a whole list at once: `replace(items)`
    with every page of a list, `apply(kind, obj)` per change."""

    def __init__(
        self, replace: Callable[[Sequence[JSONDict]], None], apply: Callable[[str, JSONDict], None]
    ) -> None:
        self._replace = replace
        self._apply = apply
        self._items: list[JSONDict] = []

    def begin_replace(self) -> None:
        self._items = []

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._items.extend(items)

    def end_replace(self) -> None:
        items, self._items = self._items, []
        self._replace(items)

    def apply(self, kind: str, obj: JSONDict) -> None:
        self._apply(kind, obj)


class Lister(Protocol):
    """What a reflector calls (`KubeApi` is one)."""

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict: ...

    def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JSONDict]]: ...


class Reflector:
    """List, then watch, one resource across all namespaces into a `WatchSink`, until cancelled."""

    def __init__(
        self,
        api: Lister,
        name: str,
        path: str,
        sink: WatchSink,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
        rng: random.Random | None = None,
        page_size: int = 500,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.api = api
        self.params = dict(params or {})
        """Added to the list and the watch (a field or label selector)."""
        self.page_size = page_size
        """Objects per list page (kube-apiserver's `limit`; kubectl and client-go use 500)."""
        self.name = name
        self.path = path
        self.sink = sink
        self.retry = retry
        self.watch_timeout_s = watch_timeout_s
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        """The last version seen (list, event or bookmark); None before the first list and after a 410."""
        self.lists = 0
        self.watches = 0
        self._rng = rng or random.Random()
        self._backoff = retry.backoff(self._rng)
        self._delivered = False
        """Whether the current attempt has fed the sink a list or a change."""

    @property
    def failures(self) -> int:
        """Failed attempts in a row (0 while healthy)."""
        return self._backoff.failures

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            self._delivered = False
            try:
                await self._attempt()
            except KubeApiError as err:
                if err.gone:
                    log.info("%s watch: %s; relisting", self.name, err.message or "resourceVersion too old")
                    self.resource_version = None
                    continue
                if self._delivered:
                    log.info("%s watch ended after changes: %s; resuming", self.name, err)
                else:
                    self._log_failure(err)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s watch failed unexpectedly", self.name)
            if self._delivered or time.monotonic() - started >= 1.0:
                self._working()
            else:
                await asyncio.sleep(self._backoff.next())

    def _working(self) -> None:
        """A list or a change came through: the failures in a row are over."""
        failures = self._backoff.reset()
        if failures > 1:
            log.info("%s watch: working again after %d failed attempts", self.name, failures)

    def _log_failure(self, err: KubeApiError) -> None:
        """Warn on the 1st, 2nd, 4th, 8th ... failure in a row (`Backoff.report_level`)."""
        n = self.failures + 1
        log.log(self._backoff.report_level(), "%s watch failed (%d in a row): %s", self.name, n, err)

    async def list(self) -> None:
        """One list, page by page, into the sink; then the watch resumes from its resourceVersion.
        Raises `KubeApiError` (a caller may list once at start-up to fail fast with a clear error)."""
        self.sink.begin_replace()
        token = ""
        while True:
            params = {**self.params, "limit": str(self.page_size)}
            if token:
                params["continue"] = token
            body = await self.api.get(self.path, params)
            items = body.get("items")
            metadata = body.get("metadata") or {}
            version = metadata.get("resourceVersion")
            if not isinstance(items, list) or not isinstance(version, str) or not version:
                raise KubeApiError(0, "BadResponse", f"list {self.path} without items or resourceVersion")
            self.sink.add_page([item for item in items if isinstance(item, dict)])
            del body, items
            token = str(metadata.get("continue") or "")
            if not token:
                break
        self.sink.end_replace()
        self.resource_version = version
        self.lists += 1
        self.synced.set()
        self._working()

    async def _attempt(self) -> None:
        """One list (when needed) and one watch; `_delivered` says whether they fed the sink."""
        if self.resource_version is None:
            await self.list()
            self._delivered = True
        timeout = int(self.watch_timeout_s * self._rng.uniform(1.0, 1.5))
        version = self.resource_version
        assert version is not None  # set by the list
        async with self.api.watch(self.path, version, timeout, self.params) as events:
            self.watches += 1
            async for event in events:
                if self._on_event(event):
                    self._delivered = True

    def _on_event(self, event: JSONDict) -> bool:
        kind = event.get("type")
        obj: JSONDict = event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            raise KubeApiError(
                code if isinstance(code, int) else 0, str(obj.get("reason") or ""), str(obj.get("message"))
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.sink.apply(kind, obj)
            except Exception:
                log.exception("%s watch: the cache failed on a %s event", self.name, kind)
        elif kind != "BOOKMARK":
            log.warning("%s watch: ignoring an event of type %r", self.name, kind)
            return False
        if isinstance(version, str) and version:
            self.resource_version = version
        return bool(kind != "BOOKMARK")


__all__ = ["ListSink", "Lister", "Reflector", "WatchSink", "replace_all"]
