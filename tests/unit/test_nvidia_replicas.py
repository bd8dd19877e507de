"""hami_node.nvidia.replicas: annotated IDs, ValidateRequest, the Allocate response from kubelet's IDs and
the preferred allocation of shared devices. Transcribed from NVIDIA/k8s-device-plugin v0.20.0:
internal/rm/rm_test.go TestValidateRequest, internal/rm/allocate_test.go (distributed / packed),
internal/plugin/server_test.go TestAllocate and TestCDIAllocateResponse. Left out: TestComparatorForPolicy's
empty and unknown policies (an unknown policy is refused at start-up here, `AllocationPolicy` has no
other value), TestComparatorsOrderSolelyByAllocated (a property of Go's comparator table, which this
module does not have: the rank is one key), the gds/mofed "additional CDI devices" cases (hami-node's CDI
spec defines no such devices)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.allocation import Mount
from hami_node.nvidia.config import (
    AllocationPolicy,
    DeviceIDStrategy,
    DeviceListStrategy,
    Flags,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
)
from hami_node.nvidia.device_map import Device
from hami_node.nvidia.replicas import (
    DeviceSpec,
    InvalidRequest,
    PreferredAllocationError,
    allocate_error,
    container_allocate_response,
    has_annotations,
    preferred_allocation,
    split_annotated_id,
    underlying_id,
    unique_device_ids,
    uses_aligned_allocation,
    validate_request,
)

GPU_X2 = (ReplicatedResource("nvidia.com/gpu", 2),)


def replicated(gpus: Sequence[str], replicas: int) -> list[Device]:
    """allocate_test.go newTestDevices."""
    return [Device(id=f"{g}::{r}", index=g, uuid=g, replicas=replicas) for g in gpus for r in range(replicas)]


def per_gpu(allocated: Sequence[str]) -> Counter[str]:
    """allocate_test.go countPerGPU."""
    return Counter(underlying_id(i) for i in allocated)


def by_id(devices: Sequence[Device]) -> dict[str, Device]:
    return {d.id: d for d in devices}


# --- annotated IDs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "split"),
    [
        ("GPU-a::3", ("GPU-a", 3)),
        ("GPU-a", ("GPU-a", 0)),
        ("GPU-a::x", ("GPU-a", 0)),
        ("MIG-b::0::1", ("MIG-b", 0)),
        ("GPU-a::", ("GPU-a", 0)),
    ],
)
def test_split_annotated_id_reads_a_bad_replica_as_zero(device_id: str, split: tuple[str, int]) -> None:
    """devices.go AnnotatedID.Split: SplitN(id, "::", 2), ParseInt's error ignored."""
    assert split_annotated_id(device_id) == split


def test_has_annotations_is_a_double_colon() -> None:
    assert has_annotations("GPU-a::0") and not has_annotations("GPU-a") and not has_annotations("0:1")


# --- rm_test.go TestValidateRequest ------------------------------------------------------------------------

FOUR = {i: Device(i, "0", underlying_id(i)) for i in ("device0::0", "device0::1", "device1::0", "device1::1")}
TWO = {i: Device(i, "0", i) for i in ("device0", "device1")}


@pytest.mark.parametrize(
    ("devices", "sharing", "request_ids", "error"),
    [
        pytest.param(TWO, Sharing(), ["device1"], None, id="valid device IDs -- no sharing"),
        pytest.param(
            TWO,
            Sharing(),
            ["device1", "device2"],
            "invalid request: unknown device: device2",
            id="invalid device IDs",
        ),
        pytest.param(
            FOUR, Sharing(ReplicatedResources(GPU_X2)), ["device0::1"], None, id="timeslicing single device"
        ),
        pytest.param(
            FOUR,
            Sharing(ReplicatedResources(GPU_X2)),
            ["device0::1", "device1::0"],
            None,
            id="timeslicing two devices",
        ),
        pytest.param(
            FOUR,
            Sharing(ReplicatedResources(GPU_X2, fail_requests_greater_than_one=True)),
            ["device0::1", "device1::0"],
            "invalid request: maximum request size for shared resources is 1; found 2",
            id="timeslicing with two devices -- failRequestsGreaterThanOne",
        ),
        pytest.param(
            FOUR, Sharing(mps=ReplicatedResources(GPU_X2)), ["device0::1"], None, id="MPS with single device"
        ),
        pytest.param(
            FOUR,
            Sharing(mps=ReplicatedResources(GPU_X2)),
            ["device0::1", "device1::0"],
            None,
            id="MPS two devices",
        ),
        pytest.param(
            FOUR,
            Sharing(mps=ReplicatedResources(GPU_X2, fail_requests_greater_than_one=True)),
            ["device0::1", "device1::0"],
            "invalid request: maximum request size for shared resources is 1; found 2",
            id="MPS with two devices -- failRequestsGreaterThanOne",
        ),
    ],
)
def test_validate_request_as_nvidia_does(
    devices: dict[str, Device], sharing: Sharing, request_ids: list[str], error: str | None
) -> None:
    if error is None:
        validate_request(devices, request_ids, sharing)
        return
    with pytest.raises(InvalidRequest) as err:
        validate_request(devices, request_ids, sharing)
    assert str(err.value) == error


