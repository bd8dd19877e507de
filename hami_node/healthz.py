"""The node daemon's HTTP health endpoint, for kubelet's liveness and readiness probes.

- `GET /healthz` (liveness): 200 `ok` while every liveness check passes; in the daemon that is "the
  device plugin's gRPC server is serving". Kubelet restarts the container after `failureThreshold`
  consecutive failures, so a short gap (a kubelet restart re-serves within milliseconds; a failed
  registration retries after at most 30 s) must be covered by the probe's threshold, not by this code.
- `GET /readyz` (readiness): 200 once every readiness check passes (registered with kubelet, and the GPU
  inventory annotation written on the Node at least once); otherwise 503 with one line per check that
  fails, saying what is missing. `HEAD` answers the same without a body.
- Pages (`pages`): `GET /metrics` answers the node's Prometheus metrics (`hami_node.monitor.exporter`)
  on the same port; a page that raises answers 500 with the exception.
- Anything else: 404 (unknown path) or 501 (other methods, from `http.server`).

A check is a function returning None when it passes, or the reason it does not; a check that raises
fails with the exception in its reason. The server is stdlib `ThreadingHTTPServer` on its own thread
(one short-lived thread per probe); requests are logged at debug level only, since kubelet probes every
few seconds.

Slow and surplus clients (the limits of hami-control's server, `hami_control.connections`, for a thread
per connection): a connection must send its whole request within `header_timeout_s` (15 s, HAMi's
`ReadHeaderTimeout`) of being accepted, measured across every read, so a client sending a byte at a time
cannot hold its thread longer; at most `max_connections` (64) are served at once, and a new connection
over that evicts the one that has waited longest for its request (kubelet's probe, which sends its
request at once, is never the one waiting longest), or is refused when every connection is past its
request line and headers.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""None when the check passes, otherwise why it does not (e.g. "not registered with kubelet")."""
Page = Callable[[], tuple[str, bytes]]
"""A page's (content type, body), built per request."""


@dataclass(frozen=True, slots=True)
class Probe:
    """A named check; the name prefixes its reason in a 503 body (`plugin: not serving`)."""

    name: str
    check: Check

    def run(self) -> str | None:
        try:
            reason = self.check()
        except Exception as err:
            log.exception("health check %s failed", self.name)
            return f"{self.name}: check failed: {err!r}"
        return None if reason is None else f"{self.name}: {reason}"


class HealthServerError(Exception):
    """The endpoint cannot listen (address in use, unknown host, no permission); the message says where."""


def evaluate(probes: Sequence[Probe]) -> tuple[HTTPStatus, str]:
    """(HTTP status, body) for a set of probes: 200 `ok`, or 503 with one line per failing probe."""
    failures = [reason for probe in probes if (reason := probe.run()) is not None]
    if not failures:
        return HTTPStatus.OK, "ok\n"
    return HTTPStatus.SERVICE_UNAVAILABLE, "".join(f"{line}\n" for line in failures)


DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_MAX_CONNECTIONS = 64


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side where every read waits at most until one deadline: the request as a whole
    must arrive by then, however it is split (a per-read socket timeout would let a byte every few
    seconds through)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive within the header timeout")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Sequence[Probe]]
    pages: Mapping[str, Page]
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def server_activate(self) -> None:
        self._lock = threading.Lock()
        self._active: set[socket.socket] = set()
        self._reading: dict[socket.socket, None] = {}
        """Connections still reading their request, oldest first."""
        self.evicted = 0
        self.refused = 0
        super().server_activate()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Admit a connection under the cap; over it evict the oldest still reading, or refuse."""
        with self._lock:
            if len(self._active) >= self.max_connections:
                victim = next(iter(self._reading), None)
                if victim is None:
                    self.refused += 1
                    log.warning("health endpoint: connection refused, %d connections open", len(self._active))
                    return False
                self.evicted += 1
                self._forget(victim)
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)  # its thread's read returns; the thread ends
            self._active.add(request)
            self._reading[request] = None
            return True

    def request_read(self, request: socket.socket) -> None:
        with self._lock:
            self._reading.pop(request, None)

    def _forget(self, request: socket.socket) -> None:
        self._active.discard(request)
        self._reading.pop(request, None)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._lock:
                self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._forget(request)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.0 (the default): one request per connection, so no handler thread lingers on a kept-alive
    # connection after the probe.

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        deadline = time.monotonic() + self.server.header_timeout_s
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.server.request_read(self.connection)
        return parsed

    def _answer(self, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        probes = self.server.routes.get(path)
        page = self.server.pages.get(path)
        content_type = "text/plain; charset=utf-8"
        if page is not None:
            try:
                content_type, body = page()
                status = HTTPStatus.OK
            except Exception as err:
                log.exception("page %s failed", path)
                status, body = HTTPStatus.INTERNAL_SERVER_ERROR, f"{path}: {err!r}\n".encode()
                content_type = "text/plain; charset=utf-8"
        elif probes is None:
            known = " or ".join([*self.server.routes, *self.server.pages])
            status, body = HTTPStatus.NOT_FOUND, f"no such path {path!r}; try {known}\n".encode()
        else:
            status, text = evaluate(probes)
            body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health endpoint %s: " + format, self.client_address[0], *args)


class HealthServer:
    """`GET /healthz` over `live` and `GET /readyz` over `ready` on `host:port` ("" = every address,
    port 0 = a free port). `start()` binds (raising `HealthServerError`) and serves on a thread;
    `stop()` closes the socket and joins the thread (within `poll_interval_s`). One use."""

    def __init__(
        self,
        host: str,
        port: int,
        live: Sequence[Probe],
        ready: Sequence[Probe],
        *,
        pages: Mapping[str, Page] | None = None,
        poll_interval_s: float = 0.5,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._address = (host, port)
        self._pages = dict(pages or {})
        self._poll_interval_s = poll_interval_s
        self._header_timeout_s = header_timeout_s
        self._max_connections = max_connections
        self._routes: dict[str, Sequence[Probe]] = {"/healthz": tuple(live), "/readyz": tuple(ready)}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the real one when started with port 0); 0 before `start()`."""
        return int(self._server.server_address[1]) if self._server is not None else 0

    @property
    def evicted(self) -> int:
        """Connections closed to make room for a new one (over `max_connections`)."""
        return self._server.evicted if self._server is not None else 0

    @property
    def refused(self) -> int:
        """Connections refused over `max_connections` (none was still reading its request)."""
        return self._server.refused if self._server is not None else 0

    def start(self) -> None:
        if self._server is not None or self._thread is not None:
            raise RuntimeError("health server already started")
        host, port = self._address
        cls = _IPv6Server if ":" in host else _Server
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            server = cls((host, port), _Handler)
        except OSError as err:
            raise HealthServerError(
                f"health endpoint --health-bind {shown}: cannot listen: {err.strerror or err}"
            ) from None
        server.routes = self._routes
        server.pages = self._pages
        server.header_timeout_s = self._header_timeout_s
        server.max_connections = self._max_connections
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": self._poll_interval_s},
            name="hami-node-healthz",
            daemon=True,
        )
        self._thread.start()
        paths = ", ".join([*self._routes, *self._pages])
        log.info("health endpoint on %s:%d (%s)", host or "*", self.port, paths)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket. Idempotent."""
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is None:
            return
        server.shutdown()  # returns once serve_forever has
        server.server_close()
        if thread is not None:
            thread.join(timeout_s)


__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "Check",
    "HealthServer",
    "HealthServerError",
    "Page",
    "Probe",
    "evaluate",
]
