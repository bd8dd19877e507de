"""hami-control as a real process for the integration tests (started with TLS and a kubeconfig, waited
for until /readyz answers, stopped with SIGTERM), and `raw_pod` to read a pod back as JSON."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.control_server_util import CA, KeepAliveClient, write_pair
from tests.waiting import wait_for

_ENV_KEEP = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV")
_SERVING = re.compile(r"on https://127\.0\.0\.1:(\d+)")


def control_env() -> dict[str, str]:
    """Only what Python needs: nothing hami-control reads as a setting (KUBECONFIG, HAMI_*, ...)."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(("LC_", "PYTHON"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class ControlProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    ca: CA
    port: int = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_file.close()
        return self.proc.returncode


def start_control(
    tmp_path: Path,
    kubeconfig: Path,
    *args: str,
    env: dict[str, str] | None = None,
    name: str = "hami-control",
) -> ControlProcess:
    ca = CA.new("hami-control-e2e-ca")
    cert, key = write_pair(tmp_path / f"certs-{name}", ca.serving("hami-control"))
    log_path = tmp_path / f"{name}.log"
    log_file = log_path.open("wb")
    command = [
        sys.executable,
        "-m",
        "hami_control.main",
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--kubeconfig",
        str(kubeconfig),
        *args,
    ]
    proc = subprocess.Popen(
        command, stdout=log_file, stderr=subprocess.STDOUT, env={**control_env(), **(env or {})}
    )
    control = ControlProcess(proc, log_path, log_file, ca)
    try:

        def serving() -> int:
            if proc.poll() is not None:
                raise AssertionError(f"hami-control exited with {proc.returncode}:\n{control.log()}")
            found = _SERVING.search(control.log())
            return int(found.group(1)) if found else 0

        control.port = wait_for(serving, 30, "hami-control to listen")
        with KeepAliveClient(control.port, ca.client_context()) as c:
            wait_for(lambda: c.request("GET", "/readyz")[0] == 200, 30, "/readyz to answer 200")
    except BaseException:
        control.stop()
        print(control.log())
        raise
    return control


def raw_pod(core_v1: Any, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API server stores it (JSON), not the official client's model of it."""
    response = core_v1.read_namespaced_pod(name, namespace, _preload_content=False)
    body: dict[str, Any] = json.loads(response.data)
    return body
