"""Per-GPU usage: what fit and score read about a node's GPUs. Pure, frozen values.

A `GPUUsage` is a GPU's inventory entry plus what the pods placed on it hold: slots (one per container
slice), memory in MiB and cores in percent, and whether it is out of service (unhealthy, cordoned).
`NodeGPUs` is one node's GPUs with the optional topology pair scores.

`with_slices` / `without_slices` add or remove slices and return a new value; slices that name a GPU the
node does not (or no longer) advertise are ignored, since a pod may outlive its GPU's inventory entry.
`peak_slices` turns a pod's allocation into what it holds at its peak: init containers run one at a time
before the regular ones, so per GPU the pod holds the larger of its regular containers' sum and each
init container's slice (memory, cores and slots compared separately).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from hami_api.types import GPUInfo, GPUPairScore, GPUSlice, PodAllocation


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """One GPU and what is placed on it. `used` counts slices (containers sharing it)."""

    info: GPUInfo
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    unhealthy: bool = False
    """Out of service for health reasons (NVML, heartbeat) on top of the inventory's own flag."""
    cordoned: bool = False

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def healthy(self) -> bool:
        return self.info.health and not self.unhealthy

    @property
    def free_slots(self) -> int:
        return self.info.count - self.used

    @property
    def free_mem(self) -> int:
        return self.info.devmem - self.usedmem

    @property
    def free_cores(self) -> int:
        return self.info.devcore - self.usedcores

    def plus(self, slots: int, mem: int, cores: int) -> GPUUsage:
        return replace(
            self, used=self.used + slots, usedmem=self.usedmem + mem, usedcores=self.usedcores + cores
        )


@dataclass(frozen=True, slots=True)
class NodeGPUs:
    """A node's GPUs in inventory order, and the topology scores between them (higher = better link)."""

    name: str
    gpus: tuple[GPUUsage, ...] = ()
    pair_scores: tuple[GPUPairScore, ...] = ()
    _pairs: Mapping[str, Mapping[str, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pairs", {p.uuid: p.as_dict() for p in self.pair_scores})

    def pair_score(self, a: str, b: str) -> int:
        """Score of the link a-b as advertised from a, else from b, else 0."""
        score = self._pairs.get(a, {}).get(b)
        if score is None:
            score = self._pairs.get(b, {}).get(a, 0)
        return score

    def gpu(self, uuid: str) -> GPUUsage | None:
        return next((g for g in self.gpus if g.id == uuid), None)

    @staticmethod
    def of(
        name: str,
        gpus: Iterable[GPUInfo],
        cordoned: Iterable[str] = (),
        pair_scores: Iterable[GPUPairScore] = (),
    ) -> NodeGPUs:
        """A node with nothing placed yet; `cordoned` lists the UUIDs of hami.io/device-cordon."""
        fenced = frozenset(cordoned)
        return NodeGPUs(
            name,
            tuple(GPUUsage(g, cordoned=g.id in fenced) for g in gpus),
            tuple(pair_scores),
        )


def _apply(node: NodeGPUs, slices: Iterable[GPUSlice], sign: int) -> NodeGPUs:
    delta: dict[str, tuple[int, int, int]] = {}
    for s in slices:
        slots, mem, cores = delta.get(s.uuid, (0, 0, 0))
        delta[s.uuid] = (slots + sign, mem + sign * s.usedmem, cores + sign * s.usedcores)
    if not delta:
        return node
    gpus = tuple(g.plus(*delta[g.id]) if g.id in delta else g for g in node.gpus)
    return replace(node, gpus=gpus)


def with_slices(node: NodeGPUs, slices: Iterable[GPUSlice]) -> NodeGPUs:
    """The node with `slices` placed on it (each slice takes one slot of its GPU)."""
    return _apply(node, slices, 1)


def without_slices(node: NodeGPUs, slices: Iterable[GPUSlice]) -> NodeGPUs:
    """The node with `slices` released (the inverse of `with_slices`)."""
    return _apply(node, slices, -1)


def peak_slices(allocation: PodAllocation, init_containers: int) -> tuple[GPUSlice, ...]:
    """What the pod holds per GPU at its peak, one slice per slot held; entries before
    `init_containers` are init containers. Order: by first appearance in the allocation."""
    regular: dict[str, list[GPUSlice]] = {}
    init_peak: dict[str, tuple[int, int, int]] = {}
    order: list[str] = []
    for index, container in enumerate(allocation):
        for s in container.devices:
            if s.uuid not in regular and s.uuid not in init_peak:
                order.append(s.uuid)
            if index < init_containers:
                slots, mem, cores = init_peak.get(s.uuid, (0, 0, 0))
                init_peak[s.uuid] = (max(slots, 1), max(mem, s.usedmem), max(cores, s.usedcores))
            else:
                regular.setdefault(s.uuid, []).append(s)
    out: list[GPUSlice] = []
    for uuid in order:
        held = regular.get(uuid, [])
        slots, mem, cores = init_peak.get(uuid, (0, 0, 0))
        extra_mem = max(0, mem - sum(s.usedmem for s in held))
        extra_cores = max(0, cores - sum(s.usedcores for s in held))
        if held:
            out.extend(held)
            if extra_mem or extra_cores:
                # The init container's larger share rides on the first regular slice (same slot count).
                first = held[0]
                out[len(out) - len(held)] = replace(
                    first, usedmem=first.usedmem + extra_mem, usedcores=first.usedcores + extra_cores
                )
        else:
            vendor = next(s.vendor for c in allocation for s in c.devices if s.uuid == uuid)
            out.append(GPUSlice(uuid, mem, cores, vendor))
    return tuple(out)


__all__ = ["GPUUsage", "NodeGPUs", "peak_slices", "with_slices", "without_slices"]
