"""`kubectl hami` against the local API server, as a user runs it: the `kubectl-hami` console script as a
subprocess, through real `kubectl` (the plugin found on PATH), and as `hami-control status`. Nodes carry
hami-node's register annotation and allocatable GPUs; pods are bound with hami-control's Binding
annotations, some then allocated as hami-node leaves them. `top` must show the numbers of those
annotations; unknown pods and unreachable clusters get one line and exit 1, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_api import annotations as ann
from hami_sim.apiserver.kubeconfig import write_kubeconfig
from tests.apiserver_util import create_and_bind
from tests.builders import allocation, container, gpu_info, gpu_pod, node, resource_quota
from tests.conftest import KUBECTL, ApiServerHandle

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-hami"
A100 = "NVIDIA A100-SXM4-80GB"
A0, A1, T0 = "GPU-0a0a0a0a-0000-0000-0000-000000000000", "GPU-1a1a1a1a-1111", "GPU-7474t4t4-0000"

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """Run a program with the script directory first on PATH and a HOME of its own."""
    if not PLUGIN.exists():
        pytest.fail(f"{PLUGIN} is missing: reinstall the package (hack/setup.sh) for its console scripts")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"

    def go(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        if args[0] == KUBECTL and not Path(KUBECTL).exists():
            if os.environ.get("HAMI_REQUIRE_KUBECTL") == "1":
                pytest.fail("kubectl is required here (HAMI_REQUIRE_KUBECTL=1) but is not installed")
            pytest.skip("kubectl is not installed (hack/setup.sh installs it when run as root)")
        extra = {"KUBECONFIG": str(kubeconfig)} if kubeconfig is not None else {}
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=60, env={**env, **extra}, check=False
        )

    return go


@pytest.fixture
def cluster(apiserver: ApiServerHandle, core_v1: Any) -> ApiServerHandle:
    """gpu-a (two A100s), gpu-t4 (one T4), cpu-1; four pods bound by hami-control, three allocated."""
    core_v1.create_node(
        node(
            "gpu-a",
            [gpu_info(0, id=A0, devmem=81920, type=A100), gpu_info(1, id=A1, devmem=81920, type=A100)],
        )
    )
    core_v1.create_node(node("gpu-t4", [gpu_info(0, id=T0, devmem=15360)]))
    core_v1.create_node(node("cpu-1", allocatable={"cpu": "8"}))
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="ai-team")))
    placed = [
        ("inference-a", "ai-team", "gpu-a", [(A0, 8000, 25)], True),
        ("inference-b", "ai-team", "gpu-a", [(A0, 8000, 25)], True),
        ("training", "default", "gpu-a", [(A1, 40000, 50)], True),
        ("t4-job", "default", "gpu-t4", [(T0, 4000, 0)], False),
    ]
    for name, namespace, where, slices, allocated in placed:
        main = container(gpus=len(slices), gpumem=slices[0][1], gpucores=slices[0][2])
        create_and_bind(core_v1, name, where, [main], allocation(slices), namespace=namespace)
        if allocated:  # what hami-node leaves once Allocate is done, and the kubelet's Running
            core_v1.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": {ann.BIND_PHASE: "success"}}}
            )
            core_v1.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})
    core_v1.create_namespaced_resource_quota(
        "ai-team", resource_quota({"limits.nvidia.com/gpumem": "20000", "limits.nvidia.com/gpucores": "100"})
    )
    return apiserver


def _annotated_usage(core_v1: Any) -> dict[str, list[int]]:
    """Per GPU UUID: [slices, MiB, cores] summed from the pods' allocation annotations as read back."""
    used: dict[str, list[int]] = {}
    for pod in core_v1.list_pod_for_all_namespaces().items:
        annotations = pod.metadata.annotations or {}
        text = annotations.get(ann.DEVICES_ALLOCATED) or annotations.get(ann.DEVICES_TO_ALLOCATE)
        if not text or pod.status.phase in ("Succeeded", "Failed"):
            continue
        for slices in ann.decode_pod_allocation(text):
            for s in slices.devices:
                entry = used.setdefault(s.uuid, [0, 0, 0])
                entry[0] += 1
                entry[1] += s.usedmem
                entry[2] += s.usedcores
    return used


def _registered(core_v1: Any) -> dict[str, tuple[int, int, int]]:
    """Per GPU UUID: (slots, MiB, cores) from the nodes' register annotations."""
    out = {}
    for item in core_v1.list_node().items:
        text = (item.metadata.annotations or {}).get(ann.NODE_REGISTER)
        for gpu in ann.decode_node_register(text) if text else ():
            out[gpu.id] = (gpu.count, gpu.devmem, gpu.devcore)
    return out


