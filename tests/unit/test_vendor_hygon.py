"""hami_control.devices.hygon: HAMi's Hygon DCU backend (pkg/device/hygon/device.go, v2.10.0), its Go tests
(pkg/device/hygon/device_test.go) transcribed case by case, the device config section, and property tests
of the request reader, the inventory decoder and Fit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import GPU_SCHEDULER_POLICY, decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import hygon
from hami_control.devices.base import (
    INT32_MAX,
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    as_int64,
)
from hami_control.devices.config import load_device_config, parse_device_config
from hami_control.devices.standard import request_memory
from hami_control.usage import GPUUsage
from tests.builders import container, node

VENDOR = hygon.Hygon(hygon.names())
CW = hygon.COMMON_WORD
COUNT, MEM, CORES = "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"
REGISTER = "hami.io/node-dcu-register"
HANDSHAKE = "hami.io/node-handshake-dcu"
GO = "HAMi pkg/device/hygon/device_test.go"
NOW = datetime(2026, 3, 1, 12, 0, 0)


def device(
    uid: str,
    *,
    index: int = 0,
    used: int = 0,
    count: int = 100,
    usedmem: int = 0,
    totalmem: int = 1280,
    totalcore: int = 100,
    usedcores: int = 0,
    typ: str = CW,
    health: bool = True,
) -> GPUUsage:
    """A DCU with Go's DeviceUsage fields injected (Used, Count, Usedmem, Totalmem, Totalcore, Usedcores)."""
    info = GPUInfo(uid, index=index, count=count, devmem=totalmem, devcore=totalcore, type=typ, health=health)
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def req(nums: int, memreq: int = 512, pct: int = 0, cores: int = 50, typ: str = CW) -> DeviceRequest:
    return DeviceRequest(nums, typ, memreq=memreq, mem_percentage=pct, coresreq=cores)


def context(annotations: dict[str, str]) -> FitContext:
    """The pod of a Go Fit test: its annotations, and the policy chain HAMi reads from them."""
    policy = annotations.get(GPU_SCHEDULER_POLICY)
    chain = decode_gpu_policy(policy) if policy else (GPUPolicy.SPREAD,)
    return FitContext({"metadata": {"annotations": annotations}}, policy=chain)


def _read(text: str) -> Any:
    return lambda _path: text


def want(nums: int = 1, mem: int = 0, cores: int = 100) -> DeviceRequest:
    """A DCU request as GenerateResourceRequests builds it: no memory asks 100 % of the device."""
    return DeviceRequest(nums, CW, memreq=mem, mem_percentage=100 if mem == 0 else 0, coresreq=cores)


# --- names ------------------------------------------------------------------------------------------


def test_names_are_hamis_keys() -> None:
    names = VENDOR.names
    assert (names.common_word, names.family) == ("DCU", "hygon")
    assert (names.count, names.memory, names.cores) == (COUNT, MEM, CORES)
    assert names.memory_factor == 1
    assert names.to_allocate == "hami.io/dcu-devices-to-allocate"
    assert names.allocated == "hami.io/dcu-devices-allocated"
    assert (names.register, names.inventory) == (REGISTER, Inventory.LEGACY)
    assert (names.handshake, names.health) == (HANDSHAKE, HealthRule.HANDSHAKE)
    assert (names.use_uuid, names.nouse_uuid) == ("hygon.com/use-gpuuuid", "hygon.com/nouse-gpuuuid")
    assert (names.use_type, names.nouse_type) == ("hygon.com/use-dcutype", "hygon.com/nouse-dcutype")
    assert names.resources == (COUNT, MEM, CORES)
    assert names.runtime_class == ""


# --- Test_MutateAdmission ---------------------------------------------------------------------------


def test_mutate_finds_a_container_with_the_count_in_limits_and_changes_nothing() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_MutateAdmission "set to resource limits"
    ctr = container(limits={COUNT: "1"})
    pod: dict[str, Any] = {"metadata": {}, "spec": {"containers": [ctr]}}
    before = json.dumps([ctr, pod])
    assert VENDOR.mutate(ctr, pod) == Admission(True, "")
    assert json.dumps([ctr, pod]) == before


@pytest.mark.parametrize(
    "ctr",
    [
        pytest.param(container(requests={COUNT: "1"}), id="count in requests only"),
        pytest.param(container(limits={MEM: "1024"}), id="memory without count"),
        pytest.param({"name": "c"}, id="no resources"),
        pytest.param({"name": "c", "resources": {"limits": "oops"}}, id="malformed limits"),
    ],
)
def test_mutate_ignores_a_container_without_the_count_in_limits(ctr: dict[str, Any]) -> None:
    # MutateAdmission reads ctr.Resources.Limits[count] only
    assert VENDOR.mutate(ctr, {}) == Admission(False, "")


