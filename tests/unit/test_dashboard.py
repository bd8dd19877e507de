"""The Grafana dashboard (daemonset/components/monitoring/hami-dashboard.json): every metric a panel or a
variable queries is one hami-control or hami-node exports, and the JSON is a dashboard Grafana loads as
it is (schema version, unique ids, panels on the 24-column grid, every query on the datasource variable).

Metric names come out of each PromQL expression through a small tokenizer (`metric_names`): strings,
label matchers, range and subquery brackets and durations are skipped; an identifier followed by `(` is a
function or an aggregation; `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` lists hold label
names, not metrics; what is left is a metric name (or one given as `{__name__="..."}`). Its own tests
below pin that down, since a tokenizer that found nothing would pass every dashboard.

What is exported: hami-control's names from its real registry (`ControlMetrics.registry`, the families'
sample names: a histogram `x` gives `x_bucket`, `x_sum`, `x_count`; a counter `x` gives `x_total`);
hami-node's from `NODE_METRICS` below: HAMi's vGPU monitor names and hami-node's own `hami_node_*`
families as hami_node/monitor/exporter.py documents them (replace the list by that registry's families
once a test can build one cheaply).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hami_control.cache import ClusterCache
from hami_control.metrics import ControlMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "daemonset" / "components" / "monitoring" / "hami-dashboard.json"
Json = dict[str, Any]

NODE_METRICS = frozenset(
    {
        # HAMi v2.10.0 cmd/vGPUmonitor/metrics.go, the families its collector exports (without
        # --legacy-metrics, which adds the old names HostGPUMemoryUsage, HostCoreUtilization,
        # vGPU_device_memory_usage_in_bytes, vGPU_device_memory_limit_in_bytes,
        # Device_memory_desc_of_container, Device_utilization_desc_of_container,
        # Device_last_kernel_of_container and MigInfo, with other label names). Per GPU, from NVML,
        # labelled node, device_index, device_uuid, device_type:
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",  # 0-100
        "hami_host_gpu_memory_controller_utilization_ratio",  # 0-100, no node label
        # Per container and device, from HAMi-core's shared region, labelled namespace, pod, container,
        # vdevice_index, device_uuid:
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_memory_bytes",
        "hami_container_device_utilization_ratio",  # SM utilisation, 0-100
        "hami_container_last_kernel_elapsed_seconds",
        "hami_vgpu_memory_context_bytes",
        "hami_vgpu_memory_module_bytes",
        "hami_vgpu_memory_buffer_bytes",
        # (not hami_mig_device_info: no MIG support in hami-node)
        # Ours, hami-node's own families (hami_node/monitor/exporter.py): per GPU, labelled node,
        # device_index, device_uuid, device_type ...
        "hami_node_gpu_memory_total_bytes",
        "hami_node_gpu_healthy",
        "hami_node_gpu_xid_errors_total",  # {node, device_uuid, xid}
        # ... and the daemon's health.
        "hami_node_allocate_duration_seconds_bucket",  # histogram {result}
        "hami_node_allocate_duration_seconds_sum",
        "hami_node_allocate_duration_seconds_count",
        "hami_node_registrations_total",  # {result}
        "hami_node_list_and_watch_updates_total",
        "hami_node_kube_api_errors_total",  # {verb, code}
        "hami_node_priority_feedback_writes_total",  # {field}
        "hami_node_shared_regions",  # {state: decoded|refused}
    }
)
"""hami-node's /metrics sample names the dashboard may query."""


# --- the tokenizer --------------------------------------------------------------------------------------

_STRING = r'"(?:\\.|[^"\\])*"|' r"'(?:\\.|[^'\\])*'|`[^`]*`"
_TOKEN = re.compile(
    rf"""
    (?P<space>\s+)
  | (?P<string>{_STRING})
  | (?P<brackets>\[[^\[\]]*\])                       # range or subquery: [5m], [$__rate_interval], [1h:5m]
  | (?P<labels>\{{(?:{_STRING}|[^{{}}"'`])*\}})        # label matchers
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![\w.])   # offset 5m, 1h30m
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])
  | (?P<variable>\$\{{\w+(?::\w+)?\}}|\$\w+)           # Grafana's $node, ${{node}}, ${{node:regex}}
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>(),@])
    """,
    re.VERBOSE,
)

AGGREGATIONS = frozenset(
    [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "limitk",
        "limit_ratio",
    ]
)
FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_by_label",
        "sort_by_label_desc",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "year",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "cos",
        "cosh",
        "deg",
        "pi",
        "rad",
        "sin",
        "sinh",
        "tan",
        "tanh",
        "start",
        "end",
    ]
)
LABEL_LIST_KEYWORDS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
OTHER_KEYWORDS = frozenset(["and", "or", "unless", "bool", "offset", "inf", "nan"])
_NAME_MATCHER = re.compile(rf"__name__\s*=\s*({_STRING})")


