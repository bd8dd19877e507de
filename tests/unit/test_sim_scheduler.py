"""The pure parts of the kube-scheduler stand-in: KubeSchedulerConfiguration decoding and validation,
kube's pod requests, filters, scores and messages, and the scheduling queue with an injected clock."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_sim.scheduler.cache import ClusterCache
from hami_sim.scheduler.config import (
    ConfigError,
    load_configuration,
    load_scheduler_config,
    parse_configuration,
    parse_configuration_text,
    parse_duration,
    scheduler_config,
)
from hami_sim.scheduler.extender import HTTPExtender
from hami_sim.scheduler.fit import (
    DEFAULT_MEMORY_REQUEST,
    NodeInfo,
    PodAsk,
    combine_scores,
    extender_score,
    filter_node,
    fit_error_message,
    least_allocated_score,
    num_feasible_nodes_to_find,
    pod_requests,
    select_host,
    truncate_message,
)
from hami_sim.scheduler.queue import SchedulingQueue, State, backoff_duration
from hami_sim.scheduler.standin import SchedulerStandIn
from tests.builders import container, node, pod

SHIPPED = Path(__file__).resolve().parents[2] / "daemonset" / "scheduler" / "kube-scheduler-config.yaml"
GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/priority",
]


def base() -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "hami-scheduler"}],
        "extenders": [
            {
                "urlPrefix": "https://x:443",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 1,
            }
        ],
    }


def errors_of(document: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_configuration(document, "f.yaml")
    return str(caught.value)


# --- configuration -------------------------------------------------------------------------------------


def test_shipped_file() -> None:
    whole = load_configuration(SHIPPED)
    assert [p.scheduler_name for p in whole.profiles] == ["hami-scheduler"]
    assert whole.leader_election.leader_elect
    assert (whole.leader_election.resource_name, whole.leader_election.resource_namespace) == (
        "hami-scheduler",
        "hami-system",
    )
    assert (whole.pod_initial_backoff_s, whole.pod_max_backoff_s) == (1, 10)
    (extender,) = whole.extenders
    assert extender.url_prefix == "https://hami-scheduler-extender.hami-system.svc:443"
    assert (extender.filter_verb, extender.prioritize_verb, extender.bind_verb) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender.weight == 1 and extender.node_cache_capable and extender.enable_https
    assert extender.tls is not None and not extender.tls.insecure
    assert extender.tls.ca_file == "/etc/hami/tls/ca.crt"
    assert extender.http_timeout_s == 30.0
    # NVIDIA's five first, then every other vendor's (tests/unit/test_manifests.py checks them all)
    assert [r.name for r in extender.managed_resources][:5] == GPU_RESOURCES
    assert "hygon.com/dcunum" in [r.name for r in extender.managed_resources]
    assert all(r.ignored_by_scheduler for r in extender.managed_resources)
    assert not extender.ignorable
    config = load_scheduler_config(SHIPPED)
    assert config.scheduler_name == "hami-scheduler"
    assert config.ignored_resources == frozenset(r.name for r in extender.managed_resources)
    assert any("leader" in note for note in config.notes)


def test_overrides_for_the_local_cluster() -> None:
    config = load_scheduler_config(
        SHIPPED, extender_url="https://127.0.0.1:9443/", extender_ca_file="/tmp/ca.crt"
    )
    (extender,) = config.extenders
    assert extender.url_prefix == "https://127.0.0.1:9443"
    assert extender.tls is not None and extender.tls.ca_file == "/tmp/ca.crt"
    assert extender.filter_verb == "filter" and extender.weight == 1
    with pytest.raises(ConfigError, match=r"--extender-url 'ftp://x': must be an http"):
        load_scheduler_config(SHIPPED, extender_url="ftp://x")
    with pytest.raises(ConfigError, match=r'--profile "default-scheduler": .* no profile .*hami-scheduler'):
        load_scheduler_config(SHIPPED, profile="default-scheduler")


def test_kube_defaults() -> None:
    whole = parse_configuration(
        {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
    )
    assert [p.scheduler_name for p in whole.profiles] == ["default-scheduler"]
    assert whole.extenders == ()
    assert whole.parallelism == 16 and whole.leader_election.resource_name == "kube-scheduler"
    doc = base()
    del doc["extenders"][0]["prioritizeVerb"]
    del doc["extenders"][0]["weight"]
    (extender,) = parse_configuration(doc).extenders
    assert extender.weight == 0 and extender.http_timeout_s == 5.0  # no weight default; kube's 5 s timeout


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["extenders"][0].update(weight=0),
            "extenders[0].weight: Invalid value: 0: must have a positive",
        ),
        (
            lambda d: d["extenders"][0].update(weight="1"),
            'extenders[0].weight: Invalid value: "1": must be an integer',
        ),
        (
            lambda d: d["extenders"][0].update(weightt=1),
            'strict decoding error: unknown field "extenders[0].weightt"',
        ),
        (lambda d: d.update(leaderElect=True), 'strict decoding error: unknown field "leaderElect"'),
        (
            lambda d: d["extenders"][0].update(httpTimeout=30),
            "extenders[0].httpTimeout: Invalid value: 30: must be a",
        ),
        (lambda d: d["extenders"][0].update(httpTimeout="30"), 'missing unit in duration "30"'),
        (
            lambda d: d["extenders"][0].update(nodeCacheCapable="yes"),
            "extenders[0].nodeCacheCapable: Invalid value",
        ),
        (lambda d: d["extenders"][0].pop("urlPrefix"), "extenders[0].urlPrefix: Required value"),
        (lambda d: d["extenders"][0].update(urlPrefix="x:443"), "extenders[0].urlPrefix: Invalid value"),
        (
            lambda d: d["extenders"][0].update(managedResources=[{"name": "gpu"}]),
            'extenders[0].managedResources[0].name: Invalid value: "gpu": is an invalid extended resource',
        ),
        (
            lambda d: d["extenders"][0].update(managedResources=[{"name": "a.com/x"}, {"name": "a.com/x"}]),
            'extenders[0].managedResources[1].name: Invalid value: "a.com/x": duplicate extender managed',
        ),
        (
            lambda d: d["extenders"][0].update(tlsConfig={"caFile": "/x", "insecur": True}),
            'unknown field "extenders[0].tlsConfig.insecur"',
        ),
        (
            lambda d: d["extenders"][0].update(tlsConfig={"caData": "not base64!"}),
            "extenders[0].tlsConfig.caData: Invalid value",
        ),
        (
            lambda d: (
                d["extenders"].append({"urlPrefix": "http://y", "bindVerb": "bind"})
                or d["extenders"][0].update(bindVerb="bind")
            ),
            'extenders: Invalid value: "found 2 extenders implementing bind": only one extender can',
        ),
        (
            lambda d: d["profiles"].append({"schedulerName": "hami-scheduler"}),
            "profiles[1].schedulerName: Duplicate",
        ),
        (lambda d: d["profiles"].append({}), "profiles[1].schedulerName: Required value"),
        (
            lambda d: d.update(podInitialBackoffSeconds=0),
            "podInitialBackoffSeconds: Invalid value: 0: must be greater",
        ),
        (
            lambda d: d.update(podMaxBackoffSeconds=0),
            "podMaxBackoffSeconds: Invalid value: 0: must be greater than or",
        ),
        (
            lambda d: d.update(percentageOfNodesToScore=101),
            "percentageOfNodesToScore: Invalid value: 101: not in valid",
        ),
        (
            lambda d: d.update(apiVersion="kubescheduler.config.k8s.io/v1beta3"),
            'apiVersion: Invalid value: "kube',
        ),
        (
            lambda d: d.update(kind="Policy"),
            'kind: Invalid value: "Policy": must be KubeSchedulerConfiguration',
        ),
        (
            lambda d: d.update(leaderElection={"resourceLock": "endpoints"}),
            "leaderElection.resourceLock: Invalid",
        ),
        (lambda d: d.update(profiles="hami"), 'profiles: Invalid value: "str": must be a list'),
        (
            lambda d: d.update(leaderElection={"retryPeriod": "0s"}),
            'leaderElection.retryPeriod: Invalid value: "0s": must be greater than zero',
        ),
        (
            lambda d: d.update(leaderElection={"leaseDuration": "5s"}),
            'leaderElection.leaseDuration: Invalid value: "5s": LeaseDuration must be greater than',
        ),
    ],
)
def test_bad_files_name_the_key(change: Any, expected: str) -> None:
    doc = base()
    change(doc)
    message = errors_of(doc)
    assert message.startswith("f.yaml: invalid KubeSchedulerConfiguration: ")
    assert expected in message


def test_all_errors_are_reported_together() -> None:
    doc = base()
    doc["extenders"][0]["weight"] = -2
    doc["podInitialBackoffSeconds"] = -1
    message = errors_of(doc)
    assert "extenders[0].weight: Invalid value: -2" in message and "podInitialBackoffSeconds" in message


def test_yaml_level_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r'f\.yaml: strict decoding error: duplicate field "kind" \(line 2\)'
    ):
        parse_configuration_text("kind: A\nkind: B\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"f\.yaml: not valid YAML"):
        parse_configuration_text("a: [", "f.yaml")
    with pytest.raises(ConfigError, match="document is not a YAML mapping"):
        parse_configuration_text("- 1\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"--config .*missing.yaml: cannot read"):
        load_configuration(tmp_path / "missing.yaml")


def test_overrides_need_one_extender_url_prefix() -> None:
    doc = base()
    doc["extenders"] = []
    with pytest.raises(ConfigError, match=r"has 0 extenders at 0 URL prefixes \(none\); the overrides need"):
        scheduler_config(parse_configuration(doc), extender_url="http://x")
    doc = base()
    doc["extenders"].append({**doc["extenders"][0], "urlPrefix": "https://y:443"})
    with pytest.raises(
        ConfigError, match=r"has 2 extenders at 2 URL prefixes \(https://x:443, https://y:443\)"
    ):
        scheduler_config(parse_configuration(doc), extender_url="http://x")


def second_entry(**fields: Any) -> dict[str, Any]:
    """The fragmentation component's second extender entry: hami-control's CPU verbs at the same URL,
    ignorable, with no bind."""
    return {
        "urlPrefix": "https://x:443",
        "filterVerb": "cpu-filter",
        "prioritizeVerb": "cpu-prioritize",
        "weight": 1,
        "nodeCacheCapable": True,
        "ignorable": True,
        **fields,
    }


def test_overrides_apply_to_every_extender_sharing_the_url_prefix() -> None:
    doc = base()
    doc["extenders"][0]["managedResources"] = [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
    doc["extenders"].append(second_entry())
    config = scheduler_config(
        parse_configuration(doc), extender_url="https://127.0.0.1:9443/", extender_ca_file="/tmp/ca.crt"
    )
    first, second = config.extenders
    assert first.url_prefix == second.url_prefix == "https://127.0.0.1:9443"
    assert first.tls is not None and first.tls.ca_file == "/tmp/ca.crt"
    assert second.tls is not None and second.tls.ca_file == "/tmp/ca.crt"
    assert (second.filter_verb, second.prioritize_verb, second.bind_verb) == (
        "cpu-filter",
        "cpu-prioritize",
        "",
    )
    assert second.ignorable and not first.ignorable
    assert config.ignored_resources == frozenset({"nvidia.com/gpu"})


def test_cpu_is_no_managed_resource_as_in_kube_scheduler() -> None:
    """kube's validateExtenders refuses a native resource in managedResources
    (v1helper.IsExtendedResourceName: a name without a domain is native), so an entry cannot ask to be
    called for pods that request CPU: with no managedResources, IsInterested is true for every pod."""
    doc = base()
    doc["extenders"].append(second_entry(managedResources=[{"name": "cpu"}]))
    assert errors_of(doc) == (
        "f.yaml: invalid KubeSchedulerConfiguration: extenders[1].managedResources[0].name: Invalid value: "
        '"cpu": is an invalid extended resource name'
    )
    doc["extenders"][1] = second_entry()
    (_, second) = parse_configuration(doc).extenders
    cpu_only = pod("c", container(requests={"cpu": "1"}))
    best_effort = pod("b", container())
    gpu = pod("g", container(gpus=1))
    assert all(second.is_interested(p) for p in (cpu_only, best_effort, gpu))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("-2s", -2.0),
        ("10us", 1e-5),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "30", "1x", "1.s.", "--1s", "1 s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@given(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h"]))
def test_durations_round_trip(value: int, unit: str) -> None:
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    assert parse_duration(f"{value}{unit}") == pytest.approx(value * scale)


def test_extender_is_interested_only_in_managed_resources() -> None:
    (extender,) = load_scheduler_config(SHIPPED).extenders

    def pod(section: str, kind: str, resource: str) -> dict[str, Any]:
        return {"spec": {section: [{"name": "c", "resources": {kind: {resource: "1"}}}]}}

    assert extender.is_interested(pod("containers", "limits", "nvidia.com/gpu"))
    assert extender.is_interested(pod("initContainers", "requests", "nvidia.com/gpumem"))
    assert not extender.is_interested(pod("containers", "limits", "cpu"))
    assert not extender.is_interested({"spec": {"containers": [{"name": "c"}]}})
    doc = base()
    (everything,) = parse_configuration(doc).extenders
    assert everything.is_interested({"spec": {"containers": [{"name": "c"}]}})


# --- requests, filters, scores ----------------------------------------------------------------------------


def test_pod_requests_like_kube() -> None:
    with_sidecar = pod(
        "p",
        container("c", requests={"cpu": "500m", "memory": "1Gi"}),
        container("c", limits={"cpu": "1"}),
        init=[
            container("c", requests={"cpu": "2"}),
            container("c", requests={"cpu": "200m"}, restart_policy="Always"),
            container("c", requests={"cpu": "1900m"}),
        ],
        overhead={"cpu": "100m"},
    )
    # app 1.5 + sidecar 0.2 = 1.7; init peaks 2 and 1.9 + 0.2 = 2.1 -> max 2.1; + overhead 0.1
    assert pod_requests(with_sidecar) == {"cpu": 2200, "memory": 1024**3}
    empty = pod("p", container("c"))
    assert pod_requests(empty) == {}
    assert pod_requests(empty, non_zero=True) == {"cpu": 100, "memory": DEFAULT_MEMORY_REQUEST}


def node_info(
    name: str = "n",
    *,
    cpu: str = "4",
    labels: dict[str, str] | None = None,
    ready: bool | str = True,
    unschedulable: bool = False,
    taints: Sequence[dict[str, str]] = (),
) -> NodeInfo:
    """The scheduler's view of a node offering `cpu`, 8Gi and 3 pods."""
    info = NodeInfo(name)
    allocatable = {"cpu": cpu, "memory": "8Gi", "pods": "3"}
    info.set_node(
        node(
            name,
            labels=labels or {},
            allocatable=allocatable,
            ready=ready,
            unschedulable=unschedulable,
            taints=taints,
        )
    )
    return info


