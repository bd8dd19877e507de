"""MIG facts shared by the node daemon and the control plane: placements, GPU instance profiles, the
profile tables of the MIG-capable models, go-nvlib's profile names and HAMi's core percentage.

Pure: no I/O. The sources (cite them when changing a value):

- Profile names: go-nvlib `pkg/nvlib/device/mig_profile.go` (`NewMigProfile`, `MigProfileInfo.String`,
  `parseMigProfile`, `getMigMemorySizeGB`) and `device.go` (`VisitMigProfiles`: which C/G pairs exist).
- Profile tables: `nvidia-smi mig -lgip` / `-lgipp` output on real boards and NVIDIA's MIG user guide
  ("Supported MIG Profiles"), gathered in the shared notes (reference/mig-timeslicing.md section 5); the
  engine counts of A100 and A30 are go-nvml's mocks (`pkg/nvml/mock/gpus/a100.go`, `a30.go`), which
  carry the real per-profile units. Values that were inferred rather than read off hardware are
  flagged where they are defined.
- `ci_profile_enum_for` and `hami_core_percent`: HAMi v2.10 `pkg/device-plugin/nvidiadevice/nvinternal/
  plugin/migmgr.go` (EnsureAllocation asks the CI profile of the same slice count, SHARED engines) and
  `register.go` (core = ceil(MP * 100 / fullSM), fullSM = the largest base GI profile's SM count).

Placements: `Placement` is our own value with the two operations the MIG code needs (`overlaps`,
`slices`); `hami_api.types.MigPlacement` stays the wire type of HAMi's register JSON and pod annotation.
The two are kept apart on purpose (a dataclass subclass would compare unequal to its base anyway); convert
with `Placement.of(wire)` and `placement.wire()`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from hami_api.types import MigPlacement

# --- NVML enums (nvml.h; pynvml NVML_GPU_INSTANCE_PROFILE_* / NVML_COMPUTE_INSTANCE_PROFILE_*) -----

GI_1_SLICE = 0x0
GI_2_SLICE = 0x1
GI_3_SLICE = 0x2
GI_4_SLICE = 0x3
GI_7_SLICE = 0x4
GI_8_SLICE = 0x5
GI_6_SLICE = 0x6
GI_1_SLICE_REV1 = 0x7
GI_2_SLICE_REV1 = 0x8
GI_1_SLICE_REV2 = 0x9
GI_1_SLICE_GFX = 0xA
GI_2_SLICE_GFX = 0xB
GI_4_SLICE_GFX = 0xC
GI_1_SLICE_NO_ME = 0xD
GI_2_SLICE_NO_ME = 0xE
GI_1_SLICE_ALL_ME = 0xF
GI_2_SLICE_ALL_ME = 0x10
GI_3_SLICE_GFX = 0x11
GI_PROFILE_COUNT = 0x12
"""NVML_GPU_INSTANCE_PROFILE_COUNT: the enums a backend asks GetGpuInstanceProfileInfo about."""

CI_1_SLICE = 0x0
CI_2_SLICE = 0x1
CI_3_SLICE = 0x2
CI_4_SLICE = 0x3
CI_7_SLICE = 0x4
CI_8_SLICE = 0x5
CI_6_SLICE = 0x6
CI_1_SLICE_REV1 = 0x7
CI_7_SLICE_NVL = 0x8
CI_PROFILE_COUNT = 0x9
CI_ENGINE_PROFILE_SHARED = 0x0
CI_ENGINE_PROFILE_COUNT = 0x1

_GI_SLICES: Mapping[int, int] = MappingProxyType(
    {
        GI_1_SLICE: 1,
        GI_1_SLICE_REV1: 1,
        GI_1_SLICE_REV2: 1,
        GI_1_SLICE_GFX: 1,
        GI_1_SLICE_NO_ME: 1,
        GI_1_SLICE_ALL_ME: 1,
        GI_2_SLICE: 2,
        GI_2_SLICE_REV1: 2,
        GI_2_SLICE_GFX: 2,
        GI_2_SLICE_NO_ME: 2,
        GI_2_SLICE_ALL_ME: 2,
        GI_3_SLICE: 3,
        GI_4_SLICE: 4,
        GI_4_SLICE_GFX: 4,
        GI_6_SLICE: 6,
        GI_7_SLICE: 7,
        GI_8_SLICE: 8,
    }
)
"""go-nvlib NewMigProfile: GI profile enum -> G (GI_3_SLICE_GFX is not in go-nvlib v0.12's switch)."""

_CI_SLICES: Mapping[int, int] = MappingProxyType(
    {
        CI_1_SLICE: 1,
        CI_1_SLICE_REV1: 1,
        CI_2_SLICE: 2,
        CI_3_SLICE: 3,
        CI_4_SLICE: 4,
        CI_6_SLICE: 6,
        CI_7_SLICE: 7,
        CI_7_SLICE_NVL: 7,
        CI_8_SLICE: 8,
    }
)
"""go-nvlib NewMigProfile: CI profile enum -> C."""

_CI_FOR_SLICES: Mapping[int, int] = MappingProxyType(
    {1: CI_1_SLICE, 2: CI_2_SLICE, 3: CI_3_SLICE, 4: CI_4_SLICE, 6: CI_6_SLICE, 7: CI_7_SLICE, 8: CI_8_SLICE}
)

ATTRIBUTE_MEDIA_EXTENSIONS = "me"
ATTRIBUTE_MEDIA_EXTENSIONS_ALL = "me.all"
ATTRIBUTE_GRAPHICS = "gfx"

_GI_ATTRIBUTES: Mapping[int, tuple[str, ...]] = MappingProxyType(
    {
        GI_1_SLICE_REV1: (ATTRIBUTE_MEDIA_EXTENSIONS,),
        GI_2_SLICE_REV1: (ATTRIBUTE_MEDIA_EXTENSIONS,),
        GI_1_SLICE_ALL_ME: (ATTRIBUTE_MEDIA_EXTENSIONS_ALL,),
        GI_2_SLICE_ALL_ME: (ATTRIBUTE_MEDIA_EXTENSIONS_ALL,),
        GI_1_SLICE_GFX: (ATTRIBUTE_GRAPHICS,),
        GI_2_SLICE_GFX: (ATTRIBUTE_GRAPHICS,),
        GI_4_SLICE_GFX: (ATTRIBUTE_GRAPHICS,),
    }
)
_GI_NEG_ATTRIBUTES: Mapping[int, tuple[str, ...]] = MappingProxyType(
    {GI_1_SLICE_NO_ME: (ATTRIBUTE_MEDIA_EXTENSIONS,), GI_2_SLICE_NO_ME: (ATTRIBUTE_MEDIA_EXTENSIONS,)}
)

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024


# --- values ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """Where a GPU instance sits on a GPU: its first memory slice and how many it spans (NVML's
    nvmlGpuInstancePlacement_t). Ordered by start, then size."""

    start: int
    size: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"placement start: expected an integer >= 0, got {self.start}")
        if self.size < 1:
            raise ValueError(f"placement size: expected an integer >= 1, got {self.size}")

    def overlaps(self, other: Placement | MigPlacement) -> bool:
        """Whether the two share a memory slice (HAMi mig_topology.go `placementsOverlap`)."""
        return self.start < other.start + other.size and other.start < self.start + self.size

    def slices(self) -> range:
        """The memory slices it spans."""
        return range(self.start, self.start + self.size)

    def wire(self) -> MigPlacement:
        """The wire form (HAMi's register JSON and `hami.io/vgpu-mig-allocations`)."""
        return MigPlacement(self.start, self.size)

    @classmethod
    def of(cls, wire: MigPlacement) -> Placement:
        """From the wire form. Raises ValueError for a negative start or a size below 1."""
        return cls(wire.start, wire.size)

    def __str__(self) -> str:
        return f"{{{self.start},{self.size}}}"


@dataclass(frozen=True, slots=True)
class GIProfile:
    """One GPU instance profile of a model, as `nvidia-smi mig -lgip` and nvmlGpuInstanceProfileInfo
    describe it.

    `name` is go-nvlib's profile string ("1g.5gb", "1g.5gb+me", "1g.10gb" for A100-40GB's REV2
    1-slice profile); `profile_id` the real ID (nvmlGpuInstanceProfileInfo.id, the -lgip "ID" column:
    19, 20, 15, 14, 9, 5, 0 on A100); `nvml_enum` the NVML_GPU_INSTANCE_PROFILE_* value passed to
    GetGpuInstanceProfileInfo; `slices` its sliceCount; `instance_count` how many fit on an empty GPU;
    `placements` where NVML lets it be created (GetGpuInstancePossiblePlacements).
    """

    name: str
    profile_id: int
    nvml_enum: int
    slices: int
    instance_count: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[Placement, ...]

    @property
    def attributes(self) -> tuple[str, ...]:
        """go-nvlib's attributes of this profile ("me", "me.all", "gfx"), empty for a base profile."""
        return _GI_ATTRIBUTES.get(self.nvml_enum, ())

    @property
    def is_base(self) -> bool:
        """A profile without attributes or negative attributes (what HAMi's dynamic MIG uses)."""
        return not self.attributes and self.nvml_enum not in _GI_NEG_ATTRIBUTES

    def placement_at(self, start: int) -> Placement | None:
        """The possible placement starting at `start`, None when there is none."""
        for placement in self.placements:
            if placement.start == start:
                return placement
        return None


@dataclass(frozen=True, slots=True)
class MigModel:
    """A MIG-capable GPU model: `name` as NVML reports it ("NVIDIA A100-SXM4-40GB"), `memory_mib` the
    total NVML reports for the whole GPU, `multiprocessors` the whole GPU's SMs (MIG exposes fewer:
    see `mig_full_sm`), `memory_slices` the memory slices placements count in (8, or 4 on A30)."""

    name: str
    memory_mib: int
    multiprocessors: int
    memory_slices: int
    profiles: tuple[GIProfile, ...]
    _by_name: Mapping[str, GIProfile] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({p.name: p for p in self.profiles}))

    def profile(self, name: str) -> GIProfile | None:
        """The profile with this go-nvlib name ("3g.20gb"), None when the model has none."""
        return self._by_name.get(name)

    def profile_by_id(self, profile_id: int) -> GIProfile | None:
        """The profile with this real ID (nvmlGpuInstanceProfileInfo.id), None when none."""
        for profile in self.profiles:
            if profile.profile_id == profile_id:
                return profile
        return None

    def profile_by_enum(self, nvml_enum: int) -> GIProfile | None:
        """The profile NVML answers for this NVML_GPU_INSTANCE_PROFILE_* enum, None when NVML would
        answer NOT_SUPPORTED."""
        for profile in self.profiles:
            if profile.nvml_enum == nvml_enum:
                return profile
        return None

    @property
    def mig_full_sm(self) -> int:
        """HAMi's `fullSM`: the most SMs a base GI profile has (98 on A100, not the board's 108)."""
        return max((p.multiprocessors for p in self.profiles if p.is_base), default=0)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * _MIB


