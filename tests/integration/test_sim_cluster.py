"""The local cluster as a whole: `Cluster.up` starts real processes (API server stand-in, hami-control
with its webhook registered, the scheduler stand-in, per node a kubelet stand-in and hami-node with fake
GPUs); a GPU pod created through the official client without a schedulerName goes webhook -> scheduler
-> extender bind -> kubelet Allocate -> node daemon and runs; restarts, status and down leave nothing
behind; a failing component fails `up` by name; the CLI does the same in scale mode."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from hami_api.annotations import BIND_PHASE, DEVICES_ALLOCATED, NODE_REGISTER, VGPU_NODE
from hami_node.gpu.inventory import load_inventory, write_inventory
from hami_sim.cluster import (
    Cluster,
    ClusterError,
    ClusterSpec,
    GPUSpec,
    SpecError,
    model_memory_mib,
    node_inventory,
    parse_inventory_spec,
)
from hami_sim.cluster.process import start_ticks
from hami_sim.cluster.service import ServiceProxy, parse_endpoint
from hami_sim.nodehost import SpecError as HostSpecError
from hami_sim.nodehost import parse_host_spec
from tests.builders import gpu_pod
from tests.waiting import wait_for


def identities(cluster: Cluster) -> dict[str, tuple[int, int]]:
    return {name: (p.pid, p.ticks) for name, p in cluster.procs.items()}


def running(ids: dict[str, tuple[int, int]]) -> list[str]:
    """Which of these processes (pid and start time) still run; a recycled pid does not count."""
    return [name for name, (pid, ticks) in ids.items() if start_ticks(pid) == ticks]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Callable[[Path], Any]]:
    """Official-client CoreV1Api for a cluster's kubeconfig; every client is closed at the end."""
    clients: list[client.ApiClient] = []

    def make(kubeconfig: Path) -> Any:
        api_client = kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        clients.append(api_client)
        return client.CoreV1Api(api_client)

    yield make
    for c in clients:
        c.close()  # type: ignore[no-untyped-call]


def wait_running(core_v1: Any, name: str) -> Any:
    def phase() -> Any:
        pod = core_v1.read_namespaced_pod(name, "default")
        return pod if pod.status.phase == "Running" else None

    return wait_for(phase, 30, f"pod {name} to run")


def test_a_gpu_pod_runs_through_every_real_component(tmp_path: Path, api: Callable[[Path], Any]) -> None:
    spec = ClusterSpec.uniform(2, 2, split=4)
    cluster = Cluster.up(spec, tmp_path / "state")
    ids = identities(cluster)
    run_dir = cluster.run_dir
    try:
        assert set(cluster.procs) == {
            "apiserver", "hami-control", "scheduler",
            "kubelet/gpu-node-1", "hami-node/gpu-node-1", "kubelet/gpu-node-2", "hami-node/gpu-node-2",
        }  # fmt: skip
        assert all(p.alive() for p in cluster.procs.values())
        core_v1 = api(cluster.kubeconfig)
        for node in core_v1.list_node().items:
            assert node.status.allocatable["nvidia.com/gpu"] == "8"  # 2 GPUs x split 4
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            assert node.metadata.annotations[NODE_REGISTER].count("NVIDIA A100-SXM4-80GB") == 2

        # No schedulerName: the webhook sets hami-scheduler, the stand-in schedules it through the
        # extender, kubelet's Allocate reaches hami-node, which marks the bind a success.
        core_v1.create_namespaced_pod("default", gpu_pod("first", gpumem=1000))
        pod = wait_running(core_v1, "first")
        assert pod.spec.scheduler_name == "hami-scheduler"
        annotations = pod.metadata.annotations
        assert annotations[VGPU_NODE] == pod.spec.node_name
        assert ",NVIDIA,1000," in annotations[DEVICES_ALLOCATED]
        wait_for(
            lambda: (
                core_v1.read_namespaced_pod("first", "default").metadata.annotations[BIND_PHASE] == "success"
            ),
            10,
            "bind-phase success",
        )

        status = cluster.status()
        assert status.ok
        table = status.render()
        assert "hami-control" in table and "gpu-node-2  device-plugin  True   8" in table
        assert "nodes: 2/2 ready with nvidia.com/gpu; in hami-control's cache: 2" in table

        # hami-control restarts on the same port (the webhook and the scheduler keep their URL).
        old_pid = cluster.procs["hami-control"].pid
        port = cluster.control_port
        cluster.restart("hami-control")
        assert cluster.procs["hami-control"].pid != old_pid and cluster.control_port == port
        ids["hami-control (restarted)"] = (
            cluster.procs["hami-control"].pid,
            cluster.procs["hami-control"].ticks,
        )
        core_v1.create_namespaced_pod("default", gpu_pod("second", gpumem=1000))
        wait_running(core_v1, "second")
        saved = json.loads((cluster.state_dir / "cluster.json").read_text())
        assert saved["components"]["hami-control"]["pid"] == cluster.procs["hami-control"].pid

        with pytest.raises(ClusterError, match="in memory"):
            cluster.restart("apiserver")
        with pytest.raises(ClusterError, match="no component 'kubelet/nope'"):
            cluster.restart("kubelet/nope")
    finally:
        cluster.down()
    assert running(ids) == []
    assert not run_dir.exists()
    assert not (cluster.state_dir / "cluster.json").exists()
    assert (cluster.state_dir / "logs" / "hami-control.log").read_text().count("restarted") == 1


