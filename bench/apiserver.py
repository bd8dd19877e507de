"""Throughput of the local API server (hami-sim apiserver): GET, PATCH, create and watch events.

The server runs as its own process (as in the local cluster); the load comes from this process over
keep-alive HTTP/1.1 connections on loopback. Both share the machine's cores, so the numbers are a
floor for what the server does alone. Usage:

    python bench/apiserver.py [--seconds 5] [--concurrency 16] [--watchers 4] [--json FILE]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

import aiohttp
import orjson
from benchlib import (
    Throughput as Result,
)
from benchlib import (
    add_json_option,
    arg_parser,
    closed_loop,
    p50_p99_ms,
    padded_table,
    start_apiserver,
    stop_process,
    throughput,
    write_json,
)
from benchlib import (
    server_cpu_charged as measured,
)


def pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}},
                }
            ]
        },
    }


async def run_load(
    name: str,
    seconds: float,
    concurrency: int,
    one: Callable[[int], Awaitable[bool]],
) -> Result:
    latencies, errors, elapsed = await closed_loop(concurrency, seconds, one)
    return throughput(name, latencies, elapsed, errors, digits=2)


async def one(result: Awaitable[Result]) -> list[Result]:
    return [await result]


async def bench(  # noqa: PLR0917
    base: str, pid: int, seconds: float, concurrency: int, watchers: int, pods: int
) -> list[Result]:
    results: list[Result] = []
    connector = aiohttp.TCPConnector(limit=concurrency + watchers + 4)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        # Seed pods for GET and PATCH.
        for i in range(pods):
            async with http.post("/api/v1/namespaces/default/pods", json=pod(f"seed-{i}")) as r:
                if r.status != 201:
                    raise SystemExit(f"seeding pod {i}: HTTP {r.status}: {await r.text()}")

        async def get_one(i: int) -> bool:
            async with http.get(f"/api/v1/namespaces/default/pods/seed-{i % pods}") as r:
                await r.read()
                return r.status == 200

        async def patch_one(i: int) -> bool:
            stamp = repr(time.perf_counter())
            body = json.dumps({"metadata": {"annotations": {"bench/i": str(i), "bench/t": stamp}}})
            headers = {"Content-Type": "application/merge-patch+json"}
            async with http.patch(
                f"/api/v1/namespaces/default/pods/seed-{i % pods}", data=body, headers=headers
            ) as r:
                await r.read()
                return r.status == 200

        async def create_one(i: int) -> bool:
            async with http.post("/api/v1/namespaces/default/pods", json=pod(f"created-{i}")) as r:
                await r.read()
                return r.status == 201

        print(f"GET pod, {concurrency} connections, {seconds:.0f} s ...", file=sys.stderr)
        results += await measured(pid, one(run_load("GET pod", seconds, concurrency, get_one)))
        print(f"PATCH pod (merge patch), {concurrency} connections, {seconds:.0f} s ...", file=sys.stderr)
        results += await measured(pid, one(run_load("PATCH pod (merge)", seconds, concurrency, patch_one)))
        print(f"POST pod (create), {concurrency} connections, {seconds:.0f} s ...", file=sys.stderr)
        results += await measured(pid, one(run_load("POST pod (create)", seconds, concurrency, create_one)))
        print(f"PATCH with {watchers} pod watchers open, {seconds:.0f} s ...", file=sys.stderr)
        results += await measured(pid, watch_load(http, seconds, concurrency, watchers, patch_one))
    return results


async def watch_load(
    http: aiohttp.ClientSession,
    seconds: float,
    concurrency: int,
    watchers: int,
    patch_one: Callable[[int], Awaitable[bool]],
) -> list[Result]:
    """Writes while `watchers` clients watch every pod: write rate and events delivered per second."""
    async with http.get("/api/v1/namespaces/default/pods", params={"limit": "1"}) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    received = [0] * watchers
    lags: list[float] = []  # write -> event seen by watcher 0, from the timestamp the patch carries
    target: list[int] = []
    all_seen = asyncio.Event()

    async def watch(k: int, ready: asyncio.Event) -> None:
        params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": str(int(seconds) + 60)}
        async with http.get("/api/v1/namespaces/default/pods", params=params, timeout=None) as r:
            ready.set()
            async for line in r.content:
                received[k] += 1
                if k == 0:
                    sent = orjson.loads(line)["object"]["metadata"]["annotations"].get("bench/t")
                    if sent is not None:
                        lags.append(time.perf_counter() - float(sent))
                if target and min(received) >= target[0]:
                    all_seen.set()

    readies = [asyncio.Event() for _ in range(watchers)]
    tasks = [asyncio.create_task(watch(k, readies[k])) for k in range(watchers)]
    await asyncio.gather(*(e.wait() for e in readies))
    writes = await run_load(f"PATCH pod with {watchers} watchers", seconds, concurrency, patch_one)
    target.append(writes.requests - writes.errors)
    started = time.monotonic()
    if min(received) >= target[0]:
        all_seen.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_seen.wait(), 30)
    drain = time.monotonic() - started
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    total = sum(received)
    lags.sort()
    p50, p99 = p50_p99_ms(lags, digits=2)
    events = Result(
        name=f"watch events delivered ({watchers} watchers)",
        requests=total,
        seconds=round(writes.seconds + drain, 2),
        per_second=round(total / (writes.seconds + drain), 1),
        p50_ms=p50,
        p99_ms=p99,
        errors=sum(max(0, target[0] - n) for n in received),
    )
    return [writes, events]


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    parser.add_argument("--concurrency", type=int, default=16, help="keep-alive connections")
    parser.add_argument("--watchers", type=int, default=4, help="watch streams open in the watch phase")
    parser.add_argument("--pods", type=int, default=200, help="pods seeded for GET/PATCH")
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hami-bench-") as tmp:
        proc, base = start_apiserver(Path(tmp) / "kubeconfig", Path(tmp) / "apiserver.log")
        try:
            results = asyncio.run(
                bench(base, proc.pid, args.seconds, args.concurrency, args.watchers, args.pods)
            )
        finally:
            stop_process(proc, timeout_s=10)
    print(f"\nhami-sim apiserver on {os.cpu_count()} cores, server and load generator on the same machine\n")
    header = ("phase", "requests", "per s", "p50 ms", "p99 ms", "errors", "server CPU µs")
    rows = [
        (r.name, f"{r.requests}", f"{r.per_second:.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", f"{r.errors}",
         f"{r.server_cpu_us:.0f}")
        for r in results
    ]  # fmt: skip
    print("\n".join(padded_table(header, (36, 7, 7, 6, 6, 5, 12), rows)))
    write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
