"""Fuzzing ExtenderArgs and ExtenderBindingArgs as hami-control reads them (hami_control.extender
read_candidates/read_pod_ask, hami_control.binder read_binding_args): any decoded JSON gives the
candidates, the pod's ask and the binding, or ExtenderArgsError naming the field; never another
exception. tests/unit/test_extender.py fuzzes filter_pod with plausible pods; these are hostile."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_control.binder import read_binding_args
from hami_control.config import ControlConfig, ServerSettings
from hami_control.extender import ExtenderArgsError, read_candidates, read_pod_ask
from tests.fuzz.strategies import (
    fuzz_settings,
    json_values,
    mostly,
    pod_objects,
    texts,
)

CONFIG = ControlConfig(server=ServerSettings(insecure_http=True))
DEEP = orjson.loads(b"[" * 1000 + b"]" * 1000)  # orjson reads 1,024 levels; repr() stops near 1,000
_value = json_values(leaves=5)
_names = st.lists(mostly(st.sampled_from(["node-a", "node-b", "gpu-1"]), texts | _value), max_size=5)
_node = st.fixed_dictionaries(
    {
        "metadata": mostly(
            st.fixed_dictionaries({"name": mostly(st.sampled_from(["n1", "n2"]), _value)}), _value
        )
    },
    optional={"status": _value, "spec": _value},
)
_nodes = (
    st.fixed_dictionaries({"items": mostly(st.lists(mostly(_node, _value), max_size=3), _value)}) | _value
)
extender_args = (
    st.fixed_dictionaries(
        {},
        optional={
            "Pod": mostly(pod_objects, _value),
            "NodeNames": mostly(_names, _value),
            "Nodes": _nodes,
        },
    )
    | _value
)
binding_args = (
    st.fixed_dictionaries(
        {},
        optional={
            key: mostly(st.sampled_from(good), texts | _value)
            for key, good in (
                ("PodNamespace", ["default", "ai-team"]),
                ("PodName", ["p", "train-0"]),
                ("PodUID", ["705ab4f5-6393-11e8-b7cc-42010a800002"]),
                ("Node", ["node-a", "Node_A", "node-a "]),
            )
        },
    )
    | _value
)


@fuzz_settings
@given(extender_args)
def test_any_extender_args_give_candidates_and_an_ask_or_a_clear_error(args: Any) -> None:
    before = copy.deepcopy(args)
    check_extender_args(args)
    assert args == before


def check_extender_args(args: Any) -> None:
    try:
        candidates = read_candidates(args)
    except ExtenderArgsError as err:
        assert str(err).startswith("ExtenderArgs")
    else:
        assert all(isinstance(name, str) and name for name in candidates.names)
        if candidates.node_list is not None:
            assert len(candidates.items) == len(candidates.names)
    try:
        ask = read_pod_ask(args.get("Pod") if isinstance(args, dict) else args, CONFIG)
    except ExtenderArgsError as err:
        assert str(err)
    else:
        assert ask is None or ask.requests


@fuzz_settings
@given(binding_args)
def test_any_binding_args_give_a_binding_or_an_error_naming_the_field(args: Any) -> None:
    check_binding_args(args)


def check_binding_args(args: Any) -> None:
    try:
        binding = read_binding_args(args)
    except ExtenderArgsError as err:
        assert str(err).startswith("ExtenderBindingArgs")
        assert "Traceback" not in str(err)
    else:
        assert binding.node == args["Node"] and binding.namespace == args["PodNamespace"]
        assert binding.name and binding.uid


# Regressions, pinned here rather than as @example: hypothesis cannot print a value this deep.
# _shown() took repr() of the bad value, and repr() of JSON nested ~1,000 levels (orjson reads 1,024)
# raised RecursionError instead of ExtenderArgsError.
@pytest.mark.parametrize(
    "args",
    [
        {"NodeNames": [DEEP]},
        {"Nodes": {"items": [{"metadata": {"name": DEEP}}]}},
        {"Pod": {"metadata": {"name": DEEP}, "spec": {"containers": [DEEP]}}},
    ],
    ids=["node-name", "node-object-name", "pod"],
)
def test_extender_args_nested_past_the_recursion_limit_are_refused_by_name(args: Any) -> None:
    check_extender_args(args)


@pytest.mark.parametrize("key", ["PodNamespace", "PodName", "PodUID", "Node"])
def test_binding_args_nested_past_the_recursion_limit_are_refused_by_name(key: str) -> None:
    args = {"PodNamespace": "d", "PodName": "p", "PodUID": "u", "Node": "n", key: DEEP}
    with pytest.raises(ExtenderArgsError, match=f"ExtenderBindingArgs.{key}: expected"):
        read_binding_args(args)
