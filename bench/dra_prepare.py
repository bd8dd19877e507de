"""The node daemon in DRA mode (`hami-node --mode dra`) as its own process with the fake GPU backend:
NodePrepareResources and NodeUnprepareResources latency over the plugin's real Unix socket, beside a
floor from the same run, and the daemon's memory and CPU.

Set-up: `hami-sim apiserver` as its own process (the local API server, resource.k8s.io/v1), one Node,
`hami-node --mode dra --gpu-backend fake` as its own process (8 fake A100s by default), laid out as the
local cluster lays out a DRA node (`<dir>/k/plugins_registry`, `<dir>/k/plugins`, the CDI directory).
The bench waits for the node's ResourceSlice, then plays kubelet with plain gRPC clients (the generated
stubs in `hami_node/dra/api`), one request per pod as kubelet's DRA manager sends them.

Claims are made as the local cluster makes them for a translated GPU pod, untimed, `--live` at a time (80
by default: a node of 8 GPUs split 10 full): a pod bound to the node asking its claim through a
ResourceClaimTemplate, the claim generated for it (the Pod its controller owner), the pod's
`status.resourceClaimStatuses`, and the claim's allocation as the scheduler writes it (`status.allocation`
with one result on one GPU, a share ID and `consumedCapacity` of 1000..4000 MiB and 10..30 cores,
`reservedFor` the pod). Then, timed, per claim, `--pace-ms` apart (kubelet creates the pod's containers
between two pods' Prepares):

1. floor: GetInfo on the registration socket (the same process and gRPC server code, no work in the
   handler), back to back;
2. NodePrepareResources of the new claim: the daemon reads the claim from the API server and takes its
   pod from its watch of the node's pods (the pods are made before the round's first Prepare, as kubelet
   sees a pod before it prepares its claims; with `--unwatched-pods` they are bound to another node, so
   the watch never shows them and the daemon reads each pod, as before it had the watch), then, under its
   lock, the checkpoint, the claim's CDI spec (written atomically) and directory, and the checkpoint
   again; the API server's count of pod GETs per new claim is reported;
3. NodePrepareResources of the same claim again (kubelet repeats it after its own restart): the claim's
   read, the answer from the checkpoint, the spec checked to be there;
4. NodeUnprepareResources: spec, directory and checkpoint entry removed (no API read).

With `--held N`, N more claims are prepared before the timed phases (untimed, 100 at a time, each
in its own request) and stay prepared throughout: every timed call then finds N to N + `--live` claims
in the daemon's checkpoint, which shows how a call's cost grows with the claims prepared on the node
(`--held 0` against `--held 720`: 80 against 800).

With `--mig-gpus M`, the node's GPUs are A100-SXM4-40GBs and the first M are in MIG mode (no MIG device
at start): hami-node publishes their partitions (KEP-4815 counters), and the same three phases run again
for claims of one `1g.5gb` partition each (7 per MIG GPU live at a time, one per placement), so that
Prepare creates the MIG device in the fake backend (GPU instance, compute instance, its layout file
written) and Unprepare destroys it: "MIG partition" rows beside the GPU-slice rows.

Every answer is checked (no error; CDI IDs of `k8s.gpu.hami.io/claim`; the spec file there after Prepare
and gone after Unprepare). The daemon's VmRSS is read after start-up and at the end (VmHWM too); its CPU
per call and the CPU of other processes on the machine are reported with the load average. Progress goes
to stderr, a markdown table to stdout. Usage:

    python bench/dra_prepare.py [--claims 1000] [--live 80] [--held 0] [--pace-ms 10] [--gpus 8]
                                [--mig-gpus 0] [--unwatched-pods] [--kube-api-qps Q] [--json FILE]
                                [--py-spy FILE] [--keep]
    python bench/dra_prepare.py --in-process [--claims 1000] [--live 80] [--held 720] [--gpus 8]

`--in-process` times the daemon's own work alone: the real `ClaimPreparer` (the class the daemon
serves, with its files: the lock, the journal, the CDI specs and directories in a temporary directory)
called in this process, back to back, with the same claims and pods served from memory (no gRPC, no
API server); wall and CPU time per call, first with no claim held, then with `--held` claims held
prepared (720 unless told: 80 against 800 prepared claims).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

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
    rss_mib,
    start_apiserver,
    status_kib,
    write_json,
)

from hami_api import dra
from hami_node.cdi import claim_spec_file_name
from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.gpu.inventory import generate_inventory, write_inventory

NODE = "bench-dra-node"
OTHER_NODE = "bench-other-node"
"""Where `--unwatched-pods` binds the claims' pods: outside the daemon's pod watch (spec.nodeName)."""
NAMESPACE = "default"
GROUP = "/apis/resource.k8s.io/v1"
CDI_KIND = "k8s.gpu.hami.io/claim"


@dataclass
class Stat(benchlib.Stat):
    cpu_s: float = 0.0
    """The daemon's CPU seconds while these calls ran (pauses included)."""

    def summary(self) -> dict[str, Any]:
        s = self.samples
        cpu = round(self.cpu_s * 1000 / len(s), 3) if s else math.nan
        return super().summary() | {"daemon_cpu_ms_per_call": cpu}


