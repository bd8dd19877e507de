"""The local API server's fault switch (/hami-sim/faults), each fault as kube-apiserver answers it, seen by
the official `kubernetes` client and kubectl, and survived by our clients: `KubeApi` retries a 429 or 5xx
with Retry-After and hands other failures over as `KubeApiError`; `Reflector` relists after 410, resumes a
cut watch at once and catches up after a stale list, losing and duplicating nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi, component_user_agent
from hami_kube.errors import KubeApiError
from hami_kube.reflector import Reflector
from hami_sim.apiserver import ApiServerRunner
from tests.apiserver_util import bind, http
from tests.builders import binding, pod
from tests.conftest import ApiServerHandle
from tests.control_server_util import LoopThread
from tests.waiting import wait_for

FAST = RetryPolicy(initial=0.01, maximum=0.05)
SLOW_BACKOFF = RetryPolicy(initial=60.0, maximum=60.0, jitter=0.0)
"""A backoff no test outlives: a reflector that waits it has mishandled the fault."""
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def config_map(name: str, value: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}


def rule(name: str, fault: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "fault": fault, **fields}


def set_faults(base_url: str, *rules: dict[str, Any], seed: int = 1) -> dict[str, Any]:
    status, body = http(base_url, "PUT", "/hami-sim/faults", {"seed": seed, "rules": list(rules)})
    assert status == 200, body
    answer: dict[str, Any] = body
    return answer


def injected(base_url: str) -> dict[str, int]:
    status, body = http(base_url, "GET", "/hami-sim/faults")
    assert status == 200, body
    counts: dict[str, int] = body["injected"]
    return counts


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def quiet() -> Iterator[ApiServerRunner]:
    """A server without bookmarks in a test's time (a dropped watch's lines are then its events)."""
    with ApiServerRunner(bookmark_interval=60.0) as runner:
        yield runner


def make_api(loop: LoopThread, base_url: str, **options: Any) -> KubeApi:
    async def build() -> KubeApi:
        return KubeApi(base_url, None, qps=0, **options)

    return loop.call(build)


# --- the switch -----------------------------------------------------------------------------------------


def test_rules_are_put_read_and_cleared_and_a_bad_rule_is_a_400_naming_field_and_value(
    apiserver: ApiServerHandle,
) -> None:
    url = apiserver.base_url
    body = set_faults(url, rule("t", "throttle", retryAfterSeconds=2, verbs=["get"]), seed=7)
    assert body["seed"] == 7 and [r["name"] for r in body["rules"]] == ["t"]
    assert body["rules"][0]["retryAfterSeconds"] == 2 and body["injected"] == {}
    assert http(url, "GET", "/api/v1/namespaces/default")[0] == 429
    status, bad = http(url, "PUT", "/hami-sim/faults", {"rules": [rule("x", "slow", delaySeconds=-1)]})
    assert status == 400 and bad["reason"] == "BadRequest"
    assert "rules[0].delaySeconds: Invalid value: -1" in bad["message"]
    status, bad = http(url, "PUT", "/hami-sim/faults", {"rules": [rule("x", "conflict", verbs=["get"])]})
    assert status == 400 and "rules[0].verbs[0]: Invalid value: 'get'" in bad["message"]
    status, bad = http(url, "PUT", "/hami-sim/faults", b"{not json")
    assert status == 400 and "couldn't decode the fault rules" in bad["message"]
    # A bad PUT leaves the rules as they were.
    status, now = http(url, "GET", "/hami-sim/faults")
    assert [r["name"] for r in now["rules"]] == ["t"]
    assert now["injected"] == {"throttle": 1} and now["injectedByRule"] == {"t": 1}
    status, cleared = http(url, "DELETE", "/hami-sim/faults")
    assert status == 200 and cleared["rules"] == [] and cleared["injected"] == {"throttle": 1}
    assert http(url, "GET", "/api/v1/namespaces/default")[0] == 200


def test_faults_never_touch_hami_sim_discovery_or_openapi_paths(apiserver: ApiServerHandle) -> None:
    url = apiserver.base_url
    set_faults(url, rule("all", "throttle", retryAfterSeconds=1), rule("err", "error"))
    for path in ("/api", "/api/v1", "/apis", "/apis/coordination.k8s.io/v1", "/openapi/v3", "/version",
                 "/healthz", "/hami-sim/counters", "/hami-sim/faults"):  # fmt: skip
        assert http(url, "GET", path)[0] == 200, path
    assert http(url, "GET", "/api/v1/namespaces")[0] == 429


def test_each_injection_is_logged_with_rule_verb_and_path(
    apiserver: ApiServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    set_faults(apiserver.base_url, rule("err-get", "error", verbs=["get"]))
    with caplog.at_level(logging.INFO, logger="hami_sim.apiserver.server"):
        assert http(apiserver.base_url, "GET", "/api/v1/namespaces/default")[0] == 500
    assert "fault err-get (error) injected: get /api/v1/namespaces/default" in caplog.text


def test_the_same_seed_replays_the_same_decisions(apiserver: ApiServerHandle) -> None:
    url = apiserver.base_url

    def run(seed: int) -> list[int]:
        set_faults(url, rule("half", "error", probability=0.5, resources=["namespaces"]), seed=seed)
        return [http(url, "GET", "/api/v1/namespaces/default")[0] for _ in range(40)]

    first = run(3)
    assert set(first) == {200, 500}
    assert run(3) == first
    assert run(4) != first
    assert injected(url) == {"error": run(4).count(500)}


def test_user_agent_prefixes_pick_the_component_and_every_client_names_itself(
    apiserver: ApiServerHandle, loop: LoopThread
) -> None:
    url = apiserver.base_url
    set_faults(url, rule("control-only", "error", userAgents=["hami-control/"]))
    control = make_api(loop, url, user_agent=component_user_agent("hami-control"))
    node = make_api(loop, url, user_agent=component_user_agent("hami-node"))
    plain = make_api(loop, url)
    try:
        with pytest.raises(KubeApiError) as info:
            loop.call(lambda: control.get("/api/v1/namespaces/default"))
        assert (info.value.status, info.value.reason) == (500, "InternalError")
        assert loop.call(lambda: node.get("/api/v1/namespaces/default"))["metadata"]["name"] == "default"
        assert loop.call(lambda: plain.get("/api/v1/namespaces/default"))["metadata"]["name"] == "default"
    finally:
        for api in (control, node, plain):
            loop.call(api.close)
    agents = [r["userAgent"] for r in apiserver.runner.requests(limit=3)]
    shape = r"^{}/\d+\.\d+\.\d+\S* \([a-z]+/[a-z0-9_]+\) hami-py$"
    for agent, component in zip(agents, ("hami-control", "hami-node", "hami-kube"), strict=True):
        assert re.match(shape.format(component), agent), agent


# --- what each fault looks like to the official client and kubectl --------------------------------------


def test_conflict_is_kubes_409_on_writes_only(
    apiserver: ApiServerHandle, core_v1: Any, kubectl: Kubectl
) -> None:
    core_v1.create_namespaced_config_map("default", config_map("a"))
    set_faults(apiserver.base_url, rule("c", "conflict", resources=["configmaps"], limit=2))
    assert core_v1.read_namespaced_config_map("a", "default").data == {"v": "1"}
    with pytest.raises(client.ApiException) as info:
        core_v1.patch_namespaced_config_map("a", "default", {"data": {"v": "2"}})
    status = json.loads(info.value.body)
    assert (info.value.status, status["reason"], status["code"]) == (409, "Conflict", 409)
    assert status["message"] == (
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert status["details"] == {"name": "a", "kind": "configmaps"}
    result = kubectl("label", "configmap", "a", "x=y", check=False)
    assert result.returncode != 0
    assert 'Error from server (Conflict): Operation cannot be fulfilled on configmaps "a"' in result.stderr
    # The limit reached, writes go through again.
    kubectl("label", "configmap", "a", "x=y")
    assert injected(apiserver.base_url) == {"conflict": 2}


def test_a_binding_can_be_made_to_conflict_and_to_answer_late(
    apiserver: ApiServerHandle, core_v1: Any
) -> None:
    url = apiserver.base_url
    for name in ("p", "q"):
        core_v1.create_namespaced_pod("default", pod(name))
    set_faults(url, rule("bind", "conflict", resources=["pods"], subresources=["binding"], limit=1))
    with pytest.raises(client.ApiException) as info:
        bind(core_v1, "default", "p", "n1")
    assert info.value.status == 409
    assert 'Operation cannot be fulfilled on pods "p"' in json.loads(info.value.body)["message"]
    assert core_v1.read_namespaced_pod("p", "default").spec.node_name is None
    # Held back past the caller's timeout, the Binding has still landed (the old /bindings path too).
    set_faults(url, rule("late", "slow", delaySeconds=2.0, subresources=["binding"]))
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core_v1.create_namespaced_binding(
            "default", binding("q", "n1"), _preload_content=False, _request_timeout=0.3
        )
    assert core_v1.read_namespaced_pod("q", "default").spec.node_name == "n1"


def test_throttle_is_a_429_with_retry_after_that_clients_wait_out(
    apiserver: ApiServerHandle, core_v1: Any, kubectl: Kubectl
) -> None:
    url = apiserver.base_url
    core_v1.create_namespaced_config_map("default", config_map("a"))
    set_faults(url, rule("t", "throttle", retryAfterSeconds=1, verbs=["get"], limit=1))
    with urllib3.PoolManager() as pool:
        raw = pool.request("GET", f"{url}{CONFIGMAPS}/a", retries=False, timeout=10.0)
    assert raw.status == 429 and raw.headers["Retry-After"] == "1"
    status = json.loads(raw.data)
    assert (status["reason"], status["code"]) == ("TooManyRequests", 429)
    assert status["details"] == {"retryAfterSeconds": 1}
    # The official client (urllib3's Retry honours Retry-After on a 429) and kubectl (client-go) send it
    # again after Retry-After, as KubeApi does.
    set_faults(url, rule("t", "throttle", retryAfterSeconds=1, verbs=["get"], limit=1))
    assert core_v1.read_namespaced_config_map("a", "default").data == {"v": "1"}
    assert injected(url) == {"throttle": 1}
    set_faults(url, rule("t", "throttle", retryAfterSeconds=1, verbs=["get"], limit=1))
    assert kubectl("get", "configmap", "a", "-o", "name").stdout.strip() == "configmap/a"
    assert injected(url) == {"throttle": 1}


def test_error_is_a_500_internal_error_or_a_server_timeout_with_retry_after(
    apiserver: ApiServerHandle, core_v1: Any, kubectl: Kubectl
) -> None:
    set_faults(apiserver.base_url, rule("e", "error", verbs=["list"], limit=1))
    with pytest.raises(client.ApiException) as info:
        core_v1.list_namespaced_config_map("default")
    status = json.loads(info.value.body)
    assert (info.value.status, status["reason"]) == (500, "InternalError")
    assert status["message"] == "Internal error occurred: injected fault e"
    set_faults(apiserver.base_url, rule("e", "error", verbs=["list"], limit=1))
    result = kubectl("get", "configmaps", check=False)
    assert "Error from server (InternalError)" in result.stderr
    set_faults(apiserver.base_url, rule("st", "error", verbs=["list"], retryAfterSeconds=1, limit=1))
    code, body = http(apiserver.base_url, "GET", CONFIGMAPS)
    assert (code, body["reason"], body["details"]["retryAfterSeconds"]) == (500, "ServerTimeout", 1)
    assert body["message"] == (
        "The list operation against configmaps could not be completed at this time, please try again."
    )


def test_gone_on_resume_is_410_expired_as_an_event_or_as_the_answer(
    apiserver: ApiServerHandle, core_v1: Any
) -> None:
    rv = core_v1.create_namespaced_config_map("default", config_map("a")).metadata.resource_version
    for gone_as in ("event", "status"):
        set_faults(apiserver.base_url, rule("g", "gone", goneAs=gone_as, limit=1))
        # A watch from "now" (no resourceVersion) is not a resume: never gone.
        stream = watch.Watch().stream(core_v1.list_namespaced_config_map, "default", timeout_seconds=1)
        assert [e["object"].metadata.name for e in stream] == ["a"]
        with pytest.raises(client.ApiException) as info:
            for _ in watch.Watch().stream(
                core_v1.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=5
            ):
                pass
        assert info.value.status == 410, gone_as
        assert f"too old resource version: {rv}" in str(info.value.reason) + str(info.value.body)


def test_a_dropped_watch_is_cut_mid_stream(quiet: ApiServerRunner) -> None:
    url = quiet.base_url
    for i in range(5):
        assert http(url, "POST", CONFIGMAPS, config_map(f"cm-{i}"))[0] == 201
    set_faults(url, rule("d", "drop-watch", limit=1), seed=7)  # seed 7: cut after 2 lines
    names: list[str] = []
    with client.ApiClient(client.Configuration(host=url)) as api_client:
        core_v1 = client.CoreV1Api(api_client)
        with pytest.raises(urllib3.exceptions.ProtocolError, match="Response ended prematurely"):
            for event in watch.Watch().stream(
                core_v1.list_namespaced_config_map, "default", resource_version="1", timeout_seconds=10
            ):
                names.append(event["object"].metadata.name)
    assert names == ["cm-0", "cm-1"]
    assert injected(url) == {"drop-watch": 1}


def test_stale_list_serves_the_previous_answer_with_its_resource_version(
    apiserver: ApiServerHandle, core_v1: Any, kubectl: Kubectl
) -> None:
    url = apiserver.base_url
    core_v1.create_namespaced_config_map("default", config_map("old"))
    set_faults(url, rule("s", "stale-list", resources=["configmaps"], limit=2))
    first = core_v1.list_namespaced_config_map("default")  # remembered, not stale: nothing before it
    core_v1.create_namespaced_config_map("default", config_map("new"))
    stale = core_v1.list_namespaced_config_map("default")
    assert [c.metadata.name for c in stale.items] == ["old"]
    assert stale.metadata.resource_version == first.metadata.resource_version
    # Another selector is another list: nothing earlier to repeat.
    fresh = core_v1.list_namespaced_config_map("default", label_selector="x!=y")
    assert sorted(c.metadata.name for c in fresh.items) == ["new", "old"]
    assert kubectl("get", "configmaps", "-o", "name").stdout.split() == ["configmap/old"]
    assert injected(url) == {"stale-list": 2}
    # A watch from the stale version catches up, as a client of a lagging cache does.
    events = watch.Watch().stream(
        core_v1.list_namespaced_config_map,
        "default",
        resource_version=stale.metadata.resource_version,
        timeout_seconds=1,
    )
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "new")]


def test_slow_answers_past_the_clients_timeout_fail_there_and_the_server_keeps_serving(
    apiserver: ApiServerHandle, core_v1: Any, loop: LoopThread
) -> None:
    url = apiserver.base_url
    set_faults(url, rule("slow", "slow", delaySeconds=2.0, verbs=["get"], limit=2))
    # The official client's urllib3 sends a GET again after a read timeout (3 tries): its third answers.
    assert core_v1.read_namespace("default", _request_timeout=0.3).metadata.name == "default"
    assert injected(url) == {"slow": 2}
    # KubeApi, as client-go, sends nothing again after a timeout (only after a reset connection).
    set_faults(url, rule("slow", "slow", delaySeconds=2.0, verbs=["get"], limit=1))
    api = make_api(loop, url, request_timeout_s=0.3)
    try:
        with pytest.raises(KubeApiError) as info:
            loop.call(lambda: api.get("/api/v1/namespaces/default"))
        assert info.value.status == 0 and info.value.retriable
        assert loop.call(lambda: api.get("/api/v1/namespaces/default"))["metadata"]["name"] == "default"
        # The answer is what is held back: a write the client gave up on has landed (so KubeApi never
        # sends a write again after a transport error; the caller reads before it writes again).
        set_faults(url, rule("slow", "slow", delaySeconds=2.0, verbs=["create"], limit=1))
        with pytest.raises(KubeApiError) as info:
            loop.call(lambda: api.request("POST", CONFIGMAPS, config_map("late")))
        assert info.value.status == 0
        assert core_v1.read_namespaced_config_map("late", "default").data == {"v": "1"}
    finally:
        loop.call(api.close)
    assert injected(url) == {"slow": 1}


# --- our clients survive --------------------------------------------------------------------------------


def test_kube_api_waits_out_429_and_5xx_with_retry_after_and_returns_other_5xx(
    apiserver: ApiServerHandle, loop: LoopThread
) -> None:
    url = apiserver.base_url
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    api = make_api(loop, url, sleep=record)
    try:
        set_faults(
            url,
            rule("t", "throttle", retryAfterSeconds=3, verbs=["get"], limit=2),
            rule("st", "error", retryAfterSeconds=1, verbs=["get"], limit=1),
        )
        assert loop.call(lambda: api.get("/api/v1/namespaces/default"))["metadata"]["name"] == "default"
        assert waits == [3.0, 3.0, 1.0] and api.retries == 3
        # A write is sent again after Retry-After too (its body is bytes), as client-go does.
        set_faults(url, rule("t", "throttle", retryAfterSeconds=2, verbs=["create"], limit=1))
        created = loop.call(lambda: api.request("POST", CONFIGMAPS, config_map("w")))
        assert created["metadata"]["name"] == "w" and waits[-1] == 2.0
        # A 500 without Retry-After is final for the call (client-go's checkWait), handed over retriable.
        set_faults(url, rule("e", "error", verbs=["get"], limit=1))
        with pytest.raises(KubeApiError) as info:
            loop.call(lambda: api.get("/api/v1/namespaces/default"))
        assert (info.value.status, info.value.reason, info.value.retriable) == (500, "InternalError", True)
        # Past max_retries the 429 is handed over.
        set_faults(url, rule("t", "throttle", retryAfterSeconds=1, verbs=["get"]))
        with pytest.raises(KubeApiError) as info:
            loop.call(lambda: api.get("/api/v1/namespaces/default"))
        assert info.value.status == 429 and api.retries == 4 + api.max_retries
    finally:
        loop.call(api.close)


@dataclass
class Mirror:
    """A reflector's sink that keeps what it was told by name, and every change it was fed."""

    objects: dict[str, str] = field(default_factory=dict)
    applied: list[tuple[str, str, str]] = field(default_factory=list)
    lists: int = 0
    _page: dict[str, str] = field(default_factory=dict)

    def begin_replace(self) -> None:
        self._page = {}

    def add_page(self, items: Any) -> None:
        for item in items:
            self._page[item["metadata"]["name"]] = item["metadata"]["resourceVersion"]

    def end_replace(self) -> None:
        self.objects, self._page = self._page, {}
        self.lists += 1

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name, rv = obj["metadata"]["name"], obj["metadata"]["resourceVersion"]
        self.applied.append((kind, name, rv))
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = rv


