"""Latency of hami-control's scheduler extender (`/filter`, `/prioritize`) and bind throughput (`/bind`),
through the real HTTPS endpoints with kube-scheduler-shaped payloads, on a seeded cluster.

Per size N (`--sizes 500,5000`), from scratch:

1. A `hami-sim apiserver` (its own process) is seeded over HTTP with N nodes, each with 8 NVIDIA A100
   80GB GPUs split 10 (`hami.io/node-nvidia-register` and `status.allocatable["nvidia.com/gpu"]=80`,
   kept by the API server on create), and 10 pods per node already placed there (`spec.nodeName`,
   `hami.io/vgpu-node`, `hami.io/vgpu-devices-allocated`; 1 or 2 GPUs, 4,000-20,000 MiB each, placed
   round robin, so 15 slices on the node's 8 GPUs): 50,000 pods at N = 5,000.
2. `hami-control` starts as its own process (this script in `--serve` mode: the real `ControlPlane`,
   plus hidden routes added only here, see below) and lists both; the script waits until its cache
   holds every node and pod.
3. Latency, closed loop, one request at a time (kube-scheduler calls an extender serially for the pod it
   is scheduling). Each round sends the same kind of pod to every endpoint in turn, so the endpoints see
   the same machine load: ExtenderArgs in the names-only form (`nodeCacheCapable: true`), every node a
   candidate, with a full ~3 KB Pod; a fresh pod UID per round.
   - `/noop-filter`, **the floor**: reads the body, parses it with orjson (as the real handler must) and
     answers a constant small ExtenderFilterResult. The cost of TLS + HTTP + aiohttp + parsing the
     request on the same server in the same run. (Its answer is small; the real one carries every node.)
   - `/echo-filter`: the same, answering every candidate as fitting (`NodeNames` echoed, orjson dumps):
     the floor of any filter that has to name the nodes back, i.e. what is left for the GPU logic.
   - `/echo-failed-filter`: the same, answering the first candidate as fitting and every other one in
     FailedNodes with the hard pod's reason (written once per candidate list): the floor of the hard
     pod's answer, whose size (~60 bytes a failed node) a filter cannot shrink while every failed node
     keeps its reason.
   - `/filter` and `/prioritize` with a typical pod (1 GPU x 8,000 MiB, fits nearly every node) and a
     hard one (2 GPUs x 70,000 MiB: most nodes fail with `CardInsufficientMemory`, so the answer carries
     thousands of reason texts).
   Server CPU per request is the hami-control process's on-CPU time (all threads,
   `/proc/<pid>/task/*/schedstat`, nanoseconds) across each request.
4. Binds (hami-control's client-side API limit lifted, `--kube-api-qps 0`, unless `--kube-api-qps` says
   otherwise: at its default of 50 a second every bind and decision phase would measure the token
   bucket, ~50 a second once the burst of 100 is spent): M pending pods (`--bind-pods`, 500; capped at
   N) with the HAMi resources and `schedulerName: hami-scheduler`, each bound to a distinct node through
   `/bind` by 16 concurrent clients, twice: pods kube-scheduler filtered first (a one-candidate filter,
   not timed), then pods it never filtered (hami-control finds each in its pod watch, or reads it from
   the API).
   The second set asks 2 GPUs, the first 1, so the pending window (pods with the same GPU count wait
   for the node daemon) never holds one behind the other. Afterwards every pod is read back: it must be
   on its node with `hami.io/vgpu-node`, `hami.io/vgpu-devices-allocated` and `hami.io/bind-phase`.
5. Decisions, one pod's filter and prioritize at a time, as kube-scheduler makes them: D pending pods
   (`--decisions`, 300) of the hard then of the typical kind, each sent to `/filter` with the
   candidates kube-scheduler would pick (`numFeasibleNodesToFind`, kubernetes
   pkg/scheduler/schedule_one.go, as `hami_sim.scheduler` does: 14 % of the 4,500 nodes the bind
   phases left alone at N = 5,000, i.e. 630, the window moving on from where the last cycle stopped),
   then, when more than one node fits, to `/prioritize` with the nodes that fit, then to `/bind` with the
   best scored node (ties: the first). The nodes of the bind phases are left out, and within a phase a
   node already bound to is passed over, so the pending window (nobody plays the node daemon here)
   never makes a bind wait; the two kinds ask different GPU counts. As kube-scheduler, the loop does not
   wait for a pod's `/bind` before the next pod's `/filter` (its binding cycle runs in a goroutine,
   `ScheduleOne` in schedule_one.go; on up to `--concurrency` connections); `--binds serial` waits for
   it, as this bench did before 2026-11-29. Decisions per second = pods / wall time of the loop, the
   last bind's answer included; per decision, the three calls' latency, /filter + /prioritize together,
   and the CPU hami-control and the API server spent. Every pod is read back bound.
   `--decision-modes window,every` (the default) runs this twice: over kube-scheduler's candidate window
   as above, then with every node named in each call (`percentageOfNodesToScore: 100`, as the
   fragmentation component sets it and as an independent harness measures: all N nodes to `/filter`,
   the nodes that fit, up to N, to `/prioritize`, one kept-alive TLS connection); there the nodes bound
   to before by a phase of the same pod kind are named but passed over when choosing where to bind.
6. hami-control's RSS (`VmRSS`, and the peak `VmHWM`) after the cache sync, after the latency rounds,
   after the binds and after the decisions.

Goals (issue 29's, judged at the largest size): filter p99 <= 10 ms and <= 1.5x the floor's p99;
hami-control RSS <= 600 MB; >= 300 decisions per second in both decision modes. The load generator
shares the machine's cores with both servers, and other processes may too: the load average and the CPU
others used are reported with the numbers.

Usage:

    python bench/extender.py [--sizes 500,5000] [--rounds 200] [--bind-pods 500] [--decisions 300]
                             [--decision-modes window,every] [--control-args FLAGS] [--json FILE]
                             [--py-spy FILE] [--profile FILE]

`--py-spy FILE` samples hami-control with py-spy during the latency rounds of the largest size (raw
collapsed stacks); `--profile FILE` runs `--profile-rounds` extra filter rounds at the largest size
with cProfile on inside hami-control and writes the pstats there (top functions on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from benchlib import (
    add_json_option,
    arg_parser,
    cpu_seconds,
    log,
    machine_busy_seconds,
    markdown_table,
    p50_p99_ms,
    py_spy,
    serving_cert,
    start_apiserver,
    start_control_child,
    status_mb,
    stop_process,
    write_json,
)

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_REGISTER,
    VGPU_NODE,
    VGPU_TIME,
    encode_node_register,
    encode_pod_allocation,
)
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation

NAMESPACE = "bench"
BIND_NAMESPACE = "bench-bind"
SCHEDULER = "hami-scheduler"
GPU_TYPE = "NVIDIA-NVIDIA A100-SXM4-80GB"
GPUS_PER_NODE = 8
SPLIT = 10
DEVMEM = 81920
PODS_PER_NODE = 10
SEED_CONCURRENCY = 32
ECHO_FAILED_REASON = "8/8 CardInsufficientMemory"
"""The reason `/echo-failed-filter` gives every node but the first (the hard pod's)."""
NOOP_FILTER_ANSWER = (
    b'{"Nodes":null,"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'
)
TYPICAL = (1, 8000)
HARD = (2, 70000)
FILTER_GOAL_MS = 10.0
FLOOR_FACTOR_GOAL = 1.5
RSS_GOAL_MB = 600.0
DECISIONS_GOAL = 300.0


# --- the cluster ------------------------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def gpu_uuid(node: int, gpu: int) -> str:
    return f"GPU-{uuid.UUID(int=(node << 8) | gpu)}"


def node_object(i: int) -> dict[str, Any]:
    gpus = [
        GPUInfo(
            id=gpu_uuid(i, k),
            index=k,
            count=SPLIT,
            devmem=DEVMEM,
            devcore=100,
            type=GPU_TYPE,
            numa=k // 4,
            mode="hami-core",
            health=True,
        )
        for k in range(GPUS_PER_NODE)
    ]
    name = node_name(i)
    resources = {
        "cpu": "128",
        "memory": "1056410244Ki",
        "ephemeral-storage": "3750000000Ki",
        "pods": "110",
        "nvidia.com/gpu": str(GPUS_PER_NODE * SPLIT),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "gpu": "on",
                "nvidia.com/gpu.product": "A100-SXM4-80GB",
            },
            "annotations": {NODE_REGISTER: encode_node_register(gpus)},
        },
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24"},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def gpu_container(name: str, nums: int, mem: int, cores: int = 0) -> dict[str, Any]:
    limits = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": str(nums), "nvidia.com/gpumem": str(mem)}
    if cores:
        limits["nvidia.com/gpucores"] = str(cores)
    return {
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["python", "train.py"],
        "env": [{"name": "EPOCHS", "value": "10"}],
        "resources": {"limits": limits, "requests": dict(limits)},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def seeded_pods(i: int, rng: random.Random) -> Iterator[dict[str, Any]]:
    """The node's 10 running pods: 1 or 2 GPUs each, round robin over the GPUs (15 slices on 8 GPUs)."""
    node = node_name(i)
    cursor = 0
    for j in range(PODS_PER_NODE):
        nums = 1 + j % 2
        mem = rng.randrange(4000, 20001, 1000)
        cores = rng.choice((0, 0, 20, 30))
        slices = tuple(GPUSlice(gpu_uuid(i, (cursor + x) % GPUS_PER_NODE), mem, cores) for x in range(nums))
        cursor += nums
        allocated = encode_pod_allocation(PodAllocation((ContainerAllocation(slices),)))
        yield {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{node}-train-{j}",
                "namespace": NAMESPACE,
                "labels": {"app": "train", "hami.io/vgpu-node": node},
                "annotations": {
                    VGPU_NODE: node,
                    DEVICES_ALLOCATED: allocated,
                    DEVICES_TO_ALLOCATE: allocated,
                    VGPU_TIME: "1763800000",
                    BIND_PHASE: "success",
                },
            },
            "spec": {
                "nodeName": node,
                "schedulerName": SCHEDULER,
                "containers": [gpu_container("trainer", nums, mem, cores)],
                "restartPolicy": "Always",
            },
        }


