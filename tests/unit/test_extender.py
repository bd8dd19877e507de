"""hami_control.extender: /filter and /prioritize request -> response logic (both input forms,
pass-through, reasons, unresolvable and unregistered nodes, policy overrides, bad input, scores)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.types import GPUInfo, GPUPolicy, GPUSlice, NodePolicy
from hami_control.config import ControlConfig
from hami_control.extender import (
    NEUTRAL_SCORE,
    ExtenderArgsError,
    filter_pod,
    prioritize_pod,
    read_candidates,
    read_pod_ask,
)
from hami_control.fit import Fit
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.usage import NodeGPUs, with_slices
from tests.builders import FixedQuota, Json, container, gpu_info, node, node_gpus, pod

CONFIG = ControlConfig()
RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


# --- builders ---------------------------------------------------------------------------------------------


def node_gpu(node: str, index: int, **fields: Any) -> GPUInfo:
    """GPU `index` of node `node`, named `<node>-GPU-<index>`; `fields` are `gpu_info`'s."""
    return gpu_info(index, id=f"{node}-GPU-{index}", **fields)


def node_view(name: str, gpus: int = 2, used_mem: Sequence[int] = ()) -> NodeGPUs:
    """A node of `gpus` GPUs; `used_mem[i]` MiB already placed (one slice) on GPU i."""
    slices = [GPUSlice(f"{name}-GPU-{i}", mem, 0) for i, mem in enumerate(used_mem) if mem]
    return node_gpus(*(node_gpu(name, i) for i in range(gpus)), name=name, slices=slices)


@dataclass
class View:
    nodes: dict[str, NodeGPUs] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def node_gpus(self, name: str) -> NodeGPUs | None:
        self.asked.append(name)
        return self.nodes.get(name)

    def unregistered_reason(self, name: str) -> str | None:
        return self.reasons.get(name)


def view(*nodes: NodeGPUs, reasons: Mapping[str, str] | None = None) -> View:
    return View({n.name: n for n in nodes}, dict(reasons or {}))


def gpu_container(name: str = "c", gpus: int | None = 1, mem: Any = None, cores: Any = None) -> Json:
    """A container asking for `gpus` GPUs (one unless told), `mem` MiB and `cores` % of each."""
    return container(name, gpus=gpus, gpumem=mem, gpucores=cores)


def ns_pod(*containers: Json, annotations: Mapping[str, str] | None = None) -> Json:
    """The pod `ns/p` (uid `u-1`) of `containers`, with `annotations` when any."""
    return pod("p", *containers, namespace="ns", uid="u-1", annotations=annotations or None)


def plain_pod() -> Json:
    return ns_pod(container("c", limits={"cpu": "1"}))


