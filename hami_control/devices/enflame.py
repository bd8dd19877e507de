"""Enflame GCUs (HAMi pkg/device/enflame/gcu.go, device.go and config.go, v2.10.0): two backends built
from the one `enflame` section, whole GCUs ("GCU") and DRS hard partitions of a GCU ("Enflame").

GCU (HAMi's GCUDevices):
- Inventory from the node's capacity `enflame.com/gcu` (resourceNameGCU): one device per unit,
  `<node>-GCU-<i>`, Count 1, Devmem 100, Devcore 100, Type "GCU"; none without the capacity (or 0, or
  not a whole number). Healthy while the capacity is > 0. No handshake, no node lock, no UUID selection.
- Webhook: found when the limits name the count. Request: the count (limits, else requests; Go's AsInt64
  then `int32(n)`, a value <= 0 is no request), `Memreq 100, pct 100, Coresreq 100`.
- Fit: health, type (the request's Type is exactly "GCU"), then a device with any task is refused
  (`ExclusiveDeviceAllocateConflict`); no slot, memory or core check. Each device gets the request's
  memory and cores (100, 100).
- Pod annotations: `hami.io/enflame-gcu-devices-to-allocate` and `hami.io/enflame-gcu-devices-allocated`.

Enflame DRS (HAMi's EnflameDevices):
- Inventory: the node annotation `enflame.com/gcu-drs-capacity`, JSON
  `{"devices":[{"index":"0","minor":"0","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1"}}`.
  Profiles are named `<slices>g.<memory GB>gb`; maxSlice is the largest slice count, the device memory
  the largest profile memory x 1024 MiB (maxSlice GB when no profile names a memory). One device per
  entry, `<node>-enflame-drs-<index>` (the position when the index is not a number), Count = capacity
  (a JSON number or a numeric string), Devcore 100, Type "Enflame", custominfo `{minor, index, profiles,
  maxSlice}`. Health: always. No handshake, no node lock.
- Webhook: `enflame.com/drs-gcu` (limits, else requests) must be > 0 (`enflame.com/drs-gcu must be
  greater than 0`); else the unified API: `enflame.com/gcu-memory` > 0 (`... must be greater than 0`) and
  `enflame.com/gcu-core` in (0,100] (`enflame.com/gcu-core must be in range (0,100]`). Each value found
  is copied to the side (limits / requests) that lacks it.
- Request: always one device. `drs-gcu N` (a whole number > 0, <= int32): `Memreq N, pct 0` (the
  profile of N slices); otherwise memory / cores (Go's Quantity.Value, <= int32, a negative one read as
  none): `Memreq mem, pct -1, Coresreq core` (the smallest profile that holds them).
- Fit: the profiles of the devices given, each with `corePercent = ceil(slices x 100 / maxSlice)`, in
  (slices, memory) order. Direct (pct 0): the profile of exactly N slices. By spec: the first with
  memory >= the request (a request above twice the largest profile's GB is read as MiB, / 1024 rounded
  up) and cores >= the request. None, or one past int32: `1/<n> ModeNotFit`. Then per device from the
  end: health, type (exactly "Enflame"), UUID (`enflame.com/use-gpuuuid` / `nouse-gpuuuid`), a free
  slot, the mutex policy, memory (profile GB x 1024), cores (when the device has cores). The slice
  records `profileName, profileID, minor, index, drsSlice, requestMem, requestCore` (`Picked.custom`).
- Usage: Used grows by the slice's drsSlice (clamped to int32; 1 when unknown).
- Pod annotations (only when a container got a slice): `hami.io/enflame-vgpu-devices-allocated` (HAMi
  registers no to-allocate key), `enflame.com/gcu-assigned: "false"`, `enflame.com/gcu-assigned-time`
  (Unix ns), `enflame.com/gcu-assigned-index` = `enflame.com/gcu-assigned-id` (the first slice's
  index), `enflame.com/gcu-assigned-minor`, `enflame.com/gcu-request-size` (its drsSlice) and
  `assigned-containers`, Go's JSON of `{"<container>":{"allocated":false,"request":<drsSlice>,
  "profileID":..,"profileName":..}}` (one entry per container with a slice, its first one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from hami_api._wire import (
    JSONFloat,
    Where,
    go_json_string,
    json_list,
    json_object,
    json_pairs,
    json_str,
    json_text,
    load_json,
)
from hami_api.annotations import encode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.quantity import canonical_quantity
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
    annotations_of,
    as_int64,
    custom_info,
    custom_text,
    resource_value,
)
from hami_control.devices.config import DeviceConfig, Section
from hami_control.devices.mthreads import capacity, go_int32, node_name, quantity, section_of, unix_nanos
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_NOT_HEALTH,
    CARD_TYPE_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    MODE_NOT_FIT,
    slot_reason,
)
from hami_control.usage import GPUUsage

INT32_MIN = -(2**31)
INT64 = (-(2**63), 2**63 - 1)

GCU_WORD = "GCU"
DRS_WORD = "Enflame"
DEFAULT_GCU = "enflame.com/gcu"
DEFAULT_DRS = "enflame.com/drs-gcu"
DEFAULT_MEMORY = "enflame.com/gcu-memory"
DEFAULT_CORES = "enflame.com/gcu-core"
GCU_TO_ALLOCATE = "hami.io/enflame-gcu-devices-to-allocate"
GCU_ALLOCATED = "hami.io/enflame-gcu-devices-allocated"
DRS_ALLOCATED = "hami.io/enflame-vgpu-devices-allocated"
GCU_DRS_CAPACITY = "enflame.com/gcu-drs-capacity"
REQUEST_SIZE = "enflame.com/gcu-request-size"
ASSIGNED_ID = "enflame.com/gcu-assigned-id"
ASSIGNED = "enflame.com/gcu-assigned"
ASSIGNED_INDEX = "enflame.com/gcu-assigned-index"
ASSIGNED_MINOR = "enflame.com/gcu-assigned-minor"
ASSIGNED_TIME = "enflame.com/gcu-assigned-time"
ASSIGNED_CONTAINERS = "assigned-containers"
MODE_DIRECT = 0
"""DeviceRequest.mem_percentage of a `drs-gcu N` request: Memreq is the profile's slice count."""
MODE_BY_SPEC = -1
"""DeviceRequest.mem_percentage of a memory / cores request."""
GCU_DEVMEM = 100
GCU_DEVCORE = 100
DRS_DEVCORE = 100
MAX_NODE_DEVICES = 1024
"""A capacity giving more GCUs than this is refused (HAMi would build them all)."""


