"""The fake GPU inventory: its typed form, a strict parser, a renderer and a generator.

Pure apart from `load_inventory` and `write_inventory`, which read and write one file. The format and
every injectable fault are documented in docs/fake-gpus.md. Every error names the file, the entry and
the field: `gpus.yaml: gpus[2].memory: expected a positive integer (MiB), got "80GB"`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml

from hami_api.mig import MIG_MODELS, MigModel, Placement, mig_model
from hami_node.durable import write_atomic
from hami_node.gpu.backend import GPUEventKind, GPULink, PhysicalGPU, TopologyLevel

DEFAULT_MODEL = "NVIDIA A100-SXM4-80GB"
DEFAULT_MEMORY_MIB = 81920
FAKE_DRIVER_VERSION = "550.54.15"
"""The driver version every fake GPU reports (a real R550 driver's), for the DRA slice's driverVersion."""
DEFAULT_NVLINKS = 12
"""NVLinks per GPU pair in generated inventories: an A100-SXM4 board, 12 links per GPU to NVSwitches."""
MAX_NVLINKS = 18
"""The most NVLinks a pair may have in the file (HAMi scores 1 to 18)."""
_MAX_SHOWN = 120


class NvmlMode(StrEnum):
    """How the fake NVML as a whole behaves (top-level `nvml:`)."""

    OK = "ok"
    FAILING = "failing"
    """Every call raises `NvmlFailed` (the driver is wedged)."""
    ABSENT = "absent"
    """Every call raises `LibraryNotFound` (the driver is gone)."""


@dataclass(frozen=True, slots=True)
class FakeMigInstance:
    """A MIG device the inventory says exists at start: a GPU instance of `profile` (go-nvlib's name,
    e.g. "3g.20gb") at the placement starting at memory slice `start`, with one compute instance."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One GPU of the inventory. `healthy=False` and `lost=True` are faults (see docs/fake-gpus.md).

    MIG: `mig_enabled` is the current MIG mode, `mig_pending` the mode after the next reset (None: the
    same as current), `mig_devices` the MIG devices present at start (only when MIG is enabled). A GPU
    with MIG enabled or pending is of a model of `hami_api.mig.MIG_MODELS`.
    """

    uuid: str
    model: str
    memory_mib: int
    index: int
    minor: int
    numa_node: int | None
    pci_bus_id: str
    mig_enabled: bool = False
    healthy: bool = True
    lost: bool = False
    mig_devices: tuple[FakeMigInstance, ...] = ()
    mig_pending: bool | None = None

    @property
    def mig_model(self) -> MigModel | None:
        """The MIG profile table of this GPU's model, None when the model is not MIG capable."""
        return mig_model(self.model)

    def info(self, *, lost: bool = False) -> PhysicalGPU:
        """The `PhysicalGPU` a backend lists for this GPU (`lost` adds an in-process fault)."""
        return PhysicalGPU(
            index=self.index,
            uuid=self.uuid,
            model=self.model,
            memory_mib=self.memory_mib,
            minor=self.minor,
            numa_node=self.numa_node,
            pci_bus_id=self.pci_bus_id,
            mig_enabled=self.mig_enabled,
            healthy=self.healthy and not (self.lost or lost),
            driver_version=FAKE_DRIVER_VERSION,
        )


@dataclass(frozen=True, slots=True)
class LinkGroup:
    """Every pair of these GPUs (by index) is linked as this entry says; a field left None is not set by
    this entry. `nvlinks` is each GPU's NVLink count to the other; `reverse_nvlinks`, only for a pair,
    is the second GPU's count to the first when it differs (a fault: an NVLink enabled on one side)."""

    gpus: tuple[int, ...]
    nvlinks: int | None = None
    level: TopologyLevel | None = None
    reverse_nvlinks: int | None = None

    def nvlinks_from(self, index: int) -> int | None:
        """The NVLink count this entry sets for the GPU at `index` towards the other GPUs."""
        if self.reverse_nvlinks is not None and len(self.gpus) == 2 and index == self.gpus[1]:
            return self.reverse_nvlinks
        return self.nvlinks


@dataclass(frozen=True, slots=True)
class FakeEvent:
    """An event to emit once: `id` is remembered, so re-reading the file does not fire it again.

    `gpu` is a UUID, or None for "all GPUs"; `xid` is set exactly when `kind` is XID.
    """

    id: str
    kind: GPUEventKind
    gpu: str | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """A whole inventory file. `gpus` are ordered by index."""

    gpus: tuple[FakeGpu, ...]
    nvml: NvmlMode = NvmlMode.OK
    links: tuple[LinkGroup, ...] = ()
    events: tuple[FakeEvent, ...] = ()
    _by_uuid: dict[str, FakeGpu] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_uuid", {gpu.uuid: gpu for gpu in self.gpus})

    def gpu(self, uuid: str) -> FakeGpu | None:
        return self._by_uuid.get(uuid)

    def link(self, uuid_a: str, uuid_b: str) -> GPULink:
        """The link from one GPU to another: for each field, the last `links` entry holding both GPUs
        that sets it. NVLinks default to 0; the PCIe level to NUMA_NODE when both GPUs sit on the same
        known NUMA node, else SYSTEM."""
        a, b = self._by_uuid[uuid_a], self._by_uuid[uuid_b]
        nvlinks: int | None = None
        level: TopologyLevel | None = None
        for group in reversed(self.links):
            if a.index in group.gpus and b.index in group.gpus:
                if nvlinks is None:
                    nvlinks = group.nvlinks_from(a.index)
                if level is None:
                    level = group.level
                if nvlinks is not None and level is not None:
                    break
        if level is None:
            same_numa = a.numa_node is not None and a.numa_node == b.numa_node
            level = TopologyLevel.NUMA_NODE if same_numa else TopologyLevel.SYSTEM
        return GPULink(level, nvlinks or 0)


class InventoryError(ValueError):
    """A bad inventory: `source` is the file (or "<inventory>"), `where` the entry and field
    ("gpus[2].memory", "line 3, column 7", "whole file"), `reason` what is wrong, with the value."""

    def __init__(self, source: str, where: str, reason: str) -> None:
        self.source = source
        self.where = where
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.source}: {self.where}: {self.reason}"

    def __reduce__(self) -> tuple[type[InventoryError], tuple[str, str, str]]:
        return (type(self), (self.source, self.where, self.reason))


