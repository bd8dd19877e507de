"""Allocate latency of HAMi's dynamic MIG on the node (operating mode mig, issue 27) beside today's
hami-core Allocate, on the same set-up.

Set-up: `hami-sim apiserver` as its own process; in this process the node daemon's parts as
hami_node/main.py wires them (fake GPU backend with --gpus A100-SXM4-40GB in MIG mode, `DeviceState`,
the real `PodTracker` fed by the pod watch, `PluginServer` on a real Unix socket; in mode mig with
`MigSupport`: the MIG instance manager and the reconciler) and a direct gRPC client as kubelet's side.
Phases, each --allocations calls, one pod at a time:

0. Floor: GetDevicePluginOptions back to back (gRPC, threads, the machine; no work in the handler).
1. hami-core: a pod bound with HAMi's device annotations (`<GPU>,NVIDIA,4000,30`); once the tracker
   has it, Allocate of one device ID is timed (pod match, the response, the cache directory).
2. MIG: a pod bound with the same annotations and `hami.io/vgpu-mig-allocations` (1g.5gb at start 6
   of the next GPU); Allocate is timed, the instance's creation in the fake backend (placement check,
   GI and CI created, the MIG layout file written atomically) and the runtime identity's merge patch
   on the pod (one API round trip) included.
After each call the pod is deleted and (MIG) one reconcile round destroys its instance, untimed.
The fake backend's create is a few file writes; NVML's real GI/CI create takes hundreds of ms on an
A100 (not measured here). A markdown table goes to stdout. Usage:

    python bench/node_mig.py [--allocations 500] [--gpus 8] [--kube-api-qps 1000] [--json FILE]

The MIG path makes two API calls per Allocate (the tracker's pod read and the identity patch) where
hami-core makes one plus the deferred bind-phase patch; under the daemon's default client rate limit
(--kube-api-qps 50, burst 100) back-to-back MIG Allocates queue on it once the burst is spent, so the
default here is 1000 (as bench/node.py's `--kube-api-qps 1000` row); pass 50 to see the queueing.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from benchlib import (
    Stat,
    arg_parser,
    log,
    markdown_table,
    start_apiserver,
    stop_process,
    write_json,
)
from kubernetes import client

from hami_api import annotations as ann
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, encode_mig_allocations
from hami_api.types import MigPlacement
from hami_kube.backoff import RetryPolicy
from hami_node.config import NodeConfig, OperatingMode
from hami_node.devices import DeviceState
from hami_node.gpu.fake import FakeBackend
from hami_node.kubeapi import NodeApi, watch_node_pods
from hami_node.mig_manager import MigManager, MigReconciler, discover_registrations
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.registration import CHANNEL_OPTIONS
from hami_node.plugin.server import MigSupport, PluginServer
from hami_node.pods import PodTracker

NODE = "bench-mig"
NS = "default"
A100 = "NVIDIA A100-SXM4-40GB"
FAST = RetryPolicy(initial=0.05, maximum=0.3)


def gpu_uuids(count: int) -> list[str]:
    return [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(count)]


def pod_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": {"nvidia.com/vgpu-mode": "mig"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }


def bind(core: Any, name: str, annotations: dict[str, str]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }
    core.create_namespaced_pod_binding(name, NS, body, _preload_content=False)


class Node:
    """The node daemon's parts in one operating mode (see the module docstring)."""

    def __init__(
        self, workdir: Path, kubeconfig: Path, backend: FakeBackend, mode: OperatingMode, qps: float
    ) -> None:
        sub = workdir / mode.value
        (sub / "dp").mkdir(parents=True)
        (sub / "hook").mkdir()
        self.config = NodeConfig(
            node_name=NODE,
            kubelet_dir=sub / "dp",
            hook_path=str(sub / "hook"),
            device_split_count=7,
            operating_mode=mode,
            allocate_wait_seconds=2.0,
        )
        state = DeviceState(self.config)
        state.set_gpus(backend.list_gpus(), 0.0)
        self.kube = NodeApi.connect(kubeconfig, qps=qps, burst=max(1, int(qps * 2)))
        self.tracker = PodTracker(NODE, self.kube, retry=FAST, read_timeout_s=2.0)
        self.watch = watch_node_pods(self.kube.bridge, NODE, self.tracker, retry=FAST)
        self.tracker.start()
        self.watch.start()
        if not self.watch.wait_synced(20):
            raise SystemExit("the pod watch did not sync within 20 s")
        self.reconciler: MigReconciler | None = None
        mig = None
        if mode is OperatingMode.MIG:
            state.set_mig(discover_registrations(backend, backend.list_gpus(), None))
            manager = MigManager(backend)
            self.reconciler = MigReconciler(manager, lambda: self.kube.list_pods(f"spec.nodeName={NODE}")[0])
            mig = MigSupport(manager, self.kube, self.reconciler)
        self.server = PluginServer(self.config, state, self.tracker, mig=mig)
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{self.config.socket_path}", options=CHANNEL_OPTIONS)
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.server.stop()
        self.watch.stop()
        self.tracker.stop()
        self.kube.close()


