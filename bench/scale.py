"""hami-control at 15,000 nodes x 8 GPUs with 150,000 pods: issue 29's goals at that size, /filter p99
<= 10 ms, hami-control's RSS <= 600 MB, its list + cache sync <= 20 s.

The cluster, the requests and the phases are `bench/extender.py`'s (its module note says what each
measures), at one size with defaults that fit it: an API server stand-in seeded with N nodes (8 x A100
80GB split 10) and 10 running pods per node, then hami-control as its own process, timed from its start
to its caches synced (the list of every node and pod, their decoding, the GPU cache; Python's start
included); then the latency rounds (every node a candidate: the floor, filter and prioritize, typical
and hard pod), the bind phases and the decisions (kube-scheduler's window, ~5 % of the nodes at this
size, and every node named), with hami-control's RSS after each phase and at its peak (VmHWM). The load
average and the CPU other processes used are printed with the numbers: on a shared 2-core machine,
read each latency beside the floor of the same run.

    python bench/scale.py [--sizes 15000] [--rounds 100] [--bind-pods 500] [--decisions 100]
                          [--control-args FLAGS] [--json FILE] [--py-spy FILE] [--py-spy-decisions FILE]

Every option of bench/extender.py is taken (`--help`).

`--sync-runs N` measures the list + sync alone: the cluster is seeded once, then hami-control is started N
times, each until its caches have synced, and stopped (its wall time to synced, its CPU from its start,
the API server's CPU, its RSS, the other processes' CPU meanwhile); with `--before DIR`, a checkout of
an earlier commit (`git worktree add DIR <commit>`), the runs alternate between that checkout's
hami-control (its packages first on PYTHONPATH; this bench's child) and this one's, so that both meet
the same neighbours.

    python bench/scale.py --sync-runs 3 [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchlib import (
    log,
    machine_busy_seconds,
    markdown_table,
    serving_cert,
    start_apiserver,
    status_mb,
    stop_process,
    write_json,
)
from extender import (
    PODS_PER_NODE,
    build_parser,
    parse_args,
    report,
    run_size,
    seed,
    serve_child,
    server_cpu,
    start_control,
)

SYNC_GOAL_S = 20.0
FILTER_GOAL_MS = 10.0
RSS_GOAL_MB = 600.0


def sync_runs(args: argparse.Namespace, nodes: int) -> list[dict[str, object]]:
    """`--sync-runs`: one seeding, then hami-control started `args.sync_runs` times (alternating with the
    `--before` checkout's), each until synced; one row per start."""
    rows: list[dict[str, object]] = []
    trees = ["before", "after"] if args.before is not None else ["after"]
    with tempfile.TemporaryDirectory(prefix="hami-bench-scale-") as tmp:
        workdir = Path(tmp)
        _ca, cert, key = serving_cert(workdir)
        kubeconfig = workdir / "kubeconfig"
        api, base = start_apiserver(kubeconfig, workdir / "apiserver.log", "--log-level", "WARNING")
        try:
            log(f"{nodes:,} nodes: seeding {nodes:,} nodes and {nodes * PODS_PER_NODE:,} pods")
            written, seconds = asyncio.run(seed(base, nodes))
            log(f"seeded {written:,} objects in {seconds:.1f} s")
            flags = ["--kube-api-qps", args.kube_api_qps, *args.control_args.split()]
            for run in range(args.sync_runs):
                for tree in trees:
                    rows.append(sync_once(workdir, kubeconfig, cert, key, flags, api.pid, tree, args.before))
                    row = rows[-1]
                    log(f"run {run + 1}, {tree}: synced in {row['wall_s']} s, CPU {row['cpu_s']} s")
        finally:
            stop_process(api)
    return rows


def sync_once(  # noqa: PLR0917 - the run's parts, named
    workdir: Path, kubeconfig: Path, cert: Path, key: Path, flags: list[str], api_pid: int, tree: str,
    before: Path | None,
) -> dict[str, object]:  # fmt: skip
    """One start of hami-control until its caches have synced, then stopped."""
    saved = os.environ.get("PYTHONPATH")
    if tree == "before":
        assert before is not None
        os.environ["PYTHONPATH"] = str(before.resolve())
    busy, api_cpu, started = machine_busy_seconds(), server_cpu(api_pid), time.monotonic()
    try:
        control, _port, cached_nodes, cached_pods, synced = start_control(
            workdir, kubeconfig, cert, key, flags
        )
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        wall = time.monotonic() - started
        cpu, api_spent = server_cpu(control.pid), server_cpu(api_pid) - api_cpu
        others = machine_busy_seconds() - busy - cpu - api_spent
        return {
            "tree": tree,
            "nodes": cached_nodes,
            "pods": cached_pods,
            "synced_s": synced,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "api_cpu_s": round(api_spent, 1),
            "rss_mb": round(status_mb(control.pid, "VmRSS")),
            "peak_mb": round(status_mb(control.pid, "VmHWM")),
            "others_cpu_pct": round(100 * max(others, 0.0) / wall),
            "load": os.getloadavg()[0],
        }
    finally:
        stop_process(control)


def sync_table(rows: list[dict[str, object]]) -> str:
    header = (
        "checkout", "hami-control synced (from its start)", "wall to synced (its imports included)",
        "hami-control CPU", "API server CPU", "RSS / peak", "others' CPU", "load (1 min)",
    )  # fmt: skip
    rows_text = [
        (
            str(r["tree"]),
            f"{r['synced_s']:.1f} s",
            f"{r['wall_s']} s",
            f"{r['cpu_s']} s",
            f"{r['api_cpu_s']} s",
            f"{r['rss_mb']} / {r['peak_mb']} MB",
            f"{r['others_cpu_pct']} %",
            f"{r['load']:.1f}",
        )
        for r in rows
    ]
    return "\n".join(markdown_table(header, "lrrrrrrr", rows_text))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2:])
    parser = build_parser(__doc__)
    parser.set_defaults(sizes="15000", rounds=100, warmup=5, decisions=100)
    parser.add_argument(
        "--sync-runs", type=int, default=0, help="measure the list + sync alone, this many starts (see above)"
    )
    parser.add_argument(
        "--before", type=Path, help="with --sync-runs: a checkout of an earlier commit, its runs alternated"
    )
    args, sizes = parse_args(parser)
    started = time.monotonic()
    if args.sync_runs > 0:
        rows = sync_runs(args, max(sizes))
        print(sync_table(rows))
        log(f"done in {time.monotonic() - started:.0f} s")
        write_json(args.json, rows)
        return 0
    results = [run_size(args, n, n == max(sizes)) for n in sizes]
    lines = [report(results), ""]
    for size in results:
        filters = [r for r in size.latency if r.path == "/filter"]
        worst = max(r.p99_ms for r in filters)
        rss = max(size.rss_mb.values())
        lines += [
            f"- {size.nodes:,} nodes, {size.cache_pods:,} pods: list + cache sync {size.sync_seconds:.1f} s, "
            f"goal <= {SYNC_GOAL_S:.0f} s {'met' if size.sync_seconds <= SYNC_GOAL_S else 'NOT met'}",
            f"- {size.nodes:,} nodes: /filter p99 up to {worst:.2f} ms, goal <= {FILTER_GOAL_MS:.0f} ms "
            f"{'met' if worst <= FILTER_GOAL_MS else 'NOT met'}",
            f"- {size.nodes:,} nodes: hami-control RSS up to {rss:.0f} MB (peak included), goal <= "
            f"{RSS_GOAL_MB:.0f} MB {'met' if rss <= RSS_GOAL_MB else 'NOT met'}",
        ]
    print("\n".join(lines))
    log(f"done in {time.monotonic() - started:.0f} s")
    write_json(args.json, [asdict(r) for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
