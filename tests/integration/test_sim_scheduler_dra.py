"""The scheduler stand-in's DynamicResources plugin against the real API server stand-in (resource.k8s.io/v1)
with real ResourceSlices, DeviceClasses and ResourceClaims, the resourceclaim controller stand-in, and the
HTTPS extender stub that must never hear about DRA pods: allocation, finalizer, reservedFor and binding;
pods waiting for their generated claims; capacity held across back-to-back cycles; shared claims; errors
and unschedulable pods in kube's words; a failed bind rolled back."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_api import dra
from hami_api.quantity import parse_quantity
from hami_kube.client import KubeApi
from hami_sim.controllers.resourceclaim import ResourceClaimController
from hami_sim.scheduler import SchedulerRunner, load_scheduler_config
from hami_sim.scheduler.dra.plugin import FINALIZER
from hami_sim.tls import generate_ca, generate_serving_cert
from tests.builders import (
    container,
    device_class,
    dra_claim,
    gpu_share,
    hami_gpu_device,
    node,
    pod,
    resource_slice,
)
from tests.conftest import ApiServerHandle
from tests.integration.extender_stub import ExtenderStub
from tests.waiting import wait_for

SHIPPED = Path(__file__).resolve().parents[2] / "daemonset" / "scheduler" / "kube-scheduler-config.yaml"
NS = "default"
HAMI = "hami-scheduler"
RESOURCES = {"cpu": "8", "memory": "32Gi", "pods": "110"}
Json = dict[str, Any]


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture
def ca_file(tmp_path: Path) -> tuple[Path, tuple[bytes, bytes]]:
    ca_cert, ca_key = generate_ca("scheduler-test-ca")
    path = tmp_path / "ca.crt"
    path.write_bytes(ca_cert)
    return path, generate_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])


@pytest.fixture
def stub(apiserver: ApiServerHandle, ca_file: tuple[Path, tuple[bytes, bytes]]) -> Iterator[ExtenderStub]:
    extender = ExtenderStub(apiserver.base_url, ca_file[1])
    extender.start()
    try:
        yield extender
    finally:
        extender.stop()


@pytest.fixture
def scheduler(
    apiserver: ApiServerHandle, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]]
) -> Iterator[SchedulerRunner]:
    config = load_scheduler_config(SHIPPED, extender_url=stub.url, extender_ca_file=str(ca_file[0]))
    counter = itertools.count()
    with SchedulerRunner(
        config, apiserver.kubeconfig, seed=7, share_id=lambda: f"share-{next(counter)}"
    ) as runner:
        yield runner


@pytest.fixture
def controller(apiserver: ApiServerHandle, scheduler: SchedulerRunner) -> Iterator[ResourceClaimController]:
    """kube-controller-manager's resourceclaim controller, on the scheduler's loop (its own client)."""

    async def start() -> tuple[KubeApi, ResourceClaimController]:
        api = await KubeApi.connect(apiserver.kubeconfig)
        ctl = ResourceClaimController(api)
        await ctl.start()
        return api, ctl

    api, ctl = scheduler.run(start)
    try:
        yield ctl
    finally:

        async def stop() -> None:
            await ctl.stop()
            await api.close()

        scheduler.run(stop)


@pytest.fixture
def resource_v1(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


def setup_nodes(
    core_v1: Any, resource_v1: client.ResourceV1Api, *slices: Json, nodes: tuple[str, ...] = ("n1", "n2")
) -> None:
    resource_v1.create_device_class(device_class())
    for name in nodes:
        core_v1.create_node(node(name, allocatable=RESOURCES))
    for body in slices:
        resource_v1.create_resource_slice(body)


def claim_pod(name: str, *refs: Json) -> Json:
    """A pod of the hami-scheduler profile whose container uses every claim in `refs`."""
    claims = [{"name": r["name"]} for r in refs]
    return pod(
        name,
        container("main", resources={"claims": claims}),
        namespace=NS,
        scheduler_name=HAMI,
        resourceClaims=list(refs),
    )


def named(claim: str, name: str = "gpu") -> Json:
    return {"name": name, "resourceClaimName": claim}


def claim_json(api_client: client.ApiClient, name: str) -> Json:
    """The claim as the API server returns it (plain JSON, field names as on the wire)."""
    response = client.ResourceV1Api(api_client).read_namespaced_resource_claim(
        name, NS, _preload_content=False
    )
    body: Json = json.loads(response.data)
    return body


def node_of(core_v1: Any, name: str) -> str | None:
    found: str | None = core_v1.read_namespaced_pod(name, NS).spec.node_name
    return found


def events_of(core_v1: Any, pod_name: str, reason: str) -> list[Any]:
    return [
        e
        for e in core_v1.list_namespaced_event(NS).items
        if e.involved_object.name == pod_name and e.reason == reason
    ]


def consumed_per_device(api_client: client.ApiClient, names: list[str]) -> dict[str, dict[str, Fraction]]:
    totals: dict[str, dict[str, Fraction]] = {}
    for name in names:
        for result in claim_json(api_client, name)["status"]["allocation"]["devices"]["results"]:
            device = totals.setdefault(f"{result['pool']}/{result['device']}", {})
            for cap, amount in result["consumedCapacity"].items():
                device[cap] = device.get(cap, Fraction(0)) + parse_quantity(amount)
    return totals


# --- tests --------------------------------------------------------------------------------------------


def test_a_claim_is_allocated_finalized_reserved_then_the_pod_bound_without_extender_calls(
    core_v1: Any,
    api_client: client.ApiClient,
    resource_v1: client.ResourceV1Api,
    stub: ExtenderStub,
    scheduler: SchedulerRunner,
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n2"))
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("c", gpu_share("4000Mi", "30")))
    created = core_v1.create_namespaced_pod(NS, claim_pod("p", named("c")))
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 10)
    assert node_of(core_v1, "p") == "n2"
    claim = claim_json(api_client, "c")
    assert claim["metadata"]["finalizers"] == [FINALIZER]
    assert claim["status"]["allocation"] == {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": dra.DRIVER,
                    "pool": "n2",
                    "device": dra.device_name(0),
                    "shareID": "share-0",
                    "consumedCapacity": {"memory": "4000Mi", "cores": "30"},
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
            ]
        },
    }
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": created.metadata.uid}]
    assert stub.calls == []  # no managed resource asked: kube's IsInterested says no
    scheduled = wait_for(lambda: events_of(core_v1, "p", "Scheduled"), what="Scheduled event")
    assert scheduled[0].message == "Successfully assigned default/p to n2"
    assert scheduler.snapshot()["claims_allocated"] == 1


def test_a_pod_waits_for_its_generated_claim_without_events_then_lands(
    core_v1: Any,
    api_client: client.ApiClient,
    resource_v1: client.ResourceV1Api,
    scheduler: SchedulerRunner,
    controller: ResourceClaimController,
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n1"))
    core_v1.create_namespaced_pod(NS, claim_pod("p", {"name": "gpu", "resourceClaimTemplateName": "vgpu"}))
    scheduler.wait_for(lambda s: s.counters.waiting >= 1, 10)
    waiting = [d for d in scheduler.standin.decisions if d.result == "waiting"]
    assert waiting[0].message == 'pod "default/p": ResourceClaim not created yet'
    template = {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "vgpu", "namespace": NS},
        "spec": {"spec": dra_claim("x", gpu_share("2Gi", "10"))["spec"]},
    }
    resource_v1.create_namespaced_resource_claim_template(NS, template)
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 15)
    assert node_of(core_v1, "p") == "n1"
    generated = core_v1.read_namespaced_pod("p", NS).status.resource_claim_statuses[0].resource_claim_name
    assert claim_json(api_client, generated)["status"]["allocation"]["devices"]["results"][0][
        "device"
    ] == dra.device_name(0)
    assert scheduler.snapshot()["unschedulable"] == 0
    assert events_of(core_v1, "p", "FailedScheduling") == []


def test_back_to_back_pods_never_overcommit_a_gpu_and_the_rest_are_unschedulable_in_kube_words(
    core_v1: Any, api_client: client.ApiClient, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    setup_nodes(
        core_v1, resource_v1, resource_slice("n1", hami_gpu_device(0), hami_gpu_device(1)), nodes=("n1",)
    )
    names = [f"c{i}" for i in range(7)]
    for name in names:
        resource_v1.create_namespaced_resource_claim(NS, dra_claim(name, gpu_share("8Gi", "30")))
    for i, name in enumerate(names):
        core_v1.create_namespaced_pod(NS, claim_pod(f"p{i}", named(name)))
    scheduler.wait_for(lambda s: s.counters.scheduled == 6 and s.counters.unschedulable >= 1, 15)
    placed = [n for i, n in enumerate(names) if node_of(core_v1, f"p{i}") == "n1"]
    assert len(placed) == 6
    totals = consumed_per_device(api_client, placed)
    assert totals == {
        f"n1/{dra.device_name(0)}": {"memory": 24 * 2**30, "cores": 90},
        f"n1/{dra.device_name(1)}": {"memory": 24 * 2**30, "cores": 90},
    }
    left = next(i for i, n in enumerate(names) if n not in placed)
    failed = wait_for(lambda: events_of(core_v1, f"p{left}", "FailedScheduling"), what="FailedScheduling")
    assert failed[0].message == "0/1 nodes are available: 1 cannot allocate all claims."


def test_a_deallocated_claim_frees_room_for_a_waiting_pod(
    core_v1: Any, api_client: client.ApiClient, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n1", hami_gpu_device(0)), nodes=("n1",))
    for name in ("a", "b"):
        resource_v1.create_namespaced_resource_claim(NS, dra_claim(name, gpu_share("50Gi", "60")))
    core_v1.create_namespaced_pod(NS, claim_pod("pa", named("a")))
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 10)
    core_v1.create_namespaced_pod(NS, claim_pod("pb", named("b")))
    scheduler.wait_for(lambda s: s.counters.unschedulable >= 1, 10)
    core_v1.delete_namespaced_pod("pa", NS, grace_period_seconds=0)
    resource_v1.patch_namespaced_resource_claim_status(
        "a", NS, {"status": {"allocation": None, "reservedFor": None}}
    )
    scheduler.wait_for(lambda s: s.counters.scheduled == 2, 10)
    assert node_of(core_v1, "pb") == "n1"


def test_a_shared_claim_only_gets_the_second_pod_appended_to_reserved_for(
    core_v1: Any, api_client: client.ApiClient, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n1"), resource_slice("n2"))
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("shared", gpu_share("4Gi", "20")))
    first = core_v1.create_namespaced_pod(NS, claim_pod("p1", named("shared")))
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 10)
    allocation = claim_json(api_client, "shared")["status"]["allocation"]
    second = core_v1.create_namespaced_pod(NS, claim_pod("p2", named("shared")))
    scheduler.wait_for(lambda s: s.counters.scheduled == 2, 10)
    assert node_of(core_v1, "p2") == node_of(core_v1, "p1")
    claim = claim_json(api_client, "shared")
    assert claim["status"]["allocation"] == allocation
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [first.metadata.uid, second.metadata.uid]


def test_a_tainted_gpu_gets_no_new_claims(
    core_v1: Any, api_client: client.ApiClient, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    taint = {"key": "hami.io/xid", "value": "79", "effect": "NoSchedule"}
    setup_nodes(
        core_v1,
        resource_v1,
        resource_slice("n1", hami_gpu_device(0, taints=[taint]), hami_gpu_device(1)),
        nodes=("n1",),
    )
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("c", gpu_share()))
    core_v1.create_namespaced_pod(NS, claim_pod("p", named("c")))
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 10)
    assert claim_json(api_client, "c")["status"]["allocation"]["devices"]["results"][0][
        "device"
    ] == dra.device_name(1)


def test_a_failing_selector_is_a_scheduler_error_in_kube_words(
    core_v1: Any, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n1"), nodes=("n1",))
    bad = gpu_share(selectors=[f"device.attributes['{dra.DRIVER}'].vendor == 'x'"])
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("c", bad))
    core_v1.create_namespaced_pod(NS, claim_pod("p", named("c")))
    scheduler.wait_for(lambda s: s.counters.errors >= 1, 10)
    failed = wait_for(lambda: events_of(core_v1, "p", "FailedScheduling"), what="FailedScheduling")
    assert failed[0].message == "claim default/c: selector #0: CEL runtime error: no such key: vendor"
    wait_for(
        lambda: any(
            c.reason == "SchedulerError" for c in core_v1.read_namespaced_pod("p", NS).status.conditions or ()
        ),
        what="PodScheduled=False SchedulerError",
    )
    assert node_of(core_v1, "p") is None


def test_a_missing_device_class_is_unschedulable_until_it_is_created(
    core_v1: Any, resource_v1: client.ResourceV1Api, scheduler: SchedulerRunner
) -> None:
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    resource_v1.create_resource_slice(resource_slice("n1"))
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("c", gpu_share()))
    core_v1.create_namespaced_pod(NS, claim_pod("p", named("c")))
    failed = wait_for(lambda: events_of(core_v1, "p", "FailedScheduling"), what="FailedScheduling")
    assert (
        failed[0].message
        == f"0/1 nodes are available: request gpu: device class {dra.DEVICE_CLASS} does not exist."
    )
    resource_v1.create_device_class(device_class())
    scheduler.wait_for(lambda s: s.counters.scheduled == 1, 10)


def test_a_failed_bind_takes_the_pod_out_of_reserved_for_and_frees_the_in_flight_capacity(
    core_v1: Any,
    api_client: client.ApiClient,
    resource_v1: client.ResourceV1Api,
    stub: ExtenderStub,
    scheduler: SchedulerRunner,
) -> None:
    setup_nodes(core_v1, resource_v1, resource_slice("n1"), nodes=("n1",))
    resource_v1.create_namespaced_resource_claim(NS, dra_claim("c", gpu_share("8Gi", "40")))
    stub.hold_binds()
    # A DRA pod that also asks nvidia.com/gpu goes through the extender, whose bind is held here.
    body = claim_pod("p", named("c"))
    body["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    core_v1.create_namespaced_pod(NS, body)
    stub.wait_calls("bind", "p")
    claim = claim_json(api_client, "c")
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p"]  # PreBind ran before the bind
    core_v1.create_namespaced_pod_binding(
        "p", NS, {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}, _preload_content=False
    )
    stub.release_binds()  # the extender's Binding now fails (already bound): the stand-in unreserves
    scheduler.wait_for(lambda s: s.counters.bind_failures == 1, 10)
    wait_for(lambda: not claim_json(api_client, "c")["status"].get("reservedFor"), what="reservedFor emptied")
    assert claim_json(api_client, "c")["status"]["allocation"]  # deallocation is the claim controller's job
    scheduler.wait_for(lambda s: not s.dra.in_flight and not s.dra.assumed, 10)
