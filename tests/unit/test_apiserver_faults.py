"""The fault rules (pure): validation names the field and value, any JSON ends in rules or that error, the
JSON form round-trips, and decisions follow the rules and replay from the seed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_sim.apiserver.faults import (
    FAULTS,
    VERBS,
    FaultConfig,
    FaultInjector,
    FaultRequest,
    FaultSpecError,
    parse_config,
)


def injector(*rules: dict[str, Any], seed: int = 1) -> FaultInjector:
    faults = FaultInjector()
    faults.replace(parse_config({"seed": seed, "rules": list(rules)}))
    return faults


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body: Invalid value: []: must be an object"),
        ({"seed": "1"}, "seed: Invalid value: '1': must be an integer"),
        ({"seed": True}, "seed: Invalid value: True: must be an integer"),
        ({"rules": {}}, "rules: Invalid value: {}: must be a list of rules"),
        ({"rule": []}, "rule: Invalid value: []: unknown field"),
        ({"rules": [7]}, "rules[0]: Invalid value: 7: must be an object"),
        ({"rules": [{"fault": "error"}]}, "rules[0].name: Invalid value: None: must be a non-empty string"),
        (
            {"rules": [{"name": "a", "fault": "boom"}]},
            "rules[0].fault: Invalid value: 'boom': must be one of",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "probability": 1.5}]},
            "rules[0].probability: Invalid value: 1.5: must be between 0 and 1",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "probability": "0.5"}]},
            "rules[0].probability: Invalid value: '0.5': must be a number",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "verbs": ["post"]}]},
            "rules[0].verbs[0]: Invalid value: 'post': must be one of get, list, watch",
        ),
        (
            {"rules": [{"name": "a", "fault": "drop-watch", "verbs": ["list"]}]},
            "rules[0].verbs[0]: Invalid value: 'list': a drop-watch fault applies only to watch",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "resources": "pods"}]},
            "rules[0].resources: Invalid value: 'pods': must be a list of strings",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "userAgents": [""]}]},
            "rules[0].userAgents[0]: Invalid value: '': must be a non-empty string",
        ),
        (
            {"rules": [{"name": "a", "fault": "throttle"}]},
            "rules[0].retryAfterSeconds: Invalid value: None: a throttle fault needs a Retry-After",
        ),
        (
            {"rules": [{"name": "a", "fault": "slow", "delaySeconds": 0}]},
            "rules[0].delaySeconds: Invalid value: 0: a slow fault needs a delay above 0 seconds",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "limit": -1}]},
            "rules[0].limit: Invalid value: -1: must be between 0 and",
        ),
        (
            {"rules": [{"name": "a", "fault": "gone", "goneAs": "both"}]},
            "rules[0].goneAs: Invalid value: 'both': must be one of either, event, status",
        ),
        (
            {"rules": [{"name": "a", "fault": "error"}, {"name": "a", "fault": "slow", "delaySeconds": 1}]},
            "rules[1].name: Invalid value: 'a': must be unique among the rules",
        ),
        (
            {"rules": [{"name": "a", "fault": "error", "delay": 1}]},
            "rules[0].delay: Invalid value: 1: unknown field",
        ),
    ],
)
def test_a_bad_body_is_rejected_naming_the_field_and_the_value(body: Any, message: str) -> None:
    with pytest.raises(FaultSpecError) as info:
        parse_config(body)
    assert str(info.value).startswith(message)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
rule_keys = st.sampled_from(
    [
        "name",
        "fault",
        "probability",
        "verbs",
        "resources",
        "subresources",
        "namespaces",
        "userAgents",
        "retryAfterSeconds",
        "delaySeconds",
        "limit",
        "goneAs",
    ]
)
near_rules = st.dictionaries(
    rule_keys,
    json_values | st.sampled_from([*FAULTS, *VERBS]) | st.lists(st.sampled_from(VERBS), max_size=3),
    max_size=8,
)


@given(st.one_of(json_values, st.fixed_dictionaries({"seed": json_values, "rules": st.lists(near_rules)})))
def test_any_json_body_gives_rules_or_a_fault_spec_error(body: Any) -> None:
    try:
        config = parse_config(body)
    except FaultSpecError as err:
        assert err.field and str(err).startswith(f"{err.field}: Invalid value: ")
    else:
        assert parse_config(config.to_json()) == config


names = st.text(alphabet="abcdefgh-", min_size=1, max_size=6)
valid_rule = st.builds(
    lambda name, fault, p, verbs, resources, agents, limit: {
        "name": name,
        "fault": fault,
        "probability": p,
        "verbs": verbs,
        "resources": resources,
        "userAgents": agents,
        "limit": limit,
        **({"retryAfterSeconds": 1} if fault == "throttle" else {}),
        **({"delaySeconds": 0.01} if fault == "slow" else {}),
    },
    names,
    st.sampled_from([f for f in FAULTS if f not in ("conflict", "drop-watch", "gone", "stale-list")]),
    st.floats(0.0, 1.0),
    st.lists(st.sampled_from(VERBS), max_size=2, unique=True),
    st.lists(st.sampled_from(["pods", "nodes", "leases"]), max_size=2, unique=True),
    st.lists(st.sampled_from(["hami-node/", "hami-control/"]), max_size=1),
    st.integers(0, 3),
)
requests = st.lists(
    st.builds(
        FaultRequest,
        verb=st.sampled_from(VERBS),
        resource=st.sampled_from(["pods", "nodes", "leases"]),
        user_agent=st.sampled_from(["hami-node/0.1.0 (linux/amd64) hami-py", "kubectl/v1.36.0", ""]),
        resumed=st.booleans(),
        stale_available=st.booleans(),
    ),
    max_size=40,
)


@given(
    st.integers(0, 2**32),
    st.lists(valid_rule, max_size=4, unique_by=lambda r: r["name"]),
    requests,
)
def test_the_same_seed_and_requests_replay_the_same_decisions_within_the_rules(
    seed: int, rules: list[dict[str, Any]], sequence: list[FaultRequest]
) -> None:
    first, second = injector(*rules, seed=seed), injector(*rules, seed=seed)
    decided = [first.decide(r) for r in sequence]
    assert decided == [second.decide(r) for r in sequence]
    for request, decision in zip(sequence, decided, strict=True):
        if decision is not None:
            assert decision.rule.matches(request) and decision.rule.probability > 0
    for rule in first.config.rules:
        assert not rule.limit or first.injected_by_rule[rule.name] <= rule.limit
    assert sum(first.injected.values()) == sum(d is not None for d in decided)


def test_each_fault_hits_only_the_verbs_it_can() -> None:
    faults = injector(
        {"name": "c", "fault": "conflict"},
        {"name": "g", "fault": "gone"},
        {"name": "s", "fault": "stale-list"},
        {"name": "d", "fault": "drop-watch"},
    )
    assert faults.decide(FaultRequest("get", "pods")) is None
    conflict = faults.decide(FaultRequest("patch", "pods"))
    assert conflict is not None and conflict.rule.name == "c"
    # A watch from "now" cannot be gone, only cut; a resumed one is gone first (rule order).
    fresh = faults.decide(FaultRequest("watch", "pods"))
    resumed = faults.decide(FaultRequest("watch", "pods", resumed=True))
    assert fresh is not None and fresh.rule.name == "d" and 0 <= fresh.drop_after <= 10
    assert resumed is not None and resumed.rule.name == "g"
    # A stale list needs an earlier answer to repeat.
    assert faults.decide(FaultRequest("list", "pods")) is None
    stale = faults.decide(FaultRequest("list", "pods", stale_available=True))
    assert stale is not None and stale.rule.name == "s"


def test_filters_limit_probability_and_user_agent_prefixes() -> None:
    faults = injector(
        {"name": "never", "fault": "error", "probability": 0},
        {
            "name": "node-leases",
            "fault": "error",
            "resources": ["leases"],
            "namespaces": ["kube-node-lease"],
            "userAgents": ["hami-node/"],
            "limit": 2,
        },
    )
    lease = FaultRequest("update", "leases", namespace="kube-node-lease", user_agent="hami-node/0.1.0 (x)")
    assert faults.decide(FaultRequest("update", "leases", namespace="kube-node-lease")) is None
    assert faults.decide(FaultRequest("update", "leases", user_agent="hami-node/0.1.0 (x)")) is None
    assert [faults.decide(lease) is not None for _ in range(4)] == [True, True, False, False]
    assert faults.to_json()["injected"] == {"error": 2}
    assert faults.to_json()["injectedByRule"] == {"node-leases": 2}


def test_clear_keeps_the_counters_and_replace_starts_them_and_the_seed_again() -> None:
    faults = injector({"name": "e", "fault": "error", "probability": 0.5}, seed=9)
    request = FaultRequest("get", "pods")
    first = [faults.decide(request) is not None for _ in range(20)]
    counted = faults.to_json()["injected"]
    faults.clear()
    assert faults.decide(request) is None and faults.to_json()["injected"] == counted
    assert faults.to_json()["rules"] == [] and not faults.active
    faults.replace(parse_config({"seed": 9, "rules": [{"name": "e", "fault": "error", "probability": 0.5}]}))
    assert faults.to_json()["injected"] == {}
    assert [faults.decide(request) is not None for _ in range(20)] == first


def test_an_empty_body_means_no_rules() -> None:
    assert parse_config({}) == FaultConfig()
    assert parse_config({"seed": 4, "rules": None}) == FaultConfig(seed=4)
