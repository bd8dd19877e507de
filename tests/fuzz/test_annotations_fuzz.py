"""Fuzzing hami_api.annotations: every decoder is total (a value or WireFormatError naming the annotation)
and every value a decoder accepts goes through its encoder and back unchanged.

tests/unit/test_annotations.py holds the examples and the encode -> decode round trips from valid
values; this file starts from hostile text instead (structured near-valid forms, huge numbers, raw text).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

import hami_api.annotations as A
from hami_api.errors import WireFormatError
from tests.fuzz.strategies import (
    annotation_values,
    deep_json_text,
    fuzz_settings,
    mutated,
    raw_text,
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


@fuzz_settings
@given(annotation_values | mutated(annotation_values))
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
@given(st.dictionaries(st.sampled_from([*CODECS, A.USE_GPU_UUID, A.NOUSE_GPU_TYPE]), annotation_values))
def test_a_device_selector_from_any_annotations_is_read_or_refused(annotations: dict[str, str]) -> None:
    try:
        A.decode_device_selector(annotations)
    except WireFormatError as err:
        assert err.annotation in annotations
