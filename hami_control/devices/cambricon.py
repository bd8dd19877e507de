"""Cambricon MLU (HAMi pkg/device/cambricon/device.go, v2.10.0): shared MLUs through the dsmlu plugin.

- Inventory: none in annotations. The devices are made up from the node's `status.capacity`: the cores
  resource (`cambricon.com/mlu.smlu.vcore`, 100 per card) gives ceil(vcore / 100) devices
  `<node>-cambricon-mlu-<i>` (Index i, Count 100, Devcore 100, Type "MLU", healthy), each with
  vmemory x 256 x 100 / vcore MiB (the memory resource counts 256 MiB units). No cores capacity (or 0, or
  not a whole number) is no inventory. Health is always good (no handshake); nothing to clean up.
- Webhook: the container asks MLUs when its limits name the count resource; nothing is mutated.
- Request (`vmemory_request`): the count, memory and cores resources, each from limits else requests.
  The count goes through Go's `int32()` (HAMi drops a count <= 0). Memory is in 256 MiB units; a value
  that is not a whole number, negative or above MaxInt32 / 256 makes no request at all. Cores default to
  100; a cores value that is not a whole number is ignored. No memory asks 100 % of a device.
- Fit: the common one, where the request's Type must be exactly "MLU" (the device's own Type and the
  declared `cambricon.com/use-mlutype` annotations are not read), the UUID rule of
  `cambricon.com/use-gpuuuid` / `nouse-gpuuuid`, and HAMi's ResourceQuota check (`fitQuota`) between
  the mutex rule and memory: what the pod would hold with this device, counted the way HAMi's
  `CollapseInitContainerUsage` does (per device: the largest init container's share against the sum of
  the regular containers'), plus what the namespace already holds, must stay within the namespace's
  `limits.<memory resource>` (x 256) and `limits.<cores resource>`, else `ResourceQuotaNotFit`. The
  quota comes in `FitContext.quota` (filled by the caller from the namespace's ResourceQuotas).
- Pod annotations: `hami.io/cambricon-mlu-devices-to-allocate` and `-allocated`, with
  `CAMBRICON_DSMLU_ASSIGNED: "false"` and `CAMBRICON_DSMLU_PROFILE: "<index>_<cores>_<MiB / 256>"` of the
  first device of the first container that has one.
- Node lock: Cambricon's own `cambricon.com/dsmlu.lock: <RFC3339>` (2 minutes), taken by the binder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from hami_api.errors import WireFormatError
from hami_api.types import GPUInfo, GPUSlice, PodAllocation
from hami_control.devices.base import (
    INT32_MAX,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    Picked,
    QuotaEntry,
    Unfit,
    Vendor,
    VendorNames,
    as_int64,
    resource_value,
)
from hami_control.devices.config import DeviceConfig, Section
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    RESOURCE_QUOTA_NOT_FIT,
    capacity_reason,
    request_memory,
    slot_reason,
)
from hami_control.usage import GPUUsage

COMMON_WORD = "MLU"
"""CambriconMLUCommonWord, also the devices' Type (CambriconMLUDevice)."""
MEMORY_FACTOR = 256
"""One unit of the memory resource is 256 MiB."""
DEFAULT_COUNT = "cambricon.com/vmlu"
DEFAULT_MEMORY = "cambricon.com/mlu.smlu.vmemory"
DEFAULT_CORES = "cambricon.com/mlu.smlu.vcore"
FLAG_COUNT = "cambricon.com/mlu"
"""The `--cambricon-mlu-name` flag's default, which HAMi's Go tests use (the chart sets `vmlu`)."""
DSMLU_ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
DSMLU_PROFILE = "CAMBRICON_DSMLU_PROFILE"
DEVICE_COUNT = 100
"""Each made-up device's Count (slots), and its Devcore."""
MAX_CARDS = 4096
"""A node advertising more cores than this many cards is refused (HAMi would build that many devices)."""


def go_int32(value: int) -> int:
    """Go's `int32(n)` conversion of an int64: the low 32 bits, two's complement."""
    return (value + 2**31) % 2**32 - 2**31


def names(
    count: str = DEFAULT_COUNT, memory: str = DEFAULT_MEMORY, cores: str = DEFAULT_CORES
) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="cambricon",
        count=count,
        memory=memory,
        cores=cores,
        memory_factor=MEMORY_FACTOR,
        to_allocate="hami.io/cambricon-mlu-devices-to-allocate",
        allocated="hami.io/cambricon-mlu-devices-allocated",
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,
        lock=LockKind.DSMLU,
        use_uuid="cambricon.com/use-gpuuuid",
        nouse_uuid="cambricon.com/nouse-gpuuuid",
    )


