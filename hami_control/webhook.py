"""The mutating admission webhook, pure: an AdmissionReview in, an AdmissionReview (or an HTTP error) out.

`review_pod(pod, operation, config, quota_view)` applies HAMi v2.10's rules (`pkg/scheduler/webhook.go`,
NVIDIA `MutateAdmission`) and returns a `Decision`: allowed with the smallest JSONPatch (only the paths
that change), or denied with an HTTP code and a message. `handle_admission_review(body, config,
quota_view)` is the envelope around it for `POST /webhook`.

Rules, in HAMi's order:

1. Only pod CREATEs are mutated; other operations and objects are allowed untouched (a pod's spec cannot
   change after creation, so there is nothing to fix on UPDATE).
2. A pod without containers is denied.
3. Scheduler-name gate: a pod naming another scheduler is left alone. An empty name is taken over, and so
   is `default-scheduler` while `force_overwrite_default_scheduler` is on.
4. Every init and regular container, in that order:
   - its HAMi values are checked: a quantity that does not parse, a negative or fractional value,
     gpumem-percentage or gpucores outside 0..100, or GPU memory/cores with `nvidia.com/gpu: 0` deny the
     pod (422) with a message naming container, resource and value. HAMi rejects only the percentage
     and silently clamps or drops the rest, which leaves users guessing;
   - gpumem / gpucores / gpumem-percentage without `nvidia.com/gpu`: `nvidia.com/gpu = defaultGPUNum`
     (a lone `nvidia.com/gpu: 0` asks for no GPU; HAMi would still take such a pod over);
   - `nvidia.com/gpu` without gpucores and with neither gpumem nor gpumem-percentage (or with 100 %):
     `gpucores = 100`, a whole GPU, as HAMi does; logged in the decision's notes;
   - `nvidia.com/priority` -> env `CUDA_TASK_PRIORITY` (any container naming it, as HAMi);
   - core policy (the pod's `hami.io/core-policy` annotation, else the configured one) other than
     `default` -> env `GPU_CORE_UTILIZATION_POLICY`, on GPU containers only (HAMi sets it on every
     container; it means nothing where HAMi-core is not injected);
   - with `overwrite_env`, a container without a GPU gets `NVIDIA_VISIBLE_DEVICES=none`.
   An env var the webhook sets replaces a same-named one already in the container (HAMi appends, and
   the later duplicate wins in Kubernetes; replacing keeps the spec tidy).
5. A privileged container asking for GPU resources denies the pod (403): it would see every GPU on the
   node. HAMi denies for any privileged container once the pod has GPUs; here only the containers that
   ask for GPU resources count. With privileged policy `skip` (HAMi <= 2.4) the container is left alone
   and the client gets a warning; if the pod then has no GPU container while a skipped one asks for
   gpumem/gpucores (resources no node advertises), it is denied, since it would hang Pending at the
   default scheduler.
6. A pod with a GPU container: `spec.schedulerName` = the configured name; `spec.nodeName` set -> denied
   ("pod has node assigned": it would bypass GPU scheduling); `spec.runtimeClassName` set when configured
   and unset.
7. With `translate` (the pod's namespace opted in to DRA, `config.dra`), a GPU pod that does not use
   resourceClaims yet is rewritten to use one ResourceClaim per GPU container, from templates the
   caller keeps (`dra_translate`: the rules, the names, the annotation `hami.io/dra-claims`; the
   templates it needs are in `Decision.claims`). What cannot be translated is denied with a message
   saying what to write instead (a gpumem-percentage no GPU model size fixes; a privileged GPU
   container under the skip policy, whose GPU would stay outside the claims).
8. Quota pre-check (`hami_control.quota`), unless disabled: denied (403) when the namespace's GPU memory
   or cores quota would be exceeded. The pod is counted as it will be stored (defaults applied, skipped
   privileged containers included; a translated pod by its claims), which is what the caches count once
   the watch shows it; an allowed GPU pod's usage is returned in `Decision.quota_usage` so the caller
   can assume it meanwhile.

The fragmentation component's second entry (`cpu.hami.io`, `POST /webhook/cpu`: `review_cpu_pod`,
`handle_cpu_admission_review`) is separate from these rules: it never denies, and only sets
`schedulerName` on a pod that asks no GPU, so that hami-scheduler (and its `/cpu-filter` entry) places
it; see `review_cpu_pod`.

Denials carry kube's status codes: 403 Forbidden for policy (2, 5, 6, 7, 8), 422 Invalid for bad values,
500 InternalError for a bug. An unexpected exception in the rules never reaches the client as a
traceback: a pod that names a HAMi resource is denied with 500 (letting it through unmutated would
send a GPU pod to the default scheduler, where it hangs Pending: HAMi's most reported problem), any
other pod is allowed untouched, so a bug here never blocks pods that have nothing to do with GPUs.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson

from hami_api.annotations import CORE_POLICY, decode_core_policy
from hami_api.errors import RequestError, WireFormatError
from hami_api.quantity import parse_quantity
from hami_api.resources import (
    ContainerRequest,
    ResourceNames,
    container_priority,
    container_request,
    container_resource,
)
from hami_api.types import CorePolicy, NodePolicy
from hami_control.config import ControlConfig, DRATranslation, FragmentationFilter, PrivilegedPolicy
from hami_control.devices.base import DeviceRequest, Vendor
from hami_control.dra_translate import (
    ANNOTATION as DRA_CLAIMS,
)
from hami_control.dra_translate import (
    GPUClaim,
    TranslationError,
    claims_usage,
    container_claim,
    encode_claims,
    pod_constraints,
    record,
    strip_resources,
    use_claim,
)
from hami_control.quota import QuotaUsage, QuotaView, check_quota, requests_quota_usage, vendor_requests_usage

ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEFAULT_SCHEDULER = "default-scheduler"
CPU_WEBHOOK_PATH = "/webhook/cpu"
"""The fragmentation component's `cpu.hami.io` entry (daemonset/components/fragmentation)."""
NEVER_STEERED_NAMESPACES = ("kube-system",)
"""Namespaces whose pods `review_cpu_pod` never steers (hami-control's own is added): the control plane's
add-ons must not wait on hami-scheduler, which runs inside hami-control's pod."""
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

