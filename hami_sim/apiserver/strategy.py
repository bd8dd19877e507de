"""What each served resource is, and kube-apiserver's per-resource rules: defaulting on create,
what an update or a status update may change, and the validation the rest of the project relies on.

Functions here are pure apart from the `now`/`uid` values the caller passes in.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity
from hami_sim.apiserver import resource_v1
from hami_sim.apiserver.errors import ApiError, bad_request, invalid
from hami_sim.apiserver.resource_v1 import DEFAULT_FEATURE_GATES, FeatureGates

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """One served resource (a REST collection) and how it behaves."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Field selectors the resource supports beyond metadata.name/metadata.namespace.
    extra_field_labels: tuple[str, ...] = ()
    # The field whose equality selector indexes watchers (kubelets watch spec.nodeName=<node>).
    watch_index_field: str = "metadata.name"
    # Whether DELETE answers the deleted object (kube does for pods) or a Status.
    delete_returns_object: bool = False
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    field_labels: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        labels = {"metadata.name", *self.extra_field_labels}
        if self.namespaced:
            labels.add("metadata.namespace")
        object.__setattr__(self, "field_labels", frozenset(labels))

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


POD = ResourceInfo(
    "",
    "v1",
    "Pod",
    "pods",
    "pod",
    True,
    short_names=("po",),
    subresources=("status", "binding"),
    categories=("all",),
    extra_field_labels=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    watch_index_field="spec.nodeName",
    delete_returns_object=True,
)
NODE = ResourceInfo(
    "", "v1", "Node", "nodes", "node", False, short_names=("no",), subresources=("status",),
    extra_field_labels=("spec.unschedulable",),
)  # fmt: skip
NAMESPACE = ResourceInfo(
    "", "v1", "Namespace", "namespaces", "namespace", False, short_names=("ns",), subresources=("status",),
    extra_field_labels=("status.phase",), delete_returns_object=True,
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
)  # fmt: skip
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)
EVENT = ResourceInfo(
    "", "v1", "Event", "events", "event", True, short_names=("ev",), extra_field_labels=_EVENT_FIELDS
)
RESOURCE_QUOTA = ResourceInfo(
    "", "v1", "ResourceQuota", "resourcequotas", "resourcequota", True, short_names=("quota",),
    subresources=("status",), delete_returns_object=True,
)  # fmt: skip
LEASE = ResourceInfo("coordination.k8s.io", "v1", "Lease", "leases", "lease", True)
SECRET = ResourceInfo("", "v1", "Secret", "secrets", "secret", True, extra_field_labels=("type",))
CONFIG_MAP = ResourceInfo("", "v1", "ConfigMap", "configmaps", "configmap", True, short_names=("cm",))
MUTATING_WEBHOOK_CONFIGURATION = ResourceInfo(
    "admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations",
    "mutatingwebhookconfiguration", False,
)  # fmt: skip
# Stored (daemonset/base/node/admission-policy.yaml installs them), defaulted as kube does
# (pkg/apis/admissionregistration/v1/defaults.go), not evaluated: tests/unit/test_node_policy.py evaluates
# hami-node's policy as kube-apiserver would.
VALIDATING_ADMISSION_POLICY = ResourceInfo(
    "admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies",
    "validatingadmissionpolicy", False, subresources=("status",),
)  # fmt: skip
VALIDATING_ADMISSION_POLICY_BINDING = ResourceInfo(
    "admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
    "validatingadmissionpolicybindings", "validatingadmissionpolicybinding", False,
)  # fmt: skip
EVENTS_V1_EVENT = ResourceInfo(
    "events.k8s.io", "v1", "Event", "events", "event", True, short_names=("ev",),
    extra_field_labels=("reason", "type", "regarding.kind", "regarding.name", "regarding.namespace"),
)  # fmt: skip
# resource.k8s.io/v1 (DRA). Field selectors: `pkg/registry/resource/resourceslice/strategy.go`
# (ResourceSliceToSelectableFields: spec.nodeName, spec.driver); watchers index on the node.
DEVICE_CLASS = ResourceInfo("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", "deviceclass", False)
RESOURCE_SLICE = ResourceInfo(
    "resource.k8s.io", "v1", "ResourceSlice", "resourceslices", "resourceslice", False,
    extra_field_labels=("spec.nodeName", "spec.driver"), watch_index_field="spec.nodeName",
)  # fmt: skip
RESOURCE_CLAIM = ResourceInfo(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", "resourceclaim", True,
    subresources=("status",),
)  # fmt: skip
RESOURCE_CLAIM_TEMPLATE = ResourceInfo(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", "resourceclaimtemplate", True
)

