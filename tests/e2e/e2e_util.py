"""What the end-to-end tests on hami-sim share: waiting on a condition with a deadline, and the official
client for a running local cluster."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kubernetes import client, config

from hami_sim.cluster import Cluster

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def core_v1(cluster: Cluster) -> Iterator[Any]:
    """CoreV1Api on the cluster's kubeconfig, closed at the end."""
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()
