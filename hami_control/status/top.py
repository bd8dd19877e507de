"""`kubectl hami top`: per node and GPU, slices, memory and cores in use, health and pods. Pure.

Device-plugin nodes: the GPUs and their usage are `cache.ClusterCache.node_gpus` (the register annotation,
the cordon annotation, the pods' allocation annotations reduced to their footprint: exactly what the
extender fits against), the pods on each GPU its `holdings`. A node with the register annotation that
hami-control does not count (annotation that does not decode, no allocatable `nvidia.com/gpu`) is listed
with the reason. DRA nodes (`dra`): the devices of our driver's ResourceSlices, each claim result one
share; slices have no fixed count there (`total` None).

`--namespace` keeps the GPUs that hold a pod of the namespace (their usage stays the GPU's whole usage)
and lists only that namespace's pods; `--node` keeps one node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hami_control.cache import UNREGISTERED
from hami_control.status.dra import claim_shares, dra_gpus
from hami_control.status.snapshot import Snapshot
from hami_control.status.table import bar, columns
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


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    mode: str
    """`device-plugin` or `dra`."""
    gpus: tuple[GPURow, ...] = ()
    problem: str = ""
    """Why hami-control does not count the node's GPUs (empty when it does)."""


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


def _plugin_node(snapshot: Snapshot, name: str) -> NodeRow | None:
    gpus = snapshot.gpus.node_gpus(name)
    if gpus is None:
        if not snapshot.has_register(name):
            return None  # no HAMi GPUs at all
        reason = snapshot.gpus.unregistered_reason(name) or f"{UNREGISTERED}: unknown"
        return NodeRow(name, "device-plugin", problem=reason)
    pods = _pods_by_gpu(snapshot, name)
    rows = tuple(
        GPURow(
            uuid=g.id,
            index=g.info.index,
            model=g.info.type,
            mode=g.info.mode,
            numa=g.info.numa,
            health=_health(g),
            slices_used=g.used,
            slices_total=g.info.count,
            memory_used=g.usedmem,
            memory_total=g.info.devmem,
            cores_used=g.usedcores,
            cores_total=g.info.devcore,
            pods=tuple(pods.get(g.id, ())),
        )
        for g in sorted(gpus.gpus, key=lambda g: g.info.index)
    )
    return NodeRow(name, "device-plugin", rows)


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
    rows.update(_dra_nodes(snapshot))
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
                    kept.append(GPURow(**{**_fields(gpu), "pods": mine}))
            if not kept:
                continue
            row = NodeRow(row.name, row.mode, tuple(kept), row.problem)
        out.append(row)
    return Top(tuple(out), namespace)


def _fields(gpu: GPURow) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in GPURow.__slots__}


# --- output ---------------------------------------------------------------------------------------------


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 12 else ".." + uuid[-8:]


def _pods_text(gpu: GPURow, wide: bool) -> str:
    if wide:
        return ", ".join(f"{p.ref} ({p.memory} MiB, {p.cores}%)" for p in gpu.pods) or "-"
    return ", ".join(p.ref for p in gpu.pods) or "-"


def render_top(top: Top, *, wide: bool = False) -> str:
    """The table: one row per GPU (bars as in the demo), then one line per node whose GPUs hami-control
    does not count. `wide` adds the full UUID, mode, NUMA node and each pod's share."""
    header = ["NODE", "GPU", "UUID", "MODEL", "SLICES", "MEMORY (MiB)", "CORES (%)", "HEALTH"]
    if wide:
        header[5:5] = ["MODE", "NUMA"]
    header.append("PODS")
    rows: list[list[str]] = []
    problems: list[str] = []
    for node in top.nodes:
        if node.problem:
            problems.append(f"{node.name}: GPUs not counted: {node.problem}")
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
            ]
            if wide:
                row[5:5] = [gpu.mode, str(gpu.numa)]
            row.append(_pods_text(gpu, wide))
            rows.append(row)
    if not rows and not problems:
        where = f" with pods of namespace {top.namespace}" if top.namespace else ""
        return f"No HAMi GPUs found{where}."
    text = columns(header, rows) if rows else ""
    return "\n".join(part for part in (text, *problems) if part)


def top_dict(top: Top) -> dict[str, Any]:
    """The JSON/YAML form (`kind: GPUTop`): nodes, their GPUs with `{used, total}` pairs and pods."""

    def pair(used: int, total: int | None) -> dict[str, int | None]:
        return {"used": used, "total": total}

    nodes = []
    for node in top.nodes:
        gpus = [
            {
                "uuid": g.uuid,
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
            }
            for g in node.gpus
        ]
        entry: dict[str, Any] = {"name": node.name, "mode": node.mode, "counted": not node.problem}
        if node.problem:
            entry["problem"] = node.problem
        entry["gpus"] = gpus
        nodes.append(entry)
    return {"apiVersion": "hami.io/v1", "kind": "GPUTop", "nodes": nodes}


__all__ = ["GPURow", "NodeRow", "PodShare", "Top", "UnknownNode", "build_top", "render_top", "top_dict"]
