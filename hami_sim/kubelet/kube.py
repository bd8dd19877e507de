"""The stand-in's only contact with the API server: the official async client (`kubernetes.aio`),
raw JSON in and out (pods and nodes stay plain dicts; no model decoding on the hot path)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
import orjson
from kubernetes.aio import client as aclient
from kubernetes.aio import config as aconfig

WATCH_SECONDS = 240
"""Server-side timeout of one pod watch; the stand-in re-watches from the last resourceVersion."""

JSON = dict[str, Any]


class ApiError(Exception):
    """An API request failed: `status` is the HTTP code (0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


def _status_message(status: int, body: bytes) -> str:
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode(errors="replace")
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return body[:200].decode(errors="replace")


async def client_from_kubeconfig(path: str | os.PathLike[str]) -> aclient.ApiClient:
    """An async ApiClient for the kubeconfig's current context (the caller closes it)."""
    configuration = aclient.Configuration()
    await aconfig.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(path), client_configuration=configuration, persist_config=False
    )
    return aclient.ApiClient(configuration)


class KubeApi:
    """The calls a kubelet makes: its pods (list, watch, status), events, its Node."""

    def __init__(self, api_client: aclient.ApiClient) -> None:
        self._v1: Any = aclient.CoreV1Api(api_client)

    async def _json(self, request: Awaitable[Any]) -> Any:
        try:
            response = await request
            try:
                body = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"API server unreachable: {exc}") from exc
        if response.status >= 300:
            raise ApiError(response.status, _status_message(response.status, body))
        return orjson.loads(body)

    async def list_pods(self, node: str) -> tuple[list[JSON], str]:
        """Pods bound to `node` and the list's resourceVersion."""
        body = await self._json(
            self._v1.list_pod_for_all_namespaces_without_preload_content(
                field_selector=f"spec.nodeName={node}"
            )
        )
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def watch_pods(self, node: str, resource_version: str) -> AsyncIterator[tuple[str, JSON]]:
        """(type, object) events of pods bound to `node` after `resource_version`, BOOKMARKs included;
        ends when the server closes the watch. An ERROR event raises ApiError (410: relist)."""
        try:
            response = await self._v1.list_pod_for_all_namespaces_without_preload_content(
                field_selector=f"spec.nodeName={node}",
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=float(WATCH_SECONDS + 30),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"API server unreachable: {exc}") from exc
        try:
            if response.status != 200:
                raise ApiError(response.status, _status_message(response.status, await response.read()))
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise ApiError(0, f"watch broken: {exc}") from exc
                if not line:
                    return
                if not line.strip():
                    continue
                event = orjson.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or "watch error"))
                yield str(event.get("type")), obj
        finally:
            response.close()

    async def patch_pod_status(self, namespace: str, name: str, patch: JSON) -> JSON:
        result: JSON = await self._json(
            self._v1.patch_namespaced_pod_status_without_preload_content(
                name, namespace, patch, _content_type="application/merge-patch+json"
            )
        )
        return result

    async def create_event(self, namespace: str, event: JSON) -> None:
        await self._json(self._v1.create_namespaced_event_without_preload_content(namespace, event))

    async def get_node(self, name: str) -> JSON | None:
        try:
            node: JSON = await self._json(self._v1.read_node_without_preload_content(name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return node

    async def create_node(self, node: JSON) -> JSON:
        created: JSON = await self._json(self._v1.create_node_without_preload_content(node))
        return created

    async def patch_node_status(self, name: str, patch: JSON) -> JSON:
        result: JSON = await self._json(
            self._v1.patch_node_status_without_preload_content(
                name, patch, _content_type="application/merge-patch+json"
            )
        )
        return result
