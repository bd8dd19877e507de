"""Hygon DCU (HAMi pkg/device/hygon/device.go, v2.10.0): HAMi's common behaviour almost to the letter.

- Inventory: `hami.io/node-dcu-register` in the legacy string form (`DecodeNodeDevices`); handshake
  `hami.io/node-handshake-dcu` (the generic `CheckHealth`). GetNodeDevices answers an error, not an
  empty list, for an inventory that lists no device (`:`), as for a missing annotation (HAMi's register
  loop then skips the vendor on that node, keeping what its cache had): here both are None.
- Request: `hygon.com/dcunum` (1..int32, limits then requests), `dcumem` x `memoryFactor` (when > 1),
  `dcucores` defaulting to 100; a memory or core value outside 0..int32 (or memory past int32 once
  scaled) is no request; no memory asks 100 % of a device's memory.
- Fit: the common Fit (`hami_control.devices.standard`). Its type step (`checkType`) needs the request's
  Type to be exactly "DCU", then the device's Type to pass `hygon.com/use-dcutype` / `nouse-dcutype`
  (case-insensitive substrings, empty = no constraint); the UUID step reads `hygon.com/use-gpuuuid` /
  `nouse-gpuuuid`.
- Pod annotations: `hami.io/dcu-devices-to-allocate` and `hami.io/dcu-devices-allocated`; node lock
  `hami.io/mutex.lock`, taken when a regular (not init) container asks a DCU. ScoreNode is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami_api.types import GPUInfo
from hami_control.devices.base import (
    INT32_MAX,
    DeviceRequest,
    HealthRule,
    Inventory,
    LockKind,
    Vendor,
    VendorNames,
    check_type,
)
from hami_control.devices.config import DeviceConfig, Section
from hami_control.usage import GPUUsage

COMMON_WORD = "DCU"
DEFAULT_COUNT = "hygon.com/dcunum"
DEFAULT_MEMORY = "hygon.com/dcumem"
DEFAULT_CORES = "hygon.com/dcucores"


def names(
    count: str = DEFAULT_COUNT,
    memory: str = DEFAULT_MEMORY,
    cores: str = DEFAULT_CORES,
    memory_factor: int = 1,
) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="hygon",
        count=count,
        memory=memory,
        cores=cores,
        memory_factor=memory_factor,
        to_allocate="hami.io/dcu-devices-to-allocate",
        allocated="hami.io/dcu-devices-allocated",
        register="hami.io/node-dcu-register",
        inventory=Inventory.LEGACY,
        handshake="hami.io/node-handshake-dcu",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid="hygon.com/use-gpuuuid",
        nouse_uuid="hygon.com/nouse-gpuuuid",
        use_type="hygon.com/use-dcutype",
        nouse_type="hygon.com/nouse-dcutype",
    )


class Hygon(Vendor):
    """HAMi's DCUDevices: the common steps, with HAMi's own type check and empty-inventory answer."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """GetNodeDevices: None for no annotation and for one listing no device (both are errors in
        HAMi: "annos not found", "no gpu found on node"); `WireFormatError` for one that does not decode."""
        devices = super().node_devices(node)
        return devices or None

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """checkType: the request's Type must be "DCU" exactly, then checkDCUtype on the device's Type."""
        names = self.names
        if request.type != COMMON_WORD:
            return False
        return check_type(annotations, device.info.type, names.use_type, names.nouse_type)


def _resource_name(section: Section, key: str, default: str, *, required: bool) -> str:
    value = section.text(key, default)
    if required and not value:
        raise section.fail(key, "must name the device count resource", value)
    if value != value.strip():
        raise section.fail(key, "must be a resource name without surrounding spaces", value)
    return value


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `hygon` section (HygonConfig: resourceCountName, resourceMemoryName, resourceCoreName,
    memoryFactor, an int32). A missing key gets the chart's value; an empty memory or core name means
    the resource is not read (as HAMi, which finds no such resource in any container)."""
    section = config.section("hygon")
    vendor = Hygon(
        names(
            count=_resource_name(section, "resourceCountName", DEFAULT_COUNT, required=True),
            memory=_resource_name(section, "resourceMemoryName", DEFAULT_MEMORY, required=False),
            cores=_resource_name(section, "resourceCoreName", DEFAULT_CORES, required=False),
            memory_factor=section.integer("memoryFactor", 1, low=0, high=INT32_MAX),
        )
    )
    section.finish()
    return (vendor,)


__all__ = ["COMMON_WORD", "DEFAULT_CORES", "DEFAULT_COUNT", "DEFAULT_MEMORY", "Hygon", "build", "names"]
