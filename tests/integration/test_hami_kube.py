"""hami_kube against the local API server: the client's answers and errors, configuration errors, and the
reflector (paged list, every change in order, bookmarks, resume after a dropped watch, relist after 410,
backoff while the API fails, a sink that fails on one event)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_kube.backoff import RetryPolicy
from hami_kube.client import JSONDict, KubeApi, PatchType
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.reflector import ListSink, Reflector
from hami_sim.apiserver import ApiServerRunner
from tests.builders import pod
from tests.control_server_util import LoopThread
from tests.waiting import wait_for

FAST = RetryPolicy(initial=0.01, maximum=0.05)


def config_map(name: str, value: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}


class FaultyApi(KubeApi):
    """The real client with two fault switches: a gate that holds the next watch back, and a count of
    list calls to fail with 503 (as an overloaded API server answers)."""

    gate: asyncio.Event
    fail_lists = 0
    lists_failed = 0

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict:
        if self.fail_lists > 0:
            self.fail_lists -= 1
            self.lists_failed += 1
            raise KubeApiError(503, "ServiceUnavailable", "injected by the test")
        return await super().get(path, params)

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[JSONDict]]:
        await self.gate.wait()
        async with super().watch(path, resource_version, timeout_s, params) as events:
            yield events


@dataclass
class Recorder:
    """A sink that records what it is fed; `explode_on` makes it fail on that object's events."""

    lists: list[list[str]] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    explode_on: str = ""

    def replace(self, items: Sequence[JSONDict]) -> None:
        self.lists.append([i["metadata"]["name"] for i in items])

    def apply(self, kind: str, obj: JSONDict) -> None:
        name = obj["metadata"]["name"]
        if name == self.explode_on:
            raise RuntimeError("the store failed")
        self.changes.append((kind, name))


@dataclass
class Rig:
    runner: ApiServerRunner
    loop: LoopThread
    api: FaultyApi
    core_v1: Any
    kubeconfig: Path

    def reflector(self, recorder: Recorder, **options: Any) -> Reflector:
        sink = ListSink(recorder.replace, recorder.apply)
        path = "/api/v1/namespaces/default/configmaps"
        return Reflector(self.api, "configmaps", path, sink, retry=FAST, rng=random.Random(1), **options)

    def run(self, reflector: Reflector) -> None:
        self.loop.submit(reflector.run())

    def close_watches(self) -> None:
        def close() -> None:
            for watcher in self.runner.store.watchers():
                watcher.close()

        self.runner.call(close)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with ApiServerRunner(history_size=5, bookmark_interval=0.05) as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        loop = LoopThread()

        async def connect() -> FaultyApi:
            api = await FaultyApi.connect(kubeconfig)
            api.gate = asyncio.Event()
            api.gate.set()
            return api

        api = loop.call(connect)
        try:
            with client.ApiClient(client.Configuration(host=runner.base_url)) as api_client:
                yield Rig(runner, loop, api, client.CoreV1Api(api_client), kubeconfig)
        finally:
            loop.call(api.close)
            loop.close()


# --- the client ---------------------------------------------------------------------------------------------


def test_probe_answers_the_status_of_a_health_get_and_0_when_nothing_answers(rig: Rig) -> None:
    assert rig.loop.call(lambda: rig.api.probe("/readyz", 5.0)) == 200  # a text body, not JSON
    assert rig.loop.call(lambda: rig.api.probe("/no-such-route", 5.0)) == 404
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: the connection is refused

        async def refused() -> int:
            async with KubeApi(f"http://127.0.0.1:{port}", None) as api:
                return await api.probe("/readyz", 5.0)

        assert rig.loop.call(refused) == 0


