"""`kubectl hami top`: per node and device, slices, memory and cores in use, health and pods, for NVIDIA's
GPUs and every other vendor's devices. Pure.

Device-plugin nodes: the GPUs and their usage are `cache.ClusterCache.node_gpus` (the register annotation,
the cordon annotation, the pods' allocation annotations reduced to their footprint: exactly what the
extender fits against), the other vendors' devices `ClusterCache.vendor_devices` (each vendor's
inventory, with what the pods' vendor annotations hold), the pods on each device its `holdings`. Each
device names its vendor (`status.vendors`: `nvidia`, or the vendor's family such as `hygon`), and each
node has per-vendor totals (`NodeRow.vendors`). A node with the register annotation that hami-control
does not count (annotation that does not decode, no allocatable `nvidia.com/gpu`) is listed with the
reason, and so is each vendor inventory it leaves out (`ClusterCache.vendor_problems`: one that does not
decode, or a vendor whose count resource is not allocatable). DRA nodes (`dra`): the devices of our
driver's ResourceSlices (NVIDIA's), each claim result one share; slices have no fixed count there
(`total` None).

HAMi's dynamic MIG (`status.nvidia_modes`): a GPU in mig mode also lists its MIG instances (profile,
placement, pod and container, and the MIG UUID with its GPU/compute instance IDs once hami-node recorded
them) and which of its memory slices they cover (`GPURow.mig`, `mig_slices`). Nodes in NVIDIA's modes
(no register, NVIDIA's resources on the Node) are listed with each resource's allocatable against what
the pods bound there request, and GFD's labels for it (`NodeRow.nvidia`, mode `nvidia-plugin`).

`--namespace` keeps the GPUs that hold a pod of the namespace (their usage stays the GPU's whole usage)
and lists only that namespace's pods (and MIG instances, and NVIDIA resources those pods request);
`--node` keeps one node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hami_api.types import MigPlacement
from hami_control.cache import UNREGISTERED
from hami_control.status.dra import claim_shares, dra_gpus
from hami_control.status.nvidia_modes import (
    PLUGIN_MODE,
    MigInstance,
    NvidiaNode,
    NvidiaResource,
    container_names,
    memory_slices,
    mig_instance,
    nvidia_node,
    slice_map,
    slices_used,
)
from hami_control.status.snapshot import Snapshot
from hami_control.status.table import bar, columns
from hami_control.status.vendors import NVIDIA_FAMILY
from hami_control.usage import GPUUsage

OK, UNHEALTHY, CORDONED = "ok", "unhealthy", "cordoned"


@dataclass(frozen=True, slots=True)
class PodShare:
    """What one pod holds of one GPU (summed over its containers' slices there)."""

    namespace: str
    name: str
    memory: int
    cores: int

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GPURow:
    uuid: str
    index: int
    model: str
    mode: str
    numa: int
    health: str
    slices_used: int
    slices_total: int | None
    """None on DRA nodes (a GPU takes as many claims as its capacity allows)."""
    memory_used: int
    memory_total: int
    cores_used: int
    cores_total: int
    pods: tuple[PodShare, ...] = ()
    vendor: str = NVIDIA_FAMILY
    """`nvidia`, or the family of the device's vendor (`status.vendors`)."""
    mig_slices: int = 0
    """The memory slices of a GPU in HAMi's dynamic MIG mode (8, or 4 on an A30); 0 for other GPUs."""
    mig: tuple[MigInstance, ...] = ()
    """The MIG instances pods reserved on it, by placement (with `--namespace`, that namespace's)."""
    mig_in_use: tuple[MigPlacement, ...] = ()
    """Every placement reserved on it (the cache's `GPUUsage.mig_in_use`: the GPU's whole use)."""

    @property
    def is_mig(self) -> bool:
        return self.mig_slices > 0

    @property
    def mig_map(self) -> str:
        """`##....#.`: the memory slices the instances cover."""
        return slice_map(self.mig_slices, self.mig_in_use)

    @property
    def mig_used(self) -> int:
        return slices_used(self.mig_slices, self.mig_in_use)


@dataclass(frozen=True, slots=True)
class VendorTotal:
    """One vendor's devices on a node, summed (`slices_total` None when a device has no fixed count)."""

    vendor: str
    devices: int
    slices_used: int
    slices_total: int | None
    memory_used: int
    memory_total: int
    cores_used: int
    cores_total: int


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    mode: str
    """`device-plugin` or `dra`."""
    gpus: tuple[GPURow, ...] = ()
    """Every device of the node: NVIDIA's GPUs first (by index), then the other vendors' devices (in
    registry order, each vendor's in its inventory's order)."""
    problem: str = ""
    """Why hami-control does not count the node's NVIDIA GPUs (empty when it does)."""
    vendor_problems: tuple[str, ...] = ()
    """Why vendors' devices of the node are left out, `<family>: <why>` each."""
    nvidia: NvidiaNode | None = None
    """A node in NVIDIA's modes (mode `nvidia-plugin`): its NVIDIA resources and GFD's labels."""

    @property
    def vendors(self) -> tuple[VendorTotal, ...]:
        """Per vendor, its devices' totals, in the order of `gpus`."""
        groups: dict[str, list[GPURow]] = {}
        for gpu in self.gpus:
            groups.setdefault(gpu.vendor, []).append(gpu)
        return tuple(_total(vendor, rows) for vendor, rows in groups.items())


def _total(vendor: str, rows: list[GPURow]) -> VendorTotal:
    counts = [r.slices_total for r in rows]
    return VendorTotal(
        vendor,
        len(rows),
        sum(r.slices_used for r in rows),
        None if None in counts else sum(c or 0 for c in counts),
        sum(r.memory_used for r in rows),
        sum(r.memory_total for r in rows),
        sum(r.cores_used for r in rows),
        sum(r.cores_total for r in rows),
    )


@dataclass(frozen=True, slots=True)
class Top:
    nodes: tuple[NodeRow, ...] = field(default_factory=tuple)
    namespace: str | None = None


def _health(gpu: GPUUsage) -> str:
    if not gpu.healthy:
        return UNHEALTHY
    return CORDONED if gpu.cordoned else OK


def _pods_by_gpu(snapshot: Snapshot, node: str) -> dict[str, list[PodShare]]:
    shares: dict[str, dict[tuple[str, str], list[int]]] = {}
    for holding in snapshot.gpus.holdings(node):
        for s in holding.slices:
            entry = shares.setdefault(s.uuid, {}).setdefault((holding.namespace, holding.name), [0, 0])
            entry[0] += s.usedmem
            entry[1] += s.usedcores
    return {
        uuid: [PodShare(ns, name, mem, cores) for (ns, name), (mem, cores) in sorted(pods.items())]
        for uuid, pods in shares.items()
    }


def _mig_by_gpu(snapshot: Snapshot, node: str) -> dict[str, list[MigInstance]]:
    """Every MIG reservation of the pods counted on the node, by GPU, in placement order."""
    out: dict[str, list[MigInstance]] = {}
    by_uid = snapshot.pods_by_uid
    for holding in snapshot.gpus.holdings(node):
        if not holding.mig:
            continue
        names = container_names(by_uid.get(holding.uid))
        for a in holding.mig:
            out.setdefault(a.gpu_uuid, []).append(mig_instance(holding.namespace, holding.name, names, a))
    for instances in out.values():
        instances.sort(key=lambda i: (i.placement.start, i.placement.size, i.ref, i.container))
    return out


def _row(
    gpu: GPUUsage,
    pods: dict[str, list[PodShare]],
    vendor: str,
    mig: dict[str, list[MigInstance]] | None = None,
) -> GPURow:
    info = gpu.info
    instances = (mig or {}).get(gpu.id, ())
    return GPURow(
        uuid=gpu.id,
        index=info.index,
        model=info.type,
        mode=info.mode,
        numa=info.numa,
        health=_health(gpu),
        slices_used=gpu.used,
        slices_total=info.count,
        memory_used=gpu.usedmem,
        memory_total=info.devmem,
        cores_used=gpu.usedcores,
        cores_total=info.devcore,
        pods=tuple(pods.get(gpu.id, ())),
        vendor=vendor,
        mig_slices=memory_slices(info) if gpu.is_mig else 0,
        mig=tuple(instances),
        mig_in_use=gpu.mig_in_use if gpu.is_mig else (),
    )


def _plugin_node(snapshot: Snapshot, name: str) -> NodeRow | None:
    cache = snapshot.gpus
    gpus = cache.node_gpus(name)
    devices = cache.vendor_devices(name)
    problems = cache.vendor_problems(name)
    problem = ""
    if gpus is None and snapshot.has_register(name):
        problem = cache.unregistered_reason(name) or f"{UNREGISTERED}: unknown"
    if gpus is None and devices is None and not problem and not problems:
        return None  # no HAMi devices at all
    pods = _pods_by_gpu(snapshot, name)
    nvidia = sorted(gpus.gpus, key=lambda g: g.info.index) if gpus is not None else []
    mig = _mig_by_gpu(snapshot, name) if gpus is not None and gpus.has_mig else {}
    rows = [_row(g, pods, NVIDIA_FAMILY, mig) for g in nvidia]
    if devices is not None:
        families = snapshot.families
        rows += [_row(g, pods, families.of_type(g.info.type)) for g in devices.gpus]
    return NodeRow(name, "device-plugin", tuple(rows), problem, problems)


def _dra_nodes(snapshot: Snapshot) -> dict[str, NodeRow]:
    gpus = dra_gpus(snapshot.slices)
    used: dict[str, list[int]] = {key: [0, 0, 0] for key in gpus}
    pods: dict[str, dict[str, list[int]]] = {}
    for share in claim_shares(snapshot.claims, gpus):
        used[share.device][0] += 1
        used[share.device][1] += share.memory
        used[share.device][2] += share.cores
        for ref in share.pods:
            entry = pods.setdefault(share.device, {}).setdefault(ref, [0, 0])
            entry[0] += share.memory
            entry[1] += share.cores
    by_node: dict[str, list[GPURow]] = {}
    for key, gpu in gpus.items():
        info = gpu.info
        shares = tuple(
            PodShare(*_split(ref), memory=mem, cores=cores)
            for ref, (mem, cores) in sorted(pods.get(key, {}).items())
        )
        by_node.setdefault(gpu.node, []).append(
            GPURow(
                uuid=info.id,
                index=info.index,
                model=info.type,
                mode=info.mode,
                numa=info.numa,
                health=OK if info.health else UNHEALTHY,
                slices_used=used[key][0],
                slices_total=None,
                memory_used=used[key][1],
                memory_total=info.devmem,
                cores_used=used[key][2],
                cores_total=info.devcore,
                pods=shares,
            )
        )
    return {
        node: NodeRow(node, "dra", tuple(sorted(rows, key=lambda r: r.index)))
        for node, rows in by_node.items()
    }


def _split(ref: str) -> tuple[str, str]:
    namespace, _, name = ref.partition("/")
    return namespace, name


class UnknownNode(LookupError):
    """`--node` names a node the cluster does not have."""


def build_top(snapshot: Snapshot, *, node: str | None = None, namespace: str | None = None) -> Top:
    """The model of `kubectl hami top` (see the module docstring). Raises `UnknownNode`."""
    if node is not None and node not in snapshot.nodes:
        raise UnknownNode(f"node {node!r} not found")
    rows: dict[str, NodeRow] = {}
    for name in sorted(snapshot.nodes):
        row = _plugin_node(snapshot, name)
        if row is not None:
            rows[name] = row
        elif not snapshot.has_register(name):
            served = nvidia_node(snapshot.nodes[name], snapshot.pod_objects)
            if served is not None:
                rows[name] = NodeRow(name, PLUGIN_MODE, nvidia=served)
    for name, dra in _dra_nodes(snapshot).items():
        plugin = rows.get(name)  # a DRA node may hold other vendors' devices beside its GPUs
        if plugin is None:
            rows[name] = dra
            continue
        others = tuple(g for g in plugin.gpus if g.vendor != NVIDIA_FAMILY)
        rows[name] = NodeRow(name, dra.mode, dra.gpus + others, plugin.problem, plugin.vendor_problems)
    out: list[NodeRow] = []
    for name in sorted(rows):
        row = rows[name]
        if node is not None and name != node:
            continue
        if namespace is not None:
            kept = []
            for gpu in row.gpus:
                mine = tuple(p for p in gpu.pods if p.namespace == namespace)
                if mine:
                    instances = tuple(i for i in gpu.mig if i.namespace == namespace)
                    kept.append(GPURow(**{**_fields(gpu), "pods": mine, "mig": instances}))
            served = _nvidia_of(row.nvidia, namespace)
            if not kept and served is None:
                continue
            row = NodeRow(row.name, row.mode, tuple(kept), row.problem, row.vendor_problems, served)
        out.append(row)
    return Top(tuple(out), namespace)


def _fields(gpu: GPURow) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in GPURow.__slots__}


