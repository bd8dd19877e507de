"""hami_control.devices.enflame: HAMi's two Enflame backends, whole GCUs (pkg/device/enflame/gcu.go) and
DRS partitions (pkg/device/enflame/device.go), v2.10.0; their Go tests (gcu_test.go, device_test.go)
transcribed case by case, plus property tests of the request readers and the DRS inventory decoder."""

from __future__ import annotations

import contextlib
import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import GPU_SCHEDULER_POLICY, decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import enflame
from hami_control.devices.base import (
    INT32_MAX,
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    custom_info,
    custom_text,
)
from hami_control.devices.config import load_device_config, parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container

GCU = enflame.Gcu(enflame.gcu_names())
DRS = enflame.Enflame(enflame.drs_names())
GCU_GO = "HAMi pkg/device/enflame/gcu_test.go"
DRS_GO = "HAMi pkg/device/enflame/device_test.go"
NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
NOW_NS = "1772366400123456000"
PROFILES = {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}
CAPACITY = (
    '{"devices":[{"index":"0","minor":"0","capacity":6}],'
    '"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}'
)


def context(annotations: dict[str, str] | None = None) -> FitContext:
    """The pod of a Go Fit test: its annotations, and the policy chain HAMi reads from them."""
    annotations = annotations or {}
    policy = annotations.get(GPU_SCHEDULER_POLICY)
    chain = decode_gpu_policy(policy) if policy else (GPUPolicy.SPREAD,)
    return FitContext({"metadata": {"annotations": annotations}}, policy=chain)


def gcu(uid: str, *, index: int = 0, used: int = 0, health: bool = True, type: str = "GCU") -> GPUUsage:
    """A GCU with Go's DeviceUsage fields injected (Count 1, Totalmem 100, Totalcore 100)."""
    info = GPUInfo(uid, index=index, count=1, devmem=100, devcore=100, type=type, health=health)
    return GPUUsage(info, used=used)


def drs(
    custom: dict[str, Any] | None = None,
    *,
    used: int = 0,
    count: int = 6,
    health: bool = True,
    devcore: int = 0,
    usedmem: int = 0,
    usedcores: int = 0,
    uid: str = "node-a-enflame-drs-0",
) -> GPUUsage:
    """The DRS device of the Go Fit tests (Count 6, Totalmem 40960, Totalcore unset) and its CustomInfo."""
    if custom is None:
        custom = {"minor": "0", "index": "0", "profiles": PROFILES}
    info = GPUInfo(
        uid, index=0, count=count, devmem=40960, devcore=devcore, type="Enflame", health=health,
        custom=custom_text(custom),
    )  # fmt: skip
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def drs_node(text: Any, name: str = "node-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {enflame.GCU_DRS_CAPACITY: text}}}


def gcu_id(test: str, case: str) -> str:
    """The test id of a case of gcu_test.go's TestGCUDevices_<test>."""
    return f'{GCU_GO} TestGCUDevices_{test} "{case}"'


def capacity_node(values: dict[str, Any], name: str = "testnode") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": values}}


# === GCU (gcu_test.go) ===================================================================================


def test_gcu_names_are_hamis_keys() -> None:
    # HAMi gcu_test.go TestGCUDevices_CommonWord, and the keys InitGCUDevice registers
    names = GCU.names
    assert (names.common_word, names.family, names.count) == ("GCU", "enflame", "enflame.com/gcu")
    assert (names.memory, names.cores, names.memory_factor) == ("", "", 0)
    assert names.to_allocate == "hami.io/enflame-gcu-devices-to-allocate"
    assert names.allocated == "hami.io/enflame-gcu-devices-allocated"
    assert (names.register, names.handshake, names.use_uuid, names.nouse_uuid) == ("", "", "", "")


def test_gcu_lock_and_release_take_no_node_lock_and_there_is_nothing_to_clean_up() -> None:
    # HAMi GCU LockNode / ReleaseNodeLock / NodeCleanUp (TestGCUDevices_NodeCleanUp) return nil
    assert GCU.names.lock is LockKind.NONE
    assert GCU.names.lock_annotation == ""
    assert GCU.names.handshake == ""


def test_gcu_build_reads_resource_name_gcu() -> None:
    # HAMi gcu_test.go TestInitGCUDevice "Test with valid config"
    text = "enflame:\n  resourceNameGCU: enflame.com/gcu\n"
    vendor, _ = enflame.build(parse_device_config(text, "dc.yaml"))
    assert isinstance(vendor, enflame.Gcu)
    assert vendor.names.count == "enflame.com/gcu"
    assert vendor.names.to_allocate == "hami.io/enflame-gcu-devices-to-allocate"
    assert vendor.names.allocated == "hami.io/enflame-gcu-devices-allocated"


@pytest.mark.parametrize(
    ("limits", "found"),
    [
        pytest.param(
            {GCU.names.count: "2"}, True, id=gcu_id("MutateAdmission", "GCU resource set to limits")
        ),
        pytest.param({}, False, id=gcu_id("MutateAdmission", "GCU resource not set")),
    ],
)
def test_gcu_mutate_finds_the_count_in_limits_and_changes_nothing(
    limits: dict[str, str], found: bool
) -> None:
    ctr = container(limits=limits)
    the_pod: dict[str, Any] = {}
    before = json.dumps([ctr, the_pod])
    assert GCU.mutate(ctr, the_pod) == Admission(found)
    assert json.dumps([ctr, the_pod]) == before


@pytest.mark.parametrize(
    ("values", "healthy"),
    [
        pytest.param({GCU.names.count: "2"}, True, id=gcu_id("CheckHealth", "Node with GCU resources")),
        pytest.param({}, False, id=gcu_id("CheckHealth", "Node without GCU resources")),
    ],
)
def test_gcu_health_follows_the_capacity_and_always_updates(values: dict[str, str], healthy: bool) -> None:
    assert GCU.names.health is HealthRule.CAPACITY
    assert GCU.node_health(capacity_node(values), NOW) == NodeHealth(healthy, True)


def test_gcu_node_devices_one_per_unit_of_capacity() -> None:
    # HAMi gcu_test.go TestGCUDevices_GetNodeDevices "Test with valid node"
    got = GCU.node_devices(capacity_node({"enflame.com/gcu": "2"}))
    assert got == tuple(
        GPUInfo(f"testnode-GCU-{i}", index=i, count=1, devmem=100, devcore=100, type="GCU", health=True)
        for i in range(2)
    )


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id=f'{GCU_GO} TestGCUDevices_GetNodeDevices "Test with missing resource"'),
        pytest.param({"enflame.com/gcu": "0"}, id="zero capacity"),
    ],
)
def test_gcu_node_devices_without_capacity_is_no_inventory(values: dict[str, str]) -> None:
    # HAMi: "device not found enflame.com/gcu" (an error, no devices)
    assert GCU.node_devices(capacity_node(values)) is None


