"""bench/benchlib.py's pure parts: the figures and tables every bench script prints (the scripts themselves
run outside the test suite: speed is checked in bench/, never by timed tests)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _benchlib() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "benchlib.py"
    spec = importlib.util.spec_from_file_location("benchlib", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("benchlib", module)
    spec.loader.exec_module(module)
    return module


benchlib = _benchlib()


def test_percentile_is_the_value_at_rank_n_times_q_and_the_last_for_q_one() -> None:
    values = [float(i) for i in range(1, 101)]
    assert benchlib.percentile(values, 0.5) == 51.0
    assert benchlib.percentile(values, 0.99) == 100.0
    assert benchlib.percentile(values, 1.0) == 100.0
    assert benchlib.percentile([7.0], 0.99) == 7.0


def test_p50_p99_ms_rounds_to_the_digits_and_is_nan_for_no_value() -> None:
    assert benchlib.p50_p99_ms([0.001, 0.002, 0.0041234], 2) == (2.0, 4.12)
    p50, p99 = benchlib.p50_p99_ms([])
    assert math.isnan(p50) and math.isnan(p99)


def test_stat_summary_in_ms_and_nan_without_samples() -> None:
    stat = benchlib.Stat("rpc", [0.001, 0.003, 0.002], errors=1)
    assert stat.summary() == {
        "name": "rpc",
        "count": 3,
        "errors": 1,
        "p50_ms": 2.0,
        "p99_ms": 3.0,
        "max_ms": 3.0,
        "mean_ms": 2.0,
    }
    assert stat.data()["samples_ms"] == [1.0, 3.0, 2.0]
    empty = benchlib.Stat("none").summary()
    assert empty["count"] == 0 and math.isnan(empty["p99_ms"]) and math.isnan(empty["mean_ms"])


def test_throughput_sorts_the_latencies_and_rates_them_over_the_seconds() -> None:
    result = benchlib.throughput("GET", [0.003, 0.001, 0.002], 0.5, errors=1, digits=2)
    assert (result.requests, result.per_second, result.p50_ms, result.p99_ms) == (3, 6.0, 2.0, 3.0)
    assert result.errors == 1 and math.isnan(result.server_cpu_us)


def test_markdown_table_has_header_alignment_rule_and_a_line_per_row() -> None:
    lines = benchlib.markdown_table(("phase", "p99 ms"), "lr", [("quiet", 1.5), ("attack", "2.25")])
    assert lines == ["| phase | p99 ms |", "|---|---:|", "| quiet | 1.5 |", "| attack | 2.25 |"]


def test_markdown_table_refuses_an_alignment_that_does_not_fit_the_columns() -> None:
    with pytest.raises(ValueError, match="'lx'"):
        benchlib.markdown_table(("a", "b"), "lx", [])
    with pytest.raises(ValueError, match="'l'"):
        benchlib.markdown_table(("a", "b"), "l", [])


def test_padded_table_lines_up_its_columns_at_least_header_wide() -> None:
    lines = benchlib.padded_table(("phase", "requests"), (8, 5), [("GET pod", "1059")])
    assert lines == [
        "| phase    | requests |",
        "|----------|---------:|",
        "| GET pod  |     1059 |",
    ]
    assert len({len(line) for line in lines}) == 1
