"""End-to-end pods/s on a whole local cluster (`hami_sim.cluster`): from the pod's creation to Running,
with the time split per stage, the API writes per pod and the control plane's CPU per pod, through the
device plugin and the scheduler extender (`--mode device-plugin`), through DRA (`--mode dra`), or both
side by side (`--modes device-plugin,dra`).

One run per mode (and per `--client-limits` setting), each from scratch, in this order:

1. `Cluster.up(ClusterSpec.uniform(nodes, gpus, model, scale=...).with_mode(mode))` starts the API
   server, hami-control, the scheduler stand-in and the nodes (one process per kubelet and per daemon up
   to `SCALE_THRESHOLD` nodes, scale mode above it or with `--scale`); in DRA mode every hami-node runs
   `--mode dra`, the controller-manager stand-in runs too, and hami-control translates every GPU pod to a
   claim (`--dra-translation all`).
2. Idle baseline (`--idle-seconds`): CPU of every process and API writes while nothing happens, so the
   run's numbers can be read net of the cluster's own periodic work (heartbeats, health loops).
3. The bench lists and watches the pods of its namespace, and in DRA mode its ResourceClaims too (HTTP
   watches on the API server; every event is timestamped on arrival with this process's monotonic
   clock), then creates `--pods` pods through `--concurrency` concurrent HTTP POSTs: one container, 1
   `nvidia.com/gpu`, `nvidia.com/gpumem` 1000..4000 MiB (seeded), no `schedulerName` (the webhook sets
   `hami-scheduler`). The same pods in both modes: in DRA mode the webhook rewrites each into a claim
   from a ResourceClaimTemplate it keeps per size (31 sizes here).
4. It waits until every pod is Running (or failed, or `--timeout`), then reads the counters.

Per pod, the milestones (all on the bench's clock; `-` where a path has none):

| milestone | device plugin | DRA |
|---|---|---|
| post | just before the POST is sent | same |
| created | the POST's 201 came back (the API server called the admission webhook synchronously) | same |
| claimed | - | first event of the pod's claim (ADDED by the controller-manager from the template) |
| claim_named | - | first pod event whose `status.resourceClaimStatuses` names it (the controller-manager) |
| claim_allocated | - | first claim event with `status.allocation` (the scheduler's PreBind, before binding) |
| bound | first pod event with `spec.nodeName` (hami-control's `/bind`) | same (the scheduler's Binding) |
| allocated | first pod event with `hami.io/bind-phase: success` (hami-node's `Allocate`) | - |
| running | first pod event with `status.phase: Running` (the kubelet stand-in) | same |

The DRA path has no bind-phase annotation: what replaces the device plugin's Allocate stage (bound ->
allocated) is inside "bound -> Running" (kubelet's NodePrepareResources on hami-node over gRPC, CDI
resolution, the status write), and its scheduling is split by the claim milestones instead (the claim's
allocation is written before the Binding). `bench/dra_prepare.py` times Prepare itself.

Stages: create = created - post (HTTP + admission webhook + store); scheduling = bound - created (device
plugin: the scheduler's queue, its filter/prioritize calls to the extender, hami-control's bind:
annotations and Binding; DRA: the claim's creation, the scheduler's queue and allocator, the claim's
finalizer and status writes, the Binding); Allocate = allocated - bound (the kubelet sees the pod, admits
it, calls Allocate on hami-node over gRPC, hami-node patches the bind phase); to Running = running -
allocated; bound -> Running on both paths. The server-side time of the webhook and of the extender's
filter/prioritize/bind come from hami-control's `/metrics` histograms (`hami_webhook_duration_seconds`,
`hami_extender_{filter,prioritize,bind}_duration_seconds`), scraped before and after the run: means,
and p50/p99 as the upper bound of the histogram bucket (none of the extender's on the DRA path).

Client-side rate limits (`--client-limits`): `default` runs the control plane with the limits of the
components it plays (hami-control and the scheduler 50 requests/s, burst 100; the controller-manager 20,
burst 30: kube-controller-manager's); `off` lifts those three (`--kube-api-qps 0`), as kube's
scheduler_perf runs its clients (QPS 5000), whose DRA thresholds are the anchor the issue names. The DRA
path makes more requests per pod through two of those clients, so the setting matters there.

API writes per pod come from the API server's counters (`GET /hami-sim/counters`, per verb, resource and
subresource), after minus before; the idle baseline's write rate over the run's length is subtracted
from writes to anything else than pods and events ("nodes, net"). CPU per process is from /proc
(`benchlib.cpu_seconds`), raw and net of the idle baseline; resident memory per process (VmRSS) once
every pod ran. The load generator (this process) shares the machine's cores with the cluster; its CPU
and the load average are reported with the numbers. With several runs, a side-by-side table follows.

Usage:

    python bench/e2e.py [--nodes 20] [--gpus-per-node 8] [--pods 500] [--scale | --no-scale]
                        [--mode device-plugin|dra | --modes device-plugin,dra] [--client-limits default,off]
                        [--burst] [--concurrency 32] [--timeout S] [--json FILE] [--keep-logs DIR]
                        [--floor] [--py-spy DIR]

`--burst` is the 80-pod burst onto one node: `--nodes 1 --gpus-per-node 8 --pods 80` (8 GPUs split 10:
every slot taken).

`--floor` first runs the same pods asking no GPU (`plain_pod`: no limits, `schedulerName:
hami-scheduler`) on a fresh cluster of the same shape: the API server, the scheduler stand-in calling
hami-control's filter and bind (a plain Binding), the kubelet stand-in admitting and starting them, with
no GPU fitted, allocated or patched; what the cluster costs for those pods is the floor the GPU run is
read against. `--py-spy DIR` samples every process of the cluster (profile runs only: the sampling
costs CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from benchlib import cpu_seconds, log, machine_busy_seconds, percentile, py_spy, rss_mib, write_json

from hami_api.annotations import BIND_PHASE
from hami_sim.cluster import SCALE_THRESHOLD, Cluster, ClusterSpec

NAMESPACE = "bench-e2e"
MODEL = "NVIDIA A100-SXM4-80GB"
GOAL_PODS_PER_SECOND = 50.0
GOAL_BURST_SECONDS = 5.0
HISTOGRAMS = {
    "webhook": "hami_webhook_duration_seconds",
    "filter": "hami_extender_filter_duration_seconds",
    "prioritize": "hami_extender_prioritize_duration_seconds",
    "bind": "hami_extender_bind_duration_seconds",
}
PATHS = ("device-plugin", "dra")
"""`--modes`: every node's hami-node in this mode (`ClusterSpec.with_mode`); DRA: `--dra-translation all`."""
CLIENT_LIMITS = ("default", "off")
"""`--client-limits`: the control plane's client-side rate limits as the components it plays default
them (hami-control and the scheduler 50 requests/s, burst 100; the controller-manager 20, burst 30), or
`off` for all three (`--kube-api-qps 0`), as kube's scheduler_perf runs its clients (QPS 5000). The
kubelets and node daemons keep theirs in both."""
NO_LIMIT = ("--kube-api-qps", "0")
MILESTONES = ("post", "created", "claimed", "claim_named", "claim_allocated", "bound", "allocated", "running")
STAGES = (
    ("create (POST incl. webhook)", "post", "created"),
    ("claim created (controller-manager)", "created", "claimed"),
    ("claim named in the pod's status (controller-manager)", "claimed", "claim_named"),
    ("claim allocated (scheduler: queue, allocator, 2 claim writes)", "claim_named", "claim_allocated"),
    ("claim allocated -> bound (Binding)", "claim_allocated", "bound"),
    ("scheduling: created -> bound", "created", "bound"),
    ("Allocate (kubelet, hami-node)", "bound", "allocated"),
    ("to Running (kubelet status)", "allocated", "running"),
    ("bound -> Running", "bound", "running"),
    ("end to end", "post", "running"),
)
"""(name, from, to): a stage is shown where its milestones were seen (the claim stages on the DRA path,
Allocate on the device-plugin path)."""