def names_args(p: Any, names: Sequence[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": list(names)}


def node_object(name: str) -> Json:
    """A candidate Node as kube-scheduler sends it: its name, and its hostname label."""
    return node(name, labels={"kubernetes.io/hostname": name}, ready=None)


def nodes_args(p: Any, names: Sequence[str]) -> dict[str, Any]:
    items = [node_object(n) for n in names]
    return {"Pod": p, "Nodes": {"metadata": {"resourceVersion": "7"}, "items": items}, "NodeNames": None}


def scores(result: list[dict[str, Any]]) -> dict[str, int]:
    return {entry["Host"]: entry["Score"] for entry in result}


# --- the two input forms ----------------------------------------------------------------------------------


def test_names_form_returns_fitting_names_and_reasons() -> None:
    v = view(node_view("a"), node_view("b", used_mem=(15000, 15000)), node_view("c"))
    result = filter_pod(names_args(ns_pod(gpu_container(mem=4000)), ["a", "b", "c"]), v, CONFIG)
    assert set(result) == RESULT_KEYS
    assert result["NodeNames"] == ["a", "c"]
    assert result["Nodes"] is None
    assert result["FailedNodes"] == {"b": "2/2 CardInsufficientMemory"}
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"] == ""


def test_nodes_form_returns_the_fitting_node_objects() -> None:
    v = view(node_view("a"), node_view("b", used_mem=(15000, 15000)), node_view("c"))
    args = nodes_args(ns_pod(gpu_container(mem=4000)), ["a", "b", "c"])
    before = copy.deepcopy(args)
    result = filter_pod(args, v, CONFIG)
    assert result["NodeNames"] is None
    assert result["Nodes"] == {
        "metadata": {"resourceVersion": "7"},
        "items": [node_object("a"), node_object("c")],
    }
    assert result["FailedNodes"] == {"b": "2/2 CardInsufficientMemory"}
    assert args == before  # the request is not modified


def test_names_win_when_both_forms_are_given() -> None:
    args = nodes_args(ns_pod(gpu_container()), ["a"])
    args["NodeNames"] = ["b"]
    result = filter_pod(args, view(node_view("a"), node_view("b")), CONFIG)
    assert result["NodeNames"] == ["b"] and result["Nodes"] is None


def test_empty_candidates() -> None:
    assert filter_pod(names_args(ns_pod(gpu_container()), []), view(), CONFIG)["NodeNames"] == []
    result = filter_pod({"Pod": ns_pod(gpu_container()), "Nodes": {"items": None}}, view(), CONFIG)
    assert result["Nodes"] == {"items": []}
    assert prioritize_pod(names_args(ns_pod(gpu_container()), []), view(), CONFIG) == []


# --- pass-through -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        plain_pod(),
        ns_pod(gpu_container(gpus=0)),  # a GPU resource, but no GPU count
        ns_pod(gpu_container(gpus=None, mem=1000)),  # gpumem without a count (the webhook did not run)
        {"metadata": {"name": "bare"}},  # no spec at all
    ],
    ids=["no-hami-resource", "zero-gpus", "mem-without-count", "no-spec"],
)
def test_pods_without_gpu_request_pass_through(p: dict[str, Any]) -> None:
    v = view(node_view("a", used_mem=(16000, 16000)))  # full, and "b" is unregistered
    result = filter_pod(names_args(p, ["a", "b"]), v, CONFIG)
    assert result == {
        "Nodes": None,
        "NodeNames": ["a", "b"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    full = filter_pod(nodes_args(p, ["a", "b"]), v, CONFIG)
    assert full["Nodes"]["items"] == [node_object("a"), node_object("b")]
    assert v.asked == []  # the view is not even read
    assert prioritize_pod(names_args(p, ["a", "b"]), v, CONFIG) == [
        {"Host": "a", "Score": NEUTRAL_SCORE},
        {"Host": "b", "Score": NEUTRAL_SCORE},
    ]


# --- every fitting node, reasons --------------------------------------------------------------------------


def test_every_fitting_node_is_returned() -> None:
    nodes = [node_view(f"n{i}", gpus=8, used_mem=[500 * i] * 8) for i in range(20)]
    names = [n.name for n in nodes]
    result = filter_pod(names_args(ns_pod(gpu_container(mem=2000)), names), view(*nodes), CONFIG)
    assert result["NodeNames"] == names
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


def test_reasons_carry_counts_in_hami_text_order() -> None:
    gpus = [node_gpu("x", i, type="NVIDIA-A100-SXM4-80GB") for i in range(5)]
    gpus += [node_gpu("x", i, type="NVIDIA-Tesla T4") for i in range(5, 8)]
    node = with_slices(NodeGPUs.of("x", gpus), [GPUSlice(f"x-GPU-{i}", 15000, 0) for i in range(5, 8)])
    p = ns_pod(gpu_container(mem=4000), annotations={"nvidia.com/use-gputype": "t4"})
    result = filter_pod(names_args(p, ["x"]), view(node), CONFIG)
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"x": "3/8 CardInsufficientMemory, 5/8 CardTypeMismatch"}
    assert result["FailedAndUnresolvableNodes"] == {}


def test_reasons_ties_in_name_order_and_other_rules() -> None:
    node = NodeGPUs.of(
        "y",
        [node_gpu("y", 0, health=False), node_gpu("y", 1), node_gpu("y", 2, count=1), node_gpu("y", 3)],
        cordoned=["y-GPU-1"],
    )
    node = with_slices(node, [GPUSlice("y-GPU-2", 10, 0), GPUSlice("y-GPU-3", 0, 50)])
    result = filter_pod(names_args(ns_pod(gpu_container(mem=1000, cores=60)), ["y"]), view(node), CONFIG)
    assert result["FailedNodes"] == {
        "y": "1/4 CardCordoned, 1/4 CardInsufficientCore, 1/4 CardNotHealth, 1/4 CardTimeSlicingExhausted"
    }


def test_multi_container_pod_reports_the_container_that_does_not_fit() -> None:
    # two containers of one GPU each, 12 GB: the second finds only the already-taken GPU's remainder
    node = node_view("z", gpus=1)
    p = ns_pod(gpu_container("a", mem=12000), gpu_container("b", mem=12000))
    result = filter_pod(names_args(p, ["z"]), view(node), CONFIG)
    assert result["FailedNodes"] == {"z": "1/1 CardInsufficientMemory"}


# --- unresolvable and unregistered ------------------------------------------------------------------------


def test_nodes_that_can_never_fit_are_unresolvable() -> None:
    small = node_view("small", gpus=2)
    wrong = node_view("wrong", gpus=4)
    busy = node_view("busy", gpus=4, used_mem=(16000, 16000, 16000, 16000))
    p = ns_pod(gpu_container(gpus=3, mem=1000), annotations={"nvidia.com/nouse-gputype": "A100"})
    a100 = NodeGPUs.of("a100", [node_gpu("a100", i, type="NVIDIA-A100") for i in range(4)])
    v = view(small, wrong, busy, a100)
    result = filter_pod(names_args(p, ["small", "wrong", "busy", "a100"]), v, CONFIG)
    assert result["NodeNames"] == ["wrong"]
    assert result["FailedAndUnresolvableNodes"] == {
        "small": "NodeInsufficientDevice",  # HAMi checks the GPU count before Fit: no counts
        "a100": "4/4 CardTypeMismatch",
    }
    assert result["FailedNodes"] == {"busy": "4/4 CardInsufficientMemory"}  # eviction can help here


def test_unregistered_nodes() -> None:
    v = view(node_view("a"), reasons={"b": "hami.io/node-nvidia-register: device 0: 'x' is not JSON"})
    result = filter_pod(names_args(ns_pod(gpu_container()), ["a", "b", "c"]), v, CONFIG)
    assert result["NodeNames"] == ["a"]
    assert result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {
        "b": "node unregistered: hami.io/node-nvidia-register: device 0: 'x' is not JSON",
        "c": "node unregistered: not in the scheduler's cache",
    }


def test_node_without_gpus_is_unresolvable() -> None:
    result = filter_pod(names_args(ns_pod(gpu_container()), ["cpu"]), view(NodeGPUs("cpu")), CONFIG)
    assert result["FailedAndUnresolvableNodes"] == {"cpu": "NodeInsufficientDevice"}


# --- policies and quota -----------------------------------------------------------------------------------


def test_gpu_policy_annotation_overrides_config() -> None:
    node = node_view("a", gpus=2, used_mem=(1000, 1000))
    plain = ns_pod(gpu_container(mem=1000))
    mutex = ns_pod(gpu_container(mem=1000), annotations={"hami.io/gpu-scheduler-policy": "mutex"})
    assert filter_pod(names_args(plain, ["a"]), view(node), CONFIG)["NodeNames"] == ["a"]
    result = filter_pod(names_args(mutex, ["a"]), view(node), CONFIG)
    assert result["FailedNodes"] == {"a": "2/2 ExclusiveDeviceAllocateConflict"}


@pytest.mark.parametrize("blank", ["", "  "])
def test_empty_policy_annotations_mean_the_configured_defaults(blank: str) -> None:
    config = CONFIG.with_settings(
        gpu_scheduler_policy=(GPUPolicy.BINPACK,), node_scheduler_policy=NodePolicy.SPREAD
    )
    annotations = {"hami.io/gpu-scheduler-policy": blank, "hami.io/node-scheduler-policy": blank}
    ask = read_pod_ask(ns_pod(gpu_container(mem=1000), annotations=annotations), config)
    assert ask is not None
    assert (ask.gpu_policy, ask.node_policy) == ((GPUPolicy.BINPACK,), NodePolicy.SPREAD)
    # and the GPU chosen is the binpack one (the busier GPU), as with no annotation at all
    node = node_view("a", gpus=2, used_mem=(0, 4000))
    fit = ask.fit(node)
    assert isinstance(fit, Fit) and fit.allocation.containers[0].uuids == ("a-GPU-1",)


def test_device_selector_uuid() -> None:
    p = ns_pod(gpu_container(), annotations={"nvidia.com/use-gpuuuid": "b-GPU-1"})
    result = filter_pod(names_args(p, ["a", "b"]), view(node_view("a"), node_view("b")), CONFIG)
    assert result["NodeNames"] == ["b"]
    assert result["FailedAndUnresolvableNodes"] == {"a": "2/2 CardUuidMismatch"}


def test_quota_is_checked_per_gpu_and_can_be_switched_off() -> None:
    quota = FixedQuota(QuotaLimits(memory=3000), QuotaUsage(memory=2000))
    v = view(node_view("a"))
    args = names_args(ns_pod(gpu_container(mem=2000)), ["a"])
    result = filter_pod(args, v, CONFIG, quota)
    assert result["FailedNodes"] == {"a": "2/2 ResourceQuotaNotFit"}
    assert filter_pod(args, v, CONFIG.with_settings(enforce_quota=False), quota)["NodeNames"] == ["a"]
    assert filter_pod(args, v, CONFIG, FixedQuota(QuotaLimits(memory=4000), QuotaUsage(memory=2000)))[
        "NodeNames"
    ] == ["a"]
    assert filter_pod(args, v, CONFIG, FixedQuota(QuotaLimits()))["NodeNames"] == ["a"]
    cores = FixedQuota(QuotaLimits(cores=100), QuotaUsage(cores=80))
    assert filter_pod(names_args(ns_pod(gpu_container(cores=30)), ["a"]), v, CONFIG, cores)[
        "FailedNodes"
    ] == {"a": "2/2 ResourceQuotaNotFit"}


def test_quota_failure_text_is_hamis_for_its_resource_quota_test() -> None:
    # HAMi scheduler_test.go Test_ResourceQuota, "multi device Resourcequota deny": GPUs of 2000, 8000,
    # 4000 and 6000 MiB, a pod of 2 x 3000 MiB / 60 cores, a quota of 4000 MiB and 200 cores.
    node = NodeGPUs.of(
        "node1", [node_gpu("node1", i, devmem=m) for i, m in enumerate((2000, 8000, 4000, 6000))]
    )
    quota = FixedQuota(QuotaLimits(memory=4000, cores=200))
    result = filter_pod(
        names_args(ns_pod(gpu_container(gpus=2, mem=3000, cores=60)), ["node1"]), view(node), CONFIG, quota
    )
    assert result["FailedNodes"] == {
        "node1": "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"
    }
    passing = filter_pod(
        names_args(ns_pod(gpu_container(gpus=2, mem=2000, cores=100)), ["node1"]), view(node), CONFIG, quota
    )
    assert passing["NodeNames"] == ["node1"]


# --- prioritize -------------------------------------------------------------------------------------------


def busy_nodes() -> View:
    return view(
        node_view("idle", gpus=2),
        node_view("half", gpus=2, used_mem=(8000, 8000)),
        node_view("full", gpus=2, used_mem=(16000, 16000)),
        node_view("most", gpus=2, used_mem=(14000, 12000)),
    )


def test_prioritize_binpack_prefers_busy_nodes() -> None:
    result = prioritize_pod(
        names_args(ns_pod(gpu_container(mem=2000)), ["idle", "half", "most", "full", "gone"]),
        busy_nodes(),
        CONFIG,
    )
    s = scores(result)
    assert [e["Host"] for e in result] == ["idle", "half", "most", "full", "gone"]
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in s.values())
    assert s["most"] > s["half"] > s["idle"]
    assert s["full"] == 0 and s["gone"] == 0  # does not fit, unregistered


