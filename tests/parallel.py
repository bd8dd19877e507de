"""How the suite runs on several pytest-xdist workers (hack/test.sh: `-n N --dist loadgroup`).

- Tests of a module that share a module-, class- or package-scoped fixture (a local cluster, a scanner
  run) go to one worker together, so the fixture is set up once; every other test is handed out on its
  own, so the workers stay evenly loaded to the end.
- The tests are handed out longest first, roughly: end-to-end modules (10-100 s each), then unit tests
  (the protocol model's checks take up to 15 s), integration tests (up to 10 s) and fuzz tests (up to
  5 s), so that no worker starts a long one while the others run dry.

xdist's own `loadgroup` reads a group from a suffix it writes into each test's node ID, which pytest 9's
structured node IDs no longer allow (pytest-dev/pytest-xdist#1386: the groups are silently ignored).
Here each worker writes the groups it collected to a file the controller named in its `workerinput`
(xdist's channel from the controller to a worker), and `GroupScheduling` reads them before handing
out the first test: every worker collects the same tests in the same order (xdist checks), so one
worker's file is the whole plan.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_FILE = "hami_test_groups_file"
_GROUPS_DIR = pytest.StashKey[Path]()
_SHARED_SCOPES = ("module", "class", "package")
_FOLDER_ORDER = {"e2e": 0, "unit": 1, "integration": 2, "fuzz": 3}


def shared_group(item: pytest.Item) -> str | None:
    """The group of a test that uses a fixture shared by several tests of its module (the module's
    path), or None."""
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    defs = getattr(fixtureinfo, "name2fixturedefs", {})
    if any(d.scope in _SHARED_SCOPES for fixturedefs in defs.values() for d in fixturedefs):
        return item.nodeid.split("::")[0]
    return None


def order_items(items: list[pytest.Item]) -> None:
    """End-to-end tests first, then unit, integration and fuzz tests; the collection order within each
    folder (a stable sort)."""
    items.sort(key=lambda item: _FOLDER_ORDER.get(item.path.parent.name, len(_FOLDER_ORDER)))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order_items(items)
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    if GROUPS_FILE in workerinput:
        groups = {item.nodeid: group for item in items if (group := shared_group(item)) is not None}
        path = Path(workerinput[GROUPS_FILE])
        part = path.with_suffix(".part")
        part.write_text(json.dumps(groups))
        os.replace(part, path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller: tell each worker where to write the groups it collects."""
    folder = node.config.stash.get(_GROUPS_DIR, None)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="hami-test-groups-"))
        node.config.stash[_GROUPS_DIR] = folder
    node.workerinput[GROUPS_FILE] = str(folder / f"{node.gateway.id}.json")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GROUPS_DIR, None)
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
            path = Path(node.workerinput[GROUPS_FILE])
            if path.exists():
                groups: dict[str, str] = json.loads(path.read_text())
                return groups
        raise pytest.UsageError("no xdist worker wrote the tests' groups (tests/parallel.py)")

    def _split_scope(self, nodeid: str) -> str:
        return self.groups.get(nodeid, nodeid)
