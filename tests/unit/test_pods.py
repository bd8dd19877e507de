"""PodTracker: the table of pods waiting for devices (fed by in-memory watch events), match with its one
API read on a miss, grants, and the bind-phase / node-lock / event writes (through a fake API)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_api.types import ContainerAllocation, GPUSlice
from hami_kube.backoff import RetryPolicy
from hami_kube.errors import KubeApiError
from hami_kube.events import ObjectRef, new_event
from hami_node.allocation import (
    AllocationError,
    AmbiguousPodError,
    CountMismatchError,
    ForeignPodError,
    NoPendingPodError,
    PendingPod,
)
from hami_node.kubeapi import event_source
from hami_node.plugin.kubelet_pods import KubeletPod, KubeletPodsError
from hami_node.pods import PodTracker, Rejected, foreign_gpu_counts, waiting_pod
from hami_node.ports import PodName
from tests.builders import allocation_annotations, container, pod

NODE = "n1"
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
FAST = RetryPolicy(initial=0.01, maximum=0.05)


def alloc(*containers: tuple[str, ...]) -> str:
    """`hami.io/vgpu-devices-to-allocate` for containers listing GPU UUIDs (1000 MiB, 30 % each)."""
    return "".join("".join(f"{u},NVIDIA,1000,30:" for u in c) + ";" for c in containers)


def scheduled_pod(
    name: str,
    allocation: str | None = None,
    *,
    uid: str | None = None,
    namespace: str = "default",
    phase: str | None = "Pending",
    bind_phase: str | None = "allocating",
    vgpu_node: str | None = NODE,
    deleting: bool = False,
    containers: int = 1,
    admitted: bool = False,
) -> dict[str, Any]:
    """A pod bound to NODE that hami-control scheduled: `allocation` (raw annotation text) in both
    allocation annotations, `hami.io/bind-phase`, `hami.io/vgpu-node`; containers c0, c1, ...;
    `admitted`: kubelet reports its containers (waiting to start)."""
    obj = pod(
        name,
        *(container(f"c{i}", image=None) for i in range(containers)),
        namespace=namespace,
        uid=uid or f"uid-{namespace}-{name}",
        resource_version="1",
        annotations=allocation_annotations(vgpu_node, allocation, bind_phase=bind_phase),
        node_name=NODE,
        phase=phase,
        deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
    )
    obj.setdefault("status", {})
    if admitted:
        obj["status"]["containerStatuses"] = [
            {"name": f"c{i}", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
            for i in range(containers)
        ]
    return obj


class FakePatcher:
    """An in-memory API for the writer: records calls, can fail on demand, guards the Node patch by
    resourceVersion like the API server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, ...]] = []
        self.pod_patches: list[tuple[str, str, dict[str, str | None]]] = []
        self.node_patches: list[dict[str, str | None]] = []
        self.node_annotations: dict[str, str] = {}
        self.node_version = 1
        self.failures: list[KubeApiError] = []
        """Raised, in order, by the next calls."""
        self.bump_before_node_patch = False
        self.api_pods: list[dict[str, Any]] = []
        """What a list of the node's pods returns (the API server's view, ahead of the watch)."""
        self.events: list[Mapping[str, Any]] = []
        self.watched: dict[tuple[str, str], dict[str, Any]] = {}
        """The pods the tracker's watch showed last (`saw`): what `get_pod` answers unless `api_pods`
        has the pod."""

    def _maybe_fail(self, call: tuple[str, ...]) -> None:
        self.calls.append(call)
        if self.failures:
            raise self.failures.pop(0)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Mapping[str, Any]:
        with self.lock:
            self._maybe_fail(("patch-pod", namespace, name))
            self.pod_patches.append((namespace, name, dict(annotations)))
            return {}

    def list_pods(
        self, field_selector: str, timeout_s: float | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        with self.lock:
            self._maybe_fail(("list-pods", field_selector))
            return [dict(p) for p in self.api_pods], "7"

    def get_pod(self, namespace: str, name: str, timeout_s: float | None = None) -> Mapping[str, Any]:
        """The pod as `api_pods` has it, else as the watch last showed it (`watched`), else 404."""
        with self.lock:
            self._maybe_fail(("get-pod", namespace, name))
            for obj in self.api_pods:
                if (obj["metadata"].get("namespace"), obj["metadata"]["name"]) == (namespace, name):
                    return dict(obj)
            found = self.watched.get((namespace, name))
            if found is None:
                raise KubeApiError(404, "NotFound", f'pods "{name}" not found')
            return dict(found)

    def saw(self, kind: str, pod: Mapping[str, Any]) -> None:
        """The watch delivered `pod`: the API server has it too (or something newer)."""
        key = (pod["metadata"].get("namespace") or "default", pod["metadata"]["name"])
        with self.lock:
            if kind == "DELETED":
                self.watched.pop(key, None)
            else:
                self.watched[key] = dict(pod)

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, action: str = ""
    ) -> None:
        """The tracker's `PodEvents`: the Event the daemon's recorder (source `event_source(NODE)`) makes."""
        ref = ObjectRef("Pod", name, namespace, uid)
        event = new_event(ref, type_, reason, message, event_source(NODE), time.time(), action=action)
        with self.lock:
            self.events.append(event.body())

    def get_node(self, name: str) -> Mapping[str, Any]:
        with self.lock:
            self._maybe_fail(("get-node", name))
            return {
                "metadata": {
                    "name": name,
                    "resourceVersion": str(self.node_version),
                    "annotations": dict(self.node_annotations),
                }
            }

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]:
        with self.lock:
            self._maybe_fail(("patch-node", name))
            if self.bump_before_node_patch:
                self.bump_before_node_patch = False
                self.node_version += 1
            if resource_version is not None and resource_version != str(self.node_version):
                raise KubeApiError(409, "Conflict", "the object has been modified")
            for key, value in annotations.items():
                if value is None:
                    self.node_annotations.pop(key, None)
                else:
                    self.node_annotations[key] = value
            self.node_version += 1
            self.node_patches.append(dict(annotations))
            return {}


