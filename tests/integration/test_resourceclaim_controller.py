"""The ResourceClaim controller stand-in against the local API server: claims created from templates
(owner reference, generated name, pod status), reservations released when pods finish or go, claims
deallocated and their finalizer removed, generated claims deleted with their pod."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hami_api import dra
from hami_kube.client import KubeApi
from hami_sim.controllers.resourceclaim import (
    FINALIZER,
    POD_CLAIM_ANNOTATION,
    ResourceClaimController,
    generate_name,
)
from tests.conftest import ApiServerHandle
from tests.waiting import wait_for

NS = "default"


class ControllerThread:
    """The controller on its own event loop in a thread, as in its own process."""

    def __init__(self, kubeconfig: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.kubeconfig = kubeconfig
        self.api: KubeApi | None = None
        self.controller: ResourceClaimController | None = None

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self) -> ResourceClaimController:
        async def go() -> ResourceClaimController:
            self.api = await KubeApi.connect(self.kubeconfig)
            self.controller = ResourceClaimController(self.api)
            await self.controller.start()
            return self.controller

        result: ResourceClaimController = self.call(go())
        return result

    def stop(self) -> None:
        async def go() -> None:
            if self.controller is not None:
                await self.controller.stop()
            if self.api is not None:
                await self.api.close()

        self.call(go())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def controller(apiserver: ApiServerHandle) -> Iterator[ResourceClaimController]:
    runner = ControllerThread(str(apiserver.kubeconfig))
    try:
        yield runner.start()
    finally:
        runner.stop()


@pytest.fixture
def resource_v1(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


def template(name: str = "vgpu-4g") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "metadata": {"labels": {"app": "demo"}, "annotations": {"note": "from-template"}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": dra.DEVICE_CLASS,
                                "capacity": {"requests": {"memory": "4000Mi", "cores": "30"}},
                            },
                        }
                    ]
                }
            },
        },
    }


def dra_pod(name: str, template_name: str = "vgpu-4g") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def claim_of(core_v1: client.CoreV1Api, pod: str) -> str | None:
    statuses = core_v1.read_namespaced_pod(pod, NS).status.resource_claim_statuses or []
    return next((s.resource_claim_name for s in statuses if s.name == "gpu"), None)


def test_a_pod_claim_is_created_from_its_template_owned_by_the_pod(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    pod = core_v1.create_namespaced_pod(NS, dra_pod("trainer"))
    name = wait_for(lambda: claim_of(core_v1, "trainer"), what="the pod's claim in its status")
    assert name.startswith("trainer-gpu-") and len(name) == len("trainer-gpu-") + 5
    claim = resource_v1.read_namespaced_resource_claim(name, NS)
    owner = claim.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
        "Pod",
        "trainer",
        pod.metadata.uid,
        True,
        True,
    )
    assert claim.metadata.annotations == {"note": "from-template", POD_CLAIM_ANNOTATION: "gpu"}
    assert claim.metadata.labels == {"app": "demo"}
    assert claim.spec.devices.requests[0].exactly.capacity.requests == {"memory": "4000Mi", "cores": "30"}
    assert controller.created == 1


def test_a_missing_template_is_a_warning_event_and_the_claim_comes_when_it_appears(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    core_v1.create_namespaced_pod(NS, dra_pod("early", "later"))

    def warned() -> bool:
        events = core_v1.list_namespaced_event(NS, field_selector="involvedObject.name=early").items
        return any(e.reason == "FailedResourceClaimCreation" for e in events)

    wait_for(warned, what="a FailedResourceClaimCreation event")
    resource_v1.create_namespaced_resource_claim_template(NS, template("later"))
    assert wait_for(lambda: claim_of(core_v1, "early"), timeout=20, what="the claim once the template exists")


def _allocate_and_reserve(resource_v1: client.ResourceV1Api, claim: str, pod: client.V1Pod) -> None:
    """What the scheduler does at PreBind: finalizer, then allocation and reservation."""
    resource_v1.patch_namespaced_resource_claim(claim, NS, {"metadata": {"finalizers": [FINALIZER]}})
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": dra.DRIVER,
                    "pool": "node-a",
                    "device": dra.device_name(0),
                    "shareID": "3f0c6d2e-7b1a-4c7e-9a55-2b1f0a9d8e11",
                    "consumedCapacity": {"memory": "4000Mi", "cores": "30"},
                }
            ]
        }
    }
    reserved = [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]
    resource_v1.patch_namespaced_resource_claim_status(
        claim, NS, {"status": {"allocation": allocation, "reservedFor": reserved}}
    )


def test_a_finished_pod_releases_its_claim_which_is_deallocated_and_deleted(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    pod = core_v1.create_namespaced_pod(NS, dra_pod("job"))
    name = wait_for(lambda: claim_of(core_v1, "job"), what="the pod's claim")
    _allocate_and_reserve(resource_v1, name, pod)
    core_v1.patch_namespaced_pod_status("job", NS, {"status": {"phase": "Succeeded"}})

    def gone() -> bool:
        try:
            resource_v1.read_namespaced_resource_claim(name, NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, what="the finished pod's claim to be deleted")
    # The controller counts the delete once its answer is back, which may be after the test saw the 404.
    wait_for(lambda: controller.deleted == 1, what="the controller to count the delete")
    assert controller.deallocated == 1 and controller.deleted == 1


def test_a_finished_pods_claim_once_deleted_is_not_made_again(
    apiserver: ApiServerHandle, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    """Issue 31: a sync of a pod that is done (an event, a relist, a restart) made its deleted claim again,
    which the claim sync then deleted, in a loop that kept the controller minutes behind in a chaos run."""
    runner = ControllerThread(str(apiserver.kubeconfig))
    controller = runner.start()
    try:
        resource_v1.create_namespaced_resource_claim_template(NS, template())
        pod = core_v1.create_namespaced_pod(NS, dra_pod("done"))
        name = wait_for(lambda: claim_of(core_v1, "done"), what="the pod's claim")
        _allocate_and_reserve(resource_v1, name, pod)
        core_v1.patch_namespaced_pod_status("done", NS, {"status": {"phase": "Succeeded"}})
        wait_for(lambda: controller.deleted == 1, what="the finished pod's claim to be deleted")
        wait_for(lambda: name not in {k.split("/")[1] for k in controller.claims}, what="the delete seen")
        runner.call(controller.sync_pod(f"{NS}/done"))
        assert controller.created == 1
        assert resource_v1.list_namespaced_resource_claim(NS).items == []
    finally:
        runner.stop()


def test_a_claim_its_gone_pod_controls_is_deleted_though_the_pods_status_never_named_it(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    """Issue 31: a claim created for a pod that was deleted before its status could name the claim (the
    status patch got 404) stayed for good; kube's garbage collector goes by the owner reference."""
    body = dra_pod("short-lived")
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "someone-elses"}]
    pod = core_v1.create_namespaced_pod(NS, body)
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "short-lived",
        "uid": pod.metadata.uid,
        "controller": True,
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "orphan",
            "ownerReferences": [owner],
            "annotations": {POD_CLAIM_ANNOTATION: "gpu"},
        },
        "spec": template()["spec"]["spec"],
    }
    resource_v1.create_namespaced_resource_claim(NS, claim)
    wait_for(lambda: f"{NS}/orphan" in controller.claims, what="the controller to see the claim")
    core_v1.delete_namespaced_pod("short-lived", NS)

    def gone() -> bool:
        try:
            resource_v1.read_namespaced_resource_claim("orphan", NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, what="the gone pod's claim to be deleted")


