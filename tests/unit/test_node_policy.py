"""The ValidatingAdmissionPolicy that keeps hami-node to its own Node
(daemonset/base/node/admission-policy.yaml), evaluated as kube-apiserver evaluates it, on the patches
hami-node really sends.

The harness (`admit`) follows kube-apiserver's validating admission policy plugin
(k8s.io/apiserver pkg/admission/plugin/policy/validating: dispatcher.go, validator.go; matching in
pkg/admission/plugin/policy/matching and pkg/admission/plugin/cel): the policy's matchConstraints
(resource rules) and the binding's, then the matchConditions (any false: not applied; an error: the
failure policy), then the variables in order, then every validation; the request is refused with the first
failing validation's messageExpression (a string), else its message, else "failed expression: ...", as
"ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>". An expression
that fails to evaluate follows failurePolicy. The CEL runs on `cel` (common-expression-language), with
the variables kube-apiserver gives: `object`, `oldObject` (null where absent), `request` (the
AdmissionRequest as JSON, its omitempty fields left out, as `userInfo.extra` is for a token with
no extra), `params` and `namespaceObject` (null: no paramKind, Nodes are cluster-scoped), `variables`.

The requests are built from what hami-node sends: the real `NodeReporter` over the real `NodeApi`, whose
bridge here records each merge patch and applies it to the Node (as the API server does, before
admission: the patched object is `object`, the stored one `oldObject`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from hami_api import annotations as ann
from hami_api.types import GPUPairScore
from hami_node.gpu.topology import TopologyScores
from hami_node.kubeapi import NodeApi
from hami_node.reporter import NodeReporter
from hami_sim.apiserver.patch import json_merge_patch
from tests.builders import gpu_info

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "daemonset" / "base" / "node" / "admission-policy.yaml"
K8S_VERSION = "1.32"
"""The schemas the base targets (tests/unit/test_manifests.py)."""

HAMI_NODE = "system:serviceaccount:hami-system:hami-node"
HAMI_NODE_DRA = "system:serviceaccount:hami-system:hami-node-dra"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

Doc = dict[str, Any]


def _docs() -> tuple[Doc, Doc]:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], kinds
    return docs[0], docs[1]


POLICY, BINDING = _docs()


# --- the harness ---------------------------------------------------------------------------------------


@dataclass
class Attributes:
    """What admission sees of one request (k8s.io/apiserver pkg/admission Attributes)."""

    operation: str
    name: str
    username: str
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)
    object: Doc | None = None
    old_object: Doc | None = None
    resource: tuple[str, str, str] = ("", "v1", "nodes")
    kind: str = "Node"
    subresource: str = ""
    namespace: str = ""


def _request(a: Attributes) -> Doc:
    """The AdmissionRequest as CEL sees it (pkg/admission/plugin/cel/condition.go CreateAdmissionRequest),
    omitempty fields left out."""
    group, version, resource = a.resource
    user: Doc = {"username": a.username, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if a.extra:
        user["extra"] = {k: list(v) for k, v in a.extra.items()}
    request: Doc = {
        "uid": "00000000-0000-0000-0000-000000000001",
        "kind": {"group": group, "version": version, "kind": a.kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": a.kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": a.name,
        **({"namespace": a.namespace} if a.namespace else {}),
        "operation": a.operation,
        "userInfo": user,
        "dryRun": False,
    }
    if a.subresource:
        request["subResource"] = request["requestSubResource"] = a.subresource
    return request


def _rule_matches(rule: Mapping[str, Any], a: Attributes) -> bool:
    group, version, resource = a.resource
    plural = f"{resource}/{a.subresource}" if a.subresource else resource

    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    return (
        has("apiGroups", group)
        and has("apiVersions", version)
        and has("operations", a.operation)
        and has("resources", plural)
        and (not rule.get("resourceNames") or a.name in rule["resourceNames"])
        and rule.get("scope", "*") in ("*", "Namespaced" if a.namespace else "Cluster")
    )


def _constraints_match(constraints: Mapping[str, Any] | None, a: Attributes) -> bool:
    """matchResources (pkg/admission/plugin/policy/matching): a resource rule matches and no exclude rule
    does. Nodes are cluster-scoped, so namespaceSelector does not apply; no objectSelector is used."""
    if constraints is None:
        return True
    assert not constraints.get("objectSelector"), "the harness does not evaluate objectSelector"
    include = constraints.get("resourceRules")
    matched = include is None or any(_rule_matches(r, a) for r in include)
    excluded = any(_rule_matches(r, a) for r in constraints.get("excludeResourceRules") or [])
    return matched and not excluded


def _evaluate(expression: str, variables: Mapping[str, Any]) -> Any:
    return cel.evaluate(expression, cel.Context(variables=dict(variables)))


def admit(a: Attributes, policy: Doc = POLICY, binding: Doc = BINDING) -> str | None:
    """None when kube-apiserver lets the request through, else the message it refuses it with."""
    spec = policy["spec"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    if not _constraints_match(spec.get("matchConstraints"), a):
        return None
    if not _constraints_match(binding["spec"].get("matchResources"), a):
        return None
    prefix = (
        f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
        f"'{binding['metadata']['name']}' denied request: "
    )
    fail_open = spec.get("failurePolicy", "Fail") == "Ignore"
    env: dict[str, Any] = {
        "object": copy.deepcopy(a.object),
        "oldObject": copy.deepcopy(a.old_object),
        "request": _request(a),
        "params": None,
        "namespaceObject": None,
    }
    errors: list[str] = []
    for condition in spec.get("matchConditions") or []:
        try:
            result = _evaluate(condition["expression"], env)
        except Exception as err:
            errors.append(f"matchCondition {condition['name']}: {err}")
            continue
        if result is False:
            return None
        assert result is True, f"matchCondition {condition['name']} gave {result!r}, not a bool"
    if errors:
        return None if fail_open else prefix + errors[0]
    computed: dict[str, Any] = {}
    env["variables"] = computed
    for variable in spec.get("variables") or []:
        computed[variable["name"]] = _evaluate(variable["expression"], env)
    for validation in spec["validations"]:
        try:
            result = _evaluate(validation["expression"], env)
        except Exception as err:
            if fail_open:
                continue
            return prefix + f"expression {validation['expression']!r} failed: {err}"
        if result is True:
            continue
        message = ""
        if "messageExpression" in validation:
            evaluated = _evaluate(validation["messageExpression"], env)
            message = evaluated.strip() if isinstance(evaluated, str) and "\n" not in evaluated else ""
        message = message or " ".join(validation.get("message", "").split())
        message = message or f"failed expression: {validation['expression'].strip()}"
        return prefix + message
    return None


# --- what hami-node sends ------------------------------------------------------------------------------


def stored_node(name: str, annotations: Mapping[str, str] | None = None) -> Doc:
    """A Node as kubelet registers it (labels, spec, status), at resourceVersion 7."""
    meta: Doc = {
        "name": name,
        "uid": f"uid-{name}",
        "resourceVersion": "7",
        "labels": {"kubernetes.io/hostname": name, "gpu": "on"},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"capacity": {"nvidia.com/gpu": "20"}},
    }


@dataclass
class Write:
    path: str
    body: Doc
    old: Doc
    new: Doc


class RecordingBridge:
    """The `BlockingKubeApi` calls `NodeApi` makes, served from a dict of Nodes: GET returns one, a merge
    PATCH is applied to it (as the API server does before admission) and recorded."""

    def __init__(self, nodes: Mapping[str, Doc]) -> None:
        self.nodes = {name: copy.deepcopy(node) for name, node in nodes.items()}
        self.writes: list[Write] = []
        self.lock = threading.Lock()

    def _node(self, path: str) -> str:
        prefix = "/api/v1/nodes/"
        assert path.startswith(prefix), path
        return path[len(prefix) :]

    def get(
        self, path: str, params: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> Doc:
        with self.lock:
            return copy.deepcopy(self.nodes[self._node(path)])

    def patch(self, path: str, body: Doc, patch_type: Any = None, *, timeout_s: float | None = None) -> Doc:
        with self.lock:
            name = self._node(path)
            old = self.nodes[name]
            new = json_merge_patch(copy.deepcopy(old), copy.deepcopy(body))
            new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
            self.writes.append(Write(path, copy.deepcopy(body), copy.deepcopy(old), copy.deepcopy(new)))
            self.nodes[name] = new
            return copy.deepcopy(new)


def reporter_writes(node: str, *, existing: Mapping[str, str] | None = None) -> list[Write]:
    """The patches the real inventory reporter sends for a two-GPU node with pair scores."""
    bridge = RecordingBridge({node: stored_node(node, existing)})
    scores = TopologyScores(
        (GPUPairScore.of("GPU-0", {"GPU-1": 100}), GPUPairScore.of("GPU-1", {"GPU-0": 100}))
    )
    reporter = NodeReporter(NodeApi(bridge), node, topology=lambda uuids: scores)  # type: ignore[arg-type]
    reporter.publish([gpu_info(0), gpu_info(1)])
    reporter.start()
    try:
        assert reporter.wait_synced(10.0), "the reporter did not write the Node"
    finally:
        reporter.stop()
    assert bridge.writes, "the reporter sent no patch"
    return bridge.writes


def node_api_write(
    node: Doc, annotations: Mapping[str, str | None], resource_version: str | None = None
) -> Write:
    """One `NodeApi.patch_node_annotations` call, as hami_node/pods.py (lock release) and
    hami_node/dra/publisher.py (stale inventory removal) make it."""
    bridge = RecordingBridge({node["metadata"]["name"]: node})
    NodeApi(bridge).patch_node_annotations(  # type: ignore[arg-type]
        node["metadata"]["name"], annotations, resource_version
    )
    (write,) = bridge.writes
    return write


def update(
    write: Write, username: str = HAMI_NODE, token_node: str | None = None, **extra: list[str]
) -> Attributes:
    """The admission attributes of a write by `username` whose token is bound to `token_node`."""
    name = write.new["metadata"]["name"]
    extras: dict[str, list[str]] = {k.replace("_", "-"): v for k, v in extra.items()}
    if token_node is not None:
        extras[NODE_NAME_KEY] = [token_node]
    return Attributes("UPDATE", name, username, extras, write.new, write.old)


# --- the tests -----------------------------------------------------------------------------------------


def test_the_policy_and_binding_validate_against_the_kubernetes_schemas() -> None:
    for doc in (POLICY, BINDING):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_base_installs_the_policy_and_its_binding() -> None:
    base = yaml.safe_load((REPO / "daemonset" / "base" / "kustomization.yaml").read_text())
    assert "node/admission-policy.yaml" in base["resources"]


@pytest.mark.parametrize("username", [HAMI_NODE, HAMI_NODE_DRA])
def test_hami_node_may_write_its_inventory_on_its_own_node(username: str) -> None:
    writes = reporter_writes("gpu-1")
    bodies = [w.body for w in writes]
    assert bodies == [
        {"metadata": {"annotations": {
            ann.NODE_REGISTER: writes[0].new["metadata"]["annotations"][ann.NODE_REGISTER],
            ann.NODE_PAIR_SCORE: writes[0].new["metadata"]["annotations"][ann.NODE_PAIR_SCORE],
        }}}
    ]  # fmt: skip
    for write in writes:
        assert admit(update(write, username, "gpu-1")) is None


def test_hami_node_may_update_an_inventory_it_wrote_before() -> None:
    first = reporter_writes("gpu-1")[-1].new["metadata"]["annotations"]
    stale = {ann.NODE_REGISTER: first[ann.NODE_REGISTER].replace("16000", "15000"), "other": "kept"}
    (write,) = reporter_writes("gpu-1", existing=stale)
    assert set(write.body["metadata"]["annotations"]) == {ann.NODE_REGISTER, ann.NODE_PAIR_SCORE}
    assert admit(update(write, token_node="gpu-1")) is None


def test_hami_node_may_remove_its_inventory_and_release_the_lock_it_holds() -> None:
    node = stored_node("gpu-1", {ann.NODE_REGISTER: "[]", ann.NODE_PAIR_SCORE: "[]", "other": "kept"})
    removal = node_api_write(node, {ann.NODE_REGISTER: None, ann.NODE_PAIR_SCORE: None})
    assert admit(update(removal, HAMI_NODE_DRA, "gpu-1")) is None

    locked = stored_node("gpu-1", {ann.NODE_LOCK: "2026-01-01T00:00:00Z,default,p", "other": "kept"})
    release = node_api_write(locked, {ann.NODE_LOCK: None}, "7")
    assert release.body == {"metadata": {"annotations": {ann.NODE_LOCK: None}, "resourceVersion": "7"}}
    assert admit(update(release, token_node="gpu-1")) is None


def test_hami_node_may_not_write_another_node() -> None:
    (write,) = reporter_writes("gpu-2")
    message = admit(update(write, token_node="gpu-1"))
    assert message == (
        "ValidatingAdmissionPolicy 'hami-node-own-node' with binding 'hami-node-own-node' denied request: "
        "hami-node on node gpu-1 may not change Node gpu-2"
    )
    assert admit(update(write, HAMI_NODE_DRA, "gpu-1")) == message


@pytest.mark.parametrize(
    "extra",
    [{}, {"authentication.kubernetes.io/pod-name": ["hami-node-x"]}, {NODE_NAME_KEY: []}],
    ids=["no-extra", "pod-name-only", "empty-node-name"],
)
def test_a_token_that_names_no_node_may_not_write_any_node(extra: dict[str, list[str]]) -> None:
    (write,) = reporter_writes("gpu-1")
    attributes = Attributes("UPDATE", "gpu-1", HAMI_NODE, extra, write.new, write.old)
    message = admit(attributes)
    assert message is not None
    assert message.endswith(
        "denied request: hami-node's service-account token names no node "
        "(authentication.kubernetes.io/node-name): it must be a token projected into the pod, "
        "on Kubernetes >= 1.30"
    )


def _own(node: Doc, change: Doc) -> Attributes:
    new = json_merge_patch(copy.deepcopy(node), copy.deepcopy(change))
    return Attributes("UPDATE", "gpu-1", HAMI_NODE, {NODE_NAME_KEY: ["gpu-1"]}, new, node)


ANNOTATIONS_DENIED = (
    "hami-node may set only the annotations hami.io/node-nvidia-register and hami.io/node-nvidia-score, "
    "and remove hami.io/mutex.lock"
)
FIELDS_DENIED = "hami-node may not change a Node's labels, finalizers, owners or spec"


@pytest.mark.parametrize(
    ("change", "denied"),
    [
        ({"metadata": {"annotations": {"other": "changed"}}}, ANNOTATIONS_DENIED),
        ({"metadata": {"annotations": {"other": None}}}, ANNOTATIONS_DENIED),
        ({"metadata": {"annotations": {"new": "x"}}}, ANNOTATIONS_DENIED),
        ({"metadata": {"annotations": {ann.NODE_LOCK: "2026-01-01T00:00:00Z,ns,q"}}}, ANNOTATIONS_DENIED),
        ({"metadata": {"annotations": {ann.DEVICE_CORDON: "GPU-0"}}}, ANNOTATIONS_DENIED),
        ({"metadata": {"labels": {"gpu": "off"}}}, FIELDS_DENIED),
        ({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, FIELDS_DENIED),
        ({"metadata": {"finalizers": ["x"]}}, FIELDS_DENIED),
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]}},
         FIELDS_DENIED),
        ({"spec": {"unschedulable": True}}, FIELDS_DENIED),
        ({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, FIELDS_DENIED),
    ],
    ids=["change-other-annotation", "remove-other-annotation", "add-annotation", "take-lock", "cordon-gpu",
         "relabel", "add-label", "finalizer", "owner", "cordon", "taint"],
)  # fmt: skip
def test_hami_node_may_change_nothing_else_on_its_own_node(change: Doc, denied: str) -> None:
    node = stored_node("gpu-1", {"other": "kept", ann.NODE_LOCK: "2026-01-01T00:00:00Z,default,p"})
    message = admit(_own(node, change))
    assert message is not None
    assert message.endswith(f"denied request: {denied}")


def test_hami_node_may_neither_create_nor_delete_a_node() -> None:
    node = stored_node("gpu-1")
    token = {NODE_NAME_KEY: ["gpu-1"]}
    create = admit(Attributes("CREATE", "gpu-1", HAMI_NODE, token, node, None))
    delete = admit(Attributes("DELETE", "gpu-1", HAMI_NODE, token, None, node))
    assert create is not None
    assert create.endswith("denied request: hami-node never creates or deletes a Node (CREATE gpu-1)")
    assert delete is not None
    assert delete.endswith("denied request: hami-node never creates or deletes a Node (DELETE gpu-1)")


@pytest.mark.parametrize(
    "username",
    [
        "system:node:gpu-1",
        "system:serviceaccount:hami-system:hami-control",
        "system:serviceaccount:other:hami-node",
        "kubernetes-admin",
    ],
)
def test_other_users_are_not_looked_at(username: str) -> None:
    (write,) = reporter_writes("gpu-2")
    node = stored_node("gpu-2")
    assert admit(update(write, username, "gpu-1")) is None
    assert admit(update(write, username)) is None
    relabel = Attributes("UPDATE", "gpu-2", username, {}, json_merge_patch(copy.deepcopy(node),
                         {"metadata": {"labels": {"gpu": "off"}}}), node)  # fmt: skip
    assert admit(relabel) is None
    assert admit(Attributes("DELETE", "gpu-2", username, {}, None, node)) is None


def test_other_requests_of_hami_node_are_not_looked_at() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}
    patched = {**pod, "metadata": {**pod["metadata"], "annotations": {ann.BIND_PHASE: "success"}}}
    for token in ({}, {NODE_NAME_KEY: ["gpu-1"]}):
        pods = ("", "v1", "pods")
        assert (
            admit(Attributes("UPDATE", "p", HAMI_NODE, token, patched, pod, pods, "Pod", namespace="default"))
            is None
        )
    status = stored_node("gpu-2")
    assert admit(Attributes("UPDATE", "gpu-2", HAMI_NODE, {}, status, status, subresource="status")) is None
