"""The local cluster: `Cluster.up(ClusterSpec.uniform(2, 4), ".hami-sim")` starts the API server
stand-in, hami-control, the kube-scheduler stand-in and, per node, a kubelet stand-in and hami-node
with fake GPUs, each a real process; `hami-sim up|down|status` (`cli`) do the same from a shell.
See docs/local-cluster.md.
"""

from hami_sim.cluster.cluster import (
    APISERVER,
    CONTROL,
    CONTROL_SERVICE,
    DAEMON_HOST,
    DAEMON_PREFIX,
    GPU_FAULTS,
    KUBELET_HOST,
    KUBELET_PREFIX,
    SCHEDULER,
    Cluster,
    ClusterError,
    ClusterStatus,
    ComponentStatus,
    NoCluster,
    NodeStatus,
    default_scheduler_config,
    run_dir_for,
)
from hami_sim.cluster.spec import (
    SCALE_THRESHOLD,
    ClusterSpec,
    GPUSpec,
    NodeSpec,
    SpecError,
    load_inventory_spec,
    model_memory_mib,
    node_inventory,
    parse_inventory_spec,
)

__all__ = [
    "APISERVER",
    "CONTROL",
    "CONTROL_SERVICE",
    "DAEMON_HOST",
    "DAEMON_PREFIX",
    "GPU_FAULTS",
    "KUBELET_HOST",
    "KUBELET_PREFIX",
    "SCALE_THRESHOLD",
    "SCHEDULER",
    "Cluster",
    "ClusterError",
    "ClusterSpec",
    "ClusterStatus",
    "ComponentStatus",
    "GPUSpec",
    "NoCluster",
    "NodeSpec",
    "NodeStatus",
    "SpecError",
    "default_scheduler_config",
    "load_inventory_spec",
    "model_memory_mib",
    "node_inventory",
    "parse_inventory_spec",
    "run_dir_for",
]
