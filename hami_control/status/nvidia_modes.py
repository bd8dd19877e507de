"""NVIDIA's own sharing modes as `kubectl hami` shows them: HAMi's dynamic MIG instances on a GPU, and
nodes served by NVIDIA's device plugin (time-slicing, MPS, MIG strategies none/single/mixed). Pure.

**HAMi's dynamic MIG** (v2.10): a GPU whose register entry has `mode: "mig"` holds the MIG instances its
pods reserved in `hami.io/vgpu-mig-allocations` (`hami_api.mig_alloc`, HAMi
pkg/device/nvidia/mig_allocations.go): per entry the profile, the placement (`start`, `size` in memory
slices), and once hami-node created the instance its MIG UUID and GPU/compute instance IDs. The pods
are the cache's holdings (`PodHolding.mig`: every pod hami-control counts on the node, so the same
placements the extender fits against). A GPU has the memory slices of its model (`hami_api.mig`: 8, or
4 on an A30); for a model the tables do not know, the end of the widest placement its register lists.

**NVIDIA's modes** (hami-node `--config-file` with NVIDIA's config file, or NVIDIA's own plugin): no HAMi
register annotation; the node's `status.capacity` / `status.allocatable` carry NVIDIA's resources
(`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`, `...shared`), and GPU feature
discovery's labels describe them, keyed by the resource's original name (NVIDIA
gpu-feature-discovery internal/lm/resource.go: `<res>.product`, `.count`, `.replicas`,
`.sharing-strategy`, `.memory`; mig-strategy.go: `nvidia.com/mig.strategy`). Pods ask those resources
directly and kube-scheduler alone places them, so what is allocated is the sum of the requests of the
pods bound to the node that have not finished (kube-scheduler's effective request per pod: the larger of
the regular containers' sum and the largest init container's; requests, else limits, as the API server
defaults extended resources).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api.errors import QuantityError
from hami_api.mig import mig_model
from hami_api.mig_alloc import MigAllocation
from hami_api.quantity import quantity_value
from hami_api.types import GPUInfo, MigPlacement
from hami_control.cache import TERMINAL_PHASES
from hami_control.status.snapshot import Json, meta, name_of, namespace_of

DEFAULT_MEMORY_SLICES = 8
"""Memory slices of a MIG GPU whose model and placements say nothing (A100, H100, H200)."""

PLUGIN_MODE = "nvidia-plugin"
"""`NodeRow.mode` of a node in NVIDIA's modes."""

MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
SHARED_SUFFIX = ".shared"
_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9a-z.+-]+)$")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- HAMi's dynamic MIG ----------------------------------------------------------------------------------


def placement_text(placement: MigPlacement) -> str:
    """The memory slices a placement covers: `[0-1]` for start 0 size 2, `[6]` for start 6 size 1."""
    last = placement.start + placement.size - 1
    return f"[{placement.start}]" if last <= placement.start else f"[{placement.start}-{last}]"


def memory_slices(info: GPUInfo) -> int:
    """The memory slices of a MIG GPU: its model's (`hami_api.mig.mig_model`, the register's `type` with
    or without hami-node's `NVIDIA-` prefix), else the end of the widest placement its profiles list,
    else `DEFAULT_MEMORY_SLICES`."""
    for name in (info.type, info.type.removeprefix("NVIDIA-")):
        model = mig_model(name)
        if model is not None:
            return model.memory_slices
    ends = [p.start + p.size for profile in info.mig_profiles for p in profile.placements]
    return max(ends, default=DEFAULT_MEMORY_SLICES)


def slice_map(total: int, placements: Iterable[MigPlacement]) -> str:
    """One character per memory slice: `#` taken by a placement, `.` free (`##....#.`). Placements past
    the GPU's slices are left out of the map (they still count in `slices_used`)."""
    cells = ["."] * total
    for p in placements:
        for i in range(p.start, min(p.start + p.size, total)):
            cells[i] = "#"
    return "".join(cells)


def slices_used(total: int, placements: Iterable[MigPlacement]) -> int:
    """How many of the GPU's memory slices some placement covers (overlaps counted once)."""
    return slice_map(total, placements).count("#")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance a pod reserved on a GPU (one `hami.io/vgpu-mig-allocations` entry)."""

    namespace: str
    pod: str
    container: str
    """The container's name (init containers first, HAMi's order), else `#<containerIndex>`."""
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    """Empty until hami-node created the instance and recorded it."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def slices(self) -> str:
        return placement_text(self.placement)


def container_names(pod: Json | None) -> list[str]:
    """The pod's container names, init containers first (the order of HAMi's containerIndex)."""
    if pod is None:
        return []
    spec = _mapping(pod.get("spec"))
    return [
        str(_mapping(c).get("name") or "")
        for key in ("initContainers", "containers")
        for c in _list(spec.get(key))
    ]


def mig_instance(namespace: str, pod: str, names: Sequence[str], a: MigAllocation) -> MigInstance:
    """The instance of one reservation, its container named from `names` (see `container_names`)."""
    index = a.container_index
    container = names[index] if 0 <= index < len(names) and names[index] else f"#{index}"
    return MigInstance(
        namespace,
        pod,
        container,
        a.profile,
        a.placement,
        a.mig_uuid,
        a.gpu_instance_id,
        a.compute_instance_id,
    )


# --- NVIDIA's modes --------------------------------------------------------------------------------------


