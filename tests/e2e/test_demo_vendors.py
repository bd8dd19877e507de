"""End to end: `hami-sim demo` as a user runs it (its own process, the default heterogeneous cluster):
the Ascend vNPU and the Hygon DCU pods of `examples/demo-vendors/` run on their vendors' nodes beside the
NVIDIA workloads, and the usage table shows every device with its vendor (issue 26); the pods of
`examples/demo-nvidia/` run on the nodes in NVIDIA's own sharing modes (a MIG device of mig-a under MIG
strategy mixed, a time-slice of ts-a's T4), placed by the default scheduler and answered by NVIDIA's
Allocate, and the table lists NVIDIA's resources with their allocated counts (issue 27)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_npu_dcu_mig_and_time_sliced_pods_beside_the_gpu_pods_and_shows_every_vendor(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hami_sim.main", "demo", "--state-dir", str(tmp_path / ".hami-sim")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    outcome = {line.split(":", 1)[0]: line for line in lines if line.startswith(("ok ", "-- "))}
    assert outcome["ok ai-team/npu-inference"].split(": ", 1)[1].startswith("Running on npu-a; server: ")
    assert "(Ascend910B4) 8192 MiB 0%" in outcome["ok ai-team/npu-inference"]
    assert "(DCU) 8000 MiB 50%" in outcome["ok ai-team/dcu-training"]
    assert "ok default/training" in outcome and "-- ai-team/batch-embed" in outcome
    table = lines[lines.index(next(x for x in lines if x.startswith("== Device usage"))) + 1 :]
    column = table[0].index("VENDOR")  # the rows line up under their header
    vendors = {
        row.split()[0]: row[column:].split()[0] for row in table[1:] if row[:5] in ("npu-a", "dcu-a", "gpu-a")
    }
    assert vendors == {"npu-a": "ascend", "dcu-a": "hygon", "gpu-a": "nvidia"}
    shared = outcome["ok default/shared-notebook"]
    assert "Running on ts-a (NVIDIA's plugin, default-scheduler)" in shared
    assert "nvidia.com/gpu.shared 1 -> NVIDIA_VISIBLE_DEVICES=GPU-" in shared
    for name, resource in (("mig-inference", "mig-1g.5gb"), ("mig-training", "mig-3g.20gb")):
        line = outcome[f"ok default/{name}"]
        assert (
            "Running on mig-a" in line and f"nvidia.com/{resource} 1 -> NVIDIA_VISIBLE_DEVICES=MIG-" in line
        )
    plugin = lines[
        lines.index(next(x for x in lines if x.startswith("NVIDIA device plugin resources"))) + 2 :
    ]
    allocated = {tuple(row.split()[:3]) for row in plugin if row[:4] in ("mig-", "ts-a")}
    assert {
        ("mig-a", "nvidia.com/mig-1g.5gb", "1/1"),
        ("mig-a", "nvidia.com/mig-2g.10gb", "0/1"),
        ("mig-a", "nvidia.com/mig-3g.20gb", "1/1"),
        ("ts-a", "nvidia.com/gpu.shared", "1/4"),
    } <= allocated
    assert "node-nvidia-register is missing" not in done.stderr
