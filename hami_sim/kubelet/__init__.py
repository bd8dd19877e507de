"""Kubelet stand-in: the device-plugin side of kubelet (Registration, ListAndWatch, Allocate,
checkpoint, restart), kubelet's DRA manager (plugin watcher, claims prepared before containers start,
`dra_manager_state`), the container runtime's CDI resolution (`containers.json`), plus just enough pod
and Node handling for a local cluster.

`Kubelet` runs on the caller's loop (many per loop); `KubeletRunner` runs one on its own thread;
`hami-sim kubelet` (`cli`) runs one as a process. See docs/kubelet-standin.md.
"""

from hami_sim.kubelet.checkpoint import Checkpoint, CheckpointError, PodDeviceEntry, read_checkpoint
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import DeviceManager, ResourceState, Snapshot
from hami_sim.kubelet.dra.checkpoint import ClaimInfoState, PreparedDevice, read_dra_checkpoint
from hami_sim.kubelet.pods import AdmissionResult
from hami_sim.kubelet.runner import KubeletRunner
from hami_sim.kubelet.runtime import ContainerRecord, Containers, read_containers
from hami_sim.kubelet.standin import Kubelet

__all__ = [
    "AdmissionResult",
    "Checkpoint",
    "CheckpointError",
    "ClaimInfoState",
    "ContainerRecord",
    "Containers",
    "DeviceManager",
    "Kubelet",
    "KubeletConfig",
    "KubeletRunner",
    "PodDeviceEntry",
    "PreparedDevice",
    "ResourceState",
    "Snapshot",
    "read_checkpoint",
    "read_containers",
    "read_dra_checkpoint",
]
