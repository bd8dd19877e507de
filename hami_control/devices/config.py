"""HAMi's device config (`device-config.yaml`, the ConfigMap `<release>-scheduler-device`), read once at
start-up through the settings loader's YAML reader, so a bad value stops hami-control naming the file,
the key, the line and the value.

The file's top-level keys are HAMi's (pkg/scheduler/config/config.go `Config`): `nvidia`, `cambricon`,
`hygon`, `metax`, `mthreads`, `iluvatars` (a list), `enflame`, `kunlun`, `awsneuron`, `amd`, `vastai`,
`biren`, `vnpus`. Each vendor module reads its own section through a `Section`, whose getters check the
type and record what was read; `Section.finish()` then refuses a key nobody read, with a suggestion
(HAMi's yaml.v2 ignores it silently, which hides typos). A section missing from the file gets the chart's
values (`DEFAULT_DEVICE_CONFIG`, charts/hami/templates/scheduler/device-configmap.yaml rendered with the
chart's values.yaml of v2.10.0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hami_api.settings import ConfigError, shown, suggest
from hami_api.settings_loader import Document, KeyPath, parse_document

TOP_LEVEL_KEYS = (
    "nvidia", "cambricon", "hygon", "metax", "mthreads", "iluvatars", "enflame", "kunlun", "awsneuron",
    "amd", "vastai", "biren", "vnpus",
)  # fmt: skip

DEFAULT_FILE = "device-config.yaml"


def default_text() -> str:
    """The chart's device-config.yaml (v2.10.0, default values), shipped with the package."""
    return resources.files("hami_control.devices").joinpath(DEFAULT_FILE).read_text(encoding="utf-8")


@dataclass(slots=True)
class Section:
    """One part of the document (a mapping) with typed getters that fail naming key, line and value."""

    document: Document
    path: KeyPath
    value: Mapping[str, Any]
    read: set[str] = field(default_factory=set)
    ignored: frozenset[str] = frozenset()

    def fail(self, key: str | int | None, reason: str, value: Any = None) -> ConfigError:
        path = self.path if key is None else (*self.path, key)
        text = None if value is None else shown(value)
        said = reason if text is None else f"{reason}, got {text}"
        return ConfigError(self.document.source, _key_text(path), said, self.document.line(path), text)

    def has(self, key: str) -> bool:
        return key in self.value

    def raw(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.value.get(key, default)

    def text(self, key: str, default: str = "") -> str:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(key, "must be a string", value)
        return str(value)

    def integer(self, key: str, default: int = 0, low: int | None = None, high: int | None = None) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "must be an integer", value)
        if low is not None and value < low:
            raise self.fail(key, f"must be >= {low}", value)
        if high is not None and value > high:
            raise self.fail(key, f"must be <= {high}", value)
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, str) and value.lower() in ("true", "false"):  # the chart quotes some booleans
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise self.fail(key, "must be true or false", value)
        return value

    def section(self, key: str) -> Section | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(key, "must be a mapping", value)
        return Section(self.document, (*self.path, key), value)

    def sections(self, key: str) -> list[Section]:
        """A list of mappings under `key` (empty when absent)."""
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "must be a list", value)
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise self.fail(key, f"item {i} must be a mapping", item)
            out.append(Section(self.document, (*self.path, key, i), item))
        return out

    def strings(self, key: str) -> list[str]:
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of strings", value)
        return list(value)

    def finish(self) -> None:
        """Refuse a key no getter read (a typo: HAMi would ignore it silently)."""
        for key in self.value:
            if key not in self.read and key not in self.ignored:
                known = sorted(self.read | self.ignored)
                hint = suggest(str(key), known)
                raise self.fail(str(key), f"is not a known key here{hint}")


def _key_text(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """The parsed file: each top-level section (a `Section`, or a list of them for `iluvatars`), with
    the chart's default section where the file has none."""

    source: str
    top: Section
    defaults: Section | None
    file_given: bool = True
    """False when hami-control runs on the chart's defaults alone (no --device-config-file)."""

    def section(self, key: str) -> Section:
        """The file's section `key`, else the chart's, else an empty one."""
        for top in (self.top, self.defaults):
            if top is not None and top.has(key):
                found = top.section(key)
                if found is not None:
                    return found
        return Section(self.top.document, (key,), {})

    def sections(self, key: str) -> list[Section]:
        """A list section (`iluvatars`): the file's when it has the key, else the chart's."""
        for top in (self.top, self.defaults):
            if top is not None and top.has(key):
                return top.sections(key)
        return []

    def given(self, key: str) -> bool:
        return self.top.has(key)


def parse_device_config(text: str, source: str, *, with_defaults: bool = True) -> DeviceConfig:
    """Parse a device-config.yaml. Raises `ConfigError` naming `source`, the key and the line."""
    document = parse_document(text, source)
    value = document.value if document.value is not None else {}
    if not isinstance(value, Mapping):
        raise ConfigError(source, "", "must be a mapping of vendor sections (nvidia:, hygon:, ...)")
    top = Section(document, (), value)
    for key in value:
        if key not in TOP_LEVEL_KEYS:
            raise top.fail(str(key), f"is not a device config section{suggest(str(key), TOP_LEVEL_KEYS)}")
    defaults = None
    if with_defaults:
        default_doc = parse_document(default_text(), f"<chart default {DEFAULT_FILE}>")
        defaults = Section(default_doc, (), default_doc.value)
    return DeviceConfig(source, top, defaults)


def load_device_config(path: Path | None, read_file: Callable[[Path], str]) -> DeviceConfig:
    """The file at `path` (None: the chart's defaults alone)."""
    if path is None:
        config = parse_device_config(default_text(), f"<chart default {DEFAULT_FILE}>", with_defaults=False)
        return DeviceConfig(config.source, config.top, None, file_given=False)
    try:
        text = read_file(path)
    except OSError as err:
        raise ConfigError(str(path), "", f"cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "", f"is not UTF-8 text ({err.reason})") from None
    return parse_device_config(text, str(path))


def finish_all(sections: Iterable[Section]) -> None:
    for section in sections:
        section.finish()


__all__ = [
    "DEFAULT_FILE",
    "TOP_LEVEL_KEYS",
    "DeviceConfig",
    "Section",
    "default_text",
    "finish_all",
    "load_device_config",
    "parse_device_config",
]
