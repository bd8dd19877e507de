"""hami-node's Prometheus metrics: per GPU, per container (as HAMi's vGPU monitor exports them) and the
daemon's own health. Served at `GET /metrics` on the health endpoint (`--health-bind`).

Everything lives in a private `CollectorRegistry` per `NodeMetrics` (several daemons share a process in
hami-sim). GPU and container families are built at scrape time (no background work): the GPUs from
`DeviceState` and `GPUBackend.usage`, the containers from their HAMi-core shared region files
(`regions.RegionScanner`) named through the pod watch (`ports.PodDirectory`).

**HAMi's families** (`cmd/vGPUmonitor/metrics.go`, HAMi v2.10; each also carries `zone="vGPU"`, as
HAMi registers its collector through `WrapRegistererWith({"zone": "vGPU"})`):

================================================  =====================================================
`hami_host_gpu_memory_used_bytes`                 node, device_index, device_uuid, device_type
`hami_host_gpu_utilization_ratio`                 same; percent (0-100), as HAMi
`hami_host_gpu_memory_controller_utilization_ratio`  device_index, device_uuid, device_type (no node,
                                                  as HAMi); percent
`hami_vgpu_memory_used_bytes`                     namespace, pod, container, vdevice_index, device_uuid
`hami_vgpu_memory_limit_bytes`                    same labels
`hami_container_device_memory_bytes`              same labels; = used
`hami_container_device_utilization_ratio`         same labels; SM percent summed over processes
`hami_container_last_kernel_elapsed_seconds`      same labels; only once a kernel ran
`hami_vgpu_memory_{context,module,buffer}_bytes`  same labels
================================================  =====================================================

With `legacy` (`--legacy-metrics`, on by default here, off in HAMi, so dashboards built on the names
HAMi used before v2.9 keep working) also the legacy names, with their label names: `HostGPUMemoryUsage`
and `HostCoreUtilization` {nodeid, deviceidx, deviceuuid, devicetype}; `vGPU_device_memory_usage_in_bytes`,
`vGPU_device_memory_limit_in_bytes`, `Device_utilization_desc_of_container`,
`Device_last_kernel_of_container` {podnamespace, podname, ctrname, vdeviceid, deviceuuid};
`Device_memory_desc_of_container` with context, module, data, offset as labels too (offset = total -
context - module - data, clamped at 0 where HAMi's unsigned subtraction would wrap).

Not exported: HAMi's MIG families (`hami_mig_device_info`, `MigInfo`): no MIG support here.

**Our families** (no zone): `hami_node_gpu_memory_total_bytes`, `hami_node_gpu_healthy` (1/0)
{node, device_index, device_uuid, device_type}; `hami_node_gpu_xid_errors_total` {node, device_uuid,
xid} (every Xid event, acted on or not; an event for all GPUs counts on each); the daemon's health:
`hami_node_allocate_duration_seconds` {result: success|failure} (histogram), `hami_node_registrations_total`
{result}, `hami_node_list_and_watch_updates_total`, `hami_node_kube_api_errors_total` {verb, code: the
HTTP status, 0 when none came back}, `hami_node_priority_feedback_writes_total` {field:
recent_kernel|utilization_switch}, `hami_node_shared_regions` {state: decoded|refused} (the region
files seen at the last scrape); the daemon's state for alerts (`watch_daemon`): `hami_node_fenced` (1
while NVML fails and every GPU is withdrawn), `hami_node_kubelet_registered` (1 while registered with
kubelet), and in DRA mode `hami_node_dra_prepare_claims_total` {result: success|failure} (claims
NodePrepareResources answered).

**Every counter and histogram exists from start-up at zero** for every label set known then (each
`result`, each feedback `field`), so Prometheus sees the first event as an increase: a series that
appears at 1 has no earlier sample, and `increase()` and `rate()` count nothing for it. Xid codes are not
known in advance: the first Xid of a code creates that code's series on every GPU of the node at zero
(so a later one on another GPU counts); the first one of a code on the node appears at 1, which the
dashboard's Xid panel and the Xid alert count with `unless ... offset` (docs/observability.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami_node.devices import GPUStatus
from hami_node.gpu.backend import GPUBackendError, GPUUsage
from hami_node.monitor.feedback import FieldWrite
from hami_node.monitor.region import RegionField
from hami_node.monitor.regions import ContainerRegion
from hami_node.ports import AllocatedContainer, PodDirectory

log = logging.getLogger(__name__)

ZONE = "vGPU"
MIB = 1024 * 1024

HOST_LABELS = ("node", "device_index", "device_uuid", "device_type")
HOST_MC_LABELS = ("device_index", "device_uuid", "device_type")
CONTAINER_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
LEGACY_HOST_LABELS = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
LEGACY_CONTAINER_LABELS = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
LEGACY_MEMORY_DESC_LABELS = (*LEGACY_CONTAINER_LABELS, "context", "module", "data", "offset")

HAMI_HOST_FAMILIES = (
    "hami_host_gpu_memory_used_bytes",
    "hami_host_gpu_utilization_ratio",
    "hami_host_gpu_memory_controller_utilization_ratio",
)
HAMI_CONTAINER_FAMILIES = (
    "hami_vgpu_memory_used_bytes",
    "hami_vgpu_memory_limit_bytes",
    "hami_container_device_memory_bytes",
    "hami_container_device_utilization_ratio",
    "hami_container_last_kernel_elapsed_seconds",
    "hami_vgpu_memory_context_bytes",
    "hami_vgpu_memory_module_bytes",
    "hami_vgpu_memory_buffer_bytes",
)
LEGACY_FAMILIES = (
    "HostGPUMemoryUsage",
    "HostCoreUtilization",
    "vGPU_device_memory_usage_in_bytes",
    "vGPU_device_memory_limit_in_bytes",
    "Device_memory_desc_of_container",
    "Device_utilization_desc_of_container",
    "Device_last_kernel_of_container",
)

Spec = tuple[str, str, Sequence[str], bool]
"""A gauge family: name, help, label names, whether it carries HAMi's zone label."""

