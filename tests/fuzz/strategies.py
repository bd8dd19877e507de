"""Strategies shared by the fuzz tests: hostile scalars, JSON values that nest deep, and raw text/bytes.

Each strategy mixes values a well-behaved client would send with the ones a parser is most likely to
trip on: wrong JSON types, Go's integer bounds and one past them, digit strings past Python's
4,300-digit `int()` limit, non-ASCII digits that `int()` accepts but Go does not, lone surrogates,
NUL bytes, NaN and infinities (where the input is a Python value rather than JSON text).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

INT_EDGES = (
    0,
    1,
    -1,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    10**30,
)
STRING_EDGES = (
    "",
    " ",
    "0",
    "-0",
    "+1",
    "1.5",
    "1e3",
    "1e999",
    "0x10",
    "NaN",
    "Infinity",
    "true",
    "null",
    "\x00",
    "\ud800",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it, Go's strconv does not
    "１",  # FULLWIDTH DIGIT ONE
    "9" * 30,
    "9" * 5000,  # past Python's int() digit limit (4,300)
    "0." + "1" * 5000,
    "a" * 10_000,
    "GPU-0",
    "NVIDIA",
    "default",
    "hami-core",
    "Requesting_2026-01-02 03:04:05",
    "2026-01-02T03:04:05Z",
)
INT_EDGE_TEXT = tuple(str(i) for i in INT_EDGES)

ints = st.integers() | st.sampled_from(INT_EDGES)
texts = st.text(max_size=40) | st.sampled_from(STRING_EDGES + INT_EDGE_TEXT)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | ints | floats | texts
# Python values a caller may hand over that JSON cannot carry (from YAML, or a bug upstream).
python_scalars = json_scalars | st.floats() | st.binary(max_size=8) | st.complex_numbers()


def json_values(scalars: st.SearchStrategy[Any] = json_scalars, leaves: int = 30) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
        max_leaves=leaves,
    )


def nested_text(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


def deep_json_text(depths: tuple[int, ...] = (300, 1_100, 5_000)) -> st.SearchStrategy[str]:
    """JSON that nests past any recursion limit: arrays or objects, closed or cut off. The default depths
    pass orjson's 255 levels written, its 1,024 read and Python's recursion limit (1,000); the
    100,000-deep documents are explicit examples. PyYAML takes seconds to refuse 1,000 levels (its
    parser is quadratic in depth), so the YAML readers' tests draw `YAML_DEPTHS`."""
    return st.builds(
        lambda depth, kind, closed: (
            ("[" * depth + ("]" * depth if closed else ""))
            if kind == "array"
            else ('{"a":' * depth + "1" + ("}" * depth if closed else ""))
        ),
        st.sampled_from(depths),
        st.sampled_from(["array", "object"]),
        st.booleans(),
    )


YAML_DEPTHS = (300,)


def json_text(values: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    return values.map(lambda v: json.dumps(v, allow_nan=False))


def mutated(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A valid text cut short, with a character dropped, or with junk spliced in."""

    def mutate(s: str, at: int, how: str, junk: str) -> str:
        i = at % (len(s) + 1)
        if how == "cut":
            return s[:i]
        if how == "drop":
            return s[:i] + s[i + 1 :]
        return s[:i] + junk + s[i:]

    return st.builds(mutate, text, st.integers(0, 10_000), st.sampled_from(["cut", "drop", "splice"]), texts)


def raw_text(alphabet: str) -> st.SearchStrategy[str]:
    """Text made mostly of the format's own separators and digits, so it gets past the first checks."""
    return st.text(alphabet=st.sampled_from(alphabet) | st.characters(), max_size=200)


# Every fuzz test: no deadline (a 100,000-deep document takes a while to refuse) and the example count
# of the loaded profile (the default's 100, or HYPOTHESIS_PROFILE=long's 100,000).
fuzz_settings = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
