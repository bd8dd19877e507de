"""NVIDIA's resources -> devices map (internal/rm/device_map.go, devices.go, rm.go's
AddDefaultResourcesToConfig, v0.20.0): which devices each resource (`nvidia.com/gpu`,
`nvidia.com/mig-1g.5gb`, `nvidia.com/gpu.shared`, ...) serves under the MIG strategies none / single /
mixed, with time-slicing replicas `<id>::<n>`; and health fanned out from a GPU or MIG device to the
devices (replicas) built on it.

Input is plain data: one `NvidiaDevice` per GPU and per MIG device (the node daemon adapts its backend's
GPUs and MIG devices into it). Output is a `DeviceMap`: resource name -> its `Device`s in GPU order
(NVIDIA's is a Go map, iterated at random; here the order is the GPUs' index order, then the MIG index).

Errors are `DeviceMapError`s with NVIDIA's texts and wrapping (`error building device map: ...`); like
NVIDIA's plugin, an invalid layout for the strategy is an error, not a fallback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hami_node.nvidia.config import (
    MigStrategy,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    is_gpu_index,
    is_mig_index,
    is_uuid_ref,
    pattern_matches,
    split_resource_name,
)

GPU_RESOURCE = "nvidia.com/gpu"
_C_LESS_THAN_G = re.compile(r"[0-9]+c\.")


class DeviceMapError(ValueError):
    """The devices cannot be served with this strategy and configuration (NVIDIA's plugin exits)."""


@dataclass(frozen=True, slots=True)
class MigAttributes:
    """`nvmlDeviceGetAttributes` of a MIG device: what NVIDIA compares under the single strategy and
    GFD's MIG labels show."""

    memory_mib: int
    multiprocessors: int = 0
    gi_slices: int = 1
    ci_slices: int = 1
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0


@dataclass(frozen=True, slots=True)
class NvidiaDevice:
    """One GPU or one MIG device, as the map builder and the labeler need it.

    A GPU: `index` its NVML index, `mig_enabled` its current MIG mode, `mig_capable` whether MIG is
    supported. A MIG device: `parent_uuid` its GPU's UUID, `index` the GPU's index, `mig_index` the j of
    `nvmlDeviceGetMigDeviceHandleByIndex(gpu, j)`, `mig_profile` go-nvlib's profile string (`1g.5gb`,
    `1g.5gb+me`, `1c.2g.10gb`), `mig_attributes` NVML's attributes, and `product_name` the parent's name.
    `paths` are the device nodes the container needs (a GPU: `/dev/nvidia<minor>`; a MIG device: the
    parent's node and its GI/CI capability nodes)."""

    uuid: str
    index: int
    product_name: str
    memory_mib: int
    minor: int = 0
    parent_uuid: str | None = None
    mig_index: int | None = None
    mig_profile: str | None = None
    mig_attributes: MigAttributes | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    healthy: bool = True
    numa_node: int | None = None
    compute_capability: tuple[int, int] | None = None
    paths: tuple[str, ...] = ()

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    @property
    def index_text(self) -> str:
        """NVIDIA's Index: `<i>` for a GPU, `<i>:<j>` for a MIG device."""
        return f"{self.index}:{self.mig_index}" if self.is_mig else str(self.index)


@dataclass(frozen=True, slots=True)
class Device:
    """A device kubelet sees (NVIDIA's rm.Device): `id` is its UUID, or `<uuid>::<n>` for replica n;
    `uuid` the GPU or MIG device it is (or is a replica of); `index` `<i>` or `<i>:<j>`; `replicas` the
    number of replicas of its device (0 when not replicated)."""

    id: str
    index: str
    uuid: str
    healthy: bool = True
    numa_node: int | None = None
    paths: tuple[str, ...] = ()
    total_memory_mib: int = 0
    compute_capability: str = ""
    replicas: int = 0
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def is_mig(self) -> bool:
        """`Device.IsMigDevice`: the index has a `:`."""
        return ":" in self.index

    @property
    def aligned_allocation_supported(self) -> bool:
        """`Device.AlignedAllocationSupported`: not a MIG device, not WSL's /dev/dxg."""
        return not self.is_mig and "/dev/dxg" not in self.paths


DeviceMap = Mapping[str, tuple[Device, ...]]
"""Resource name -> its devices, in GPU order."""


def mig_resource_name(profile: str) -> str:
    """Mixed strategy: `nvidia.com/mig-<profile>` with `+` made `.` (`1g.5gb+me` -> `mig-1g.5gb.me`)."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def is_gpu_instance_profile(profile: str) -> bool:
    """A profile whose compute instance takes the whole GPU instance (C == G, `<G>g.<GB>gb...`): the only
    ones the mixed strategy names a resource after (`VisitMigProfiles` with `info.C == info.G`)."""
    return _C_LESS_THAN_G.match(profile) is None


def default_resources(strategy: MigStrategy, mig_profiles: Iterable[str] = ()) -> Resources:
    """`AddDefaultResourcesToConfig`: GPUs `*` -> nvidia.com/gpu; single: MIG `*` -> nvidia.com/gpu;
    mixed: each C == G profile the node's GPUs support (`mig_profiles`) -> `nvidia.com/mig-<profile>`."""
    gpus = (ResourcePattern("*", GPU_RESOURCE),)
    if strategy is MigStrategy.SINGLE:
        return Resources(gpus, (ResourcePattern("*", GPU_RESOURCE),))
    if strategy is MigStrategy.MIXED:
        profiles = dict.fromkeys(p for p in mig_profiles if is_gpu_instance_profile(p))
        return Resources(gpus, tuple(ResourcePattern(p, mig_resource_name(p)) for p in profiles))
    return Resources(gpus)


def _to_device(d: NvidiaDevice) -> Device:
    cc = f"{d.compute_capability[0]}.{d.compute_capability[1]}" if d.compute_capability else ""
    memory = d.mig_attributes.memory_mib if d.mig_attributes is not None else d.memory_mib
    return Device(
        id=d.uuid,
        index=d.index_text,
        uuid=d.uuid,
        healthy=d.healthy,
        numa_node=d.numa_node,
        paths=d.paths,
        total_memory_mib=memory,
        compute_capability=cc,
        parent_uuid=d.parent_uuid,
        gpu_instance_id=d.gpu_instance_id,
        compute_instance_id=d.compute_instance_id,
    )


class _Map:
    def __init__(self) -> None:
        self.by_resource: dict[str, dict[str, Device]] = {}

    def insert(self, name: str, device: Device) -> None:
        """`DeviceMap.insert`: by ID, a later device with the same ID replaces the earlier."""
        self.by_resource.setdefault(name, {})[device.id] = device

    def is_empty(self) -> bool:
        return not any(self.by_resource.values())

    def frozen(self) -> dict[str, tuple[Device, ...]]:
        return {name: tuple(devices.values()) for name, devices in self.by_resource.items()}


def _check_inputs(
    devices: Sequence[NvidiaDevice],
) -> tuple[list[NvidiaDevice], dict[str, list[NvidiaDevice]]]:
    gpus = sorted((d for d in devices if not d.is_mig), key=lambda d: d.index)
    by_uuid = {g.uuid: g for g in gpus}
    migs: dict[str, list[NvidiaDevice]] = {g.uuid: [] for g in gpus}
    for d in devices:
        if not d.is_mig:
            continue
        parent = by_uuid.get(d.parent_uuid or "")
        if parent is None:
            raise DeviceMapError(
                f"MIG device {d.uuid}: its parent GPU {d.parent_uuid} is not in the inventory"
            )
        if not parent.mig_enabled:
            raise DeviceMapError(
                f"MIG device {d.uuid}: its parent GPU {d.parent_uuid} does not have MIG enabled"
            )
        if d.mig_profile is None or d.mig_index is None:
            raise DeviceMapError(f"MIG device {d.uuid}: no MIG profile or MIG index given")
        migs[parent.uuid].append(d)
    for children in migs.values():
        children.sort(key=lambda d: d.mig_index or 0)
    return gpus, migs


def build_device_map(
    devices: Sequence[NvidiaDevice],
    strategy: MigStrategy,
    replicated: ReplicatedResources,
    resources: Resources | None = None,
) -> dict[str, tuple[Device, ...]]:
    """`NewDeviceMap` + `build`: the resources from the patterns (default: `default_resources` for the
    profiles of the MIG devices present), then replicas. Raises `DeviceMapError` with NVIDIA's texts."""
    gpus, migs = _check_inputs(devices)
    if resources is None:
        resources = default_resources(strategy, (m.mig_profile or "" for ms in migs.values() for m in ms))
    try:
        base = _from_resources(gpus, migs, strategy, resources)
    except DeviceMapError as err:
        raise DeviceMapError(
            f"error building device map: error building device map from config.resources: {err}"
        ) from None
    try:
        return replicate(base, replicated)
    except DeviceMapError as err:
        raise DeviceMapError(
            "error building device map: error updating device map with replicas from "
            f"replicatedResources config: {err}"
        ) from None


def _from_resources(
    gpus: Sequence[NvidiaDevice],
    migs: Mapping[str, Sequence[NvidiaDevice]],
    strategy: MigStrategy,
    resources: Resources,
) -> dict[str, tuple[Device, ...]]:
    """`buildDeviceMapFromConfigResources`."""
    gpu_map = _Map()
    for gpu in gpus:
        if gpu.mig_enabled and strategy is not MigStrategy.NONE:
            continue
        match = next((r for r in resources.gpus if pattern_matches(r.pattern, gpu.product_name)), None)
        if match is None:
            raise DeviceMapError(
                f"error building GPU device map: GPU name '{gpu.product_name}' does not match any "
                "resource patterns"
            )
        gpu_map.insert(match.name, _to_device(gpu))
    if strategy is MigStrategy.NONE:
        return gpu_map.frozen()

    mig_map = _Map()
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        for mig in migs[gpu.uuid]:
            profile = mig.mig_profile or ""
            match = next((r for r in resources.mig if pattern_matches(r.pattern, profile)), None)
            if match is None:
                raise DeviceMapError(
                    f"error building MIG device map: MIG profile '{profile}' does not match any "
                    "resource patterns"
                )
            mig_map.insert(match.name, _to_device(mig))

    uniform = strategy is MigStrategy.SINGLE
    _assert_mig_devices_valid(gpus, migs, uniform)
    if uniform and not gpu_map.is_empty() and not mig_map.is_empty():
        raise DeviceMapError("all devices on the node must be configured with the same migEnabled value")
    for name, devices in mig_map.by_resource.items():
        for d in devices.values():
            gpu_map.insert(name, d)
    return gpu_map.frozen()


def mig_layout_problem(devices: Sequence[NvidiaDevice], uniform: bool) -> str | None:
    """`assertAllMigDevicesAreValid` without the wrapping: why the MIG layout is invalid, or None. Not
    uniform (mixed): never invalid (an empty MIG-enabled GPU is only a warning there)."""
    gpus, migs = _check_inputs(devices)
    try:
        _assert_mig_devices_valid(gpus, migs, uniform)
    except DeviceMapError as err:
        return str(err).removeprefix("invalid MIG configuration: ")
    return None


def _assert_mig_devices_valid(
    gpus: Sequence[NvidiaDevice], migs: Mapping[str, Sequence[NvidiaDevice]], uniform: bool
) -> None:
    for gpu in gpus:
        if gpu.mig_enabled and uniform and not migs[gpu.uuid]:
            raise DeviceMapError(
                "invalid MIG configuration: at least one device with migEnabled=true was not configured "
                f"correctly: device {gpu.index} has no MIG devices configured"
            )
    if not uniform:
        return
    previous: MigAttributes | None = None
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        for mig in migs[gpu.uuid]:
            attrs = mig.mig_attributes or MigAttributes(memory_mib=mig.memory_mib)
            if previous is None:
                previous = attrs
            elif attrs != previous:
                raise DeviceMapError(
                    "invalid MIG configuration: more than one MIG device type present on node"
                )


def empty_mig_gpus(devices: Sequence[NvidiaDevice]) -> tuple[int, ...]:
    """The indexes of MIG-enabled GPUs without a MIG device (mixed logs `device %v has no MIG devices
    configured` for each)."""
    gpus, migs = _check_inputs(devices)
    return tuple(g.index for g in gpus if g.mig_enabled and not migs[g.uuid])


# --- replicas (updateDeviceMapWithReplicas) --------------------------------------------------------------


def annotated_id(device_id: str, replica: int) -> str:
    """`NewAnnotatedID`: `<id>::<replica>`."""
    return f"{device_id}::{replica}"


def _ids_to_replicate(devices: Sequence[Device], r: ReplicatedResource) -> list[str]:
    """`getIDsOfDevicesToReplicate` (a count takes the first devices in GPU order; NVIDIA's map order is
    random)."""
    if r.devices.all:
        return [d.id for d in devices]
    if r.devices.count > 0:
        if r.devices.count > len(devices):
            raise DeviceMapError(
                f"unable to get IDs of devices to replicate for '{r.name}' resource: requested "
                f"{r.devices.count} devices to be replicated, but only {len(devices)} devices available"
            )
        return [d.id for d in devices[: r.devices.count]]
    ids = []
    by_id = {d.id: d for d in devices}
    for ref in r.devices.refs:
        if is_uuid_ref(ref):
            if ref not in by_id:
                raise DeviceMapError(
                    f"unable to get IDs of devices to replicate for '{r.name}' resource: no matching device "
                    f"with UUID: {ref}"
                )
            ids.append(ref)
        if is_gpu_index(ref) or is_mig_index(ref):
            found = next((d for d in devices if d.index == ref), None)
            if found is None:
                raise DeviceMapError(
                    f"unable to get IDs of devices to replicate for '{r.name}' resource: no matching device "
                    f"at index: {ref}"
                )
            ids.append(found.id)
    return ids


def replicate(device_map: DeviceMap, replicated: ReplicatedResources) -> dict[str, tuple[Device, ...]]:
    """`updateDeviceMapWithReplicas`: every selected device of a replicated resource becomes `replicas`
    devices `<id>::0..n-1` under `rename` (or its own name); the others stay. A resource named in the
    sharing config that has no device here is dropped, as NVIDIA does."""
    names = {r.name for r in replicated.resources}
    out = _Map()
    for name, devices in device_map.items():
        if name not in names:
            for d in devices:
                out.insert(name, d)
    for r in replicated.resources:
        devices = device_map.get(r.name, ())
        ids = _ids_to_replicate(devices, r) if devices else []
        if not ids:
            continue
        chosen = set(ids)
        for d in devices:
            if d.id not in chosen:
                out.insert(r.name, d)
        by_id = {d.id: d for d in devices}
        target = r.rename or r.name
        for device_id in ids:
            original = by_id[device_id]
            for i in range(r.replicas):
                out.insert(target, replace(original, id=annotated_id(device_id, i), replicas=r.replicas))
    return out.frozen()


# --- health ----------------------------------------------------------------------------------------------


def devices_hit(
    device_map: DeviceMap,
    uuid: str,
    gpu_instance_id: int | None = None,
    compute_instance_id: int | None = None,
) -> frozenset[str]:
    """The IDs (every resource) of the devices an Xid event on `uuid` makes unhealthy: every replica of
    that GPU or MIG device; for an event on a GPU in MIG mode, its MIG devices (all of them when the
    event names no GPU/compute instance, else the one with those IDs).

    NVIDIA's checkHealth keeps one device per parent UUID (`parentToDeviceMap[uuid] = d`), so with
    time-slicing only one replica of a failed GPU goes unhealthy, and of several MIG devices on one GPU
    only the last registered is watched; here every device built on the failed one is hit."""
    hit = set()
    for devices in device_map.values():
        for d in devices:
            on_parent = d.parent_uuid == uuid and (
                gpu_instance_id is None
                or compute_instance_id is None
                or (d.gpu_instance_id == gpu_instance_id and d.compute_instance_id == compute_instance_id)
            )
            if d.uuid == uuid or on_parent:
                hit.add(d.id)
    return frozenset(hit)


def with_health(device_map: DeviceMap, unhealthy_uuids: Iterable[str]) -> dict[str, tuple[Device, ...]]:
    """The map with each device's health from its underlying GPU or MIG device: unhealthy when its UUID,
    or its parent GPU's, is in `unhealthy_uuids` (a whole GPU failing takes its MIG devices with it)."""
    bad = set(unhealthy_uuids)
    return {
        name: tuple(
            replace(d, healthy=not (d.uuid in bad or (d.parent_uuid is not None and d.parent_uuid in bad)))
            for d in devices
        )
        for name, devices in device_map.items()
    }


def plugin_socket_name(resource: str) -> str:
    """`getPluginSocketPath`'s file name: `nvidia-<name>.sock` (`nvidia-gpu.sock`,
    `nvidia-mig-1g.5gb.sock`, `nvidia-gpu.shared.sock`)."""
    return f"nvidia-{split_resource_name(resource)[1]}.sock"


def served_resources(device_map: DeviceMap) -> tuple[str, ...]:
    """The resources a plugin is started for: those with at least one device (`startPlugins`)."""
    return tuple(name for name, devices in device_map.items() if devices)


__all__ = [
    "GPU_RESOURCE",
    "Device",
    "DeviceMap",
    "DeviceMapError",
    "MigAttributes",
    "NvidiaDevice",
    "annotated_id",
    "build_device_map",
    "default_resources",
    "devices_hit",
    "empty_mig_gpus",
    "is_gpu_instance_profile",
    "mig_layout_problem",
    "mig_resource_name",
    "plugin_socket_name",
    "replicate",
    "served_resources",
    "with_health",
]
