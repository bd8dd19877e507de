"""Kubelet stand-in: the device-plugin side of kubelet (Registration, ListAndWatch, Allocate,
checkpoint, restart) plus just enough pod and Node handling for a local cluster.

`Kubelet` runs on the caller's loop (many per loop); `KubeletRunner` runs one on its own thread;
`hami-sim kubelet` (`cli`) runs one as a process. See docs/kubelet-standin.md.
"""

from hami_sim.kubelet.checkpoint import Checkpoint, CheckpointError, PodDeviceEntry, read_checkpoint
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import DeviceManager, ResourceState, Snapshot
from hami_sim.kubelet.pods import AdmissionResult
from hami_sim.kubelet.runner import KubeletRunner
from hami_sim.kubelet.standin import Kubelet

__all__ = [
    "AdmissionResult",
    "Checkpoint",
    "CheckpointError",
    "DeviceManager",
    "Kubelet",
    "KubeletConfig",
    "KubeletRunner",
    "PodDeviceEntry",
    "ResourceState",
    "Snapshot",
    "read_checkpoint",
]
