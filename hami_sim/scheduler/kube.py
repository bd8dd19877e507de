"""The stand-in's link to the API server: credentials from `kubernetes.aio.config` (kubeconfig, or the
in-cluster service account), requests over one plain `aiohttp` session as JSON dicts (orjson), and a
list+watch `Reflector` per resource (what client-go's informers do for kube-scheduler).

A watch that ends resumes from the last resourceVersion; 410 Gone relists; other failures retry with
backoff (0.2 s doubling to 10 s)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class KubeConfigError(RuntimeError):
    """No usable client configuration; the message names the file or flag."""


class KubeApiError(Exception):
    """A failed call: `status` 0 when no answer came back."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status or 'no response'} {reason}: {message}" if reason else message)


def _status_of(body: bytes) -> tuple[str, str]:
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", body.decode(errors="replace")[:300]
    if isinstance(status, dict):
        return str(status.get("reason") or ""), str(status.get("message") or "")
    return "", str(status)[:300]


class KubeClient:
    def __init__(self, host: str, ssl_context: ssl.SSLContext | None, configuration: Any = None) -> None:
        self.host = host.rstrip("/")
        self._configuration = configuration
        connector = aiohttp.TCPConnector(limit=64, ssl=ssl_context if ssl_context is not None else False)
        self._session = aiohttp.ClientSession(connector=connector, headers={"Accept": "application/json"})

    @classmethod
    async def connect(cls, kubeconfig: str | Path | None) -> KubeClient:
        """From a kubeconfig file, or the in-cluster service account when None. Raises KubeConfigError."""
        from kubernetes.aio import config as kube_config
        from kubernetes.aio.client.configuration import Configuration

        if kubeconfig is not None and not Path(kubeconfig).is_file():  # noqa: ASYNC240 - start-up only
            raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file")
        configuration: Any = Configuration()
        loader: Any = kube_config
        try:
            if kubeconfig is None:
                loader.load_incluster_config(client_configuration=configuration)
            else:
                await loader.load_kube_config(
                    config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
                )
        except (loader.ConfigException, OSError, ValueError, TypeError, KeyError) as err:
            where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig)"
            raise KubeConfigError(f"cannot build a Kubernetes client from {where}: {err}") from None
        host = str(configuration.host or "")
        if not host.startswith(("http://", "https://")):
            raise KubeConfigError(f"--kubeconfig {kubeconfig}: server {host!r} is not an http(s) URL")
        context: ssl.SSLContext | None = None
        if host.startswith("https://"):
            try:
                context = ssl.create_default_context(
                    cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
                )
                if configuration.cert_file:
                    context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
            except (OSError, ssl.SSLError, ValueError) as err:
                raise KubeConfigError(f"--kubeconfig {kubeconfig}: TLS settings unusable: {err}") from None
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        return cls(host, context, configuration)

    async def _headers(self) -> dict[str, str]:
        configuration = self._configuration
        if configuration is None:
            return {}
        token = await configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            return {"Authorization": str(token)}
        basic = configuration.get_basic_auth_token()
        return {"Authorization": str(basic)} if basic else {}

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> JSON:
        """One call; the answer as a JSON object. Raises KubeApiError."""
        headers = await self._headers()
        data: bytes | None = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        try:
            async with self._session.request(
                method,
                self.host + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s, connect=5.0),
            ) as response:
                raw = await response.read()
                if response.status >= 300:
                    reason, message = _status_of(raw)
                    raise KubeApiError(response.status, reason or str(response.reason), message)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeApiError(0, type(err).__name__, str(err) or type(err).__name__) from None
        try:
            answer = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as err:
            raise KubeApiError(0, "BadResponse", f"{method} {path}: response is not JSON: {err}") from None
        return answer if isinstance(answer, dict) else {}

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[JSON]]:
        query = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout_s + 30.0)
        try:
            async with self._session.get(
                self.host + path, params=query, headers=await self._headers(), timeout=timeout
            ) as response:
                if response.status != 200:
                    reason, message = _status_of(await response.read())
                    raise KubeApiError(response.status, reason or str(response.reason), message)
                yield _events(response, path)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeApiError(0, type(err).__name__, str(err) or type(err).__name__) from None


async def _events(response: aiohttp.ClientResponse, path: str) -> AsyncIterator[JSON]:
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line.strip():
                yield _decode_event(line, path)
    if buffer.strip():
        yield _decode_event(buffer, path)


def _decode_event(line: bytes, path: str) -> JSON:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event is not JSON ({err})") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event has no object")
    return event


class Reflector:
    """List, then watch, `path` into `replace(items)` / `apply(type, obj)` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        replace: Callable[[Sequence[JSON]], None],
        apply: Callable[[str, JSON], None],
        *,
        params: Mapping[str, str] | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.client = client
        self.path = path
        self.params = dict(params or {})
        self._replace = replace
        self._apply = apply
        self.watch_timeout_s = watch_timeout_s
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.failures = 0

    async def list(self) -> None:
        """One list into `replace` (raises KubeApiError)."""
        body = await self.client.request("GET", self.path, params=self.params)
        items = body.get("items")
        version = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(items, list) or not isinstance(version, str) or not version:
            raise KubeApiError(0, "BadResponse", f"list {self.path}: no items or resourceVersion")
        self._replace([item for item in items if isinstance(item, dict)])
        self.resource_version = version
        self.synced.set()

    async def run(self) -> None:
        delay = 0.2
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                if self.resource_version is None:
                    await self.list()
                async with self.client.watch(
                    self.path, self.resource_version or "", self.watch_timeout_s, self.params
                ) as events:
                    async for event in events:
                        self._on_event(event)
                        delay = 0.2
                        self.failures = 0
                if loop.time() - started >= 1.0:
                    continue  # the server's timeout ended it: watch again at once
                self.failures += 1
            except KubeApiError as err:
                if err.status == 410:
                    log.info("watch %s: %s; relisting", self.path, err.message or "too old")
                    self.resource_version = None
                    continue
                self.failures += 1
                level = logging.WARNING if self.failures & (self.failures - 1) == 0 else logging.DEBUG
                log.log(level, "watch %s failed (%d in a row): %s", self.path, self.failures, err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _on_event(self, event: JSON) -> None:
        kind = str(event.get("type"))
        obj: JSON = event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            raise KubeApiError(
                code if isinstance(code, int) else 0, str(obj.get("reason") or ""), str(obj.get("message"))
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._apply(kind, obj)
            except Exception:
                log.exception("watch %s: handling a %s event failed", self.path, kind)
        if isinstance(version, str) and version:
            self.resource_version = version
