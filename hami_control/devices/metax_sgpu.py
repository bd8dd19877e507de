"""MetaX sGPU (HAMi pkg/device/metax/sdevice.go, protocol.go, qos.go and score.go, v2.10.0): shared MetaX
GPUs with QoS policies, online/offline app classes and MetaLink topology, pure.

- Inventory: the device plugin's own JSON, `metax-tech.com/node-gpu-devices` = `[{"uuid", "bdf", "model",
  "totalDevCount", "totalCompute", "totalVRam", "available*", "numa", "healthy", "qosPolicy",
  "linkZone"}]` (Go's encoding/json: keys match case-insensitively, int32 fields). Device `i` becomes
  `GPUInfo(id=uuid, index=i, count=totalDevCount, devmem=totalVRam, devcore=totalCompute,
  type="Metax-SGPU", numa, health=healthy)` with custominfo `{QosPolicy, Model, LinkZone}`. The node is
  healthy while that annotation lists at least one device; no handshake.
- Webhook: `metax-tech.com/sgpu-app-class`, when given, must be `online` or `offline` and the container
  must ask exactly one device; a pod that is not `online` must name a QoS policy
  (`metax-tech.com/sgpu-qos-policy`: best-effort, fixed-share, burst-share) and gets `best-effort` when
  it names none.
- Request (limits only): `metax-tech.com/sgpu` in 1..int32; `vcore` (default 100, in 0..int32);
  `vmemory`: a bare number is GiB (x1024), one whose canonical text has a unit is bytes (/2^20); no
  memory asks 100 % of the device.
- Fit: every device is checked (walked from the end), in HAMi's order: type (`CardTypeMismatch`), health
  (`CardUnhealthy`), app class (`CardAppClassMismatch`), QoS for pods that are not online
  (`CardQosPolicyMismatch`), UUID, slot, mutex, memory, then for pods that are not online cores,
  exclusivity and exhausted cores (cores above 100 are not clamped). Of the candidates the first N are
  taken, but an online pod prefers devices with fewer online tasks (and avoids offline-only ones), and
  a pod without app class asking 100 cores prefers devices in one MetaLink zone. Online pods record 0
  cores; the slice Type is the device's.
- Pod annotations: `hami.io/metax-sgpu-devices-to-allocate` / `-allocated`, the plugin's
  `metax-tech.com/gpu-devices-allocated` (`[[{"uuid","compute","vRam"}]]`, zeros omitted) and
  `metax-tech.com/predicate-time` (Unix nanoseconds). Node lock `hami.io/mutex.lock`.
- ScoreNode is policy-neutral (`policy_neutral`: the caller weighs it x10000 under binpack, x-10000 under
  spread): an online pod scores the busyness of its devices, an exclusive pod with topology awareness
  (`sgpuTopologyAware`, or the pod's `metax-tech.com/sgpu-topology-aware`) the MetaLink pairs it keeps
  or breaks.

What HAMi keeps in process memory is passed in here: the pods holding each device (`device_pods`, HAMi's
`DeviceUsage.PodInfos`: one pod object per slice) and the "jittery QoS" expectations (`qos_cache`, HAMi's
JitteryQosCache: device -> the QoS policy a scheduled pod will switch it to, until the plugin reports it;
`jittery_qos` gives what a placement adds, `sync_jittery_qos` what an inventory clears). HAMi's
AddResourceUsage also marks, for the rest of the pod, a device it placed a slice on with the pod's QoS
policy: Fit reads that from `FitContext.allocated`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hami_api._wire import INT32, Where, go_json_string, json_bool, json_int, json_list, json_object, json_str
from hami_api._wire import load_json as _load_json
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
    NodeHealth,
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
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
)
from hami_control.usage import GPUUsage

COMMON_WORD = "Metax-SGPU"
NODE_DEVICES = "metax-tech.com/node-gpu-devices"
ALLOCATED_DEVICES = "metax-tech.com/gpu-devices-allocated"
PREDICATE_TIME = "metax-tech.com/predicate-time"
USE_UUID = "metax-tech.com/use-gpuuuid"
NOUSE_UUID = "metax-tech.com/nouse-gpuuuid"
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
TOPOLOGY_AWARE = "metax-tech.com/sgpu-topology-aware"
APP_CLASS = "metax-tech.com/sgpu-app-class"

BEST_EFFORT = "best-effort"
FIXED_SHARE = "fixed-share"
BURST_SHARE = "burst-share"
ONLINE = "online"
OFFLINE = "offline"

MEMORY_FACTOR = 1024
"""HAMi's MemoryFactor: a bare vmemory value is GiB."""
DIRECT_LINK_SCORE = 10
"""score.go: two exclusive devices in the same MetaLink zone."""

