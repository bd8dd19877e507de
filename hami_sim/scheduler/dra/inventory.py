"""The devices of the cluster as the structured allocator reads them: ResourceSlices parsed once into
devices (attributes, capacities with their request policies, taints) and gathered per node into pools.
Pure: built from slice dicts, no I/O.

Upstream: `k8s.io/dynamic-resource-allocation/structured/internal/experimental/pools_experimental.go`
(v0.35.0, `GatherPools`): a slice is for a node when its `spec.nodeName` is the node, it has `allNodes`,
or its `nodeSelector` matches; per pool (driver, pool name) only the highest `generation` counts; a pool
whose slices do not add up to `resourceSliceCount` is incomplete (nothing is allocated from it), unless
a newer generation elsewhere makes it obsolete (then it is ignored); duplicate device names make a pool
invalid.

Partitionable devices (KEP-4815, gate `DRAPartitionableDevices`, beta and on in 1.36; `partitionable`
here): a slice's `sharedCounters` are the pool's counter sets and a device's `consumesCounters` what it
takes from them. A pool is built as upstream's `buildPool` at HEAD (kubernetes/dynamic-resource-allocation
89c46e8, `structured/internal/incubating/pools_incubating.go`): slices with counter sets hold no
allocatable devices; counter set names are unique per pool (`duplicate counter set name X`); every
consumption names a counter set of the pool and counters it has (`counter set X not found`, `counter Y
not found in counter set X`), checked also on the pool's slices for other nodes, whose devices are kept
(`others`) because what allocated claims hold there consumes the same counters. A counter slice is
relevant to a node like any slice (HEAD; v0.35 took every counter slice for every node: the result is
the same, since a pool that misses one from the node's view is completed from all its slices). With the
gate off, counter slices are skipped and devices that consume counters are never allocated, as upstream.
Slices with `perDeviceNodeSelection` are not served (skipped).

Order: upstream walks pools in Go map order (random); here pools come in the order of their first slice
and slices of a pool in name order, so the first fit is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import canonical_quantity, parse_quantity
from hami_sim.scheduler.dra.selector import DeviceView, Selector, SelectorError
from hami_sim.scheduler.fit import node_selector_matches

Json = dict[str, Any]
DeviceID = tuple[str, str, str]
"""(driver, pool, device)."""

_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


NANO = 10**9
"""Quantities are held as integers of nano-units: exact for every quantity kube-apiserver stores (it
rounds finer values up to 1n), and integer arithmetic keeps the search fast."""


def _away_from_zero(value: Fraction) -> int:
    """Rounded up, away from zero (Go's `Quantity.Value()`, and kube-apiserver's rounding to 1n)."""
    magnitude = -(-abs(value.numerator) // value.denominator)
    return -magnitude if value < 0 else magnitude


@dataclass(frozen=True, slots=True)
class Qty:
    """A quantity: its value in nano-units, Go's `Value()` (rounded up, away from zero) and the text
    written back (what kube-apiserver stores)."""

    nano: int
    units: int
    text: str

    @classmethod
    def parse(cls, raw: Any, where: str) -> Qty:
        try:
            exact = parse_quantity(raw)
            text = canonical_quantity(raw)
        except QuantityError as err:
            raise ValueError(f"{where}: {err}") from None
        return cls(_away_from_zero(exact * NANO), _away_from_zero(exact), text)

    @classmethod
    def binary(cls, value: int) -> Qty:
        """`resource.NewQuantity(value, BinarySI)` as Go prints it: the largest power of 1024 that
        divides it ("10Gi"), else the plain number."""
        number, power = abs(value), 0
        while number >= 1024 and number % 1024 == 0 and power < len(_BINARY) - 1:
            number //= 1024
            power += 1
        sign = "-" if value < 0 else ""
        return cls(value * NANO, value, f"{sign}{number}{_BINARY[power]}")

    @property
    def value(self) -> Fraction:
        return Fraction(self.nano, NANO)


@dataclass(frozen=True, slots=True)
class Policy:
    """A capacity's `requestPolicy`: `default`, and `validRange` {min, max, step} or `validValues`."""

    default: Qty | None = None
    min: Qty | None = None
    max: Qty | None = None
    step: Qty | None = None
    valid_values: tuple[Qty, ...] = ()
    has_range: bool = False


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Qty
    policy: Policy | None = None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


