"""Raw-HTTP helpers shared by the API server tests, `bind` (a pods/binding through the official client)
and `create_and_bind` (a pod placed as a scheduler places it). The objects they send come from
`tests.builders`."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import urllib3

from hami_api.types import PodAllocation
from hami_control.binder import binding_annotations
from tests.builders import binding, pod


def bind(core_v1: Any, namespace: str, pod_name: str, node_name: str, **meta: Any) -> dict[str, Any]:
    """POST pods/binding (`meta`: `tests.builders.binding`'s keyword arguments); the official client
    cannot decode the Status kube answers (it expects a Binding), exactly as against a real
    kube-apiserver, so read the raw body."""
    response = core_v1.create_namespaced_pod_binding(
        pod_name, namespace, binding(pod_name, node_name, **meta), _preload_content=False
    )
    body: dict[str, Any] = json.loads(response.data)
    return body


def create_and_bind(
    core_v1: Any,
    name: str,
    node: str,
    containers: Sequence[dict[str, Any]],
    choice: PodAllocation | None = None,
    *,
    init: Sequence[dict[str, Any]] = (),
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> str:
    """Create the pod, then bind it to `node` as hami-control does: with `choice`, the Binding carries
    hami-control's own annotations for it (`binding_annotations`), else `annotations` as given (none:
    a pod some other scheduler placed). Returns the pod's UID."""
    created = core_v1.create_namespaced_pod(namespace, pod(name, *containers, init=init))
    if choice is not None:
        annotations = binding_annotations(choice, node, int(time.time()))
    status = bind(core_v1, namespace, name, node, annotations=annotations)
    assert status.get("status") == "Success", status
    return str(created.metadata.uid)


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
