"""Properties of the structured allocator over generated nodes and claims (hypothesis): no allocation
ever makes the consumed capacity of a device exceed its value or shares an exclusive device; every
allocation found satisfies the class and request selectors, the capacity requests, the counts and the
claim's constraints; and for a one-device request the first fit is the first device that fits alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api import dra
from hami_api.quantity import parse_quantity
from hami_sim.scheduler.dra.allocator import AllocatedState, AllocationMemo, Allocator
from hami_sim.scheduler.dra.inventory import Inventory
from tests.builders import (
    device_class,
    device_request,
    dra_capacity,
    dra_claim,
    hami_gpu_device,
    resource_slice,
)

Json = dict[str, Any]
MIB = 2**20
PRODUCTS = ("A", "B")
UUID = dra.qualified(dra.ATTR_UUID)
PRODUCT = dra.qualified(dra.ATTR_PRODUCT_NAME)
CLASS = device_class()


@st.composite
def gpus(draw: st.DrawFn, index: int) -> Json:
    """A GPU with a random memory size and request policy (valid as the API requires)."""
    shareable = draw(st.booleans())
    step = draw(st.sampled_from((1, 256)))
    units = draw(st.integers(2, 16))
    memory_mib = step * units
    device = hami_gpu_device(
        index, memory_mib=memory_mib, product=draw(st.sampled_from(PRODUCTS)), shareable=shareable
    )
    if shareable:
        minimum = step * draw(st.integers(1, units - 1))
        default = draw(st.sampled_from((memory_mib, minimum)))
        device["capacity"]["memory"] = dra_capacity(
            f"{memory_mib}Mi",
            default=f"{default}Mi",
            minimum=f"{minimum}Mi",
            maximum=f"{memory_mib}Mi",
            step=f"{step}Mi",
        )
        device["capacity"]["cores"] = dra_capacity(
            "100", default=draw(st.sampled_from(("100", "0"))), minimum="0", maximum="100", step="1"
        )
    return device


@st.composite
def requests(draw: st.DrawFn, name: str) -> Json:
    capacity: dict[str, str] = {}
    if draw(st.booleans()):
        capacity["memory"] = f"{draw(st.integers(1, 4096))}Mi"
    if draw(st.booleans()):
        capacity["cores"] = str(draw(st.integers(0, 100)))
    selectors = []
    if draw(st.booleans()):
        selectors.append(
            f"device.attributes['{dra.DRIVER}'].productName == '{draw(st.sampled_from(PRODUCTS))}'"
        )
    return device_request(name, count=draw(st.integers(1, 3)), capacity=capacity or None, selectors=selectors)


@st.composite
def claims(draw: st.DrawFn, name: str) -> Json:
    names = ["r0", "r1"][: draw(st.integers(1, 2))]
    constraints = []
    kind = draw(st.sampled_from(("none", "distinct", "match")))
    if kind == "distinct":
        constraints.append({"requests": names, "distinctAttribute": UUID})
    elif kind == "match":
        constraints.append({"matchAttribute": PRODUCT})
    return dra_claim(name, *(draw(requests(n)) for n in names), constraints=constraints)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Json], list[Json]]:
    devices = [draw(gpus(i)) for i in range(draw(st.integers(1, 4)))]
    return devices, [draw(claims(f"c{i}")) for i in range(draw(st.integers(1, 6)))]


def _q(text: Any) -> Fraction:
    return parse_quantity(text)


def check_allocations(devices: Sequence[Json], allocated: Sequence[Json]) -> None:
    """The invariants over every allocated claim on the node."""
    by_name = {d["name"]: d for d in devices}
    consumed: dict[str, dict[str, Fraction]] = {}
    exclusive: list[str] = []
    for claim in allocated:
        results = claim["status"]["allocation"]["devices"]["results"]
        spec = claim["spec"]["devices"]
        requests = {r["name"]: r["exactly"] for r in spec["requests"]}
        for name, request in requests.items():
            assert sum(1 for r in results if r["request"] == name) == request.get("count", 1)
        for result in results:
            device = by_name[result["device"]]
            request = requests[result["request"]]
            attributes = device["attributes"]
            assert attributes["type"]["string"] == dra.DEVICE_TYPE  # the class selector
            for selector in request.get("selectors", ()):
                wanted = selector["cel"]["expression"].rsplit("'", 2)[-2]
                assert attributes["productName"]["string"] == wanted
            asked = (request.get("capacity") or {}).get("requests") or {}
            if device.get("allowMultipleAllocations"):
                assert result["shareID"]
                assert set(result["consumedCapacity"]) == set(device["capacity"])
                for cap, amount in result["consumedCapacity"].items():
                    assert _q(amount) >= _q(asked.get(cap, "0"))
                    consumed.setdefault(device["name"], {}).setdefault(cap, Fraction(0))
                    consumed[device["name"]][cap] += _q(amount)
            else:
                assert "shareID" not in result and "consumedCapacity" not in result
                for cap, amount in asked.items():
                    assert _q(amount) <= _q(device["capacity"][cap]["value"])
                exclusive.append(device["name"])
        for constraint in spec.get("constraints", ()):
            names = set(constraint.get("requests") or requests)
            picked = [by_name[r["device"]] for r in results if r["request"] in names]
            if "distinctAttribute" in constraint:
                uuids = [d["attributes"]["uuid"]["string"] for d in picked]
                assert len(uuids) == len(set(uuids)), uuids
            else:
                assert len({d["attributes"]["productName"]["string"] for d in picked}) <= 1
    assert len(exclusive) == len(set(exclusive)), exclusive
    for name, caps in consumed.items():
        for cap, total in caps.items():
            assert total <= _q(by_name[name]["capacity"][cap]["value"]), (name, cap, total)


def allocator_for(claims_: Sequence[Json], inventory: Inventory, allocated: Sequence[Json]) -> Allocator:
    counter = itertools.count()
    return Allocator(
        claims_,
        inventory,
        {dra.DEVICE_CLASS: CLASS},
        AllocatedState.of(allocated),
        share_id=lambda: f"s{next(counter)}",
    )


@settings(max_examples=150)
@given(scenarios())
def test_claims_allocated_one_after_another_never_exceed_capacity_and_satisfy_their_claims(
    scenario: tuple[list[Json], list[Json]],
) -> None:
    devices, claims_ = scenario
    inventory = Inventory([resource_slice("n1", *devices)])
    allocated: list[Json] = []
    for claim in claims_:
        outcome = allocator_for([claim], inventory, allocated).allocate("n1")
        if outcome.allocations is not None:
            allocated.append({**claim, "status": {"allocation": outcome.allocations[0]}})
            check_allocations(devices, allocated)


@settings(max_examples=150)
@given(scenarios(), st.integers(0, 3))
def test_a_pod_with_several_claims_gets_all_or_none_and_all_are_valid_together(
    scenario: tuple[list[Json], list[Json]], held: int
) -> None:
    devices, claims_ = scenario
    inventory = Inventory([resource_slice("n1", *devices)])
    allocated: list[Json] = []
    for claim in claims_[:held]:
        outcome = allocator_for([claim], inventory, allocated).allocate("n1")
        if outcome.allocations is not None:
            allocated.append({**claim, "status": {"allocation": outcome.allocations[0]}})
    pod_claims = claims_[held:]
    outcome = allocator_for(pod_claims, inventory, allocated).allocate("n1")
    if outcome.allocations is None:
        return
    assert len(outcome.allocations) == len(pod_claims)
    together = [
        {**c, "status": {"allocation": a}} for c, a in zip(pod_claims, outcome.allocations, strict=True)
    ]
    check_allocations(devices, allocated + together)


def fits_alone(device: Json, request: Mapping[str, Any], state: AllocatedState) -> bool:
    """Whether `device` could serve `request` (count 1) by itself, computed independently."""
    if device["attributes"]["type"]["string"] != dra.DEVICE_TYPE:
        return False
    for selector in request.get("selectors", ()):
        if device["attributes"]["productName"]["string"] != selector["cel"]["expression"].rsplit("'", 2)[-2]:
            return False
    key = (dra.DRIVER, "n1", device["name"])
    asked = (request.get("capacity") or {}).get("requests") or {}
    if not device.get("allowMultipleAllocations"):
        return key not in state.devices and all(
            _q(v) <= _q(device["capacity"][c]["value"]) for c, v in asked.items()
        )
    held = state.consumed(key)
    for cap, spec in device["capacity"].items():
        policy = spec["requestPolicy"]
        low, step = _q(policy["validRange"]["min"]), _q(policy["validRange"]["step"])
        if cap in asked:
            amount = max(low, low + -(-(_q(asked[cap]) - low) // step) * step)
        else:
            amount = _q(policy["default"])
        if amount > _q(policy["validRange"]["max"]) or held.get(cap, 0) + amount > _q(spec["value"]):
            return False
    return True


@settings(max_examples=150)
@given(scenarios(), st.data())
def test_a_single_device_request_takes_the_first_device_that_fits_alone(
    scenario: tuple[list[Json], list[Json]], data: st.DataObject
) -> None:
    devices, claims_ = scenario
    inventory = Inventory([resource_slice("n1", *devices)])
    allocated: list[Json] = []
    for claim in claims_:
        outcome = allocator_for([claim], inventory, allocated).allocate("n1")
        if outcome.allocations is not None:
            allocated.append({**claim, "status": {"allocation": outcome.allocations[0]}})
    request = {**data.draw(requests("r0"))["exactly"], "count": 1}
    probe = dra_claim("probe", {"name": "r0", "exactly": request})
    state = AllocatedState.of(allocated)
    expected = next((d["name"] for d in devices if fits_alone(d, request, state)), None)
    outcome = allocator_for([probe], inventory, allocated).allocate("n1")
    got = None if outcome.allocations is None else outcome.allocations[0]["devices"]["results"][0]["device"]
    assert got == expected


@st.composite
def memo_runs(draw: st.DrawFn) -> tuple[list[list[Json]], list[Json], list[tuple[str, int]]]:
    """Two nodes' devices, claim specs, and steps: a pod of one spec scheduled over both nodes, the
    release of an allocated claim, or a node's slice written anew (other devices)."""
    nodes = [[draw(gpus(i)) for i in range(draw(st.integers(1, 3)))] for _ in range(2)]
    specs = [draw(claims(f"c{i}")) for i in range(draw(st.integers(1, 3)))]
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("pod"), st.integers(0, len(specs) - 1)),
                st.tuples(st.just("release"), st.integers(0, 20)),
                st.tuples(st.just("slice"), st.integers(0, 1)),
            ),
            min_size=1,
            max_size=12,
        )
    )
    return nodes, specs, steps