def _parse_policy(raw: Mapping[str, Any], where: str) -> Policy:
    default = Qty.parse(raw["default"], f"{where}.default") if raw.get("default") is not None else None
    valid_range = raw.get("validRange")
    if isinstance(valid_range, Mapping):

        def part(key: str) -> Qty | None:
            value = valid_range.get(key)
            return None if value is None else Qty.parse(value, f"{where}.validRange.{key}")

        return Policy(default, part("min"), part("max"), part("step"), (), True)
    values = tuple(
        Qty.parse(v, f"{where}.validValues[{i}]") for i, v in enumerate(raw.get("validValues") or ())
    )
    return Policy(default, valid_values=values)


class Device:
    """One device of a slice, parsed once; it keeps its CEL view and the result of every selector
    evaluated on it (a device never changes: a new slice version makes new Devices)."""

    __slots__ = (
        "_matches",
        "_view",
        "allow_multiple",
        "attributes",
        "binding_conditions",
        "capacity",
        "consumption",
        "counters",
        "driver",
        "id",
        "name",
        "pool",
        "slice",
        "taints",
    )

    def __init__(self, raw: Mapping[str, Any], slice_: Slice, where: str) -> None:
        self.name = str(raw.get("name") or "")
        if not self.name:
            raise ValueError(f"{where}.name: Required value")
        self.driver = slice_.driver
        self.pool = slice_.pool
        self.id: DeviceID = (slice_.driver, slice_.pool, self.name)
        self.slice = slice_
        attributes = raw.get("attributes") or {}
        if not isinstance(attributes, Mapping):
            raise ValueError(f"{where}.attributes: must be a map")
        self.attributes: dict[str, Mapping[str, Any]] = dict(attributes)
        self.capacity: dict[str, Capacity] = {}
        for name, cap in (raw.get("capacity") or {}).items():
            if not isinstance(cap, Mapping) or "value" not in cap:
                raise ValueError(f"{where}.capacity[{name}].value: Required value")
            policy = cap.get("requestPolicy")
            self.capacity[str(name)] = Capacity(
                Qty.parse(cap["value"], f"{where}.capacity[{name}].value"),
                _parse_policy(policy, f"{where}.capacity[{name}].requestPolicy")
                if isinstance(policy, Mapping)
                else None,
            )
        self.allow_multiple = raw.get("allowMultipleAllocations") is True
        self.taints = tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in raw.get("taints") or ()
            if isinstance(t, Mapping)
        )
        self.counters = _consumption(raw.get("consumesCounters"), f"{where}.consumesCounters")
        """What the device consumes from its pool's counter sets: ((set, ((counter, nano), ...)), ...)."""
        self.binding_conditions = bool(raw.get("bindingConditions"))
        self._view: DeviceView | None = None
        self._matches: dict[str, bool | SelectorError] = {}
        self.consumption: dict[tuple[tuple[str, int], ...], dict[str, Qty] | None] = {}
        """What a request with these capacity requests consumes here (filled by the allocator)."""

    def view(self) -> DeviceView:
        if self._view is None:
            self._view = DeviceView(
                self.driver,
                self.attributes,
                {name: cap.value.value for name, cap in self.capacity.items()},
                self.allow_multiple,
            )
        return self._view

    def matches(self, selector: Selector) -> bool:
        """The selector's verdict on this device, evaluated once (SelectorError raised every time)."""
        verdict = self._matches.get(selector.expression)
        if verdict is None:
            try:
                verdict = selector.matches(self.view())
            except SelectorError as err:
                verdict = err
            self._matches[selector.expression] = verdict
        if isinstance(verdict, SelectorError):
            raise verdict
        return verdict

    def attribute(self, qualified: str) -> Mapping[str, Any] | None:
        """Upstream's `lookupAttribute`: the fully qualified name, or the bare id when the domain is the
        driver's."""
        found = self.attributes.get(qualified)
        if found is not None:
            return found
        domain, sep, ident = qualified.partition("/")
        if not sep or domain != self.driver:
            return None
        return self.attributes.get(ident)


