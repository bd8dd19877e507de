"""The alerting and recording rules (daemonset/components/monitoring/hami-rules.yaml, and the PrometheusRule
written from it): `promtool check rules` accepts them, `promtool test rules` runs their unit tests
(tests/prometheus/hami-rules-test.yaml: for every alert, series that make it fire and series that do not),
every alert has a runbook entry in docs/observability.md, and every recording rule is a computation the
dashboard makes. promtool comes with Debian's prometheus package (tests/prometheus_util.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from hack.gen_prometheus_rule import prometheus_rule
from tests.prometheus_util import required_binary

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "daemonset" / "components" / "monitoring"
RULES = MONITORING / "hami-rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
RULE_TESTS = REPO / "tests" / "prometheus" / "hami-rules-test.yaml"
DASHBOARD = MONITORING / "hami-dashboard.json"
DOCS = REPO / "docs" / "observability.md"


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [required_binary("promtool"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_rule_file_and_the_prometheus_rule_s_groups(tmp_path: Path) -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    # What the operator hands Prometheus: the PrometheusRule's spec as a rule file.
    spec = yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]
    (tmp_path / "from-operator.yaml").write_text(yaml.safe_dump(spec))
    checked = promtool("check", "rules", str(tmp_path / "from-operator.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() -> None:
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", ()):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert {name: cases.get(name, set()) for name in alerts} == {name: {True, False} for name in alerts}
    # The recording rules the alerts read are tested through them; these two also on their own.
    exprs = [case["expr"] for g in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in g.get("promql_expr_test", ())]  # fmt: skip
    assert any("increase10m" in e for e in exprs) and any(":max" in e for e in exprs)


def test_the_prometheus_rule_is_written_from_the_rule_file() -> None:
    """Edit hami-rules.yaml, then run `python hack/gen_prometheus_rule.py`."""
    assert PROMETHEUS_RULE.read_text() == prometheus_rule(RULES.read_text())


def test_every_alert_has_its_runbook_entry_in_docs() -> None:
    docs = DOCS.read_text()
    anchors = {m.lower() for m in re.findall(r"^#### (Hami\w+)$", docs, flags=re.MULTILINE)}
    for rule in rules():
        if "alert" in rule:
            assert rule["annotations"]["runbook"] == f"docs/observability.md#{rule['alert'].lower()}"
            assert rule["alert"].lower() in anchors, rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]


def _normalised(expr: str) -> str:
    """A dashboard query as a rule would write it: no variable matchers, a 5-minute window."""
    expr = re.sub(r"\{[^{}]*\$[a-z_]+[^{}]*\}", "", expr)
    return " ".join(expr.replace("[$__rate_interval]", "[5m]").split())


def test_every_recording_rule_is_a_computation_of_the_dashboard() -> None:
    """The recording rules are the dashboard's repeated computations (so the alerts read what the panels
    show); the dashboard keeps its own queries, to work on a Prometheus without these rules."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [_normalised(t["expr"]) for p in dashboard["panels"] for t in p.get("targets", ())]
    for rule in rules():
        if "record" in rule:
            expr = " ".join(rule["expr"].split()).replace("[10m]", "[5m]")
            expr = expr.replace("offset 10m", "offset $__rate_interval")
            assert any(expr in query for query in queries), (rule["record"], expr)
