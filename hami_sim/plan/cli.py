"""`hami-sim plan`: replay a workload on an inventory with each policy and write the report."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from hami_sim.plan import (
    DEFAULT_EXTENDER_WEIGHT,
    DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE,
    DEFAULT_SPLIT,
    EXTRA_POLICY_NAMES,
    POLICY_NAMES,
)

MIG_VS_SLICES = "mig-vs-slices"


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = POLICY_NAMES + EXTRA_POLICY_NAMES
    bad = [p for p in names if p not in known]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad) or repr(text)}; expected a comma list of {', '.join(known)}"
        )
    return list(dict.fromkeys(names))


def _steps(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole percentages separated by commas, got {text!r}"
        ) from None


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _arrival(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a percentage of capacity above 0, got {text!r}")
    return value


def _percentage(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a whole percentage 0..100, got {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="capacity planning: replay a workload with each scheduling policy (docs/planning.md)",
        description="Replay a workload (OpenB pod CSV, or a YAML of pod mixes) on an inventory (OpenB node "
        "CSV or YAML node pools) through hami-control's fit and score code, per policy, and write "
        "report.md, report.json and PNG charts. See docs/planning.md.",
    )
    parser.add_argument("--nodes", type=Path, required=True, help="node CSV (OpenB) or YAML node pools")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--pods", type=Path, help="pod CSV (OpenB)")
    source.add_argument("--workload", type=Path, help="YAML of pod mixes (arrival rates and durations)")
    parser.add_argument(
        "--policies",
        type=_policies,
        default=None,
        help=f"comma list of {', '.join(POLICY_NAMES + EXTRA_POLICY_NAMES)} (default: all but "
        f"{', '.join(EXTRA_POLICY_NAMES)}; mig-vs-slices: one of binpack, spread, topology, hami, "
        "default binpack)",
    )
    parser.add_argument(
        "--experiment",
        choices=("replay", "inflation", MIG_VS_SLICES),
        default="inflation",
        help="inflation, replay, or mig-vs-slices: the GPU tasks on the same nodes in MIG mode (HAMi's "
        "dynamic MIG) and as hami-core slices, until the GPU memory asked reaches --max-arrival "
        "(default 100 there) of the nodes' (docs/planning.md, 'MIG against slices')",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--seed", type=int, default=42, help="seed of sampling and tie-breaks (default 42)")
    parser.add_argument(
        "--max-arrival",
        type=_arrival,
        default=None,
        help="inflation: stop when the arrived GPU request reaches this %% of capacity (default 130); "
        "mig-vs-slices: the arrived GPU memory (default 100)",
    )
    parser.add_argument(
        "--steps",
        type=_steps,
        default=list(range(0, 131, 10)),
        help="inflation: arrival percentages of the report's table (default 0,10,...,130)",
    )
    parser.add_argument(
        "--split-count",
        type=_at_least_one,
        default=DEFAULT_SPLIT,
        help="tasks per GPU for CSV nodes (HAMi's deviceSplitCount, default %(default)s)",
    )
    parser.add_argument(
        "--mix", help="fragmentation mix [Nx]MILLI:WEIGHT,... (default: learned from the workload)"
    )
    parser.add_argument(
        "--extender-weight",
        type=_at_least_one,
        default=DEFAULT_EXTENDER_WEIGHT,
        help="the extender's weight in kube-scheduler's configuration: its 0..10 score counts x weight x 10 "
        "beside LeastAllocated's 0..100 (default %(default)s, as daemonset/scheduler/"
        "kube-scheduler-config.yaml)",
    )
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=_percentage,
        default=DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE,
        help="kube-scheduler's percentageOfNodesToScore: above 100 nodes it scores only the first feasible "
        "nodes it finds, this share of them (0 or unset: its adaptive share, as the shipped configuration; "
        "100: every node)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from hami_control.frag import MixError, parse_mix
    from hami_sim.plan.experiments import (
        InflationResult,
        ReplayResult,
        SchedulerModel,
        inflation,
        replay,
        workload_mix,
    )
    from hami_sim.plan.inputs import (
        InputError,
        keep_vendors_apart,
        read_nodes,
        read_pods_csv,
        read_workload_yaml,
    )
    from hami_sim.plan.report import RunInfo, describe_mix, write_report

    try:
        nodes = read_nodes(args.nodes, args.split_count)
        if args.pods is not None:
            tasks, pods_file = read_pods_csv(args.pods), str(args.pods)
        else:
            tasks, pods_file = read_workload_yaml(args.workload, args.seed), str(args.workload)
        tasks = keep_vendors_apart(nodes, tasks)
        given = parse_mix(args.mix) if args.mix else None
    except (InputError, MixError) as err:
        print(f"hami-sim plan: {err}", file=sys.stderr)
        return 2
    progress = not args.no_progress  # off a terminal: a plain line every 10% (hami_sim.progress)
    if args.experiment == MIG_VS_SLICES:
        return _mig_vs_slices(args, nodes, tasks, pods_file, progress)
    if args.policies is None:
        args.policies = list(POLICY_NAMES)
    if args.max_arrival is None:
        args.max_arrival = 130.0
    scheduler = SchedulerModel(args.extender_weight, args.percentage_of_nodes_to_score)
    results: list[InflationResult] | list[ReplayResult]
    if args.experiment == "inflation":
        results = [
            inflation(nodes, tasks, p, args.seed, args.max_arrival / 100, given, progress, scheduler)
            for p in args.policies
        ]
    else:
        results = [
            replay(nodes, tasks, p, args.seed, given, progress, scheduler=scheduler) for p in args.policies
        ]
    info = RunInfo(
        str(args.nodes),
        pods_file,
        args.experiment,
        args.seed,
        sum(n.gpus for n in nodes),
        len(nodes),
        len(tasks),
        describe_mix(given or workload_mix(tasks)),
        args.extender_weight,
        args.percentage_of_nodes_to_score,
    )
    write_report(args.out, info, results, args.steps, charts=not args.no_charts)
    print(f"hami-sim plan: report in {args.out / 'report.md'}")
    for r in results:
        print(f"  {r.policy}: {r.seconds:.1f} s")
    return 0


def _mig_vs_slices(args: argparse.Namespace, nodes: Any, tasks: Any, pods_file: str, progress: bool) -> int:
    from hami_sim.plan.engine import MIG_POLICIES
    from hami_sim.plan.experiments import SchedulerModel, mig_vs_slices, workload_mix
    from hami_sim.plan.report import RunInfo, describe_mix, mig_summary, mig_table_rows, write_mig_report

    policies = args.policies or ["binpack"]
    if len(policies) != 1 or policies[0] not in MIG_POLICIES:
        print(
            f"hami-sim plan: --policies: got {','.join(policies)}, expected one of {', '.join(MIG_POLICIES)} "
            f"for {MIG_VS_SLICES}",
            file=sys.stderr,
        )
        return 2
    scheduler = SchedulerModel(args.extender_weight, args.percentage_of_nodes_to_score)
    max_arrival = 100.0 if args.max_arrival is None else args.max_arrival
    try:
        results = mig_vs_slices(nodes, tasks, policies[0], args.seed, max_arrival / 100, progress, scheduler)
    except ValueError as err:
        print(f"hami-sim plan: {err}", file=sys.stderr)
        return 2
    gpu_tasks = [t for t in tasks if t.num_gpu > 0]
    info = RunInfo(
        str(args.nodes),
        pods_file,
        MIG_VS_SLICES,
        args.seed,
        sum(n.gpus for n in nodes),
        len(nodes),
        len(gpu_tasks),
        describe_mix(workload_mix(gpu_tasks)),
        args.extender_weight,
        args.percentage_of_nodes_to_score,
    )
    write_mig_report(args.out, info, results, charts=not args.no_charts)
    print(f"hami-sim plan: report in {args.out / 'report.md'}")
    for line in mig_table_rows(mig_summary(results)):
        print(f"  {line}")
    return 0


__all__ = ["MIG_VS_SLICES", "add_parser", "run"]