def _nvidia_of(node: NvidiaNode | None, namespace: str) -> NvidiaNode | None:
    """The node's NVIDIA resources that pods of `namespace` request, with only those pods; None if none."""
    if node is None:
        return None
    kept = []
    for r in node.resources:
        mine = tuple(p for p in r.pods if p.namespace == namespace)
        if mine:
            kept.append(
                NvidiaResource(**{**{k: getattr(r, k) for k in NvidiaResource.__slots__}, "pods": mine})
            )
    return NvidiaNode(tuple(kept), node.mig_strategy, node.mig_capable) if kept else None


# --- output ---------------------------------------------------------------------------------------------


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 12 else ".." + uuid[-8:]


def _pods_text(gpu: GPURow, wide: bool) -> str:
    if wide:
        return ", ".join(f"{p.ref} ({p.memory} MiB, {p.cores}%)" for p in gpu.pods) or "-"
    return ", ".join(p.ref for p in gpu.pods) or "-"


def _none(value: int | None) -> str:
    return "-" if value is None else str(value)


def _mig_rows(top: Top, wide: bool) -> list[list[str]]:
    """One row per MIG instance (one for a MIG GPU without any), the GPU's slice map on its first."""
    rows: list[list[str]] = []
    for node in top.nodes:
        for gpu in node.gpus:
            if not gpu.is_mig:
                continue
            used = f"{gpu.mig_map} {gpu.mig_used}/{gpu.mig_slices}"
            for n, inst in enumerate(gpu.mig or (None,)):
                row = [node.name, str(gpu.index), used if n == 0 else ""]
                if inst is None:
                    row += ["-", "-", "-", "-"]
                    if wide:
                        row[5:5] = ["-", "-", "-", "-"]
                    rows.append(row)
                    continue
                mig_uuid = inst.mig_uuid or "(not created yet)"
                if inst.mig_uuid and not wide:
                    mig_uuid = _short(inst.mig_uuid)
                row += [inst.profile, inst.slices, inst.ref, mig_uuid]
                if wide:
                    row[5:5] = [
                        slice_map(gpu.mig_slices, (inst.placement,)),
                        inst.container,
                        _none(inst.gpu_instance_id),
                        _none(inst.compute_instance_id),
                    ]
                rows.append(row)
    return rows