def test_a_failing_component_fails_up_by_name_and_stops_the_rest(tmp_path: Path) -> None:
    bad = tmp_path / "scheduler.yaml"
    bad.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofilez: []\n"
    )
    spec = ClusterSpec.uniform(1, 1, scheduler_config=bad, timeout_s=60)
    with pytest.raises(ClusterError) as failed:
        Cluster.up(spec, tmp_path / "state")
    message = str(failed.value)
    assert failed.value.component == "scheduler"
    assert message.startswith("scheduler exited with code 2 while waiting for")
    assert "profilez" in message  # the scheduler's own words, from its log
    assert len(failed.value.pids) == 5
    assert [pid for pid in failed.value.pids if start_ticks(pid) is not None] == []
    assert not (tmp_path / "state" / "cluster.json").exists()
    assert (tmp_path / "state" / "logs" / "scheduler.log").exists()


def hami_sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "hami_sim.main", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def test_cli_up_status_down_in_scale_mode(tmp_path: Path, api: Callable[[Path], Any]) -> None:
    state = tmp_path / "state"
    up = hami_sim(
        "up", "--state-dir", str(state), "--nodes", "2", "--gpus-per-node", "1", "--scale", cwd=tmp_path
    )
    assert up.returncode == 0, up.stderr
    assert "cluster up in" in up.stderr
    data = json.loads((state / "cluster.json").read_text())
    ids = {name: (c["pid"], c["startTicks"]) for name, c in data["components"].items()}
    try:
        assert set(ids) == {"apiserver", "hami-control", "scheduler", "kubelets", "hami-nodes"}
        status = hami_sim("status", "--state-dir", str(state), cwd=tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "(scale mode)" in status.stdout and "hami-nodes" in status.stdout
        assert "nodes: 2/2 ready" in status.stdout

        # Each hosted daemon serves /metrics on its own port, listed by status -o wide.
        cluster = Cluster.load(state)
        wide = hami_sim("status", "--state-dir", str(state), "-o", "wide", cwd=tmp_path)
        urls = [cluster.node_metrics_url(n) for n in cluster.node_names]
        assert len(set(urls)) == 2 and all(url in wide.stdout for url in urls), wide.stdout
        assert all('node="gpu-node-' in urllib.request.urlopen(u, timeout=10).read().decode() for u in urls)

        # A daemon whose port was taken while it was stopped takes another; cluster.json follows.
        cluster.stop_component("hami-node/gpu-node-1")
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", int(urls[0].rsplit(":", 1)[1].split("/")[0])))
            squatter.listen()
            cluster.start_component("hami-node/gpu-node-1")
        moved = Cluster.load(state).node_metrics_url("gpu-node-1")
        assert moved != urls[0]
        assert 'node="gpu-node-1"' in urllib.request.urlopen(moved, timeout=10).read().decode()

        # A node daemon restarts inside its host, from another process than the one that started it (on
        # the port it had).
        cluster.restart("hami-node/gpu-node-1")
        assert "hami-node/gpu-node-1" in cluster.components
        assert Cluster.load(state).node_metrics_url("gpu-node-1") == moved
        core_v1 = api(cluster.kubeconfig)
        core_v1.create_namespaced_pod("default", gpu_pod("after-restart", gpumem=1000))
        wait_running(core_v1, "after-restart")
        with pytest.raises(ClusterError, match="a cluster is already running in"):
            Cluster.up(cluster.spec, state)
    finally:
        down = hami_sim("down", "--state-dir", str(state), cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    wait_for(lambda: running(ids) == [], 10, "every process to be gone")
    assert not Path(data["runDir"]).exists()
    gone = hami_sim("status", "--state-dir", str(state), cwd=tmp_path)
    assert gone.returncode == 3 and "no cluster" in gone.stderr


def test_bad_input_is_refused_before_anything_starts(tmp_path: Path) -> None:
    result = hami_sim("up", "--state-dir", str(tmp_path / "s"), "--gpu-model", "Mystery GPU", cwd=tmp_path)
    assert result.returncode == 2
    assert "GPU model 'Mystery GPU': its memory is unknown" in result.stderr
    assert not (tmp_path / "s").exists()
    result = hami_sim("up", "--state-dir", str(tmp_path / "s"), "--control-replicas", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert "control_replicas: expected an integer >= 1, got 0" in result.stderr


# --- specs (pure) ------------------------------------------------------------------------------------


def test_inventory_files_describe_mixed_nodes() -> None:
    nodes = parse_inventory_spec(
        {
            "a100": {"count": 2, "model": "NVIDIA A100-SXM4-40GB"},
            "mixed": ["Tesla T4", {"model": "NVIDIA L4", "memory": 23034}, "NVIDIA H100 80GB HBM3"],
        },
        "inv.yaml",
    )
    assert [(n.name, [g.memory_mib for g in n.gpus]) for n in nodes] == [
        ("a100", [40960, 40960]),
        ("mixed", [15360, 23034, 81920]),
    ]
    inventory = node_inventory(nodes[1])
    assert [g.model for g in inventory.gpus] == ["Tesla T4", "NVIDIA L4", "NVIDIA H100 80GB HBM3"]
    assert inventory.links == ()  # no NVLink across models
    assert len(node_inventory(nodes[0]).links) == 1
    assert model_memory_mib("NVIDIA A100-SXM4-80GB") == 81920


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"n1": {"count": 0}}, "inv.yaml: n1.count: expected an integer >= 1, got 0"),
        ({"n1": ["Tesla T4", {"model": "X", "memory": "lots"}]}, "n1[1].memory: expected a positive number"),
        ({"Bad_Name": ["Tesla T4"]}, "node name: expected a DNS subdomain"),
        ({"n1": ["Unknown Thing"]}, "GPU model 'Unknown Thing': its memory is unknown"),
        ([], "expected a mapping of node name -> GPUs"),
    ],
)
def test_bad_inventory_files_are_named(data: object, error: str) -> None:
    with pytest.raises(SpecError) as failed:
        parse_inventory_spec(data, "inv.yaml")
    assert error in str(failed.value)