@pytest.mark.parametrize("value", ["1.5", "many"])
def test_gcu_node_devices_non_whole_capacity_is_no_inventory(value: str) -> None:
    # HAMi: `count, ok := ...AsInt64(); if !ok` -> "device not found"
    assert GCU.node_devices(capacity_node({"enflame.com/gcu": value})) is None


def test_gcu_node_devices_negative_capacity_is_no_devices() -> None:
    assert GCU.node_devices(capacity_node({"enflame.com/gcu": "-1"})) == ()


def test_gcu_node_devices_too_many_raise_wire_format_error() -> None:
    with pytest.raises(WireFormatError) as err:
        GCU.node_devices(capacity_node({"enflame.com/gcu": "4096"}))
    assert err.value.annotation == "status.capacity[enflame.com/gcu]"


@given(count=st.integers(-(2**63), 2**63 - 1))
def test_gcu_node_devices_either_return_devices_or_raise_wire_format_error(count: int) -> None:
    try:
        got = GCU.node_devices(capacity_node({"enflame.com/gcu": str(count)}))
    except WireFormatError:
        return
    assert got is None or len(got) == max(count, 0)


def test_gcu_pod_annotations_with_devices_write_both_keys() -> None:
    # HAMi gcu_test.go TestGCUDevices_PatchAnnotations "With GCU devices"
    devices = PodAllocation((ContainerAllocation((GPUSlice("testnode-GCU-0", 0, 0, "GCU"),)),))
    assert GCU.pod_annotations({}, devices, node="testnode", now=NOW) == {
        "hami.io/enflame-gcu-devices-to-allocate": "testnode-GCU-0,GCU,0,0:;",
        "hami.io/enflame-gcu-devices-allocated": "testnode-GCU-0,GCU,0,0:;",
    }


def test_gcu_pod_annotations_without_devices_write_nothing() -> None:
    # HAMi gcu_test.go TestGCUDevices_PatchAnnotations "No devices"
    assert GCU.pod_annotations({}, PodAllocation(), node="testnode", now=NOW) == {}


GCU_REQUEST_CASES: list[tuple[str, dict[str, Any], DeviceRequest | None]] = [
    (
        "GCU resource set to limits",
        container(limits={"enflame.com/gcu": "3"}),
        DeviceRequest(3, "GCU", 100, 100, 100),
    ),
    (
        "GCU resource set to requests",
        container(requests={"enflame.com/gcu": "2"}),
        DeviceRequest(2, "GCU", 100, 100, 100),
    ),
    ("GCU resource not set", container(limits={}, requests={}), None),
]


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(c, w, id=f'{GCU_GO} TestGCUDevices_GenerateResourceRequests "{name}"')
        for name, c, w in GCU_REQUEST_CASES
    ],
)
def test_gcu_request_matches_hamis_container_device_request(
    ctr: dict[str, Any], want: DeviceRequest | None
) -> None:
    assert GCU.request(ctr) == want


@pytest.mark.parametrize(
    ("value", "nums"),
    [
        ("0", None),
        ("-2", None),
        ("1.5", None),
        ("4294967297", 1),
        ("2147483648", None),
        ("2147483647", INT32_MAX),
    ],
)
def test_gcu_request_count_is_gos_int32_of_the_quantity(value: str, nums: int | None) -> None:
    # Nums: int32(n) of AsInt64 (wrapping); HAMi drops a request with Nums <= 0
    got = GCU.request(container(limits={"enflame.com/gcu": value}))
    assert (got.nums if got else None) == nums


def whole(nums: int, typ: str = "GCU") -> DeviceRequest:
    """The request of the GCU Fit tests: Memreq 100, pct 100, Coresreq 100."""
    return DeviceRequest(nums, typ, 100, 100, 100)


