"""End to end on `hami-sim` under chaos: a short `hami-sim chaos` run (6 nodes in mixed mode, two
hami-control replicas, a few faults of every kind: kills of each component, GPU faults, API server fault
windows) ends with no invariant violation and no pod lost, and its report counts the faults it injected
by kind, the API server's own counts among them. The long run (10,000 pods) is bench/chaos.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_sim.chaos.runner import ChaosOptions, run_chaos
from hami_sim.chaos.schedule import ALL_KINDS


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