class PromQLError(ValueError):
    pass


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of each token but spaces; an unknown character raises PromQLError naming it."""
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"cannot tokenize {expr[at : at + 20]!r} at {at} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            out.append((kind, match.group()))
        at = match.end()
    return out


def _skip_label_list(toks: list[tuple[str, str]], i: int, expr: str) -> int:
    """After `by` & co.: the index past their `( label, ... )`, or `i` when no list follows."""
    if i >= len(toks) or toks[i] != ("op", "("):
        return i
    for j in range(i + 1, len(toks)):
        if toks[j] == ("op", ")"):
            return j + 1
        if toks[j][0] != "ident" and toks[j] != ("op", ","):
            raise PromQLError(f"label list holds {toks[j][1]!r} in {expr!r}")
    raise PromQLError(f"unclosed label list in {expr!r}")


def _metric_names(expr: str) -> Iterator[str]:
    toks = tokens(expr)
    depth = 0
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        i += 1
        if kind == "labels":
            yield from (m[1:-1] for m in _NAME_MATCHER.findall(text))
        elif kind == "op" and text in "()":
            depth += 1 if text == "(" else -1
            if depth < 0:
                raise PromQLError(f"unbalanced ')' in {expr!r}")
        elif kind == "ident":
            if text in LABEL_LIST_KEYWORDS:
                i = _skip_label_list(toks, i, expr)
            elif text in OTHER_KEYWORDS:
                continue
            elif i < len(toks) and toks[i] == ("op", "("):
                if text not in FUNCTIONS | AGGREGATIONS:
                    raise PromQLError(f"unknown function {text!r} in {expr!r}")
            elif text in AGGREGATIONS and i < len(toks) and toks[i][1] in ("by", "without"):
                continue  # sum by (le) (...)
            else:
                yield text
    if depth:
        raise PromQLError(f"unbalanced '(' in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    return set(_metric_names(expr))


# --- the dashboard --------------------------------------------------------------------------------------


@cache
def dashboard() -> Json:
    loaded: Json = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def all_panels() -> list[Json]:
    """Every panel, rows and the panels of collapsed rows included."""
    out: list[Json] = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def query_panels() -> list[Json]:
    return [p for p in all_panels() if p["type"] != "row"]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target."""
    return [(p["title"], t["expr"]) for p in query_panels() for t in p["targets"]]


def variable_queries() -> list[tuple[str, str]]:
    """(variable name, the metric selector of its label_values(...) query)."""
    out: list[tuple[str, str]] = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"variable {variable['name']}: {query!r} is not label_values(metric, label)"
        out.append((variable["name"], match[1]))
    return out


