"""Per-GPU usage: what fit and score read about a node's GPUs. Pure, frozen values.

A `GPUUsage` is a GPU's inventory entry plus what the pods placed on it hold: slots (one per container
slice), memory in MiB and cores in percent, and whether it is out of service (unhealthy, cordoned).
`NodeGPUs` is one node's GPUs with the optional topology pair scores.

`with_slices` / `without_slices` add or remove slices and return a new value; slices that name a GPU the
node does not (or no longer) advertise are ignored, since a pod may outlive its GPU's inventory entry.
What a pod holds at its busiest moment (`hami_api.containers.footprint_slices`) is what gets placed.

**Dynamic MIG** (HAMi v2.10, GPUs whose register `mode` is "mig"): a GPU also records the MIG placements
its pods reserved (`mig_in_use`, from `hami.io/vgpu-mig-allocations`), which `fit` replays HAMi's profile
choice against. `with_slices(node, slices, mig)` pairs a pod's reservations with its slices by GPU UUID
as HAMi's scheduler `getNodesUsage` does, and where HAMi marks the GPU unhealthy so does this, counting
the pods that make it so (`mig_faults`; the GPU is back in service when they leave): a reservation on a
GPU that is not in mig mode (HAMi: "found a mig task running on a hami-core GPU", "unconsumed MIG
reservations reference a non-MIG device"), or a pod with slices on a mig GPU and no reservation there
("MIG Pod lacks a matching profile/placement reservation"). A reservation naming a GPU the node does not
advertise is ignored like a slice on such a GPU (HAMi fails every mig GPU of the node closed: the UUID
names a physical GPU, so no placement of another GPU can be taken by it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hami_api.mig_alloc import MIG_MODE, MigAllocation
from hami_api.types import GPUInfo, GPUPairScore, GPUSlice, MigPlacement


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
    mig_in_use: tuple[MigPlacement, ...] = ()
    """The MIG placements the pods on a mig-mode GPU reserved, in the order they were added."""
    mig_faults: int = 0
    """Pods whose MIG reservations do not pair with this GPU (see the module docstring): out of service
    while above 0, as HAMi's getNodesUsage sets Health=false."""

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def is_mig(self) -> bool:
        """The GPU is in HAMi's dynamic MIG mode."""
        return self.info.mode == MIG_MODE

    @property
    def healthy(self) -> bool:
        return self.info.health and not self.unhealthy and not self.mig_faults

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
        # every field named (`dataclasses.replace` costs ~4x: a node list adds to each GPU of 15,000 nodes)
        return GPUUsage(
            self.info,
            self.used + slots,
            self.usedmem + mem,
            self.usedcores + cores,
            self.unhealthy,
            self.cordoned,
            self.mig_in_use,
            self.mig_faults,
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
        object.__setattr__(self, "has_mig", any(g.info.mode == MIG_MODE for g in self.gpus))

    has_mig: bool = field(init=False, repr=False, compare=False, default=False)
    """Some GPU is in mig mode (then fit goes through HAMi's MIG rules, node by node)."""

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
    return NodeGPUs(node.name, gpus, node.pair_scores)


def _apply_mig(
    node: NodeGPUs, slices: Sequence[GPUSlice], mig: Sequence[MigAllocation], sign: int
) -> NodeGPUs:
    """One pod's MIG reservations and their pairing with its slices (module docstring), added or removed."""
    if not mig and not node.has_mig:
        return node
    on_gpu: dict[str, list[MigPlacement]] = {}
    for a in mig:
        on_gpu.setdefault(a.gpu_uuid, []).append(a.placement)
    sliced = {s.uuid for s in slices}
    gpus = list(node.gpus)
    changed = False
    for i, gpu in enumerate(gpus):
        placements = on_gpu.get(gpu.id, [])
        fault = (bool(placements) and not gpu.is_mig) or (gpu.is_mig and gpu.id in sliced and not placements)
        if gpu.is_mig and placements:
            if sign > 0:
                in_use = (*gpu.mig_in_use, *placements)
            else:
                left = list(gpu.mig_in_use)
                for p in placements:
                    if p in left:
                        left.remove(p)
                in_use = tuple(left)
            gpus[i] = replace(gpu, mig_in_use=in_use)
            changed = True
        if fault:
            gpus[i] = replace(gpus[i], mig_faults=max(gpus[i].mig_faults + sign, 0))
            changed = True
    return replace(node, gpus=tuple(gpus)) if changed else node


def with_slices(node: NodeGPUs, slices: Iterable[GPUSlice], mig: Sequence[MigAllocation] = ()) -> NodeGPUs:
    """The node with `slices` placed on it (each slice takes one slot of its GPU); `mig`: the same pod's
    MIG reservations (`hami.io/vgpu-mig-allocations`), paired with its slices (module docstring)."""
    if not mig and not node.has_mig:
        return _apply(node, slices, 1)
    kept = tuple(slices)
    return _apply_mig(_apply(node, kept, 1), kept, mig, 1)


def without_slices(node: NodeGPUs, slices: Iterable[GPUSlice], mig: Sequence[MigAllocation] = ()) -> NodeGPUs:
    """The node with `slices` (and the same pod's `mig` reservations) released: the inverse of
    `with_slices`."""
    if not mig and not node.has_mig:
        return _apply(node, slices, -1)
    kept = tuple(slices)
    return _apply_mig(_apply(node, kept, -1), kept, mig, -1)


def with_mig(node: NodeGPUs, placements: Iterable[tuple[str, MigPlacement]]) -> NodeGPUs:
    """The node with MIG placements (GPU UUID, placement) taken, nothing else changed: what `fit` adds
    for the containers of the pod it places (their instances live as long as the pod)."""
    add: dict[str, list[MigPlacement]] = {}
    for uuid, placement in placements:
        add.setdefault(uuid, []).append(placement)
    if not add:
        return node
    gpus = tuple(replace(g, mig_in_use=(*g.mig_in_use, *add[g.id])) if g.id in add else g for g in node.gpus)
    return replace(node, gpus=gpus)


__all__ = ["GPUUsage", "NodeGPUs", "with_mig", "with_slices", "without_slices"]
