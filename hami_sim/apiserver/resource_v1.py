"""kube-apiserver's rules for `resource.k8s.io/v1` (DeviceClass, ResourceSlice, ResourceClaim,
ResourceClaimTemplate): defaulting, the validation the rest of the project relies on, and the fields a
disabled feature gate drops.

Sources (kubernetes/kubernetes): `pkg/apis/resource/validation/validation.go` (limits, names, capacity
request policies, immutable specs, the status rules), `pkg/apis/resource/v1/defaults.go`
(`allocationMode: ExactCount`, `count: 1`, toleration operator `Equal`), and each resource's
`pkg/registry/resource/*/strategy.go` (`PrepareForCreate` resets a claim's status; `dropDisabledFields`
removes the fields of a disabled gate unless the stored object already uses them). Limits are
`k8s.io/api/resource/v1/types.go`'s constants.

Pure: functions over the decoded JSON. A violation raises the API server's 422 with the field path and
value, as `field.ErrorList` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity
from hami_sim.apiserver.errors import invalid

JSON = dict[str, Any]
Cause = tuple[str, str, str]

GROUP = "resource.k8s.io"

# types.go limits
RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64
DEVICE_TAINTS_MAX_LENGTH = 16
DEVICE_REQUESTS_MAX_SIZE = 32
DEVICE_CONSTRAINTS_MAX_SIZE = 32
DEVICE_CONFIG_MAX_SIZE = 32
DEVICE_SELECTORS_MAX_SIZE = 32
FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE = 8
DEVICE_TOLERATIONS_MAX_LENGTH = 16
ALLOCATION_RESULTS_MAX_SIZE = 32
RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE = 256
CEL_SELECTOR_EXPRESSION_MAX_LENGTH = 10 * 1024
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024
DRIVER_NAME_MAX_LENGTH = 63
POOL_NAME_MAX_LENGTH = 253
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
VALID_VALUES_MAX_SIZE = 10
RESOURCE_SLICE_MAX_COUNTER_SETS = 8
RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET = 32
RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE = 2
RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION = 32

FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer kube-scheduler adds to a claim before it writes the allocation (KEP-4381)."""

CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DEVICE_TAINTS = "DRADeviceTaints"
PRIORITIZED_LIST = "DRAPrioritizedList"
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"

