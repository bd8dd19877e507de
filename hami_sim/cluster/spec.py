"""What a local cluster is made of: its nodes and their fake GPUs, the vGPU split, the scheduling
policies and extra flags. Pure apart from `load_inventory_spec`, which reads the file (and the NVIDIA config
files it names).

The inventory file (`hami-sim up --inventory FILE`, YAML or JSON) maps each node name to its GPUs,
for clusters of mixed models:

```yaml
gpu-a100-1: {count: 8, model: NVIDIA A100-SXM4-80GB}    # 8 identical GPUs
gpu-t4-1: [Tesla T4, Tesla T4]                          # one entry per GPU
gpu-mixed-1:
  - NVIDIA A100-SXM4-40GB
  - {model: NVIDIA L4, memory: 23034}                   # memory in MiB, for models not known here
gpu-links-1:                                            # the links between GPUs, by index
  count: 4
  links:
    - {gpus: [1, 2], nvlinks: 4}                        # an NVLink pair
    - {gpus: [0, 1], pcie: single-switch}               # a pair under one PCIe switch
gpu-mixed-2:                                            # a list of GPUs with links
  gpus: [NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-40GB]
  links: [{gpus: [0, 1], nvlinks: 12}]
```

A node in NVIDIA's own sharing modes names NVIDIA's config file v1 (`nvidia:`, its content inline or a
path relative to the inventory file); a node with HAMi's dynamic MIG says `mode: mig`; a GPU's `mig:` is
`true` (MIG mode, no MIG device) or the MIG devices present at start (docs/local-cluster.md):

```yaml
mig-a:                                                  # NVIDIA's MIG strategy mixed
  count: 1
  model: NVIDIA A100-SXM4-40GB
  mig: [{profile: 3g.20gb, start: 0}, {profile: 1g.5gb, start: 6}]
  nvidia: {version: v1, flags: {migStrategy: mixed}}
ts-a: {count: 1, model: Tesla T4, nvidia: time-slicing.yaml}
dyn-a: {count: 2, model: NVIDIA A100-SXM4-40GB, mig: true, mode: mig}
```

A model's memory is taken from its name ("...-80GB" is 81920 MiB) or from `KNOWN_MEMORY_MIB`;
otherwise it must be given (`memory:` in the file, `--gpu-memory` on the command line). `links` are the
fake inventory's (docs/fake-gpus.md): without them, GPUs of one model are all NVLinked and a mixed node
has none; with them, only what they say (pairs not listed are PCIe, by NUMA node).

Nodes of the other accelerators HAMi shares (hami_sim.vendors; docs/vendor-nodes.md) name their
`vendor`; their devices are served by that vendor's device-plugin stand-in instead of hami-node:

```yaml
npu-1: {vendor: ascend, model: 910B4, count: 8}          # model: the chip (910A, 910B2, ..., 310P, 910C)
dcu-1: {vendor: hygon, count: 4, memory: 16384}          # memory per device in MiB
mlu-1: {vendor: cambricon}                               # one device of the vendor's first product
sgpu-1: {vendor: metax, mode: sgpu, split: 8}            # a plugin mode (metax: sgpu|gpu, enflame:
                                                         #   drs|gcu, kunlun: vxpu|xpu), shares per device
mixed-1: {vendor: hygon, count: 2, nvidia: {count: 2, model: NVIDIA A100-SXM4-40GB}}
                                                         # NVIDIA GPUs beside (any form above), hami-node too
```

Keys: `vendor` (nvidia, hygon, ascend, cambricon, iluvatar, metax, mthreads, enflame, kunlun, awsneuron,
amd, vastai, biren), `mode`, `model`, `count` (default 1), `memory` (MiB), `cores` (the vendor's unit:
percent, Ascend AI cores, AMD compute units, Mthreads sgpu cores, NeuronCores per device), `split`
(shares per device), `nvidia`. What is left out is the product's (`hami_sim.vendors.table`); a model the
table does not know needs `memory`. A node holds one vendor's devices, with or without NVIDIA GPUs
(HAMi lets a node hold several vendors; the local cluster does not).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hami_api.mig import Placement, mig_model
from hami_api.settings import DNS_SUBDOMAIN
from hami_api.settings import ConfigError as SettingsError
from hami_node.gpu.inventory import (
    DEFAULT_MODEL,
    FakeMigInstance,
    Inventory,
    InventoryError,
    LinkGroup,
    generate_inventory,
    links_to_data,
    parse_links,
)
from hami_node.nvidia.config import load_config as load_nvidia_config
from hami_sim.vendors.table import DEVICE_KEYS, NVIDIA, DeviceSpec, device_spec
from hami_sim.vendors.table import GATES as VENDOR_GATES
from hami_sim.vendors.table import SpecError as DeviceSpecError

SCALE_THRESHOLD = 8
"""Above this many nodes, `up` runs in scale mode unless told otherwise."""

KNOWN_MEMORY_MIB: Mapping[str, int] = {
    "tesla t4": 15360,
    "nvidia t4": 15360,
    "nvidia-tesla t4": 15360,
    "tesla p4": 7680,
    "nvidia a10": 23028,
    "nvidia a30": 24576,
    "nvidia a40": 46068,
    "nvidia l4": 23034,
    "nvidia l40": 46068,
    "nvidia l40s": 46068,
    "nvidia geforce rtx 4090": 24564,
}
"""Total memory NVML reports for models whose name does not say it."""

_GB_IN_NAME = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


class SpecError(ValueError):
    """A bad cluster spec or inventory file; the message names the field (and file) and the value."""


def model_memory_mib(model: str) -> int:
    """The memory of a GPU model in MiB, from its name or `KNOWN_MEMORY_MIB`; `SpecError` otherwise."""
    known = KNOWN_MEMORY_MIB.get(model.strip().lower())
    if known is not None:
        return known
    found = _GB_IN_NAME.search(model)
    if found and int(found.group(1)) > 0:
        return int(found.group(1)) * 1024
    raise SpecError(
        f"GPU model {model!r}: its memory is unknown; give it in MiB "
        "(--gpu-memory, or `memory:` in the inventory file)"
    )


@dataclass(frozen=True)
class GPUSpec:
    model: str = DEFAULT_MODEL
    memory_mib: int = 0
    """0: from the model's name (`model_memory_mib`)."""
    mig: bool = False
    """MIG mode on (a model of `hami_api.mig.MIG_MODELS`): in DRA mode hami-node publishes its MIG
    partitions; with HAMi's dynamic MIG (`NodeSpec.operating_mode` mig) the extender places instances on
    it; with NVIDIA's MIG strategies its `mig_devices` are the MIG devices served."""
    mig_devices: tuple[FakeMigInstance, ...] = ()
    """MIG devices present at start, `{profile, start}` (the fake inventory's `mig.devices`): what NVIDIA's
    plugin serves under MIG strategies single and mixed (it needs existing MIG devices; it creates none).
    Implies `mig`."""

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise SpecError("model: must not be empty")
        if self.memory_mib < 0 or isinstance(self.memory_mib, bool):
            raise SpecError(f"memory: expected a positive number of MiB, got {self.memory_mib!r}")
        if self.memory_mib == 0:
            object.__setattr__(self, "memory_mib", model_memory_mib(self.model))
        if self.mig_devices and not self.mig:
            object.__setattr__(self, "mig", True)
        if self.mig and mig_model(self.model) is None:
            raise SpecError(f"mig: {self.model} is not a MIG-capable model (A100, A30, H100, H200)")
        _check_mig_devices(self.model, self.mig_devices)


