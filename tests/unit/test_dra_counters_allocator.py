"""Partitionable devices (KEP-4815) in the structured allocator: counter sets, devices that consume them,
allocated devices that hold them, invalid pools, the gate.

Transcribed from kubernetes/dynamic-resource-allocation v0.35.0
`structured/internal/allocatortesting/allocator_testing.go`, `TestAllocator`, the sub-cases named in each
test's docstring (names, devices, counters and expected results as there). Two sub-cases upstream build
their slices with a bare pool name, which gives each slice `resourceSliceCount: 1`: the pool of two
slices is then incomplete and the expected "no result" holds whatever the counters say. Here they are
built with `resourceSliceCount: 2`, so that they test the counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami_sim.scheduler.dra.allocator import (
    REASON_CANNOT_ALLOCATE,
    REASON_INVALID_POOLS,
    AllocatedState,
    Allocator,
    NodeAllocation,
    allocate,
)
from hami_sim.scheduler.dra.inventory import Inventory

Json = dict[str, Any]

DRIVER = "driver-a"
CLASS_A: Json = {
    "metadata": {"name": "class-a"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}
NODE1, NODE2 = "node-1", "node-2"
POOL1, POOL2 = "pool-1", "pool-2"
SET1, SET2 = "counter-set-1", "counter-set-2"


def share_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"share-{next(counter)}"


def counters(values: Mapping[str, str]) -> Json:
    return {name: {"value": value} for name, value in values.items()}


def device(
    name: str,
    consumes: Sequence[tuple[str, Mapping[str, str]]] = (),
    *,
    from_counters: bool = False,
    shared: bool = False,
) -> Json:
    """Upstream's `device(name, capacity, nil).withDeviceCounterConsumption(...)`; `from_counters` gives
    the device a capacity per counter it consumes (upstream's `fromCounters`)."""
    out: Json = {"name": name}
    if consumes:
        out["consumesCounters"] = [{"counterSet": s, "counters": counters(c)} for s, c in consumes]
    if from_counters:
        out["capacity"] = {n: {"value": v} for _, c in consumes for n, v in c.items()}
    if shared:
        out["allowMultipleAllocations"] = True
    return out


def device_slice(name: str, node: str, pool: str, count: int, *devices: Json) -> Json:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
            "devices": list(devices),
        },
    }


def counter_slice(name: str, node: str, pool: str, count: int, *sets: tuple[str, Mapping[str, str]]) -> Json:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
            "sharedCounters": [{"name": s, "counters": counters(c)} for s, c in sets],
        },
    }


def request(name: str, count: int = 1, selector: str = "") -> Json:
    exactly: Json = {"deviceClassName": "class-a", "allocationMode": "ExactCount", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subs: tuple[str, str]) -> Json:
    return {
        "name": name,
        "firstAvailable": [
            {
                "name": sub,
                "deviceClassName": "class-a",
                "allocationMode": "ExactCount",
                "count": 1,
                "selectors": [{"cel": {"expression": expression}}],
            }
            for sub, expression in subs
        ],
    }


def claim(*requests: Json, name: str = "claim-0") -> Json:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": list(requests)}},
    }


def allocated(*devices: tuple[str, str]) -> Json:
    """A claim holding these (pool, device) exclusively (upstream's `allocatedDevices`)."""
    results = [{"request": "r", "driver": DRIVER, "pool": p, "device": d} for p, d in devices]
    return {**claim(name="held"), "status": {"allocation": {"devices": {"results": results}}}}


def memory_at_least(size: str) -> str:
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{size}")) >= 0'


def run(
    claims: Sequence[Json],
    slices: Sequence[Json],
    held: Sequence[Json] = (),
    *,
    node: str = NODE1,
    partitionable: bool = True,
) -> NodeAllocation:
    return allocate(node, claims, slices, [CLASS_A], held, share_id=share_ids(), partitionable=partitionable)


def results(outcome: NodeAllocation) -> list[tuple[str, str, str]]:
    assert outcome.allocations is not None, outcome.reason
    return [
        (r["request"], r["pool"], r["device"]) for a in outcome.allocations for r in a["devices"]["results"]
    ]