def _allocated_text(r: NvidiaResource) -> str:
    sick = f" ({r.unhealthy} unhealthy)" if r.unhealthy else ""
    return f"{r.allocated}/{r.allocatable}{sick}"


def _nvidia_rows(top: Top, wide: bool) -> list[list[str]]:
    """One row per NVIDIA resource of the nodes in NVIDIA's modes."""
    rows: list[list[str]] = []
    for node in top.nodes:
        if node.nvidia is None:
            continue
        for r in node.nvidia.resources:
            if wide:
                pods = ", ".join(f"{p.ref} ({p.count})" for p in r.pods) or "-"
            else:
                pods = ", ".join(p.ref for p in r.pods) or "-"
            row = [
                node.name,
                r.name,
                _allocated_text(r),
                r.product or "-",
                _none(r.count),
                _none(r.replicas),
                r.sharing_strategy or "-",
                node.nvidia.mig_strategy or "none",
                pods,
            ]
            if wide:
                row[4:4] = [_none(r.memory_mib), str(r.capacity)]
            rows.append(row)
    return rows


def render_top(top: Top, *, wide: bool = False) -> str:
    """The table: one row per device (bars as in the demo) with its vendor, then one line per node whose
    GPUs hami-control does not count and one per vendor inventory it leaves out. `wide` adds the full
    UUID, mode, NUMA node and each pod's share.

    Below it, when there are any: the MIG instances of GPUs in HAMi's dynamic MIG mode (the GPU's memory
    slices as a map, `#` taken, with used/total on its first instance; each instance's profile, placement
    as slices, pod and MIG UUID; `wide` adds the instance's own slice map, its container, the GPU and
    compute instance IDs and the full MIG UUID), then the resources of nodes in NVIDIA's modes
    (allocated/allocatable, GFD's product, device count, replicas and sharing strategy, the node's MIG
    strategy, the pods; `wide` adds the memory label, the capacity and each pod's count)."""
    header = ["NODE", "GPU", "UUID", "MODEL", "SLICES", "MEMORY (MiB)", "CORES (%)", "HEALTH", "VENDOR"]
    if wide:
        header[5:5] = ["MODE", "NUMA"]
    header.append("PODS")
    rows: list[list[str]] = []
    problems: list[str] = []
    for node in top.nodes:
        if node.problem:
            problems.append(f"{node.name}: GPUs not counted: {node.problem}")
        problems += [f"{node.name}: devices not counted: {p}" for p in node.vendor_problems]
        for gpu in node.gpus:
            total = "-" if gpu.slices_total is None else str(gpu.slices_total)
            row = [
                node.name,
                str(gpu.index),
                gpu.uuid if wide else _short(gpu.uuid),
                gpu.model,
                f"{gpu.slices_used}/{total}",
                f"{bar(gpu.memory_used, gpu.memory_total)} {gpu.memory_used}/{gpu.memory_total}",
                f"{bar(gpu.cores_used, gpu.cores_total)} {gpu.cores_used}/{gpu.cores_total}",
                gpu.health,
                gpu.vendor,
            ]
            if wide:
                row[5:5] = [gpu.mode, str(gpu.numa)]
            row.append(_pods_text(gpu, wide))
            rows.append(row)
    mig = _mig_rows(top, wide)
    plugin = _nvidia_rows(top, wide)
    if not rows and not problems and not plugin:
        where = f" with pods of namespace {top.namespace}" if top.namespace else ""
        return f"No HAMi GPUs found{where}."
    parts = [columns(header, rows) if rows else ""]
    if mig:
        mig_header = ["NODE", "GPU", "MEMORY SLICES", "PROFILE", "PLACEMENT", "POD", "MIG UUID"]
        if wide:
            mig_header[5:5] = ["INSTANCE MAP", "CONTAINER", "GI", "CI"]
        parts += ["", "MIG instances (HAMi's dynamic MIG):", columns(mig_header, mig)]
    if plugin:
        plugin_header = ["NODE", "RESOURCE", "ALLOCATED", "PRODUCT", "DEVICES", "REPLICAS", "SHARING"]
        plugin_header += ["MIG STRATEGY", "PODS"]
        if wide:
            plugin_header[4:4] = ["MEMORY (MiB)", "CAPACITY"]
        parts += [
            "",
            "NVIDIA device plugin resources (kube-scheduler alone):",
            columns(plugin_header, plugin),
        ]
    text = "\n".join(parts).strip("\n")
    return "\n".join(part for part in (text, *problems) if part)


