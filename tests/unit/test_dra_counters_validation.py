"""The API server stand-in's rules for partitionable devices (KEP-4815) in ResourceSlices: `sharedCounters`
and `consumesCounters` validated as kube-apiserver's `pkg/apis/resource/validation/validation.go`
(`validateResourceSliceSpec`, `validateCounterSet`, `validateDeviceCounterConsumption`; limits from
`k8s.io/api/resource/v1/types.go`), and the `DRAPartitionableDevices` gate as `resourceslice/strategy.go`'s
`dropDisabledDRAPartitionableDevicesFields` treats it.

Sub-cases transcribed from kubernetes `pkg/apis/resource/validation/validation_resourceslice_test.go`,
`TestValidateResourceSlice`: `bad-name-shared-counters`, `bad-countername-shared-counters`,
`missing-name-shared-counters`, `duplicate-shared-counters`, `missing-counterset-consumes-counter` (its
second error, "must reference a counterSet defined in the ResourceSlice sharedCounters", is 1.33/1.34's
in-slice check, gone since 1.35 split the sets into their own slice), `missing-counter-consumes-counter`.
The size cases follow today's validation.go (`TooMany` on the list), not the older tests' totals."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hami_sim.apiserver.resource_v1 import (
    DEFAULT_FEATURE_GATES,
    PARTITIONABLE_DEVICES,
    FeatureGates,
    drop_disabled_slice_fields,
    validate_resource_slice,
)

Json = dict[str, Any]
BAD = "!@#$%^"
LABEL_DETAIL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
GATE_OFF = FeatureGates({PARTITIONABLE_DEVICES: False})


def counters(n: int = 1) -> Json:
    return {f"memory-{i}" if n > 1 else "memory": {"value": "1Gi"} for i in range(n)}


def counter_slice(*sets: Json) -> Json:
    return {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
            "sharedCounters": list(sets),
        },
    }


def device_slice(*devices: Json) -> Json:
    return {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
            "devices": list(devices),
        },
    }


def consuming(name: str, *consumptions: Json) -> Json:
    return {"name": name, "consumesCounters": list(consumptions)}


def test_a_split_layout_counter_slice_and_device_slice_are_valid() -> None:
    sets = counter_slice({"name": "gpu-0-counter-set", "counters": {"memory": {"value": "40192Mi"}}})
    devices = device_slice(
        consuming("gpu-0-mig-1g5gb-19-0", {"counterSet": "gpu-0-counter-set", "counters": counters()})
    )
    assert (validate_resource_slice(sets), validate_resource_slice(devices)) == ([], [])


def test_bad_name_shared_counters_is_an_invalid_dns_label() -> None:
    causes = validate_resource_slice(counter_slice({"name": BAD, "counters": counters()}))
    assert causes == [("spec.sharedCounters[0].name", "Invalid value", f'"{BAD}": {LABEL_DETAIL}')]


def test_bad_countername_shared_counters_names_the_counter_key() -> None:
    causes = validate_resource_slice(counter_slice({"name": "set", "counters": {BAD: {"value": "1Gi"}}}))
    assert causes == [
        (f"spec.sharedCounters[0].counters[{BAD}]", "Invalid value", f'"{BAD}": {LABEL_DETAIL}')
    ]


def test_missing_name_shared_counters_is_required() -> None:
    causes = validate_resource_slice(counter_slice({"counters": counters()}))
    assert causes == [("spec.sharedCounters[0].name", "Required value", "")]


def test_shared_counter_set_without_counters_is_required() -> None:
    causes = validate_resource_slice(counter_slice({"name": "set"}))
    assert causes == [("spec.sharedCounters[0].counters", "Required value", "")]


def test_duplicate_shared_counters_is_reported_on_the_second_name() -> None:
    causes = validate_resource_slice(
        counter_slice({"name": "set", "counters": counters()}, {"name": "set", "counters": counters()})
    )
    assert causes == [("spec.sharedCounters[1].name", "Duplicate value", '"set"')]


def test_nine_counter_sets_are_too_many() -> None:
    sets = [{"name": f"set-{i}", "counters": counters()} for i in range(9)]
    causes = validate_resource_slice(counter_slice(*sets))
    assert causes == [("spec.sharedCounters", "Too many", "9: must have at most 8 items")]


def test_thirty_three_counters_in_a_set_are_too_many() -> None:
    causes = validate_resource_slice(counter_slice({"name": "set", "counters": counters(33)}))
    assert causes == [("spec.sharedCounters[0].counters", "Too many", "33: must have at most 32 items")]


def test_a_counter_value_that_is_not_a_quantity_is_invalid() -> None:
    causes = validate_resource_slice(
        counter_slice({"name": "set", "counters": {"memory": {"value": "lots"}}})
    )
    assert causes == [
        ("spec.sharedCounters[0].counters[memory].value", "Invalid value", '"lots": must be a quantity')
    ]


def test_missing_counterset_consumes_counter_is_required() -> None:
    causes = validate_resource_slice(device_slice(consuming("d", {"counters": counters()})))
    assert causes == [("spec.devices[0].consumesCounters[0].counterSet", "Required value", "")]


def test_missing_counter_consumes_counter_is_required() -> None:
    causes = validate_resource_slice(device_slice(consuming("d", {"counterSet": "set"})))
    assert causes == [("spec.devices[0].consumesCounters[0].counters", "Required value", "")]


def test_three_counter_consumptions_per_device_are_too_many() -> None:
    device = consuming("d", *({"counterSet": f"set-{i}", "counters": counters()} for i in range(3)))
    causes = validate_resource_slice(device_slice(device))
    assert causes == [("spec.devices[0].consumesCounters", "Too many", "3: must have at most 2 items")]


def test_the_same_counter_set_consumed_twice_by_a_device_is_a_duplicate() -> None:
    device = consuming(
        "d", {"counterSet": "set", "counters": counters()}, {"counterSet": "set", "counters": counters()}
    )
    causes = validate_resource_slice(device_slice(device))
    assert causes == [("spec.devices[0].consumesCounters[1].counterSet", "Duplicate value", '"set"')]


def test_a_consumption_of_a_counter_set_defined_in_another_slice_is_valid_at_write_time() -> None:
    """Since 1.35 the sets are in another slice of the pool: the allocator checks the reference."""
    device = consuming("d", {"counterSet": "elsewhere", "counters": counters()})
    assert validate_resource_slice(device_slice(device)) == []


def test_sixty_five_devices_that_consume_counters_are_too_many_for_one_slice() -> None:
    devices = [consuming(f"d-{i}", {"counterSet": "set", "counters": counters()}) for i in range(65)]
    causes = validate_resource_slice(device_slice(*devices))
    assert causes == [("spec.devices", "Too many", "65: must have at most 64 items")]


def test_devices_and_shared_counters_in_one_slice_are_refused_with_kubes_message() -> None:
    both = counter_slice({"name": "set", "counters": counters()})
    both["spec"]["devices"] = [{"name": "d"}]
    causes = validate_resource_slice(both)
    assert causes == [("spec", "Invalid value", '"": only one of `sharedCounters` or `devices` is allowed')]


def test_gate_on_keeps_the_counter_fields() -> None:
    spec = copy.deepcopy(device_slice(consuming("d", {"counterSet": "set", "counters": counters()}))["spec"])
    drop_disabled_slice_fields(spec, None, DEFAULT_FEATURE_GATES)
    assert spec["devices"][0]["consumesCounters"] == [{"counterSet": "set", "counters": counters()}]


def test_gate_off_drops_shared_counters_and_consumes_counters_on_create() -> None:
    sets = counter_slice({"name": "set", "counters": counters()})["spec"]
    devices = device_slice(consuming("d", {"counterSet": "set", "counters": counters()}))["spec"]
    drop_disabled_slice_fields(sets, None, GATE_OFF)
    drop_disabled_slice_fields(devices, None, GATE_OFF)
    assert ("sharedCounters" in sets, devices["devices"]) == (False, [{"name": "d"}])


def test_gate_off_keeps_the_counter_fields_when_the_stored_slice_already_uses_them() -> None:
    old = device_slice(consuming("d", {"counterSet": "set", "counters": counters()}))["spec"]
    new = copy.deepcopy(old)
    drop_disabled_slice_fields(new, old, GATE_OFF)
    assert new == old


def test_feature_gates_flag_knows_dra_partitionable_devices() -> None:
    assert FeatureGates.parse("DRAPartitionableDevices=false")(PARTITIONABLE_DEVICES) is False
    assert DEFAULT_FEATURE_GATES(PARTITIONABLE_DEVICES) is True


@given(
    st.lists(
        st.tuples(
            st.text(alphabet="abc-1", min_size=0, max_size=5),
            st.dictionaries(
                st.text(alphabet="xyz-9", min_size=1, max_size=4), st.integers(0, 10**6), max_size=34
            ),
        ),
        max_size=10,
    )
)
def test_every_counter_set_cause_names_a_path_under_spec_shared_counters(
    sets: list[tuple[str, dict[str, int]]],
) -> None:
    body = counter_slice(
        *({"name": n, "counters": {k: {"value": str(v)} for k, v in c.items()}} for n, c in sets)
    )
    for path, reason, _ in validate_resource_slice(body):
        assert path.startswith("spec.sharedCounters"), (path, reason)
