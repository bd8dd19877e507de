"""HAMi resources -> Dynamic Resource Allocation claims, pure: what the webhook writes into a pod it
translates (`webhook.review_pod(..., translate=True)`) and the ResourceClaimTemplates the pod then needs.

A container that asks `nvidia.com/gpu` (with gpumem, gpumem-percentage, gpucores, after the webhook's
defaults) gets one claim: its `nvidia.com/*` limits and requests are removed, `resources.claims:
[{name: <claim>}]` is added, and `spec.resourceClaims` gets `{name: <claim>, resourceClaimTemplateName:
<template>}`. Templates are kept per namespace, one per distinct ask, never per pod (nothing can leak):

    hami-gpu-<count>x[-<MiB>mi]-<cores>c[-<hash>]

`<MiB>` is left out for a whole GPU's memory, `<hash>` (10 hex digits of SHA-256 over the selectors and
the NUMA constraint) is added when annotations constrain the GPUs. The template's one request `gpu`:

    exactly: {deviceClassName: hami-core-gpu.project-hami.io, allocationMode: ExactCount, count: <n>,
              selectors: [...], capacity: {requests: {memory: <MiB>Mi, cores: "<cores>"}}}
    constraints: [{requests: [gpu], distinctAttribute: hami-core-gpu.project-hami.io/uuid}]  # count > 1

`memory` is left out for a whole GPU: the device's request policy then takes its default, the whole
memory (dra.md §2.1); `cores` is always written, since its default is 100 (a claim that omitted it
would take the whole GPU's compute).

The pod annotations HAMi's scheduler reads become CEL selectors on the device's attributes, with HAMi's
semantics (`hami_api.types.DeviceSelector`):

- `nvidia.com/use-gputype: A100,H100`: the `productName` contains one of them, ignoring ASCII case;
- `nvidia.com/nouse-gputype`: contains none of them;
- `nvidia.com/use-gpuuuid` / `nouse-gpuuuid`: the `uuid` is / is not one of them (exact);
- `nvidia.com/numa-bind: true` with count > 1: `matchAttribute` on `numaNode`;
- `nvidia.com/vgpu-mode` must allow `hami-core` (the only slices the DRA driver serves).

`gpumem-percentage` has no absolute equivalent (a claim asks bytes): it is translated only when the
pod's `use-gputype` picks GPU models of a single memory size among those hami-control knows
(`DRASettings.gpu_memory`); 100 % is the whole GPU and needs no model. Otherwise the pod is denied with
a message that says what to write instead.

The webhook records what it translated in the annotation `hami.io/dra-claims` (`encode_claims`), a JSON
list with one entry per translated container, init containers first:

    [{"container": "main", "claim": "gpu-main", "template": "hami-gpu-1x-4000mi-30c",
      "gpus": 1, "memory": 4000, "cores": 30}]

(`memory` in MiB per GPU, null for the whole GPU's memory; `cores` in percent per GPU). The pod store
counts a translated pod's quota usage from it (`claims_usage`): per entry gpus x memory and gpus x
cores, summed over every entry, init containers included, since a claim stays allocated for the pod's
whole life (the device plugin's init containers hand their GPUs on instead).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from hami_api.annotations import (
    DEVICE_SCORING_WEIGHTS,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    NOUSE_GPU_TYPE,
    NOUSE_GPU_UUID,
    NUMA_BIND,
    USE_GPU_TYPE,
    USE_GPU_UUID,
    VGPU_MODE,
    decode_comma_list,
    decode_numa_bind,
    decode_vgpu_mode,
)
from hami_api.dra import (
    API_VERSION,
    ATTR_NUMA_NODE,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DEVICE_CLASS,
    DRIVER,
    qualified,
)
from hami_api.errors import QuantityError, WireFormatError
from hami_api.quantity import canonical_quantity
from hami_api.resources import ContainerRequest, ResourceNames
from hami_control.quota import QuotaUsage

ANNOTATION: Final = "hami.io/dra-claims"
"""What the webhook translated, per container (see the module docstring)."""

REQUEST: Final = "gpu"
"""The name of the one request of every template."""

TEMPLATE_PREFIX: Final = "hami-gpu-"
CLAIM_PREFIX: Final = "gpu-"

MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "hami-control"
TEMPLATE_LABELS: Final = {MANAGED_BY_LABEL: MANAGED_BY, "app.kubernetes.io/part-of": "hami-py"}
"""The labels of the templates hami-control keeps (its watch selects them by the first)."""
TEMPLATE_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

MAX_DEVICES: Final = 32
"""A claim's allocation holds at most 32 results (resource.k8s.io/v1 `AllocationResultsMaxSize`)."""
CEL_MAX_LENGTH: Final = 10 * 1024
"""The longest CEL selector kube-apiserver accepts (`CELSelectorExpressionMaxLength`)."""
DNS_LABEL_MAX: Final = 63

