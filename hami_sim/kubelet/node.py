"""The Node side: create the Node if asked, and write `capacity`/`allocatable` of device-plugin
resources to its status whenever they change (one coalescing writer per node)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from datetime import UTC, datetime

from hami_kube.backoff import RetryPolicy
from hami_kube.client import JSONDict as JSON
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import DeviceManager
from hami_sim.kubelet.resources import is_extended_resource_name

log = logging.getLogger(__name__)

KUBELET_VERSION = "v1.33.0-hami-sim"
RETRY = RetryPolicy(initial=0.1, maximum=10.0)
"""The stand-in's backoff (its pod watch, node and pod status writes): 0.1 s doubling to 10 s."""
_RNG = random.Random()


async def read_node(api: KubeApi, name: str) -> JSON | None:
    """The Node, or None when it does not exist."""
    return await api.get_if_exists(f"/api/v1/nodes/{name}")


async def patch_node_status(api: KubeApi, name: str, patch: JSON) -> None:
    await api.patch(f"/api/v1/nodes/{name}/status", patch)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(config: KubeletConfig) -> JSON:
    """A Ready Node as kubelet registers it (static heartbeat; no Lease)."""
    now = now_rfc3339()
    resources = {"cpu": config.cpu, "memory": config.memory, "pods": config.pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.node_name,
            "labels": {
                "kubernetes.io/hostname": config.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": config.node_name}],
            "nodeInfo": {
                "machineID": config.node_name,
                "systemUUID": config.node_name,
                "bootID": config.node_name,
                "kernelVersion": "6.8.0",
                "osImage": "hami-sim",
                "containerRuntimeVersion": "hami-sim://1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


class NodeStatusReporter:
    def __init__(self, config: KubeletConfig, manager: DeviceManager, api: KubeApi) -> None:
        self.config = config
        self._manager = manager
        self._api = api
        self._dirty = asyncio.Event()
        self._written: dict[str, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self.patches = 0
        """Status patches written (for tests and benchmarks)."""

    async def start(self) -> None:
        """Make sure the Node exists (when asked to create it) and start the writer."""
        await self._ensure_node()
        self._manager.add_listener(self._dirty.set)
        self._dirty.set()
        self._task = asyncio.create_task(self._run(), name=f"node-status-{self.config.node_name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _ensure_node(self) -> None:
        name = self.config.node_name
        try:
            node = await read_node(self._api, name)
            if node is None and self.config.create_node:
                try:
                    node = await self._api.request("POST", "/api/v1/nodes", node_object(self.config))
                    log.info("node %s: created the Node", name)
                except KubeApiError as exc:
                    if exc.status != 409:
                        raise
                    node = await read_node(self._api, name)
            if node is not None and not self._manager.had_checkpoint:
                await self._reset_extended_resources(node)
        except KubeApiError as exc:
            log.warning("node %s: cannot prepare the Node: %s (will keep trying to write status)", name, exc)

    async def _reset_extended_resources(self, node: JSON) -> None:
        """No checkpoint means a new node: kubelet zeroes every extended resource it finds."""
        status = node.get("status") or {}
        zeroed = {
            key: {name: "0" for name in (status.get(key) or {}) if is_extended_resource_name(name)}
            for key in ("capacity", "allocatable")
        }
        if zeroed["capacity"] or zeroed["allocatable"]:
            await patch_node_status(self._api, self.config.node_name, {"status": zeroed})

    async def _run(self) -> None:
        backoff = RETRY.backoff(_RNG)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            desired = self._manager.capacity()
            changed = {k: v for k, v in desired.items() if self._written.get(k) != v}
            if not changed:
                continue
            patch = {
                "status": {
                    "capacity": {k: str(c) for k, (c, _) in changed.items()},
                    "allocatable": {k: str(a) for k, (_, a) in changed.items()},
                }
            }
            try:
                await patch_node_status(self._api, self.config.node_name, patch)
            except KubeApiError as exc:
                delay = backoff.next()
                log.warning(
                    "node %s: node status patch failed: %s; retrying in %.1fs",
                    self.config.node_name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                self._dirty.set()
                continue
            backoff.reset()
            self._written.update(changed)
            self.patches += 1