def one_gpu_pod(cpu: str = "1", **spec: Any) -> dict[str, Any]:
    """A pod of one container asking one GPU and `cpu`; `spec`: more pod spec fields."""
    return pod("p", container("c", gpus=1, requests={"cpu": cpu}), **spec)


IGNORED = frozenset(GPU_RESOURCES)
PLAIN_POD = pod("p", container("c"))
"""A pod that asks for nothing (kube still counts it as one pod)."""


def test_filters_in_kube_order_with_kube_reasons() -> None:
    pod = one_gpu_pod()
    ask = PodAsk.of(pod)
    assert filter_node(pod, ask, node_info(), IGNORED) == []
    # Not ignored, and the node does not list it: insufficient.
    assert filter_node(pod, ask, node_info(), ()) == ["Insufficient nvidia.com/gpu"]
    assert filter_node(pod, ask, node_info(unschedulable=True), IGNORED) == ["node(s) were unschedulable"]
    not_ready = node_info(ready=False)
    assert filter_node(pod, ask, not_ready, IGNORED) == [
        "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    ]
    unknown = node_info(ready="Unknown")
    assert "node.kubernetes.io/unreachable" in filter_node(pod, ask, unknown, IGNORED)[0]
    tolerant = one_gpu_pod(tolerations=[{"operator": "Exists"}])
    assert filter_node(tolerant, PodAsk.of(tolerant), not_ready, IGNORED) == []
    tainted = node_info(taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}])
    assert filter_node(pod, ask, tainted, IGNORED) == ["node(s) had untolerated taint {gpu: a100}"]
    tolerates = one_gpu_pod(
        tolerations=[{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]
    )
    assert filter_node(tolerates, PodAsk.of(tolerates), tainted, IGNORED) == []
    prefer = node_info(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}])
    assert filter_node(pod, ask, prefer, IGNORED) == []
    big = one_gpu_pod(cpu="5")
    assert filter_node(big, PodAsk.of(big), node_info(), IGNORED) == ["Insufficient cpu"]