_HASH_DIGITS = 10
_POLICY_ANNOTATIONS = (NODE_SCHEDULER_POLICY, GPU_SCHEDULER_POLICY, DEVICE_SCORING_WEIGHTS)
_HAMI_CORE_MODE = "hami-core"


class TranslationError(Exception):
    """A pod the webhook cannot translate; the message says why and what to write instead. `invalid`:
    a value that does not parse (422), else a policy (403)."""

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.invalid = invalid


# --- one claim ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPUClaim:
    """What one container asks, as a claim: `gpus` devices, each with `memory` MiB (None: the whole
    GPU's memory) and `cores` percent, on devices the `selectors` admit, on one NUMA node when
    `same_numa` (only meaningful for gpus > 1)."""

    gpus: int
    memory: int | None
    cores: int
    selectors: tuple[str, ...] = ()
    same_numa: bool = False

    @property
    def template_name(self) -> str:
        """`hami-gpu-<count>x[-<MiB>mi]-<cores>c[-<hash>]`: the same ask always gives the same name, and
        different asks different names."""
        parts = [f"{TEMPLATE_PREFIX}{self.gpus}x"]
        if self.memory is not None:
            parts.append(f"{self.memory}mi")
        parts.append(f"{self.cores}c")
        if self.selectors or self.same_numa:
            constraints = orjson.dumps({"selectors": list(self.selectors), "sameNUMA": self.same_numa})
            parts.append(hashlib.sha256(constraints).hexdigest()[:_HASH_DIGITS])
        return "-".join(parts)

    @property
    def usage(self) -> QuotaUsage:
        """What the claim counts against its namespace's GPU quota (the whole GPU's memory counts 0 MiB,
        as HAMi counts a whole-GPU ask before a GPU is chosen)."""
        return QuotaUsage((self.memory or 0) * self.gpus, self.cores * self.gpus)

    def template_spec(self) -> dict[str, Any]:
        """The ResourceClaimTemplate's `spec` (a ResourceClaimTemplateSpec: `{spec: ResourceClaimSpec}`)."""
        exactly: dict[str, Any] = {
            "deviceClassName": DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": self.gpus,
        }
        if self.selectors:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in self.selectors]
        # A whole GPU (all its memory, 100 % of its cores) asks no capacity: the device's request policy
        # defaults are the whole GPU, so the claim consumes all of it (and no second share fits beside it,
        # so no distinctAttribute is needed either); the same claim then also works where the cluster lacks
        # consumable capacity (no gate: capacity requests and distinctAttribute are dropped by the API
        # server, and devices are exclusive).
        whole = self.memory is None and self.cores == 100
        if not whole:
            requests: dict[str, str] = {}
            if self.memory is not None:
                requests[CAPACITY_MEMORY] = canonical_quantity(f"{self.memory}Mi")
            requests[CAPACITY_CORES] = canonical_quantity(self.cores)
            exactly["capacity"] = {"requests": requests}
        devices: dict[str, Any] = {"requests": [{"name": REQUEST, "exactly": exactly}]}
        constraints: list[dict[str, Any]] = []
        if self.gpus > 1 and not whole:
            constraints.append({"requests": [REQUEST], "distinctAttribute": qualified(ATTR_UUID)})
            if self.same_numa:
                constraints.append({"requests": [REQUEST], "matchAttribute": qualified(ATTR_NUMA_NODE)})
        if constraints:
            devices["constraints"] = constraints
        return {"spec": {"devices": devices}}

    def template(self, namespace: str) -> dict[str, Any]:
        """The ResourceClaimTemplate object for `namespace`."""
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": self.template_name, "namespace": namespace, "labels": dict(TEMPLATE_LABELS)},
            "spec": self.template_spec(),
        }


