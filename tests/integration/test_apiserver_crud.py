"""Object semantics of the stand-in API server, through the official sync and async clients."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.apiserver_util import http
from tests.builders import gpu_pod, node, pod
from tests.conftest import ApiServerHandle

STALE = (
    'Operation cannot be fulfilled on pods "p": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


def status_of(exc: ApiException) -> dict[str, object]:
    body: dict[str, object] = json.loads(exc.body or "{}")
    return body


def test_startup_namespaces(core_v1: Any) -> None:
    names = [ns.metadata.name for ns in core_v1.list_namespace().items]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    default = core_v1.read_namespace("default")
    assert default.status.phase == "Active"
    assert default.metadata.labels == {"kubernetes.io/metadata.name": "default"}


def test_create_defaults_pod_like_kube(core_v1: Any) -> None:
    created = core_v1.create_namespaced_pod("default", gpu_pod("p", gpus=1))
    meta = created.metadata
    assert meta.namespace == "default"
    assert re.fullmatch(r"[0-9a-f-]{36}", meta.uid)
    assert meta.creation_timestamp is not None
    assert meta.resource_version.isdigit()
    spec = created.spec
    assert spec.scheduler_name == "default-scheduler"
    assert spec.restart_policy == "Always"
    assert spec.termination_grace_period_seconds == 30
    assert spec.dns_policy == "ClusterFirst"
    assert spec.containers[0].termination_message_path == "/dev/termination-log"
    assert spec.containers[0].image_pull_policy == "IfNotPresent"
    assert spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "BestEffort"
    again = core_v1.read_namespaced_pod("p", "default")
    assert again.metadata.uid == meta.uid
    assert again.metadata.resource_version == meta.resource_version


def test_generate_name(core_v1: Any) -> None:
    created = core_v1.create_namespaced_pod("default", pod(None, generate_name="job-"))
    assert re.fullmatch(r"job-[a-z0-9]{5}", created.metadata.name)
    assert created.metadata.generate_name == "job-"


def test_missing_name_is_invalid(core_v1: Any) -> None:
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("default", pod(None))
    assert err.value.status == 422
    assert status_of(err.value)["reason"] == "Invalid"
    assert "name or generateName is required" in str(status_of(err.value)["message"])


def test_create_in_missing_namespace_is_404(core_v1: Any) -> None:
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("nope", pod("p"))
    assert err.value.status == 404
    status = status_of(err.value)
    assert status["message"] == 'namespaces "nope" not found'
    assert status["details"] == {"name": "nope", "kind": "namespaces"}


def test_namespace_mismatch_is_400(core_v1: Any) -> None:
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("default", pod("p", namespace="kube-system"))
    assert err.value.status == 400
    assert "does not match the namespace" in str(status_of(err.value)["message"])


def test_create_existing_is_already_exists(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("default", pod("p"))
    assert err.value.status == 409
    status = status_of(err.value)
    assert status["kind"] == "Status"
    assert status["apiVersion"] == "v1"
    assert status["status"] == "Failure"
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'pods "p" already exists'
    assert status["details"] == {"name": "p", "kind": "pods"}
    assert status["code"] == 409


def test_missing_is_not_found(core_v1: Any) -> None:
    with pytest.raises(ApiException) as err:
        core_v1.read_namespaced_pod("ghost", "default")
    assert err.value.status == 404
    assert status_of(err.value)["message"] == 'pods "ghost" not found'
    with pytest.raises(ApiException) as err:
        core_v1.read_node("ghost")
    assert status_of(err.value)["reason"] == "NotFound"


def test_resource_version_is_cluster_wide_and_increasing(core_v1: Any) -> None:
    versions = [
        core_v1.create_node(node("n1")).metadata.resource_version,
        core_v1.create_namespaced_pod("default", pod("p")).metadata.resource_version,
        core_v1.create_node(node("n2")).metadata.resource_version,
        core_v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}).metadata.resource_version,
    ]
    numbers = [int(v) for v in versions]
    assert numbers == sorted(numbers) and len(set(numbers)) == 4
    listed = core_v1.list_node()
    assert int(listed.metadata.resource_version) >= numbers[-1]


def test_stale_update_is_conflict(core_v1: Any) -> None:
    first = core_v1.create_namespaced_pod("default", pod("p"))
    current = core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"v": "2"}}})
    first.metadata.labels = {"v": "stale"}
    with pytest.raises(ApiException) as err:
        core_v1.replace_namespaced_pod("p", "default", first)
    assert err.value.status == 409
    status = status_of(err.value)
    assert status["reason"] == "Conflict"
    assert status["message"] == STALE
    assert status["details"] == {"name": "p", "kind": "pods"}
    # A PATCH carrying a stale resourceVersion is a precondition too.
    with pytest.raises(ApiException) as err:
        core_v1.patch_namespaced_pod(
            "p",
            "default",
            {"metadata": {"resourceVersion": first.metadata.resource_version, "labels": {"x": "y"}}},
        )
    assert err.value.status == 409
    # With the current version the update goes through; without one it is unconditional.
    current.metadata.labels = {"v": "3"}
    updated = core_v1.replace_namespaced_pod("p", "default", current)
    assert updated.metadata.labels == {"v": "3"}
    assert int(updated.metadata.resource_version) > int(current.metadata.resource_version)
    updated.metadata.resource_version = None
    updated.metadata.labels = {"v": "4"}
    assert core_v1.replace_namespaced_pod("p", "default", updated).metadata.labels == {"v": "4"}


def test_conflict_message_names_grouped_resources(api_client: client.ApiClient) -> None:
    leases: Any = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="l"), spec=client.V1LeaseSpec(holder_identity="a")
    )
    old = leases.create_namespaced_lease("kube-system", lease)
    leases.patch_namespaced_lease("l", "kube-system", {"spec": {"holderIdentity": "b"}})
    old.spec.holder_identity = "c"
    with pytest.raises(ApiException) as err:
        leases.replace_namespaced_lease("l", "kube-system", old)
    assert status_of(err.value)["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "l": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert status_of(err.value)["details"] == {"name": "l", "group": "coordination.k8s.io", "kind": "leases"}


def test_status_changes_ignored_on_main_resource(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    patched = core_v1.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Running"}}
    )
    assert patched.status.phase == "Pending"
    assert patched.metadata.labels == {"a": "b"}
    core_v1.create_node(node("n1", capacity={"cpu": "8"}))
    patched_node = core_v1.patch_node(
        "n1", {"spec": {"unschedulable": True}, "status": {"capacity": {"cpu": "1"}}}
    )
    assert patched_node.spec.unschedulable is True
    assert patched_node.status.capacity["cpu"] == "8"


def test_status_subresource_changes_only_status(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    patched = core_v1.patch_namespaced_pod_status(
        "p",
        "default",
        {"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Running", "podIP": "10.0.0.1"}},
    )
    assert patched.status.phase == "Running"
    assert patched.status.pod_ip == "10.0.0.1"
    assert patched.status.qos_class == "BestEffort"
    assert patched.spec.active_deadline_seconds is None
    current = core_v1.read_namespaced_pod_status("p", "default")
    current.status.phase = "Succeeded"
    assert core_v1.replace_namespaced_pod_status("p", "default", current).status.phase == "Succeeded"
    core_v1.create_node(node("n1"))
    node_now = core_v1.patch_node_status(
        "n1", {"spec": {"unschedulable": True}, "status": {"capacity": {"cpu": "2"}}}
    )
    assert node_now.status.capacity["cpu"] == "2"
    assert node_now.spec.unschedulable is None


def test_pod_spec_is_immutable_except_kubes_fields(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        core_v1.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}})
    assert err.value.status == 422
    assert "pod updates may not change fields" in str(status_of(err.value)["message"])
    patched = core_v1.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "main", "image": "b:2"}]}}
    )
    assert patched.spec.containers[0].image == "b:2"


def test_patch_flavours(core_v1: Any, apiserver: ApiServerHandle) -> None:
    core_v1.create_namespaced_pod("default", pod("p", annotations={"keep": "1", "drop": "2"}))
    base = "/api/v1/namespaces/default/pods/p"
    code, body = http(
        apiserver.base_url,
        "PATCH",
        base,
        {"metadata": {"annotations": {"drop": None, "merge": "m"}}},
        "application/merge-patch+json",
    )
    assert code == 200 and body["metadata"]["annotations"] == {"keep": "1", "merge": "m"}
    code, body = http(
        apiserver.base_url,
        "PATCH",
        base,
        [{"op": "add", "path": "/metadata/labels", "value": {"j": "p"}}],
        "application/json-patch+json",
    )
    assert code == 200 and body["metadata"]["labels"] == {"j": "p"}
    # Strategic merge: containers merge by name, so only the image changes.
    code, body = http(
        apiserver.base_url,
        "PATCH",
        base,
        {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}},
        "application/strategic-merge-patch+json",
    )
    assert code == 200
    assert body["spec"]["containers"][0]["image"] == "busybox:2"
    assert body["spec"]["containers"][0]["terminationMessagePath"] == "/dev/termination-log"


def test_noop_patch_does_not_write(core_v1: Any, apiserver: ApiServerHandle) -> None:
    created = core_v1.create_namespaced_pod("default", pod("p", labels={"a": "b"}))
    before = apiserver.runner.call(lambda: apiserver.runner.store.resource_version)
    same = core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    assert same.metadata.resource_version == created.metadata.resource_version
    assert apiserver.runner.call(lambda: apiserver.runner.store.resource_version) == before


def test_apply_patch_is_unsupported_media_type(apiserver: ApiServerHandle, core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    code, body = http(
        apiserver.base_url,
        "PATCH",
        "/api/v1/namespaces/default/pods/p?fieldManager=x",
        "metadata: {labels: {a: b}}",
        "application/apply-patch+yaml",
    )
    assert code == 415
    assert body["reason"] == "UnsupportedMediaType"
    assert "application/merge-patch+json" in body["message"]


def test_delete(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    deleted = core_v1.delete_namespaced_pod("p", "default")
    assert deleted.metadata.name == "p"
    with pytest.raises(ApiException) as err:
        core_v1.read_namespaced_pod("p", "default")
    assert err.value.status == 404
    created = core_v1.create_node(node("n1"))
    status = core_v1.delete_node("n1")
    assert status["status"] == "Success"
    assert status["details"] == {"name": "n1", "kind": "nodes", "uid": created.metadata.uid}
    with pytest.raises(ApiException) as err:
        core_v1.delete_node("n1")
    assert err.value.status == 404


def test_delete_preconditions(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        core_v1.delete_namespaced_pod(
            "p", "default", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
        )
    assert err.value.status == 409
    assert "Precondition failed: UID in precondition: other" in str(status_of(err.value)["message"])


def test_list_kind_version_and_all_namespaces(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("a"))
    core_v1.create_namespaced_pod("kube-system", pod("b"))
    listed = core_v1.list_pod_for_all_namespaces()
    assert listed.kind == "PodList"
    assert listed.api_version == "v1"
    assert int(listed.metadata.resource_version) >= 1
    assert [(p.metadata.namespace, p.metadata.name) for p in listed.items] == [
        ("default", "a"),
        ("kube-system", "b"),
    ]
    assert [p.metadata.name for p in core_v1.list_namespaced_pod("kube-system").items] == ["b"]
    assert core_v1.list_namespaced_pod("no-such-namespace").items == []


def test_list_selectors(core_v1: Any) -> None:
    core_v1.create_node(node("n1", labels={"gpu": "a100"}))
    core_v1.create_node(node("n2", labels={"gpu": "h100"}))
    core_v1.create_namespaced_pod("default", pod("a", labels={"app": "x", "tier": "1"}))
    core_v1.create_namespaced_pod("default", pod("b", labels={"app": "y"}))
    core_v1.create_namespaced_pod("kube-system", pod("c", labels={"app": "x"}))
    core_v1.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Running"}})

    def names(**kwargs: str) -> list[str]:
        return [p.metadata.name for p in core_v1.list_pod_for_all_namespaces(**kwargs).items]

    assert names(label_selector="app=x") == ["a", "c"]
    assert names(label_selector="app!=x") == ["b"]
    assert names(label_selector="app in (x,y),tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.namespace=kube-system") == ["c"]
    assert names(field_selector="status.phase=Running") == ["b"]
    assert names(field_selector="status.phase!=Running,metadata.namespace=default") == ["a"]
    assert names(field_selector="spec.nodeName=") == ["a", "b", "c"]
    assert [n.metadata.name for n in core_v1.list_node(label_selector="gpu=h100").items] == ["n2"]
    assert [n.metadata.name for n in core_v1.list_node(field_selector="metadata.name=n1").items] == ["n1"]
    with pytest.raises(ApiException) as err:
        core_v1.list_node(field_selector="spec.nodeName=n1")
    assert err.value.status == 400
    assert "spec.nodeName" in str(status_of(err.value)["message"])


def test_other_resources(api_client: client.ApiClient, core_v1: Any) -> None:
    core_v1.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e1"),
            involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default"),
            reason="Scheduled",
            message="hello",
            type="Normal",
        ),
    )
    events = core_v1.list_namespaced_event("default", field_selector="involvedObject.name=p,reason=Scheduled")
    assert [e.metadata.name for e in events.items] == ["e1"]
    quota = core_v1.create_namespaced_resource_quota(
        "default",
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="q"),
            spec=client.V1ResourceQuotaSpec(hard={"limits.nvidia.com/gpumem": "8000"}),
            status=client.V1ResourceQuotaStatus(used={"x": "1"}),
        ),
    )
    assert quota.status.used is None  # kube clears the status on create
    updated = core_v1.patch_namespaced_resource_quota_status("q", "default", {"status": {"used": {"x": "2"}}})
    assert updated.status.used == {"x": "2"}
    assert core_v1.delete_namespaced_resource_quota("q", "default").metadata.name == "q"
    leases: Any = client.CoordinationV1Api(api_client)
    lease = leases.create_namespaced_lease(
        "kube-node-lease",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="n1"), spec=client.V1LeaseSpec(holder_identity="n1")
        ),
    )
    assert lease.api_version == "coordination.k8s.io/v1"
    assert [item.metadata.name for item in leases.list_lease_for_all_namespaces().items] == ["n1"]
    leases.delete_namespaced_lease("n1", "kube-node-lease")
    hooks: Any = client.AdmissionregistrationV1Api(api_client)
    config = hooks.create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name="hami"),
            webhooks=[
                client.V1MutatingWebhook(
                    name="vgpu.hami.io",
                    admission_review_versions=["v1"],
                    side_effects="None",
                    client_config=client.AdmissionregistrationV1WebhookClientConfig(
                        url="https://127.0.0.1:1/x"
                    ),
                    failure_policy="Ignore",
                )
            ],
        )
    )
    hook = config.webhooks[0]
    assert (hook.failure_policy, hook.match_policy, hook.timeout_seconds) == ("Ignore", "Equivalent", 10)
    assert [c.metadata.name for c in hooks.list_mutating_webhook_configuration().items] == ["hami"]
    hooks.delete_mutating_webhook_configuration("hami")


def test_namespaces(core_v1: Any) -> None:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    core_v1.create_namespaced_pod("team", pod("p"))
    deleted = core_v1.delete_namespace("team")
    assert deleted["metadata"]["name"] == "team"
    assert core_v1.list_namespaced_pod("team").items == []
    with pytest.raises(ApiException) as err:
        core_v1.delete_namespace("default")
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="Bad_Name")))
    assert err.value.status == 422


def test_dry_run_does_not_store(core_v1: Any) -> None:
    created = core_v1.create_namespaced_pod("default", pod("p"), dry_run="All")
    assert created.status.phase == "Pending"
    assert core_v1.list_namespaced_pod("default").items == []


def test_async_client(apiserver: ApiServerHandle) -> None:
    from kubernetes.aio import client as aclient

    async def scenario() -> tuple[str, list[str], dict[str, str]]:
        configuration = aclient.Configuration(host=apiserver.base_url)
        async with aclient.ApiClient(configuration) as api:
            v1: Any = aclient.CoreV1Api(api)
            created = await v1.create_namespaced_pod("default", gpu_pod("p", gpus=2))
            listed = await v1.list_namespaced_pod("default", label_selector="")
            patched = await v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}})
            try:
                await v1.read_namespaced_pod("ghost", "default")
            except aclient.ApiException as exc:
                assert exc.status == 404
            else:
                raise AssertionError("reading a missing pod did not fail")
            return created.status.phase, [p.metadata.name for p in listed.items], patched.metadata.annotations

    assert asyncio.run(scenario()) == ("Pending", ["p"], {"a": "b"})


def test_paged_list_is_one_snapshot_and_old_tokens_expire(core_v1: Any) -> None:
    for i in range(5):
        core_v1.create_namespaced_pod("default", pod(f"p{i}"))
    first = core_v1.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    token = first.metadata._continue
    assert token
    core_v1.create_namespaced_pod("default", pod("p5"))  # after the snapshot: not in its pages
    core_v1.delete_namespaced_pod("p4", "default")
    second = core_v1.list_namespaced_pod("default", limit=2, _continue=token)
    third = core_v1.list_namespaced_pod("default", limit=2, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items + third.items] == ["p2", "p3", "p4"]
    assert not third.metadata._continue
    assert first.metadata.resource_version == third.metadata.resource_version
    with pytest.raises(ApiException) as gone:
        core_v1.list_namespaced_pod("default", limit=2, _continue=token.rsplit(":", 1)[0] + "x:2")
    assert gone.value.status == 410
    assert len(core_v1.list_namespaced_pod("default").items) == 5
