"""hami_control.devices.biren: HAMi's Biren backend (pkg/device/biren/device.go, v2.10.0), its Go tests
(pkg/device/biren/device_test.go) transcribed case by case, plus property tests of the request reader,
the inventory decoder and Fit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import GPU_SCHEDULER_POLICY, decode_gpu_policy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import biren
from hami_control.devices.base import (
    INT32_MAX,
    Admission,
    DeviceRequest,
    FitContext,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
    as_int64,
)
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container, node

VENDOR = biren.Biren(biren.names())
CW = biren.COMMON_WORD
COUNT = "birentech.com/gpu"
GO = "HAMi pkg/device/biren/device_test.go"
NOW = datetime(2026, 3, 1, 12, 0, 0)


def device(
    uid: str, *, index: int = 0, used: int = 0, count: int = 1, health: bool = True, devmem: int = 0
) -> GPUUsage:
    """A Biren device with Go's DeviceUsage fields injected (Used, Count, Totalmem, Health)."""
    info = GPUInfo(uid, index=index, count=count, devmem=devmem, devcore=100, type=CW, health=health)
    return GPUUsage(info, used=used)


def req(nums: int, typ: str = CW, memreq: int = 0, pct: int = 0, cores: int = 0) -> DeviceRequest:
    return DeviceRequest(nums, typ, memreq=memreq, mem_percentage=pct, coresreq=cores)


def context(annotations: dict[str, str]) -> FitContext:
    """The pod of a Go Fit test: its annotations, and the policy chain HAMi reads from them."""
    policy = annotations.get(GPU_SCHEDULER_POLICY)
    chain = decode_gpu_policy(policy) if policy else (GPUPolicy.SPREAD,)
    return FitContext({"metadata": {"annotations": annotations}}, policy=chain)


# --- names ------------------------------------------------------------------------------------------


def test_names_are_hamis_keys() -> None:
    names = VENDOR.names
    assert names.common_word == "Biren"
    assert names.count == "birentech.com/gpu"
    assert (names.memory, names.cores) == ("", "")
    assert names.to_allocate == "hami.io/Biren-devices-to-allocate"
    assert names.allocated == "hami.io/Biren-devices-allocated"
    assert names.register == "hami.io/node-biren-register"
    assert names.handshake == "hami.io/node-handshake-biren"
    assert (names.use_uuid, names.nouse_uuid) == ("birentech.com/use-gpuuuid", "birentech.com/nouse-gpuuuid")
    assert (names.use_type, names.nouse_type) == ("", "")


# --- Test_MutateAdmission ---------------------------------------------------------------------------


def test_mutate_finds_a_container_with_the_count_in_limits_and_changes_nothing() -> None:
    # HAMi pkg/device/biren/device_test.go Test_MutateAdmission "set to resource limits"
    ctr = container(limits={COUNT: "1"})
    pod: dict[str, Any] = {"metadata": {}, "spec": {"containers": [ctr]}}
    before = json.dumps([ctr, pod])
    assert VENDOR.mutate(ctr, pod) == Admission(True, "")
    assert json.dumps([ctr, pod]) == before


def test_mutate_ignores_a_count_in_requests_only() -> None:
    # MutateAdmission reads ctr.Resources.Limits only
    assert VENDOR.mutate(container(requests={COUNT: "1"}), {}) == Admission(False, "")


# --- Test_GetNodeDevices ----------------------------------------------------------------------------


def test_node_devices_no_annotation_is_no_inventory() -> None:
    # HAMi pkg/device/biren/device_test.go Test_GetNodeDevices "no annotation" (Go: error, no devices)
    assert VENDOR.node_devices(node("n1", annotations={})) is None


def test_node_devices_decodes_json_and_forces_devcore_100() -> None:
    # HAMi pkg/device/biren/device_test.go Test_GetNodeDevices "exist biren device"
    text = '[{"id":"7-0","count":1,"devmem":32768,"type":"Biren","health":true,"devicepairscore":{}}]'
    got = VENDOR.node_devices(node("n1", annotations={"hami.io/node-biren-register": text}))
    assert got == (GPUInfo("7-0", index=0, count=1, devmem=32768, devcore=100, type="Biren", health=True),)