def claim_name(container: str) -> str:
    """The pod claim of a container: `gpu-<container>`, a DNS label (a long name is cut and given 8 hex
    digits of its SHA-256, so two containers never share a claim)."""
    name = f"{CLAIM_PREFIX}{container}"
    if len(name) <= DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(container.encode()).hexdigest()[:8]
    return f"{name[: DNS_LABEL_MAX - 9].rstrip('-')}-{digest}"


# --- the pod's annotations -> selectors ---------------------------------------------------------------------

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """CEL's `lowerAscii()`: A-Z lowered, everything else kept."""
    return text.translate(_ASCII_LOWER)


def cel_string(text: str) -> str:
    """`text` as a CEL string literal: single-quoted, backslash and quote escaped, everything outside
    printable ASCII as a \\u / \\U escape (so no annotation can end the literal or the expression)."""
    out = ["'"]
    for char in text:
        code = ord(char)
        if char in "\\'":
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append("'")
    return "".join(out)


def _attribute(name: str) -> str:
    return f"device.attributes[{cel_string(DRIVER)}].{name}"


def type_selector(types: Sequence[str], *, use: bool) -> str:
    """`use-gputype` (any of `types` is in the product name) or `nouse-gputype` (none is), ignoring
    ASCII case as HAMi ignores case (`strings.ToUpper` on both sides)."""
    product = f"{_attribute(ATTR_PRODUCT_NAME)}.lowerAscii()"
    tests = [f"{product}.contains({cel_string(ascii_lower(t))})" for t in types]
    if use:
        return " || ".join(tests)
    return " && ".join(f"!{test}" for test in tests)


def uuid_selector(uuids: Sequence[str], *, use: bool) -> str:
    """`use-gpuuuid` (the uuid is one of them) or `nouse-gpuuuid` (it is none of them), exact."""
    listed = f"{_attribute(ATTR_UUID)} in [{', '.join(cel_string(u) for u in uuids)}]"
    return listed if use else f"!({listed})"


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """What a pod's annotations ask of every GPU it gets, as selectors; `model_memory` is the memory
    (MiB) of the GPU models its use-gputype picks when they all have one size, else None and
    `model_problem` says why."""

    selectors: tuple[str, ...] = ()
    same_numa: bool = False
    model_memory: int | None = None
    model_problem: str = ""
    warnings: tuple[str, ...] = ()


