"""NVIDIA's device-plugin config file, `version: v1`, and its flags, as NVIDIA/k8s-device-plugin v0.20.0
reads them (api/config/v1/{config,flags,replicas,resources,sharing,imex}.go, cmd/nvidia-device-plugin/
main.go), so a user's existing file works unchanged.

- `parse_config_text(text, source)` parses the file (YAML or JSON, as `sigs.k8s.io/yaml` does) into a
  `NvidiaConfig` holding what the file says (unset flags are None). Errors carry NVIDIA's text, the key
  path and the file line: `config.yaml line 9: sharing.timeSlicing.resources[0].replicas: number of
  replicas must be >= 2 (got 1)`.
- `resolve(file, given)` applies NVIDIA's precedence (`updateFromCLIFlag`): a flag or its environment
  variable wins when set; otherwise the file; otherwise the flag's default. Then it strips what the plugin
  does not support yet (`DisableResourceNamingInConfig`: custom `resources`, `rename`, `devices`; each a
  warning) and validates as `validateFlags` does, with NVIDIA's texts. It returns a `PluginConfig`.
- `load_config(argv, env, read_file)` does both for NVIDIA's own command line and environment, through
  the one settings loader (`hami_api.settings_loader`; NVIDIA's flags are `NVIDIA_FLAG_SETTINGS`).
- `load_config_file(path)` reads a file from disk (the one I/O here).

Where NVIDIA is looser than it should be, this module is stricter, and says so in the error:
a float where an integer belongs, an empty `deviceListStrategy` list. Unknown keys are ignored, as
NVIDIA's decoder does, but each gives a warning naming it (with "did you mean"). As with Go's
encoding/json, keys of NVIDIA's plain structs (`flags`, `plugin`, `sharing`, `imex`, ...) match
case-insensitively, while the keys its custom decoders read (`resources[]`, `renameByDefault`,
`failRequestsGreaterThanOne`, `name`, `replicas`, `devices`, `rename`, `pattern`) are exact.

HAMi v2.10 vendors v0.19.3 of this code: there `failRequestsGreaterThanOne` is a plain bool (MPS forced to
true whatever the file says) and `sharedDevicesAllocationPolicy` does not exist. `version` of the plugin
this module follows is recorded in `PLUGIN_VERSION`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from hami_api.settings import ConfigError, Invalid, parse_bool, shown, suggest
from hami_api.settings_loader import (
    Document,
    Given,
    KeyPath,
    Setting,
    SettingsLoader,
    key_text,
    parse_document,
)

_E = TypeVar("_E", bound=StrEnum)

PLUGIN_VERSION = "v0.20.0"
VERSION = "v1"
RESOURCE_NAME_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME_LENGTH = 63
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_NVIDIA_CTK_PATH = "/usr/bin/nvidia-ctk"
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"


class MigStrategy(StrEnum):
    """`flags.migStrategy` / `--mig-strategy` (api/config/v1/consts.go)."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceListStrategy(StrEnum):
    """`flags.plugin.deviceListStrategy` values (consts.go)."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"

    @property
    def is_cdi(self) -> bool:
        return self.value.startswith("cdi-")


class DeviceIDStrategy(StrEnum):
    """`flags.plugin.deviceIDStrategy`: what NVIDIA_VISIBLE_DEVICES lists (consts.go)."""

    UUID = "uuid"
    INDEX = "index"


class AllocationPolicy(StrEnum):
    """`flags.plugin.sharedDevicesAllocationPolicy` (v0.20.0; before: always distributed)."""

    DISTRIBUTED = "distributed"
    PACKED = "packed"


class SharingStrategy(StrEnum):
    """What `Sharing.SharingStrategy()` answers (sharing.go)."""

    MPS = "mps"
    NONE = "none"
    TIME_SLICING = "time-slicing"


class DeviceDiscoveryStrategy(StrEnum):
    AUTO = "auto"
    NVML = "nvml"
    TEGRA = "tegra"


# --- resource names (resources.go) ----------------------------------------------------------------------

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_ERROR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def new_resource_name(name: str) -> str:
    """NVIDIA's `NewResourceName`: `nvidia.com/` prepended when absent, at most 63 characters, the part
    after the first `/` a DNS-1123 subdomain. Raises `Invalid` with NVIDIA's text."""
    if not name.startswith(RESOURCE_NAME_PREFIX + "/"):
        name = f"{RESOURCE_NAME_PREFIX}/{name}"
    if len(name) > MAX_RESOURCE_NAME_LENGTH:
        raise Invalid(
            f"fully-qualified resource name must be {MAX_RESOURCE_NAME_LENGTH} characters or less: {name}"
        )
    short = name.split("/", 1)[1]
    problems = []
    if len(short) > 253:
        problems.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.fullmatch(short):
        problems.append(_DNS1123_SUBDOMAIN_ERROR)
    if problems:
        raise Invalid(f"incorrect format for resource name '{name}': [{' '.join(problems)}]")
    return name


def split_resource_name(name: str) -> tuple[str, str]:
    """`ResourceName.Split`: (prefix, name); ("", name) without a `/`."""
    prefix, sep, rest = name.partition("/")
    return (prefix, rest) if sep else ("", name)


def default_shared_rename(name: str) -> str:
    """`ResourceName.DefaultSharedRename`: `<name>.shared`."""
    return name + SHARED_SUFFIX


def pattern_matches(pattern: str, text: str) -> bool:
    """`ResourcePattern.Matches`: `*` matches any run of characters, everything else literally, over the
    whole text (v0.20.0 anchors the pattern; v0.19.3 did not, so `1g.5gb` also matched `1g.5gb+me` and
    `1c.2g.10gb` matched `2g.10gb`)."""
    regex = "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"
    return re.search(regex, text, flags=re.DOTALL) is not None


# --- device references (replicas.go) ------------------------------------------------------------------

_HEX = "[0-9a-fA-F]"
_UUID = re.compile(
    rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
    rf"|\{{{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}\}}"
    rf"|urn:uuid:{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
    rf"|{_HEX}{{32}}",
    re.IGNORECASE,
)
"""The four forms github.com/google/uuid's Parse accepts."""
_MAX_UINT64 = 2**64 - 1


