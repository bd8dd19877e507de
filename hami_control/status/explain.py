"""`kubectl hami explain pod NAME`: why a pod is pending, node by node, in plain words; or where it runs and
on which GPUs and devices. Pure.

A pod not yet on a node is fitted on every node with the extender's own code: `extender.read_pod_ask` (its
request, selectors, policies, and what it asks of the other vendors), checked against its namespace's
quota without itself (`scheduling.QuotaWithoutPod`, NVIDIA's and the vendors' usage, as the extender
does), then `PodAsk.fit` on each node's `ClusterCache.node_gpus` and, for a pod asking other vendors,
`ClusterCache.vendor_devices` (HAMi's per-vendor Fit). A node that does not fit gets HAMi's reason text
(`FitFailure.message`, the FailedNodes text kube-scheduler records) and one sentence per reason:
NVIDIA's (`reason_sentence`) or the vendor path's, read from HAMi's GenReason text
(`vendor_reason_sentences`). A node with the register annotation that hami-control does not count gives
the cache's reason, and a vendor inventory it leaves out (`ClusterCache.vendor_problems`) of a vendor
the pod asks is said too. Nodes without any device of the kinds the pod asks are only counted. What the
extender does not decide (node selectors, affinity, taints, CPU and memory) is left to the pod's events,
which are shown (warnings first).

A pod on a node: its phase, HAMi's bind phase (`hami.io/bind-phase`) and its GPUs per container from the
allocation annotations, its other vendors' devices from each vendor's allocated (else to-allocate)
annotation, each with its vendor (or, for a pod using DRA claims, its claims' devices).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hami_api import annotations as ann
from hami_api.errors import RequestError, WireFormatError
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations
from hami_api.resources import ContainerRequest, pod_containers
from hami_api.types import PodAllocation
from hami_control.cache import TERMINAL_PHASES
from hami_control.devices import standard
from hami_control.devices.base import DeviceRequest
from hami_control.extender import ExtenderArgsError, PodAsk, read_pod_ask
from hami_control.fit import Fit, FitFailure, Reason
from hami_control.quota import requests_quota_usage, vendor_requests_usage
from hami_control.scheduling import QuotaWithoutPod
from hami_control.status.dra import claim_shares, dra_gpus, pod_claim_names
from hami_control.status.nvidia_modes import placement_text
from hami_control.status.snapshot import Json, Snapshot, annotations_of, name_of, namespace_of
from hami_control.status.vendors import NVIDIA_FAMILY
from hami_control.usage import GPUUsage, NodeGPUs

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
        case Reason.CARD_MIG_TOPOLOGY_INFEASIBLE:
            return (
                f"{some} are in MIG mode and have no MIG profile with the {memory} asked at a free placement"
            )
        case Reason.RESOURCE_QUOTA_NOT_FIT:
            where = f"namespace {namespace}" if namespace else "the namespace"
            return f"{some} would take {where} over its GPU quota (kubectl hami quota)"


# --- the other vendors' reasons -----------------------------------------------------------------------------


def _vendor_memory_text(request: DeviceRequest) -> str:
    if request.memreq > 0:
        return f"{request.memreq} MiB"
    if 0 < request.mem_percentage <= 100:
        return f"{request.mem_percentage}% of a device's memory"
    return "no memory"


def vendor_ask_text(word: str, family: str, request: DeviceRequest) -> str:
    """`1 DCU device (hygon) with 4000 MiB and a core request of 30`: one request of another vendor
    (`word`: its common word; cores in the vendor's own unit)."""
    devices = f"{request.nums} {word} device{'s' if request.nums != 1 else ''}"
    each = " each" if request.nums > 1 else ""
    memory = _vendor_memory_text(request)
    return f"{devices} ({family}) with {memory} and a core request of {request.coresreq}{each}"


_GEN_REASON = re.compile(r"(\d+)/(\d+) (\S+)")
"""One part of HAMi's GenReason text: `<devices>/<devices given to Fit> <Reason>`."""

_UNHEALTHY = "{some} are unhealthy (their device plugin reports them so)"
_VENDOR_REASONS: dict[str, str] = {
    standard.CARD_NOT_HEALTH: _UNHEALTHY,
    "CardUnhealthy": _UNHEALTHY,
    standard.CARD_TYPE_MISMATCH: (
        "{some} are of a type the pod rules out (the vendor's use/nouse type annotations)"
    ),
    standard.CARD_UUID_MISMATCH: (
        "{some} are not among the devices the pod allows (the vendor's use/nouse UUID annotations)"
    ),
    standard.CARD_TIME_SLICING_EXHAUSTED: (
        "{some} have no free slot: each is shared by as many containers as it is split into"
    ),
    standard.CARD_COMPUTE_UNITS_EXHAUSTED: (
        "{some} have all their cores taken, and a container asking no cores cannot join them"
    ),
    standard.CARD_INSUFFICIENT_MEMORY: (
        "{some} have less free memory than the {memory} asked "
        "(the most free on one device: {most_memory} MiB)"
    ),
    standard.CARD_INSUFFICIENT_CORE: (
        "{some} have fewer free cores than the {cores} asked (the most free on one device: {most_cores})"
    ),
    standard.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: (
        "{some} are in use, and the container wants a device to itself (all its cores, or the mutex policy)"
    ),
    standard.NUMA_NOT_FIT: "{some} cannot be used together (the vendor's NUMA, link or topology rule)",
    standard.MODE_NOT_FIT: "{some} are not in the mode or profile the pod asks",
    standard.CARD_NOT_FOUND_CUSTOM_FILTER_RULE: "{some} are ruled out by the vendor's own filter rule",
    "CardQosPolicyMismatch": "{some} run another QoS policy than the pod asks",
    "CardAppClassMismatch": "{some} hold pods of another app class",
    standard.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: "{some} would take it, but the container asks for {nums}",
    standard.RESOURCE_QUOTA_NOT_FIT: "{some} would take {where} over its quota (kubectl hami quota)",
}
"""HAMi's reason words of the vendors' Fit (`devices.standard` and the vendors' own), as sentences."""


def _of_kind(devices: NodeGPUs | None, word: str) -> list[GPUUsage]:
    """The node's devices a request of `word` is handed (HAMi: the Type contains the word)."""
    wanted = word.lower()
    return [g for g in (devices.gpus if devices is not None else ()) if wanted in g.info.type.lower()]


def vendor_reason_sentences(
    text: str,
    requests: Sequence[tuple[str, DeviceRequest]],
    devices: NodeGPUs | None,
    *,
    namespace: str = "",
) -> tuple[str, ...]:
    """One sentence per part of a vendor Fit's text (HAMi's GenReason, `1/2 CardInsufficientMemory, ...`, or
    `NodeInsufficientDevice` alone) for the container whose `requests` (common word, request) failed,
    over the node's devices of the other vendors (`devices`)."""
    word, request = requests[0] if len(requests) == 1 else ("", None)
    kind = f"{word} devices" if word else "devices"
    same = _of_kind(devices, word) if word else list(devices.gpus if devices is not None else ())
    healthy = [g for g in same if g.healthy]
    values = {
        "memory": _vendor_memory_text(request) if request is not None else "memory",
        "cores": request.coresreq if request is not None else "cores",
        "nums": request.nums if request is not None else "more",
        "most_memory": max((g.free_mem for g in healthy), default=0),
        "most_cores": max((g.free_cores for g in healthy), default=0),
        "where": f"namespace {namespace}" if namespace else "the namespace",
    }
    out: list[str] = []
    for part in text.split(", "):
        if part == standard.NODE_INSUFFICIENT_DEVICE:
            if request is None:
                out.append("the node has fewer devices of a kind than the container asks")
            elif not same:
                out.append(f"the node has no {kind} hami-control counts")
            else:
                have = len(same)
                out.append(f"the node has {have} {kind}, fewer than the {request.nums} the container asks")
            continue
        match = _GEN_REASON.fullmatch(part)
        if match is None:
            out.append(part)
            continue
        count, cards, reason = match.groups()
        some = f"{count} of {cards} {kind}"
        template = _VENDOR_REASONS.get(reason, "{some}: " + reason)
        out.append(template.format(some=some, **values))
    return tuple(out)


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
    """One GPU or device a container (or a DRA claim) holds."""

    holder: str
    uuid: str
    index: int | None
    model: str
    memory: int
    cores: int
    vendor: str = NVIDIA_FAMILY
    mig: MigAllocation | None = None
    """On a GPU in HAMi's dynamic MIG mode: the MIG device reserved for it (profile, placement, and the
    MIG UUID once hami-node created it), from `hami.io/vgpu-mig-allocations`."""
    """`nvidia`, or the family of the device's vendor."""


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
    """Nodes without any HAMi device of the kinds the pod asks (no NVIDIA register annotation for a GPU
    ask; no device, and no inventory left out, of the vendors it asks)."""
    notes: tuple[str, ...] = ()
    events: tuple[EventLine, ...] = field(default_factory=tuple)
    asks_vendors: bool = False
    """Whether the pending pod asks devices of other vendors than NVIDIA."""


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


def _mig_reservations(annotations: Mapping[str, Any]) -> tuple[MigAllocation, ...]:
    text = annotations.get(MIG_ALLOCATIONS)
    if not isinstance(text, str) or not text:
        return ()
    try:
        return decode_mig_allocations(text)
    except WireFormatError:
        return ()


def _mig_of(
    reservations: Sequence[MigAllocation], container: int, device: int, uuid: str
) -> MigAllocation | None:
    """The reservation of a container's device: the one at (container, device), else the container's
    first on the same GPU."""
    mine = [a for a in reservations if a.container_index == container]
    exact = next((a for a in mine if a.device_index == device and a.gpu_uuid == uuid), None)
    return exact or next((a for a in mine if a.gpu_uuid == uuid), None)


def mig_text(a: MigAllocation) -> str:
    """`MIG 3g.20gb at slices [0-3], MIG-... (GPU instance 1, compute instance 0)`, or `..., not created
    yet` before hami-node recorded the instance."""
    where = f"MIG {a.profile} at slices {placement_text(a.placement)}"
    if not a.runtime_ready:
        return f"{where}, not created yet"
    return (
        f"{where}, {a.mig_uuid} (GPU instance {a.gpu_instance_id}, compute instance {a.compute_instance_id})"
    )


def _placements(snapshot: Snapshot, pod: Json, node: str) -> list[Placement]:
    out: list[Placement] = []
    allocation = _allocation(annotations_of(pod))
    reservations = _mig_reservations(annotations_of(pod))
    gpus = snapshot.gpus.node_gpus(node)
    names = _container_names(pod)
    if allocation is not None:
        for i, container in enumerate(allocation.containers):
            holder = names[i] if i < len(names) else f"#{i}"
            for d, s in enumerate(container.devices):
                gpu = gpus.gpu(s.uuid) if gpus is not None else None
                index = gpu.info.index if gpu is not None else None
                model = gpu.info.type if gpu is not None else "?"
                mig = _mig_of(reservations, i, d, s.uuid)
                out.append(Placement(holder, s.uuid, index, model, s.usedmem, s.usedcores, mig=mig))
    out += _vendor_placements(snapshot, pod, node, names)
    claims = set(pod_claim_names(pod))
    if claims:
        devices = dra_gpus(snapshot.slices)
        mine = [c for c in snapshot.claims if namespace_of(c) == namespace_of(pod) and name_of(c) in claims]
        for share in claim_shares(mine, devices):
            info = devices[share.device].info
            out.append(Placement(share.claim, info.id, info.index, info.type, share.memory, share.cores))
    return out


def _vendor_placements(snapshot: Snapshot, pod: Json, node: str, names: Sequence[str]) -> list[Placement]:
    """The pod's devices of the other vendors, from each vendor's allocated (else to-allocate) annotation."""
    out: list[Placement] = []
    annotations = annotations_of(pod)
    devices = snapshot.gpus.vendor_devices(node)
    for vendor in snapshot.config.registry.others:
        for key in (vendor.names.allocated, vendor.names.to_allocate):
            text = annotations.get(key) if key else None
            if not isinstance(text, str) or not text:
                continue
            try:
                allocation = ann.decode_pod_allocation(text, key)
            except WireFormatError:
                break
            for i, container in enumerate(allocation.containers):
                holder = names[i] if i < len(names) else f"#{i}"
                for s in container.devices:
                    device = devices.gpu(s.uuid) if devices is not None else None
                    index = device.info.index if device is not None else None
                    model = device.info.type if device is not None else s.vendor
                    family = vendor.names.family
                    out.append(Placement(holder, s.uuid, index, model, s.usedmem, s.usedcores, family))
            break
    return out


def _bound_summary(phase: str, node: str, bind_phase: str, placements: Sequence[Placement]) -> str:
    on = f"on node {node}"
    if phase == "Running":
        what = "GPU" if all(p.vendor == NVIDIA_FAMILY for p in placements) else "device"
        return f"Running {on}" + (
            f" with {len(placements)} {what} share(s)." if placements else ", holding no HAMi GPU."
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


def _chosen(result: Fit, gpus: NodeGPUs | None, devices: NodeGPUs | None) -> tuple[str, ...]:
    """The GPUs and devices a fit chose, as `GPU 0 (<uuid>)` and `DCU 1 (<uuid>)`."""
    shown = []
    for i, container in enumerate(result.allocation.containers):
        for d, uuid in enumerate(s.uuid for s in container.devices):
            gpu = gpus.gpu(uuid) if gpus is not None else None
            text = f"GPU {gpu.info.index} ({uuid})" if gpu is not None else uuid
            mig = _mig_of(result.mig, i, d, uuid)
            if mig is not None:
                text += f" as MIG {mig.profile} at slices {placement_text(mig.placement)}"
            shown.append(text)
    for word, allocation in result.vendors.allocations.items() if result.vendors is not None else ():
        for uuid in (s.uuid for c in allocation.containers for s in c.devices):
            device = devices.gpu(uuid) if devices is not None else None
            shown.append(f"{word} {device.info.index} ({uuid})" if device is not None else f"{word} ({uuid})")
    return tuple(shown)


def _asks_here(
    snapshot: Snapshot, ask: PodAsk, name: str, families: set[str]
) -> tuple[bool, tuple[str, ...]]:
    """Whether the node has devices of a kind the pod asks (or an inventory of them left out), and the
    problems of the asked vendors' inventories there."""
    cache = snapshot.gpus
    problems = tuple(p for p in cache.vendor_problems(name) if p.split(":", 1)[0] in families)
    nvidia = ask.asks_nvidia and (cache.node_gpus(name) is not None or snapshot.has_register(name))
    devices = cache.vendor_devices(name)
    of_type = snapshot.families.of_type
    vendors = devices is not None and any(of_type(g.info.type) in families for g in devices.gpus)
    return nvidia or vendors or bool(problems), problems


def _fit_nodes(snapshot: Snapshot, ask: PodAsk, namespace: str) -> tuple[list[NodeVerdict], list[str]]:
    verdicts: list[NodeVerdict] = []
    without: list[str] = []
    cache = snapshot.gpus
    families = {v.names.family for v in ask.vendors.vendors} if ask.vendors is not None else set()
    for name in sorted(snapshot.nodes):
        relevant, problems = _asks_here(snapshot, ask, name, families)
        if not relevant:
            without.append(name)
            continue
        gpus = cache.node_gpus(name)
        devices = cache.vendor_devices(name) if ask.vendors is not None else None
        if gpus is None and (ask.asks_nvidia or devices is None):
            # As the extender's filter: the node has nothing the pod can use, whatever the usage. A GPU
            # ask gets the cache's reason (the filter's text); a vendor ask the inventories left out.
            if ask.asks_nvidia:
                why = cache.unregistered_reason(name) or "node unregistered"
                left_out = [f"devices left out: {p}" for p in problems]
            else:
                why = "; ".join(problems) or standard.NODE_INSUFFICIENT_DEVICE
                left_out = [
                    f"its {p.split(':', 1)[0]} devices are left out until their device plugin publishes a "
                    "usable inventory"
                    for p in problems
                ]
            if ask.asks_nvidia and gpus is None and not snapshot.has_register(name):
                left_out.append("the node has no NVIDIA GPU hami-control counts")
            if ask.vendors is not None and devices is None and not problems:
                words = ", ".join(ask.vendors.words)
                left_out.append(f"the node has no {words} devices hami-control counts")
            verdicts.append(NodeVerdict(name, False, why, tuple(left_out), unresolvable=True))
            continue
        result = ask.fit(gpus, devices)
        if isinstance(result, Fit):
            verdicts.append(NodeVerdict(name, True, gpus=_chosen(result, gpus, devices)))
            continue
        assert isinstance(result, FitFailure)
        sentences: tuple[str, ...]
        if result.text and not result.reasons and ask.vendors is not None:  # the vendor path's failure
            requests = ask.vendors.requests
            asked = requests[result.container] if result.container < len(requests) else ()
            asked = asked or next((r for r in requests if r), ())  # a failure before any container's Fit
            sentences = vendor_reason_sentences(result.text, asked, devices, namespace=namespace)
            sentences += tuple(f"devices left out: {p}" for p in problems)
        else:
            request = ask.requests[result.container][0] if result.container < len(ask.requests) else None
            sentences = tuple(
                reason_sentence(reason, count, result.gpus, request, node=gpus, namespace=namespace)
                for reason, count in result.reasons
            )
        verdicts.append(NodeVerdict(name, False, result.message, sentences, result.unresolvable))
    return verdicts, without


def _pending_summary(verdicts: Sequence[NodeVerdict], vendors: bool = False) -> str:
    what = "devices" if vendors else "GPUs"
    fitting = [v.node for v in verdicts if v.fits]
    if fitting:
        return (
            f"hami-control's filter finds {len(fitting)} node(s) that fit its {what} now "
            f"({', '.join(fitting)}): "
            "it waits for something the extender does not decide (node selector, affinity, taints, "
            "CPU or memory) or for kube-scheduler's next try; see the events."
        )
    if not verdicts:
        if vendors:
            return (
                "No node has HAMi devices of the kinds it asks: their device plugins do not run on any "
                "node, or have not registered their devices."
            )
        return "No node has HAMi GPUs: hami-node does not run on any node, or has not registered its GPUs."
    if all(v.unresolvable for v in verdicts):
        return (
            f"No node can ever fit its {what} as it asks (too few {what}, or too few of the kind it names)."
        )
    return f"No node has room for its {what} now; it waits until {what} free up (per node below)."


def _asks(ask: PodAsk, names: Sequence[str], snapshot: Snapshot) -> tuple[str, ...]:
    """One line per request: NVIDIA's (`ask_text`) and the other vendors' (`vendor_ask_text`)."""
    out = []
    by_word = {v.names.common_word: v for v in snapshot.config.registry.others}
    for i, (request, init) in enumerate(ask.requests):
        who = f"container {names[i] if i < len(names) else i}{' (init)' if init else ''}"
        if request is not None:
            out.append(f"{who}: {ask_text(request)}")
        for word, wanted in ask.vendors.requests[i] if ask.vendors is not None else ():
            vendor = by_word.get(word)
            family = vendor.names.family if vendor is not None else snapshot.families.of_type(word)
            out.append(f"{who}: {vendor_ask_text(word, family, wanted)}")
    return tuple(out)


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
    asks = _asks(ask, _container_names(pod), snapshot)
    own = requests_quota_usage(ask.requests)
    if ask.vendors is not None:
        own += vendor_requests_usage(ask.vendors.by_container, ask.vendors.inits, ask.vendors.vendors)
    view = snapshot.quota_view
    quota = QuotaWithoutPod(view, ask.namespace, own) if own.memory or own.cores or own.others else view
    ask = ask.under_quota(quota, config)
    verdicts, without = _fit_nodes(snapshot, ask, namespace)
    return make(
        summary=_pending_summary(verdicts, ask.vendors is not None),
        asks=asks,
        verdicts=tuple(verdicts),
        without_gpus=tuple(without),
        notes=tuple(notes),
        events=lines,
        asks_vendors=ask.vendors is not None,
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
        nvidia_only = all(p.vendor == NVIDIA_FAMILY for p in e.placements)
        lines.append("GPUs:" if nvidia_only else "GPUs and devices:")
        for p in e.placements:
            if p.vendor == NVIDIA_FAMILY:
                index = f"GPU {p.index} " if p.index is not None else ""
                lines.append(
                    f"  {p.holder}: {index}{p.uuid} ({p.model}): {p.memory} MiB, {p.cores}% of the cores"
                )
                if p.mig is not None:
                    lines.append(f"    {mig_text(p.mig)}")
                continue
            index = f" {p.index}" if p.index is not None else ""
            lines.append(
                f"  {p.holder}: {p.vendor} device{index} {p.uuid} ({p.model}): {p.memory} MiB, "
                f"core request {p.cores}"
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
            kinds = "HAMi GPUs" if not e.asks_vendors else "HAMi devices of the kinds it asks"
            lines.append(f"  {len(e.without_gpus)} node(s) without {kinds}: {', '.join(e.without_gpus)}")
    if e.events:
        lines.append("Events:")
        for ev in e.events:
            times = f" (x{ev.count})" if ev.count > 1 else ""
            lines.append(f"  {ev.type} {ev.reason}{times}: {ev.message}")
    return "\n".join(lines)


def _mig_dict(a: MigAllocation) -> dict[str, Any]:
    return {
        "profile": a.profile,
        "placement": {"start": a.placement.start, "size": a.placement.size},
        "slices": placement_text(a.placement),
        "migUUID": a.mig_uuid or None,
        "gpuInstanceID": a.gpu_instance_id,
        "computeInstanceID": a.compute_instance_id,
    }


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
                "vendor": p.vendor,
                "uuid": p.uuid,
                "index": p.index,
                "model": p.model,
                "memoryMiB": p.memory,
                "cores": p.cores,
                **({"mig": _mig_dict(p.mig)} if p.mig is not None else {}),
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
    "mig_text",
    "reason_sentence",
    "render_explanation",
    "vendor_ask_text",
    "vendor_reason_sentences",
]