@cache
def control_metrics() -> frozenset[str]:
    """The sample names hami-control's /metrics carries, from its real registry."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    out: set[str] = set()
    for family in ControlMetrics(ClusterCache()).registry.collect():
        assert family.type in suffixes, f"{family.name}: {family.type} (add its sample suffixes here)"
        out |= {family.name + suffix for suffix in suffixes[family.type]}
    return frozenset(out)


def exported() -> frozenset[str]:
    return control_metrics() | NODE_METRICS


# --- the tokenizer's own tests ----------------------------------------------------------------------------

TOKENIZER_CASES = [
    ("up", {"up"}),
    ('hami_gpu_shared_count{node=~"$node", zone="vGPU"}', {"hami_gpu_shared_count"}),
    ('{__name__="hami_webhook_requests_total", allowed="true"}', {"hami_webhook_requests_total"}),
    (
        "histogram_quantile(0.99, sum by (le) (rate(hami_webhook_duration_seconds_bucket[$__rate_interval])))"
        " > 0",
        {"hami_webhook_duration_seconds_bucket"},
    ),
    ("sum without (instance, pod) (rate(a_total[5m] offset 1h30m))", {"a_total"}),
    ("max(b) by (node) / on (node) group_left (device_type) c", {"b", "c"}),
    ('label_replace(d, "dst", "$1", "src", "(.*)") > bool 0.5e3', {"d"}),
    ("topk(10, e{x='}'}) or f unless g and h", {"e", "f", "g", "h"}),
    ("max_over_time(rate(i[5m])[1h:1m]) * 100 + inf", {"i"}),
    ("count(j @ end()) - scalar(k:recorded:rate5m)", {"j", "k:recorded:rate5m"}),
    ("sum by (namespace, pod) (l) / ignoring (container) group_right m", {"l", "m"}),
    ("vector(1)", set()),
]


@pytest.mark.parametrize(("expr", "names"), TOKENIZER_CASES, ids=[c[0][:40] for c in TOKENIZER_CASES])
def test_tokenizer_finds_the_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    ("expr", "error"),
    [
        ("rat(x[5m])", "unknown function 'rat'"),
        ("sum(x", "unbalanced '\\('"),
        ("x)", "unbalanced '\\)'"),
        ("sum by (le, 3) (x)", "label list holds '3'"),
        ("x # comment", "cannot tokenize '# comment'"),
    ],
)
def test_tokenizer_refuses_what_it_does_not_understand(expr: str, error: str) -> None:
    with pytest.raises(PromQLError, match=error):
        metric_names(expr)


def test_control_registry_lists_histograms_counters_and_hamis_gauges() -> None:
    names = control_metrics()
    assert {
        "hami_webhook_duration_seconds_bucket",
        "hami_webhook_duration_seconds_count",
        "hami_extender_bind_total",
        "hami_gpu_memory_allocated_bytes",
        "hami_vgpu_core_allocated_ratio",
    } <= names
    assert "hami_webhook_duration_seconds" not in names  # a histogram's samples carry a suffix


# --- the dashboard's tests --------------------------------------------------------------------------------


def test_every_metric_a_panel_queries_is_exported() -> None:
    queried: dict[str, set[str]] = {}
    for title, expr in panel_queries():
        names = metric_names(expr)
        assert names, f"panel {title!r}: {expr!r} reads no metric"
        for name in names:
            queried.setdefault(name, set()).add(title)
    missing = {name: sorted(titles) for name, titles in queried.items() if name not in exported()}
    assert missing == {}, "metrics no daemon exports (name: panels)"
    # Both daemons are on it, and each part of the issue has a family.
    assert set(queried) & control_metrics() and set(queried) & NODE_METRICS
    # No name comes from both daemons (a query would add hami-control's replicas to the nodes).
    assert control_metrics() & NODE_METRICS == set()
    for family in (
        "hami_gpu_memory_allocated_bytes",  # cluster allocation
        "hami_gpu_core_allocated_ratio",
        "hami_gpu_shared_count",
        "hami_host_gpu_utilization_ratio",  # per GPU usage
        "hami_vgpu_memory_used_bytes",  # per container usage vs limit
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_utilization_ratio",
        "hami_extender_filter_duration_seconds_bucket",  # scheduling latency and failure reasons
        "hami_extender_filter_node_reasons_total",
        "hami_extender_bind_total",
        "hami_webhook_duration_seconds_bucket",  # webhook latency
        "hami_node_gpu_healthy",  # the node daemon's health
        "hami_node_allocate_duration_seconds_bucket",
    ):
        assert family in queried, family


def test_every_variable_queries_an_exported_metric() -> None:
    variables = dict(variable_queries())
    assert set(variables) == {"node", "namespace"}
    for name, selector in variables.items():
        assert metric_names(selector) <= exported(), name
        assert metric_names(selector), name


def test_every_panel_has_a_title_a_unique_id_and_a_place_on_the_grid() -> None:
    panels = all_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    occupied: dict[tuple[int, int], str] = {}
    for p in panels:
        assert p["title"].strip(), p["id"]
        grid = p["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"}, p["title"]
        assert grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] >= 1 and grid["h"] >= 1, p["title"]
        assert grid["x"] + grid["w"] <= 24, f"{p['title']}: wider than Grafana's 24 columns"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in occupied, f"{p['title']} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = p["title"]
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles))


def test_every_query_uses_the_datasource_variable() -> None:
    d = dashboard()
    (source,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert (source["name"], source["query"]) == ("datasource", "prometheus")
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for p in query_panels():
        assert p["datasource"] == expected, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == expected, (p["title"], t["refId"])
            assert t["expr"].strip(), (p["title"], t["refId"])
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == expected, v["name"]


def test_the_node_and_namespace_variables_filter_the_panels() -> None:
    """Each variable is used, as a regex matcher (multi-value and All give regexes)."""
    exprs = [expr for _, expr in panel_queries()]
    for variable, label in (("$node", "node"), ("$namespace", "namespace")):
        uses = [e for e in exprs if variable in e]
        assert uses, variable
        for e in uses:
            assert f'{label}=~"{variable}"' in e, e
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", v["name"]


def test_dashboard_is_a_grafana_dashboard_model() -> None:
    d = dashboard()
    assert d["schemaVersion"] >= 36  # Grafana 9+: panel datasources as {type, uid}
    assert re.fullmatch(r"[a-z0-9-]{1,40}", d["uid"])  # a stable uid: links and the sidecar keep it
    assert d["title"] and isinstance(d["version"], int)
    assert set(d["time"]) == {"from", "to"}
    assert {p["type"] for p in all_panels()} <= {"row", "stat", "gauge", "bargauge", "timeseries", "table"}
    # Rows are full-width headers; no collapsed row hides panels from this check.
    for p in all_panels():
        if p["type"] == "row":
            assert p["gridPos"]["w"] == 24 and p["gridPos"]["h"] == 1, p["title"]
            assert p["collapsed"] is False and p["panels"] == [], p["title"]
    # Written as json.dumps(indent=2) writes it, so a re-export diff stays readable.
    assert DASHBOARD.read_text(encoding="utf-8") == json.dumps(d, indent=2) + "\n"
