"""What the benchmark scripts share, so each says only what it measures: the command line's common
options, progress lines on stderr, latency figures (p50/p99/max/mean), Markdown tables, the JSON file,
and the processes (the local API server, a hami-control child with a serving certificate, py-spy, the
/proc readings of CPU time and memory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

APISERVER = (sys.executable, "-m", "hami_sim.main", "apiserver")
JSON_HELP = "also write the results as JSON here"


# --- the command line ----------------------------------------------------------------------------------


def arg_parser(doc: str | None) -> argparse.ArgumentParser:
    """A bench's parser: its module text as the description, kept as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_json_option(parser: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    parser.add_argument("--json", type=Path, help=help)


def add_daemon_options(parser: argparse.ArgumentParser, *, qps_help: str, py_spy_help: str) -> None:
    """The options of a bench that runs hami-node as its own process: the daemon's log level and API
    rate limit, py-spy samples of it, the JSON file, and keeping the temporary directory."""
    parser.add_argument("--log-level", default="info", help="the daemon's --log-level")
    parser.add_argument("--kube-api-qps", type=float, help=qps_help)
    add_json_option(parser)
    parser.add_argument("--py-spy", type=Path, help=py_spy_help)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")


def write_json(path: Path | None, data: object) -> None:
    """`data` as indented JSON at `path` (nothing when no path was given)."""
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n")


def log(message: str) -> None:
    """A progress line on stderr, with the time of day (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- figures and tables --------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The value at rank `int(n * q)` of sorted values (q in 0..1), the last for q = 1."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


@dataclass
class Stat:
    """Latency samples (seconds) of one measure and its errors; `summary()` in ms (NaN for no sample)."""

    name: str
    samples: list[float] = field(default_factory=list)
    """Seconds."""
    errors: int = 0

    def q(self, fraction: float) -> float:
        """The `fraction` percentile in ms (see `percentile`)."""
        return percentile(sorted(self.samples), fraction) * 1000 if self.samples else math.nan

    def summary(self) -> dict[str, Any]:
        s = self.samples
        return {
            "name": self.name,
            "count": len(s),
            "errors": self.errors,
            "p50_ms": round(statistics.median(s) * 1000, 3) if s else math.nan,
            "p99_ms": round(self.q(0.99), 3),
            "max_ms": round(max(s) * 1000, 3) if s else math.nan,
            "mean_ms": round(statistics.fmean(s) * 1000, 3) if s else math.nan,
        }

    def data(self) -> dict[str, Any]:
        """`summary()` with the samples in ms, for the JSON file."""
        return self.summary() | {"samples_ms": [round(x * 1000, 3) for x in self.samples]}


@dataclass
class Throughput:
    """A load phase: requests answered, their rate, latency p50/p99, errors and the server's CPU per
    request (set by the caller that measured it)."""

    name: str
    requests: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_us: float = float("nan")
    """Server process CPU time (user + system) per request in this phase."""


def throughput(name: str, latencies: list[float], seconds: float, errors: int, digits: int = 3) -> Throughput:
    """A phase's figures from its latencies (seconds; sorted here) over `seconds`, ms rounded to `digits`."""
    latencies.sort()
    p50, p99 = p50_p99_ms(latencies, digits)
    return Throughput(
        name, len(latencies), round(seconds, 2), round(len(latencies) / seconds, 1), p50, p99, errors
    )


def p50_p99_ms(sorted_values: Sequence[float], digits: int = 3) -> tuple[float, float]:
    """The median and the 99th percentile (see `percentile`) of sorted seconds, in ms rounded to
    `digits`; NaN for no value."""
    if not sorted_values:
        return math.nan, math.nan
    return (
        round(statistics.median(sorted_values) * 1000, digits),
        round(percentile(sorted_values, 0.99) * 1000, digits),
    )


async def closed_loop(
    concurrency: int, seconds: float, one: Callable[[int], Awaitable[bool]]
) -> tuple[list[float], int, float]:
    """`concurrency` workers call `one(n)` (n counts the calls, from 1) back to back for `seconds`:
    (latencies in seconds, calls that answered False, the seconds it took)."""
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal errors, counter
        while time.monotonic() < stop_at:
            counter += 1
            started = time.perf_counter()
            ok = await one(counter)
            latencies.append(time.perf_counter() - started)
            errors += not ok

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors, time.monotonic() - started


async def server_cpu_charged(pid: int, phase: Awaitable[list[Throughput]]) -> list[Throughput]:
    """Run a phase and charge process `pid`'s CPU time to its first result (the requests it drove)."""
    before = cpu_seconds(pid)
    results = await phase
    spent = cpu_seconds(pid) - before
    results[0].server_cpu_us = round(spent * 1e6 / max(1, results[0].requests), 1)
    return results