def test_prioritize_spread_by_config_and_by_annotation() -> None:
    args = names_args(ns_pod(gpu_container(mem=2000)), ["idle", "half", "most"])
    spread_config = CONFIG.with_settings(node_scheduler_policy=NodePolicy.SPREAD)
    s = scores(prioritize_pod(args, busy_nodes(), spread_config))
    assert s["idle"] > s["half"] > s["most"]
    assert all(0 <= v <= 10 for v in s.values())
    annotated = ns_pod(gpu_container(mem=2000), annotations={"hami.io/node-scheduler-policy": "spread"})
    assert scores(prioritize_pod(names_args(annotated, ["idle", "half", "most"]), busy_nodes(), CONFIG)) == s
    back = ns_pod(gpu_container(mem=2000), annotations={"hami.io/node-scheduler-policy": "binpack"})
    binpack = scores(prioritize_pod(names_args(back, ["idle", "half", "most"]), busy_nodes(), spread_config))
    assert binpack["most"] > binpack["half"] > binpack["idle"]


def test_prioritize_counts_the_pod_itself() -> None:
    # an idle node scores above 0 under binpack once the pod's own slice is placed
    s = scores(
        prioritize_pod(
            names_args(ns_pod(gpu_container(mem=16000, cores=100)), ["idle"]), busy_nodes(), CONFIG
        )
    )
    assert s["idle"] > 0


