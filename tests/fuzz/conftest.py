"""Fuzz inputs are large on purpose (100,000-deep JSON, 5,000-digit numbers): hypothesis warns that it
shows them in full; the warning is expected here, not a failure (pytest turns warnings into errors).
Under `HYPOTHESIS_PROFILE=long` a property runs 100,000 examples, for minutes: the suite's 120 s
per-test timeout (pytest-timeout) does not apply to them then."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.filterwarnings("ignore:Generating overly large repr"))
            if settings.default.max_examples >= 100_000:
                item.add_marker(pytest.mark.timeout(0))
