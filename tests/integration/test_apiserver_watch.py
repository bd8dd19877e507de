"""Watch: ordered ADDED/MODIFIED/DELETED, resume from a resourceVersion, 410 Gone, timeouts,
bookmarks, selectors, slow watchers, the async client and kubectl's legacy paths."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client import ApiException

from hami_sim.apiserver import ApiServerRunner
from hami_sim.apiserver.strategy import POD
from tests.apiserver_util import bind
from tests.builders import pod

WATCH: Any = watch.Watch  # the client's watch module is untyped


def read_events(response: Any) -> list[dict[str, Any]]:
    """All events of a raw watch response until the server ends the stream."""
    events = [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]
    response.release_conn()
    return events


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def test_watch_sees_exact_events_in_order(core_v1: Any) -> None:
    start = core_v1.list_namespaced_pod("default").metadata.resource_version
    response = core_v1.list_namespaced_pod(
        "default", watch=True, resource_version=start, timeout_seconds=1, _preload_content=False
    )
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Transfer-Encoding"] == "chunked"
    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.create_namespaced_pod("kube-system", pod("elsewhere"))
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core_v1.delete_namespaced_pod("p", "default")
    events = read_events(response)
    assert kinds(events) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert versions[0] > int(start)
    assert events[1]["object"]["metadata"]["labels"] == {"a": "b"}


def test_watch_through_the_client_helper(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("a"))
    rv = core_v1.patch_namespaced_pod(
        "a", "default", {"metadata": {"labels": {"x": "1"}}}
    ).metadata.resource_version
    core_v1.create_namespaced_pod("default", pod("b"))
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in WATCH().stream(
            core_v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "b")]


def test_watch_without_resource_version_starts_with_current_objects(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("a"))
    core_v1.create_namespaced_pod("default", pod("b"))
    for rv in (None, "0"):
        kwargs: dict[str, Any] = {"timeout_seconds": 1, "_preload_content": False, "watch": True}
        if rv is not None:
            kwargs["resource_version"] = rv
        events = read_events(core_v1.list_namespaced_pod("default", **kwargs))
        assert kinds(events) == [("ADDED", "a"), ("ADDED", "b")]


def test_too_old_resource_version_is_gone() -> None:
    with (
        ApiServerRunner(history_size=5) as runner,
        client.ApiClient(client.Configuration(host=runner.base_url)) as api,
    ):
        v1: Any = client.CoreV1Api(api)
        first = v1.create_namespaced_pod("default", pod("p"))
        for i in range(10):
            v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"i": str(i)}}})
        events = read_events(
            v1.list_namespaced_pod(
                "default",
                watch=True,
                resource_version=first.metadata.resource_version,
                timeout_seconds=5,
                _preload_content=False,
            )
        )
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        oldest = runner.call(runner.store.oldest_resource_version, POD)
        assert status["message"] == f"too old resource version: {first.metadata.resource_version} ({oldest})"
        with pytest.raises(ApiException) as err:
            list(
                WATCH().stream(
                    v1.list_namespaced_pod,
                    "default",
                    resource_version=first.metadata.resource_version,
                    timeout_seconds=5,
                )
            )
        assert err.value.status == 410
        # A recent version is still served.
        recent = str(oldest + 1)
        assert all(e["type"] == "MODIFIED" for e in read_events(
            v1.list_namespaced_pod("default", watch=True, resource_version=recent, timeout_seconds=1,
                                   _preload_content=False)
        ))  # fmt: skip


def test_timeout_seconds_ends_the_stream(core_v1: Any) -> None:
    started = time.monotonic()
    events = read_events(
        core_v1.list_node(watch=True, resource_version="1", timeout_seconds=1, _preload_content=False)
    )
    elapsed = time.monotonic() - started
    assert events == []
    assert 0.9 <= elapsed < 5.0


def test_bookmarks(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    current = core_v1.list_namespaced_pod("default").metadata.resource_version
    events = read_events(
        core_v1.list_namespaced_pod(
            "default",
            watch=True,
            resource_version=current,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            _preload_content=False,
        )
    )
    assert events, "no bookmark arrived"
    assert all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": current},
    }


def test_send_initial_events_ends_with_an_annotated_bookmark(core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    events = read_events(
        core_v1.list_namespaced_pod(
            "default",
            watch=True,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            _preload_content=False,
        )
    )
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_label_selector_on_watch_turns_changes_into_added_and_deleted(core_v1: Any) -> None:
    start = core_v1.list_namespaced_pod("default").metadata.resource_version
    core_v1.create_namespaced_pod("default", pod("p", labels={"app": "x"}))
    core_v1.create_namespaced_pod("default", pod("q", labels={"app": "y"}))
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "y"}}})
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "x", "v": "2"}}})
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "x", "v": "3"}}})
    events = read_events(
        core_v1.list_namespaced_pod(
            "default", watch=True, resource_version=start, label_selector="app=x", timeout_seconds=1,
            _preload_content=False,
        )
    )  # fmt: skip
    assert kinds(events) == [("ADDED", "p"), ("DELETED", "p"), ("ADDED", "p"), ("MODIFIED", "p")]
    # The DELETED event carries the last matching state at the new resourceVersion (kube's cacher).
    assert events[1]["object"]["metadata"]["labels"] == {"app": "x"}
    assert int(events[1]["object"]["metadata"]["resourceVersion"]) > int(
        events[0]["object"]["metadata"]["resourceVersion"]
    )


def test_node_name_field_selector_on_watch(core_v1: Any) -> None:
    """What a kubelet does: watch spec.nodeName=<node>; a pod appears when bound to it."""
    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.create_namespaced_pod("default", pod("q"))
    response = core_v1.list_pod_for_all_namespaces(
        watch=True, field_selector="spec.nodeName=n1", timeout_seconds=1, _preload_content=False
    )
    bind(core_v1, "default", "p", "n1")
    bind(core_v1, "default", "q", "n2")
    core_v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    # No kubelet runs n1: a force deletion (grace 0), as a person deletes a pod of a dead node.
    core_v1.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    events = read_events(response)
    assert kinds(events) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_slow_watcher_is_dropped_without_blocking_writers() -> None:
    with (
        ApiServerRunner(watch_queue=10) as runner,
        client.ApiClient(client.Configuration(host=runner.base_url)) as api,
    ):
        v1: Any = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", pod("p"))
        response = v1.list_namespaced_pod("default", watch=True, resource_version="0", timeout_seconds=30,
                                          _preload_content=False)  # fmt: skip

        def burst() -> int:
            store = runner.store
            for i in range(50):  # 50 events in one loop turn: the watcher cannot drain in between
                old = store.get(POD, "default", "p")
                obj = {**old.obj, "metadata": {**old.obj["metadata"], "labels": {"i": str(i)}}}
                store.update(POD, obj, old)
            return int(store.resource_version)

        started = time.monotonic()
        last = runner.call(burst)
        events = read_events(response)  # the server closed the stream long before its 30 s timeout
        assert time.monotonic() - started < 10
        assert len(events) < 50
        assert runner.call(lambda: len(runner.store.watchers())) == 0
        assert int(v1.read_namespaced_pod("p", "default").metadata.resource_version) == last


def test_async_watch(apiserver: Any) -> None:
    from kubernetes.aio import client as aclient
    from kubernetes.aio import watch as awatch

    AWATCH: Any = awatch.Watch

    async def scenario() -> list[tuple[str, str]]:
        async with aclient.ApiClient(aclient.Configuration(host=apiserver.base_url)) as api:
            v1: Any = aclient.CoreV1Api(api)
            start = (await v1.list_namespaced_pod("default")).metadata.resource_version
            await v1.create_namespaced_pod("default", pod("p"))
            await v1.delete_namespaced_pod("p", "default")
            seen: list[tuple[str, str]] = []
            async with AWATCH() as w:
                async for event in w.stream(
                    v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1
                ):
                    seen.append((event["type"], event["object"].metadata.name))
            return seen

    assert asyncio.run(scenario()) == [("ADDED", "p"), ("DELETED", "p")]


def test_legacy_watch_path_and_single_object_watch(apiserver: Any, core_v1: Any) -> None:
    import urllib3

    core_v1.create_namespaced_pod("default", pod("a"))
    core_v1.create_namespaced_pod("default", pod("b"))
    with urllib3.PoolManager() as pool:
        response = pool.request(
            "GET",
            apiserver.base_url + "/api/v1/watch/namespaces/default/pods/b?timeoutSeconds=1",
            timeout=10.0,
        )
    events = [json.loads(line) for line in response.data.decode().splitlines() if line]
    assert kinds(events) == [("ADDED", "b")]


def test_watch_works_after_the_runner_restarts() -> None:
    """A stopped and restarted server (the 'API server down' scenario of the node daemon's tests)
    keeps its objects and serves watches again instead of closing them at once."""
    runner = ApiServerRunner()
    runner.start()
    try:
        api = client.CoreV1Api(client.ApiClient(client.Configuration(host=runner.base_url)))
        api.create_namespaced_pod("default", pod("before"))
        port = runner.port
        runner.stop()
        runner.port = port
        runner.start()
        start = api.list_namespaced_pod("default").metadata.resource_version
        response = api.list_namespaced_pod(
            "default", watch=True, resource_version=start, timeout_seconds=1, _preload_content=False
        )
        api.create_namespaced_pod("default", pod("after"))
        assert kinds(read_events(response)) == [("ADDED", "after")]
        api.api_client.close()
    finally:
        runner.stop()
