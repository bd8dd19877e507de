"""`kubectl hami quota`: per namespace, the GPU quota keys HAMi reads against what the namespace uses. Pure.

The keys are `quota.quota_keys` (`limits.nvidia.com/gpumem`, `limits.nvidia.com/gpucores`); the hard limit
of a namespace is the tightest over its ResourceQuotas (`quota_store.QuotaCache`, memory already x the
memory factor, so in MiB), and its usage is the pod store's (`pod_store.PodStore.used`: every non-terminal
pod, Pending included, its allocation's real MiB once chosen, else its request): the numbers the webhook
and the extender check. Listed: namespaces with a GPU limit, and namespaces using GPU memory or cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami_control.quota import quota_keys
from hami_control.status.snapshot import Snapshot, name_of, namespace_of
from hami_control.status.table import bar, columns


@dataclass(frozen=True, slots=True)
class QuotaRow:
    namespace: str
    resource: str
    """The ResourceQuota key (`limits.nvidia.com/gpumem`)."""
    unit: str
    used: int
    hard: int | None
    """None: no limit."""
    quotas: tuple[str, ...]
    """The ResourceQuotas of the namespace that set this key."""


def _namespaces(snapshot: Snapshot) -> set[str]:
    namespaces = set(snapshot.quotas.namespaces())
    for record in snapshot.pods.pods():
        if record.usage.memory or record.usage.cores:
            namespaces.add(record.namespace or "default")
    return namespaces


def build_quota(snapshot: Snapshot, namespace: str | None = None) -> list[QuotaRow]:
    """Two rows (memory, cores) per namespace listed (see the module docstring), sorted by namespace."""
    memory_key, cores_key = quota_keys(snapshot.config.requests.names)
    setting: dict[tuple[str, str], list[str]] = {}
    for obj in snapshot.quota_objects:
        hard = (obj.get("spec") or {}).get("hard") or {}
        for key in (memory_key, cores_key):
            if key in hard:
                setting.setdefault((namespace_of(obj), key), []).append(name_of(obj))
    wanted = {namespace} if namespace is not None else _namespaces(snapshot)
    rows: list[QuotaRow] = []
    for ns in sorted(wanted):
        limits = snapshot.quota_view.limits(ns)
        used = snapshot.quota_view.used(ns)
        for key, unit, value, hard in (
            (memory_key, "MiB", used.memory, limits.memory),
            (cores_key, "%", used.cores, limits.cores),
        ):
            rows.append(QuotaRow(ns, key, unit, value, hard, tuple(sorted(setting.get((ns, key), [])))))
    return rows


def render_quota(rows: list[QuotaRow]) -> str:
    if not rows:
        return "No namespace has a GPU quota or uses GPUs."
    header = ["NAMESPACE", "RESOURCE", "USED", "HARD", "", "QUOTA"]
    table = []
    for r in rows:
        hard = "-" if r.hard is None else f"{r.hard} {r.unit}"
        shown = bar(r.used, r.hard) if r.hard is not None else ""
        table.append([r.namespace, r.resource, f"{r.used} {r.unit}", hard, shown, ",".join(r.quotas) or "-"])
    return columns(header, table)


def quota_dict(rows: list[QuotaRow]) -> dict[str, Any]:
    namespaces: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = namespaces.setdefault(r.namespace, {"namespace": r.namespace, "resources": []})
        entry["resources"].append(
            {"key": r.resource, "unit": r.unit, "used": r.used, "hard": r.hard, "quotas": list(r.quotas)}
        )
    return {"apiVersion": "hami.io/v1", "kind": "GPUQuota", "namespaces": list(namespaces.values())}


__all__ = ["QuotaRow", "build_quota", "quota_dict", "render_quota"]