def _check_mig_devices(model_name: str, devices: Sequence[FakeMigInstance]) -> None:
    """The rules of the fake inventory's `mig.devices` (hami_node.gpu.inventory `_check_mig_layout`):
    a profile of the model, at one of its placements (NVML's GetGpuInstancePossiblePlacements), not
    overlapping another device, no profile more often than it fits. `SpecError` naming the device."""
    model = mig_model(model_name)
    if model is None:
        return
    taken: list[tuple[int, Placement]] = []
    counts: dict[str, int] = {}
    for i, device in enumerate(devices):
        where = f"mig.devices[{i}]"
        profile = model.profile(device.profile)
        if profile is None:
            names = ", ".join(p.name for p in model.profiles)
            raise SpecError(
                f"{where}.profile: {device.profile!r} is not a MIG profile of {model.name} ({names})"
            )
        placement = profile.placement_at(device.start)
        if placement is None:
            starts = ", ".join(str(p.start) for p in profile.placements)
            raise SpecError(
                f"{where}.start: {device.start!r} is not a placement of {profile.name} on {model.name} "
                f"(starts: {starts})"
            )
        for j, other in taken:
            if placement.overlaps(other):
                raise SpecError(
                    f"{where}.start: {profile.name} at {placement} overlaps mig.devices[{j}] at {other}"
                )
        counts[profile.name] = counts.get(profile.name, 0) + 1
        if counts[profile.name] > profile.instance_count:
            raise SpecError(
                f"{where}.profile: {profile.name} fits at most {profile.instance_count} time(s) "
                f"on {model.name}"
            )
        taken.append((i, placement))


