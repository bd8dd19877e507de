"""The vendor interface of the control plane: what differs between the accelerators HAMi shares, pure.

HAMi's `Devices` interface (pkg/device/devices.go, v2.10) has 13 methods and most backends leave half of
them empty or identical. Here what is only names, keys and encodings is data (`VendorNames`, one table
per vendor) and what really differs is code: a `Vendor` subclass overrides only the steps where its
backend departs from HAMi's common behaviour, which `Vendor` implements once (Hygon's DCU backend,
pkg/device/hygon/device.go, is that common behaviour almost to the letter). The registry
(`hami_control.devices.registry`) builds the vendors from HAMi's device config.

HAMi method -> here:

| HAMi `Devices`             | here                                                             |
|----------------------------|------------------------------------------------------------------|
| CommonWord                 | `names.common_word`                                              |
| GetResourceNames           | `names.count/memory/cores`, `names.memory_factor`                |
| GetNodeDevices             | `node_devices(node)`: `names.inventory` says where from          |
| CheckHealth / NodeCleanUp  | `node_health(node, now)`: `names.health`; `names.handshake`     |
| LockNode / ReleaseNodeLock | `names.lock` (which annotation), taken by the binder             |
| MutateAdmission            | `mutate(container, pod)` on copies; the webhook diffs them       |
| GenerateResourceRequests   | `request(container)`                                             |
| Fit / AddResourceUsage     | `fit(devices, request, context)` / `add_usage(device, slice)`    |
| PatchAnnotations           | `pod_annotations(pod, devices, node, now)`                       |
| ScoreNode                  | `score_node(...)` (0 unless overridden)                          |

Devices are `hami_api.types.GPUInfo` (HAMi's DeviceInfo; `custom` carries its `custominfo`) with their
usage as `hami_control.usage.GPUUsage` (HAMi's DeviceUsage), so every vendor's devices live in the same
`NodeGPUs` values, and a pod's choice per vendor is a `PodAllocation` whose slices carry the vendor's
device Type, encoded by `hami_api.annotations.encode_pod_allocation` exactly as HAMi's
`EncodePodSingleDevice`. Nothing here reads the clock, the network or the environment: the caller
passes `now` and the node and pod objects (plain Kubernetes JSON).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from hami_api._wire import Where, parse_local_datetime
from hami_api.annotations import decode_node_register, encode_pod_allocation
from hami_api.errors import WireFormatError
from hami_api.quantity import canonical_quantity, parse_quantity, quantity_int
from hami_api.types import GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.usage import GPUUsage

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class Inventory(StrEnum):
    """Where a node's devices of a vendor are read from (vendors.md section 1.5)."""

    LEGACY = "legacy"
    """`names.register` as a legacy string (`id,count,devmem,devcore,type,numa,health[,index,mode]:`)"""
    JSON = "json"
    """`names.register` annotation as a JSON `[]DeviceInfo` (Go's case-insensitive keys)."""
    CUSTOM = "custom"
    """The vendor's own code (`node_devices` overridden): capacity synthesis or a vendor JSON schema."""


class HealthRule(StrEnum):
    """HAMi's `CheckHealth` variants."""

    HANDSHAKE = "handshake"
    """pkg/device/devices.go `CheckHealth`: the `names.handshake` annotation's Requesting/Reported dance."""
    ALWAYS = "always"
    """(true, true): MLU, AWS Neuron, Enflame DRS, Kunlun XPU, Mthreads."""
    CAPACITY = "capacity"
    """healthy while `status.capacity[names.count]` > 0: GCU, Metax GPU, AMD."""


class LockKind(StrEnum):
    """The bind-time node lock a vendor takes (pkg/util/nodelock; Cambricon's own)."""

    NONE = "none"
    MUTEX = "mutex"
    """`hami.io/mutex.lock: <RFC3339>,<ns>,<pod>`, 5 min (HAMi's nodelock for every vendor that locks)."""
    DSMLU = "dsmlu"
    """`cambricon.com/dsmlu.lock: <RFC3339>`, 2 min (pkg/device/cambricon/device.go)."""


