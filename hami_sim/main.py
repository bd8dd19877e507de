"""Entry point of `hami-sim`: one sub-command per local-cluster component."""

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each sub-command's module and the function that adds its parser (in `hami-sim --help`'s order). A
# command imports its own module only: a local cluster starts a process per component
# (`hami-sim kubelet`, `hami-sim scheduler`, ...), and each would otherwise import every other command
# too, the planner's numpy and the demo's client among them.
_COMMANDS: dict[str, tuple[str, str]] = {
    "apiserver": ("hami_sim.apiserver.cli", "add_parser"),
    "kubelet": ("hami_sim.kubelet.cli", "add_parser"),
    "scheduler": ("hami_sim.scheduler.cli", "add_parser"),
    "controller-manager": ("hami_sim.controllers.cli", "add_parser"),
    "service-proxy": ("hami_sim.cluster.cli", "add_parsers"),
    "up": ("hami_sim.cluster.cli", "add_parsers"),
    "down": ("hami_sim.cluster.cli", "add_parsers"),
    "status": ("hami_sim.cluster.cli", "add_parsers"),
    "nodes": ("hami_sim.nodehost", "add_parser"),
    "vendor-plugin": ("hami_sim.vendors.cli", "add_parser"),
    "demo": ("hami_sim.demo", "add_parser"),
    "chaos": ("hami_sim.chaos.cli", "add_parser"),
    "plan": ("hami_sim.plan.cli", "add_parser"),
}


def _adders(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The parsers to build: the named command's alone, or all of them (--help, a mistyped command)."""
    if argv and argv[0] in _COMMANDS:
        return [_COMMANDS[argv[0]]]
    return list(dict.fromkeys(_COMMANDS.values()))


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="hami-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module, function in _adders(args_list):
        getattr(importlib.import_module(module), function)(sub)
    args = parser.parse_args(args_list)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
