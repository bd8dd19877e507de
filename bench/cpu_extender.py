"""The cost of the fragmentation component's second extender entry (`/cpu-filter`, `/cpu-prioritize`:
hami-control decides where pods that ask no GPU go), through the real HTTPS endpoints, beside the no-op
floor in the same run.

Per size N (`--sizes 1000,5000`), from scratch:

1. A `hami-sim apiserver` is seeded with N nodes as bench/extender.py's (8 A100 80GB split 10, 128 CPUs),
   each with 10 running pods: 7 GPU pods (bench/extender.py's first 7: 1 or 2 GPUs, 4 CPUs each) and 3
   CPU-only pods (8 CPUs, 16 GiB): 50,000 pods at N = 5,000, every one in the measure (the pod store
   counts the CPU each requests on its node; the learned mix counts every pod).
2. hami-control starts with the component's flags (read from
   daemonset/components/fragmentation/kustomization.yaml, as the e2e test reads them), `--control-args`
   added; the script waits until its cache holds every node and pod. Its CPU during the sync and its RSS
   after it are recorded, then its CPU over `--idle-seconds` idle (the learned mix is recomputed every
   10 s off the request path).
3. Latency, closed loop, one request at a time, with every node a candidate (names-only form, a ~3 KB
   pod, a fresh UID per round), each round sending one request to each endpoint so they see the same
   load: `/noop-filter` (**the floor**: read, parse, a constant answer), `/echo-filter` (the floor of a
   filter that names every node back), `/cpu-filter` and `/cpu-prioritize` for a CPU-only pod (4 CPUs,
   8 GiB), `/cpu-filter` for a GPU pod (the pass-through answer) and `/filter` for the same GPU pod
   (HAMi's entry, for scale). Goal (issue 28): the CPU verbs' p99 <= 2x the floor's p99.
4. Decisions, one pod at a time, as kube-scheduler makes them with both entries: D pending pods
   (`--decisions`), GPU and CPU-only alternating (`--cpu-only-share`), over the nodes kube-scheduler
   would consider (`percentageOfNodesToScore` of the component's configuration, else kube's adaptive
   `numFeasibleNodesToFind`, the window moving on): HAMi's `/filter` for a GPU pod (it is not interested
   in a CPU-only one), then `/cpu-filter` (interested in every pod: the entry lists no
   managedResources) with the nodes left; when more than one node is left, `/prioritize` (GPU pods) and
   `/cpu-prioritize` at once, as kube-scheduler runs extenders' prioritize concurrently; the best total
   wins (ties: the first); then `/bind` (GPU pods, hami-control's binder) or a Binding POSTed to the API
   server (CPU-only pods: kube-scheduler binds them itself). After each GPU bind the pod's
   `hami.io/bind-phase` is patched to `success`, as the node daemon does, so the node's pending window
   closes. Decisions per second = pods / wall time; per decision, hami-control's and the API server's
   CPU. Every pod is read back bound.
5. hami-control's RSS (VmRSS) after the sync, after the latency rounds and after the decisions, and the
   peak (VmHWM).

With `--baseline` (default on) the same cluster is also served, before the component's hami-control, by
a hami-control with the shipped defaults (binpack), for its sync CPU, idle CPU and RSS beside them.

Usage:

    python bench/cpu_extender.py [--sizes 1000,5000] [--rounds 200] [--decisions 400]
                                 [--control-args FLAGS] [--json FILE] [--profile FILE]

`--profile FILE` runs `--profile-rounds` more /cpu-filter requests (`--profile-endpoint /filter`: HAMi's
/filter for the GPU pod) at the largest size with cProfile on inside hami-control and writes the pstats
there (the top functions on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import extender as ext
import orjson
import yaml
from benchlib import (
    add_json_option,
    arg_parser,
    cpu_seconds,
    log,
    markdown_table,
    p50_p99_ms,
    serving_cert,
    start_apiserver,
    start_control_child,
    stop_process,
    write_json,
)

from hami_api.annotations import BIND_PHASE, VGPU_NODE
from hami_sim.scheduler.config import load_configuration
from hami_sim.scheduler.fit import num_feasible_nodes_to_find

COMPONENT = Path(__file__).resolve().parents[1] / "daemonset" / "components" / "fragmentation"
GPU_PODS_PER_NODE = 7
CPU_PODS_PER_NODE = 3
FLOOR_FACTOR_GOAL = 2.0
GPU_ASK = ext.TYPICAL
CPU_ASK = {"cpu": "4", "memory": "8Gi"}


def component_flags() -> list[str]:
    """The hami-control flags the component's kustomization adds (its JSON-patch `add` ops on args)."""
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    flags = [
        str(op["value"])
        for patch in kustomization["patches"]
        if "patch" in patch  # inline JSON patches (a patch from a file, `path:`, patches no args here)
        for op in yaml.safe_load(patch["patch"])
        if op["op"] == "add" and str(op["path"]).endswith("/args/-")
    ]
    if not flags:
        raise SystemExit(f"{COMPONENT / 'kustomization.yaml'}: the component adds no hami-control flag")
    return flags