JSONPatchOp = dict[str, Any]


# --- the decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """What the webhook answers for one object. `patch` is a JSONPatch (RFC 6902) against the object as
    received; `code`/`reason`/`message` describe a denial (kube's metav1.Status); `warnings` go back to
    the client (kubectl prints them); `notes` are for the decision log only."""

    allowed: bool
    patch: tuple[JSONPatchOp, ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    quota_usage: QuotaUsage | None = None
    """For an allowed GPU pod: what it counts against its namespace's quota (to assume it until the
    watch shows the pod)."""
    claims: tuple[GPUClaim, ...] = ()
    """For a pod translated to DRA: the claims whose ResourceClaimTemplates (`GPUClaim.template`) must
    exist in its namespace before the pod is admitted, one per distinct template."""


def _allow(
    note: str = "",
    *,
    patch: Sequence[JSONPatchOp] = (),
    warnings: Sequence[str] = (),
    notes: Sequence[str] = (),
    quota_usage: QuotaUsage | None = None,
    claims: Sequence[GPUClaim] = (),
) -> Decision:
    return Decision(
        True,
        tuple(patch),
        warnings=tuple(warnings),
        notes=(note, *notes) if note else tuple(notes),
        quota_usage=quota_usage,
        claims=tuple(claims),
    )


def _deny(code: int, reason: str, message: str, warnings: Sequence[str] = ()) -> Decision:
    return Decision(False, (), code, reason, message, tuple(warnings))


def _forbidden(message: str, warnings: Sequence[str] = ()) -> Decision:
    return _deny(403, "Forbidden", message, warnings)


class _Invalid(Exception):
    """A pod value the rules cannot use; becomes a 422 denial with this message."""


# --- JSON pointers and the minimal patch ------------------------------------------------------------------


def escape_pointer_token(token: str) -> str:
    """RFC 6901: `~` -> `~0`, `/` -> `~1` (so `nvidia.com/gpu` -> `nvidia.com~1gpu`)."""
    return token.replace("~", "~0").replace("/", "~1")


def _same(a: Any, b: Any) -> bool:
    """JSON equality for scalars (True is not 1)."""
    return type(a) is type(b) and a == b


def json_patch_diff(before: Any, after: Any, path: str = "") -> list[JSONPatchOp]:
    """The smallest JSONPatch turning `before` into `after` for edits that add object members, append to
    arrays or change values: new members are added whole (a missing `limits` becomes one `add` of the
    object), appended array items use `/-`, changed scalars are replaced. Shared sub-objects (`is`) are
    skipped without being walked, so a copy-on-write `after` costs only the edited paths."""
    ops: list[JSONPatchOp] = []
    _diff(before, after, path, ops)
    return ops


def _diff(before: Any, after: Any, path: str, ops: list[JSONPatchOp]) -> None:
    if before is after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in after.items():
            at = f"{path}/{escape_pointer_token(key)}"
            if key in before:
                _diff(before[key], value, at, ops)
            else:
                ops.append({"op": "add", "path": at, "value": value})
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{escape_pointer_token(key)}"})
        return
    if isinstance(before, list) and isinstance(after, list) and len(after) >= len(before):
        for index, item in enumerate(before):
            _diff(item, after[index], f"{path}/{index}", ops)
        ops.extend({"op": "add", "path": f"{path}/-", "value": item} for item in after[len(before) :])
        return
    if isinstance(before, dict | list) or not _same(before, after):
        ops.append({"op": "replace", "path": path, "value": after})


# --- one container ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Container:
    """What the rules learned about one container."""

    name: str
    init: bool
    gpu: bool = False
    """It gets GPUs (nvidia.com/gpu >= 1 after defaults)."""
    privileged_asks: tuple[str, ...] = ()
    """HAMi resources a privileged container asks for (its GPU was not processed)."""
    skipped: bool = False
    """Privileged, left alone by the skip policy while asking for GPU resources."""
    skipped_sharing: bool = False
    """Skipped (privileged, policy skip) while asking for gpumem/gpucores/percentage."""
    request: ContainerRequest | None = None
    """Its normalised GPU request once the rules ran (for the quota check)."""

    @property
    def label(self) -> str:
        return f"{'init container' if self.init else 'container'} {self.name!r}"


def _container_name(container: Mapping[str, Any]) -> str:
    name = container.get("name", "")
    return name if isinstance(name, str) else repr(name)


def _privileged(container: Mapping[str, Any]) -> bool:
    context = container.get("securityContext")
    return isinstance(context, Mapping) and context.get("privileged") is True


def _set_limit(container: MutableMapping[str, Any], resource: str, value: str) -> None:
    """limits[resource] = value, copying `resources` and `limits` (never editing the request's objects)."""
    resources = container.get("resources")
    resources = {} if resources is None else dict(resources)
    limits = resources.get("limits")
    limits = {} if limits is None else dict(limits)
    limits[resource] = value
    resources["limits"] = limits
    container["resources"] = resources


def _set_env(container: MutableMapping[str, Any], label: str, name: str, value: str) -> None:
    """Env `name=value`: replaces the last same-named entry (the one Kubernetes uses) or appends."""
    env = container.get("env")
    if env is None:
        env = []
    elif not isinstance(env, list):
        raise _Invalid(f"{label}: env {_shown(env)} is not a list")
    entry = {"name": name, "value": value}
    for index in range(len(env) - 1, -1, -1):
        existing = env[index]
        if isinstance(existing, Mapping) and existing.get("name") == name:
            if existing == entry:
                return
            env = list(env)
            env[index] = entry
            break
    else:
        env = [*env, entry]
    container["env"] = env


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:120] + "...") if len(text) > 120 else repr(text)


