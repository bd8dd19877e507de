"""The device manager's checkpoint, `kubelet_internal_checkpoint`, in kubelet's JSON shape.

    {"Data":{"PodDeviceEntries":[{"PodUID":"…","ContainerName":"c","ResourceName":"nvidia.com/gpu",
      "DeviceIDs":{"-1":["GPU-…"]},"AllocResp":"<base64 protobuf ContainerAllocateResponse>"}],
      "RegisteredDevices":{"nvidia.com/gpu":["GPU-…"]}},"Checksum":123}

`Data` is written as Go's encoding/json writes kubelet's struct: fields in declaration order, map keys
sorted as strings, no spaces, `<`, `>`, `&` escaped, no entries -> `null`. `DeviceIDs` is keyed by NUMA
node (`-1`: the device reports no topology).

Checksum: kubelet's is FNV-32a over a go-spew dump of the Go struct, which cannot be reproduced outside
Go. Ours is FNV-32a over the exact UTF-8 bytes of the `Data` JSON above (the canonical form). Reading
verifies it by re-encoding the parsed `Data` canonically; pass `verify=False` to read a real kubelet's
file.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from hami_node.durable import write_atomic
from hami_node.plugin.api import api_pb2

NO_TOPOLOGY = -1
"""The NUMA key of devices that report no topology."""


class CheckpointError(ValueError):
    """A checkpoint that does not parse, has the wrong shape, or fails its checksum."""


@dataclass(frozen=True)
class PodDeviceEntry:
    """The devices one container of one pod holds for one resource, and the plugin's answer."""

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: Mapping[int, tuple[str, ...]]
    response: api_pb2.ContainerAllocateResponse = field(compare=False)

    @property
    def all_device_ids(self) -> tuple[str, ...]:
        """Every device ID once, in NUMA-key order (a device on two NUMA nodes is listed under both)."""
        seen: dict[str, None] = {}
        for key in sorted(self.device_ids, key=str):
            for device in self.device_ids[key]:
                seen.setdefault(device, None)
        return tuple(seen)


@dataclass(frozen=True)
class Checkpoint:
    entries: tuple[PodDeviceEntry, ...]
    registered_devices: Mapping[str, tuple[str, ...]]
    checksum: int

    def for_container(self, pod_uid: str, container_name: str) -> list[PodDeviceEntry]:
        return [e for e in self.entries if e.pod_uid == pod_uid and e.container_name == container_name]

    def container_envs(self, pod_uid: str, container_name: str) -> dict[str, str]:
        """The environment the container gets from its device plugins: envs merged across resources
        (in resource-name order), the first value of a duplicate key winning, as kubelet merges."""
        envs: dict[str, str] = {}
        entries = sorted(self.for_container(pod_uid, container_name), key=lambda e: e.resource_name)
        for entry in entries:
            for key, value in entry.response.envs.items():
                envs.setdefault(key, value)
        return envs


FNV32_OFFSET = 0x811C9DC5


def fnv32a(data: bytes, state: int = FNV32_OFFSET) -> int:
    """FNV-32a of `data`; `state` is the hash of the bytes before it, to hash a stream in pieces."""
    value = state
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def go_json(value: Any) -> str:
    """`value` as Go's encoding/json writes it: no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped,
    other non-ASCII kept (dict keys in the order given: sort them where Go sorts map keys)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _entry_object(
    uid: str, container: str, resource: str, ids: Mapping[int, Sequence[str]], resp: str
) -> dict[str, Any]:
    return {
        "PodUID": uid,
        "ContainerName": container,
        "ResourceName": resource,
        "DeviceIDs": {str(k): list(ids[k]) for k in sorted(ids, key=str)},
        "AllocResp": resp,
    }


def _registered_object(registered: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    return {name: list(registered[name]) for name in sorted(registered)}


def _data_object(
    entries: Sequence[tuple[str, str, str, Mapping[int, Sequence[str]], str]],
    registered: Mapping[str, Sequence[str]],
) -> dict[str, Any]:
    return {
        "PodDeviceEntries": [_entry_object(*row) for row in entries] or None,
        "RegisteredDevices": _registered_object(registered),
    }


def _entry_json(entry: PodDeviceEntry) -> bytes:
    response = base64.b64encode(entry.response.SerializeToString(deterministic=True)).decode("ascii")
    return go_json(
        _entry_object(entry.pod_uid, entry.container_name, entry.resource_name, entry.device_ids, response)
    ).encode()


_ENTRIES_OPEN = b'{"PodDeviceEntries":['
_ENTRIES_OPEN_STATE = fnv32a(_ENTRIES_OPEN)
_NO_ENTRIES = b'{"PodDeviceEntries":null'


class CheckpointEncoder:
    """Encodes one node's successive checkpoints, reusing the JSON and the checksum state of the
    leading entries that are unchanged since the previous call.

    The device manager appends entries in admission order, so writing the checkpoint after an Allocate
    costs the new entry, not every entry of the node: a node with 80 pods has a 60 kB checkpoint that
    takes ~5 ms to encode and hash whole in pure Python. An entry is reused when it equals the cached
    one and carries the same response object (responses are not mutated once held).
    The output is byte-for-byte what a fresh encoder produces.
    """

    def __init__(self) -> None:
        self._chain: list[tuple[PodDeviceEntry, bytes, int]] = []
        """Per leading entry: the entry, its JSON (with the separating comma), the hash state after it."""

    def encode(self, entries: Iterable[PodDeviceEntry], registered: Mapping[str, Sequence[str]]) -> bytes:
        """The checkpoint file's bytes."""
        chain = self._chain
        new_chain: list[tuple[PodDeviceEntry, bytes, int]] = []
        state = _ENTRIES_OPEN_STATE
        reusing = True
        for i, entry in enumerate(entries):
            if reusing and i < len(chain):
                cached, piece, after = chain[i]
                if cached == entry and cached.response is entry.response:
                    new_chain.append((cached, piece, after))
                    state = after
                    continue
            reusing = False
            piece = (b"," if i else b"") + _entry_json(entry)
            state = fnv32a(piece, state)
            new_chain.append((entry, piece, state))
        self._chain = new_chain
        tail = b"]" if new_chain else b""
        tail += b',"RegisteredDevices":' + go_json(_registered_object(registered)).encode() + b"}"
        if new_chain:
            data = b"".join([_ENTRIES_OPEN, *(piece for _, piece, _ in new_chain), tail])
            checksum = fnv32a(tail, state)
        else:
            data = _NO_ENTRIES + tail
            checksum = fnv32a(data)
        return b'{"Data":' + data + b',"Checksum":' + str(checksum).encode() + b"}"


