"""The vendor registry's cost in hami-control's filter (issue 26), in process: the extender service
(`hami_control.scheduling.Extender`: request JSON in, filter answer out, the real cluster cache and pod
store fed with Node and Pod objects as the watches would) on a seeded cluster, beside the floor measured
in the same run.

Clusters, N nodes each (`--nodes`, 5,000):

- `nvidia`: N nodes x 8 NVIDIA A100 80GB (split 10), 10 pods already on each (1 GPU x 8,000 MiB), the
  default vendor registry in force (every vendor but Ascend and Iluvatar, as the chart ships it);
- `nvidia, NVIDIA only`: the same cluster with a registry of NVIDIA alone (`--device-config-file` with
  just `nvidia:`): what the other vendors cost an NVIDIA-only install;
- `mixed`: half the nodes NVIDIA as above, the rest split over Ascend 910B4 (8 NPUs of 32,768 MiB),
  Hygon DCU (8 DCUs of 16,384 MiB, split 4) and Cambricon MLU (8 cards, capacity inventory), Ascend
  enabled; every vendor node holds 2 pods already.

Per cluster and pod kind, `--rounds` filter requests (names-only ExtenderArgs with every node a
candidate, a fresh pod UID each round, so every round is a new scheduling cycle; the seeded objects frozen
out of the garbage collector's sight, as hami-control does once synced): p50 / p99 / mean of
`Extender.filter(body)`, and the floor: `orjson.loads` of the same body plus `orjson.dumps` of an answer
naming every candidate (what any filter must do with that request, in process). HTTP and TLS are left
out on both sides: bench/extender.py measures them.

Usage: python bench/vendors.py [--nodes 5000] [--rounds 100] [--json FILE]
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import add_json_option, arg_parser, log, markdown_table, percentile, write_json
from hami_api.annotations import encode_node_register, encode_pod_allocation
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, DeviceSettings
from hami_control.pod_store import PodStore
from hami_control.scheduling import Extender

Json = dict[str, Any]


def nvidia_node(i: int) -> tuple[Json, list[Json]]:
    name = f"gpu-{i:05d}"
    gpus = [
        GPUInfo(
            f"GPU-{i:05d}-{g}",
            index=g,
            count=10,
            devmem=81920,
            devcore=100,
            type="NVIDIA-A100-SXM4-80GB",
            health=True,
            mode="hami-core",
        )
        for g in range(8)
    ]
    node = {
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-nvidia-register": encode_node_register(gpus)},
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "80", "cpu": "64"},
            "capacity": {"nvidia.com/gpu": "80"},
        },
    }
    pods = []
    for p in range(10):
        gpu = gpus[p % 8]
        text = encode_pod_allocation(PodAllocation((ContainerAllocation((GPUSlice(gpu.id, 8000, 0),)),)))
        annotations = {"hami.io/vgpu-node": name, "hami.io/vgpu-devices-allocated": text}
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}
        pods.append(_pod(f"{name}-p{p}", name, limits, annotations))
    return node, pods


def _pod(name: str, node: str, limits: Json, annotations: Json) -> Json:
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def ascend_node(i: int) -> tuple[Json, list[Json]]:
    name = f"npu-{i:05d}"
    entries = [
        {
            "id": f"NPU-{i:05d}-{d}",
            "index": d,
            "count": 4,
            "devmem": 32768,
            "devcore": 20,
            "type": "Ascend910B4",
            "health": True,
            "custominfo": {"NetworkID": 0 if d < 4 else 1},
        }
        for d in range(8)
    ]
    node = {
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-register-Ascend910B4": orjson.dumps(entries).decode()},
        },
        "status": {"allocatable": {"huawei.com/Ascend910B4": "8", "cpu": "64"}},
    }
    pods = []
    for p in range(2):
        text = f"NPU-{i:05d}-{p},Ascend910B4,8192,5:;"
        annotations = {"hami.io/vgpu-node": name, "hami.io/Ascend910B4-devices-allocated": text}
        limits = {"huawei.com/Ascend910B4": "1", "huawei.com/Ascend910B4-memory": "8192"}
        pods.append(_pod(f"{name}-p{p}", name, limits, annotations))
    return node, pods


def hygon_node(i: int) -> tuple[Json, list[Json]]:
    name = f"dcu-{i:05d}"
    register = "".join(f"DCU-{i:05d}-{d},4,16384,100,DCU,0,true:" for d in range(8))
    node = {
        "metadata": {"name": name, "annotations": {"hami.io/node-dcu-register": register}},
        "status": {"allocatable": {"hygon.com/dcunum": "32", "cpu": "64"}},
    }
    pods = []
    for p in range(2):
        annotations = {
            "hami.io/vgpu-node": name,
            "hami.io/dcu-devices-allocated": f"DCU-{i:05d}-{p},DCU,4000,30:;",
        }
        pods.append(
            _pod(f"{name}-p{p}", name, {"hygon.com/dcunum": "1", "hygon.com/dcumem": "4000"}, annotations)
        )
    return node, pods


def cambricon_node(i: int) -> tuple[Json, list[Json]]:
    name = f"mlu-{i:05d}"
    capacity = {
        "cambricon.com/mlu.smlu.vcore": "800",
        "cambricon.com/mlu.smlu.vmemory": "1536",
        "cambricon.com/vmlu": "800",
    }
    node = {
        "metadata": {"name": name},
        "status": {"allocatable": {**capacity, "cpu": "64"}, "capacity": capacity},
    }
    return node, []


Seeder = Callable[[int], tuple[Json, list[Json]]]


def cluster(config: ControlConfig, seeders: list[tuple[Seeder, int]]) -> tuple[Extender, list[str]]:
    cache = ClusterCache(config.requests.names, config.registry.vendors)
    store = PodStore(config, cache)
    names: list[str] = []
    for seeder, count in seeders:
        for i in range(count):
            node, pods = seeder(i)
            cache.node_upserted(node)
            names.append(node["metadata"]["name"])
            for pod in pods:
                store.apply("ADDED", pod)
    gc.collect()
    gc.freeze()  # as hami-control does once its caches are synced (hami_control/main.py)
    return Extender(config, cache, store), names


def ask(kind: str, uid: str) -> Json:
    limits = {
        "nvidia": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
        "ascend": {"huawei.com/Ascend910B4": "1", "huawei.com/Ascend910B4-memory": "8192"},
        "hygon": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "4000"},
        "cambricon": {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "4"},
    }[kind]
    return {
        "metadata": {"name": f"ask-{uid}", "namespace": "bench", "uid": uid, "resourceVersion": "1"},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


@dataclass
class Row:
    cluster: str
    kind: str
    fitting: int
    p50: float
    p99: float
    mean: float
    floor_p50: float
    floor_p99: float


def measure(ext: Extender, names: list[str], kind: str, rounds: int, label: str) -> Row:
    names_json = orjson.dumps(names)
    timings: list[float] = []
    floors: list[float] = []
    fitting = 0
    for r in range(rounds + 5):
        body = (
            b'{"Pod":' + orjson.dumps(ask(kind, f"{label}-{kind}-{r}")) + b',"NodeNames":' + names_json + b"}"
        )
        started = time.perf_counter()
        decoded = orjson.loads(body)
        orjson.dumps({"NodeNames": decoded["NodeNames"], "FailedNodes": {}, "Error": ""})
        floor = time.perf_counter() - started
        started = time.perf_counter()
        answer = ext.filter(body)
        took = time.perf_counter() - started
        if r >= 5:  # warm-up rounds left out
            timings.append(took)
            floors.append(floor)
            fitting = len(answer["NodeNames"] or [])
    timings.sort()
    floors.sort()
    ms = 1000.0
    return Row(
        label,
        kind,
        fitting,
        percentile(timings, 0.50) * ms,
        percentile(timings, 0.99) * ms,
        sum(timings) / len(timings) * ms,
        percentile(floors, 0.50) * ms,
        percentile(floors, 0.99) * ms,
    )


def runs(nodes: int) -> Iterator[tuple[str, ControlConfig, list[tuple[Seeder, int]], list[str]]]:
    only_nvidia = ControlConfig(
        device_config_text="nvidia: {}\n", devices=DeviceSettings(config_file=Path("nvidia-only.yaml"))
    )
    yield "nvidia", ControlConfig(), [(nvidia_node, nodes)], ["nvidia"]
    yield "nvidia, NVIDIA only", only_nvidia, [(nvidia_node, nodes)], ["nvidia"]
    quarter = nodes // 2 // 3
    mixed = [
        (nvidia_node, nodes // 2),
        (ascend_node, quarter),
        (hygon_node, quarter),
        (cambricon_node, nodes - nodes // 2 - 2 * quarter),
    ]
    ascend = ControlConfig(devices=DeviceSettings(enable_ascend=True))
    yield "mixed", ascend, mixed, ["ascend", "hygon", "cambricon", "nvidia"]


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=100)
    add_json_option(parser)
    args = parser.parse_args()
    rows: list[Row] = []
    random.seed(0)
    for label, config, seeders, kinds in runs(args.nodes):
        log(f"{label}: seeding {args.nodes} nodes")
        ext, names = cluster(config, seeders)
        for kind in kinds:
            log(f"{label}: {args.rounds} filters of a {kind} pod")
            rows.append(measure(ext, names, kind, args.rounds, label))
    header = (
        "cluster",
        "pod",
        "fitting nodes",
        "filter p50 ms",
        "p99 ms",
        "mean ms",
        "floor p50",
        "floor p99",
    )
    table = markdown_table(
        header,
        "llrrrrrr",
        [
            (
                r.cluster,
                r.kind,
                r.fitting,
                f"{r.p50:.2f}",
                f"{r.p99:.2f}",
                f"{r.mean:.2f}",
                f"{r.floor_p50:.2f}",
                f"{r.floor_p99:.2f}",
            )
            for r in rows
        ],
    )
    print("\n".join(table))
    write_json(args.json, [r.__dict__ for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
