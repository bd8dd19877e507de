"""Connection limits of hami-control's HTTP(S) server: what keeps slow or idle clients from taking the
webhook, the scheduler extender, /metrics and the health routes away from the clients they serve.

aiohttp's low-level server bounds the request line and headers (`max_line_size`, `max_field_size`,
`max_headers`: 8190 bytes a line, 128 headers, so at most about 1 MiB of headers, Go's `MaxHeaderBytes`
default) and closes a connection idle between requests (`keepalive_timeout`). It has no read timeout on
the server side, no TLS handshake timeout option in `TCPSite` and no cap on connections. This module adds
them in the thinnest layer that sees connections: a `RequestHandler` subclass (the protocol aiohttp makes
per connection), the `web.Server` that makes it, and a site that passes the handshake timeout to
`loop.create_server`.

The limits and their defaults, next to the Go servers a cluster admin knows:

- `header_timeout_s` (15 s): a connection that has not sent a complete request line and headers this long
  after it was accepted (after the TLS handshake), or after the first byte of a later request on a kept-alive
  connection, is closed (reset, no answer). That is Go's `ReadHeaderTimeout`; HAMi's scheduler serves with
  15 s (HAMi cmd/scheduler/main.go), kube-apiserver and controller-runtime's webhook server with 32 s
  (k8s.io/apiserver/pkg/server/secure_serving.go, controller-runtime pkg/internal/httpserver/server.go).
  15 s is above any honest client's header time by orders of magnitude and above the webhook's default
  timeout (10 s), so nothing honest is cut.
- `body_timeout_s` (30 s): the body must arrive within this long after the headers; the handler gets a 408
  and the connection is closed. Go has only `ReadTimeout` for the whole request (HAMi: 60 s); 30 s is the
  longest a caller waits for its answer anyway (kube-apiserver's webhook timeoutSeconds is at most 30 s,
  HAMi's chart gives the extender an httpTimeout of 30 s), so a body still arriving later belongs to a
  request its caller has given up.
- `idle_timeout_s` (90 s): a kept-alive connection with no request for this long is closed (aiohttp's
  `keepalive_timeout`; Go's `IdleTimeout`, 90 s in kube-apiserver and controller-runtime, matching the
  idle timeout of Go's `http.DefaultTransport` that kube-apiserver and kube-scheduler call us with).
- `tls_handshake_timeout_s` (10 s): asyncio's `ssl_handshake_timeout` (its default is 60 s); Go's
  `http.Transport.TLSHandshakeTimeout` default is 10 s.
- `max_connections` (1024): open connections (counted once their TLS handshake is done). A new connection
  over the cap first evicts the connection that has waited longest for its request headers (a slow or
  silent client); only when no connection is waiting for headers (all are serving requests or idle between
  them) is the new one refused (closed at once).

Why evict rather than refuse: kube-apiserver calls the webhook, and kube-scheduler the extender, over
pooled keep-alive connections (Go's Transport), but a burst of pod creations opens new connections beyond
the idle pool. A server that refuses new connections at its cap would let an attacker who holds the cap
fail those admissions (failurePolicy Fail) or skip them (Ignore). Evicting the oldest connection that is
still waiting for its headers serves every honest client whose headers arrive within the time it takes
`max_connections` newer connections to be accepted, and never touches a connection that is answering a
request or idles between requests (the honest clients' pools). Connections in their TLS handshake are not
counted (the application sees a connection only once its handshake is done); they are bounded by the
handshake timeout and the process's file limit.

Per-connection request limits (Go has none) are not needed: each request is bounded by these timeouts and
the route's body limit, and aiohttp handles one request of a connection at a time.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_IDLE_TIMEOUT_S = 90.0
DEFAULT_TLS_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1024

BODY_DEADLINE_KEY = web.RequestKey("hami_control.body_deadline", tuple[float, float])
"""The request's state key holding (loop time by which its body must have arrived, the body timeout in
seconds), for `server.read_body`."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The server's connection limits (see the module docstring for each default's reason)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    tls_handshake_timeout_s: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "tls_handshake_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"ConnectionLimits.{name}: expected seconds > 0, got {value!r}")
        if self.max_connections < 1:
            raise ValueError(f"ConnectionLimits.max_connections: expected >= 1, got {self.max_connections}")


@dataclass(slots=True)
class ConnectionStats:
    """What the limits did since the server started (for logs, tests and benchmarks)."""

    open: int = 0
    peak: int = 0
    accepted: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    evicted: int = 0
    refused: int = 0


