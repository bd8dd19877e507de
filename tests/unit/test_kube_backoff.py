"""hami_kube's one retry policy and the stateful `Backoff` a thread's retry loop keeps, and which API
errors are worth retrying."""

from __future__ import annotations

import logging
import random

import pytest

from hami_kube.backoff import DEFAULT_RETRY, Backoff, RetryPolicy
from hami_kube.errors import KubeApiError


def test_backoff_doubles_from_initial_to_maximum_and_reset_starts_over() -> None:
    backoff = RetryPolicy(initial=0.5, maximum=4.0, factor=2.0, jitter=0.0).backoff()
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.reset() == 6
    assert backoff.next() == 0.5


def test_backoff_follows_the_policys_delay_with_the_same_random_draws() -> None:
    policy = RetryPolicy(initial=0.1, maximum=3.0, jitter=0.5)
    backoff = Backoff(policy, random.Random(7))
    expected_rng = random.Random(7)
    for failures in range(1, 12):
        delay = backoff.next()
        assert delay == policy.delay(failures, expected_rng)
        assert 0.5 * min(3.0, 0.1 * 2 ** (failures - 1)) <= delay <= min(3.0, 0.1 * 2 ** (failures - 1))


def test_backoff_warns_on_the_1st_2nd_4th_8th_failure_in_a_row_only() -> None:
    backoff = DEFAULT_RETRY.backoff(random.Random(1))
    levels = []
    for _ in range(9):
        levels.append(backoff.report_level())
        backoff.next()
    warned = [n for n, level in enumerate(levels, start=1) if level == logging.WARNING]
    assert warned == [1, 2, 4, 8]
    assert set(levels) == {logging.WARNING, logging.DEBUG}


def test_policy_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="initial <= maximum"):
        RetryPolicy(initial=2.0, maximum=1.0)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=1.0)


@pytest.mark.parametrize(
    ("status", "retriable", "not_found"),
    [(0, True, False), (401, True, False), (408, True, False), (409, True, False), (429, True, False),
     (500, True, False), (503, True, False), (400, False, False), (403, False, False), (404, False, True),
     (422, False, False)],
)  # fmt: skip
def test_api_errors_are_retriable_for_no_answer_auth_conflict_throttle_and_5xx_only(
    status: int, retriable: bool, not_found: bool
) -> None:
    err = KubeApiError(status, "Reason", "message")
    assert (err.retriable, err.not_found, err.gone) == (retriable, not_found, False)
