"""hami_control.gputable: the vectorised filter and prioritize give exactly what fit_pod gives, node by
node (verdicts, reason texts, unresolvable nodes, scores), and the table follows the cache."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import DEVICES_ALLOCATED
from hami_api.types import GPUInfo, GPUSlice
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.extender import filter_pod, prioritize_pod
from hami_control.gputable import GPUTable
from hami_control.pod_store import PodStore
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.usage import NodeGPUs
from tests.builders import (
    FixedQuota,
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    gpu_pod,
    node,
    node_gpus,
    pod,
)

the_pod = functools.partial(gpu_pod, "p", namespace="ns", uid="u")
"""The pod whose filter and prioritize the tests compare: one container asking for GPUs."""
CONFIG = ControlConfig()
TYPES = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-Tesla T4", "NVIDIA-H100")


@dataclass
class View:
    nodes: dict[str, NodeGPUs] = field(default_factory=dict)

    def node_gpus(self, name: str) -> NodeGPUs | None:
        return self.nodes.get(name)

    def unregistered_reason(self, name: str) -> str | None:
        return None


@st.composite
def nodes(draw: st.DrawFn, name: str) -> NodeGPUs:
    count = draw(st.integers(0, 5))
    gpus: list[GPUInfo] = []
    slices: list[GPUSlice] = []
    for i in range(count):
        info = gpu_info(
            i,
            id=f"{name}-g{i}",
            count=draw(st.integers(1, 4)),
            devmem=draw(st.sampled_from((16000, 24000, 81920))),
            devcore=draw(st.sampled_from((100, 100, 200, 0))),
            type=draw(st.sampled_from(TYPES)),
            mode=draw(st.sampled_from(("hami-core", "", "mig"))),
            health=draw(st.booleans() | st.just(True)),
        )
        gpus.append(info)
        for _ in range(draw(st.integers(0, info.count + 1))):
            slices.append(
                GPUSlice(
                    info.id,
                    draw(st.sampled_from((0, 1000, 8000, 16000))),
                    draw(st.sampled_from((0, 30, 100))),
                )
            )
    cordoned = draw(st.lists(st.sampled_from([g.id for g in gpus]), max_size=1)) if gpus else []
    return node_gpus(*gpus, name=name, cordon=cordoned, slices=slices)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    mem = draw(st.sampled_from((None, 1000, 8000, 20000)))
    pct = draw(st.sampled_from((None, 25, 50))) if mem is None else None
    main = container(
        "c",
        gpus=draw(st.integers(1, 3)),
        gpumem=mem,
        gpumem_percentage=pct,
        gpucores=draw(st.sampled_from((None, 0, 30, 100))),
    )
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        annotations["nvidia.com/use-gputype"] = draw(st.sampled_from(("a100", "T4,H100", "h100")))
    if draw(st.booleans()):
        annotations["nvidia.com/nouse-gputype"] = draw(st.sampled_from(("t4", "A100")))
    if draw(st.booleans()):
        annotations["nvidia.com/vgpu-mode"] = draw(st.sampled_from(("hami-core", "mig")))
    if draw(st.booleans()):
        annotations["nvidia.com/use-gpuuuid"] = draw(st.sampled_from(("n0-g0,n1-g1", "n2-g0")))
    if draw(st.booleans()):
        annotations["nvidia.com/nouse-gpuuuid"] = "n0-g1"
    annotations["hami.io/gpu-scheduler-policy"] = draw(
        st.sampled_from(("spread", "binpack", "mutex", "topology-aware"))
    )
    annotations["hami.io/node-scheduler-policy"] = draw(st.sampled_from(("spread", "binpack")))
    return pod("p", main, container("side"), namespace="ns", uid="u", annotations=annotations)


@st.composite
def clusters(draw: st.DrawFn) -> View:
    count = draw(st.integers(1, 6))
    return View({f"n{i}": draw(nodes(f"n{i}")) for i in range(count)})


def table_of(v: View) -> GPUTable:
    table = GPUTable()
    table.sync(v.nodes, v.node_gpus)
    return table


@settings(max_examples=400, deadline=None)
@given(clusters(), pods(), st.booleans())
def test_vectorised_filter_and_prioritize_equal_fit_pod(v: View, pod: dict[str, Any], quota_on: bool) -> None:
    names = [*v.nodes, "ghost"]
    args = {"Pod": pod, "NodeNames": names}
    quota = FixedQuota(QuotaLimits(memory=100000, cores=None), QuotaUsage(90000, 0)) if quota_on else None
    table = table_of(v)
    slow_reasons: Counter[str] = Counter()
    fast_reasons: Counter[str] = Counter()
    slow = filter_pod(args, v, CONFIG, quota, reasons=slow_reasons)
    fast = filter_pod(args, v, CONFIG, quota, table=table, reasons=fast_reasons)
    assert fast == slow
    assert fast_reasons == slow_reasons
    assert prioritize_pod(args, v, CONFIG, quota, table=table) == prioritize_pod(args, v, CONFIG, quota)


def test_table_grows_in_width_and_rows_and_reuses_rows() -> None:
    v = View(
        {
            f"n{i}": NodeGPUs.of(
                f"n{i}", [gpu_info(0, id=f"n{i}-g0", count=1, devmem=100, type="T", mode="")]
            )
            for i in range(100)
        }
    )
    wide = [gpu_info(i, id=f"w-g{i}", count=2, devmem=1000, type="T", mode="") for i in range(20)]
    v.nodes["w"] = NodeGPUs.of("w", wide)
    table = table_of(v)
    assert len(table) == 101 and table.width >= 20
    table.remove_node("n3")
    table.set_node(NodeGPUs.of("x", wide[:2]))
    assert table.row_of["x"] == 3 and len(table) == 101
    args = {
        "Pod": the_pod(gpus=1, gpumem=500),
        "NodeNames": ["w", "x", "n0", "n3"],
    }
    del v.nodes["n3"]
    v.nodes["x"] = NodeGPUs.of("x", wide[:2])
    assert filter_pod(args, v, CONFIG, table=table) == filter_pod(args, v, CONFIG)


def t4_node(name: str, healthy: Sequence[bool]) -> dict[str, Any]:
    """Node `name` with one T4 (split 4 ways) per entry of `healthy`, its health; `<name>-g<i>`."""
    gpus = [
        gpu_info(i, id=f"{name}-g{i}", count=4, type="NVIDIA-T4", health=up) for i, up in enumerate(healthy)
    ]
    return node(name, gpus)


def bound_pod(uid: str, node_name: str, gpu: str, mem: int) -> dict[str, Any]:
    """A running pod holding `mem` MiB of `gpu` on `node_name`, as hami-control's cache reads it."""
    held = allocation_annotations(
        node_name, allocation([(gpu, mem, 0)]), bind_phase=None, keys=(DEVICES_ALLOCATED,)
    )
    return gpu_pod(uid, gpumem=mem, namespace="ns", uid=uid, annotations=held, phase="Running")


