"""Honest webhook and extender latency of hami-control while slow clients attack it (issue 16: under a
slow-client attack, hundreds of connections sending headers a byte at a time, honest requests keep their
p99 within 2x of the quiet figure).

Set-up: a `hami-sim apiserver` (its own process) seeded with a namespace with a GPU quota and `--nodes`
GPU nodes (bench/extender.py's node objects: 8 A100 80GB each, split 10); `hami-control` as its own
process (the real control plane with the server's default limits unless `--max-connections` is given,
plus a hidden `POST /noop` route that reads the body and answers a constant allow: **the floor**, an empty
handler behind the same TLS + HTTP + aiohttp on the same server in the same run).

Honest load, open loop (each request is sent at its scheduled time; latency counts from that time, so
queueing is not hidden), over keep-alive connections opened before the attack as kube-apiserver's and
kube-scheduler's pooled connections are: `/noop` and `/webhook` (a ~2 KB AdmissionReview of a GPU pod,
bench/webhook.py's) at `--rate` each, and `/filter` (ExtenderArgs, names-only, every node a candidate,
bench/extender.py's) at `--filter-rate`.

Phases, the same honest load in each, alternated `--rounds` times in one run (quiet, attack, quiet,
attack, ...; the machine is shared, so alternating spreads others' load over both kinds), each kind's
latencies pooled over its rounds:
1. quiet: no attacker;
2. attack: `--attackers` connections (a separate process at nice 19: it stands for remote clients, so
   its own CPU should not take the server's or the honest client's) complete their TLS handshake and
   then send `POST /webhook HTTP/1.1` and an endless header a byte at a time, one byte every
   `--byte-interval` seconds each; a connection the server closes is opened again at once. The phase
   starts once every attacker has connected.

Reported per kind of phase and endpoint: p50 and p99 in ms, requests, errors; the CPU seconds of
hami-control, of the attacker and of everything else on the machine (/proc/stat), and the 1-minute load
average at each phase's start and end (the machine is shared); for the attack, the bytes trickled and the
connections the server cut (by the header timeout or an eviction). Goal: attack p99 <= 2x quiet p99 for
/webhook and /filter. hami-control's event loop lag (how late a 10 ms timer in it runs, p50/p99/max over
each kind of phase) tells the server's own delay apart from the machine's.

Usage:

    python bench/slow_clients.py [--seconds 20] [--rounds 3] [--rate 100] [--filter-rate 20] [--attackers 300]
                                 [--byte-interval 1.0] [--nodes 20] [--max-connections N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import orjson
from benchlib import (
    add_json_option,
    arg_parser,
    cpu_seconds,
    log,
    machine_busy_seconds,
    markdown_table,
    percentile,
    serving_cert,
    start_apiserver,
    start_control_child,
    write_json,
)
from extender import node_name, node_object, scheduler_pod
from webhook import NOOP_ANSWER, review

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAMESPACE = "bench"
TYPICAL = (1, 8000)
GOAL_FACTOR = 2.0


@dataclass
class Latency:
    phase: str
    path: str
    requests: int
    p50_ms: float
    p99_ms: float
    errors: int


@dataclass
class Phase:
    """One kind of phase (quiet or attack), summed over the rounds."""

    name: str
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    attacker_cpu_s: float = 0.0
    others_cpu_s: float = 0.0
    """CPU the rest of the machine used (other processes, the load generator, the API server)."""
    load_averages: list[float] = field(default_factory=list)
    latencies: list[Latency] = field(default_factory=list)
    loop_lag_ms: dict[str, float] = field(default_factory=dict)
    """hami-control's event loop lag (a 10 ms timer's lateness) over the phases: p50, p99, max."""
    lags: list[float] = field(default_factory=list, repr=False)
    bytes_trickled: int = 0
    cut_by_server: int = 0
    raw: dict[str, tuple[list[float], int]] = field(default_factory=dict, repr=False)

    def add(self, path: str, latencies: list[float], errors: int) -> None:
        old, old_errors = self.raw.get(path, ([], 0))
        self.raw[path] = (old + latencies, old_errors + errors)

    def summarise(self, order: list[str]) -> None:
        lags = sorted(self.lags)
        if lags:
            self.loop_lag_ms = {
                "p50": round(percentile(lags, 0.5) * 1000, 2),
                "p99": round(percentile(lags, 0.99) * 1000, 2),
                "max": round(lags[-1] * 1000, 2),
            }
        self.latencies = []
        for path in order:
            values, errors = self.raw[path]
            values = sorted(values)
            self.latencies.append(
                Latency(
                    self.name,
                    path,
                    len(values),
                    round(percentile(values, 0.50) * 1000, 2),
                    round(percentile(values, 0.99) * 1000, 2),
                    errors,
                )
            )


def load_average() -> float:
    return os.getloadavg()[0]


# --- the server side (child process) ----------------------------------------------------------------------


def serve_child(argv: list[str]) -> int:
    """The real control plane plus `POST /noop`; prints `READY <port>` once synced, runs until SIGTERM."""
    import logging

    from aiohttp import web

    from hami_control.config import load_config
    from hami_control.main import ControlPlane
    from hami_control.server import read_body

    config = load_config(argv, {}, lambda p: p.read_text())
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def noop(request: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(request, config.server.max_request_body)
        if isinstance(body, web.Response):
            return body
        return web.Response(body=NOOP_ANSWER, content_type="application/json")

    lags: list[float] = []

    async def probe_lag() -> None:
        """How late the server's event loop runs a 10 ms timer: what any request would wait."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lags.append(loop.time() - due)

    async def lag(_request: web.BaseRequest) -> web.StreamResponse:
        values = sorted(lags)
        lags.clear()
        return web.json_response(values)

    async def run() -> None:
        plane = ControlPlane(config)
        plane.routes.add("POST", "/noop", noop)
        plane.routes.add("GET", "/lag", lag)
        prober = asyncio.create_task(probe_lag())
        await plane.start()
        assert plane.caches is not None and plane.server is not None
        await plane.caches.wait_synced()
        print(f"READY {plane.port}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        stats = plane.server.stats
        print(f"STATS {json.dumps(asdict(stats))}", flush=True)
        prober.cancel()
        await plane.stop()

    asyncio.run(run())
    return 0


# --- the attacker (child process) -------------------------------------------------------------------------


def attack_child(port: int, attackers: int, interval_s: float) -> int:
    """`attackers` TLS connections trickling an endless header; prints `CONNECTED n` once each has
    connected, then on each `report` line from stdin `REPORT <connected> <bytes sent> <cut>`."""
    os.nice(19)  # it stands for remote clients: its own CPU should not take the server's
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connected = 0
    sent = 0
    cut = 0
    ever: set[int] = set()
    ready = asyncio.Event()
    request = b"POST /webhook HTTP/1.1\r\nHost: hami-control\r\nX-Slow: "

    async def one(i: int) -> None:
        nonlocal connected, sent, cut
        await asyncio.sleep(interval_s * i / attackers)  # spread the bytes over the interval
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            except (OSError, ssl.SSLError):
                await asyncio.sleep(0.1)
                continue
            connected += 1
            ever.add(i)
            if len(ever) >= attackers:  # each has connected (over a cap they cannot all be at once)
                ready.set()
            position = 0
            try:
                while not reader.at_eof():
                    byte = request[position] if position < len(request) else ord("a")
                    writer.write(bytes([byte]))
                    await writer.drain()
                    sent += 1
                    position += 1
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(interval_s):
                            if await reader.read(1024) == b"":
                                break
            except (OSError, ssl.SSLError):
                pass
            connected -= 1
            cut += 1
            writer.close()

    async def run() -> None:
        tasks = [asyncio.create_task(one(i)) for i in range(attackers)]
        await ready.wait()
        print(f"CONNECTED {connected}", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            print(f"REPORT {connected} {sent} {cut}", flush=True)
        for task in tasks:
            task.cancel()

    asyncio.run(run())
    return 0


# --- the load side ----------------------------------------------------------------------------------------


async def seed(base: str, nodes: int) -> None:
    async with aiohttp.ClientSession(base) as http:
        objects = [
            (
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            ),
            (
                f"/api/v1/namespaces/{NAMESPACE}/resourcequotas",
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu", "namespace": NAMESPACE},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "1000000000000"}},
                },
            ),
            *(("/api/v1/nodes", node_object(i)) for i in range(nodes)),
        ]
        for path, obj in objects:
            async with http.post(path, json=obj) as r:
                assert r.status == 201, await r.text()


def start_control(
    workdir: Path, kubeconfig: Path, cert: Path, key: Path, extra: list[str]
) -> tuple[subprocess.Popen[str], int]:
    proc, words = start_control_child(__file__, workdir, kubeconfig, cert, key, "READY", *extra)
    return proc, int(words[0])


def start_attack(port: int, attackers: int, interval_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--attack", str(port), str(attackers), str(interval_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("CONNECTED "):
        proc.kill()
        raise SystemExit(f"the attacker did not connect: {line!r}")
    return proc


def attack_report(proc: subprocess.Popen[str]) -> tuple[int, int, int]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("report\n")
    proc.stdin.flush()
    _, connected, sent, cut = proc.stdout.readline().split()
    return int(connected), int(sent), int(cut)


Body = Callable[[int], bytes]


async def honest_load(
    http: aiohttp.ClientSession, streams: list[tuple[str, float, Body]], seconds: float, offset: int
) -> dict[str, tuple[list[float], int]]:
    """Every stream (path, requests per second, body of request i) at its fixed rate, all at once;
    per path, (latencies in seconds, errors)."""
    start = time.perf_counter() + 0.05
    results: dict[str, tuple[list[float], int]] = {}

    async def stream(path: str, rate: float, body: Body) -> None:
        total = int(rate * seconds)
        bodies = [body(offset + i) for i in range(total)]
        latencies: list[float] = []
        errors = 0

        async def one(i: int) -> None:
            nonlocal errors
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                async with http.post(path, data=bodies[i], headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    errors += r.status != 200
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - due)

        await asyncio.gather(*(one(i) for i in range(total)))
        results[path] = (latencies, errors)

    await asyncio.gather(*(stream(*s) for s in streams))
    return results


async def bench(args: argparse.Namespace, port: int, control_pid: int) -> list[Phase]:
    names_json = orjson.dumps([node_name(i) for i in range(args.nodes)])

    def filter_body(i: int) -> bytes:
        return (
            b'{"Pod":'
            + orjson.dumps(scheduler_pod(i, TYPICAL))
            + b',"Nodes":null,"NodeNames":'
            + names_json
            + b"}"
        )

    streams: list[tuple[str, float, Body]] = [
        ("/noop", args.rate, review),
        ("/webhook", args.rate, review),
        ("/filter", args.filter_rate, filter_body),
    ]
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    # Go's Transport keeps idle connections 90 s (aiohttp's default is 15 s).
    connector = aiohttp.TCPConnector(ssl=context, limit=args.connections, keepalive_timeout=90)
    phases = {"quiet": Phase("quiet"), "attack": Phase("attack")}
    offset = 0
    async with aiohttp.ClientSession(f"https://127.0.0.1:{port}", connector=connector) as http:
        log("warm-up (honest connections opened)")
        await honest_load(http, streams, 2.0, offset)
        for round_ in range(args.rounds):
            for phase in phases.values():
                attacker = None
                cut_before = sent_before = 0
                if phase.name == "attack":
                    log(f"attack: {args.attackers} connections, a byte every {args.byte_interval:g} s each")
                    attacker = start_attack(port, args.attackers, args.byte_interval)
                    _, sent_before, cut_before = attack_report(attacker)
                log(f"round {round_ + 1}/{args.rounds}, {phase.name}: {args.seconds:g} s of honest load")
                phase.load_averages.append(round(load_average(), 2))
                server_before, machine_before = cpu_seconds(control_pid), machine_busy_seconds()
                attacker_before = cpu_seconds(attacker.pid) if attacker is not None else 0.0
                async with http.get("/lag") as r:  # resets the server's record
                    await r.read()
                started = time.monotonic()
                offset += 100_000
                for path, (latencies, errors) in (
                    await honest_load(http, streams, args.seconds, offset)
                ).items():
                    phase.add(path, latencies, errors)
                phase.seconds += time.monotonic() - started
                async with http.get("/lag") as r:
                    phase.lags += await r.json()
                server = cpu_seconds(control_pid) - server_before
                attacker_cpu = 0.0
                if attacker is not None:
                    _, sent, cut = attack_report(attacker)
                    attacker_cpu = cpu_seconds(attacker.pid) - attacker_before
                    phase.bytes_trickled += sent - sent_before
                    phase.cut_by_server += cut - cut_before
                    attacker.terminate()
                    attacker.wait(10)
                phase.server_cpu_s += server
                phase.attacker_cpu_s += attacker_cpu
                phase.others_cpu_s += machine_busy_seconds() - machine_before - server - attacker_cpu
                phase.load_averages.append(round(load_average(), 2))
    for phase in phases.values():
        phase.summarise([s[0] for s in streams])
        phase.seconds = round(phase.seconds, 1)
        phase.server_cpu_s = round(phase.server_cpu_s, 2)
        phase.attacker_cpu_s = round(phase.attacker_cpu_s, 2)
        phase.others_cpu_s = round(phase.others_cpu_s, 2)
    return list(phases.values())


def report(phases: list[Phase], stats: dict[str, int] | None, attackers: int) -> str:
    lines = markdown_table(
        ("phase", "path", "requests", "p50 ms", "p99 ms", "errors"),
        "llrrrr",
        (
            (phase.name, f"`{r.path}`", r.requests, r.p50_ms, r.p99_ms, r.errors)
            for phase in phases
            for r in phase.latencies
        ),
    )
    lines.append("")
    for phase in phases:
        line = (
            f"- {phase.name}: {phase.seconds} s; CPU seconds: hami-control {phase.server_cpu_s}, "
            f"attacker {phase.attacker_cpu_s}, everything else on the machine {phase.others_cpu_s}; "
            f"1-min load average at each phase's start and end {phase.load_averages}; "
            f"hami-control's event loop lag (ms) {phase.loop_lag_ms}"
        )
        if phase.name == "attack":
            line += (
                f"; {attackers} attackers, {phase.bytes_trickled} bytes trickled, "
                f"{phase.cut_by_server} connections cut by the server"
            )
        lines.append(line)
    quiet = {r.path: r for r in phases[0].latencies}
    attack = {r.path: r for r in phases[-1].latencies}
    for path in ("/webhook", "/filter"):
        factor = attack[path].p99_ms / quiet[path].p99_ms
        verdict = "meets" if factor <= GOAL_FACTOR else "MISSES"
        lines.append(
            f"- `{path}` attack p99 / quiet p99 = {factor:.2f} ({verdict} the {GOAL_FACTOR:g}x goal)"
        )
    lines.append(
        f"- floor (`/noop`) p99: quiet {quiet['/noop'].p99_ms} ms, attack {attack['/noop'].p99_ms} ms"
    )
    if stats is not None:
        lines.append(f"- hami-control's connection stats at the end: {stats}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        return attack_child(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    parser = arg_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="quiet/attack phase pairs, alternated")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="requests per second to /noop and to /webhook"
    )
    parser.add_argument("--filter-rate", type=float, default=20.0, help="requests per second to /filter")
    parser.add_argument("--connections", type=int, default=16, help="honest keep-alive connections at most")
    parser.add_argument("--attackers", type=int, default=300, help="slow connections")
    parser.add_argument(
        "--byte-interval", type=float, default=1.0, help="seconds between an attacker's bytes"
    )
    parser.add_argument("--nodes", type=int, default=20, help="GPU nodes in the cluster (filter candidates)")
    parser.add_argument(
        "--max-connections", type=int, help="hami-control's --max-connections (default: its own)"
    )
    add_json_option(parser)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hami-bench-slow-") as tmp:
        workdir = Path(tmp)
        _ca, cert, key = serving_cert(workdir)
        kubeconfig = workdir / "kubeconfig"
        api, base = start_apiserver(kubeconfig, workdir / "apiserver.log")
        control = None
        stats: dict[str, int] | None = None
        extra = ["--max-connections", str(args.max_connections)] if args.max_connections else []
        try:
            asyncio.run(seed(base, args.nodes))
            control, port = start_control(workdir, kubeconfig, cert, key, extra)
            phases = asyncio.run(bench(args, port, control.pid))
        finally:
            for proc in (control, api):
                if proc is None:
                    continue
                proc.send_signal(signal.SIGTERM)
                try:
                    out, _ = proc.communicate(timeout=15) if proc is control else (None, None)
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    out = None
                if proc is control and out:
                    for line in out.splitlines():
                        if line.startswith("STATS "):
                            stats = json.loads(line[6:])
    print(report(phases, stats, args.attackers))
    phases_data = [{k: v for k, v in asdict(p).items() if k not in ("raw", "lags")} for p in phases]
    write_json(args.json, {"phases": phases_data, "stats": stats})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
