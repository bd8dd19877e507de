"""Kubernetes resource.Quantity parsing."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity, quantity_int, quantity_value

VALID = [
    ("1", Fraction(1)),
    ("4000", Fraction(4000)),
    ("0", Fraction(0)),
    ("007", Fraction(7)),
    ("+5", Fraction(5)),
    ("-3", Fraction(-3)),
    ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)),
    ("1.", Fraction(1)),
    ("100m", Fraction(1, 10)),
    ("1500m", Fraction(3, 2)),
    ("1n", Fraction(1, 10**9)),
    ("1u", Fraction(1, 10**6)),
    ("1k", Fraction(1000)),
    ("1M", Fraction(10**6)),
    ("1G", Fraction(10**9)),
    ("1T", Fraction(10**12)),
    ("1P", Fraction(10**15)),
    ("1E", Fraction(10**18)),
    ("1Ki", Fraction(1024)),
    ("2Gi", Fraction(2 * 2**30)),
    ("1.5Gi", Fraction(3 * 2**29)),
    ("1Ti", Fraction(2**40)),
    ("1Pi", Fraction(2**50)),
    ("1Ei", Fraction(2**60)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("1e+3", Fraction(1000)),
    ("1e-3", Fraction(1, 1000)),
    ("2.5e2", Fraction(250)),
    (4000, Fraction(4000)),
    (1.5, Fraction(3, 2)),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parse_valid(text: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("100m", 1), ("1.5", 2), ("0.0001", 1), ("-1.5", -2), ("-100m", -1), ("2Gi", 2**31), ("0", 0)],
)
def test_value_rounds_up_away_from_zero(text: str, value: int) -> None:
    assert quantity_value(text) == value


@pytest.mark.parametrize(
    ("text", "value"), [("1", 1), ("1k", 1000), ("1e3", 1000), ("1.5", None), ("100m", None)]
)
def test_quantity_int_is_go_asint64(text: str, value: int | None) -> None:
    assert quantity_int(text) == value


INVALID = [
    "",
    " 1",
    "1 ",
    "1K",
    "1ki",
    "1KI",
    "abc",
    "1e",
    "1.2.3",
    ".",
    "+",
    "-",
    "1Gi1",
    "--1",
    "1e3.5",
    "1e10000",
    "0x10",
    "1_000",
    "١",  # Arabic-Indic digit: Python's int() would take it, Go does not
]


@pytest.mark.parametrize("text", INVALID)
def test_parse_invalid_names_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert info.value.text == text
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), None, [1]])
def test_parse_rejects_non_quantities(value: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


_SUFFIXES: dict[str, int | Fraction] = {
    "": 1,
    "k": 1000,
    "M": 10**6,
    "G": 10**9,
    "m": Fraction(1, 1000),
    "Ki": 1024,
    "Mi": 2**20,
    "Gi": 2**30,
}


@given(st.integers(-(10**12), 10**12), st.sampled_from(sorted(_SUFFIXES)))
def test_integer_with_suffix(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * Fraction(_SUFFIXES[suffix])


@given(st.decimals(allow_nan=False, allow_infinity=False, places=6, min_value=-(10**9), max_value=10**9))
def test_decimal_text_is_exact(number: Decimal) -> None:
    text = f"{number:f}"
    assert parse_quantity(text) == Fraction(number)
    exact = Fraction(number)
    assert quantity_value(text) == (math.ceil(exact) if exact >= 0 else -math.ceil(-exact))


@given(st.integers(-20, 20), st.integers(0, 10**6))
def test_exponent_form(exponent: int, mantissa: int) -> None:
    assert parse_quantity(f"{mantissa}e{exponent}") == mantissa * Fraction(10) ** exponent