@pytest.fixture
def patcher() -> FakePatcher:
    return FakePatcher()


class WatchedTracker(PodTracker):
    """The tracker with its watch feeding the fake API server too: whatever the watch shows, the API
    server has (the watch is never ahead of it)."""

    def __init__(self, patcher: FakePatcher, retry: RetryPolicy = FAST) -> None:
        super().__init__(NODE, patcher, events=patcher, retry=retry)
        self.api = patcher

    def pods_listed(self, pods: Sequence[dict[str, Any]]) -> None:
        with self.api.lock:
            self.api.watched.clear()
        for obj in pods:
            self.api.saw("ADDED", obj)
        super().pods_listed(pods)

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        self.api.saw(kind, pod)
        super().pod_event(kind, pod)


@pytest.fixture
def tracker(patcher: FakePatcher) -> Iterator[PodTracker]:
    t = WatchedTracker(patcher)
    t.start()
    yield t
    t.stop()


def names(tracker: PodTracker) -> list[str]:
    return [p.name for p in tracker.waiting()]


# --- which pods wait -------------------------------------------------------------------------------------


def test_waiting_pod_rule() -> None:
    one = alloc((GPU_A,))
    found = waiting_pod(scheduled_pod("p", one), NODE)
    assert isinstance(found, PendingPod)
    assert (found.key, found.uid, found.next_entry()) == ("default/p", "uid-default-p", 0)
    assert waiting_pod(scheduled_pod("p", one, phase=None), NODE) is not None  # phase not set yet
    not_waiting = [
        scheduled_pod("p", one, phase="Running"),
        scheduled_pod("p", one, phase="Succeeded"),
        scheduled_pod("p", one, bind_phase="success", admitted=True),  # finished: kubelet admitted it
        scheduled_pod("p", one, bind_phase="failed"),
        scheduled_pod("p", one, bind_phase=None),
        scheduled_pod("p", one, deleting=True),
        scheduled_pod("p", ";;"),  # every entry consumed
        scheduled_pod("p", ""),
    ]
    for obj in not_waiting:
        assert waiting_pod(obj, NODE) is None, obj
    # Another vendor's plugin wrote success while kubelet admits the pod: our entries still wait.
    assert isinstance(waiting_pod(scheduled_pod("p", one, bind_phase="success"), NODE), PendingPod)
    rejected = {
        "other node": waiting_pod(scheduled_pod("p", one, vgpu_node="n2"), NODE),
        "no node": waiting_pod(scheduled_pod("p", one, vgpu_node=None), NODE),
        "no allocation": waiting_pod(scheduled_pod("p", None), NODE),
        "bad allocation": waiting_pod(scheduled_pod("p", "GPU-a,NVIDIA,lots,0:;"), NODE),
    }
    assert all(isinstance(r, Rejected) for r in rejected.values()), rejected
    assert "n2" in str(rejected["other node"])
    assert ann.DEVICES_TO_ALLOCATE in str(rejected["no allocation"])
    assert "lots" in str(rejected["bad allocation"])


def test_table_from_list_and_events(tracker: PodTracker) -> None:
    one = alloc((GPU_A,))
    tracker.pods_listed(
        [
            scheduled_pod("waits", one),
            scheduled_pod("running", one, phase="Running"),
            scheduled_pod("done", one, bind_phase="success", admitted=True),
            scheduled_pod("plain", None, bind_phase=None, vgpu_node=None),
        ]
    )
    assert names(tracker) == ["waits"]
    tracker.pod_event("ADDED", scheduled_pod("second", alloc((GPU_A, GPU_B))))
    assert names(tracker) == ["second", "waits"]
    tracker.pod_event("MODIFIED", scheduled_pod("waits", one, phase="Failed"))
    assert names(tracker) == ["second"]
    tracker.pod_event("DELETED", scheduled_pod("second", alloc((GPU_A, GPU_B))))
    assert names(tracker) == []
    # A relist replaces everything.
    tracker.pod_event("ADDED", scheduled_pod("gone", one))
    tracker.pods_listed([scheduled_pod("new", one)])
    assert names(tracker) == ["new"]


def test_pod_object_and_steering(tracker: PodTracker) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A, GPU_B)), containers=1))
    match = tracker.match(2)
    obj = tracker.pod_object(match.pod)
    assert obj["metadata"]["name"] == "p"
    admitting = tracker.admitting(2)
    assert admitting is not None and admitting.container.uuids == (GPU_A, GPU_B)
    assert tracker.admitting(1) is None
    tracker.pod_event("DELETED", scheduled_pod("p", alloc((GPU_A, GPU_B))))
    with pytest.raises(KeyError, match="default/p"):
        tracker.pod_object(match.pod)