def component_percentage() -> int | None:
    """The component's percentageOfNodesToScore (the hami-scheduler profile's, else the global one)."""
    config = load_configuration(COMPONENT / "kube-scheduler-config.yaml")
    profile = next(p for p in config.profiles if p.scheduler_name == ext.SCHEDULER)
    if profile.percentage_of_nodes_to_score is not None:
        return profile.percentage_of_nodes_to_score
    return config.percentage_of_nodes_to_score


def cpu_container(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.k8s.io/e2e-test-images/agnhost:2.52",
        "args": ["netexec", "--http-port=8080"],
        "resources": {"requests": dict(requests), "limits": dict(requests)},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def seeded_cpu_pods(i: int) -> list[dict[str, Any]]:
    node = ext.node_name(i)
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{node}-web-{j}", "namespace": ext.NAMESPACE, "labels": {"app": "web"}},
            "spec": {
                "nodeName": node,
                "schedulerName": ext.SCHEDULER,
                "containers": [cpu_container("web", {"cpu": "8", "memory": "16Gi"})],
                "restartPolicy": "Always",
            },
        }
        for j in range(CPU_PODS_PER_NODE)
    ]


def cpu_scheduler_pod(i: int) -> dict[str, Any]:
    """A pending CPU-only pod as kube-scheduler sends it to an extender (~3 KB, bench/extender.py's GPU
    pod with the GPU container swapped for a CPU one)."""
    pod = ext.scheduler_pod(i, GPU_ASK)
    pod["metadata"]["name"] = f"web-5c7d9f-{i:05d}"
    pod["metadata"]["uid"] = str(uuid.UUID(int=(7 << 60) | i))
    container = pod["spec"]["containers"][0]
    pod["spec"]["containers"][0] = {
        **cpu_container("web", CPU_ASK),
        "volumeMounts": container["volumeMounts"],
    }
    pod["status"]["qosClass"] = "Guaranteed"
    return pod


async def seed(base: str, nodes: int) -> tuple[int, float]:
    rng = random.Random(nodes)
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=ext.SEED_CONCURRENCY)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        namespaces = [
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            for ns in (ext.NAMESPACE, ext.BIND_NAMESPACE)
        ]
        await ext.create_all(http, namespaces, "namespaces")
        await ext.create_all(http, [("/api/v1/nodes", ext.node_object(i)) for i in range(nodes)], "nodes")
        path = f"/api/v1/namespaces/{ext.NAMESPACE}/pods"
        pods = [
            (path, pod)
            for i in range(nodes)
            for pod in [
                *itertools.islice(ext.seeded_pods(i, rng), GPU_PODS_PER_NODE),
                *seeded_cpu_pods(i),
            ]
        ]
        await ext.create_all(http, pods, "pods")
    return 2 + nodes + len(pods), time.monotonic() - started


