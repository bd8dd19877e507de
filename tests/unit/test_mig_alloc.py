"""hami_api.mig_alloc: HAMi v2.10's `hami.io/vgpu-mig-allocations` codec, its profile and placement
choice, and the MIG profile allowlist check.

Transcribed from HAMi v2.10.0 (commit 4707fb02):
- pkg/device/nvidia/mig_profiles_test.go: TestValidateMigProfileAllowlist,
  TestEncodeDecodeMigAllocations, TestDecodeMigAllocationsRejectsDuplicateDeviceIndex,
  TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs,
  TestDecodeMigAllocationsRejectsPartialRuntimeIdentity.
- pkg/device/nvidia/mig_topology_test.go: TestCanPlaceMigProfilesA100,
  TestSelectMigPlacementUsesBalancedPacking.
- pkg/device/devices_test.go: TestMigProfileUsesCompactWireFormat (through the register codec).
- pkg/device/nvidia/device_test.go: TestGetNodeDevices_MigProfilesFromNode (through the register codec).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_node_register, encode_node_register
from hami_api.errors import WireFormatError
from hami_api.mig_alloc import (
    MIG_ALLOCATIONS,
    AllowedMigProfiles,
    MigAllocation,
    MigAllowlistError,
    allowed_profiles_for,
    can_place_mig_profiles,
    decode_mig_allocations,
    encode_mig_allocations,
    parse_mig_profile_allowlist,
    replay_mig,
    select_mig_candidate,
    select_mig_placement,
    validate_mig_profile_allowlist,
)
from hami_api.settings import ConfigError
from hami_api.types import GPUInfo, MigPlacement, MigProfile
from hami_control.devices.config import default_text, parse_device_config
from hami_control.devices.nvidia import mig_profile_allowlist
from hami_control.devices.registry import build_registry


def _placements(starts: range | tuple[int, ...], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(s, size) for s in starts)


# HAMi mig_topology_test.go's A100 profiles (placements only) and mig_capability_test.go's a100MigProfiles.
A100 = (
    MigProfile("1g.5gb", 5120, 14, 1, _placements(range(7), 1)),
    MigProfile("2g.10gb", 10240, 28, 2, _placements((0, 2, 4), 2)),
    MigProfile("3g.20gb", 20480, 42, 3, _placements((0, 4), 4)),
)


# --- the annotation codec ---------------------------------------------------------------------------------


def test_encode_then_decode_returns_the_reservation_hami_encodes() -> None:
    # mig_profiles_test.go TestEncodeDecodeMigAllocations
    one = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1))
    raw = encode_mig_allocations([one])
    assert raw == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}}]'
    )
    assert decode_mig_allocations(raw) == (one,)


def test_encode_of_no_reservation_is_empty_so_no_annotation_is_written() -> None:
    # mig_allocations.go EncodeMigAllocations: len(out) == 0 -> "", false
    assert encode_mig_allocations([]) == ""
    assert decode_mig_allocations("") == ()
    assert decode_mig_allocations("null") == ()
    assert decode_mig_allocations("[]") == ()


def test_decode_rejects_a_duplicate_container_and_device_index() -> None:
    # mig_profiles_test.go TestDecodeMigAllocationsRejectsDuplicateDeviceIndex
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
        '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    with pytest.raises(WireFormatError, match="duplicate MIG allocation for container 0 device 0") as err:
        decode_mig_allocations(raw)
    assert err.value.annotation == MIG_ALLOCATIONS
    assert err.value.position == "allocation 1"


def test_decode_keeps_a_zero_runtime_instance_id() -> None:
    # mig_profiles_test.go TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-a","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    (got,) = decode_mig_allocations(raw)
    assert (got.gpu_instance_id, got.compute_instance_id, got.mig_uuid) == (4, 0, "MIG-a")
    assert got.runtime_ready
    assert encode_mig_allocations([got]) == raw


def test_decode_rejects_a_partial_runtime_identity() -> None:
    # mig_profiles_test.go TestDecodeMigAllocationsRejectsPartialRuntimeIdentity
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-a"}]'
    )
    with pytest.raises(WireFormatError, match="MIG allocation 0 has partial runtime identity"):
        decode_mig_allocations(raw)


_BASE = '"gpuUUID":"GPU-a","profile":"1g.5gb"'
_AT = '"placement":{"start":0,"size":1}'
_IDX = '"containerIndex":0,"deviceIndex":0'


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (f'{{"containerIndex":-1,"deviceIndex":0,{_BASE},{_AT}}}', "incomplete"),
        (f'{{"containerIndex":0,"deviceIndex":-1,{_BASE},{_AT}}}', "incomplete"),
        (f'{{{_IDX},"gpuUUID":"","profile":"1g.5gb",{_AT}}}', "incomplete"),
        (f'{{{_IDX},"gpuUUID":"GPU-a",{_AT}}}', "incomplete"),
        (f'{{{_IDX},{_BASE},"placement":{{"start":0,"size":0}}}}', "incomplete"),
        (f"{{{_IDX},{_BASE}}}", "incomplete"),
        ("null", "incomplete"),
        (f'{{{_IDX},{_BASE},{_AT},"gpuInstanceID":1,"computeInstanceID":0}}', "partial runtime identity"),
        (f'{{"containerIndex":"0","deviceIndex":0,{_BASE},{_AT}}}', "is not an integer"),
        (f'{{{_IDX},{_BASE},"placement":{{"start":-1,"size":1}}}}', "must not be negative"),
        (
            f'{{{_IDX},{_BASE},{_AT},"migUUID":"MIG-a","gpuInstanceID":-4,"computeInstanceID":0}}',
            "must not be negative",
        ),
    ],
)
def test_decode_rejects_what_hami_rejects_naming_the_entry(entry: str, why: str) -> None:
    # mig_allocations.go DecodeMigAllocations: "MIG allocation %d is incomplete" (negative index, empty
    # uuid or profile, size 0), partial runtime identity; Go's json.Unmarshal type errors.
    with pytest.raises(WireFormatError, match=why) as err:
        decode_mig_allocations(f"[{entry}]")
    assert err.value.annotation == MIG_ALLOCATIONS
    assert "allocation 0" in err.value.position


@pytest.mark.parametrize("text", ["{", "{}", '"x"', "[1]"])
def test_decode_rejects_text_that_is_not_a_list_of_objects(text: str) -> None:
    with pytest.raises(WireFormatError):
        decode_mig_allocations(text)


def test_encode_refuses_an_entry_hami_would_not_decode() -> None:
    with pytest.raises(ValueError, match="incomplete"):
        encode_mig_allocations([MigAllocation(0, 0, "", "1g.5gb", MigPlacement(0, 1))])
    with pytest.raises(ValueError, match="partial runtime identity"):
        encode_mig_allocations([MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(0, 1), mig_uuid="MIG-a")])


_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
_allocation = st.builds(
    MigAllocation,
    container_index=st.integers(0, 20),
    device_index=st.integers(0, 20),
    gpu_uuid=_names,
    profile=_names,
    placement=st.builds(MigPlacement, st.integers(0, 2**32 - 1), st.integers(1, 2**32 - 1)),
)


@given(
    st.lists(_allocation, max_size=6, unique_by=lambda a: (a.container_index, a.device_index)), st.booleans()
)
def test_encode_decode_round_trips_and_is_valid_json(
    allocations: list[MigAllocation], realised: bool
) -> None:
    if realised:
        allocations = [
            MigAllocation(
                a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement, "MIG-x", i, 0
            )
            for i, a in enumerate(allocations)
        ]
    raw = encode_mig_allocations(allocations)
    assert decode_mig_allocations(raw) == tuple(allocations)
    if raw:
        assert isinstance(json.loads(raw), list)


# --- the register's MIG profiles ------------------------------------------------------------------------


def test_mig_profile_uses_hamis_compact_wire_form() -> None:
    # devices_test.go TestMigProfileUsesCompactWireFormat (instanceCount is json:"-")
    gpu = GPUInfo(
        "GPU-0", count=7, devmem=40960, devcore=100, mode="mig",
        mig_profiles=(MigProfile("1g.5gb", 4864, 15, 1, (MigPlacement(6, 1),)),),
    )  # fmt: skip
    raw = encode_node_register([gpu])
    want = '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'
    assert f'"migProfiles":[{want}]' in raw
    assert decode_node_register(raw) == (gpu,)


def test_register_mig_profiles_decode_with_hamis_extra_keys_ignored() -> None:
    # device_test.go TestGetNodeDevices_MigProfilesFromNode
    raw = (
        '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":0,"health":true,'
        '"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"instanceCount":7,'
        '"multiprocessorCount":14,"placements":[{"start":6,"size":1}]}]}]'
    )
    (gpu,) = decode_node_register(raw)
    assert gpu.mode == "mig"
    assert [p.name for p in gpu.mig_profiles] == ["1g.5gb"]
    assert gpu.mig_profiles[0].placements == (MigPlacement(6, 1),)


# --- placement choice ----------------------------------------------------------------------------------


def test_can_place_a100_balanced_geometry_and_rejects_overlaps() -> None:
    # mig_topology_test.go TestCanPlaceMigProfilesA100, its four sub-cases in order
    assert can_place_mig_profiles(A100, [], ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    assert can_place_mig_profiles(A100, [MigPlacement(4, 4)], ["2g.10gb", "1g.5gb", "1g.5gb"])
    assert not can_place_mig_profiles(A100, [MigPlacement(0, 4), MigPlacement(4, 4)], ["1g.5gb"])
    occupied = [MigPlacement(0, 2), MigPlacement(2, 2), MigPlacement(4, 2)]
    assert not can_place_mig_profiles(A100, occupied, ["2g.10gb"])


def test_can_place_nothing_requested_is_always_feasible() -> None:
    assert can_place_mig_profiles(A100, [MigPlacement(0, 8)], [])


def test_select_placement_packs_1g_and_3g_high_and_others_low() -> None:
    # mig_topology_test.go TestSelectMigPlacementUsesBalancedPacking: 3g -> 4, 2g -> 0, 1g -> 3, 1g -> 2
    occupied: list[MigPlacement] = []
    for profile, start in (("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 3), ("1g.5gb", 2)):
        placement = select_mig_placement(A100, occupied, profile)
        assert placement is not None
        assert placement.start == start, profile
        occupied.append(placement)


def test_select_placement_of_an_unknown_profile_is_none() -> None:
    assert select_mig_placement(A100, [], "7g.40gb") is None


def test_select_candidate_takes_the_smallest_profile_with_enough_memory() -> None:
    # device.go selectMigCandidate; mig_capability_test.go
    # TestAddResourceUsageUsesReportedProfileAndPlacement: 10000 MiB -> 2g.10gb at {0,2}
    pick = select_mig_candidate(A100, [], 10000)
    assert pick is not None
    assert (pick[0].name, pick[1]) == ("2g.10gb", MigPlacement(0, 2))


def test_select_candidate_moves_to_a_bigger_profile_when_the_smaller_has_no_free_placement() -> None:
    occupied = [MigPlacement(s, 1) for s in range(7)]
    assert select_mig_candidate(A100, occupied, 1) is None
    pick = select_mig_candidate(A100, [MigPlacement(s, 1) for s in (6, 5, 4, 3)], 1)
    assert pick is not None
    assert pick[0].name == "1g.5gb"
    assert pick[1] == MigPlacement(2, 1)


def test_replay_places_each_request_after_the_ones_before() -> None:
    # device.go CustomFilterRule: queued entries on this GPU are replayed before the request
    got = replay_mig(A100, [], [20000, 20000])
    assert got is not None
    assert [(p.name, at) for p, at in got] == [
        ("3g.20gb", MigPlacement(4, 4)),
        ("3g.20gb", MigPlacement(0, 4)),
    ]
    assert replay_mig(A100, [], [20000, 20000, 1]) is None


# --- the allowlist ---------------------------------------------------------------------------------------


def test_validate_allowlist_accepts_models_with_profiles_and_rejects_missing_profiles() -> None:
    # mig_profiles_test.go TestValidateMigProfileAllowlist
    validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), ("1g.5gb", "2g.10gb"))])
    with pytest.raises(MigAllowlistError, match="must define models and profiles"):
        validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), ())])


@pytest.mark.parametrize("profile", ["1g", "g.5gb", "1x.5gb", "", ".5gb"])
def test_validate_allowlist_rejects_a_profile_not_of_the_form_ng_dot(profile: str) -> None:
    # mig_profiles.go ValidateMigProfileAllowlist: `invalid MIG profile %q`
    with pytest.raises(MigAllowlistError, match=r"\[0\]\.profiles: invalid MIG profile"):
        validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), (profile,))])


def test_parse_allowlist_names_the_field_of_a_wrong_shape() -> None:
    with pytest.raises(MigAllowlistError, match=r"nvidia.migProfileAllowlist\[0\].models: must be a list"):
        parse_mig_profile_allowlist([{"models": "A100", "profiles": ["1g.5gb"]}])
    with pytest.raises(MigAllowlistError, match="unknown key 'profile'"):
        parse_mig_profile_allowlist([{"models": ["A100"], "profile": ["1g.5gb"]}])
    with pytest.raises(MigAllowlistError, match="must be a list"):
        parse_mig_profile_allowlist({"models": ["A100"]})
    assert parse_mig_profile_allowlist(None) == ()


def test_allowlist_model_match_is_hamis_substring_first_entry_wins() -> None:
    # mig_profiles.go / plugin: strings.Contains(nvmlName, model), first entry wins. Real NVML names such as
    # "NVIDIA H100 80GB HBM3" contain none of the chart's "H100-SXM5-80GB" spellings (documented difference).
    entries = parse_mig_profile_allowlist(
        [
            {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb"]},
            {"models": ["A100"], "profiles": ["7g.40gb"]},
            {"models": ["H100-SXM5-80GB"], "profiles": ["1g.10gb"]},
        ]
    )
    assert allowed_profiles_for(entries, "NVIDIA A100-SXM4-40GB") == ("1g.5gb",)
    assert allowed_profiles_for(entries, "NVIDIA A100-PCIE-80GB") == ("7g.40gb",)
    assert allowed_profiles_for(entries, "NVIDIA H100 80GB HBM3") == ()


# --- the device config (hami_control.devices) ----------------------------------------------------


def test_the_shipped_device_config_allowlist_passes_hamis_check() -> None:
    config = parse_device_config(default_text(), "device-config.yaml")
    entries = mig_profile_allowlist(config.section("nvidia"))
    assert ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb") in [e.profiles for e in entries]
    build_registry(config)


@pytest.mark.parametrize(
    ("entry", "where", "why"),
    [
        (
            "{models: [A100], profiles: [1g]}",
            "nvidia.migProfileAllowlist[0].profiles[0]",
            "invalid MIG profile",
        ),
        ("{models: [A100]}", "nvidia.migProfileAllowlist[0]", "must define models and profiles"),
        ("{models: A100, profiles: [1g.5gb]}", "nvidia.migProfileAllowlist[0].models", "list of strings"),
        ("{model: [A100], profiles: [1g.5gb]}", "nvidia.migProfileAllowlist[0].model", "not a known key"),
    ],
)
def test_a_bad_allowlist_in_the_device_config_is_refused_naming_the_entry(
    entry: str, where: str, why: str
) -> None:
    # HAMi: InitNvidiaDevice klog.Fatalf("invalid MIG profile allowlist: %v")
    config = parse_device_config(
        f"nvidia:\n  migProfileAllowlist:\n  - {entry}\n", "dc.yaml", with_defaults=False
    )
    with pytest.raises(ConfigError) as err:
        build_registry(config)
    assert where in str(err.value)
    assert why in str(err.value)