GCU_FIT_CASES: list[tuple[str, list[GPUUsage], DeviceRequest, list[str] | str]] = [
    ("fit success", [gcu("dev-0"), gcu("dev-1", index=1)], whole(1), ["dev-1"]),
    ("fit fail: type mismatch", [gcu("dev-0")], whole(1, "OtherType"), "1/1 CardTypeMismatch"),
    (
        "fit fail: device already used",
        [gcu("dev-0", used=1)],
        whole(1),
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    ("fit fail: insufficient devices", [gcu("dev-0")], whole(2), "1/1 AllocatedCardsInsufficientRequest"),
    (
        "fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards",
        [gcu("dev-0"), gcu("dev-1", index=1)],
        whole(3),
        "2/2 AllocatedCardsInsufficientRequest",
    ),
    ("fit fail: CardNotHealth", [gcu("dev-0", health=False)], whole(1), "1/1 CardNotHealth"),
]


@pytest.mark.parametrize(
    ("devices", "request_", "want"),
    [pytest.param(d, r, w, id=f'{GCU_GO} TestGCUDevices_Fit "{name}"') for name, d, r, w in GCU_FIT_CASES],
)
def test_gcu_fit_picks_or_gives_hamis_reason(
    devices: list[GPUUsage], request_: DeviceRequest, want: list[str] | str
) -> None:
    got = GCU.fit(devices, request_, context())
    if isinstance(want, str):
        assert isinstance(got, Unfit)
        assert got.message == want
    else:
        assert isinstance(got, Picked)
        assert [s.uuid for s in got.slices] == want


def test_gcu_fit_records_the_requests_memory_and_cores_and_ignores_uuid_and_mutex() -> None:
    annotations = {GPU_SCHEDULER_POLICY: "mutex", "enflame.com/use-gpuuuid": "other"}
    got = GCU.fit([gcu("dev-0")], DeviceRequest(1, "GCU", 100, 100, 100), context(annotations))
    assert got == Picked((GPUSlice("dev-0", 100, 100, "GCU"),))


def test_gcu_add_usage_counts_one_task_its_memory_and_cores() -> None:
    # HAMi gcu_test.go TestGCUDevices_AddResourceUsage "test add resource usage"
    got = GCU.add_usage(gcu("dev-0"), GPUSlice("dev-0", 100, 50, "GCU"))
    assert (got.used, got.usedmem, got.usedcores) == (1, 100, 50)


@given(count=st.integers(-(2**63), 2**63 - 1))
def test_gcu_request_is_never_negative(count: int) -> None:
    got = GCU.request(container(limits={"enflame.com/gcu": str(count)}))
    assert got is None or 0 < got.nums <= INT32_MAX


# === DRS (device_test.go) ================================================================================


def test_drs_names_are_hamis_keys() -> None:
    names = DRS.names
    assert (names.common_word, names.family) == ("Enflame", "enflame")
    assert (names.count, names.memory, names.cores) == (
        "enflame.com/drs-gcu",
        "enflame.com/gcu-memory",
        "enflame.com/gcu-core",
    )
    assert names.to_allocate == ""  # InitEnflameDevice registers SupportDevices only
    assert names.allocated == "hami.io/enflame-vgpu-devices-allocated"
    assert names.register == "enflame.com/gcu-drs-capacity"
    assert (names.use_uuid, names.nouse_uuid) == ("enflame.com/use-gpuuuid", "enflame.com/nouse-gpuuuid")


def test_drs_lock_none_and_health_always() -> None:
    # HAMi EnflameDevices LockNode / ReleaseNodeLock return nil, CheckHealth (true, true)
    assert DRS.names.lock is LockKind.NONE
    assert DRS.names.lock_annotation == ""
    assert DRS.node_health({}, NOW) == NodeHealth(True, True)


# --- TestGetNodeDevices_DRSAnnotation -------------------------------------------------------------------


def test_drs_node_devices_from_the_capacity_annotation() -> None:
    # HAMi device_test.go TestGetNodeDevices_DRSAnnotation
    got = DRS.node_devices(drs_node(CAPACITY))
    assert got is not None and len(got) == 1
    (one,) = got
    assert (one.id, one.index, one.type, one.devmem, one.count, one.devcore, one.health) == (
        "node-a-enflame-drs-0", 0, "Enflame", 40960, 6, 100, True,
    )  # fmt: skip
    assert custom_info(one) == {"minor": "0", "index": "0", "profiles": PROFILES, "maxSlice": 6}


def test_drs_node_devices_without_annotation_is_no_inventory() -> None:
    # HAMi: "annotation not found enflame.com/gcu-drs-capacity"
    assert DRS.node_devices({"metadata": {"name": "node-a"}}) is None


def test_drs_node_devices_index_minor_and_memory_fallbacks() -> None:
    text = json.dumps(
        {
            "Devices": [{"index": "x", "capacity": "3"}, {"INDEX": "7", "minor": " 2 ", "capacity": 2.9}],
            "profiles": {"2g": "a", "4G.": "b", "bad": "c"},
        }
    )
    got = DRS.node_devices(drs_node(text, name="n"))
    assert got is not None
    # an index that is no number is the position; no minor is the index; no profile memory: maxSlice GB
    assert [(d.id, d.index, d.count, d.devmem) for d in got] == [
        ("n-enflame-drs-0", 0, 3, 4096),
        ("n-enflame-drs-7", 7, 2, 4096),
    ]
    assert [custom_info(d)["minor"] for d in got] == ["0", "2"]


# --- TestParseDRSCapacity_RejectsNaNAndInf (through the inventory) ---------------------------------------

PARSE_CAPACITY = f"{DRS_GO} TestParseDRSCapacity_RejectsNaNAndInf"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("NaN", id=f"{PARSE_CAPACITY} NaN (not JSON)"),
        pytest.param("Infinity", id=f"{PARSE_CAPACITY} +Inf (not JSON)"),
        pytest.param("1e300", id=f"{PARSE_CAPACITY} 1e300"),
        pytest.param("0", id="zero"),
        pytest.param("0.5", id="truncated to zero"),
        pytest.param('"-1"', id="negative string"),
        pytest.param('"six"', id="not a number"),
        pytest.param("true", id="boolean"),
        pytest.param("null", id="null"),
        pytest.param("2147483648", id="past int32"),
    ],
)
def test_drs_node_devices_refuse_a_capacity_that_is_not_positive(value: str) -> None:
    text = f'{{"devices":[{{"index":"0","capacity":{value}}}],"profiles":{{"1g.6gb":"0"}}}}'
    with pytest.raises(WireFormatError) as err:
        DRS.node_devices(drs_node(text))
    assert err.value.annotation == "enflame.com/gcu-drs-capacity"


