"""The chaos checker against the local API server and kubelet state files written here: a clean cluster
gives no violation, one over-committed GPU gives exactly one, and only once two passes in a row see it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from hami_node.plugin.api import api_pb2
from hami_sim.apiserver.kubeconfig import write_kubeconfig
from hami_sim.chaos import checker as checker_module
from hami_sim.chaos.checker import CheckerReadError, InvariantChecker
from hami_sim.kubelet import checkpoint as kcp
from hami_sim.kubelet import runtime
from tests.apiserver_util import create_and_bind
from tests.builders import allocation, container, gpu_info, node, pod, resource_quota
from tests.conftest import ApiServerHandle


def write_kubelet_state(directory: Path, uid: str) -> None:
    """Node n1's kubelet has started pod a's container on GPU-0 with 4000 MiB."""
    directory.mkdir()
    entry = kcp.PodDeviceEntry(
        uid, "main", "nvidia.com/gpu", {-1: ("GPU-0-3",)}, api_pb2.ContainerAllocateResponse()
    )
    kcp.write_checkpoint(directory / "kubelet_internal_checkpoint", [entry], {"nvidia.com/gpu": ["GPU-0-3"]})
    record = runtime.ContainerRecord(
        uid, "default", "a", "main", env=("NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=4000m")
    )
    (directory / "containers.json").write_bytes(runtime.encode_containers([record]))


def test_a_clean_cluster_has_no_violation_and_an_overcommitted_gpu_exactly_one(
    apiserver: ApiServerHandle, core_v1: Any, tmp_path: Path
) -> None:
    core_v1.create_node(node("n1", [gpu_info(0, devmem=16000), gpu_info(1, devmem=16000)]))
    core_v1.create_namespaced_resource_quota("default", resource_quota({"limits.nvidia.com/gpumem": "64000"}))
    gpu = container("main", gpus=1, gpumem=4000)
    uid = create_and_bind(core_v1, "a", "n1", [gpu], allocation([("GPU-0", 4000, 30)]))
    create_and_bind(core_v1, "b", "n1", [gpu], allocation([("GPU-0", 10000, 30)]))
    core_v1.create_namespaced_pod("default", pod("cpu-only", container("main")))
    write_kubelet_state(tmp_path / "n1", uid)

    with InvariantChecker(apiserver.kubeconfig, {"n1": tmp_path / "n1"}) as checker:
        assert checker.check_once() == []
        assert checker.check_once() == []
        assert checker.passes == 2

        create_and_bind(core_v1, "c", "n1", [gpu], allocation([("GPU-0", 4000, 30)]))
        assert checker.check_once() == []  # seen once: not yet a violation
        (violation,) = checker.check_once()
        assert violation.key == ("gpu-memory-overcommit", "n1/GPU-0")
        assert violation.evidence["held"]["mem"] == 18000
        assert sorted(p["pod"] for p in violation.evidence["pods"]) == ["default/a", "default/b", "default/c"]
        assert "first_seen_at" in violation.evidence
        assert checker.check_once() == []  # reported once
        assert checker.counts() == {"gpu-memory-overcommit": 1}
        assert checker.violations == [violation]
        assert checker.skipped_passes == 0


def test_the_final_check_finds_a_stuck_pod_and_an_allocation_left_for_a_gone_pod(
    apiserver: ApiServerHandle, core_v1: Any, tmp_path: Path
) -> None:
    core_v1.create_node(node("n1", [gpu_info(0, devmem=16000)]))
    gpu = container("main", gpus=1, gpumem=4000)
    create_and_bind(core_v1, "stuck", "n1", [gpu], allocation([("GPU-0", 4000, 30)]))
    core_v1.patch_namespaced_pod(
        "stuck", "default", {"metadata": {"annotations": {"hami.io/bind-time": "1000"}}}
    )
    write_kubelet_state(tmp_path / "n1", "uid-of-a-deleted-pod")

    with InvariantChecker(apiserver.kubeconfig, {"n1": tmp_path / "n1"}, bind_timeout_s=60) as checker:
        found = sorted(v.key for v in checker.final_check())
    assert found == [
        ("allocation-leaked", "n1/containers.json/uid-of-a-deleted-pod"),
        ("allocation-leaked", "n1/kubelet_internal_checkpoint/uid-of-a-deleted-pod"),
        ("bind-phase-stuck", "default/stuck"),
        ("pod-in-bind-phase", "default/stuck"),
        ("pod-not-settled", "default/stuck"),
    ]


def test_a_pass_that_cannot_reach_the_api_server_is_skipped_and_the_final_check_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(checker_module, "READ_ATTEMPTS", 1)
    with InvariantChecker(kubeconfig, {}) as checker:
        assert checker.check_once() == []
        assert (checker.passes, checker.skipped_passes) == (0, 1)
        with pytest.raises(CheckerReadError, match="GET /api/v1/pods"):
            checker.final_check()