def _present(container: Mapping[str, Any], state: _Container, names: ResourceNames) -> frozenset[str]:
    """The HAMi resources the container names in limits or requests. A direct look in the two plain
    JSON objects (the common case, and what every sidecar costs); anything else goes through
    `hami_api.resources`, which names the malformed part."""
    resources = container.get("resources")
    if resources is None:
        return frozenset()
    if type(resources) is dict:
        limits, requests = resources.get("limits"), resources.get("requests")
        if (limits is None or type(limits) is dict) and (requests is None or type(requests) is dict):
            keys = (limits or {}).keys() | (requests or {}).keys()
            return names.all & keys
    return frozenset(r for r in names.all if container_resource(container, r, state.init) is not None)


def _percent(
    container: Mapping[str, Any], state: _Container, resource: str, present: frozenset[str]
) -> int | None:
    """A 0..100 value (already checked to be a whole number by container_request); outside 0..100 denies
    the pod, as HAMi's validateMemoryPercentage (the scheduler alone would clamp or ignore it)."""
    if resource not in present:
        return None
    raw = container_resource(container, resource, state.init)
    if raw is None:
        return None
    value = parse_quantity(raw)
    if not 0 <= value <= 100:
        shown = raw if isinstance(raw, str) else repr(raw)
        raise RequestError(state.name, resource, shown, "must be between 0 and 100", state.init)
    return value.numerator


def _review_container(
    container: MutableMapping[str, Any],
    state: _Container,
    *,
    config: ControlConfig,
    core_policy: CorePolicy | str,
    warnings: list[str],
    notes: list[str],
) -> None:
    """Check one container and apply HAMi's per-container rules to it (a shallow copy) in place."""
    names: ResourceNames = config.requests.names
    present = _present(container, state, names)
    if not present:
        if config.webhook.overwrite_env:
            _set_env(container, state.label, ENV_VISIBLE_DEVICES, "none")
        return
    sharing = [r for r in names.sharing if r in present]
    asks = [r for r in (names.count, *names.sharing) if r in present]

    if asks and _privileged(container):
        if config.webhook.privileged_policy is PrivilegedPolicy.DENY:
            state.privileged_asks = tuple(asks)
            return
        warnings.append(f"{state.label} is privileged: its GPU request is not shared or limited by HAMi")
        state.skipped = True
        state.skipped_sharing = bool(sharing)
        # untouched, but the scheduler extender counts what it asks, so the quota check does too
        state.request = container_request(container, names, config.requests.defaults, state.init)
        return

    defaults = config.requests.defaults
    if names.count in present:
        state.request = container_request(container, names, defaults, state.init)  # checks the values
        if state.request is None and sharing:
            count = container_resource(container, names.count, state.init)
            raise RequestError(
                state.name,
                names.count,
                count if isinstance(count, str) else repr(count),
                f"is 0 while the container asks for {', '.join(sharing)}: ask {names.count} >= 1 "
                f"or drop {', '.join(sharing)}",
                state.init,
            )
    elif sharing:
        gpus = defaults.default_gpu_num
        _set_limit(container, names.count, str(gpus))
        state.request = container_request(container, names, defaults, state.init)
        notes.append(f"{state.label}: {names.count}={gpus} added (defaultGPUNum)")
    state.gpu = state.request is not None

    if state.gpu:
        percentage = _percent(container, state, names.memory_percentage, present)
        _percent(container, state, names.cores, present)
        if names.cores not in present and (
            percentage == 100 if percentage is not None else names.memory not in present
        ):
            _set_limit(container, names.cores, "100")
            state.request = container_request(container, names, defaults, state.init)
            notes.append(f"{state.label}: {names.cores}=100 added, a whole GPU (no memory share asked)")

    if names.priority in present:
        priority = container_priority(container, names)
        if priority is None or priority < 0:
            raw = container_resource(container, names.priority, state.init)
            raise RequestError(state.name, names.priority, str(raw), "must not be negative", state.init)
        _set_env(container, state.label, ENV_TASK_PRIORITY, str(priority))

    if state.gpu and core_policy is not CorePolicy.DEFAULT:
        if not isinstance(core_policy, CorePolicy):
            raise _Invalid(core_policy)
        _set_env(container, state.label, ENV_CORE_POLICY, core_policy.value)
    if not state.gpu and config.webhook.overwrite_env:
        _set_env(container, state.label, ENV_VISIBLE_DEVICES, "none")


# --- one pod ---------------------------------------------------------------------------------------------


def _core_policy(metadata: Mapping[str, Any], config: ControlConfig) -> CorePolicy | str:
    """The pod's core policy, or the message to deny with if its annotation is bad (used only if the pod
    has a GPU container)."""
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or CORE_POLICY not in annotations:
        return config.webhook.core_policy
    value = annotations[CORE_POLICY]
    if not isinstance(value, str):
        return f"annotation {CORE_POLICY} {_shown(value)} is not a string"
    try:
        return decode_core_policy(value)
    except WireFormatError as err:
        return f"annotation {CORE_POLICY} {_shown(value)} {err.reason}"


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Invalid(f"{where} {_shown(value)} is not an object")
    return value


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(f"{where} {_shown(value)} is not a string")
    return value


