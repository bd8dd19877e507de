"""hami_control.devices.ascend: HAMi's Ascend vNPU backend (pkg/device/ascend, v2.10.0), its Go tests
transcribed (device_test.go, device_910c_pairing_test.go) and property tests of the request reader, the
inventory decoder and the webhook step."""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices.ascend import Ascend, Template, VNPUConfig, build
from hami_control.devices.base import (
    INT32_MAX,
    MUTEX_LOCK,
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    custom_text,
)
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container, node, pod

Json = dict[str, Any]

VIR_910A = (
    Template("vir02", 2184, 2),
    Template("vir04", 4369, 4),
    Template("vir08", 8738, 8),
    Template("vir16", 17476, 16),
)
"""The 910A templates HAMi's tests (and the chart) configure."""
B3_TEMPLATES = (Template("vir08", 8738, 8), Template("vir16", 17476, 16))
"""The templates of HAMi's hami-core tests (Test_MutateAdmission_HardSplitCoreRejected, ...)."""
B3_SPLIT = (Template("vir05_1c_16g", 16384, 5, 1), Template("vir10_3c_32g", 32768, 10, 3))
"""The 910C templates of HAMi's Test_MutateAdmission910C_VNPUSplit (the chart's)."""
HAMI_CORE = {"huawei.com/vnpu-mode": "hami-core"}
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def chip(
    cw: str = "Ascend910A",
    *,
    memory_name: str | None = None,
    core_name: str = "",
    hami_vnpu_core: bool = False,
    **fields: Any,
) -> Ascend:
    """A vendor for chip `cw` named as the chart names it (`memory_name=""` leaves the memory resource
    unnamed, as some of HAMi's tests do)."""
    config = VNPUConfig(
        common_word=cw,
        resource_name=f"huawei.com/{cw}",
        resource_memory_name=f"huawei.com/{cw}-memory" if memory_name is None else memory_name,
        resource_core_name=core_name,
        **fields,
    )
    return Ascend(config, hami_vnpu_core)


def a910(**fields: Any) -> Ascend:
    """HAMi's usual test chip: 910A, 32768 MiB allocatable and capacity, the four vir templates."""
    return chip("Ascend910A", memory_allocatable=32768, memory_capacity=32768, templates=VIR_910A, **fields)


def b3(**fields: Any) -> Ascend:
    """HAMi's hami-core test chip: 910B3 with a `-core` resource, 32768 MiB, two templates."""
    fields = {"templates": B3_TEMPLATES, "memory_allocatable": 32768, "memory_capacity": 32768, **fields}
    return chip("Ascend910B3", core_name="huawei.com/Ascend910B3-core", **fields)


def npu(
    id: str,
    index: int = 0,
    *,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    totalmem: int = 128,
    totalcore: int = 100,
    usedcores: int = 0,
    health: bool = True,
    network: float | None = None,
    custom: Json | None = None,
    type: str = "",
) -> GPUUsage:
    """A DeviceUsage as HAMi's tests write it (Used, Count, Usedmem, Totalmem, ...), with
    `custominfo: {"NetworkID": network}` when `network` is given."""
    info_custom = (
        custom if custom is not None else ({"NetworkID": float(network)} if network is not None else {})
    )
    info = GPUInfo(
        id=id,
        index=index,
        count=count,
        devmem=totalmem,
        devcore=totalcore,
        type=type,
        health=health,
        custom=custom_text(info_custom),
    )
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def admit(vendor: Ascend, ctr: Json, the_pod: Json | None = None) -> tuple[Admission, Json, Json]:
    """MutateAdmission on copies: the answer, the container and the pod after it."""
    ctr_copy = copy.deepcopy(ctr)
    pod_copy = copy.deepcopy(the_pod if the_pod is not None else pod("p", ctr))
    return vendor.mutate(ctr_copy, pod_copy), ctr_copy, pod_copy


def outcome(result: Picked | Unfit) -> tuple[bool, list[str], str]:
    """(fit, chosen UUIDs, reason) as HAMi's Fit answers."""
    if isinstance(result, Picked):
        return True, [s.uuid for s in result.slices], ""
    return False, [], result.message


def context(annotations: Json | None = None, node_annotations: Json | None = None) -> FitContext:
    """The pod (with `annotations`) and node a Fit reads; HAMi's `hami.io/gpu-scheduler-policy: mutex`
    annotation is the registry's to turn into the mutex policy, so it is done here."""
    annotations = dict(annotations or {})
    policy = (GPUPolicy.MUTEX,) if annotations.get("hami.io/gpu-scheduler-policy") == "mutex" else ()
    return FitContext(
        pod=pod("p", annotations=annotations),
        node=node("node1", annotations=node_annotations),
        policy=policy or (GPUPolicy.SPREAD,),
    )


# --- Test_InitDevices -------------------------------------------------------------------------------------


def test_a_configured_chip_gets_hamis_annotation_names() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_InitDevices "test with valid configuration"
    # ("enableAscend is false" is the registry's --enable-ascend switch, not this module's)
    text = """
vnpus:
  configs:
  - chipName: 910A
    commonWord: Ascend910A
    resourceName: huawei.com/Ascend910A
    resourceMemoryName: huawei.com/Ascend910A-memory
    memoryAllocatable: 32768
    memoryCapacity: 32768
    aiCore: 30
    templates:
      - {name: vir02, memory: 2184, aiCore: 2}
      - {name: vir04, memory: 4369, aiCore: 4}
      - {name: vir08, memory: 8738, aiCore: 8}
      - {name: vir16, memory: 17476, aiCore: 16}
"""
    (vendor,) = build(parse_device_config(text, "device-config.yaml"))
    assert isinstance(vendor, Ascend)
    assert vendor.config == VNPUConfig(
        common_word="Ascend910A",
        chip_name="910A",
        resource_name="huawei.com/Ascend910A",
        resource_memory_name="huawei.com/Ascend910A-memory",
        memory_allocatable=32768,
        memory_capacity=32768,
        ai_core=30,
        templates=VIR_910A,
    )
    names = vendor.names
    assert names.register == "hami.io/node-register-Ascend910A"
    assert names.use_uuid == "hami.io/use-Ascend910A-uuid"
    assert names.nouse_uuid == "hami.io/no-use-Ascend910A-uuid"
    assert names.handshake == "hami.io/node-handshake-Ascend910A"
    assert names.to_allocate == "hami.io/Ascend910A-devices-to-allocate"
    assert names.allocated == "hami.io/Ascend910A-devices-allocated"
    assert (names.inventory, names.health, names.lock) == (
        Inventory.JSON,
        HealthRule.HANDSHAKE,
        LockKind.MUTEX,
    )


# --- Test_GetNodeDevices ------------------------------------------------------------------------------------

REGISTER = "hami.io/node-register-Ascend910A"