def test_allocate_wraps_the_error_as_kubelet_shows_it() -> None:
    err = InvalidRequest("invalid request: maximum request size for shared resources is 1; found 2")
    assert allocate_error("nvidia.com/gpu", err) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: maximum request size for shared '
        "resources is 1; found 2"
    )


# --- server_test.go TestAllocate / TestCDIAllocateResponse -----------------------------------------------


def test_a_single_device_is_listed_in_nvidia_visible_devices() -> None:
    """server_test.go TestAllocate "single device"."""
    devices = {"foo": Device("foo", "0", "foo")}
    result = container_allocate_response(["foo"], devices, Flags(), cdi_response_id="uuid")
    assert dict(result.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "foo"}


def test_duplicate_device_ids_are_listed_once_in_request_order() -> None:
    """server_test.go TestAllocate "duplicate device IDs"."""
    devices = {i: Device(i, "0", i) for i in ("foo", "bar")}
    result = container_allocate_response(["foo", "bar", "foo"], devices, Flags(), cdi_response_id="uuid")
    assert dict(result.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "foo,bar"}


def test_two_replicas_of_one_gpu_give_the_gpu_once() -> None:
    result = container_allocate_response(["GPU-a::0", "GPU-a::3"], {}, Flags(), cdi_response_id="x")
    assert dict(result.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}


def test_the_index_strategy_lists_gpu_and_mig_indexes() -> None:
    devices = {"MIG-a::0": Device("MIG-a::0", "0:1", "MIG-a"), "GPU-b": Device("GPU-b", "1", "GPU-b")}
    assert unique_device_ids(devices, ["MIG-a::0", "GPU-b"], DeviceIDStrategy.INDEX) == ("0:1", "1")


