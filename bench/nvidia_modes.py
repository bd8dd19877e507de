"""Latency of hami-node's device plugins in NVIDIA's modes (`hami-node --config-file nvidia.yaml`, issue
27): Allocate of one time-sliced replica, Allocate of one MIG device under strategy mixed, and
GetPreferredAllocation for a replica, against the floor of a no-op RPC on the same sockets.

Set-up, in this process, the parts `hami_node.nvidia.daemon.NvidiaPlugins` wires: the settings loaded by
the one loader from NVIDIA's config file v1 (MIG strategy mixed, `nvidia.com/gpu` time-sliced 4 ways with
failRequestsGreaterThanOne, as tests/integration/test_nvidia_modes.py), the fake GPU backend with
--t4 Tesla T4s and --a100 A100-SXM4-40GBs in MIG mode whose MIG devices are pre-created in the inventory
(2g.10gb at 0, 1g.5gb at 2 and 3, 3g.20gb at 4), `DeviceState` with the backend's GPUs,
`NvidiaPlugins.build()` for the device map, and one `NvidiaPluginServer` each for
`nvidia.com/gpu.shared` and `nvidia.com/mig-1g.5gb` on NVIDIA's socket names (real Unix sockets); a
direct gRPC client as kubelet's side. No API server: NVIDIA's modes read no pod.

Each round makes one call of every measure, in turn, so a shared machine's load falls on all alike;
--calls rounds timed, 20 warm-up rounds not counted:

- GetDevicePluginOptions on each socket (the floor: gRPC, threads, the machine; no work in the handler);
- Allocate of one replica (`GPU-...::n`, cycling over all), NVIDIA_VISIBLE_DEVICES answered;
- GetPreferredAllocation over all the replicas, allocation size 1 (NVIDIA's distributed policy);
- Allocate of one 1g.5gb MIG device (cycling over all), its MIG UUID answered.

Every answer is checked. Logging is left unconfigured (the daemon's INFO line per Allocate is not
written). A markdown table goes to stdout. Usage:

    python bench/nvidia_modes.py [--calls 2000] [--t4 2] [--a100 2] [--json FILE]
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
from benchlib import Stat, add_json_option, arg_parser, log, markdown_table, write_json

from hami_node.config import load_config
from hami_node.devices import DeviceState
from hami_node.gpu.fake import FakeBackend
from hami_node.nvidia.daemon import NvidiaPlugins
from hami_node.nvidia.plugin import NvidiaDevices, NvidiaPluginServer, NvidiaPluginServicer
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.registration import CHANNEL_OPTIONS

NODE = "bench-nvidia"
SHARED = "nvidia.com/gpu.shared"
MIG_1G = "nvidia.com/mig-1g.5gb"
WARM_UP = 20

CONFIG = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
"""A user's NVIDIA config file: MIG strategy mixed, whole GPUs time-sliced 4 ways (renamed .shared)."""

MIG_LAYOUT = [
    {"profile": "2g.10gb", "start": 0},
    {"profile": "1g.5gb", "start": 2},
    {"profile": "1g.5gb", "start": 3},
    {"profile": "3g.20gb", "start": 4},
]


def inventory(t4: int, a100: int) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = [
        {"uuid": f"GPU-00000000-0000-0000-0000-{i:012d}", "model": "Tesla T4", "memory": 15360}
        for i in range(t4)
    ]
    gpus += [
        {
            "uuid": f"GPU-00000000-0000-0000-0001-{i:012d}",
            "model": "NVIDIA A100-SXM4-40GB",
            "memory": 40960,
            "mig": {"enabled": True, "devices": MIG_LAYOUT},
        }
        for i in range(a100)
    ]
    return {"gpus": gpus}


class Plugin:
    """One resource's server on its socket and a client stub to it."""

    def __init__(self, kubelet_dir: Path, resource: str, devices: NvidiaDevices, state: DeviceState) -> None:
        self.server = NvidiaPluginServer(kubelet_dir, NvidiaPluginServicer(resource, devices, state))
        self.server.start()
        self.ids = sorted(devices.by_id(resource))
        self.channel = grpc.insecure_channel(f"unix://{self.server.socket_path}", options=CHANNEL_OPTIONS)
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.server.stop()


def timed(stat: Stat, counted: bool, call: Callable[[], str | None]) -> None:
    """Time `call`; it answers None, or what was wrong with the answer (an error)."""
    started = time.perf_counter()
    try:
        problem = call()
    except grpc.RpcError as err:
        problem = f"{err.code()}: {err.details()}"
    elapsed = time.perf_counter() - started
    if problem is not None:
        stat.errors += 1
        log(f"{stat.name}: {problem}")
    if counted:
        stat.samples.append(elapsed)


