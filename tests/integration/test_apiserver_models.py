"""Every kind the stand-in serves, written as raw JSON the way manifests and other clients send it
(quantities as JSON numbers, non-canonical quantity text), then listed and read through the official
client's typed models: the client deserialises each object into its pydantic model, which refuses what
kube-apiserver would never return (a quantity that is a JSON number, for one)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.apiserver_util import http
from tests.conftest import ApiServerHandle

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gpu-pod", "labels": {"app": "demo"}},
    "spec": {
        "initContainers": [
            {"name": "init", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        ],
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "resources": {
                    "limits": {
                        "nvidia.com/gpu": 1,
                        "nvidia.com/gpumem": 4000,
                        "memory": "1024Mi",
                        "cpu": 0.5,
                    },
                    "requests": {"cpu": "250m", "memory": "0.5Gi"},
                },
                "env": [
                    {
                        "name": "MEM_MI",
                        "valueFrom": {
                            "resourceFieldRef": {"resource": "limits.memory", "divisor": "1048576"}
                        },
                    }
                ],
            }
        ],
        "overhead": {"cpu": 0.1},
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "2048Mi"}}],
    },
}

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-node", "labels": {"gpu": "on"}},
    "status": {
        "capacity": {"cpu": 8, "memory": "32768Mi", "nvidia.com/gpu": 4, "pods": 110},
        "allocatable": {"cpu": "7500m", "memory": 33554432000, "nvidia.com/gpu": 4, "pods": 110},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}

QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "gpu-quota"},
    "spec": {"hard": {"limits.nvidia.com/gpu": 4, "limits.nvidia.com/gpumem": 16000, "requests.cpu": 1.5}},
}

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}

EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "gpu-pod.1"},
    "involvedObject": {"kind": "Pod", "name": "gpu-pod", "namespace": "default", "apiVersion": "v1"},
    "reason": "Scheduled",
    "message": "assigned",
    "type": "Normal",
    "count": 2,
    "firstTimestamp": "2026-01-02T03:04:05Z",
    "lastTimestamp": "2026-01-02T03:04:06Z",
    "eventTime": "2026-01-02T03:04:05.123456Z",
    "source": {"component": "hami-scheduler"},
    "reportingComponent": "hami-scheduler",
    "reportingInstance": "hami-scheduler-0",
}

EVENTS_V1 = {
    "apiVersion": "events.k8s.io/v1",
    "kind": "Event",
    "metadata": {"name": "gpu-pod.2"},
    "eventTime": "2026-01-02T03:04:05.123456Z",
    "series": {"count": 3, "lastObservedTime": "2026-01-02T03:05:05.000001Z"},
    "reportingController": "hami.io/scheduler",
    "reportingInstance": "hami-scheduler-0",
    "action": "Binding",
    "reason": "Scheduled",
    "regarding": {"kind": "Pod", "name": "gpu-pod", "namespace": "default"},
    "note": "assigned",
    "type": "Normal",
}

SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "certs"},
    "type": "kubernetes.io/tls",
    "data": {"tls.crt": base64.b64encode(b"cert").decode(), "tls.key": base64.b64encode(b"key").decode()},
}

CONFIG_MAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "settings"},
    "data": {"policy": "binpack"},
    "binaryData": {"blob": base64.b64encode(b"\x00\x01").decode()},
}

LEASE = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "hami-scheduler"},
    "spec": {
        "holderIdentity": "hami-scheduler-0",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-02T03:04:05.000000Z",
        "renewTime": "2026-01-02T03:04:07.250000Z",
        "leaseTransitions": 1,
    },
}

WEBHOOK = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "hami-webhook"},
    "webhooks": [
        {
            "name": "vgpu.hami.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"url": "https://127.0.0.1:1/webhook"},
            "failurePolicy": "Ignore",
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
        }
    ],
}

Api = Callable[[client.ApiClient], Any]


def _core(api: client.ApiClient) -> Any:
    return client.CoreV1Api(api)


def _coordination(api: client.ApiClient) -> Any:
    return client.CoordinationV1Api(api)


def _admission(api: client.ApiClient) -> Any:
    return client.AdmissionregistrationV1Api(api)


def _events(api: client.ApiClient) -> Any:
    return client.EventsV1Api(api)


# (manifest, collection path, API, list across namespaces, list in a namespace, read); None: cluster-scoped
KINDS: list[tuple[dict[str, Any], str, Api, str, str | None, str]] = [
    (POD, "/api/v1/namespaces/default/pods", _core, "list_pod_for_all_namespaces",
     "list_namespaced_pod", "read_namespaced_pod"),
    (NODE, "/api/v1/nodes", _core, "list_node", None, "read_node"),
    (NAMESPACE, "/api/v1/namespaces", _core, "list_namespace", None, "read_namespace"),
    (EVENT, "/api/v1/namespaces/default/events", _core, "list_event_for_all_namespaces",
     "list_namespaced_event", "read_namespaced_event"),
    (QUOTA, "/api/v1/namespaces/default/resourcequotas", _core, "list_resource_quota_for_all_namespaces",
     "list_namespaced_resource_quota", "read_namespaced_resource_quota"),
    (SECRET, "/api/v1/namespaces/default/secrets", _core, "list_secret_for_all_namespaces",
     "list_namespaced_secret", "read_namespaced_secret"),
    (CONFIG_MAP, "/api/v1/namespaces/default/configmaps", _core, "list_config_map_for_all_namespaces",
     "list_namespaced_config_map", "read_namespaced_config_map"),
    (LEASE, "/apis/coordination.k8s.io/v1/namespaces/default/leases", _coordination,
     "list_lease_for_all_namespaces", "list_namespaced_lease", "read_namespaced_lease"),
    (WEBHOOK, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", _admission,
     "list_mutating_webhook_configuration", None, "read_mutating_webhook_configuration"),
    (EVENTS_V1, "/apis/events.k8s.io/v1/namespaces/default/events", _events,
     "list_event_for_all_namespaces", "list_namespaced_event", "read_namespaced_event"),
]  # fmt: skip


def _create(apiserver: ApiServerHandle, manifest: dict[str, Any], path: str) -> dict[str, Any]:
    status, body = http(apiserver.base_url, "POST", path, manifest)
    assert status == 201, body
    if manifest["kind"] in ("Node", "ResourceQuota", "Pod"):  # status is written through /status
        name = manifest["metadata"]["name"]
        patch = {"status": manifest.get("status", {})}
        if manifest["kind"] == "ResourceQuota":
            patch = {"status": {"hard": manifest["spec"]["hard"], "used": {"limits.nvidia.com/gpu": 1}}}
        if manifest["kind"] == "Pod":
            patch = {"status": {"containerStatuses": [
                {"name": "main", "ready": False, "restartCount": 0, "image": "busybox:1.36", "imageID": "",
                 "allocatedResources": {"nvidia.com/gpu": 1, "cpu": 0.5}}
            ]}}  # fmt: skip
        status, body = http(
            apiserver.base_url, "PATCH", f"{path}/{name}/status", patch, "application/merge-patch+json"
        )
        assert status == 200, body
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize(
    ("manifest", "path", "api", "list_all", "list_namespaced", "read"),
    KINDS,
    ids=[f"{m['apiVersion']}/{m['kind']}" for m, *_ in KINDS],
)
def test_every_served_kind_lists_and_reads_through_the_typed_client(  # noqa: PLR0917
    apiserver: ApiServerHandle,
    api_client: client.ApiClient,
    manifest: dict[str, Any],
    path: str,
    api: Api,
    list_all: str,
    list_namespaced: str | None,
    read: str,
) -> None:
    _create(apiserver, manifest, path)
    typed = api(api_client)
    name = manifest["metadata"]["name"]
    listed = getattr(typed, list_all)()
    assert name in [item.metadata.name for item in listed.items]
    if list_namespaced is not None:
        assert [i.metadata.name for i in getattr(typed, list_namespaced)("default").items] == [name]
        assert getattr(typed, read)(name, "default").metadata.name == name
    else:
        assert getattr(typed, read)(name).metadata.name == name


def test_quantities_come_back_in_kube_canonical_form(
    apiserver: ApiServerHandle, api_client: client.ApiClient
) -> None:
    core: Any = client.CoreV1Api(api_client)
    for manifest, path, *_ in KINDS[:5]:
        _create(apiserver, manifest, path)
    pod = core.read_namespaced_pod("gpu-pod", "default")
    main = pod.spec.containers[0]
    assert main.resources.limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "memory": "1Gi",
                                     "cpu": "500m"}  # fmt: skip
    assert main.resources.requests == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "memory": "512Mi",
                                       "cpu": "250m"}  # fmt: skip
    assert pod.spec.init_containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert main.env[0].value_from.resource_field_ref.divisor == "1048576"
    assert pod.spec.overhead == {"cpu": "100m"}
    assert pod.spec.volumes[0].empty_dir.size_limit == "2Gi"
    assert pod.status.container_statuses[0].allocated_resources == {"nvidia.com/gpu": "1", "cpu": "500m"}
    node = core.read_node("gpu-node")
    assert node.status.capacity == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4", "pods": "110"}
    assert node.status.allocatable == {"cpu": "7500m", "memory": "33554432k", "nvidia.com/gpu": "4",
                                       "pods": "110"}  # fmt: skip
    quota = core.read_namespaced_resource_quota("gpu-quota", "default")
    hard = {"limits.nvidia.com/gpu": "4", "limits.nvidia.com/gpumem": "16k", "requests.cpu": "1500m"}
    assert quota.spec.hard == hard
    assert quota.status.hard == hard
    assert quota.status.used == {"limits.nvidia.com/gpu": "1"}


def test_a_secret_without_a_type_is_opaque(apiserver: ApiServerHandle, core_v1: Any) -> None:
    untyped = {k: v for k, v in SECRET.items() if k != "type"}
    _create(apiserver, untyped, "/api/v1/namespaces/default/secrets")
    assert core_v1.read_namespaced_secret("certs", "default").type == "Opaque"


def test_quantities_are_canonical_after_update_and_every_patch_type(
    apiserver: ApiServerHandle, core_v1: Any
) -> None:
    _create(apiserver, NODE, "/api/v1/nodes")
    base, path = apiserver.base_url, "/api/v1/nodes/gpu-node/status"
    for content_type, patch in [
        ("application/merge-patch+json", {"status": {"capacity": {"nvidia.com/gpu": 8}}}),
        ("application/strategic-merge-patch+json", {"status": {"capacity": {"memory": "2048Mi"}}}),
        ("application/json-patch+json", [{"op": "replace", "path": "/status/allocatable/cpu", "value": 6.5}]),
    ]:
        status, body = http(base, "PATCH", path, patch, content_type)
        assert status == 200, body
    node = core_v1.read_node("gpu-node")
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert node.status.capacity["memory"] == "2Gi"
    assert node.status.allocatable["cpu"] == "6500m"
    current = http(base, "GET", "/api/v1/nodes/gpu-node")[1]
    current["status"]["allocatable"]["nvidia.com/gpu"] = 2
    status, body = http(base, "PUT", path, current)
    assert status == 200, body
    assert body["status"]["allocatable"]["nvidia.com/gpu"] == "2"


@pytest.mark.parametrize(
    ("value", "go_error"),
    [
        ("abc", "quantities must match the regular expression"),
        ("1ki", "unable to parse quantity's suffix"),
        ("1Gb", "quantities must match the regular expression"),
        (True, "quantities must match the regular expression"),
        ("", "quantities must match the regular expression"),
    ],
)
def test_a_quantity_that_does_not_parse_is_kubes_400_naming_the_field_and_value(
    apiserver: ApiServerHandle, value: Any, go_error: str
) -> None:
    pod = {**POD, "spec": {**POD["spec"], "containers": [
        {"name": "main", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": value}}}
    ]}}  # fmt: skip
    status, body = http(apiserver.base_url, "POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 400, body
    assert body["reason"] == "BadRequest"
    message = body["message"]
    assert message.startswith('Pod in version "v1" cannot be handled as a Pod: ' + go_error), message
    shown = '"abc"' if value == "abc" else ""
    assert "spec.containers[0].resources.limits[nvidia.com/gpu]" in message and shown in message


def test_a_patch_that_leaves_a_bad_quantity_is_422_naming_the_field(apiserver: ApiServerHandle) -> None:
    _create(apiserver, NODE, "/api/v1/nodes")
    patch = {"status": {"capacity": {"nvidia.com/gpu": "four"}}}
    status, body = http(
        apiserver.base_url, "PATCH", "/api/v1/nodes/gpu-node/status", patch, "application/merge-patch+json"
    )
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert 'status.capacity[nvidia.com/gpu]: Invalid value: "four": quantities must match' in body["message"]


@pytest.mark.parametrize(
    ("resources", "field", "shown", "why"),
    [
        ({"limits": {"cpu": "-1"}}, "spec.containers[0].resources.limits[cpu]", '"-1"',
         "must be greater than or equal to 0"),
        ({"limits": {"nvidia.com/gpu": "500m"}}, "spec.containers[0].resources.limits[nvidia.com/gpu]",
         '"500m"', "must be an integer"),
        ({"limits": {"nvidia.com/gpumem": 0.5}}, "spec.containers[0].resources.limits[nvidia.com/gpumem]",
         '"500m"', "must be an integer"),
    ],
)  # fmt: skip
def test_a_quantity_kube_validation_refuses_is_422_naming_the_field_and_value(
    apiserver: ApiServerHandle, resources: dict[str, Any], field: str, shown: str, why: str
) -> None:
    pod = {**POD, "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}]}}
    status, body = http(apiserver.base_url, "POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 422, body
    assert f"{field}: Invalid value: {shown}: {why}" in body["message"], body["message"]