def test_table_follows_the_cache_through_drain_changed() -> None:
    cache = ClusterCache()
    pods = PodStore(CONFIG, cache)
    table = GPUTable()
    for i in range(3):
        cache.node_upserted(t4_node(f"n{i}", (True, True)))
    table.sync(cache.drain_changed(), cache.node_gpus)
    assert cache.drain_changed() == set()
    args = {
        "Pod": the_pod(gpus=2, gpumem=10000),
        "NodeNames": ["n0", "n1", "n2"],
    }
    assert filter_pod(args, cache, CONFIG, table=table)["NodeNames"] == ["n0", "n1", "n2"]
    pods.apply("MODIFIED", bound_pod("a", "n1", "n1-g0", 8000))
    cache.node_deleted("n2")
    table.sync(cache.drain_changed(), cache.node_gpus)
    result = filter_pod(args, cache, CONFIG, table=table)
    assert result == filter_pod(args, cache, CONFIG)
    assert result["NodeNames"] == ["n0"]
    assert result["FailedNodes"] == {
        "n1": "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory"
    }
    assert "n2" in result["FailedAndUnresolvableNodes"]
    pods.apply("DELETED", bound_pod("a", "n1", "n1-g0", 8000))
    table.sync(cache.drain_changed(), cache.node_gpus)
    assert filter_pod(args, cache, CONFIG, table=table)["NodeNames"] == ["n0", "n1"]


