"""The local API server stores ValidatingAdmissionPolicies and their bindings
(admissionregistration.k8s.io/v1) as kube-apiserver does, defaults included: hami-node's policy
(daemonset/base/node/admission-policy.yaml) applies with kubectl and reads back with the official
client. It does not evaluate them (tests/unit/test_node_policy.py evaluates hami-node's policy as
kube-apiserver would)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

POLICY_FILE = Path(__file__).resolve().parents[2] / "daemonset" / "base" / "node" / "admission-policy.yaml"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def test_the_official_client_creates_reads_lists_and_deletes_policies_and_bindings(
    api_client: client.ApiClient,
) -> None:
    api: Any = client.AdmissionregistrationV1Api(api_client)
    policy_doc, binding_doc = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    created = api.create_validating_admission_policy(policy_doc)
    assert created.metadata.name == "hami-node-own-node"
    assert created.spec.failure_policy == "Fail"
    constraints = created.spec.match_constraints
    selectors = (constraints.namespace_selector.to_dict(), constraints.object_selector.to_dict())
    assert (constraints.match_policy, *selectors) == (
        "Equivalent", {"match_expressions": None, "match_labels": None},
        {"match_expressions": None, "match_labels": None},
    )  # fmt: skip
    assert [r.scope for r in constraints.resource_rules] == ["Cluster"]
    assert [v.expression for v in created.spec.validations] == [
        v["expression"] for v in policy_doc["spec"]["validations"]
    ]
    binding = api.create_validating_admission_policy_binding(binding_doc)
    assert (binding.spec.policy_name, binding.spec.validation_actions) == ("hami-node-own-node", ["Deny"])
    assert [p.metadata.name for p in api.list_validating_admission_policy().items] == ["hami-node-own-node"]
    assert [b.metadata.name for b in api.list_validating_admission_policy_binding().items] == [
        "hami-node-own-node"
    ]
    with pytest.raises(ApiException) as err:
        api.create_validating_admission_policy(policy_doc)
    assert err.value.status == 409
    bare = api.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "bare"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                 "operations": ["CREATE"], "resources": ["pods"]}]}, "validations": [{"expression": "true"}]},
    })  # fmt: skip
    assert (bare.spec.failure_policy, bare.spec.match_constraints.resource_rules[0].scope) == ("Fail", "*")
    api.delete_validating_admission_policy("bare")
    api.delete_validating_admission_policy_binding("hami-node-own-node")
    api.delete_validating_admission_policy("hami-node-own-node")
    assert api.list_validating_admission_policy().items == []


@pytest.mark.kubectl
def test_kubectl_applies_and_gets_the_node_policy(kubectl: Kubectl) -> None:
    applied = kubectl("apply", "-f", str(POLICY_FILE))
    assert applied.stdout.split("\n")[:2] == [
        "validatingadmissionpolicy.admissionregistration.k8s.io/hami-node-own-node created",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/hami-node-own-node created",
    ]
    again = kubectl("apply", "-f", str(POLICY_FILE))
    assert "unchanged" in again.stdout.split("\n")[0], again.stdout
    names = kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-o", "name")
    assert names.stdout.split() == [
        "validatingadmissionpolicy.admissionregistration.k8s.io/hami-node-own-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/hami-node-own-node",
    ]
    kubectl("delete", "-f", str(POLICY_FILE))
    assert kubectl("get", "validatingadmissionpolicies", "-o", "name").stdout == ""