DEFAULT_GATES: Mapping[str, bool] = {
    CONSUMABLE_CAPACITY: True,
    DEVICE_TAINTS: True,
    PARTITIONABLE_DEVICES: True,
    PRIORITIZED_LIST: True,
}
"""kube-apiserver 1.36's defaults (`pkg/features/kube_features.go`): consumable capacity and device taints
beta and on, the prioritized list (`firstAvailable`) beta and on, partitionable devices (KEP-4815:
`sharedCounters`, `consumesCounters`) beta and on since 1.36 (alpha, off, in 1.33 to 1.35)."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
_TOLERATION_OPERATORS = ("Exists", "Equal")


@dataclass(frozen=True, slots=True)
class FeatureGates:
    """The gates of the local API server that change what `resource.k8s.io/v1` stores."""

    enabled: Mapping[str, bool]

    def __call__(self, name: str) -> bool:
        return bool(self.enabled.get(name, DEFAULT_GATES.get(name, False)))

    @classmethod
    def parse(cls, text: str) -> FeatureGates:
        """kube's `--feature-gates` syntax: `A=true,B=false`. Unknown names are an error, as kube's."""
        gates = dict(DEFAULT_GATES)
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep or value.lower() not in ("true", "false"):
                raise ValueError(f"--feature-gates: {part!r}: expected NAME=true|false")
            if name not in DEFAULT_GATES:
                known = ", ".join(sorted(DEFAULT_GATES))
                raise ValueError(f"--feature-gates: unrecognized feature gate {name!r} (known: {known})")
            gates[name] = value.lower() == "true"
        return cls(gates)


DEFAULT_FEATURE_GATES = FeatureGates(DEFAULT_GATES)


def _q(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


class _Causes:
    def __init__(self) -> None:
        self.items: list[Cause] = []

    def required(self, path: str, detail: str = "") -> None:
        self.items.append((path, "Required value", detail))

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.items.append((path, "Invalid value", f"{_q(value)}: {detail}"))

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append((path, "Forbidden", detail))

    def duplicate(self, path: str, value: Any) -> None:
        self.items.append((path, "Duplicate value", _q(value)))

    def unsupported(self, path: str, value: Any, supported: Iterable[str]) -> None:
        values = ", ".join(f'"{s}"' for s in supported)
        self.items.append((path, "Unsupported value", f"{_q(value)}: supported values: {values}"))

    def too_many(self, path: str, got: int, limit: int) -> None:
        self.items.append((path, "Too many", f"{got}: must have at most {limit} items"))


def _list(value: Any, path: str, causes: _Causes) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        causes.invalid(path, value, "must be a list")
        return []
    return value


def _obj(value: Any, path: str, causes: _Causes) -> JSON:
    if value is None:
        return {}
    if not isinstance(value, dict):
        causes.invalid(path, value, "must be an object")
        return {}
    return value


def _dns_label(value: Any, path: str, causes: _Causes) -> None:
    if not isinstance(value, str) or not value:
        causes.required(path)
    elif len(value) > 63 or not _DNS_LABEL.match(value):
        causes.invalid(
            path,
            value,
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character",
        )


def _dns_subdomain(value: Any, path: str, causes: _Causes, max_len: int = 253) -> None:
    if not isinstance(value, str) or not value:
        causes.required(path)
    elif len(value) > max_len:
        causes.items.append((path, "Too long", f"may not be more than {max_len} bytes"))
    elif not _DNS_SUBDOMAIN.match(value):
        causes.invalid(
            path,
            value,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character",
        )


def _qualified_name(value: Any, path: str, causes: _Causes) -> None:
    """`[<domain>/]<C identifier>`: domain a DNS subdomain <= 63, identifier <= 32 (validation.go)."""
    if not isinstance(value, str) or not value:
        causes.required(path)
        return
    domain, sep, ident = value.rpartition("/")
    if sep:
        _dns_subdomain(domain, path, causes, DEVICE_MAX_DOMAIN_LENGTH)
    if len(ident) > DEVICE_MAX_ID_LENGTH or not _C_IDENTIFIER.match(ident):
        causes.invalid(
            path, value, "a C identifier of at most 32 characters, optionally prefixed by a domain and '/'"
        )


def _quantity(value: Any, path: str, causes: _Causes) -> int | None:
    try:
        q = parse_quantity(value)
    except QuantityError:
        causes.invalid(path, value, "must be a quantity")
        return None
    return int(q) if q.denominator == 1 else None


def _unique_names(items: list[Any], path: str, causes: _Causes, *, label: bool = True) -> set[str]:
    seen: set[str] = set()
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if label:
            _dns_label(name, f"{path}[{i}].name", causes)
        if isinstance(name, str) and name:
            if name in seen:
                causes.duplicate(f"{path}[{i}].name", name)
            seen.add(name)
    return seen


# --- DeviceClass ---------------------------------------------------------------------------------


def _selectors(value: Any, path: str, causes: _Causes) -> None:
    selectors = _list(value, path, causes)
    if len(selectors) > DEVICE_SELECTORS_MAX_SIZE:
        causes.too_many(path, len(selectors), DEVICE_SELECTORS_MAX_SIZE)
    for i, sel in enumerate(selectors):
        cel = _obj(_obj(sel, f"{path}[{i}]", causes).get("cel"), f"{path}[{i}].cel", causes)
        if not cel:
            causes.required(f"{path}[{i}].cel")
            continue
        expr = cel.get("expression")
        if not isinstance(expr, str) or not expr.strip():
            causes.required(f"{path}[{i}].cel.expression")
        elif len(expr) > CEL_SELECTOR_EXPRESSION_MAX_LENGTH:
            causes.items.append(
                (
                    f"{path}[{i}].cel.expression",
                    "Too long",
                    f"may not be more than {CEL_SELECTOR_EXPRESSION_MAX_LENGTH} bytes",
                )
            )


def _opaque_configs(value: Any, path: str, causes: _Causes, request_names: set[str] | None) -> None:
    configs = _list(value, path, causes)
    if len(configs) > DEVICE_CONFIG_MAX_SIZE:
        causes.too_many(path, len(configs), DEVICE_CONFIG_MAX_SIZE)
    for i, raw_cfg in enumerate(configs):
        cfg = _obj(raw_cfg, f"{path}[{i}]", causes)
        opaque = _obj(cfg.get("opaque"), f"{path}[{i}].opaque", causes)
        if not opaque:
            causes.required(f"{path}[{i}].opaque")
            continue
        _dns_subdomain(opaque.get("driver"), f"{path}[{i}].opaque.driver", causes, DRIVER_NAME_MAX_LENGTH)
        if not isinstance(opaque.get("parameters"), dict):
            causes.required(f"{path}[{i}].opaque.parameters", "must be a JSON object")
        if request_names is not None:
            for j, req in enumerate(_list(cfg.get("requests"), f"{path}[{i}].requests", causes)):
                if str(req).split("/")[0] not in request_names:
                    causes.invalid(
                        f"{path}[{i}].requests[{j}]", req, "must be the name of a request in the claim"
                    )


def validate_device_class(body: JSON) -> list[Cause]:
    causes = _Causes()
    spec = _obj(body.get("spec"), "spec", causes)
    _selectors(spec.get("selectors"), "spec.selectors", causes)
    _opaque_configs(spec.get("config"), "spec.config", causes, None)
    ext = spec.get("extendedResourceName")
    if ext is not None and (not isinstance(ext, str) or "/" not in ext):
        causes.invalid("spec.extendedResourceName", ext, "must be a valid extended resource name")
    return causes.items


# --- ResourceSlice -------------------------------------------------------------------------------


def _attribute(value: Any, path: str, causes: _Causes) -> None:
    attr = _obj(value, path, causes)
    kinds = [k for k in ("int", "bool", "string", "version") if k in attr]
    if len(kinds) != 1:
        causes.invalid(path, attr, "exactly one value must be specified")
        return
    v = attr[kinds[0]]
    if kinds[0] == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        causes.invalid(f"{path}.int", v, "must be an integer")
    elif kinds[0] == "bool" and not isinstance(v, bool):
        causes.invalid(f"{path}.bool", v, "must be a boolean")
    elif kinds[0] in ("string", "version"):
        if not isinstance(v, str):
            causes.invalid(f"{path}.{kinds[0]}", v, "must be a string")
        elif len(v) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
            causes.items.append(
                (
                    f"{path}.{kinds[0]}",
                    "Too long",
                    f"may not be more than {DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH} bytes",
                )
            )
        elif kinds[0] == "version" and not _SEMVER.match(v):
            causes.invalid(f"{path}.version", v, "must be a string compatible with semver.org spec 2.0.0")


def _request_policy(policy: JSON, value: int | None, path: str, causes: _Causes) -> None:
    default = policy.get("default")
    default_v = _quantity(default, f"{path}.default", causes) if default is not None else None
    rng = policy.get("validRange")
    values = policy.get("validValues")
    if rng is not None and values is not None:
        causes.forbidden(path, "exactly one of `validValues` or `validRange` may be set")
    if isinstance(rng, dict):
        lo = _quantity(rng.get("min"), f"{path}.validRange.min", causes) if "min" in rng else None
        if lo is None and "min" not in rng:
            causes.required(f"{path}.validRange.min")
        hi = _quantity(rng["max"], f"{path}.validRange.max", causes) if rng.get("max") is not None else None
        step = (
            _quantity(rng["step"], f"{path}.validRange.step", causes) if rng.get("step") is not None else None
        )
        if default is None:
            causes.required(f"{path}.default", "required when validRange is set")
        if lo is not None:
            if default_v is not None and default_v < lo:
                causes.invalid(f"{path}.default", default, "must be within validRange")
            if hi is not None and hi < lo:
                causes.invalid(
                    f"{path}.validRange.max", rng.get("max"), "must be greater than or equal to min"
                )
            if value is not None and lo > value:
                causes.invalid(
                    f"{path}.validRange.min",
                    rng.get("min"),
                    "must be less than or equal to the capacity value",
                )
            if step is not None and step > 0:
                if default_v is not None and (default_v - lo) % step:
                    causes.invalid(f"{path}.default", default, "must be a multiple of step above min")
                if hi is not None and (hi - lo) % step:
                    causes.invalid(
                        f"{path}.validRange.max", rng.get("max"), "must be a multiple of step above min"
                    )
                if value is not None and lo + step > value:
                    causes.invalid(
                        f"{path}.validRange.step",
                        rng.get("step"),
                        "min + step must not exceed the capacity value",
                    )
        if hi is not None and default_v is not None and default_v > hi:
            causes.invalid(f"{path}.default", default, "must be within validRange")
        if hi is not None and value is not None and hi > value:
            causes.invalid(
                f"{path}.validRange.max", rng.get("max"), "must be less than or equal to the capacity value"
            )
    elif isinstance(values, list):
        if len(values) > VALID_VALUES_MAX_SIZE:
            causes.too_many(f"{path}.validValues", len(values), VALID_VALUES_MAX_SIZE)
        parsed = [_quantity(v, f"{path}.validValues[{i}]", causes) for i, v in enumerate(values)]
        ints = [p for p in parsed if p is not None]
        if ints != sorted(set(ints)):
            causes.invalid(
                f"{path}.validValues", values, "must be sorted in ascending order without duplicates"
            )
        if default_v is not None and default_v not in ints:
            causes.invalid(f"{path}.default", default, "must be one of validValues")


def _capacity(name: str, value: Any, path: str, multi: bool, causes: _Causes) -> None:
    cap = _obj(value, path, causes)
    if "value" not in cap:
        causes.required(f"{path}.value")
        return
    v = _quantity(cap["value"], f"{path}.value", causes)
    policy = cap.get("requestPolicy")
    if policy is None:
        return
    if not multi:
        causes.forbidden(f"{path}.requestPolicy", "allowed only when allowMultipleAllocations is true")
        return
    _request_policy(_obj(policy, f"{path}.requestPolicy", causes), v, f"{path}.requestPolicy", causes)


def _taints(value: Any, path: str, causes: _Causes) -> None:
    taints = _list(value, path, causes)
    if len(taints) > DEVICE_TAINTS_MAX_LENGTH:
        causes.too_many(path, len(taints), DEVICE_TAINTS_MAX_LENGTH)
    for i, raw_taint in enumerate(taints):
        taint = _obj(raw_taint, f"{path}[{i}]", causes)
        _qualified_key(taint.get("key"), f"{path}[{i}].key", causes)
        effect = taint.get("effect")
        if effect not in _TAINT_EFFECTS:
            causes.unsupported(f"{path}[{i}].effect", effect, _TAINT_EFFECTS)


def _qualified_key(value: Any, path: str, causes: _Causes) -> None:
    """A label-style key: `[prefix/]name` (taint and toleration keys)."""
    if not isinstance(value, str) or not value:
        causes.required(path)
        return
    prefix, sep, name = value.rpartition("/")
    if sep:
        _dns_subdomain(prefix, path, causes)
    if not name or len(name) > 63 or not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", name):
        causes.invalid(path, value, "name part must consist of alphanumeric characters, '-', '_' or '.'")


def _device(device: Any, path: str, causes: _Causes) -> None:
    device = _obj(device, path, causes)
    attrs = _obj(device.get("attributes"), f"{path}.attributes", causes)
    capacity = _obj(device.get("capacity"), f"{path}.capacity", causes)
    if len(attrs) + len(capacity) > RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        causes.too_many(
            path, len(attrs) + len(capacity), RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE
        )
    for key, attr in attrs.items():
        _qualified_name(key, f"{path}.attributes[{key}]", causes)
        _attribute(attr, f"{path}.attributes[{key}]", causes)
    multi = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        _qualified_name(key, f"{path}.capacity[{key}]", causes)
        _capacity(key, cap, f"{path}.capacity[{key}]", multi, causes)
    _taints(device.get("taints"), f"{path}.taints", causes)
    consumptions = _list(device.get("consumesCounters"), f"{path}.consumesCounters", causes)
    _counter_items(
        consumptions,
        f"{path}.consumesCounters",
        "counterSet",
        causes,
        max_items=RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE,
        max_counters=RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
    )


def _counter_items(
    items: list[Any], path: str, key: str, causes: _Causes, *, max_items: int, max_counters: int
) -> None:
    """A slice's `sharedCounters` (key `name`) or a device's `consumesCounters` (key `counterSet`), as
    validation.go's `validateSet(..., validateCounterSet | validateDeviceCounterConsumption, ...)`: too
    many items short-circuits; each names a DNS label and has 1..max counters whose names are DNS labels
    and whose values are quantities; a name given twice is a duplicate, reported on the name as kube's
    `TestValidateResourceSlice/duplicate-shared-counters` expects. Whether a consumption names a counter
    set of the pool is not checked here: since 1.35 the sets live in another slice of the pool, and
    kube-scheduler's allocator checks it (the pool is then invalid)."""
    if len(items) > max_items:
        causes.too_many(path, len(items), max_items)
        return
    seen: set[str] = set()
    keys: list[str | None] = []
    for i, raw in enumerate(items):
        where = f"{path}[{i}]"
        item = _obj(raw, where, causes)
        name = item.get(key)
        _dns_label(name, f"{where}.{key}", causes)
        keys.append(name if isinstance(name, str) else None)
        counters = _obj(item.get("counters"), f"{where}.counters", causes)
        if not counters:
            causes.required(f"{where}.counters")
        elif len(counters) > max_counters:
            causes.too_many(f"{where}.counters", len(counters), max_counters)
        else:
            for counter, value in counters.items():
                at = f"{where}.counters[{counter}]"
                _dns_label(counter, at, causes)
                counter_value = _obj(value, at, causes)
                if "value" not in counter_value:
                    causes.required(f"{at}.value")
                else:
                    _quantity(counter_value["value"], f"{at}.value", causes)
    for i, name in enumerate(keys):
        if name is None:
            continue
        if name in seen:
            causes.duplicate(f"{path}[{i}].{key}", name)
        seen.add(name)


