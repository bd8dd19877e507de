"""Kunlunxin XPU (HAMi pkg/device/kunlun/device.go, vdevice.go, topo.go, config.go, v2.10.0): two
backends from the `kunlun` section, both placing devices by the board's topology
(`hami_control.devices.kunlun_topology`).

Whole XPUs (common word and device Type `kunlun`, `Kunlun`):
- Inventory: none is registered; `status.capacity["kunlunxin.com/xpu"]` = n gives devices
  `<node>-kunlun-<i>` (Index i, Count 100, Devmem 98304, Devcore 100, Numa 1 from i = n/2 on). Always
  healthy, no handshake, no node lock.
- Webhook: a container asks it when its limits name the count resource. Request: that count (limits,
  then requests), each device whole (100 % of its memory, 0 cores).
- Fit: HAMi's `graghSelect` over the devices that are free (unused and healthy) and allowed by the UUID
  annotations; nothing selected is `NumaNotFit`, or `CardUuidMismatch` (one per device the annotations
  ruled out) when the annotations ruled any out. A chosen device records its whole memory and cores,
  while the in-Fit usage counts the slot only (HAMi's AddResourceUsage).
- Score: `calc_score` of the wings the pod's devices break (0 when the node holds other vendors' devices).
- Pod annotations: `hami.io/kunlun-allocated` (the pod device string) and `BAIDU_COM_DEVICE_IDX`, the
  device indexes of the last container that got devices ("0,1").

vXPU (common word `XPU`, `KunlunVXPU`):
- Inventory: `hami.io/node-register-xpu` as a JSON `[]DeviceInfo`; handshake `hami.io/node-handshake-xpu`.
- Webhook: a container asks it when its limits name `kunlunxin.com/vxpu`; its `vxpu-memory` limit is
  rounded up to a vXPU size (24576, 49152 or 98304 MiB) and copied to its requests. Request: the count
  and that size (cores = size x 100 / 98304); no readable memory asks a whole device (98304 MiB, 100 %,
  100 cores).
- Fit: `graghSelect` over the devices where the request fits (`fit_vxpu`: healthy, the memory left, and
  on a shared device the same size as its other slices), only idle ones under the mutex policy; nothing
  selected is `ExclusiveDeviceAllocateConflict` (mutex: the used devices that would otherwise fit), else
  `CardUuidMismatch`, else `NumaNotFit`.
- Pod annotations `hami.io/xpu-devices-to-allocate` / `hami.io/xpu-devices-allocated`; node lock
  `hami.io/mutex.lock`.

Both read the UUID annotations `hami.io/use-xpu-uuid` / `hami.io/no-use-xpu-uuid` and Baidu's
`baidu.com/use-gpuuuid` / `baidu.com/nouse-gpuuuid`: a device must pass both pairs.

Positions: HAMi's selection reads the wings from the positions of the device list it is given, which the
scheduler has sorted by score; here the devices are ordered by their Index first (stable, so equal
indexes keep the policy's order), so position p is the p-th device by Index (the device with Index p on
the usual board whose indexes are 0..7), whatever the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from datetime import datetime
from math import ceil
from typing import Any

from hami_api.annotations import encode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.quantity import parse_quantity
from hami_api.types import GPUInfo, GPUSlice, PodAllocation
from hami_control.devices.base import (
    INT32_MAX,
    Admission,
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
    check_uuid,
    has_limit,
    resource_value,
)
from hami_control.devices.config import DeviceConfig
from hami_control.devices.kunlun_topology import calc_score, graph_select
from hami_control.devices.standard import (
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    NUMA_NOT_FIT,
)
from hami_control.usage import GPUUsage

COMMON_WORD = "kunlun"
"""KunlunGPUCommonWord, also the whole XPUs' device Type."""
VXPU_COMMON_WORD = "XPU"
DEVICE_SELECTION = "BAIDU_COM_DEVICE_IDX"
USE_UUID = "hami.io/use-xpu-uuid"
NOUSE_UUID = "hami.io/no-use-xpu-uuid"
BAIDU_USE_UUID = "baidu.com/use-gpuuuid"
BAIDU_NOUSE_UUID = "baidu.com/nouse-gpuuuid"

