"""hami_node.durable: the one atomic, durable file writer, and how the readers of the files it writes treat
a corrupt one (reported with its path, never used)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hami_node import durable
from hami_node.durable import is_temporary, remove_durably, write_atomic
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import DeviceManager
from hami_sim.kubelet.runtime import ContainerRuntime
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_write_atomic_creates_the_directory_and_replaces_the_file_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    assert write_atomic(target, b'{"v": 1}') == target
    assert target.read_bytes() == b'{"v": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    write_atomic(target, "é\n", mode=0o600)
    assert target.read_text(encoding="utf-8") == "é\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")
    blocker = tmp_path / "dir.json"
    blocker.mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(blocker, b"new")  # the rename over a directory fails after the data was written
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "state.json"]


def test_the_file_and_then_its_directory_are_fsynced_around_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power-loss durability cannot be observed from a test: the order of fsync and rename can."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    target = tmp_path / "ckpt"
    write_atomic(target, b"x")
    assert [c[0] for c in calls] == ["fsync", "replace", "fsync"]
    assert is_temporary(Path(calls[0][1]).name, "ckpt")
    assert calls[1][1] == str(target)
    assert calls[2][1] == str(tmp_path)
    calls.clear()
    assert remove_durably(target) is True
    assert calls == [("fsync", str(tmp_path))]
    assert remove_durably(target) is False


WRITER = """
import sys
from hami_node.durable import write_atomic
path, size = sys.argv[1], int(sys.argv[2])
i = 0
while True:
    write_atomic(path, (b"ab"[i % 2 : i % 2 + 1]) * size)
    i += 1
"""


def _rewritten(child: subprocess.Popen[bytes], target: Path, before: int) -> bool:
    assert child.poll() is None, child.stderr.read() if child.stderr else b""
    return target.exists() and target.stat().st_mtime_ns != before


def test_a_writer_killed_at_any_moment_leaves_the_old_bytes_or_the_new_ones(tmp_path: Path) -> None:
    """SIGKILL a process that rewrites a 2 MiB file in a loop, five times: each time the file is whole,
    all `a` or all `b`; what a kill leaves behind is only temporary files `is_temporary` recognises."""
    target = tmp_path / "state"
    size = 2 << 20
    for _ in range(5):
        before = target.stat().st_mtime_ns if target.exists() else 0
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), str(size)], cwd=REPO, stderr=subprocess.PIPE
        )
        try:
            wait_for(
                lambda child=child, before=before: _rewritten(child, target, before),
                30.0,
                "the writer to rewrite the file",
                interval=0.005,
            )
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            if child.stderr is not None:
                child.stderr.close()
        data = target.read_bytes()
        assert len(data) == size and data in (b"a" * size, b"b" * size)
    leftovers = [p.name for p in tmp_path.iterdir() if p != target]
    assert all(is_temporary(name, "state") for name in leftovers), leftovers


def test_is_temporary_recognises_only_a_writes_temporary_files() -> None:
    assert is_temporary(".state.json.x1y2.tmp", "state.json")
    assert is_temporary(".state.json.x1y2.tmp")
    assert not is_temporary(".other.json.x1y2.tmp", "state.json")
    assert not is_temporary("state.json", "state.json")
    assert not is_temporary(".state.json.x1y2", "state.json")


# --- corrupt files are reported with their path and never used ------------------------------------------


def test_the_kubelet_stand_in_continues_after_a_corrupt_device_checkpoint_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with tempfile.TemporaryDirectory(prefix="hd-", dir="/tmp") as short:  # Unix socket paths: ~107 bytes
        _corrupt_device_checkpoint(Path(short), caplog)


def _corrupt_device_checkpoint(directory: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = KubeletConfig("node-a", directory / "dp")
    config.checkpoint_path.parent.mkdir(parents=True)
    config.checkpoint_path.write_bytes(b'{"Data": {"PodDeviceEntries": [')

    async def scenario() -> dict[str, frozenset[str]]:
        manager = DeviceManager(config)
        await manager.start()
        try:
            return dict(manager.snapshot().allocated)
        finally:
            await manager.stop()

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == {}
    assert f"checkpoint {config.checkpoint_path}: not JSON" in caplog.text
    assert "continue after failing to read the device checkpoint" in caplog.text


def test_the_kubelet_stand_in_ignores_a_corrupt_container_record_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "containers.json"
    path.write_text('{"containers": [{"podUID": ')
    runtime = ContainerRuntime(path)
    with caplog.at_level(logging.ERROR):
        runtime.load()
    assert str(path) in caplog.text
    assert runtime.get("any", "c") is None
