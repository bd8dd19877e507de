"""`kubectl hami explain pod NAME`: why a pod is pending, node by node, in plain words; or where it runs and
on which GPUs. Pure.

A pod not yet on a node is fitted on every node with the extender's own code: `extender.read_pod_ask` (its
request, selectors, policies), checked against its namespace's quota without itself
(`scheduling.QuotaWithoutPod`, as the extender does), then `PodAsk.fit` (`fit.fit_pod`) on each node's
`ClusterCache.node_gpus`. A node that does not fit gets HAMi's reason text (`FitFailure.message`, the
FailedNodes text kube-scheduler records) and one sentence per reason (`reason_sentence`). A node with
the register annotation that hami-control does not count gives the cache's reason. What the extender does
not decide (node selectors, affinity, taints, CPU and memory) is left to the pod's events, which are shown
(warnings first).

A pod on a node: its phase, HAMi's bind phase (`hami.io/bind-phase`) and its GPUs per container from the
allocation annotations (or, for a pod using DRA claims, its claims' devices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hami_api import annotations as ann
from hami_api.errors import RequestError, WireFormatError
from hami_api.resources import ContainerRequest, pod_containers
from hami_api.types import PodAllocation
from hami_control.cache import TERMINAL_PHASES
from hami_control.extender import ExtenderArgsError, PodAsk, read_pod_ask
from hami_control.fit import Fit, FitFailure, Reason
from hami_control.quota import requests_quota_usage
from hami_control.scheduling import QuotaWithoutPod
from hami_control.status.dra import claim_shares, dra_gpus, pod_claim_names
from hami_control.status.snapshot import Json, Snapshot, annotations_of, name_of, namespace_of
from hami_control.usage import NodeGPUs

MAX_EVENTS = 8


# --- reasons in plain words --------------------------------------------------------------------------------


def _memory_text(request: ContainerRequest) -> str:
    if request.memreq > 0:
        return f"{request.memreq} MiB"
    if request.mem_percentage is not None:
        return f"{request.mem_percentage}% of the GPU's memory"
    return "no memory"


def ask_text(request: ContainerRequest) -> str:
    """`1 GPU with 8000 MiB and 25% of its cores`."""
    gpus = "1 GPU" if request.nums == 1 else f"{request.nums} GPUs"
    each = " each" if request.nums > 1 else ""
    return f"{gpus} with {_memory_text(request)} and {request.coresreq}% of the cores{each}"


def reason_sentence(
    reason: Reason,
    count: int,
    gpus: int,
    request: ContainerRequest | None,
    *,
    node: NodeGPUs | None = None,
    namespace: str = "",
) -> str:
    """One HAMi reason (`fit.Reason`) with its count, as a sentence a user can act on."""
    some = f"{count} of {gpus} GPUs"
    nums = request.nums if request is not None else 0
    memory = _memory_text(request) if request is not None else "the memory"
    cores = request.coresreq if request is not None else 0
    healthy = [g for g in node.gpus if g.healthy and not g.cordoned] if node is not None else []
    match reason:
        case Reason.CARD_TYPE_MISMATCH:
            return (
                f"{some} are of a type or mode the pod rules out "
                f"({ann.USE_GPU_TYPE}, {ann.NOUSE_GPU_TYPE}, {ann.VGPU_MODE})"
            )
        case Reason.CARD_UUID_MISMATCH:
            return f"{some} are not among the GPUs the pod allows ({ann.USE_GPU_UUID}, {ann.NOUSE_GPU_UUID})"
        case Reason.CARD_TIME_SLICING_EXHAUSTED:
            return f"{some} have no free slice: each is shared by as many containers as it is split into"
        case Reason.CARD_COMPUTE_UNITS_EXHAUSTED:
            return f"{some} have all their cores taken, and a container asking no cores cannot join them"
        case Reason.CARD_INSUFFICIENT_MEMORY:
            most = max((g.free_mem for g in healthy), default=0)
            return (
                f"{some} have less free memory than the {memory} asked (the most free on one GPU: {most} MiB)"
            )
        case Reason.CARD_INSUFFICIENT_CORE:
            most = max((g.free_cores for g in healthy), default=0)
            return f"{some} have fewer free cores than the {cores}% asked (the most free on one GPU: {most}%)"
        case Reason.CARD_NOT_HEALTH:
            return f"{some} are unhealthy (hami-node reports them so)"
        case Reason.CARD_CORDONED:
            return f"{some} are cordoned ({ann.DEVICE_CORDON})"
        case Reason.NUMA_NOT_FIT:
            return f"{some} cannot be used together on one NUMA node ({ann.NUMA_BIND})"
        case Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT:
            return (
                f"{some} are in use, and the container wants a GPU to itself "
                "(100% of the cores, or the mutex policy)"
            )
        case Reason.NODE_INSUFFICIENT_DEVICE:
            return f"the node has {gpus} GPUs, fewer than the {nums} the container asks"
        case Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST:
            return f"{some} would take it, but the container asks for {nums}"
        case Reason.RESOURCE_QUOTA_NOT_FIT:
            where = f"namespace {namespace}" if namespace else "the namespace"
            return f"{some} would take {where} over its GPU quota (kubectl hami quota)"


# --- the model ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    fits: bool
    reason: str = ""
    """HAMi's FailedNodes text (empty when it fits)."""
    sentences: tuple[str, ...] = ()
    unresolvable: bool = False
    """No change in usage can make it fit (too few GPUs, or too few of the kind asked)."""
    gpus: tuple[str, ...] = ()
    """When it fits: the GPUs the extender would choose now."""


