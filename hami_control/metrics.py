"""The scheduler extender's Prometheus metrics: HAMi's cluster gauges plus our request instruments.

Everything lives in a private `CollectorRegistry` per `ControlMetrics` (never the global one), so two
instances never collide. Cluster gauges are built at scrape time from the `ClusterCache` (no background
thread, no per-event work); the request handlers update histograms and counters through `observe_*`.

**HAMi families** (`cmd/scheduler/metrics.go`, checked against HAMi's source and its collector tests,
v2.10-era with `hami_resource_quota_limit`). Names and label names are HAMi's so dashboards keep working;
every one of these families also carries `zone="vGPU"`, as HAMi registers its collector through
`WrapRegistererWith({"zone": "vGPU"})`. The device and vGPU families cover every vendor hami-control
schedules (`ClusterCache.node_gpus` for NVIDIA's GPUs, `ClusterCache.vendor_devices` for the others'
devices) and carry one label more than HAMi's, `vendor`: `nvidia` for NVIDIA's GPUs (their series keep
their values and HAMi's labels, plus `vendor="nvidia"`), else the vendor's family (`hygon`,
`cambricon`, `ascend`, ...; `status.vendors`: the vendor whose common word the device Type contains, as
HAMi hands devices to requests; `unknown` for a Type no vendor names). A vGPU series' vendor is its
slice's (`GPUSlice.vendor`).

=====================================  ==============================================================
`hami_gpu_memory_limit_bytes`          node, device_uuid, device_index, device_type, vendor; devmem MiB
                                       x 2^20
`hami_gpu_core_limit_ratio`            same labels; devcore, **percent of a GPU (0-100)** (a vendor's
                                       device: its Totalcore, in the vendor's unit)
`hami_gpu_memory_allocated_bytes`      + device_cores (= devcore, the GPU's total); used MiB x 2^20
`hami_gpu_shared_count`                same labels as limit; containers (slices) placed on the GPU
`hami_gpu_core_allocated_ratio`        same labels; used cores, **percent of a GPU (0-100)**
`hami_node_gpu_overview`               node, device_uuid, device_index, device_cores,
                                       device_memory_limit (MiB, as a label), device_type, vendor;
                                       used bytes
`hami_node_gpu_memory_allocated_ratio` node, device_uuid, device_index, vendor; used/total memory,
                                       **0-1**; absent for a GPU with no memory
`hami_resource_quota_used`             namespace, quota_name (resource name), limit (label; "0" = none)
`hami_resource_quota_limit`            namespace, quota_name; only for a limit that is set
`hami_vgpu_memory_allocated_bytes`     namespace, node, pod, device_uuid, vendor
`hami_vgpu_core_allocated_ratio`       namespace, node, pod, device_uuid, vendor; percent of a GPU
                                       (0-100)
`hami_build_info`                      version, revision, build_date, go_version, compiler, platform = 1
=====================================  ==============================================================

The quota families hold NVIDIA's memory and cores and each vendor's resources with a limit or a usage
(`QuotaLimits.others`, `QuotaUsage.others`: `quota_name` is the vendor's resource name, e.g.
`hygon.com/dcumem`, memory in MiB after the vendor's memory factor); they carry no `vendor` label (the
resource name says it), as HAMi's.

HAMi's `_ratio` names are not 0..1: core ratios are percent of one GPU (HAMi passes NVIDIA's
`Usedcores`/`Totalcore` through, so with deviceCoreScaling 2 the limit is 200); only
`hami_node_gpu_memory_allocated_ratio` is 0..1. We do the same. Deviations from HAMi, all forced by
what the cache keeps:

- vGPU series are per pod and GPU, without HAMi's `container_index` label: the cache keeps a pod's peak
  slices, not its containers (a pod with two containers on one GPU gives one series holding their sum).
  `sum by (namespace, pod)` queries are unaffected.
- Quota series cover the namespaces the `QuotaSource` reports (those with a GPU limit); HAMi also lists
  namespaces that use GPUs without any quota, with `limit="0"`. The memory limit is in MiB, already
  multiplied by the memory factor (HAMi shows the raw `limits.nvidia.com/gpumem`; equal at factor 1),
  and `used` is the `QuotaSource`'s (pending pods included, as the webhook counts it).
- `hami_build_info`: `go_version` holds the Python version and `compiler` the Python implementation.
- No `hami_node_gpu_mig_instance_info` (no MIG support).

**Our families** (no zone): `hami_scheduler_cache_{nodes,unregistered_nodes,pods,assumed_pods}` from
`ClusterCache.stats()`; histograms `hami_extender_{filter,prioritize,bind}_duration_seconds` and
`hami_webhook_duration_seconds` (buckets 0.5 ms .. 10 s); counters `hami_extender_bind_total{outcome}`,
`hami_extender_filter_node_reasons_total{reason}` and `hami_webhook_requests_total{allowed}`; the HTTPS
server's connections (`connections.ConnectionStats`, once `watch_connections` is given the server):
gauges `hami_control_connections_{open,max,peak}`, counters `hami_control_connections_accepted_total`,
`hami_control_connections_refused_total` (at the cap) and `hami_control_connections_dropped_total{reason}`
(`CONNECTION_DROP_REASONS`: header_timeout, body_timeout, tls_handshake_timeout, tls_handshake_failed,
evicted); gauges `hami_fragmentation_mix_probability{shape,source}` (the fragmentation policies' task
mix in use: one series per shape, `shape` as `--fragmentation-mix` writes it, e.g. `470` or `2x1000`,
`source` `configured` or `observed`) and `hami_fragmentation_mix_tasks{source}` (the tasks it was learned
from). Label
values from callers are bounded: a reason is cut at its first ":" (so `node unregistered: <why>` counts
as `node unregistered`) and each counter keeps at most `MAX_LABEL_VALUES` distinct values, folding the
rest into `other` (the values known at start-up, below, are kept besides those).

For the alerts: `hami_control_leader` (1 on the replica that leads the extender; 1 without leader
election), `hami_control_certificate_expiry_timestamp_seconds` (the serving certificate's notAfter, Unix
seconds; only with TLS), `hami_scheduler_allocating_pods` and, per such pod,
`hami_scheduler_allocating_pod_bind_timestamp_seconds{namespace, node, pod}` (its `hami.io/bind-time`):
the pods bound and still waiting for their node daemon (`hami.io/bind-phase: allocating`), from the pod
store's events (`AllocatingPods`).

**Every counter exists from start-up at zero** for each label value known then (`BIND_OUTCOMES`,
`FILTER_REASONS`, `allowed` true and false; the histograms have no labels), so Prometheus sees the first
event as an increase: a series that appears at 1 has no earlier sample, and `increase()` and `rate()`
count nothing for it.

**Cost and threads.** The cache is not thread-safe: `snapshot()`, `render()` without a snapshot, and a
scrape of `registry` must run on the cache's owner (the event loop). `render()` writes the cluster
families as text itself, in the format prometheus_client writes (a test checks both parse the same); the
generic exposition behind `registry` spends ~20 us a sample validating and escaping label names.
Measured on a shared 2-core machine at 5,000 nodes x 8 GPUs and 50,000 pods (380,000 lines, 53 MB):
`snapshot()` 0.15-0.35 s (one `PodHolding` per pod), `render(snapshot)` 0.5-0.7 s, a `registry` scrape
~10 s. So: take `snapshot()` on the loop and call `render(snapshot)` in a worker thread.
"""