MUTEX_LOCK = "hami.io/mutex.lock"
DSMLU_LOCK = "cambricon.com/dsmlu.lock"
HANDSHAKE_FRESH = timedelta(seconds=60)
"""pkg/device/devices.go CheckHealth: a `Requesting_` handshake younger than this is still awaited."""


@dataclass(frozen=True, slots=True)
class VendorNames:
    """Everything about a vendor that is only a name, a key or an encoding."""

    common_word: str
    """HAMi's CommonWord: the DevicesMap key, the request Type, the PodDevices key ("DCU", "Ascend910B4")."""
    family: str
    """The vendor as a user names it (the device config's key and the metrics' `vendor` label)."""
    count: str
    """ResourceCountName: the extended resource the vendor's plugin advertises."""
    memory: str = ""
    cores: str = ""
    memory_factor: int = 0
    """HAMi's ResourceNames.MemoryFactor (0: the backend does not scale memory)."""
    to_allocate: str = ""
    """InRequestDevices[cw], the annotation the vendor's plugin consumes ("" = written as allocated only)."""
    allocated: str = ""
    """SupportDevices[cw], the annotation the scheduler counts usage from."""
    register: str = ""
    """The node annotation holding the inventory ("" = capacity only)."""
    inventory: Inventory = Inventory.LEGACY
    handshake: str = ""
    """util.HandshakeAnnos[cw] ("" = none)."""
    health: HealthRule = HealthRule.HANDSHAKE
    lock: LockKind = LockKind.MUTEX
    use_uuid: str = ""
    nouse_uuid: str = ""
    use_type: str = ""
    nouse_type: str = ""
    runtime_class: str = ""
    """runtimeClassName the webhook sets on a pod asking this vendor and naming none ("" = none)."""
    extra_resources: tuple[str, ...] = ()
    """Other resource names the vendor reads (quota, the extender's managed resources)."""

    @property
    def resources(self) -> tuple[str, ...]:
        """Every resource name the vendor reads, count first."""
        names = (self.count, self.memory, self.cores, *self.extra_resources)
        return tuple(dict.fromkeys(n for n in names if n))

    @property
    def lock_annotation(self) -> str:
        return {LockKind.MUTEX: MUTEX_LOCK, LockKind.DSMLU: DSMLU_LOCK}.get(self.lock, "")


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """HAMi's ContainerDeviceRequest: `nums` devices of `type` (the common word), each `memreq` MiB (or
    `mem_percentage` % of the device when memreq is 0; 101 = unset, Enflame uses 0 and -1), and
    `coresreq` (percent, or the vendor's unit)."""

    nums: int
    type: str
    memreq: int = 0
    mem_percentage: int = 0
    coresreq: int = 0


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """CheckHealth's answer: whether the node's devices of the vendor are usable and whether the cache
    must take them again (`update`); `handshake` is a value the scheduler must write to
    `names.handshake` (HAMi patches `Requesting_<now>`), None for nothing to write."""

    healthy: bool
    update: bool
    handshake: str | None = None


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """One resource of the pod's namespace quota (HAMi's QuotaManager entry): what the namespace's pods
    use (in the requests' units: MiB for memory, percent for cores) and its tightest `limits.<resource>`
    in the same units (a memory limit x the vendor's memory factor, as HAMi's FitQuota compares it;
    None: no limit)."""

    used: int = 0
    limit: int | None = None


DevicePods = Mapping[str, Sequence[Mapping[str, Any]]]
"""Device id -> the pods holding a slice of it, one per slice (HAMi's DeviceUsage.PodInfos)."""


