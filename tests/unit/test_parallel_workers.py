"""tests/parallel.py, the way the suite runs on several xdist workers: run on small suites of their own
(pytester, two real xdist workers), the tests of a module that share a module-scoped fixture run on one
worker, which sets the fixture up once, while the other tests are handed out one by one to both
workers; a test marked `serial` runs while no other test does, and the marker needs a reason;
`order_items` puts end-to-end tests first, then unit, integration and fuzz tests, serial ones last."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.parallel import order_items

REPO = Path(__file__).resolve().parents[2]

SHARED_MODULE = """
import json, os, pytest
from pathlib import Path

@pytest.fixture(scope="module")
def cluster():
    Path(os.environ["RECORD"], "setups").open("a").write("x")
    yield

@pytest.mark.parametrize("i", range(6))
def test_shared(cluster, i):
    Path(os.environ["RECORD"], f"shared-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""

LONE_MODULE = """
import os
from pathlib import Path
import pytest

@pytest.mark.parametrize("i", range(6))
def test_lone(i):
    Path(os.environ["RECORD"], f"lone-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_modules_shared_fixture_is_set_up_once_on_one_worker_and_lone_tests_go_to_both(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    pytester.makepyfile(test_shared=SHARED_MODULE, test_lone=LONE_MODULE)
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "tests.parallel", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=12)
    workers = {path.name: path.read_text() for path in record.iterdir() if path.name != "setups"}
    assert (record / "setups").read_text() == "x"
    assert len({workers[f"shared-{i}"] for i in range(6)}) == 1
    assert {workers[f"lone-{i}"] for i in range(6)} == {"gw0", "gw1"}


def test_the_order_is_e2e_unit_integration_fuzz_the_rest_then_serial_keeping_each_folders_order() -> None:
    def item(name: str, serial: bool = False) -> Any:
        mark = pytest.mark.serial("why").mark if serial else None
        return SimpleNamespace(path=Path("tests", name + ".py"), name=name, get_closest_marker=lambda _: mark)

    names = ["unit/a", "fuzz/b", "e2e/c", "integration/d", "unit/e", "other/f", "e2e/g"]
    items = [item("e2e/s", serial=True)] + [item(name) for name in names]
    order_items(items)
    expected = ["e2e/c", "e2e/g", "unit/a", "unit/e", "integration/d", "fuzz/b", "other/f", "e2e/s"]
    assert [i.name for i in items] == expected


TIMED_MODULE = """
import os, time
from pathlib import Path
import pytest

def _run(name):
    start = time.monotonic()
    time.sleep(0.3)
    Path(os.environ["RECORD"], name).write_text(f"{start} {time.monotonic()}")

@pytest.mark.parametrize("i", range(5))
def test_parallel(i):
    _run(f"parallel-{i}")

@pytest.mark.serial("it needs the machine to itself")
def test_alone():
    _run("alone")
"""


def test_a_serial_test_runs_while_no_other_test_does(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    pytester.makepyfile(test_timed=TIMED_MODULE)
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "tests.parallel", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=6)
    spans = {path.name: tuple(map(float, path.read_text().split())) for path in record.iterdir()}
    alone_start, alone_end = spans.pop("alone")
    assert len(spans) == 5
    assert all(end <= alone_start or start >= alone_end for start, end in spans.values()), spans


def test_a_serial_marker_without_a_reason_stops_the_run_naming_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_bare="import pytest\n\n@pytest.mark.serial\ndef test_bare():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "tests.parallel")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*test_bare.py::test_bare: @pytest.mark.serial needs a reason*"])
