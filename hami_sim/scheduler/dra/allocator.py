"""The structured allocator of kube-scheduler's DynamicResources plugin, per node, pure (no I/O, no clock:
share IDs come from an injected generator).

Upstream: `k8s.io/dynamic-resource-allocation/structured/internal/experimental/allocator_experimental.go`,
`consumable_capacity.go` and `constraint.go` (v0.35.0; the experimental allocator is the one used when
`DRAConsumableCapacity` is on). Features served: prioritized lists (`firstAvailable`), admin access,
device taints, consumable capacity, partitionable devices (counters, KEP-4815). Not served: binding
conditions (devices with them are skipped, as with their gates off), per-device node selection,
`DRAListTypeAttributes`.

The search (upstream's `allocateOne`): claims in order, each claim's requests in order, each request's
devices one by one; for every device needed it walks the node's pools, their slices and their devices in
order and takes the first that is

1. not in use: an exclusive device (no `allowMultipleAllocations`) allocated to any claim, or picked
   earlier in this search, is in use; a shareable device never is (only its capacity counts); an admin
   access request only skips devices already picked for the same claim;
2. selected by the device class's and the request's CEL selectors (each verdict cached per device);
3. within capacity (`consumable_capacity.go`): a request for a capacity the device lacks skips it; for
   every capacity of the device the amount consumed is the request rounded up by the request policy
   (`validRange`: below `min` -> `min`, else `min + ceil((req - min) / step) * step`; `validValues`: the
   smallest value >= req), or the policy's `default` (else the whole value) when the request names no
   amount; it fails when the policy rejects it (above `max`, not a valid value) or when what allocated
   claims consumed, plus what this search already took, plus it exceed the capacity's value;
4. not tainted NoSchedule/NoExecute unless every such taint is tolerated (Equal/Exists, effect);
5. allowed by the claim's constraints: `matchAttribute` (all devices of the named requests share the
   value), `distinctAttribute` (no two share it);
6. within its pool's counters (`checkAvailableCounters`), when it consumes counters: the pool's counter
   sets, less what every allocated device of the pool consumes (exclusive ones, and since
   kubernetes/dynamic-resource-allocation 89c46e8 shared ones too, once per device; devices of the pool
   published for other nodes included), less what this search took, must cover what the device
   consumes; and, as upstream, no counter of the pool may be overdrawn at all (an allocated state that
   already exceeds a counter blocks every counter-consuming device of that pool). A shared device
   (`allowMultipleAllocations`) consumes its counters once: later shares skip the check. Without
   `DRAPartitionableDevices` such devices are never allocated.

When a later device cannot be found it backtracks (depth first) and tries the next candidate; the first
full solution wins, so the order of slices and devices decides ("first fit"). `allocationMode: All`
takes every matching device (and fails on an incomplete pool); `firstAvailable` tries the sub-requests
in order and names the result `request/sub`.

Differences, on purpose:
- upstream's `distinctAttribute` keeps one value per request name, so a request with count >= 3 can get
  a shareable device twice; here every device picked counts (what the API documents);
- upstream takes a device's counters before its taint, capacity and constraint checks and does not give
  them back when one of those fails, nor when a shared device's pick is undone, so a search can believe
  counters are used that nothing holds; here counters are taken last and always given back on undo;
- upstream keys the counters by pool name alone (two drivers with a pool of the same name would mix);
  here by driver and pool.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final

import orjson

from hami_sim.scheduler.dra.inventory import NANO, Capacity, Device, DeviceID, Inventory, Pool, Qty, Taint
from hami_sim.scheduler.dra.selector import Selector, SelectorCache, SelectorError

Json = dict[str, Any]

ALLOCATION_RESULTS_MAX_SIZE: Final = 32
"""`resourceapi.AllocationResultsMaxSize`: devices per claim."""
DEFAULT_MAX_STEPS: Final = 200_000
"""Search steps (upstream's `allocateOne` calls) per node before giving up with kube's timeout reason
(upstream bounds the search by time: `filterTimeout`, 10 s)."""

REASON_CANNOT_ALLOCATE: Final = "cannot allocate all claims"
REASON_INVALID_POOLS: Final = "invalid resource pools were encountered"
REASON_TIMED_OUT: Final = "timed out trying to allocate devices"


class AllocationError(Exception):
    """Something is wrong with a claim, class or selector: scheduling the pod fails with this error
    (upstream's Filter `statusError`), on every node."""


def new_share_id() -> str:
    """`GenerateNewShareID`: a fresh UUID."""
    return str(uuid.uuid4())


def claim_ref(claim: Mapping[str, Any]) -> str:
    """klog.KObj: `namespace/name`."""
    meta = claim.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


# --- allocated state ---------------------------------------------------------------------------------


@dataclass
class AllocatedState:
    """What allocated claims hold (upstream's `AllocatedState`, gathered from every allocated claim): the
    devices allocated exclusively (results without a shareID) and, per shared device, the sum of the
    consumed capacity of its shares. Results with admin access hold nothing. Claims are added and removed
    one by one so that a scheduler keeps it current."""

    devices: dict[DeviceID, int] = field(default_factory=dict)
    capacity: dict[DeviceID, dict[str, int]] = field(default_factory=dict)
    """Per shared device, the consumed capacity in nano-units (`Qty.nano`)."""
    versions: dict[tuple[str, str], int] = field(default_factory=dict)
    """Per pool (driver, pool name): how many times what its devices hold changed (not upstream's: the
    stand-in's `AllocationMemo` keys a node's search outcome by it)."""

    @classmethod
    def of(cls, claims: Iterable[Mapping[str, Any]]) -> AllocatedState:
        state = cls()
        for claim in claims:
            state.add(claim)
        return state

    def add(self, claim: Mapping[str, Any], sign: int = 1) -> None:
        allocation = (claim.get("status") or {}).get("allocation")
        if not isinstance(allocation, Mapping):
            return
        for result in (allocation.get("devices") or {}).get("results") or ():
            if not isinstance(result, Mapping) or result.get("adminAccess") is True:
                continue
            key: DeviceID = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            pool = (key[0], key[1])
            self.versions[pool] = self.versions.get(pool, 0) + 1
            if result.get("shareID"):
                consumed = self.capacity.setdefault(key, {})
                for name, raw in (result.get("consumedCapacity") or {}).items():
                    try:
                        amount = Qty.parse(raw, "consumedCapacity").nano
                    except ValueError:
                        continue
                    consumed[name] = consumed.get(name, 0) + sign * amount
                if sign < 0 and not any(consumed.values()):
                    del self.capacity[key]
                continue
            count = self.devices.get(key, 0) + sign
            if count > 0:
                self.devices[key] = count
            else:
                self.devices.pop(key, None)

    def remove(self, claim: Mapping[str, Any]) -> None:
        self.add(claim, -1)

    def holds(self, device: DeviceID) -> bool:
        """`IsDeviceAllocated`: allocated exclusively, or with consumed capacity of some share."""
        return device in self.devices or device in self.capacity

    def consumed(self, device: DeviceID) -> dict[str, Fraction]:
        """What the allocated shares of `device` consume, per capacity."""
        return {name: Fraction(nano, NANO) for name, nano in self.capacity.get(device, {}).items()}


# --- requests ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Request:
    """One request, or one sub-request of a `firstAvailable` list, ready to allocate."""

    name: str
    parent: str
    class_name: str
    class_: Mapping[str, Any]
    class_selectors: list[Selector]
    selectors: list[Selector]
    all_mode: bool
    count: int
    admin: bool
    tolerations: list[Json]
    capacity: dict[str, Qty] | None
    all_devices: list[Device] = field(default_factory=list)
    capacity_key: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        self.capacity_key = tuple(sorted((name, q.nano) for name, q in (self.capacity or {}).items()))

    def consumption(self, device: Device) -> dict[str, Qty] | None:
        """Every capacity of the device with what this request consumes of it (zeros included), or None
        when the device lacks a capacity asked for or its policy refuses the amount. Kept on the device
        for every request with the same capacity requests (a device never changes)."""
        cache = device.consumption
        if self.capacity_key in cache:
            return cache[self.capacity_key]
        requests = self.capacity or {}
        consumed: dict[str, Qty] | None = None
        if all(name in device.capacity for name in requests):
            consumed = {
                name: consumed_amount(requests.get(name), cap) for name, cap in device.capacity.items()
            }
            if any(violates_policy(consumed[name], cap) for name, cap in device.capacity.items()):
                consumed = None
        cache[self.capacity_key] = consumed
        return consumed

    @property
    def result_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name

    @property
    def base_name(self) -> str:
        return self.parent or self.name


@dataclass(slots=True)
class Constraint:
    """matchAttribute or distinctAttribute over some requests (all when `requests` is empty)."""

    requests: frozenset[str]
    attribute: str
    distinct: bool
    values: list[tuple[str, Any]] = field(default_factory=list)

    def applies(self, request: Request) -> bool:
        if not self.requests:
            return True
        return request.base_name in self.requests or (
            bool(request.parent) and request.result_name in self.requests
        )

    def add(self, request: Request, device: Device) -> bool:
        if not self.applies(request):
            return True
        raw = device.attribute(self.attribute)
        value = _typed(raw) if raw is not None else None
        if value is None:
            return False
        if self.values:
            if self.distinct and value in self.values:
                return False
            if not self.distinct and value != self.values[0]:
                return False
        self.values.append(value)
        return True

    def remove(self, request: Request) -> None:
        if self.applies(request):
            self.values.pop()


def _typed(attribute: Mapping[str, Any]) -> tuple[str, Any] | None:
    for kind in ("string", "int", "bool", "version"):
        if kind in attribute:
            return (kind, attribute[kind])
    return None


@dataclass(slots=True)
class _Claim:
    raw: Mapping[str, Any]
    requests: list[list[Request]]
    """Per request: [the request] or its sub-requests in order."""
    constraints: list[Constraint]
    selected: list[int]
    """Per request: the index of the sub-request chosen."""
    has_all: bool = False


def _check_size(claim: Mapping[str, Any], requests: Sequence[Sequence[Request]]) -> None:
    """At most 32 devices per claim, counting the smallest sub-request of each list."""
    wanted = sum(
        min(len(r.all_devices) if r.all_mode else r.count for r in subs) for subs in requests if subs
    )
    if wanted > ALLOCATION_RESULTS_MAX_SIZE:
        raise AllocationError(
            f"claim {claim_ref(claim)}: number of requested devices {wanted} exceeds the claim "
            f"limit of {ALLOCATION_RESULTS_MAX_SIZE}"
        )


def _quantities(raw: Any, where: str) -> dict[str, Qty] | None:
    requests = (raw or {}).get("requests") if isinstance(raw, Mapping) else None
    if not isinstance(requests, Mapping):
        return None
    try:
        return {str(name): Qty.parse(value, f"{where}[{name}]") for name, value in requests.items()}
    except ValueError as err:
        raise AllocationError(str(err)) from None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


# --- capacity (consumable_capacity.go) ---------------------------------------------------------------


def consumed_amount(requested: Qty | None, capacity: Capacity) -> Qty:
    """What one allocation consumes of one capacity (`calculateConsumedCapacity`)."""
    policy = capacity.policy
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else capacity.value
    if policy is None:
        return requested
    if policy.has_range and policy.min is not None:
        low = policy.min
        if requested.nano < low.nano:
            return low
        if policy.step is None or policy.step.units <= 0:
            return requested
        step, base = policy.step.units, low.units
        n, rest = divmod(requested.units - base, step)
        return Qty.binary(base + step * (n + (1 if rest else 0)))
    if policy.valid_values:
        for valid in policy.valid_values:
            if requested.nano <= valid.nano:
                return valid
    return requested


def violates_policy(amount: Qty, capacity: Capacity) -> bool:
    """`violatesPolicy`: above `max`, off-step, or not one of `validValues` (the default always passes)."""
    policy = capacity.policy
    if policy is None or (policy.default is not None and amount.nano == policy.default.nano):
        return False
    if policy.has_range:
        if policy.max is not None and amount.nano > policy.max.nano:
            return True
        if policy.step is not None and policy.min is not None and policy.step.units > 0:
            return (amount.units - policy.min.units) % policy.step.units != 0
        return False
    if policy.valid_values:
        return all(amount.nano != v.nano for v in policy.valid_values)
    return False


# --- taints ------------------------------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """`resourceclaim.ToleratesTaint`."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == taint.value
    return operator == "Exists"


def taint_prevents(device: Device, request: Request) -> bool:
    for taint in device.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(
            tolerates(t, taint) for t in request.tolerations
        ):
            return True
    return False


# --- the allocator --------------------------------------------------------------------------------------


class NodeAllocation:
    """The outcome on one node: `allocations` (one `status.allocation` per claim, in claim order), or
    `reason` why the node cannot take the claims.

    The allocations are built when first read: Filter runs the search on every candidate node and only
    the chosen node's allocation is ever written, so building the others (node selector, share IDs,
    configs: 29 % of the scheduler stand-in's CPU at 500 nodes, docs/benchmarks.md) was waste. The
    search's picks are the node's own (fresh claims and picks per `Allocator.allocate` call), so a
    later build gives what an immediate one would; Score reads only `chosen_requests`."""

    __slots__ = ("_allocations", "_build", "_chosen", "reason", "steps")

    def __init__(
        self,
        allocations: list[Json] | None,
        reason: str = "",
        steps: int = 0,
        *,
        build: Callable[[], list[Json]] | None = None,
        chosen: list[frozenset[str]] | None = None,
    ) -> None:
        self._allocations = allocations
        self._build = build
        self._chosen = chosen
        self.reason = reason
        self.steps = steps

    @property
    def fits(self) -> bool:
        return self._allocations is not None or self._build is not None

    @property
    def allocations(self) -> list[Json] | None:
        if self._allocations is None and self._build is not None:
            self._allocations = self._build()
            self._build = None
        return self._allocations

    def chosen_requests(self) -> list[frozenset[str]]:
        """Per claim, the result names (`request` or `request/sub`) of the devices picked."""
        if self._chosen is not None:
            return self._chosen
        return [
            frozenset(str(r.get("request")) for r in (a.get("devices") or {}).get("results") or ())
            for a in self.allocations or ()
        ]

    def __repr__(self) -> str:
        return f"NodeAllocation(fits={self.fits}, reason={self.reason!r}, steps={self.steps})"


class _MaxSize(Exception):
    """Upstream's errAllocationResultMaxSizeExceeded (more than 32 devices for a claim)."""


class _OutOfSteps(Exception):
    pass


@dataclass(slots=True)
class _Pick:
    request: Request
    device: Device
    consumed: dict[str, Qty] | None


@dataclass(frozen=True, slots=True)
class _Found:
    """A search's outcome on a node: the claims as searched and their picks, or the reason."""

    claims: list[_Claim] | None
    picked: list[list[_Pick]] | None
    steps: int
    reason: str = ""
    chosen: list[frozenset[str]] | None = None
    """Per claim, the names of the requests its picks serve (Score reads them)."""


class AllocationMemo:
    """The stand-in's shortcut, not upstream's (kube-scheduler runs the search on every candidate node
    of every pod, in Go): a node's search outcome kept by everything it reads, so that the next pod with
    claims of the same spec does not search a node that did not change. The key: the claims' specs and
    the device classes they name (as JSON), the node, its pools with the version of what their devices
    hold (`AllocatedState.versions`: every allocation or release in a pool changes it) and the
    inventory's version (any slice changed), and the search's step limit. The search reads nothing else
    (no clock, no randomness; the allocation's share IDs are drawn when it is built, per pod), so a kept
    outcome is what a new search would find: `tests/unit/test_dra_allocator_properties.py` checks it
    through allocations, releases and slice changes. Outcomes with `All` requests, and searches that
    raise, are not kept. Cleared when the inventory changes or past `limit` entries."""

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self._entries: dict[tuple[object, ...], _Found] = {}
        self._inventory_version = -1
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[object, ...], inventory_version: int) -> _Found | None:
        if inventory_version != self._inventory_version:
            self._entries.clear()
            self._inventory_version = inventory_version
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key: tuple[object, ...], found: _Found) -> None:
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = found


