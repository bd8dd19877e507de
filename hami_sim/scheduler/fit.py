"""kube-scheduler's own filters and its least-allocated score, on plain Kubernetes JSON (pure).

Filters, in the default profile's order, stopping at the first that fails (its reasons are kube's):

1. NodeUnschedulable: `spec.unschedulable` unless the pod tolerates `node.kubernetes.io/unschedulable`
   -> `node(s) were unschedulable`.
2. TaintToleration: NoSchedule/NoExecute taints the pod does not tolerate -> `node(s) had untolerated
   taint {key: value}`. A node whose Ready condition is not True counts as tainted
   `node.kubernetes.io/not-ready` (`unreachable` when Unknown), NoSchedule: what the node lifecycle
   controller adds in a real cluster.
3. NodeAffinity: `nodeSelector` and required node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt;
   matchFields on metadata.name) -> `node(s) didn't match Pod's node affinity/selector`.
4. NodeResourcesFit: the pod's requests (kube's `PodRequests`: containers summed, init containers at
   their peak with restartable sidecars, overhead) plus those of the pods already on the node (assumed
   ones included) within allocatable -> `Too many pods`, `Insufficient cpu`, `Insufficient <name>`.
   Resources an extender marks `ignoredByScheduler` are skipped; a requested extended resource the
   node does not list is insufficient, and so is every pod on a node without `pods` allocatable (as
   in kube).

Quantities are integers as kube keeps them: cpu in millicores (rounded up), others `Value()` (rounded
up). Score: `NodeResourcesFit` LeastAllocated over cpu and memory (weight 1 each) with the non-zero
defaults for containers that request nothing (100m, 200Mi), 0..100; extender scores are added as
`score * weight * 10` (MaxNodeScore / MaxExtenderPriority).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity

JSON = dict[str, Any]
Resources = dict[str, int]

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"
NO_NODES_AVAILABLE = "no nodes available to schedule pods"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"


def quantity(name: str, value: Any) -> int:
    """A resource quantity as kube-scheduler holds it (cpu: MilliValue, others: Value); unreadable
    values count as 0 (the API server validates them)."""
    try:
        exact = parse_quantity(value)
    except QuantityError:
        return 0
    return math.ceil(exact * 1000) if name == "cpu" else math.ceil(exact)


def _container_requests(container: Mapping[str, Any], non_zero: bool) -> Resources:
    """A container's requests; a resource with limits but no request gets the limit (kube's defaulting);
    with `non_zero`, cpu and memory missing get kube's non-zero defaults."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    out = {name: quantity(name, value) for name, value in limits.items()}
    out.update({name: quantity(name, value) for name, value in requests.items()})
    if non_zero:
        out.setdefault("cpu", DEFAULT_MILLI_CPU_REQUEST)
        out.setdefault("memory", DEFAULT_MEMORY_REQUEST)
    return out


def _add(into: Resources, more: Mapping[str, int]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, 0) + value


def _max(into: Resources, other: Mapping[str, int]) -> None:
    for name, value in other.items():
        if value > into.get(name, 0):
            into[name] = value


