"""A real Prometheus (the `prometheus` on PATH: Debian's 2.42 here) beside a local cluster, scraping it as
the install's PodMonitors do and loading the install's rules (`hami-sim up --monitoring`,
hami_sim/cluster/monitoring.py), scrape and rule evaluation every second. Once the test has exercised what
the dashboard shows (a GPU pod running, a pod the webhook denies, a namespace with a GPU quota, one Xid on a
fake GPU): every target is up, every panel's query and every variable evaluates without an error and
returns data (but the panels listed in `NO_DATA_HERE`, with why), every rule evaluates without an error
and every recording rule records, the Xid panel shows the single Xid as 1 (where a plain `increase()`
shows 0) and `HamiGPUXidError` fires, and no other alert is pending or firing.

One small cluster (1 node, 2 GPUs) for the module; the checks wait on conditions with deadlines."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from hami_api.annotations import DEVICES_ALLOCATED
from hami_sim.cluster import Cluster, ClusterSpec
from tests.builders import container, gpu_pod, pod, resource_quota
from tests.e2e.e2e_util import core_v1
from tests.prometheus_util import required_binary
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "daemonset" / "components" / "monitoring" / "hami-dashboard.json"
INTERVAL_S = 1.0
NODE = "gpu-node-1"
XID_GPU = 1
RATE_INTERVAL = "1m"
"""What Grafana's $__rate_interval stands for here (the test's events are all within its last minute)."""
VARIABLES = {"$__rate_interval": RATE_INTERVAL, "$node": ".*", "$vendor": ".*", "$namespace": ".*"}
"""Each dashboard variable at All (Grafana's regex for a multi-value variable with every value)."""
NO_DATA_HERE = {
    "Idle containers (no kernel for 10 minutes)": "the test's containers launch kernels every 5 s",
    "Kubernetes API errors": "hami-node's API calls all succeed here (the series appear at the first error)",
    "DRA claims prepared": "the cluster has no node in DRA mode",
}
"""Panels that show data only on what this cluster does not do."""
XID_ALERTS = {"HamiGPUXidError", "HamiGPUUnhealthy"}
"""The alerts the test's Xid raises (the GPU is unhealthy until its quiet period ends)."""


class Prometheus:
    """Prometheus's HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query now: (labels, value) per series; AssertionError naming the error."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]


def substituted(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("targets")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    required_binary("prometheus")
    spec = ClusterSpec.uniform(1, 2, monitoring=True, monitoring_interval_s=INTERVAL_S)
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster) -> Prometheus:
    """Prometheus once the test exercised what the dashboard shows: a GPU pod running with its GPU
    allocated, a namespace with a GPU memory quota, a privileged GPU pod denied, one Xid on a GPU. First
    every target is scraped once, as a Prometheus that runs before the events would have (a counter's first
    sample already at 1 shows no increase)."""
    prometheus = Prometheus(cluster.prometheus_url)
    targets_up(prometheus)
    with core_v1(cluster) as core:
        core.create_namespace({"metadata": {"name": "team"}})
        core.create_namespaced_resource_quota(
            "team", resource_quota({"limits.nvidia.com/gpumem": "20000"}, namespace="team")
        )
        core.create_namespaced_pod("team", gpu_pod("train", namespace="team", gpumem=2000, gpucores=20))
        privileged = container(gpus=1, gpumem=1000, securityContext={"privileged": True})
        with pytest.raises(ApiException) as denied:
            core.create_namespaced_pod("team", pod("debug", privileged, namespace="team"))
        assert denied.value.status == 403

        def running() -> bool:
            got = core.read_namespaced_pod("train", "team")
            return got.status.phase == "Running" and DEVICES_ALLOCATED in (got.metadata.annotations or {})

        wait_for(running, 60, "the GPU pod to run with its GPU allocated", interval=0.2)
    cluster.inject_gpu_fault(NODE, XID_GPU, "xid", xid=79)
    return prometheus


def targets_up(prometheus: Prometheus) -> list[dict[str, str]]:
    """The targets' labels once both are up (each scraped at least once)."""

    def up() -> list[dict[str, str]] | None:
        targets = prometheus.get("/api/v1/targets", state="active")["activeTargets"]
        healthy = [t["labels"] for t in targets if t["health"] == "up"]
        return healthy if len(healthy) == len(targets) == 2 else None

    return wait_for(up, 20, "both targets up", interval=0.2)


def test_every_target_is_up_with_the_pod_monitors_labels(prometheus: Prometheus) -> None:
    labels = targets_up(prometheus)
    by_job = {t["job"]: t for t in labels}
    assert set(by_job) == {"hami-control", "hami-node"}
    assert by_job["hami-node"]["node"] == NODE
    assert {t["namespace"] for t in labels} == {"hami-system"}


def test_every_panel_query_evaluates_and_shows_data_once_exercised(prometheus: Prometheus) -> None:
    queries = [(p["title"], substituted(t["expr"])) for p in panels() for t in p["targets"]]
    for _title, expr in queries:
        prometheus.query(expr)  # no error, data or not
    assert set(NO_DATA_HERE) <= {title for title, _ in queries}
    last: dict[str, str] = {}

    def all_with_data() -> bool:
        empty = {}
        for p in panels():
            if p["title"] in NO_DATA_HERE:
                continue
            values = [v for t in p["targets"] for _, v in prometheus.query(substituted(t["expr"]))]
            if not any(math.isfinite(v) for v in values):
                empty[p["title"]] = f"{len(values)} values, none finite"
        last.clear()
        last.update(empty)
        return not empty

    wait_for(all_with_data, 30, "every panel to show data", interval=0.5, detail=lambda: str(last))
    # The variables (Grafana's label_values(metric, label)) list what the cluster has.
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", query["query"])
            assert found is not None, query
            metric, label = found.groups()
            values = prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
            assert values == {"node": [NODE], "vendor": ["nvidia"], "namespace": ["team"]}[label]


def test_one_xid_on_a_fake_gpu_shows_as_one_in_the_xid_panel_and_fires_its_alert(
    prometheus: Prometheus,
) -> None:
    (xid_panel,) = [p for p in panels() if p["title"] == "Xid errors"]
    expr = substituted(xid_panel["targets"][0]["expr"])

    def xids() -> dict[tuple[str, str], float] | None:
        got = {(m["device_uuid"], m["xid"]): v for m, v in prometheus.query(expr)}
        return got if 1.0 in got.values() else None

    got = wait_for(xids, 20, "the Xid in the Xid panel", interval=0.2)
    assert sorted(got.values()) == [0.0, 1.0]  # the GPU's Xid, and the other GPU's series at 0
    # What the panel showed before: the series appeared at 1, so increase() sees no increase in it.
    plain = f"sum(increase(hami_node_gpu_xid_errors_total[{RATE_INTERVAL}]))"
    wait_for(lambda: prometheus.query(plain) == [({}, 0.0)], 10, "plain increase() at 0", interval=0.2)

    def firing() -> list[dict[str, str]] | None:
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        xid = [a["labels"] for a in alerts if a["labels"]["alertname"] == "HamiGPUXidError"]
        return xid if xid and all(a["state"] == "firing" for a in alerts if a["labels"] in xid) else None

    (alert,) = wait_for(firing, 20, "HamiGPUXidError to fire", interval=0.2)
    assert (alert["node"], alert["xid"], alert["severity"]) == (NODE, "79", "warning")
    recorded = prometheus.query('hami:node_gpu_xid_errors:increase10m{xid="79"}')
    assert sorted(v for _, v in recorded) == [0.0, 1.0]


def test_every_rule_evaluates_and_only_the_xid_s_alerts_are_active(prometheus: Prometheus) -> None:
    started = time.time()

    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        fresh = all(datetime.fromisoformat(r["lastEvaluation"]).timestamp() > started for r in rules)
        return rules if rules and fresh else None

    rules = wait_for(evaluated, 20, "every rule evaluated once more", interval=0.2)
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
    for rule in rules:
        if rule["type"] == "recording":
            assert prometheus.query(rule["name"]), f"{rule['name']} recorded nothing"

    def active() -> set[str] | None:
        names = {a["labels"]["alertname"] for a in prometheus.get("/api/v1/alerts")["alerts"]}
        return names if "HamiGPUXidError" in names else None

    assert wait_for(active, 20, "HamiGPUXidError among the active alerts", interval=0.2) <= XID_ALERTS
