"""Settings of one kubelet stand-in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hami_node.plugin.api import constants
from hami_sim.kubelet.dra.checkpoint import CHECKPOINT_FILE as DRA_CHECKPOINT_FILE

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

PLUGINS_REGISTRY_DIR = "plugins_registry"
"""Kubelet's plugin registration directory (`<root-dir>/plugins_registry`), relative to `directory`."""

CDI_DIR = "cdi"
"""The CDI spec directory the stand-in's container runtime reads by default, relative to `directory`."""

CONTAINERS_FILE = "containers.json"
"""What the stand-in's container runtime gave each started container (hami_sim.kubelet.runtime)."""

DRA_CALL_TIMEOUT_SECONDS = 45.0
"""Kubelet's defaultClientCallTimeout for NodePrepareResources / NodeUnprepareResources
(pkg/kubelet/cm/dra/plugin/dra_plugin.go: "half of the kubelet retry period")."""

DRA_WIPING_DELAY_SECONDS = 30.0
"""Kubelet's defaultWipingDelay: how long a DRA driver may have no connected plugin before the node's
ResourceSlices of that driver are deleted (pkg/kubelet/cm/dra/manager.go)."""

DRA_RECONCILE_SECONDS = 60.0
"""Kubelet's DRA reconcile period: claims of pods no longer active are unprepared (pkg/kubelet/cm/
container_manager_linux.go passes 60 s to dra.NewManager)."""


STATUS_SYNC_SECONDS = 10.0
"""Kubelet's status manager's sync period: a pod's latest status is written again on it until the API
server has it or the pod is gone."""


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
    plugins_registry_dir: Path | None = None
    """Where DRA plugins put their registration sockets (kubelet's plugins_registry). None:
    `directory/plugins_registry`."""
    cdi_spec_dirs: tuple[Path, ...] | None = None
    """The CDI spec directories the stand-in's container runtime reads, lowest priority first (CDI's
    order: /etc/cdi, then /var/run/cdi). None: `(directory/cdi,)`."""
    dra_call_timeout: float = DRA_CALL_TIMEOUT_SECONDS
    dra_wiping_delay: float = DRA_WIPING_DELAY_SECONDS
    dra_reconcile_period: float = DRA_RECONCILE_SECONDS
    prepare_retry_initial: float = 1.0
    """First wait before a pod whose claims could not be prepared is tried again; it doubles up to
    `prepare_retry_max` (kubelet tries again at its next pod sync, within a minute and a half)."""
    prepare_retry_max: float = 60.0
    status_sync_period: float = STATUS_SYNC_SECONDS
    """How often statuses the API server has not taken yet are written again (kubelet's status
    manager, pkg/kubelet/status/status_manager.go `syncPeriod`: 10 s)."""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node_name: must not be empty")
        if self.plugins_registry_dir is None:
            object.__setattr__(self, "plugins_registry_dir", self.directory / PLUGINS_REGISTRY_DIR)
        if self.cdi_spec_dirs is None:
            object.__setattr__(self, "cdi_spec_dirs", (self.directory / CDI_DIR,))
        else:
            object.__setattr__(self, "cdi_spec_dirs", tuple(Path(d) for d in self.cdi_spec_dirs))
        for name in (
            "dial_timeout",
            "pre_start_timeout",
            "endpoint_stop_grace",
            "dra_call_timeout",
            "dra_wiping_delay",
            "dra_reconcile_period",
            "prepare_retry_initial",
            "status_sync_period",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}: must be positive, got {value!r}")
        if self.rpc_timeout is not None and not self.rpc_timeout > 0:
            raise ValueError(f"rpc_timeout: must be positive or None, got {self.rpc_timeout!r}")
        if not self.prepare_retry_max >= self.prepare_retry_initial:
            raise ValueError(
                "prepare_retry_max: must be at least prepare_retry_initial "
                f"({self.prepare_retry_initial!r}), got {self.prepare_retry_max!r}"
            )

    @property
    def registry_dir(self) -> Path:
        """`plugins_registry_dir`, resolved."""
        assert self.plugins_registry_dir is not None  # set in __post_init__
        return self.plugins_registry_dir

    @property
    def cdi_dirs(self) -> tuple[Path, ...]:
        """`cdi_spec_dirs`, resolved."""
        assert self.cdi_spec_dirs is not None  # set in __post_init__
        return self.cdi_spec_dirs

    @property
    def dra_checkpoint_path(self) -> Path:
        """Kubelet's `dra_manager_state` (kubelet keeps it in its root directory; the stand-in in
        `directory`, as everything else of the node)."""
        return self.directory / DRA_CHECKPOINT_FILE

    @property
    def containers_path(self) -> Path:
        return self.directory / CONTAINERS_FILE

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
