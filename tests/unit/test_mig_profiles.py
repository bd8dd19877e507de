"""hami_api.mig: placements, the profile tables, go-nvlib's profile names, HAMi's helpers.

Transcribed upstream tests (go-nvlib pkg/nvlib/device/mig_profile_test.go):
- TestParseMigProfile: every sub-case, both columns (validFormat: parse_profile_name; validDevice: the
  parsed profile matches one of the profiles go-nvlib's mock device offers, through visit_profile_names).
- TestParseMigProfileEquals: every sub-case, on the parsed C/G/GB/attributes (go-nvlib also compares
  the GI/CI/engine IDs of the matched device profile; the names here carry the same information).
- TestGetMigMemorySizeGB: every generated case (24, 40 and 80 GiB, steps of 1/32 GiB).
HAMi v2.10 register.go: the A100 core percentages 15/29/43/58/100; mig_topology_test.go
TestCanPlaceMigProfilesA100's placements.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.mig import (
    A30_24GB,
    A100_SXM4_40GB,
    A100_SXM4_80GB,
    GI_1_SLICE,
    GI_1_SLICE_ALL_ME,
    GI_1_SLICE_GFX,
    GI_1_SLICE_NO_ME,
    GI_1_SLICE_REV1,
    GI_1_SLICE_REV2,
    GI_2_SLICE,
    GI_2_SLICE_ALL_ME,
    GI_2_SLICE_GFX,
    GI_2_SLICE_NO_ME,
    GI_2_SLICE_REV1,
    GI_3_SLICE,
    GI_4_SLICE,
    GI_4_SLICE_GFX,
    GI_7_SLICE,
    H100_80GB,
    H200_141GB,
    MIG_MODELS,
    ParsedProfile,
    Placement,
    ci_profile_enum_for,
    hami_core_percent,
    mig_memory_size_gb,
    mig_model,
    parse_profile_name,
    profile_name,
    visit_profile_names,
)
from hami_api.types import MigPlacement

GIB = 1024**3
MIB = 1024**2

# --- Placement -------------------------------------------------------------------------------------


def test_placements_overlap_when_they_share_a_slice() -> None:
    assert Placement(0, 4).overlaps(Placement(3, 1))
    assert Placement(4, 4).overlaps(Placement(0, 8))
    assert not Placement(0, 2).overlaps(Placement(2, 2))
    assert not Placement(6, 1).overlaps(Placement(4, 2))
    assert Placement(2, 2).overlaps(MigPlacement(3, 1))


@given(st.integers(0, 10), st.integers(1, 8), st.integers(0, 10), st.integers(1, 8))
def test_overlap_is_symmetric_and_equals_sharing_a_slice(a: int, asize: int, b: int, bsize: int) -> None:
    p, q = Placement(a, asize), Placement(b, bsize)
    assert p.overlaps(q) == q.overlaps(p) == bool(set(p.slices()) & set(q.slices()))


def test_placement_slices_and_wire_round_trip() -> None:
    assert list(Placement(4, 4).slices()) == [4, 5, 6, 7]
    assert Placement(2, 2).wire() == MigPlacement(2, 2)
    assert Placement.of(MigPlacement(6, 1)) == Placement(6, 1)
    assert str(Placement(0, 8)) == "{0,8}"


def test_placement_rejects_negative_start_and_empty_size_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"placement start: .* got -1"):
        Placement(-1, 1)
    with pytest.raises(ValueError, match=r"placement size: .* got 0"):
        Placement.of(MigPlacement(0, 0))


# --- the tables ------------------------------------------------------------------------------------


def test_a100_40gb_profiles_ids_memory_sms_and_placements_are_the_real_ones() -> None:
    rows = [
        (p.name, p.profile_id, p.nvml_enum, p.slices, p.instance_count, p.memory_mib, p.multiprocessors)
        for p in A100_SXM4_40GB.profiles
    ]
    assert rows == [
        ("1g.5gb", 19, GI_1_SLICE, 1, 7, 4864, 14),
        ("1g.5gb+me", 20, GI_1_SLICE_REV1, 1, 1, 4864, 14),
        ("1g.10gb", 15, GI_1_SLICE_REV2, 1, 4, 9856, 14),
        ("2g.10gb", 14, GI_2_SLICE, 2, 3, 9856, 28),
        ("3g.20gb", 9, GI_3_SLICE, 3, 2, 19968, 42),
        ("4g.20gb", 5, GI_4_SLICE, 4, 1, 19968, 56),
        ("7g.40gb", 0, GI_7_SLICE, 7, 1, 40192, 98),
    ]
    placements = {p.name: [(x.start, x.size) for x in p.placements] for p in A100_SXM4_40GB.profiles}
    # HAMi mig_topology_test.go TestCanPlaceMigProfilesA100 (1g, 2g, 3g) and -lgipp (the rest).
    assert placements["1g.5gb"] == [(i, 1) for i in range(7)]
    assert placements["2g.10gb"] == [(0, 2), (2, 2), (4, 2)]
    assert placements["3g.20gb"] == [(0, 4), (4, 4)]
    assert placements["1g.10gb"] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert placements["4g.20gb"] == [(0, 4)]
    assert placements["7g.40gb"] == [(0, 8)]
    seven = A100_SXM4_40GB.profile("7g.40gb")
    assert seven is not None
    engines = (seven.copy_engines, seven.decoders, seven.encoders, seven.jpeg_engines, seven.ofa_engines)
    assert engines == (7, 5, 0, 1, 1)


def test_profile_names_per_model_are_the_ones_nvidia_smi_and_hamis_chart_use() -> None:
    def names(model_name: str) -> list[str]:
        model = mig_model(model_name)
        assert model is not None
        return [p.name for p in model.profiles]

    assert names("NVIDIA A100-SXM4-80GB") == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    assert names("NVIDIA H100 80GB HBM3") == names("NVIDIA A100-SXM4-80GB")
    assert names("NVIDIA H200") == [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]
    assert names("NVIDIA A30") == ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]
    assert names(" NVIDIA A100-PCIE-40GB ") == names("NVIDIA A100-SXM4-40GB")


def test_every_table_name_is_go_nvlibs_name_for_its_memory() -> None:
    for model in MIG_MODELS.values():
        for p in model.profiles:
            assert profile_name(p.nvml_enum, p.memory_mib, model.memory_bytes) == p.name, (model.name, p)


def test_every_placement_fits_the_model_and_instance_counts_fit_the_placements() -> None:
    for model in MIG_MODELS.values():
        assert {p.name for p in model.profiles} == set(model._by_name)
        for p in model.profiles:
            assert p.placements, (model.name, p.name)
            for placement in p.placements:
                assert placement.start + placement.size <= model.memory_slices, (model.name, p.name)
            disjoint = _most_disjoint(p.placements)
            assert p.instance_count <= disjoint, (model.name, p.name)


def _most_disjoint(placements: tuple[Placement, ...]) -> int:
    taken: list[Placement] = []
    for placement in sorted(placements):
        if not any(placement.overlaps(t) for t in taken):
            taken.append(placement)
    return len(taken)


def test_a30_has_four_memory_slices_and_the_real_lgip_ids() -> None:
    assert A30_24GB.memory_slices == 4
    assert [(p.name, p.profile_id) for p in A30_24GB.profiles] == [
        ("1g.6gb", 14),
        ("1g.6gb+me", 21),
        ("2g.12gb", 5),
        ("2g.12gb+me", 6),
        ("4g.24gb", 0),
    ]


def test_hopper_memory_and_sms_are_lgips_not_go_nvmls_mock() -> None:
    seven = H100_80GB.profile("7g.80gb")
    rev2 = H200_141GB.profile("1g.35gb")
    assert seven is not None and rev2 is not None
    assert (seven.memory_mib, seven.multiprocessors, seven.copy_engines, seven.decoders) == (81152, 132, 8, 7)
    assert seven.placements == (Placement(0, 8),)
    assert (rev2.memory_mib, rev2.multiprocessors) == (33024, 26)


def test_model_lookups_by_name_id_and_enum() -> None:
    assert mig_model("NVIDIA T4") is None
    assert A100_SXM4_40GB.profile("9g.99gb") is None
    p = A100_SXM4_40GB.profile_by_id(9)
    assert p is not None and p.name == "3g.20gb"
    assert A100_SXM4_40GB.profile_by_id(99) is None
    q = A100_SXM4_80GB.profile_by_enum(GI_1_SLICE_REV2)
    assert q is not None and q.name == "1g.20gb"
    assert A30_24GB.profile_by_enum(GI_3_SLICE) is None
    assert p.placement_at(4) == Placement(4, 4)
    assert p.placement_at(2) is None


def test_attributes_and_base_profiles() -> None:
    me = A100_SXM4_40GB.profile("1g.5gb+me")
    base = A100_SXM4_40GB.profile("1g.10gb")
    assert me is not None and base is not None
    assert me.attributes == ("me",) and not me.is_base
    assert base.attributes == () and base.is_base


# --- HAMi's helpers ----------------------------------------------------------------------------------


def test_hami_core_percent_on_a100_is_15_29_43_58_100() -> None:
    full = A100_SXM4_40GB.mig_full_sm
    assert full == 98
    got = {p.name: hami_core_percent(p, full) for p in A100_SXM4_40GB.profiles if p.is_base}
    assert got == {"1g.5gb": 15, "1g.10gb": 15, "2g.10gb": 29, "3g.20gb": 43, "4g.20gb": 58, "7g.40gb": 100}


def test_hami_core_percent_rejects_a_zero_full_sm() -> None:
    with pytest.raises(ValueError, match=r"full_sm: .* got 0"):
        hami_core_percent(A100_SXM4_40GB.profiles[0], 0)


def test_ci_profile_enum_for_each_slice_count() -> None:
    assert [ci_profile_enum_for(s) for s in (1, 2, 3, 4, 6, 7, 8)] == [0, 1, 2, 3, 6, 4, 5]
    with pytest.raises(ValueError, match="no compute instance profile has 5 slices"):
        ci_profile_enum_for(5)


# --- go-nvlib: names -----------------------------------------------------------------------------------


def test_profile_name_attributes_follow_the_gi_enum() -> None:
    total = 40 * GIB
    assert profile_name(GI_1_SLICE, 5 * 1024, total) == "1g.5gb"
    assert profile_name(GI_1_SLICE_REV1, 5 * 1024, total) == "1g.5gb+me"
    assert profile_name(GI_1_SLICE_ALL_ME, 5 * 1024, total) == "1g.5gb+me.all"
    assert profile_name(GI_1_SLICE_GFX, 5 * 1024, total) == "1g.5gb+gfx"
    assert profile_name(GI_1_SLICE_NO_ME, 5 * 1024, total) == "1g.5gb-me"
    assert profile_name(GI_2_SLICE_REV1, 10 * 1024, total) == "2g.10gb+me"
    assert profile_name(GI_2_SLICE_ALL_ME, 10 * 1024, total) == "2g.10gb+me.all"
    assert profile_name(GI_2_SLICE_GFX, 10 * 1024, total) == "2g.10gb+gfx"
    assert profile_name(GI_2_SLICE_NO_ME, 10 * 1024, total) == "2g.10gb-me"
    assert profile_name(GI_4_SLICE_GFX, 20 * 1024, total) == "4g.20gb+gfx"
    assert profile_name(GI_1_SLICE_REV2, 10 * 1024, total) == "1g.10gb"
    assert profile_name(GI_3_SLICE, 20 * 1024, total, ci_enum=0) == "1c.3g.20gb"
    assert profile_name(GI_4_SLICE, 20 * 1024, total, ci_enum=1) == "2c.4g.20gb"


def test_profile_name_rejects_unknown_enums() -> None:
    with pytest.raises(ValueError, match="invalid GPU Instance Profile ID: 99"):
        profile_name(99, 1, GIB)
    with pytest.raises(ValueError, match="invalid Compute Instance Profile ID: 42"):
        profile_name(GI_1_SLICE, 1, GIB, ci_enum=42)


def test_memory_rounding_is_gos_half_away_from_zero() -> None:
    # H200's 3g: 71168 MiB of 143771 MiB is 4/8 of 141 GiB = 70.5; Python's round() gives 70.
    assert mig_memory_size_gb(143771 * MIB, 71168) == 71


def _memory_cases() -> list[tuple[int, int, int]]:
    """go-nvlib TestGetMigMemorySizeGB's generator: (total bytes, MIG MiB, expected GB)."""
    cases = []
    for total in (24 * GIB, 40 * GIB, 80 * GIB):
        slice_size = total // 8
        step = GIB // 32
        i = step
        while i <= total:
            expected = 0
            j = slice_size
            while j <= total:
                if i <= j:
                    expected = j // GIB
                    break
                j += slice_size
            cases.append((total, i // MIB, expected))
            i += step
    return cases


def test_get_mig_memory_size_gb_every_go_nvlib_case() -> None:
    cases = _memory_cases()
    assert len(cases) == (24 + 40 + 80) * 32
    for total, mib, expected in cases:
        assert mig_memory_size_gb(total, mib) == expected, (total, mib)


# --- go-nvlib: parsing -----------------------------------------------------------------------------------

# go-nvlib TestParseMigProfile: (description, profile, validFormat, validDevice).
PARSE_CASES = [
    ("Empty device type", "", False, False),
    ("Valid 1g.5gb", "1g.5gb", True, True),
    ("Valid 1c.1g.5gb", "1c.1g.5gb", True, True),
    ("Valid 1g.5gb+me", "1g.5gb+me", True, True),
    ("Valid 1c.1g.5gb+me", "1c.1g.5gb+me", True, True),
    ("Valid 1c.1g.5gb-me", "1c.1g.5gb-me", True, True),
    ("Valid 1g.5gb+me.all", "1g.5gb+me.all", True, True),
    ("Valid 1c.1g.5gb+me.all", "1c.1g.5gb+me.all", True, True),
    ("Valid 1g.5gb+gfx", "1g.5gb+gfx", True, True),
    ("Valid 1c.1g.5gb+gfx", "1c.1g.5gb+gfx", True, True),
    ("Invalid 0g.0gb", "0g.0gb", True, False),
    ("Invalid 0c.0g.0gb", "0c.0g.0gb", True, False),
    ("Invalid 10000g.500000gb", "10000g.500000gb", True, False),
    ("Invalid 10000c.10000g.500000gb", "10000c.10000g.500000gb", True, False),
    ("Invalid ' 1c.1g.5gb'", " 1c.1g.5gb", False, False),
    ("Invalid '1 c.1g.5gb'", "1 c.1g.5gb", False, False),
    ("Invalid '1c .1g.5gb'", "1c .1g.5gb", False, False),
    ("Invalid '1c. 1g.5gb'", "1c. 1g.5gb", False, False),
    ("Invalid '1c.1 g.5gb'", "1c.1 g.5gb", False, False),
    ("Invalid '1c.1g .5gb'", "1c.1g .5gb", False, False),
    ("Invalid '1c.1g. 5gb'", "1c.1g. 5gb", False, False),
    ("Invalid '1c.1g.5 gb'", "1c.1g.5 gb", False, False),
    ("Invalid '1c.1g.5g b'", "1c.1g.5g b", False, False),
    ("Invalid '1c.1g.5gb '", "1c.1g.5gb ", False, False),
    ("Invalid '1c . 1g . 5gb'", "1c . 1g . 5gb", False, False),
    ("Invalid 1c.f1g.5gb", "1c.f1g.5gb", False, False),
    ("Invalid 1r.1g.5gb", "1r.1g.5gb", False, False),
    ("Invalid 1g.5gbk", "1g.5gbk", False, False),
    ("Invalid 1g.5", "1g.5", False, False),
    ("Invalid g.5gb", "g.5gb", False, False),
    ("Invalid 1g.gb", "1g.gb", False, False),
    ("Invalid 1g.5gb+me,me", "1g.5gb+me,me", False, False),
    ("Invalid 1g.5gb+me,you,them", "1g.5gb+me,you,them", True, False),
    ("Invalid 1c.1g.5gb+me,you,them", "1c.1g.5gb+me,you,them", True, False),
    ("Invalid 1g.5gb+", "1g.5gb+", False, False),
    ("Invalid 1g.5gb +", "1g.5gb +", False, False),
    ("Invalid 1g.5gb+ ", "1g.5gb+ ", False, False),
    ("Invalid 1g.5gb+ ,", "1g.5gb+ ,", False, False),
    ("Invalid 1g.5gb+,,", "1g.5gb+,,", False, False),
    ("Invalid 1g.5gb+me,", "1g.5gb+me,", False, False),
    ("Invalid 1g.5gb+me,,", "1g.5gb+me,,", False, False),
    ("Invalid 1g.5gb+me, ", "1g.5gb+me, ", False, False),
    ("Invalid 1g.5gb+2me", "1g.5gb+2me", False, False),
    ("Inavlid 1g.5gb*me", "1g.5gb*me", False, False),
    ("Invalid 1c.1g.5gb*me", "1c.1g.5gb*me", False, False),
    ("Invalid 1g.5gb*me,you,them", "1g.5gb*me,you,them", False, False),
    ("Invalid 1c.1g.5gb*me,you,them", "1c.1g.5gb*me,you,them", False, False),
    ("Invalid bogus", "bogus", False, False),
    ("Invalid 1c.1g.5gb+.all", "1c.1g.5gb+.all", False, False),
    ("Invalid 1c.1g.5gb+all.", "1c.1g.5gb+all.", False, False),
    ("Invalid 1c.1g.5gb+me-me", "1c.1g.5gb+me-me", False, False),
    ("Invalid 1c.1g.5gb-me+me", "1c.1g.5gb-me+me", False, False),
]

# go-nvlib newMockDeviceLib: a 40 GiB GPU whose GI profiles answer these MemorySizeMB (6 and 8 slices
# and anything else NOT_SUPPORTED).
MOCK_GI_MEMORY = {
    GI_1_SLICE: 5 * 1024,
    GI_1_SLICE_REV1: 5 * 1024,
    GI_1_SLICE_GFX: 5 * 1024,
    GI_1_SLICE_NO_ME: 5 * 1024,
    GI_1_SLICE_ALL_ME: 5 * 1024,
    GI_1_SLICE_REV2: 10 * 1024,
    GI_2_SLICE: 10 * 1024,
    GI_2_SLICE_REV1: 10 * 1024,
    GI_2_SLICE_GFX: 10 * 1024,
    GI_2_SLICE_NO_ME: 10 * 1024,
    GI_2_SLICE_ALL_ME: 10 * 1024,
    GI_3_SLICE: 20 * 1024,
    GI_4_SLICE: 20 * 1024,
    GI_4_SLICE_GFX: 20 * 1024,
    GI_7_SLICE: 40 * 1024,
}
MOCK_PROFILES = [parse_profile_name(n) for n in visit_profile_names(MOCK_GI_MEMORY, 40 * GIB)]


def _parse_on_mock_device(text: str) -> ParsedProfile:
    """go-nvlib devicelib.ParseMigProfile on the mock device: the first visited profile it matches."""
    wanted = parse_profile_name(text)
    for profile in MOCK_PROFILES:
        if profile.matches(wanted):
            return profile
    raise ValueError(f"unable to parse profile string {text!r} into a valid profile")


@pytest.mark.parametrize(("description", "profile", "valid_format", "valid_device"), PARSE_CASES)
def test_parse_mig_profile_go_nvlib_cases(
    description: str, profile: str, valid_format: bool, valid_device: bool
) -> None:
    if valid_format:
        parse_profile_name(profile)
    else:
        with pytest.raises(ValueError, match="invalid MIG profile"):
            parse_profile_name(profile)
    if valid_device:
        _parse_on_mock_device(profile)
    else:
        with pytest.raises(ValueError):
            _parse_on_mock_device(profile)


# go-nvlib TestParseMigProfileEquals: (description, profile1, profile2, equal).
EQUALS_CASES = [
    ("Exactly equal", "1g.5gb", "1g.5gb", True),
    ("Equal when expanded", "1c.1g.5gb", "1g.5gb", True),
    ("Equal with attributes", "1g.5gb+me", "1g.5gb+me", True),
    ("Not equal C slices", "1c.2g.10gb", "2c.2g.10gb", False),
    ("Not equal G slices", "1c.1g.10gb", "1c.2g.10gb", False),
    ("Not equal attributes", "1g.5gb", "1g.5gb+me", False),
    ("Not equal neg attributes", "1g.5gb", "1g.5gb-me", False),
    ("Not equal +/- attributes", "1g.5gb+me", "1g.5gb-me", False),
]


@pytest.mark.parametrize(("description", "first", "second", "equal"), EQUALS_CASES)
def test_parse_mig_profile_equals_go_nvlib_cases(
    description: str, first: str, second: str, equal: bool
) -> None:
    p1, p2 = _parse_on_mock_device(first), _parse_on_mock_device(second)
    assert (p1 == p2) is equal
    assert p1.matches(p2) is equal


def test_visit_profile_names_skips_go_nvlibs_impossible_c_and_g_pairs() -> None:
    names = set(visit_profile_names({GI_7_SLICE: 40 * 1024, GI_4_SLICE: 20 * 1024}, 40 * GIB))
    # 3c.4g (6 > 5) and 6c.7g (12 > 8) are skipped; 4c.7g (8 > 8 is false) stays, as nvidia-smi lists it.
    assert names == {
        "1c.4g.20gb",
        "2c.4g.20gb",
        "4g.20gb",
        "1c.7g.40gb",
        "2c.7g.40gb",
        "3c.7g.40gb",
        "4c.7g.40gb",
        "7g.40gb",
    }


@given(st.sampled_from([p.name for m in MIG_MODELS.values() for p in m.profiles]))
def test_parsing_a_table_name_prints_it_back(name: str) -> None:
    assert str(parse_profile_name(name)) == name
