"""pods/binding as kube-apiserver implements it: nodeName, annotations, PodScheduled, preconditions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.apiserver_util import bind, http
from tests.builders import node, pod
from tests.conftest import ApiServerHandle


def conflict_message(exc: ApiException) -> str:
    body = json.loads(exc.body or "{}")
    assert exc.status == 409
    assert body["reason"] == "Conflict"
    assert body["details"] == {"name": "p", "kind": "pods"}
    return str(body["message"])


def test_binding_assigns_node_and_copies_annotations(core_v1: Any) -> None:
    core_v1.create_node(node("n1"))
    created = core_v1.create_namespaced_pod("default", pod("p", annotations={"mine": "1"}))
    answer = bind(core_v1, "default", "p", "n1", annotations={"hami.io/vgpu-node": "n1", "mine": "2"})
    assert answer == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    bound = core_v1.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"mine": "2", "hami.io/vgpu-node": "n1"}
    conditions = [(c.type, c.status) for c in bound.status.conditions]
    assert conditions == [("PodScheduled", "True")]
    assert bound.status.conditions[0].last_transition_time is not None
    assert int(bound.metadata.resource_version) > int(created.metadata.resource_version)
    assert [
        p.metadata.name for p in core_v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items
    ] == ["p"]


def test_binding_an_assigned_pod_is_conflict(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    bind(core_v1, "default", "p", "n1")
    with pytest.raises(ApiException) as err:
        bind(core_v1, "default", "p", "n2")
    assert conflict_message(err.value) == (
        'Operation cannot be fulfilled on pods "p": pod p is already assigned to node "n1"'
    )
    assert core_v1.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_binding_preconditions(core_v1: Any) -> None:
    created = core_v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        bind(core_v1, "default", "p", "n1", uid="00000000-0000-0000-0000-000000000000")
    assert "Precondition failed: UID in precondition" in conflict_message(err.value)
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as err:
        bind(core_v1, "default", "p", "n1", resource_version=created.metadata.resource_version)
    assert "the object has been modified" in conflict_message(err.value)
    assert core_v1.read_namespaced_pod("p", "default").spec.node_name is None
    current = core_v1.read_namespaced_pod("p", "default")
    bind(
        core_v1,
        "default",
        "p",
        "n1",
        uid=current.metadata.uid,
        resource_version=current.metadata.resource_version,
    )
    assert core_v1.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_binding_errors(core_v1: Any, apiserver: ApiServerHandle) -> None:
    with pytest.raises(ApiException) as err:
        bind(core_v1, "default", "ghost", "n1")
    assert err.value.status == 404
    core_v1.create_namespaced_pod("default", pod("p"))
    code, body = http(
        apiserver.base_url,
        "POST",
        "/api/v1/namespaces/default/pods/p/binding",
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {}},
    )
    assert code == 422 and body["reason"] == "Invalid" and "target.name" in body["message"]
    code, body = http(
        apiserver.base_url,
        "POST",
        "/api/v1/namespaces/default/pods/p/binding",
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "other"}, "target": {"name": "n1"}},
    )
    assert code == 400 and "does not match" in body["message"]


def test_bindings_collection(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    response = core_v1.create_namespaced_binding(
        "default",
        client.V1Binding(metadata=client.V1ObjectMeta(name="p"), target=client.V1ObjectReference(name="n9")),
        _preload_content=False,
    )
    assert response.status == 201
    assert core_v1.read_namespaced_pod("p", "default").spec.node_name == "n9"
