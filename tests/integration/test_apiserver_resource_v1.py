"""resource.k8s.io/v1 on the local API server, checked with the official client's typed models
(ResourceV1Api) and with kubectl: discovery, the four kinds, field selectors on slices, defaulting,
the validation that matters, immutable claim specs, the claim status rules, finalizers on delete, and the
`DRAConsumableCapacity` gate dropping its fields."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hami_api import dra
from hami_sim.apiserver.resource_v1 import FINALIZER, FeatureGates
from hami_sim.apiserver.runner import ApiServerRunner
from tests.apiserver_util import http
from tests.conftest import ApiServerHandle

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def gpu_device(minor: int, memory: str = "81920Mi", *, shared: bool = True) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": dra.device_name(minor),
        "attributes": {
            "type": {"string": dra.DEVICE_TYPE},
            "uuid": {"string": f"GPU-{minor:08d}"},
            "minor": {"int": minor},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {"memory": {"value": memory}, "cores": {"value": "100"}},
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"]["requestPolicy"] = {
            "default": memory,
            "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
        }
        device["capacity"]["cores"]["requestPolicy"] = {
            "default": "100",
            "validRange": {"min": "0", "max": "100", "step": "1"},
        }
    return device


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{dra.DRIVER}-"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(name: str, count: int = 1, memory: str = "4000Mi", cores: str = "30") -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": dra.DEVICE_CLASS,
                            "count": count,
                            "capacity": {"requests": {"memory": memory, "cores": cores}},
                        },
                    }
                ]
            }
        },
    }
    if count > 1:
        body["spec"]["devices"]["constraints"] = [
            {"requests": ["gpu"], "distinctAttribute": dra.qualified(dra.ATTR_UUID)}
        ]
    return body


@pytest.fixture
def resource_v1(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


def _status(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body)
    return body


def test_discovery_lists_the_four_resource_v1_kinds(
    apiserver: ApiServerHandle, api_client: client.ApiClient
) -> None:
    resources = client.ApisApi(api_client).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in resources.groups]
    listed = client.ResourceV1Api(api_client).get_api_resources()
    names = {r.name: r for r in listed.resources}
    assert {"deviceclasses", "resourceslices", "resourceclaims", "resourceclaims/status"} <= set(names)
    assert "resourceclaimtemplates" in names
    assert names["resourceslices"].namespaced is False
    assert names["resourceclaims"].namespaced is True


def test_slices_are_read_back_as_typed_models_with_capacity_quantities_canonical(
    resource_v1: client.ResourceV1Api,
) -> None:
    created = resource_v1.create_resource_slice(resource_slice("node-a", [gpu_device(0), gpu_device(1)]))
    assert created.metadata.name.startswith(f"node-a-{dra.DRIVER}-")
    got = resource_v1.read_resource_slice(created.metadata.name)
    device = got.spec.devices[0]
    assert device.allow_multiple_allocations is True
    assert device.capacity["memory"].value == "80Gi"
    assert device.capacity["memory"].request_policy.valid_range.step == "1Mi"
    assert device.attributes["driverVersion"].version == "550.54.15"
    assert got.spec.pool.generation == 1


def test_slices_are_selected_by_node_name_and_driver(resource_v1: client.ResourceV1Api) -> None:
    resource_v1.create_resource_slice(resource_slice("node-a", [gpu_device(0)]))
    resource_v1.create_resource_slice(resource_slice("node-b", [gpu_device(0)]))
    other = resource_slice("node-b", [gpu_device(1)])
    other["spec"]["driver"] = "gpu.example.com"
    resource_v1.create_resource_slice(other)
    on_b = resource_v1.list_resource_slice(field_selector="spec.nodeName=node-b")
    assert {s.spec.node_name for s in on_b.items} == {"node-b"} and len(on_b.items) == 2
    ours_on_b = resource_v1.list_resource_slice(
        field_selector=f"spec.nodeName=node-b,spec.driver={dra.DRIVER}"
    )
    assert len(ours_on_b.items) == 1
    with pytest.raises(ApiException) as exc:
        resource_v1.list_resource_slice(field_selector="spec.pool.name=node-a")
    assert exc.value.status == 400


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["spec"].pop("pool"), "spec.pool.name"),
        (lambda s: s["spec"].update(allNodes=True), "spec"),
        (lambda s: s["spec"]["devices"][0].update(name="GPU_0"), "spec.devices[0].name"),
        (lambda s: s["spec"]["devices"].append(dict(s["spec"]["devices"][0])), "spec.devices[1].name"),
        (lambda s: s["spec"]["devices"][0].pop("allowMultipleAllocations"),
         "spec.devices[0].capacity[memory].requestPolicy"),
        (
            lambda s: s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"].update(
                max="100Gi"
            ),
            "spec.devices[0].capacity[memory].requestPolicy.validRange.max",
        ),
        (
            lambda s: s["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"].update(default="101"),
            "spec.devices[0].capacity[cores].requestPolicy.default",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update(driverVersion={"version": "550.54"}),
            "spec.devices[0].attributes[driverVersion].version",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update(minor={"int": 1, "string": "1"}),
            "spec.devices[0].attributes[minor]",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "Sometimes"}]),
            "spec.devices[0].taints[0].effect",
        ),
    ],
    ids=["no-pool", "two-node-selectors", "bad-device-name", "duplicate-device",
         "policy-without-sharing", "max-over-value", "default-over-max", "version-not-semver",
         "two-attribute-values", "bad-taint-effect"],
)  # fmt: skip
def test_invalid_slices_are_rejected_with_the_field_named(
    apiserver: ApiServerHandle, mutate: Callable[[dict[str, Any]], Any], field: str
) -> None:
    body = resource_slice("node-a", [gpu_device(0)])
    mutate(body)
    code, status = http(apiserver.base_url, "POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert code == 422
    assert field in [c["field"] for c in status["details"]["causes"]]


def test_slice_driver_and_node_are_immutable(resource_v1: client.ResourceV1Api) -> None:
    created = resource_v1.create_resource_slice(resource_slice("node-a", [gpu_device(0)]))
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_resource_slice(created.metadata.name, {"spec": {"nodeName": "node-b"}})
    assert exc.value.status == 422 and "field is immutable" in _status(exc)["message"]


def test_claims_are_defaulted_and_their_spec_is_immutable(resource_v1: client.ResourceV1Api) -> None:
    created = resource_v1.create_namespaced_resource_claim("default", claim("c1"))
    request = created.spec.devices.requests[0].exactly
    assert request.allocation_mode == "ExactCount" and request.count == 1
    assert request.capacity.requests == {"memory": "4000Mi", "cores": "30"}
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim(
            "c1", "default", {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"count": 2}}]}}}
        )
    assert exc.value.status == 422 and "spec: Invalid value" in _status(exc)["message"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c["spec"]["devices"]["requests"][0]["exactly"].pop("deviceClassName"),
         "spec.devices.requests[0].exactly.deviceClassName"),
        (lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=0),
         "spec.devices.requests[0].exactly.count"),
        (lambda c: c["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"].update(
            memory="-1"),
         "spec.devices.requests[0].exactly.capacity.requests[memory]"),
        (lambda c: c["spec"]["devices"].update(
            constraints=[{"requests": ["cpu"], "matchAttribute": "a.b/c"}]),
         "spec.devices.constraints[0].requests[0]"),
        (lambda c: c["spec"]["devices"]["requests"][0].update(firstAvailable=[]),
         "spec.devices.requests[0]"),
    ],
    ids=["no-class", "zero-count", "negative-capacity", "constraint-unknown-request", "exactly-and-first"],
)  # fmt: skip
def test_invalid_claims_are_rejected_with_the_field_named(
    apiserver: ApiServerHandle, mutate: Callable[[dict[str, Any]], Any], field: str
) -> None:
    body = claim("bad")
    mutate(body)
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    code, status = http(apiserver.base_url, "POST", path, body)
    assert code == 422
    assert field in [c["field"] for c in status["details"]["causes"]]


def _allocation(node: str = "node-a") -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": dra.DRIVER,
                    "pool": node,
                    "device": dra.device_name(0),
                    "shareID": "3f0c6d2e-7b1a-4c7e-9a55-2b1f0a9d8e11",
                    "consumedCapacity": {"memory": "4000Mi", "cores": "30"},
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def test_claim_status_takes_an_allocation_once_and_reservations_need_it(
    resource_v1: client.ResourceV1Api,
) -> None:
    resource_v1.create_namespaced_resource_claim("default", claim("c1"))
    reserved = [{"resource": "pods", "name": "p", "uid": "uid-1"}]
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim_status(
            "c1", "default", {"status": {"reservedFor": reserved}}
        )
    assert "status.reservedFor" in [c["field"] for c in _status(exc)["details"]["causes"]]
    done = resource_v1.patch_namespaced_resource_claim_status(
        "c1", "default", {"status": {"allocation": _allocation(), "reservedFor": reserved}}
    )
    result = done.status.allocation.devices.results[0]
    assert result.share_id == "3f0c6d2e-7b1a-4c7e-9a55-2b1f0a9d8e11"
    assert result.consumed_capacity == {"memory": "4000Mi", "cores": "30"}
    assert done.status.reserved_for[0].uid == "uid-1"
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim_status(
            "c1", "default", {"status": {"allocation": _allocation("node-b")}}
        )
    assert exc.value.status == 422 and "field is immutable" in _status(exc)["message"]
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim_status("c1", "default", {"status": {"allocation": None}})
    assert exc.value.status == 422
    freed = resource_v1.patch_namespaced_resource_claim_status(
        "c1", "default", {"status": {"allocation": None, "reservedFor": None}}
    )
    assert freed.status.allocation is None


def test_a_claim_with_the_delete_protection_finalizer_stays_until_it_is_removed(
    resource_v1: client.ResourceV1Api,
) -> None:
    body = claim("c1")
    body["metadata"]["finalizers"] = [FINALIZER]
    resource_v1.create_namespaced_resource_claim("default", body)
    resource_v1.delete_namespaced_resource_claim("c1", "default")
    marked = resource_v1.read_namespaced_resource_claim("c1", "default")
    assert marked.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim(
            "c1", "default", {"metadata": {"finalizers": [FINALIZER, "example.com/more"]}}
        )
    assert exc.value.status == 422
    resource_v1.patch_namespaced_resource_claim("c1", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        resource_v1.read_namespaced_resource_claim("c1", "default")
    assert exc.value.status == 404


def test_templates_and_device_classes_round_trip(resource_v1: client.ResourceV1Api) -> None:
    resource_v1.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": dra.DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": dra.DEVICE_CLASS_SELECTOR}}]},
        }
    )
    got = resource_v1.read_device_class(dra.DEVICE_CLASS)
    assert got.spec.selectors[0].cel.expression == dra.DEVICE_CLASS_SELECTOR
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "vgpu-4g"},
        "spec": {"spec": claim("x")["spec"]},
    }
    resource_v1.create_namespaced_resource_claim_template("default", template)
    read = resource_v1.read_namespaced_resource_claim_template("vgpu-4g", "default")
    assert read.spec.spec.devices.requests[0].exactly.count == 1
    with pytest.raises(ApiException) as exc:
        resource_v1.patch_namespaced_resource_claim_template(
            "vgpu-4g", "default", {"spec": {"spec": {"devices": {"requests": []}}}}
        )
    assert exc.value.status == 422


def test_pod_claim_references_must_name_a_pod_claim(core_v1: client.CoreV1Api) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "vgpu-4g"}],
            "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}],
        },
    }
    with pytest.raises(ApiException) as exc:
        core_v1.create_namespaced_pod("default", pod)
    assert exc.value.status == 422
    assert "must be one of the names in pod.spec.resourceClaims: gpu" in _status(exc)["message"]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    created = core_v1.create_namespaced_pod("default", pod)
    assert created.spec.resource_claims[0].resource_claim_template_name == "vgpu-4g"


@pytest.fixture
def no_consumable_capacity(tmp_path: Path) -> Iterator[client.ResourceV1Api]:
    gates = FeatureGates.parse("DRAConsumableCapacity=false")
    with ApiServerRunner(feature_gates=gates) as runner:
        config = client.Configuration()
        config.host = runner.base_url
        with client.ApiClient(config) as api_client:
            yield client.ResourceV1Api(api_client)


def test_without_consumable_capacity_the_server_drops_sharing_fields(
    no_consumable_capacity: client.ResourceV1Api,
) -> None:
    api = no_consumable_capacity
    created = api.create_resource_slice(resource_slice("node-a", [gpu_device(0)]))
    device = created.spec.devices[0]
    assert device.allow_multiple_allocations is None
    assert device.capacity["memory"].request_policy is None
    stored = api.create_namespaced_resource_claim("default", claim("c1"))
    assert stored.spec.devices.requests[0].exactly.capacity is None
    with pytest.raises(ApiException) as exc:
        # distinctAttribute is dropped too, leaving a constraint with neither attribute: a 422.
        api.create_namespaced_resource_claim("default", claim("c2", count=2))
    assert exc.value.status == 422 and "spec.devices.constraints[0]" in _status(exc)["message"]


def test_feature_gates_flag_rejects_unknown_gates() -> None:
    with pytest.raises(ValueError, match="unrecognized feature gate 'NoSuchGate'"):
        FeatureGates.parse("NoSuchGate=true")
    with pytest.raises(ValueError, match="expected NAME=true"):
        FeatureGates.parse("DRAConsumableCapacity")


@pytest.mark.kubectl
def test_kubectl_gets_claims_and_slices_with_kube_columns(
    kubectl: Kubectl, resource_v1: client.ResourceV1Api
) -> None:
    resource_v1.create_resource_slice(resource_slice("node-a", [gpu_device(0)]))
    resource_v1.create_namespaced_resource_claim("default", claim("c1"))
    slices = kubectl("get", "resourceslices").stdout.splitlines()
    assert slices[0].split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert slices[1].split()[1:4] == ["node-a", dra.DRIVER, "node-a"]
    claims = kubectl("get", "resourceclaims").stdout.splitlines()
    assert claims[0].split() == ["NAME", "STATE", "AGE"]
    assert claims[1].split()[:2] == ["c1", "pending"]
    as_json = json.loads(kubectl("get", "resourceclaim", "c1", "-o", "json").stdout)
    assert as_json["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == "4000Mi"