@pytest.mark.parametrize(
    ("value", "count"),
    [
        pytest.param("42", 42, id=f"{PARSE_CAPACITY} float64(42)"),
        pytest.param('"2147483648"', INT32_MAX, id=f'{PARSE_CAPACITY} "2147483648"'),
        pytest.param("6.9", 6, id="a fraction is truncated"),
        pytest.param('" 5 "', 5, id="a string is trimmed"),
    ],
)
def test_drs_node_devices_read_a_capacity_as_hami_does(value: str, count: int) -> None:
    text = f'{{"devices":[{{"index":"0","capacity":{value}}}],"profiles":{{"1g.6gb":"0"}}}}'
    got = DRS.node_devices(drs_node(text))
    assert got is not None and got[0].count == count


ONE_PROFILE = {"1g.6gb": "0"}
BAD_INVENTORIES: list[tuple[str, Any, str]] = [
    ("no valid profile", {"devices": [{"index": "0", "capacity": 1}], "profiles": {"x": "0"}}, "profiles"),
    ("no device", {"devices": [], "profiles": ONE_PROFILE}, "devices"),
    ("numeric index", {"devices": [{"index": 0, "capacity": 1}], "profiles": ONE_PROFILE}, "index"),
    ("numeric profile id", {"devices": [{"capacity": 1}], "profiles": {"1g.6gb": 0}}, "id"),
    ("devices not a list", {"devices": {}, "profiles": ONE_PROFILE}, "devices"),
    ("negative index", {"devices": [{"index": "-1", "capacity": 1}], "profiles": ONE_PROFILE}, "index"),
    ("repeated index", {"devices": [{"index": "1", "capacity": 1}] * 2, "profiles": ONE_PROFILE}, "index"),
    ("memory past int32 MiB", {"devices": [{"capacity": 1}], "profiles": {"1g.2097152gb": "0"}}, "profiles"),
]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("", "", id="empty text"),
        pytest.param("[]", "", id="an array"),
        pytest.param("null", "profiles", id="null: no profile"),
        *(pytest.param(json.dumps(value), field, id=name) for name, value, field in BAD_INVENTORIES),
    ],
)
def test_drs_node_devices_raise_wire_format_error_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(WireFormatError) as err:
        DRS.node_devices(drs_node(text))
    assert err.value.annotation == "enflame.com/gcu-drs-capacity"
    assert err.value.field == field


def test_drs_node_devices_value_not_a_string_raises() -> None:
    with pytest.raises(WireFormatError):
        DRS.node_devices(drs_node(["not", "text"]))


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=8)
)
JSON_KEYS = st.sampled_from(["devices", "profiles", "index", "minor", "capacity", "1g.6gb", "x"])
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_KEYS, inner, max_size=4),
    max_leaves=12,
)


@given(value=JSON_VALUES)
def test_drs_node_devices_either_decode_or_raise_wire_format_error(value: Any) -> None:
    try:
        got = DRS.node_devices(drs_node(json.dumps(value)))
    except WireFormatError:
        return
    assert got and all(d.count > 0 and d.type == "Enflame" for d in got)


@given(text=st.text(max_size=60))
def test_drs_node_devices_of_any_text_decode_or_raise_wire_format_error(text: str) -> None:
    with contextlib.suppress(WireFormatError):
        DRS.node_devices(drs_node(text))


# --- Test_checkType ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("Enflame", True, id=f'{DRS_GO} Test_checkType "the same type"'),
        pytest.param("test123", False, id=f'{DRS_GO} Test_checkType "the different type"'),
        pytest.param("enflame", False, id="exact, case-sensitive comparison"),
    ],
)
def test_drs_type_allowed_compares_the_request_type_with_enflame(request_type: str, allowed: bool) -> None:
    assert DRS.type_allowed({}, drs(), DeviceRequest(1, request_type)) is allowed


# --- TestGenerateResourceRequests, TestGenerateResourceRequests_ByMemoryCore -----------------------------


