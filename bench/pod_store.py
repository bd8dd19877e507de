"""hami-control's pod side in process, without HTTP or an API server, so its own CPU shows through a
noisy machine: the pods watch (CPU per pod event, memory kept per pod) and the scheduling decisions
(CPU of filter + prioritize + bind per pod).

The pods of `bench/extender.py`'s cluster (N nodes x 10 placed pods, 1-2 GPUs each, 50,000 pods at
N = 5,000) are fed as the pods reflector feeds them, pages of 500 decoded from JSON and dropped after,
into the pod store (`pod_store.PodStore`, which tells the GPU cache what each pod holds): one list, then
one MODIFIED event per pod (the same pod again, as after a status update). CPU is `process_time` per
pod, JSON decoding excluded, best of `--repeat` runs; memory is what stays allocated after both
(tracemalloc, a separate run, the cluster's nodes included), per pod.

Decisions: `--decisions` pending pods of the hard then of the typical kind (as in `bench/extender.py`),
then a tenth as many with two containers of 1 GPU x 8,000 MiB (a pod the GPU table does not cover, so
every candidate is fitted one by one: the GPU choices a cycle keeps count here), go through the real
`scheduling.Extender` and `binder.Binder` as kube-scheduler calls them (filter over kube-scheduler's
candidate window, prioritize when more than one node fits, bind to the best scored node not bound to
yet), request bodies as bytes; the Binding writer hands the bound pod straight back to the pods sink as
its MODIFIED event. CPU per decision (`process_time`, mean and median).

Every node named (`--every-node`, since issue 29): each verb's own CPU (`thread_time` around the call, the
answer written as the route sends it) with all N nodes in each request, first over an unchanged cluster
(a typical and a hard pod, as `bench/extender.py`'s latency rounds), then in decisions where each bind
changes a node (the hard pods, then the typical ones; prioritize gets the nodes that fit).

At commits before the pod store (4468d84 and earlier) the same script measures what was wired then
(`FanoutSink(PodCache, GPUPodSink)`, the extender's bind LRU and the binder's `AskSource`), so before
and after can be run from one copy of it.

    python bench/pod_store.py [--nodes 5000] [--repeat 3] [--decisions 300] [--every-node 200]
                              [--control-args FLAGS]
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import orjson
from benchlib import arg_parser, markdown_table
from extender import (  # the same cluster and pods as the extender benchmark
    HARD,
    TYPICAL,
    extender_args,
    node_name,
    node_object,
    pending_pod,
    scheduler_pod,
    seeded_pods,
)

from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, load_config
from hami_control.gpu_sinks import GPUNodeSink
from hami_sim.scheduler.fit import num_feasible_nodes_to_find

PAGE = 500


def pod_pages(nodes: int) -> list[bytes]:
    rng = random.Random(nodes)
    pods = [pod for i in range(nodes) for pod in seeded_pods(i, rng)]
    for k, pod in enumerate(pods):
        pod["metadata"]["uid"] = f"uid-{k:06d}"
        pod["metadata"]["resourceVersion"] = str(1000 + k)
    return [orjson.dumps(pods[i : i + PAGE]) for i in range(0, len(pods), PAGE)]


def pods_sink(config: ControlConfig, cache: ClusterCache) -> tuple[Any, str]:
    """The sink the pods reflector feeds, and what it is."""
    try:
        from hami_control.pod_store import PodStore

        return PodStore(config, cache), "PodStore"
    except ImportError:  # before the pod store
        from hami_control.gpu_sinks import FanoutSink, GPUPodSink  # type: ignore[attr-defined]
        from hami_control.pod_store import PodCache  # type: ignore[attr-defined]

        return FanoutSink(PodCache(config), GPUPodSink(cache)), "FanoutSink(PodCache, GPUPodSink)"


def feed(nodes: int, pages: list[bytes], memory: bool) -> tuple[float, float, int, str]:
    """(CPU per listed pod, CPU per MODIFIED event, bytes kept per pod, sink)."""
    config = ControlConfig()
    node_objects = [node_object(i) for i in range(nodes)]
    gc.collect()
    if memory:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if memory else 0
    cache = ClusterCache()  # the default resource names, at every commit
    GPUNodeSink(cache).replace(node_objects)
    sink, what = pods_sink(config, cache)
    count = 0
    decoding = 0.0
    started = time.process_time()
    sink.begin_replace()
    for raw in pages:
        began = time.process_time()
        page = orjson.loads(raw)
        decoding += time.process_time() - began
        count += len(page)
        sink.add_page(page)
    sink.end_replace()
    listed = time.process_time() - started - decoding
    decoding = 0.0
    started = time.process_time()
    for raw in pages:
        began = time.process_time()
        page = orjson.loads(raw)
        decoding += time.process_time() - began
        for pod in page:
            sink.apply("MODIFIED", pod)
    modified = time.process_time() - started - decoding
    del page
    kept = 0
    if memory:
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    return listed / count, modified / count, kept // count, what


class _Events:
    def record(self, *_: object) -> None:
        pass


class _Writer:
    """The Binding as the watch shows it next: the pod with its node, annotations and a new version."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.sink: Any = None
        self.version = 10**7

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Any) -> None:
        pod = self.pods[uid]
        self.version += 1
        meta = {**pod["metadata"], "annotations": dict(annotations), "resourceVersion": str(self.version)}
        self.sink.apply("MODIFIED", {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": node}})


def wired(config: ControlConfig, cache: ClusterCache, writer: _Writer) -> tuple[Any, Any]:
    """(pods sink, extender) wired as hami-control wires them."""
    from hami_control.binder import Binder
    from hami_control.scheduling import Extender

    sink, _ = pods_sink(config, cache)
    writer.sink = sink
    if hasattr(sink, "add_listener"):
        binder = Binder(cache, sink, writer, _Events(), node_lock=lambda _node: None)
        sink.add_listener(binder.pod_event)
        return sink, Extender(config, cache, sink, binder=binder)
    extender: Any = Extender(config, cache)  # before the pod store: the binder asked the extender back
    binder = Binder(cache, extender.pod_ask, writer, _Events(), node_lock=lambda _node: None)
    extender.binder = binder
    sink.sinks[1].hooks.append(binder.pod_event)
    return sink, extender


async def decide(
    extender: Any, sink: Any, writer: _Writer, names: list[str], count: int
) -> list[tuple[str, ...]]:
    """The decision loop for `count` pods of each kind; a table row per kind."""
    window = num_feasible_nodes_to_find(None, len(names))
    start = 0
    rows: list[tuple[str, ...]] = []
    used: set[str] = set()  # a node bound to once is passed over: the pending window never makes a bind wait
    for kind, ask, containers, pods_of_kind in (
        ("hard", HARD, 1, count),
        ("typical", TYPICAL, 1, count),
        ("two containers", TYPICAL, 2, max(1, count // 10)),
    ):
        pods = []
        for i in range(pods_of_kind):
            pod = pending_pod(f"{kind.replace(' ', '-')}-{i:05d}", "bench-bind", ask)
            first = pod["spec"]["containers"][0]
            pod["spec"]["containers"] = [{**first, "name": f"c{k}"} for k in range(containers)]
            writer.version += 1
            pod["metadata"].update(
                uid=f"{kind.replace(' ', '-')}-uid-{i:05d}", resourceVersion=str(writer.version)
            )
            pod["status"] = {"phase": "Pending"}
            sink.apply("ADDED", pod)
            writer.pods[pod["metadata"]["uid"]] = pod
            pods.append(pod)
        cpu: list[float] = []
        for pod in pods:
            candidates = [names[(start + i) % len(names)] for i in range(window)]
            start = (start + window) % len(names)
            began = time.process_time()
            fitting = extender.filter(extender_args(pod, orjson.dumps(candidates)))["NodeNames"] or []
            scores = [(name, 0) for name in fitting]
            if len(fitting) > 1:
                answer = extender.prioritize(extender_args(pod, orjson.dumps(fitting)))
                scores = [(entry["Host"], entry["Score"]) for entry in answer]
            ranked = sorted(range(len(scores)), key=lambda i: (-scores[i][1], i))
            target = next((scores[i][0] for i in ranked if scores[i][0] not in used), None)
            if target is None:
                raise SystemExit(f"{pod['metadata']['name']}: no node left that fits")
            meta = pod["metadata"]
            args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"]}
            result = await extender.bind(orjson.dumps({**args, "Node": target}))
            cpu.append(time.process_time() - began)
            if result["Error"]:
                raise SystemExit(f"bind of {meta['name']}: {result['Error']}")
            used.add(target)
        shape = f"{containers} x " if containers > 1 else ""
        rows.append(
            (
                f"{kind}, {shape}{ask[0]} GPU x {ask[1]} MiB",
                str(pods_of_kind),
                f"{window:,}",
                f"{statistics.fmean(cpu) * 1e6:,.0f} µs",
                f"{statistics.median(cpu) * 1e6:,.0f} µs",
            )
        )
    return rows


def _answer(extender: Any, verb: str, body: bytes) -> bytes:
    """The verb's answer as the route sends it (`<verb>_json` since issue 29; the object encoded before)."""
    written = getattr(extender, f"{verb}_json", None)
    if written is not None:
        return bytes(written(body))
    return orjson.dumps(getattr(extender, verb)(body))


async def every_node(
    extender: Any, sink: Any, writer: _Writer, names: list[str], count: int
) -> list[tuple[str, ...]]:
    """With every node named in each call: each verb's own CPU (`thread_time` around the call, the answer
    written as the route sends it), first for the same pod kind again and again over an unchanged cluster
    (the latency rounds), then in decisions (filter, prioritize of the nodes that fit, bind to the best
    scored node not bound to yet), where each bind changes a node."""
    names_json = orjson.dumps(names)
    rows: list[tuple[str, ...]] = []
    for kind, ask in (("typical", TYPICAL), ("hard", HARD)):
        cpu: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for i in range(count):
            body = extender_args(scheduler_pod(700_000 + i, ask), names_json)
            for verb in ("filter", "prioritize"):
                began = time.thread_time()
                _answer(extender, verb, body)
                cpu[verb].append(time.thread_time() - began)
        rows += [
            (f"{verb}, {kind}, cluster unchanged", f"{statistics.median(values) * 1e6:,.0f} µs")
            for verb, values in cpu.items()
        ]
    for kind, ask in (("hard", HARD), ("typical", TYPICAL)):
        used: set[str] = set()  # the kinds ask different GPU counts: never a bind behind the other's
        cpu = {"filter": [], "prioritize": [], "bind": []}
        for i in range(count):
            pod = pending_pod(f"every-{kind}-{i:05d}", "bench-bind", ask)
            writer.version += 1
            pod["metadata"].update(uid=f"every-{kind}-uid-{i:05d}", resourceVersion=str(writer.version))
            pod["status"] = {"phase": "Pending"}
            sink.apply("ADDED", pod)
            writer.pods[pod["metadata"]["uid"]] = pod
            began = time.thread_time()
            answer = _answer(extender, "filter", extender_args(pod, names_json))
            cpu["filter"].append(time.thread_time() - began)
            fitting = orjson.loads(answer)["NodeNames"] or []
            scores = [(name, 0) for name in fitting]
            if len(fitting) > 1:
                body = extender_args(pod, orjson.dumps(fitting))
                began = time.thread_time()
                answer = _answer(extender, "prioritize", body)
                cpu["prioritize"].append(time.thread_time() - began)
                scores = [(entry["Host"], entry["Score"]) for entry in orjson.loads(answer)]
            target, best = None, -1
            for host, score in scores:
                if score > best and host not in used:
                    target, best = host, score
            if target is None:  # the one node answered (--fragmentation-filter one) was bound to already:
                continue  # its bind would wait for a node daemon nobody plays here
            meta = pod["metadata"]
            args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"]}
            began = time.thread_time()
            result = await extender.bind(orjson.dumps({**args, "Node": target}))
            cpu["bind"].append(time.thread_time() - began)
            if result["Error"]:
                raise SystemExit(f"bind of {meta['name']}: {result['Error']}")
            used.add(target)
        rows += [
            (f"{verb}, {kind}, in decisions", f"{statistics.median(values) * 1e6:,.0f} µs")
            for verb, values in cpu.items()
            if values  # no /prioritize when one node is answered
        ]
    return rows


def decisions(
    nodes: int, pages: list[bytes], count: int, *, every: bool = False, flags: Sequence[str] = ()
) -> list[tuple[str, ...]]:
    """`flags`: hami-control's flags for its configuration (e.g. the fragmentation component's)."""
    config = (
        load_config(["--insecure-http", *flags], {}, lambda p: p.read_text()) if flags else ControlConfig()
    )
    cache = ClusterCache()  # the default resource names, at every commit
    GPUNodeSink(cache).replace([node_object(i) for i in range(nodes)])
    writer = _Writer()
    sink, extender = wired(config, cache, writer)
    sink.begin_replace()
    for raw in pages:
        sink.add_page(orjson.loads(raw))
    sink.end_replace()
    gc.collect()
    gc.freeze()  # as hami-control does once synced
    names = [node_name(i) for i in range(nodes)]
    if every:
        return asyncio.run(every_node(extender, sink, writer, names, count))
    return asyncio.run(decide(extender, sink, writer, names, count))


def main() -> int:
    parser = arg_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=300, help="pods decided per kind (0: none)")
    parser.add_argument(
        "--control-args", default="", help="hami-control flags for the --every-node table, space-separated"
    )
    parser.add_argument(
        "--every-node",
        type=int,
        default=200,
        help="requests per verb and pod kind with every node named (0: none)",
    )
    args = parser.parse_args()
    pages = pod_pages(args.nodes)
    runs = [feed(args.nodes, pages, memory=False) for _ in range(args.repeat)]
    listed = min(r[0] for r in runs)
    modified = min(r[1] for r in runs)
    _, _, kept, what = feed(args.nodes, pages, memory=True)
    pods = args.nodes * 10
    sink = (
        what,
        f"{pods:,}",
        f"{listed * 1e6:.1f} µs",
        f"{modified * 1e6:.1f} µs",
        f"{kept:,} B ({kept * pods / 1e6:.0f} MB)",
    )
    header = (
        "pods watch sink",
        "pods",
        "list, CPU per pod",
        "MODIFIED, CPU per event",
        "kept per pod (total)",
    )
    print("\n".join(markdown_table(header, "lrrrr", [sink])))
    if args.decisions > 0:
        print()
        header = ("decisions (pod)", "pods", "candidates", "CPU per decision, mean", "median")
        print("\n".join(markdown_table(header, "lrrrr", decisions(args.nodes, pages, args.decisions))))
    if args.every_node > 0:
        print()
        every = decisions(args.nodes, pages, args.every_node, every=True, flags=args.control_args.split())
        print("\n".join(markdown_table(("every node named: verb, pod, when", "CPU, median"), "lr", every)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
