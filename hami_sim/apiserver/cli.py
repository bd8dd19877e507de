"""`hami-sim apiserver`: run the stand-in API server as a process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hami_sim.apiserver.kubeconfig import write_kubeconfig
from hami_sim.apiserver.resource_v1 import FeatureGates

if TYPE_CHECKING:
    from hami_sim.apiserver.faults import FaultConfig

log = logging.getLogger("hami_sim.apiserver")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "apiserver",
        help="run the in-memory Kubernetes API server",
        description="Run the in-memory stand-in for kube-apiserver on plain HTTP "
        "(no TLS, any bearer token accepted).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on; 0 picks a free one")
    parser.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig for the server to FILE")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: %(default)s)",
    )
    parser.add_argument("--history", type=int, default=10_000, help="watch events kept per resource")
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="GATES",
        help="kube-apiserver's feature gates that change what resource.k8s.io/v1 stores, e.g. "
        "DRAConsumableCapacity=false (default: 1.36's: DRAConsumableCapacity, DRADeviceTaints and "
        "DRAPrioritizedList on)",
    )
    parser.add_argument(
        "--faults",
        metavar="FILE",
        help='fault-injection rules to start with, YAML or JSON: {"seed": 1, "rules": [...]} as '
        "PUT /hami-sim/faults takes them (docs/apiserver.md, Fault injection)",
    )
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port <= 65535:
        log.error("--port must be between 0 and 65535, got %d", args.port)
        return 2
    if args.history < 1:
        log.error("--history must be at least 1, got %d", args.history)
        return 2
    try:
        args.gates = FeatureGates.parse(args.feature_gates)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    try:
        args.fault_config = _load_faults(args.faults) if args.faults else None
    except ValueError as exc:
        log.error("--faults %s: %s", args.faults, exc)
        return 2
    try:
        asyncio.run(_serve(args))
    except OSError as exc:
        log.error("cannot serve on %s:%d: %s", args.host, args.port, exc)
        return 1
    return 0


def _load_faults(path: str) -> FaultConfig:
    """The rules in FILE (YAML, or JSON as YAML reads it); ValueError saying what is wrong."""
    import yaml

    from hami_sim.apiserver.faults import parse_config

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML or JSON: {exc}") from None
    return parse_config({} if body is None else body)


async def _serve(args: argparse.Namespace) -> None:
    from hami_sim.apiserver.runner import start_site
    from hami_sim.apiserver.server import ApiServer

    server = ApiServer(history_size=args.history, feature_gates=args.gates, faults=args.fault_config)
    runner, port = await start_site(server, args.host, args.port)
    url = f"http://{args.host}:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.kubeconfig_out:
            write_kubeconfig(args.kubeconfig_out, url)
        log.info(
            "hami-sim apiserver ready at %s%s",
            url,
            f" (kubeconfig: {args.kubeconfig_out})" if args.kubeconfig_out else "",
        )
        await stop.wait()
        log.info("stopping")
    finally:
        await server.close()
        await runner.cleanup()