def test_drs_request_by_slices() -> None:
    # HAMi device_test.go TestGenerateResourceRequests
    got = DRS.request(container(limits={"enflame.com/drs-gcu": "3"}))
    assert got == DeviceRequest(1, "Enflame", memreq=3, mem_percentage=enflame.MODE_DIRECT, coresreq=0)


def test_drs_request_by_memory_and_cores() -> None:
    # HAMi device_test.go TestGenerateResourceRequests_ByMemoryCore
    got = DRS.request(container(limits={"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"}))
    assert got == DeviceRequest(1, "Enflame", memreq=20480, mem_percentage=enflame.MODE_BY_SPEC, coresreq=40)


@pytest.mark.parametrize(
    ("resources", "want"),
    [
        ({}, None),
        ({"enflame.com/drs-gcu": "2147483648"}, None),
        ({"enflame.com/drs-gcu": "0", "enflame.com/gcu-core": "30"}, DeviceRequest(1, "Enflame", 0, -1, 30)),
        (
            {"enflame.com/drs-gcu": "1.5", "enflame.com/gcu-memory": "6"},
            DeviceRequest(1, "Enflame", 6, -1, 0),
        ),
        ({"enflame.com/gcu-memory": "1.5"}, DeviceRequest(1, "Enflame", 2, -1, 0)),  # Value() rounds up
        ({"enflame.com/gcu-memory": "2147483648"}, None),
        ({"enflame.com/gcu-core": "2147483648"}, None),
        ({"enflame.com/gcu-memory": "-5"}, DeviceRequest(1, "Enflame", 0, -1, 0)),
    ],
)
def test_drs_request_edges(resources: dict[str, str], want: DeviceRequest | None) -> None:
    # a drs-gcu value that is not a whole number > 0 falls through to memory / cores, as in HAMi
    assert DRS.request(container(limits=resources)) == want


def test_drs_request_reads_limits_then_requests() -> None:
    got = DRS.request(container(requests={"enflame.com/drs-gcu": "6"}))
    assert got == DeviceRequest(1, "Enflame", 6, 0, 0)


QUANTITIES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["0", "1", "16Gi", "1.5", "500m", "1e3", "abc", "", "-0"]),
)


@given(count=QUANTITIES, memory=QUANTITIES, cores=QUANTITIES, which=st.sets(st.sampled_from("dmc")))
def test_drs_request_is_never_negative(count: str, memory: str, cores: str, which: set[str]) -> None:
    resources = {
        name: value
        for key, name, value in (
            ("d", "enflame.com/drs-gcu", count),
            ("m", "enflame.com/gcu-memory", memory),
            ("c", "enflame.com/gcu-core", cores),
        )
        if key in which
    }
    got = DRS.request(container(limits=resources))
    if got is not None:
        assert got.nums == 1
        assert 0 <= got.memreq <= INT32_MAX
        assert 0 <= got.coresreq <= INT32_MAX
        assert got.mem_percentage in (enflame.MODE_DIRECT, enflame.MODE_BY_SPEC)


# --- TestMutateAdmission_ByMemoryCoreAPI and the other webhook rules -------------------------------------


def test_drs_mutate_by_memory_and_cores_is_found_and_copied_to_requests() -> None:
    # HAMi device_test.go TestMutateAdmission_ByMemoryCoreAPI
    ctr = container(limits={"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "50"})
    assert DRS.mutate(ctr, {}) == Admission(True)
    assert ctr["resources"]["requests"] == {
        "enflame.com/gcu-memory": "20480",
        "enflame.com/gcu-core": "50",
    }


def test_drs_mutate_copies_the_slice_count_to_limits() -> None:
    ctr = container(requests={"enflame.com/drs-gcu": "3"})
    assert DRS.mutate(ctr, {}) == Admission(True)
    assert ctr["resources"] == {
        "requests": {"enflame.com/drs-gcu": "3"},
        "limits": {"enflame.com/drs-gcu": "3"},
    }


CORE_RANGE = "enflame.com/gcu-core must be in range (0,100]"


def test_drs_mutate_without_enflame_resources_changes_nothing() -> None:
    ctr = container(limits={"cpu": "1"})
    before = json.dumps(ctr)
    assert DRS.mutate(ctr, {}) == Admission(False)
    assert json.dumps(ctr) == before


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"enflame.com/drs-gcu": "0"}, "enflame.com/drs-gcu must be greater than 0"),
        ({"enflame.com/drs-gcu": "-2"}, "enflame.com/drs-gcu must be greater than 0"),
        ({"enflame.com/gcu-memory": "0"}, "enflame.com/gcu-memory must be greater than 0"),
        ({"enflame.com/gcu-core": "0"}, CORE_RANGE),
        ({"enflame.com/gcu-core": "101"}, CORE_RANGE),
        ({"enflame.com/gcu-memory": "8", "enflame.com/gcu-core": "-1"}, CORE_RANGE),
    ],
)
def test_drs_mutate_refuses_with_hamis_texts(limits: dict[str, str], error: str) -> None:
    assert DRS.mutate(container(limits=limits), {}) == Admission(False, error)


def test_drs_mutate_keeps_both_sides_when_both_are_given() -> None:
    ctr = container(limits={"enflame.com/gcu-core": "100"}, requests={"enflame.com/gcu-core": "50"})
    assert DRS.mutate(ctr, {}) == Admission(True)
    assert ctr["resources"] == {
        "limits": {"enflame.com/gcu-core": "100"},
        "requests": {"enflame.com/gcu-core": "50"},
    }


