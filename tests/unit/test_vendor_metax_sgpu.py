"""hami_control.devices.metax_sgpu: MetaX sGPU (Metax-SGPU), with HAMi's own tests
(pkg/device/metax/sdevice_test.go, protocol_test.go, qos_test.go, v2.10.0) transcribed case by case."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.annotations import decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_control.devices import metax_sgpu as sg
from hami_control.devices.base import (
    MUTEX_LOCK,
    DeviceRequest,
    FitContext,
    Inventory,
    LockKind,
    Picked,
    Unfit,
    custom_info,
    custom_text,
)
from hami_control.usage import GPUUsage
from tests.builders import node, pod

SGPU = sg.MetaxSGPU(sg.names())
CW = "Metax-SGPU"
NOW = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def device(
    uuid: str,
    *,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    mem: int = 128,
    usedcores: int = 0,
    cores: int = 100,
    health: bool = True,
    custom: dict[str, Any] | None = None,
) -> GPUUsage:
    """HAMi's DeviceUsage as the Go tests inject it (Used/Usedmem/Usedcores set directly)."""
    info = GPUInfo(
        uuid, count=count, devmem=mem, devcore=cores, type=CW, health=health, custom=custom_text(custom)
    )
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def zone(uuid: str, link: int, used: int = 0) -> GPUUsage:
    """A device with a MetaLink zone (custominfo LinkZone), as the prioritize/score tests build them."""
    return device(uuid, used=used, custom={"LinkZone": float(link)})


def request(nums: int = 1, memreq: int = 512, pct: int = 0, cores: int = 50, kind: str = CW) -> DeviceRequest:
    return DeviceRequest(nums, kind, memreq, pct, cores)


def context(annotations: dict[str, str] | None = None, **kwargs: Any) -> FitContext:
    """The pod of the Go test; the mutex policy as the scheduler reads it from its annotation."""
    policy = (annotations or {}).get("hami.io/gpu-scheduler-policy")
    if policy is not None:
        kwargs["policy"] = decode_gpu_policy(policy)
    return FitContext(pod=pod(annotations=annotations), **kwargs)


ONLINE_POD = pod(annotations={sg.APP_CLASS: sg.ONLINE})
OFFLINE_POD = pod(annotations={sg.APP_CLASS: sg.OFFLINE})
NORMAL_POD = pod()


def exclusive(*uuids: str, cores: int = 100) -> PodAllocation:
    return PodAllocation((ContainerAllocation(tuple(GPUSlice(u, 0, cores, CW) for u in uuids)),))


def ids(devices: list[GPUUsage]) -> list[str]:
    return [d.id for d in devices]


# --- names and lock (the data) ------------------------------------------------------------------------------


def test_the_names_are_hamis_metax_sgpu_keys_with_the_mutex_lock() -> None:
    # HAMi pkg/device/metax/sdevice.go InitMetaxSDevice, GetResourceNames, LockNode (nodelock
    # "hami.io/mutex.lock", taken only for a regular container that asks sGPUs); protocol.go keys
    names = SGPU.names
    assert (names.common_word, names.family) == ("Metax-SGPU", "metax")
    assert (names.count, names.memory, names.cores, names.memory_factor) == (
        "metax-tech.com/sgpu",
        "metax-tech.com/vmemory",
        "metax-tech.com/vcore",
        1024,
    )
    assert names.to_allocate == "hami.io/metax-sgpu-devices-to-allocate"
    assert names.allocated == "hami.io/metax-sgpu-devices-allocated"
    assert (names.register, names.inventory, names.handshake) == (
        "metax-tech.com/node-gpu-devices",
        Inventory.CUSTOM,
        "",
    )
    assert (names.lock, names.lock_annotation) == (LockKind.MUTEX, MUTEX_LOCK)
    assert (names.use_uuid, names.nouse_uuid) == (
        "metax-tech.com/use-gpuuuid",
        "metax-tech.com/nouse-gpuuuid",
    )


def test_metax_sgpu_carries_hamis_policy_neutral_score_marker() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestMetaxSDevicesImplementsPolicyNeutralScorer
    assert SGPU.policy_neutral is True


# --- GetNodeDevices / CheckHealth (getMetaxSDevices, convertMetaxSDeviceToHAMIDevice) -----------------------


NORMAL = (
    '[{"uuid": "GPU-123", "model": "sgpu", "totalDevCount": 16, "totalCompute": 100, "bdf": "0000:44:00.0", '
    '"totalVRam" : 32768, "numa": 1, "healthy": true, "qosPolicy": "fixed-share"}]'
)


def test_get_metax_sdevices_of_a_normal_node() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestGetMetaxSDevices "test normal node"
    got = SGPU.node_devices(node("normal", annotations={sg.NODE_DEVICES: NORMAL}))
    assert got == (
        GPUInfo(
            "GPU-123",
            index=0,
            count=16,
            devmem=32768,
            devcore=100,
            type="Metax-SGPU",
            numa=1,
            mode="",
            health=True,
            custom=custom_text({"QosPolicy": "fixed-share", "Model": "sgpu", "LinkZone": 0.0}),
        ),
    )
    assert SGPU.node_health(node("normal", annotations={sg.NODE_DEVICES: NORMAL}), NOW).healthy is True


def test_get_metax_sdevices_without_the_annotation_has_none_and_the_node_is_unhealthy() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestGetMetaxSDevices "test annotations nil"
    assert SGPU.node_devices(node("normal", annotations={})) is None
    assert SGPU.node_devices(node("normal")) is None
    health = SGPU.node_health(node("normal", annotations={}), NOW)
    assert (health.healthy, health.update) == (False, True)


