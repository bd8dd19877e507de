"""The one settings loader of hami-node and hami-control. Pure: the caller passes the command line, the
environment and a function that reads a file, so tests drive every source without touching the process.

A daemon describes its settings once, in a table of `Setting`s (a flag, an environment variable, a key
in the config file, one parser, the help), and hands it to a `SettingsLoader`, which

- builds the argparse parser and its --help (each flag shows its variable and its default);
- reads the sources, in this order of precedence: flags > environment > config file > defaults (an
  empty variable counts as unset; a repeatable flag's values are joined with ","; a boolean flag takes
  an optional value: `--x`, `--x=false`);
- reads the config file (YAML, so JSON too) named by the file setting (`--config-file` / `CONFIG_FILE`)
  with the line of every key, refusing unknown keys (with "did you mean") and repeated keys; a relative
  path in it is relative to the file's directory for the settings marked so; with `Overrides`, the
  file may also hold per-instance entries (HAMi's `nodeconfig: [{name: node-a, devicesplitcount: 4}]`),
  and the entry of this instance is applied over the file's own keys;
- raises `ConfigError` for the first bad value, naming the source, the key, the file line and the value
  (`node.yaml line 7: nodeconfig[1].devicesplitcount: expected an integer >= 1, got "ten"`).

What it returns (`Loaded`) is every given setting with where it came from; the daemon's config module
builds its typed config from it and checks what only fits together (cross-field rules), naming the
sources through `Loaded.describe`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from hami_api.settings import ConfigError, HelpRequested, Invalid, Parser, shown, suggest


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its flag, environment variable and file key, read by one parser."""

    name: str
    """The typed config's field (or a name the config module resolves itself)."""
    flag: str
    env: str
    """The environment variable ("" = none)."""
    key: str
    """The key at the top of the config file ("" = not allowed there)."""
    parse: Parser
    help: str
    metavar: str = "VALUE"
    _: dataclasses.KW_ONLY
    optional_bool: bool = False
    """The flag takes an optional value: `--x` means `--x=true`."""
    repeatable: bool = False
    """The flag may be given more than once; its values are joined with "," before parsing."""
    default_text: str = ""
    """The default shown in --help ("" = the loader's `defaults`, or "none")."""
    override_key: str = ""
    """Its key in a per-instance entry of the file (`Overrides`); "" = not overridable there."""
    relative_to_file: bool = False
    """A path: relative in the file means relative to the file's directory."""


@dataclass(frozen=True, slots=True)
class Overrides:
    """Per-instance entries in the config file: a list under `section`, each a mapping with `name` (read
    by `parse_name`) and the `override_key`s of settings. The entry whose name equals the value of the
    `selector` setting (from flags, environment or the file's own keys) is applied over the file's own
    keys; flags and environment still win. Every entry is validated, not only the chosen one, so a typo
    in a file shared by every instance is caught by each of them. `instance` names what an entry
    applies to, in messages ("node": "a list of per-node entries")."""

    section: str
    selector: str
    parse_name: Parser
    instance: str


@dataclass(frozen=True, slots=True)
class Given:
    """A setting's value and where it came from: "flag --x", "environment X" or "FILE line N: key"."""

    value: Any
    where: str


class Loaded(Mapping[str, Given]):
    """The settings that were given (by flag, environment or file), by name; the rest keep their
    defaults."""

    def __init__(self, given: Mapping[str, Given], loader: SettingsLoader) -> None:
        self._given = dict(given)
        self._loader = loader

    def __getitem__(self, name: str) -> Given:
        return self._given[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)

    def values_by_name(self) -> dict[str, Any]:
        """name -> value of every given setting."""
        return {name: given.value for name, given in self._given.items()}

    def describe(self, name: str) -> str:
        """Where a setting's value came from, for cross-field errors: its source, or "the default of
        --flag" when it was not given."""
        given = self._given.get(name)
        return given.where if given is not None else f"the default of {self._loader.setting(name).flag}"


class SettingsArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting: `ConfigError` for a bad command line,
    `HelpRequested` for --help."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError("command line", "", message)

    def print_help(self, file: Any = None) -> None:
        raise HelpRequested(self.format_help())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ConfigError("command line", "", message or f"exit {status}")


def dataclass_defaults(cls: type) -> dict[str, Any]:
    """The plain defaults of a dataclass's fields (for --help)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


class SettingsLoader:
    """Reads a table of settings from flags, environment and an optional config file (module doc).

    `prog` and `description` make the --help; `defaults` (name -> value, e.g. `dataclass_defaults(X)`)
    give the defaults it shows; `file_setting` names the setting that names the config file (None: a
    command line and environment only, no file);
    `mapping_example` follows "expected a mapping of settings" when the file is not a mapping.
    Raises `ValueError` for a table that cannot work (two settings with one name, flag or key).
    """

    def __init__(
        self,
        settings: Sequence[Setting],
        *,
        prog: str,
        description: str,
        defaults: Mapping[str, object] | None = None,
        file_setting: str | None = "config_file",
        mapping_example: str = "",
        overrides: Overrides | None = None,
    ) -> None:
        self.settings = tuple(settings)
        self.prog = prog
        self.description = description
        self.defaults = dict(defaults or {})
        self.file_setting = file_setting
        self.mapping_example = mapping_example
        self.overrides = overrides
        self._by_name = _unique(self.settings, "name", lambda s: s.name)
        _unique(self.settings, "flag", lambda s: s.flag)
        self._by_key = _unique([s for s in self.settings if s.key], "file key", lambda s: s.key)
        self._by_override_key = _unique(
            [s for s in self.settings if s.override_key], "override key", lambda s: s.override_key
        )
        if file_setting is not None and file_setting not in self._by_name:
            raise ValueError(f"the file setting {file_setting!r} is not in the table")
        if file_setting is None and (self._by_key or overrides is not None):
            raise ValueError("settings have file keys but the loader reads no file")
        if overrides is not None:
            if overrides.selector not in self._by_name:
                raise ValueError(f"the overrides' selector {overrides.selector!r} is not in the table")
            if overrides.section in self._by_key:
                raise ValueError(f"the overrides' section {overrides.section!r} is also a setting's key")
        elif self._by_override_key:
            raise ValueError("settings have override keys but the loader has no overrides")

    def setting(self, name: str) -> Setting:
        return self._by_name[name]

    # --- the command line ----------------------------------------------------------------------------

    def default_text(self, setting: Setting) -> str:
        """The default --help shows for a setting."""
        if setting.default_text:
            return setting.default_text
        value = self.defaults.get(setting.name)
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def argument_parser(self, prog: str | None = None) -> SettingsArgumentParser:
        """The flags. Each defaults to "not given" (absent from the parsed namespace), so a flag is told
        from a default."""
        parser = SettingsArgumentParser(
            prog=prog or self.prog,
            description=self.description,
            allow_abbrev=False,
            argument_default=argparse.SUPPRESS,
        )
        for s in self.settings:
            env = f"env {s.env}; " if s.env else ""
            help_text = f"{s.help} ({env}default {self.default_text(s)})".replace("%", "%%")
            if s.optional_bool:
                parser.add_argument(
                    s.flag, dest=s.name, nargs="?", const="true", metavar=s.metavar, help=help_text
                )
            elif s.repeatable:
                parser.add_argument(s.flag, dest=s.name, action="append", metavar=s.metavar, help=help_text)
            else:
                parser.add_argument(s.flag, dest=s.name, metavar=s.metavar, help=help_text)
        return parser

    # --- loading ---------------------------------------------------------------------------------------

    def load(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        read_file: Callable[[Path], str] | None = None,
    ) -> Loaded:
        """Every setting given by `argv` (without the program name), `env` and the config file (read with
        `read_file`, which a loader without a file setting does not need). Raises `ConfigError` for the
        first bad value and `HelpRequested` for --help."""
        parsed = vars(self.argument_parser().parse_args(list(argv)))
        flags = {name: self._parse_flag(self._by_name[name], raw) for name, raw in parsed.items()}
        envs = {
            s.name: self._parse_env(s, env[s.env])
            for s in self.settings
            if s.env and env.get(s.env, "").strip()
        }
        file_setting = self.file_setting
        config_file = (flags.get(file_setting) or envs.get(file_setting)) if file_setting else None
        top: dict[str, Given] = {}
        entries: dict[Any, dict[str, Given]] = {}
        if config_file is not None:
            if read_file is None:
                raise ValueError("a config file is named but load() was given no read_file")
            top, entries = self._read_file(Path(config_file.value), read_file)
        entry: dict[str, Given] = {}
        if self.overrides is not None:
            selector = self.overrides.selector
            chosen = flags.get(selector) or envs.get(selector) or top.get(selector)
            if chosen is not None:
                entry = entries.get(chosen.value, {})
        return Loaded({**top, **entry, **envs, **flags}, self)

    @staticmethod
    def _parse_flag(setting: Setting, raw: object) -> Given:
        if isinstance(raw, list):  # a repeatable flag
            raw = ",".join(str(r) for r in raw)
        try:
            return Given(setting.parse(raw), f"flag {setting.flag}")
        except Invalid as bad:
            value = shown(raw)
            raise ConfigError(
                "command line", setting.flag, f"expected {bad.expected}, got {value}", None, value
            ) from None

    @staticmethod
    def _parse_env(setting: Setting, raw: str) -> Given:
        try:
            return Given(setting.parse(raw), f"environment {setting.env}")
        except Invalid as bad:
            value = shown(raw)
            raise ConfigError(
                "environment", setting.env, f"expected {bad.expected}, got {value}", None, value
            ) from None

    # --- the config file -------------------------------------------------------------------------------

    def _read_file(
        self, path: Path, read_file: Callable[[Path], str]
    ) -> tuple[dict[str, Given], dict[Any, dict[str, Given]]]:
        """The file's own settings, and its per-instance entries by name."""
        doc = read_document(path, read_file)
        if doc.value is None:  # an empty document
            return {}, {}
        if not isinstance(doc.value, dict):
            example = f" ({self.mapping_example})" if self.mapping_example else ""
            doc.fail((), f"expected a mapping of settings{example}, got {shown(doc.value)}")
        section = self.overrides.section if self.overrides is not None else None
        top: dict[str, Given] = {}
        for key, raw in doc.value.items():
            if not isinstance(key, str):
                doc.fail((str(key),), "keys must be strings")
            if key == section:
                continue
            setting = self._by_key.get(key)
            if setting is None:
                known = [*self._by_key, *([section] if section else [])]
                doc.fail((key,), "unknown key" + suggest(key, known))
            top[setting.name] = self._parse_in_file(doc, setting, (key,), raw, path.parent)
        if self.overrides is None:
            return top, {}
        return top, self._read_entries(doc, self.overrides, path.parent)

    def _read_entries(
        self, doc: Document, overrides: Overrides, file_dir: Path
    ) -> dict[Any, dict[str, Given]]:
        section = overrides.section
        entries = doc.value.get(section)
        if entries is None:
            return {}
        if not isinstance(entries, list):
            doc.fail((section,), f"expected a list of per-{overrides.instance} entries, got {shown(entries)}")
        known = ("name", *self._by_override_key)
        by_name: dict[Any, dict[str, Given]] = {}
        first_seen: dict[Any, int] = {}
        for i, entry in enumerate(entries):
            at: KeyPath = (section, i)
            if not isinstance(entry, dict):
                doc.fail(at, f"expected a mapping with a name, got {shown(entry)}")
            if entry.get("name") is None:
                doc.fail(at, f"has no name (the {overrides.instance} it applies to)")
            raw_name = entry["name"]
            try:
                name = overrides.parse_name(raw_name)
            except Invalid as bad:
                doc.fail((*at, "name"), f"expected {bad.expected}, got {shown(raw_name)}", shown(raw_name))
            if name in first_seen:
                doc.fail((*at, "name"), f'"{name}" is already configured by {section}[{first_seen[name]}]')
            first_seen[name] = i
            values: dict[str, Given] = {}
            for key, raw in entry.items():
                if key == "name":
                    continue
                setting = self._by_override_key.get(key) if isinstance(key, str) else None
                if setting is None:
                    doc.fail((*at, str(key)), f"unknown {section} key" + suggest(str(key), known))
                values[setting.name] = self._parse_in_file(doc, setting, (*at, key), raw, file_dir)
            by_name[name] = values
        return by_name

    @staticmethod
    def _parse_in_file(doc: Document, setting: Setting, path: KeyPath, raw: object, file_dir: Path) -> Given:
        try:
            value = setting.parse(raw)
        except Invalid as bad:
            doc.fail(path, f"expected {bad.expected}, got {shown(raw)}", shown(raw))
        if setting.relative_to_file and isinstance(value, Path) and not value.is_absolute():
            value = file_dir / value
        return Given(value, f"{doc.source} line {doc.line(path)}: {key_text(path)}")


