"""Namespace quotas for GPU memory and GPU cores, HAMi's way (`pkg/device/quota.go`), pure.

- Limits come from a ResourceQuota's `spec.hard`, and only from the keys `limits.<memory resource>` and
  `limits.<cores resource>` (`limits.nvidia.com/gpumem`, `limits.nvidia.com/gpucores`). Like HAMi,
  `requests.*` keys, plain `nvidia.com/gpumem` keys and the quota's scopes are ignored: kube-apiserver's own
  quota admission already enforces those, per container and without knowing GPU counts.
- The memory limit is in gpumem units, so it is multiplied by the memory factor, like requests are
  (HAMi compares `used + asked > limit x memoryFactor`); `QuotaLimits.memory` is therefore in MiB.
- Several ResourceQuotas in one namespace: each one must hold, so the smallest limit wins.
- A pod's usage is per-GPU value x GPU count, summed over its regular containers; init containers run one
  at a time before them, so the pod's peak is max(sum over regular containers, largest init container),
  computed for memory and for cores separately.
- A container that asks for memory only as a percentage (or for no memory, with `defaultMemory` 0) takes
  an amount that depends on the GPU chosen later; at admission HAMi counts it as 0 MiB, and so does this
  module. The scheduler extender counts the real MiB once a GPU is chosen (`allocation_quota_usage`).
- The other vendors (`hami_control.devices`) count the same way, per resource name (HAMi's QuotaManager
  keys its entries by the vendor's memory and core resource names): `limits.<vendor memory resource>`
  x the vendor's memory factor (when above 1) and `limits.<vendor core resource>`, against what the
  namespace's pods ask (`Memreq x Nums`, `Coresreq x Nums` per container, at admission) or hold (their
  vendor allocation annotations' memory and cores, once bound). They ride in `QuotaLimits.others` and
  `QuotaUsage.others`, (resource name, amount) pairs sorted by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hami_api.errors import QuantityError
from hami_api.quantity import quantity_value
from hami_api.resources import ContainerRequest, ResourceNames, container_request, pod_containers
from hami_api.types import PodAllocation
from hami_control.config import ControlConfig
from hami_control.devices.base import DeviceRequest, Vendor

Amounts = tuple[tuple[str, int], ...]
"""(resource name, amount) pairs sorted by name: the other vendors' dimensions."""


def _combine(a: Amounts, b: Amounts, op: Any) -> Amounts:
    if not b:
        return a
    if not a and op is _plus:
        return b
    merged = dict(a)
    for name, value in b:
        merged[name] = op(merged.get(name), value)
    return tuple(sorted((k, v) for k, v in merged.items() if v is not None))


def _plus(a: int | None, b: int) -> int:
    return (a or 0) + b


def _minus(a: int | None, b: int) -> int:
    return max(0, (a or 0) - b)


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A namespace's GPU limits: memory in MiB, cores in percent of a GPU; None = no limit; `others`:
    the other vendors' limits by resource name (memory already x the vendor's memory factor)."""

    memory: int | None = None
    cores: int | None = None
    others: Amounts = ()

    def tightest(self, other: QuotaLimits) -> QuotaLimits:
        """Both limits at once: the smaller of each, where either is set."""
        return QuotaLimits(
            _smaller(self.memory, other.memory),
            _smaller(self.cores, other.cores),
            _combine(self.others, other.others, _smaller),
        )

    @property
    def unlimited(self) -> bool:
        return self.memory is None and self.cores is None and not self.others

    def other(self, resource: str) -> int | None:
        return dict(self.others).get(resource)


def _smaller(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """GPU memory (MiB) and cores (percent of a GPU) that pods hold or ask for; `others`: the other
    vendors' memory and cores by resource name."""

    memory: int = 0
    cores: int = 0
    others: Amounts = ()

    def __add__(self, other: QuotaUsage) -> QuotaUsage:
        return QuotaUsage(
            self.memory + other.memory, self.cores + other.cores, _combine(self.others, other.others, _plus)
        )

    def __sub__(self, other: QuotaUsage) -> QuotaUsage:
        """The difference; the other vendors' amounts never go below 0."""
        return QuotaUsage(
            self.memory - other.memory, self.cores - other.cores, _combine(self.others, other.others, _minus)
        )

    def other(self, resource: str) -> int:
        return dict(self.others).get(resource, 0)


class QuotaView(Protocol):
    """What the webhook needs to know about a namespace, answered from watch caches.

    `limits`: the tightest `QuotaLimits` over the namespace's ResourceQuotas (`limits_from_resource_quotas`).
    `used`: the GPU memory and cores held by the namespace's non-terminal GPU pods, pending ones included
    (so a burst of creations cannot overshoot), not counting the pod being admitted.
    """

    def limits(self, namespace: str) -> QuotaLimits: ...

    def used(self, namespace: str) -> QuotaUsage: ...


