"""Incremental cluster state: every registered node's GPUs with what the pods placed on them hold.

Pure and event-driven: the watches call `node_upserted` / `node_deleted` / `pod_upserted` /
`pod_deleted` with the objects' JSON, the binder calls `assume` / `forget` / `expire`; nothing here reads
the clock or the network (`now` is passed in, in seconds on any monotonic scale the caller likes). Not
thread-safe: one owner (the event loop) feeds it.

**Nodes.** A node is *registered* when its `hami.io/node-nvidia-register` annotation decodes (JSON or
legacy form) and its `status.allocatable["nvidia.com/gpu"]` is above 0. Otherwise it is kept out, with
the reason `node unregistered: <why>` (`unregistered_reason`), logged once per distinct reason. GPU
health comes from the register annotation, `hami.io/device-cordon` fences GPUs, and
`hami.io/node-nvidia-score` (when present and valid) gives the topology pair scores.

*Handshake decision.* HAMi v2.10's scheduler probes liveness by writing `hami.io/node-handshake`
(`Requesting_<time>`) and, 60 s later, drops a node whose allocatable GPU count is 0. We write no
annotation: the kubelet already publishes the device plugin's liveness as `status.allocatable`, so a
node with 0 (or no) allocatable `nvidia.com/gpu` counts as having no usable GPU straight away, and a
node whose plugin comes back is registered again on its next update. The handshake annotation, whatever
its value, is ignored.

**Pods.** A pod holds GPU slices when it carries `hami.io/vgpu-node` and is not terminal (Succeeded,
Failed); the slices come from `hami.io/vgpu-devices-allocated` (or `hami.io/vgpu-devices-to-allocate`
when that is missing or empty), reduced to the pod's footprint with `hami_api.containers.
footprint_slices` (init containers run one at a time before the regular ones, sidecars beside them). A
changed annotation re-accounts the pod (old slices out, new in); a pod whose annotations do not decode
is skipped with a logged reason. Pods may arrive before their node: their slices count as soon as the
node registers.

**Assumptions.** A pod the binder has bound counts from `assume` on. The first watch event that shows
the pod with a decodable allocation replaces the assumption (never both); an event that does not yet
show it (no `hami.io/vgpu-node`, an older copy of the pod) leaves the assumption in place. `forget`
drops an assumption after a failed bind, `expire` the ones no watch confirmed within a TTL. A terminal
or deleted pod releases both.

Every event updates the affected node's `NodeGPUs` in place of the old value, so `node_gpus` is a dict
lookup; a node event rebuilds only that node (and only when its annotations or allocatable changed).
Usage never goes negative: slices are removed only from the node they were added to, under the same
inventory, and releasing what was never added is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from hami_api.annotations import (
    DEVICE_CORDON,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_PAIR_SCORE,
    NODE_REGISTER,
    VGPU_NODE,
    decode_device_cordon,
    decode_node_register,
    decode_pair_scores,
    decode_pod_allocation,
    decode_vgpu_node,
)
from hami_api.containers import ContainerKind, footprint_slices, pod_container_kinds
from hami_api.errors import QuantityError, RequestError, WireFormatError
from hami_api.quantity import parse_quantity
from hami_api.resources import ResourceNames
from hami_api.types import GPUInfo, GPUPairScore, GPUSlice, PodAllocation
from hami_control.usage import NodeGPUs, with_slices, without_slices

log = logging.getLogger(__name__)

UNREGISTERED = "node unregistered"
"""HAMi's FailedNodes word for a node without usable GPU inventory; reasons are `f"{UNREGISTERED}: why"`."""

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

_DEFAULT_NAMES = ResourceNames()


@dataclass(frozen=True, slots=True)
class Held:
    """What one pod holds on one node: its peak slices (one per slot)."""

    node: str
    slices: tuple[GPUSlice, ...]