def test_the_json_inventory_is_read_with_go_case_insensitive_keys() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_GetNodeDevices "exist device"
    text = (
        '[{"ID":"GPU-0","Count":4,"Devmem":8738,"Devcore":8,"Type":"huawei.com/Ascend910",'
        '"Numa":0,"Health":true}]'
    )
    devices = a910().node_devices(node("node-01", annotations={REGISTER: text}))
    assert devices == (
        GPUInfo(
            id="GPU-0", count=4, devmem=8738, devcore=8, type="huawei.com/Ascend910", numa=0, health=True
        ),
    )


def test_an_empty_inventory_gives_no_devices() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_GetNodeDevices "no device" (Go: no devices and the error
    # "no device found on node")
    assert a910().node_devices(node("node-02", annotations={REGISTER: "[]"})) == ()


def test_a_node_without_the_inventory_has_none_of_the_chip() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_GetNodeDevices "no annotation"
    assert a910().node_devices(node("node-03")) is None


def test_an_inventory_that_is_not_json_is_a_wire_format_error() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_GetNodeDevices "failed to unmarshal node devices"
    with pytest.raises(WireFormatError) as info:
        a910().node_devices(node("node-04", annotations={REGISTER: ""}))
    assert info.value.annotation == REGISTER


def test_the_network_id_of_the_inventory_is_kept_as_a_go_float() -> None:
    text = '[{"id":"npu-0","count":1,"health":true,"custominfo":{"NetworkID":1}}]'
    (device,) = a910().node_devices(node("n", annotations={REGISTER: text})) or ()
    assert json.loads(device.custom) == {"NetworkID": 1.0}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=60),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
            ),
            max_leaves=12,
        ).map(json.dumps),
    )
)
def test_inventory_decoding_returns_devices_or_a_wire_format_error(text: str) -> None:
    try:
        devices = a910().node_devices(node("n", annotations={REGISTER: text}))
    except WireFormatError:
        return
    assert isinstance(devices, tuple)
    assert all(isinstance(d, GPUInfo) for d in devices)


# --- Test_CheckHealth ---------------------------------------------------------------------------------------

HANDSHAKE = "hami.io/node-handshake-Ascend910A"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_CheckHealth "Requesting state"
        pytest.param("Requesting_2128-12-02 00:00:00", NodeHealth(True, False), id="requesting"),
        # HAMi pkg/device/ascend/device_test.go Test_CheckHealth "Unknown state"
        pytest.param("Unknown", NodeHealth(True, True, "Requesting_2025-06-01 12:00:00"), id="unknown"),
        # HAMi pkg/device/ascend/device_test.go Test_CheckHealth "Requesting state expired"
        pytest.param("Requesting_2024-01-02 00:00:00", NodeHealth(False, False), id="expired"),
    ],
)
def test_the_handshake_decides_node_health(value: str, want: NodeHealth) -> None:
    the_node = node("n", annotations={HANDSHAKE: value})
    assert a910().node_health(the_node, NOW.replace(tzinfo=None)) == want


def test_the_plugins_reported_handshake_registers_the_node() -> None:
    the_node = node("n", annotations={HANDSHAKE: "Reported_2025.06.01 11:59:00"})
    assert a910().node_health(the_node, NOW.replace(tzinfo=None)) == NodeHealth(
        True, True, "Requesting_2025-06-01 12:00:00"
    )


# --- Test_PatchAnnotations*, Test_checkType -----------------------------------------------------------------


def one_container(*slices: GPUSlice) -> PodAllocation:
    return PodAllocation((ContainerAllocation(tuple(slices)),))


def test_patch_annotations_write_devices_predicate_time_and_the_runtime_list() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_PatchAnnotations "exist device"
    vendor = chip("Ascend910A", memory_capacity=1024, templates=VIR_910A)
    out = vendor.pod_annotations(
        pod("p"), one_container(GPUSlice("device-0", 8738, 1, "Ascend")), node="n1", now=NOW
    )
    assert out == {
        "hami.io/Ascend910A-devices-to-allocate": "device-0,Ascend,8738,1:;",
        "hami.io/Ascend910A-devices-allocated": "device-0,Ascend,8738,1:;",
        "predicate-time": str(int(NOW.timestamp())),
        "huawei.com/Ascend910A": '[{"UUID":"device-0","temp":"vir08","memory":8738,"core":1}]',
    }


def test_patch_annotations_write_nothing_without_devices() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_PatchAnnotations "no device"
    vendor = chip("Ascend910A", memory_capacity=1024, templates=VIR_910A)
    assert vendor.pod_annotations(pod("p"), PodAllocation(), node="n1", now=NOW) == {}


def test_patch_annotations_in_hami_core_mode_write_memory_and_cores_without_a_template() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_PatchAnnotations_VNPUCoreMode
    # "vNPU-mode patch: check json contains cores and memory instead of template"
    vendor = chip("Ascend910B3")
    out = vendor.pod_annotations(
        pod("p", annotations=HAMI_CORE),
        one_container(GPUSlice("ascend-uuid-1", 8192, 5, "Ascend")),
        node="n1",
        now=NOW,
    )
    assert out["huawei.com/Ascend910B3"] == '[{"UUID":"ascend-uuid-1","memory":8192,"core":5}]'


def test_patch_annotations_leave_out_a_zero_core() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_PatchAnnotations_ZeroCore
    vendor = chip("Ascend910A", memory_capacity=32768, templates=VIR_910A)
    out = vendor.pod_annotations(
        pod("p", annotations={}),
        one_container(GPUSlice("device-zero-core", 8738, 0, "Ascend")),
        node="n",
        now=NOW,
    )
    assert out["huawei.com/Ascend910A"] == '[{"UUID":"device-zero-core","temp":"vir08","memory":8738}]'


def test_patch_annotations_list_every_container_s_devices_and_no_template_past_the_last() -> None:
    vendor = a910()
    devices = PodAllocation(
        (
            ContainerAllocation(),
            ContainerAllocation(
                (GPUSlice("npu-1", 32768, 0, "Ascend910A"), GPUSlice("npu-2", 32768, 0, "Ascend910A"))
            ),
            ContainerAllocation((GPUSlice("npu-3", 2000, 0, "Ascend910A"),)),
        )
    )
    out = vendor.pod_annotations(pod("p"), devices, node="n", now=NOW)
    assert out["hami.io/Ascend910A-devices-allocated"] == (
        ";npu-1,Ascend910A,32768,0:npu-2,Ascend910A,32768,0:;npu-3,Ascend910A,2000,0:;"
    )
    assert json.loads(out["huawei.com/Ascend910A"]) == [
        {"UUID": "npu-1", "memory": 32768},
        {"UUID": "npu-2", "memory": 32768},
        {"UUID": "npu-3", "temp": "vir02", "memory": 2000},
    ]


@pytest.mark.parametrize(
    ("request_type", "want"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_checkType "the same type"
        pytest.param("Ascend910A", True, id="the same type"),
        # HAMi pkg/device/ascend/device_test.go Test_checkType "the different type"
        pytest.param("Ascend910B", False, id="the different type"),
    ],
)
def test_the_type_check_compares_the_request_type_with_the_common_word(request_type: str, want: bool) -> None:
    vendor = chip("Ascend910A")
    allowed = vendor.type_allowed({}, npu("dev-0"), DeviceRequest(1, request_type))
    assert allowed is want


