"""The container runtime's side of CDI, as the stand-in plays it: read the CDI spec files, resolve fully
qualified device names (`vendor/class=name`) to container edits, and apply those edits to what a
container gets. Facts from cncf-tags/container-device-interface (pkg/cdi: cache.go, spec.go, device.go,
container-edits.go; specs-go: config.go, version.go; pkg/parser):

- Spec directories are read in order; a later directory has a higher priority. In each, the regular
  files ending in `.json` or `.yaml` (not subdirectories) are specs; JSON and YAML are both accepted.
- A spec that does not parse or validate is skipped and its error kept; its devices are unknown. A
  device defined by two specs of one directory is a conflict (both dropped, `conflicting device`); of
  two directories, the higher priority wins.
- Validation: known `cdiVersion` (0.1.0 .. 1.1.0) and at least the version the spec's fields need (mount
  `type` 0.4.0; device names starting with a digit, device node `hostPath` 0.5.0; annotations or a dot in
  the class 0.6.0; `intelRdt`, `additionalGids` 0.7.0; `netDevices` 1.1.0); `kind` = vendor/class with
  valid names; at least one device, unique valid names, each with non-empty edits; env entries
  `KEY=VALUE`; device nodes with a path, a type in b c u p, non-negative numbers, permissions of r w m
  (or `none`); mounts with both paths; hooks with a known name and a path. Unknown fields are errors
  (CDI unmarshals strictly).
- Injecting devices: for each name in order, the spec's own edits the first time one of its devices
  is injected, then the device's edits; an unknown name fails the container with
  `unresolvable CDI devices <names>`.
- Applying edits: an env entry replaces one of the same key, else is appended; a device node replaces
  one with the same path (`hostPath` defaults to `path`); a mount replaces one with the same container
  path, and the mounts are then stably sorted by the depth of their container path; hooks and
  additional GIDs are appended.

Left out: device nodes' missing type and numbers are not read from the host (no devices are created);
no hooks run; `intelRdt` and `netDevices` are checked but not applied.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RELEASED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
"""CDI spec versions a reader knows (specs-go/version.go); a spec with another is refused."""

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})

_VENDOR = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")

_SPEC_KEYS = frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"})
_DEVICE_KEYS = frozenset({"name", "annotations", "containerEdits"})
_EDIT_KEYS = frozenset({"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"})
_NODE_KEYS = frozenset(
    {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
)
_MOUNT_KEYS = frozenset({"hostPath", "containerPath", "options", "type"})
_HOOK_KEYS = frozenset({"hookName", "path", "args", "env", "timeout"})
_NET_KEYS = frozenset({"hostInterfaceName", "name"})


class CdiSpecError(ValueError):
    """A CDI spec that cannot be used; the message names the file, the field and the value."""


class CdiResolutionError(Exception):
    """CDI device names the runtime cannot resolve; the message is the runtime's, with the reasons."""


