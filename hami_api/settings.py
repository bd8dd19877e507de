"""Building blocks of the two processes' config loaders (`hami_node.config`, `hami_control.config`):
the one error type, value parsers with Go's spellings, and the "did you mean" hint. Pure.

Each loader keeps its own settings table, sources and file handling; only what is the same lives here.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TypeVar

_E = TypeVar("_E", bound=StrEnum)

INT_PATTERN = re.compile(r"[+-]?[0-9]+")
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""What Go's strconv.ParseBool reads as true (HAMi's and NVIDIA's flags are parsed by it)."""
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*")
RESOURCE_NAME = re.compile(rf"({DNS_LABEL}(\.{DNS_LABEL})*)/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class LogLevel(StrEnum):
    """A process's own log level."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class ConfigError(ValueError):
    """A setting that cannot be used. `source` is "command line", "environment", the file's path, or
    "configuration" for settings that do not fit together; `key` the flag, variable or key path (e.g.
    `nodeconfig[1].devicesplitcount`); `line` the file line (1-based) when known; `value` the offending
    value as shown; `reason` what is wrong."""

    def __init__(
        self, source: str, key: str, reason: str, line: int | None = None, value: str | None = None
    ) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        self.line = line
        self.value = value
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.source == "configuration":
            return f"configuration: {self.reason}"
        if self.source in ("command line", "environment"):
            where = f"{self.source} {self.key}" if self.key else self.source
            return f"{where}: {self.reason}"
        where = f"{self.source} line {self.line}" if self.line is not None else self.source
        return f"{where}: {self.key}: {self.reason}" if self.key else f"{where}: {self.reason}"

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str, int | None, str | None]]:
        return (type(self), (self.source, self.key, self.reason, self.line, self.value))


class HelpRequested(Exception):
    """`--help` was given: `text` is the help to print (the parsers never print or exit by themselves)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


class Invalid(Exception):
    """A value a parser rejects: `expected` describes what would be accepted."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        super().__init__(expected)


def shown(value: object) -> str:
    """A value as the user wrote it: strings double-quoted, YAML scalars as YAML spells them."""
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, int | float):
        text = repr(value)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def parse_int(low: int, high: int | None = None) -> Callable[[object], int]:
    """An integer (or its decimal text) in low..high (no upper bound when high is None)."""
    expected = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(value: object) -> int:
        if isinstance(value, bool):
            raise Invalid(expected)
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and INT_PATTERN.fullmatch(value.strip()):
            number = int(value.strip())
        else:
            raise Invalid(expected)
        if number < low or (high is not None and number > high):
            raise Invalid(expected)
        return number

    return parse


def parse_bool(value: object) -> bool:
    """A YAML boolean, or one of Go's ParseBool spellings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value.strip() in GO_TRUE:
            return True
        if value.strip() in GO_FALSE:
            return False
    raise Invalid("true or false")


def parse_enum(kind: type[_E]) -> Callable[[object], _E]:
    """One of the enum's values."""
    expected = "one of " + ", ".join(m.value for m in kind)

    def parse(value: object) -> _E:
        if isinstance(value, str):
            try:
                return kind(value.strip())
            except ValueError:
                pass
        raise Invalid(expected)

    return parse


def suggest(key: str, known: Sequence[str]) -> str:
    """' (did you mean "x"?)' for a misspelt or wrongly cased key, else ""."""
    by_lower = {k.lower(): k for k in known}
    if key.lower() in by_lower:
        return f' (did you mean "{by_lower[key.lower()]}"?)'
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f' (did you mean "{close[0]}"?)' if close else ""