# --- go-nvlib profile names -------------------------------------------------------------------------


def _round_half_away(value: float) -> int:
    """Go's math.Round (halves away from zero); Python's round() would send 70.5 to 70."""
    return math.floor(value + 0.5) if value >= 0 else -math.floor(-value + 0.5)


def mig_memory_size_gb(device_memory_bytes: int, mig_memory_mib: int) -> int:
    """go-nvlib getMigMemorySizeGB: the MIG memory as a fraction of the GPU rounded up to eighths,
    times the GPU's memory in whole GiB (rounded up), rounded to the nearest integer."""
    if device_memory_bytes <= 0:
        raise ValueError(f"device memory: expected a positive number of bytes, got {device_memory_bytes}")
    fraction = (mig_memory_mib * _MIB) / device_memory_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (device_memory_bytes + _GIB - 1) // _GIB
    return _round_half_away(fraction * total_gb)


def format_profile_name(
    c: int, g: int, gb: int, attributes: Iterable[str] = (), neg_attributes: Iterable[str] = ()
) -> str:
    """go-nvlib MigProfileInfo.String: `<G>g.<GB>gb` when C == G, else `<C>c.<G>g.<GB>gb`; then
    `+attr,...` or (winning when both are set) `-attr,...`."""
    attrs, negs = list(attributes), list(neg_attributes)
    suffix = ""
    if attrs:
        suffix = "+" + ",".join(attrs)
    if negs:
        suffix = "-" + ",".join(negs)
    if c == g:
        return f"{g}g.{gb}gb{suffix}"
    return f"{c}c.{g}g.{gb}gb{suffix}"


