"""hami_control.devices.vastai: HAMi's Vastai backend (pkg/device/vastai/device.go, v2.10.0), its Go tests
(pkg/device/vastai/device_test.go) transcribed case by case, die mode (AIC grouping, the mutex rule on
busy cards, ScoreNode), and property tests of the request reader, the inventory decoder and Fit."""

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
from hami_control.devices import vastai
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
    custom_text,
)
from hami_control.devices.biren import go_int32
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container, node

VENDOR = vastai.Vastai(vastai.names())
CW = vastai.COMMON_WORD
COUNT = "vastaitech.com/va"
REGISTER = "hami.io/node-va-register"
GO = "HAMi pkg/device/vastai/device_test.go"
FIT = f"{GO} TestDevices_Fit"
BEST = f"{GO} TestComputeBestCombination"
NOW = datetime(2026, 3, 1, 12, 0, 0)
MUTEX = {GPU_SCHEDULER_POLICY: "mutex"}


def device(
    uid: str,
    *,
    index: int = 0,
    used: int = 0,
    count: int = 1,
    health: bool = True,
    devmem: int = 0,
    custom: dict[str, Any] | None = None,
) -> GPUUsage:
    """A Vastai device with Go's DeviceUsage fields injected (Used, Count, Totalmem, Health, CustomInfo)."""
    info = GPUInfo(
        uid,
        index=index,
        count=count,
        devmem=devmem,
        devcore=100,
        type=CW,
        health=health,
        custom=custom_text(custom),
    )
    return GPUUsage(info, used=used)


def die(uid: str, aic: Any, *, index: int = 0, used: int = 0, count: int = 1) -> GPUUsage:
    """A die of card `aic` (custominfo {"DeviceStrategy": "die", "AIC": aic})."""
    return device(uid, index=index, used=used, count=count, custom={"DeviceStrategy": "die", "AIC": aic})


def req(nums: int, typ: str = CW, memreq: int = 0, pct: int = 0, cores: int = 0) -> DeviceRequest:
    return DeviceRequest(nums, typ, memreq=memreq, mem_percentage=pct, coresreq=cores)


def context(annotations: dict[str, str]) -> FitContext:
    """The pod of a Go Fit test: its annotations, and the policy chain HAMi reads from them."""
    policy = annotations.get(GPU_SCHEDULER_POLICY)
    chain = decode_gpu_policy(policy) if policy else (GPUPolicy.SPREAD,)
    return FitContext({"metadata": {"annotations": annotations}}, policy=chain)


def ids(result: Picked | Unfit) -> list[str]:
    assert isinstance(result, Picked), result
    return [s.uuid for s in result.slices]


def allocation(*containers: tuple[str, ...]) -> PodAllocation:
    return PodAllocation(
        tuple(ContainerAllocation(tuple(GPUSlice(u, 0, 0, CW) for u in c)) for c in containers)
    )


# --- names ------------------------------------------------------------------------------------------


def test_names_are_hamis_keys() -> None:
    names = VENDOR.names
    assert names.common_word == "Vastai"
    assert names.count == "vastaitech.com/va"
    assert (names.memory, names.cores) == ("", "")
    assert names.to_allocate == "hami.io/Vastai-devices-to-allocate"
    assert names.allocated == "hami.io/Vastai-devices-allocated"
    assert names.register == "hami.io/node-va-register"
    assert names.handshake == "hami.io/node-handshake-va"
    assert (names.use_uuid, names.nouse_uuid) == (
        "vastaitech.com/use-gpuuuid",
        "vastaitech.com/nouse-gpuuuid",
    )
    assert (names.use_type, names.nouse_type) == ("", "")


# --- Test_MutateAdmission ---------------------------------------------------------------------------


def test_mutate_finds_a_container_with_the_count_in_limits_and_changes_nothing() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_MutateAdmission "set to resource limits"
    ctr = container(limits={COUNT: "1"})
    pod: dict[str, Any] = {"metadata": {}, "spec": {"containers": [ctr]}}
    before = json.dumps([ctr, pod])
    assert VENDOR.mutate(ctr, pod) == Admission(True, "")
    assert json.dumps([ctr, pod]) == before


def test_mutate_ignores_a_count_in_requests_only() -> None:
    assert VENDOR.mutate(container(requests={COUNT: "1"}), {}) == Admission(False, "")


