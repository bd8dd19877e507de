"""The HTTP(S) face of hami-control: one aiohttp low-level server, a small route table, the webhook,
health and readiness routes, and serving certificates that reload themselves when their files change.

Routes (more are added by later parts through `Routes.add`):

- `POST /webhook`: the mutating admission webhook. The body is read with a size limit (413 above it),
  handed to the pure `webhook.handle_admission_review`, and every decision is logged on one line.
- `POST /webhook/dra`, `POST /webhook/cpu`: the same route for the DRA overlay's entry and the
  fragmentation component's `cpu.hami.io` entry (`webhook.handle_cpu_admission_review`: pods that ask no
  GPU steered to hami-scheduler; it never denies, and its entry's failurePolicy is Ignore).
- `GET /healthz`: 200 while the process serves (liveness).
- `GET /readyz`: 200 once the watch caches have synced, 503 (with what is missing) before that.

Every connection is bounded by `hami_control.connections` (header and body read timeouts, idle and TLS
handshake timeouts, a connection cap); a body by its route's limit, read through `read_body`.

Certificates. `CertificateReloader` polls the certificate and key files (every 2 s by default). Polling
is used rather than inotify because it sees every way the files get replaced the same way: an in-place
write, an atomic rename, and the Kubernetes Secret volume's `..data` symlink swap (the file names stay,
the symlink under them moves; `stat` follows it). A changed pair is first loaded into a scratch
`SSLContext`; only when that works (the PEM parses, the key matches the certificate) is it loaded into the
LIVE context the listening socket uses. New handshakes then present the new certificate, and connections
already open keep theirs (OpenSSL copies the certificate into each connection at accept), so nothing is
dropped. A bad pair is logged once and the old certificate stays in service; the next change of either
file is tried again. Caveat: OpenSSL keeps one certificate per key type, so rotating from an RSA to an EC
key leaves the old RSA certificate loaded as well (clients that prefer RSA would still get it).
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import NameOID

from hami_control.connections import (
    BODY_DEADLINE_KEY,
    ConnectionLimits,
    ConnectionStats,
    LimitedConnection,
    LimitedServer,
    LimitedSite,
)

log = logging.getLogger(__name__)
decisions_log = logging.getLogger("hami_control.webhook.decisions")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

DEFAULT_MAX_BODY = 3 * 1024 * 1024
DEFAULT_RELOAD_INTERVAL_S = 2.0
DEFAULT_LIMITS = ConnectionLimits()


# --- structured log lines -------------------------------------------------------------------------------


def logfmt(fields: Mapping[str, object]) -> str:
    """`key=value` pairs on one line (None values left out, lists joined with "; "); a value with
    spaces, quotes, `=` or nothing in it is JSON-quoted."""
    parts: list[str] = []
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = f"{value:.3f}"
        elif isinstance(value, list | tuple):
            text = "; ".join(str(v) for v in value)
        else:
            text = str(value)
        if not text or any(c in text for c in _QUOTED):
            text = json.dumps(text, ensure_ascii=False)
        parts.append(f"{key}={text}")
    return " ".join(parts)


_QUOTED = frozenset(' "=\\\n\t')


# --- routes ---------------------------------------------------------------------------------------------


class Routes:
    """Exact-path routes: (method, path) -> handler. Unknown paths are 404, a known path with another
    method is 405 with an `Allow` header."""

    def __init__(self) -> None:
        self._table: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        methods = self._table.setdefault(path, {})
        method = method.upper()
        if method in methods:
            raise ValueError(f"route {method} {path} is already registered")
        methods[method] = handler

    def paths(self) -> list[str]:
        return sorted(self._table)

    async def dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        methods = self._table.get(request.path)
        if methods is None:
            return _text(404, f"no route for {request.path}")
        handler = methods.get(request.method)
        if handler is None and request.method == "HEAD":
            handler = methods.get("GET")
        if handler is None:
            allowed = ", ".join(sorted(methods))
            message = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
            return _text(405, message, allowed)
        return await handler(request)


def _text(status: int, text: str, allow: str | None = None) -> web.Response:
    headers = {"Allow": allow} if allow is not None else None
    return web.Response(status=status, text=text + "\n", content_type="text/plain", headers=headers)


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def read_body(request: web.BaseRequest, limit: int, *, limit_setting: str = "") -> bytes | web.Response:
    """The request body, or an error answer that closes the connection: 413 when the body is larger
    than `limit` bytes (judged from Content-Length before reading when the client sent one, else while
    reading, so no more than `limit` bytes are ever buffered; `limit_setting` names the setting in the
    message), 408 when it has not arrived by the request's body deadline (`--body-read-timeout` after the
    headers, set by `LimitedServer`)."""
    what = f"{request.method} {request.path}"
    length = request.content_length
    if length is not None and length > limit:
        return _closing(413, _too_large(what, f"of {length} bytes", limit, limit_setting))
    deadline = request.get(BODY_DEADLINE_KEY)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout_at(deadline[0] if deadline is not None else None):
            while chunk := await request.content.read(_READ_CHUNK):
                size += len(chunk)
                if size > limit:
                    return _closing(
                        413, _too_large(what, f"of more than {limit} bytes", limit, limit_setting)
                    )
                chunks.append(chunk)
    except TimeoutError:
        if isinstance(request.protocol, LimitedConnection):
            request.protocol.body_timed_out()
        seconds = deadline[1] if deadline is not None else 0.0
        return _closing(
            408,
            f"{what}: the request body did not arrive within {seconds:g} s of its headers ({size} bytes "
            f"received; --body-read-timeout)",
        )
    return b"".join(chunks)


_READ_CHUNK = 256 * 1024


def _too_large(what: str, size: str, limit: int, setting: str) -> str:
    named = f" ({setting})" if setting else ""
    return f"{what}: request body {size} is over the limit of {limit} bytes{named}"


def _closing(status: int, text: str) -> web.Response:
    """An error answer after which the connection is closed (the rest of the body is not wanted)."""
    response = _text(status, text)
    response.force_close()
    return response


# --- health and readiness ---------------------------------------------------------------------------------

ReadinessCheck = Callable[[], Mapping[str, bool]]
"""What /readyz asks: each part's name and whether it is ready (e.g. {"pods": True, "quotas": False})."""


