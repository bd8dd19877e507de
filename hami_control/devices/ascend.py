"""Huawei Ascend NPUs (HAMi pkg/device/ascend/device.go and vnpu.go, v2.10.0): one vendor per
`vnpus.configs[]` entry of the device config (the chart lists 910A, 910B2, 910B3, 910B4-1, 910B4, 310P3
and the 910C super pod), each named by its `commonWord` (cw). HAMi builds them only with
`--enable-ascend`; that switch is the registry's.

- Inventory: `hami.io/node-register-<cw>`, a JSON `[]DeviceInfo` (keys case-insensitive); the plugin
  adds `custominfo: {"NetworkID": n}` on the 910 chips. Handshake `hami.io/node-handshake-<cw>`, the
  common CheckHealth on the count resource. The node annotation `hami-vnpu-core: "true"` says the node
  runs the hami-core soft split (else `vnpus.hamiVnpuCore` decides).
- Webhook: the container asks this chip when its limits name `resourceName`; when they do not and
  `overwriteEnv` is set, it gets `ASCEND_VISIBLE_DEVICES` (empty). A 910C super pod takes whole modules
  (two NPUs): a count of 1 becomes 2 (limits, and requests when there), another odd count is refused.
  `-core` is refused unless the pod says `huawei.com/vnpu-mode: hami-core`. The memory limit is kept as
  given in hami-core mode, else raised to the smallest template that holds it (a whole card's
  `memoryAllocatable` past the last template, refused past `memoryCapacity`); several devices must be
  whole cards. The memory is then written to limits and requests, and `runtimeClassName`, when
  configured, to a pod that names none.
- Request: the count in 1..int32 (limits, else requests); memory x `memoryFactor` (when > 1), refused
  when negative or past int32 before or after the factor, 100 % of a device when absent; `-core`
  (Go's `Value()`, rounded up) in 0..int32, default 0.
- Fit: a hami-core pod on a node without hami-core is `ModeNotFit`. Then the common checks, where the
  request's Type must be exactly the cw, the UUID rule is `hami.io/use-<cw>-uuid` /
  `hami.io/no-use-<cw>-uuid`, and a device has 100 cores in hami-core mode. On an `Ascend910*` chip
  whose devices all carry a NetworkID every fitting device is collected, and a request for several gets
  the devices of the largest NetworkID groups first. A 910C request for several NPUs takes only whole
  modules (device index / 2) and is refused with `AllocatedCardsInsufficientRequest` over the count
  asked when they do not add up to it. Where Go breaks ties at random (map order, `sort.Slice`), here
  the group or module holding the device tried first (the policy's best) comes first.
- Score: on `Ascend910*`, 10 x the sum over containers of (largest same-NetworkID share), in float32.
- Pod annotations: `hami.io/<cw>-devices-to-allocate` and `-allocated`, `predicate-time` (Unix
  seconds), and `huawei.com/<cw>`: a JSON list `{"UUID","temp","memory","core"}` per device (empty
  members left out; no template name in hami-core mode). Node lock `hami.io/mutex.lock`.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from hami_api._wire import go_json_string
from hami_api.quantity import canonical_quantity, parse_quantity, quantity_value
from hami_api.types import GPUSlice, PodAllocation
from hami_control.devices.base import (
    INT32_MAX,
    INT64_MAX,
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
    resource_value,
)
from hami_control.devices.config import DeviceConfig, Section
from hami_control.devices.standard import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    MODE_NOT_FIT,
    capacity_reason,
    request_memory,
    slot_reason,
)
from hami_control.usage import GPUUsage

FAMILY = "ascend"
ASCEND_910_PREFIX = "Ascend910"
ASCEND_910C = "Ascend910C"
NETWORK_WEIGHT = 10
NETWORK_ID = "NetworkID"
"""The `custominfo` key the Ascend plugin writes on 910 chips (the HCCS network a device is on)."""
NPUS_PER_MODULE = 2
"""A 910C module holds two NPUs: device index / 2 names the module."""
VNPU_MODE = "huawei.com/vnpu-mode"
HAMI_CORE = "hami-core"
NODE_VNPU_CORE = "hami-vnpu-core"
"""Node annotation: "true" when the node runs the hami-core soft split (it overrides `hamiVnpuCore`)."""
VISIBLE_DEVICES_ENV = "ASCEND_VISIBLE_DEVICES"
PREDICATE_TIME = "predicate-time"
HAMI_CORE_CORES = 100
"""A device's cores in hami-core mode (HAMi's effectiveTotalCore)."""
IGNORED_KEYS = frozenset({"topologyPairs"})
"""Keys of a configs[] entry that HAMi's own tests write and no HAMi version reads."""
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LONGEST_KEY = "{}-devices-to-allocate"
"""The longest annotation name made from the cw: it must stay a valid annotation key name (<= 63)."""


