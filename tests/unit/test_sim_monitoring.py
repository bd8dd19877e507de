"""hami_sim.cluster.monitoring: Prometheus's configuration for a local cluster scrapes it as the install's
PodMonitors do (the same jobs, honor_labels, HTTPS with the cluster's CA for hami-control, a `node` per
node daemon) with the install's rules; the target files change only when the ports do; ClusterSpec keeps
the monitoring settings and refuses bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hami_sim.cluster import Cluster, ClusterError, ClusterSpec
from hami_sim.cluster import monitoring as mon
from hami_sim.cluster.spec import SpecError

REPO = Path(__file__).resolve().parents[2]
PODMONITORS = REPO / "daemonset" / "components" / "monitoring" / "podmonitors.yaml"


def test_the_configuration_scrapes_both_jobs_as_the_pod_monitors_do_with_the_install_s_rules(
    tmp_path: Path,
) -> None:
    path = mon.write_config(tmp_path, tmp_path / "ca.crt", 0.5)
    config = yaml.safe_load(path.read_text())
    assert config["global"] == {
        "scrape_interval": "500ms",
        "scrape_timeout": "500ms",
        "evaluation_interval": "500ms",
    }
    assert config["rule_files"] == [str(mon.RULES_FILE)] and mon.RULES_FILE.is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    monitors = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(PODMONITORS.read_text())}
    assert set(jobs) == set(monitors)
    for name, job in jobs.items():
        (endpoint,) = monitors[name]["podMetricsEndpoints"]
        assert (job["scheme"], job["metrics_path"], job["honor_labels"]) == (
            endpoint["scheme"],
            endpoint["path"],
            endpoint["honorLabels"],
        )
    assert jobs["hami-control"]["tls_config"] == {"ca_file": str(tmp_path / "ca.crt")}


def test_target_files_name_each_replica_and_node_and_change_only_when_the_ports_do(tmp_path: Path) -> None:
    mon.write_targets(tmp_path, {"hami-control": 9443}, {"gpu-node-1": 9396, "gpu-node-2": 9397})
    nodes = tmp_path / "targets" / "hami-node.json"
    assert json.loads(nodes.read_text())[1] == {
        "targets": ["127.0.0.1:9397"],
        "labels": {"namespace": "hami-system", "pod": "hami-node-gpu-node-2", "node": "gpu-node-2"},
    }
    control = json.loads((tmp_path / "targets" / "hami-control.json").read_text())
    assert control == [
        {"targets": ["127.0.0.1:9443"], "labels": {"namespace": "hami-system", "pod": "hami-control"}}
    ]
    before = nodes.stat().st_ino
    mon.write_targets(tmp_path, {"hami-control": 9443}, {"gpu-node-1": 9396, "gpu-node-2": 9397})
    assert nodes.stat().st_ino == before  # unchanged: not rewritten
    mon.write_targets(tmp_path, {"hami-control": 9443}, {"gpu-node-1": 9396, "gpu-node-2": 9500})
    assert "127.0.0.1:9500" in nodes.read_text()


def test_the_spec_keeps_monitoring_and_refuses_it_without_node_metrics_or_with_a_bad_interval() -> None:
    spec = ClusterSpec.uniform(1, 1, monitoring=True, monitoring_interval_s=2.0)
    again = ClusterSpec.from_data(spec.to_data())
    assert (again.monitoring, again.monitoring_interval_s) == (True, 2.0)
    assert ClusterSpec.from_data({**spec.to_data(), "monitoring": None}).monitoring is False
    with pytest.raises(SpecError, match="needs node_metrics"):
        ClusterSpec.uniform(1, 1, monitoring=True, node_metrics=False)
    for bad in (0, 61, "5", True):
        with pytest.raises(SpecError, match="monitoring_interval_s"):
            ClusterSpec.uniform(1, 1, monitoring_interval_s=bad)


def test_without_a_prometheus_binary_up_refuses_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mon.shutil, "which", lambda name: None)
    with pytest.raises(mon.MonitoringError, match=r"no prometheus binary on PATH .*apt-get install"):
        mon.prometheus_binary()
    with pytest.raises(ClusterError, match="no prometheus binary") as refused:
        Cluster.up(ClusterSpec.uniform(1, 1, monitoring=True), tmp_path / ".hami-sim")
    assert refused.value.component == "prometheus" and refused.value.pids == ()
