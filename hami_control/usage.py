"""Per-GPU usage: what fit and score read about a node's GPUs. Pure, frozen values.

A `GPUUsage` is a GPU's inventory entry plus what the pods placed on it hold: slots (one per container
slice), memory in MiB and cores in percent, and whether it is out of service (unhealthy, cordoned).
`NodeGPUs` is one node's GPUs with the optional topology pair scores.

`with_slices` / `without_slices` add or remove slices and return a new value; slices that name a GPU the
node does not (or no longer) advertise are ignored, since a pod may outlive its GPU's inventory entry.
What a pod holds at its busiest moment (`hami_api.containers.footprint_slices`) is what gets placed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from hami_api.types import GPUInfo, GPUPairScore, GPUSlice


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


__all__ = ["GPUUsage", "NodeGPUs", "with_slices", "without_slices"]
