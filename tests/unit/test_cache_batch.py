"""The GPU cache's batches (issue 29: the pods list of 15,000 nodes places ten pods a node at once): the
cache after a run of node events and holdings with any stretch of it inside `ClusterCache.batch()`
equals the cache after the same calls one by one: every node's GPUs with their usage (MIG reservations
and the faults of unpaired ones, cordons included), the holdings, the counts, the nodes marked changed,
and a new generation for every node whose GPUs changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api import annotations as ann
from hami_api.mig_alloc import MigAllocation
from hami_api.types import GPUSlice, MigPlacement
from hami_control.cache import ClusterCache, PodHolding
from tests.builders import gpu_info, node

NODES = ("n1", "n2", "n3")
UUIDS = ("GPU-0", "GPU-1", "GPU-2", "GPU-9")
"""GPU-9 is on no node: slices and reservations naming it are ignored."""


@dataclass(frozen=True)
class Upsert:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    name: str


@dataclass(frozen=True)
class Hold:
    uid: str
    holding: PodHolding | None


@st.composite
def upserts(draw: st.DrawFn) -> Upsert:
    name = draw(st.sampled_from(NODES))
    if draw(st.integers(0, 5)) == 0:  # unregistered: no register annotation
        return Upsert(node(name, allocatable={"nvidia.com/gpu": "10"}))
    gpus = [
        gpu_info(i, count=draw(st.integers(1, 4)), mode=draw(st.sampled_from(["hami-core", "mig"])))
        for i in range(draw(st.integers(1, 3)))
    ]
    cordon = draw(st.sampled_from(["", "GPU-1", "GPU-0,GPU-2"]))
    annotations = {ann.DEVICE_CORDON: cordon} if cordon else {}
    return Upsert(node(name, gpus, annotations=annotations))


SLICES = st.builds(GPUSlice, st.sampled_from(UUIDS), st.integers(0, 3000), st.integers(0, 60))
MIG = st.builds(
    MigAllocation,
    st.integers(0, 1),
    st.integers(0, 1),
    st.sampled_from(UUIDS),
    st.just("1g.10gb"),
    st.builds(MigPlacement, st.integers(0, 6), st.integers(1, 2)),
)


@st.composite
def holds(draw: st.DrawFn) -> Hold:
    uid = draw(st.sampled_from(["u1", "u2", "u3", "u4", "u5"]))
    if draw(st.integers(0, 4)) == 0:
        return Hold(uid, None)
    holding = PodHolding(
        uid,
        "ns",
        uid,
        draw(st.sampled_from(NODES)),
        tuple(draw(st.lists(SLICES, max_size=3))),
        draw(st.booleans()),
        mig=tuple(draw(st.lists(MIG, max_size=2))),
    )
    return Hold(uid, holding)


OPERATIONS = st.one_of(upserts(), st.builds(Delete, st.sampled_from(NODES)), holds(), holds())


def apply(cache: ClusterCache, op: Upsert | Delete | Hold) -> None:
    if isinstance(op, Upsert):
        cache.node_upserted(op.obj)
    elif isinstance(op, Delete):
        cache.node_deleted(op.name)
    else:
        cache.hold(op.uid, op.holding)


def state(cache: ClusterCache) -> tuple[object, ...]:
    return (
        {name: cache.node_gpus(name) for name in NODES},
        {name: cache.unregistered_reason(name) for name in NODES},
        sorted(cache.holdings(), key=lambda h: h.uid),
        {name: sorted(h.uid for h in cache.holdings(name)) for name in NODES},
        cache.stats(),
        {name: cache.node_usage(name) for name in NODES},
    )


@settings(max_examples=500, deadline=None)
@given(
    st.lists(OPERATIONS, max_size=8),
    st.lists(OPERATIONS, min_size=1, max_size=25),
    st.lists(OPERATIONS, max_size=6),
)
def test_a_batch_leaves_the_cache_as_the_same_calls_one_by_one(
    before: list[Any], inside: list[Any], after: list[Any]
) -> None:
    plain, batched = ClusterCache(), ClusterCache()
    for op in before:
        apply(plain, op)
        apply(batched, op)
    assert plain.drain_changed() == batched.drain_changed()
    generations = {name: batched.generation(name) for name in NODES}
    gpus_before = {name: batched.node_gpus(name) for name in NODES}
    for op in inside:
        apply(plain, op)
    with batched.batch():
        for op in inside:
            apply(batched, op)
    assert state(batched) == state(plain)
    assert batched.drain_changed() == plain.drain_changed()
    for name in NODES:
        if batched.node_gpus(name) != gpus_before[name]:
            assert batched.generation(name) != generations[name]
    for op in after:
        apply(plain, op)
        apply(batched, op)
    assert state(batched) == state(plain)


def test_a_batch_rebuilds_each_node_once_and_nests() -> None:
    cache = ClusterCache()
    cache.node_upserted(node("n1", [gpu_info(0, id="GPU-0"), gpu_info(1, id="GPU-1")]))
    first = cache.generation("n1")
    with cache.batch():
        for i in range(10):
            with cache.batch():
                slices = (GPUSlice("GPU-0" if i % 2 else "GPU-1", 1000, 10),)
                cache.hold(f"u{i}", PodHolding(f"u{i}", "ns", f"p{i}", "n1", slices, False))
        assert cache.generation("n1") == first  # rebuilt when the outermost batch ends
    gpus = cache.node_gpus("n1")
    assert gpus is not None
    assert [(g.used, g.usedmem, g.usedcores) for g in gpus.gpus] == [(5, 5000, 50), (5, 5000, 50)]
    assert cache.generation("n1") == first + 1
