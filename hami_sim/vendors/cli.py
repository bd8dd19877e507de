"""`hami-sim vendor-plugin`: one vendor device-plugin stand-in as a process (SIGTERM/SIGINT: stop).

The flags name the node, the kubelet directory, the kubeconfig and the fake devices (`--vendor`,
`--mode`, `--model`, `--count`, `--memory`, `--cores`, `--split`; what is left out is the product's
default, hami_sim.vendors.table). `plugin_config(argv)` reads the same flags for a host that runs the
stand-in in-process (hami_sim.nodehost), `vendor_argv` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("hami_sim.vendors")

_DEVICE_FLAGS = ("vendor", "mode", "model", "count", "memory", "cores", "split")


class ArgsError(ValueError):
    """Bad stand-in flags; the message names the flag and the value."""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", required=True, help="the Node whose devices this plugin serves")
    parser.add_argument(
        "--kubelet-dir",
        required=True,
        type=Path,
        help="the kubelet's device-plugin directory (kubelet.sock and the plugin sockets)",
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig of the API server")
    parser.add_argument("--vendor", required=True, help="the vendor (hygon, ascend, cambricon, ...)")
    parser.add_argument("--mode", default="", help="the plugin mode of a vendor with several")
    parser.add_argument("--model", default=None, help="the product (default: the vendor's first)")
    parser.add_argument("--count", type=int, default=None, help="devices (default: 1)")
    parser.add_argument("--memory", type=int, default=None, help="memory per device in MiB")
    parser.add_argument("--cores", type=int, default=None, help="cores per device (the vendor's unit)")
    parser.add_argument("--split", type=int, default=None, help="shares per device")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise ArgsError(message)


def plugin_config(argv: Sequence[str]) -> Any:
    """A `PluginConfig` from the stand-in's flags; `ArgsError` naming the bad flag."""
    from hami_sim.vendors.plugin import PluginConfig
    from hami_sim.vendors.table import SpecError, device_spec

    parser = _Parser(prog="hami-sim vendor-plugin", add_help=False)
    _add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(list(argv))
    data = {k: getattr(args, k) for k in _DEVICE_FLAGS if getattr(args, k) not in (None, "")}
    try:
        devices = device_spec(data)
    except SpecError as exc:
        raise ArgsError(f"--{exc}") from None
    return PluginConfig(args.node_name, args.kubelet_dir.resolve(), devices, args.kubeconfig)


def vendor_argv(node: str, kubelet_dir: Path, kubeconfig: Path, devices: Any) -> list[str]:
    """The flags of the stand-in for `devices` (a `DeviceSpec`) on `node`."""
    data = devices.to_data()
    argv = ["--node-name", node, "--kubelet-dir", str(kubelet_dir), "--kubeconfig", str(kubeconfig)]
    for key in _DEVICE_FLAGS:
        if key in data:
            argv += [f"--{key}", str(data[key])]
    return argv


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "vendor-plugin",
        help="run a vendor device-plugin stand-in (Ascend, Hygon, Cambricon, ...) for one node",
        description="Run the device-plugin stand-in of one vendor for one node: write the node "
        "inventory HAMi's scheduler reads, register the vendor's resources with the kubelet on "
        "KUBELET_DIR/kubelet.sock, and answer Allocate as the vendor's HAMi-mode plugin does "
        "(docs/vendor-nodes.md). SIGTERM stops it.",
    )
    _add_arguments(parser)
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
    from hami_sim.vendors.plugin import PluginConfig
    from hami_sim.vendors.table import SpecError, device_spec

    data = {k: getattr(args, k) for k in _DEVICE_FLAGS if getattr(args, k) not in (None, "")}
    try:
        devices = device_spec(data)
    except SpecError as exc:
        log.error("--%s", exc)
        return 2
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        log.error("--kubeconfig: no such file: %s", args.kubeconfig)
        return 2
    config = PluginConfig(args.node_name, args.kubelet_dir.resolve(), devices, args.kubeconfig)
    try:
        asyncio.run(_serve(config))
    except (OSError, TimeoutError) as exc:
        log.error("cannot run the %s plugin for node %s: %s", devices.vendor, args.node_name, exc)
        return 1
    return 0


async def _serve(config: Any) -> None:
    from hami_kube.errors import KubeApiError
    from hami_sim.vendors.plugin import VendorPlugin

    plugin = VendorPlugin(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await plugin.start()
    except KubeApiError as exc:
        raise OSError(f"the API server refused the node inventory: {exc}") from None
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        await plugin.stop()
