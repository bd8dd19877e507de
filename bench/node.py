"""The node daemon (`hami-node`) as its own process with the fake GPU backend: Allocate latency, Xid to
kubelet update, kubelet restart to registered, and the daemon's memory.

Set-up: `hami-sim apiserver` as its own process, `hami-node --gpu-backend fake` as its own process
(8 fake GPUs x split 10 by default), and the kubelet stand-in (`hami_sim.kubelet.KubeletRunner`) in
this process. Phases, in order:

0. Baseline: --allocations no-op RPCs (GetDevicePluginOptions) back to back: what gRPC, the threads
   and the machine cost with no work in the handler.
1. Allocate: batches of pods, one pod per GPU count 1..8 (the scheduler keeps the pods pending on a
   node apart by those counts), each with --containers containers, created and bound with the
   scheduler's annotations. Once GetPreferredAllocation shows the daemon steering to every pod's GPUs
   (so its pod watch has them), each container gets what kubelet sends, back to back from a direct
   gRPC client on the plugin's Unix socket: GetPreferredAllocation over every advertised ID, then
   Allocate of the IDs it chose; both are timed. The stand-in here runs without an API server, so it
   never admits those pods itself. One warm-up batch is not counted. Every pod must end with
   bind-phase=success (the daemon's writer); the pods are then deleted.
1b. Misses: Allocate requests no pending pod explains, back to back (--misses each): with no pod
   bound to the node, then with a pod another scheduler bound there (no HAMi annotations). The daemon
   reads the node's pods from the API server once per miss and answers with the error at once (goal:
   p99 <= 100 ms; before, it held each such call for --allocate-wait-seconds, 5 s, and the node's
   later pods with it). Timed to the error's arrival.
2. Xid: an Xid 79 event is written to the inventory file (write-then-rename); the time until a
   ListAndWatch message shows that GPU Unhealthy, at a direct gRPC stream and at the kubelet
   stand-in; then until it is Healthy again (--recovery, the daemon's --health-recovery-seconds).
3. Kubelet restart: `KubeletRunner.restart()`, then the time until the plugin has registered again and
   its ListAndWatch lists every device healthy.
4. End to end: a kubelet stand-in that follows the API server admits pods one at a time; the time
   from the create + bind to the pod admitted (GetPreferredAllocation, Allocate, status patch).

The daemon's VmRSS (/proc/<pid>/status) is read after start-up, after the Allocate phase and at the
end; the CPU that other processes used meanwhile is reported (this machine may be shared). Every
process and the temporary directory are removed at the end, also on failure (--keep keeps the
directory and its logs/). Progress goes to stderr, a markdown table to stdout. Usage:

    python bench/node.py [--allocations 2000] [--containers 2] [--misses 200] [--xid-rounds 20]
                         [--restarts 20] [--e2e-pods 40] [--gpus 8] [--split 10] [--recovery 0.5]
                         [--json FILE] [--py-spy FILE] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import benchlib
import grpc
import urllib3
from benchlib import (
    add_daemon_options,
    arg_parser,
    cpu_seconds,
    log,
    machine_busy_seconds,
    markdown_table,
    py_spy,
    start_apiserver,
    status_mb,
    stop_process,
    wait_until,
    write_json,
)

from hami_api import annotations as ann
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import FakeEvent, Inventory, generate_inventory, write_inventory
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.api.constants import UNHEALTHY
from hami_sim.kubelet import KubeletConfig, KubeletRunner
from hami_sim.kubelet.devicemanager import Snapshot

RESOURCE = "nvidia.com/gpu"
SOCKET_NAME = "hami-nvidia-gpu.sock"
NAMESPACE = "default"
MEM_PER_SLICE = 1000
CORES_PER_SLICE = 10


# --- results -------------------------------------------------------------------------------------------


@dataclass
class Stat(benchlib.Stat):
    goal_ms: float | None = None
    goal_on: str = "p99"

    def summary(self) -> dict[str, Any]:
        s = self.samples
        p50 = statistics.median(s) * 1000 if s else math.nan
        value = {"p50": p50, "p99": self.q(0.99), "max": max(s) * 1000 if s else math.nan}[self.goal_on]
        met = None if self.goal_ms is None else (not self.errors and value <= self.goal_ms)
        goal = None if self.goal_ms is None else f"{self.goal_on} <= {self.goal_ms:g} ms"
        return super().summary() | {"goal": goal, "met": met}


@dataclass
class Report:
    stats: list[Stat] = field(default_factory=list)
    rss_mb: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)


# --- processes and files -------------------------------------------------------------------------------


class Api:
    """Plain HTTP to the stand-in API server (the load generator must stay cheap)."""

    def __init__(self, base: str) -> None:
        self.pool = urllib3.PoolManager(maxsize=4)
        self.base = base

    def close(self) -> None:
        self.pool.clear()

    def call(self, method: str, path: str, body: object = None, ok: Sequence[int] = (200, 201)) -> Any:
        data = None if body is None else json.dumps(body).encode()
        r = self.pool.request(
            method,
            self.base + path,
            body=data,
            headers={"Content-Type": "application/json"},
            timeout=10.0,
            retries=False,
        )
        if r.status not in ok:
            raise SystemExit(f"{method} {path}: HTTP {r.status}: {r.data[:300]!r}")
        return json.loads(r.data) if r.data else None

    def create_scheduled_pod(
        self, name: str, node: str, gpus: Sequence[str], containers: int, labels: dict[str, str]
    ) -> None:
        """Create the pod, then bind it as the HAMi scheduler does: its choice rides on the Binding."""
        limits = {RESOURCE: str(len(gpus)), "nvidia.com/gpumem": str(MEM_PER_SLICE)}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "schedulerName": "hami-scheduler",
                "containers": [
                    {"name": f"c{i}", "image": "cuda:12", "resources": {"limits": limits}}
                    for i in range(containers)
                ],
            },
        }
        self.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        slices = tuple(GPUSlice(uuid, MEM_PER_SLICE, CORES_PER_SLICE) for uuid in gpus)
        text = ann.encode_pod_allocation(
            PodAllocation(tuple(ContainerAllocation(slices) for _ in range(containers)))
        )
        now = str(int(time.time()))
        annotations = {
            ann.DEVICES_TO_ALLOCATE: text,
            ann.DEVICES_ALLOCATED: text,
            ann.VGPU_NODE: node,
            ann.VGPU_TIME: now,
            ann.BIND_PHASE: "allocating",
            ann.BIND_TIME: now,
        }
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding", binding)

    def delete_pod(self, name: str, *, force: bool = False) -> None:
        """Delete gracefully (the kubelet stand-in deletes it once stopped), or with `force` at once
        (grace 0): a pod of the node before its kubelet stand-in runs, as a person force-deletes a pod
        whose kubelet is not there."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0} if force else None
        self.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", body, ok=(200, 202, 404))

    def pods(self, selector: str) -> list[dict[str, Any]]:
        body = self.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
        items: list[dict[str, Any]] = body["items"]
        return items


