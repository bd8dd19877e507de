"""hami_control.metrics: exact values and labels of HAMi's families read from a real ClusterCache, the request
instruments, private registries, and that the fast text renderer says what the registry scrape says."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hami_api.annotations import (
    DEVICES_ALLOCATED,
)
from hami_api.containers import footprint_slices, init_kinds
from hami_api.types import GPUInfo, GPUSlice, PodAllocation
from hami_control.cache import CacheStats, ClusterCache, PodHolding
from hami_control.config import ControlConfig
from hami_control.connections import ConnectionLimits, ConnectionStats
from hami_control.metrics import (
    BIND_OUTCOMES,
    CLUSTER_FAMILIES,
    CONNECTION_DROP_REASONS,
    FILTER_REASONS,
    MIB,
    OTHER,
    ControlMetrics,
    MetricsSnapshot,
    QuotaEntry,
)
from hami_control.pod_store import PodStore
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.usage import NodeGPUs
from tests.builders import T4, Json, allocation, allocation_annotations, container, gpu_info, node, pod

# --- builders ------------------------------------------------------------------------------------------


def peak(allocation: PodAllocation, inits: int) -> tuple[GPUSlice, ...]:
    """The footprint of a pod whose first `inits` containers are plain init containers."""
    return footprint_slices(allocation, init_kinds(inits, len(allocation)))


def counted_gpu(uuid: str, index: int = 0, **fields: Any) -> GPUInfo:
    """GPU `uuid` of 4 slots; `fields` are `gpu_info`'s (`devmem`, `devcore`, `type`)."""
    return gpu_info(index, id=uuid, count=4, **fields)


def running_pod(
    uid: str, node: str, allocation: PodAllocation, *, namespace: str = "default", inits: int = 0
) -> Json:
    """Running pod `pod-<uid>` on `node` holding `allocation` (its first `inits` containers init ones)."""
    regular = len(allocation) - inits
    return pod(
        f"pod-{uid}",
        *(container(f"c{i}") for i in range(regular)),
        init=[container(f"i{i}") for i in range(inits)],
        namespace=namespace,
        uid=uid,
        phase="Running",
        annotations=allocation_annotations(node, allocation, bind_phase=None, keys=(DEVICES_ALLOCATED,)),
    )


class FakeQuotas:
    """A QuotaSource: fixed limits and usage per namespace."""

    def __init__(self, entries: Mapping[str, tuple[QuotaLimits, QuotaUsage]]) -> None:
        self.entries = dict(entries)

    def namespaces(self) -> Iterable[str]:
        return self.entries.keys()

    def limits(self, namespace: str) -> QuotaLimits:
        return self.entries[namespace][0]

    def used(self, namespace: str) -> QuotaUsage:
        return self.entries[namespace][1]


Series = dict[str, dict[frozenset[tuple[str, str]], float]]


def parse(body: bytes) -> Series:
    """sample name -> {labels: value}."""
    out: Series = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def scrape(metrics: ControlMetrics) -> Series:
    body, content_type = metrics.render()
    assert content_type == CONTENT_TYPE_LATEST
    return parse(body)


