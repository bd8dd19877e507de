"""Kubelet's DRA manager checkpoint, `dra_manager_state`, in kubelet's format (version v1).

    {"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",
      \\"Entries\\":[{\\"ClaimUID\\":\\"…\\",\\"ClaimName\\":\\"c\\",\\"Namespace\\":\\"default\\",
      \\"PodUIDs\\":{\\"<pod uid>\\":{}},\\"DriverState\\":{\\"<driver>\\":{\\"Devices\\":[
      {\\"PoolName\\":\\"node-1\\",\\"DeviceName\\":\\"gpu-0\\",\\"ShareID\\":null,
       \\"RequestNames\\":[\\"gpu\\"],\\"CDIDeviceIDs\\":[\\"vendor/class=name\\"]}]}}}]}","Checksum":1234}

Facts from kubernetes pkg/kubelet/cm/dra/state (checkpoint.go, types.go / state.go, checkpointer.go):

- `Data` is a string: the JSON of `CheckpointData{TypeMeta{kind, apiVersion}, Entries}` as Go's
  encoding/json writes it (struct fields in declaration order, map keys sorted, `<>&` escaped, nil
  slices and maps as `null`); `Checksum` is CRC-32 (IEEE) of those bytes (`crc32.ChecksumIEEE`), so a
  real kubelet's file and this one check each other.
- An entry is a `ClaimInfoState`: the claim's UID, name and namespace, `PodUIDs` (a `sets.Set[string]`:
  a JSON object whose values are `{}`), and `DriverState`, one `{"Devices": [...]}` per driver that has
  allocation results in the claim, `null` until the claim is prepared. A device is what
  NodePrepareResources answered: pool, device, `ShareID` (a pointer: `null` when the plugin sent none,
  as a v1beta1 plugin never does), request names and CDI device IDs (`null` when empty).
- The first read of a missing file stores an empty checkpoint (`Entries: null`); every later store
  writes the whole cache (`Entries: []` when it is empty). Entries are in Go map order there (random);
  here by namespace and claim name.
- Kubelet refuses to start when the file does not parse or fails its checksum ("could not initialize
  checkpoint manager, please drain node and remove DRA state file"); so does the stand-in.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami_node.durable import write_atomic
from hami_sim.kubelet.checkpoint import go_json

CHECKPOINT_FILE = "dra_manager_state"
"""Kubelet's draManagerStateFileName."""

KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


class DraCheckpointError(ValueError):
    """A DRA checkpoint that does not parse, has the wrong shape or version, or fails its checksum."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device as a DRA plugin described it in NodePrepareResources (kubelet's state.Device)."""

    pool_name: str
    device_name: str
    share_id: str | None = None
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()