MEM4, MEM6 = {"memory": "4Gi"}, {"memory": "6Gi"}
THREE_DEVICES = (
    device("device-1", [(SET1, MEM4)], from_counters=True),
    device("device-2", [(SET1, MEM6)], from_counters=True),
    device("device-3", [(SET1, MEM4)], from_counters=True),
)


def test_partitionable_devices_single_device_is_allocated_within_its_counter_set() -> None:
    """`partitionable-devices-single-device`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, device("device-1", [(SET1, MEM4)])),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    assert results(run([claim(request("req-0"))], slices)) == [("req-0", POOL1, "device-1")]


def test_partitionable_devices_prioritized_list_falls_back_to_the_subrequest_the_counters_allow() -> None:
    """`partitionable-devices-prioritized-list`: req-0 takes device-1 (4Gi of 8Gi), so device-2 (6Gi) no
    longer fits and req-1 gets its second choice, device-3."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, *THREE_DEVICES),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    wanted = claim(
        request("req-0"),
        first_available("req-1", ("subReq-0", memory_at_least("6Gi")), ("subReq-1", memory_at_least("4Gi"))),
    )
    assert results(run([wanted], slices)) == [
        ("req-0", POOL1, "device-1"),
        ("req-1/subReq-1", POOL1, "device-3"),
    ]


def test_partitionable_devices_multiple_devices_skip_the_one_that_would_exceed_the_counter() -> None:
    """`partitionable-devices-multiple-devices`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, *THREE_DEVICES),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    outcome = run([claim(request("req-0"), request("req-1"))], slices)
    assert results(outcome) == [("req-0", POOL1, "device-1"), ("req-1", POOL1, "device-3")]


def test_partitionable_devices_multiple_capacity_pools_every_counter_set_must_fit() -> None:
    """`partitionable-devices-multiple-capacity-pools`: memory would fit device-2, cpus (8) do not."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET1, MEM4), (SET2, {"cpus": "4"})], from_counters=True),
            device("device-2", [(SET1, MEM6), (SET2, {"cpus": "6"})], from_counters=True),
            device("device-3", [(SET1, MEM4), (SET2, {"cpus": "4"})], from_counters=True),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "18Gi"}), (SET2, {"cpus": "8"})),
    ]
    wanted = claim(
        request("req-0"),
        first_available("req-1", ("subReq-0", memory_at_least("6Gi")), ("subReq-1", memory_at_least("4Gi"))),
    )
    assert results(run([wanted], slices)) == [
        ("req-0", POOL1, "device-1"),
        ("req-1/subReq-1", POOL1, "device-3"),
    ]


def test_partitionable_devices_multiple_counters_backtrack_to_a_pair_that_fits() -> None:
    """`partitionable-devices-multiple-counters`: device-1 with any other exceeds set-1's cpus (8), so the
    search backtracks to device-2 + device-3."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device(
                "device-1",
                [(SET1, {"memory": "4Gi", "cpus": "6"}), (SET2, {"cpus": "4", "memory": "2Gi"})],
                from_counters=True,
            ),
            device(
                "device-2",
                [(SET1, {"memory": "6Gi", "cpus": "4"}), (SET2, {"cpus": "6", "memory": "6Gi"})],
                from_counters=True,
            ),
            device(
                "device-3",
                [(SET1, {"memory": "4Gi", "cpus": "4"}), (SET2, {"cpus": "4", "memory": "4Gi"})],
                from_counters=True,
            ),
        ),
        counter_slice(
            "slice-2",
            NODE1,
            POOL1,
            2,
            (SET1, {"cpus": "8", "memory": "18Gi"}),
            (SET2, {"cpus": "12", "memory": "18Gi"}),
        ),
    ]
    outcome = run([claim(request("req-0"), request("req-1"))], slices)
    assert results(outcome) == [("req-0", POOL1, "device-2"), ("req-1", POOL1, "device-3")]


def test_partitionable_devices_multiple_pools_count_counters_held_by_allocated_devices_per_pool() -> None:
    """`partitionable-devices-multiple-pools`: pool-1's counters are used up by its allocated device-2
    and device-3; pool-2's device-1 is allocated, leaving room for device-2 + device-3 there."""

    def pool_devices(second: Mapping[str, str], third: Mapping[str, str]) -> list[Json]:
        return [
            device("device-1", [(SET1, {"cpus": "6", "memory": "4Gi"})], from_counters=True),
            device("device-2", [(SET1, second)], from_counters=True),
            device("device-3", [(SET1, third)], from_counters=True),
        ]

    total = (SET1, {"cpus": "8", "memory": "18Gi"})
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            *pool_devices({"cpus": "4", "memory": "6Gi"}, {"cpus": "4", "memory": "4Gi"}),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, total),
        device_slice(
            "slice-3",
            NODE1,
            POOL2,
            2,
            *pool_devices({"cpus": "1", "memory": "7Gi"}, {"cpus": "1", "memory": "7Gi"}),
        ),
        counter_slice("slice-4", NODE1, POOL2, 2, total),
    ]
    held = [allocated((POOL1, "device-2"), (POOL1, "device-3"), (POOL2, "device-1"))]
    outcome = run([claim(request("req-0"), request("req-1"))], slices, held)
    assert results(outcome) == [("req-0", POOL2, "device-2"), ("req-1", POOL2, "device-3")]