# --- Test_checkDCUtype ------------------------------------------------------------------------------
# checkDCUtype(annos, cardtype) is CheckType over hygon.com/use-dcutype / nouse-dcutype; here it is the
# type step of Fit for a DCU request on a device of that Type.

USE, NOUSE = "hygon.com/use-dcutype", "hygon.com/nouse-dcutype"
DCUTYPE = f"{GO} Test_checkDCUtype"


@pytest.mark.parametrize(
    ("annotations", "card_type", "allowed"),
    [
        pytest.param({USE: "dcu"}, "dcu", True, id=f'{DCUTYPE} "exist one dcu in use type"'),
        pytest.param({USE: "dcu"}, "test", False, id=f'{DCUTYPE} "the different of dcu in use type"'),
        pytest.param({}, "dcu", True, id=f'{DCUTYPE} "no dcu in use annotation"'),
        pytest.param({USE: "dcu,test"}, "dcu", True, id=f'{DCUTYPE} "exist multi dcu in use type"'),
        pytest.param({NOUSE: "dcu"}, "dcu", False, id=f'{DCUTYPE} "exist one dcu no use type"'),
        pytest.param({}, "dcu", True, id=f'{DCUTYPE} "no dcu in use annotation" (the second case so named)'),
        pytest.param({NOUSE: "test,dcu"}, "test", False, id=f'{DCUTYPE} "exist multi dcu no use type"'),
        pytest.param({NOUSE: "dcu"}, "test", True, id=f'{DCUTYPE} "the different of dcu no use type"'),
        pytest.param({USE: ""}, "dcu", True, id=f'{DCUTYPE} "empty use type annotation is no constraint"'),
        pytest.param(
            {NOUSE: ""}, "dcu", True, id=f'{DCUTYPE} "empty nouse type annotation excludes nothing"'
        ),
        pytest.param(
            {NOUSE: "   "},
            "dcu",
            True,
            id=f'{DCUTYPE} "whitespace-only nouse type annotation excludes nothing"',
        ),
        pytest.param({USE: "z100"}, "DCU-Z100L", True, id="a substring of the card type, any case"),
        pytest.param({USE: "K100", NOUSE: "k100"}, "DCU-K100", False, id="nouse wins over use"),
    ],
)
def test_type_step_applies_the_use_and_nouse_dcutype_annotations(
    annotations: dict[str, str], card_type: str, allowed: bool
) -> None:
    assert VENDOR.type_allowed(annotations, device("d", typ=card_type), req(1)) is allowed


# --- Test_checkType ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("DCU", True, id=f'{GO} Test_checkType "the same type"'),
        pytest.param("test", False, id=f'{GO} Test_checkType "the different type"'),
        pytest.param("dcu", False, id="strings.Compare: exact and case-sensitive"),
        pytest.param("DCUX", False, id="no prefix or substring match on the request's Type"),
    ],
)
def test_type_step_needs_the_request_type_to_be_dcu_exactly(request_type: str, allowed: bool) -> None:
    annotations = {USE: "DCU"}
    assert VENDOR.type_allowed(annotations, device("d", typ="DCU"), req(1, typ=request_type)) is allowed


# --- Test_GetNodeDevices ----------------------------------------------------------------------------


def test_node_devices_no_annotation_is_no_inventory() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_GetNodeDevices "no annotation" (Go: "annos not found ...")
    assert VENDOR.node_devices(node("n1", annotations={})) is None


def test_node_devices_decode_the_legacy_string() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_GetNodeDevices "exist dcu device"
    got = VENDOR.node_devices(node("n1", annotations={REGISTER: "test-0,1,1024,100,DCU,0,true,0,test:"}))
    assert got == (
        GPUInfo(
            "test-0", index=0, count=1, devmem=1024, devcore=100, type="DCU", numa=0, mode="test", health=True
        ),
    )


