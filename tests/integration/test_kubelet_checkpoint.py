"""The stand-in's pure parts: checkpoint encoding (kubelet's JSON shape, our FNV-32a checksum),
resource-name validation, gRPC error text; and many stand-ins sharing one loop."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.plugin.api import api_pb2
from hami_sim.kubelet import Kubelet, KubeletConfig
from hami_sim.kubelet import checkpoint as checkpoint_module
from hami_sim.kubelet.checkpoint import (
    CheckpointEncoder,
    CheckpointError,
    PodDeviceEntry,
    decode_checkpoint,
    encode_checkpoint,
    fnv32a,
)
from hami_sim.kubelet.resources import go_rpc_error, is_extended_resource_name
from tests.integration.kubelet_plugin import FakePlugin, devices


def test_fnv32a_known_values() -> None:
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C
    assert fnv32a(b"foobar") == 0xBF9CF968


def test_empty_checkpoint_is_go_shaped() -> None:
    raw = encode_checkpoint([], {"example.com/dev": []})
    data = b'{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/dev":[]}}'
    assert raw == b'{"Data":' + data + b',"Checksum":' + str(fnv32a(data)).encode() + b"}"
    assert decode_checkpoint(raw).entries == ()


def test_checkpoint_escapes_like_go_and_sorts_numa_keys_as_strings() -> None:
    response = api_pb2.ContainerAllocateResponse(envs={"A": "<&>"})
    entry = PodDeviceEntry("uid", "c<1>", "example.com/dev", {10: ("x",), 2: ("y",), -1: ("z",)}, response)
    raw = encode_checkpoint([entry], {})
    assert b'"ContainerName":"c\\u003c1\\u003e"' in raw
    assert b'"DeviceIDs":{"-1":["z"],"10":["x"],"2":["y"]}' in raw
    (decoded,) = decode_checkpoint(raw).entries
    assert decoded.container_name == "c<1>" and decoded.response.envs["A"] == "<&>"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"nope", "not JSON"),
        (b'{"Data":{},"Checksum":"x"}', "Checksum: expected an integer"),
        (b'{"Data":{"PodDeviceEntries":[{"PodUID":1}]},"Checksum":0}', "Data.PodDeviceEntries[0].PodUID"),
        (
            b'{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r",'
            b'"DeviceIDs":{"numa":["a"]},"AllocResp":""}]},"Checksum":0}',
            "key 'numa' is not a NUMA node number",
        ),
        (
            b'{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r",'
            b'"DeviceIDs":{},"AllocResp":"!!"}]},"Checksum":0}',
            "AllocResp: not a base64",
        ),
    ],
)
def test_bad_checkpoints_name_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=re.escape(message)):
        decode_checkpoint(raw, verify=False)


_ids = st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple)


@given(
    entries=st.lists(
        st.builds(
            PodDeviceEntry,
            st.uuids().map(str),
            st.text(min_size=1, max_size=10),
            st.sampled_from(["nvidia.com/gpu", "example.com/dev"]),
            st.dictionaries(st.integers(-1, 7), _ids, max_size=3),
            st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3).map(
                lambda envs: api_pb2.ContainerAllocateResponse(envs=envs)
            ),
        ),
        max_size=4,
    ),
    registered=st.dictionaries(st.text(min_size=1, max_size=10), _ids.map(sorted), max_size=3),
)
def test_checkpoint_round_trips(entries: list[PodDeviceEntry], registered: dict[str, list[str]]) -> None:
    raw = encode_checkpoint(entries, registered)
    json.loads(raw)
    decoded = decode_checkpoint(raw)
    assert list(decoded.entries) == entries
    assert [e.response for e in decoded.entries] == [e.response for e in entries]
    assert {k: list(v) for k, v in decoded.registered_devices.items()} == registered
    assert encode_checkpoint(decoded.entries, decoded.registered_devices) == raw


_entries = st.builds(
    PodDeviceEntry,
    st.uuids().map(str),
    st.sampled_from(["a", "b<&>"]),
    st.sampled_from(["nvidia.com/gpu", "example.com/dev"]),
    st.dictionaries(st.integers(-1, 3), _ids, max_size=2),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2).map(
        lambda envs: api_pb2.ContainerAllocateResponse(envs=envs)
    ),
)


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["append", "remove", "replace", "same"]), st.integers(0, 20), _entries),
        max_size=12,
    ),
    registered=st.dictionaries(st.sampled_from(["nvidia.com/gpu", "x.io/y"]), _ids.map(sorted), max_size=2),
)
def test_an_encoder_reused_across_writes_matches_a_fresh_one(
    steps: list[tuple[str, int, PodDeviceEntry]], registered: dict[str, list[str]]
) -> None:
    """The device manager's encoder keeps the previous write's work; whatever happened to the entries
    in between (admissions, removals, a container's entry replaced), its bytes are a fresh encode's."""
    encoder = CheckpointEncoder()
    entries: list[PodDeviceEntry] = []
    for op, index, entry in steps:
        if op == "append":
            entries.append(entry)
        elif op == "remove" and entries:
            del entries[index % len(entries)]
        elif op == "replace" and entries:
            old = entries[index % len(entries)]
            entries[index % len(entries)] = PodDeviceEntry(
                old.pod_uid, old.container_name, old.resource_name, old.device_ids, entry.response
            )
        raw = encoder.encode(entries, registered)
        assert raw == encode_checkpoint(entries, registered)
        assert list(decode_checkpoint(raw).entries) == entries


def test_an_encoder_encodes_only_the_new_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[str] = []
    entry_json = checkpoint_module._entry_json

    def counting(entry: PodDeviceEntry) -> bytes:
        encoded.append(entry.pod_uid)
        return entry_json(entry)

    monkeypatch.setattr(checkpoint_module, "_entry_json", counting)
    response = api_pb2.ContainerAllocateResponse(envs={"A": "1"})
    entries = [
        PodDeviceEntry(f"uid-{i}", "c", "nvidia.com/gpu", {-1: (f"d{i}",)}, response) for i in range(5)
    ]
    encoder = CheckpointEncoder()
    encoder.encode(entries[:4], {})
    assert encoded == ["uid-0", "uid-1", "uid-2", "uid-3"]
    encoded.clear()
    encoder.encode(
        [
            PodDeviceEntry(e.pod_uid, e.container_name, e.resource_name, e.device_ids, e.response)
            for e in entries
        ],
        {},
    )
    assert encoded == ["uid-4"]
    encoded.clear()
    encoder.encode(entries[:1] + entries[2:], {})
    assert encoded == ["uid-2", "uid-3", "uid-4"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("example.com/dev-1.x", True),
        ("nvidia.com/gpumem", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),
        ("nvidia.com/", False),
        ("nvidia.com/-gpu", False),
        ("a/b/c", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok


def test_go_rpc_error_text() -> None:
    assert go_rpc_error(grpc.StatusCode.UNKNOWN, "boom") == "rpc error: code = Unknown desc = boom"
    assert go_rpc_error(grpc.StatusCode.CANCELLED, "x") == "rpc error: code = Canceled desc = x"
    assert (
        go_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, None)
        == "rpc error: code = FailedPrecondition desc = "
    )


def test_many_stand_ins_share_one_loop() -> None:
    """Forty nodes on one event loop, each with its own directory and plugin, no threads of ours."""
    root = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    plugins = [FakePlugin(root / f"n{i}", initial=devices(f"d{i}-0", f"d{i}-1")) for i in range(40)]

    async def scenario() -> list[int]:
        kubelets = [Kubelet(KubeletConfig(f"n{i}", root / f"n{i}")) for i in range(40)]
        await asyncio.gather(*(k.start() for k in kubelets))
        try:
            loop = asyncio.get_running_loop()
            for plugin in plugins:
                plugin.serve()
            await asyncio.gather(
                *(loop.run_in_executor(None, p.register, "example.com/dev") for p in plugins)
            )
            snapshots = await asyncio.gather(
                *(
                    k.device_manager.wait_for(
                        lambda s: (r := s.resource("example.com/dev")) is not None and r.allocatable == 2, 10
                    )
                    for k in kubelets
                )
            )
            return [s.resources["example.com/dev"].allocatable for s in snapshots]
        finally:
            await asyncio.gather(*(k.stop() for k in kubelets))

    try:
        assert asyncio.run(scenario()) == [2] * 40
    finally:
        for plugin in plugins:
            plugin.stop()
        shutil.rmtree(root, ignore_errors=True)
