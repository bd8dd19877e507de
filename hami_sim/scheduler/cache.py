"""The scheduler cache (pure, fed by the watches): nodes and the pods on them, with running sums per node,
and assumed pods: a pod whose bind is in flight counts on its node from the moment it is chosen until
the watch shows it bound (then the bound copy replaces the assumption), its bind fails (`forget`) or it
is deleted. Terminal pods never reach here (the pod watch selects them out, as kube-scheduler's
informer does), so a pod that finishes arrives as a delete and frees its node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hami_sim.scheduler.fit import NodeInfo, PodAsk, node_projection
from hami_sim.scheduler.queue import pod_key

JSON = dict[str, Any]


@dataclass(slots=True)
class PodEntry:
    uid: str
    node: str
    ask: PodAsk
    assumed: bool


class ClusterCache:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodEntry] = {}
        self._projections: dict[str, tuple[Any, ...]] = {}
        self._candidates: list[NodeInfo] | None = None

    # --- nodes -------------------------------------------------------------------------------------------

    def _info(self, name: str) -> NodeInfo:
        info = self.nodes.get(name)
        if info is None:
            info = self.nodes[name] = NodeInfo(name)
        return info

    def set_node(self, node: JSON) -> bool:
        """A Node added or changed; True when the change may make a pending pod fit."""
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            return False
        info = self._info(name)
        was_known = info.node is not None
        info.set_node(node)
        projection = node_projection(node)
        changed = not was_known or self._projections.get(name) != projection
        self._projections[name] = projection
        if not was_known:
            self._candidates = None
        return changed

    def delete_node(self, name: str) -> None:
        info = self.nodes.get(name)
        if info is None:
            return
        info.set_node(None)
        self._projections.pop(name, None)
        self._candidates = None
        if info.pods == 0:
            del self.nodes[name]

    def replace_nodes(self, nodes: Iterable[JSON]) -> None:
        seen = set()
        for node in nodes:
            self.set_node(node)
            seen.add(str((node.get("metadata") or {}).get("name") or ""))
        for name in [n for n, info in self.nodes.items() if info.node is not None and n not in seen]:
            self.delete_node(name)

    def candidates(self) -> list[NodeInfo]:
        """The nodes that exist, in name order."""
        if self._candidates is None:
            self._candidates = sorted(
                (i for i in self.nodes.values() if i.node is not None), key=lambda i: i.name
            )
        return self._candidates

    # --- pods --------------------------------------------------------------------------------------------

    def _remove(self, key: str) -> PodEntry | None:
        entry = self.pods.pop(key, None)
        if entry is not None:
            info = self.nodes.get(entry.node)
            if info is not None:
                info.add_pod(entry.ask, -1)
                if info.node is None and info.pods == 0:
                    del self.nodes[entry.node]
        return entry

    def _add(self, key: str, entry: PodEntry) -> None:
        self.pods[key] = entry
        self._info(entry.node).add_pod(entry.ask)

    def set_assigned(self, pod: JSON) -> None:
        """A pod bound to a node (the watch's view); replaces an assumption for the same pod."""
        key = pod_key(pod)
        node = str((pod.get("spec") or {}).get("nodeName"))
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        old = self.pods.get(key)
        if old is not None and not old.assumed and old.uid == uid and old.node == node:
            return  # requests cannot change on a bound pod (in-place resize is not modelled)
        self._remove(key)
        self._add(key, PodEntry(uid, node, PodAsk.of(pod), assumed=False))

    def delete_pod(self, key: str) -> bool:
        """The pod is gone (or terminal); True when it held room on a node."""
        return self._remove(key) is not None

    def replace_assigned(self, pods: Iterable[JSON]) -> None:
        """After a (re)list: the bound pods now; assumptions for pods still pending are kept."""
        keep = {key: e for key, e in self.pods.items() if e.assumed}
        for key in list(self.pods):
            self._remove(key)
        for key, entry in keep.items():
            self._add(key, entry)
        for pod in pods:
            self.set_assigned(pod)

    def assume(self, pod: JSON, node: str, ask: PodAsk) -> None:
        key = pod_key(pod)
        self._remove(key)
        self._add(key, PodEntry(str((pod.get("metadata") or {}).get("uid") or ""), node, ask, assumed=True))

    def forget(self, key: str) -> bool:
        """Drop an assumption (failed bind); False when the pod was confirmed or gone meanwhile."""
        entry = self.pods.get(key)
        if entry is None or not entry.assumed:
            return False
        self._remove(key)
        return True

    def is_assumed(self, key: str) -> bool:
        entry = self.pods.get(key)
        return entry is not None and entry.assumed
