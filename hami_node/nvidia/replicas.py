"""Serving NVIDIA's devices to kubelet as NVIDIA's plugin does (v0.20.0): replica IDs `<id>::<n>`
(internal/rm/devices.go AnnotatedID), `validate_request` (rm.go ValidateRequest), the container's
Allocate response from kubelet's device IDs alone (internal/plugin/server.go getAllocateResponse; no pod
annotation is read in these modes: pods go through kube-scheduler only), and the preferred allocation of
replicated and MIG devices (internal/rm/allocate.go greedyAlloc with the distributed / packed policies)
and of whole GPUs (nvml_manager.go alignedAlloc: gpuallocator's best-effort policy, `aligned`).

Pure: the CDI annotation's response id (a fresh uuid4 in NVIDIA's code) and whether an optional device
node exists are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami_node.allocation import (
    CDI_PLUGIN_NAME,
    VISIBLE_DEVICES_ENV,
    VOLUME_MOUNTS_ROOT,
    ContainerResponse,
    Mount,
)
from hami_node.cdi import qualified_name
from hami_node.nvidia.aligned import PairScore, best_effort_allocate
from hami_node.nvidia.config import (
    AllocationPolicy,
    DeviceIDStrategy,
    DeviceListStrategy,
    Flags,
    Sharing,
)
from hami_node.nvidia.device_map import Device

IMEX_CHANNEL_ENV = "NVIDIA_IMEX_CHANNELS"
OPTIONAL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""The control nodes GetDevicePaths adds; passed with --pass-device-specs only where they exist."""


# --- annotated IDs ----------------------------------------------------------------------------------------


def has_annotations(device_id: str) -> bool:
    """`AnnotatedID.HasAnnotations`: the ID contains `::`."""
    return "::" in device_id


def split_annotated_id(device_id: str) -> tuple[str, int]:
    """`AnnotatedID.Split`: (id, replica); without `::` the replica is 0, and a replica that is not an
    integer reads as 0 too (Go ignores ParseInt's error)."""
    base, sep, replica = device_id.partition("::")
    if not sep:
        return device_id, 0
    text = replica.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 19:
        value = int(text)
        if -(2**63) <= value < 2**63:
            return base, value
    return base, 0


def underlying_id(device_id: str) -> str:
    """`AnnotatedID.GetID`: the GPU or MIG device an ID is (a replica of)."""
    return split_annotated_id(device_id)[0]


# --- ValidateRequest ------------------------------------------------------------------------------------


class InvalidRequest(ValueError):
    """NVIDIA's `errInvalidRequest`: the message is NVIDIA's (`invalid request: ...`)."""


def validate_request(devices: Mapping[str, Device], request_ids: Sequence[str], sharing: Sharing) -> None:
    """`ValidateRequest`: every ID must be one of this resource's devices; with replicas and
    failRequestsGreaterThanOne explicitly true (MPS: true unless the file says false), at most one ID.
    Raises `InvalidRequest`."""
    for device_id in request_ids:
        if device_id not in devices:
            raise InvalidRequest(f"invalid request: unknown device: {device_id}")
    if (
        any(has_annotations(i) for i in request_ids)
        and len(request_ids) > 1
        and sharing.fails_requests_greater_than_one
    ):
        raise InvalidRequest(
            f"invalid request: maximum request size for shared resources is 1; found {len(request_ids)}"
        )


def allocate_error(resource: str, error: InvalidRequest) -> str:
    """Allocate's wrapping, what kubelet shows in UnexpectedAdmissionError: `invalid allocation request
    for "nvidia.com/gpu": invalid request: ...` (Go's %q)."""
    return f'invalid allocation request for "{resource}": {error}'


# --- the Allocate response -----------------------------------------------------------------------------