@dataclass(slots=True)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    count: int
    node_name: str = ""
    all_nodes: bool = False
    node_selector: Mapping[str, Any] | None = None
    skipped: bool = False
    """Needs a feature that is off (partitionable devices) or not served: never used."""
    counter_sets: dict[str, dict[str, int]] | None = None
    """`sharedCounters` by set name, each counter in nano-units (None: the slice has none)."""
    duplicate_set: str = ""
    """A counter set name given twice in this slice (the pool is then invalid)."""
    devices: list[Device] = field(default_factory=list)
    error: str = ""
    """Why the slice could not be read (its pool is then invalid)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any], partitionable: bool = True) -> Slice:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        pool = spec.get("pool") or {}
        name = str(meta.get("name") or "")
        slice_ = cls(
            name=name,
            driver=str(spec.get("driver") or ""),
            pool=str(pool.get("name") or ""),
            generation=_int(pool.get("generation"), 0),
            count=_int(pool.get("resourceSliceCount"), 0),
            node_name=str(spec.get("nodeName") or ""),
            all_nodes=spec.get("allNodes") is True,
            node_selector=spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), Mapping) else None,
            skipped=bool(spec.get("perDeviceNodeSelection"))
            or (not partitionable and bool(spec.get("sharedCounters"))),
        )
        try:
            if partitionable and spec.get("sharedCounters"):
                slice_.counter_sets = {}
                for i, raw_set in enumerate(spec["sharedCounters"]):
                    if not isinstance(raw_set, Mapping):
                        raise ValueError(f"spec.sharedCounters[{i}]: must be an object")
                    set_name = str(raw_set.get("name") or "")
                    if set_name in slice_.counter_sets:
                        slice_.duplicate_set = set_name
                    slice_.counter_sets[set_name] = _counters(
                        raw_set.get("counters"), f"spec.sharedCounters[{i}].counters"
                    )
            slice_.devices = [
                Device(d, slice_, f"spec.devices[{i}]")
                for i, d in enumerate(spec.get("devices") or ())
                if isinstance(d, Mapping)
            ]
        except ValueError as err:
            slice_.devices = []
            slice_.error = f"ResourceSlice {name}: {err}"
        return slice_

    def for_node(self, node: str, labels: Mapping[str, str]) -> bool:
        if self.skipped:
            return False
        if self.node_name:
            return self.node_name == node
        if self.all_nodes:
            return True
        if self.node_selector is not None:
            return node_selector_matches(self.node_selector, node, labels)
        return False  # an unknown future way to select nodes: left alone, as upstream


def _counters(raw: Any, where: str) -> dict[str, int]:
    """A `counters` map ({name: {value: quantity}}) in nano-units."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be a map")
    out: dict[str, int] = {}
    for name, counter in raw.items():
        if not isinstance(counter, Mapping) or "value" not in counter:
            raise ValueError(f"{where}[{name}].value: Required value")
        out[str(name)] = Qty.parse(counter["value"], f"{where}[{name}].value").nano
    return out


def _consumption(raw: Any, where: str) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: must be a list")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}[{i}]: must be an object")
        counters = _counters(item.get("counters"), f"{where}[{i}].counters")
        out.append((str(item.get("counterSet") or ""), tuple(counters.items())))
    return tuple(out)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    slices: list[Slice] = field(default_factory=list)
    """The slices whose devices this node may get (in name order; no counter slices)."""
    incomplete: bool = False
    invalid: str = ""
    counter_sets: dict[str, dict[str, int]] = field(default_factory=dict)
    """The pool's counter sets (from all its slices), counters in nano-units."""
    others: list[Slice] = field(default_factory=list)
    """The pool's device slices for other nodes (their allocated devices consume the counters too)."""

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


