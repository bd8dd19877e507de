"""Kunlunxin XPU topology selection (HAMi pkg/device/kunlun/topo.go, v2.10.0), pure.

A Kunlunxin node board holds 8 XPUs in two wings of 4 (positions 0-3 and 4-7): the XPUs of one wing are
all linked to each other (`WING_PAIRS`), and across the wings position i is linked to i+4 (`PAIRS`).
HAMi's `graghSelect` chooses the positions for a request of `nums` whole devices:

- 8: every device, only when all 8 fit;
- 1, 2 or 4: from one wing when a wing has enough free devices, preferring the wing whose free count is
  the tightest fit (`slots` = nums..4; for an odd request the order 1, 3, 2, 4), taking the first free
  positions of that wing; otherwise across the wings (`interconnect`): 2 = the first linked pair
  (i, i+4), 4 = the first of the `QUADS` that is all free (with exactly 6 free, the first quad whose
  remaining 2 devices are still a linked pair, else the last quad that fits);
- anything else: nothing.

Here the selection works on a vector of booleans, one per position (`fits[p]`: the device at position
p is free for the request), and returns positions. The caller (`hami_control.devices.kunlun`) orders the
node's devices by their Index, so a position is a device Index however the scheduler's policy sorted
the list (HAMi reads positions of its score-sorted list, so its wing counts shift once devices carry
different scores).

`count_bubble` / `calc_score` are HAMi's ScoreNode for whole XPUs: how many wings a set of indexes
breaks, and a node score (3000 best .. 0 worst) for the change the pod brings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WING = 4
"""Positions 0-3 are the left wing, 4-7 the right one (and beyond 7, as HAMi counts them)."""
BOARD = 8
"""`devicepick` scans positions up to 7 only."""

PAIRS: tuple[tuple[int, int], ...] = ((0, 4), (1, 5), (2, 6), (3, 7))
"""HAMi's InterGroupConnection "0-4,1-5,2-6,3-7": the links across the wings."""
WING_PAIRS: tuple[tuple[int, int], ...] = (
    (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7),
)  # fmt: skip
"""HAMi's GroupConnection: the links inside each wing."""
QUADS: tuple[tuple[int, int, int, int], ...] = (
    (0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6),
)  # fmt: skip
"""HAMi's InterGroupConnection2 "0-1-4-5,2-3-6-7,0-2-4-6,1-3-5-7,0-3-4-7,1-2-5-6", in its order."""
ODD_ORDER = (1, 3, 2, 4)
"""The wing free counts tried, in order, for an odd request (HAMi's `oddorder`)."""


def device_pick(fits: Sequence[bool], start: int, nums: int) -> tuple[int, ...]:
    """HAMi's `devicepick`: the first `nums` free positions from `start` up to 7 (fewer when there are
    not that many)."""
    out: list[int] = []
    for position in range(start, min(BOARD, len(fits))):
        if fits[position]:
            out.append(position)
            if len(out) == nums:
                break
    return tuple(out)


def interconnect(fits: Sequence[bool], nums: int) -> tuple[int, ...]:
    """HAMi's `interconnect`: 2 devices over a cross-wing link, 4 devices as one of `QUADS`; () else."""
    free = [p for p, ok in enumerate(fits) if ok]
    if nums == 2:
        partner = {a: b for pair in PAIRS for a, b in (pair, pair[::-1])}
        for position in free:
            other = partner.get(position)
            if other is not None and other < len(fits) and fits[other]:
                return (position, other)
        return ()
    if nums != 4:
        return ()
    have = set(free)
    if len(free) in (4, 5):
        return next((quad for quad in QUADS if have.issuperset(quad)), ())
    if len(free) == 6:
        chosen: tuple[int, ...] = ()
        for quad in QUADS:
            if have.issuperset(quad):
                chosen = quad
                rest = have.difference(quad)
                if any(rest.issuperset(pair) for pair in (*PAIRS, *WING_PAIRS)):
                    return quad
        return chosen
    return ()


def graph_select(fits: Sequence[bool], nums: int) -> tuple[int, ...]:
    """HAMi's `graghSelect` over positions (see the module docstring); () when nothing fits.

    Two departures, both only on boards of more than 8 devices, where HAMi would return a wrong
    answer: a request of 8 gets the 8 free positions (HAMi returns 0-7 whatever is free there), and a
    wing pick that finds fewer than `nums` devices within positions 0-7 is no pick (HAMi would place
    the container on fewer devices than it asked)."""
    left = sum(1 for ok in fits[:WING] if ok)
    right = sum(1 for ok in fits[WING:] if ok)
    if nums == BOARD:
        return tuple(p for p, ok in enumerate(fits) if ok) if left + right == BOARD else ()
    if nums not in (1, 2, 4):
        return ()
    if left >= nums or right >= nums:
        for slots in range(nums, WING + 1):
            num = ODD_ORDER[slots - 1] if nums % 2 == 1 else slots
            start = 0 if left == num else WING if right == num else None
            if start is not None:
                picked = device_pick(fits, start, nums)
                return picked if len(picked) == nums else ()
    return interconnect(fits, nums)


def wing_value(free: int) -> int:
    """HAMi's `getvalue`: what a wing with `free` devices in the set weighs (4: 0, 1: 2, else 1)."""
    return 0 if free == WING else 2 if free == 1 else 1


def count_bubble(indexes: Iterable[int]) -> int:
    """HAMi's `countbubble`: the fragmentation of a set of device indexes over the two wings."""
    values = list(indexes)
    left = sum(1 for v in values if v < WING)
    right = len(values) - left
    if left == 0 and right == 0:
        return 1
    return wing_value(left) + wing_value(right)


def calc_score(previous: Iterable[int], current: Iterable[int]) -> float:
    """HAMi's `calcscore`: 3000 when the pod's devices lower the fragmentation of the used ones by 1,
    2000 unchanged, 1000 up by 1, 0 up by 2; any other change 1000."""
    change = count_bubble(current) - count_bubble(previous)
    return float({-1: 3000, 0: 2000, 1: 1000, 2: 0}.get(change, 1000))


__all__ = [
    "BOARD",
    "ODD_ORDER",
    "PAIRS",
    "QUADS",
    "WING",
    "WING_PAIRS",
    "calc_score",
    "count_bubble",
    "device_pick",
    "graph_select",
    "interconnect",
    "wing_value",
]