def validate_resource_slice(body: JSON, old: JSON | None = None) -> list[Cause]:
    causes = _Causes()
    spec = _obj(body.get("spec"), "spec", causes)
    _dns_subdomain(spec.get("driver"), "spec.driver", causes, DRIVER_NAME_MAX_LENGTH)
    pool = _obj(spec.get("pool"), "spec.pool", causes)
    pool_name = pool.get("name")
    if not isinstance(pool_name, str) or not pool_name:
        causes.required("spec.pool.name")
    elif len(pool_name) > POOL_NAME_MAX_LENGTH or not all(
        _DNS_SUBDOMAIN.match(part) for part in pool_name.split("/")
    ):
        causes.invalid(
            "spec.pool.name", pool_name, "must be a sequence of DNS subdomains separated by slashes"
        )
    generation = pool.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        causes.invalid("spec.pool.generation", generation, "must be greater than or equal to 0")
    count = pool.get("resourceSliceCount")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        causes.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
    selectors = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(selectors) != 1:
        causes.invalid(
            "spec",
            "{" + ", ".join(f"`{k}`" for k in selectors) + "}",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )
    if spec.get("nodeName"):
        _dns_subdomain(spec["nodeName"], "spec.nodeName", causes)
    devices = _list(spec.get("devices"), "spec.devices", causes)
    limited = any(isinstance(d, dict) and (d.get("taints") or d.get("consumesCounters")) for d in devices)
    limit = RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else RESOURCE_SLICE_MAX_DEVICES
    if len(devices) > limit:
        causes.too_many("spec.devices", len(devices), limit)
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        causes.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed")
    _unique_names(devices, "spec.devices", causes)
    for i, device in enumerate(devices):
        _device(device, f"spec.devices[{i}]", causes)
    shared = _list(spec.get("sharedCounters"), "spec.sharedCounters", causes)
    _counter_items(
        shared,
        "spec.sharedCounters",
        "name",
        causes,
        max_items=RESOURCE_SLICE_MAX_COUNTER_SETS,
        max_counters=RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
    )
    if old is not None:
        old_spec = old.get("spec") or {}
        for key in ("driver", "nodeName"):
            if old_spec.get(key) != spec.get(key):
                causes.invalid(f"spec.{key}", spec.get(key), "field is immutable")
    return causes.items