OPERATING_MODES = ("hami-core", "mig")
"""HAMi's per-node `operatingmode` the local cluster sets (`NodeSpec.operating_mode`): hami-core slices
(the default) or HAMi's dynamic MIG. (mps needs an MPS control daemon the local cluster does not run.)"""

NODE_MODES = ("device-plugin", "dra")
"""How a node serves its GPUs (hami-node --mode): one mode per node, never both."""
CLUSTER_MODES = (*NODE_MODES, "mixed")
"""`hami-sim up --mode`: every node in one mode, or `mixed` (every second node in DRA mode)."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: tuple[GPUSpec, ...]
    links: tuple[LinkGroup, ...] | None = None
    """The links between the GPUs (by index; see docs/fake-gpus.md). None: GPUs of one model all
    NVLinked, a mixed node none."""
    mode: str = "device-plugin"
    """hami-node --mode: `device-plugin` (the extender's path) or `dra` (ResourceSlices and claims)."""
    cpu: str | None = None
    """The Node's CPU capacity and allocatable (kubelet --cpu, a quantity); None: the cluster's `node_cpu`."""
    memory: str | None = None
    """The Node's memory (kubelet --memory); None: the cluster's `node_memory`."""
    devices: DeviceSpec | None = None
    """The node's devices of another vendor (hami_sim.vendors), served by that vendor's device-plugin
    stand-in; None: NVIDIA GPUs only. `gpus` may then be empty (no hami-node)."""
    nvidia_config: str | None = None
    """NVIDIA's device-plugin config file v1 (its YAML or JSON text): hami-node serves NVIDIA's sharing
    modes on this node (time-slicing, MIG strategies; `hami-node --config-file`, no HAMi-core slicing,
    no HAMi register annotation). Pods reach it through kube-scheduler's own fit (the default-scheduler
    stand-in), never the extender. None: HAMi's device plugin (or DRA)."""
    nvidia_config_source: str = ""
    """Where `nvidia_config` came from (a path, or the inventory entry), for messages."""
    operating_mode: str = "hami-core"
    """HAMi's `operatingmode` of this node (`OPERATING_MODES`), written to the node config hami-node
    reads (`nodeconfig: [{name, operatingmode}]` through `--config-file`): `mig` is HAMi's dynamic MIG."""

    @property
    def vendor(self) -> str:
        return self.devices.vendor if self.devices is not None else NVIDIA

    @property
    def nvidia_mode(self) -> bool:
        """hami-node serves NVIDIA's sharing modes here (`nvidia_config`), not HAMi's."""
        return self.nvidia_config is not None

    def __post_init__(self) -> None:
        if self.mode not in NODE_MODES:
            raise SpecError(
                f"node {self.name}: mode: expected one of {', '.join(NODE_MODES)}, got {self.mode!r}"
            )
        if not DNS_SUBDOMAIN.fullmatch(self.name) or len(self.name) > 253:
            raise SpecError(
                f"node name: expected a DNS subdomain (lowercase, digits, '-', '.'), got {self.name!r}"
            )
        if not self.gpus and self.devices is None:
            raise SpecError(f"node {self.name}: needs at least one GPU")
        if self.devices is not None and self.mode != "device-plugin":
            raise SpecError(
                f"node {self.name}: mode: a {self.devices.vendor} node serves its devices through the device "
                f"plugin, got {self.mode!r}"
            )
        for i, group in enumerate(self.links or ()):
            bad = next((g for g in group.gpus if not 0 <= g < len(self.gpus)), None)
            if bad is not None:
                raise SpecError(f"node {self.name}: links[{i}]: no GPU with index {bad}")
        self._check_sharing()

    def _check_sharing(self) -> None:
        if self.operating_mode not in OPERATING_MODES:
            raise SpecError(
                f"node {self.name}: mode: expected one of {', '.join(OPERATING_MODES)}, "
                f"got {self.operating_mode!r}"
            )
        if self.operating_mode == "mig" and self.mode != "device-plugin":
            raise SpecError(
                f"node {self.name}: mode: HAMi's dynamic MIG (mig) is a device-plugin mode, got "
                f"hami-node --mode {self.mode!r} (MIG through DRA: mig GPUs on a DRA node)"
            )
        if self.operating_mode == "mig" and not any(g.mig for g in self.gpus):
            raise SpecError(f"node {self.name}: mode: mig needs GPUs in MIG mode (mig: true on a GPU)")
        if self.nvidia_config is None:
            return
        if not self.gpus:
            raise SpecError(f"node {self.name}: nvidia: NVIDIA's config file needs NVIDIA GPUs on the node")
        if self.operating_mode != "hami-core":
            raise SpecError(
                f"node {self.name}: nvidia: NVIDIA's config file and HAMi's operating mode "
                f"{self.operating_mode!r} would share the same GPUs two ways; choose one "
                "(drop nvidia or mode)"
            )
        if self.mode != "device-plugin":
            raise SpecError(
                f"node {self.name}: nvidia: NVIDIA's config file is for its device plugin; one mode per "
                f"node, got hami-node --mode {self.mode!r}"
            )
        source = self.nvidia_config_source or "nvidia"
        text = self.nvidia_config
        try:
            # NVIDIA's loader over the text (hami_node.nvidia.config.load_config): its validation texts,
            # naming the source (the file, or `nvidia` inline, whose line numbers count from its first key).
            load_nvidia_config(["--config-file", source], {}, lambda _path: text)
        except SettingsError as exc:
            raise SpecError(f"node {self.name}: {exc}") from None


@dataclass(frozen=True)
class ClusterSpec:
    """A whole local cluster. Build uniform ones with `ClusterSpec.uniform`."""

    nodes: tuple[NodeSpec, ...]
    split: int = 10
    """Virtual devices per GPU (hami-node --device-split-count)."""
    node_scheduler_policy: str | None = None
    """hami-control --node-scheduler-policy (binpack, spread); None: its default."""
    gpu_scheduler_policy: str | None = None
    """hami-control --gpu-scheduler-policy (binpack, spread, topology-aware, numa, mutex, chains)."""
    scale: bool | None = None
    """All kubelets in one process and all node daemons in another; None: above `SCALE_THRESHOLD` nodes."""
    scheduler_config: Path | None = None
    """KubeSchedulerConfiguration for the scheduler stand-in; None: daemonset/scheduler/'s."""
    control_args: tuple[str, ...] = ()
    """More hami-control flags (e.g. ("--bind-wait-timeout", "20"))."""
    control_replicas: int = 1
    """hami-control replicas. Above 1 each runs with `--leader-elect` (Lease kube-system/hami-control) as
    `hami-control-<i>`, behind a Service-like proxy on the control URL (hami_sim.cluster.service)."""
    node_args: tuple[str, ...] = ()
    """More hami-node flags, for every node (e.g. ("--health-recovery-seconds", "3"))."""
    scheduler_args: tuple[str, ...] = ()
    """More `hami-sim scheduler` flags (e.g. ("--seed", "1"))."""
    controller_manager_args: tuple[str, ...] = ()
    """More `hami-sim controller-manager` flags (clusters with DRA nodes), e.g. ("--kube-api-qps", "0")."""
    node_cpu: str = "8"
    node_memory: str = "32Gi"
    timeout_s: float | None = None
    """How long `up` waits for everything; None: 60 s + 0.5 s per node."""
    node_metrics: bool = True
    """Every node daemon serves its health endpoint (/metrics, /healthz, /readyz) on a free port of
    127.0.0.1 (`Cluster.node_metrics_url`). Cheap at any size: one thread per daemon, idle (250 of them
    took 0.6% of a core and 5 MiB together)."""
    apiserver_args: tuple[str, ...] = ()
    """More `hami-sim apiserver` flags (e.g. ("--feature-gates", "DRAConsumableCapacity=false"))."""
    monitoring: bool = False
    """Prometheus beside the cluster, scraping it as the install's PodMonitors do, with the install's
    rules (`hami_sim.cluster.monitoring`; `Cluster.prometheus_url`). Needs `node_metrics`."""
    monitoring_interval_s: float = 5.0
    """Prometheus's scrape and rule evaluation interval."""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Free-form notes kept in cluster.json (e.g. how the spec was made)."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SpecError("nodes: a cluster needs at least one node")
        names = [n.name for n in self.nodes]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise SpecError(f"nodes: node {duplicate!r} is listed twice")
        if isinstance(self.split, bool) or not isinstance(self.split, int) or self.split < 1:
            raise SpecError(f"split: expected an integer >= 1, got {self.split!r}")
        for name in ("node_scheduler_policy", "gpu_scheduler_policy"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or any(c.isspace() for c in value)):
                raise SpecError(f"{name}: expected a policy name, got {value!r}")
        replicas = self.control_replicas
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise SpecError(f"control_replicas: expected an integer >= 1, got {replicas!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise SpecError(f"timeout_s: must be positive, got {self.timeout_s!r}")
        interval = self.monitoring_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0.1 <= interval <= 60:
            raise SpecError(f"monitoring_interval_s: expected seconds from 0.1 to 60, got {interval!r}")
        if self.monitoring and not self.node_metrics:
            raise SpecError(
                "monitoring: Prometheus scrapes the node daemons' /metrics, so it needs node_metrics"
            )
        sized = next((n.name for n in self.nodes if n.cpu is not None or n.memory is not None), None)
        if sized is not None and self.scale_mode:
            raise SpecError(
                f"node {sized}: a CPU or memory size per node needs the per-process mode (scale: false); "
                "in scale mode every node gets node_cpu and node_memory"
            )

    @classmethod
    def uniform(
        cls,
        nodes: int,
        gpus_per_node: int,
        model: str = DEFAULT_MODEL,
        *,
        memory_mib: int = 0,
        name_prefix: str = "gpu-node-",
        **options: Any,
    ) -> ClusterSpec:
        """`nodes` nodes named `<prefix>1`.. each with `gpus_per_node` GPUs of one model."""
        if isinstance(nodes, bool) or nodes < 1:
            raise SpecError(f"nodes: expected an integer >= 1, got {nodes!r}")
        if isinstance(gpus_per_node, bool) or gpus_per_node < 1:
            raise SpecError(f"gpus_per_node: expected an integer >= 1, got {gpus_per_node!r}")
        gpu = GPUSpec(model, memory_mib)
        specs = tuple(NodeSpec(f"{name_prefix}{i}", (gpu,) * gpus_per_node) for i in range(1, nodes + 1))
        return cls(specs, **options)

    def with_mode(self, mode: str) -> ClusterSpec:
        """Every node in `mode` (device-plugin, dra), or `mixed`: every second node (2nd, 4th, ...) in DRA
        mode, the others on the device plugin. Nodes of other vendors, nodes in NVIDIA's modes and nodes
        with HAMi's dynamic MIG stay on the device plugin in `mixed` (and `dra` refuses them, naming the
        node)."""
        if mode not in CLUSTER_MODES:
            raise SpecError(f"mode: expected one of {', '.join(CLUSTER_MODES)}, got {mode!r}")
        nodes = tuple(
            n
            if mode == "mixed" and (n.devices is not None or n.nvidia_mode or n.operating_mode != "hami-core")
            else replace(n, mode=("dra" if i % 2 else "device-plugin") if mode == "mixed" else mode)
            for i, n in enumerate(self.nodes)
        )
        return replace(self, nodes=nodes)

    @property
    def dra_nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes if n.mode == "dra")

    @property
    def vendor_nodes(self) -> tuple[str, ...]:
        """Nodes with another vendor's devices (a device-plugin stand-in each)."""
        return tuple(n.name for n in self.nodes if n.devices is not None)

    @property
    def nvidia_nodes(self) -> tuple[str, ...]:
        """Nodes with NVIDIA GPUs (a hami-node daemon each)."""
        return tuple(n.name for n in self.nodes if n.gpus)

    @property
    def nvidia_mode_nodes(self) -> tuple[str, ...]:
        """Nodes whose hami-node serves NVIDIA's sharing modes (`NodeSpec.nvidia_config`): never in
        hami-control's cache; their pods go through the default-scheduler stand-in."""
        return tuple(n.name for n in self.nodes if n.nvidia_mode)

    @property
    def hami_nodes(self) -> tuple[str, ...]:
        """Nodes hami-control's extender counts: NVIDIA GPUs on HAMi's device plugin (not DRA, not
        NVIDIA's modes)."""
        return tuple(n.name for n in self.nodes if n.gpus and n.mode != "dra" and not n.nvidia_mode)

    @property
    def vendor_gates(self) -> tuple[str, ...]:
        """The hami-control flags the cluster's vendors need (`--enable-ascend`, `--enable-iluvatar`)."""
        vendors = {n.vendor for n in self.nodes}
        return tuple(flag for vendor, flag in VENDOR_GATES.items() if vendor in vendors)

    @property
    def scale_mode(self) -> bool:
        return self.scale if self.scale is not None else len(self.nodes) > SCALE_THRESHOLD

    @property
    def up_timeout_s(self) -> float:
        return self.timeout_s if self.timeout_s is not None else 60.0 + 0.5 * len(self.nodes)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def describe(self) -> str:
        """`2 nodes x 4 GPUs (NVIDIA A100-SXM4-80GB), split 10` or `3 nodes, 12 GPUs (2 models), ...`,
        with `; 2 vendor nodes (ascend, hygon)` when some nodes hold other vendors' devices."""
        vendors = sorted({n.vendor for n in self.nodes if n.devices is not None})
        extra = f"; {len(self.vendor_nodes)} vendor nodes ({', '.join(vendors)})" if vendors else ""
        if self.nvidia_mode_nodes:
            extra += f"; {len(self.nvidia_mode_nodes)} in NVIDIA's modes"
        dynamic = sum(n.operating_mode == "mig" for n in self.nodes)
        if dynamic:
            extra += f"; {dynamic} with HAMi's dynamic MIG"
        models = sorted({g.model for n in self.nodes for g in n.gpus})
        if not models:
            return f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}, no NVIDIA GPU{extra}"
        counts = {len(n.gpus) for n in self.nodes}
        nodes = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}"
        if len(counts) == 1 and len(models) == 1:
            count = counts.pop()
            shape = f"{nodes} x {count} GPU{'s' if count != 1 else ''} ({models[0]})"
        else:
            shape = f"{nodes}, {self.gpu_count} GPUs ({len(models)} model{'s' if len(models) != 1 else ''})"
        return f"{shape}, split {self.split}{extra}"

    # --- cluster.json ---------------------------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "name": n.name,
                    "gpus": [_gpu_to_data(g) for g in n.gpus],
                    "links": None if n.links is None else links_to_data(n.links),
                    "mode": n.mode,
                    "cpu": n.cpu,
                    "memory": n.memory,
                    "devices": None if n.devices is None else n.devices.to_data(),
                    "nvidiaConfig": n.nvidia_config,
                    "nvidiaConfigSource": n.nvidia_config_source,
                    "operatingMode": n.operating_mode,
                }
                for n in self.nodes
            ],
            "split": self.split,
            "nodeSchedulerPolicy": self.node_scheduler_policy,
            "gpuSchedulerPolicy": self.gpu_scheduler_policy,
            "scale": self.scale_mode,
            "schedulerConfig": str(self.scheduler_config) if self.scheduler_config else None,
            "controlArgs": list(self.control_args),
            "controlReplicas": self.control_replicas,
            "nodeArgs": list(self.node_args),
            "schedulerArgs": list(self.scheduler_args),
            "controllerManagerArgs": list(self.controller_manager_args),
            "nodeCpu": self.node_cpu,
            "nodeMemory": self.node_memory,
            "timeoutSeconds": self.timeout_s,
            "apiserverArgs": list(self.apiserver_args),
            "nodeMetrics": self.node_metrics,
            "monitoring": self.monitoring,
            "monitoringIntervalSeconds": self.monitoring_interval_s,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ClusterSpec:
        try:
            nodes = tuple(
                _node_from_data(n["name"], tuple(_gpu_from_data(g) for g in n["gpus"]), n)
                for n in data["nodes"]
            )
            config = data.get("schedulerConfig")
            return cls(
                nodes,
                split=int(data["split"]),
                node_scheduler_policy=data.get("nodeSchedulerPolicy"),
                gpu_scheduler_policy=data.get("gpuSchedulerPolicy"),
                scale=bool(data["scale"]),
                scheduler_config=Path(config) if config else None,
                control_args=tuple(data.get("controlArgs") or ()),
                control_replicas=int(data.get("controlReplicas") or 1),
                node_args=tuple(data.get("nodeArgs") or ()),
                scheduler_args=tuple(data.get("schedulerArgs") or ()),
                controller_manager_args=tuple(data.get("controllerManagerArgs") or ()),
                node_cpu=str(data.get("nodeCpu", "8")),
                node_memory=str(data.get("nodeMemory", "32Gi")),
                timeout_s=data.get("timeoutSeconds"),
                apiserver_args=tuple(data.get("apiserverArgs") or ()),
                node_metrics=bool(data.get("nodeMetrics", True)),
                monitoring=bool(data.get("monitoring", False)),
                monitoring_interval_s=float(data.get("monitoringIntervalSeconds", 5.0)),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError, DeviceSpecError) as exc:
            raise SpecError(f"cluster spec: malformed ({exc!r})") from None