from __future__ import annotations

import math
import platform
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hami_api.annotations import BIND_PHASE, BIND_TIME, decode_unix_time
from hami_api.errors import WireFormatError
from hami_api.resources import ResourceNames
from hami_api.types import BindPhase
from hami_control.cache import CacheStats, ClusterCache, PodHolding
from hami_control.connections import ConnectionLimits, ConnectionStats
from hami_control.devices.base import Vendor
from hami_control.extender import NOT_LEAST_FRAGMENTING_WORD, UNREGISTERED_WORD
from hami_control.fit import Reason
from hami_control.frag import DEFAULT_MIX
from hami_control.frag_mix import MixInUse, MixSource, shape_label
from hami_control.pod_store import PodRecord
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.status.vendors import NVIDIA_FAMILY, VendorFamilies
from hami_control.usage import NodeGPUs

MIB = 1024 * 1024
ZONE = "vGPU"
"""HAMi's value of the `zone` label on its scheduler families."""

DURATION_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Request latency buckets, seconds: 0.5 ms .. 10 s (+Inf is added by the histogram)."""

BIND_OUTCOMES: tuple[str, ...] = (
    "success",
    "success_plain",
    "no_fit",
    "conflict",
    "not_found",
    "unregistered",
    "wait_timeout",
    "lock_timeout",
    "lock_error",
    "api_error",
    "bad_request",
    "error",
)
"""The `outcome` values of `hami_extender_bind_total` the binder and the extender give (a test reads them
from their code), each at zero from start-up."""

FILTER_REASONS: tuple[str, ...] = (*(r.value for r in Reason), UNREGISTERED_WORD, NOT_LEAST_FRAGMENTING_WORD)
"""The `reason` values of `hami_extender_filter_node_reasons_total` for NVIDIA GPUs, each at zero from
start-up (the other vendors' words are counted as they come)."""

MAX_LABEL_VALUES = 64
"""Distinct caller-supplied values kept per counter label; more fold into `OTHER`."""
OTHER = "other"

# name -> (help, label names in the order `add_metric` takes them). Both renderers read this table.
_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hami_gpu_memory_limit_bytes": (
        "Device memory limit for a certain GPU",
        ("node", "device_uuid", "device_index", "device_type", "vendor", "zone"),
    ),
    "hami_gpu_core_limit_ratio": (
        "Device core limit for a certain GPU",
        ("node", "device_uuid", "device_index", "device_type", "vendor", "zone"),
    ),
    "hami_gpu_memory_allocated_bytes": (
        "Device memory allocated for a certain GPU",
        ("node", "device_uuid", "device_index", "device_cores", "device_type", "vendor", "zone"),
    ),
    "hami_gpu_shared_count": (
        "Number of containers sharing this GPU",
        ("node", "device_uuid", "device_index", "device_type", "vendor", "zone"),
    ),
    "hami_gpu_core_allocated_ratio": (
        "Device core allocated for a certain GPU",
        ("node", "device_uuid", "device_index", "device_type", "vendor", "zone"),
    ),
    "hami_node_gpu_overview": (
        "GPU overview on a certain node",
        (
            "node",
            "device_uuid",
            "device_index",
            "device_cores",
            "device_memory_limit",
            "device_type",
            "vendor",
            "zone",
        ),
    ),
    "hami_node_gpu_memory_allocated_ratio": (
        "GPU Memory Allocated Percentage on a certain GPU",
        ("node", "device_uuid", "device_index", "vendor", "zone"),
    ),
    "hami_vgpu_memory_allocated_bytes": (
        "vGPU memory allocated from a pod",
        ("namespace", "node", "pod", "device_uuid", "vendor", "zone"),
    ),
    "hami_vgpu_core_allocated_ratio": (
        "vGPU core allocated from a pod",
        ("namespace", "node", "pod", "device_uuid", "vendor", "zone"),
    ),
    "hami_resource_quota_used": (
        "resourcequota usage for a certain device",
        ("namespace", "quota_name", "limit", "zone"),
    ),
    "hami_resource_quota_limit": (
        "resourcequota limit for a certain device",
        ("namespace", "quota_name", "zone"),
    ),
    "hami_scheduler_cache_nodes": ("Registered nodes (with usable GPU inventory) in the cache", ()),
    "hami_scheduler_cache_unregistered_nodes": ("Known nodes kept out of scheduling (unregistered)", ()),
    "hami_scheduler_cache_pods": ("Pods counted as holding GPU slices, assumed ones included", ()),
    "hami_scheduler_cache_assumed_pods": ("Bound pods counted before a watch event confirmed them", ()),
    "hami_build_info": (
        "hami build metadata exposed as labels with a constant value of 1.",
        ("version", "revision", "build_date", "go_version", "compiler", "platform"),
    ),
}
CLUSTER_FAMILIES: tuple[str, ...] = tuple(_GAUGES)
"""Names of the gauge families read from the cache at scrape time."""