class ConnectionGuard:
    """The open connections and the ones waiting for request headers (oldest first), shared by every
    connection of one server."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.stats = ConnectionStats()
        self._open: set[LimitedConnection] = set()
        self._waiting: dict[LimitedConnection, None] = {}
        """Connections whose header timer runs, in the order the timers started (dicts keep it)."""

    def admit(self, conn: LimitedConnection) -> bool:
        """Count a new connection; at the cap, evict the connection waiting longest for its headers, or
        refuse `conn` (False) when none waits."""
        if len(self._open) >= self.limits.max_connections:
            victim = next(iter(self._waiting), None)
            if victim is None:
                self.stats.refused += 1
                log.warning(
                    "connection refused: %d connections open (--max-connections), none waiting for headers",
                    len(self._open),
                )
                return False
            self.stats.evicted += 1
            victim.drop("evicted: a new connection arrived at --max-connections")
        self._open.add(conn)
        self.stats.accepted += 1
        self.stats.open = len(self._open)
        self.stats.peak = max(self.stats.peak, self.stats.open)
        return True

    def waiting(self, conn: LimitedConnection, waits: bool) -> None:
        if waits:
            self._waiting[conn] = None
        else:
            self._waiting.pop(conn, None)

    def release(self, conn: LimitedConnection) -> None:
        self._waiting.pop(conn, None)
        self._open.discard(conn)
        self.stats.open = len(self._open)


class LimitedConnection(RequestHandler):
    """aiohttp's per-connection protocol with a header timer: started when the connection is made and
    at the first byte after a request was answered, stopped when a request's headers are complete
    (`headers_complete`, called by the server's request factory)."""

    __slots__ = ("_guard", "_header_timer", "_in_request")

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self._guard.admit(self):
            transport.abort()  # type: ignore[attr-defined]  # a Transport: abort() without close_notify
            self.force_close()
            return
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and not self._in_request and self.transport is not None:
            self._start_header_timer()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        self._guard.release(self)
        super().connection_lost(exc)

    def headers_complete(self) -> None:
        """A request's line and headers are parsed: its handler runs now."""
        self._stop_header_timer()
        self._in_request = True

    def request_done(self) -> None:
        """The handler answered; the next byte starts the header timer again (a request already parsed
        while this one ran, pipelined, reaches `headers_complete` without one)."""
        self._in_request = False

    def body_timed_out(self) -> None:
        """`read_body` gave up on this connection's body (it answers 408 and closes)."""
        self._guard.stats.body_timeouts += 1

    def drop(self, why: str) -> None:
        """Close the connection at once (no TLS close_notify, nothing more read or written)."""
        self._stop_header_timer()
        self._guard.release(self)
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.debug("connection from %s dropped: %s", peer, why)
        if self.transport is not None:
            self.transport.abort()
        self.force_close()

    def _start_header_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self._guard.limits.header_timeout_s, self._header_timeout)
        self._guard.waiting(self, True)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._guard.waiting(self, False)

    def _header_timeout(self) -> None:
        self._header_timer = None
        self._guard.stats.header_timeouts += 1
        self.drop(f"no complete request headers within {self._guard.limits.header_timeout_s:g} s")


RequestCallable = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class LimitedServer(web.Server):
    """aiohttp's low-level server making `LimitedConnection`s. `client_max_size` is aiohttp's own cap on
    a body read at once (the routes' limits are checked by `read_body`)."""

    def __init__(self, handler: RequestCallable, limits: ConnectionLimits, *, client_max_size: int) -> None:
        self.guard = ConnectionGuard(limits)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                if isinstance(request.protocol, LimitedConnection):
                    request.protocol.request_done()

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            loop = asyncio.get_running_loop()
            request = web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=client_max_size
            )
            if isinstance(protocol, LimitedConnection):
                protocol.headers_complete()
            request[BODY_DEADLINE_KEY] = (loop.time() + limits.body_timeout_s, limits.body_timeout_s)
            return request

        super().__init__(handle, request_factory=make_request)
        self._handler_options: dict[str, Any] = {
            "keepalive_timeout": limits.idle_timeout_s,
            "lingering_time": min(10.0, limits.body_timeout_s),  # aiohttp reads an unread body this long
            "access_log": None,
        }

    def __call__(self) -> RequestHandler:
        return LimitedConnection(self, loop=self._loop, guard=self.guard, **self._handler_options)


class LimitedSite(web.BaseSite):
    """A TCP site as `web.TCPSite`, with the TLS handshake timeout passed to `loop.create_server`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        tls_handshake_timeout_s: float,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._handshake_timeout_s = tls_handshake_timeout_s

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            tls = {
                "ssl_handshake_timeout": self._handshake_timeout_s,
                "ssl_shutdown_timeout": self._handshake_timeout_s,
            }
        self._server = await loop.create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            **tls,
        )


__all__ = [
    "BODY_DEADLINE_KEY",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_TLS_HANDSHAKE_TIMEOUT_S",
    "ConnectionGuard",
    "ConnectionLimits",
    "ConnectionStats",
    "LimitedConnection",
    "LimitedServer",
    "LimitedSite",
]
