"""What the benchmark scripts share: the local API server as a process, and a process's CPU time and
resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

APISERVER = (sys.executable, "-m", "hami_sim.main", "apiserver")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_apiserver(
    kubeconfig: Path, log_path: Path, *extra_args: str, timeout_s: float = 20.0
) -> tuple[subprocess.Popen[bytes], str]:
    """`hami-sim apiserver` on a free loopback port as its own process; returns it and its base URL
    once it has written `kubeconfig`. Its output goes to `log_path`."""
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [*APISERVER, "--port", "0", *extra_args, "--kubeconfig-out", str(kubeconfig)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"apiserver exited with {proc.returncode}; see {log_path}")
        if kubeconfig.exists() and kubeconfig.stat().st_size > 0:
            config = yaml.safe_load(kubeconfig.read_text())
            return proc, str(config["clusters"][0]["cluster"]["server"])
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"apiserver did not write its kubeconfig within {timeout_s:.0f} s; see {log_path}")