def run(args: argparse.Namespace) -> dict[str, Stat]:
    workdir = Path(tempfile.mkdtemp(prefix="hami-bench-nvidia-", dir="/tmp"))
    replica, mig = None, None
    try:
        (workdir / "dp").mkdir()
        inv = workdir / "gpus.yaml"
        inv.write_text(yaml.safe_dump(inventory(args.t4, args.a100)))
        nvidia_yaml = workdir / "nvidia.yaml"
        nvidia_yaml.write_text(CONFIG)
        argv = [
            "--node-name", NODE, "--gpu-backend", "fake", "--fake-inventory", str(inv),
            "--kubelet-dir", str(workdir / "dp"), "--config-file", str(nvidia_yaml),
        ]  # fmt: skip
        config = load_config(argv, {}, lambda p: p.read_text(encoding="utf-8"))
        backend = FakeBackend(inv, watch=False)
        backend.init()
        state = DeviceState(config)
        state.set_gpus(backend.list_gpus(), 0.0)
        devices = NvidiaPlugins(config, state, backend).build()
        log(f"serving {', '.join(f'{r} ({len(devices.map[r])})' for r in devices.resources)}")
        replica = Plugin(config.kubelet_dir, SHARED, devices, state)
        mig = Plugin(config.kubelet_dir, MIG_1G, devices, state)
        gpu_of = {d.id: d.uuid for d in devices.map[SHARED]}
        stats = {
            "floor-shared": Stat(f"GetDevicePluginOptions, {SHARED} socket (no-op floor)"),
            "floor-mig": Stat(f"GetDevicePluginOptions, {MIG_1G} socket (no-op floor)"),
            "replica": Stat(f"Allocate, one time-sliced replica ({SHARED})"),
            "preferred": Stat(f"GetPreferredAllocation, 1 of {len(replica.ids)} replicas"),
            "mig": Stat(f"Allocate, one MIG device ({MIG_1G}, strategy mixed)"),
        }
        preferred_request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=replica.ids, allocation_size=1
                )
            ]
        )

        def floor(plugin: Plugin) -> Callable[[], str | None]:
            def call() -> str | None:
                options = plugin.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
                return None if options.get_preferred_allocation_available else "no preferred allocation"

            return call

        def allocate(plugin: Plugin, device_id: str, visible: str) -> Callable[[], str | None]:
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device_id])]
            )

            def call() -> str | None:
                (answer,) = plugin.stub.Allocate(request, timeout=10).container_responses
                got = answer.envs.get("NVIDIA_VISIBLE_DEVICES")
                return None if got == visible else f"{device_id}: NVIDIA_VISIBLE_DEVICES={got}"

            return call

        def preferred() -> str | None:
            (answer,) = replica.stub.GetPreferredAllocation(preferred_request, timeout=10).container_responses
            return None if len(answer.deviceIDs) == 1 else f"answered {list(answer.deviceIDs)}"

        log(f"{args.calls} rounds (+{WARM_UP} warm-up) of {len(stats)} calls")
        for i in range(args.calls + WARM_UP):
            counted = i >= WARM_UP
            r_id = replica.ids[i % len(replica.ids)]
            m_id = mig.ids[i % len(mig.ids)]
            timed(stats["floor-shared"], counted, floor(replica))
            timed(stats["replica"], counted, allocate(replica, r_id, gpu_of[r_id]))
            timed(stats["preferred"], counted, preferred)
            timed(stats["floor-mig"], counted, floor(mig))
            timed(stats["mig"], counted, allocate(mig, m_id, m_id))
            if counted and (i - WARM_UP + 1) % 500 == 0:
                log(f"{i - WARM_UP + 1} rounds")
        return stats
    finally:
        for plugin in (replica, mig):
            if plugin is not None:
                plugin.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per measure")
    parser.add_argument("--t4", type=int, default=2, help="Tesla T4s, each time-sliced 4 ways")
    parser.add_argument("--a100", type=int, default=2, help="A100-SXM4-40GBs in MIG mode (two 1g.5gb each)")
    add_json_option(parser)
    args = parser.parse_args()
    if args.t4 < 1 or args.a100 < 1 or args.calls < 1:
        parser.error("--calls, --t4 and --a100 must be at least 1")
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
