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
hami-node's from its real registry too (`hami_node.monitor.exporter.NodeMetrics` with its GPU and
container collectors), which must include HAMi's vGPU monitor names (`HAMI_VGPU_MONITOR`).

Labels too: every label a selector matches on, or an aggregation groups a single metric by, is one that
metric's series carry (hami-control's from a scrape with every family populated, hami-node's from
`NODE_LABELS`), so no panel filters or groups on a label that is not there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hami_api.annotations import DEVICES_ALLOCATED
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.metrics import ControlMetrics
from hami_control.pod_store import PodStore
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_node.gpu.backend import GPUBackendError, GPUUsage
from hami_node.monitor.exporter import ContainerCollector, GPUCollector, NodeMetrics
from tests.builders import allocation, allocation_annotations, container, gpu_info, node, pod

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "daemonset" / "components" / "monitoring" / "hami-dashboard.json"
Json = dict[str, Any]

HAMI_VGPU_MONITOR = frozenset(
    {
        # HAMi v2.10.0 cmd/vGPUmonitor/metrics.go, the families its collector exports (without
        # --legacy-metrics, which adds the old names HostGPUMemoryUsage, HostCoreUtilization,
        # vGPU_device_memory_usage_in_bytes, vGPU_device_memory_limit_in_bytes,
        # Device_memory_desc_of_container, Device_utilization_desc_of_container,
        # Device_last_kernel_of_container and MigInfo, with other label names). Per GPU, from NVML,
        # labelled node, device_index, device_uuid, device_type:
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",  # 0-100
        "hami_host_gpu_memory_controller_utilization_ratio",  # 0-100, no node label of its own
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
    }
)
"""HAMi's vGPU monitor names, which hami-node exports too (checked against its registry below)."""

_HOST = frozenset({"node", "device_index", "device_uuid", "device_type", "zone"})
_CONTAINER = frozenset({"namespace", "pod", "container", "vdevice_index", "device_uuid", "zone", "node"})
_HISTOGRAM = frozenset({"node", "result", "le"})
NODE_LABELS: dict[str, frozenset[str]] = {
    "hami_host_gpu_memory_used_bytes": _HOST,
    "hami_host_gpu_utilization_ratio": _HOST,
    "hami_host_gpu_memory_controller_utilization_ratio": _HOST,  # node from the PodMonitor only
    **{name: _CONTAINER for name in HAMI_VGPU_MONITOR if name.startswith(("hami_vgpu_", "hami_container_"))},
    "hami_node_gpu_memory_total_bytes": _HOST - {"zone"},
    "hami_node_gpu_healthy": _HOST - {"zone"},
    "hami_node_gpu_xid_errors_total": frozenset({"node", "device_uuid", "xid"}),
    "hami_node_allocate_duration_seconds_bucket": _HISTOGRAM,
    "hami_node_allocate_duration_seconds_sum": _HISTOGRAM - {"le"},
    "hami_node_allocate_duration_seconds_count": _HISTOGRAM - {"le"},
    "hami_node_registrations_total": frozenset({"node", "result"}),
    "hami_node_list_and_watch_updates_total": frozenset({"node"}),
    "hami_node_kube_api_errors_total": frozenset({"node", "verb", "code"}),
    "hami_node_priority_feedback_writes_total": frozenset({"node", "field"}),
    "hami_node_stale_container_dirs_removed_total": frozenset({"node"}),
    "hami_node_shared_regions": frozenset({"node", "state"}),
    "hami_node_fenced": frozenset({"node"}),
    "hami_node_kubelet_registered": frozenset({"node"}),
    "hami_node_dra_prepare_claims_total": frozenset({"node", "result"}),
}
"""The label names of hami-node's series, the `node` the PodMonitor adds included (every series from a
hami-node pod gets it; HAMi's per-container families carry none of their own)."""


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