def test_node_devices_seven_fields_take_index_0_and_mode_hami_core() -> None:
    got = VENDOR.node_devices(
        node(
            "n1", annotations={REGISTER: "a,4,16384,100,DCU-Z100,1,false:b,4,16384,100,DCU-Z100,1,true,3,x:"}
        )
    )
    assert got == (
        GPUInfo("a", index=0, count=4, devmem=16384, devcore=100, type="DCU-Z100", numa=1, mode="hami-core"),
        GPUInfo(
            "b", index=3, count=4, devmem=16384, devcore=100, type="DCU-Z100", numa=1, mode="x", health=True
        ),
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(":", id=f'{GO} Test_GetNodeDevices "no dcu device"'),
        pytest.param("::", id="only separators"),
    ],
)
def test_node_devices_listing_no_device_is_no_inventory(text: str) -> None:
    # Go: DecodeNodeDevices gives no device and GetNodeDevices the error "no gpu found on node" (so HAMi's
    # register loop keeps its cache as for a missing annotation): None, not an empty inventory
    assert VENDOR.node_devices(node("n1", annotations={REGISTER: text})) is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("", "", id=f'{GO} Test_GetNodeDevices "node annotations not decode successfully"'),
        pytest.param(
            "test-0,1,1024,100,DCU:", "", id=f'{GO} Test_GetNodeDevices "dcu device length less than 7"'
        ),
        pytest.param("test-0,x,1024,100,DCU,0,true:", "count", id="count not an integer"),
        pytest.param('[{"id":"a"}]', "", id="the JSON form is not Hygon's"),
    ],
)
def test_node_devices_that_do_not_decode_raise_wire_format_error(text: str, field: str) -> None:
    with pytest.raises(WireFormatError) as err:
        VENDOR.node_devices(node("n1", annotations={REGISTER: text}))
    assert err.value.annotation == REGISTER
    assert err.value.field == field


def test_node_devices_not_a_string_raise_wire_format_error() -> None:
    with pytest.raises(WireFormatError):
        VENDOR.node_devices({"metadata": {"annotations": {REGISTER: 7}}})


@given(
    st.one_of(
        st.text(alphabet="0123456789,:-+abtruefalsDCU ", max_size=60),
        st.text(max_size=40),
    )
)
def test_node_devices_return_devices_or_none_or_raise_wire_format_error(text: str) -> None:
    try:
        got = VENDOR.node_devices(node("n1", annotations={REGISTER: text}))
    except WireFormatError as err:
        assert err.annotation == REGISTER
        return
    assert got is None or (len(got) > 0 and all(isinstance(d, GPUInfo) for d in got))


# --- Test_CheckHealth -------------------------------------------------------------------------------
# The Go test writes its annotation under util.HandshakeAnnos["hygon.com/dcu"], a lookup by a key that is no
# common word, i.e. under "" (and CheckHealth reads "" too, devType being "hygon.com/dcu"); the behaviour it
# checks is the handshake's, so the annotation is written under the real key, hami.io/node-handshake-dcu.


