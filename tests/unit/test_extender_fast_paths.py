"""The extender's fast paths of issue 29 answer exactly what the plain computation answers:

- the GPU table's per-node answers kept from one request to the next (`gputable.RowCache`: verdicts,
  reason texts, binpack/spread and fragmentation scores, the fragmentation filter's per-node values with
  the free CPU in the measure), caught up through the table's change log while nodes are written,
  removed, added and their free CPU changes, equal the node-by-node `fit_pod` answers (filter and
  prioritize, reasons counted included) and the table's fresh evaluation;
- the answers written as JSON without building the objects (`FilterAnswer.as_json`,
  `PrioritizeAnswer.as_json`; failed nodes and host priorities of names alike in length from the
  table's padded keys, others joined) decode to the objects, in the same order;
- the candidate lists read once and kept by the JSON of their names (`CandidateLists`) give what
  decoding the whole body gives, for bodies of every shape;
- the table's change log lists each row written, removed or touched;
- the pods watch's container requests kept by their resources equal reading each container;
- the pods watch's containers kept by the pod's containers as JSON give the records reading each pod
  afresh gives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.errors import QuantityError, RequestError, WireFormatError
from hami_api.resources import container_request
from hami_api.types import GPUInfo, GPUSlice
from hami_control.config import ControlConfig, load_config
from hami_control.extender import (
    UNKNOWN_CPU,
    CandidateLists,
    Candidates,
    ExtenderArgsError,
    HostCPU,
    PrioritizeAnswer,
    filter_answer,
    filter_pod,
    prioritize_answer,
    prioritize_pod,
    read_candidates,
    read_pod_ask,
)
from hami_control.frag import MILLI, TaskMix, TaskShape
from hami_control.gputable import GPUTable, RowCache
from hami_control.pod_store import _container_request
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.score import MAX_SCORE
from hami_control.usage import NodeGPUs
from tests.builders import FixedQuota, container, gpu_info, node_gpus, pod

CONFIG = ControlConfig()
FRAGMENTATION = load_config(
    [
        "--insecure-http",
        "--node-scheduler-policy=fragmentation",
        "--gpu-scheduler-policy=fragmentation",
    ],
    {},
    lambda p: p.read_text(),
)
TYPES = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-Tesla T4")


@dataclass
class View:
    """The nodes' GPUs by name, as the cache gives them."""

    nodes: dict[str, NodeGPUs] = field(default_factory=dict)

    def node_gpus(self, name: str) -> NodeGPUs | None:
        return self.nodes.get(name)

    def unregistered_reason(self, name: str) -> str | None:
        return None


