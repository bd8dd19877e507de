"""Graceful deletion of pods, as kube-apiserver does it (pkg/registry/core/pod/strategy.go
`CheckGracefulDelete`, staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go `BeforeDelete`): a pod
bound to a node and not terminal is marked and stays until a DELETE with grace 0 (its kubelet's)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from hami_sim.apiserver import deletion
from tests.apiserver_util import bind, http
from tests.builders import pod
from tests.conftest import ApiServerHandle


def _stamp(text: Any) -> float:
    if isinstance(text, datetime.datetime):
        return text.timestamp()
    return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def _gone(core_v1: Any, name: str) -> bool:
    try:
        core_v1.read_namespaced_pod(name, "default")
    except ApiException as err:
        assert err.status == 404
        return True
    return False


def _bound(core_v1: Any, name: str = "p", **spec: Any) -> Any:
    core_v1.create_namespaced_pod("default", pod(name, **spec))
    bind(core_v1, "default", name, "n1")
    return core_v1.read_namespaced_pod(name, "default")


def test_a_bound_pod_is_marked_with_its_termination_grace_and_stays_until_a_delete_with_grace_0(
    core_v1: Any,
) -> None:
    bound = _bound(core_v1)
    assert bound.spec.termination_grace_period_seconds == 30
    start = core_v1.list_namespaced_pod("default").metadata.resource_version
    events = core_v1.list_namespaced_pod(
        "default", watch=True, resource_version=start, timeout_seconds=1, _preload_content=False
    )
    marked = core_v1.delete_namespaced_pod("p", "default")
    assert marked.metadata.deletion_grace_period_seconds == 30
    deadline = _stamp(marked.metadata.deletion_timestamp)
    assert abs(deadline - (datetime.datetime.now(datetime.UTC).timestamp() + 30)) < 5
    still = core_v1.read_namespaced_pod("p", "default")
    assert still.metadata.deletion_timestamp == marked.metadata.deletion_timestamp

    # A second DELETE keeps the earlier deadline; a longer grace does not lengthen it.
    again = core_v1.delete_namespaced_pod("p", "default")
    longer = core_v1.delete_namespaced_pod(
        "p", "default", body=client.V1DeleteOptions(grace_period_seconds=60)
    )
    for answer in (again, longer):
        assert answer.metadata.resource_version == marked.metadata.resource_version
        assert answer.metadata.deletion_grace_period_seconds == 30
    # A shorter one moves the deadline by the difference.
    shorter = core_v1.delete_namespaced_pod(
        "p", "default", body=client.V1DeleteOptions(grace_period_seconds=10)
    )
    assert shorter.metadata.deletion_grace_period_seconds == 10
    assert _stamp(shorter.metadata.deletion_timestamp) == deadline - 20

    # The kubelet's DELETE: grace 0 with its UID precondition; a stale UID is refused.
    with pytest.raises(ApiException) as err:
        core_v1.delete_namespaced_pod(
            "p",
            "default",
            body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid="x")
            ),
        )
    assert err.value.status == 409
    core_v1.delete_namespaced_pod(
        "p",
        "default",
        body=client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=bound.metadata.uid)
        ),
    )
    assert _gone(core_v1, "p")
    seen = [json.loads(line) for line in events.read().decode().splitlines() if line.strip()]
    events.release_conn()
    assert [(e["type"], e["object"]["metadata"].get("deletionGracePeriodSeconds")) for e in seen] == [
        ("MODIFIED", 30),
        ("MODIFIED", 10),
        ("DELETED", 10),
    ]


def test_an_unbound_pod_a_terminal_pod_and_a_grace_of_0_delete_at_once(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("unbound"))
    core_v1.delete_namespaced_pod("unbound", "default", body=client.V1DeleteOptions(grace_period_seconds=30))
    assert _gone(core_v1, "unbound")

    _bound(core_v1, "done")
    core_v1.patch_namespaced_pod_status("done", "default", {"status": {"phase": "Succeeded"}})
    core_v1.delete_namespaced_pod("done", "default")
    assert _gone(core_v1, "done")

    _bound(core_v1, "no-grace", terminationGracePeriodSeconds=0)
    core_v1.delete_namespaced_pod("no-grace", "default")
    assert _gone(core_v1, "no-grace")

    _bound(core_v1, "forced")
    core_v1.delete_namespaced_pod("forced", "default", grace_period_seconds=0)  # the query parameter
    assert _gone(core_v1, "forced")


def test_the_grace_comes_from_the_query_parameter_without_a_body_and_a_negative_one_is_1(
    apiserver: ApiServerHandle, core_v1: Any
) -> None:
    _bound(core_v1, "a")
    answer = core_v1.delete_namespaced_pod("a", "default", grace_period_seconds=5)
    assert answer.metadata.deletion_grace_period_seconds == 5
    _bound(core_v1, "b")
    status, body = http(
        apiserver.base_url, "DELETE", "/api/v1/namespaces/default/pods/b?gracePeriodSeconds=-3"
    )
    assert status == 200, body
    assert body["metadata"]["deletionGracePeriodSeconds"] == 1
    status, body = http(
        apiserver.base_url, "DELETE", "/api/v1/namespaces/default/pods/b?gracePeriodSeconds=soon"
    )
    assert status == 400
    assert "gracePeriodSeconds" in body["message"] and "'soon'" in body["message"]
    status, body = http(
        apiserver.base_url, "DELETE", "/api/v1/namespaces/default/pods/b", {"gracePeriodSeconds": "soon"}
    )
    assert status == 400
    assert "DeleteOptions.gracePeriodSeconds" in body["message"]


def test_a_dry_run_delete_answers_the_marked_pod_and_changes_nothing(core_v1: Any) -> None:
    bound = _bound(core_v1)
    answer = core_v1.delete_namespaced_pod("p", "default", dry_run="All")
    assert answer.metadata.deletion_grace_period_seconds == 30
    from_body = core_v1.delete_namespaced_pod("p", "default", body=client.V1DeleteOptions(dry_run=["All"]))
    assert from_body.metadata.deletion_timestamp is not None
    stored = core_v1.read_namespaced_pod("p", "default")
    assert stored.metadata.deletion_timestamp is None
    assert stored.metadata.resource_version == bound.metadata.resource_version


def test_a_terminating_pod_survives_status_updates_and_waits_for_its_finalizers(core_v1: Any) -> None:
    _bound(core_v1)
    core_v1.delete_namespaced_pod("p", "default")
    core_v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert core_v1.read_namespaced_pod("p", "default").metadata.deletion_grace_period_seconds == 30

    core_v1.create_namespaced_pod("default", pod("f"))
    core_v1.patch_namespaced_pod("f", "default", {"metadata": {"finalizers": ["example.com/keep"]}})
    bind(core_v1, "default", "f", "n1")
    core_v1.delete_namespaced_pod("f", "default")
    zero = core_v1.delete_namespaced_pod("f", "default", body=client.V1DeleteOptions(grace_period_seconds=0))
    assert zero.metadata.deletion_grace_period_seconds == 0  # kept for its finalizer
    core_v1.patch_namespaced_pod("f", "default", {"metadata": {"finalizers": None}})
    assert _gone(core_v1, "f")


def test_the_plan_of_a_graceful_delete() -> None:
    def fmt(at: float) -> str:
        return datetime.datetime.fromtimestamp(int(at), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    bound: dict[str, Any] = pod("p", node_name="n1", terminationGracePeriodSeconds=30)
    first = deletion.plan(bound, graceful=True, requested=None, now=1000.0, fmt=fmt)
    assert first.write is not None and not first.delete
    assert first.write["metadata"]["deletionTimestamp"] == fmt(1030.0)
    marked = first.write
    assert deletion.plan(marked, graceful=True, requested=None, now=1001.0, fmt=fmt) == deletion.Outcome()
    assert deletion.plan(marked, graceful=True, requested=0, now=1001.0, fmt=fmt) == deletion.Outcome(
        delete=True
    )
    assert deletion.plan(bound, graceful=False, requested=None, now=1.0, fmt=fmt) == deletion.Outcome(
        delete=True
    )
