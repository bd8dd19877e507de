"""HAMi's common Fit, the one most backends share (pkg/device/hygon/device.go `Fit`, the same loop in
cambricon, iluvatar, ascend, mthreads, biren, vastai, amd with their own twists), pure.

The devices arrive in the policy's order and are walked from the end (Go's `slices.Backward`), so with
equal scores the last registered device is tried first. Each device is checked in HAMi's order and the
first rule it breaks is counted as its reason: health (`CardNotHealth`), type (`CardTypeMismatch`), UUID
(`CardUuidMismatch`), a free slot (`CardTimeSlicingExhausted`), the mutex policy on a used device
(`ExclusiveDeviceAllocateConflict`), the vendor's own check (`Vendor.extra_reason`: Cambricon's quota),
memory (`CardInsufficientMemory`), cores (`CardInsufficientCore`), 100 cores on a used 100-core device
(`ExclusiveDeviceAllocateConflict`), no cores asked on a device whose cores are all taken
(`CardComputeUnitsExhausted`). Cores asked above 100 count as 100. Memory is the request's MiB, else
its percentage of the device (101: unset, 0 MiB). When the walk ends short, the devices found count as
`AllocatedCardsInsufficientRequest`. The text is GenReason over the devices given.
"""

from __future__ import annotations

from collections.abc import Sequence

from hami_api.types import GPUSlice
from hami_control.devices.base import DeviceRequest, FitContext, Picked, Unfit, Vendor
from hami_control.usage import GPUUsage

CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_NOT_HEALTH = "CardNotHealth"
NUMA_NOT_FIT = "NumaNotFit"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
MODE_NOT_FIT = "ModeNotFit"
UNSET_PERCENTAGE = 101


def request_memory(device: GPUUsage, request: DeviceRequest) -> int:
    """The MiB a request takes on `device` (HAMi: Memreq, else Totalmem * MemPercentagereq / 100 unless
    the percentage is the unset marker 101; Go's int32 division truncates)."""
    memreq = request.memreq if request.memreq > 0 else 0
    if request.mem_percentage != UNSET_PERCENTAGE and request.memreq == 0:
        memreq = int(device.info.devmem * request.mem_percentage / 100)
    return memreq


def slot_reason(vendor: Vendor, device: GPUUsage, request: DeviceRequest, context: FitContext) -> str | None:
    """The checks before memory and cores, in HAMi's order: health, type, UUID, slot, mutex."""
    annotations = context.annotations
    if not device.healthy:
        return CARD_NOT_HEALTH
    if not vendor.type_allowed(annotations, device, request):
        return CARD_TYPE_MISMATCH
    if not vendor.uuid_allowed(annotations, device):
        return CARD_UUID_MISMATCH
    if device.info.count <= device.used:
        return CARD_TIME_SLICING_EXHAUSTED
    if context.mutex and device.used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    return None


def capacity_reason(device: GPUUsage, memreq: int, cores: int) -> str | None:
    """The checks after the slot: memory, cores, exclusivity, a device whose cores are all taken."""
    info = device.info
    if info.devmem - device.usedmem < memreq:
        return CARD_INSUFFICIENT_MEMORY
    if info.devcore - device.usedcores < cores:
        return CARD_INSUFFICIENT_CORE
    if info.devcore == 100 and cores == 100 and device.used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if info.devcore != 0 and device.usedcores == info.devcore and cores == 0:
        return CARD_COMPUTE_UNITS_EXHAUSTED
    return None


def standard_fit(
    vendor: Vendor, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext
) -> Picked | Unfit:
    """The common Fit (see the module docstring)."""
    reasons: dict[str, int] = {}
    found: list[GPUSlice] = []
    cores = min(request.coresreq, 100)
    for device in reversed(devices):
        reason = slot_reason(vendor, device, request, context)
        memreq = request_memory(device, request)
        if reason is None:
            reason = vendor.extra_reason(device, request, memreq, context)
        if reason is None:
            reason = capacity_reason(device, memreq, cores)
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        found.append(GPUSlice(device.id, memreq, cores, vendor.slice_type(device, request)))
        if len(found) == request.nums:
            return Picked(tuple(found))
    if found:
        reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
    return Unfit(reasons, len(devices))


__all__ = [
    "ALLOCATED_CARDS_INSUFFICIENT_REQUEST",
    "CARD_COMPUTE_UNITS_EXHAUSTED",
    "CARD_INSUFFICIENT_CORE",
    "CARD_INSUFFICIENT_MEMORY",
    "CARD_NOT_FOUND_CUSTOM_FILTER_RULE",
    "CARD_NOT_HEALTH",
    "CARD_TIME_SLICING_EXHAUSTED",
    "CARD_TYPE_MISMATCH",
    "CARD_UUID_MISMATCH",
    "EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT",
    "MODE_NOT_FIT",
    "NODE_INSUFFICIENT_DEVICE",
    "NUMA_NOT_FIT",
    "RESOURCE_QUOTA_NOT_FIT",
    "UNSET_PERCENTAGE",
    "capacity_reason",
    "request_memory",
    "slot_reason",
    "standard_fit",
]