XPU_COUNT = 100
XPU_MEMORY = 98304
"""KunlunMaxMemory: a whole XPU's memory in MiB (and the largest vXPU)."""
XPU_CORES = 100
VXPU_SIZES = (24576, 49152)
"""The vXPU memory sizes below a whole device (trimMemory)."""
MAX_CARDS = 1024
"""More whole XPUs than this in a node's capacity is refused as a malformed node (HAMi would build them)."""

_ID_INFIX = "-kunlun-"


def names(count: str = "kunlunxin.com/xpu") -> VendorNames:
    """The whole XPUs' names (KunlunDevices)."""
    return VendorNames(
        common_word=COMMON_WORD,
        family="kunlun",
        count=count,
        allocated="hami.io/kunlun-allocated",
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,
        lock=LockKind.NONE,
        use_uuid=USE_UUID,
        nouse_uuid=NOUSE_UUID,
    )


def vxpu_names(count: str = "kunlunxin.com/vxpu", memory: str = "kunlunxin.com/vxpu-memory") -> VendorNames:
    """The vXPU's names (KunlunVDevices)."""
    return VendorNames(
        common_word=VXPU_COMMON_WORD,
        family="kunlun",
        count=count,
        memory=memory,
        to_allocate="hami.io/xpu-devices-to-allocate",
        allocated="hami.io/xpu-devices-allocated",
        register="hami.io/node-register-xpu",
        inventory=Inventory.JSON,
        handshake="hami.io/node-handshake-xpu",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid=USE_UUID,
        nouse_uuid=NOUSE_UUID,
    )


def trim_memory(mib: int) -> int:
    """HAMi's trimMemory: the smallest vXPU size that holds `mib` (24576, 49152, else 98304)."""
    return next((size for size in VXPU_SIZES if mib <= size), XPU_MEMORY)


def fit_xpu(device: GPUUsage) -> bool:
    """HAMi's FitXPU: a whole XPU is free when nothing uses it and it is healthy."""
    return device.used == 0 and device.healthy


def fit_vxpu(device: GPUUsage, request: DeviceRequest) -> bool:
    """HAMi's FitVXPU: healthy, the memory left, and on a shared device the same size per slice (its used
    memory over its slices, Go's int32 division) as the request."""
    if not device.healthy or request.memreq + device.usedmem > device.info.devmem:
        return False
    if device.used == 0:
        return True
    return int(device.usedmem / device.used) == request.memreq


def _quantity_value(raw: Any) -> int | None:
    """Go's `Quantity.Value()` (rounded up, away from 0); None when it is not a quantity."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        value = parse_quantity(raw)
    except ValueError:
        return None
    return ceil(value) if value >= 0 else -ceil(-value)


def _id_index(device_id: str) -> int | None:
    """The Index in a whole XPU's synthesized id `<node>-kunlun-<i>`."""
    _, sep, tail = device_id.rpartition(_ID_INFIX)
    return int(tail) if sep and tail.isdigit() else None