def _gpu_to_data(gpu: GPUSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"model": gpu.model, "memory": gpu.memory_mib}
    if gpu.mig:
        data["mig"] = True
    if gpu.mig_devices:
        data["migDevices"] = [{"profile": d.profile, "start": d.start} for d in gpu.mig_devices]
    return data


def _gpu_from_data(data: Mapping[str, Any]) -> GPUSpec:
    devices = tuple(FakeMigInstance(str(d["profile"]), int(d["start"])) for d in data.get("migDevices") or ())
    return GPUSpec(str(data["model"]), int(data["memory"]), bool(data.get("mig", False)), devices)


def _node_from_data(name: str, gpus: tuple[GPUSpec, ...], data: Mapping[str, Any]) -> NodeSpec:
    links = data.get("links")
    parsed = None if links is None else _parse_node_links(name, len(gpus), links)
    cpu, memory = data.get("cpu"), data.get("memory")
    devices = data.get("devices")
    return NodeSpec(
        name,
        gpus,
        parsed,
        str(data.get("mode") or "device-plugin"),
        None if cpu is None else str(cpu),
        None if memory is None else str(memory),
        None if devices is None else device_spec(devices),
        data.get("nvidiaConfig"),
        str(data.get("nvidiaConfigSource") or ""),
        str(data.get("operatingMode") or "hami-core"),
    )


