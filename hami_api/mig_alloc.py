"""HAMi v2.10's dynamic MIG on the wire and in the scheduler's choice, pure.

- The pod annotation `hami.io/vgpu-mig-allocations` (HAMi pkg/device/nvidia/mig_allocations.go
  `MigAllocation`, `EncodeMigAllocations`, `DecodeMigAllocations`): one JSON object per MIG device the
  scheduler reserved, `{"containerIndex","deviceIndex","gpuUUID","profile","placement":{"start","size"},
  "migUUID","gpuInstanceID","computeInstanceID"}`; the last three are the runtime identity the device
  plugin adds after it created the instance (Go's `omitempty` on a string and two `*uint32`, so an ID of
  0 is kept). Decoding is HAMi's plus strict types: what Go rejects is rejected, with HAMi's texts
  (`MIG allocation %d is incomplete`, `... has partial runtime identity`, `duplicate MIG allocation for
  container %d device %d`) inside a `WireFormatError` naming the annotation and the entry.
- HAMi's choice of a MIG profile and placement on one GPU from the profiles its register entry carries
  (pkg/device/nvidia/device.go `selectMigCandidate`, mig_topology.go `selectMigPlacement`,
  `orderedMigPlacements`, `migPlacementsOverlap`, `canPlaceMigProfiles`).
- The device config's `nvidia.migProfileAllowlist` check (mig_profiles.go `ValidateMigProfileAllowlist`),
  shared by hami-control and hami-node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api._wire import (
    INT64,
    UINT32,
    JSONObject,
    Where,
    go_json_string,
    json_int,
    json_list,
    json_object,
    json_str,
    load_json,
)
from hami_api.types import MigPlacement, MigProfile

MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
"""The pod annotation (HAMi's `MigAllocationsAnnotation`)."""

MIG_MODE = "mig"
"""The operating mode of a GPU in dynamic MIG (register `mode`, pod `nvidia.com/vgpu-mode`)."""

HAMI_CORE_MODE = "hami-core"


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One MIG device reserved for one container: the physical GPU, the profile and the placement, and
    once the device plugin created it, the instance's MIG UUID and GPU/compute instance IDs.
    `container_index` counts init containers first, then regular ones (HAMi's PodSingleDevice order);
    `device_index` is the device's position in that container's list."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def runtime_ready(self) -> bool:
        """The device plugin recorded all of the runtime identity (HAMi's `RuntimeReady`)."""
        return (
            bool(self.mig_uuid) and self.gpu_instance_id is not None and self.compute_instance_id is not None
        )


_KEYS = (
    "containerIndex",
    "deviceIndex",
    "gpuUUID",
    "profile",
    "placement",
    "migUUID",
    "gpuInstanceID",
    "computeInstanceID",
)
_PLACEMENT_KEYS = ("start", "size")
_GO_INT = INT64  # Go's `int` on the 64-bit platforms HAMi ships for


def _encode_one(a: MigAllocation) -> str:
    parts = [
        f'"containerIndex":{a.container_index}',
        f'"deviceIndex":{a.device_index}',
        f'"gpuUUID":{go_json_string(a.gpu_uuid)}',
        f'"profile":{go_json_string(a.profile)}',
        f'"placement":{{"start":{a.placement.start},"size":{a.placement.size}}}',
    ]
    if a.mig_uuid:
        parts.append(f'"migUUID":{go_json_string(a.mig_uuid)}')
    if a.gpu_instance_id is not None:
        parts.append(f'"gpuInstanceID":{a.gpu_instance_id}')
    if a.compute_instance_id is not None:
        parts.append(f'"computeInstanceID":{a.compute_instance_id}')
    return "{" + ",".join(parts) + "}"


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The annotation value, byte-identical to Go's json.Marshal of HAMi's []MigAllocation; "" for none
    (HAMi then writes no annotation). Values that could not decode back are refused (ValueError)."""
    for i, a in enumerate(allocations):
        _check(Where(MIG_ALLOCATIONS, f"allocation {i}"), i, a, encoding=True)
        for value, what in ((a.placement.start, "placement start"), (a.placement.size, "placement size")):
            if not UINT32[0] <= value <= UINT32[1]:
                raise ValueError(f"MIG allocation {i}: {what} {value} is outside 0..{UINT32[1]}")
        for ident, what in (
            (a.gpu_instance_id, "gpuInstanceID"),
            (a.compute_instance_id, "computeInstanceID"),
        ):
            if ident is not None and not UINT32[0] <= ident <= UINT32[1]:
                raise ValueError(f"MIG allocation {i}: {what} {ident} is outside 0..{UINT32[1]}")
    if not allocations:
        return ""
    return "[" + ",".join(_encode_one(a) for a in allocations) + "]"


def _check(where: Where, i: int, a: MigAllocation, *, encoding: bool = False) -> None:
    """HAMi's DecodeMigAllocations checks of one entry (not the duplicate check)."""
    if (
        a.container_index < 0
        or a.device_index < 0
        or not a.gpu_uuid
        or not a.profile
        or a.placement.size == 0
    ):
        if encoding:
            raise ValueError(f"MIG allocation {i} is incomplete: {a}")
        where.fail(_shown(a), f"is incomplete (MIG allocation {i} is incomplete)")
    present = sum((bool(a.mig_uuid), a.gpu_instance_id is not None, a.compute_instance_id is not None))
    if present not in {0, 3}:
        if encoding:
            raise ValueError(f"MIG allocation {i} has partial runtime identity: {a}")
        where.fail(
            _shown(a), f"has partial runtime identity (MIG allocation {i} has partial runtime identity)"
        )


def _shown(a: MigAllocation) -> str:
    return _encode_one(a)


def decode_mig_allocations(text: str) -> tuple[MigAllocation, ...]:
    """The annotation's entries, in order; "" (and JSON null) is none. Raises `WireFormatError` naming
    the entry for anything HAMi's decoder rejects, and for values of the wrong JSON type."""
    where = Where(MIG_ALLOCATIONS)
    if text == "":
        return ()
    raw = load_json(where, text)
    if raw is None:
        return ()
    entries = json_list(where, "allocations", raw)
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, entry in enumerate(entries):
        at = where.at(f"allocation {i}")
        if entry is None:  # Go decodes a null element as a zero MigAllocation: incomplete
            at.fail("null", f"is incomplete (MIG allocation {i} is incomplete)")
        m = json_object(at, "allocation", entry, _KEYS)
        placement = json_object(at, "placement", m.get("placement", JSONObject()), _PLACEMENT_KEYS)
        gi = m.get("gpuInstanceID")
        ci = m.get("computeInstanceID")
        allocation = MigAllocation(
            container_index=json_int(at, "containerIndex", m.get("containerIndex", 0), _GO_INT),
            device_index=json_int(at, "deviceIndex", m.get("deviceIndex", 0), _GO_INT),
            gpu_uuid=json_str(at, "gpuUUID", m.get("gpuUUID", "")),
            profile=json_str(at, "profile", m.get("profile", "")),
            placement=MigPlacement(
                json_int(at, "placement start", placement.get("start", 0), UINT32),
                json_int(at, "placement size", placement.get("size", 0), UINT32),
            ),
            mig_uuid=json_str(at, "migUUID", m.get("migUUID", "")),
            gpu_instance_id=None if gi is None else json_int(at, "gpuInstanceID", gi, UINT32),
            compute_instance_id=None if ci is None else json_int(at, "computeInstanceID", ci, UINT32),
        )
        _check(at, i, allocation)
        key = (allocation.container_index, allocation.device_index)
        if key in seen:
            at.fail(
                _shown(allocation),
                f"is a duplicate (duplicate MIG allocation for container {key[0]} device {key[1]})",
            )
        seen.add(key)
        out.append(allocation)
    return tuple(out)


def allocations_by_gpu(allocations: Iterable[MigAllocation]) -> dict[str, list[MigAllocation]]:
    """Entries grouped by physical GPU UUID, each group in annotation order (HAMi's getNodesUsage)."""
    out: dict[str, list[MigAllocation]] = {}
    for a in allocations:
        out.setdefault(a.gpu_uuid, []).append(a)
    return out


# --- HAMi's choice of profile and placement -------------------------------------------------------------


def overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    """HAMi's migPlacementsOverlap: the slice ranges [start, start+size) intersect."""
    return a.start < b.start + b.size and b.start < a.start + a.size


def _prefers_high(profile: str) -> bool:
    """HAMi's preferHighMigPlacement: 1g. and 3g. profiles try the highest start first."""
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: str, placements: Sequence[MigPlacement]) -> list[MigPlacement]:
    """HAMi's orderedMigPlacements: a stable sort by start, descending for 1g./3g., else ascending."""
    if _prefers_high(profile):
        return sorted(placements, key=lambda p: -p.start)
    return sorted(placements, key=lambda p: p.start)


def _find(profiles: Sequence[MigProfile], name: str) -> MigProfile | None:
    return next((p for p in profiles if p.name == name), None)


def select_mig_placement(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], profile: str
) -> MigPlacement | None:
    """HAMi's selectMigPlacement: the first of the profile's placements, in `ordered_placements` order,
    that overlaps none of `occupied`; None when the GPU has no such profile or no free placement."""
    found = _find(profiles, profile)
    if found is None:
        return None
    for candidate in ordered_placements(profile, found.placements):
        if not any(overlaps(candidate, taken) for taken in occupied):
            return candidate
    return None