def test_prioritize_both_forms_and_duplicates() -> None:
    p = ns_pod(gpu_container(mem=2000))
    by_names = prioritize_pod(names_args(p, ["half", "idle", "half"]), busy_nodes(), CONFIG)
    by_nodes = prioritize_pod(nodes_args(p, ["half", "idle", "half"]), busy_nodes(), CONFIG)
    assert by_names == by_nodes
    assert [e["Host"] for e in by_names] == ["half", "idle"]


def test_prioritize_bad_input() -> None:
    assert prioritize_pod([], busy_nodes(), CONFIG) == []
    assert prioritize_pod({"Pod": ns_pod(gpu_container())}, busy_nodes(), CONFIG) == []
    bad = ns_pod(gpu_container(mem="1.5"))
    assert prioritize_pod(names_args(bad, ["idle", "half"]), busy_nodes(), CONFIG) == [
        {"Host": "idle", "Score": 0},
        {"Host": "half", "Score": 0},
    ]


# --- bad input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "ExtenderArgs: expected a JSON object, got a list"),
        ("x", "ExtenderArgs: expected a JSON object, got a string"),
        (None, "ExtenderArgs: expected a JSON object, got null"),
        ({"NodeNames": ["a"]}, "ExtenderArgs.Pod: missing"),
        ({"Pod": [], "NodeNames": ["a"]}, "ExtenderArgs.Pod: expected a Pod object, got a list"),
        ({"Pod": {}, "Nodes": None, "NodeNames": None}, "ExtenderArgs: neither Nodes nor NodeNames is given"),
        (
            {"Pod": {}, "NodeNames": "a"},
            "ExtenderArgs.NodeNames: expected a list of node names, got a string",
        ),
        ({"Pod": {}, "NodeNames": ["a", 5]}, "ExtenderArgs.NodeNames[1]: expected a node name, got 5"),
        ({"Pod": {}, "NodeNames": [""]}, "ExtenderArgs.NodeNames[0]: expected a node name, got ''"),
        ({"Pod": {}, "Nodes": []}, "ExtenderArgs.Nodes: expected a NodeList object, got a list"),
        (
            {"Pod": {}, "Nodes": {"items": {}}},
            "ExtenderArgs.Nodes.items: expected a list of Nodes, got an object",
        ),
        (
            {"Pod": {}, "Nodes": {"items": [{}]}},
            "ExtenderArgs.Nodes.items[0].metadata: expected an object, got null",
        ),
        (
            {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 3}}]}},
            "ExtenderArgs.Nodes.items[0].metadata.name: expected a node name, got 3",
        ),
        (
            names_args({"metadata": {"annotations": {"a": 1}}}, ["a"]),
            "Pod.metadata.annotations['a']: expected a string, got 1",
        ),
        (names_args({"metadata": "x"}, ["a"]), "Pod.metadata: expected an object, got a string"),
        (
            names_args({"metadata": {"namespace": 1}}, ["a"]),
            "Pod.metadata.namespace: expected a string, got 1",
        ),
        (
            names_args(ns_pod(gpu_container(mem="1.5")), ["a"]),
            "pod ns/p: container 'c': nvidia.com/gpumem '1.5' must be a whole number",
        ),
        (
            names_args(ns_pod(gpu_container(mem="lots")), ["a"]),
            "pod ns/p: container 'c': nvidia.com/gpumem 'lots' is not a quantity",
        ),
        (
            names_args({"metadata": {"name": "q"}, "spec": {"containers": {}}}, ["a"]),
            "pod default/q: container '?': spec.containers '{}' is not a list",
        ),
        (
            names_args(
                ns_pod(gpu_container(), annotations={"hami.io/gpu-scheduler-policy": "fastest"}), ["a"]
            ),
            "pod ns/p: hami.io/gpu-scheduler-policy: part 0: 'fastest' is not one of",
        ),
        (
            names_args(
                ns_pod(gpu_container(), annotations={"hami.io/node-scheduler-policy": "fastest"}), ["a"]
            ),
            "pod ns/p: hami.io/node-scheduler-policy",
        ),
        (
            names_args(
                ns_pod(gpu_container(), annotations={"hami.io/device-scoring-weights": "slot=1"}), ["a"]
            ),
            "pod ns/p: hami.io/device-scoring-weights",
        ),
        (
            names_args(ns_pod(gpu_container(), annotations={"nvidia.com/numa-bind": "maybe"}), ["a"]),
            "pod ns/p: nvidia.com/numa-bind",
        ),
    ],
)
def test_bad_input_comes_back_in_error(args: Any, message: str) -> None:
    v = view(node_view("a"))
    result = filter_pod(args, v, CONFIG)
    assert set(result) == RESULT_KEYS
    assert result["Error"].startswith(message), result["Error"]
    assert result["Nodes"] is None and result["NodeNames"] is None
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