def _mig_dict(g: GPURow) -> dict[str, Any]:
    instances = []
    for i in g.mig:
        entry: dict[str, Any] = {
            "namespace": i.namespace,
            "pod": i.pod,
            "container": i.container,
            "profile": i.profile,
            "placement": {"start": i.placement.start, "size": i.placement.size},
            "slices": i.slices,
        }
        if i.mig_uuid:
            entry["migUUID"] = i.mig_uuid
        if i.gpu_instance_id is not None:
            entry["gpuInstanceID"] = i.gpu_instance_id
        if i.compute_instance_id is not None:
            entry["computeInstanceID"] = i.compute_instance_id
        instances.append(entry)
    return {
        "memorySlices": {"used": g.mig_used, "total": g.mig_slices},
        "map": g.mig_map,
        "instances": instances,
    }


def _nvidia_dict(n: NvidiaNode) -> dict[str, Any]:
    return {
        "migStrategy": n.mig_strategy or "none",
        "migCapable": n.mig_capable,
        "resources": [
            {
                "name": r.name,
                "capacity": r.capacity,
                "allocatable": r.allocatable,
                "allocated": r.allocated,
                "product": r.product or None,
                "count": r.count,
                "replicas": r.replicas,
                "sharingStrategy": r.sharing_strategy or None,
                "memoryMiB": r.memory_mib,
                "pods": [{"namespace": p.namespace, "name": p.name, "count": p.count} for p in r.pods],
            }
            for r in n.resources
        ],
    }


