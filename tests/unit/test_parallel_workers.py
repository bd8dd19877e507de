"""tests/parallel.py, the way the suite runs on several xdist workers: run on a small suite of its own
(pytester, two real xdist workers), the tests of a module that share a module-scoped fixture run on one
worker, which sets the fixture up once, while the other tests are handed out one by one to both
workers; `order_items` puts end-to-end tests first, then unit, integration and fuzz tests."""

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


def test_the_order_is_end_to_end_unit_integration_fuzz_then_the_rest_keeping_each_folders_order() -> None:
    names = ["unit/a", "fuzz/b", "e2e/c", "integration/d", "unit/e", "other/f", "e2e/g"]
    items: list[Any] = [SimpleNamespace(path=Path("tests", name + ".py"), name=name) for name in names]
    order_items(items)
    expected = ["e2e/c", "e2e/g", "unit/a", "unit/e", "integration/d", "fuzz/b", "other/f"]
    assert [i.name for i in items] == expected