def profile_name(
    gi_enum: int, mig_memory_mib: int, device_memory_bytes: int, *, ci_enum: int | None = None
) -> str:
    """go-nvlib NewMigProfile(...).String(): the name of the GI profile `gi_enum` (an
    NVML_GPU_INSTANCE_PROFILE_* value) whose instance has `mig_memory_mib`, on a GPU of
    `device_memory_bytes`, with the CI profile `ci_enum` (default: the one of the same slice count,
    giving the C == G name). Raises ValueError naming an unknown enum."""
    g = _GI_SLICES.get(gi_enum)
    if g is None:
        raise ValueError(f"invalid GPU Instance Profile ID: {gi_enum}")
    if ci_enum is None:
        ci_enum = ci_profile_enum_for(g)
    c = _CI_SLICES.get(ci_enum)
    if c is None:
        raise ValueError(f"invalid Compute Instance Profile ID: {ci_enum}")
    gb = mig_memory_size_gb(device_memory_bytes, mig_memory_mib)
    return format_profile_name(c, g, gb, _GI_ATTRIBUTES.get(gi_enum, ()), _GI_NEG_ATTRIBUTES.get(gi_enum, ()))


def visit_profile_names(gi_memory_mib: Mapping[int, int], device_memory_bytes: int) -> list[str]:
    """go-nvlib device.VisitMigProfiles: every profile string a GPU offers, given the memory NVML
    answers per GI profile enum it supports. For each GI enum and each CI enum (one engine profile,
    SHARED), skips C > G and C < G with 2C > G + 1; duplicates kept in visiting order, as go-nvlib."""
    names: list[str] = []
    for gi_enum in range(GI_PROFILE_COUNT):
        memory = gi_memory_mib.get(gi_enum)
        if memory is None or gi_enum not in _GI_SLICES:
            continue
        for ci_enum in range(CI_PROFILE_COUNT):
            g, c = _GI_SLICES[gi_enum], _CI_SLICES[ci_enum]
            if c > g or (c < g and 2 * c > g + 1):
                continue
            names.append(profile_name(gi_enum, memory, device_memory_bytes, ci_enum=ci_enum))
    return names