def test_get_metax_sdevices_of_an_annotation_that_is_not_json_fails_and_the_node_is_unhealthy() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestGetMetaxSDevices "test Unmarshal fail"
    with pytest.raises(WireFormatError, match=r"metax-tech\.com/node-gpu-devices"):
        SGPU.node_devices(node("normal", annotations={sg.NODE_DEVICES: ""}))
    health = SGPU.node_health(node("normal", annotations={sg.NODE_DEVICES: ""}), NOW)
    assert (health.healthy, health.update) == (False, True)


@pytest.mark.parametrize("text", ["[]", "null"])
def test_get_metax_sdevices_of_an_empty_list_has_no_devices_and_the_node_is_unhealthy(text: str) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestGetMetaxSDevices "test devices len 0" (and Go's null)
    assert SGPU.node_devices(node("normal", annotations={sg.NODE_DEVICES: text})) == ()
    assert SGPU.node_health(node("normal", annotations={sg.NODE_DEVICES: text}), NOW).healthy is False


def test_convert_metax_sdevices_to_hami_devices() -> None:
    # HAMi pkg/device/metax/protocol_test.go TestConvertMetaxSDeviceToHAMIDevice "base test"
    text = json.dumps(
        [
            {
                "uuid": "GPU-a16ac188-0592-5c8f-2b6e-8bd8e7a604a9",
                "bdf": "0000:0a:00.0",
                "model": "native",
                "totalDevCount": 16,
                "totalCompute": 100,
                "totalVRam": 64 * 1024,
                "availableDevCount": 6,
                "availableCompute": 50,
                "availableVRam": 32 * 1024,
                "numa": 0,
                "healthy": True,
                "qosPolicy": "best-effort",
                "linkZone": 1,
            },
            {
                "uuid": "GPU-a16ac188-0592-5c8f-2b6e-8bd8e7a604a8",
                "bdf": "0000:09:00.0",
                "model": "sgpu",
                "totalDevCount": 8,
                "totalCompute": 100,
                "totalVRam": 32 * 1024,
                "availableDevCount": 6,
                "availableCompute": 50,
                "availableVRam": 32 * 1024,
                "numa": -1,
                "healthy": False,
                "qosPolicy": "burst-share",
                "linkZone": 2,
            },
        ]
    )
    got = SGPU.node_devices(node("normal", annotations={sg.NODE_DEVICES: text}))
    assert got == (
        GPUInfo(
            "GPU-a16ac188-0592-5c8f-2b6e-8bd8e7a604a9",
            index=0,
            count=16,
            devmem=65536,
            devcore=100,
            type="Metax-SGPU",
            numa=0,
            health=True,
            custom=custom_text({"QosPolicy": "best-effort", "Model": "native", "LinkZone": 1.0}),
        ),
        GPUInfo(
            "GPU-a16ac188-0592-5c8f-2b6e-8bd8e7a604a8",
            index=1,
            count=8,
            devmem=32768,
            devcore=100,
            type="Metax-SGPU",
            numa=-1,
            health=False,
            custom=custom_text({"QosPolicy": "burst-share", "Model": "sgpu", "LinkZone": 2.0}),
        ),
    )
    assert [sg.link_zone(d) for d in got] == [1, 2]


def test_the_inventory_keys_match_case_insensitively_as_in_go() -> None:
    got = sg.decode_sdevices('[{"UUID":"g","TotalDevCount":4,"Healthy":true,"QOSPOLICY":"fixed-share"}]')
    assert (got[0].id, got[0].count, got[0].health) == ("g", 4, True)
    assert custom_info(got[0])["QosPolicy"] == "fixed-share"


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ('[{"uuid":"g","totalVRam":2147483648}]', "totalVRam"),
        ('[{"uuid":"g","totalCompute":1.5}]', "totalCompute"),
        ('[{"uuid":"g","healthy":"true"}]', "healthy"),
        ('[{"uuid":"g","qosPolicy":1}]', "qosPolicy"),
        ("[null]", "device 0"),
        ('[{"bdf":"x"}]', "uuid"),
        ('[{"uuid":"g"},{"uuid":"g"}]', "appears twice"),
        ('{"uuid":"g"}', "is not an array"),
    ],
)
def test_an_inventory_go_would_refuse_or_crash_on_is_a_wire_format_error_naming_the_part(
    text: str, part: str
) -> None:
    with pytest.raises(WireFormatError, match=part):
        sg.decode_sdevices(text)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(sg._SDEVICE_KEYS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)


@given(st.one_of(st.text(max_size=80), _JSON.map(json.dumps), st.lists(_JSON).map(json.dumps)))
@settings(max_examples=400)
def test_decoding_any_inventory_gives_devices_or_a_wire_format_error(text: str) -> None:
    try:
        got = sg.decode_sdevices(text)
    except WireFormatError:
        return
    assert all(isinstance(d, GPUInfo) and d.type == CW for d in got)
    assert SGPU.node_health(node("normal", annotations={sg.NODE_DEVICES: text}), NOW).healthy is bool(got)


# --- MutateAdmission --------------------------------------------------------------------------------------

BE, FS, BS = sg.BEST_EFFORT, sg.FIXED_SHARE, sg.BURST_SHARE
QOS, APP = sg.QOS_POLICY, sg.APP_CLASS