def test_volume_mounts_list_each_device_as_a_dev_null_mount() -> None:
    flags = Flags(device_list_strategy=(DeviceListStrategy.VOLUME_MOUNTS,))
    result = container_allocate_response(["MIG-a"], {}, flags, cdi_response_id="x")
    assert dict(result.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert result.response.mounts == (Mount("/var/run/nvidia-container-devices/MIG-a", "/dev/null", False),)


@pytest.mark.parametrize(
    ("ids", "prefix", "imex", "annotations"),
    [
        pytest.param([], "cdi.k8s.io/", [], {}, id="empty device list has empty response"),
        pytest.param(
            ["gpu0"],
            "cdi.k8s.io/",
            [],
            {"cdi.k8s.io/nvidia-device-plugin_uuid": "k8s.device-plugin.nvidia.com/gpu=gpu0"},
            id="single device is added to annotations",
        ),
        pytest.param(
            ["gpu0"],
            "custom.cdi.k8s.io/",
            [],
            {"custom.cdi.k8s.io/nvidia-device-plugin_uuid": "k8s.device-plugin.nvidia.com/gpu=gpu0"},
            id="single device is added to annotations with custom prefix",
        ),
        pytest.param(
            ["gpu0", "gpu1"],
            "cdi.k8s.io/",
            [],
            {
                "cdi.k8s.io/nvidia-device-plugin_uuid": "k8s.device-plugin.nvidia.com/gpu=gpu0,"
                "k8s.device-plugin.nvidia.com/gpu=gpu1"
            },
            id="multiple devices are added to annotations",
        ),
        pytest.param(
            ["gpu0", "gpu1"],
            "custom.cdi.k8s.io/",
            [],
            {
                "custom.cdi.k8s.io/nvidia-device-plugin_uuid": "k8s.device-plugin.nvidia.com/gpu=gpu0,"
                "k8s.device-plugin.nvidia.com/gpu=gpu1"
            },
            id="multiple devices are added to annotations with custom prefix",
        ),
        pytest.param(
            [],
            "cdi.k8s.io/",
            ["0"],
            {"cdi.k8s.io/nvidia-device-plugin_uuid": "k8s.device-plugin.nvidia.com/imex-channel=0"},
            id="imex channel is included with devices",
        ),
    ],
)
def test_cdi_annotations_name_each_device(
    ids: list[str], prefix: str, imex: list[str], annotations: dict[str, str]
) -> None:
    """server_test.go TestCDIAllocateResponse (the qualified names are the real CDI kind, where NVIDIA's
    test mocks `nvidia.com/gpu`)."""
    flags = Flags(device_list_strategy=(DeviceListStrategy.CDI_ANNOTATIONS,), cdi_annotation_prefix=prefix)
    result = container_allocate_response(ids, {}, flags, cdi_response_id="uuid", imex_channels=imex)
    assert dict(result.response.annotations) == annotations
    assert dict(result.response.envs) == {}


def test_cdi_cri_with_envvar_gives_cdi_devices_and_the_env() -> None:
    flags = Flags(device_list_strategy=(DeviceListStrategy.CDI_CRI, DeviceListStrategy.ENVVAR))
    result = container_allocate_response(["MIG-a::1"], {}, flags, cdi_response_id="x")
    assert result.response.cdi_devices == ("k8s.device-plugin.nvidia.com/gpu=MIG-a",)
    assert dict(result.response.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-a"}


def test_gdrcopy_gds_and_mofed_set_their_envs() -> None:
    flags = Flags(gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True)
    envs = dict(container_allocate_response(["a"], {}, flags, cdi_response_id="x").response.envs)
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": "a",
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
    }


def test_pass_device_specs_gives_the_devices_nodes_under_the_dev_root() -> None:
    devices = {
        "MIG-a": Device("MIG-a", "0:0", "MIG-a", paths=("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12"))
    }
    flags = Flags(pass_device_specs=True, nvidia_dev_root="/run/nvidia/driver")
    result = container_allocate_response(
        ["MIG-a"], devices, flags, cdi_response_id="x", node_exists=lambda p: p == "/dev/nvidiactl"
    )
    assert result.device_specs == (
        DeviceSpec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
        DeviceSpec("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0"),
        DeviceSpec("/dev/nvidia-caps/nvidia-cap12", "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap12"),
    )


# --- allocate_test.go ---------------------------------------------------------------------------------------


def test_distributed_spreads_over_the_gpu_still_partly_available() -> None:
    """allocate_test.go TestDistributedAlloc_PartiallyAllocated_DistributesAcrossDistinctGPUs."""
    devices = replicated(["GPU-0", "GPU-1"], 2)
    allocated = preferred_allocation(devices, ["GPU-0::0", "GPU-0::1", "GPU-1::1"], [], 2)
    assert per_gpu(allocated) == {"GPU-0": 1, "GPU-1": 1}


@pytest.mark.parametrize(
    ("gpus", "replicas", "size", "counts"),
    [
        pytest.param(
            ["gpu0", "gpu1"], 4, 2, {"gpu0": 1, "gpu1": 1}, id="2 GPUs, 4 replicas each, allocate 2"
        ),
        pytest.param(
            ["gpu0", "gpu1", "gpu2"], 2, 3, {"gpu0": 1, "gpu1": 1, "gpu2": 1}, id="3 GPUs, allocate 3"
        ),
        pytest.param(
            ["gpu0", "gpu1"], 4, 4, {"gpu0": 2, "gpu1": 2}, id="2 GPUs, 4 replicas each, allocate 4"
        ),
        pytest.param(["gpu0"], 4, 1, {"gpu0": 1}, id="allocate 1 from single GPU"),
    ],
)
def test_distributed_alloc(gpus: list[str], replicas: int, size: int, counts: dict[str, int]) -> None:
    """allocate_test.go TestDistributedAlloc."""
    devices = replicated(gpus, replicas)
    assert per_gpu(preferred_allocation(devices, [d.id for d in devices], [], size)) == counts


def test_distributed_with_partial_availability_allocates_what_is_asked() -> None:
    """allocate_test.go TestDistributedAlloc "partial availability simulates pre-allocated state"."""
    devices = replicated(["gpu0", "gpu1"], 4)
    assert len(preferred_allocation(devices, [d.id for d in devices if d.uuid == "gpu1"], [], 2)) == 2


@pytest.mark.parametrize("policy", list(AllocationPolicy))
def test_too_few_available_devices_give_nvidias_error(policy: AllocationPolicy) -> None:
    """allocate_test.go TestDistributedAlloc / TestPackedAlloc "not enough devices"."""
    devices = replicated(["gpu0"], 2)
    with pytest.raises(PreferredAllocationError, match="not enough available devices to satisfy allocation"):
        preferred_allocation(devices, [d.id for d in devices], [], 5, policy)


@pytest.mark.parametrize(
    ("gpus", "replicas", "size", "shape"),
    [
        pytest.param(["gpu0", "gpu1"], 4, 2, [2], id="2 GPUs, 4 replicas each, allocate 2 -- same GPU"),
        pytest.param(["gpu0", "gpu1", "gpu2"], 2, 3, [2, 1], id="3 GPUs, 2 replicas each, allocate 3"),
        pytest.param(["gpu0", "gpu1"], 4, 4, [4], id="2 GPUs, 4 replicas each, allocate 4 -- one GPU"),
        pytest.param(["gpu0", "gpu1"], 4, 5, [4, 1], id="2 GPUs, allocate 5 -- fill one then overflow"),
        pytest.param(["gpu0"], 4, 1, [1], id="allocate 1 from single GPU"),
    ],
)
def test_packed_alloc(gpus: list[str], replicas: int, size: int, shape: list[int]) -> None:
    """allocate_test.go TestPackedAlloc."""
    devices = replicated(gpus, replicas)
    allocated = preferred_allocation(devices, [d.id for d in devices], [], size, AllocationPolicy.PACKED)
    assert sorted(per_gpu(allocated).values(), reverse=True) == shape


def test_distributed_is_the_default_and_deterministic() -> None:
    """allocate_test.go TestDistributedAllocIsDefault."""
    devices = replicated(["gpu0", "gpu1", "gpu2"], 4)
    results = {preferred_allocation(devices, [d.id for d in devices], [], 3) for _ in range(10)}
    assert len(results) == 1
    assert per_gpu(results.pop()) == {"gpu0": 1, "gpu1": 1, "gpu2": 1}


def test_packed_and_distributed_differ_on_the_same_input() -> None:
    """allocate_test.go TestPackedVsDistributedContrast."""
    devices = replicated(["gpu0", "gpu1"], 4)
    available = [d.id for d in devices]
    assert per_gpu(preferred_allocation(devices, available, [], 4)) == {"gpu0": 2, "gpu1": 2}
    assert len(per_gpu(preferred_allocation(devices, available, [], 4, AllocationPolicy.PACKED))) == 1


def test_full_gpus_take_the_aligned_path_and_replicas_and_mig_devices_do_not() -> None:
    """allocate_test.go TestFullGPUNodeIgnoresAllocationPolicy (its three sub-cases)."""
    full = [Device(u, str(i), u, paths=(f"/dev/nvidia{i}",)) for i, u in enumerate(["GPU-aaa", "GPU-bbb"])]
    assert uses_aligned_allocation(full, [d.id for d in full])
    mig = [Device("MIG-aaa", "0:0", "MIG-aaa")]
    assert not uses_aligned_allocation(mig, ["MIG-aaa"])
    reps = replicated(["gpu0"], 4)
    assert not uses_aligned_allocation(reps, [d.id for d in reps])


def test_required_devices_come_first_and_count_as_allocated() -> None:
    devices = replicated(["gpu0", "gpu1"], 2)
    allocated = preferred_allocation(devices, [d.id for d in devices], ["gpu0::0"], 2)
    assert allocated == ("gpu0::0", "gpu1::0")


# --- properties ----------------------------------------------------------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[Device], list[str], int]:
    gpus = [f"gpu{i}" for i in range(draw(st.integers(1, 5)))]
    devices = replicated(gpus, draw(st.integers(1, 6)))
    available = draw(st.lists(st.sampled_from([d.id for d in devices]), unique=True, min_size=1))
    size = draw(st.integers(1, len(available)))
    return devices, available, size


@given(requests(), st.sampled_from(list(AllocationPolicy)))
def test_preferred_allocation_gives_exactly_the_size_asked_from_available_devices(
    request: tuple[list[Device], list[str], int], policy: AllocationPolicy
) -> None:
    devices, available, size = request
    allocated = preferred_allocation(devices, available, [], size, policy)
    assert len(allocated) == size
    assert len(set(allocated)) == size
    assert set(allocated) <= set(available)


@given(requests())
def test_distributed_never_takes_a_second_replica_of_a_gpu_while_a_free_gpu_has_none_taken(
    request: tuple[list[Device], list[str], int],
) -> None:
    """On an idle node (everything available), distributed spreads: per-GPU counts differ by at most 1
    among GPUs that still had replicas left."""
    devices, _available, size = request
    everything = [d.id for d in devices]
    size = min(size, len(everything))
    counts = per_gpu(preferred_allocation(devices, everything, [], size))
    per = {d.uuid for d in devices}
    taken = [counts.get(g, 0) for g in per]
    assert max(taken) - min(taken) <= 1


@given(requests())
def test_packed_fills_one_gpu_before_starting_another_on_an_idle_node(
    request: tuple[list[Device], list[str], int],
) -> None:
    devices, _available, size = request
    everything = [d.id for d in devices]
    replicas = devices[0].replicas
    counts = per_gpu(preferred_allocation(devices, everything, [], size, AllocationPolicy.PACKED))
    partial = [c for c in counts.values() if c < replicas]
    assert len(partial) <= 1
