"""Prometheus's binaries for the tests that run them (Debian's `prometheus` package: prometheus and
promtool; hack/setup.sh installs it as root). Without them those tests skip, unless
HAMI_REQUIRE_PROMETHEUS=1 (CI, .ci/run) makes a missing one a failure."""

from __future__ import annotations

import os
import shutil

import pytest


def required_binary(name: str) -> str:
    """The path of `name` (prometheus, promtool) on PATH; skips the test without it (fails under
    HAMI_REQUIRE_PROMETHEUS=1)."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("HAMI_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{name} is required here (HAMI_REQUIRE_PROMETHEUS=1) but is not on PATH")
        pytest.skip(
            f"{name} is not installed (Debian's prometheus package; hack/setup.sh installs it as root)"
        )
    return found