@dataclass(frozen=True, slots=True)
class ParsedProfile:
    """A profile string taken apart (go-nvlib parseMigProfile): C, G, GB and the attributes."""

    c: int
    g: int
    gb: int
    attributes: tuple[str, ...] = ()
    neg_attributes: tuple[str, ...] = ()

    def matches(self, other: ParsedProfile) -> bool:
        """go-nvlib MigProfileInfo.Matches: same C, G, GB and the same attribute sets."""
        return (
            (self.c, self.g, self.gb) == (other.c, other.g, other.gb)
            and sorted(self.attributes) == sorted(other.attributes)
            and sorted(self.neg_attributes) == sorted(other.neg_attributes)
        )

    def __str__(self) -> str:
        return format_profile_name(self.c, self.g, self.gb, self.attributes, self.neg_attributes)


_GO_INT = re.compile(r"[+-]?[0-9]+")
_ATTRIBUTE_CHARS = re.compile(r"[A-Za-z0-9.]+")


def _parse_field(text: str, unit: str, profile: str) -> int:
    if text.strip() != text:
        raise ValueError(f"invalid MIG profile {profile!r}: leading or trailing spaces on '%d{unit}'")
    if not text.endswith(unit):
        raise ValueError(f"invalid MIG profile {profile!r}: missing '{unit}' from '%d{unit}'")
    number = text[: -len(unit)]
    if not _GO_INT.fullmatch(number):
        raise ValueError(f"invalid MIG profile {profile!r}: malformed number in '%d{unit}'")
    return int(number)


def _parse_attributes(text: str, profile: str) -> tuple[str, ...]:
    attributes = text.split(",")
    seen: set[str] = set()
    for attribute in attributes:
        problem = None
        if attribute in seen:
            problem = "non unique attribute in list"
        elif attribute == "":
            problem = "empty attribute in list"
        elif attribute.strip() != attribute:
            problem = "leading or trailing spaces in attribute"
        elif attribute[0].isdigit():
            problem = "attribute begins with a number"
        elif attribute[0] == "." or attribute[-1] == ".":
            problem = "attribute begins/ends with a dot"
        elif not _ATTRIBUTE_CHARS.fullmatch(attribute) or not attribute.isascii():
            problem = "non alpha-numeric character or digit in attribute"
        if problem is not None:
            raise ValueError(f"invalid MIG profile {profile!r}: {problem}")
        seen.add(attribute)
    return tuple(attributes)


