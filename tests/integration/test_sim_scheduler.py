"""The kube-scheduler stand-in against the real API server stand-in and a real HTTPS extender stub:
extender choice, NodeNames (nodeCacheCapable), FailedScheduling events with the extender's reasons,
backoff and requeue on cluster events, concurrent binds with assumed pods, own filters (nodeSelector,
cpu, Ready, unschedulable), the CLI's start-up errors and clean SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_sim.scheduler import SchedulerRunner, load_scheduler_config
from hami_sim.tls import generate_ca, generate_serving_cert
from tests.builders import container, gpu_pod, node, pod
from tests.conftest import ApiServerHandle
from tests.integration.extender_stub import ExtenderStub, accept_all
from tests.waiting import wait_for

SHIPPED = Path(__file__).resolve().parents[2] / "daemonset" / "scheduler" / "kube-scheduler-config.yaml"
NS = "default"
HAMI = "hami-scheduler"
RESOURCES = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
"""What each node offers (capacity and allocatable) unless a test says otherwise."""


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture
def ca_file(tmp_path: Path) -> tuple[Path, tuple[bytes, bytes]]:
    ca_cert, ca_key = generate_ca("scheduler-test-ca")
    path = tmp_path / "ca.crt"
    path.write_bytes(ca_cert)
    return path, generate_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])


@pytest.fixture
def stub(apiserver: ApiServerHandle, ca_file: tuple[Path, tuple[bytes, bytes]]) -> Iterator[ExtenderStub]:
    extender = ExtenderStub(apiserver.base_url, ca_file[1])
    extender.start()
    try:
        yield extender
    finally:
        extender.stop()


@pytest.fixture
def scheduler(
    apiserver: ApiServerHandle, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]]
) -> Iterator[SchedulerRunner]:
    config = load_scheduler_config(SHIPPED, extender_url=stub.url, extender_ca_file=str(ca_file[0]))
    with SchedulerRunner(config, apiserver.kubeconfig, seed=7) as runner:
        yield runner


def node_of(core_v1: Any, name: str) -> str | None:
    node: str | None = core_v1.read_namespaced_pod(name, NS).spec.node_name
    return node


def events_of(core_v1: Any, pod: str, reason: str) -> list[Any]:
    return [
        e
        for e in core_v1.list_namespaced_event(NS).items
        if e.involved_object.name == pod and e.reason == reason
    ]


# --- tests --------------------------------------------------------------------------------------------


def test_gpu_pods_go_to_the_node_the_extender_prefers(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner
) -> None:
    for name in ("n1", "n2", "n3"):
        core_v1.create_node(node(name, allocatable=RESOURCES))
    stub.scores = {"n2": 10, "n1": 3}
    for i in range(3):
        core_v1.create_namespaced_pod(NS, gpu_pod(f"gpu-{i}", scheduler_name=HAMI))
    scheduler.wait_for(lambda s: s.counters.scheduled == 3, 10)
    for i in range(3):
        pod = core_v1.read_namespaced_pod(f"gpu-{i}", NS)
        assert pod.spec.node_name == "n2"
        assert pod.metadata.annotations["hami.io/vgpu-node"] == "n2"
    first = stub.calls_of("filter", "gpu-0")[0].body
    assert first["NodeNames"] == ["n1", "n2", "n3"]  # nodeCacheCapable: names, no Node objects
    assert first["Nodes"] is None
    assert first["Pod"]["spec"]["schedulerName"] == "hami-scheduler"
    assert stub.calls_of("bind", "gpu-0")[0].body == {
        "PodName": "gpu-0",
        "PodNamespace": NS,
        "PodUID": first["Pod"]["metadata"]["uid"],
        "Node": "n2",
    }
    scheduled = wait_for(lambda: events_of(core_v1, "gpu-0", "Scheduled"), what="Scheduled event")
    assert scheduled[0].message == "Successfully assigned default/gpu-0 to n2"
    assert scheduled[0].type == "Normal"
    snapshot = scheduler.snapshot()
    latency = snapshot["extenders"][stub.url]
    assert latency["filter"]["calls"] == 3 and latency["bind"]["calls"] == 3
    assert latency["prioritize"]["calls"] == 3 and latency["filter"]["mean_s"] > 0
    assert snapshot["attempts"] == 3 and snapshot["unschedulable"] == 0


def test_rejected_everywhere_then_rescheduled_after_backoff_and_node_update(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner
) -> None:
    for name in ("n1", "n2", "n3"):
        core_v1.create_node(node(name, allocatable=RESOURCES))

    def reject(pod: str, names: list[str]) -> dict[str, Any]:
        return {
            "NodeNames": [],
            "FailedNodes": {n: "CardInsufficientMemory" for n in names if n != "n3"},
            "FailedAndUnresolvableNodes": {"n3": "node unregistered"} if "n3" in names else {},
            "Error": "",
        }

    stub.policy = reject
    core_v1.create_namespaced_pod(NS, gpu_pod("picky", scheduler_name=HAMI))
    events = wait_for(lambda: events_of(core_v1, "picky", "FailedScheduling"), what="FailedScheduling event")
    assert events[0].type == "Warning"
    assert events[0].message == "0/3 nodes are available: 1 node unregistered, 2 CardInsufficientMemory."
    assert events[0].reporting_component == "hami-scheduler"

    def unschedulable_condition() -> Any:
        conditions = core_v1.read_namespaced_pod("picky", NS).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    condition = wait_for(unschedulable_condition, what="PodScheduled=False")
    assert condition.reason == "Unschedulable"
    assert condition.message == events[0].message
    # Unschedulable: no retry without a cluster event.
    assert scheduler.snapshot()["queue"]["unschedulable"] == 1
    # A node change moves it, but it waits out its backoff (1 s after the first attempt) first.
    core_v1.patch_node("n1", {"metadata": {"annotations": {"hami.io/node-handshake": "Requesting_1"}}})
    first, second = stub.wait_calls("filter", "picky", count=2)
    assert second.at - first.at >= 0.9
    # Now the extender accepts; the next node event brings the pod back and it is bound.
    stub.policy = accept_all
    stub.scores = {"n3": 10}
    core_v1.patch_node("n3", {"metadata": {"annotations": {"hami.io/node-handshake": "Reported_1"}}})
    wait_for(lambda: node_of(core_v1, "picky") == "n3", timeout=15, what="picky bound to n3")
    assert len(stub.calls_of("filter", "picky")) == 3


def test_a_waiting_pod_is_logged_when_its_reason_changes_not_at_every_attempt(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hami_sim.scheduler")
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    reason = ["CardInsufficientMemory"]

    def reject(pod: str, names: list[str]) -> dict[str, Any]:
        return {"NodeNames": [], "FailedNodes": dict.fromkeys(names, reason[0]), "Error": ""}

    stub.policy = reject
    core_v1.create_namespaced_pod(NS, gpu_pod("waits", scheduler_name=HAMI))
    stub.wait_calls("filter", "waits")
    # a node change brings it back (after its backoff): the same reason, then another one
    core_v1.patch_node("n1", {"metadata": {"annotations": {"hami.io/node-handshake": "Requesting_2"}}})
    stub.wait_calls("filter", "waits", count=2)
    reason[0] = "CardInsufficientCore"
    core_v1.patch_node("n1", {"metadata": {"annotations": {"hami.io/node-handshake": "Requesting_3"}}})
    stub.wait_calls("filter", "waits", count=3)
    scheduler.wait_for(lambda s: sum(d.pod == "default/waits" for d in s.decisions) == 3)
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.getMessage().startswith("unschedulable default/waits")
    ]
    assert len(logged) == 2, logged
    assert logged[0].endswith("1 CardInsufficientMemory.") and logged[1].endswith("1 CardInsufficientCore.")


def test_extender_error_backs_off_and_retries_without_events(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner
) -> None:
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    # The node and pod watches race; the pod must find n1 known (else "no nodes available" is right).
    scheduler.wait_for(lambda s: any(n.name == "n1" for n in s.cache.candidates()))
    failures = [2]

    def flaky(pod: str, names: list[str]) -> dict[str, Any]:
        if failures[0] > 0:
            failures[0] -= 1
            return {"Error": "cache not synced yet"}
        return accept_all(pod, names)

    stub.policy = flaky
    core_v1.create_namespaced_pod(NS, gpu_pod("early", scheduler_name=HAMI))
    wait_for(lambda: node_of(core_v1, "early") == "n1", timeout=15, what="early bound")
    calls = stub.calls_of("filter", "early")
    assert len(calls) == 3
    assert calls[1].at - calls[0].at >= 0.9  # 1 s backoff
    assert calls[2].at - calls[1].at >= 1.9  # then 2 s
    messages = {e.message for e in events_of(core_v1, "early", "FailedScheduling")}
    assert messages == {"cache not synced yet"}
    assert scheduler.snapshot()["errors"] == 2


def test_binds_run_concurrently_and_assumed_pods_hold_their_room(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner
) -> None:
    core_v1.create_node(node("n1", allocatable={**RESOURCES, "cpu": "1"}))
    core_v1.create_node(node("n2", allocatable={**RESOURCES, "cpu": "1"}))
    stub.scores = {"n1": 10}
    stub.hold_binds()
    core_v1.create_namespaced_pod(
        NS, pod("first", container(gpus=1, requests={"cpu": "1"}), scheduler_name=HAMI)
    )
    stub.wait_calls("bind", "first")
    core_v1.create_namespaced_pod(
        NS, pod("second", container(gpus=1, requests={"cpu": "1"}), scheduler_name=HAMI)
    )
    # The first bind is still held, yet the second pod is filtered (and only n2 is offered: the
    # first pod is assumed on n1) and its bind starts too.
    (second_filter,) = stub.wait_calls("filter", "second")
    assert second_filter.body["NodeNames"] == ["n2"]
    stub.wait_calls("bind", "second")
    assert scheduler.snapshot()["binds_in_flight"] == 2
    assert node_of(core_v1, "first") is None
    stub.release_binds()
    scheduler.wait_for(lambda s: s.counters.scheduled == 2, 10)
    assert (node_of(core_v1, "first"), node_of(core_v1, "second")) == ("n1", "n2")
    # No prioritize for the second pod: a single feasible node is taken as is (kube does the same).
    assert stub.calls_of("prioritize", "second") == []


def test_own_filters_node_selector_cpu_ready_unschedulable(
    core_v1: Any, stub: ExtenderStub, scheduler: SchedulerRunner
) -> None:
    core_v1.create_node(node("small", allocatable={**RESOURCES, "cpu": "2"}, labels={"zone": "a"}))
    core_v1.create_node(node("big", allocatable={**RESOURCES, "cpu": "16"}, labels={"zone": "b"}))
    core_v1.create_node(node("down", allocatable=RESOURCES, labels={"zone": "a"}, ready=False))
    core_v1.create_node(node("cordoned", allocatable=RESOURCES, labels={"zone": "a"}, unschedulable=True))
    for name in ("cpu-1", "cpu-2"):
        core_v1.create_namespaced_pod(
            NS, pod(name, container(requests={"cpu": "1"}), scheduler_name=HAMI, node_selector={"zone": "a"})
        )
    scheduler.wait_for(lambda s: s.counters.scheduled == 2, 10)
    assert node_of(core_v1, "cpu-1") == node_of(core_v1, "cpu-2") == "small"
    core_v1.create_namespaced_pod(
        NS, pod("cpu-3", container(requests={"cpu": "1"}), scheduler_name=HAMI, node_selector={"zone": "a"})
    )
    events = wait_for(lambda: events_of(core_v1, "cpu-3", "FailedScheduling"), what="FailedScheduling")
    assert events[0].message == (
        "0/4 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were unschedulable."
    )
    assert stub.calls == []  # pods without managed resources never reach the extender
    bound = wait_for(lambda: events_of(core_v1, "cpu-1", "Scheduled"), what="Scheduled event")
    assert bound[0].message == "Successfully assigned default/cpu-1 to small"
    # Deleting a pod on `small` frees room: the pending pod is moved back and bound (no kubelet runs
    # `small`: deleted with grace 0, as a pod of a dead node is force-deleted; a graceful delete would
    # leave it Terminating, its cpu still taken, as in kube-scheduler's cache).
    core_v1.delete_namespaced_pod("cpu-1", NS, grace_period_seconds=0)
    wait_for(lambda: node_of(core_v1, "cpu-3") == "small", timeout=10, what="cpu-3 bound")


def test_stop_is_clean_with_a_bind_in_flight(
    apiserver: ApiServerHandle, core_v1: Any, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]]
) -> None:
    config = load_scheduler_config(SHIPPED, extender_url=stub.url, extender_ca_file=str(ca_file[0]))
    runner = SchedulerRunner(config, apiserver.kubeconfig)
    runner.start()
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    stub.hold_binds()
    core_v1.create_namespaced_pod(NS, gpu_pod("late", scheduler_name=HAMI))
    stub.wait_calls("bind", "late")
    stopper = threading.Thread(target=runner.stop)
    stopper.start()
    stub.release_binds()  # stop() waits for the in-flight bind
    stopper.join(15)
    assert not stopper.is_alive()
    assert runner.standin.counters.scheduled == 1
    assert node_of(core_v1, "late") == "n1"


# --- the CLI ---------------------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "hami_sim.main", "scheduler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )


def test_cli_bad_config_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        SHIPPED.read_text().replace("weight: 1", "weight: 0").replace("httpTimeout", "httpTimeOut")
    )
    proc = _cli("--config", str(bad), "--kubeconfig", str(bad))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "extenders[0].weight: Invalid value: 0: must have a positive weight applied to it" in out
    assert 'strict decoding error: unknown field "extenders[0].httpTimeOut"' in out
    assert "Traceback" not in out


def test_cli_runs_until_sigterm(
    apiserver: ApiServerHandle, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]], core_v1: Any
) -> None:
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    proc = _cli(
        "--kubeconfig",
        str(apiserver.kubeconfig),
        "--config",
        str(SHIPPED),
        "--extender-url",
        stub.url,
        "--extender-ca-file",
        str(ca_file[0]),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 20
        while not any("hami-sim scheduler ready" in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        core_v1.create_namespaced_pod(NS, gpu_pod("via-cli", scheduler_name=HAMI))
        wait_for(lambda: node_of(core_v1, "via-cli") == "n1", what="via-cli bound")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "scheduled default/via-cli -> n1" in "".join(lines) + out
    assert "scheduler hami-scheduler stopped" in out
    assert "Traceback" not in out


def test_the_client_takes_kube_schedulers_rate_limit_unless_lifted(
    apiserver: ApiServerHandle, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]]
) -> None:
    config = load_scheduler_config(SHIPPED, extender_url=stub.url, extender_ca_file=str(ca_file[0]))
    with SchedulerRunner(config, apiserver.kubeconfig, seed=7) as runner:
        client = runner.standin._client
        assert client is not None and client.limiter is not None
        assert (client.limiter.bucket.qps, client.limiter.bucket.burst) == (50.0, 100)
    with SchedulerRunner(config, apiserver.kubeconfig, seed=7, kube_api_qps=0) as runner:
        client = runner.standin._client
        assert client is not None and client.limiter is None


def test_start_lists_again_while_the_api_server_answers_500_then_schedules(
    apiserver: ApiServerHandle, stub: ExtenderStub, ca_file: tuple[Path, tuple[bytes, bytes]], core_v1: Any
) -> None:
    """A scheduler (re)started during an API server fault window keeps listing until its caches sync, as
    kube-scheduler's informers do, instead of exiting (found by `hami-sim chaos`: a killed scheduler
    that could not start again left every pod Pending)."""
    core_v1.create_node(node("n1", allocatable=RESOURCES))
    rule = {"name": "first-lists", "fault": "error", "probability": 1.0, "verbs": ["list"],
            "resources": ["nodes", "pods"], "userAgents": ["hami-sim-scheduler"], "limit": 3}  # fmt: skip
    apiserver.runner.set_faults({"seed": 1, "rules": [rule]})
    config = load_scheduler_config(SHIPPED, extender_url=stub.url, extender_ca_file=str(ca_file[0]))
    with SchedulerRunner(config, apiserver.kubeconfig, seed=7) as runner:
        assert apiserver.runner.faults()["injectedByRule"] == {"first-lists": 3}
        core_v1.create_namespaced_pod(NS, gpu_pod("after-faults", scheduler_name=HAMI))
        runner.wait_for(lambda s: s.counters.scheduled == 1, 10)
    assert node_of(core_v1, "after-faults") == "n1"