# --- match -----------------------------------------------------------------------------------------------


def test_match_walks_containers_init_first(tracker: PodTracker, patcher: FakePatcher) -> None:
    # init container: 1 GPU, a container without GPUs, then a container with 2 GPUs.
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,), (), (GPU_A, GPU_B)), containers=3))
    first = tracker.match(1)
    assert (first.pod.key, first.entry, first.completes_pod) == ("default/p", 0, False)
    tracker.allocated(first)
    with pytest.raises(CountMismatchError, match="default/p"):
        tracker.match(1)
    second = tracker.match(2)
    assert (second.entry, second.completes_pod) == (2, True)
    assert tracker.flush(5.0)
    assert patcher.pod_patches == []  # nothing until the last device container
    tracker.allocated(second)
    assert tracker.flush(5.0)
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "success"})]
    assert names(tracker) == []


def test_a_pod_the_watch_has_not_shown_is_read_from_the_api_server_once(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    patcher.api_pods = [scheduled_pod("late", alloc((GPU_A,)))]
    found = tracker.match(1)
    assert found.pod.key == "default/late"
    assert patcher.calls == [("list-pods", f"spec.nodeName={NODE}")]
    assert tracker.misses == 1
    assert tracker.match(1).pod.key == "default/late"  # now in the table: no second read
    assert tracker.misses == 1


def test_an_unknown_pod_fails_at_once_naming_the_waiting_pods_and_why_the_others_do_not(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    with pytest.raises(NoPendingPodError, match=f"no pod bound to node {NODE}"):
        tracker.match(1)
    tracker.pod_event("ADDED", scheduled_pod("two", alloc((GPU_A, GPU_B))))
    patcher.api_pods = [
        scheduled_pod("two", alloc((GPU_A, GPU_B))),
        scheduled_pod("plain", None, bind_phase=None, vgpu_node=None),
        scheduled_pod("running", alloc((GPU_A,)), phase="Running"),
        scheduled_pod("done", alloc((GPU_A,)), bind_phase="success", admitted=True),
    ]
    with pytest.raises(CountMismatchError) as err:
        tracker.match(1)
    assert err.value.pod == "default/two"
    assert err.value.message == (
        f"kubelet asked for 1 device(s), but no pod pending on node {NODE} has a container waiting for "
        "1 GPU(s); waiting: default/two (next container: 2 GPU(s)); pods bound here that do not wait for "
        f"GPUs: default/done: {ann.BIND_PHASE}=success; default/plain: it has no {ann.BIND_PHASE} "
        "annotation: the HAMi scheduler did not place it; default/running: it is Running"
    )


def test_a_miss_when_the_api_server_cannot_answer_fails_at_once_saying_so(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    patcher.failures = [KubeApiError(0, "ConnectionRefused", "connection refused")]
    with pytest.raises(NoPendingPodError) as err:
        tracker.match(1)
    assert "the API server could not be asked for this node's pods" in err.value.message
    assert "connection refused" in err.value.message


def test_steering_reads_the_api_server_for_a_pod_the_watch_has_not_shown(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    patcher.api_pods = [scheduled_pod("late", alloc((GPU_B,)))]
    admitting = tracker.admitting(1)
    assert admitting is not None and admitting.container.uuids == (GPU_B,)
    assert tracker.admitting(2) is None


def test_ambiguous_fails_without_waiting_out_the_match_timeout(tracker: PodTracker) -> None:
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,))))
    tracker.pod_event("ADDED", scheduled_pod("b", alloc((GPU_B,))))
    started = time.monotonic()
    with pytest.raises(AmbiguousPodError) as err:
        tracker.match(1)
    assert time.monotonic() - started < 5
    assert err.value.pods == ("default/a", "default/b")
    assert tracker.admitting(1) is None


# --- writes ----------------------------------------------------------------------------------------------


def test_a_pod_another_vendors_plugin_marked_success_during_admission_still_gets_its_gpus(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    """A pod asking an NVIDIA GPU and, say, a Hygon DCU: the DCU plugin allocated first and wrote
    success (HAMi's PodAllocationTrySuccess); kubelet then asks for the GPU (issue 26)."""
    obj = scheduled_pod("mixed", alloc((GPU_A,)), bind_phase="success")
    tracker.pod_event("ADDED", obj)
    assert names(tracker) == ["mixed"]
    tracker.allocated(tracker.match(1))
    assert names(tracker) == []
    tracker.pod_event("MODIFIED", obj)  # the watch's copy from before our patch: not waiting again
    assert names(tracker) == []
    assert tracker.flush(5.0)
    assert patcher.pod_patches == [("default", "mixed", {ann.BIND_PHASE: "success"})]


def test_completion_patches_success_once(tracker: PodTracker, patcher: FakePatcher) -> None:
    obj = scheduled_pod("p", alloc((GPU_A,)))
    tracker.pod_event("ADDED", obj)
    tracker.allocated(tracker.match(1))
    assert names(tracker) == []
    # The watch still shows the pod allocating (our patch has not come back yet): not waiting again.
    tracker.pod_event("MODIFIED", obj)
    tracker.pods_listed([obj])
    assert names(tracker) == []
    assert tracker.flush(5.0)
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "success"})]
    assert tracker.patches_sent == 1
    # the match confirmed with a GET of the pod; no lock: no node write
    assert [c[0] for c in patcher.calls] == ["get-pod", "patch-pod", "get-node"]
    # Our patch shows up; then the pod is forgotten.
    tracker.pod_event("MODIFIED", scheduled_pod("p", alloc((GPU_A,)), bind_phase="success"))
    assert names(tracker) == []


