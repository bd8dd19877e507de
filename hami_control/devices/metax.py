"""MetaX GPU (HAMi pkg/device/metax/device.go, v2.10.0): whole MetaX GPUs, one container each, and the
registry entry of both MetaX backends (the sGPU one is `hami_control.devices.metax_sgpu`).

- Inventory: synthesised from `status.capacity[metax-tech.com/gpu]` (Go's AsInt64; absent, 0 or not a
  whole number: no devices): device `i` is `<node>-metax-<i>`, Count 1, Devmem 65536, Devcore 100, Type
  `Metax-GPU`, healthy. The node is healthy while that capacity is above 0; no handshake, no node lock.
- Webhook: the container asks Metax GPUs when its limits name the count resource; nothing is mutated.
- Request: the count from limits, else requests (1..int32; HAMi truncates a larger one to int32), each
  device whole: memory 100 %, 100 cores.
- Fit: HAMi's common Fit with its own type rule (the request's Type must be `Metax-GPU`), no UUID
  selection, and after the capacity checks a rule of its own: every device of the pod must be the one
  its earlier containers got (`CardNotFoundCustomFilterRule`).
- Pod annotations: `hami.io/metax-gpu-devices-to-allocate` / `-allocated`.
- ScoreNode: from the node's topology annotations, JSON `{"<devices>": <value>}` for the number of
  devices the pod takes: binpack `2000 - metax-tech.com/gpu.topology.losses[n]`, spread
  `2000 - metax-tech.com/gpu.topology.scores[n]` (a value that is missing or does not decode counts 0;
  no annotation, or another policy, scores 0).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hami_api._wire import INT64, JSONFloat, JSONObject, Where
from hami_api._wire import load_json as _load_json
from hami_api.errors import WireFormatError
from hami_api.types import GPUInfo, GPUSlice, PodAllocation
from hami_control.devices import metax_sgpu
from hami_control.devices.base import (
    INT32_MAX,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    Picked,
    Unfit,
    Vendor,
    VendorNames,
    annotations_of,
    as_int64,
    resource_value,
)
from hami_control.devices.config import DeviceConfig
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE,
    capacity_reason,
    request_memory,
    slot_reason,
)
from hami_control.usage import GPUUsage

COMMON_WORD = "Metax-GPU"
TOPOLOGY_LOSSES = "metax-tech.com/gpu.topology.losses"
TOPOLOGY_SCORES = "metax-tech.com/gpu.topology.scores"
DEVICE_MEMORY = 65536
MAX_DEVICES = 4096
"""A capacity above this is refused (`WireFormatError`) rather than synthesised device by device."""

_GO_INT = re.compile(r"[+-]?[0-9]+")


def names(count: str = "metax-tech.com/gpu") -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="metax",
        count=count,
        to_allocate="hami.io/metax-gpu-devices-to-allocate",
        allocated="hami.io/metax-gpu-devices-allocated",
        inventory=Inventory.CUSTOM,
        health=HealthRule.CAPACITY,
        lock=LockKind.NONE,
    )


def topology_value(text: str, devices: int) -> float:
    """parseMetaxAnnos: `text` as Go's map[int]int, the value for `devices`; 0 when it does not decode
    (as a whole: one bad key or value spoils it) or has no such key."""
    try:
        value = _load_json(Where(TOPOLOGY_LOSSES), text)
    except WireFormatError:
        return 0.0
    if value is None:
        return 0.0
    if not isinstance(value, JSONObject):
        return 0.0
    table: dict[int, int] = {}
    for key, member in value:
        if not _GO_INT.fullmatch(key) or not INT64[0] <= int(key) <= INT64[1]:
            return 0.0
        if member is None:
            table[int(key)] = 0
            continue
        if isinstance(member, bool | JSONFloat) or not isinstance(member, int):
            return 0.0
        if not INT64[0] <= member <= INT64[1]:
            return 0.0
        table[int(key)] = member
    return float(table.get(devices, 0))


class MetaxGPU(Vendor):
    """HAMi's MetaxDevices (see the module docstring)."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        status = node.get("status")
        capacity = status.get("capacity") if isinstance(status, Mapping) else None
        raw = capacity.get(self.names.count) if isinstance(capacity, Mapping) else None
        count = as_int64(raw)
        if count is None or count == 0:
            return None  # HAMi: "device not found"
        if count > MAX_DEVICES:
            where = f"status.capacity[{self.names.count}]"
            raise WireFormatError(where, "whole value", str(raw), f"is more than {MAX_DEVICES} devices")
        meta = node.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        prefix = name if isinstance(name, str) else ""
        return tuple(
            GPUInfo(
                id=f"{prefix}-metax-{i}",
                index=i,
                count=1,
                devmem=DEVICE_MEMORY,
                devcore=100,
                type=COMMON_WORD,
                numa=0,
                health=True,
            )
            for i in range(count)
        )

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        count = as_int64(resource_value(container, self.names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        return DeviceRequest(count, COMMON_WORD, 0, 100, 100)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """checkType: the request's Type is Metax-GPU (the device's is not read)."""
        return request.type == COMMON_WORD

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """The common Fit (standard.py's steps) plus the same-device rule after the capacity checks."""
        reasons: dict[str, int] = {}
        found: list[GPUSlice] = []
        cores = min(request.coresreq, 100)
        earlier = context.allocated.get(COMMON_WORD)
        placed = {s.uuid for c in earlier.containers for s in c.devices} if earlier is not None else set()
        for device in reversed(devices):
            memreq = request_memory(device, request)
            reason = slot_reason(self, device, request, context) or capacity_reason(device, memreq, cores)
            if reason is None and placed - {device.id}:
                reason = CARD_NOT_FOUND_CUSTOM_FILTER_RULE
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            found.append(GPUSlice(device.id, memreq, cores, self.slice_type(device, request)))
            if len(found) == request.nums:
                return Picked(tuple(found))
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
    ) -> float:
        """2000 minus the topology loss (binpack) or score (spread) for the pod's number of devices."""
        key = {"binpack": TOPOLOGY_LOSSES, "spread": TOPOLOGY_SCORES}.get(policy)
        raw = annotations_of(node).get(key) if key else None
        if raw is None:
            return 0.0
        total = sum(len(c) for c in devices.containers)
        return 2000.0 - (topology_value(raw, total) if isinstance(raw, str) else 0.0)


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `metax` section (MetaxConfig: resourceCountName for Metax-GPU; resourceVCountName,
    resourceVMemoryName, resourceVCoreName and sgpuTopologyAware for Metax-SGPU)."""
    section = config.section("metax")
    gpu = MetaxGPU(names(count=section.text("resourceCountName", "metax-tech.com/gpu")))
    sgpu = metax_sgpu.MetaxSGPU(
        metax_sgpu.names(
            count=section.text("resourceVCountName", "metax-tech.com/sgpu"),
            memory=section.text("resourceVMemoryName", "metax-tech.com/vmemory"),
            cores=section.text("resourceVCoreName", "metax-tech.com/vcore"),
        ),
        topology_aware=section.boolean("sgpuTopologyAware", False),
    )
    section.finish()
    return (gpu, sgpu)


__all__ = [
    "COMMON_WORD",
    "DEVICE_MEMORY",
    "MAX_DEVICES",
    "TOPOLOGY_LOSSES",
    "TOPOLOGY_SCORES",
    "MetaxGPU",
    "build",
    "names",
    "topology_value",
]
