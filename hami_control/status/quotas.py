"""`kubectl hami quota`: per namespace, the GPU quota keys HAMi reads against what the namespace uses. Pure.

NVIDIA's keys are `quota.quota_keys` (`limits.nvidia.com/gpumem`, `limits.nvidia.com/gpucores`); the
other vendors' are `limits.<resource>` of each vendor's memory and core resources (`QuotaLimits.others`,
`QuotaUsage.others`: `limits.hygon.com/dcumem`, `limits.hygon.com/dcucores`, ...), as HAMi's
QuotaManager keys them. The hard limit of a namespace is the tightest over its ResourceQuotas
(`quota_store.QuotaCache`, memory already x the memory factor, so in MiB), and its usage is the pod
store's (`pod_store.PodStore.used`: every non-terminal pod, Pending included, its allocation's real MiB
once chosen, else its request): the numbers the webhook and the extender check. Each row names its
vendor (`nvidia`, or the vendor's family).

Listed: namespaces with a GPU or vendor limit, and namespaces using GPU or vendor memory or cores. A
namespace gets NVIDIA's two rows when it has an NVIDIA limit or usage, or nothing of any vendor (so
`-n NS` always answers), and a row per vendor resource it has a limit of or uses. NVIDIA's cores are in
percent of a GPU; a vendor's cores in its own resource's unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami_control.quota import QuotaLimits, QuotaUsage, quota_keys
from hami_control.status.snapshot import Snapshot, name_of, namespace_of
from hami_control.status.table import bar, columns
from hami_control.status.vendors import NVIDIA_FAMILY


@dataclass(frozen=True, slots=True)
class QuotaRow:
    namespace: str
    resource: str
    """The ResourceQuota key (`limits.nvidia.com/gpumem`)."""
    unit: str
    """`MiB`, `%`, or "" (a vendor's cores, in its resource's own unit)."""
    used: int
    hard: int | None
    """None: no limit."""
    quotas: tuple[str, ...]
    """The ResourceQuotas of the namespace that set this key."""
    vendor: str = NVIDIA_FAMILY
    """`nvidia`, or the family of the vendor whose resource the key names."""


@dataclass(frozen=True, slots=True)
class _VendorKey:
    key: str
    resource: str
    unit: str
    vendor: str


def _vendor_keys(snapshot: Snapshot) -> list[_VendorKey]:
    """The other vendors' quota keys, in registry order (memory, then cores; each resource once)."""
    out: dict[str, _VendorKey] = {}
    for vendor in snapshot.config.registry.others:
        names = vendor.names
        for resource, unit in ((names.memory, "MiB"), (names.cores, "")):
            if resource and resource not in out:
                out[resource] = _VendorKey(f"limits.{resource}", resource, unit, names.family)
    return list(out.values())


def _namespaces(snapshot: Snapshot) -> set[str]:
    namespaces = set(snapshot.quotas.namespaces())
    for record in snapshot.pods.pods():
        usage = record.usage
        if usage.memory or usage.cores or any(amount for _, amount in usage.others):
            namespaces.add(record.namespace or "default")
    return namespaces


def _vendor_rows(
    namespace: str,
    keys: list[_VendorKey],
    limits: QuotaLimits,
    used: QuotaUsage,
    setting: dict[tuple[str, str], list[str]],
) -> list[QuotaRow]:
    rows = []
    for k in keys:
        hard, value = limits.other(k.resource), used.other(k.resource)
        if hard is None and not value:
            continue
        quotas = tuple(sorted(setting.get((namespace, k.key), [])))
        rows.append(QuotaRow(namespace, k.key, k.unit, value, hard, quotas, k.vendor))
    return rows


def build_quota(snapshot: Snapshot, namespace: str | None = None) -> list[QuotaRow]:
    """NVIDIA's two rows (memory, cores) and the vendors' rows per namespace listed (see the module
    docstring), sorted by namespace."""
    memory_key, cores_key = quota_keys(snapshot.config.requests.names)
    vendor_keys = _vendor_keys(snapshot)
    keys = {memory_key, cores_key} | {k.key for k in vendor_keys}
    setting: dict[tuple[str, str], list[str]] = {}
    for obj in snapshot.quota_objects:
        hard = (obj.get("spec") or {}).get("hard") or {}
        for key in keys & set(hard):
            setting.setdefault((namespace_of(obj), key), []).append(name_of(obj))
    wanted = {namespace} if namespace is not None else _namespaces(snapshot)
    rows: list[QuotaRow] = []
    for ns in sorted(wanted):
        limits = snapshot.quota_view.limits(ns)
        used = snapshot.quota_view.used(ns)
        vendors = _vendor_rows(ns, vendor_keys, limits, used, setting)
        nvidia = limits.memory is not None or limits.cores is not None or used.memory or used.cores
        if nvidia or not vendors:
            for key, unit, value, hard in (
                (memory_key, "MiB", used.memory, limits.memory),
                (cores_key, "%", used.cores, limits.cores),
            ):
                rows.append(QuotaRow(ns, key, unit, value, hard, tuple(sorted(setting.get((ns, key), [])))))
        rows += vendors
    return rows


def _amount(value: int, unit: str) -> str:
    return f"{value} {unit}" if unit else str(value)


def render_quota(rows: list[QuotaRow]) -> str:
    if not rows:
        return "No namespace has a GPU quota or uses GPUs."
    header = ["NAMESPACE", "RESOURCE", "USED", "HARD", "", "QUOTA", "VENDOR"]
    table = []
    for r in rows:
        hard = "-" if r.hard is None else _amount(r.hard, r.unit)
        shown = bar(r.used, r.hard) if r.hard is not None else ""
        quotas = ",".join(r.quotas) or "-"
        table.append([r.namespace, r.resource, _amount(r.used, r.unit), hard, shown, quotas, r.vendor])
    return columns(header, table)


def quota_dict(rows: list[QuotaRow]) -> dict[str, Any]:
    namespaces: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = namespaces.setdefault(r.namespace, {"namespace": r.namespace, "resources": []})
        entry["resources"].append(
            {
                "key": r.resource,
                "vendor": r.vendor,
                "unit": r.unit,
                "used": r.used,
                "hard": r.hard,
                "quotas": list(r.quotas),
            }
        )
    return {"apiVersion": "hami.io/v1", "kind": "GPUQuota", "namespaces": list(namespaces.values())}


__all__ = ["QuotaRow", "build_quota", "quota_dict", "render_quota"]
