"""Running the stand-in API server: `serve()` on the current loop (the CLI), and `ApiServerRunner`,
which runs it on its own event loop in a thread (tests, benchmarks, the local cluster)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

from hami_sim.apiserver.faults import FaultConfig, parse_config
from hami_sim.apiserver.kubeconfig import write_kubeconfig
from hami_sim.apiserver.server import ApiServer

log = logging.getLogger(__name__)

T = TypeVar("T")


async def start_site(server: ApiServer, host: str, port: int) -> tuple[web.BaseRunner, int]:
    """Serve `server` on host:port (0 picks a free port); returns the aiohttp runner and the port."""
    runner = web.ServerRunner(server.make_server(), shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    bound = runner.addresses[0][1]
    server.server_address = f"{host}:{bound}"
    return runner, int(bound)


class ApiServerRunner:
    """The API server on its own thread and event loop.

    >>> with ApiServerRunner() as api:          # doctest: +SKIP
    ...     api.base_url                         # 'http://127.0.0.1:40123'
    ...     api.write_kubeconfig("/tmp/kc")
    ...     api.counters()[("create", "pods", "")]

    The store belongs to the server's loop: read it through `call()` from other threads.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **server_options: Any) -> None:
        self.host = host
        self.port = port
        self.server = ApiServer(**server_options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.BaseRunner | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def store(self) -> Any:
        """The server's store (only safe to use from the server's loop; see `call`)."""
        return self.server.store

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the API server is not running")
        return self._loop

    def start(self, timeout: float = 10.0) -> str:
        """Start serving; returns the base URL (http://host:port)."""
        if self._thread is not None:
            return self.base_url
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="hami-sim-apiserver", daemon=True
        )
        self._thread.start()
        self.port = ready.result(timeout)
        return self.base_url

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: concurrent.futures.Future[int]) -> None:
        self._stopped = asyncio.Event()
        try:
            self._runner, port = await start_site(self.server, self.host, self.port)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(port)
        await self._stopped.wait()
        await self.server.close()
        await self._runner.cleanup()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: ends watch streams, closes the listening socket, joins the thread."""
        thread, loop, stopped = self._thread, self._loop, self._stopped
        if thread is None or loop is None:
            return
        if stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the API server thread did not stop within %.1fs", timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> ApiServerRunner:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 10.0) -> T:
        """Run `fn(*args)` on the server's loop and return its result (thread-safe store access)."""

        async def invoke() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(invoke(), self.loop).result(timeout)

    def counters(self) -> dict[tuple[str, str, str], int]:
        """Requests so far per (verb, resource, subresource), e.g. ("create", "pods", "binding")."""
        return self.call(self.server.stats.snapshot)

    def writes(self) -> int:
        """How many write requests (create/update/patch/delete/deletecollection) were served."""
        return self.call(self.server.stats.writes)

    def requests(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest requests, oldest first (see `RequestRecord.to_json`)."""
        items: list[dict[str, Any]] = self.call(self.server.stats.requests_json, limit)["items"]
        return items

    def reset_counters(self) -> None:
        self.call(self.server.stats.reset)

    def set_faults(self, config: FaultConfig | Mapping[str, Any]) -> None:
        """Replace the fault rules (a `FaultConfig`, or its JSON form as PUT /hami-sim/faults takes it;
        raises `FaultSpecError`)."""
        parsed = config if isinstance(config, FaultConfig) else parse_config(dict(config))
        self.call(self.server.set_faults, parsed)

    def clear_faults(self) -> None:
        self.call(self.server.faults.clear)

    def faults(self) -> dict[str, Any]:
        """The rules and the injections so far, as GET /hami-sim/faults answers."""
        answer: dict[str, Any] = self.call(self.server.faults.to_json)
        return answer

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, self.base_url)
