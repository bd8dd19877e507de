"""Fuzz inputs are large on purpose (100,000-deep JSON, 5,000-digit numbers): hypothesis warns that it
shows them in full; the warning is expected here, not a failure (pytest turns warnings into errors).

Under `HYPOTHESIS_PROFILE=long` a property runs 100,000 examples, for minutes: the suite's 120 s
per-test timeout (pytest-timeout) does not apply to them then. `HAMI_FUZZ_PROGRESS=<dir>` makes each
property write how many examples it has run to `<dir>/<test>.count` (every 100), so a long run that is
stopped early still says how far it got."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

_HERE = Path(__file__).parent


def _counting(test: Callable[..., Any], out: Path) -> Callable[..., Any]:
    count = 0

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        if count % 100 == 0:
            out.write_text(f"{count}\n")
        return test(*args, **kwargs)

    return run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    progress = os.environ.get("HAMI_FUZZ_PROGRESS")
    for item in items:
        if _HERE not in item.path.parents:
            continue
        item.add_marker(pytest.mark.filterwarnings("ignore:Generating overly large repr"))
        if settings.default.max_examples >= 100_000:
            item.add_marker(pytest.mark.timeout(0))
        handle = getattr(getattr(item, "obj", None), "hypothesis", None)
        if progress and handle is not None and not getattr(handle, "_hami_counted", False):
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", item.nodeid.split("/")[-1])
            Path(progress).mkdir(parents=True, exist_ok=True)
            handle.inner_test = _counting(handle.inner_test, Path(progress) / f"{name}.count")
            handle._hami_counted = True