def test_node_devices_overrides_a_registered_devcore() -> None:
    text = '[{"id":"a","count":2,"devmem":100,"devcore":37,"type":"Biren","health":true}]'
    got = VENDOR.node_devices(node("n1", annotations={"hami.io/node-biren-register": text}))
    assert got is not None
    assert [d.devcore for d in got] == [100]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(":", id=f'{GO} Test_GetNodeDevices "no biren device"'),
        pytest.param("", id=f'{GO} Test_GetNodeDevices "node annotations not decode successfully"'),
    ],
)
def test_node_devices_that_are_not_json_raise_wire_format_error(text: str) -> None:
    # Go: json.Unmarshal fails, GetNodeDevices returns the error and no devices
    with pytest.raises(WireFormatError) as err:
        VENDOR.node_devices(node("n1", annotations={"hami.io/node-biren-register": text}))
    assert err.value.annotation == "hami.io/node-biren-register"


def test_node_devices_empty_list_is_no_devices() -> None:
    # Go: "no gpu found on node" (an error); here an empty inventory, as for every JSON vendor
    assert VENDOR.node_devices(node("n1", annotations={"hami.io/node-biren-register": "[]"})) == ()


# --- Test_CheckHealth -------------------------------------------------------------------------------
# The Go test writes its annotation under util.HandshakeAnnos["hami.io/node-handshake-biren"], a lookup by a
# key that is no common word, i.e. under "" (and CheckHealth reads "" too, devType being the resource
# name); the behaviour it checks is the handshake's, so the annotation is written under the real key.


def test_health_expired_request_without_allocatable_is_unhealthy() -> None:
    # HAMi pkg/device/biren/device_test.go Test_CheckHealth "Requesting state expired"
    n = node("n1", annotations={"hami.io/node-handshake-biren": "Requesting_2025-01-07 00:00:00"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(False, False)


def test_health_unknown_state_registers_and_requests_a_handshake() -> None:
    # HAMi pkg/device/biren/device_test.go Test_CheckHealth "Unknown state"
    n = node("n1", annotations={"hami.io/node-handshake-biren": "Unknown"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, True, "Requesting_2026-03-01 12:00:00")


def test_health_expired_request_with_allocatable_devices_stays_healthy() -> None:
    n = node(
        "n1",
        annotations={"hami.io/node-handshake-biren": "Requesting_2025-01-07 00:00:00"},
        allocatable={COUNT: "2"},
    )
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, False)


# --- Test_checkType ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("Biren", True, id=f'{GO} Test_checkType "the same type"'),
        pytest.param("test", False, id=f'{GO} Test_checkType "the different type"'),
        pytest.param("biren", False, id="exact, case-sensitive comparison"),
    ],
)
def test_type_allowed_compares_the_request_type_with_biren(request_type: str, allowed: bool) -> None:
    assert VENDOR.type_allowed({}, device("d"), req(1, typ=request_type)) is allowed


# --- Test_PatchAnnotations --------------------------------------------------------------------------


def test_pod_annotations_write_the_device_string_under_both_keys() -> None:
    # HAMi pkg/device/biren/device_test.go Test_PatchAnnotations "exist device"
    devices = PodAllocation((ContainerAllocation((GPUSlice("test1", 2048, 1, "Biren"),)),))
    got = VENDOR.pod_annotations({}, devices, node="n1", now=NOW.replace(tzinfo=UTC))
    assert got == {
        "hami.io/Biren-devices-to-allocate": "test1,Biren,2048,1:;",
        "hami.io/Biren-devices-allocated": "test1,Biren,2048,1:;",
    }


def test_pod_annotations_without_devices_write_nothing() -> None:
    # HAMi pkg/device/biren/device_test.go Test_PatchAnnotations "no device"
    assert VENDOR.pod_annotations({}, PodAllocation(), node="n1", now=NOW.replace(tzinfo=UTC)) == {}


# --- Test_GenerateResourceRequests ------------------------------------------------------------------

