"""hami_node.dra.slices, the pure ResourceSlice builder: HAMi-DRA's device schema with consumable capacity
(or whole GPUs without it), capacity rounding, strict semver driver versions, taints of unhealthy GPUs,
and the comparisons the publisher makes with what the API server stores."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api import dra
from hami_api.quantity import parse_quantity
from hami_node.config import load_config
from hami_node.devices import REPORTED_UNHEALTHY, GPUStatus
from hami_node.dra.slices import (
    aligned_memory,
    consumable_dropped,
    driver_semver,
    generation,
    new_slice,
    pick_slice,
    slice_device,
    slice_devices,
    slice_spec,
    spec_matches,
    stored_taint_times,
    taint_value,
    updated_slice,
)
from hami_node.health import DEVICE_LOST_REASON, MONITORING_FAILED_REASON, xid_reason
from tests.builders import physical_gpu

MIB = 1 << 20
CONFIG = load_config(["--node-name", "n1", "--mode", "dra"], {}, lambda p: "")


def status(n: int = 0, **fault: object) -> GPUStatus:
    gpu = physical_gpu(f"GPU-{n}", n, minor=n + 4, numa_node=1)
    return GPUStatus(gpu, **fault)  # type: ignore[arg-type]


def test_a_gpu_is_one_device_with_hami_dra_attributes_and_consumable_capacity() -> None:
    info = physical_gpu("GPU-a", 2, minor=6, numa_node=1, pci_bus_id="00000000:47:00.0")
    gpu = GPUStatus(dataclasses.replace(info, driver_version="535.104.05"))
    assert slice_device(gpu, CONFIG, consumable=True) == {
        "name": "hami-gpu-6",
        "attributes": {
            "type": {"string": "hami-gpu"},
            "uuid": {"string": "GPU-a"},
            "minor": {"int": 6},
            "index": {"int": 2},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "driverVersion": {"version": "535.104.5"},
            "pcieBusID": {"string": "00000000:47:00.0"},
            "numaNode": {"int": 1},
        },
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"},
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
        "allowMultipleAllocations": True,
    }


def test_without_consumable_capacity_a_gpu_is_published_whole() -> None:
    device = slice_device(status(), CONFIG, consumable=False)
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}


def test_unknown_attributes_are_left_out() -> None:
    gpu = GPUStatus(physical_gpu("GPU-a", 0, numa_node=None, pci_bus_id=""))
    attributes = slice_device(gpu, CONFIG, consumable=True)["attributes"]
    assert set(attributes) == {"type", "uuid", "minor", "index", "productName"}


def test_memory_capacity_is_the_advertised_memory_step_aligned() -> None:
    scaled = load_config(
        ["--node-name", "n1", "--mode", "dra", "--device-memory-scaling", "1.5"], {}, lambda p: ""
    )
    gpu = GPUStatus(physical_gpu("GPU-a", 0, memory_mib=1001))
    memory = slice_device(gpu, scaled, consumable=True)["capacity"]["memory"]
    assert memory["value"] == "1501Mi"  # int(1001 * 1.5) MiB
    assert aligned_memory(1501 * MIB + 12345) == 1501 * MIB


@given(st.integers(min_value=0, max_value=1 << 50), st.sampled_from([1, 4096, MIB]))
def test_aligned_memory_is_the_largest_step_multiple_not_above(total: int, step: int) -> None:
    aligned = aligned_memory(total, step)
    assert aligned % step == 0 and aligned <= total < aligned + step


def test_a_gpu_too_small_for_a_valid_range_gets_no_memory_policy() -> None:
    gpu = GPUStatus(physical_gpu("GPU-a", 0, memory_mib=1))
    memory = slice_device(gpu, CONFIG, consumable=True)["capacity"]["memory"]
    assert memory == {"value": "1Mi"}


@pytest.mark.parametrize(
    ("text", "semver"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),
        ("470.57.02", "470.57.2"),
        ("550.54", "550.54.0"),
        ("560", "560.0.0"),
        ("550.54.15.1", None),
        ("550.54-beta", None),
        ("", None),
        (None, None),
    ],
)
def test_driver_versions_become_strict_semver_or_are_left_out(text: str | None, semver: str | None) -> None:
    assert driver_semver(text) == semver


@given(st.lists(st.integers(min_value=0, max_value=99999), min_size=1, max_size=3), st.integers(0, 2))
def test_any_numeric_driver_version_is_a_strict_semver(parts: list[int], zeros: int) -> None:
    text = ".".join("0" * zeros + str(p) for p in parts)
    version = driver_semver(text)
    assert version is not None
    numbers = version.split(".")
    assert len(numbers) == 3 and all(n == "0" or not n.startswith("0") for n in numbers)
    assert [int(n) for n in numbers] == [*parts, *[0] * (3 - len(parts))]


@pytest.mark.parametrize(
    ("fault", "value"),
    [
        ({"fault": xid_reason(79)}, "xid-79"),
        ({"fault": DEVICE_LOST_REASON}, "gpu-lost"),
        ({"fault": MONITORING_FAILED_REASON}, "monitoring-failed"),
        ({"fault": REPORTED_UNHEALTHY}, "reported-unhealthy"),
        ({"fault": "something else"}, "unhealthy"),
        ({"fenced": "nvmlInit failed"}, "nvml-failing"),
        ({"fault": xid_reason(48), "fenced": "nvmlInit failed"}, "nvml-failing"),
        ({}, None),
    ],
)
def test_an_unhealthy_gpu_is_tainted_with_its_reason(fault: dict[str, str], value: str | None) -> None:
    gpu = status(**fault)
    assert taint_value(gpu) == value
    device = slice_device(gpu, CONFIG, consumable=True, taint_since="2026-01-02T03:04:05Z")
    if value is None:
        assert "taints" not in device
    else:
        assert device["taints"] == [
            {
                "key": "hami-core-gpu.project-hami.io/unhealthy",
                "value": value,
                "effect": "NoSchedule",
                "timeAdded": "2026-01-02T03:04:05Z",
            }
        ]


def test_the_taint_effect_and_key_follow_the_settings() -> None:
    config = load_config(
        [
            "--node-name",
            "n1",
            "--mode",
            "dra",
            "--dra-taint-effect",
            "NoExecute",
            "--dra-driver-name",
            "gpu.x.io",
        ],
        {},
        lambda p: "",
    )
    (taint,) = slice_device(status(fault=xid_reason(79)), config, consumable=True)["taints"]
    assert taint == {"key": "gpu.x.io/unhealthy", "value": "xid-79", "effect": "NoExecute"}


def test_devices_keep_the_gpus_order_and_their_taint_times() -> None:
    devices = slice_devices(
        [status(1), status(0, fault=xid_reason(79))],
        CONFIG,
        consumable=True,
        taint_since={("hami-gpu-4", "xid-79"): "2026-01-01T00:00:00Z"},
    )
    assert [d["name"] for d in devices] == ["hami-gpu-5", "hami-gpu-4"]
    assert devices[1]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"


def test_a_new_slice_is_owned_by_the_node_and_names_the_pool_after_it() -> None:
    spec = slice_spec("n1", dra.DRIVER, [], 3)
    body = new_slice("n1", "node-uid", dra.DRIVER, spec)
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"] == {
        "generateName": f"n1-{dra.DRIVER}-",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid", "controller": True}
        ],
    }
    assert body["spec"] == {
        "driver": dra.DRIVER,
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
        "devices": [],
    }


def stored(
    name: str,
    gen: int,
    *,
    pool: str = "n1",
    created: str = "2026-01-01T00:00:00Z",
    devices: list | None = None,
) -> dict:
    spec = slice_spec(pool, dra.DRIVER, devices or [], gen)
    spec["pool"]["name"] = pool
    return {
        "metadata": {"name": name, "creationTimestamp": created, "resourceVersion": "7", "uid": f"u-{name}"},
        "spec": spec,
    }


def test_the_slice_kept_is_the_newest_generation_of_our_pool_and_the_rest_go() -> None:
    keep, extra = pick_slice(
        [
            stored("a", 1),
            stored("b", 3),
            stored("c", 3, created="2026-01-02T00:00:00Z"),
            stored("d", 5, pool="old"),
        ],
        "n1",
    )
    assert keep is not None and keep["metadata"]["name"] == "b"
    assert sorted(s["metadata"]["name"] for s in extra) == ["a", "c", "d"]
    assert pick_slice([stored("d", 5, pool="old")], "n1") == (None, [stored("d", 5, pool="old")])
    assert generation({}) == 0


def test_a_stored_slice_matches_whatever_the_api_server_wrote_for_its_quantities_and_times() -> None:
    devices = slice_devices(
        [status(0, fault=xid_reason(79))],
        CONFIG,
        consumable=True,
        taint_since={("hami-gpu-4", "xid-79"): "x"},
    )
    desired = slice_spec("n1", dra.DRIVER, devices, 1)
    server = copy.deepcopy(stored("a", 9, devices=devices))
    capacity = server["spec"]["devices"][0]["capacity"]["memory"]
    capacity["value"] = str(80 * 1024 * MIB)  # the same quantity, spelled otherwise
    capacity["requestPolicy"]["validRange"]["step"] = "1048576"
    server["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-03-03T00:00:00Z"
    assert spec_matches(server, desired)
    changed = copy.deepcopy(server)
    changed["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "GPU-other"}
    assert not spec_matches(changed, desired)
    healed = slice_spec("n1", dra.DRIVER, slice_devices([status(0)], CONFIG, consumable=True), 1)
    assert not spec_matches(server, healed)
    assert not spec_matches(stored("a", 9, devices=devices[:0]), desired)


def test_dropped_allow_multiple_allocations_means_no_consumable_capacity() -> None:
    devices = slice_devices([status(0), status(1)], CONFIG, consumable=True)
    kept = stored("a", 1, devices=copy.deepcopy(devices))
    assert not consumable_dropped(devices, kept)
    dropped = copy.deepcopy(kept)
    for device in dropped["spec"]["devices"]:
        del device["allowMultipleAllocations"]
        for capacity in device["capacity"].values():
            capacity.pop("requestPolicy")
    assert consumable_dropped(devices, dropped)
    whole = slice_devices([status(0)], CONFIG, consumable=False)
    assert not consumable_dropped(whole, dropped)


def test_an_update_keeps_the_stored_metadata_and_our_taint_times_are_read_back() -> None:
    devices = slice_devices(
        [status(0, fault=xid_reason(79))],
        CONFIG,
        consumable=True,
        taint_since={("hami-gpu-4", "xid-79"): "t0"},
    )
    old = stored("a", 2, devices=devices)
    body = updated_slice(old, slice_spec("n1", dra.DRIVER, [], 3))
    assert body["metadata"] == old["metadata"] and body["spec"]["pool"]["generation"] == 3
    assert old["spec"]["pool"]["generation"] == 2  # not changed in place
    assert stored_taint_times(old) == {("hami-gpu-4", "xid-79"): "t0"}
    assert stored_taint_times(None) == {}


@given(st.integers(min_value=2, max_value=1 << 22))
def test_the_memory_policy_is_valid_for_any_gpu_size(mib: int) -> None:
    gpu = GPUStatus(physical_gpu("GPU-a", 0, memory_mib=mib))
    memory = slice_device(gpu, CONFIG, consumable=True)["capacity"]["memory"]
    value = parse_quantity(memory["value"])
    policy = memory["requestPolicy"]
    low, high, step = (parse_quantity(policy["validRange"][k]) for k in ("min", "max", "step"))
    default = parse_quantity(policy["default"])
    # resource/v1 validation: min <= default <= max <= value, (default-min) and (max-min) multiples of
    # step, min + step <= value.
    assert value == mib * MIB and low <= default <= high <= value
    assert (default - low) % step == 0 and (high - low) % step == 0 and low + step <= value
