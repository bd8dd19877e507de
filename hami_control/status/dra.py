"""GPUs of DRA nodes and what claims consume, from plain JSON (resource.k8s.io/v1). Pure.

Covered: our driver's ResourceSlices (`hami_api.dra.DRIVER`; one device per GPU with the `uuid`, `minor`
and `productName` attributes and the `memory` capacity in bytes; a tainted device counts as unhealthy),
and allocated ResourceClaims' results for that driver: each result is one share of its device, taking
its `consumedCapacity` (memory in bytes, cores in percent), or the whole GPU when it has none (a
cluster without consumable capacity). A claim's pods are its `status.reservedFor` entries of resource
`pods`. Not covered: other drivers, partitionable devices, and claims whose slices are gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami_api import dra
from hami_api.errors import QuantityError
from hami_api.quantity import quantity_value
from hami_api.types import GPUInfo
from hami_control.status.snapshot import Json, name_of, namespace_of


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _quantity(value: Any) -> int | None:
    if isinstance(value, Mapping):  # a device capacity: {"value": "80Gi"}
        value = value.get("value")
    if value is None:
        return None
    try:
        return quantity_value(str(value))
    except QuantityError:
        return None


def _attribute(attrs: Mapping[str, Any], name: str) -> Any:
    value = _mapping(attrs.get(name) or attrs.get(dra.qualified(name)))
    for kind in ("string", "int", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


@dataclass(frozen=True, slots=True)
class DraGPU:
    """One GPU a DRA node publishes: `key` is `<pool>/<device>`, as claim results name it."""

    key: str
    node: str
    info: GPUInfo


def dra_gpus(slices: Iterable[Json]) -> dict[str, DraGPU]:
    """Our driver's devices by `<pool>/<device>`, as GPUInfo (count 0: a DRA GPU has no fixed slots)."""
    out: dict[str, DraGPU] = {}
    for item in slices:
        spec = _mapping(item.get("spec"))
        if spec.get("driver") != dra.DRIVER:
            continue
        node = str(spec.get("nodeName") or "")
        pool = str(_mapping(spec.get("pool")).get("name") or "")
        for device in map(_mapping, _list(spec.get("devices"))):
            name = str(device.get("name") or "")
            attrs = _mapping(device.get("attributes"))
            memory = _quantity(_mapping(device.get("capacity")).get(dra.CAPACITY_MEMORY))
            minor = _attribute(attrs, dra.ATTR_MINOR)
            info = GPUInfo(
                id=str(_attribute(attrs, dra.ATTR_UUID) or name),
                index=int(minor) if isinstance(minor, int) else 0,
                count=0,
                devmem=memory // dra.MIB if memory is not None else 0,
                devcore=100,
                type=str(_attribute(attrs, dra.ATTR_PRODUCT_NAME) or "?"),
                numa=0,
                mode="hami-core",
                health=not _list(device.get("taints")),
            )
            out[f"{pool}/{name}"] = DraGPU(f"{pool}/{name}", node, info)
    return out


@dataclass(frozen=True, slots=True)
class ClaimShare:
    """One allocated result of our driver: the claim, its device, MiB and cores, and the pods it serves."""

    namespace: str
    claim: str
    device: str
    """`<pool>/<device>`."""
    memory: int
    cores: int
    pods: tuple[str, ...]
    """`namespace/name` of the pods in `status.reservedFor`."""


def claim_shares(claims: Iterable[Json], gpus: Mapping[str, DraGPU]) -> list[ClaimShare]:
    """Every allocated result of our driver on a known device (see the module docstring)."""
    out: list[ClaimShare] = []
    for claim in claims:
        status = _mapping(claim.get("status"))
        namespace = namespace_of(claim)
        pods = tuple(
            f"{namespace}/{ref.get('name')}"
            for ref in map(_mapping, _list(status.get("reservedFor")))
            if ref.get("resource") == "pods" and ref.get("name")
        )
        results = _mapping(_mapping(status.get("allocation")).get("devices")).get("results")
        for result in map(_mapping, _list(results)):
            key = f"{result.get('pool')}/{result.get('device')}"
            gpu = gpus.get(key)
            if result.get("driver") != dra.DRIVER or gpu is None:
                continue
            consumed = _mapping(result.get("consumedCapacity"))
            memory = _quantity(consumed.get(dra.CAPACITY_MEMORY))
            cores = _quantity(consumed.get(dra.CAPACITY_CORES))
            out.append(
                ClaimShare(
                    namespace,
                    name_of(claim),
                    key,
                    memory // dra.MIB if memory is not None else gpu.info.devmem,
                    cores if cores is not None else gpu.info.devcore,
                    pods,
                )
            )
    return out


def pod_claim_names(pod: Json) -> list[str]:
    """The ResourceClaims a pod uses: those generated for it (`status.resourceClaimStatuses`) and those it
    names (`spec.resourceClaims[].resourceClaimName`)."""
    status = _mapping(pod.get("status"))
    spec = _mapping(pod.get("spec"))
    names = [
        str(s.get("resourceClaimName"))
        for s in map(_mapping, _list(status.get("resourceClaimStatuses")))
        if s.get("resourceClaimName")
    ]
    names += [
        str(c.get("resourceClaimName"))
        for c in map(_mapping, _list(spec.get("resourceClaims")))
        if c.get("resourceClaimName")
    ]
    return names


__all__ = ["ClaimShare", "DraGPU", "claim_shares", "dra_gpus", "pod_claim_names"]