# --- results ----------------------------------------------------------------------------------------------


@dataclass
class Serving:
    """One hami-control on the seeded cluster: sync, idle CPU and memory."""

    flags: str
    sync_seconds: float
    sync_cpu_seconds: float
    idle_cpu_percent: float
    rss_mb: float
    cache_nodes: int
    cache_pods: int


@dataclass
class Decisions:
    nodes: int
    decisions: int
    gpu_pods: int
    cpu_only_pods: int
    candidates: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    cpu_filter_p50_ms: float
    cpu_filter_kept_mean: float
    control_cpu_us: float
    apiserver_cpu_us: float
    errors: int
    bound_ok: int
    first_error: str


@dataclass
class SizeResult:
    nodes: int
    pods_seeded: int
    seed_seconds: float
    servings: list[Serving] = field(default_factory=list)
    latency: list[ext.Latency] = field(default_factory=list)
    decisions: Decisions | None = None
    rss_mb: dict[str, float] = field(default_factory=dict)


# --- measuring --------------------------------------------------------------------------------------------


ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("floor: constant answer", "/noop-filter", "cpu"),
    ("floor: names echoed", "/echo-filter", "cpu"),
    ("cpu-filter, CPU-only pod", "/cpu-filter", "cpu"),
    ("cpu-prioritize, CPU-only pod", "/cpu-prioritize", "cpu"),
    ("cpu-filter, GPU pod (pass-through)", "/cpu-filter", "gpu"),
    ("filter, GPU pod (HAMi's entry)", "/filter", "gpu"),
)


def describe(path: str, body: bytes) -> tuple[str, bool]:
    return ext.describe_answer("/prioritize" if path.endswith("prioritize") else "/filter", body)


async def latency_rounds(
    http: aiohttp.ClientSession, pid: int, nodes: int, rounds: int, warmup: int
) -> list[ext.Latency]:
    names_json = orjson.dumps([ext.node_name(i) for i in range(nodes)])

    def bodies(r: int) -> Mapping[Hashable, bytes]:
        return {
            "cpu": ext.extender_args(cpu_scheduler_pod(r), names_json),
            "gpu": ext.extender_args(ext.scheduler_pod(r, GPU_ASK), names_json),
        }

    return await ext.timed_rounds(
        http, pid, nodes, endpoints=ENDPOINTS, bodies=bodies, describe=describe, rounds=rounds, warmup=warmup
    )


async def create_pending(base: str, count: int, cpu_only_every: int) -> list[dict[str, Any]]:
    """`count` pending pods in the bind namespace; every `cpu_only_every`-th asks no GPU."""
    items: list[tuple[str, dict[str, Any]]] = []
    for i in range(count):
        if cpu_only_every and i % cpu_only_every == 0:
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"web-{i:05d}", "namespace": ext.BIND_NAMESPACE},
                "spec": {"schedulerName": ext.SCHEDULER, "containers": [cpu_container("web", CPU_ASK)]},
            }
        else:
            body = ext.pending_pod(f"gpu-{i:05d}", ext.BIND_NAMESPACE, GPU_ASK)
        items.append((f"/api/v1/namespaces/{ext.BIND_NAMESPACE}/pods", body))
    connector = aiohttp.TCPConnector(limit=ext.SEED_CONCURRENCY)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        return await ext.create_all(http, items, "pending pods")


def asks_gpu(pod: dict[str, Any]) -> bool:
    return any("nvidia.com/gpu" in (c["resources"].get("limits") or {}) for c in pod["spec"]["containers"])


