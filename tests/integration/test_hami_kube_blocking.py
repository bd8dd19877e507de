"""hami_kube's blocking bridge against the local API server: calls from plain threads (answers, typed
errors, no answer), a call past its timeout, a reflector on the bridge's loop fed to a sink on that
loop's thread (stop, then start resumes without a relist), and close() ending the loop's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hami_kube.backoff import RetryPolicy
from hami_kube.blocking import BlockingKubeApi
from hami_kube.client import JSONDict
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.reflector import ListSink
from tests.conftest import ApiServerHandle

FAST = RetryPolicy(initial=0.01, maximum=0.05)
DEADLINE = 10.0
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def config_map(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "1"}}


@pytest.fixture
def bridge(apiserver: ApiServerHandle) -> Iterator[BlockingKubeApi]:
    b = BlockingKubeApi.connect(apiserver.kubeconfig, name="test-kube-loop")
    try:
        yield b
    finally:
        b.close()


class Recorder:
    """A sink's two callables: records what it is fed and on which thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lists: list[list[str]] = []
        self.changes: list[tuple[str, str]] = []
        self.threads: set[str] = set()

    def replace(self, items: Sequence[JSONDict]) -> None:
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.lists.append(sorted(i["metadata"]["name"] for i in items))
            self.cond.notify_all()

    def apply(self, kind: str, obj: JSONDict) -> None:
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.changes.append((kind, obj["metadata"]["name"]))
            self.cond.notify_all()

    def wait(self, what: tuple[str, str]) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: what in self.changes, DEADLINE), self.changes


def test_threads_get_answers_and_typed_errors_through_one_loop(
    bridge: BlockingKubeApi, apiserver: ApiServerHandle
) -> None:
    created = bridge.request("POST", CONFIGMAPS, config_map("a"))
    assert created["metadata"]["name"] == "a"
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: bridge.get(f"{CONFIGMAPS}/a")["data"], range(32)))
    assert answers == [{"v": "1"}] * 32
    listed = bridge.get(CONFIGMAPS, {"fieldSelector": "metadata.name=a"}, timeout_s=2.0)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]

    with pytest.raises(KubeApiError) as err:
        bridge.get(f"{CONFIGMAPS}/absent")
    assert (err.value.status, err.value.reason, err.value.not_found, err.value.retriable) == (
        404, "NotFound", True, False,
    )  # fmt: skip
    apiserver.runner.stop()
    with pytest.raises(KubeApiError) as err:
        bridge.get(f"{CONFIGMAPS}/a")
    assert (err.value.status, err.value.retriable) == (0, True)


def test_a_call_past_its_timeout_is_cancelled_and_raises_status_0(bridge: BlockingKubeApi) -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(KubeApiError) as err:
        bridge.run(slow(), 0.05)
    assert (err.value.status, err.value.reason, err.value.retriable) == (0, "TimeoutError", True)
    assert cancelled.wait(DEADLINE)


def test_a_blocking_call_on_the_loops_own_thread_raises_instead_of_hanging(bridge: BlockingKubeApi) -> None:
    async def call_back() -> None:
        bridge.get(CONFIGMAPS)

    with pytest.raises(RuntimeError, match="own event loop"):
        bridge.run(call_back(), DEADLINE)


def test_reflector_feeds_the_sink_on_the_loop_thread_and_resumes_after_stop(bridge: BlockingKubeApi) -> None:
    bridge.request("POST", CONFIGMAPS, config_map("before"))
    recorder = Recorder()
    sink = ListSink(recorder.replace, recorder.apply)
    reflector = bridge.start_reflector("configmaps", CONFIGMAPS, sink, retry=FAST)
    assert reflector.wait_synced(DEADLINE)
    assert recorder.lists == [["before"]]
    bridge.request("POST", CONFIGMAPS, config_map("one"))
    recorder.wait(("ADDED", "one"))

    reflector.stop()
    bridge.request("POST", CONFIGMAPS, config_map("while-stopped"))
    reflector.start()
    recorder.wait(("ADDED", "while-stopped"))  # resumed from the last version seen ...
    assert reflector.lists == 1  # ... without a relist
    assert reflector.watches == 2
    assert recorder.threads == {"test-kube-loop"}


def test_close_stops_the_reflectors_and_the_loop_thread_and_later_calls_fail(
    apiserver: ApiServerHandle,
) -> None:
    bridge = BlockingKubeApi.connect(apiserver.kubeconfig, name="closing-kube-loop")
    recorder = Recorder()
    reflector = bridge.start_reflector("configmaps", CONFIGMAPS, ListSink(recorder.replace, recorder.apply))
    assert reflector.wait_synced(DEADLINE)
    bridge.close()
    assert not any(t.name == "closing-kube-loop" for t in threading.enumerate())
    with pytest.raises(KubeApiError) as err:
        bridge.get(CONFIGMAPS)
    assert (err.value.status, err.value.reason) == (0, "Closed")
    bridge.close()  # idempotent


def test_connect_raises_the_configuration_error_and_leaves_no_thread(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError, match=f"kubeconfig {missing} \\(--kubeconfig\\): no such file"):
        BlockingKubeApi.connect(missing, name="failing-kube-loop")
    assert not any(t.name == "failing-kube-loop" for t in threading.enumerate())
