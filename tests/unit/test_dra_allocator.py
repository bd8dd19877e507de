"""The structured allocator (hami_sim.scheduler.dra.allocator) as kube-scheduler's DynamicResources
plugin runs it per node: pools, first fit with backtracking, consumable capacity with request policies,
exclusive and shared devices, constraints, taints, firstAvailable, All, admin access, results, errors."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_api import dra
from hami_control.dra_translate import type_selector, uuid_selector
from hami_sim.scheduler.dra.allocator import (
    REASON_CANNOT_ALLOCATE,
    REASON_INVALID_POOLS,
    REASON_TIMED_OUT,
    AllocatedState,
    AllocationError,
    NodeAllocation,
    allocate,
)
from hami_sim.scheduler.dra.inventory import Inventory
from tests.builders import (
    device_class,
    device_request,
    dra_capacity,
    dra_claim,
    gpu_share,
    hami_gpu_device,
    resource_slice,
)

Json = dict[str, Any]
CLASS = device_class()
UUID = dra.qualified(dra.ATTR_UUID)
PRODUCT = dra.qualified(dra.ATTR_PRODUCT_NAME)


def share_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"share-{next(counter)}"


def run(
    claims: Sequence[Json],
    slices: Sequence[Json] | None = None,
    *,
    node: str = "n1",
    allocated: Sequence[Json] = (),
    classes: Sequence[Json] = (CLASS,),
    **options: Any,
) -> NodeAllocation:
    return allocate(
        node,
        claims,
        slices if slices is not None else [resource_slice("n1")],
        classes,
        allocated,
        share_id=share_ids(),
        **options,
    )


def devices_of(outcome: NodeAllocation) -> list[list[str]]:
    assert outcome.allocations is not None, outcome.reason
    return [[r["device"] for r in a["devices"]["results"]] for a in outcome.allocations]


def with_allocation(claim: Json, outcome: NodeAllocation, index: int = 0) -> Json:
    assert outcome.allocations is not None, outcome.reason
    return {**claim, "status": {"allocation": outcome.allocations[index]}}


def gpu_name(i: int) -> str:
    return dra.device_name(i)


# --- results -------------------------------------------------------------------------------------------


def test_a_share_lands_on_the_first_gpu_with_its_capacity_and_a_share_id() -> None:
    outcome = run([dra_claim("a", gpu_share("4000Mi", "30"))])
    assert outcome.allocations == [
        {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": dra.DRIVER,
                        "pool": "n1",
                        "device": gpu_name(0),
                        "shareID": "share-0",
                        "consumedCapacity": {"memory": "4000Mi", "cores": "30"},
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        }
    ]


def test_exclusive_devices_get_no_share_id_and_no_consumed_capacity() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, shareable=False))]
    outcome = run([dra_claim("a")], slices)
    assert outcome.allocations is not None
    assert outcome.allocations[0]["devices"]["results"] == [
        {"request": "gpu", "driver": dra.DRIVER, "pool": "n1", "device": gpu_name(0)}
    ]


def test_config_comes_from_the_class_then_from_the_claim_for_chosen_requests() -> None:
    opaque = {"opaque": {"driver": dra.DRIVER, "parameters": {"kind": "X"}}}
    cls = device_class(dra.DEVICE_CLASS, config=[opaque])
    claim = dra_claim(
        "a",
        gpu_share(name="one"),
        gpu_share(name="two"),
        config=[{"requests": ["two"], **opaque}, {**opaque}, {"requests": ["absent"], **opaque}],
    )
    outcome = run([claim], classes=[cls])
    assert outcome.allocations is not None
    assert outcome.allocations[0]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["one", "two"], **opaque},
        {"source": "FromClaim", "requests": ["two"], **opaque},
        {"source": "FromClaim", **opaque},
    ]


def test_slices_for_all_nodes_or_a_node_selector_give_the_selector_not_the_node() -> None:
    selector = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
    }
    slices = [resource_slice(None, hami_gpu_device(0), pool="zone-a", node_selector=selector)]
    outcome = allocate("n1", [dra_claim("a")], slices, [CLASS], labels={"zone": "a"})
    assert outcome.allocations is not None
    assert outcome.allocations[0]["nodeSelector"] == selector
    assert allocate("n2", [dra_claim("a")], slices, [CLASS], labels={"zone": "b"}).allocations is None
    everywhere = [resource_slice(None, hami_gpu_device(0), pool="net", all_nodes=True)]
    outcome = allocate("n9", [dra_claim("a")], everywhere, [CLASS])
    assert outcome.allocations is not None and "nodeSelector" not in outcome.allocations[0]


# --- consumable capacity --------------------------------------------------------------------------------


def test_a_claim_without_capacity_requests_takes_the_defaults_the_whole_gpu() -> None:
    first = dra_claim("a")
    outcome = run([first])
    assert outcome.allocations is not None
    assert outcome.allocations[0]["devices"]["results"][0]["consumedCapacity"] == {
        "memory": "80Gi",
        "cores": "100",
    }
    assert devices_of(run([dra_claim("b")], allocated=[with_allocation(first, outcome)])) == [[gpu_name(1)]]


def test_requests_round_up_to_the_policy_step_and_up_to_its_minimum() -> None:
    device = hami_gpu_device(0)
    device["capacity"]["memory"] = dra_capacity(
        "8Gi", default="8Gi", minimum="1Gi", maximum="8Gi", step="512Mi"
    )
    slices = [resource_slice("n1", device)]
    consumed = run([dra_claim("a", gpu_share("1100Mi", "0"))], slices).allocations
    assert consumed is not None
    assert consumed[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "1536Mi", "cores": "0"}
    consumed = run([dra_claim("a", gpu_share("1", "0"))], slices).allocations
    assert consumed is not None
    assert consumed[0]["devices"]["results"][0]["consumedCapacity"]["memory"] == "1Gi"


def test_valid_values_take_the_smallest_value_at_least_the_request_and_refuse_above_them() -> None:
    device = hami_gpu_device(0)
    device["capacity"]["cores"] = dra_capacity("100", default="100", valid_values=["25", "50", "100"])
    slices = [resource_slice("n1", device)]
    consumed = run([dra_claim("a", gpu_share("1Gi", "30"))], slices).allocations
    assert consumed is not None
    assert consumed[0]["devices"]["results"][0]["consumedCapacity"]["cores"] == "50"
    assert run([dra_claim("a", gpu_share("1Gi", "101"))], slices).reason == REASON_CANNOT_ALLOCATE


def test_a_request_above_the_policy_maximum_skips_the_device() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, memory_mib=16384), hami_gpu_device(1))]
    assert devices_of(run([dra_claim("a", gpu_share("20Gi", "10"))], slices)) == [[gpu_name(1)]]


def test_shares_fill_a_gpu_until_the_sum_of_consumed_capacity_would_exceed_it() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, memory_mib=10240))]
    held: list[Json] = []
    for name in ("a", "b", "c"):
        claim = dra_claim(name, gpu_share("3Gi", "30"))
        outcome = run([claim], slices, allocated=held)
        assert devices_of(outcome) == [[gpu_name(0)]]
        held.append(with_allocation(claim, outcome))
    assert (
        run([dra_claim("d", gpu_share("2Gi", "5"))], slices, allocated=held).reason == REASON_CANNOT_ALLOCATE
    )
    assert devices_of(run([dra_claim("d", gpu_share("1Gi", "10"))], slices, allocated=held)) == [
        [gpu_name(0)]
    ]


def test_shares_of_one_pod_count_against_each_other() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0), hami_gpu_device(1))]
    claims = [dra_claim(n, gpu_share("1Gi", "60")) for n in ("a", "b", "c")]
    outcome = run(claims[:2], slices)
    assert devices_of(outcome) == [[gpu_name(0)], [gpu_name(1)]]
    assert run(claims, slices).reason == REASON_CANNOT_ALLOCATE


def test_a_capacity_the_device_does_not_have_skips_it() -> None:
    other = hami_gpu_device(0)
    other["capacity"] = {"memory": other["capacity"]["memory"]}
    slices = [resource_slice("n1", other, hami_gpu_device(1))]
    assert devices_of(run([dra_claim("a", gpu_share("1Gi", "10"))], slices)) == [[gpu_name(1)]]


def test_a_capacity_request_on_an_exclusive_device_is_a_filter() -> None:
    slices = [
        resource_slice(
            "n1", hami_gpu_device(0, shareable=False, memory_mib=16384), hami_gpu_device(1, shareable=False)
        )
    ]
    claim = dra_claim("a", device_request(capacity={"memory": "40Gi"}))
    assert devices_of(run([claim], slices)) == [[gpu_name(1)]]


# --- exclusive and shared devices ---------------------------------------------------------------------


def test_an_exclusive_device_held_by_another_claim_is_in_use() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, shareable=False), hami_gpu_device(1, shareable=False))]
    first = dra_claim("a")
    outcome = run([first], slices)
    assert devices_of(outcome) == [[gpu_name(0)]]
    assert devices_of(run([dra_claim("b")], slices, allocated=[with_allocation(first, outcome)])) == [
        [gpu_name(1)]
    ]


def test_an_exclusive_device_is_never_picked_twice_for_one_claim() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, shareable=False))]
    assert run([dra_claim("a", device_request(count=2))], slices).reason == REASON_CANNOT_ALLOCATE


def test_a_shareable_device_may_serve_two_devices_of_one_request_unless_distinct() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0), hami_gpu_device(1, memory_mib=1024))]
    twice = dra_claim("a", gpu_share("2Gi", "10", count=2))
    assert devices_of(run([twice], slices)) == [[gpu_name(0), gpu_name(0)]]
    distinct = dra_claim(
        "a", gpu_share("2Gi", "10", count=2), constraints=[{"requests": ["gpu"], "distinctAttribute": UUID}]
    )
    assert run([distinct], slices).reason == REASON_CANNOT_ALLOCATE
    small = dra_claim("a", gpu_share("512Mi", "10", count=2), constraints=[{"distinctAttribute": UUID}])
    assert devices_of(run([small], slices)) == [[gpu_name(0), gpu_name(1)]]


def test_distinct_attribute_holds_for_every_device_of_a_request_not_only_the_last() -> None:
    slices = [resource_slice("n1", *(hami_gpu_device(i) for i in range(3)))]
    claim = dra_claim(
        "a", gpu_share("1Gi", "10", count=4), constraints=[{"requests": ["gpu"], "distinctAttribute": UUID}]
    )
    assert run([claim], slices).reason == REASON_CANNOT_ALLOCATE
    three = dra_claim("a", gpu_share("1Gi", "10", count=3), constraints=[{"distinctAttribute": UUID}])
    assert devices_of(run([three], slices)) == [[gpu_name(0), gpu_name(1), gpu_name(2)]]


def test_match_attribute_backtracks_to_a_device_the_other_request_can_share() -> None:
    slices = [
        resource_slice(
            "n1",
            hami_gpu_device(0, product="NVIDIA-A100"),
            hami_gpu_device(1, product="NVIDIA-H100"),
            hami_gpu_device(2, product="NVIDIA-H100", shareable=False),
        )
    ]
    claim = dra_claim(
        "a",
        device_request("any"),
        device_request("h100", selectors=[f"device.attributes['{dra.DRIVER}'].productName == 'NVIDIA-H100'"]),
        constraints=[{"requests": ["any", "h100"], "matchAttribute": PRODUCT}],
    )
    outcome = run([claim], slices)
    # "any" takes gpu_name(0) first; "h100" then finds no A100 and the search backtracks. gpu_name(1) is full
    # after "any" (no capacity requests: the defaults are the whole GPU), so "h100" gets gpu_name(2).
    assert devices_of(outcome) == [[gpu_name(1), gpu_name(2)]]
    assert outcome.steps > 6


# --- taints -----------------------------------------------------------------------------------------


TAINT = {"key": "hami.io/xid", "value": "79", "effect": "NoSchedule"}


def test_a_tainted_device_is_skipped_unless_the_request_tolerates_it() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, taints=[TAINT]), hami_gpu_device(1))]
    assert devices_of(run([dra_claim("a")], slices)) == [[gpu_name(1)]]
    for toleration in (
        {"key": "hami.io/xid", "operator": "Exists"},
        {"key": "hami.io/xid", "operator": "Equal", "value": "79", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ):
        tolerant = dra_claim("a", device_request(tolerations=[toleration]))
        outcome = run([tolerant], slices)
        assert devices_of(outcome) == [[gpu_name(0)]], toleration
        assert outcome.allocations is not None
        assert outcome.allocations[0]["devices"]["results"][0]["tolerations"] == [toleration]
    for wrong in ({"key": "hami.io/xid", "value": "48"}, {"operator": "Exists", "effect": "NoExecute"}):
        assert devices_of(run([dra_claim("a", device_request(tolerations=[wrong]))], slices)) == [
            [gpu_name(1)]
        ]


def test_no_execute_taints_block_and_none_effect_taints_do_not() -> None:
    no_execute = {**TAINT, "effect": "NoExecute"}
    none = {**TAINT, "effect": "None"}
    slices = [
        resource_slice("n1", hami_gpu_device(0, taints=[no_execute]), hami_gpu_device(1, taints=[none]))
    ]
    assert devices_of(run([dra_claim("a")], slices)) == [[gpu_name(1)]]


# --- firstAvailable, All, admin access ---------------------------------------------------------------------


def test_first_available_takes_the_first_sub_request_that_fits_and_names_it() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, memory_mib=16384))]
    claim = dra_claim(
        "a",
        device_request(
            "gpu",
            first_available=[gpu_share("40Gi", "50", name="big"), gpu_share("8Gi", "50", name="small")],
        ),
    )
    outcome = run([claim], slices)
    assert outcome.allocations is not None
    result = outcome.allocations[0]["devices"]["results"][0]
    assert (result["request"], result["consumedCapacity"]["memory"]) == ("gpu/small", "8Gi")


def test_allocation_mode_all_takes_every_matching_device_or_nothing() -> None:
    slices = [resource_slice("n1", *(hami_gpu_device(i, shareable=False) for i in range(3)))]
    claim = dra_claim("a", device_request(mode="All"))
    assert devices_of(run([claim], slices)) == [[gpu_name(0), gpu_name(1), gpu_name(2)]]
    other = dra_claim("b")
    taken = with_allocation(other, run([other], slices))
    assert run([claim], slices, allocated=[taken]).reason == REASON_CANNOT_ALLOCATE


def test_allocation_mode_all_refuses_an_incomplete_pool() -> None:
    slices = [resource_slice("n1", slice_count=2)]
    with pytest.raises(
        AllocationError, match=r"asks for all devices, but resource pool .*/n1 is currently being updated"
    ):
        run([dra_claim("a", device_request(mode="All"))], slices)


def test_admin_access_takes_a_device_in_use_and_holds_nothing() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0, shareable=False))]
    first = dra_claim("a")
    held = with_allocation(first, run([first], slices))
    admin = dra_claim("b", device_request(admin=True))
    outcome = run([admin], slices, allocated=[held])
    assert outcome.allocations is not None
    assert outcome.allocations[0]["devices"]["results"][0]["adminAccess"] is True
    state = AllocatedState.of([with_allocation(admin, outcome)])
    assert state.devices == {} and state.capacity == {}


# --- pools ----------------------------------------------------------------------------------------


def test_only_slices_of_the_node_and_of_the_newest_generation_count() -> None:
    old = resource_slice("n1", hami_gpu_device(0), name="old", generation=1)
    new = resource_slice("n1", hami_gpu_device(5), name="new", generation=2)
    elsewhere = resource_slice("n2", hami_gpu_device(7))
    assert devices_of(run([dra_claim("a")], [old, new, elsewhere])) == [[gpu_name(5)]]
    assert run([dra_claim("a")], [elsewhere]).reason == REASON_CANNOT_ALLOCATE


def test_an_incomplete_pool_gives_nothing_and_a_newer_generation_elsewhere_obsoletes_it() -> None:
    half = resource_slice("n1", hami_gpu_device(0), name="half", slice_count=2)
    assert run([dra_claim("a")], [half]).reason == REASON_CANNOT_ALLOCATE
    other_half = resource_slice("n2", hami_gpu_device(1), name="other", pool="n1", slice_count=2)
    assert devices_of(run([dra_claim("a")], [half, other_half])) == [[gpu_name(0)]]
    newer = resource_slice("n2", hami_gpu_device(1), name="newer", pool="n1", generation=2)
    assert run([dra_claim("a")], [half, newer]).reason == REASON_CANNOT_ALLOCATE


def test_duplicate_device_names_make_the_pool_invalid() -> None:
    slices = [resource_slice("n1", hami_gpu_device(0), hami_gpu_device(0))]
    assert run([dra_claim("a")], slices).reason == REASON_INVALID_POOLS


def test_an_unreadable_slice_makes_its_pool_invalid() -> None:
    device = hami_gpu_device(0)
    device["capacity"]["memory"]["value"] = "lots"
    assert run([dra_claim("a")], [resource_slice("n1", device)]).reason == REASON_INVALID_POOLS


def test_the_inventory_reuses_unchanged_slices_and_drops_deleted_ones() -> None:
    inventory = Inventory([resource_slice("n1", resource_version="1")])
    first = inventory.pools("n1")[0].slices[0]
    assert not inventory.set_slice(resource_slice("n1", resource_version="1"))
    assert inventory.pools("n1")[0].slices[0] is first
    assert inventory.set_slice(resource_slice("n1", hami_gpu_device(3), resource_version="2"))
    assert [d.name for d in inventory.pools("n1")[0].slices[0].devices] == [gpu_name(3)]
    assert inventory.delete_slice(f"n1-{dra.DRIVER}")
    assert inventory.pools("n1") == []


# --- errors -----------------------------------------------------------------------------------------


def test_a_selector_error_fails_allocation_in_kube_words() -> None:
    claim = dra_claim(
        "a", device_request(selectors=["device.attributes['x.io'].missing == 1"]), namespace="ns"
    )
    with pytest.raises(AllocationError) as err:
        run([claim])
    assert str(err.value) == "claim ns/a: selector #0: CEL runtime error: no such key: missing"
    broken = device_class(dra.DEVICE_CLASS, "device.driver")
    with pytest.raises(AllocationError) as err:
        run([dra_claim("a")], classes=[broken])
    assert str(err.value) == (
        f"class {dra.DEVICE_CLASS}: selector #0: CEL runtime error: "
        "CEL result of type string could not be converted to bool"
    )


def test_a_missing_device_class_and_too_many_devices_are_errors() -> None:
    with pytest.raises(
        AllocationError,
        match=r'could not retrieve device class gone: deviceclass\.resource\.k8s\.io "gone" not found',
    ):
        run([dra_claim("a", device_request(device_class_name="gone"))])
    with pytest.raises(AllocationError, match="number of requested devices 33 exceeds the claim limit of 32"):
        run([dra_claim("a", device_request(count=33))])


def test_a_search_that_runs_out_of_steps_reports_kube_timeout_reason() -> None:
    slices = [resource_slice("n1", *(hami_gpu_device(i) for i in range(8)))]
    claims = [dra_claim(f"c{i}", gpu_share("1Gi", "60")) for i in range(9)]
    outcome = run(claims, slices, max_steps=5_000)
    assert (outcome.allocations, outcome.reason) == (None, REASON_TIMED_OUT)


# --- allocated state ------------------------------------------------------------------------------------


def test_allocated_state_sums_shares_and_forgets_removed_claims() -> None:
    claims = [dra_claim(n, gpu_share("3Gi", "30")) for n in ("a", "b")]
    held = [with_allocation(c, run([c], allocated=[])) for c in claims]
    state = AllocatedState.of(held)
    key = (dra.DRIVER, "n1", gpu_name(0))
    assert state.consumed(key) == {"memory": 6 * 2**30, "cores": 60}
    state.remove(held[0])
    assert state.consumed(key) == {"memory": 3 * 2**30, "cores": 30}
    state.remove(held[1])
    assert key not in state.capacity


# --- what the project ships: the DeviceClass, the examples, the webhook's selectors -----------------------

REPO = Path(__file__).resolve().parents[2]


def shipped(path: str) -> list[Json]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def test_the_shipped_device_class_and_the_example_templates_allocate_as_their_comments_say() -> None:
    (cls,) = shipped("daemonset/overlays/dra/deviceclass.yaml")
    slices = [
        resource_slice(
            "n1",
            hami_gpu_device(0, product="NVIDIA-A100-SXM4-80GB"),
            hami_gpu_device(1, product="NVIDIA-A100-SXM4-80GB"),
        )
    ]
    templates = {
        d["metadata"]["name"]: d
        for path in sorted((REPO / "examples" / "dra").glob("*.yaml"))
        for d in shipped(f"examples/dra/{path.name}")
        if d["kind"] == "ResourceClaimTemplate"
    }
    assert set(templates) >= {"gpu-4000mi-30c", "gpu-whole", "two-gpus-8000mi-50c"}

    def results(template: str) -> list[Json]:
        claim = {
            "metadata": {"name": template, "namespace": "dra-demo"},
            "spec": templates[template]["spec"]["spec"],
        }
        outcome = allocate("n1", [claim], slices, [cls], share_id=share_ids())
        assert outcome.allocations is not None, outcome.reason
        found: list[Json] = outcome.allocations[0]["devices"]["results"]
        return found

    (share,) = results("gpu-4000mi-30c")
    assert share["consumedCapacity"] == {"memory": "4000Mi", "cores": "30"}
    (whole,) = results("gpu-whole")
    assert whole["consumedCapacity"] == {"memory": "80Gi", "cores": "100"}
    two = results("two-gpus-8000mi-50c")
    assert [(r["device"], r["consumedCapacity"]) for r in two] == [
        (gpu_name(0), {"memory": "8000Mi", "cores": "50"}),
        (gpu_name(1), {"memory": "8000Mi", "cores": "50"}),
    ]


def test_the_webhooks_annotation_selectors_pick_the_gpus_hami_would() -> None:
    slices = [
        resource_slice(
            "n1",
            hami_gpu_device(0, product="Tesla T4", uuid="GPU-a"),
            hami_gpu_device(1, product="NVIDIA-A100-SXM4-80GB", uuid="GPU-b"),
            hami_gpu_device(2, product="Tésla V100", uuid="GPU-c"),
        )
    ]

    def picked(selector: str) -> str | None:
        outcome = run([dra_claim("a", device_request(selectors=[selector]))], slices)
        return (
            None if outcome.allocations is None else outcome.allocations[0]["devices"]["results"][0]["device"]
        )

    assert picked(type_selector(["a100"], use=True)) == gpu_name(1)
    assert (
        picked(type_selector(["TÉSLA"], use=True)) is None
    )  # lowerAscii leaves É alone, as HAMi's ToUpper does not
    assert picked(type_selector(["tésla"], use=True)) == gpu_name(2)
    assert picked(type_selector(["t4", "a100"], use=False)) == gpu_name(2)
    assert picked(uuid_selector(["GPU-c"], use=True)) == gpu_name(2)
    assert picked(uuid_selector(["GPU-a", "GPU-b"], use=False)) == gpu_name(2)