def _listed(annotations: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = annotations.get(key)
    if value is None:
        return ()
    if not isinstance(value, str):
        raise TranslationError(f"annotation {key} {value!r} is not a string", invalid=True)
    return decode_comma_list(value)


def _models_text(models: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{model} {mib} MiB" for model, mib in models)


def model_memory(
    use_types: Sequence[str], nouse_types: Sequence[str], known: Sequence[tuple[str, int]]
) -> tuple[int | None, str]:
    """(memory in MiB, "") when the known GPU models that `use_types` admits (and `nouse_types` does
    not exclude; HAMi's case-insensitive substring rule) all have one size; else (None, why)."""
    if not use_types:
        return None, f"the pod names no GPU model (annotation {USE_GPU_TYPE})"
    wanted = [ascii_lower(t) for t in use_types]
    unwanted = [ascii_lower(t) for t in nouse_types]
    matches = [
        (model, mib)
        for model, mib in known
        if any(t in ascii_lower(model) for t in wanted) and not any(t in ascii_lower(model) for t in unwanted)
    ]
    listed = ",".join(use_types)
    if not matches:
        knows = f"it knows {_models_text(known)}" if known else "its draGPUMemory setting is empty"
        return (
            None,
            f"{USE_GPU_TYPE} {listed!r} matches no GPU model whose memory hami-control knows ({knows})",
        )
    sizes = {mib for _, mib in matches}
    if len(sizes) > 1:
        sized = _models_text(matches)
        return None, f"{USE_GPU_TYPE} {listed!r} matches GPU models of different memory sizes ({sized})"
    return sizes.pop(), ""


def pod_constraints(
    annotations: Mapping[str, Any], known_models: Sequence[tuple[str, int]]
) -> PodConstraints:
    """The pod's GPU annotations as selectors (see the module docstring). Raises `TranslationError` for
    an annotation that does not parse, asks for a mode the DRA driver does not serve, or makes a
    selector longer than kube-apiserver accepts."""
    use_types, nouse_types = _listed(annotations, USE_GPU_TYPE), _listed(annotations, NOUSE_GPU_TYPE)
    use_uuids, nouse_uuids = _listed(annotations, USE_GPU_UUID), _listed(annotations, NOUSE_GPU_UUID)
    selectors: list[tuple[str, str]] = []
    if use_types:
        selectors.append((USE_GPU_TYPE, type_selector(use_types, use=True)))
    if nouse_types:
        selectors.append((NOUSE_GPU_TYPE, type_selector(nouse_types, use=False)))
    if use_uuids:
        selectors.append((USE_GPU_UUID, uuid_selector(use_uuids, use=True)))
    if nouse_uuids:
        selectors.append((NOUSE_GPU_UUID, uuid_selector(nouse_uuids, use=False)))
    for key, expression in selectors:
        if len(expression.encode()) > CEL_MAX_LENGTH:
            raise TranslationError(
                f"annotation {key} lists too much for a DRA selector ({len(expression.encode())} bytes of "
                f"CEL, kube-apiserver accepts {CEL_MAX_LENGTH}): list fewer entries"
            )
    same_numa = False
    try:
        if isinstance(annotations.get(NUMA_BIND), str):
            same_numa = decode_numa_bind(annotations[NUMA_BIND])
        mode = annotations.get(VGPU_MODE)
        modes = decode_vgpu_mode(mode) if isinstance(mode, str) else ()
    except WireFormatError as err:
        raise TranslationError(str(err), invalid=True) from None
    if modes and _HAMI_CORE_MODE not in modes:
        raise TranslationError(
            f"annotation {VGPU_MODE} {','.join(modes)!r} does not allow {_HAMI_CORE_MODE}, the only GPU "
            f"slices served through DRA: drop the annotation or add {_HAMI_CORE_MODE} to it"
        )
    memory, problem = model_memory(use_types, nouse_types, known_models)
    warnings = tuple(
        f"annotation {key} has no effect on a pod translated to DRA: kube-scheduler allocates its claims"
        for key in _POLICY_ANNOTATIONS
        if key in annotations
    )
    return PodConstraints(
        selectors=tuple(e for _, e in selectors),
        same_numa=same_numa,
        model_memory=memory,
        model_problem=problem,
        warnings=warnings,
    )


# --- one container ------------------------------------------------------------------------------------------


def container_claim(
    request: ContainerRequest,
    constraints: PodConstraints,
    *,
    label: str,
    names: ResourceNames,
    known_models: Sequence[tuple[str, int]] = (),
) -> GPUClaim:
    """The claim of a container whose request the webhook normalised (defaults applied). `label` names
    the container in messages ("container 'main'"). Raises `TranslationError` for a percentage of GPU
    memory no model size fixes, or more GPUs than a claim can hold."""
    if request.nums > MAX_DEVICES:
        raise TranslationError(
            f"{label}: {names.count} {request.nums} is more GPUs than one DRA claim can hold "
            f"({MAX_DEVICES}); ask for at most {MAX_DEVICES}"
        )
    memory: int | None
    if request.memreq > 0:
        memory = request.memreq
    elif request.mem_percentage is None or request.mem_percentage >= 100:
        memory = None
    elif constraints.model_memory is not None:
        memory = max(1, constraints.model_memory * request.mem_percentage // 100)
    else:
        knows = f" (hami-control knows {_models_text(known_models)})" if known_models else ""
        raise TranslationError(
            f"{label}: {names.memory_percentage} {request.mem_percentage} cannot be translated to a DRA "
            f"claim, which asks for an absolute amount of memory, because {constraints.model_problem}. "
            f"Write {names.memory}: <MiB per GPU> instead, or name GPU models of one memory size with the "
            f"annotation {USE_GPU_TYPE}{knows}"
        )
    return GPUClaim(
        gpus=request.nums,
        memory=memory,
        cores=request.coresreq,
        selectors=constraints.selectors,
        same_numa=constraints.same_numa and request.nums > 1,
    )


def strip_resources(container: MutableMapping[str, Any], names: ResourceNames) -> None:
    """Remove every HAMi resource from the container's limits and requests (a shallow copy: `resources`
    and its sections are copied, never edited); sections left empty are removed."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return
    copy = dict(resources)
    for section in ("limits", "requests"):
        values = copy.get(section)
        if not isinstance(values, Mapping) or not names.all & values.keys():
            continue
        kept = {k: v for k, v in values.items() if k not in names.all}
        if kept:
            copy[section] = kept
        else:
            del copy[section]
    container["resources"] = copy


def use_claim(container: MutableMapping[str, Any], claim: str) -> None:
    """Add `{name: claim}` to the container's `resources.claims` (copying what it edits)."""
    resources = container.get("resources")
    copy = dict(resources) if isinstance(resources, Mapping) else {}
    claims = copy.get("claims")
    copy["claims"] = [*(claims if isinstance(claims, list) else []), {"name": claim}]
    container["resources"] = copy


# --- the annotation ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """One entry of `hami.io/dra-claims`: a translated container and what its claim asks."""

    container: str
    claim: str
    template: str
    gpus: int
    memory: int | None
    cores: int

    @property
    def usage(self) -> QuotaUsage:
        return QuotaUsage((self.memory or 0) * self.gpus, self.cores * self.gpus)


def record(container: str, claim: GPUClaim) -> ClaimRecord:
    return ClaimRecord(
        container, claim_name(container), claim.template_name, claim.gpus, claim.memory, claim.cores
    )


def encode_claims(records: Sequence[ClaimRecord]) -> str:
    return orjson.dumps(
        [
            {
                "container": r.container,
                "claim": r.claim,
                "template": r.template,
                "gpus": r.gpus,
                "memory": r.memory,
                "cores": r.cores,
            }
            for r in records
        ]
    ).decode()


_RECORD_KEYS = frozenset(("container", "claim", "template", "gpus", "memory", "cores"))


def _count(entry: Mapping[str, Any], key: str, index: int, *, low: int, nullable: bool = False) -> Any:
    value = entry.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = f"an integer >= {low}" + (" or null" if nullable else "")
        raise WireFormatError(ANNOTATION, f"entry {index}", repr(value), f"is not {what}", key)
    return value


def _entry_text(entry: Any) -> str:
    """An entry written back for an error message; orjson writes at most 255 levels of nesting (it reads
    1,024), so a deeper entry is named by its type."""
    try:
        return orjson.dumps(entry).decode()
    except orjson.JSONEncodeError:
        return f"<{type(entry).__name__} nested deeper than 255 levels>"


def decode_claims(text: str) -> tuple[ClaimRecord, ...]:
    """`hami.io/dra-claims`, strictly: a list of objects with exactly the six keys, names as strings,
    gpus >= 1, memory >= 1 or null, cores >= 0. Raises `WireFormatError` naming the entry and key."""
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise WireFormatError(ANNOTATION, "whole value", text, f"is not JSON ({err})") from None
    if not isinstance(entries, list):
        raise WireFormatError(ANNOTATION, "whole value", text, "is not a JSON list")
    out: list[ClaimRecord] = []
    for index, entry in enumerate(entries):
        where = f"entry {index}"
        if not isinstance(entry, dict) or set(entry) != _RECORD_KEYS:
            keys = ", ".join(sorted(_RECORD_KEYS))
            raise WireFormatError(ANNOTATION, where, _entry_text(entry), f"is not an object of {keys}")
        for key in ("container", "claim", "template"):
            if not isinstance(entry[key], str) or not entry[key]:
                raise WireFormatError(ANNOTATION, where, repr(entry[key]), "is not a name", key)
        out.append(
            ClaimRecord(
                entry["container"],
                entry["claim"],
                entry["template"],
                _count(entry, "gpus", index, low=1),
                _count(entry, "memory", index, low=1, nullable=True),
                _count(entry, "cores", index, low=0),
            )
        )
    return tuple(out)


def claims_usage(records: Iterable[ClaimRecord]) -> QuotaUsage:
    """A translated pod's quota usage: every claim, init containers' included (held for the pod's life)."""
    total = QuotaUsage()
    for entry in records:
        total += entry.usage
    return total


# --- a stored template against the expected one -------------------------------------------------------------


def _normalised(spec: Any) -> Any:
    """A ResourceClaimTemplate spec as kube-apiserver stores it, made comparable: `allocationMode`
    defaulted to ExactCount and `count` to 1 (resource/v1 defaults), capacity quantities canonical."""
    if not isinstance(spec, Mapping):
        return spec
    claim = spec.get("spec")
    if not isinstance(claim, Mapping):
        return spec
    devices = claim.get("devices")
    if not isinstance(devices, Mapping):
        return spec
    requests = devices.get("requests")
    if not isinstance(requests, list):
        return spec
    fixed: list[Any] = []
    for request in requests:
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if not isinstance(exactly, Mapping):
            fixed.append(request)
            continue
        exactly = dict(exactly)
        exactly.setdefault("allocationMode", "ExactCount")
        if exactly["allocationMode"] == "ExactCount":
            exactly.setdefault("count", 1)
        capacity = exactly.get("capacity")
        wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
        if isinstance(capacity, Mapping) and isinstance(wanted, Mapping):
            with contextlib.suppress(QuantityError, TypeError):
                canonical = {k: canonical_quantity(v) for k, v in wanted.items()}
                exactly["capacity"] = {**capacity, "requests": canonical}
        fixed.append({**request, "exactly": exactly})
    return {**spec, "spec": {**claim, "devices": {**devices, "requests": fixed}}}


_DROPPED_HINT = (
    ": the API server dropped it, so it does not serve consumable capacity (Kubernetes 1.34/1.35 need the "
    "feature gate DRAConsumableCapacity on kube-apiserver, kube-scheduler and kubelet; it is on by default "
    "from 1.36)"
)
_GATED_FIELDS = frozenset(("capacity", "constraints", "distinctAttribute"))
"""What kube-apiserver drops from a claim while DRAConsumableCapacity is off."""


@dataclass(frozen=True, slots=True)
class TemplateDifference:
    """The first difference between a stored template spec and the expected one: `path` and what is
    wrong there; `dropped` when the API server dropped a field only consumable capacity serves."""

    path: str
    problem: str
    dropped: bool = False

    def __str__(self) -> str:
        return f"{self.path} {self.problem}{_DROPPED_HINT if self.dropped else ''}"


def _difference(stored: Any, expected: Any, path: str) -> TemplateDifference | None:
    if isinstance(expected, Mapping) and isinstance(stored, Mapping):
        for key, value in expected.items():
            if key not in stored:
                return TemplateDifference(f"{path}.{key}", "is missing", key in _GATED_FIELDS)
            found = _difference(stored[key], value, f"{path}.{key}")
            if found:
                return found
        extra = sorted(set(stored) - set(expected))
        return TemplateDifference(f"{path}.{extra[0]}", "is not one hami-control writes") if extra else None
    if isinstance(expected, list) and isinstance(stored, list):
        if len(stored) != len(expected):
            return TemplateDifference(path, f"has {len(stored)} entries, not {len(expected)}")
        for index, (a, b) in enumerate(zip(stored, expected, strict=True)):
            found = _difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if stored == expected else TemplateDifference(path, f"is {stored!r}, not {expected!r}")


def template_difference(stored_spec: Any, expected_spec: Mapping[str, Any]) -> TemplateDifference | None:
    """None when a stored template's `spec` is the one hami-control writes (after kube-apiserver's
    defaults), else the first difference, e.g. "spec.spec.devices.requests[0].exactly.capacity is
    missing: the API server dropped it, ...". A template of the same name that asks something else
    (written by someone else, or stripped by an API server without consumable capacity) must not be
    used for a translated pod."""
    return _difference(_normalised(stored_spec), expected_spec, "spec")


__all__ = [
    "ANNOTATION",
    "CEL_MAX_LENGTH",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MAX_DEVICES",
    "REQUEST",
    "TEMPLATE_LABELS",
    "TEMPLATE_PREFIX",
    "TEMPLATE_SELECTOR",
    "ClaimRecord",
    "GPUClaim",
    "PodConstraints",
    "TemplateDifference",
    "TranslationError",
    "ascii_lower",
    "cel_string",
    "claim_name",
    "claims_usage",
    "container_claim",
    "decode_claims",
    "encode_claims",
    "model_memory",
    "pod_constraints",
    "record",
    "strip_resources",
    "template_difference",
    "type_selector",
    "use_claim",
    "uuid_selector",
]