async def decision_phase(  # noqa: PLR0917 - one loop, as kube-scheduler's cycle
    http: aiohttp.ClientSession,
    base: str,
    pids: tuple[int, int],
    nodes: int,
    pods: list[dict[str, Any]],
    percentage: int | None,
) -> Decisions:
    control_pid, api_pid = pids
    names = [ext.node_name(i) for i in range(nodes)]
    window = num_feasible_nodes_to_find(percentage, len(names))
    start = 0
    latencies: list[float] = []
    cpu_filter_times: list[float] = []
    kept_counts: list[int] = []
    errors = 0
    first_error = ""
    chosen: dict[str, str] = {}

    def failed(text: str) -> None:
        nonlocal errors, first_error
        errors += 1
        first_error = first_error or text

    async def prioritize(path: str, pod: dict[str, Any], left: list[str]) -> dict[str, int]:
        status, answer = await ext.post(http, path, ext.extender_args(pod, orjson.dumps(left)))
        if status != 200:
            return {}  # kube-scheduler ignores a prioritize error
        return {e["Host"]: e["Score"] for e in orjson.loads(answer)}

    control_before, api_before = ext.server_cpu(control_pid), ext.server_cpu(api_pid)
    started = time.monotonic()
    async with aiohttp.ClientSession(base) as api:
        for pod in pods:
            meta = pod["metadata"]
            gpu = asks_gpu(pod)
            candidates = [names[(start + i) % len(names)] for i in range(window)]
            start = (start + window) % len(names)
            began = time.perf_counter()
            left = candidates
            if gpu:
                status, answer = await ext.post(http, "/filter", ext.extender_args(pod, orjson.dumps(left)))
                left = (orjson.loads(answer).get("NodeNames") or []) if status == 200 else []
            if left:
                cpu_began = time.perf_counter()
                status, answer = await ext.post(
                    http, "/cpu-filter", ext.extender_args(pod, orjson.dumps(left))
                )
                cpu_filter_times.append(time.perf_counter() - cpu_began)
                if status == 200 and not orjson.loads(answer).get("Error"):
                    left = orjson.loads(answer).get("NodeNames") or []
                # else: the entry is ignorable, kube-scheduler skips it
                kept_counts.append(len(left))
            if not left:
                failed(f"{meta['name']}: no node left")
                continue
            target = left[0]
            if len(left) > 1:
                verbs = ["/prioritize", "/cpu-prioritize"] if gpu else ["/cpu-prioritize"]
                answers = await asyncio.gather(*(prioritize(v, pod, left) for v in verbs))
                totals = {n: sum(a.get(n, 0) for a in answers) for n in left}
                target = max(left, key=lambda n: totals[n])
            if gpu:
                args = {
                    "PodName": meta["name"],
                    "PodNamespace": meta["namespace"],
                    "PodUID": meta["uid"],
                    "Node": target,
                }
                status, answer = await ext.post(http, "/bind", orjson.dumps(args))
                error = orjson.loads(answer).get("Error") if status == 200 else f"HTTP {status}"
            else:
                binding = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                    "target": {"kind": "Node", "name": target},
                }
                path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
                async with api.post(path, data=orjson.dumps(binding)) as r:
                    error = (
                        None if r.status == 201 else f"binding: HTTP {r.status} {(await r.read())[:120]!r}"
                    )
            latencies.append(time.perf_counter() - began)
            if error:
                failed(str(error))
                continue
            chosen[meta["name"]] = target
            if gpu:  # the node daemon's part: allocated, so the node's pending window closes
                patch = {"metadata": {"annotations": {BIND_PHASE: "success"}}}
                async with api.patch(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    data=orjson.dumps(patch),
                    headers={"Content-Type": "application/merge-patch+json"},
                ) as r:
                    if r.status != 200:
                        failed(f"patching {meta['name']}: HTTP {r.status}")
        seconds = time.monotonic() - started
        control_cpu = ext.server_cpu(control_pid) - control_before
        api_cpu = ext.server_cpu(api_pid) - api_before
        async with api.get(f"/api/v1/namespaces/{ext.BIND_NAMESPACE}/pods") as r:
            listed = {p["metadata"]["name"]: p for p in orjson.loads(await r.read())["items"]}
    bound_ok = 0
    for pod_name, target in chosen.items():
        now = listed.get(pod_name, {})
        on = (now.get("spec") or {}).get("nodeName") == target
        annotations = (now.get("metadata") or {}).get("annotations") or {}
        bound_ok += on and (not pod_name.startswith("gpu-") or annotations.get(VGPU_NODE) == target)
    latencies.sort()
    cpu_filter_times.sort()
    n = max(1, len(pods))
    p50, p99 = p50_p99_ms(latencies, 2)
    gpu_pods = sum(asks_gpu(p) for p in pods)
    return Decisions(
        nodes=nodes,
        decisions=len(pods),
        gpu_pods=gpu_pods,
        cpu_only_pods=len(pods) - gpu_pods,
        candidates=window,
        seconds=round(seconds, 2),
        per_second=round(len(pods) / seconds, 1),
        p50_ms=p50,
        p99_ms=p99,
        cpu_filter_p50_ms=p50_p99_ms(cpu_filter_times, 2)[0],
        cpu_filter_kept_mean=round(sum(kept_counts) / max(1, len(kept_counts)), 1),
        control_cpu_us=round(control_cpu * 1e6 / n, 1),
        apiserver_cpu_us=round(api_cpu * 1e6 / n, 1),
        errors=errors,
        bound_ok=bound_ok,
        first_error=first_error,
    )