# --- pods -------------------------------------------------------------------------------------------------


def gpu_pod(i: int, mem: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"e2e-{i:05d}", "namespace": NAMESPACE, "labels": {"app": "bench-e2e"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": limits},
                }
            ],
            "restartPolicy": "Always",
        },
    }


def plain_pod(i: int) -> dict[str, Any]:
    """The floor's pod (`--floor`): the same pod asking no GPU, sent to hami-scheduler by name (the
    webhook leaves a pod asking no GPU alone): the API server, the scheduler stand-in with hami-control's
    filter and plain Binding, and the kubelet stand-in, with no GPU fitted, allocated or patched."""
    pod = gpu_pod(i, 0)
    pod["spec"]["containers"][0].pop("resources")
    pod["spec"]["schedulerName"] = "hami-scheduler"
    return pod


@dataclass
class PodTimes:
    post: float = 0.0
    created: float = 0.0
    claimed: float = 0.0
    """DRA: the pod's claim was first seen (ADDED by the controller-manager, from the template)."""
    claim_named: float = 0.0
    """DRA: the pod's `status.resourceClaimStatuses` names its claim (the scheduler waits for it)."""
    claim_allocated: float = 0.0
    """DRA: the claim first seen with `status.allocation` (the scheduler's PreBind, before the Binding)."""
    bound: float = 0.0
    allocated: float = 0.0
    running: float = 0.0
    failed: str = ""
    node: str = ""