@dataclass(frozen=True, slots=True)
class Placement:
    """One GPU a container (or a DRA claim) holds."""

    holder: str
    uuid: str
    index: int | None
    model: str
    memory: int
    cores: int


@dataclass(frozen=True, slots=True)
class EventLine:
    type: str
    reason: str
    message: str
    count: int
    last: str


@dataclass(frozen=True, slots=True)
class Explanation:
    namespace: str
    name: str
    phase: str
    node: str
    bind_phase: str
    summary: str
    asks: tuple[str, ...] = ()
    placements: tuple[Placement, ...] = ()
    verdicts: tuple[NodeVerdict, ...] = ()
    without_gpus: tuple[str, ...] = ()
    """Nodes without HAMi GPUs (no register annotation)."""
    notes: tuple[str, ...] = ()
    events: tuple[EventLine, ...] = field(default_factory=tuple)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _container_names(pod: Json) -> list[str]:
    try:
        return [str(c.get("name") or "?") for c, _ in pod_containers(pod)]
    except RequestError:
        return []


def _events(events: Sequence[Json]) -> tuple[EventLine, ...]:
    lines = []
    for e in events:
        last = str(
            e.get("lastTimestamp")
            or e.get("eventTime")
            or _mapping(e.get("metadata")).get("creationTimestamp")
            or ""
        )
        lines.append(
            EventLine(
                str(e.get("type") or ""),
                str(e.get("reason") or ""),
                str(e.get("message") or "").strip(),
                int(e.get("count") or 1),
                last,
            )
        )
    warnings = sorted((e for e in lines if e.type == "Warning"), key=lambda e: e.last, reverse=True)
    others = sorted((e for e in lines if e.type != "Warning"), key=lambda e: e.last, reverse=True)
    return tuple((warnings + others)[:MAX_EVENTS])


def _allocation(annotations: Mapping[str, Any]) -> PodAllocation | None:
    for key in (ann.DEVICES_ALLOCATED, ann.DEVICES_TO_ALLOCATE):
        text = annotations.get(key)
        if isinstance(text, str) and text:
            try:
                return ann.decode_pod_allocation(text, key)
            except WireFormatError:
                return None
    return None


def _placements(snapshot: Snapshot, pod: Json, node: str) -> list[Placement]:
    out: list[Placement] = []
    allocation = _allocation(annotations_of(pod))
    gpus = snapshot.gpus.node_gpus(node)
    names = _container_names(pod)
    if allocation is not None:
        for i, container in enumerate(allocation.containers):
            holder = names[i] if i < len(names) else f"#{i}"
            for s in container.devices:
                gpu = gpus.gpu(s.uuid) if gpus is not None else None
                index = gpu.info.index if gpu is not None else None
                model = gpu.info.type if gpu is not None else "?"
                out.append(Placement(holder, s.uuid, index, model, s.usedmem, s.usedcores))
    claims = set(pod_claim_names(pod))
    if claims:
        devices = dra_gpus(snapshot.slices)
        mine = [c for c in snapshot.claims if namespace_of(c) == namespace_of(pod) and name_of(c) in claims]
        for share in claim_shares(mine, devices):
            info = devices[share.device].info
            out.append(Placement(share.claim, info.id, info.index, info.type, share.memory, share.cores))
    return out


