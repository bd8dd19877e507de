"""AWS Neuron (HAMi pkg/device/awsneuron/device.go, v2.10.0): whole Inferentia/Trainium devices or
NeuronCores on them, with the cores of a device tracked as a bit mask.

- Inventory: no annotation; synthesised from `status.capacity` `aws.amazon.com/neuron` (devices) and
  `aws.amazon.com/neuroncore` (cores) and the label `node.kubernetes.io/instance-type`: device `i` is
  `<node>-AWSNeuron-<i>`, Index `i`, Count = cores per device, Devcore = a mask of that many bits
  (2 cores: 3), Devmem 0, Type `AWSNeuron`, healthy, custominfo `{"AWSNodeType": <instance type>}`.
  Health is always (true, true); no handshake, no node lock, NodeCleanUp does nothing.
- Webhook (MutateAdmission): the count resource (limits, else requests) must be an integer in
  1..2147483647; without it the core resource must be an integer in 1..4294967294 that is at most one
  device's addressable cores (2) or a multiple of them. The texts are HAMi's (`<res> must be an integer`,
  `<res> must be greater than 0`, `<res> must not exceed <max>`, `<res> must be 1 or a multiple of 2,
  got <n>`, `<res> needs <n> devices, which exceeds the maximum of 2147483647`).
- Request: a device count asks `nums` whole devices; a core count `c` asks one device with `c` cores
  when `c <= 2`, else `c / 2` devices of 2 cores.
- Fit: more than one device -> HAMi's graphSelect: on an instance type containing `inf`/`Inf` the first
  run of `nums` idle healthy devices, elsewhere only runs of 1, 4, 8 or 16 aligned on their size, else
  `NumaNotFit`; each chosen device is taken whole (its Devcore mask as cores). One device -> health,
  type, UUID (`aws.amazon.com/use-neuron-uuid` / `nouse-neuron-uuid`), slot, mutex, then the free core
  bits (`CardInsufficientCore`); the device gets a 2-bit mask (1 core: 1, or 2 when core 0 is taken;
  2 cores: 3).
- Pod annotations: only `hami.io/aws-neuron-devices-allocated` (no to-allocate annotation), and for a
  container with devices: `AWS_NEURON_IDS` (device indexes for a container whose limits name the count
  resource, else the core indexes `coresPerDevice*idx` / `+1` from the mask, with `NEURON_RESOURCE_TYPE:
  <core resource>`), `NEURON_ALLOC_TIME` (Unix ns), `NEURON_ALLOCATED: "false"`,
  `aws.amazon.com/predicate-node: <node>`. The IDs accumulate over the pod's containers, as HAMi's do.

Cores per device, pure. HAMi keeps it in a field of the backend set from the first node it registers
(`coresPerAWSNeuron`, "sticky": 0 until then) and uses it for every node's Count/Devcore, for a device
count's Coresreq and for the core indexes; the core split uses it capped at 2 (2 when unknown). Here
nothing is remembered between calls:
- each node's devices get that node's own `neuroncore / neuron` (HAMi's value on any cluster whose
  nodes agree, and the right one per node on a mixed cluster);
- a device-count request carries `coresreq = 0` (`WHOLE_DEVICE`): Fit asks the chosen device's own
  cores per device (its Count), which is what HAMi's Coresreq is once a node is registered;
- the core split always uses 2 (`ADDRESSABLE_CORES`), HAMi's cap and its fallback, which is also
  `min(coresPer, 2)` for every Neuron device AWS sells (2, 4 or 8 cores per device);
- Fit records the device's index and cores per device in `Picked.custom` (`index`,
  `coresPerDevice`, and HAMi's `awsusageinfo` mask), which `pod_annotations` reads back.
HAMi's per-device `awsusageinfo` is the same number as the device's `Usedcores` wherever it matters
(Fit seeds it from Usedcores and AddResourceUsage adds the same mask to both), so `add_usage` is the
common one and Fit reads `usedcores`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hami_api.annotations import encode_pod_allocation
from hami_api.errors import WireFormatError
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
    custom_info,
    custom_text,
    labels_of,
)
from hami_control.devices.config import DeviceConfig
from hami_control.devices.standard import CARD_INSUFFICIENT_CORE, NUMA_NOT_FIT, slot_reason
from hami_control.usage import GPUUsage

COMMON_WORD = "AWSNeuron"
DEVICE_TYPE = "AWSNeuron"
ALLOCATED = "hami.io/aws-neuron-devices-allocated"
USE_UUID = "aws.amazon.com/use-neuron-uuid"
NOUSE_UUID = "aws.amazon.com/nouse-neuron-uuid"
ASSIGNED_INDEX = "AWS_NEURON_IDS"
ASSIGNED_NODE = "aws.amazon.com/predicate-node"
PREDICATE_TIME = "NEURON_ALLOC_TIME"
RESOURCE_TYPE = "NEURON_RESOURCE_TYPE"
ALLOCATED_FLAG = "NEURON_ALLOCATED"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODE_TYPE_KEY = "AWSNodeType"
"""custominfo key of the node's instance type (HAMi's AWSNodeType)."""
USAGE_KEY = "awsusageinfo"
"""HAMi's per-device core mask in custominfo (AWSUsageInfo)."""

