"""`hami-sim scheduler`: run the kube-scheduler stand-in as a process (SIGTERM/SIGINT: clean stop)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
from pathlib import Path
from typing import Any

log = logging.getLogger("hami_sim.scheduler")

DEFAULT_CONFIG = "daemonset/scheduler/kube-scheduler-config.yaml"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "scheduler",
        help="run a kube-scheduler stand-in that calls the HAMi extender",
        description="Run the kube-scheduler stand-in for one profile of a KubeSchedulerConfiguration: "
        "queue with backoff, own filters and least-allocated score, the extender's filter, prioritize "
        "and bind. SIGTERM/SIGINT stop it after in-flight binds.",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig of the API server (default: the file's clientConnection.kubeconfig, "
        "else the in-cluster service account)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(DEFAULT_CONFIG),
        help="KubeSchedulerConfiguration file (default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        default="hami-scheduler",
        help="schedulerName of the profile to run (default: %(default)s)",
    )
    parser.add_argument("--extender-url", metavar="URL", help="replace the extender's urlPrefix")
    parser.add_argument(
        "--extender-ca-file", metavar="FILE", type=Path, help="replace the extender's CA file"
    )
    parser.add_argument(
        "--max-in-flight-binds",
        type=int,
        default=16,
        metavar="N",
        help="binds running at once while the next pods are scheduled (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, help="seed for tie-breaking between equal nodes (default: random)"
    )
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        help="requests per second to the API server, client-side, as kube-scheduler's flag of that name "
        "(default: 50, kube-scheduler's; 0: no limit)",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=int,
        help="requests allowed at once above --kube-api-qps (default: 100, kube-scheduler's)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: %(default)s)",
    )
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hami_sim.scheduler.config import ConfigError, load_scheduler_config

    if args.max_in_flight_binds < 1:
        log.error("--max-in-flight-binds must be at least 1, got %d", args.max_in_flight_binds)
        return 2
    if args.kube_api_qps is not None and math.isnan(args.kube_api_qps):
        log.error("--kube-api-qps must be a number, got %s", args.kube_api_qps)
        return 2
    if args.kube_api_burst is not None and args.kube_api_burst < 1:
        log.error("--kube-api-burst must be at least 1, got %d", args.kube_api_burst)
        return 2
    if args.extender_ca_file is not None and not args.extender_ca_file.is_file():
        log.error("--extender-ca-file: no such file: %s", args.extender_ca_file)
        return 2
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        log.error("--kubeconfig: no such file: %s", args.kubeconfig)
        return 2
    try:
        config = load_scheduler_config(
            args.config,
            args.profile,
            extender_url=args.extender_url,
            extender_ca_file=str(args.extender_ca_file) if args.extender_ca_file is not None else None,
        )
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        return asyncio.run(_serve(config, args))
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130


async def _serve(config: Any, args: argparse.Namespace) -> int:
    from hami_kube.errors import KubeConfigError
    from hami_sim.scheduler.config import ConfigError
    from hami_sim.scheduler.standin import (
        KUBE_API_BURST,
        KUBE_API_QPS,
        SchedulerStandIn,
        SchedulerStartError,
    )

    standin = SchedulerStandIn(
        config,
        args.kubeconfig,
        seed=args.seed,
        max_in_flight_binds=args.max_in_flight_binds,
        kube_api_qps=KUBE_API_QPS if args.kube_api_qps is None else args.kube_api_qps,
        kube_api_burst=KUBE_API_BURST if args.kube_api_burst is None else args.kube_api_burst,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await standin.start()
    except (ConfigError, KubeConfigError, SchedulerStartError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info(
        "hami-sim scheduler ready: profile %s, extender %s",
        config.scheduler_name,
        ", ".join(e.url_prefix for e in config.extenders) or "none",
    )
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        await standin.stop()
    return 0