MUTATE_CASES: list[Any] = [
    pytest.param({}, {"metadata": {"annotations": {QOS: BE}}}, False, "", {QOS: BE}, id="no sgpu resource"),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {QOS: "best-effortx"}}},
        True,
        "metax-tech.com/sgpu-qos-policy must be set one of [best-effort, fixed-share, burst-share]",
        {QOS: "best-effortx"},
        id="qos policy error",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {}}},
        True,
        "",
        {QOS: BE},
        id="no qos policy",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"}, {"metadata": {}}, True, "", {QOS: BE}, id="pod annotation nil"
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {QOS: BS}}},
        True,
        "",
        {QOS: BS},
        id="qos policy fit",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "2"},
        {"metadata": {"annotations": {APP: "online"}}},
        True,
        "app-class pod must request single device",
        {APP: "online"},
        id="app class task must allocate single device",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {APP: "oNLine"}}},
        True,
        "metax-tech.com/sgpu-app-class must be set one of [online, offline]",
        {APP: "oNLine"},
        id="app class task verify error",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {APP: "offline", QOS: "best-effortx"}}},
        True,
        "metax-tech.com/sgpu-qos-policy must be set one of [best-effort, fixed-share, burst-share]",
        {APP: "offline", QOS: "best-effortx"},
        id="offline task with qos",
    ),
    pytest.param(
        {"metax-tech.com/sgpu": "1"},
        {"metadata": {"annotations": {APP: "online", QOS: "best-effortx"}}},
        True,
        "",
        {APP: "online", QOS: "best-effortx"},
        id="online task with qos",
    ),
]


@pytest.mark.parametrize(("limits", "before", "found", "error", "after"), MUTATE_CASES)
def test_mutate_admission_checks_app_class_and_qos_and_defaults_the_qos_to_best_effort(
    limits: dict[str, str], before: dict[str, Any], found: bool, error: str, after: dict[str, str]
) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestMutateAdmission (all 9 cases, ids = Go's names)
    container: dict[str, Any] = {"name": "c", "resources": {"limits": dict(limits)}}
    the_pod = copy.deepcopy(before)
    admission = SGPU.mutate(container, the_pod)
    assert (admission.found, admission.error) == (found, error)
    assert the_pod == {"metadata": {"annotations": after}}
    assert container == {"name": "c", "resources": {"limits": limits}}


def test_an_app_class_pod_asking_a_fraction_of_one_device_counts_as_one_as_gos_value_does() -> None:
    the_pod = pod(annotations={APP: "offline", QOS: FS})
    assert SGPU.mutate({"resources": {"limits": {"metax-tech.com/sgpu": "500m"}}}, the_pod).error == ""


def test_mutate_admission_reads_limits_only() -> None:
    assert SGPU.mutate({"resources": {"requests": {"metax-tech.com/sgpu": "1"}}}, pod()).found is False


# --- GenerateResourceRequests -------------------------------------------------------------------------------


def limits(**values: str) -> dict[str, Any]:
    return {"resources": {"limits": {f"metax-tech.com/{k}": v for k, v in values.items()}}}


REQUEST_CASES: list[Any] = [
    pytest.param(limits(sgpu="1"), DeviceRequest(1, CW, 0, 100, 100), id="one full sgpu test"),
    pytest.param(limits(sgpu="2"), DeviceRequest(2, CW, 0, 100, 100), id="two full sgpu test"),
    pytest.param(
        limits(sgpu="1", vcore="30"), DeviceRequest(1, CW, 0, 100, 30), id="one sgpu test set vcore"
    ),
    pytest.param(
        limits(sgpu="1", vmemory="16"),
        DeviceRequest(1, CW, 16 * 1024, 0, 100),
        id="one sgpu test set vmemory",
    ),
    pytest.param(
        limits(sgpu="1", vcore="60", vmemory="16"),
        DeviceRequest(1, CW, 16 * 1024, 0, 60),
        id="one sgpu test set vcore&vmemory",
    ),
    pytest.param(
        limits(sgpu="1", vcore="60", vmemory="1024Mi"),
        DeviceRequest(1, CW, 1024, 0, 60),
        id="one sgpu test set vcore&vmemory, mem unit Mi",
    ),
    pytest.param(
        limits(sgpu="1", vcore="60", vmemory="16Gi"),
        DeviceRequest(1, CW, 16 * 1024, 0, 60),
        id="one sgpu test set vcore&vmemory, mem unit Gi",
    ),
    pytest.param(
        limits(sgpu="1", vmemory="2100001"),
        None,
        id="oversized memory request exceeds int32 range (no unit, pre-multiply guard)",
    ),
    pytest.param(limits(sgpu="2200000000"), None, id="oversized sgpu count exceeds int32 range"),
    pytest.param(limits(sgpu="1", vcore="2200000000"), None, id="oversized vcore exceeds int32 range"),
]


@pytest.mark.parametrize(("container", "expected"), REQUEST_CASES)
def test_generate_resource_requests(container: dict[str, Any], expected: DeviceRequest | None) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestGenerateResourceRequests (all 10 cases, ids = Go's names)
    assert SGPU.request(container) == expected


@pytest.mark.parametrize(
    ("vmemory", "memreq"),
    [("1000", 0), ("1k", 0), ("3Gi", 3072), ("2097151", 2097151 * 1024), ("1.5", 0)],
    ids=["1000 is 1k: bytes", "1k: bytes", "3Gi", "the largest bare GiB", "not whole: unset"],
)
def test_vmemory_is_gib_when_its_canonical_text_has_no_unit_else_bytes(vmemory: str, memreq: int) -> None:
    got = SGPU.request(limits(sgpu="1", vmemory=vmemory))
    assert got is not None and got.memreq == memreq and got.mem_percentage == (100 if memreq == 0 else 0)


def test_generate_resource_requests_reads_limits_only() -> None:
    assert SGPU.request({"resources": {"requests": {"metax-tech.com/sgpu": "1"}}}) is None


@pytest.mark.parametrize(
    "container",
    [limits(sgpu="0"), limits(sgpu="-1"), limits(sgpu="1", vcore="-1"), limits(sgpu="1", vmemory="-1")],
)
def test_generate_resource_requests_is_none_for_a_value_out_of_range(container: dict[str, Any]) -> None:
    assert SGPU.request(container) is None


_QUANTITY = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "e3", "e-3"]),
    ),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=12),
)