def wait_pending(node: Node, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not node.tracker.waiting():
        if time.monotonic() > deadline:
            raise SystemExit("the tracker did not see the bound pod within 10 s")
        time.sleep(0.0005)


def allocate_phase(
    node: Node,
    core: Any,
    *,
    stat: Stat,
    calls: int,
    uuids: list[str],
    extra: Callable[[str], dict[str, str]],
) -> None:
    for i in range(calls + 10):  # 10 warm-up calls, not counted
        gpu = uuids[i % len(uuids)]
        name = f"{node.config.operating_mode.value}-{i}"
        core.create_namespaced_pod(NS, pod_body(name))
        annotations = {
            ann.DEVICES_TO_ALLOCATE: f"{gpu},NVIDIA,4864,15:;",
            ann.DEVICES_ALLOCATED: f"{gpu},NVIDIA,4864,15:;",
            ann.VGPU_NODE: NODE,
            ann.BIND_PHASE: "allocating",
            ann.VGPU_TIME: str(1767225600 + i),
            ann.BIND_TIME: str(1767225600 + i),
            **extra(gpu),
        }
        bind(core, name, annotations)
        wait_pending(node)
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{gpu}-0"])]
        )
        started = time.perf_counter()
        try:
            node.stub.Allocate(request, timeout=10)
        except grpc.RpcError as err:
            stat.errors += 1
            log(f"Allocate {name}: {err.details()}")
        elapsed = time.perf_counter() - started
        if i >= 10:
            stat.samples.append(elapsed)
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        if node.reconciler is not None:
            node.reconciler.reconcile_once()


def mig_annotation(gpu: str) -> dict[str, str]:
    return {MIG_ALLOCATIONS: encode_mig_allocations([MigAllocation(0, 0, gpu, "1g.5gb", MigPlacement(6, 1))])}


def run(args: argparse.Namespace) -> dict[str, Stat]:
    workdir = Path(tempfile.mkdtemp(prefix="hami-bench-mig-", dir="/tmp"))
    proc = None
    try:
        kubeconfig = workdir / "kubeconfig"
        proc, base_url = start_apiserver(kubeconfig, workdir / "apiserver.log")
        api: Any = client.ApiClient(client.Configuration(host=base_url))
        core = client.CoreV1Api(api)
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=NODE)))
        uuids = gpu_uuids(args.gpus)
        inventory = workdir / "inventory.yaml"
        gpus = [{"uuid": u, "model": A100, "memory": 40960, "mig": True} for u in uuids]
        inventory.write_text(yaml.safe_dump({"gpus": gpus}))
        backend = FakeBackend(inventory, watch=False)
        backend.init()
        stats = {
            "floor": Stat("GetDevicePluginOptions (no-op floor)"),
            "hami-core": Stat("Allocate, hami-core (one container, one slice)"),
            "mig": Stat("Allocate, mig (one container, 1g.5gb created + identity patched)"),
        }
        for mode, key, extra in (
            (OperatingMode.HAMI_CORE, "hami-core", lambda _gpu: {}),
            (OperatingMode.MIG, "mig", mig_annotation),
        ):
            node = Node(workdir, kubeconfig, backend, mode, args.kube_api_qps)
            try:
                if key == "hami-core":
                    log(f"floor: {args.allocations} no-op RPCs")
                    for _ in range(args.allocations):
                        started = time.perf_counter()
                        node.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
                        stats["floor"].samples.append(time.perf_counter() - started)
                log(f"{key}: {args.allocations} Allocates")
                allocate_phase(node, core, stat=stats[key], calls=args.allocations, uuids=uuids, extra=extra)
            finally:
                node.stop()
        left = sum(len(backend.mig_devices(u)) for u in uuids)
        if left:
            raise SystemExit(f"{left} MIG instances left after the MIG phase (the reconciler missed them)")
        api.close()
        return stats
    finally:
        stop_process(proc, "apiserver")
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--allocations", type=int, default=500, help="Allocates per phase")
    parser.add_argument("--gpus", type=int, default=8, help="A100-40GB GPUs in MIG mode")
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=1000.0,
        help="the daemon's client rate limit (its default, 50, queues the MIG path's second API call)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the samples to this file")
    args = parser.parse_args()
    stats = run(args)
    rows = []
    for stat in stats.values():
        s = stat.summary()
        rows.append([s["name"], s["count"], s["errors"], s["p50_ms"], s["p99_ms"], s["max_ms"]])
    print(
        "\n".join(
            markdown_table(["measure", "calls", "errors", "p50 ms", "p99 ms", "max ms"], "lrrrrr", rows)
        )
    )
    write_json(args.json, {key: stat.data() for key, stat in stats.items()})


if __name__ == "__main__":
    main()