# --- Test_MutateAdmission* ----------------------------------------------------------------------------------

COUNT_A = "huawei.com/Ascend910A"
MEM_A = "huawei.com/Ascend910A-memory"


@pytest.mark.parametrize(
    ("limits", "requests", "found"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission "no set to resources limits"
        pytest.param({}, None, False, id="no set to resources limits"),
        # HAMi ... Test_MutateAdmission "resourcename and resourcememoryname set to resources limits"
        pytest.param({COUNT_A: "2", MEM_A: "8738"}, None, True, id="count and memory in limits"),
        # HAMi ... Test_MutateAdmission "resourcememoryname is invalid"
        pytest.param({COUNT_A: "2", MEM_A: "40000"}, None, False, id="resourcememoryname is invalid"),
        # HAMi ... Test_MutateAdmission "resourcememoryname not within the template scope，but smaller than
        # MemoryCapacity"
        pytest.param({COUNT_A: "1", MEM_A: "20000"}, {MEM_A: "20000"}, True, id="memory past the templates"),
    ],
)
def test_mutate_admission_says_whether_the_container_asks_the_chip(
    limits: Json, requests: Json | None, found: bool
) -> None:
    answer, _, _ = admit(a910(), container(limits=limits, requests=requests))
    assert answer.found is found


def test_mutate_admission_refuses_several_devices_with_a_vnpu_memory() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission "resourcename and resourcememoryname set to
    # resources limits": Go returns (true, "vNPU not supported for multiple devices")
    answer, _, _ = admit(a910(), container(limits={COUNT_A: "2", MEM_A: "8738"}))
    assert answer == Admission(True, "vNPU not supported for multiple devices")


def test_mutate_admission_refuses_memory_past_the_card_s_capacity() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission "resourcememoryname is invalid"
    answer, _, _ = admit(a910(), container(limits={COUNT_A: "2", MEM_A: "40000"}))
    assert answer == Admission(False, "huawei.com/Ascend910A-memory 40000 is invalid")


def test_mutate_admission_raises_memory_past_the_templates_to_the_whole_card() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission "resourcememoryname not within the
    # template scope，but smaller than MemoryCapacity"
    answer, ctr, _ = admit(
        a910(), container(limits={COUNT_A: "1", MEM_A: "20000"}, requests={MEM_A: "20000"})
    )
    assert answer == Admission(True)
    assert ctr["resources"] == {
        "limits": {COUNT_A: "1", MEM_A: "32768"},
        "requests": {MEM_A: "32768"},
    }


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission_NilRequests
        # "memory limit set, requests block absent"
        pytest.param({COUNT_A: "1", MEM_A: "8738"}, "8738", id="memory limit set, requests block absent"),
        # HAMi ... Test_MutateAdmission_NilRequests "count only, no memory limit, requests block absent"
        pytest.param({COUNT_A: "1"}, "32768", id="count only, no memory limit, requests block absent"),
    ],
)
def test_mutate_admission_creates_the_requests_for_the_memory(limits: Json, want: str) -> None:
    answer, ctr, _ = admit(a910(), container(limits=limits))
    assert answer == Admission(True)
    assert ctr["resources"]["requests"] == {MEM_A: want}
    assert ctr["resources"]["limits"][MEM_A] == want


C910 = "huawei.com/Ascend910C"


def c910(super_pod: bool = True, **fields: Any) -> Ascend:
    """HAMi's Test_MutateAdmission910C chip (no memory resource named, as there)."""
    fields.setdefault("memory_name", "")
    return chip("Ascend910C", memory_allocatable=65536, memory_capacity=65536, super_pod=super_pod, **fields)


@pytest.mark.parametrize(
    ("count", "want", "want_count"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission910C "910C: request 1 → auto adjust to 2"
        pytest.param("1", Admission(True), "2", id="910C: request 1 -> auto adjust to 2"),
        # HAMi ... Test_MutateAdmission910C "910C: request 3 → reject (odd number)"
        pytest.param(
            "3",
            Admission(False, "Ascend910C device request must be 1 or 2*n, got 3"),
            "3",
            id="910C: request 3 -> reject (odd number)",
        ),
        # HAMi ... Test_MutateAdmission910C "910C: request 4 → valid even number"
        pytest.param("4", Admission(True), "4", id="910C: request 4 -> valid even number"),
    ],
)
def test_a_910c_super_pod_takes_whole_modules(count: str, want: Admission, want_count: str) -> None:
    answer, ctr, _ = admit(c910(), container(limits={C910: count}, requests={C910: count}))
    assert answer == want
    assert ctr["resources"]["limits"][C910] == want_count
    assert ctr["resources"]["requests"][C910] == want_count


def test_a_910c_count_of_one_in_limits_only_leaves_the_requests_alone() -> None:
    answer, ctr, _ = admit(c910(), container(limits={C910: "1"}, requests={}))
    assert answer == Admission(True)
    assert ctr["resources"] == {"limits": {C910: "2"}, "requests": {}}


def test_a_910c_vnpu_slice_of_one_is_not_rounded_up() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission910C_VNPUSplit
    # "request 1 + vNPU memory slice is not rounded up"
    vendor = c910(super_pod=False, memory_name="huawei.com/Ascend910C-memory", templates=B3_SPLIT)
    answer, ctr, _ = admit(
        vendor,
        container(limits={C910: "1", "huawei.com/Ascend910C-memory": "16384"}, requests={C910: "1"}),
    )
    assert answer == Admission(True)
    assert ctr["resources"]["limits"][C910] == "1"
    assert ctr["resources"]["limits"]["huawei.com/Ascend910C-memory"] == "16384"


def test_an_odd_910c_count_is_kept_when_the_card_is_split() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission910C_VNPUSplit
    # "odd NPU count is allowed when the card is split"
    vendor = c910(super_pod=False, memory_name="huawei.com/Ascend910C-memory", templates=B3_SPLIT)
    answer, ctr, _ = admit(vendor, container(limits={C910: "3"}, requests={C910: "3"}))
    assert answer == Admission(True)
    assert ctr["resources"]["limits"][C910] == "3"


COUNT_B3 = "huawei.com/Ascend910B3"
MEM_B3 = "huawei.com/Ascend910B3-memory"
CORE_B3 = "huawei.com/Ascend910B3-core"