def test_readers_raise_extender_args_error() -> None:
    with pytest.raises(ExtenderArgsError, match="NodeNames"):
        read_candidates({"NodeNames": 1})
    with pytest.raises(ExtenderArgsError, match="gpumem"):
        read_pod_ask(ns_pod(gpu_container(mem="-1")), CONFIG)
    assert read_pod_ask(plain_pod(), CONFIG) is None
    ask = read_pod_ask(
        ns_pod(gpu_container(mem=1000), annotations={"hami.io/node-scheduler-policy": "spread"}), CONFIG
    )
    assert ask is not None and ask.node_policy is NodePolicy.SPREAD and ask.namespace == "ns"


def test_pod_is_read_once_per_request() -> None:
    # per node, only the view is consulted: the cost of the pod's parsing does not grow with the nodes
    nodes = [node_view(f"n{i}") for i in range(50)]
    v = view(*nodes)
    result = filter_pod(names_args(ns_pod(gpu_container(mem=100)), [n.name for n in nodes]), v, CONFIG)
    assert len(result["NodeNames"]) == 50
    assert v.asked == [n.name for n in nodes]


# --- never raises -----------------------------------------------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
quantities = (
    st.sampled_from(["1", "2", "0", "-1", "1.5", "100m", "4000", "1Gi", "x", "", "101", "150"]) | json_scalars
)
resource_names = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "cpu"]
)
containers = st.fixed_dictionaries(
    {"name": st.text(max_size=4) | json_scalars},
    optional={
        "resources": st.fixed_dictionaries(
            {}, optional={"limits": st.dictionaries(resource_names, quantities, max_size=4) | json_values}
        )
        | json_values
    },
)
annotation_values = st.sampled_from(
    [
        "binpack",
        "spread",
        "mutex",
        "numa,binpack",
        "topology-aware",
        "bad",
        "slot=1,core=0,memory=2",
        "true",
        "T4",
    ]
) | st.text(max_size=6)
annotation_maps: st.SearchStrategy[Any] = (
    st.dictionaries(
        st.sampled_from(
            [
                "hami.io/gpu-scheduler-policy",
                "hami.io/node-scheduler-policy",
                "hami.io/device-scoring-weights",
                "nvidia.com/use-gputype",
                "nvidia.com/nouse-gpuuuid",
                "nvidia.com/numa-bind",
                "nvidia.com/vgpu-mode",
            ]
        ),
        annotation_values,
        max_size=3,
    )
    | json_values
)
_metadata_fields: dict[str, st.SearchStrategy[Any]] = {"name": json_scalars, "annotations": annotation_maps}
pods = (
    st.fixed_dictionaries(
        {},
        optional={
            "metadata": st.fixed_dictionaries({}, optional=_metadata_fields) | json_values,
            "spec": st.fixed_dictionaries(
                {},
                optional={
                    "containers": st.lists(containers, max_size=3),
                    "initContainers": st.lists(containers, max_size=2),
                },
            )
            | json_values,
        },
    )
    | json_values
)
node_names = st.sampled_from(["a", "b", "c", "gone"]) | json_scalars
args_strategy = (
    st.fixed_dictionaries(
        {},
        optional={
            "Pod": pods,
            "NodeNames": st.lists(node_names, max_size=4) | json_values,
            "Nodes": st.fixed_dictionaries(
                {},
                optional={
                    "items": st.lists(
                        st.builds(node_object, st.sampled_from(["a", "b", "c", "gone"])) | json_values,
                        max_size=3,
                    )
                },
            )
            | json_values,
        },
    )
    | json_values
)
gpu_containers = st.builds(
    gpu_container,
    gpus=st.integers(0, 5),
    mem=st.none() | st.integers(0, 20000) | st.sampled_from(["1.5", "1Gi", "x"]),
    cores=st.none() | st.integers(0, 120),
)
gpu_pods = st.builds(
    lambda cs, ann: ns_pod(*cs, annotations=ann),
    st.lists(gpu_containers, min_size=1, max_size=3),
    st.dictionaries(
        st.sampled_from(
            ["hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy", "nvidia.com/use-gputype"]
        ),
        st.sampled_from(
            ["binpack", "spread", "mutex", "numa,binpack", "topology-aware", "T4", "A100", "bad"]
        ),
        max_size=2,
    ),
)
candidate_lists = st.lists(st.sampled_from(["a", "b", "c", "gone"]), max_size=5)
gpu_args = st.builds(names_args, gpu_pods, candidate_lists) | st.builds(nodes_args, gpu_pods, candidate_lists)


@settings(max_examples=400, deadline=None)
@given(args_strategy | gpu_args)
def test_random_args_never_raise(args: Any) -> None:
    v = view(node_view("a", gpus=4, used_mem=(1000, 15000)), node_view("b", gpus=1), NodeGPUs("c"))
    quota = FixedQuota(QuotaLimits(memory=20000, cores=300), QuotaUsage(memory=1000))
    result = filter_pod(args, v, CONFIG, quota)
    assert set(result) == RESULT_KEYS
    assert isinstance(result["Error"], str)
    if not result["Error"]:
        assert (result["Nodes"] is None) != (result["NodeNames"] is None)
        failed, unresolvable = set(result["FailedNodes"]), set(result["FailedAndUnresolvableNodes"])
        assert not failed & unresolvable
        if result["NodeNames"] is not None:
            returned = set(result["NodeNames"])
        else:
            returned = {item["metadata"]["name"] for item in result["Nodes"]["items"]}
        assert not returned & (failed | unresolvable)
        assert returned | failed | unresolvable == set(read_candidates(args).names)
    priorities = prioritize_pod(args, v, CONFIG, quota)
    assert all(isinstance(p["Score"], int) and 0 <= p["Score"] <= 10 for p in priorities)
