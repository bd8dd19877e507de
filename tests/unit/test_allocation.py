"""hami_node.allocation: virtual device IDs, HAMi's exact Allocate envs and mounts, the device-list
strategies, the protobuf message, matching a kubelet request to its pending pod, and
GetPreferredAllocation's choice."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_pod_allocation
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_node.allocation import (
    AllocationError,
    AmbiguousPodError,
    ContainerResponse,
    CountMismatchError,
    DeviceMismatchError,
    InvalidDeviceID,
    Mount,
    NodeGPU,
    NoPendingPod,
    NoPendingPodError,
    PendingPod,
    PodMatch,
    PreferredAllocationError,
    UnhealthyGPUError,
    UnknownDeviceError,
    VirtualDevice,
    container_allocate_response,
    container_cache_dir,
    grant_container,
    list_virtual_devices,
    match_pending_pod,
    parse_virtual_device_id,
    preferred_allocation,
    split_virtual_device_id,
    steering_gpus,
    to_proto,
    virtual_device_id,
    virtual_devices_to_proto,
)
from hami_node.config import DeviceListStrategy, NodeConfig, OperatingMode
from hami_node.plugin.api import api_pb2
from tests.builders import container, pod

A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
B = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
C = "GPU-3d8e1f2a-1111-2222-3333-444455556666"
GPUS = (NodeGPU(A, numa_node=0), NodeGPU(B, numa_node=1), NodeGPU(C, numa_node=None))
CACHE = "5a9c7c8e-7d1b-4c6e-9d7e-2f0b1c3d4e5f"
UID = "8f1e5b2a-0000-4000-8000-000000000001"
train_pod = functools.partial(pod, "train", namespace="team", uid=UID)
"""The pod the allocation tests allocate for: team/train, with the given containers."""
CONFIG = NodeConfig(node_name="node-a")

LIB = Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True)
LOCK = Mount("/tmp/vgpulock", "/tmp/vgpulock", False)
PRELOAD = Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True)


def cache_mount(container: str) -> Mount:
    return Mount("/usr/local/vgpu", f"/usr/local/vgpu/containers/{UID}_{container}", False)


def respond(
    pod: Mapping[str, Any],
    annotation: str,
    entry: int,
    device_ids: Sequence[str],
    config: NodeConfig = CONFIG,
    *,
    gpus: Sequence[NodeGPU] = GPUS,
    **kwargs: Any,
) -> ContainerResponse:
    return container_allocate_response(
        pod,
        decode_pod_allocation(annotation),
        entry,
        device_ids,
        gpus=gpus,
        config=config,
        cache_id=CACHE,
        **kwargs,
    )


# --- virtual devices ----------------------------------------------------------------------------------


def test_each_gpu_becomes_split_count_devices() -> None:
    devices = list_virtual_devices(GPUS, 3)
    assert [d.id for d in devices] == [f"{g}-{i}" for g in (A, B, C) for i in range(3)]
    assert all(d.numa_node is None for d in devices)  # topology off by default
    assert devices[4] == VirtualDevice(f"{B}-1", B, 1, True)
    assert len(list_virtual_devices(GPUS, 10)) == 30


def test_unhealthy_gpus_stay_listed_as_unhealthy_and_numa_when_enabled() -> None:
    gpus = [NodeGPU(A, healthy=False, numa_node=-1), NodeGPU(B, numa_node=1), NodeGPU(C)]
    devices = list_virtual_devices(gpus, 2, numa_topology=True)
    assert [(d.healthy, d.numa_node) for d in devices] == [
        (False, 0), (False, 0), (True, 1), (True, 1), (True, None), (True, None)
    ]  # fmt: skip
    proto = virtual_devices_to_proto(devices)
    assert proto[0] == api_pb2.Device(
        ID=f"{A}-0", health="Unhealthy", topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)])
    )
    assert proto[2].health == "Healthy" and [n.ID for n in proto[2].topology.nodes] == [1]
    assert not proto[4].HasField("topology")
    assert not virtual_devices_to_proto(list_virtual_devices(gpus, 1))[1].HasField("topology")


def test_listing_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="split_count"):
        list_virtual_devices(GPUS, 0)
    with pytest.raises(ValueError, match="listed twice"):
        list_virtual_devices([NodeGPU(A), NodeGPU(A)], 2)


def test_parse_virtual_device_ids() -> None:
    known = {A, B}
    assert parse_virtual_device_id(f"{A}-0", known) == (A, 0)
    assert parse_virtual_device_id(f"{B}-12", known, split_count=13) == (B, 12)
    for bad, reason in [
        (A, "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        ("GPU-1-2-3", "names GPU GPU-1-2, which this node does not have"),
        (f"{C}-1", f"names GPU {C}, which this node does not have"),
        (f"{A}-x", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}-01", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}--1", f"names GPU {A}-, which this node does not have"),
        ("7", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}-10", "has replica 10, but each GPU has 10"),
    ]:
        with pytest.raises(InvalidDeviceID) as info:
            parse_virtual_device_id(bad, known, split_count=10)
        assert info.value.reason == reason, bad
        assert str(info.value) == f"device ID {bad!r} {reason}"


def test_split_and_parse_read_nvidia_replica_ids_as_gpu_uuid_and_replica() -> None:
    # NVIDIA's k8s-device-plugin names a time-slicing replica `<GPU-UUID>::<n>` (rm.NewAnnotatedID)
    known = {A, B}
    assert split_virtual_device_id(f"{A}::3") == (A, 3)
    assert split_virtual_device_id("MIG-x-y::0") == ("MIG-x-y", 0)
    assert parse_virtual_device_id(f"{A}::0", known) == (A, 0)
    assert parse_virtual_device_id(f"{B}::12", known, split_count=13) == (B, 12)
    for bad, reason in [
        ("::1", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::x", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::01", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::-1", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::+1", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{A}::\u0663", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),  # Arabic-Indic 3
        (f"{A}::1::2", "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"),
        (f"{C}::1", f"names GPU {C}, which this node does not have"),
        (f"{A}::10", "has replica 10, but each GPU has 10"),
    ]:
        with pytest.raises(InvalidDeviceID) as info:
            parse_virtual_device_id(bad, known, split_count=10)
        assert info.value.reason == reason, bad
        assert str(info.value) == f"device ID {bad!r} {reason}"


@given(
    st.sampled_from([A, B, C, "GPU-1", "MIG-x-y"]),
    st.integers(min_value=0, max_value=10**4),
    st.sampled_from(["-", "::"]),
)
def test_hami_and_nvidia_virtual_ids_round_trip(uuid: str, replica: int, separator: str) -> None:
    device_id = f"{uuid}{separator}{replica}"
    assert split_virtual_device_id(device_id) == (uuid, replica)
    assert parse_virtual_device_id(device_id, {uuid}) == (uuid, replica)
    assert virtual_device_id(uuid, replica) == f"{uuid}-{replica}"  # ours keep HAMi's form


# --- HAMi's envs and mounts -------------------------------------------------------------------------------


def test_single_gpu_container_exact_response() -> None:
    response = respond(train_pod(container("main")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-7"])
    assert response == ContainerResponse(
        envs={
            "NVIDIA_VISIBLE_DEVICES": A,
            "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{CACHE}.cache",
            "LIBCUDA_LOG_LEVEL": "1",
        },
        mounts=(LIB, cache_mount("main"), LOCK, PRELOAD),
    )


def test_multi_gpu_container() -> None:
    response = respond(
        train_pod(container("main")), f"{B},NVIDIA,5000,20:{A},NVIDIA,2000,0:;", 0, [f"{A}-1", f"{B}-2"]
    )
    assert response.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{B},{A}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "5000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
        "CUDA_DEVICE_SM_LIMIT": "20",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{CACHE}.cache",
        "LIBCUDA_LOG_LEVEL": "1",
    }
    assert response.mounts == (LIB, cache_mount("main"), LOCK, PRELOAD)


def test_init_containers_come_first() -> None:
    pod = train_pod(container("app"), container("sidecar"), init=[container("setup")])
    annotation = f"{A},NVIDIA,1000,10:;{B},NVIDIA,2000,0:;;"
    first = respond(pod, annotation, 0, [f"{A}-0"])
    assert first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert cache_mount("setup") in first.mounts
    second = respond(pod, annotation, 1, [f"{B}-0"])
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == B
    assert cache_mount("app") in second.mounts
    with pytest.raises(AllocationError, match="allocation entry 2 has no GPUs"):
        respond(pod, annotation, 2, [f"{B}-0"])


@pytest.mark.parametrize(
    ("env", "preload"),
    [
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}], False),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "1"}], False),
        ([{"name": "X", "value": "1"}, {"name": "CUDA_DISABLE_CONTROL", "value": "True"}], False),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "false"}], True),
        ([{"name": "CUDA_DISABLE_CONTROL", "value": "yes"}], True),
        ([{"name": "CUDA_DISABLE_CONTROL"}], True),
        ([{"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"fieldRef": {}}}], True),
        ([], True),
    ],
)
def test_cuda_disable_control_skips_the_preload(env: list[dict[str, Any]], preload: bool) -> None:
    response = respond(train_pod(container("main", env=env)), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"])
    # HAMi v2.10 skips only /etc/ld.so.preload; libvgpu.so stays mounted for an opt-in LD_PRELOAD
    expected = (LIB, cache_mount("main"), LOCK, PRELOAD) if preload else (LIB, cache_mount("main"), LOCK)
    assert response.mounts == expected


@pytest.mark.parametrize(("scaling", "oversubscribed"), [(1.0, False), (0.8, False), (1.01, True), (3, True)])
def test_oversubscribe_iff_memory_scaling_above_one(scaling: float, oversubscribed: bool) -> None:
    config = replace(CONFIG, device_memory_scaling=scaling)
    envs = respond(train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"], config).envs
    assert ("CUDA_OVERSUBSCRIBE" in envs) is oversubscribed
    if oversubscribed:
        assert envs["CUDA_OVERSUBSCRIBE"] == "true"


def test_log_level_core_limit_hook_path_library_and_license() -> None:
    config = replace(CONFIG, lib_cuda_log_level=4, disable_core_limit=True, hook_path="/opt/hami")
    response = respond(
        train_pod(container("c")),
        f"{A},NVIDIA,3000,30:;",
        0,
        [f"{A}-0"],
        config,
        lib_path="/opt/hami/vgpu/libvgpu.so.v2.10.0",
        license_present=True,
    )
    assert response.envs["LIBCUDA_LOG_LEVEL"] == "4"
    assert response.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"/opt/hami/vgpu/{CACHE}.cache"
    assert response.mounts == (
        Mount("/opt/hami/vgpu/libvgpu.so", "/opt/hami/vgpu/libvgpu.so.v2.10.0", True),
        Mount("/opt/hami/vgpu", f"/opt/hami/vgpu/containers/{UID}_c", False),
        LOCK,
        Mount("/etc/ld.so.preload", "/opt/hami/vgpu/ld.so.preload", True),
        Mount("/tmp/license", "/opt/hami/vgpu/license", True),
        Mount("/usr/bin/vgpuvalidator", "/opt/hami/vgpu/vgpuvalidator", True),
    )
    assert container_cache_dir(config, UID, "c") == f"/opt/hami/vgpu/containers/{UID}_c"


MPS = replace(CONFIG, operating_mode=OperatingMode.MPS, mps_root="/run/nvidia/mps")


def test_mps_mode_is_hami_core_plus_the_mps_daemons_pipe_and_shm() -> None:
    response = respond(
        train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"], MPS, mps_started=True
    )
    hami_core = respond(train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"])
    # NVIDIA's device plugin's MPS client edits (internal/plugin/mps.go) on top of HAMi-core's.
    assert response.envs == {**hami_core.envs, "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe"}
    assert response.mounts == (
        *hami_core.mounts,
        Mount("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", False),
        Mount("/dev/shm", "/run/nvidia/mps/shm", False),
    )
    renamed = replace(MPS, resource_name="hami.io/vgpu")
    response = respond(
        train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"], renamed, mps_started=True
    )
    assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/hami.io/vgpu/pipe"


def test_mps_mode_fails_allocate_while_the_mps_daemon_is_not_started() -> None:
    with pytest.raises(AllocationError) as info:
        respond(train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{A}-0"], MPS, mps_started=False)
    assert info.value.pod == "team/train"
    assert info.value.message == (
        "pod team/train, container 'c': operating mode mps, but the MPS control daemon for nvidia.com/gpu "
        "is not running (/run/nvidia/mps/nvidia.com/gpu/.started does not exist)"
    )


# --- device list strategies --------------------------------------------------------------------------------

TWO = f"{A},NVIDIA,3000,30:{B},NVIDIA,3000,30:;"
TWO_IDS = [f"{A}-0", f"{B}-0"]
HAMI_CORE_KEYS = {
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "LIBCUDA_LOG_LEVEL",
}


def with_strategies(*strategies: DeviceListStrategy, prefix: str = "cdi.k8s.io/") -> ContainerResponse:
    config = replace(CONFIG, device_list_strategy=strategies, cdi_annotation_prefix=prefix)
    return respond(train_pod(container("c")), TWO, 0, TWO_IDS, config, cdi_id="resp-1")


def test_strategy_envvar() -> None:
    response = with_strategies(DeviceListStrategy.ENVVAR)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert not response.annotations and not response.cdi_devices


def test_strategy_volume_mounts() -> None:
    response = with_strategies(DeviceListStrategy.VOLUME_MOUNTS)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert response.mounts[:2] == (
        Mount(f"/var/run/nvidia-container-devices/{A}", "/dev/null", False),
        Mount(f"/var/run/nvidia-container-devices/{B}", "/dev/null", False),
    )
    assert response.mounts[2:] == (LIB, cache_mount("c"), LOCK, PRELOAD)


def test_strategy_cdi_annotations() -> None:
    response = with_strategies(DeviceListStrategy.CDI_ANNOTATIONS)
    assert response.annotations == {
        "cdi.k8s.io/nvidia-device-plugin_resp-1": (
            f"k8s.device-plugin.nvidia.com/gpu={A},k8s.device-plugin.nvidia.com/gpu={B}"
        )
    }
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs
    assert set(response.envs) == HAMI_CORE_KEYS
    assert response.mounts == (LIB, cache_mount("c"), LOCK, PRELOAD)
    custom = with_strategies(DeviceListStrategy.CDI_ANNOTATIONS, prefix="cdi.example.com/")
    assert list(custom.annotations) == ["cdi.example.com/nvidia-device-plugin_resp-1"]


def test_strategy_cdi_cri() -> None:
    response = with_strategies(DeviceListStrategy.CDI_CRI)
    assert response.cdi_devices == (
        f"k8s.device-plugin.nvidia.com/gpu={A}",
        f"k8s.device-plugin.nvidia.com/gpu={B}",
    )
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs and not response.annotations


def test_strategies_combined() -> None:
    response = with_strategies(
        DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI
    )
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert len(response.annotations) == 1 and len(response.cdi_devices) == 2
    both = with_strategies(DeviceListStrategy.ENVVAR, DeviceListStrategy.VOLUME_MOUNTS)
    assert both.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"


def test_cdi_annotation_id_defaults_to_the_cache_id_and_must_make_a_valid_key() -> None:
    config = replace(CONFIG, device_list_strategy=(DeviceListStrategy.CDI_ANNOTATIONS,))
    response = respond(train_pod(container("c")), TWO, 0, TWO_IDS, config)
    assert list(response.annotations) == [f"cdi.k8s.io/nvidia-device-plugin_{CACHE}"]
    with pytest.raises(ValueError, match="CDI annotation id"):
        respond(train_pod(container("c")), TWO, 0, TWO_IDS, config, cdi_id="a/b")
    with pytest.raises(ValueError, match="cache id"):
        container_allocate_response(
            train_pod(container("c")),
            decode_pod_allocation(TWO),
            0,
            TWO_IDS,
            gpus=GPUS,
            config=CONFIG,
            cache_id="../x",
        )


def test_duplicate_gpus_are_listed_once_but_limited_per_slice() -> None:
    response = respond(
        train_pod(container("c")), f"{A},NVIDIA,1000,10:{A},NVIDIA,2000,10:;", 0, [f"{A}-0", f"{A}-1"]
    )
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == A
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"


@pytest.mark.parametrize("preferred", [False, True])
def test_kubelet_devices_on_other_gpus_than_the_allocation_are_refused_in_every_mode(preferred: bool) -> None:
    # HAMi answers with the annotation's GPU (default) or kubelet's GPU with the annotation's limits
    # (enablegetpreferredallocation): either way kubelet's records and the container disagree.
    config = replace(CONFIG, enable_get_preferred_allocation=preferred)
    with pytest.raises(DeviceMismatchError) as info:
        respond(train_pod(container("c")), f"{A},NVIDIA,3000,30:;", 0, [f"{B}-4"], config)
    assert info.value.message == (
        f"pod team/train, container 'c': kubelet chose device(s) on GPU(s) {B}, but the scheduler placed "
        f"the container on {A}; the allocation names other GPUs. Refusing to give the container GPUs "
        "other than the ones kubelet records (its checkpoint and PodResources)"
    )
    assert (info.value.pod, info.value.container) == ("team/train", "c")
    assert (info.value.kubelet_gpus, info.value.scheduled_gpus) == ((B,), (A,))


# --- which GPUs a container really gets ---------------------------------------------------------------------


def test_grant_keeps_the_scheduler_slices_on_kubelets_gpus_in_kubelets_order() -> None:
    pod = train_pod(container("c"))
    pending_pod = PendingPod(
        "team", "train", UID, decode_pod_allocation(f"{A},NVIDIA,1000,10:{B},NVIDIA,2000,20:;")
    )
    granted = grant_container(pod, pending_pod, 0, [f"{B}-3", f"{A}-0"], gpus=GPUS)
    assert granted == ContainerAllocation((GPUSlice(B, 2000, 20), GPUSlice(A, 1000, 10)))


def test_allocate_with_nvidia_replica_ids_on_the_scheduled_gpus_gives_those_gpus() -> None:
    # a node moved from NVIDIA's plugin: kubelet's checkpoint may still hold `<GPU-UUID>::<n>` IDs
    pod = train_pod(container("c"))
    annotation = f"{A},NVIDIA,1000,10:{B},NVIDIA,2000,20:;"
    pending_pod = PendingPod("team", "train", UID, decode_pod_allocation(annotation))
    granted = grant_container(pod, pending_pod, 0, [f"{B}::3", f"{A}::0"], gpus=GPUS)
    assert granted == ContainerAllocation((GPUSlice(B, 2000, 20), GPUSlice(A, 1000, 10)))
    response = respond(pod, annotation, 0, [f"{B}::3", f"{A}::0"])
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert (response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], response.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "1000m",
        "2000m",
    )


INIT_ON_A_B = f"{A},NVIDIA,4000,10:{B},NVIDIA,4000,10:;{A},NVIDIA,3000,10:;"
"""An init container on A and B, then an app container planned on A (kubelet may reuse A or B)."""


def test_grant_moves_a_container_that_kubelet_gave_another_device_of_its_pod_within_the_footprint() -> None:
    pod = train_pod(container("app"), init=[container("prep")])
    pending_pod = PendingPod("team", "train", UID, decode_pod_allocation(INIT_ON_A_B), frozenset({0}))
    granted = grant_container(pod, pending_pod, 1, [f"{B}-5"], gpus=GPUS)
    assert granted == ContainerAllocation((GPUSlice(B, 3000, 10),))
    moved = pending_pod.with_allocated(1, granted)
    assert moved.granted == decode_pod_allocation(
        f"{A},NVIDIA,4000,10:{B},NVIDIA,4000,10:;{B},NVIDIA,3000,10:;"
    )
    assert moved.allocation == pending_pod.allocation  # what the scheduler accounted stays known
    response = container_allocate_response(
        pod, moved.current, 1, [f"{B}-5"], gpus=GPUS, config=CONFIG, cache_id=CACHE
    )
    assert (response.envs["NVIDIA_VISIBLE_DEVICES"], response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
        B,
        "3000m",
    )


def test_grant_refuses_a_move_that_would_hold_more_than_the_scheduler_accounted() -> None:
    pod = train_pod(container("app"), init=[container("prep")])
    bigger_app = f"{A},NVIDIA,4000,10:{B},NVIDIA,4000,10:;{A},NVIDIA,6000,10:;"
    pending_pod = PendingPod("team", "train", UID, decode_pod_allocation(bigger_app), frozenset({0}))
    with pytest.raises(DeviceMismatchError) as info:
        grant_container(pod, pending_pod, 1, [f"{B}-5"], gpus=GPUS)
    assert info.value.message == (
        f"pod team/train, container 'app': kubelet chose device(s) on GPU(s) {B}, but the scheduler placed "
        f"the container on {A}; moving it there would make the pod hold more than the scheduler accounted "
        f"for it ({B}: memory 6000 MiB > 4000 MiB). Refusing to give the container GPUs other than the "
        "ones kubelet records (its checkpoint and PodResources)"
    )
    outside = PendingPod("team", "train", UID, decode_pod_allocation(f"{A},NVIDIA,1000,10:;"))
    with pytest.raises(DeviceMismatchError, match=f"{C}: nothing of the pod was accounted there"):
        grant_container(train_pod(container("c")), outside, 0, [f"{C}-0"], gpus=GPUS)


# --- protobuf -------------------------------------------------------------------------------------------


def test_protobuf_conversion_round_trips_on_the_wire() -> None:
    response = with_strategies(
        DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI
    )
    message = to_proto(response)
    assert isinstance(message, api_pb2.ContainerAllocateResponse)
    decoded = api_pb2.ContainerAllocateResponse.FromString(message.SerializeToString())
    assert dict(decoded.envs) == dict(response.envs)
    assert [(m.container_path, m.host_path, m.read_only) for m in decoded.mounts] == [
        (m.container_path, m.host_path, m.read_only) for m in response.mounts
    ]
    assert dict(decoded.annotations) == dict(response.annotations)
    assert [d.name for d in decoded.cdi_devices] == list(response.cdi_devices)
    assert not decoded.devices
    assert to_proto(ContainerResponse()) == api_pb2.ContainerAllocateResponse()
    wrapped = api_pb2.AllocateResponse(container_responses=[message])
    assert wrapped.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] == "30"


# --- validation errors ----------------------------------------------------------------------------------


def test_count_mismatch_names_pod_and_container() -> None:
    with pytest.raises(CountMismatchError) as info:
        respond(train_pod(container("main")), TWO, 0, [f"{A}-0"])
    assert str(info.value) == (
        "pod team/train, container 'main': the scheduler assigned 2 GPU(s) but kubelet asked for 1 device(s)"
    )
    assert info.value.pod == "team/train"


def test_unknown_device_id() -> None:
    with pytest.raises(UnknownDeviceError) as info:
        respond(train_pod(container("main")), f"{A},NVIDIA,1,1:;", 0, ["GPU-ffff-0"])
    assert str(info.value) == (
        "pod team/train, container 'main': kubelet device ID 'GPU-ffff-0' names GPU GPU-ffff, "
        "which this node does not have"
    )
    with pytest.raises(UnknownDeviceError, match="is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>"):
        respond(train_pod(container("main")), f"{A},NVIDIA,1,1:;", 0, [A])


def test_assigned_gpu_missing_or_unhealthy() -> None:
    with pytest.raises(UnknownDeviceError) as info:
        respond(train_pod(container("main")), "GPU-gone,NVIDIA,1,1:;", 0, [f"{A}-0"])
    assert str(info.value) == (
        "pod team/train, container 'main': assigned GPU GPU-gone, which this node does not have"
    )
    sick = (NodeGPU(A, healthy=False), NodeGPU(B))
    with pytest.raises(UnhealthyGPUError) as unhealthy:
        respond(train_pod(init=[container("prep")]), f"{A},NVIDIA,1,1:;", 0, [f"{B}-0"], gpus=sick)
    assert (
        str(unhealthy.value) == f"pod team/train, init container 'prep': assigned GPU {A}, which is unhealthy"
    )
    assert unhealthy.value.pod == "team/train"


def test_entry_without_a_container() -> None:
    with pytest.raises(AllocationError) as info:
        respond(train_pod(container("only")), f";{A},NVIDIA,1,1:;", 1, [f"{A}-0"])
    assert str(info.value) == (
        "pod team/train: its allocation names GPUs for container #1, but the pod has only 1 containers"
    )


# --- matching a request to its pending pod ------------------------------------------------------------------


def pending(name: str, annotation: str, allocated: frozenset[int] = frozenset()) -> PendingPod:
    return PendingPod("team", name, f"uid-{name}", decode_pod_allocation(annotation), allocated)


def test_match_the_pod_whose_next_container_asks_for_that_count() -> None:
    one = pending("one", f"{A},NVIDIA,1000,0:;")
    two = pending("two", f"{A},NVIDIA,1000,0:{B},NVIDIA,1000,0:;")
    found = match_pending_pod([one, two], 2)
    assert found == PodMatch(two, 0)
    assert found.container.uuids == (A, B)
    assert found.completes_pod
    assert match_pending_pod([one, two], 1) == PodMatch(one, 0)


def test_containers_already_allocated_and_consumed_entries_are_skipped() -> None:
    pod = pending("multi", f";{A},NVIDIA,1,1:;{A},NVIDIA,1,1:{B},NVIDIA,1,1:;;")
    first = match_pending_pod([pod], 1)
    assert first == PodMatch(pod, 1) and not first.completes_pod
    assert match_pending_pod([pod], 2) == NoPendingPod(2, (("team/multi", 1),))
    after = pod.with_allocated(1)
    second = match_pending_pod([after], 2)
    assert second == PodMatch(after, 2) and second.completes_pod
    done = after.with_allocated(2)
    assert done.next_entry() is None
    assert match_pending_pod([done], 1) == NoPendingPod(1)


def test_no_pending_pod_then_errors() -> None:
    nothing = match_pending_pod([], 1)
    assert nothing == NoPendingPod(1)
    error = nothing.error("node-a")
    assert isinstance(error, NoPendingPodError)
    assert str(error) == (
        "kubelet asked for 1 device(s), but no pod bound to node node-a is waiting for GPUs "
        "(was the pod scheduled by the HAMi scheduler?)"
    )
    mismatch = match_pending_pod([pending("one", f"{A},NVIDIA,1,1:;")], 3)
    assert isinstance(mismatch, NoPendingPod)
    err = mismatch.error("node-a")
    assert isinstance(err, CountMismatchError)
    assert err.pod == "team/one"
    assert str(err) == (
        "kubelet asked for 3 device(s), but no pod pending on node node-a has a container waiting for 3 "
        "GPU(s); waiting: team/one (next container: 1 GPU(s))"
    )
    with pytest.raises(ValueError):
        match_pending_pod([], 0)


def test_ambiguous_pods_fail_loudly() -> None:
    x = pending("x", f"{A},NVIDIA,1,1:;")
    y = pending("y", f";{B},NVIDIA,1,1:;")
    z = pending("z", f"{A},NVIDIA,1,1:{B},NVIDIA,1,1:;")
    with pytest.raises(AmbiguousPodError) as info:
        match_pending_pod([y, z, x], 1)
    assert info.value.pods == ("team/x", "team/y")
    assert str(info.value) == (
        "2 pods pending on this node have a container waiting for 1 GPU(s): team/x, team/y; "
        "refusing to guess which one kubelet is admitting"
    )
    assert steering_gpus([x, y, z], 1) == ()
    assert steering_gpus([x, y, z], 2) == (A, B)
    assert steering_gpus([x], 5) == ()


def test_matched_pod_feeds_the_response() -> None:
    pod = train_pod(container("a"), container("b"))
    annotation = f"{A},NVIDIA,1000,10:;{B},NVIDIA,2000,20:{C},NVIDIA,2000,20:;"
    state = PendingPod("team", "train", UID, decode_pod_allocation(annotation))
    for ids in ([f"{A}-0"], [f"{B}-0", f"{C}-0"]):
        found = match_pending_pod([state], len(ids))
        assert isinstance(found, PodMatch)
        response = container_allocate_response(
            pod, state.allocation, found.entry, ids, gpus=GPUS, config=CONFIG, cache_id=CACHE
        )
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(found.container.uuids)
        state = state.with_allocated(found.entry)
    assert state.next_entry() is None


# --- GetPreferredAllocation ---------------------------------------------------------------------------------


def ids(gpu: str, *replicas: int) -> list[str]:
    return [virtual_device_id(gpu, r) for r in replicas]


def test_preferred_steers_to_the_scheduled_gpus() -> None:
    available = ids(A, 0, 1, 2) + ids(B, 0, 1) + ids(C, 5)
    assert preferred_allocation(available, [], 1, desired_gpus=[C]) == (f"{C}-5",)
    assert preferred_allocation(available, [], 2, desired_gpus=[B, C]) == (f"{B}-0", f"{C}-5")


def test_preferred_must_include_counts_towards_the_desired_gpus() -> None:
    available = ids(A, 0, 1) + ids(B, 0, 1)
    assert preferred_allocation(available, [f"{A}-1"], 2, desired_gpus=[A, B]) == (f"{A}-1", f"{B}-0")
    assert preferred_allocation(available, [f"{B}-1"], 2, desired_gpus=[A, B]) == (f"{B}-1", f"{A}-0")


def test_preferred_spreads_without_a_pod() -> None:
    available = ids(A, 0, 1, 2, 3) + ids(B, 0, 1) + ids(C, 0, 1, 2)
    # distinct GPUs first, the one with the most free replicas (fewest in use) first
    assert preferred_allocation(available, [], 2) == (f"{A}-0", f"{C}-0")
    assert preferred_allocation(available, [], 4) == (f"{A}-0", f"{C}-0", f"{B}-0", f"{A}-1")
    listed = ids(A, *range(10)) + ids(B, *range(2)) + ids(C, *range(3))
    # against the advertised list: B and C have nothing in use, A has 6
    assert preferred_allocation(available, [], 2, listed=listed) == (f"{B}-0", f"{C}-0")


def test_preferred_falls_back_to_spread_when_the_desired_gpu_is_full() -> None:
    available = ids(A, 0) + ids(B, 0, 1)
    assert preferred_allocation(available, [], 2, desired_gpus=[C, A]) == (f"{A}-0", f"{B}-0")


def nvidia_ids(gpu: str, *replicas: int) -> list[str]:
    return [f"{gpu}::{r}" for r in replicas]


def test_preferred_steers_nvidia_replica_ids_to_the_scheduled_gpus() -> None:
    available = nvidia_ids(A, 0, 1, 2) + nvidia_ids(B, 0, 1) + nvidia_ids(C, 5)
    assert preferred_allocation(available, [], 1, desired_gpus=[B]) == (f"{B}::0",)
    assert preferred_allocation(available, [], 2, desired_gpus=[C, B]) == (f"{C}::5", f"{B}::0")


def test_preferred_spreads_nvidia_replica_ids_counting_the_replicas_of_one_gpu_together() -> None:
    available = nvidia_ids(A, 0, 1, 2, 3) + nvidia_ids(B, 0, 1) + nvidia_ids(C, 0, 1, 2)
    # distinct GPUs first, the one with the most free replicas first
    assert preferred_allocation(available, [], 2) == (f"{A}::0", f"{C}::0")
    assert preferred_allocation(available, [f"{A}::2"], 3) == (f"{A}::2", f"{C}::0", f"{B}::0")
    listed = nvidia_ids(A, *range(10)) + nvidia_ids(B, *range(2)) + nvidia_ids(C, *range(3))
    # against the advertised list: B and C have nothing in use, A has 6
    assert preferred_allocation(available, [], 2, listed=listed) == (f"{B}::0", f"{C}::0")


def test_preferred_rejects_impossible_requests() -> None:
    with pytest.raises(PreferredAllocationError):
        preferred_allocation(ids(A, 0), [], 2)
    with pytest.raises(PreferredAllocationError):
        preferred_allocation(ids(A, 0, 1), [f"{B}-0"], 1)
    with pytest.raises(PreferredAllocationError):
        preferred_allocation(ids(A, 0, 1), ids(A, 0, 1), 1)


def gpu_of_id(device_id: str) -> str:
    """The GPU of a generated `<gpu>::<n>` or `<gpu>-<n>` ID (the test's own reading)."""
    return device_id.split("::", 1)[0] if "::" in device_id else device_id.rsplit("-", 1)[0]


@st.composite
def preferred_requests(draw: st.DrawFn) -> tuple[list[str], list[str], int, list[str], list[str]]:
    gpus = draw(st.lists(st.sampled_from([A, B, C, "GPU-d", "odd"]), min_size=1, max_size=5, unique=True))
    separator = draw(st.sampled_from(["-", "::"]))  # HAMi's IDs or NVIDIA's replica IDs
    listed = [f"{g}{separator}{r}" for g in gpus for r in range(draw(st.integers(1, 6)))]
    available = draw(st.lists(st.sampled_from(listed), min_size=1, unique=True))
    available = available + draw(st.lists(st.sampled_from(available), max_size=3))  # duplicates too
    unique = list(dict.fromkeys(available))
    must = draw(st.lists(st.sampled_from(unique), unique=True, max_size=len(unique)))
    size = draw(st.integers(len(must), len(unique)))
    desired = draw(st.lists(st.sampled_from([*gpus, "GPU-elsewhere"]), max_size=6))
    return available, must, size, desired, draw(st.sampled_from([listed, []]))


@given(preferred_requests())
def test_preferred_always_returns_exactly_size_ids_from_available(
    request: tuple[list[str], list[str], int, list[str], list[str]],
) -> None:
    available, must, size, desired, listed = request
    chosen = preferred_allocation(available, must, size, desired_gpus=desired, listed=listed)
    assert len(chosen) == size
    assert len(set(chosen)) == size
    assert set(chosen) <= set(available)
    assert set(must) <= set(chosen)
    assert list(chosen[: len(must)]) == must


@given(preferred_requests())
def test_preferred_honours_the_scheduled_gpus_when_they_have_room(
    request: tuple[list[str], list[str], int, list[str], list[str]],
) -> None:
    available, _, _, desired, _ = request
    by_gpu: dict[str, int] = {}
    for device_id in dict.fromkeys(available):
        gpu = gpu_of_id(device_id)
        by_gpu[gpu] = by_gpu.get(gpu, 0) + 1
    wanted = [g for g in dict.fromkeys(desired) if g in by_gpu][:3]
    if not wanted:
        return
    chosen = preferred_allocation(available, [], len(wanted), desired_gpus=wanted)
    assert sorted(gpu_of_id(c) for c in chosen) == sorted(wanted)


def test_plain_pod_allocation_helpers_agree() -> None:
    allocation = decode_pod_allocation(f"{A},NVIDIA,1,1:;;")
    assert isinstance(allocation, PodAllocation)
    assert PendingPod("n", "p", "u", allocation).next_entry() == allocation.next_pending() == 0