# --- Test_GetNodeDevices ----------------------------------------------------------------------------


def test_node_devices_no_annotation_is_no_inventory() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_GetNodeDevices "no annotation" (Go: error, no devices)
    assert VENDOR.node_devices(node("n1", annotations={})) is None


def test_node_devices_decodes_json_and_forces_devcore_100() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_GetNodeDevices "exist vastai device"
    text = '[{"id":"7-0","count":1,"devmem":32768,"type":"Vastai","health":true,"devicepairscore":{}}]'
    got = VENDOR.node_devices(node("n1", annotations={REGISTER: text}))
    assert got == (GPUInfo("7-0", index=0, count=1, devmem=32768, devcore=100, type="Vastai", health=True),)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(":", id=f'{GO} Test_GetNodeDevices "no vasta device"'),
        pytest.param("", id=f'{GO} Test_GetNodeDevices "node annotations not decode successfully"'),
    ],
)
def test_node_devices_that_are_not_json_raise_wire_format_error(text: str) -> None:
    # Go: json.Unmarshal fails, GetNodeDevices returns the error and no devices
    with pytest.raises(WireFormatError) as err:
        VENDOR.node_devices(node("n1", annotations={REGISTER: text}))
    assert err.value.annotation == REGISTER


def test_node_devices_keep_the_die_custominfo() -> None:
    text = json.dumps(
        [
            {"id": "d0", "count": 1, "devcore": 7, "type": "Vastai", "health": True,
             "custominfo": {"DeviceStrategy": "die", "AIC": "0", "Die": 3}},
        ]
    )  # fmt: skip
    (got,) = VENDOR.node_devices(node("n1", annotations={REGISTER: text})) or ()
    assert got.devcore == 100
    assert json.loads(got.custom) == {"AIC": "0", "DeviceStrategy": "die", "Die": 3.0}


def test_node_devices_empty_list_is_no_devices() -> None:
    assert VENDOR.node_devices(node("n1", annotations={REGISTER: "[]"})) == ()


# --- Test_CheckHealth -------------------------------------------------------------------------------
# The Go test writes its annotation under util.HandshakeAnnos["hami.io/node-handshake-va"], a lookup by a
# key that is no common word, i.e. under "" (and CheckHealth reads "" too, devType being the resource
# name); the behaviour it checks is the handshake's, so the annotation is written under the real key.


