"""Raw-HTTP helpers shared by the API server tests, and `bind` (a pods/binding through the official
client). The objects they send come from `tests.builders`."""

from __future__ import annotations

import json
from typing import Any

import urllib3

from tests.builders import binding


def bind(core_v1: Any, namespace: str, pod_name: str, node_name: str, **meta: Any) -> dict[str, Any]:
    """POST pods/binding (`meta`: `tests.builders.binding`'s keyword arguments); the official client
    cannot decode the Status kube answers (it expects a Binding), exactly as against a real
    kube-apiserver, so read the raw body."""
    response = core_v1.create_namespaced_pod_binding(
        pod_name, namespace, binding(pod_name, node_name, **meta), _preload_content=False
    )
    body: dict[str, Any] = json.loads(response.data)
    return body


def http(  # noqa: PLR0917
    base_url: str,
    method: str,
    path: str,
    body: bytes | str | dict[str, Any] | list[Any] | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One raw request; returns (status, decoded JSON body or text)."""
    data: bytes | None
    if isinstance(body, dict | list):
        data = json.dumps(body).encode()
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = body
    all_headers = {"Content-Type": content_type, **(headers or {})}
    with urllib3.PoolManager() as pool:
        response = pool.request(
            method, base_url + path, body=data, headers=all_headers, timeout=10.0, retries=False
        )
        text = response.data.decode()
    try:
        return response.status, json.loads(text)
    except json.JSONDecodeError:
        return response.status, text