def test_node_selector_and_required_affinity() -> None:
    zone_a = node_info(labels={"zone": "a", "gen": "3"})
    selected = one_gpu_pod(nodeSelector={"zone": "a"})
    assert filter_node(selected, PodAsk.of(selected), zone_a, IGNORED) == []
    other = one_gpu_pod(nodeSelector={"zone": "b"})
    assert filter_node(other, PodAsk.of(other), zone_a, IGNORED) == [
        "node(s) didn't match Pod's node affinity/selector"
    ]

    def affinity(*terms: Any) -> dict[str, Any]:
        return one_gpu_pod(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
                }
            }
        )

    cases = [
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "c"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}]}, True),
        ({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}, True),
        ({}, False),
    ]
    for term, fits in cases:
        pod = affinity(term)
        assert (filter_node(pod, PodAsk.of(pod), zone_a, IGNORED) == []) is fits, term
    either = affinity(cases[1][0], cases[0][0])
    assert filter_node(either, PodAsk.of(either), zone_a, IGNORED) == []


def test_room_counts_pods_already_there() -> None:
    info = node_info(cpu="2")
    pod = one_gpu_pod(cpu="1")
    ask = PodAsk.of(pod)
    info.add_pod(ask)
    assert filter_node(pod, ask, info, IGNORED) == []
    info.add_pod(ask)
    assert filter_node(pod, ask, info, IGNORED) == ["Insufficient cpu"]
    info.add_pod(ask, -1)
    info.add_pod(PodAsk.of(PLAIN_POD))
    info.add_pod(PodAsk.of(PLAIN_POD))
    assert filter_node(pod, ask, info, IGNORED) == ["Too many pods"]  # 3 pods allocatable
    no_pods = NodeInfo("x")
    ready = [{"type": "Ready", "status": "True"}]
    no_pods.set_node(
        {"metadata": {"name": "x"}, "status": {"allocatable": {"cpu": "8"}, "conditions": ready}}
    )
    assert "Too many pods" in filter_node(pod, ask, no_pods, IGNORED)