def parse_profile_name(profile: str) -> ParsedProfile:
    """go-nvlib parseMigProfile (what AssertValidMigProfileFormat checks): `[<C>c.]<G>g.<GB>gb` with an
    optional `+attr,...` or `-attr,...`. Raises ValueError naming the profile and what is wrong."""
    if profile == "":
        raise ValueError("invalid MIG profile '': profile is the empty string")
    plus = profile.split("+", 1)
    minus = profile.split("-", 1)
    if len(plus) == 2 and len(minus) == 2:
        raise ValueError(f"invalid MIG profile {profile!r}: contains both '+/-' attributes")
    parts = plus if len(plus) == 2 else minus
    fields = parts[0].split(".", 2)
    if len(fields) == 3:
        c = _parse_field(fields[0], "c", profile)
        g = _parse_field(fields[1], "g", profile)
        gb = _parse_field(fields[2], "gb", profile)
    elif len(fields) == 2:
        g = _parse_field(fields[0], "g", profile)
        gb = _parse_field(fields[1], "gb", profile)
        c = g
    else:
        raise ValueError(f"invalid MIG profile {profile!r}: parsed wrong number of fields, expected 2 or 3")
    if len(parts) == 1:
        return ParsedProfile(c, g, gb)
    attributes = _parse_attributes(parts[1], profile)
    if len(minus) == 2:
        return ParsedProfile(c, g, gb, neg_attributes=attributes)
    return ParsedProfile(c, g, gb, attributes=attributes)


# --- HAMi's helpers -------------------------------------------------------------------------------


def ci_profile_enum_for(slices: int) -> int:
    """The NVML_COMPUTE_INSTANCE_PROFILE_* enum of `slices` slices: the CI HAMi's EnsureAllocation
    creates in a new GI (one CI spanning the whole GI, SHARED engines). Raises ValueError."""
    found = _CI_FOR_SLICES.get(slices)
    if found is None:
        raise ValueError(f"no compute instance profile has {slices} slices (1, 2, 3, 4, 6, 7 or 8)")
    return found