# --- ResourceClaim / ResourceClaimTemplate spec ---------------------------------------------------


def _tolerations(value: Any, path: str, causes: _Causes) -> None:
    tolerations = _list(value, path, causes)
    if len(tolerations) > DEVICE_TOLERATIONS_MAX_LENGTH:
        causes.too_many(path, len(tolerations), DEVICE_TOLERATIONS_MAX_LENGTH)
    for i, raw_tol in enumerate(tolerations):
        tol = _obj(raw_tol, f"{path}[{i}]", causes)
        op = tol.get("operator", "Equal")
        if op not in _TOLERATION_OPERATORS:
            causes.unsupported(f"{path}[{i}].operator", op, _TOLERATION_OPERATORS)
        if tol.get("key"):
            _qualified_key(tol["key"], f"{path}[{i}].key", causes)
        elif op != "Exists":
            causes.invalid(f"{path}[{i}].operator", op, "operator must be Exists when `key` is empty")
        if op == "Exists" and tol.get("value"):
            causes.invalid(f"{path}[{i}].operator", op, "a value must be empty when `operator` is 'Exists'")
        effect = tol.get("effect")
        if effect not in (None, "", *_TAINT_EFFECTS):
            causes.unsupported(f"{path}[{i}].effect", effect, _TAINT_EFFECTS)