def test_least_allocated_score() -> None:
    info = node_info(cpu="4")  # 4000m, 8Gi
    ask = PodAsk.of(one_gpu_pod(cpu="1"))  # 1000m cpu, memory default 200Mi
    cpu_score = (4000 - 1000) * 100 // 4000
    memory_score = (8 * 1024**3 - DEFAULT_MEMORY_REQUEST) * 100 // (8 * 1024**3)
    assert least_allocated_score(ask, info) == (cpu_score + memory_score) // 2
    info.add_pod(PodAsk.of(one_gpu_pod(cpu="4")))
    memory_score = (8 * 1024**3 - 2 * DEFAULT_MEMORY_REQUEST) * 100 // (8 * 1024**3)
    assert least_allocated_score(ask, info) == (0 + memory_score) // 2  # cpu over capacity scores 0


def test_extender_scores_scale_by_weight_times_ten() -> None:
    assert extender_score(7, 1) == 70
    assert extender_score(10, 3) == 300
    own = {"a": 90, "b": 60, "c": 20}
    totals = combine_scores(own, [([("b", 5), ("c", 10), ("zz", 10)], 1), ([("a", 1)], 2)])
    assert totals == {"a": 90 + 20, "b": 60 + 50, "c": 20 + 100}  # unknown hosts ignored
    assert select_host(totals, random.Random(0)) == "c"