def pending_pod(name: str, namespace: str, ask: tuple[int, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "infer"}},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [gpu_container("server", *ask)],
            "restartPolicy": "Always",
        },
    }


def scheduler_pod(i: int, ask: tuple[int, int]) -> dict[str, Any]:
    """A pending GPU pod as kube-scheduler's informer holds it and sends it to an extender (~3 KB)."""
    name = f"train-7d9f8c-{i:05d}-{ask[0]}x{ask[1]}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": "train-7d9f8c-",
            "namespace": NAMESPACE,
            "uid": str(uuid.UUID(int=(ask[1] << 40) | i)),
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "7d9f8c"},
            "annotations": {"kubernetes.io/psp": "restricted"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-7d9f8c",
                    "uid": "0b6d5f4e-8c5e-4c39-9a53-6a3f1f0f1e11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt"}]}},
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    **gpu_container("trainer", *ask),
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": SCHEDULER,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-11-22T10:00:00Z",
                    "reason": "Unschedulable",
                    "message": "0/5000 nodes are available",
                }
            ],
            "qosClass": "Guaranteed",
        },
    }


def extender_args(pod: dict[str, Any], names_json: bytes) -> bytes:
    """ExtenderArgs, names-only form; `names_json` is the pre-serialised NodeNames list."""
    return b'{"Pod":' + orjson.dumps(pod) + b',"Nodes":null,"NodeNames":' + names_json + b"}"


# --- the server side (child process) ----------------------------------------------------------------------