class QuotaLimitError(ValueError):
    """A ResourceQuota hard limit that cannot be read (the API server validates them, so only hand-made
    objects get here). `quota` is namespace/name, `key` the spec.hard key, `value` the text."""

    def __init__(self, quota: str, key: str, value: str, reason: str) -> None:
        self.quota = quota
        self.key = key
        self.value = value
        self.reason = reason
        super().__init__(f"ResourceQuota {quota}: spec.hard[{key!r}] {value!r} {reason}")


# --- limits -------------------------------------------------------------------------------------------------


def quota_keys(names: ResourceNames) -> tuple[str, str]:
    """The spec.hard keys HAMi reads: (memory key, cores key)."""
    return f"limits.{names.memory}", f"limits.{names.cores}"


def limits_from_resource_quota(resource_quota: Mapping[str, Any], config: ControlConfig) -> QuotaLimits:
    """The GPU limits one ResourceQuota object sets (memory already x memory factor).

    Raises `QuotaLimitError` for a value that is not a non-negative quantity."""
    metadata = resource_quota.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    who = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    spec = resource_quota.get("spec")
    hard = spec.get("hard") if isinstance(spec, Mapping) else None
    if not isinstance(hard, Mapping):
        return QuotaLimits()
    memory_key, cores_key = quota_keys(config.requests.names)

    def read(key: str) -> int | None:
        if key not in hard:
            return None
        raw = hard[key]
        try:
            value = quantity_value(raw)
        except QuantityError as err:
            raise QuotaLimitError(who, key, str(raw), err.reason) from None
        if value < 0:
            raise QuotaLimitError(who, key, str(raw), "must not be negative")
        return value

    memory = read(memory_key)
    others: dict[str, int] = {}
    for vendor in config.registry.others:
        names = vendor.names
        for resource, factor in ((names.memory, names.memory_factor), (names.cores, 1)):
            value = read(f"limits.{resource}") if resource else None
            if value is not None:
                others[resource] = value * factor if factor > 1 else value
    return QuotaLimits(
        memory=None if memory is None else memory * config.requests.defaults.memory_factor,
        cores=read(cores_key),
        others=tuple(sorted(others.items())),
    )


def limits_from_resource_quotas(
    resource_quotas: Iterable[Mapping[str, Any]], config: ControlConfig
) -> QuotaLimits:
    """The namespace's limits over all its ResourceQuotas: every one must hold, so the smallest wins."""
    limits = QuotaLimits()
    for resource_quota in resource_quotas:
        limits = limits.tightest(limits_from_resource_quota(resource_quota, config))
    return limits


# --- usage --------------------------------------------------------------------------------------------------


def _peak(regular: QuotaUsage, inits: Iterable[QuotaUsage]) -> QuotaUsage:
    """max(sum of regular containers, largest init container), for memory and cores separately."""
    memory, cores = regular.memory, regular.cores
    for init in inits:
        memory, cores = max(memory, init.memory), max(cores, init.cores)
    return QuotaUsage(memory, cores)


def pod_quota_usage(pod: Mapping[str, Any], config: ControlConfig) -> QuotaUsage:
    """What a pod asks of its namespace's quota, from its resources (before GPUs are chosen).

    Raises `hami_api.errors.RequestError` for a resource value that cannot be read."""
    names, defaults = config.requests.names, config.requests.defaults
    return requests_quota_usage(
        (container_request(container, names, defaults, init), init) for container, init in pod_containers(pod)
    )


def requests_quota_usage(requests: Iterable[tuple[ContainerRequest | None, bool]]) -> QuotaUsage:
    """`pod_quota_usage` from already normalised requests: (request or None, is init container) per
    container. Per container: per-GPU memory and cores x GPU count."""
    regular = QuotaUsage()
    inits: list[QuotaUsage] = []
    for request, init in requests:
        if request is None:
            continue
        usage = QuotaUsage(request.memreq * request.nums, request.coresreq * request.nums)
        if init:
            inits.append(usage)
        else:
            regular += usage
    return _peak(regular, inits)


def allocation_quota_usage(allocation: PodAllocation, init_containers: int) -> QuotaUsage:
    """What a pod holds once its GPUs are chosen, from its allocation annotation (init containers' entries
    first, `init_containers` of them): the real MiB, percentages included."""
    if not init_containers:  # every container counts (the pods watch reads one a pod)
        memory = cores = 0
        for container in allocation:
            for s in container.devices:
                memory += s.usedmem
                cores += s.usedcores
        return QuotaUsage(memory, cores)
    regular = QuotaUsage()
    inits: list[QuotaUsage] = []
    for index, container in enumerate(allocation):
        usage = QuotaUsage(
            sum(s.usedmem for s in container.devices), sum(s.usedcores for s in container.devices)
        )
        if index < init_containers:
            inits.append(usage)
        else:
            regular += usage
    return _peak(regular, inits)