def top_dict(top: Top) -> dict[str, Any]:
    """The JSON/YAML form (`kind: GPUTop`): nodes, their per-vendor totals and their devices (`gpus`,
    each with its `vendor`) with `{used, total}` pairs and pods; a GPU in HAMi's dynamic MIG mode also
    `mig` (its memory slices used/total, the map, the instances), a node in NVIDIA's modes `nvidia` (MIG
    strategy, and per resource capacity, allocatable, allocated, GFD's labels and the pods)."""

    def pair(used: int, total: int | None) -> dict[str, int | None]:
        return {"used": used, "total": total}

    nodes = []
    for node in top.nodes:
        gpus = [
            {
                "uuid": g.uuid,
                "vendor": g.vendor,
                "index": g.index,
                "model": g.model,
                "mode": g.mode,
                "numa": g.numa,
                "health": g.health,
                "slices": pair(g.slices_used, g.slices_total),
                "memoryMiB": pair(g.memory_used, g.memory_total),
                "cores": pair(g.cores_used, g.cores_total),
                "pods": [
                    {"namespace": p.namespace, "name": p.name, "memoryMiB": p.memory, "cores": p.cores}
                    for p in g.pods
                ],
                **({"mig": _mig_dict(g)} if g.is_mig else {}),
            }
            for g in node.gpus
        ]
        counted = not node.problem and not node.vendor_problems
        entry: dict[str, Any] = {"name": node.name, "mode": node.mode, "counted": counted}
        if node.problem:
            entry["problem"] = node.problem
        if node.vendor_problems:
            entry["vendorProblems"] = list(node.vendor_problems)
        entry["vendors"] = [
            {
                "vendor": v.vendor,
                "devices": v.devices,
                "slices": pair(v.slices_used, v.slices_total),
                "memoryMiB": pair(v.memory_used, v.memory_total),
                "cores": pair(v.cores_used, v.cores_total),
            }
            for v in node.vendors
        ]
        entry["gpus"] = gpus
        if node.nvidia is not None:
            entry["nvidia"] = _nvidia_dict(node.nvidia)
        nodes.append(entry)
    return {"apiVersion": "hami.io/v1", "kind": "GPUTop", "nodes": nodes}


__all__ = [
    "GPURow",
    "NodeRow",
    "PodShare",
    "Top",
    "UnknownNode",
    "VendorTotal",
    "build_top",
    "render_top",
    "top_dict",
]