@st.composite
def gpu_nodes(draw: st.DrawFn, name: str) -> NodeGPUs:
    gpus: list[GPUInfo] = []
    slices: list[GPUSlice] = []
    for i in range(draw(st.integers(0, 4))):
        info = gpu_info(
            i,
            id=f"{name}-g{i}",
            count=draw(st.integers(1, 4)),
            devmem=draw(st.sampled_from((16000, 81920))),
            devcore=draw(st.sampled_from((100, 100, 0))),
            type=draw(st.sampled_from(TYPES)),
            mode=draw(st.sampled_from(("hami-core", "hami-core", "", "mig"))),
            health=draw(st.booleans() | st.just(True)),
        )
        gpus.append(info)
        for _ in range(draw(st.integers(0, info.count))):
            slices.append(
                GPUSlice(info.id, draw(st.sampled_from((1000, 8000, 16000))), draw(st.sampled_from((0, 30))))
            )
    return node_gpus(*gpus, name=name, slices=slices)


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod of one GPU container (what the table answers), with policies and selectors."""
    mem = draw(st.sampled_from((None, 1000, 8000, 20000)))
    main = container(
        "c",
        gpus=draw(st.integers(1, 2)),
        gpumem=mem,
        gpumem_percentage=draw(st.sampled_from((None, 25))) if mem is None else None,
        gpucores=draw(st.sampled_from((None, 30, 100))),
        requests={"cpu": draw(st.sampled_from(("1", "4", "16")))},
    )
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        annotations["nvidia.com/use-gputype"] = draw(st.sampled_from(("a100", "T4")))
    if draw(st.booleans()):
        annotations["nvidia.com/nouse-gpuuuid"] = "n0-g1"
    policy = draw(st.sampled_from(("", "spread", "binpack", "mutex")))
    if policy:
        annotations["hami.io/gpu-scheduler-policy"] = policy
    node_policy = draw(st.sampled_from(("", "spread", "binpack")))
    if node_policy:
        annotations["hami.io/node-scheduler-policy"] = node_policy
    return pod("p", main, namespace="ns", uid="u", annotations=annotations)


@st.composite
def steps(draw: st.DrawFn, names: list[str]) -> list[tuple[str, str, Any]]:
    """What happens between two requests: a node written anew, removed, or its free CPU changed."""
    out: list[tuple[str, str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(names))
        kind = draw(st.sampled_from(("write", "write", "remove", "cpu")))
        value: Any = None
        if kind == "write":
            value = draw(gpu_nodes(name))
        elif kind == "cpu":
            value = draw(st.sampled_from((0, 4000, 16000, 64000, UNKNOWN_CPU)))
        out.append((kind, name, value))
    return out


MIX = TaskMix.of(
    [(TaskShape(1, 250, 4000), 3), (TaskShape(1, MILLI, 8000), 2), (TaskShape(2, MILLI, 16000), 1)]
)


def _apply(view: View, table: GPUTable, cpu: dict[str, int], step: tuple[str, str, Any]) -> None:
    kind, name, value = step
    if kind == "write":
        view.nodes[name] = value
        table.set_node(value)
    elif kind == "remove":
        view.nodes.pop(name, None)
        table.remove_node(name)
    else:
        cpu[name] = value
        table.touch([name])


def _encoded_equal(filtered: Any, prioritized: Any) -> None:
    assert orjson.loads(filtered.as_json()) == filtered.as_dict()
    assert orjson.loads(prioritized.as_json()) == prioritized.as_list()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_kept_per_node_answers_equal_fit_pod_through_any_changes(data: st.DataObject) -> None:
    """Filter and prioritize with the row cache (and answers written as JSON) equal the plain
    node-by-node answers after every step of node writes, removals and additions."""
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 7)))]
    if data.draw(st.booleans()):  # names of different lengths: failed nodes written by a join
        names.insert(0, "a-node-with-a-much-longer-name")
    view = View({n: data.draw(gpu_nodes(n)) for n in names[: max(1, len(names) - 1)]})
    table = GPUTable()
    table.sync(view.nodes, view.node_gpus)
    cache = RowCache(table, entries=data.draw(st.integers(1, 4)))
    lists = CandidateLists()
    asks = [data.draw(gpu_pods()) for _ in range(2)]
    quota = FixedQuota(QuotaLimits(memory=100000, cores=None), QuotaUsage(80000, 0))
    cpu: dict[str, int] = {}
    for round_ in range(data.draw(st.integers(1, 5))):
        for p in asks:
            candidates = [*names, "ghost"]
            args = {"Pod": p, "NodeNames": candidates}
            for q in (None, quota) if round_ == 0 else (None,):
                slow_reasons: Counter[str] = Counter()
                fast_reasons: Counter[str] = Counter()
                slow = filter_pod(args, view, CONFIG, q, reasons=slow_reasons)
                fast = filter_pod(args, view, CONFIG, q, table=table, reasons=fast_reasons, cache=cache)
                assert fast == slow
                assert fast_reasons == slow_reasons
                plain = prioritize_pod(args, view, CONFIG, q)
                assert prioritize_pod(args, view, CONFIG, q, table=table, cache=cache) == plain
            _, read = lists.read(orjson.dumps(args))
            assert read is not None
            ask = read_pod_ask(p, CONFIG)
            filtered = filter_answer(ask, read, view, table=table, cache=cache)
            prioritized = prioritize_answer(ask, read, view, table=table, cache=cache)
            assert filtered.as_dict() == filter_pod(args, view, CONFIG)
            _encoded_equal(filtered, prioritized)
        for step in data.draw(steps(names)):
            _apply(view, table, cpu, step)


@settings(max_examples=50, deadline=None)
@given(st.data(), st.sampled_from((False, True)))
def test_kept_fragmentation_answers_equal_a_fresh_evaluation_through_any_changes(
    data: st.DataObject, one: bool
) -> None:
    """Under the fragmentation policies: prioritize's scores and the fragmentation filter's narrowing
    (`best`, or `one` with the free CPU in the measure, which changes between requests) from the row
    cache equal the table's fresh evaluation, after every step."""
    names = [f"n{i}" for i in range(data.draw(st.integers(2, 7)))]
    view = View({n: data.draw(gpu_nodes(n)) for n in names})
    table = GPUTable()
    table.sync(view.nodes, view.node_gpus)
    cache = RowCache(table)
    cpu = {n: data.draw(st.sampled_from((0, 4000, 16000, UNKNOWN_CPU))) for n in names}
    mem = data.draw(st.sampled_from((1000, 8000)))
    p = pod("p", container("c", gpus=1, gpumem=mem, requests={"cpu": "4"}), uid="u")
    ask = read_pod_ask(p, FRAGMENTATION, mix=MIX)
    assert ask is not None
    for _ in range(data.draw(st.integers(1, 5))):
        candidates = Candidates(tuple([*names, "ghost"]))
        narrow = HostCPU(cpu.get, 4000, one)
        plain = filter_answer(ask, candidates, view, table=table, narrow=narrow)
        kept = filter_answer(ask, candidates, view, table=table, narrow=narrow, cache=cache)
        assert kept.as_dict() == plain.as_dict()
        assert orjson.loads(kept.as_json()) == kept.as_dict()
        scored = prioritize_answer(ask, candidates, view, table=table, cache=cache)
        assert scored.as_list() == prioritize_answer(ask, candidates, view, table=table).as_list()
        assert scored.as_list() == prioritize_answer(ask, candidates, view).as_list()
        for step in data.draw(steps(names)):
            _apply(view, table, cpu, step)


