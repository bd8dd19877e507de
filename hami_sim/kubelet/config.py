"""Settings of one kubelet stand-in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hami_node.plugin.api import constants

ENDPOINT_STOP_GRACE_SECONDS = 300.0
"""Kubelet's endpointStopGracePeriod: how long a dead plugin's resource is kept (capacity unchanged)."""

DIAL_TIMEOUT_SECONDS = 10.0
"""Kubelet dials a registering plugin with WithBlock and this timeout."""

POD_RESOURCES_DIR = "pod-resources"
"""Kubelet's DefaultKubeletPodResourcesDirName: `<root-dir>/pod-resources` holds the PodResources socket."""

POD_RESOURCES_SOCKET = "kubelet.sock"
"""The PodResources socket: kubelet's podresources.Socket ("kubelet") as a local endpoint."""

MAX_SOCKET_PATH = 100
"""Longest socket path the stand-in accepts (Unix socket paths are limited to about 107 bytes)."""


@dataclass(frozen=True)
class KubeletConfig:
    """What one stand-in needs. `directory` plays /var/lib/kubelet/device-plugins/ (keep it short:
    Unix socket paths are limited to about 107 bytes)."""

    node_name: str
    directory: Path
    kubeconfig: Path | None = None
    """Kubeconfig of the API server; None runs the device manager alone (no pods, no node status)."""
    create_node: bool = False
    """Create the Node (Ready, capacity, allocatable) when it does not exist."""
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"
    dial_timeout: float = DIAL_TIMEOUT_SECONDS
    rpc_timeout: float | None = 60.0
    """Deadline on GetDevicePluginOptions, GetPreferredAllocation and Allocate. Kubelet sets none; a
    stand-in that may host hundreds of nodes bounds every wait. None: no deadline, as kubelet."""
    pre_start_timeout: float = float(constants.KUBELET_PRESTART_CONTAINER_RPC_TIMEOUT_SECONDS)
    endpoint_stop_grace: float = ENDPOINT_STOP_GRACE_SECONDS
    seed: int | None = None
    """Seed of the order in which the device manager walks device sets: kubelet walks Go maps, whose
    order is random, when it takes reusable devices, falls back without a preferred allocation, or
    lists devices for GetPreferredAllocation. None: derived from the node name (reproducible runs)."""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node_name: must not be empty")
        for name in ("dial_timeout", "pre_start_timeout", "endpoint_stop_grace"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}: must be positive, got {value!r}")
        if self.rpc_timeout is not None and not self.rpc_timeout > 0:
            raise ValueError(f"rpc_timeout: must be positive or None, got {self.rpc_timeout!r}")

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / "kubelet.sock"

    @property
    def checkpoint_path(self) -> Path:
        return self.directory / constants.CHECKPOINT_FILE

    @property
    def pod_resources_socket(self) -> Path:
        """Where the PodResources API is served. Kubelet serves it on `<root-dir>/pod-resources/kubelet.sock`,
        next to `<root-dir>/device-plugins/`; the stand-in keeps it inside `directory` (which plays
        device-plugins/) so that nodes sharing a parent directory do not share the socket."""
        return self.directory / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET
