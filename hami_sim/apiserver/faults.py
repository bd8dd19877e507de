"""The stand-in API server's fault switch (pure): the rules, their validation, and the seeded decision of
which request gets which fault.

A rule names one fault and the requests it may hit (verbs as kube-apiserver names them, resources,
subresources, namespaces, User-Agent prefixes; an empty list matches all) with a probability and an
optional limit. For every request the rules are tried in order; each rule that matches draws one number
from `random.Random(seed)`, and the first whose draw falls under its probability is injected. So the same
seed and the same sequence of requests replay the same decisions.

Faults and what kube-apiserver really answers (the server turns a decision into these):

- conflict: 409 `Conflict` Status on a write, "Operation cannot be fulfilled on <resource> "<name>": the
  object has been modified; please apply your changes to the latest version and try again"
  (apiserver pkg/registry/generic/registry/store.go OptimisticLockErrorMsg, pkg/storage/errors/storage.go).
- throttle: 429 `TooManyRequests` Status with a `Retry-After` header (apimachinery NewTooManyRequests;
  the header from details.retryAfterSeconds, pkg/endpoints/handlers/responsewriters/writers.go
  ErrorNegotiated, as priority-and-fairness's `tooManyRequests` sets it).
- error: 500 `InternalError` ("Internal error occurred: ..."); with `retryAfterSeconds`, 500
  `ServerTimeout` with `Retry-After`, as pkg/storage/errors/storage.go answers a storage timeout.
- slow: the answer waits `delaySeconds`, then is served normally.
- drop-watch: a watch's connection is cut after a random number (0..10) of lines.
- gone: a watch resumed from a resourceVersion gets 410 `Expired` "too old resource version: X (Y)"
  (pkg/storage/cacher/watch_cache_history.go): as an ERROR event in a 200 stream, as the watch cache
  answers it (cacher.go Watch: "errors must fail with a watch event of type ERROR"), or as an HTTP 410
  (`goneAs`: "event", "status" or "either", the default, drawn from the seed).
- stale-list: a list answered again with the previous answer to the same list (resource, namespace,
  selectors) and its older resourceVersion, as a lagging watch cache would serve it.

Requests to /hami-sim/*, discovery and OpenAPI are never faulted (the server only asks for resource
requests).
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("conflict", "throttle", "error", "slow", "drop-watch", "gone", "stale-list")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
GONE_AS = ("either", "event", "status")
MAX_DROP_AFTER = 10
"""A dropped watch is cut after 0..MAX_DROP_AFTER lines (events or bookmarks)."""

_VERBS_OF: dict[str, frozenset[str]] = {
    "conflict": WRITE_VERBS,
    "throttle": frozenset(VERBS),
    "error": frozenset(VERBS),
    "slow": frozenset(VERBS),
    "drop-watch": frozenset({"watch"}),
    "gone": frozenset({"watch"}),
    "stale-list": frozenset({"list"}),
}
"""Which verbs a fault can hit (a rule's `verbs` narrow this; a verb outside it never matches)."""

_LIST_FIELDS = ("verbs", "resources", "subresources", "namespaces", "userAgents")
_KNOWN_FIELDS = frozenset(
    {"name", "fault", "probability", "retryAfterSeconds", "delaySeconds", "limit", "goneAs", *_LIST_FIELDS}
)
MAX_DELAY_S = 3600.0
MAX_RETRY_AFTER_S = 3600


class FaultSpecError(ValueError):
    """A fault body that is not valid; the message names the field and the value."""

    def __init__(self, field_path: str, value: Any, why: str) -> None:
        self.field = field_path
        self.value = value
        super().__init__(f"{field_path}: Invalid value: {value!r}: {why}")


@dataclass(frozen=True, slots=True)
class FaultRule:
    """One rule (see the module docstring); empty tuples match everything."""

    name: str
    fault: str
    probability: float = 1.0
    verbs: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    user_agents: tuple[str, ...] = ()
    retry_after_s: int = 0
    delay_s: float = 0.0
    limit: int = 0
    gone_as: str = "either"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "fault": self.fault,
            "probability": self.probability,
            "verbs": list(self.verbs),
            "resources": list(self.resources),
            "subresources": list(self.subresources),
            "namespaces": list(self.namespaces),
            "userAgents": list(self.user_agents),
            "limit": self.limit,
        }
        if self.fault in ("throttle", "error"):
            body["retryAfterSeconds"] = self.retry_after_s
        if self.fault == "slow":
            body["delaySeconds"] = self.delay_s
        if self.fault == "gone":
            body["goneAs"] = self.gone_as
        return body

    def matches(self, request: FaultRequest) -> bool:
        """Whether this rule may hit `request` (before its probability and limit)."""
        if request.verb not in _VERBS_OF[self.fault]:
            return False
        if self.verbs and request.verb not in self.verbs:
            return False
        if self.resources and request.resource not in self.resources:
            return False
        if self.subresources and request.subresource not in self.subresources:
            return False
        if self.namespaces and request.namespace not in self.namespaces:
            return False
        return not self.user_agents or any(request.user_agent.startswith(p) for p in self.user_agents)


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """What a rule matches on: kube-apiserver's request info and the client's User-Agent. `resumed`:
    a watch from a resourceVersion (only those can be `gone`); `stale_available`: the server holds an
    earlier answer to this list (only then can it be `stale-list`)."""

    verb: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    user_agent: str = ""
    resumed: bool = False
    stale_available: bool = False


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """A seed and the rules, in order."""

    seed: int = 0
    rules: tuple[FaultRule, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "rules": [r.to_json() for r in self.rules]}


@dataclass(frozen=True, slots=True)
class Decision:
    """A fault to inject: the rule, and for drop-watch after how many lines, for gone whether as an
    HTTP 410 (else an ERROR event)."""

    rule: FaultRule
    drop_after: int = 0
    gone_status: bool = False


# -- parsing ------------------------------------------------------------------------------------


def _string_list(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FaultSpecError(f"{where}.{key}", value, "must be a list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise FaultSpecError(f"{where}.{key}[{i}]", item, "must be a non-empty string")
    return tuple(value)


def _number(raw: Mapping[str, Any], key: str, where: str, *, default: float, hi: float) -> float:
    lo = 0.0
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FaultSpecError(f"{where}.{key}", value, "must be a number")
    if not lo <= value <= hi:
        raise FaultSpecError(f"{where}.{key}", value, f"must be between {lo:g} and {hi:g}")
    return float(value)


def _integer(raw: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultSpecError(f"{where}.{key}", value, "must be an integer")
    if not lo <= value <= hi:
        raise FaultSpecError(f"{where}.{key}", value, f"must be between {lo} and {hi}")
    return value


def parse_rule(raw: Any, where: str = "rules[0]") -> FaultRule:
    """One rule from its JSON form; raises `FaultSpecError` naming the field (`where`.key) and value."""
    if not isinstance(raw, dict):
        raise FaultSpecError(where, raw, "must be an object")
    for key in raw:
        if key not in _KNOWN_FIELDS:
            shown = key or '""'
            raise FaultSpecError(
                f"{where}.{shown}", raw[key], f"unknown field; known: {sorted(_KNOWN_FIELDS)}"
            )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise FaultSpecError(f"{where}.name", name, "must be a non-empty string")
    fault = raw.get("fault")
    if fault not in FAULTS:
        raise FaultSpecError(f"{where}.fault", fault, f"must be one of {', '.join(FAULTS)}")
    verbs = _string_list(raw, "verbs", where)
    for i, verb in enumerate(verbs):
        if verb not in VERBS:
            raise FaultSpecError(f"{where}.verbs[{i}]", verb, f"must be one of {', '.join(VERBS)}")
        if verb not in _VERBS_OF[fault]:
            allowed = ", ".join(v for v in VERBS if v in _VERBS_OF[fault])
            raise FaultSpecError(f"{where}.verbs[{i}]", verb, f"a {fault} fault applies only to {allowed}")
    gone_as = raw.get("goneAs", "either")
    if gone_as not in GONE_AS:
        raise FaultSpecError(f"{where}.goneAs", gone_as, f"must be one of {', '.join(GONE_AS)}")
    retry_after = _integer(raw, "retryAfterSeconds", where, 0, MAX_RETRY_AFTER_S)
    if fault == "throttle" and retry_after < 1:
        raise FaultSpecError(f"{where}.retryAfterSeconds", raw.get("retryAfterSeconds"),
                             "a throttle fault needs a Retry-After of at least 1 second")  # fmt: skip
    delay = _number(raw, "delaySeconds", where, default=0.0, hi=MAX_DELAY_S)
    if fault == "slow" and delay <= 0:
        raise FaultSpecError(f"{where}.delaySeconds", raw.get("delaySeconds"),
                             "a slow fault needs a delay above 0 seconds")  # fmt: skip
    return FaultRule(
        name=name,
        fault=fault,
        probability=_number(raw, "probability", where, default=1.0, hi=1.0),
        verbs=verbs,
        resources=_string_list(raw, "resources", where),
        subresources=_string_list(raw, "subresources", where),
        namespaces=_string_list(raw, "namespaces", where),
        user_agents=_string_list(raw, "userAgents", where),
        retry_after_s=retry_after,
        delay_s=delay,
        limit=_integer(raw, "limit", where, 0, 2**62),
        gone_as=gone_as,
    )


def parse_config(raw: Any) -> FaultConfig:
    """`{"seed": int, "rules": [RULE, ...]}` (both optional); raises `FaultSpecError`."""
    if not isinstance(raw, dict):
        raise FaultSpecError("body", raw, 'must be an object {"seed": ..., "rules": [...]}')
    for key in raw:
        if key not in ("seed", "rules"):
            raise FaultSpecError(str(key) or '""', raw[key], "unknown field; known: ['rules', 'seed']")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise FaultSpecError("seed", seed, "must be an integer")
    rules_raw = raw.get("rules", [])
    if rules_raw is None:
        rules_raw = []
    if not isinstance(rules_raw, list):
        raise FaultSpecError("rules", rules_raw, "must be a list of rules")
    rules = tuple(parse_rule(r, f"rules[{i}]") for i, r in enumerate(rules_raw))
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.name in seen:
            raise FaultSpecError(f"rules[{i}].name", rule.name, "must be unique among the rules")
        seen.add(rule.name)
    return FaultConfig(seed=seed, rules=rules)


# -- decisions ----------------------------------------------------------------------------------


@dataclass(slots=True)
class FaultInjector:
    """The current rules, their seeded random source and what was injected. Not thread-safe: the server
    calls it from its one event loop."""

    config: FaultConfig = field(default_factory=FaultConfig)
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    injected_by_rule: collections.Counter[str] = field(default_factory=collections.Counter)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def __post_init__(self) -> None:
        self._rng = random.Random(self.config.seed)

    @property
    def active(self) -> bool:
        return bool(self.config.rules)

    def has(self, fault: str) -> bool:
        return any(r.fault == fault for r in self.config.rules)

    def replace(self, config: FaultConfig) -> None:
        """New rules (a PUT): the random source starts again from the seed, the counters from zero."""
        self.config = config
        self._rng = random.Random(config.seed)
        self.injected.clear()
        self.injected_by_rule.clear()

    def clear(self) -> None:
        """No rules (a DELETE); the counters stay until the next `replace`."""
        self.config = FaultConfig(seed=self.config.seed)

    def decide(self, request: FaultRequest) -> Decision | None:
        """The fault for `request`, if any (counted as injected). Each matching rule draws once."""
        for rule in self.config.rules:
            if not rule.matches(request):
                continue
            if (rule.fault == "gone" and not request.resumed) or (
                rule.fault == "stale-list" and not request.stale_available
            ):
                continue
            if rule.limit and self.injected_by_rule[rule.name] >= rule.limit:
                continue
            if self._rng.random() >= rule.probability:
                continue
            return self._injected(rule)
        return None

    def _injected(self, rule: FaultRule) -> Decision:
        self.injected[rule.fault] += 1
        self.injected_by_rule[rule.name] += 1
        if rule.fault == "drop-watch":
            return Decision(rule, drop_after=self._rng.randint(0, MAX_DROP_AFTER))
        if rule.fault == "gone":
            as_status = rule.gone_as == "status" or (rule.gone_as == "either" and self._rng.random() < 0.5)
            return Decision(rule, gone_status=as_status)
        return Decision(rule)

    def to_json(self) -> dict[str, Any]:
        """GET /hami-sim/faults."""
        return {
            **self.config.to_json(),
            "injected": dict(sorted(self.injected.items())),
            "injectedByRule": dict(sorted(self.injected_by_rule.items())),
        }


def stale_key(resource: str, namespace: str, label: str, field_selector: str) -> tuple[str, ...]:
    """Which earlier list a stale list repeats: the same resource, namespace and selectors."""
    return (resource, namespace, label, field_selector)


__all__ = [
    "FAULTS",
    "VERBS",
    "Decision",
    "FaultConfig",
    "FaultInjector",
    "FaultRequest",
    "FaultRule",
    "FaultSpecError",
    "parse_config",
    "parse_rule",
    "stale_key",
]
