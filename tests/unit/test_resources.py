"""Resource names, defaults and HAMi's request normalisation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.errors import RequestError
from hami_api.resources import (
    UNSET_PERCENTAGE,
    ContainerRequest,
    RequestDefaults,
    ResourceNames,
    container_has_hami_resource,
    container_priority,
    container_request,
    container_resource,
    pod_container_names,
    pod_has_hami_resource,
    pod_requests,
)
from tests.builders import container, pod

GPU, MEM, PCT, CORES, PRIO = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)


def req(nums: int, memreq: int = 0, pct: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=memreq, mem_percentage=pct, coresreq=cores)


def test_default_names() -> None:
    names = ResourceNames()
    assert (names.count, names.memory, names.memory_percentage, names.cores, names.priority) == (
        GPU,
        MEM,
        PCT,
        CORES,
        PRIO,
    )
    assert names.all == frozenset({GPU, MEM, PCT, CORES, PRIO})
    assert names.sharing == (MEM, PCT, CORES)


def test_default_request_defaults() -> None:
    d = RequestDefaults()
    assert (d.default_memory, d.default_cores, d.default_gpu_num, d.memory_factor) == (0, 0, 1, 1)


@pytest.mark.parametrize(
    "kwargs",
    [{"memory_factor": 0}, {"default_memory": -1}, {"default_cores": 1.5}, {"default_gpu_num": True}],
)
def test_request_defaults_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RequestDefaults(**kwargs)


NORMALISATION = [
    # (limits, requests, defaults, expected)
    ({GPU: 1}, None, RequestDefaults(), req(1, pct=100)),
    ({GPU: "1", MEM: "4000"}, None, RequestDefaults(), req(1, memreq=4000)),
    ({GPU: 2, MEM: 3000, CORES: 30}, None, RequestDefaults(), req(2, memreq=3000, cores=30)),
    ({GPU: 1, PCT: 50}, None, RequestDefaults(), req(1, pct=50)),
    ({GPU: 1, PCT: 101}, None, RequestDefaults(), req(1, pct=100)),  # 101 = unset -> 100 %
    ({GPU: 1, PCT: 101}, None, RequestDefaults(default_memory=2000), req(1, memreq=2000)),
    ({GPU: 1, PCT: 150}, None, RequestDefaults(default_memory=2000), req(1, pct=100)),  # clamped
    ({GPU: 1, PCT: 0}, None, RequestDefaults(), req(1, pct=100)),  # ignored -> default
    ({GPU: 1, PCT: 0, MEM: 1000}, None, RequestDefaults(), req(1, memreq=1000)),
    # HAMi's GenerateResourceRequests: a negative percentage is unset, one past int32 clamps to 100
    ({GPU: 1, PCT: "-5"}, None, RequestDefaults(), req(1, pct=100)),
    ({GPU: 1, PCT: "-5"}, None, RequestDefaults(default_memory=2000), req(1, memreq=2000)),
    ({GPU: 1, PCT: "-5", MEM: 1000}, None, RequestDefaults(), req(1, memreq=1000)),
    ({GPU: 1, PCT: str(-(2**40))}, None, RequestDefaults(default_memory=2000), req(1, memreq=2000)),
    ({GPU: 1, PCT: str(2**31)}, None, RequestDefaults(default_memory=2000), req(1, pct=100)),
    ({GPU: 1, PCT: "5000000000"}, None, RequestDefaults(default_memory=2000), req(1, pct=100)),
    ({GPU: 1, PCT: "5G"}, None, RequestDefaults(default_memory=2000), req(1, pct=100)),
    ({GPU: 1, PCT: 30, MEM: 1000}, None, RequestDefaults(), req(1, memreq=1000, pct=30)),
    ({GPU: 1}, None, RequestDefaults(default_memory=1024), req(1, memreq=1024)),
    ({GPU: 1, MEM: 0}, None, RequestDefaults(default_memory=1024), req(1, memreq=1024)),
    ({GPU: 1, MEM: 10}, None, RequestDefaults(memory_factor=1024), req(1, memreq=10240)),
    ({GPU: 1}, None, RequestDefaults(memory_factor=1024, default_memory=5), req(1, memreq=5)),
    ({GPU: 1, CORES: 250}, None, RequestDefaults(), req(1, pct=100, cores=100)),
    ({GPU: 1}, None, RequestDefaults(default_cores=20), req(1, pct=100, cores=20)),
    ({GPU: 1, CORES: 0}, None, RequestDefaults(default_cores=20), req(1, pct=100, cores=0)),
    ({GPU: "1k", MEM: "1e3"}, None, RequestDefaults(), req(1000, memreq=1000)),
    # limits first, requests per resource as fallback
    (None, {GPU: 1, MEM: 2000}, RequestDefaults(), req(1, memreq=2000)),
    ({GPU: 1}, {MEM: 2000, CORES: 50}, RequestDefaults(), req(1, memreq=2000, cores=50)),
    ({GPU: 1, MEM: 3000}, {GPU: 4, MEM: 2000}, RequestDefaults(), req(1, memreq=3000)),
    ({MEM: 3000}, {GPU: 2}, RequestDefaults(), req(2, memreq=3000)),
]


@pytest.mark.parametrize(("limits", "requests", "defaults", "expected"), NORMALISATION)
def test_normalisation(
    limits: dict[str, Any] | None,
    requests: dict[str, Any] | None,
    defaults: RequestDefaults,
    expected: ContainerRequest,
) -> None:
    assert (
        container_request(container(limits=limits, requests=requests), ResourceNames(), defaults) == expected
    )


@pytest.mark.parametrize(
    "container",
    [
        {"name": "c"},
        {"name": "c", "resources": {}},
        container(limits={"cpu": "1", "memory": "1Gi"}),
        container(limits={GPU: 0, MEM: 1000}),
        container(limits={MEM: 1000, CORES: 10}),  # no count: the webhook adds it, the parser does not
    ],
)
def test_no_gpu_count_is_none(container: dict[str, Any]) -> None:
    assert container_request(container) is None


BAD = [
    ({GPU: "-1"}, GPU, "-1", "negative"),
    ({GPU: "abc"}, GPU, "abc", "not a quantity"),
    ({GPU: "1.5"}, GPU, "1.5", "whole number"),
    ({GPU: "100m"}, GPU, "100m", "whole number"),
    ({GPU: 1, MEM: "-100"}, MEM, "-100", "negative"),
    ({GPU: 1, MEM: "4G i"}, MEM, "4G i", "not a quantity"),
    ({GPU: 1, PCT: "12.5"}, PCT, "12.5", "whole number"),
    ({GPU: 1, PCT: "10E"}, PCT, "10E", "above 9223372036854775807"),  # past Go's AsInt64
    ({GPU: 1, CORES: "x"}, CORES, "x", "not a quantity"),
    ({GPU: 1, MEM: "3Gi"}, MEM, "3Gi", "above"),
    ({GPU: True}, GPU, "True", "not a quantity"),
]


@pytest.mark.parametrize(("limits", "resource", "value", "reason"), BAD)
def test_bad_values_name_container_resource_and_value(
    limits: dict[str, Any], resource: str, value: str, reason: str
) -> None:
    with pytest.raises(RequestError) as info:
        container_request(container("trainer", limits=limits))
    err = info.value
    assert (err.container, err.resource, err.value, err.init) == ("trainer", resource, value, False)
    assert reason in err.reason
    assert "'trainer'" in str(err) and resource in str(err) and repr(value) in str(err)


def test_memory_factor_overflow_is_an_error() -> None:
    with pytest.raises(RequestError, match="memoryFactor"):
        container_request(container(limits={GPU: 1, MEM: 2**30}), defaults=RequestDefaults(memory_factor=4))


def test_malformed_container_shapes() -> None:
    with pytest.raises(RequestError, match="resources"):
        container_request({"name": "c", "resources": []})
    with pytest.raises(RequestError, match=r"resources\.limits"):
        container_request({"name": "c", "resources": {"limits": "1"}})
    with pytest.raises(RequestError, match=r"spec\.containers"):
        pod_requests({"spec": {"containers": "nope"}})


def test_pod_requests_init_containers_first() -> None:
    p = pod(
        "p",
        container("app", limits={GPU: 1, MEM: 3000}),
        container("sidecar", limits={"cpu": "1"}),
        container("app2", limits={GPU: 2}),
        init=[container("setup", limits={GPU: 1, MEM: 5000}), container("noop")],
    )
    assert pod_container_names(p) == ("setup", "noop", "app", "sidecar", "app2")
    assert pod_requests(p) == (req(1, memreq=5000), None, req(1, memreq=3000), None, req(2, pct=100))


def test_pod_requests_errors_say_init_container() -> None:
    p = pod("p", container("app", limits={GPU: 1}), init=[container("setup", limits={GPU: 1, MEM: "-1"})])
    with pytest.raises(RequestError) as info:
        pod_requests(p)
    assert info.value.init and info.value.container == "setup"
    assert str(info.value).startswith("init container 'setup'")


def test_pod_without_containers() -> None:
    assert pod_requests({"spec": {}}) == ()
    assert pod_requests({}) == ()


def test_custom_names() -> None:
    names = ResourceNames(count="example.com/vgpu", memory="example.com/vmem")
    c = container(limits={"example.com/vgpu": 1, "example.com/vmem": 512, GPU: 4})
    assert container_request(c, names) == req(1, memreq=512)
    assert container_has_hami_resource(c, names)
    assert not container_has_hami_resource(
        container(limits={GPU: 1}), ResourceNames(count="x/y", memory="x/m")
    )


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({GPU: 1}, None, True),
        ({MEM: 100}, None, True),
        ({PCT: 10}, None, True),
        ({CORES: 10}, None, True),
        ({PRIO: 1}, None, True),
        (None, {MEM: 100}, True),
        ({"cpu": 1}, {"memory": "1Gi"}, False),
        (None, None, False),
    ],
)
def test_container_has_hami_resource(
    limits: dict[str, Any] | None, requests: dict[str, Any] | None, expected: bool
) -> None:
    assert container_has_hami_resource(container(limits=limits, requests=requests)) is expected


def test_pod_has_hami_resource_sees_init_containers() -> None:
    assert pod_has_hami_resource(pod("p", container("a"), init=[container("i", limits={CORES: 10})]))
    assert not pod_has_hami_resource(pod("p", container("a")))


def test_container_resource_raw_value() -> None:
    c = container(limits={GPU: "2"}, requests={MEM: 100})
    assert container_resource(c, GPU) == "2"
    assert container_resource(c, MEM) == 100
    assert container_resource(c, CORES) is None


@pytest.mark.parametrize(("value", "expected"), [(1, 1), ("0", 0), ("1500m", 2), ("-1", -1)])
def test_priority_uses_value_semantics(value: Any, expected: int) -> None:
    assert container_priority(container(limits={PRIO: value})) == expected


def test_priority_absent_and_bad() -> None:
    assert container_priority(container(limits={GPU: 1})) is None
    with pytest.raises(RequestError, match=PRIO):
        container_priority(container(limits={PRIO: "high"}))


@pytest.mark.parametrize(
    ("request_", "total", "expected"),
    [
        (req(1, memreq=3000), 16000, 3000),
        (req(1, pct=50), 16001, 8000),
        (req(1, memreq=1000, pct=50), 16000, 1000),
        (req(1, pct=100), 32768, 32768),
        (req(1), 32768, 0),
    ],
)
def test_memory_on(request_: ContainerRequest, total: int, expected: int) -> None:
    assert request_.memory_on(total) == expected


def test_wire_mem_percentage() -> None:
    assert req(1).wire_mem_percentage == UNSET_PERCENTAGE == 101
    assert req(1, pct=40).wire_mem_percentage == 40


@given(
    nums=st.integers(1, 16),
    mem=st.none() | st.integers(0, 100_000),
    pct=st.none() | st.integers(-5, 300) | st.integers(-(2**62), 2**62),
    cores=st.none() | st.integers(0, 1000),
    default_memory=st.integers(0, 10_000),
    factor=st.integers(1, 4),
)
def test_normalisation_invariants(
    *, nums: int, mem: int | None, pct: int | None, cores: int | None, default_memory: int, factor: int
) -> None:
    limits: dict[str, Any] = {GPU: str(nums)}
    for name, value in ((MEM, mem), (PCT, pct), (CORES, cores)):
        if value is not None:
            limits[name] = str(value)
    defaults = RequestDefaults(default_memory=default_memory, memory_factor=factor)
    r = container_request(container(limits=limits), defaults=defaults)
    assert r is not None and r.nums == nums
    assert 0 <= r.coresreq <= 100
    assert r.mem_percentage is None or 1 <= r.mem_percentage <= 100
    assert r.memreq > 0 or r.mem_percentage is not None  # every GPU request asks for some memory
    if mem:
        assert r.memreq == mem * factor