def test_a_running_pod_still_allocating_gets_the_success_patch_a_restart_lost_once(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    """protocol_model's "restart daemon" trace: the daemon answered Allocate and was killed before its
    success patch went out; kubelet runs the pod, which would say allocating for ever."""
    running = scheduled_pod("p", alloc((GPU_A,)), phase="Running")
    tracker.pods_listed([running, scheduled_pod("q", alloc((GPU_B,)))])
    tracker.pod_event("MODIFIED", running)  # seen again before our patch shows: no second write
    assert names(tracker) == ["q"]
    assert tracker.flush(5.0)
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "success"})]
    # Not for a pod being deleted, one that says success, or one on another node.
    for other in (
        scheduled_pod("d", alloc((GPU_A,)), phase="Running", deleting=True),
        scheduled_pod("s", alloc((GPU_A,)), phase="Running", bind_phase="success"),
        scheduled_pod("o", alloc((GPU_A,)), phase="Running", vgpu_node="n2"),
    ):
        tracker.pod_event("MODIFIED", other)
    assert tracker.flush(5.0)
    assert len(patcher.pod_patches) == 1


def test_same_name_new_pod_waits_again(tracker: PodTracker) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,)), uid="u1"))
    tracker.allocated(tracker.match(1))
    tracker.pod_event("DELETED", scheduled_pod("p", alloc((GPU_A,)), uid="u1"))
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,)), uid="u2"))
    assert [p.uid for p in tracker.waiting()] == ["u2"]


def test_failure_patches_failed(tracker: PodTracker, patcher: FakePatcher) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    match = tracker.match(1)
    tracker.failed(match.pod, "GPU unhealthy")
    tracker.failed(None, "no pod at all")  # only logged
    assert tracker.flush(5.0)
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "failed"})]
    assert names(tracker) == []


def test_writes_retry_until_the_api_answers(tracker: PodTracker, patcher: FakePatcher) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    match = tracker.match(1)
    patcher.failures = [KubeApiError(0, "ConnectionRefused", "down")] * 3 + [
        KubeApiError(503, "ServiceUnavailable", "busy")
    ]
    tracker.allocated(match)
    assert tracker.flush(10.0)
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "success"})]
    assert [c[0] for c in patcher.calls] == ["get-pod"] + ["patch-pod"] * 5 + ["get-node"]


def test_a_write_for_a_deleted_pod_is_dropped(tracker: PodTracker, patcher: FakePatcher) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    match = tracker.match(1)
    patcher.failures = [KubeApiError(404, "NotFound", 'pods "p" not found')]
    tracker.allocated(match)
    assert tracker.flush(5.0)  # the 404 is p's patch's, not q's GET's
    tracker.pod_event("ADDED", scheduled_pod("q", alloc((GPU_B,))))
    tracker.allocated(tracker.match(1))
    assert tracker.flush(5.0)
    assert [c[:3] for c in patcher.calls if c[0] == "patch-pod"] == [
        ("patch-pod", "default", "p"),
        ("patch-pod", "default", "q"),
    ]
    assert patcher.pod_patches == [("default", "q", {ann.BIND_PHASE: "success"})]


def test_node_lock_released_only_when_it_names_the_pod(tracker: PodTracker, patcher: FakePatcher) -> None:
    patcher.node_annotations[ann.NODE_LOCK] = "2026-01-01T00:00:00Z,default,other"
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    tracker.allocated(tracker.match(1))
    assert tracker.flush(5.0)
    assert patcher.node_patches == []
    assert patcher.node_annotations[ann.NODE_LOCK] == "2026-01-01T00:00:00Z,default,other"

    for legacy in ("2026-01-01T00:00:00Z", "garbage"):
        patcher.node_annotations[ann.NODE_LOCK] = legacy
        tracker.pod_event("ADDED", scheduled_pod("legacy", alloc((GPU_A,)), uid=f"u-{legacy}"))
        tracker.allocated(tracker.match(1))
        assert tracker.flush(5.0)
        assert patcher.node_patches == []

    patcher.node_annotations[ann.NODE_LOCK] = "2026-01-01T00:00:00Z,team,mine"
    patcher.node_annotations["keep"] = "me"
    patcher.bump_before_node_patch = True  # someone writes the Node between our GET and PATCH
    tracker.pod_event("ADDED", scheduled_pod("mine", alloc((GPU_A,)), namespace="team"))
    tracker.failed(tracker.match(1).pod, "count mismatch")
    assert tracker.flush(5.0)
    assert patcher.pod_patches[-1] == ("team", "mine", {ann.BIND_PHASE: "failed"})
    assert patcher.node_patches == [{ann.NODE_LOCK: None}]  # after a 409, re-read and released
    assert patcher.node_annotations == {"keep": "me"}
    assert tracker.locks_released == 1


