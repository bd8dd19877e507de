"""The kubelet stand-in's DRA manager with a small DRA plugin written here (real gRPC on real Unix
sockets, the generated registration and DRAPlugin v1/v1beta1 stubs) and the local API server:
registration through plugins_registry with kubelet's refusals, the choice of v1 or v1beta1, claims
prepared before the pod runs (kubelet's errors, event and retries), the CDI edits each container
gets, the DRA checkpoint, unprepare with the last pod (and after a restart), ResourceSlice wiping,
and PodResources' dynamic resources."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from hami_sim.kubelet import KubeletConfig, KubeletRunner
from hami_sim.kubelet.dra.checkpoint import DraCheckpointError
from hami_sim.kubelet.dra.manager import DraManager
from hami_sim.kubelet.podresources import api_pb2, api_pb2_grpc
from tests.apiserver_util import bind
from tests.builders import claim_refs, container, dra_result, pod, resource_claim
from tests.conftest import ApiServerHandle
from tests.integration.dra_plugin import CDI_KIND, DRIVER, TIMEOUT, DraPlugin
from tests.waiting import wait_for

NODE = "node-1"
NS = "default"
V1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
V1BETA1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
FAILED = "FailedPrepareDynamicResources"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def config_for(apiserver: ApiServerHandle, directory: Path, **options: Any) -> KubeletConfig:
    defaults: dict[str, Any] = {
        "prepare_retry_initial": 0.05,
        "prepare_retry_max": 0.2,
        "dra_wiping_delay": 0.3,
    }
    return KubeletConfig(
        NODE, directory / "dp", kubeconfig=apiserver.kubeconfig, create_node=True, **{**defaults, **options}
    )


@pytest.fixture
def kubelet(apiserver: ApiServerHandle, short_dir: Path) -> Iterator[KubeletRunner]:
    with KubeletRunner(config_for(apiserver, short_dir)) as runner:
        yield runner


@pytest.fixture
def make_plugin(kubelet: KubeletRunner, short_dir: Path) -> Iterator[Callable[..., DraPlugin]]:
    plugins: list[DraPlugin] = []

    def make(**options: Any) -> DraPlugin:
        options.setdefault("cdi_dir", kubelet.config.cdi_dirs[0])
        plugin = DraPlugin(kubelet.config.registry_dir, short_dir / "plugins", **options)
        plugins.append(plugin)
        return plugin.serve()

    yield make
    for plugin in plugins:
        plugin.stop()


@pytest.fixture
def resource_v1(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


def connected(driver: str = DRIVER, count: int = 1) -> Callable[[DraManager], bool]:
    def check(dra: DraManager) -> bool:
        plugins = dra.plugins.plugins().get(driver, []) if dra.plugins is not None else []
        return len(plugins) == count and all(p.connected for p in plugins)

    return check


def registered_service(kubelet: KubeletRunner, driver: str = DRIVER) -> list[tuple[str, str, bool]]:
    async def read() -> list[tuple[str, str, bool]]:
        dra = kubelet.kubelet.dra
        assert dra is not None and dra.plugins is not None
        return [(p.endpoint, p.service, p.connected) for p in dra.plugins.plugins().get(driver, [])]

    return kubelet.run(read)


class Cluster:
    """Claims and pods on the API server, as the scheduler and claim controller would leave them."""

    def __init__(self, core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api) -> None:
        self.core = core_v1
        self.resource = resource_v1

    def claim(self, name: str, *, driver: str = DRIVER, allocated: bool = True, **options: Any) -> str:
        created = self.resource.create_namespaced_resource_claim(
            NS, resource_claim(name, namespace=NS, **options)
        )
        if allocated:
            results = [dra_result("gpu-0", driver=driver, pool=NODE)]
            status = resource_claim(name, results=results, node=NODE)["status"]
            self.resource.patch_namespaced_resource_claim_status(name, NS, {"status": status})
        return str(created.metadata.uid)

    def reserve(self, claim: str, pod_name: str, pod_uid: str) -> None:
        current = self.resource.read_namespaced_resource_claim(claim, NS)
        reserved = [
            {"resource": "pods", "name": r.name, "uid": r.uid} for r in current.status.reserved_for or []
        ]
        reserved.append({"resource": "pods", "name": pod_name, "uid": pod_uid})
        self.resource.patch_namespaced_resource_claim_status(claim, NS, {"status": {"reservedFor": reserved}})

    def pod(
        self,
        name: str,
        claim: str,
        *,
        reserve: bool = True,
        containers: tuple[dict[str, Any], ...] = (),
        template: bool = False,
    ) -> str:
        """Create a pod using `claim` (as pod claim "gpu"; `template`: made from a template, so the
        claim's name comes from the pod's status), reserve the claim for it, bind it to the node."""
        source = {"resourceClaimTemplateName": "vgpu"} if template else {"resourceClaimName": claim}
        body = pod(
            name,
            *(containers or (container("main", resources=claim_refs("gpu")),)),
            namespace=NS,
            resourceClaims=[{"name": "gpu", **source}],
        )
        uid = str(self.core.create_namespaced_pod(NS, body).metadata.uid)
        if template:
            statuses = [{"name": "gpu", "resourceClaimName": claim}]
            self.core.patch_namespaced_pod_status(name, NS, {"status": {"resourceClaimStatuses": statuses}})
        if reserve:
            self.reserve(claim, name, uid)
        bind(self.core, NS, name, NODE)
        return uid

    def events(self, pod_name: str) -> list[tuple[str, str, str]]:
        items = self.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod_name}").items
        return [(e.type, e.reason, e.message) for e in items]


@pytest.fixture
def cluster(core_v1: client.CoreV1Api, resource_v1: client.ResourceV1Api) -> Cluster:
    return Cluster(core_v1, resource_v1)


@contextmanager
def lister(path: Path) -> Iterator[Any]:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
        yield api_pb2_grpc.PodResourcesListerStub(channel)


# ------------------------------------------------------------------------------ registration


def test_a_plugin_registers_through_its_socket_and_kubelet_picks_v1(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin]
) -> None:
    plugin = make_plugin()
    assert plugin.wait_statuses(1) == [(True, "")]
    kubelet.wait_for_dra(connected())
    assert registered_service(kubelet) == [(str(plugin.dra_socket), "v1.DRAPlugin", True)]
    assert plugin.calls.methods[:2] == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]


def test_kubelet_follows_the_plugins_order_of_services(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster
) -> None:
    plugin = make_plugin(supported=["v1beta1.DRAPlugin", "v1.DRAPlugin"])
    kubelet.wait_for_dra(connected())
    assert registered_service(kubelet)[0][1] == "v1beta1.DRAPlugin"
    claim_uid = cluster.claim("c")
    cluster.pod("p", "c")
    assert kubelet.wait_for_pod(NS, "p").admitted
    assert V1BETA1_PREPARE in plugin.calls.methods and V1_PREPARE not in plugin.calls.methods
    ((entry,),) = [kubelet.dra_checkpoint()]
    (device,) = entry.driver_state[DRIVER]
    assert (device.share_id, device.cdi_device_ids) == (None, (f"{CDI_KIND}={claim_uid}-gpu-0",))


def test_registration_refusals_reach_the_plugin_with_kubelets_text(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin]
) -> None:
    csi = make_plugin(name="csi", plugin_type="CSIPlugin")
    ((ok, error),) = csi.wait_statuses(1)[:1]
    assert not ok
    assert error == (
        "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket "
        f"{csi.registration_socket}"
    )
    future = make_plugin(name="future", supported=["v2.DRAPlugin"])
    ok, error = future.wait_statuses(1)[0]
    assert not ok
    assert error == (
        "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA "
        f"driver plugin {DRIVER} at endpoint {future.dra_socket}: none of services supported by the plugin "
        '(["v2.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )

    async def plugins() -> dict[str, Any]:
        dra = kubelet.kubelet.dra
        assert dra is not None and dra.plugins is not None
        return dra.plugins.plugins()

    assert kubelet.run(plugins) == {}


def test_the_newest_connected_plugin_of_a_driver_is_used_and_a_removed_socket_deregisters(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster
) -> None:
    old = make_plugin(name="old")
    kubelet.wait_for_dra(connected(count=1))
    new = make_plugin(name="new")
    kubelet.wait_for_dra(connected(count=2))
    cluster.claim("c1")
    cluster.pod("p1", "c1")
    assert kubelet.wait_for_pod(NS, "p1").admitted
    assert (len(new.calls.prepare), len(old.calls.prepare)) == (1, 0)
    new.stop_dra()  # the newest plugin's connection drops: the older connected one is used
    kubelet.wait_for_dra(
        lambda dra: dra.plugins is not None and not dra.plugins.plugins()[DRIVER][1].connected
    )
    cluster.claim("c2")
    cluster.pod("p2", "c2")
    assert kubelet.wait_for_pod(NS, "p2").admitted
    assert (len(new.calls.prepare), len(old.calls.prepare)) == (1, 1)
    new.stop()
    kubelet.wait_for_dra(connected(count=1))
    assert [e for e, _, _ in registered_service(kubelet)] == [str(old.dra_socket)]


# ------------------------------------------------------------------------------ prepare


def test_a_pods_claim_is_prepared_before_it_runs_and_its_containers_get_the_cdi_edits(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    claim_uid = cluster.claim("c")
    using = container("main", resources=claim_refs("gpu"))
    other = container("side", resources=claim_refs(("gpu", "other")))
    plain = container("plain")
    uid = cluster.pod("p", "c", containers=(using, other, plain))
    result = kubelet.wait_for_pod(NS, "p")
    assert result.admitted, result
    assert plugin.calls.prepare == [[(NS, claim_uid, "c")]]
    assert V1_PREPARE in plugin.calls.methods
    (entry,) = kubelet.dra_checkpoint()
    assert (entry.claim_name, entry.claim_uid, entry.pod_uids) == ("c", claim_uid, {uid})
    (device,) = entry.driver_state[DRIVER]
    assert (device.pool_name, device.device_name, device.share_id) == (
        "node-1",
        "gpu-0",
        f"share-{claim_uid}",
    )
    containers = kubelet.containers()
    main = containers.get(uid, "main")
    assert main is not None
    assert main.cdi_devices == (f"{CDI_KIND}={claim_uid}-gpu-0",)
    assert main.env_map == {"CLAIM_C": claim_uid}
    assert [m["containerPath"] for m in main.mounts] == ["/usr/local/vgpu/libvgpu.so"]
    assert [d["path"] for d in main.device_nodes] == ["/dev/nvidia0"]
    # "side" names a request the device does not belong to; "plain" lists no claim
    assert containers.env(uid, "side") == {} and containers.env(uid, "plain") == {}
    with lister(kubelet.config.pod_resources_socket) as stub:
        listed = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="p", pod_namespace=NS), timeout=TIMEOUT)
    by_name = {c.name: c for c in listed.pod_resources.containers}
    (dynamic,) = by_name["main"].dynamic_resources
    assert (dynamic.claim_name, dynamic.claim_namespace) == ("c", NS)
    (resource,) = dynamic.claim_resources
    assert (resource.driver_name, resource.pool_name, resource.device_name, resource.share_id) == (
        DRIVER,
        "node-1",
        "gpu-0",
        f"share-{claim_uid}",
    )
    assert [d.name for d in resource.cdi_devices] == [f"{CDI_KIND}={claim_uid}-gpu-0"]
    assert list(by_name["plain"].dynamic_resources) == []


def test_a_claim_made_from_a_template_must_belong_to_the_pod(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    make_plugin()
    kubelet.wait_for_dra(connected())
    cluster.claim("stolen")
    cluster.pod("p", "stolen", template=True)
    result = kubelet.wait_for_pod(NS, "p")
    assert result.reason == FAILED
    assert result.message == (
        f"prepare dynamic resources: ResourceClaim {NS}/stolen was not created for pod {NS}/p "
        "(pod is not owner)"
    )
    owner = core_v1.read_namespaced_pod("p", NS)
    cluster.claim("p-gpu-1", owner_pod=("p", owner.metadata.uid))
    cluster.reserve("p-gpu-1", "p", owner.metadata.uid)
    statuses = [{"name": "gpu", "resourceClaimName": "p-gpu-1"}]
    core_v1.patch_namespaced_pod_status("p", NS, {"status": {"resourceClaimStatuses": statuses}})
    assert kubelet.wait_for_pod(NS, "p", predicate=lambda r: r.admitted).admitted


def test_an_unreserved_claim_leaves_the_pod_pending_with_kubelets_event_until_it_is_reserved(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    claim_uid = cluster.claim("c")
    uid = cluster.pod("p", "c", reserve=False)
    result = kubelet.wait_for_pod(NS, "p")
    error = f"prepare dynamic resources: pod p ({uid}) is not allowed to use ResourceClaim c ({claim_uid})"
    assert (result.admitted, result.reason, result.message) == (False, FAILED, error)
    status = core_v1.read_namespaced_pod("p", NS).status
    assert status.phase == "Pending"
    assert [(s.name, s.state.waiting.reason) for s in status.container_statuses] == [
        ("main", "ContainerCreating")
    ]
    events = wait_for(lambda: cluster.events("p"), what="the pod's Event")
    assert events[0] == ("Warning", FAILED, f"Failed to prepare dynamic resources: {error}")
    assert plugin.calls.prepare == []
    cluster.reserve("c", "p", uid)
    assert kubelet.wait_for_pod(NS, "p", predicate=lambda r: r.admitted).admitted
    assert core_v1.read_namespaced_pod("p", NS).status.phase == "Running"
    assert plugin.calls.prepare == [[(NS, claim_uid, "c")]]


def test_a_pod_waits_for_its_driver_to_register(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster
) -> None:
    cluster.claim("c")
    cluster.pod("p", "c")
    result = kubelet.wait_for_pod(NS, "p")
    assert result.message == f"prepare dynamic resources: DRA driver {DRIVER} is not registered"
    make_plugin()
    assert kubelet.wait_for_pod(NS, "p", predicate=lambda r: r.admitted).admitted


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"errors": {"c": "GPU on fire"}}, "NodePrepareResources failed for ResourceClaim c: GPU on fire"),
        ({"skip": {"c"}}, "NodePrepareResources skipped 1 ResourceClaims"),
        ({"unknown_uid": True}, "NodePrepareResources returned result for unknown claim UID not-asked-for"),
        (
            {"abort": grpc.StatusCode.UNAVAILABLE},
            "NodePrepareResources: rpc error: code = Unavailable desc = plugin says no",
        ),
    ],
)
def test_a_failed_prepare_fails_the_pods_start_with_kubelets_message_and_is_tried_again(
    kubelet: KubeletRunner,
    make_plugin: Callable[..., DraPlugin],
    cluster: Cluster,
    script: dict[str, Any],
    message: str,
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    for key, value in script.items():
        setattr(plugin.script, key, value)
    claim_uid = cluster.claim("c")
    uid = cluster.pod("p", "c")
    result = kubelet.wait_for_pod(NS, "p")
    assert (result.admitted, result.reason, result.message) == (
        False,
        FAILED,
        "prepare dynamic resources: " + message,
    )
    plugin.wait(lambda c: len(c.prepare) >= 2, "a second NodePrepareResources")
    (entry,) = kubelet.dra_checkpoint()  # the pod's reference stays for the next try
    assert entry.pod_uids == {uid}
    plugin.script = type(plugin.script)()
    assert kubelet.wait_for_pod(NS, "p", predicate=lambda r: r.admitted).admitted
    assert plugin.calls.prepare[-1] == [(NS, claim_uid, "c")]


def test_a_cdi_spec_the_runtime_refuses_fails_the_container_naming_the_problem(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    plugin = make_plugin()
    plugin.script.bad_spec = True
    kubelet.wait_for_dra(connected())
    claim_uid = cluster.claim("c")
    cluster.pod("p", "c")
    result = kubelet.wait_for_pod(NS, "p")
    assert (result.admitted, result.reason) == (False, "CreateContainerError")
    assert result.message.startswith(
        f"failed to create containerd container: CDI device injection failed: unresolvable CDI devices "
        f"{CDI_KIND}={claim_uid}-gpu-0 (spec problems: "
    )
    assert 'invalid environment variable "NOVALUE"' in result.message
    waiting = core_v1.read_namespaced_pod("p", NS).status.container_statuses[0].state.waiting
    assert (waiting.reason, waiting.message) == ("CreateContainerError", result.message)


# ------------------------------------------------------------------------------ unprepare


def test_a_shared_claim_is_unprepared_when_the_last_pod_using_it_goes(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    claim_uid = cluster.claim("c")
    first = cluster.pod("p1", "c")
    assert kubelet.wait_for_pod(NS, "p1").admitted
    second = cluster.pod("p2", "c")
    assert kubelet.wait_for_pod(NS, "p2").admitted
    assert len(plugin.calls.prepare) == 1  # prepared once, for the first pod
    assert kubelet.dra_checkpoint()[0].pod_uids == {first, second}
    spec_file = kubelet.config.cdi_dirs[0] / f"k8s.gpu.example.com-claim_{claim_uid}.json"
    assert spec_file.exists()
    core_v1.delete_namespaced_pod("p1", NS)
    wait_for(lambda: kubelet.dra_checkpoint()[0].pod_uids == {second}, what="p1's reference dropped")
    assert plugin.calls.unprepare == []
    assert kubelet.containers().get(first, "main") is None
    core_v1.delete_namespaced_pod("p2", NS)
    plugin.wait(lambda c: len(c.unprepare) == 1, "NodeUnprepareResources")
    assert plugin.calls.unprepare == [[(NS, claim_uid, "c")]]
    wait_for(lambda: kubelet.dra_checkpoint() == [], what="the claim to leave the checkpoint")
    assert not spec_file.exists()
    assert kubelet.containers().records == ()


def test_a_failed_unprepare_keeps_the_claim_and_is_tried_again(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    cluster.claim("c")
    uid = cluster.pod("p", "c")
    assert kubelet.wait_for_pod(NS, "p").admitted
    plugin.script.unprepare_errors["c"] = "still in use"
    core_v1.delete_namespaced_pod("p", NS)
    plugin.wait(lambda c: len(c.unprepare) >= 2, "a second NodeUnprepareResources")
    assert kubelet.dra_checkpoint()[0].pod_uids == {uid}

    async def might_need(dra_uid: str = uid) -> bool:
        dra = kubelet.kubelet.dra
        assert dra is not None
        return dra.pod_might_need_to_unprepare(dra_uid)

    assert kubelet.run(might_need)
    # kubelet deletes the pod only once its claims are unprepared (status manager canBeDeleted).
    assert core_v1.read_namespaced_pod("p", NS).metadata.deletion_timestamp is not None
    plugin.script.unprepare_errors.clear()
    wait_for(lambda: kubelet.dra_checkpoint() == [], what="the claim to leave the checkpoint")
    assert not kubelet.run(might_need)
    wait_for(lambda: not core_v1.list_namespaced_pod(NS).items, what="the kubelet deleted the pod")


def test_a_restart_registers_plugins_again_keeps_claims_and_prepares_them_again_for_new_pods(
    kubelet: KubeletRunner, make_plugin: Callable[..., DraPlugin], cluster: Cluster
) -> None:
    plugin = make_plugin()
    kubelet.wait_for_dra(connected())
    claim_uid = cluster.claim("c")
    first = cluster.pod("p1", "c")
    assert kubelet.wait_for_pod(NS, "p1").admitted
    kubelet.restart()
    assert plugin.wait_statuses(2)[1] == (True, "")
    kubelet.wait_for_dra(connected())
    (entry,) = kubelet.dra_checkpoint()
    assert entry.pod_uids == {first}
    second = cluster.pod("p2", "c")
    assert kubelet.wait_for_pod(NS, "p2").admitted
    # nothing is marked prepared after a restart: the claim is prepared again (plugins are idempotent)
    assert plugin.calls.prepare == [[(NS, claim_uid, "c")], [(NS, claim_uid, "c")]]
    (entry,) = kubelet.dra_checkpoint()
    assert entry.pod_uids == {first, second} and len(entry.driver_state[DRIVER]) == 1


def test_claims_of_pods_that_went_while_kubelet_was_down_are_unprepared_by_the_reconcile_loop(
    apiserver: ApiServerHandle, short_dir: Path, cluster: Cluster, core_v1: client.CoreV1Api
) -> None:
    config = config_for(apiserver, short_dir, dra_reconcile_period=0.2)
    plugin = DraPlugin(config.registry_dir, short_dir / "plugins", cdi_dir=config.cdi_dirs[0]).serve()
    try:
        with KubeletRunner(config) as kubelet:
            kubelet.wait_for_dra(connected())
            claim_uid = cluster.claim("c")
            uid = cluster.pod("p", "c")
            assert kubelet.wait_for_pod(NS, "p").admitted
            assert kubelet.containers().get(uid, "main") is not None
        # Gone while its kubelet is down: force-deleted (grace 0); a graceful delete would wait for it.
        core_v1.delete_namespaced_pod("p", NS, grace_period_seconds=0)
        with KubeletRunner(config) as kubelet:
            plugin.wait(lambda c: len(c.unprepare) == 1, "NodeUnprepareResources after the restart")
            assert plugin.calls.unprepare == [[(NS, claim_uid, "c")]]
            wait_for(lambda: kubelet.dra_checkpoint() == [], what="the claim to leave the checkpoint")
            wait_for(lambda: kubelet.containers().records == (), what="the gone pod's containers forgotten")
    finally:
        plugin.stop()


def test_a_corrupt_dra_checkpoint_stops_the_start_naming_the_file(
    apiserver: ApiServerHandle, short_dir: Path
) -> None:
    config = config_for(apiserver, short_dir)
    config.directory.mkdir(parents=True)
    config.dra_checkpoint_path.write_text('{"Data":"{}","Checksum":1}')
    runner = KubeletRunner(config)
    with pytest.raises(DraCheckpointError) as err:
        runner.start()
    assert str(config.dra_checkpoint_path) in str(err.value)
    assert "checksum mismatch" in str(err.value) and "please drain the node" in str(err.value)


# ------------------------------------------------------------------------------ ResourceSlices


def slice_of(node: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def slices(resource_v1: client.ResourceV1Api) -> list[tuple[str, str]]:
    return sorted((s.spec.node_name, s.spec.driver) for s in resource_v1.list_resource_slice().items)


def test_kubelet_wipes_the_nodes_slices_at_start_and_a_drivers_after_it_lost_its_plugins(
    apiserver: ApiServerHandle, short_dir: Path, resource_v1: client.ResourceV1Api
) -> None:
    for node, driver in ((NODE, DRIVER), (NODE, "other.example.com"), ("node-2", DRIVER)):
        resource_v1.create_resource_slice(slice_of(node, driver))
    config = config_for(apiserver, short_dir, dra_wiping_delay=0.3)
    with KubeletRunner(config) as kubelet:
        wait_for(lambda: slices(resource_v1) == [("node-2", DRIVER)], what="the node's slices to be wiped")
        plugin = DraPlugin(config.registry_dir, short_dir / "plugins").serve()
        try:
            kubelet.wait_for_dra(connected())
            resource_v1.create_resource_slice(slice_of(NODE, DRIVER))
            resource_v1.create_resource_slice(slice_of(NODE, "other.example.com"))
            plugin.stop_dra()
            # a plugin back within the wiping delay cancels the wipe
            kubelet.wait_for_dra(
                lambda dra: dra.plugins is not None and DRIVER in dra.plugins.pending_wipes()
            )
            plugin.serve_dra()
            kubelet.wait_for_dra(lambda dra: dra.plugins is not None and not dra.plugins.pending_wipes())
            assert (NODE, DRIVER) in slices(resource_v1)
        finally:
            plugin.stop()
        # no plugin for the delay: only that driver's slices on this node go
        wait_for(
            lambda: slices(resource_v1) == [(NODE, "other.example.com"), ("node-2", DRIVER)],
            what="the driver's slices to be wiped",
        )
