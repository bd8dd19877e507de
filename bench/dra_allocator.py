"""The scheduler stand-in's structured allocator (kube-scheduler's DynamicResources Filter) in process: CPU
per node for a pod's claims on a node of 8 HAMi GPUs (80 GiB, 100 cores each, shareable, HAMi-DRA's
DeviceClass selector) holding 10 allocated shares, and the cost of one CEL selector evaluation.

Cases, each the median of `--repeat` timings of `--loops` calls, in this process's CPU time
(`time.process_time`: on a 2-core machine shared with other work the wall clock measures the neighbours;
`--clock wall` for perf_counter):

- floor: gathering the node's pools only (the index lookup every allocation starts with);
- 1 claim (4000 MiB + 30 cores) that fits, first call on a fresh inventory (cold: CEL compiled, each
  device's CEL variable built and its verdict cached) and later calls (warm: what every node after the
  first costs within one inventory version, and every later cycle);
- a pod of 10 such claims that fit together;
- 1 claim of 2 GPUs with `distinctAttribute` on the uuid;
- 1 claim that does not fit (every GPU's cores taken): the whole search fails;
- per pod over `--nodes` nodes: PreFilter (the allocator) plus Filter on every node, and the chosen
  node's allocation built (what Reserve writes; the other nodes' are never built);
- the same through the plugin's `AllocationMemo`, a pod of the same spec having been scheduled over the
  same unchanged nodes before (each node's outcome kept: the stand-in's shortcut, not upstream's).

CEL: one `compile_selector` of HAMi-DRA's class selector, the first evaluation on a device (its variable
and context built) and later ones (the evaluation only, no verdict cache).

    python bench/dra_allocator.py [--repeat 5] [--loops 200] [--nodes 100] [--clock cpu|wall] [--json FILE]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from benchlib import add_json_option, arg_parser, write_json

from hami_api import dra
from hami_sim.scheduler.dra.allocator import AllocatedState, AllocationMemo, Allocator
from hami_sim.scheduler.dra.inventory import Inventory, Slice
from hami_sim.scheduler.dra.selector import compile_selector

Json = dict[str, Any]
GPUS = 8
HELD = 10


def gpu(minor: int) -> Json:
    memory = "81920Mi"
    return {
        "name": dra.device_name(minor),
        "allowMultipleAllocations": True,
        "attributes": {
            dra.ATTR_TYPE: {"string": dra.DEVICE_TYPE},
            dra.ATTR_UUID: {"string": f"GPU-{minor:08d}-0000-0000-0000-000000000000"},
            dra.ATTR_MINOR: {"int": minor},
            dra.ATTR_PRODUCT_NAME: {"string": "NVIDIA-A100-SXM4-80GB"},
            dra.ATTR_DRIVER_VERSION: {"version": "550.54.15"},
        },
        "capacity": {
            dra.CAPACITY_MEMORY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
                },
            },
            dra.CAPACITY_CORES: {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
    }


def node_slice(node: str) -> Json:
    return {
        "metadata": {"name": f"{node}-{dra.DRIVER}", "resourceVersion": "1"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [gpu(i) for i in range(GPUS)],
        },
    }


CLASS = {
    "metadata": {"name": dra.DEVICE_CLASS},
    "spec": {"selectors": [{"cel": {"expression": dra.DEVICE_CLASS_SELECTOR}}]},
}


def claim(
    name: str, memory: str = "4000Mi", cores: str = "30", count: int = 1, distinct: bool = False
) -> Json:
    devices: Json = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": dra.DEVICE_CLASS,
                    "count": count,
                    "capacity": {"requests": {"memory": memory, "cores": cores}},
                },
            }
        ]
    }
    if distinct:
        devices["constraints"] = [{"requests": ["gpu"], "distinctAttribute": dra.qualified(dra.ATTR_UUID)}]
    return {"metadata": {"name": name, "namespace": "bench"}, "spec": {"devices": devices}}


def held_claims(node: str, cores: str, count: int = HELD) -> list[Json]:
    """`count` shares allocated on the node (the first GPUs first, as first fit leaves them)."""
    inventory = Inventory([node_slice(node)])
    state = AllocatedState()
    out = []
    for i in range(count):
        c = claim(f"{node}-held-{i}", cores=cores)
        outcome = Allocator([c], inventory, {dra.DEVICE_CLASS: CLASS}, state).allocate(node)
        assert outcome.allocations is not None, outcome.reason
        c = {**c, "status": {"allocation": outcome.allocations[0]}}
        state.add(c)
        out.append(c)
    return out


CLOCK: Callable[[], float] = time.process_time


def timed(fn: Callable[[], Any], loops: int, repeat: int) -> float:
    """Median seconds per call, by `CLOCK` (this process's CPU time unless --clock wall)."""
    samples = []
    for _ in range(repeat):
        start = CLOCK()
        for _ in range(loops):
            fn()
        samples.append((CLOCK() - start) / loops)
    return statistics.median(samples)


def allocator(claims: list[Json], inventory: Inventory, state: AllocatedState) -> Allocator:
    return Allocator(claims, inventory, {dra.DEVICE_CLASS: CLASS}, state, share_id=lambda: "share")


def run(repeat: int, loops: int, nodes: int) -> dict[str, float]:
    results: dict[str, float] = {}
    held = held_claims("n0", cores="30")
    state = AllocatedState.of(held)
    inventory = Inventory([node_slice("n0")])

    results["floor: gather the node's pools"] = timed(lambda: inventory.pools("n0"), loops, repeat)

    def cold() -> None:
        fresh = Inventory([node_slice("n0")])
        outcome = allocator([claim("p")], fresh, state).allocate("n0")
        assert outcome.allocations is not None

    results["1 claim, cold (fresh inventory, CEL per device)"] = timed(cold, max(loops // 10, 1), repeat)
    one = allocator([claim("p")], inventory, state)
    assert one.allocate("n0").allocations is not None
    results["1 claim, warm"] = timed(lambda: one.allocate("n0"), loops, repeat)
    ten = allocator([claim(f"p{i}") for i in range(10)], inventory, state)
    assert ten.allocate("n0").allocations is not None
    results["10 claims of one pod, warm"] = timed(lambda: ten.allocate("n0"), loops, repeat)
    two = allocator([claim("p", count=2, distinct=True)], inventory, state)
    assert two.allocate("n0").allocations is not None
    results["1 claim of 2 distinct GPUs, warm"] = timed(lambda: two.allocate("n0"), loops, repeat)
    full_state = AllocatedState.of(held_claims("n0", cores="100", count=GPUS))
    none = allocator([claim("p")], inventory, full_state)
    assert none.allocate("n0").allocations is None
    results["1 claim that fits nowhere (search exhausted), warm"] = timed(
        lambda: none.allocate("n0"), loops, repeat
    )

    names = [f"n{i}" for i in range(nodes)]
    many = Inventory([node_slice(n) for n in names])
    many_state = AllocatedState.of(c for n in names for c in held_claims(n, cores="30"))

    def pod_over_nodes() -> None:
        per_pod = allocator([claim("p")], many, many_state)
        outcomes = [per_pod.allocate(n) for n in names]
        assert outcomes[-1].allocations is not None  # the chosen node's allocation, built for Reserve

    pod_over_nodes()  # warm the verdict caches, as after the first pod
    results[f"1 pod over {nodes} nodes (PreFilter + Filter on each), warm"] = timed(
        pod_over_nodes, max(loops // nodes, 1), repeat
    )
    memo = AllocationMemo()

    def pod_over_unchanged_nodes() -> None:
        per_pod = Allocator(
            [claim("p")], many, {dra.DEVICE_CLASS: CLASS}, many_state, share_id=lambda: "share", memo=memo
        )
        outcomes = [per_pod.allocate(n) for n in names]
        assert outcomes[-1].allocations is not None

    pod_over_unchanged_nodes()  # the first pod of this spec searches every node
    results[f"1 pod over {nodes} nodes, the memo (a pod of the same spec before, nodes unchanged)"] = timed(
        pod_over_unchanged_nodes, max(loops // nodes, 1), repeat
    )

    selector = compile_selector(dra.DEVICE_CLASS_SELECTOR)
    results["CEL: compile the class selector"] = timed(
        lambda: compile_selector(dra.DEVICE_CLASS_SELECTOR), loops, repeat
    )
    devices = Slice.parse(node_slice("cel")).devices

    def first_eval() -> None:
        fresh = Slice.parse(node_slice("cel")).devices[0]
        assert selector.matches(fresh.view())

    results["CEL: first evaluation on a device (variable + context + eval, slice parse incl.)"] = timed(
        first_eval, loops, repeat
    )
    results["floor: parse a slice of 8 devices"] = timed(
        lambda: Slice.parse(node_slice("cel")), loops, repeat
    )
    view = devices[0].view()
    assert selector.matches(view)
    results["CEL: later evaluation"] = timed(lambda: selector.matches(view), loops * 10, repeat)
    return results


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    add_json_option(parser)
    args = parser.parse_args()
    global CLOCK  # noqa: PLW0603 - the one switch of a bench script
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    results = run(args.repeat, args.loops, args.nodes)
    width = max(len(k) for k in results)
    print(f"{'case'.ljust(width)}  µs per call")
    for name, seconds in results.items():
        print(f"{name.ljust(width)}  {seconds * 1e6:12.1f}")
    write_json(args.json, {k: v * 1e6 for k, v in results.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