def observe(times: PodTimes, pod: Mapping[str, Any], now: float) -> None:
    """Stamp the milestones this version of the pod shows for the first time."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if status.get("resourceClaimStatuses") and not times.claim_named:
        times.claim_named = now
    if spec.get("nodeName") and not times.bound:
        times.bound = now
        times.node = str(spec["nodeName"])
    if annotations.get(BIND_PHASE) == "success" and not times.allocated:
        times.allocated = now
    if annotations.get(BIND_PHASE) == "failed" and not times.failed:
        times.failed = "bind-phase failed"
    phase = status.get("phase")
    if phase == "Running" and not times.running:
        times.running = now
    if phase == "Failed" and not times.failed:
        times.failed = f"Failed: {status.get('reason', '')} {status.get('message', '')}".strip()


def claim_owner(claim: Mapping[str, Any]) -> str | None:
    """The name of the pod that controls a claim (the controller-manager's owner reference)."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Pod" and ref.get("controller"):
            return str(ref.get("name"))
    return None


def observe_claim(times: PodTimes, claim: Mapping[str, Any], now: float) -> None:
    """Stamp the claim milestones this version of a pod's claim shows for the first time."""
    if not times.claimed:
        times.claimed = now
    if (claim.get("status") or {}).get("allocation") and not times.claim_allocated:
        times.claim_allocated = now


# --- hami-control's /metrics ------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^(\w+?)(_bucket|_sum|_count)(?:\{(?:.*,)?le="([^"]+)"[^}]*\})?\s+(\S+)$')


def parse_histograms(text: str) -> dict[str, dict[str, float]]:
    """{histogram name: {"sum": s, "count": n, "<le>": cumulative count}} for the names in HISTOGRAMS."""
    wanted = set(HISTOGRAMS.values())
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) not in wanted:
            continue
        name, kind, le, value = match.groups()
        entry = out.setdefault(name, {})
        key = le if kind == "_bucket" else kind[1:]
        if key is not None:
            entry[key] = entry.get(key, 0.0) + float(value)
    return out


@dataclass
class ServerTime:
    calls: int
    mean_ms: float
    p50_ms: float
    p99_ms: float


def histogram_delta(before: Mapping[str, float], after: Mapping[str, float]) -> ServerTime:
    count = after.get("count", 0.0) - before.get("count", 0.0)
    total = after.get("sum", 0.0) - before.get("sum", 0.0)
    buckets = sorted(
        (float(k), after[k] - before.get(k, 0.0)) for k in after if k not in ("sum", "count") and k != "+Inf"
    )

    def quantile(q: float) -> float:
        for bound, cumulative in buckets:
            if cumulative >= q * count:
                return round(bound * 1000, 1)
        return float("inf")

    if count <= 0:
        return ServerTime(0, 0.0, 0.0, 0.0)
    return ServerTime(int(count), round(total / count * 1000, 2), quantile(0.5), quantile(0.99))


# --- the run ----------------------------------------------------------------------------------------------


@dataclass
class StageStats:
    stage: str
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float


@dataclass
class Result:
    nodes: int
    gpus_per_node: int
    path: str
    """device-plugin (the extender) or dra."""
    mode: str
    client_limits: str
    """default or off (`CLIENT_LIMITS`)."""
    pods: int
    concurrency: int
    up_seconds: float
    running: int
    failed: int
    first_failure: str
    seconds_to_all_running: float
    pods_per_second: float
    create_seconds: float
    milestone_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds from the first POST until the last pod reached each milestone."""
    stages: list[StageStats] = field(default_factory=list)
    server: dict[str, ServerTime] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    writes_per_pod: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    idle_cpu_percent: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_pod_net: dict[str, float] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    """Resident memory of each process once every pod ran."""
    load_average: dict[str, list[float]] = field(default_factory=dict)
    load_1min_max: float = 0.0
    others_cpu_percent: float = 0.0
    """CPU used by processes outside the cluster and the bench during the run, in % of one core."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    nodes_used: int = 0
    elapsed_seconds: float = 0.0
    """From the first POST until every pod ran (or the timeout): the span of the CPU and write counts."""
    floor: bool = False
    """The floor's run (`--floor`): the same pods asking no GPU, through the same kind of cluster."""


def stage_stats(name: str, values: list[float]) -> StageStats:
    values = sorted(values)
    if not values:
        return StageStats(name, 0.0, 0.0, 0.0, 0.0, 0.0)
    ms = [v * 1000 for v in values]
    return StageStats(
        name,
        round(statistics.median(ms), 1),
        round(percentile(ms, 0.9), 1),
        round(percentile(ms, 0.99), 1),
        round(ms[-1], 1),
        round(statistics.fmean(ms), 1),
    )