class Inventory:
    """All ResourceSlices, indexed for `pools(node)`. Fed incrementally (`set_slice`, `delete_slice`,
    `replace`); a slice whose resourceVersion did not change keeps its parsed devices and their caches."""

    def __init__(self, slices: Iterable[Mapping[str, Any]] = (), *, partitionable: bool = True) -> None:
        self.partitionable = partitionable
        """`DRAPartitionableDevices` (kube-scheduler 1.36: beta, on)."""
        self._slices: dict[str, tuple[str, Slice]] = {}
        self._by_pool: dict[tuple[str, str], list[Slice]] = {}
        self._node_cache: dict[str, list[Pool]] = {}
        self._selecting = 0
        """Slices that pick nodes by allNodes/nodeSelector (their pools are not cached per node)."""
        self.version = 0
        self.replace(slices)

    def __len__(self) -> int:
        return len(self._slices)

    def replace(self, slices: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for raw in slices:
            self.set_slice(raw)
            seen.add(str((raw.get("metadata") or {}).get("name") or ""))
        for name in [n for n in self._slices if n not in seen]:
            self.delete_slice(name)

    def set_slice(self, raw: Mapping[str, Any]) -> bool:
        """A slice added or changed; True when it changed what the allocator sees."""
        meta = raw.get("metadata") or {}
        name = str(meta.get("name") or "")
        version = str(meta.get("resourceVersion") or "") or repr(raw.get("spec"))
        old = self._slices.get(name)
        if old is not None and old[0] == version:
            return False
        if old is not None:
            self._unindex(old[1])
        parsed = Slice.parse(raw, self.partitionable)
        self._slices[name] = (version, parsed)
        self._by_pool.setdefault((parsed.driver, parsed.pool), []).append(parsed)
        if not parsed.node_name and not parsed.skipped:
            self._selecting += 1
        self._changed()
        return True

    def delete_slice(self, name: str) -> bool:
        old = self._slices.pop(name, None)
        if old is None:
            return False
        self._unindex(old[1])
        self._changed()
        return True

    def _unindex(self, parsed: Slice) -> None:
        key = (parsed.driver, parsed.pool)
        members = self._by_pool.get(key, [])
        if parsed in members:
            members.remove(parsed)
        if not members:
            self._by_pool.pop(key, None)
        if not parsed.node_name and not parsed.skipped:
            self._selecting -= 1

    def _changed(self) -> None:
        self.version += 1
        self._node_cache.clear()

    def slices(self) -> list[Slice]:
        return [s for _, s in self._slices.values()]

    def pools(self, node: str, labels: Mapping[str, str] | None = None) -> list[Pool]:
        """Upstream's `GatherPools` for one node (see the module docstring)."""
        if not self._selecting:
            cached = self._node_cache.get(node)
            if cached is not None:
                return cached
        pools = self._gather(node, labels or {})
        if not self._selecting:
            self._node_cache[node] = pools
        return pools

    def _gather(self, node: str, labels: Mapping[str, str]) -> list[Pool]:
        by_pool: dict[tuple[str, str], list[Slice]] = {}
        for _, candidate in self._slices.values():
            if not candidate.for_node(node, labels):
                continue
            key = (candidate.driver, candidate.pool)
            current = by_pool.get(key)
            if current is None or candidate.generation > current[0].generation:
                by_pool[key] = [candidate]
            elif candidate.generation == current[0].generation:
                current.append(candidate)
        pools: list[Pool] = []
        for (driver, name), members in by_pool.items():
            generation, count = members[0].generation, members[0].count
            every: list[Slice] = members
            if len(members) != count:
                everywhere = self._by_pool.get((driver, name), [])
                if any(s.generation > generation for s in everywhere):
                    continue  # obsolete: the driver is replacing this generation
                every = [s for s in everywhere if s.generation == generation]
                if len(every) != count:
                    pools.append(Pool(driver, name, incomplete=True))
                    continue
            pools.append(_build_pool(driver, name, members, every, self.partitionable))
        return pools


def _build_pool(
    driver: str, name: str, members: Sequence[Slice], every: Sequence[Slice], partitionable: bool
) -> Pool:
    """Upstream's `buildPool` (see the module docstring)."""
    targeting = {id(s) for s in members}
    pool = Pool(driver, name)
    counter_slices: list[Slice] = []
    for s in sorted(every, key=lambda s: s.name):
        if s.skipped:
            continue
        if s.counter_sets is not None:
            counter_slices.append(s)
        elif id(s) in targeting:
            pool.slices.append(s)
        else:
            pool.others.append(s)
    pool.invalid = _invalid(pool, counter_slices, every, partitionable)
    return pool


def _invalid(pool: Pool, counter_slices: Sequence[Slice], every: Sequence[Slice], partitionable: bool) -> str:
    for s in every:
        if s.error and not s.skipped:
            return s.error
    names: set[str] = set()
    for s in pool.slices:
        for device in s.devices:
            if device.name in names:
                return f"duplicate device name {device.name}"
            names.add(device.name)
    if not partitionable:
        return ""  # counters are not validated with the gate off (upstream's buildPool)
    for s in counter_slices:
        if s.duplicate_set:
            return f"duplicate counter set name {s.duplicate_set}"
        for set_name, counters in (s.counter_sets or {}).items():
            if set_name in pool.counter_sets:
                return f"duplicate counter set name {set_name}"
            pool.counter_sets[set_name] = counters
    for s in (*pool.slices, *pool.others):
        for device in s.devices:
            for set_name, consumed in device.counters:
                counter_set = pool.counter_sets.get(set_name)
                if counter_set is None:
                    return f"counter set {set_name} not found"
                for counter, _ in consumed:
                    if counter not in counter_set:
                        return f"counter {counter} not found in counter set {set_name}"
    return ""
