"""Speed of `hami-sim plan` on Alibaba's OpenB trace (read from ../shared/data/openb, never copied).

For each policy: the workload-inflation experiment to 130% of the 6,212 GPUs (~10,800 tasks drawn from
the 8,152 of the default list) and the time replay of the 8,152 tasks, both in this process, seed 42.

The floor, in the same run: the extender's own vectorised filter (`gputable.simple_ask` +
`gputable.evaluate`, what every placement starts with) for each GPU task of the default list once, on
the empty cluster, nothing placed. What a policy costs above it is scoring, `fit_pod` on the chosen
node and the bookkeeping.

    python bench/plan.py [--data DIR] [--policies binpack,fragmentation]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from benchlib import arg_parser, markdown_header, markdown_row

from hami_api.resources import ContainerRequest
from hami_control.fit import NO_SELECTOR
from hami_control.gputable import evaluate, simple_ask
from hami_sim.plan.engine import POLICIES, Cluster
from hami_sim.plan.experiments import inflation, replay, workload_mix
from hami_sim.plan.inputs import NodeSpec, Task, read_nodes, read_pods_csv

ROOT = Path(__file__).resolve().parents[1]
DATA = next(
    (p for p in (ROOT.parent / "shared/data/openb", ROOT.parent.parent / "shared/data/openb") if p.exists()),
    ROOT.parent / "shared/data/openb",
)
"""../shared/data/openb from the repository (or from a worktree one level deeper)."""


def floor(nodes: Sequence[NodeSpec], tasks: Sequence[Task]) -> float:
    cluster = Cluster(nodes, workload_mix(tasks), POLICIES["binpack"], 42)
    order = np.random.default_rng(42).permutation(len(tasks))
    start = time.perf_counter()
    for i in order:
        t = tasks[i]
        if t.num_gpu:
            req = ContainerRequest(t.num_gpu, 0, t.share // 10, t.share // 10)
            ask = simple_ask(cluster.table, ((req, False),), NO_SELECTOR, POLICIES["binpack"].gpu, None)
            assert ask is not None
            evaluate(cluster.table, cluster.rows, ask)
    return time.perf_counter() - start


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    node_file = args.data / "openb_node_list_gpu_node.csv"
    if not node_file.exists():
        print(f"bench/plan.py: no OpenB data under {args.data}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    nodes = read_nodes(node_file)
    tasks = read_pods_csv(args.data / "openb_pod_list_default.csv")
    print(f"read {len(nodes)} nodes, {len(tasks)} tasks in {time.perf_counter() - t0:.2f} s")
    print(f"floor (vectorised filter of each task, nothing placed): {floor(nodes, tasks):.2f} s")
    print("\n".join(markdown_header(("policy", "inflation to 130% (tasks, s)", "replay (tasks, s)"), "lll")))
    for policy in args.policies.split(","):  # a row as each policy is done
        inf = inflation(nodes, tasks, policy, 42)
        rep = replay(nodes, tasks, policy, 42)
        print(markdown_row((policy, f"{inf.tasks}, {inf.seconds:.1f}", f"{rep.tasks}, {rep.seconds:.1f}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
