"""The NVLink-aligned preferred allocation of whole GPUs in NVIDIA's modes (`hami_node.nvidia.aligned`,
`replicas.aligned_allocation`, the servicer's GetPreferredAllocation).

The node fixtures and cases are go-gpuallocator's (github.com/NVIDIA/go-gpuallocator,
gpuallocator/common_test.go `New4xRTX8000Node`, `NewDGX1PascalNode`, `NewDGX1VoltaNode`;
gpuallocator/besteffort_test.go `TestBestEffortAllocate`, `TestBestEffortIterateGPUSets`,
`TestBestEffortIterateGPUPartitions`, `TestBestEffort{4xRTX8000,DGX1Pascal,DGX1Volta}GPUAlloc*`), with
the links expressed as hami-node's `GPULink`s (P2PLinkCrossCPU -> SYSTEM, P2PLinkSameCPU -> NUMA_NODE,
P2PLinkHostBridge -> HOST_BRIDGE, P2PLinkSingleSwitch -> SINGLE_SWITCH; N NVLinks -> nvlinks=N).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_node.gpu.backend import GPULink, TopologyLevel
from hami_node.nvidia.aligned import (
    MAX_PARTITIONS,
    best_effort_allocate,
    iterate_partitions,
    iterate_sets,
    pair_scorer,
    partition_count,
    set_score,
)
from hami_node.nvidia.device_map import Device
from hami_node.nvidia.replicas import PreferredAllocationError, aligned_allocation, uses_aligned_allocation

X, S, H, W = (
    TopologyLevel.SYSTEM,
    TopologyLevel.NUMA_NODE,
    TopologyLevel.HOST_BRIDGE,
    TopologyLevel.SINGLE_SWITCH,
)
Links = dict[tuple[str, str], GPULink]


def gid(i: int) -> str:
    return f"GPU-{i}"


def links_of(pcie: Mapping[tuple[int, int], TopologyLevel], nvlinks: Mapping[tuple[int, int], int]) -> Links:
    """Links from go-gpuallocator's AddLink lists: `pcie[(a, b)]` and `nvlinks[(a, b)]` as a sees b."""
    out: Links = {}
    for (a, b), level in pcie.items():
        out[(gid(a), gid(b))] = GPULink(level, nvlinks.get((a, b), 0))
    return out


def symmetric(pairs: Mapping[tuple[int, int], Any]) -> dict[tuple[int, int], Any]:
    return {**pairs, **{(b, a): v for (a, b), v in pairs.items()}}


def rtx8000_node() -> Links:
    """common_test.go New4xRTX8000Node."""
    nv = symmetric({(0, 3): 2, (1, 2): 2})
    pcie = symmetric({(0, 1): S, (0, 2): X, (1, 3): X, (2, 3): S, (0, 3): None, (1, 2): None})
    return {(gid(a), gid(b)): GPULink(level, nv.get((a, b), 0)) for (a, b), level in pcie.items()}


def dgx1_pascal_node() -> Links:
    """common_test.go NewDGX1PascalNode: one NVLink along each cube edge."""
    nv = symmetric({p: 1 for p in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6)]})
    nv.update(symmetric({p: 1 for p in [(3, 7), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]}))
    pcie: dict[tuple[int, int], TopologyLevel] = {}
    for a in range(8):
        for b in range(8):
            if a != b:
                pcie[(a, b)] = X
    pcie.update(symmetric({(0, 1): H, (0, 2): W, (0, 3): H, (1, 2): H, (1, 3): W, (2, 3): H}))
    pcie.update(symmetric({(4, 5): H, (4, 6): W, (4, 7): H, (5, 6): H, (5, 7): W, (6, 7): H}))
    return links_of(pcie, nv)


