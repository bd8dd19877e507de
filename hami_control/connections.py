"""Connection limits of hami-control's HTTP(S) server: what keeps slow or idle clients from taking the
webhook, the scheduler extender, /metrics and the health routes away from the clients they serve.

aiohttp's low-level server bounds the request line and headers (`max_line_size`, `max_field_size`,
`max_headers`: 8190 bytes a line, 128 headers, so at most about 1 MiB of headers, Go's `MaxHeaderBytes`
default) and closes a connection idle between requests (`keepalive_timeout`). It has no read timeout on
the server side, no TLS handshake timeout option in `TCPSite` and no cap on connections. This module adds
them in the thinnest layer that sees connections: a `RequestHandler` subclass (the protocol aiohttp makes
per connection), a small protocol that counts a TLS connection before its handshake and then upgrades it
(`TlsGate`), the `web.Server` that makes them, and a site serving that server.

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
- `tls_handshake_timeout_s` (10 s): asyncio's `ssl_handshake_timeout` in `start_tls` (its default is 60 s);
  Go's `http.Transport.TLSHandshakeTimeout` default is 10 s.
- `max_connections` (1024): open connections, counted from the moment one is accepted (its TLS handshake
  included). A new connection over the cap evicts the connection that has waited longest for its request
  headers, if that one has waited at least `evict_after_s` (1 s); otherwise the new one is refused at once,
  before any TLS work (closed).

Why evict rather than only refuse: kube-apiserver calls the webhook, and kube-scheduler the extender, over
pooled keep-alive connections (Go's Transport), but a burst of pod creations opens new connections beyond
the idle pool. A server that only refused new connections at its cap would let an attacker who holds the
cap fail those admissions (failurePolicy Fail) or skip them (Ignore). Evicting a connection that has been
waiting for its headers for a second (an honest client sends them right after its handshake) frees a slot
for them, and never touches a connection that is answering a request or idles between requests (the
honest clients' pools, whose requests are what the limits protect). The 1 s wait bounds the churn: an
attacker reconnecting at once can make the server do at most `max_connections` TLS handshakes a second
(and pays one per connection too); beyond that it is refused before the handshake, which costs an accept
and a close. That is why TLS is done by this module's `TlsGate` (`loop.start_tls`) and not by the
listening socket: asyncio would run the handshake before the application sees the connection.

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
DEFAULT_EVICT_AFTER_S = 1.0
"""A connection waiting this long for its headers may be evicted at the cap. An honest client sends its
headers right after the handshake (well under 1 s); the wait bounds the evictions, and so the TLS
handshakes an attacker who reconnects at once can make the server do, to `max_connections` a second."""

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
    evict_after_s: float = DEFAULT_EVICT_AFTER_S
    """How long a connection must have waited for its headers before a new one may evict it (no setting:
    see `DEFAULT_EVICT_AFTER_S`)."""

    def __post_init__(self) -> None:
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "idle_timeout_s",
            "tls_handshake_timeout_s",
            "evict_after_s",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"ConnectionLimits.{name}: expected seconds > 0, got {value!r}")
        if self.max_connections < 1:
            raise ValueError(f"ConnectionLimits.max_connections: expected >= 1, got {self.max_connections}")


@dataclass(slots=True)
class ConnectionStats:
    """What the limits did since the server started (for logs, tests, benchmarks and the metrics
    `hami_control_connections_*`, `metrics.ControlMetrics.watch_connections`)."""

    open: int = 0
    """Connections open now, those in their TLS handshake included (what `max_connections` caps)."""
    peak: int = 0
    accepted: int = 0
    """Connections counted in (not refused at the cap)."""
    header_timeouts: int = 0
    body_timeouts: int = 0
    tls_handshake_timeouts: int = 0
    """TLS handshakes not done within `tls_handshake_timeout_s` (the connection is dropped)."""
    tls_handshake_failures: int = 0
    """TLS handshakes that failed otherwise (not TLS, a bad certificate, the client left midway)."""
    evicted: int = 0
    refused: int = 0


class ConnectionGuard:
    """The open connections (a `TlsGate` while its handshake runs, then its `LimitedConnection`) and the
    ones waiting for request headers (oldest first), shared by every connection of one server."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.stats = ConnectionStats()
        self._open: set[object] = set()
        self._handshaking: set[TlsGate] = set()
        self._waiting: dict[LimitedConnection, float] = {}
        """Connections whose header timer runs, with the loop time it started, oldest first."""

    def admit(self, conn: object) -> bool:
        """Count a new connection; at the cap, evict the connection waiting longest for its headers (if
        it has waited `evict_after_s`), or refuse `conn` (False)."""
        if len(self._open) >= self.limits.max_connections:
            victim = next(iter(self._waiting.items()), None)
            if victim is None or asyncio.get_running_loop().time() - victim[1] < self.limits.evict_after_s:
                self.stats.refused += 1
                log.debug("connection refused: %d connections open (--max-connections)", len(self._open))
                return False
            self.stats.evicted += 1
            victim[0].drop("evicted: a new connection arrived at --max-connections")
        self._open.add(conn)
        if isinstance(conn, TlsGate):
            self._handshaking.add(conn)
        self.stats.accepted += 1
        self.stats.open = len(self._open)
        self.stats.peak = max(self.stats.peak, self.stats.open)
        return True

    def handover(self, gate: TlsGate, conn: LimitedConnection) -> None:
        """`gate`'s handshake is done: its slot is `conn`'s now."""
        self._handshaking.discard(gate)
        self._open.discard(gate)
        self._open.add(conn)

    def waiting(self, conn: LimitedConnection, waits: bool) -> None:
        if waits:
            self._waiting[conn] = asyncio.get_running_loop().time()
        else:
            self._waiting.pop(conn, None)

    def release(self, conn: object) -> None:
        if isinstance(conn, LimitedConnection):
            self._waiting.pop(conn, None)
        elif isinstance(conn, TlsGate):
            self._handshaking.discard(conn)
        self._open.discard(conn)
        self.stats.open = len(self._open)

    def abort_handshakes(self) -> None:
        """Drop every connection still in its TLS handshake (the server shuts down)."""
        for gate in list(self._handshaking):
            gate.abort()