@dataclass
class Report:
    stats: list[Stat] = field(default_factory=list)
    rss_mib: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float | str] = field(default_factory=dict)


class Api:
    """Plain HTTP to the API server (the load generator stays cheap)."""

    def __init__(self, base: str) -> None:
        self.pool = urllib3.PoolManager(maxsize=4)
        self.base = base

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        ok: Sequence[int] = (200, 201),
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        r = self.pool.request(
            method, self.base + path, body=data, headers={"Content-Type": content_type}, timeout=10.0
        )
        if r.status not in ok:
            raise SystemExit(f"{method} {path}: HTTP {r.status}: {r.data[:300]!r}")
        return json.loads(r.data) if r.data else None

    def merge_patch(self, path: str, body: object) -> Any:
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")


@dataclass
class Claim:
    name: str
    uid: str
    pod: str

    def ref(self) -> v1_pb2.Claim:
        return v1_pb2.Claim(namespace=NAMESPACE, name=self.name, uid=self.uid)


def pod_body(pod_name: str, node: str = NODE) -> dict[str, Any]:
    """A pod bound to `node` asking one claim from a template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": NAMESPACE, "labels": {"app": "bench-dra"}},
        "spec": {
            "nodeName": node,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bench-gpu"}],
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def claim_body(pod_name: str, pod_uid: str) -> dict[str, Any]:
    """The claim the claim controller generates for the pod (the Pod its controller owner)."""
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod_name}-gpu-",
            "namespace": NAMESPACE,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]}
        },
    }


def allocated_status(
    device: str, rng: random.Random, pod_name: str, pod_uid: str, mig: bool
) -> dict[str, Any]:
    """The claim's status as the scheduler writes it: one result on `device`, reserved for the pod."""
    result: dict[str, Any] = {"request": "gpu", "driver": dra.DRIVER, "pool": NODE, "device": device}
    if not mig:  # a MIG partition is exclusive: no share, no consumed capacity
        result["shareID"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        result["consumedCapacity"] = {
            dra.CAPACITY_MEMORY: f"{rng.randrange(1000, 4001, 100)}Mi",
            dra.CAPACITY_CORES: str(rng.randrange(10, 31, 5)),
        }
    return {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}],
    }


def make_claim(
    api: Api, i: int, device: str, rng: random.Random, *, mig: bool = False, pod_node: str = NODE
) -> Claim:
    """A pod bound to `pod_node` with a claim from a template, allocated on the node and reserved as the
    local cluster does it (claim controller, then the scheduler's PreBind). Untimed."""
    pod_name = f"p{i:05d}"
    created = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(pod_name, pod_node))
    pod_uid = created["metadata"]["uid"]
    made = api.call("POST", f"{GROUP}/namespaces/{NAMESPACE}/resourceclaims", claim_body(pod_name, pod_uid))
    name, uid = made["metadata"]["name"], made["metadata"]["uid"]
    api.merge_patch(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}/status",
        {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}]}},
    )
    status = allocated_status(device, rng, pod_name, pod_uid, mig)
    api.merge_patch(f"{GROUP}/namespaces/{NAMESPACE}/resourceclaims/{name}/status", {"status": status})
    return Claim(name, uid, pod_name)


