"""hami_node.dra.publisher.SlicePublisher against an in-memory API (the calls it makes, with
resourceVersions and 409s as the API server answers them) and a real DeviceState: nothing is written
before the slices are known, a late watch event never causes a second create, a conflict re-reads,
a failing annotation cleanup does not stop publishing, and whole GPUs follow a dropped
allowMultipleAllocations once."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_kube.backoff import RetryPolicy
from hami_kube.errors import KubeApiError
from hami_node.config import load_config
from hami_node.devices import DeviceState
from hami_node.dra.publisher import NO_CONSUMABLE_CAPACITY_REASON, SlicePublisher
from hami_node.health import xid_reason
from tests.builders import physical_gpu
from tests.waiting import wait_for

CONFIG = load_config(["--node-name", "n1", "--mode", "dra"], {}, lambda p: "")
FAST = RetryPolicy(initial=0.01, maximum=0.05)


class Api:
    """Slices by name with resourceVersions; the Node; what was called."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slices: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.versions = itertools.count(1)
        self.names = itertools.count(1)
        self.node: dict[str, Any] = {"metadata": {"name": "n1", "uid": "node-uid", "annotations": {}}}
        self.patch_error: KubeApiError | None = None
        self.drop_consumable = False
        self.conflicts = 0
        self.events: list[tuple[str, str]] = []

    def get_node(self, name: str) -> Mapping[str, Any]:
        self.calls.append("get node")
        return copy.deepcopy(self.node)

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]:
        self.calls.append("patch node")
        if self.patch_error is not None:
            raise self.patch_error
        current = self.node["metadata"]["annotations"]
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return self.node

    def list_resource_slices(self, field_selector: str) -> list[dict[str, Any]]:
        self.calls.append("list")
        with self.lock:
            return copy.deepcopy(list(self.slices.values()))

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(next(self.versions))
        if self.drop_consumable:
            for device in body["spec"]["devices"]:
                device.pop("allowMultipleAllocations", None)
                for capacity in device["capacity"].values():
                    capacity.pop("requestPolicy", None)
        return body

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        body = copy.deepcopy(body)
        body["metadata"]["name"] = body["metadata"].pop("generateName") + f"x{next(self.names)}"
        body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
        stored = self._stored(body)
        with self.lock:
            self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def update_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("update")
        with self.lock:
            current = self.slices[name]
            if (
                self.conflicts
                or body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]
            ):
                self.conflicts = max(0, self.conflicts - 1)
                raise KubeApiError(409, "Conflict", "the object has been modified")
            stored = self._stored(body)
            self.slices[name] = stored
        return copy.deepcopy(stored)

    def delete_resource_slice(self, name: str, uid: str = "", resource_version: str = "") -> None:
        self.calls.append("delete")
        with self.lock:
            self.slices.pop(name, None)

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, kind: str = "Pod"
    ) -> None:
        self.events.append((kind, reason))


@pytest.fixture
def state() -> DeviceState:
    state = DeviceState(CONFIG)
    state.set_gpus([physical_gpu("GPU-0", 0), physical_gpu("GPU-1", 1)], 0.0)
    return state


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def publisher(state: DeviceState, api: Api) -> Iterator[SlicePublisher]:
    publisher = SlicePublisher(CONFIG, state, api, events=api, now=lambda: 1_700_000_000.0, retry=FAST)
    publisher.start()
    yield publisher
    publisher.stop()


def only_slice(api: Api) -> dict[str, Any]:
    """The one slice stored ({} while there is not exactly one)."""
    with api.lock:
        return copy.deepcopy(next(iter(api.slices.values()))) if len(api.slices) == 1 else {}


def devices(api: Api) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = only_slice(api).get("spec", {}).get("devices", [])
    return found


def test_nothing_is_written_before_the_slices_the_api_server_holds_are_known(
    publisher: SlicePublisher, api: Api
) -> None:
    assert not publisher.wait_writes(0, 0.2)
    publisher.slices_listed([])
    assert publisher.wait_writes(0, 5.0)
    wait_for(lambda: publisher.synced, 5.0, "the slice to be published")
    assert only_slice(api)["spec"]["pool"]["generation"] == 1


