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
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict

from benchlib import log, write_json
from extender import build_parser, parse_args, report, run_size, serve_child

SYNC_GOAL_S = 20.0
FILTER_GOAL_MS = 10.0
RSS_GOAL_MB = 600.0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2:])
    parser = build_parser(__doc__)
    parser.set_defaults(sizes="15000", rounds=100, warmup=5, decisions=100)
    args, sizes = parse_args(parser)
    started = time.monotonic()
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
