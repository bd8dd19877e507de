"""HAMi resource names and how a container's limits/requests become a GPU request.

Input is plain Kubernetes JSON (`pod["spec"]["containers"][i]["resources"]["limits"]`). Each resource is
read from `limits`, falling back to `requests`, one resource at a time, as HAMi does. The values are
then normalised the way HAMi's scheduler does it (pkg/device/nvidia/device.go `GenerateResourceRequests`):

- no `nvidia.com/gpu` (or 0): the container asks for no GPU -> None;
- `memreq` = gpumem x memoryFactor (MiB);
- gpumem-percentage: 101 is HAMi's "unset" marker, other values above 100 are clamped to 100 (also those
  past Go's int32, up to int64 like HAMi's `AsInt64`), values <= 0 are ignored (treated as unset, so the
  default below applies), as HAMi's `GenerateResourceRequests` does. The webhook denies a percentage
  outside 0..100 before a pod gets here, as HAMi's `validateMemoryPercentage` does;
- neither memory nor percentage: `defaultMemory` MiB, or 100 % when that is 0 (a whole GPU's memory);
- cores = gpucores or `defaultCores`, clamped to 100.

Where HAMi silently ignores a value it cannot read (a fraction, "100m"), this raises `RequestError`
naming the container, the resource and the value; the API server already refuses such values for
extended resources, so only hand-made pods reach that path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api.errors import QuantityError, RequestError
from hami_api.quantity import parse_quantity, quantity_value

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
UNSET_PERCENTAGE = 101
"""HAMi's wire marker for "no gpumem-percentage" (its MemPercentagereq); None in `ContainerRequest`."""


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The resource names HAMi reads; configurable (NvidiaConfig's resource*Name keys)."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"

    @property
    def all(self) -> frozenset[str]:
        """Every HAMi resource name; only `count` is advertised to the kubelet."""
        return frozenset((self.count, self.memory, self.memory_percentage, self.cores, self.priority))

    @property
    def sharing(self) -> tuple[str, str, str]:
        """The names that, without `count`, make the webhook add `count = defaultGPUNum`."""
        return (self.memory, self.memory_percentage, self.cores)


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """HAMi's request defaults (values.yaml / NvidiaConfig)."""

    default_memory: int = 0
    """MiB given to a container that names neither gpumem nor gpumem-percentage; 0 means 100 %."""
    default_cores: int = 0
    default_gpu_num: int = 1
    """What the webhook adds as `nvidia.com/gpu` when only gpumem/gpucores are set (not applied here)."""
    memory_factor: int = 1

    def __post_init__(self) -> None:
        for name in ("default_memory", "default_cores", "default_gpu_num"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32_MAX:
                raise ValueError(f"{name} must be an integer in 0..{_INT32_MAX}, got {value!r}")
        factor = self.memory_factor
        if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= _INT32_MAX:
            raise ValueError(f"memory_factor must be an integer >= 1, got {factor!r}")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """A container's normalised ask: `nums` GPUs, each with `memreq` MiB (or `mem_percentage` % of the
    GPU when memreq is 0) and `coresreq` % of its compute."""

    nums: int
    memreq: int
    mem_percentage: int | None
    coresreq: int

    def memory_on(self, total_mem: int) -> int:
        """MiB this request takes on a GPU with `total_mem` MiB (HAMi's Fit: memreq, else a percentage
        of the GPU, truncated)."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage is not None:
            return total_mem * self.mem_percentage // 100
        return 0

    @property
    def wire_mem_percentage(self) -> int:
        """The percentage as HAMi carries it, with 101 for unset."""
        return UNSET_PERCENTAGE if self.mem_percentage is None else self.mem_percentage


# --- reading a container -----------------------------------------------------------------------------


def _section(container: Mapping[str, Any], name: str, section: str, init: bool) -> Mapping[str, Any]:
    resources = container.get("resources")
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise RequestError(name, "resources", repr(resources), "is not an object", init)
    values = resources.get(section)
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise RequestError(name, f"resources.{section}", repr(values), "is not an object", init)
    return values


def _container_name(container: Any, init: bool) -> str:
    if not isinstance(container, Mapping):
        raise RequestError("?", "container", repr(container), "is not an object", init)
    name = container.get("name", "")
    return name if isinstance(name, str) else repr(name)


def container_resource(container: Mapping[str, Any], resource: str, init: bool = False) -> Any | None:
    """The raw value of `resource` from limits, else requests, else None."""
    name = _container_name(container, init)
    for section in ("limits", "requests"):
        values = _section(container, name, section, init)
        if resource in values:
            return values[resource]
    return None


def container_has_hami_resource(container: Mapping[str, Any], names: ResourceNames = ResourceNames()) -> bool:
    """Whether the container names any HAMi resource (count, memory, percentage, cores or priority)."""
    return any(container_resource(container, r) is not None for r in sorted(names.all))


def _whole(
    name: str, resource: str, raw: Any, init: bool, *, signed: bool = False, limit: int = _INT32_MAX
) -> int:
    """A whole number up to `limit` (Go's int32 by default), non-negative unless `signed`, or RequestError."""
    shown = raw if isinstance(raw, str) else repr(raw)
    try:
        value = parse_quantity(raw)
    except QuantityError as err:
        raise RequestError(name, resource, shown, f"is not a quantity ({err.reason})", init) from None
    if value < 0 and not signed:
        raise RequestError(name, resource, shown, "must not be negative", init)
    if value.denominator != 1:
        raise RequestError(name, resource, shown, "must be a whole number", init)
    if abs(value) > limit:
        raise RequestError(name, resource, shown, f"is above {limit}", init)
    return value.numerator


def _percentage(value: int | None) -> int | None:
    """HAMi's reading of gpumem-percentage: None (unset) for absent, <= 0 and its 101 marker; else at most
    100 (GenerateResourceRequests clamps with a logged error, ignores a non-positive one)."""
    if value is None or value <= 0 or value == UNSET_PERCENTAGE:
        return None
    return min(value, 100)


def container_request(
    container: Mapping[str, Any],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
    init: bool = False,
) -> ContainerRequest | None:
    """The container's normalised GPU request, or None when it asks for no GPU count."""
    name = _container_name(container, init)

    def read(resource: str) -> int | None:
        raw = container_resource(container, resource, init)
        return None if raw is None else _whole(name, resource, raw, init)

    nums = read(names.count)
    if not nums:
        return None
    memory, cores = read(names.memory), read(names.cores)
    raw_percentage = container_resource(container, names.memory_percentage, init)
    percentage = (
        None
        if raw_percentage is None
        else _whole(name, names.memory_percentage, raw_percentage, init, signed=True, limit=_INT64_MAX)
    )
    memreq = 0
    if memory is not None:
        memreq = memory * defaults.memory_factor
        if memreq > _INT32_MAX:
            raise RequestError(
                name, names.memory, str(memory), f"x memoryFactor {defaults.memory_factor} overflows", init
            )
    mem_percentage = _percentage(percentage)
    if mem_percentage is None and memreq == 0:
        if defaults.default_memory:
            memreq = defaults.default_memory
        else:
            mem_percentage = 100
    coresreq = min(defaults.default_cores if cores is None else cores, 100)
    return ContainerRequest(nums=nums, memreq=memreq, mem_percentage=mem_percentage, coresreq=coresreq)


def container_priority(container: Mapping[str, Any], names: ResourceNames = ResourceNames()) -> int | None:
    """`nvidia.com/priority` as the webhook reads it (Quantity.Value(), rounded up), or None."""
    raw = container_resource(container, names.priority)
    if raw is None:
        return None
    try:
        return quantity_value(raw)
    except QuantityError as err:
        shown = raw if isinstance(raw, str) else repr(raw)
        raise RequestError(_container_name(container, False), names.priority, shown, err.reason) from None


# --- reading a pod -------------------------------------------------------------------------------------


def pod_containers(pod: Mapping[str, Any]) -> tuple[tuple[Mapping[str, Any], bool], ...]:
    """(container, is_init) for every container, init containers first: the allocation annotation order."""
    spec = pod.get("spec")
    spec = {} if spec is None else spec
    if not isinstance(spec, Mapping):
        raise RequestError("?", "spec", repr(spec), "is not an object")
    out: list[tuple[Mapping[str, Any], bool]] = []
    for key, init in (("initContainers", True), ("containers", False)):
        containers = spec.get(key)
        containers = [] if containers is None else containers
        if not isinstance(containers, Sequence) or isinstance(containers, str):
            raise RequestError("?", f"spec.{key}", repr(containers), "is not a list", init)
        for container in containers:
            _container_name(container, init)
            out.append((container, init))
    return tuple(out)


def pod_container_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Container names in allocation order (init containers first)."""
    return tuple(_container_name(c, init) for c, init in pod_containers(pod))


def pod_requests(
    pod: Mapping[str, Any],
    names: ResourceNames = ResourceNames(),
    defaults: RequestDefaults = RequestDefaults(),
) -> tuple[ContainerRequest | None, ...]:
    """One entry per container, init containers first (HAMi's order), None where no GPU is asked."""
    return tuple(container_request(c, names, defaults, init) for c, init in pod_containers(pod))


def pod_has_hami_resource(pod: Mapping[str, Any], names: ResourceNames = ResourceNames()) -> bool:
    return any(container_has_hami_resource(c, names) for c, _ in pod_containers(pod))
