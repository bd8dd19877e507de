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
digit ("." is rejected) and exponents are limited to +-1000.
"""

from __future__ import annotations

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


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity. Accepts the JSON forms the API server may send: a string, an int
    or (rarely) a float, which is read through its shortest decimal form."""
    if isinstance(text, bool):
        raise QuantityError(str(text), "is a boolean, not a quantity")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(repr(text), "is not a finite number")
        text = repr(text)
    if not isinstance(text, str):
        raise QuantityError(repr(text), f"is a {type(text).__name__}, not a quantity")
    match = _PATTERN.fullmatch(text)
    if text == "" or match is None:
        raise QuantityError(text, "is not a valid Kubernetes quantity")
    int_part, frac_part = match["int"], match["frac"] or ""
    if not int_part and not frac_part:
        raise QuantityError(text, "has no digits")
    mantissa = Fraction(
        int(int_part or "0") * 10 ** len(frac_part) + int(frac_part or "0"), 10 ** len(frac_part)
    )
    suffix = match["suffix"] or ""
    base, exponent = (1024, _BINARY[suffix]) if suffix in _BINARY else (10, _decimal_exponent(text, suffix))
    scale: int = base ** abs(exponent)
    value = mantissa * scale if exponent >= 0 else mantissa / scale
    return -value if match["sign"] == "-" else value


def _decimal_exponent(text: str, suffix: str) -> int:
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
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