def vmemory_request(
    names: VendorNames, container: Mapping[str, Any], default_cores: int
) -> DeviceRequest | None:
    """GenerateResourceRequests of HAMi's Cambricon and Iluvatar backends (memory in 256 MiB units).

    Where HAMi would pass on a negative cores value (or one that Go's `int32()` wraps negative), this
    makes no request: a negative share has no meaning and cannot be written in a pod annotation."""
    count = as_int64(resource_value(container, names.count))
    if count is None:
        return None
    nums = go_int32(count)
    if nums <= 0:
        return None
    memory = 0
    raw_memory = resource_value(container, names.memory)
    if raw_memory is not None:
        units = as_int64(raw_memory)
        if units is None or not 0 <= units <= INT32_MAX // MEMORY_FACTOR:
            return None
        memory = units * MEMORY_FACTOR
    cores = default_cores
    raw_cores = as_int64(resource_value(container, names.cores))
    if raw_cores is not None:
        cores = go_int32(raw_cores)
        if cores < 0:
            return None
    return DeviceRequest(nums, names.common_word, memory, 100 if memory == 0 else 0, cores)


# --- ResourceQuota ---------------------------------------------------------------------------------------


def quota_fits(quota: Mapping[str, QuotaEntry], names: VendorNames, memory: int, cores: int) -> bool:
    """HAMi's `QuotaManager.FitQuota`: the namespace's use plus `memory` MiB stays within the memory limit
    (which `QuotaEntry` carries already x the memory factor, as HAMi compares it), and its use plus
    `cores` within the cores limit, where a limit is set."""
    entry = quota.get(names.memory) if names.memory else None
    if entry is not None and entry.limit is not None and entry.used + memory > entry.limit:
        return False
    entry = quota.get(names.cores) if names.cores else None
    return not (entry is not None and entry.limit is not None and entry.used + cores > entry.limit)


def init_containers(pod: Mapping[str, Any]) -> int:
    spec = pod.get("spec")
    inits = spec.get("initContainers") if isinstance(spec, Mapping) else None
    return len(inits) if isinstance(inits, list) else 0


def collapsed_usage(containers: Sequence[Sequence[GPUSlice]], inits: int) -> tuple[int, int]:
    """HAMi's `CollapseInitContainerUsage`, summed: per device, the larger of the biggest init container
    share (the first `inits` entries run one at a time) and the regular containers' sum; (MiB, cores)."""
    peak: dict[str, tuple[int, int]] = {}
    total: dict[str, tuple[int, int]] = {}
    for position, slices in enumerate(containers):
        for piece in slices:
            if position < inits:
                mem, cores = peak.get(piece.uuid, (0, 0))
                peak[piece.uuid] = (max(mem, piece.usedmem), max(cores, piece.usedcores))
            else:
                mem, cores = total.get(piece.uuid, (0, 0))
                total[piece.uuid] = (mem + piece.usedmem, cores + piece.usedcores)
    memory = cores = 0
    for uuid in peak.keys() | total.keys():
        a, b = peak.get(uuid, (0, 0)), total.get(uuid, (0, 0))
        memory += max(a[0], b[0])
        cores += max(a[1], b[1])
    return memory, cores


# --- the vendor ------------------------------------------------------------------------------------------


def _capacity(node: Mapping[str, Any], resource: str) -> Any | None:
    status = node.get("status")
    capacity = status.get("capacity") if isinstance(status, Mapping) else None
    return capacity.get(resource) if isinstance(capacity, Mapping) else None


def _device_index(piece: GPUSlice, custom: Sequence[Mapping[str, Any]]) -> int:
    """The index HAMi's Fit recorded for the device (`Picked.custom`), else the one its id ends with
    (`<node>-cambricon-mlu-<i>`), else 0 (a ContainerDevice without Idx)."""
    recorded = custom[0].get("index") if custom else None
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        return recorded
    tail = piece.uuid.rpartition("-")[2]
    return int(tail) if tail.isascii() and tail.isdigit() else 0


