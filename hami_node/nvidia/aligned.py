"""The topology-aligned preferred allocation of whole GPUs in NVIDIA's modes: NVIDIA's device plugin
(internal/rm/nvml_manager.go `alignedAlloc`) asks go-gpuallocator's best-effort policy
(gpuallocator/besteffort_policy.go `NewBestEffortPolicy().Allocate`) for `size` GPUs among kubelet's
available ones that include the required ones. Facts carried over, not code:

- A pair of GPUs scores the sum over its P2P link entries: a PCIe level (across CPUs 10, same CPU 20,
  host bridge 30, several switches 40, one switch 50, same board 60) and N NVLinks 100 x N. This is
  exactly HAMi's pair score, which hami-node already computes from the backend's links
  (`hami_node.gpu.topology.pair_score`); a set scores the sum over its pairs, a partition the sum over
  its sets.
- The policy does not take the single best set: it looks at every way of dividing all available GPUs
  into sets of `size` (padded with empty places when `size` does not divide their number; a set holds
  either no padding or all of it), keeps the partition with the highest total score among those having
  a set with every required GPU and no padding (the first such partition on ties, in the enumeration
  order below), and returns that partition's highest-scoring set holding every required GPU (the first
  on ties). So it leaves the best-linked GPUs together for later requests.
- Nothing to return (size <= 0, fewer available than `size`, more required than `size` or than
  available, a required GPU not available) is an empty answer, not an error: kubelet then chooses.

Differences: a pair whose two directions list a different number of link entries panics in
go-gpuallocator ("all P2PLinks between 2 GPUs should be bidirectional"); here it scores 0 as HAMi scores
it (`hami_node.gpu.topology`). The search is exhaustive like NVIDIA's up to `MAX_PARTITIONS` partitions
(8 GPUs: at most a few hundred, about 10 ms; 12 GPUs: about 15,000, 0.3 s); beyond that (14 GPUs
in pairs: 135,135, 6 s in Python) it takes the single
highest-scoring set holding the required GPUs, first in enumeration order on ties, so a request on a
large node never stalls kubelet's admission.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from math import comb
from typing import TypeVar

from hami_node.gpu.backend import GPULink
from hami_node.gpu.topology import NO_LINK, pair_score

T = TypeVar("T")

MAX_PARTITIONS = 20_000
"""The most partitions searched exhaustively (`partition_count`); above it the single best set."""

PairScore = Callable[[str, str], int]


def iterate_sets(devices: Sequence[T], size: int) -> Iterator[tuple[T, ...]]:
    """gpuallocator's `iterateGPUSets`: every set of `size` of the devices, in lexicographic order of
    their positions (i < j < k ...); nothing for size <= 0 or size > len(devices)."""
    if size <= 0 or size > len(devices):
        return
    indices = list(range(size))
    n = len(devices)
    while True:
        yield tuple(devices[i] for i in indices)
        for level in reversed(range(size)):
            if indices[level] != level + n - size:
                break
        else:
            return
        indices[level] += 1
        for k in range(level + 1, size):
            indices[k] = indices[k - 1] + 1


def iterate_partitions(devices: Sequence[T], size: int) -> Iterator[list[tuple[T | None, ...]]]:
    """gpuallocator's `iterateGPUPartitions`: every division of the devices into sets of `size`, the
    list padded with None to a multiple of `size`; a set holds all the padding or none of it, and each
    set's first device comes after the previous set's first (no partition twice). For size 1, one
    single-set partition per device (as NVIDIA's shortcut does)."""
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        for d in devices:
            yield [(d,)]
        return
    padded: list[T | None] = list(devices)
    while len(padded) % size:
        padded.append(None)
    padding = len(padded) - len(devices)

    def walk(rest: list[T | None], accum: list[tuple[T | None, ...]]) -> Iterator[list[tuple[T | None, ...]]]:
        if len(rest) == size:
            yield [*accum, tuple(rest)]
            return
        first, others = rest[0], rest[1:]
        for tail in iterate_sets(others, size - 1):
            chosen = (first, *tail)
            pads = sum(d is None for d in chosen)
            if pads not in (0, padding):
                continue
            remaining = list(others)
            for d in tail:
                remaining.remove(d)
            yield from walk(remaining, [*accum, chosen])

    yield from walk(padded, [])


def partition_count(n: int, size: int) -> int:
    """An upper bound of how many partitions `iterate_partitions` yields for n devices (the count
    without the padding rule)."""
    if size <= 0 or size > n:
        return 0
    if size == 1:
        return n
    m = -(-n // size) * size
    count = 1
    while m > size:
        count *= comb(m - 1, size - 1)
        m -= size
    return count


def set_score(gpu_set: Sequence[str | None], score: PairScore) -> int:
    """`calculateGPUSetScore`: the sum of the pair scores of the set's pairs (padding scores 0)."""
    total = 0
    for a, b in iterate_sets(gpu_set, 2):
        if a is not None and b is not None and a != b:
            total += score(a, b)
    return total


def pair_scorer(links: Mapping[tuple[str, str], GPULink]) -> PairScore:
    """The pair score from the backend's links (`GPUBackend.links`): HAMi's and gpuallocator's score of
    a's links to b, 0 for an asymmetric pair or an unknown one."""
    cache: dict[tuple[str, str], int] = {}

    def score(a: str, b: str) -> int:
        key = (a, b)
        if key not in cache:
            cache[key] = pair_score(links.get((a, b), NO_LINK), links.get((b, a), NO_LINK))[0]
        return cache[key]

    return score


def best_effort_allocate(
    available: Sequence[str], required: Sequence[str], size: int, score: PairScore
) -> tuple[str, ...]:
    """go-gpuallocator's best-effort policy (see the module docstring): `size` of the `available` GPUs
    including every `required` one, or () when there is no such set."""
    if size <= 0 or len(available) < size or len(required) > size or len(required) > len(available):
        return ()
    need = set(required)
    if not need <= set(available):
        return ()

    def holds_required(gpu_set: tuple[str | None, ...]) -> bool:
        return need <= set(gpu_set) and None not in gpu_set

    if partition_count(len(available), size) > MAX_PARTITIONS:
        best: tuple[str, ...] | None = None
        best_score = 0
        for candidate in iterate_sets(available, size):
            if not need <= set(candidate):
                continue
            s = set_score(candidate, score)
            if best is None or s > best_score:
                best, best_score = candidate, s
        return best or ()

    best_partition: list[tuple[str | None, ...]] | None = None
    best_total = 0
    for partition in iterate_partitions(available, size):
        if not any(holds_required(s) for s in partition):
            continue
        total = sum(set_score(s, score) for s in partition)
        if best_partition is None or total > best_total:
            best_partition, best_total = partition, total
    if best_partition is None:
        return ()
    sets = [s for s in best_partition if holds_required(s)]
    chosen = max(sets, key=lambda s: set_score(s, score))  # max keeps the first on ties
    return tuple(d for d in chosen if d is not None)


__all__ = [
    "MAX_PARTITIONS",
    "PairScore",
    "best_effort_allocate",
    "iterate_partitions",
    "iterate_sets",
    "pair_scorer",
    "partition_count",
    "set_score",
]