def test_request_answers_json_objects_and_errors_carry_status_reason_and_message(rig: Rig) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    created = rig.loop.call(lambda: rig.api.request("POST", path, config_map("a")))
    assert created["metadata"]["name"] == "a" and created["data"] == {"v": "1"}
    patch = {"metadata": {"labels": {"x": "y"}}}
    patched = rig.loop.call(
        lambda: rig.api.request("PATCH", f"{path}/a", patch, content_type="application/merge-patch+json")
    )
    assert patched["metadata"]["labels"] == {"x": "y"}
    assert rig.loop.call(lambda: rig.api.get(f"{path}/a"))["data"] == {"v": "1"}
    with pytest.raises(KubeApiError) as info:
        rig.loop.call(lambda: rig.api.get(f"{path}/missing"))
    assert (info.value.status, info.value.reason) == (404, "NotFound")
    assert "missing" in info.value.message
    with pytest.raises(KubeApiError) as info:
        rig.loop.call(lambda: rig.api.request("POST", path, config_map("a")))
    assert (info.value.status, info.value.reason) == (409, "AlreadyExists")


def test_get_if_exists_answers_the_object_or_none_when_it_does_not_exist(rig: Rig) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    rig.loop.call(lambda: rig.api.request("POST", path, config_map("here")))
    found = rig.loop.call(lambda: rig.api.get_if_exists(f"{path}/here"))
    assert found is not None and found["data"] == {"v": "1"}
    assert rig.loop.call(lambda: rig.api.get_if_exists(f"{path}/missing")) is None


def test_no_answer_is_status_0_with_the_transport_error(rig: Rig) -> None:
    async def refused() -> None:
        async with KubeApi("http://127.0.0.1:1", None, connect_timeout_s=1.0) as api:
            await api.get("/api/v1/pods")

    with pytest.raises(KubeApiError) as info:
        rig.loop.call(refused)
    assert info.value.status == 0 and info.value.reason and not info.value.gone


def test_connect_names_a_missing_kubeconfig_and_the_flag_it_came_from(rig: Rig, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError, match=rf"kubeconfig {missing} \(--kubeconfig\): no such file"):
        rig.loop.call(lambda: KubeApi.connect(missing))
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nclusters: 7\n")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {bad}: clusters: not a list, got int 7"):
        rig.loop.call(lambda: KubeApi.connect(bad, flag="HAMI_KUBECONFIG"))


# --- the reflector ------------------------------------------------------------------------------------------


def test_reflector_lists_in_pages_then_feeds_every_change_in_order(rig: Rig) -> None:
    for i in range(5):
        rig.core_v1.create_namespaced_config_map("default", config_map(f"cm-{i}"))
    recorder = Recorder()
    reflector = rig.reflector(recorder, page_size=2)
    rig.run(reflector)
    wait_for(reflector.synced.is_set, what="the first list")
    assert recorder.lists == [[f"cm-{i}" for i in range(5)]] and reflector.lists == 1
    rig.core_v1.create_namespaced_config_map("default", config_map("new"))
    rig.core_v1.patch_namespaced_config_map("cm-0", "default", {"data": {"v": "2"}})
    rig.core_v1.delete_namespaced_config_map("cm-1", "default")
    wait_for(lambda: len(recorder.changes) == 3, what="three changes")
    assert recorder.changes == [("ADDED", "new"), ("MODIFIED", "cm-0"), ("DELETED", "cm-1")]


def test_reflector_follows_bookmarks_without_feeding_them(rig: Rig) -> None:
    recorder = Recorder()
    reflector = rig.reflector(recorder)
    rig.run(reflector)
    wait_for(reflector.synced.is_set, what="the first list")
    before = reflector.resource_version
    # A change to another resource moves the server's version; only a bookmark tells this watch.
    rig.core_v1.create_namespace({"metadata": {"name": "elsewhere"}})
    latest = str(rig.runner.call(lambda: rig.runner.store.resource_version))
    wait_for(lambda: reflector.resource_version == latest, what="a bookmark with the new version")
    assert before != latest and recorder.changes == []