def test_partitionable_devices_unused_counters_in_counter_set_do_not_matter() -> None:
    """`partitionable-devices-unused-counters-in-counter-set`."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET1, {"memory": "5Gi"})]),
            device("device-2", [(SET1, MEM4)]),
            device("device-3", [(SET1, MEM4)]),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi", "unused": "1Gi"})),
    ]
    outcome = run([claim(request("req-0", count=2))], slices)
    assert results(outcome) == [("req-0", POOL1, "device-2"), ("req-0", POOL1, "device-3")]


def test_partitionable_devices_no_capacity_available_when_an_allocated_device_holds_the_counters() -> None:
    """`partitionable-devices-no-capacity-available` (with a complete pool, see the module docstring):
    device-2 holds 16Gi of 18Gi, device-1 needs 4Gi."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET1, MEM4)], from_counters=True),
            device("device-2", [(SET1, {"memory": "16Gi"})], from_counters=True),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "18Gi"})),
    ]
    outcome = run([claim(request("req-0"))], slices, [allocated((POOL1, "device-2"))])
    assert (outcome.allocations, outcome.reason) == (None, REASON_CANNOT_ALLOCATE)


def test_partitionable_devices_overallocated_capacity_pool_blocks_every_device_of_the_pool() -> None:
    """`partitionable-devices-overallocated-capacity-pool` (complete pool): device-2 holds 20Gi of 18Gi;
    the overdrawn counter blocks device-1 too."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET1, MEM4)], from_counters=True),
            device("device-2", [(SET1, {"memory": "20Gi"})], from_counters=True),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "18Gi"})),
    ]
    outcome = run([claim(request("req-0"))], slices, [allocated((POOL1, "device-2"))])
    assert (outcome.allocations, outcome.reason) == (None, REASON_CANNOT_ALLOCATE)


def test_overdrawn_counter_in_one_set_blocks_devices_consuming_another_set_of_the_pool() -> None:
    """Upstream's check walks every counter of the pool, not only the device's: an overdrawn set-1
    blocks a device of set-2 in the same pool (kept as upstream does)."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET2, MEM4)]),
            device("device-2", [(SET1, {"memory": "20Gi"})]),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "18Gi"}), (SET2, {"memory": "8Gi"})),
    ]
    outcome = run([claim(request("req-0"))], slices, [allocated((POOL1, "device-2"))])
    assert outcome.allocations is None


def test_partitionable_devices_disabled_device_consumes_counters_is_never_allocated() -> None:
    """`partitionable-devices-disabled-device-consumes-counters` (gate off)."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 1, device("device-1", [(SET1, MEM4)])),
        counter_slice("slice-2", NODE1, POOL1, 1, (SET1, {"memory": "18Gi"})),
    ]
    assert run([claim(request("req-0"))], slices, partitionable=False).allocations is None


def test_partitionable_devices_disabled_other_device_do_not_consume_counters_is_allocated() -> None:
    """`partitionable-devices-disabled-other-device-do-not-consume-counters` (gate off): the counter
    slice is skipped but still counts for the pool's completeness."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, device("device-1", [(SET1, MEM4)]), device("device-2")),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "18Gi"})),
    ]
    outcome = run([claim(request("req-0"))], slices, partitionable=False)
    assert results(outcome) == [("req-0", POOL1, "device-2")]


