"""Two extender entries as the fragmentation component configures them, and `ignorable` as kube-scheduler
handles it: HAMi's GPU extender (managedResources, bind, not ignorable) and a second entry with no
managedResources (so IsInterested is true for every pod) that is ignorable.

kube-scheduler (pkg/scheduler/schedule_one.go): `findNodesThatPassExtenders` calls each interested
extender's Filter in order and, on an error (connection refused, timeout, a non-200 answer, an `Error`
field) skips an `IsIgnorable()` extender ("Skipping extender as it returned error and has ignorable flag
set") and ends the cycle for any other; `prioritizeNodes` ignores every extender's Prioritize error,
ignorable or not ("No score given by this extender"); `extendersBinding` skips an ignorable binder's
error. The stand-in must do the same."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from hami_sim.scheduler import SchedulerRunner
from hami_sim.scheduler.config import parse_configuration, scheduler_config
from hami_sim.tls import generate_ca, generate_serving_cert
from tests.builders import container, gpu_pod, node, pod
from tests.conftest import ApiServerHandle
from tests.integration.extender_stub import ExtenderStub
from tests.waiting import wait_for

NS = "default"
HAMI = "hami-scheduler"
RESOURCES = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}


class CpuVerbs:
    """The second entry's endpoint over plain HTTP, in one of four modes: `ok` (every node passes,
    /cpu-prioritize gives `scores`), `500` (every verb answers HTTP 500), `prioritize-500` (filter ok,
    prioritize 500), `hang` (the connection is accepted and never answered: the call times out)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls: list[str] = []
        self.scores: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                verb = self.path.strip("/")
                outer.calls.append(verb)
                if outer.mode == "500" or (outer.mode == "prioritize-500" and verb == "cpu-prioritize"):
                    self.send_response(500)
                    self.end_headers()
                    return
                names = body.get("NodeNames") or []
                if verb == "cpu-filter":
                    answer: Any = {"NodeNames": names, "FailedNodes": {}, "Error": ""}
                else:
                    answer = [{"Host": n, "Score": outer.scores.get(n, 0)} for n in names]
                data = orjson.dumps(answer)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._listener: socket.socket | None = None
        self._server: ThreadingHTTPServer | None = None
        if mode == "hang":
            self._listener = socket.socket()
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(16)  # connections complete in the backlog and are never answered
            self.port = self._listener.getsockname()[1]
        else:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self.port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._listener is not None:
            self._listener.close()


