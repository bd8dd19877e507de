"""The control plane's pod store: every pod of the cluster, one `PodRecord` per pod keyed by its uid, read
once per watch event. It is the one sink of the pods reflector (client-go's model: one store per
resource, handlers fed from it); everything else about pods is derived from it, event by event:

- **Quota usage.** Each record carries what the pod counts against its namespace's GPU quota, added to /
  removed from the namespace's running total, so a quota check is two dictionary lookups, never a walk
  over pods. Every non-terminal pod counts (Pending included); Succeeded, Failed and deleted pods do not.
  A pod the webhook translated to DRA asks no HAMi resource any more: it counts what its annotation
  `hami.io/dra-claims` records (`dra_translate.claims_usage`), and only while it asks no HAMi resource,
  so the annotation can never lower what a pod's resources count. It holds no GPU slices here (its
  claims are allocated by kube-scheduler, not by the extender) and asks the extender nothing.
- **GPU holdings.** A pod holds GPU slices when it carries `hami.io/vgpu-node` and is not terminal; the
  slices come from `hami.io/vgpu-devices-allocated` (or `hami.io/vgpu-devices-to-allocate` when that is
  missing or empty), reduced to the pod's footprint with `hami_api.containers.footprint_slices` (init
  containers run one at a time before the regular ones, sidecars beside them). A pod whose annotations
  do not decode holds nothing, with its reason logged once. The store tells `cache.ClusterCache` what
  each pod holds now (`hold`), which moves the slices between nodes. Its MIG reservations
  (`hami.io/vgpu-mig-allocations`, HAMi v2.10's dynamic MIG) ride along, all of them (an instance lives
  as long as the pod); an annotation that does not decode counts as none, so the pod's MIG GPU is taken
  out of service (HAMi's getNodesUsage drops it the same way), with its reason logged once.
- **Binder assumptions.** A pod the binder has bound counts from `assume` on. The first watch event that
  shows the pod with a decodable allocation replaces the assumption (never both); an event that does
  not yet show it (no `hami.io/vgpu-node`, an older copy of the pod) leaves it in place. `forget` drops
  an assumption after a failed bind, `expire` the ones no watch confirmed within a TTL. A terminal or
  deleted pod releases both, and so does a pod the watch shows bound to another node than assumed (a
  bind whose outcome was unknown did not land there). A relist drops the pods it no longer has, but
  pods known only through `assume` stay (their bind may be in flight).
- **Listeners** get (old, new) records on every change, a relist's differences included: the binder's
  pending window reads the bind phase from them.
- **The GPU ask** of a pod is rebuilt from its record (`PodRecord.ask`, requests parsed once per event),
  so `/bind` finds any watched pod's ask here without reading the API.

A delete event names the pod by uid, or (if it carries none) by namespace and name: the store keeps the
uid of every pod it has seen by name, terminal ones included. Pods without a uid are ignored.

Assumed admissions. Between the webhook allowing a pod and the watch showing it there is a window
(the API server still has to store it, then the event has to arrive). A burst of creates inside that
window would each see the same usage and could overshoot the quota together. So the webhook route calls
`ClusterQuotaView.assume()` for every pod it admits (not for dry runs), synchronously, before it
answers: the usage is recorded against the namespace under the pod's name (or, for `generateName` pods,
whose final name is chosen by the API server after admission, under the generateName prefix). The
entry is dropped when the watch shows a new pod of that name (or one with that generateName), or after
`assume_ttl_s` (60 s) when the pod never appears (another webhook denied it, the create failed). A
check therefore counts watched usage + assumed usage: a burst cannot overshoot; a failed create holds
its quota for at most the TTL.
Model: the assumptions and watch-derived holdings are modelled in `protocol_model.py` (`Binder`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from hami_api import annotations as ann
from hami_api.containers import ContainerKind, container_kind, footprint_slices
from hami_api.errors import QuantityError, RequestError, WireFormatError
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations
from hami_api.quantity import parse_quantity
from hami_api.resources import (
    ContainerRequest,
    RequestDefaults,
    ResourceNames,
    container_request,
    pod_containers,
)
from hami_api.types import GPUSlice, PodAllocation
from hami_control.cache import TERMINAL_PHASES, ClusterCache, Held, PodHolding
from hami_control.config import ControlConfig
from hami_control.devices.base import Vendor
from hami_control.devices.registry import Registry
from hami_control.dra_translate import ANNOTATION as DRA_CLAIMS
from hami_control.dra_translate import claims_usage, decode_claims
from hami_control.extender import (
    ASK_ANNOTATIONS,
    ExtenderArgsError,
    PodAsk,
    VendorAsk,
    ask_from_requests,
    read_pod_ask,
    read_vendor_ask,
)
from hami_control.frag import TaskMix
from hami_control.quota import (
    QuotaUsage,
    allocation_quota_usage,
    requests_quota_usage,
    vendor_allocation_usage,
    vendor_requests_usage,
)
from hami_kube.client import JSONDict
from hami_kube.reflector import replace_all

log = logging.getLogger(__name__)


KEPT_ANNOTATIONS = (
    ann.VGPU_NODE,
    ann.VGPU_TIME,
    ann.BIND_PHASE,
    ann.BIND_TIME,
    *ASK_ANNOTATIONS,
)
"""The pod annotations a record keeps: HAMi's bind bookkeeping and what the GPU ask reads. The
allocation annotations are kept in their decoded form only (`PodRecord.held`, `PodRecord.usage`)."""

PodKey = tuple[str, str]
"""(namespace, name)."""

Requests = tuple[tuple[ContainerRequest | None, bool], ...]
"""(request or None, is init container) per container, init containers first."""

MAX_SHAPES = 4096
"""How many distinct pod requests the store shares between records (a bound against odd clusters)."""

_T = TypeVar("_T")
_ZERO = QuotaUsage()
_NO_SIDECARS: frozenset[int] = frozenset()
_BAD_INPUT = (RequestError, WireFormatError, QuantityError)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the control plane keeps of one pod (the rest of the object is dropped)."""

    namespace: str
    name: str
    uid: str
    phase: str
    node_name: str
    scheduler_name: str
    resource_version: str
    container_requests: Requests
    """Per container; empty when the pod's resources do not parse (`request_error` says why)."""
    annotations: Mapping[str, str]
    """The `KEPT_ANNOTATIONS` the pod carries."""
    usage: QuotaUsage
    """What the pod counts against its namespace's GPU quota (zero when terminal or GPU-less)."""
    init_containers: int = 0
    sidecars: frozenset[int] = _NO_SIDECARS
    """Indexes of the restartable init containers."""
    request_error: str = ""
    """Why the pod's GPU resources cannot be read (as `extender.read_pod_ask` says it), if they cannot."""
    held: Held | None = None
    """What the pod holds on its node (None: nothing, terminal, or annotations that do not decode)."""
    held_error: str = ""
    """Why the pod's allocation annotations do not decode, if they do not."""
    cpu_milli: int = 0
    """The pod's CPU request in milli-cores as kube-scheduler counts it (`pod_cpu_milli`); read only under
    `--fragmentation-filter best` or `one`, the users (0 otherwise: ~14 us a pod event saved)."""
    vendor_ask: VendorAsk | None = None
    """What the pod asks of the other vendors (None: nothing)."""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def requests(self) -> tuple[ContainerRequest | None, ...]:
        """Per container, init containers first; empty when the pod's resources do not parse."""
        return tuple(request for request, _ in self.container_requests)

    @property
    def mixed(self) -> bool:
        """It asks NVIDIA GPUs and another vendor's devices."""
        return self.vendor_ask is not None and any(r is not None for r, _ in self.container_requests)

    @property
    def running(self) -> bool:
        return self.phase == "Running"

    @property
    def asks_gpu(self) -> bool:
        return self.vendor_ask is not None or any(r is not None for r, _ in self.container_requests)

    def ask(self, config: ControlConfig, *, mix: TaskMix | None = None) -> PodAsk | None:
        """The pod's GPU ask (without a quota check), as `extender.read_pod_ask` reads it from the pod
        (`mix` as it takes it): None for a pod that asks no GPU. Raises `ExtenderArgsError` for a pod
        whose resources or GPU annotations cannot be read."""
        if self.request_error:
            raise ExtenderArgsError(self.request_error)
        return ask_from_requests(
            self.namespace or "default",
            self.name,
            self.annotations,
            self.container_requests,
            self.sidecars,
            config,
            mix=mix,
            vendors=self.vendor_ask,
        )


