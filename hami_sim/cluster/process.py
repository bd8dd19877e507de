"""One component process of the local cluster: started detached (its own session, output to its log),
recognised again later by pid *and* start time (so a recycled pid is never signalled), and stopped with
SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ENV_KEEP = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV", "USER", "LOGNAME")


def child_env() -> dict[str, str]:
    """Only what Python needs: nothing a component reads as a setting (KUBECONFIG, NODE_NAME, HAMI_*)."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(("LC_", "PYTHON"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot) from /proc, or None when it is gone or a
    zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Proc:
    """A component's process. `pid`/`ticks` identify it; `popen` is there only in the process that
    started it (and reaps it)."""

    name: str
    argv: list[str]
    log: Path
    port: int | None = None
    pid: int = 0
    ticks: int = 0
    log_offset: int = 0
    """Size of the log when this run started: markers are looked for after it."""
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def start(self, *, append: bool = False) -> None:
        """Start it in its own session; a fresh log unless `append` (a restart keeps the history)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab" if append else "wb") as out:
            if append:
                out.write(f"\n==== hami-sim: {self.name} restarted ====\n".encode())
                out.flush()
            self.log_offset = out.tell()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
                close_fds=True,
            )
        self.pid = self.popen.pid
        self.ticks = start_ticks(self.pid) or 0

    def alive(self) -> bool:
        if self.pid <= 0:
            return False
        if self.popen is not None:
            return self.popen.poll() is None
        ticks = start_ticks(self.pid)
        return ticks is not None and ticks == self.ticks

    def exit_code(self) -> int | None:
        """The exit status when this process started it and it has ended; else None."""
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the process to end (and reap it when this process started it);
        False when it still runs."""
        gone = _wait_gone([self], timeout_s)
        if gone and self.popen is not None and self.popen.returncode is None:
            self.popen.wait()
        return gone

    def new_output(self) -> str:
        """The log written since this run started."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        text = self.new_output().rstrip()
        return "\n".join(text.splitlines()[-lines:]) if text else "(no output)"

    def why_dead(self) -> str:
        code = self.exit_code()
        if code is None:
            return "is no longer running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def to_data(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "log": str(self.log),
            "port": self.port,
            "pid": self.pid,
            "startTicks": self.ticks,
        }

    @classmethod
    def from_data(cls, name: str, data: Mapping[str, Any]) -> Proc:
        return cls(
            name,
            [str(a) for a in data["argv"]],
            Path(data["log"]),
            port=data.get("port"),
            pid=int(data.get("pid") or 0),
            ticks=int(data.get("startTicks") or 0),
        )


def stop_all(procs: Iterable[Proc], grace_s: float) -> list[str]:
    """SIGTERM each, wait up to `grace_s` for all, SIGKILL the rest and wait for them too. Returns the
    names of those that needed SIGKILL."""
    procs = [p for p in procs if p.alive()]
    for p in procs:
        p.signal(signal.SIGTERM)
    killed = [] if _wait_gone(procs, grace_s) else [p.name for p in procs if p.alive()]
    for p in procs:
        p.signal(signal.SIGKILL)
    _wait_gone(procs, 10.0)
    for p in procs:
        if p.popen is not None and p.popen.returncode is None:
            p.popen.wait()
    return killed


def _wait_gone(procs: list[Proc], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(p.alive() for p in procs):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