CARD_UNHEALTHY = "CardUnhealthy"
CARD_QOS_POLICY_MISMATCH = "CardQosPolicyMismatch"
CARD_APP_CLASS_MISMATCH = "CardAppClassMismatch"

APP_CLASS_ERROR = f"{APP_CLASS} must be set one of [{ONLINE}, {OFFLINE}]"
SINGLE_DEVICE_ERROR = "app-class pod must request single device"
QOS_POLICY_ERROR = f"{QOS_POLICY} must be set one of [{BEST_EFFORT}, {FIXED_SHARE}, {BURST_SHARE}]"

_QOS_POLICIES = (BEST_EFFORT, FIXED_SHARE, BURST_SHARE)
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

DevicePods = Mapping[str, Sequence[Mapping[str, Any]]]
"""Device UUID -> the pods (plain Kubernetes JSON) holding a slice of it, one entry per slice."""


def names(
    count: str = "metax-tech.com/sgpu",
    memory: str = "metax-tech.com/vmemory",
    cores: str = "metax-tech.com/vcore",
) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="metax",
        count=count,
        memory=memory,
        cores=cores,
        memory_factor=MEMORY_FACTOR,
        to_allocate="hami.io/metax-sgpu-devices-to-allocate",
        allocated="hami.io/metax-sgpu-devices-allocated",
        register=NODE_DEVICES,
        inventory=Inventory.CUSTOM,
        health=HealthRule.ALWAYS,  # not used: `node_health` is overridden (healthy while devices are listed)
        lock=LockKind.MUTEX,
        use_uuid=USE_UUID,
        nouse_uuid=NOUSE_UUID,
    )


# --- the inventory (protocol.go) --------------------------------------------------------------------------

_SDEVICE_KEYS = (
    "uuid", "bdf", "model", "totalDevCount", "totalCompute", "totalVRam", "availableDevCount",
    "availableCompute", "availableVRam", "numa", "healthy", "qosPolicy", "linkZone",
)  # fmt: skip
_INT32_KEYS = (
    "totalDevCount", "totalCompute", "totalVRam", "availableDevCount", "availableCompute", "availableVRam",
    "numa", "linkZone",
)  # fmt: skip


def decode_sdevices(text: str) -> tuple[GPUInfo, ...]:
    """`metax-tech.com/node-gpu-devices` as devices (protocol.go convertMetaxSDeviceToHAMIDevice). `null`
    and `[]` are no devices. Raises `WireFormatError` for what Go's decoder refuses (a number that is not
    an int32, a wrong type), for a device that is not an object (Go would crash on it), and for an empty
    or repeated uuid."""
    where = Where(NODE_DEVICES)
    value = _load_json(where, text)
    if value is None:
        return ()
    devices: list[GPUInfo] = []
    seen: set[str] = set()
    for i, item in enumerate(json_list(where, "", value)):
        at = where.at(f"device {i}")
        m = json_object(at, "device", item, _SDEVICE_KEYS)
        uuid = json_str(at, "uuid", m.get("uuid", ""))
        if not uuid:
            at.fail("", "is missing or empty", "uuid")
        if uuid in seen:
            at.fail(uuid, "appears twice", "uuid")
        seen.add(uuid)
        numbers = {key: json_int(at, key, m.get(key, 0), INT32) for key in _INT32_KEYS}
        json_str(at, "bdf", m.get("bdf", ""))
        custom = {
            "QosPolicy": json_str(at, "qosPolicy", m.get("qosPolicy", "")),
            "Model": json_str(at, "model", m.get("model", "")),
            "LinkZone": float(numbers["linkZone"]),  # a custominfo number, as Go's map[string]any holds it
        }
        devices.append(
            GPUInfo(
                id=uuid,
                index=i,
                count=numbers["totalDevCount"],
                devmem=numbers["totalVRam"],
                devcore=numbers["totalCompute"],
                type=COMMON_WORD,
                numa=numbers["numa"],
                mode="",
                health=json_bool(at, "healthy", m.get("healthy", False)),
                custom=custom_text(custom),
            )
        )
    return tuple(devices)