_C = CONTAINER_LABELS
CONTAINER_SPECS: tuple[Spec, ...] = (
    ("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", _C, True),
    ("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", _C, True),
    ("hami_container_device_memory_bytes", "Container device memory usage in bytes", _C, True),
    ("hami_container_device_utilization_ratio", "Container device SM utilization ratio", _C, True),
    (
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since last kernel execution in container",
        _C,
        True,
    ),
    ("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", _C, True),
    ("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", _C, True),
    ("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", _C, True),
    ("hami_node_shared_regions", "HAMi-core region files seen at this scrape, by state", ("state",), False),
)
_L = LEGACY_CONTAINER_LABELS
LEGACY_CONTAINER_SPECS: tuple[Spec, ...] = (
    ("vGPU_device_memory_usage_in_bytes", "vGPU device usage", _L, True),
    ("vGPU_device_memory_limit_in_bytes", "vGPU device limit", _L, True),
    (
        "Device_memory_desc_of_container",
        "Container device memory description",
        LEGACY_MEMORY_DESC_LABELS,
        True,
    ),
    ("Device_utilization_desc_of_container", "Container device utilization description", _L, True),
    ("Device_last_kernel_of_container", "Container device last kernel description", _L, True),
)

FEEDBACK_FIELDS = {
    RegionField.RECENT_KERNEL: "recent_kernel",
    RegionField.UTILIZATION_SWITCH: "utilization_switch",
}
"""The `field` label of `hami_node_priority_feedback_writes_total`, per region field the feedback writes."""

ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def device_type(model: str) -> str:
    """HAMi's `device_type` label: "NVIDIA-" + the NVML name."""
    return f"NVIDIA-{model}"


def _gauge(name: str, help_text: str, labels: Sequence[str], *, zone: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=[*labels, "zone"] if zone else list(labels))


