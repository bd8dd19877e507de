"""One pod on one node for the vendors of the registry other than NVIDIA: HAMi's per-node scoring
(pkg/scheduler/score.go `scoreNode`, `fitInDevices`, `allocateInitContainers`, `allocateAppContainers`;
pkg/scheduler/policy `ComputeScore`, `DeviceUsageList.Less`), pure.

- The node's devices of every vendor form one list in inventory order (vendors in registry order).
- Init containers are each placed on a fresh copy of the node (they run one after the other); regular
  containers one after the other on one copy (they run together).
- Per container, every device is scored once for the container's requests (`device_score`: HAMi's
  ComputeScore, the request's terms counted where the request's Type equals the device's Type), then
  per request (vendors in registry order; HAMi iterates a Go map, in random order) the list is sorted by
  the GPU policy (`sort_devices`: HAMi's Less, stable like Go's insertion sort up to 12 devices), the
  devices whose Type contains the request's Type (case-insensitive, HAMi's getNodeResources) are
  handed to the vendor's Fit, and what it picked is added to the copy (`Vendor.add_usage`).
- More devices asked than the node has of the type: "NodeInsufficientDevice" (HAMi checks it before Fit).
- The result per vendor is one `ContainerAllocation` per container (init containers first), empty where
  the container asks nothing of it. HAMi pads only under the device Types present on the node, so a
  vendor whose device Type differs from its common word (AMD) gets entries for its own containers only,
  and a node holding two vendors gets an annotation of empty entries for the one the pod does not ask;
  here every vendor the pod asks gets one entry per container and the others none (see docs/vendors.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hami_api.types import ContainerAllocation, GPUPolicy, PodAllocation, ScoringWeights
from hami_control.devices.base import DeviceRequest, FitContext, Picked, Unfit, Vendor
from hami_control.devices.standard import NODE_INSUFFICIENT_DEVICE, UNSET_PERCENTAGE
from hami_control.usage import GPUUsage

DEFAULT_WEIGHTS = ScoringWeights()


@dataclass(frozen=True, slots=True)
class VendorFit:
    """The devices chosen per common word (one entry per container), what the vendors recorded beside
    them (`Picked.custom` per container), and the node's usage before the pod (HAMi's default score
    input) with the pod's devices added (`after`)."""

    allocations: Mapping[str, PodAllocation]
    custom: Mapping[str, tuple[tuple[Mapping[str, Any], ...], ...]] = field(default_factory=dict)
    after: tuple[GPUUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class VendorUnfit:
    """Why the pod does not fit: the text HAMi's filter reports for the node, and the container."""

    message: str
    container: int = 0


def device_score(device: GPUUsage, requests: Mapping[str, DeviceRequest], weights: ScoringWeights) -> float:
    """HAMi's ComputeScore: 10 x (wSlot (n+Used)/Count + wCore (cores+Usedcores)/Totalcore + wMem
    (mem+Usedmem)/Totalmem), the request's terms counted for requests whose Type equals the device's;
    0 for a device without count, cores or memory."""
    info = device.info
    if info.count == 0 or info.devcore == 0 or info.devmem == 0:
        return 0.0
    n = cores = mem = 0
    for request in requests.values():
        if request.type != info.type:
            continue
        n += 1
        cores += request.coresreq
        if request.mem_percentage not in (0, UNSET_PERCENTAGE):
            product = info.devmem * request.mem_percentage
            mem += product // 100 if product >= 0 else -(-product // 100)  # Go truncates toward zero
        else:
            mem += request.memreq
    return 10.0 * (
        weights.slot * (n + device.used) / info.count
        + weights.core * (cores + device.usedcores) / info.devcore
        + weights.memory * (mem + device.usedmem) / info.devmem
    )


_SORT_KEYS = (GPUPolicy.BINPACK, GPUPolicy.SPREAD, GPUPolicy.NUMA)


def sort_devices(
    devices: Sequence[GPUUsage], scores: Mapping[str, float], policy: Sequence[GPUPolicy]
) -> list[GPUUsage]:
    """HAMi's DeviceUsageList.Less (no NUMA binding for these vendors): one policy: mutex = busiest
    first, binpack = score ascending, spread (and anything else) = descending, NUMA breaking ties; a
    chain (several policies, or `numa` alone): its binpack/spread/numa keys in order (spread when none),
    then the device index. Stable."""
    if len(policy) <= 1 and tuple(policy) != (GPUPolicy.NUMA,):
        single = policy[0] if policy else GPUPolicy.SPREAD
        if single is GPUPolicy.MUTEX:
            return sorted(devices, key=lambda d: (-d.used, d.info.numa))
        if single is GPUPolicy.BINPACK:
            return sorted(devices, key=lambda d: (scores[d.id], d.info.numa))
        return sorted(devices, key=lambda d: (-scores[d.id], d.info.numa))
    chain = [p for p in policy if p in _SORT_KEYS] or [GPUPolicy.SPREAD]

    def key(device: GPUUsage) -> tuple[float, ...]:
        parts: list[float] = []
        for p in dict.fromkeys(chain):
            if p is GPUPolicy.BINPACK:
                parts.append(scores[device.id])
            elif p is GPUPolicy.SPREAD:
                parts.append(-scores[device.id])
            else:
                parts.append(device.info.numa)
        parts.append(device.info.index)
        return tuple(parts)

    return sorted(devices, key=key)


def _fit_container(
    node: dict[str, GPUUsage],
    *,
    order: Sequence[str],
    requests: Mapping[str, DeviceRequest],
    vendors: Mapping[str, Vendor],
    context: FitContext,
    weights: ScoringWeights,
    chosen: dict[str, list[ContainerAllocation]],
    custom: dict[str, list[tuple[Mapping[str, Any], ...]]],
) -> str | None:
    """HAMi's fitInDevices for one container on `node` (updated in place); None when it fits."""
    scores = {device_id: device_score(node[device_id], requests, weights) for device_id in order}
    for word, request in requests.items():
        vendor = vendors.get(word)
        if vendor is None:
            return "Device type not found"
        ranked = sort_devices([node[i] for i in order], scores, context.policy)
        wanted = request.type.lower()
        typed = [d for d in ranked if wanted in d.info.type.lower()]
        if request.nums > len(typed):
            return NODE_INSUFFICIENT_DEVICE
        allocated = {w: PodAllocation(tuple(entries)) for w, entries in chosen.items()}
        outcome = vendor.fit(typed, request, replace(context, allocated=allocated))
        if isinstance(outcome, Unfit):
            return outcome.message
        assert isinstance(outcome, Picked)
        for i, picked in enumerate(outcome.slices):
            device = node.get(picked.uuid)
            if device is None:
                return f"Device with UUID {picked.uuid!r} not found on node after Fit"
            extra = outcome.custom[i] if i < len(outcome.custom) else None
            node[picked.uuid] = vendor.add_usage(device, picked, extra)
        chosen.setdefault(word, []).append(ContainerAllocation(outcome.slices))
        custom.setdefault(word, []).append(tuple(outcome.custom))
    return None


def fit_vendor_pod(
    devices: Sequence[GPUUsage],
    requests: Sequence[Mapping[str, DeviceRequest]],
    *,
    inits: int,
    vendors: Mapping[str, Vendor],
    context: FitContext,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
) -> VendorFit | VendorUnfit:
    """Fit a pod's vendor requests (one mapping per container, init containers first; `inits` of them
    init containers) on a node's `devices` (every non-NVIDIA vendor's, inventory order). See the
    module docstring."""
    short = too_few(devices, requests)
    if short is not None:
        return VendorUnfit(NODE_INSUFFICIENT_DEVICE, short)
    order = [d.id for d in devices]
    base = {d.id: d for d in devices}
    asked = [w for w in vendors if any(w in r for r in requests)]
    chosen: dict[str, list[ContainerAllocation]] = {}
    custom: dict[str, list[tuple[Mapping[str, Any], ...]]] = {}
    peak = dict(base)
    app = dict(base)
    for index, container in enumerate(requests):
        init = index < inits
        if container:
            node = dict(base) if init else app
            reason = _fit_container(
                node,
                order=order,
                requests=container,
                vendors=vendors,
                context=context,
                weights=weights,
                chosen=chosen,
                custom=custom,
            )
            if reason is not None:
                return VendorUnfit(reason, index)
            if init and node != base:
                for device_id, device in node.items():
                    if device is not base[device_id]:
                        peak[device_id] = _peak(peak[device_id], device)
        for word in asked:
            entries = chosen.setdefault(word, [])
            if len(entries) == index:
                entries.append(ContainerAllocation())
                custom.setdefault(word, []).append(())
    after = tuple(_peak(app[i], peak[i]) if peak[i] is not base[i] else app[i] for i in order)
    return VendorFit(
        {w: PodAllocation(tuple(chosen[w])) for w in asked},
        {w: tuple(custom.get(w, ())) for w in asked},
        after,
    )


def too_few(devices: Sequence[GPUUsage], requests: Sequence[Mapping[str, DeviceRequest]]) -> int | None:
    """The first container asking more devices of a type than the node has (HAMi's NodeInsufficientDevice,
    checked before anything else is computed) when no earlier container asks anything (so nothing else
    could fail first), None otherwise: most nodes of a mixed cluster have none of the type, and this
    costs them one pass over their device types."""
    types = [d.info.type.lower() for d in devices]
    counted: dict[str, int] = {}
    for index, container in enumerate(requests):
        for request in container.values():
            wanted = request.type.lower()
            have = counted.get(wanted)
            if have is None:
                have = counted[wanted] = sum(1 for t in types if wanted in t)
            if request.nums > have:
                return index if not any(requests[:index]) else None
    return None


def _peak(a: GPUUsage, b: GPUUsage) -> GPUUsage:
    """HAMi's applyPeakUsage: each counter at the larger of the two."""
    return replace(
        a,
        used=max(a.used, b.used),
        usedmem=max(a.usedmem, b.usedmem),
        usedcores=max(a.usedcores, b.usedcores),
    )


__all__ = ["VendorFit", "VendorUnfit", "device_score", "fit_vendor_pod", "sort_devices", "too_few"]