def test_partitionable_devices_same_counter_set_name_in_different_resource_slices_is_an_invalid_pool() -> (
    None
):
    """`partitionable-devices-same-counter-set-name-in-different-resource-slices`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 4, device("device-1")),
        counter_slice("slice-2", NODE1, POOL1, 4, (SET1, {"memory": "1"})),
        device_slice("slice-3", NODE1, POOL1, 4, device("device-2")),
        counter_slice("slice-4", NODE1, POOL1, 4, (SET1, {"memory": "1"})),
    ]
    outcome = run([claim(request("req-0"))], slices)
    assert (outcome.allocations, outcome.reason) == (None, REASON_INVALID_POOLS)


def test_partitionable_devices_device_counter_consumption_references_unknown_counter_set_is_invalid() -> None:
    """`partitionable-devices-device-counter-consumption-references-unknown-counter-set`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, device("device-1", [(SET2, MEM4)])),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    assert run([claim(request("req-0"))], slices).reason == REASON_INVALID_POOLS


def test_partitionable_devices_device_counter_consumption_references_unknown_counter_is_invalid() -> None:
    """`partitionable-devices-device-counter-consumption-references-unknown-counter-in-counter-set`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, device("device-1", [(SET1, {"memory": "8Gi"})])),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"other-memory": "8Gi"})),
    ]
    assert run([claim(request("req-0"))], slices).reason == REASON_INVALID_POOLS


def test_partitionable_devices_device_counter_consumption_references_counter_set_in_other_pool() -> None:
    """`partitionable-devices-device-counter-consumption-references-counter-set-in-other-pool`."""
    slices = [
        device_slice("slice-1", NODE1, POOL1, 1, device("device-1", [(SET1, {"memory": "8Gi"})])),
        counter_slice("slice-2", NODE1, POOL2, 1, (SET1, {"memory": "8Gi"})),
    ]
    assert run([claim(request("req-0"))], slices).reason == REASON_INVALID_POOLS


def test_partitionable_devices_devices_on_different_nodes_consume_same_counter_set() -> None:
    """`partitionable-devices-devices-on-different-nodes-consume-same-counter-set`: device-3 (node-2's
    slice) is allocated and holds 6Gi of the shared 8Gi, so node-1 gets the 2Gi device."""
    slices = [
        counter_slice("slice-1", NODE1, POOL1, 3, (SET1, {"memory": "8Gi"})),
        device_slice(
            "slice-2",
            NODE1,
            POOL1,
            3,
            device("device-1", [(SET1, MEM6)], from_counters=True),
            device("device-2", [(SET1, {"memory": "2Gi"})], from_counters=True),
        ),
        device_slice("slice-3", NODE2, POOL1, 3, device("device-3", [(SET1, MEM6)])),
    ]
    wanted = claim(
        first_available("req-0", ("subReq-0", memory_at_least("6Gi")), ("subReq-1", memory_at_least("2Gi")))
    )
    outcome = run([wanted], slices, [allocated((POOL1, "device-3"))])
    assert results(outcome) == [("req-0/subReq-1", POOL1, "device-2")]


def test_partitionable_devices_validation_error_on_non_targeting_slice_makes_the_pool_invalid() -> None:
    """`partitionable-devices-validation-error-on-non-targeting-slice`."""
    slices = [
        counter_slice("slice-1", NODE1, POOL1, 3, (SET1, {"memory": "8Gi"})),
        device_slice("slice-2", NODE1, POOL1, 3, device("device-1", [(SET1, MEM6)], from_counters=True)),
        device_slice("slice-3", NODE2, POOL1, 3, device("device-3", [(SET2, MEM6)])),
    ]
    assert run([claim(request("req-0"))], slices).reason == REASON_INVALID_POOLS


def test_allow_multiple_allocations_with_partitionable_device_consumes_counters_once_per_device() -> None:
    """`allow-multiple-allocations-with-partitionable-device`: req-0 shares device-1 (4Gi of the 8Gi
    counter); device-2 (6Gi) would exceed the counter and device-1 has no capacity left, so req-1 gets
    device-3."""
    shared = [
        device("device-1", [(SET1, MEM4)], from_counters=True, shared=True),
        device("device-2", [(SET1, MEM6)], from_counters=True, shared=True),
        device("device-3", [(SET1, MEM4)], from_counters=True, shared=True),
    ]
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, *shared),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    wanted = claim(
        request("req-0"),
        first_available("req-1", ("subReq-0", memory_at_least("6Gi")), ("subReq-1", memory_at_least("4Gi"))),
    )
    outcome = run([wanted], slices)
    assert results(outcome) == [("req-0", POOL1, "device-1"), ("req-1/subReq-1", POOL1, "device-3")]
    assert outcome.allocations is not None
    consumed = [r["consumedCapacity"] for r in outcome.allocations[0]["devices"]["results"]]
    assert consumed == [{"memory": "4Gi"}, {"memory": "4Gi"}]


# --- beyond the transcribed cases --------------------------------------------------------------------


def test_shared_device_with_an_allocated_share_holds_its_counters_for_other_claims() -> None:
    """kubernetes/dynamic-resource-allocation 89c46e8 ("account for shared devices when rebuilding
    counters"): a shared device allocated to another claim holds its counters."""
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("device-1", [(SET1, MEM6)], from_counters=True, shared=True),
            device("device-2", [(SET1, MEM4)], from_counters=True),
        ),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    held = {
        **claim(name="held"),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": DRIVER,
                            "pool": POOL1,
                            "device": "device-1",
                            "shareID": "s",
                            "consumedCapacity": {"memory": "1Gi"},
                        }
                    ]
                }
            }
        },
    }
    selector = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("4Gi")) == 0'
    outcome = run([claim(request("req-0", selector=selector))], slices, [held])
    assert (outcome.allocations, outcome.reason) == (None, REASON_CANNOT_ALLOCATE)


