"""The fragmentation component's second extender entry, `/cpu-filter` and `/cpu-prioritize` (issue 28), and
`--fragmentation-filter one`, in process: what they answer for pods that ask no GPU and for GPU pods, with
and without the component's settings, and behind the extender's gate."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import orjson

from hami_api.resources import ContainerRequest
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, FragmentationFilter, load_config
from hami_control.frag import TaskMix, TaskShape, first_best
from hami_control.frag_mix import LearningSettings, MixLearner, MixSource
from hami_control.leader import extender_gate
from hami_control.pod_store import PodStore
from hami_control.scheduling import Extender
from hami_control.server import ControlServer, Routes, extender_routes
from tests.builders import Json, container, gpu_info, node, pod

GPU_MEM = 16000
ONE = [
    "--insecure-http",
    "--node-scheduler-policy",
    "fragmentation",
    "--gpu-scheduler-policy",
    "fragmentation",
    "--fragmentation-filter",
    "one",
    "--fragmentation-mix",
    "500/4:1",
]


def one_config() -> ControlConfig:
    return load_config(ONE, {}, lambda _p: "")


def cluster(config: ControlConfig) -> tuple[Extender, PodStore]:
    """`a-tight`: one idle T4-sized GPU and 16 CPUs of which a CPU-only pod holds 11; `b-gpu`: the same
    with all 16 CPUs free; `c-cpu`: 16 CPUs and no GPU."""
    cache = ClusterCache()
    for name in ("a-tight", "b-gpu"):
        cache.node_upserted(
            node(name, [gpu_info(0, id=f"{name}-g0", count=4, devmem=GPU_MEM)], allocatable={"cpu": "16"})
        )
    pods = PodStore(config, cache)
    pods.apply(
        "ADDED",
        pod(
            "hog",
            container("c", requests={"cpu": "11"}),
            namespace="ns",
            uid="u-hog",
            node_name="a-tight",
            phase="Running",
        ),
    )
    return Extender(config, cache, pods), pods


def cpu_pod(name: str, cpu: str) -> Json:
    return pod(name, container("c", requests={"cpu": cpu}), namespace="ns", uid=f"u-{name}")


def half_gpu_pod(name: str) -> Json:
    return pod(
        name, container("c", gpus=1, gpumem=8000, requests={"cpu": "1"}), namespace="ns", uid=f"u-{name}"
    )


NAMES = ["a-tight", "b-gpu", "c-cpu"]


def cpu_filter(ext: Extender, p: Json, names: list[str] = NAMES) -> dict[str, Any]:
    return ext.cpu_filter(orjson.dumps({"Pod": p, "NodeNames": names}))


def test_a_cpu_only_pod_gets_the_one_node_where_fgd_scores_best_the_fuller_then_first_by_name_alone() -> None:
    ext, _ = cluster(one_config())
    # 2 CPUs on a-tight leave 3 of its 5 free: the mix's task (4 CPUs) loses its host there and the
    # idle GPU becomes a fragment; b-gpu and c-cpu grow nothing (score 50), and c-cpu, with no free GPU,
    # is the fuller.
    answer = cpu_filter(ext, cpu_pod("p", "2"))
    assert answer["NodeNames"] == ["c-cpu"]
    # The others are not listed: kube-scheduler reads FailedNodes only for a pod with no node left.
    assert (answer["FailedNodes"], answer["FailedAndUnresolvableNodes"], answer["Error"]) == ({}, {}, "")
    # Without c-cpu: b-gpu, though a-tight sorts first.
    assert cpu_filter(ext, cpu_pod("p", "2"), ["a-tight", "b-gpu"])["NodeNames"] == ["b-gpu"]
    # 1 CPU leaves a-tight 4: it still hosts the task; between the two equally full GPU nodes, the first
    # name.
    assert cpu_filter(ext, cpu_pod("q", "1"), ["b-gpu", "a-tight"])["NodeNames"] == ["a-tight"]


def test_a_cpu_only_pod_sent_as_whole_nodes_gets_its_one_node_object_back() -> None:
    ext, _ = cluster(one_config())
    items = [{"metadata": {"name": n}, "spec": {}} for n in NAMES]
    answer = ext.cpu_filter(orjson.dumps({"Pod": cpu_pod("p", "2"), "Nodes": {"items": items}}))
    assert answer["NodeNames"] is None and [i["metadata"]["name"] for i in answer["Nodes"]["items"]] == [
        "c-cpu"
    ]


def test_a_gpu_pod_passes_the_cpu_entry_unchanged_with_zero_scores() -> None:
    ext, _ = cluster(one_config())
    answer = cpu_filter(ext, half_gpu_pod("g"))
    assert (answer["NodeNames"], answer["FailedNodes"], answer["Error"]) == (NAMES, {}, "")
    scores = ext.cpu_prioritize(orjson.dumps({"Pod": half_gpu_pod("g"), "NodeNames": NAMES}))
    assert scores == [{"Host": n, "Score": 0} for n in NAMES]


def test_the_cpu_entry_passes_every_node_without_the_fragmentation_policy_and_filter_one() -> None:
    for args in (["--insecure-http"], [*ONE[:-3], "best", "--fragmentation-mix", "500/4:1"]):
        ext, _ = cluster(load_config(args, {}, lambda _p: ""))
        assert not ext.decides_cpu_only
        answer = cpu_filter(ext, cpu_pod("p", "2"))
        assert (answer["NodeNames"], answer["FailedNodes"]) == (NAMES, {})


def test_an_unreadable_pod_or_body_never_blocks_the_cpu_entry() -> None:
    ext, _ = cluster(one_config())
    bad = cpu_pod("p", "2")
    bad["metadata"]["annotations"] = {"nvidia.com/use-gputype": 5}
    assert cpu_filter(ext, bad)["NodeNames"] == NAMES
    assert ext.cpu_filter(b"not json")["Error"].startswith("ExtenderArgs")
    assert ext.cpu_prioritize(b"not json") == []


def test_a_gpu_pod_under_filter_one_gets_only_the_node_of_the_best_score_the_fuller_then_first_name() -> None:
    config = one_config()
    ext, _ = cluster(config)
    answer = ext.filter(orjson.dumps({"Pod": half_gpu_pod("g"), "NodeNames": ["a-tight", "b-gpu"]}))
    # a-tight's 5 free CPUs host the mix's task now and 4 after: both nodes score alike, the first name.
    assert answer["NodeNames"] == ["a-tight"] and answer["FailedNodes"] == {}
    # Under best, both nodes of the least growth are kept for kube-scheduler's score.
    ext.config = config.with_settings(fragmentation_filter=FragmentationFilter.BEST)
    answer = ext.filter(orjson.dumps({"Pod": half_gpu_pod("g"), "NodeNames": ["a-tight", "b-gpu"]}))
    assert answer["NodeNames"] == ["a-tight", "b-gpu"]


def test_the_learned_mix_under_filter_one_keeps_the_share_of_pods_that_ask_no_gpu() -> None:
    settings = one_config().scheduling.mix_learning
    assert settings is None  # a fixed mix here; learned with `observed`:
    learning = LearningSettings(window=100, min_tasks=2, interval_s=1, cpu=True, cpu_only=True)
    learner = MixLearner(TaskMix.of([(TaskShape(1, 1000), 1)]), learning)
    half = ContainerRequest(1, 0, 50, 50)
    for _ in range(3):
        learner.observe(half, 4000)
    learner.observe_cpu_only(2000)
    in_use = learner.refresh(0.0, GPU_MEM)
    assert in_use is not None and in_use.source is MixSource.OBSERVED
    assert in_use.mix.shapes == (TaskShape(1, 500, 4000),) and in_use.mix.cpu_share == 0.25
    off = MixLearner(TaskMix.of([(TaskShape(1, 1000), 1)]), LearningSettings(min_tasks=1, cpu=True))
    off.observe_cpu_only(2000)
    assert len(off) == 0


def test_filter_one_learns_cpu_only_pods_from_the_config() -> None:
    config = load_config([*ONE[:-2], "--fragmentation-mix", "observed"], {}, lambda _p: "")
    learning = config.scheduling.mix_learning
    assert learning is not None and learning.cpu and learning.cpu_only


def test_the_cpu_routes_are_served_and_answer_the_gates_reason_as_an_error() -> None:
    ext, _ = cluster(one_config())
    synced = {"pods": False}

    async def main() -> list[object]:
        routes = Routes()
        extender_routes(routes, ext, gate=extender_gate(None, lambda: synced), cpu_verbs=ext)
        server = ControlServer(routes, "127.0.0.1", 0, ssl_context=None)
        await server.start()
        got: list[object] = []
        body = orjson.dumps({"Pod": cpu_pod("p", "2"), "NodeNames": NAMES})
        try:
            async with aiohttp.ClientSession() as session:
                for ready in (False, True):
                    synced["pods"] = ready
                    for path in ("/cpu-filter", "/cpu-prioritize"):
                        async with session.post(f"http://127.0.0.1:{server.port}{path}", data=body) as r:
                            got.append((r.status, await r.json()))
        finally:
            await server.stop()
        return got

    refused_filter, refused_prioritize, answer, scores = asyncio.run(main())
    assert refused_filter[0] == 200 and "not synced" in refused_filter[1]["Error"]  # type: ignore[index]
    assert refused_prioritize == (200, [])
    assert answer[1]["NodeNames"] == ["c-cpu"]  # type: ignore[index]
    assert scores == (200, [{"Host": n, "Score": 0} for n in NAMES])


def test_without_cpu_verbs_the_cpu_routes_are_not_served() -> None:
    ext, _ = cluster(one_config())

    async def main() -> int:
        routes = Routes()
        extender_routes(routes, ext)
        server = ControlServer(routes, "127.0.0.1", 0, ssl_context=None)
        await server.start()
        try:
            url = f"http://127.0.0.1:{server.port}/cpu-filter"
            async with aiohttp.ClientSession() as session, session.post(url, data=b"{}") as r:
                return r.status
        finally:
            await server.stop()

    assert asyncio.run(main()) == 404


def test_first_best_takes_the_best_score_then_the_fuller_node_then_the_first_name() -> None:
    score = np.array([5, 5, 5, 3], dtype=np.int64)
    names = ["b", "a", "c", "d"]
    assert first_best(score, names) == 1
    assert first_best(score, names, np.array([100, 200, 100, 0], dtype=np.int64)) == 0
    assert first_best(score, names, np.array([300, 200, 100, 0], dtype=np.int64)) == 2
