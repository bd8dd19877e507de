"""Waiting with a deadline, the one way tests wait: `wait_for` polls a condition (state only a poll can
read: a file, a process, an HTTP answer); `wait_object` / `wait_node` / `wait_pod` follow an object's
watch, so a state that comes and goes between two polls is still seen. Each raises AssertionError naming
what it waited for when its deadline passes."""

from __future__ import annotations

import math
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import watch

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.02,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `condition` every `interval` seconds until it returns something truthy, and return that.
    After `timeout` seconds: AssertionError naming `what`, followed by `detail()` when given (the state
    that was not reached)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.1f}s waiting for {what}"
            raise AssertionError(f"{message}: {detail()}" if detail is not None else message)
        time.sleep(interval)


def wait_object(
    read: Callable[[], Any],
    list_call: Callable[..., Any],
    field_selector: str,
    predicate: Callable[[Any], bool],
    *,
    timeout: float = 10.0,
    since: str | None = None,
    **list_args: Any,
) -> Any:
    """The first version of an object (official-client model) that satisfies `predicate`: the current
    one (when `since` is None), then each one a watch shows. With `since` (a resourceVersion), every
    version written after it is looked at, so a state that came and went is still found.
    AssertionError after `timeout`."""
    last: Any = None
    if since is None:
        last = read()
        if predicate(last):
            return last
        since = last.metadata.resource_version
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
        stream = watcher.stream(
            list_call,
            field_selector=field_selector,
            resource_version=since,
            timeout_seconds=max(1, math.ceil(remaining)),
            **list_args,
        )
        try:
            for event in stream:
                obj = event["object"]
                if event["type"] == "ERROR" or not hasattr(obj, "metadata"):
                    raise AssertionError(f"watch failed: {event}")
                since = obj.metadata.resource_version
                last = obj
                if predicate(obj):
                    return obj
                if time.monotonic() > deadline:
                    break
        finally:
            watcher.stop()
            stream.close()
    raise AssertionError(f"timed out after {timeout}s; last version seen: {_summary(last)}")


def _summary(obj: Any) -> str:
    if obj is None:
        return "none"
    meta = obj.metadata
    status = obj.status
    phase = getattr(status, "phase", None)
    allocatable = getattr(status, "allocatable", None)
    return f"{meta.name} rv={meta.resource_version} annotations={meta.annotations} phase={phase} " + (
        f"allocatable={allocatable}" if allocatable is not None else ""
    )


def wait_node(
    core_v1: Any, node: str, predicate: Callable[[Any], bool], timeout: float = 10.0, since: str | None = None
) -> Any:
    """`wait_object` for the Node `node`."""
    return wait_object(
        lambda: core_v1.read_node(node),
        core_v1.list_node,
        f"metadata.name={node}",
        predicate,
        timeout=timeout,
        since=since,
    )


def wait_pod(
    core_v1: Any,
    name: str,
    predicate: Callable[[Any], bool],
    timeout: float = 10.0,
    since: str | None = None,
    *,
    namespace: str = "default",
) -> Any:
    """`wait_object` for the Pod `namespace/name`."""
    return wait_object(
        lambda: core_v1.read_namespaced_pod(name, namespace),
        core_v1.list_namespaced_pod,
        f"metadata.name={name}",
        predicate,
        timeout=timeout,
        since=since,
        namespace=namespace,
    )


def closed_by_peer(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closed `sock` (EOF, a reset, or a TLS alert on the way) within `wait_s`."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except (ConnectionError, ssl.SSLError):
        return True