def server_state(runner: ApiServerRunner) -> dict[str, str]:
    _, body = http(runner.base_url, "GET", CONFIGMAPS)
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in body["items"]}


def start_reflector(
    loop: LoopThread, api: KubeApi, sink: Mirror, retry: RetryPolicy = FAST
) -> tuple[Reflector, Any]:
    reflector = Reflector(api, "configmaps", CONFIGMAPS, sink, retry=retry, rng=random.Random(1), page_size=3)
    return reflector, loop.submit(reflector.run())


def test_reflector_resumes_a_watch_cut_after_changes_at_once_losing_and_duplicating_nothing(
    quiet: ApiServerRunner, loop: LoopThread
) -> None:
    # Regression: a watch cut mid-stream after it had fed changes counted as a failure, so the reflector
    # backed off before resuming (up to its maximum, 30 s by default) while the stream had been fine.
    url = quiet.base_url
    api = make_api(loop, url)
    sink = Mirror()
    reflector, task = start_reflector(loop, api, sink, retry=SLOW_BACKOFF)
    try:
        wait_for(lambda: reflector.watches == 1, what="the first watch")
        set_faults(url, rule("d", "drop-watch", limit=1), seed=7)  # the next watch: cut after 2 lines
        quiet.call(lambda: [w.close() for w in quiet.store.watchers()])
        wait_for(lambda: reflector.watches == 2, what="the watch the fault will cut")
        for i in range(5):
            assert http(url, "POST", CONFIGMAPS, config_map(f"cm-{i}"))[0] == 201
        wait_for(lambda: sink.objects == server_state(quiet), what="every config map, resumed at once")
        assert injected(url) == {"drop-watch": 1} and reflector.watches == 3 and reflector.lists == 1
        assert [name for _, name, _ in sink.applied] == [f"cm-{i}" for i in range(5)]
    finally:
        task.cancel()
        loop.call(api.close)