@given(count=QUANTITIES, memory=QUANTITIES, cores=QUANTITIES)
def test_drs_mutate_never_crashes(count: str, memory: str, cores: str) -> None:
    limits = {"enflame.com/drs-gcu": count, "enflame.com/gcu-memory": memory, "enflame.com/gcu-core": cores}
    got = DRS.mutate(container(limits=limits), {})
    assert got.error in ("", "enflame.com/drs-gcu must be greater than 0")


# --- TestFit_* ---------------------------------------------------------------------------------------------


def test_drs_fit_selects_the_profile_of_the_requested_slices() -> None:
    # HAMi device_test.go TestFit_SelectProfileByRequest
    got = DRS.fit([drs()], DeviceRequest(1, "Enflame", memreq=3), context())
    assert isinstance(got, Picked)
    assert got.slices == (GPUSlice("node-a-enflame-drs-0", 20480, 50, "Enflame"),)
    assert got.custom[0]["profileName"] == "3g.20gb"
    assert got.custom[0]["profileID"] == "1"
    assert got.custom == (
        {"profileName": "3g.20gb", "profileID": "1", "minor": "0", "index": "0", "drsSlice": 3,
         "requestMem": 0, "requestCore": 0},
    )  # fmt: skip


def test_drs_fit_selects_the_smallest_profile_holding_memory_and_cores() -> None:
    # HAMi device_test.go TestFit_SelectProfileByMemoryCoreRequest (20480 MiB -> 20 GB, 40 % -> 3g = 50 %)
    request = DeviceRequest(1, "Enflame", memreq=20480, mem_percentage=enflame.MODE_BY_SPEC, coresreq=40)
    got = DRS.fit([drs()], request, context())
    assert isinstance(got, Picked)
    assert got.slices == (GPUSlice("node-a-enflame-drs-0", 20480, 50, "Enflame"),)
    assert (got.custom[0]["profileName"], got.custom[0]["profileID"]) == ("3g.20gb", "1")
    assert (got.custom[0]["requestMem"], got.custom[0]["requestCore"]) == (20, 40)


def test_drs_fit_without_the_requested_profile_is_mode_not_fit() -> None:
    # HAMi device_test.go TestFit_ProfileNotFound
    device = drs({"minor": "0", "index": "0", "profiles": {"1g.6gb": "0"}}, health=False)
    got = DRS.fit([device], DeviceRequest(1, "Enflame", memreq=3), context())
    assert got == Unfit({"ModeNotFit": 1}, 1)
    assert got.message == "1/1 ModeNotFit"


def test_drs_fit_mutex_rejects_a_used_device() -> None:
    # HAMi device_test.go TestFit_MutexRejectsUsedDevice
    got = DRS.fit(
        [drs(used=1, count=2)],
        DeviceRequest(1, "Enflame", memreq=3),
        context({GPU_SCHEDULER_POLICY: "mutex"}),
    )
    assert isinstance(got, Unfit) and got.message == "1/1 ExclusiveDeviceAllocateConflict"


def test_drs_fit_rejects_an_unhealthy_device() -> None:
    # HAMi device_test.go TestFit_UnhealthyDeviceRejected
    got = DRS.fit([drs(health=False)], DeviceRequest(1, "Enflame", memreq=3), context())
    assert isinstance(got, Unfit) and got.message == "1/1 CardNotHealth"


OVERSIZED = f"{DRS_GO} TestFit_OversizedProfileRejected"


@pytest.mark.parametrize(
    "custom",
    [
        pytest.param({"profiles": {"4294967299g.4294967299gb": "0"}}, id=f"{OVERSIZED} slices and memory"),
        pytest.param({"profiles": {"4294967299g.20gb": "0"}}, id=f"{OVERSIZED} slices past int32"),
        pytest.param({"profiles": {"2g.4294967299gb": "0"}}, id=f"{OVERSIZED} memory past int32 MiB"),
        pytest.param(
            {"maxSlice": "1", "profiles": {"2147483647g.20gb": "0"}}, id=f"{OVERSIZED} core percent"
        ),
    ],
)
def test_drs_fit_refuses_an_oversized_profile_as_mode_not_fit(custom: dict[str, Any]) -> None:
    request = DeviceRequest(1, "Enflame", memreq=3, mem_percentage=101)
    got = DRS.fit([drs({"minor": "0", "index": "0", **custom}, health=False)], request, context())
    assert got == Unfit({"ModeNotFit": 1}, 1)


@pytest.mark.parametrize(
    ("device", "annotations", "want"),
    [
        (drs(usedmem=30000), {}, "1/1 CardInsufficientMemory"),
        (drs(devcore=100, usedcores=60), {}, "1/1 CardInsufficientCore"),
        (drs(used=6), {}, "1/1 CardTimeSlicingExhausted"),
        (drs(), {"enflame.com/use-gpuuuid": "other"}, "1/1 CardUuidMismatch"),
        (drs(), {"enflame.com/nouse-gpuuuid": "node-a-enflame-drs-0"}, "1/1 CardUuidMismatch"),
    ],
)
def test_drs_fit_per_device_rules(device: GPUUsage, annotations: dict[str, str], want: str) -> None:
    got = DRS.fit([device], DeviceRequest(1, "Enflame", memreq=3), context(annotations))
    assert isinstance(got, Unfit) and got.message == want


