"""What the end-to-end tests on hami-sim share: the official client for a running local cluster (pods
come from `tests.builders`, waits from `tests.waiting`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config

from hami_sim.cluster import Cluster


@contextlib.contextmanager
def core_v1(cluster: Cluster) -> Iterator[Any]:
    """CoreV1Api on the cluster's kubeconfig, closed at the end."""
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()