def delete_claims(api: Api, claims: Sequence[Claim]) -> None:
    for c in claims:
        api.call("DELETE", f"{GROUP}/namespaces/{NAMESPACE}/resourceclaims/{c.name}", ok=(200, 202, 404))
        # No kubelet stand-in runs the node (the bench plays kubelet): deleted at once, grace 0.
        force = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{c.pod}", force, ok=(200, 202, 404))


# --- the daemon -----------------------------------------------------------------------------------------


@dataclass
class Node:
    tmp: Path
    api: Api
    kubeconfig: Path
    apiserver_pid: int
    daemon: subprocess.Popen[bytes] | None = None

    @property
    def kubelet_dir(self) -> Path:
        return self.tmp / "k"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{dra.DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_dir / "plugins" / dra.DRIVER / "dra.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.tmp / "cdi"


MIG_MODEL = "NVIDIA A100-SXM4-40GB"


def start_daemon(
    node: Node, gpus: int, log_level: str, extra: Sequence[str], mig_gpus: int = 0
) -> subprocess.Popen[bytes]:
    inventory = node.tmp / "inv" / "gpus.yaml"
    if mig_gpus:
        made = generate_inventory(gpus, seed=NODE, model=MIG_MODEL, memory_mib=40960)
        gpu_list = tuple(replace(g, mig_enabled=i < mig_gpus) for i, g in enumerate(made.gpus))
        write_inventory(inventory, replace(made, gpus=gpu_list))
    else:
        write_inventory(inventory, generate_inventory(gpus, seed=NODE))
    command = [
        sys.executable, "-m", "hami_node.main",
        "--node-name", NODE,
        "--mode", "dra",
        "--kubeconfig", str(node.kubeconfig),
        "--gpu-backend", "fake",
        "--fake-inventory", str(inventory),
        "--hook-path", str(node.tmp / "hook"),
        "--kubelet-dir", str(node.kubelet_dir),
        "--kubelet-registry-dir", str(node.kubelet_dir / "plugins_registry"),
        "--kubelet-plugins-dir", str(node.kubelet_dir / "plugins"),
        "--cdi-spec-dir", str(node.cdi_dir),
        "--log-level", log_level,
        *extra,
    ]  # fmt: skip
    logfile = open(node.tmp / "logs" / "node.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "NODE_NAME", "KUBECONFIG"))}
    return subprocess.Popen(command, stdout=logfile, stderr=subprocess.STDOUT, env=env)


def wait_until(what: str, check: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes]) -> None:
    benchlib.wait_until(what, check, timeout, proc, name="hami-node", poll_s=0.02)


def slice_devices(api: Api) -> list[str]:
    selector = quote(f"spec.nodeName={NODE},spec.driver={dra.DRIVER}")
    items = api.call("GET", f"{GROUP}/resourceslices?fieldSelector={selector}")["items"]
    return [d["name"] for s in items for d in s["spec"].get("devices", ())]


def make_cdi_dir(tmp: Path, tmpfs: bool) -> None:
    """`<tmp>/cdi`: a directory there, or with `tmpfs` a link to one in /dev/shm (a node's /var/run/cdi
    is on tmpfs on most distributions, where the specs' fsyncs cost nothing)."""
    if tmpfs:
        (tmp / "cdi").symlink_to(tempfile.mkdtemp(prefix="hbd-cdi-", dir="/dev/shm"))
    else:
        (tmp / "cdi").mkdir()


def remove_cdi_dir(tmp: Path) -> None:
    if (tmp / "cdi").is_symlink():
        shutil.rmtree((tmp / "cdi").resolve(), ignore_errors=True)


@contextlib.contextmanager
def node_under_test(args: argparse.Namespace) -> Iterator[Node]:
    tmp = Path(tempfile.mkdtemp(prefix="hbd-", dir="/tmp"))  # short: Unix socket paths
    for sub in ("logs", "inv", "hook", "k"):
        (tmp / sub).mkdir()
    make_cdi_dir(tmp, args.cdi_tmpfs)
    apiserver: subprocess.Popen[bytes] | None = None
    node: Node | None = None
    failed = False
    try:
        kubeconfig = tmp / "kubeconfig"
        apiserver, base = start_apiserver(
            kubeconfig, tmp / "logs" / "apiserver.log", "--log-level", "WARNING"
        )
        api = Api(base)
        api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        node = Node(tmp, api, kubeconfig, apiserver.pid)
        yield node
    except BaseException:
        failed = True
        raise
    finally:
        for proc, name in ((node.daemon if node else None, "hami-node"), (apiserver, "apiserver")):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    log(f"{name} did not stop on SIGTERM; killing it")
                    proc.kill()
                    proc.wait(timeout=5)
        if failed:
            with contextlib.suppress(OSError):
                tail = (tmp / "logs" / "node.log").read_text(errors="replace").splitlines()[-25:]
                log("--- last lines of node.log ---\n" + "\n".join(tail))
        if args.keep:
            log(f"kept {tmp}")
        else:
            remove_cdi_dir(tmp)
            shutil.rmtree(tmp, ignore_errors=True)


# --- the phases -----------------------------------------------------------------------------------------


def check_prepared(node: Node, claim: Claim, answer: Any, stat: Stat) -> None:
    got = answer.claims.get(claim.uid)
    ids = [i for d in got.devices for i in d.cdi_device_ids] if got is not None else []
    if got is None or got.error or not ids or not all(i.startswith(CDI_KIND + "=") for i in ids):
        stat.errors += 1
        log(f"Prepare of {claim.name}: unexpected answer {answer}")
    elif not (node.cdi_dir / claim_spec_file_name(claim.uid)).exists():
        stat.errors += 1
        log(f"Prepare of {claim.name}: no CDI spec written")


def timed_calls(
    stat: Stat, claims: Sequence[Claim], call: Callable[[Claim], Any], check: Callable[[Claim, Any], None],
    *, pace_s: float, daemon_pid: int,
) -> None:  # fmt: skip
    cpu_before = cpu_seconds(daemon_pid)
    for claim in claims:
        t0 = time.perf_counter()
        try:
            answer = call(claim)
        except grpc.RpcError as err:
            stat.errors += 1
            log(f"{stat.name}, {claim.name}: {err}")
            continue
        stat.samples.append(time.perf_counter() - t0)
        check(claim, answer)
        if pace_s > 0:
            time.sleep(pace_s)
    stat.cpu_s += cpu_seconds(daemon_pid) - cpu_before


def floor_phase(node: Node, calls: int, report: Report) -> None:
    stat = Stat("floor: GetInfo on the registration socket (no-op RPC), back to back")
    assert node.daemon is not None
    cpu_before = cpu_seconds(node.daemon.pid)
    with grpc.insecure_channel(f"unix://{node.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        for n in range(calls + 50):
            t0 = time.perf_counter()
            info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=10)
            if n >= 50:
                stat.samples.append(time.perf_counter() - t0)
            if info.name != dra.DRIVER:
                stat.errors += 1
    stat.cpu_s = cpu_seconds(node.daemon.pid) - cpu_before
    report.stats.append(stat)


def hold_claims(node: Node, count: int, devices: Sequence[str], report: Report) -> None:
    """Prepare `count` claims that stay prepared (untimed; pods p90000...), checking each answer."""
    rng = random.Random(count)
    stat = Stat("held")
    with grpc.insecure_channel(f"unix://{node.dra_socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        for start in range(0, count, 100):
            claims = [
                make_claim(node.api, 90000 + i, devices[i % len(devices)], rng)
                for i in range(start, min(count, start + 100))
            ]
            for claim in claims:
                request = v1_pb2.NodePrepareResourcesRequest(claims=[claim.ref()])
                check_prepared(node, claim, stub.NodePrepareResources(request, timeout=45), stat)
            log(f"  {start + len(claims)}/{count} claims held prepared")
    if stat.errors:
        raise SystemExit(f"{stat.errors} of the held claims were not prepared")
    report.extra["claims held prepared during the phases"] = count


def prepare_phases(
    node: Node, args: argparse.Namespace, report: Report, devices: Sequence[str], *, mig: bool = False
) -> None:
    """The three phases over `devices` (GPU slices, or with `mig` 1g.5gb partitions: `live` is then one
    claim per partition, so that no two live claims want the same instance)."""
    assert node.daemon is not None
    pid = node.daemon.pid
    pace = args.pace_ms / 1000
    paced = f"calls {args.pace_ms:g} ms apart" if pace > 0 else "back to back"
    what = "MIG partition 1g.5gb, " if mig else ""
    pod_node = OTHER_NODE if args.unwatched_pods else NODE
    where = "its pod bound elsewhere, not in the watch" if args.unwatched_pods else "its pod bound here"
    prepare = Stat(f"NodePrepareResources, a new claim ({what}{where}, {paced})")
    again = Stat(f"NodePrepareResources, the same claim again ({what}{paced})")
    unprepare = Stat(f"NodeUnprepareResources ({what}{paced})")
    rng = random.Random(args.claims)
    live = len(devices) if mig else args.live
    rounds = 1 + math.ceil(args.claims / live)  # the first round warms up
    log(
        f"{rounds - 1} rounds of {live} claims (+1 warm-up), {len(devices)} {'partitions' if mig else 'GPUs'}"
    )
    made = 0
    pod_gets_0 = pod_gets(node.api)
    with grpc.insecure_channel(f"unix://{node.dra_socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)

        def do_prepare(c: Claim) -> Any:
            return stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=[c.ref()]), timeout=45)

        def do_unprepare(c: Claim) -> Any:
            return stub.NodeUnprepareResources(
                v1_pb2.NodeUnprepareResourcesRequest(claims=[c.ref()]), timeout=45
            )

        def unprepared(c: Claim, answer: Any) -> None:
            got = answer.claims.get(c.uid)
            if got is None or got.error or (node.cdi_dir / claim_spec_file_name(c.uid)).exists():
                unprepare.errors += 1
                log(f"Unprepare of {c.name}: unexpected answer {answer}")

        for r in range(rounds):
            claims = [
                make_claim(
                    node.api, made + i, devices[(made + i) % len(devices)], rng, mig=mig, pod_node=pod_node
                )
                for i in range(live)
            ]
            made += live
            stats = (
                (prepare, again, unprepare) if r > 0 else (Stat("warm-up"), Stat("warm-up"), Stat("warm-up"))
            )
            for stat in stats[:2]:
                timed_calls(
                    stat,
                    claims,
                    do_prepare,
                    lambda c, a, s=stat: check_prepared(node, c, a, s),
                    pace_s=pace,
                    daemon_pid=pid,
                )
            timed_calls(stats[2], claims, do_unprepare, unprepared, pace_s=pace, daemon_pid=pid)
            delete_claims(node.api, claims)
            if r % 5 == 0:
                log(f"  round {r}/{rounds - 1}: {len(prepare.samples)} Prepares timed")
    report.stats += [prepare, again, unprepare]
    key = "MIG claims" if mig else "claims"
    report.extra[f"{key} prepared and unprepared (warm-up included)"] = made
    report.extra[f"pod GETs per new claim ({key}; the API server's count)"] = round(
        (pod_gets(node.api) - pod_gets_0) / made, 3
    )


def pod_gets(api: Api) -> int:
    """GETs of single pods the API server has answered (only the daemon reads pods one by one here)."""
    counters = api.call("GET", "/hami-sim/counters")["counters"]
    return sum(
        c["count"] for c in counters if (c["verb"], c["resource"], c["subresource"]) == ("get", "pods", "")
    )


class MemorySource:
    """Claims and pods by name, as the API server would answer (`prepare.ClaimSource`)."""

    def __init__(self) -> None:
        self.claims: dict[str, Any] = {}
        self.pods: dict[str, Any] = {}

    def get_resource_claim(self, namespace: str, name: str) -> Any:
        return self.claims[name]

    def get_pod(self, namespace: str, name: str) -> Any:
        return self.pods[name]

    def add(self, i: int, device: str, rng: random.Random) -> Claim:
        pod_name, pod_uid = f"p{i:05d}", str(uuid.UUID(int=rng.getrandbits(128), version=4))
        name, uid = f"{pod_name}-gpu-x", str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pod = pod_body(pod_name)
        pod["metadata"]["uid"] = pod_uid
        pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}]}
        claim = claim_body(pod_name, pod_uid)
        claim["metadata"] |= {"name": name, "uid": uid}
        claim["status"] = allocated_status(device, rng, pod_name, pod_uid, False)
        self.pods[pod_name], self.claims[name] = pod, claim
        return Claim(name, uid, pod_name)


