"""The kubelet stand-in's PodResources API v1, through the generated `v1.PodResourcesLister` client over
the real `<dir>/pod-resources/kubelet.sock`, with the API server stand-in and a real device plugin (gRPC
on its Unix socket): `List` reports for each container kubelet lists exactly the devices the checkpoint
records (plain init containers, rejected and deleted pods left out), `Get` answers one pod or kubelet's
error, `GetAllocatableResources` lists the healthy devices with their NUMA nodes, the rate limit refuses
with kubelet's error, and the socket is made, remade on restart and removed on stop."""

from __future__ import annotations

import asyncio
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_node.plugin.api import api_pb2 as dp
from hami_sim.kubelet import KubeletConfig, KubeletRunner, read_checkpoint
from hami_sim.kubelet.checkpoint import NO_TOPOLOGY
from hami_sim.kubelet.devicemanager import DeviceManager
from hami_sim.kubelet.podresources import api_pb2, api_pb2_grpc
from hami_sim.kubelet.podresources.server import PodResourcesServer
from hami_sim.nodehost import KUBELET_LONGEST_SOCKET
from tests.apiserver_util import create_and_bind
from tests.builders import container
from tests.conftest import ApiServerHandle
from tests.integration.kubelet_plugin import TIMEOUT, FakePlugin, devices

RES = "example.com/dev"
NODE = "node-1"
NS = "default"

# Entries as compared here: (resource, device IDs, NUMA node or None when the entry has no topology).
Entry = tuple[str, tuple[str, ...], int | None]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(apiserver: ApiServerHandle, short_dir: Path) -> Iterator[KubeletRunner]:
    config = KubeletConfig(NODE, short_dir / "dp", kubeconfig=apiserver.kubeconfig, create_node=True)
    with KubeletRunner(config) as runner:
        yield runner


@pytest.fixture
def plugin(kubelet: KubeletRunner) -> Iterator[FakePlugin]:
    """Six devices: a on NUMA 0, b on NUMA 1, c on both, d, e and f without topology."""
    both = dp.Device(ID="c", health="Healthy")
    both.topology.nodes.extend([dp.NUMANode(ID=0), dp.NUMANode(ID=1)])
    initial = [*devices("a", "b", numa={"a": 0, "b": 1}), both, *devices("d", "e", "f")]
    fake = FakePlugin(kubelet.config.directory, initial=initial)
    fake.serve()
    try:
        fake.register(RES)
        kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 6)
        yield fake
    finally:
        fake.stop()


@contextmanager
def lister(path: Path) -> Iterator[Any]:
    """The generated PodResourcesLister client on the socket, as a node agent would dial it."""
    with grpc.insecure_channel(f"unix://{path}") as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
        yield api_pb2_grpc.PodResourcesListerStub(channel)