def test_cluster_specs_check_their_fields() -> None:
    with pytest.raises(SpecError, match="split: expected an integer >= 1, got 0"):
        ClusterSpec.uniform(1, 1, split=0)
    with pytest.raises(SpecError, match="node 'gpu-node-1' is listed twice"):
        spec = ClusterSpec.uniform(1, 1)
        ClusterSpec(spec.nodes * 2)
    assert ClusterSpec.uniform(9, 1).scale_mode and not ClusterSpec.uniform(8, 1).scale_mode
    spec = ClusterSpec.uniform(2, 4, memory_mib=1000, gpu_scheduler_policy="binpack")
    assert ClusterSpec.from_data(spec.to_data()) == ClusterSpec(
        spec.nodes, gpu_scheduler_policy="binpack", scale=False
    )
    assert spec.nodes[0].gpus[0] == GPUSpec("NVIDIA A100-SXM4-80GB", 1000)


def test_controller_manager_args_survive_cluster_json() -> None:
    spec = ClusterSpec.uniform(2, 1, controller_manager_args=("--kube-api-qps", "0")).with_mode("dra")
    assert ClusterSpec.from_data(spec.to_data()).controller_manager_args == ("--kube-api-qps", "0")


def test_host_specs_name_the_bad_field() -> None:
    good = {"nodes": [{"name": "n1", "kubeletDir": "/tmp/x/1", "nodeArgs": ["--gpu-backend", "fake"]}]}
    assert parse_host_spec(good, "h.json").nodes[0].node_args == ("--gpu-backend", "fake")
    with pytest.raises(HostSpecError, match=r"h.json: nodes\[0\].kubeletDir: expected an absolute path"):
        parse_host_spec({"nodes": [{"name": "n1", "kubeletDir": "rel"}]}, "h.json")
    with pytest.raises(HostSpecError, match="too long for Unix sockets"):
        parse_host_spec({"nodes": [{"name": "n1", "kubeletDir": "/" + "x" * 100}]}, "h.json")
    with pytest.raises(HostSpecError, match=r"h\.json: unknown key 'node'"):
        parse_host_spec({"node": []}, "h.json")


