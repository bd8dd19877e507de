"""What a local cluster is made of: its nodes and their fake GPUs, the vGPU split, the scheduling
policies and extra flags. Pure apart from `load_inventory_spec`, which reads one file.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hami_api.mig import mig_model
from hami_api.settings import DNS_SUBDOMAIN
from hami_node.gpu.inventory import (
    DEFAULT_MODEL,
    Inventory,
    InventoryError,
    LinkGroup,
    generate_inventory,
    links_to_data,
    parse_links,
)
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
    """MIG mode on, no MIG device yet (a model of `hami_api.mig.MIG_MODELS`): in DRA mode hami-node
    publishes its MIG partitions."""

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise SpecError("model: must not be empty")
        if self.memory_mib < 0 or isinstance(self.memory_mib, bool):
            raise SpecError(f"memory: expected a positive number of MiB, got {self.memory_mib!r}")
        if self.memory_mib == 0:
            object.__setattr__(self, "memory_mib", model_memory_mib(self.model))
        if self.mig and mig_model(self.model) is None:
            raise SpecError(f"mig: {self.model} is not a MIG-capable model (A100, A30, H100, H200)")


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

    @property
    def vendor(self) -> str:
        return self.devices.vendor if self.devices is not None else NVIDIA

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
        mode, the others on the device plugin. Nodes of other vendors stay on the device plugin in `mixed`
        (and `dra` refuses them, naming the node)."""
        if mode not in CLUSTER_MODES:
            raise SpecError(f"mode: expected one of {', '.join(CLUSTER_MODES)}, got {mode!r}")
        nodes = tuple(
            n
            if mode == "mixed" and n.devices is not None
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
                    "gpus": [{"model": g.model, "memory": g.memory_mib} for g in n.gpus],
                    "links": None if n.links is None else links_to_data(n.links),
                    "mode": n.mode,
                    "cpu": n.cpu,
                    "memory": n.memory,
                    "devices": None if n.devices is None else n.devices.to_data(),
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
            "extra": dict(self.extra),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ClusterSpec:
        try:
            nodes = tuple(
                _node_from_data(n["name"], tuple(GPUSpec(g["model"], int(g["memory"])) for g in n["gpus"]), n)
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
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError, DeviceSpecError) as exc:
            raise SpecError(f"cluster spec: malformed ({exc!r})") from None


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
        replace(g, model=s.model, memory_mib=s.memory_mib, mig_enabled=s.mig)
        for g, s in zip(base.gpus, node.gpus, strict=True)
    )
    links = base.links if node.links is None else node.links
    return Inventory(gpus, base.nvml, links)


def _gpu_entry(value: object, where: str) -> GPUSpec:
    if isinstance(value, str):
        return GPUSpec(value)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"model", "memory", "mig"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected model, memory, mig)")
        model, memory, mig = value.get("model"), value.get("memory", 0), value.get("mig", False)
        if not isinstance(mig, bool):
            raise SpecError(f"{where}.mig: expected true or false, got {mig!r}")
        if not isinstance(model, str):
            raise SpecError(f"{where}.model: expected a GPU model name, got {model!r}")
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            raise SpecError(f"{where}.memory: expected a positive number of MiB, got {memory!r}")
        return GPUSpec(model, memory, mig)
    raise SpecError(f"{where}: expected a model name or {{model, memory}}, got {value!r}")


def _vendor_entry(name: str, value: Mapping[str, Any], where: str) -> NodeSpec:
    """A node entry naming a `vendor` (see the module docstring)."""
    unknown = sorted(set(value) - {*DEVICE_KEYS, "nvidia"})
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(DEVICE_KEYS)}, nvidia)")
    rest = {k: v for k, v in value.items() if k != "nvidia"}
    if rest.get("vendor") == NVIDIA:
        if "nvidia" in value:
            raise SpecError(f"{where}: nvidia: a node of vendor nvidia lists its GPUs itself")
        return _node_entry(name, {k: v for k, v in rest.items() if k != "vendor"}, where)
    try:
        devices = device_spec(rest)
    except DeviceSpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    gpus: tuple[GPUSpec, ...] = ()
    links = None
    if "nvidia" in value:
        beside = _node_entry(name, value["nvidia"], f"{where}.nvidia")
        gpus, links = beside.gpus, beside.links
    return NodeSpec(name, gpus, links, devices=devices)


def _node_entry(name: str, value: object, where: str) -> NodeSpec:
    if isinstance(value, Mapping) and "vendor" in value:
        return _vendor_entry(name, value, where)
    links: object = None
    if isinstance(value, Mapping) and "gpus" in value:
        unknown = sorted(set(value) - {"gpus", "links"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected gpus, links)")
        links, value = value.get("links"), value["gpus"]
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise SpecError(f"{where}.gpus: expected a list of GPUs, got {value!r}")
        where = f"{where}.gpus"
    if isinstance(value, Sequence) and not isinstance(value, str):
        gpus = [_gpu_entry(g, f"{where}[{i}]") for i, g in enumerate(value)]
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - {"count", "model", "memory", "links"})
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (expected count, model, memory, links)")
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
    return NodeSpec(name, tuple(gpus), None if links is None else _parse_node_links(name, len(gpus), links))


def parse_inventory_spec(data: object, source: str = "<inventory>") -> tuple[NodeSpec, ...]:
    """Nodes from a decoded inventory file (see the module docstring); `SpecError` names the entry."""
    if not isinstance(data, Mapping) or not data:
        raise SpecError(f"{source}: expected a mapping of node name -> GPUs, got {data!r}")
    nodes: list[NodeSpec] = []
    for name, value in data.items():
        where = f"{source}: {name}"
        if not isinstance(name, str):
            raise SpecError(f"{source}: node names must be strings, got {name!r}")
        try:
            nodes.append(_node_entry(name, value, where))
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
    return parse_inventory_spec(data, str(path))
