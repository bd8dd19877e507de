"""Builders and raw-HTTP helpers shared by the API server tests.

Builders return official-client models typed `Any`: every model field is Optional, which strict
mypy would make tests assert at each step."""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gpus: str | None = None,
    namespace: str | None = None,
) -> Any:
    limits = {"nvidia.com/gpu": gpus} if gpus is not None else None
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations, namespace=namespace),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main", image="busybox:1.36", resources=client.V1ResourceRequirements(limits=limits)
                )
            ]
        ),
    )


def node(name: str, *, labels: dict[str, str] | None = None, ready: bool = True) -> Any:
    return client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        status=client.V1NodeStatus(
            conditions=[client.V1NodeCondition(type="Ready", status="True" if ready else "False")],
            capacity={"cpu": "8", "nvidia.com/gpu": "4"},
            allocatable={"cpu": "8", "nvidia.com/gpu": "4"},
        ),
    )


def binding(pod_name: str, node_name: str, **meta: Any) -> Any:
    return client.V1Binding(
        api_version="v1",
        kind="Binding",
        metadata=client.V1ObjectMeta(name=pod_name, **meta),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node_name),
    )


def bind(core_v1: Any, namespace: str, pod_name: str, node_name: str, **meta: Any) -> dict[str, Any]:
    """POST pods/binding; the official client cannot decode the Status kube answers (it expects a
    Binding), exactly as against a real kube-apiserver, so read the raw body."""
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
