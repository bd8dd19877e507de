"""`hami-sim apiserver` as a process: kubeconfig out, ready line, serves kubectl, stops on SIGTERM."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import KUBECTL


@pytest.mark.kubectl
def test_cli_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hami_sim.main",
            "apiserver",
            "--port",
            "0",
            "--kubeconfig-out",
            str(kubeconfig),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        ready = lines.get(timeout=30)
        assert "hami-sim apiserver ready at http://127.0.0.1:" in ready
        port = ready.split("http://127.0.0.1:")[1].split()[0]
        assert f"server: http://127.0.0.1:{port}" in kubeconfig.read_text()
        env = {**os.environ, "HOME": str(tmp_path)}
        env.pop("KUBECONFIG", None)
        nodes = subprocess.run(
            [KUBECTL, "--kubeconfig", str(kubeconfig), "get", "namespaces", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=True,
        )
        assert "namespace/kube-system" in nodes.stdout.split()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        reader.join(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


def test_cli_rejects_a_bad_port(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hami_sim.main", "apiserver", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--port must be between 0 and 65535" in result.stderr
