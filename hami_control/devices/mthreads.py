"""Moore Threads sGPU (HAMi pkg/device/mthreads/device.go, v2.10.0): a GPU split in 16 cores and 96 units
of 512 MiB, every container of a pod on one device.

- Inventory: none registered; the node's capacity is read instead. `mthreads.com/sgpu-core` (16 per GPU)
  gives one device per 16 cores, `<node>-mthreads-<i>`, Count 100, Devcore 16, Devmem
  `sgpu-memory x 512 x 16 / sgpu-core` MiB, Type "Mthreads". A node without the core capacity (or 0) has
  none (as when it is not a whole number). Health: always (true, true); no handshake, no node lock.
- Webhook (limits, else requests, of `mthreads.com/vgpu`): a count <= 0 is refused
  (`mthreads.com/vgpu must be greater than 0`); a count n > 1 sets the limits `sgpu-core = 16 n` and
  `sgpu-memory = 96 n` and the pod annotation `mthreads.com/request-gpu-num: "<n>"`; a count of 1 without
  a memory limit gets 16 cores and 96 units; with one, the memory must be one of 2, 4, 8, 16, 32, 64, 96
  (else HAMi's `sGPU memory request value is invalid, ...`, with found = true).
- Request: count in 1..int32 (Go's AsInt64, limits then requests); memory x 512, which must stay in int32
  (else no request); `Memreq = memory x 512 / n`, `Coresreq = cores / n` (Go's int32 division); no memory
  asks 100 % of a device.
- Fit: the common Fit with the type rule of this backend (the device's Type contains the request's, case
  sensitive, and the request's Type is "Mthreads"), the UUID rule of `mthreads.ai/use-gpuuuid` /
  `nouse-gpuuuid`, then HAMi's customFilterRule: a device is refused (`CardNotFoundCustomFilterRule`)
  when a container of the pod placed before holds another device of this Type.
- Pod annotations (only when a container got devices): `hami.io/mthreads-vgpu-devices-allocated` (HAMi
  registers `hami.io/mthreads-vgpu-devices-to-allocate` too but never writes it),
  `mthreads.com/gpu-index` (the device indexes of the last container with devices, "i,j"),
  `mthreads.com/predicate-time` (Unix ns) and `mthreads.com/predicate-node` (the node, HAMi's copy of
  `hami.io/vgpu-node`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hami_api.annotations import encode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.quantity import canonical_quantity, quantity_value
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
    resource_value,
)
from hami_control.devices.config import DeviceConfig
from hami_control.devices.standard import CARD_NOT_FOUND_CUSTOM_FILTER_RULE, capacity_reason, standard_fit
from hami_control.usage import GPUUsage

COMMON_WORD = "Mthreads"
CORES_PER_GPU = 16
MEMORY_PER_GPU = 96
MEMORY_FACTOR = 512
"""One `sgpu-memory` unit is 512 MiB."""
LEGAL_MEMORY = (2, 4, 8, 16, 32, 64, 96)
MEMORY_ERROR = "sGPU memory request value is invalid, valid values are [2, 4, 8, 16, 32, 64, 96]"
REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"
GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_TIME = "mthreads.com/predicate-time"
PREDICATE_NODE = "mthreads.com/predicate-node"
ALLOCATED = "hami.io/mthreads-vgpu-devices-allocated"
DEVICE_COUNT = 100
"""Count of every device: how many containers may share it."""
MAX_NODE_DEVICES = 1024
"""A capacity giving more devices than this is refused (HAMi would build them all)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def names(
    count: str = "mthreads.com/vgpu",
    memory: str = "mthreads.com/sgpu-memory",
    cores: str = "mthreads.com/sgpu-core",
) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="mthreads",
        count=count,
        memory=memory,
        cores=cores,
        memory_factor=MEMORY_FACTOR,
        allocated=ALLOCATED,
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,
        lock=LockKind.NONE,
        use_uuid="mthreads.ai/use-gpuuuid",
        nouse_uuid="mthreads.ai/nouse-gpuuuid",
    )


def go_int32(value: int) -> int:
    """Go's `int32(n)` of an int64: the low 32 bits, two's complement."""
    return (value + 2**31) % 2**32 - 2**31