MAX_DEVICE_COUNT = INT32_MAX
ADDRESSABLE_CORES = 2
"""HAMi's maxCoresPerNeuronDevice: the core mask has two bits and the IDs name two cores per device."""
MAX_CORE_COUNT = MAX_DEVICE_COUNT * ADDRESSABLE_CORES
WHOLE_DEVICE = 0
"""`DeviceRequest.coresreq` of a device-count request: all the chosen device's cores (see above)."""
MAX_NODE_DEVICES = 1024
"""Ours: a capacity above this many devices is refused rather than synthesised (the largest instance
has 16)."""
MAX_MASK_BITS = 31
"""Devcore is an int32 mask: more cores per device than this cannot be written (ours; HAMi wraps)."""
_GRAPH_SIZES = (1, 4, 8, 16)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def names(count: str = "aws.amazon.com/neuron", cores: str = "aws.amazon.com/neuroncore") -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="awsneuron",
        count=count,
        cores=cores,
        allocated=ALLOCATED,
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,
        lock=LockKind.NONE,
        use_uuid=USE_UUID,
        nouse_uuid=NOUSE_UUID,
    )


# --- small pure pieces (HAMi's helpers) -----------------------------------------------------------------


def count_mask_available(mask: int) -> int:
    """HAMi's countMaskAvailable: the set bits of a positive mask, 0 for zero or less."""
    return mask.bit_count() if mask > 0 else 0


def core_mask(cores: int) -> int:
    """A mask of `cores` low bits (HAMi's coremask: 2 -> 3)."""
    return (1 << cores) - 1 if cores > 0 else 0


def add_core_usage(used_mask: int, require: int) -> int:
    """HAMi's addCoreUsage: the mask a container gets on a device whose cores `used_mask` are taken
    (idle: 2 cores -> 3, 1 core -> 1, anything else -> 3; in use: the other bits, 3 - used)."""
    if used_mask == 0:
        if require == 2:
            return 3
        if require == 1:
            return 1
    return 3 - used_mask


def validate_quantity(raw: Any, resource: str, maximum: int) -> tuple[int, str]:
    """HAMi's validateResourceRequest: (value, "") or (0, HAMi's error text)."""
    value = as_int64(raw)
    if value is None:
        return 0, f"{resource} must be an integer"
    if value <= 0:
        return 0, f"{resource} must be greater than 0"
    if value > maximum:
        return 0, f"{resource} must not exceed {maximum}"
    return value, ""