@dataclass(frozen=True, slots=True)
class Template:
    """One vNPU template of a chip (vnpu.go `Template`): memory in MiB, AI cores and AI CPUs."""

    name: str
    memory: int
    ai_core: int = 0
    ai_cpu: int = 0


@dataclass(frozen=True, slots=True)
class VNPUConfig:
    """One `vnpus.configs[]` entry (vnpu.go `VNPUConfig`); `templates` sorted by memory (stably)."""

    common_word: str
    resource_name: str
    resource_memory_name: str
    resource_core_name: str = ""
    chip_name: str = ""
    memory_allocatable: int = 0
    memory_capacity: int = 0
    memory_factor: int = 0
    ai_core: int = 0
    ai_cpu: int = 0
    runtime_class_name: str = ""
    overwrite_env: bool = False
    templates: tuple[Template, ...] = ()
    super_pod: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", tuple(sorted(self.templates, key=lambda t: t.memory)))

    def trim_memory(self, mib: int) -> tuple[int, str]:
        """HAMi's trimMemory: the smallest template holding `mib` (memory, name), else a whole card's
        allocatable memory while `mib` fits its capacity (name ""), else (0, "")."""
        for template in self.templates:
            if mib <= template.memory:
                return template.memory, template.name
        if mib <= self.memory_capacity:
            return self.memory_allocatable, ""
        return 0, ""


def names(config: VNPUConfig) -> VendorNames:
    cw = config.common_word
    return VendorNames(
        common_word=cw,
        family=FAMILY,
        count=config.resource_name,
        memory=config.resource_memory_name,
        cores=config.resource_core_name,
        memory_factor=config.memory_factor,
        to_allocate=f"hami.io/{cw}-devices-to-allocate",
        allocated=f"hami.io/{cw}-devices-allocated",
        register=f"hami.io/node-register-{cw}",
        inventory=Inventory.JSON,
        handshake=f"hami.io/node-handshake-{cw}",
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid=f"hami.io/use-{cw}-uuid",
        nouse_uuid=f"hami.io/no-use-{cw}-uuid",
        runtime_class=config.runtime_class_name,
    )


def _resources(container: MutableMapping[str, Any], section: str) -> MutableMapping[str, Any] | None:
    resources = container.get("resources")
    values = resources.get(section) if isinstance(resources, Mapping) else None
    return values if isinstance(values, MutableMapping) else None


def _value(raw: Any) -> int | None:
    """Go's `Quantity.Value()` (rounded up, away from zero), None for what is not a quantity."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return quantity_value(raw)
    except ValueError:
        return None


def _negative(raw: Any) -> bool:
    """Go's `Quantity.Sign() < 0` (False for what is not a quantity)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return False
    try:
        return parse_quantity(raw) < 0
    except ValueError:
        return False