@dataclass
class Cluster:
    tmp: Path
    node: str
    inventory_path: Path
    inventory: Inventory
    kubelet_dir: Path
    kubeconfig: Path
    api: Api
    apiserver: subprocess.Popen[bytes]
    daemon: subprocess.Popen[bytes] | None = None
    kubelet: KubeletRunner | None = None

    @property
    def socket(self) -> Path:
        return self.kubelet_dir / SOCKET_NAME

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.inventory.gpus]


def start_apiserver_in(tmp: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    kubeconfig = tmp / "kubeconfig"
    proc, base = start_apiserver(kubeconfig, tmp / "logs" / "apiserver.log", "--log-level", "WARNING")
    return proc, base, kubeconfig


def start_daemon(
    c: Cluster, split: int, recovery_s: float, log_level: str, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "hami_node.main",
        "--node-name",
        c.node,
        "--kubelet-dir",
        str(c.kubelet_dir),
        "--kubeconfig",
        str(c.kubeconfig),
        "--gpu-backend",
        "fake",
        "--fake-inventory",
        str(c.inventory_path),
        "--hook-path",
        str(c.tmp / "hook"),
        "--device-split-count",
        str(split),
        "--health-recovery-seconds",
        str(recovery_s),
        "--log-level",
        log_level,
        *extra,
    ]
    logfile = open(c.tmp / "logs" / "node.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "NODE_NAME", "KUBECONFIG"))}
    return subprocess.Popen(command, stdout=logfile, stderr=subprocess.STDOUT, env=env)


def all_healthy(total: int, after_registrations: int = 0) -> Callable[[Snapshot], bool]:
    def check(s: Snapshot) -> bool:
        r = s.resource(RESOURCE)
        return (
            r is not None
            and r.connected
            and r.registrations > after_registrations
            and len(r.healthy) == total
            and not r.unhealthy
        )

    return check


# --- phase 1: Allocate ---------------------------------------------------------------------------------


def pod_gpus(uuids: Sequence[str], count: int) -> list[str]:
    """The GPUs of the pod asking `count`: the last ones, in reverse, so that GetPreferredAllocation's
    answer (steered to them) differs from its spread (which starts at the first GPU)."""
    return list(reversed(uuids))[:count]


def daemon_knows(stub: Any, uuids: Sequence[str], count: int) -> bool:
    """Whether the daemon steers a `count`-device GetPreferredAllocation to that pod's GPUs."""
    available = [f"{u}-0" for u in uuids]
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=count)
        ]
    )
    answer = stub.GetPreferredAllocation(request, timeout=10)
    chosen = list(answer.container_responses[0].deviceIDs)
    return chosen == [f"{u}-0" for u in pod_gpus(uuids, count)]