# --- parsing --------------------------------------------------------------------------------------


def _shown(value: object) -> str:
    """The offending value as the user wrote it: JSON-ish ("80GB" with quotes, 3, null), shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[:_MAX_SHOWN] + f"... ({len(text)} chars)"
    return text


class _Fields:
    """Reads one mapping strictly: typed getters, and `done()` rejects keys nobody asked for."""

    def __init__(self, errors: _Errors, where: str, value: object) -> None:
        self._errors = errors
        self._where = where
        if not isinstance(value, Mapping):
            raise errors.at(where or "whole file", f"expected a mapping, got {_shown(value)}")
        self._map: Mapping[Any, Any] = value
        self._seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self._where}.{key}" if self._where else key

    def has(self, key: str) -> bool:
        return key in self._map and self._map[key] is not None

    def raw(self, key: str) -> object:
        self._seen.add(key)
        return self._map.get(key)

    def fail(self, key: str, reason: str) -> InventoryError:
        return self._errors.at(self.at(key), reason)

    def string(self, key: str, *, default: str | None = None) -> str:
        value = self.raw(key)
        if value is None:
            if default is None:
                raise self.fail(key, "is required")
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {_shown(value)}")
        return value.strip()

    def integer(self, key: str, what: str, *, minimum: int, default: int | None = None) -> int:
        value = self.raw(key)
        if value is None:
            if default is None:
                raise self.fail(key, "is required")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"expected {what}, got {_shown(value)}")
        return value

    def optional_integer(self, key: str, what: str, *, minimum: int) -> int | None:
        if not self.has(key):
            self.raw(key)
            return None
        return self.integer(key, what, minimum=minimum)

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_shown(value)}")
        return value

    def sequence(self, key: str) -> Sequence[object]:
        value = self.raw(key)
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.fail(key, f"expected a list, got {_shown(value)}")
        return value

    def done(self) -> None:
        for key in self._map:
            if key not in self._seen:
                where = self.at(str(key) or '""')
                raise self._errors.at(where, "unknown field (see docs/fake-gpus.md for the format)")


@dataclass(frozen=True, slots=True)
class _Errors:
    source: str

    def at(self, where: str, reason: str) -> InventoryError:
        return InventoryError(self.source, where, reason)


def _uuid_ok(text: str) -> bool:
    return text.startswith(("GPU-", "MIG-")) and len(text) > 4 and "," not in text and text.isprintable()


def _parse_gpu(errors: _Errors, position: int, value: object) -> FakeGpu:
    fields = _Fields(errors, f"gpus[{position}]", value)
    uuid = fields.string("uuid")
    if not _uuid_ok(uuid) or any(c.isspace() for c in uuid):
        raise fields.fail("uuid", f'expected "GPU-" followed by the GPU\'s id, got {_shown(uuid)}')
    model = fields.string("model")
    memory = fields.integer("memory", "a positive integer (MiB)", minimum=1)
    index = fields.integer("index", "an integer >= 0", minimum=0, default=position)
    minor = fields.integer("minor", "an integer >= 0", minimum=0, default=index)
    numa = fields.optional_integer("numa", "an integer >= 0 or null (unknown)", minimum=0)
    pci = fields.string("pci_bus_id", default=default_pci_bus_id(index))
    mig, pending, devices = _parse_mig(errors, fields, model)
    healthy = fields.boolean("health", default=True)
    lost = fields.boolean("lost", default=False)
    fields.done()
    return FakeGpu(uuid, model, memory, index, minor, numa, pci, mig, healthy, lost, devices, pending)


def _known_models() -> str:
    return ", ".join(sorted(MIG_MODELS))


def _parse_mig(
    errors: _Errors, fields: _Fields, model_name: str
) -> tuple[bool, bool | None, tuple[FakeMigInstance, ...]]:
    """`mig`: true/false (MIG mode, no MIG devices), or {enabled, pending, devices: [{profile, start}]}.
    Returns (enabled, pending or None, devices). A GPU with MIG enabled or pending must be of a model
    with a MIG profile table; every device must be a profile of that model at one of its placements, not
    overlapping another, and no profile used more often than it can be."""
    raw = fields.raw("mig")
    parsed: list[tuple[str, FakeMigInstance]] = []
    if raw is None or isinstance(raw, bool):
        enabled, pending = bool(raw), None
    elif not isinstance(raw, Mapping):
        raise fields.fail(
            "mig", f"expected true, false or a mapping (enabled, pending, devices), got {_shown(raw)}"
        )
    else:
        mig = _Fields(errors, fields.at("mig"), raw)
        enabled = mig.boolean("enabled", default=True)
        pending_raw = mig.raw("pending")
        if pending_raw is not None and not isinstance(pending_raw, bool):
            raise mig.fail("pending", f"expected true or false, got {_shown(pending_raw)}")
        pending = pending_raw
        where = mig.at("devices")
        for i, entry in enumerate(mig.sequence("devices")):
            device = _Fields(errors, f"{where}[{i}]", entry)
            profile = device.string("profile")
            start = device.integer("start", "an integer >= 0 (the placement's first memory slice)", minimum=0)
            device.done()
            parsed.append((f"{where}[{i}]", FakeMigInstance(profile, start)))
        mig.done()
        if parsed and not enabled:
            raise errors.at(where, "MIG devices need MIG mode enabled (enabled: true, or drop the devices)")
    if enabled or pending:
        model = mig_model(model_name)
        if model is None:
            raise fields.fail(
                "mig",
                f"model {_shown(model_name)} is not MIG capable in the fake (MIG models: {_known_models()})",
            )
        _check_mig_layout(errors, model, parsed)
    return enabled, pending, tuple(instance for _, instance in parsed)


def _check_mig_layout(
    errors: _Errors, model: MigModel, devices: Sequence[tuple[str, FakeMigInstance]]
) -> None:
    model_name = model.name
    taken: list[tuple[str, Placement]] = []
    counts: dict[str, int] = {}
    for where, device in devices:
        profile = model.profile(device.profile)
        if profile is None:
            names = ", ".join(p.name for p in model.profiles)
            raise errors.at(
                f"{where}.profile", f"{_shown(device.profile)} is not a MIG profile of {model_name} ({names})"
            )
        placement = profile.placement_at(device.start)
        if placement is None:
            starts = ", ".join(str(p.start) for p in profile.placements)
            raise errors.at(
                f"{where}.start",
                f"{device.start} is not a placement of {profile.name} on {model_name} (starts: {starts})",
            )
        for other_where, other in taken:
            if placement.overlaps(other):
                raise errors.at(
                    f"{where}.start", f"{profile.name} at {placement} overlaps {other_where} at {other}"
                )
        counts[profile.name] = counts.get(profile.name, 0) + 1
        if counts[profile.name] > profile.instance_count:
            raise errors.at(
                f"{where}.profile",
                f"{profile.name} fits at most {profile.instance_count} time(s) on {model_name}",
            )
        taken.append((where, placement))


def _gpu_ref(fields: _Fields, value: object, by_uuid: Mapping[str, FakeGpu], where: str) -> str:
    """A GPU named by UUID or by index -> its UUID."""
    if isinstance(value, int) and not isinstance(value, bool):
        for gpu in by_uuid.values():
            if gpu.index == value:
                return gpu.uuid
        raise fields.fail(where, f"no GPU with index {value}")
    if isinstance(value, str) and value in by_uuid:
        return value
    if isinstance(value, str):
        raise fields.fail(where, f"no GPU with uuid {_shown(value)} in gpus")
    raise fields.fail(where, f"expected a GPU uuid or index, got {_shown(value)}")


def _nvlinks(fields: _Fields, pair: bool) -> tuple[int | None, int | None]:
    """`nvlinks`: a count, or for a pair [count from the first, count from the second]."""
    value = fields.raw("nvlinks")
    expected = f"an integer from 0 to {MAX_NVLINKS} (NVLinks between each pair)"
    if pair:
        expected += ", or [from the first GPU, from the second] for an NVLink seen from one side only"

    def count(item: object) -> int:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_NVLINKS:
            raise fields.fail("nvlinks", f"expected {expected}, got {_shown(value)}")
        return item

    if value is None:
        return None, None
    if pair and isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if len(value) != 2:
            raise fields.fail("nvlinks", f"expected {expected}, got {_shown(value)}")
        forward, back = count(value[0]), count(value[1])
        return forward, None if back == forward else back
    return count(value), None


def _parse_link(errors: _Errors, where: str, value: object, by_uuid: Mapping[str, FakeGpu]) -> LinkGroup:
    fields = _Fields(errors, where, value)
    refs = fields.sequence("gpus")
    if len(refs) < 2:
        raise fields.fail("gpus", f"expected a list of at least 2 GPUs (uuid or index), got {_shown(refs)}")
    indexes: list[int] = []
    for i, ref in enumerate(refs):
        index = by_uuid[_gpu_ref(fields, ref, by_uuid, f"gpus[{i}]")].index
        if index in indexes:
            raise fields.fail(f"gpus[{i}]", f"GPU {_shown(ref)} is listed twice")
        indexes.append(index)
    nvlinks, reverse = _nvlinks(fields, len(indexes) == 2)
    level: TopologyLevel | None = None
    level_text = fields.raw("pcie")
    if level_text is not None:
        if not isinstance(level_text, str):
            choices = ", ".join(level.label for level in TopologyLevel)
            raise fields.fail("pcie", f"expected one of {choices}, got {_shown(level_text)}")
        try:
            level = TopologyLevel.from_label(level_text)
        except ValueError as exc:
            raise fields.fail("pcie", str(exc)) from None
    if nvlinks is None and level is None:
        raise errors.at(where, "sets neither nvlinks nor pcie (give at least one)")
    fields.done()
    return LinkGroup(tuple(indexes), nvlinks, level, reverse)


def parse_links(
    value: object, gpus: Sequence[FakeGpu], source: str = "<inventory>", where: str = "links"
) -> tuple[LinkGroup, ...]:
    """A `links` list (see docs/fake-gpus.md) for these GPUs, which it names by uuid or index. Raises
    InventoryError naming `source` and the entry (`links[1].nvlinks`)."""
    errors = _Errors(source)
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise errors.at(where, f"expected a list, got {_shown(value)}")
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    return tuple(_parse_link(errors, f"{where}[{i}]", v, by_uuid) for i, v in enumerate(value))


def links_to_data(links: Sequence[LinkGroup]) -> list[dict[str, Any]]:
    """The file form of `links`, GPUs by index."""
    entries: list[dict[str, Any]] = []
    for group in links:
        entry: dict[str, Any] = {"gpus": list(group.gpus)}
        if group.nvlinks is not None:
            back = group.reverse_nvlinks
            entry["nvlinks"] = group.nvlinks if back is None else [group.nvlinks, back]
        if group.level is not None:
            entry["pcie"] = group.level.label
        entries.append(entry)
    return entries


def _parse_event(errors: _Errors, position: int, value: object, by_uuid: Mapping[str, FakeGpu]) -> FakeEvent:
    fields = _Fields(errors, f"events[{position}]", value)
    raw_id = fields.raw("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)
    if not isinstance(raw_id, str) or not raw_id.strip():
        raise fields.fail("id", f"expected a non-empty string (fires once per id), got {_shown(raw_id)}")
    kind_text = fields.raw("kind")
    if kind_text is None:
        raise fields.fail("kind", "is required")
    try:
        kind = GPUEventKind(str(kind_text))
    except ValueError:
        choices = ", ".join(k.value for k in GPUEventKind)
        raise fields.fail("kind", f"expected one of {choices}, got {_shown(kind_text)}") from None
    gpu = None
    if fields.has("gpu"):
        gpu = _gpu_ref(fields, fields.raw("gpu"), by_uuid, "gpu")
    else:
        fields.raw("gpu")
    xid: int | None = None
    if kind is GPUEventKind.XID:
        xid = fields.integer("xid", "a positive integer (the Xid code)", minimum=1)
    elif fields.has("xid"):
        raise fields.fail("xid", f"only allowed with kind xid, got {_shown(fields.raw('xid'))}")
    fields.done()
    return FakeEvent(raw_id.strip(), kind, gpu, xid)


def _unique(errors: _Errors, gpus: Sequence[FakeGpu], key: str) -> None:
    """No two GPUs share `key` (an attribute named like its field in the file)."""
    seen: dict[object, int] = {}
    for position, gpu in enumerate(gpus):
        value = getattr(gpu, key)
        if value in seen:
            raise errors.at(
                f"gpus[{position}].{key}", f"{_shown(value)} is already used by gpus[{seen[value]}]"
            )
        seen[value] = position


def parse_inventory(data: object, source: str = "<inventory>") -> Inventory:
    """Validate a decoded inventory document (the result of yaml/json loading). Raises InventoryError."""
    errors = _Errors(source)
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        data = {"gpus": data}  # a bare list of GPUs is accepted too
    top = _Fields(errors, "", data)
    raw_gpus = top.sequence("gpus")
    gpus = [_parse_gpu(errors, i, value) for i, value in enumerate(raw_gpus)]
    for key in ("uuid", "index", "minor", "pci_bus_id"):
        _unique(errors, gpus, key)
    gpus.sort(key=lambda gpu: gpu.index)
    by_uuid = {gpu.uuid: gpu for gpu in gpus}

    nvml_text = top.raw("nvml")
    if nvml_text is None:
        nvml = NvmlMode.OK
    else:
        try:
            nvml = NvmlMode(str(nvml_text))
        except ValueError:
            choices = ", ".join(mode.value for mode in NvmlMode)
            raise top.fail("nvml", f"expected one of {choices}, got {_shown(nvml_text)}") from None
    if top.has("topology"):
        raise top.fail(
            "topology", "replaced by links (entries of gpus and nvlinks and/or pcie; see docs/fake-gpus.md)"
        )
    links = parse_links(top.raw("links"), gpus, source)
    events = tuple(_parse_event(errors, i, v, by_uuid) for i, v in enumerate(top.sequence("events")))
    seen_ids: dict[str, int] = {}
    for position, event in enumerate(events):
        if event.id in seen_ids:
            raise errors.at(
                f"events[{position}].id",
                f"{_shown(event.id)} is already used by events[{seen_ids[event.id]}]",
            )
        seen_ids[event.id] = position
    top.done()
    return Inventory(tuple(gpus), nvml, links, events)


def _is_json(source: str) -> bool:
    return source.lower().endswith(".json")


def parse_inventory_text(text: str, source: str = "<inventory>") -> Inventory:
    """Parse an inventory file's text: JSON when `source` ends in .json, else YAML (which also reads
    JSON). Raises InventoryError naming the line for syntax errors."""
    errors = _Errors(source)
    if _is_json(source):
        try:
            data: object = json.loads(text)
        except json.JSONDecodeError as exc:
            raise errors.at(f"line {exc.lineno}, column {exc.colno}", f"not valid JSON: {exc.msg}") from None
        except (ValueError, RecursionError) as exc:  # a number of over 4,300 digits; nesting too deep
            raise errors.at("whole file", f"not valid JSON: {exc}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "whole file"
            raise errors.at(where, f"not valid YAML: {exc.problem or exc}") from None
        except yaml.YAMLError as exc:
            raise errors.at("whole file", f"not valid YAML: {exc}") from None
        except RecursionError:  # PyYAML's scanner and constructor recurse once per level of nesting
            raise errors.at("whole file", "not valid YAML: nested too deep") from None
        except ValueError as exc:  # PyYAML's int() of a number of over 4,300 digits
            raise errors.at("whole file", f"not valid YAML: {exc}") from None
    if data is None:
        raise errors.at("whole file", "is empty (expected a mapping with a gpus list)")
    return parse_inventory(data, source)


def load_inventory(path: Path) -> Inventory:
    """Read and parse an inventory file. Raises InventoryError (unreadable file included)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InventoryError(str(path), "whole file", f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(str(path), "whole file", f"is not UTF-8 text: {exc.reason}") from None
    return parse_inventory_text(text, str(path))


# --- rendering and generating ---------------------------------------------------------------------


def inventory_to_data(inventory: Inventory) -> dict[str, Any]:
    """The document form of an inventory: every field explicit; events name GPUs by UUID, links by index."""
    data: dict[str, Any] = {"nvml": inventory.nvml.value, "gpus": []}
    for gpu in inventory.gpus:
        data["gpus"].append(
            {
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory": gpu.memory_mib,
                "index": gpu.index,
                "minor": gpu.minor,
                "numa": gpu.numa_node,
                "pci_bus_id": gpu.pci_bus_id,
                "mig": _mig_to_data(gpu),
                "health": gpu.healthy,
                "lost": gpu.lost,
            }
        )
    if inventory.links:
        data["links"] = links_to_data(inventory.links)
    if inventory.events:
        events = []
        for event in inventory.events:
            entry: dict[str, Any] = {"id": event.id, "kind": event.kind.value}
            if event.gpu is not None:
                entry["gpu"] = event.gpu
            if event.xid is not None:
                entry["xid"] = event.xid
            events.append(entry)
        data["events"] = events
    return data


def _mig_to_data(gpu: FakeGpu) -> bool | dict[str, Any]:
    """The boolean form when MIG has no devices and no pending change, else the mapping form."""
    if not gpu.mig_devices and gpu.mig_pending is None:
        return gpu.mig_enabled
    data: dict[str, Any] = {"enabled": gpu.mig_enabled}
    if gpu.mig_pending is not None:
        data["pending"] = gpu.mig_pending
    data["devices"] = [{"profile": d.profile, "start": d.start} for d in gpu.mig_devices]
    return data


def render_inventory(inventory: Inventory, fmt: Literal["yaml", "json"] = "yaml") -> str:
    data = inventory_to_data(inventory)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)