def _f32(value: float) -> float:
    """`value` rounded to a float32, as Go's float32 arithmetic keeps it."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


class Ascend(Vendor):
    """HAMi's ascend `Devices`, one per configured chip (see the module docstring)."""

    default_cores = 0

    def __init__(self, config: VNPUConfig, hami_vnpu_core: bool = False) -> None:
        super().__init__(names(config))
        self.config = config
        self.hami_vnpu_core = hami_vnpu_core
        """`vnpus.hamiVnpuCore`: whether a node without the `hami-vnpu-core` annotation runs hami-core."""

    # --- the pod side --------------------------------------------------------------------------------

    def mutate(self, container: MutableMapping[str, Any], pod: MutableMapping[str, Any]) -> Admission:
        names, config = self.names, self.config
        limits = _resources(container, "limits")
        if limits is None or names.count not in limits:
            env = container.get("env")
            if config.overwrite_env and (env is None or isinstance(env, list)):
                entries: list[Any] = env if env is not None else []
                entries.append({"name": VISIBLE_DEVICES_ENV})  # Go's EnvVar{Value: ""} (omitempty)
                container["env"] = entries
            return Admission(False)
        count = _value(limits[names.count])
        if count is None:
            return Admission(True, f"{names.count} {limits[names.count]!r} is not a valid quantity")
        if config.common_word == ASCEND_910C and config.super_pod:
            if count == 1:  # one module, two NPUs: the smallest unit a 910C super pod gives
                limits[names.count] = "2"
                requests = _resources(container, "requests")
                if requests is not None and names.count in requests:
                    requests[names.count] = "2"
            elif count % 2 != 0:
                return Admission(False, f"Ascend910C device request must be 1 or 2*n, got {count}")
        hami_core = annotations_of(pod).get(VNPU_MODE) == HAMI_CORE
        if not hami_core and names.cores:
            raw_cores = resource_value(container, names.cores)
            cores = _value(raw_cores) if raw_cores is not None else None
            if cores is not None and cores > 0:
                return Admission(False, f"{names.cores} is only supported in hami-core (soft split) mode")
        trimmed = config.memory_allocatable
        if names.memory and names.memory in limits:
            memory = _value(limits[names.memory])
            if memory is None:
                return Admission(False, f"{names.memory} {limits[names.memory]!r} is invalid")
            if hami_core:
                trimmed = memory
            else:
                trimmed, _ = config.trim_memory(memory)
                if trimmed <= 0:
                    return Admission(False, f"{names.memory} {memory} is invalid")
        if count > 1 and not hami_core and trimmed != config.memory_allocatable:
            return Admission(True, "vNPU not supported for multiple devices")
        if names.memory:
            text = canonical_quantity(str(trimmed))
            limits[names.memory] = text
            resources = container["resources"]
            requests = _resources(container, "requests")
            if requests is None:
                requests = resources["requests"] = {}
            requests[names.memory] = text
        spec = pod.get("spec")
        named = isinstance(spec, MutableMapping) and spec.get("runtimeClassName") is not None
        if config.runtime_class_name and isinstance(spec, MutableMapping) and not named:
            spec["runtimeClassName"] = config.runtime_class_name
        return Admission(True)

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        names = self.names
        count = as_int64(resource_value(container, names.count))
        if count is None or not 0 < count <= INT32_MAX:
            return None
        memory = 0
        raw_memory = resource_value(container, names.memory) if names.memory else None
        if raw_memory is not None:
            if _negative(raw_memory):
                return None
            whole = as_int64(raw_memory)
            if whole is not None:  # a value AsInt64 cannot give (1.5, 100m) counts as none, as in Go
                if whole > INT32_MAX:  # memory is in MiB: 16Gi is a unit mistake
                    return None
                if names.memory_factor > 1:
                    whole *= names.memory_factor
                    if whole > INT32_MAX:
                        return None
                memory = whole
        cores = 0
        raw_cores = resource_value(container, names.cores) if names.cores else None
        if raw_cores is not None:
            value = _value(raw_cores)
            if value is None or not 0 <= value <= INT32_MAX:
                return None
            cores = value
        return DeviceRequest(count, names.common_word, memory, 100 if memory == 0 else 0, cores)

    def type_allowed(self, annotations: Mapping[str, Any], device: GPUUsage, request: DeviceRequest) -> bool:
        """HAMi's checkType here compares the request's Type with the cw, exactly."""
        return request.type == self.names.common_word

    def node_runs_hami_core(self, node: Mapping[str, Any]) -> bool:
        """The node annotation `hami-vnpu-core` ("true" or not) when present, else `hamiVnpuCore`."""
        value = annotations_of(node).get(NODE_VNPU_CORE)
        return self.hami_vnpu_core if value is None else value == "true"

    def fit(self, devices: Sequence[GPUUsage], request: DeviceRequest, context: FitContext) -> Picked | Unfit:
        hami_core = context.annotations.get(VNPU_MODE) == HAMI_CORE
        if hami_core and not self.node_runs_hami_core(context.node):
            return Unfit({MODE_NOT_FIT: 1}, len(devices))
        topology = self.names.common_word.startswith(ASCEND_910_PREFIX) and all(
            NETWORK_ID in custom_info(d.info) for d in devices
        )
        modules = request.type == ASCEND_910C and request.nums > 1
        collect = topology or modules  # then every fitting device is a candidate
        reasons: dict[str, int] = {}
        found: list[tuple[GPUUsage, GPUSlice]] = []
        cores = min(request.coresreq, 100)
        for device in reversed(devices):
            memreq = request_memory(device, request)
            reason = slot_reason(self, device, request, context)
            if reason is None:
                counted = device
                if hami_core:
                    counted = replace(device, info=replace(device.info, devcore=HAMI_CORE_CORES))
                reason = capacity_reason(counted, memreq, cores)
            if reason is not None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            found.append((device, GPUSlice(device.id, memreq, cores, request.type)))
            if not collect and len(found) == request.nums:
                return Picked(tuple(s for _, s in found))
        if modules:
            chosen = _whole_modules(found, request.nums)
            if len(chosen) != request.nums:
                reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(chosen)
                return Unfit(reasons, request.nums)
            return Picked(chosen)
        if topology and len(found) >= request.nums:
            if len(found) == request.nums:
                return Picked(tuple(s for _, s in found))
            if request.nums == 1:
                return Picked((found[0][1],))
            return Picked(_by_network(found, request.nums))
        if found:
            reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(found)
        return Unfit(reasons, len(devices))

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
        if not out:
            return out
        out[PREDICATE_TIME] = str(math.floor(now.timestamp()))
        hami_core = annotations_of(pod).get(VNPU_MODE) == HAMI_CORE
        entries = [
            self._runtime_info(piece, hami_core) for container in devices.containers for piece in container
        ]
        out[f"huawei.com/{self.names.common_word}"] = "[" + ",".join(entries) + "]"
        return out

    def _runtime_info(self, piece: GPUSlice, hami_core: bool) -> str:
        """Go's json.Marshal of RuntimeInfo{UUID, Temp, Memory, Core}, every member omitempty."""
        template = "" if hami_core else self.config.trim_memory(piece.usedmem)[1]
        members = []
        if piece.uuid:
            members.append(f'"UUID":{go_json_string(piece.uuid)}')
        if template:
            members.append(f'"temp":{go_json_string(template)}')
        if piece.usedmem:
            members.append(f'"memory":{piece.usedmem}')
        if piece.usedcores:
            members.append(f'"core":{piece.usedcores}')
        return "{" + ",".join(members) + "}"

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: PodAllocation,
        previous: Sequence[GPUUsage],
        policy: str,
    ) -> float:
        """ScoreNode: on `Ascend910*`, per container the largest share of its devices on one NetworkID,
        summed and weighted 10, in float32; 0 as soon as a chosen device has no NetworkID (a NetworkID
        that is not a number is not counted). The devices' NetworkIDs are read from `previous` (the
        node's devices), where HAMi reads the copy Fit made of them."""
        if not self.names.common_word.startswith(ASCEND_910_PREFIX):
            return 0.0
        customs = {usage.id: custom_info(usage.info) for usage in previous}
        score = 0.0
        for container in devices.containers:
            counts: dict[int, int] = {}
            for piece in container:
                custom = customs.get(piece.uuid)
                if not custom or NETWORK_ID not in custom:
                    return 0.0
                network = _network(custom)
                if network is not None:
                    counts[network] = counts.get(network, 0) + 1
            total = sum(counts.values())
            if total:
                score = _f32(score + _f32(max(counts.values()) / total))
        return _f32(score * NETWORK_WEIGHT)