def gcu_names(count: str = DEFAULT_GCU) -> VendorNames:
    return VendorNames(
        common_word=GCU_WORD,
        family="enflame",
        count=count,
        to_allocate=GCU_TO_ALLOCATE,
        allocated=GCU_ALLOCATED,
        inventory=Inventory.CUSTOM,
        health=HealthRule.CAPACITY,
        lock=LockKind.NONE,
    )


def drs_names(
    count: str = DEFAULT_DRS, memory: str = DEFAULT_MEMORY, cores: str = DEFAULT_CORES
) -> VendorNames:
    return VendorNames(
        common_word=DRS_WORD,
        family="enflame",
        count=count,
        memory=memory,
        cores=cores,
        allocated=DRS_ALLOCATED,
        register=GCU_DRS_CAPACITY,
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,
        lock=LockKind.NONE,
        use_uuid="enflame.com/use-gpuuuid",
        nouse_uuid="enflame.com/nouse-gpuuuid",
    )


# --- Go's conversions ------------------------------------------------------------------------------------


def go_atoi(text: str) -> int | None:
    """Go's strconv.Atoi (64-bit): optional sign, ASCII digits, in int64; None when it fails."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit() or len(body.lstrip("0")) > 19:
        return None
    value = int(text)
    return value if INT64[0] <= value <= INT64[1] else None


def clamp_int32(value: int) -> int:
    """HAMi's clampToInt32."""
    return min(max(value, INT32_MIN), INT32_MAX)


