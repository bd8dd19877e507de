"""hami_control.devices.iluvatar: HAMi's Iluvatar backends, their Go tests
(pkg/device/iluvatar/device_test.go, v2.10.0) transcribed case by case, plus the webhook's mutation,
the handshake, the `iluvatars` device-config list and property tests of the request reader and the
inventory decoder."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_control.devices.base import (
    MUTEX_LOCK,
    DeviceRequest,
    FitContext,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
)
from hami_control.devices.config import parse_device_config
from hami_control.devices.iluvatar import CONTAINER_ENV, Iluvatar, build, chart_names
from hami_control.usage import GPUUsage
from tests.builders import container, node

COUNT = "iluvatar.ai/MR-V100-vgpu"
MEM = "iluvatar.ai/MR-V100.vMem"
CORES = "iluvatar.ai/MR-V100.vCore"
REGISTER = "hami.io/node-MR-V100-register"
TO_ALLOCATE = "hami.io/MR-V100-devices-to-allocate"
ALLOCATED = "hami.io/MR-V100-devices-allocated"
NOW = datetime(2026, 8, 21, 12, 0, 0)

# Every Go test builds the MR-V100 chip with the chart's names.
V100 = Iluvatar(chart_names("MR-V100"))


def usage(
    id: str,
    *,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    totalmem: int = 128,
    usedcores: int = 0,
    health: bool = True,
) -> GPUUsage:
    """A Go test's DeviceUsage: the inventory entry and the injected Used/Usedmem/Usedcores."""
    info = GPUInfo(id, 0, count, totalmem, 100, "MR-V100", 0, "", health)
    return GPUUsage(info, used, usedmem, usedcores)


def context(annotations: Mapping[str, str] | None = None) -> FitContext:
    """The pod of a Go Fit test; its `hami.io/gpu-scheduler-policy` annotation is the policy chain."""
    annos = dict(annotations or {})
    pod = {"metadata": {"annotations": annos}}
    policy = annos.get("hami.io/gpu-scheduler-policy")
    return FitContext(pod, policy=decode_gpu_policy(policy)) if policy else FitContext(pod)


# --- TestGetNodeDevices --------------------------------------------------------------------------------


def test_node_devices_decode_the_legacy_register_annotation() -> None:
    # HAMi pkg/device/iluvatar/device_test.go TestGetNodeDevices "exist device"
    text = "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,10,8192,100,MR-V100,0,true:"
    (device,) = V100.node_devices(node("node-01", annotations={REGISTER: text})) or ()
    assert (device.id, device.index, device.count, device.devcore, device.devmem) == (
        "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae",
        0,
        10,
        100,
        8192,
    )
    assert (device.type, device.numa, device.health) == ("MR-V100", 0, True)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[]", id='TestGetNodeDevices "no device"'),
        pytest.param("", id='TestGetNodeDevices "failed to unmarshal node devices"'),
    ],
)
def test_node_devices_refuse_what_is_not_the_legacy_form(text: str) -> None:
    # HAMi: DecodeNodeDevices fails ("node annotation missing device separator"), no devices
    with pytest.raises(WireFormatError, match=REGISTER):
        V100.node_devices(node("node-01", annotations={REGISTER: text}))


def test_node_devices_none_without_the_annotation() -> None:
    # HAMi pkg/device/iluvatar/device_test.go TestGetNodeDevices "no annotation"
    assert V100.node_devices(node("node-01")) is None
    # another chip's annotation is not this one's
    assert (
        V100.node_devices(
            node("node-01", annotations={"hami.io/node-MR-V50-register": "a,1,1,100,MR-V50,0,true:"})
        )
        is None
    )


@given(st.text(max_size=80))
def test_inventory_decoding_returns_devices_or_raises_wire_format_error(text: str) -> None:
    try:
        devices = V100.node_devices(node("node-01", annotations={REGISTER: text}))
    except WireFormatError:
        return
    assert devices is not None
    assert all(isinstance(d, GPUInfo) for d in devices)


# --- the handshake (device.CheckHealth) ----------------------------------------------------------------


def test_health_is_the_handshake_on_the_chips_own_key() -> None:
    # (ours) IluvatarDevices.CheckHealth = device.CheckHealth(cw, ResourceCountName)
    key = "hami.io/node-handshake-MR-V100"
    assert V100.node_health(
        node("node-01", annotations={key: "Reported 2026-08-21 11:00:00"}), NOW
    ) == NodeHealth(True, True, "Requesting_2026-08-21 12:00:00")
    stale = {key: "Requesting_2026-08-21 11:58:00"}
    drained = node("node-01", annotations=stale, allocatable={COUNT: "0"})
    assert V100.node_health(drained, NOW) == NodeHealth(False, False)
    serving = node("node-01", annotations=stale, allocatable={COUNT: "4"})
    assert V100.node_health(serving, NOW) == NodeHealth(True, False)
    fresh = {key: "Requesting_2026-08-21 11:59:30"}
    assert V100.node_health(node("node-01", annotations=fresh), NOW) == NodeHealth(True, False)