RESOURCES: tuple[ResourceInfo, ...] = (
    POD,
    NODE,
    NAMESPACE,
    EVENT,
    RESOURCE_QUOTA,
    LEASE,
    SECRET,
    CONFIG_MAP,
    MUTATING_WEBHOOK_CONFIGURATION,
    VALIDATING_ADMISSION_POLICY,
    VALIDATING_ADMISSION_POLICY_BINDING,
    EVENTS_V1_EVENT,
    DEVICE_CLASS,
    RESOURCE_SLICE,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
)

# (group, version, plural) -> resource
BY_PATH: dict[tuple[str, str, str], ResourceInfo] = {(r.group, r.version, r.plural): r for r in RESOURCES}

# group -> versions served, in preference order
GROUP_VERSIONS: dict[str, tuple[str, ...]] = {}
for _r in RESOURCES:
    if _r.version not in GROUP_VERSIONS.get(_r.group, ()):
        GROUP_VERSIONS[_r.group] = (*GROUP_VERSIONS.get(_r.group, ()), _r.version)

STARTUP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_body_type(info: ResourceInfo, body: JSON, *, expected_kind: str | None = None) -> None:
    """Reject a body whose apiVersion/kind name another resource; both may be omitted, as kube allows."""
    kind = expected_kind or info.kind
    api_version = info.api_version if expected_kind is None else "v1"
    got_kind = body.get("kind")
    got_version = body.get("apiVersion")
    if got_kind not in (None, "") and got_kind != kind:
        raise bad_request(
            f'the kind "{got_kind}" in the request body does not match the resource: expected "{kind}"'
        )
    if got_version not in (None, "") and got_version != api_version:
        raise bad_request(
            f'the API version "{got_version}" in the request body does not match the expected API version '
            f'"{api_version}" for kind "{kind}"'
        )
    body["kind"] = kind
    body["apiVersion"] = api_version


def validate_name(info: ResourceInfo, name: str) -> None:
    """kube's name rules: DNS-1123 label for namespaces, DNS-1123 subdomain for the rest."""
    if info is NAMESPACE:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            raise invalid(
                info.group,
                info.kind,
                name,
                [
                    (
                        "metadata.name",
                        "Invalid value",
                        f'"{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric '
                        "characters or '-', and must start and end with an alphanumeric character",
                    )
                ],
            )
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise invalid(
            info.group,
            info.kind,
            name,
            [
                (
                    "metadata.name",
                    "Invalid value",
                    f'"{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
                    "characters, '-' or '.', and must start and end with an alphanumeric character",
                )
            ],
        )


def _check_string_map(info: ResourceInfo, name: str, meta: JSON, key: str) -> None:
    value = meta.get(key)
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise bad_request(f"metadata.{key} of {info.kind} {name!r} must be a map of strings, got {value!r}")


def check_metadata(info: ResourceInfo, body: JSON) -> JSON:
    """The body's metadata as a dict (400 when it is not an object)."""
    meta = body.get("metadata")
    if meta is None:
        meta = {}
        body["metadata"] = meta
    if not isinstance(meta, dict):
        raise bad_request(f"metadata of {info.kind} must be an object, got {meta!r}")
    name = str(meta.get("name") or "")
    _check_string_map(info, name, meta, "labels")
    _check_string_map(info, name, meta, "annotations")
    return meta