def custom_int(custom: Mapping[str, Any], key: str) -> int:
    """HAMi's readCustomInfoInt: an integer as is, a float64 when finite and within int32 (truncated), a
    numeric string (Atoi); 0 for anything else or a missing key."""
    value = custom.get(key)
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value) or not INT32_MIN <= value <= INT32_MAX:
            return 0
        return int(value)
    if isinstance(value, str):
        return go_atoi(value.strip()) or 0
    return 0


def custom_str(custom: Mapping[str, Any], key: str) -> str:
    """HAMi's readCustomInfoString: a string as is, a number in decimal (a float64 through int64), ""
    for a missing key, anything else as Go's %v writes it."""
    if key not in custom:
        return ""
    value = custom[key]
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not INT64[0] <= value < 2**63:
            return str(INT64[0])  # Go's int64() of such a float on amd64
        return str(int(value))
    if value is None:
        return "<nil>"
    return str(value)


# --- DRS profiles ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Profile:
    """HAMi's drsProfileCandidate: a DRS profile, and the request it was chosen for (by spec)."""

    name: str
    id: str
    size: int
    memory_gb: int
    core_percent: int
    request_memory_gb: int = 0
    request_core_percent: int = 0


def parse_profile(name: str) -> tuple[int, int]:
    """HAMi's parseProfile: `<slices>g.<memory>gb` -> (slices, memory GB); (0, 0) when the slice count
    does not read, (slices, 0) when the memory does not."""
    parts = name.strip().lower().split(".")
    if len(parts) < 2:
        return 0, 0
    size = go_atoi(parts[0].strip().removesuffix("g"))
    if size is None:
        return 0, 0
    memory = go_atoi(parts[1].strip().removesuffix("gb"))
    return size, memory if memory is not None else 0


def profiles_of(custom: Mapping[str, Any]) -> dict[str, str]:
    """HAMi's parseProfilesFromCustomInfo: the `profiles` map, entries whose id is not a string left out."""
    raw = custom.get("profiles")
    if not isinstance(raw, Mapping):
        return {}
    return {str(name): pid for name, pid in raw.items() if isinstance(pid, str)}


def core_percent(size: int, max_slice: int) -> int:
    """ceil(slices x 100 / maxSlice), in float64 as HAMi computes it."""
    return math.ceil(float(size) * 100 / float(max_slice))


def collect_profiles(devices: Sequence[GPUUsage]) -> list[Profile]:
    """HAMi's collectDRSProfiles: every valid profile of the devices (a later device's id wins), ordered
    by slices then memory (then name: Go's sort.Slice leaves such ties unordered). maxSlice is the
    largest custominfo `maxSlice`, else the largest profile's slices; none: no profile."""
    customs = [custom_info(d.info) for d in devices]
    max_slice = max((custom_int(c, "maxSlice") for c in customs), default=0)
    if max_slice <= 0:
        sizes = (parse_profile(name)[0] for c in customs for name in profiles_of(c))
        max_slice = max(sizes, default=0)
    if max_slice <= 0:
        return []
    seen: dict[str, Profile] = {}
    for custom in customs:
        for name, pid in profiles_of(custom).items():
            size, memory = parse_profile(name)
            if size > 0 and memory > 0:
                seen[name] = Profile(name, pid, size, memory, core_percent(size, max_slice))
    return sorted(seen.values(), key=lambda p: (p.size, p.memory_gb, p.name))