def unix_nanos(now: datetime) -> int:
    """Go's `time.Now().UnixNano()` of `now` (a naive value is taken as UTC)."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    delta = now - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def quantity(raw: Any) -> int | None:
    """Go's `Quantity.Value()` (rounded up); None for a value that is not a quantity."""
    try:
        return quantity_value(raw)
    except ValueError:
        return None


def capacity(node: Mapping[str, Any], resource: str) -> Any | None:
    """The raw `status.capacity[resource]` (None when absent)."""
    status = node.get("status")
    values = status.get("capacity") if isinstance(status, Mapping) else None
    return values.get(resource) if isinstance(values, Mapping) else None


def node_name(node: Mapping[str, Any]) -> str:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def section_of(container: MutableMapping[str, Any], key: str) -> MutableMapping[str, Any]:
    """`resources.<key>` of the container, created when missing (Go's `if Limits == nil { make }`)."""
    resources = container.get("resources")
    if not isinstance(resources, MutableMapping):
        resources = container["resources"] = {}
    values = resources.get(key)
    if not isinstance(values, MutableMapping):
        values = resources[key] = {}
    return values


def pod_annotations_of(pod: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """metadata.annotations of the pod, created when missing."""
    meta = pod.get("metadata")
    if not isinstance(meta, MutableMapping):
        meta = pod["metadata"] = {}
    annotations = meta.get("annotations")
    if not isinstance(annotations, MutableMapping):
        annotations = meta["annotations"] = {}
    return annotations


def slice_index(piece: GPUSlice, record: Mapping[str, Any] | None) -> int:
    """The device index Fit recorded, else the `<i>` its id ends with (`<node>-mthreads-<i>`), else 0
    (Go's ContainerDevice.Idx of a device without one)."""
    value = record.get("index") if record else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    tail = piece.uuid.rpartition("-")[2]
    return int(tail) if tail.isascii() and tail.isdigit() else 0


class Mthreads(Vendor):
    """HAMi's MthreadsDevices (see the module docstring)."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """GetNodeDevices from the node's capacity: None when `sgpu-core` is absent, 0 or not a whole
        number (HAMi's "device not found"); a memory capacity that is not whole counts as 0, as in HAMi.
        Raises `WireFormatError` for a capacity it cannot synthesise."""
        names = self.names
        cores = as_int64(capacity(node, names.cores))
        if not cores:
            return None
        if cores < 0:
            return ()  # Go's loop `i*16 < cores` never runs
        where = f"status.capacity[{names.cores}]"
        count = -(-cores // CORES_PER_GPU)
        if count > MAX_NODE_DEVICES:
            reason = f"is more than {MAX_NODE_DEVICES} devices"
            raise WireFormatError(where, "whole value", str(cores), reason)
        memory = as_int64(capacity(node, names.memory)) or 0
        devmem = memory * MEMORY_FACTOR * CORES_PER_GPU // cores if memory >= 0 else -1
        if not 0 <= devmem <= INT32_MAX:
            where = f"status.capacity[{names.memory}]"
            reason = f"gives a device memory outside 0..{INT32_MAX} MiB for {cores} cores"
            raise WireFormatError(where, "whole value", str(memory), reason)
        name = node_name(node)
        return tuple(
            GPUInfo(
                id=f"{name}-mthreads-{i}",
                index=i,
                count=DEVICE_COUNT,
                devmem=devmem,
                devcore=CORES_PER_GPU,
                type=COMMON_WORD,
                numa=0,
                health=True,
            )
            for i in range(count)
        )

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        names = self.names
        raw = resource_value(container, names.count)
        if raw is None:
            return Admission(False)
        count = quantity(raw)
        if count is None or count <= 0:
            return Admission(False, f"{names.count} must be greater than 0")
        if count > 1:
            limits = section_of(container, "limits")
            limits[names.cores] = canonical_quantity(count * CORES_PER_GPU)
            limits[names.memory] = canonical_quantity(count * MEMORY_PER_GPU)
            pod_annotations_of(pod)[REQUEST_GPU_NUM] = str(count)
            return Admission(True)
        memory = resource_value(container, names.memory, limits_only=True)
        if memory is None:
            limits = section_of(container, "limits")
            limits[names.cores] = canonical_quantity(CORES_PER_GPU)
            limits[names.memory] = canonical_quantity(MEMORY_PER_GPU)
        elif (as_int64(memory) or 0) not in LEGAL_MEMORY:
            return Admission(True, MEMORY_ERROR)
        return Admission(True)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        """GenerateResourceRequests (see the module docstring). A cores value that is not a whole
        number counts as 0 (HAMi ignores it); one that Go's int32 turns negative is no request."""
        names = self.names
        count = as_int64(resource_value(container, names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        memory = 0
        raw_memory = resource_value(container, names.memory)
        if raw_memory is not None:
            units = as_int64(raw_memory)
            if units is None or not 0 <= units <= INT32_MAX // MEMORY_FACTOR:
                return None
            memory = units * MEMORY_FACTOR
        cores = 0
        raw_cores = resource_value(container, names.cores)
        if raw_cores is not None:
            cores = go_int32(as_int64(raw_cores) or 0)
            if cores < 0:
                return None
        return DeviceRequest(count, COMMON_WORD, memory // count, 100 if memory == 0 else 0, cores // count)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """`strings.Contains(dev.Type, k.Type)` (case sensitive), then checkType: the request's Type is
        exactly "Mthreads"."""
        return request.type in device.info.type and request.type == COMMON_WORD

    def extra_reason(
        self, device: GPUUsage, request: DeviceRequest, memreq: int, context: FitContext
    ) -> str | None:
        """customFilterRule, which HAMi checks after memory and cores: when one of those fails, pass here
        and let the common Fit count that reason."""
        if capacity_reason(device, memreq, min(request.coresreq, 100)) is not None:
            return None
        placed = context.allocated.get(device.info.type)
        if placed is not None and any(s.uuid != device.id for c in placed.containers for s in c.devices):
            return CARD_NOT_FOUND_CUSTOM_FILTER_RULE
        return None

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """The common Fit; each chosen device's index is recorded for `mthreads.com/gpu-index`."""
        outcome = standard_fit(self, devices, request, context)
        if isinstance(outcome, Unfit):
            return outcome
        index = {d.id: d.info.index for d in devices}
        return Picked(outcome.slices, tuple({"index": index[s.uuid]} for s in outcome.slices))

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        """PatchAnnotations (see the module docstring)."""
        if not any(len(c) for c in devices.containers):
            return {}
        out = {ALLOCATED: encode_pod_allocation(devices)}
        for ctr_index, allocation in enumerate(devices.containers):
            if not len(allocation):
                continue
            records = custom[ctr_index] if ctr_index < len(custom) else ()
            indexes = [
                str(slice_index(piece, records[n] if n < len(records) else None))
                for n, piece in enumerate(allocation.devices)
            ]
            out[GPU_INDEX] = ",".join(indexes)
            out[PREDICATE_TIME] = str(unix_nanos(now))
            out[PREDICATE_NODE] = node
        return out


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `mthreads` section (MthreadsConfig: resourceCountName, resourceMemoryName,
    resourceCoreName)."""
    section = config.section("mthreads")
    vendor = Mthreads(
        names(
            count=section.text("resourceCountName", "mthreads.com/vgpu"),
            memory=section.text("resourceMemoryName", "mthreads.com/sgpu-memory"),
            cores=section.text("resourceCoreName", "mthreads.com/sgpu-core"),
        )
    )
    section.finish()
    return (vendor,)


__all__ = [
    "ALLOCATED",
    "COMMON_WORD",
    "CORES_PER_GPU",
    "GPU_INDEX",
    "LEGAL_MEMORY",
    "MAX_NODE_DEVICES",
    "MEMORY_ERROR",
    "MEMORY_FACTOR",
    "MEMORY_PER_GPU",
    "PREDICATE_NODE",
    "PREDICATE_TIME",
    "REQUEST_GPU_NUM",
    "Mthreads",
    "build",
    "capacity",
    "go_int32",
    "names",
    "node_name",
    "pod_annotations_of",
    "quantity",
    "section_of",
    "slice_index",
    "unix_nanos",
]