def test_a_pod_whose_bind_took_no_node_lock_is_answered_without_reading_the_node(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    """hami-control's binder writes `hami.io/bind-node-lock: none` when it took no `hami.io/mutex.lock`:
    one pod patch, no Node read (a lock there is someone else's, left alone)."""
    patcher.node_annotations[ann.NODE_LOCK] = "2026-01-01T00:00:00Z,default,p"
    obj = scheduled_pod("p", alloc((GPU_A,)))
    obj["metadata"]["annotations"][ann.BIND_NODE_LOCK] = ann.BIND_NODE_LOCK_NONE
    tracker.pod_event("ADDED", obj)
    tracker.allocated(tracker.match(1))
    assert tracker.flush(5.0)
    assert [c[0] for c in patcher.calls] == ["get-pod", "patch-pod"]
    assert patcher.node_annotations[ann.NODE_LOCK] == "2026-01-01T00:00:00Z,default,p"
    assert tracker.locks_released == 0


def test_bad_annotation_is_skipped_with_a_logged_reason(
    tracker: PodTracker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami_node.pods")
    bad = scheduled_pod("bad", "GPU-a,NVIDIA,1000:;")
    tracker.pod_event("ADDED", bad)
    tracker.pod_event("MODIFIED", bad)
    assert names(tracker) == []
    logged = [r.getMessage() for r in caplog.records if "default/bad" in r.getMessage()]
    assert len(logged) == 1  # once per value, not per event
    assert "has 3 fields, expected 4" in logged[0]
    with pytest.raises(NoPendingPodError, match=r"default/bad: .*has 3 fields"):
        tracker.match(1)
    # Fixed by the scheduler: now it waits, and the error no longer mentions it.
    tracker.pod_event("MODIFIED", scheduled_pod("bad", alloc((GPU_A,))))
    assert names(tracker) == ["bad"]
    tracker.pod_event("DELETED", scheduled_pod("bad", alloc((GPU_A,))))
    with pytest.raises(NoPendingPodError) as err:
        tracker.match(1)
    assert "skipped" not in err.value.message


def test_relist_keeps_partial_progress(tracker: PodTracker) -> None:
    obj = scheduled_pod("p", alloc((GPU_A,), (GPU_A, GPU_B)), containers=2)
    tracker.pod_event("ADDED", obj)
    tracker.allocated(tracker.match(1))
    tracker.pods_listed([obj])
    assert tracker.match(2).entry == 1
    tracker.pod_event("MODIFIED", obj)
    assert tracker.match(2).entry == 1


def test_stop_drops_unsent_writes(patcher: FakePatcher) -> None:
    tracker = WatchedTracker(patcher, retry=RetryPolicy(initial=30, maximum=30))
    tracker.start()
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    match = tracker.match(1)
    patcher.failures = [KubeApiError(0, "ConnectionRefused", "down")]
    tracker.allocated(match)
    assert not tracker.flush(0.2)  # the first try failed, the retry waits 30 s
    tracker.stop()
    assert tracker.flush(0.1)


# --- grants and events -------------------------------------------------------------------------------------


def test_a_container_moved_to_another_gpu_of_its_pod_is_recorded_with_the_success_patch_and_an_event(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    # Init container on A and B; the app container was planned on A, kubelet reused B.
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A, GPU_B), (GPU_A,)), containers=2))
    tracker.allocated(tracker.match(2))
    app = tracker.match(1)
    moved = ContainerAllocation((GPUSlice(GPU_B, 1000, 30),))
    tracker.allocated(app, moved)
    assert tracker.flush(5.0)
    granted = alloc((GPU_A, GPU_B), (GPU_B,))
    assert patcher.pod_patches == [
        (
            "default",
            "p",
            {ann.DEVICES_ALLOCATED: granted, ann.DEVICES_TO_ALLOCATE: granted, ann.BIND_PHASE: "success"},
        )
    ]
    (event,) = patcher.events
    assert (event["type"], event["reason"]) == ("Normal", "AllocateGPUReassigned")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "default",
        "name": "p",
        "uid": "uid-default-p",
    }
    assert f"got GPU(s) {GPU_B} where the scheduler planned {GPU_A}" in event["message"]
    assert event["source"] == {"component": "hami-node", "host": NODE}