def refused_url() -> str:
    """A loopback port nobody listens on (connection refused, as a Service without endpoints)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def stub(apiserver: ApiServerHandle, tmp_path: Path) -> Iterator[ExtenderStub]:
    ca_cert, ca_key = generate_ca("ignorable-test-ca")
    (tmp_path / "ca.crt").write_bytes(ca_cert)
    extender = ExtenderStub(
        apiserver.base_url, generate_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])
    )
    extender.start()
    try:
        yield extender
    finally:
        extender.stop()


def two_entries(stub: ExtenderStub, ca_file: Path, second_url: str, *, ignorable: bool) -> Any:
    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": HAMI}],
        "extenders": [
            {
                "urlPrefix": stub.url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "nodeCacheCapable": True,
                "enableHTTPS": True,
                "tlsConfig": {"caFile": str(ca_file)},
                "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}],
            },
            {
                "urlPrefix": second_url,
                "filterVerb": "cpu-filter",
                "prioritizeVerb": "cpu-prioritize",
                "weight": 11,
                "nodeCacheCapable": True,
                "ignorable": ignorable,
                "httpTimeout": "500ms",
            },
        ],
    }
    return scheduler_config(parse_configuration(document))


def start(apiserver: ApiServerHandle, core_v1: Any, config: Any) -> SchedulerRunner:
    for name in ("n1", "n2", "n3"):
        core_v1.create_node(node(name, allocatable=RESOURCES))
    runner = SchedulerRunner(config, apiserver.kubeconfig, seed=3)
    runner.start()
    runner.wait_for(lambda s: len(list(s.cache.candidates())) == 3)
    return runner


def node_of(core_v1: Any, name: str) -> str | None:
    found: str | None = core_v1.read_namespaced_pod(name, NS).spec.node_name
    return found


def cpu_pod(name: str) -> dict[str, Any]:
    return pod(name, container(requests={"cpu": "1"}), scheduler_name=HAMI)


@pytest.mark.parametrize("mode", ["refused", "500", "hang"])
def test_an_ignorable_entry_that_fails_is_skipped_and_every_pod_still_schedules(
    apiserver: ApiServerHandle, core_v1: Any, stub: ExtenderStub, tmp_path: Path, mode: str
) -> None:
    verbs = None if mode == "refused" else CpuVerbs(mode)
    url = refused_url() if verbs is None else verbs.url
    stub.scores = {"n2": 10}
    with start(apiserver, core_v1, two_entries(stub, tmp_path / "ca.crt", url, ignorable=True)) as runner:
        core_v1.create_namespaced_pod(NS, cpu_pod("cpu-only"))
        core_v1.create_namespaced_pod(NS, gpu_pod("gpu", scheduler_name=HAMI))
        runner.wait_for(lambda s: s.counters.scheduled == 2, 15)
        assert node_of(core_v1, "cpu-only") in {"n1", "n2", "n3"}
        assert node_of(core_v1, "gpu") == "n2"  # HAMi's entry still decides and binds GPU pods
        snapshot = runner.snapshot()
        assert snapshot["errors"] == 0
        second = snapshot["extenders"][url]
        assert second["filter"]["calls"] == 2 and second["filter"]["errors"] == 2  # both pods asked
        assert stub.calls_of("filter", "cpu-only") == []  # the GPU entry is not interested
    if verbs is not None:
        verbs.close()


def test_a_failing_entry_that_is_not_ignorable_keeps_the_pod_pending(
    apiserver: ApiServerHandle, core_v1: Any, stub: ExtenderStub, tmp_path: Path
) -> None:
    url = refused_url()
    with start(apiserver, core_v1, two_entries(stub, tmp_path / "ca.crt", url, ignorable=False)) as runner:
        core_v1.create_namespaced_pod(NS, cpu_pod("cpu-only"))
        runner.wait_for(lambda s: s.counters.errors >= 1, 15)
        assert node_of(core_v1, "cpu-only") is None
        events = wait_for(
            lambda: [
                e
                for e in core_v1.list_namespaced_event(NS).items
                if e.involved_object.name == "cpu-only" and e.reason == "FailedScheduling"
            ],
            what="FailedScheduling",
        )
        assert events[0].message.startswith(f'Post "{url}/cpu-filter"')


def test_a_prioritize_error_is_ignored_even_when_the_entry_is_not_ignorable(
    apiserver: ApiServerHandle, core_v1: Any, stub: ExtenderStub, tmp_path: Path
) -> None:
    verbs = CpuVerbs("prioritize-500")
    config = two_entries(stub, tmp_path / "ca.crt", verbs.url, ignorable=False)
    try:
        with start(apiserver, core_v1, config) as runner:
            core_v1.create_namespaced_pod(NS, cpu_pod("cpu-only"))
            runner.wait_for(lambda s: s.counters.scheduled == 1, 15)
            assert runner.snapshot()["errors"] == 0
            assert verbs.calls == ["cpu-filter", "cpu-prioritize"]
    finally:
        verbs.close()


def test_the_second_entry_s_score_decides_between_nodes_when_it_answers(
    apiserver: ApiServerHandle, core_v1: Any, stub: ExtenderStub, tmp_path: Path
) -> None:
    verbs = CpuVerbs("ok")
    verbs.scores = {"n3": 10}
    try:
        with start(
            apiserver, core_v1, two_entries(stub, tmp_path / "ca.crt", verbs.url, ignorable=True)
        ) as runner:
            for i in range(3):
                core_v1.create_namespaced_pod(NS, cpu_pod(f"cpu-{i}"))
            runner.wait_for(lambda s: s.counters.scheduled == 3, 15)
            assert {node_of(core_v1, f"cpu-{i}") for i in range(3)} == {"n3"}
    finally:
        verbs.close()
