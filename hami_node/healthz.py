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
"""

from __future__ import annotations

import logging
import socket
import threading
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Sequence[Probe]]
    pages: Mapping[str, Page]


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.0 (the default): one request per connection, so no handler thread lingers on a kept-alive
    # connection after the probe.

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
    ) -> None:
        self._address = (host, port)
        self._pages = dict(pages or {})
        self._poll_interval_s = poll_interval_s
        self._routes: dict[str, Sequence[Probe]] = {"/healthz": tuple(live), "/readyz": tuple(ready)}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the real one when started with port 0); 0 before `start()`."""
        return int(self._server.server_address[1]) if self._server is not None else 0

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


__all__ = ["Check", "HealthServer", "HealthServerError", "Page", "Probe", "evaluate"]