def allocate_phase(c: Cluster, args: argparse.Namespace, report: Report) -> None:
    """Per container, as kubelet: GetPreferredAllocation over every advertised ID, then Allocate of the
    IDs it chose. Both are timed; Allocate is also split by whether the call completes its pod (the
    daemon then queues the pod's bind-phase patch, which runs while the next calls come in)."""
    paced = f"{args.pace_ms:g} ms apart" if args.pace_ms > 0 else "back to back"
    allocate = Stat(f"Allocate (one container, calls {paced})", goal_ms=5.0)
    preferred = Stat(f"GetPreferredAllocation ({len(c.uuids) * args.split} available)")
    last = Stat("  Allocate of a pod's last container")
    other = Stat("  Allocate of its other containers")
    counts = list(range(1, len(c.uuids) + 1))
    per_batch = len(counts) * args.containers
    batches = 1 + math.ceil(args.allocations / per_batch)  # the first one warms up
    log(f"Allocate: {batches - 1} batches of {len(counts)} pods x {args.containers} containers (+1 warm-up)")
    bind_phases: dict[str, int] = {}
    wait_seen: list[float] = []
    cpu_timed = 0.0
    advertised = [f"{u}-{r}" for u in c.uuids for r in range(args.split)]
    with grpc.insecure_channel(f"unix://{c.socket}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for b in range(batches):
            labels = {"app": "bench-alloc", "batch": str(b)}
            for k in counts:
                c.api.create_scheduled_pod(
                    f"b{b}-g{k}", c.node, pod_gpus(c.uuids, k), args.containers, labels
                )
            started = time.perf_counter()
            for k in counts:
                deadline = time.monotonic() + 10
                while not daemon_knows(stub, c.uuids, k):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the daemon's pod watch did not show pod b{b}-g{k} within 10 s")
                    time.sleep(0.002)
            wait_seen.append(time.perf_counter() - started)
            cpu_at = cpu_seconds(c.daemon.pid) if c.daemon else 0.0
            for k in counts:
                gpus = pod_gpus(c.uuids, k)
                for i in range(args.containers):
                    where = f"pod b{b}-g{k} container c{i}"
                    ask = api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=advertised, allocation_size=k
                            )
                        ]
                    )
                    request = api_pb2.AllocateRequest()
                    try:
                        t0 = time.perf_counter()
                        answer = stub.GetPreferredAllocation(ask, timeout=10)
                        t1 = time.perf_counter()
                        ids = list(answer.container_responses[0].deviceIDs)
                        if [d.rsplit("-", 1)[0] for d in ids] != gpus:
                            preferred.errors += 1
                            log(f"GetPreferredAllocation for {where} was not steered to {gpus}: {ids}")
                        request.container_requests.add(devices_ids=ids)
                        t2 = time.perf_counter()
                        response = stub.Allocate(request, timeout=10)
                        t3 = time.perf_counter()
                    except grpc.RpcError as err:
                        allocate.errors += 1
                        log(f"{where}: {err}")
                        continue
                    if args.pace_ms > 0:  # kubelet creates the container between two Allocates
                        time.sleep(args.pace_ms / 1000)
                    envs = response.container_responses[0].envs
                    if f"CUDA_DEVICE_MEMORY_LIMIT_{k - 1}" not in envs:
                        allocate.errors += 1
                        log(f"Allocate for {where}: unexpected response {envs}")
                    if b > 0:
                        preferred.samples.append(t1 - t0)
                        allocate.samples.append(t3 - t2)
                        (last if i == args.containers - 1 else other).samples.append(t3 - t2)
            if b > 0 and c.daemon:
                cpu_timed += cpu_seconds(c.daemon.pid) - cpu_at
            if b >= 2:
                count_bind_phases(c.api, b - 2, bind_phases)
            if b % 20 == 0:
                log(f"  batch {b}/{batches - 1}: {len(allocate.samples)} calls timed")
        for b in range(max(0, batches - 2), batches):
            count_bind_phases(c.api, b, bind_phases, wait_s=10)
    report.extra["daemon CPU ms per container while the calls ran (RPCs, pod watch, bind-phase writes)"] = (
        round(cpu_timed * 1000 / max(1, len(allocate.samples)), 2)
    )
    report.extra["pods allocated"] = batches * len(counts)
    report.extra["pods with bind-phase=success"] = bind_phases.get("success", 0)
    report.extra["bind -> seen by the daemon's watch, p50 ms (per batch of pods)"] = round(
        statistics.median(wait_seen) * 1000, 2
    )
    report.stats += [allocate, last, other, preferred] if args.containers > 1 else [allocate, preferred]