def _bound_summary(phase: str, node: str, bind_phase: str, placements: Sequence[Placement]) -> str:
    on = f"on node {node}"
    if phase == "Running":
        return f"Running {on}" + (
            f" with {len(placements)} GPU share(s)." if placements else ", holding no HAMi GPU."
        )
    if phase in TERMINAL_PHASES:
        return f"{phase} {on}; it holds nothing any more."
    if bind_phase == "allocating":
        return (
            f"Bound to node {node}; hami-control chose its GPUs and waits for hami-node on {node} "
            "to allocate them (kubelet's Allocate): the container starts after that."
        )
    if bind_phase == "failed":
        return (
            f"Bound to node {node}, but the GPU allocation failed there (bind phase failed); see the events."
        )
    return f"Bound to node {node}, phase {phase}: the kubelet is starting it; see the events."


def _fit_nodes(snapshot: Snapshot, ask: PodAsk, namespace: str) -> tuple[list[NodeVerdict], list[str]]:
    verdicts: list[NodeVerdict] = []
    without: list[str] = []
    for name in sorted(snapshot.nodes):
        gpus = snapshot.gpus.node_gpus(name)
        if gpus is None:
            if snapshot.has_register(name):
                why = snapshot.gpus.unregistered_reason(name) or "node unregistered"
                verdicts.append(NodeVerdict(name, False, why, unresolvable=True))
            else:
                without.append(name)
            continue
        result = ask.fit(gpus)
        if isinstance(result, Fit):
            chosen = [s.uuid for c in result.allocation.containers for s in c.devices]
            shown = []
            for uuid in chosen:
                gpu = gpus.gpu(uuid)
                shown.append(f"GPU {gpu.info.index} ({uuid})" if gpu is not None else uuid)
            verdicts.append(NodeVerdict(name, True, gpus=tuple(shown)))
            continue
        assert isinstance(result, FitFailure)
        request = ask.requests[result.container][0] if result.container < len(ask.requests) else None
        sentences = tuple(
            reason_sentence(reason, count, result.gpus, request, node=gpus, namespace=namespace)
            for reason, count in result.reasons
        )
        verdicts.append(NodeVerdict(name, False, result.message, sentences, result.unresolvable))
    return verdicts, without


def _pending_summary(verdicts: Sequence[NodeVerdict]) -> str:
    fitting = [v.node for v in verdicts if v.fits]
    if fitting:
        return (
            f"hami-control's filter finds {len(fitting)} node(s) that fit its GPUs now "
            f"({', '.join(fitting)}): "
            "it waits for something the extender does not decide (node selector, affinity, taints, "
            "CPU or memory) or for kube-scheduler's next try; see the events."
        )
    if not verdicts:
        return "No node has HAMi GPUs: hami-node does not run on any node, or has not registered its GPUs."
    if all(v.unresolvable for v in verdicts):
        return "No node can ever fit its GPUs as it asks (too few GPUs, or too few of the kind it names)."
    return "No node has room for its GPUs now; it waits until GPUs free up (per node below)."


def build_explanation(snapshot: Snapshot, pod: Json, events: Sequence[Json] = ()) -> Explanation:
    """The model of `kubectl hami explain pod` for `pod` (JSON) over `snapshot`; `events` are the pod's
    Events (core/v1 JSON)."""
    config = snapshot.config
    namespace, name = namespace_of(pod), name_of(pod)
    status = _mapping(pod.get("status"))
    spec = _mapping(pod.get("spec"))
    phase = str(status.get("phase") or "Pending")
    node = str(spec.get("nodeName") or "")
    bind_phase = str(annotations_of(pod).get(ann.BIND_PHASE) or "")
    lines = _events(events)
    make = partial(Explanation, namespace, name, phase, node, bind_phase)
    if node:
        placements = _placements(snapshot, pod, node)
        summary = _bound_summary(phase, node, bind_phase, placements)
        return make(summary=summary, placements=tuple(placements), events=lines)
    if phase in TERMINAL_PHASES:
        return make(summary=f"{phase} without ever being scheduled.", events=lines)
    try:
        ask = read_pod_ask(pod, config)
    except ExtenderArgsError as err:
        return make(summary=f"hami-control cannot read its GPU request: {err}", events=lines)
    notes: list[str] = []
    scheduler = str(spec.get("schedulerName") or "default-scheduler")
    if scheduler != config.webhook.scheduler_name:
        notes.append(
            f"its schedulerName is {scheduler}, not {config.webhook.scheduler_name}: hami-control's extender "
            "is not asked about it (the webhook sets it for GPU pods)"
        )
    if ask is None:
        claims = pod_claim_names(pod) or [
            str(c.get("name")) for c in map(_mapping, spec.get("resourceClaims") or [])
        ]
        if claims:
            summary = "It asks its GPUs through DRA claims: kube-scheduler allocates them; see the events."
        else:
            summary = "It asks no HAMi GPU: hami-control lets every node pass; see the events."
        return make(summary=summary, notes=tuple(notes), events=lines)
    names = _container_names(pod)
    asks = tuple(
        f"container {names[i] if i < len(names) else i}{' (init)' if init else ''}: {ask_text(request)}"
        for i, (request, init) in enumerate(ask.requests)
        if request is not None
    )
    own = requests_quota_usage(ask.requests)
    view = snapshot.quota_view
    quota = QuotaWithoutPod(view, ask.namespace, own) if own.memory or own.cores else view
    ask = ask.under_quota(quota, config)
    verdicts, without = _fit_nodes(snapshot, ask, namespace)
    return make(
        summary=_pending_summary(verdicts),
        asks=asks,
        verdicts=tuple(verdicts),
        without_gpus=tuple(without),
        notes=tuple(notes),
        events=lines,
    )


