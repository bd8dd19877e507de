"""Biren GPUs (HAMi pkg/device/biren/device.go, v2.10.0): whole devices, counted only.

- Inventory: `hami.io/node-biren-register` as a JSON `[]DeviceInfo`, every device's Devcore forced to
  100 ("only for calscore use"); handshake `hami.io/node-handshake-biren`.
- Request: `birentech.com/gpu` (the chart's resourceCountName), limits else requests, read as Go's
  `Quantity.AsInt64` and converted with Go's `int32(n)` (which wraps); `Nums n, Memreq 0, pct 100,
  core 0`. A count that is not a whole number, or wraps to <= 0, is no request (HAMi drops Nums <= 0).
  No memory or core resource exists.
- Fit: health, type (the request's Type must be exactly "Biren"; `birentech.com/use-biren` is declared
  but never read), UUID (`birentech.com/use-gpuuuid` / `nouse-gpuuuid`), a free slot, the mutex policy
  on a used device; no memory or core check. Each chosen device gets `usedmem 0` and the request's
  cores (0). Walked from the end (Go's `slices.Backward`).
- Pod annotations: `hami.io/Biren-devices-to-allocate` and `hami.io/Biren-devices-allocated`; node lock
  `hami.io/mutex.lock`, taken when a regular container asks a device. ScoreNode is 0.

HAMi's Vastai backend is this one plus its die mode, so `hami_control.devices.vastai` builds on
`CountedDevices` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hami_api.types import GPUInfo, GPUSlice
from hami_control.devices.base import (
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    Picked,
    Unfit,
    Vendor,
    VendorNames,
    as_int64,
    resource_value,
)
from hami_control.devices.config import DeviceConfig, Section
from hami_control.devices.standard import ALLOCATED_CARDS_INSUFFICIENT_REQUEST, slot_reason
from hami_control.usage import GPUUsage

COMMON_WORD = "Biren"
DEFAULT_COUNT = "birentech.com/gpu"
FORCED_DEVCORE = 100
"""GetNodeDevices sets every device's Devcore to 100 whatever the plugin registered."""


def go_int32(value: int) -> int:
    """Go's `int32(n)` conversion of an int64: the low 32 bits, two's complement."""
    return (value + 2**31) % 2**32 - 2**31


def names(count: str = DEFAULT_COUNT) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="biren",
        count=count,
        to_allocate="hami.io/Biren-devices-to-allocate",
        allocated="hami.io/Biren-devices-allocated",
        register="hami.io/node-biren-register",
        inventory=Inventory.JSON,
        handshake="hami.io/node-handshake-biren",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid="birentech.com/use-gpuuuid",
        nouse_uuid="birentech.com/nouse-gpuuuid",
    )


class CountedDevices(Vendor):
    """The behaviour HAMi's Biren and Vastai backends share: whole devices asked by count alone."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        devices = super().node_devices(node)
        if devices is None:
            return None
        return tuple(replace(d, devcore=FORCED_DEVCORE) for d in devices)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        count = as_int64(resource_value(container, self.names.count))
        if count is None:
            return None
        nums = go_int32(count)
        if nums <= 0:
            return None
        return DeviceRequest(nums, self.names.common_word, memreq=0, mem_percentage=100, coresreq=0)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's checkType here compares the request's Type with the common word, exactly."""
        return request.type == self.names.common_word

    def pick(self, device: GPUUsage, request: DeviceRequest) -> GPUSlice:
        """The slice Fit writes for a chosen device: no memory, the request's cores, the request's Type."""
        return GPUSlice(device.id, 0, request.coresreq, request.type)

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        found, reasons = walk(self, devices, request, context, limit=request.nums)
        if len(found) == request.nums:
            return Picked(tuple(self.pick(d, request) for d in found))
        return unfit(reasons, found, devices)


def walk(
    vendor: Vendor,
    devices: Sequence[GPUUsage],
    request: DeviceRequest,
    context: FitContext,
    *,
    limit: int | None,
    refuse: Callable[[GPUUsage], str | None] | None = None,
) -> tuple[list[GPUUsage], dict[str, int]]:
    """Fit's walk over `devices` from the end: the devices that pass (the first `limit` of them; None:
    all) and, per reason, how many did not (`slot_reason`: health, type, UUID, slot, mutex; then
    `refuse`, the vendor's own last check)."""
    found: list[GPUUsage] = []
    reasons: dict[str, int] = {}
    for device in reversed(devices):
        reason = slot_reason(vendor, device, request, context)
        if reason is None and refuse is not None:
            reason = refuse(device)
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        found.append(device)
        if limit is not None and len(found) == limit:
            break
    return found, reasons


def unfit(reasons: dict[str, int], found: Sequence[GPUUsage], devices: Sequence[GPUUsage]) -> Unfit:
    """The refusal when the walk ends short: the devices found count as AllocatedCardsInsufficientRequest."""
    if found:
        reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
    return Unfit(reasons, len(devices))


class Biren(CountedDevices):
    """HAMi's BirenDevices."""


def count_name(section: Section, default: str) -> str:
    """`resourceCountName`, which must name a resource."""
    count = section.text("resourceCountName", default)
    if not count.strip():
        raise section.fail("resourceCountName", "must name the device count resource", count)
    return count


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `biren` section (BirenConfig: resourceCountName)."""
    section = config.section("biren")
    vendor = Biren(names(count=count_name(section, DEFAULT_COUNT)))
    section.finish()
    return (vendor,)


__all__ = [
    "COMMON_WORD",
    "DEFAULT_COUNT",
    "FORCED_DEVCORE",
    "Biren",
    "CountedDevices",
    "build",
    "count_name",
    "go_int32",
    "names",
    "unfit",
    "walk",
]