def unique_device_ids(
    devices: Mapping[str, Device], request_ids: Sequence[str], id_strategy: DeviceIDStrategy
) -> tuple[str, ...]:
    """`uniqueDeviceIDsFromAnnotatedDeviceIDs`: the underlying UUIDs (uuid strategy) or the indexes
    (`0`, `0:1`; index strategy) of the requested IDs, each once, in request order (NVIDIA's index path
    walks a Go map, so its order is random)."""
    if id_strategy is DeviceIDStrategy.UUID:
        ids = [underlying_id(i) for i in request_ids]
    else:
        ids = [devices[i].index for i in request_ids if i in devices]
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device node for the container (`pluginapi.DeviceSpec`, with --pass-device-specs)."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class AllocateAnswer:
    """One container's answer: the response hami-node already turns into protobuf, and NVIDIA's device
    specs (empty unless passDeviceSpecs)."""

    response: ContainerResponse
    device_specs: tuple[DeviceSpec, ...] = ()


def container_allocate_response(
    request_ids: Sequence[str],
    devices: Mapping[str, Device],
    flags: Flags,
    *,
    cdi_response_id: str,
    imex_channels: Sequence[str] = (),
    node_exists: Callable[[str], bool] = lambda _path: True,
) -> AllocateAnswer:
    """`getAllocateResponse` for a validated request (`validate_request` first). CDI (annotations under
    `<prefix>nvidia-device-plugin_<cdi_response_id>`, or CRI CDI devices) first; GDRCopy/GDS/MOFED
    envs; then, unless every strategy is CDI, NVIDIA_VISIBLE_DEVICES (+ NVIDIA_IMEX_CHANNELS) for envvar
    and the /dev/null mounts for volume-mounts; device specs with passDeviceSpecs (the control nodes only
    where `node_exists`). The device names are the UUIDs or indexes per the device ID strategy: two
    replicas of one GPU give it once."""
    ids = unique_device_ids(devices, request_ids, flags.device_id_strategy)
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []
    if flags.any_cdi:
        names = [qualified_name(i) for i in ids]
        names += [f"k8s.device-plugin.nvidia.com/imex-channel={c}" for c in imex_channels]
        if names:
            if DeviceListStrategy.CDI_ANNOTATIONS in flags.device_list_strategy:
                key = f"{flags.cdi_annotation_prefix}{CDI_PLUGIN_NAME}_{cdi_response_id}"
                annotations[key] = ",".join(names)
            if DeviceListStrategy.CDI_CRI in flags.device_list_strategy:
                cdi_devices.extend(names)
    if flags.gdrcopy_enabled:
        envs["NVIDIA_GDRCOPY"] = "enabled"
    if flags.gds_enabled:
        envs["NVIDIA_GDS"] = "enabled"
    if flags.mofed_enabled:
        envs["NVIDIA_MOFED"] = "enabled"
    specs: list[DeviceSpec] = []
    if not flags.all_cdi:
        if DeviceListStrategy.ENVVAR in flags.device_list_strategy:
            envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
            if imex_channels:
                envs[IMEX_CHANNEL_ENV] = ",".join(imex_channels)
        if DeviceListStrategy.VOLUME_MOUNTS in flags.device_list_strategy:
            envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
            mounts.extend(Mount(f"{VOLUME_MOUNTS_ROOT}/{i}", "/dev/null", False) for i in ids)
            mounts.extend(Mount(f"{VOLUME_MOUNTS_ROOT}/imex/{c}", "/dev/null", False) for c in imex_channels)
        if flags.pass_device_specs:
            specs = _device_specs(request_ids, devices, flags.nvidia_dev_root, node_exists)
    return AllocateAnswer(
        ContainerResponse(envs, tuple(mounts), annotations, tuple(cdi_devices)), tuple(specs)
    )


def _device_specs(
    request_ids: Sequence[str],
    devices: Mapping[str, Device],
    dev_root: str,
    node_exists: Callable[[str], bool],
) -> list[DeviceSpec]:
    paths = [p for p in OPTIONAL_DEVICE_NODES if node_exists(p)]
    for i in dict.fromkeys(request_ids):
        if i in devices:
            paths.extend(devices[i].paths)
    root = dev_root.rstrip("/")
    return [DeviceSpec(p, f"{root}{p}" if p.startswith("/") else f"{root}/{p}") for p in dict.fromkeys(paths)]