def review_pod(
    pod: Mapping[str, Any],
    operation: str,
    config: ControlConfig,
    quota_view: QuotaView,
    namespace: str | None = None,
    *,
    translate: bool = False,
) -> Decision:
    """HAMi's admission rules for one pod (see the module docstring). `namespace` is the request's
    (a pod being created may not carry one yet); it defaults to the pod's own. `translate`: rewrite a
    GPU pod to DRA claims (rule 7).

    Bad values give a 422 denial; this raises only on a bug (or a quota view that fails)."""
    if operation != "CREATE":
        return _allow(f"{operation or 'no operation'}: only CREATE is mutated")
    try:
        return _review_create(pod, config, quota_view, namespace, translate)
    except _Invalid as err:
        return _deny(422, "Invalid", str(err))
    except RequestError as err:
        return _deny(422, "Invalid", str(err))
    except _Refused as refused:
        return refused.decision


def _review_create(
    pod: Mapping[str, Any],
    config: ControlConfig,
    quota_view: QuotaView,
    namespace: str | None,
    translate: bool,
) -> Decision:
    if not isinstance(pod, Mapping):
        raise _Invalid(f"the object {_shown(pod)} is not a pod")
    metadata = _object(pod.get("metadata"), "metadata")
    spec = _object(pod.get("spec"), "spec")
    lists: dict[str, list[Any]] = {}
    for key in ("initContainers", "containers"):
        value = spec.get(key)
        if value is not None and not isinstance(value, list):
            raise _Invalid(f"spec.{key} {_shown(value)} is not a list")
        lists[key] = value or []
    if not lists["containers"]:
        return _forbidden("pod has no containers")

    scheduler = _string(spec.get("schedulerName"), "spec.schedulerName")
    if (
        scheduler
        and (scheduler != DEFAULT_SCHEDULER or not config.webhook.force_overwrite_default_scheduler)
        and scheduler != config.webhook.scheduler_name
    ):
        return _allow(f"scheduler {scheduler!r} named: left alone")

    new_spec: dict[str, Any] = dict(spec)
    warnings: list[str] = []
    notes: list[str] = []
    states, containers = _review_containers(
        new_spec, lists, config, _core_policy(metadata, config), warnings=warnings, notes=notes
    )

    vendor_found, vendor_metadata = _review_vendors(new_spec, metadata, config)
    privileged = next((s for s in states if s.privileged_asks), None)
    if privileged is not None:
        return _forbidden(
            f"{privileged.label} is privileged and asks for {', '.join(privileged.privileged_asks)}: "
            "a privileged container sees every GPU on the node, so HAMi cannot share or limit them. "
            "Drop securityContext.privileged (grant the capabilities it needs instead), or ask your "
            "admin about hami-control's --privileged-policy"
        )
    has_gpu = any(s.gpu for s in states) or vendor_found
    if not has_gpu and any(s.skipped_sharing for s in states):
        label = next(s.label for s in states if s.skipped_sharing)
        return _forbidden(
            f"{label} is privileged and skipped by HAMi, and no other container asks for a GPU: "
            "its GPU memory/cores resources would leave the pod Pending at the default scheduler",
            warnings,
        )

    usage: QuotaUsage | None = None
    claims: tuple[GPUClaim, ...] = ()
    new_metadata: Mapping[str, Any] = vendor_metadata
    if has_gpu:
        node_name = _string(spec.get("nodeName"), "spec.nodeName")
        if node_name:
            return _forbidden(
                f"pod has node assigned (spec.nodeName {node_name!r}): a GPU pod must be placed by "
                f"{config.webhook.scheduler_name}, which chooses its GPUs; use a nodeSelector or node "
                "affinity instead",
                warnings,
            )
        new_spec["schedulerName"] = config.webhook.scheduler_name
        runtime_class = spec.get("runtimeClassName")
        if config.webhook.runtime_class_name and (runtime_class is None or runtime_class == ""):
            new_spec["runtimeClassName"] = config.webhook.runtime_class_name
        if translate and spec.get("resourceClaims"):
            notes.append("pod already uses resourceClaims: not translated to DRA")
        elif translate:
            try:
                translated = _translate(new_spec, metadata, states, containers, config)
            except TranslationError as err:
                return (
                    _deny(422, "Invalid", err.message, warnings)
                    if err.invalid
                    else _forbidden(err.message, warnings)
                )
            new_metadata, usage, claims = translated.metadata, translated.usage, translated.claims
            warnings += translated.warnings
            notes.append(f"translated to DRA: {', '.join(sorted(c.template_name for c in claims))}")
        if usage is None:
            usage = requests_quota_usage((s.request, s.init) for s in states)  # the pod as it will be stored
        usage += _vendor_usage(new_spec, config, vendor_found)
        if config.quota.enforce:
            if namespace is None:
                namespace = _string(metadata.get("namespace"), "metadata.namespace")
            denial = check_quota(namespace, usage, quota_view)
            if denial is not None:
                return _forbidden(denial.message, warnings)

    patch = json_patch_diff(spec, new_spec, "/spec")
    if new_metadata is not metadata:
        patch += _metadata_patch(pod, metadata, new_metadata)
    if not patch:
        notes.append("no GPU resource" if not has_gpu else "nothing to change")
    return _allow(patch=patch, warnings=warnings, notes=notes, quota_usage=usage, claims=claims)


