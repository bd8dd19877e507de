"""hami_control.quota: limits from ResourceQuotas (HAMi's `limits.<resource>` keys only, smallest wins,
memory factor), a pod's usage (HAMi's init-container peak rule), and the denial message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hami_api.errors import RequestError
from hami_api.resources import ResourceNames
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_control.config import ControlConfig
from hami_control.quota import (
    QuotaDenial,
    QuotaLimitError,
    QuotaLimits,
    QuotaUsage,
    allocation_quota_usage,
    check_quota,
    limits_from_resource_quota,
    limits_from_resource_quotas,
    pod_quota_usage,
    quota_keys,
)
from tests.builders import Json, container, pod, resource_quota

CONFIG = ControlConfig()


def team_quota(hard: Mapping[str, Any], name: str = "gpu") -> Json:
    """A ResourceQuota `ai-team/<name>` with `hard` limits."""
    return resource_quota(hard, name=name, namespace="ai-team")


def team_pod(*containers: Json, init: Sequence[Json] = ()) -> Json:
    """The pod `ai-team/p` of `containers` and `init` containers."""
    return pod("p", *containers, namespace="ai-team", init=init)


class View:
    """A QuotaView over fixed numbers that records which questions were asked."""

    def __init__(self, limits: QuotaLimits | None = None, used: QuotaUsage | None = None) -> None:
        self._limits = limits or QuotaLimits()
        self._used = used or QuotaUsage()
        self.asked: list[tuple[str, str]] = []

    def limits(self, namespace: str) -> QuotaLimits:
        self.asked.append(("limits", namespace))
        return self._limits

    def used(self, namespace: str) -> QuotaUsage:
        self.asked.append(("used", namespace))
        return self._used


# --- limits ----------------------------------------------------------------------------------------------


def test_quota_keys_follow_the_configured_resource_names() -> None:
    assert quota_keys(ResourceNames()) == ("limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores")
    names = ResourceNames(memory="hami.io/gpumem", cores="hami.io/gpucores")
    assert quota_keys(names) == ("limits.hami.io/gpumem", "limits.hami.io/gpucores")


@pytest.mark.parametrize(
    ("hard", "expected"),
    [
        ({"limits.nvidia.com/gpumem": "40000"}, QuotaLimits(memory=40000)),
        ({"limits.nvidia.com/gpucores": "200"}, QuotaLimits(cores=200)),
        (
            {"limits.nvidia.com/gpumem": "40k", "limits.nvidia.com/gpucores": 300},
            QuotaLimits(memory=40000, cores=300),
        ),
        # HAMi reads only limits.<resource>: requests.* and the bare names are kube's own quota
        ({"requests.nvidia.com/gpumem": "1", "nvidia.com/gpumem": "1", "pods": "10"}, QuotaLimits()),
        ({"limits.nvidia.com/gpumem": "0"}, QuotaLimits(memory=0)),
    ],
)
def test_limits_from_one_resource_quota(hard: dict[str, Any], expected: QuotaLimits) -> None:
    assert limits_from_resource_quota(team_quota(hard), CONFIG) == expected


def test_memory_limit_is_in_gpumem_units_so_the_memory_factor_applies() -> None:
    config = CONFIG.with_settings(memory_factor=1024)
    limits = limits_from_resource_quota(team_quota({"limits.nvidia.com/gpumem": "40"}), config)
    assert limits == QuotaLimits(memory=40 * 1024)


def test_limits_use_configured_resource_names() -> None:
    config = CONFIG.with_settings(resource_names=ResourceNames(memory="acme.com/vram"))
    rq = team_quota({"limits.acme.com/vram": "10", "limits.nvidia.com/gpumem": "1"})
    assert limits_from_resource_quota(rq, config) == QuotaLimits(memory=10)


@pytest.mark.parametrize("shape", [{}, {"spec": None}, {"spec": {"hard": None}}, {"spec": {"hard": []}}])
def test_a_quota_without_hard_limits_sets_none(shape: dict[str, Any]) -> None:
    assert limits_from_resource_quota(shape, CONFIG) == QuotaLimits()


@pytest.mark.parametrize(("value", "reason"), [("lots", "not a valid"), ("-5", "negative"), (True, "bool")])
def test_an_unreadable_limit_names_quota_key_and_value(value: Any, reason: str) -> None:
    with pytest.raises(QuotaLimitError) as info:
        limits_from_resource_quota(team_quota({"limits.nvidia.com/gpumem": value}, "q1"), CONFIG)
    message = str(info.value)
    assert "ai-team/q1" in message
    assert "limits.nvidia.com/gpumem" in message
    assert str(value) in message
    assert reason in message


def test_several_quotas_the_smallest_limit_wins() -> None:
    quotas = [
        team_quota({"limits.nvidia.com/gpumem": "40000"}, "a"),
        team_quota({"limits.nvidia.com/gpumem": "30000", "limits.nvidia.com/gpucores": "400"}, "b"),
        team_quota({"limits.nvidia.com/gpucores": "300"}, "c"),
        team_quota({"pods": "5"}, "d"),
    ]
    assert limits_from_resource_quotas(quotas, CONFIG) == QuotaLimits(memory=30000, cores=300)
    assert limits_from_resource_quotas([], CONFIG) == QuotaLimits()
    assert QuotaLimits().unlimited
    assert not QuotaLimits(cores=0).unlimited


# --- usage -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        (team_pod(container(gpus="1", gpumem="4000")), QuotaUsage(4000, 0)),
        (team_pod(container(gpus="2", gpumem="4000", gpucores="30")), QuotaUsage(8000, 60)),
        (
            team_pod(
                container("a", gpus="1", gpumem="3000"),
                container("b", gpus="2", gpumem="1000", gpucores="10"),
            ),
            QuotaUsage(5000, 20),
        ),
        # memory only as a percentage: unknown until a GPU is chosen, counted 0 at admission (as HAMi)
        (team_pod(container(gpus="1", gpumem_percentage="50", gpucores="20")), QuotaUsage(0, 20)),
        (team_pod(container(gpus="1")), QuotaUsage(0, 0)),
        (team_pod(container(gpus="1", gpucores="100")), QuotaUsage(0, 100)),
        # no GPU count: nothing (the webhook adds the count before it asks)
        (team_pod(container(gpumem="4000")), QuotaUsage()),
        (team_pod(container(gpus="0")), QuotaUsage()),
        (team_pod(container("cpu", limits={"cpu": "1"})), QuotaUsage()),
        # init containers run one at a time before the app containers: the peak counts
        (
            team_pod(
                container("a", gpus="1", gpumem="3000"),
                container("b", gpus="1", gpumem="3000"),
                init=(container("i", gpus="1", gpumem="10000"),),
            ),
            QuotaUsage(10000, 0),
        ),
        (
            team_pod(
                container("a", gpus="1", gpumem="3000", gpucores="50"),
                init=(container("i1", gpus="1", gpumem="1000", gpucores="100"),),
            ),
            QuotaUsage(3000, 100),
        ),
        (
            team_pod(
                container("a", gpus="1", gpumem="8000"),
                init=(container("i1", gpus="1", gpumem="1000"), container("i2", gpus="2", gpumem="3000")),
            ),
            QuotaUsage(8000, 0),
        ),
    ],
)
def test_pod_quota_usage(the_pod: dict[str, Any], expected: QuotaUsage) -> None:
    assert pod_quota_usage(the_pod, CONFIG) == expected


def test_pod_usage_applies_memory_factor_and_defaults() -> None:
    assert pod_quota_usage(
        team_pod(container(gpus="1", gpumem="4")), CONFIG.with_settings(memory_factor=1000)
    ) == QuotaUsage(4000, 0)
    config = CONFIG.with_settings(default_memory=2000, default_cores=10)
    assert pod_quota_usage(team_pod(container(gpus="2")), config) == QuotaUsage(4000, 20)


def test_pod_usage_reads_requests_when_limits_are_absent() -> None:
    by_requests = container("c", requests={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500"})
    assert pod_quota_usage(team_pod(by_requests), CONFIG) == QuotaUsage(500, 0)


def test_pod_usage_of_a_bad_value_raises_request_error() -> None:
    with pytest.raises(RequestError, match=r"nvidia\.com/gpumem"):
        pod_quota_usage(team_pod(container("x", gpus="1", gpumem="-1")), CONFIG)


def test_allocation_usage_sums_regular_containers_and_peaks_init_ones() -> None:
    def entry(*slices: tuple[int, int]) -> ContainerAllocation:
        return ContainerAllocation(tuple(GPUSlice("GPU-a", m, c) for m, c in slices))

    allocation = PodAllocation(
        (entry((9000, 10)), entry((2000, 30), (2000, 30)), entry(), entry((1000, 0)), ContainerAllocation())
    )
    # entry 0 is the init container; 1..4 regular (one consumed, one trailing empty)
    assert allocation_quota_usage(allocation, init_containers=1) == QuotaUsage(9000, 60)
    assert allocation_quota_usage(allocation, init_containers=0) == QuotaUsage(14000, 70)
    assert allocation_quota_usage(PodAllocation(), 0) == QuotaUsage()


def test_usage_arithmetic() -> None:
    assert QuotaUsage(1, 2) + QuotaUsage(10, 20) == QuotaUsage(11, 22)
    assert QuotaUsage(11, 22) - QuotaUsage(10, 20) == QuotaUsage(1, 2)


# --- the check -------------------------------------------------------------------------------------------


def test_memory_denial_message() -> None:
    view = View(QuotaLimits(memory=40000), QuotaUsage(38000, 0))
    denial = check_quota("ai-team", QuotaUsage(4000, 0), view)
    assert denial == QuotaDenial(
        "namespace ai-team: GPU memory quota exceeded (used 38000 / limit 40000 MiB, this pod asks 4000)"
    )


def test_cores_denial_message() -> None:
    view = View(QuotaLimits(cores=200), QuotaUsage(0, 150))
    denial = check_quota("ai-team", QuotaUsage(0, 100), view)
    assert denial == QuotaDenial(
        "namespace ai-team: GPU cores quota exceeded (used 150 / limit 200 %, this pod asks 100)"
    )


def test_both_exceeded_are_reported_together() -> None:
    view = View(QuotaLimits(memory=1000, cores=100), QuotaUsage(900, 90))
    denial = check_quota("ns", QuotaUsage(200, 20), view)
    assert denial is not None
    assert denial.message == (
        "namespace ns: GPU memory quota exceeded (used 900 / limit 1000 MiB, this pod asks 200); "
        "GPU cores quota exceeded (used 90 / limit 100 %, this pod asks 20)"
    )


@pytest.mark.parametrize(
    ("limits", "used", "ask"),
    [
        (QuotaLimits(memory=40000), QuotaUsage(36000, 0), QuotaUsage(4000, 0)),  # exactly reaches the limit
        (QuotaLimits(memory=40000), QuotaUsage(0, 0), QuotaUsage(0, 100)),  # asks no memory
        (QuotaLimits(memory=100), QuotaUsage(500, 0), QuotaUsage(0, 100)),  # over already, asks none of it
        (QuotaLimits(cores=100), QuotaUsage(0, 100), QuotaUsage(4000, 0)),
        (QuotaLimits(), QuotaUsage(10**9, 10**9), QuotaUsage(4000, 100)),
    ],
)
def test_fits(limits: QuotaLimits, used: QuotaUsage, ask: QuotaUsage) -> None:
    assert check_quota("ns", ask, View(limits, used)) is None


def test_the_view_is_asked_only_what_is_needed() -> None:
    view = View(QuotaLimits(), QuotaUsage())
    assert check_quota("ns", QuotaUsage(), view) is None
    assert view.asked == []  # a pod asking nothing never reaches the caches
    assert check_quota("ns", QuotaUsage(1, 0), view) is None
    assert view.asked == [("limits", "ns")]  # no limit: usage is not needed
    limited = View(QuotaLimits(memory=10), QuotaUsage(0, 0))
    assert check_quota("team", QuotaUsage(1, 0), limited) is None
    assert limited.asked == [("limits", "team"), ("used", "team")]


def test_a_zero_limit_denies_any_ask() -> None:
    denial = check_quota("ns", QuotaUsage(1, 0), View(QuotaLimits(memory=0)))
    assert denial is not None
    assert "used 0 / limit 0 MiB, this pod asks 1" in denial.message