# --- GetPreferredAllocation -----------------------------------------------------------------------------


class PreferredAllocationError(ValueError):
    """NVIDIA's `not enough available devices to satisfy allocation`."""


def uses_aligned_allocation(devices: Sequence[Device], available: Sequence[str]) -> bool:
    """`getPreferredAllocation`'s branch: full GPUs that are not replicas take the topology-aligned
    allocation (gpuallocator's best effort; the node daemon's topology policy), everything else the
    replica policy below."""
    return all(d.aligned_allocation_supported for d in devices) and not any(
        has_annotations(i) for i in available
    )


def aligned_allocation(
    devices: Sequence[Device], available: Sequence[str], required: Sequence[str], size: int, score: PairScore
) -> tuple[str, ...]:
    """`alignedAlloc`: gpuallocator's best-effort policy over the available and required GPUs
    (`aligned.best_effort_allocate`); an empty answer when it finds no set (kubelet then chooses). Raises
    `PreferredAllocationError` with NVIDIA's text (`unable to retrieve list of available devices: no
    device with uuid: <id>`, DeviceList.Filter) for an ID that is not one of this resource's GPUs."""
    known = {d.id for d in devices}
    for what, ids in (("available", available), ("required", required)):
        for device_id in ids:
            if device_id not in known:
                raise PreferredAllocationError(
                    f"unable to retrieve list of {what} devices: no device with uuid: {device_id}"
                )
    return best_effort_allocate(list(dict.fromkeys(available)), list(dict.fromkeys(required)), size, score)


def preferred_allocation(
    devices: Sequence[Device],
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED,
) -> tuple[str, ...]:
    """`greedyAlloc`: the required IDs, then `size - len(required)` more from the available ones, one at
    a time, each from the GPU (or MIG device) the policy prefers by its replicas already allocated
    (`total - available`): distributed the fewest, packed the most; ties go to the one picked least in
    this call (v0.20.0), then to device order. Raises `PreferredAllocationError` when too few are
    available."""
    known = {d.id: d for d in devices}
    required_set = set(required)
    candidates = [i for i in dict.fromkeys(available) if i in known and i not in required_set]
    needed = size - len(required)
    if len(candidates) < needed:
        raise PreferredAllocationError("not enough available devices to satisfy allocation")
    available_count: dict[str, int] = {}
    for c in candidates:
        base = underlying_id(c)
        available_count[base] = available_count.get(base, 0) + 1
    total: dict[str, int] = {}
    for d in devices:
        base = underlying_id(d.id)
        if base in available_count:
            total[base] = total.get(base, 0) + 1
    picked_from: dict[str, int] = {}
    order = {c: n for n, c in enumerate(candidates)}
    sign = 1 if policy is AllocationPolicy.DISTRIBUTED else -1
    chosen: list[str] = []
    for _ in range(max(needed, 0)):

        def rank(c: str) -> tuple[int, int, int]:
            base = underlying_id(c)
            allocated = total[base] - available_count[base]
            return (sign * allocated, picked_from.get(base, 0), order[c])

        best = min(candidates, key=rank)
        base = underlying_id(best)
        picked_from[base] = picked_from.get(base, 0) + 1
        available_count[base] -= 1
        chosen.append(best)
        candidates.remove(best)
    return (*required, *chosen)


__all__ = [
    "IMEX_CHANNEL_ENV",
    "OPTIONAL_DEVICE_NODES",
    "AllocateAnswer",
    "DeviceSpec",
    "InvalidRequest",
    "PreferredAllocationError",
    "aligned_allocation",
    "allocate_error",
    "container_allocate_response",
    "has_annotations",
    "preferred_allocation",
    "split_annotated_id",
    "underlying_id",
    "unique_device_ids",
    "uses_aligned_allocation",
    "validate_request",
]
