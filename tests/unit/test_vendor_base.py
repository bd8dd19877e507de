"""The vendor interface's shared pieces: hami_control/devices/base.py (HAMi pkg/device/devices.go's helpers:
CheckUUID, CheckType, DecodeNodeDevices / UnMarshalNodeDevices through `Vendor.node_devices`, CheckHealth,
GenReason from pkg/device/common), standard.py (the common Fit's steps) and config.py (device-config.yaml),
with HAMi's own Go tests of them transcribed case by case (pkg/device/devices_test.go,
pkg/device/common/common_test.go).

Go's corners are copied too (strings.TrimSpace, strings.ToUpper's rune-by-rune mapping, Quantity.AsInt64
on inf.Dec quantities)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hami_api.annotations import encode_node_register, encode_node_register_legacy
from hami_api.errors import WireFormatError
from hami_api.settings import ConfigError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPolicy, GPUSlice, PodAllocation
from hami_control.devices import standard
from hami_control.devices.base import (
    DSMLU_LOCK,
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
    Vendor,
    VendorNames,
    annotations_of,
    as_int64,
    check_type,
    check_uuid,
    custom_info,
    custom_text,
    gen_reason,
    handshake_health,
    has_limit,
    labels_of,
    node_quantity,
    resource_value,
)
from hami_control.devices.config import (
    TOP_LEVEL_KEYS,
    DeviceConfig,
    default_text,
    load_device_config,
    parse_device_config,
)
from hami_control.usage import GPUUsage
from tests.builders import node

DEVICES_GO = "HAMi pkg/device/devices_test.go"
COMMON_GO = "HAMi pkg/device/common/common_test.go"
NOW = datetime(2026, 3, 1, 12, 0, 0)
REGISTER = "example.com/node-register"
HANDSHAKE = "hami.io/node-handshake-ascend"

LEGACY = Vendor(
    VendorNames("EX", "example", "example.com/gpu", register=REGISTER, inventory=Inventory.LEGACY)
)
JSON_VENDOR = Vendor(
    VendorNames("EX", "example", "example.com/gpu", register=REGISTER, inventory=Inventory.JSON)
)


def _read(text: str) -> Any:
    return lambda _path: text


# --- GenReason (pkg/device/common) ------------------------------------------------------------------


def test_gen_reason_writes_what_parse_reason_reads_back() -> None:
    # HAMi pkg/device/common/common_test.go TestParseReason "base test": the Go test parses
    # "3/8 CardInsufficientMemory, 2/8 CardInsufficientCore, 3/8 CardNotHealth"; GenReason writes those
    # items sorted (there is no Go test of GenReason itself)
    reasons = {"CardInsufficientMemory": 3, "CardInsufficientCore": 2, "CardNotHealth": 3}
    text = gen_reason(reasons, 8)
    assert text == "2/8 CardInsufficientCore, 3/8 CardInsufficientMemory, 3/8 CardNotHealth"
    go_text = "3/8 CardInsufficientMemory, 2/8 CardInsufficientCore, 3/8 CardNotHealth"
    parsed = {item.split(" ")[1]: int(item.split("/")[0]) for item in go_text.split(", ")}
    assert parsed == reasons


def test_gen_reason_sorts_the_whole_items_as_strings() -> None:
    # sort.Strings over "<n>/<cards> <Reason>": "10/12 ..." comes before "2/12 ..."
    assert gen_reason({"B": 2, "A": 10}, 12) == "10/12 A, 2/12 B"


def test_gen_reason_of_no_reasons_is_empty() -> None:
    assert gen_reason({}, 3) == ""
    assert Unfit({}, 0).message == ""


def test_unfit_message_is_gen_reason() -> None:
    assert (
        Unfit({"CardNotHealth": 1, "CardTypeMismatch": 2}, 3).message
        == "1/3 CardNotHealth, 2/3 CardTypeMismatch"
    )


def test_reason_strings_are_hamis() -> None:
    # pkg/device/common/common.go constants, byte for byte (note "CardUuidMismatch")
    assert [
        standard.CARD_TYPE_MISMATCH,
        standard.CARD_UUID_MISMATCH,
        standard.CARD_TIME_SLICING_EXHAUSTED,
        standard.CARD_COMPUTE_UNITS_EXHAUSTED,
        standard.CARD_INSUFFICIENT_MEMORY,
        standard.CARD_INSUFFICIENT_CORE,
        standard.CARD_NOT_HEALTH,
        standard.NUMA_NOT_FIT,
        standard.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
        standard.CARD_NOT_FOUND_CUSTOM_FILTER_RULE,
        standard.NODE_INSUFFICIENT_DEVICE,
        standard.ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
        standard.RESOURCE_QUOTA_NOT_FIT,
        standard.MODE_NOT_FIT,
    ] == [
        "CardTypeMismatch", "CardUuidMismatch", "CardTimeSlicingExhausted", "CardComputeUnitsExhausted",
        "CardInsufficientMemory", "CardInsufficientCore", "CardNotHealth", "NumaNotFit",
        "ExclusiveDeviceAllocateConflict", "CardNotFoundCustomFilterRule", "NodeInsufficientDevice",
        "AllocatedCardsInsufficientRequest", "ResourceQuotaNotFit", "ModeNotFit",
    ]  # fmt: skip


# --- CheckUUID ----------------------------------------------------------------------------------------

UUSE, UNOUSE = "hami.io/gpu-use-uuid", "hami.io/gpu-no-use-uuid"
UUID_GO = f"{DEVICES_GO} TestCheckUUID"


@pytest.mark.parametrize(
    ("annotations", "device_id", "allowed"),
    [
        pytest.param({}, "abc", True, id=f'{UUID_GO} "don\'t set GPUUseUUID and GPUNoUseUUID annotation"'),
        pytest.param(
            {UUSE: "abc,123"},
            "abc",
            True,
            id=f'{UUID_GO} "use set GPUUseUUID don\'t set GPUNoUseUUID annotation,device match"',
        ),
        pytest.param(
            {UUSE: "abc,123"},
            "1abc",
            False,
            id=f"{UUID_GO} \"use set GPUUseUUID don't set GPUNoUseUUID annotation,device don't match\"",
        ),
        pytest.param(
            {UNOUSE: "abc,123"},
            "abc",
            False,
            id=f'{UUID_GO} "use don\'t set GPUUseUUID set GPUNoUseUUID annotation,device match"',
        ),
        pytest.param(
            {UNOUSE: "abc,123"},
            "1abc",
            True,
            id=f"{UUID_GO} \"use don't set GPUUseUUID set GPUNoUseUUID annotation,device  don't match\"",
        ),
        pytest.param(
            {UUSE: "abc,123", UNOUSE: "abc"},
            "abc",
            False,
            id=f'{UUID_GO} "both GPUUseUUID and GPUNoUseUUID set, device in use list but also in nouse list"',
        ),
        pytest.param(
            {UUSE: "abc,123", UNOUSE: "456"},
            "abc",
            True,
            id=f'{UUID_GO} "both GPUUseUUID and GPUNoUseUUID set, device in use list and not in nouse list"',
        ),
        pytest.param(
            {UUSE: " abc , 123 "},
            "abc",
            True,
            id=f'{UUID_GO} "use list with spaces around uuids, device matches after trim"',
        ),
        pytest.param(
            {UUSE: ""},
            "abc",
            True,
            id=f'{UUID_GO} "empty GPUUseUUID annotation should not filter out any device"',
        ),
        pytest.param(
            {UUSE: "   "},
            "abc",
            True,
            id=f'{UUID_GO} "whitespace-only GPUUseUUID annotation should not filter out any device"',
        ),
        pytest.param(
            {UNOUSE: ""},
            "abc",
            True,
            id=f'{UUID_GO} "empty GPUNoUseUUID annotation should not exclude any device"',
        ),
        pytest.param({UUSE: "ABC"}, "abc", False, id="exact ids: case matters"),
        pytest.param({UUSE: "ab"}, "abc", False, id="exact ids: no substring"),
        pytest.param({UUSE: "x,"}, "", True, id="an empty list member matches an empty id, as Go"),
    ],
)
def test_check_uuid_follows_the_use_and_nouse_lists(
    annotations: dict[str, str], device_id: str, allowed: bool
) -> None:
    assert check_uuid(annotations, device_id, UUSE, UNOUSE) is allowed


def test_check_uuid_without_keys_allows_everything() -> None:
    assert check_uuid({UUSE: "x"}, "abc", "", "") is True


# --- CheckType ----------------------------------------------------------------------------------------

TUSE, TNOUSE = "example.com/use-gputype", "example.com/nouse-gputype"
TYPE_GO = f"{DEVICES_GO} TestCheckType"


@pytest.mark.parametrize(
    ("annotations", "card_type", "allowed"),
    [
        pytest.param({}, "NVIDIA-A100", True, id=f'{TYPE_GO} "no annotation is no constraint"'),
        pytest.param(
            {TUSE: "A100,V100"}, "NVIDIA-A100", True, id=f'{TYPE_GO} "use list matches by substring"'
        ),
        pytest.param({TUSE: "V100"}, "NVIDIA-A100", False, id=f'{TYPE_GO} "use list does not match"'),
        pytest.param(
            {TNOUSE: "A100"}, "NVIDIA-A100", False, id=f'{TYPE_GO} "nouse list matches excludes the device"'
        ),
        pytest.param(
            {TNOUSE: "V100"},
            "NVIDIA-A100",
            True,
            id=f'{TYPE_GO} "nouse list does not match keeps the device"',
        ),
        pytest.param({TUSE: ""}, "NVIDIA-A100", True, id=f'{TYPE_GO} "empty use value is no constraint"'),
        pytest.param(
            {TNOUSE: "   "},
            "NVIDIA-A100",
            True,
            id=f'{TYPE_GO} "whitespace-only nouse value excludes nothing"',
        ),
        pytest.param(
            {TUSE: "A100", TNOUSE: "A100"},
            "NVIDIA-A100",
            False,
            id=f'{TYPE_GO} "use satisfied and nouse matches still excludes"',
        ),
        pytest.param(
            {TNOUSE: "V100,"},
            "NVIDIA-A100",
            True,
            id=f'{TYPE_GO} "nouse with trailing comma only excludes named type"',
        ),
        pytest.param(
            {TNOUSE: ",V100"},
            "NVIDIA-A100",
            True,
            id=f'{TYPE_GO} "nouse with leading comma only excludes named type"',
        ),
        pytest.param(
            {TUSE: "V100,"},
            "NVIDIA-A100",
            False,
            id=f'{TYPE_GO} "use with trailing comma matches named type only"',
        ),
        pytest.param({TUSE: "a100"}, "nvidia-A100", True, id="case-insensitive both ways"),
        pytest.param({TUSE: " a100 "}, "NVIDIA-A100", True, id="members trimmed"),
    ],
)
def test_check_type_matches_case_insensitive_substrings(
    annotations: dict[str, str], card_type: str, allowed: bool
) -> None:
    assert check_type(annotations, card_type, TUSE, TNOUSE) is allowed


def test_check_type_upper_cases_rune_by_rune_as_go() -> None:
    assert check_type({TUSE: "SS"}, "ß-card", TUSE, TNOUSE) is False


def test_check_uuid_trims_only_what_go_trims() -> None:
    assert check_uuid({UUSE: "\x1fabc"}, "abc", UUSE, UNOUSE) is False


# --- DecodeNodeDevices: the legacy inventory through Vendor.node_devices ----------------------------

DECODE_GO = f"{DEVICES_GO} Test_DecodeNodeDevices"
UUID = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
P4 = GPUInfo(
    UUID, index=0, count=10, devmem=7680, devcore=100, type="NVIDIA-Tesla P4", mode="hami-core", health=True
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(":", (), id=f'{DECODE_GO} "args is only delimiter"'),
        pytest.param("::", (), id=f'{DECODE_GO} "args is multiple delimiters"'),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true:", (P4,), id=f'{DECODE_GO} "str is old format"'
        ),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:",
            (
                GPUInfo(
                    UUID,
                    index=1,
                    count=10,
                    devmem=7680,
                    devcore=100,
                    type="NVIDIA-Tesla P4",
                    mode="hami-core",
                    health=True,
                ),
            ),
            id=f'{DECODE_GO} "str is new format"',
        ),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true:",
            (P4,),
            id=f"{DEVICES_GO} TestDecodeNodeDevicesLegacyFormat",
        ),
        pytest.param(
            "a,1,2,3,T,-1,FALSE:b,-1,-2,-3,,9,1,0,:",
            (
                GPUInfo("a", count=1, devmem=2, devcore=3, type="T", numa=-1, mode="hami-core", health=False),
                GPUInfo("b", count=-1, devmem=-2, devcore=-3, type="", numa=9, mode="", health=True),
            ),
            id="ParseInt/Atoi signs, ParseBool spellings, empty type and mode",
        ),
    ],
)
def test_legacy_inventory_decodes_as_decode_node_devices(text: str, expected: tuple[GPUInfo, ...]) -> None:
    assert LEGACY.node_devices(node("n1", annotations={REGISTER: text})) == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("", "", id=f'{DECODE_GO} "args is empty"'),
        pytest.param(",", "", id=f'{DECODE_GO} "args missing delimiter with comma"'),
        pytest.param(",:", "", id=f'{DECODE_GO} "args has comma and delimiter but empty fields"'),
        pytest.param("a", "", id=f'{DECODE_GO} "args is invalid format missing split symbol"'),
        pytest.param("garbage:", "", id=f'{DECODE_GO} "malformed segment without comma"'),
        pytest.param(
            f"{UUID},notanint,7680,100,NVIDIA-Tesla P4,0,true:",
            "count",
            id=f'{DECODE_GO} "invalid count field"',
        ),
        pytest.param(
            f"{UUID},10,notanint,100,NVIDIA-Tesla P4,0,true:",
            "devmem",
            id=f'{DECODE_GO} "invalid memory field"',
        ),
        pytest.param(
            f"{UUID},10,7680,notanint,NVIDIA-Tesla P4,0,true:",
            "devcore",
            id=f'{DECODE_GO} "invalid core field"',
        ),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,notanint,true:",
            "numa",
            id=f'{DECODE_GO} "invalid numa field"',
        ),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,notabool:",
            "health",
            id=f'{DECODE_GO} "invalid health field"',
        ),
        pytest.param(f"{UUID},10,7680,100,NVIDIA-Tesla P4:", "", id=f'{DECODE_GO} "unexpected field count"'),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,notanint,hami-core:",
            "index",
            id=f'{DECODE_GO} "invalid index field in new format"',
        ),
        pytest.param(
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,-1,hami-core:",
            "index",
            id=f'{DECODE_GO} "negative index field in new format"',
        ),
        pytest.param(
            f"{UUID},2147483648,1,1,T,0,true:", "count", id="count past int32 (ParseInt bitSize 32)"
        ),
        pytest.param(f"{UUID}, 1,1,1,T,0,true:", "count", id="no spaces around numbers"),
        pytest.param(f"{UUID},1,1,1,T,0,yes:", "health", id="yes is not a Go bool"),
        # stricter than Go, which takes these: an empty id, an id twice
        pytest.param(",1,1,1,T,0,true:", "", id="an empty id (Go: accepted)"),
        pytest.param("a,1,1,1,T,0,true:a,1,1,1,T,0,true:", "id", id="an id twice (Go: accepted)"),
    ],
)
def test_legacy_inventory_that_does_not_decode_raises_wire_format_error(text: str, field: str) -> None:
    with pytest.raises(WireFormatError) as err:
        LEGACY.node_devices(node("n1", annotations={REGISTER: text}))
    assert err.value.annotation == REGISTER
    assert err.value.field == field


def test_node_devices_without_the_annotation_is_none() -> None:
    assert LEGACY.node_devices(node("n1", annotations={})) is None
    assert LEGACY.node_devices({"metadata": "oops"}) is None
    example = Vendor(VendorNames("EX", "example", "example.com/gpu"))
    assert example.node_devices(node("n1", annotations={REGISTER: ":"})) is None


ENCODE_GO = f"{DEVICES_GO} Test_EncodeNodeDevices"
ROUND_GO = f"{DEVICES_GO} TestEncodeDecodeNodeDevicesRoundtrip"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"


@pytest.mark.parametrize(
    ("gpus", "text"),
    [
        pytest.param(
            (P4,), f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,0,hami-core:", id=f'{ENCODE_GO} "old format"'
        ),
        pytest.param(
            (
                GPUInfo(
                    UUID,
                    index=1,
                    count=10,
                    devmem=7680,
                    devcore=100,
                    type="NVIDIA-Tesla P4",
                    mode="hami-core",
                    health=True,
                ),
            ),
            f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:",
            id=f'{ENCODE_GO} "test two"',
        ),
    ],
)
def test_legacy_encoding_is_encode_node_devices(gpus: tuple[GPUInfo, ...], text: str) -> None:
    assert encode_node_register_legacy(gpus) == text
    assert LEGACY.node_devices(node("n1", annotations={REGISTER: text})) == gpus


@pytest.mark.parametrize(
    "gpus",
    [
        pytest.param((P4,), id=f'{ROUND_GO} "single device, index 0"'),
        pytest.param(
            (
                GPUInfo(
                    UUID,
                    index=1,
                    count=10,
                    devmem=7680,
                    devcore=100,
                    type="NVIDIA-Tesla P4",
                    mode="hami-core",
                    health=True,
                ),
            ),
            id=f'{ROUND_GO} "single device, index 1"',
        ),
        pytest.param(
            (
                GPUInfo(
                    "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec",
                    index=0,
                    count=10,
                    devmem=32768,
                    devcore=100,
                    type=V100,
                    mode="hami-core",
                    health=True,
                ),
                GPUInfo(
                    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
                    index=1,
                    count=10,
                    devmem=32768,
                    devcore=100,
                    type=V100,
                    mode="hami-core",
                    health=True,
                ),
            ),
            id=f'{ROUND_GO} "multiple devices"',
        ),
    ],
)
def test_legacy_encode_then_decode_gives_the_devices_back(gpus: tuple[GPUInfo, ...]) -> None:
    assert LEGACY.node_devices(node("n1", annotations={REGISTER: encode_node_register_legacy(gpus)})) == gpus


_LEGACY_TEXT = st.text(alphabet="0123456789,:-+abtruefalsTF x", max_size=80)


@given(st.one_of(_LEGACY_TEXT, st.text(max_size=60)))
@example("")
@example("GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:")
@example(f"{UUID},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:")
@example("garbage:")
@example(",,,,,:")
def test_legacy_inventory_decoding_returns_devices_or_raises_wire_format_error(text: str) -> None:
    # HAMi pkg/device/devices_test.go FuzzDecodeNodeDevices (its seeds as examples): never anything else
    try:
        got = LEGACY.node_devices(node("n1", annotations={REGISTER: text}))
    except WireFormatError as err:
        assert err.annotation == REGISTER
        return
    assert got is not None
    assert all(isinstance(d, GPUInfo) and d.id for d in got)


# --- UnMarshalNodeDevices: the JSON inventory through Vendor.node_devices ---------------------------

UNMARSHAL_GO = f"{DEVICES_GO} TestUnMarshalNodeDevices"
ID1 = GPUInfo("id-1", index=1, count=1, devmem=1024, devcore=10, type="type", numa=0, health=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[{"index":1,"id":"id-1","count":1,"devmem":1024,"devcore":10,"type":"type","health":true}]\n',
            (ID1,),
            id=f'{UNMARSHAL_GO} "test one"',
        ),
        pytest.param(
            '[{"index":1,"id":"id-1","count":1,"devmem":1024,"devcore":10,"type":"type","health":true},'
            '{"index":2,"id":"id-2","count":2,"devmem":4096,"devcore":20,"type":"type2","health":false}]',
            (
                ID1,
                GPUInfo(
                    "id-2", index=2, count=2, devmem=4096, devcore=20, type="type2", numa=0, health=False
                ),
            ),
            id=f'{UNMARSHAL_GO} "test two"',
        ),
        pytest.param("[]", (), id="an empty list is no device"),
        pytest.param(
            '[{"ID":"a","Count":2,"devicevendor":"X","devicepairscore":{},"custominfo":{"NetworkID":1}}]',
            (GPUInfo("a", count=2, custom='{"NetworkID":1.0}'),),
            id="keys any case, unknown keys ignored, custominfo numbers as float64",
        ),
    ],
)
def test_json_inventory_decodes_as_unmarshal_node_devices(text: str, expected: tuple[GPUInfo, ...]) -> None:
    assert JSON_VENDOR.node_devices(node("n1", annotations={REGISTER: text})) == expected


MARSHAL_GO = f"{DEVICES_GO} TestMarshalNodeDevices"


@pytest.mark.parametrize(
    "gpus",
    [
        pytest.param((ID1,), id=f'{MARSHAL_GO} "test one"'),
        pytest.param(
            (ID1, GPUInfo("id-2", index=2, count=2, devmem=2048, devcore=20, type="type2", numa=1)),
            id=f'{MARSHAL_GO} "test multiple"',
        ),
        pytest.param((), id=f'{MARSHAL_GO} "test empty"'),
    ],
)
def test_json_encoding_decodes_back_to_the_same_devices(gpus: tuple[GPUInfo, ...]) -> None:
    # The Go test compares json.Unmarshal of both sides; here decode(encode(x)) == x
    assert JSON_VENDOR.node_devices(node("n1", annotations={REGISTER: encode_node_register(gpus)})) == gpus


@pytest.mark.parametrize("text", [":", "a,1,1,1,T,0,true:", "{", '[{"id":1}]', '[{"id":"a","count":"1"}]'])
def test_json_inventory_that_does_not_decode_raises_wire_format_error(text: str) -> None:
    with pytest.raises(WireFormatError):
        JSON_VENDOR.node_devices(node("n1", annotations={REGISTER: text}))


# --- CheckHealth --------------------------------------------------------------------------------------

HEALTH_GO = f"{DEVICES_GO} Test_CheckHealth"


@pytest.mark.parametrize(
    ("value", "allocatable", "expected"),
    [
        pytest.param(
            "Requesting_2128-12-02 00:00:00",
            None,
            NodeHealth(True, False),
            id=f'{HEALTH_GO} "Requesting state"',
        ),
        pytest.param(
            "Requesting",
            None,
            NodeHealth(True, False),
            id=f'{HEALTH_GO} "Requesting state without timestamp"',
        ),
        pytest.param(
            "Requesting_not-a-timestamp",
            None,
            NodeHealth(True, False),
            id=f'{HEALTH_GO} "Requesting state with unparsable timestamp"',
        ),
        # Go's test expects (true, false) here only because util.GetNode fails without a Kubernetes client,
        # so the patch is skipped; with the patch written CheckHealth answers (true, true) (pkg/device/hygon
        # Test_CheckHealth "Unknown state", where the key is not registered and no patch is attempted)
        pytest.param(
            "Unknown",
            None,
            NodeHealth(True, True, "Requesting_2026-03-01 12:00:00"),
            id=f'{HEALTH_GO} "Unknown state"',
        ),
        pytest.param(
            "Requesting_2024-01-02 00:00:00",
            None,
            NodeHealth(False, False),
            id=f'{HEALTH_GO} "Requesting state expired, no allocatable"',
        ),
        pytest.param(
            "Requesting_2024-01-02 00:00:00",
            {"huawei.com/Ascend910": "8"},
            NodeHealth(True, False),
            id=f'{HEALTH_GO} "Requesting state expired, allocatable present"',
        ),
        pytest.param(
            "Requesting_2026-03-01 11:59:00", None, NodeHealth(False, False), id="exactly 60 s old is expired"
        ),
        pytest.param(
            "Requesting_2026-03-01 11:59:01", None, NodeHealth(True, False), id="59 s old is awaited"
        ),
        pytest.param(
            "Reported 2026-03-01 11:00:00 +0000 UTC",
            None,
            NodeHealth(True, True, "Requesting_2026-03-01 12:00:00"),
            id="the plugin's Reported answer registers the node at once",
        ),
        pytest.param(
            "Requesting_2024-01-02 00:00:00",
            {"huawei.com/Ascend910": "0"},
            NodeHealth(False, False),
            id="expired with 0 allocatable",
        ),
        pytest.param(
            "Requesting_2024-01-02 00:00:00",
            {"huawei.com/Ascend910": "500m"},
            NodeHealth(True, False),
            id="expired with 0.5 allocatable: Value() rounds up to 1",
        ),
    ],
)
def test_handshake_health_is_check_health(
    value: str, allocatable: dict[str, str] | None, expected: NodeHealth
) -> None:
    status = None if allocatable is None else {"allocatable": allocatable}
    n = node("n1", annotations={HANDSHAKE: value}, status=status, ready=None)
    assert handshake_health(n, NOW, HANDSHAKE, "huawei.com/Ascend910") == expected


def test_handshake_health_without_an_annotation_requests_a_handshake() -> None:
    assert handshake_health(node("n1", annotations={}), NOW, HANDSHAKE, "x") == NodeHealth(
        True, True, "Requesting_2026-03-01 12:00:00"
    )


def test_handshake_health_without_a_handshake_key_patches_nothing() -> None:
    # CheckHealth for a devType with no util.HandshakeAnnos entry: (true, true), no patch
    assert handshake_health(
        node("n1", annotations={"": "Requesting_2024-01-02 00:00:00"}), NOW, "", "x"
    ) == NodeHealth(True, True)


def test_handshake_health_reads_the_wall_clock_of_an_aware_now() -> None:
    aware = NOW.astimezone()
    got = handshake_health(node("n1", annotations={}), aware, HANDSHAKE, "x")
    assert got.handshake == f"Requesting_{aware.replace(tzinfo=None):%Y-%m-%d %H:%M:%S}"


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        pytest.param("2024-1-2 0:0:0", NodeHealth(True, False), id="1-digit fields are a parse error in Go"),
        pytest.param(
            "2024-01-02  00:00:00", NodeHealth(True, False), id="two spaces are a parse error in Go"
        ),
        pytest.param(
            "２０２４-01-02 00:00:00", NodeHealth(True, False), id="fullwidth digits are a parse error in Go"
        ),
        pytest.param("2024-01-02 00:00:00.5", NodeHealth(False, False), id="Go takes a fractional second"),
    ],
)
def test_handshake_health_parses_the_stamp_with_gos_layout(stamp: str, expected: NodeHealth) -> None:
    assert (
        handshake_health(node("n1", annotations={HANDSHAKE: f"Requesting_{stamp}"}), NOW, HANDSHAKE, "x")
        == expected
    )


@pytest.mark.parametrize(
    ("rule", "capacity", "expected"),
    [
        pytest.param(HealthRule.ALWAYS, None, NodeHealth(True, True), id="always"),
        pytest.param(
            HealthRule.CAPACITY, {"example.com/gpu": "2"}, NodeHealth(True, True), id="capacity > 0"
        ),
        pytest.param(HealthRule.CAPACITY, {"example.com/gpu": "0"}, NodeHealth(False, True), id="capacity 0"),
        pytest.param(HealthRule.CAPACITY, None, NodeHealth(False, True), id="no capacity"),
    ],
)
def test_node_health_rules(rule: HealthRule, capacity: dict[str, str] | None, expected: NodeHealth) -> None:
    vendor = Vendor(VendorNames("EX", "example", "example.com/gpu", health=rule))
    status = None if capacity is None else {"capacity": capacity}
    assert vendor.node_health(node("n1", annotations={}, status=status, ready=None), NOW) == expected


# --- the small readers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("1", 1, id="1"),
        pytest.param("16Gi", 17179869184, id="16Gi"),
        pytest.param("1k", 1000, id="1k"),
        pytest.param("1e3", 1000, id="1e3"),
        pytest.param("2000m", 2, id="2000m: the API server stores it as 2"),
        pytest.param("1.5", None, id="a fraction"),
        pytest.param("-3", -3, id="negative"),
        pytest.param("9E", 9 * 10**18, id="9E fits int64"),
        pytest.param("10E", None, id="10E is past int64"),
        pytest.param(7, 7, id="a JSON number"),
        pytest.param(True, None, id="a boolean"),
        pytest.param("x", None, id="garbage"),
        pytest.param(None, None, id="absent"),
        pytest.param("", None, id="empty"),
    ],
)
def test_as_int64_is_quantity_as_int64(raw: Any, expected: int | None) -> None:
    assert as_int64(raw) == expected


@pytest.mark.parametrize("raw", ["9223372036854775807", "1234567890123456789", "1Pi", "100Ti"])
def test_as_int64_is_none_where_go_keeps_an_inf_dec(raw: str) -> None:
    # apimachinery pkg/api/resource/quantity.go ParseQuantity leaves its int64 fast path (a canonical
    # mantissa of 19+ digits; binary with 15-len(mantissa)-int(exp*3/10)-1 < 0, or a fraction), and
    # AsInt64 answers false for the inf.Dec; HAMi then reads the value as absent
    assert as_int64(raw) is None


@pytest.mark.parametrize(
    ("raw", "expected"), [("1Gi", 2**30), ("16Ti", 16 * 2**40), ("123456789012345678", 123456789012345678)]
)
def test_as_int64_reads_what_go_keeps_as_int64(raw: str, expected: int) -> None:
    assert as_int64(raw) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({"allocatable": {"r": "3"}}, 3, id="whole"),
        pytest.param({"allocatable": {"r": "1500m"}}, 2, id="Value() rounds up"),
        pytest.param({"allocatable": {"r": "-1500m"}}, -2, id="away from zero below 0"),
        pytest.param({"allocatable": {"r": "garbage"}}, 0, id="unreadable"),
        pytest.param({"allocatable": {}}, 0, id="absent"),
        pytest.param({"allocatable": "oops"}, 0, id="malformed section"),
        pytest.param(None, 0, id="no status"),
    ],
)
def test_node_quantity_is_quantity_value(status: dict[str, Any] | None, expected: int) -> None:
    assert (
        node_quantity(node("n1", annotations={}, status=status, ready=None), "allocatable", "r") == expected
    )


def test_resource_value_reads_limits_then_requests() -> None:
    container = {"resources": {"limits": {"a": "1"}, "requests": {"a": "2", "b": "3"}}}
    assert resource_value(container, "a") == "1"
    assert resource_value(container, "b") == "3"
    assert resource_value(container, "b", limits_only=True) is None
    assert resource_value({"resources": None}, "a") is None
    assert resource_value({"resources": {"limits": ["a"]}}, "a") is None


def test_has_limit_looks_at_limits_only() -> None:
    assert has_limit({"resources": {"limits": {"a": "0"}}}, "a") is True
    assert has_limit({"resources": {"requests": {"a": "1"}}}, "a") is False
    assert has_limit({"resources": "oops"}, "a") is False


def test_annotations_and_labels_of_malformed_objects_are_empty() -> None:
    assert annotations_of({"metadata": {"annotations": {"a": "b"}}}) == {"a": "b"}
    assert annotations_of({"metadata": {"annotations": None}}) == {}
    assert annotations_of({"metadata": []}) == {}
    assert labels_of({"metadata": {"labels": {"l": "v"}}}) == {"l": "v"}
    assert labels_of({}) == {}
    assert FitContext({"metadata": {"annotations": {"x": "y"}}}, node={}).annotations == {"x": "y"}


def test_custom_info_reads_the_canonical_text() -> None:
    info = GPUInfo("a", custom=custom_text({"b": 1.0, "a": "x"}))
    assert info.custom == '{"a":"x","b":1.0}'
    assert custom_info(info) == {"a": "x", "b": 1.0}
    assert custom_info(GPUInfo("a")) == {}
    assert custom_text({}) == "" and custom_text(None) == ""


def test_lock_annotations_are_hamis() -> None:
    def names(lock: LockKind) -> VendorNames:
        return VendorNames("EX", "example", "example.com/gpu", lock=lock)

    assert names(LockKind.MUTEX).lock_annotation == MUTEX_LOCK == "hami.io/mutex.lock"
    assert names(LockKind.DSMLU).lock_annotation == DSMLU_LOCK == "cambricon.com/dsmlu.lock"
    assert names(LockKind.NONE).lock_annotation == ""


def test_resources_lists_every_name_once_count_first() -> None:
    names = VendorNames("EX", "e", "e/c", memory="e/m", cores="e/c", extra_resources=("e/x", "e/m"))
    assert names.resources == ("e/c", "e/m", "e/x")


# --- Vendor's defaults ----------------------------------------------------------------------------------

NAMES = VendorNames(
    "EX", "example", "example.com/gpu", memory="example.com/mem", cores="example.com/cores",
    to_allocate="example.com/to-allocate", allocated="example.com/allocated",
)  # fmt: skip
DEFAULT = Vendor(NAMES)


def test_default_mutate_finds_the_count_in_limits_and_changes_nothing() -> None:
    container = {"resources": {"limits": {"example.com/gpu": "1"}}}
    assert DEFAULT.mutate(container, {}) == Admission(True)
    assert container == {"resources": {"limits": {"example.com/gpu": "1"}}}
    assert DEFAULT.mutate({"resources": {"requests": {"example.com/gpu": "1"}}}, {}) == Admission(False)


POD_CODING_GO = f"{DEVICES_GO} TestPodDevicesCoding"
S1 = GPUSlice("UUID1", 1000, 30, "Type1")


@pytest.mark.parametrize(
    ("containers", "text"),
    [
        pytest.param((), None, id=f'{POD_CODING_GO} "one pod one container use zero device"'),
        pytest.param(
            ((S1,),), "UUID1,Type1,1000,30:;", id=f'{POD_CODING_GO} "one pod one container use one device"'
        ),
        pytest.param(
            ((S1,), (S1,)),
            "UUID1,Type1,1000,30:;UUID1,Type1,1000,30:;",
            id=f'{POD_CODING_GO} "one pod two container, every container use one device"',
        ),
        pytest.param(
            ((S1, GPUSlice("UUID2", 1000, 30, "Type1")),),
            "UUID1,Type1,1000,30:UUID2,Type1,1000,30:;",
            id=f'{POD_CODING_GO} "one pod one container use two devices"',
        ),
        pytest.param(((), (S1,)), ";UUID1,Type1,1000,30:;", id="a leading container without devices"),
    ],
)
def test_default_pod_annotations_write_encode_pod_single_device_under_both_keys(
    containers: tuple[tuple[GPUSlice, ...], ...], text: str | None
) -> None:
    # The Go test round-trips EncodePodDevices / DecodePodDevices; the encoded side is what PatchAnnotations
    # writes (an empty PodSingleDevice writes nothing)
    devices = PodAllocation(tuple(ContainerAllocation(c) for c in containers))
    got = DEFAULT.pod_annotations({}, devices, node="n1", now=NOW.astimezone())
    assert got == ({} if text is None else {"example.com/to-allocate": text, "example.com/allocated": text})


def test_default_pod_annotations_without_a_to_allocate_key_write_the_allocated_one_only() -> None:
    vendor = Vendor(VendorNames("EX", "example", "example.com/gpu", allocated="example.com/allocated"))
    devices = PodAllocation((ContainerAllocation((S1,)),))
    assert vendor.pod_annotations({}, devices, node="n", now=NOW.astimezone()) == {
        "example.com/allocated": "UUID1,Type1,1000,30:;"
    }


def test_default_add_usage_and_score() -> None:
    before = GPUUsage(GPUInfo("a"), used=2, usedmem=10, usedcores=5)
    assert DEFAULT.add_usage(before, GPUSlice("a", 100, 20, "EX")) == GPUUsage(GPUInfo("a"), 3, 110, 25)
    assert DEFAULT.score_node({}, PodAllocation(), [before], "spread") == 0.0


def test_default_type_rule_without_type_keys_is_a_substring_of_the_device_type() -> None:
    dev = GPUUsage(GPUInfo("a", type="Vendor-EX-9"))
    assert DEFAULT.type_allowed({}, dev, DeviceRequest(1, "ex")) is True
    assert DEFAULT.type_allowed({}, dev, DeviceRequest(1, "EY")) is False


# --- standard.py: the common Fit's steps ---------------------------------------------------------------


def usage(uid: str = "d", **kw: Any) -> GPUUsage:
    fields = {"used": 0, "usedmem": 0, "usedcores": 0}
    info_kw = {k: v for k, v in kw.items() if k not in fields}
    info = GPUInfo(
        uid, **{"count": 10, "devmem": 1000, "devcore": 100, "type": "EX", "health": True, **info_kw}
    )
    return GPUUsage(info, **{k: v for k, v in kw.items() if k in fields})


@pytest.mark.parametrize(
    ("memreq", "pct", "devmem", "expected"),
    [
        pytest.param(300, 0, 1000, 300, id="MiB asked"),
        pytest.param(0, 100, 1000, 1000, id="100 % of the device"),
        pytest.param(0, 33, 1000, 330, id="a percentage, truncated"),
        pytest.param(0, 33, 1001, 330, id="1001 * 33 / 100 truncates to 330"),
        pytest.param(0, standard.UNSET_PERCENTAGE, 1000, 0, id="101: unset, no memory"),
        pytest.param(300, 50, 1000, 300, id="MiB win over a percentage"),
        pytest.param(
            -5, 50, 1000, 0, id="a negative memreq is no memory and no percentage (Go: Memreq != 0)"
        ),
    ],
)
def test_request_memory_is_memreq_else_a_percentage_of_the_device(
    memreq: int, pct: int, devmem: int, expected: int
) -> None:
    request = DeviceRequest(1, "EX", memreq=memreq, mem_percentage=pct)
    assert standard.request_memory(usage(devmem=devmem), request) == expected


@pytest.mark.parametrize(
    ("device", "memreq", "cores", "expected"),
    [
        pytest.param(usage(usedmem=900), 200, 0, standard.CARD_INSUFFICIENT_MEMORY, id="memory"),
        pytest.param(
            usage(usedmem=900, usedcores=90), 200, 20, standard.CARD_INSUFFICIENT_MEMORY, id="memory first"
        ),
        pytest.param(usage(usedcores=90), 0, 20, standard.CARD_INSUFFICIENT_CORE, id="cores"),
        pytest.param(
            usage(used=1), 0, 100, standard.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, id="100 cores on a used one"
        ),
        pytest.param(usage(used=1, devcore=200), 0, 100, None, id="100 of 200 cores are not exclusive"),
        pytest.param(
            usage(used=1, usedcores=100), 0, 0, standard.CARD_COMPUTE_UNITS_EXHAUSTED, id="cores all taken"
        ),
        pytest.param(usage(devcore=0), 0, 0, None, id="a device without cores takes a 0-core request"),
        pytest.param(usage(), 1000, 100, None, id="fits exactly"),
    ],
)
def test_capacity_reason_checks_memory_cores_exclusivity_in_hamis_order(
    device: GPUUsage, memreq: int, cores: int, expected: str | None
) -> None:
    assert standard.capacity_reason(device, memreq, cores) == expected


@pytest.mark.parametrize(
    ("device", "annotations", "policy", "expected"),
    [
        pytest.param(usage(health=False, type="OTHER"), {}, (), standard.CARD_NOT_HEALTH, id="health first"),
        pytest.param(usage(type="OTHER", used=10), {}, (), standard.CARD_TYPE_MISMATCH, id="then type"),
        pytest.param(usage("x", used=10), {"e/nouse": "x"}, (), standard.CARD_UUID_MISMATCH, id="then uuid"),
        pytest.param(
            usage(used=10), {}, (GPUPolicy.MUTEX,), standard.CARD_TIME_SLICING_EXHAUSTED, id="then slot"
        ),
        pytest.param(
            usage(used=1), {}, (GPUPolicy.MUTEX,), standard.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, id="mutex"
        ),
        pytest.param(usage(used=1), {}, (GPUPolicy.BINPACK,), None, id="a used device without mutex"),
    ],
)
def test_slot_reason_checks_health_type_uuid_slot_mutex_in_hamis_order(
    device: GPUUsage, annotations: dict[str, str], policy: tuple[GPUPolicy, ...], expected: str | None
) -> None:
    vendor = Vendor(VendorNames("EX", "example", "e/gpu", use_uuid="e/use", nouse_uuid="e/nouse"))
    context = FitContext({"metadata": {"annotations": annotations}}, policy=policy)
    assert standard.slot_reason(vendor, device, DeviceRequest(1, "EX"), context) == expected


class _Quota(Vendor):
    """A vendor with its own step before memory (as Cambricon's quota) and the device's Type in slices."""

    def extra_reason(
        self, device: GPUUsage, request: DeviceRequest, memreq: int, context: FitContext
    ) -> str | None:
        return standard.RESOURCE_QUOTA_NOT_FIT if memreq > 500 else None

    def slice_type(self, device: GPUUsage, request: DeviceRequest) -> str:
        return device.info.type


def test_standard_fit_runs_the_vendor_step_before_memory_and_writes_its_slice_type() -> None:
    vendor = _Quota(VendorNames("EX", "example", "e/gpu"))
    full = usage("c", devmem=600, usedmem=600)
    got = standard.standard_fit(vendor, [full], DeviceRequest(1, "EX", memreq=600), FitContext({}))
    assert got == Unfit({standard.RESOURCE_QUOTA_NOT_FIT: 1}, 1)  # the quota step, not the memory one
    devices: Sequence[GPUUsage] = [usage("a", type="EX-1", devmem=2000), usage("b", type="EX-2", devmem=400)]
    got = standard.standard_fit(vendor, devices, DeviceRequest(2, "EX", mem_percentage=100), FitContext({}))
    assert got == Unfit(
        {standard.RESOURCE_QUOTA_NOT_FIT: 1, standard.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1}, 2
    )
    got = standard.standard_fit(
        vendor, devices, DeviceRequest(2, "EX", memreq=300, coresreq=10), FitContext({})
    )
    assert got == Picked((GPUSlice("b", 300, 10, "EX-2"), GPUSlice("a", 300, 10, "EX-1")))


# --- config.py: device-config.yaml ----------------------------------------------------------------------


def test_the_charts_default_file_parses_with_every_section() -> None:
    config = parse_device_config(default_text(), "<chart>", with_defaults=False)
    assert set(config.top.value) == set(TOP_LEVEL_KEYS)
    hygon = config.section("hygon")
    assert dict(hygon.value) == {
        "resourceCountName": "hygon.com/dcunum", "resourceMemoryName": "hygon.com/dcumem",
        "resourceCoreName": "hygon.com/dcucores", "memoryFactor": 1,
    }  # fmt: skip
    assert [s.value["commonWord"] for s in config.sections("iluvatars")] == [
        "MR-V100",
        "MR-V50",
        "BI-V150",
        "BI-V100",
    ]
    vnpus = config.section("vnpus").sections("configs")
    assert [s.value["commonWord"] for s in vnpus] == [
        "Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4-1", "Ascend910B4", "Ascend310P",
        "Ascend910C",
    ]  # fmt: skip


def test_load_without_a_file_is_the_charts_defaults_alone() -> None:
    config = load_device_config(None, _read("never read"))
    assert config.file_given is False and config.defaults is None
    assert config.section("hygon").value["memoryFactor"] == 1
    assert config.given("hygon") is True


def test_a_file_section_wins_and_a_missing_one_falls_back_to_the_chart() -> None:
    config = load_device_config(Path("dc.yaml"), _read("hygon:\n  memoryFactor: 4\n"))
    assert config.file_given is True
    assert dict(config.section("hygon").value) == {"memoryFactor": 4}
    assert config.section("biren").value == {"resourceCountName": "birentech.com/gpu"}
    assert len(config.sections("iluvatars")) == 4
    assert config.given("hygon") and not config.given("biren")


def test_a_section_neither_file_nor_chart_has_is_empty() -> None:
    config = parse_device_config("hygon: {}\n", "dc.yaml", with_defaults=False)
    assert config.section("biren").value == {}
    assert config.sections("iluvatars") == []


def test_an_empty_file_is_no_section() -> None:
    config = parse_device_config("", "dc.yaml")
    assert config.top.value == {}
    assert config.section("hygon").value["resourceCountName"] == "hygon.com/dcunum"


def test_a_bad_value_names_file_key_line_and_value() -> None:
    config = load_device_config(Path("/etc/hami/dc.yaml"), _read("nvidia: {}\nhygon:\n  memoryFactor: two\n"))
    with pytest.raises(ConfigError) as err:
        config.section("hygon").integer("memoryFactor")
    assert (err.value.source, err.value.key, err.value.line, err.value.value) == (
        "/etc/hami/dc.yaml", "hygon.memoryFactor", 3, '"two"',
    )  # fmt: skip
    assert str(err.value).startswith("/etc/hami/dc.yaml line 3: hygon.memoryFactor: must be an integer")


def test_an_unknown_top_level_key_names_file_key_line_and_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        parse_device_config("hygon: {}\nbirne:\n  x: 1\n", "dc.yaml")
    assert (err.value.source, err.value.key, err.value.line) == ("dc.yaml", "birne", 2)
    assert 'did you mean "biren"' in err.value.reason


def test_an_unknown_key_inside_a_section_names_file_key_line_and_a_suggestion() -> None:
    config = parse_device_config("biren:\n  resourceCountName: a\n  resourcecountname: b\n", "dc.yaml")
    section = config.section("biren")
    assert section.text("resourceCountName") == "a"
    with pytest.raises(ConfigError) as err:
        section.finish()
    assert (err.value.source, err.value.key, err.value.line) == ("dc.yaml", "biren.resourcecountname", 3)
    assert 'did you mean "resourceCountName"' in err.value.reason


def test_an_unknown_key_in_a_list_item_names_its_index() -> None:
    text = "iluvatars:\n- chipName: A\n  commonWord: A\n- chipName: B\n  colour: red\n"
    (first, second) = parse_device_config(text, "dc.yaml").sections("iluvatars")
    first.text("chipName"), first.text("commonWord"), second.text("chipName")
    first.finish()
    with pytest.raises(ConfigError) as err:
        second.finish()
    assert (err.value.key, err.value.line) == ("iluvatars[1].colour", 5)


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        pytest.param("- hygon\n", "", None, id="not a mapping"),
        pytest.param("hygon: [\n", "", 2, id="not YAML"),
        pytest.param("hygon: {}\nhygon: {}\n", "hygon", 2, id="a key twice"),
    ],
)
def test_a_file_that_is_no_mapping_of_sections_is_refused(text: str, key: str, line: int | None) -> None:
    with pytest.raises(ConfigError) as err:
        parse_device_config(text, "dc.yaml")
    assert (err.value.source, err.value.key) == ("dc.yaml", key)
    if line is not None:
        assert err.value.line == line


def test_an_unreadable_file_names_the_path() -> None:
    def missing(path: Path) -> str:
        raise FileNotFoundError(2, "No such file or directory", str(path))

    with pytest.raises(ConfigError) as err:
        load_device_config(Path("/nope/dc.yaml"), missing)
    assert str(err.value) == "/nope/dc.yaml: cannot be read: No such file or directory"

    def binary(path: Path) -> str:
        return b"\xff".decode()

    with pytest.raises(ConfigError) as err:
        load_device_config(Path("/bin/dc.yaml"), binary)
    assert err.value.source == "/bin/dc.yaml" and "not UTF-8" in err.value.reason


def _section(yaml_text: str) -> Any:
    return parse_device_config(f"hygon:\n{yaml_text}", "dc.yaml").section("hygon")


@pytest.mark.parametrize(
    ("yaml_text", "getter", "expected"),
    [
        pytest.param("  k: name\n", "text", "name", id="text"),
        pytest.param("  k: 12\n", "text", "12", id="a number as text"),
        pytest.param("  k: 5\n", "integer", 5, id="integer"),
        pytest.param("  k: true\n", "boolean", True, id="boolean"),
        pytest.param('  k: "false"\n', "boolean", False, id="a quoted boolean, as the chart writes some"),
        pytest.param("  k: [a, b]\n", "strings", ["a", "b"], id="strings"),
        pytest.param("  other: 1\n", "text", "", id="absent text is the default"),
        pytest.param("  k: null\n", "integer", 0, id="null is absent"),
    ],
)
def test_section_getters_read_their_type(yaml_text: str, getter: str, expected: Any) -> None:
    assert getattr(_section(yaml_text), getter)("k") == expected


@pytest.mark.parametrize(
    ("yaml_text", "call", "reason"),
    [
        pytest.param("  k: true\n", lambda s: s.text("k"), "must be a string", id="text: a boolean"),
        pytest.param("  k: [a]\n", lambda s: s.text("k"), "must be a string", id="text: a list"),
        pytest.param("  k: true\n", lambda s: s.integer("k"), "must be an integer", id="integer: a boolean"),
        pytest.param("  k: 1.5\n", lambda s: s.integer("k"), "must be an integer", id="integer: a float"),
        pytest.param("  k: 0\n", lambda s: s.integer("k", low=1), "must be >= 1", id="integer: below low"),
        pytest.param("  k: 9\n", lambda s: s.integer("k", high=8), "must be <= 8", id="integer: above high"),
        pytest.param(
            "  k: yes please\n", lambda s: s.boolean("k"), "must be true or false", id="boolean: text"
        ),
        pytest.param("  k: x\n", lambda s: s.section("k"), "must be a mapping", id="section: a string"),
        pytest.param("  k: x\n", lambda s: s.sections("k"), "must be a list", id="sections: a string"),
        pytest.param(
            "  k: [1]\n", lambda s: s.sections("k"), "item 0 must be a mapping", id="sections: an item"
        ),
        pytest.param(
            "  k: [1]\n", lambda s: s.strings("k"), "must be a list of strings", id="strings: a number"
        ),
    ],
)
def test_section_getters_refuse_the_wrong_type_naming_key_and_line(
    yaml_text: str, call: Any, reason: str
) -> None:
    with pytest.raises(ConfigError) as err:
        call(_section(yaml_text))
    assert (err.value.key, err.value.line) == ("hygon.k", 2)
    assert err.value.reason.startswith(reason)


def test_device_config_is_a_plain_value() -> None:
    config = parse_device_config("hygon: {}\n", "dc.yaml")
    assert isinstance(config, DeviceConfig) and config.source == "dc.yaml"