def _exact_request(req: JSON, path: str, causes: _Causes, *, sub: bool) -> None:
    if not req.get("deviceClassName"):
        causes.required(f"{path}.deviceClassName")
    else:
        _dns_subdomain(req["deviceClassName"], f"{path}.deviceClassName", causes)
    _selectors(req.get("selectors"), f"{path}.selectors", causes)
    mode = req.get("allocationMode", "ExactCount")
    if mode == "ExactCount":
        count = req.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            causes.invalid(f"{path}.count", count, "must be greater than zero")
    elif mode == "All":
        if req.get("count") not in (None, 0):
            causes.invalid(
                f"{path}.count", req.get("count"), "must not be specified when allocationMode is All"
            )
    else:
        causes.unsupported(f"{path}.allocationMode", mode, ("All", "ExactCount"))
    if sub and "adminAccess" in req:
        causes.forbidden(f"{path}.adminAccess", "not supported in a subrequest")
    _tolerations(req.get("tolerations"), f"{path}.tolerations", causes)
    capacity = _obj(req.get("capacity"), f"{path}.capacity", causes)
    for key, q in _obj(capacity.get("requests"), f"{path}.capacity.requests", causes).items():
        _qualified_name(key, f"{path}.capacity.requests[{key}]", causes)
        v = _quantity(q, f"{path}.capacity.requests[{key}]", causes)
        if v is not None and v < 0:
            causes.invalid(f"{path}.capacity.requests[{key}]", q, "must be greater than or equal to 0")