def test_ties_are_random_but_seeded() -> None:
    totals = {"a": 5, "b": 5, "c": 5, "d": 1}
    picks = [select_host(totals, random.Random(seed)) for seed in range(40)]
    assert set(picks) == {"a", "b", "c"}
    assert picks == [select_host(totals, random.Random(seed)) for seed in range(40)]
    with pytest.raises(ValueError, match="empty"):
        select_host({}, random.Random(0))


def test_fit_error_message_like_kube() -> None:
    reasons = {
        "n1": ["Insufficient cpu", "Insufficient memory"],
        "n2": ["Insufficient cpu"],
        "n3": ["1/4 CardInsufficientMemory"],
    }
    assert fit_error_message(12, reasons) == (
        "0/12 nodes are available: 1 1/4 CardInsufficientMemory, 1 Insufficient memory, 2 Insufficient cpu."
    )
    many = {f"n{i}": ["node(s) were unschedulable"] for i in range(10)} | {"x": ["Insufficient cpu"]}
    assert (
        fit_error_message(11, many)
        == "0/11 nodes are available: 1 Insufficient cpu, 10 node(s) were unschedulable."
    )
    assert fit_error_message(3, {}) == "0/3 nodes are available:"
    assert truncate_message("x" * 2000).endswith(" ...") and len(truncate_message("x" * 2000)) == 1024