def _parse_node_links(name: str, count: int, value: object) -> tuple[LinkGroup, ...]:
    """A node's `links` (GPUs by index); `SpecError` naming the entry and field."""
    gpus = generate_inventory(count, name).gpus
    try:
        return parse_links(value, gpus, source=name)
    except InventoryError as exc:
        raise SpecError(f"{exc.where}: {exc.reason}") from None


# --- fake inventories ------------------------------------------------------------------------------


def node_inventory(node: NodeSpec) -> Inventory:
    """The fake inventory of one node with NVIDIA GPUs: UUIDs derived from its name, its `links`, or else
    NVLink between GPUs of one model."""
    first = node.gpus[0]
    same = all(g == first for g in node.gpus)
    base = generate_inventory(
        len(node.gpus), node.name, model=first.model, memory_mib=first.memory_mib, nvlink=same
    )
    gpus = tuple(
        replace(g, model=s.model, memory_mib=s.memory_mib, mig_enabled=s.mig, mig_devices=s.mig_devices)
        for g, s in zip(base.gpus, node.gpus, strict=True)
    )
    links = base.links if node.links is None else node.links
    return Inventory(gpus, base.nvml, links)


def _mig_entry(value: object, where: str) -> tuple[bool, tuple[FakeMigInstance, ...]]:
    """A GPU's `mig`: true/false (MIG mode, no MIG device), a list of `{profile, start}` (MIG devices
    present at start), or `{devices: [...]}` as in the fake inventory."""
    if isinstance(value, bool):
        return value, ()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"devices"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected devices)")
        value, where = value.get("devices") or [], f"{where}.devices"
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise SpecError(
            f"{where}: expected true, false or a list of MIG devices ({{profile, start}}), got {value!r}"
        )
    devices: list[FakeMigInstance] = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise SpecError(f"{at}: expected {{profile, start}}, got {entry!r}")
        unknown = sorted(set(entry) - {"profile", "start"})
        if unknown:
            raise SpecError(f"{at}: unknown key {unknown[0]!r} (expected profile, start)")
        profile, start = entry.get("profile"), entry.get("start")
        if not isinstance(profile, str) or not profile:
            raise SpecError(f"{at}.profile: expected a MIG profile name such as 1g.5gb, got {profile!r}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise SpecError(
                f"{at}.start: expected an integer >= 0 (the placement's first memory slice), got {start!r}"
            )
        devices.append(FakeMigInstance(profile, start))
    return True, tuple(devices)


