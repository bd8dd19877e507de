"""What the end-to-end tests on hami-sim share: the official client for a running local cluster (pods
come from `tests.builders`, waits from `tests.waiting`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client, config

from hami_sim.cluster import Cluster
from hami_sim.tls import client_ssl_context


@contextlib.contextmanager
def core_v1(cluster: Cluster) -> Iterator[Any]:
    """CoreV1Api on the cluster's kubeconfig, closed at the end."""
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()


def control_metrics(cluster: Cluster) -> str:
    """hami-control's /metrics page (through the cluster's control URL, the leader's)."""
    context = client_ssl_context(cluster.ca_file.read_bytes())
    with urllib3.PoolManager(ssl_context=context) as pool:
        return str(pool.request("GET", cluster.control_url + "/metrics", timeout=10.0).data.decode())
