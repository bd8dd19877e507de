"""Vastai accelerators (HAMi pkg/device/vastai/device.go, v2.10.0): Biren's backend plus a die mode.

Everything outside die mode is the same as Biren's (`hami_control.devices.biren.CountedDevices`) under
Vastai's names: inventory `hami.io/node-va-register` (JSON, Devcore forced to 100), handshake
`hami.io/node-handshake-va`, the count `vastaitech.com/va` (`Nums n, Memreq 0, pct 100, core 0`), the
Fit checks health, type (the request's Type must be exactly "Vastai"; `vastaitech.com/use-va` is
declared but never read), UUID (`vastaitech.com/use-gpuuuid` / `nouse-gpuuuid`), a free slot and the
mutex policy; pod annotations `hami.io/Vastai-devices-to-allocate` / `-allocated`; lock
`hami.io/mutex.lock`.

Die mode: when the first of the devices Fit is given (policy order) has `custominfo.DeviceStrategy ==
"die"`, each device is one die of a physical card named by `custominfo.AIC` (a string).

- Fit walks every device (from the end) and keeps all that pass; under the mutex policy an idle die on a
  card with a used die is refused too (`ExclusiveDeviceAllocateConflict`). Exactly `nums` candidates
  are taken as they are; with more, one device takes the first candidate and several take
  `best_combination`: candidates grouped by AIC, the biggest group first, each group in walk order.
  Go orders the groups through a map, so equal groups come in a random order; here they come in the
  order their first die was met in the walk (deterministic). Go drops candidates without a string AIC
  there and still reports a fit, with fewer devices than asked: copied as is.
- ScoreNode: per container, the share of its dies on its most used AIC (max/total), summed as float32
  over the containers; 0 for the whole pod as soon as a chosen device has no custominfo, no AIC, or a
  string DeviceStrategy other than "die". Go reads the custominfo Fit copied onto each chosen device;
  here it is read from `previous` (the node's devices) by UUID, which holds the same inventory values.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from hami_api.types import PodAllocation
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
    custom_info,
)
from hami_control.devices.biren import CountedDevices, count_name, unfit, walk
from hami_control.devices.config import DeviceConfig
from hami_control.devices.standard import EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
from hami_control.usage import GPUUsage

COMMON_WORD = "Vastai"
DEFAULT_COUNT = "vastaitech.com/va"
DIE_STRATEGY = "die"
STRATEGY_KEY = "DeviceStrategy"
AIC_KEY = "AIC"


def names(count: str = DEFAULT_COUNT) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="vastai",
        count=count,
        to_allocate="hami.io/Vastai-devices-to-allocate",
        allocated="hami.io/Vastai-devices-allocated",
        register="hami.io/node-va-register",
        inventory=Inventory.JSON,
        handshake="hami.io/node-handshake-va",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid="vastaitech.com/use-gpuuuid",
        nouse_uuid="vastaitech.com/nouse-gpuuuid",
    )


def aic_of(device: GPUUsage) -> str | None:
    """The physical card (AIC) a die sits on: `custominfo.AIC` when it is a string, else None."""
    aic = custom_info(device.info).get(AIC_KEY)
    return aic if isinstance(aic, str) else None


def is_die_mode(devices: Sequence[GPUUsage]) -> bool:
    """HAMi's isDieMode: the first device's `custominfo.DeviceStrategy` is the string "die"."""
    return bool(devices) and custom_info(devices[0].info).get(STRATEGY_KEY) == DIE_STRATEGY


def best_combination(nums: int, candidates: Sequence[GPUUsage]) -> tuple[GPUUsage, ...]:
    """HAMi's computeBestCombination: the candidates with an AIC grouped by it, the biggest group first
    (equal groups in order of first appearance), up to `nums` devices; those without an AIC are left out,
    so the answer may be shorter than `nums`."""
    groups: dict[str, list[GPUUsage]] = {}
    for device in candidates:
        aic = aic_of(device)
        if aic is not None:
            groups.setdefault(aic, []).append(device)
    ordered = sorted(groups.values(), key=len, reverse=True)  # stable: ties keep first appearance
    return tuple(device for group in ordered for device in group)[: max(nums, 0)]


def float32(value: float) -> float:
    """`value` rounded to Go's float32."""
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


class Vastai(CountedDevices):
    """HAMi's VastaiDevices: Biren's steps, with die mode in Fit and a ScoreNode."""

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        if not is_die_mode(devices):
            return super().fit(devices, request, context)
        busy: set[str] = set()
        if context.mutex:  # the cards with a die in use, met anywhere in the list
            busy = {aic for d in devices if d.used > 0 and (aic := aic_of(d)) is not None}

        def on_busy_card(device: GPUUsage) -> str | None:
            """Under mutex, an idle die on a card with a used die."""
            aic = aic_of(device)
            return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT if aic is not None and aic in busy else None

        found, reasons = walk(self, devices, request, context, limit=None, refuse=on_busy_card)
        if len(found) < request.nums:
            return unfit(reasons, found, devices)
        if len(found) > request.nums:
            found = [found[0]] if request.nums == 1 else list(best_combination(request.nums, found))
        return Picked(tuple(self.pick(d, request) for d in found))

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
    ) -> float:
        known = {d.id: d for d in previous}
        score = 0.0
        for container in devices.containers:
            counts: dict[str, int] = {}
            for picked in container.devices:
                device = known.get(picked.uuid)
                info = custom_info(device.info) if device is not None else {}
                strategy = info.get(STRATEGY_KEY)
                if not info or (isinstance(strategy, str) and strategy != DIE_STRATEGY):
                    return 0.0
                if AIC_KEY not in info:
                    return 0.0
                aic = info[AIC_KEY]
                if isinstance(aic, str):
                    counts[aic] = counts.get(aic, 0) + 1
            total = sum(counts.values())
            if total:
                score = float32(score + float32(max(counts.values()) / total))
        return score


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `vastai` section (VastaiConfig: resourceCountName)."""
    section = config.section("vastai")
    vendor = Vastai(names(count=count_name(section, DEFAULT_COUNT)))
    section.finish()
    return (vendor,)


__all__ = [
    "AIC_KEY",
    "COMMON_WORD",
    "DEFAULT_COUNT",
    "DIE_STRATEGY",
    "STRATEGY_KEY",
    "Vastai",
    "aic_of",
    "best_combination",
    "build",
    "float32",
    "is_die_mode",
    "names",
]