def normalize_memory(raw: int, max_memory_gb: int) -> int:
    """HAMi's normalizeMemoryRequestToGB: GB, or MiB (-> GB rounded up) above twice the largest profile."""
    if raw <= 0:
        return 0
    if max_memory_gb <= 0:
        return raw
    if raw > max_memory_gb * 2:
        return -(-raw // 1024)
    return raw


def select_profile(devices: Sequence[GPUUsage], request: DeviceRequest) -> Profile | None:
    """HAMi's selectProfileByRequest (see the module docstring)."""
    candidates = collect_profiles(devices)
    if not candidates:
        return None
    if request.mem_percentage == MODE_DIRECT:
        return next((c for c in candidates if c.size == request.memreq), None)
    memory = normalize_memory(request.memreq, candidates[-1].memory_gb)
    cores = request.coresreq
    for candidate in candidates:
        if memory > 0 and candidate.memory_gb < memory:
            continue
        if cores > 0 and candidate.core_percent < cores:
            continue
        return replace(candidate, request_memory_gb=memory, request_core_percent=cores)
    return None


def slice_size(device: GPUUsage, piece: GPUSlice) -> int:
    """The drsSlice of a slice Fit made on `device`: the slices of the device's profile whose memory and
    cores it holds (clamped to int32); 1 when none matches (HAMi's default when drsSlice is unknown)."""
    for profile in collect_profiles([device]):
        if profile.memory_gb * 1024 == piece.usedmem and profile.core_percent == piece.usedcores:
            size = clamp_int32(profile.size)
            return size if size > 0 else 1
    return 1


# --- the DRS inventory -----------------------------------------------------------------------------------


def drs_capacity(value: Any) -> int | None:
    """HAMi's parseDRSCapacity: a JSON number (float64: finite, within int32, truncated) or a numeric
    string (Atoi, clamped to int32); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, JSONFloat):
        number = float(value)
        if math.isnan(number) or not INT32_MIN <= number <= INT32_MAX:
            return None
        return int(number)
    if isinstance(value, int):
        return value if INT32_MIN <= value <= INT32_MAX else None
    if isinstance(value, str):
        parsed = go_atoi(value.strip())
        return None if parsed is None else clamp_int32(parsed)
    return None


def decode_drs_capacity(text: str, node: str) -> tuple[GPUInfo, ...]:
    """GetNodeDevices of the DRS backend from the `enflame.com/gcu-drs-capacity` text. Raises
    `WireFormatError` where HAMi's returns an error (JSON that does not decode into its spec, no valid
    profile, a capacity that is not > 0, no device), and for a negative or repeated index."""
    where = Where(GCU_DRS_CAPACITY)
    spec = load_json(where, text)
    members = {} if spec is None else json_object(where, "", spec, ("devices", "profiles"))
    profiles: dict[str, str] = {}
    if "profiles" in members:
        for name, pid in json_pairs(where, "profiles", members["profiles"]):
            profiles[name] = "" if pid is None else json_str(where.at(f"profile {name!r}"), "id", pid)
    entries = json_list(where, "devices", members["devices"]) if "devices" in members else []
    max_slice = max((parse_profile(name)[0] for name in profiles), default=0)
    max_memory = max((parse_profile(name)[1] for name in profiles), default=0)
    if max_slice <= 0:
        where.fail(json_text(members.get("profiles")), f"has no valid DRS profile on node {node}", "profiles")
    if max_memory <= 0:
        max_memory = max_slice
    devmem = max_memory * 1024
    if devmem > INT32_MAX:
        where.fail(
            str(max_memory), f"GB is more device memory than int32 MiB holds (node {node})", "profiles"
        )
    devices: list[GPUInfo] = []
    for position, entry in enumerate(entries):
        at = where.at(f"device {position}")
        fields = {} if entry is None else json_object(at, "", entry, ("index", "minor", "capacity"))
        index_text = json_str(at, "index", fields["index"]) if "index" in fields else ""
        minor = json_str(at, "minor", fields["minor"]).strip() if "minor" in fields else ""
        index = go_atoi(index_text)
        if index is None:
            index = position
        if index < 0:
            at.fail(index_text, "is negative", "index")
        count = drs_capacity(fields.get("capacity"))
        if count is None or count <= 0:
            at.fail(json_text(fields.get("capacity")), f"is not a DRS capacity > 0 (node {node})", "capacity")
        custom = {
            "index": str(index),
            "maxSlice": max_slice,
            "minor": minor or str(index),
            "profiles": profiles,
        }
        device_id = f"{node}-enflame-drs-{index}"
        if any(d.id == device_id for d in devices):
            at.fail(index_text, "names a device listed before", "index")
        devices.append(
            GPUInfo(
                id=device_id,
                index=index,
                count=count,
                devmem=devmem,
                devcore=DRS_DEVCORE,
                type=DRS_WORD,
                numa=0,
                health=True,
                custom=custom_text({**custom, "profiles": profiles}),
            )
        )
    if not devices:
        where.fail(json_text(members.get("devices")), f"lists no DRS device on node {node}", "devices")
    return tuple(devices)


# --- helpers of the pod side -----------------------------------------------------------------------------


def container_name(pod: Mapping[str, Any], index: int) -> str:
    """HAMi's containerNameByIndex: init containers first, then the regular ones, else `container-<i>`."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    inits = spec.get("initContainers")
    inits = inits if isinstance(inits, list) else []
    regular = spec.get("containers")
    regular = regular if isinstance(regular, list) else []
    if index < len(inits):
        found = inits[index]
    elif 0 <= index - len(inits) < len(regular):
        found = regular[index - len(inits)]
    else:
        return f"container-{index}"
    name = found.get("name") if isinstance(found, Mapping) else None
    return name if isinstance(name, str) else ""