def markdown_header(header: Sequence[str], align: str) -> list[str]:
    """A Markdown table's first two lines: `align` has a letter a column, `l` (left) or `r` (right)."""
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: one letter, l or r, for each of the {len(header)} columns")
    return [markdown_row(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]


def markdown_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def markdown_table(header: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table's lines (see `markdown_header`), a row a line."""
    return [*markdown_header(header, align), *(markdown_row(row) for row in rows)]


def padded_table(header: Sequence[str], widths: Sequence[int], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table whose columns line up in plain text: each column at least its `widths` entry and
    its header wide, the first left-aligned, the others right-aligned (cells already formatted)."""
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(["-" * (widths[0] + 2), *("-" * (w + 1) + ":" for w in widths[1:])]) + "|"
    return [line(header), rule, *(line(row) for row in rows)]


# --- processes -----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds spent by the whole machine (all CPUs, anything but idle and iowait), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int | None:
    """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM, ...), or None when it has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def status_mb(pid: int, key: str) -> float:
    """A `kB` line of /proc/<pid>/status in MB (10^6 bytes); KeyError when it has none."""
    kib = status_kib(pid, key)
    if kib is None:
        raise KeyError(key)
    return kib * 1024 / 1e6


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB, from /proc (Linux); 0 when it has none."""
    kib = status_kib(pid, "VmRSS")
    return 0.0 if kib is None else kib / 1024


def stop_process(proc: subprocess.Popen[Any] | None, name: str = "", timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s` (said on stderr when `name`d)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if name:
            log(f"{name} did not stop on SIGTERM; killing it")
        proc.kill()
        proc.wait()


def wait_until(  # noqa: PLR0917 - the wait's parts, named
    what: str,
    check: Callable[[], bool],
    timeout: float,
    proc: subprocess.Popen[bytes],
    name: str = "the process",
    poll_s: float = 0.01,
) -> None:
    """Poll `check` until it holds; SystemExit naming `what` if `proc` exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise SystemExit(f"{what}: {name} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll_s)


@contextlib.contextmanager
def py_spy(pid: int, output: Path | None, what: str, *, rate: int = 500, gil: bool = False) -> Iterator[None]:
    """Sample process `pid` with py-spy (when `output` is given; py-spy must be on PATH) while the block
    runs: raw (collapsed) stacks at `output`, `--gil` for the GIL holder only. `what` names the
    samples in the closing log line."""
    if output is None:
        yield
        return
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--py-spy needs py-spy on PATH (pip install py-spy)")
    command = [spy, "record", "--pid", str(pid), "--rate", str(rate), *(["--gil"] if gil else [])]
    command += ["--format", "raw", "-o", str(output), "--nonblocking"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log(f"py-spy samples of {what}: {output}")


def start_apiserver(
    kubeconfig: Path, log_path: Path, *extra_args: str, timeout_s: float = 20.0
) -> tuple[subprocess.Popen[bytes], str]:
    """`hami-sim apiserver` on a free loopback port as its own process; returns it and its base URL
    once it has written `kubeconfig`. Its output goes to `log_path`."""
    log_file = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [*APISERVER, "--port", "0", *extra_args, "--kubeconfig-out", str(kubeconfig)],
        stdout=log_file,
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


def serving_cert(workdir: Path) -> tuple[bytes, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1/localhost signed by it, the pair written to
    `workdir`/tls.crt and tls.key: (the CA's certificate, the cert's path, the key's path)."""
    from hami_sim.tls import generate_ca, generate_serving_cert

    ca_cert, ca_key = generate_ca("bench-ca")
    cert_pem, key_pem = generate_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    return ca_cert, cert, key


def start_control_child(  # noqa: PLR0917 - the child's parts, named
    script: str, workdir: Path, kubeconfig: Path, cert: Path, key: Path, ready: str, *extra: str
) -> tuple[subprocess.Popen[str], list[str]]:
    """`script --serve` (a bench's hami-control child) on a free port with the serving pair, its stderr to
    `workdir`/control.log; waits for its first stdout line, which must start with `ready`, and returns
    the process and that line's words after it (the port first). Exits with the log's end otherwise."""
    args = ["--bind", "127.0.0.1:0", "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--kubeconfig", str(kubeconfig), *extra]
    log_path = workdir / "control.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [sys.executable, script, "--serve", *args], stdout=subprocess.PIPE, stderr=log_file, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(ready + " "):
        proc.kill()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise SystemExit(f"hami-control did not start: {line!r}; its log ends:\n{tail}")
    return proc, line.split()[1:]