def test_a_late_watch_event_of_an_older_version_does_not_bring_a_second_create(
    publisher: SlicePublisher, api: Api, state: DeviceState
) -> None:
    publisher.slices_listed([])
    wait_for(lambda: publisher.synced, 5.0, "the slice")
    created = only_slice(api)
    state.mark_unhealthy("GPU-0", xid_reason(79), 1.0)
    wait_for(
        lambda: only_slice(api).get("spec", {}).get("pool", {}).get("generation") == 2, 5.0, "the update"
    )
    publisher.slice_event("ADDED", created)  # the create's event, arriving after the update
    writes = publisher.writes
    assert not publisher.wait_writes(writes, 0.3)
    assert api.calls.count("create") == 1


def test_a_conflict_reads_the_slices_again_and_the_update_goes_through(
    publisher: SlicePublisher, api: Api, state: DeviceState
) -> None:
    publisher.slices_listed([])
    wait_for(lambda: publisher.synced, 5.0, "the slice")
    api.conflicts = 1
    state.mark_unhealthy("GPU-1", xid_reason(48), 1.0)
    wait_for(lambda: devices(api) and devices(api)[1].get("taints"), 5.0, "the taint after a conflict")
    assert "list" in api.calls


def test_the_slice_comes_back_when_deleted_with_the_taint_time_kept_across_writes(
    publisher: SlicePublisher, api: Api, state: DeviceState
) -> None:
    publisher.slices_listed([])
    state.mark_unhealthy("GPU-0", xid_reason(79), 1.0)
    tainted = wait_for(lambda: devices(api) and devices(api)[0].get("taints"), 5.0, "the taint")
    assert tainted[0]["timeAdded"] == "2023-11-14T22:13:20Z"
    gone = only_slice(api)
    api.delete_resource_slice(gone["metadata"]["name"])
    publisher.slice_event("DELETED", gone)
    wait_for(lambda: len(api.slices) == 1 and gone["metadata"]["name"] not in api.slices, 5.0, "a new slice")
    assert devices(api)[0]["taints"] == tainted


def test_a_failing_annotation_cleanup_does_not_stop_publishing(
    state: DeviceState, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    api.node["metadata"]["annotations"] = {ann.NODE_REGISTER: "[]"}
    api.patch_error = KubeApiError(403, "Forbidden", "nodes is forbidden")
    publisher = SlicePublisher(CONFIG, state, api, retry=FAST)
    publisher.start()
    try:
        publisher.slices_listed([])
        wait_for(lambda: publisher.synced, 5.0, "the slice")
        assert "grant patch on nodes" in caplog.text
    finally:
        publisher.stop()


def test_without_consumable_capacity_whole_gpus_are_published_and_it_is_said_once(
    publisher: SlicePublisher, api: Api, state: DeviceState
) -> None:
    api.drop_consumable = True
    publisher.slices_listed([])
    wait_for(lambda: publisher.synced, 5.0, "the slice")
    assert not publisher.consumable
    assert api.events == [("Node", NO_CONSUMABLE_CAPACITY_REASON)]
    state.mark_unhealthy("GPU-0", xid_reason(79), 1.0)
    wait_for(lambda: devices(api) and devices(api)[0].get("taints"), 5.0, "the taint")
    assert api.events == [("Node", NO_CONSUMABLE_CAPACITY_REASON)]
    assert api.calls.count("create") == 1


def test_a_slice_deleted_before_its_create_answers_is_published_again(
    publisher: SlicePublisher, api: Api
) -> None:
    # kubelet wipes the node's slices when it starts: the watch can deliver the new slice's ADDED and
    # DELETED before the create's answer, which must not put the deleted slice back in the store.
    create = api.create_resource_slice
    first = True

    def create_then_wiped(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal first
        stored = create(body)
        if first:
            first = False
            api.delete_resource_slice(stored["metadata"]["name"])
            deleted = copy.deepcopy(stored)
            deleted["metadata"]["resourceVersion"] = str(next(api.versions))
            publisher.slice_event("ADDED", stored)
            publisher.slice_event("DELETED", deleted)
        return stored

    api.create_resource_slice = create_then_wiped  # type: ignore[method-assign]
    publisher.slices_listed([])
    wait_for(lambda: api.calls.count("create") == 2 and len(api.slices) == 1, 5.0, "the slice again")
