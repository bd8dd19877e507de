"""Typed values of the wire contract: a node's GPUs, a pod's GPU slices, and the small values carried
by the other annotations. All frozen, so they can be shared between threads and cached safely.

The codecs in `hami_api.annotations` turn these into HAMi v2.10's annotation strings and back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

NVIDIA = "NVIDIA"
"""The vendor word HAMi writes in every allocation entry for an NVIDIA GPU."""


# --- a node's inventory (hami.io/node-nvidia-register) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """Where a MIG profile can be placed on the GPU: its first slice and how many slices it spans."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile the GPU supports (only in mig mode); carried through so the register round-trips."""

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """One physical GPU as the node advertises it.

    `count` is how many containers may share it (deviceSplitCount), `devmem` its memory in MiB after
    deviceMemoryScaling, `devcore` its compute in percent (100 x deviceCoreScaling), `type` the model
    ("NVIDIA-Tesla V100-PCIE-32GB"), `mode` the operating mode ("hami-core", "mig", "mps").
    """

    id: str
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ""
    numa: int = 0
    mode: str = ""
    health: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    custom: str = ""
    """HAMi's `custominfo` (other vendors: Ascend's NetworkID, Enflame's profiles, ...) as canonical JSON
    text (keys sorted), "" for none; `hami_control.devices.base.custom_info` reads it."""


@dataclass(frozen=True, slots=True)
class GPUPairScore:
    """Topology scores from one GPU to its peers (hami.io/node-nvidia-score); higher = better link.
    `scores` is sorted by peer UUID, the order Go writes a map in."""

    uuid: str
    scores: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, int]:
        return dict(self.scores)

    @staticmethod
    def of(uuid: str, scores: Mapping[str, int]) -> GPUPairScore:
        return GPUPairScore(uuid, tuple(sorted(scores.items())))


# --- a pod's allocation (hami.io/vgpu-devices-to-allocate, hami.io/vgpu-devices-allocated) ---------


@dataclass(frozen=True, slots=True)
class GPUSlice:
    """A share of one GPU given to one container: memory in MiB and compute in percent of the GPU."""

    uuid: str
    usedmem: int
    usedcores: int
    vendor: str = NVIDIA


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The GPU slices of one container; empty for a container without GPUs (or one already consumed)."""

    devices: tuple[GPUSlice, ...] = ()

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[GPUSlice]:
        return iter(self.devices)

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(device.uuid for device in self.devices)


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """One entry per container, init containers first, then regular ones (HAMi's annotation order).

    Go's plugin rewrites the to-allocate annotation from a decode that includes the empty piece after the
    last ';', so a consumed annotation may carry more trailing empty entries than the pod has containers;
    find containers through `non_empty` / `next_pending` rather than by counting entries.
    """

    containers: tuple[ContainerAllocation, ...] = ()

    def __len__(self) -> int:
        return len(self.containers)

    def __iter__(self) -> Iterator[ContainerAllocation]:
        return iter(self.containers)

    def non_empty(self) -> tuple[tuple[int, ContainerAllocation], ...]:
        """(entry index, allocation) of every entry that still has devices, in order."""
        return tuple((i, c) for i, c in enumerate(self.containers) if c.devices)

    def next_pending(self) -> int | None:
        """Index of the first entry with devices: the one the device plugin serves next."""
        return next((i for i, c in enumerate(self.containers) if c.devices), None)

    def with_blanked(self, index: int) -> PodAllocation:
        """The allocation with entry `index` emptied, as the plugin writes it back after Allocate."""
        if not 0 <= index < len(self.containers):
            raise IndexError(f"allocation has {len(self.containers)} entries, no entry {index}")
        blanked = (*self.containers[:index], ContainerAllocation(), *self.containers[index + 1 :])
        return replace(self, containers=blanked)

    @property
    def fully_consumed(self) -> bool:
        return all(not c.devices for c in self.containers)

    def slices(self) -> tuple[GPUSlice, ...]:
        """Every slice of the pod, in entry order."""
        return tuple(s for c in self.containers for s in c.devices)


# --- bind protocol and node lock ---------------------------------------------------------------------


class BindPhase(StrEnum):
    """hami.io/bind-phase: where a pod is between the extender's bind and the plugin's Allocate."""

    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class NodeLock:
    """hami.io/mutex.lock: who holds a node's bind->Allocate window and since when (aware time).
    The legacy value is just the time; then namespace and pod are empty."""

    time: datetime
    namespace: str = ""
    pod: str = ""


class HandshakeKind(StrEnum):
    REQUESTING = "Requesting"
    """The scheduler's probe, "Requesting_<2006-01-02 15:04:05>" (scheduler local time)."""
    REPORTED = "Reported"
    """Legacy (<= v2.7) plugin heartbeat, "Reported <Go time.String()>"."""
    DELETED = "Deleted"
    """Legacy (<= v2.7): the scheduler gave up on the node, "Deleted_<2006-01-02 15:04:05>"."""


@dataclass(frozen=True, slots=True)
class Handshake:
    """hami.io/node-handshake. `at` is naive (local wall clock) for REQUESTING and DELETED, which is
    how HAMi writes them, and timezone-aware for REPORTED."""

    kind: HandshakeKind
    at: datetime


# --- scheduling knobs from pod annotations ---------------------------------------------------------


class NodePolicy(StrEnum):
    """HAMi's binpack and spread, and ours: fragmentation (hami_control/frag.py, docs/planning.md)."""

    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"


class GPUPolicy(StrEnum):
    """binpack, spread and numa order the devices; mutex and topology-aware filter them; fragmentation
    (ours, not HAMi's) orders them by the growth of the node's fragmentation (hami_control/frag.py)."""

    BINPACK = "binpack"
    SPREAD = "spread"
    NUMA = "numa"
    MUTEX = "mutex"
    TOPOLOGY_AWARE = "topology-aware"
    FRAGMENTATION = "fragmentation"


class CorePolicy(StrEnum):
    """GPU_CORE_UTILIZATION_POLICY values: default limits with bursts, force always limits, disable
    ignores gpucores."""

    DEFAULT = "default"
    FORCE = "force"
    DISABLE = "disable"


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """hami.io/device-scoring-weights: weights of slot, core and memory use in a GPU's score."""

    slot: int = 1
    core: int = 1
    memory: int = 1


@dataclass(frozen=True, slots=True)
class DeviceSelector:
    """A pod's GPU constraints from its annotations. Empty tuples mean "no constraint".

    Types match as case-insensitive substrings of the GPU type; UUIDs match exactly; `modes` (from
    nvidia.com/vgpu-mode) lists the operating modes the pod accepts; `numa_bind` asks for all GPUs of a
    container on one NUMA node (the fit module enforces that).
    """

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    numa_bind: bool = False
    _upper_use: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _upper_nouse: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_upper_use", tuple(t.upper() for t in self.use_types))
        object.__setattr__(self, "_upper_nouse", tuple(t.upper() for t in self.nouse_types))

    def type_allowed(self, gpu_type: str) -> bool:
        card = gpu_type.upper()
        if self._upper_use and not any(t in card for t in self._upper_use):
            return False
        return not any(t in card for t in self._upper_nouse)

    def uuid_allowed(self, uuid: str) -> bool:
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids

    def mode_allowed(self, mode: str) -> bool:
        # HAMi tests strings.Contains(annotation, mode), so a GPU without a mode always passes.
        return not self.modes or not mode or mode in self.modes

    def allows(self, gpu: GPUInfo) -> bool:
        return self.type_allowed(gpu.type) and self.uuid_allowed(gpu.id) and self.mode_allowed(gpu.mode)