# --- TestPatchAnnotations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "want"),
    [
        pytest.param(PodAllocation(), {}, id="No devices"),
        pytest.param(
            PodAllocation((ContainerAllocation((GPUSlice("k8s-gpu-iluvatar-0", 0, 0, "MR-V100"),)),)),
            {
                TO_ALLOCATE: "k8s-gpu-iluvatar-0,MR-V100,0,0:;",
                ALLOCATED: "k8s-gpu-iluvatar-0,MR-V100,0,0:;",
            },
            id="With devices",
        ),
    ],
)
def test_pod_annotations_write_the_pod_device_string(devices: PodAllocation, want: dict[str, str]) -> None:
    # HAMi pkg/device/iluvatar/device_test.go TestPatchAnnotations (case name = id)
    assert V100.pod_annotations({}, devices, node="n", now=NOW.replace(tzinfo=UTC)) == want


# --- Test_MutateAdmission and the webhook's mutation ---------------------------------------------------


def test_mutate_finds_the_count_and_sets_cores_to_count_times_100() -> None:
    # HAMi pkg/device/iluvatar/device_test.go Test_MutateAdmission
    # "IluvatarResourceCount and IluvatarResourceCores set to limits" (want true); the container has no
    # name, so no env is added; the cores limit becomes 2 x 100
    ctr = container(None, limits={COUNT: "2", CORES: "1"})
    assert V100.mutate(ctr, {}).found
    assert ctr == container(None, limits={COUNT: "2", CORES: "200"})


def test_mutate_adds_the_container_name_env_once() -> None:
    # (ours) MutateAdmission: SOL_CONTINER_NAME=<name> unless present
    ctr: dict[str, Any] = {"name": "train", "resources": {"limits": {COUNT: "1"}}}
    assert V100.mutate(ctr, {}).found
    assert ctr["env"] == [{"name": CONTAINER_ENV, "value": "train"}]
    assert "iluvatar.ai/MR-V100.vCore" not in ctr["resources"]["limits"]  # count 1: cores untouched
    again = copy.deepcopy(ctr)
    V100.mutate(again, {})
    assert again == ctr
    kept: dict[str, Any] = {
        "name": "x",
        "env": [{"name": "A", "value": "1"}],
        "resources": {"limits": {COUNT: "1"}},
    }
    V100.mutate(kept, {})
    assert kept["env"] == [{"name": "A", "value": "1"}, {"name": CONTAINER_ENV, "value": "x"}]


@pytest.mark.parametrize(
    ("count", "cores"),
    [("3", "300"), ("10", "1k"), ("1.5", "200"), ("1", None), ("0", None)],
    ids=["3 devices", "canonical quantity", "Value() rounds up", "one device", "zero"],
)
def test_mutate_sets_the_cores_limit_as_kubernetes_writes_it(count: str, cores: str | None) -> None:
    # (ours) ctr.Resources.Limits[cores] = resource.NewQuantity(count.Value()*100, DecimalSI)
    ctr = container(None, limits={COUNT: count})
    V100.mutate(ctr, {})
    assert ctr["resources"]["limits"].get(CORES) == cores


def test_mutate_ignores_a_count_in_requests_only_and_other_chips() -> None:
    # (ours) only this chip's count, only in limits
    ctr = {"name": "c", "resources": {"requests": {COUNT: "2"}, "limits": {"iluvatar.ai/MR-V50-vgpu": "2"}}}
    before = copy.deepcopy(ctr)
    assert not V100.mutate(ctr, {}).found
    assert ctr == before


# --- Test_checkType ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("MR-V100", True, id='Test_checkType "the same type"'),
        pytest.param("test123", False, id='Test_checkType "the different type"'),
    ],
)
def test_type_check_compares_the_request_type_with_the_common_word(request_type: str, allowed: bool) -> None:
    # HAMi pkg/device/iluvatar/device_test.go Test_checkType (empty DeviceUsage: its Type is not read)
    assert V100.type_allowed({}, GPUUsage(GPUInfo("d")), DeviceRequest(1, request_type)) is allowed


# --- Test_GenerateResourceRequests ---------------------------------------------------------------------


