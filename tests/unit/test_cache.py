"""hami_control.cache: one table test per rule (nodes, what pods hold, node generations). The pods' side
(watch events, assumptions) and the property test over both are in test_pod_store.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hami_api.annotations import (
    DEVICE_CORDON,
    NODE_PAIR_SCORE,
    NODE_REGISTER,
    encode_node_register,
    encode_node_register_legacy,
    encode_pair_scores,
)
from hami_api.containers import footprint_slices, init_kinds
from hami_api.types import GPUInfo, GPUPairScore, GPUSlice, PodAllocation
from hami_control.cache import ClusterCache, NodeUsage, PodHolding
from tests.builders import allocation, gpu_info, gpu_usage, node

# --- builders ------------------------------------------------------------------------------------------


def peak(allocation: PodAllocation, inits: int) -> tuple[GPUSlice, ...]:
    """The footprint of a pod whose first `inits` containers are plain init containers."""
    return footprint_slices(allocation, init_kinds(inits, len(allocation)))


def hold(cache: ClusterCache, uid: str, node: str, allocation: PodAllocation, assumed: bool = False) -> None:
    """What the pod store tells the cache for a pod holding `allocation` on `node` (no init containers)."""
    cache.hold(uid, PodHolding(uid, "default", f"pod-{uid}", node, peak(allocation, 0), assumed))


G0, G1 = gpu_info(0, count=4), gpu_info(1, count=4)
SLOTS = "nvidia.com/gpu"


def cache_with_node(*gpus: GPUInfo) -> ClusterCache:
    cache = ClusterCache()
    cache.node_upserted(node("n1", gpus or (G0, G1)))
    return cache


# --- nodes ---------------------------------------------------------------------------------------------


def test_registered_node_json_form() -> None:
    cache = cache_with_node()
    gpus = cache.node_gpus("n1")
    assert gpus is not None and [g.id for g in gpus.gpus] == ["GPU-0", "GPU-1"]
    assert list(cache.nodes()) == ["n1"]
    assert cache.unregistered_reason("n1") is None


def test_registered_node_legacy_form() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", register=encode_node_register_legacy([G0, G1]), allocatable={SLOTS: "8"}))
    gpus = cache.node_gpus("n1")
    assert gpus is not None and [g.info for g in gpus.gpus] == [G0, G1]


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (node("n1", allocatable={SLOTS: "8"}), f"annotation {NODE_REGISTER} is missing"),
        (node("n1", register="garbage", allocatable={SLOTS: "8"}), NODE_REGISTER),
        (node("n1", register='[{"id":"GPU-0","count":"x"}]', allocatable={SLOTS: "8"}), NODE_REGISTER),
        (node("n1", [G0], allocatable={SLOTS: "0"}), 'allocatable["nvidia.com/gpu"] is 0'),
        (
            node("n1", register=encode_node_register([G0]), allocatable={"cpu": "4"}),
            'allocatable["nvidia.com/gpu"] is missing',
        ),
        (node("n1", [G0], allocatable={SLOTS: "lots"}), "not a valid Kubernetes quantity"),
        (node("n1", [G0], allocatable={SLOTS: ["8"]}), "not a quantity"),
    ],
)
def test_unregistered_node_kept_out_with_reason(node: dict[str, Any], why: str) -> None:
    cache = ClusterCache()
    cache.node_upserted(node)
    assert cache.node_gpus("n1") is None
    assert list(cache.nodes()) == []
    reason = cache.unregistered_reason("n1")
    assert reason is not None and reason.startswith("node unregistered: ") and why in reason


def test_unknown_node_reason() -> None:
    reason = ClusterCache().unregistered_reason("ghost")
    assert reason is not None and reason.startswith("node unregistered: ") and "ghost" in reason


def test_unregistered_reason_logged_once_per_distinct_value(caplog: pytest.LogCaptureFixture) -> None:
    cache = ClusterCache()
    with caplog.at_level(logging.WARNING, logger="hami_control.cache"):
        for version in "123":
            cache.node_upserted(
                node("n1", register="garbage", allocatable={SLOTS: "8"}, resource_version=version)
            )
        cache.node_upserted(node("n1", [G0], allocatable={SLOTS: "0"}))
        cache.node_upserted(node("n1", [G0], allocatable={SLOTS: "0"}, resource_version="9"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "garbage" in warnings[0] and "allocatable" in warnings[1]


def test_a_node_in_nvidias_own_modes_without_a_register_is_logged_at_debug_not_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = ClusterCache()
    with caplog.at_level(logging.DEBUG, logger="hami_control.cache"):
        for name, key in (("ts", "nvidia.com/gpu.sharing-strategy"), ("mig", "nvidia.com/mig.strategy")):
            cache.node_upserted(node(name, allocatable={SLOTS: "4"}, labels={key: "time-slicing"}))
        cache.node_upserted(node("plain", allocatable={SLOTS: "4"}))
    logged = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records]
    assert logged == [
        (logging.DEBUG, "node ts"),
        (logging.DEBUG, "node mig"),
        (logging.WARNING, "node plain"),
    ]
    assert cache.node_gpus("ts") is None and cache.unregistered_reason("ts") is not None


def test_node_registers_when_allocatable_returns_and_counts_earlier_pods() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [G0], allocatable={SLOTS: "0"}))
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    assert cache.node_gpus("n1") is None
    cache.node_upserted(node("n1", [G0], allocatable={SLOTS: "4"}))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    cache.node_upserted(node("n1", [G0], allocatable={SLOTS: "0"}))
    assert cache.node_gpus("n1") is None


def test_pod_before_node_counts_once_node_registers() -> None:
    cache = ClusterCache()
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    cache.node_upserted(node("n1", [G0]))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)


def test_health_from_register_and_cordon() -> None:
    cache = ClusterCache()
    cache.node_upserted(
        node("n1", [G0, gpu_info(1, count=4, health=False)], annotations={DEVICE_CORDON: "GPU-0, GPU-x"})
    )
    gpus = cache.node_gpus("n1")
    assert gpus is not None
    g0, g1 = gpus.gpus
    assert g0.cordoned and g0.healthy
    assert not g1.cordoned and not g1.healthy


def test_pair_scores_and_bad_pair_scores(caplog: pytest.LogCaptureFixture) -> None:
    cache = ClusterCache()
    scores = encode_pair_scores([GPUPairScore.of("GPU-0", {"GPU-1": 100})])
    cache.node_upserted(node("n1", [G0, G1], annotations={NODE_PAIR_SCORE: scores}))
    gpus = cache.node_gpus("n1")
    assert gpus is not None and gpus.pair_score("GPU-1", "GPU-0") == 100
    with caplog.at_level(logging.WARNING, logger="hami_control.cache"):
        cache.node_upserted(
            node("n1", [G0, G1], annotations={NODE_PAIR_SCORE: "{nope"}, resource_version="2")
        )
        cache.node_upserted(
            node("n1", [G0, G1], annotations={NODE_PAIR_SCORE: "{nope"}, resource_version="3")
        )
    gpus = cache.node_gpus("n1")
    assert gpus is not None and gpus.pair_scores == () and gpus.pair_score("GPU-0", "GPU-1") == 0
    assert len([r for r in caplog.records if "topology" in r.getMessage()]) == 1


def test_unchanged_node_event_keeps_the_same_value() -> None:
    cache = cache_with_node()
    before = cache.node_gpus("n1")
    cache.node_upserted(node("n1", (G0, G1), resource_version="2"))
    assert cache.node_gpus("n1") is before


def test_inventory_change_rebuilds_usage() -> None:
    cache = cache_with_node(G0, G1)
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10), ("GPU-1", 500, 5)]))
    cache.node_upserted(node("n1", [G1]))  # GPU-0 gone from the inventory
    gpus = cache.node_gpus("n1")
    assert gpus is not None and [g.id for g in gpus.gpus] == ["GPU-1"]
    assert gpu_usage(cache, "GPU-1") == (1, 500, 5)
    cache.hold("u1", None)
    assert gpu_usage(cache, "GPU-1") == (0, 0, 0)
    cache.node_upserted(node("n1", [G0, G1]))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


def test_node_deleted_and_back() -> None:
    cache = cache_with_node()
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    cache.node_deleted("n1")
    assert cache.node_gpus("n1") is None and list(cache.nodes()) == []
    cache.node_deleted("n1")  # twice: no-op
    cache.node_upserted(node("n1", [G0, G1]))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)


def test_node_usage_counters() -> None:
    cache = cache_with_node()
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10), ("GPU-1", 2000, 20)]))
    hold(cache, "u2", "n1", allocation([("GPU-0", 300, 0)]))
    expected = NodeUsage(
        gpus=2, slots=8, used_slots=3, memory=32000, used_memory=3300, cores=200, used_cores=30
    )
    assert cache.node_usage("n1") == expected
    assert dict(cache.usage()) == {"n1": expected}
    assert cache.node_usage("nope") is None
    stats = cache.stats()
    assert (stats.nodes, stats.unregistered, stats.pods, stats.assumed) == (1, 0, 2, 0)


# --- holdings and generations --------------------------------------------------------------------------


def test_hold_moves_slices_between_nodes_and_none_releases() -> None:
    cache = cache_with_node()
    cache.node_upserted(node("n2", [gpu_info(0, id="GPU-9", count=4)]))
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    hold(cache, "u1", "n2", allocation([("GPU-9", 2000, 20)]))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0) and gpu_usage(cache, "GPU-9", "n2") == (1, 2000, 20)
    assert [h.uid for h in cache.holdings("n2")] == ["u1"] and list(cache.holdings("n1")) == []
    cache.hold("u1", None)
    cache.hold("u1", None)  # twice: no-op
    assert gpu_usage(cache, "GPU-9", "n2") == (0, 0, 0) and cache.holding("u1") is None
    assert cache.stats().pods == 0


def test_a_confirmed_assumption_keeps_usage_and_the_node_generation() -> None:
    cache = cache_with_node()
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]), assumed=True)
    assert cache.stats().assumed == 1
    generation = cache.generation("n1")
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    assert cache.stats().assumed == 0 and cache.generation("n1") == generation
    held = cache.holding("u1")
    assert held is not None and not held.assumed


def test_generation_changes_with_every_change_of_the_nodes_gpus_and_is_never_reused() -> None:
    cache = cache_with_node()
    seen = [cache.generation("n1")]
    assert cache.generation("ghost") == 0 and seen[0] > 0
    cache.node_upserted(node("n1", (G0, G1), resource_version="2"))  # nothing changed: same generation
    assert cache.generation("n1") == seen[-1]
    hold(cache, "u1", "n1", allocation([("GPU-0", 1000, 10)]))
    seen.append(cache.generation("n1"))
    cache.hold("u1", None)
    seen.append(cache.generation("n1"))
    cache.node_upserted(node("n1", [G0]))
    seen.append(cache.generation("n1"))
    cache.node_deleted("n1")
    assert cache.generation("n1") == 0
    cache.node_upserted(node("n1", (G0, G1)))
    seen.append(cache.generation("n1"))
    assert len(set(seen)) == len(seen) and seen == sorted(seen)


def test_a_nodes_allocatable_cpu_is_kept_in_milli_cores_and_dropped_with_the_node() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [gpu_info(0)], allocatable={"cpu": "95500m"}))
    cache.node_upserted(node("n2", [gpu_info(0)], allocatable={"cpu": 8}))
    cache.node_upserted(node("n3", [gpu_info(0)], allocatable={"cpu": "many"}))
    cache.node_upserted(node("cpu-only", allocatable={"cpu": "2"}))
    assert [cache.cpu_allocatable(n) for n in ("n1", "n2", "n3", "cpu-only", "gone")] == [
        95500,
        8000,
        None,
        2000,
        None,
    ]
    cache.node_upserted(node("n1", [gpu_info(0)], allocatable={"cpu": "1"}))
    assert cache.cpu_allocatable("n1") == 1000
    cache.node_deleted("n1")
    assert cache.cpu_allocatable("n1") is None
