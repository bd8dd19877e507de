"""`hami-sim controller-manager`: the kube-controller-manager stand-in (the ResourceClaim controller,
which the local cluster runs for DRA pods)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
from pathlib import Path
from typing import Any

from hami_sim.controllers import WORKERS

log = logging.getLogger(__name__)

USER_AGENT_COMPONENT = "hami-sim-controller-manager"
"""The component name in the User-Agent of the controller-manager stand-in's API calls."""
KUBE_API_QPS = 20.0
KUBE_API_BURST = 30
"""kube-controller-manager's client-side rate limit (`--kube-api-qps`, `--kube-api-burst`; its defaults in
pkg/controller/apis/config/v1alpha1/defaults.go), not client-go's 5 and 10."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "controller-manager",
        help="run the kube-controller-manager stand-in (ResourceClaim controller)",
        description="Create pods' ResourceClaims from their templates, release reservations of pods that "
        "are done or gone, deallocate and delete claims no longer used, as kube-controller-manager's "
        "resourceclaim controller (and its garbage collector, for generated claims).",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig of the API server")
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="concurrent syncs, as kube's (default: %(default)s)"
    )
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=KUBE_API_QPS,
        help="requests per second to the API server, client-side, as kube-controller-manager "
        "(default: %(default)s; 0: no limit)",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=int,
        default=KUBE_API_BURST,
        help="requests allowed at once above --kube-api-qps (default: %(default)s)",
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
    if not args.kubeconfig.is_file():
        log.error("--kubeconfig: no such file: %s", args.kubeconfig)
        return 2
    if args.workers < 1:
        log.error("--workers must be at least 1, got %d", args.workers)
        return 2
    if math.isnan(args.kube_api_qps):
        log.error("--kube-api-qps must be a number, got %s", args.kube_api_qps)
        return 2
    if args.kube_api_burst < 1:
        log.error("--kube-api-burst must be at least 1, got %d", args.kube_api_burst)
        return 2
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 130


async def _serve(args: argparse.Namespace) -> int:
    from hami_kube.client import KubeApi, component_user_agent
    from hami_kube.errors import KubeConfigError
    from hami_sim.controllers.resourceclaim import ResourceClaimController

    try:
        api = await KubeApi.connect(
            args.kubeconfig,
            qps=args.kube_api_qps,
            burst=args.kube_api_burst,
            user_agent=component_user_agent(USER_AGENT_COMPONENT),
        )
    except KubeConfigError as exc:
        log.error("cannot start: %s", exc)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    controller = ResourceClaimController(api, workers=args.workers)
    try:
        await controller.start()
        log.info("hami-sim controller-manager ready (resourceclaim controller)")
        await stop.wait()
        log.info("stopping")
    except TimeoutError:
        log.error("cannot start: the API server did not answer the first lists in time")
        return 1
    finally:
        await controller.stop()
        await api.close()
    return 0