def both(values: Mapping[str, str]) -> Any:
    return container(limits=values, requests=values)


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(
            both({COUNT: "1", MEM: "1000", CORES: "100"}),
            DeviceRequest(1, "MR-V100", 256000, 0, 100),
            id="all resources set to limits and requests",
        ),
        pytest.param(
            container(limits={}, requests={}), None, id="all resources don't set to limits and requests"
        ),
        pytest.param(
            both({COUNT: "1"}),
            DeviceRequest(1, "MR-V100", 0, 100, 0),
            id="resourcemem don't set to limits and requests",
        ),
        pytest.param(
            container(limits={COUNT: "1", MEM: "16Gi"}),
            None,
            id="memory overflowing int32 is rejected, not truncated to zero",
        ),
        pytest.param(
            container(limits={COUNT: "1", MEM: "16.0Gi"}),
            None,
            id="decimal-form memory request is rejected, not treated as zero",
        ),
    ],
)
def test_request_reads_count_vmem_times_256_and_cores_default_0(ctr: Any, want: DeviceRequest | None) -> None:
    # HAMi pkg/device/iluvatar/device_test.go Test_GenerateResourceRequests (case name = id)
    assert V100.request(ctr) == want


QUANTITY = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["1.5", "16Gi", "16.0Gi", "1e3", "1k", "abc", "", "0.5m"]),
)


@given(count=QUANTITY, memory=st.one_of(st.none(), QUANTITY), cores=st.one_of(st.none(), QUANTITY))
def test_request_is_never_negative(count: Any, memory: Any, cores: Any) -> None:
    limits = {COUNT: count}
    if memory is not None:
        limits[MEM] = memory
    if cores is not None:
        limits[CORES] = cores
    got = V100.request(container(limits=limits))
    if got is not None:
        assert 0 < got.nums <= 2**31 - 1
        assert 0 <= got.memreq <= 2**31 - 1
        assert 0 <= got.coresreq <= 2**31 - 1
        assert got.type == "MR-V100"


# --- TestFit_MutexRejectsUsedDevice, Test_Fit ----------------------------------------------------------

FIT_CASES = [
    pytest.param(
        [usage("dev-0", used=1)],
        DeviceRequest(1, "MR-V100", 64, 0, 50),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
        id="TestFit_MutexRejectsUsedDevice",
    ),
    pytest.param(
        [usage("dev-0"), usage("dev-1")],
        DeviceRequest(1, "MR-V100", 64, 0, 50),
        {},
        ["dev-1"],
        "",
        id='Test_Fit "fit success"',
    ),
    pytest.param(
        [usage("dev-0")],
        DeviceRequest(1, "MR-V100", 512, 0, 50),
        {},
        [],
        "1/1 CardInsufficientMemory",
        id='Test_Fit "fit fail: memory not enough"',
    ),
    pytest.param(
        [usage("dev-0", usedcores=100)],
        DeviceRequest(1, "MR-V100", 512, 0, 50),
        {},
        [],
        "1/1 CardInsufficientMemory",  # the Go case's memory (512 > 128) fails first
        id='Test_Fit "fit fail: core not enough"',
    ),
    pytest.param(
        [usage("dev-0")],
        DeviceRequest(1, "OtherType", 512, 0, 50),
        {},
        [],
        "1/1 CardTypeMismatch",
        id='Test_Fit "fit fail: type mismatch"',
    ),
    pytest.param(
        [usage("dev-0", used=1, count=2)],
        DeviceRequest(1, "MR-V100", 64, 0, 50),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
        id='Test_Fit "mutex policy rejects used device"',
    ),
    pytest.param(
        [usage("dev-0", health=False)],
        DeviceRequest(1, "MR-V100", 64, 0, 50),
        {},
        [],
        "1/1 CardNotHealth",
        id='Test_Fit "fit fail: CardNotHealth"',
    ),
]


@pytest.mark.parametrize(("devices", "request_", "annotations", "want_ids", "want_reason"), FIT_CASES)
def test_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage],
    request_: DeviceRequest,
    annotations: dict[str, str],
    want_ids: list[str],
    want_reason: str,
) -> None:
    # HAMi pkg/device/iluvatar/device_test.go (test function and case name = id)
    result = V100.fit(devices, request_, context(annotations))
    if want_ids:
        assert isinstance(result, Picked), result
        assert result.slices == tuple(
            GPUSlice(i, request_.memreq, request_.coresreq, "MR-V100") for i in want_ids
        )
    else:
        assert isinstance(result, Unfit), result
        assert result.message == want_reason


def test_fit_uuid_annotations_are_the_chips_own() -> None:
    # (ours) CheckUUID with hami.io/use-<cw>-uuid / hami.io/no-use-<cw>-uuid
    devices = [usage("dev-0"), usage("dev-1")]
    request = DeviceRequest(1, "MR-V100", 64, 0, 50)
    use = V100.fit(devices, request, context({"hami.io/use-MR-V100-uuid": "dev-0"}))
    assert isinstance(use, Picked)
    assert use.slices[0].uuid == "dev-0"
    nouse = V100.fit(devices, request, context({"hami.io/no-use-MR-V100-uuid": "dev-0, dev-1"}))
    assert isinstance(nouse, Unfit)
    assert nouse.message == "2/2 CardUuidMismatch"
    other = V100.fit(devices, request, context({"hami.io/use-MR-V50-uuid": "dev-0"}))
    assert isinstance(other, Picked)
    assert other.slices[0].uuid == "dev-1"