@dataclass(frozen=True, slots=True)
class FitContext:
    """What a vendor's Fit may read besides the devices and the request: the pod, its node, the GPU
    policy chain in force for the pod, what the pod was given so far (per common word, one
    `ContainerAllocation` per container already placed), its namespace's quota by resource name, the
    pods on each device and the QoS policies devices are expected to switch to (Metax sGPU)."""

    pod: Mapping[str, Any]
    node: Mapping[str, Any] = field(default_factory=dict)
    policy: tuple[GPUPolicy, ...] = (GPUPolicy.SPREAD,)
    allocated: Mapping[str, PodAllocation] = field(default_factory=dict)
    quota: Mapping[str, QuotaEntry] = field(default_factory=dict)
    device_pods: DevicePods = field(default_factory=dict)
    qos_cache: Mapping[str, str] = field(default_factory=dict)
    _pod_annotations: Mapping[str, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pod_annotations", _annotations(self.pod))

    @property
    def annotations(self) -> Mapping[str, Any]:
        return self._pod_annotations

    @property
    def node_annotations(self) -> Mapping[str, Any]:
        return _annotations(self.node)

    @property
    def mutex(self) -> bool:
        return GPUPolicy.MUTEX in self.policy


@dataclass(frozen=True, slots=True)
class Picked:
    """Fit's choice for one container: the slices (GPUSlice.vendor = the device Type written in the pod
    annotation) and, per slice, what the vendor records beside it (Enflame's profile, ...)."""

    slices: tuple[GPUSlice, ...]
    custom: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Unfit:
    """Fit's refusal: reason -> number of devices, and the denominator HAMi's GenReason writes."""

    reasons: Mapping[str, int]
    cards: int

    @property
    def message(self) -> str:
        return gen_reason(self.reasons, self.cards)


@dataclass(frozen=True, slots=True)
class Admission:
    """MutateAdmission's answer for one container: whether it asks this vendor, and HAMi's error text
    when the pod must be refused ("" = none)."""

    found: bool
    error: str = ""


def gen_reason(reasons: Mapping[str, int], cards: int) -> str:
    """pkg/device/common/common.go GenReason: `<n>/<cards> <Reason>` per reason, sorted, joined by ", "."""
    return ", ".join(sorted(f"{count}/{cards} {reason}" for reason, count in reasons.items()))


# --- helpers every vendor uses ---------------------------------------------------------------------------


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """metadata.annotations of a Kubernetes object (empty when missing or malformed)."""
    return _annotations(obj)


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def node_quantity(node: Mapping[str, Any], section: str, resource: str) -> int:
    """`status.<section>[resource]` as Go's `Quantity.Value()` (0 when absent or unreadable)."""
    status = node.get("status")
    values = status.get(section) if isinstance(status, Mapping) else None
    raw = values.get(resource) if isinstance(values, Mapping) else None
    if raw is None:
        return 0
    try:
        value = parse_quantity(raw)
    except ValueError:
        return 0
    whole = -((-value.numerator) // value.denominator) if value >= 0 else value.numerator // value.denominator
    return int(whole)


def resource_value(container: Mapping[str, Any], resource: str, *, limits_only: bool = False) -> Any | None:
    """The raw value of `resource` in the container's limits, else (unless `limits_only`) its requests."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return None
    for section in ("limits",) if limits_only else ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, Mapping) and resource in values:
            return values[resource]
    return None


def as_int64(raw: Any) -> int | None:
    """Go's `Quantity.AsInt64()`: the value when it is a whole number that fits int64 and Go keeps it in
    its int64 form, else None (as HAMi's backends read it: a value they cannot read is as if absent).
    Go keeps a quantity as an `inf.Dec` (where AsInt64 answers false) when ParseQuantity leaves its fast
    path (`_go_keeps_inf_dec`), on the canonical text the API server stores."""
    if raw is None:
        return None
    try:
        value = quantity_int(raw)
        if _go_keeps_inf_dec(canonical_quantity(raw)):
            return None
    except ValueError:
        return None
    if value is None or not -INT64_MAX - 1 <= value <= INT64_MAX:
        return None
    return value


_GO_QUANTITY = re.compile(r"[+-]?0*(?P<num>[0-9]*)(?:\.(?P<denom>[0-9]*))?(?P<suffix>.*)")
_GO_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_GO_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def _go_keeps_inf_dec(text: str) -> bool:
    """Whether apimachinery's ParseQuantity (pkg/api/resource/quantity.go) leaves its int64 fast path for
    `text`: decimal with more than 18 digits, or a scale below nano; binary with a fraction, or with
    `15 - len(num) - int(exponent * 3 / 10) - 1 < 0` digits of room (1Pi, 100Ti), or past int64."""
    if text == "0":
        return False
    match = _GO_QUANTITY.fullmatch(text)
    if match is None:
        return True
    num, denom, suffix = match["num"] or "0", match["denom"] or "", match["suffix"]
    if suffix in _GO_BINARY:
        exponent = _GO_BINARY[suffix]
        if denom or 15 - len(num) - int(exponent * 3 / 10) - 1 < 0:
            return True
        return not -(2**63) <= int(num) << exponent < 2**63
    if suffix in _GO_DECIMAL:
        exponent = _GO_DECIMAL[suffix]
    elif suffix[:1] in ("e", "E"):
        exponent = int(suffix[1:])
    else:
        return True
    if 18 - (len(num) + len(denom)) < 0 or exponent - len(denom) < -9:
        return True
    return int(num + denom) >= 2**63


def has_limit(container: Mapping[str, Any], resource: str) -> bool:
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    return isinstance(limits, Mapping) and resource in limits


GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)
"""What Go's strings.TrimSpace trims (unicode.IsSpace); Python's str.strip also trims \\x1c-\\x1f."""


def go_trim(text: str) -> str:
    return text.strip(GO_SPACE)


def go_upper(text: str) -> str:
    """Go's strings.ToUpper: rune by rune, simple case mapping ('ß' stays 'ß'; Python's is 'SS')."""
    return "".join(upper if len(upper := c.upper()) == 1 else c for c in text)


def check_uuid(annotations: Mapping[str, Any], device_id: str, use_key: str, nouse_key: str) -> bool:
    """pkg/device/devices.go CheckUUID: comma lists, trimmed, exact ids; an empty value is no constraint."""

    def listed(value: Any) -> bool:
        return any(go_trim(part) == device_id for part in str(value).split(","))

    use = annotations.get(use_key) if use_key else None
    if use is not None and go_trim(str(use)) and not listed(use):
        return False
    nouse = annotations.get(nouse_key) if nouse_key else None
    return not (nouse is not None and go_trim(str(nouse)) and listed(nouse))


def check_type(annotations: Mapping[str, Any], card_type: str, use_key: str, nouse_key: str) -> bool:
    """pkg/device/devices.go CheckType: case-insensitive substrings of the card type; empty: no constraint."""
    card = go_upper(card_type)

    def listed(value: Any) -> bool:
        return any(go_trim(t) and go_upper(go_trim(t)) in card for t in str(value).split(","))

    use = annotations.get(use_key) if use_key else None
    if use is not None and go_trim(str(use)) and not listed(use):
        return False
    nouse = annotations.get(nouse_key) if nouse_key else None
    return not (nouse is not None and go_trim(str(nouse)) and listed(nouse))


@functools.lru_cache(maxsize=4096)
def _custom(text: str) -> Mapping[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def custom_info(info: GPUInfo) -> Mapping[str, Any]:
    """The device's `custominfo` (numbers as Go's `map[string]any` holds them: float64), {} for none.
    Do not mutate the result: it is shared."""
    return _custom(info.custom) if info.custom else {}


def custom_text(value: Mapping[str, Any] | None) -> str:
    """`custom_info`'s storage form: canonical JSON, keys sorted; "" for none."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if value else ""


class Vendor:
    """One HAMi backend. The defaults are HAMi's common behaviour; subclasses override what differs."""

    names: VendorNames
    native = False
    """True for NVIDIA, whose Fit, mutation and annotations are the extender's own NVIDIA path."""
    policy_neutral = False
    """HAMi's optional `PolicyNeutralScore` marker (Metax sGPU): `score_node` is "higher is better"
    whatever the policy, and the caller weighs it x10000 under binpack, x-10000 under spread."""
    uses_device_pods = False
    """Its Fit reads `FitContext.device_pods` and `qos_cache` (Metax sGPU's app classes and QoS), which
    the caller builds only for such vendors."""

    def __init__(self, names: VendorNames) -> None:
        self.names = names

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.names.common_word})"

    # --- the node side -------------------------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> tuple[GPUInfo, ...] | None:
        """The node's devices of this vendor (HAMi's GetNodeDevices), None when the node has none of them
        (no inventory at all). Raises `WireFormatError` for an inventory that does not decode."""
        annotations = annotations_of(node)
        raw = annotations.get(self.names.register) if self.names.register else None
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise WireFormatError(self.names.register, "whole value", repr(raw), "is not a string")
        form: Literal["json", "legacy"] = "json" if self.names.inventory is Inventory.JSON else "legacy"
        return decode_node_register(raw, self.names.register, form)

    def node_health(self, node: Mapping[str, Any], now: datetime) -> NodeHealth:
        """HAMi's CheckHealth for this vendor (`now` is the scheduler's local wall clock, naive)."""
        rule = self.names.health
        if rule is HealthRule.ALWAYS:
            return NodeHealth(True, True)
        if rule is HealthRule.CAPACITY:
            return NodeHealth(node_quantity(node, "capacity", self.names.count) > 0, True)
        return handshake_health(node, now, self.names.handshake, self.names.count)

    # --- the pod side --------------------------------------------------------------------------------

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        """MutateAdmission on copies of the container and the pod (the webhook diffs them): by default
        the container asks this vendor when its limits name the count resource."""
        return Admission(has_limit(container, self.names.count))

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        """GenerateResourceRequests; None for a container that does not ask this vendor (HAMi's Nums 0).
        The default is Hygon's: count in 1..int32 from limits, else requests; memory x memoryFactor,
        cores default 100; no memory asks 100 % of a device's memory."""
        names = self.names
        count = as_int64(resource_value(container, names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        memory = 0
        raw_mem = as_int64(resource_value(container, names.memory)) if names.memory else None
        if raw_mem is not None:
            if not 0 <= raw_mem <= INT32_MAX:
                return None
            if names.memory_factor > 1:
                raw_mem *= names.memory_factor
                if raw_mem > INT32_MAX:
                    return None
            memory = raw_mem
        cores = self.default_cores
        raw_cores = as_int64(resource_value(container, names.cores)) if names.cores else None
        if raw_cores is not None:
            if not 0 <= raw_cores <= INT32_MAX:
                return None
            cores = raw_cores
        return DeviceRequest(count, names.common_word, memory, 100 if memory == 0 else 0, cores)

    default_cores = 100
    """Cores a request without the cores resource gets (Hygon 100, Ascend and Iluvatar 0)."""

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        """HAMi's Fit over `devices`, the node's devices of this vendor already in the policy's order
        (HAMi walks them from the end). The default is the common Fit (`standard_fit`)."""
        from hami_control.devices.standard import standard_fit

        return standard_fit(self, devices, request, context)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """The common Fit's type check (`CardTypeMismatch`): the vendor's use/nouse type annotations when it
        has them, else the device's Type must contain the request's (case-insensitive)."""
        names = self.names
        if names.use_type or names.nouse_type:
            return check_type(annotations, device.info.type, names.use_type, names.nouse_type)
        return request.type.upper() in device.info.type.upper()

    def uuid_allowed(self, annotations: Mapping[str, Any], device: GPUUsage) -> bool:
        names = self.names
        return check_uuid(annotations, device.id, names.use_uuid, names.nouse_uuid)

    def extra_reason(
        self, device: GPUUsage, request: DeviceRequest, memreq: int, context: FitContext
    ) -> str | None:
        """The common Fit's vendor step between the mutex check and memory (Cambricon's quota); None: pass."""
        return None

    def slice_type(self, device: GPUUsage, request: DeviceRequest) -> str:
        """The Type written for a chosen device in the pod annotation: the request's (the common word);
        AMD and Metax sGPU write the device's own Type."""
        return request.type

    def add_usage(
        self, device: GPUUsage, picked: GPUSlice, custom: Mapping[str, Any] | None = None
    ) -> GPUUsage:
        """AddResourceUsage: one more task, its memory and cores (`custom`: what Fit recorded beside the
        slice, `Picked.custom`)."""
        return device.plus(1, picked.usedmem, picked.usedcores)

    def pod_annotations(
        self,
        pod: Mapping[str, Any],
        devices: PodAllocation,
        *,
        node: str,
        now: datetime,
        custom: Sequence[Sequence[Mapping[str, Any]]] = (),
    ) -> dict[str, str]:
        """PatchAnnotations: what the pod gets written for its devices of this vendor (`devices`: one
        entry per container, init containers first; `custom`: `Picked.custom` per container). The
        default writes the pod device string under `to_allocate` and `allocated`. `now` is aware."""
        if not any(len(c) for c in devices.containers):
            return {}
        text = encode_pod_allocation(devices)
        out = {}
        if self.names.to_allocate:
            out[self.names.to_allocate] = text
        if self.names.allocated:
            out[self.names.allocated] = text
        return out

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
    ) -> float:
        """ScoreNode: an extra node score added to the generic one (0 for most vendors)."""
        return 0.0

    def placement_expectations(
        self, pod: Mapping[str, Any], devices: PodAllocation, custom: Sequence[Sequence[Mapping[str, Any]]]
    ) -> dict[str, str]:
        """What the scheduler expects of its devices once this placement is written, by device id
        (Metax sGPU's QoS policy, HAMi's JitteryQosCache), kept by the caller until the inventory shows it
        (`settled_expectations`); {} for most vendors."""
        return {}

    def settled_expectations(self, expected: Mapping[str, str], devices: Sequence[GPUInfo]) -> dict[str, str]:
        """`expected` without what a node's fresh inventory (`devices`) now reports as expected."""
        return dict(expected)


def handshake_health(node: Mapping[str, Any], now: datetime, key: str, count_resource: str) -> NodeHealth:
    """pkg/device/devices.go CheckHealth: a `Requesting_<local time>` younger than 60 s is still awaited;
    an older one means the plugin is gone unless the node still has allocatable devices; anything else
    (the plugin's `Reported ...`, or nothing) registers the node at once and is answered with a fresh
    `Requesting_<now>` (a value that is not a HAMi time counts as awaited, as Go's parse error does)."""
    value = annotations_of(node).get(key) if key else None
    text = value if isinstance(value, str) else ""
    if "Requesting" in text:
        _, sep, stamp = text.partition("_")
        if not sep:
            return NodeHealth(True, False)
        try:
            at = parse_local_datetime(Where(key), "time", stamp)
        except WireFormatError:
            return NodeHealth(True, False)
        if now.replace(tzinfo=None) < at + HANDSHAKE_FRESH:
            return NodeHealth(True, False)
        return NodeHealth(node_quantity(node, "allocatable", count_resource) > 0, False)
    stamp = now.replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S")
    return NodeHealth(True, True, f"Requesting_{stamp}" if key else None)


__all__ = [
    "DSMLU_LOCK",
    "INT32_MAX",
    "MUTEX_LOCK",
    "Admission",
    "DevicePods",
    "DeviceRequest",
    "FitContext",
    "HealthRule",
    "Inventory",
    "LockKind",
    "NodeHealth",
    "Picked",
    "QuotaEntry",
    "Unfit",
    "Vendor",
    "VendorNames",
    "annotations_of",
    "as_int64",
    "check_type",
    "check_uuid",
    "custom_info",
    "custom_text",
    "gen_reason",
    "handshake_health",
    "has_limit",
    "labels_of",
    "node_quantity",
    "resource_value",
]