def serve(  # noqa: PLR0917
    workdir: Path, kubeconfig: Path, tls: tuple[Path, Path], flags: Sequence[str], idle_s: float, label: str
) -> tuple[subprocess.Popen[str], int, Serving]:
    proc, words = start_control_child(__file__, workdir, kubeconfig, *tls, "READY", *flags)
    port, nodes, pods, synced = int(words[0]), int(words[1]), int(words[2]), float(words[3])
    sync_cpu = cpu_seconds(proc.pid)
    log(f"{label}: synced in {synced:.1f} s ({sync_cpu:.1f} CPU s): {nodes:,} nodes, {pods:,} pods")
    before, wall = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(idle_s)  # a bench measuring idle CPU over a set time, not a test waiting on a condition
    idle = (cpu_seconds(proc.pid) - before) * 100 / (time.monotonic() - wall)
    serving = Serving(
        flags=" ".join(flags) or "(defaults)",
        sync_seconds=synced,
        sync_cpu_seconds=round(sync_cpu, 1),
        idle_cpu_percent=round(idle, 1),
        rss_mb=ext.proc_status_mb(proc.pid, "VmRSS"),
        cache_nodes=nodes,
        cache_pods=pods,
    )
    return proc, port, serving


def run_size(args: argparse.Namespace, nodes: int) -> SizeResult:
    flags = [*component_flags(), *args.control_args.split()]
    with tempfile.TemporaryDirectory(prefix="hami-bench-cpu-extender-") as tmp:
        workdir = Path(tmp)
        ca_cert, cert, key = serving_cert(workdir)
        kubeconfig = workdir / "kubeconfig"
        api, base = start_apiserver(kubeconfig, workdir / "apiserver.log", "--log-level", "WARNING")
        control = None
        try:
            pods_per_node = GPU_PODS_PER_NODE + CPU_PODS_PER_NODE
            log(f"{nodes:,} nodes: seeding {nodes:,} nodes and {nodes * pods_per_node:,} pods")
            _, seconds = asyncio.run(seed(base, nodes))
            result = SizeResult(
                nodes=nodes, pods_seeded=nodes * pods_per_node, seed_seconds=round(seconds, 1)
            )
            if args.baseline:
                control, _, serving = serve(
                    workdir, kubeconfig, (cert, key), [], args.idle_seconds, "baseline"
                )
                result.servings.append(serving)
                stop_process(control)
            control, port, serving = serve(
                workdir, kubeconfig, (cert, key), flags, args.idle_seconds, "component"
            )
            result.servings.append(serving)
            if serving.cache_nodes != nodes or serving.cache_pods != nodes * GPU_PODS_PER_NODE:
                raise SystemExit(f"hami-control's cache: {serving}; see {workdir / 'control.log'}")
            result.rss_mb["after the cache sync"] = serving.rss_mb
            asyncio.run(measure(args, nodes, port, (control.pid, api.pid), ca_cert, base, result))
            result.rss_mb["peak (VmHWM)"] = ext.proc_status_mb(control.pid, "VmHWM")
            if control.poll() is not None:
                raise SystemExit(f"hami-control exited with {control.returncode} during the run")
            return result
        finally:
            stop_process(control)
            stop_process(api)