class _Topology(Vendor):
    """What both backends share: the two UUID annotation pairs and the selection by position."""

    def uuid_allowed(self, annotations: Mapping[str, Any], device: GPUUsage) -> bool:
        return check_uuid(annotations, device.id, USE_UUID, NOUSE_UUID) and check_uuid(
            annotations, device.id, BAIDU_USE_UUID, BAIDU_NOUSE_UUID
        )

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's CheckType: the request names this backend exactly."""
        return request.type == self.names.common_word

    def free(self, device: GPUUsage, request: DeviceRequest, context: FitContext) -> bool:
        """The fit function the selection runs on each device allowed by the UUID annotations."""
        raise NotImplementedError

    def unfit_reasons(
        self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext
    ) -> dict[str, int]:
        """Reasons that come before `CardUuidMismatch` / `NumaNotFit` when nothing is selected."""
        return {}

    def slice_for(self, device: GPUUsage, request: DeviceRequest) -> GPUSlice:
        raise NotImplementedError

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        ordered = sorted(devices, key=lambda d: d.info.index)
        annotations = context.annotations
        allowed = [self.uuid_allowed(annotations, d) for d in ordered]
        fits = [ok and self.free(d, request, context) for d, ok in zip(ordered, allowed, strict=True)]
        positions = graph_select(fits, request.nums)
        if not positions:
            reasons = self.unfit_reasons(devices, request, context)
            mismatched = len({d.id for d, ok in zip(ordered, allowed, strict=True) if not ok})
            if not reasons and mismatched:
                reasons[CARD_UUID_MISMATCH] = mismatched
            if not reasons:
                reasons[NUMA_NOT_FIT] = 1
            return Unfit(reasons, len(devices))
        chosen = [ordered[p] for p in positions]
        return Picked(
            tuple(self.slice_for(d, request) for d in chosen),
            tuple({"index": d.info.index} for d in chosen),
        )