def test_drs_fit_by_spec_reads_a_large_memory_as_mib_and_a_small_one_as_gb() -> None:
    # 80 > 2 x 40 GB: MiB, 1 GB -> 1g.6gb; 7 <= 80: GB -> 3g.20gb
    by_mib = DeviceRequest(1, "Enflame", memreq=81, mem_percentage=-1)
    by_gb = DeviceRequest(1, "Enflame", memreq=7, mem_percentage=-1)
    got = DRS.fit([drs()], by_mib, context())
    assert isinstance(got, Picked) and got.custom[0]["profileName"] == "1g.6gb"
    got = DRS.fit([drs()], by_gb, context())
    assert isinstance(got, Picked) and got.custom[0]["profileName"] == "3g.20gb"


def test_drs_fit_by_spec_past_every_profile_is_mode_not_fit() -> None:
    got = DRS.fit(
        [drs(), drs(uid="b")], DeviceRequest(1, "Enflame", coresreq=101, mem_percentage=-1), context()
    )
    assert got == Unfit({"ModeNotFit": 1}, 2)


def test_drs_fit_walks_from_the_last_device() -> None:
    got = DRS.fit([drs(uid="a"), drs(uid="b")], DeviceRequest(1, "Enflame", memreq=1), context())
    assert isinstance(got, Picked) and got.slices[0].uuid == "b"


# --- AddResourceUsage ------------------------------------------------------------------------------------


def test_drs_add_usage_grows_used_by_the_slices_of_the_profile() -> None:
    device = drs()
    got = DRS.fit([device], DeviceRequest(1, "Enflame", memreq=3), context())
    assert isinstance(got, Picked)
    after = DRS.add_usage(device, got.slices[0])
    assert (after.used, after.usedmem, after.usedcores) == (3, 20480, 50)


def test_drs_add_usage_clamps_on_overflow() -> None:
    # HAMi device_test.go TestAddResourceUsage_ClampsOnOverflow (drsSlice MaxInt32, twice)
    device = drs({"profiles": {"2147483647g.1gb": "0"}})
    piece = GPUSlice(device.id, 1024, 100, "Enflame")
    once = DRS.add_usage(device, piece)
    assert once.used == INT32_MAX
    assert DRS.add_usage(once, piece).used == INT32_MAX


def test_drs_add_usage_clamps_an_oversized_slice() -> None:
    # HAMi device_test.go TestAddResourceUsage_ClampsOversizedSliceString (drsSlice "2147483648")
    device = drs({"profiles": {"2147483648g.1gb": "0"}})
    assert DRS.add_usage(device, GPUSlice(device.id, 1024, 100, "Enflame")).used == INT32_MAX


def test_drs_add_usage_of_an_unknown_slice_counts_one() -> None:
    # HAMi: drsSlice missing -> 1
    got = DRS.add_usage(drs(), GPUSlice("node-a-enflame-drs-0", 1000, 7, "Enflame"))
    assert (got.used, got.usedmem, got.usedcores) == (1, 1000, 7)


# --- TestClampToInt32, TestReadCustomInfoInt_RejectsNaNAndInf ---------------------------------------------


def test_clamp_int32() -> None:
    # HAMi device_test.go TestClampToInt32
    assert enflame.clamp_int32(5) == 5
    assert enflame.clamp_int32(2**63 - 1) == INT32_MAX
    assert enflame.clamp_int32(-(2**63)) == -(2**31)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param(math.nan, 0, id=f"{DRS_GO} TestReadCustomInfoInt_RejectsNaNAndInf NaN"),
        pytest.param(-math.inf, 0, id=f"{DRS_GO} TestReadCustomInfoInt_RejectsNaNAndInf -Inf"),
        pytest.param(1e300, 0, id=f"{DRS_GO} TestReadCustomInfoInt_RejectsNaNAndInf 1e300"),
        pytest.param(7.0, 7, id=f"{DRS_GO} TestReadCustomInfoInt_RejectsNaNAndInf float64(7)"),
        pytest.param("7", 7, id=f'{DRS_GO} TestReadCustomInfoInt_RejectsNaNAndInf "7"'),
        pytest.param(True, 0, id="a boolean"),
        pytest.param(" 9 ", 9, id="a string is trimmed"),
    ],
)
def test_custom_int_reads_like_hami(value: Any, want: int) -> None:
    assert enflame.custom_int({"k": value}, "k") == want
    assert enflame.custom_int({}, "k") == 0


# --- TestPatchAnnotations_DRSFields ---------------------------------------------------------------------