def bound_name(path: Path) -> str:
    """The name the server listening at `path` bound: kubelet listens on a temporary name in the
    directory and renames it into place, so every new listener has a new one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect(str(path))
        return Path(conn.getpeername()).name


def entries(devices_: Any) -> list[Entry]:
    result = []
    for d in devices_:
        numa = [n.ID for n in d.topology.nodes] if d.HasField("topology") else None
        assert numa is None or len(numa) == 1, f"kubelet reports one NUMA node per entry, got {numa}"
        result.append((d.resource_name, tuple(d.device_ids), None if numa is None else numa[0]))
    return sorted(result, key=repr)


def checkpoint_entries(kubelet: KubeletRunner, uid: str, container_name: str) -> list[Entry]:
    """What the checkpoint records for the container, one entry per (device, NUMA node)."""
    result = []
    for record in read_checkpoint(kubelet.config.checkpoint_path).for_container(uid, container_name):
        for numa, ids in record.device_ids.items():
            result.extend((record.resource_name, (i,), None if numa == NO_TOPOLOGY else numa) for i in ids)
    return sorted(result, key=repr)


def by_name(response: Any) -> dict[tuple[str, str], Any]:
    return {(p.namespace, p.name): p for p in response.pod_resources}


# Takes all six devices: the sidecar reuses the init container's two, main takes the four others.
SIDECAR_POD = (
    [container("main", limits={RES: "4"}), container("nogpu")],
    [container("init", limits={RES: "2"}), container("side", limits={RES: "2"}, restart_policy="Always")],
)


def test_list_reports_the_checkpointed_devices_of_sidecars_and_app_containers_but_not_plain_inits(
    kubelet: KubeletRunner, plugin: FakePlugin, core_v1: Any
) -> None:
    uid = create_and_bind(core_v1, "p", NODE, SIDECAR_POD[0], init=SIDECAR_POD[1])
    assert kubelet.wait_for_pod(NS, "p").admitted
    with lister(kubelet.config.pod_resources_socket) as stub:
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT)
    (pod,) = response.pod_resources
    assert (pod.namespace, pod.name) == (NS, "p")
    assert [c.name for c in pod.containers] == ["side", "main", "nogpu"]
    for listed in pod.containers:
        assert entries(listed.devices) == checkpoint_entries(kubelet, uid, listed.name), listed.name
        assert (list(listed.cpu_ids), list(listed.memory), list(listed.dynamic_resources)) == ([], [], [])
    ids = {c.name: {d.device_ids[0] for d in c.devices} for c in pod.containers}
    assert (len(ids["side"]), len(ids["main"]), ids["nogpu"]) == (2, 4, set())
    assert ids["side"] | ids["main"] == set("abcdef")
    # The plain init container held devices (the checkpoint says so) but kubelet does not list it.
    assert {i for _, (i,), _ in checkpoint_entries(kubelet, uid, "init")} == ids["side"]
    # One entry per (device, NUMA node): c sits on two, d, e and f report none.
    every = sorted((e for c in pod.containers for e in entries(c.devices)), key=repr)
    assert [e for e in every if e[1] in {("a",), ("c",), ("d",)}] == [
        (RES, ("a",), 0),
        (RES, ("c",), 0),
        (RES, ("c",), 1),
        (RES, ("d",), None),
    ]
    assert (list(pod.cpu_ids), list(pod.memory)) == ([], [])


def test_get_answers_one_pod_as_list_does(kubelet: KubeletRunner, plugin: FakePlugin, core_v1: Any) -> None:
    create_and_bind(core_v1, "p", NODE, SIDECAR_POD[0], init=SIDECAR_POD[1])
    create_and_bind(core_v1, "q", NODE, [container("main")])
    assert kubelet.wait_for_pod(NS, "p").admitted and kubelet.wait_for_pod(NS, "q").admitted
    with lister(kubelet.config.pod_resources_socket) as stub:
        listed = by_name(stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT))
        got = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="p", pod_namespace=NS), timeout=TIMEOUT)
    assert set(listed) == {(NS, "p"), (NS, "q")}
    one = got.pod_resources
    assert (one.namespace, one.name) == (NS, "p")
    assert [(c.name, entries(c.devices)) for c in one.containers] == [
        (c.name, entries(c.devices)) for c in listed[(NS, "p")].containers
    ]


def test_get_of_an_unknown_pod_fails_with_kubelets_error(kubelet: KubeletRunner) -> None:
    with lister(kubelet.config.pod_resources_socket) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.Get(api_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="ns1"), timeout=TIMEOUT)
    error: Any = raised.value
    assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN, "pod nope in namespace ns1 not found")


def test_list_leaves_out_rejected_and_deleted_pods_and_get_still_finds_the_rejected_one(
    kubelet: KubeletRunner, plugin: FakePlugin, core_v1: Any
) -> None:
    create_and_bind(core_v1, "keep", NODE, [container("main", limits={RES: "2"})])
    create_and_bind(core_v1, "gone", NODE, [container("main", limits={RES: "1"})])
    create_and_bind(core_v1, "greedy", NODE, [container("main", limits={RES: "9"})])
    assert kubelet.wait_for_pod(NS, "keep").admitted and kubelet.wait_for_pod(NS, "gone").admitted
    assert not kubelet.wait_for_pod(NS, "greedy").admitted
    core_v1.delete_namespaced_pod("gone", NS)
    kubelet.wait_for_devices(lambda s: len(s.allocated.get(RES, ())) == 2)
    with lister(kubelet.config.pod_resources_socket) as stub:
        assert set(by_name(stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT))) == {(NS, "keep")}
        # Kubelet's pod manager still knows the rejected (Failed) pod; it holds nothing.
        greedy = stub.Get(
            api_pb2.GetPodResourcesRequest(pod_name="greedy", pod_namespace=NS), timeout=TIMEOUT
        )
        assert [(c.name, list(c.devices)) for c in greedy.pod_resources.containers] == [("main", [])]
        with pytest.raises(grpc.RpcError) as raised:
            stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace=NS), timeout=TIMEOUT)
    assert raised.value.code() == grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]


def test_allocatable_resources_are_the_healthy_devices_with_their_numa_nodes(
    kubelet: KubeletRunner, plugin: FakePlugin, core_v1: Any
) -> None:
    both = dp.Device(ID="c", health="Healthy")
    both.topology.nodes.extend([dp.NUMANode(ID=0), dp.NUMANode(ID=1)])
    plugin.set_devices([*devices("a", "b", numa={"a": 0, "b": 1}), both, *devices("d", "e", unhealthy=["e"])])
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 4)
    create_and_bind(core_v1, "p", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "p").admitted
    with lister(kubelet.config.pod_resources_socket) as stub:
        response = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=TIMEOUT)
        # Devices held by pods stay allocatable (it is the node's capacity, not what is free); the
        # unhealthy e is left out.
        assert entries(response.devices) == sorted(
            [(RES, ("a",), 0), (RES, ("b",), 1), (RES, ("c",), 0), (RES, ("c",), 1), (RES, ("d",), None)],
            key=repr,
        )
        assert (list(response.cpu_ids), list(response.memory)) == ([], [])
        plugin.stop()
        kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 0)
        after = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=TIMEOUT)
    assert list(after.devices) == []


def test_socket_is_made_in_pod_resources_remade_on_restart_and_removed_on_stop(
    apiserver: ApiServerHandle, short_dir: Path, core_v1: Any
) -> None:
    config = KubeletConfig(NODE, short_dir / "dp", kubeconfig=apiserver.kubeconfig, create_node=True)
    path = config.pod_resources_socket
    assert path == short_dir / "dp/pod-resources/kubelet.sock"
    # The node host sizes kubelet directories by the longest socket under them: a DRA plugin's now.
    assert len(str(path)) < len(str(config.directory / KUBELET_LONGEST_SOCKET))
    with KubeletRunner(config) as kubelet:
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
        assert [p.name for p in path.parent.iterdir()] == ["kubelet.sock"]  # the temporary name is gone
        fake = FakePlugin(config.directory, initial=devices("a", "b"))
        fake.serve()
        try:
            fake.register(RES)
            kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 2)
            uid = create_and_bind(core_v1, "p", NODE, [container("main", limits={RES: "1"})])
            assert kubelet.wait_for_pod(NS, "p").admitted
            before = bound_name(path)
            kubelet.restart()
            assert stat.S_ISSOCK(path.lstat().st_mode)
            after = bound_name(path)  # a new listener, not the old one kept
            assert before != after and {before[:14], after[:14]} == {".kubelet.sock."}
            # The pod keeps the devices the checkpoint recorded, before its plugin is back.
            with lister(path) as stub:
                (pod,) = stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT).pod_resources
            assert entries(pod.containers[0].devices) == checkpoint_entries(kubelet, uid, "main")
        finally:
            fake.stop()
    assert not path.exists()
    assert [p.name for p in path.parent.iterdir()] == []


def test_a_stale_file_at_the_socket_path_is_replaced_at_start(short_dir: Path) -> None:
    """Kubelet's CreateListener unlinks whatever a kubelet that died left at the path."""
    config = KubeletConfig(NODE, short_dir / "dp")
    config.pod_resources_socket.parent.mkdir(parents=True)
    config.pod_resources_socket.write_text("stale")
    with KubeletRunner(config), lister(config.pod_resources_socket) as stub:
        assert list(stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT).pod_resources) == []


