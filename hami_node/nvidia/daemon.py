"""The node daemon's parts in NVIDIA's modes (`hami-node --config-file <NVIDIA's config file>`).

`NvidiaPlugins` is the kubelet side: once the health monitor listed the GPUs, it reads their MIG layout
from the backend, builds NVIDIA's device map (`hami_node.nvidia.plugin.NvidiaDevices`), and runs one
`PluginManager` per served resource, each serving an `NvidiaPluginServer` on NVIDIA's socket name and
registering NVIDIA's resource name with kubelet. A device map NVIDIA's plugin refuses (an invalid MIG
layout for the strategy, no GPU at all, NVML failing) is NVIDIA's `failOnInitError`: with it (the
default) start-up fails with NVIDIA's text; without it the daemon logs the error and serves nothing, as
NVIDIA's plugin blocks. With a cdi-* device-list strategy, NVIDIA's CDI spec of the served GPUs and MIG
devices is written before the first plugin serves (`hami_node.nvidia.cdi`; a failure stops start-up
with `CdiError` naming the file), as NVIDIA's plugin-manager.go calls CreateSpecFile before its plugins.
The GPUs' links are read once for the aligned preferred allocation of whole GPUs.

`NodeLabeler` writes the labels GPU feature discovery sets for these modes on the Node (in a real
cluster GFD writes them; hami-node writes the same values so the local cluster and a cluster without
GFD see them) and removes HAMi's inventory annotations a HAMi device-plugin run left, so the HAMi
scheduler extender never places a pod on GPUs NVIDIA's resources hand out. hami-node writes no
`hami.io/node-nvidia-register` in these modes: pods go through kube-scheduler alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hami_api.annotations import NODE_PAIR_SCORE, NODE_REGISTER
from hami_kube.errors import KubeApiError
from hami_node.config import NodeConfig
from hami_node.devices import DeviceState
from hami_node.gpu.backend import GPUBackend, GPUBackendError
from hami_node.nvidia.aligned import PairScore, pair_scorer
from hami_node.nvidia.cdi import MigMinors, NvidiaCdiSpec, read_mig_minors
from hami_node.nvidia.device_map import DeviceMapError, empty_mig_gpus, plugin_socket_name
from hami_node.nvidia.plugin import (
    NvidiaDevices,
    NvidiaPluginServer,
    NvidiaPluginServicer,
    adapt_devices,
    label_patch,
)
from hami_node.plugin.manager import PluginGroup, PluginManager
from hami_node.ports import PluginObserver, PodSource

log = logging.getLogger(__name__)


class NvidiaInitError(Exception):
    """NVIDIA's plugin cannot start on these devices and failOnInitError is set (the message is
    NVIDIA's)."""