# --- TestDevices_LockNode, TestDevices_ReleaseNodeLock -------------------------------------------------


@pytest.mark.parametrize(
    "containers",
    [
        pytest.param([], id='TestDevices_LockNode "Test with no containers"'),
        pytest.param(
            [container(requests={})], id='TestDevices_LockNode "Test with non-zero resource requests"'
        ),
        pytest.param([], id='TestDevices_ReleaseNodeLock "Test with no containers"'),
        pytest.param(
            [container(requests={})],
            id='TestDevices_ReleaseNodeLock "Test with non-zero resource requests"',
        ),
    ],
)
def test_the_node_lock_is_hamis_mutex_taken_only_for_a_request(containers: list[Any]) -> None:
    # HAMi: LockNode/ReleaseNodeLock do nothing (nil error) when no regular container asks this chip,
    # else nodelock's hami.io/mutex.lock; the binder takes it, the backend's part is the data.
    assert V100.names.lock is LockKind.MUTEX
    assert V100.names.lock_annotation == MUTEX_LOCK == "hami.io/mutex.lock"
    assert all(V100.request(c) is None for c in containers)


# --- the device config ---------------------------------------------------------------------------------


def test_build_gives_one_vendor_per_chart_chip() -> None:
    vendors = build(parse_device_config("", "device-config.yaml"))
    assert [v.names.common_word for v in vendors] == ["MR-V100", "MR-V50", "BI-V150", "BI-V100"]
    assert all(isinstance(v, Iluvatar) for v in vendors)
    table = vendors[2].names
    assert (table.count, table.memory, table.cores, table.memory_factor) == (
        "iluvatar.ai/BI-V150-vgpu",
        "iluvatar.ai/BI-V150.vMem",
        "iluvatar.ai/BI-V150.vCore",
        256,
    )
    assert (table.register, table.handshake) == (
        "hami.io/node-BI-V150-register",
        "hami.io/node-handshake-BI-V150",
    )
    assert (table.to_allocate, table.allocated) == (
        "hami.io/BI-V150-devices-to-allocate",
        "hami.io/BI-V150-devices-allocated",
    )
    assert (table.use_uuid, table.nouse_uuid) == ("hami.io/use-BI-V150-uuid", "hami.io/no-use-BI-V150-uuid")
    assert vendors[0].names == chart_names("MR-V100")


def test_build_reads_the_files_list() -> None:
    text = (
        "iluvatars:\n"
        "- chipName: X1\n"
        "  commonWord: X1\n"
        "  resourceCountName: example.com/x1\n"
        "  resourceMemoryName: example.com/x1-mem\n"
        "  resourceCoreName: example.com/x1-core\n"
    )
    (vendor,) = build(parse_device_config(text, "device-config.yaml"))
    assert vendor.names.common_word == "X1"
    assert vendor.names.count == "example.com/x1"
    assert build(parse_device_config("iluvatars: []\n", "device-config.yaml")) == ()


ENTRY = "  resourceCountName: a/b\n  resourceMemoryName: a/m\n  resourceCoreName: a/c\n"


@pytest.mark.parametrize(
    ("text", "key", "line", "reason"),
    [
        ("iluvatars:\n- commonWord: MR V100\n" + ENTRY, "iluvatars[0].commonWord", 2, "letters, digits"),
        ("iluvatars:\n- chipName: X\n" + ENTRY, "iluvatars[0].commonWord", None, "is required"),
        (
            "iluvatars:\n- commonWord: A\n" + ENTRY + "- commonWord: A\n" + ENTRY,
            "iluvatars[1].commonWord",
            6,
            "already used by iluvatars[0]",
        ),
        (
            "iluvatars:\n- commonWord: A\n" + ENTRY + "  resourceCorename: x\n",
            "iluvatars[0].resourceCorename",
            6,
            "not a known key",
        ),
        (
            "iluvatars:\n- commonWord: A\n  resourceCountName: ''\n",
            "iluvatars[0].resourceCountName",
            3,
            "must name",
        ),
        ("iluvatars:\n  commonWord: A\n", "iluvatars", 1, "must be a list"),
    ],
    ids=[
        "common word with a space",
        "no common word",
        "duplicate common word",
        "misspelt key",
        "empty count name",
        "not a list",
    ],
)
def test_build_refuses_a_bad_value_naming_key_and_line(
    text: str, key: str, line: int | None, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build(parse_device_config(text, "device-config.yaml"))
    assert info.value.key == key
    if line is not None:
        assert info.value.line == line
    assert reason in info.value.reason
    assert "device-config.yaml" in str(info.value)
