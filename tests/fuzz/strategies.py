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

import hami_api.annotations as A
from hami_control.dra_translate import ANNOTATION as DRA_CLAIMS

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


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` three times in four, so most examples get past this level to the ones below it."""
    return st.one_of(valid, valid, valid, hostile)


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


# --- quantities ---------------------------------------------------------------------------------------

_quantity_text = st.builds(
    lambda sign, whole, dot, frac, suffix: sign + whole + dot + frac + suffix,
    st.sampled_from(["", "+", "-", "--"]),
    st.sampled_from(["", "0", "1", "012", "9" * 19, "9" * 1001, "1" * 5000]) | st.integers(0).map(str),
    st.sampled_from(["", "."]),
    st.sampled_from(["", "5", "000", "123456789123", "1" * 5000]),
    st.sampled_from(["", "m", "k", "Ki", "Mi", "Ei", "E", "e3", "e-9", "E+18", "e1000", "e1001", "e-1001"])
    | st.sampled_from(["e", "e-", "e+"]).map(lambda e: e + "0" * 5000 + "7"),
)
json_quantities = (
    _quantity_text
    | mutated(_quantity_text)
    | raw_text("0123456789.+-eEkKMGTPimnu ")
    | st.integers()
    | st.sampled_from(INT_EDGES)
    | floats
)
"""Quantities as a JSON document carries them (text or numbers)."""
quantities = json_quantities | st.floats() | python_scalars
"""...and what a caller may hand over besides (NaN, bytes, complex)."""


# --- annotation values: structured forms that get past the decoders' first checks -------------------


_GPU_KEYS = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "migProfiles", "health")
_field_value = json_values(leaves=6)
_mig = st.dictionaries(
    st.sampled_from(("name", "memoryMB", "core", "sliceCount", "placements", "x")),
    _field_value
    | st.lists(
        st.dictionaries(st.sampled_from(("start", "size", "x")), _field_value, max_size=3), max_size=3
    ),
    max_size=5,
)
_gpu_json = st.dictionaries(
    st.sampled_from((*_GPU_KEYS, "Id", "")),
    _field_value | st.lists(_mig, max_size=2),
    max_size=len(_GPU_KEYS),
)
register_json = st.lists(_gpu_json, max_size=4).map(json.dumps)

_token = st.sampled_from(STRING_EDGES + INT_EDGE_TEXT) | st.text(max_size=8)
_legacy_gpu = st.lists(_token, min_size=5, max_size=10).map(",".join)
register_legacy = st.lists(_legacy_gpu, max_size=4).map(lambda gpus: ":".join(gpus) + ":")

_slice = st.lists(_token, min_size=3, max_size=5).map(",".join)
_container = st.lists(_slice, max_size=3).map(lambda slices: "".join(s + ":" for s in slices))
allocation = st.lists(_container, max_size=4).map(lambda cs: "".join(c + ";" for c in cs))

pair_scores = st.lists(
    st.dictionaries(
        st.sampled_from(("uuid", "score", "x")),
        _field_value | st.dictionaries(texts, _field_value, max_size=3),
        max_size=3,
    ),
    max_size=3,
).map(json.dumps)

_times = st.sampled_from(
    (
        "2026-01-02 03:04:05",
        "2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05.123456789+05:30",
        "2026-01-02 03:04:05.123 +0000 UTC",
        "0000-00-00 00:00:00",
        "9999-12-31T23:59:59Z",
        "2026-02-30T00:00:00Z",
        "2026-01-02T24:00:00Z",
    )
) | st.datetimes().map(str)
handshakes = st.tuples(st.sampled_from(("Requesting_", "Deleted_", "Reported ", "")), _times | _token).map(
    "".join
)
node_locks = st.tuples(_times | _token, st.sampled_from(("", ",")), _token, _token).map(
    lambda p: p[0] + (p[1] + p[2] + "," + p[3] if p[1] else "")
)
weights = st.dictionaries(texts, _field_value, max_size=4).map(json.dumps) | st.lists(
    st.tuples(texts, _token).map("=".join), max_size=4
).map(",".join)

annotation_values = st.one_of(
    register_json, register_legacy, allocation, pair_scores, handshakes, node_locks, weights
)


# --- pods as the webhook and the extender get them ------------------------------------------------

_HAMI_KEYS = [
    A.CORE_POLICY,
    A.USE_GPU_TYPE,
    A.NOUSE_GPU_TYPE,
    A.USE_GPU_UUID,
    A.NOUSE_GPU_UUID,
    A.NUMA_BIND,
    A.VGPU_MODE,
    A.GPU_SCHEDULER_POLICY,
    A.NODE_SCHEDULER_POLICY,
    A.DEVICES_TO_ALLOCATE,
    DRA_CLAIMS,
    "hami.io/dra-model",
    "x",
]
_RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"]
_value = json_values(leaves=5)
_limits = st.dictionaries(
    st.sampled_from([*_RESOURCES, "nvidia.com/priority", "cpu"]), json_quantities | _value
)
_container = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "", "A_B"]) | texts},
    optional={
        "resources": st.dictionaries(st.sampled_from(["limits", "requests"]), _limits | _value) | _value,
        "env": st.lists(st.dictionaries(st.sampled_from(["name", "value"]), texts | _value), max_size=3)
        | _value,
        "securityContext": st.dictionaries(st.just("privileged"), _value | st.booleans()) | _value,
        "resourceClaims": _value,
    },
)
_annotations = st.dictionaries(st.sampled_from(_HAMI_KEYS), annotation_values | texts, max_size=4) | _value
pod_objects = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.just("v1") | _value,
        "kind": st.just("Pod") | _value,
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": texts | _value,
                "namespace": texts | _value,
                "generateName": texts | _value,
                "annotations": _annotations,
                "labels": _value,
            },
        )
        | _value,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(_container, max_size=3) | _value,
                "initContainers": st.lists(_container, max_size=2) | _value,
                "schedulerName": st.sampled_from(["", "hami-scheduler", "default-scheduler"]) | _value,
                "resourceClaims": _value,
                "runtimeClassName": _value,
            },
        )
        | _value,
    },
)
