"""Values of the two processes' settings (`hami_node.config`, `hami_control.config`): the one error type,
the value parsers both use (Go's spellings where HAMi's and NVIDIA's flags are Go's), and the "did you
mean" hint. Pure. The sources (flags, environment, file) are read by `hami_api.settings_loader`.

A parser takes the value as written (a string from a flag or the environment, or what YAML made of it)
and returns the typed value, or raises `Invalid` with what it would accept; the loader turns that into a
`ConfigError` naming the source, the key and the value.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

_E = TypeVar("_E", bound=StrEnum)
Parser = Callable[[object], Any]
"""A setting's parser: the value as written -> the typed value, or `Invalid`."""

INT_PATTERN = re.compile(r"[+-]?[0-9]+")
MAX_INT_DIGITS = 100
"""An integer setting written with more significant digits is out of every range (and Python's int()
refuses a text of over 4,300 digits with a ValueError of its own)."""
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""What Go's strconv.ParseBool reads as true (HAMi's and NVIDIA's flags are parsed by it)."""
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*")
RESOURCE_NAME = re.compile(rf"({DNS_LABEL}(\.{DNS_LABEL})*)/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")
PATH_MAX = 4096
"""Linux's PATH_MAX: no longer path names a file."""


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
            if len(value.strip().lstrip("+-").lstrip("0")) > MAX_INT_DIGITS:  # int() refuses 4,300 digits
                raise Invalid(expected)
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


def parse_text(
    expected: str, pattern: re.Pattern[str] | None = None, max_len: int | None = None
) -> Callable[[object], str]:
    """A non-blank string (stripped), matching `pattern` when given, at most `max_len` characters."""

    def parse(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(expected)
        text = value.strip()
        if pattern is not None and not pattern.fullmatch(text):
            raise Invalid(expected)
        if max_len is not None and len(text) > max_len:
            raise Invalid(expected)
        return text

    return parse


def parse_path(value: object) -> Path:
    """A path on this machine (not blank, at most PATH_MAX characters, no NUL: no system call takes
    one, and Python's file functions raise ValueError on it)."""
    text = parse_text("a path", max_len=PATH_MAX)(value)
    if "\x00" in text:
        raise Invalid("a path without a NUL character")
    return Path(text)


def parse_number(low: float, *, inclusive: bool, expected: str | None = None) -> Callable[[object], float]:
    """A finite number (or its decimal text) >= low (`inclusive`) or > low."""
    text = expected or f"a number {'>=' if inclusive else '>'} {low:g}"

    def parse(value: object) -> float:
        if isinstance(value, bool):
            raise Invalid(text)
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise Invalid(text) from None
        else:
            raise Invalid(text)
        if not math.isfinite(number) or number < low or (number == low and not inclusive):
            raise Invalid(text)
        return number

    return parse


parse_qps = parse_number(0, inclusive=True, expected="requests per second >= 0, such as 50 (0: no limit)")
"""A client-side rate limit (`--kube-api-qps`): requests per second, 0 for none."""


def parse_resource_name(value: object) -> str:
    """An extended resource name outside kubernetes.io (`nvidia.com/gpu`), at most 253 characters."""
    text = parse_text("an extended resource name such as nvidia.com/gpu", RESOURCE_NAME, 253)(value)
    domain = text.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise Invalid("an extended resource name outside kubernetes.io, such as nvidia.com/gpu")
    return text


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where a server listens. `host` "" means every address; port 0 picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


LISTEN_ADDRESS = "HOST:PORT, [IPv6]:PORT or :PORT with a port from 0 to 65535"


def parse_listen_address(value: object, expected: str = LISTEN_ADDRESS) -> ListenAddress:
    """`host:port`, `[ipv6]:port` or `:port`, port 0..65535 (Go's net.SplitHostPort forms)."""
    if not isinstance(value, str):
        raise Invalid(expected)
    text = value.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Invalid(expected) from None
    else:
        host, sep, port = text.rpartition(":")
        if host and not HOSTNAME.fullmatch(host):
            raise Invalid(expected)
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise Invalid(expected)
    return ListenAddress(host, int(port))


def suggest(key: str, known: Sequence[str]) -> str:
    """' (did you mean "x"?)' for a misspelt or wrongly cased key, else ""."""
    by_lower = {k.lower(): k for k in known}
    if key.lower() in by_lower:
        return f' (did you mean "{by_lower[key.lower()]}"?)'
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f' (did you mean "{close[0]}"?)' if close else ""