@dataclass(frozen=True, slots=True)
class PodHolding:
    """A counted pod, for metrics and the binder: `assumed` until a watch event confirms it."""

    uid: str
    namespace: str
    name: str
    node: str
    slices: tuple[GPUSlice, ...]
    assumed: bool


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """Totals over a node's GPUs (all of them, healthy or not), for metrics."""

    gpus: int
    slots: int
    used_slots: int
    memory: int
    used_memory: int
    cores: int
    used_cores: int

    @staticmethod
    def of(node: NodeGPUs) -> NodeUsage:
        g = node.gpus
        return NodeUsage(
            gpus=len(g),
            slots=sum(x.info.count for x in g),
            used_slots=sum(x.used for x in g),
            memory=sum(x.info.devmem for x in g),
            used_memory=sum(x.usedmem for x in g),
            cores=sum(x.info.devcore for x in g),
            used_cores=sum(x.usedcores for x in g),
        )


@dataclass(frozen=True, slots=True)
class CacheStats:
    nodes: int
    unregistered: int
    pods: int
    assumed: int


@dataclass(slots=True)
class _Pod:
    namespace: str = ""
    name: str = ""
    observed: Held | None = None
    """From the latest watch event, when that showed a decodable allocation."""
    assumed: Held | None = None
    assumed_at: float = 0.0
    seen: bool = False
    """Whether any watch event showed the pod (else it is known only through `assume`)."""

    @property
    def counted(self) -> Held | None:
        return self.observed if self.observed is not None else self.assumed


@dataclass(frozen=True, slots=True)
class _NodeSource:
    """The parts of a Node object the inventory is built from; equal sources mean nothing to rebuild."""

    register: str | None
    cordon: str
    pair_scores: str | None
    allocatable: object


@dataclass(slots=True)
class _Node:
    source: _NodeSource
    gpus: NodeGPUs | None = None
    """None while unregistered."""
    reason: str = ""
    pair_score_error: str = ""


@dataclass(slots=True)
class _PodView:
    """A pod event, read: who it is and what (if anything) it holds."""

    uid: str
    namespace: str
    name: str
    terminal: bool
    held: Held | None
    skip_reason: str = ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("metadata")).get("annotations"))


def _text(annotations: Mapping[str, Any], key: str) -> str | None:
    value = annotations.get(key)
    return value if isinstance(value, str) else None


