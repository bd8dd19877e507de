"""The edge of `kubectl hami` (the `kubectl-hami` console script, a kubectl plugin) and `hami-control status`.

    kubectl hami top [--node NODE] [-n NAMESPACE] [-o wide|json|yaml]
    kubectl hami explain pod NAME [-n NAMESPACE] [-o json|yaml]
    kubectl hami quota [-n NAMESPACE] [-o json|yaml]
    common flags: --kubeconfig FILE, --context NAME, --request-timeout SECONDS,
                  --device-config-file FILE, --enable-ascend, --enable-iluvatar

kubectl runs an executable named `kubectl-hami` found on PATH for `kubectl hami ...`, handing it the
arguments after `hami` and its own environment (so $KUBECONFIG); kubectl's own flags must therefore come
after `hami`. The cluster is read through `hami_kube` (the kubeconfig given, else $KUBECONFIG, else the
in-cluster service account), read-only: one paged list per resource (nodes, pods, ResourceQuotas, and
resource.k8s.io/v1 ResourceSlices and ResourceClaims when the cluster serves them), then the pure
models of `top`, `explain` and `quotas`. Numbers come from hami-control's own stores with its default
settings (resource names `nvidia.com/*`, memory factor 1, scheduler name hami-scheduler), and every other
vendor hami-control schedules by default (the chart's device config, Ascend and Iluvatar off); the
vendor flags are hami-control's own (`--device-config-file`, `--enable-ascend`, `--enable-iluvatar`), to
see a cluster as an install configured so sees it.

Exit codes: 0 done; 1 the cluster cannot be read or the pod/node does not exist (one line on stderr
naming the kubeconfig, server or object); 2 bad flags. Never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

from hami_api.settings import ConfigError
from hami_control.config import ControlConfig, DeviceSettings
from hami_control.status.explain import build_explanation, explanation_dict, render_explanation
from hami_control.status.quotas import build_quota, quota_dict, render_quota
from hami_control.status.snapshot import Snapshot
from hami_control.status.top import UnknownNode, build_top, render_top, top_dict
from hami_kube.client import JSONDict, KubeApi, component_user_agent
from hami_kube.config import context_namespace
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.reflector import ListSink, Reflector

COMPONENT = "kubectl-hami"
DRA_PATHS = {
    "slices": "/apis/resource.k8s.io/v1/resourceslices",
    "claims": "/apis/resource.k8s.io/v1/resourceclaims",
}
_OPTIONAL = (403, 404)
"""Statuses that leave a resource out instead of failing: the cluster does not serve it (DRA before
1.34) or the user may not list it (ResourceQuotas, claims); a line on stderr says so."""


class Failure(Exception):
    """What to tell the user on one line before exiting 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser(prog: str) -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    common.add_argument("--context", help="kubeconfig context (default: its current-context)")
    common.add_argument(
        "--request-timeout", type=float, default=30.0, metavar="SECONDS", help="per API call (default: 30)"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log what the stores skip (to stderr)")
    common.add_argument(
        "--device-config-file",
        type=Path,
        metavar="FILE",
        help="HAMi's device-config.yaml, as hami-control is given it (default: the chart's values)",
    )
    common.add_argument("--enable-ascend", action="store_true", help="count Huawei Ascend NPUs too")
    common.add_argument("--enable-iluvatar", action="store_true", help="count Iluvatar GPUs too")
    parser = _Parser(
        prog=prog,
        description=(
            "What hami-control sees of a cluster: GPU and device usage of every vendor, why a pod is "
            "pending, GPU and device quotas."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    top = sub.add_parser(
        "top", parents=[common], help="per node and device: slices, memory, cores, health, vendor, pods"
    )
    top.add_argument("--node", help="only this node")
    top.add_argument(
        "-n", "--namespace", help="only GPUs and devices holding pods of this namespace (and only those pods)"
    )
    top.add_argument("-o", "--output", choices=("wide", "json", "yaml"), help="output format")
    explain = sub.add_parser("explain", parents=[common], help="why a pod is pending, or where it runs")
    explain.add_argument("kind", choices=("pod", "pods", "po"), help="pod")
    explain.add_argument("name", help="the pod's name")
    explain.add_argument(
        "-n", "--namespace", default=None, help="the pod's namespace (default: the context's, else default)"
    )
    explain.add_argument("-o", "--output", choices=("json", "yaml"), help="output format")
    quota = sub.add_parser(
        "quota", parents=[common], help="per namespace: GPU and vendor device quotas, hard vs used"
    )
    quota.add_argument("-n", "--namespace", help="only this namespace")
    quota.add_argument("-o", "--output", choices=("json", "yaml"), help="output format")
    return parser


# --- reading -----------------------------------------------------------------------------------------------


async def list_all(api: KubeApi, path: str, params: dict[str, str] | None = None) -> list[JSONDict]:
    """Every object of a list (paged as hami-control's reflectors list: `Reflector.list`)."""
    items: list[JSONDict] = []

    def keep(listed: Sequence[JSONDict]) -> None:
        items.extend(listed)

    def ignore(kind: str, obj: JSONDict) -> None:  # a single list never watches
        del kind, obj

    await Reflector(api, path, path, ListSink(keep, ignore), params=params).list()
    return items


async def _optional(api: KubeApi, path: str, warnings: list[str]) -> list[JSONDict]:
    try:
        return await list_all(api, path)
    except KubeApiError as err:
        if err.status not in _OPTIONAL:
            raise
        if err.status == 403:
            warnings.append(f"cannot list {path} ({err}); left out")
        return []


async def read_snapshot(api: KubeApi, config: ControlConfig, warnings: list[str]) -> Snapshot:
    nodes, pods, quotas, slices, claims = await asyncio.gather(
        list_all(api, "/api/v1/nodes"),
        list_all(api, "/api/v1/pods"),
        _optional(api, "/api/v1/resourcequotas", warnings),
        _optional(api, DRA_PATHS["slices"], warnings),
        _optional(api, DRA_PATHS["claims"], warnings),
    )
    return Snapshot.of(config, nodes, pods, quotas, slices, claims)


async def read_pod(api: KubeApi, namespace: str, name: str) -> tuple[JSONDict, list[JSONDict]]:
    """The pod and its Events. Raises `Failure` when it does not exist."""
    try:
        pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except KubeApiError as err:
        if err.not_found:
            raise Failure(f'pod "{name}" not found in namespace "{namespace}"') from None
        raise
    try:
        events = await list_all(
            api, f"/api/v1/namespaces/{namespace}/events", {"fieldSelector": f"involvedObject.name={name}"}
        )
    except KubeApiError:
        events = []  # events are a help, not a need
    uid = (pod.get("metadata") or {}).get("uid")
    mine = [
        e
        for e in events
        if (e.get("involvedObject") or {}).get("kind") in (None, "Pod")
        and (not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid))
    ]
    return pod, mine


def with_devices(config: ControlConfig, args: argparse.Namespace) -> ControlConfig:
    """`config` with the vendor flags given (the device config file read and checked as hami-control
    checks it at start-up). Raises `Failure` naming the file, key and line."""
    path: Path | None = args.device_config_file
    if path is None and not args.enable_ascend and not args.enable_iluvatar:
        return config
    given = config.devices
    devices = DeviceSettings(
        path or given.config_file,
        args.enable_ascend or given.enable_ascend,
        args.enable_iluvatar or given.enable_iluvatar,
    )
    text = config.device_config_text
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise Failure(f"device config {path}: cannot be read: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise Failure(f"device config {path}: not UTF-8 text: {err.reason}") from None
    configured = dataclasses.replace(config, devices=devices, device_config_text=text)
    try:
        configured.registry  # noqa: B018 (built and checked here, as hami-control does at start-up)
    except ConfigError as err:
        raise Failure(str(err)) from None
    return configured


def _emit(data: dict[str, Any], output: str | None, text: str) -> None:
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        print(text)


async def _run(args: argparse.Namespace, config: ControlConfig) -> int:
    try:
        namespace = ""
        if args.command == "explain":
            namespace = args.namespace or context_namespace(args.kubeconfig, context=args.context)
        api = await KubeApi.connect(
            args.kubeconfig,
            context=args.context,
            request_timeout_s=args.request_timeout,
            max_retries=1,
            user_agent=component_user_agent(COMPONENT),
        )
    except KubeConfigError as err:
        raise Failure(str(err)) from None
    warnings: list[str] = []
    try:
        if args.command == "explain":
            pod, events = await read_pod(api, namespace, args.name)
            snapshot = await read_snapshot(api, config, warnings)
            explanation = build_explanation(snapshot, pod, events)
            _emit(explanation_dict(explanation), args.output, render_explanation(explanation))
        else:
            snapshot = await read_snapshot(api, config, warnings)
            if args.command == "top":
                try:
                    top = build_top(snapshot, node=args.node, namespace=args.namespace)
                except UnknownNode as err:
                    raise Failure(str(err)) from None
                text = render_top(top, wide=args.output == "wide")
                _emit(top_dict(top), args.output if args.output != "wide" else None, text)
            else:
                rows = build_quota(snapshot, args.namespace)
                _emit(quota_dict(rows), args.output, render_quota(rows))
    except KubeApiError as err:
        source = api.credentials.source if api.credentials is not None else "the kubeconfig"
        if err.status == 0:
            raise Failure(f"cannot reach the API server {api.host} (from {source}): {err.message}") from None
        raise Failure(f"the API server {api.host} (from {source}) refused to answer: {err}") from None
    finally:
        await api.close()
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def run(argv: Sequence[str], prog: str, config: ControlConfig | None = None) -> int:
    """Parse `argv` (without the program name), read the cluster, print; returns the exit code."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    # The stores log every node without GPUs and every pod they skip: noise here, unless asked for.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, stream=sys.stderr)
    try:
        return asyncio.run(_run(args, with_devices(config or ControlConfig(), args)))
    except Failure as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """`kubectl-hami` (run by kubectl as `kubectl hami ...`)."""
    return run(sys.argv[1:] if argv is None else argv, "kubectl hami")


__all__ = ["Failure", "build_parser", "list_all", "main", "read_pod", "read_snapshot", "run", "with_devices"]
