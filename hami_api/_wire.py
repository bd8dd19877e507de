"""Low-level pieces shared by the annotation codecs: Go-compatible number, bool, time and JSON handling,
and `Where`, which turns a failed check into a `WireFormatError` naming annotation, position and text.

HAMi's side of the wire is Go, so "what parses" means what Go's strconv, time and encoding/json accept,
minus the corners where Go half-uses a value (those are rejected here with a reason).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, NoReturn

from hami_api.errors import WireFormatError

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)

_GO_INT = re.compile(r"[+-]?[0-9]+")
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True, slots=True)
class Where:
    """The annotation and position a value came from; `fail` raises the contract's one error type."""

    annotation: str
    position: str = "whole value"

    def at(self, position: str) -> Where:
        if self.position == "whole value":
            return Where(self.annotation, position)
        return Where(self.annotation, f"{self.position}, {position}")

    def fail(self, text: str, reason: str, field: str = "") -> NoReturn:
        raise WireFormatError(self.annotation, self.position, text, reason, field)


def parse_int(where: Where, field: str, text: str, bounds: tuple[int, int] = INT32) -> int:
    """Go's strconv.ParseInt/ParseUint in base 10: optional sign, ASCII digits, in range."""
    if not _GO_INT.fullmatch(text):
        where.fail(text, "is not an integer", field)
    low, high = bounds
    # Past 20 significant digits the value is outside every 64-bit bound, and int() refuses a text of
    # more than 4,300 digits with a ValueError of its own: decide the range from the text alone.
    if len(text.lstrip("+-").lstrip("0")) > 20:
        value = -(10**20) if text.startswith("-") else 10**20
    else:
        value = int(text)
    if value < low:
        where.fail(text, "must not be negative" if low == 0 else f"is below {low}", field)
    if value > high:
        where.fail(text, f"is above {high}", field)
    return value


