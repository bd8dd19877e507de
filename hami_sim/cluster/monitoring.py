"""Prometheus beside a local cluster (`hami-sim up --monitoring`, `ClusterSpec.monitoring`): the same scrape
setup as the install's PodMonitors (daemonset/components/monitoring/podmonitors.yaml) with the cluster's
processes as targets, and the same rules (hami-rules.yaml), so the dashboard's queries and the alerts run
on the demo's live metrics.

What a PodMonitor gives a target, each target here has too: `job` (the pod's app.kubernetes.io/name,
`jobLabel`: hami-control, hami-node), `namespace` and `pod` (hami-system; the replica's name, or
hami-node-<node>), hami-node's `node` (the relabeling from `__meta_kubernetes_pod_node_name`),
`honor_labels: true`, and hami-control over HTTPS verified against the cluster's CA. Not reproduced:
hami-control's `scheduler_role` (the local replicas are processes, not labelled pods;
`hami_control_leader` says which leads).

The targets are file_sd files (`<state>/prometheus/targets/`), rewritten whenever the cluster records its
ports (a node daemon started again on another port is scraped there). Prometheus is Debian's package
(`prometheus`, 2.42 here; hack/setup.sh installs it) or any `prometheus` on PATH.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hami_node.durable import write_atomic

RULES_FILE = (
    Path(__file__).resolve().parents[2] / "daemonset" / "components" / "monitoring" / "hami-rules.yaml"
)
"""The alerting and recording rules of the checkout this package runs from (the PrometheusRule's source)."""
NAMESPACE = "hami-system"
"""The namespace the install runs in, as a PodMonitor labels its targets."""
READY_LINE = "Server is ready to receive web requests."
"""What Prometheus logs once it serves its API."""


class MonitoringError(Exception):
    """Prometheus cannot be started (not installed, no rule file)."""


def prometheus_binary() -> str:
    """The `prometheus` on PATH; `MonitoringError` saying how to get one when there is none."""
    found = shutil.which("prometheus")
    if found is None:
        raise MonitoringError(
            "monitoring: no prometheus binary on PATH (install Debian's prometheus package: "
            "apt-get install --no-install-recommends prometheus; hack/setup.sh does as root)"
        )
    return found


def config(directory: Path, ca_file: Path, interval_s: float) -> dict[str, Any]:
    """Prometheus's configuration: both jobs as the PodMonitors scrape them, from the file_sd target files
    in `directory`, the rules, scrape and rule evaluation every `interval_s`."""
    if not RULES_FILE.is_file():
        raise MonitoringError(f"monitoring: no rule file at {RULES_FILE}")
    interval = f"{round(interval_s * 1000)}ms"
    targets = directory / "targets"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(RULES_FILE)],
        "scrape_configs": [
            {
                "job_name": "hami-control",
                "scheme": "https",
                "metrics_path": "/metrics",
                "honor_labels": True,
                "tls_config": {"ca_file": str(ca_file)},
                "file_sd_configs": [{"files": [str(targets / "hami-control.json")]}],
            },
            {
                "job_name": "hami-node",
                "scheme": "http",
                "metrics_path": "/metrics",
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(targets / "hami-node.json")]}],
            },
        ],
    }


def control_targets(replicas: Mapping[str, int]) -> list[dict[str, Any]]:
    """One file_sd group per hami-control replica (name -> port on 127.0.0.1)."""
    return [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NAMESPACE, "pod": name}}
        for name, port in sorted(replicas.items())
        if port
    ]


def node_targets(ports: Mapping[str, int]) -> list[dict[str, Any]]:
    """One file_sd group per node daemon (node -> its health port on 127.0.0.1), with its `node`."""
    return [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {"namespace": NAMESPACE, "pod": f"hami-node-{node}", "node": node},
        }
        for node, port in sorted(ports.items())
    ]


def write_config(directory: Path, ca_file: Path, interval_s: float) -> Path:
    """Write `prometheus.yml` (and the targets folder) into `directory`; returns the file."""
    (directory / "targets").mkdir(parents=True, exist_ok=True)
    path = directory / "prometheus.yml"
    write_atomic(path, yaml.safe_dump(config(directory, ca_file, interval_s), sort_keys=False).encode())
    return path


def write_targets(directory: Path, control: Mapping[str, int], nodes: Mapping[str, int]) -> None:
    """Rewrite the target files when they changed (each by rename, so Prometheus never reads half of one)."""
    targets = directory / "targets"
    targets.mkdir(parents=True, exist_ok=True)
    for name, groups in (("hami-control", control_targets(control)), ("hami-node", node_targets(nodes))):
        path = targets / f"{name}.json"
        data = (json.dumps(groups, indent=1) + "\n").encode()
        try:
            if path.read_bytes() == data:
                continue
        except FileNotFoundError:
            pass
        write_atomic(path, data)


def argv(binary: str, directory: Path, port: int) -> list[str]:
    """Prometheus on 127.0.0.1:`port` with its configuration and data in `directory`."""
    return [
        binary,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.page-title=hami-sim local cluster",
    ]


__all__ = [
    "NAMESPACE",
    "READY_LINE",
    "RULES_FILE",
    "MonitoringError",
    "argv",
    "config",
    "control_targets",
    "node_targets",
    "prometheus_binary",
    "write_config",
    "write_targets",
]