class _Families:
    """The gauges of one scrape, by name; the zone label is added to the families that carry it."""

    def __init__(self, specs: Iterable[Spec]) -> None:
        self._families = {name: _gauge(name, text, labels, zone=zone) for name, text, labels, zone in specs}
        self._zoned = {name for name, _text, _labels, zone in specs if zone}

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        zone = [ZONE] if name in self._zoned else []
        self._families[name].add_metric([*labels, *zone], value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


class GPUCollector(Collector):
    """HAMi's host GPU families and ours, per GPU of `gpus()` (the daemon's `DeviceState.gpus`); usage
    from `usage(uuid)` (`GPUBackend.usage`: a GPU it fails for gets no usage samples that scrape)."""

    def __init__(
        self,
        node: str,
        gpus: Callable[[], Sequence[GPUStatus]],
        usage: Callable[[str], GPUUsage],
        *,
        legacy: bool,
    ) -> None:
        self._node = node
        self._gpus = gpus
        self._usage = usage
        self._legacy = legacy

    def collect(self) -> Iterator[Metric]:
        specs: list[Spec] = [
            ("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes", HOST_LABELS, True),
            ("hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)", HOST_LABELS, True),
            (
                "hami_host_gpu_memory_controller_utilization_ratio",
                "GPU memory controller utilization ratio (0-100)",
                HOST_MC_LABELS,
                True,
            ),
            ("hami_node_gpu_memory_total_bytes", "GPU device memory in bytes", HOST_LABELS, False),
            (
                "hami_node_gpu_healthy",
                "1 while the GPU is healthy (advertised as Healthy)",
                HOST_LABELS,
                False,
            ),
        ]
        if self._legacy:
            specs += [
                ("HostGPUMemoryUsage", "GPU device memory usage", LEGACY_HOST_LABELS, True),
                ("HostCoreUtilization", "GPU core utilization", LEGACY_HOST_LABELS, True),
            ]
        out = _Families(specs)
        for gpu in self._gpus():
            info = gpu.info
            labels = [self._node, str(info.index), info.uuid, device_type(info.model)]
            out.add("hami_node_gpu_healthy", labels, 1.0 if gpu.healthy else 0.0)
            try:
                usage = self._usage(info.uuid)
            except GPUBackendError as err:
                log.debug("metrics: no usage for GPU %s: %s", info.uuid, err)
                out.add("hami_node_gpu_memory_total_bytes", labels, float(info.memory_mib * MIB))
                continue
            out.add("hami_node_gpu_memory_total_bytes", labels, float(usage.memory_total_bytes))
            out.add("hami_host_gpu_memory_used_bytes", labels, float(usage.memory_used_bytes))
            if self._legacy:
                out.add("HostGPUMemoryUsage", labels, float(usage.memory_used_bytes))
            if usage.utilization_percent is not None:
                out.add("hami_host_gpu_utilization_ratio", labels, float(usage.utilization_percent))
                if self._legacy:
                    out.add("HostCoreUtilization", labels, float(usage.utilization_percent))
            if usage.memory_utilization_percent is not None:
                out.add(
                    "hami_host_gpu_memory_controller_utilization_ratio",
                    labels[1:],
                    float(usage.memory_utilization_percent),
                )
        yield from out


class ContainerCollector(Collector):
    """HAMi's per-container families from the region files `scan()` finds, for the containers of the
    pods `pods` knows (a directory of a pod not on this node, or of a container not in its spec, is
    skipped, as HAMi's `collectPodAndContainerInfo` does). `clock` is wall time (Unix seconds)."""

    def __init__(
        self,
        scan: Callable[[], Sequence[ContainerRegion]],
        pods: PodDirectory,
        *,
        legacy: bool,
        clock: Callable[[], float] = time.time,
        refused: Callable[[], int] = lambda: 0,
    ) -> None:
        self._scan = scan
        self._pods = pods
        self._legacy = legacy
        self._clock = clock
        self._refused = refused

    def collect(self) -> Iterator[Metric]:
        specs = list(CONTAINER_SPECS)
        if self._legacy:
            specs += LEGACY_CONTAINER_SPECS
        out = _Families(specs)
        regions = self._scan()
        now = int(self._clock())
        for found in regions:
            pod = self._pods.pod_name(found.pod_uid)
            if pod is None or found.container not in pod.containers:
                continue
            self._container(out, found, pod.namespace, pod.name, now)
        out.add("hami_node_shared_regions", ["decoded"], float(len(regions)))
        out.add("hami_node_shared_regions", ["refused"], float(self._refused()))
        yield from out

    def _container(self, out: _Families, found: ContainerRegion, namespace: str, pod: str, now: int) -> None:
        region = found.region
        for i in region.devices():
            uuid = region.uuids[i]
            if not uuid:
                continue  # HAMi: "UUID not yet initialised; skipping until next scrape"
            labels = [namespace, pod, found.container, str(i), uuid[:40]]
            memory = region.memory(i)
            values = {
                "hami_vgpu_memory_used_bytes": memory.total,
                "hami_vgpu_memory_limit_bytes": region.limit[i],
                "hami_container_device_memory_bytes": memory.total,
                "hami_container_device_utilization_ratio": region.sm_util(i),
                "hami_vgpu_memory_context_bytes": memory.context,
                "hami_vgpu_memory_module_bytes": memory.module,
                "hami_vgpu_memory_buffer_bytes": memory.data,
            }
            if self._legacy:
                values |= {
                    "vGPU_device_memory_usage_in_bytes": memory.total,
                    "vGPU_device_memory_limit_in_bytes": region.limit[i],
                    "Device_utilization_desc_of_container": region.sm_util(i),
                }
                offset = max(0, memory.total - memory.context - memory.module - memory.data)
                desc = [*labels, str(memory.context), str(memory.module), str(memory.data), str(offset)]
                out.add("Device_memory_desc_of_container", desc, float(memory.total))
            for name, value in values.items():
                out.add(name, labels, float(value))
            if region.last_kernel_time > 0:
                elapsed = float(max(now - region.last_kernel_time, 0))
                out.add("hami_container_last_kernel_elapsed_seconds", labels, elapsed)
                if self._legacy:
                    out.add("Device_last_kernel_of_container", labels, elapsed)


class DaemonStateCollector(Collector):
    """The daemon's state the alerts read, at scrape time: fenced (NVML failing) and registered with
    kubelet; each gauge only once `NodeMetrics.watch_daemon` gave its source."""

    def __init__(self) -> None:
        self.fenced: Callable[[], str | None] | None = None
        self.registered: Callable[[], bool] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.fenced is not None:
            yield GaugeMetricFamily(
                "hami_node_fenced",
                "1 while NVML fails and the node's GPUs are withdrawn (fenced)",
                value=1.0 if self.fenced() is not None else 0.0,
            )
        if self.registered is not None:
            yield GaugeMetricFamily(
                "hami_node_kubelet_registered",
                "1 while the daemon's plugin is registered with kubelet",
                value=1.0 if self.registered() else 0.0,
            )


class NodeMetrics:
    """The node's metrics registry and the daemon-health instruments (a `ports.PluginObserver`).
    `add_gpus` / `add_containers` register the scrape-time collectors; `render()` is the /metrics body.
    `on_container` is called for each container Allocate answered (the fake backend's simulator).
    Every counter and histogram is created at zero for each label set known at start-up (module
    docstring)."""

    def __init__(
        self, node: str, *, on_container: Callable[[AllocatedContainer], None] | None = None
    ) -> None:
        self.node = node
        self.registry = CollectorRegistry(auto_describe=False)
        self._on_container = on_container
        self._lock = threading.Lock()
        self.allocate_seconds = Histogram(
            "hami_node_allocate_duration_seconds",
            "Time to answer one Allocate RPC, by result",
            ["result"],
            buckets=ALLOCATE_BUCKETS,
            registry=self.registry,
        )
        self.registrations = Counter(
            "hami_node_registrations",
            "Registrations with kubelet, by result",
            ["result"],
            registry=self.registry,
        )
        self.list_and_watch_updates = Counter(
            "hami_node_list_and_watch_updates",
            "ListAndWatch device lists sent to kubelet",
            registry=self.registry,
        )
        self.api_errors = Counter(
            "hami_node_kube_api_errors",
            "Failed Kubernetes API calls, by verb and HTTP status (0: no response)",
            ["verb", "code"],
            registry=self.registry,
        )
        self.xid_errors = Counter(
            "hami_node_gpu_xid_errors",
            "Xid events per GPU and code",
            ["node", "device_uuid", "xid"],
            registry=self.registry,
        )
        self.feedback_writes = Counter(
            "hami_node_priority_feedback_writes",
            "Shared region fields written by the priority feedback, by field",
            ["field"],
            registry=self.registry,
        )
        self.stale_dirs_removed = Counter(
            "hami_node_stale_container_dirs_removed",
            "Container directories removed because their pod has been gone from the node for 5 minutes",
            registry=self.registry,
        )
        self.dra_prepared = Counter(
            "hami_node_dra_prepare_claims",
            "Claims NodePrepareResources answered (DRA mode), by result",
            ["result"],
            registry=self.registry,
        )
        self._state = DaemonStateCollector()
        self.registry.register(self._state)
        self._gpu_uuids: Callable[[], Sequence[str]] = tuple
        self._xid_codes: set[str] = set()
        for result in ("success", "failure"):
            self.registrations.labels(result)
            self.allocate_seconds.labels(result)
        for field in FEEDBACK_FIELDS.values():
            self.feedback_writes.labels(field)
        self.list_and_watch_updates.inc(0)

    def watch_daemon(
        self,
        *,
        gpus: Callable[[], Sequence[GPUStatus]] | None = None,
        fenced: Callable[[], str | None] | None = None,
        registered: Callable[[], bool] | None = None,
        dra: bool = False,
    ) -> None:
        """What the daemon is made of, once built: its GPUs (`DeviceState.gpus`: each Xid code seen gets
        a series on each of them), why it is fenced (`DeviceState.fenced`), whether it is registered with
        kubelet (the plugin's `registered`), and whether it runs in DRA mode (the Prepare counter's
        results at zero)."""
        if gpus is not None:
            self._gpu_uuids = lambda: [gpu.info.uuid for gpu in gpus()]
        if fenced is not None:
            self._state.fenced = fenced
        if registered is not None:
            self._state.registered = registered
        if dra:
            for result in ("success", "failure"):
                self.dra_prepared.labels(result)

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def render(self) -> tuple[str, bytes]:
        """(content type, body) of GET /metrics."""
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)

    # --- ports.PluginObserver -------------------------------------------------------------------------

    def allocate_done(self, seconds: float, ok: bool) -> None:
        self.allocate_seconds.labels("success" if ok else "failure").observe(seconds)

    def container_allocated(self, container: AllocatedContainer) -> None:
        if self._on_container is not None:
            try:
                self._on_container(container)
            except Exception:
                log.exception("after Allocate of %s in pod %s", container.container, container.pod_uid)

    def list_and_watch_sent(self) -> None:
        self.list_and_watch_updates.inc()

    def registration(self, ok: bool) -> None:
        self.registrations.labels("success" if ok else "failure").inc()

    # --- the other daemon parts -----------------------------------------------------------------------

    def api_error(self, verb: str, code: int) -> None:
        self.api_errors.labels(verb, str(code)).inc()

    def xid(self, uuid: str, code: int) -> None:
        xid = str(code)
        with self._lock:
            if xid not in self._xid_codes:
                self._xid_codes.add(xid)
                for other in self._gpu_uuids():
                    self.xid_errors.labels(self.node, other, xid)
        self.xid_errors.labels(self.node, uuid, xid).inc()

    def claims_prepared(self, ok: int, failed: int) -> None:
        """One NodePrepareResources call: `ok` claims prepared, `failed` answered with an error."""
        if ok:
            self.dra_prepared.labels("success").inc(ok)
        if failed:
            self.dra_prepared.labels("failure").inc(failed)

    def container_dirs_removed(self, count: int) -> None:
        self.stale_dirs_removed.inc(count)

    def feedback_written(self, writes: Sequence[FieldWrite]) -> None:
        for write in writes:
            self.feedback_writes.labels(FEEDBACK_FIELDS[write.field]).inc()


__all__ = [
    "HAMI_CONTAINER_FAMILIES",
    "HAMI_HOST_FAMILIES",
    "LEGACY_FAMILIES",
    "ContainerCollector",
    "DaemonStateCollector",
    "GPUCollector",
    "NodeMetrics",
    "device_type",
]
