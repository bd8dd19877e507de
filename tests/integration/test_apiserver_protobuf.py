"""Protobuf request bodies on every verb that carries one (create, update, pods/binding, delete), for the
kinds kubectl's own protobuf path does not reach (kubectl sends protobuf only from `kubectl create
<namespace|configmap|secret|quota>`: see test_apiserver_kubectl.py). Answers stay JSON: every client
that sends protobuf also accepts JSON."""

from __future__ import annotations

from typing import Any

import urllib3
from kubernetes import client

from hami_sim.apiserver import kubeproto
from tests.apiserver_util import http
from tests.conftest import ApiServerHandle

CORE = "k8s.io.api.core.v1"
META = "k8s.io.apimachinery.pkg.apis.meta.v1"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def message(full_name: str, **fields: Any) -> Any:
    s = kubeproto.schema()
    return s.message_class(s.message(full_name))(**fields)


def body(obj: Any, api_version: str, kind: str) -> bytes:
    type_meta = message("k8s.io.apimachinery.pkg.runtime.TypeMeta", apiVersion=api_version, kind=kind)
    unknown = message(
        "k8s.io.apimachinery.pkg.runtime.Unknown", typeMeta=type_meta, raw=obj.SerializeToString()
    )
    return kubeproto.MAGIC + unknown.SerializeToString()


def send(apiserver: ApiServerHandle, method: str, path: str, data: bytes) -> tuple[int, Any]:
    return http(
        apiserver.base_url, method, path, data, PROTOBUF, headers={"Accept": f"{PROTOBUF},application/json"}
    )


def gpu_pod_message(name: str, gpus: str) -> Any:
    """A one-container GPU pod as a protobuf message (the JSON one is `tests.builders.gpu_pod`)."""
    limits = {"nvidia.com/gpu": message("k8s.io.apimachinery.pkg.api.resource.Quantity", string=gpus)}
    container = message(
        f"{CORE}.Container",
        name="main",
        image="busybox:1.36",
        resources=message(f"{CORE}.ResourceRequirements", limits=limits),
    )
    return message(
        f"{CORE}.Pod",
        metadata=message(f"{META}.ObjectMeta", name=name, creationTimestamp=message(f"{META}.Time")),
        spec=message(f"{CORE}.PodSpec", containers=[container]),
    )


def test_create_update_bind_and_delete_with_protobuf_bodies(apiserver: ApiServerHandle, core_v1: Any) -> None:
    status, created = send(
        apiserver, "POST", "/api/v1/namespaces/default/pods", body(gpu_pod_message("p", "1"), "v1", "Pod")
    )
    assert status == 201, created
    pod = core_v1.read_namespaced_pod("p", "default")
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert pod.spec.scheduler_name == "default-scheduler"  # defaulted like a JSON create

    node = message(
        f"{CORE}.Node",
        metadata=message(f"{META}.ObjectMeta", name="n1"),
        status=message(
            f"{CORE}.NodeStatus",
            capacity={"nvidia.com/gpu": message("k8s.io.apimachinery.pkg.api.resource.Quantity", string="4")},
        ),
    )
    status, answer = send(apiserver, "POST", "/api/v1/nodes", body(node, "v1", "Node"))
    assert status == 201, answer
    current = core_v1.read_node("n1")
    update = message(
        f"{CORE}.Node",
        metadata=message(
            f"{META}.ObjectMeta",
            name="n1",
            resourceVersion=current.metadata.resource_version,
            labels={"gpu": "on"},
        ),
    )
    status, answer = send(apiserver, "PUT", "/api/v1/nodes/n1", body(update, "v1", "Node"))
    assert status == 200, answer
    assert core_v1.read_node("n1").metadata.labels == {"gpu": "on"}

    binding = message(
        f"{CORE}.Binding",
        metadata=message(f"{META}.ObjectMeta", name="p", annotations={"hami.io/vgpu-node": "n1"}),
        target=message(f"{CORE}.ObjectReference", kind="Node", name="n1"),
    )
    status, answer = send(
        apiserver, "POST", "/api/v1/namespaces/default/pods/p/binding", body(binding, "v1", "Binding")
    )
    assert status == 201, answer
    bound = core_v1.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"hami.io/vgpu-node": "n1"}

    stale = message(
        f"{META}.DeleteOptions", preconditions=message(f"{META}.Preconditions", uid="not-the-uid")
    )
    status, answer = send(
        apiserver, "DELETE", "/api/v1/namespaces/default/pods/p", body(stale, "v1", "DeleteOptions")
    )
    assert status == 409, answer
    assert "Precondition failed: UID in precondition: not-the-uid" in answer["message"]
    # Bound to n1 where no kubelet runs: deleted with grace 0, as kubelet (or a forced delete) does.
    matching = message(
        f"{META}.DeleteOptions",
        gracePeriodSeconds=0,
        preconditions=message(f"{META}.Preconditions", uid=bound.metadata.uid),
    )
    status, answer = send(
        apiserver, "DELETE", "/api/v1/namespaces/default/pods/p", body(matching, "v1", "DeleteOptions")
    )
    assert status == 200, answer
    assert core_v1.list_namespaced_pod("default").items == []