def miss_phase(c: Cluster, args: argparse.Namespace, report: Report) -> None:
    """Allocate requests that match no pending pod: the time until the daemon's error arrives."""
    unknown = Stat("Allocate matching no pod, none bound here (error after one API read)", goal_ms=100.0)
    foreign = Stat("Allocate matching no pod, a non-HAMi pod bound here (error names it)", goal_ms=100.0)
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-foreign", "namespace": NAMESPACE, "labels": {"app": "bench-miss"}},
        "spec": {
            "nodeName": c.node,
            "containers": [{"name": "c", "image": "cuda:12", "resources": {"limits": {RESOURCE: "1"}}}],
        },
    }
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=[f"{c.uuids[0]}-0"])
    with grpc.insecure_channel(f"unix://{c.socket}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for stat, expected in ((unknown, "no pod bound to node"), (foreign, "default/bench-foreign")):
            if stat is foreign:
                c.api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", plain)
            for n in range(args.misses + 5):
                t0 = time.perf_counter()
                try:
                    stub.Allocate(request, timeout=30)
                except grpc.RpcError as err:
                    elapsed = time.perf_counter() - t0
                    if expected not in (err.details() or ""):
                        stat.errors += 1
                        log(f"miss: unexpected error text: {err.details()}")
                else:
                    stat.errors += 1
                    log("miss: Allocate succeeded for a request no pod explains")
                    continue
                if n >= 5:
                    stat.samples.append(elapsed)
        c.api.delete_pod("bench-foreign", force=True)
    report.stats += [unknown, foreign]


def baseline_phase(
    c: Cluster, calls: int, report: Report, pace_ms: float = 0.0, paced_calls: int = 0
) -> None:
    """A no-op RPC, back to back: what gRPC, the threads and this machine cost without any work; with
    `pace_ms`, also `paced_calls` no-op RPCs paced as the Allocate phase paces its calls (a pause of
    `pace_ms` before each, as before each container's GetPreferredAllocation): the floor of a call that
    comes to an idle daemon."""
    stat = Stat("GetDevicePluginOptions (no-op RPC, baseline)")
    paced = Stat(f"GetDevicePluginOptions (no-op RPC, {pace_ms:g} ms apart: the paced floor)")
    with grpc.insecure_channel(f"unix://{c.socket}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for n in range(calls + 50):
            t0 = time.perf_counter()
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
            if n >= 50:
                stat.samples.append(time.perf_counter() - t0)
        for n in range(paced_calls + 5 if pace_ms > 0 and paced_calls > 0 else 0):
            time.sleep(pace_ms / 1000)
            t0 = time.perf_counter()
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
            if n >= 5:
                paced.samples.append(time.perf_counter() - t0)
    report.stats += [stat, paced] if paced.samples else [stat]


def count_bind_phases(api: Api, batch: int, tally: dict[str, int], wait_s: float = 0.0) -> None:
    """Tally the batch's pods by bind-phase (waiting up to `wait_s` for all to be written), then delete
    them, so that the end-to-end kubelet never sees them."""
    deadline = time.monotonic() + wait_s
    while True:
        pods = api.pods(f"batch={batch},app=bench-alloc")
        phases = [p["metadata"].get("annotations", {}).get(ann.BIND_PHASE, "") for p in pods]
        if all(ph == "success" for ph in phases) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for ph in phases:
        tally[ph] = tally.get(ph, 0) + 1
    for p in pods:
        api.delete_pod(p["metadata"]["name"], force=True)


# --- phase 2: Xid --------------------------------------------------------------------------------------


class StreamWatcher:
    """A direct ListAndWatch client: every message's arrival time and the GPUs it shows unhealthy."""

    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._call = api_pb2_grpc.DevicePluginStub(self._channel).ListAndWatch(api_pb2.Empty())
        self._cond = threading.Condition()
        self.messages: list[tuple[float, frozenset[str]]] = []
        self._thread = threading.Thread(target=self._run, name="bench-law", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for response in self._call:
                now = time.perf_counter()
                bad = frozenset(d.ID.rsplit("-", 1)[0] for d in response.devices if d.health == UNHEALTHY)
                with self._cond:
                    self.messages.append((now, bad))
                    self._cond.notify_all()

    def wait(self, after: float, predicate: Callable[[frozenset[str]], bool], timeout: float) -> float:
        """Arrival time of the first message after `after` that satisfies `predicate`."""
        deadline = time.monotonic() + timeout

        def found() -> float | None:
            return next((t for t, bad in self.messages if t >= after and predicate(bad)), None)

        with self._cond:
            while (t := found()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no such ListAndWatch message")
                self._cond.wait(remaining)
            return t

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(5)
        self._channel.close()


def kubelet_sees_unhealthy(ids: set[str]) -> Callable[[Snapshot], bool]:
    def check(s: Snapshot) -> bool:
        r = s.resource(RESOURCE)
        return r is not None and ids <= r.unhealthy

    return check


def lists(uuid: str, *, unhealthy: bool) -> Callable[[frozenset[str]], bool]:
    """A ListAndWatch message listing `uuid` Unhealthy (or not)."""

    def check(bad: frozenset[str]) -> bool:
        return (uuid in bad) == unhealthy

    return check


def xid_phase(c: Cluster, args: argparse.Namespace, report: Report) -> None:
    assert c.kubelet is not None
    at_client = Stat("Xid -> Unhealthy at a ListAndWatch client", goal_ms=1000.0, goal_on="max")
    at_kubelet = Stat("Xid -> Unhealthy at the kubelet stand-in", goal_ms=1000.0, goal_on="max")
    recovery = Stat(f"recovery -> Healthy again (recovery {args.recovery:g} s)")
    log(f"Xid: {args.xid_rounds} rounds (Xid 79 on one GPU, then recovery)")
    watcher = StreamWatcher(c.socket)
    try:
        watcher.wait(0.0, lambda bad: not bad, 10)
        for i in range(args.xid_rounds):
            uuid = c.uuids[i % len(c.uuids)]
            ids = {f"{uuid}-{r}" for r in range(args.split)}
            event = FakeEvent(id=f"bench-xid-{i}", kind=GPUEventKind.XID, gpu=uuid, xid=79)
            inventory = replace(c.inventory, events=(event,))
            t0 = time.perf_counter()
            write_inventory(c.inventory_path, inventory)
            try:
                c.kubelet.wait_for_devices(kubelet_sees_unhealthy(ids), timeout=10)
                at_kubelet.samples.append(time.perf_counter() - t0)
                at_client.samples.append(watcher.wait(t0, lists(uuid, unhealthy=True), 10) - t0)
                t1 = time.perf_counter()
                healthy_at = watcher.wait(t1, lists(uuid, unhealthy=False), 10 + args.recovery)
                recovery.samples.append(healthy_at - t0)
                c.kubelet.wait_for_devices(all_healthy(len(c.uuids) * args.split), timeout=10)
            except TimeoutError:
                at_client.errors += 1
                log(f"  round {i}: no Unhealthy/Healthy update within 10 s")
    finally:
        watcher.close()
    report.stats += [at_client, at_kubelet, recovery]


# --- phase 3: kubelet restart --------------------------------------------------------------------------


def restart_phase(c: Cluster, args: argparse.Namespace, report: Report) -> None:
    assert c.kubelet is not None
    total = len(c.uuids) * args.split
    from_call = Stat("kubelet restart -> registered, all devices listed", goal_ms=1000.0, goal_on="max")
    from_socket = Stat("  of which after kubelet.sock is back")
    log(f"kubelet restart: {args.restarts} rounds")
    for _ in range(args.restarts):
        snapshot = c.kubelet.snapshot()
        resource = snapshot.resource(RESOURCE)
        before = resource.registrations if resource else 0
        t0 = time.perf_counter()
        c.kubelet.restart()
        t1 = time.perf_counter()
        try:
            c.kubelet.wait_for_devices(all_healthy(total, before), timeout=10)
        except TimeoutError:
            from_call.errors += 1
            log("  the plugin did not register again within 10 s")
            continue
        t2 = time.perf_counter()
        from_call.samples.append(t2 - t0)
        from_socket.samples.append(t2 - t1)
    report.stats += [from_call, from_socket]


# --- phase 4: end to end through the kubelet stand-in --------------------------------------------------


def node_allocatable(api: Api, node: str) -> str | None:
    status = api.call("GET", f"/api/v1/nodes/{node}").get("status") or {}
    value = (status.get("allocatable") or {}).get(RESOURCE)
    return value if isinstance(value, str) else None


def e2e_phase(c: Cluster, args: argparse.Namespace, report: Report) -> None:
    assert c.kubelet is not None
    total = len(c.uuids) * args.split
    log("end to end: swapping in a kubelet stand-in that follows the API server")
    c.kubelet.stop()
    c.kubelet = KubeletRunner(KubeletConfig(c.node, c.kubelet_dir, kubeconfig=c.kubeconfig))
    c.kubelet.start()
    c.kubelet.wait_for_devices(all_healthy(total), timeout=30)
    deadline = time.monotonic() + 20
    while node_allocatable(c.api, c.node) != str(total):
        if time.monotonic() > deadline:
            raise SystemExit("the kubelet stand-in did not write the node's allocatable within 20 s")
        time.sleep(0.02)
    stat = Stat("bind -> admitted by the kubelet stand-in (end to end)")
    log(f"end to end: {args.e2e_pods} pods, one at a time")
    names: list[str] = []
    for i in range(args.e2e_pods):
        k = 1 + i % min(4, len(c.uuids))
        name = f"e2e-{i}-g{k}"
        t0 = time.perf_counter()
        c.api.create_scheduled_pod(name, c.node, pod_gpus(c.uuids, k), 1, {"app": "bench-e2e"})
        result = c.kubelet.wait_for_pod(NAMESPACE, name, timeout=15)
        elapsed = time.perf_counter() - t0
        if not result.admitted:
            stat.errors += 1
            log(f"  pod {name} rejected: {result.message}")
        else:
            stat.samples.append(elapsed)
        names.append(name)
        if len(names) > 2:
            c.api.delete_pod(names.pop(0))
    for name in names:
        c.api.delete_pod(name)
    report.stats.append(stat)


# --- the run -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(args: argparse.Namespace) -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="hbn-", dir="/tmp"))
    api: Api | None = None
    apiserver: subprocess.Popen[bytes] | None = None
    c: Cluster | None = None
    failed = False
    # The daemon watches the directories of the inventory file and of kubelet's sockets, and their
    # parent (tmp): the logs go one level down, or every log line would be an inotify event there.
    (tmp / "logs").mkdir()
    try:
        apiserver, base, kubeconfig = start_apiserver_in(tmp)
        api = Api(base)
        node = "bench-node"
        api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        (tmp / "inv").mkdir()
        (tmp / "hook").mkdir()
        inventory = generate_inventory(args.gpus, seed=node)
        inventory_path = tmp / "inv" / "gpus.yaml"
        write_inventory(inventory_path, inventory)
        c = Cluster(tmp, node, inventory_path, inventory, tmp / "kl", kubeconfig, api, apiserver)
        yield c
    except BaseException:
        failed = True
        raise
    finally:
        if c is not None and c.kubelet is not None:
            c.kubelet.stop()
        if c is not None:
            stop_process(c.daemon, "hami-node")
        stop_process(apiserver, "apiserver")
        if api is not None:
            api.close()
        if failed:
            for name in ("node.log", "apiserver.log"):
                with contextlib.suppress(OSError):
                    tail = (tmp / "logs" / name).read_text(errors="replace").splitlines()[-25:]
                    log(f"--- last lines of {name} ---\n" + "\n".join(tail))
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace) -> Report:
    report = Report()
    with cluster(args) as c:
        total = len(c.uuids) * args.split
        c.kubelet = KubeletRunner(KubeletConfig(c.node, c.kubelet_dir))
        c.kubelet.start()
        log(f"starting hami-node ({len(c.uuids)} fake GPUs x split {args.split}) ...")
        t0 = time.perf_counter()
        extra = ["--kube-api-qps", str(args.kube_api_qps)] if args.kube_api_qps is not None else []
        extra += args.daemon_arg
        c.daemon = start_daemon(c, args.split, args.recovery, args.log_level, extra)
        try:
            c.kubelet.wait_for_devices(all_healthy(total), timeout=60)
        except TimeoutError:
            raise SystemExit("hami-node did not register with its devices within 60 s") from None
        report.extra["start -> registered with all devices, ms"] = round((time.perf_counter() - t0) * 1000, 1)

        def reported() -> bool:
            node = c.api.call("GET", f"/api/v1/nodes/{c.node}")
            return ann.NODE_REGISTER in (node["metadata"].get("annotations") or {})

        wait_until("the daemon's node inventory annotation", reported, 60, c.daemon)
        report.rss_mb["after start-up"] = status_mb(c.daemon.pid, "VmRSS")
        machine_before, wall_before = machine_busy_seconds(), time.monotonic()
        ours_before = cpu_seconds(os.getpid()) + cpu_seconds(c.apiserver.pid) + cpu_seconds(c.daemon.pid)
        if args.allocations > 0:
            paced = min(args.allocations, args.paced_floor)
            log(f"baseline: {args.allocations} no-op RPCs back to back, {paced} {args.pace_ms:g} ms apart")
            baseline_phase(c, args.allocations, report, args.pace_ms, paced)
            with py_spy(
                c.daemon.pid, args.py_spy, "the daemon during the Allocate phase", rate=1000, gil=True
            ):
                allocate_phase(c, args, report)
            report.rss_mb["after the Allocate phase"] = status_mb(c.daemon.pid, "VmRSS")
        if args.misses > 0:
            log(f"misses: 2 x {args.misses} Allocate calls no pod explains")
            miss_phase(c, args, report)
        if args.xid_rounds > 0:
            xid_phase(c, args, report)
        if args.restarts > 0:
            restart_phase(c, args, report)
        if args.e2e_pods > 0:
            e2e_phase(c, args, report)
        ours = cpu_seconds(os.getpid()) + cpu_seconds(c.apiserver.pid) + cpu_seconds(c.daemon.pid)
        others = (machine_busy_seconds() - machine_before) - (ours - ours_before)
        wall = time.monotonic() - wall_before
        report.extra["CPU used by other processes during the phases, % of one core"] = round(
            max(0.0, others) * 100 / wall, 1
        )
        report.rss_mb["at the end"] = status_mb(c.daemon.pid, "VmRSS")
        report.rss_mb["peak (VmHWM)"] = status_mb(c.daemon.pid, "VmHWM")
        if c.daemon.poll() is not None:
            raise SystemExit(f"hami-node exited with {c.daemon.returncode} during the run")
    return report


def print_report(report: Report, args: argparse.Namespace) -> None:
    print(
        f"\nhami-node (fake backend, {args.gpus} GPUs x split {args.split}) on {os.cpu_count()} cores; "
        "the API server, the kubelet stand-in and the clients share the machine\n"
    )
    header = ("measure", "samples", "errors", "p50 ms", "p99 ms", "max ms", "goal", "met")
    rows = [
        (d["name"], d["count"], d["errors"], f"{d['p50_ms']:.2f}", f"{d['p99_ms']:.2f}", f"{d['max_ms']:.2f}",
         d["goal"] or "", "" if d["met"] is None else ("yes" if d["met"] else "**no**"))
        for d in (s.summary() for s in report.stats)
    ]  # fmt: skip
    print("\n".join(markdown_table(header, "lrrrrrll", rows)))
    print()
    memory = [
        (
            name if "VmHWM" in name else f"VmRSS {name}{' (goal <= 100)' if name != 'peak (VmHWM)' else ''}",
            f"{mb:.1f}",
        )
        for name, mb in report.rss_mb.items()
    ]
    print("\n".join(markdown_table(("daemon memory", "MB"), "lr", memory)))
    print()
    print(
        "\n".join(markdown_table(("other", "value"), "lr", ((k, f"{v:g}") for k, v in report.extra.items())))
    )


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--allocations", type=int, default=2000, help="Allocate calls to time (0: skip)")
    parser.add_argument("--containers", type=int, default=2, help="GPU containers per pod")
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=10.0,
        help="pause after each container's Allocate, as kubelet creates the container before the next "
        "admission (0: back to back, which saturates the daemon and measures queueing)",
    )
    parser.add_argument(
        "--paced-floor",
        type=int,
        default=300,
        help="no-op RPCs paced like the Allocate calls (--pace-ms apart): the floor of a call to an idle "
        "daemon (0: skip)",
    )
    parser.add_argument("--misses", type=int, default=200, help="Allocate calls no pod explains (0: skip)")
    parser.add_argument("--xid-rounds", type=int, default=20, help="Xid rounds (0: skip)")
    parser.add_argument("--restarts", type=int, default=20, help="kubelet restarts (0: skip)")
    parser.add_argument("--e2e-pods", type=int, default=40, help="pods admitted end to end (0: skip)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs (1..8 pods per batch)")
    parser.add_argument("--split", type=int, default=10, help="virtual devices per GPU")
    parser.add_argument("--recovery", type=float, default=0.5, help="the daemon's --health-recovery-seconds")
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more hami-node argument, repeated for each (--daemon-arg=--log-level --daemon-arg=debug)",
    )
    add_daemon_options(
        parser,
        qps_help="the daemon's --kube-api-qps (default: the daemon's, 50; the Allocate phase makes ~40 "
        "pods/s on one node, two API writes each, so its bind-phase writes queue behind that limit; 0: none)",
        py_spy_help="sample the daemon with py-spy during the Allocate phase",
    )
    args = parser.parse_args()
    if not 1 <= args.gpus <= 8 or args.split < 1 or args.containers < 1:
        parser.error("--gpus must be 1..8, --split and --containers at least 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    started = time.monotonic()
    report = run(args)
    log(f"done in {time.monotonic() - started:.0f} s")
    print_report(report, args)
    write_json(
        args.json,
        {
            "stats": [s.data() for s in report.stats],
            "rss_mb": report.rss_mb,
            "extra": report.extra,
            "args": {k: str(v) for k, v in vars(args).items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
