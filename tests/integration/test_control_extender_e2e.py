"""End to end: `hami-control` as a real process against the local API server, driven the way
kube-scheduler drives an extender: `/filter`, `/prioritize` and `/bind` over HTTPS with extender v1 JSON.
Nodes carry the node daemon's register annotation; a bind writes one Binding whose annotations land on
the pod; the pending window lets concurrent binds of same-sized pods through one by one as the (here
simulated) node daemon answers, with no GPU ever over its limits; /metrics shows the allocation."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    decode_pod_allocation,
)
from tests.builders import gpu_info, gpu_pod, node
from tests.conftest import ApiServerHandle
from tests.control_process_util import ControlProcess, raw_pod, start_control
from tests.control_server_util import KeepAliveClient
from tests.waiting import wait_for

GPU_MEM = 16000


@pytest.fixture
def control(tmp_path: Path, apiserver: ApiServerHandle) -> Iterator[ControlProcess]:
    process = start_control(tmp_path, apiserver.kubeconfig, "--bind-wait-timeout", "20")
    try:
        yield process
    finally:
        code = process.stop()
        print(process.log())
        assert code == 0, "hami-control did not stop cleanly on SIGTERM"


def add_node(core_v1: Any, name: str, count: int, split: int = 4) -> None:
    """A node of `count` T4s (16000 MiB, split `split` ways) named GPU-<node>-<i>."""
    gpus = [gpu_info(i, id=f"GPU-{name}-{i}", count=split, devmem=GPU_MEM) for i in range(count)]
    core_v1.create_node(node(name, gpus, allocatable={"cpu": "8", "memory": "32Gi"}))


def create_gpu_pod(core_v1: Any, name: str, gpus: int = 1, mem: int = 4000) -> dict[str, Any]:
    """Create a pod for hami-scheduler and return it as the API server stored it."""
    core_v1.create_namespaced_pod(
        "default", gpu_pod(name, gpus=gpus, gpumem=mem, scheduler_name="hami-scheduler")
    )
    return raw_pod(core_v1, "default", name)


def call(c: KeepAliveClient, verb: str, body: object) -> Any:
    status, answer = c.request(
        "POST", f"/{verb}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200, answer
    return json.loads(answer)


def bind_args(p: dict[str, Any], node: str) -> dict[str, str]:
    meta = p["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def test_filter_prioritize_bind_through_https(control: ControlProcess, core_v1: Any) -> None:
    add_node(core_v1, "gpu-a", 2)
    add_node(core_v1, "gpu-b", 1)
    c = KeepAliveClient(control.port, control.ca.client_context())
    with c:
        p = create_gpu_pod(core_v1, "two", gpus=2, mem=4000)
        names = ["gpu-a", "gpu-b", "ghost"]

        def filtered() -> dict[str, Any] | None:
            result = call(c, "filter", {"Pod": p, "NodeNames": names})
            return result if result["NodeNames"] == ["gpu-a"] else None

        result = wait_for(filtered, what="both nodes in the extender's cache")
        assert result["Error"] == ""
        # A pod that fits somewhere: no failed node named (--filter-failed-nodes when-none-fit).
        assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
        too_big = create_gpu_pod(core_v1, "three", gpus=3, mem=4000)
        result = call(c, "filter", {"Pod": too_big, "NodeNames": names})
        assert result["NodeNames"] == [] and result["Error"] == ""
        assert result["FailedAndUnresolvableNodes"]["gpu-b"] == "NodeInsufficientDevice"
        assert result["FailedAndUnresolvableNodes"]["ghost"].startswith("node unregistered")
        scores = call(c, "prioritize", {"Pod": p, "NodeNames": ["gpu-a", "gpu-b"]})
        assert [s["Host"] for s in scores] == ["gpu-a", "gpu-b"]
        assert scores[1]["Score"] == 0 and 0 <= scores[0]["Score"] <= 10

        assert call(c, "bind", bind_args(p, "gpu-a")) == {"Error": ""}
        bound = raw_pod(core_v1, "default", "two")
        assert bound["spec"]["nodeName"] == "gpu-a"
        annotations = bound["metadata"]["annotations"]
        assert annotations[VGPU_NODE] == "gpu-a" and annotations[BIND_PHASE] == "allocating"
        allocation = decode_pod_allocation(annotations[DEVICES_TO_ALLOCATE])
        assert sorted(s.uuid for s in allocation.containers[0].devices) == ["GPU-gpu-a-0", "GPU-gpu-a-1"]
        assert annotations[DEVICES_ALLOCATED] == annotations[DEVICES_TO_ALLOCATE]
        wait_for(
            lambda: any(e.reason == "BindingSucceed" for e in core_v1.list_namespaced_event("default").items),
            what="a BindingSucceed event",
        )

        # The same pod again: the API server says it is bound already.
        again = call(c, "bind", bind_args(p, "gpu-a"))
        assert again["Error"]
        # Bad input comes back in Error, never as a 500.
        assert "not JSON" in json.loads(c.request("POST", "/filter", b"{nope")[1])["Error"]
        assert call(c, "bind", {"PodName": "x"})["Error"]

        status, metrics = c.request("GET", "/metrics")
        assert status == 200
        text = metrics.decode()
        assert "hami_gpu_memory_allocated_bytes" in text
        assert "hami_extender_bind_total" in text
        status, packed = c.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        assert status == 200 and gzip.decompress(packed).startswith(b"# HELP")


def test_concurrent_binds_to_one_node_never_double_allocate(control: ControlProcess, core_v1: Any) -> None:
    """16 one-GPU pods (6000 MiB) bound concurrently to one node of 2 x 16000 MiB GPUs, split 4: only 4
    fit (2 per GPU by memory). A node-daemon stand-in marks each bound pod allocated; binds of the same
    GPU count wait for it. Every answer is success or a clear no-fit, no GPU goes over its memory."""
    add_node(core_v1, "solo", 2)
    pods = [create_gpu_pod(core_v1, f"p{i}", 1, 6000) for i in range(16)]
    stop = threading.Event()

    def node_daemon() -> None:
        w = client.CoreV1Api(core_v1.api_client)
        done: set[str] = set()
        while not stop.is_set():
            for item in w.list_namespaced_pod("default").items:
                ann = item.metadata.annotations or {}
                if ann.get(BIND_PHASE) == "allocating" and item.metadata.name not in done:
                    w.patch_namespaced_pod(
                        item.metadata.name, "default", {"metadata": {"annotations": {BIND_PHASE: "success"}}}
                    )
                    done.add(item.metadata.name)
            stop.wait(0.05)

    daemon = threading.Thread(target=node_daemon, daemon=True)
    daemon.start()
    try:
        with KeepAliveClient(control.port, control.ca.client_context()) as c:
            wait_for(
                lambda: call(c, "filter", {"Pod": pods[0], "NodeNames": ["solo"]})["NodeNames"] == ["solo"],
                what="node in cache",
            )

        def bind(p: dict[str, Any]) -> str:
            with KeepAliveClient(control.port, control.ca.client_context()) as conn:
                return str(call(conn, "bind", bind_args(p, "solo"))["Error"])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            errors = list(pool.map(bind, pods))
    finally:
        stop.set()
        daemon.join(10)
    assert errors.count("") == 4, errors
    assert all("no longer fits" in e for e in errors if e), errors
    per_gpu: dict[str, int] = {}
    for item in core_v1.list_namespaced_pod("default").items:
        text = (item.metadata.annotations or {}).get(DEVICES_TO_ALLOCATE)
        if text:
            for s in decode_pod_allocation(text).containers[0].devices:
                per_gpu[s.uuid] = per_gpu.get(s.uuid, 0) + s.usedmem
    assert per_gpu == {"GPU-solo-0": 12000, "GPU-solo-1": 12000}


def test_prioritize_follows_the_task_mix_learned_from_the_pods_observed(
    tmp_path: Path, apiserver: ApiServerHandle, core_v1: Any
) -> None:
    """`--fragmentation-mix observed` through the real process: OpenB's mix until 3 GPU tasks were seen,
    then the mix of the pods (all half a T4), in the scores, /metrics and the log."""
    control = start_control(
        tmp_path,
        apiserver.kubeconfig,
        "--node-scheduler-policy",
        "fragmentation",
        "--fragmentation-mix-min-tasks",
        "3",
        "--fragmentation-mix-interval",
        "0.1",
    )
    try:
        add_node(core_v1, "holed", 1)
        add_node(core_v1, "idle", 1)
        with KeepAliveClient(control.port, control.ca.client_context()) as c:
            holder = create_gpu_pod(core_v1, "holder", mem=GPU_MEM // 2)
            wait_for(
                lambda: (
                    call(c, "filter", {"Pod": holder, "NodeNames": ["holed", "idle"]})["NodeNames"]
                    == ["holed", "idle"]
                ),
                what="both nodes in the extender's cache",
            )
            assert call(c, "bind", bind_args(holder, "holed")) == {"Error": ""}  # half of holed's GPU
            probe = create_gpu_pod(core_v1, "probe", mem=GPU_MEM // 2)

            def scores(p: dict[str, Any]) -> dict[str, int]:
                answer = call(c, "prioritize", {"Pod": p, "NodeNames": ["holed", "idle"]})
                return {e["Host"]: e["Score"] for e in answer}

            # Two tasks seen: OpenB's mix, where the half GPU left on idle is a fragment for most tasks.
            assert wait_for(lambda: scores(probe) == {"holed": 9, "idle": 1}, what="holed's half GPU held")
            _, text = c.request("GET", "/metrics")
            assert 'hami_fragmentation_mix_probability{shape="1000",source="configured"}' in text.decode()

            third = create_gpu_pod(core_v1, "third", mem=GPU_MEM // 2)
            wanted = 'hami_fragmentation_mix_probability{shape="500",source="observed"} 1.0'
            wait_for(lambda: wanted in c.request("GET", "/metrics")[1].decode(), what="the observed mix")
            # Every task takes half a GPU: no half GPU is a fragment, both placements score alike.
            assert scores(third) == {"holed": 5, "idle": 5}
    finally:
        code = control.stop()
    log = control.log()
    assert code == 0, log
    assert "fragmentation policies now use the observed mix of the last 3 GPU tasks 500:100" in log
