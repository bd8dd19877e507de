"""Latency and throughput of hami-control's admission webhook over TLS on loopback.

`hami-control` runs as its own process (started by this script in `--serve` mode: the real control
plane, plus a hidden `POST /noop` route that reads the body and answers a constant allow, the floor
of HTTP + TLS + aiohttp on the same server in the same run). It watches a `hami-sim apiserver` (also
its own process); the reviews name a namespace with a GPU ResourceQuota, so every review does the full
work: parse, rules, smallest JSONPatch, quota check and the assumed usage of the admitted pod.

Phases, each run against /noop (the floor) and /webhook:
- fixed rate: 200 req/s, open loop (a request is sent at its scheduled time whether or not earlier ones
  came back; latency counts from the scheduled time, so queueing is not hidden), spread over keep-alive
  connections;
- maximum: closed loop on 16 keep-alive connections as fast as the server answers.

Usage:

    python bench/webhook.py [--seconds 10] [--rate 200] [--concurrency 16] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

import aiohttp
import benchlib
from benchlib import (
    Throughput as Result,
)
from benchlib import (
    add_json_option,
    arg_parser,
    markdown_table,
    server_cpu_charged,
    serving_cert,
    start_apiserver,
    start_control_child,
    stop_process,
    throughput,
    write_json,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAMESPACE = "bench"
TABLE = ("phase", "requests/s", "p50 ms", "p99 ms", "server CPU per request", "errors")
NOOP_ANSWER = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}'
)


def review(i: int) -> bytes:
    """An AdmissionReview as kube-apiserver sends it for a defaulted GPU pod (~2 KB)."""
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "train-7d9f8c-",
            "namespace": NAMESPACE,
            "labels": {"app": "train", "pod-template-hash": "7d9f8c"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-7d9f8c",
                    "uid": str(uuid.UUID(int=i)),
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {
                        "limits": {
                            "cpu": "4",
                            "memory": "16Gi",
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "4000",
                        },
                        "requests": {
                            "cpu": "4",
                            "memory": "16Gi",
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "4000",
                        },
                    },
                    "volumeMounts": [
                        {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets"}
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": NAMESPACE,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    return json.dumps(
        {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}
    ).encode()


# --- the server side (child process) ----------------------------------------------------------------------


def serve_child(argv: list[str]) -> int:
    """Run the real control plane plus `POST /noop`, print the port, run until SIGTERM."""
    import logging

    from aiohttp import web

    from hami_control.config import load_config
    from hami_control.main import ControlPlane
    from hami_control.server import read_body

    config = load_config(argv, {}, lambda p: p.read_text())
    logging.basicConfig(
        level=config.log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def noop(request: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(request, config.server.max_request_body)
        if isinstance(body, web.Response):
            return body
        return web.Response(body=NOOP_ANSWER, content_type="application/json")

    async def run() -> None:
        plane = ControlPlane(config)
        plane.routes.add("POST", "/noop", noop)
        await plane.start()
        assert plane.caches is not None
        await plane.caches.wait_synced()
        print(f"PORT {plane.port}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await plane.stop()

    asyncio.run(run())
    return 0


# --- the load side ----------------------------------------------------------------------------------------


def start_control(
    workdir: Path, kubeconfig: Path, cert: Path, key: Path
) -> tuple[subprocess.Popen[str], int]:
    # default log level: one decision line per review
    proc, words = start_control_child(__file__, workdir, kubeconfig, cert, key, "PORT")
    return proc, int(words[0])


async def seed(base: str) -> None:
    async with aiohttp.ClientSession(base) as http:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        async with http.post("/api/v1/namespaces", json=namespace) as r:
            assert r.status == 201, await r.text()
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": NAMESPACE},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "1000000000000"}},
        }
        async with http.post(f"/api/v1/namespaces/{NAMESPACE}/resourcequotas", json=quota) as r:
            assert r.status == 201, await r.text()


async def post(http: aiohttp.ClientSession, path: str, body: bytes) -> bool:
    async with http.post(path, data=body, headers={"Content-Type": "application/json"}) as r:
        answer = await r.read()
        return r.status == 200 and b'"allowed":true' in answer


async def fixed_rate(http: aiohttp.ClientSession, path: str, rate: float, seconds: float) -> Result:
    total = int(rate * seconds)
    bodies = [review(i) for i in range(total)]
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter() + 0.05

    async def one(i: int) -> None:
        nonlocal errors
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        ok = await post(http, path, bodies[i])
        latencies.append(time.perf_counter() - due)
        errors += not ok

    await asyncio.gather(*(one(i) for i in range(total)))
    return throughput(f"{path} at {rate:.0f} req/s", latencies, time.perf_counter() - start, errors)


async def closed_loop(http: aiohttp.ClientSession, path: str, concurrency: int, seconds: float) -> Result:
    bodies = [review(i) for i in range(2000)]

    async def one(n: int) -> bool:
        return await post(http, path, bodies[n % len(bodies)])

    latencies, errors, elapsed = await benchlib.closed_loop(concurrency, seconds, one)
    return throughput(f"{path} max ({concurrency} connections)", latencies, elapsed, errors)


async def measured(pid: int, phase: Awaitable[Result]) -> Result:
    async def listed() -> list[Result]:
        return [await phase]

    return (await server_cpu_charged(pid, listed()))[0]


async def bench(  # noqa: PLR0917
    port: int, pid: int, ca: bytes, seconds: float, rate: float, concurrency: int
) -> list[Result]:
    context = ssl.create_default_context(cadata=ca.decode())
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    results: list[Result] = []
    async with aiohttp.ClientSession(f"https://127.0.0.1:{port}", connector=connector) as http:
        for path in ("/noop", "/webhook"):  # warm up connections and code paths
            await closed_loop(http, path, concurrency, 1.0)
        phases: list[tuple[str, Callable[[str], Awaitable[Result]]]] = [
            (f"fixed {rate:.0f} req/s", lambda p: fixed_rate(http, p, rate, seconds)),
            (f"max, {concurrency} connections", lambda p: closed_loop(http, p, concurrency, seconds)),
        ]
        for label, phase in phases:
            for path in ("/noop", "/webhook"):
                print(f"{path}: {label}, {seconds:.0f} s ...", file=sys.stderr)
                results.append(await measured(pid, phase(path)))
    return results


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2:])
    parser = arg_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each phase")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="requests per second of the fixed-rate phase"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="keep-alive connections")
    add_json_option(parser)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hami-bench-webhook-") as tmp:
        workdir = Path(tmp)
        ca_cert, cert, key = serving_cert(workdir)
        kubeconfig = workdir / "kubeconfig"
        api, base = start_apiserver(kubeconfig, workdir / "apiserver.log")
        control = None
        try:
            asyncio.run(seed(base))
            control, port = start_control(workdir, kubeconfig, cert, key)
            results = asyncio.run(
                bench(port, control.pid, ca_cert, args.seconds, args.rate, args.concurrency)
            )
        finally:
            for proc in (control, api):
                stop_process(proc, timeout_s=10)
    rows = [
        (
            r.name,
            f"{r.per_second:,.0f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.server_cpu_us:.0f} µs",
            r.errors,
        )
        for r in results
    ]
    print("\n".join(markdown_table(TABLE, "lrrrrr", rows)))
    webhook_fixed = next(r for r in results if r.name.startswith("/webhook at"))
    met = "met" if webhook_fixed.p99_ms <= 5.0 else "NOT met"
    print(f"\ngoal p99 <= 5 ms at {args.rate:.0f} req/s: {met} (p99 {webhook_fixed.p99_ms:.2f} ms)")
    write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