def _unique(settings: Sequence[Setting], what: str, of: Callable[[Setting], str]) -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for s in settings:
        if of(s) in out:
            raise ValueError(f"settings {out[of(s)].name!r} and {s.name!r} have the same {what} {of(s)!r}")
        out[of(s)] = s
    return out


# --- YAML with the line of every key ---------------------------------------------------------------------

KeyPath = tuple[str | int, ...]
"""Where a value sits in a document: keys and list indexes from the top."""


def key_text(path: KeyPath) -> str:
    """A key path as written in messages: `nodeconfig[1].devicesplitcount`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed config file: its `value` (None when empty) and the line (1-based) of every key and list
    item, so errors point at the line."""

    source: str
    value: Any
    lines: Mapping[KeyPath, int]

    def line(self, path: KeyPath) -> int | None:
        """The line of `path`, or of its nearest enclosing key that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def fail(self, path: KeyPath, reason: str, value: str | None = None) -> NoReturn:
        raise ConfigError(self.source, key_text(path), reason, self.line(path), value)


def read_document(path: Path, read_file: Callable[[Path], str]) -> Document:
    """Read (with `read_file`) and parse a config file. Raises `ConfigError` naming the file."""
    source = str(path)
    try:
        text = read_file(path)
    except OSError as err:
        raise ConfigError(source, "", f"cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(source, "", f"is not UTF-8 text ({err.reason})") from None
    return parse_document(text, source)


def parse_document(text: str, source: str) -> Document:
    """YAML (JSON is YAML too) with the line of every key and item; a key repeated in one mapping is an
    error (YAML would keep the last one silently). Raises `ConfigError` naming `source` and the line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[KeyPath, int] = {}
        if node is None:
            return Document(source, None, lines)
        _record_lines(source, node, (), lines)
        value = yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(source, "", f"is not valid YAML or JSON: {problem}", line) from None
    except ConfigError:  # a key given twice (_record_lines); ConfigError is a ValueError too
        raise
    except RecursionError:  # PyYAML (and _record_lines) recurse once per level of nesting
        raise ConfigError(source, "", "is not valid YAML or JSON: nested too deep") from None
    except ValueError as err:  # PyYAML's int() of a number of over 4,300 digits
        raise ConfigError(source, "", f"is not valid YAML or JSON: {err}") from None
    return Document(source, value, lines)


def _record_lines(source: str, node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                raise ConfigError(
                    source, key_text((*path, key)), f"appears twice (also on line {seen[key]})", line
                )
            seen[key] = line
            lines[(*path, key)] = line
            _record_lines(source, value_node, (*path, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record_lines(source, item, (*path, i), lines)


__all__ = [
    "Document",
    "Given",
    "KeyPath",
    "Loaded",
    "Overrides",
    "Setting",
    "SettingsArgumentParser",
    "SettingsLoader",
    "dataclass_defaults",
    "key_text",
    "parse_document",
    "read_document",
]