class _Refused(Exception):
    """A decision reached deep in the rules (a vendor's refusal)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(decision.message)


def _review_vendors(
    new_spec: dict[str, Any], metadata: Mapping[str, Any], config: ControlConfig
) -> tuple[bool, Mapping[str, Any]]:
    """Every other vendor's MutateAdmission (`hami_control.devices`) on every container, init containers
    first, as HAMi's webhook runs them: on deep copies in `new_spec` (a vendor edits limits, requests,
    env, the pod's annotations and runtimeClassName). Returns (a container asks one of them, the denial
    HAMi answers a vendor's error with (HTTP 500 with its text), the pod's metadata after them)."""
    vendors = config.registry.others
    if not vendors or not _names_vendor_resource(new_spec, vendors):
        return False, metadata
    work_metadata = copy.deepcopy(dict(metadata))
    pod: dict[str, Any] = {"metadata": work_metadata, "spec": new_spec}
    found = False
    for key in ("initContainers", "containers"):
        containers = new_spec.get(key)
        if not isinstance(containers, list):
            continue
        for index, original in enumerate(containers):
            containers[index] = container = copy.deepcopy(original)
            for vendor in vendors:
                try:
                    result = vendor.mutate(container, pod)
                except (ValueError, TypeError, KeyError) as err:
                    message = f"{vendor.names.family}: {type(err).__name__}: {err}"
                    raise _Refused(_deny(500, "InternalError", message)) from None
                if result.error:
                    raise _Refused(_deny(500, "InternalError", result.error))
                if result.found and _privileged(container):
                    raise _Refused(_forbidden(f"container {_container_name(container)} is privileged"))
                found = found or result.found
    return found, work_metadata if work_metadata != metadata else metadata


def _vendor_usage(spec: Mapping[str, Any], config: ControlConfig, found: bool) -> QuotaUsage:
    """What the pod, as the vendors left it, asks of their quotas (HAMi's fitResourceQuota); nothing
    when no container asks one of them (`found`)."""
    vendors = config.registry.others
    if not found:
        return QuotaUsage()
    requests: list[dict[str, DeviceRequest]] = []
    inits = 0
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            if not isinstance(container, Mapping):
                continue
            inits += key == "initContainers"
            asked = {}
            for vendor in vendors:
                request = vendor.request(container)
                if request is not None and request.nums > 0:
                    asked[vendor.names.common_word] = request
            requests.append(asked)
    return vendor_requests_usage(requests, inits, vendors)


def _names_vendor_resource(spec: Mapping[str, Any], vendors: Sequence[Vendor]) -> bool:
    names = {r for v in vendors for r in v.names.resources}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for part in ("limits", "requests"):
                values = resources.get(part)
                if isinstance(values, Mapping) and not names.isdisjoint(values):
                    return True
    return False


def _metadata_patch(
    pod: Mapping[str, Any], metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]
) -> list[JSONPatchOp]:
    if isinstance(pod.get("metadata"), Mapping):
        return json_patch_diff(metadata, new_metadata, "/metadata")
    return [{"op": "add", "path": "/metadata", "value": new_metadata}]


def _review_containers(
    new_spec: dict[str, Any],
    lists: Mapping[str, list[Any]],
    config: ControlConfig,
    core_policy: CorePolicy | str,
    *,
    warnings: list[str],
    notes: list[str],
) -> tuple[list[_Container], list[dict[str, Any]]]:
    """Rule 4 on every container, init containers first: their copies go into `new_spec`; returns the
    states and the copies, in that order."""
    states: list[_Container] = []
    containers: list[dict[str, Any]] = []
    for key, init in (("initContainers", True), ("containers", False)):
        if not isinstance(new_spec.get(key), list):
            continue
        copies: list[dict[str, Any]] = []
        for index, container in enumerate(lists[key]):
            if not isinstance(container, Mapping):
                raise _Invalid(f"spec.{key}[{index}] {_shown(container)} is not an object")
            copy = dict(container)
            state = _Container(_container_name(container), init)
            _review_container(
                copy, state, config=config, core_policy=core_policy, warnings=warnings, notes=notes
            )
            states.append(state)
            copies.append(copy)
        containers += copies
        new_spec[key] = copies
    return states, containers


@dataclass(frozen=True, slots=True)
class _Translated:
    metadata: Mapping[str, Any]
    usage: QuotaUsage
    claims: tuple[GPUClaim, ...]
    warnings: tuple[str, ...]


def _translate(
    new_spec: dict[str, Any],
    metadata: Mapping[str, Any],
    states: Sequence[_Container],
    containers: Sequence[dict[str, Any]],
    config: ControlConfig,
) -> _Translated:
    """Rule 7 on the spec the other rules produced (`containers`: its container copies, in `states`'
    order, edited in place): one claim per GPU container, no HAMi resource left in any container, the
    pod's claims and the `hami.io/dra-claims` annotation. Raises `TranslationError`."""
    skipped = next((s for s in states if s.skipped), None)
    if skipped is not None:
        raise TranslationError(
            f"{skipped.label} is privileged and left alone by hami-control's privileged policy skip: in a "
            "pod translated to DRA its GPU resources would stay outside the pod's claims. Drop "
            "securityContext.privileged (grant the capabilities it needs instead)"
        )
    names = config.requests.names
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    known = config.dra.gpu_memory
    constraints = pod_constraints(annotations, known)
    records = []
    claims: dict[str, GPUClaim] = {}
    pod_claims: list[dict[str, str]] = []
    for state, container in zip(states, containers, strict=True):
        strip_resources(container, names)
        if not state.gpu:
            continue
        assert state.request is not None
        claim = container_claim(
            state.request, constraints, label=state.label, names=names, known_models=known
        )
        entry = record(state.name, claim)
        use_claim(container, entry.claim)
        pod_claims.append({"name": entry.claim, "resourceClaimTemplateName": entry.template})
        claims.setdefault(entry.template, claim)
        records.append(entry)
    new_spec["resourceClaims"] = pod_claims
    new_metadata = {**metadata, "annotations": {**annotations, DRA_CLAIMS: encode_claims(records)}}
    return _Translated(new_metadata, claims_usage(records), tuple(claims.values()), constraints.warnings)


def _mentions_hami_resource(pod: Any, names: ResourceNames) -> bool:
    """Whether any container names a HAMi resource; True when the pod cannot even be read (fail closed)."""
    try:
        spec = pod.get("spec") or {}
        for key in ("initContainers", "containers"):
            for container in spec.get(key) or []:
                resources = container.get("resources") or {}
                for section in ("limits", "requests"):
                    if any(r in (resources.get(section) or {}) for r in names.all):
                        return True
    except Exception:
        return True
    return False


# --- the fragmentation component's CPU entry ------------------------------------------------------------


def steers_cpu_only(config: ControlConfig) -> bool:
    """Whether `POST /webhook/cpu` sends pods that ask no GPU to hami-scheduler: under the settings of the
    fragmentation component (node policy fragmentation, `--fragmentation-filter one`), the ones under which
    `/cpu-filter` decides their node (scheduling.Extender.decides_cpu_only)."""
    scheduling = config.scheduling
    return (
        scheduling.node_policy is NodePolicy.FRAGMENTATION
        and scheduling.fragmentation_filter is FragmentationFilter.ONE
    )


def _asks_a_device(spec: Mapping[str, Any], config: ControlConfig) -> bool:
    """Whether a container names one of HAMi's or the enabled vendors' resources, or the pod uses
    ResourceClaims (its devices are not in the fragmentation measure)."""
    if spec.get("resourceClaims"):
        return True
    names = set(config.requests.names.all) | {r for v in config.registry.others for r in v.names.resources}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for part in ("limits", "requests"):
                values = resources.get(part)
                if isinstance(values, Mapping) and not names.isdisjoint(values):
                    return True
    return False


def review_cpu_pod(
    pod: Mapping[str, Any], operation: str, config: ControlConfig, namespace: str | None = None
) -> Decision:
    """The fragmentation component's `cpu.hami.io` entry for one pod: set `spec.schedulerName` to
    hami-scheduler on a pod that asks no GPU, so that kube-scheduler's hami-scheduler profile, whose
    second extender entry (`/cpu-filter`) chooses the node of FGD's best score, places it as the
    planner's `fragmentation-install` models (docs/planning.md, "The install"). Never denies; what it
    does not steer it allows untouched:

    - hami-control not running the component's settings (`steers_cpu_only`): every pod;
    - a pod in kube-system or hami-control's own namespace (`NEVER_STEERED_NAMESPACES`);
    - a pod that asks HAMi's or a vendor's resources (the `vgpu.hami.io` entry decides it) or uses
      ResourceClaims;
    - a pod already bound (`spec.nodeName`) or owned by a DaemonSet (its node is chosen by its
      controller: hami-scheduler would have nothing to choose, and the pod would wait on hami-control);
    - a pod naming another scheduler. An empty name is taken over, and `default-scheduler` (the API
      server defaults an empty name to it before admission) while `force_overwrite_default_scheduler`
      is on, as for GPU pods.

    The entry's matchConditions select the same pods at the API server (its patch in
    daemonset/components/fragmentation/kustomization.yaml), so these checks only guard against a changed
    manifest."""
    if operation != "CREATE":
        return _allow(f"{operation or 'no operation'}: only CREATE is steered")
    if not steers_cpu_only(config):
        return _allow("not the fragmentation install (node policy fragmentation, filter one): not steered")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        return _allow("no pod spec: not steered")
    spec: Mapping[str, Any] = pod["spec"]
    found = pod.get("metadata")
    metadata: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if namespace is None:
        namespace = _text(metadata.get("namespace"))
    never = {*NEVER_STEERED_NAMESPACES, config.kube.pod_namespace, config.election.namespace} - {""}
    if namespace in never:
        return _allow(f"namespace {namespace}: never steered")
    if _asks_a_device(spec, config):
        return _allow("asks a GPU or a device: not steered here")
    if spec.get("nodeName"):
        return _allow("already bound (spec.nodeName): not steered")
    owners = metadata.get("ownerReferences")
    if isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners
    ):
        return _allow("a DaemonSet's pod: not steered")
    scheduler = spec.get("schedulerName")
    target = config.webhook.scheduler_name
    if scheduler == target:
        return _allow("scheduler already set: nothing to change")
    if scheduler not in (None, "") and (
        scheduler != DEFAULT_SCHEDULER or not config.webhook.force_overwrite_default_scheduler
    ):
        return _allow(f"scheduler {scheduler!r} named: left alone")
    op = "add" if "schedulerName" not in spec else "replace"
    return _allow(
        patch=({"op": op, "path": "/spec/schedulerName", "value": target},),
        notes=(f"asks no GPU: scheduled by {target} (the fragmentation install)",),
    )