def in_process(args: argparse.Namespace) -> Report:
    """The `--in-process` mode (the module docstring): two preparers, each with its own directories, one
    with no claim held and one with `--held`, timed in alternate rounds so that the machine's load
    weighs on both alike."""
    from hami_api.dra import device_name
    from hami_node.config import load_config
    from hami_node.devices import GPUStatus
    from hami_node.dra.claims import ClaimRef
    from hami_node.dra.prepare import ClaimPreparer
    from hami_node.gpu.backend import PhysicalGPU

    report = Report()
    gpus = tuple(
        GPUStatus(
            PhysicalGPU(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81920, i, 0, f"00000000:{i + 1:02x}:00.0")
        )
        for i in range(args.gpus)
    )
    devices = [device_name(i) for i in range(args.gpus)]
    source = MemorySource()
    rng = random.Random(args.claims)
    made = 0
    tmps: list[Path] = []

    def ref(c: Claim) -> ClaimRef:
        return ClaimRef(NAMESPACE, c.name, c.uid)

    def new_claims(count: int) -> list[Claim]:
        nonlocal made
        out = [source.add(made + i, devices[(made + i) % len(devices)], rng) for i in range(count)]
        made += count
        return out

    def prepared(preparer: ClaimPreparer, claim: Claim) -> bool:
        return preparer.prepare([ref(claim)])[claim.uid].claim is not None

    def unprepared(preparer: ClaimPreparer, claim: Claim) -> bool:
        return preparer.unprepare([ref(claim)])[claim.uid] == ""

    def timed(stat: Stat, claims: Sequence[Claim], call: Callable[[Claim], bool]) -> None:
        cpu = time.process_time()
        for claim in claims:
            t0 = time.perf_counter()
            ok = call(claim)
            stat.samples.append(time.perf_counter() - t0)
            stat.errors += 0 if ok else 1
        stat.cpu_s += time.process_time() - cpu

    try:
        levels: list[tuple[ClaimPreparer, tuple[Stat, Stat, Stat]]] = []
        for level in sorted({0, args.held}):
            tmp = Path(tempfile.mkdtemp(prefix="hbd-", dir="/tmp"))
            tmps.append(tmp)
            make_cdi_dir(tmp, args.cdi_tmpfs)
            config = load_config(
                [
                    "--node-name", NODE, "--mode", "dra",
                    "--kubelet-plugins-dir", str(tmp / "plugins"),
                    "--cdi-spec-dir", str(tmp / "cdi"),
                    "--hook-path", str(tmp / "hook"),
                ],
                {},
                lambda _: "",
            )  # fmt: skip
            preparer = ClaimPreparer(config, lambda: gpus, source, common_nodes=lambda: ("/dev/nvidiactl",))
            preparer.start()
            for claim in new_claims(level):
                if preparer.prepare([ref(claim)])[claim.uid].claim is None:
                    raise SystemExit(f"held claim {claim.name} was not prepared")
            stats = (
                Stat(f"in-process, {level} claims held: Prepare, a new claim"),
                Stat(f"in-process, {level} claims held: Prepare, the same claim again"),
                Stat(f"in-process, {level} claims held: Unprepare"),
            )
            levels.append((preparer, stats))
        rounds = 1 + math.ceil(args.claims / args.live)
        for r in range(rounds):
            for preparer, timed_stats in levels:
                claims = new_claims(args.live)
                stats = timed_stats if r else (Stat("warm-up"), Stat("warm-up"), Stat("warm-up"))
                for stat in stats[:2]:
                    timed(stat, claims, functools.partial(prepared, preparer))
                timed(stats[2], claims, functools.partial(unprepared, preparer))
            if r % 5 == 0:
                log(f"  round {r}/{rounds - 1}")
        for preparer, timed_stats in levels:
            report.stats += timed_stats
            getattr(preparer, "close", lambda: None)()  # the preparer before the journal had no close
        report.extra["claims prepared (held, warm-up and timed)"] = made
    finally:
        for tmp in tmps:
            remove_cdi_dir(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def run(args: argparse.Namespace) -> Report:
    report = Report()
    with node_under_test(args) as node:
        log(f"starting hami-node --mode dra ({args.gpus} fake GPUs)")
        t0 = time.perf_counter()
        extra = ["--kube-api-qps", str(args.kube_api_qps)] if args.kube_api_qps is not None else []
        node.daemon = start_daemon(node, args.gpus, args.log_level, extra, args.mig_gpus)
        wait_until("the DRA socket", node.dra_socket.exists, 60, node.daemon)
        devices: list[str] = []
        partitions: list[str] = []

        def published() -> bool:
            every = slice_devices(node.api)
            devices[:] = [d for d in every if d.startswith("hami-gpu-")]
            partitions[:] = [d for d in every if "-mig-1g5gb-19-" in d]  # 7 placements per MIG GPU
            return len(devices) == args.gpus - args.mig_gpus and len(partitions) == 7 * args.mig_gpus

        wait_until("the node's ResourceSlice", published, 60, node.daemon)
        report.extra["start -> slice published, ms"] = round((time.perf_counter() - t0) * 1000, 1)
        report.rss_mib["after start-up (slice published)"] = rss_mib(node.daemon.pid)
        report.extra["1-min load average before"] = round(os.getloadavg()[0], 2)
        machine_0, wall_0 = machine_busy_seconds(), time.monotonic()
        ours_0 = own_cpu(node)
        floor_phase(node, args.floor_calls, report)
        if args.held and devices:
            hold_claims(node, args.held, devices, report)
        with py_spy(node.daemon.pid, args.py_spy, "the daemon during the Prepare phases"):
            if devices:
                prepare_phases(node, args, report, devices)
            if partitions:
                prepare_phases(node, args, report, partitions, mig=True)
        wall = time.monotonic() - wall_0
        ours = own_cpu(node)
        others = (machine_busy_seconds() - machine_0) - (sum(ours.values()) - sum(ours_0.values()))
        report.extra["CPU of other processes during the phases, % of one core"] = round(
            max(0.0, others) * 100 / wall, 1
        )
        report.extra["bench process CPU during the phases, % of one core"] = round(
            (ours["bench"] - ours_0["bench"]) * 100 / wall, 1
        )
        report.extra["API server CPU during the phases, % of one core"] = round(
            (ours["apiserver"] - ours_0["apiserver"]) * 100 / wall, 1
        )
        report.extra["1-min load average after"] = round(os.getloadavg()[0], 2)
        report.rss_mib["at the end"] = rss_mib(node.daemon.pid)
        report.rss_mib["peak (VmHWM)"] = vm_hwm_mib(node.daemon.pid)
        if node.daemon.poll() is not None:
            raise SystemExit(f"hami-node exited with {node.daemon.returncode} during the run")
    return report


def own_cpu(node: Node) -> dict[str, float]:
    """CPU seconds of the processes of this bench: itself, the API server and the daemon."""
    assert node.daemon is not None
    return {
        "bench": cpu_seconds(os.getpid()),
        "apiserver": cpu_seconds(node.apiserver_pid),
        "daemon": cpu_seconds(node.daemon.pid),
    }


def vm_hwm_mib(pid: int) -> float:
    kib = status_kib(pid, "VmHWM")
    return math.nan if kib is None else kib / 1024


def print_report(report: Report, args: argparse.Namespace) -> None:
    if args.in_process:
        print(
            f"\nhami_node.dra.prepare.ClaimPreparer in this process ({args.gpus} GPUs, claims and pods from "
            f"memory, calls back to back), {args.live} claims a round, on {os.cpu_count()} cores\n"
        )
        rows = [
            (d["name"], d["count"], d["errors"], *(f"{d[k]:.3f}" for k in ("p50_ms", "p99_ms", "mean_ms")),
             f"{d['daemon_cpu_ms_per_call']:.3f}")
            for d in (s.summary() for s in report.stats)
        ]  # fmt: skip
        columns = ("measure", "calls", "errors", "p50 ms", "p99 ms", "mean ms", "CPU ms per call")
        print("\n".join(markdown_table(columns, "lrrrrrr", rows)))
        print()
        print("\n".join(markdown_table(("other", "value"), "lr", report.extra.items())))
        return
    print(
        f"\nhami-node --mode dra (fake backend, {args.gpus} GPUs, {args.mig_gpus} in MIG mode), {args.live} "
        "GPU-slice claims (one per 1g.5gb partition for MIG) prepared at a time, "
        f"on {os.cpu_count()} cores; the API server and this client share the machine\n"
    )
    header = ("measure", "calls", "errors", "p50 ms", "p99 ms", "max ms", "mean ms", "daemon CPU ms per call")
    keys = ("p50_ms", "p99_ms", "max_ms", "mean_ms", "daemon_cpu_ms_per_call")
    rows = [
        (d["name"], d["count"], d["errors"], *(f"{d[k]:.2f}" for k in keys))
        for d in (s.summary() for s in report.stats)
    ]
    print("\n".join(markdown_table(header, "lrrrrrrr", rows)))
    print()
    memory = (
        (f"{'VmRSS ' if 'VmHWM' not in name else ''}{name}", f"{mib:.1f}")
        for name, mib in report.rss_mib.items()
    )
    print("\n".join(markdown_table(("daemon memory", "MiB"), "lr", memory)))
    print()
    print("\n".join(markdown_table(("other", "value"), "lr", report.extra.items())))


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument(
        "--claims", type=int, default=1000, help="claims timed (each prepared twice, unprepared)"
    )
    parser.add_argument("--live", type=int, default=80, help="claims prepared at a time (a round)")
    parser.add_argument(
        "--held",
        type=int,
        help="claims prepared before the phases and kept prepared (untimed; default 0, --in-process 720)",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="time the daemon's ClaimPreparer alone, in this process"
    )
    parser.add_argument(
        "--cdi-tmpfs",
        action="store_true",
        help="CDI specs in /dev/shm (tmpfs, as a node's /var/run/cdi), not the temporary directory on disk",
    )
    parser.add_argument(
        "--unwatched-pods",
        action="store_true",
        help="bind the claims' pods to another node: the daemon's pod watch never shows them (each is read)",
    )
    parser.add_argument("--pace-ms", type=float, default=10.0, help="pause after each call (0: back to back)")
    parser.add_argument("--floor-calls", type=int, default=1000, help="no-op RPCs for the floor")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs of the node")
    parser.add_argument(
        "--mig-gpus", type=int, default=0, help="of them, in MIG mode (A100-SXM4-40GBs): MIG partition phases"
    )
    add_daemon_options(
        parser,
        qps_help="the daemon's --kube-api-qps (default: the daemon's, 50; each Prepare reads the claim, "
        "and its pod when the watch lacks it, so calls 10 ms apart outrun it once its burst is spent; "
        "0: no limit)",
        py_spy_help="sample the daemon with py-spy during the Prepare phases",
    )
    args = parser.parse_args()
    if args.claims < 1 or args.live < 1 or not 1 <= args.gpus <= 16 or args.floor_calls < 1:
        parser.error("--claims, --live and --floor-calls must be at least 1, --gpus 1..16")
    if args.held is None:
        args.held = 720 if args.in_process else 0
    if not 0 <= args.held <= 9999:
        parser.error(f"--held: expected 0..9999, got {args.held}")
    if not 0 <= args.mig_gpus <= args.gpus:
        parser.error(f"--mig-gpus: expected 0..{args.gpus} (--gpus), got {args.mig_gpus}")
    started = time.monotonic()
    report = in_process(args) if args.in_process else run(args)
    log(f"done in {time.monotonic() - started:.0f} s")
    print_report(report, args)
    write_json(
        args.json,
        {
            "stats": [s.data() for s in report.stats],
            "rss_mib": report.rss_mib,
            "extra": report.extra,
            "args": {k: str(v) for k, v in vars(args).items()},
        },
    )
    return 0 if all(not s.errors for s in report.stats) else 1


if __name__ == "__main__":
    sys.exit(main())
