"""hami_control.frag: the fragmentation measure of Weng et al. (ATC'23), the task mix, and the
fragmentation node and GPU policies through the real fit, score and extender code."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.resources import ContainerRequest
from hami_api.settings import ConfigError
from hami_api.types import GPUPolicy, GPUSlice, NodePolicy
from hami_control.config import ControlConfig, load_config
from hami_control.extender import Candidates, prioritize_nodes, prioritize_pod, read_pod_ask
from hami_control.fit import Fit, fit_pod
from hami_control.frag import (
    DEFAULT_MIX,
    MixError,
    TaskShape,
    fragmentation,
    gpu_free_milli,
    mix_from_tasks,
    node_fragmentation,
    parse_mix,
)
from hami_control.gputable import GPUTable
from hami_control.score import fragmentation_score
from hami_control.usage import NodeGPUs
from tests.builders import container, gpu_info, node_gpus, pod


def free(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def half() -> ContainerRequest:
    """Half a 16000 MiB GPU: 50% of its memory and cores."""
    return ContainerRequest(1, 0, 50, 50)


# --- the measure --------------------------------------------------------------------------------------------


def test_gpus_too_small_for_a_task_share_are_its_fragment() -> None:
    # One shape of 500 milli: the GPU with 300 free cannot hold it, the idle one can.
    assert fragmentation(free(1000, 300), parse_mix("500:1")) == pytest.approx(300)
    # Expected over the mix: half the tasks ask 1000 (both GPUs hold... only the idle one: 300 is a
    # fragment), half ask 250 (nothing is a fragment).
    assert fragmentation(free(1000, 300), parse_mix("1000:1,250:1")) == pytest.approx(150)


def test_a_node_that_cannot_host_a_shape_counts_all_its_free_gpu() -> None:
    # Two whole GPUs: free 1000, 1000, 500 -> hostable, only the 500 is a fragment; four: not hostable.
    assert fragmentation(free(1000, 1000, 500), parse_mix("2x1000:1")) == pytest.approx(500)
    assert fragmentation(free(1000, 1000, 500), parse_mix("4x1000:1")) == pytest.approx(2500)
    # The host says no (model, CPU or memory): everything free is a fragment.
    mix = parse_mix("500:1")
    no = np.array([False])
    assert fragmentation(free(1000, 300), mix, host_ok=no) == pytest.approx(1300)


def test_fragmentation_is_vectorised_over_leading_dimensions() -> None:
    states = np.array([[1000, 300], [500, 500], [0, 0]], dtype=np.int64)
    mix = parse_mix("600:1,200:3")
    got = fragmentation(states, mix)
    assert got.shape == (3,)
    for row, value in zip(states, got, strict=True):
        assert value == pytest.approx(float(fragmentation(row, mix)))
    assert got[2] == 0  # nothing free, nothing fragmented


def test_a_gpus_free_amount_is_its_scarcer_resource_and_zero_out_of_service() -> None:
    n = node_gpus(gpu_info(0), gpu_info(1, health=False), slices=[GPUSlice("GPU-0", 4000, 50)])
    assert gpu_free_milli(n.gpus[0]) == 500  # cores 50% free, memory 75% free
    assert gpu_free_milli(n.gpus[1]) == 0
    full_slots = node_gpus(gpu_info(0, count=1), slices=[GPUSlice("GPU-0", 0, 0)])
    assert gpu_free_milli(full_slots.gpus[0]) == 0


# --- the mix ------------------------------------------------------------------------------------------------


def test_parse_mix_normalises_weights_and_orders_shapes() -> None:
    mix = parse_mix("250:1, 2x1000:1, 1000:2")
    assert mix.shapes[0] == TaskShape(1, 1000)
    assert sum(mix.weights) == pytest.approx(1)
    assert dict(zip(mix.shapes, mix.weights, strict=True))[TaskShape(2, 1000)] == pytest.approx(0.25)
    assert parse_mix(mix.text()).shapes == mix.shapes


def test_parse_mix_reads_a_shapes_cpu_and_writes_it_back() -> None:
    mix = parse_mix("500/4:3, 500/500m:1, 2x1000/8000m:1")
    assert mix.shapes == (TaskShape(1, 500, 4000), TaskShape(1, 500, 500), TaskShape(2, 1000, 8000))
    assert mix.text() == "500/4000m:60,500/500m:20,2x1000/8000m:20"
    assert parse_mix(mix.text()) == mix


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("500", "entry 1 '500': expected [Nx]MILLI:WEIGHT"),
        ("500:1,abc:2", "entry 2 'abc:2'"),
        ("500:-1", "the weight must be positive, got '-1'"),
        ("0:1", "milli must be 1..1000, got 0"),
        ("2x500:1", "takes whole GPUs, got milli 500"),
        ("500/x:1", "CPU 'x' is not a quantity of cores"),
        ("500/-1:1", "CPU must not be negative, got '-1'"),
    ],
)
def test_parse_mix_errors_name_the_entry_and_value(text: str, words: str) -> None:
    with pytest.raises(MixError, match=None) as err:
        parse_mix(text)
    assert words in str(err.value)


def test_mix_from_tasks_keeps_the_most_common_shapes_covering_95_percent() -> None:
    shapes = [TaskShape(1, 1000)] * 90 + [TaskShape(1, 500)] * 6 + [TaskShape(1, 100)] * 4
    mix = mix_from_tasks(shapes)
    assert mix.shapes == (TaskShape(1, 1000), TaskShape(1, 500))
    assert mix.weights == pytest.approx((90 / 96, 6 / 96))
    assert mix_from_tasks(reversed(shapes)) == mix


def test_default_mix_is_openbs_gpu_task_mix() -> None:
    assert DEFAULT_MIX.shapes[0] == TaskShape(1, 1000)
    assert len(DEFAULT_MIX.shapes) == 9


# --- policies through the real code -------------------------------------------------------------------------


def test_fragmentation_gpu_policy_keeps_the_gpu_that_still_fits_the_mix() -> None:
    # GPU-1 is 40% used. Half a GPU on it leaves 100 milli that no 500-task can use; on GPU-0 both GPUs
    # keep room for a 500-task. Binpack takes the busy GPU, fragmentation the idle one.
    n = node_gpus(gpu_info(0), gpu_info(1), slices=[GPUSlice("GPU-1", 6400, 40)])
    mix = parse_mix("500:1")
    pod_ask = ((half(), False),)
    binpack = fit_pod(n, pod_ask, policy=(GPUPolicy.BINPACK,), mix=mix)
    frag = fit_pod(n, pod_ask, policy=(GPUPolicy.FRAGMENTATION,), mix=mix)
    assert isinstance(binpack, Fit) and isinstance(frag, Fit)
    assert binpack.allocation.containers[0].uuids == ("GPU-1",)
    assert frag.allocation.containers[0].uuids == ("GPU-0",)


def test_fragmentation_in_a_policy_chain_is_one_key_in_the_order_written() -> None:
    n = node_gpus(gpu_info(0), gpu_info(1), slices=[GPUSlice("GPU-1", 6400, 40)])
    mix = parse_mix("500:1")
    pod_ask = ((half(), False),)
    first = fit_pod(n, pod_ask, policy=(GPUPolicy.BINPACK, GPUPolicy.FRAGMENTATION), mix=mix)
    second = fit_pod(n, pod_ask, policy=(GPUPolicy.FRAGMENTATION, GPUPolicy.BINPACK), mix=mix)
    assert isinstance(first, Fit) and isinstance(second, Fit)
    assert first.allocation.containers[0].uuids == ("GPU-1",)
    assert second.allocation.containers[0].uuids == ("GPU-0",)


def test_fragmentation_score_prefers_the_node_whose_fragment_the_pod_fills() -> None:
    mix = parse_mix("1000:1,500:1")
    holed = node_gpus(gpu_info(0), slices=[GPUSlice("GPU-0", 8000, 50)], name="holed")  # 500 free
    idle = node_gpus(gpu_info(0), name="idle")
    fill = fragmentation_score(holed, [GPUSlice("GPU-0", 8000, 50)], mix)
    split = fragmentation_score(idle, [GPUSlice("GPU-0", 8000, 50)], mix)
    assert fill > split
    assert 0 <= split <= 10 and 0 <= fill <= 10
    assert node_fragmentation(holed, mix) == pytest.approx(250)  # 1000-tasks cannot use the 500


def test_the_extender_accepts_the_fragmentation_policy_and_scores_through_prioritize() -> None:
    config = load_config(
        [
            "--insecure-http",
            "--node-scheduler-policy",
            "fragmentation",
            "--fragmentation-mix",
            "1000:1,500:1",
        ],
        {},
        lambda _path: "",
    )
    assert config.scheduling.node_policy is NodePolicy.FRAGMENTATION
    assert config.scheduling.fragmentation_mix == parse_mix("1000:1,500:1")

    nodes = {
        "holed": node_gpus(gpu_info(0, id="h0"), slices=[GPUSlice("h0", 8000, 50)], name="holed"),
        "idle": node_gpus(gpu_info(0, id="i0"), name="idle"),
    }

    class View:
        def node_gpus(self, name: str) -> NodeGPUs | None:
            return nodes.get(name)

        def unregistered_reason(self, name: str) -> str | None:
            return None

    p = pod("p", container("c", gpus=1, gpumem_percentage=50, gpucores=50), namespace="ns", uid="u")
    args = {"Pod": p, "Nodes": None, "NodeNames": ["holed", "idle"]}
    got = {e["Host"]: e["Score"] for e in prioritize_pod(args, View(), config)}
    assert got["holed"] > got["idle"]
    binpack = {e["Host"]: e["Score"] for e in prioritize_pod(args, View(), ControlConfig())}
    assert binpack["holed"] > binpack["idle"]  # binpack agrees here; the score ranges differ
    # holed: F goes from 250 (1000-tasks cannot use its 500) to 0 as the pod takes 500: 5 x (1 + 0.5);
    # idle: F goes from 0 to 250 (the 500 left is a fragment for 1000-tasks): 5 x (1 - 0.5), rounded.
    assert got == {"holed": 8, "idle": 2}


def test_a_bad_fragmentation_mix_setting_names_flag_and_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["--insecure-http", "--fragmentation-mix", "2x300:1"], {}, lambda _p: "")
    text = str(err.value)
    assert "--fragmentation-mix" in text and "2x300" in text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=8),
    st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 1000), st.integers(1, 5)), min_size=1),
)
def test_fragmentation_is_between_zero_and_the_free_amount(
    values: list[int], shapes: list[tuple[int, int, int]]
) -> None:
    mix = parse_mix(",".join(f"{g}x1000:{w}" if g > 1 else f"{m}:{w}" for g, m, w in shapes))
    f = np.array(values, dtype=np.int64)
    got = float(fragmentation(f, mix))
    assert -1e-9 <= got <= f.sum() + 1e-9


gpu_sizes = st.sampled_from([16000, 16000, 24000, 81920])


@st.composite
def fragmented_nodes(draw: st.DrawFn) -> list[NodeGPUs]:
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        gpus = [gpu_info(i, id=f"n{n}-{i}", devmem=draw(gpu_sizes)) for i in range(draw(st.integers(1, 4)))]
        slices = []
        for g in gpus:
            share = draw(st.integers(0, 10)) * 10
            if share:
                slices.append(GPUSlice(g.id, g.devmem * share // 100, share))
        nodes.append(node_gpus(*gpus, name=f"n{n}", slices=slices))
    return nodes


def scores_with_and_without_the_table(
    nodes: list[NodeGPUs], ask_fields: dict[str, Any], mix_text: str
) -> tuple[object, object]:
    """/prioritize's fragmentation scores of a one-GPU pod over `nodes`, through the GPU table and node by
    node (fit_pod on each)."""
    config = ControlConfig().with_settings(
        node_scheduler_policy=NodePolicy.FRAGMENTATION,
        gpu_scheduler_policy=(GPUPolicy.FRAGMENTATION,),
        fragmentation_mix=parse_mix(mix_text),
    )
    ask = read_pod_ask(pod("p", container("c", gpus=1, **ask_fields), namespace="ns", uid="u"), config)
    assert ask is not None
    by_name = {n.name: n for n in nodes}

    class View:
        def node_gpus(self, name: str) -> NodeGPUs | None:
            return by_name.get(name)

        def unregistered_reason(self, name: str) -> str | None:
            return None

    table = GPUTable()
    for n in nodes:
        table.set_node(n)
    candidates = Candidates(tuple(by_name))
    return prioritize_nodes(ask, candidates, View(), table=table), prioritize_nodes(ask, candidates, View())


@settings(max_examples=80, deadline=None)
@given(
    fragmented_nodes(),
    st.one_of(
        st.builds(
            lambda p: {"gpumem_percentage": p, "gpucores": p}, st.integers(1, 10).map(lambda x: 10 * x)
        ),
        st.builds(
            lambda m, c: {"gpumem": m, "gpucores": c}, st.sampled_from([2000, 8000]), st.integers(0, 60)
        ),
    ),
    st.sampled_from(["1000:1,500:1", "810:3,470:2,250:1", "2x1000:1,300:2"]),
)
def test_vectorised_fragmentation_scores_equal_node_by_node(
    nodes: list[NodeGPUs], request: dict[str, int], mix_text: str
) -> None:
    fast, slow = scores_with_and_without_the_table(nodes, request, mix_text)
    assert fast == slow


@st.composite
def shared_nodes(draw: st.DrawFn) -> list[NodeGPUs]:
    """1-4 nodes of 1-4 GPUs (sizes mixed), each GPU with a slice of 0-100 % memory and 0-60 % cores."""
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        sizes = st.sampled_from([16000, 24000, 81920])
        gpus = [gpu_info(i, id=f"n{n}-{i}", devmem=draw(sizes)) for i in range(draw(st.integers(1, 4)))]
        slices = []
        for g in gpus:
            share, cores = draw(st.integers(0, 10)) * 10, draw(st.sampled_from([0, 20, 30, 60]))
            if share or cores:
                slices.append(GPUSlice(g.id, g.devmem * share // 100, cores))
        nodes.append(node_gpus(*gpus, name=f"n{n}", slices=slices))
    return nodes


@settings(max_examples=80, deadline=None)
@given(
    shared_nodes(),
    st.sampled_from([{"gpumem": 8000}, {"gpumem": 2000, "gpucores": 10}, {"gpumem_percentage": 10}]),
    st.sampled_from(["100:1", "300:2,200:2,120:1", "60:1,250:1"]),
)
def test_vectorised_scores_equal_node_by_node_for_a_learned_mix_of_small_tasks(
    nodes: list[NodeGPUs], ask_fields: dict[str, Any], mix_text: str
) -> None:
    """Small shapes leave most GPUs tied at no growth, whatever each would take: the GPU table scores
    those nodes itself (growth 0 scores 5 for any amount taken), the same as fit_pod node by node."""
    fast, slow = scores_with_and_without_the_table(nodes, ask_fields, mix_text)
    assert fast == slow