def _mapping(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:  # what JSON decodes to: no ABC check (~0.2 us, eight times a pod)
        return value
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class _Vendors:
    """What the pods watch reads of the vendor registry, for one configuration."""

    config: ControlConfig
    registry: Registry
    others: tuple[Vendor, ...]
    resources: frozenset[str]
    """Every resource name of the other vendors."""
    annotations: frozenset[str]
    """Every allocation annotation of the other vendors."""
    containers: dict[bytes, tuple[_Containers, bool]] = field(default_factory=dict, compare=False)
    """What `_containers` read of a pod, and whether a container names another vendor's resource, by
    the pod's containers as JSON (`_pod_containers`)."""


_vendors_read: list[_Vendors] = []


def _vendors(config: ControlConfig) -> _Vendors:
    """The registry's parts the pods watch reads, kept for the last configuration (the property builds
    the registry's key from the settings on every call: ~4 us, twice a pod)."""
    kept = _vendors_read[0] if _vendors_read else None
    if kept is not None and kept.config is config:
        return kept
    registry = config.registry
    others = registry.others
    keys = frozenset(k for v in others for k in (v.names.allocated, v.names.to_allocate) if k)
    kept = _Vendors(config, registry, others, frozenset(r for v in others for r in v.names.resources), keys)
    _vendors_read[:] = [kept]
    return kept


@dataclass(frozen=True, slots=True)
class _Containers:
    """A pod's containers, read once per event."""

    requests: Requests = ()
    sidecars: frozenset[int] = _NO_SIDECARS
    kinds: tuple[ContainerKind, ...] | None = None
    """None when the spec is malformed (`kinds_error` says why)."""
    kinds_error: str = ""
    request_error: str = ""
    """`read_pod_ask`'s message when the GPU resources cannot be read."""


_REQUESTS_KEPT = 4096
_UNREAD = object()
_requests_read: dict[tuple[bytes, bool, ResourceNames, RequestDefaults], ContainerRequest | None] = {}
"""`container_request` by the container's resources as JSON: a cluster's pods repeat a few container
shapes (the same template), and the pods watch reads every pod (150,000 in its list at 15,000 nodes). A
request reads nothing of the container but its resources (its name only for an error, which is never
kept)."""


def _container_request(
    container: Mapping[str, Any], names: ResourceNames, defaults: RequestDefaults, init: bool
) -> ContainerRequest | None:
    """`container_request`, kept by the container's resources (see `_requests_read`)."""
    resources = container.get("resources")
    try:
        key = (orjson.dumps(resources, option=orjson.OPT_SORT_KEYS), init, names, defaults)
    except (orjson.JSONEncodeError, TypeError):
        return container_request(container, names, defaults, init)
    request = _requests_read.get(key, _UNREAD)
    if request is not _UNREAD:
        return request  # type: ignore[return-value]
    request = container_request(container, names, defaults, init)
    if len(_requests_read) >= _REQUESTS_KEPT:
        _requests_read.clear()
    _requests_read[key] = request
    return request


def _containers(pod: Mapping[str, Any], config: ControlConfig) -> _Containers:
    names, defaults = config.requests.names, config.requests.defaults
    try:
        containers = pod_containers(pod)
    except _BAD_INPUT as err:
        return _Containers(kinds_error=str(err), request_error=_ask_error(pod, config))
    kinds = tuple(container_kind(c, init) for c, init in containers)
    try:
        requests = tuple((_container_request(c, names, defaults, init), init) for c, init in containers)
    except _BAD_INPUT:
        return _Containers(kinds=kinds, request_error=_ask_error(pod, config))
    sidecars = frozenset(i for i, kind in enumerate(kinds) if kind is ContainerKind.SIDECAR)
    return _Containers(requests, sidecars or _NO_SIDECARS, kinds)


_CONTAINERS_KEPT = 4096


def _pod_containers(
    pod: Mapping[str, Any], config: ControlConfig, vendors: _Vendors
) -> tuple[_Containers, bool]:
    """`_containers(pod)`, and whether a container names one of the other vendors' resources, kept by the
    pod's init and regular containers as JSON: the pods of one workload have the same containers (and
    the pods list reads every pod, 150,000 at 15,000 nodes). They read nothing else of the pod; a pod
    whose containers cannot be read (its error may name it) is read every time."""
    spec = pod.get("spec")
    key = None
    if type(spec) is dict:
        try:
            key = orjson.dumps((spec.get("initContainers"), spec.get("containers")))
        except (orjson.JSONEncodeError, TypeError):
            key = None
    kept = vendors.containers.get(key) if key is not None else None
    if kept is not None:
        return kept
    containers = _containers(pod, config)
    read = (containers, len(vendors.registry.vendors) > 1 and _names_any(pod, vendors.resources))
    if key is not None and not containers.kinds_error and not containers.request_error:
        if len(vendors.containers) >= _CONTAINERS_KEPT:
            vendors.containers.clear()
        vendors.containers[key] = read
    return read


def _cpu_milli(container: Mapping[str, Any]) -> int:
    requests = _mapping(_mapping(container.get("resources")).get("requests"))
    if "cpu" not in requests:
        return 0
    try:
        return max(0, math.ceil(parse_quantity(requests["cpu"]) * 1000))
    except (QuantityError, TypeError, ValueError):
        return 0


def pod_cpu_milli(pod: Mapping[str, Any]) -> int:
    """The pod's CPU request in milli-cores as kube-scheduler's NodeResourcesFit counts it: the regular
    containers' and restartable init containers' (sidecars') requests summed, or the largest other init
    container's with the sidecars started before it if that is more, plus `spec.overhead` (kubernetes
    staging/src/k8s.io/component-helpers/resource/helpers.go `PodRequests`). A request that does not
    parse counts 0 (the API server refuses such pods)."""
    spec = _mapping(pod.get("spec"))
    total = sum(_cpu_milli(_mapping(c)) for c in spec.get("containers") or ())
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or ():
        c = _mapping(container)
        if c.get("restartPolicy") == "Always":
            sidecars += _cpu_milli(c)
        else:
            init_peak = max(init_peak, sidecars + _cpu_milli(c))
    overhead = _mapping(spec.get("overhead"))
    return max(total + sidecars, init_peak) + (_cpu_milli({"resources": {"requests": overhead}}))


def _ask_error(pod: Mapping[str, Any], config: ControlConfig) -> str:
    """`read_pod_ask`'s message for a pod whose resources do not parse (a rare path: it reads again)."""
    try:
        read_pod_ask(pod, config)
    except ExtenderArgsError as err:
        return str(err)
    return "pod resources cannot be read"


def _allocated(annotations: Mapping[str, Any]) -> PodAllocation | WireFormatError | None:
    """`hami.io/vgpu-devices-allocated` decoded (None when absent or empty, the error when it does not
    decode): read once per event for both what the pod holds and its quota usage."""
    allocated = annotations.get(ann.DEVICES_ALLOCATED)
    if not isinstance(allocated, str) or not allocated:
        return None
    try:
        return ann.decode_pod_allocation(allocated, ann.DEVICES_ALLOCATED)
    except WireFormatError as err:
        return err


def _held(
    annotations: Mapping[str, Any],
    allocated: PodAllocation | WireFormatError | None,
    containers: _Containers,
    vendors: Sequence[Vendor] = (),
    vendor_keys: frozenset[str] | None = None,
) -> tuple[Held | None, str]:
    """What a non-terminal pod holds: (held, why not when its annotations do not decode). The allocation
    is `hami.io/vgpu-devices-allocated`, or `hami.io/vgpu-devices-to-allocate` when that is missing;
    the other vendors' devices come from each vendor's allocated (else to-allocate) annotation
    (`vendor_keys`: every such annotation, when known: none of them on the pod, no vendor is read)."""
    node_text = annotations.get(ann.VGPU_NODE)
    if not isinstance(node_text, str):
        return None, ""
    try:
        node = ann.decode_vgpu_node(node_text)
        if isinstance(allocated, WireFormatError):
            raise allocated
        if allocated is None:
            to_allocate = annotations.get(ann.DEVICES_TO_ALLOCATE)
            text = to_allocate if isinstance(to_allocate, str) else ""
            allocated = ann.decode_pod_allocation(text, ann.DEVICES_TO_ALLOCATE)
    except WireFormatError as err:
        return None, str(err)
    if containers.kinds is None:
        return None, containers.kinds_error
    slices = footprint_slices(allocated, containers.kinds)
    for vendor in vendors if vendor_keys is None or not vendor_keys.isdisjoint(annotations) else ():
        names = vendor.names
        for key in (names.allocated, names.to_allocate):
            value = annotations.get(key) if key else None
            if isinstance(value, str) and value:
                try:
                    theirs = ann.decode_pod_allocation(value, key)
                except WireFormatError as err:
                    return None, str(err)
                slices += footprint_slices(theirs, containers.kinds)
                break
    mig, why = _mig_reservations(annotations)
    return Held(node, slices, mig), why


def _mig_reservations(annotations: Mapping[str, Any]) -> tuple[tuple[MigAllocation, ...], str]:
    """The pod's MIG reservations, and why there are none when the annotation does not decode."""
    text = annotations.get(MIG_ALLOCATIONS)
    if not isinstance(text, str) or not text:
        return (), ""
    try:
        return decode_mig_allocations(text), ""
    except WireFormatError as err:
        return (), f"{err} (its MIG reservations count as none)"


def _usage(
    allocated: PodAllocation | WireFormatError | None,
    requests: Requests,
    init_containers: int,
    annotations: Mapping[str, Any],
    who: str,
) -> QuotaUsage:
    """A non-terminal pod's quota usage: from its allocation once chosen (the real MiB), else its request;
    a pod translated to DRA (no HAMi request left) from its `hami.io/dra-claims` annotation."""
    if isinstance(allocated, WireFormatError):
        log.debug("pod %s: %s; quota counts its request instead", who, allocated)
    elif allocated is not None:
        return allocation_quota_usage(allocated, init_containers)
    if any(request is not None for request, _ in requests):
        return requests_quota_usage(requests)
    translated = annotations.get(DRA_CLAIMS)
    if isinstance(translated, str):
        try:
            return claims_usage(decode_claims(translated))
        except WireFormatError as err:
            log.debug("pod %s: %s; it counts nothing against its quota", who, err)
    return _ZERO


def _same(previous: _T | None, value: _T) -> _T:
    """`previous` when it equals `value`: a pod's next event then costs no memory for what it kept."""
    return previous if previous is not None and previous == value else value


def pod_record(
    pod: Mapping[str, Any],
    config: ControlConfig,
    previous: PodRecord | None = None,
    *,
    shapes: dict[Requests, Requests] | None = None,
) -> PodRecord:
    """Distil a pod (plain JSON) into a `PodRecord`. Never raises on bad resources or annotations: a pod
    whose GPU resources do not parse asks nothing (and says why), a bad allocation annotation holds
    nothing and its quota usage falls back to the request. `previous`, the pod's last record: the parts
    that did not change are shared with it; `shapes`: requests seen before (pods of one workload ask
    alike), shared by every record that asks the same, up to `MAX_SHAPES` of them."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    raw = _mapping(meta.get("annotations"))
    kept = {k: str(raw[k]) for k in KEPT_ANNOTATIONS if k in raw}
    phase = str(status.get("phase") or "Pending")
    vendors = _vendors(config)
    containers, names_vendor = _pod_containers(pod, config, vendors)
    if containers.request_error:
        log.debug("%s; counted as asking no GPU", containers.request_error)
    init_containers = len(spec.get("initContainers") or ())
    held: Held | None = None
    held_error = ""
    usage = _ZERO
    old = previous
    vendor_ask = _vendor_ask(pod, config, old, vendors) if names_vendor else None
    if phase not in TERMINAL_PHASES:
        allocated = _allocated(raw)
        held, held_error = _held(raw, allocated, containers, vendors.others, vendors.annotations)
        usage = _usage(allocated, containers.requests, init_containers, raw, f"{namespace}/{name}")
        if vendor_ask is not None:
            usage += _vendor_quota_usage(raw, vendor_ask, init_containers)
    requests = _same(old.container_requests if old else None, containers.requests)
    if shapes is not None:
        shared = shapes.get(requests)
        if shared is None and len(shapes) < MAX_SHAPES:
            shapes[requests] = shared = requests
        requests = shared or requests
    return PodRecord(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        phase=phase,
        node_name=str(spec.get("nodeName") or ""),
        scheduler_name=str(spec.get("schedulerName") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        container_requests=requests,
        annotations=_same(old.annotations if old else None, kept),
        usage=usage,
        init_containers=init_containers,
        sidecars=containers.sidecars,
        request_error=containers.request_error,
        held=_same(old.held if old else None, held),
        held_error=held_error,
        cpu_milli=pod_cpu_milli(pod) if config.scheduling.fragmentation_filter.measures_cpu else 0,
        vendor_ask=vendor_ask,
    )


def _vendor_quota_usage(annotations: Mapping[str, Any], ask: VendorAsk, inits: int) -> QuotaUsage:
    """What a pod counts against the other vendors' quotas: its devices once its annotations name them
    (each vendor's allocated, else to-allocate annotation), else its requests."""
    allocations: dict[str, PodAllocation] = {}
    for vendor in ask.vendors:
        names = vendor.names
        for key in (names.allocated, names.to_allocate):
            value = annotations.get(key) if key else None
            if isinstance(value, str) and value:
                with contextlib.suppress(WireFormatError):  # else counted by its request below
                    allocations[names.common_word] = ann.decode_pod_allocation(value, key)
                break
    if allocations:
        return vendor_allocation_usage(allocations, inits, ask.vendors)
    return vendor_requests_usage(ask.by_container, ask.inits, ask.vendors)


def _device_pod_annotations(record: PodRecord) -> tuple[tuple[str, str], ...]:
    """The annotations the cache keeps with a pod's holding: those of a pod asking a vendor whose Fit
    reads the pods on each device (`Vendor.uses_device_pods`), else none."""
    ask = record.vendor_ask
    return ask.annotations if ask is not None and ask.uses_device_pods else ()


def _vendor_ask(
    pod: Mapping[str, Any], config: ControlConfig, old: PodRecord | None, vendors: _Vendors | None = None
) -> VendorAsk | None:
    """The pod's other-vendor ask, read only when a container names one of their resources."""
    vendors = vendors or _vendors(config)
    registry = vendors.registry
    if len(registry.vendors) <= 1 or not _names_any(pod, vendors.resources):
        return None
    try:
        ask = read_vendor_ask(pod, registry.vendors)
    except _BAD_INPUT as err:
        log.debug("pod %s: %s; counted as asking no device", _mapping(pod.get("metadata")).get("name"), err)
        return None
    return _same(old.vendor_ask if old else None, ask) if ask is not None else None


def _names_any(pod: Mapping[str, Any], resources: frozenset[str]) -> bool:
    spec = _mapping(pod.get("spec"))
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            section = _mapping(_mapping(container).get("resources"))
            for part in ("limits", "requests"):
                values = section.get(part)
                if isinstance(values, Mapping) and not resources.isdisjoint(values):
                    return True
    return False


PodListener = Callable[[PodRecord | None, PodRecord | None], None]
"""Called with (old, new) on every change: (None, new) added, (old, None) deleted."""


# --- the webhook's assumed admissions -------------------------------------------------------------------


@dataclass(slots=True)
class _Admitted:
    """One admitted pod not yet seen by the watch: keyed by its name, or by its generateName prefix."""

    key: str
    by_name: bool
    usage: QuotaUsage
    expires_at: float
    live: bool = True


class _AdmittedInNamespace:
    """A namespace's assumed admissions with their running total. Entries are found by name (dict) or
    generateName (FIFO per prefix) and expire in admission order, so every operation is O(1) amortised
    however many admissions wait (a dropped entry is only marked; its expiry unlinks it)."""

    __slots__ = ("by_generate_name", "by_name", "order", "total")

    def __init__(self) -> None:
        self.total = _ZERO
        self.order: collections.deque[_Admitted] = collections.deque()
        self.by_name: dict[str, _Admitted] = {}
        self.by_generate_name: dict[str, collections.deque[_Admitted]] = {}

    def add(self, entry: _Admitted) -> None:
        if entry.by_name:
            old = self.by_name.get(entry.key)
            if old is not None:
                self.drop(old)
            self.by_name[entry.key] = entry
        else:
            self.by_generate_name.setdefault(entry.key, collections.deque()).append(entry)
        self.order.append(entry)
        self.total += entry.usage

    def drop(self, entry: _Admitted) -> None:
        if not entry.live:
            return
        entry.live = False
        self.total -= entry.usage
        if entry.by_name:
            if self.by_name.get(entry.key) is entry:
                del self.by_name[entry.key]
        else:
            queue = self.by_generate_name.get(entry.key)
            if queue is not None:
                while queue and not queue[0].live:
                    queue.popleft()
                if not queue:
                    del self.by_generate_name[entry.key]

    def expire(self, now: float) -> None:
        order = self.order
        while order and (order[0].expires_at <= now or not order[0].live):
            self.drop(order.popleft())

    def seen(self, name: str, generate_name: str) -> None:
        entry = self.by_name.get(name)
        if entry is None and generate_name:
            queue = self.by_generate_name.get(generate_name)
            entry = next((e for e in queue if e.live), None) if queue else None
        if entry is not None:
            self.drop(entry)

    @property
    def empty(self) -> bool:
        return not self.order


@dataclass(frozen=True, slots=True)
class Admission:
    """An admission `PodStore.admit` counts (for `PodStore.withdraw`)."""

    namespace: str
    entry: _Admitted


# --- the binder's assumptions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Bound:
    """A pod the binder bound that no watch event has confirmed yet."""

    held: Held
    at: float
    namespace: str
    name: str
    annotations: tuple[tuple[str, str], ...] = ()


# --- the store ------------------------------------------------------------------------------------------


class PodStore:
    """Every pod of the cluster as a `PodRecord` by uid, and what is derived from it (see the module
    docstring). A `WatchSink` for the pods `Reflector`; single event loop, not thread-safe."""

    def __init__(
        self,
        config: ControlConfig,
        gpus: ClusterCache,
        *,
        assume_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.gpus = gpus
        self.assume_ttl_s = assume_ttl_s
        self.clock = clock
        self._pods: dict[str, PodRecord] = {}
        self._uids: dict[PodKey, str] = {}
        """(namespace, name) -> uid, for deletes that name no uid."""
        self._used: dict[str, QuotaUsage] = {}
        self._node_cpu: dict[str, int] = {}
        """node -> CPU (milli-cores) requested by the non-terminal pods bound to it."""
        self._cpu_changed: set[str] = set()
        """Nodes whose `node_cpu_requested` may differ since the last `drain_cpu_changed`."""
        self._admitted: dict[str, _AdmittedInNamespace] = {}
        self._bound: dict[str, _Bound] = {}
        self._listeners: list[PodListener] = []
        self._fresh: dict[str, PodRecord] = {}
        self._shapes: dict[Requests, Requests] = {}

    # --- reading ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, uid: str) -> PodRecord | None:
        return self._pods.get(uid)

    def find(self, namespace: str, name: str) -> PodRecord | None:
        """The pod of that name (the last uid seen under it), if the store has it."""
        uid = self._uids.get((namespace, name))
        return self._pods.get(uid) if uid is not None else None

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def used(self, namespace: str) -> QuotaUsage:
        """The namespace's usage: watched non-terminal pods plus admissions not yet seen by the watch."""
        used = self._used.get(namespace, _ZERO)
        admitted = self._admitted.get(namespace)
        if admitted is not None:
            admitted.expire(self.clock())
            if admitted.empty:
                del self._admitted[namespace]
            else:
                used += admitted.total
        return used

    def node_cpu_requested(self, node: str) -> int:
        """The CPU (milli-cores) the watched non-terminal pods bound to `node` request: what kube-scheduler
        counts as requested there (`--fragmentation-filter best` measures free CPU from it; 0 under any
        other setting, where the records carry no CPU)."""
        return self._node_cpu.get(node, 0)

    def drain_cpu_changed(self) -> set[str]:
        """The nodes whose `node_cpu_requested` changed since the last call (for the free-CPU index,
        `gputable.FreeCPU`)."""
        changed, self._cpu_changed = self._cpu_changed, set()
        return changed

    def admitted(self, namespace: str) -> int:
        """How many admissions of the namespace are still waiting for the watch (for tests and logs)."""
        admitted = self._admitted.get(namespace)
        if admitted is None:
            return 0
        admitted.expire(self.clock())
        return sum(1 for a in admitted.order if a.live)

    def add_listener(self, listener: PodListener) -> None:
        self._listeners.append(listener)

    # --- the webhook's admissions ----------------------------------------------------------------------

    def admit(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> Admission | None:
        """Count `usage` for a pod the webhook just admitted until the watch shows it (or the TTL ends).
        `name` is "" for pods named by `generate_name` (the API server picks the name after admission).
        Returns the entry, for `withdraw` (None when nothing was counted)."""
        if usage.memory <= 0 and usage.cores <= 0:
            return None
        if name and (namespace, name) in self._uids:
            return None  # already visible (cannot happen for a CREATE, but never count twice)
        key, by_name = (name, True) if name else (generate_name, False)
        admitted = self._admitted.get(namespace)
        if admitted is None:
            admitted = self._admitted[namespace] = _AdmittedInNamespace()
        entry = _Admitted(key, by_name, usage, self.clock() + self.assume_ttl_s)
        admitted.add(entry)
        return Admission(namespace, entry)

    def withdraw(self, admission: Admission) -> None:
        """Stop counting an admission the webhook took back (it denied the pod after all: the
        ResourceClaimTemplates of a pod translated to DRA could not be created)."""
        admitted = self._admitted.get(admission.namespace)
        if admitted is not None:
            admitted.drop(admission.entry)

    def _seen(self, pod: Mapping[str, Any], namespace: str, name: str) -> None:
        """A pod appeared in the watch: drop the admission assumed for it (by name, else by generateName)."""
        admitted = self._admitted.get(namespace)
        if admitted is None:
            return
        admitted.seen(name, str(_mapping(pod.get("metadata")).get("generateName") or ""))
        admitted.expire(self.clock())
        if admitted.empty:
            del self._admitted[namespace]

    # --- the binder's assumptions ----------------------------------------------------------------------

    def assume(
        self,
        uid: str,
        node: str,
        allocation: PodAllocation,
        kinds: Sequence[ContainerKind],
        now: float,
        *,
        namespace: str = "",
        name: str = "",
        extra: tuple[GPUSlice, ...] = (),
        annotations: tuple[tuple[str, str], ...] = (),
        mig: tuple[MigAllocation, ...] = (),
    ) -> None:
        """Count a pod the binder is binding to `node` from now on, until a watch event confirms it.
        A pod the watch already shows with its allocation is counted from that and not assumed again;
        assuming a pod twice keeps the latest choice. `extra`: the other vendors' devices it holds;
        `annotations`: the pod's, for vendors whose Fit reads the pods on each device; `mig`: its MIG
        reservations (`Fit.mig`)."""
        record = self._pods.get(uid)
        if record is not None and record.held is not None:
            return
        if record is None and (namespace or name):
            self._uids[(namespace, name)] = uid
        slices = footprint_slices(allocation, kinds) + extra
        self._bound[uid] = _Bound(Held(node, slices, mig), now, namespace, name, annotations)
        self._settle(uid)

    def forget(self, uid: str) -> None:
        """Drop the assumption for `uid` (the bind failed); a confirmed pod is left alone."""
        bound = self._bound.pop(uid, None)
        if bound is None:
            return
        if uid not in self._pods and self._uids.get((bound.namespace, bound.name)) == uid:
            del self._uids[(bound.namespace, bound.name)]  # known only through `assume`: leaves no trace
        self._settle(uid)

    def expire(self, now: float, ttl: float) -> list[str]:
        """Forget assumptions older than `ttl` seconds that no watch event confirmed; returns their uids."""
        stale = [uid for uid, bound in self._bound.items() if now - bound.at > ttl]
        for uid in stale:
            self.forget(uid)
        return stale

    # --- the watch -------------------------------------------------------------------------------------

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._fresh = {}

    def add_page(self, items: Sequence[JSONDict]) -> None:
        fresh = self._fresh
        for pod in items:
            record = self._read(pod)
            if record is None:
                continue
            fresh[record.uid] = record
            if record.uid not in self._pods:
                self._seen(pod, record.namespace, record.name)

    def end_replace(self) -> None:
        """The end of a list: the listed pods replace the store's; the ones it no longer has are gone
        (their assumptions too), pods known only through `assume` stay."""
        fresh, self._fresh = self._fresh, {}
        old_pods, self._pods = self._pods, fresh
        self._uids = {record.key: uid for uid, record in fresh.items()}
        for uid, bound in self._bound.items():
            if uid not in fresh and uid not in old_pods and (bound.namespace or bound.name):
                self._uids.setdefault((bound.namespace, bound.name), uid)
        self._used = {}
        self._cpu_changed.update(self._node_cpu)
        self._node_cpu = {}
        for record in fresh.values():
            self._add_usage(record)
        with self.gpus.batch():  # each node's GPUs rebuilt once, not once per pod on it
            for uid, old in old_pods.items():
                if uid not in fresh:
                    self._bound.pop(uid, None)
                    self._settle(uid)
                    self._notify(old, None)
            for uid, new in fresh.items():
                old_record = old_pods.get(uid)
                self._confirm(new, old_record)
                if old_record is None or old_record.resource_version != new.resource_version:
                    self._notify(old_record, new)

    def apply(self, kind: str, obj: JSONDict) -> None:
        if kind == "DELETED":
            self._deleted(obj)
            return
        record = self._read(obj)
        if record is None:
            return
        uid = record.uid
        old = self._pods.get(uid)
        if old is None:
            self._seen(obj, record.namespace, record.name)
        else:
            self._remove_usage(old)
        self._pods[uid] = record
        self._uids[record.key] = uid
        self._add_usage(record)
        self._confirm(record, old)
        self._notify(old, record)

    def _read(self, pod: JSONDict) -> PodRecord | None:
        uid = _mapping(pod.get("metadata")).get("uid")
        previous = self._pods.get(uid) if isinstance(uid, str) else None
        record = pod_record(pod, self.config, previous, shapes=self._shapes)
        if not record.uid:
            log.warning("pod event without metadata.uid ignored (%s/%s)", record.namespace, record.name)
            return None
        return record

    def _deleted(self, obj: JSONDict) -> None:
        meta = _mapping(obj.get("metadata"))
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        uid = str(meta.get("uid") or "") or self._uids.get(key, "")
        if not uid:
            return
        old = self._pods.pop(uid, None)
        bound = self._bound.pop(uid, None)
        keys = [key]
        if old is not None:
            keys.append(old.key)
        if bound is not None:
            keys.append((bound.namespace, bound.name))
        for name_key in keys:
            if self._uids.get(name_key) == uid:
                del self._uids[name_key]
        if old is not None:
            self._remove_usage(old)
        self._settle(uid)
        if old is not None:
            self._notify(old, None)

    def _confirm(self, record: PodRecord, old: PodRecord | None) -> None:
        """After a watch event: an allocation shown (or the pod's end) replaces the binder's assumption."""
        bound = self._bound.get(record.uid)
        if (
            record.terminal
            or record.held is not None
            or (bound is not None and record.node_name and record.node_name != bound.held.node)
        ):  # its allocation shown, its end, or bound to another node than assumed (a lost bind)
            self._bound.pop(record.uid, None)
        if record.held_error and (old is None or old.held_error != record.held_error):
            what = "counted without MIG reservations" if record.held is not None else "skipped"
            log.warning("pod %s/%s %s: %s", record.namespace, record.name, what, record.held_error)
        self._settle(record.uid)

    # --- what is derived -------------------------------------------------------------------------------

    def _settle(self, uid: str) -> None:
        """Tell the GPU cache what `uid` holds now: its watched allocation, else the binder's assumption."""
        record = self._pods.get(uid)
        held = record.held if record is not None else None
        if held is not None:
            assert record is not None
            current = self.gpus.holding(uid)
            annotations = _device_pod_annotations(record)
            if (
                current is None
                or current.assumed
                or current.node != held.node
                or current.slices != held.slices
                or current.mig != held.mig
                or current.annotations != annotations
            ):
                holding = PodHolding(
                    uid,
                    record.namespace,
                    record.name,
                    held.node,
                    held.slices,
                    False,
                    annotations,
                    held.mig,
                )
                self.gpus.hold(uid, holding)
            return
        bound = self._bound.get(uid)
        if bound is None:
            self.gpus.hold(uid, None)
            return
        namespace, name = (
            (record.namespace, record.name) if record is not None else (bound.namespace, bound.name)
        )
        annotations = _device_pod_annotations(record) if record is not None else bound.annotations
        holding = PodHolding(
            uid, namespace, name, bound.held.node, bound.held.slices, True, annotations, bound.held.mig
        )
        self.gpus.hold(uid, holding)

    def _add_usage(self, record: PodRecord) -> None:
        if record.cpu_milli and record.node_name and not record.terminal:
            self._node_cpu[record.node_name] = self._node_cpu.get(record.node_name, 0) + record.cpu_milli
            self._cpu_changed.add(record.node_name)
        usage = record.usage
        if usage.memory or usage.cores or usage.others:
            self._used[record.namespace] = self._used.get(record.namespace, _ZERO) + usage

    def _remove_usage(self, record: PodRecord) -> None:
        if record.cpu_milli and record.node_name and not record.terminal:
            self._cpu_changed.add(record.node_name)
            left_cpu = self._node_cpu.get(record.node_name, 0) - record.cpu_milli
            if left_cpu > 0:
                self._node_cpu[record.node_name] = left_cpu
            else:
                self._node_cpu.pop(record.node_name, None)
        usage = record.usage
        if usage.memory or usage.cores or usage.others:
            left = self._used.get(record.namespace, _ZERO) - usage
            if left.memory or left.cores or any(amount for _, amount in left.others):
                self._used[record.namespace] = left
            else:
                self._used.pop(record.namespace, None)

    def _notify(self, old: PodRecord | None, new: PodRecord | None) -> None:
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("a pod store listener failed")


__all__ = [
    "KEPT_ANNOTATIONS",
    "MAX_SHAPES",
    "Admission",
    "PodKey",
    "PodListener",
    "PodRecord",
    "PodStore",
    "pod_cpu_milli",
    "pod_record",
]
