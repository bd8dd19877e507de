"""The decoders' fast paths of issue 29 (the pods and nodes lists of 15,000 nodes decode one annotation per
object) answer exactly what the strict decoders answer:

- `hami.io/node-nvidia-register` in its usual JSON form (`_decode_register_fast`) gives the GPUs the
  strict JSON decoder gives, and declines (None) every text the strict decoder refuses;
- the allocation annotations (`_decode_pod_allocation_fast`) likewise;
- `footprint_slices` of a pod whose containers all run together gives the slices the phase-by-phase
  computation gives.

Texts are drawn near the valid shapes (HAMi's own encodings) and mutated with the corners the strict
decoders care about: case-folded, duplicate and null keys, floats, big and negative numbers, signs,
non-ASCII digits, empty fields, escapes."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api import annotations as ann
from hami_api.annotations import _decode_pod_allocation_fast, _decode_register_fast
from hami_api.containers import ContainerKind, _phases, footprint_slices
from hami_api.errors import WireFormatError
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from tests.builders import allocation, gpu_info


def strict(decode: Any, fast_path: str, text: str) -> Any:
    """What `decode(text)` gives with its fast path `fast_path` off: the value, or the error's text."""
    with mock.patch.object(ann, fast_path, lambda _text: None):
        try:
            return decode(text)
        except WireFormatError as err:
            return str(err)


def decoded(decode: Any, text: str) -> Any:
    try:
        return decode(text)
    except WireFormatError as err:
        return str(err)


NUMBERS = st.one_of(
    st.integers(0, 200),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -(2**63), -(2**63) - 1]),
    st.just(1.0),
    st.just(True),
    st.none(),
    st.just("7"),
)
STRINGS = st.one_of(
    st.sampled_from(["GPU-a", "GPU-b", "", "NVIDIA-A100", "hami-core", "mig", "\u00e9", "GPU-\\ud800"]),
    st.integers(0, 3),
    st.none(),
    st.booleans(),
)
KEYS = st.sampled_from(
    ["id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "migProfiles",
     "custominfo", "Count", "ID", "other"]
)  # fmt: skip


@st.composite
def register_texts(draw: st.DrawFn) -> str:
    """A register near the JSON form: HAMi's encoding, or pairs written by hand (duplicates, nulls,
    case-folded keys, values of every type), or raw text spliced in."""
    if draw(st.booleans()):
        gpus = [
            gpu_info(i, id=draw(st.sampled_from([f"GPU-{i}", "GPU-0"])), count=draw(st.integers(0, 20)),
                     devmem=draw(st.integers(0, 2**31 - 1)), numa=draw(st.integers(0, 3)),
                     mode=draw(st.sampled_from(["hami-core", "mig", ""])), health=draw(st.booleans()))
            for i in range(draw(st.integers(0, 4)))
        ]  # fmt: skip
        return ann.encode_node_register(gpus) if draw(st.booleans()) else json.dumps(
            [{"id": g.id, "index": g.index, "count": g.count, "devmem": g.devmem, "devcore": g.devcore,
              "type": g.type, "numa": g.numa, "mode": g.mode, "health": g.health} for g in gpus]
        )  # fmt: skip
    entries = []
    for _ in range(draw(st.integers(0, 3))):
        pairs = [("id", json.dumps(draw(st.sampled_from(["GPU-a", "GPU-b"]))))]
        for _ in range(draw(st.integers(0, 6))):
            key = draw(KEYS)
            value: Any
            if key in ("id", "type", "mode"):
                value = draw(STRINGS)
            elif key == "health":
                value = draw(st.one_of(st.booleans(), st.none(), st.just(1)))
            elif key == "migProfiles":
                value = draw(st.sampled_from([[], None, [{"name": "1g.10gb"}], {}]))
            elif key == "custominfo":
                value = draw(st.sampled_from([None, {}, {"a": 1}, "x"]))
            else:
                value = draw(NUMBERS)
            text = value if isinstance(value, str) and "\\" in value else json.dumps(value)
            if isinstance(value, str) and "\\" in value:
                text = '"' + value + '"'
            pairs.append((key, text))
        if draw(st.booleans()):
            pairs.reverse()
        entries.append("{" + ",".join(f'"{k}":{v}' for k, v in pairs) + "}")
    text = "[" + ",".join(entries) + "]"
    if draw(st.integers(0, 9)) == 0:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(["", " ", "1.5", "NaN", "}", "\u00a0", "1e2"])) + text[cut:]
    return text


@settings(max_examples=600, deadline=None)
@given(register_texts())
def test_register_fast_path_gives_the_strict_gpus_or_declines(text: str) -> None:
    fast = _decode_register_fast(text)
    expected = strict(ann.decode_node_register, "_decode_register_fast", text)
    if fast is not None:
        assert fast == expected
    assert decoded(ann.decode_node_register, text) == expected