@pytest.mark.parametrize(
    ("resources", "annotations", "want_memory", "want_core"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission_VNPUCoreMode
        # "vNPU-mode hami-core: keep raw memory without postStart"
        pytest.param(
            {COUNT_B3: "1", MEM_B3: "15360", CORE_B3: "20"},
            HAMI_CORE,
            "15360",
            "20",
            id="hami-core raw memory",
        ),
        # HAMi ... Test_MutateAdmission_VNPUCoreMode "no vnpu-mode annotation: no postStart, memory trimmed"
        pytest.param({COUNT_B3: "1", MEM_B3: "15360"}, {}, "32768", None, id="no vnpu-mode memory trimmed"),
    ],
)
def test_hami_core_mode_keeps_the_memory_as_asked(
    resources: Json, annotations: Json, want_memory: str, want_core: str | None
) -> None:
    vendor = b3(templates=())
    ctr = container("test-container", limits=resources, requests=resources)
    answer, after, _ = admit(vendor, ctr, pod("p", ctr, annotations=annotations))
    assert answer == Admission(True)
    assert "lifecycle" not in after
    assert after["resources"]["limits"][MEM_B3] == want_memory
    assert after["resources"]["limits"].get(CORE_B3) == want_core


def b3_container(core: str = "") -> Json:
    resources = {COUNT_B3: "1", MEM_B3: "8738", **({CORE_B3: core} if core else {})}
    return container("test-container", limits=resources, requests=resources)


@pytest.mark.parametrize(
    ("core", "hami_core", "error"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_MutateAdmission_HardSplitCoreRejected
        pytest.param("10", False, True, id="hard split with core is rejected"),
        pytest.param("25", False, True, id="hard split with core over physical is rejected"),
        pytest.param("0", False, False, id="hard split with core=0 is allowed"),
        pytest.param("", False, False, id="hard split without core is allowed"),
        pytest.param("10", True, False, id="hami-core soft split with core is allowed"),
    ],
)
def test_cores_are_refused_outside_hami_core_mode(core: str, hami_core: bool, error: bool) -> None:
    ctr = b3_container(core)
    answer, _, _ = admit(b3(), ctr, pod("p", ctr, annotations=HAMI_CORE if hami_core else {}))
    if error:
        assert answer == Admission(
            False, "huawei.com/Ascend910B3-core is only supported in hami-core (soft split) mode"
        )
    else:
        assert answer == Admission(True)


def test_overwrite_env_hides_the_npus_from_a_container_that_asks_none() -> None:
    answer, ctr, _ = admit(a910(overwrite_env=True), container(env={"A": "1"}))
    assert answer == Admission(False)
    assert ctr["env"] == [{"name": "A", "value": "1"}, {"name": "ASCEND_VISIBLE_DEVICES"}]


def test_without_overwrite_env_a_container_that_asks_none_is_untouched() -> None:
    before = container()
    answer, ctr, _ = admit(a910(), before)
    assert (answer, ctr) == (Admission(False), before)


def test_the_configured_runtime_class_goes_to_a_pod_that_names_none() -> None:
    vendor = a910(runtime_class_name="ascend")
    ctr = container(limits={COUNT_A: "1"})
    _, _, named_none = admit(vendor, ctr, pod("p", ctr))
    _, _, named = admit(vendor, ctr, pod("p", ctr, runtimeClassName="mine"))
    assert named_none["spec"]["runtimeClassName"] == "ascend"
    assert named["spec"]["runtimeClassName"] == "mine"


def test_hami_core_memory_is_written_as_the_api_server_writes_the_quantity() -> None:
    ctr = container(limits={COUNT_B3: "1", MEM_B3: "20000"})
    answer, after, _ = admit(b3(), ctr, pod("p", ctr, annotations=HAMI_CORE))
    assert answer == Admission(True)
    assert after["resources"]["limits"][MEM_B3] == "20k"  # Go: resource.MustParse("20000").String()


@settings(max_examples=300, deadline=None)
@given(
    count=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1).map(str), st.text(max_size=8)),
    memory=st.one_of(
        st.none(), st.integers(-(2**40), 2**40).map(str), st.sampled_from(["16Gi", "1.5", "-1m"])
    ),
    cores=st.one_of(st.none(), st.integers(-(2**40), 2**40).map(str), st.text(max_size=6)),
    hami_core=st.booleans(),
    super_pod=st.booleans(),
)
def test_mutate_admission_never_raises_and_writes_one_memory_to_limits_and_requests(
    count: str | None, memory: str | None, cores: str | None, hami_core: bool, super_pod: bool
) -> None:
    vendor = chip(
        "Ascend910C",
        core_name="huawei.com/Ascend910C-core",
        memory_allocatable=65536,
        memory_capacity=65536,
        templates=B3_SPLIT,
        super_pod=super_pod,
        overwrite_env=True,
    )
    values = {
        "huawei.com/Ascend910C": count,
        "huawei.com/Ascend910C-memory": memory,
        "huawei.com/Ascend910C-core": cores,
    }
    ctr = container(limits={k: v for k, v in values.items() if v is not None})
    answer, after, _ = admit(vendor, ctr, pod("p", ctr, annotations=HAMI_CORE if hami_core else {}))
    if answer.found and not answer.error:
        resources = after["resources"]
        assert (
            resources["limits"]["huawei.com/Ascend910C-memory"]
            == resources["requests"]["huawei.com/Ascend910C-memory"]
        )


# --- Test_GenerateResourceRequests* -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "requests", "want"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_GenerateResourceRequests
        # "don't set to limits and request"
        pytest.param({}, {}, None, id="don't set to limits and request"),
        # HAMi ... Test_GenerateResourceRequests
        # "resourcename and resourcememoryname set to limits and request"
        pytest.param(
            {COUNT_A: "2", MEM_A: "8738"},
            {COUNT_A: "2", MEM_A: "8738"},
            DeviceRequest(2, "Ascend910A", 8738, 0, 0),
            id="count and memory set",
        ),
        # HAMi ... Test_GenerateResourceRequests "resourcememoryname don't set to limits and requests"
        pytest.param(
            {COUNT_A: "2"}, {COUNT_A: "2"}, DeviceRequest(2, "Ascend910A", 0, 100, 0), id="no memory"
        ),
    ],
)
def test_a_request_reads_count_and_memory(limits: Json, requests: Json, want: DeviceRequest | None) -> None:
    assert a910().request(container(limits=limits, requests=requests)) == want


def test_a_request_reads_the_cores_of_hami_core_mode() -> None:
    # HAMi pkg/device/ascend/device_test.go Test_GenerateResourceRequests_VNPUCoreMode
    # "parse custom vNPU core and memory resources"
    ctr = container(limits={COUNT_B3: "1", CORE_B3: "10", MEM_B3: "15360"})
    assert b3().request(ctr) == DeviceRequest(1, "Ascend910B3", 15360, 0, 10)


@pytest.mark.parametrize(
    ("factor", "memreq"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_GenerateResourceRequestsFactor "factor 10", "factor 100",
        # "factor 0"
        pytest.param(10, 1280, id="factor 10"),
        pytest.param(100, 12800, id="factor 100"),
        pytest.param(0, 128, id="factor 0"),
    ],
)
def test_the_memory_factor_multiplies_the_memory(factor: int, memreq: int) -> None:
    vendor = a910(memory_factor=factor)
    ctr = container(limits={COUNT_A: "1", MEM_A: "128"}, requests={COUNT_A: "1", MEM_A: "128"})
    assert vendor.request(ctr) == DeviceRequest(1, "Ascend910A", memreq, 0, 0)