def nonzero(series: Mapping[frozenset[tuple[str, str]], float]) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of a family other than the zeros it starts with."""
    return {key: value for key, value in series.items() if value}


def labels(**kv: str) -> frozenset[tuple[str, str]]:
    return frozenset({"zone": "vGPU", **kv}.items())


def gpu_labels(uuid: str, index: int, node: str = "n1", **extra: str) -> frozenset[tuple[str, str]]:
    """An NVIDIA GPU's series labels (`vendor="nvidia"` beside HAMi's)."""
    return labels(node=node, device_uuid=uuid, device_index=str(index), vendor="nvidia", **extra)


G0, G1 = counted_gpu("GPU-0"), counted_gpu("GPU-1", 1)


def store(cache: ClusterCache) -> PodStore:
    """The pod store feeding `cache` (what the pods watch does)."""
    return PodStore(ControlConfig(), cache)


def delete(pods: PodStore, namespace: str, name: str, uid: str) -> None:
    pods.apply("DELETED", {"metadata": {"namespace": namespace, "name": name, "uid": uid}})


@pytest.fixture
def pods() -> PodStore:
    """n1 with two T4s; u1 and u2 on GPU-0; u3 has two containers on GPU-1 (namespace team)."""
    c = ClusterCache()
    p = store(c)
    c.node_upserted(node("n1", [G0, G1]))
    p.apply("ADDED", running_pod("u1", "n1", allocation([("GPU-0", 4000, 30)])))
    p.apply("ADDED", running_pod("u2", "n1", allocation([("GPU-0", 2000, 20)])))
    p.apply(
        "ADDED",
        running_pod("u3", "n1", allocation([("GPU-1", 1000, 10)], [("GPU-1", 3000, 15)]), namespace="team"),
    )
    return p


@pytest.fixture
def cache(pods: PodStore) -> ClusterCache:
    return pods.gpus


# --- HAMi's GPU families ---------------------------------------------------------------------------------


def test_gpu_families_exact(cache: ClusterCache) -> None:
    s = scrape(ControlMetrics(cache))
    t = {"device_type": T4}
    assert s["hami_gpu_memory_limit_bytes"] == {
        gpu_labels("GPU-0", 0, **t): 16000 * MIB,
        gpu_labels("GPU-1", 1, **t): 16000 * MIB,
    }
    assert s["hami_gpu_core_limit_ratio"] == {
        gpu_labels("GPU-0", 0, **t): 100,
        gpu_labels("GPU-1", 1, **t): 100,
    }
    assert s["hami_gpu_memory_allocated_bytes"] == {
        gpu_labels("GPU-0", 0, device_cores="100", **t): 6000 * MIB,
        gpu_labels("GPU-1", 1, device_cores="100", **t): 4000 * MIB,
    }
    assert s["hami_gpu_shared_count"] == {gpu_labels("GPU-0", 0, **t): 2, gpu_labels("GPU-1", 1, **t): 2}
    assert s["hami_gpu_core_allocated_ratio"] == {
        gpu_labels("GPU-0", 0, **t): 50,
        gpu_labels("GPU-1", 1, **t): 25,
    }
    overview = {"device_cores": "100", "device_memory_limit": "16000", **t}
    assert s["hami_node_gpu_overview"] == {
        gpu_labels("GPU-0", 0, **overview): 6000 * MIB,
        gpu_labels("GPU-1", 1, **overview): 4000 * MIB,
    }
    assert s["hami_node_gpu_memory_allocated_ratio"] == {
        gpu_labels("GPU-0", 0): 6000 / 16000,
        gpu_labels("GPU-1", 1): 4000 / 16000,
    }


def test_idle_gpu_reports_zero_and_memoryless_gpu_has_no_ratio() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n2", [counted_gpu("GPU-A", devmem=0, devcore=200, type="NVIDIA-Odd")]))
    s = scrape(ControlMetrics(cache))
    t = {"device_type": "NVIDIA-Odd"}
    assert s["hami_gpu_memory_limit_bytes"] == {gpu_labels("GPU-A", 0, "n2", **t): 0}
    assert s["hami_gpu_core_limit_ratio"] == {gpu_labels("GPU-A", 0, "n2", **t): 200}  # raw, like HAMi
    assert s["hami_gpu_shared_count"] == {gpu_labels("GPU-A", 0, "n2", **t): 0}
    assert "hami_node_gpu_memory_allocated_ratio" not in s


def test_vgpu_per_pod_and_gpu(cache: ClusterCache) -> None:
    s = scrape(ControlMetrics(cache))

    def pod(uid: str, uuid: str, namespace: str = "default") -> frozenset[tuple[str, str]]:
        return labels(namespace=namespace, node="n1", pod=f"pod-{uid}", device_uuid=uuid, vendor="nvidia")

    assert s["hami_vgpu_memory_allocated_bytes"] == {
        pod("u1", "GPU-0"): 4000 * MIB,
        pod("u2", "GPU-0"): 2000 * MIB,
        pod("u3", "GPU-1", "team"): 4000 * MIB,  # both containers on GPU-1, summed
    }
    assert s["hami_vgpu_core_allocated_ratio"] == {
        pod("u1", "GPU-0"): 30,
        pod("u2", "GPU-0"): 20,
        pod("u3", "GPU-1", "team"): 25,
    }


def test_vgpu_counts_init_container_peak() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [G0]))
    # init container asks 5000 MiB / 40 %, the regular one 1000 / 10: the pod holds the peak.
    store(cache).apply(
        "ADDED", running_pod("u1", "n1", allocation([("GPU-0", 5000, 40)], [("GPU-0", 1000, 10)]), inits=1)
    )
    s = scrape(ControlMetrics(cache))
    key = labels(namespace="default", node="n1", pod="pod-u1", device_uuid="GPU-0", vendor="nvidia")
    assert s["hami_vgpu_memory_allocated_bytes"] == {key: 5000 * MIB}
    assert s["hami_vgpu_core_allocated_ratio"] == {key: 40}
    assert s["hami_gpu_shared_count"] == {gpu_labels("GPU-0", 0, device_type=T4): 1}


def test_deleting_a_pod_lowers_the_gauges(cache: ClusterCache, pods: PodStore) -> None:
    metrics = ControlMetrics(cache)
    delete(pods, "default", "pod-u1", "u1")
    s = scrape(metrics)
    t = {"device_type": T4}
    assert s["hami_gpu_memory_allocated_bytes"][gpu_labels("GPU-0", 0, device_cores="100", **t)] == 2000 * MIB
    assert s["hami_gpu_shared_count"][gpu_labels("GPU-0", 0, **t)] == 1
    assert s["hami_gpu_core_allocated_ratio"][gpu_labels("GPU-0", 0, **t)] == 20
    assert s["hami_node_gpu_memory_allocated_ratio"][gpu_labels("GPU-0", 0)] == 2000 / 16000
    assert {dict(k)["pod"] for k in s["hami_vgpu_memory_allocated_bytes"]} == {"pod-u2", "pod-u3"}
    assert s["hami_scheduler_cache_pods"] == {frozenset(): 2}


def test_deleted_node_disappears() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [G0]))
    cache.node_upserted(node("n2", [counted_gpu("GPU-9")]))
    metrics = ControlMetrics(cache)
    cache.node_deleted("n1")
    s = scrape(metrics)
    assert {dict(k)["node"] for k in s["hami_gpu_memory_limit_bytes"]} == {"n2"}
    assert s["hami_scheduler_cache_nodes"] == {frozenset(): 1}


# --- quotas, cache gauges, build info -----------------------------------------------------------------------


def test_quota_used_and_limit() -> None:
    quotas = FakeQuotas(
        {
            "team": (QuotaLimits(memory=8192, cores=100), QuotaUsage(4096, 50)),
            "mem-only": (QuotaLimits(memory=2048), QuotaUsage(1024, 30)),
            "none": (QuotaLimits(), QuotaUsage(7, 7)),  # no limit: not reported
        }
    )
    s = scrape(ControlMetrics(ClusterCache(), quotas))

    def q(namespace: str, name: str, **limit: str) -> frozenset[tuple[str, str]]:
        return labels(namespace=namespace, quota_name=name, **limit)

    assert s["hami_resource_quota_used"] == {
        q("team", "nvidia.com/gpumem", limit="8192"): 4096,
        q("team", "nvidia.com/gpucores", limit="100"): 50,
        q("mem-only", "nvidia.com/gpumem", limit="2048"): 1024,
        q("mem-only", "nvidia.com/gpucores", limit="0"): 30,
    }
    assert s["hami_resource_quota_limit"] == {
        q("team", "nvidia.com/gpumem"): 8192,
        q("team", "nvidia.com/gpucores"): 100,
        q("mem-only", "nvidia.com/gpumem"): 2048,
    }


def test_quota_families_empty_without_a_source() -> None:
    s = scrape(ControlMetrics(ClusterCache()))
    assert "hami_resource_quota_used" not in s and "hami_resource_quota_limit" not in s


def test_cache_gauges() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [G0]))
    cache.node_upserted(node("bare"))  # no register annotation: unregistered
    pods = store(cache)
    pods.apply("ADDED", running_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    pods.assume("u2", "n1", allocation([("GPU-0", 500, 5)]), (), now=1.0, namespace="default", name="pod-u2")
    s = scrape(ControlMetrics(cache))
    assert s["hami_scheduler_cache_nodes"] == {frozenset(): 1}
    assert s["hami_scheduler_cache_unregistered_nodes"] == {frozenset(): 1}
    assert s["hami_scheduler_cache_pods"] == {frozenset(): 2}
    assert s["hami_scheduler_cache_assumed_pods"] == {frozenset(): 1}
    # the assumed pod counts in the GPU and vGPU families like a confirmed one
    assert s["hami_gpu_shared_count"] == {gpu_labels("GPU-0", 0, device_type=T4): 2}
    assert len(s["hami_vgpu_memory_allocated_bytes"]) == 2


def test_build_info() -> None:
    s = scrape(ControlMetrics(ClusterCache(), version="1.2.3", revision="abc", build_date="2026-01-01"))
    [(key, value)] = s["hami_build_info"].items()
    info = dict(key)
    assert value == 1
    assert (info["version"], info["revision"], info["build_date"]) == ("1.2.3", "abc", "2026-01-01")
    assert info["go_version"].startswith("python3.") and info["compiler"] and "/" in info["platform"]
    assert "zone" not in info


def test_default_version_is_a_string() -> None:
    s = scrape(ControlMetrics(ClusterCache()))
    [key] = s["hami_build_info"]
    assert dict(key)["version"]


def test_empty_cluster_still_announces_every_family() -> None:
    body, _ = ControlMetrics(ClusterCache()).render()
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert set(CLUSTER_FAMILIES) <= names


def test_custom_resource_names_and_zone() -> None:
    from hami_api.resources import ResourceNames

    quotas = FakeQuotas({"ns": (QuotaLimits(cores=10), QuotaUsage(0, 5))})
    names = ResourceNames(memory="example.com/mem", cores="example.com/cores")
    s = scrape(ControlMetrics(ClusterCache(), quotas, resource_names=names, zone="z1"))
    assert s["hami_resource_quota_limit"] == {
        frozenset({"namespace": "ns", "quota_name": "example.com/cores", "zone": "z1"}.items()): 10
    }


# --- request instruments --------------------------------------------------------------------------------


def test_filter_histogram_and_reasons() -> None:
    metrics = ControlMetrics(ClusterCache())
    metrics.observe_filter(0.003, {"CardInsufficientMemory": 3, "node unregistered: annotation missing": 2})
    metrics.observe_filter(0.2, {"CardInsufficientMemory": 1, "NumaNotFit": 0})
    metrics.observe_filter(20.0)
    s = scrape(metrics)
    buckets = {dict(k)["le"]: v for k, v in s["hami_extender_filter_duration_seconds_bucket"].items()}
    assert buckets["0.0025"] == 0 and buckets["0.005"] == 1 and buckets["0.25"] == 2
    assert buckets["10.0"] == 2 and buckets["+Inf"] == 3
    assert s["hami_extender_filter_duration_seconds_count"] == {frozenset(): 3}
    assert s["hami_extender_filter_duration_seconds_sum"][frozenset()] == pytest.approx(20.203)
    assert nonzero(s["hami_extender_filter_node_reasons_total"]) == {
        frozenset({("reason", "CardInsufficientMemory")}): 4,
        frozenset({("reason", "node unregistered")}): 2,
    }


def test_bind_prioritize_webhook_instruments() -> None:
    metrics = ControlMetrics(ClusterCache())
    metrics.observe_bind(0.01, "success")
    metrics.observe_bind(0.02, "success")
    metrics.observe_bind(1.5, "conflict")
    metrics.observe_prioritize(0.0004)
    metrics.observe_webhook(0.001, True)
    metrics.observe_webhook(0.001, False)
    metrics.observe_webhook(0.001, True)
    s = scrape(metrics)
    assert nonzero(s["hami_extender_bind_total"]) == {
        frozenset({("outcome", "success")}): 2,
        frozenset({("outcome", "conflict")}): 1,
    }
    assert s["hami_extender_bind_duration_seconds_count"] == {frozenset(): 3}
    prioritize = {dict(k)["le"]: v for k, v in s["hami_extender_prioritize_duration_seconds_bucket"].items()}
    assert prioritize["0.0005"] == 1
    assert s["hami_webhook_requests_total"] == {
        frozenset({("allowed", "true")}): 2,
        frozenset({("allowed", "false")}): 1,
    }
    assert s["hami_webhook_duration_seconds_count"] == {frozenset(): 3}


def test_connection_counters_are_zero_before_a_server_and_the_servers_after() -> None:
    metrics = ControlMetrics(ClusterCache())
    s = scrape(metrics)
    for name in ("open", "peak", "accepted_total", "refused_total"):
        assert s[f"hami_control_connections_{name}"] == {frozenset(): 0}, name
    assert s["hami_control_connections_max"] == {frozenset(): 1024}  # the default cap until one is given
    assert s["hami_control_connections_dropped_total"] == {
        frozenset({("reason", r)}): 0 for r in CONNECTION_DROP_REASONS
    }
    stats = ConnectionStats(
        open=3,
        peak=9,
        accepted=40,
        header_timeouts=5,
        body_timeouts=4,
        tls_handshake_timeouts=3,
        tls_handshake_failures=2,
        evicted=1,
        refused=7,
    )
    metrics.watch_connections(lambda: stats, ConnectionLimits(max_connections=128))
    s = scrape(metrics)
    assert {
        n: v[frozenset()]
        for n, v in s.items()
        if n.startswith("hami_control_connections_") and "dropped" not in n
    } == {
        "hami_control_connections_open": 3,
        "hami_control_connections_max": 128,
        "hami_control_connections_peak": 9,
        "hami_control_connections_accepted_total": 40,
        "hami_control_connections_refused_total": 7,
    }
    assert s["hami_control_connections_dropped_total"] == {
        frozenset({("reason", "header_timeout")}): 5,
        frozenset({("reason", "body_timeout")}): 4,
        frozenset({("reason", "tls_handshake_timeout")}): 3,
        frozenset({("reason", "tls_handshake_failed")}): 2,
        frozenset({("reason", "evicted")}): 1,
    }
    stats.refused += 1  # read afresh at each scrape
    assert scrape(metrics)["hami_control_connections_refused_total"] == {frozenset(): 8}
    assert parse(metrics.render()[0]) == parse(generate_latest(metrics.registry))  # the registry has them too


@pytest.mark.parametrize("seconds", [-0.1, float("nan")])
def test_bad_durations_rejected(seconds: float) -> None:
    metrics = ControlMetrics(ClusterCache())
    with pytest.raises(ValueError, match="seconds"):
        metrics.observe_bind(seconds, "success")
    with pytest.raises(ValueError, match="seconds"):
        metrics.observe_webhook(seconds, True)


def test_negative_reason_count_rejected() -> None:
    with pytest.raises(ValueError, match="CardNotHealth"):
        ControlMetrics(ClusterCache()).observe_filter(0.1, {"CardNotHealth": -1})


def test_caller_label_values_are_bounded_besides_the_known_ones() -> None:
    metrics = ControlMetrics(ClusterCache(), max_label_values=2)
    for outcome in ("success", "conflict", "weird-1", "weird-2", "weird-3", "weird-4", "success"):
        metrics.observe_bind(0.01, outcome)
    s = scrape(metrics)
    counts = {dict(k)["outcome"]: v for k, v in s["hami_extender_bind_total"].items()}
    assert counts == {
        **{outcome: 0 for outcome in BIND_OUTCOMES},
        "success": 2,
        "conflict": 1,
        "weird-1": 1,
        "weird-2": 1,
        OTHER: 2,
    }


def test_every_counter_starts_at_zero_for_each_known_label_value() -> None:
    s = scrape(ControlMetrics(ClusterCache()))
    assert s["hami_extender_bind_total"] == {frozenset({("outcome", o)}): 0 for o in BIND_OUTCOMES}
    assert s["hami_extender_filter_node_reasons_total"] == {
        frozenset({("reason", r)}): 0 for r in FILTER_REASONS
    }
    assert s["hami_webhook_requests_total"] == {frozenset({("allowed", a)}): 0 for a in ("true", "false")}
    assert "CardInsufficientMemory" in FILTER_REASONS and "NodeUnregistered" in FILTER_REASONS


def _outcomes_in(path: Path) -> set[str]:
    """The bind outcomes a module's code gives: `_Failed("x", ...)`, `_Obstacle(..., "x")`,
    `fail(request, "x", ...)`, `outcomes["x"]` and `outcome = "x"` (or a conditional of two)."""
    found: set[str] = set()

    def text(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return text(node.body) + text(node.orelse)
        return []

    for item in ast.walk(ast.parse(path.read_text())):
        if isinstance(item, ast.Call):
            name = item.func.attr if isinstance(item.func, ast.Attribute) else getattr(item.func, "id", "")
            position = {"_Failed": 0, "_Obstacle": 1, "fail": 1}.get(name)
            if position is not None and len(item.args) > position:
                found.update(text(item.args[position]))
        elif isinstance(item, ast.Subscript) and isinstance(item.value, ast.Attribute):
            if item.value.attr == "outcomes":
                found.update(text(item.slice))
        elif isinstance(item, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "outcome" for t in item.targets
        ):
            found.update(text(item.value))
    return found


def test_the_known_bind_outcomes_are_every_outcome_the_binder_and_the_extender_give() -> None:
    root = Path(__file__).resolve().parents[2] / "hami_control"
    given = _outcomes_in(root / "binder.py") | _outcomes_in(root / "scheduling.py")
    assert {"success", "conflict", "no_fit", "wait_timeout", "bad_request"} <= given  # the reader works
    assert given <= set(BIND_OUTCOMES)


def test_two_instances_do_not_collide() -> None:
    a, b = ControlMetrics(ClusterCache()), ControlMetrics(ClusterCache())
    a.observe_bind(0.01, "success")
    sa, sb = scrape(a), scrape(b)
    assert nonzero(sa["hami_extender_bind_total"]) == {frozenset({("outcome", "success")}): 1}
    assert nonzero(sb["hami_extender_bind_total"]) == {}
    assert a.registry is not b.registry
    assert b"hami_" not in generate_latest(REGISTRY)


def test_leader_and_certificate_expiry_are_read_at_each_scrape() -> None:
    metrics = ControlMetrics(ClusterCache())
    s = scrape(metrics)
    assert s["hami_control_leader"] == {frozenset(): 1}  # no election: this replica serves the extender
    assert "hami_control_certificate_expiry_timestamp_seconds" not in s  # no certificate (plain HTTP)
    leading, expiry = [False], [1_900_000_000.0]
    metrics.watch_leader(lambda: leading[0])
    metrics.watch_certificate(lambda: expiry[0])
    s = scrape(metrics)
    assert s["hami_control_leader"] == {frozenset(): 0}
    assert s["hami_control_certificate_expiry_timestamp_seconds"] == {frozenset(): 1_900_000_000}
    leading[0] = True
    assert scrape(metrics)["hami_control_leader"] == {frozenset(): 1}
    assert parse(metrics.render()[0]) == parse(generate_latest(metrics.registry))


def test_pods_allocating_are_those_bound_and_waiting_for_their_node_daemon_with_their_bind_time(
    cache: ClusterCache,
) -> None:
    store = PodStore(ControlConfig(), cache)
    metrics = ControlMetrics(cache)
    store.add_listener(metrics.allocating.pod_event)
    bound = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": "1700000000"}
    store.apply("ADDED", pod("a", namespace="ml", uid="u-a", node_name="gpu-1", annotations=bound))
    store.apply("ADDED", pod("b", namespace="default", uid="u-b", node_name="gpu-2", annotations=bound))
    store.apply("ADDED", pod("c", uid="u-c", annotations={"hami.io/bind-phase": "allocating"}))  # no node
    store.apply(
        "ADDED", pod("d", uid="u-d", node_name="gpu-1", annotations={"hami.io/bind-phase": "success"})
    )
    store.apply("ADDED", pod("e", uid="u-e", node_name="gpu-1", phase="Failed", annotations=bound))
    garbled = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": "yesterday"}
    store.apply("ADDED", pod("f", namespace="default", uid="u-f", node_name="gpu-2", annotations=garbled))

    def allocating() -> dict[tuple[str, str, str], float]:
        s = scrape(metrics)
        assert s["hami_scheduler_allocating_pods"] == {frozenset(): len(metrics.allocating.pods())}
        return {
            (d["namespace"], d["node"], d["pod"]): v
            for d, v in (
                (dict(k), v) for k, v in s["hami_scheduler_allocating_pod_bind_timestamp_seconds"].items()
            )
        }

    assert allocating() == {
        ("ml", "gpu-1", "a"): 1_700_000_000,
        ("default", "gpu-2", "b"): 1_700_000_000,
        ("default", "gpu-2", "f"): 0,
    }
    done = {"hami.io/bind-phase": "success", "hami.io/bind-time": "1700000000"}
    store.apply("MODIFIED", pod("a", namespace="ml", uid="u-a", node_name="gpu-1", annotations=done))
    store.apply("DELETED", pod("b", namespace="default", uid="u-b", node_name="gpu-2", annotations=bound))
    assert allocating() == {("default", "gpu-2", "f"): 0}


# --- the two renderers agree, and snapshots ----------------------------------------------------------------


def test_render_matches_registry_scrape(cache: ClusterCache) -> None:
    quotas = FakeQuotas({"team": (QuotaLimits(memory=8192), QuotaUsage(4096, 50))})
    metrics = ControlMetrics(cache, quotas, version="v")
    metrics.observe_filter(0.01, {"CardInsufficientCore": 1})
    assert parse(metrics.render()[0]) == parse(generate_latest(metrics.registry))


_label_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(_label_text, st.lists(st.tuples(_label_text, st.integers(0, 80000)), max_size=3)),
        max_size=3,
    ),
    pods=st.lists(
        st.tuples(_label_text, _label_text, st.integers(0, 10**6), st.integers(0, 300)), max_size=3
    ),
    quota=st.tuples(_label_text, st.none() | st.integers(0, 10**9), st.integers(0, 10**9)),
    version=_label_text,
)
def test_render_matches_prometheus_client_for_any_values(
    nodes: list[tuple[str, list[tuple[str, int]]]],
    pods: list[tuple[str, str, int, int]],
    quota: tuple[str, int | None, int],
    version: str,
) -> None:
    """The fast text renderer against prometheus_client's exposition of the same snapshot (escaping of
    any label text, number formatting), pure: the snapshot is built by hand."""
    snap = MetricsSnapshot(
        nodes=tuple(
            NodeGPUs.of(
                name,
                [counted_gpu(uuid, i, devmem=mem, type=uuid + '"\\\n') for i, (uuid, mem) in enumerate(g)],
            )
            for name, g in nodes
        ),
        holdings=tuple(
            PodHolding(
                f"u{i}", ns, name, "n1", (GPUSlice("GPU-x", mem, cores), GPUSlice("GPU-x", 1, 1)), False
            )
            for i, (ns, name, mem, cores) in enumerate(pods)
        ),
        stats=CacheStats(len(nodes), 1, len(pods), 0),
        quotas=(QuotaEntry(quota[0], QuotaLimits(memory=quota[1], cores=7), QuotaUsage(quota[2], 3)),),
    )
    metrics = ControlMetrics(ClusterCache(), version=version)

    class Generic:
        def collect(self) -> Iterable[Metric]:
            return metrics._families.collect(snap)  # the registry collector's path, on this snapshot

    fast = parse(metrics.render(snap)[0])
    generic = parse(generate_latest(Generic()))
    assert {k: v for k, v in fast.items() if k in generic} == generic


def test_snapshot_rendered_on_another_thread_is_frozen(cache: ClusterCache, pods: PodStore) -> None:
    metrics = ControlMetrics(cache)
    snap = metrics.snapshot()
    delete(pods, "default", "pod-u1", "u1")  # after the snapshot: not seen by its render
    result: list[bytes] = []
    worker = threading.Thread(target=lambda: result.append(metrics.render(snap)[0]))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    s = parse(result[0])
    assert s["hami_gpu_shared_count"][gpu_labels("GPU-0", 0, device_type=T4)] == 2
    assert scrape(metrics)["hami_gpu_shared_count"][gpu_labels("GPU-0", 0, device_type=T4)] == 1