# ---------------------------------------------------------------------------------------------
# Defaulting (what kube's defaulters and built-in admission plugins add before webhooks run)


def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    if ":" not in last or last.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _default_container(container: Any) -> None:
    if not isinstance(container, dict):
        return
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = container.get("image")
    if isinstance(image, str) and image:
        container.setdefault("imagePullPolicy", _image_pull_policy(image))
    resources = container.get("resources")
    if resources is None:
        resources = container["resources"] = {}
    if isinstance(resources, dict):
        limits = resources.get("limits")
        if isinstance(limits, dict) and limits:
            requests = resources.get("requests")
            if not isinstance(requests, dict):
                requests = resources["requests"] = {}
            for key, value in limits.items():
                requests.setdefault(key, value)
    ports = container.get("ports")
    if isinstance(ports, list):
        for port in ports:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


_DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)


def default_pod_spec(spec: JSON) -> None:
    """Defaults of `SetDefaults_PodSpec`/`SetDefaults_Container`, and the Priority, ServiceAccount and
    DefaultTolerationSeconds admission plugins (idempotent)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if isinstance(containers, list):
            for container in containers:
                _default_container(container)
    tolerations = spec.get("tolerations")
    if tolerations is None:
        tolerations = spec["tolerations"] = []
    if isinstance(tolerations, list):
        for default in _DEFAULT_TOLERATIONS:
            if not any(
                isinstance(t, dict)
                and t.get("key") == default["key"]
                and t.get("effect") in (None, "", "NoExecute")
                for t in tolerations
            ):
                tolerations.append(dict(default))


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki|)$")
_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def _quantity(value: Any) -> float | None:
    text = str(value)
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, suffix = match.groups()
    try:
        base = float(number)
    except ValueError:
        return None
    if suffix[:1] in ("e", "E"):
        return base * 10.0 ** int(suffix[1:])
    return base * _SUFFIX.get(suffix, 1.0)


def pod_qos_class(spec: JSON) -> str:
    """Guaranteed, Burstable or BestEffort, from cpu and memory requests and limits."""
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    guaranteed = True
    containers = [
        c for key in ("containers", "initContainers") for c in (spec.get(key) or []) if isinstance(c, dict)
    ]
    for container in containers:
        resources = container.get("resources") or {}
        req = {
            k: _quantity(v) for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")
        }
        lim = {k: _quantity(v) for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")}
        for k, v in req.items():
            if v:
                requests[k] = requests.get(k, 0.0) + v
        for k, v in lim.items():
            if v:
                limits[k] = limits.get(k, 0.0) + v
        if set(lim) != {"cpu", "memory"} or any(req.get(k) not in (None, lim[k]) for k in lim):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# ---------------------------------------------------------------------------------------------
# Quantity values (k8s pkg/apis/core/validation/validation.go ValidateResourceQuantityValue, and
# pkg/apis/core/helper IsIntegerResourceName). The body's quantities are already canonical text.

_INTEGER_RESOURCES = frozenset(
    {
        "pods",
        "resourcequotas",
        "services",
        "replicationcontrollers",
        "secrets",
        "configmaps",
        "persistentvolumeclaims",
        "services.nodeports",
        "services.loadbalancers",
    }
)
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _is_extended_resource(name: str) -> bool:
    """A resource named `<domain>/<name>` outside kubernetes.io (IsExtendedResourceName)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".rpartition("/")
    return bool(
        _DNS1123_SUBDOMAIN.match(prefix)
        and len(prefix) <= 253
        and _QUALIFIED_NAME.fullmatch(short)
        and len(short) <= 63
    )


def is_integer_resource(name: str) -> bool:
    return name in _INTEGER_RESOURCES or _is_extended_resource(name)


