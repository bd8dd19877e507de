"""hami_control.score: HAMi's node score (normalised to 0..10, request included) and GPU score with
hami.io/device-scoring-weights."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import decode_scoring_weights
from hami_api.resources import ContainerRequest
from hami_api.types import GPUSlice, NodePolicy, ScoringWeights
from hami_control.score import MAX_SCORE, gpu_score, node_priority, node_score, node_usage
from hami_control.usage import GPUUsage, NodeGPUs, with_slices
from tests.builders import gpu_info

TWO = NodeGPUs.of("n", [gpu_info(0, devmem=10000), gpu_info(1, devmem=10000)])


def test_idle_and_full_node() -> None:
    assert node_usage(TWO) == 0
    full = with_slices(TWO, [GPUSlice("GPU-0", 1000, 10)] * 10 + [GPUSlice("GPU-1", 1000, 10)] * 10)
    assert node_usage(full) == pytest.approx(10)
    assert node_score(full, [], NodePolicy.BINPACK) == pytest.approx(10)
    assert node_score(full, [], NodePolicy.SPREAD) == pytest.approx(0)


def test_hamis_formula_divided_by_three() -> None:
    # sum Used/Count = 2/20, cores 50/200, mem 5000/20000 -> 10 x (0.1 + 0.25 + 0.25) / 3 = 2.0
    n = with_slices(TWO, [GPUSlice("GPU-0", 2500, 25)] * 2)
    assert node_usage(n) == pytest.approx(2.0)


def test_the_pods_own_slices_count() -> None:
    pod = [GPUSlice("GPU-0", 5000, 50)]
    assert node_score(TWO, pod, NodePolicy.BINPACK) > node_score(TWO, [], NodePolicy.BINPACK)
    assert node_score(TWO, pod, NodePolicy.SPREAD) < node_score(TWO, [], NodePolicy.SPREAD)
    # Small vs large node, same pod: binpack prefers where the pod fills more.
    small = NodeGPUs.of("s", [gpu_info(0, devmem=8000)])
    large = NodeGPUs.of("l", [gpu_info(0, devmem=80000)])
    s = [GPUSlice("GPU-0", 4000, 0)]
    assert node_score(small, s, NodePolicy.BINPACK) > node_score(large, s, NodePolicy.BINPACK)
    assert node_score(small, s, NodePolicy.SPREAD) < node_score(large, s, NodePolicy.SPREAD)


def test_unhealthy_gpus_and_their_slices_count_in_node_usage_like_hami_and_empty_nodes_are_idle() -> None:
    assert node_usage(NodeGPUs("empty")) == 0
    n = NodeGPUs.of("n", [gpu_info(0, devmem=10000), gpu_info(1, devmem=10000, health=False)])
    n = with_slices(n, [GPUSlice("GPU-0", 1000, 10)] * 10)
    assert node_usage(n) == pytest.approx(5)  # HAMi's ComputeDefaultScore sums every GPU
    n = with_slices(n, [GPUSlice("GPU-1", 1000, 10)] * 10)
    assert node_usage(n) == pytest.approx(10)


def test_priority_is_a_whole_number() -> None:
    n = with_slices(TWO, [GPUSlice("GPU-0", 2500, 25)] * 2)
    assert node_priority(n, [], NodePolicy.BINPACK) == 2
    assert node_priority(n, [], NodePolicy.SPREAD) == 8


def test_gpu_score_counts_the_request_and_weights() -> None:
    g = GPUUsage(gpu_info(0, devmem=10000), used=1, usedmem=2000, usedcores=20)
    assert gpu_score(g) == pytest.approx(10 * (0.1 + 0.2 + 0.2))
    r = ContainerRequest(nums=1, memreq=3000, mem_percentage=None, coresreq=30)
    assert gpu_score(g, r) == pytest.approx(10 * (0.2 + 0.5 + 0.5))
    w = decode_scoring_weights("slot=1,core=1,memory=3")
    assert gpu_score(g, r, w) == pytest.approx(10 * (0.2 + 0.5 + 3 * 0.5))
    pct = ContainerRequest(nums=1, memreq=0, mem_percentage=50, coresreq=0)
    assert gpu_score(g, pct, ScoringWeights(0, 0, 1)) == pytest.approx(10 * 0.7)


slices = st.lists(
    st.builds(GPUSlice, st.sampled_from(["GPU-0", "GPU-1"]), st.integers(0, 20000), st.integers(0, 300)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(slices, slices, st.sampled_from(list(NodePolicy)))
def test_scores_always_in_range(held: list[GPUSlice], pod: list[GPUSlice], policy: NodePolicy) -> None:
    n = with_slices(TWO, held)
    score = node_score(n, pod, policy)
    assert 0 <= score <= MAX_SCORE
    assert 0 <= node_priority(n, pod, policy) <= MAX_SCORE


@settings(max_examples=200, deadline=None)
@given(slices, slices)
def test_binpack_and_spread_order_nodes_oppositely(a: list[GPUSlice], b: list[GPUSlice]) -> None:
    na, nb = with_slices(TWO, a), with_slices(TWO, b)
    pod = [GPUSlice("GPU-0", 1000, 10)]
    bin_a, bin_b = node_score(na, pod, NodePolicy.BINPACK), node_score(nb, pod, NodePolicy.BINPACK)
    spr_a, spr_b = node_score(na, pod, NodePolicy.SPREAD), node_score(nb, pod, NodePolicy.SPREAD)
    assert bin_a + spr_a == pytest.approx(MAX_SCORE)
    if bin_a > bin_b + 1e-9:
        assert spr_a < spr_b