@given(count=_QUANTITY, cores=_QUANTITY, memory=_QUANTITY)
@settings(max_examples=400)
def test_a_request_never_has_a_negative_or_out_of_range_field(count: Any, cores: Any, memory: Any) -> None:
    container = {
        "resources": {
            "limits": {
                "metax-tech.com/sgpu": count,
                "metax-tech.com/vcore": cores,
                "metax-tech.com/vmemory": memory,
            }
        }
    }
    got = SGPU.request(container)
    if got is not None:
        assert 1 <= got.nums <= 2**31 - 1
        assert 0 <= got.memreq <= 2**31 - 1 and 0 <= got.coresreq <= 2**31 - 1
        assert got.mem_percentage in (0, 100)


# --- Fit ----------------------------------------------------------------------------------------------------

FIT_CASES: list[Any] = [
    pytest.param([device("dev-0"), device("dev-1")], request(memreq=64), {}, ["dev-1"], "", id="fit success"),
    pytest.param(
        [device("dev-0")], request(), {}, None, "1/1 CardInsufficientMemory", id="fit fail: memory not enough"
    ),
    pytest.param(
        [device("dev-0", mem=1024, usedcores=100)],
        request(),
        {},
        None,
        "1/1 CardInsufficientCore",
        id="fit fail: core not enough",
    ),
    pytest.param(
        [device("dev-0")],
        request(kind="OtherType"),
        {},
        None,
        "1/1 CardTypeMismatch",
        id="fit fail: type mismatch",
    ),
    pytest.param(
        [device("dev-0", used=1, usedmem=64, usedcores=10)],
        request(),
        {APP: "online"},
        None,
        "1/1 CardAppClassMismatch",
        id="fit fail: online task, app class unfit",
    ),
    # "fit fail: normal task, app class unfit" needs the pods on the device: see the device_pods test below
    pytest.param(
        [device("dev-0", health=False)],
        request(),
        {},
        None,
        "1/1 CardUnhealthy",
        id="fit fail: device unhealthy",
    ),
    pytest.param(
        [device("dev-0", used=100, mem=1280)],
        request(),
        {},
        None,
        "1/1 CardTimeSlicingExhausted",
        id="fit fail: card overused",
    ),
    pytest.param(
        [device("dev-0", mem=1280)],
        request(cores=120),
        {},
        None,
        "1/1 CardInsufficientCore",
        id="fit success: but core limit can't exceed 100",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280)],
        request(cores=100),
        {},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id="fit fail:  card exclusively",
    ),
    pytest.param(
        [device("dev-1", mem=1280)],
        request(nums=2),
        {sg.USE_UUID: "dev-0"},
        None,
        "1/1 CardUuidMismatch",
        id="fit fail: user assign use uuid mismatch",
    ),
    pytest.param(
        [device("dev-0", mem=1280)],
        request(nums=2),
        {sg.NOUSE_UUID: "dev-0"},
        None,
        "1/1 CardUuidMismatch",
        id="fit fail: user assign no use uuid match",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=100)],
        request(cores=0),
        {},
        None,
        "1/1 CardComputeUnitsExhausted",
        id="fit fail:  CardComputeUnitsExhausted",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=10)],
        request(nums=2, cores=20),
        {},
        None,
        "1/1 AllocatedCardsInsufficientRequest",
        id="fit fail:  AllocatedCardsInsufficientRequest",
    ),
    pytest.param(
        [device("dev-0", used=20, mem=1280, usedcores=10)],
        request(memreq=0, pct=10, cores=20),
        {},
        ["dev-0"],
        "",
        id="fit success:  memory percentage",
    ),
    pytest.param(
        [device("dev-0", used=1)],
        request(memreq=64),
        {"hami.io/gpu-scheduler-policy": "mutex"},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id="mutex policy rejects used device",
    ),
]


