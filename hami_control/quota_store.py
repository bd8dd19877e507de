"""The ResourceQuota cache (the namespaces' GPU limits, from a watch) and the quota view the webhook and
the extender read: limits from it, usage from the pod store (`pod_store.PodStore`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami_control.config import ControlConfig
from hami_control.pod_store import Admission, PodKey, PodStore
from hami_control.quota import (
    QuotaLimitError,
    QuotaLimits,
    QuotaUsage,
    limits_from_resource_quota,
)
from hami_kube.client import JSONDict
from hami_kube.reflector import replace_all

log = logging.getLogger(__name__)


class QuotaCache:
    """Each namespace's GPU limits, the tightest over its ResourceQuotas (recomputed per event for that
    namespace only). A quota whose GPU values do not parse is logged and left out. A `WatchSink`."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self._quotas: dict[PodKey, QuotaLimits] = {}
        self._limits: dict[str, QuotaLimits] = {}
        self._pages: list[JSONDict] = []

    def limits(self, namespace: str) -> QuotaLimits:
        return self._limits.get(namespace, _UNLIMITED)

    def namespaces(self) -> Iterable[str]:
        """The namespaces with a GPU limit."""
        return list(self._limits)

    def __len__(self) -> int:
        return len(self._quotas)

    def _limits_of(self, obj: Mapping[str, Any]) -> QuotaLimits:
        try:
            return limits_from_resource_quota(obj, self.config)
        except QuotaLimitError as err:
            log.warning("%s; this quota's GPU limits are ignored", err)
            return _UNLIMITED

    def _recompute(self, namespace: str) -> None:
        limits = _UNLIMITED
        for (ns, _name), quota in self._quotas.items():
            if ns == namespace:
                limits = limits.tightest(quota)
        if limits.unlimited:
            self._limits.pop(namespace, None)
        else:
            self._limits[namespace] = limits

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._pages = []

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._pages.extend(items)  # ResourceQuotas are few

    def end_replace(self) -> None:
        items, self._pages = self._pages, []
        self._quotas = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            self._quotas[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = self._limits_of(
                obj
            )
        self._limits = {}
        for namespace in {ns for ns, _ in self._quotas}:
            self._recompute(namespace)

    def apply(self, kind: str, obj: JSONDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == "DELETED":
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = self._limits_of(obj)
        self._recompute(key[0])


_UNLIMITED = QuotaLimits()


class ClusterQuotaView:
    """The `quota.QuotaView` the webhook reads: limits from the ResourceQuota cache, usage from the pod
    store (watched + admitted). With quota enforcement off it answers "unlimited" and watches no quotas."""

    def __init__(self, pods: PodStore, quotas: QuotaCache | None) -> None:
        self.pods = pods
        self.quotas = quotas

    def limits(self, namespace: str) -> QuotaLimits:
        return self.quotas.limits(namespace) if self.quotas is not None else _UNLIMITED

    def namespaces(self) -> Iterable[str]:
        """The namespaces with a GPU limit (for the quota metrics)."""
        return self.quotas.namespaces() if self.quotas is not None else ()

    def used(self, namespace: str) -> QuotaUsage:
        return self.pods.used(namespace)

    def assume(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> Admission | None:
        """Count an admitted pod's usage until the watch shows it (`PodStore.admit`)."""
        return self.pods.admit(namespace, name, generate_name, usage)

    def withdraw(self, admission: Admission) -> None:
        """Stop counting an admission taken back (`PodStore.withdraw`)."""
        self.pods.withdraw(admission)


__all__ = [
    "ClusterQuotaView",
    "QuotaCache",
]
