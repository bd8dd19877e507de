"""Kubelet stand-in with the API server: Node capacity, pod admission (Allocate per container, init
reuse, GetPreferredAllocation, PreStartContainer), failures with kubelet's reason and message, the
checkpoint, and a restart that keeps running pods' devices."""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from hami_node.durable import write_atomic
from hami_node.plugin.api import api_pb2
from hami_sim.kubelet import CheckpointError, KubeletConfig, KubeletRunner, Snapshot, read_checkpoint
from hami_sim.kubelet import checkpoint as checkpoint_module
from hami_sim.kubelet import runtime as runtime_module
from hami_sim.kubelet.checkpoint import encode_checkpoint
from hami_sim.kubelet.pods import RUN_SECONDS, run_seconds
from hami_sim.kubelet.runtime import read_containers
from tests.apiserver_util import bind, create_and_bind, http
from tests.builders import container, node, pod
from tests.conftest import ApiServerHandle
from tests.integration.kubelet_plugin import TIMEOUT, FakePlugin, devices
from tests.waiting import wait_for, wait_node

RES = "example.com/dev"
NODE = "node-1"
NS = "default"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(apiserver: ApiServerHandle, short_dir: Path) -> Iterator[KubeletRunner]:
    config = KubeletConfig(
        NODE, short_dir / "dp", kubeconfig=apiserver.kubeconfig, create_node=True, status_sync_period=0.5
    )
    with KubeletRunner(config) as runner:
        yield runner


@pytest.fixture
def make_plugin(short_dir: Path, kubelet: KubeletRunner) -> Iterator[Callable[..., FakePlugin]]:
    plugins: list[FakePlugin] = []

    def make(*ids: str, **options: Any) -> FakePlugin:
        plugin = FakePlugin(kubelet.config.directory, initial=devices(*ids), **options)
        plugin.serve()
        plugins.append(plugin)
        plugin.register(RES)
        count = len(ids)
        kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.capacity == count)
        return plugin

    yield make
    for plugin in plugins:
        plugin.stop()


def allocated(snapshot: Snapshot) -> frozenset[str]:
    return snapshot.allocated.get(RES, frozenset())


def test_node_is_created_and_reports_capacity_and_allocatable(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    node = core_v1.read_node(NODE)
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
    assert node.status.capacity["cpu"] == "8"
    plugin = make_plugin("a", "b", "c", "d")
    plugin.set_devices(devices("a", "b", "c", "d", unhealthy=["d"]))
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 3)
    wait_node(core_v1, NODE, lambda n: n.status.allocatable.get(RES) == "3")
    status = core_v1.read_node(NODE).status
    assert (status.capacity[RES], status.allocatable[RES]) == ("4", "3")
    plugin.stop()
    wait_node(core_v1, NODE, lambda n: n.status.allocatable.get(RES) == "0")
    assert core_v1.read_node(NODE).status.capacity[RES] == "4"