class QuotaSource(Protocol):
    """Namespace GPU quotas for the `hami_resource_quota_*` families (memory in MiB, cores in percent).

    `namespaces`: the namespaces that have a GPU memory or cores limit. `limits` / `used`: as
    `quota.QuotaView` (`quota_store.QuotaCache.limits` and `pod_store.PodStore.used` answer them)."""

    def namespaces(self) -> Iterable[str]: ...

    def limits(self, namespace: str) -> QuotaLimits: ...

    def used(self, namespace: str) -> QuotaUsage: ...


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    namespace: str
    limits: QuotaLimits
    used: QuotaUsage


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What one scrape reports, read from the cache at one instant; all values are immutable, so a
    snapshot taken on the cache's thread may be rendered on any other."""

    nodes: tuple[NodeGPUs, ...]
    holdings: tuple[PodHolding, ...]
    stats: CacheStats
    quotas: tuple[QuotaEntry, ...]
    vendor_nodes: tuple[NodeGPUs, ...] = ()
    """Each node's devices of the other vendors (`ClusterCache.vendor_devices`)."""
    allocating: tuple[AllocatingPod, ...] = ()
    """The pods bound and waiting for their node daemon (`AllocatingPods`)."""


@dataclass(frozen=True, slots=True)
class AllocatingPod:
    """A pod bound to a node whose node daemon has not answered yet (`hami.io/bind-phase: allocating`)."""

    namespace: str
    name: str
    node: str
    bound_at: int
    """Its `hami.io/bind-time`, Unix seconds (0 when the annotation is missing or does not parse)."""


