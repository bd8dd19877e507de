"""Entry point of `hami-sim`: one sub-command per local-cluster component."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hami-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from hami_sim import demo, nodehost
    from hami_sim.apiserver import cli as apiserver_cli
    from hami_sim.chaos import cli as chaos_cli
    from hami_sim.cluster import cli as cluster_cli
    from hami_sim.controllers import cli as controllers_cli
    from hami_sim.kubelet import cli as kubelet_cli
    from hami_sim.plan import cli as plan_cli
    from hami_sim.scheduler import cli as scheduler_cli

    apiserver_cli.add_parser(sub)
    kubelet_cli.add_parser(sub)
    scheduler_cli.add_parser(sub)
    controllers_cli.add_parser(sub)
    cluster_cli.add_parsers(sub)
    nodehost.add_parser(sub)
    demo.add_parser(sub)
    chaos_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
