"""Shared fixtures: the in-memory API server on its own thread, official-client handles, kubectl."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from kubernetes import client

from hami_sim.apiserver import ApiServerRunner

pytest_plugins = ("pytester", "tests.parallel")

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

# CI runs the property tests with a fixed seed (deterministic: a red CI is a bug, never bad luck);
# local runs keep exploring new examples. `HYPOTHESIS_PROFILE=long` is the fuzzing run outside CI
# (docs/reliability.md, "Fuzzing"): at least 100,000 examples per property, no deadline.
# No profile has a deadline: the suite runs on several workers at once (hack/test.sh), where an example's
# time says more about the neighbours than about the code; speed is bench/'s business. Examples per
# property stay hypothesis's default (100) in every profile but "long".
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "long",
    max_examples=100_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif os.environ.get("CI"):
    settings.load_profile("ci")
else:
    settings.load_profile("dev")


@dataclass(frozen=True)
class ApiServerHandle:
    """A running stand-in API server: its URL, a kubeconfig for it, and the runner (store, counters)."""

    base_url: str
    kubeconfig: Path
    runner: ApiServerRunner


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerHandle]:
    """A fresh API server per test (bookmarks every 0.2 s so bookmark tests stay fast)."""
    with ApiServerRunner(bookmark_interval=0.2) as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        yield ApiServerHandle(runner.base_url, kubeconfig, runner)


@pytest.fixture
def api_client(apiserver: ApiServerHandle) -> Iterator[client.ApiClient]:
    """The official sync client pointed at the server."""
    configuration = client.Configuration(host=apiserver.base_url)
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def kubectl(apiserver: ApiServerHandle, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run real kubectl against the server: `kubectl("get", "pods")` -> CompletedProcess (text)."""
    if not os.path.exists(KUBECTL):
        if os.environ.get("HAMI_REQUIRE_KUBECTL") == "1":
            pytest.fail("kubectl is required here (HAMI_REQUIRE_KUBECTL=1) but is not installed")
        pytest.skip("kubectl is not installed (hack/setup.sh installs it when run as root)")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [
            KUBECTL,
            "--kubeconfig",
            str(apiserver.kubeconfig),
            "--cache-dir",
            str(tmp_path / "kcache"),
            *args,
        ]
        result = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=60, env=env, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run
