"""Kubernetes resource.Quantity parsing ("1", "4000", "1.5", "100m", "2Gi", "1k", "1e3").

The grammar is apimachinery's:

    <quantity>     ::= <sign>? <number> <suffix>?
    <number>       ::= <digits> | <digits> "." <digits>? | "." <digits>
    <suffix>       ::= <binarySI> | <decimalSI> | <exponent>
    <binarySI>     ::= Ki | Mi | Gi | Ti | Pi | Ei            (powers of 1024)
    <decimalSI>    ::= n | u | m | k | M | G | T | P | E      (powers of 1000)
    <exponent>     ::= ("e" | "E") <sign>? <digits>

Values are exact (`Fraction`). `quantity_value` has Go's `Quantity.Value()` semantics: the value rounded
up, away from zero, to a whole number, so "100m" is 1 and "-1.5" is -2. Anything else raises
`QuantityError` with the text. Stricter than Go in two corners nobody writes: a number needs at least one
digit ("." is rejected), exponents are limited to +-1000, a number to 1,000 significant digits (4,000 in
all) and a value to below 1e1001 (so the canonical text of every accepted value is accepted too).

`canonical_quantity` is the text kube-apiserver writes back for a quantity it was sent (apimachinery's
`ParseQuantity` then `Quantity.String`, k8s.io/apimachinery/pkg/api/resource/quantity.go):
"1.5" -> "1500m", "1536Mi" -> "1536Mi", "1024Mi" -> "1Gi", "0.5Gi" -> "512Mi", 1 -> "1".
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from hami_api.errors import QuantityError

_PATTERN = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
)

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_EXPONENT = 1000
# Go reads any number of digits; past a thousand no quantity means anything, and Python's int() refuses
# a text of more than 4,300 digits (with a ValueError that is not a QuantityError).
_MAX_DIGITS = 1000
_MAX_TEXT_DIGITS = 4000  # leading and trailing zeros included; int() refuses past 4,300
_TOO_LARGE = 10 ** (_MAX_EXPONENT + 1)


def _text(text: str | int | float) -> str:
    """The quantity's text: a JSON number is read through its decimal form (an int exactly, a float
    through its shortest repr)."""
    if isinstance(text, bool):
        raise QuantityError(str(text), "is a boolean, not a quantity")
    if isinstance(text, int):
        if abs(text) >= _TOO_LARGE:
            raise QuantityError(f"<{text.bit_length()}-bit integer>", f"is 1e{_MAX_EXPONENT + 1} or more")
        return str(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(repr(text), "is not a finite number")
        return repr(text)
    if not isinstance(text, str):
        raise QuantityError(repr(text), f"is a {type(text).__name__}, not a quantity")
    return text


def _match(text: str) -> re.Match[str]:
    match = _PATTERN.fullmatch(text)
    if text == "" or match is None:
        raise QuantityError(text, "is not a valid Kubernetes quantity")
    if not match["int"] and not match["frac"]:
        raise QuantityError(text, "has no digits")
    digits = match["int"] + (match["frac"] or "")
    # significant digits: a canonical text pads its mantissa with up to two zeros, which must read back
    if len(digits) > _MAX_TEXT_DIGITS:
        raise QuantityError(text, f"has more than {_MAX_TEXT_DIGITS} digits")
    if len(digits.strip("0")) > _MAX_DIGITS:
        raise QuantityError(text, f"has more than {_MAX_DIGITS} significant digits")
    return match


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity. Accepts the JSON forms the API server may send: a string, an int
    or (rarely) a float, which is read through its shortest decimal form."""
    if isinstance(text, int) and not isinstance(text, bool):
        if abs(text) >= _TOO_LARGE:
            raise QuantityError(f"<{text.bit_length()}-bit integer>", f"is 1e{_MAX_EXPONENT + 1} or more")
        return Fraction(text)
    return _parse_text(_text(text))


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str) -> Fraction:
    """`parse_quantity` of a text, kept for the texts seen last: a cluster's pods repeat a few ("4",
    "16Gi", "8000"), and the pods watch reads each (a Fraction is a value, so sharing one is safe)."""
    match = _match(text)
    int_part, frac_part = match["int"], match["frac"] or ""
    mantissa = Fraction(
        int(int_part or "0") * 10 ** len(frac_part) + int(frac_part or "0"), 10 ** len(frac_part)
    )
    suffix = match["suffix"] or ""
    base, exponent = (1024, _BINARY[suffix]) if suffix in _BINARY else (10, _decimal_exponent(text, suffix))
    scale: int = base ** abs(exponent)
    value = mantissa * scale if exponent >= 0 else mantissa / scale
    if value >= _TOO_LARGE:  # "1000e1000" is 1e1003, written back as "1e1003": refuse it here already
        raise QuantityError(text, f"is 1e{_MAX_EXPONENT + 1} or more")
    return -value if match["sign"] == "-" else value


def _decimal_exponent(text: str, suffix: str) -> int:
    if suffix in _DECIMAL:
        exponent = _DECIMAL[suffix]
    else:
        sign, digits = suffix[1:2] if suffix[1:2] in "+-" else "", suffix[1:].lstrip("+-").lstrip("0")
        if len(digits) > len(str(_MAX_EXPONENT)):  # before int(), which refuses past 4,300 digits
            raise QuantityError(text, f"has an exponent beyond +-{_MAX_EXPONENT}")
        exponent = int(sign + (digits or "0"))
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(text, f"has an exponent beyond +-{_MAX_EXPONENT}")
    return exponent


