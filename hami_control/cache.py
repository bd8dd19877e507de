"""Incremental cluster state: every registered node's GPUs with what the pods placed on them hold.

Pure and event-driven: the node watch calls `node_upserted` / `node_deleted` with the Node's JSON, the pod
store (`pod_store.PodStore`, which reads every pod event once and owns the observed-versus-assumed
rule) calls `hold` with what each pod holds now; nothing here reads the clock or the network. Not
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

**MIG reservations.** A pod's `hami.io/vgpu-mig-allocations` entries ride with its holding (`mig`) and
take their placements on the node's mig-mode GPUs, paired with the pod's slices as HAMi's getNodesUsage
does (`usage` module docstring: an unpaired reservation or slice takes the GPU out of service while the
pod holds it).

**Holdings.** `hold(uid, holding)` says what one pod holds now (its node and peak slices, observed or
assumed; None: nothing), replacing what it held before: the old slices leave their node, the new ones
join theirs. Pods may hold slices on a node before it registers: they count as soon as it does.

**Other vendors** (the registry's vendors besides NVIDIA, `hami_control.devices`): each vendor's devices
are decoded from the node as that vendor's backend says (`Vendor.node_devices`: an annotation or the
node's capacity), and they are usable while the vendor's count resource is allocatable on the node (the
same liveness rule as NVIDIA's: its plugin is registered with the kubelet; HAMi's vendor handshakes are
not written). A vendor whose inventory does not decode is left out on that node, with the reason
(`vendor_problems`, logged once per distinct reason); the node's other vendors and its NVIDIA GPUs are
not affected. `vendor_devices(name)` is every usable vendor device of the node in one `NodeGPUs`
(vendors in registry order), with what the pods hold on them: holdings apply to NVIDIA's and the
vendors' devices alike (a slice names its device).

Every change replaces the affected node's `NodeGPUs` value, so `node_gpus` is a dict lookup, and gives
the node a new `generation` (never reused, even across a delete and re-add), so a GPU choice fitted on
one generation can be reused exactly while the generation holds; a node event rebuilds only that node
(and only when its annotations or allocatable changed).

*Batches* (`batch()`, the pod store's list): inside one, holdings are recorded but their nodes'
`NodeGPUs` are rebuilt once each when it ends, from the node's inventory and everything held on it
(`_with_held`, what a node event does), instead of once per pod placed (a list brings ten pods a node
at once); the cache after a batch is the cache after the same calls one by one
(`tests/unit/test_cache_batch.py`). Nothing reads `node_gpus` inside a batch (the pod store's
listeners do not). Usage never goes negative: slices are removed
only from the node they were added to, under the same inventory, and releasing what was never added is
a no-op.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from hami_api.annotations import (
    DEVICE_CORDON,
    NODE_PAIR_SCORE,
    NODE_REGISTER,
    decode_device_cordon,
    decode_node_register,
    decode_pair_scores,
)
from hami_api.errors import QuantityError, WireFormatError
from hami_api.mig_alloc import MigAllocation
from hami_api.quantity import parse_quantity
from hami_api.resources import ResourceNames
from hami_api.types import NVIDIA, GPUInfo, GPUPairScore, GPUSlice
from hami_control.devices.base import DevicePods, HealthRule, Vendor, node_quantity
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
    mig: tuple[MigAllocation, ...] = ()
    """Its MIG reservations (`hami.io/vgpu-mig-allocations`), all of them: an instance lives as long as
    the pod."""


@dataclass(frozen=True, slots=True)
class PodHolding:
    """What a counted pod holds (for metrics and the binder): `assumed` while only the binder says so,
    until a watch event confirms it."""

    uid: str
    namespace: str
    name: str
    node: str
    slices: tuple[GPUSlice, ...]
    assumed: bool
    annotations: tuple[tuple[str, str], ...] = ()
    """The pod's annotations, for a pod holding devices of a vendor whose Fit reads the pods on each
    device (Metax sGPU's app class: `device_pods`); () otherwise."""
    mig: tuple[MigAllocation, ...] = ()
    """Its MIG reservations (`Held.mig`)."""


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


@dataclass(frozen=True, slots=True)
class _NodeSource:
    """The parts of a Node object the inventory is built from; equal sources mean nothing to rebuild."""

    register: str | None
    cordon: str
    pair_scores: str | None
    allocatable: object
    nvidia_mode: bool = False
    """GPU feature discovery's sharing labels are on the node: hami-node serves it in NVIDIA's own modes
    (docs/nvidia-sharing.md), which never write HAMi's register."""


NVIDIA_MODE_LABELS = ("nvidia.com/gpu.sharing-strategy", "nvidia.com/mig.strategy")
"""GFD labels hami-node writes in NVIDIA's modes (hami_node.nvidia.labels); either marks such a node."""


@dataclass(slots=True)
class _Node:
    source: _NodeSource
    gpus: NodeGPUs | None = None
    """None while unregistered."""
    reason: str = ""
    pair_score_error: str = ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _milli(value: object) -> int | None:
    """A quantity in thousandths, rounded up (None: absent or not a quantity)."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    try:
        return math.ceil(parse_quantity(value) * 1000)
    except (QuantityError, ValueError):
        return None


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("metadata")).get("annotations"))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("metadata")).get("labels"))


def _text(annotations: Mapping[str, Any], key: str) -> str | None:
    value = annotations.get(key)
    return value if isinstance(value, str) else None


def _not_live(vendor: Vendor, node: Mapping[str, Any]) -> str:
    """Why a vendor's devices on `node` are not in service ("" when they are), by the vendor's health rule
    (HAMi's CheckHealth): a handshake vendor while its count resource is allocatable (its plugin is
    registered with the kubelet: our stand-in for the handshake, as for NVIDIA); a capacity vendor while
    the count is in the node's capacity; the others always (their inventory is their liveness)."""
    names = vendor.names
    if names.health is HealthRule.HANDSHAKE and node_quantity(node, "allocatable", names.count) <= 0:
        return (
            f"status.allocatable[{names.count!r}] is missing or 0 "
            "(its device plugin is not registered with the kubelet)"
        )
    if names.health is HealthRule.CAPACITY and node_quantity(node, "capacity", names.count) <= 0:
        return f"status.capacity[{names.count!r}] is missing or 0"
    return ""


class ClusterCache:
    """Nodes' GPUs and pods' slices, kept current event by event. See the module docstring."""

    def __init__(
        self, resource_names: ResourceNames = _DEFAULT_NAMES, vendors: Sequence[Vendor] = ()
    ) -> None:
        self._count_resource = resource_names.count
        self._vendors = tuple(v for v in vendors if not v.native)
        self._vendor_base: dict[str, tuple[GPUInfo, ...]] = {}
        """node -> its usable vendor devices (no usage)."""
        self._vendor_devices: dict[str, NodeGPUs] = {}
        """node -> its usable vendor devices with what the pods hold (only nodes that have some)."""
        self._vendor_problems: dict[str, tuple[str, ...]] = {}
        self._vendor_nodes: dict[str, Mapping[str, Any]] = {}
        self._expected: dict[str, str] = {}
        """Device id -> what a vendor expects its inventory to show after a placement (`expect`)."""
        """node -> the parts of its Node object the vendors' ScoreNode reads (name, labels, annotations),
        for nodes with vendor devices."""
        self._nodes: dict[str, _Node] = {}
        self._registered: dict[str, NodeGPUs] = {}
        self._generations: dict[str, int] = {}
        self._next_generation = itertools.count(1)
        self._holdings: dict[str, PodHolding] = {}
        """uid -> what the pod holds; with `_on_node`, the one record of what is added to each node."""
        self._on_node: dict[str, dict[str, tuple[GPUSlice, ...]]] = {}
        """node -> uid -> counted slices."""
        self._mig_on_node: dict[str, dict[str, tuple[MigAllocation, ...]]] = {}
        """node -> uid -> counted MIG reservations (pods that have some)."""
        self._assumed = 0
        """How many holdings are assumed."""
        self._changed: set[str] = set()
        """Nodes whose `node_gpus` may differ since the last `drain_changed`."""
        self._cpu: dict[str, int] = {}
        self._cpu_changed: set[str] = set()
        """Nodes whose `cpu_allocatable` may differ since the last `drain_cpu_changed`."""
        """node -> its `status.allocatable.cpu` in milli-cores (nodes that publish one that parses)."""
        self._batch: set[str] | None = None
        """Inside `batch()`: the nodes whose holdings changed, rebuilt when it ends."""

    # --- reads -----------------------------------------------------------------------------------------

    def node_gpus(self, name: str) -> NodeGPUs | None:
        """The node's GPUs with current usage; None when unknown or unregistered."""
        return self._registered.get(name)

    def vendor_devices(self, name: str) -> NodeGPUs | None:
        """The node's usable devices of the other vendors with current usage; None when it has none."""
        return self._vendor_devices.get(name)

    def device_pods(self, name: str) -> DevicePods:
        """The pods holding each of the node's other-vendor devices, one per slice (HAMi's
        DeviceUsage.PodInfos), as objects with their namespace, name and annotations."""
        pods: dict[str, list[Mapping[str, Any]]] = {}
        for holding in self.holdings(name):
            obj = {
                "metadata": {
                    "namespace": holding.namespace,
                    "name": holding.name,
                    "annotations": dict(holding.annotations),
                }
            }
            for s in holding.slices:
                if s.vendor != NVIDIA:
                    pods.setdefault(s.uuid, []).append(obj)
        return pods

    @property
    def expectations(self) -> Mapping[str, str]:
        """What the vendors expect of their devices after placements the inventories do not show yet
        (`Vendor.placement_expectations`: Metax sGPU's QoS policies), by device id."""
        return self._expected

    def expect(self, expected: Mapping[str, str]) -> None:
        """Record a placement's expectations (the binder, once its Binding is written)."""
        if expected:
            self._expected = {**self._expected, **expected}

    @property
    def vendors(self) -> tuple[Vendor, ...]:
        """The vendors whose devices the cache decodes (every one of the registry but NVIDIA)."""
        return self._vendors

    def vendor_nodes(self) -> Iterable[str]:
        """The nodes with devices of the other vendors in service."""
        return self._vendor_devices.keys()

    def vendor_node(self, name: str) -> Mapping[str, Any]:
        """The node's name, labels and annotations as the vendors' ScoreNode reads them ({} if unknown)."""
        return self._vendor_nodes.get(name, {})

    def vendor_problems(self, name: str) -> tuple[str, ...]:
        """Why vendors' devices of the node are left out (`<family>: <why>`), empty when none is."""
        return self._vendor_problems.get(name, ())

    def generation(self, name: str) -> int:
        """A number that changes whenever `node_gpus(name)` does (0 for a node never seen): a fit made at
        one generation is the fit the node would give again while its generation is unchanged."""
        return self._generations.get(name, 0)

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

    def cpu_allocatable(self, name: str) -> int | None:
        """The node's allocatable CPU in milli-cores (None: unknown, or not a quantity)."""
        return self._cpu.get(name)

    def drain_cpu_changed(self) -> set[str]:
        """The nodes whose `cpu_allocatable` changed since the last call (for the free-CPU index,
        `gputable.FreeCPU`)."""
        changed, self._cpu_changed = self._cpu_changed, set()
        return changed

    def node_usage(self, name: str) -> NodeUsage | None:
        gpus = self._registered.get(name)
        return NodeUsage.of(gpus) if gpus is not None else None

    def usage(self) -> Iterator[tuple[str, NodeUsage]]:
        """(node, totals) for every registered node: the per-node metric counters."""
        for name, gpus in self._registered.items():
            yield name, NodeUsage.of(gpus)

    def holding(self, uid: str) -> PodHolding | None:
        return self._holdings.get(uid)

    def holdings(self, node: str | None = None) -> Iterator[PodHolding]:
        """Every counted pod (or those on `node`), assumed ones included."""
        if node is None:
            yield from list(self._holdings.values())
            return
        for uid in list(self._on_node.get(node, {})):
            h = self._holdings.get(uid)
            if h is not None:
                yield h

    def stats(self) -> CacheStats:
        return CacheStats(
            nodes=len(self._registered),
            unregistered=len(self._nodes) - len(self._registered),
            pods=len(self._holdings),
            assumed=self._assumed,
        )

    def _set_gpus(self, name: str, gpus: NodeGPUs | None) -> None:
        """The one place a node's `NodeGPUs` changes: a new generation, and the node marked changed."""
        if gpus is None:
            self._registered.pop(name, None)
        else:
            self._registered[name] = gpus
        self._generations[name] = next(self._next_generation)
        self._changed.add(name)

    # --- node events -----------------------------------------------------------------------------------

    def node_upserted(self, node: Mapping[str, Any]) -> None:
        """A Node from a watch (ADDED or MODIFIED) or a list."""
        name = _mapping(node.get("metadata")).get("name")
        if not isinstance(name, str) or not name:
            log.warning("node event without metadata.name ignored")
            return
        annotations = _annotations(node)
        resources = _mapping(_mapping(node.get("status")).get("allocatable"))
        cpu = _milli(resources.get("cpu"))
        if cpu != self._cpu.get(name):
            self._cpu_changed.add(name)
        if cpu is None:
            self._cpu.pop(name, None)
        else:
            self._cpu[name] = cpu
        allocatable = resources.get(self._count_resource)
        source = _NodeSource(
            register=_text(annotations, NODE_REGISTER),
            cordon=_text(annotations, DEVICE_CORDON) or "",
            pair_scores=_text(annotations, NODE_PAIR_SCORE),
            allocatable=allocatable,
            nvidia_mode=any(key in _labels(node) for key in NVIDIA_MODE_LABELS),
        )
        if self._vendors:
            self._vendor_upserted(name, node)
        entry = self._nodes.get(name)
        if entry is not None and entry.source == source:
            return
        entry = self._build(name, source, entry)
        self._nodes[name] = entry
        if entry.gpus is None:
            self._set_gpus(name, None)
            return
        self._set_gpus(name, self._with_held(entry.gpus, name))

    def _with_held(self, gpus: NodeGPUs, name: str) -> NodeGPUs:
        """`gpus` with what the pods on node `name` hold; pod by pod where MIG reservations pair."""
        held = self._on_node.get(name, {})
        mig = self._mig_on_node.get(name, {})
        if not gpus.has_mig and not mig:
            return with_slices(gpus, chain.from_iterable(held.values()))
        for uid, slices in held.items():
            gpus = with_slices(gpus, slices, mig.get(uid, ()))
        return gpus

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

    def _vendor_upserted(self, name: str, node: Mapping[str, Any]) -> None:
        """Decode every vendor's devices of the node; replace the node's vendor devices if they changed."""
        devices: list[GPUInfo] = []
        problems: list[str] = []
        for vendor in self._vendors:
            try:
                found = vendor.node_devices(node)
            except WireFormatError as err:
                problems.append(f"{vendor.names.family}: {err}")
                continue
            if not found:
                continue
            dead = _not_live(vendor, node)
            if dead:
                problems.append(f"{vendor.names.family}: {dead}")
                continue
            devices.extend(found)
        old_problems = self._vendor_problems.get(name, ())
        if tuple(problems) != old_problems:
            for problem in problems:
                if problem not in old_problems:
                    log.warning("node %s: devices left out: %s", name, problem)
            if problems:
                self._vendor_problems[name] = tuple(problems)
            else:
                self._vendor_problems.pop(name, None)
        base = tuple(devices)
        if self._expected and base:
            for vendor in self._vendors:
                self._expected = vendor.settled_expectations(self._expected, base)
        if base:
            meta = _mapping(node.get("metadata"))
            self._vendor_nodes[name] = {
                "metadata": {
                    "name": name,
                    "labels": _mapping(meta.get("labels")),
                    "annotations": _annotations(node),
                }
            }
        else:
            self._vendor_nodes.pop(name, None)
        if self._vendor_base.get(name, ()) == base:
            return
        if base:
            self._vendor_base[name] = base
            held = self._on_node.get(name, {})
            self._vendor_devices[name] = with_slices(
                NodeGPUs.of(name, base), chain.from_iterable(held.values())
            )
        else:
            self._vendor_base.pop(name, None)
            self._vendor_devices.pop(name, None)
        self._generations[name] = next(self._next_generation)
        self._changed.add(name)

    def node_deleted(self, name: str) -> None:
        """The Node is gone; its pods' slices stay recorded until their own events release them."""
        self._vendor_base.pop(name, None)
        self._vendor_devices.pop(name, None)
        self._vendor_problems.pop(name, None)
        self._vendor_nodes.pop(name, None)
        self._nodes.pop(name, None)
        self._cpu.pop(name, None)
        self._cpu_changed.add(name)
        self._generations.pop(name, None)
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
                # A node of the other vendors only has no NVIDIA GPU to register, and a node in NVIDIA's
                # own modes never registers (kube-scheduler alone places its pods): not worth a warning.
                quiet = name in self._vendor_base or (source.register is None and source.nvidia_mode)
                level = logging.DEBUG if quiet else logging.WARNING
                log.log(level, "node %s: %s", name, entry.reason)
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

    # --- holdings (from the pod store) ------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Holdings changed inside the block rebuild each node they touch once, when it ends (see the
        module docstring). Nests: the outermost block rebuilds."""
        if self._batch is not None:
            yield
            return
        touched: set[str] = set()
        self._batch = touched
        try:
            yield
        finally:
            self._batch = None
            for name in touched:
                entry = self._nodes.get(name)
                if entry is not None and entry.gpus is not None:
                    self._set_gpus(name, self._with_held(entry.gpus, name))

    def hold(self, uid: str, holding: PodHolding | None) -> None:
        """What pod `uid` holds from now on (None: nothing), in place of what it held before."""
        old = self._holdings.get(uid)
        if old == holding:
            return
        self._assumed += (holding is not None and holding.assumed) - (old is not None and old.assumed)
        if holding is None:
            del self._holdings[uid]
        else:
            self._holdings[uid] = holding
            if (
                old is not None
                and old.node == holding.node
                and old.slices == holding.slices
                and old.mig == holding.mig
            ):
                return  # the same slices (an assumption confirmed): usage unchanged
        batch = self._batch
        if old is not None:
            on_node = self._on_node.get(old.node, {})
            if on_node.pop(uid, None) is not None:
                if not on_node:
                    self._on_node.pop(old.node, None)
                mig_on_node = self._mig_on_node.get(old.node, {})
                if mig_on_node.pop(uid, None) is not None and not mig_on_node:
                    self._mig_on_node.pop(old.node, None)
                self._change_usage(old.node, batch, lambda gpus: without_slices(gpus, old.slices, old.mig))
                self._vendor_hold(old.node, old.slices, -1)
        if holding is not None:
            self._on_node.setdefault(holding.node, {})[uid] = holding.slices
            if holding.mig:
                self._mig_on_node.setdefault(holding.node, {})[uid] = holding.mig
            self._change_usage(
                holding.node, batch, lambda gpus: with_slices(gpus, holding.slices, holding.mig)
            )
            self._vendor_hold(holding.node, holding.slices, 1)

    def _change_usage(
        self, node: str, batch: set[str] | None, change: Callable[[NodeGPUs], NodeGPUs]
    ) -> None:
        """Apply `change` to the node's usage now, or inside a batch mark the node for its rebuild."""
        if batch is not None:
            batch.add(node)
            return
        gpus = self._registered.get(node)
        if gpus is not None:
            self._set_gpus(node, change(gpus))

    def _vendor_hold(self, node: str, slices: tuple[GPUSlice, ...], sign: int) -> None:
        devices = self._vendor_devices.get(node)
        if devices is None or all(s.vendor == NVIDIA for s in slices):
            return
        changed = with_slices(devices, slices) if sign > 0 else without_slices(devices, slices)
        if changed is not devices:
            self._vendor_devices[node] = changed
            self._generations[node] = next(self._next_generation)
            self._changed.add(node)


__all__ = [
    "TERMINAL_PHASES",
    "UNREGISTERED",
    "CacheStats",
    "ClusterCache",
    "Held",
    "NodeUsage",
    "PodHolding",
]