def parse_bool(where: Where, field: str, text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    where.fail(text, "is not a boolean", field)


def check_token(text: str, what: str, forbidden: str) -> str:
    """For encoders: refuse a value that would corrupt a text format (its separators), or is empty."""
    if not text or any(ch in text for ch in forbidden):
        raise ValueError(f"{what} {text!r} cannot be encoded: it is empty or contains one of {forbidden!r}")
    return text


# --- JSON, as Go's encoding/json reads and writes it -------------------------------------------------


class JSONObject(list[tuple[str, Any]]):
    """A decoded JSON object as its (key, value) pairs in document order (Go lets a later duplicate win)."""


class JSONFloat(str):
    """A JSON number with a fraction or exponent, kept as its text: Go refuses it for an integer field."""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def load_json(where: Where, text: str) -> Any:
    """Parse JSON strictly (no NaN/Infinity); objects become `JSONObject`, non-integers `JSONFloat`."""
    try:
        return json.loads(
            text, object_pairs_hook=JSONObject, parse_float=JSONFloat, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as err:
        snippet = text[max(0, err.pos - 20) : err.pos + 20]
        Where(where.annotation, f"line {err.lineno}, column {err.colno}").fail(
            snippet, f"is not valid JSON ({err.msg})"
        )
    except (ValueError, RecursionError) as err:
        where.fail(text, f"is not valid JSON ({err})")


def json_text(value: Any) -> str:
    """A decoded JSON value written back as text, for error messages."""
    try:
        return _json_text(value)
    except RecursionError:
        return "<deeply nested JSON value>"


def _json_text(value: Any) -> str:
    if isinstance(value, JSONFloat):
        return str(value)
    if isinstance(value, JSONObject):
        return "{" + ",".join(f"{json.dumps(k)}:{_json_text(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def json_int(where: Where, field: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        where.fail(json_text(value), "is not an integer", field)
    return parse_int(where, field, str(value), bounds)


def json_str(where: Where, field: str, value: Any) -> str:
    if not isinstance(value, str) or isinstance(value, JSONFloat):
        where.fail(json_text(value), "is not a string", field)
    # Go decodes an unpaired \ud800 escape as U+FFFD; do the same so both sides see one string.
    return _LONE_SURROGATE.sub("\ufffd", value)


def json_bool(where: Where, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        where.fail(json_text(value), "is not a boolean", field)
    return value


def json_list(where: Where, field: str, value: Any) -> list[Any]:
    if not isinstance(value, list) or isinstance(value, JSONObject):
        where.fail(json_text(value), "is not an array", field)
    return value


def json_pairs(where: Where, field: str, value: Any) -> JSONObject:
    """A JSON object with free-form keys (a Go map), as its pairs."""
    if not isinstance(value, JSONObject):
        where.fail(json_text(value), "is not an object", field)
    return value


def json_object(where: Where, field: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
    """An object's members by their canonical key. Like Go: keys match case-insensitively (an exact
    match wins), unknown keys are ignored, a later duplicate overrides, and null leaves a field unset."""
    if not isinstance(value, JSONObject):
        where.fail(json_text(value), "is not an object", field)
    folded = {key.casefold(): key for key in known}
    members: dict[str, Any] = {}
    for key, member in value:
        canonical = key if key in known else folded.get(key.casefold())
        if canonical is not None and member is not None:
            members[canonical] = member
    return members


def go_json_string(text: str) -> str:
    """A string literal exactly as Go's json.Marshal writes it: UTF-8 kept, HTML-sensitive characters
    and the JS line separators escaped, invalid UTF-16 (lone surrogates) replaced by U+FFFD."""
    encoded = json.dumps(_LONE_SURROGATE.sub("\ufffd", text), ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(raw, escaped)
    return encoded.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# --- time formats ----------------------------------------------------------------------------------

_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?", re.ASCII)
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})", re.ASCII
)
_GO_STRING = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ([+-])(\d{2})(\d{2}) \S+"
    r"(?: m=[+-]\d+\.\d{9})?",
    re.ASCII,
)


def _build(
    where: Where, field: str, text: str, parts: tuple[str | None, ...], tz: timezone | None
) -> datetime:
    year, month, day, hour, minute, second, fraction = parts[:7]
    micros = int(((fraction or "") + "000000")[:6])  # Go keeps nanoseconds; Python stops at micros
    try:
        return datetime(
            int(year or 0), int(month or 0), int(day or 0), int(hour or 0), int(minute or 0),
            int(second or 0), micros, tzinfo=tz,
        )  # fmt: skip
    except ValueError as err:
        where.fail(text, f"is not a valid time ({err})", field)


def parse_local_datetime(where: Where, field: str, text: str) -> datetime:
    """Go's time.DateTime layout "2006-01-02 15:04:05" as a naive (wall clock, no zone) datetime."""
    match = _DATETIME.fullmatch(text)
    if match is None:
        where.fail(text, 'is not a "2006-01-02 15:04:05" time', field)
    return _build(where, field, text, match.groups(), None)


def format_local_datetime(moment: datetime) -> str:
    return f"{moment.year:04d}-{moment:%m-%d %H:%M:%S}"


def _offset(where: Where, field: str, text: str, zone: tuple[str, str, str]) -> timezone:
    sign, hours, minutes = zone
    delta = timedelta(hours=int(hours), minutes=int(minutes))
    if int(minutes) > 59 or delta >= timedelta(hours=24):
        where.fail(text, "has a zone offset out of range", field)
    return UTC if not delta else timezone(-delta if sign == "-" else delta)


def parse_rfc3339(where: Where, field: str, text: str) -> datetime:
    """Go's time.RFC3339 as an aware datetime (fractional seconds accepted, as Go's parser does)."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        where.fail(text, "is not an RFC 3339 time", field)
    zone = match[8]
    tz = UTC if zone == "Z" else _offset(where, field, text, (zone[0], zone[1:3], zone[4:6]))
    return _build(where, field, text, match.groups(), tz)


def _offset_minutes(moment: datetime) -> int:
    offset = moment.utcoffset()
    if offset is None:
        raise ValueError(f"time {moment!r} has no zone; wire times must be timezone-aware")
    if offset % timedelta(minutes=1):
        raise ValueError(f"time {moment!r} has a zone offset with seconds, which RFC 3339 cannot write")
    return offset // timedelta(minutes=1)


def format_rfc3339(moment: datetime) -> str:
    """Go's time.Format(time.RFC3339): whole seconds, "Z" for UTC, else +hh:mm."""
    minutes = _offset_minutes(moment)
    zone = (
        "Z"
        if minutes == 0
        else f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    )
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}{zone}"


def parse_go_time_string(where: Where, field: str, text: str) -> datetime:
    """Go's Time.String(): "2006-01-02 15:04:05.999999999 -0700 MST", maybe with a monotonic
    " m=+1.000000001" tail. The zone abbreviation and monotonic reading are dropped."""
    match = _GO_STRING.fullmatch(text)
    if match is None:
        where.fail(text, 'is not a Go time string ("2006-01-02 15:04:05 -0700 MST")', field)
    tz = _offset(where, field, text, (match[8], match[9], match[10]))
    return _build(where, field, text, match.groups(), tz)


def format_go_time_string(moment: datetime) -> str:
    """Go's Time.String() for an aware datetime; the zone is written "UTC" or numerically ("+08")."""
    minutes = _offset_minutes(moment)
    sign, absolute = ("-" if minutes < 0 else "+"), abs(minutes)
    numeric = f"{sign}{absolute // 60:02d}{absolute % 60:02d}"
    name = (
        "UTC"
        if minutes == 0
        else f"{sign}{absolute // 60:02d}" + (f"{absolute % 60:02d}" if absolute % 60 else "")
    )
    fraction = f".{moment.microsecond:06d}".rstrip("0") if moment.microsecond else ""
    return f"{format_local_datetime(moment)}{fraction} {numeric} {name}"