def spec_value(container: Mapping[str, Any], resource: str) -> tuple[bool, int | None]:
    """HAMi's getContainerResourceRequest: whether limits (else requests) name `resource`, and its
    `Quantity.Value()` (None when it is not a quantity)."""
    raw = resource_value(container, resource) if resource else None
    if raw is None:
        return False, None
    return True, quantity(raw)


def copy_to_both(container: MutableMapping[str, Any], resource: str) -> None:
    """Write the value limits (else requests) has for `resource` to the side that lacks it."""
    raw = resource_value(container, resource)
    value = canonical_quantity(raw) if raw is not None else "0"
    for key in ("limits", "requests"):
        resources = container.get("resources")
        values = resources.get(key) if isinstance(resources, Mapping) else None
        if not isinstance(values, Mapping) or resource not in values:
            section_of(container, key)[resource] = value


def assigned_json(assigned: Mapping[str, Mapping[str, Any]]) -> str:
    """Go's json.Marshal of map[string]assignedContainerInfo: keys sorted, fields in struct order,
    profileID / profileName left out when empty."""
    parts = []
    for name in sorted(assigned):
        info = assigned[name]
        fields = [f'"allocated":{"true" if info["allocated"] else "false"}', f'"request":{info["request"]}']
        for key in ("profileID", "profileName"):
            if info.get(key):
                fields.append(f'"{key}":{go_json_string(info[key])}')
        parts.append(f"{go_json_string(name)}:{{{','.join(fields)}}}")
    return "{" + ",".join(parts) + "}"


# --- the backends ----------------------------------------------------------------------------------------


class Gcu(Vendor):
    """HAMi's GCUDevices: whole GCUs from the node's capacity, one task per GCU."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """GetNodeDevices: None when the count capacity is absent, 0 or not a whole number (HAMi's
        "device not found")."""
        count = as_int64(capacity(node, self.names.count))
        if not count:
            return None
        if count > MAX_NODE_DEVICES:
            where = f"status.capacity[{self.names.count}]"
            raise WireFormatError(
                where, "whole value", str(count), f"is more than {MAX_NODE_DEVICES} devices"
            )
        name = node_name(node)
        return tuple(
            GPUInfo(
                id=f"{name}-{GCU_WORD}-{i}",
                index=i,
                count=1,
                devmem=GCU_DEVMEM,
                devcore=GCU_DEVCORE,
                type=GCU_WORD,
                numa=0,
                health=True,
            )
            for i in range(max(count, 0))
        )

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        count = as_int64(resource_value(container, self.names.count))
        if count is None:
            return None
        nums = go_int32(count)
        if nums <= 0:
            return None
        return DeviceRequest(nums, GCU_WORD, memreq=100, mem_percentage=100, coresreq=100)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        return request.type == GCU_WORD

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """HAMi's GCU Fit: health, type, then only idle devices."""
        reasons: dict[str, int] = {}
        found: list[GPUSlice] = []
        for device in reversed(devices):
            if not device.healthy:
                reason = CARD_NOT_HEALTH
            elif not self.type_allowed(context.annotations, device, request):
                reason = CARD_TYPE_MISMATCH
            elif device.used > 0:
                reason = EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
            else:
                found.append(GPUSlice(device.id, request.memreq, request.coresreq, request.type))
                if len(found) == request.nums:
                    return Picked(tuple(found))
                continue
            reasons[reason] = reasons.get(reason, 0) + 1
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))