def _metric_positions(toks: list[tuple[str, str]], expr: str) -> Iterator[tuple[int, str]]:
    """(token index, metric name) of every metric the tokens read."""
    depth = 0
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        i += 1
        if kind == "labels":
            yield from ((i - 1, m[1:-1]) for m in _NAME_MATCHER.findall(text))
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
                yield i - 1, text
    if depth:
        raise PromQLError(f"unbalanced '(' in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    return {name for _, name in _metric_positions(tokens(expr), expr)}


_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def _closing(toks: list[tuple[str, str]], i: int) -> int:
    """The index of the `)` that closes the `(` at `i`."""
    depth = 0
    for j in range(i, len(toks)):
        depth += {("op", "("): 1, ("op", ")"): -1}.get(toks[j], 0)
        if depth == 0:
            return j
    raise PromQLError("unclosed '('")


def label_references(expr: str) -> set[tuple[str, str]]:
    """(metric, label) pairs an expression relies on: the label names of each selector's matchers, and
    the `by` labels of an aggregation whose argument reads one metric and aggregates nothing itself
    (`max by (node) (rate(m{...}[5m]))`); deeper nesting is not followed."""
    toks = tokens(expr)
    positions = list(_metric_positions(toks, expr))
    refs: set[tuple[str, str]] = set()
    for i, name in positions:
        if toks[i][0] == "labels":  # {__name__="m", ...}
            block = toks[i][1]
        elif i + 1 < len(toks) and toks[i + 1][0] == "labels":
            block = toks[i + 1][1]
        else:
            continue
        labels = set(_MATCHER_LABEL.findall(re.sub(_STRING, '""', block[1:-1]))) - {"__name__"}
        refs |= {(name, label) for label in labels}
    for i, (kind, text) in enumerate(toks):
        if not (
            kind == "ident" and text in AGGREGATIONS and toks[i + 1 : i + 3] == [("ident", "by"), ("op", "(")]
        ):
            continue
        end = _closing(toks, i + 2)
        by = {t for k, t in toks[i + 3 : end] if k == "ident"}
        if toks[end + 1 : end + 2] != [("op", "(")]:
            continue
        inner = range(end + 1, _closing(toks, end + 1))
        names = {name for j, name in positions if j in inner}
        nested = any(
            toks[j][0] == "ident" and toks[j][1] in AGGREGATIONS | LABEL_LIST_KEYWORDS for j in inner
        )
        if len(names) == 1 and not nested:
            (metric,) = names
            refs |= {(metric, label) for label in by}
    return refs


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


def sample_names(registry: CollectorRegistry) -> frozenset[str]:
    """The sample names a registry's families write (whether or not they hold samples now)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    out: set[str] = set()
    for family in registry.collect():
        assert family.type in suffixes, f"{family.name}: {family.type} (add its sample suffixes here)"
        out |= {family.name + suffix for suffix in suffixes[family.type]}
    return frozenset(out)


@cache
def control_metrics() -> frozenset[str]:
    """The sample names hami-control's /metrics carries, from its real registry (serving a certificate)."""
    metrics = ControlMetrics(ClusterCache())
    metrics.watch_certificate(lambda: 1_900_000_000.0)
    return sample_names(metrics.registry)


class _NoPods:
    def pod_name(self, uid: str) -> None:
        return None


def _no_usage(uuid: str) -> GPUUsage:
    raise GPUBackendError(f"no GPU {uuid}")


@cache
def node_metrics() -> frozenset[str]:
    """The sample names hami-node's /metrics carries, from its real registry: `NodeMetrics` with the GPU
    and container collectors the daemon registers, HAMi's legacy names off (as HAMi has them by
    default), so the dashboard relies on none of them."""
    metrics = NodeMetrics("n1")
    metrics.watch_daemon(fenced=lambda: None, registered=lambda: True, dra=True)
    metrics.add_collector(GPUCollector("n1", lambda: [], _no_usage, legacy=False))
    metrics.add_collector(ContainerCollector(lambda: [], _NoPods(), legacy=False))
    return sample_names(metrics.registry)


def exported() -> frozenset[str]:
    return control_metrics() | node_metrics()


class _Quotas:
    """A QuotaSource with one namespace limited in memory and cores."""

    def namespaces(self) -> list[str]:
        return ["team"]

    def limits(self, namespace: str) -> QuotaLimits:
        return QuotaLimits(memory=8192, cores=100)

    def used(self, namespace: str) -> QuotaUsage:
        return QuotaUsage(4096, 50)


@cache
def control_labels() -> dict[str, frozenset[str]]:
    """Sample name -> label names, from a scrape of hami-control's metrics with every family populated:
    a node with a GPU, a pod holding a slice of it and one still allocating, a quota, a serving
    certificate, and one observation of each instrument."""
    gpus = ClusterCache()
    pods = PodStore(ControlConfig(), gpus)
    metrics = ControlMetrics(gpus, _Quotas())
    metrics.watch_certificate(lambda: 1_900_000_000.0)
    pods.add_listener(metrics.allocating.pod_event)
    gpus.node_upserted(node("n1", [gpu_info(0, id="GPU-0", count=4)]))
    held = allocation([("GPU-0", 1000, 10)])
    annotations = allocation_annotations("n1", held, bind_phase=None, keys=(DEVICES_ALLOCATED,))
    pods.apply("ADDED", pod("p", container("c0"), uid="u1", phase="Running", annotations=annotations))
    allocating = allocation_annotations("n1", allocation([("GPU-0", 1000, 10)]))
    pods.apply("ADDED", pod("q", container("c0"), uid="u2", node_name="n1", annotations=allocating))
    metrics.observe_filter(0.001, {"CardInsufficientMemory": 1})
    metrics.observe_prioritize(0.001)
    metrics.observe_bind(0.001, "success")
    metrics.observe_webhook(0.001, allowed=True)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


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


LABEL_CASES = [
    ('m{node=~"$node", zone!="x", __name__="m"}', {("m", "node"), ("m", "zone")}),
    ('{__name__="m", a="}"}', {("m", "a")}),
    (
        "histogram_quantile(0.9, sum by (le) (rate(h_bucket{node=~'x'}[5m])))",
        {("h_bucket", "le"), ("h_bucket", "node")},
    ),
    ("sum by (node) (max by (node, uuid) (m))", {("m", "node"), ("m", "uuid")}),  # the outer: not followed
    ("sum by (node) (a / b)", set()),  # two metrics: not followed
    ("a{x='1'} / on (y) b{z='2'}", {("a", "x"), ("b", "z")}),
]


@pytest.mark.parametrize(("expr", "refs"), LABEL_CASES, ids=[c[0][:40] for c in LABEL_CASES])
def test_label_references_are_the_matchers_and_direct_by_labels(
    expr: str, refs: set[tuple[str, str]]
) -> None:
    assert label_references(expr) == refs


def test_node_registry_lists_hamis_vgpu_monitor_names_and_ours() -> None:
    names = node_metrics()
    assert names >= HAMI_VGPU_MONITOR
    assert set(NODE_LABELS) <= names  # the label table names only what hami-node exports
    assert {"hami_node_allocate_duration_seconds_bucket", "hami_node_registrations_total"} <= names
    assert "HostGPUMemoryUsage" not in names  # legacy names off


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
    assert set(queried) & control_metrics() and set(queried) & node_metrics()
    # No name comes from both daemons (a query would add hami-control's replicas to the nodes).
    assert control_metrics() & node_metrics() == set()
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
        "hami_control_connections_open",  # hami-control's connection limits
        "hami_control_connections_dropped_total",
    ):
        assert family in queried, family