def split_core_request(
    cores: int, resource: str, cores_per_device: int = ADDRESSABLE_CORES
) -> tuple[int, int, str]:
    """HAMi's splitCoreRequest: (devices, cores per device, "") or (0, 0, HAMi's error text).
    `cores_per_device` is HAMi's coresPerDevice() (its observed value capped at 2; 2 when unknown)."""
    per = min(cores_per_device, ADDRESSABLE_CORES) if cores_per_device > 0 else ADDRESSABLE_CORES
    if cores <= per:
        return 1, cores, ""
    if cores % per:
        return 0, 0, f"{resource} must be 1 or a multiple of {per}, got {cores}"
    nums = cores // per
    if nums > MAX_DEVICE_COUNT:
        return 0, 0, f"{resource} needs {nums} devices, which exceeds the maximum of {MAX_DEVICE_COUNT}"
    return nums, per, ""


def _limits_or_requests(container: Mapping[str, Any], resource: str) -> tuple[Any, bool]:
    """HAMi's resourceQuantity: the value in limits, else in requests, and whether it is there."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return None, False
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, Mapping) and resource in values:
            return values[resource], True
    return None, False


def _capacity(node: Mapping[str, Any], resource: str) -> int | None:
    """`status.capacity[resource]` as Go's `Quantity.AsInt64()` (0 when absent, None when not whole)."""
    status = node.get("status")
    capacity = status.get("capacity") if isinstance(status, Mapping) else None
    if not isinstance(capacity, Mapping) or resource not in capacity:
        return 0
    return as_int64(capacity[resource])


def _continuous(devices: Sequence[GPUUsage], start: int, count: int) -> list[int]:
    """HAMi's continuousDeviceAvailable: positions start..start+count-1 when all idle and healthy."""
    if len(devices) < start + count:
        return []
    run = range(start, start + count)
    return list(run) if all(devices[i].used == 0 and devices[i].healthy for i in run) else []


def graph_select(devices: Sequence[GPUUsage], count: int) -> list[int]:
    """HAMi's graphSelect over the devices as given: positions in `devices` (HAMi then takes the devices
    whose Index equals them). The instance type is read from the first device's custominfo."""
    if not devices:
        return []
    node_type = custom_info(devices[0].info).get(NODE_TYPE_KEY)
    if node_type is None:
        return []
    text = node_type if isinstance(node_type, str) else ""
    if "inf" in text or "Inf" in text:
        step = 1
    elif count in _GRAPH_SIZES:
        step = count
    else:
        return []
    for start in range(0, len(devices), step):
        run = _continuous(devices, start, count)
        if run:
            return run
    return []


def _ns(now: datetime) -> int:
    """time.Now().UnixNano() of an aware datetime."""
    delta = now - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _container_at(pod: Mapping[str, Any], index: int) -> Mapping[str, Any] | None:
    """HAMi's getContainerByIndex: init containers first, then the regular ones."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    inits = spec.get("initContainers")
    inits = inits if isinstance(inits, list) else []
    if index < len(inits):
        found = inits[index]
    else:
        regular = spec.get("containers")
        regular = regular if isinstance(regular, list) else []
        index -= len(inits)
        if index >= len(regular):
            return None
        found = regular[index]
    return found if isinstance(found, Mapping) else {}


def _count_limit(container: Mapping[str, Any], resource: str) -> tuple[bool, Any]:
    """Whether the container's limits name `resource`, and its value."""
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    if isinstance(limits, Mapping) and resource in limits:
        return True, limits[resource]
    return False, None


def _slice_index(piece: GPUSlice, custom: Mapping[str, Any] | None) -> int | None:
    """The device index Fit recorded, else the `<i>` of `<node>-AWSNeuron-<i>`."""
    value = custom.get("index") if custom else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    _, sep, tail = piece.uuid.rpartition(f"-{DEVICE_TYPE}-")
    return int(tail) if sep and tail.isdigit() else None


def _slice_cores_per_device(custom: Mapping[str, Any] | None) -> int:
    value = custom.get("coresPerDevice") if custom else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return ADDRESSABLE_CORES


