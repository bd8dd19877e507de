"""The long chaos runs: `hami-sim chaos` at 10,000 pods on 20 nodes (mixed mode, every fault kind), one
run per seed, each run's report written as JSON and text beside each other, and a table of the runs, for
docs/benchmarks.md and docs/reliability.md.

    python bench/chaos.py --out bench/results/chaos                      # 10,000 pods, seed 1
    python bench/chaos.py --pods 1000 --out /tmp/chaos-1k                # a medium run
    python bench/chaos.py --seed 90210 --random-seeds 3 --out /tmp/seeds  # 90210 and three random seeds

`--seed` may be given several times; `--random-seeds N` adds N seeds drawn at random from the system's
entropy (1 to 999,999), printed before the first run starts so that a failing one can be run again. The
runs go one after the other, each a fresh local cluster (`python -m hami_sim.main chaos`, its progress
on stderr). Every other `hami-sim chaos` flag passes through (`--rate`, `--mode`, `--faults`, ...).

The files are `<out>/chaos-seed<S>-<pods>.json` and `.txt` per run, and `<out>/seeds-<pods>.md` (the table:
seed, result, violations, pods lost with those the cluster had room for, time to Running per path and for
whole-GPU pods per path, duration) with `seeds-<pods>.json` beside it. The exit status is 0 only when every
run passed (no violation, no pod lost).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchlib import arg_parser, log, markdown_table, write_json

MAX_SEED = 999_999


def pick_seeds(fixed: Sequence[int], count: int, rng: random.Random | None = None) -> list[int]:
    """The fixed seeds in order, then `count` others drawn at random (none twice, none of the fixed)."""
    draw = rng or random.SystemRandom()
    seeds = list(dict.fromkeys(fixed))
    while len(seeds) < len(dict.fromkeys(fixed)) + count:
        seed = draw.randint(1, MAX_SEED)
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def _seconds(summary: Mapping[str, Any] | None) -> str:
    if not summary or not summary.get("count"):
        return "-"
    return f"{summary['p50Seconds']:.1f} / {summary['p99Seconds']:.1f} ({summary['count']})"


def summary_row(seed: int, report: Mapping[str, Any] | None, status: int) -> list[object]:
    """One line of the table from a run's JSON report (None: the run wrote none)."""
    if report is None:
        return [seed, f"no report (exit {status})", "-", "-", "-", "-", "-", "-", "-"]
    pods = report.get("pods") or {}
    times = report.get("timeToRunning") or {}
    by_path = times.get("byPath") or {}
    whole = times.get("wholeGpuByPath") or {}
    lost = int(pods.get("lost") or 0)
    return [
        seed,
        "PASS" if report.get("ok") else "FAIL",
        (report.get("violations") or {}).get("total", 0),
        f"{lost} ({pods.get('lostWithRoomAtEnd', 0)} with room)" if lost else "0",
        _seconds(by_path.get("device-plugin")),
        _seconds(by_path.get("dra")),
        _seconds(whole.get("device-plugin")),
        _seconds(whole.get("dra")),
        f"{report.get('durationSeconds', 0):.0f} s",
    ]


HEADER = (
    "seed",
    "result",
    "violations",
    "lost",
    "to Running, device plugin p50 / p99 s (pods)",
    "to Running, DRA",
    "whole GPUs, device plugin",
    "whole GPUs, DRA",
    "duration",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = arg_parser(__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results/chaos"), help="directory for the reports"
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument(
        "--seed",
        type=int,
        action="append",
        help="a seed to run (again for more; default: 1 without --random-seeds)",
    )
    parser.add_argument("--random-seeds", type=int, default=0, help="runs on this many seeds drawn at random")
    args, rest = parser.parse_known_args(argv)
    if args.random_seeds < 0:
        parser.error(f"--random-seeds: expected an integer >= 0, got {args.random_seeds}")
    fixed = args.seed if args.seed else ([] if args.random_seeds else [1])
    seeds = pick_seeds(fixed, args.random_seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    log(f"chaos runs of {args.pods} pods on seeds {', '.join(map(str, seeds))}")
    rows: list[list[object]] = []
    reports: dict[str, Any] = {}
    failed = False
    for i, seed in enumerate(seeds):
        stem = args.out / f"chaos-seed{seed}-{args.pods}"
        log(f"run {i + 1}/{len(seeds)}: seed {seed} -> {stem}.txt")
        command = [
            sys.executable, "-m", "hami_sim.main", "chaos",
            "--pods", str(args.pods),
            "--nodes", str(args.nodes),
            "--seed", str(seed),
            "--json", str(stem.with_suffix(".json")),
            "--text", str(stem.with_suffix(".txt")),
            *rest,
        ]  # fmt: skip
        status = subprocess.run(command, check=False).returncode
        try:
            report: dict[str, Any] | None = json.loads(stem.with_suffix(".json").read_text())
        except (OSError, ValueError):
            report = None
        failed = failed or status != 0 or report is None or not report.get("ok")
        reports[str(seed)] = report
        rows.append(summary_row(seed, report, status))
        log(f"seed {seed}: {rows[-1][1]}")
    table = markdown_table(HEADER, "rllrrrrrr", rows)
    summary = args.out / f"seeds-{args.pods}"
    summary.with_suffix(".md").write_text("\n".join(table) + "\n")
    write_json(summary.with_suffix(".json"), {"pods": args.pods, "seeds": seeds, "reports": reports})
    print("\n".join(table))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