def b3_65536() -> Ascend:
    return b3(templates=(), memory_allocatable=65536, memory_capacity=65536)


@pytest.mark.parametrize(
    "limits",
    [
        # HAMi pkg/device/ascend/device_test.go Test_GenerateResourceRequests_OutOfRangeValues
        pytest.param(
            {COUNT_B3: "1", CORE_B3: "10", MEM_B3: "16Gi"},
            id="memory requested in bytes exceeds int32 range on soft-partitioning path",
        ),
        pytest.param(
            {COUNT_B3: "1", MEM_B3: "16Gi"}, id="memory requested in bytes exceeds int32 range on trim path"
        ),
        pytest.param({COUNT_B3: "1", MEM_B3: "-1m"}, id="negative fractional memory request"),
        pytest.param({COUNT_B3: "1", MEM_B3: "-100"}, id="negative whole memory request"),
        pytest.param({COUNT_B3: "2200000000"}, id="oversized device count exceeds int32 range"),
        pytest.param({COUNT_B3: "1", CORE_B3: "-1"}, id="negative core request"),
        pytest.param({COUNT_B3: "1", CORE_B3: "2200000000"}, id="oversized core request exceeds int32 range"),
    ],
)
def test_an_out_of_range_request_is_no_request(limits: Json) -> None:
    assert b3_65536().request(container(limits=limits)) is None


@pytest.mark.parametrize(
    ("vendor", "limits"),
    [
        # HAMi pkg/device/ascend/device_test.go Test_GenerateResourceRequests_MemoryFactorOverflow
        # "scaled memory overflows int32 on soft-partitioning path"
        pytest.param(
            b3(templates=(), memory_allocatable=65536, memory_capacity=65536, memory_factor=10),
            {COUNT_B3: "1", CORE_B3: "10", MEM_B3: "300000000"},
            id="soft-partitioning path",
        ),
        # HAMi ... Test_GenerateResourceRequests_MemoryFactorOverflow
        # "scaled memory overflows int32 on trim path"
        pytest.param(
            chip("Ascend910A", memory_allocatable=32768, memory_capacity=32768, memory_factor=10),
            {COUNT_A: "1", MEM_A: "300000000"},
            id="trim path",
        ),
    ],
)
def test_memory_past_int32_after_the_factor_is_no_request(vendor: Ascend, limits: Json) -> None:
    assert vendor.request(container(limits=limits)) is None


def test_cores_are_read_rounded_up_and_memory_that_is_not_whole_asks_the_whole_device() -> None:
    ctr = container(limits={COUNT_B3: "1", CORE_B3: "1500m", MEM_B3: "1.5"})
    assert b3().request(ctr) == DeviceRequest(1, "Ascend910B3", 0, 100, 2)


def test_a_count_in_requests_alone_is_a_request() -> None:
    assert a910().request(container(requests={COUNT_A: "1"})) == DeviceRequest(1, "Ascend910A", 0, 100, 0)


QUANTITIES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(-(2**40), 2**40),
        st.sampled_from(["", "m", "k", "M", "Ki", "Mi", "Gi", "e3", "e-3", ".5", "E"]),
    ),
    st.text(max_size=10),
)


@settings(max_examples=500, deadline=None)
@given(
    count=QUANTITIES, memory=st.none() | QUANTITIES, cores=st.none() | QUANTITIES, factor=st.integers(0, 1000)
)
def test_a_request_is_never_negative_nor_past_int32(
    count: str, memory: str | None, cores: str | None, factor: int
) -> None:
    vendor = b3(memory_factor=factor)
    limits = {
        COUNT_B3: count,
        **({MEM_B3: memory} if memory is not None else {}),
        **({CORE_B3: cores} if cores else {}),
    }
    got = vendor.request(container(limits=limits))
    if got is not None:
        assert 1 <= got.nums <= INT32_MAX
        assert 0 <= got.memreq <= INT32_MAX
        assert 0 <= got.coresreq <= INT32_MAX
        assert got.mem_percentage == (100 if got.memreq == 0 else 0)


# --- TestDevices_LockNode / TestDevices_ReleaseNodeLock, TestDevices_AddResourceUsage -----------------------


@pytest.mark.parametrize(
    "spec",
    [
        # HAMi pkg/device/ascend/device_test.go TestDevices_LockNode and TestDevices_ReleaseNodeLock
        # "Test with no containers" and "Test with non-zero resource requests": no container asks the chip,
        # so no lock is taken (the binder takes `names.lock` only for a pod with a request)
        pytest.param({"containers": []}, id="Test with no containers"),
        pytest.param(
            {"containers": [{"resources": {"requests": {}}}]}, id="Test with non-zero resource requests"
        ),
    ],
)
def test_the_node_lock_is_hamis_mutex_and_a_pod_without_requests_takes_none(spec: Json) -> None:
    vendor = chip("Ascend310P")
    assert vendor.names.lock is LockKind.MUTEX
    assert vendor.names.lock_annotation == MUTEX_LOCK == "hami.io/mutex.lock"
    assert all(vendor.request(c) is None for c in spec["containers"])


def test_adding_usage_counts_one_task_and_its_memory_and_cores() -> None:
    # HAMi pkg/device/ascend/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    before = npu("dev-0", used=0, usedcores=15, usedmem=2000)
    after = chip().add_usage(before, GPUSlice("dev-0", 1024, 50, "Ascend910A"))
    assert (after.used, after.usedcores, after.usedmem) == (1, 65, 3024)


# --- TestDevices_Fit ----------------------------------------------------------------------------------------

FIT_CHIPS = [
    pytest.param("Ascend910A", id="910A"),
    pytest.param("Ascend910B2", id="910B2"),
    pytest.param("Ascend910B3", id="910B3"),
    pytest.param("Ascend910B4", id="910B4"),
    pytest.param("Ascend910B4", id="910B4-1"),  # HAMi's test config gives chip 910B4-1 the word Ascend910B4
    pytest.param("Ascend310P", id="310P3"),
]
"""TestDevices_Fit runs every case on each chip of its config."""


@dataclass(frozen=True)
class FitCase:
    devices: tuple[GPUUsage, ...]
    nums: int
    memreq: int = 0
    pct: int = 0
    cores: int = 0
    annotations: Json = field(default_factory=dict)
    node_annotations: Json | None = None
    want: tuple[bool, list[str], str] = (False, [], "")
    type: str = ""


def one_device(**fields: Any) -> tuple[GPUUsage, ...]:
    return (npu("dev-0", **fields),)


MODE_DEVICE = one_device(totalmem=32768)