def test_other_kinds_arrive_by_protobuf(apiserver: ApiServerHandle, api_client: client.ApiClient) -> None:
    lease = message(
        "k8s.io.api.coordination.v1.Lease",
        metadata=message(f"{META}.ObjectMeta", name="hami-scheduler"),
        spec=message(
            "k8s.io.api.coordination.v1.LeaseSpec",
            holderIdentity="a",
            leaseDurationSeconds=15,
            renewTime=message(f"{META}.MicroTime", seconds=1767323045, nanos=250_000_000),
        ),
    )
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    status, answer = send(apiserver, "POST", path, body(lease, "coordination.k8s.io/v1", "Lease"))
    assert status == 201, answer
    assert answer["spec"]["renewTime"] == "2026-01-02T03:04:05.250000Z"
    read: Any = client.CoordinationV1Api(api_client).read_namespaced_lease("hami-scheduler", "default")
    assert read.spec.lease_duration_seconds == 15

    event = message(
        "k8s.io.api.events.v1.Event",
        metadata=message(f"{META}.ObjectMeta", name="e1"),
        eventTime=message(f"{META}.MicroTime", seconds=1767323045),
        reportingController="hami.io/scheduler",
        reportingInstance="s-0",
        action="Binding",
        reason="Scheduled",
        type="Normal",
        regarding=message(f"{CORE}.ObjectReference", kind="Pod", name="p", namespace="default"),
    )
    path = "/apis/events.k8s.io/v1/namespaces/default/events"
    status, answer = send(apiserver, "POST", path, body(event, "events.k8s.io/v1", "Event"))
    assert status == 201, answer
    events: Any = client.EventsV1Api(api_client).list_namespaced_event("default")
    assert [e.reason for e in events.items] == ["Scheduled"]


def test_protobuf_errors_are_kubes_400(apiserver: ApiServerHandle) -> None:
    status, answer = send(
        apiserver, "POST", "/api/v1/namespaces/default/pods", body(gpu_pod_message("p", "lots"), "v1", "Pod")
    )
    assert status == 400, answer
    assert answer["message"].startswith(
        'Pod in version "v1" cannot be handled as a Pod: quantities must match'
    )
    assert 'spec.containers[0].resources.limits[nvidia.com/gpu]: "lots"' in answer["message"]
    lease = message("k8s.io.api.coordination.v1.Lease", metadata=message(f"{META}.ObjectMeta", name="x"))
    status, answer = send(
        apiserver, "POST", "/api/v1/namespaces/default/pods", body(lease, "coordination.k8s.io/v1", "Lease")
    )
    assert status == 400, answer
    assert 'the kind "Lease" in the request body does not match the resource' in answer["message"]
    status, answer = send(apiserver, "POST", "/api/v1/namespaces/default/pods", b"not protobuf")
    assert status == 400, answer
    assert "the object provided is unrecognized (must be of type Pod)" in answer["message"]


def test_answers_to_protobuf_requests_are_json(apiserver: ApiServerHandle) -> None:
    with urllib3.PoolManager() as pool:
        response = pool.request(
            "POST",
            apiserver.base_url + "/api/v1/namespaces/default/pods",
            body=body(gpu_pod_message("p", "1"), "v1", "Pod"),
            headers={"Content-Type": PROTOBUF, "Accept": f"{PROTOBUF},application/json"},
        )
    assert response.status == 201
    assert response.headers["Content-Type"].startswith("application/json")
