"""End to end on `hami-sim` under chaos: a short `hami-sim chaos` run (6 nodes in mixed mode, two
hami-control replicas, a few faults of every kind: kills of each component, GPU faults, API server fault
windows) ends with no invariant violation and no pod lost, and its report counts the faults it injected
by kind, the API server's own counts among them; so does a short run with nodes of other vendors (issue
26), whose pods the checker holds to their vendors' annotations with its own decoders. The long run
(10,000 pods) is bench/chaos.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hami_sim.chaos.runner import ChaosOptions, run_chaos
from hami_sim.chaos.schedule import ALL_KINDS

VENDOR_FAULTS = (
    "kill-control-leader",
    "kill-control-in-bind",
    "kill-kubelet",
    "kill-vendor-plugin",
    "api-conflict",
    "api-drop-watch",
    "api-error",
)


@pytest.mark.timeout(300)
def test_short_chaos_run_has_no_violation_and_loses_no_pod(tmp_path: Path) -> None:
    options = ChaosOptions(
        pods=200,
        nodes=6,
        gpus_per_node=4,
        seed=11,
        mode="mixed",
        state_dir=tmp_path / ".hami-sim",
        rate=8.0,
        faults_per_kind=1,
        settle_s=60.0,
        progress=False,
    )
    report = run_chaos(options)
    text = report.render_text()
    assert report.violations == {}, text
    assert report.lost == [], text
    assert report.fault_errors == [], text
    assert set(report.faults) == set(ALL_KINDS), text
    assert report.api_injected, text  # the API server's own counters say its windows hit something
    assert report.pods_created + sum(report.refused.values()) == 200, text
    assert report.succeeded > 0 and report.deleted > 0, text
    assert report.checker_passes > 1, text


@pytest.mark.timeout(300)
def test_short_mixed_vendor_chaos_run_has_no_violation_and_loses_no_pod(tmp_path: Path) -> None:
    """2 NVIDIA nodes and a Hygon, an Ascend and a Cambricon node (2 devices each), 60 pods of which half
    ask one of those vendors, one fault of each of `VENDOR_FAULTS` (seed 1: the Ascend node's kubelet and
    the Hygon plugin are killed mid-run). Cost (/usr/bin/time around `pytest -n 0` of this test, every
    process of the cluster included, 2 cores): about 12-16 s of CPU and 90-140 s of wall time, most of it
    waiting: a vendor node allocates its pods one at a time."""
    options = ChaosOptions(
        pods=60,
        nodes=2,
        gpus_per_node=2,
        seed=1,
        mode="device-plugin",
        vendors=("hygon", "ascend", "cambricon"),
        vendor_share=0.5,
        state_dir=tmp_path / ".hami-sim",
        rate=8.0,
        faults_per_kind=1,
        fault_kinds=VENDOR_FAULTS,
        settle_s=90.0,
        quiet_s=5.0,
        progress=False,
    )
    report = run_chaos(options)
    text = report.render_text()
    assert report.violations == {}, text
    assert report.lost == [], text
    assert report.fault_errors == [], text
    assert set(report.faults) == set(VENDOR_FAULTS), text
    for vendor in ("hygon", "ascend", "cambricon", "nvidia"):
        counts = report.by_vendor[vendor]
        assert counts["succeeded"] + counts["running"] > 0, (vendor, text)
    assert report.checker_passes > 1, text


@pytest.mark.timeout(120)
def test_a_terminated_chaos_run_takes_its_cluster_down(tmp_path: Path) -> None:
    """SIGTERM ends `hami-sim chaos` as Ctrl-C does: exit 130, and no process of its cluster is left."""
    state = tmp_path / ".hami-sim"
    argv = [sys.executable, "-m", "hami_sim.main", "chaos", "--pods", "50", "--nodes", "1"]
    argv += ["--mode", "device-plugin", "--faults", "none", "--no-progress", "--state-dir", str(state)]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "cluster up in" in line:
                break
        else:
            pytest.fail(f"hami-sim chaos never brought its cluster up (exit {proc.wait()})")
        pids = [c["pid"] for c in json.loads((state / "cluster.json").read_text())["components"].values()]
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130, rest
    assert "interrupted; the cluster was taken down" in rest
    assert not [pid for pid in pids if _running(pid)], pids


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not running
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
