"""Iluvatar GPUs (HAMi pkg/device/iluvatar/device.go, v2.10.0): one backend per `iluvatars[]` entry of
the device config (the chart lists MR-V100, MR-V50, BI-V150 and BI-V100), each named by its
`commonWord` (cw). HAMi builds them only with `--enable-iluvatar`; that switch is the registry's.

- Inventory: `hami.io/node-<cw>-register` in the legacy string form; handshake
  `hami.io/node-handshake-<cw>`, the common CheckHealth on the count resource; nothing to clean up.
- Webhook: the container asks this chip when its limits name `resourceCountName`. Then a count above 1
  (Go's `Quantity.Value()`, rounded up) sets the cores limit to count x 100, and the container gets the
  env `SOL_CONTINER_NAME=<container name>` (HAMi's spelling, kept for compatibility) unless it has one or
  has no name.
- Request: Cambricon's (`cambricon.vmemory_request`): memory in 256 MiB units with the same rejections,
  but cores default to 0.
- Fit: the common one, where the request's Type must be exactly the cw, with the UUID rule of
  `hami.io/use-<cw>-uuid` / `hami.io/no-use-<cw>-uuid`.
- Pod annotations: `hami.io/<cw>-devices-to-allocate` and `hami.io/<cw>-devices-allocated`; node lock
  `hami.io/mutex.lock`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from hami_api.quantity import canonical_quantity, quantity_value
from hami_control.devices.base import (
    INT64_MAX,
    Admission,
    DeviceRequest,
    HealthRule,
    Inventory,
    LockKind,
    Vendor,
    VendorNames,
)
from hami_control.devices.cambricon import MEMORY_FACTOR, resource_name, vmemory_request
from hami_control.devices.config import DeviceConfig, Section
from hami_control.usage import GPUUsage

FAMILY = "iluvatar"
CONTAINER_ENV = "SOL_CONTINER_NAME"
"""The env HAMi adds with the container's name (misspelt upstream; the plugin reads this spelling)."""
CORES_PER_DEVICE = 100
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LONGEST_KEY = "{}-devices-to-allocate"
"""The longest annotation name made from the cw: it must stay a valid annotation key name (<= 63)."""


def names(cw: str, count: str, memory: str, cores: str) -> VendorNames:
    return VendorNames(
        common_word=cw,
        family=FAMILY,
        count=count,
        memory=memory,
        cores=cores,
        memory_factor=MEMORY_FACTOR,
        to_allocate=f"hami.io/{cw}-devices-to-allocate",
        allocated=f"hami.io/{cw}-devices-allocated",
        register=f"hami.io/node-{cw}-register",
        inventory=Inventory.LEGACY,
        handshake=f"hami.io/node-handshake-{cw}",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid=f"hami.io/use-{cw}-uuid",
        nouse_uuid=f"hami.io/no-use-{cw}-uuid",
    )


def chart_names(cw: str) -> VendorNames:
    """The names the chart gives chip `cw`: `iluvatar.ai/<cw>-vgpu`, `.vMem`, `.vCore`."""
    return names(cw, f"iluvatar.ai/{cw}-vgpu", f"iluvatar.ai/{cw}.vMem", f"iluvatar.ai/{cw}.vCore")


def _count_value(raw: Any) -> int | None:
    """Go's `Quantity.Value()` of a limit, None for a value that is not a quantity."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return quantity_value(raw)
    except ValueError:
        return None


class Iluvatar(Vendor):
    """HAMi's IluvatarDevices, one per configured chip."""

    default_cores = 0

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        resources = container.get("resources")
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        if not isinstance(limits, MutableMapping) or self.names.count not in limits:
            return Admission(False)
        count = _count_value(limits[self.names.count])
        if count is not None and count > 1 and count * CORES_PER_DEVICE <= INT64_MAX:
            limits[self.names.cores] = canonical_quantity(str(count * CORES_PER_DEVICE))
        name = container.get("name")
        env = container.get("env")
        if isinstance(name, str) and name and (env is None or isinstance(env, list)):
            entries: list[Any] = env if env is not None else []
            if not any(isinstance(e, Mapping) and e.get("name") == CONTAINER_ENV for e in entries):
                entries.append({"name": CONTAINER_ENV, "value": name})
                container["env"] = entries
        return Admission(True)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        return vmemory_request(self.names, container, self.default_cores)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's checkType here compares the request's Type with the cw, exactly."""
        return request.type == self.names.common_word


def _common_word(section: Section, taken: Mapping[str, int]) -> str:
    cw = section.text("commonWord")
    if not cw:
        raise section.fail("commonWord", "is required (it names the chip's annotations and requests)")
    if _NAME_PART.fullmatch(cw) is None or len(_LONGEST_KEY.format(cw)) > 63:
        raise section.fail(
            "commonWord",
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit, "
            f"at most {63 - len(_LONGEST_KEY.format(''))} characters (it is part of annotation keys)",
            cw,
        )
    if cw in taken:
        raise section.fail("commonWord", f"is already used by iluvatars[{taken[cw]}]", cw)
    return cw


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `iluvatars` list (IluvatarConfig: chipName, commonWord, resourceCountName,
    resourceMemoryName, resourceCoreName), one vendor per entry."""
    vendors: list[Vendor] = []
    taken: dict[str, int] = {}
    for i, section in enumerate(config.sections("iluvatars")):
        cw = _common_word(section, taken)
        taken[cw] = i
        section.text("chipName")  # HAMi only logs it
        vendors.append(
            Iluvatar(
                names(
                    cw,
                    count=resource_name(section, "resourceCountName", ""),
                    memory=resource_name(section, "resourceMemoryName", ""),
                    cores=resource_name(section, "resourceCoreName", ""),
                )
            )
        )
        section.finish()
    return tuple(vendors)


__all__ = ["CONTAINER_ENV", "FAMILY", "Iluvatar", "build", "chart_names", "names"]