def test_a_failure_with_an_event_reason_writes_a_warning_event_and_patches_failed(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    tracker.pod_event("ADDED", scheduled_pod("p", alloc((GPU_A,))))
    match = tracker.match(1)
    tracker.failed(match.pod, "pod default/p, container 'c0': kubelet chose ...", "AllocateGPUMismatch")
    assert tracker.flush(5.0)
    assert [(e["type"], e["reason"], e["message"]) for e in patcher.events] == [
        ("Warning", "AllocateGPUMismatch", "pod default/p, container 'c0': kubelet chose ...")
    ]
    assert patcher.pod_patches == [("default", "p", {ann.BIND_PHASE: "failed"})]


def test_a_read_of_the_node_pods_racing_a_deletion_does_not_bring_the_pod_back(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    gone = scheduled_pod("gone", alloc((GPU_A,)))
    tracker.pod_event("ADDED", gone)
    tracker.pod_event("DELETED", gone)
    patcher.api_pods = [gone]  # the list was answered before the deletion
    with pytest.raises(NoPendingPodError):
        tracker.match(1)
    assert names(tracker) == []


def test_a_read_of_the_node_pods_older_than_our_own_outcome_does_not_make_the_pod_wait_again(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    stale = scheduled_pod("one", alloc((GPU_A,)))  # bind-phase allocating
    tracker.pod_event("ADDED", stale)
    tracker.allocated(tracker.match(1))
    assert tracker.flush(5.0)
    tracker.pod_event("MODIFIED", scheduled_pod("one", alloc((GPU_A,)), bind_phase="success"))
    patcher.api_pods = [stale]  # a list answered before our success patch, processed after the watch
    with pytest.raises(NoPendingPodError):
        tracker.match(1)
    assert names(tracker) == []


# --- GPU pods the HAMi scheduler did not place ----------------------------------------------------------


def foreign(name: str, gpus: int = 1, **status: Any) -> dict[str, Any]:
    obj = scheduled_pod(name, None, bind_phase=None, vgpu_node=None)
    obj["spec"]["containers"] = [{"name": "c0", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    obj["status"].update(status)
    return obj


def test_a_foreign_gpu_pod_bound_before_a_waiting_pod_is_the_one_kubelet_admits(tracker: PodTracker) -> None:
    tracker.pod_event("ADDED", foreign("stray"))
    tracker.pod_event("ADDED", scheduled_pod("ours", alloc((GPU_A,))))
    assert tracker.admitting(1) is None  # steering does not take the stray pod out of the running
    with pytest.raises(ForeignPodError) as err:
        tracker.match(1)
    assert err.value.pod == ""  # no pod of ours to mark failed
    assert err.value.message.startswith(
        f"kubelet asked for 1 device(s) for pod default/stray, which is bound to node {NODE} without a "
        f"{ann.BIND_PHASE} annotation"
    )
    assert err.value.message.endswith("; default/ours, bound after it, keeps waiting")
    # Kubelet rejects the stray pod; the next request is ours, even before the stray pod's status shows.
    assert tracker.match(1).pod.key == "default/ours"


def test_a_foreign_gpu_pod_bound_after_a_waiting_pod_or_asking_another_count_does_not_get_in_the_way(
    tracker: PodTracker,
) -> None:
    tracker.pod_event("ADDED", scheduled_pod("ours", alloc((GPU_A,))))
    tracker.pod_event("ADDED", foreign("later"))
    tracker.pod_event("ADDED", foreign("pair", gpus=2))
    assert tracker.match(1).pod.key == "default/ours"


def test_only_foreign_pods_kubelet_has_not_admitted_yet_count() -> None:
    assert foreign_gpu_counts(foreign("new"), NODE, "nvidia.com/gpu") == frozenset({1})
    started = foreign("started", containerStatuses=[{"name": "c0"}])
    assert foreign_gpu_counts(started, NODE, "nvidia.com/gpu") is None
    assert foreign_gpu_counts(foreign("done", phase="Failed"), NODE, "nvidia.com/gpu") is None
    assert foreign_gpu_counts(scheduled_pod("ours", alloc((GPU_A,))), NODE, "nvidia.com/gpu") is None
    assert foreign_gpu_counts(foreign("other", gpus=0), NODE, "nvidia.com/gpu") is None
    assert foreign_gpu_counts(foreign("elsewhere"), "n2", "nvidia.com/gpu") is None


def test_pod_names_follow_the_watch_for_the_metrics(tracker: PodTracker) -> None:
    first = pod(
        "a", container("main"), container("side"), namespace="ns", uid="uid-a", init=[container("setup")]
    )
    tracker.pods_listed([first, pod("b", container("main"), namespace="ns", uid="uid-b")])
    assert tracker.pod_name("uid-a") == PodName("ns", "a", ("main", "side"))
    tracker.pod_event("ADDED", pod("c", container("x"), namespace="other", uid="uid-c"))
    assert tracker.pod_name("uid-c") == PodName("other", "c", ("x",))
    tracker.pod_event("DELETED", pod("b", container("main"), namespace="ns", uid="uid-b"))
    assert tracker.pod_name("uid-b") is None
    tracker.pods_listed([first])
    assert tracker.pod_name("uid-c") is None and tracker.pod_name("uid-a") is not None


# --- a match is confirmed by the API server (protocol model finding 5) -----------------------------------


def gone_from_api(patcher: FakePatcher, name: str) -> None:
    """The API server no longer has pod `name`, and the watch has not said so yet."""
    with patcher.lock:
        del patcher.watched[("default", name)]


@pytest.mark.parametrize(
    "now",
    [
        None,
        scheduled_pod("a", alloc((GPU_A,)), deleting=True),
        scheduled_pod("a", alloc((GPU_A,)), phase="Failed"),
        scheduled_pod("a", alloc((GPU_A,)), phase="Succeeded"),
        scheduled_pod("a", alloc((GPU_A,)), bind_phase="failed"),
        scheduled_pod("a", uid="another", bind_phase=None, vgpu_node=None),  # re-created, not bound yet
        scheduled_pod("a", alloc((GPU_A,)), vgpu_node="n2"),
    ],
    ids=["deleted", "deleting", "failed", "succeeded", "no-longer-allocating", "another-uid", "another-node"],
)
def test_a_pod_the_watch_still_shows_waiting_but_the_api_does_not_never_takes_the_next_pods_allocate(
    tracker: PodTracker, patcher: FakePatcher, now: dict[str, Any] | None
) -> None:
    """The watch shows a waiting (its deletion or end not delivered yet); the API server has b bound
    since with the same GPU count, and maybe a as it is now. b's Allocate gets b, never a."""
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,))))
    gone_from_api(patcher, "a")
    patcher.api_pods = [scheduled_pod("b", alloc((GPU_B,)))] + ([now] if now is not None else [])
    match = tracker.match(1)
    assert match.pod.name == "b" and match.pod.uid == "uid-default-b"
    assert names(tracker) == ["b"]
    assert (tracker.confirms, tracker.stale, tracker.misses) == (1, 1, 1)
    assert [c[0] for c in patcher.calls] == ["get-pod", "list-pods"]  # b came fresh from the list


def test_a_confirmed_match_costs_one_get_and_no_list(tracker: PodTracker, patcher: FakePatcher) -> None:
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,))))
    assert tracker.match(1).pod.name == "a"
    admitting = tracker.admitting(1)
    assert admitting is not None and admitting.container.uuids == (GPU_A,)
    assert [c[:3] for c in patcher.calls] == [("get-pod", "default", "a")] * 2
    assert (tracker.confirms, tracker.stale, tracker.misses) == (2, 0, 0)