@dataclass
class ClaimInfoState:
    """One claim as kubelet's DRA manager keeps it (state.ClaimInfoState)."""

    claim_uid: str
    claim_name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    driver_state: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    """Driver name -> its prepared devices (empty until NodePrepareResources answered)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.claim_name)


# ------------------------------------------------------------------------------ encoding


def _device_object(device: PreparedDevice) -> dict[str, Any]:
    return {
        "PoolName": device.pool_name,
        "DeviceName": device.device_name,
        "ShareID": device.share_id,
        "RequestNames": list(device.request_names) or None,
        "CDIDeviceIDs": list(device.cdi_device_ids) or None,
    }


def _entry_object(entry: ClaimInfoState) -> dict[str, Any]:
    return {
        "ClaimUID": entry.claim_uid,
        "ClaimName": entry.claim_name,
        "Namespace": entry.namespace,
        "PodUIDs": {uid: {} for uid in sorted(entry.pod_uids)},
        "DriverState": {
            driver: {"Devices": [_device_object(d) for d in entry.driver_state[driver]] or None}
            for driver in sorted(entry.driver_state)
        },
    }


def encode_data(entries: Iterable[ClaimInfoState] | None) -> str:
    """The `Data` string: None for the empty checkpoint kubelet creates (`Entries: null`)."""
    listed = None if entries is None else [_entry_object(e) for e in sorted(entries, key=lambda e: e.key)]
    return go_json({"kind": KIND, "apiVersion": API_VERSION, "Entries": listed})


def encode_checkpoint(entries: Iterable[ClaimInfoState] | None) -> bytes:
    """The file's bytes: `{"Data":"...","Checksum":N}` as Go's json.Marshal writes the Checkpoint."""
    data = encode_data(entries)
    checksum = zlib.crc32(data.encode())
    return b'{"Data":' + go_json(data).encode() + b',"Checksum":' + str(checksum).encode() + b"}"


def write_checkpoint(path: str | os.PathLike[str], entries: Iterable[ClaimInfoState] | None) -> None:
    """Write atomically and durably (`hami_node.durable.write_atomic`), mode 0644."""
    write_atomic(path, encode_checkpoint(entries), mode=0o644)


# ------------------------------------------------------------------------------ decoding


def _type_name(value: Any) -> str:
    return json.dumps(value)[:80]


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise DraCheckpointError(f"{where}: expected a string, got {_type_name(value)}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DraCheckpointError(f"{where}: expected a list of strings, got {_type_name(value)}")
    return tuple(_str(item, f"{where}[{i}]") for i, item in enumerate(value))


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DraCheckpointError(f"{where}: expected an object, got {_type_name(value)}")
    return value


def _device(value: Any, where: str) -> PreparedDevice:
    item = _object(value, where)
    share = item.get("ShareID")
    return PreparedDevice(
        pool_name=_str(item.get("PoolName", ""), f"{where}.PoolName"),
        device_name=_str(item.get("DeviceName", ""), f"{where}.DeviceName"),
        share_id=None if share is None else _str(share, f"{where}.ShareID"),
        request_names=_strings(item.get("RequestNames"), f"{where}.RequestNames"),
        cdi_device_ids=_strings(item.get("CDIDeviceIDs"), f"{where}.CDIDeviceIDs"),
    )


def _entry(value: Any, where: str) -> ClaimInfoState:
    item = _object(value, where)
    drivers: dict[str, tuple[PreparedDevice, ...]] = {}
    for driver, state in _object(item.get("DriverState"), f"{where}.DriverState").items():
        at = f"{where}.DriverState[{driver}]"
        devices = _object(state, at).get("Devices")
        if devices is not None and not isinstance(devices, list):
            raise DraCheckpointError(f"{at}.Devices: expected a list, got {_type_name(devices)}")
        drivers[driver] = tuple(_device(d, f"{at}.Devices[{i}]") for i, d in enumerate(devices or []))
    return ClaimInfoState(
        claim_uid=_str(item.get("ClaimUID", ""), f"{where}.ClaimUID"),
        claim_name=_str(item.get("ClaimName", ""), f"{where}.ClaimName"),
        namespace=_str(item.get("Namespace", ""), f"{where}.Namespace"),
        pod_uids=set(_object(item.get("PodUIDs"), f"{where}.PodUIDs")),
        driver_state=drivers,
    )


def decode_checkpoint(raw: bytes) -> list[ClaimInfoState]:
    """The entries of a checkpoint file's bytes; `DraCheckpointError` names what is wrong."""
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DraCheckpointError(f"not JSON: {exc}") from exc
    document = _object(document, "checkpoint")
    data = _str(document.get("Data"), "Data")
    checksum = document.get("Checksum")
    if not isinstance(checksum, int) or isinstance(checksum, bool) or not 0 <= checksum < 1 << 32:
        raise DraCheckpointError(f"Checksum: expected a 32-bit unsigned integer, got {_type_name(checksum)}")
    expected = zlib.crc32(data.encode())
    if checksum != expected:
        raise DraCheckpointError(
            f"checksum mismatch: the file says {checksum}, its Data hashes to {expected}"
        )
    try:
        content = _object(json.loads(data), "Data")
    except ValueError as exc:
        raise DraCheckpointError(f"Data: not JSON: {exc}") from exc
    version = content.get("apiVersion")
    if version not in (None, "", API_VERSION):
        raise DraCheckpointError(f"Data.apiVersion: {version!r} is not supported (only {API_VERSION})")
    entries = content.get("Entries")
    if entries is not None and not isinstance(entries, list):
        raise DraCheckpointError(f"Data.Entries: expected a list, got {_type_name(entries)}")
    return [_entry(e, f"Data.Entries[{i}]") for i, e in enumerate(entries or [])]


def read_dra_checkpoint(path: str | os.PathLike[str]) -> list[ClaimInfoState]:
    """Read and check a `dra_manager_state` file (the stand-in's or a real kubelet's)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DraCheckpointError(f"cannot read DRA checkpoint {path}: {exc.strerror or exc}") from exc
    try:
        return decode_checkpoint(raw)
    except DraCheckpointError as exc:
        raise DraCheckpointError(f"DRA checkpoint {path}: {exc}") from exc


def claims_by_key(entries: Iterable[ClaimInfoState]) -> Mapping[tuple[str, str], ClaimInfoState]:
    """Entries keyed by (namespace, claim name), as kubelet's claim info cache keys them."""
    return {e.key: e for e in entries}