class Kunlun(_Topology):
    """HAMi's KunlunDevices: whole XPUs synthesized from the node's capacity."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """`<node>-kunlun-<i>` for i < capacity (None without a positive capacity, as HAMi's "device not
        found")."""
        where = f"status.capacity[{self.names.count}]"
        status = node.get("status")
        capacity = status.get("capacity") if isinstance(status, Mapping) else None
        raw = capacity.get(self.names.count) if isinstance(capacity, Mapping) else None
        if raw is None:
            return None
        cards = as_int64(raw) if isinstance(raw, str | int | float) and not isinstance(raw, bool) else None
        if cards is None:
            raise WireFormatError(where, "whole value", str(raw), "is not a whole number of devices (int64)")
        if cards <= 0:
            return None
        if cards > MAX_CARDS:
            raise WireFormatError(where, "whole value", str(cards), f"is more than {MAX_CARDS} devices")
        meta = node.get("metadata")
        node_name = meta.get("name") if isinstance(meta, Mapping) else None
        prefix = node_name if isinstance(node_name, str) else ""
        return tuple(
            GPUInfo(
                id=f"{prefix}{_ID_INFIX}{i}",
                index=i,
                count=XPU_COUNT,
                devmem=XPU_MEMORY,
                devcore=XPU_CORES,
                type=COMMON_WORD,
                numa=1 if i >= cards // 2 else 0,
                health=True,
            )
            for i in range(cards)
        )

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        count = as_int64(resource_value(container, self.names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        return DeviceRequest(count, COMMON_WORD, 0, 100, 0)

    def free(self, device: GPUUsage, request: DeviceRequest, context: FitContext) -> bool:
        return fit_xpu(device)

    def slice_for(self, device: GPUUsage, request: DeviceRequest) -> GPUSlice:
        return GPUSlice(device.id, device.info.devmem, device.info.devcore, request.type)

    def add_usage(
        self, device: GPUUsage, picked: GPUSlice, custom: Mapping[str, Any] | None = None
    ) -> GPUUsage:
        """HAMi's AddResourceUsage for whole XPUs counts the slot only."""
        return device.plus(1, 0, 0)

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        """`hami.io/kunlun-allocated` and `BAIDU_COM_DEVICE_IDX` (the last container with devices wins)."""
        if not any(len(c) for c in devices.containers):
            return {}
        out = {self.names.allocated: encode_pod_allocation(devices)}
        selection = ""
        for ci, container in enumerate(devices.containers):
            extra = custom[ci] if ci < len(custom) else ()
            indexes = [
                self._slice_index(s, extra[j] if j < len(extra) else {}) for j, s in enumerate(container)
            ]
            if indexes:
                selection = ",".join(str(i) for i in indexes)
        if selection:
            out[DEVICE_SELECTION] = selection
        return out

    @staticmethod
    def _slice_index(picked: GPUSlice, extra: Mapping[str, Any]) -> int:
        index = extra.get("index")
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return index
        parsed = _id_index(picked.uuid)
        if parsed is None:
            raise ValueError(f"kunlun device {picked.uuid!r} has no index (not a '<node>-kunlun-<i>' id)")
        return parsed

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
    ) -> float:
        """HAMi's ScoreNode: `calc_score` of the used devices' indexes before and the pod's; 0 when the
        node has a device whose Type is not a Kunlun one or the pod a slice of another Type."""
        if any(COMMON_WORD not in d.info.type for d in previous):
            return 0.0
        before = list(dict.fromkeys(d.info.index for d in previous if d.used > 0))
        index_of = {d.id: d.info.index for d in previous}
        current: list[int] = []
        for container in devices.containers:
            for picked in container:
                if COMMON_WORD not in picked.vendor:
                    return 0.0
                index = index_of.get(picked.uuid, _id_index(picked.uuid))
                if index is not None and index not in current:
                    current.append(index)
        return calc_score(before, current)


class KunlunVXPU(_Topology):
    """HAMi's KunlunVDevices: vXPU slices of the devices the plugin registers."""

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        """Round the `vxpu-memory` limit up to a vXPU size and copy it to the requests."""
        if not has_limit(container, self.names.count):
            return Admission(False)
        resources = container["resources"]
        limits = resources["limits"]
        if self.names.memory in limits:
            value = _quantity_value(limits[self.names.memory])
            if value is not None:
                size = str(trim_memory(value))
                limits[self.names.memory] = size
                requests = resources.get("requests")
                if requests is None:
                    requests = resources["requests"] = {}
                if isinstance(requests, MutableMapping):
                    requests[self.names.memory] = size
        return Admission(True)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        count = as_int64(resource_value(container, self.names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        memory = as_int64(resource_value(container, self.names.memory)) if self.names.memory else None
        if memory is None:
            return DeviceRequest(count, VXPU_COMMON_WORD, XPU_MEMORY, 100, 100)
        size = trim_memory(memory)
        return DeviceRequest(count, VXPU_COMMON_WORD, size, 0, size * 100 // XPU_MEMORY)

    def free(self, device: GPUUsage, request: DeviceRequest, context: FitContext) -> bool:
        if context.mutex and device.used > 0:
            return False
        return fit_vxpu(device, request)

    def unfit_reasons(
        self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext
    ) -> dict[str, int]:
        if not context.mutex:
            return {}
        busy = sum(1 for d in devices if d.used > 0 and fit_vxpu(d, request))
        return {EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: busy} if busy else {}

    def slice_for(self, device: GPUUsage, request: DeviceRequest) -> GPUSlice:
        return GPUSlice(device.id, request.memreq, request.coresreq, request.type)


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `kunlun` section (KunlunConfig: resourceCountName, resourceVCountName,
    resourceVMemoryName): the whole XPUs, then the vXPU (HAMi's order)."""
    section = config.section("kunlun")
    whole = Kunlun(names(count=section.text("resourceCountName", "kunlunxin.com/xpu")))
    vxpu = KunlunVXPU(
        vxpu_names(
            count=section.text("resourceVCountName", "kunlunxin.com/vxpu"),
            memory=section.text("resourceVMemoryName", "kunlunxin.com/vxpu-memory"),
        )
    )
    section.finish()
    return (whole, vxpu)


__all__ = [
    "BAIDU_NOUSE_UUID",
    "BAIDU_USE_UUID",
    "COMMON_WORD",
    "DEVICE_SELECTION",
    "NOUSE_UUID",
    "USE_UUID",
    "VXPU_COMMON_WORD",
    "XPU_MEMORY",
    "Kunlun",
    "KunlunVXPU",
    "build",
    "fit_vxpu",
    "fit_xpu",
    "names",
    "trim_memory",
    "vxpu_names",
]