ONE = DeviceRequest(1, "Biren", memreq=0, mem_percentage=100, coresreq=0)


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(
            container(limits={}, requests={}),
            None,
            id=f'{GO} Test_GenerateResourceRequests "don\'t set to limits and request"',
        ),
        pytest.param(
            container(limits={COUNT: "1"}, requests={COUNT: "1"}),
            ONE,
            id=f'{GO} Test_GenerateResourceRequests "set to limits and request"',
        ),
        pytest.param(
            container(limits={COUNT: "1"}), ONE, id=f'{GO} Test_GenerateResourceRequests "only set to limits"'
        ),
        pytest.param(
            container(requests={COUNT: "1"}),
            ONE,
            id=f'{GO} Test_GenerateResourceRequests "only set to request"',
        ),
        pytest.param(
            container(limits={COUNT: "3"}, requests={COUNT: "1"}),
            DeviceRequest(3, "Biren", 0, 100, 0),
            id="limits win",
        ),
        pytest.param(container(limits={COUNT: "0"}), None, id="zero is no request"),
        pytest.param(container(limits={COUNT: "-2"}), None, id="negative is no request"),
        pytest.param(container(limits={COUNT: "1.5"}), None, id="a fraction is not AsInt64"),
        pytest.param(
            container(limits={COUNT: "1.5"}, requests={COUNT: "1"}),
            None,
            id="an unreadable limit does not fall back",
        ),
        pytest.param(
            container(limits={COUNT: "2000m"}), DeviceRequest(2, "Biren", 0, 100, 0), id="2000m is 2"
        ),
        pytest.param(container(limits={COUNT: "4294967297"}), ONE, id="Go's int32(n) wraps 2^32+1 to 1"),
        pytest.param(container(limits={COUNT: "2147483648"}), None, id="2^31 wraps negative"),
        pytest.param(container(limits={COUNT: "not-a-quantity"}), None, id="garbage"),
        pytest.param({"name": "c", "resources": "oops"}, None, id="malformed resources"),
    ],
)
def test_request_reads_the_count_as_go_does(ctr: dict[str, Any], want: DeviceRequest | None) -> None:
    assert VENDOR.request(ctr) == want


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.sampled_from(["limits", "requests"]))
def test_request_never_negative_for_any_int64_count(n: int, section: str) -> None:
    got = VENDOR.request({"resources": {section: {COUNT: str(n)}}})
    if as_int64(str(n)) is None:  # Go keeps it as an inf.Dec: AsInt64 false, no request
        assert got is None
        return
    if got is None:
        assert biren.go_int32(n) <= 0
    else:
        assert 0 < got.nums <= INT32_MAX
        assert got.nums == biren.go_int32(n)
        assert (got.type, got.memreq, got.mem_percentage, got.coresreq) == ("Biren", 0, 100, 0)


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.lists(st.integers())))
def test_request_never_raises_for_any_count_value(value: object) -> None:
    got = VENDOR.request({"resources": {"limits": {COUNT: value}}})
    assert got is None or got.nums > 0


# --- TestDevices_LockNode / TestDevices_ReleaseNodeLock -------------------------------------------------
# The Go tests lock and release through a fake client; here the lock is data (`names.lock`) taken by the
# binder when a regular container asks a device (`request()` not None), which is what each case decides.


def asks(pod: dict[str, Any]) -> bool:
    return any(VENDOR.request(c) is not None for c in pod.get("spec", {}).get("containers", []))


def test_lock_is_hamis_node_mutex() -> None:
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
        pytest.param({"spec": {}}, False, id=f'{GO} TestDevices_ReleaseNodeLock "Test with no containers"'),
        pytest.param(
            {"metadata": {"name": "nozerorr"}, "spec": {"containers": [container(requests={COUNT: "1"})]}},
            True,
            id=f'{GO} TestDevices_ReleaseNodeLock "Test with non-zero resource requests"',
        ),
    ],
)
def test_lock_is_taken_and_released_only_for_a_pod_asking_biren(pod: dict[str, Any], locks: bool) -> None:
    # LockNode: hasLock true iff a container asks; ReleaseNodeLock: the lock is removed iff one asks
    assert asks(pod) is locks