def quantity_value(text: str | int | float) -> int:
    """Go's `Quantity.Value()`: the value rounded up, away from zero, to an integer."""
    value = parse_quantity(text)
    magnitude = math.ceil(abs(value))
    return -magnitude if value < 0 else magnitude


def quantity_int(text: str | int | float) -> int | None:
    """Go's `Quantity.AsInt64()` without the int64 bound: the value when it is a whole number, else None."""
    value = parse_quantity(text)
    return value.numerator if value.denominator == 1 else None


# --- the canonical text (apimachinery's ParseQuantity + Quantity.String) ------------------------------

_INT64_MAX = 2**63 - 1
_NANO = 10**9
_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIX = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SI, _BINARY_SI, _DECIMAL_EXPONENT = "DecimalSI", "BinarySI", "DecimalExponent"


def canonical_quantity(text: str | int | float) -> str:
    """The text kube-apiserver stores and returns for this quantity (what Go's `ParseQuantity` then
    `String()` give). Raises `QuantityError` for what `parse_quantity` rejects.

    - The suffix family is kept: a decimal suffix (or none) stays DecimalSI, "Ki".."Ei" stay BinarySI,
      "e<n>" stays DecimalExponent.
    - DecimalSI/DecimalExponent: the largest exponent that is a multiple of 3 with no fractional digits
      ("1.5" -> "1500m", "1000M" -> "1G", "1.5e3" -> "1500", "1.5e-3" -> "1500e-6").
    - BinarySI: the largest power of 1024 with an integer mantissa ("1024Mi" -> "1Gi", "1.5Gi" ->
      "1536Mi"); a value below 1024 in magnitude, or one that is not a whole number, is written as
      DecimalSI ("0.5Ki" -> "512", "1.1Ki" -> "1126400m"); a BinarySI value is capped at 2^63-1.
    - Zero is "0"; a non-zero value finer than 1n is rounded up, away from zero, to nano ("0.9n" -> "1n").
    - Go keeps the text as written when its int64 fast path finds it already in canonical form, by a
      loose test, so a few non-canonical spellings survive: "+1", "012", "1.", "1.500k", "1E3", "1e+3".
    - Go's String has no DecimalSI suffix above "E" and drops the exponent instead: "1000E" -> "1"
      (`constructBytes` fails and its result is ignored in every release up to 1.37). Copied as is.
    """
    text = _text(text)
    if text == "0":
        return text
    match = _match(text)
    negative = match["sign"] == "-"
    num = (match["int"] or "").lstrip("0") or "0"
    denom = match["frac"] or ""
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        fmt, base, exponent = _BINARY_SI, 2, _BINARY[suffix] * 10
    elif suffix in _DECIMAL:
        fmt, base, exponent = _DECIMAL_SI, 10, _DECIMAL[suffix]
    else:
        fmt, base, exponent = _DECIMAL_EXPONENT, 10, _decimal_exponent(text, suffix)
    # Go's int64 fast path (ParseQuantity): exact, and it keeps `text` when that looks canonical.
    if base == 10:
        precision = 18 - len(num) - len(denom)
    elif not denom:
        precision = 15 - len(num) - exponent * 3 // 10 - 1
    else:
        precision = -1
    scale = (exponent if base == 10 else 0) - len(denom)
    if precision >= 0 and scale >= -9:
        shifted = num + denom
        digits = int(shifted)
        if (
            base == 10 and scale > _MAX_EXPONENT - 20 and digits * 10**scale >= _TOO_LARGE
        ):  # at most 18 digits
            raise QuantityError(text, f"is 1e{_MAX_EXPONENT + 1} or more")  # what parse_quantity refuses
        magnitude = digits << exponent if base == 2 else digits
        if magnitude <= _INT64_MAX:
            if base == 2:
                if digits & 0x07:
                    return text
            elif scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0":
                return text
            value = Fraction(magnitude) * Fraction(10) ** scale
            return _format(-value if negative else value, fmt)
    # The inf.Dec path: exact, rounded up to nano, BinarySI capped at 2^63-1.
    value = parse_quantity(text)
    magnitude_f = abs(value)
    if magnitude_f:
        magnitude_f = Fraction(math.ceil(magnitude_f * _NANO), _NANO)
    if fmt == _BINARY_SI:
        magnitude_f = min(magnitude_f, Fraction(_INT64_MAX))
    return _format(-magnitude_f if negative else magnitude_f, fmt)


def _format(value: Fraction, fmt: str) -> str:
    """Go's `Quantity.CanonicalizeBytes` for a value with at most nine decimal places."""
    if value == 0:
        return "0"
    if fmt == _BINARY_SI and (abs(value) < 1024 or value.denominator != 1):
        fmt = _DECIMAL_SI
    if fmt == _BINARY_SI:
        number, power = abs(value.numerator), 0
        while number >= 1024 and number % 1024 == 0:
            number //= 1024
            power += 1
        sign = "-" if value < 0 else ""
        return f"{sign}{number}{_BINARY_SUFFIX[power] if power < len(_BINARY_SUFFIX) else ''}"
    scaled = value * _NANO
    if scaled.denominator != 1:
        raise AssertionError(f"{value} has more than nine decimal places")  # callers round first
    mantissa, exponent = scaled.numerator, -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == _DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_SUFFIX.get(exponent, '')}"