def _requests(value: Any, path: str, causes: _Causes) -> dict[str, set[str]]:
    """Validates the requests; answers request name -> its subrequest names."""
    requests = _list(value, path, causes)
    if len(requests) > DEVICE_REQUESTS_MAX_SIZE:
        causes.too_many(path, len(requests), DEVICE_REQUESTS_MAX_SIZE)
    _unique_names(requests, path, causes)
    names: dict[str, set[str]] = {}
    for i, raw_req in enumerate(requests):
        req = _obj(raw_req, f"{path}[{i}]", causes)
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        subs: set[str] = set()
        if (exactly is None) == (first is None):
            causes.invalid(
                f"{path}[{i}]", req.get("name"), "exactly one of `exactly` or `firstAvailable` is required"
            )
        elif exactly is not None:
            _exact_request(
                _obj(exactly, f"{path}[{i}].exactly", causes), f"{path}[{i}].exactly", causes, sub=False
            )
        else:
            items = _list(first, f"{path}[{i}].firstAvailable", causes)
            if not items:
                causes.required(f"{path}[{i}].firstAvailable")
            if len(items) > FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE:
                causes.too_many(
                    f"{path}[{i}].firstAvailable", len(items), FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE
                )
            subs = _unique_names(items, f"{path}[{i}].firstAvailable", causes)
            for j, item in enumerate(items):
                p = f"{path}[{i}].firstAvailable[{j}]"
                _exact_request(_obj(item, p, causes), p, causes, sub=True)
        if isinstance(req.get("name"), str):
            names[req["name"]] = subs
    return names


def _constraints(value: Any, path: str, causes: _Causes, names: dict[str, set[str]]) -> None:
    constraints = _list(value, path, causes)
    if len(constraints) > DEVICE_CONSTRAINTS_MAX_SIZE:
        causes.too_many(path, len(constraints), DEVICE_CONSTRAINTS_MAX_SIZE)
    for i, raw_con in enumerate(constraints):
        con = _obj(raw_con, f"{path}[{i}]", causes)
        for j, req in enumerate(_list(con.get("requests"), f"{path}[{i}].requests", causes)):
            base, _, sub = str(req).partition("/")
            if base not in names or (sub and sub not in names[base]):
                causes.invalid(
                    f"{path}[{i}].requests[{j}]",
                    req,
                    "must be the name of a request in the claim or the name of a request and a subrequest "
                    "separated by '/'",
                )
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if con.get(k) is not None]
        if len(kinds) != 1:
            causes.required(
                f"{path}[{i}]", "exactly one of `matchAttribute` or `distinctAttribute` is required"
            )
        for k in kinds:
            attr = con[k]
            if isinstance(attr, str) and "/" not in attr:
                causes.invalid(f"{path}[{i}].{k}", attr, "must include a domain")
            else:
                _qualified_name(attr, f"{path}[{i}].{k}", causes)