def test_drs_pod_annotations_write_every_drs_field() -> None:
    # HAMi device_test.go TestPatchAnnotations_DRSFields
    the_pod = {"spec": {"containers": [{"name": "pod-gcu-example1"}]}}
    devices = PodAllocation((ContainerAllocation((GPUSlice("node-a-enflame-drs-0", 20480, 50, "Enflame"),)),))
    record = {"minor": "0", "index": "0", "profileName": "3g.20gb", "profileID": "1", "drsSlice": 3}
    got = DRS.pod_annotations(the_pod, devices, node="node-a", now=NOW, custom=((record,),))
    assert got == {
        "hami.io/enflame-vgpu-devices-allocated": "node-a-enflame-drs-0,Enflame,20480,50:;",
        "enflame.com/gcu-assigned": "false",
        "enflame.com/gcu-assigned-time": NOW_NS,
        "enflame.com/gcu-assigned-index": "0",
        "enflame.com/gcu-assigned-id": "0",
        "enflame.com/gcu-assigned-minor": "0",
        "enflame.com/gcu-request-size": "3",
        "assigned-containers": '{"pod-gcu-example1":{"allocated":false,"request":3,"profileID":"1",'
        '"profileName":"3g.20gb"}}',
    }
    assigned = json.loads(got["assigned-containers"])
    assert assigned["pod-gcu-example1"] == {
        "allocated": False, "request": 3, "profileID": "1", "profileName": "3g.20gb",
    }  # fmt: skip


def test_drs_pod_annotations_first_slice_wins_and_names_come_from_init_then_regular_containers() -> None:
    the_pod = {"spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "b"}, {"name": "a"}]}}
    devices = PodAllocation(
        (
            ContainerAllocation(),
            ContainerAllocation((GPUSlice("n-enflame-drs-2", 6144, 17, "Enflame"),)),
            ContainerAllocation((GPUSlice("n-enflame-drs-1", 20480, 50, "Enflame"),)),
            ContainerAllocation((GPUSlice("n-enflame-drs-0", 6144, 17, "Enflame"),)),
        )
    )
    custom = (
        (),
        ({"index": "2", "minor": "5", "profileName": "1g.6gb", "profileID": "0", "drsSlice": 1},),
        ({"index": "1", "minor": "4", "profileName": "3g.20gb", "profileID": "1", "drsSlice": 3},),
        (),
    )
    got = DRS.pod_annotations(the_pod, devices, node="n", now=NOW, custom=custom)
    assert (got["enflame.com/gcu-assigned-index"], got["enflame.com/gcu-assigned-minor"]) == ("2", "5")
    assert got["enflame.com/gcu-request-size"] == "1"
    assert got["assigned-containers"] == (
        '{"a":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"},'
        '"b":{"allocated":false,"request":1,"profileID":"0","profileName":"1g.6gb"},'
        '"container-3":{"allocated":false,"request":1}}'
    )


def test_drs_pod_annotations_without_fit_records_ask_one_slice() -> None:
    devices = PodAllocation((ContainerAllocation((GPUSlice("n-enflame-drs-0", 6144, 17, "Enflame"),)),))
    got = DRS.pod_annotations({"spec": {"containers": [{"name": "c<1>"}]}}, devices, node="n", now=NOW)
    assert "enflame.com/gcu-assigned-index" not in got and "enflame.com/gcu-assigned-minor" not in got
    assert got["enflame.com/gcu-request-size"] == "1"
    assert got["assigned-containers"] == '{"c\\u003c1\\u003e":{"allocated":false,"request":1}}'


def test_drs_pod_annotations_without_devices_write_nothing() -> None:
    assert DRS.pod_annotations({}, PodAllocation((ContainerAllocation(),)), node="n", now=NOW) == {}


# --- build -------------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults_gives_gcu_then_drs() -> None:
    gcu_vendor, drs_vendor = enflame.build(load_device_config(None, lambda _path: ""))
    assert isinstance(gcu_vendor, enflame.Gcu) and isinstance(drs_vendor, enflame.Enflame)
    assert gcu_vendor.names == enflame.gcu_names()
    assert drs_vendor.names == enflame.drs_names()


def test_build_empty_drs_names_fall_back_to_the_legacy_vgcu_name_then_the_defaults() -> None:
    text = (
        'enflame:\n  resourceNameGCU: a.com/gcu\n  resourceNameDRSGCU: ""\n  resourceNameVGCU: a.com/vgcu\n'
    )
    _, drs_vendor = enflame.build(parse_device_config(text, "dc.yaml"))
    assert drs_vendor.names.count == "a.com/vgcu"
    assert (drs_vendor.names.memory, drs_vendor.names.cores) == (
        "enflame.com/gcu-memory",
        "enflame.com/gcu-core",
    )
    text = (
        'enflame:\n  resourceNameDRSGCU: ""\n  resourceNameGCUMemory: ""\n  resourceNameVGCUPercentage: x\n'
    )
    gcu_vendor, drs_vendor = enflame.build(parse_device_config(text, "dc.yaml"))
    assert (gcu_vendor.names.count, drs_vendor.names.count) == ("enflame.com/gcu", "enflame.com/drs-gcu")
    assert drs_vendor.names.memory == "enflame.com/gcu-memory"


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("enflame:\n  resourceNameGCU: a.com/g\n  resourceNameGCUCore: {a: 1}\n", "resourceNameGCUCore", 3),
        ('enflame:\n  resourceNameGCU: ""\n', "resourceNameGCU", 2),
        ("enflame:\n  resourceNameGCUMemroy: x\n", "resourceNameGCUMemroy", 2),
    ],
)
def test_build_refuses_a_bad_value_naming_key_and_line(text: str, key: str, line: int) -> None:
    with pytest.raises(ConfigError) as err:
        enflame.build(parse_device_config(text, "dc.yaml"))
    assert err.value.key == f"enflame.{key}"
    assert err.value.line == line
    assert f"dc.yaml line {line}" in str(err.value)
