"""hami_kube for thread-based programs (the node daemon, whose gRPC server runs on threads): one asyncio
event loop on a daemon thread, with one `KubeApi` on it, and blocking calls into it.

`BlockingKubeApi.connect(...)` starts the loop and builds the client there (credentials as
`KubeApi.connect` loads them). `request()` / `get()` block the calling thread until the answer or the
call's timeout and raise `KubeApiError` as the async client does (status 0, "TimeoutError" when the loop
gave no answer in time). `start_reflector()` runs a `Reflector` on the loop: its sink is called on the
loop's thread, so a sink shared with other threads must lock (and never call back into this bridge,
which would wait on its own thread). `event_recorder()` runs a `hami_kube.events.EventRecorder` on the
loop: its `record()` may be called from any thread, and hands the event to the loop without waiting.
`close()` stops the recorders (letting queued events out for up to a second) and the reflectors, closes
the client and joins the thread. Never call the blocking methods from the loop's own thread (a sink):
they raise RuntimeError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import random
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.client import JSONDict, KubeApi, PatchType
from hami_kube.config import load_credentials
from hami_kube.errors import KubeApiError
from hami_kube.events import EventRecorder, EventSource, ObjectRef
from hami_kube.reflector import Reflector, WatchSink

log = logging.getLogger(__name__)

T = TypeVar("T")

GRACE_S = 5.0
"""How much longer than a call's own timeout a thread waits for the loop's answer."""
EVENTS_GRACE_S = 1.0
"""How long `close()` lets queued events out."""


class BlockingKubeApi:
    """One `KubeApi` on its own event loop thread, called from other threads. Thread-safe."""

    def __init__(
        self,
        make_api: Callable[[], Coroutine[Any, Any, KubeApi]],
        *,
        name: str = "hami-kube-loop",
        connect_timeout_s: float = 60.0,
    ) -> None:
        """Start the loop's thread and build the client there with `make_api()` (it may raise, e.g.
        `KubeConfigError`: then the thread is stopped and the error raised here)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._reflectors: list[ThreadedReflector] = []
        self._recorders: list[ThreadedEventRecorder] = []
        self._thread.start()
        try:
            self.api: KubeApi = self._run(make_api(), connect_timeout_s)
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def connect(
        cls,
        kubeconfig: str | Path | None,
        *,
        flag: str = "--kubeconfig",
        context: str | None = None,
        environ: Mapping[str, str] | None = None,
        name: str = "hami-kube-loop",
        **options: Any,
    ) -> BlockingKubeApi:
        """A client from a kubeconfig file, $KUBECONFIG or the in-cluster service account, as
        `KubeApi.connect` (`environ` replaces os.environ for that choice; `options` go to `KubeApi`).
        Raises `KubeConfigError`."""

        async def make() -> KubeApi:
            credentials = await load_credentials(kubeconfig, context=context, flag=flag, environ=environ)
            return KubeApi(credentials.server, credentials.ssl_context, credentials=credentials, **options)

        return cls(make, name=name)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    # -- calls --------------------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking hami_kube call on its own event loop's thread would never end")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise KubeApiError(0, "Closed", "the Kubernetes client is closed") from None
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KubeApiError(0, "TimeoutError", f"no answer within {timeout_s:.1f} s") from None
        except concurrent.futures.CancelledError:
            raise KubeApiError(0, "Closed", "the Kubernetes client was closed during the call") from None

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        """Run `coro` on the loop and wait up to `timeout_s` (None: no limit) for its result; raises
        what it raises, or `KubeApiError` status 0 on timeout (cancelling it) or when the client is closed."""
        if self._closed:
            coro.close()
            raise KubeApiError(0, "Closed", "the Kubernetes client is closed")
        return self._run(coro, timeout_s)

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> JSONDict:
        """`KubeApi.request`, blocking: the answer as a JSON object, or `KubeApiError`. `timeout_s` bounds
        the call (the client's request timeout when None); a wait for the rate limiter beyond `GRACE_S`
        ends it too (status 0, "TimeoutError")."""
        total = self.api.request_timeout_s if timeout_s is None else timeout_s
        call = self.api.request(method, path, body, params=params, content_type=content_type, timeout_s=total)
        return self.run(call, total + GRACE_S)

    def patch(
        self,
        path: str,
        body: object,
        patch_type: PatchType = PatchType.MERGE,
        *,
        timeout_s: float | None = None,
    ) -> JSONDict:
        """`KubeApi.patch`, blocking; raises `KubeApiError`."""
        return self.request("PATCH", path, body, content_type=patch_type, timeout_s=timeout_s)

    def get(
        self, path: str, params: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> JSONDict:
        """GET `path` as a JSON object, blocking; raises `KubeApiError`."""
        return self.request("GET", path, params=params, timeout_s=timeout_s)

    # -- reflectors ---------------------------------------------------------------------------------------

    def start_reflector(
        self,
        name: str,
        path: str,
        sink: WatchSink,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
        params: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        start: bool = True,
    ) -> ThreadedReflector:
        """List, then watch, `path` into `sink` on the loop (the sink is called on the loop's thread),
        until `stop()` or `close()`; returns at once (with `start` False, before it runs: `start()`)."""

        async def make() -> Reflector:
            return Reflector(
                self.api,
                name,
                path,
                sink,
                retry=retry,
                watch_timeout_s=watch_timeout_s,
                params=params,
                rng=rng,
            )

        reflector = ThreadedReflector(self, self.run(make(), GRACE_S))
        with self._lock:
            self._reflectors.append(reflector)
        if start:
            reflector.start()
        return reflector

    # -- events -----------------------------------------------------------------------------------------

    def event_recorder(self, source: EventSource, **options: Any) -> ThreadedEventRecorder:
        """A started `EventRecorder` (`options` as its constructor takes them) on the loop, for threads;
        `close()` stops it."""

        async def make() -> EventRecorder:
            recorder = EventRecorder(self.api, source, **options)
            recorder.start()
            return recorder

        recorder = ThreadedEventRecorder(self, self.run(make(), GRACE_S))
        with self._lock:
            self._recorders.append(recorder)
        return recorder

    # -- the end ------------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the event recorders and the reflectors, close the client and end the loop's thread
        (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reflectors, self._reflectors = self._reflectors, []
            recorders, self._recorders = self._recorders, []
        for recorder in recorders:
            recorder.stop(min(EVENTS_GRACE_S, timeout_s))
        for reflector in reflectors:
            reflector.stop(timeout_s)
        try:
            self._run(self.api.close(), timeout_s)
        except Exception as err:
            log.warning("closing the Kubernetes client: %s", err)
        self._stop_loop(timeout_s)

    def _stop_loop(self, timeout_s: float = 5.0) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        if self._loop.is_closed():
            return
        try:
            self._run(cancel_all(), timeout_s)
        except Exception as err:
            log.warning("stopping the Kubernetes client's loop: %s", err)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the Kubernetes client's loop thread did not stop within %.1fs", timeout_s)
            return
        self._loop.close()

    def __enter__(self) -> BlockingKubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ThreadedReflector:
    """A `Reflector` running on a `BlockingKubeApi`'s loop, controlled from other threads. `stop()` ends
    its task; `start()` runs it again from the last resourceVersion it saw (a relist if that is gone)."""

    def __init__(self, bridge: BlockingKubeApi, reflector: Reflector) -> None:
        self.bridge = bridge
        self.reflector = reflector
        self._task: asyncio.Task[None] | None = None

    @property
    def lists(self) -> int:
        """Completed lists (the first one, then relists)."""
        return self.reflector.lists

    @property
    def watches(self) -> int:
        """Watch requests opened."""
        return self.reflector.watches

    def start(self) -> None:
        async def spawn() -> None:
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self.reflector.run(), name=f"reflector-{self.reflector.name}"
                )

        self.bridge.run(spawn(), GRACE_S)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel the reflector's task and wait until it has ended (an open watch is closed at once)."""

        async def cancel() -> None:
            task, self._task = self._task, None
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        try:
            self.bridge._run(cancel(), timeout_s)
        except KubeApiError as err:
            log.warning("stopping the %s reflector: %s", self.reflector.name, err)

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Whether the first list has reached the sink (waiting up to `timeout_s`)."""

        async def synced() -> bool:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.reflector.synced.wait()
            except TimeoutError:
                return False
            return True

        return self.bridge.run(synced(), None if timeout_s is None else timeout_s + GRACE_S)


class ThreadedEventRecorder:
    """An `EventRecorder` running on a `BlockingKubeApi`'s loop, fed from any thread: `record()` hands
    the event to the loop and returns at once; it never blocks and never raises (a closed loop drops
    the event). The counters are the recorder's."""

    def __init__(self, bridge: BlockingKubeApi, recorder: EventRecorder) -> None:
        self.bridge = bridge
        self.recorder = recorder

    def with_source(self, source: EventSource) -> ThreadedEventRecorder:
        """A recorder for another source sharing this one's queue and task."""
        return ThreadedEventRecorder(self.bridge, self.recorder.with_source(source))

    def record(  # noqa: PLR0917
        self,
        namespace: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        *,
        kind: str = "Pod",
        api_version: str = "v1",
        resource_version: str = "",
        action: str = "",
    ) -> None:
        """`EventRecorder.record`, from any thread."""
        ref = ObjectRef(kind, name, namespace, uid, api_version, resource_version)
        self.emit(ref, type_, reason, message, action=action)

    def emit(self, regarding: ObjectRef, type_: str, reason: str, message: str, *, action: str = "") -> None:
        """`EventRecorder.emit`, from any thread."""
        call = functools.partial(self.recorder.emit, regarding, type_, reason, message, action=action)
        try:
            self.bridge.loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop is closed
            log.debug("event %s about %s dropped: the Kubernetes client is closed", reason, regarding.name)

    @property
    def sent(self) -> int:
        return self.recorder.sent

    @property
    def patched(self) -> int:
        return self.recorder.patched

    @property
    def dropped(self) -> int:
        return self.recorder.dropped

    @property
    def skipped(self) -> int:
        return self.recorder.skipped

    @property
    def failed(self) -> int:
        return self.recorder.failed

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether the events recorded so far have all been handled within `timeout_s` (the ones still
        on their way to the loop included)."""

        async def idle() -> bool:
            return await self.recorder.wait_idle(timeout_s)

        return self.bridge.run(idle(), timeout_s + GRACE_S)

    def stop(self, grace_s: float = EVENTS_GRACE_S) -> None:
        """Let the queued events out for up to `grace_s`, then stop the recorder's task."""
        try:
            self.bridge._run(self.recorder.stop(grace_s), grace_s + GRACE_S)
        except KubeApiError as err:
            log.warning("stopping the event recorder: %s", err)


__all__ = ["BlockingKubeApi", "ThreadedEventRecorder", "ThreadedReflector"]