def select_mig_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memory: int
) -> tuple[MigProfile, MigPlacement] | None:
    """HAMi's selectMigCandidate: profiles sorted by memory then slice count (stable), the first with at
    least `memory` MiB that has a free placement, and that placement."""
    for profile in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if profile.memory_mb < memory:
            continue
        placement = select_mig_placement(profiles, occupied, profile.name)
        if placement is not None:
            return profile, placement
    return None


def replay_mig(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memories: Iterable[int]
) -> list[tuple[MigProfile, MigPlacement]] | None:
    """HAMi's CustomFilterRule replay: each memory request in turn takes `select_mig_candidate`'s choice
    over what is occupied so far; None as soon as one does not fit."""
    taken = list(occupied)
    chosen: list[tuple[MigProfile, MigPlacement]] = []
    for memory in memories:
        pick = select_mig_candidate(profiles, taken, memory)
        if pick is None:
            return None
        chosen.append(pick)
        taken.append(pick[1])
    return chosen


def can_place_mig_profiles(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], requested: Sequence[str]
) -> bool:
    """HAMi's canPlaceMigProfiles: whether every requested profile gets one of its placements without
    overlapping `occupied` or each other (backtracking; the profiles with fewer placements, then bigger
    ones, first)."""
    if not requested:
        return True
    placements = {p.name: p.placements for p in profiles}

    def order(name: str) -> tuple[int, int]:
        options = placements.get(name, ())
        return (len(options), -options[0].size if options else 0)

    ordered = sorted(requested, key=order)
    used = list(occupied)

    def place(index: int) -> bool:
        if index == len(ordered):
            return True
        name = ordered[index]
        for candidate in ordered_placements(name, placements.get(name, ())):
            if any(overlaps(candidate, taken) for taken in used):
                continue
            used.append(candidate)
            if place(index + 1):
                return True
            used.pop()
        return False

    return place(0)