@pytest.mark.parametrize("mem", [1000, 20000])
def test_many_nodes_patterns_share_texts(mem: int) -> None:
    v = View(
        {
            f"n{i}": NodeGPUs.of(
                f"n{i}", [gpu_info(j, id=f"n{i}-g{j}", count=2, type="T", mode="") for j in range(8)]
            )
            for i in range(300)
        }
    )
    args = {"Pod": the_pod(gpus=1, gpumem=mem), "NodeNames": list(v.nodes)}
    assert filter_pod(args, v, CONFIG, table=table_of(v)) == filter_pod(args, v, CONFIG)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 300), min_size=11, max_size=11), max_size=40))
def test_group_rows_equals_numpy_unique(rows: list[list[int]]) -> None:
    import numpy as np

    from hami_control.gputable import group_rows

    array = np.array(rows, dtype=np.int64).reshape(len(rows), 11)
    patterns, which = group_rows(array)
    assert (patterns[which] == array).all()
    assert len({tuple(p) for p in patterns.tolist()}) == len(patterns)


def test_slices_on_a_gpu_stay_counted_through_its_xid_and_recovery_so_it_is_never_overbooked() -> None:
    cache, table = ClusterCache(), GPUTable()
    pods = PodStore(CONFIG, cache)
    cache.node_upserted(t4_node("n1", (True, True)))
    for uid in ("a", "b"):
        pods.apply("MODIFIED", bound_pod(uid, "n1", "n1-g0", 6000))  # 12000 of g0's 16000 MiB
    pinned = the_pod(gpus=1, gpumem=6000)
    pinned["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": "n1-g0"}
    args = {"Pod": pinned, "NodeNames": ["n1"]}
    for healthy in ((False, True), (True, True)):  # an Xid marks g0 unhealthy, then it recovers
        cache.node_upserted(t4_node("n1", healthy))
        table.sync(cache.drain_changed(), cache.node_gpus)
        node = cache.node_gpus("n1")
        assert node is not None and (node.gpus[0].used, node.gpus[0].usedmem) == (2, 12000)
        result = filter_pod(args, cache, CONFIG, table=table)
        assert result == filter_pod(args, cache, CONFIG)
        word = "CardNotHealth" if not healthy[0] else "CardInsufficientMemory"
        assert result["FailedNodes"] == {"n1": f"1/2 {word}, 1/2 CardUuidMismatch"}, result
    # After recovery a pod that fits what is left lands there, and the node score counts both GPUs.
    small = the_pod(gpus=1, gpumem=4000)
    small["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": "n1-g0"}
    assert filter_pod({"Pod": small, "NodeNames": ["n1"]}, cache, CONFIG, table=table)["NodeNames"] == ["n1"]


def test_node_score_counts_an_unhealthy_gpu_and_its_slices_like_hami() -> None:
    cache, table = ClusterCache(), GPUTable()
    pods = PodStore(CONFIG, cache)
    cache.node_upserted(t4_node("n1", (False, True)))
    pods.apply("MODIFIED", bound_pod("a", "n1", "n1-g0", 16000))
    table.sync(cache.drain_changed(), cache.node_gpus)
    args = {"Pod": the_pod(gpus=1, gpumem=8000), "NodeNames": ["n1"]}
    fast = prioritize_pod(args, cache, CONFIG, table=table)
    assert fast == prioritize_pod(args, cache, CONFIG)
    # HAMi's ComputeDefaultScore over both GPUs: slots 2/8, cores 0/200, memory 24000/32000 -> 10/3,
    # binpack 3 (healthy GPU alone: slots 1/4, memory 8000/16000 -> 2.5, rounds to 2)
    assert fast == [{"Host": "n1", "Score": 3}]