class Allocator:
    """Allocates a pod's unallocated claims on one node at a time. Build it once per pod (scheduling
    cycle: PreFilter), call `allocate(node)` per candidate node (Filter). The inventory, the classes and
    the allocated state are read, never changed."""

    def __init__(
        self,
        claims: Sequence[Mapping[str, Any]],
        inventory: Inventory,
        classes: Mapping[str, Mapping[str, Any]],
        allocated: AllocatedState,
        *,
        selectors: SelectorCache | None = None,
        share_id: Callable[[], str] = new_share_id,
        max_steps: int = DEFAULT_MAX_STEPS,
        memo: AllocationMemo | None = None,
    ) -> None:
        self.memo = memo
        self._signature: bytes | None = None
        self.raw_claims = list(claims)
        self.inventory = inventory
        self.classes = classes
        self.allocated = allocated
        self.selectors = selectors if selectors is not None else SelectorCache()
        self.share_id = share_id
        self.max_steps = max_steps
        self._template: list[_Claim] | AllocationError | None = None
        self._available: dict[tuple[int, str], dict[tuple[str, str], int]] = {}
        """Per (inventory version, pool): each counter less what allocated devices consume (nano)."""

    def available_counters(self, pool: Pool) -> dict[tuple[str, str], int]:
        """The pool's counters, (set, counter) -> nano-units, less what the devices that allocated claims
        hold consume (upstream's `availableCounters`, computed once per pool and cycle)."""
        key = (self.inventory.version, pool.id)
        found = self._available.get(key)
        if found is not None:
            return found
        available = {
            (set_name, counter): value
            for set_name, counters in pool.counter_sets.items()
            for counter, value in counters.items()
        }
        for slice_ in (*pool.slices, *pool.others):
            for device in slice_.devices:
                if not device.counters or not self.allocated.holds(device.id):
                    continue
                for set_name, consumed in device.counters:
                    for counter, value in consumed:
                        if (set_name, counter) in available:
                            available[(set_name, counter)] -= value
        self._available[key] = available
        return available

    # --- preparation (upstream: the start of Allocate, validateDeviceRequest) -----------------------

    def _templates(self) -> list[_Claim]:
        """What of the claims does not depend on the node, built on the first call and kept (an
        AllocationError too, raised again on every call)."""
        if self._template is None:
            try:
                self._template = [self._claim(raw) for raw in self.raw_claims]
            except AllocationError as err:
                self._template = err
        if isinstance(self._template, AllocationError):
            raise self._template
        return self._template

    def _prepare(self, pools: list[Pool]) -> list[_Claim]:
        """The claims ready to search on a node (`_templates`): `All` requests get the node's devices;
        constraints are fresh."""
        prepared: list[_Claim] = []
        for template in self._templates():
            requests = template.requests
            if template.has_all:
                requests = [[self._for_node(template.raw, r, pools) for r in subs] for subs in requests]
                _check_size(template.raw, requests)
            constraints = [Constraint(c.requests, c.attribute, c.distinct) for c in template.constraints]
            prepared.append(_Claim(template.raw, requests, constraints, [0] * len(requests)))
        return prepared

    def _claim(self, raw: Mapping[str, Any]) -> _Claim:
        devices = ((raw.get("spec") or {}).get("devices")) or {}
        requests: list[list[Request]] = []
        for request in devices.get("requests") or ():
            name = str(request.get("name") or "")
            if request.get("firstAvailable"):
                requests.append(
                    [
                        self._request(raw, sub, str(sub.get("name") or ""), name)
                        for sub in request["firstAvailable"]
                    ]
                )
                continue
            exact = request.get("exactly")
            if not isinstance(exact, Mapping):
                raise AllocationError(
                    f"claim {claim_ref(raw)}, request {name}: "
                    "missing device class name (unsupported request type?)"
                )
            requests.append([self._request(raw, exact, name, "")])
        has_all = any(r.all_mode for subs in requests for r in subs)
        if not has_all:
            _check_size(raw, requests)
        constraints = []
        for i, c in enumerate(devices.get("constraints") or ()):
            names = frozenset(str(r) for r in c.get("requests") or ())
            if c.get("matchAttribute"):
                constraints.append(Constraint(names, str(c["matchAttribute"]), distinct=False))
            elif c.get("distinctAttribute"):
                constraints.append(Constraint(names, str(c["distinctAttribute"]), distinct=True))
            else:
                raise AllocationError(
                    f"claim {claim_ref(raw)}, constraint #{i}: "
                    "empty constraint (unsupported constraint type?)"
                )
        return _Claim(raw, requests, constraints, [], has_all)

    def _request(self, claim: Mapping[str, Any], raw: Mapping[str, Any], name: str, parent: str) -> Request:
        full = f"{parent}/{name}" if parent else name
        where = f"claim {claim_ref(claim)}, request {full}"
        selectors = []
        for i, selector in enumerate(raw.get("selectors") or ()):
            cel = selector.get("cel") if isinstance(selector, Mapping) else None
            expression = cel.get("expression") if isinstance(cel, Mapping) else None
            if not isinstance(expression, str) or not expression:
                raise AllocationError(
                    f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )
            selectors.append(self.selectors.get(expression))
        class_name = str(raw.get("deviceClassName") or "")
        if not class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        class_ = self.classes.get(class_name)
        if class_ is None:
            raise AllocationError(
                f"{where}: could not retrieve device class {class_name}: "
                f'deviceclass.resource.k8s.io "{class_name}" not found'
            )
        class_selectors = [
            self.selectors.get(str((s.get("cel") or {}).get("expression") or ""))
            for s in (class_.get("spec") or {}).get("selectors") or ()
            if isinstance(s, Mapping)
        ]
        mode = raw.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise AllocationError(f"{where}: unsupported count mode {mode}")
        return Request(
            name=name,
            parent=parent,
            class_name=class_name,
            class_=class_,
            class_selectors=class_selectors,
            selectors=selectors,
            all_mode=mode == "All",
            count=_count(raw.get("count")),
            admin=raw.get("adminAccess") is True and not parent,
            tolerations=[dict(t) for t in raw.get("tolerations") or () if isinstance(t, Mapping)],
            capacity=_quantities(raw.get("capacity"), f"{where}: capacity.requests"),
        )

    def _for_node(self, claim: Mapping[str, Any], request: Request, pools: list[Pool]) -> Request:
        """An `All` request with the node's matching devices (it refuses incomplete and invalid pools)."""
        if not request.all_mode:
            return request
        where = f"claim {claim_ref(claim)}, request {request.result_name}"
        devices: list[Device] = []
        for pool in pools:
            if pool.incomplete:
                raise AllocationError(
                    f"{where}: asks for all devices, but resource pool {pool.id} is currently being updated"
                )
            if pool.invalid:
                raise AllocationError(
                    f"{where}: asks for all devices, but resource pool {pool.id} is currently invalid"
                )
            for s in pool.slices:
                for device in s.devices:
                    if self._selectable(claim, request, device) and self._fits(request, device, {}):
                        devices.append(device)
        return replace(request, all_devices=devices)

    # --- checks ---------------------------------------------------------------------------------

    def _selectable(self, claim: Mapping[str, Any], request: Request, device: Device) -> bool:
        if device.binding_conditions:
            return False
        checks = ((f"class {request.class_name}", request.class_selectors), ("", request.selectors))
        for owner, selectors in checks:
            for i, selector in enumerate(selectors):
                try:
                    if not device.matches(selector):
                        return False
                except SelectorError as err:
                    who = owner or f"claim {claim_ref(claim)}"
                    raise AllocationError(f"{who}: selector #{i}: {err}") from None
        return True

    def _fits(
        self, request: Request, device: Device, allocating: Mapping[DeviceID, Mapping[str, int]]
    ) -> bool:
        """`CmpRequestOverCapacity`."""
        consumed = request.consumption(device)
        if consumed is None:
            return False
        held = self.allocated.capacity.get(device.id, {})
        taking = allocating.get(device.id, {})
        for name, cap in device.capacity.items():
            if held.get(name, 0) + taking.get(name, 0) + consumed[name].nano > cap.value.nano:
                return False
        return True

    # --- the search -------------------------------------------------------------------------------

    def allocate(self, node: str, labels: Mapping[str, str] | None = None) -> NodeAllocation:
        """Allocate every claim on `node`: the allocations, or why not. AllocationError for a broken
        claim, class or selector."""
        pools = self.inventory.pools(node, labels)
        key = self._memo_key(node, pools)
        if key is not None:
            assert self.memo is not None
            kept = self.memo.get(key, self.inventory.version)
            if kept is not None:
                return self._outcome(node, kept)
        found = self._search(self._prepare(pools), pools)
        if key is not None:
            assert self.memo is not None
            self.memo.put(key, found)
        return self._outcome(node, found)

    def _search(self, claims: list[_Claim], pools: list[Pool]) -> _Found:
        search = _Search(self, claims, pools)
        try:
            done = search.one(0, 0, 0, 0, False)
        except _MaxSize:
            done = False
        except _OutOfSteps:
            return _Found(None, None, search.steps, REASON_TIMED_OUT)
        if not done:
            reason = REASON_INVALID_POOLS if any(p.invalid for p in pools) else REASON_CANNOT_ALLOCATE
            return _Found(None, None, search.steps, reason)
        picked = search.picks
        chosen = [frozenset(p.request.result_name for p in picks) for picks in picked]
        return _Found(claims, picked, search.steps, chosen=chosen)

    def _outcome(self, node: str, found: _Found) -> NodeAllocation:
        claims, picked = found.claims, found.picked
        if claims is None or picked is None:
            return NodeAllocation(None, found.reason, found.steps)

        def build() -> list[Json]:
            return [self._result(claim, picks, node) for claim, picks in zip(claims, picked, strict=True)]

        return NodeAllocation(None, steps=found.steps, build=build, chosen=found.chosen)

    def _memo_key(self, node: str, pools: list[Pool]) -> tuple[object, ...] | None:
        """The key of this node's outcome in `memo` (None: not kept; see `AllocationMemo`).
        AllocationError for a broken claim (`_templates`)."""
        if self.memo is None:
            return None
        signature = self._signature
        if signature is None:
            templates = self._templates()
            if any(t.has_all for t in templates):
                self.memo = None  # `All` requests take the node's devices: never kept
                return None
            classes = sorted(
                {r.class_name: r.class_ for t in templates for subs in t.requests for r in subs}.items()
            )
            specs = [(raw.get("spec") or {}).get("devices") for raw in self.raw_claims]
            try:
                signature = orjson.dumps(
                    [specs, classes, self.max_steps], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
                )
            except TypeError:  # not JSON: never kept
                self.memo = None
                return None
            self._signature = signature
        versions = self.allocated.versions
        return (
            signature,
            node,
            tuple([(p.driver, p.name, versions.get((p.driver, p.name), 0)) for p in pools]),
        )

    # --- results ----------------------------------------------------------------------------------

    def _result(self, claim: _Claim, picks: list[_Pick], node: str) -> Json:
        results: list[Json] = []
        for pick in picks:
            entry: Json = {
                "request": pick.request.result_name,
                "driver": pick.device.driver,
                "pool": pick.device.pool,
                "device": pick.device.name,
            }
            if pick.request.admin:
                entry["adminAccess"] = True
            if pick.request.tolerations:
                entry["tolerations"] = [dict(t) for t in pick.request.tolerations]
            if pick.consumed is not None:
                entry["shareID"] = self.share_id()
                if pick.consumed:
                    entry["consumedCapacity"] = {name: q.text for name, q in pick.consumed.items()}
            results.append(entry)
        devices: Json = {"results": results}
        config = self._config(claim)
        if config:
            devices["config"] = config
        allocation: Json = {"devices": devices}
        selector = _node_selector(picks, node)
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation

    def _config(self, claim: _Claim) -> list[Json]:
        """Class configs once per class (all the requests using it), then the claim's configs that name
        no request or a chosen one (upstream, with the duplicate fix of kubernetes/dynamic-resource-
        allocation c5a40b2)."""
        config: list[Json] = []
        by_class: dict[str, list[Json]] = {}
        chosen: list[Request] = [subs[claim.selected[i]] for i, subs in enumerate(claim.requests)]
        for request in chosen:
            entries = by_class.get(request.class_name)
            if entries is not None:
                for entry in entries:
                    entry["requests"].append(request.result_name)
                continue
            entries = []
            for item in (request.class_.get("spec") or {}).get("config") or ():
                entry = {"source": "FromClass", "requests": [request.result_name], **_configuration(item)}
                entries.append(entry)
                config.append(entry)
            by_class[request.class_name] = entries
        names = {r.base_name for r in chosen} | {r.result_name for r in chosen if r.parent}
        for item in ((claim.raw.get("spec") or {}).get("devices") or {}).get("config") or ():
            wanted = [str(r) for r in item.get("requests") or ()]
            if not wanted or names.intersection(wanted):
                config.append({"source": "FromClaim", "requests": wanted, **_configuration(item)})
        for entry in config:
            if not entry["requests"]:
                del entry["requests"]
        return config