def health_routes(routes: Routes, readiness: ReadinessCheck) -> None:
    async def healthz(_request: web.BaseRequest) -> web.StreamResponse:
        return _text(200, "ok")

    async def readyz(_request: web.BaseRequest) -> web.StreamResponse:
        parts = readiness()
        waiting = sorted(name for name, ready in parts.items() if not ready)
        if waiting:
            return _text(503, "not ready: waiting for " + ", ".join(waiting))
        return _text(200, "ok")

    routes.add("GET", "/healthz", healthz)
    routes.add("GET", "/readyz", readyz)


# --- the webhook route ------------------------------------------------------------------------------------

AdmissionHandler = Callable[[bytes], "WebhookAnswer | Awaitable[WebhookAnswer]"]
"""The body of a `POST /webhook` in, the answer out (`admission.admission_handler` adapts
`webhook.handle_admission_review`); an awaitable answer when the admission has to call out first (the
ResourceClaimTemplates of a pod translated to DRA)."""


@dataclass(frozen=True, slots=True)
class WebhookAnswer:
    """What the webhook route needs from the pure handler: the HTTP status, the JSON body, and the
    fields of the decision's log line (namespace, name, allowed, patch size or reason ...);
    `exception`, when the handler caught one, is logged with its traceback."""

    status: int
    body: object
    log_fields: Mapping[str, object]
    exception: BaseException | None = None