# --- output ---------------------------------------------------------------------------------------------


def render_explanation(explanation: Explanation) -> str:
    e = explanation
    where = f"on node {e.node}" if e.node else "not on a node"
    bind = f", bind phase {e.bind_phase}" if e.bind_phase else ""
    lines = [f"Pod {e.namespace}/{e.name}: {e.phase}, {where}{bind}.", f"  {e.summary}"]
    lines += [f"  Note: {note}." for note in e.notes]
    if e.asks:
        lines.append("Asks:")
        lines += [f"  {a}" for a in e.asks]
    if e.placements:
        lines.append("GPUs:")
        for p in e.placements:
            index = f"GPU {p.index} " if p.index is not None else ""
            lines.append(
                f"  {p.holder}: {index}{p.uuid} ({p.model}): {p.memory} MiB, {p.cores}% of the cores"
            )
    if e.verdicts or e.without_gpus:
        lines.append("Nodes (hami-control's filter, the extender's fit code):")
        width = max((len(v.node) for v in e.verdicts), default=0)
        for v in e.verdicts:
            if v.fits:
                lines.append(f"  {v.node:<{width}}  fits: would get {', '.join(v.gpus)}")
                continue
            never = "; no change in usage can help" if v.unresolvable else ""
            lines.append(f"  {v.node:<{width}}  does not fit ({v.reason}){never}")
            lines += [f"  {'':<{width}}  - {s}" for s in v.sentences]
        if e.without_gpus:
            lines.append(f"  {len(e.without_gpus)} node(s) without HAMi GPUs: {', '.join(e.without_gpus)}")
    if e.events:
        lines.append("Events:")
        for ev in e.events:
            times = f" (x{ev.count})" if ev.count > 1 else ""
            lines.append(f"  {ev.type} {ev.reason}{times}: {ev.message}")
    return "\n".join(lines)


def explanation_dict(explanation: Explanation) -> dict[str, Any]:
    e = explanation
    return {
        "apiVersion": "hami.io/v1",
        "kind": "PodExplanation",
        "pod": {"namespace": e.namespace, "name": e.name},
        "phase": e.phase,
        "node": e.node or None,
        "bindPhase": e.bind_phase or None,
        "summary": e.summary,
        "notes": list(e.notes),
        "asks": list(e.asks),
        "gpus": [
            {
                "holder": p.holder,
                "uuid": p.uuid,
                "index": p.index,
                "model": p.model,
                "memoryMiB": p.memory,
                "cores": p.cores,
            }
            for p in e.placements
        ],
        "nodes": [
            {
                "name": v.node,
                "fits": v.fits,
                "reason": v.reason or None,
                "why": list(v.sentences),
                "unresolvable": v.unresolvable,
                "wouldGet": list(v.gpus),
            }
            for v in e.verdicts
        ],
        "nodesWithoutGPUs": list(e.without_gpus),
        "events": [
            {"type": ev.type, "reason": ev.reason, "message": ev.message, "count": ev.count, "last": ev.last}
            for ev in e.events
        ],
    }


__all__ = [
    "Explanation",
    "NodeVerdict",
    "Placement",
    "ask_text",
    "build_explanation",
    "explanation_dict",
    "reason_sentence",
    "render_explanation",
]