def test_single_container_pod_gets_devices_and_runs(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c")
    uid = create_and_bind(core_v1, "p", NODE, [container("main", limits={RES: "2"})])
    result = kubelet.wait_for_pod(NS, "p")
    assert result.admitted and result.uid == uid
    # Without GetPreferredAllocation kubelet takes free devices in Go map order: any two.
    ((ids,),) = plugin.calls.allocate
    assert len(set(ids)) == 2 and set(ids) <= {"a", "b", "c"}
    pod = core_v1.read_namespaced_pod("p", NS)
    assert pod.status.phase == "Running"
    assert [(s.name, s.ready, s.state.running is not None) for s in pod.status.container_statuses] == [
        ("main", True, True)
    ]
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    entries = read_checkpoint(kubelet.config.checkpoint_path).for_container(uid, "main")
    assert [(e.resource_name, dict(e.device_ids)) for e in entries] == [(RES, {-1: tuple(ids)})]
    assert dict(entries[0].response.envs) == {"FAKE_DEVICES": ",".join(ids), "FAKE_COUNT": "2"}
    assert allocated(kubelet.snapshot()) == set(ids)


def test_pod_without_device_requests_just_runs(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a")
    create_and_bind(core_v1, "plain", NODE, [container("main", limits={"cpu": "100m"})])
    assert kubelet.wait_for_pod(NS, "plain").admitted
    assert plugin.calls.allocate == []
    assert core_v1.read_namespaced_pod("plain", NS).status.phase == "Running"


def test_init_container_devices_are_reused_by_app_containers(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c", "d")
    uid = create_and_bind(
        core_v1,
        "multi",
        NODE,
        [container("c1", limits={RES: "1"}), container("c2", limits={RES: "2"}), container("nogpu")],
        init=[container("init", limits={RES: "2"})],
    )
    assert kubelet.wait_for_pod(NS, "multi").admitted
    # One Allocate RPC per container, one ContainerAllocateRequest each, init first.
    (init,), (c1,), (c2,) = plugin.calls.allocate
    # c1 takes one of the init's two devices (Go map order: either); c2 takes the other one, which is
    # still in the pod's reuse pool, and one new device.
    assert len(set(init)) == 2 and len(c1) == 1 and set(c1) < set(init)
    assert len(set(c2)) == 2 and set(init) - set(c1) < set(c2) and not set(c2) & set(c1)
    checkpoint = read_checkpoint(kubelet.config.checkpoint_path)
    held = {e.container_name: set(e.all_device_ids) for e in checkpoint.entries if e.pod_uid == uid}
    assert held == {"init": set(init), "c1": set(c1), "c2": set(c2)}
    assert checkpoint.container_envs(uid, "c2")["FAKE_DEVICES"] == ",".join(c2)
    # The container runtime's record (containers.json, also where DRA containers' CDI edits land) holds
    # the same device env for every container.
    containers = kubelet.containers()
    for name in ("init", "c1", "c2", "nogpu"):
        assert containers.env(uid, name) == checkpoint.container_envs(uid, name), name
    assert allocated(kubelet.snapshot()) == set(init) | set(c2)
    pod = core_v1.read_namespaced_pod("multi", NS)
    assert [s.state.terminated.reason for s in pod.status.init_container_statuses] == ["Completed"]
    assert sorted(s.name for s in pod.status.container_statuses) == ["c1", "c2", "nogpu"]


def test_restartable_init_container_keeps_its_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c")
    create_and_bind(
        core_v1,
        "sidecar",
        NODE,
        [container("main", limits={RES: "1"})],
        init=[container("side", limits={RES: "1"}, restart_policy="Always")],
    )
    assert kubelet.wait_for_pod(NS, "sidecar").admitted
    (side,), (main,) = plugin.calls.allocate
    assert len(side) == len(main) == 1 and side != main  # the sidecar's device is not reused


def test_preferred_allocation_is_asked_and_intersected(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c", "d", preferred=True)
    plugin.prefer = lambda avail, must, size: ["d", "c"]
    create_and_bind(core_v1, "pref", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "pref").admitted
    ((available, must, size),) = plugin.calls.preferred
    assert (sorted(available), must, size) == (["a", "b", "c", "d"], [], 2)
    assert [sorted(ids) for (ids,) in plugin.calls.allocate] == [["c", "d"]]
    # An answer naming unknown or busy devices is intersected with the free ones; kubelet fills the rest.
    plugin.prefer = lambda avail, must, size: ["ghost", "c", "b"]
    create_and_bind(core_v1, "pref2", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "pref2").admitted
    available, must, size = plugin.calls.preferred[1]
    assert (sorted(available), must, size) == (["a", "b"], [], 2)
    assert sorted(plugin.calls.allocate[1][0]) == ["a", "b"]


def test_preferred_allocation_with_init_reuse_passes_must_include(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c", "d", preferred=True)
    plugin.prefer = lambda avail, must, size: [*must, *sorted(set(avail) - set(must), reverse=True)][:size]
    create_and_bind(
        core_v1,
        "reuse",
        NODE,
        [container("main", limits={RES: "2"})],
        init=[container("init", limits={RES: "1"})],
    )
    assert kubelet.wait_for_pod(NS, "reuse").admitted
    # init: free choice (d); main: d reused, then the plugin is asked with d as must-include.
    assert [(sorted(a), m, n) for a, m, n in plugin.calls.preferred] == [
        (["a", "b", "c", "d"], [], 1),
        (["a", "b", "c", "d"], ["d"], 2),
    ]
    assert [sorted(ids) for (ids,) in plugin.calls.allocate] == [["d"], ["c", "d"]]


def test_allocate_error_fails_the_pod_with_kubelets_message_and_an_event(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b")
    plugin.allocate_error = "no pending pod asks for 1 device"
    create_and_bind(core_v1, "bad", NODE, [container("main", limits={RES: "1"})])
    result = kubelet.wait_for_pod(NS, "bad")
    expected = (
        "Allocate failed due to rpc error: code = Unknown desc = no pending pod asks for 1 device, "
        "which is unexpected"
    )
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    pod = core_v1.read_namespaced_pod("bad", NS)
    assert (pod.status.phase, pod.status.reason, pod.status.message) == (
        "Failed",
        "UnexpectedAdmissionError",
        "Pod was rejected: " + expected,
    )
    # Kubelet's event recorder writes on its own, after the status.
    events = wait_for(
        lambda: core_v1.list_namespaced_event(NS, field_selector="involvedObject.name=bad").items,
        what="the pod's Event",
    )
    assert [(e.type, e.reason, e.message, e.source.component) for e in events] == [
        ("Warning", "UnexpectedAdmissionError", expected, "kubelet")
    ]
    assert allocated(kubelet.snapshot()) == frozenset()


def test_a_plugin_gone_during_allocate_fails_that_pod_and_admission_goes_on(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    """Kubelet closes a plugin's connection when its ListAndWatch ends: the Allocate in flight fails
    with Canceled and that pod is rejected; the node goes on admitting pods once the plugin is back.
    (grpc-python cancels such a call, which used to end the node's admission loop without a word.)"""
    plugin = make_plugin("a", "b")
    gate = threading.Event()
    plugin.allocate_gate = gate
    create_and_bind(core_v1, "caught", NODE, [container("main", limits={RES: "1"})])
    try:
        assert plugin.allocate_entered.wait(TIMEOUT), "Allocate was not called"
        plugin.end_streams()
        result = kubelet.wait_for_pod(NS, "caught")
    finally:
        gate.set()
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert result.message == (
        "Pod was rejected: Allocate failed due to rpc error: code = Canceled desc = grpc: the client "
        "connection is closing, which is unexpected"
    )
    plugin.allocate_gate = None
    plugin.register(RES)
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 2)
    create_and_bind(core_v1, "after", NODE, [container("main", limits={RES: "1"})])
    assert kubelet.wait_for_pod(NS, "after").admitted


def test_an_unforeseen_admission_failure_rejects_that_pod_only(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    """A bug on one pod's admission path rejects that pod with the error and the node goes on."""
    make_plugin("a", "b")
    manager = kubelet.kubelet.device_manager
    real = manager.pre_start_container
    calls = 0

    async def failing_once(pod_uid: str, container: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        await real(pod_uid, container)

    manager.pre_start_container = failing_once  # type: ignore[method-assign]
    create_and_bind(core_v1, "unlucky", NODE, [container("main", limits={RES: "1"})])
    result = kubelet.wait_for_pod(NS, "unlucky")
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert "RuntimeError: boom" in result.message
    create_and_bind(core_v1, "next", NODE, [container("main", limits={RES: "1"})])
    assert kubelet.wait_for_pod(NS, "next").admitted
    assert len(allocated(kubelet.snapshot())) == 1  # the rejected pod's device was freed


def test_empty_allocate_response_is_an_error(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a")
    plugin.empty_allocate = True
    create_and_bind(core_v1, "empty", NODE, [container("main", limits={RES: "1"})])
    result = kubelet.wait_for_pod(NS, "empty")
    assert not result.admitted
    assert "no containers return in allocation response" in result.message


def test_not_enough_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    make_plugin("a", "b", "c")
    create_and_bind(core_v1, "first", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "first").admitted
    create_and_bind(core_v1, "second", NODE, [container("main", limits={RES: "2"})])
    result = kubelet.wait_for_pod(NS, "second")
    assert result.message == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        "example.com/dev. Requested: 2, Available: 1, which is unexpected"
    )
    assert core_v1.read_namespaced_pod("second", NS).status.phase == "Failed"


def test_no_healthy_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b")
    plugin.set_devices(devices("a", "b", unhealthy=["a", "b"]))
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 0)
    create_and_bind(core_v1, "sick", NODE, [container("main", limits={RES: "1"})])
    assert kubelet.wait_for_pod(NS, "sick").message == (
        "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy "
        "devices example.com/dev, which is unexpected"
    )


def test_extended_resource_the_node_does_not_list_is_ignored_like_kubelet(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    """Kubelet drops extended resources missing from the Node's allocatable before its resource fit
    (`removeMissingExtendedResources`): HAMi's gpumem/gpucores pods depend on it."""
    make_plugin("a")
    extended: dict[str, Any] = {"other.example.com/thing": "1"}
    create_and_bind(core_v1, "other", NODE, [container("main", limits=extended)])
    assert kubelet.wait_for_pod(NS, "other").admitted


def test_extended_resource_the_node_lists_too_little_of_is_rejected_like_kubelet(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    make_plugin("a")
    core_v1.patch_node_status(NODE, {"status": {"allocatable": {"other.example.com/thing": "0"}}})
    extended: dict[str, Any] = {"other.example.com/thing": "1"}
    create_and_bind(core_v1, "other", NODE, [container("main", limits=extended)])
    result = kubelet.wait_for_pod(NS, "other")
    assert (result.admitted, result.reason) == (False, "OutOfother.example.com/thing")
    assert result.message == (
        "Pod was rejected: Node didn't have enough resource: other.example.com/thing, requested: 1, "
        "used: 0, capacity: 0"
    )


def test_deleted_pod_frees_its_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    make_plugin("a", "b")
    create_and_bind(core_v1, "holder", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "holder").admitted
    core_v1.delete_namespaced_pod("holder", NS)
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())
    create_and_bind(core_v1, "next", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "next").admitted


def test_on_disk_a_container_never_shows_without_the_devices_kubelet_recorded_for_it(
    kubelet: KubeletRunner,
    make_plugin: Callable[..., FakePlugin],
    core_v1: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 31's `container-gpu-mismatch`: after every write of the checkpoint or of containers.json,
    every container the runtime records has its devices in the checkpoint, as a pod starts, ends by
    itself and is deleted (the stand-in freed the devices before it stopped the containers)."""
    config = kubelet.config
    broken: list[str] = []

    def check_after(write: Callable[..., Path]) -> Callable[..., Path]:
        def written(path: Any, data: Any, **kwargs: Any) -> Path:
            target = write(path, data, **kwargs)
            entries = (
                read_checkpoint(config.checkpoint_path).entries if config.checkpoint_path.exists() else []
            )
            recorded = {(e.pod_uid, e.container_name) for e in entries}
            for record in read_containers(config.containers_path).records:
                if (record.pod_uid, record.container) not in recorded:
                    broken.append(f"after writing {Path(path).name}: {record.pod}/{record.container}")
            return target

        return written

    monkeypatch.setattr(runtime_module, "write_atomic", check_after(write_atomic))
    monkeypatch.setattr(checkpoint_module, "write_atomic", check_after(write_atomic))
    make_plugin("a", "b")
    run_pod(core_v1, "batch", "0.2", "Never")
    assert kubelet.wait_for_pod(NS, "batch").admitted
    wait_for(lambda: core_v1.read_namespaced_pod("batch", NS).status.phase == "Succeeded", 10, "batch ends")
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())
    create_and_bind(core_v1, "holder", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "holder").admitted
    core_v1.delete_namespaced_pod("holder", NS)
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())
    wait_for(lambda: not read_containers(config.containers_path).records, 10, "no container left")
    assert broken == []


def _gone(core_v1: Any, name: str) -> bool:
    try:
        core_v1.read_namespaced_pod(name, NS)
    except ApiException as err:
        return bool(err.status == 404)
    return False


def test_a_deleted_pod_is_stopped_then_deleted_by_its_kubelet(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    """Graceful deletion: the API server only marks the pod (grace 30 s); the stand-in stops it (devices
    freed, runtime record gone) and deletes it with grace 0, well before the 30 s."""
    make_plugin("a", "b")
    create_and_bind(core_v1, "holder", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "holder").admitted
    marked = core_v1.delete_namespaced_pod("holder", NS)
    assert marked.metadata.deletion_grace_period_seconds == 30
    wait_for(lambda: _gone(core_v1, "holder"), what="the kubelet deleted the pod")
    assert allocated(kubelet.snapshot()) == frozenset()
    assert kubelet.containers().records == ()


def test_a_pod_deleted_while_its_kubelet_is_down_stays_terminating_until_the_kubelet_is_back(
    kubelet: KubeletRunner, core_v1: Any
) -> None:
    create_and_bind(core_v1, "plain", NODE, [container("main")])
    assert kubelet.wait_for_pod(NS, "plain").admitted
    kubelet.stop()
    core_v1.delete_namespaced_pod("plain", NS)
    create_and_bind(core_v1, "never", NODE, [container("main")])
    core_v1.delete_namespaced_pod("never", NS)  # bound, not admitted yet: never admitted
    for name in ("plain", "never"):
        assert core_v1.read_namespaced_pod(name, NS).metadata.deletion_timestamp is not None
    kubelet.start()
    wait_for(
        lambda: _gone(core_v1, "plain") and _gone(core_v1, "never"),
        what="the kubelet, back, deleted its Terminating pods",
    )
    assert kubelet.containers().records == ()
    assert kubelet.kubelet.pods is not None and kubelet.kubelet.pods.result(NS, "never") is None


def test_a_pod_deleted_during_its_allocate_is_not_started_and_frees_its_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    """A pod deleted while its Allocate is in flight: once Allocate answers, the stand-in does not start
    it (no record in containers.json, no Running status) and frees its devices, as kubelet's pod worker
    does. (Found by `hami-sim chaos`: the runtime kept the gone pod's containers recorded for good.)"""
    plugin = make_plugin("a", "b")
    gate = threading.Event()
    plugin.allocate_gate = gate
    create_and_bind(core_v1, "racer", NODE, [container("main", limits={RES: "2"})])
    admitter = kubelet.kubelet.pods
    assert admitter is not None
    try:
        assert plugin.allocate_entered.wait(TIMEOUT), "Allocate was not called"
        core_v1.delete_namespaced_pod("racer", NS)  # graceful: kubelet deletes it once stopped

        def marked() -> bool:
            seen = admitter.pod_by_name(NS, "racer")
            return seen is not None and bool(seen["metadata"].get("deletionTimestamp"))

        wait_for(marked, what="the stand-in saw the deletion")
        # The pod worker is still in the pod's Allocate: the pod stays on the API server meanwhile.
        assert core_v1.read_namespaced_pod("racer", NS).metadata.deletion_timestamp is not None
    finally:
        gate.set()
    plugin.allocate_gate = None
    wait_for(lambda: admitter.pod_by_name(NS, "racer") is None, what="the stand-in deleted the pod")
    create_and_bind(core_v1, "next", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "next").admitted  # both devices were freed
    assert {(r.pod, r.container) for r in kubelet.containers().records} == {("next", "main")}
    assert kubelet.wait_for_devices(lambda s: len(allocated(s)) == 2)


def test_pre_start_container_is_called_with_the_containers_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c", pre_start=True)
    create_and_bind(
        core_v1, "ps", NODE, [container("c1", limits={RES: "1"}), container("c2", limits={RES: "2"})]
    )
    assert kubelet.wait_for_pod(NS, "ps").admitted
    (c1,), (c2,) = plugin.calls.allocate
    assert [sorted(ids) for ids in plugin.calls.pre_start] == [sorted(c1), sorted(c2)]
    plugin.pre_start_error = "not ready"
    core_v1.delete_namespaced_pod("ps", NS)
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())
    create_and_bind(core_v1, "ps2", NODE, [container("main", limits={RES: "1"})])
    result = kubelet.wait_for_pod(NS, "ps2")
    assert (result.admitted, result.reason) == (False, "CreateContainerConfigError")
    pod = core_v1.read_namespaced_pod("ps2", NS)
    assert pod.status.phase == "Pending"
    waiting = pod.status.container_statuses[0].state.waiting
    assert (waiting.reason, waiting.message) == (
        "CreateContainerConfigError",
        "device plugin PreStartContainer rpc failed with err: rpc error: code = Unknown desc = not ready",
    )


def test_checkpoint_holds_the_allocate_responses(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b")
    plugin.set_devices([*devices("a", "b", numa={"a": 0, "b": 1}), api_pb2.Device(ID="c", health="Healthy")])
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.capacity == 3)
    uid = create_and_bind(core_v1, "cp", NODE, [container("main", limits={RES: "3"})])
    assert kubelet.wait_for_pod(NS, "cp").admitted
    path = kubelet.config.checkpoint_path
    checkpoint = read_checkpoint(path)
    assert checkpoint.registered_devices == {RES: ("a", "b", "c")}
    (entry,) = checkpoint.entries
    assert (entry.pod_uid, entry.container_name, entry.resource_name) == (uid, "main", RES)
    assert dict(entry.device_ids) == {0: ("a",), 1: ("b",), -1: ("c",)}
    response = entry.response
    ((sent,),) = plugin.calls.allocate
    assert dict(response.envs) == {"FAKE_DEVICES": ",".join(sent), "FAKE_COUNT": "3"}
    assert [(m.container_path, m.host_path, m.read_only) for m in response.mounts] == [
        ("/fake", "/opt/fake", True)
    ]
    assert [d.container_path for d in response.devices] == ["/dev/fake0"]
    assert dict(response.annotations) == {"fake.example.com/ids": ",".join(sent)}
    raw = path.read_bytes()
    assert raw.startswith(b'{"Data":{"PodDeviceEntries":[{"PodUID":"')
    assert encode_checkpoint(checkpoint.entries, checkpoint.registered_devices) == raw
    path.write_bytes(raw.replace(b'"main"', b'"evil"'))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        read_checkpoint(path)
    assert read_checkpoint(path, verify=False).entries[0].container_name == "evil"


def test_restart_keeps_running_pods_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    plugin = make_plugin("a", "b", "c")
    uid = create_and_bind(core_v1, "keeper", NODE, [container("main", limits={RES: "2"})])
    assert kubelet.wait_for_pod(NS, "keeper").admitted
    ((kept,),) = plugin.calls.allocate
    kubelet.restart()
    snapshot = kubelet.snapshot()
    assert allocated(snapshot) == set(kept)
    assert snapshot.resources[RES].capacity == 0
    wait_node(core_v1, NODE, lambda n: n.status.capacity.get(RES) == "0")
    # Before the plugin is back, a new pod is refused as kubelet refuses it after a reboot.
    create_and_bind(core_v1, "early", NODE, [container("main", limits={RES: "1"})])
    assert "no healthy devices present" in kubelet.wait_for_pod(NS, "early").message
    plugin.stop()
    plugin.serve()
    plugin.register(RES)
    kubelet.wait_for_devices(lambda s: (r := s.resource(RES)) is not None and r.allocatable == 3)
    create_and_bind(core_v1, "late", NODE, [container("main", limits={RES: "1"})])
    assert kubelet.wait_for_pod(NS, "late").admitted
    assert plugin.calls.allocate[-1] == [sorted({"a", "b", "c"} - set(kept))]
    entry = read_checkpoint(kubelet.config.checkpoint_path).for_container(uid, "main")[0]
    assert set(entry.all_device_ids) == set(kept)
    assert core_v1.read_namespaced_pod("keeper", NS).status.phase == "Running"


def test_pods_bound_before_the_kubelet_starts_are_admitted(
    apiserver: ApiServerHandle, short_dir: Path, core_v1: Any
) -> None:
    core_v1.create_node(node(NODE))
    create_and_bind(core_v1, "early-bird", NODE, [container("main")])
    config = KubeletConfig(NODE, short_dir / "dp", kubeconfig=apiserver.kubeconfig)
    with KubeletRunner(config) as runner:
        assert runner.wait_for_pod(NS, "early-bird").admitted


# --- containers that finish: sim.hami.io/run-seconds ------------------------------------------------


def run_pod(core_v1: Any, name: str, run_seconds: str, restart_policy: str, limit: str = "2") -> str:
    body = pod(
        name,
        container("main", limits={RES: limit}),
        annotations={RUN_SECONDS: run_seconds},
        restartPolicy=restart_policy,
    )
    uid = str(core_v1.create_namespaced_pod(NS, body).metadata.uid)
    assert bind(core_v1, NS, name, NODE).get("status") == "Success"
    return uid


@pytest.mark.parametrize("policy", ["Never", "OnFailure"])
def test_run_seconds_ends_a_never_restarted_pod_succeeded_and_frees_its_devices(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any, policy: str
) -> None:
    make_plugin("a", "b")
    uid = run_pod(core_v1, "batch", "0.3", policy)
    assert kubelet.wait_for_pod(NS, "batch").admitted
    done = wait_for(
        lambda: (p := core_v1.read_namespaced_pod("batch", NS)).status.phase == "Succeeded" and p,
        10,
        "the pod to succeed",
    )
    (status,) = done.status.container_statuses
    terminated = status.state.terminated
    assert (terminated.exit_code, terminated.reason, status.ready) == (0, "Completed", False)
    assert {c.type: c.reason for c in done.status.conditions}["Ready"] == "PodCompleted"
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())
    assert read_checkpoint(kubelet.config.checkpoint_path).for_container(uid, "main") == []
    run_pod(core_v1, "next", "60", "Never")
    assert kubelet.wait_for_pod(NS, "next").admitted


def test_a_status_the_api_server_refuses_is_written_again_until_it_takes_it(
    apiserver: ApiServerHandle,
    kubelet: KubeletRunner,
    make_plugin: Callable[..., FakePlugin],
    core_v1: Any,
) -> None:
    """Issue 31: the pod's Succeeded status met a 409 window five times and the stand-in gave up, so the
    pod stayed Running in the API for good (holding its devices there) while its kubelet had let it go;
    kubelet's status manager keeps the status and writes it again on its sync period."""
    make_plugin("a", "b")
    run_pod(core_v1, "ends", "1", "Never")
    assert kubelet.wait_for_pod(NS, "ends").admitted
    conflict = {"name": "status", "fault": "conflict", "probability": 1.0, "verbs": ["patch"]}
    status, answer = http(apiserver.base_url, "PUT", "/hami-sim/faults", {"seed": 1, "rules": [conflict]})
    assert status == 200, answer
    kubelet.wait_for_devices(lambda s: allocated(s) == frozenset())  # ended and let go by its kubelet
    assert core_v1.read_namespaced_pod("ends", NS).status.phase == "Running"
    status, answer = http(apiserver.base_url, "DELETE", "/hami-sim/faults")
    assert status == 200, answer
    wait_for(lambda: core_v1.read_namespaced_pod("ends", NS).status.phase == "Succeeded", 10, "Succeeded")


def test_run_seconds_restarts_an_always_pods_containers_in_place(
    kubelet: KubeletRunner, make_plugin: Callable[..., FakePlugin], core_v1: Any
) -> None:
    make_plugin("a", "b")
    run_pod(core_v1, "server", "0", "Always")
    assert kubelet.wait_for_pod(NS, "server").admitted

    def restarted_twice() -> Any:
        p = core_v1.read_namespaced_pod("server", NS)
        statuses = p.status.container_statuses or []
        return statuses and statuses[0].restart_count >= 2 and p

    running = wait_for(restarted_twice, 10, "two restarts (at most one a second)")
    (status,) = running.status.container_statuses
    assert running.status.phase == "Running" and status.state.running is not None
    assert (status.last_state.terminated.exit_code, status.last_state.terminated.reason) == (0, "Completed")
    assert allocated(kubelet.snapshot()) == {"a", "b"}


def test_a_bad_run_seconds_is_a_warning_and_the_pod_runs_on(
    kubelet: KubeletRunner,
    make_plugin: Callable[..., FakePlugin],
    core_v1: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_plugin("a")
    run_pod(core_v1, "odd", "soon", "Never", limit="1")
    assert kubelet.wait_for_pod(NS, "odd").admitted

    def warned() -> bool:
        return any(RUN_SECONDS in r.getMessage() and "'soon'" in r.getMessage() for r in caplog.records)

    wait_for(warned, 5, "the warning")
    assert core_v1.read_namespaced_pod("odd", NS).status.phase == "Running"


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("0", 0.0), ("2.5", 2.5), ("-1", ValueError), ("nan", ValueError),
                            ("inf", ValueError), ("", ValueError)]
)  # fmt: skip
def test_run_seconds_accepts_only_finite_non_negative_numbers(value: str | None, expected: Any) -> None:
    annotations = {} if value is None else {RUN_SECONDS: value}
    body = {"metadata": {"annotations": annotations}}
    if expected is ValueError:
        with pytest.raises(ValueError, match=re.escape(RUN_SECONDS)):
            run_seconds(body)
    else:
        assert run_seconds(body) == expected