class AllocatingPods:
    """The pods in `hami.io/bind-phase: allocating` on a node, kept from the pod store's events
    (`pod_event` is a `pod_store.PodListener`; call it on the store's thread, the event loop)."""

    def __init__(self) -> None:
        self._pods: dict[str, AllocatingPod] = {}

    def pod_event(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if new is None:
            if old is not None:
                self._pods.pop(old.uid, None)
            return
        annotations = new.annotations
        if new.terminal or not new.node_name or annotations.get(BIND_PHASE) != BindPhase.ALLOCATING.value:
            self._pods.pop(new.uid, None)
            return
        try:
            bound_at = decode_unix_time(annotations.get(BIND_TIME, ""))
        except WireFormatError:
            bound_at = 0
        self._pods[new.uid] = AllocatingPod(new.namespace, new.name, new.node_name, bound_at)

    def pods(self) -> tuple[AllocatingPod, ...]:
        return tuple(self._pods.values())


class _ControlState:
    """The replica's state the alerts read: leading, the certificate's expiry, the pods allocating."""

    def __init__(self) -> None:
        self.leading: Callable[[], bool] = lambda: True
        self.certificate_expiry: Callable[[], float | None] = lambda: None

    def families(self, snap: MetricsSnapshot) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "hami_control_leader",
            "1 on the replica that leads the scheduler extender (always 1 without leader election)",
            value=1.0 if self.leading() else 0.0,
        )
        expiry = self.certificate_expiry()
        if expiry is not None:
            yield GaugeMetricFamily(
                "hami_control_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires (its notAfter), Unix seconds",
                value=expiry,
            )
        yield GaugeMetricFamily(
            "hami_scheduler_allocating_pods",
            "Pods bound to a node whose node daemon has not allocated their GPUs yet (bind-phase allocating)",
            value=len(snap.allocating),
        )
        since = GaugeMetricFamily(
            "hami_scheduler_allocating_pod_bind_timestamp_seconds",
            "When a pod still allocating was bound (its hami.io/bind-time), Unix seconds",
            labels=("namespace", "node", "pod"),
        )
        for pod in snap.allocating:
            since.add_metric((pod.namespace, pod.node, pod.name), pod.bound_at)
        yield since


_EMPTY = MetricsSnapshot((), (), CacheStats(0, 0, 0, 0), ())


class _StateNow(Collector):
    """`_ControlState`'s families of one snapshot, for `render`."""

    def __init__(self, state: _ControlState, snap: MetricsSnapshot) -> None:
        self._state = state
        self._snap = snap

    def collect(self) -> Iterable[Metric]:
        return list(self._state.families(self._snap))


def package_version() -> str:
    """The installed hami-py version, or "unknown" when it is not installed as a distribution."""
    try:
        return metadata.version("hami-py")
    except metadata.PackageNotFoundError:
        return "unknown"


def _check_seconds(seconds: float) -> float:
    value = float(seconds)
    if math.isnan(value) or value < 0:
        raise ValueError(f"seconds must be a non-negative number, got {seconds!r}")
    return value


class _BoundedLabel:
    """Caller-supplied label values, at most `limit` distinct ones besides the `known` ones (which are
    always kept); later new values become `OTHER`."""

    def __init__(self, limit: int, known: Iterable[str] = ()) -> None:
        self._limit = limit
        self._known = frozenset(known)
        self._seen: set[str] = set(self._known)
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) - len(self._known) >= self._limit:
                return OTHER
            self._seen.add(value)
            return value


def _reason_word(reason: str) -> str:
    word = reason.split(":", 1)[0].strip()
    return word or "unknown"


def _family(name: str) -> GaugeMetricFamily:
    doc, labels = _GAUGES[name]
    return GaugeMetricFamily(name, doc, labels=labels)


def _vgpu_rows(
    holdings: Iterable[PodHolding], families: VendorFamilies
) -> Iterator[tuple[PodHolding, str, str, int, int]]:
    """(pod, GPU, vendor, MiB, cores) per pod and GPU: the pod's slices on one GPU summed."""
    for h in holdings:
        per_gpu: dict[str, tuple[str, int, int]] = {}
        for s in h.slices:
            if s.uuid:
                vendor, mem, cores = per_gpu.get(s.uuid) or (s.vendor, 0, 0)
                per_gpu[s.uuid] = (vendor, mem + s.usedmem, cores + s.usedcores)
        for uuid, (vendor, mem, cores) in per_gpu.items():
            yield h, uuid, families.of_slice(vendor), mem, cores


def _quota_rows(
    names: ResourceNames, entries: Iterable[QuotaEntry]
) -> Iterator[tuple[str, str, int | None, int]]:
    """(namespace, quota name, limit or None, used) per namespace and dimension: NVIDIA's memory and
    cores, then each other vendor's resource with a limit or a usage, by name."""
    for e in entries:
        yield e.namespace, names.memory, e.limits.memory, e.used.memory
        yield e.namespace, names.cores, e.limits.cores, e.used.cores
        for resource in sorted({r for r, _ in e.limits.others} | {r for r, v in e.used.others if v}):
            yield e.namespace, resource, e.limits.other(resource), e.used.other(resource)


def _device_groups(
    snap: MetricsSnapshot, families: VendorFamilies
) -> Iterator[tuple[NodeGPUs, Callable[[str], str]]]:
    """Each node's NVIDIA GPUs and each node's other vendors' devices, with how to name a device's vendor
    from its Type."""
    for node in snap.nodes:
        yield node, _nvidia
    for node in snap.vendor_nodes:
        yield node, families.of_type


def _nvidia(_device_type: str) -> str:
    return NVIDIA_FAMILY


def _cache_vendors(cache: ClusterCache) -> tuple[Vendor, ...]:
    """The vendors whose devices the cache decodes."""
    return cache.vendors


