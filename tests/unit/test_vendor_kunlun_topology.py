"""hami_control.devices.kunlun_topology: HAMi's Kunlunxin board selection and node score, transcribed from
HAMi v2.10.0 pkg/device/kunlun/topo_test.go (each test cites its Go test). The Go tests build 8 devices
with Count 1 and call the selection with `fitAvailable` (Used < Count); here that is a vector of 8
booleans, one per position."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_control.devices.kunlun_topology import (
    PAIRS,
    QUADS,
    WING_PAIRS,
    calc_score,
    count_bubble,
    device_pick,
    graph_select,
    interconnect,
    wing_value,
)


def free(*used: int) -> list[bool]:
    """topo_test.go newDevices(usedMask...) with fitAvailable: position i fits unless it is used."""
    return [i not in used for i in range(8)]


def only_free(keep: Sequence[int]) -> list[bool]:
    """topo_test.go onlyFree(keep): every other position used."""
    return [i in keep for i in range(8)]


@pytest.mark.parametrize(("value", "want"), [(4, 0), (1, 2), (0, 1), (2, 1), (3, 1)])
def test_wing_value_weighs_a_full_wing_0_a_single_device_2_else_1(value: int, want: int) -> None:
    # HAMi topo_test.go TestGetvalue
    assert wing_value(value) == want


@pytest.mark.parametrize(
    ("indexes", "want"),
    [
        pytest.param([], 1, id="TestCountbubble/empty"),
        pytest.param([0, 1, 2, 3], 1, id="TestCountbubble/all left, full group of 4"),
        pytest.param([0], 3, id="TestCountbubble/single left device"),
        pytest.param([4], 3, id="TestCountbubble/single right device"),
        pytest.param([0, 1], 2, id="TestCountbubble/two left devices"),
    ],
)
def test_count_bubble_sums_the_wing_values(indexes: list[int], want: int) -> None:
    # HAMi topo_test.go TestCountbubble
    assert count_bubble(indexes) == want


@pytest.mark.parametrize(
    ("prev", "cur", "want"),
    [
        pytest.param([0], [0, 1], 3000.0, id="TestCalcscore/cur decreases fragmentation by 1"),
        pytest.param([0], [4], 2000.0, id="TestCalcscore/cur unchanged"),
        pytest.param([0, 1], [0], 1000.0, id="TestCalcscore/cur increases fragmentation by 1"),
        pytest.param([0, 1, 2, 3], [0], 0.0, id="TestCalcscore/cur increases fragmentation by 2"),
        pytest.param([0, 1, 2, 3, 4, 5, 6, 7], [0], 1000.0, id="any other change (3 - 0 = 3)"),
    ],
)
def test_calc_score_maps_the_fragmentation_change_to_a_score(
    prev: list[int], cur: list[int], want: float
) -> None:
    # HAMi topo_test.go TestCalcscore (the last id: calcscore's default branch, not a Go case)
    assert calc_score(prev, cur) == want


def test_device_pick_takes_the_first_free_positions_from_start() -> None:
    # HAMi topo_test.go TestDevicepick
    fits = free(1, 3)
    assert device_pick(fits, 0, 2) == (0, 2)
    assert device_pick(fits, 4, 3) == (4, 5, 6)
    # not enough devices left to satisfy count -> whatever it found
    assert device_pick(fits, 6, 5) == (6, 7)


def test_graph_select_takes_all_eight_when_all_are_free() -> None:
    # HAMi topo_test.go TestGraghSelect_AllEightAvailable
    assert graph_select(free(), 8) == (0, 1, 2, 3, 4, 5, 6, 7)


def test_graph_select_refuses_eight_when_one_is_used() -> None:
    # HAMi topo_test.go TestGraghSelect_EightNotFullyAvailable
    assert graph_select(free(0), 8) == ()


def test_graph_select_single_device_on_an_idle_board_is_position_0() -> None:
    # HAMi topo_test.go TestGraghSelect_SingleDevice
    assert graph_select(free(), 1) == (0,)


def test_graph_select_four_from_the_free_left_wing() -> None:
    # HAMi topo_test.go TestGraghSelect_FourFromLeftWing
    assert graph_select(free(4, 5, 6, 7), 4) == (0, 1, 2, 3)


def test_interconnect_two_takes_the_only_free_linked_pair() -> None:
    # HAMi topo_test.go TestInterconnect_TwoDevices (parseInterconnection()[0] = 0-4)
    target = PAIRS[0]
    assert sorted(interconnect(only_free(target), 2)) == sorted(target)
    assert sorted(graph_select(only_free(target), 2)) == sorted(target)


def test_interconnect_two_on_an_idle_board_is_a_linked_pair() -> None:
    # HAMi topo_test.go TestInterconnect_TwoDevices_ChoosesAmongMultipleCandidates
    got = interconnect(free(), 2)
    assert len(got) == 2
    assert got[0] != got[1]
    assert tuple(sorted(got)) in {tuple(sorted(p)) for p in (*PAIRS, *WING_PAIRS)}
    assert got == (0, 4)


def test_interconnect_four_takes_the_only_free_quad() -> None:
    # HAMi topo_test.go TestInterconnect_FourDevices (parseInterconnection2()[0] = 0-1-4-5)
    target = QUADS[0]
    assert sorted(interconnect(only_free(target), 4)) == sorted(target)
    assert sorted(graph_select(only_free(target), 4)) == sorted(target)


def test_interconnect_has_no_shape_for_three() -> None:
    # HAMi topo_test.go TestInterconnect_UnsupportedCount
    assert interconnect(free(), 3) == ()


def test_pair_tables_are_pairs_of_distinct_positions() -> None:
    # HAMi topo_test.go TestParseInterconnection_Structure (InterGroupConnection + GroupConnection)
    pairs = (*PAIRS, *WING_PAIRS)
    assert pairs
    assert all(len(p) == 2 and p[0] != p[1] for p in pairs)
    assert PAIRS == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert len(WING_PAIRS) == 12


def test_quad_table_is_quads_of_distinct_positions() -> None:
    # HAMi topo_test.go TestParseInterconnection2_Structure (InterGroupConnection2)
    assert QUADS
    assert all(len(q) == 4 and len(set(q)) == 4 for q in QUADS)
    assert QUADS[0] == (0, 1, 4, 5)


@settings(max_examples=500, deadline=None)
@given(fits=st.lists(st.booleans(), max_size=12), nums=st.integers(min_value=-1, max_value=10))
def test_graph_select_returns_nothing_or_exactly_nums_distinct_free_positions(
    fits: list[bool], nums: int
) -> None:
    got = graph_select(fits, nums)
    if got:
        assert len(got) == len(set(got)) == nums
        assert all(0 <= p < len(fits) and fits[p] for p in got)