def test_calls_over_the_rate_limit_are_refused_with_kubelets_error(short_dir: Path) -> None:
    """Kubelet's limiter (100 per second, bursts of 10) with a clock that stands still: after the burst
    every call is refused before it runs."""

    async def scenario() -> tuple[int, grpc.StatusCode, str]:
        manager = DeviceManager(KubeletConfig(NODE, short_dir / "dp"))
        await manager.start()
        server = PodResourcesServer(
            short_dir / "pr" / "kubelet.sock", manager, None, seed=1, clock=lambda: 0.0
        )
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                served = 0
                for _ in range(10):
                    await stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT)
                    served += 1
                try:
                    await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=TIMEOUT)
                except grpc.aio.AioRpcError as exc:
                    return served, exc.code(), str(exc.details())
                raise AssertionError("the 11th call in a burst was served")
        finally:
            await server.stop()
            await manager.stop()

    served, code, details = asyncio.run(scenario())
    assert (served, code, details) == (10, grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")


def test_list_on_a_device_manager_without_pods_is_empty_and_frees_nothing(short_dir: Path) -> None:
    """Without pod sources (no kubeconfig) kubelet's UpdateAllocatedDevices waits for sources to be
    ready; List frees nothing and lists no pod."""
    config = KubeletConfig(NODE, short_dir / "dp")
    with KubeletRunner(config) as kubelet:
        fake = FakePlugin(config.directory, initial=devices("a"))
        fake.serve()
        try:
            fake.register(RES)
            kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 1)
            manager = kubelet.kubelet.device_manager

            async def allocate() -> None:
                await manager.allocate("uid-1", "main", {RES: 1})

            kubelet.run(allocate)
            with lister(config.pod_resources_socket) as stub:
                assert list(stub.List(api_pb2.ListPodResourcesRequest(), timeout=TIMEOUT).pod_resources) == []
            assert kubelet.snapshot().allocated[RES] == {"a"}
        finally:
            fake.stop()