class Cambricon(Vendor):
    """HAMi's CambriconDevices."""

    default_cores = 100

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """GetNodeDevices: devices made up from `status.capacity` (see the module docstring)."""
        cards = as_int64(_capacity(node, self.names.cores))
        if not cards:
            return None
        if cards < 0:
            return ()  # HAMi's loop makes no device and reports no error
        if cards > MAX_CARDS * DEVICE_COUNT:
            where = f"status.capacity[{self.names.cores}]"
            raise WireFormatError(where, "whole value", str(cards), f"is more than {MAX_CARDS} cards x 100")
        memory = as_int64(_capacity(node, self.names.memory)) or 0
        where = f"status.capacity[{self.names.memory}]"
        if memory < 0:
            raise WireFormatError(where, "whole value", str(memory), "is negative")
        devmem = memory * MEMORY_FACTOR * DEVICE_COUNT // cards
        if devmem > INT32_MAX:
            reason = f"gives {devmem} MiB per device, above {INT32_MAX}"
            raise WireFormatError(where, "whole value", str(memory), reason)
        meta = node.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        node_name = name if isinstance(name, str) else ""
        return tuple(
            GPUInfo(
                id=f"{node_name}-cambricon-mlu-{i}",
                index=i,
                count=DEVICE_COUNT,
                devmem=devmem,
                devcore=DEVICE_COUNT,
                type=COMMON_WORD,
                numa=0,
                health=True,
            )
            for i in range(-(-cards // DEVICE_COUNT))
        )

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        return vmemory_request(self.names, container, self.default_cores)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's checkType here compares the request's Type with "MLU", exactly."""
        return request.type == self.names.common_word

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """The common Fit with the quota check before memory. The check needs the devices already taken
        for this container, which `Vendor.extra_reason` does not see, so the walk is here."""
        quota = context.quota
        earlier = context.allocated.get(self.names.common_word, PodAllocation())
        before = [c.devices for c in earlier.containers]
        inits = init_containers(context.pod)
        cores = min(request.coresreq, 100)
        reasons: dict[str, int] = {}
        found: list[GPUSlice] = []
        custom: list[Mapping[str, Any]] = []
        for device in reversed(devices):
            memreq = request_memory(device, request)
            taken = GPUSlice(device.id, memreq, cores, self.slice_type(device, request))
            reason = slot_reason(self, device, request, context)
            if reason is None and quota:
                memory, used_cores = collapsed_usage([*before, [*found, taken]], inits)
                if not quota_fits(quota, self.names, memory, used_cores):
                    reason = RESOURCE_QUOTA_NOT_FIT
            if reason is None:
                reason = capacity_reason(device, memreq, cores)
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            found.append(taken)
            custom.append({"index": device.info.index})
            if len(found) == request.nums:
                return Picked(tuple(found), tuple(custom))
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        out = super().pod_annotations(pod, devices, node=node, now=now, custom=custom)
        first = next(((i, c) for i, c in enumerate(devices.containers) if c.devices), None)
        if not out or first is None:
            return out
        position, container = first
        piece = container.devices[0]
        index = _device_index(piece, custom[position] if position < len(custom) else ())
        out[DSMLU_ASSIGNED] = "false"
        out[DSMLU_PROFILE] = f"{index}_{piece.usedcores}_{piece.usedmem // MEMORY_FACTOR}"
        return out


def resource_name(section: Section, key: str, default: str) -> str:
    """A resource name the backend cannot do without."""
    value = section.text(key, default)
    if not value.strip():
        raise section.fail(key, "must name a resource", value)
    return value


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `cambricon` section (CambriconConfig: resourceCountName, resourceMemoryName,
    resourceCoreName)."""
    section = config.section("cambricon")
    vendor = Cambricon(
        names(
            count=resource_name(section, "resourceCountName", DEFAULT_COUNT),
            memory=resource_name(section, "resourceMemoryName", DEFAULT_MEMORY),
            cores=resource_name(section, "resourceCoreName", DEFAULT_CORES),
        )
    )
    section.finish()
    return (vendor,)


__all__ = [
    "COMMON_WORD",
    "DEFAULT_CORES",
    "DEFAULT_COUNT",
    "DEFAULT_MEMORY",
    "DEVICE_COUNT",
    "DSMLU_ASSIGNED",
    "DSMLU_PROFILE",
    "FLAG_COUNT",
    "MAX_CARDS",
    "MEMORY_FACTOR",
    "Cambricon",
    "build",
    "collapsed_usage",
    "go_int32",
    "init_containers",
    "names",
    "quota_fits",
    "resource_name",
    "vmemory_request",
]