def resource_value_causes(resources: Any, path: str, *, keyed: bool = True) -> list[tuple[str, str, str]]:
    """kube's value checks on a resource list: not negative, and a whole number for integer resources.
    `path` names the list; an entry is `path[name]` (`keyed`) or `path.name` (node capacity)."""
    causes: list[tuple[str, str, str]] = []
    if not isinstance(resources, dict):
        return causes
    for name, value in resources.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            continue  # decoding already refused what does not parse
        for problem in _value_problems(str(name), value):
            where = f"{path}[{name}]" if keyed else f"{path}.{name}"
            causes.append((where, "Invalid value", f'"{value}": {problem}'))
    return causes


@functools.lru_cache(maxsize=4096)
def _value_problems(name: str, value: str | int | float) -> tuple[str, ...]:
    """What kube's validation says about one resource quantity (remembered: the same few recur)."""
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return ()  # decoding already refused what does not parse
    problems = []
    if amount < 0:
        problems.append("must be greater than or equal to 0")
    if is_integer_resource(name) and amount.denominator != 1:
        problems.append("must be an integer")
    return tuple(problems)


def _container_resource_causes(spec: JSON) -> list[tuple[str, str, str]]:
    causes: list[tuple[str, str, str]] = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(key) or []):
            resources = container.get("resources") if isinstance(container, dict) else None
            if isinstance(resources, dict):
                for kind in ("limits", "requests"):
                    path = f"spec.{key}[{i}].resources.{kind}"
                    causes += resource_value_causes(resources.get(kind), path)
    return causes