def _gpu_entry(value: object, where: str) -> GPUSpec:
    if isinstance(value, str):
        return GPUSpec(value)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"model", "memory", "mig"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected model, memory, mig)")
        model, memory = value.get("model"), value.get("memory", 0)
        mig, devices = _mig_entry(value.get("mig", False), f"{where}.mig")
        if not isinstance(model, str):
            raise SpecError(f"{where}.model: expected a GPU model name, got {model!r}")
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            raise SpecError(f"{where}.memory: expected a positive number of MiB, got {memory!r}")
        try:
            return GPUSpec(model, memory, mig, devices)
        except SpecError as exc:
            text = str(exc)
            if not isinstance(value.get("mig"), Mapping):  # the list form: `mig[i]`, as the user wrote it
                text = text.replace("mig.devices[", "mig[")
            raise SpecError(f"{where}.{text}" if text.startswith("mig") else f"{where}: {text}") from None
    raise SpecError(f"{where}: expected a model name or {{model, memory, mig}}, got {value!r}")


ReadFile = Callable[[Path], str]


def _nvidia_entry(
    value: object, where: str, base: Path | None, read_file: ReadFile | None
) -> tuple[str, str]:
    """A node's `nvidia`: NVIDIA's config file v1 inline (a mapping) or a path to it (relative to the
    inventory file's directory). Returns (text, source)."""
    if isinstance(value, Mapping):
        return yaml.safe_dump(dict(value), sort_keys=False), "nvidia"
    if isinstance(value, str) and value.strip():
        path = Path(value)
        if not path.is_absolute() and base is not None:
            path = base / path
        if read_file is None:
            raise SpecError(f"{where}.nvidia: a path ({value}) needs the inventory read from a file")
        try:
            return read_file(path), str(path)
        except OSError as exc:
            raise SpecError(f"{where}.nvidia: cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SpecError(f"{where}.nvidia: {path} is not UTF-8 text ({exc.reason})") from None
    raise SpecError(
        f"{where}.nvidia: expected NVIDIA's config file v1 (a mapping) or a path to it, got {value!r}"
    )


def _vendor_entry(
    name: str, value: Mapping[str, Any], where: str, base: Path | None, read_file: ReadFile | None
) -> NodeSpec:
    """A node entry naming a `vendor` (see the module docstring)."""
    unknown = sorted(set(value) - {*DEVICE_KEYS, "nvidia"})
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(DEVICE_KEYS)}, nvidia)")
    rest = {k: v for k, v in value.items() if k != "nvidia"}
    if rest.get("vendor") == NVIDIA:
        if "nvidia" in value:
            raise SpecError(f"{where}: nvidia: a node of vendor nvidia lists its GPUs itself")
        return _node_entry(name, {k: v for k, v in rest.items() if k != "vendor"}, where, base, read_file)
    try:
        devices = device_spec(rest)
    except DeviceSpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if "nvidia" in value:
        beside = _node_entry(name, value["nvidia"], f"{where}.nvidia", base, read_file)
        return replace(beside, devices=devices)
    return NodeSpec(name, (), None, devices=devices)