def test_reflector_relists_after_410_on_resume_in_both_forms(
    quiet: ApiServerRunner, loop: LoopThread
) -> None:
    url = quiet.base_url
    api = make_api(loop, url)
    sink = Mirror()
    reflector, task = start_reflector(loop, api, sink, retry=SLOW_BACKOFF)
    try:
        wait_for(lambda: reflector.watches == 1, what="the first watch")
        for n, gone_as in enumerate(("event", "status"), start=2):
            set_faults(url, rule("g", "gone", goneAs=gone_as, limit=1))
            assert http(url, "POST", CONFIGMAPS, config_map(f"during-{gone_as}"))[0] == 201
            quiet.call(lambda: [w.close() for w in quiet.store.watchers()])
            wait_for(lambda n=n: reflector.lists == n, what=f"the relist after a 410 {gone_as}")
            wait_for(lambda: sink.objects == server_state(quiet), what="the relisted state")
    finally:
        task.cancel()
        loop.call(api.close)


@pytest.mark.parametrize("stale_lists", [False, True], ids=["fresh-lists", "stale-lists"])
def test_reflector_ends_with_the_servers_state_under_every_watch_and_list_fault(
    apiserver: ApiServerHandle, loop: LoopThread, stale_lists: bool
) -> None:
    url = apiserver.base_url
    api = make_api(loop, url)
    sink = Mirror()
    only = {"userAgents": ["hami-kube/"]}  # the reflector's client; the test's own reads stay true
    rules = [
        rule("drop", "drop-watch", probability=0.5, **only),
        rule("gone", "gone", probability=0.3, **only),
        rule("err", "error", probability=0.2, verbs=["list", "watch"], **only),
        rule("thr", "throttle", probability=0.2, retryAfterSeconds=1, verbs=["watch"], **only),
    ]
    if stale_lists:
        rules.insert(0, rule("stale", "stale-list", probability=0.7, **only))
    set_faults(url, *rules, seed=11)
    wanted = {"drop-watch", "gone", *(["stale-list"] if stale_lists else [])}
    reflector, task = start_reflector(loop, api, sink)
    try:
        wait_for(reflector.synced.is_set, what="the first list")
        rng = random.Random(5)
        # Churn until every watch and list fault has hit the reflector at least once; every 10 changes its
        # watch is ended (as the server's watch timeout would), so a new one meets the rules.
        for step in range(2000):
            name = f"cm-{rng.randrange(12)}"
            code = http(url, "POST", CONFIGMAPS, config_map(name, str(step)))[0]
            if code == 409:  # it exists: change it or delete it
                if rng.random() < 0.5:
                    http(url, "PUT", f"{CONFIGMAPS}/{name}", config_map(name, str(step)))
                else:
                    http(url, "DELETE", f"{CONFIGMAPS}/{name}")
            if step % 10 == 9:
                if wanted <= set(injected(url)):
                    break
                apiserver.runner.call(lambda: [w.close() for w in apiserver.runner.store.watchers()])
        final = server_state(apiserver.runner)
        wait_for(lambda: sink.objects == final, timeout=30.0, what="the server's state in the sink",
                 detail=lambda: f"{sink.objects} != {final}")  # fmt: skip
    finally:
        task.cancel()
        loop.call(api.close)
    counts = injected(url)
    assert wanted <= set(counts), counts
    if not stale_lists:
        # No change fed twice: a resumed watch starts after the last version it delivered, a relist
        # is fresh. (A stale relist goes back in time, and the watch from there feeds its changes again,
        # as from a lagging watch cache.)
        assert len(set(sink.applied)) == len(sink.applied)