# --- TestDevices_Fit --------------------------------------------------------------------------------

FIT = f"{GO} TestDevices_Fit"
FIT_CASES = [
    pytest.param(
        [device("dev-0", index=0), device("dev-1", index=1)], req(1), {}, ["dev-1"], "",
        id=f'{FIT} "fit success"',
    ),
    pytest.param(
        [device("dev-0")], req(1, typ="OtherType", memreq=512, cores=50), {}, None, "1/1 CardTypeMismatch",
        id=f'{FIT} "fit fail: type mismatch"',
    ),
    pytest.param(
        [device("dev-1")], req(1), {"birentech.com/use-gpuuuid": "dev-0"}, None, "1/1 CardUuidMismatch",
        id=f'{FIT} "fit fail: user assign use uuid mismatch"',
    ),
    pytest.param(
        [device("dev-0")], req(1), {"birentech.com/nouse-gpuuuid": "dev-0"}, None, "1/1 CardUuidMismatch",
        id=f'{FIT} "fit fail: user assign no use uuid match"',
    ),
    pytest.param(
        [device("dev-0", used=1)], req(1), {}, None, "1/1 CardTimeSlicingExhausted",
        id=f'{FIT} "fit fail: card overused"',
    ),
    pytest.param(
        [device("dev-0")], req(2), {}, None, "1/1 AllocatedCardsInsufficientRequest",
        id=f'{FIT} "fit fail:  AllocatedCardsInsufficientRequest"',
    ),
    pytest.param(
        [device("dev-0", used=1, count=2)], req(1), {GPU_SCHEDULER_POLICY: "mutex"}, None,
        "1/1 ExclusiveDeviceAllocateConflict",
        id=f'{FIT} "mutex policy rejects used device"',
    ),
    pytest.param(
        [device("dev-0", count=100, devmem=1280), device("dev-1", index=1, count=100, devmem=1280)],
        req(3, memreq=512, cores=20), {}, None, "2/2 AllocatedCardsInsufficientRequest",
        id=f'{FIT} "fit fail: partial allocation AllocatedCardsInsufficientRequest for multiple cards"',
    ),
    pytest.param(
        [device("dev-0", health=False)], req(1), {}, None, "1/1 CardNotHealth",
        id=f'{FIT} "fit fail: CardNotHealth"',
    ),
]  # fmt: skip


@pytest.mark.parametrize(("devices", "request_", "annotations", "want_ids", "want_reason"), FIT_CASES)
def test_fit_picks_or_refuses_with_hamis_reason(
    devices: list[GPUUsage],
    request_: DeviceRequest,
    annotations: dict[str, str],
    want_ids: list[str] | None,
    want_reason: str,
) -> None:
    got = VENDOR.fit(devices, request_, context(annotations))
    if want_ids is None:
        assert isinstance(got, Unfit), got
        assert got.message == want_reason
    else:
        assert isinstance(got, Picked), got
        assert [s.uuid for s in got.slices] == want_ids


def test_fit_slices_take_no_memory_and_the_requests_cores() -> None:
    devices = [device("a", devmem=4096), device("b", devmem=4096)]
    got = VENDOR.fit(devices, req(2, pct=100, cores=7), context({}))
    assert got == Picked((GPUSlice("b", 0, 7, "Biren"), GPUSlice("a", 0, 7, "Biren")))


def test_fit_has_no_memory_or_core_check() -> None:
    full = GPUUsage(GPUInfo("a", count=4, devmem=100, devcore=100, type=CW, health=True), 1, 100, 100)
    got = VENDOR.fit([full], req(1, memreq=512, cores=100), context({}))
    assert isinstance(got, Picked)


def test_fit_rule_order_counts_the_first_broken_rule() -> None:
    # unhealthy and used up: health is checked first; mutex comes after the free slot
    devices = [device("a", used=1, health=False), device("b", used=1), device("c", used=1, count=2)]
    got = VENDOR.fit(devices, req(1), context({GPU_SCHEDULER_POLICY: "mutex"}))
    assert isinstance(got, Unfit)
    assert got.message == (
        "1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted, 1/3 ExclusiveDeviceAllocateConflict"
    )