def pod_requests(pod: Mapping[str, Any], *, non_zero: bool = False) -> Resources:
    """kube's `PodRequests`: app containers summed; each init container at its peak together with the
    restartable (sidecar) init containers started before it; sidecars also run beside the app
    containers; then `spec.overhead`."""
    spec = pod.get("spec") or {}
    total: Resources = {}
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container, non_zero))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container, non_zero)
        if container.get("restartPolicy") == "Always":
            _add(total, requests)
            _add(sidecars, requests)
            peak = dict(sidecars)
        else:
            peak = dict(requests)
            _add(peak, sidecars)
        _max(init_peak, peak)
    _max(total, init_peak)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0) + quantity(name, value)
    return total


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What a pod needs from a node, computed once per pod object."""

    requests: Resources
    non_zero: tuple[int, int]
    """(milli cpu, memory bytes) with the non-zero defaults, for scoring."""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodAsk:
        nz = pod_requests(pod, non_zero=True)
        return cls(pod_requests(pod), (nz.get("cpu", 0), nz.get("memory", 0)))


# --- nodes ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(slots=True)
class NodeInfo:
    """One node as the scheduler sees it: the Node's fields it filters on, and the running sums of the
    pods on it (bound, or assumed while their bind is in flight)."""

    name: str
    node: JSON | None = None
    labels: dict[str, str] = field(default_factory=dict)
    allocatable: Resources = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    requested: Resources = field(default_factory=dict)
    non_zero_requested: list[int] = field(default_factory=lambda: [0, 0])
    pods: int = 0

    def set_node(self, node: JSON | None) -> None:
        self.node = node
        if node is None:
            self.labels, self.allocatable, self.unschedulable, self.taints = {}, {}, False, ()
            return
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        self.labels = dict(meta.get("labels") or {})
        self.allocatable = {k: quantity(k, v) for k, v in (status.get("allocatable") or {}).items()}
        self.unschedulable = bool(spec.get("unschedulable"))
        taints = [
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or ()
            if isinstance(t, dict)
        ]
        ready = next(
            (
                c.get("status")
                for c in status.get("conditions") or ()
                if isinstance(c, dict) and c.get("type") == "Ready"
            ),
            None,
        )
        if ready != "True":
            key = TAINT_UNREACHABLE if ready == "Unknown" else TAINT_NOT_READY
            if not any(t.key == key for t in taints):
                taints.append(Taint(key, "", "NoSchedule"))
        self.taints = tuple(taints)

    def add_pod(self, ask: PodAsk, sign: int = 1) -> None:
        for name, value in ask.requests.items():
            self.requested[name] = self.requested.get(name, 0) + sign * value
        self.non_zero_requested[0] += sign * ask.non_zero[0]
        self.non_zero_requested[1] += sign * ask.non_zero[1]
        self.pods += sign


def node_projection(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a Node whose change can make a pending pod fit (kube's NodeUpdate event kinds:
    allocatable, labels, taints, unschedulable, conditions, annotations); heartbeat times excluded."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    conditions = sorted(
        (str(c.get("type")), str(c.get("status")))
        for c in status.get("conditions") or ()
        if isinstance(c, dict)
    )
    return (
        sorted((meta.get("labels") or {}).items()),
        sorted((meta.get("annotations") or {}).items()),
        sorted((status.get("allocatable") or {}).items()),
        repr(spec.get("taints")),
        bool(spec.get("unschedulable")),
        conditions,
    )


# --- filters ---------------------------------------------------------------------------------------------


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = t.get("key") or ""
        operator = t.get("operator") or "Equal"
        if key and key != taint.key:
            continue
        if operator == "Exists":
            return True
        if operator == "Equal" and key and (t.get("value") or "") == taint.value:
            return True
    return False


def _match_expression(expr: Mapping[str, Any], value: str | None) -> bool:
    operator = expr.get("operator")
    values = [str(v) for v in expr.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _match_term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for expr in expressions:
        if not _match_expression(expr, labels.get(str(expr.get("key")))):
            return False
    for expr in fields:
        value = name if expr.get("key") == "metadata.name" else None
        if not _match_expression(expr, value):
            return False
    return True


def node_selector_matches(selector: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """A core/v1 NodeSelector (terms ORed, requirements ANDed; matchFields on metadata.name) against a
    node's name and labels (component-helpers' `nodeaffinity.NodeSelector.Match`)."""
    return any(_match_term(term, name, labels) for term in selector.get("nodeSelectorTerms") or ())


def matches_node_affinity(pod: Mapping[str, Any], node: NodeInfo) -> bool:
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is not None:
        return any(_match_term(term, node.name, node.labels) for term in terms)
    return True


def insufficient(ask: PodAsk, node: NodeInfo, ignored: Iterable[str] = ()) -> list[str]:
    """NodeResourcesFit's reasons (empty: fits)."""
    reasons: list[str] = []
    if node.pods + 1 > node.allocatable.get("pods", 0):
        reasons.append(REASON_TOO_MANY_PODS)
    skip = set(ignored)
    for name in sorted(ask.requests):
        want = ask.requests[name]
        if want <= 0 or name in skip or name == "pods":
            continue
        if name not in ("cpu", "memory", "ephemeral-storage") and not _is_scalar(name):
            continue
        if node.requested.get(name, 0) + want > node.allocatable.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons


