"""`hami-sim up`, `hami-sim down`, `hami-sim status`: the local cluster from the command line.

Exit codes: 0 done; 1 a component failed (or, for status, something is not running or not ready);
2 bad input; 3 (status) no cluster in the state directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_CLUSTER = 3


def _state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".hami-sim"),
        metavar="DIR",
        help="where the cluster keeps its kubeconfig, cluster.json and logs (default: %(default)s)",
    )


def add_parsers(subparsers: Any) -> None:
    from hami_sim.cluster import service
    from hami_sim.cluster.spec import CLUSTER_MODES

    service.add_parser(subparsers)

    up = subparsers.add_parser(
        "up",
        help="start a local cluster (API server, hami-control, scheduler, nodes with fake GPUs)",
        description="Start a whole local cluster and return once every node is Ready with "
        "nvidia.com/gpu and known to hami-control; the processes keep running (stop them with "
        "`hami-sim down`). Then: kubectl --kubeconfig DIR/kubeconfig get nodes.",
    )
    _state_dir(up)
    up.add_argument(
        "--nodes", type=int, default=2, metavar="N", help="number of nodes (default: %(default)s)"
    )
    up.add_argument(
        "--gpus-per-node", type=int, default=4, metavar="G", help="fake GPUs per node (default: %(default)s)"
    )
    up.add_argument(
        "--gpu-model",
        default="NVIDIA A100-SXM4-80GB",
        metavar="MODEL",
        help="model of the fake GPUs (default: %(default)s)",
    )
    up.add_argument(
        "--gpu-memory",
        type=int,
        default=0,
        metavar="MIB",
        help="memory per GPU in MiB (default: from the model name, e.g. 80GB -> 81920)",
    )
    up.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help="YAML/JSON mapping each node name to its GPUs (mixed models, links between them) or to another "
        "vendor's devices ({vendor: ascend, model: 910B4, count: 8}; docs/vendor-nodes.md); replaces "
        "--nodes, --gpus-per-node, --gpu-model and --gpu-memory",
    )
    up.add_argument(
        "--split", type=int, default=10, metavar="N", help="vGPUs per GPU (hami-node --device-split-count; "
        "default: %(default)s)"
    )  # fmt: skip
    up.add_argument(
        "--policy",
        metavar="NODE[/GPU]",
        help="scheduling policies for hami-control: NODE is binpack or spread; GPU is binpack, spread, "
        "topology-aware, numa, mutex or a comma chain (one word alone sets the node policy)",
    )
    scale = up.add_mutually_exclusive_group()
    scale.add_argument(
        "--scale",
        dest="scale",
        action="store_true",
        default=None,
        help="all kubelets in one process and all hami-node daemons in another (default above 8 nodes)",
    )
    scale.add_argument(
        "--no-scale", dest="scale", action="store_false", help="one process per kubelet and per daemon"
    )
    up.add_argument(
        "--scheduler-config",
        type=Path,
        metavar="FILE",
        help="KubeSchedulerConfiguration for the scheduler stand-in "
        "(default: daemonset/scheduler/kube-scheduler-config.yaml)",
    )
    up.add_argument(
        "--control-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more hami-control argument, e.g. --control-arg=--bind-wait-timeout=20 (repeatable)",
    )
    up.add_argument(
        "--control-replicas",
        type=int,
        default=1,
        metavar="N",
        help="hami-control replicas (default: %(default)s); above 1 each runs with --leader-elect behind a "
        "Service-like proxy on the control URL that sends to the leader",
    )
    up.add_argument(
        "--node-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more hami-node argument for every node, e.g. --node-arg=--health-recovery-seconds=3",
    )
    up.add_argument(
        "--scheduler-arg", action="append", default=[], metavar="ARG", help="one more scheduler argument"
    )
    up.add_argument(
        "--controller-manager-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more controller-manager argument (DRA nodes), e.g. --controller-manager-arg=--workers=8",
    )
    up.add_argument(
        "--mode",
        choices=CLUSTER_MODES,
        default="device-plugin",
        help="how the nodes serve their GPUs: device-plugin (the scheduler extender), dra (ResourceSlices "
        "and claims, allocated by the scheduler itself), or mixed (every second node in DRA mode) "
        "(default: %(default)s)",
    )
    up.add_argument(
        "--apiserver-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more API server argument, e.g. --apiserver-arg=--feature-gates=DRAConsumableCapacity=false",
    )
    up.add_argument(
        "--node-cpu", default="8", metavar="Q", help="cpu capacity of each Node (default: %(default)s)"
    )
    up.add_argument(
        "--node-memory",
        default="32Gi",
        metavar="Q",
        help="memory capacity of each Node (default: %(default)s)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="how long to wait for it all (default: 60 + 0.5 per node)",
    )
    up.add_argument(
        "--no-node-metrics",
        dest="node_metrics",
        action="store_false",
        help="no health endpoint (/metrics, /healthz, /readyz) for the node daemons (by default each has "
        "one on a free port of 127.0.0.1; `hami-sim status -o wide` lists them)",
    )
    up.add_argument(
        "--monitoring",
        action="store_true",
        help="also start Prometheus (the `prometheus` on PATH) scraping the cluster as the install's "
        "PodMonitors do, with the install's alerting and recording rules; prints its address",
    )
    up.add_argument(
        "--monitoring-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="Prometheus's scrape and rule evaluation interval with --monitoring (default: %(default)s)",
    )
    up.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    up.set_defaults(handler=run_up)

    down = subparsers.add_parser(
        "down",
        help="stop the local cluster",
        description="Stop every process of the local cluster (SIGTERM, then SIGKILL after --grace) and "
        "remove its sockets and state files; the logs stay.",
    )
    _state_dir(down)
    down.add_argument(
        "--grace", type=float, default=10.0, metavar="SECONDS", help="SIGTERM grace (default: %(default)s)"
    )
    down.set_defaults(handler=run_down)

    status = subparsers.add_parser(
        "status",
        help="show the local cluster's processes and nodes",
        description="Print each component with its pid, whether it is alive, its port and log, then "
        "node readiness. Exit 0 when everything runs and every node is ready, 1 otherwise, 3 when "
        "there is no cluster.",
    )
    _state_dir(status)
    status.add_argument("--all-nodes", action="store_true", help="list every node even in a big cluster")
    status.add_argument(
        "-o",
        "--output",
        choices=["wide"],
        help="wide: also each node daemon's /metrics URL (its health endpoint on 127.0.0.1)",
    )
    status.set_defaults(handler=run_status)


def _progress(quiet: bool) -> Any:
    def say(message: str) -> None:
        if not quiet:
            print(f"hami-sim: {message}", file=sys.stderr, flush=True)

    return say


def _error(message: str) -> None:
    print(f"hami-sim: {message}", file=sys.stderr, flush=True)


def run_up(args: argparse.Namespace) -> int:
    from hami_sim.cluster.cluster import Cluster, ClusterError
    from hami_sim.cluster.spec import ClusterSpec, GPUSpec, NodeSpec, SpecError, load_inventory_spec

    node_policy = gpu_policy = None
    if args.policy is not None:
        node_policy, _, gpu_policy_text = args.policy.partition("/")
        gpu_policy = gpu_policy_text or None
        if not node_policy:
            _error(f"--policy: expected NODE[/GPU], got {args.policy!r}")
            return EXIT_USAGE
    if args.scheduler_config is not None and not args.scheduler_config.is_file():
        _error(f"--scheduler-config: no such file: {args.scheduler_config}")
        return EXIT_USAGE
    options: dict[str, Any] = {
        "split": args.split,
        "node_scheduler_policy": node_policy,
        "gpu_scheduler_policy": gpu_policy,
        "scale": args.scale,
        "scheduler_config": args.scheduler_config.resolve() if args.scheduler_config else None,
        "control_args": tuple(args.control_arg),
        "control_replicas": args.control_replicas,
        "node_args": tuple(args.node_arg),
        "scheduler_args": tuple(args.scheduler_arg),
        "controller_manager_args": tuple(args.controller_manager_arg),
        "apiserver_args": tuple(args.apiserver_arg),
        "node_cpu": args.node_cpu,
        "node_memory": args.node_memory,
        "timeout_s": args.timeout,
        "node_metrics": args.node_metrics,
        "monitoring": args.monitoring,
        "monitoring_interval_s": args.monitoring_interval,
    }
    try:
        if args.inventory is not None:
            spec = ClusterSpec(load_inventory_spec(args.inventory), **options)
        else:
            if args.nodes < 1:
                raise SpecError(f"--nodes: expected an integer >= 1, got {args.nodes}")
            if args.gpus_per_node < 1:
                raise SpecError(f"--gpus-per-node: expected an integer >= 1, got {args.gpus_per_node}")
            if args.gpu_memory < 0:
                raise SpecError(f"--gpu-memory: expected a positive number of MiB, got {args.gpu_memory}")
            gpu = GPUSpec(args.gpu_model, args.gpu_memory)
            nodes = tuple(
                NodeSpec(f"gpu-node-{i}", (gpu,) * args.gpus_per_node) for i in range(1, args.nodes + 1)
            )
            spec = ClusterSpec(nodes, **options)
        if args.mode != "device-plugin":
            spec = spec.with_mode(args.mode)
    except SpecError as exc:
        _error(str(exc))
        return EXIT_USAGE
    try:
        cluster = Cluster.up(spec, args.state_dir, progress=_progress(args.quiet))
    except ClusterError as exc:
        _error(f"up failed: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        _error("interrupted; everything started was stopped")
        return 130
    if not args.quiet:
        print(f"export KUBECONFIG={cluster.kubeconfig}", file=sys.stderr)
        if cluster.spec.monitoring:
            print(f"Prometheus: {cluster.prometheus_url}", file=sys.stderr)
    return 0


def run_down(args: argparse.Namespace) -> int:
    from hami_sim.cluster.cluster import Cluster, ClusterError, NoCluster

    try:
        cluster = Cluster.load(args.state_dir, progress=_progress(False))
    except NoCluster as exc:
        _error(str(exc))
        return 0
    except ClusterError as exc:
        _error(str(exc))
        return EXIT_FAILED
    try:
        cluster.down(args.grace)
    except ClusterError as exc:
        _error(f"down failed: {exc}")
        return EXIT_FAILED
    return 0


def run_status(args: argparse.Namespace) -> int:
    from hami_sim.cluster.cluster import Cluster, ClusterError, NoCluster

    try:
        cluster = Cluster.load(args.state_dir)
    except NoCluster as exc:
        _error(str(exc))
        return EXIT_NO_CLUSTER
    except ClusterError as exc:
        _error(str(exc))
        return EXIT_FAILED
    status = cluster.status()
    print(
        f"cluster in {cluster.state_dir}: {cluster.spec.describe()}"
        + (" (scale mode)" if cluster.spec.scale_mode else "")
    )
    print(status.render(all_nodes=args.all_nodes, wide=args.output == "wide"))
    return 0 if status.ok else EXIT_FAILED