def _configuration(item: Mapping[str, Any]) -> Json:
    return {k: v for k, v in item.items() if k not in ("requests", "source")}


def _node_selector(picks: Sequence[_Pick], node: str) -> Json | None:
    """`createNodeSelector`: the node itself when a device comes from a node-local slice; else the slices'
    single-term selectors merged; none when every device is available everywhere."""
    fields: list[Json] = []
    expressions: list[Json] = []
    for pick in picks:
        slice_ = pick.device.slice
        if slice_.node_name:
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        terms: Sequence[Mapping[str, Any]] = (slice_.node_selector or {}).get("nodeSelectorTerms") or ()
        if len(terms) == 1:
            for into, key in ((fields, "matchFields"), (expressions, "matchExpressions")):
                for requirement in terms[0].get(key) or ():
                    if not any(_same_requirement(r, requirement) for r in into):
                        into.append(dict(requirement))
    if not fields and not expressions:
        return None
    term: Json = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


def _same_requirement(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (
        a.get("key") == b.get("key")
        and a.get("operator") == b.get("operator")
        and set(a.get("values") or ()) == set(b.get("values") or ())
    )


class _Search:
    """One depth-first search on one node (upstream's `allocator` for one Allocate call)."""

    def __init__(self, owner: Allocator, claims: list[_Claim], pools: list[Pool]) -> None:
        self.owner = owner
        self.claims = claims
        self.pools = [p for p in pools if not p.incomplete and not p.invalid]
        self.picks: list[list[_Pick]] = [[] for _ in claims]
        self.exclusive: dict[DeviceID, set[int]] = {}
        """Exclusive devices picked in this search, with the claims they were picked for."""
        self.taking: dict[DeviceID, dict[str, int]] = {}
        """Capacity of shared devices taken in this search."""
        self.by_pool = {(p.driver, p.name): p for p in self.pools}
        self.counters: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        """Per pool (driver, name): the counters taken in this search (nano)."""
        self.steps = 0

    def in_use(self, device: Device) -> bool:
        return device.id in self.owner.allocated.devices or bool(self.exclusive.get(device.id))

    def one(self, c: int, r: int, s: int, d: int, in_sub: bool) -> bool:
        """Upstream's `allocateOne(deviceIndices{c, r, s, d}, in_sub)`."""
        self.steps += 1
        if self.steps > self.owner.max_steps:
            raise _OutOfSteps
        if c >= len(self.claims):
            return True
        claim = self.claims[c]
        if r >= len(claim.requests):
            try:
                return self.one(c + 1, 0, 0, 0, False)
            except _MaxSize:
                return False
        subs = claim.requests[r]
        if subs[0].parent and not in_sub:
            return self._sub_requests(c, r)
        request = subs[s]
        wanted = len(request.all_devices) if request.all_mode else request.count
        if request.all_mode and not request.all_devices:
            return False
        if d >= wanted:
            return self.one(c, r + 1, 0, 0, False)
        if len(self.picks[c]) + wanted - d > ALLOCATION_RESULTS_MAX_SIZE:
            raise _MaxSize
        if request.all_mode:
            undo = self.take(c, request, request.all_devices[d], must=True)
            if undo is None:
                return False
            return self._descend(c, r, s, d, in_sub, undo=undo)
        return self._candidates(c, r, s, d, in_sub, request=request)

    def _sub_requests(self, c: int, r: int) -> bool:
        all_exceeded = True
        for index in range(len(self.claims[c].requests[r])):
            try:
                done = self.one(c, r, index, 0, True)
            except _MaxSize:
                continue
            all_exceeded = False
            if done:
                self.claims[c].selected[r] = index
                return True
        if all_exceeded:
            raise _MaxSize
        return False

    def _candidates(self, c: int, r: int, s: int, d: int, in_sub: bool, *, request: Request) -> bool:
        owner = self.owner
        raw = self.claims[c].raw
        for pool in self.pools:
            for slice_ in pool.slices:
                for device in slice_.devices:
                    if request.admin:
                        if c in self.exclusive.get(device.id, ()):
                            continue
                    elif self.in_use(device):
                        continue
                    if not owner._selectable(raw, request, device):
                        continue
                    if not owner._fits(request, device, self.taking):
                        continue
                    undo = self.take(c, request, device, must=False)
                    if undo is None:
                        continue
                    if self._descend(c, r, s, d, in_sub, undo=undo):
                        return True
        return False

    def _descend(self, c: int, r: int, s: int, d: int, in_sub: bool, *, undo: Callable[[], None]) -> bool:
        try:
            done = self.one(c, r, s, d + 1, in_sub)
        except BaseException:
            undo()
            raise
        if not done:
            undo()
        return done

    def take(self, c: int, request: Request, device: Device, *, must: bool) -> Callable[[], None] | None:
        """Upstream's `allocateDevice`: the device for the request if nothing forbids it, with the undo."""
        shared = device.allow_multiple
        if not shared and request.admin and c in self.exclusive.get(device.id, ()):
            return None
        if not request.admin and self.in_use(device):
            return None
        if device.counters and not self.owner.inventory.partitionable:
            return None
        if taint_prevents(device, request):
            return None
        if not self.owner._fits(request, device, self.taking):
            return None
        counting = bool(device.counters) and not (
            shared and (self.owner.allocated.holds(device.id) or device.id in self.taking)
        )
        if counting and not self.counters_fit(device):
            return None
        constraints = self.claims[c].constraints
        for i, constraint in enumerate(constraints):
            if not constraint.add(request, device):
                if must:
                    raise AllocationError(
                        f"claim {claim_ref(self.claims[c].raw)}, request {request.name}: cannot add device "
                        f"{'/'.join(device.id)} because a claim constraint would not be satisfied"
                    )
                for earlier in constraints[:i]:
                    earlier.remove(request)
                return None
        consumed: dict[str, Qty] | None = None
        if shared:
            consumed = request.consumption(device)
            assert consumed is not None  # _fits passed
            taking = self.taking.setdefault(device.id, {})
            for name, q in consumed.items():
                taking[name] = taking.get(name, 0) + q.nano
        else:
            self.exclusive.setdefault(device.id, set()).add(c)
        if counting:
            self.count(device, 1)
        picks = self.picks[c]
        picks.append(_Pick(request, device, consumed))

        def undo() -> None:
            for constraint in constraints:
                constraint.remove(request)
            if counting:
                self.count(device, -1)
            if consumed is not None:
                taking = self.taking[device.id]
                for name, q in consumed.items():
                    taking[name] -= q.nano
                if not any(taking.values()):
                    del self.taking[device.id]
            else:
                self.exclusive[device.id].discard(c)
            picks.pop()

        return undo

    def counters_fit(self, device: Device) -> bool:
        """Upstream's `checkAvailableCounters` (without its side effect: `count` takes them)."""
        pool = self.by_pool.get((device.driver, device.pool))
        if pool is None:
            return False
        available = self.owner.available_counters(pool)
        taken = self.counters.get((device.driver, device.pool), {})
        wanted: dict[tuple[str, str], int] = {}
        for set_name, consumed in device.counters:
            for counter, value in consumed:
                key = (set_name, counter)
                wanted[key] = wanted.get(key, 0) + value
        return all(value >= taken.get(key, 0) + wanted.get(key, 0) for key, value in available.items())

    def count(self, device: Device, sign: int) -> None:
        taken = self.counters.setdefault((device.driver, device.pool), {})
        for set_name, consumed in device.counters:
            for counter, value in consumed:
                key = (set_name, counter)
                taken[key] = taken.get(key, 0) + sign * value


# --- the convenience entry point ------------------------------------------------------------------


def allocate(
    node: str,
    claims: Sequence[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    *,
    labels: Mapping[str, str] | None = None,
    share_id: Callable[[], str] = new_share_id,
    max_steps: int = DEFAULT_MAX_STEPS,
    partitionable: bool = True,
) -> NodeAllocation:
    """Allocate `claims` (ResourceClaim dicts, unallocated) on `node` from `slices`, with the DeviceClasses
    `classes` and the claims already allocated (their devices, consumed capacity and counters are taken).
    `partitionable`: the `DRAPartitionableDevices` gate."""
    by_name = {str((c.get("metadata") or {}).get("name")): c for c in classes}
    allocator = Allocator(
        claims,
        Inventory(slices, partitionable=partitionable),
        by_name,
        AllocatedState.of(allocated_claims),
        share_id=share_id,
        max_steps=max_steps,
    )
    return allocator.allocate(node, labels)