@dataclass(frozen=True)
class ContainerEdits:
    """CDI's ContainerEdits (specs-go), entries kept as the spec gave them."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[Mapping[str, Any], ...] = ()
    mounts: tuple[Mapping[str, Any], ...] = ()
    hooks: tuple[Mapping[str, Any], ...] = ()
    additional_gids: tuple[int, ...] = ()
    net_devices: tuple[Mapping[str, Any], ...] = ()
    intel_rdt: Mapping[str, Any] | None = None

    def is_empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.mounts
            or self.hooks
            or self.additional_gids
            or self.net_devices
            or self.intel_rdt is not None
        )

    def append(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits(
            env=self.env + other.env,
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
            additional_gids=self.additional_gids + other.additional_gids,
            net_devices=self.net_devices + other.net_devices,
            intel_rdt=other.intel_rdt if other.intel_rdt is not None else self.intel_rdt,
        )


@dataclass(frozen=True)
class CdiSpec:
    path: str
    priority: int
    version: str
    vendor: str
    cls: str
    edits: ContainerEdits
    devices: Mapping[str, ContainerEdits]

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def qualified(self, device: str) -> str:
        return f"{self.kind}={device}"


# ------------------------------------------------------------------------------ parsing


def _fail(path: str, where: str, what: str) -> CdiSpecError:
    return CdiSpecError(f"CDI spec {path}: {where}: {what}" if where else f"CDI spec {path}: {what}")


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return repr(value)[:80]


class _Reader:
    """Strict, typed access to a decoded spec, failing with the file and the field path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def mapping(self, value: Any, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise _fail(self.path, where, f"expected an object, got {_shown(value)}")
        for key in value:
            if key not in keys:
                raise _fail(self.path, where, f'unknown field "{key}"')
        return value

    def string(self, value: Any, where: str, *, required: bool = False) -> str:
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            raise _fail(self.path, where, f"expected a string, got {_shown(value)}")
        if required and not value:
            raise _fail(self.path, where, "must not be empty")
        return value

    def integer(self, value: Any, where: str) -> int:
        if value is None:
            return 0
        if not isinstance(value, int) or isinstance(value, bool):
            raise _fail(self.path, where, f"expected an integer, got {_shown(value)}")
        return value

    def items(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise _fail(self.path, where, f"expected a list, got {_shown(value)}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        return tuple(
            self.string(v, f"{where}[{i}]", required=False) for i, v in enumerate(self.items(value, where))
        )

    def annotations(self, value: Any, where: str) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise _fail(self.path, where, f"expected an object, got {_shown(value)}")
        return {str(k): self.string(v, f"{where}.{k}") for k, v in value.items()}

    def env(self, value: Any, where: str) -> tuple[str, ...]:
        env = self.strings(value, where)
        for i, entry in enumerate(env):
            if entry.find("=") <= 0:
                raise _fail(
                    self.path, f"{where}[{i}]", f'invalid environment variable "{entry}" (want KEY=VALUE)'
                )
        return env

    def device_node(self, value: Any, where: str) -> Mapping[str, Any]:
        node = dict(self.mapping(value, where, _NODE_KEYS))
        path = self.string(node.get("path"), f"{where}.path", required=True)
        kind = self.string(node.get("type"), f"{where}.type")
        if kind not in DEVICE_NODE_TYPES:
            raise _fail(
                self.path, f"{where}.type", f'device "{path}": invalid type "{kind}" (want b, c, u or p)'
            )
        for key in ("major", "minor", "fileMode", "uid", "gid"):
            number = self.integer(node.get(key), f"{where}.{key}")
            if key in ("major", "minor") and number < 0:
                raise _fail(
                    self.path, f"{where}.{key}", f'device "{path}": invalid (negative) device number {number}'
                )
        self.string(node.get("hostPath"), f"{where}.hostPath")
        permissions = self.string(node.get("permissions"), f"{where}.permissions")
        if permissions not in ("", "none") and permissions.strip("rwm"):
            raise _fail(
                self.path, f"{where}.permissions", f'device "{path}": invalid permissions "{permissions}"'
            )
        return node

    def mount(self, value: Any, where: str) -> Mapping[str, Any]:
        mount = dict(self.mapping(value, where, _MOUNT_KEYS))
        self.string(mount.get("hostPath"), f"{where}.hostPath", required=True)
        self.string(mount.get("containerPath"), f"{where}.containerPath", required=True)
        self.strings(mount.get("options"), f"{where}.options")
        self.string(mount.get("type"), f"{where}.type")
        return mount

    def hook(self, value: Any, where: str) -> Mapping[str, Any]:
        hook = dict(self.mapping(value, where, _HOOK_KEYS))
        name = self.string(hook.get("hookName"), f"{where}.hookName")
        if name not in HOOK_NAMES:
            raise _fail(
                self.path,
                f"{where}.hookName",
                f'invalid hook name "{name}" (want one of {sorted(HOOK_NAMES)})',
            )
        self.string(hook.get("path"), f"{where}.path", required=True)
        self.strings(hook.get("args"), f"{where}.args")
        self.env(hook.get("env"), f"{where}.env")
        self.integer(hook.get("timeout"), f"{where}.timeout")
        return hook

    def net_devices(self, value: Any, where: str) -> tuple[Mapping[str, Any], ...]:
        devices = []
        hosts: set[str] = set()
        names: set[str] = set()
        for i, raw in enumerate(self.items(value, where)):
            at = f"{where}[{i}]"
            device = dict(self.mapping(raw, at, _NET_KEYS))
            host = self.string(device.get("hostInterfaceName"), f"{at}.hostInterfaceName", required=True)
            name = self.string(device.get("name"), f"{at}.name", required=True)
            if host in hosts or name in names:
                raise _fail(self.path, at, f'duplicate linux net device "{host}" / "{name}"')
            hosts.add(host)
            names.add(name)
            devices.append(device)
        return tuple(devices)

    def edits(self, value: Any, where: str) -> ContainerEdits:
        raw = self.mapping(value, where, _EDIT_KEYS)
        rdt = raw.get("intelRdt")
        if rdt is not None and not isinstance(rdt, Mapping):
            raise _fail(self.path, f"{where}.intelRdt", f"expected an object, got {_shown(rdt)}")
        gids = tuple(
            self.integer(g, f"{where}.additionalGids[{i}]")
            for i, g in enumerate(self.items(raw.get("additionalGids"), f"{where}.additionalGids"))
        )
        return ContainerEdits(
            env=self.env(raw.get("env"), f"{where}.env"),
            device_nodes=tuple(
                self.device_node(n, f"{where}.deviceNodes[{i}]")
                for i, n in enumerate(self.items(raw.get("deviceNodes"), f"{where}.deviceNodes"))
            ),
            mounts=tuple(
                self.mount(m, f"{where}.mounts[{i}]")
                for i, m in enumerate(self.items(raw.get("mounts"), f"{where}.mounts"))
            ),
            hooks=tuple(
                self.hook(h, f"{where}.hooks[{i}]")
                for i, h in enumerate(self.items(raw.get("hooks"), f"{where}.hooks"))
            ),
            additional_gids=gids,
            net_devices=self.net_devices(raw.get("netDevices"), f"{where}.netDevices"),
            intel_rdt=dict(rdt) if rdt is not None else None,
        )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def required_version(document: Mapping[str, Any], edits: Sequence[ContainerEdits], cls: str) -> str:
    """specs-go/version.go MinimumRequiredVersion for the decoded spec."""
    devices = [d for d in document.get("devices") or [] if isinstance(d, Mapping)]
    if any(e.net_devices for e in edits):
        return "1.1.0"
    if any(e.intel_rdt is not None or e.additional_gids for e in edits):
        return "0.7.0"
    if document.get("annotations") or any(d.get("annotations") for d in devices) or "." in cls:
        return "0.6.0"
    names = [str(d.get("name") or "") for d in devices]
    if any(n and not n[0].isalpha() for n in names) or any(
        n.get("hostPath") for e in edits for n in e.device_nodes
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.mounts):
        return "0.4.0"
    return "0.3.0"


def decode_spec_file(data: bytes, path: str) -> Any:
    """The file's content: JSON for `.json`, YAML (which also reads JSON) otherwise."""
    try:
        if path.endswith(".json"):
            return json.loads(data)
        return yaml.safe_load(data)
    except (ValueError, yaml.YAMLError) as exc:
        raise CdiSpecError(f"CDI spec {path}: does not parse: {exc}") from None
    except RecursionError:  # json and PyYAML recurse once per level of nesting
        raise CdiSpecError(f"CDI spec {path}: does not parse: nested too deep") from None


def parse_spec(document: Any, path: str, priority: int = 0) -> CdiSpec:
    """A validated spec from the decoded file (see the module docstring); `CdiSpecError` otherwise."""
    reader = _Reader(path)
    if document is None:
        raise _fail(path, "", "no spec data")
    top = reader.mapping(document, "", _SPEC_KEYS)
    version = reader.string(top.get("cdiVersion"), "cdiVersion", required=True).removeprefix("v")
    if version not in RELEASED_VERSIONS:
        raise _fail(
            path, "cdiVersion", f'invalid version "{version}" (known: {", ".join(RELEASED_VERSIONS)})'
        )
    kind = reader.string(top.get("kind"), "kind", required=True)
    vendor, _, cls = kind.partition("/")
    if not _VENDOR.fullmatch(vendor):
        raise _fail(path, "kind", f'invalid vendor "{vendor}" in "{kind}" (want <vendor>/<class>)')
    if not _CLASS.fullmatch(cls):
        raise _fail(path, "kind", f'invalid class "{cls}" in "{kind}" (want <vendor>/<class>)')
    reader.annotations(top.get("annotations"), "annotations")
    spec_edits = reader.edits(top.get("containerEdits"), "containerEdits")
    devices: dict[str, ContainerEdits] = {}
    for i, raw in enumerate(reader.items(top.get("devices"), "devices")):
        where = f"devices[{i}]"
        device = reader.mapping(raw, where, _DEVICE_KEYS)
        name = reader.string(device.get("name"), f"{where}.name", required=True)
        if not _DEVICE_NAME.fullmatch(name):
            raise _fail(path, f"{where}.name", f'invalid device name "{name}"')
        reader.annotations(device.get("annotations"), f"{where}.annotations")
        edits = reader.edits(device.get("containerEdits"), f"{where}.containerEdits")
        if edits.is_empty():
            raise _fail(
                path, f"{where}.containerEdits", f'device "{name}": invalid device, empty device edits'
            )
        if name in devices:
            raise _fail(path, f"{where}.name", f'invalid spec, multiple device "{name}"')
        devices[name] = edits
    if not devices:
        raise _fail(path, "devices", "invalid spec, no devices")
    needed = required_version(top, [spec_edits, *devices.values()], cls)
    if _version_key(needed) > _version_key(version):
        raise _fail(path, "cdiVersion", f"the spec version must be at least v{needed} (it says {version})")
    return CdiSpec(path, priority, version, vendor, cls, spec_edits, devices)


def read_spec(path: str | os.PathLike[str], priority: int = 0) -> CdiSpec:
    text = os.fspath(path)
    try:
        data = Path(text).read_bytes()
    except OSError as exc:
        raise CdiSpecError(f"CDI spec {text}: cannot read: {exc.strerror or exc}") from None
    return parse_spec(decode_spec_file(data, text), text, priority)


# ------------------------------------------------------------------------------ the registry


@dataclass
class CdiRegistry:
    """The devices of every spec in the spec directories (CDI's Cache after a refresh)."""

    devices: dict[str, tuple[CdiSpec, ContainerEdits]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    """Spec file path -> why it (or one of its devices) is not usable."""

    def resolve(self, names: Iterable[str]) -> ContainerEdits:
        """cache.go InjectDevices: the edits for these fully qualified device names, in order."""
        edits = ContainerEdits()
        seen: set[str] = set()
        unresolved: list[str] = []
        for name in names:
            found = self.devices.get(name)
            if found is None:
                unresolved.append(name)
                continue
            spec, device_edits = found
            if spec.path not in seen:
                seen.add(spec.path)
                edits = edits.append(spec.edits)
            edits = edits.append(device_edits)
        if unresolved:
            message = f"unresolvable CDI devices {', '.join(unresolved)}"
            problems = [f"{p}: {e}" for p, errs in sorted(self.errors.items()) for e in errs]
            if problems:
                message += " (spec problems: " + "; ".join(problems) + ")"
            raise CdiResolutionError(message)
        return edits


def load_registry(directories: Sequence[str | os.PathLike[str]]) -> CdiRegistry:
    """cache.go refresh: read every spec of `directories` (later = higher priority)."""
    registry = CdiRegistry()
    conflicts: set[str] = set()
    for priority, directory in enumerate(directories):
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            registry.errors.setdefault(os.fspath(directory), []).append(f"cannot read: {exc.strerror or exc}")
            continue
        for entry in entries:
            if not entry.name.endswith((".json", ".yaml")) or not entry.is_file():
                continue
            try:
                spec = read_spec(entry.path, priority)
            except CdiSpecError as exc:
                registry.errors.setdefault(entry.path, []).append(str(exc))
                continue
            for name in spec.devices:
                _add_device(registry, conflicts, spec, name)
    for name in conflicts:
        registry.devices.pop(name, None)
    return registry


def _add_device(registry: CdiRegistry, conflicts: set[str], spec: CdiSpec, name: str) -> None:
    qualified = spec.qualified(name)
    other = registry.devices.get(qualified)
    if other is not None:
        other_spec = other[0]
        if other_spec.priority > spec.priority:
            return
        if other_spec.priority == spec.priority:
            error = f'conflicting device "{qualified}" (specs "{spec.path}", "{other_spec.path}")'
            for path in (spec.path, other_spec.path):
                registry.errors.setdefault(path, []).append(error)
            conflicts.add(qualified)
            return
    registry.devices[qualified] = (spec, spec.devices[name])


# ------------------------------------------------------------------------------ applying


def _env_key(entry: str) -> str:
    return entry.partition("=")[0]


def _mount_depth(mount: Mapping[str, Any]) -> int:
    return os.path.normpath(str(mount.get("containerPath") or "")).count("/")


@dataclass
class ContainerView:
    """What a container gets from its devices, in OCI terms: env entries `KEY=VALUE`, mounts
    `{containerPath, hostPath, options[, type]}`, device nodes `{path, hostPath, ...}`, hooks,
    additional GIDs."""

    env: list[str] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)

    def apply(self, edits: ContainerEdits) -> None:
        """container-edits.go Apply (see the module docstring)."""
        for entry in edits.env:
            key = _env_key(entry)
            index = next((i for i, e in enumerate(self.env) if _env_key(e) == key), None)
            if index is None:
                self.env.append(entry)
            else:
                self.env[index] = entry
        for node in edits.device_nodes:
            device = dict(node)
            device.setdefault("hostPath", device["path"])
            if not device["hostPath"]:
                device["hostPath"] = device["path"]
            self.device_nodes = [d for d in self.device_nodes if d.get("path") != device["path"]]
            self.device_nodes.append(device)
        if edits.mounts:
            for mount in edits.mounts:
                self.mounts = [m for m in self.mounts if m.get("containerPath") != mount["containerPath"]]
                self.mounts.append(dict(mount))
            self.mounts.sort(key=_mount_depth)
        self.hooks.extend(dict(h) for h in edits.hooks)
        self.additional_gids.extend(g for g in edits.additional_gids if g != 0)