class Enflame(Vendor):
    """HAMi's EnflameDevices: DRS partitions of GCUs, chosen by profile."""

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        raw = annotations_of(node).get(GCU_DRS_CAPACITY)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise WireFormatError(GCU_DRS_CAPACITY, "whole value", repr(raw), "is not a string")
        return decode_drs_capacity(raw, node_name(node))

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        names = self.names
        raw = resource_value(container, names.count)
        if raw is not None:
            count = quantity(raw)
            if count is None or count <= 0:
                return Admission(False, f"{names.count} must be greater than 0")
            copy_to_both(container, names.count)
            return Admission(True)
        has_memory, memory = spec_value(container, names.memory)
        has_cores, cores = spec_value(container, names.cores)
        if not has_memory and not has_cores:
            return Admission(False)
        if has_memory and (memory is None or memory <= 0):
            return Admission(False, f"{names.memory} must be greater than 0")
        if has_cores and (cores is None or not 0 < cores <= 100):
            return Admission(False, f"{names.cores} must be in range (0,100]")
        for resource, present in ((names.memory, has_memory), (names.cores, has_cores)):
            if present:
                copy_to_both(container, resource)
        return Admission(True)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        names = self.names
        slices = as_int64(resource_value(container, names.count))
        if slices is not None and slices > 0:
            if slices > INT32_MAX:
                return None
            return DeviceRequest(1, DRS_WORD, memreq=slices, mem_percentage=MODE_DIRECT, coresreq=0)
        has_memory, memory = spec_value(container, names.memory)
        has_cores, cores = spec_value(container, names.cores)
        if not has_memory and not has_cores:
            return None
        if (has_memory and memory is None) or (has_cores and cores is None):
            return None
        if (memory or 0) > INT32_MAX or (cores or 0) > INT32_MAX:
            return None
        memreq = max(go_int32(memory or 0), 0)
        coresreq = max(go_int32(cores or 0), 0)
        return DeviceRequest(1, DRS_WORD, memreq=memreq, mem_percentage=MODE_BY_SPEC, coresreq=coresreq)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        return request.type == DRS_WORD

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """HAMi's Enflame Fit (see the module docstring)."""
        profile = select_profile(devices, request)
        if (
            profile is None
            or not 0 < profile.size <= INT32_MAX
            or not 0 < profile.memory_gb <= INT32_MAX // 1024
            or profile.core_percent > INT32_MAX
        ):
            return Unfit({MODE_NOT_FIT: 1}, len(devices))
        memory = profile.memory_gb * 1024
        cores = profile.core_percent
        reasons: dict[str, int] = {}
        found: list[GPUSlice] = []
        records: list[Mapping[str, Any]] = []
        for device in reversed(devices):
            reason = slot_reason(self, device, request, context)
            if reason is None and device.free_mem < memory:
                reason = CARD_INSUFFICIENT_MEMORY
            if reason is None and device.info.devcore > 0 and device.free_cores < cores:
                reason = CARD_INSUFFICIENT_CORE
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            custom = custom_info(device.info)
            found.append(GPUSlice(device.id, memory, cores, request.type))
            records.append(
                {
                    "profileName": profile.name,
                    "profileID": profile.id,
                    "minor": custom_str(custom, "minor"),
                    "index": custom_str(custom, "index"),
                    "drsSlice": profile.size,
                    "requestMem": profile.request_memory_gb,
                    "requestCore": profile.request_core_percent,
                }
            )
            if len(found) == request.nums:
                return Picked(tuple(found), tuple(records))
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))

    def add_usage(
        self, device: GPUUsage, picked: GPUSlice, custom: Mapping[str, Any] | None = None
    ) -> GPUUsage:
        """AddResourceUsage: Used grows by the slice's drsSlice (clamped to int32): Fit's record of it
        (`custom`), else read back from the device's profile the slice's memory and cores match
        (`slice_size`). HAMi's usage of the pods already on the node counts 1 per slice (getNodesUsage
        does not call AddResourceUsage)."""
        size = clamp_int32(custom_int(custom, "drsSlice")) if custom and "drsSlice" in custom else 0
        used = clamp_int32(device.used + (size if size > 0 else slice_size(device, picked)))
        return device.plus(used - device.used, picked.usedmem, picked.usedcores)

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        """PatchAnnotations (see the module docstring); `custom` as Fit recorded it (without it a
        container's request is 1 and no index, minor or profile is written)."""
        if not any(len(c) for c in devices.containers):
            return {}
        out = {
            DRS_ALLOCATED: encode_pod_allocation(devices),
            ASSIGNED: "false",
            ASSIGNED_TIME: str(unix_nanos(now)),
        }
        assigned: dict[str, dict[str, Any]] = {}
        for ctr_index, allocation in enumerate(devices.containers):
            if not len(allocation):
                continue
            records = custom[ctr_index] if ctr_index < len(custom) else ()
            record = records[0] if records else {}
            size = clamp_int32(custom_int(record, "drsSlice"))
            if size <= 0:
                size = 1
            assigned[container_name(pod, ctr_index)] = {
                "allocated": False,
                "request": size,
                "profileID": custom_str(record, "profileID"),
                "profileName": custom_str(record, "profileName"),
            }
            index = custom_str(record, "index")
            if ASSIGNED_INDEX not in out and index:
                out[ASSIGNED_INDEX] = index
                out[ASSIGNED_ID] = index
            minor = custom_str(record, "minor")
            if ASSIGNED_MINOR not in out and minor:
                out[ASSIGNED_MINOR] = minor
            out.setdefault(REQUEST_SIZE, str(size))
        out[ASSIGNED_CONTAINERS] = assigned_json(assigned)
        return out


