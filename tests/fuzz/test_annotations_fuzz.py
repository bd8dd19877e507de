"""Fuzzing hami_api.annotations: every decoder is total (a value or WireFormatError naming the annotation)
and every value a decoder accepts goes through its encoder and back unchanged.

tests/unit/test_annotations.py holds the examples and the encode -> decode round trips from valid
values; this file starts from hostile text instead (structured near-valid forms, huge numbers, raw text).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

import hami_api.annotations as A
from hami_api.errors import WireFormatError
from tests.fuzz.strategies import (
    INT_EDGE_TEXT,
    STRING_EDGES,
    deep_json_text,
    fuzz_settings,
    json_values,
    mutated,
    raw_text,
    texts,
)

Decoder = Callable[[str], Any]

# decoder -> the encoder that writes its value back (None where the value has no single encoder)
CODECS: dict[str, tuple[Decoder, Callable[[Any], str] | None]] = {
    A.NODE_REGISTER: (A.decode_node_register, A.encode_node_register),
    A.NODE_PAIR_SCORE: (A.decode_pair_scores, A.encode_pair_scores),
    A.NODE_HANDSHAKE: (A.decode_handshake, A.encode_handshake),
    A.DEVICES_TO_ALLOCATE: (A.decode_pod_allocation, A.encode_pod_allocation),
    A.VGPU_NODE: (A.decode_vgpu_node, A.encode_vgpu_node),
    A.BIND_TIME: (A.decode_unix_time, A.encode_unix_time),
    A.BIND_PHASE: (A.decode_bind_phase, A.encode_bind_phase),
    A.NODE_LOCK: (A.decode_node_lock, A.encode_node_lock),
    A.DEVICE_CORDON: (A.decode_device_cordon, A.encode_device_cordon),
    A.NUMA_BIND: (A.decode_numa_bind, A.encode_numa_bind),
    A.VGPU_MODE: (A.decode_vgpu_mode, A.encode_vgpu_mode),
    A.NODE_SCHEDULER_POLICY: (A.decode_node_policy, A.encode_node_policy),
    A.GPU_SCHEDULER_POLICY: (A.decode_gpu_policy, A.encode_gpu_policy),
    A.DEVICE_SCORING_WEIGHTS: (A.decode_scoring_weights, A.encode_scoring_weights),
    A.CORE_POLICY: (A.decode_core_policy, A.encode_core_policy),
}


# Times are written as Go's time.Format writes them, in whole seconds, while Go's time.Parse (and so the
# decoder) keeps a fraction of a second it is given: "Requesting_2000-01-01 00:00:00.000001" reads back
# without its microsecond once written.
LOSSY = {A.NODE_HANDSHAKE, A.NODE_LOCK}


def check_codec(key: str, text: str) -> None:
    """`text` decodes to a value that survives encode -> decode, or is refused naming `key`."""
    decode, encode = CODECS[key]
    try:
        value = decode(text)
    except WireFormatError as err:
        assert err.annotation == key
        assert err.position and err.reason
        assert str(err)
        return
    if encode is None:
        return
    text = encode(value)
    assert encode(decode(text)) == text  # the canonical form is a fixed point
    if key not in LOSSY:
        assert decode(text) == value


def check_all(text: str) -> None:
    for key in CODECS:
        check_codec(key, text)


# --- structured forms that get past the first checks ---------------------------------------------------

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

structured = st.one_of(
    register_json, register_legacy, allocation, pair_scores, handshakes, node_locks, weights
)


@fuzz_settings
@given(structured | mutated(structured))
@example("a," + "1" * 5000 + ",1,1,t,0,true:")  # a count past int()'s 4,300-digit limit
@example("a,NVIDIA," + "1" * 5000 + ",1:;")
@example("9" * 5000)
@example("\u0663")
def test_structured_annotation_values_decode_or_are_refused_by_every_decoder(text: str) -> None:
    check_all(text)


@fuzz_settings
@given(raw_text(',:;[]{}"0123456789-+.eE_TtrueflsNVIDIA GPU'))
def test_raw_text_decodes_or_is_refused_by_every_decoder(text: str) -> None:
    check_all(text)


@fuzz_settings
@given(deep_json_text())
def test_deeply_nested_json_is_refused_naming_the_annotation(text: str) -> None:
    for key in (A.NODE_REGISTER, A.NODE_PAIR_SCORE, A.DEVICE_SCORING_WEIGHTS):
        check_codec(key, text)


@fuzz_settings
@given(st.dictionaries(st.sampled_from([*CODECS, A.USE_GPU_UUID, A.NOUSE_GPU_TYPE]), structured))
def test_a_device_selector_from_any_annotations_is_read_or_refused(annotations: dict[str, str]) -> None:
    try:
        A.decode_device_selector(annotations)
    except WireFormatError as err:
        assert err.annotation in annotations