FIT_CASES = [
    pytest.param(
        FitCase((npu("dev-0"), npu("dev-1")), 1, 64, cores=50, want=(True, ["dev-1"], "")), id="fit success"
    ),
    pytest.param(
        FitCase(one_device(), 1, 512, cores=50, want=(False, [], "1/1 CardInsufficientMemory")),
        id="fit fail: memory not enough",
    ),
    pytest.param(
        FitCase(
            one_device(totalmem=1024, usedcores=100),
            1,
            512,
            cores=50,
            want=(False, [], "1/1 CardInsufficientCore"),
        ),
        id="fit fail: core not enough",
    ),
    pytest.param(
        FitCase(one_device(), 1, 512, cores=50, type="OtherType", want=(False, [], "1/1 CardTypeMismatch")),
        id="fit fail: type mismatch",
    ),
    pytest.param(
        FitCase(
            (npu("dev-1", totalmem=1280),),
            2,
            512,
            cores=50,
            annotations={"hami.io/use-{cw}-uuid": "dev-0", "hami.io/use-Ascend910B2-uuid": "dev-0"},
            want=(False, [], "1/1 CardUuidMismatch"),
        ),
        id="fit fail: user assign use uuid mismatch",
    ),
    pytest.param(
        FitCase(
            one_device(totalmem=1280),
            2,
            512,
            cores=50,
            annotations={"hami.io/no-use-{cw}-uuid": "dev-0", "hami.io/no-use-Ascend910B2-uuid": "dev-0"},
            want=(False, [], "1/1 CardUuidMismatch"),
        ),
        id="fit fail: user assign no use uuid match",
    ),
    pytest.param(
        FitCase(
            one_device(used=100, totalmem=1280),
            1,
            512,
            cores=50,
            want=(False, [], "1/1 CardTimeSlicingExhausted"),
        ),
        id="fit fail: card overused",
    ),
    pytest.param(
        FitCase(one_device(totalmem=1280), 1, 512, cores=120, want=(True, ["dev-0"], "")),
        id="fit success: but core limit can't exceed 100",
    ),
    pytest.param(
        FitCase(
            one_device(used=20, totalmem=1280),
            1,
            512,
            cores=100,
            want=(False, [], "1/1 ExclusiveDeviceAllocateConflict"),
        ),
        id="fit fail: card exclusively",
    ),
    pytest.param(
        FitCase(
            one_device(used=20, totalmem=1280, usedcores=100),
            1,
            512,
            cores=0,
            want=(False, [], "1/1 CardComputeUnitsExhausted"),
        ),
        id="fit fail: CardComputeUnitsExhausted",
    ),
    pytest.param(
        FitCase(
            one_device(used=20, totalmem=1280, usedcores=10),
            2,
            512,
            cores=20,
            want=(False, [], "1/1 AllocatedCardsInsufficientRequest"),
        ),
        id="fit fail: AllocatedCardsInsufficientRequest",
    ),
    pytest.param(
        FitCase(one_device(used=20, totalmem=1280, usedcores=10), 1, 0, 10, 20, want=(True, ["dev-0"], "")),
        id="fit success: memory percentage",
    ),
    pytest.param(
        FitCase(
            (npu("dev-0", network=0), npu("dev-1", network=1), npu("dev-2", network=1)),
            2,
            64,
            cores=50,
            want=(True, ["dev-2", "dev-1"], ""),
        ),
        id="fit success. schedule by NetworkID",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE,
            1,
            15360,
            cores=20,
            annotations=HAMI_CORE,
            node_annotations={},
            want=(False, [], "1/1 ModeNotFit"),
        ),
        id="fit fail: hami-core pod on legacy node (ModeNotFit)",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE, 1, 8738, node_annotations={"hami-vnpu-core": "true"}, want=(True, ["dev-0"], "")
        ),
        id="fit ok: annotation-less pod on hami-core node follows node",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE,
            1,
            32768,
            annotations=HAMI_CORE,
            node_annotations={},
            want=(False, [], "1/1 ModeNotFit"),
        ),
        id="fit fail: whole-card hami-core pod on legacy node (ModeNotFit)",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE,
            1,
            0,
            101,
            annotations=HAMI_CORE,
            node_annotations={},
            want=(False, [], "1/1 ModeNotFit"),
        ),
        id="fit fail: memory-less hami-core pod on legacy node (ModeNotFit)",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE,
            1,
            32768,
            annotations=HAMI_CORE,
            node_annotations={"hami-vnpu-core": "true"},
            want=(True, ["dev-0"], ""),
        ),
        id="fit success: whole-card hami-core pod on hami-core node",
    ),
    pytest.param(
        FitCase(
            MODE_DEVICE, 1, 32768, node_annotations={"hami-vnpu-core": "true"}, want=(True, ["dev-0"], "")
        ),
        id="fit success: whole-card legacy pod on hami-core node",
    ),
    pytest.param(
        FitCase(
            one_device(used=1),
            1,
            64,
            cores=50,
            annotations={"hami.io/gpu-scheduler-policy": "mutex"},
            want=(False, [], "1/1 ExclusiveDeviceAllocateConflict"),
        ),
        id="mutex policy rejects used device",
    ),
    pytest.param(
        FitCase(
            one_device(totalmem=1280, health=False), 1, 512, cores=50, want=(False, [], "1/1 CardNotHealth")
        ),
        id="fit fail: CardNotHealth",
    ),
    pytest.param(
        FitCase(
            (npu("dev-0", totalmem=1280), npu("dev-1", 1, totalmem=1280)),
            3,
            512,
            cores=20,
            want=(False, [], "2/2 AllocatedCardsInsufficientRequest"),
        ),
        id="fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards",
    ),
]


@pytest.mark.parametrize("cw", FIT_CHIPS)
@pytest.mark.parametrize("case", FIT_CASES)
def test_fit_answers_as_hami_does_on_every_chip(cw: str, case: FitCase) -> None:
    # HAMi pkg/device/ascend/device_test.go TestDevices_Fit, every case (the id) on every chip
    vendor = chip(cw)
    annotations = {k.format(cw=cw): v for k, v in case.annotations.items()}
    devices = [replace(d, info=replace(d.info, type=cw)) for d in case.devices]
    request = DeviceRequest(case.nums, case.type or cw, case.memreq, case.pct, case.cores)
    result = vendor.fit(devices, request, context(annotations, case.node_annotations))
    assert outcome(result) == case.want


def test_a_910c_request_for_several_takes_a_whole_module() -> None:
    # HAMi pkg/device/ascend/device_test.go TestDevices_Fit_910C
    # "fit success: Ascend910C topology-aware allocation (full modules only)"
    vendor = chip("Ascend910C", memory_allocatable=65536, memory_capacity=65536)
    devices = [npu("dev-0", 0, network=0), npu("dev-1", 1, network=0), npu("dev-2", 2, network=0)]
    result = vendor.fit(devices, DeviceRequest(2, "Ascend910C", 128, 0, 100), context())
    assert outcome(result) == (True, ["dev-1", "dev-0"], "")
    assert isinstance(result, Picked)
    assert result.slices == (
        GPUSlice("dev-1", 128, 100, "Ascend910C"),
        GPUSlice("dev-0", 128, 100, "Ascend910C"),
    )