def test_control_replicas_are_checked_and_kept_in_cluster_json(tmp_path: Path) -> None:
    for bad in (0, True, 1.5):
        with pytest.raises(SpecError, match="control_replicas: expected an integer >= 1"):
            ClusterSpec.uniform(1, 1, control_replicas=bad)
    spec = ClusterSpec.uniform(1, 1, control_replicas=2)
    assert ClusterSpec.from_data(spec.to_data()).control_replicas == 2
    assert ClusterSpec.from_data({**spec.to_data(), "controlReplicas": None}).control_replicas == 1
    assert Cluster(spec, tmp_path).control_replicas == ["hami-control-0", "hami-control-1"]
    assert Cluster(ClusterSpec.uniform(1, 1), tmp_path).control_replicas == ["hami-control"]


def test_the_leader_lease_follows_the_last_control_arg(tmp_path: Path) -> None:
    assert Cluster(ClusterSpec.uniform(1, 1, control_replicas=2), tmp_path).lease() == (
        "kube-system",
        "hami-control",
    )
    args = ("--leader-elect-namespace", "a", "--leader-elect-lease=l1", "--leader-elect-namespace=b")
    spec = ClusterSpec.uniform(1, 1, control_replicas=2, control_args=args)
    assert Cluster(spec, tmp_path).lease() == ("b", "l1")


def test_the_service_proxy_sends_to_the_leader_else_to_ready_replicas_in_turn() -> None:
    a, b = parse_endpoint("hami-control-0=9001"), parse_endpoint("hami-control-1=9002")
    proxy = ServiceProxy(9000, [a, b], ssl.create_default_context())
    assert proxy.choose() is None  # no endpoint ready: the connection is refused
    proxy.ready = [a, b]
    assert [proxy.choose() for _ in range(4)] == [a, b, a, b]
    proxy.leader = b
    assert {proxy.choose() for _ in range(4)} == {b}
    for bad in ("hami-control-0", "=9001", "x=0", "x=port"):
        with pytest.raises(ValueError, match="--endpoint: expected NAME=PORT"):
            parse_endpoint(bad)


def test_gpu_faults_edit_the_nodes_fake_inventory(tmp_path: Path) -> None:
    spec = ClusterSpec.uniform(1, 2)
    cluster = Cluster(spec, tmp_path)
    path = cluster.inventory_path("gpu-node-1")
    path.parent.mkdir(parents=True)
    write_inventory(path, node_inventory(spec.nodes[0]))
    cluster.inject_gpu_fault("gpu-node-1", 1, "lost")
    cluster.inject_gpu_fault("gpu-node-1", 1, "ecc-double-bit")
    cluster.inject_gpu_fault("gpu-node-1", None, "nvml-absent")
    inventory = load_inventory(path)
    assert [g.lost for g in inventory.gpus] == [False, True]
    assert [(e.kind.value, e.gpu) for e in inventory.events] == [("ecc-double-bit", inventory.gpus[1].uuid)]
    assert inventory.nvml.value == "absent"
    cluster.clear_gpu_fault("gpu-node-1", 1)
    cluster.clear_gpu_fault("gpu-node-1", None)
    assert load_inventory(path) == node_inventory(spec.nodes[0])
    with pytest.raises(ClusterError, match="node: no node 'gpu-node-9'"):
        cluster.clear_gpu_fault("gpu-node-9", 0)