def test_a_deleted_pod_frees_a_shared_claim_but_keeps_it_reserved_for_the_other_pod(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    resource_v1.create_namespaced_resource_claim(
        NS, {"metadata": {"name": "shared"}, "spec": template()["spec"]["spec"]}
    )
    pods = []
    for name in ("a", "b"):
        body = dra_pod(name)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
        pods.append(core_v1.create_namespaced_pod(NS, body))
    _allocate_and_reserve(resource_v1, "shared", pods[0])
    resource_v1.patch_namespaced_resource_claim_status(
        "shared",
        NS,
        {
            "status": {
                "reservedFor": [
                    {"resource": "pods", "name": p.metadata.name, "uid": p.metadata.uid} for p in pods
                ]
            }
        },
    )
    core_v1.delete_namespaced_pod("a", NS)

    def only_b() -> bool:
        status = resource_v1.read_namespaced_resource_claim("shared", NS).status
        return [r.name for r in status.reserved_for or []] == ["b"]

    wait_for(only_b, what="the deleted pod's reservation to go")
    still = resource_v1.read_namespaced_resource_claim("shared", NS)
    assert still.status.allocation is not None and FINALIZER in still.metadata.finalizers
    core_v1.delete_namespaced_pod("b", NS)

    def released() -> bool:
        claim = resource_v1.read_namespaced_resource_claim("shared", NS)
        return claim.status.allocation is None and not claim.metadata.finalizers

    wait_for(released, what="the claim deallocated and its finalizer removed")
    # A claim the user created is not deleted with the pods that used it.
    assert resource_v1.read_namespaced_resource_claim("shared", NS).metadata.deletion_timestamp is None


def test_a_deleted_claim_in_use_waits_for_its_pod_then_goes(
    controller: ResourceClaimController, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    pod = core_v1.create_namespaced_pod(NS, dra_pod("user"))
    name = wait_for(lambda: claim_of(core_v1, "user"), what="the pod's claim")
    _allocate_and_reserve(resource_v1, name, pod)
    resource_v1.delete_namespaced_resource_claim(name, NS)
    assert resource_v1.read_namespaced_resource_claim(name, NS).metadata.deletion_timestamp is not None
    core_v1.delete_namespaced_pod("user", NS)

    def gone() -> bool:
        try:
            resource_v1.read_namespaced_resource_claim(name, NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, what="the claim to go with its pod")


def test_generate_name_shortens_both_parts_in_proportion() -> None:
    assert generate_name("p", "gpu") == "p-gpu-"
    # 82 characters: each part cut to its share of 57 (60*57//82 = 41, 20*57//82 = 13), no trailing
    # hyphen, as controller.go writes it.
    assert generate_name("a" * 60, "b" * 20) == "a" * 41 + "-" + "b" * 13


def test_claims_are_made_from_the_watched_template_without_reading_it_per_pod(
    apiserver: ApiServerHandle,
    controller: ResourceClaimController,
    core_v1: client.CoreV1Api,
    resource_v1: client.ResourceV1Api,
) -> None:
    # Upstream reads templates from its informer's lister; a GET per pod cost a request of the
    # controller's client-side rate limit each (bench/e2e.py --mode dra ran at a third of the speed).
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    wait_for(lambda: f"{NS}/vgpu-4g" in controller.templates, what="the template in the controller's watch")
    before = apiserver.runner.counters().get(("get", "resourceclaimtemplates", ""), 0)
    for name in ("w1", "w2", "w3"):
        core_v1.create_namespaced_pod(NS, dra_pod(name))
    for name in ("w1", "w2", "w3"):
        wait_for(lambda name=name: claim_of(core_v1, name), what=f"pod {name}'s claim")
    assert apiserver.runner.counters().get(("get", "resourceclaimtemplates", ""), 0) == before
    assert controller.created == 3


def test_a_pod_added_again_while_its_sync_creates_the_claim_gets_one_claim(
    apiserver: ApiServerHandle, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    # Issue 31: after a restart a relist re-added a pod key while a worker was still creating the pod's
    # claim; a second worker synced the same pod from the same copy (no claim named yet), made a second
    # claim and pointed the pod at it, while the scheduler had allocated and reserved the first: kubelet
    # refused the pod for good. client-go's workqueue never hands a key to two workers at once.
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    runner = ControllerThread(str(apiserver.kubeconfig))
    try:
        ctrl = runner.start()
        assert runner.api is not None
        api = runner.api
        wait_for(lambda: f"{NS}/vgpu-4g" in ctrl.templates, what="the template in the controller's watch")
        gate = asyncio.Event()
        posts: list[str] = []
        made: list[str] = []
        real_request = api.request

        async def held_request(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if not (method == "POST" and path.endswith("/resourceclaims")):
                return await real_request(method, path, *args, **kwargs)
            posts.append(path)
            await gate.wait()
            answer = await real_request(method, path, *args, **kwargs)
            made.append(answer["metadata"]["name"])
            return answer

        api.request = held_request  # type: ignore[method-assign]
        core_v1.create_namespaced_pod(NS, dra_pod("twice"))
        wait_for(lambda: len(posts) == 1, what="the first sync's claim create, held")

        async def add_again_and_release() -> None:
            ctrl._enqueue(f"pod:{NS}/twice")
            for _ in range(100):  # every worker free to take the key reaches the create in a few turns
                await asyncio.sleep(0)
            gate.set()

        runner.call(add_again_and_release())
        wait_for(
            lambda: len(made) == len(posts) and claim_of(core_v1, "twice") in made,
            what="the creates done and the pod's status naming one of their claims",
        )
        claims = [
            c.metadata.name
            for c in resource_v1.list_namespaced_resource_claim(NS).items
            if c.metadata.owner_references and c.metadata.owner_references[0].name == "twice"
        ]
        assert claims == [claim_of(core_v1, "twice")]
        assert len(posts) == 1 and ctrl.created == 1
    finally:
        runner.stop()


def test_a_pod_deleted_while_the_pods_watch_was_down_frees_its_claim_at_the_relist(
    apiserver: ApiServerHandle, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api
) -> None:
    """client-go's Replace delivers what a relist no longer has as deletions (DeletedFinalStateUnknown,
    tools/cache/delta_fifo.go): the claims of a pod deleted in a gap of the pods watch are synced again,
    and the pod confirmed gone by a GET. Before, such a claim stayed reserved for the gone pod (four in a
    10,000-pod chaos run). The controller here is fed by hand, not by its watches, to make the gap."""
    resource_v1.create_namespaced_resource_claim_template(NS, template())
    runner = ControllerThread(str(apiserver.kubeconfig))
    try:
        ctrl = runner.start()
        pod = core_v1.create_namespaced_pod(NS, dra_pod("gap"))
        name = wait_for(lambda: claim_of(core_v1, "gap"), what="the pod's claim")
        _allocate_and_reserve(resource_v1, name, pod)
        wait_for(
            lambda: (ctrl.claims.get(f"{NS}/{name}") or {}).get("status", {}).get("reservedFor"),
            what="the reservation in the controller's watch",
        )
    finally:
        runner.stop()
    fed = ControllerThread(str(apiserver.kubeconfig))

    async def unstarted() -> tuple[KubeApi, ResourceClaimController]:
        api = await KubeApi.connect(fed.kubeconfig)
        fed.api = api
        return api, ResourceClaimController(api)

    api, ctrl = fed.call(unstarted())

    async def relist() -> None:
        pods = await api.get(f"/api/v1/namespaces/{NS}/pods")
        ctrl._replace_pods(pods["items"])

    async def list_claims() -> None:
        claims = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
        ctrl._replace_claims(claims["items"])

    async def queued() -> list[str]:
        keys = []
        while len(ctrl._queue):
            key = await ctrl._queue.get()
            ctrl._queue.done(key)
            keys.append(key)
        return keys

    try:
        fed.call(relist())
        fed.call(list_claims())
        fed.call(queued())
        core_v1.delete_namespaced_pod("gap", NS)  # the watch is down: no DELETED reaches the controller
        wait_for(lambda: not core_v1.list_namespaced_pod(NS).items, what="the pod gone")
        fed.call(relist())
        assert f"claim:{NS}/{name}" in fed.call(queued())
        fed.call(ctrl.sync_claim(f"{NS}/{name}"))
        with pytest.raises(ApiException) as gone:
            resource_v1.read_namespaced_resource_claim(name, NS)
        assert gone.value.status == 404 and ctrl.deallocated == 1 and ctrl.deleted == 1
    finally:
        fed.stop()
