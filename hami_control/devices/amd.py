"""AMD GPUs (HAMi pkg/device/amd/device.go, v2.10.0): shares of a GPU by memory (MiB) and by a
percentage of its compute units, recorded under the GPU's own product type.

- Inventory: `hami.io/node-amd-register`, a JSON `[]DeviceInfo`; an empty list is an error in HAMi
  (`no gpu found on node`, the node's cached devices are kept), so it raises `WireFormatError` here.
  No handshake.
- Health (CheckHealth): `status.capacity[amd.com/gpu]` read as a whole number; absent, 0 or not whole is
  (false, false), anything else (true, true) (a negative count too, as in HAMi); no count resource
  configured is (true, true). NodeCleanUp, which HAMi runs for an unhealthy node it had cached, deletes
  the `hami.io/node-amd-register` annotation (not a handshake): that is the caller's to do.
- Webhook (MutateAdmission): a container asks AMD when its limits name the count, the memory or the
  core resource; with the count, a core limit must be a whole number in 1..100, else
  `amd.com/gpucores must be an integer percentage between 1 and 100`. Nothing is mutated.
- Request: limits only (requests are ignored): count in 1..int32, memory in 0..int32 MiB (no factor),
  cores in 1..100 % defaulting to 100; anything else is no request. Memory percentage is 0.
- Fit: health, type (`AMD` case-insensitively, then `amd.com/use-gputype` / `nouse-gputype` as
  case-insensitive substrings of the device Type), UUID (`amd.com/use-gpu-uuid` / `nouse-gpu-uuid`),
  slot, mutex; memory = Memreq, or the whole device when 0; cores = Totalcore * pct / 100 clamped to
  1..Totalcore (`CardInsufficientCore` on a device with no cores), and with no percentage the whole
  device when the memory asked is the whole device. No exclusivity rule beyond that. The slice keeps the
  device's registered Type (`AMD_Instinct_MI300X_VF`), not `AMD`.
- Pod annotations: `hami.io/amd-devices-to-allocate` and `hami.io/amd-devices-allocated`; node lock
  `hami.io/mutex.lock`, taken when a regular container asks AMD.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from datetime import datetime
from typing import Any

from hami_api.errors import WireFormatError
from hami_api.types import GPUInfo, GPUSlice
from hami_control.devices.base import (
    INT32_MAX,
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    Vendor,
    VendorNames,
    annotations_of,
    as_int64,
    check_type,
    has_limit,
    resource_value,
)
from hami_control.devices.config import DeviceConfig
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    slot_reason,
)
from hami_control.usage import GPUUsage

COMMON_WORD = "AMD"
REGISTER = "hami.io/node-amd-register"
USE_TYPE = "amd.com/use-gputype"
NOUSE_TYPE = "amd.com/nouse-gputype"
USE_UUID = "amd.com/use-gpu-uuid"
NOUSE_UUID = "amd.com/nouse-gpu-uuid"
DEFAULT_CORE_PERCENT = 100


def names(
    count: str = "amd.com/gpu",
    memory: str = "amd.com/gpumem",
    cores: str = "amd.com/gpucores",
) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="amd",
        count=count,
        memory=memory,
        cores=cores,
        to_allocate="hami.io/amd-devices-to-allocate",
        allocated="hami.io/amd-devices-allocated",
        register=REGISTER,
        inventory=Inventory.JSON,
        health=HealthRule.CAPACITY,
        lock=LockKind.MUTEX,
        use_uuid=USE_UUID,
        nouse_uuid=NOUSE_UUID,
        use_type=USE_TYPE,
        nouse_type=NOUSE_TYPE,
    )


def core_request(device: GPUUsage, request: DeviceRequest, memreq: int) -> int | None:
    """The cores a request takes on `device` (HAMi's coreReq), None when it asks cores of a device that
    has none."""
    total = device.info.devcore
    if request.coresreq > 0:
        if total <= 0:
            return None
        return min(max(total * request.coresreq // 100, 1), total)
    if device.info.devmem > 0 and memreq >= device.info.devmem:
        return total
    return 0


class AMD(Vendor):
    """HAMi's AMDDevices."""

    # --- the node side -------------------------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """The JSON inventory; one that lists no device raises `WireFormatError` (HAMi's error)."""
        devices = super().node_devices(node)
        if devices is not None and not devices:
            raw = str(annotations_of(node).get(REGISTER))
            raise WireFormatError(
                REGISTER, "whole value", raw, "lists no device (HAMi: no gpu found on node)"
            )
        return devices

    def node_health(self, node: Mapping[str, Any], now: datetime) -> NodeHealth:
        """AMD's CheckHealth: the count capacity as a whole number, (false, false) when absent, 0 or not
        whole (HAMi then runs NodeCleanUp: deletes `hami.io/node-amd-register`)."""
        if not self.names.count:
            return NodeHealth(True, True)
        status = node.get("status")
        capacity = status.get("capacity") if isinstance(status, Mapping) else None
        raw = capacity.get(self.names.count, 0) if isinstance(capacity, Mapping) else 0
        count = as_int64(raw)
        if not count:
            return NodeHealth(False, False)
        return NodeHealth(True, True)

    # --- the pod side --------------------------------------------------------------------------------

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        names = self.names
        found = has_limit(container, names.count)
        if found and names.cores and has_limit(container, names.cores):
            percent = as_int64(resource_value(container, names.cores, limits_only=True))
            if percent is None or not 1 <= percent <= 100:
                return Admission(False, f"{names.cores} must be an integer percentage between 1 and 100")
        if not found and names.memory:
            found = has_limit(container, names.memory)
        if not found and names.cores:
            found = has_limit(container, names.cores)
        return Admission(found)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        """GenerateResourceRequests from limits only; None for a value out of range."""
        names = self.names
        count = as_int64(resource_value(container, names.count, limits_only=True))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        memory = 0
        if names.memory and has_limit(container, names.memory):
            raw_mem = as_int64(resource_value(container, names.memory, limits_only=True))
            if raw_mem is None or not 0 <= raw_mem <= INT32_MAX:
                return None
            memory = raw_mem
        cores = DEFAULT_CORE_PERCENT
        if names.cores and has_limit(container, names.cores):
            raw_cores = as_int64(resource_value(container, names.cores, limits_only=True))
            if raw_cores is None or not 1 <= raw_cores <= 100:
                return None
            cores = raw_cores
        return DeviceRequest(count, COMMON_WORD, memory, 0, cores)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's checkType: the request is `AMD` (any case), then `use-gputype` / `nouse-gputype`."""
        if request.type.casefold() != COMMON_WORD.casefold():
            return False
        return check_type(annotations, device.info.type, self.names.use_type, self.names.nouse_type)

    def slice_type(self, device: GPUUsage, request: DeviceRequest) -> str:
        """The device's registered product type, which HAMi writes in the pod annotation."""
        return device.info.type

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """AMD's Fit: the common checks up to the mutex rule, then its own memory and core rules."""
        reasons: dict[str, int] = {}
        found: list[GPUSlice] = []
        for device in reversed(devices):
            memreq = request.memreq if request.memreq > 0 or device.info.devmem <= 0 else device.info.devmem
            cores = 0
            reason = slot_reason(self, device, request, context)
            if reason is None and device.free_mem < memreq:
                reason = CARD_INSUFFICIENT_MEMORY
            if reason is None:
                wanted = core_request(device, request, memreq)
                if wanted is None or device.free_cores < wanted:
                    reason = CARD_INSUFFICIENT_CORE
                else:
                    cores = wanted
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            found.append(GPUSlice(device.id, memreq, cores, self.slice_type(device, request)))
            if len(found) >= request.nums:
                return Picked(tuple(found))
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `amd` section (AMDConfig: resourceCountName, resourceMemoryName, resourceCoreName)."""
    section = config.section("amd")
    vendor = AMD(
        names(
            count=section.text("resourceCountName", "amd.com/gpu"),
            memory=section.text("resourceMemoryName", "amd.com/gpumem"),
            cores=section.text("resourceCoreName", "amd.com/gpucores"),
        )
    )
    section.finish()
    return (vendor,)


__all__ = ["AMD", "COMMON_WORD", "REGISTER", "build", "core_request", "names"]