async def measure(  # noqa: PLR0917
    args: argparse.Namespace,
    nodes: int,
    port: int,
    pids: tuple[int, int],
    ca: bytes,
    base: str,
    result: SizeResult,
) -> None:
    async with ext.extender_session(port, ca, 1) as http:
        log(f"latency: {args.rounds} rounds (+{args.warmup} warm-up) x {len(ENDPOINTS)} endpoints, serial")
        result.latency = await latency_rounds(http, pids[0], nodes, args.rounds, args.warmup)
        result.rss_mb["after the latency rounds"] = ext.proc_status_mb(pids[0], "VmRSS")
        if args.profile is not None and nodes == max(args.size_list):
            await profile_rounds(http, nodes, args.profile_rounds, args.profile, args.profile_endpoint)
        if args.decisions > 0:
            every = round(1 / args.cpu_only_share) if args.cpu_only_share > 0 else 0
            log(f"decisions: creating {args.decisions} pending pods (every {every}th CPU-only)")
            pods = await create_pending(base, args.decisions, every)
            percentage = component_percentage()
            log(f"decisions: {args.decisions} pods, both entries, percentageOfNodesToScore {percentage}")
            result.decisions = await decision_phase(http, base, pids, nodes, pods, percentage)
            result.rss_mb["after the decisions"] = ext.proc_status_mb(pids[0], "VmRSS")


async def profile_rounds(
    http: aiohttp.ClientSession, nodes: int, rounds: int, output: Path, endpoint: str = "/cpu-filter"
) -> None:
    """`endpoint` rounds with cProfile on inside hami-control, prints the top: /cpu-filter for a CPU-only
    pod, or /filter (HAMi's entry under the component's flags) for the GPU pod."""
    import pstats

    names_json = orjson.dumps([ext.node_name(i) for i in range(nodes)])
    if endpoint == "/filter":
        pods = [ext.scheduler_pod(800_000 + r, GPU_ASK) for r in range(rounds)]
    else:
        pods = [cpu_scheduler_pod(800_000 + r) for r in range(rounds)]
    bodies = [ext.extender_args(p, names_json) for p in pods]
    await ext.post(http, "/profile-start", b"")
    for body in bodies:
        await ext.post(http, endpoint, body)
    await ext.post(http, "/profile-stop", str(output).encode())
    log(f"cProfile of {rounds} {endpoint} requests at {nodes:,} nodes: {output}")
    stats = pstats.Stats(str(output), stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)


# --- the report -------------------------------------------------------------------------------------------


