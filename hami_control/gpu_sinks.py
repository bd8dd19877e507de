"""The node watch's sink: registered nodes into the extender's GPU cache (`cache.ClusterCache`), relists
included, HAMi's node lock annotation and whether the node's daemon identifies the pods kubelet admits
(`hami.io/node-pod-identification`) kept per node, and hooks for the binder. (Pods go to the pod store,
`pod_store.PodStore`, which feeds the GPU cache what they hold.)"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from hami_api import annotations as ann
from hami_control.cache import ClusterCache
from hami_kube.client import JSONDict
from hami_kube.reflector import replace_all

log = logging.getLogger(__name__)


NodeHook = Callable[[str], None]
"""(node name) after the GPU cache took a node event."""


class GPUNodeSink:
    """Nodes -> `ClusterCache` (their GPUs), HAMi's node lock annotation kept per node, then the hooks."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.locks: dict[str, str] = {}
        """node -> raw `hami.io/mutex.lock` value, for nodes that carry one."""
        self.identifying: set[str] = set()
        """Nodes whose daemon tells the pods kubelet admits apart through kubelet's PodResources API
        (`hami.io/node-pod-identification: podresources`)."""
        self.hooks: list[NodeHook] = []
        self._listed: set[str] = set()
        self._locks: dict[str, str] = {}
        self._identifying: set[str] = set()

    def _note_lock(self, name: str, obj: JSONDict | None) -> None:
        value = ((obj or {}).get("metadata") or {}).get("annotations", {}) or {}
        lock = value.get(ann.NODE_LOCK) if isinstance(value, dict) else None
        if isinstance(lock, str) and lock:
            self.locks[name] = lock
        else:
            self.locks.pop(name, None)
        if _identifies(obj):
            self.identifying.add(name)
        else:
            self.identifying.discard(name)

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._listed = set()
        self._locks = {}
        self._identifying = set()

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._listed |= self.cache.nodes_listed(items)
        for node in items:
            name = str((node.get("metadata") or {}).get("name") or "")
            lock = ((node.get("metadata") or {}).get("annotations") or {}).get(ann.NODE_LOCK)
            if isinstance(lock, str) and lock:
                self._locks[name] = lock
            if _identifies(node):
                self._identifying.add(name)
            self._notify(name)

    def end_replace(self) -> None:
        listed, self._listed = self._listed, set()
        self.cache.nodes_not_listed(listed)
        self.locks.clear()
        self.locks.update(self._locks)
        self._locks = {}
        self.identifying.clear()
        self.identifying.update(self._identifying)
        self._identifying = set()

    def apply(self, kind: str, obj: JSONDict) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self.cache.node_deleted(name)
            self._note_lock(name, None)
        else:
            self.cache.node_upserted(obj)
            self._note_lock(name, obj)
        self._notify(name)

    def _notify(self, name: str) -> None:
        for hook in self.hooks:
            try:
                hook(name)
            except Exception:
                log.exception("a node hook failed")


def _identifies(node: JSONDict | None) -> bool:
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return (
        isinstance(annotations, dict)
        and annotations.get(ann.NODE_POD_IDENTIFICATION) == ann.NODE_POD_IDENTIFICATION_PODRESOURCES
    )


class NodeEvents(Protocol):
    def record(  # noqa: PLR0917 (the event recorder's signature)
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, kind: str = ...
    ) -> None: ...


INVALID_INVENTORY = "InvalidDeviceInventory"
"""The reason of the Warning Event a Node gets for each vendor inventory left out (a new problem only)."""


class InventoryProblems:
    """A node hook: one Warning Event on the Node for each new reason a vendor's devices are left out of
    it (`ClusterCache.vendor_problems`: an inventory that does not decode, a plugin not registered)."""

    def __init__(self, cache: ClusterCache, events: NodeEvents) -> None:
        self.cache = cache
        self.events = events
        self._seen: dict[str, tuple[str, ...]] = {}

    def __call__(self, name: str) -> None:
        problems = self.cache.vendor_problems(name)
        seen = self._seen.get(name, ())
        if problems == seen:
            return
        for problem in problems:
            if problem not in seen:
                self.events.record("", name, "", "Warning", INVALID_INVENTORY, problem, kind="Node")
        if problems:
            self._seen[name] = problems
        else:
            self._seen.pop(name, None)


__all__ = [
    "INVALID_INVENTORY",
    "GPUNodeSink",
    "InventoryProblems",
    "NodeHook",
]