# --- device_910c_pairing_test.go ----------------------------------------------------------------------------


def pairing(indices: list[int], network: bool = True) -> list[GPUUsage]:
    """The pairing tests' devices: `dev-<i>` at index i, one slot, 32000 MiB, no cores."""
    return [
        npu(f"dev-{i}", i, count=1, totalmem=32000, totalcore=0, network=0 if network else None)
        for i in indices
    ]


C910_PLAIN = chip("Ascend910C", memory_name="")
"""The pairing tests' chip: `VNPUConfig{CommonWord: Ascend910C}`."""


def fit_910c(devices: list[GPUUsage], nums: int) -> Picked | Unfit:
    return C910_PLAIN.fit(devices, DeviceRequest(nums, "Ascend910C"), context())


def test_910c_modules_that_do_not_add_up_to_the_request_are_refused() -> None:
    # HAMi pkg/device/ascend/device_910c_pairing_test.go TestAscend910C_FitPartialAllocationBug
    result = fit_910c(pairing([0, 1, 2, 4, 6]), 4)
    assert outcome(result) == (False, [], "2/4 AllocatedCardsInsufficientRequest")


def test_910c_npus_of_two_different_modules_are_not_a_pair() -> None:
    # HAMi pkg/device/ascend/device_910c_pairing_test.go TestAscend910C_FitExactCountBypassBug
    assert outcome(fit_910c(pairing([0, 2]), 2)) == (False, [], "0/2 AllocatedCardsInsufficientRequest")


def test_910c_a_whole_module_fits_a_request_for_two() -> None:
    # HAMi pkg/device/ascend/device_910c_pairing_test.go TestAscend910C_FitFullPairSucceeds
    assert outcome(fit_910c(pairing([0, 1]), 2)) == (True, ["dev-1", "dev-0"], "")


def test_910c_modules_are_checked_without_network_ids_too() -> None:
    # HAMi pkg/device/ascend/device_910c_pairing_test.go TestAscend910C_FitWithoutNetworkID_ValidatesPairing
    assert outcome(fit_910c(pairing([0, 2], network=False), 2)) == (
        False,
        [],
        "0/2 AllocatedCardsInsufficientRequest",
    )
    assert outcome(fit_910c(pairing([0, 1], network=False), 2)) == (True, ["dev-1", "dev-0"], "")


def test_910c_no_whole_module_among_the_candidates_gives_nothing() -> None:
    # HAMi pkg/device/ascend/device_910c_pairing_test.go
    # TestComputeBestCombination910C_NoFullPairsReturnsEmpty
    # (its direct call of computeBestCombination910C is seen here through Fit: 0 devices chosen)
    result = fit_910c(pairing([0, 2, 4, 6], network=False), 4)
    assert outcome(result) == (False, [], "0/4 AllocatedCardsInsufficientRequest")


def test_an_odd_910c_request_for_several_can_never_be_met_and_counts_over_the_request() -> None:
    result = fit_910c(pairing([0, 1, 2, 3, 4, 5]), 3)
    assert outcome(result) == (False, [], "4/3 AllocatedCardsInsufficientRequest")


def test_910c_device_reasons_count_over_the_request_too() -> None:
    devices = [*pairing([0, 1]), npu("dev-2", 2, count=1, totalmem=32000, totalcore=0, health=False)]
    result = fit_910c(devices, 4)
    assert outcome(result) == (False, [], "1/4 CardNotHealth, 2/4 AllocatedCardsInsufficientRequest")


def test_910c_modules_come_in_the_order_their_first_npu_was_tried() -> None:
    # Go picks among whole modules at random (map order, sort.Slice); here the policy's order decides
    result = fit_910c(pairing([0, 1, 2, 3, 4, 5]), 2)
    assert outcome(result) == (True, ["dev-5", "dev-4"], "")


def test_a_910c_request_for_one_is_the_common_fit() -> None:
    result = fit_910c(pairing([0, 2], network=False), 1)
    assert outcome(result) == (True, ["dev-2"], "")


# --- the NetworkID grouping, hami-core mode ----------------------------------------------------------------


def test_network_groups_of_equal_size_come_in_the_order_their_first_device_was_tried() -> None:
    devices = [
        npu("a", network=0),
        npu("b", network=1),
        npu("c", network=0),
        npu("d", network=1),
        npu("e", network=2),
    ]
    result = chip("Ascend910B3").fit(devices, DeviceRequest(3, "Ascend910B3", 64), context())
    assert outcome(result) == (True, ["d", "b", "c"], "")


def test_with_network_ids_a_request_for_one_takes_the_first_device_tried() -> None:
    devices = [npu("a", network=0), npu("b", network=1)]
    assert outcome(chip("Ascend910B3").fit(devices, DeviceRequest(1, "Ascend910B3", 64), context())) == (
        True,
        ["b"],
        "",
    )


def test_network_ids_are_not_read_on_a_310p() -> None:
    devices = [npu("a", network=0), npu("b", network=1), npu("c", network=1)]
    result = chip("Ascend310P").fit(devices, DeviceRequest(2, "Ascend310P", 64), context())
    assert outcome(result) == (True, ["c", "b"], "")


def test_with_network_ids_too_few_devices_is_allocated_cards_insufficient() -> None:
    devices = [npu("a", network=0), npu("b", network=1, health=False)]
    result = chip("Ascend910B3").fit(devices, DeviceRequest(2, "Ascend910B3", 64), context())
    assert outcome(result) == (False, [], "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth")


def test_a_device_counts_100_cores_in_hami_core_mode() -> None:
    devices = [npu("a", totalmem=32768, totalcore=20)]
    request = DeviceRequest(1, "Ascend910B3", 8192, 0, 50)
    hami = chip("Ascend910B3").fit(devices, request, context(HAMI_CORE, {"hami-vnpu-core": "true"}))
    legacy = chip("Ascend910B3").fit(devices, request, context({}, {"hami-vnpu-core": "true"}))
    assert outcome(hami) == (True, ["a"], "")
    assert outcome(legacy) == (False, [], "1/1 CardInsufficientCore")


def test_mode_not_fit_counts_once_over_every_device() -> None:
    devices = [npu("a"), npu("b"), npu("c")]
    result = chip("Ascend910B3").fit(devices, DeviceRequest(1, "Ascend910B3", 64), context(HAMI_CORE))
    assert outcome(result) == (False, [], "1/3 ModeNotFit")


@pytest.mark.parametrize(
    ("global_core", "node_annotations", "fits"),
    [
        pytest.param(True, None, True, id="global on, no node annotation"),
        pytest.param(True, {"hami-vnpu-core": "false"}, False, id="node annotation false wins"),
        pytest.param(False, {"hami-vnpu-core": "true"}, True, id="node annotation true wins"),
        pytest.param(False, {"hami-vnpu-core": "TRUE"}, False, id="only true is true"),
    ],
)
def test_the_node_annotation_overrides_hami_vnpu_core(
    global_core: bool, node_annotations: Json | None, fits: bool
) -> None:
    vendor = chip("Ascend910B3", hami_vnpu_core=global_core)
    result = vendor.fit([npu("a")], DeviceRequest(1, "Ascend910B3", 64), context(HAMI_CORE, node_annotations))
    assert isinstance(result, Picked) is fits


