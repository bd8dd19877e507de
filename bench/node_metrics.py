"""Cost of one scrape of hami-node's /metrics per container (`hami_node.monitor`), in this process.

For each size N: N container directories under a temporary containers dir, each with one HAMi-core shared
region file (2,008,952 bytes, version 1.2, one process using memory on one GPU), and a pod directory that
knows every one of them; then `NodeMetrics.render()` (what /metrics answers) with the per-container
collector, timed over `--rounds` scrapes after one untimed one. Every scrape reads every region file
afresh, as the node daemon does (nothing is cached). Legacy names on (the default).

The floor, in the same run: the same registry and collector over an empty containers dir (the daemon
health families and the empty per-container families, rendered).

    python bench/node_metrics.py [--sizes 0,10,100,200] [--rounds 50] [--json out.json]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchlib import add_json_option, arg_parser, markdown_table, p50_p99_ms, write_json

from hami_node.monitor.exporter import ContainerCollector, NodeMetrics
from hami_node.monitor.region import (
    MAX_DEVICES,
    DeviceMemory,
    DeviceUtil,
    ProcSlot,
    SharedRegion,
    encode,
)
from hami_node.monitor.regions import RegionScanner
from hami_node.ports import PodName

GPU = "GPU-00000000-0000-0000-0000-000000000000"


class Pods:
    """A pod directory that knows every `uid-<i>` pod with its one container `main`."""

    def pod_name(self, uid: str) -> PodName | None:
        return PodName("bench", uid, ("main",)) if uid.startswith("uid-") else None


def region(i: int) -> SharedRegion:
    used = 2**30 + i * 2**20
    proc = ProcSlot(
        pid=1,
        used=(DeviceMemory(context=100, module=20, data=used - 120, offset=0, total=used),)
        + (DeviceMemory(),) * (MAX_DEVICES - 1),
        device_util=(DeviceUtil(sm=i % 100),) + (DeviceUtil(),) * (MAX_DEVICES - 1),
        status=1,
    )
    return SharedRegion(
        device_num=1,
        uuids=(GPU,) + ("",) * (MAX_DEVICES - 1),
        limit=(4 * 2**30,) + (0,) * (MAX_DEVICES - 1),
        procs=(proc,),
        last_kernel_time=1,
    )


def scrape_times(root: Path, rounds: int) -> tuple[list[float], int]:
    """Seconds per render() over `rounds` scrapes of the containers under `root`; the body's size."""
    metrics = NodeMetrics("bench-node")
    metrics.add_collector(ContainerCollector(RegionScanner(root).scan, Pods(), legacy=True))
    body = metrics.render()[1]  # untimed: imports, first reads
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        metrics.render()
        times.append(time.perf_counter() - start)
    return sorted(times), len(body)


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--sizes", default="0,10,100,200", help="containers per scrape, comma-separated")
    parser.add_argument("--rounds", type=int, default=50, help="timed scrapes per size")
    add_json_option(parser)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows, data = [], []
    with tempfile.TemporaryDirectory(prefix="hami-bench-metrics-") as tmp:
        floor_p50 = 0.0
        for n in sorted(set([0, *sizes])):
            root = Path(tmp) / f"n{n}"
            root.mkdir()
            for i in range(n):
                (root / f"uid-{i}_main").mkdir()
                (root / f"uid-{i}_main" / "1.cache").write_bytes(encode(region(i)))
            times, size = scrape_times(root, args.rounds)
            p50, p99 = p50_p99_ms(times)
            if n == 0:
                floor_p50 = p50
            per = (p50 - floor_p50) / n * 1000 if n else 0.0
            label = "floor: no container" if n == 0 else f"{n} containers"
            rows.append((label, f"{p50:.2f}", f"{p99:.2f}", f"{per:.0f}" if n else "-", f"{size / 1024:.1f}"))
            data.append({"containers": n, "p50_ms": p50, "p99_ms": p99, "body_bytes": size})
    header = ("scrape", "p50 ms", "p99 ms", "per container above the floor, us", "body KiB")
    print("\n".join(markdown_table(header, "lrrrr", rows)))
    write_json(args.json, {"rounds": args.rounds, "sizes": data})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