class ClusterCache:
    """Nodes' GPUs and pods' slices, kept current event by event. See the module docstring."""

    def __init__(self, resource_names: ResourceNames = _DEFAULT_NAMES) -> None:
        self._count_resource = resource_names.count
        self._nodes: dict[str, _Node] = {}
        self._registered: dict[str, NodeGPUs] = {}
        self._pods: dict[str, _Pod] = {}
        self._uid_by_key: dict[tuple[str, str], str] = {}
        self._on_node: dict[str, dict[str, tuple[GPUSlice, ...]]] = {}
        """node -> uid -> counted slices; the one record of what is added to each node's usage."""
        self._counted: dict[str, Held] = {}
        self._pod_skip: dict[str, str] = {}
        self._changed: set[str] = set()
        """Nodes whose `node_gpus` may differ since the last `drain_changed`."""
        self._assumed: set[str] = set()
        """uids that may carry an assumption (pruned lazily), so `expire` never walks every pod."""
        self._holdings: dict[str, PodHolding] = {}
        """Memo of `holding(uid)`, dropped whenever the pod's state changes (a scrape at 50,000 pods
        then copies references instead of building 50,000 values on the event loop)."""

    # --- reads -----------------------------------------------------------------------------------------

    def node_gpus(self, name: str) -> NodeGPUs | None:
        """The node's GPUs with current usage; None when unknown or unregistered."""
        return self._registered.get(name)

    def drain_changed(self) -> set[str]:
        """The nodes whose `node_gpus` changed (or that left) since the last call; for derived indexes."""
        changed, self._changed = self._changed, set()
        return changed

    def nodes(self) -> Iterable[str]:
        """Names of the registered nodes."""
        return self._registered.keys()

    def unregistered_reason(self, name: str) -> str | None:
        """`node unregistered: <why>` for a known node kept out, `node unregistered: node unknown` for
        a node never seen, None for a registered node."""
        if name in self._registered:
            return None
        node = self._nodes.get(name)
        return node.reason if node is not None else f"{UNREGISTERED}: node {name!r} is not known"

    def node_usage(self, name: str) -> NodeUsage | None:
        gpus = self._registered.get(name)
        return NodeUsage.of(gpus) if gpus is not None else None

    def usage(self) -> Iterator[tuple[str, NodeUsage]]:
        """(node, totals) for every registered node: the per-node metric counters."""
        for name, gpus in self._registered.items():
            yield name, NodeUsage.of(gpus)

    def holding(self, uid: str) -> PodHolding | None:
        found = self._holdings.get(uid)
        if found is not None:
            return found
        pod = self._pods.get(uid)
        held = self._counted.get(uid)
        if pod is None or held is None:
            return None
        found = self._holdings[uid] = PodHolding(
            uid, pod.namespace, pod.name, held.node, held.slices, pod.observed is None
        )
        return found

    def holdings(self, node: str | None = None) -> Iterator[PodHolding]:
        """Every counted pod (or those on `node`), assumed ones included."""
        uids: Iterable[str] = self._on_node.get(node, {}) if node is not None else self._counted
        for uid in list(uids):
            h = self.holding(uid)
            if h is not None:
                yield h

    def stats(self) -> CacheStats:
        return CacheStats(
            nodes=len(self._registered),
            unregistered=len(self._nodes) - len(self._registered),
            pods=len(self._counted),
            assumed=sum(
                1
                for uid in self._assumed
                if (p := self._pods.get(uid)) is not None and p.observed is None and p.assumed is not None
            ),
        )

    # --- node events -----------------------------------------------------------------------------------

    def node_upserted(self, node: Mapping[str, Any]) -> None:
        """A Node from a watch (ADDED or MODIFIED) or a list."""
        name = _mapping(node.get("metadata")).get("name")
        if not isinstance(name, str) or not name:
            log.warning("node event without metadata.name ignored")
            return
        annotations = _annotations(node)
        allocatable = _mapping(_mapping(node.get("status")).get("allocatable")).get(self._count_resource)
        source = _NodeSource(
            register=_text(annotations, NODE_REGISTER),
            cordon=_text(annotations, DEVICE_CORDON) or "",
            pair_scores=_text(annotations, NODE_PAIR_SCORE),
            allocatable=allocatable,
        )
        entry = self._nodes.get(name)
        if entry is not None and entry.source == source:
            return
        entry = self._build(name, source, entry)
        self._nodes[name] = entry
        self._changed.add(name)
        if entry.gpus is None:
            self._registered.pop(name, None)
            return
        held = self._on_node.get(name, {})
        self._registered[name] = with_slices(entry.gpus, chain.from_iterable(held.values()))

    def nodes_replaced(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full node list (a watch's relist): upsert each, drop the nodes it no longer has."""
        self.nodes_not_listed(self.nodes_listed(items))

    def nodes_listed(self, items: Iterable[Mapping[str, Any]]) -> set[str]:
        """One page of a node list: upsert each; returns their names (for `nodes_not_listed`)."""
        listed: set[str] = set()
        for node in items:
            name = _mapping(node.get("metadata")).get("name")
            if isinstance(name, str):
                listed.add(name)
            self.node_upserted(node)
        return listed

    def nodes_not_listed(self, listed: set[str]) -> None:
        """The end of a node list: drop the nodes it did not name."""
        for name in [n for n in self._nodes if n not in listed]:
            self.node_deleted(name)

    def node_deleted(self, name: str) -> None:
        """The Node is gone; its pods' slices stay recorded until their own events release them."""
        self._nodes.pop(name, None)
        self._registered.pop(name, None)
        self._changed.add(name)

    def _build(self, name: str, source: _NodeSource, old: _Node | None) -> _Node:
        reason = ""
        gpus: tuple[GPUInfo, ...] = ()
        if source.register is None:
            reason = f"annotation {NODE_REGISTER} is missing"
        else:
            try:
                gpus = decode_node_register(source.register)
            except WireFormatError as err:
                reason = str(err)
        if not reason:
            reason = self._allocatable_problem(source.allocatable)
        entry = _Node(source)
        if reason:
            entry.reason = f"{UNREGISTERED}: {reason}"
            if old is None or old.reason != entry.reason:
                log.warning("node %s: %s", name, entry.reason)
            return entry
        if old is not None and old.reason:
            log.info("node %s registered (%d GPUs)", name, len(gpus))
        pairs: tuple[GPUPairScore, ...] = ()
        if source.pair_scores is not None:
            try:
                pairs = decode_pair_scores(source.pair_scores)
            except WireFormatError as err:
                entry.pair_score_error = str(err)
                if old is None or old.pair_score_error != entry.pair_score_error:
                    log.warning("node %s: topology scores ignored: %s", name, err)
        entry.gpus = NodeGPUs.of(name, gpus, decode_device_cordon(source.cordon), pairs)
        return entry

    def _allocatable_problem(self, value: object) -> str:
        where = f'status.allocatable["{self._count_resource}"]'
        if value is None:
            return f"{where} is missing (device plugin not registered with the kubelet)"
        if not isinstance(value, str | int | float):
            return f"{where} is {value!r}, not a quantity"
        try:
            amount = parse_quantity(value)
        except QuantityError as err:
            return f"{where}: {err}"
        if amount <= 0:
            return f"{where} is {value} (device plugin gone or every GPU unhealthy)"
        return ""

    # --- pod events ------------------------------------------------------------------------------------

    def pod_upserted(self, pod: Mapping[str, Any]) -> None:
        """A Pod from a watch (ADDED or MODIFIED) or a list."""
        view = self._read_pod(pod)
        if view is None:
            return
        if view.terminal:
            self._drop_pod(view.uid)
            if view.namespace or view.name:  # a later delete by name must still find this uid
                self._uid_by_key[(view.namespace, view.name)] = view.uid
            return
        state = self._pods.get(view.uid)
        if state is None:
            state = self._pods[view.uid] = _Pod()
        state.namespace, state.name, state.seen = view.namespace, view.name, True
        if view.namespace or view.name:
            self._uid_by_key[(view.namespace, view.name)] = view.uid
        if view.skip_reason:
            if self._pod_skip.get(view.uid) != view.skip_reason:
                log.warning("pod %s/%s skipped: %s", view.namespace, view.name, view.skip_reason)
            self._pod_skip[view.uid] = view.skip_reason
        else:
            self._pod_skip.pop(view.uid, None)
        state.observed = view.held
        if view.held is not None:
            state.assumed = None  # confirmed: the watch's copy replaces the assumption
        self._settle(view.uid)

    def pods_replaced(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full pod list (a watch's relist): upsert each, drop the pods a watch showed before that the
        list no longer has. Pods known only through `assume` stay (their bind may be in flight)."""
        self.pods_not_listed(self.pods_listed(items))

    def pods_listed(self, items: Iterable[Mapping[str, Any]]) -> set[str]:
        """One page of a pod list: upsert each; returns their uids (for `pods_not_listed`)."""
        listed: set[str] = set()
        for pod in items:
            uid = _mapping(pod.get("metadata")).get("uid")
            if isinstance(uid, str):
                listed.add(uid)
            self.pod_upserted(pod)
        return listed

    def pods_not_listed(self, listed: set[str]) -> None:
        """The end of a pod list: drop the pods a watch showed before that the list did not name."""
        for uid in [u for u, p in self._pods.items() if p.seen and u not in listed]:
            self._drop_pod(uid)

    def pod_deleted(self, namespace: str, name: str, uid: str = "") -> None:
        """The Pod is gone (uid from the DELETED object; if empty, the last uid seen under that name)."""
        if not uid:
            uid = self._uid_by_key.get((namespace, name), "")
        if uid:
            self._drop_pod(uid)

    def _read_pod(self, pod: Mapping[str, Any]) -> _PodView | None:
        meta = _mapping(pod.get("metadata"))
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            log.warning("pod event without metadata.uid ignored")
            return None
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        phase = _mapping(pod.get("status")).get("phase")
        view = _PodView(uid, namespace, name, phase in TERMINAL_PHASES, None)
        if view.terminal:
            return view
        annotations = _annotations(pod)
        node_text = _text(annotations, VGPU_NODE)
        if node_text is None:
            return view
        try:
            node = decode_vgpu_node(node_text)
            allocation = self._allocation(annotations)
            kinds = pod_container_kinds(pod)
        except (WireFormatError, RequestError) as err:
            view.skip_reason = str(err)
            return view
        view.held = Held(node, footprint_slices(allocation, kinds))
        return view

    @staticmethod
    def _allocation(annotations: Mapping[str, Any]) -> PodAllocation:
        allocated = _text(annotations, DEVICES_ALLOCATED)
        if allocated:
            return decode_pod_allocation(allocated, DEVICES_ALLOCATED)
        return decode_pod_allocation(_text(annotations, DEVICES_TO_ALLOCATE) or "", DEVICES_TO_ALLOCATE)

    def _drop_pod(self, uid: str) -> None:
        self._holdings.pop(uid, None)
        state = self._pods.pop(uid, None)
        self._pod_skip.pop(uid, None)
        if state is not None and self._uid_by_key.get((state.namespace, state.name)) == uid:
            del self._uid_by_key[(state.namespace, state.name)]
        self._set_counted(uid, None)

    # --- binder ----------------------------------------------------------------------------------------

    def assume(
        self,
        uid: str,
        node: str,
        allocation: PodAllocation,
        kinds: Sequence[ContainerKind],
        now: float,
        *,
        namespace: str = "",
        name: str = "",
    ) -> None:
        """Count a pod the binder is binding to `node` from now on, until a watch event confirms it.
        A pod the watch already shows with its allocation is counted from that and not assumed again;
        assuming a pod twice keeps the latest choice."""
        state = self._pods.get(uid)
        if state is None:
            state = self._pods[uid] = _Pod(namespace, name)
            if namespace or name:
                self._uid_by_key[(namespace, name)] = uid
        if state.observed is not None:
            return
        state.assumed = Held(node, footprint_slices(allocation, kinds))
        state.assumed_at = now
        self._assumed.add(uid)
        self._settle(uid)

    def forget(self, uid: str) -> None:
        """Drop the assumption for `uid` (the bind failed); a confirmed pod is left alone."""
        state = self._pods.get(uid)
        if state is None or state.assumed is None:
            return
        state.assumed = None
        if state.seen:
            self._settle(uid)
        else:
            self._drop_pod(uid)  # known only through `assume`: leaves no trace

    def expire(self, now: float, ttl: float) -> list[str]:
        """Forget assumptions older than `ttl` seconds that no watch event confirmed; returns their uids."""
        stale: list[str] = []
        for uid in list(self._assumed):
            p = self._pods.get(uid)
            if p is None or p.assumed is None or p.observed is not None:
                self._assumed.discard(uid)
            elif now - p.assumed_at > ttl:
                stale.append(uid)
        for uid in stale:
            self.forget(uid)
            self._assumed.discard(uid)
        return stale

    # --- the one place usage changes -------------------------------------------------------------------

    def _settle(self, uid: str) -> None:
        self._holdings.pop(uid, None)
        state = self._pods.get(uid)
        self._set_counted(uid, state.counted if state is not None else None)

    def _set_counted(self, uid: str, new: Held | None) -> None:
        old = self._counted.get(uid)
        if old == new:
            return
        if old is not None:
            del self._counted[uid]
            on_node = self._on_node.get(old.node, {})
            if on_node.pop(uid, None) is not None:
                if not on_node:
                    self._on_node.pop(old.node, None)
                gpus = self._registered.get(old.node)
                if gpus is not None:
                    self._registered[old.node] = without_slices(gpus, old.slices)
                    self._changed.add(old.node)
        if new is not None:
            self._counted[uid] = new
            self._on_node.setdefault(new.node, {})[uid] = new.slices
            gpus = self._registered.get(new.node)
            if gpus is not None:
                self._registered[new.node] = with_slices(gpus, new.slices)
                self._changed.add(new.node)


__all__ = [
    "TERMINAL_PHASES",
    "UNREGISTERED",
    "CacheStats",
    "ClusterCache",
    "Held",
    "NodeUsage",
    "PodHolding",
]
