"""Fuzzing CDI specs: the kubelet stand-in's runtime reading any spec file (hami_sim.kubelet.dra.cdi
decode_spec_file + parse_spec: a spec or CdiSpecError naming the file and the field) and hami-node
deciding whether a spec file is one it wrote (hami_node.cdi.written_by_us: True or False for any bytes,
True for what build_spec writes). tests/unit/test_cdi.py holds the examples."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from hami_node import cdi as node_cdi
from hami_sim.kubelet.dra.cdi import CdiSpecError, decode_spec_file, parse_spec
from tests.fuzz.strategies import (
    YAML_DEPTHS,
    deep_json_text,
    fuzz_settings,
    json_values,
    mostly,
    mutated,
    texts,
)

_value = json_values(leaves=5)
_node = st.fixed_dictionaries(
    {"path": mostly(st.sampled_from(["/dev/nvidia0", "/dev/nvidiactl", "dev/x", ""]), _value)},
    optional={
        "hostPath": _value,
        "type": mostly(st.sampled_from(["c", "b"]), _value),
        "major": _value,
        "minor": _value,
        "fileMode": _value,
        "permissions": mostly(st.sampled_from(["rw", "rwm", "x"]), _value),
        "uid": _value,
        "gid": _value,
    },
)
_edits = st.fixed_dictionaries(
    {},
    optional={
        "env": mostly(st.lists(st.sampled_from(["A=1", "NVIDIA_VISIBLE_DEVICES=void", "B"]) | texts), _value),
        "deviceNodes": mostly(st.lists(mostly(_node, _value), max_size=2), _value),
        "mounts": mostly(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "hostPath": mostly(st.just("/a"), _value),
                        "containerPath": mostly(st.just("/b"), _value),
                    },
                    optional={"options": _value, "type": _value},
                ),
                max_size=2,
            ),
            _value,
        ),
        "hooks": mostly(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "hookName": mostly(st.just("createContainer"), _value),
                        "path": mostly(st.just("/h"), _value),
                    },
                    optional={"args": _value, "env": _value, "timeout": _value},
                ),
                max_size=2,
            ),
            _value,
        ),
        "intelRdt": _value,
        "additionalGids": _value,
        "netDevices": _value,
    },
)
_device = st.fixed_dictionaries(
    {
        "name": mostly(st.sampled_from(["GPU-0", "gpu0", "-x", "a b"]), _value),
        "containerEdits": mostly(_edits, _value),
    },
    optional={"annotations": _value},
)
specs = (
    st.fixed_dictionaries(
        {
            "cdiVersion": mostly(
                st.sampled_from(["0.3.0", "0.5.0", "0.6.0", "0.7.0", "1.0.0", "v0.6.0", "9"]), _value
            ),
            "kind": mostly(st.sampled_from([node_cdi.CDI_KIND, "nvidia.com/gpu", "x", "a/b/c"]), _value),
            "devices": mostly(st.lists(mostly(_device, _value), max_size=3), _value),
        },
        optional={"containerEdits": mostly(_edits, _value), "annotations": _value},
    )
    | _value
)
spec_bytes = (
    specs.map(lambda s: json.dumps(s).encode())
    | specs.map(lambda s: yaml.safe_dump(s, allow_unicode=True).encode("utf-8", "surrogatepass"))
    | mutated(specs.map(json.dumps)).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | deep_json_text(YAML_DEPTHS).map(str.encode)
    | st.binary(max_size=200)
)
_DEEP = b"[" * 100_000 + b"]" * 100_000


@fuzz_settings
@given(spec_bytes, st.sampled_from(["/etc/cdi/x.json", "/var/run/cdi/x.yaml"]))
@example(_DEEP, "/etc/cdi/x.json")
@example(_DEEP, "/var/run/cdi/x.yaml")
@example(b"a: " + b"9" * 5000, "/var/run/cdi/x.yaml")
def test_any_cdi_spec_file_gives_a_spec_or_an_error_naming_the_file(data: bytes, path: str) -> None:
    try:
        spec = parse_spec(decode_spec_file(data, path), path)
    except CdiSpecError as err:
        assert path in str(err)
        return
    assert spec.devices
    assert spec.path == path


@dataclass(frozen=True)
class Gpu:
    uuid: str
    minor: int


def _written(document: Any) -> bytes:
    return json.dumps(document).encode()


_ours = st.builds(
    lambda uuids, common: node_cdi.build_spec([Gpu(uuid, minor) for minor, uuid in enumerate(uuids)], common),
    st.lists(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), min_size=1, max_size=3, unique=True),
    st.lists(st.sampled_from(node_cdi.COMMON_DEVICE_NODES), unique=True),
)


OURS = node_cdi.build_spec([Gpu("GPU-0", 0)], ())


def _mutate_ours(spec: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """`spec` with the value at (the reachable prefix of) `path` replaced by `value`."""
    doc = json.loads(json.dumps(spec))
    node: Any = doc
    for step in path[:-1]:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
    if isinstance(node, dict):
        node[path[-1] if isinstance(path[-1], str) else "x"] = value
    elif isinstance(node, list) and node:
        node[int(path[-1]) % len(node) if isinstance(path[-1], int) else 0] = value
    return doc


_paths = st.sampled_from(
    [
        ["kind"],
        ["containerEdits"],
        ["containerEdits", "env"],
        ["containerEdits", "deviceNodes"],
        ["containerEdits", "deviceNodes", 0],
        ["devices"],
        ["devices", 0],
        ["devices", 0, "containerEdits"],
        ["devices", 0, "containerEdits", "deviceNodes"],
        ["devices", 0, "containerEdits", "deviceNodes", 0],
        ["devices", 0, "containerEdits", "deviceNodes", 0, "path"],
    ]
)


@fuzz_settings
@given(_ours, _paths, _value | st.just({}) | st.just([{}]) | st.just(["x"]) | st.just({"0": 1}))
@example(
    OURS,
    ["devices", 0],
    {"name": "GPU-0", "containerEdits": {"deviceNodes": 7}},
)  # len() of an int: TypeError
@example(
    OURS,
    ["devices", 0],
    {"name": "GPU-0", "containerEdits": {"deviceNodes": {"a": 1}}},
)  # a mapping's [0]: KeyError
@example(
    OURS,
    ["devices", 0],
    {"name": "GPU-0", "containerEdits": {"deviceNodes": [{"path": 7}]}},
)  # re.fullmatch of an int: TypeError
def test_whether_a_spec_file_is_ours_is_true_or_false_for_any_file(
    spec: dict[str, Any], path: list[str | int], value: Any
) -> None:
    assert node_cdi.written_by_us(node_cdi.encode_spec(spec))
    node_cdi.written_by_us(_written(_mutate_ours(spec, path, value)))


@fuzz_settings
@given(spec_bytes | texts.map(lambda t: t.encode("utf-8", "surrogatepass")))
@example(_DEEP)
def test_whether_any_bytes_are_our_spec_is_true_or_false(data: bytes) -> None:
    assert node_cdi.written_by_us(data) in (True, False)
