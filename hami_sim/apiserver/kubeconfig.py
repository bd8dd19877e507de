"""A kubeconfig for the stand-in API server (plain HTTP, a dummy bearer token)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from hami_node.durable import write_atomic

CLUSTER = "hami-sim"
USER = "hami-sim-admin"
CONTEXT = "hami-sim"
DUMMY_TOKEN = "hami-sim-token"


def kubeconfig(server_url: str, *, namespace: str = "default") -> dict[str, Any]:
    """The kubeconfig document (a dict) pointing at `server_url`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": CLUSTER, "cluster": {"server": server_url}}],
        "users": [{"name": USER, "user": {"token": DUMMY_TOKEN}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CLUSTER, "user": USER, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: str | os.PathLike[str], server_url: str) -> Path:
    """Write the kubeconfig atomically (mode 0600) and return its path."""
    return write_atomic(path, yaml.safe_dump(kubeconfig(server_url), sort_keys=False), mode=0o600)