def test_health_expired_request_without_allocatable_is_unhealthy() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_CheckHealth "Requesting state expired"
    n = node("n1", annotations={"hami.io/node-handshake-va": "Requesting_2025-01-07 00:00:00"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(False, False)


def test_health_unknown_state_registers_and_requests_a_handshake() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_CheckHealth "Unknown state"
    n = node("n1", annotations={"hami.io/node-handshake-va": "Unknown"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, True, "Requesting_2026-03-01 12:00:00")


def test_health_recent_request_is_awaited() -> None:
    n = node("n1", annotations={"hami.io/node-handshake-va": "Requesting_2026-03-01 11:59:30"})
    assert VENDOR.node_health(n, NOW) == NodeHealth(True, False)


# --- Test_checkType ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_type", "allowed"),
    [
        pytest.param("Vastai", True, id=f'{GO} Test_checkType "the same type"'),
        pytest.param("test", False, id=f'{GO} Test_checkType "the different type"'),
        pytest.param("VASTAI", False, id="exact, case-sensitive comparison"),
    ],
)
def test_type_allowed_compares_the_request_type_with_vastai(request_type: str, allowed: bool) -> None:
    assert VENDOR.type_allowed({}, device("d"), req(1, typ=request_type)) is allowed


# --- Test_PatchAnnotations --------------------------------------------------------------------------


def test_pod_annotations_write_the_device_string_under_both_keys() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_PatchAnnotations "exist device"
    devices = PodAllocation((ContainerAllocation((GPUSlice("test1", 2048, 1, "Vastai"),)),))
    got = VENDOR.pod_annotations({}, devices, node="n1", now=NOW.replace(tzinfo=UTC))
    assert got == {
        "hami.io/Vastai-devices-to-allocate": "test1,Vastai,2048,1:;",
        "hami.io/Vastai-devices-allocated": "test1,Vastai,2048,1:;",
    }


def test_pod_annotations_without_devices_write_nothing() -> None:
    # HAMi pkg/device/vastai/device_test.go Test_PatchAnnotations "no device"
    assert VENDOR.pod_annotations({}, PodAllocation(), node="n1", now=NOW.replace(tzinfo=UTC)) == {}


# --- Test_GenerateResourceRequests ------------------------------------------------------------------

ONE = DeviceRequest(1, "Vastai", memreq=0, mem_percentage=100, coresreq=0)
GEN = f"{GO} Test_GenerateResourceRequests"


@pytest.mark.parametrize(
    ("ctr", "want"),
    [
        pytest.param(container(limits={}, requests={}), None, id=f'{GEN} "don\'t set to limits and request"'),
        pytest.param(
            container(limits={COUNT: "1"}, requests={COUNT: "1"}),
            ONE,
            id=f'{GEN} "set to limits and request"',
        ),
        pytest.param(container(limits={COUNT: "1"}), ONE, id=f'{GEN} "only set to limits"'),
        pytest.param(container(requests={COUNT: "1"}), ONE, id=f'{GEN} "only set to request"'),
        pytest.param(container(limits={COUNT: "4"}), DeviceRequest(4, "Vastai", 0, 100, 0), id="four dies"),
        pytest.param(container(limits={COUNT: "0"}), None, id="zero is no request"),
        pytest.param(container(limits={COUNT: "-1"}), None, id="negative is no request"),
        pytest.param(container(limits={COUNT: "0.5"}), None, id="a fraction is not AsInt64"),
        pytest.param(container(limits={COUNT: "4294967297"}), ONE, id="Go's int32(n) wraps 2^32+1 to 1"),
        pytest.param(container(limits={"vastaitech.com/va-other": "1"}), None, id="another resource"),
        pytest.param({"name": "c"}, None, id="no resources"),
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
        assert go_int32(n) <= 0
    else:
        assert 0 < got.nums <= INT32_MAX
        assert got.nums == go_int32(n)
        assert (got.type, got.memreq, got.mem_percentage, got.coresreq) == ("Vastai", 0, 100, 0)


@given(
    st.one_of(
        st.text(max_size=30), st.integers(), st.floats(), st.none(), st.dictionaries(st.text(), st.text())
    )
)
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
def test_lock_is_taken_and_released_only_for_a_pod_asking_vastai(pod: dict[str, Any], locks: bool) -> None:
    # LockNode: hasLock true iff a container asks; ReleaseNodeLock: the lock is removed iff one asks
    assert asks(pod) is locks


# --- TestDevices_Fit --------------------------------------------------------------------------------

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
        [device("dev-1")], req(1), {"vastaitech.com/use-gpuuuid": "dev-0"}, None, "1/1 CardUuidMismatch",
        id=f'{FIT} "fit fail: user assign use uuid mismatch"',
    ),
    pytest.param(
        [device("dev-0")], req(1), {"vastaitech.com/nouse-gpuuuid": "dev-0"}, None, "1/1 CardUuidMismatch",
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
        [device("dev-0", used=1, count=2)], req(1), MUTEX, None, "1/1 ExclusiveDeviceAllocateConflict",
        id=f'{FIT} "mutex policy rejects used device"',
    ),
    pytest.param(
        [die("dev-0", "1", used=1, count=2), die("dev-1", "1", index=1), die("dev-2", "2", index=2)],
        req(1), MUTEX, ["dev-2"], "",
        id=f'{FIT} "mutex die mode rejects idle die on occupied card, picks die on free card"',
    ),
    pytest.param(
        [die("dev-0", "1", used=1, count=2), die("dev-1", "1", index=1)],
        req(1), MUTEX, None, "2/2 ExclusiveDeviceAllocateConflict",
        id=f'{FIT} "mutex die mode rejects all idle dies on an occupied card"',
    ),
    pytest.param(
        [device("dev-0", count=100, devmem=1280), device("dev-1", index=1, count=100, devmem=1280)],
        req(3, memreq=512, cores=20), {}, None, "2/2 AllocatedCardsInsufficientRequest",
        id=f'{FIT} "fit fail: partial allocation AllocatedCardsInsufficientRequest"',
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
        assert ids(got) == want_ids


def test_fit_slices_take_no_memory_the_requests_cores_and_type() -> None:
    got = VENDOR.fit([die("a", "0"), die("b", "0", index=1)], req(2, pct=100, cores=3), context({}))
    assert got == Picked((GPUSlice("b", 0, 3, "Vastai"), GPUSlice("a", 0, 3, "Vastai")))


# --- die mode ---------------------------------------------------------------------------------------


def test_die_mode_is_decided_by_the_first_device_only() -> None:
    assert vastai.is_die_mode([die("a", "0"), device("b")])
    assert not vastai.is_die_mode([device("b"), die("a", "0")])
    assert not vastai.is_die_mode([device("c", custom={"DeviceStrategy": "card", "AIC": "0"})])
    assert not vastai.is_die_mode([device("c", custom={"DeviceStrategy": 1.0})])
    assert not vastai.is_die_mode([])


def test_die_mode_one_device_takes_the_first_candidate_of_the_walk() -> None:
    devices = [die("a0", "A"), die("a1", "A", index=1), die("b0", "B", index=2)]
    assert ids(VENDOR.fit(devices, req(1), context({}))) == ["b0"]


def test_die_mode_several_devices_take_the_biggest_card_first() -> None:
    # walk order: b0, a2, a1, a0 -> groups B(1), A(3): A first, in walk order
    devices = [die("a0", "A"), die("a1", "A", index=1), die("a2", "A", index=2), die("b0", "B", index=3)]
    assert ids(VENDOR.fit(devices, req(2), context({}))) == ["a2", "a1"]


def test_die_mode_equal_cards_come_in_walk_order_deterministically() -> None:
    # Go ranges over a map here (random among equal groups); ours: the group met first in the walk
    devices = [die("a0", "A"), die("a1", "A", index=1), die("b0", "B", index=2), die("b1", "B", index=3)]
    assert ids(VENDOR.fit(devices, req(2), context({}))) == ["b1", "b0"]
    assert ids(VENDOR.fit(devices, req(3), context({}))) == ["b1", "b0", "a1"]


def test_die_mode_exactly_nums_candidates_are_taken_as_walked() -> None:
    devices = [die("a0", "A"), die("b0", "B", index=1), die("a1", "A", index=2)]
    assert ids(VENDOR.fit(devices, req(3), context({}))) == ["a1", "b0", "a0"]


def test_die_mode_without_mutex_allows_idle_dies_on_a_busy_card() -> None:
    devices = [die("a0", "A", used=1), die("a1", "A", index=1)]
    assert ids(VENDOR.fit(devices, req(1), context({}))) == ["a1"]


def test_die_mode_mutex_refuses_busy_dies_too() -> None:
    devices = [die("a0", "A", used=1, count=4), die("b0", "B", index=1), die("b1", "B", index=2)]
    assert ids(VENDOR.fit(devices, req(2), context(MUTEX))) == ["b1", "b0"]


def test_die_mode_short_walk_counts_found_dies_as_insufficient() -> None:
    devices = [die("a0", "A", used=1, count=2), die("b0", "B", index=1)]
    got = VENDOR.fit(devices, req(2), context(MUTEX))
    assert isinstance(got, Unfit)
    assert got.message == "1/2 AllocatedCardsInsufficientRequest, 1/2 ExclusiveDeviceAllocateConflict"


def test_die_mode_drops_candidates_without_an_aic_and_still_fits_as_go_does() -> None:
    # computeBestCombination keeps only dies with a string AIC; Go reports the fit with fewer devices
    devices = [die("a0", "A"), device("x", index=1, custom={"DeviceStrategy": "die"}), die("n", 7.0, index=2)]
    assert ids(VENDOR.fit(devices, req(2), context({}))) == ["a0"]


def test_die_mode_from_a_registered_inventory() -> None:
    text = json.dumps(
        [
            {"id": f"va-{i}", "index": i, "count": 1, "devmem": 16384, "type": "Vastai", "health": True,
             "custominfo": {"DeviceStrategy": "die", "AIC": str(i // 2)}}
            for i in range(4)
        ]
    )  # fmt: skip
    infos = VENDOR.node_devices(node("n1", annotations={REGISTER: text})) or ()
    devices = [GPUUsage(i, used=1 if i.id == "va-3" else 0) for i in infos]
    got = VENDOR.fit(devices, req(2), context(MUTEX))
    assert ids(got) == ["va-1", "va-0"]


# --- TestDevices_AddResourceUsage -------------------------------------------------------------------


def test_add_usage_takes_a_slot_and_the_slices_memory_and_cores() -> None:
    # HAMi pkg/device/vastai/device_test.go TestDevices_AddResourceUsage "test add resource usage"
    before = GPUUsage(GPUInfo("dev-0"), used=1)
    after = VENDOR.add_usage(before, GPUSlice("dev-0", 0, 0, "Vastai"))
    assert (after.used, after.usedmem, after.usedcores) == (2, 0, 0)


# --- TestComputeBestCombination ---------------------------------------------------------------------


def dies(*pairs: tuple[str, str]) -> list[GPUUsage]:
    return [device(uid, index=i, custom={"AIC": aic}) for i, (uid, aic) in enumerate(pairs)]


SIX = dies(("dev1", "1"), ("dev2", "1"), ("dev3", "1"), ("dev4", "2"), ("dev5", "2"), ("dev6", "3"))


@pytest.mark.parametrize(
    ("nums", "candidates", "want"),
    [
        pytest.param(
            2, dies(("dev1", "1"), ("dev2", "1"), ("dev3", "1")), ["dev1", "dev2"],
            id=f'{BEST} "single AIC group, sufficient to meet demand"',
        ),
        pytest.param(
            3, SIX, ["dev1", "dev2", "dev3"],
            id=f'{BEST} "multiple AIC groups, select by count after sorting"',
        ),
        pytest.param(
            4, SIX, ["dev1", "dev2", "dev3", "dev4"],
            id=f'{BEST} "multiple AIC groups, need to take across groups"',
        ),
        pytest.param(
            5, dies(("dev1", "1"), ("dev2", "1"), ("dev3", "2")), ["dev1", "dev2", "dev3"],
            id=f'{BEST} "request number exceeds available devices"',
        ),
    ],
)  # fmt: skip
def test_best_combination_takes_the_biggest_aic_groups_first(
    nums: int, candidates: list[GPUUsage], want: list[str]
) -> None:
    assert [d.id for d in vastai.best_combination(nums, candidates)] == want


def test_best_combination_breaks_ties_by_first_appearance() -> None:
    candidates = dies(("x", "9"), ("y", "1"), ("z", "1"), ("w", "9"))
    assert [d.id for d in vastai.best_combination(3, candidates)] == ["x", "w", "y"]


# --- ScoreNode --------------------------------------------------------------------------------------

NODE_DIES = [die("a0", "A"), die("a1", "A"), die("a2", "A"), die("b0", "B"), die("b1", "B")]


@pytest.mark.parametrize(
    ("containers", "previous", "want"),
    [
        pytest.param([("a0", "a1")], NODE_DIES, 1.0, id="one container on one card"),
        pytest.param([("a0", "a1", "b0")], NODE_DIES, vastai.float32(vastai.float32(2.0) / 3), id="2 of 3"),
        pytest.param([("a0", "b0"), ("a1",)], NODE_DIES, 1.5, id="summed over containers"),
        pytest.param([(), ("a0", "b1")], NODE_DIES, 0.5, id="a container without devices is skipped"),
        pytest.param([], NODE_DIES, 0.0, id="no containers"),
        pytest.param([("a0",), ("x",)], [*NODE_DIES, device("x")], 0.0, id="no custominfo: 0 for the pod"),
        pytest.param([("y",)], [], 0.0, id="a device not on the node: 0"),
        pytest.param([("a0", "n")], [*NODE_DIES, die("n", 3.0)], 1.0, id="a non-string AIC is not counted"),
        pytest.param([("n",)], [die("n", 3.0)], 0.0, id="no string AIC at all: the container adds nothing"),
        pytest.param(
            [("a0", "c")], [*NODE_DIES, device("c", custom={"DeviceStrategy": "die"})], 0.0, id="no AIC: 0"
        ),
        pytest.param(
            [("a0", "c")], [*NODE_DIES, device("c", custom={"DeviceStrategy": "card", "AIC": "A"})], 0.0,
            id="another strategy: 0",
        ),
        pytest.param(
            [("c", "d")],
            [device("c", custom={"AIC": "Z"}), device("d", custom={"DeviceStrategy": 2, "AIC": "Z"})],
            1.0, id="a missing or non-string strategy still counts",
        ),
    ],
)  # fmt: skip
def test_score_node_rewards_dies_on_one_card(
    containers: list[tuple[str, ...]], previous: list[GPUUsage], want: float
) -> None:
    assert VENDOR.score_node({}, allocation(*containers), previous, "binpack") == want


def test_score_node_is_float32() -> None:
    got = VENDOR.score_node({}, allocation(("a0", "a1", "b0")), NODE_DIES, "spread")
    assert got == pytest.approx(2 / 3, rel=1e-7)
    assert got != 2 / 3


# --- properties -------------------------------------------------------------------------------------

DIE_SPECS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 2), st.sampled_from(["A", "B", "C"])),
    max_size=8,
)  # (health, used, count, AIC)


@given(DIE_SPECS, st.integers(1, 5), st.booleans())
def test_die_fit_never_picks_a_die_on_a_busy_card_under_mutex(
    specs: list[tuple[bool, int, int, str]], nums: int, mutex: bool
) -> None:
    devices = [
        GPUUsage(
            GPUInfo(
                f"d{i}",
                index=i,
                count=c,
                type=CW,
                health=h,
                custom=custom_text({"DeviceStrategy": "die", "AIC": a}),
            ),
            used=u,
        )
        for i, (h, u, c, a) in enumerate(specs)
    ]
    got = VENDOR.fit(devices, req(nums), context(MUTEX if mutex else {}))
    by_id = {d.id: d for d in devices}
    busy = {vastai.aic_of(d) for d in devices if d.used > 0}
    if isinstance(got, Picked):
        picked = [s.uuid for s in got.slices]
        assert len(picked) == nums == len(set(picked))
        for uid in picked:
            d = by_id[uid]
            assert d.healthy and d.used < d.info.count
            assert not mutex or (d.used == 0 and vastai.aic_of(d) not in busy)
    else:
        assert sum(got.reasons.values()) == len(devices) == got.cards


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
DEVICE_KEYS = ["id", "index", "count", "devmem", "devcore", "type", "numa", "health", "custominfo"]
DEVICE_LIKE = st.dictionaries(st.sampled_from(DEVICE_KEYS), JSON_VALUES, max_size=8)
INVENTORY_TEXT = st.one_of(
    st.text(max_size=60), JSON_VALUES.map(json.dumps), st.lists(DEVICE_LIKE, max_size=3).map(json.dumps)
)


@given(INVENTORY_TEXT)
def test_node_devices_returns_devices_or_raises_wire_format_error(text: str) -> None:
    try:
        got = VENDOR.node_devices(node("n1", annotations={REGISTER: text}))
    except WireFormatError:
        return
    assert got is not None
    assert all(isinstance(d, GPUInfo) and d.devcore == 100 for d in got)


@given(st.lists(st.tuples(st.text(max_size=3), JSON_VALUES), max_size=4), st.integers(1, 3))
def test_score_node_never_raises_and_stays_within_containers(
    custom: list[tuple[str, Any]], containers: int
) -> None:
    previous = [
        device(f"d{i}", custom={"DeviceStrategy": "die", key: value}) for i, (key, value) in enumerate(custom)
    ]
    uids = tuple(d.id for d in previous)
    score = VENDOR.score_node({}, allocation(*([uids] * containers)), previous, "binpack")
    assert 0.0 <= score <= containers


# --- build ------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = vastai.build(parse_device_config("", "device-config.yaml"))
    assert isinstance(vendor, vastai.Vastai)
    assert vendor.names == vastai.names("vastaitech.com/va")


def test_build_reads_resource_count_name() -> None:
    (vendor,) = vastai.build(parse_device_config("vastai:\n  resourceCountName: example.com/va\n", "dc.yaml"))
    assert vendor.names.count == "example.com/va"


@pytest.mark.parametrize(
    ("text", "key", "line", "reason"),
    [
        ("vastai:\n  resourceCountName: {a: 1}\n", "vastai.resourceCountName", 2, "must be a string"),
        ("vastai:\n  resourceCountName: ' '\n", "vastai.resourceCountName", 2, "must name the device count"),
        (
            "vastai:\n  resourceCountName: va\n  dieMode: true\n",
            "vastai.dieMode",
            3,
            "is not a known key here",
        ),
    ],
)
def test_build_refuses_a_bad_value_naming_key_and_line(text: str, key: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        vastai.build(parse_device_config(text, "dc.yaml"))
    assert (err.value.source, err.value.key, err.value.line) == ("dc.yaml", key, line)
    assert err.value.reason.startswith(reason)