def test_reflector_resumes_a_dropped_watch_and_relists_after_410(rig: Rig) -> None:
    recorder = Recorder()
    reflector = rig.reflector(recorder)
    rig.run(reflector)
    wait_for(reflector.synced.is_set, what="the first list")
    # Dropped while changes happen: the next watch resumes from its version, nothing missed, no relist.
    rig.loop.run_sync(rig.api.gate.clear)
    rig.close_watches()
    rig.core_v1.create_namespaced_config_map("default", config_map("a"))
    rig.core_v1.create_namespaced_config_map("default", config_map("b"))
    rig.loop.run_sync(rig.api.gate.set)
    wait_for(lambda: recorder.changes == [("ADDED", "a"), ("ADDED", "b")], what="a and b after the resume")
    assert reflector.lists == 1
    # Held back while more happens than the server keeps (history 5): 410 Gone, then a relist.
    rig.loop.run_sync(rig.api.gate.clear)
    rig.close_watches()
    for i in range(8):
        rig.core_v1.create_namespaced_config_map("default", config_map(f"burst-{i}"))
    rig.loop.run_sync(rig.api.gate.set)
    wait_for(lambda: reflector.lists == 2, what="the relist after 410")
    assert recorder.lists[-1] == sorted(["a", "b", *(f"burst-{i}" for i in range(8))])


def test_reflector_backs_off_while_lists_fail_then_recovers(rig: Rig) -> None:
    rig.api.fail_lists = 3
    recorder = Recorder()
    reflector = rig.reflector(recorder)
    rig.run(reflector)
    wait_for(reflector.synced.is_set, what="the list once the API answers again")
    assert rig.api.lists_failed == 3 and recorder.lists == [[]]
    wait_for(lambda: reflector.failures == 0, what="the failure count reset")


def test_retry_policy_doubles_up_to_its_maximum_less_up_to_its_jitter() -> None:
    rng = random.Random(7)
    delays = [FAST.delay(n, rng) for n in (1, 2, 3, 4, 30)]
    for delay, base in zip(delays, (0.01, 0.02, 0.04, 0.05, 0.05), strict=True):
        assert base * 0.8 <= delay <= base
    with pytest.raises(ValueError, match="initial <= maximum"):
        RetryPolicy(initial=2.0, maximum=1.0)


def test_a_sink_that_fails_on_one_event_does_not_stop_the_watch(rig: Rig) -> None:
    recorder = Recorder(explode_on="bad")
    reflector = rig.reflector(recorder)
    rig.run(reflector)
    wait_for(reflector.synced.is_set, what="the first list")
    rig.core_v1.create_namespaced_config_map("default", config_map("bad"))
    rig.core_v1.create_namespaced_config_map("default", config_map("good"))
    wait_for(lambda: recorder.changes == [("ADDED", "good")], what="the event after the failing one")
    assert reflector.lists == 1


def test_patch_types_and_bind_helpers_reach_the_api_server_as_kubectl_would_send_them(rig: Rig) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    rig.loop.call(lambda: rig.api.request("POST", path, {"metadata": {"name": "p"}, "data": {"a": "1"}}))
    merged = rig.loop.call(lambda: rig.api.patch(f"{path}/p", {"data": {"b": "2"}}))
    assert merged["data"] == {"a": "1", "b": "2"}
    ops = [{"op": "replace", "path": "/data/a", "value": "3"}]
    assert rig.loop.call(lambda: rig.api.patch(f"{path}/p", ops, PatchType.JSON))["data"] == {
        "a": "3",
        "b": "2",
    }
    strategic = rig.loop.call(lambda: rig.api.patch(f"{path}/p", {"data": {"b": None}}, PatchType.STRATEGIC))
    assert strategic["data"] == {"a": "3"}
    pods = "/api/v1/namespaces/default/pods"
    created = rig.loop.call(lambda: rig.api.request("POST", pods, pod("bound")))
    uid = created["metadata"]["uid"]
    with pytest.raises(KubeApiError) as wrong_uid:
        rig.loop.call(lambda: rig.api.bind("default", "bound", "node-1", uid="not-" + uid))
    assert wrong_uid.value.status == 409
    rig.loop.call(lambda: rig.api.bind("default", "bound", "node-1", uid=uid, annotations={"hami.io/x": "y"}))
    bound = rig.loop.call(lambda: rig.api.get(f"{pods}/bound"))
    assert bound["spec"]["nodeName"] == "node-1"
    assert bound["metadata"]["annotations"]["hami.io/x"] == "y"