def test_health_expired_request_without_allocatable_is_unhealthy() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_CheckHealth "Requesting state expired"
    n = node("n1", annotations={HANDSHAKE: "Requesting_2025-01-07 00:00:00"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(False, False)


def test_health_unknown_state_registers_and_requests_a_handshake() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_CheckHealth "Unknown state" (Go patches Requesting_<now>)
    n = node("n1", annotations={HANDSHAKE: "Unknown"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, True, "Requesting_2026-03-01 12:00:00")


def test_health_expired_request_with_allocatable_dcus_stays_healthy() -> None:
    n = node("n1", annotations={HANDSHAKE: "Requesting_2025-01-07 00:00:00"}, allocatable={COUNT: "8"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, False)


def test_health_request_younger_than_60_seconds_is_awaited() -> None:
    n = node("n1", annotations={HANDSHAKE: "Requesting_2026-03-01 11:59:01"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, False)


def test_health_reads_the_count_resource_of_the_config() -> None:
    vendor = hygon.Hygon(hygon.names(count="example.com/dcu"))
    n = node(
        "n1",
        annotations={HANDSHAKE: "Requesting_2025-01-07 00:00:00"},
        allocatable={COUNT: "8", "example.com/dcu": "0"},
    )
    assert vendor.node_health(n, NOW) == NodeHealth(False, False)


# --- Test_PatchAnnotations --------------------------------------------------------------------------


def test_pod_annotations_write_the_device_string_under_both_keys() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_PatchAnnotations "exist device"
    devices = PodAllocation((ContainerAllocation((GPUSlice("test1", 2048, 1, "DCU"),)),))
    got = VENDOR.pod_annotations({}, devices, node="n1", now=NOW.replace(tzinfo=UTC))
    assert got == {
        "hami.io/dcu-devices-to-allocate": "test1,DCU,2048,1:;",
        "hami.io/dcu-devices-allocated": "test1,DCU,2048,1:;",
    }


def test_pod_annotations_without_devices_write_nothing() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_PatchAnnotations "no device"
    assert VENDOR.pod_annotations({}, PodAllocation(), node="n1", now=NOW.replace(tzinfo=UTC)) == {}


def test_pod_annotations_keep_one_entry_per_container() -> None:
    devices = PodAllocation(
        (
            ContainerAllocation(),
            ContainerAllocation((GPUSlice("a", 64, 50, "DCU"), GPUSlice("b", 64, 50, "DCU"))),
        )
    )
    got = VENDOR.pod_annotations({}, devices, node="n1", now=NOW.replace(tzinfo=UTC))
    assert got["hami.io/dcu-devices-to-allocate"] == ";a,DCU,64,50:b,DCU,64,50:;"
    assert got["hami.io/dcu-devices-allocated"] == got["hami.io/dcu-devices-to-allocate"]


# --- Test_GenerateResourceRequests (+ _OutOfRangeValues, _MemoryFactorOverflow) ---------------------

GEN = f"{GO} Test_GenerateResourceRequests"


@pytest.mark.parametrize(
    ("ctr", "expected"),
    [
        pytest.param(container(limits={}, requests={}), None, id=f'{GEN} "don\'t set to limits and request"'),
        pytest.param(
            container(
                limits={COUNT: "1", CORES: "1", MEM: "1024"}, requests={COUNT: "1", CORES: "1", MEM: "1024"}
            ),
            DeviceRequest(1, "DCU", memreq=1024, mem_percentage=0, coresreq=1),
            id=f'{GEN} "dcuResourceCount,dcuesourceMem and dcuResourceCores set to limits and request"',
        ),
        pytest.param(
            container(limits={COUNT: "1"}, requests={COUNT: "1", CORES: "1", MEM: "1024"}),
            DeviceRequest(1, "DCU", memreq=1024, mem_percentage=0, coresreq=1),
            id=f'{GEN} "dcuResourceMem,dcuResourceCores don\'t set limit and dcuResourceCount set to limits '
            'and request"',
        ),
        pytest.param(
            container(limits={COUNT: "1"}, requests={COUNT: "1", CORES: "1"}),
            DeviceRequest(1, "DCU", memreq=0, mem_percentage=100, coresreq=1),
            id=f'{GEN} "dcuResourceMem don\'t set limit and request,dcuResourceCores don\'t set limit and '
            'dcuResourceCount set to limits and request"',
        ),
        pytest.param(
            container(limits={COUNT: "1", MEM: "16Gi"}),
            None,
            id=f'{GEN} "oversized dcu memory request exceeds int32 range"',
        ),
        pytest.param(
            container(limits={COUNT: "2200000000"}),
            None,
            id=f'{GEN}_OutOfRangeValues "oversized dcu count exceeds int32 range"',
        ),
        pytest.param(
            container(limits={COUNT: "1", CORES: "-1"}),
            None,
            id=f'{GEN}_OutOfRangeValues "negative dcu cores"',
        ),
        # beyond the Go tests, from device.go
        pytest.param(container(limits={COUNT: "2"}), want(2), id="cores default to 100"),
        pytest.param(container(requests={COUNT: "1"}), want(), id="count in requests"),
        pytest.param(container(limits={COUNT: "3"}, requests={COUNT: "1"}), want(3), id="limits win"),
        pytest.param(container(limits={COUNT: "1", MEM: "0"}), want(), id="memory 0 is 100 %"),
        pytest.param(container(limits={COUNT: "1", CORES: "0"}), want(cores=0), id="cores 0 stay 0"),
        pytest.param(container(limits={COUNT: "1", CORES: "120"}), want(cores=120), id="cores over 100"),
        pytest.param(container(limits={COUNT: "1", MEM: "-1"}), None, id="negative memory"),
        pytest.param(container(limits={COUNT: "1", MEM: "2147483647"}), want(mem=INT32_MAX), id="int32 mem"),
        pytest.param(container(limits={COUNT: "1", MEM: "2147483648"}), None, id="memory past int32"),
        pytest.param(container(limits={COUNT: "1", CORES: "2147483648"}), None, id="cores past int32"),
        pytest.param(container(limits={COUNT: "1", MEM: "1.5"}), want(), id="fractional memory is unread"),
        pytest.param(container(limits={COUNT: "1", CORES: "0.5"}), want(), id="fractional cores are unread"),
        pytest.param(container(limits={COUNT: "0"}), None, id="zero count"),
        pytest.param(container(limits={COUNT: "-2"}), None, id="negative count"),
        pytest.param(container(limits={COUNT: "1.5"}), None, id="fractional count"),
        pytest.param(container(limits={COUNT: "2147483647"}), want(INT32_MAX), id="int32 count"),
        pytest.param(
            container(limits={COUNT: "1.5"}, requests={COUNT: "1"}),
            None,
            id="an unreadable limit does not fall back",
        ),
        pytest.param(container(limits={COUNT: "not-a-quantity"}), None, id="garbage count"),
        pytest.param({"name": "c", "resources": "oops"}, None, id="malformed resources"),
        pytest.param(container(limits={MEM: "1024", CORES: "50"}), None, id="memory and cores without count"),
    ],
)  # fmt: skip
def test_request_reads_count_memory_and_cores_as_go_does(
    ctr: dict[str, Any], expected: DeviceRequest | None
) -> None:
    assert VENDOR.request(ctr) == expected


def test_request_memory_past_int32_once_scaled_is_no_request() -> None:
    # HAMi pkg/device/hygon/device_test.go Test_GenerateResourceRequests_MemoryFactorOverflow
    # (3000000 fits in int32, 3000000 * 1024 does not)
    vendor = hygon.Hygon(hygon.names(memory_factor=1024))
    assert vendor.request(container(limits={COUNT: "1", MEM: "3000000"})) is None


def test_request_memory_is_scaled_by_the_memory_factor() -> None:
    vendor = hygon.Hygon(hygon.names(memory_factor=1024))
    assert vendor.request(container(limits={COUNT: "1", MEM: "16"})) == DeviceRequest(1, "DCU", 16384, 0, 100)
    assert vendor.request(container(limits={COUNT: "1", MEM: "2097151"})) == DeviceRequest(
        1, "DCU", 2097151 * 1024, 0, 100
    )


@pytest.mark.parametrize("factor", [0, 1])
def test_request_memory_factor_up_to_1_does_not_scale(factor: int) -> None:
    vendor = hygon.Hygon(hygon.names(memory_factor=factor))
    assert vendor.request(container(limits={COUNT: "1", MEM: "3000000"})) == DeviceRequest(
        1, "DCU", 3000000, 0, 100
    )


_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    _INT64,
    st.none() | _INT64,
    st.none() | _INT64,
    st.sampled_from(["limits", "requests"]),
    st.sampled_from([0, 1, 2, 1024]),
)
def test_request_is_never_negative_for_any_int64_values(
    count: int, mem: int | None, cores: int | None, section: str, factor: int
) -> None:
    values = {COUNT: str(count)}
    if mem is not None:
        values[MEM] = str(mem)
    if cores is not None:
        values[CORES] = str(cores)
    got = hygon.Hygon(hygon.names(memory_factor=factor)).request({"resources": {section: values}})
    # A value Go keeps as an inf.Dec (19+ digits) is one AsInt64 cannot read: as if absent.
    if as_int64(str(count)) is None:
        assert got is None
        return
    mem = None if mem is None or as_int64(str(mem)) is None else mem
    cores = None if cores is None or as_int64(str(cores)) is None else cores
    scaled = None if mem is None else mem * max(factor, 1)
    in_range = (
        0 < count <= INT32_MAX
        and (scaled is None or (0 <= mem <= INT32_MAX and scaled <= INT32_MAX))  # type: ignore[operator]
        and (cores is None or 0 <= cores <= INT32_MAX)
    )
    if not in_range:
        assert got is None
        return
    memreq = scaled or 0
    assert got == DeviceRequest(
        count, "DCU", memreq, 100 if memreq == 0 else 0, 100 if cores is None else cores
    )
    assert got.nums > 0 and got.memreq >= 0 and got.coresreq >= 0


@given(
    st.one_of(
        st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans(), st.lists(st.integers())
    ),
    st.sampled_from([COUNT, MEM, CORES]),
)
def test_request_never_raises_for_any_value(value: object, resource: str) -> None:
    limits: dict[str, Any] = {COUNT: "1", resource: value}
    got = VENDOR.request({"resources": {"limits": limits}})
    assert got is None or (0 < got.nums <= INT32_MAX and got.memreq >= 0 and got.coresreq >= 0)


# --- TestDevices_LockNode / TestDevices_ReleaseNodeLock ---------------------------------------------
# The Go tests lock and release through a fake client; here the lock is data (`names.lock`) taken by the
# binder when a regular container (p.Spec.Containers; init containers are not looked at) asks a DCU
# (`request()` not None), which is what each case decides.


def asks(pod: dict[str, Any]) -> bool:
    return any(VENDOR.request(c) is not None for c in pod.get("spec", {}).get("containers", []))


def test_lock_is_hamis_node_mutex() -> None:
    # NodeLockDCU = "hami.io/mutex.lock" (the nodelock package's one key)
    assert VENDOR.names.lock is LockKind.MUTEX
    assert VENDOR.names.lock_annotation == "hami.io/mutex.lock"


@pytest.mark.parametrize(
    ("pod", "locks"),
    [
        pytest.param({"spec": {}}, False, id=f'{GO} TestDevices_LockNode "Test with no containers"'),
        pytest.param(
            {"spec": {"containers": [container(requests={COUNT: "1"})]}},
            True,
            id=f'{GO} TestDevices_LockNode "Test with non-zero resource requests"',
        ),
        # ReleaseNodeLock: hasLock stays true without containers (nothing released), false once released
        pytest.param({"spec": {}}, False, id=f'{GO} TestDevices_ReleaseNodeLock "Test with no containers"'),
        pytest.param(
            {
                "metadata": {"name": "nozerorr", "namespace": "default"},
                "spec": {"containers": [container(requests={COUNT: "1"})]},
            },
            True,
            id=f'{GO} TestDevices_ReleaseNodeLock "Test with non-zero resource requests"',
        ),
        pytest.param(
            {"spec": {"initContainers": [container(limits={COUNT: "1"})], "containers": [container()]}},
            False,
            id="a DCU asked by an init container only takes no lock",
        ),
        pytest.param(
            {"spec": {"containers": [container(limits={COUNT: "0"})]}},
            False,
            id="a count of 0 is no request, no lock",
        ),
    ],
)  # fmt: skip
def test_lock_is_taken_and_released_only_for_a_pod_whose_containers_ask_a_dcu(
    pod: dict[str, Any], locks: bool
) -> None:
    assert asks(pod) is locks


# --- TestDevices_Fit --------------------------------------------------------------------------------

FIT = f"{GO} TestDevices_Fit"
FIT_CASES = [
    pytest.param(
        [device("dev-0", totalmem=128), device("dev-1", totalmem=128)],
        req(1, 64, 0, 50),
        {},
        (GPUSlice("dev-1", 64, 50, "DCU"),),
        "",
        id=f'{FIT} "fit success"',
    ),
    pytest.param(
        [device("dev-0", totalmem=128)],
        req(1, 512, 0, 50),
        {},
        None,
        "1/1 CardInsufficientMemory",
        id=f'{FIT} "fit fail: memory not enough"',
    ),
    pytest.param(
        [device("dev-0", totalmem=1024, usedcores=100)],
        req(1, 512, 0, 50),
        {},
        None,
        "1/1 CardInsufficientCore",
        id=f'{FIT} "fit fail: core not enough"',
    ),
    pytest.param(
        [device("dev-0", totalmem=128)],
        req(1, 512, 0, 50, typ="OtherType"),
        {},
        None,
        "1/1 CardTypeMismatch",
        id=f'{FIT} "fit fail: type mismatch"',
    ),
    pytest.param(
        [device("dev-1")],
        req(2),
        {"hygon.com/use-gpuuuid": "dev-0"},
        None,
        "1/1 CardUuidMismatch",
        id=f'{FIT} "fit fail: user assign use uuid mismatch"',
    ),
    pytest.param(
        [device("dev-0")],
        req(2),
        {"hygon.com/nouse-gpuuuid": "dev-0"},
        None,
        "1/1 CardUuidMismatch",
        id=f'{FIT} "fit fail: user assign no use uuid match"',
    ),
    pytest.param(
        [device("dev-0", used=100)],
        req(1),
        {},
        None,
        "1/1 CardTimeSlicingExhausted",
        id=f'{FIT} "fit fail: card overused"',
    ),
    pytest.param(
        [device("dev-0")],
        req(1, 512, 0, 120),
        {},
        (GPUSlice("dev-0", 512, 100, "DCU"),),
        "",
        id=f'{FIT} "fit success: but core limit can\'t exceed 100"',
    ),
    pytest.param(
        [device("dev-0", used=20)],
        req(1, 512, 0, 100),
        {},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id=f'{FIT} "fit fail:  card exclusively"',
    ),
    pytest.param(
        [device("dev-0", used=20, usedcores=100)],
        req(1, 512, 0, 0),
        {},
        None,
        "1/1 CardComputeUnitsExhausted",
        id=f'{FIT} "fit fail:  CardComputeUnitsExhausted"',
    ),
    pytest.param(
        [device("dev-0", used=20, usedcores=10)],
        req(2, 512, 0, 20),
        {},
        None,
        "1/1 AllocatedCardsInsufficientRequest",
        id=f'{FIT} "fit fail:  AllocatedCardsInsufficientRequest"',
    ),
    pytest.param(
        [device("dev-0", used=20, usedcores=10)],
        req(1, 0, 10, 20),
        {},
        (GPUSlice("dev-0", 128, 20, "DCU"),),
        "",
        id=f'{FIT} "fit success:  memory percentage"',
    ),
    pytest.param(
        [device("dev-0", used=1, count=2, totalmem=128)],
        req(1, 64, 0, 50),
        {GPU_SCHEDULER_POLICY: "mutex"},
        None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id=f'{FIT} "mutex policy rejects used device"',
    ),
    pytest.param(
        [device("dev-0"), device("dev-1", index=1)],
        req(3, 512, 0, 20),
        {},
        None,
        "2/2 AllocatedCardsInsufficientRequest",
        id=f'{FIT} "fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards"',
    ),
    pytest.param(
        [device("dev-0", health=False)],
        req(1),
        {},
        None,
        "1/1 CardNotHealth",
        id=f'{FIT} "fit fail: CardNotHealth"',
    ),
]


@pytest.mark.parametrize(("devices", "request_", "annotations", "want", "want_reason"), FIT_CASES)
def test_fit_picks_or_refuses_with_hamis_reason(
    devices: list[GPUUsage],
    request_: DeviceRequest,
    annotations: dict[str, str],
    want: tuple[GPUSlice, ...] | None,
    want_reason: str,
) -> None:
    got = VENDOR.fit(devices, request_, context(annotations))
    if want is None:
        assert isinstance(got, Unfit), got
        assert got.message == want_reason
    else:
        assert got == Picked(want)


def test_fit_walks_from_the_last_device_and_takes_nums_of_them() -> None:
    devices = [device(f"d{i}", index=i) for i in range(4)]
    got = VENDOR.fit(devices, req(2), context({}))
    assert got == Picked((GPUSlice("d3", 512, 50, "DCU"), GPUSlice("d2", 512, 50, "DCU")))


def test_fit_counts_the_first_broken_rule_per_device_in_hamis_order() -> None:
    # health, type (use-dcutype), uuid, slot, mutex, memory, cores; reasons sorted as GenReason writes them
    devices = [
        device("a", health=False, used=100, typ="OTHER"),
        device("b", typ="OTHER", used=100),
        device("x", used=100),
        device("c", used=100),
        device("d", used=1, usedmem=1280),
        device("e", usedmem=1280, usedcores=100),
        device("f", usedcores=90),
    ]
    annotations = {USE: "DCU", "hygon.com/nouse-gpuuuid": "x", GPU_SCHEDULER_POLICY: "mutex"}
    got = VENDOR.fit(devices, req(1), context(annotations))
    assert isinstance(got, Unfit)
    assert got.message == (
        "1/7 CardInsufficientCore, 1/7 CardInsufficientMemory, 1/7 CardNotHealth, "
        "1/7 CardTimeSlicingExhausted, 1/7 CardTypeMismatch, 1/7 CardUuidMismatch, "
        "1/7 ExclusiveDeviceAllocateConflict"
    )


def test_fit_on_no_devices_refuses_without_reasons() -> None:
    assert VENDOR.fit([], req(1), context({})) == Unfit({}, 0)


@given(
    specs=st.lists(
        st.tuples(
            st.booleans(),  # health
            st.integers(0, 3),  # used
            st.integers(0, 3),  # count
            st.integers(0, 1280),  # usedmem
            st.integers(0, 100),  # usedcores
        ),
        max_size=8,
    ),
    nums=st.integers(1, 5),
    memreq=st.integers(0, 1500),
    pct=st.sampled_from([0, 50, 101]),
    cores=st.integers(0, 130),
    mutex=st.booleans(),
)
def test_fit_picks_nums_devices_that_have_room_or_accounts_for_every_device(
    *, specs: list[tuple[bool, int, int, int, int]], nums: int, memreq: int, pct: int, cores: int, mutex: bool
) -> None:
    devices = [
        device(f"d{i}", index=i, health=h, used=u, count=c, usedmem=m, usedcores=k)
        for i, (h, u, c, m, k) in enumerate(specs)
    ]
    request_ = req(nums, memreq, pct, cores)
    got = VENDOR.fit(devices, request_, context({GPU_SCHEDULER_POLICY: "mutex"} if mutex else {}))
    by_id = {d.id: d for d in devices}
    if isinstance(got, Picked):
        assert len(got.slices) == nums == len({s.uuid for s in got.slices})
        for s in got.slices:
            d = by_id[s.uuid]
            assert d.healthy and d.used < d.info.count and not (mutex and d.used > 0)
            assert s.usedmem == request_memory(d, request_) <= d.free_mem
            assert s.usedcores == min(cores, 100) <= d.free_cores
            assert s.vendor == "DCU"
    else:
        assert sum(got.reasons.values()) == len(devices) == got.cards


# --- TestDevices_AddResourceUsage -------------------------------------------------------------------


def test_add_usage_takes_a_slot_and_the_slices_memory_and_cores() -> None:
    # HAMi pkg/device/hygon/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    before = GPUUsage(GPUInfo("dev-0"), used=0, usedmem=2000, usedcores=15)
    after = VENDOR.add_usage(before, GPUSlice("dev-0", 1024, 50, "DCU"))
    assert (after.used, after.usedmem, after.usedcores) == (1, 3024, 65)
    assert (before.used, before.usedmem, before.usedcores) == (0, 2000, 15)


def test_score_node_is_zero() -> None:
    devices = PodAllocation((ContainerAllocation((GPUSlice("a", 0, 0, "DCU"),)),))
    assert VENDOR.score_node({}, devices, [device("a")], "binpack") == 0.0


# --- build: the hygon section of device-config.yaml -------------------------------------------------

KF, KC = "hygon.memoryFactor", "hygon.resourceCountName"


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = hygon.build(load_device_config(None, _read("")))
    assert isinstance(vendor, hygon.Hygon)
    assert vendor.names == hygon.names(COUNT, MEM, CORES, memory_factor=1)


def test_build_reads_every_key_of_the_section() -> None:
    text = (
        "hygon:\n  resourceCountName: example.com/dcu\n  resourceMemoryName: example.com/dcu-mem\n"
        "  resourceCoreName: example.com/dcu-core\n  memoryFactor: 1024\n"
    )
    (vendor,) = hygon.build(parse_device_config(text, "dc.yaml"))
    names = vendor.names
    assert (names.count, names.memory, names.cores, names.memory_factor) == (
        "example.com/dcu", "example.com/dcu-mem", "example.com/dcu-core", 1024,
    )  # fmt: skip
    assert vendor.request(
        container(limits={"example.com/dcu": "1", "example.com/dcu-mem": "2"})
    ) == DeviceRequest(1, "DCU", 2048, 0, 100)


def test_build_fills_a_missing_key_with_the_charts_value() -> None:
    (vendor,) = hygon.build(parse_device_config("hygon:\n  memoryFactor: 2\n", "dc.yaml"))
    assert vendor.names == hygon.names(COUNT, MEM, CORES, memory_factor=2)


def test_build_empty_memory_and_core_names_read_no_such_resource() -> None:
    text = 'hygon:\n  resourceMemoryName: ""\n  resourceCoreName: ""\n'
    (vendor,) = hygon.build(parse_device_config(text, "dc.yaml"))
    assert vendor.names.resources == (COUNT,)
    assert vendor.request(container(limits={COUNT: "1", MEM: "16Gi"})) == DeviceRequest(1, "DCU", 0, 100, 100)


@pytest.mark.parametrize(
    ("text", "key", "line", "value"),
    [
        pytest.param("hygon:\n  memoryFactor: two\n", "hygon.memoryFactor", 2, "two", id="not an integer"),
        pytest.param("hygon:\n  memoryFactor: true\n", "hygon.memoryFactor", 2, "true", id="a boolean"),
        pytest.param("hygon:\n  memoryFactor: -1\n", "hygon.memoryFactor", 2, "-1", id="negative"),
        pytest.param("hygon:\n  memoryFactor: 2147483648\n", KF, 2, "2147483648", id="> int32"),
        pytest.param('nvidia: {}\nhygon:\n  resourceCountName: ""\n', KC, 3, "", id="empty"),
        pytest.param("hygon:\n  resourceCoreName: [a]\n", "hygon.resourceCoreName", 2, "a", id="a list"),
        pytest.param('hygon:\n  resourceCountName: " x"\n', "hygon.resourceCountName", 2, " x", id="spaces"),
    ],
)  # fmt: skip
def test_build_a_bad_value_raises_config_error_naming_file_key_and_line(
    text: str, key: str, line: int, value: str
) -> None:
    with pytest.raises(ConfigError) as err:
        hygon.build(load_device_config(Path("/etc/hami/dc.yaml"), _read(text)))
    assert (err.value.source, err.value.key, err.value.line) == ("/etc/hami/dc.yaml", key, line)
    assert value in (err.value.value or "")


def test_build_an_unknown_key_in_the_section_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        hygon.build(parse_device_config("hygon:\n  memoryFactr: 2\n", "dc.yaml"))
    assert (err.value.key, err.value.line) == ("hygon.memoryFactr", 2)
    assert 'did you mean "memoryFactor"' in str(err.value)
