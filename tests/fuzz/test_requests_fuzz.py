"""Fuzzing resource requests: hami_api.quantity (any text or JSON number is a quantity or QuantityError)
and hami_api.resources (any pod object gives its GPU requests or a RequestError naming the container,
the resource and the value). tests/unit/test_quantity.py and test_resources.py hold the examples."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hami_api.errors import QuantityError, RequestError
from hami_api.quantity import canonical_quantity, parse_quantity, quantity_int, quantity_value
from hami_api.resources import (
    RequestDefaults,
    ResourceNames,
    container_priority,
    pod_container_names,
    pod_containers,
    pod_has_hami_resource,
    pod_requests,
)
from tests.fuzz.strategies import (
    fuzz_settings,
    json_values,
    quantities,
    texts,
)


@fuzz_settings
@given(quantities)
@example("1" * 5000)  # int() refuses more than 4,300 digits
@example("0." + "1" * 5000)
@example("1e-" + "0" * 5000 + "5")
@example("1e" + "9" * 5000)
@example(10**5000)
@example("1000e1000")  # was accepted, but its canonical text "10e1002" was refused
@example("999e999")
@example("9" * 1000 + "e-7")  # its canonical text has 1,002 digits: counted as significant digits now
@example(10**1000)
def test_any_quantity_parses_or_is_refused_with_quantity_error(raw: Any) -> None:
    try:
        value = parse_quantity(raw)
    except QuantityError as err:
        assert str(err)
        with pytest.raises(QuantityError):  # the canonical text of what is refused is refused too
            canonical_quantity(raw)
        return
    text = canonical_quantity(raw)
    assert quantity_value(raw) >= value if value >= 0 else quantity_value(raw) <= value
    whole = quantity_int(raw)
    assert whole is None or whole == value
    # the API server stores the canonical text and gives it back: storing that again changes nothing
    assert canonical_quantity(text) == text
    parse_quantity(text)


_NAMES = ResourceNames()
_resource_key = st.sampled_from([*sorted(_NAMES.all), "cpu", "memory", ""])
_resource_value = quantities | json_values(leaves=4)
_resources = st.dictionaries(
    st.sampled_from(["limits", "requests", "claims"]),
    st.dictionaries(_resource_key, _resource_value, max_size=5) | json_values(leaves=4),
    max_size=3,
)
_container = st.dictionaries(
    st.sampled_from(["name", "resources", "image", "env"]),
    st.one_of(texts, _resources, json_values(leaves=4)),
    max_size=4,
) | json_values(leaves=4)
_spec = st.dictionaries(
    st.sampled_from(["containers", "initContainers", "schedulerName"]),
    st.lists(_container, max_size=3) | json_values(leaves=6),
    max_size=3,
)
pods = st.dictionaries(
    st.sampled_from(["spec", "metadata", "status"]), _spec | json_values(leaves=6), max_size=3
)
defaults = st.builds(
    RequestDefaults,
    default_memory=st.sampled_from([0, 1000, 2**31 - 1]),
    default_cores=st.sampled_from([0, 30, 100]),
    memory_factor=st.sampled_from([1, 1024, 2**31 - 1]),
)


@fuzz_settings
@given(pods, defaults)
@example(
    {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1" * 5000}}}]}}, RequestDefaults()
)
@example(
    {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/priority": "1e9999"}}}]}},
    RequestDefaults(),
)
def test_any_pod_gives_its_requests_or_a_request_error(pod: Any, defaults: RequestDefaults) -> None:
    before = copy.deepcopy(pod)
    try:
        names = pod_container_names(pod)
        requests = pod_requests(pod, _NAMES, defaults)
        pod_has_hami_resource(pod, _NAMES)
        for container, init in pod_containers(pod):
            if not init:
                container_priority(container, _NAMES)
    except RequestError as err:
        assert err.resource and err.reason  # the container's name may be "" (a pod without names)
        assert str(err)
    else:
        assert len(requests) == len(names)
        for request in requests:
            if request is not None:
                assert request.nums >= 1
                assert 0 <= request.memreq <= 2**31 - 1
                assert request.mem_percentage is None or 0 < request.mem_percentage <= 100
                assert 0 <= request.coresreq <= 100
    assert pod == before