def hami_core_percent(profile: GIProfile, full_sm: int) -> int:
    """HAMi register.go: a MIG profile's core share in percent, ceil(MP * 100 / fullSM)."""
    if full_sm <= 0:
        raise ValueError(f"full_sm: expected a positive SM count, got {full_sm}")
    return -(-profile.multiprocessors * 100 // full_sm)


# --- the profile tables -----------------------------------------------------------------------------


def _places(starts: Iterable[int], size: int) -> tuple[Placement, ...]:
    return tuple(Placement(start, size) for start in starts)


_SEVEN = range(7)

# Engines per profile: (copy engines, decoders, encoders, jpeg, ofa).
_A100_ENGINES = {
    GI_1_SLICE: (1, 0, 0, 0, 0),
    GI_1_SLICE_REV1: (1, 1, 0, 1, 1),
    GI_1_SLICE_REV2: (1, 1, 0, 0, 0),
    GI_2_SLICE: (2, 1, 0, 0, 0),
    GI_3_SLICE: (3, 2, 0, 0, 0),
    GI_4_SLICE: (4, 2, 0, 0, 0),
    GI_7_SLICE: (7, 5, 0, 1, 1),
}
"""A100 (40 and 80 GB): go-nvml mock a100.go (A100-SXM4-40GB's table), which matches the MIG user
guide's A100 table (1g.5gb 0 NVDEC; +me 1 NVDEC/1 JPEG/1 OFA; 7g 5 NVDEC/1 JPEG/1 OFA)."""

_HOPPER_ENGINES = {
    GI_1_SLICE: (1, 1, 0, 1, 0),
    GI_1_SLICE_REV1: (1, 1, 0, 1, 1),
    GI_1_SLICE_REV2: (1, 1, 0, 1, 0),
    GI_2_SLICE: (2, 2, 0, 2, 0),
    GI_3_SLICE: (3, 3, 0, 3, 0),
    GI_4_SLICE: (4, 4, 0, 4, 0),
    GI_7_SLICE: (8, 7, 0, 7, 1),
}
"""H100 and H200: the MIG user guide's H100 table (NVDEC/JPEG/OFA per profile; 7g 7 NVDEC, 8 copy
engines as -lgip prints). Inferred for H200 from its identical table in the guide; check on hardware."""

# (enum, real ID, instances, placements) per profile, shared by the 8-slice boards. Placements were
# read with -lgipp on A100-80GB; that H100/H200 have the same ones is inferred (identical 8-slice layout
# in NVIDIA's docs and KEP-4815): check once on hardware (hack/mig_probe.py).
_EIGHT_SLICE_LAYOUT = (
    (GI_1_SLICE, 19, 7, _places(_SEVEN, 1)),
    (GI_1_SLICE_REV1, 20, 1, _places(_SEVEN, 1)),
    (GI_1_SLICE_REV2, 15, 4, _places((0, 2, 4, 6), 2)),
    (GI_2_SLICE, 14, 3, _places((0, 2, 4), 2)),
    (GI_3_SLICE, 9, 2, _places((0, 4), 4)),
    (GI_4_SLICE, 5, 1, _places((0,), 4)),
    (GI_7_SLICE, 0, 1, _places((0,), 8)),
)
_SLICES_OF = {
    GI_1_SLICE: 1,
    GI_1_SLICE_REV1: 1,
    GI_1_SLICE_REV2: 1,
    GI_2_SLICE: 2,
    GI_3_SLICE: 3,
    GI_4_SLICE: 4,
    GI_7_SLICE: 7,
}


def _eight_slice_model(
    name: str,
    memory_mib: int,
    multiprocessors: int,
    per_profile: Mapping[int, tuple[int, int]],
    engines: Mapping[int, tuple[int, int, int, int, int]],
) -> MigModel:
    """A model on the 8-memory-slice layout; `per_profile` gives (memory MiB, SMs) per GI enum."""
    profiles = []
    for enum, profile_id, instances, placements in _EIGHT_SLICE_LAYOUT:
        memory, sms = per_profile[enum]
        ce, dec, enc, jpeg, ofa = engines[enum]
        profiles.append(
            GIProfile(
                name=profile_name(enum, memory, memory_mib * _MIB),
                profile_id=profile_id,
                nvml_enum=enum,
                slices=_SLICES_OF[enum],
                instance_count=instances,
                memory_mib=memory,
                multiprocessors=sms,
                copy_engines=ce,
                decoders=dec,
                encoders=enc,
                jpeg_engines=jpeg,
                ofa_engines=ofa,
                placements=placements,
            )
        )
    return MigModel(name, memory_mib, multiprocessors, 8, tuple(profiles))


A100_SXM4_40GB = _eight_slice_model(
    "NVIDIA A100-SXM4-40GB",
    40960,
    108,
    {
        GI_1_SLICE: (4864, 14),
        GI_1_SLICE_REV1: (4864, 14),
        GI_1_SLICE_REV2: (9856, 14),
        GI_2_SLICE: (9856, 28),
        GI_3_SLICE: (19968, 42),
        GI_4_SLICE: (19968, 56),
        GI_7_SLICE: (40192, 98),
    },
    _A100_ENGINES,
)
"""Memory and SMs: -lgip on A100-SXM4-40GB (notes section 5): 1g.5gb 4864 MiB, 7g.40gb 40192 MiB."""

A100_SXM4_80GB = _eight_slice_model(
    "NVIDIA A100-SXM4-80GB",
    81920,
    108,
    {
        GI_1_SLICE: (9728, 14),
        GI_1_SLICE_REV1: (9728, 14),
        GI_1_SLICE_REV2: (19968, 14),
        GI_2_SLICE: (19968, 28),
        GI_3_SLICE: (40192, 42),
        GI_4_SLICE: (40192, 56),
        GI_7_SLICE: (80384, 98),
    },
    _A100_ENGINES,
)
"""Memory: -lgip on A100-80GB prints 9.50 / 19.50 / 39.25 / 78.50 GiB (7g is 78.50 to 79.00 GiB by
driver; the lower one kept). go-nvml's mock says 9856 MiB for 1g: not taken."""

H100_80GB = _eight_slice_model(
    "NVIDIA H100 80GB HBM3",
    81559,
    132,
    {
        GI_1_SLICE: (9984, 16),
        GI_1_SLICE_REV1: (9984, 16),
        GI_1_SLICE_REV2: (20096, 26),
        GI_2_SLICE: (20096, 32),
        GI_3_SLICE: (40448, 60),
        GI_4_SLICE: (40448, 64),
        GI_7_SLICE: (81152, 132),
    },
    _HOPPER_ENGINES,
)
"""H100 SXM5 80GB: -lgip prints 9.75 / 19.62 / 39.50 / 79.25 GiB and 16 / 26 / 32 / 60 / 64 / 132 SMs
(notes section 5); NVML's total 81559 MiB is nvidia-smi's figure for this board. go-nvml's mock H100
(112 SMs, 7g placement {0}:7) is not real data and is not used."""

H200_141GB = _eight_slice_model(
    "NVIDIA H200",
    143771,
    132,
    {
        GI_1_SLICE: (16384, 16),
        GI_1_SLICE_REV1: (16384, 16),
        GI_1_SLICE_REV2: (33024, 26),
        GI_2_SLICE: (33024, 32),
        GI_3_SLICE: (71168, 60),
        GI_4_SLICE: (71168, 64),
        GI_7_SLICE: (143360, 132),
    },
    _HOPPER_ENGINES,
)
"""H200 141GB: -lgip prints 16.00 / 32.25 / 69.50 / 140.00 GiB (notes section 5); the total 143771
MiB is nvidia-smi's figure for this board (inferred for the NVML name "NVIDIA H200"); the names come
out as HAMi's chart writes them (1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 7g.141gb)."""

A30_24GB = MigModel(
    "NVIDIA A30",
    24576,
    56,
    4,
    (
        GIProfile("1g.6gb", 14, GI_1_SLICE, 1, 4, 5836, 14, 1, 0, 0, 0, 0, _places(range(4), 1)),
        GIProfile("1g.6gb+me", 21, GI_1_SLICE_REV1, 1, 1, 5836, 14, 1, 1, 0, 1, 1, _places(range(4), 1)),
        GIProfile("2g.12gb", 5, GI_2_SLICE, 2, 2, 11672, 28, 2, 2, 0, 0, 0, _places((0, 2), 2)),
        GIProfile("2g.12gb+me", 6, GI_2_SLICE_REV1, 2, 1, 11672, 28, 2, 2, 0, 1, 1, _places((0, 2), 2)),
        GIProfile("4g.24gb", 0, GI_4_SLICE, 4, 1, 23344, 56, 4, 4, 0, 1, 1, _places((0,), 4)),
    ),
)
"""A30 24GB (4 memory slices, 4 compute slices): memory, SMs, engines and placements from go-nvml's
mock a30.go, which agree with the MIG user guide's A30 table (1g 1/4, 2g 2/4, 4g full; 1g.6gb+me R470+,
2g.12gb+me R525+). The real IDs 14 / 21 / 5 / 6 / 0 are -lgip's (the mock uses enums as IDs): check
once on hardware. NVML names the board "NVIDIA A30"."""


def _aliases(model: MigModel, *names: str) -> dict[str, MigModel]:
    return {name: replace(model, name=name) for name in names}


MIG_MODELS: Mapping[str, MigModel] = MappingProxyType(
    {
        A100_SXM4_40GB.name: A100_SXM4_40GB,
        **_aliases(A100_SXM4_40GB, "NVIDIA A100-PCIE-40GB"),
        A100_SXM4_80GB.name: A100_SXM4_80GB,
        # "NVIDIA A100 80GB PCIe" is what NVML names the board; go-nvml's mock says A100-PCIE-80GB.
        **_aliases(A100_SXM4_80GB, "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"),
        H100_80GB.name: H100_80GB,
        # H100 PCIe: the SXM5 table is assumed (the PCIe board has 114 SMs, so its per-profile SM counts
        # may be lower): inferred, check on hardware.
        **_aliases(H100_80GB, "NVIDIA H100 PCIe"),
        H200_141GB.name: H200_141GB,
        A30_24GB.name: A30_24GB,
    }
)
"""The MIG-capable models the fake backend models and the tests use, keyed by NVML product name."""


def mig_model(nvml_name: str) -> MigModel | None:
    """The profile table of the model NVML names so (surrounding spaces ignored), None if unknown."""
    return MIG_MODELS.get(nvml_name.strip())


__all__ = [
    "A30_24GB",
    "A100_SXM4_40GB",
    "A100_SXM4_80GB",
    "CI_ENGINE_PROFILE_SHARED",
    "GI_PROFILE_COUNT",
    "H100_80GB",
    "H200_141GB",
    "MIG_MODELS",
    "GIProfile",
    "MigModel",
    "ParsedProfile",
    "Placement",
    "ci_profile_enum_for",
    "format_profile_name",
    "hami_core_percent",
    "mig_memory_size_gb",
    "mig_model",
    "parse_profile_name",
    "profile_name",
    "visit_profile_names",
]
