"""The node daemon's Kubernetes side against the in-memory API server, through the official client:
the pod watch feeding the tracker, the bind-phase patch, the node lock, the inventory annotation, and
what happens when the API server drops streams, forgets history or goes away."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_kube.backoff import RetryPolicy
from hami_kube.blocking import ThreadedReflector
from hami_kube.config import SERVICE_ACCOUNT_DIR
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_node.kubeapi import NodeApi, watch_node_pods
from hami_node.pods import PodTracker
from hami_node.reporter import NodeReporter
from hami_sim.apiserver import ApiServerRunner
from tests.apiserver_util import bind
from tests.builders import allocation_annotations, gpu_pod, node, pod

NODE = "n1"
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
FAST = RetryPolicy(initial=0.05, maximum=0.3)
GPUS = (
    GPUInfo(id=GPU_A, index=0, count=10, devmem=81920, devcore=100, type="NVIDIA-A100-SXM4-80GB",
            mode="hami-core", health=True),
    GPUInfo(id=GPU_B, index=1, count=10, devmem=81920, devcore=100, type="NVIDIA-A100-SXM4-80GB",
            numa=1, mode="hami-core", health=True),
)  # fmt: skip


class RecordingHandler:
    """Forwards watch deliveries to the tracker and lets a test wait for them."""

    def __init__(self, tracker: PodTracker) -> None:
        self.tracker = tracker
        self.cond = threading.Condition()
        self.lists = 0
        self.events: list[tuple[str, str, str]] = []
        """(type, pod name, bind-phase)"""

    def pods_listed(self, pods: Sequence[dict[str, Any]]) -> None:
        self.tracker.pods_listed(pods)
        with self.cond:
            self.lists += 1
            self.cond.notify_all()

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        self.tracker.pod_event(kind, pod)
        meta = pod["metadata"]
        with self.cond:
            self.events.append((kind, meta["name"], (meta.get("annotations") or {}).get(ann.BIND_PHASE, "")))
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), f"timed out; events: {self.events}"


@dataclass
class Stack:
    runner: ApiServerRunner
    kube: NodeApi
    tracker: PodTracker
    handler: RecordingHandler
    watch: ThreadedReflector


@pytest.fixture
def stack(apiserver: Any) -> Iterator[Stack]:
    s = start_stack(apiserver.runner, NodeApi.connect(apiserver.kubeconfig))
    yield s
    stop_stack(s)


def start_stack(runner: ApiServerRunner, kube: NodeApi) -> Stack:
    tracker = PodTracker(NODE, kube, retry=FAST)
    handler = RecordingHandler(tracker)
    watch = watch_node_pods(kube.bridge, NODE, handler, retry=FAST)
    tracker.start()
    watch.start()
    assert watch.wait_synced(10)
    return Stack(runner, kube, tracker, handler, watch)


def stop_stack(s: Stack) -> None:
    s.watch.stop()
    s.tracker.stop()
    s.kube.close()


def scheduled(core_v1: Any, name: str, allocation: str, *, node_name: str = NODE, **extra: str) -> None:
    """Create a pod and bind it the way the extender does: the choice rides on the Binding."""
    core_v1.create_namespaced_pod("default", gpu_pod(name, gpus=1))
    annotations = {**allocation_annotations(node_name, allocation, bound_at=1767225600), **extra}
    bind(core_v1, "default", name, node_name, annotations=annotations)


def pod_annotations(core_v1: Any, name: str) -> dict[str, str]:
    return dict(core_v1.read_namespaced_pod(name, "default").metadata.annotations or {})


def node_annotations(core_v1: Any, name: str = NODE) -> dict[str, str]:
    return dict(core_v1.read_node(name).metadata.annotations or {})


# --- the pod watch and the bind-phase patch ------------------------------------------------------------


def test_watch_feeds_the_tracker_and_one_patch_per_pod(stack: Stack, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    scheduled(core_v1, "one", f"{GPU_A},NVIDIA,4000,30:;")
    scheduled(core_v1, "elsewhere", f"{GPU_A},NVIDIA,4000,30:;", node_name="n2")
    core_v1.create_namespaced_pod("default", pod("plain"))
    bind(core_v1, "default", "plain", NODE)
    stack.runner.reset_counters()

    one = stack.tracker.match(1)  # waits for the watch if it lags
    assert one.pod.key == "default/one"
    assert one.container.uuids == (GPU_A,)
    stack.tracker.allocated(one)
    # Init container (1 GPU), a container without GPUs, a container with 2 GPUs.
    scheduled(core_v1, "two", f"{GPU_A},NVIDIA,1000,0:;;{GPU_A},NVIDIA,2000,0:{GPU_B},NVIDIA,2000,0:;")
    first = stack.tracker.match(1)
    assert (first.pod.key, first.entry) == ("default/two", 0)
    assert stack.tracker.pod_object(first.pod)["metadata"]["uid"] == first.pod.uid
    stack.tracker.allocated(first)
    second = stack.tracker.match(2)
    assert (second.pod.key, second.entry, second.completes_pod) == ("default/two", 2, True)
    stack.tracker.allocated(second)
    assert stack.tracker.flush(10.0)

    for name in ("one", "two"):
        assert pod_annotations(core_v1, name)[ann.BIND_PHASE] == "success"
    assert pod_annotations(core_v1, "elsewhere")[ann.BIND_PHASE] == "allocating"
    counters = stack.runner.counters()
    assert counters[("patch", "pods", "")] == 2
    # Exactly one pod write per device pod; the rest are the test's own create and binding.
    assert stack.runner.writes() == 2 + 2
    # The watch brings our patches back; nothing waits any more.
    stack.handler.wait(lambda: {("MODIFIED", "one", "success"), ("MODIFIED", "two", "success")}
                       <= set(stack.handler.events))  # fmt: skip
    assert stack.tracker.waiting() == ()


def test_failed_allocation_is_reported(stack: Stack, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    scheduled(core_v1, "p", f"{GPU_A},NVIDIA,4000,30:;")
    match = stack.tracker.match(1)
    stack.tracker.failed(match.pod, "kubelet asked for a device of another GPU")
    assert stack.tracker.flush(10.0)
    assert pod_annotations(core_v1, "p")[ann.BIND_PHASE] == "failed"


def test_node_lock_released_when_it_names_the_pod(stack: Stack, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    core_v1.patch_node(
        NODE, {"metadata": {"annotations": {ann.NODE_LOCK: "2026-01-01T00:00:00Z,default,other"}}}
    )
    scheduled(core_v1, "p", f"{GPU_A},NVIDIA,4000,30:;")
    stack.tracker.allocated(stack.tracker.match(1))
    assert stack.tracker.flush(10.0)
    assert node_annotations(core_v1)[ann.NODE_LOCK] == "2026-01-01T00:00:00Z,default,other"

    core_v1.patch_node(NODE, {"metadata": {"annotations": {ann.NODE_LOCK: "2026-01-01T00:00:00Z,default,q"}}})
    scheduled(core_v1, "q", f"{GPU_A},NVIDIA,4000,30:;")
    stack.tracker.allocated(stack.tracker.match(1))
    assert stack.tracker.flush(10.0)
    assert ann.NODE_LOCK not in node_annotations(core_v1)
    assert stack.tracker.locks_released == 1


# --- watch resilience ----------------------------------------------------------------------------------


def drop_watches(runner: ApiServerRunner) -> None:
    """The server ends every open watch stream (as an apiserver restart or a proxy timeout does)."""

    def close_all() -> None:
        for watcher in runner.store.watchers():
            watcher.close()

    runner.call(close_all)


def test_watch_resumes_after_the_stream_drops(stack: Stack, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    scheduled(core_v1, "before", f"{GPU_A},NVIDIA,4000,30:;")
    stack.handler.wait(lambda: ("ADDED", "before", "allocating") in stack.handler.events)
    watches = stack.watch.watches
    drop_watches(stack.runner)
    scheduled(core_v1, "after", f"{GPU_A},NVIDIA,1000,0:{GPU_B},NVIDIA,1000,0:;")
    stack.handler.wait(lambda: ("ADDED", "after", "allocating") in stack.handler.events)
    assert stack.watch.watches > watches  # a new watch ...
    assert stack.handler.lists == 1  # ... from the last version seen, not a relist
    assert [e[1] for e in stack.handler.events].count("before") == 1  # nothing delivered twice
    assert stack.tracker.match(2).pod.key == "default/after"
    # stop() interrupts the blocked read of the open watch at once.
    started = time.monotonic()
    stack.watch.stop()
    assert time.monotonic() - started < 2.0


def test_watch_relists_after_410_gone(tmp_path: Any) -> None:
    with ApiServerRunner(history_size=3, bookmark_interval=60.0) as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        s = start_stack(runner, NodeApi.connect(kubeconfig))
        try:
            from kubernetes import client

            with client.ApiClient(client.Configuration(host=runner.base_url)) as api:
                core_v1: Any = client.CoreV1Api(api)
                core_v1.create_node(node(NODE))
                scheduled(core_v1, "mine", f"{GPU_A},NVIDIA,4000,30:;")
                s.handler.wait(lambda: ("ADDED", "mine", "allocating") in s.handler.events)
                # Pods elsewhere change often: the version our watch resumes from leaves the history.
                core_v1.create_namespaced_pod("default", pod("busy"))
                bind(core_v1, "default", "busy", "n2")
                for i in range(6):
                    core_v1.patch_namespaced_pod("busy", "default", {"metadata": {"labels": {"i": str(i)}}})
                # While the stream is down, our pod is deleted: only a relist can tell.
                s.watch.stop()
                core_v1.delete_namespaced_pod("mine", "default")
                scheduled(core_v1, "new", f"{GPU_A},NVIDIA,1000,0:{GPU_B},NVIDIA,1000,0:;")
                for i in range(6):
                    core_v1.patch_namespaced_pod("busy", "default", {"metadata": {"labels": {"j": str(i)}}})
                s.watch.start()
                s.handler.wait(lambda: s.handler.lists == 2)
                assert [p.name for p in s.tracker.waiting()] == ["new"]
                scheduled(core_v1, "later", f"{GPU_B},NVIDIA,1000,0:;")
                s.handler.wait(lambda: ("ADDED", "later", "allocating") in s.handler.events)
                assert s.handler.lists == 2
        finally:
            stop_stack(s)


# --- the inventory annotation --------------------------------------------------------------------------


@pytest.fixture
def kube(apiserver: Any) -> Iterator[NodeApi]:
    k = NodeApi.connect(apiserver.kubeconfig)
    yield k
    k.close()


@pytest.fixture
def reporter(kube: NodeApi) -> Iterator[NodeReporter]:
    r = NodeReporter(kube, NODE, check_interval_s=0.2, retry=FAST)
    r.start()
    yield r
    r.stop()


def test_reporter_writes_once_and_restores_a_wiped_annotation(
    reporter: NodeReporter, apiserver: Any, core_v1: Any
) -> None:
    core_v1.create_node(node(NODE))
    reporter.publish(GPUS)
    assert reporter.wait_synced(5.0)
    expected = ann.encode_node_register(GPUS)
    assert node_annotations(core_v1)[ann.NODE_REGISTER] == expected
    assert expected.startswith('[{"id":"GPU-aaaaaaaa-0000-0000-0000-000000000001","count":10,"devmem":81920')
    runner = apiserver.runner
    assert runner.counters()[("patch", "nodes", "")] == 1

    # Unchanged: checked again and again, never rewritten; publishing the same inventory is free.
    reporter.publish(list(GPUS))
    assert reporter.wait_checks(reporter.checks + 3, 5.0)
    assert runner.counters()[("patch", "nodes", "")] == 1
    assert reporter.writes == 1

    # Someone wipes it: the next check puts it back.
    core_v1.patch_node(NODE, {"metadata": {"annotations": {ann.NODE_REGISTER: None, "other": "x"}}})
    assert reporter.wait_checks(reporter.checks + 2, 5.0)
    assert node_annotations(core_v1) == {ann.NODE_REGISTER: expected, "other": "x"}
    assert reporter.writes == 2


def test_reporter_writes_a_health_change_before_its_next_periodic_check(kube: NodeApi, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    r = NodeReporter(kube, NODE, check_interval_s=30.0, retry=FAST)
    r.start()
    try:
        r.publish(GPUS)
        assert r.wait_synced(5.0)
        sick = (GPUS[0], replace(GPUS[1], health=False))
        r.publish(sick)
        assert r.wait_synced(5.0)  # the periodic check is 30 s away
        assert node_annotations(core_v1)[ann.NODE_REGISTER] == ann.encode_node_register(sick)
        assert '"health":true' not in node_annotations(core_v1)[ann.NODE_REGISTER].split("},{")[1]
    finally:
        r.stop()


def test_reporter_waits_for_the_node_to_register(reporter: NodeReporter, core_v1: Any) -> None:
    reporter.publish(GPUS)
    assert not reporter.wait_synced(0.3)  # 404 Node not found: retried
    core_v1.create_node(node(NODE))
    assert reporter.wait_synced(5.0)
    assert node_annotations(core_v1)[ann.NODE_REGISTER] == ann.encode_node_register(GPUS)


# --- the API server goes away and comes back -----------------------------------------------------------


def test_api_server_down_then_back(stack: Stack, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    scheduled(core_v1, "p", f"{GPU_A},NVIDIA,4000,30:;")
    stack.handler.wait(lambda: ("ADDED", "p", "allocating") in stack.handler.events)
    reporter = NodeReporter(stack.kube, NODE, check_interval_s=0.2, retry=FAST)
    reporter.start()
    try:
        reporter.publish(GPUS)
        assert reporter.wait_synced(5.0)

        stack.runner.stop()
        # Allocate keeps working from memory; its writes and the inventory wait for the server.
        match = stack.tracker.match(1)
        stack.tracker.allocated(match)
        sick = (replace(GPUS[0], health=False), GPUS[1])
        reporter.publish(sick)
        assert not stack.tracker.flush(0.5)
        assert not reporter.wait_synced(0.1)

        stack.runner.start()
        assert stack.tracker.flush(10.0)
        assert reporter.wait_synced(10.0)
        assert pod_annotations(core_v1, "p")[ann.BIND_PHASE] == "success"
        assert node_annotations(core_v1)[ann.NODE_REGISTER] == ann.encode_node_register(sick)
        # The watch is back too: a pod scheduled now is seen.
        scheduled(core_v1, "q", f"{GPU_A},NVIDIA,1000,0:{GPU_B},NVIDIA,1000,0:;")
        assert stack.tracker.match(2).pod.key == "default/q"
    finally:
        reporter.stop()


# --- the client ----------------------------------------------------------------------------------------


def test_client_configuration_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="in-cluster config"):
        NodeApi.connect(None)
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError, match=f"kubeconfig {missing}"):
        NodeApi.connect(missing)


def test_the_in_cluster_address_comes_from_the_environ_given_not_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if SERVICE_ACCOUNT_DIR.exists():
        pytest.skip("running in a pod: the in-cluster credentials would load")
    address = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    for name, value in address.items():
        monkeypatch.setenv(name, value)
    # The process environment is not read: the daemon's config hands the address over
    # (NodeConfig.in_cluster_env).
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not"):
        NodeApi.connect(None)
    # Given the address, the loader goes on to the service account's files (absent here).
    with pytest.raises(KubeConfigError, match=r"serviceaccount/(token|ca\.crt)"):
        NodeApi.connect(None, environ=address)


def test_client_errors_are_typed(kube: NodeApi, apiserver: Any) -> None:
    with pytest.raises(KubeApiError) as err:
        kube.get_node("absent")
    # The daemon names itself to the API server (fault rules and logs tell it from hami-control).
    assert apiserver.runner.requests(limit=1)[0]["userAgent"].startswith("hami-node/")
    assert (err.value.status, err.value.reason, err.value.not_found, err.value.retriable) == (
        404, "NotFound", True, False,
    )  # fmt: skip
    assert 'nodes "absent" not found' in err.value.message
    apiserver.runner.stop()
    with pytest.raises(KubeApiError) as err:
        kube.patch_pod_annotations("default", "p", {"a": "b"})
    assert (err.value.status, err.value.retriable) == (0, True)
