"""How the suite runs on several pytest-xdist workers (hack/test.sh: `-n N --dist loadgroup`).

- Tests of a module that share a module-, class- or package-scoped fixture (a local cluster, a scanner
  run) go to one worker together, so the fixture is set up once; every other test is handed out on its
  own, so the workers stay evenly loaded to the end.
- The tests are handed out longest first, roughly: end-to-end modules (10-100 s each), then unit tests
  (the protocol model's checks take up to 4 s), integration tests (up to 10 s) and fuzz tests (up to
  5 s), so that no worker starts a long one while the others run dry.
- A test that cannot share the machine with other tests says why in `@pytest.mark.serial("why")`: such
  tests go last, to one worker, and each runs alone: every test holds a shared lock on one file while it
  runs (set-up and tear-down included), a serial test an exclusive one. None needs it today: every test
  takes its own ports (0), temporary directories, sockets and local clusters.

xdist's own `loadgroup` reads a group from a suffix it writes into each test's node ID, which pytest 9's
structured node IDs no longer allow (pytest-dev/pytest-xdist#1386: the groups are silently ignored).
Here each worker writes the groups it collected to a file in a folder the controller named in its
`workerinput` (xdist's channel from the controller to a worker), and `GroupScheduling` reads them before
handing out the first test: every worker collects the same tests in the same order (xdist checks), so
one worker's file is the whole plan.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

PLAN_DIR = "hami_test_plan_dir"
SERIAL = "serial"
_PLAN_DIR = pytest.StashKey[Path]()
_SHARED_SCOPES = ("module", "class", "package")
_FOLDER_ORDER = {"e2e": 0, "unit": 1, "integration": 2, "fuzz": 3}


def serial_reason(item: pytest.Item) -> str | None:
    """Why the test must run alone (its `serial` marker's reason), or None."""
    mark = item.get_closest_marker(SERIAL)
    if mark is None:
        return None
    reason = mark.args[0] if mark.args else mark.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(f'{item.nodeid}: @pytest.mark.serial needs a reason: serial("why")')
    return reason


def group_of(item: pytest.Item) -> str | None:
    """The group of a test that must run on one worker with others: every serial test (`serial`), and
    the tests of a module that share a fixture of a scope wider than a test (the module's path)."""
    if serial_reason(item) is not None:
        return SERIAL
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    defs = getattr(fixtureinfo, "name2fixturedefs", {})
    if any(d.scope in _SHARED_SCOPES for fixturedefs in defs.values() for d in fixturedefs):
        return item.nodeid.split("::")[0]
    return None


def order_items(items: list[pytest.Item]) -> None:
    """End-to-end tests first, then unit, integration and fuzz tests, serial tests last; the collection
    order within each folder (a stable sort)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker(SERIAL) is not None:
            return len(_FOLDER_ORDER) + 1
        return _FOLDER_ORDER.get(item.path.parent.name, len(_FOLDER_ORDER))

    items.sort(key=rank)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "serial(reason): the test runs alone, after the others (tests/parallel.py); say why"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        serial_reason(item)  # a serial marker without a reason stops the run here, naming the test
    order_items(items)
    folder = _worker_plan_dir(config)
    if folder is not None:
        groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
        path = folder / f"{config.workerinput['workerid']}.json"  # type: ignore[attr-defined]
        part = path.with_suffix(".part")
        part.write_text(json.dumps(groups))
        os.replace(part, path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """On a worker: the test runs holding the plan's lock, shared, or exclusive for a serial test."""
    folder = _worker_plan_dir(item.config)
    if folder is None:
        return (yield)
    mode = fcntl.LOCK_EX if serial_reason(item) is not None else fcntl.LOCK_SH
    with open(folder / "running.lock", "a") as lock:
        fcntl.flock(lock, mode)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _worker_plan_dir(config: pytest.Config) -> Path | None:
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    return Path(workerinput[PLAN_DIR]) if PLAN_DIR in workerinput else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller: tell each worker the plan's folder."""
    folder = node.config.stash.get(_PLAN_DIR, None)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="hami-test-plan-"))
        node.config.stash[_PLAN_DIR] = folder
    node.workerinput[PLAN_DIR] = str(folder)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_PLAN_DIR, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with this suite's groups as the scopes, handed out in collection
    order (the order `order_items` chose), never re-sorted by the size of a scope."""

    def __init__(self, config: pytest.Config, log: Any) -> None:
        super().__init__(config, log)
        self.groups: dict[str, str] = {}

    def schedule(self) -> None:
        if self.collection is None:  # the first distribution: every worker has collected
            self.groups = self._read_groups()
            self.config.option.loadscopereorder = False
        super().schedule()

    def _read_groups(self) -> dict[str, str]:
        for node in self.nodes:
            path = Path(node.workerinput[PLAN_DIR]) / f"{node.gateway.id}.json"
            if path.exists():
                groups: dict[str, str] = json.loads(path.read_text())
                return groups
        raise pytest.UsageError("no xdist worker wrote the tests' groups (tests/parallel.py)")

    def _split_scope(self, nodeid: str) -> str:
        return self.groups.get(nodeid, nodeid)