def _network(custom: Mapping[str, Any]) -> int | None:
    """The NetworkID as Go's `int(v.(float64))`; None when it is not a number."""
    value = custom.get(NETWORK_ID)
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    return int(value)


def _by_network(found: Sequence[tuple[GPUUsage, GPUSlice]], nums: int) -> tuple[GPUSlice, ...]:
    """computeBestCombination: the candidates grouped by NetworkID, the largest group first (equal
    groups in the order their first device was tried; Go's order is random), `nums` of them. A
    candidate whose NetworkID is not a number, which Go leaves out (and then gives fewer devices than
    asked), comes after the groups here."""
    groups: dict[int, list[GPUSlice]] = {}
    rest: list[GPUSlice] = []
    for device, piece in found:
        network = _network(custom_info(device.info))
        if network is None:
            rest.append(piece)
        else:
            groups.setdefault(network, []).append(piece)
    ordered = sorted(groups.values(), key=len, reverse=True)  # stable: first tried first among equals
    return tuple([piece for group in ordered for piece in group] + rest)[:nums]


def _whole_modules(found: Sequence[tuple[GPUUsage, GPUSlice]], nums: int) -> tuple[GPUSlice, ...]:
    """computeBestCombination910C: the candidates by module (device index / 2), whole modules only,
    taken until `nums` NPUs are reached or passed (so an odd `nums` never matches). The modules come in
    the order their first device was tried (Go's order among whole modules is random)."""
    modules: dict[int, list[GPUSlice]] = {}
    for device, piece in found:
        modules.setdefault(device.info.index // NPUS_PER_MODULE, []).append(piece)
    chosen: list[GPUSlice] = []
    for module in modules.values():
        if len(chosen) >= nums:
            break
        if len(module) == NPUS_PER_MODULE:
            chosen.extend(module)
    return tuple(chosen)


# --- the device config -------------------------------------------------------------------------------


def _required(section: Section, key: str) -> str:
    value = section.text(key)
    if not value.strip():
        raise section.fail(key, "is required", value if section.has(key) else None)
    return value


def _common_word(section: Section, taken: Mapping[str, int]) -> str:
    cw = _required(section, "commonWord")
    if _NAME_PART.fullmatch(cw) is None or len(_LONGEST_KEY.format(cw)) > 63:
        raise section.fail(
            "commonWord",
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit, "
            f"at most {63 - len(_LONGEST_KEY.format(''))} characters (it is part of annotation keys)",
            cw,
        )
    if cw in taken:
        raise section.fail("commonWord", f"is already used by vnpus.configs[{taken[cw]}]", cw)
    return cw


def _template(section: Section) -> Template:
    template = Template(
        name=_required(section, "name"),
        memory=section.integer("memory", 0, low=0, high=INT64_MAX),
        ai_core=section.integer("aiCore", 0, low=0, high=INT32_MAX),
        ai_cpu=section.integer("aiCPU", 0, low=0, high=INT32_MAX),
    )
    section.finish()
    return template


def _chip(section: Section, taken: Mapping[str, int]) -> VNPUConfig:
    section.ignored = IGNORED_KEYS
    config = VNPUConfig(
        common_word=_common_word(section, taken),
        chip_name=section.text("chipName"),
        resource_name=_required(section, "resourceName"),
        resource_memory_name=_required(section, "resourceMemoryName"),
        resource_core_name=section.text("resourceCoreName"),
        memory_allocatable=section.integer("memoryAllocatable", 0, low=0, high=INT64_MAX),
        memory_capacity=section.integer("memoryCapacity", 0, low=0, high=INT64_MAX),
        memory_factor=section.integer("memoryFactor", 0, low=0, high=INT32_MAX),
        ai_core=section.integer("aiCore", 0, low=0, high=INT32_MAX),
        ai_cpu=section.integer("aiCPU", 0, low=0, high=INT32_MAX),
        runtime_class_name=section.text("runtimeClassName"),
        overwrite_env=section.boolean("overwriteEnv"),
        templates=tuple(_template(t) for t in section.sections("templates")),
        super_pod=section.boolean("superPod"),
    )
    section.finish()
    return config


def build(config: DeviceConfig) -> tuple[Vendor, ...]:
    """From the `vnpus` section (VNPUs: hamiVnpuCore, configs[] of VNPUConfig: chipName, commonWord,
    resourceName, resourceMemoryName, resourceCoreName, memoryAllocatable, memoryCapacity, memoryFactor,
    aiCore, aiCPU, runtimeClassName, overwriteEnv, superPod, templates[] of name, memory, aiCore,
    aiCPU), one vendor per entry, in order."""
    section = config.section("vnpus")
    hami_vnpu_core = section.boolean("hamiVnpuCore")
    vendors: list[Vendor] = []
    taken: dict[str, int] = {}
    for i, entry in enumerate(section.sections("configs")):
        chip = _chip(entry, taken)
        taken[chip.common_word] = i
        vendors.append(Ascend(chip, hami_vnpu_core))
    section.finish()
    return tuple(vendors)


__all__ = [
    "ASCEND_910C",
    "ASCEND_910_PREFIX",
    "FAMILY",
    "HAMI_CORE",
    "NETWORK_ID",
    "NODE_VNPU_CORE",
    "PREDICATE_TIME",
    "VISIBLE_DEVICES_ENV",
    "VNPU_MODE",
    "Ascend",
    "Template",
    "VNPUConfig",
    "build",
    "names",
]