@pytest.mark.parametrize(("devices", "req", "annotations", "picked", "reason"), FIT_CASES)
def test_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage],
    req: DeviceRequest,
    annotations: dict[str, str],
    picked: list[str] | None,
    reason: str,
) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestMetaxSDevices_Fit (15 of 16 cases here, ids = Go's names)
    got = SGPU.fit(devices, req, context(annotations))
    if picked is None:
        assert isinstance(got, Unfit), got
        assert got.message == reason
    else:
        assert isinstance(got, Picked), got
        assert [s.uuid for s in got.slices] == picked


def test_a_normal_pod_does_not_join_a_device_running_an_online_pod() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestMetaxSDevices_Fit "fit fail: normal task, app class unfit"
    devices = [device("dev-0", used=1, usedmem=64, usedcores=10)]
    got = SGPU.fit(devices, request(), context(), device_pods={"dev-0": [ONLINE_POD]})
    assert isinstance(got, Unfit) and got.message == "1/1 CardAppClassMismatch"


def test_fit_records_the_devices_type_the_memory_and_the_cores() -> None:
    got = SGPU.fit([device("dev-0", mem=1280)], request(memreq=0, pct=50, cores=30), context())
    assert isinstance(got, Picked)
    assert got.slices == (GPUSlice("dev-0", 640, 30, "Metax-SGPU"),)


def test_an_online_pod_skips_the_core_checks_and_records_no_cores() -> None:
    devices = [device("dev-0", mem=1280, usedcores=100)]
    got = SGPU.fit(devices, request(cores=60), context({APP: "online"}))
    assert isinstance(got, Picked) and got.slices == (GPUSlice("dev-0", 512, 0, "Metax-SGPU"),)


def test_the_first_rule_a_device_breaks_is_its_reason_and_every_device_is_counted() -> None:
    devices = [device("a", health=False), device("b", mem=64), device("c", used=100), device("d", mem=1280)]
    got = SGPU.fit(devices, request(nums=2), context())
    assert isinstance(got, Unfit)
    assert got.message == (
        "1/4 AllocatedCardsInsufficientRequest, 1/4 CardInsufficientMemory, 1/4 CardTimeSlicingExhausted, "
        "1/4 CardUnhealthy"
    )


# --- QoS: checkDeviceQos, AddResourceUsage's mark, the jittery QoS cache ------------------------------------


@pytest.mark.parametrize(
    ("used", "qos", "cores", "reason"),
    [
        pytest.param(0, BS, 50, "", id="check no use device"),
        pytest.param(2, BS, 100, "1/1 ExclusiveDeviceAllocateConflict", id="check request exclusive"),
        pytest.param(2, BS, 50, "1/1 CardQosPolicyMismatch", id="check fail"),
        pytest.param(2, BE, 50, "", id="check pass"),
    ],
)
def test_check_device_qos(used: int, qos: str, cores: int, reason: str) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestCheckDeviceQos (all 4 cases, through Fit: "check request
    # exclusive" passes the QoS check and stops at the exclusivity check after it)
    the_device = device("GPU-123", used=used, mem=1280, custom={"QosPolicy": qos})
    got = SGPU.fit([the_device], request(cores=cores), context({QOS: BE}))
    assert (got.message if isinstance(got, Unfit) else "") == reason
    assert sg.qos_fits(BE, qos, used, cores) is (reason != "1/1 CardQosPolicyMismatch")


def test_a_device_with_no_qos_policy_takes_any_pod() -> None:
    got = SGPU.fit([device("g", used=3, mem=1280, custom={"QosPolicy": ""})], request(), context({QOS: FS}))
    assert isinstance(got, Picked)


def test_the_qos_cache_overrides_the_policy_the_device_reports() -> None:
    # HAMi pkg/device/metax/qos_test.go TestGet "test get": the cached GPU-789 -> burst-share is what
    # checkDeviceQos reads
    cache = {"GPU-123": FS, "GPU-789": BS}
    busy = [device("GPU-789", used=1, mem=1280, custom={"QosPolicy": BE})]
    assert isinstance(SGPU.fit(busy, request(), context({QOS: BS}), qos_cache=cache), Picked)
    got = SGPU.fit(busy, request(), context({QOS: BS}))
    assert isinstance(got, Unfit) and got.message == "1/1 CardQosPolicyMismatch"


@pytest.mark.parametrize(
    ("cores", "fits"), [(50, True), (100, True)], ids=["shared slice", "exclusive slice"]
)
def test_a_device_the_pod_already_has_a_slice_on_runs_the_pods_qos_for_its_later_containers(
    cores: int, fits: bool
) -> None:
    # HAMi sdevice.go AddResourceUsage: the device's QosPolicy becomes the pod's ("" when exclusive)
    earlier = PodAllocation((ContainerAllocation((GPUSlice("g", 100, cores, CW),)),))
    busy = [device("g", used=1, usedmem=100, usedcores=cores, mem=1280, custom={"QosPolicy": BS})]
    got = SGPU.fit(
        busy, request(cores=0 if cores == 100 else 10), context({QOS: BE}, allocated={CW: earlier})
    )
    assert (not isinstance(got, Unfit) or got.message != "1/1 CardQosPolicyMismatch") is fits
    alone = SGPU.fit(busy, request(cores=10), context({QOS: BE}))
    assert isinstance(alone, Unfit) and alone.message == "1/1 CardQosPolicyMismatch"


def test_fit_records_the_devices_custom_info_with_the_qos_the_pod_leaves_on_it() -> None:
    the_device = device("g", mem=1280, custom={"QosPolicy": BS, "Model": "sgpu", "LinkZone": 1.0})
    got = SGPU.fit([the_device], request(), context({QOS: BE}))
    assert isinstance(got, Picked)
    assert got.custom == ({"QosPolicy": BS, "Model": "sgpu", "LinkZone": 1.0},)


def test_add_jittery_qos_expects_the_pods_policy_on_shared_devices_and_none_on_exclusive_ones() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestAddJitteryQos "request BestEffort"
    devices = PodAllocation(
        (
            ContainerAllocation((GPUSlice("GPU-123", 0, 50, CW), GPUSlice("GPU-456", 0, 50, CW))),
            ContainerAllocation((GPUSlice("GPU-789", 0, 100, CW),)),
        )
    )
    custom = [[{"QosPolicy": BE}, {"QosPolicy": BS}], [{"QosPolicy": BE}]]
    expected = {"GPU-456": BE, "GPU-789": ""}
    assert sg.jittery_qos(BE, devices, custom) == expected
    assert SGPU.qos_expectations(pod(annotations={QOS: BE}), devices, custom) == expected
    assert SGPU.qos_expectations(ONLINE_POD, devices, custom) == {}


@pytest.mark.parametrize(
    ("cache", "expected"),
    [
        pytest.param({"GPU-123": FS, "GPU-789": BS}, {"GPU-123": FS, "GPU-789": BS}, id="no sync"),
        pytest.param({"GPU-123": BE, "GPU-789": BS}, {"GPU-789": BS}, id="sync sccuess"),
        pytest.param({"GPU-123": BE, "GPU-789": BE}, {}, id="sync sccuess (all)"),
    ],
)
def test_jittery_qos_cache_sync_drops_the_devices_now_at_their_expected_policy(
    cache: dict[str, str], expected: dict[str, str]
) -> None:
    # HAMi pkg/device/metax/qos_test.go TestJitteryQosCacheSync (all 3 cases; Go names two "sync sccuess")
    inventory = [device(u, custom={"QosPolicy": BE}).info for u in ("GPU-123", "GPU-456", "GPU-789")]
    assert sg.sync_jittery_qos(cache, inventory) == expected


# --- app classes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_class", "used", "pods", "fits"),
    [
        pytest.param("online", 0, [], True, id="idle device fit"),
        pytest.param("", 1, [ONLINE_POD], False, id="normal task unfit online device"),
        pytest.param("", 1, [OFFLINE_POD], False, id="normal task unfit offline device"),
        pytest.param("", 1, [NORMAL_POD], True, id="normal task fit normal device"),
        pytest.param("online", 1, [NORMAL_POD], False, id="online task unfit normal device"),
        pytest.param(
            "online", 2, [ONLINE_POD, OFFLINE_POD], True, id="online task fit online/offline device"
        ),
        pytest.param("offline", 2, [ONLINE_POD, OFFLINE_POD], False, id="offline task unfit online device"),
    ],
)
def test_check_app_class(request_class: str, used: int, pods: list[dict[str, Any]], fits: bool) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestCheckAppClass (all 7 cases, through Fit)
    annotations = {APP: request_class, QOS: BE} if request_class else {QOS: BE}
    the_device = device("GPU-123", used=used, mem=1280, usedcores=10)
    got = SGPU.fit([the_device], request(cores=10), context(annotations), device_pods={"GPU-123": pods})
    if fits:
        assert isinstance(got, Picked), got
    else:
        assert isinstance(got, Unfit) and got.message == "1/1 CardAppClassMismatch"
    assert sg.app_class_fits(request_class, used, pods) is fits


def pods_of(online: int, offline: int) -> list[dict[str, Any]]:
    return [ONLINE_POD] * online + [OFFLINE_POD] * offline


PRIORITIZE_ONLINE_CASES: list[Any] = [
    pytest.param(
        [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1), (0, 2)], "GPU-1", id="prioritize idle device"
    ),
    pytest.param([(1, 0), (2, 0), (3, 1), (0, 2)], "GPU-1", id="prioritize onlyOnline device"),
    pytest.param([(3, 0), (1, 1), (2, 1), (0, 1), (0, 2)], "GPU-2", id="prioritize online&offline device"),
    pytest.param([(0, 1), (0, 2)], "GPU-1", id="prioritize onlyOffline device"),
]