NAME_TEXT = st.text(st.characters(codec="utf-8"), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["n0", "n1", "gpu-node-00007", 'q"x', "\\", ""]) | st.lists(NAME_TEXT), max_size=5
    ),
    st.dictionaries(NAME_TEXT, NAME_TEXT, max_size=3),
    st.sampled_from(("last", "first", "twice", "nodes", "spaced", "not a list", "broken")),
)
def test_candidate_lists_read_what_decoding_the_whole_body_reads(
    names: list[Any], annotations: dict[str, str], shape: str
) -> None:
    """For bodies of every shape (the names last as kube-scheduler writes them, first, given twice, a
    NodeList, spaces, NodeNames not a list, a body cut short), twice each (the second read finds the
    list kept): the candidates and the pod are those of the whole body decoded, and a bad list or body
    is left to `read_candidates` / the decoder to name."""
    annotations = {**annotations, "x": ',"NodeNames":["evil"]}'}
    the_pod = {"metadata": {"name": "p", "annotations": annotations}}
    if shape == "last":
        body = orjson.dumps({"Pod": the_pod, "Nodes": None, "NodeNames": names})
    elif shape == "first":
        body = orjson.dumps({"NodeNames": names, "Pod": the_pod})
    elif shape == "twice":
        body = (
            b'{"Pod":'
            + orjson.dumps(the_pod)
            + b',"NodeNames":["n9"],"NodeNames":'
            + orjson.dumps(names)
            + b"}"
        )
    elif shape == "nodes":
        items = [{"metadata": {"name": n}} for n in names]
        body = orjson.dumps({"Pod": the_pod, "Nodes": {"items": items}, "NodeNames": None})
    elif shape == "spaced":
        body = orjson.dumps({"Pod": the_pod, "NodeNames": names}).replace(b",", b", ")
    elif shape == "not a list":
        body = orjson.dumps({"Pod": the_pod, "NodeNames": {"n": names}})
    else:
        body = orjson.dumps({"Pod": the_pod, "NodeNames": names})[:-3] + b"]}"
    lists = CandidateLists(size=2)
    for _ in range(2):
        try:
            whole = orjson.loads(body)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                lists.read(body)
            continue
        args, read = lists.read(body)
        assert args.get("Pod") == whole.get("Pod")
        try:
            expected = read_candidates(whole)
        except ExtenderArgsError as err:
            assert read is None
            with pytest.raises(ExtenderArgsError) as caught:
                read_candidates(args)
            assert str(caught.value) == str(err)
            continue
        got = read if read is not None else read_candidates(args)
        assert got == expected
        if read is not None and read.names_json is not None:
            assert orjson.loads(read.names_json) == list(expected.names)


def test_change_log_lists_each_row_written_removed_or_touched_and_gives_up_past_its_length() -> None:
    table = GPUTable()
    gpus = [gpu_info(0, id="g", count=2, devmem=1000, type="T", mode="")]
    for i in range(3):
        table.set_node(NodeGPUs.of(f"n{i}", gpus))
    start = table.version
    table.touch(["n2", "ghost"])
    table.remove_node("n0")
    table.set_node(NodeGPUs.of("n1", gpus))
    changed = table.changed_since(start)
    assert changed is not None and changed.tolist() == [0, 1, 2]
    assert table.changed_since(table.version) is not None and len(table.changed_since(table.version)) == 0
    for _ in range(5000):
        table.touch(["n1"])
    assert table.changed_since(start) is None
    assert table.changed_since(table.version - 10) is not None