def per_process(pids: Mapping[str, int], read: Callable[[int], float]) -> dict[str, float]:
    """`read(pid)` for each process still alive."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            out[name] = read(pid)
    return out


def process_cpu(pids: Mapping[str, int]) -> dict[str, float]:
    return per_process(pids, cpu_seconds) | {"bench (load generator)": cpu_seconds(os.getpid())}


def write_kind(verb: str, resource: str, sub: str) -> str:
    if resource == "events":
        return "events"
    if resource == "pods":
        if sub == "binding":
            return "pods: bindings"
        if sub == "status":
            return f"pods: status {verb}{'es' if verb == 'patch' else 's'}"
        return f"pods: {verb}{'es' if verb == 'patch' else 's'}"
    return f"{resource}{'/' + sub if sub else ''}: {verb}{'es' if verb == 'patch' else 's'}"


def writes_by_kind(counters: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in counters["counters"]:
        if item["verb"] not in ("create", "update", "patch", "delete", "deletecollection"):
            continue
        kind = write_kind(item["verb"], item["resource"], item["subresource"])
        out[kind] = out.get(kind, 0) + int(item["count"])
    return out


def diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


class Bench:
    def __init__(self, cluster: Cluster, args: argparse.Namespace, floor: bool = False) -> None:
        self.cluster = cluster
        self.args = args
        self.floor = floor
        self.times = [PodTimes() for _ in range(args.pods)]
        self.index = {f"e2e-{i:05d}": i for i in range(args.pods)}
        self.done = asyncio.Event()
        self.load_max = 0.0

    def finished(self) -> int:
        return sum(1 for t in self.times if t.running or t.failed)

    async def counters(self, api: aiohttp.ClientSession) -> dict[str, Any]:
        async with api.get("/hami-sim/counters") as r:
            return dict(orjson.loads(await r.read()))

    async def metrics(self, control: aiohttp.ClientSession) -> dict[str, dict[str, float]]:
        async with control.get("/metrics") as r:
            return parse_histograms(await r.text())

    async def follow(self, api: aiohttp.ClientSession, path: str, ready: asyncio.Event) -> None:
        """List then watch `path` (a collection of the bench's namespace); every ADDED or MODIFIED object
        goes to `on_pod` or `on_claim`, stamped with its arrival time."""
        async with api.get(path) as r:
            listed = orjson.loads(await r.read())
        version = listed["metadata"]["resourceVersion"]
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        handle = self.on_claim if path.endswith("/resourceclaims") else self.on_pod
        async with api.get(f"{path}?watch=true&resourceVersion={version}", timeout=timeout) as r:
            if r.status != 200:
                raise SystemExit(f"watch {path} failed: {r.status} {(await r.read())[:300]!r}")
            ready.set()
            async for line in r.content:
                now = time.monotonic()
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    handle(event["object"], now)

    def on_pod(self, pod: Mapping[str, Any], now: float) -> None:
        i = self.index.get(pod["metadata"]["name"])
        if i is None:
            return
        observe(self.times[i], pod, now)
        if self.finished() == len(self.times):
            self.done.set()

    def on_claim(self, claim: Mapping[str, Any], now: float) -> None:
        owner = claim_owner(claim)
        i = self.index.get(owner) if owner else None
        if i is not None:
            observe_claim(self.times[i], claim, now)

    async def create(self, api: aiohttp.ClientSession) -> None:
        rng = random.Random(self.args.pods)
        pods = [gpu_pod(i, rng.randrange(1000, 4001, 100)) for i in range(self.args.pods)]
        if self.floor:
            pods = [plain_pod(i) for i in range(self.args.pods)]
        queue = list(range(len(pods)))
        queue.reverse()

        async def worker() -> None:
            while queue:
                i = queue.pop()
                body = orjson.dumps(pods[i])
                self.times[i].post = time.monotonic()
                async with api.post(
                    f"/api/v1/namespaces/{NAMESPACE}/pods",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    answer = await r.read()
                    self.times[i].created = time.monotonic()
                    if r.status != 201:
                        self.times[i].failed = f"create: HTTP {r.status} {answer[:200]!r}"
                        continue
                observe(self.times[i], orjson.loads(answer), self.times[i].created)

        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))

    async def sample_load(self) -> None:
        while not self.done.is_set():
            self.load_max = max(self.load_max, os.getloadavg()[0])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 1.0)

    async def progress(self, started: float) -> None:
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 5.0)
            if self.done.is_set():
                return
            counts = {m: sum(1 for t in self.times if getattr(t, m)) for m in MILESTONES[1:]}
            text = ", ".join(f"{m} {n}" for m, n in counts.items() if n)
            log(f"  {time.monotonic() - started:5.1f} s: {text}")

    async def run(self, result: Result) -> None:
        args = self.args
        ca = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        api_conn = aiohttp.TCPConnector(limit=args.concurrency + 4)
        control_conn = aiohttp.TCPConnector(ssl=ca, limit=2)
        async with (
            aiohttp.ClientSession(self.cluster.apiserver_url, connector=api_conn) as api,
            aiohttp.ClientSession(self.cluster.control_url, connector=control_conn) as control,
        ):
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            async with api.post("/api/v1/namespaces", json=ns) as r:
                if r.status != 201:
                    raise SystemExit(f"creating namespace {NAMESPACE}: {r.status} {await r.text()}")
            pids = self.cluster.pids()
            # idle baseline
            log(f"idle baseline: {args.idle_seconds:.0f} s")
            idle_writes_0 = writes_by_kind(await self.counters(api))
            idle_cpu_0 = process_cpu(pids)
            idle_t0 = time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            idle_elapsed = time.monotonic() - idle_t0
            idle_cpu = {k: v - idle_cpu_0.get(k, 0.0) for k, v in process_cpu(pids).items()}
            idle_writes = diff(writes_by_kind(await self.counters(api)), idle_writes_0)
            result.idle_cpu_percent = {k: round(v * 100 / idle_elapsed, 1) for k, v in idle_cpu.items()}
            # the run
            watched = [f"/api/v1/namespaces/{NAMESPACE}/pods"]
            if result.path == "dra":
                watched.append(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
            ready = [asyncio.Event() for _ in watched]
            watchers = [
                asyncio.create_task(self.follow(api, p, e)) for p, e in zip(watched, ready, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready)), 30)
            metrics_0 = await self.metrics(control)
            writes_0 = writes_by_kind(await self.counters(api))
            result.load_average["before"] = [round(x, 2) for x in os.getloadavg()]
            cpu_0 = process_cpu(pids)
            busy_0 = machine_busy_seconds()
            started = time.monotonic()
            log(f"creating {args.pods} pods, {args.concurrency} concurrent POSTs")
            sampler = asyncio.create_task(self.sample_load())
            reporter = asyncio.create_task(self.progress(started))
            await self.create(api)
            result.create_seconds = round(max(t.created for t in self.times) - started, 2)
            log(f"created in {result.create_seconds:.2f} s; waiting for Running")
            if self.finished() == len(self.times):
                self.done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), args.timeout)
            self.done.set()
            elapsed = time.monotonic() - started
            cpu = {k: v - cpu_0.get(k, 0.0) for k, v in process_cpu(pids).items()}
            result.rss_mib = per_process(pids, rss_mib)
            others = machine_busy_seconds() - busy_0 - sum(cpu.values())
            result.others_cpu_percent = round(max(0.0, others) * 100 / elapsed, 1)
            result.load_average["after"] = [round(x, 2) for x in os.getloadavg()]
            writes = diff(writes_by_kind(await self.counters(api)), writes_0)
            metrics_1 = await self.metrics(control)
            for task in watchers:
                task.cancel()
            for task in (*watchers, sampler, reporter):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.summarise(result, started, elapsed, cpu, idle_cpu, idle_elapsed, writes, idle_writes)
        result.load_1min_max = round(self.load_max, 2)
        for key, name in HISTOGRAMS.items():
            result.server[key] = histogram_delta(metrics_0.get(name, {}), metrics_1.get(name, {}))

    def summarise(  # noqa: PLR0917
        self,
        result: Result,
        started: float,
        elapsed: float,
        cpu: Mapping[str, float],
        idle_cpu: Mapping[str, float],
        idle_elapsed: float,
        writes: Mapping[str, int],
        idle_writes: Mapping[str, int],
    ) -> None:
        n = len(self.times)
        result.elapsed_seconds = round(elapsed, 2)
        running = [t for t in self.times if t.running]
        result.running = len(running)
        failures = [t.failed for t in self.times if t.failed]
        result.failed = len(failures)
        result.first_failure = failures[0] if failures else ""
        result.nodes_used = len({t.node for t in self.times if t.node})
        if running and len(running) == n:
            last = max(t.running for t in running)
            result.seconds_to_all_running = round(last - started, 2)
            result.pods_per_second = round(n / (last - started), 1)
        else:
            result.seconds_to_all_running = float("nan")
            result.pods_per_second = round(len(running) / elapsed, 1)
        for milestone in MILESTONES[1:]:
            stamps = [getattr(t, milestone) for t in self.times if getattr(t, milestone)]
            if stamps:
                result.milestone_seconds[milestone] = round(max(stamps) - started, 2)
        for name, start, end in STAGES:
            values = [
                getattr(t, end) - getattr(t, start)
                for t in self.times
                if getattr(t, start) and getattr(t, end)
            ]
            if values:
                result.stages.append(stage_stats(name, values))
        net_writes = dict(writes)
        for kind, count in idle_writes.items():
            if kind.startswith(("pods", "events")):
                continue
            net_writes[kind] = net_writes.get(kind, 0) - round(count * elapsed / idle_elapsed)
        result.writes = {k: v for k, v in sorted(net_writes.items()) if v}
        pod_writes = {k: v for k, v in result.writes.items()}
        pod_writes["total"] = sum(result.writes.values())
        result.writes_per_pod = {k: round(v / n, 2) for k, v in pod_writes.items()}
        result.cpu_seconds = {k: round(v, 2) for k, v in cpu.items()}
        result.cpu_ms_per_pod = {k: round(v * 1000 / n, 2) for k, v in cpu.items()}
        result.cpu_ms_per_pod_net = {
            k: round((v - idle_cpu.get(k, 0.0) * elapsed / idle_elapsed) * 1000 / n, 2)
            for k, v in cpu.items()
        }


# --- output -----------------------------------------------------------------------------------------------


def render(result: Result) -> str:
    lines = [
        f"### {_label(result)}: {result.nodes} node(s) x {result.gpus_per_node} GPUs, {result.mode}: "
        f"{result.pods} pods, "
        f"{result.concurrency} concurrent POSTs",
        "",
        f"- cluster up in {result.up_seconds:.1f} s; {result.running}/{result.pods} Running "
        f"({result.failed} failed{': ' + result.first_failure if result.first_failure else ''}), "
        f"on {result.nodes_used} node(s)",
        f"- all Running {result.seconds_to_all_running:.2f} s after the first POST: "
        f"**{result.pods_per_second:.1f} pods/s** (POSTs done after {result.create_seconds:.2f} s)",
        "- last pod reaching each milestone, from the first POST: "
        + ", ".join(f"{m} {s:.2f} s" for m, s in result.milestone_seconds.items()),
        f"- load average (1, 5, 15 min) before {result.load_average.get('before')}, after "
        f"{result.load_average.get('after')}; 1-min max during the run {result.load_1min_max}; "
        f"{result.cores} cores; CPU of other processes on the machine during the run: "
        f"{result.others_cpu_percent:.0f} % of a core",
        "",
        "| stage (per pod) | p50 ms | p90 ms | p99 ms | max ms | mean ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {s.stage} | "
        + " | ".join(f"{v:,.1f}" for v in (s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms))
        + " |"
        for s in result.stages
    ]
    lines += [
        "",
        "| hami-control, server side | calls | mean ms | p50 ms (bucket) | p99 ms (bucket) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {k} | {v.calls:,} | {v.mean_ms:.2f} | <= {v.p50_ms:g} | <= {v.p99_ms:g} |"
        if v.calls
        else f"| {k} | 0 | - | - | - |"
        for k, v in result.server.items()
    ]
    lines += ["", "| API writes | count | per pod |", "|---|---:|---:|"]
    lines += [
        f"| {k} | {result.writes.get(k, sum(result.writes.values())):,} | {v:.2f} |"
        for k, v in result.writes_per_pod.items()
    ]
    lines += [
        "",
        "| process | CPU s in the run | idle % of a core | CPU ms per pod | net of idle | RSS MiB after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {k} | {v:.2f} | {result.idle_cpu_percent.get(k, 0.0):.1f} | {result.cpu_ms_per_pod[k]:.2f} "
        f"| {result.cpu_ms_per_pod_net[k]:.2f} | {_rss(result, k)} |"
        for k, v in result.cpu_seconds.items()
    ]
    cluster = [k for k in result.cpu_seconds if k != "bench (load generator)"]
    lines.append(
        f"| **whole cluster** | {sum(result.cpu_seconds[k] for k in cluster):.2f} | "
        f"{sum(result.idle_cpu_percent.get(k, 0.0) for k in cluster):.1f} | "
        f"{sum(result.cpu_ms_per_pod[k] for k in cluster):.2f} | "
        f"{sum(result.cpu_ms_per_pod_net[k] for k in cluster):.2f} | "
        f"{sum(result.rss_mib.get(k, 0.0) for k in cluster):,.0f} |"
    )
    return "\n".join(lines) + "\n"


def _rss(result: Result, name: str) -> str:
    return f"{result.rss_mib[name]:,.0f}" if name in result.rss_mib else "-"


def _union(keys: Sequence[Sequence[str]]) -> list[str]:
    out: list[str] = []
    for some in keys:
        out += [k for k in some if k not in out]
    return out


def render_side_by_side(results: Sequence[Result]) -> str:
    """One table, a column per path, every number from its own fresh cluster in this invocation."""
    first = results[0]
    lines = [
        f"### side by side: {first.nodes} node(s) x {first.gpus_per_node} GPUs, {first.pods} pods, "
        f"{first.concurrency} concurrent POSTs, a fresh cluster per column",
        "",
        "| | " + " | ".join(_label(r) for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(name: str, cell: Callable[[Result], str]) -> None:
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")

    row("cluster up, s", lambda r: f"{r.up_seconds:.1f}")
    row("Running / failed", lambda r: f"{r.running} / {r.failed}")
    row("all Running after the first POST, s", lambda r: f"{r.seconds_to_all_running:.2f}")
    row("**pods/s**", lambda r: f"**{r.pods_per_second:.1f}**")
    row("1-min load before / max during", lambda r: f"{r.load_average['before'][0]} / {r.load_1min_max}")
    row("other processes' CPU, % of a core", lambda r: f"{r.others_cpu_percent:.0f}")
    row("bench (load generator) CPU, % of a core", _bench_percent)
    stages = _union([[s.stage for s in r.stages] for r in results])
    for stage in stages:
        row(f"{stage}, p50 / p99 ms", lambda r, stage=stage: _stage_cell(r, stage))
    for key in HISTOGRAMS:
        row(f"hami-control {key}: calls (mean ms)", lambda r, key=key: _server_cell(r, key))
    for kind in _union([list(r.writes_per_pod) for r in results]):
        name = "**API writes per pod, total**" if kind == "total" else f"API writes per pod: {kind}"
        row(name, lambda r, kind=kind: f"{r.writes_per_pod[kind]:.2f}" if kind in r.writes_per_pod else "-")
    for proc in _union([list(r.cpu_ms_per_pod_net) for r in results]):
        row(
            f"CPU ms per pod, net of idle: {proc}",
            lambda r, proc=proc: f"{r.cpu_ms_per_pod_net[proc]:.2f}" if proc in r.cpu_ms_per_pod_net else "-",
        )
    row("**CPU ms per pod, net of idle: whole cluster**", lambda r: f"**{_cluster_cpu(r):.2f}**")
    row("RSS of the cluster once all ran, MiB", lambda r: f"{_cluster_rss(r):,.0f}")
    return "\n".join(lines) + "\n"


def _label(result: Result) -> str:
    label = result.path if result.client_limits == "default" else f"{result.path}, client limits off"
    return f"{label}, floor (no GPU)" if result.floor else label


def _cluster_names(result: Result) -> list[str]:
    return [k for k in result.cpu_seconds if k != "bench (load generator)"]


def _cluster_cpu(result: Result) -> float:
    return sum(result.cpu_ms_per_pod_net[k] for k in _cluster_names(result))


def _cluster_rss(result: Result) -> float:
    return sum(result.rss_mib.get(k, 0.0) for k in _cluster_names(result))


def _bench_percent(result: Result) -> str:
    seconds = result.cpu_seconds.get("bench (load generator)", 0.0)
    elapsed = result.elapsed_seconds
    return f"{seconds * 100 / elapsed:.0f}" if elapsed > 0 else "-"


def _stage_cell(result: Result, stage: str) -> str:
    found = next((s for s in result.stages if s.stage == stage), None)
    return "-" if found is None else f"{found.p50_ms:,.0f} / {found.p99_ms:,.0f}"


def _server_cell(result: Result, key: str) -> str:
    found = result.server.get(key)
    if found is None or not found.calls:
        return "0"
    return f"{found.calls:,} ({found.mean_ms:.2f})"


def run_path(args: argparse.Namespace, path: str, limits: str, floor: bool = False) -> Result:
    """One fresh cluster with every node in `path`'s mode, the bench (`floor`: its pods ask no GPU),
    then the cluster torn down."""
    lifted = NO_LIMIT if limits == "off" else ()
    spec = ClusterSpec.uniform(
        args.nodes,
        args.gpus_per_node,
        MODEL,
        scale=args.scale,
        control_args=lifted,
        scheduler_args=lifted,
        controller_manager_args=lifted,
        node_args=tuple(args.node_arg),
    ).with_mode(path)
    mode = (
        f"scale mode ({'--scale' if args.scale else f'above {SCALE_THRESHOLD} nodes'})"
        if spec.scale_mode
        else "one process per part"
    )
    progress: Callable[[str], None] = lambda message: log(f"cluster ({path}): {message}")  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hami-bench-e2e-") as tmp:
        started = time.monotonic()
        with Cluster.up(spec, Path(tmp) / "state", progress=progress) as cluster:
            result = Result(
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                path=path,
                mode=mode,
                client_limits=limits,
                pods=args.pods,
                concurrency=args.concurrency,
                up_seconds=round(time.monotonic() - started, 1),
                running=0,
                failed=0,
                first_failure="",
                seconds_to_all_running=float("nan"),
                pods_per_second=0.0,
                create_seconds=0.0,
                floor=floor,
            )
            try:
                with contextlib.ExitStack() as spies:
                    if args.py_spy is not None:
                        # every process of the cluster, from before the idle baseline to the end
                        args.py_spy.mkdir(parents=True, exist_ok=True)
                        for name, pid in cluster.pids().items():
                            kind = "-floor" if floor else ""
                            out = args.py_spy / f"{path}-limits-{limits}{kind}-{name.replace('/', '_')}.txt"
                            spies.enter_context(py_spy(pid, out, name, rate=200))
                    asyncio.run(Bench(cluster, args, floor).run(result))
            finally:
                if args.keep_logs is not None:
                    where = args.keep_logs / f"{path}-limits-{limits}{'-floor' if floor else ''}"
                    shutil.copytree(cluster.logs_dir, where, dirs_exist_ok=True)
    return result


def comma_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of distinct `choices`."""

    def parse(text: str) -> list[str]:
        items = [m.strip() for m in text.split(",") if m.strip()]
        if not items or any(m not in choices for m in items) or len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of distinct values among {', '.join(choices)}, got {text!r}"
            )
        return items

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--scale", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--burst", action="store_true", help="80 pods onto 1 node x 8 GPUs")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--mode",
        dest="modes",
        type=comma_list(PATHS),
        help=f"one of {', '.join(PATHS)} (default device-plugin)",
    )
    which.add_argument(
        "--modes",
        dest="modes",
        type=comma_list(PATHS),
        help="several, comma-separated (e.g. device-plugin,dra): one fresh cluster each, in this order, "
        "and a side-by-side table at the end",
    )
    parser.add_argument(
        "--client-limits",
        type=comma_list(CLIENT_LIMITS),
        default=["default"],
        help="the control plane's client-side rate limits: default, off, or both (default,off: every mode "
        "runs with each)",
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds to wait for Running (0: auto)")
    parser.add_argument("--json", type=Path, help="the results, a list with one object per mode")
    parser.add_argument(
        "--node-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more hami-node argument for every node, repeated for each "
        "(--node-arg=--fake-container-usage --node-arg=false)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="first run the floor: the same pods asking no GPU (sent to hami-scheduler by name) on a fresh "
        "cluster of the same shape, then the GPU pods; a side-by-side table at the end",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        help="sample every process of the cluster with py-spy (200 Hz, raw collapsed stacks, one file per "
        "process in this folder; py-spy on PATH); the sampling costs CPU: profile runs only",
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        help="copy the cluster's logs here at the end (a folder per mode if several)",
    )
    args = parser.parse_args(argv)
    args.modes = args.modes or ["device-plugin"]
    if args.burst:
        args.nodes, args.gpus_per_node, args.pods = 1, 8, 80
    if args.pods > args.nodes * args.gpus_per_node * 10:
        parser.error(
            f"--pods {args.pods}: more than the cluster's {args.nodes * args.gpus_per_node * 10} slots"
        )
    if not args.timeout:
        args.timeout = 60.0 + args.pods * 0.5
    results = []
    for limits in args.client_limits:
        for path in args.modes:
            for floor in (True, False) if args.floor else (False,):
                result = run_path(args, path, limits, floor)
                print(render(result), flush=True)
                results.append(result)
    if len(results) > 1:
        print(render_side_by_side(results))
    write_json(args.json, [asdict(r) for r in results])
    ok = all(r.running == args.pods for r in results)
    for result in results:
        if result.floor:
            log(f"{_label(result)}: all Running after {result.seconds_to_all_running:.2f} s (the floor)")
            continue
        if args.burst:
            met = result.running == args.pods and result.seconds_to_all_running <= GOAL_BURST_SECONDS
            log(
                f"{result.path}: goal: 80-pod burst all Running <= {GOAL_BURST_SECONDS:.0f} s: "
                f"{'met' if met else 'NOT met'}"
            )
        else:
            met = result.running == args.pods and result.pods_per_second >= GOAL_PODS_PER_SECOND
            log(
                f"{_label(result)}: goal: >= {GOAL_PODS_PER_SECOND:.0f} pods/s: {'met' if met else 'NOT met'}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
