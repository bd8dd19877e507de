"""Entry point of `hami-node`: load the config, then wire the GPU backend, the device state, the health
loop, the Kubernetes side (pod watch, bind-phase writer, inventory reporter) and the kubelet plugin
together, and run until SIGTERM/SIGINT (SIGHUP restarts the plugin and re-registers). With
`--health-bind`, an HTTP endpoint answers kubelet's probes (`hami_node.healthz`): /healthz while the
plugin's gRPC server serves, /readyz once it is registered with kubelet and the Node carries the inventory;
/metrics on the same port serves the node's metrics (`hami_node.monitor.exporter`: per GPU, per container
from HAMi-core's shared regions, the daemon's health). The container monitor (`hami_node.monitor.loop`)
runs HAMi's priority feedback on the shared regions and, with fake GPUs, the simulated containers.

With `--mode dra` (`hami_node.dra`) the same backend, device state and health loop feed the DRA side
instead: the claim preparer (with the watch of the node's pods, whose pods it takes instead of reading
those of a new claim), the ResourceSlice publisher (with the watch of the node's slices) and the DRA
plugin's registration and DRA sockets. Neither the device plugin, the pod tracker nor the inventory
annotations run, and the publisher removes inventory annotations a device-plugin run left on the Node,
so the HAMi scheduler extender never counts a DRA node's GPUs (it only places pods on nodes carrying
`hami.io/node-nvidia-register`). /healthz: both DRA sockets serve; /readyz: kubelet registered the
plugin and the node's slice is published.

Start-up errors (bad flags or config file, bad fake inventory, no kubeconfig) print one line naming
what to fix and exit 2; they never print a traceback."""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hami_api import annotations as ann
from hami_kube.blocking import ThreadedEventRecorder
from hami_kube.client import component_user_agent
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.events import EventSource
from hami_node import kubeapi
from hami_node.allocation import vgpu_dir
from hami_node.cdi import CdiError, cdi_spec_writer, common_device_nodes
from hami_node.config import (
    POD_RESOURCES_AUTO,
    ConfigError,
    HelpRequested,
    NodeConfig,
    OperatingMode,
    load_config,
)
from hami_node.devices import DeviceState, InventoryPublisher, filter_gpus
from hami_node.dra.claims import ClaimRef
from hami_node.dra.prepare import ClaimPreparer, Outcome
from hami_node.dra.publisher import SlicePublisher
from hami_node.dra.server import DraPluginServers, DraServerError
from hami_node.dra.watched import WatchedPods
from hami_node.gpu import BackendConfigError, GPUBackend, GPUBackendKind, open_backend
from hami_node.gpu.inventory import InventoryError
from hami_node.gpu.select import device_node_exists
from hami_node.gpu.topology import read_pair_scores
from hami_node.health import HealthMonitor
from hami_node.healthz import HealthServer, HealthServerError, Page, Probe
from hami_node.mig_manager import MigManager, MigReconciler, discover_registrations, prime_from_pods
from hami_node.monitor.cleanup import StaleDirCleaner
from hami_node.monitor.exporter import ContainerCollector, GPUCollector, NodeMetrics
from hami_node.monitor.loop import ContainerMonitor
from hami_node.monitor.regions import RegionScanner, containers_dir
from hami_node.monitor.simulate import DEFAULT_PRIORITY, ContainerSimulator, SimulatedDevice
from hami_node.nvidia.daemon import NodeLabeler, NvidiaInitError, NvidiaPlugins
from hami_node.plugin.kubelet_pods import KubeletPods
from hami_node.plugin.manager import PluginManager, Restartable, install_signal_handlers
from hami_node.plugin.server import MigSupport, PluginServer
from hami_node.pods import PodTracker
from hami_node.ports import AllocatedContainer, ObserverFactory
from hami_node.reporter import EVENT_SOURCE as REPORTER_EVENT_SOURCE
from hami_node.reporter import NodeReporter

log = logging.getLogger("hami_node")

EXIT_CONFIG = 2
SIGNAL_POLL_S = 0.5
"""How often the main thread wakes up while it waits for SIGTERM (see `main`)."""
DRA_EVENT_SOURCE = "hami-node"
"""The `source.component` of the DRA mode's Events about the Node."""