class AWSNeuron(Vendor):
    """HAMi's AWSNeuronDevices: capacity inventory, core masks, graphSelect, its own annotations."""

    # --- the node side -------------------------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """HAMi's GetNodeDevices from capacity (None when the count capacity is absent, 0 or not whole:
        HAMi's `device not found`). Raises `WireFormatError` for a capacity it cannot synthesise."""
        names = self.names
        counts = _capacity(node, names.count)
        if not counts:
            return None
        if counts < 0:
            return ()
        where = f"status.capacity[{names.count}]"
        if counts > MAX_NODE_DEVICES:
            raise WireFormatError(
                where,
                "whole value",
                str(counts),
                f"is more than {MAX_NODE_DEVICES} devices",
            )
        cores_total = (_capacity(node, names.cores) or 0) if names.cores else 0
        if cores_total < 0:
            raise WireFormatError(
                f"status.capacity[{names.cores}]", "whole value", str(cores_total), "is negative"
            )
        per_device = cores_total // counts
        if per_device > MAX_MASK_BITS:
            raise WireFormatError(
                f"status.capacity[{names.cores}]",
                "whole value",
                str(cores_total),
                f"gives {per_device} cores per device, more than an int32 core mask holds ({MAX_MASK_BITS})",
            )
        meta = node.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        name = name if isinstance(name, str) else ""
        instance = labels_of(node).get(INSTANCE_TYPE_LABEL)
        custom = custom_text({NODE_TYPE_KEY: instance if isinstance(instance, str) else ""})
        return tuple(
            GPUInfo(
                id=f"{name}-{DEVICE_TYPE}-{i}",
                index=i,
                count=per_device,
                devmem=0,
                devcore=core_mask(per_device),
                type=DEVICE_TYPE,
                numa=0,
                health=True,
                custom=custom,
            )
            for i in range(counts)
        )

    # --- the pod side --------------------------------------------------------------------------------

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        """HAMi's MutateAdmission: validates, mutates nothing."""
        names = self.names
        raw, present = _limits_or_requests(container, names.count)
        if present:
            _, error = validate_quantity(raw, names.count, MAX_DEVICE_COUNT)
            return Admission(not error, error)
        raw, present = _limits_or_requests(container, names.cores) if names.cores else (None, False)
        if not present:
            return Admission(False)
        cores, error = validate_quantity(raw, names.cores, MAX_CORE_COUNT)
        if not error:
            _, _, error = split_core_request(cores, names.cores)
        return Admission(not error, error)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        """HAMi's GenerateResourceRequests: whole devices (`coresreq` = `WHOLE_DEVICE`) or cores split
        over devices; None for anything the webhook would refuse."""
        names = self.names
        raw, present = _limits_or_requests(container, names.count)
        if present:
            count, error = validate_quantity(raw, names.count, MAX_DEVICE_COUNT)
            return None if error else DeviceRequest(count, COMMON_WORD, 0, 0, WHOLE_DEVICE)
        raw, present = _limits_or_requests(container, names.cores) if names.cores else (None, False)
        if not present:
            return None
        cores, error = validate_quantity(raw, names.cores, MAX_CORE_COUNT)
        if error:
            return None
        nums, per_device, error = split_core_request(cores, names.cores)
        return None if error else DeviceRequest(nums, COMMON_WORD, 0, 0, per_device)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """The device's Type contains the request's (case-sensitive) and the request is `AWSNeuron`
        (HAMi's checkType)."""
        return request.type in device.info.type and request.type == DEVICE_TYPE

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        if request.nums > 1:
            return self._fit_many(devices, request)
        reasons: dict[str, int] = {}
        for device in reversed(devices):
            wanted = device.info.count if request.coresreq == WHOLE_DEVICE else request.coresreq
            reason = slot_reason(self, device, request, context)
            free = count_mask_available(device.info.devcore) - count_mask_available(device.usedcores)
            if reason is None and free < wanted:
                reason = CARD_INSUFFICIENT_CORE
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            mask = add_core_usage(device.usedcores, wanted)
            # HAMi would write a negative mask for a device whose masks sum past 3 (it hands out 1, 2
            # and 3 only, so no placement of its own gets there); the pod string cannot carry one.
            piece = GPUSlice(device.id, 0, max(mask, 0), self.slice_type(device, request))
            return Picked((piece,), (self._record(device, mask),))
        return Unfit(reasons, len(devices))

    def _fit_many(self, devices: Sequence[GPUUsage], request: DeviceRequest) -> Picked | Unfit:
        """HAMi's Fit for more than one device: graphSelect, then the devices whose Index is a chosen
        position, each taken whole (its memory and its core mask)."""
        chosen = graph_select(devices, request.nums)
        if not chosen:
            return Unfit({NUMA_NOT_FIT: 1}, len(devices))
        slices: list[GPUSlice] = []
        records: list[Mapping[str, Any]] = []
        for position in chosen:
            device = next((d for d in devices if d.info.index == position), None)
            if device is None:
                continue
            wanted = device.info.count if request.coresreq == WHOLE_DEVICE else request.coresreq
            info = device.info
            slices.append(GPUSlice(device.id, info.devmem, info.devcore, self.slice_type(device, request)))
            records.append(self._record(device, add_core_usage(device.usedcores, wanted)))
        return Picked(tuple(slices), tuple(records))

    @staticmethod
    def _record(device: GPUUsage, mask: int) -> Mapping[str, Any]:
        return {"index": device.info.index, "coresPerDevice": device.info.count, USAGE_KEY: mask}

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        """HAMi's PatchAnnotations (see the module docstring); `custom` as Fit recorded it (without it
        the index comes from the device id and cores per device is taken as 2)."""
        if not any(len(c) for c in devices.containers):
            return {}
        names = self.names
        out = {ALLOCATED: encode_pod_allocation(devices)}
        ids: list[str] = []
        for ctr_index, allocation in enumerate(devices.containers):
            if not len(allocation):
                continue
            container = _container_at(pod, ctr_index)
            if container is None:
                continue
            records = custom[ctr_index] if ctr_index < len(custom) else ()
            by_count, count_raw = _count_limit(container, names.count)
            for n, piece in enumerate(allocation.devices):
                record = records[n] if n < len(records) else None
                index = _slice_index(piece, record)
                if index is None:
                    continue
                if by_count:
                    if (as_int64(count_raw) or 0) > 0:
                        ids.append(str(index))
                    continue
                per_device = _slice_cores_per_device(record)
                if piece.usedcores & 1:
                    ids.append(str(per_device * index))
                    out[RESOURCE_TYPE] = names.cores
                if piece.usedcores & 2:
                    ids.append(str(per_device * index + 1))
                    out[RESOURCE_TYPE] = names.cores
            if ids:
                out[ASSIGNED_INDEX] = ",".join(ids)
                out[PREDICATE_TIME] = str(_ns(now))
                out[ALLOCATED_FLAG] = "false"
                out[ASSIGNED_NODE] = node
        return out


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `awsneuron` section (AWSNeuronConfig: resourceCountName, resourceCoreName)."""
    section = config.section("awsneuron")
    vendor = AWSNeuron(
        names(
            count=section.text("resourceCountName", "aws.amazon.com/neuron"),
            cores=section.text("resourceCoreName", "aws.amazon.com/neuroncore"),
        )
    )
    section.finish()
    return (vendor,)


__all__ = [
    "ADDRESSABLE_CORES",
    "ALLOCATED",
    "ASSIGNED_INDEX",
    "ASSIGNED_NODE",
    "COMMON_WORD",
    "MAX_CORE_COUNT",
    "MAX_DEVICE_COUNT",
    "PREDICATE_TIME",
    "RESOURCE_TYPE",
    "WHOLE_DEVICE",
    "AWSNeuron",
    "add_core_usage",
    "build",
    "core_mask",
    "count_mask_available",
    "graph_select",
    "names",
    "split_core_request",
    "validate_quantity",
]
