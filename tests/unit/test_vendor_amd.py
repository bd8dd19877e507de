"""hami_control.devices.amd: HAMi's pkg/device/amd/device_test.go (v2.10.0) transcribed case by case,
plus its health rule, the config section and property tests."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import amd
from hami_control.devices.amd import AMD
from hami_control.devices.base import (
    Admission,
    DeviceRequest,
    FitContext,
    HealthRule,
    Inventory,
    LockKind,
    NodeHealth,
    Picked,
    Unfit,
)
from hami_control.devices.config import parse_device_config
from hami_control.usage import GPUUsage
from tests.builders import container, node

INT32_MAX = 2**31 - 1
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)

# HAMi's tests configure these names (not the chart's amd.com/gpumem and amd.com/gpucores)
TEST_VENDOR = AMD(amd.names(count="amd.com/gpu", memory="amd.com/gpu-mem", cores="amd.com/gpu-core-pct"))
VENDOR = AMD(amd.names())


def pod_with(annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "annotations": dict(annotations or {})}}


def context(annotations: Mapping[str, str] | None = None, *, mutex: bool = False) -> FitContext:
    return FitContext(pod_with(annotations), policy=(GPUPolicy.MUTEX,) if mutex else (GPUPolicy.SPREAD,))


def amd_device(  # noqa: PLR0917
    id: str,
    index: int = 0,
    used: int = 0,
    count: int = 2,
    usedmem: int = 0,
    totalmem: int = 1000,
    totalcore: int = 100,
    usedcores: int = 0,
    type: str = "AMD",
    health: bool = True,
) -> GPUUsage:
    """A HAMi DeviceUsage literal of the Go tests."""
    info = GPUInfo(
        id=id, index=index, count=count, devmem=totalmem, devcore=totalcore, type=type, health=health
    )
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


def picked(result: Picked | Unfit) -> Picked:
    assert isinstance(result, Picked), result
    return result


def unfit(result: Picked | Unfit) -> Unfit:
    assert isinstance(result, Unfit), result
    return result


# --- Test_MutateAdmission ------------------------------------------------------------------------------

PCT_TEXT = "amd.com/gpu-core-pct must be an integer percentage between 1 and 100"
MUTATE_CASES: list[tuple[str, dict[str, Any], Admission]] = [
    ("gpu count in limits", container(limits={"amd.com/gpu": "2"}), Admission(True)),
    ("gpu memory in limits", container(limits={"amd.com/gpu-mem": "1024"}), Admission(True)),
    ("core percentage in limits", container(limits={"amd.com/gpu-core-pct": "50"}), Admission(True)),
    ("requests only (limits empty) -> false", container(requests={"amd.com/gpu": "1"}), Admission(False)),
    (
        "rejects zero core percentage",
        container(limits={"amd.com/gpu": "1", "amd.com/gpu-core-pct": "0"}),
        Admission(False, PCT_TEXT),
    ),
    (
        "rejects core percentage above 100",
        container(limits={"amd.com/gpu": "1", "amd.com/gpu-core-pct": "101"}),
        Admission(False, PCT_TEXT),
    ),
    (
        "accepts partial memory without a core percentage",
        container(limits={"amd.com/gpu": "1", "amd.com/gpu-mem": "1024"}),
        Admission(True),
    ),
    ("no resources", container(limits={}), Admission(False)),
]


# HAMi pkg/device/amd/device_test.go Test_MutateAdmission, every case (the id is the Go name; the Go test
# checks the error with ErrorContains, here the whole text)
@pytest.mark.parametrize(("name", "ctr", "want"), MUTATE_CASES, ids=[c[0] for c in MUTATE_CASES])
def test_mutate_admission(name: str, ctr: dict[str, Any], want: Admission) -> None:
    pod = pod_with()
    before = (repr(ctr), repr(pod))
    assert TEST_VENDOR.mutate(ctr, pod) == want
    assert (repr(ctr), repr(pod)) == before  # HAMi's MutateAdmission changes nothing


def test_mutate_admission_text_names_the_configured_core_resource() -> None:
    got = VENDOR.mutate(container(limits={"amd.com/gpu": "1", "amd.com/gpucores": "1.5"}), pod_with())
    assert got == Admission(False, "amd.com/gpucores must be an integer percentage between 1 and 100")


def test_mutate_admission_checks_the_percentage_only_beside_a_count() -> None:
    # HAMi validates gpucores only when the count limit is there; alone it just marks the container.
    assert VENDOR.mutate(container(limits={"amd.com/gpucores": "500"}), pod_with()) == Admission(True)


# --- Test_GetNodeDevices -------------------------------------------------------------------------------

REGISTER_JSON = (
    '[{"id":"GPU-0","index":0,"count":1,"devmem":8192,"devcore":100,"type":"amd","numa":0,"health":true}]'
)


# HAMi pkg/device/amd/device_test.go Test_GetNodeDevices (both halves: the register decodes; no
# annotation is HAMi's "annos not found", None here)
def test_get_node_devices_decodes_the_json_register_and_none_without_it() -> None:
    got = VENDOR.node_devices(node("node-1", annotations={"hami.io/node-amd-register": REGISTER_JSON}))
    assert got == (
        GPUInfo(id="GPU-0", index=0, count=1, devmem=8192, devcore=100, type="amd", numa=0, health=True),
    )
    assert VENDOR.node_devices(node("node-1")) is None


def test_get_node_devices_refuses_an_empty_register() -> None:
    # HAMi: "no gpu found on node", an error (the cached devices stay)
    with pytest.raises(WireFormatError) as info:
        VENDOR.node_devices(node("node-1", annotations={"hami.io/node-amd-register": "[]"}))
    assert info.value.annotation == "hami.io/node-amd-register"
    assert "lists no device" in str(info.value)


def test_get_node_devices_refuses_the_legacy_form() -> None:
    with pytest.raises(WireFormatError):
        VENDOR.node_devices(
            node("node-1", annotations={"hami.io/node-amd-register": "GPU-0,1,8192,100,amd,0,true:"})
        )


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.lists(
            st.dictionaries(
                st.sampled_from(["id", "index", "count", "devmem", "devcore", "type", "numa", "health", "x"]),
                st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=5), st.booleans(), st.none()),
                max_size=9,
            ),
            max_size=3,
        ).map(json.dumps),
    )
)
def test_get_node_devices_returns_devices_or_raises_wire_format_error(text: str) -> None:
    try:
        got = VENDOR.node_devices(node("node-1", annotations={"hami.io/node-amd-register": text}))
    except WireFormatError:
        return
    assert got
    assert all(isinstance(d, GPUInfo) for d in got)


# --- CheckHealth, NodeCleanUp, LockNode (no Go tests: the data and the rule) -----------------------------


@pytest.mark.parametrize(
    ("capacity", "want"),
    [
        (None, NodeHealth(False, False)),
        ({}, NodeHealth(False, False)),
        ({"amd.com/gpu": "0"}, NodeHealth(False, False)),
        ({"amd.com/gpu": "1500m"}, NodeHealth(False, False)),
        ({"amd.com/gpu": "8"}, NodeHealth(True, True)),
        ({"amd.com/gpu": "-1"}, NodeHealth(True, True)),
    ],
    ids=["no status", "absent", "zero", "not whole", "eight", "negative (HAMi checks == 0)"],
)
def test_check_health_reads_the_count_capacity_as_a_whole_number(
    capacity: Mapping[str, Any] | None, want: NodeHealth
) -> None:
    # no Ready condition either: "no status" is a node without one
    assert VENDOR.node_health(node("node-1", capacity=capacity, ready=None), NOW) == want


def test_check_health_without_a_count_resource_is_healthy() -> None:
    assert AMD(amd.names(count="")).node_health(node("node-1"), NOW) == NodeHealth(True, True)


def test_names_lock_with_the_mutex_and_register_as_json() -> None:
    names = VENDOR.names
    assert (names.lock, names.lock_annotation) == (LockKind.MUTEX, "hami.io/mutex.lock")
    assert (names.health, names.handshake, names.inventory, names.register) == (
        HealthRule.CAPACITY,
        "",
        Inventory.JSON,
        "hami.io/node-amd-register",
    )
    assert (names.to_allocate, names.allocated) == (
        "hami.io/amd-devices-to-allocate",
        "hami.io/amd-devices-allocated",
    )
    assert (names.use_uuid, names.nouse_uuid, names.use_type, names.nouse_type) == (
        "amd.com/use-gpu-uuid",
        "amd.com/nouse-gpu-uuid",
        "amd.com/use-gputype",
        "amd.com/nouse-gputype",
    )
    assert (names.common_word, names.resources, names.memory_factor) == (
        "AMD",
        ("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"),
        0,
    )


# --- Test_PatchAnnotations -----------------------------------------------------------------------------


# HAMi pkg/device/amd/device_test.go Test_PatchAnnotations
def test_patch_annotations_writes_the_device_string_under_both_keys() -> None:
    devices = PodAllocation(
        (ContainerAllocation((GPUSlice("test1", 100, 3, "AMD"), GPUSlice("test2", 200, 4, "AMD"))),)
    )
    want = "test1,AMD,100,3:test2,AMD,200,4:;"
    assert VENDOR.pod_annotations({}, devices, node="n", now=NOW) == {
        "hami.io/amd-devices-to-allocate": want,
        "hami.io/amd-devices-allocated": want,
    }


# --- Test_checkType ------------------------------------------------------------------------------------


# HAMi pkg/device/amd/device_test.go Test_checkType, its three checks
@pytest.mark.parametrize(
    ("annotations", "request_type", "allowed"),
    [({}, "AMD", True), ({"amd.com/use-gputype": "MI250"}, "AMD", False), ({}, "other", False)],
    ids=["AMD request, no annotations", "use-gputype MI250 on an MI300X", "request type other"],
)
def test_check_type(annotations: dict[str, str], request_type: str, allowed: bool) -> None:
    device = amd_device("d", type="AMD-MI300X")
    assert VENDOR.type_allowed(annotations, device, DeviceRequest(1, request_type)) is allowed


def test_check_type_takes_the_request_type_in_any_case() -> None:
    assert VENDOR.type_allowed({}, amd_device("d", type="AMD-MI300X"), DeviceRequest(1, "amd"))


# --- Test_GenerateResourceRequests ---------------------------------------------------------------------


# HAMi pkg/device/amd/device_test.go Test_GenerateResourceRequests "parses limits only"
def test_generate_resource_requests_parses_limits_only() -> None:
    ctr = container(
        limits={"amd.com/gpu": "2", "amd.com/gpu-mem": "4096", "amd.com/gpu-core-pct": "33"},
        requests={"amd.com/gpu": "99", "amd.com/gpu-mem": "99", "amd.com/gpu-core-pct": "99"},
    )
    assert TEST_VENDOR.request(ctr) == DeviceRequest(2, "AMD", 4096, 0, 33)


# HAMi pkg/device/amd/device_test.go Test_GenerateResourceRequests "no gpu limits -> empty"
def test_generate_resource_requests_without_a_count_limit_is_none() -> None:
    assert (
        TEST_VENDOR.request(container(limits={"amd.com/gpu-mem": "4096", "amd.com/gpu-core-pct": "33"}))
        is None
    )


# HAMi pkg/device/amd/device_test.go Test_GenerateResourceRequests
# "defaults an omitted core limit to 100 percent"
def test_generate_resource_requests_defaults_an_omitted_core_limit_to_100_percent() -> None:
    got = TEST_VENDOR.request(container(limits={"amd.com/gpu": "1", "amd.com/gpu-mem": "4096"}))
    assert got is not None
    assert got.coresreq == 100


REJECT_CASES = [
    ("rejects zero count", "amd.com/gpu", 0),
    ("rejects overflowing count", "amd.com/gpu", INT32_MAX + 1),
    ("rejects negative memory", "amd.com/gpu-mem", -1),
    ("rejects overflowing memory", "amd.com/gpu-mem", INT32_MAX + 1),
    ("rejects zero core percentage", "amd.com/gpu-core-pct", 0),
    ("rejects excessive core percentage", "amd.com/gpu-core-pct", 101),
]


# HAMi pkg/device/amd/device_test.go Test_GenerateResourceRequests, the six rejection cases
@pytest.mark.parametrize(("name", "resource", "value"), REJECT_CASES, ids=[c[0] for c in REJECT_CASES])
def test_generate_resource_requests_rejects_out_of_range_values(name: str, resource: str, value: int) -> None:
    limits = {"amd.com/gpu": "1", resource: str(value)}
    assert TEST_VENDOR.request(container(limits=limits)) is None


@settings(max_examples=300, deadline=None)
@given(
    count=st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=12)),
    mem=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12)),
    cores=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12)),
)
def test_request_is_none_or_in_range_for_any_quantity(count: Any, mem: Any, cores: Any) -> None:
    limits = {"amd.com/gpu": count}
    if mem is not None:
        limits["amd.com/gpumem"] = mem
    if cores is not None:
        limits["amd.com/gpucores"] = cores
    ctr = container(limits=limits)
    got = VENDOR.request(ctr)
    admission = VENDOR.mutate(ctr, pod_with())
    assert admission.found or admission.error
    if got is not None:
        assert 0 < got.nums <= INT32_MAX
        assert 0 <= got.memreq <= INT32_MAX
        assert 1 <= got.coresreq <= 100
        assert got.mem_percentage == 0
        assert admission == Admission(True)


# --- TestDevices_Fit -----------------------------------------------------------------------------------


# HAMi pkg/device/amd/device_test.go TestDevices_Fit
# "allocate two whole cards (memreq=0 uses totalmem; coresreq=0 uses totalcore when whole mem)"
def test_fit_allocates_two_whole_cards_from_the_end() -> None:
    devices = [amd_device("dev-0", 0, count=2), amd_device("dev-1", 1, count=12)]
    got = picked(VENDOR.fit(devices, DeviceRequest(2, "AMD"), context()))
    assert got.slices == (GPUSlice("dev-1", 1000, 100, "AMD"), GPUSlice("dev-0", 1000, 100, "AMD"))


# HAMi pkg/device/amd/device_test.go TestDevices_Fit "core percentage maps per device"
def test_fit_core_percentage_maps_per_device() -> None:
    devices = [amd_device("dev-0", 0, totalcore=10), amd_device("dev-1", 1, count=12)]
    got = picked(VENDOR.fit(devices, DeviceRequest(1, "AMD", 500, 0, 50), context()))
    assert got.slices == (GPUSlice("dev-1", 500, 50, "AMD"),)


# HAMi pkg/device/amd/device_test.go TestDevices_Fit "retains the registered product type in the allocation"
def test_fit_retains_the_registered_product_type_in_the_allocation() -> None:
    devices = [amd_device("dev-0", type="AMD_Instinct_MI300X_VF")]
    got = picked(VENDOR.fit(devices, DeviceRequest(1, "AMD", 100, 0, 10), context()))
    assert got.slices == (GPUSlice("dev-0", 100, 10, "AMD_Instinct_MI300X_VF"),)
    encoded = VENDOR.pod_annotations({}, PodAllocation((ContainerAllocation(got.slices),)), node="n", now=NOW)
    assert encoded["hami.io/amd-devices-allocated"] == "dev-0,AMD_Instinct_MI300X_VF,100,10:;"


# HAMi pkg/device/amd/device_test.go TestDevices_Fit "clamps a positive percentage to at least one CU" and
# "clamps a core request to the device total"
@pytest.mark.parametrize(
    ("percent", "cores"),
    [(1, 1), (101, 64)],
    ids=["clamps a positive percentage to at least one CU", "clamps a core request to the device total"],
)
def test_fit_clamps_cores_to_one_and_to_the_device_total(percent: int, cores: int) -> None:
    devices = [amd_device("dev-0", totalcore=64)]
    got = picked(VENDOR.fit(devices, DeviceRequest(1, "AMD", 100, 0, percent), context()))
    assert got.slices[0].usedcores == cores


FIT_FAIL_CASES: list[tuple[str, GPUUsage, DeviceRequest, dict[str, str], str]] = [
    (
        "insufficient memory",
        amd_device("dev-0", usedmem=900),
        DeviceRequest(1, "AMD", 500, 0, 10),
        {},
        "1/1 CardInsufficientMemory",
    ),
    (
        "insufficient core",
        amd_device("dev-0", totalcore=10, usedcores=9),
        DeviceRequest(1, "AMD", 100, 0, 100),
        {},
        "1/1 CardInsufficientCore",
    ),
    (
        "uuid mismatch (use)",
        amd_device("dev-1"),
        DeviceRequest(1, "AMD", 100, 0, 10),
        {"amd.com/use-gpu-uuid": "dev-0"},
        "1/1 CardUuidMismatch",
    ),
    (
        "time slicing exhausted",
        amd_device("dev-0", used=2),
        DeviceRequest(1, "AMD", 100, 0, 10),
        {},
        "1/1 CardTimeSlicingExhausted",
    ),
    (
        "unhealthy device is rejected",
        amd_device("dev-0", health=False),
        DeviceRequest(1, "AMD", 100, 0, 10),
        {},
        "1/1 CardNotHealth",
    ),
]


# HAMi pkg/device/amd/device_test.go TestDevices_Fit, the five refusals (the Go test checks the reason
# with strings.Contains, here the whole GenReason text)
@pytest.mark.parametrize(
    ("name", "device", "request_", "annotations", "reason"),
    FIT_FAIL_CASES,
    ids=[c[0] for c in FIT_FAIL_CASES],
)
def test_fit_refuses_with_hamis_reason(
    name: str, device: GPUUsage, request_: DeviceRequest, annotations: dict[str, str], reason: str
) -> None:
    assert unfit(VENDOR.fit([device], request_, context(annotations))).message == reason


def test_fit_under_mutex_skips_used_devices() -> None:
    devices = [amd_device("dev-0"), amd_device("dev-1", used=1, usedmem=100, usedcores=10)]
    request = DeviceRequest(1, "AMD", 100, 0, 10)
    assert [s.uuid for s in picked(VENDOR.fit(devices, request, context(mutex=True))).slices] == ["dev-0"]
    got = unfit(VENDOR.fit(devices[1:], request, context(mutex=True)))
    assert got.message == "1/1 ExclusiveDeviceAllocateConflict"


def test_fit_type_annotations_filter_by_product_type() -> None:
    devices = [
        amd_device("dev-0", type="AMD_Instinct_MI250"),
        amd_device("dev-1", type="AMD_Instinct_MI300X"),
    ]
    request = DeviceRequest(1, "AMD", 100, 0, 10)
    use = picked(VENDOR.fit(devices, request, context({"amd.com/use-gputype": "mi250"})))
    assert [s.uuid for s in use.slices] == ["dev-0"]
    nouse = unfit(VENDOR.fit(devices, request, context({"amd.com/nouse-gputype": "MI2,MI3"})))
    assert nouse.message == "2/2 CardTypeMismatch"


def test_fit_counts_the_devices_found_when_too_few() -> None:
    devices = [amd_device("dev-0", usedmem=1000), amd_device("dev-1")]
    got = unfit(VENDOR.fit(devices, DeviceRequest(2, "AMD", 0, 0, 100), context()))
    assert got.message == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory"


def test_fit_on_a_device_without_cores_refuses_a_percentage() -> None:
    got = unfit(
        VENDOR.fit([amd_device("dev-0", totalcore=0)], DeviceRequest(1, "AMD", 100, 0, 10), context())
    )
    assert got.message == "1/1 CardInsufficientCore"


def test_fit_then_add_usage_accumulates() -> None:
    device = amd_device("dev-0", count=4)
    request = DeviceRequest(1, "AMD", 300, 0, 25)
    for _ in range(3):
        device = VENDOR.add_usage(device, picked(VENDOR.fit([device], request, context())).slices[0])
    assert (device.used, device.usedmem, device.usedcores) == (3, 900, 75)
    assert unfit(VENDOR.fit([device], request, context())).message == "1/1 CardInsufficientMemory"


# --- TestCheckAMDType ----------------------------------------------------------------------------------

TYPE_CASES: list[tuple[str, dict[str, str], str, bool]] = [
    ("no annotations", {}, "MI300X", True),
    ("matching use type", {"amd.com/use-gputype": "MI300"}, "MI300X", True),
    ("non-matching use type", {"amd.com/use-gputype": "MI250"}, "MI300X", False),
    ("matching nouse type excludes card", {"amd.com/nouse-gputype": "MI300"}, "MI300X", False),
    ("non-matching nouse type keeps card", {"amd.com/nouse-gputype": "MI250"}, "MI300X", True),
    ("empty nouse annotation keeps card", {"amd.com/nouse-gputype": ""}, "MI300X", True),
    ("empty use annotation keeps card", {"amd.com/use-gputype": ""}, "MI300X", True),
    ("whitespace-only nouse annotation keeps card", {"amd.com/nouse-gputype": "   "}, "MI300X", True),
    ("whitespace-only use annotation keeps card", {"amd.com/use-gputype": "   "}, "MI300X", True),
    (
        "nouse with trailing comma only excludes named type",
        {"amd.com/nouse-gputype": "MI250,"},
        "MI300X",
        True,
    ),
    (
        "nouse with leading comma only excludes named type",
        {"amd.com/nouse-gputype": ",MI250"},
        "MI300X",
        True,
    ),
    (
        "nouse with blank member still excludes named type",
        {"amd.com/nouse-gputype": " MI250 , "},
        "MI250X",
        False,
    ),
    ("nouse with only commas keeps card", {"amd.com/nouse-gputype": ", "}, "MI300X", True),
    ("use with trailing comma matches named type only", {"amd.com/use-gputype": "MI300,"}, "MI250X", False),
    ("use with only commas rejects card", {"amd.com/use-gputype": ", "}, "MI300X", False),
]


# HAMi pkg/device/amd/device_test.go TestCheckAMDType, every case (checkAMDType is the type rule of Fit)
@pytest.mark.parametrize(("name", "annotations", "card", "want"), TYPE_CASES, ids=[c[0] for c in TYPE_CASES])
def test_check_amd_type(name: str, annotations: dict[str, str], card: str, want: bool) -> None:
    assert VENDOR.type_allowed(annotations, amd_device("d", type=card), DeviceRequest(1, "AMD")) is want


# --- build ---------------------------------------------------------------------------------------------


def test_build_with_the_charts_defaults() -> None:
    (vendor,) = amd.build(parse_device_config("", "device-config.yaml"))
    assert isinstance(vendor, AMD)
    assert vendor.names == amd.names()


def test_build_reads_its_section_and_an_empty_name_switches_the_resource_off() -> None:
    text = "amd:\n  resourceCountName: amd.com/gpu\n  resourceMemoryName: ''\n  resourceCoreName: x.com/pct\n"
    (vendor,) = amd.build(parse_device_config(text, "device-config.yaml"))
    assert (vendor.names.count, vendor.names.memory, vendor.names.cores) == ("amd.com/gpu", "", "x.com/pct")
    assert vendor.mutate(container(limits={"amd.com/gpumem": "1"}), pod_with()) == Admission(False)


def test_build_refuses_a_bad_value_naming_key_and_line() -> None:
    text = "amd:\n  resourceCountName: amd.com/gpu\n  resourceMemoryName: {a: 1}\n"
    with pytest.raises(ConfigError) as info:
        amd.build(parse_device_config(text, "device-config.yaml"))
    assert (info.value.key, info.value.line) == ("amd.resourceMemoryName", 3)
    assert "must be a string" in str(info.value)


def test_build_refuses_an_unknown_key() -> None:
    with pytest.raises(ConfigError) as info:
        amd.build(parse_device_config("amd:\n  memoryFactor: 2\n", "device-config.yaml"))
    assert (info.value.key, info.value.line) == ("amd.memoryFactor", 2)