def validate_resource_values(info: ResourceInfo, obj: JSON) -> None:
    """422 for a negative quantity, or a fraction of an integer resource, where kube validates them:
    container resources, a node's capacity and allocatable, a quota's hard limits."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    causes: list[tuple[str, str, str]] = []
    if info is NODE:
        status = obj.get("status") or {}
        if isinstance(status, dict):
            causes += resource_value_causes(status.get("capacity"), "status.capacity", keyed=False)
            causes += resource_value_causes(status.get("allocatable"), "status.allocatable", keyed=False)
    elif info is RESOURCE_QUOTA:
        spec = obj.get("spec") or {}
        if isinstance(spec, dict):
            causes += resource_value_causes(spec.get("hard"), "spec.hard")
    if causes:
        raise invalid(info.group, info.kind, name, causes)


def _validate_pod(name: str, spec: Any) -> None:
    causes: list[tuple[str, str, str]] = []
    if not isinstance(spec, dict):
        raise invalid("", "Pod", name, [("spec", "Required value", "")])
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(("spec.containers", "Required value", ""))
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(key) or []):
            path = f"spec.{key}[{i}]"
            if not isinstance(container, dict):
                causes.append((path, "Invalid value", "must be an object"))
                continue
            cname = container.get("name")
            if not isinstance(cname, str) or not cname:
                causes.append((f"{path}.name", "Required value", ""))
            elif cname in seen:
                causes.append((f"{path}.name", "Duplicate value", f'"{cname}"'))
            else:
                seen.add(cname)
            if not container.get("image"):
                causes.append((f"{path}.image", "Required value", ""))
    causes += _container_resource_causes(spec)
    causes += _pod_claim_causes(spec)
    if causes:
        raise invalid("", "Pod", name, causes)


def _pod_claim_causes(spec: JSON) -> list[tuple[str, str, str]]:
    """`spec.resourceClaims` and the containers' `resources.claims` (core validation.go
    validatePodResourceClaims / validateResourceClaimNames)."""
    causes: list[tuple[str, str, str]] = []
    names: set[str] = set()
    claims = spec.get("resourceClaims") or []
    for i, claim in enumerate(claims if isinstance(claims, list) else []):
        path = f"spec.resourceClaims[{i}]"
        cname = claim.get("name") if isinstance(claim, dict) else None
        if not isinstance(cname, str) or not _DNS1123_LABEL.match(cname) or len(cname) > 63:
            causes.append((f"{path}.name", "Invalid value", f"{cname!r}: must be a DNS label"))
        elif cname in names:
            causes.append((f"{path}.name", "Duplicate value", f'"{cname}"'))
        else:
            names.add(cname)
        sources = [
            k
            for k in ("resourceClaimName", "resourceClaimTemplateName")
            if isinstance(claim, dict) and claim.get(k)
        ]
        if len(sources) != 1:
            causes.append(
                (
                    path,
                    "Invalid value",
                    "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                )
            )
    for key in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(key) or []):
            resources = container.get("resources") if isinstance(container, dict) else None
            used: set[str] = set()
            for j, ref in enumerate(
                (resources or {}).get("claims") or [] if isinstance(resources, dict) else []
            ):
                path = f"spec.{key}[{i}].resources.claims[{j}].name"
                rname = ref.get("name") if isinstance(ref, dict) else None
                key_ = f"{rname}/{ref.get('request', '')}" if isinstance(ref, dict) else ""
                if rname not in names:
                    known = ", ".join(sorted(names))
                    detail = "must be one of the names in pod.spec.resourceClaims" + (
                        f": {known}" if known else " which is empty"
                    )
                    causes.append((path, "Not found", f"{rname!r}: {detail}"))
                elif key_ in used:
                    causes.append((path, "Duplicate value", f'"{rname}"'))
                used.add(key_)
    return causes


def _default_webhooks(body: JSON) -> None:
    webhooks = body.get("webhooks")
    if webhooks is None:
        return
    name = str(body.get("metadata", {}).get("name", ""))
    if not isinstance(webhooks, list):
        raise invalid(MUTATING_WEBHOOK_CONFIGURATION.group, "MutatingWebhookConfiguration", name,
                      [("webhooks", "Invalid value", "must be a list")])  # fmt: skip
    causes: list[tuple[str, str, str]] = []
    for i, hook in enumerate(webhooks):
        path = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            causes.append((path, "Invalid value", "must be an object"))
            continue
        if not hook.get("name"):
            causes.append((f"{path}.name", "Required value", ""))
        if not hook.get("sideEffects"):
            causes.append((f"{path}.sideEffects", "Required value", ""))
        if not hook.get("admissionReviewVersions"):
            causes.append((f"{path}.admissionReviewVersions", "Required value", ""))
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {})
        hook.setdefault("timeoutSeconds", 10)
        hook.setdefault("reinvocationPolicy", "Never")
        client_config = hook.get("clientConfig")
        if isinstance(client_config, dict) and isinstance(client_config.get("service"), dict):
            client_config["service"].setdefault("port", 443)
        for rule in hook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
    if causes:
        raise invalid(MUTATING_WEBHOOK_CONFIGURATION.group, "MutatingWebhookConfiguration", name, causes)


def _default_match_resources(match: Any) -> None:
    """SetDefaults_MatchResources and SetDefaults_NamedRuleWithOperations (admissionregistration/v1)."""
    if not isinstance(match, dict):
        return
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    match.setdefault("matchPolicy", "Equivalent")
    for key in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(key) or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def _default_admission_policy(info: ResourceInfo, body: JSON) -> None:
    """A ValidatingAdmissionPolicy's failurePolicy (Fail) and match defaults; a binding's matchResources."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        name = str(body.get("metadata", {}).get("name", ""))
        raise invalid(info.group, info.kind, name, [("spec", "Required value", "")])
    if info is VALIDATING_ADMISSION_POLICY:
        spec.setdefault("failurePolicy", "Fail")
        _default_match_resources(spec.get("matchConstraints"))
    else:
        _default_match_resources(spec.get("matchResources"))


_ADMISSION_POLICIES = (VALIDATING_ADMISSION_POLICY, VALIDATING_ADMISSION_POLICY_BINDING)


_DRA = (DEVICE_CLASS, RESOURCE_SLICE, RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE)