QUANTITIES = st.sampled_from(("1", "2", "0", "8000", "16Gi", "1.5", "-1", "x", "", 3, 2.5, None, True))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(("limits", "requests", "claims")),
        st.dictionaries(
            st.sampled_from(("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "cpu")),
            QUANTITIES,
            max_size=4,
        )
        | st.just([1]),
        max_size=3,
    )
    | st.just("not resources"),
    st.booleans(),
)
def test_the_pod_stores_kept_container_requests_equal_reading_each_container(
    resources: Any, init: bool
) -> None:
    """The pods watch's requests kept by the container's resources (`pod_store._container_request`),
    read twice (the second time kept), equal `container_request` of the container, errors included."""
    c = {"name": "c", "resources": resources}
    names, defaults = CONFIG.requests.names, CONFIG.requests.defaults
    try:
        expected: Any = container_request(c, names, defaults, init)
    except (RequestError, WireFormatError, QuantityError) as err:
        expected = (type(err), str(err))
    for _ in range(2):
        try:
            got: Any = _container_request(c, names, defaults, init)
        except (RequestError, WireFormatError, QuantityError) as err:
            got = (type(err), str(err))
        assert got == expected


CONTAINER_SPECS = st.sampled_from(
    (
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}},
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "4"}}},
        {"name": "b", "resources": {"limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000"}}},
        {"name": "c", "resources": {"limits": {"cambricon.com/vmlu": "1", "nvidia.com/gpu": "1"}}},
        {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "d", "resources": {"limits": {"nvidia.com/gpu": "x"}}},
        {"name": "e", "resources": "not resources"},
        {"name": "f"},
        "not a container",
    )
)


@st.composite
def watched_pods(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """A pod the watch may show: containers from a few shapes (pods of one workload repeat theirs), some
    malformed, init containers and sidecars among them, with or without its allocation annotations."""
    inits = draw(st.lists(CONTAINER_SPECS, max_size=2))
    regular = draw(st.lists(CONTAINER_SPECS, max_size=3))
    obj = pod(f"p{index}", *(c for c in regular if isinstance(c, dict)), uid=f"u{index}", init=[])
    spec: Any = obj["spec"]
    spec["containers"] = regular
    if inits:
        spec["initContainers"] = inits
    if draw(st.integers(0, 9)) == 0:
        obj["spec"] = draw(st.sampled_from([None, "not a spec", {}]))
    if draw(st.booleans()):
        obj["metadata"]["annotations"] = {
            "hami.io/vgpu-node": "n1",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,8000,0:;",
        }
    return obj


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_pod_stores_kept_containers_give_the_records_reading_each_pod_gives(data: st.DataObject) -> None:
    """The pods watch's containers kept by their JSON (`pod_store._pod_containers`: the requests, kinds,
    sidecars and whether another vendor is named) give every pod of a list the record reading it afresh
    gives."""
    from hami_control import pod_store

    pods = [data.draw(watched_pods(i)) for i in range(data.draw(st.integers(1, 12)))]
    pod_store._vendors_read.clear()
    kept = [pod_store.pod_record(obj, CONFIG) for obj in pods]
    fresh = []
    for obj in pods:
        pod_store._vendors_read.clear()  # a fresh table: nothing kept
        fresh.append(pod_store.pod_record(obj, CONFIG))
    assert kept == fresh


_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@given(
    names=st.lists(_NAMES, min_size=1, max_size=40, unique=True),
    data=st.data(),
)
def test_host_priorities_written_from_the_padded_keys_decode_to_the_list_in_order(
    names: list[str], data: st.DataObject
) -> None:
    table = GPUTable()
    for name in names:
        table.set_node(node_gpus(gpu_info(0, id=f"{name}-g0"), name=name))
    # any subset in any order, some names twice, some not in the table
    hosts = data.draw(st.lists(st.sampled_from([*names, "not-a-node"]), max_size=60))
    scores = data.draw(st.lists(st.integers(0, MAX_SCORE), min_size=len(hosts), max_size=len(hosts)))
    rows = table.rows(hosts)
    answer = PrioritizeAnswer(hosts, np.array(scores, dtype=np.int64), rows, table)
    expected = [{"Host": h, "Score": v} for h, v in zip(hosts, scores, strict=True)]
    assert orjson.loads(answer.as_json()) == expected
    known = rows[rows >= 0]
    written = table.priorities_json(known, np.array(scores, dtype=np.int64)[rows >= 0])
    if written is not None:  # padded: one array copy (names alike in length)
        kept = [e for e, row in zip(expected, rows.tolist(), strict=True) if row >= 0]
        assert orjson.loads(written) == kept