def handle_cpu_admission_review(body: bytes, config: ControlConfig) -> AdmissionResult:
    """Answer one `POST /webhook/cpu` body (`review_cpu_pod`). Never raises and never denies a pod: a body
    that is not a review gets the same 400/413 as `/webhook`, an error in the rules allows the pod
    untouched (the entry's failurePolicy is Ignore for the same reason: pods that ask no GPU never wait
    on hami-control)."""
    try:
        if len(body) > config.server.max_request_body:
            return _error_result(
                413,
                f"request body of {len(body)} bytes is over the limit of "
                f"{config.server.max_request_body} bytes",
            )
        try:
            review, request = _parse_review(body)
        except _BadReview as bad:
            return _error_result(bad.status, bad.message)
        summary = _summary(request)
        exception: Exception | None = None
        obj = request.get("object")
        if not _is_pod(request) or request.get("subResource"):
            decision = _allow("not a pod: not steered")
        else:
            try:
                decision = review_cpu_pod(obj or {}, request["operation"], config, summary.namespace)
            except Exception as err:
                exception = err
                decision = _allow("internal error: allowed untouched")
        return _answer(review, summary, decision, exception)
    except Exception as err:
        return _error_result(
            500, f"internal error in hami-control ({type(err).__name__})", DecisionSummary(exception=err)
        )