def _is_uint(text: str) -> bool:
    """strconv.ParseUint(text, 10, 0) succeeds: ASCII digits only, no sign, at most 2^64-1."""
    return text.isascii() and text.isdigit() and int(text) <= _MAX_UINT64


def is_gpu_index(ref: str) -> bool:
    """`ReplicatedDeviceRef.IsGPUIndex`: `0`, `1`, ..."""
    return _is_uint(ref)


def is_mig_index(ref: str) -> bool:
    """`ReplicatedDeviceRef.IsMigIndex`: `<gpu>:<mig>`, both unsigned integers."""
    parts = ref.split(":", 1)
    return len(parts) == 2 and all(_is_uint(p) for p in parts)


def is_gpu_uuid(ref: str) -> bool:
    """`IsGpuUUID`: `GPU-<uuid>`."""
    return ref.startswith("GPU-") and _UUID.fullmatch(ref[4:]) is not None


def is_mig_uuid(ref: str) -> bool:
    """`IsMigUUID`: `MIG-<uuid>` (R470+) or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`."""
    if not ref.startswith("MIG-"):
        return False
    suffix = ref[4:]
    if _UUID.fullmatch(suffix):
        return True
    parts = suffix.split("/", 2)
    return len(parts) == 3 and is_gpu_uuid(parts[0]) and all(_is_uint(p) for p in parts[1:])


def is_uuid_ref(ref: str) -> bool:
    return is_gpu_uuid(ref) or is_mig_uuid(ref)


# --- the config's types ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicatedDevices:
    """`ReplicatedDevices`: a union of `all`, a count (> 0) or a list of references (GPU index, MIG index
    `i:j`, GPU or MIG UUID)."""

    all: bool = True
    count: int = 0
    refs: tuple[str, ...] = ()

    def to_document(self) -> object:
        if self.all:
            return "all"
        if self.count > 0:
            return self.count
        return list(self.refs)


ALL_DEVICES = ReplicatedDevices()


@dataclass(frozen=True, slots=True)
class ReplicatedResource:
    """One entry of `sharing.<strategy>.resources`: `name` (fully qualified), `replicas` >= 2, `rename`
    ("" = none) and the devices to replicate."""

    name: str
    replicas: int
    rename: str = ""
    devices: ReplicatedDevices = ALL_DEVICES


@dataclass(frozen=True, slots=True)
class ReplicatedResources:
    """`sharing.timeSlicing` / `sharing.mps`. `fail_requests_greater_than_one` is None when the file does
    not say (v0.20.0's `*bool`)."""

    resources: tuple[ReplicatedResource, ...]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None

    @property
    def is_replicated(self) -> bool:
        return any(r.replicas > 1 for r in self.resources)

    def resource(self, name: str) -> ReplicatedResource | None:
        """The entry for a resource name, the first one as NVIDIA's labeler takes."""
        return next((r for r in self.resources if r.name == name), None)


NO_REPLICAS = ReplicatedResources(resources=())


@dataclass(frozen=True, slots=True)
class Sharing:
    """`sharing`: time-slicing (an empty `ReplicatedResources` when absent) and MPS (None when absent)."""

    time_slicing: ReplicatedResources = NO_REPLICAS
    mps: ReplicatedResources | None = None

    @property
    def strategy(self) -> SharingStrategy:
        """`SharingStrategy()`: mps if MPS replicates anything, else time-slicing if time-slicing does,
        else none."""
        if self.mps is not None and self.mps.is_replicated:
            return SharingStrategy.MPS
        if self.time_slicing.is_replicated:
            return SharingStrategy.TIME_SLICING
        return SharingStrategy.NONE

    @property
    def replicated(self) -> ReplicatedResources:
        """`ReplicatedResources()`: MPS's when set, else time-slicing's."""
        return self.mps if self.mps is not None else self.time_slicing

    @property
    def fails_requests_greater_than_one(self) -> bool:
        """Whether ValidateRequest refuses more than one replica per container (rm.go, v0.20.0: only when
        the active strategy's flag is explicitly true; MPS defaults to true in `resolve`)."""
        if self.strategy is SharingStrategy.NONE:
            return False
        return self.replicated.fail_requests_greater_than_one is True


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """`resources.gpus[]` / `resources.mig[]`: a wildcard pattern on the GPU name or MIG profile, and the
    resource name."""

    pattern: str
    name: str


@dataclass(frozen=True, slots=True)
class Resources:
    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


@dataclass(frozen=True, slots=True)
class Imex:
    channel_ids: tuple[int, ...] = ()
    required: bool = False


@dataclass(frozen=True, slots=True)
class FileFlags:
    """`flags` (and `flags.plugin`) as the file sets them; None = not set (Go's nil pointer)."""

    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    mps_root: str | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    use_node_feature_api: bool | None = None
    device_discovery_strategy: str | None = None
    pass_device_specs: bool | None = None
    device_list_strategy: tuple[str, ...] | None = None
    device_id_strategy: str | None = None
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = None
    container_driver_root: str | None = None
    shared_devices_allocation_policy: str | None = None


@dataclass(frozen=True, slots=True)
class NvidiaConfig:
    """What a config file says (`parse_config_text`). `lines` maps a key path (as `key_text` writes it)
    to its line, for errors found after parsing; `source` is the file's name."""

    version: str = VERSION
    flags: FileFlags = FileFlags()
    resources: Resources = Resources()
    sharing: Sharing = Sharing()
    imex: Imex = Imex()
    warnings: tuple[str, ...] = ()
    source: str = ""
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)

    def to_document(self) -> dict[str, Any]:
        """The file form of this config (what `parse_config_text` reads back to an equal config)."""
        return _to_document(self)


