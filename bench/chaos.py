"""The long chaos run: `hami-sim chaos` at 10,000 pods on 20 nodes (mixed mode, every fault kind), with
its report written as JSON and text beside each other, for docs/benchmarks.md and docs/reliability.md.

    python bench/chaos.py --out bench/results/chaos            # 10,000 pods, seed 1
    python bench/chaos.py --pods 1000 --out /tmp/chaos-1k        # a medium run

Every `hami-sim chaos` flag passes through (`--seed`, `--rate`, `--mode`, `--faults`, ...). The files are
`<out>/chaos-seed<S>-<pods>.json` and `.txt`; the exit status is the run's (0: no violation, no pod lost).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hami_sim.main import main as hami_sim_main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results/chaos"), help="directory for the reports"
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args, rest = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"chaos-seed{args.seed}-{args.pods}"
    return hami_sim_main(
        [
            "chaos",
            "--pods", str(args.pods),
            "--nodes", str(args.nodes),
            "--seed", str(args.seed),
            "--json", str(stem.with_suffix(".json")),
            "--text", str(stem.with_suffix(".txt")),
            *rest,
        ]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