def test_fit_on_no_devices_refuses_without_reasons() -> None:
    assert VENDOR.fit([], req(1), context({})) == Unfit({}, 0)


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 3)), min_size=0, max_size=8
    ),  # (health, used, count)
    st.integers(1, 6),
    st.booleans(),
)
def test_fit_picks_exactly_nums_free_devices_or_accounts_for_every_device(
    specs: list[tuple[bool, int, int]], nums: int, mutex: bool
) -> None:
    devices = [device(f"d{i}", index=i, used=u, count=c, health=h) for i, (h, u, c) in enumerate(specs)]
    annotations = {GPU_SCHEDULER_POLICY: "mutex"} if mutex else {}
    got = VENDOR.fit(devices, req(nums), context(annotations))
    by_id = {d.id: d for d in devices}
    if isinstance(got, Picked):
        ids = [s.uuid for s in got.slices]
        assert len(ids) == nums == len(set(ids))
        for uid in ids:
            d = by_id[uid]
            assert d.healthy and d.used < d.info.count and not (mutex and d.used > 0)
    else:
        assert sum(got.reasons.values()) == len(devices)
        assert got.cards == len(devices)


# --- TestDevices_AddResourceUsage -------------------------------------------------------------------


def test_add_usage_takes_a_slot_and_the_slices_memory_and_cores() -> None:
    # HAMi pkg/device/biren/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    before = GPUUsage(GPUInfo("dev-0"), used=1)
    after = VENDOR.add_usage(before, GPUSlice("dev-0", 0, 0, "Biren"))
    assert (after.used, after.usedmem, after.usedcores) == (2, 0, 0)


def test_score_node_is_zero() -> None:
    devices = PodAllocation((ContainerAllocation((GPUSlice("a", 0, 0, "Biren"),)),))
    assert VENDOR.score_node({}, devices, [device("a")], "binpack") == 0.0


# --- inventory decoding, any input ------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
DEVICE_KEYS = ["id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "custominfo"]
DEVICE_LIKE = st.dictionaries(st.sampled_from(DEVICE_KEYS), JSON_VALUES, max_size=8)


INVENTORY_TEXT = st.one_of(
    st.text(max_size=60), JSON_VALUES.map(json.dumps), st.lists(DEVICE_LIKE, max_size=3).map(json.dumps)
)


@given(INVENTORY_TEXT)
def test_node_devices_returns_devices_or_raises_wire_format_error(text: str) -> None:
    try:
        got = VENDOR.node_devices(node("n1", annotations={"hami.io/node-biren-register": text}))
    except WireFormatError:
        return
    assert got is not None
    assert all(isinstance(d, GPUInfo) and d.devcore == 100 for d in got)


def test_node_devices_non_string_annotation_raises_wire_format_error() -> None:
    with pytest.raises(WireFormatError):
        VENDOR.node_devices({"metadata": {"annotations": {"hami.io/node-biren-register": 5}}})


# --- build ------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = biren.build(parse_device_config("", "device-config.yaml"))
    assert isinstance(vendor, biren.Biren)
    assert vendor.names == biren.names("birentech.com/gpu")


def test_build_reads_resource_count_name() -> None:
    (vendor,) = biren.build(parse_device_config("biren:\n  resourceCountName: example.com/br\n", "dc.yaml"))
    assert vendor.names.count == "example.com/br"
    assert vendor.names.resources == ("example.com/br",)


@pytest.mark.parametrize(
    ("text", "key", "line", "reason"),
    [
        ("biren:\n  resourceCountName: [a]\n", "biren.resourceCountName", 2, "must be a string"),
        ('biren:\n  resourceCountName: ""\n', "biren.resourceCountName", 2, "must name the device count"),
        ("biren:\n  resourceCountNmae: x\n", "biren.resourceCountNmae", 2, "is not a known key here"),
    ],
)
def test_build_refuses_a_bad_value_naming_key_and_line(text: str, key: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        biren.build(parse_device_config(text, "dc.yaml"))
    assert (err.value.source, err.value.key, err.value.line) == ("dc.yaml", key, line)
    assert err.value.reason.startswith(reason)
