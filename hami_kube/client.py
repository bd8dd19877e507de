"""One HTTP client for the Kubernetes API, asyncio, answers as plain JSON dicts.

Credentials come from `hami_kube.config` (a kubeconfig file, the files in $KUBECONFIG, or the pod's
service account in a cluster): tokens, token files, client certificates, basic auth and exec plugins,
refreshed as they expire, without importing the official `kubernetes` package (only an `auth-provider`
user falls back to its loader). The requests go over one plain `aiohttp` session and the answers are
parsed with orjson into plain Kubernetes JSON dicts: the official client's pydantic models would cost
~70 µs per pod and an object graph the pure modules do not want (they take dicts).

Every call has a timeout (total and connect) that covers its retries; a watch has a read timeout far
beyond the bookmark interval instead, so a silent dead stream ends. A 401 makes the credentials refresh
(an exec plugin re-runs, a token file is re-read) and the call is retried once with the new ones.
Failures are `KubeApiError`: the HTTP status and the metav1.Status reason and message, or status 0 and
the transport error for no answer. Create the client inside the event loop that will use it
(`await KubeApi.connect(...)`), `await close()` at the end.

Client-side rate limiting and retries, as client-go's rest client (rest/request.go, rest/with_retry.go):

- Every request waits for a token of one token bucket (`qps` a second, `burst` at once; client-go's
  defaults 5 and 10; qps <= 0 turns it off) before its timeout starts, so a throttled caller never
  times out before its first try. Opening a watch takes no token (request.go `Watch`: "We specifically
  don't want to rate limit watches"); every retry, of a request or of a watch's opening, takes one.
- A 429 or any 5xx whose `Retry-After` header is a whole number of seconds is retried after that long,
  for every verb (the body is bytes, so it can be sent again), up to `max_retries` (10) times and never
  past the call's timeout. Without the header the answer is final, as in client-go.
- A GET whose connection was reset or closed before the answer (EOF-like: client-go's
  `IsConnectionReset`/`IsProbableEOF`) is retried after 1 s (client-go's artificial `Retry-After: 1`);
  the opening of a watch also on a timeout (`IsProbableEOF || IsTimeout`). Writes are not retried on a
  transport error: the server may have applied them. Below this, aiohttp sends an idempotent request
  (GET, PUT, DELETE) again at once when its connection was closed under it, once, as Go's transport
  does for a replayable request on a connection the server closed.

Every request carries a `User-Agent` in client-go's shape (`component_user_agent()`), naming the
component, so the API server's logs, audit and fault rules can tell hami-node from hami-control.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import platform
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from hami_kube.config import Credentials, load_credentials
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.flowcontrol import DEFAULT_BURST, DEFAULT_QPS, RateLimiter, rate_limiter

log = logging.getLogger(__name__)

JSONDict = dict[str, Any]

MAX_RETRIES = 10
"""client-go's rest.Request maxRetries: how many times a call is sent again after a Retry-After."""
TRANSPORT_RETRY_AFTER_S = 1.0
"""The wait before a GET lost to a reset connection is sent again (client-go with_retry.go
`retryAfterResponse`: an artificial `Retry-After: 1`)."""


_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "i686": "386"}


@functools.cache
def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hami-py")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def component_user_agent(component: str) -> str:
    """`<component>/<hami-py version> (<os>/<arch>) hami-py`, client-go's User-Agent shape
    (rest/config.go DefaultKubernetesUserAgent: `<binary>/<version> (<os>/<arch>) kubernetes/<commit>`),
    with Go's names for the OS and architecture, e.g. `hami-node/0.1.0 (linux/amd64) hami-py`."""
    machine = platform.machine().lower()
    os_name = "darwin" if sys.platform == "darwin" else sys.platform.rstrip("0123456789")
    return f"{component}/{_version()} ({os_name}/{_GO_ARCH.get(machine, machine or 'unknown')}) hami-py"


DEFAULT_COMPONENT = "hami-kube"
"""The component named by a client that names none."""


def _status_of(body: bytes) -> tuple[str, str]:
    """(reason, message) of a metav1.Status body, or ("", the text)."""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", body.decode(errors="replace")[:500]
    if isinstance(status, dict):
        return str(status.get("reason") or ""), str(status.get("message") or "")
    return "", str(status)[:500]