def test_every_label_a_query_filters_or_groups_by_is_on_its_metric() -> None:
    """A matcher or `by` label the series do not carry would filter everything out, or group it all into
    one series, without an error in Grafana. Target labels other than hami-node's `node` (namespace and
    pod of the scraped pod, job, instance) do not count: they say nothing about GPUs or workloads."""
    labels = {**control_labels(), **NODE_LABELS}
    assert set(labels) >= {name for _, expr in panel_queries() for name in metric_names(expr)}
    missing = sorted(
        (title, name, label)
        for title, expr in panel_queries()
        for name, label in label_references(expr)
        if label not in labels[name]
    )
    assert missing == []
    # Every family hami-control exports was populated, so its label names are all there.
    assert set(control_labels()) >= {n for n in control_metrics() if not n.endswith(("_sum", "_count"))}


def test_every_variable_queries_an_exported_metric() -> None:
    variables = dict(variable_queries())
    assert set(variables) == {"node", "vendor", "namespace"}
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


def test_the_node_vendor_and_namespace_variables_filter_the_panels() -> None:
    """Each variable is used, as a regex matcher (multi-value and All give regexes)."""
    exprs = [expr for _, expr in panel_queries()]
    for variable, label in (("$node", "node"), ("$vendor", "vendor"), ("$namespace", "namespace")):
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