@dataclass(frozen=True, slots=True)
class Flags:
    """The effective flags of the plugin after precedence and defaults (`Config.Flags` once NewConfig and
    validateFlags ran)."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    fail_on_init_error: bool = True
    mps_root: str = ""
    nvidia_driver_root: str = "/"
    nvidia_dev_root: str = "/"
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    device_discovery_strategy: DeviceDiscoveryStrategy = DeviceDiscoveryStrategy.AUTO
    pass_device_specs: bool = False
    device_list_strategy: tuple[DeviceListStrategy, ...] = (DeviceListStrategy.ENVVAR,)
    device_id_strategy: DeviceIDStrategy = DeviceIDStrategy.UUID
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    nvidia_ctk_path: str = DEFAULT_NVIDIA_CTK_PATH
    container_driver_root: str = DEFAULT_CONTAINER_DRIVER_ROOT
    shared_devices_allocation_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED

    @property
    def any_cdi(self) -> bool:
        """`DeviceListStrategies.AnyCDIEnabled`."""
        return any(s.is_cdi for s in self.device_list_strategy)

    @property
    def all_cdi(self) -> bool:
        """`DeviceListStrategies.AllCDIEnabled`."""
        return all(s.is_cdi for s in self.device_list_strategy)


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """The configuration the plugin runs with: effective flags, the sharing it serves (renames and device
    lists stripped as NVIDIA's plugin does), IMEX, and the warnings to log at start-up. `config_file` is
    the file read (None: none)."""

    flags: Flags = Flags()
    sharing: Sharing = Sharing()
    imex: Imex = Imex()
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET
    config_file: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def sharing_strategy(self) -> SharingStrategy:
        return self.sharing.strategy


# --- parsing the file -----------------------------------------------------------------------------------


class _Reader:
    """Walks the parsed document, failing with NVIDIA's text at the key's line."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.warnings: list[str] = []

    def fail(self, path: KeyPath, reason: str, value: object = None, show: bool = True) -> NoReturn:
        got = f" (got {shown(value)})" if show and shown(value) not in reason else ""
        self.doc.fail(path, reason + got, shown(value))

    def struct(
        self, path: KeyPath, value: object, known: Sequence[str], go_type: str
    ) -> dict[str, tuple[str, Any]]:
        """A plain Go struct decoded by encoding/json: keys match fields case-insensitively (an exact
        match first); unknown keys are ignored with a warning. Returns field -> (key as written, value);
        null is an empty struct."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(
                path, f"json: cannot unmarshal {_json_type(value)} into Go value of type {go_type}", value
            )
        by_lower = {k.lower(): k for k in known}
        out: dict[str, tuple[str, Any]] = {}
        for key, item in value.items():
            text = str(key)
            canonical = text if text in known else by_lower.get(text.lower())
            if canonical is None:
                self.warn_unknown((*path, text), known)
                continue
            out[canonical] = (text, item)
        return out

    def exact(self, path: KeyPath, value: object, known: Sequence[str], go_type: str) -> dict[str, Any]:
        """An object read by one of NVIDIA's custom UnmarshalJSON (`map[string]json.RawMessage`): exact
        keys; others ignored with a warning."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(
                path,
                f"json: cannot unmarshal {_json_type(value)} into Go value of type {go_type}",
                value,
            )
        out: dict[str, Any] = {}
        for key, item in value.items():
            text = str(key)
            if text in known:
                out[text] = item
            else:
                self.warn_unknown((*path, text), known)
        return out

    def warn_unknown(self, path: KeyPath, known: Sequence[str]) -> None:
        line = self.doc.line(path)
        where = f"{self.doc.source} line {line}" if line is not None else self.doc.source
        self.warnings.append(
            f"{where}: {key_text(path)}: unknown key, ignored as NVIDIA's plugin ignores it"
            + suggest(str(path[-1]), list(known))
        )

    def string(self, path: KeyPath, value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(
                path,
                f"json: cannot unmarshal {_json_type(value)} into {key_text(path)} of type string",
                value,
            )
        return value

    def boolean(self, path: KeyPath, value: object) -> bool | None:
        if value is None:
            return None
        if not isinstance(value, bool):
            self.fail(
                path, f"json: cannot unmarshal {_json_type(value)} into {key_text(path)} of type bool", value
            )
        return value

    def integer(self, path: KeyPath, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(
                path, f"json: cannot unmarshal {_json_type(value)} into {key_text(path)} of type int", value
            )
        return value


def _json_type(value: object) -> str:
    """The JSON kind Go's UnmarshalTypeError names."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number" if isinstance(value, int) else f"number {value!r}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


_TOP = ("version", "flags", "resources", "sharing", "imex")
_FLAGS = (
    "migStrategy",
    "failOnInitError",
    "mpsRoot",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "gdrcopyEnabled",
    "gdsEnabled",
    "mofedEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "plugin",
    "gfd",
)
_PLUGIN = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "containerDriverRoot",
    "sharedDevicesAllocationPolicy",
)
_GFD = ("oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile")
_FLAG_FIELDS = {
    "migStrategy": "mig_strategy",
    "failOnInitError": "fail_on_init_error",
    "mpsRoot": "mps_root",
    "nvidiaDriverRoot": "nvidia_driver_root",
    "nvidiaDevRoot": "nvidia_dev_root",
    "gdrcopyEnabled": "gdrcopy_enabled",
    "gdsEnabled": "gds_enabled",
    "mofedEnabled": "mofed_enabled",
    "useNodeFeatureAPI": "use_node_feature_api",
    "deviceDiscoveryStrategy": "device_discovery_strategy",
    "passDeviceSpecs": "pass_device_specs",
    "deviceListStrategy": "device_list_strategy",
    "deviceIDStrategy": "device_id_strategy",
    "cdiAnnotationPrefix": "cdi_annotation_prefix",
    "nvidiaCTKPath": "nvidia_ctk_path",
    "containerDriverRoot": "container_driver_root",
    "sharedDevicesAllocationPolicy": "shared_devices_allocation_policy",
}
_BOOL_FLAGS = frozenset(
    {
        "failOnInitError",
        "gdrcopyEnabled",
        "gdsEnabled",
        "mofedEnabled",
        "useNodeFeatureAPI",
        "passDeviceSpecs",
    }
)
_GO_DURATION = re.compile(r"[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)")


def parse_config_text(text: str, source: str = "config file") -> NvidiaConfig:
    """Parse an NVIDIA device-plugin config file (YAML or JSON). Raises `ConfigError` naming `source`, the
    line, the key and NVIDIA's reason."""
    doc = parse_document(text, source)
    r = _Reader(doc)
    top = r.struct((), doc.value, _TOP, "v1.Config")
    version = VERSION
    if "version" in top:
        key, raw = top["version"]
        version = r.string((key,), raw) or VERSION
        if version != VERSION:
            r.fail((key,), f"unknown version: {version}", version, show=False)
    flags = _parse_flags(r, top["flags"]) if "flags" in top else FileFlags()
    resources = _parse_resources(r, top["resources"]) if "resources" in top else Resources()
    sharing = _parse_sharing(r, top["sharing"]) if "sharing" in top else Sharing()
    imex = _parse_imex(r, top["imex"]) if "imex" in top else Imex()
    lines = {key_text(path): line for path, line in doc.lines.items() if path}
    return NvidiaConfig(version, flags, resources, sharing, imex, tuple(r.warnings), source, lines)


def _parse_flags(r: _Reader, entry: tuple[str, Any]) -> FileFlags:
    key, raw = entry
    fields = r.struct((key,), raw, _FLAGS, "v1.Flags")
    values: dict[str, Any] = {}
    for name, (k, v) in fields.items():
        path: KeyPath = (key, k)
        if name == "plugin":
            plugin = r.struct(path, v, _PLUGIN, "v1.PluginCommandLineFlags")
            for pname, (pk, pv) in plugin.items():
                values[_FLAG_FIELDS[pname]] = _flag_value(r, (*path, pk), pname, pv)
        elif name == "gfd":
            _check_gfd(r, path, v)
        else:
            values[_FLAG_FIELDS[name]] = _flag_value(r, path, name, v)
    return FileFlags(**values)


def _flag_value(r: _Reader, path: KeyPath, name: str, value: object) -> object:
    if name in _BOOL_FLAGS:
        return r.boolean(path, value)
    if name == "deviceListStrategy":
        if value is None:
            return None
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            if not value:
                r.fail(
                    path, "invalid deviceListStrategy: [] (give at least one strategy, e.g. envvar)", value
                )
            return tuple(value)
        r.fail(path, f"invalid deviceListStrategy: {_json(value)}", value, show=False)
    return r.string(path, value)


def _check_gfd(r: _Reader, path: KeyPath, value: object) -> None:
    """`flags.gfd` is GPU feature discovery's; the plugin drops it (`loadConfig`), but NVIDIA's decoder
    still rejects a bad type or duration in it."""
    gfd = r.struct(path, value, _GFD, "v1.GFDCommandLineFlags")
    for name, (k, v) in gfd.items():
        at = (*path, k)
        if name in ("oneshot", "noTimestamp"):
            r.boolean(at, v)
        elif name == "sleepInterval":
            if v is None or (isinstance(v, int | float) and not isinstance(v, bool)):
                continue
            if not isinstance(v, str):
                r.fail(at, "invalid duration", v)
            if v != "infinite" and not _GO_DURATION.fullmatch(v):
                r.fail(at, f'time: invalid duration "{v}"', v, show=False)
        else:
            r.string(at, v)


def _json(value: object) -> str:
    import json

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _parse_resources(r: _Reader, entry: tuple[str, Any]) -> Resources:
    key, raw = entry
    fields = r.struct((key,), raw, ("gpus", "mig"), "v1.Resources")
    out: dict[str, tuple[ResourcePattern, ...]] = {}
    for name, (k, v) in fields.items():
        path: KeyPath = (key, k)
        if v is None:
            continue
        if not isinstance(v, list):
            r.fail(path, f"json: cannot unmarshal {_json_type(v)} into Go value of type []v1.Resource", v)
        items = []
        for i, item in enumerate(v):
            at: KeyPath = (*path, i)
            res = r.exact(at, item, ("pattern", "name"), "map[string]json.RawMessage")
            if "pattern" not in res:
                r.fail(at, "resources must have a 'pattern' field set", item, show=False)
            if "name" not in res:
                r.fail(at, "resources must have a 'name' field set", item, show=False)
            pattern = r.string((*at, "pattern"), res["pattern"]) or ""
            items.append(ResourcePattern(pattern, _resource_name(r, (*at, "name"), res["name"])))
        out[name] = tuple(items)
    return Resources(**out)


def _resource_name(r: _Reader, path: KeyPath, value: object) -> str:
    text = r.string(path, value)
    try:
        return new_resource_name(text or "")
    except Invalid as bad:
        r.fail(path, bad.expected, value, show=False)


def _parse_sharing(r: _Reader, entry: tuple[str, Any]) -> Sharing:
    key, raw = entry
    fields = r.struct((key,), raw, ("timeSlicing", "mps"), "v1.Sharing")
    time_slicing = NO_REPLICAS
    mps = None
    if "timeSlicing" in fields:
        k, v = fields["timeSlicing"]
        time_slicing = _parse_replicated_resources(r, (key, k), v)  # null: "no resources specified"
    if "mps" in fields:
        k, v = fields["mps"]
        mps = None if v is None else _parse_replicated_resources(r, (key, k), v)
    return Sharing(time_slicing, mps)


def _parse_replicated_resources(r: _Reader, path: KeyPath, value: object) -> ReplicatedResources:
    """`ReplicatedResources.UnmarshalJSON`."""
    ts = r.exact(
        path,
        value,
        ("renameByDefault", "failRequestsGreaterThanOne", "resources"),
        "map[string]json.RawMessage",
    )
    rename_by_default = bool(r.boolean((*path, "renameByDefault"), ts.get("renameByDefault")))
    fail = r.boolean((*path, "failRequestsGreaterThanOne"), ts.get("failRequestsGreaterThanOne"))
    if "resources" not in ts:
        r.fail(path, "no resources specified", value, show=False)
    raw = ts["resources"]
    at: KeyPath = (*path, "resources")
    if raw is not None and not isinstance(raw, list):
        r.fail(
            at, f"json: cannot unmarshal {_json_type(raw)} into Go value of type []v1.ReplicatedResource", raw
        )
    items = [_parse_replicated_resource(r, (*at, i), item) for i, item in enumerate(raw or [])]
    if not items:
        r.fail(at, "no resources specified", raw, show=False)
    if rename_by_default:
        items = [x if x.rename else replace(x, rename=default_shared_rename(x.name)) for x in items]
    return ReplicatedResources(tuple(items), rename_by_default, fail)


def _parse_replicated_resource(r: _Reader, path: KeyPath, value: object) -> ReplicatedResource:
    """`ReplicatedResource.UnmarshalJSON`."""
    rr = r.exact(path, value, ("name", "rename", "devices", "replicas"), "map[string]json.RawMessage")
    if "name" not in rr:
        r.fail(path, "no resource name specified", value, show=False)
    name = _resource_name(r, (*path, "name"), rr["name"])
    devices = _parse_devices(r, (*path, "devices"), rr.get("devices", "all"))
    if "replicas" not in rr:
        r.fail(path, "no replicas specified", value, show=False)
    replicas = r.integer((*path, "replicas"), rr["replicas"])
    if replicas < 2:
        r.fail((*path, "replicas"), "number of replicas must be >= 2", replicas)
    rename = ""
    if "rename" in rr:
        rename = _resource_name(r, (*path, "rename"), rr["rename"])
    return ReplicatedResource(name, replicas, rename, devices)


def _parse_devices(r: _Reader, path: KeyPath, value: object) -> ReplicatedDevices:
    """`ReplicatedDevices.UnmarshalJSON`: "all", a count > 0, or a list of references."""
    if value is None or isinstance(value, str):
        text = value or ""
        if text != "all":
            r.fail(
                path, f"devices set as '{text}' but the only valid string input is 'all'", value, show=False
            )
        return ALL_DEVICES
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            r.fail(path, f"devices set as '{value}' but a count of devices must be > 0", value, show=False)
        return ReplicatedDevices(all=False, count=value)
    if isinstance(value, list):
        refs = []
        for i, item in enumerate(value):
            if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= _MAX_UINT64:
                refs.append(str(item))
                continue
            text = item if isinstance(item, str) else ""
            if text and (is_gpu_index(text) or is_mig_index(text) or is_uuid_ref(text)):
                refs.append(text)
                continue
            r.fail((*path, i), f"unsupported type for device in devices list: {text}, string", item)
        return ReplicatedDevices(all=False, refs=tuple(refs))
    r.fail(path, f"unrecognized type for devices spec: {_json(value)}", value, show=False)


def _parse_imex(r: _Reader, entry: tuple[str, Any]) -> Imex:
    key, raw = entry
    fields = r.struct((key,), raw, ("channelIDs", "required"), "v1.Imex")
    ids: tuple[int, ...] = ()
    required = False
    if "channelIDs" in fields:
        k, v = fields["channelIDs"]
        if v is not None:
            if not isinstance(v, list):
                r.fail((key, k), f"json: cannot unmarshal {_json_type(v)} into Go value of type []int", v)
            ids = tuple(r.integer((key, k, i), x) for i, x in enumerate(v))
    if "required" in fields:
        k, v = fields["required"]
        required = bool(r.boolean((key, k), v))
    return Imex(ids, required)


def _to_document(config: NvidiaConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"version": config.version}
    flags: dict[str, Any] = {}
    plugin: dict[str, Any] = {}
    for key, name in _FLAG_FIELDS.items():
        value = getattr(config.flags, name)
        if value is None:
            continue
        target = plugin if key in _PLUGIN else flags
        target[key] = list(value) if isinstance(value, tuple) else value
    if plugin:
        flags["plugin"] = plugin
    if flags:
        out["flags"] = flags
    if config.resources.gpus or config.resources.mig:
        out["resources"] = {
            "gpus": [{"pattern": p.pattern, "name": p.name} for p in config.resources.gpus],
            "mig": [{"pattern": p.pattern, "name": p.name} for p in config.resources.mig],
        }
    sharing: dict[str, Any] = {}
    if config.sharing.time_slicing.resources:
        sharing["timeSlicing"] = _replicated_document(config.sharing.time_slicing)
    if config.sharing.mps is not None:
        sharing["mps"] = _replicated_document(config.sharing.mps)
    if sharing:
        out["sharing"] = sharing
    if config.imex != Imex():
        out["imex"] = {"channelIDs": list(config.imex.channel_ids), "required": config.imex.required}
    return out


def _replicated_document(rrs: ReplicatedResources) -> dict[str, Any]:
    out: dict[str, Any] = {"renameByDefault": rrs.rename_by_default}
    if rrs.fail_requests_greater_than_one is not None:
        out["failRequestsGreaterThanOne"] = rrs.fail_requests_greater_than_one
    out["resources"] = [
        {
            "name": r.name,
            "replicas": r.replicas,
            "devices": r.devices.to_document(),
            **({"rename": r.rename} if r.rename else {}),
        }
        for r in rrs.resources
    ]
    return out


# --- flags, environment and precedence -------------------------------------------------------------------


def _any_text(value: object) -> str:
    """A flag's string as urfave/cli keeps it (validated later, with NVIDIA's texts)."""
    if isinstance(value, str):
        return value.strip()
    raise Invalid("a string")


def _text_list(value: object) -> tuple[str, ...]:
    """A string-slice flag: comma-separated (urfave/cli splits environment values on ",")."""
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    raise Invalid("a comma-separated list")


def _int_list(value: object) -> tuple[int, ...]:
    parts = _text_list(value)
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise Invalid("a comma-separated list of integers") from None


NVIDIA_FLAG_SETTINGS: tuple[Setting, ...] = (
    Setting("config_file", "--config-file", "CONFIG_FILE", "", _any_text,
            "the path to a config file as an alternative to command line options or environment variables",
            "FILE"),
    Setting("mig_strategy", "--mig-strategy", "MIG_STRATEGY", "", _any_text,
            "the desired strategy for exposing MIG devices on GPUs that support it: none, single or mixed",
            "STRATEGY"),
    Setting("fail_on_init_error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR", "", parse_bool,
            "fail the plugin if an error is encountered during initialization, otherwise block "
            "indefinitely", "BOOL", optional_bool=True),
    Setting("nvidia_driver_root", "--driver-root", "NVIDIA_DRIVER_ROOT", "", _any_text,
            "the root path for the NVIDIA driver installation on the host", "DIR"),
    Setting("nvidia_driver_root_alias", "--nvidia-driver-root", "", "", _any_text, "alias of --driver-root",
            "DIR"),
    Setting("nvidia_dev_root", "--dev-root", "NVIDIA_DEV_ROOT", "", _any_text,
            "the root path for the NVIDIA device nodes on the host", "DIR"),
    Setting("nvidia_dev_root_alias", "--nvidia-dev-root", "", "", _any_text, "alias of --dev-root", "DIR"),
    Setting("pass_device_specs", "--pass-device-specs", "PASS_DEVICE_SPECS", "", parse_bool,
            "pass the list of DeviceSpecs to the kubelet on Allocate()", "BOOL", optional_bool=True),
    Setting("device_list_strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY", "", _text_list,
            "the desired strategy for passing the device list to the underlying runtime", "STRATEGY",
            repeatable=True),
    Setting("device_id_strategy", "--device-id-strategy", "DEVICE_ID_STRATEGY", "", _any_text,
            "the desired strategy for passing device IDs to the underlying runtime: uuid or index",
            "STRATEGY"),
    Setting("gdrcopy_enabled", "--gdrcopy-enabled", "GDRCOPY_ENABLED", "", parse_bool,
            "start containers with GDRCopy support", "BOOL", optional_bool=True),
    Setting("gds_enabled", "--gds-enabled", "GDS_ENABLED", "", parse_bool,
            "start containers with GPUDirect Storage support", "BOOL", optional_bool=True),
    Setting("mofed_enabled", "--mofed-enabled", "MOFED_ENABLED", "", parse_bool,
            "start containers with MOFED support", "BOOL", optional_bool=True),
    Setting("cdi_annotation_prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX", "", _any_text,
            "the prefix to use for CDI container annotation keys", "PREFIX"),
    Setting("nvidia_ctk_path", "--nvidia-cdi-hook-path", "NVIDIA_CDI_HOOK_PATH", "", _any_text,
            "the path to use for NVIDIA CDI hooks in the generated CDI specification", "PATH"),
    Setting("nvidia_ctk_path_alias", "--nvidia-ctk-path", "NVIDIA_CTK_PATH", "", _any_text,
            "alias of --nvidia-cdi-hook-path", "PATH"),
    Setting("container_driver_root", "--driver-root-ctr-path", "DRIVER_ROOT_CTR_PATH", "", _any_text,
            "the path where the NVIDIA driver root is mounted in the container", "DIR"),
    Setting("container_driver_root_alias", "--container-driver-root", "CONTAINER_DRIVER_ROOT", "", _any_text,
            "alias of --driver-root-ctr-path", "DIR"),
    Setting("mps_root", "--mps-root", "MPS_ROOT", "", _any_text,
            "the path on the host where MPS-specific mounts and files are created", "DIR"),
    Setting("shared_devices_allocation_policy", "--shared-devices-allocation-policy",
            "SHARED_DEVICES_ALLOCATION_POLICY", "", _any_text,
            "the allocation policy for replicated and MIG resources: distributed or packed", "POLICY"),
    Setting("device_discovery_strategy", "--device-discovery-strategy", "DEVICE_DISCOVERY_STRATEGY", "",
            _any_text, "the strategy to use to discover devices: auto, nvml or tegra", "STRATEGY"),
    Setting("imex_channel_ids", "--imex-channel-ids", "IMEX_CHANNEL_IDS", "", _int_list,
            "a list of IMEX channels to inject", "IDS", repeatable=True),
    Setting("imex_required", "--imex-required", "IMEX_REQUIRED", "", parse_bool,
            "the specified IMEX channels are required", "BOOL", optional_bool=True),
    Setting("kubelet_socket", "--kubelet-socket", "KUBELET_SOCKET", "", _any_text,
            "the socket for communicating with the kubelet", "PATH"),
)  # fmt: skip
"""NVIDIA's flags and environment variables (cmd/nvidia-device-plugin/main.go), for the one settings
loader. urfave/cli aliases are separate settings here (`*_alias`), folded into their flag by `resolve`;
the second variable of a flag with two is on the alias."""

NVIDIA_FLAG_DEFAULTS: Mapping[str, object] = {
    "mig_strategy": "none",
    "fail_on_init_error": True,
    "nvidia_driver_root": "/",
    "pass_device_specs": False,
    "device_list_strategy": "envvar",
    "device_id_strategy": "uuid",
    "gdrcopy_enabled": False,
    "gds_enabled": False,
    "mofed_enabled": False,
    "cdi_annotation_prefix": DEFAULT_CDI_ANNOTATION_PREFIX,
    "nvidia_ctk_path": DEFAULT_NVIDIA_CTK_PATH,
    "container_driver_root": DEFAULT_CONTAINER_DRIVER_ROOT,
    "shared_devices_allocation_policy": "distributed",
    "device_discovery_strategy": "auto",
    "kubelet_socket": DEFAULT_KUBELET_SOCKET,
}

_NVIDIA_LOADER = SettingsLoader(
    NVIDIA_FLAG_SETTINGS,
    prog="nvidia-device-plugin",
    description="NVIDIA device plugin for Kubernetes: its flags and environment variables",
    defaults=NVIDIA_FLAG_DEFAULTS,
    file_setting=None,
)

_ALIASES = {
    "nvidia_driver_root_alias": "nvidia_driver_root",
    "nvidia_dev_root_alias": "nvidia_dev_root",
    "nvidia_ctk_path_alias": "nvidia_ctk_path",
    "container_driver_root_alias": "container_driver_root",
}


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where an effective value came from, to name it in an error."""

    source: str
    key: str
    line: int | None = None

    def fail(self, reason: str, value: object) -> NoReturn:
        raise ConfigError(self.source, self.key, reason, self.line, shown(value))


def _origin_of(given: Given, setting: Setting) -> _Origin:
    if given.where.startswith("environment "):
        return _Origin("environment", given.where.removeprefix("environment "))
    return _Origin("command line", given.where.removeprefix("flag ") or setting.flag)


def load_config(
    argv: Sequence[str],
    env: Mapping[str, str],
    read_file: Callable[[Path], str],
    *,
    has_nvml: bool = True,
) -> PluginConfig:
    """NVIDIA's `loadConfig` + `DisableResourceNamingInConfig` + `validateFlags` over its own command
    line (without the program name) and environment: the file named by --config-file / CONFIG_FILE is
    read through `read_file`. Raises `ConfigError` (NVIDIA's texts, naming the source) or
    `HelpRequested`."""
    given = dict(_NVIDIA_LOADER.load(argv, env))
    file_config = None
    if "config_file" in given:
        path = Path(str(given["config_file"].value))
        try:
            text = read_file(path)
        except OSError as err:
            raise ConfigError(
                str(path), "", f"error opening config file: {err.strerror or err}", None, shown(str(path))
            ) from None
        except UnicodeDecodeError as err:
            raise ConfigError(str(path), "", f"is not UTF-8 text ({err.reason})") from None
        file_config = parse_config_text(text, str(path))
    return resolve(file_config, given, has_nvml=has_nvml)


def load_config_file(path: Path) -> NvidiaConfig:
    """Read and parse a config file from disk (NVIDIA's `parseConfig`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(str(path), "", f"error opening config file: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "", f"is not UTF-8 text ({err.reason})") from None
    return parse_config_text(text, str(path))


def resolve(
    file: NvidiaConfig | None,
    given: Mapping[str, Given],
    *,
    has_nvml: bool = True,
) -> PluginConfig:
    """The effective configuration from a parsed file (None: no file) and the flags / environment values
    given (`Given`s by the names of `NVIDIA_FLAG_SETTINGS`): a given value wins, then the file's, then
    the default. Then NVIDIA's stripping of unsupported customisation (warnings) and `validateFlags`."""
    given = dict(given)
    for alias, name in _ALIASES.items():
        if alias in given:
            given.setdefault(name, given.pop(alias))
    file = file or NvidiaConfig()
    values: dict[str, object] = {}
    origins: dict[str, _Origin] = {}
    settings = {s.name: s for s in NVIDIA_FLAG_SETTINGS}
    for f in FileFlags.__dataclass_fields__:
        if f in given:
            values[f] = given[f].value
            origins[f] = _origin_of(given[f], settings[f])
        elif getattr(file.flags, f) is not None:
            values[f] = getattr(file.flags, f)
            key = _file_key(f)
            origins[f] = _Origin(file.source or "config file", key, file.lines.get(key))
        elif f in NVIDIA_FLAG_DEFAULTS:
            values[f] = NVIDIA_FLAG_DEFAULTS[f]
            origins[f] = _Origin("configuration", f"the default of {settings[f].flag}")
    if isinstance(values.get("device_list_strategy"), str):
        values["device_list_strategy"] = _text_list(values["device_list_strategy"])

    warnings = list(file.warnings)
    if file.resources.gpus or file.resources.mig:
        warnings.append("Customizing the 'resources' field is not yet supported in the config. Ignoring...")
    time_slicing, ts_warnings = _disable_renaming(file.sharing.time_slicing, "timeSlicing")
    mps = None
    if file.sharing.mps is not None:
        mps, mps_warnings = _disable_renaming(file.sharing.mps, "mps")
        ts_warnings += mps_warnings
        if mps.fail_requests_greater_than_one is None:  # NewConfig: MPS keeps its historical default
            mps = replace(mps, fail_requests_greater_than_one=True)
    warnings.extend(ts_warnings)
    sharing = Sharing(time_slicing, mps)

    imex = file.imex
    if "imex_channel_ids" in given:
        imex = replace(imex, channel_ids=tuple(given["imex_channel_ids"].value))
    if "imex_required" in given:
        imex = replace(imex, required=bool(given["imex_required"].value))

    flags = _validate(values, origins, sharing, file, has_nvml)
    if imex.channel_ids not in ((), (0,)):
        origin = _Origin(file.source or "config file", "imex.channelIDs", file.lines.get("imex.channelIDs"))
        if "imex_channel_ids" in given:
            origin = _origin_of(given["imex_channel_ids"], settings["imex_channel_ids"])
        origin.fail(
            "invalid IMEX channel IDs: invalid IMEX config: channelIDs must be [] or [0]; found "
            f"[{' '.join(str(i) for i in imex.channel_ids)}]",
            list(imex.channel_ids),
        )
    kubelet_socket = (
        str(given["kubelet_socket"].value) if "kubelet_socket" in given else DEFAULT_KUBELET_SOCKET
    )
    config_file = str(given["config_file"].value) if "config_file" in given else (file.source or None)
    return PluginConfig(flags, sharing, imex, kubelet_socket, config_file, tuple(warnings))


def _file_key(name: str) -> str:
    key = next(k for k, v in _FLAG_FIELDS.items() if v == name)
    return f"flags.plugin.{key}" if key in _PLUGIN else f"flags.{key}"


def _disable_renaming(rrs: ReplicatedResources, which: str) -> tuple[ReplicatedResources, list[str]]:
    """`ReplicatedResources.disableResoureRenaming`: an explicit rename is reset (to `<name>.shared` with
    renameByDefault, else none) and the devices forced to all, each with NVIDIA's warning."""
    sets_rename = sets_devices = False
    out = []
    for r in rrs.resources:
        rename = default_shared_rename(r.name) if rrs.rename_by_default else ""
        if r.rename != rename:
            sets_rename = True
        if not r.devices.all:
            sets_devices = True
        out.append(replace(r, rename=rename, devices=ALL_DEVICES))
    warnings = []
    if sets_rename:
        warnings.append(
            f"Setting the 'rename' field in sharing.{which}.resources is not yet supported in the config. "
            "Ignoring..."
        )
    if sets_devices:
        warnings.append(
            f"Customizing the 'devices' field in sharing.{which}.resources is not yet supported in the "
            "config. Ignoring..."
        )
    return replace(rrs, resources=tuple(out)), warnings


def _validate(
    values: Mapping[str, object],
    origins: Mapping[str, _Origin],
    sharing: Sharing,
    file: NvidiaConfig,
    has_nvml: bool,
) -> Flags:
    """`validateFlags` (main.go), in its order, with its texts."""
    strategies = []
    for s in values["device_list_strategy"]:  # type: ignore[attr-defined]
        try:
            strategies.append(DeviceListStrategy(s))
        except ValueError:
            origins["device_list_strategy"].fail(
                f"invalid --device-list-strategy option: invalid strategy: {s}",
                values["device_list_strategy"],
            )
    if not strategies:
        origins["device_list_strategy"].fail(
            "invalid --device-list-strategy option: no strategy given "
            "(envvar, volume-mounts, cdi-annotations or cdi-cri)",
            "",
        )
    if any(s.is_cdi for s in strategies) and not has_nvml:
        origins["device_list_strategy"].fail(
            "CDI --device-list-strategy options are only supported on NVML-based systems",
            ",".join(strategies),
        )
    id_strategy = _enum(
        DeviceIDStrategy, values, origins, "device_id_strategy", "invalid --device-id-strategy option: {}"
    )
    policy = _enum(
        AllocationPolicy,
        values,
        origins,
        "shared_devices_allocation_policy",
        "invalid --shared-devices-allocation-policy option: {}",
    )
    mig_raw = str(values["mig_strategy"])
    mps_root = str(values.get("mps_root") or "")
    if sharing.strategy is SharingStrategy.MPS:
        mps_where = _Origin(file.source or "config file", "sharing.mps", file.lines.get("sharing.mps"))
        if mig_raw == MigStrategy.MIXED:
            origins["mig_strategy"].fail(
                f"using --mig-strategy=mixed is not supported with MPS (sharing.mps in {mps_where.source}"
                + (f" line {mps_where.line})" if mps_where.line else ")"),
                mig_raw,
            )
        if not mps_root:
            mps_where.fail("using MPS requires --mps-root to be specified", "")
    discovery = _enum(
        DeviceDiscoveryStrategy,
        values,
        origins,
        "device_discovery_strategy",
        "invalid --device-discovery-strategy option {}",
    )
    mig = _enum(MigStrategy, values, origins, "mig_strategy", "unknown MIG strategy: {}")
    driver_root = str(values["nvidia_driver_root"])
    return Flags(
        mig_strategy=mig,
        fail_on_init_error=bool(values["fail_on_init_error"]),
        mps_root=mps_root,
        nvidia_driver_root=driver_root,
        nvidia_dev_root=str(values.get("nvidia_dev_root") or "") or driver_root,
        gdrcopy_enabled=bool(values["gdrcopy_enabled"]),
        gds_enabled=bool(values["gds_enabled"]),
        mofed_enabled=bool(values["mofed_enabled"]),
        device_discovery_strategy=discovery,
        pass_device_specs=bool(values["pass_device_specs"]),
        device_list_strategy=tuple(dict.fromkeys(strategies)),
        device_id_strategy=id_strategy,
        cdi_annotation_prefix=str(values["cdi_annotation_prefix"]),
        nvidia_ctk_path=str(values["nvidia_ctk_path"]),
        container_driver_root=str(values["container_driver_root"]),
        shared_devices_allocation_policy=policy,
    )


def _enum(
    kind: type[_E], values: Mapping[str, object], origins: Mapping[str, _Origin], name: str, text: str
) -> _E:
    raw = str(values[name])
    try:
        return kind(raw)
    except ValueError:
        origins[name].fail(text.format(raw) + f" (choose {', '.join(m.value for m in kind)})", raw)


# --- one sharing mode per node ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HamiCoreSummary:
    """What the node daemon's own settings say about HAMi's sharing on this node, for
    `check_exclusive_with_hami_core`: `operating_mode` (`hami-core`, `mig` or `mps`, HAMi's nodeconfig
    `operatingmode`) and where it came from, and the HAMi-core slicing settings given explicitly
    (setting name -> where, e.g. `{"device_split_count": "flag --device-split-count"}`)."""

    operating_mode: str = "hami-core"
    operating_mode_where: str = "the default"
    slicing_settings: Mapping[str, str] = field(default_factory=dict)


def nvidia_sharing(config: PluginConfig) -> str | None:
    """What of NVIDIA's sharing the config turns on, in words, or None for whole GPUs only."""
    parts = []
    if config.sharing.strategy is not SharingStrategy.NONE:
        rrs = config.sharing.replicated
        shared = ", ".join(f"{r.name} x{r.replicas}" for r in rrs.resources if r.replicas > 1)
        parts.append(f"{config.sharing.strategy.value} ({shared})")
    if config.flags.mig_strategy is not MigStrategy.NONE:
        parts.append(f"MIG strategy {config.flags.mig_strategy.value}")
    return " and ".join(parts) or None


def check_exclusive_with_hami_core(config: PluginConfig, hami: HamiCoreSummary) -> None:
    """One sharing mode per node's GPUs: NVIDIA's (time-slicing, MPS replicas, MIG strategies single /
    mixed, from NVIDIA's config file or flags) or HAMi's (HAMi-core slices, HAMi's MPS, HAMi's dynamic
    MIG). Both on the same GPUs would hand each GPU out twice (kube-scheduler counts NVIDIA's replicas,
    HAMi's scheduler its slices). Raises `ConfigError` saying which to choose."""
    nvidia = nvidia_sharing(config)
    if nvidia is None:
        return
    source = f" ({config.config_file})" if config.config_file else ""
    hami_parts = []
    if hami.operating_mode != "hami-core":
        hami_parts.append(f"HAMi's operating mode {hami.operating_mode} ({hami.operating_mode_where})")
    hami_parts += [f"{name} ({where})" for name, where in sorted(hami.slicing_settings.items())]
    if not hami_parts:
        return
    raise ConfigError(
        "configuration",
        "sharing",
        f"NVIDIA's sharing{source}: {nvidia}, and HAMi's sharing: {'; '.join(hami_parts)}, would share "
        "the same GPUs two ways; choose one: keep NVIDIA's config file and drop HAMi's settings (pods then "
        "go through kube-scheduler alone), or drop sharing and migStrategy from NVIDIA's config to slice "
        "the GPUs with HAMi",
    )


__all__ = [
    "ALL_DEVICES",
    "NO_REPLICAS",
    "NVIDIA_FLAG_DEFAULTS",
    "NVIDIA_FLAG_SETTINGS",
    "PLUGIN_VERSION",
    "VERSION",
    "AllocationPolicy",
    "DeviceDiscoveryStrategy",
    "DeviceIDStrategy",
    "DeviceListStrategy",
    "FileFlags",
    "Flags",
    "HamiCoreSummary",
    "Imex",
    "MigStrategy",
    "NvidiaConfig",
    "PluginConfig",
    "ReplicatedDevices",
    "ReplicatedResource",
    "ReplicatedResources",
    "ResourcePattern",
    "Resources",
    "Sharing",
    "SharingStrategy",
    "check_exclusive_with_hami_core",
    "default_shared_rename",
    "is_gpu_index",
    "is_gpu_uuid",
    "is_mig_index",
    "is_mig_uuid",
    "is_uuid_ref",
    "load_config",
    "load_config_file",
    "new_resource_name",
    "nvidia_sharing",
    "parse_config_text",
    "pattern_matches",
    "resolve",
    "split_resource_name",
]