@pytest.mark.parametrize(("tasks", "best"), PRIORITIZE_ONLINE_CASES)
def test_prioritize_online_devices(tasks: list[tuple[int, int]], best: str) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestPrioritizeOnlineDevices (all 4 cases; devices GPU-1.. with
    # (online, offline) tasks; require 1)
    candidates = [device(f"GPU-{i + 1}") for i in range(len(tasks))]
    device_pods = {f"GPU-{i + 1}": pods_of(*t) for i, t in enumerate(tasks)}
    assert ids(sg.prioritize_online(candidates, 1, device_pods)) == [best]


def test_an_online_pod_prefers_the_device_with_fewer_online_tasks_over_the_last_one() -> None:
    devices = [device("idle", mem=1280), device("busy", used=1, mem=1280)]
    online = context({APP: "online"})
    got = SGPU.fit(devices, request(), online, device_pods={"busy": [ONLINE_POD]})
    assert isinstance(got, Picked) and [s.uuid for s in got.slices] == ["idle"]
    offline = SGPU.fit(
        devices, request(), context({APP: "offline", QOS: BE}), device_pods={"busy": [OFFLINE_POD]}
    )
    assert isinstance(offline, Picked) and [s.uuid for s in offline.slices] == ["busy"]  # HAMi's order


# --- MetaLink topology --------------------------------------------------------------------------------------

Z = list[tuple[str, int]]
PRIORITIZE_EXCLUSIVE_CASES: list[Any] = [
    pytest.param([("GPU-1", 1), ("GPU-2", 1), ("GPU-5", 2)], 1, ["GPU-5"], id="require one device"),
    pytest.param(
        [("GPU-1", 1), ("GPU-2", 1), ("GPU-5", 2), ("GPU-6", 2), ("GPU-7", 2)],
        2,
        ["GPU-1", "GPU-2"],
        id="require two device",
    ),
    pytest.param(
        [("GPU-1", 1), ("GPU-2", 1), ("GPU-5", 2), ("GPU-6", 2), ("GPU-7", 2), ("GPU-8", 2)],
        4,
        ["GPU-5", "GPU-6", "GPU-7", "GPU-8"],
        id="require four device, best result",
    ),
    pytest.param(
        [("GPU-1", 1), ("GPU-2", 1), ("GPU-5", 2), ("GPU-6", 2), ("GPU-7", 2)],
        4,
        ["GPU-1", "GPU-2", "GPU-5", "GPU-6"],
        id="require four device, general result",
    ),
    pytest.param(
        [("GPU-5", 0), ("GPU-6", 0), ("GPU-7", 0)],
        2,
        ["GPU-5", "GPU-6"],
        id="no metalink, require two device",
    ),
    pytest.param(
        [("GPU-3", 0), ("GPU-4", 0), ("GPU-7", 1), ("GPU-8", 1)],
        2,
        ["GPU-7", "GPU-8"],
        id="part metalink, require two device, best result",
    ),
    pytest.param(
        [("GPU-3", 0), ("GPU-4", 0), ("GPU-6", 1), ("GPU-7", 1), ("GPU-8", 1)],
        4,
        ["GPU-6", "GPU-7", "GPU-8", "GPU-3"],
        id="part metalink, require four device, bad result",
    ),
]


@pytest.mark.parametrize(("zones", "require", "expected"), PRIORITIZE_EXCLUSIVE_CASES)
def test_prioritize_exclusive_devices(zones: Z, require: int, expected: list[str]) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestPrioritizeExclusiveDevices (all 7 cases)
    assert ids(sg.prioritize_exclusive([zone(u, z) for u, z in zones], require)) == expected


def test_an_exclusive_pod_without_app_class_prefers_one_metalink_zone() -> None:
    devices = [zone("GPU-1", 1), zone("GPU-2", 1), zone("GPU-5", 2)]
    one = SGPU.fit(devices, request(nums=1, memreq=0, pct=100, cores=100), context())
    two = SGPU.fit(devices, request(nums=2, memreq=0, pct=100, cores=100), context())
    assert isinstance(one, Picked) and [s.uuid for s in one.slices] == ["GPU-5"]
    assert isinstance(two, Picked) and [s.uuid for s in two.slices] == ["GPU-2", "GPU-1"]


@pytest.mark.parametrize(
    ("containers", "annotation", "enabled"),
    [
        pytest.param([[100]], "true", True, id="enable, allocate 100core"),
        pytest.param([[100]], "false", False, id="disable, allocate 100core"),
        pytest.param([[99]], "true", False, id="enable, allocate 99core"),
        pytest.param([[99], [100]], "true", True, id="enable, container[0]: 99core, container[1]: 100core"),
    ],
)
def test_need_score(containers: list[list[int]], annotation: str, enabled: bool) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestNeedScore (all 4 cases; topologyAwareEnable)
    devices = PodAllocation(
        tuple(
            ContainerAllocation(tuple(GPUSlice(f"g{i}", 0, c, CW) for i, c in enumerate(cs)))
            for cs in containers
        )
    )
    assert sg.topology_aware(devices, {sg.TOPOLOGY_AWARE: annotation}, default=False) is enabled


def test_the_configured_topology_awareness_holds_unless_the_pod_names_a_boolean() -> None:
    devices = exclusive("g")
    assert sg.topology_aware(devices, {}, default=True) is True
    assert sg.topology_aware(devices, {sg.TOPOLOGY_AWARE: "yes"}, default=True) is True  # not a Go bool
    assert sg.topology_aware(devices, {sg.TOPOLOGY_AWARE: "F"}, default=True) is False


SCORE_EXCLUSIVE_CASES: list[Any] = [
    pytest.param(
        ["GPU-4"],
        [("GPU-1", 1, 1), ("GPU-2", 1, 1), ("GPU-3", 1, 1), ("GPU-4", 1, 0)],
        0,
        id="allocate one device, rest zero device",
    ),
    pytest.param(
        ["GPU-4"],
        [("GPU-1", 1, 0), ("GPU-2", 1, 0), ("GPU-3", 1, 0), ("GPU-4", 1, 0)],
        -30,
        id="allocate one device, rest three device",
    ),
    pytest.param(
        ["GPU-3", "GPU-4"],
        [("GPU-1", 1, 0), ("GPU-2", 1, 0), ("GPU-3", 1, 0), ("GPU-4", 1, 0)],
        60,
        id="allocate two device, best result",
    ),
    pytest.param(
        ["GPU-4", "GPU-5"],
        [
            ("GPU-1", 1, 1),
            ("GPU-2", 1, 1),
            ("GPU-3", 1, 1),
            ("GPU-4", 1, 0),
            ("GPU-5", 2, 0),
            ("GPU-6", 2, 1),
            ("GPU-7", 2, 1),
            ("GPU-8", 2, 1),
        ],
        0,
        id="allocate two device, bad result",
    ),
    pytest.param(
        ["GPU-1", "GPU-2", "GPU-3", "GPU-4"],
        [("GPU-1", 1, 0), ("GPU-2", 1, 0), ("GPU-3", 1, 0), ("GPU-4", 1, 0), ("GPU-5", 2, 0)],
        600,
        id="allocate four device, best result",
    ),
    pytest.param(
        ["GPU-3", "GPU-4", "GPU-5", "GPU-6"],
        [("GPU-2", 1, 0), ("GPU-3", 1, 0), ("GPU-4", 1, 0), ("GPU-5", 2, 0), ("GPU-6", 2, 0)],
        180,
        id="allocate four device, bad result",
    ),
    pytest.param(
        [f"GPU-{i}" for i in range(1, 9)],
        [(f"GPU-{i}", 1 if i <= 4 else 2, 0) for i in range(1, 9)],
        1200,
        id="allocate eight device",
    ),
]


@pytest.mark.parametrize(("chosen", "previous", "score"), SCORE_EXCLUSIVE_CASES)
def test_score_exclusive_devices(chosen: list[str], previous: list[tuple[str, int, int]], score: int) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestScoreExclusiveDevices (all 7 cases, through ScoreNode with
    # the pod's topology-aware annotation)
    before = [zone(u, z, used) for u, z, used in previous]
    the_pod = pod(annotations={sg.TOPOLOGY_AWARE: "true"})
    assert sg.score_exclusive(exclusive(*chosen), before) == score
    for policy in ("binpack", "spread"):
        assert SGPU.score_node({}, exclusive(*chosen), before, policy, pod=the_pod) == float(score)


@pytest.mark.parametrize(
    ("online", "offline", "score"),
    [
        pytest.param(0, 0, 0, id="test idle device"),
        pytest.param(2, 0, -40, id="test only online device"),
        pytest.param(0, 2, -200, id="test only offline device"),
        pytest.param(2, 2, -44, id="test online/offline device"),
    ],
)
def test_score_online_devices(online: int, offline: int, score: int) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestScoreOnlineDevices (all 4 cases, through ScoreNode for an
    # online pod)
    chosen = PodAllocation((ContainerAllocation((GPUSlice("GPU-123", 0, 0, CW),)),))
    before = [device("GPU-123"), device("GPU-other")]
    device_pods = {"GPU-123": pods_of(online, offline), "GPU-other": pods_of(5, 0)}
    assert SGPU.score_node({}, chosen, before, "spread", pod=ONLINE_POD, device_pods=device_pods) == float(
        score
    )


@pytest.mark.parametrize(
    ("chosen", "previous", "the_pod"),
    [
        pytest.param(
            exclusive("GPU-3", "GPU-4"),
            [zone(f"GPU-{i}", 1) for i in range(1, 5)],
            pod(annotations={sg.TOPOLOGY_AWARE: "true"}),
            id="topology-aware exclusive allocation",
        ),
        pytest.param(
            exclusive("GPU-1", cores=0),
            [device("GPU-1"), device("GPU-2")],
            ONLINE_POD,
            id="online allocation",
        ),
        pytest.param(
            exclusive("GPU-1", cores=50),
            [device("GPU-1")],
            NORMAL_POD,
            id="no topology or online hint scores zero",
        ),
    ],
)
def test_score_node_policy_independence(
    chosen: PodAllocation, previous: list[GPUUsage], the_pod: dict[str, Any]
) -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestScoreNodePolicyIndependence (all 3 cases)
    scores = {
        SGPU.score_node({}, chosen, previous, policy, pod=the_pod) for policy in ("binpack", "spread", "")
    }
    assert len(scores) == 1


def test_score_node_uses_the_configured_topology_awareness_when_the_pod_names_none() -> None:
    aware = sg.MetaxSGPU(sg.names(), topology_aware=True)
    before = [zone(f"GPU-{i}", 1) for i in range(1, 5)]
    assert aware.score_node({}, exclusive("GPU-3", "GPU-4"), before, "binpack", pod=NORMAL_POD) == 60.0
    assert SGPU.score_node({}, exclusive("GPU-3", "GPU-4"), before, "binpack", pod=NORMAL_POD) == 0.0


# --- AddResourceUsage, PatchAnnotations ------------------------------------------------------------------


def test_add_resource_usage_adds_one_slot_its_memory_and_its_cores() -> None:
    # HAMi pkg/device/metax/sdevice_test.go TestMetaxSDevices_AddResourceUsage "test add resource usage"
    before = GPUUsage(GPUInfo("dev-0"), used=0, usedmem=2000, usedcores=15)
    after = SGPU.add_usage(before, GPUSlice("dev-0", 1024, 50, CW))
    assert (after.used, after.usedmem, after.usedcores) == (1, 3024, 65)


UUID = "GPU-a16ac188-0592-5c8f-2b6e-8bd8e7a604a"


def test_convert_hami_pod_devices_to_metax_pod_devices() -> None:
    # HAMi pkg/device/metax/protocol_test.go TestConvertHAMIPodDeviceToMetaxPodDevice "base test", as the
    # metax-tech.com/gpu-devices-allocated annotation
    devices = PodAllocation(
        (
            ContainerAllocation((GPUSlice(UUID + "0", 10, 50, CW), GPUSlice(UUID + "1", 1024, 30, CW))),
            ContainerAllocation(
                (GPUSlice(UUID + "3", 10 * 1024, 20, CW), GPUSlice(UUID + "7", 64 * 1024, 80, CW))
            ),
        )
    )
    out = SGPU.pod_annotations(pod(), devices, node="n", now=NOW)
    assert json.loads(out["metax-tech.com/gpu-devices-allocated"]) == [
        [{"uuid": UUID + "0", "compute": 50, "vRam": 10}, {"uuid": UUID + "1", "compute": 30, "vRam": 1024}],
        [
            {"uuid": UUID + "3", "compute": 20, "vRam": 10240},
            {"uuid": UUID + "7", "compute": 80, "vRam": 65536},
        ],
    ]


def test_pod_annotations_write_hamis_keys_the_plugins_json_and_the_predicate_time_in_nanoseconds() -> None:
    devices = PodAllocation(
        (ContainerAllocation(), ContainerAllocation((GPUSlice("g<1>", 0, 0, CW), GPUSlice("g2", 512, 0, CW))))
    )
    out = SGPU.pod_annotations(pod(), devices, node="n", now=NOW)
    text = ";g<1>,Metax-SGPU,0,0:g2,Metax-SGPU,512,0:;"
    assert out == {
        "hami.io/metax-sgpu-devices-to-allocate": text,
        "hami.io/metax-sgpu-devices-allocated": text,
        "metax-tech.com/gpu-devices-allocated": '[[],[{"uuid":"g\\u003c1\\u003e"},{"uuid":"g2","vRam":512}]]',
        "metax-tech.com/predicate-time": "1735787045123456000",
    }


def test_pod_annotations_of_a_pod_without_sgpus_are_empty() -> None:
    assert SGPU.pod_annotations(pod(), PodAllocation((ContainerAllocation(),)), node="n", now=NOW) == {}