@dataclass
class NodeDaemon:
    """Every long-lived part of the daemon: started in dependency order, stopped in reverse."""

    config: NodeConfig
    plugin: Restartable
    """The kubelet plugin SIGHUP restarts: the device plugin's `PluginManager`, or in DRA mode the DRA
    plugin's `DraPluginServers`."""
    stops: list[tuple[str, Callable[[], object]]] = field(default_factory=list)
    health_endpoint: HealthServer | None = None
    """The /healthz, /readyz and /metrics server, when `config.health_bind` is set."""
    metrics: NodeMetrics | None = None

    def stop(self) -> None:
        for name, stop in reversed(self.stops):
            try:
                stop()
            except Exception:
                log.exception("stopping the %s failed", name)
        self.stops.clear()


def _read_file(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def start_daemon(config: NodeConfig, *, observer_factory: ObserverFactory | None = None) -> NodeDaemon:
    """Build and start every part; raises `StartupError` for what the user must fix. `observer_factory`
    makes the file watches' observers (watchdog's own when None)."""
    if config.unsupported is not None:
        raise StartupError(config.unsupported)
    try:
        backend = open_backend(config.gpu_backend, config.fake_inventory, observer_factory=observer_factory)
    except (BackendConfigError, InventoryError) as exc:
        raise StartupError(str(exc)) from None
    try:
        kube = kubeapi.NodeApi.connect(
            config.kubeconfig,
            environ=dict(config.in_cluster_env),
            qps=config.kube_api_qps,
            burst=config.kube_api_burst,
            user_agent=component_user_agent("hami-node"),
        )
    except KubeConfigError as exc:
        raise StartupError(str(exc)) from None
    try:  # until the steps own it, the client's loop thread is closed here on any error
        state = DeviceState(config)
        simulator = _simulator(config)
        metrics = NodeMetrics(config.node_name, on_container=None if simulator is None else simulator[1])
        kube.on_error = metrics.api_error
        metrics.watch_daemon(gpus=state.gpus, fenced=lambda: state.fenced)
        metrics.add_collector(
            GPUCollector(config.node_name, state.gpus, backend.usage, legacy=config.legacy_metrics)
        )
        parts = _Common(
            config,
            kube,
            backend,
            state,
            kube.event_recorder(config.node_name),
            HealthMonitor(backend, state, config, on_xid=metrics.xid),
            device_node_exists(config.gpu_backend),
            observer_factory,
            metrics,
            None if simulator is None else simulator[0],
        )
        if config.nvidia is not None:
            daemon, steps = _nvidia_steps(parts)
        else:
            daemon, steps = _dra_steps(parts) if config.dra else _device_plugin_steps(parts)
        daemon.metrics = metrics
        if (endpoint := daemon.health_endpoint) is not None:
            # Early, so a port in use fails start-up before the other threads run; it answers 503 until ready.
            steps.insert(1, ("health endpoint", endpoint.start, endpoint.stop))
    except BaseException:
        kube.close()
        raise
    try:
        for name, start, stop in steps:
            start()
            daemon.stops.append((name, stop))
    except (HealthServerError, CdiError, DraServerError, NvidiaInitError) as exc:
        daemon.stop()
        raise StartupError(str(exc)) from None
    except OSError as exc:
        daemon.stop()
        raise StartupError(f"cannot start: {exc}") from None
    except BaseException:
        daemon.stop()
        raise
    return daemon


Step = tuple[str, Callable[[], object], Callable[[], object]]


@dataclass(frozen=True)
class _Common:
    """The parts both modes use."""

    config: NodeConfig
    kube: kubeapi.NodeApi
    backend: GPUBackend
    state: DeviceState
    events: ThreadedEventRecorder
    health: HealthMonitor
    exists: Callable[[str], bool]
    observer_factory: ObserverFactory | None
    metrics: NodeMetrics
    simulator: ContainerSimulator | None


def _simulator(config: NodeConfig) -> tuple[ContainerSimulator, Callable[[AllocatedContainer], None]] | None:
    """The fake backend's simulated containers (`hami_node.monitor.simulate`) and the Allocate hook that
    starts one; none with `--fake-container-usage=false`, in DRA mode or with NVML."""
    if config.gpu_backend is not GPUBackendKind.FAKE or not config.fake_container_usage or config.dra:
        return None
    simulator = ContainerSimulator()

    def started(container: AllocatedContainer) -> None:
        devices = [SimulatedDevice(u, mib * 1024 * 1024, cores) for u, mib, cores in container.devices]
        priority = DEFAULT_PRIORITY if container.priority is None else container.priority
        simulator.add(container.pod_uid, Path(container.cache_file), devices, priority)

    return simulator, started


def _node_pod_uids(kube: kubeapi.NodeApi, node_name: str) -> set[str]:
    """The UIDs of every pod on `node_name`, read from the API server now (the stale directory cleaner's
    check before it removes anything). Raises `KubeApiError`."""
    pods, _ = kube.list_pods(f"spec.nodeName={node_name}")
    return {uid for pod in pods if isinstance(uid := (pod.get("metadata") or {}).get("uid"), str)}


def _mig_parts(parts: _Common) -> tuple[MigSupport | None, list[Step]]:
    """Operating mode mig (HAMi v2.10's dynamic MIG): the GPUs' MIG registrations, the live pods'
    instances adopted, the 5 s reconciler (`hami_node.mig_manager`); nothing in the other modes."""
    config, kube, backend = parts.config, parts.kube, parts.backend
    if config.operating_mode is not OperatingMode.MIG:
        return None, []
    manager = MigManager(backend)

    def node_pods() -> list[dict[str, Any]]:
        return kube.list_pods(f"spec.nodeName={config.node_name}")[0]

    reconciler = MigReconciler(manager, node_pods)

    def start() -> None:
        gpus = filter_gpus(backend.list_gpus(), config.filter_devices)
        parts.state.set_mig(discover_registrations(backend, gpus, config.mig_profile_allowlist))
        try:
            problems = prime_from_pods(manager, node_pods(), {g.uuid for g in gpus})
        except KubeApiError as err:
            problems = [str(err)]
        for problem in problems:
            log.info("mig init: failed to adopt active MIG allocations: %s", problem)
        reconciler.start()

    return MigSupport(manager, kube, reconciler), [("MIG instances", start, reconciler.stop)]


def _kubelet_pods(config: NodeConfig) -> KubeletPods | None:
    """kubelet's PodResources API, read to tell which pod kubelet admits (`--pod-resources-socket`):
    "auto" takes the socket next to kubelet's device-plugin directory when it is there now."""
    value = config.pod_resources_socket
    if not value:
        log.info(
            "kubelet's PodResources API is not read: pods asking as many GPUs are bound here one at a time"
        )
        return None
    path = config.pod_resources_auto_path if value == POD_RESOURCES_AUTO else Path(value)
    if value == POD_RESOURCES_AUTO and not path.is_socket():
        log.info(
            "no kubelet PodResources socket at %s: pods asking as many GPUs are bound here one at a time "
            "(mount it, or name it with --pod-resources-socket)",
            path,
        )
        return None
    log.info("kubelet's PodResources API at %s tells which pod kubelet admits", path)
    return KubeletPods(path, config.resource_name, timeout_s=max(config.allocate_wait_seconds, 1.0))


def _device_plugin_steps(parts: _Common) -> tuple[NodeDaemon, list[Step]]:
    config, kube, state, events = parts.config, parts.kube, parts.state, parts.events
    observer_factory = parts.observer_factory
    kubelet = _kubelet_pods(config)
    tracker = PodTracker(
        config.node_name,
        kube,
        events=events,
        read_timeout_s=config.allocate_wait_seconds,
        resource_name=config.resource_name,
        kubelet=kubelet,
    )
    watch = kubeapi.watch_node_pods(kube.bridge, config.node_name, tracker, start=False)
    topology = partial(read_pair_scores, parts.backend) if config.enable_topology_score else None
    identification = ann.NODE_POD_IDENTIFICATION_PODRESOURCES if kubelet is not None else None
    reporter = NodeReporter(
        kube,
        config.node_name,
        check_interval_s=config.register_interval_seconds,
        topology=topology,
        events=events.with_source(EventSource(REPORTER_EVENT_SOURCE)),
        fixed={ann.NODE_POD_IDENTIFICATION: identification},
    )
    publisher = InventoryPublisher(state, reporter)
    metrics = parts.metrics
    mig, mig_steps = _mig_parts(parts)
    factory = (
        None if mig is None else (lambda: PluginServer(config, state, tracker, observer=metrics, mig=mig))
    )
    if observer_factory is None:
        plugin = PluginManager(config, state, tracker, observer=metrics, server_factory=factory)
    else:
        plugin = PluginManager(
            config,
            state,
            tracker,
            observer_factory=observer_factory,
            observer=metrics,
            server_factory=factory,
        )
    daemon = NodeDaemon(config, plugin)
    metrics.watch_daemon(registered=lambda: plugin.registered)
    if config.health_bind is not None:
        daemon.health_endpoint = _health_endpoint(config, plugin, reporter, {"/metrics": metrics.render})
    scanner = RegionScanner(containers_dir(vgpu_dir(config)))
    metrics.add_collector(
        ContainerCollector(scanner.scan, tracker, legacy=config.legacy_metrics, refused=scanner.refused)
    )
    # Only the fake backend takes the simulated containers' per-GPU sums.
    set_usage: Callable[[dict[str, tuple[int, int]]], None] | None = getattr(parts.backend, "set_usage", None)
    cleaner = StaleDirCleaner(
        scanner.root,
        config.node_name,
        tracker,
        partial(_node_pod_uids, kube, config.node_name),
        removed=metrics.container_dirs_removed,
    )
    monitor = ContainerMonitor(
        scanner,
        feedback=config.priority_feedback,
        simulator=parts.simulator,
        live=lambda uid: tracker.pod_name(uid) is not None,
        set_usage=set_usage,
        written=metrics.feedback_written,
        cleaner=cleaner,
    )

    def stop_tracker() -> None:
        tracker.flush(2.0)  # let the last bind-phase patches out
        tracker.stop()
        if kubelet is not None:
            kubelet.close()

    steps: list[Step] = [
        ("kubernetes client", lambda: None, kube.close),
        ("pod tracker", tracker.start, stop_tracker),
        ("pod watch", watch.start, watch.stop),
        ("inventory reporter", reporter.start, reporter.stop),
        # The health monitor lists the GPUs (or fences them) before the plugin first serves kubelet.
        ("health monitor", parts.health.start, parts.health.stop),
        *mig_steps,
        ("inventory publisher", publisher.start, publisher.stop),
        ("kubelet plugin", plugin.start, plugin.stop),
    ]
    if monitor.active:
        steps.insert(-1, ("container monitor", monitor.start, monitor.stop))
    cdi = cdi_spec_writer(
        state,
        config.cdi_spec_dir,
        parts.exists,
        enabled=config.uses_cdi,
        mig=None if mig is None else mig.manager,
    )
    if cdi is not None:  # the spec is written before the plugin hands out a CDI name
        steps.insert(-1, ("CDI spec writer", cdi.start, cdi.stop))
    return daemon, steps


class CountedPreparer(ClaimPreparer):
    """The claim preparer, telling `counted(ok, failed)` how each call's claims were answered (for
    `hami_node_dra_prepare_claims_total`); a call that raises counts every claim failed (kubelet gets
    the error)."""

    counted: Callable[[int, int], None] | None = None

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        counted = self.counted
        try:
            outcomes = super().prepare(refs)
        except Exception:
            if counted is not None:
                counted(0, len({ref.uid for ref in refs}))
            raise
        if counted is not None:
            failed = sum(1 for outcome in outcomes.values() if outcome.claim is None)
            counted(len(outcomes) - failed, failed)
        return outcomes


def _dra_steps(parts: _Common) -> tuple[NodeDaemon, list[Step]]:
    """DRA mode (see the module docstring). A node spec a device-plugin run with CDI left is removed
    (`cdi_spec_writer` without a CDI strategy); the claims' specs are the preparer's."""
    config, kube, state, events, exists = parts.config, parts.kube, parts.state, parts.events, parts.exists
    observer_factory = parts.observer_factory
    cdi_spec_writer(state, config.cdi_spec_dir, exists, enabled=False)
    license_file = os.path.join(config.hook_path, "vgpu", "license")
    pods = WatchedPods()
    pod_watch = kubeapi.watch_node_pods(kube.bridge, config.node_name, pods, start=False)
    pods.healthy = lambda: pod_watch.reflector.failures == 0
    preparer = CountedPreparer(
        config,
        state.gpus,
        kube,
        common_nodes=lambda: common_device_nodes(exists),
        license_present=lambda: os.path.exists(license_file),
        backend=parts.backend,
        watched=pods,
    )
    publisher = SlicePublisher(
        config,
        state,
        kube,
        events=events.with_source(EventSource(DRA_EVENT_SOURCE, config.node_name)),
        mig_profiles=parts.backend.mig_profiles,
    )
    watch = kubeapi.watch_node_slices(
        kube.bridge, config.node_name, config.dra_driver_name, publisher, start=False
    )
    if observer_factory is None:
        servers = DraPluginServers(config, state, preparer, partitions=publisher.partitions)
    else:
        servers = DraPluginServers(
            config, state, preparer, observer_factory=observer_factory, partitions=publisher.partitions
        )
    daemon = NodeDaemon(config, servers)
    preparer.counted = parts.metrics.claims_prepared
    parts.metrics.watch_daemon(registered=lambda: servers.registered, dra=True)
    if config.health_bind is not None:
        pages: dict[str, Page] = {"/metrics": parts.metrics.render}
        daemon.health_endpoint = _dra_health_endpoint(config, servers, publisher, pages)

    def stop_pod_watch() -> None:
        pod_watch.stop()
        pods.forget()

    steps: list[Step] = [
        ("kubernetes client", lambda: None, kube.close),
        ("health monitor", parts.health.start, parts.health.stop),
        ("claim preparer", preparer.start, lambda: None),
        ("pod watch", pod_watch.start, stop_pod_watch),
        ("ResourceSlice publisher", publisher.start, publisher.stop),
        ("ResourceSlice watch", watch.start, watch.stop),
        ("DRA plugin", servers.start, servers.stop),
    ]
    return daemon, steps


def _nvidia_steps(parts: _Common) -> tuple[NodeDaemon, list[Step]]:
    """NVIDIA's modes (`hami_node.nvidia.daemon`): one device plugin per NVIDIA resource, GFD's labels on
    the Node; no pod watch, no inventory annotation (kube-scheduler places the pods), no CDI spec of
    HAMi's (a spec a HAMi run left is removed)."""
    config, kube = parts.config, parts.kube
    cdi_spec_writer(parts.state, config.cdi_spec_dir, parts.exists, enabled=False)
    options = {} if parts.observer_factory is None else {"observer_factory": parts.observer_factory}
    plugins = NvidiaPlugins(
        config,
        parts.state,
        parts.backend,
        exists=parts.exists,
        observer=parts.metrics,
        manager_options=options,
    )
    labeler = NodeLabeler(kube, config.node_name, plugins)
    daemon = NodeDaemon(config, plugins)
    parts.metrics.watch_daemon(registered=lambda: plugins.registered)
    if config.health_bind is not None:
        daemon.health_endpoint = HealthServer(
            config.health_bind.host,
            config.health_bind.port,
            live=[Probe("device plugins", lambda: None if plugins.serving else "not serving")],
            ready=[Probe("kubelet", lambda: None if plugins.registered else "not registered with kubelet")],
            pages={"/metrics": parts.metrics.render},
        )
    steps: list[Step] = [
        ("kubernetes client", lambda: None, kube.close),
        ("health monitor", parts.health.start, parts.health.stop),
        ("NVIDIA device plugins", plugins.start, plugins.stop),
        ("NVIDIA node labels", labeler.start, labeler.stop),
    ]
    return daemon, steps


def _health_endpoint(
    config: NodeConfig, plugin: PluginManager, reporter: NodeReporter, pages: dict[str, Page]
) -> HealthServer:
    """/healthz: the plugin's gRPC server serves. /readyz: registered with kubelet (so serving too), and
    the Node's inventory annotation checked or written at least once (a later change still on its way
    does not make the daemon unready)."""
    assert config.health_bind is not None

    def serving() -> str | None:
        server = plugin.server
        return None if server is not None and server.serving else "the gRPC server is not serving"

    def registered() -> str | None:
        return None if plugin.registered else "not registered with kubelet"

    def published() -> str | None:
        if reporter.checks > 0:
            return None
        return f"the GPU inventory is not yet written on Node {config.node_name}"

    return HealthServer(
        config.health_bind.host,
        config.health_bind.port,
        live=[Probe("device plugin", serving)],
        ready=[Probe("kubelet", registered), Probe("inventory", published)],
        pages=pages,
    )


def _dra_health_endpoint(
    config: NodeConfig, servers: DraPluginServers, publisher: SlicePublisher, pages: dict[str, Page]
) -> HealthServer:
    """/healthz: both DRA sockets serve. /readyz: kubelet registered the plugin and the node's
    ResourceSlice says what the GPUs say (at least once)."""
    assert config.health_bind is not None

    def serving() -> str | None:
        return None if servers.serving else "the DRA plugin's sockets are not served"

    def registered() -> str | None:
        return None if servers.registered else "not registered with kubelet"

    def published() -> str | None:
        return (
            None if publisher.synced else f"the ResourceSlice of node {config.node_name} is not published yet"
        )

    return HealthServer(
        config.health_bind.host,
        config.health_bind.port,
        live=[Probe("DRA plugin", serving)],
        ready=[Probe("kubelet", registered), Probe("ResourceSlice", published)],
        pages=pages,
    )


class StartupError(Exception):
    """Something the user must fix before the daemon can run (the message says what)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args, os.environ, _read_file)
    except HelpRequested as help_text:
        print(help_text)
        return 0
    except ConfigError as exc:
        print(f"hami-node: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    # The level applies to our loggers only: at debug, watchdog would log every file event in the
    # watched directories, and a log file kept there would feed itself.
    writer = _log_to_stderr()
    try:
        return _run(config)
    finally:
        writer.stop()


def _log_to_stderr() -> logging.handlers.QueueListener:
    """The daemon's log lines go through a queue to a thread of their own that writes them to stderr:
    a thread that logs (the one answering kubelet's Allocate) never waits for the write (it cost an
    Allocate about 0.3 ms at p50 when written in place, bench/node.py). `stop()` writes what is queued."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    writer = logging.handlers.QueueListener(records, handler)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    root.addHandler(logging.handlers.QueueHandler(records))
    writer.start()
    return writer


def _run(config: NodeConfig) -> int:
    log.setLevel(config.log_level.value.upper())
    for warning in config.warnings:
        log.warning("%s (accepted for compatibility, ignored)", warning)
    try:
        daemon = start_daemon(config)
    except StartupError as exc:
        print(f"hami-node: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    shutdown = threading.Event()
    restore = install_signal_handlers(daemon.plugin, shutdown)
    if config.dra:
        log.info(
            "hami-node running on node %s in DRA mode: %s backend, driver %s",
            config.node_name,
            config.gpu_backend.value,
            config.dra_driver_name,
        )
    else:
        log.info(
            "hami-node running on node %s: %s backend, resource %s on %s",
            config.node_name,
            config.gpu_backend.value,
            config.resource_name,
            config.socket_path,
        )
    try:
        # Python runs a signal's handler in the main thread, between two bytecodes: a main thread
        # blocked in a lock with no timeout misses a SIGTERM that another thread received, or that
        # came just before the lock's wait began (python/cpython#85300), and the daemon ignored it
        # until kubelet's SIGKILL. Waking every half second runs a pending handler.
        while not shutdown.wait(SIGNAL_POLL_S):
            pass
    finally:
        log.info("hami-node stopping")
        restore()
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