def dgx1_volta_node() -> Links:
    """common_test.go NewDGX1VoltaNode: one or two NVLinks per pair of the hybrid cube mesh."""
    one = [(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)]
    two = [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
    nv = symmetric({**{p: 1 for p in one}, **{p: 2 for p in two}})
    pcie: dict[tuple[int, int], TopologyLevel] = {}
    for a in range(8):
        for b in range(8):
            if a != b:
                pcie[(a, b)] = X
    pcie.update(symmetric({(0, 1): W, (0, 2): H, (0, 3): H, (1, 2): H, (1, 3): H, (2, 3): W}))
    pcie.update(symmetric({(4, 5): W, (4, 6): H, (4, 7): H, (5, 6): H, (5, 7): H, (6, 7): W}))
    return links_of(pcie, nv)


def ids(indices: Sequence[int]) -> list[str]:
    return [gid(i) for i in indices]


def allocate_sequence(links: Links, sizes: Sequence[int]) -> list[list[int]]:
    """go-gpuallocator's Allocator.Allocate in turn (RunAllocTests): each call from the GPUs still
    remaining (in index order), the chosen ones removed."""
    remaining = sorted({a for a, _ in links}, key=lambda u: int(u.split("-")[1]))
    out = []
    for size in sizes:
        chosen = best_effort_allocate(remaining, [], size, pair_scorer(links))
        out.append(sorted(int(u.split("-")[1]) for u in chosen))
        remaining = [u for u in remaining if u not in chosen]
    return out


# --- besteffort_test.go TestBestEffortAllocate (DGX-1 Volta) -------------------------------------------

BEST_EFFORT_CASES = [
    ("Single NVLINK, prefer same switch", [0, 2, 4, 5], [], 2, [4, 5]),
    ("Single NVLINK, prefer same socket", [0, 4, 5, 6], [], 2, [5, 6]),
    ("Prefer dual NVLINK same socket", [0, 3, 1], [], 2, [0, 3]),
    ("Prefer dual NVLINK cross socket", [0, 1, 4], [], 2, [0, 4]),
    ("Must include with allocation size 1", list(range(8)), [4], 1, [4]),
    ("Must include with allocation size 2", list(range(8)), [4], 2, [4, 7]),
    ("Must include with allocation size 4", list(range(8)), [4], 4, [4, 5, 6, 7]),
    ("Must include with unavailable device", [1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], 4, []),
    ("Must include with full set specified", list(range(8)), [0, 2, 4, 6], 4, [0, 2, 4, 6]),
    ("Must include with too many devices specified", list(range(8)), [1, 2, 3, 4, 5, 6], 4, []),
    ("Required too many devices than available", [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], 1, []),
]


@pytest.mark.parametrize(
    ("available", "required", "size", "expected"),
    [case[1:] for case in BEST_EFFORT_CASES],
    ids=[case[0] for case in BEST_EFFORT_CASES],
)
def test_best_effort_allocate_on_dgx1_volta_matches_gpuallocators_cases(
    available: list[int], required: list[int], size: int, expected: list[int]
) -> None:
    chosen = best_effort_allocate(ids(available), ids(required), size, pair_scorer(dgx1_volta_node()))
    assert set(chosen) == set(ids(expected)) and len(chosen) == len(expected)


# --- TestBestEffort<node>GPUAlloc<N>: allocations in turn from one allocator ----------------------------


@pytest.mark.parametrize(
    ("name", "sizes", "expected"),
    [
        ("4xRTX8000 one", [1, 1, 1, 1, 1], [[0], [1], [2], [3], []]),
        ("4xRTX8000 two", [2, 2, 1], [[0, 3], [1, 2], []]),
        ("4xRTX8000 four", [4, 1], [[0, 1, 2, 3], []]),
        ("DGX1Pascal one", [1] * 9, [[i] for i in range(8)] + [[]]),
        ("DGX1Pascal two", [2, 2, 2, 2, 1], [[0, 2], [1, 3], [4, 6], [5, 7], []]),
        ("DGX1Pascal four", [4, 4, 1], [[0, 1, 2, 3], [4, 5, 6, 7], []]),
        ("DGX1Pascal eight", [8, 1], [list(range(8)), []]),
        ("DGX1Volta one", [1] * 9, [[i] for i in range(8)] + [[]]),
        ("DGX1Volta two", [2, 2, 2, 2, 1], [[0, 3], [1, 2], [4, 7], [5, 6], []]),
        ("DGX1Volta four", [4, 4, 1], [[0, 1, 2, 3], [4, 5, 6, 7], []]),
        ("DGX1Volta eight", [8, 1], [list(range(8)), []]),
    ],
)
def test_allocations_in_turn_match_gpuallocators_per_node_cases(
    name: str, sizes: list[int], expected: list[list[int]]
) -> None:
    links = {"4xRTX8000": rtx8000_node, "DGX1Pascal": dgx1_pascal_node, "DGX1Volta": dgx1_volta_node}[
        name.split(maxsplit=1)[0]
    ]()
    assert allocate_sequence(links, sizes) == expected


# --- TestBestEffortIterateGPUSets / TestBestEffortIterateGPUPartitions ----------------------------------


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, []),
        (1, [(0,), (1,), (2,), (3,)]),
        (2, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]),
        (3, [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]),
        (4, [(0, 1, 2, 3)]),
        (5, []),
    ],
)
def test_iterate_sets_yields_gpuallocators_sets_in_lexicographic_order(
    size: int, expected: list[tuple[int, ...]]
) -> None:
    assert list(iterate_sets([0, 1, 2, 3], size)) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, []),
        (1, [[(0,)], [(1,)], [(2,)], [(3,)]]),
        (2, [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]),
        (
            3,
            [
                [(0, 1, 2), (3, None, None)],
                [(0, 1, 3), (2, None, None)],
                [(0, 2, 3), (1, None, None)],
                [(1, 2, 3), (0, None, None)],
            ],
        ),
        (4, [[(0, 1, 2, 3)]]),
        (5, []),
    ],
)
def test_iterate_partitions_yields_gpuallocators_partitions(
    size: int, expected: list[list[tuple[Any, ...]]]
) -> None:
    got = list(iterate_partitions([0, 1, 2, 3], size))

    def norm(partitions: list[list[tuple[Any, ...]]]) -> list[list[tuple[int, ...]]]:
        # gpuallocator compares the partitions as sets of sets (padding as -1 here); so do we.
        return sorted(
            sorted(tuple(sorted(-1 if d is None else d for d in p)) for p in part) for part in partitions
        )

    assert len(got) == len(expected)
    assert norm(got) == norm(expected)