def test_the_allocate_after_its_preferred_allocation_takes_that_match_without_a_second_get(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,), (GPU_B,)), containers=2))
    admitting = tracker.admitting(1)
    assert admitting is not None and admitting.entry == 0
    match = tracker.match(1, admitting)
    assert (match.pod.name, match.entry) == ("a", 0)
    assert (tracker.confirms, tracker.admitted) == (1, 1)
    tracker.allocated(match)
    # once its container is allocated, the same match is stale: a fresh lookup (and GET) follows
    again = tracker.match(1, admitting)
    assert (again.pod.name, again.entry) == ("a", 1)
    assert (tracker.confirms, tracker.admitted) == (2, 1)
    # a pod gone from the watch since its GetPreferredAllocation is looked up again too
    tracker.pod_event("DELETED", scheduled_pod("a", None))
    with pytest.raises(AllocationError):
        tracker.match(1, admitting)


def test_two_matches_of_which_one_is_gone_are_not_ambiguous(
    tracker: PodTracker, patcher: FakePatcher
) -> None:
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,))))
    tracker.pod_event("ADDED", scheduled_pod("b", alloc((GPU_B,))))
    gone_from_api(patcher, "a")
    assert tracker.match(1).pod.name == "b"
    assert names(tracker) == ["b"]
    assert [c[:3] for c in patcher.calls] == [("get-pod", "default", "a"), ("get-pod", "default", "b")]


def test_when_the_api_server_cannot_confirm_the_watch_answers(
    tracker: PodTracker, patcher: FakePatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed GET (not a 404) must not fail the admission: the watch's match stands, logged."""
    tracker.pod_event("ADDED", scheduled_pod("a", alloc((GPU_A,))))
    patcher.failures = [KubeApiError(503, "ServiceUnavailable", "busy")]
    with caplog.at_level(logging.WARNING, logger="hami_node.pods"):
        assert tracker.match(1).pod.name == "a"
    assert any(
        "confirming pod default/a failed, answering from the watch" in r.getMessage() for r in caplog.records
    )


# --- kubelet's PodResources list (`kubelet`): which pod kubelet admits ----------------------------------


class KubeletList:
    """kubelet's PodResources List as the tracker reads it: the pods kubelet lists now, each with its
    containers' devices (`listed`), or an error."""

    def __init__(self) -> None:
        self.listed: list[KubeletPod] = []
        self.error: KubeletPodsError | None = None
        self.calls = 0

    def admits(self, name: str, *held: str, containers: Sequence[str] = ("c0",)) -> None:
        """kubelet lists pod `name`, its containers in `held` with a device, the others without."""
        devices = {c: frozenset({f"{GPU_A}-0"}) if c in held else frozenset() for c in containers}
        self.listed.append(KubeletPod("default", name, devices))

    def list(self) -> Sequence[KubeletPod]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.listed)


@pytest.fixture
def kubelet() -> KubeletList:
    return KubeletList()


@pytest.fixture
def identifying(patcher: FakePatcher, kubelet: KubeletList) -> Iterator[PodTracker]:
    t = PodTracker(NODE, patcher, events=patcher, retry=FAST, kubelet=kubelet)
    t.start()
    yield t
    t.stop()


def watched(tracker: PodTracker, patcher: FakePatcher, obj: dict[str, Any]) -> None:
    """The watch shows `obj` (and the API server has it)."""
    patcher.saw("ADDED", obj)
    tracker.pod_event("ADDED", obj)


