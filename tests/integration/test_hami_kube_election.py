"""hami_kube.election against the local API server: the first candidate creates and holds the Lease, a
second waits while the holder renews, takes over once the holder's record has not changed for the lease
duration (counting one more transition), a released Lease is taken at once, and of two candidates
writing the same record one loses with 409 and does not lead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hami_kube.client import KubeApi
from hami_kube.election import LeaseElection, LeaseSettings
from hami_sim.apiserver import ApiServerRunner
from tests.control_server_util import LoopThread


class Clock:
    """A monotonic clock the test moves; the wall clock follows it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return datetime(2026, 11, 25, tzinfo=UTC) + timedelta(seconds=self.now)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[LoopThread, KubeApi]]:
    with ApiServerRunner() as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        loop = LoopThread()
        api = loop.call(lambda: KubeApi.connect(kubeconfig))
        try:
            yield loop, api
        finally:
            loop.call(api.close)
            loop.close()


def candidate(api: KubeApi, identity: str, clock: Clock) -> LeaseElection:
    settings = LeaseSettings("default", "hami-control", identity, 15.0, 10.0, 2.0)
    return LeaseElection(api, settings, clock=clock, wall=clock.wall)


def test_the_first_candidate_creates_and_holds_the_lease_and_renews_it(
    rig: tuple[LoopThread, KubeApi],
) -> None:
    loop, api = rig
    clock = Clock()
    a = candidate(api, "a", clock)
    assert loop.call(a.try_acquire_or_renew)
    lease = loop.call(lambda: api.get(a.settings.path))
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseTransitions"] == 0
    assert lease["spec"]["leaseDurationSeconds"] == 15
    clock.now += 2
    assert loop.call(a.try_acquire_or_renew)
    renewed = loop.call(lambda: api.get(a.settings.path))["spec"]
    assert (
        renewed["renewTime"] > lease["spec"]["renewTime"]
        and renewed["acquireTime"] == lease["spec"]["acquireTime"]
    )


def test_a_second_candidate_waits_for_the_lease_duration_on_its_own_clock_then_takes_over(
    rig: tuple[LoopThread, KubeApi],
) -> None:
    loop, api = rig
    clock_a, clock_b = Clock(), Clock()
    clock_b.now = 99_999.0  # another machine's clock: only b's own intervals count
    a, b = candidate(api, "a", clock_a), candidate(api, "b", clock_b)
    assert loop.call(a.try_acquire_or_renew)
    assert not loop.call(b.try_acquire_or_renew)  # b first sees the record now
    clock_b.now += 14
    assert not loop.call(b.try_acquire_or_renew)  # not yet 15 s since b saw it change
    clock_a.now += 14
    assert loop.call(a.try_acquire_or_renew)  # a renews: the record changes
    clock_b.now += 14
    assert not loop.call(b.try_acquire_or_renew)  # b saw the renewal 0 s ago on its clock
    clock_b.now += 15
    assert loop.call(b.try_acquire_or_renew)  # a stopped renewing for a whole lease duration
    spec = loop.call(lambda: api.get(b.settings.path))["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not loop.call(a.try_acquire_or_renew)  # a sees b's fresh record


def test_a_released_lease_is_taken_at_once(rig: tuple[LoopThread, KubeApi]) -> None:
    loop, api = rig
    clock = Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert loop.call(a.try_acquire_or_renew)
    assert not loop.call(b.try_acquire_or_renew)
    assert loop.call(a.release)
    assert not loop.call(b.release)  # not its lease
    assert loop.call(b.try_acquire_or_renew)
    assert loop.call(lambda: api.get(b.settings.path))["spec"]["holderIdentity"] == "b"


def test_of_two_writes_of_the_same_record_one_gets_409_and_does_not_lead(
    rig: tuple[LoopThread, KubeApi],
) -> None:
    loop, api = rig
    clock = Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert loop.call(a.try_acquire_or_renew)
    assert loop.call(a.release)

    async def both() -> list[bool]:
        return list(await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew()))

    results = loop.call(both)
    assert sorted(results) == [False, True]
    holder = loop.call(lambda: api.get(a.settings.path))["spec"]["holderIdentity"]
    assert holder == ("a" if results[0] else "b")


def test_settings_follow_client_gos_rule() -> None:
    with pytest.raises(ValueError, match=r"lease duration > renew deadline > 1\.2 x retry period"):
        LeaseSettings("ns", "l", "me", 10.0, 10.0, 2.0)
    with pytest.raises(ValueError, match="identity"):
        LeaseSettings("ns", "l", "")