def report(results: list[SizeResult]) -> str:
    lines: list[str] = []
    rows: list[tuple[str, ...]] = []
    for s in results:
        floor = next(x for x in s.latency if x.path == "/noop-filter")
        for x in s.latency:
            factor = x.p99_ms / floor.p99_ms if floor.p99_ms else float("nan")
            rows.append(
                (
                    f"{s.nodes:,}",
                    x.name,
                    f"{x.p50_ms:.2f}",
                    f"{x.p99_ms:.2f}",
                    f"{factor:.2f}x",
                    f"{x.server_cpu_us:,.0f}",
                    f"{x.request_kb:.0f} / {x.answer_kb:.0f}",
                    x.answer + (f" ({x.errors} errors)" if x.errors else ""),
                )
            )
    header: tuple[str, ...] = (
        "nodes",
        "endpoint",
        "p50 ms",
        "p99 ms",
        "p99 / floor",
        "server CPU us",
        "KB in / out",
        "answer",
    )
    lines += markdown_table(header, "llrrrrrl", rows)
    lines.append("")
    header = ("nodes", "hami-control", "sync s", "CPU s to ready", "idle CPU %", "RSS MB", "GPU pods cached")
    serving_rows: list[tuple[str, ...]] = [
        (f"{s.nodes:,}", v.flags, f"{v.sync_seconds:.1f}", f"{v.sync_cpu_seconds:.1f}",
         f"{v.idle_cpu_percent:.1f}", f"{v.rss_mb:.0f}", f"{v.cache_pods:,}")
        for s in results for v in s.servings
    ]  # fmt: skip
    lines += markdown_table(header, "llrrrrr", serving_rows)
    lines.append("")
    header = ("nodes", "pods (GPU / CPU-only)", "candidates", "decisions/s", "p50 / p99 ms",
              "cpu-filter p50 ms", "nodes kept", "hami-control CPU us", "API CPU us", "bound ok")  # fmt: skip
    rows = []
    for s in results:
        d = s.decisions
        if d is None:
            continue
        rows.append(
            (f"{s.nodes:,}", f"{d.gpu_pods} / {d.cpu_only_pods}", f"{d.candidates:,}", f"{d.per_second:.1f}",
             f"{d.p50_ms:.1f} / {d.p99_ms:.1f}", f"{d.cpu_filter_p50_ms:.2f}",
             f"{d.cpu_filter_kept_mean:,.1f}",
             f"{d.control_cpu_us:,.0f}", f"{d.apiserver_cpu_us:,.0f}",
             f"{d.bound_ok}/{d.decisions}" + (f" ({d.errors} errors: {d.first_error})" if d.errors else ""))
        )  # fmt: skip
    lines += markdown_table(header, "lrrrrrrrrl", rows)
    lines.append("")
    for s in results:
        memory = ", ".join(f"{k} {v:.0f}" for k, v in s.rss_mb.items())
        lines.append(f"- {s.nodes:,} nodes, {s.pods_seeded:,} pods: hami-control RSS MB: {memory}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return ext.serve_child(sys.argv[2:])
    parser = arg_parser(__doc__)
    parser.add_argument("--sizes", default="1000,5000", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=200, help="timed requests per endpoint and size")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--decisions", type=int, default=400, help="pods decided at each size")
    parser.add_argument("--cpu-only-share", type=float, default=0.5, help="share of CPU-only pods decided")
    parser.add_argument("--idle-seconds", type=float, default=12.0, help="idle CPU measured over this long")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also serve the cluster with hami-control's defaults first")  # fmt: skip
    parser.add_argument("--control-args", default="", help="more hami-control flags, space-separated")
    add_json_option(parser)
    parser.add_argument("--profile", type=Path, help="cProfile stats of /cpu-filter (largest size)")
    parser.add_argument("--profile-rounds", type=int, default=50, help="requests profiled with --profile")
    parser.add_argument(
        "--profile-endpoint",
        choices=("/cpu-filter", "/filter"),
        default="/cpu-filter",
        help="what --profile profiles: /cpu-filter (CPU-only pod) or /filter (GPU pod)",
    )
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sizes: expected comma-separated node counts, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.rounds < 1:
        parser.error("--sizes and --rounds must be positive")
    args.size_list = sizes
    if args.profile is not None:
        args.profile = args.profile.resolve()  # hami-control writes it, from another directory
    started = time.monotonic()
    log(f"load average at start: {os.getloadavg()}")
    results = [run_size(args, n) for n in sizes]
    print(report(results))
    log(f"done in {time.monotonic() - started:.0f} s; load average {os.getloadavg()}")
    write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