def resource_name(section: Section, key: str, default: str) -> str:
    """A resource name of the section; empty (or missing) gives HAMi's default."""
    return section.text(key, default) or default


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `enflame` section (EnflameConfig: resourceNameGCU, resourceNameDRSGCU,
    resourceNameGCUMemory, resourceNameGCUCore, and the legacy resourceNameVGCU, the DRS count name when
    resourceNameDRSGCU is empty, and resourceNameVGCUPercentage, read by nothing): GCU, then DRS."""
    section = config.section("enflame")
    gcu = section.text("resourceNameGCU", DEFAULT_GCU)
    if not gcu.strip():
        raise section.fail("resourceNameGCU", "must name the GCU count resource", gcu)
    legacy = section.text("resourceNameVGCU", "")
    section.text("resourceNameVGCUPercentage", "")
    drs = section.text("resourceNameDRSGCU", "") or legacy or DEFAULT_DRS
    vendors = (
        Gcu(gcu_names(gcu)),
        Enflame(
            drs_names(
                drs,
                resource_name(section, "resourceNameGCUMemory", DEFAULT_MEMORY),
                resource_name(section, "resourceNameGCUCore", DEFAULT_CORES),
            )
        ),
    )
    section.finish()
    return vendors


__all__ = [
    "ASSIGNED",
    "ASSIGNED_CONTAINERS",
    "ASSIGNED_ID",
    "ASSIGNED_INDEX",
    "ASSIGNED_MINOR",
    "ASSIGNED_TIME",
    "DRS_ALLOCATED",
    "DRS_WORD",
    "GCU_ALLOCATED",
    "GCU_DRS_CAPACITY",
    "GCU_TO_ALLOCATE",
    "GCU_WORD",
    "MODE_BY_SPEC",
    "MODE_DIRECT",
    "REQUEST_SIZE",
    "Enflame",
    "Gcu",
    "Profile",
    "assigned_json",
    "build",
    "clamp_int32",
    "collect_profiles",
    "container_name",
    "custom_int",
    "custom_str",
    "decode_drs_capacity",
    "drs_capacity",
    "drs_names",
    "gcu_names",
    "go_atoi",
    "normalize_memory",
    "parse_profile",
    "profiles_of",
    "select_profile",
    "slice_size",
]
