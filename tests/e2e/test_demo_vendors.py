"""End to end: `hami-sim demo` as a user runs it (its own process, the default heterogeneous cluster):
the Ascend vNPU and the Hygon DCU pods of `examples/demo-vendors/` run on their vendors' nodes beside the
NVIDIA workloads, and the usage table shows every device with its vendor (issue 26)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_an_npu_and_a_dcu_pod_beside_the_gpu_pods_and_shows_every_vendor(
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