def test_num_feasible_nodes_to_find() -> None:
    assert num_feasible_nodes_to_find(None, 10) == 10
    assert num_feasible_nodes_to_find(None, 99) == 99
    assert num_feasible_nodes_to_find(None, 1000) == 1000 * 42 // 100
    assert num_feasible_nodes_to_find(None, 6000) == 6000 * 5 // 100
    assert num_feasible_nodes_to_find(10, 500) == 100
    assert num_feasible_nodes_to_find(50, 500) == 250


def test_cache_assumes_confirms_and_forgets() -> None:
    cache = ClusterCache()
    cache.replace_nodes([{"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "2", "pods": "9"}}}])
    spec = {"containers": [container("c", requests={"cpu": "1"})]}
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": spec}
    cache.assume(pod, "n1", PodAsk.of(pod))
    assert cache.is_assumed("d/p") and cache.nodes["n1"].requested == {"cpu": 1000}
    cache.set_assigned({**pod, "spec": {**spec, "nodeName": "n1"}})
    assert not cache.is_assumed("d/p") and cache.nodes["n1"].requested == {"cpu": 1000}
    assert not cache.forget("d/p")
    assert (
        cache.delete_pod("d/p") and cache.nodes["n1"].requested == {"cpu": 0} and cache.nodes["n1"].pods == 0
    )
    cache.assume(pod, "n1", PodAsk.of(pod))
    assert cache.forget("d/p") and cache.nodes["n1"].pods == 0
    # A node change that matters is reported; a heartbeat-like change is not.
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "2", "pods": "9"}}}
    assert not cache.set_node(node)
    assert cache.set_node({**node, "metadata": {"name": "n1", "annotations": {"hami.io/x": "1"}}})
    cache.delete_node("n1")
    assert cache.candidates() == []


