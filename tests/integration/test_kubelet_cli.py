"""`hami-sim kubelet` as a process: ready line, Node created, a plugin registers, SIGHUP restarts
(sockets deleted, kubelet.sock back), SIGTERM stops and removes kubelet.sock and the PodResources
socket; DRA plugins register in the given registry directory; a corrupt DRA checkpoint stops it."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ApiServerHandle
from tests.integration.dra_plugin import DraPlugin
from tests.integration.kubelet_plugin import FakePlugin, devices


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _start(args: list[str]) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hami_sim.main", "kubelet", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return process, lines


def _wait_line(lines: queue.Queue[str], text: str, timeout: float = 30) -> str:
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line containing {text!r}; saw {seen}") from None
        seen.append(line)
        if text in line:
            return line


def test_cli_runs_restarts_on_sighup_and_stops_on_sigterm(
    apiserver: ApiServerHandle, short_dir: Path, core_v1: Any
) -> None:
    directory = short_dir / "dp"
    process, lines = _start(
        [
            "--node-name",
            "cli-node",
            "--dir",
            str(directory),
            "--kubeconfig",
            str(apiserver.kubeconfig),
            "--create-node",
        ]
    )
    plugin = FakePlugin(directory, initial=devices("a", "b"))
    try:
        ready = _wait_line(lines, "hami-sim kubelet ready")
        assert f"Registration on {directory}/kubelet.sock" in ready
        assert f"PodResources on {directory}/pod-resources/kubelet.sock" in ready
        assert core_v1.read_node("cli-node").status.capacity["cpu"] == "8"
        plugin.serve()
        plugin.register("example.com/dev")
        plugin.wait_stream()
        process.send_signal(signal.SIGHUP)
        _wait_line(lines, "hami-sim kubelet restarted")
        assert not plugin.socket.exists()
        assert (directory / "kubelet.sock").exists()
        plugin.stop()
        plugin.serve()
        plugin.register("example.com/dev")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not (directory / "kubelet.sock").exists()
        assert not (directory / "pod-resources" / "kubelet.sock").exists()
        assert (directory / "kubelet_internal_checkpoint").is_file()
    finally:
        plugin.stop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


def test_cli_rejects_bad_flags(short_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_sim.main",
            "kubelet",
            "--node-name",
            "n",
            "--dir",
            str(short_dir),
            "--cpu",
            "lots",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--cpu: " in result.stderr and "lots" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "hami_sim.main", "kubelet", "--node-name", "n", "--dir", "/tmp/" + "x" * 120],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "too long for Unix sockets" in result.stderr


def test_cli_registers_dra_plugins_in_the_given_directory_and_refuses_a_corrupt_dra_checkpoint(
    short_dir: Path,
) -> None:
    directory, registry = short_dir / "dp", short_dir / "reg"
    args = ["--node-name", "n", "--dir", str(directory), "--plugins-registry-dir", str(registry)]
    process, lines = _start(
        [*args, "--cdi-spec-dir", str(short_dir / "etc-cdi"), "--cdi-spec-dir", str(short_dir / "run-cdi")]
    )
    plugin = DraPlugin(registry, short_dir / "plugins")
    try:
        assert f"DRA plugins in {registry}" in _wait_line(lines, "hami-sim kubelet ready")
        plugin.serve()
        assert plugin.wait_statuses(1) == [(True, "")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        plugin.stop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
    (directory / "dra_manager_state").write_text("{")
    result = subprocess.run(
        [sys.executable, "-m", "hami_sim.main", "kubelet", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"DRA checkpoint {directory / 'dra_manager_state'}: not JSON" in result.stderr
    assert "Traceback" not in result.stderr