def test_partition_count_bounds_the_partitions_iterated() -> None:
    for n in range(1, 9):
        for size in range(1, n + 1):
            assert len(list(iterate_partitions(list(range(n)), size))) <= partition_count(n, size)
    assert partition_count(8, 2) == 105 and partition_count(16, 2) == 2027025 > MAX_PARTITIONS


# --- scores ----------------------------------------------------------------------------------------------


def test_pair_score_is_gpuallocators_pcie_level_plus_100_per_nvlink() -> None:
    score = pair_scorer(dgx1_volta_node())
    assert score(gid(0), gid(3)) == 30 + 200  # host bridge + two NVLinks
    assert score(gid(0), gid(4)) == 10 + 200  # across CPUs + two NVLinks
    assert score(gid(4), gid(5)) == 50 + 100  # one switch + one NVLink
    assert score(gid(0), gid(5)) == 10
    assert set_score([gid(0), gid(3), None], score) == 230


def test_an_asymmetric_pair_scores_zero_instead_of_panicking_as_gpuallocator_does() -> None:
    links = {(gid(0), gid(1)): GPULink(W, 2), (gid(1), gid(0)): GPULink(W, 0)}
    assert pair_scorer(links)(gid(0), gid(1)) == 0


def test_a_node_too_large_to_search_takes_the_single_best_set_with_the_required_gpu() -> None:
    links: Links = {}
    for a in range(16):
        for b in range(16):
            if a != b:
                links[(gid(a), gid(b))] = GPULink(X, 4 if {a, b} == {9, 13} else 0)
    chosen = best_effort_allocate(ids(range(16)), [], 2, pair_scorer(links))
    assert set(chosen) == set(ids([9, 13]))
    assert set(best_effort_allocate(ids(range(16)), ids([2]), 2, pair_scorer(links))) == set(ids([0, 2]))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=7).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.integers(min_value=1, max_value=n),
            st.lists(st.integers(min_value=0, max_value=n - 1), unique=True, max_size=n),
            st.dictionaries(
                st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), st.integers(0, 4), max_size=20
            ),
        )
    )
)
def test_best_effort_returns_size_distinct_available_gpus_with_the_required_ones_or_nothing(
    case: tuple[int, int, list[int], dict[tuple[int, int], int]],
) -> None:
    n, size, required, nv = case
    links = {
        (gid(a), gid(b)): GPULink(X, nv.get((min(a, b), max(a, b)), 0))
        for a in range(n)
        for b in range(n)
        if a != b
    }
    chosen = best_effort_allocate(ids(range(n)), ids(required), size, pair_scorer(links))
    if len(required) > size:
        assert chosen == ()
    else:
        assert len(chosen) == size == len(set(chosen)) and set(ids(required)) <= set(chosen)