def test_top_shows_the_numbers_of_the_annotations(cluster: ApiServerHandle, core_v1: Any, run: Run) -> None:
    done = run(str(PLUGIN), "top", "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
    assert done.returncode == 0, done.stderr
    shown = {g["uuid"]: g for n in json.loads(done.stdout)["nodes"] for g in n["gpus"]}
    used, registered = _annotated_usage(core_v1), _registered(core_v1)
    assert set(shown) == set(registered) == {A0, A1, T0}
    for uuid, gpu in shown.items():
        slots, memory, cores = used.get(uuid, [0, 0, 0])
        total_slots, total_memory, total_cores = registered[uuid]
        assert gpu["slices"] == {"used": slots, "total": total_slots}, uuid
        assert gpu["memoryMiB"] == {"used": memory, "total": total_memory}, uuid
        assert gpu["cores"] == {"used": cores, "total": total_cores}, uuid
    assert [p["name"] for p in shown[A0]["pods"]] == ["inference-a", "inference-b"]
    assert shown[A0]["memoryMiB"]["used"] == 16000 and shown[T0]["memoryMiB"]["used"] == 4000


@pytest.mark.kubectl
def test_kubectl_runs_the_plugin_found_on_path_and_hami_control_status_prints_the_same(
    cluster: ApiServerHandle, run: Run
) -> None:
    through_kubectl = run(KUBECTL, "hami", "top", kubeconfig=cluster.kubeconfig)
    assert through_kubectl.returncode == 0, through_kubectl.stderr
    lines = through_kubectl.stdout.splitlines()
    assert lines[0].split()[:5] == ["NODE", "GPU", "UUID", "MODEL", "SLICES"]
    assert any(
        line.startswith("gpu-a") and "16000/81920" in line and "ai-team/inference-a" in line for line in lines
    )
    assert any(
        line.startswith("gpu-t4") and "4000/15360" in line and "default/t4-job" in line for line in lines
    )
    assert not any(line.startswith("cpu-1") for line in lines)
    direct = run(str(PLUGIN), "top", "--kubeconfig", str(cluster.kubeconfig))
    status = run(str(BIN / "hami-control"), "status", "top", "--kubeconfig", str(cluster.kubeconfig))
    assert direct.stdout == status.stdout == through_kubectl.stdout
    wide = run(
        KUBECTL,
        "hami",
        "top",
        "--node",
        "gpu-a",
        "-n",
        "default",
        "-o",
        "wide",
        kubeconfig=cluster.kubeconfig,
    )
    assert wide.returncode == 0, wide.stderr
    (row,) = wide.stdout.splitlines()[1:]
    assert A1 in row and "default/training (40000 MiB, 50%)" in row


@pytest.mark.kubectl
def test_explain_a_pending_pod_says_why_per_node_with_its_events(
    cluster: ApiServerHandle, core_v1: Any, run: Run
) -> None:
    created = core_v1.create_namespaced_pod(
        "default", gpu_pod("big", gpumem=60000, scheduler_name="hami-scheduler")
    )
    core_v1.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="big.1"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name="big", namespace="default", uid=created.metadata.uid, api_version="v1"
            ),
            reason="FailedScheduling",
            message="0/3 nodes are available: 3 node(s) didn't fit the GPU request.",
            type="Warning",
        ),
    )
    done = run(KUBECTL, "hami", "explain", "pod", "big", kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Pod default/big: Pending, not on a node." in text
    assert "finds 1 node(s) that fit its GPUs now (gpu-a)" in text
    assert "container main: 1 GPU with 60000 MiB and 0% of the cores" in text
    assert f"gpu-a   fits: would get GPU 0 ({A0})" in text  # 65920 MiB free there, 41920 on GPU 1
    assert "gpu-t4  does not fit (1/1 CardInsufficientMemory)" in text
    assert "less free memory than the 60000 MiB asked (the most free on one GPU: 11360 MiB)" in text
    assert "1 node(s) without HAMi GPUs: cpu-1" in text
    assert "Warning FailedScheduling: 0/3 nodes are available" in text
    running = run(
        str(PLUGIN), "explain", "pod", "training", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)
    )
    assert running.returncode == 0, running.stderr
    data = json.loads(running.stdout)
    assert (data["phase"], data["node"], data["bindPhase"]) == ("Running", "gpu-a", "success")
    assert data["gpus"] == [
        {
            "holder": "main",
            "vendor": "nvidia",
            "uuid": A1,
            "index": 1,
            "model": A100,
            "memoryMiB": 40000,
            "cores": 50,
        }
    ]


@pytest.mark.kubectl
def test_quota_shows_hard_against_used(cluster: ApiServerHandle, run: Run) -> None:
    done = run(KUBECTL, "hami", "quota", "-n", "ai-team", kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert rows[0][:6] == ["ai-team", "limits.nvidia.com/gpumem", "16000", "MiB", "20000", "MiB"]
    assert rows[1][:6] == ["ai-team", "limits.nvidia.com/gpucores", "50", "%", "100", "%"]


def test_an_unknown_pod_or_node_is_one_line_naming_it_and_exit_1(cluster: ApiServerHandle, run: Run) -> None:
    done = run(
        str(PLUGIN), "explain", "pod", "nope", "-n", "ai-team", "--kubeconfig", str(cluster.kubeconfig)
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == 'kubectl hami: pod "nope" not found in namespace "ai-team"\n'
    node_done = run(str(PLUGIN), "top", "--node", "nope", "--kubeconfig", str(cluster.kubeconfig))
    assert (node_done.returncode, node_done.stderr) == (1, "kubectl hami: node 'nope' not found\n")


def test_no_cluster_is_one_line_naming_the_server_or_the_kubeconfig(tmp_path: Path, run: Run) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = write_kubeconfig(tmp_path / "down", f"http://127.0.0.1:{port}")
    done = run(str(PLUGIN), "top", kubeconfig=config)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"kubectl hami: cannot reach the API server http://127.0.0.1:{port} (from ")
    assert "Traceback" not in done.stderr
    missing = run(str(PLUGIN), "quota", "--kubeconfig", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert missing.stderr == f"kubectl hami: kubeconfig {tmp_path / 'nowhere'} (--kubeconfig): no such file\n"
    bad_flag = run(str(PLUGIN), "top", "-o", "xml")
    assert bad_flag.returncode == 2 and "invalid choice: 'xml'" in bad_flag.stderr