def _is_scalar(name: str) -> bool:
    """kube's IsScalarResourceName: extended and prefixed native (domain/name), hugepages-,
    attachable-volumes- resources."""
    return "/" in name or name.startswith(("hugepages-", "attachable-volumes-"))


def filter_node(
    pod: Mapping[str, Any], ask: PodAsk, node: NodeInfo, ignored: Iterable[str] = ()
) -> list[str]:
    """The reasons `node` cannot take `pod` (empty: it fits), from the first filter that fails."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or ()
    if node.unschedulable and not _tolerates(tolerations, Taint(TAINT_UNSCHEDULABLE, "", "NoSchedule")):
        return [REASON_UNSCHEDULABLE]
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"]
    if not matches_node_affinity(pod, node):
        return [REASON_AFFINITY]
    return insufficient(ask, node, ignored)


# --- scores and choice ----------------------------------------------------------------------------------


def least_allocated_score(ask: PodAsk, node: NodeInfo) -> int:
    """NodeResourcesFit LeastAllocated over cpu and memory, weight 1 each: 0..100."""
    total = weights = 0
    for i, name in enumerate(("cpu", "memory")):
        capacity = node.allocatable.get(name, 0)
        if capacity == 0:
            continue
        requested = node.non_zero_requested[i] + ask.non_zero[i]
        score = 0 if requested > capacity else (capacity - requested) * MAX_NODE_SCORE // capacity
        total += score
        weights += 1
    return total // weights if weights else 0


def extender_score(score: int, weight: int) -> int:
    """kube's scaling of an extender's 0..10 score into the scheduler's range."""
    return score * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)


def combine_scores(
    own: Mapping[str, int], extenders: Iterable[tuple[Sequence[tuple[str, int]], int]]
) -> dict[str, int]:
    """Total per node: its own score plus, for each extender answer (list of (host, score), weight),
    `score * weight * 10` for hosts among the candidates (others are ignored, as kube does)."""
    totals = dict(own)
    for answer, weight in extenders:
        for host, score in answer:
            if host in totals:
                totals[host] += extender_score(score, weight)
    return totals


def select_host(totals: Mapping[str, int], rng: random.Random) -> str:
    """The highest total; ties broken uniformly at random (kube's reservoir sampling), deterministic
    for a seeded `rng` (candidates taken in name order)."""
    if not totals:
        raise ValueError("empty priority list")
    best = max(totals.values())
    tied = sorted(host for host, score in totals.items() if score == best)
    return tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]


def num_feasible_nodes_to_find(percentage: int | None, all_nodes: int) -> int:
    """kube's `numFeasibleNodesToFind`: every node below 100; otherwise the percentage (adaptive
    50% - nodes/125, at least 5%, when unset or 0), at least 100 nodes."""
    if all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return all_nodes
    if not percentage:
        percentage = max(50 - all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def fit_error_message(num_all_nodes: int, reasons: Mapping[str, Sequence[str]]) -> str:
    """kube's `FitError.Error()`: `0/N nodes are available: <count> <reason>, ....` with the counts
    sorted as strings (Go's sort.Strings)."""
    histogram: dict[str, int] = {}
    for node_reasons in reasons.values():
        for reason in node_reasons:
            histogram[reason] = histogram.get(reason, 0) + 1
    message = f"0/{num_all_nodes} nodes are available:"
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    if parts:
        message += f" {', '.join(parts)}."
    return message


NOTE_LENGTH_LIMIT = 1024


def truncate_message(message: str) -> str:
    """kube's `truncateMessage` for event notes (1 KiB)."""
    if len(message) <= NOTE_LENGTH_LIMIT:
        return message
    return message[: NOTE_LENGTH_LIMIT - 4] + " ..."