class _NoPods:
    """NVIDIA's modes read no pod: the managers' `PodSource` is never used by NVIDIA's servers."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"NVIDIA's modes read no pods ({name})")


class NvidiaPlugins:
    """The plugin managers of NVIDIA's resources (a `Restartable`); see the module docstring."""

    def __init__(
        self,
        config: NodeConfig,
        state: DeviceState,
        backend: GPUBackend,
        *,
        exists: Callable[[str], bool] = lambda _path: False,
        observer: PluginObserver | None = None,
        manager_options: Mapping[str, Any] | None = None,
    ) -> None:
        assert config.nvidia is not None
        self._config = config
        self._nvidia = config.nvidia
        self._state = state
        self._backend = backend
        self._exists = exists
        self._observer = observer
        self._options = dict(manager_options or {})
        self.devices: NvidiaDevices | None = None
        self.group = PluginGroup(())
        self.error: str | None = None
        """Why nothing is served (failOnInitError false), None when serving."""
        self.cdi_spec: NvidiaCdiSpec | None = None
        """NVIDIA's CDI spec, written at start with a cdi-* device-list strategy."""
        self._read_mig_minors = read_mig_minors

    def build(self) -> NvidiaDevices:
        """The device map of the GPUs the health monitor listed. Raises `NvidiaInitError`."""
        if not self._state.listed or self._state.fenced is not None:
            raise NvidiaInitError(
                f"failed to initialize NVML: {self._state.fenced or 'the GPUs could not be listed'}"
            )
        gpus = [g.info for g in self._state.gpus()]
        if not gpus:
            raise NvidiaInitError("no devices found. Waiting indefinitely.")
        try:
            devices = adapt_devices(self._backend, gpus, self._mig_minors())
            built = NvidiaDevices(self._nvidia, devices, self._pair_score([g.uuid for g in gpus]))
        except (DeviceMapError, GPUBackendError) as err:
            raise NvidiaInitError(f"error creating plugins: {err}") from None
        for index in empty_mig_gpus(devices):
            log.warning("device %d has no MIG devices configured", index)
        return built

    def _mig_minors(self) -> MigMinors | None:
        try:
            return self._read_mig_minors()
        except OSError as err:
            raise NvidiaInitError(f"error getting MIG capability device paths: {err}") from None

    def _pair_score(self, uuids: list[str]) -> PairScore:
        """The GPUs' pair scores from the backend's links, read once (the topology does not change while
        the node runs); all 0 when the links cannot be read (logged), as for a node without NVLink."""
        if len(uuids) < 2:
            return lambda _a, _b: 0
        try:
            return pair_scorer(self._backend.links(uuids))
        except (GPUBackendError, ValueError) as err:
            log.warning("cannot read the GPUs' links, preferred allocations ignore topology: %s", err)
            return lambda _a, _b: 0

    def _write_cdi_spec(self, devices: NvidiaDevices) -> None:
        """NVIDIA's CDI spec of the served devices, with a cdi-* device-list strategy, before any plugin
        hands out a CDI name (`hami_node.nvidia.cdi`). Raises `CdiError`."""
        flags = self._nvidia.flags
        if not flags.any_cdi:
            return
        spec = NvidiaCdiSpec(self._config.cdi_spec_dir, flags.device_id_strategy, self._exists)
        served = [d for resource in devices.resources for d in devices.map[resource]]
        spec.write(served)
        self.cdi_spec = spec

    def start(self) -> None:
        for warning in self._nvidia.warnings:
            log.warning("%s", warning)
        try:
            self.devices = self.build()
        except NvidiaInitError as err:
            if self._nvidia.flags.fail_on_init_error:
                raise
            self.error = str(err)
            log.error("%s; failOnInitError is false: serving nothing", err)
            return
        self._write_cdi_spec(self.devices)
        managers = []
        pods: PodSource = _NoPods()
        for resource in self.devices.resources:
            managers.append(
                PluginManager(
                    self._config,
                    self._state,
                    pods,
                    server_factory=self._factory(resource, self.devices),
                    resource_name=resource,
                    socket_name=plugin_socket_name(resource),
                    observer=self._observer,
                    **self._options,
                )
            )
        self.group = PluginGroup(managers)
        self.group.start()
        log.info(
            "NVIDIA's modes: MIG strategy %s, sharing %s; serving %s",
            self._nvidia.flags.mig_strategy.value,
            self._nvidia.sharing.strategy.value,
            ", ".join(f"{r} ({len(self.devices.map[r])})" for r in self.devices.resources),
        )

    def _factory(self, resource: str, devices: NvidiaDevices) -> Callable[[], NvidiaPluginServer]:
        def make() -> NvidiaPluginServer:
            servicer = NvidiaPluginServicer(
                resource, devices, self._state, node_exists=self._exists, observer=self._observer
            )
            return NvidiaPluginServer(self._config.kubelet_dir, servicer)

        return make

    def stop(self) -> None:
        self.group.stop()

    def request_restart(self, reason: str = "restart requested (SIGHUP)") -> None:
        self.group.request_restart(reason)

    @property
    def managers(self) -> tuple[PluginManager, ...]:
        return self.group.managers

    @property
    def registered(self) -> bool:
        return self.devices is not None and bool(self.group.managers) and self.group.registered

    @property
    def serving(self) -> bool:
        return self.devices is not None and bool(self.group.managers) and self.group.serving


class NodeLabelClient(Protocol):
    def get_node(self, name: str) -> Mapping[str, Any]: ...

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Mapping[str, Any]: ...

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]: ...


class NodeLabeler:
    """Writes GFD's labels for the served devices on the Node, and removes HAMi's inventory annotations;
    retried with backoff until done (a background thread), since the API server may not answer yet."""

    def __init__(
        self,
        api: NodeLabelClient,
        node_name: str,
        plugins: NvidiaPlugins,
        *,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 30.0,
    ) -> None:
        self._api = api
        self._node = node_name
        self._plugins = plugins
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_done(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvidia-labels", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def sync(self) -> None:
        """One write. Raises `KubeApiError`."""
        devices = self._plugins.devices
        labels: Mapping[str, str] = {}
        if devices is not None:
            labels, warnings = devices.labels()
            for warning in warnings:
                log.warning("GPU feature discovery labels: %s", warning)
        meta = self._api.get_node(self._node).get("metadata") or {}
        patch = label_patch(meta.get("labels") or {}, labels)
        if patch:
            self._api.patch_node_labels(self._node, patch)
            log.info("Node %s labels: %s", self._node, patch)
        stale = [key for key in (NODE_REGISTER, NODE_PAIR_SCORE) if key in (meta.get("annotations") or {})]
        if stale:
            self._api.patch_node_annotations(self._node, dict.fromkeys(stale))
            log.info("removed HAMi's inventory annotations %s from Node %s", ", ".join(stale), self._node)

    def _run(self) -> None:
        delay = self._retry_initial_s
        while not self._stop.is_set():
            try:
                self.sync()
            except KubeApiError as err:
                log.warning(
                    "cannot write the NVIDIA labels of Node %s (%s); retrying in %.1f s",
                    self._node,
                    err,
                    delay,
                )
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self._retry_max_s)
                continue
            self._done.set()
            return


__all__ = ["NodeLabeler", "NvidiaInitError", "NvidiaPlugins"]
