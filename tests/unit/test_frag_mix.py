"""hami_control.frag_mix (the task mix learned from observed pods) and its edge, mix_feed: task shapes as
hami-control accounts requests, the window, the prior until enough tasks, frag's 95% rule reused, the
recomputation's rate limit and tolerance, the settings, and the extender's fragmentation scores following
the learned mix."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.resources import ContainerRequest
from hami_api.types import NodePolicy
from hami_control.cache import ClusterCache
from hami_control.config import ConfigError, ControlConfig, FragmentationFilter, load_config
from hami_control.extender import NOT_LEAST_FRAGMENTING
from hami_control.frag import DEFAULT_MIX, MixError, TaskMix, TaskShape, mix_from_tasks, parse_mix
from hami_control.frag_mix import (
    OBSERVED_DEFAULT,
    LearningSettings,
    MixInUse,
    MixLearner,
    MixSource,
    ObservedMix,
    distance,
    most_common_memory,
    parse_mix_setting,
    pod_tasks,
    task_shape,
)
from hami_control.metrics import ControlMetrics
from hami_control.mix_feed import MixFeed
from hami_control.pod_store import PodStore
from hami_control.scheduling import Extender
from tests.builders import Json, allocation, allocation_annotations, container, gpu_info, node, pod

GPU_MEM = 16000


def request(nums: int = 1, memreq: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=memreq, mem_percentage=percent, coresreq=cores)


def learner(window: int = 50, min_tasks: int = 5, interval_s: float = 10.0) -> MixLearner:
    return MixLearner(
        DEFAULT_MIX, LearningSettings(window=window, min_tasks=min_tasks, interval_s=interval_s)
    )


# --- task shapes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "devmem", "shape"),
    [
        (request(percent=50), 0, TaskShape(1, 500)),  # a percentage needs no GPU memory
        (request(memreq=8000), GPU_MEM, TaskShape(1, 500)),
        (request(memreq=8001), GPU_MEM, TaskShape(1, 501)),  # rounded up: a GPU with 500 free cannot hold it
        (request(percent=10, cores=30), 0, TaskShape(1, 300)),  # the larger of memory and cores
        (request(memreq=40000), GPU_MEM, TaskShape(1, 1000)),  # more than the typical GPU: a whole one
        (request(percent=0), 0, TaskShape(1, 1)),  # asks nothing but a slot
        (request(nums=2, percent=100), 0, TaskShape(2, 1000)),
        (request(nums=2, percent=50), 0, None),  # several GPUs, part of each: no TaskShape
        (request(memreq=8000), 0, None),  # MiB without a GPU memory to take them against
    ],
)
def test_a_request_has_the_shape_hami_control_accounts_it_by(
    req: ContainerRequest, devmem: int, shape: TaskShape | None
) -> None:
    assert task_shape(req, devmem) == shape


def test_a_pods_tasks_are_its_gpu_containers_that_run_together() -> None:
    init, side, main, plain = request(percent=10), request(percent=20), request(percent=30), None
    requests = ((init, True), (side, True), (main, False), (plain, False))
    assert pod_tasks(requests, frozenset({1})) == (side, main)


def test_the_most_common_gpu_memory_wins_and_ties_go_to_the_larger() -> None:
    assert most_common_memory([16000, 81920, 16000, 0]) == 16000
    assert most_common_memory([16000, 81920]) == 81920
    assert most_common_memory([]) == 0


# --- the settings -----------------------------------------------------------------------------------------


def test_the_mix_setting_reads_observed_with_or_without_a_prior_or_a_fixed_mix() -> None:
    assert parse_mix_setting("observed") == OBSERVED_DEFAULT == ObservedMix(DEFAULT_MIX)
    assert parse_mix_setting(" Observed:1000:1,500:1") == ObservedMix(parse_mix("1000:1,500:1"))
    assert parse_mix_setting("1000:1,500:1") == parse_mix("1000:1,500:1")
    assert ObservedMix(parse_mix("500:1")).text() == "observed:500:100"
    with pytest.raises(MixError, match="prior mix after the colon"):
        parse_mix_setting("observed:")


def test_the_default_config_learns_the_mix_with_openbs_as_the_prior() -> None:
    config = load_config(["--insecure-http"], {}, lambda _p: "")
    assert config.scheduling.fragmentation_mix == OBSERVED_DEFAULT
    assert config.scheduling.configured_mix == DEFAULT_MIX
    assert config.scheduling.mix_learning == LearningSettings()


def test_the_learning_settings_come_from_flags_environment_and_file() -> None:
    config = load_config(
        [
            "--insecure-http",
            "--config-file",
            "c.yaml",
            "--fragmentation-mix",
            "observed:1000:1",
            "--fragmentation-mix-window",
            "300",
        ],
        {"HAMI_FRAGMENTATION_MIX_MIN_TASKS": "30"},
        lambda _p: "fragmentationMixInterval: 2.5\n",
    )
    assert config.scheduling.configured_mix == parse_mix("1000:1")
    assert config.scheduling.mix_learning == LearningSettings(window=300, min_tasks=30, interval_s=2.5)


def test_a_fixed_mix_learns_nothing_and_says_the_learning_settings_are_ignored() -> None:
    config = load_config(
        ["--insecure-http", "--fragmentation-mix", "1000:1", "--fragmentation-mix-window", "300"],
        {},
        lambda _p: "",
    )
    assert config.scheduling.mix_learning is None
    assert config.scheduling.configured_mix == parse_mix("1000:1")
    assert any("--fragmentation-mix-window" in w and "no effect" in w for w in config.warnings)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--fragmentation-mix", "observed:"], ["--fragmentation-mix", "observed:"]),
        (["--fragmentation-mix", "observe"], ["--fragmentation-mix", "observe"]),
        (["--fragmentation-mix-window", "0"], ["--fragmentation-mix-window", "0"]),
        (["--fragmentation-mix-interval", "-1"], ["--fragmentation-mix-interval", "-1"]),
        (
            ["--fragmentation-mix-window", "10", "--fragmentation-mix-min-tasks", "20"],
            ["--fragmentation-mix-min-tasks", "20", "--fragmentation-mix-window", "10"],
        ),
    ],
)
def test_a_bad_learning_setting_names_the_flag_and_the_value(args: list[str], named: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["--insecure-http", *args], {}, lambda _p: "")
    assert all(part in str(err.value) for part in named), str(err.value)


# --- the learner ------------------------------------------------------------------------------------------

requests_strategy = st.builds(
    request,
    nums=st.sampled_from([1, 1, 1, 2, 4]),
    memreq=st.sampled_from([0, 0, 2000, 8000, 16000]),
    percent=st.sampled_from([None, 10, 25, 50, 100]),
    cores=st.sampled_from([0, 10, 30, 100]),
)


def shaped(requests: Sequence[ContainerRequest]) -> list[TaskShape]:
    return [s for r in requests if (s := task_shape(r, GPU_MEM)) is not None]


@settings(max_examples=80, deadline=None)
@given(st.lists(requests_strategy, min_size=1, max_size=120), st.integers(1, 60), st.integers(1, 60))
def test_the_learned_mix_is_frags_rule_over_the_last_window_tasks_and_sums_to_one(
    requests: list[ContainerRequest], window: int, least: int
) -> None:
    least = min(least, window)
    mine = learner(window=window, min_tasks=least)
    for r in requests:
        mine.observe(r)
    assert len(mine) == min(window, len(requests)) and mine.seen == len(requests)
    kept = shaped(requests[-window:])
    learned = mine.learned(GPU_MEM)
    if len(kept) < least:
        assert learned is None
        return
    assert learned is not None and learned.source is MixSource.OBSERVED and learned.tasks == len(kept)
    assert learned.mix == mix_from_tasks(kept)  # frag's rule, over the window alone
    assert sum(learned.mix.weights) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(requests_strategy, min_size=1, max_size=80), st.randoms(use_true_random=False))
def test_the_same_tasks_give_the_same_mix_value_in_any_order(
    requests: list[ContainerRequest], rng: object
) -> None:
    a, b = learner(window=100, min_tasks=1), learner(window=100, min_tasks=1)
    shuffled = list(requests)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    for r in requests:
        a.observe(r)
    for r in shuffled:
        b.observe(r)
    got_a, got_b = a.refresh(0.0, GPU_MEM), b.refresh(0.0, GPU_MEM)
    assert got_a == got_b
    assert a.in_use == b.in_use and hash(a.in_use.mix) == hash(b.in_use.mix)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(0, 5000))
def test_the_window_bounds_what_the_learner_keeps_however_many_pods_pass(window: int, extra: int) -> None:
    mine = learner(window=window, min_tasks=1)
    for i in range(window + extra):
        mine.observe(request(percent=1 + i % 100))
    assert len(mine) == window
    assert len(mine._counts) <= window and sum(mine._counts.values()) == window


def test_the_prior_stays_until_min_tasks_have_a_shape() -> None:
    mine = learner(window=50, min_tasks=5, interval_s=1.0)
    for _ in range(4):
        mine.observe(request(percent=50))
    mine.observe(request(nums=2, percent=50))  # no shape: does not count toward the minimum
    assert mine.refresh(0.0, GPU_MEM) is None
    assert mine.in_use == MixInUse(DEFAULT_MIX, MixSource.CONFIGURED)
    mine.observe(request(memreq=8000))
    changed = mine.refresh(1.0, GPU_MEM)
    assert changed == MixInUse(parse_mix("500:1"), MixSource.OBSERVED, 5)
    assert mine.in_use == changed
    # The GPUs go away: requests in MiB lose their shape, fewer than 5 are left, the prior is back.
    assert mine.refresh(2.0, 0) == MixInUse(DEFAULT_MIX, MixSource.CONFIGURED)


def test_the_mix_is_recomputed_at_most_once_per_interval_and_only_when_tasks_came() -> None:
    mine = learner(window=100, min_tasks=1, interval_s=10.0)
    mine.observe(request(percent=50))
    assert mine.refresh(100.0, GPU_MEM) is not None
    mine.observe(request(percent=100))
    assert mine.refresh(105.0, GPU_MEM) is None  # too soon
    assert mine.in_use.mix == parse_mix("500:1")
    assert mine.refresh(110.0, GPU_MEM) is not None
    assert mine.in_use.mix == parse_mix("500:1,1000:1")
    assert mine.refresh(200.0, GPU_MEM) is None  # nothing new


def test_a_small_move_keeps_the_mix_value_and_a_larger_one_replaces_it() -> None:
    mine = learner(window=1000, min_tasks=1, interval_s=1.0)
    for _ in range(500):
        mine.observe(request(percent=50))
    for _ in range(500):
        mine.observe(request(percent=100))
    first = mine.refresh(0.0, GPU_MEM)
    assert first is not None and first.mix == parse_mix("500:1,1000:1")
    for _ in range(10):  # 1 % moves from 500 to 1000: under the tolerance
        mine.observe(request(percent=100))
    assert mine.refresh(1.0, GPU_MEM) is None
    assert mine.in_use is first
    for _ in range(30):  # 4 % in all
        mine.observe(request(percent=100))
    again = mine.refresh(2.0, GPU_MEM)
    assert again is not None and distance(again.mix, first.mix) >= 0.02
    assert again.mix.weights[0] == pytest.approx(0.54)  # 1000 now first, 540 of the last 1000


def test_learning_settings_refuse_a_minimum_outside_the_window() -> None:
    with pytest.raises(ValueError, match="min_tasks"):
        LearningSettings(window=10, min_tasks=11)
    with pytest.raises(ValueError, match="interval_s"):
        LearningSettings(interval_s=0)


# --- the feed and the extender ----------------------------------------------------------------------------


def t4_node(name: str) -> Json:
    """Node `name` with one 16,000 MiB GPU `<name>-g0` of 4 slots."""
    return node(name, [gpu_info(0, id=f"{name}-g0", count=4, devmem=GPU_MEM)])


def mem_pod(name: str, mem: int = 8000, **fields: Any) -> Json:
    """The pod `ns/<name>` (uid `u-<name>`) asking one GPU of `mem` MiB."""
    return pod(name, container("c", gpus=1, gpumem=mem), namespace="ns", uid=f"u-{name}", **fields)


def scores(ext: Extender, p: Json, names: list[str]) -> dict[str, int]:
    answer = ext.prioritize(orjson.dumps({"Pod": p, "NodeNames": names}))
    return {e["Host"]: e["Score"] for e in answer}


def test_the_extenders_fragmentation_scores_follow_the_observed_mix(caplog: pytest.LogCaptureFixture) -> None:
    config = ControlConfig().with_settings(
        node_scheduler_policy=NodePolicy.FRAGMENTATION,
        fragmentation_mix_min_tasks=3,
        fragmentation_mix_interval_s=1.0,
    )
    learning = config.scheduling.mix_learning
    assert learning is not None
    cache = ClusterCache()
    for name in ("holed", "idle"):
        cache.node_upserted(t4_node(name))
    pods = PodStore(config, cache)
    ext = Extender(config, cache, pods)
    metrics = ControlMetrics(cache)
    seen: list[MixInUse] = []

    def use(in_use: MixInUse) -> None:
        ext.mix = in_use.mix
        metrics.set_fragmentation_mix(in_use)
        seen.append(in_use)

    feed = MixFeed(MixLearner(config.scheduling.configured_mix, learning), cache, use)
    pods.add_listener(feed.pod_event)
    # Half of holed's GPU is taken (8,000 of 16,000 MiB): 500 milli-GPUs free there, 1000 on idle.
    held = allocation([("holed-g0", 8000, 0)])
    pods.apply(
        "ADDED", mem_pod("holder", annotations=allocation_annotations("holed", held), node_name="holed")
    )
    assert feed.refresh(0.0) is None  # one task: OpenB's mix still
    # OpenB's mix: 79 % of its tasks cannot use a 500 fragment, so filling holed's half scores high and
    # splitting idle's GPU low (9 and 1: see test_frag's arithmetic).
    assert scores(ext, mem_pod("a"), ["holed", "idle"]) == {"holed": 9, "idle": 1}

    for name in ("b", "c"):
        pods.apply("ADDED", mem_pod(name))
    pods.apply("MODIFIED", mem_pod("b", phase="Running"))  # a pod's later events add nothing
    with caplog.at_level(logging.INFO, logger="hami_control.mix_feed"):
        changed = feed.refresh(1.0)
    assert changed == MixInUse(parse_mix("500:1"), MixSource.OBSERVED, 3) and seen == [changed]
    assert "observed mix of the last 3 GPU tasks 500:100" in caplog.text
    # Every task takes half a GPU: a half GPU left is no fragment, both placements leave it alone.
    assert scores(ext, mem_pod("d"), ["holed", "idle"]) == {"holed": 5, "idle": 5}
    text = metrics.render()[0].decode()
    assert 'hami_fragmentation_mix_probability{shape="500",source="observed"} 1.0' in text
    assert 'hami_fragmentation_mix_tasks{source="observed"} 3.0' in text


def test_a_scheduling_cycle_keeps_the_mix_it_started_with() -> None:
    config = ControlConfig().with_settings(node_scheduler_policy=NodePolicy.FRAGMENTATION)
    cache = ClusterCache()
    cache.node_upserted(t4_node("a"))
    ext = Extender(config, cache, PodStore(config, cache))
    p = mem_pod("p")
    p["metadata"]["resourceVersion"] = "1"
    ext.filter(orjson.dumps({"Pod": p, "NodeNames": ["a"]}))
    ext.mix = TaskMix.of([(TaskShape(1, 500), 1.0)])
    ext.prioritize(orjson.dumps({"Pod": p, "NodeNames": ["a"]}))
    cycle = ext.cycles.get("u-p")
    assert cycle is not None and cycle.ask is not None and cycle.ask.mix == DEFAULT_MIX
    other = mem_pod("q")
    ext.filter(orjson.dumps({"Pod": other, "NodeNames": ["a"]}))
    started = ext.cycles.get("u-q")
    assert started is not None and started.ask is not None and started.ask.mix == ext.mix


def test_fragmentation_filter_best_learns_shapes_with_cpu_and_keeps_the_node_whose_cpu_strands_its_gpu() -> (
    None
):
    config = load_config(
        [
            "--insecure-http",
            "--node-scheduler-policy",
            "fragmentation",
            "--gpu-scheduler-policy",
            "fragmentation",
            "--fragmentation-filter",
            "best",
            "--filter-failed-nodes",
            "always",
            "--fragmentation-mix-min-tasks",
            "3",
            "--fragmentation-mix-interval",
            "1",
        ],
        {},
        lambda _p: "",
    )
    learning = config.scheduling.mix_learning
    assert learning is not None and learning.cpu
    cache = ClusterCache()
    for name in ("busy", "idle"):
        cache.node_upserted(
            node(name, [gpu_info(0, id=f"{name}-g0", count=4, devmem=GPU_MEM)], allocatable={"cpu": "16"})
        )
    pods = PodStore(config, cache)
    ext = Extender(config, cache, pods)
    metrics = ControlMetrics(cache)

    def use(in_use: MixInUse) -> None:
        ext.mix = in_use.mix
        metrics.set_fragmentation_mix(in_use)

    feed = MixFeed(MixLearner(config.scheduling.configured_mix, learning), cache, use)
    pods.add_listener(feed.pod_event)
    # Three half-GPU pods of 4 CPUs are seen (not bound): the mix is one shape, 500 milli-GPUs and 4 CPUs.
    for name in ("a", "b", "c"):
        pods.apply(
            "ADDED",
            pod(
                name,
                container("c", gpus=1, gpumem=8000, requests={"cpu": "4"}),
                namespace="ns",
                uid=f"u-{name}",
            ),
        )
    changed = feed.refresh(0.0)
    assert changed is not None and changed.mix == TaskMix.of([(TaskShape(1, 500, 4000), 1)])
    assert (
        'hami_fragmentation_mix_probability{shape="500/4000m",source="observed"} 1.0'
        in metrics.render()[0].decode()
    )
    # A CPU-only pod takes 14 of busy's 16 CPUs: busy can no longer host the mix's task, its idle GPU is
    # all fragment. A half-GPU pod of 1 CPU shrinks that fragment on busy and leaves idle's GPU whole for
    # the mix: /filter keeps busy only; the GPU-only measure ties them (kube-scheduler's LeastAllocated
    # would pick idle).
    pods.apply(
        "ADDED",
        pod(
            "hog",
            container("c", requests={"cpu": "14"}),
            namespace="ns",
            uid="u-hog",
            node_name="busy",
            phase="Running",
        ),
    )
    small = pod(
        "small", container("c", gpus=1, gpumem=8000, requests={"cpu": "1"}), namespace="ns", uid="u-small"
    )
    answer = ext.filter(orjson.dumps({"Pod": small, "NodeNames": ["busy", "idle"]}))
    assert answer["NodeNames"] == ["busy"]
    assert answer["FailedNodes"] == {"idle": NOT_LEAST_FRAGMENTING}
    assert scores(ext, small, ["busy", "idle"]) == {"busy": 5, "idle": 5}
    # Without the setting, every fitting node is answered.
    ext.config = config.with_settings(fragmentation_filter=FragmentationFilter.ALL)
    answer = ext.filter(orjson.dumps({"Pod": small, "NodeNames": ["busy", "idle"]}))
    assert (answer["NodeNames"], answer["FailedNodes"]) == (["busy", "idle"], {})


def test_fragmentation_filter_is_all_or_best_and_a_bad_value_names_the_flag() -> None:
    assert (
        load_config(["--insecure-http"], {}, lambda _p: "").scheduling.fragmentation_filter
        is FragmentationFilter.ALL
    )
    env = load_config(["--insecure-http"], {"HAMI_FRAGMENTATION_FILTER": "best"}, lambda _p: "")
    assert env.scheduling.fragmentation_filter is FragmentationFilter.BEST
    with pytest.raises(
        ConfigError, match=r'--fragmentation-filter: expected one of all, best, one, got "most"'
    ):
        load_config(["--insecure-http", "--fragmentation-filter", "most"], {}, lambda _p: "")