_SHARING_KEYS = ("nvidia", "mode")
"""Keys of a node entry with NVIDIA GPUs beside its GPUs: NVIDIA's config file, HAMi's operating mode."""


def _node_entry(
    name: str, value: object, where: str, base: Path | None = None, read_file: ReadFile | None = None
) -> NodeSpec:
    if isinstance(value, Mapping) and "vendor" in value:
        return _vendor_entry(name, value, where, base, read_file)
    sharing: dict[str, Any] = {}
    if isinstance(value, Mapping):
        config = value.get("nvidia")
        if config is not None:
            sharing["nvidia_config"], sharing["nvidia_config_source"] = _nvidia_entry(
                config, where, base, read_file
            )
        mode = value.get("mode", "hami-core")
        if mode not in OPERATING_MODES:
            raise SpecError(f"{where}.mode: expected one of {', '.join(OPERATING_MODES)}, got {mode!r}")
        sharing["operating_mode"] = mode
        value = {k: v for k, v in value.items() if k not in _SHARING_KEYS}
    links: object = None
    if isinstance(value, Mapping) and "gpus" in value:
        unknown = sorted(set(value) - {"gpus", "links"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected gpus, links, nvidia, mode)")
        links, value = value.get("links"), value["gpus"]
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise SpecError(f"{where}.gpus: expected a list of GPUs, got {value!r}")
        where = f"{where}.gpus"
    if isinstance(value, Sequence) and not isinstance(value, str):
        gpus = [_gpu_entry(g, f"{where}[{i}]") for i, g in enumerate(value)]
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - {"count", "model", "memory", "mig", "links"})
        if unknown:
            raise SpecError(
                f"{where}: unknown key {unknown[0]!r} "
                "(expected count, model, memory, mig, links, nvidia, mode)"
            )
        count = value.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SpecError(f"{where}.count: expected an integer >= 1, got {count!r}")
        links = value.get("links")
        gpu_keys = {k: v for k, v in value.items() if k not in ("count", "links")}
        gpu = _gpu_entry(gpu_keys or {"model": DEFAULT_MODEL}, where)
        gpus = [gpu] * count
    else:
        raise SpecError(
            f"{where}: expected a list of GPUs, {{count, model, memory, links}} or {{gpus, links}}, "
            f"got {value!r}"
        )
    parsed = None if links is None else _parse_node_links(name, len(gpus), links)
    return NodeSpec(name, tuple(gpus), parsed, **sharing)


def parse_inventory_spec(
    data: object,
    source: str = "<inventory>",
    *,
    base: Path | None = None,
    read_file: ReadFile | None = None,
) -> tuple[NodeSpec, ...]:
    """Nodes from a decoded inventory file (see the module docstring); `SpecError` names the entry. A
    node's `nvidia` given as a path is read through `read_file`, relative to `base`."""
    if not isinstance(data, Mapping) or not data:
        raise SpecError(f"{source}: expected a mapping of node name -> GPUs, got {data!r}")
    nodes: list[NodeSpec] = []
    for name, value in data.items():
        where = f"{source}: {name}"
        if not isinstance(name, str):
            raise SpecError(f"{source}: node names must be strings, got {name!r}")
        try:
            nodes.append(_node_entry(name, value, where, base, read_file))
        except SpecError as exc:
            text = str(exc)
            raise SpecError(text if text.startswith(source) else f"{where}: {text}") from None
    return tuple(nodes)


def load_inventory_spec(path: Path) -> tuple[NodeSpec, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"--inventory: cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return parse_inventory_spec(data, str(path), base=path.parent, read_file=_read_text)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")