# --- the AdmissionReview envelope ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecisionSummary:
    """One admission decision, for the one-line decision log. `exception` is set when the rules raised
    (log it with its traceback; the client only saw a 500 denial or an untouched allow)."""

    namespace: str = ""
    name: str = ""
    """The pod's name; "" when the API server will pick it from `generate_name`."""
    generate_name: str = ""
    uid: str = ""
    operation: str = ""
    dry_run: bool = False
    allowed: bool = False
    http_status: int = 200
    code: int = 200
    patch_ops: int = 0
    patch_bytes: int = 0
    message: str = ""
    notes: tuple[str, ...] = ()
    quota_usage: QuotaUsage | None = None
    """See `Decision.quota_usage`."""
    claims: tuple[GPUClaim, ...] = ()
    """See `Decision.claims`."""
    exception: BaseException | None = field(default=None, compare=False)

    @property
    def pod(self) -> str:
        """namespace/name, or namespace/generateName* for a pod the API server names."""
        name = self.name or (f"{self.generate_name}*" if self.generate_name else "")
        return f"{self.namespace}/{name}" if self.namespace or name else "-"

    def fields(self) -> dict[str, Any]:
        """Structured fields (for a JSON or logfmt log line)."""
        out: dict[str, Any] = {
            "pod": self.pod,
            "uid": self.uid,
            "operation": self.operation,
            "allowed": self.allowed,
        }
        if self.dry_run:
            out["dry_run"] = True
        if self.http_status != 200:
            out["http_status"] = self.http_status
        if self.allowed:
            out["patch_ops"] = self.patch_ops
            out["patch_bytes"] = self.patch_bytes
        else:
            out["code"] = self.code
        if self.message:
            out["message"] = self.message
        if self.notes:
            out["notes"] = list(self.notes)
        if self.exception is not None:
            out["exception"] = f"{type(self.exception).__name__}: {self.exception}"
        return out

    def __str__(self) -> str:
        who = self.pod
        if self.http_status != 200:
            return f"admission {who}: HTTP {self.http_status}: {self.message}"
        if self.allowed:
            what = f"patch {self.patch_ops} ops/{self.patch_bytes} bytes" if self.patch_ops else "no patch"
            notes = f" ({'; '.join(self.notes)})" if self.notes else ""
            return f"admission {who} {self.operation} uid={self.uid}: allowed, {what}{notes}"
        return f"admission {who} {self.operation} uid={self.uid}: denied {self.code}: {self.message}"


class AdmissionResult(NamedTuple):
    """`status` is the HTTP status to answer with and `body` the JSON body (an AdmissionReview for 200,
    a metav1.Status otherwise); `summary` is for the log."""

    status: int
    body: dict[str, Any]
    summary: DecisionSummary