# --- the queue ----------------------------------------------------------------------------------------


def qpod(name: str, priority: int = 0, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "d"}, "spec": {"priority": priority, **spec}}


def test_backoff_duration_doubles_to_the_cap() -> None:
    assert [backoff_duration(n, 1, 10) for n in range(7)] == [0, 1, 2, 4, 8, 10, 10]
    assert backoff_duration(3, 0.5, 1.5) == 1.5


def test_active_order_priority_then_fifo() -> None:
    q = SchedulingQueue()
    q.add(qpod("a"), 0.0)
    q.add(qpod("b", priority=10), 1.0)
    q.add(qpod("c"), 2.0)
    order = []
    while (qp := q.pop(3.0)) is not None:
        order.append(qp.key)
        q.done(qp)
    assert order == ["d/b", "d/a", "d/c"]
    assert q.lengths() == {"active": 0, "backoff": 0, "unschedulable": 0, "in-flight": 0}


def test_unschedulable_waits_for_an_event_then_its_backoff() -> None:
    q = SchedulingQueue(1.0, 10.0)
    q.add(qpod("p"), 0.0)
    qp = q.pop(0.0)
    assert qp is not None and qp.attempts == 1
    assert q.unschedulable(qp, 0.5) is State.UNSCHEDULABLE
    assert q.pop(100.0) is None  # no event: stays (until the 5-minute flush)
    assert q.next_wakeup(100.0) == pytest.approx(300.5 - 100.0)
    q.move_all(100.2)
    assert q.lengths()["active"] == 1  # backoff (1 s from 0.5) long over
    qp = q.pop(100.2)
    assert qp is not None and qp.attempts == 2
    q.unschedulable(qp, 100.3)
    q.move_all(100.4)  # event during backoff: to backoffQ until 100.3 + 2
    assert q.lengths()["backoff"] == 1
    assert q.pop(102.2) is None
    assert q.next_wakeup(102.2) == pytest.approx(0.1)
    popped = q.pop(102.3)
    assert popped is not None and popped.attempts == 3


def test_unschedulable_pods_are_flushed_after_five_minutes() -> None:
    q = SchedulingQueue()
    q.add(qpod("p"), 0.0)
    qp = q.pop(0.0)
    assert qp is not None
    q.unschedulable(qp, 1.0)
    assert q.pop(300.9) is None
    again = q.pop(301.0)
    assert again is not None and again.attempts == 2


def test_errors_back_off_without_events() -> None:
    q = SchedulingQueue(1.0, 10.0)
    q.add(qpod("p"), 0.0)
    expiries = []
    now = 0.0
    for _ in range(6):
        qp = q.pop(now)
        assert qp is not None
        assert q.error(qp, now, "boom") is State.BACKOFF
        expiries.append(qp.backoff_expiry - now)
        wait = q.next_wakeup(now)
        assert wait is not None
        assert q.pop(now + wait - 0.01) is None
        now += wait
    assert expiries == [1, 2, 4, 8, 10, 10]


def test_event_during_the_attempt_is_not_lost() -> None:
    q = SchedulingQueue(1.0, 10.0)
    q.add(qpod("p"), 0.0)
    qp = q.pop(0.0)
    assert qp is not None
    q.move_all(0.1)  # e.g. a node added while the pod was being filtered
    assert q.unschedulable(qp, 0.2) is State.BACKOFF