def _vendor_node_names(cache: ClusterCache) -> list[str]:
    """The nodes with usable devices of the other vendors."""
    return sorted(cache.vendor_nodes())


def _go_float(value: float) -> str:
    """A sample value as prometheus_client writes it."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape(value: str) -> str:
    """A label value as the text format writes it (what prometheus_client's exposition does)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _Families:
    """The cluster families of one snapshot, two ways: `Metric` objects for `registry` scrapes, and
    straight to text for `render` (the same output, parsed, at a fraction of the cost: the generic
    exposition spends ~20 us a sample validating and escaping label names)."""

    def __init__(
        self,
        resource_names: ResourceNames,
        zone: str,
        build_labels: Sequence[str],
        families: VendorFamilies | None = None,
    ) -> None:
        self._names = resource_names
        self._zone = zone
        self._build_labels = tuple(build_labels)
        self._vendors = families if families is not None else VendorFamilies(())

    def describe(self) -> Iterator[Metric]:
        for name in CLUSTER_FAMILIES:
            yield _family(name)

    def _cache_values(self, snap: MetricsSnapshot) -> dict[str, int]:
        s = snap.stats
        return {
            "hami_scheduler_cache_nodes": s.nodes,
            "hami_scheduler_cache_unregistered_nodes": s.unregistered,
            "hami_scheduler_cache_pods": s.pods,
            "hami_scheduler_cache_assumed_pods": s.assumed,
        }

    # --- as Metric objects ------------------------------------------------------------------------------

    def collect(self, snap: MetricsSnapshot) -> Iterator[Metric]:
        f = {name: _family(name) for name in CLUSTER_FAMILIES}
        zone = self._zone
        for node, vendor_of in _device_groups(snap, self._vendors):
            for g in node.gpus:
                info = g.info
                index, cores, vendor = str(info.index), str(info.devcore), vendor_of(info.type)
                labels = (node.name, info.id, index, info.type, vendor, zone)
                f["hami_gpu_memory_limit_bytes"].add_metric(labels, info.devmem * MIB)
                f["hami_gpu_core_limit_ratio"].add_metric(labels, info.devcore)
                f["hami_gpu_memory_allocated_bytes"].add_metric(
                    (node.name, info.id, index, cores, info.type, vendor, zone), g.usedmem * MIB
                )
                f["hami_gpu_shared_count"].add_metric(labels, g.used)
                f["hami_gpu_core_allocated_ratio"].add_metric(labels, g.usedcores)
                f["hami_node_gpu_overview"].add_metric(
                    (node.name, info.id, index, cores, str(info.devmem), info.type, vendor, zone),
                    g.usedmem * MIB,
                )
                if info.devmem > 0:
                    f["hami_node_gpu_memory_allocated_ratio"].add_metric(
                        (node.name, info.id, index, vendor, zone), g.usedmem / info.devmem
                    )
        for h, uuid, vendor, mem, used_cores in _vgpu_rows(snap.holdings, self._vendors):
            pod = (h.namespace, h.node, h.name, uuid, vendor, zone)
            f["hami_vgpu_memory_allocated_bytes"].add_metric(pod, mem * MIB)
            f["hami_vgpu_core_allocated_ratio"].add_metric(pod, used_cores)
        for namespace, quota_name, limit, used in _quota_rows(self._names, snap.quotas):
            f["hami_resource_quota_used"].add_metric((namespace, quota_name, str(limit or 0), zone), used)
            if limit is not None:
                f["hami_resource_quota_limit"].add_metric((namespace, quota_name, zone), limit)
        for name, value in self._cache_values(snap).items():
            f[name].add_metric((), value)
        f["hami_build_info"].add_metric(self._build_labels, 1)
        yield from f.values()

    # --- as text ----------------------------------------------------------------------------------------

    def text(self, snap: MetricsSnapshot) -> str:
        """The families in Prometheus text format; labels in name order, as prometheus_client writes."""
        out: dict[str, list[str]] = {name: [] for name in CLUSTER_FAMILIES}
        numbers: dict[float, str] = {}

        def num(value: float) -> str:
            text = numbers.get(value)
            if text is None:
                text = numbers[value] = _go_float(value)
            return text

        zone = f'zone="{_escape(self._zone)}"'
        mem_limit = out["hami_gpu_memory_limit_bytes"]
        core_limit = out["hami_gpu_core_limit_ratio"]
        mem_alloc = out["hami_gpu_memory_allocated_bytes"]
        shared = out["hami_gpu_shared_count"]
        core_alloc = out["hami_gpu_core_allocated_ratio"]
        overview = out["hami_node_gpu_overview"]
        mem_ratio = out["hami_node_gpu_memory_allocated_ratio"]
        for node, vendor_of in _device_groups(snap, self._vendors):
            at_node = f'node="{_escape(node.name)}",'
            wheres: dict[str, str] = {}
            for g in node.gpus:
                info = g.info
                vendor = vendor_of(info.type)
                where = wheres.get(vendor)
                if where is None:
                    where = wheres[vendor] = f'{at_node}vendor="{_escape(vendor)}",{zone}}} '
                idx = f'device_index="{info.index}"'
                typ = f'device_type="{_escape(info.type)}"'
                uuid_where = f'device_uuid="{_escape(info.id)}",{where}'
                cores = f'{{device_cores="{info.devcore}",{idx}'
                labels = f"{{{idx},{typ},{uuid_where}"
                used_bytes = num(g.usedmem * MIB)
                mem_limit.append(f"hami_gpu_memory_limit_bytes{labels}{num(info.devmem * MIB)}\n")
                core_limit.append(f"hami_gpu_core_limit_ratio{labels}{num(info.devcore)}\n")
                mem_alloc.append(f"hami_gpu_memory_allocated_bytes{cores},{typ},{uuid_where}{used_bytes}\n")
                shared.append(f"hami_gpu_shared_count{labels}{num(g.used)}\n")
                core_alloc.append(f"hami_gpu_core_allocated_ratio{labels}{num(g.usedcores)}\n")
                overview.append(
                    f'hami_node_gpu_overview{cores},device_memory_limit="{info.devmem}",{typ},'
                    f"{uuid_where}{used_bytes}\n"
                )
                if info.devmem > 0:
                    mem_ratio.append(
                        f"hami_node_gpu_memory_allocated_ratio{{{idx},{uuid_where}"
                        f"{num(g.usedmem / info.devmem)}\n"
                    )
        vgpu_mem = out["hami_vgpu_memory_allocated_bytes"]
        vgpu_cores = out["hami_vgpu_core_allocated_ratio"]
        for h, uuid, vendor, mem, cores_used in _vgpu_rows(snap.holdings, self._vendors):
            labels = (
                f'{{device_uuid="{_escape(uuid)}",namespace="{_escape(h.namespace)}",'
                f'node="{_escape(h.node)}",pod="{_escape(h.name)}",vendor="{_escape(vendor)}",{zone}}} '
            )
            vgpu_mem.append(f"hami_vgpu_memory_allocated_bytes{labels}{num(mem * MIB)}\n")
            vgpu_cores.append(f"hami_vgpu_core_allocated_ratio{labels}{num(cores_used)}\n")
        for namespace, quota_name, limit, used in _quota_rows(self._names, snap.quotas):
            where = f'namespace="{_escape(namespace)}",quota_name="{_escape(quota_name)}",{zone}}} '
            out["hami_resource_quota_used"].append(
                f'hami_resource_quota_used{{limit="{limit or 0}",{where}{num(used)}\n'
            )
            if limit is not None:
                out["hami_resource_quota_limit"].append(f"hami_resource_quota_limit{{{where}{num(limit)}\n")
        for name, value in self._cache_values(snap).items():
            out[name].append(f"{name} {num(value)}\n")
        version, revision, build_date, go_version, compiler, plat = map(_escape, self._build_labels)
        out["hami_build_info"].append(
            f'hami_build_info{{build_date="{build_date}",compiler="{compiler}",go_version="{go_version}",'
            f'platform="{plat}",revision="{revision}",version="{version}"}} 1.0\n'
        )
        parts: list[str] = []
        for name, lines in out.items():
            doc = _GAUGES[name][0].replace("\\", r"\\").replace("\n", r"\n")
            parts.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            parts.extend(lines)
        return "".join(parts)


class _ClusterCollector(Collector):
    """Reads the cache on each scrape of the owner's registry (call on the cache's thread)."""

    def __init__(self, owner: ControlMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        return [*self._owner._families.describe(), *self._owner._state.families(_EMPTY)]

    def collect(self) -> Iterable[Metric]:
        snap = self._owner.snapshot()
        yield from self._owner._families.collect(snap)
        yield from self._owner._state.families(snap)


CONNECTION_DROP_REASONS = (
    "header_timeout",
    "body_timeout",
    "tls_handshake_timeout",
    "tls_handshake_failed",
    "evicted",
)
"""The `reason` values of `hami_control_connections_dropped_total`, each a `ConnectionStats` counter."""


def _drops(s: ConnectionStats) -> tuple[int, ...]:
    """`s`'s counters in the order of `CONNECTION_DROP_REASONS`."""
    return (s.header_timeouts, s.body_timeouts, s.tls_handshake_timeouts, s.tls_handshake_failures, s.evicted)


class _ConnectionCollector(Collector):
    """The HTTPS server's connection counters (`connections.ConnectionStats`), read at each scrape from
    the source `ControlMetrics.watch_connections` set (zeros before)."""

    def __init__(self) -> None:
        self.stats: Callable[[], ConnectionStats] = ConnectionStats
        self.max_connections = ConnectionLimits().max_connections

    def collect(self) -> Iterable[Metric]:
        s = replace(self.stats())  # one copy: the loop thread keeps counting while this renders
        prefix = "hami_control_connections_"
        for name, doc, value in (
            ("open", "Connections open now, TLS handshakes included", s.open),
            ("max", "The cap on open connections (--max-connections)", self.max_connections),
            ("peak", "Most connections open at once since the server started", s.peak),
        ):
            yield GaugeMetricFamily(prefix + name, doc, value=value)
        yield CounterMetricFamily(prefix + "accepted", "Connections accepted (counted in)", value=s.accepted)
        yield CounterMetricFamily(
            prefix + "refused",
            "Connections refused at the cap before their TLS handshake (none had waited to be evicted)",
            value=s.refused,
        )
        why = "Connections the server closed because of a limit, by reason"
        dropped = CounterMetricFamily(prefix + "dropped", why, labels=("reason",))
        for reason, value in zip(CONNECTION_DROP_REASONS, _drops(s), strict=True):
            dropped.add_metric((reason,), value)
        yield dropped


class _Instruments(Collector):
    """The request instruments alone, for `render` (which writes the cluster families itself)."""

    def __init__(self, instruments: Sequence[Collector]) -> None:
        self._instruments = instruments

    def collect(self) -> Iterable[Metric]:
        for instrument in self._instruments:
            yield from instrument.collect()


CONFIGURED_DEFAULT = MixInUse(DEFAULT_MIX, MixSource.CONFIGURED)
"""The task mix a `ControlMetrics` reports until told another (the default prior)."""


class _MixCollector(Collector):
    """The fragmentation policies' task mix in use (`frag_mix.MixInUse`), swapped whole by
    `ControlMetrics.set_fragmentation_mix` (one reference: a scrape on another thread sees the old mix or
    the new one, never half of each)."""

    def __init__(self, in_use: MixInUse) -> None:
        self.in_use = in_use

    def collect(self) -> Iterable[Metric]:
        in_use = self.in_use
        probability = GaugeMetricFamily(
            "hami_fragmentation_mix_probability",
            "Probability of each task shape (GPUs x milli-GPUs) in the fragmentation policies' task mix",
            labels=("shape", "source"),
        )
        tasks = GaugeMetricFamily(
            "hami_fragmentation_mix_tasks",
            "Observed GPU tasks the fragmentation task mix in use was learned from (0: configured)",
            labels=("source",),
        )
        source = in_use.source.value
        for shape, weight in zip(in_use.mix.shapes, in_use.mix.weights, strict=True):
            probability.add_metric((shape_label(shape), source), weight)
        tasks.add_metric((source,), in_use.tasks)
        yield probability
        yield tasks


class ControlMetrics:
    """The extender's `/metrics`: see the module docstring for the families and their units."""

    def __init__(
        self,
        cache: ClusterCache,
        quotas: QuotaSource | None = None,
        *,
        version: str | None = None,
        revision: str = "",
        build_date: str = "",
        resource_names: ResourceNames | None = None,
        zone: str = ZONE,
        max_label_values: int = MAX_LABEL_VALUES,
        fragmentation_mix: MixInUse = CONFIGURED_DEFAULT,
    ) -> None:
        if max_label_values < 1:
            raise ValueError(f"max_label_values must be at least 1, got {max_label_values}")
        self.cache = cache
        self.quotas = quotas
        self.registry = CollectorRegistry(auto_describe=True)
        build = (
            version if version is not None else package_version(),
            revision,
            build_date,
            f"python{platform.python_version()}",
            sys.implementation.name,
            f"{sys.platform}/{platform.machine()}",
        )
        families = VendorFamilies(_cache_vendors(cache))
        self._families = _Families(resource_names or ResourceNames(), zone, build, families)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=DURATION_BUCKETS, registry=None)

        self._filter_seconds = histogram(
            "hami_extender_filter_duration_seconds", "Time spent answering a scheduler extender filter call"
        )
        self._prioritize_seconds = histogram(
            "hami_extender_prioritize_duration_seconds",
            "Time spent answering a scheduler extender prioritize call",
        )
        self._bind_seconds = histogram(
            "hami_extender_bind_duration_seconds", "Time spent answering a scheduler extender bind call"
        )
        self._webhook_seconds = histogram(
            "hami_webhook_duration_seconds", "Time spent answering an admission review"
        )
        self._binds = Counter(
            "hami_extender_bind_total", "Bind calls by outcome", labelnames=("outcome",), registry=None
        )
        self._filter_reasons = Counter(
            "hami_extender_filter_node_reasons_total",
            "Nodes a filter call rejected, by HAMi reason word",
            labelnames=("reason",),
            registry=None,
        )
        self._webhook_requests = Counter(
            "hami_webhook_requests_total",
            "Admission reviews answered, by whether the pod was allowed",
            labelnames=("allowed",),
            registry=None,
        )
        self._outcome_label = _BoundedLabel(max_label_values, BIND_OUTCOMES)
        self._reason_label = _BoundedLabel(max_label_values, FILTER_REASONS)
        for outcome in BIND_OUTCOMES:
            self._binds.labels(outcome)
        for reason in FILTER_REASONS:
            self._filter_reasons.labels(reason)
        for allowed in ("true", "false"):
            self._webhook_requests.labels(allowed)
        self._state = _ControlState()
        self.allocating = AllocatingPods()
        """Feed it the pod store's events (`PodStore.add_listener(metrics.allocating.pod_event)`)."""
        self._connections = _ConnectionCollector()
        self._mix = _MixCollector(fragmentation_mix)
        self._instruments: tuple[Collector, ...] = (
            self._filter_seconds,
            self._prioritize_seconds,
            self._bind_seconds,
            self._binds,
            self._filter_reasons,
            self._webhook_seconds,
            self._webhook_requests,
            self._connections,
            self._mix,
        )
        self.registry.register(_ClusterCollector(self))
        for instrument in self._instruments:
            self.registry.register(instrument)

    # --- request instruments (thread-safe) ----------------------------------------------------------------

    def observe_filter(self, seconds: float, reasons: Mapping[str, int] | None = None) -> None:
        """One filter call: its duration, and how many nodes it rejected for each reason."""
        self._filter_seconds.observe(_check_seconds(seconds))
        for reason, count in (reasons or {}).items():
            if count < 0:
                raise ValueError(f"reason {reason!r}: node count must not be negative, got {count}")
            if count:
                self._filter_reasons.labels(self._reason_label(_reason_word(reason))).inc(count)

    def observe_prioritize(self, seconds: float) -> None:
        self._prioritize_seconds.observe(_check_seconds(seconds))

    def observe_bind(self, seconds: float, outcome: str) -> None:
        """One bind call: its duration and outcome (success, no_fit, conflict, api_error, ...)."""
        self._bind_seconds.observe(_check_seconds(seconds))
        self._binds.labels(self._outcome_label(outcome or "unknown")).inc()

    def observe_webhook(self, seconds: float, allowed: bool) -> None:
        self._webhook_seconds.observe(_check_seconds(seconds))
        self._webhook_requests.labels("true" if allowed else "false").inc()

    def watch_connections(self, stats: Callable[[], ConnectionStats], limits: ConnectionLimits) -> None:
        """Export the HTTPS server's connection counters (`ControlServer.stats`, read at each scrape; plain
        ints, so a scrape in a worker thread may read them) and its cap (`limits.max_connections`)."""
        self._connections.stats = stats
        self._connections.max_connections = limits.max_connections

    def watch_leader(self, leading: Callable[[], bool]) -> None:
        """Whether this replica leads the extender now (`LeaderElector.leading`); read at each scrape."""
        self._state.leading = leading

    def watch_certificate(self, expiry: Callable[[], float | None]) -> None:
        """The serving certificate's notAfter in Unix seconds, None without one; read at each scrape."""
        self._state.certificate_expiry = expiry

    def set_fragmentation_mix(self, in_use: MixInUse) -> None:
        """The task mix the fragmentation policies use now (`hami_fragmentation_mix_*`)."""
        self._mix.in_use = in_use

    # --- scrape -------------------------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        """The cluster state one scrape reports. Call on the cache's thread; cheap (references only)."""
        cache = self.cache
        nodes = tuple(gpus for name in sorted(cache.nodes()) if (gpus := cache.node_gpus(name)) is not None)
        quotas: tuple[QuotaEntry, ...] = ()
        if self.quotas is not None:
            source = self.quotas
            entries = []
            for namespace in sorted(set(source.namespaces())):
                limits = source.limits(namespace)
                if not limits.unlimited:
                    entries.append(QuotaEntry(namespace, limits, source.used(namespace)))
            quotas = tuple(entries)
        names = _vendor_node_names(cache)
        vendor_nodes = tuple(d for name in names if (d := cache.vendor_devices(name)) is not None)
        return MetricsSnapshot(
            nodes, tuple(cache.holdings()), cache.stats(), quotas, vendor_nodes, self.allocating.pods()
        )

    def render(self, snapshot: MetricsSnapshot | None = None) -> tuple[bytes, str]:
        """(body, content type) in Prometheus text format for an HTTP response. Without `snapshot`, reads
        the cache now (call on its thread); with one, may run on any thread."""
        snap = snapshot if snapshot is not None else self.snapshot()
        body = (
            self._families.text(snap).encode()
            + generate_latest(_StateNow(self._state, snap))
            + generate_latest(_Instruments(self._instruments))
        )
        return body, CONTENT_TYPE_LATEST


__all__ = [
    "BIND_OUTCOMES",
    "CLUSTER_FAMILIES",
    "CONNECTION_DROP_REASONS",
    "DURATION_BUCKETS",
    "FILTER_REASONS",
    "MAX_LABEL_VALUES",
    "MIB",
    "OTHER",
    "ZONE",
    "AllocatingPod",
    "AllocatingPods",
    "ControlMetrics",
    "MetricsSnapshot",
    "QuotaEntry",
    "QuotaSource",
    "package_version",
]
