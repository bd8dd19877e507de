"""The cluster as hami-control sees it, built from plain JSON lists by hami-control's own stores. Pure.

Nodes go through `gpu_sinks.GPUNodeSink` into `cache.ClusterCache` (the register annotation, the cordon
annotation, `status.allocatable`; and the devices of every other vendor of the config's registry, as
hami-control builds its own cache: `ClusterCache(names, registry.vendors)`), pods into
`pod_store.PodStore` (the allocation annotations, NVIDIA's and each vendor's, reduced to each pod's
footprint, the namespaces' quota usage), ResourceQuotas into `quota_store.QuotaCache`: so every number
shown is the number the extender and the webhook work with. DRA ResourceSlices and ResourceClaims are
kept as they are for `dra`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_api.annotations import NODE_REGISTER
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.gpu_sinks import GPUNodeSink
from hami_control.pod_store import PodStore
from hami_control.quota_store import ClusterQuotaView, QuotaCache
from hami_control.status.vendors import VendorFamilies
from hami_kube.client import JSONDict
from hami_kube.reflector import replace_all

Json = Mapping[str, Any]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def meta(obj: Json) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata"))


def name_of(obj: Json) -> str:
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Json) -> str:
    return str(meta(obj).get("namespace") or "default")


def annotations_of(obj: Json) -> Mapping[str, Any]:
    return _mapping(meta(obj).get("annotations"))


@dataclass
class Snapshot:
    """One read of the cluster. `nodes` keeps every Node (by name) for what the stores do not keep (a
    node without GPUs, the raw annotations); `quota_objects` the ResourceQuotas for their names."""

    config: ControlConfig
    gpus: ClusterCache
    pods: PodStore
    quotas: QuotaCache
    quota_view: ClusterQuotaView
    nodes: dict[str, JSONDict] = field(default_factory=dict)
    quota_objects: tuple[JSONDict, ...] = ()
    slices: tuple[JSONDict, ...] = ()
    claims: tuple[JSONDict, ...] = ()
    pod_objects: tuple[JSONDict, ...] = ()
    """The pods as listed: for what the stores do not keep (container names, requests of NVIDIA's own
    resources, which kube-scheduler alone places)."""

    @staticmethod
    def of(  # noqa: PLR0917 (the lists of one read)
        config: ControlConfig,
        nodes: Iterable[JSONDict],
        pods: Sequence[JSONDict],
        quotas: Sequence[JSONDict] = (),
        slices: Iterable[JSONDict] = (),
        claims: Iterable[JSONDict] = (),
    ) -> Snapshot:
        """Feed the lists to hami-control's stores, as its reflectors do after their first list."""
        listed = list(nodes)
        gpus = ClusterCache(config.requests.names, config.registry.vendors)
        GPUNodeSink(gpus).replace(listed)
        store = PodStore(config, gpus)
        replace_all(store, pods)
        quota_cache = QuotaCache(config)
        replace_all(quota_cache, quotas)
        return Snapshot(
            config,
            gpus,
            store,
            quota_cache,
            ClusterQuotaView(store, quota_cache),
            {name_of(n): n for n in listed if name_of(n)},
            tuple(quotas),
            tuple(slices),
            tuple(claims),
            tuple(pods),
        )

    @functools.cached_property
    def families(self) -> VendorFamilies:
        """The vendor of each device (`status.vendors`), for the config's registry."""
        return VendorFamilies(self.config.registry.vendors)

    @functools.cached_property
    def pods_by_uid(self) -> dict[str, JSONDict]:
        """The listed pods by `metadata.uid` (those without one left out)."""
        return {str(meta(p).get("uid")): p for p in self.pod_objects if meta(p).get("uid")}

    def has_register(self, node: str) -> bool:
        """Whether the node carries hami-node's register annotation (a node without it has no HAMi GPUs)."""
        obj = self.nodes.get(node)
        return obj is not None and NODE_REGISTER in annotations_of(obj)


__all__ = ["Json", "Snapshot", "annotations_of", "meta", "name_of", "namespace_of"]
