"""One kubelet stand-in: the device manager, the DRA manager (plugin watcher, claims, CDI), the Node
status writer, the pod admitter, the container runtime's record and the PodResources API of one node,
all on the caller's asyncio loop. Many can share a loop (and, optionally, one API client and the
watchdog observers' inotify instances)."""

from __future__ import annotations

import logging

from hami_kube.client import KubeApi, component_user_agent
from hami_node.ports import ObserverFactory
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import DeviceManager
from hami_sim.kubelet.dra.manager import DraManager
from hami_sim.kubelet.node import NodeStatusReporter
from hami_sim.kubelet.podresources.server import PodResourcesServer
from hami_sim.kubelet.pods import EVENTS_GRACE_S, PodAdmitter
from hami_sim.kubelet.runtime import ContainerRuntime

log = logging.getLogger(__name__)

USER_AGENT_COMPONENT = "hami-sim-kubelet"
"""The component name in the User-Agent of the kubelet stand-in's API calls."""
KUBE_API_QPS = 50.0
KUBE_API_BURST = 100
"""Kubelet's client-side rate limit (KubeletConfiguration kubeAPIQPS / kubeAPIBurst defaults)."""


class Kubelet:
    """`await start()`, then `restart()` at will, `stop()` at the end.

    With neither `config.kubeconfig` nor `api` it runs the device manager and the DRA plugin watcher
    alone (no Node, no pods, no ResourceSlices wiped). A given `api` (hami_kube) is shared, not closed;
    one made from the kubeconfig is owned. `observer_factory` makes the watchdog observer of the plugin
    watcher (default: watchdog's own; see hami_sim.nodehost for shared inotify instances)."""

    def __init__(
        self,
        config: KubeletConfig,
        api: KubeApi | None = None,
        *,
        observer_factory: ObserverFactory | None = None,
    ) -> None:
        self.config = config
        self.device_manager = DeviceManager(config)
        self._api = api
        self._owns_client = False
        self._observer_factory = observer_factory
        self.dra: DraManager | None = None
        self.runtime = ContainerRuntime(config.containers_path)
        self.node_status: NodeStatusReporter | None = None
        self.pods: PodAdmitter | None = None
        self.pod_resources: PodResourcesServer | None = None

    async def start(self) -> None:
        await self.device_manager.start()
        try:
            if self._api is None and self.config.kubeconfig is not None:
                self._api = await KubeApi.connect(
                    self.config.kubeconfig,
                    qps=KUBE_API_QPS,
                    burst=KUBE_API_BURST,
                    user_agent=component_user_agent(USER_AGENT_COMPONENT),
                )
                self._owns_client = True
            self.runtime.load()
            if self._api is not None:
                # The Node first: the DRA manager's start-up wipe of its ResourceSlices reads it.
                self.node_status = NodeStatusReporter(self.config, self.device_manager, self._api)
                await self.node_status.start()
            self.dra = DraManager(self.config, self._api, observer_factory=self._observer_factory)
            await self.dra.start()
            if self._api is not None:
                api = self._api
                self.pods = PodAdmitter(
                    self.config, self.device_manager, api, dra=self.dra, runtime=self.runtime
                )
                self.dra.set_active_pods(self.pods.active_uids)
                await self.pods.start()
            self.pod_resources = PodResourcesServer(
                self.config.pod_resources_socket,
                self.device_manager,
                self.pods,
                seed=f"podresources/{self.device_manager.seed}",
                dynamic=self.dra,
            )
            await self.pod_resources.start()
        except BaseException:
            await self.stop()
            raise
        log.info("node %s: kubelet stand-in started", self.config.node_name)

    async def restart(self) -> None:
        """A kubelet restart as device plugins see it (see DeviceManager.restart), as DRA plugins see it
        (registered again, claims read back from the checkpoint, slices wiped: DraManager.restart) and
        as PodResources clients see it (the socket goes away and comes back); pods keep running."""
        log.info("node %s: restarting the kubelet stand-in", self.config.node_name)
        if self.pod_resources is not None:
            await self.pod_resources.stop()
        await self.device_manager.restart()
        if self.dra is not None:
            await self.dra.restart()
        if self.pod_resources is not None:
            await self.pod_resources.start()

    async def stop(self, *, abrupt: bool = False) -> None:
        """Stop every part; `abrupt` (a kill of an in-process kubelet) drops the queued Events instead of
        giving them a second to be written."""
        if self.pod_resources is not None:
            await self.pod_resources.stop()
        if self.pods is not None:
            await self.pods.stop(events_grace_s=0.0 if abrupt else EVENTS_GRACE_S)
        if self.node_status is not None:
            await self.node_status.stop()
        if self.dra is not None:
            await self.dra.stop()
        await self.device_manager.stop()
        if self._owns_client and self._api is not None:
            await self._api.close()
            self._api = None
            self._owns_client = False