def _dra_create(info: ResourceInfo, body: JSON, gates: FeatureGates) -> None:
    """resource.k8s.io/v1 on create: drop disabled fields, default, reset a claim's status, validate."""
    name = body["metadata"]["name"]
    if info is RESOURCE_SLICE:
        resource_v1.drop_disabled_slice_fields(body.get("spec"), None, gates)
        resource_v1.raise_if(resource_v1.validate_resource_slice(body), info.kind, name)
    elif info is DEVICE_CLASS:
        resource_v1.raise_if(resource_v1.validate_device_class(body), info.kind, name)
    elif info is RESOURCE_CLAIM:
        body["status"] = {}  # resourceclaim/strategy.go PrepareForCreate
        resource_v1.drop_disabled_claim_spec_fields(body.get("spec"), None, gates)
        resource_v1.default_claim_spec(body.get("spec"))
        resource_v1.raise_if(resource_v1.validate_claim_spec(body), info.kind, name)
    else:
        inner = (body.get("spec") or {}).get("spec") if isinstance(body.get("spec"), dict) else None
        resource_v1.drop_disabled_claim_spec_fields(inner, None, gates)
        resource_v1.default_claim_spec(inner)
        resource_v1.raise_if(resource_v1.validate_claim_spec(body, "spec.spec"), info.kind, name)


def _dra_update(info: ResourceInfo, new: JSON, old: JSON, subresource: str, gates: FeatureGates) -> None:
    """resource.k8s.io/v1 on update: a claim's (and a template's) spec is immutable; a claim's status
    follows ValidateResourceClaimStatusUpdate; slices keep their driver and node."""
    name = new["metadata"]["name"]
    if info is RESOURCE_CLAIM and subresource == "status":
        resource_v1.drop_disabled_status_fields(new.get("status"), old.get("status"), gates)
        resource_v1.raise_if(resource_v1.validate_claim_status(new, old), info.kind, name)
    elif info is RESOURCE_CLAIM or info is RESOURCE_CLAIM_TEMPLATE:
        resource_v1.default_claim_spec(
            new.get("spec") if info is RESOURCE_CLAIM else (new.get("spec") or {}).get("spec")
        )
        if new.get("spec") != old.get("spec"):
            raise invalid(
                resource_v1.GROUP, info.kind, name, [("spec", "Invalid value", '"...": field is immutable')]
            )
    elif info is RESOURCE_SLICE:
        resource_v1.drop_disabled_slice_fields(new.get("spec"), old.get("spec"), gates)
        resource_v1.raise_if(resource_v1.validate_resource_slice(new, old), info.kind, name)
    else:
        resource_v1.raise_if(resource_v1.validate_device_class(new), info.kind, name)


def prepare_for_create(info: ResourceInfo, body: JSON, gates: FeatureGates = DEFAULT_FEATURE_GATES) -> None:
    """Defaulting and status reset on create (kube's `PrepareForCreate` + defaulters). In place."""
    meta = body["metadata"]
    if info in _DRA:
        _dra_create(info, body, gates)
    elif info is POD:
        spec = body.get("spec")
        _validate_pod(meta["name"], spec)
        assert isinstance(spec, dict)
        default_pod_spec(spec)
        body["status"] = {"phase": "Pending", "qosClass": pod_qos_class(spec)}
    elif info is NAMESPACE:
        labels = meta.get("labels")
        meta["labels"] = {**(labels or {}), "kubernetes.io/metadata.name": meta["name"]}
        spec = body.get("spec")
        if not isinstance(spec, dict):
            spec = body["spec"] = {}
        spec.setdefault("finalizers", ["kubernetes"])
        body["status"] = {"phase": "Active"}
    elif info is RESOURCE_QUOTA:
        body["status"] = {}
    elif info is SECRET:
        if not body.get("type"):
            body["type"] = "Opaque"  # SetDefaults_Secret (pkg/apis/core/v1/defaults.go)
    elif info is MUTATING_WEBHOOK_CONFIGURATION:
        _default_webhooks(body)
    elif info in _ADMISSION_POLICIES:
        _default_admission_policy(info, body)
    elif info is NODE:
        spec = body.get("spec")
        if spec is None:
            body["spec"] = {}
    validate_resource_values(info, body)