def _transport(err: BaseException) -> KubeApiError:
    return KubeApiError(0, type(err).__name__, str(err) or type(err).__name__)


_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def probable_eof(err: BaseException) -> bool:
    """The connection was reset or closed before the whole answer came (apimachinery util/net
    `IsConnectionReset` / `IsProbableEOF`): the server went away mid-call, e.g. a kube-apiserver shutting
    down. A refused connection or a timeout is not."""
    if isinstance(err, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return True
    if isinstance(err, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return True
    return isinstance(err, OSError) and err.errno in _RESET_ERRNOS


async def _throttle(limiter: RateLimiter | None) -> None:
    if limiter is not None:
        await limiter.wait()


def _is_timeout(err: BaseException) -> bool:
    return isinstance(err, TimeoutError | aiohttp.ServerTimeoutError)


def retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """The seconds to wait before sending a call again whose answer was `status` with `headers`, or None
    when it is final: only a 429 or 5xx carrying `Retry-After` as whole seconds is retried
    (client-go with_retry.go `checkWait`, request.go `retryAfterSeconds`; an HTTP date is not read)."""
    if status != 429 and status < 500:
        return None
    text = headers.get("Retry-After")
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        return None
    return float(int(text))


class PatchType(StrEnum):
    """The Content-Type of a PATCH, which says how the API server applies it (the three kubectl's
    `--type` names: merge, strategic, json)."""

    MERGE = "application/merge-patch+json"
    """RFC 7386: maps merge, a list replaces the whole list, null deletes a key."""
    STRATEGIC = "application/strategic-merge-patch+json"
    """Kubernetes' own: lists with a merge key (conditions by type, containers by name) merge by it."""
    JSON = "application/json-patch+json"
    """RFC 6902: a list of operations (add, remove, replace, test ...) at JSON pointers."""


def binding(
    namespace: str, name: str, node: str, *, uid: str = "", annotations: Mapping[str, str] | None = None
) -> JSONDict:
    """A core/v1 Binding of pod `namespace`/`name` to `node`. With `uid` the API server binds only the
    pod with that UID (409 for a pod deleted and re-created under the name); `annotations` are copied
    onto the pod by the API server (pkg/registry/core/pod/storage: setPodHostAndAnnotations)."""
    metadata: JSONDict = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def binding_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}/binding"


class KubeApi:
    """Requests and watches against the API server with plain JSON dicts."""

    def __init__(
        self,
        host: str,
        ssl_context: ssl.SSLContext | None,
        *,
        credentials: Credentials | None = None,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 16,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        limiter: RateLimiter | None = None,
        max_retries: int = MAX_RETRIES,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        user_agent: str | None = None,
    ) -> None:
        """`qps`/`burst`: the client-side rate limit (qps <= 0: none), or `limiter` to give one (its
        clock and sleep injectable); `max_retries`: retries after a Retry-After or a lost GET; `sleep`:
        how those retries wait (injectable for tests); `user_agent`: the User-Agent header (None:
        `component_user_agent("hami-kube")`; a component passes `component_user_agent("<its name>")`).
        Raises ValueError naming a bad value."""
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        self.host = host.rstrip("/")
        self._credentials = credentials
        self._server_hostname = credentials.server_hostname if credentials is not None else None
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self.limiter: RateLimiter | None = limiter if limiter is not None else rate_limiter(qps, burst)
        """The client-side rate limiter (None: no limit); its counters say how much calls waited."""
        self.max_retries = max_retries
        self._sleep = sleep
        self.retries = 0
        """Calls sent again (after a Retry-After, or a GET lost to a reset connection)."""
        connector = aiohttp.TCPConnector(
            limit=max_connections, ssl=ssl_context if ssl_context is not None else False
        )
        self.user_agent = user_agent if user_agent is not None else component_user_agent(DEFAULT_COMPONENT)
        if not self.user_agent or any(c in self.user_agent for c in "\r\n"):
            raise ValueError(f"user_agent must be a non-empty header value, got {self.user_agent!r}")
        self._session = aiohttp.ClientSession(
            connector=connector, headers={"Accept": "application/json", "User-Agent": self.user_agent}
        )

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | Path | None,
        *,
        flag: str = "--kubeconfig",
        context: str | None = None,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> KubeApi:
        """A client from a kubeconfig file (its current-context, or `context`); when None, from the files
        in $KUBECONFIG, else from the in-cluster service account (`environ`, given by the caller's config,
        replaces os.environ for that choice). Raises `KubeConfigError` naming the file, entry and key
        (`flag` is how the caller's user gave the file)."""
        credentials = await load_credentials(kubeconfig, context=context, flag=flag, environ=environ)
        return cls(credentials.server, credentials.ssl_context, credentials=credentials, **options)

    @property
    def request_timeout_s(self) -> float:
        """The total timeout of a call that names none."""
        return self._request_timeout_s

    @property
    def credentials(self) -> Credentials | None:
        return self._credentials

    async def _headers(self) -> dict[str, str]:
        if self._credentials is None:
            return {}
        try:
            return await self._credentials.headers()
        except KubeConfigError as err:
            raise KubeApiError(0, "NoCredentials", str(err)) from None

    async def _retry_after_401(self, sent: Mapping[str, str]) -> bool:
        """The server refused `sent`: refresh the credentials; True when a retry makes sense."""
        if self._credentials is None:
            return False
        try:
            return await self._credentials.unauthorized(sent)
        except KubeConfigError as err:
            raise KubeApiError(401, "Unauthorized", f"and refreshing the credentials failed: {err}") from None

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
        limiter: RateLimiter | None = None,
    ) -> JSONDict:
        """One call (`body`, when given, is sent as JSON with `content_type`: a merge, strategic or JSON
        patch type for PATCH); the answer as a JSON object ({} for an empty one). Waits for the rate
        limiter first (the client's, or `limiter`: a bucket of its own, as client-go components give their
        Events a client of their own); `timeout_s` (the client's request timeout when None) then bounds
        the call with its retries. Raises `KubeApiError` (status 0 for no answer or an answer that is not
        a JSON object)."""
        limiter = limiter or self.limiter
        await _throttle(limiter)
        total = self._request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total
        data = orjson.dumps(body) if body is not None else None
        retries = 0
        refreshed = False
        while True:
            headers = await self._headers()
            sent = dict(headers)
            if data is not None:
                headers["Content-Type"] = content_type
            remaining = max(deadline - loop.time(), 0.001)
            timeout = aiohttp.ClientTimeout(total=remaining, connect=min(self._connect_timeout_s, remaining))
            try:
                async with self._session.request(
                    method,
                    self.host + path,
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=timeout,
                    server_hostname=self._server_hostname,
                ) as response:
                    raw = await response.read()
                    status = response.status
                    reason = str(response.reason)
                    wait = retry_after(status, response.headers)
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                # request.go: only a GET is sent again after a reset connection; a write may have landed.
                if method != "GET" or not probable_eof(err):
                    raise _transport(err) from None
                error, wait = _transport(err), TRANSPORT_RETRY_AFTER_S
            else:
                if status == 401 and not refreshed and await self._retry_after_401(sent):
                    refreshed = True
                    continue
                if status < 300:
                    break
                status_reason, message = _status_of(raw)
                error = KubeApiError(status, status_reason or reason, message)
            if wait is None or retries >= self.max_retries or loop.time() + wait >= deadline:
                raise error
            retries += 1
            await self._retry_wait(method, path, error, wait, retries, limiter)
        if not raw:
            return {}
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise KubeApiError(0, "BadResponse", f"{method} {path}: response is not JSON: {err}") from None
        if not isinstance(answer, dict):
            raise KubeApiError(0, "BadResponse", f"{method} {path}: response is not a JSON object")
        return answer

    async def _retry_wait(  # noqa: PLR0917
        self,
        method: str,
        path: str,
        error: KubeApiError,
        wait: float,
        retries: int,
        limiter: RateLimiter | None,
    ) -> None:
        """Wait `wait` seconds and for the rate limiter before retry number `retries` (with_retry.go
        `Before`: a retry is throttled too)."""
        self.retries += 1
        log.debug("%s %s: %s; retry %d in %.1fs", method, path, error, retries, wait)
        await self._sleep(wait)
        await _throttle(limiter)

    async def patch(
        self,
        path: str,
        body: object,
        patch_type: PatchType = PatchType.MERGE,
        *,
        timeout_s: float | None = None,
        limiter: RateLimiter | None = None,
    ) -> JSONDict:
        """PATCH `path` with `body` as `patch_type`; the patched object. Raises `KubeApiError`."""
        return await self.request(
            "PATCH", path, body, content_type=patch_type, timeout_s=timeout_s, limiter=limiter
        )

    async def bind(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        uid: str = "",
        annotations: Mapping[str, str] | None = None,
    ) -> JSONDict:
        """POST the pod's Binding to `node` (`binding()`); raises `KubeApiError` (409 for another UID)."""
        body = binding(namespace, name, node, uid=uid, annotations=annotations)
        return await self.request("POST", binding_path(namespace, name), body)

    async def probe(self, path: str, timeout_s: float) -> int:
        """The status of one GET of a health route (`/readyz`, `/healthz`) as kubelet's HTTP prober sends
        it (kubernetes pkg/probe/http): no credentials, no rate limit, no retry, the body read and
        dropped; 0 when no answer came within `timeout_s` (kubelet counts that a failure too)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._session.get(
                self.host + path, timeout=timeout, server_hostname=self._server_hostname
            ) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, OSError, TimeoutError):
            return 0

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict:
        """GET `path` (e.g. /api/v1/pods) as a JSON object; raises `KubeApiError`."""
        return await self.request("GET", path, params=params)

    async def get_if_exists(self, path: str) -> JSONDict | None:
        """GET `path`, or None when the object does not exist (404); other errors raise `KubeApiError`."""
        try:
            return await self.request("GET", path)
        except KubeApiError as err:
            if err.not_found:
                return None
            raise

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[JSONDict]]:
        """Open a watch of `path` after `resource_version` (bookmarks on, `params` such as a field
        selector added); the server ends it after `timeout_s`. Yields an async iterator of events
        (`{"type", "object"}` dicts). A stream silent far beyond the bookmark interval counts as dead."""
        query = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._connect_timeout_s, sock_read=timeout_s + 30.0
        )
        retries = 0
        refreshed = False
        opened = False
        try:
            while True:
                headers = await self._headers()
                try:
                    async with self._session.get(
                        self.host + path,
                        params=query,
                        headers=headers,
                        timeout=timeout,
                        server_hostname=self._server_hostname,
                    ) as response:
                        if response.status == 401 and not refreshed and await self._retry_after_401(headers):
                            refreshed = True
                            continue
                        if response.status == 200:
                            opened = True
                            yield _events(response, path)
                            return
                        reason, message = _status_of(await response.read())
                        error = KubeApiError(response.status, reason or str(response.reason), message)
                        wait = retry_after(response.status, response.headers)
                except (aiohttp.ClientError, OSError, TimeoutError) as err:
                    # request.go Watch: a reset, closed or timed-out opening is tried again.
                    if opened or not (probable_eof(err) or _is_timeout(err)):
                        raise
                    error, wait = _transport(err), TRANSPORT_RETRY_AFTER_S
                if wait is None or retries >= self.max_retries:
                    raise error
                retries += 1
                await self._retry_wait("WATCH", path, error, wait, retries, self.limiter)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise _transport(err) from None


async def _events(response: aiohttp.ClientResponse, path: str) -> AsyncIterator[JSONDict]:
    """Split the watch stream into JSON lines (objects may be larger than aiohttp's line limit, so the
    split is done here)."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line.strip():
                yield _decode_event(line, path)
    if buffer.strip():
        yield _decode_event(buffer, path)


def _decode_event(line: bytes, path: str) -> JSONDict:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event is not JSON ({err})") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event has no object: {line[:200]!r}")
    return event


__all__ = [
    "MAX_RETRIES",
    "JSONDict",
    "KubeApi",
    "PatchType",
    "binding",
    "binding_path",
    "component_user_agent",
    "probable_eof",
    "retry_after",
]
