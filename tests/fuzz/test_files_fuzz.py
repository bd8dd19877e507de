"""Fuzzing the files the node side reads: the fake GPU inventory (hami_node.gpu.inventory), the kubelet
device-manager checkpoint (hami_sim.kubelet.checkpoint) and hami-node's DRA checkpoint
(hami_node.dra.checkpoint). Any text or bytes give a value or the module's error (InventoryError naming
the file and the field, CheckpointError); accepted values round-trip through the module's writer.

tests/unit/test_gpu_inventory.py round-trips generated inventories and test_dra_checkpoint.py feeds
short random bytes; these start from near-valid documents with hostile fields, deep nesting, huge numbers."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from hami_node.dra import checkpoint as dra_checkpoint
from hami_node.gpu.inventory import (
    InventoryError,
    parse_inventory,
    parse_inventory_text,
    render_inventory,
)
from hami_sim.kubelet import checkpoint as kubelet_checkpoint
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
_uuids = st.sampled_from(["GPU-0", "GPU-1", "GPU-2"])
_gpu = st.fixed_dictionaries(
    {
        "uuid": mostly(_uuids, _value),
        "model": mostly(st.sampled_from(["Tesla T4", "A100"]), _value),
        "memory": mostly(st.sampled_from([15360, 81920]), _value),
    },
    optional={
        "index": mostly(st.integers(0, 3), _value),
        "minor": mostly(st.integers(0, 3), _value),
        "numa": mostly(st.sampled_from([None, 0, 1]), _value),
        "pci_bus_id": mostly(st.just("00000000:3B:00.0"), _value),
        "mig": _value,
        "health": mostly(st.booleans(), _value),
        "lost": mostly(st.booleans(), _value),
        "extra": _value,
    },
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "id": mostly(st.sampled_from(["e1", "e2"]), _value),
        "kind": mostly(st.sampled_from(["xid", "failing", "recovered", "lost"]), _value),
        "gpu": mostly(_uuids, _value),
        "xid": mostly(st.sampled_from([31, 48, 79]), _value),
    },
)
_link = st.fixed_dictionaries(
    {},
    optional={
        "gpus": mostly(st.lists(st.integers(0, 3) | _uuids, max_size=3), _value),
        "nvlinks": _value,
        "pcie": mostly(st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS"]), _value),
    },
)
inventories = st.fixed_dictionaries(
    {"gpus": mostly(st.lists(mostly(_gpu, _value), max_size=3), _value)},
    optional={
        "nvml": mostly(st.sampled_from(["ok", "missing", "failing"]), _value),
        "links": mostly(st.lists(_link, max_size=2), _value),
        "events": mostly(st.lists(_event, max_size=2), _value),
        "topology": _value,
    },
)
_inventory_text = (
    inventories.map(json.dumps)
    | mutated(inventories.map(json.dumps))
    | inventories.map(lambda d: yaml.safe_dump(d, allow_unicode=True))
    | deep_json_text(YAML_DEPTHS)
    | texts
)
_DEEP = "[" * 100_000 + "]" * 100_000


@fuzz_settings
@given(_inventory_text, st.sampled_from(["inventory.yaml", "inventory.json"]))
@example(_DEEP, "inventory.json")  # json.loads raises RecursionError, not JSONDecodeError
@example(_DEEP, "inventory.yaml")
@example('{"gpus": [{"uuid": "GPU-0", "model": "T4", "memory": ' + "1" * 5000 + "}]}", "inventory.json")
@example('{"gpus": [], "": 1}', "inventory.json")  # an unknown field "" was named by nothing
@example("gpus: " + "9" * 5000, "inventory.yaml")  # PyYAML's int() of it raised ValueError
def test_any_inventory_file_parses_or_is_refused_naming_the_field(text: str, source: str) -> None:
    try:
        inventory = parse_inventory_text(text, source)
    except InventoryError as err:
        assert err.source == source and err.where and err.reason
        return
    for fmt in ("yaml", "json"):
        again = parse_inventory_text(render_inventory(inventory, fmt), f"again.{fmt}")
        assert again == inventory


@fuzz_settings
@given(_value)
def test_any_decoded_inventory_document_is_checked_or_refused(data: Any) -> None:
    try:
        parse_inventory(data)
    except InventoryError as err:
        assert err.where and err.reason


# --- the kubelet's device-manager checkpoint ---------------------------------------------------------

_ids = st.dictionaries(
    mostly(st.sampled_from(["0", "1", "-1"]), texts), st.lists(_uuids, max_size=2) | _value
)
_entry = st.fixed_dictionaries(
    {
        "PodUID": mostly(st.just("uid-1"), _value),
        "ContainerName": mostly(st.just("c"), _value),
        "ResourceName": mostly(st.just("nvidia.com/gpu"), _value),
        "DeviceIDs": mostly(_ids, _value),
    },
    optional={"AllocResp": mostly(st.sampled_from(["", "CgA=", "Cg", "!!"]), _value)},
)
_kubelet_doc = st.fixed_dictionaries(
    {
        "Data": mostly(
            st.fixed_dictionaries(
                {
                    "PodDeviceEntries": mostly(st.lists(_entry, max_size=3), _value),
                    "RegisteredDevices": mostly(st.dictionaries(texts, st.lists(_uuids) | _value), _value),
                }
            ),
            _value,
        ),
        "Checksum": mostly(st.integers(0, 2**32), _value),
    }
)
kubelet_bytes = (
    _kubelet_doc.map(lambda d: json.dumps(d).encode())
    | mutated(_kubelet_doc.map(json.dumps)).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | deep_json_text().map(str.encode)
    | st.binary(max_size=200)
)


@fuzz_settings
@given(kubelet_bytes, st.booleans())
@example(_DEEP.encode(), False)  # json.loads raises RecursionError, not ValueError
@example(b'{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"' + b"1" * 5000 + b'": []}}]}}', False)
@example(b'{"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"\\ud800": []}}, "Checksum": 0}', True)
@example(b'{"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"\\ud800": []}}, "Checksum": 0}', False)
def test_any_kubelet_checkpoint_decodes_or_is_refused(raw: bytes, verify: bool) -> None:
    try:
        checkpoint = kubelet_checkpoint.decode_checkpoint(raw, verify=verify)
    except kubelet_checkpoint.CheckpointError as err:
        assert str(err)
        return
    encoded = kubelet_checkpoint.encode_checkpoint(checkpoint.entries, checkpoint.registered_devices)
    again = kubelet_checkpoint.decode_checkpoint(encoded)
    assert again.entries == checkpoint.entries
    assert again.registered_devices == checkpoint.registered_devices


# --- hami-node's DRA checkpoint -----------------------------------------------------------------------

_device = st.fixed_dictionaries(
    {
        key: mostly(good, _value)
        for key, good in (
            ("request", st.just("gpu")),
            ("device", st.just("gpu-0")),
            ("gpu", _uuids),
            ("minor", st.integers(0, 7)),
            ("index", st.integers(0, 7)),
            ("memoryMiB", st.integers(0, 81920)),
            ("cores", st.integers(0, 100)),
            ("cdiName", st.just("hami.io/gpu=x")),
        )
    },
    optional={"shareID": mostly(st.none() | st.just("s1"), _value)},
)
_claim = st.fixed_dictionaries(
    {
        "namespace": mostly(st.just("ns"), _value),
        "name": mostly(st.just("c"), _value),
        "pool": mostly(st.just("node-a"), _value),
        "devices": mostly(st.lists(_device, max_size=2), _value),
        "sole": mostly(st.booleans(), _value),
        "private": mostly(st.booleans(), _value),
    }
)


def _signed(claims: Any, version: Any, fix_checksum: bool) -> bytes:
    doc = {"kind": dra_checkpoint.KIND, "version": version, "claims": claims}
    if fix_checksum:
        with contextlib.suppress(TypeError, ValueError):  # a value json cannot write: leave it unsigned
            doc["checksum"] = dra_checkpoint.checksum(version, claims)
    return json.dumps(doc).encode()


dra_bytes = (
    st.builds(
        _signed,
        mostly(st.dictionaries(st.sampled_from(["uid-1", "uid-2", ""]), _claim, max_size=2), _value),
        mostly(st.just(dra_checkpoint.VERSION), _value),
        st.booleans(),
    )
    | deep_json_text().map(str.encode)
    | st.binary(max_size=200)
)


@fuzz_settings
@given(dra_bytes)
@example(_DEEP.encode())
def test_any_dra_checkpoint_decodes_or_is_refused_and_round_trips(raw: bytes) -> None:
    try:
        checkpoint = dra_checkpoint.decode(raw)
    except dra_checkpoint.CheckpointError as err:
        assert str(err)
        return
    assert dra_checkpoint.decode(dra_checkpoint.encode(checkpoint)) == checkpoint
