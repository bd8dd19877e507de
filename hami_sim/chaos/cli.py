"""`hami-sim chaos`: a churning workload on a local cluster under a seeded fault schedule, watched by an
independent invariant checker; prints the report (and writes it as JSON with `--json`). Exit status 0
only with no violation and no pod lost; 1 otherwise; 2 for bad arguments or a cluster that did not come
up. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from hami_sim.chaos.schedule import EVERY_KIND


def _progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def _kinds(text: str) -> tuple[str, ...]:
    if text in ("", "none"):
        return ()
    if text == "all":
        return EVERY_KIND
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in EVERY_KIND]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(EVERY_KIND)}")
    return kinds


def _vendors(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from hami_sim.chaos.runner import ChaosOptions, run_chaos
    from hami_sim.cluster import ClusterError

    try:
        options = ChaosOptions(
            pods=args.pods,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            split=args.split,
            seed=args.seed,
            mode=args.mode,
            state_dir=args.state_dir,
            rate=args.rate,
            concurrency=args.concurrency,
            max_live=args.max_live,
            duration_cap_s=args.duration_cap,
            settle_s=args.settle,
            quiet_s=args.quiet_seconds,
            faults_per_kind=args.faults_per_kind,
            fault_kinds=args.faults,
            vendors=args.vendors,
            vendor_nodes=args.vendor_nodes,
            vendor_share=args.vendor_share,
            progress=not args.no_progress,
            keep=args.keep,
        )
    except ValueError as exc:
        print(f"hami-sim chaos: {exc}", file=sys.stderr)
        return 2
    # SIGTERM ends the run as Ctrl-C does: the runner's cleanup takes the cluster down (without it, a
    # terminated run left every process of its cluster running).
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        report = run_chaos(options, _progress)
    except ClusterError as exc:
        print(f"hami-sim chaos: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hami-sim chaos: interrupted; the cluster was taken down", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    text = report.render_text()
    print(text, flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_data(), indent=1) + "\n")
    if args.text is not None:
        args.text.parent.mkdir(parents=True, exist_ok=True)
        args.text.write_text(text + "\n")
    return 0 if report.ok else 1


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "chaos",
        help="run a churning workload under a seeded fault schedule and check the invariants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=10_000, help="pods to create (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=20, help="nodes (default: %(default)s)")
    parser.add_argument(
        "--gpus-per-node", type=int, default=4, help="fake GPUs per node (default: %(default)s)"
    )
    parser.add_argument("--split", type=int, default=10, help="slices per GPU (default: %(default)s)")
    parser.add_argument(
        "--seed", type=int, default=1, help="the workload's and the schedule's seed (default: %(default)s)"
    )
    parser.add_argument(
        "--mode",
        choices=("mixed", "device-plugin", "dra"),
        default="mixed",
        help="mixed: every second node in DRA mode and a share of the pods translated to claims; "
        "device-plugin or dra: every node and pod on that path (default: %(default)s)",
    )
    parser.add_argument(
        "--rate", type=float, default=10.0, help="pods created per second (default: %(default)s)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="creates in flight (default: %(default)s)")
    parser.add_argument(
        "--max-live", type=int, default=None, help="pods alive at once (default: a third of the slots)"
    )
    parser.add_argument(
        "--faults-per-kind", type=int, default=None, help="faults of each kind (default: max(2, pods/500))"
    )
    parser.add_argument(
        "--faults", type=_kinds, default=EVERY_KIND, metavar="KINDS",
        help=f"fault kinds, comma-separated, `all` or `none` (default: all: {', '.join(EVERY_KIND)}; "
        "kill-vendor-plugin only with --vendors, kill-controller-manager only with DRA nodes)",
    )  # fmt: skip
    parser.add_argument(
        "--vendors", type=_vendors, default=(), metavar="VENDORS",
        help="nodes of other vendors beside the NVIDIA ones, comma-separated (hygon, ascend, cambricon, "
        "iluvatar, metax, mthreads, enflame, kunlun, awsneuron, amd, vastai, biren; a plugin mode as "
        "metax/gpu, enflame/gcu, kunlun/xpu), with pods asking them (docs/vendor-nodes.md)",
    )  # fmt: skip
    parser.add_argument(
        "--vendor-nodes", type=int, default=1, help="nodes of each of --vendors (default: %(default)s)"
    )
    parser.add_argument(
        "--vendor-share", type=float, default=0.5,
        help="with --vendors, the share of pods that asks one of them (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--duration-cap", type=float, default=3 * 3600.0, help="stop creating pods after this many seconds"
    )
    parser.add_argument(
        "--settle", type=float, default=300.0, help="seconds the end waits for every pod to settle"
    )
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=10.0,
        help="at the end, seconds the cluster gets to act on the last deletes before the final check "
        "(default: %(default)s)",
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".hami-sim-chaos"))
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON to this file")
    parser.add_argument("--text", type=Path, default=None, help="write the text report to this file too")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    parser.set_defaults(handler=run)
    return parser


__all__ = ["add_parser", "run"]