def finish_pod_after_admission(body: JSON) -> None:
    """Re-run defaulting after webhooks changed the pod, as kube decodes and defaults the patched object."""
    spec = body.get("spec")
    name = str(body.get("metadata", {}).get("name", ""))
    _validate_pod(name, spec)
    assert isinstance(spec, dict)
    default_pod_spec(spec)
    status = body.get("status")
    if not isinstance(status, dict):
        body["status"] = status = {"phase": "Pending"}
    status["qosClass"] = pod_qos_class(spec)


_POD_MUTABLE_SPEC = (
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


def _pod_spec_without_mutable(spec: JSON) -> JSON:
    out = {k: v for k, v in spec.items() if k not in _POD_MUTABLE_SPEC}
    for key in ("containers", "initContainers"):
        containers = out.get(key)
        if isinstance(containers, list):
            out[key] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in containers
            ]
    return out


_METADATA_SYSTEM_FIELDS = ("uid", "creationTimestamp", "deletionTimestamp", "namespace", "name")


def prepare_for_update(
    info: ResourceInfo, new: JSON, old: JSON, subresource: str, gates: FeatureGates = DEFAULT_FEATURE_GATES
) -> JSON:
    """The object to store for an update of `old` with `new` (kube's `PrepareForUpdate` + validation).

    `new` is a fresh body owned by the caller; `old` is the stored object and is never modified.
    On the main resource a status change is ignored; on `status` only status (and, for pods,
    labels and annotations) changes, as kube-apiserver does.
    """
    old_meta = old["metadata"]
    new_meta = new["metadata"]
    for key in _METADATA_SYSTEM_FIELDS:
        if key in old_meta:
            new_meta[key] = old_meta[key]
        else:
            new_meta.pop(key, None)
    if subresource == "status":
        status = new.get("status")
        result = {k: v for k, v in old.items() if k not in ("status", "metadata")}
        result["metadata"] = new_meta if info is POD else dict(old_meta)
        if info is POD:
            if "ownerReferences" in old_meta:
                new_meta["ownerReferences"] = old_meta["ownerReferences"]
            else:
                new_meta.pop("ownerReferences", None)
            if (
                isinstance(status, dict)
                and not status.get("qosClass")
                and "qosClass" in old.get("status", {})
            ):
                status = {**status, "qosClass": old["status"]["qosClass"]}
        if status is not None:
            result["status"] = status
        if info in _DRA:
            _dra_update(info, result, old, subresource, gates)
        validate_resource_values(info, result)
        return result
    if info.has_status:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    if info is POD:
        spec = new.get("spec")
        _validate_pod(new_meta["name"], spec)
        assert isinstance(spec, dict)
        default_pod_spec(spec)
        if _pod_spec_without_mutable(spec) != _pod_spec_without_mutable(old.get("spec") or {}):
            raise invalid(
                "",
                "Pod",
                new_meta["name"],
                [
                    (
                        "spec",
                        "Forbidden",
                        "pod updates may not change fields other than `spec.containers[*].image`,"
                        "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                        "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                        "(allow it to be set to 1 if it was previously negative)",
                    )
                ],
            )
    elif info is MUTATING_WEBHOOK_CONFIGURATION:
        _default_webhooks(new)
    elif info in _ADMISSION_POLICIES and subresource != "status":
        _default_admission_policy(info, new)
    elif info is NAMESPACE:
        labels = new_meta.get("labels")
        new_meta["labels"] = {**(labels or {}), "kubernetes.io/metadata.name": new_meta["name"]}
    elif info in _DRA:
        _dra_update(info, new, old, subresource, gates)
    validate_resource_values(info, new)
    return new


def check_url_name(info: ResourceInfo, body_name: str, url_name: str) -> None:
    if body_name and body_name != url_name:
        raise bad_request(
            f"the name of the object ({body_name}) does not match the name on the URL ({url_name})"
        )


def field_value(obj: JSON, path: str) -> str:
    """The string value of a dotted field path (what field selectors compare), "" when absent."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
        if cur is None:
            return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return cur if isinstance(cur, str) else str(cur)


def reject(code: int, reason: str, message: str) -> ApiError:
    return ApiError(code, reason, message)