def _count(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return quantity_value(str(value))
    except QuantityError:
        return None


def is_nvidia_resource(name: str) -> bool:
    """`nvidia.com/gpu`, `nvidia.com/mig-<profile>`, each with or without `.shared` (not HAMi's
    `nvidia.com/gpumem`, `nvidia.com/gpucores`, ...)."""
    return bool(_RESOURCE.match(name.removesuffix(SHARED_SUFFIX)))


def labelled_as(resource: str) -> str:
    """The name GFD keys the resource's labels by: the original name, `.shared` dropped."""
    return resource.removesuffix(SHARED_SUFFIX)


@dataclass(frozen=True, slots=True)
class PodCount:
    namespace: str
    name: str
    count: int

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NvidiaResource:
    """One NVIDIA resource of a node: what the kubelet advertises, what pods on the node request, and
    GFD's labels for it (empty / None where the node has no such label)."""

    name: str
    capacity: int
    allocatable: int
    allocated: int
    product: str = ""
    count: int | None = None
    """GFD's `.count`: the physical devices (GPUs, or MIG devices of the profile) behind it."""
    replicas: int | None = None
    sharing_strategy: str = ""
    memory_mib: int | None = None
    pods: tuple[PodCount, ...] = ()

    @property
    def unhealthy(self) -> int:
        """Devices the plugin reports unhealthy (kubelet keeps them in capacity, not in allocatable)."""
        return max(self.capacity - self.allocatable, 0)


@dataclass(frozen=True, slots=True)
class NvidiaNode:
    """A node in NVIDIA's modes: its resources (by name) and the node-wide MIG labels."""

    resources: tuple[NvidiaResource, ...]
    mig_strategy: str = ""
    """`nvidia.com/mig.strategy` (single, mixed); empty without the label (strategy none)."""
    mig_capable: bool | None = None


def _resources(obj: Json) -> dict[str, tuple[int, int]]:
    status = _mapping(obj.get("status"))
    capacity = _mapping(status.get("capacity"))
    allocatable = _mapping(status.get("allocatable"))
    out: dict[str, tuple[int, int]] = {}
    for name in sorted({*capacity, *allocatable}):
        if not is_nvidia_resource(str(name)):
            continue
        cap = _count(capacity.get(name))
        alloc = _count(allocatable.get(name))
        alloc = alloc if alloc is not None else (cap or 0)
        out[str(name)] = (cap if cap is not None else alloc, alloc)
    return out


def _container_request(container: Mapping[str, Any], resource: str) -> int:
    resources = _mapping(container.get("resources"))
    for key in ("requests", "limits"):
        value = _count(_mapping(resources.get(key)).get(resource))
        if value is not None:
            return value
    return 0


def pod_request(pod: Json, resource: str) -> int:
    """kube-scheduler's effective request of `resource` by the pod: max(sum of regular containers, the
    largest init container) (k8s.io/component-helpers resource/helpers.go PodRequests, without sidecars
    or overhead, which extended resources do not use)."""
    spec = _mapping(pod.get("spec"))
    regular = sum(_container_request(_mapping(c), resource) for c in _list(spec.get("containers")))
    init = max(
        (_container_request(_mapping(c), resource) for c in _list(spec.get("initContainers"))), default=0
    )
    return max(regular, init)


def _int_label(labels: Mapping[str, Any], key: str) -> int | None:
    value = labels.get(key)
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def nvidia_node(obj: Json, pods: Iterable[Json]) -> NvidiaNode | None:
    """The node in NVIDIA's modes (None when it advertises no NVIDIA resource): each resource with the
    requests of the pods bound to it (`pods`: every pod; the node's own and not finished are counted)."""
    resources = _resources(obj)
    if not resources:
        return None
    node = name_of(obj)
    labels = _mapping(meta(obj).get("labels"))
    asked: dict[str, dict[tuple[str, str], int]] = {name: {} for name in resources}
    for pod in pods:
        spec = _mapping(pod.get("spec"))
        phase = str(_mapping(pod.get("status")).get("phase") or "Pending")
        if spec.get("nodeName") != node or phase in TERMINAL_PHASES:
            continue
        for name, per_pod in asked.items():
            count = pod_request(pod, name)
            if count:
                key = (namespace_of(pod), name_of(pod))
                per_pod[key] = per_pod.get(key, 0) + count
    rows = []
    for name, (capacity, allocatable) in resources.items():
        base = labelled_as(name)
        per_pod = asked[name]
        rows.append(
            NvidiaResource(
                name=name,
                capacity=capacity,
                allocatable=allocatable,
                allocated=sum(per_pod.values()),
                product=str(labels.get(f"{base}.product") or ""),
                count=_int_label(labels, f"{base}.count"),
                replicas=_int_label(labels, f"{base}.replicas"),
                sharing_strategy=str(labels.get(f"{base}.sharing-strategy") or ""),
                memory_mib=_int_label(labels, f"{base}.memory"),
                pods=tuple(PodCount(ns, pod, n) for (ns, pod), n in sorted(per_pod.items())),
            )
        )
    capable = labels.get(MIG_CAPABLE_LABEL)
    return NvidiaNode(
        tuple(rows),
        str(labels.get(MIG_STRATEGY_LABEL) or ""),
        None if capable is None else str(capable) == "true",
    )


__all__ = [
    "DEFAULT_MEMORY_SLICES",
    "PLUGIN_MODE",
    "MigInstance",
    "NvidiaNode",
    "NvidiaResource",
    "PodCount",
    "container_names",
    "is_nvidia_resource",
    "labelled_as",
    "memory_slices",
    "mig_instance",
    "nvidia_node",
    "placement_text",
    "pod_request",
    "slice_map",
    "slices_used",
]