def _claim_spec_causes(spec: Any, path: str) -> list[Cause]:
    causes = _Causes()
    spec = _obj(spec, path, causes)
    devices = _obj(spec.get("devices"), f"{path}.devices", causes)
    names = _requests(devices.get("requests"), f"{path}.devices.requests", causes)
    _constraints(devices.get("constraints"), f"{path}.devices.constraints", causes, names)
    _opaque_configs(devices.get("config"), f"{path}.devices.config", causes, set(names))
    return causes.items


def validate_claim_spec(body: JSON, path: str = "spec") -> list[Cause]:
    """Validation of a ResourceClaim's spec (or a template's `spec.spec`, with path "spec.spec")."""
    return _claim_spec_causes(
        body.get("spec") if path == "spec" else (body.get("spec") or {}).get("spec"), path
    )


def _default_exact(req: JSON) -> None:
    mode = req.setdefault("allocationMode", "ExactCount")
    if mode == "ExactCount":
        req.setdefault("count", 1)
    for tol in req.get("tolerations") or []:
        if isinstance(tol, dict):
            tol.setdefault("operator", "Equal")


def default_claim_spec(spec: Any) -> None:
    """`pkg/apis/resource/v1/defaults.go`: ExactCount with count 1, tolerations' operator Equal."""
    if not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        if isinstance(req.get("exactly"), dict):
            _default_exact(req["exactly"])
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _default_exact(sub)


# --- ResourceClaim status ------------------------------------------------------------------------


def validate_claim_status(claim: JSON, old: JSON | None) -> list[Cause]:
    causes = _Causes()
    status = _obj(claim.get("status"), "status", causes)
    allocation = status.get("allocation")
    reserved = _list(status.get("reservedFor"), "status.reservedFor", causes)
    if reserved and allocation is None:
        causes.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
    if len(reserved) > RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE:
        causes.too_many("status.reservedFor", len(reserved), RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE)
    uids: set[str] = set()
    for i, raw_ref in enumerate(reserved):
        ref = _obj(raw_ref, f"status.reservedFor[{i}]", causes)
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                causes.required(f"status.reservedFor[{i}].{key}")
        uid = ref.get("uid")
        if isinstance(uid, str) and uid:
            if uid in uids:
                causes.duplicate(f"status.reservedFor[{i}].uid", uid)
            uids.add(uid)
    if isinstance(allocation, dict):
        spec_requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        names: dict[str, set[str]] = {
            r["name"]: {str(s.get("name")) for s in r.get("firstAvailable") or [] if isinstance(s, dict)}
            for r in spec_requests
            if isinstance(r, dict) and isinstance(r.get("name"), str)
        }
        results = _list(
            (allocation.get("devices") or {}).get("results"), "status.allocation.devices.results", causes
        )
        if len(results) > ALLOCATION_RESULTS_MAX_SIZE:
            causes.too_many("status.allocation.devices.results", len(results), ALLOCATION_RESULTS_MAX_SIZE)
        for i, raw_res in enumerate(results):
            p = f"status.allocation.devices.results[{i}]"
            res = _obj(raw_res, p, causes)
            base, _, sub = str(res.get("request", "")).partition("/")
            if base not in names or (sub and sub not in names[base]):
                causes.invalid(
                    f"{p}.request", res.get("request"), "must be the name of a request in the claim"
                )
            _dns_subdomain(res.get("driver"), f"{p}.driver", causes, DRIVER_NAME_MAX_LENGTH)
            if not res.get("pool"):
                causes.required(f"{p}.pool")
            _dns_label(res.get("device"), f"{p}.device", causes)
            for key, q in _obj(res.get("consumedCapacity"), f"{p}.consumedCapacity", causes).items():
                _quantity(q, f"{p}.consumedCapacity[{key}]", causes)
    if old is not None:
        old_alloc = (old.get("status") or {}).get("allocation")
        if old_alloc is not None and allocation is not None and old_alloc != allocation:
            causes.invalid("status.allocation", "...", "field is immutable")
        if old_alloc is not None and allocation is None and reserved:
            causes.forbidden("status.allocation", "may not be cleared while `reservedFor` is not empty")
    return causes.items


