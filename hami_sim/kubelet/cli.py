"""`hami-sim kubelet`: run one kubelet stand-in as a process (SIGHUP: restart, SIGTERM/SIGINT: stop)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity

log = logging.getLogger("hami_sim.kubelet")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "kubelet",
        help="run a kubelet stand-in (device plugins, pod admission, node status)",
        description="Run the kubelet stand-in for one node: Registration on DIR/kubelet.sock, "
        "ListAndWatch, Allocate at pod admission, the device checkpoint, node capacity, the "
        "PodResources API on DIR/pod-resources/kubelet.sock, and kubelet's DRA manager (plugins "
        "registering in DIR/plugins_registry, claims prepared before containers start, CDI specs read "
        "from DIR/cdi). SIGHUP restarts it as kubelet restarts; SIGTERM stops it.",
    )
    parser.add_argument("--node-name", required=True, help="the Node this stand-in plays")
    parser.add_argument(
        "--dir",
        required=True,
        type=Path,
        help="device-plugin directory (plays /var/lib/kubelet/device-plugins)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig of the API server (omit: device manager only)"
    )
    parser.add_argument("--create-node", action="store_true", help="create the Node if it does not exist")
    parser.add_argument("--cpu", default="8", help="cpu capacity of a created Node (default: %(default)s)")
    parser.add_argument(
        "--memory", default="32Gi", help="memory capacity of a created Node (default: %(default)s)"
    )
    parser.add_argument(
        "--pods", default="110", help="pods capacity of a created Node (default: %(default)s)"
    )
    parser.add_argument(
        "--endpoint-stop-grace",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long a dead plugin's resource is kept before capacity drops to 0 (default: %(default)s)",
    )
    parser.add_argument(
        "--plugins-registry-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where DRA plugins put their registration sockets (default: DIR/plugins_registry)",
    )
    parser.add_argument(
        "--cdi-spec-dir",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="a CDI spec directory of the container runtime, lowest priority first; repeat for more "
        "(default: DIR/cdi)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random order kubelet walks device sets in (default: from the node name)",
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
    from hami_sim.kubelet.config import (
        MAX_SOCKET_PATH,
        POD_RESOURCES_DIR,
        POD_RESOURCES_SOCKET,
        KubeletConfig,
    )
    from hami_sim.kubelet.dra.checkpoint import DraCheckpointError

    for flag in ("cpu", "memory", "pods"):
        try:
            parse_quantity(getattr(args, flag))
        except QuantityError as exc:
            log.error("--%s: %s", flag, exc)
            return 2
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        log.error("--kubeconfig: no such file: %s", args.kubeconfig)
        return 2
    if args.create_node and args.kubeconfig is None:
        log.error("--create-node needs --kubeconfig")
        return 2
    socket = args.dir.resolve() / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET  # the longest socket path
    if len(str(socket)) > MAX_SOCKET_PATH:
        log.error(
            "--dir: %s is too long for Unix sockets (keep %s under %d characters)",
            args.dir,
            socket,
            MAX_SOCKET_PATH,
        )
        return 2
    try:
        config = KubeletConfig(
            node_name=args.node_name,
            directory=args.dir.resolve(),
            kubeconfig=args.kubeconfig,
            create_node=args.create_node,
            cpu=args.cpu,
            memory=args.memory,
            pods=args.pods,
            endpoint_stop_grace=args.endpoint_stop_grace,
            seed=args.seed,
            plugins_registry_dir=args.plugins_registry_dir.resolve() if args.plugins_registry_dir else None,
            cdi_spec_dirs=tuple(d.resolve() for d in args.cdi_spec_dir) if args.cdi_spec_dir else None,
        )
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    try:
        asyncio.run(_serve(config))
    except OSError as exc:
        log.error("cannot run the kubelet stand-in in %s: %s", args.dir, exc)
        return 1
    except DraCheckpointError as exc:
        log.error("cannot start the kubelet stand-in: %s", exc)
        return 1
    return 0


async def _serve(config: Any) -> None:
    from hami_sim.kubelet.standin import Kubelet

    kubelet = Kubelet(config)
    stop = asyncio.Event()
    restarts: asyncio.Queue[None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, restarts.put_nowait, None)
    await kubelet.start()
    log.info(
        "hami-sim kubelet ready: node %s, Registration on %s, PodResources on %s, DRA plugins in %s",
        config.node_name,
        config.kubelet_socket,
        config.pod_resources_socket,
        config.registry_dir,
    )
    try:
        while not stop.is_set():
            stopping = asyncio.ensure_future(stop.wait())
            restart = asyncio.ensure_future(restarts.get())
            await asyncio.wait({stopping, restart}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            restart.cancel()
            if restart.done() and not restart.cancelled():
                await kubelet.restart()
                log.info("hami-sim kubelet restarted: Registration on %s", config.kubelet_socket)
        log.info("stopping")
    finally:
        await kubelet.stop()