# --- replicas.aligned_allocation: NVIDIA's alignedAlloc ---------------------------------------------------


def devices(n: int) -> list[Device]:
    return [Device(gid(i), str(i), gid(i), paths=(f"/dev/nvidia{i}",)) for i in range(n)]


def test_aligned_allocation_is_used_for_whole_gpus_only() -> None:
    full = devices(2)
    assert uses_aligned_allocation(full, ids([0, 1]))
    replicas = [Device(f"{gid(0)}::{r}", "0", gid(0), replicas=2) for r in range(2)]
    assert not uses_aligned_allocation(replicas, [d.id for d in replicas])
    mig = [Device("MIG-a", "0:0", "MIG-a")]
    assert not uses_aligned_allocation(mig, ["MIG-a"])


def test_aligned_allocation_prefers_the_nvlinked_pair_over_index_order() -> None:
    chosen = aligned_allocation(devices(8), ids(range(8)), [], 2, pair_scorer(dgx1_volta_node()))
    assert set(chosen) == set(ids([0, 3]))


def test_aligned_allocation_of_an_unknown_gpu_fails_with_nvidias_text() -> None:
    with pytest.raises(PreferredAllocationError, match=r"^unable to retrieve list of available devices: "):
        aligned_allocation(devices(2), [gid(0), "GPU-x"], [], 1, pair_scorer({}))
    with pytest.raises(PreferredAllocationError, match=r"required devices: no device with uuid: GPU-y$"):
        aligned_allocation(devices(2), ids([0, 1]), ["GPU-y"], 1, pair_scorer({}))


def test_aligned_allocation_with_no_fitting_set_answers_empty_for_kubelet_to_choose() -> None:
    assert aligned_allocation(devices(2), ids([0, 1]), [], 3, pair_scorer({})) == ()


# --- the servicer ------------------------------------------------------------------------------------------


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def test_get_preferred_allocation_of_whole_gpus_answers_the_aligned_set() -> None:
    from hami_node.config import NodeConfig
    from hami_node.devices import DeviceState
    from hami_node.nvidia.config import load_config
    from hami_node.nvidia.device_map import NvidiaDevice
    from hami_node.nvidia.plugin import NvidiaDevices, NvidiaPluginServicer
    from hami_node.plugin.api import api_pb2

    config = load_config([], {}, lambda _path: "")
    gpus = [
        NvidiaDevice(gid(i), i, "Tesla V100-SXM2-16GB", 16384, minor=i, paths=(f"/dev/nvidia{i}",))
        for i in range(8)
    ]
    nv = NvidiaDevices(config, gpus, pair_scorer(dgx1_volta_node()))
    servicer = NvidiaPluginServicer("nvidia.com/gpu", nv, DeviceState(NodeConfig(node_name="n1")))
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids([0, 2, 4, 5]), must_include_deviceIDs=[], allocation_size=2
            )
        ]
    )
    response = servicer.GetPreferredAllocation(request, _Context())  # type: ignore[arg-type]
    assert set(response.container_responses[0].deviceIDs) == set(ids([4, 5]))
