"""bench/chaos.py's pure parts: the seeds it runs and the line of its table each run's report gives (the
runs themselves are bench work, outside the test suite)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from hami_sim.chaos.report import ChaosReport, LatencySummary, LostPod

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load_chaos_bench() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the script imports benchlib beside it, as when it runs
    spec = importlib.util.spec_from_file_location("bench_chaos", BENCH / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_chaos_bench()


def test_the_fixed_seeds_come_first_then_distinct_random_ones_none_of_them_fixed() -> None:
    seeds = bench.pick_seeds([90210, 90210, 7], 3, random.Random(1))
    assert seeds[:2] == [90210, 7] and len(seeds) == 5 and len(set(seeds)) == 5
    assert all(1 <= s <= bench.MAX_SEED for s in seeds)
    assert bench.pick_seeds([], 0) == []


def test_a_runs_line_gives_its_result_losses_with_room_and_times_per_path() -> None:
    report = ChaosReport(seed=5, mode="mixed", nodes=20, gpus_per_node=4, pods_planned=10, duration_s=61.2)
    report.running_by_path = {"device-plugin": LatencySummary.of([1.0, 3.0]), "dra": LatencySummary.of([2.0])}
    report.whole_gpu_by_path = {"dra": LatencySummary.of([4.0])}
    report.lost = [LostPod("ns", "p", "Pending", "Unschedulable", path="dra", room=True, room_detail="n1")]
    row = bench.summary_row(5, report.to_data(), 1)
    assert row == [
        5,
        "FAIL",
        0,
        "1 (1 with room)",
        "1.0 / 3.0 (2)",
        "2.0 / 2.0 (1)",
        "-",
        "4.0 / 4.0 (1)",
        "61 s",
    ]
    assert bench.summary_row(6, None, 2)[:2] == [6, "no report (exit 2)"]
    assert len(bench.markdown_table(bench.HEADER, "rllrrrrrr", [row])) == 3
