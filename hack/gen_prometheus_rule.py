"""Write daemonset/components/monitoring/prometheusrule.yaml, the PrometheusRule `hami-rules`, from the plain
rule file beside it (hami-rules.yaml, the one source of the rules): its groups become the object's spec,
comments kept. Run it after editing hami-rules.yaml; tests/unit/test_prometheus_rules.py fails when the
two differ.

    python hack/gen_prometheus_rule.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MONITORING = Path(__file__).resolve().parent.parent / "daemonset" / "components" / "monitoring"
RULES = MONITORING / "hami-rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"

HEADER = """\
# Written by `python hack/gen_prometheus_rule.py` from hami-rules.yaml (the same groups as a plain rule
# file): edit that file, then run the script. The Prometheus Operator loads it into every Prometheus whose
# ruleSelector and ruleNamespaceSelector match (kube-prometheus-stack selects only its own release label
# unless prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues=false). docs/observability.md, "Alerts".
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: hami-rules
  namespace: hami-system
  labels:
    app.kubernetes.io/name: hami-rules
    app.kubernetes.io/part-of: hami-py
    app.kubernetes.io/version: "0.1.0"
spec:
"""


def prometheus_rule(rules_text: str) -> str:
    """The PrometheusRule for a plain rule file: its lines from `groups:` on, indented under `spec:`."""
    lines = rules_text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    except StopIteration:
        raise ValueError(f"{RULES.name}: no top-level 'groups:' key") from None
    body = "".join(f"  {line}\n" if line else "\n" for line in lines[start:])
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only say whether the file is up to date")
    args = parser.parse_args(argv)
    wanted = prometheus_rule(RULES.read_text())
    if args.check:
        if PROMETHEUS_RULE.read_text() != wanted:
            print(f"{PROMETHEUS_RULE} is stale: run python hack/gen_prometheus_rule.py", file=sys.stderr)
            return 1
        return 0
    PROMETHEUS_RULE.write_text(wanted)
    print(f"wrote {PROMETHEUS_RULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