# --- ScoreNode ----------------------------------------------------------------------------------------------


def float32(value: float) -> float:
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


def test_the_score_rewards_devices_on_one_network_in_float32() -> None:
    previous = [npu("a", network=0), npu("b", network=0), npu("c", network=1), npu("d", network=1)]
    devices = PodAllocation(
        (
            ContainerAllocation(),
            ContainerAllocation(tuple(GPUSlice(u, 64, 0, "Ascend910B3") for u in ("a", "b", "c"))),
            ContainerAllocation((GPUSlice("d", 64, 0, "Ascend910B3"),)),
        )
    )
    score = chip("Ascend910B3").score_node(node("n"), devices, previous, "binpack")
    assert score == float32(float32(float32(float32(2 / 3) + 1.0)) * 10)
    assert score == pytest.approx(50 / 3, rel=1e-6)


def test_the_score_is_zero_when_a_chosen_device_has_no_network_id() -> None:
    previous = [npu("a", network=0), npu("b")]
    devices = one_container(GPUSlice("a", 64, 0, "Ascend910B3"), GPUSlice("b", 64, 0, "Ascend910B3"))
    assert chip("Ascend910B3").score_node(node("n"), devices, previous, "spread") == 0.0


def test_only_910_chips_score() -> None:
    previous = [npu("a", network=0)]
    devices = one_container(GPUSlice("a", 64, 0, "Ascend310P"))
    assert chip("Ascend310P").score_node(node("n"), devices, previous, "binpack") == 0.0
    assert chip("Ascend910A").score_node(node("n"), devices, previous, "binpack") == 10.0


def test_a_network_id_that_is_not_a_number_is_not_counted() -> None:
    previous = [npu("a", custom={"NetworkID": "x"}), npu("b", network=3)]
    devices = one_container(GPUSlice("a", 64, 0, "Ascend910A"), GPUSlice("b", 64, 0, "Ascend910A"))
    assert chip("Ascend910A").score_node(node("n"), devices, previous, "binpack") == 10.0


# --- build() ------------------------------------------------------------------------------------------------


def test_the_chart_defaults_give_seven_chips_in_order() -> None:
    vendors = build(parse_device_config("", "device-config.yaml"))
    assert [v.names.common_word for v in vendors] == [
        "Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4-1", "Ascend910B4", "Ascend310P",
        "Ascend910C",
    ]  # fmt: skip
    chips = [v for v in vendors if isinstance(v, Ascend)]
    assert len(chips) == 7
    assert [c.config.super_pod for c in chips] == [False] * 6 + [True]
    assert [c.names.memory_factor for c in chips] == [1] * 6 + [0]
    assert not any(c.hami_vnpu_core for c in chips)
    p310 = chips[5].config
    assert (p310.chip_name, p310.memory_allocatable, p310.memory_capacity, p310.ai_core, p310.ai_cpu) == (
        "310P3", 21527, 24576, 8, 7,
    )  # fmt: skip
    assert p310.templates[0] == Template("vir01", 3072, 1, 1)
    names = chips[2].names
    assert (names.count, names.memory, names.cores) == (
        "huawei.com/Ascend910B3", "huawei.com/Ascend910B3-memory", "huawei.com/Ascend910B3-core",
    )  # fmt: skip
    assert names.runtime_class == ""


def test_a_file_sets_hami_vnpu_core_and_templates_are_sorted_by_memory() -> None:
    text = """
vnpus:
  hamiVnpuCore: true
  configs:
  - commonWord: Ascend910B3
    resourceName: huawei.com/Ascend910B3
    resourceMemoryName: huawei.com/Ascend910B3-memory
    memoryCapacity: 65536
    memoryAllocatable: 65536
    runtimeClassName: ascend
    overwriteEnv: true
    topologyPairs: ["1,2", "0,2"]
    templates:
      - {name: big, memory: 32768, aiCore: 10, aiCPU: 3}
      - {name: small, memory: 16384, aiCore: 5, aiCPU: 1}
"""
    (vendor,) = build(parse_device_config(text, "device-config.yaml"))
    assert isinstance(vendor, Ascend)
    assert vendor.hami_vnpu_core
    assert [t.name for t in vendor.config.templates] == ["small", "big"]
    assert vendor.config.trim_memory(20000) == (32768, "big")
    assert (vendor.config.overwrite_env, vendor.names.runtime_class) == (True, "ascend")


@pytest.mark.parametrize(
    ("entry", "key", "line", "message"),
    [
        pytest.param(
            "memoryAllocatable: lots", "vnpus.configs[0].memoryAllocatable", 7, "must be an integer"
        ),
        pytest.param("memoryCapacty: 1", "vnpus.configs[0].memoryCapacty", 7, "is not a known key here"),
        pytest.param("superPod: maybe", "vnpus.configs[0].superPod", 7, "must be true or false"),
        pytest.param("commonWord: Ascend910A", "vnpus.configs[0].commonWord", 4, "must be letters"),
    ],
)
def test_a_bad_config_value_is_a_config_error_naming_key_and_line(
    entry: str, key: str, line: int, message: str
) -> None:
    word = "Ascend 910" if "commonWord" in entry else "Ascend910A"
    body = entry if "commonWord" not in entry else ""
    text = f"""vnpus:
  configs:
  - resourceName: huawei.com/Ascend910A
    commonWord: {word}
    resourceMemoryName: huawei.com/Ascend910A-memory
    memoryCapacity: 1
    {body}
"""
    with pytest.raises(ConfigError) as info:
        build(parse_device_config(text, "device-config.yaml"))
    assert (info.value.key, info.value.line) == (key, line)
    assert message in info.value.reason


def test_a_common_word_used_twice_is_a_config_error() -> None:
    text = """vnpus:
  configs:
  - {commonWord: Ascend910B4, resourceName: a/b, resourceMemoryName: a/c}
  - {commonWord: Ascend910B4, resourceName: a/d, resourceMemoryName: a/e}
"""
    with pytest.raises(ConfigError) as info:
        build(parse_device_config(text, "device-config.yaml"))
    assert (info.value.key, info.value.line) == ("vnpus.configs[1].commonWord", 4)
    assert "already used by vnpus.configs[0]" in info.value.reason


def test_a_chip_without_a_resource_name_is_a_config_error() -> None:
    text = "vnpus:\n  configs:\n  - {commonWord: Ascend910A, resourceMemoryName: a/c}\n"
    with pytest.raises(ConfigError) as info:
        build(parse_device_config(text, "device-config.yaml"))
    assert info.value.key == "vnpus.configs[0].resourceName"
    assert info.value.reason == "is required"
