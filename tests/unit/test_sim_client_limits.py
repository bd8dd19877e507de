"""The stand-ins' client-side rate limits default to those of the components they play (a stand-in on
client-go's 5 requests/s made the DRA path of bench/e2e.py 1.7 pods/s), and a flag lifts them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hami_sim.controllers import cli as controllers_cli
from hami_sim.scheduler import cli as scheduler_cli


def parser_of(module: object) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser()
    sub = root.add_subparsers(dest="command")
    parser: argparse.ArgumentParser = module.add_parser(sub)  # type: ignore[attr-defined]
    return parser


def test_the_controller_manager_defaults_to_kube_controller_managers_limits() -> None:
    args = parser_of(controllers_cli).parse_args(["--kubeconfig", "k"])
    assert (args.kube_api_qps, args.kube_api_burst) == (20.0, 30)
    lifted = parser_of(controllers_cli).parse_args(["--kubeconfig", "k", "--kube-api-qps", "0"])
    assert lifted.kube_api_qps == 0.0


def test_the_scheduler_takes_kube_schedulers_limit_flags() -> None:
    args = parser_of(scheduler_cli).parse_args(["--kube-api-qps", "0", "--kube-api-burst", "7"])
    assert (args.kube_api_qps, args.kube_api_burst) == (0.0, 7)
    assert parser_of(scheduler_cli).parse_args([]).kube_api_qps is None  # the stand-in's 50


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (controllers_cli, ["--kube-api-burst", "0"], "--kube-api-burst must be at least 1"),
        (controllers_cli, ["--kube-api-qps", "nan"], "--kube-api-qps must be a number"),
        (scheduler_cli, ["--kube-api-burst", "0"], "--kube-api-burst must be at least 1"),
        (scheduler_cli, ["--kube-api-qps", "nan"], "--kube-api-qps must be a number"),
    ],
)
def test_bad_limits_are_refused_naming_the_flag(
    module: object, argv: list[str], message: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    args = parser_of(module).parse_args(["--kubeconfig", str(kubeconfig), *argv])
    assert args.handler(args) == 2
    assert message in caplog.text