def test_updates_and_deletes() -> None:
    q = SchedulingQueue()
    q.add(qpod("p"), 0.0)
    qp = q.pop(0.0)
    assert qp is not None
    q.unschedulable(qp, 0.0)
    q.add({**qpod("p"), "status": {"conditions": []}}, 5.0)  # status-only update: stays
    assert q.lengths()["unschedulable"] == 1
    q.add(qpod("p", nodeSelector={"a": "b"}), 6.0)  # spec change: moved
    assert q.lengths()["active"] == 1
    q.delete("d/p")
    assert q.pop(7.0) is None and q.pods == {}
    q.add(qpod("gone"), 0.0)
    flying = q.pop(0.0)
    assert flying is not None
    q.delete("d/gone")  # deleted while in flight
    assert q.unschedulable(flying, 1.0) is None and q.pods == {}
    q.add(qpod("again"), 0.0)
    flying = q.pop(0.0)
    assert flying is not None
    q.delete("d/again")
    q.add(qpod("again"), 0.5)  # ... and created again before the attempt ended
    assert q.unschedulable(flying, 1.0) is State.BACKOFF
    q.add(qpod("low"), 0.0)
    q.add(qpod("high"), 0.0)
    q.add(qpod("high", priority=5), 1.0)  # priority raised while queued
    first = q.pop(2.0)
    assert first is not None and first.key == "d/high"


@given(st.lists(st.sampled_from(["add", "pop-fail", "pop-error", "pop-done", "move", "tick"]), max_size=60))
def test_queue_never_loses_or_duplicates_pods(ops: list[str]) -> None:
    q = SchedulingQueue(1.0, 10.0)
    now = 0.0
    names = 0
    live: set[str] = set()
    for op in ops:
        now += 0.3
        if op == "add":
            names += 1
            q.add(qpod(f"p{names}"), now)
            live.add(f"d/p{names}")
        elif op.startswith("pop"):
            qp = q.pop(now)
            if qp is None:
                continue
            if op == "pop-fail":
                q.unschedulable(qp, now)
            elif op == "pop-error":
                q.error(qp, now)
            else:
                q.done(qp)
                live.discard(qp.key)
        elif op == "move":
            q.move_all(now)
        else:
            now += 5
        assert set(q.pods) == live
        assert sum(q.lengths().values()) == len(live)
    # Everything left becomes poppable after the longest wait.
    q.move_all(now)
    popped = set()
    while (qp := q.pop(now + 1000)) is not None:
        popped.add(qp.key)
        q.done(qp)
    assert popped == live


def test_a_gated_pod_waits_without_an_attempt_until_its_claim_status_changes() -> None:
    q = SchedulingQueue(1.0, 10.0)
    q.add(qpod("p"), 0.0)
    qp = q.pop(0.0)
    assert qp is not None
    assert q.gate(qp, 0.0, "ResourceClaim not created yet") is State.UNSCHEDULABLE
    assert (qp.attempts, qp.initial_attempt) == (0, None)
    q.add({**qpod("p"), "status": {"phase": "Pending"}}, 1.0)  # other status: stays
    assert q.lengths()["unschedulable"] == 1
    named = {
        **qpod("p"),
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]},
    }
    q.add(named, 1.5)  # the claim controller named the generated claim: moved, no backoff
    again = q.pop(1.5)
    assert again is not None and again.attempts == 1


def test_the_snapshot_keeps_the_stats_of_two_entries_sharing_a_url() -> None:
    doc = base()
    doc["extenders"][0]["urlPrefix"] = "http://x:80"
    doc["extenders"].append(second_entry(urlPrefix="http://x:80"))
    config = scheduler_config(parse_configuration(doc))
    standin = SchedulerStandIn(config)
    standin.extenders = [HTTPExtender(e) for e in config.extenders]
    standin.extenders[1].stats["filter"].record(0.002, ok=False)
    stats = standin.snapshot()["extenders"]
    assert list(stats) == ["http://x:80", "http://x:80#1"]
    assert stats["http://x:80"]["filter"]["calls"] == 0
    assert stats["http://x:80#1"]["filter"]["errors"] == 1