# --- feature gates: dropDisabledFields -----------------------------------------------------------


def _requests_use_capacity(spec: Any) -> bool:
    devices = (spec or {}).get("devices") or {} if isinstance(spec, dict) else {}
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        subs = [req.get("exactly"), *(req.get("firstAvailable") or [])]
        if any(isinstance(s, dict) and s.get("capacity") for s in subs):
            return True
    return any(isinstance(c, dict) and "distinctAttribute" in c for c in devices.get("constraints") or [])


def drop_disabled_claim_spec_fields(spec: Any, old_spec: Any, gates: FeatureGates) -> None:
    """Without `DRAConsumableCapacity`, a request's `capacity` and `distinctAttribute` constraints are
    dropped, unless the stored object already uses them
    (`pkg/registry/resource/resourceclaim/strategy.go`)."""
    if gates(CONSUMABLE_CAPACITY) or _requests_use_capacity(old_spec) or not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if isinstance(req, dict):
            for sub in [req.get("exactly"), *(req.get("firstAvailable") or [])]:
                if isinstance(sub, dict):
                    sub.pop("capacity", None)
    for con in devices.get("constraints") or []:
        if isinstance(con, dict):
            con.pop("distinctAttribute", None)


def _slice_uses_consumable(spec: Any) -> bool:
    for dev in (spec or {}).get("devices") or [] if isinstance(spec, dict) else []:
        if isinstance(dev, dict) and (
            "allowMultipleAllocations" in dev
            or any(isinstance(c, dict) and "requestPolicy" in c for c in (dev.get("capacity") or {}).values())
        ):
            return True
    return False


def _slice_uses_partitionable(spec: Any) -> bool:
    """strategy.go's `draPartitionableDevicesFeatureInUse`."""
    if not isinstance(spec, dict):
        return False
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(
        isinstance(dev, dict)
        and (
            dev.get("consumesCounters")
            or any(dev.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes"))
        )
        for dev in spec.get("devices") or []
    )


def drop_disabled_slice_fields(spec: Any, old_spec: Any, gates: FeatureGates) -> None:
    """Without `DRAConsumableCapacity`, `allowMultipleAllocations` and capacities' `requestPolicy` are
    dropped; without `DRADeviceTaints`, devices' `taints`; without `DRAPartitionableDevices`, unless the
    stored slice already uses them, `sharedCounters`, `perDeviceNodeSelection` and devices'
    `consumesCounters`, `nodeName`, `nodeSelector`, `allNodes` (`pkg/registry/resource/resourceslice/
    strategy.go`, `dropDisabledDRAPartitionableDevicesFields`)."""
    if not isinstance(spec, dict):
        return
    if not gates(PARTITIONABLE_DEVICES) and not _slice_uses_partitionable(old_spec):
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        for dev in spec.get("devices") or []:
            if isinstance(dev, dict):
                for key in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
                    dev.pop(key, None)
    drop_consumable = not gates(CONSUMABLE_CAPACITY) and not _slice_uses_consumable(old_spec)
    drop_taints = not gates(DEVICE_TAINTS)
    for dev in spec.get("devices") or []:
        if not isinstance(dev, dict):
            continue
        if drop_consumable:
            dev.pop("allowMultipleAllocations", None)
            for cap in (dev.get("capacity") or {}).values():
                if isinstance(cap, dict):
                    cap.pop("requestPolicy", None)
        if drop_taints:
            dev.pop("taints", None)


def drop_disabled_status_fields(status: Any, old_status: Any, gates: FeatureGates) -> None:
    """Without `DRAConsumableCapacity`, allocation results lose `shareID` and `consumedCapacity`."""
    if gates(CONSUMABLE_CAPACITY) or not isinstance(status, dict):
        return
    old_results = (((old_status or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    if any(isinstance(r, dict) and ("shareID" in r or "consumedCapacity" in r) for r in old_results):
        return
    for res in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
        if isinstance(res, dict):
            res.pop("shareID", None)
            res.pop("consumedCapacity", None)


def raise_if(causes: list[Cause], kind: str, name: str) -> None:
    if causes:
        raise invalid(GROUP, kind, name, causes)