# --- nvidia.migProfileAllowlist -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllowedMigProfiles:
    """One allowlist entry (HAMi's device.AllowedMigProfiles): GPU model substrings and profile names."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


class MigAllowlistError(ValueError):
    """An `nvidia.migProfileAllowlist` HAMi's ValidateMigProfileAllowlist rejects; the text names the
    entry and, for a profile, the profile."""


def valid_profile_name(profile: str) -> bool:
    """HAMi's profile check: `<N>g.<anything>`: a "." with at least two characters before it, ending in g."""
    head, dot, _ = profile.partition(".")
    return bool(dot) and len(head) >= 2 and head.endswith("g")


def validate_mig_profile_allowlist(entries: Sequence[AllowedMigProfiles]) -> None:
    """HAMi's ValidateMigProfileAllowlist, with the entry named: raises `MigAllowlistError`."""
    for i, entry in enumerate(entries):
        if not entry.models or not entry.profiles:
            raise MigAllowlistError(
                f"nvidia.migProfileAllowlist[{i}]: MIG profile allowlist must define models and profiles"
            )
        for profile in entry.profiles:
            if not valid_profile_name(profile):
                raise MigAllowlistError(
                    f"nvidia.migProfileAllowlist[{i}].profiles: invalid MIG profile {profile!r}"
                )


def parse_mig_profile_allowlist(
    value: Any, field: str = "nvidia.migProfileAllowlist"
) -> tuple[AllowedMigProfiles, ...]:
    """The YAML/JSON list (`[{models: [...], profiles: [...]}]`) as entries, validated; None is empty.
    Raises `MigAllowlistError` naming the field for a wrong shape."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MigAllowlistError(f"{field}: must be a list of {{models, profiles}}, got {value!r}")
    out: list[AllowedMigProfiles] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise MigAllowlistError(f"{field}[{i}]: must be a mapping with models and profiles, got {item!r}")
        unknown = sorted(set(item) - {"models", "profiles"})
        if unknown:
            raise MigAllowlistError(f"{field}[{i}]: unknown key {unknown[0]!r} (known: models, profiles)")
        lists: list[tuple[str, ...]] = []
        for key in ("models", "profiles"):
            raw = item.get(key)
            if raw is None:
                raw = []
            if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                raise MigAllowlistError(f"{field}[{i}].{key}: must be a list of strings, got {raw!r}")
            lists.append(tuple(raw))
        out.append(AllowedMigProfiles(lists[0], lists[1]))
    try:
        validate_mig_profile_allowlist(out)
    except MigAllowlistError as err:
        raise MigAllowlistError(str(err).replace("nvidia.migProfileAllowlist", field, 1)) from None
    return tuple(out)


def allowed_profiles_for(entries: Sequence[AllowedMigProfiles], model: str) -> tuple[str, ...]:
    """HAMi's model match: the profiles of the first entry with a model that is a substring of `model`
    (the NVML name), () when none matches."""
    for entry in entries:
        if any(m in model for m in entry.models):
            return entry.profiles
    return ()


__all__ = [
    "HAMI_CORE_MODE",
    "MIG_ALLOCATIONS",
    "MIG_MODE",
    "AllowedMigProfiles",
    "MigAllocation",
    "MigAllowlistError",
    "allocations_by_gpu",
    "allowed_profiles_for",
    "can_place_mig_profiles",
    "decode_mig_allocations",
    "encode_mig_allocations",
    "ordered_placements",
    "overlaps",
    "parse_mig_profile_allowlist",
    "replay_mig",
    "select_mig_candidate",
    "select_mig_placement",
    "valid_profile_name",
    "validate_mig_profile_allowlist",
]