def webhook_route(
    routes: Routes, admit: AdmissionHandler, *, max_body: int = DEFAULT_MAX_BODY, path: str = "/webhook"
) -> None:
    """`POST <path>` (`/webhook`, and `/webhook/dra` for the namespaces that opted in to DRA): body
    (size-limited) -> `admit` -> JSON answer, one log line per decision.

    `admit` is called synchronously on the event loop: a quota check and the usage it assumes for the
    admitted pod happen without an await in between, so concurrent reviews cannot both take the last
    quota. What it must do after that (create templates) comes back as an awaitable answer."""

    async def webhook(request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        body = await read_body(request, max_body, limit_setting="--max-request-body")
        if isinstance(body, web.Response):
            decisions_log.warning(
                logfmt({"webhook": "rejected", "status": body.status, "reason": body.text or ""})
            )
            return body
        try:
            answer = admit(body)
            result = await answer if inspect.isawaitable(answer) else answer
        except Exception:
            log.exception("the webhook handler failed on a %d-byte review", len(body))
            return json_response({"error": "internal error in the admission webhook (see its log)"}, 500)
        if result.exception is not None or decisions_log.isEnabledFor(logging.INFO):
            fields: dict[str, object] = {"webhook": "decision", "status": result.status}
            fields.update(result.log_fields)
            fields["ms"] = (time.perf_counter() - started) * 1000.0
            if result.exception is not None:
                decisions_log.error(logfmt(fields), exc_info=result.exception)
            else:
                decisions_log.info(logfmt(fields))
        return json_response(result.body, result.status)

    routes.add("POST", path, webhook)


# --- the scheduler extender routes ---------------------------------------------------------------------

EXTENDER_MAX_BODY = 64 * 1024 * 1024
"""kube-scheduler without `nodeCacheCapable` sends whole Node objects: ~5 KB each, 25 MB at 5,000 nodes."""


class ExtenderVerbs(Protocol):
    """What the extender routes call (scheduling.Extender). `/filter` and `/prioritize` send the answers
    of `filter_json` and `prioritize_json` as they are: JSON already written (the same answers as
    `filter` and `prioritize` give as objects, written without building them)."""

    def filter_json(self, body: bytes) -> bytes: ...

    def prioritize_json(self, body: bytes) -> bytes: ...

    async def bind(self, body: bytes) -> object: ...


class CPUVerbs(Protocol):
    """What the second extender entry's routes call (scheduling.Extender): pods that ask no GPU."""

    def cpu_filter(self, body: bytes) -> object: ...

    def cpu_prioritize(self, body: bytes) -> object: ...


ExtenderGate = Callable[[], str | None]
"""Why this replica does not answer the extender now (e.g. "not leader"), or None when it does."""


def extender_routes(
    routes: Routes,
    verbs: ExtenderVerbs,
    *,
    gate: ExtenderGate | None = None,
    max_body: int = EXTENDER_MAX_BODY,
    cpu_verbs: CPUVerbs | None = None,
) -> None:
    """`POST /filter`, `/prioritize`, `/bind`: kube-scheduler's extender v1 JSON. Problems with a request
    come back in the verb's own answer shape (`Error`, or an empty priority list), with status 200, as
    kube-scheduler expects; only an oversized body gets 413. While `gate` gives a reason the verbs answer
    it and close the connection (so the next call reaches the leader through the Service), and
    `GET /readyz/extender` (which the extender Service's readiness probe asks) is 503 with it.
    `cpu_verbs`: also `POST /cpu-filter` and `/cpu-prioritize`, the fragmentation component's second
    extender entry (an `ignorable` one: an `Error` answer there, e.g. from the gate, makes kube-scheduler
    skip it for that pod, so pods asking no GPU never wait on hami-control)."""

    def refused(path: str, why: str) -> object:
        if path in {"/prioritize", "/cpu-prioritize"}:
            return []
        if path == "/bind":
            return {"Error": why}
        return {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": why,
        }

    def route(path: str, call: Callable[[bytes], Awaitable[object]]) -> None:
        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            body = await read_body(request, max_body)
            if isinstance(body, web.Response):
                return body
            why = gate() if gate is not None else None
            if why is not None:
                # Closed after the answer: the scheduler's next call opens a new connection, which the
                # extender Service sends to the replica that leads now (kube-proxy picks endpoints per
                # new connection; an established one stays with a replica that may never lead again).
                response = json_response(refused(path, why))
                response.force_close()
                return response
            try:
                answer = await call(body)
            except Exception:
                log.exception("extender %s failed on a %d-byte request", path, len(body))
                answer = refused(path, f"internal error in the extender's {path} (see its log)")
            if isinstance(answer, bytes):  # written already
                return web.Response(body=answer, content_type="application/json")
            try:
                return json_response(answer)
            except orjson.JSONEncodeError as err:  # /filter echoes the Nodes it was sent: orjson reads
                # 1,024 levels of nesting but writes 255, so a Node nested deeper cannot be sent back
                return json_response(refused(path, f"the answer cannot be written as JSON ({err})"))

        routes.add("POST", path, handler)

    async def filter_(body: bytes) -> object:
        return verbs.filter_json(body)

    async def prioritize(body: bytes) -> object:
        return verbs.prioritize_json(body)

    route("/filter", filter_)
    route("/prioritize", prioritize)
    route("/bind", verbs.bind)
    if cpu_verbs is not None:
        cpu = cpu_verbs

        async def cpu_filter(body: bytes) -> object:
            return cpu.cpu_filter(body)

        async def cpu_prioritize(body: bytes) -> object:
            return cpu.cpu_prioritize(body)

        route("/cpu-filter", cpu_filter)
        route("/cpu-prioritize", cpu_prioritize)

    async def extender_ready(_request: web.BaseRequest) -> web.StreamResponse:
        why = gate() if gate is not None else None
        return _text(503, f"not ready: {why}") if why else _text(200, "ok")

    routes.add("GET", "/readyz/extender", extender_ready)


MetricsRenderer = Callable[[], Awaitable[tuple[bytes, str]]]
"""(body, content type) of a Prometheus scrape."""


def metrics_route(routes: Routes, render: MetricsRenderer) -> None:
    """`GET /metrics`: Prometheus text, compressed when the scraper accepts it."""

    async def metrics(_request: web.BaseRequest) -> web.StreamResponse:
        body, content_type = await render()
        response = web.Response(body=body)  # bodies over 4 KiB are compressed off the loop
        response.headers["Content-Type"] = content_type
        response.enable_compression()  # gzip/deflate when the scraper accepts it (53 MB at 5,000 nodes)
        return response

    routes.add("GET", "/metrics", metrics)


# --- certificates -----------------------------------------------------------------------------------------


class CertificateError(Exception):
    """A certificate/key pair that cannot be served (the message names the files and the problem)."""


@dataclass(frozen=True, slots=True)
class CertificateInfo:
    """The served certificate, for logs and tests."""

    subject: str
    serial: int
    not_after: datetime.datetime

    def describe(self) -> str:
        until = self.not_after.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"subject {self.subject!r}, serial {self.serial:x}, valid until {until}"


def _certificate_info(cert_pem: bytes, where: str) -> CertificateInfo:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as err:
        raise CertificateError(f"{where}: not a PEM certificate ({err})") from None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    subject = str(names[0].value) if names else cert.subject.rfc4514_string()
    return CertificateInfo(subject, cert.serial_number, cert.not_valid_after_utc)


def _load_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` from bytes: the stdlib reads only files, so write them to a private temporary
    directory (0700, files 0600) for the call."""
    with tempfile.TemporaryDirectory(prefix="hami-control-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_path, key_path)


def new_server_context() -> ssl.SSLContext:
    """A server context as hami-control serves: TLS 1.2+, HTTP/1.1 offered over ALPN, no certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


_Stamp = tuple[int, int, int, int]


def _stamp(path: Path) -> _Stamp | None:
    """(device, inode, size, mtime ns) of what `path` resolves to (symlinks followed), None if absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class CertificateReloader:
    """Serves `cert_file`/`key_file` through `context` and reloads them into that same context when they
    change (see the module docstring). `load()` once at start-up (raises `CertificateError`), then
    `await run()` (or call `check()` yourself)."""

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        context: ssl.SSLContext | None = None,
        *,
        interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = context if context is not None else new_server_context()
        self.interval_s = interval_s
        self.current: CertificateInfo | None = None
        self.reloads = 0
        """Successful reloads after the first load."""
        self.failures = 0
        """Changed pairs that could not be loaded (the old certificate stayed)."""
        self._stamps: tuple[_Stamp | None, _Stamp | None] | None = None
        self._loaded: tuple[bytes, bytes] | None = None

    def _read(self) -> tuple[bytes, bytes]:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as err:
            raise CertificateError(f"cannot read {err.filename}: {err.strerror}") from None

    def _try(self, cert_pem: bytes, key_pem: bytes) -> CertificateInfo:
        """Check the pair on a scratch context, then load it into the live one."""
        where = f"{self.cert_file} / {self.key_file}"
        info = _certificate_info(cert_pem, str(self.cert_file))
        try:
            _load_pair(new_server_context(), cert_pem, key_pem)
        except ssl.SSLError as err:
            raise CertificateError(f"{where}: cannot be served: {err.reason or err}") from None
        _load_pair(self.context, cert_pem, key_pem)
        return info

    def load(self) -> CertificateInfo:
        """The first load (start-up): any problem raises `CertificateError`."""
        self._stamps = (_stamp(self.cert_file), _stamp(self.key_file))
        cert_pem, key_pem = self._read()
        info = self._try(cert_pem, key_pem)
        self._loaded = (cert_pem, key_pem)
        self.current = info
        log.info("serving certificate %s from %s", info.describe(), self.cert_file)
        return info

    def check(self) -> bool:
        """One poll: reload when either file changed; True when a new certificate was loaded."""
        stamps = (_stamp(self.cert_file), _stamp(self.key_file))
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            cert_pem, key_pem = self._read()
        except CertificateError as err:
            self.failures += 1
            log.warning("certificate reload: %s; still serving the previous certificate", err)
            return False
        if (cert_pem, key_pem) == self._loaded:
            return False
        try:
            info = self._try(cert_pem, key_pem)
        except CertificateError as err:
            self.failures += 1
            log.error("certificate reload: %s; still serving the previous certificate", err)
            return False
        self._loaded = (cert_pem, key_pem)
        self.current = info
        self.reloads += 1
        expired = info.not_after <= datetime.datetime.now(datetime.UTC)
        log.log(
            logging.WARNING if expired else logging.INFO,
            "certificate reloaded: now serving %s%s",
            info.describe(),
            " (ALREADY EXPIRED)" if expired else "",
        )
        return True

    async def run(self) -> None:
        """Poll forever (until cancelled)."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except Exception:
                log.exception("certificate reload failed unexpectedly; will try again")


# --- the server -------------------------------------------------------------------------------------------


class ControlServer:
    """The listening socket and its routes. `await start()`, then `await stop()`.

    `ssl_context` None serves plain HTTP (only with `--insecure-http`); otherwise the context is the live
    one a `CertificateReloader` keeps current. `limits` bound slow, idle and surplus connections
    (`hami_control.connections`); `stats` counts what they did."""

    def __init__(
        self,
        routes: Routes,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        max_body: int = DEFAULT_MAX_BODY,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        shutdown_timeout_s: float = 5.0,
    ) -> None:
        self.routes = routes
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.max_body = max_body
        self.limits = limits
        self.shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.ServerRunner | None = None
        self._server: LimitedServer | None = None

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_context is None else "https"

    @property
    def stats(self) -> ConnectionStats:
        """Connections open, timed out, evicted and refused since `start()` (zeros before)."""
        return self._server.guard.stats if self._server is not None else ConnectionStats()

    def make_server(self) -> LimitedServer:
        # aiohttp's client_max_size bounds request.read(); the routes read through read_body, which
        # applies each route's own limit while reading.
        return LimitedServer(
            self._handle, self.limits, client_max_size=self.max_body, ssl_context=self.ssl_context
        )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self.routes.dispatch(request)
        except asyncio.CancelledError:
            raise
        except web.HTTPException as exc:
            return _text(exc.status, exc.text or exc.reason)
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            return _text(500, "internal error (see the server log)")

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        server = self.make_server()
        runner = web.ServerRunner(server, shutdown_timeout=self.shutdown_timeout_s)
        await runner.setup()
        site = LimitedSite(runner, self.host or None, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._server = runner, server
        self.port = int(runner.addresses[0][1])
        paths = ", ".join(self.routes.paths())
        log.info("serving %s on %s://%s:%d", paths, self.scheme, self.host, self.port)
        return self.port

    async def stop(self) -> None:
        """Stop listening, let requests in flight finish (up to the shutdown timeout), close connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


__all__ = [
    "DEFAULT_MAX_BODY",
    "AdmissionHandler",
    "CertificateError",
    "CertificateInfo",
    "CertificateReloader",
    "ConnectionLimits",
    "ControlServer",
    "Handler",
    "ReadinessCheck",
    "Routes",
    "WebhookAnswer",
    "health_routes",
    "json_response",
    "logfmt",
    "new_server_context",
    "read_body",
    "webhook_route",
]