def encode_checkpoint(entries: Iterable[PodDeviceEntry], registered: Mapping[str, Sequence[str]]) -> bytes:
    """The checkpoint file's bytes."""
    return CheckpointEncoder().encode(entries, registered)


def write_checkpoint(
    path: str | os.PathLike[str],
    entries: Iterable[PodDeviceEntry],
    registered: Mapping[str, Sequence[str]],
    encoder: CheckpointEncoder | None = None,
) -> None:
    """Write atomically and durably (`hami_node.durable.write_atomic`: kubelet's filestore writeFile plus
    the directory's fsync), mode 0644; `encoder` keeps the previous write's work for the next one."""
    write_atomic(path, (encoder or CheckpointEncoder()).encode(entries, registered), mode=0o644)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:80]
    except (RecursionError, ValueError):  # nested near the recursion limit; an int of over 4,300 digits
        return f"<{type(value).__name__}>"


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CheckpointError(f"{where}: expected a string, got {_shown(value)}")
    # Go's encoding/json reads an unpaired surrogate escape ("\ud800") as U+FFFD; so does this (a lone
    # surrogate cannot be written back as UTF-8, and the checksum is over what Go would write)
    return _LONE_SURROGATE.sub("\ufffd", value)


def _str_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CheckpointError(f"{where}: expected a list of strings, got {_shown(value)}")
    return [_str(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: expected an object, got {_shown(value)}")
    return value


def decode_checkpoint(raw: bytes, *, verify: bool = True) -> Checkpoint:
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise CheckpointError(f"not JSON: {exc}") from exc
    document = _object(document, "checkpoint")
    data = _object(document.get("Data"), "Data")
    checksum = document.get("Checksum")
    if not isinstance(checksum, int) or isinstance(checksum, bool):
        raise CheckpointError(f"Checksum: expected an integer, got {_shown(checksum)}")
    entries: list[PodDeviceEntry] = []
    rows: list[tuple[str, str, str, Mapping[int, Sequence[str]], str]] = []
    raw_entries = data.get("PodDeviceEntries")
    if raw_entries is not None and not isinstance(raw_entries, list):
        raise CheckpointError("Data.PodDeviceEntries: expected a list")
    for i, raw_item in enumerate(raw_entries or []):
        where = f"Data.PodDeviceEntries[{i}]"
        item = _object(raw_item, where)
        uid = _str(item.get("PodUID"), f"{where}.PodUID")
        container = _str(item.get("ContainerName"), f"{where}.ContainerName")
        resource = _str(item.get("ResourceName"), f"{where}.ResourceName")
        ids: dict[int, tuple[str, ...]] = {}
        for key, value in _object(item.get("DeviceIDs"), f"{where}.DeviceIDs").items():
            try:
                numa = int(key)
            except ValueError:
                raise CheckpointError(f"{where}.DeviceIDs: key {key!r} is not a NUMA node number") from None
            ids[numa] = tuple(_str_list(value, f"{where}.DeviceIDs[{key}]"))
        encoded = item.get("AllocResp")
        encoded = "" if encoded is None else _str(encoded, f"{where}.AllocResp")
        response = api_pb2.ContainerAllocateResponse()
        try:
            response.ParseFromString(base64.b64decode(encoded, validate=True))
        except (binascii.Error, DecodeError) as exc:
            raise CheckpointError(
                f"{where}.AllocResp: not a base64 ContainerAllocateResponse: {exc}"
            ) from exc
        entries.append(PodDeviceEntry(uid, container, resource, ids, response))
        rows.append((uid, container, resource, ids, encoded))
    registered = {
        _str(name, "Data.RegisteredDevices key"): tuple(_str_list(ids, f"Data.RegisteredDevices[{name}]"))
        for name, ids in _object(data.get("RegisteredDevices"), "Data.RegisteredDevices").items()
    }
    if verify:
        expected = fnv32a(go_json(_data_object(rows, registered)).encode())
        if expected != checksum:
            raise CheckpointError(
                f"checksum mismatch: the file says {checksum}, its Data hashes to {expected}"
            )
    return Checkpoint(tuple(entries), registered, checksum)


def read_checkpoint(path: str | os.PathLike[str], *, verify: bool = True) -> Checkpoint:
    """Read and check a checkpoint file; each entry carries its decoded ContainerAllocateResponse."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
    try:
        return decode_checkpoint(raw, verify=verify)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from exc