def test_a_device_refused_by_its_taint_gives_its_counters_back_for_the_next_candidate() -> None:
    """Upstream takes a device's counters before the taint check and keeps them when the taint refuses
    it; here the tainted 6Gi device leaves the 8Gi counter whole for the 6Gi device after it."""
    tainted = device("device-1", [(SET1, MEM6)])
    tainted["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    slices = [
        device_slice("slice-1", NODE1, POOL1, 2, tainted, device("device-2", [(SET1, MEM6)])),
        counter_slice("slice-2", NODE1, POOL1, 2, (SET1, {"memory": "8Gi"})),
    ]
    assert results(run([claim(request("req-0"))], slices)) == [("req-0", POOL1, "device-2")]


def test_counters_are_free_again_once_the_holding_claim_is_removed_from_the_allocated_state() -> None:
    slices = [
        device_slice(
            "slice-1",
            NODE1,
            POOL1,
            2,
            device("full", [(SET1, {"memory": "8Gi", "memory-slice-0": "1", "memory-slice-1": "1"})]),
            device("half-0", [(SET1, {"memory": "4Gi", "memory-slice-0": "1"})]),
            device("half-1", [(SET1, {"memory": "4Gi", "memory-slice-1": "1"})]),
        ),
        counter_slice(
            "slice-2",
            NODE1,
            POOL1,
            2,
            (SET1, {"memory": "8Gi", "memory-slice-0": "1", "memory-slice-1": "1"}),
        ),
    ]
    inventory = Inventory(slices)
    state = AllocatedState()
    holder = allocated((POOL1, "half-0"))
    state.add(holder)
    wanted = [claim(request("req-0"))]

    def outcome() -> NodeAllocation:
        return Allocator(wanted, inventory, {"class-a": CLASS_A}, state, share_id=share_ids()).allocate(NODE1)

    assert results(outcome()) == [("req-0", POOL1, "half-1")]
    state.remove(holder)
    assert results(outcome()) == [("req-0", POOL1, "full")]


def test_devices_of_a_counter_slice_are_not_allocatable() -> None:
    """`buildPool`: a slice with counter sets is a counter slice (1.34's combined layout is not read)."""
    combined = counter_slice("slice-1", NODE1, POOL1, 1, (SET1, {"memory": "8Gi"}))
    combined["spec"]["devices"] = [device("device-1", [(SET1, MEM4)])]
    assert run([claim(request("req-0"))], [combined]).allocations is None