def write_inventory(path: Path, inventory: Inventory) -> None:
    """Write atomically and durably (`hami_node.durable.write_atomic`, mode 0600); format by suffix (.json
    or YAML)."""
    text = render_inventory(inventory, "json" if _is_json(path.name) else "yaml")
    write_atomic(path, text, mode=0o600)


def default_pci_bus_id(index: int) -> str:
    """A plausible, unique NVML-style bus id for the GPU at `index` (DGX-like spacing)."""
    return f"{index // 32:08X}:{0x07 + 8 * (index % 32):02X}:00.0"


def fake_gpu_uuid(seed: str, index: int) -> str:
    """A deterministic, uuid-shaped GPU UUID for GPU `index` of the node named by `seed`."""
    digest = hashlib.sha256(f"hami-py fake gpu\0{seed}\0{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def generate_inventory(
    count: int,
    seed: str,
    *,
    model: str = DEFAULT_MODEL,
    memory_mib: int = DEFAULT_MEMORY_MIB,
    numa_nodes: int = 2,
    nvlink: bool = True,
) -> Inventory:
    """`count` identical GPUs (8 x A100-SXM4-80GB by default elsewhere) with UUIDs derived from `seed`
    (e.g. the node name), spread evenly over `numa_nodes` (0: unknown), every pair linked by
    `DEFAULT_NVLINKS` NVLinks when `nvlink` (an NVSwitch board)."""
    if count < 0:
        raise ValueError(f"count: expected an integer >= 0, got {count}")
    if memory_mib < 1:
        raise ValueError(f"memory_mib: expected a positive integer (MiB), got {memory_mib}")
    if numa_nodes < 0:
        raise ValueError(f"numa_nodes: expected an integer >= 0, got {numa_nodes}")
    per_node = -(-count // numa_nodes) if numa_nodes else 0
    gpus = tuple(
        FakeGpu(
            uuid=fake_gpu_uuid(seed, i),
            model=model,
            memory_mib=memory_mib,
            index=i,
            minor=i,
            numa_node=i // per_node if numa_nodes else None,
            pci_bus_id=default_pci_bus_id(i),
        )
        for i in range(count)
    )
    links = (LinkGroup(tuple(range(count)), DEFAULT_NVLINKS),) if nvlink and count > 1 else ()
    return Inventory(gpus, NvmlMode.OK, links)