def serve_child(argv: list[str]) -> int:
    """The real control plane plus `/noop-filter`, `/echo-filter` and the cProfile switches; prints
    `READY <port> <nodes> <pods> <seconds to sync>` once its caches are synced, runs until SIGTERM."""
    import cProfile
    import logging

    from aiohttp import web

    from hami_control.config import load_config
    from hami_control.main import ControlPlane
    from hami_control.server import EXTENDER_MAX_BODY, json_response, read_body

    config = load_config(argv, {}, lambda p: p.read_text())
    logging.basicConfig(
        level=config.log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profiler = cProfile.Profile()

    async def noop_filter(request: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(request, EXTENDER_MAX_BODY)
        if isinstance(body, web.Response):
            return body
        orjson.loads(body)
        return web.Response(body=NOOP_FILTER_ANSWER, content_type="application/json")

    async def echo_filter(request: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(request, EXTENDER_MAX_BODY)
        if isinstance(body, web.Response):
            return body
        args = orjson.loads(body)
        return json_response(
            {
                "Nodes": None,
                "NodeNames": args.get("NodeNames"),
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        )

    failed_answers: dict[bytes, bytes] = {}

    async def echo_failed_filter(request: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(request, EXTENDER_MAX_BODY)
        if isinstance(body, web.Response):
            return body
        names = orjson.loads(body).get("NodeNames") or []
        key = orjson.dumps(names[:1] + names[-1:]) + str(len(names)).encode()
        answer = failed_answers.get(key)
        if answer is None:  # written once per candidate list: the floor is the transport's
            failed = dict.fromkeys(names[1:], ECHO_FAILED_REASON)
            answer = orjson.dumps(
                {
                    "Nodes": None,
                    "NodeNames": names[:1],
                    "FailedNodes": failed,
                    "FailedAndUnresolvableNodes": {},
                    "Error": "",
                }
            )
            failed_answers[key] = answer
        return web.Response(body=answer, content_type="application/json")

    async def profile_start(_request: web.BaseRequest) -> web.StreamResponse:
        profiler.enable()
        return web.Response(text="profiling\n")

    async def profile_stop(request: web.BaseRequest) -> web.StreamResponse:
        profiler.disable()
        path = (await request.read()).decode()
        profiler.dump_stats(path)
        return web.Response(text=f"written {path}\n")

    async def run() -> None:
        started = time.monotonic()
        plane = ControlPlane(config)
        plane.routes.add("POST", "/noop-filter", noop_filter)
        plane.routes.add("POST", "/echo-filter", echo_filter)
        plane.routes.add("POST", "/echo-failed-filter", echo_failed_filter)
        plane.routes.add("POST", "/profile-start", profile_start)
        plane.routes.add("POST", "/profile-stop", profile_stop)
        await plane.start()
        assert plane.caches is not None
        await plane.caches.wait_synced()
        stats = plane.caches.gpus.stats()
        synced = time.monotonic() - started
        print(f"READY {plane.port} {stats.nodes} {stats.pods} {synced:.2f}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await plane.stop()

    asyncio.run(run())
    return 0


# --- measuring --------------------------------------------------------------------------------------------


def proc_status_mb(pid: int, key: str) -> float:
    """A `kB` line of /proc/<pid>/status, in MB (10^6 bytes), to 0.1."""
    return round(status_mb(pid, key), 1)


def server_cpu(pid: int) -> float:
    """On-CPU seconds of every thread of the process (schedstat, ns), or /proc/<pid>/stat's ticks."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    except FileNotFoundError:
        return cpu_seconds(pid)
    return total / 1e9


@dataclass
class Latency:
    nodes: int
    name: str
    path: str
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    server_cpu_us: float
    request_kb: float
    answer_kb: float
    answer: str
    """What the answers said (fitting nodes, failed nodes), from the first one."""
    errors: int


@dataclass
class BindResult:
    nodes: int
    name: str
    binds: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    control_cpu_us: float
    apiserver_cpu_us: float
    errors: int
    bound_ok: int
    first_error: str = ""


@dataclass
class DecisionResult:
    nodes: int
    name: str
    decisions: int
    candidates: int
    """Nodes sent to each /filter."""
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    filter_p50_ms: float
    prioritize_p50_ms: float
    bind_p50_ms: float
    filter_prioritize_p50_ms: float
    """Per decision, /filter and /prioritize together (what kube-scheduler waits for before it binds)."""
    filter_prioritize_p99_ms: float
    prioritized: int
    """Decisions with more than one node left, so /prioritize was called."""
    control_cpu_us: float
    apiserver_cpu_us: float
    errors: int
    bound_ok: int
    first_error: str = ""
    generator_cpu_us: float = 0.0
    """This process's CPU per decision (playing kube-scheduler: writing the requests, decoding the
    answers, choosing the node), on the same cores as hami-control and the API server."""


@dataclass
class SizeResult:
    nodes: int
    gpus: int
    pods_seeded: int
    seed_seconds: float
    seed_writes_per_second: float
    sync_seconds: float
    sync_cpu_seconds: float
    """hami-control's CPU from its start to its caches synced (Python's imports included; `sync_seconds`
    counts from after them)."""
    sync_apiserver_cpu_seconds: float
    """The API server's CPU over the same time (serving the lists)."""
    cache_nodes: int
    cache_pods: int
    latency: list[Latency] = field(default_factory=list)
    binds: list[BindResult] = field(default_factory=list)
    decisions: list[DecisionResult] = field(default_factory=list)
    rss_mb: dict[str, float] = field(default_factory=dict)
    load_average: dict[str, list[float]] = field(default_factory=dict)
    others_cpu_percent: float = float("nan")
    """CPU used by processes other than the bench, hami-control and the API server during the latency
    rounds, in % of one core."""


def summarise_latency(  # noqa: PLR0917
    nodes: int,
    name: str,
    path: str,
    latencies: list[float],
    cpu: list[float],
    request_bytes: int,
    answer_bytes: int,
    answer: str,
    errors: int,
) -> Latency:
    latencies = sorted(latencies)
    p50, p99 = p50_p99_ms(latencies, 3)
    return Latency(
        nodes=nodes,
        name=name,
        path=path,
        requests=len(latencies),
        p50_ms=p50,
        p99_ms=p99,
        max_ms=round(latencies[-1] * 1000, 3),
        mean_ms=round(statistics.fmean(latencies) * 1000, 3),
        server_cpu_us=round(statistics.fmean(cpu) * 1e6, 1),
        request_kb=round(request_bytes / 1000, 1),
        answer_kb=round(answer_bytes / 1000, 1),
        answer=answer,
        errors=errors,
    )


def describe_answer(path: str, body: bytes) -> tuple[str, bool]:
    """(what the answer says, whether it is a good answer)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"not JSON: {body[:80]!r}", False
    if path == "/prioritize":
        if not isinstance(answer, list) or not answer:
            return f"bad HostPriorityList: {body[:80]!r}", False
        scores = [entry["Score"] for entry in answer]
        return f"{len(answer)} hosts, scores {min(scores)}..{max(scores)}", True
    if not isinstance(answer, dict) or answer.get("Error"):
        return f"error: {str(answer)[:120]}", False
    fits = len(answer.get("NodeNames") or [])
    failed = answer.get("FailedNodes") or {}
    unresolvable = answer.get("FailedAndUnresolvableNodes") or {}
    text = f"{fits} fit, {len(failed)} failed, {len(unresolvable)} unresolvable"
    if failed:
        text += f" (e.g. {next(iter(failed.values()))!r})"
    return text, True


# --- the load side ----------------------------------------------------------------------------------------


async def create_all(
    http: aiohttp.ClientSession, items: Sequence[tuple[str, dict[str, Any]]], label: str
) -> list[dict[str, Any]]:
    """POST every (path, object) with SEED_CONCURRENCY in flight; the created objects, in order."""
    created: list[dict[str, Any]] = [{} for _ in items]
    next_index = 0
    done = 0
    started = time.monotonic()
    last_report = started

    async def worker() -> None:
        nonlocal next_index, done, last_report
        while next_index < len(items):
            index = next_index
            next_index += 1
            path, obj = items[index]
            async with http.post(
                path, data=orjson.dumps(obj), headers={"Content-Type": "application/json"}
            ) as r:
                body = await r.read()
                if r.status != 201:
                    raise SystemExit(f"creating {path} failed: {r.status} {body[:300]!r}")
            created[index] = orjson.loads(body)
            done += 1
            now = time.monotonic()
            if now - last_report >= 5.0:
                last_report = now
                rate = done / (now - started)
                log(f"  {label}: {done:,}/{len(items):,} ({rate:,.0f}/s)")

    await asyncio.gather(*(worker() for _ in range(SEED_CONCURRENCY)))
    return created


async def seed(base: str, nodes: int) -> tuple[int, float]:
    """Namespaces, nodes and their running pods; returns (objects written, seconds)."""
    rng = random.Random(nodes)
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=SEED_CONCURRENCY)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        namespaces = [
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            for ns in (NAMESPACE, BIND_NAMESPACE)
        ]
        await create_all(http, namespaces, "namespaces")
        await create_all(http, [("/api/v1/nodes", node_object(i)) for i in range(nodes)], "nodes")
        pods = [
            (f"/api/v1/namespaces/{NAMESPACE}/pods", pod) for i in range(nodes) for pod in seeded_pods(i, rng)
        ]
        await create_all(http, pods, "pods")
    return 2 + nodes + len(pods), time.monotonic() - started


def start_control(
    workdir: Path, kubeconfig: Path, cert: Path, key: Path, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[str], int, int, int, float]:
    """hami-control in `--serve` mode (`extra`: more of its flags); (process, port, cached nodes, cached
    pods, seconds to sync)."""
    # default log level: one line per bind
    proc, (port, nodes, pods, synced) = start_control_child(
        __file__, workdir, kubeconfig, cert, key, "READY", *extra
    )
    return proc, int(port), int(nodes), int(pods), float(synced)


async def post(http: aiohttp.ClientSession, path: str, body: bytes) -> tuple[int, bytes]:
    async with http.post(path, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


ENDPOINTS: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("floor: constant answer", "/noop-filter", TYPICAL),
    ("floor: names echoed", "/echo-filter", TYPICAL),
    ("floor: names echoed as failed", "/echo-failed-filter", TYPICAL),
    ("filter, 1 GPU x 8000 MiB", "/filter", TYPICAL),
    ("filter, 2 GPUs x 70000 MiB", "/filter", HARD),
    ("prioritize, 1 GPU x 8000 MiB", "/prioritize", TYPICAL),
    ("prioritize, 2 GPUs x 70000 MiB", "/prioritize", HARD),
)


async def timed_rounds(
    http: aiohttp.ClientSession,
    pid: int,
    nodes: int,
    *,
    endpoints: Sequence[tuple[str, str, Hashable]],
    bodies: Callable[[int], Mapping[Hashable, bytes]],
    describe: Callable[[str, bytes], tuple[str, bool]],
    rounds: int,
    warmup: int,
    first_round: int = 0,
) -> list[Latency]:
    """`rounds` rounds (after `warmup` untimed ones), each one request per endpoint, one at a time: an
    endpoint is (name, path, kind) and `bodies(r)` the request body per kind in round r; the wall time
    and hami-control's CPU (pid) per request, the first answer of each described and checked."""
    latencies: dict[int, list[float]] = {k: [] for k in range(len(endpoints))}
    cpu: dict[int, list[float]] = {k: [] for k in range(len(endpoints))}
    errors = dict.fromkeys(range(len(endpoints)), 0)
    sizes: dict[int, tuple[int, int]] = {}
    answers: dict[int, str] = {}
    for r in range(first_round, first_round + warmup + rounds):
        round_bodies = bodies(r)
        for k, (_, path, kind) in enumerate(endpoints):
            body = round_bodies[kind]
            cpu_before = server_cpu(pid)
            started = time.perf_counter()
            status, answer = await post(http, path, body)
            elapsed = time.perf_counter() - started
            cpu_after = server_cpu(pid)
            if r - first_round < warmup:
                continue
            latencies[k].append(elapsed)
            cpu[k].append(cpu_after - cpu_before)
            if k not in answers:
                text, ok = describe(path, answer) if status == 200 else (f"HTTP {status}", False)
                answers[k] = text
                sizes[k] = (len(body), len(answer))
                errors[k] += not ok
            elif status != 200:
                errors[k] += 1
        done = r - first_round + 1 - warmup
        if done > 0 and done % 50 == 0:
            log(f"  {done}/{rounds} rounds")
    return [
        summarise_latency(nodes, name, path, latencies[k], cpu[k], *sizes[k], answers[k], errors[k])
        for k, (name, path, _) in enumerate(endpoints)
    ]


async def latency_rounds(
    http: aiohttp.ClientSession, pid: int, nodes: int, rounds: int, *, warmup: int, first_round: int
) -> list[Latency]:
    """`rounds` rounds (after `warmup` untimed ones), each one request per endpoint, one at a time."""
    names_json = orjson.dumps([node_name(i) for i in range(nodes)])

    def bodies(r: int) -> Mapping[Hashable, bytes]:
        return {ask: extender_args(scheduler_pod(r, ask), names_json) for ask in (TYPICAL, HARD)}

    return await timed_rounds(
        http,
        pid,
        nodes,
        endpoints=ENDPOINTS,
        bodies=bodies,
        describe=describe_answer,
        rounds=rounds,
        warmup=warmup,
        first_round=first_round,
    )


async def profile_rounds(http: aiohttp.ClientSession, nodes: int, rounds: int, output: Path) -> None:
    """Filter rounds (typical and hard pod) with cProfile on inside hami-control; prints the top."""
    import pstats

    names_json = orjson.dumps([node_name(i) for i in range(nodes)])
    bodies = [
        extender_args(scheduler_pod(900_000 + r, ask), names_json)
        for r in range(rounds)
        for ask in (TYPICAL, HARD)
    ]
    await post(http, "/profile-start", b"")
    for body in bodies:
        await post(http, "/filter", body)
    await post(http, "/profile-stop", str(output).encode())
    log(f"cProfile of {len(bodies)} /filter requests at {nodes:,} nodes: {output}")
    stats = pstats.Stats(str(output), stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(20)


async def create_pending(base: str, count: int, ask: tuple[int, int], prefix: str) -> list[dict[str, Any]]:
    connector = aiohttp.TCPConnector(limit=SEED_CONCURRENCY)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        items = [
            (
                f"/api/v1/namespaces/{BIND_NAMESPACE}/pods",
                pending_pod(f"{prefix}-{i:05d}", BIND_NAMESPACE, ask),
            )
            for i in range(count)
        ]
        return await create_all(http, items, f"pending pods {prefix}")


async def bind_phase(  # noqa: PLR0917
    http: aiohttp.ClientSession,
    base: str,
    pids: tuple[int, int],
    nodes: int,
    name: str,
    pods: list[dict[str, Any]],
    concurrency: int,
    prefilter: bool,
) -> BindResult:
    """Bind pod i to node i through /bind with `concurrency` clients; then read the pods back."""
    control_pid, api_pid = pids
    targets = [node_name(i % nodes) for i in range(len(pods))]
    if prefilter:  # as kube-scheduler does: the extender remembers the pod from its filter
        for pod, target in zip(pods, targets, strict=True):
            status, answer = await post(http, "/filter", extender_args(pod, orjson.dumps([target])))
            text, ok = describe_answer("/filter", answer)
            if status != 200 or not ok or not text.startswith("1 fit"):
                raise SystemExit(f"filter of {pod['metadata']['name']} on {target}: {status} {text}")
    latencies: list[float] = []
    errors = 0
    first_error = ""
    queue = list(range(len(pods)))
    queue.reverse()

    async def worker() -> None:
        nonlocal errors, first_error
        while queue:
            i = queue.pop()
            meta = pods[i]["metadata"]
            args = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": targets[i],
            }
            started = time.perf_counter()
            status, answer = await post(http, "/bind", orjson.dumps(args))
            latencies.append(time.perf_counter() - started)
            error = orjson.loads(answer).get("Error") if status == 200 else f"HTTP {status}"
            if error:
                errors += 1
                first_error = first_error or str(error)

    control_before, api_before = server_cpu(control_pid), server_cpu(api_pid)
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.monotonic() - started
    control_cpu = server_cpu(control_pid) - control_before
    api_cpu = server_cpu(api_pid) - api_before
    async with (
        aiohttp.ClientSession(base) as api,
        api.get(f"/api/v1/namespaces/{BIND_NAMESPACE}/pods") as r,
    ):
        listed = {p["metadata"]["name"]: p for p in orjson.loads(await r.read())["items"]}
    bound_ok = 0
    for pod, target in zip(pods, targets, strict=True):
        now = listed.get(pod["metadata"]["name"], {})
        annotations = (now.get("metadata") or {}).get("annotations") or {}
        bound_ok += (
            (now.get("spec") or {}).get("nodeName") == target
            and annotations.get(VGPU_NODE) == target
            and bool(annotations.get(DEVICES_ALLOCATED))
            and annotations.get(BIND_PHASE) == "allocating"
        )
    latencies.sort()
    n = max(1, len(pods))
    p50, p99 = p50_p99_ms(latencies, 2)
    return BindResult(
        nodes=nodes,
        name=name,
        binds=len(pods),
        seconds=round(seconds, 2),
        per_second=round(len(pods) / seconds, 1),
        p50_ms=p50,
        p99_ms=p99,
        max_ms=round(latencies[-1] * 1000, 2),
        control_cpu_us=round(control_cpu * 1e6 / n, 1),
        apiserver_cpu_us=round(api_cpu * 1e6 / n, 1),
        errors=errors,
        bound_ok=bound_ok,
        first_error=first_error,
    )


def best_unused(scores: Sequence[tuple[str, int]], used: set[str]) -> str | None:
    """The best scored node not in `used` (ties: the first listed). One pass: the load generator's own
    CPU shares the machine with hami-control's."""
    best, best_score = None, -1
    for host, score in scores:
        if score > best_score and host not in used:
            best, best_score = host, score
    return best


async def decision_phase(  # noqa: PLR0917
    http: aiohttp.ClientSession,
    base: str,
    pids: tuple[int, int],
    nodes: int,
    name: str,
    pods: list[dict[str, Any]],
    names: list[str],
    used: set[str],
    *,
    every_node: bool = False,
    bind_http: aiohttp.ClientSession | None = None,
) -> DecisionResult:
    """/filter, /prioritize (when more than one node fits), /bind for one pod after the other, as
    kube-scheduler makes its decisions (see the module docstring): over kube-scheduler's candidate window
    of the nodes `names` not in `used`, or (`every_node`) over every node of `names` in each call, the
    nodes of `used` passed over only when choosing where to bind. Nodes chosen are added to `used`.

    With `bind_http`, each /bind is sent on it without waiting, and the next pod's /filter follows at
    once, as kube-scheduler does: its scheduling cycle assumes the pod on the chosen node and runs the
    binding cycle in a goroutine (`ScheduleOne`, pkg/scheduler/schedule_one.go); the phase ends when the
    last bind has answered. Without it the three calls of a pod are made one after the other."""
    control_pid, api_pid = pids
    free = [n for n in names if n not in used]
    if not free:
        raise SystemExit(
            f"bench/extender.py: {nodes} nodes: the bind phases bound a pod to every node, none is left "
            "for the decisions: give --bind-pods at most a third of the nodes"
        )
    # imported here: the hami-control child (`--serve`) loads this module too, and its list + sync is
    # timed from its start (the simulator's imports are no part of hami-control's)
    from hami_sim.scheduler.fit import num_feasible_nodes_to_find

    window = len(names) if every_node else num_feasible_nodes_to_find(None, len(free))
    every_json = orjson.dumps(names) if every_node else b""
    start = 0
    latencies: list[float] = []
    before_bind: list[float] = []
    per_verb: dict[str, list[float]] = {"/filter": [], "/prioritize": [], "/bind": []}
    errors = 0
    first_error = ""
    chosen: dict[str, str] = {}

    def failed(text: str) -> None:
        nonlocal errors, first_error
        errors += 1
        first_error = first_error or text

    async def timed(path: str, body: bytes, on: aiohttp.ClientSession = http) -> tuple[int, bytes]:
        began = time.perf_counter()
        answer = await post(on, path, body)
        per_verb[path].append(time.perf_counter() - began)
        return answer

    async def bind(name: str, target: str, body: bytes, began: float) -> None:
        status, answer = await timed("/bind", body, bind_http or http)
        latencies.append(time.perf_counter() - began)
        error = orjson.loads(answer).get("Error") if status == 200 else f"HTTP {status}"
        if error:
            failed(str(error))
            return
        chosen[name] = target

    binding: list[asyncio.Task[None]] = []

    control_before, api_before = server_cpu(control_pid), server_cpu(api_pid)
    generator_before = time.process_time()
    started = time.monotonic()
    for pod in pods:
        if every_node:
            candidates_json = every_json
        else:
            candidates_json = orjson.dumps([free[(start + i) % len(free)] for i in range(window)])
            start = (start + window) % len(free)
        began = time.perf_counter()
        status, answer = await timed("/filter", extender_args(pod, candidates_json))
        fitting = (orjson.loads(answer).get("NodeNames") or []) if status == 200 else []
        if not fitting:
            failed(f"filter of {pod['metadata']['name']}: {status} {answer[:120]!r}")
            continue
        scores = [(n, 0) for n in fitting]
        if len(fitting) > 1:
            status, answer = await timed("/prioritize", extender_args(pod, orjson.dumps(fitting)))
            if status == 200:
                scores = [(entry["Host"], entry["Score"]) for entry in orjson.loads(answer)]
        target = best_unused(scores, used)
        before_bind.append(time.perf_counter() - began)
        if target is None:
            failed(f"{pod['metadata']['name']}: every node that fits was bound to already in this phase")
            continue
        meta = pod["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": target,
        }
        used.add(target)  # kube-scheduler's assume: the next cycle sees the node taken
        if bind_http is None:
            await bind(meta["name"], target, orjson.dumps(args), began)
        else:
            binding.append(asyncio.create_task(bind(meta["name"], target, orjson.dumps(args), began)))
    if binding:
        await asyncio.gather(*binding)
    seconds = time.monotonic() - started
    generator_cpu = time.process_time() - generator_before
    control_cpu = server_cpu(control_pid) - control_before
    api_cpu = server_cpu(api_pid) - api_before
    async with (
        aiohttp.ClientSession(base) as api,
        api.get(f"/api/v1/namespaces/{BIND_NAMESPACE}/pods") as r,
    ):
        listed = {p["metadata"]["name"]: p for p in orjson.loads(await r.read())["items"]}
    bound_ok = 0
    for pod_name, target in chosen.items():
        now = listed.get(pod_name, {})
        annotations = (now.get("metadata") or {}).get("annotations") or {}
        bound_ok += (now.get("spec") or {}).get("nodeName") == target and annotations.get(VGPU_NODE) == target
    latencies.sort()
    n = max(1, len(pods))

    def p50(path: str) -> float:
        values = per_verb[path]
        return round(statistics.median(values) * 1000, 2) if values else float("nan")

    all_p50, all_p99 = p50_p99_ms(latencies, 2)
    before_bind.sort()
    fp_p50, fp_p99 = p50_p99_ms(before_bind, 2) if before_bind else (float("nan"), float("nan"))
    return DecisionResult(
        nodes=nodes,
        name=name,
        decisions=len(pods),
        candidates=window,
        seconds=round(seconds, 2),
        per_second=round(len(pods) / seconds, 1),
        p50_ms=all_p50,
        p99_ms=all_p99,
        filter_p50_ms=p50("/filter"),
        prioritize_p50_ms=p50("/prioritize"),
        bind_p50_ms=p50("/bind"),
        filter_prioritize_p50_ms=fp_p50,
        filter_prioritize_p99_ms=fp_p99,
        prioritized=len(per_verb["/prioritize"]),
        control_cpu_us=round(control_cpu * 1e6 / n, 1),
        apiserver_cpu_us=round(api_cpu * 1e6 / n, 1),
        errors=errors,
        bound_ok=bound_ok,
        first_error=first_error,
        generator_cpu_us=round(generator_cpu * 1e6 / n, 1),
    )


@contextlib.asynccontextmanager
async def extender_session(port: int, ca: bytes, limit: int) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cadata=ca.decode())
    connector = aiohttp.TCPConnector(ssl=context, limit=limit)
    async with aiohttp.ClientSession(f"https://127.0.0.1:{port}", connector=connector) as http:
        yield http


async def measure_size(  # noqa: PLR0917
    args: argparse.Namespace,
    nodes: int,
    port: int,
    pids: tuple[int, int],
    ca: bytes,
    base: str,
    result: SizeResult,
    profile: bool,
) -> None:
    control_pid, api_pid = pids
    own = os.getpid()
    async with extender_session(port, ca, 1) as http:
        log(f"latency: {args.rounds} rounds (+{args.warmup} warm-up) x {len(ENDPOINTS)} endpoints, serial")
        result.load_average["before the latency rounds"] = [round(x, 2) for x in os.getloadavg()]
        busy_before = machine_busy_seconds()
        ours_before = cpu_seconds(own) + cpu_seconds(control_pid) + cpu_seconds(api_pid)
        wall_before = time.monotonic()
        with py_spy(control_pid, args.py_spy if profile else None, "hami-control during the latency rounds"):
            result.latency = await latency_rounds(
                http, control_pid, nodes, args.rounds, warmup=args.warmup, first_round=0
            )
        ours = cpu_seconds(own) + cpu_seconds(control_pid) + cpu_seconds(api_pid) - ours_before
        others = machine_busy_seconds() - busy_before - ours
        result.others_cpu_percent = round(max(0.0, others) * 100 / (time.monotonic() - wall_before), 1)
        result.load_average["after the latency rounds"] = [round(x, 2) for x in os.getloadavg()]
        result.rss_mb["after the latency rounds"] = proc_status_mb(control_pid, "VmRSS")
        if profile and args.profile is not None:
            await profile_rounds(http, nodes, args.profile_rounds, args.profile)
    count = min(args.bind_pods, nodes)
    if count > 0:
        async with extender_session(port, ca, args.concurrency) as http:
            for name, ask, prefix, prefilter in (
                ("bind, pod filtered first", TYPICAL, "a", True),
                ("bind, pod never filtered", (2, 8000), "b", False),
            ):
                log(f"{name}: creating {count} pending pods")
                pods = await create_pending(base, count, ask, prefix)
                log(f"{name}: {count} binds, {args.concurrency} clients")
                result.binds.append(
                    await bind_phase(http, base, pids, nodes, name, pods, args.concurrency, prefilter)
                )
        result.rss_mb["after the binds"] = proc_status_mb(control_pid, "VmRSS")
    if args.decisions <= 0:
        return
    names = [node_name(i) for i in range(nodes)]
    bound = {node_name(i % nodes) for i in range(count)}
    # A node bound to in one decision phase is passed over by the later phases of the same pod kind
    # (nobody plays the node daemon: its pod stays pending there); the kinds ask different GPU counts.
    used = {HARD: set(bound), TYPICAL: set(bound)}
    modes = [m.strip() for m in args.decision_modes.split(",") if m.strip()]
    phases = []
    for mode in modes:
        every = mode == "every"
        for name, ask, prefix in (("hard", HARD, "h"), ("typical", TYPICAL, "t")):
            what = f"decisions ({'every node named' if every else 'candidate window'}), {name} pod"
            log(f"{what}: creating {args.decisions} pending pods")
            pods = await create_pending(base, args.decisions, ask, f"{prefix}{mode[0]}")
            label = f"{name}, {ask[0]} GPU x {ask[1]} MiB{', every node named' if every else ''}"
            phases.append((what, label, pods, used[ask], every))
    spy = args.py_spy_decisions if profile else None
    async with (
        extender_session(port, ca, 1) as http,
        extender_session(port, ca, args.concurrency) as bind_http,
    ):
        with py_spy(control_pid, spy, "hami-control during the decisions"):
            for what, label, pods, used_nodes, every in phases:
                how = "binds not awaited" if args.binds == "async" else "one call after the other"
                log(f"{what}: {args.decisions} pods, filter + prioritize + bind, {how}")
                result.decisions.append(
                    await decision_phase(
                        http,
                        base,
                        pids,
                        nodes,
                        label,
                        pods,
                        names,
                        used_nodes,
                        every_node=every,
                        bind_http=bind_http if args.binds == "async" else None,
                    )
                )
    result.rss_mb["after the decisions"] = proc_status_mb(control_pid, "VmRSS")


def run_size(args: argparse.Namespace, nodes: int, profile: bool) -> SizeResult:
    with tempfile.TemporaryDirectory(prefix="hami-bench-extender-") as tmp:
        workdir = Path(tmp)
        ca_cert, cert, key = serving_cert(workdir)
        kubeconfig = workdir / "kubeconfig"
        api, base = start_apiserver(kubeconfig, workdir / "apiserver.log", "--log-level", "WARNING")
        control = None
        try:
            log(f"{nodes:,} nodes: seeding {nodes:,} nodes and {nodes * PODS_PER_NODE:,} pods")
            written, seconds = asyncio.run(seed(base, nodes))
            log(f"seeded {written:,} objects in {seconds:.1f} s; starting hami-control")
            flags = ["--kube-api-qps", args.kube_api_qps, *args.control_args.split()]
            api_before = server_cpu(api.pid)
            control, port, cached_nodes, cached_pods, synced = start_control(
                workdir, kubeconfig, cert, key, flags
            )
            sync_cpu = (server_cpu(control.pid), server_cpu(api.pid) - api_before)
            log(f"hami-control synced in {synced:.1f} s: {cached_nodes:,} nodes, {cached_pods:,} pods")
            if cached_nodes != nodes or cached_pods != nodes * PODS_PER_NODE:
                raise SystemExit(
                    f"hami-control's cache holds {cached_nodes} nodes and {cached_pods} pods, "
                    f"expected {nodes} and {nodes * PODS_PER_NODE}; see {workdir / 'control.log'}"
                )
            result = SizeResult(
                nodes=nodes,
                gpus=nodes * GPUS_PER_NODE,
                pods_seeded=nodes * PODS_PER_NODE,
                seed_seconds=round(seconds, 1),
                seed_writes_per_second=round(written / seconds),
                sync_seconds=synced,
                sync_cpu_seconds=round(sync_cpu[0], 1),
                sync_apiserver_cpu_seconds=round(sync_cpu[1], 1),
                cache_nodes=cached_nodes,
                cache_pods=cached_pods,
            )
            result.rss_mb["after the cache sync"] = proc_status_mb(control.pid, "VmRSS")
            asyncio.run(
                measure_size(args, nodes, port, (control.pid, api.pid), ca_cert, base, result, profile)
            )
            result.rss_mb["peak (VmHWM)"] = proc_status_mb(control.pid, "VmHWM")
            if control.poll() is not None:
                raise SystemExit(f"hami-control exited with {control.returncode} during the run")
            return result
        finally:
            stop_process(control)
            stop_process(api)


# --- the report -------------------------------------------------------------------------------------------


LATENCY_TABLE = (
    "nodes (x 8 GPUs)",
    "pods cached",
    "request",
    "p50 ms",
    "p99 ms",
    "max ms",
    "server CPU per request",
    "request / answer KB",
    "answer",
)
BIND_TABLE = (
    "nodes",
    "bind phase",
    "binds",
    "binds/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "hami-control CPU per bind",
    "API server CPU per bind",
    "bound with annotations",
    "errors",
)
DECISION_TABLE = (
    "nodes",
    "decisions (pod)",
    "pods",
    "candidates",
    "decisions/s",
    "p50 ms",
    "p99 ms",
    "filter / prioritize / bind p50 ms",
    "filter + prioritize p50 / p99 ms",
    "prioritized",
    "hami-control CPU per decision",
    "decisions/s its CPU allows",
    "API server CPU per decision",
    "load generator CPU per decision",
    "bound",
    "errors",
)
SIZE_TABLE = (
    "nodes",
    "objects seeded",
    "seeding",
    "hami-control list + cache sync (CPU)",
    "RSS after sync",
    "after latency rounds",
    "after binds",
    "after decisions",
    "peak (VmHWM)",
    "load average (1, 5, 15 min)",
    "others' CPU",
)


def _size_row(s: SizeResult) -> tuple[str, ...]:
    def mb(key: str) -> str:
        return f"{s.rss_mb.get(key, float('nan')):.0f} MB"

    load = s.load_average.get("before the latency rounds", [])
    return (
        f"{s.nodes:,}",
        f"{s.nodes + s.pods_seeded:,}",
        f"{s.seed_seconds:.0f} s ({s.seed_writes_per_second:,}/s)",
        f"{s.sync_seconds:.1f} s (CPU {s.sync_cpu_seconds:.1f} s; API server "
        f"{s.sync_apiserver_cpu_seconds:.1f} s)",
        *(
            mb(k)
            for k in (
                "after the cache sync",
                "after the latency rounds",
                "after the binds",
                "after the decisions",
                "peak (VmHWM)",
            )
        ),
        ", ".join(f"{x:.2f}" for x in load),
        f"{s.others_cpu_percent:.0f} %",
    )


def _errors(count: int, first: str) -> str:
    return f"{count}{f' ({first[:80]})' if count else ''}"


def report(results: list[SizeResult]) -> str:
    out = markdown_table(
        LATENCY_TABLE,
        "rrlrrrrrl",
        (
            (
                f"{s.nodes:,}",
                f"{s.cache_pods:,}",
                f"{r.name} (`{r.path}`)",
                f"{r.p50_ms:.2f}",
                f"{r.p99_ms:.2f}",
                f"{r.max_ms:.1f}",
                f"{r.server_cpu_us:,.0f} µs",
                f"{r.request_kb:,.0f} / {r.answer_kb:,.1f}",
                f"{r.answer}{f' ({r.errors} errors)' if r.errors else ''}",
            )
            for s in results
            for r in s.latency
        ),
    )
    if any(s.binds for s in results):
        out += [
            "",
            *markdown_table(
                BIND_TABLE,
                "rlrrrrrrrrr",
                (
                    (
                        f"{s.nodes:,}",
                        b.name,
                        b.binds,
                        f"{b.per_second:,.0f}",
                        f"{b.p50_ms:.1f}",
                        f"{b.p99_ms:.1f}",
                        f"{b.max_ms:.1f}",
                        f"{b.control_cpu_us:,.0f} µs",
                        f"{b.apiserver_cpu_us:,.0f} µs",
                        f"{b.bound_ok}/{b.binds}",
                        _errors(b.errors, b.first_error),
                    )
                    for s in results
                    for b in s.binds
                ),
            ),
        ]
    if any(s.decisions for s in results):
        out += [
            "",
            *markdown_table(
                DECISION_TABLE,
                "rlrrrrrllrrrrrrr",
                (
                    (
                        f"{s.nodes:,}",
                        d.name,
                        d.decisions,
                        f"{d.candidates:,}",
                        f"{d.per_second:,.0f}",
                        f"{d.p50_ms:.1f}",
                        f"{d.p99_ms:.1f}",
                        f"{d.filter_p50_ms:.1f} / {d.prioritize_p50_ms:.1f} / {d.bind_p50_ms:.1f}",
                        f"{d.filter_prioritize_p50_ms:.1f} / {d.filter_prioritize_p99_ms:.1f}",
                        d.prioritized,
                        f"{d.control_cpu_us:,.0f} µs",
                        f"{1e6 / d.control_cpu_us:,.0f}" if d.control_cpu_us else "-",
                        f"{d.apiserver_cpu_us:,.0f} µs",
                        f"{d.generator_cpu_us:,.0f} µs",
                        f"{d.bound_ok}/{d.decisions}",
                        _errors(d.errors, d.first_error),
                    )
                    for s in results
                    for d in s.decisions
                ),
            ),
        ]
    out += ["", *markdown_table(SIZE_TABLE, "rrrrrrrrrlr", (_size_row(s) for s in results))]
    largest = max(results, key=lambda s: s.nodes)
    floor = next(r for r in largest.latency if r.path == "/noop-filter")
    out.append("")
    for r in (r for r in largest.latency if r.path == "/filter"):
        met = r.p99_ms <= FILTER_GOAL_MS
        ratio = r.p99_ms / floor.p99_ms if floor.p99_ms else float("inf")
        out.append(
            f"- {r.name} at {largest.nodes:,} nodes: p99 {r.p99_ms:.2f} ms, goal <= {FILTER_GOAL_MS:.0f} ms "
            f"{'met' if met else 'NOT met'}; {ratio:.1f}x the floor's p99 ({floor.p99_ms:.2f} ms), "
            f"goal <= {FLOOR_FACTOR_GOAL:g}x {'met' if ratio <= FLOOR_FACTOR_GOAL else 'NOT met'} "
            f"(p50 {r.p50_ms / floor.p50_ms if floor.p50_ms else float('inf'):.1f}x the floor's)"
        )
    failed_floor = next((r for r in largest.latency if r.path == "/echo-failed-filter"), None)
    hard = next((r for r in largest.latency if r.path == "/filter" and r.name.startswith("filter, 2")), None)
    if failed_floor is not None and hard is not None and failed_floor.p99_ms and failed_floor.p50_ms:
        out.append(
            f"- {hard.name}: p99 {hard.p99_ms / failed_floor.p99_ms:.1f}x, p50 "
            f"{hard.p50_ms / failed_floor.p50_ms:.1f}x the floor of an answer naming every failed node "
            f"(`/echo-failed-filter`: p50 / p99 {failed_floor.p50_ms:.2f} / {failed_floor.p99_ms:.2f} ms)"
        )
    for d in largest.decisions:
        met = d.per_second >= DECISIONS_GOAL
        out.append(
            f"- decisions, {d.name} at {largest.nodes:,} nodes: {d.per_second:,.0f}/s, goal >= "
            f"{DECISIONS_GOAL:.0f}/s {'met' if met else 'NOT met'}"
        )
    most = max(v for k, v in largest.rss_mb.items() if k != "peak (VmHWM)")
    peak = largest.rss_mb["peak (VmHWM)"]
    out.append(
        f"- hami-control RSS at {largest.nodes:,} nodes: up to {most:.0f} MB (peak {peak:.0f} MB), "
        f"goal <= {RSS_GOAL_MB:.0f} MB {'met' if most <= RSS_GOAL_MB else 'NOT met'}"
    )
    return "\n".join(out)


def build_parser(doc: str | None) -> argparse.ArgumentParser:
    """This bench's options (bench/scale.py takes them with other defaults)."""
    parser = arg_parser(doc)
    parser.add_argument("--sizes", default="500,5000", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=200, help="timed requests per endpoint and size")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--bind-pods", type=int, default=500, help="pods bound per bind phase (<= nodes)")
    parser.add_argument(
        "--decisions", type=int, default=300, help="pods decided (filter + prioritize + bind) per pod kind"
    )
    parser.add_argument(
        "--decision-modes",
        default="window,every",
        help="decision phases: 'window' (kube-scheduler's candidate window of the nodes the bind phases "
        "left alone), 'every' (every node named in each call), comma-separated",
    )
    parser.add_argument(
        "--binds",
        choices=("async", "serial"),
        default="async",
        help="decisions: async (kube-scheduler's: the next pod's /filter does not wait for a /bind, which "
        "runs in its binding cycle's goroutine, schedule_one.go) or serial (each pod's three calls in a row)",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent /bind clients")
    parser.add_argument(
        "--kube-api-qps",
        default="0",
        help="hami-control's --kube-api-qps: 0 (the default here) lifts its client-side limit, so that binds "
        "and decisions measure hami-control rather than its token bucket (its own default, 50 a second "
        "with bursts of 100, caps both at ~50 a second once the burst is spent)",
    )
    parser.add_argument(
        "--control-args",
        default="",
        help="more hami-control flags, space-separated (e.g. '--node-scheduler-policy fragmentation')",
    )
    add_json_option(parser)
    parser.add_argument("--py-spy", type=Path, help="py-spy samples of the latency rounds (largest size)")
    parser.add_argument(
        "--py-spy-decisions", type=Path, help="py-spy samples of the decision phases (largest size)"
    )
    parser.add_argument("--profile", type=Path, help="cProfile stats of extra filter rounds (largest size)")
    parser.add_argument("--profile-rounds", type=int, default=50, help="rounds profiled with --profile")
    return parser


def parse_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[int]]:
    """The options and the sizes; exits with a usage error on bad ones."""
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sizes: expected comma-separated node counts, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.rounds < 1:
        parser.error("--sizes and --rounds must be positive")
    if args.profile is not None:
        args.profile = args.profile.resolve()  # hami-control writes it, from another directory
    return args, sizes


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2:])
    args, sizes = parse_args(build_parser(__doc__))
    started = time.monotonic()
    results = [run_size(args, n, n == max(sizes)) for n in sizes]
    table = report(results)
    print(table)
    log(f"done in {time.monotonic() - started:.0f} s")
    write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