def share_ids() -> Callable[[], str]:
    """Share IDs s0, s1, ... (two allocators building alike draw alike)."""
    counter = itertools.count()
    return lambda: f"s{next(counter)}"


@settings(max_examples=150, deadline=None)
@given(memo_runs(), st.data())
def test_the_memo_answers_what_a_fresh_search_answers_through_allocations_releases_and_slice_changes(
    run: tuple[list[list[Json]], list[Json], list[tuple[str, int]]], data: st.DataObject
) -> None:
    nodes, specs, steps = run
    names = ["n1", "n2"]
    inventory = Inventory([resource_slice(n, *devices) for n, devices in zip(names, nodes, strict=True)])
    state = AllocatedState()
    memo = AllocationMemo()
    allocated: list[Json] = []
    for number, (kind, index) in enumerate(steps):
        if kind == "release":
            if allocated:
                state.remove(allocated.pop(index % len(allocated)))
            continue
        if kind == "slice":
            fresh = [data.draw(gpus(i)) for i in range(data.draw(st.integers(1, 3)))]
            inventory.set_slice(resource_slice(names[index], *fresh))
            continue
        pod = {**specs[index], "metadata": {"name": f"p{number}", "namespace": "default"}}
        classes = {dra.DEVICE_CLASS: CLASS}
        kept = Allocator([pod], inventory, classes, state, share_id=share_ids(), memo=memo)
        fresh_allocator = Allocator([pod], inventory, classes, state, share_id=share_ids())
        chosen = None
        for node in names:
            a, b = kept.allocate(node), fresh_allocator.allocate(node)
            assert (a.fits, a.reason, a.steps) == (b.fits, b.reason, b.steps)
            assert a.allocations == b.allocations
            if a.allocations is not None and chosen is None:
                chosen = a.allocations[0]
        if chosen is not None:
            claim = {**pod, "status": {"allocation": chosen}}
            state.add(claim)
            allocated.append(claim)
    assert memo.hits + memo.misses > 0 or all(kind != "pod" for kind, _ in steps)