class _BadReview(Exception):
    """An AdmissionReview that cannot be answered: HTTP `status` with `message`."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


_STATUS_REASONS = {400: "BadRequest", 413: "RequestEntityTooLarge", 500: "InternalError"}


def _error_result(status: int, message: str, summary: DecisionSummary | None = None) -> AdmissionResult:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _STATUS_REASONS.get(status, "BadRequest"),
        "code": status,
    }
    summary = replace(
        summary or DecisionSummary(), allowed=False, http_status=status, code=status, message=message
    )
    return AdmissionResult(status, body, summary)


def translates(config: ControlConfig, dra_route: bool) -> bool:
    """Whether GPU pods reviewed on this route are translated to DRA (`DRATranslation`)."""
    mode = config.dra.translation
    return mode is DRATranslation.ALL or (dra_route and mode is DRATranslation.NAMESPACE)


def handle_admission_review(
    body: bytes, config: ControlConfig, quota_view: QuotaView, *, dra_route: bool = False
) -> AdmissionResult:
    """Answer one `POST /webhook` body, or with `dra_route` one `POST /webhook/dra` body (the pods of the
    namespaces that opted in to DRA): GPU pods are translated to DRA claims (rule 7) as
    `config.dra.translation` says; a GPU pod on the DRA route while translation is off is denied, naming
    the setting. Never raises.

    - 413 when `body` is longer than `config.max_request_body`;
    - 400 with a message for a body that is not JSON, not an `admission.k8s.io/v1` or `v1beta1`
      AdmissionReview, or has no usable `request` (uid, kind, operation, and the object of a pod CREATE);
    - otherwise 200 with an AdmissionReview in the request's version: `response.uid` echoes the request,
      `allowed`, `patchType: JSONPatch` and the base64 patch when there is one, `status {code, reason,
      message}` for a denial, `warnings` when there are some.

    The 4xx/5xx bodies are metav1.Status objects.
    """
    try:
        return _handle(body, config, quota_view, dra_route)
    except Exception as err:  # a bug in the envelope itself: still no traceback to the client
        return _error_result(
            500, f"internal error in hami-control ({type(err).__name__})", DecisionSummary(exception=err)
        )


def _handle(body: bytes, config: ControlConfig, quota_view: QuotaView, dra_route: bool) -> AdmissionResult:
    if len(body) > config.server.max_request_body:
        return _error_result(
            413,
            f"request body of {len(body)} bytes is over the limit of {config.server.max_request_body} bytes",
        )
    try:
        review, request = _parse_review(body)
    except _BadReview as bad:
        return _error_result(bad.status, bad.message)

    operation: str = request["operation"]
    obj = request.get("object")
    summary = _summary(request)

    exception: Exception | None = None
    if not _is_pod(request):
        decision = _allow("not a pod")
    elif request.get("subResource"):
        decision = _allow(f"subresource {request['subResource']}: not mutated")
    elif operation == "CREATE" and not isinstance(obj, Mapping):
        return _error_result(400, "request.object must be the pod being created", summary)
    else:
        try:
            translate = translates(config, dra_route)
            decision = review_pod(
                obj or {}, operation, config, quota_view, summary.namespace, translate=translate
            )
            if dra_route and not translate and decision.allowed and decision.quota_usage is not None:
                decision = _forbidden(
                    "this namespace asks for GPU pods through DRA (its webhook entry sends them to "
                    "/webhook/dra), but hami-control runs with --dra-translation off: ask your admin to set "
                    "draTranslation: namespace, or remove the namespace's label hami.io/dra"
                )
        except Exception as err:
            exception = err
            if _mentions_hami_resource(obj, config.requests.names):
                decision = _deny(
                    500,
                    "InternalError",
                    f"hami-control could not process this GPU pod ({type(err).__name__}); "
                    "please report it with the webhook's log",
                )
            else:
                decision = _allow("internal error; not a GPU pod, allowed untouched")
    return _answer(review, summary, decision, exception)


def _summary(request: Mapping[str, Any]) -> DecisionSummary:
    obj = request.get("object")
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return DecisionSummary(
        namespace=request.get("namespace") or _text(metadata.get("namespace")),
        name=request.get("name") or _text(metadata.get("name")),
        generate_name=_text(metadata.get("generateName")),
        uid=request["uid"],
        operation=request["operation"],
        dry_run=request.get("dryRun") is True,
    )


def _answer(
    review: Mapping[str, Any], summary: DecisionSummary, decision: Decision, exception: Exception | None
) -> AdmissionResult:
    """The AdmissionReview answering `review` with `decision`, and the log's summary."""
    response: dict[str, Any] = {"uid": summary.uid, "allowed": decision.allowed}
    patch_bytes = b""
    if decision.allowed and decision.patch:
        patch_bytes = orjson.dumps(list(decision.patch))
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch_bytes).decode("ascii")
    if not decision.allowed:
        response["status"] = {
            "metadata": {},
            "status": "Failure",
            "message": decision.message,
            "reason": decision.reason,
            "code": decision.code,
        }
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    out = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
    summary = replace(
        summary,
        allowed=decision.allowed,
        code=decision.code,
        patch_ops=len(decision.patch) if decision.allowed else 0,
        patch_bytes=len(patch_bytes),
        message=decision.message,
        notes=decision.notes,
        quota_usage=decision.quota_usage if decision.allowed else None,
        claims=decision.claims if decision.allowed else (),
        exception=exception,
    )
    return AdmissionResult(200, out, summary)


_DENIAL_REASONS = {403: "Forbidden", 422: "Invalid", 500: "InternalError"}


def denied_result(result: AdmissionResult, code: int, message: str) -> AdmissionResult:
    """`result` (an allowed pod's answer) turned into a denial with `code` and `message`, for what the
    caller finds after the review (a translated pod's templates could not be created); warnings kept."""
    body = dict(result.body)
    old = body.get("response")
    old = old if isinstance(old, Mapping) else {}
    response: dict[str, Any] = {"uid": result.summary.uid, "allowed": False}
    response["status"] = {
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _DENIAL_REASONS.get(code, "Forbidden"),
        "code": code,
    }
    if "warnings" in old:
        response["warnings"] = old["warnings"]
    body["response"] = response
    summary = replace(
        result.summary,
        allowed=False,
        code=code,
        patch_ops=0,
        patch_bytes=0,
        message=message,
        quota_usage=None,
        claims=(),
    )
    return AdmissionResult(result.status, body, summary)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _parse_review(body: bytes) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise _BadReview(400, f"request body is not valid JSON: {err}") from None
    if not isinstance(review, dict):
        raise _BadReview(400, "request body must be an AdmissionReview object")
    api_version = review.get("apiVersion")
    if api_version not in REVIEW_VERSIONS:
        raise _BadReview(400, f"apiVersion {_shown(api_version)} is not one of {', '.join(REVIEW_VERSIONS)}")
    if review.get("kind") != "AdmissionReview":
        raise _BadReview(400, f"kind {_shown(review.get('kind'))} is not AdmissionReview")
    request = review.get("request")
    if not isinstance(request, dict):
        raise _BadReview(400, "AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise _BadReview(400, "request.uid is missing")
    if not isinstance(request.get("operation"), str):
        raise _BadReview(400, f"request.operation {_shown(request.get('operation'))} is not a string")
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise _BadReview(400, f"request.kind {_shown(kind)} is not a group/version/kind")
    for key in ("namespace", "name", "subResource"):
        if request.get(key) is not None and not isinstance(request[key], str):
            raise _BadReview(400, f"request.{key} {_shown(request[key])} is not a string")
    return review, request


def _is_pod(request: Mapping[str, Any]) -> bool:
    kind = request["kind"]
    return bool(kind.get("kind") == "Pod" and kind.get("group", "") in ("", None))


__all__ = [
    "CPU_WEBHOOK_PATH",
    "DEFAULT_SCHEDULER",
    "ENV_CORE_POLICY",
    "ENV_TASK_PRIORITY",
    "ENV_VISIBLE_DEVICES",
    "REVIEW_VERSIONS",
    "AdmissionResult",
    "Decision",
    "DecisionSummary",
    "JSONPatchOp",
    "denied_result",
    "escape_pointer_token",
    "handle_admission_review",
    "handle_cpu_admission_review",
    "json_patch_diff",
    "review_cpu_pod",
    "review_pod",
    "steers_cpu_only",
    "translates",
]