def vendor_requests_usage(
    requests: Sequence[Mapping[str, DeviceRequest]], inits: int, vendors: Sequence[Vendor]
) -> QuotaUsage:
    """What a pod asks of the other vendors' quotas (HAMi's fitResourceQuota): per vendor, Memreq x Nums
    and Coresreq x Nums per container, the regular containers summed, at least the largest init one.
    `requests`: one mapping (common word -> request) per container, init containers first."""
    return _vendor_usage(
        [
            {w: (r.memreq * r.nums, r.coresreq * r.nums) for w, r in container.items()}
            for container in requests
        ],
        inits,
        vendors,
    )


def vendor_allocation_usage(
    allocations: Mapping[str, PodAllocation], inits: int, vendors: Sequence[Vendor]
) -> QuotaUsage:
    """What a pod holds of the other vendors' quotas once its devices are chosen (HAMi's countPodDevices:
    the devices' memory and cores), init containers at their peak as for NVIDIA."""
    containers = max((len(a) for a in allocations.values()), default=0)
    per: list[dict[str, tuple[int, int]]] = [{} for _ in range(containers)]
    for word, allocation in allocations.items():
        for i, container in enumerate(allocation):
            memory = sum(s.usedmem for s in container.devices)
            cores = sum(s.usedcores for s in container.devices)
            if memory or cores:
                per[i][word] = (memory, cores)
    return _vendor_usage(per, inits, vendors)


def _vendor_usage(
    per_container: Sequence[Mapping[str, tuple[int, int]]], inits: int, vendors: Sequence[Vendor]
) -> QuotaUsage:
    by_word = {v.names.common_word: v for v in vendors}
    regular: dict[str, int] = {}
    peak: dict[str, int] = {}
    for index, container in enumerate(per_container):
        for word, (memory, cores) in container.items():
            vendor = by_word.get(word)
            if vendor is None:
                continue
            for resource, amount in ((vendor.names.memory, memory), (vendor.names.cores, cores)):
                if not resource or amount <= 0:
                    continue
                if index < inits:
                    peak[resource] = max(peak.get(resource, 0), amount)
                else:
                    regular[resource] = regular.get(resource, 0) + amount
    totals = {r: max(regular.get(r, 0), peak.get(r, 0)) for r in {*regular, *peak}}
    return QuotaUsage(others=tuple(sorted(totals.items())))


# --- the check ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaDenial:
    """Why a pod does not fit its namespace's quota; `message` is shown to the user as is."""

    message: str


def check_quota(namespace: str, usage_of_pod: QuotaUsage, view: QuotaView) -> QuotaDenial | None:
    """None when the pod fits, else a denial naming the namespace, the used amount, the limit and the ask.

    Only the dimensions the pod asks for are checked: a pod asking no GPU memory passes a memory quota that
    is already exceeded (HAMi would refuse it; it cannot make things worse). Used + ask may reach the limit
    exactly."""
    if usage_of_pod.memory <= 0 and usage_of_pod.cores <= 0 and not usage_of_pod.others:
        return None
    limits = view.limits(namespace)
    if limits.unlimited:
        return None
    used = view.used(namespace)
    problems: list[str] = []
    if (
        limits.memory is not None
        and usage_of_pod.memory > 0
        and used.memory + usage_of_pod.memory > limits.memory
    ):
        problems.append(
            f"GPU memory quota exceeded (used {used.memory} / limit {limits.memory} MiB, "
            f"this pod asks {usage_of_pod.memory})"
        )
    if limits.cores is not None and usage_of_pod.cores > 0 and used.cores + usage_of_pod.cores > limits.cores:
        problems.append(
            f"GPU cores quota exceeded (used {used.cores} / limit {limits.cores} %, "
            f"this pod asks {usage_of_pod.cores})"
        )
    for resource, asked in usage_of_pod.others:
        limit = limits.other(resource)
        held = used.other(resource)
        if limit is not None and asked > 0 and held + asked > limit:
            problems.append(f"{resource} quota exceeded (used {held} / limit {limit}, this pod asks {asked})")
    if not problems:
        return None
    return QuotaDenial(f"namespace {namespace}: " + "; ".join(problems))


__all__ = [
    "QuotaDenial",
    "QuotaLimitError",
    "QuotaLimits",
    "QuotaUsage",
    "QuotaView",
    "allocation_quota_usage",
    "check_quota",
    "limits_from_resource_quota",
    "limits_from_resource_quotas",
    "pod_quota_usage",
    "quota_keys",
    "requests_quota_usage",
    "vendor_allocation_usage",
    "vendor_requests_usage",
]
