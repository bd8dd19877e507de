"""hami_node.nvidia.device_map: the resources -> devices map of NVIDIA's plugin (internal/rm/device_map.go,
rm.go AddDefaultResourcesToConfig, v0.20.0) for MIG strategies none / single / mixed, time-slicing
replicas, and health fan-out. NVIDIA's device_map_test.go TestDeviceMapInsert is transcribed below;
TestWslDeviceMapHasSingleAllDevice is left out (WSL is not a platform hami-node serves)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hami_node.nvidia.config import (
    NO_REPLICAS,
    MigStrategy,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
)
from hami_node.nvidia.device_map import (
    Device,
    DeviceMapError,
    MigAttributes,
    NvidiaDevice,
    build_device_map,
    default_resources,
    devices_hit,
    empty_mig_gpus,
    mig_resource_name,
    plugin_socket_name,
    replicate,
    served_resources,
    with_health,
)

A100 = "NVIDIA A100-SXM4-40GB"
ATTRS = {
    "1g.5gb": MigAttributes(4864, 14, 1, 1, 1, 0, 0, 0, 0),
    "2g.10gb": MigAttributes(9856, 28, 2, 2, 2, 1, 0, 0, 0),
    "3g.20gb": MigAttributes(19968, 42, 3, 3, 3, 2, 0, 0, 0),
    "1c.2g.10gb": MigAttributes(9856, 14, 2, 1, 2, 1, 0, 0, 0),
}


def nvidia_gpu(i: int, mig_enabled: bool = False, name: str = A100) -> NvidiaDevice:
    return NvidiaDevice(
        uuid=f"GPU-{i}",
        index=i,
        product_name=name,
        memory_mib=40960,
        minor=i,
        mig_capable=True,
        mig_enabled=mig_enabled,
        compute_capability=(8, 0),
        paths=(f"/dev/nvidia{i}",),
    )


def mig(i: int, j: int, profile: str, gi: int = 0) -> NvidiaDevice:
    return NvidiaDevice(
        uuid=f"MIG-{i}-{j}",
        index=i,
        product_name=A100,
        memory_mib=ATTRS[profile].memory_mib,
        minor=i,
        parent_uuid=f"GPU-{i}",
        mig_index=j,
        mig_profile=profile,
        mig_attributes=ATTRS[profile],
        gpu_instance_id=gi or j + 1,
        compute_instance_id=0,
        paths=(f"/dev/nvidia{i}", f"/dev/nvidia-caps/nvidia-cap{j + 10}"),
    )


def ids(device_map: object) -> dict[str, list[str]]:
    assert isinstance(device_map, dict)
    return {name: [d.id for d in devices] for name, devices in device_map.items()}


def time_slicing(*resources: tuple[str, int], rename_by_default: bool = False) -> ReplicatedResources:
    items = tuple(
        ReplicatedResource(name, n, f"{name}.shared" if rename_by_default else "") for name, n in resources
    )
    return ReplicatedResources(items, rename_by_default)


# --- strategies -----------------------------------------------------------------------------------------


def test_none_serves_every_gpu_mig_enabled_ones_too_as_nvidia_gpu() -> None:
    devices = [nvidia_gpu(0), nvidia_gpu(1, mig_enabled=True), mig(1, 0, "1g.5gb")]
    device_map = build_device_map(devices, MigStrategy.NONE, NO_REPLICAS)
    assert ids(device_map) == {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}
    assert [d.index for d in device_map["nvidia.com/gpu"]] == ["0", "1"]


def test_single_serves_mig_devices_as_nvidia_gpu_with_mig_indexes() -> None:
    devices = [
        nvidia_gpu(0, True),
        mig(0, 0, "1g.5gb"),
        mig(0, 1, "1g.5gb"),
        nvidia_gpu(1, True),
        mig(1, 0, "1g.5gb"),
    ]
    device_map = build_device_map(devices, MigStrategy.SINGLE, NO_REPLICAS)
    assert ids(device_map) == {"nvidia.com/gpu": ["MIG-0-0", "MIG-0-1", "MIG-1-0"]}
    assert [d.index for d in device_map["nvidia.com/gpu"]] == ["0:0", "0:1", "1:0"]
    assert all(d.is_mig and not d.aligned_allocation_supported for d in device_map["nvidia.com/gpu"])
    assert device_map["nvidia.com/gpu"][0].total_memory_mib == 4864


def test_single_without_mig_enabled_gpus_behaves_as_none() -> None:
    assert ids(build_device_map([nvidia_gpu(0), nvidia_gpu(1)], MigStrategy.SINGLE, NO_REPLICAS)) == {
        "nvidia.com/gpu": ["GPU-0", "GPU-1"]
    }


def test_single_refuses_an_empty_mig_enabled_gpu_with_nvidias_error() -> None:
    with pytest.raises(DeviceMapError) as err:
        build_device_map([nvidia_gpu(0, True)], MigStrategy.SINGLE, NO_REPLICAS)
    assert str(err.value) == (
        "error building device map: error building device map from config.resources: invalid MIG "
        "configuration: at least one device with migEnabled=true was not configured correctly: device 0 "
        "has no MIG devices configured"
    )


def test_single_refuses_two_mig_device_types() -> None:
    devices = [nvidia_gpu(0, True), mig(0, 0, "1g.5gb"), mig(0, 1, "2g.10gb")]
    with pytest.raises(
        DeviceMapError, match="invalid MIG configuration: more than one MIG device type present"
    ):
        build_device_map(devices, MigStrategy.SINGLE, NO_REPLICAS)


def test_single_refuses_full_gpus_beside_mig_devices() -> None:
    devices = [nvidia_gpu(0), nvidia_gpu(1, True), mig(1, 0, "1g.5gb")]
    with pytest.raises(
        DeviceMapError, match="all devices on the node must be configured with the same migEnabled"
    ):
        build_device_map(devices, MigStrategy.SINGLE, NO_REPLICAS)


def test_mixed_serves_one_resource_per_profile_beside_full_gpus() -> None:
    devices = [
        nvidia_gpu(0),
        nvidia_gpu(1, True),
        mig(1, 0, "3g.20gb"),
        mig(1, 1, "2g.10gb"),
        mig(1, 2, "1g.5gb"),
        mig(1, 3, "1g.5gb"),
    ]
    assert ids(build_device_map(devices, MigStrategy.MIXED, NO_REPLICAS)) == {
        "nvidia.com/gpu": ["GPU-0"],
        "nvidia.com/mig-3g.20gb": ["MIG-1-0"],
        "nvidia.com/mig-2g.10gb": ["MIG-1-1"],
        "nvidia.com/mig-1g.5gb": ["MIG-1-2", "MIG-1-3"],
    }


def test_mixed_accepts_an_empty_mig_enabled_gpu_and_reports_it() -> None:
    devices = [nvidia_gpu(0, True), nvidia_gpu(1, True), mig(1, 0, "1g.5gb")]
    assert ids(build_device_map(devices, MigStrategy.MIXED, NO_REPLICAS)) == {
        "nvidia.com/mig-1g.5gb": ["MIG-1-0"]
    }
    assert empty_mig_gpus(devices) == (0,)


def test_mixed_refuses_a_compute_instance_profile_no_pattern_names() -> None:
    devices = [nvidia_gpu(0, True), mig(0, 0, "1c.2g.10gb")]
    with pytest.raises(DeviceMapError, match=r"MIG profile '1c\.2g\.10gb' does not match any resource"):
        build_device_map(devices, MigStrategy.MIXED, NO_REPLICAS)


def test_mixed_resource_names_make_plus_a_dot() -> None:
    """rm.go AddDefaultResourcesToConfig: strings.ReplaceAll("mig-"+profile, "+", ".")."""
    assert mig_resource_name("1g.5gb+me") == "nvidia.com/mig-1g.5gb.me"
    resources = default_resources(MigStrategy.MIXED, ["1g.5gb", "1g.5gb+me", "1c.2g.10gb", "1g.5gb"])
    assert [(r.pattern, r.name) for r in resources.mig] == [
        ("1g.5gb", "nvidia.com/mig-1g.5gb"),
        ("1g.5gb+me", "nvidia.com/mig-1g.5gb.me"),
    ]


def test_a_gpu_name_no_pattern_matches_is_refused() -> None:
    resources = default_resources(MigStrategy.NONE)
    narrow = replace(resources, gpus=(ResourcePattern("Tesla*", "nvidia.com/gpu"),))
    with pytest.raises(DeviceMapError, match=f"GPU name '{A100}' does not match any resource patterns"):
        build_device_map([nvidia_gpu(0)], MigStrategy.NONE, NO_REPLICAS, narrow)


def test_a_mig_device_whose_parent_is_missing_is_refused_naming_it() -> None:
    with pytest.raises(
        DeviceMapError, match="MIG device MIG-3-0: its parent GPU GPU-3 is not in the inventory"
    ):
        build_device_map([nvidia_gpu(0), mig(3, 0, "1g.5gb")], MigStrategy.MIXED, NO_REPLICAS)


# --- replicas (updateDeviceMapWithReplicas) --------------------------------------------------------------


def test_time_slicing_makes_replicas_with_annotated_ids_under_the_name() -> None:
    device_map = build_device_map(
        [nvidia_gpu(0), nvidia_gpu(1)], MigStrategy.NONE, time_slicing(("nvidia.com/gpu", 2))
    )
    assert ids(device_map) == {"nvidia.com/gpu": ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]}
    replica = device_map["nvidia.com/gpu"][1]
    assert (replica.uuid, replica.index, replica.replicas, replica.paths) == (
        "GPU-0",
        "0",
        2,
        ("/dev/nvidia0",),
    )


def test_rename_by_default_serves_replicas_under_dot_shared_only() -> None:
    device_map = build_device_map(
        [nvidia_gpu(0)], MigStrategy.NONE, time_slicing(("nvidia.com/gpu", 3), rename_by_default=True)
    )
    assert ids(device_map) == {"nvidia.com/gpu.shared": ["GPU-0::0", "GPU-0::1", "GPU-0::2"]}


def test_mixed_with_time_slicing_replicates_each_mig_device_of_the_profile() -> None:
    devices = [nvidia_gpu(0, True), mig(0, 0, "1g.5gb"), mig(0, 1, "1g.5gb"), mig(0, 2, "2g.10gb")]
    device_map = build_device_map(devices, MigStrategy.MIXED, time_slicing(("nvidia.com/mig-1g.5gb", 2)))
    assert ids(device_map) == {
        "nvidia.com/mig-2g.10gb": ["MIG-0-2"],
        "nvidia.com/mig-1g.5gb": ["MIG-0-0::0", "MIG-0-0::1", "MIG-0-1::0", "MIG-0-1::1"],
    }


def test_single_with_time_slicing_replicates_mig_devices_under_nvidia_gpu() -> None:
    devices = [nvidia_gpu(0, True), mig(0, 0, "1g.5gb")]
    device_map = build_device_map(devices, MigStrategy.SINGLE, time_slicing(("nvidia.com/gpu", 4)))
    assert ids(device_map) == {"nvidia.com/gpu": [f"MIG-0-0::{i}" for i in range(4)]}
    assert device_map["nvidia.com/gpu"][0].index == "0:0"


def test_a_count_replicates_the_first_devices_and_keeps_the_rest() -> None:
    rr = ReplicatedResources(
        (ReplicatedResource("nvidia.com/gpu", 2, devices=ReplicatedDevices(False, count=1)),)
    )
    assert ids(build_device_map([nvidia_gpu(0), nvidia_gpu(1)], MigStrategy.NONE, rr)) == {
        "nvidia.com/gpu": ["GPU-1", "GPU-0::0", "GPU-0::1"]
    }


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            ReplicatedDevices(False, count=3),
            "requested 3 devices to be replicated, but only 2 devices available",
        ),
        (
            ReplicatedDevices(False, refs=("GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",)),
            "no matching device with UUID",
        ),
        (ReplicatedDevices(False, refs=("7",)), "no matching device at index: 7"),
    ],
)
def test_devices_to_replicate_that_are_not_there_give_nvidias_error(
    devices: ReplicatedDevices, message: str
) -> None:
    rr = ReplicatedResources((ReplicatedResource("nvidia.com/gpu", 2, devices=devices),))
    with pytest.raises(DeviceMapError) as err:
        build_device_map([nvidia_gpu(0), nvidia_gpu(1)], MigStrategy.NONE, rr)
    assert (
        "error updating device map with replicas from replicatedResources config: unable to get IDs of "
        in str(err.value)
    )
    assert message in str(err.value)


def test_a_replicated_resource_without_devices_here_is_ignored() -> None:
    rr = time_slicing(("nvidia.com/mig-1g.5gb", 2))
    assert ids(build_device_map([nvidia_gpu(0)], MigStrategy.NONE, rr)) == {"nvidia.com/gpu": ["GPU-0"]}


def test_a_device_inserted_again_with_the_same_id_replaces_the_first() -> None:
    """device_map_test.go TestDeviceMapInsert, "overwrite existing device" (the other sub-cases, insert
    into an empty map / another resource / beside a device, are the maps built above)."""
    first = Device(id="0", index="", uuid="0")
    second = Device(id="0", index="index", uuid="0")
    merged = replicate({"resource": (first,), "resource1": (first,)}, NO_REPLICAS)
    assert merged == {"resource": (first,), "resource1": (first,)}
    again = replicate({"resource": (first, second)}, NO_REPLICAS)
    assert again == {"resource": (second,)}


# --- health, sockets -----------------------------------------------------------------------------------


def test_an_xid_on_a_gpu_hits_every_replica_of_it() -> None:
    device_map = build_device_map(
        [nvidia_gpu(0), nvidia_gpu(1)], MigStrategy.NONE, time_slicing(("nvidia.com/gpu", 3))
    )
    assert devices_hit(device_map, "GPU-1") == {"GPU-1::0", "GPU-1::1", "GPU-1::2"}


def test_an_xid_on_a_mig_instance_hits_only_that_mig_device() -> None:
    devices = [nvidia_gpu(0, True), mig(0, 0, "1g.5gb", gi=7), mig(0, 1, "1g.5gb", gi=8)]
    device_map = build_device_map(devices, MigStrategy.MIXED, time_slicing(("nvidia.com/mig-1g.5gb", 2)))
    assert devices_hit(device_map, "GPU-0", 8, 0) == {"MIG-0-1::0", "MIG-0-1::1"}
    assert devices_hit(device_map, "GPU-0") == {"MIG-0-0::0", "MIG-0-0::1", "MIG-0-1::0", "MIG-0-1::1"}


def test_health_follows_the_device_and_its_parent_gpu() -> None:
    devices = [nvidia_gpu(0), nvidia_gpu(1, True), mig(1, 0, "1g.5gb")]
    device_map = build_device_map(devices, MigStrategy.MIXED, time_slicing(("nvidia.com/gpu", 2)))
    healthy = with_health(device_map, {"GPU-1"})
    assert {d.id: d.healthy for ds in healthy.values() for d in ds} == {
        "GPU-0::0": True,
        "GPU-0::1": True,
        "MIG-1-0": False,
    }


def test_plugin_sockets_are_named_after_the_resource() -> None:
    assert [
        plugin_socket_name(n) for n in ("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared")
    ] == [
        "nvidia-gpu.sock",
        "nvidia-mig-1g.5gb.sock",
        "nvidia-gpu.shared.sock",
    ]


def test_resources_without_devices_are_not_served() -> None:
    assert served_resources({"nvidia.com/gpu": (), "nvidia.com/mig-1g.5gb": (Device("a", "0:0", "a"),)}) == (
        "nvidia.com/mig-1g.5gb",
    )