class LimitedConnection(RequestHandler):
    """aiohttp's per-connection protocol with a header timer: started when the connection is made and
    at the first byte after a request was answered, stopped when a request's headers are complete
    (`headers_complete`, called by the server's request factory)."""

    __slots__ = ("_admitted", "_early", "_guard", "_header_timer", "_in_request", "_made")

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, admitted: bool, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = admitted
        """True when its `TlsGate` already counted it (TLS); else `connection_made` does (plain HTTP)."""
        self._made = False
        self._early: list[bytes] = []
        """Bytes asyncio's TLS layer handed over before `connection_made` (it reads right after the
        handshake, before `start_tls` returns the transport), replayed once made."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made = True
        super().connection_made(transport)
        if not self._admitted and not self._guard.admit(self):
            transport.abort()  # type: ignore[attr-defined]  # a Transport: abort() without close_notify
            self.force_close()
            return
        self._start_header_timer()
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if not self._made:
            self._early.append(data)
            return
        if self._header_timer is None and not self._in_request and self.transport is not None:
            self._start_header_timer()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        self._guard.release(self)
        if self._made:  # asyncio's TLS layer reports a failed handshake to a protocol never made
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


class TlsGate(asyncio.Protocol):
    """What a TLS connection is until its handshake is done: counted against the cap from the moment it
    is accepted (a connection over the cap is refused before any TLS work), then upgraded with
    `loop.start_tls` (bounded by the handshake timeout) and handed to its `LimitedConnection`."""

    def __init__(self, server: LimitedServer, context: ssl.SSLContext) -> None:
        self._server = server
        self._context = context
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._server.guard.admit(self):
            transport.abort()
            return
        transport.pause_reading()  # the ClientHello waits in the socket for start_tls
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        guard = self._server.guard
        if transport.is_closing():  # the client left before the handshake began
            guard.release(self)
            return
        conn = self._server.connection(admitted=True)
        loop = asyncio.get_running_loop()
        timeout = guard.limits.tls_handshake_timeout_s
        started = loop.time()
        try:
            tls = await loop.start_tls(
                transport,
                conn,
                self._context,
                server_side=True,
                ssl_handshake_timeout=timeout,
                ssl_shutdown_timeout=timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as err:
            log.debug("TLS handshake failed: %r", err)
            # asyncio reports its handshake timeout as a ConnectionAbortedError ("SSL handshake is taking
            # longer than ..."), so a timeout is told by the time it took (asyncio's timer may fire up to
            # its clock resolution early, hence the millisecond of slack).
            if loop.time() - started >= timeout - 1e-3:
                guard.stats.tls_handshake_timeouts += 1
            else:
                guard.stats.tls_handshake_failures += 1
            guard.release(self)
            transport.abort()
            return
        if tls is None or transport.is_closing():
            guard.release(self)
            transport.abort()
            return
        guard.handover(self, conn)
        conn.connection_made(tls)

    def connection_lost(self, exc: BaseException | None) -> None:
        """Only while no TLS layer took over the transport (a refused connection, or one closed before
        `start_tls` began); later the TLS layer gets it."""
        self._server.guard.release(self)

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()
        self._server.guard.release(self)


RequestCallable = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class LimitedServer(web.Server):
    """aiohttp's low-level server making `LimitedConnection`s, behind a `TlsGate` when `ssl_context` is
    given. `client_max_size` is aiohttp's own cap on a body read at once (the routes' limits are checked
    by `read_body`)."""

    def __init__(
        self,
        handler: RequestCallable,
        limits: ConnectionLimits,
        *,
        client_max_size: int,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.guard = ConnectionGuard(limits)
        self.ssl_context = ssl_context

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

    def connection(self, *, admitted: bool) -> LimitedConnection:
        return LimitedConnection(
            self, loop=self._loop, guard=self.guard, admitted=admitted, **self._handler_options
        )

    def __call__(self) -> RequestHandler:
        """The listening socket's protocol factory (a `TlsGate` stands in for the handler under TLS)."""
        if self.ssl_context is not None:
            return TlsGate(self, self.ssl_context)  # type: ignore[return-value]
        return self.connection(admitted=False)

    def pre_shutdown(self) -> None:
        self.guard.abort_handshakes()
        super().pre_shutdown()


class LimitedSite(web.BaseSite):
    """A TCP site as `web.TCPSite`, serving `LimitedServer`'s protocols (TLS is the server's `TlsGate`,
    not the listening socket's)."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *, backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        return f"tcp://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            server, self._host, self._port, backlog=self._backlog, reuse_address=True
        )


__all__ = [
    "BODY_DEADLINE_KEY",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_EVICT_AFTER_S",
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
    "TlsGate",
]