# --- the command line -----------------------------------------------------------------------------------


def test_apiserver_cli_starts_with_the_rules_of_faults_file_and_rejects_a_bad_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\nrules:\n- {name: t, fault: throttle}\n")
    result = subprocess.run(
        [sys.executable, "-m", "hami_sim.main", "apiserver", "--port", "0", "--faults", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"--faults {bad}: rules[0].retryAfterSeconds: Invalid value: None" in result.stderr
    good = tmp_path / "faults.yaml"
    good.write_text("seed: 3\nrules:\n- {name: e, fault: error, verbs: [get], resources: [namespaces]}\n")
    kubeconfig = tmp_path / "kc"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "hami_sim.main", "apiserver", "--port", "0"),
            *("--faults", str(good), "--kubeconfig-out", str(kubeconfig)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        ready = ""
        while "ready at" not in ready:
            ready = process.stderr.readline()
            assert ready, "the server exited before it was ready"
        url = re.findall(r"http://127\.0\.0\.1:\d+", ready)[0]
        status, body = http(url, "GET", "/hami-sim/faults")
        assert status == 200 and body["seed"] == 3 and [r["name"] for r in body["rules"]] == ["e"]
        assert http(url, "GET", "/api/v1/namespaces/default")[0] == 500
    finally:
        process.terminate()
        process.wait(timeout=15)
        assert process.stderr is not None
        process.stderr.close()


def test_a_client_cancelled_during_a_slow_answer_leaves_the_server_serving(quiet: ApiServerRunner) -> None:
    url = quiet.base_url
    set_faults(url, rule("slow", "slow", delaySeconds=30.0, verbs=["list"]))

    async def give_up() -> None:
        api = KubeApi(url, None, qps=0, request_timeout_s=0.2)
        try:
            with pytest.raises(KubeApiError):
                await api.get(CONFIGMAPS)
        finally:
            await api.close()

    asyncio.run(give_up())
    assert http(url, "GET", "/api/v1/namespaces/default")[0] == 200