def metax_pod_devices(devices: PodAllocation) -> str:
    """`metax-tech.com/gpu-devices-allocated` (protocol.go convertHAMIPodDeviceToMetaxPodDevice, then Go's
    json.Marshal): per container `[{"uuid":..,"compute":<cores>,"vRam":<MiB>}]`, zeros omitted."""
    containers = []
    for container in devices.containers:
        entries = []
        for s in container.devices:
            parts = [f'"uuid":{go_json_string(s.uuid)}']
            if s.usedcores:
                parts.append(f'"compute":{s.usedcores}')
            if s.usedmem:
                parts.append(f'"vRam":{s.usedmem}')
            entries.append("{" + ",".join(parts) + "}")
        containers.append("[" + ",".join(entries) + "]")
    return "[" + ",".join(containers) + "]"


# --- QoS (qos.go, sdevice.go checkDeviceQos / addJitteryQos) ---------------------------------------------


def _qos_of(info: GPUInfo) -> str | None:
    value = custom_info(info).get("QosPolicy")
    return value if isinstance(value, str) else None


def qos_fits(request_qos: str, device_qos: str, used: int, coresreq: int) -> bool:
    """checkDeviceQos: an idle device switches to any policy, an exclusive request needs none, else the
    device's policy must be unset or the request's."""
    if used == 0 or coresreq == 100:
        return True
    return device_qos in ("", request_qos)


def jittery_qos(
    request_qos: str, devices: PodAllocation, custom: Sequence[Sequence[Mapping[str, Any]]]
) -> dict[str, str]:
    """addJitteryQos: the expectations a placement adds to the QoS cache: each chosen device whose recorded
    policy (`Picked.custom`'s `QosPolicy`) differs from the one it will run (the pod's, "" for an
    exclusive slice)."""
    out: dict[str, str] = {}
    for container, records in zip(devices.containers, custom, strict=False):
        for s, record in zip(container.devices, records, strict=False):
            current = record.get("QosPolicy")
            if not isinstance(current, str):
                continue
            expected = "" if s.usedcores == 100 else request_qos
            if current != expected:
                out[s.uuid] = expected
    return out


def sync_jittery_qos(cache: Mapping[str, str], devices: Sequence[GPUInfo]) -> dict[str, str]:
    """JitteryQosCache.Sync: the cache without the devices the inventory now reports at their expected
    policy."""
    reported = {d.id: _qos_of(d) or "" for d in devices}
    return {uuid: qos for uuid, qos in cache.items() if reported.get(uuid) != qos}


# --- app classes ------------------------------------------------------------------------------------------


def _app_class(pod: Mapping[str, Any]) -> Any:
    return annotations_of(pod).get(APP_CLASS)