def test_two_pods_asking_as_many_gpus_are_told_apart_by_the_pod_kubelet_lists_without_devices(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    watched(identifying, patcher, scheduled_pod("a", alloc((GPU_A,))))
    watched(identifying, patcher, scheduled_pod("b", alloc((GPU_B,))))
    kubelet.admits("b")  # kubelet admits b first: a is not in its pod manager yet
    admitting = identifying.admitting(1)
    assert admitting is not None and admitting.pod.name == "b"
    match = identifying.match(1, admitting)
    identifying.allocated(match)
    kubelet.listed = []
    kubelet.admits("b", "c0")  # b holds its device now
    kubelet.admits("a")
    assert identifying.match(1).pod.name == "a"
    assert (kubelet.calls, identifying.kubelet_lists) == (2, 2)  # one List per lookup, none for b's Allocate
    assert identifying.confirms == 2  # the GET stays: List names no pod UID


def test_a_pod_kubelet_admits_that_the_watch_has_not_shown_is_read_from_the_api(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    watched(identifying, patcher, scheduled_pod("a", alloc((GPU_A,))))
    patcher.api_pods = [scheduled_pod("a", alloc((GPU_A,))), scheduled_pod("late", alloc((GPU_B,)))]
    kubelet.admits("late")  # a waits too, but kubelet admits the pod the watch has not shown
    match = identifying.match(1)
    assert match.pod.name == "late" and match.container.uuids == (GPU_B,)
    assert identifying.misses == 1


def test_the_next_container_of_the_pod_kubelet_admits_is_the_one_without_devices(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    watched(identifying, patcher, scheduled_pod("p", alloc((GPU_A,), (GPU_B,)), containers=2))
    kubelet.admits("p", containers=("c0", "c1"))
    first = identifying.match(1)
    assert first.entry == 0
    identifying.allocated(first)
    kubelet.listed = []
    kubelet.admits("p", "c0", containers=("c0", "c1"))
    assert identifying.match(1).entry == 1
    kubelet.listed = []
    kubelet.admits("p", "c0", "c1", containers=("c0", "c1"))  # admitted already: not this Allocate's
    with pytest.raises(NoPendingPodError) as err:
        identifying.match(1)
    assert "kubelet's PodResources API lists as not yet given devices: none" in err.value.message


def test_without_an_answer_from_kubelet_allocate_fails_saying_why(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    watched(identifying, patcher, scheduled_pod("a", alloc((GPU_A,))))
    kubelet.error = KubeletPodsError("kubelet's PodResources API at /x: UNAVAILABLE: connection refused")
    with pytest.raises(NoPendingPodError) as err:
        identifying.match(1)
    assert err.value.message == (
        f"cannot tell which pod kubelet is admitting on node {NODE}: kubelet's PodResources API at /x: "
        "UNAVAILABLE: connection refused"
    )
    assert identifying.admitting(1) is None  # GetPreferredAllocation spreads
    assert names(identifying) == ["a"]  # still waiting


def test_a_foreign_gpu_pod_kubelet_lists_without_devices_is_the_one_it_admits(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    watched(identifying, patcher, scheduled_pod("ours", alloc((GPU_A,))))
    watched(identifying, patcher, foreign("stray"))
    kubelet.admits("stray")
    with pytest.raises(ForeignPodError) as err:
        identifying.match(1)
    assert "for pod default/stray, which is bound to node" in err.value.message
    kubelet.listed = []
    kubelet.admits("ours")
    assert identifying.match(1).pod.name == "ours"


def test_a_pod_created_again_under_the_name_kubelet_lists_is_told_apart_by_the_get(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    """List names no UID: the watch still shows the deleted a, kubelet admits the new a (same name);
    the GET shows another UID, so the watch's a is replaced by what the GET showed (confirmed in turn)."""
    watched(identifying, patcher, scheduled_pod("a", alloc((GPU_A,))))
    gone_from_api(patcher, "a")
    again = scheduled_pod("a", alloc((GPU_B,)), uid="uid-again")
    patcher.api_pods = [again]
    kubelet.admits("a")
    match = identifying.match(1)
    assert (match.pod.uid, match.container.uuids) == ("uid-again", (GPU_B,))
    assert (identifying.stale, identifying.misses, identifying.confirms) == (1, 0, 2)


def test_an_old_kubelet_listing_a_pod_it_rejected_never_gets_that_pods_gpus_for_another(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    """kubelets before 1.29 list the pods they rejected too (no devices). The watch still shows a
    waiting; kubelet admits b, which the watch has not shown: kubelet lists a pod the watch does not
    know, so the API is read first; then a and b both qualify, and the GETs decide. While a's Failed
    status is not written yet, the answer is an ambiguity error, never a's GPUs for b."""
    watched(identifying, patcher, scheduled_pod("a", alloc((GPU_A,))))
    b = scheduled_pod("b", alloc((GPU_B,)))
    patcher.api_pods = [scheduled_pod("a", alloc((GPU_A,))), b]
    kubelet.admits("a")
    kubelet.admits("b")
    with pytest.raises(AmbiguousPodError):
        identifying.match(1)
    assert identifying.misses == 1
    patcher.api_pods = [scheduled_pod("a", alloc((GPU_A,)), phase="Failed"), b]
    assert identifying.match(1).pod.name == "b"


def test_a_deleted_pod_kubelet_still_lists_costs_no_read_of_the_node_pods(
    identifying: PodTracker, patcher: FakePatcher, kubelet: KubeletList
) -> None:
    """kubelet lists a pod until it has stopped it; the watch showing it deleted is ahead, not behind."""
    watched(identifying, patcher, scheduled_pod("gone", alloc((GPU_A,))))
    identifying.pod_event("DELETED", scheduled_pod("gone", alloc((GPU_A,))))
    watched(identifying, patcher, scheduled_pod("b", alloc((GPU_B,))))
    kubelet.admits("gone")
    kubelet.admits("b")
    assert identifying.match(1).pod.name == "b"
    assert identifying.misses == 0
