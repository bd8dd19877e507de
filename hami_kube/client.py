"""One HTTP client for the Kubernetes API, asyncio, answers as plain JSON dicts.

Credentials come from `hami_kube.config` (a kubeconfig file, the files in $KUBECONFIG, or the pod's
service account in a cluster): tokens, token files, client certificates, basic auth and exec plugins,
refreshed as they expire, without importing the official `kubernetes` package (only an `auth-provider`
user falls back to its loader). The requests go over one plain `aiohttp` session and the answers are
parsed with orjson into plain Kubernetes JSON dicts: the official client's pydantic models would cost
~70 µs per pod and an object graph the pure modules do not want (they take dicts).

Every call has a timeout (total and connect); a watch has a read timeout far beyond the bookmark
interval instead, so a silent dead stream ends. A 401 makes the credentials refresh (an exec plugin
re-runs, a token file is re-read) and the call is retried once with the new ones. Failures are
`KubeApiError`: the HTTP status and the metav1.Status reason and message, or status 0 and the transport
error for no answer. Create the client inside the event loop that will use it
(`await KubeApi.connect(...)`), `await close()` at the end.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from hami_kube.config import Credentials, load_credentials
from hami_kube.errors import KubeApiError, KubeConfigError

JSONDict = dict[str, Any]


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
    ) -> None:
        self.host = host.rstrip("/")
        self._credentials = credentials
        self._server_hostname = credentials.server_hostname if credentials is not None else None
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        connector = aiohttp.TCPConnector(
            limit=max_connections, ssl=ssl_context if ssl_context is not None else False
        )
        self._session = aiohttp.ClientSession(connector=connector, headers={"Accept": "application/json"})

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | Path | None,
        *,
        flag: str = "--kubeconfig",
        context: str | None = None,
        **options: Any,
    ) -> KubeApi:
        """A client from a kubeconfig file (its current-context, or `context`); when None, from the files
        in $KUBECONFIG, else from the in-cluster service account. Raises `KubeConfigError` naming the
        file, entry and key (`flag` is how the caller's user gave the file)."""
        credentials = await load_credentials(kubeconfig, context=context, flag=flag)
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
    ) -> JSONDict:
        """One call (`body`, when given, is sent as JSON with `content_type`: a merge, strategic or JSON
        patch type for PATCH); the answer as a JSON object ({} for an empty one). Raises `KubeApiError`
        (status 0 for no answer or an answer that is not a JSON object)."""
        total = self._request_timeout_s if timeout_s is None else timeout_s
        timeout = aiohttp.ClientTimeout(total=total, connect=self._connect_timeout_s)
        data = orjson.dumps(body) if body is not None else None
        for attempt in (1, 2):
            headers = await self._headers()
            sent = dict(headers)
            if data is not None:
                headers["Content-Type"] = content_type
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
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                raise _transport(err) from None
            if status == 401 and attempt == 1 and await self._retry_after_401(sent):
                continue
            if status >= 300:
                status_reason, message = _status_of(raw)
                raise KubeApiError(status, status_reason or reason, message)
            break
        if not raw:
            return {}
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise KubeApiError(0, "BadResponse", f"{method} {path}: response is not JSON: {err}") from None
        if not isinstance(answer, dict):
            raise KubeApiError(0, "BadResponse", f"{method} {path}: response is not a JSON object")
        return answer

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict:
        """GET `path` (e.g. /api/v1/pods) as a JSON object; raises `KubeApiError`."""
        return await self.request("GET", path, params=params)

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
        try:
            for attempt in (1, 2):
                headers = await self._headers()
                async with self._session.get(
                    self.host + path,
                    params=query,
                    headers=headers,
                    timeout=timeout,
                    server_hostname=self._server_hostname,
                ) as response:
                    if response.status == 401 and attempt == 1 and await self._retry_after_401(headers):
                        continue
                    if response.status != 200:
                        reason, message = _status_of(await response.read())
                        raise KubeApiError(response.status, reason or str(response.reason), message)
                    yield _events(response, path)
                    return
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


__all__ = ["JSONDict", "KubeApi"]