def app_class_counts(pods: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(online, offline) slices among the pods holding a device."""
    classes = [_app_class(p) for p in pods]
    return classes.count(ONLINE), classes.count(OFFLINE)


def app_class_fits(request_class: Any, used: int, pods: Sequence[Mapping[str, Any]]) -> bool:
    """checkAppClass: an idle device takes anyone; app-class pods share only devices running app-class
    pods, others only devices running none; an offline pod never joins an online one."""
    if used == 0:
        return True
    online, offline = app_class_counts(pods)
    busy_with_classes = online > 0 or offline > 0
    if busy_with_classes == (request_class in (ONLINE, OFFLINE)):
        return not (online > 0 and request_class == OFFLINE)
    return False


def prioritize_online(
    candidates: Sequence[GPUUsage], require: int, device_pods: DevicePods
) -> list[GPUUsage]:
    """prioritizeOnlineDevices: fewest online tasks first, then fewest offline ones, devices running only
    offline tasks last (fewest first). Stable (Go's sort.Slice is, up to 12 devices)."""
    if len(candidates) <= require:
        return list(candidates)

    def key(device: GPUUsage) -> tuple[bool, int, int]:
        online, offline = app_class_counts(device_pods.get(device.id, ()))
        return (online == 0 and offline > 0, online, offline)

    return sorted(candidates, key=key)[:require]


# --- MetaLink topology (score.go, sdevice.go prioritizeExclusiveDevices / scoreExclusiveDevices) ---------


def link_zone(info: GPUInfo) -> int:
    """The device's MetaLink zone (custominfo `LinkZone`; 0 = none)."""
    value = custom_info(info).get("LinkZone")
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        return 0
    zone = int(value)
    return zone if INT32[0] <= zone <= INT32[1] else 0


def prioritize_exclusive(candidates: Sequence[GPUUsage], require: int) -> list[GPUUsage]:
    """prioritizeExclusiveDevices: the smallest MetaLink zone holding all of them, else zones smallest
    first, then devices in no zone. Zones of one size keep the order of their first device (HAMi's map
    order is random)."""
    if len(candidates) <= require:
        return list(candidates)
    zones: dict[int, list[GPUUsage]] = {}
    for device in candidates:
        zones.setdefault(link_zone(device.info), []).append(device)
    linked = sorted((devs for zone, devs in zones.items() if zone > 0), key=len)
    unlinked = [d for zone, devs in zones.items() if zone <= 0 for d in devs]
    for devs in linked:
        if len(devs) >= require:
            return devs[:require]
    picked = [d for devs in linked for d in devs] + unlinked
    return picked[:require]


def _link_score(devices: Sequence[tuple[str, int]]) -> int:
    score = 0
    for i, (uuid_a, zone_a) in enumerate(devices):
        for uuid_b, zone_b in devices[i + 1 :]:
            if uuid_a != uuid_b and zone_a != 0 and zone_a == zone_b:
                score += DIRECT_LINK_SCORE
    return score


def score_exclusive(devices: PodAllocation, previous: Sequence[GPUUsage]) -> int:
    """scoreExclusiveDevices: 10 x the MetaLink pairs among the pod's exclusive devices, minus the pairs
    between idle devices that the placement breaks."""
    zones = {d.id: link_zone(d.info) for d in previous}
    allocated = [
        (s.uuid, zones.get(s.uuid, 0)) for c in devices.containers for s in c.devices if s.usedcores == 100
    ]
    taken = {uuid for uuid, _ in allocated}
    available = [(d.id, zones[d.id]) for d in previous if d.used == 0]
    rest = [(uuid, zone) for uuid, zone in available if uuid not in taken]
    allocated_score = _link_score(allocated)
    loss = _link_score(available) - allocated_score - _link_score(rest)
    return 10 * allocated_score - loss


def score_online(devices: PodAllocation, previous: Sequence[GPUUsage], device_pods: DevicePods) -> int:
    """scoreOnlineDevices: per chosen device, -100 per offline task when it runs only offline ones, else
    -20 per online and -2 per offline task."""
    chosen = {s.uuid for c in devices.containers for s in c.devices}
    total = 0
    for device in previous:
        if device.id not in chosen:
            continue
        online, offline = app_class_counts(device_pods.get(device.id, ()))
        total += -100 * offline if offline > 0 and online == 0 else -20 * online - 2 * offline
    return total


def topology_aware(devices: PodAllocation, annotations: Mapping[str, Any], default: bool) -> bool:
    """topologyAwareEnable: only for a pod with an exclusive (100-core) slice; the pod's
    `metax-tech.com/sgpu-topology-aware` (Go's ParseBool) overrides the configured default."""
    if not any(s.usedcores == 100 for c in devices.containers for s in c.devices):
        return False
    value = annotations.get(TOPOLOGY_AWARE)
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    return default


# --- the vendor -------------------------------------------------------------------------------------------


def _quantity_value(raw: Any) -> int | None:
    """Go's Quantity.Value() (rounded up), None when unreadable."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return quantity_value(raw)
    except (ValueError, OverflowError):
        return None


def _has_unit(raw: Any) -> bool:
    """Whether the quantity's canonical text (Go's Quantity.String) has a letter: "16" no, "16Gi" or
    "1k" (= 1000) yes."""
    try:
        text = canonical_quantity(raw)
    except (ValueError, OverflowError):
        return False
    return any("a" <= ch.lower() <= "z" for ch in text)


def _trunc_div(a: int, b: int) -> int:
    """Go's integer division (toward zero)."""
    q = abs(a) // b
    return -q if a < 0 else q


def _set_annotation(pod: MutableMapping[str, Any], key: str, value: str) -> None:
    meta = pod.get("metadata")
    if not isinstance(meta, MutableMapping):
        meta = {}
        pod["metadata"] = meta
    annotations = meta.get("annotations")
    if not isinstance(annotations, MutableMapping):
        annotations = {}
        meta["annotations"] = annotations
    annotations[key] = value


def _unix_nanos(now: datetime) -> int:
    moment = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


class MetaxSGPU(Vendor):
    """HAMi's MetaxSDevices (see the module docstring)."""

    policy_neutral = True
    uses_device_pods = True

    def __init__(self, names: VendorNames, *, topology_aware: bool = False) -> None:
        super().__init__(names)
        self.topology_aware = topology_aware
        """`sgpuTopologyAware`: score exclusive placements by MetaLink unless the pod says otherwise."""

    # --- the node side -------------------------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        raw = annotations_of(node).get(NODE_DEVICES)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise WireFormatError(NODE_DEVICES, "whole value", repr(raw), "is not a string")
        return decode_sdevices(raw)

    def node_health(self, node: Mapping[str, Any], now: datetime) -> NodeHealth:
        """CheckHealth: healthy while the inventory lists devices (an unreadable one lists none)."""
        try:
            devices = self.node_devices(node)
        except WireFormatError:
            devices = None
        return NodeHealth(bool(devices), True)

    # --- the pod side --------------------------------------------------------------------------------

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        count = resource_value(container, self.names.count, limits_only=True)
        if count is None:
            return Admission(False)
        annotations = annotations_of(pod)
        if APP_CLASS in annotations:
            if annotations[APP_CLASS] not in (ONLINE, OFFLINE):
                return Admission(True, APP_CLASS_ERROR)
            if _quantity_value(count) != 1:
                return Admission(True, SINGLE_DEVICE_ERROR)
        if annotations.get(APP_CLASS) == ONLINE:
            return Admission(True)
        if QOS_POLICY not in annotations:
            _set_annotation(pod, QOS_POLICY, BEST_EFFORT)
            return Admission(True)
        if annotations[QOS_POLICY] in _QOS_POLICIES:
            return Admission(True)
        return Admission(True, QOS_POLICY_ERROR)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        names = self.names
        count = as_int64(resource_value(container, names.count, limits_only=True))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        cores = 100
        raw_cores = as_int64(resource_value(container, names.cores, limits_only=True))
        if raw_cores is not None:
            if not 0 <= raw_cores <= INT32_MAX:
                return None
            cores = raw_cores
        memory = 0
        raw_mem_value = resource_value(container, names.memory, limits_only=True)
        raw_mem = as_int64(raw_mem_value)
        if raw_mem is not None:
            if _has_unit(raw_mem_value):
                memory = _trunc_div(_trunc_div(raw_mem, 1024), 1024)
            else:
                if not 0 <= raw_mem <= INT32_MAX // MEMORY_FACTOR:
                    return None
                memory = raw_mem * MEMORY_FACTOR
            if not 0 <= memory <= INT32_MAX:
                return None
        return DeviceRequest(count, COMMON_WORD, memory, 100 if memory == 0 else 0, cores)

    def slice_type(self, device: GPUUsage, request: DeviceRequest) -> str:
        return device.info.type

    def fit(
        self,
        devices: Sequence[GPUUsage],
        request: DeviceRequest,
        context: FitContext,
        *,
        device_pods: DevicePods | None = None,
        qos_cache: Mapping[str, str] | None = None,
    ) -> Picked | Unfit:
        """HAMi's MetaxSDevices.Fit (see the module docstring). `device_pods`: the pods holding each
        device; `qos_cache`: the QoS policies devices are expected to switch to (HAMi's JitteryQosCache)."""
        pods = device_pods if device_pods is not None else context.device_pods
        cache = qos_cache if qos_cache is not None else context.qos_cache
        annotations = context.annotations
        app_class = annotations.get(APP_CLASS, "")
        online = app_class == ONLINE
        request_qos = annotations.get(QOS_POLICY, "")
        request_qos = request_qos if isinstance(request_qos, str) else str(request_qos)
        reasons: dict[str, int] = {}
        candidates: list[GPUUsage] = []
        for device in reversed(devices):
            reason = self._reason(
                device, request, context, pods=pods, cache=cache, app_class=app_class, request_qos=request_qos
            )
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            candidates.append(device)
        if len(candidates) < request.nums:
            if candidates:
                reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(candidates)
            return Unfit(reasons, len(devices))
        best = candidates[: request.nums]
        if len(candidates) > request.nums:
            if APP_CLASS in annotations:
                if online:
                    best = prioritize_online(candidates, request.nums, pods)
            elif request.coresreq == 100:
                best = prioritize_exclusive(candidates, request.nums)
        cores = 0 if online else request.coresreq
        slices = tuple(
            GPUSlice(d.id, self._memory(d, request), cores, self.slice_type(d, request)) for d in best
        )
        custom = tuple(self._record(d, context, request_qos) for d in best)
        return Picked(slices, custom)

    @staticmethod
    def _memory(device: GPUUsage, request: DeviceRequest) -> int:
        if request.memreq > 0:
            return request.memreq
        return _trunc_div(device.info.devmem * request.mem_percentage, 100)

    def _reason(
        self,
        device: GPUUsage,
        request: DeviceRequest,
        context: FitContext,
        *,
        pods: DevicePods,
        cache: Mapping[str, str],
        app_class: Any,
        request_qos: str,
    ) -> str | None:
        online = app_class == ONLINE
        info = device.info
        if request.type != COMMON_WORD:
            return CARD_TYPE_MISMATCH
        if not device.healthy:
            return CARD_UNHEALTHY
        if not app_class_fits(app_class, device.used, pods.get(device.id, ())):
            return CARD_APP_CLASS_MISMATCH
        if not online:
            device_qos = (
                cache[device.id] if device.id in cache else self._pod_qos(device, context, request_qos)
            )
            if not qos_fits(request_qos, device_qos or "", device.used, request.coresreq):
                return CARD_QOS_POLICY_MISMATCH
        if not self.uuid_allowed(context.annotations, device):
            return CARD_UUID_MISMATCH
        if info.count <= device.used:
            return CARD_TIME_SLICING_EXHAUSTED
        if context.mutex and device.used > 0:
            return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        if info.devmem - device.usedmem < self._memory(device, request):
            return CARD_INSUFFICIENT_MEMORY
        if not online:
            cores = request.coresreq
            if info.devcore - device.usedcores < cores:
                return CARD_INSUFFICIENT_CORE
            if info.devcore == 100 and cores == 100 and device.used > 0:
                return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
            if info.devcore != 0 and device.usedcores == info.devcore and cores == 0:
                return CARD_COMPUTE_UNITS_EXHAUSTED
        return None

    @staticmethod
    def _pod_qos(device: GPUUsage, context: FitContext, request_qos: str) -> str | None:
        """The device's QoS policy as HAMi's AddResourceUsage leaves it for the pod's later containers:
        a device the pod already has a slice on runs the pod's policy ("" for an exclusive slice)."""
        qos = _qos_of(device.info)
        if qos is None or context.annotations.get(APP_CLASS) == ONLINE:
            return qos
        placed = context.allocated.get(COMMON_WORD)
        for container in placed.containers if placed is not None else ():
            for s in container.devices:
                if s.uuid == device.id:
                    qos = "" if s.usedcores == 100 else request_qos
        return qos

    def _record(self, device: GPUUsage, context: FitContext, request_qos: str) -> Mapping[str, Any]:
        """What HAMi's ContainerDevice.CustomInfo holds: the device's custominfo as Fit saw it."""
        record = dict(custom_info(device.info))
        qos = self._pod_qos(device, context, request_qos)
        if qos is not None:
            record["QosPolicy"] = qos
        return record

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        out = super().pod_annotations(pod, devices, node=node, now=now, custom=custom)
        if out:
            out[ALLOCATED_DEVICES] = metax_pod_devices(devices)
            out[PREDICATE_TIME] = str(_unix_nanos(now))
        return out

    def placement_expectations(
        self, pod: Mapping[str, Any], devices: PodAllocation, custom: Sequence[Sequence[Mapping[str, Any]]]
    ) -> dict[str, str]:
        return self.qos_expectations(pod, devices, custom)

    def settled_expectations(self, expected: Mapping[str, str], devices: Sequence[GPUInfo]) -> dict[str, str]:
        return sync_jittery_qos(expected, devices)

    def qos_expectations(
        self, pod: Mapping[str, Any], devices: PodAllocation, custom: Sequence[Sequence[Mapping[str, Any]]]
    ) -> dict[str, str]:
        """What HAMi's PatchAnnotations adds to its JitteryQosCache for this placement (nothing for an
        online pod); the caller keeps the cache (`sync_jittery_qos` on each inventory)."""
        annotations = annotations_of(pod)
        if annotations.get(APP_CLASS) == ONLINE or not any(len(c) for c in devices.containers):
            return {}
        qos = annotations.get(QOS_POLICY, "")
        return jittery_qos(qos if isinstance(qos, str) else str(qos), devices, custom)

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
        *,
        pod: Mapping[str, Any] | None = None,
        device_pods: DevicePods | None = None,
    ) -> float:
        """HAMi's ScoreNode, "higher is better" whatever `policy` (`policy_neutral`): the online score for
        an online pod, the MetaLink score for a topology-aware exclusive one, else 0. `pod`: the pod
        placed (HAMi passes its annotations inside the chosen devices' CustomInfo)."""
        annotations = annotations_of(pod) if pod is not None else {}
        chosen = any(len(c) for c in devices.containers)
        if chosen and annotations.get(APP_CLASS) == ONLINE:
            return float(score_online(devices, previous, device_pods or {}))
        if topology_aware(devices, annotations, self.topology_aware):
            return float(score_exclusive(devices, previous))
        return 0.0


__all__ = [
    "ALLOCATED_DEVICES",
    "APP_CLASS",
    "APP_CLASS_ERROR",
    "BEST_EFFORT",
    "BURST_SHARE",
    "CARD_APP_CLASS_MISMATCH",
    "CARD_QOS_POLICY_MISMATCH",
    "CARD_UNHEALTHY",
    "COMMON_WORD",
    "FIXED_SHARE",
    "MEMORY_FACTOR",
    "NODE_DEVICES",
    "NOUSE_UUID",
    "OFFLINE",
    "ONLINE",
    "PREDICATE_TIME",
    "QOS_POLICY",
    "QOS_POLICY_ERROR",
    "SINGLE_DEVICE_ERROR",
    "TOPOLOGY_AWARE",
    "USE_UUID",
    "DevicePods",
    "MetaxSGPU",
    "app_class_counts",
    "app_class_fits",
    "decode_sdevices",
    "jittery_qos",
    "link_zone",
    "metax_pod_devices",
    "names",
    "prioritize_exclusive",
    "prioritize_online",
    "qos_fits",
    "score_exclusive",
    "score_online",
    "sync_jittery_qos",
    "topology_aware",
]