def test_register_fast_path_takes_hamis_own_encoding_and_declines_mig_profiles_and_custom_info() -> None:
    gpus = (gpu_info(0), gpu_info(1, numa=1, health=False, mode="mps"))
    text = ann.encode_node_register(gpus)
    assert _decode_register_fast(text) == gpus == ann.decode_node_register(text)
    assert _decode_register_fast('[{"id":"GPU-0","migProfiles":[{"name":"1g.10gb"}]}]') is None
    assert _decode_register_fast('[{"id":"GPU-0","custominfo":{}}]') is None
    assert _decode_register_fast('[{"id":"GPU-0","Count":3}]') is None  # Go's case-folded match: strict
    assert _decode_register_fast('[{"id":"GPU-0"},{"id":"GPU-0"}]') is None  # the strict error names it


FIELD = st.one_of(
    st.sampled_from(["GPU-a", "GPU-b", "NVIDIA", "", "0", "100", "8000", "+5", "-1", "007", "\u0661", "1_0"]),
    st.sampled_from([str(2**31 - 1), str(2**31), "9" * 11, "0" * 12 + "1", " 5"]),
)


@st.composite
def allocation_texts(draw: st.DrawFn) -> str:
    """An allocation annotation near HAMi's form: devices of four fields (or not), containers closed by
    ';', the blanked forms, a separator dropped or doubled now and then."""
    containers = []
    for _ in range(draw(st.integers(0, 4))):
        devices = []
        for _ in range(draw(st.integers(0, 3))):
            odd = draw(st.integers(0, 9)) == 0
            if odd:
                fields = draw(st.lists(FIELD, min_size=1, max_size=5))
            else:
                numbers = st.integers(0, 100_000).map(str) if draw(st.integers(0, 4)) else FIELD
                uuid = draw(st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]))
                fields = [uuid, "NVIDIA", draw(numbers), draw(numbers)]
            devices.append(",".join(fields) + (draw(st.sampled_from(["", "::"])) if odd else ":"))
        containers.append("".join(devices) + ";")
    tail = draw(st.sampled_from([";", "x", ":"])) if draw(st.integers(0, 9)) == 0 else ""
    return "".join(containers) + tail


@settings(max_examples=800, deadline=None)
@given(allocation_texts())
def test_allocation_fast_path_gives_the_strict_allocation_or_declines(text: str) -> None:
    fast = _decode_pod_allocation_fast(text)
    expected = strict(ann.decode_pod_allocation, "_decode_pod_allocation_fast", text)
    if fast is not None:
        assert fast == expected
    assert decoded(ann.decode_pod_allocation, text) == expected


def test_allocation_fast_path_takes_hamis_own_encoding_blanked_forms_included() -> None:
    value = allocation([("GPU-a", 8000, 30), ("GPU-b", 0, 0)], [], [("GPU-a", 1, 100)])
    text = ann.encode_pod_allocation(value)
    assert _decode_pod_allocation_fast(text) == value == ann.decode_pod_allocation(text)
    assert _decode_pod_allocation_fast(";;") == PodAllocation((ContainerAllocation(), ContainerAllocation()))
    assert _decode_pod_allocation_fast("GPU-a,NVIDIA,+5,0:;") is None  # Go reads it: the strict path does


def footprint_by_phases(value: PodAllocation, kinds: list[ContainerKind]) -> tuple[GPUSlice, ...]:
    """`footprint_slices` computed through its phases, as it does for pods with init containers."""
    (phase,) = _phases(value, kinds)
    order = list(dict.fromkeys(s.uuid for c in value for s in c.devices))
    out: list[GPUSlice] = []
    for uuid in order:
        base = [s for c in value for s in c.devices if s.uuid == uuid]
        slots, mem, cores = phase[uuid]
        first = base[0]
        extra_mem, extra_cores = mem - sum(s.usedmem for s in base), cores - sum(s.usedcores for s in base)
        out.append(GPUSlice(uuid, first.usedmem + extra_mem, first.usedcores + extra_cores, first.vendor))
        out.extend(base[1:])
        out.extend(GPUSlice(uuid, 0, 0, first.vendor) for _ in range(slots - len(base)))
    return tuple(out)


SLICES = st.builds(
    GPUSlice,
    st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]),
    st.integers(0, 9000),
    st.integers(0, 100),
    st.sampled_from(["NVIDIA", "NVIDIA", "Ascend"]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.lists(SLICES, max_size=3).map(lambda s: ContainerAllocation(tuple(s))), max_size=4),
    st.integers(0, 5),
)
def test_footprint_of_app_containers_equals_the_phase_computation(
    containers: list[ContainerAllocation], kinds_count: int
) -> None:
    value = PodAllocation(tuple(containers))
    kinds = [ContainerKind.APP] * kinds_count
    assert footprint_slices(value, kinds) == footprint_by_phases(value, kinds)
