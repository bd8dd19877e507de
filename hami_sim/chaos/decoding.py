"""The invariant checker's own decoders, written from the formats' descriptions and not from hami-py's
codecs (hami_api, hami_sim.kubelet), so that a bug there cannot hide a violation. Pure.

- `hami.io/node-nvidia-register` (HAMi's device plugin, `device.MarshalNodeDevices`): a JSON array of
  `{"id","index","count","devmem","devcore","type","numa","mode","health"}` with every field omitted
  when zero/false (>= v2.8), or the legacy (<= v2.7) `UUID,count,devmem,devcore,type,numa,health[,index,
  mode]:` per GPU.
- `hami.io/vgpu-devices-allocated` / `-to-allocate`: `<uuid>,<vendor>,<MiB>,<cores>:` per GPU, `;` after
  each container (init containers first, then the regular ones, in spec order).
- Kubernetes quantities (`16Gi`, `100`, `1.5k`, `500m`) as exact fractions.
- Device IDs kubelet records for HAMi's device plugin: `<GPU-UUID>-<n>` (or NVIDIA's `<uuid>::<n>`).
- kubelet's `kubelet_internal_checkpoint` (`Data.PodDeviceEntries[]`), its `dra_manager_state` (`Data` is
  a JSON string whose `Entries[]` hold `ClaimName`, `Namespace`, `PodUIDs`, `DriverState`) and the
  stand-in runtime's `containers.json` (`{"containers":[{"podUID","container","env",...}]}`), read as
  plain JSON. Checksums are not verified: a file that parses is read for what it says.

Every decoder raises `DecodeError` naming what is wrong and where.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

NODE_REGISTER = "hami.io/node-nvidia-register"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
VGPU_NODE = "hami.io/vgpu-node"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"

MIB = 1 << 20


class DecodeError(ValueError):
    """An input the checker cannot read; the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as its node registered it."""

    id: str
    count: int
    devmem: int
    """MiB."""
    devcore: int
    """Percent of the SMs HAMi hands out on it (100 x core scaling)."""
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Slice:
    """One container's share of one GPU, as the allocation annotation writes it."""

    uuid: str
    mem: int
    cores: int


Allocation = tuple[tuple[Slice, ...], ...]
"""Per container (init containers first), its slices."""


# --- hami.io/node-nvidia-register -------------------------------------------------------------------------


def _int_field(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"{where}.{key}: expected an integer, got {json.dumps(value)[:60]}")
    return value


def _json_register(text: str) -> tuple[Gpu, ...]:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise DecodeError(f"{NODE_REGISTER}: not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise DecodeError(f"{NODE_REGISTER}: expected a JSON array, got {text[:60]!r}")
    gpus = []
    for i, item in enumerate(raw):
        where = f"{NODE_REGISTER}[{i}]"
        if not isinstance(item, Mapping):
            raise DecodeError(f"{where}: expected an object, got {json.dumps(item)[:60]}")
        uuid = item.get("id")
        if not isinstance(uuid, str) or not uuid:
            raise DecodeError(f"{where}.id: expected a non-empty string, got {json.dumps(uuid)[:60]}")
        health = item.get("health", False)
        if not isinstance(health, bool):
            raise DecodeError(f"{where}.health: expected a boolean, got {json.dumps(health)[:60]}")
        gpus.append(
            Gpu(
                uuid,
                _int_field(item, "count", where),
                _int_field(item, "devmem", where),
                _int_field(item, "devcore", where),
                health,
            )
        )
    return tuple(gpus)


def _legacy_int(text: str, field: str, where: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", text):
        raise DecodeError(f"{where}: {field} {text!r} is not an integer")
    return int(text)


def _legacy_register(text: str) -> tuple[Gpu, ...]:
    gpus = []
    for i, entry in enumerate(e for e in text.split(":") if e):
        where = f"{NODE_REGISTER} device {i}"
        fields = entry.split(",")
        if len(fields) < 7:
            raise DecodeError(f"{where}: {entry[:60]!r} has {len(fields)} fields, expected at least 7")
        gpus.append(
            Gpu(
                fields[0],
                _legacy_int(fields[1], "count", where),
                _legacy_int(fields[2], "devmem", where),
                _legacy_int(fields[3], "devcore", where),
                fields[6].lower() == "true",
            )
        )
    return tuple(gpus)


def decode_register(text: str) -> tuple[Gpu, ...]:
    """The GPUs of a `hami.io/node-nvidia-register` value (either format)."""
    stripped = text.strip()
    if not stripped:
        return ()
    if stripped.startswith("["):
        return _json_register(stripped)
    return _legacy_register(text)


# --- hami.io/vgpu-devices-allocated -----------------------------------------------------------------------


def _slice(entry: str, where: str) -> Slice:
    fields = entry.split(",")
    if len(fields) != 4 or not fields[0]:
        raise DecodeError(f"{where}: {entry[:80]!r} is not '<uuid>,<vendor>,<MiB>,<cores>'")
    uuid, _vendor, mem, cores = fields
    if not mem.isdigit() or not cores.isdigit():
        raise DecodeError(f"{where}: {entry[:80]!r}: memory and cores must be non-negative integers")
    return Slice(uuid, int(mem), int(cores))


def decode_allocation(text: str, annotation: str = DEVICES_ALLOCATED) -> Allocation:
    """Per container, its slices; "" is a pod without entries."""
    if not text:
        return ()
    if not text.endswith(";"):
        raise DecodeError(f"{annotation}: {text[-60:]!r} does not end with ';'")
    containers: list[tuple[Slice, ...]] = []
    for c, piece in enumerate(text[:-1].split(";")):
        where = f"{annotation} container {c}"
        if not piece:
            containers.append(())
            continue
        if not piece.endswith(":"):
            raise DecodeError(f"{where}: {piece[:80]!r} does not end with ':'")
        containers.append(
            tuple(_slice(e, f"{where} device {i}") for i, e in enumerate(piece[:-1].split(":")))
        )
    return tuple(containers)


# --- quantities, device IDs ---------------------------------------------------------------------------------

_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(1 << 10),
    "Mi": Fraction(1 << 20),
    "Gi": Fraction(1 << 30),
    "Ti": Fraction(1 << 40),
    "Pi": Fraction(1 << 50),
    "Ei": Fraction(1 << 60),
}
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
)


def parse_quantity(value: object, where: str) -> Fraction:
    """A Kubernetes quantity (a string, or a JSON number) as an exact fraction."""
    if isinstance(value, bool):
        raise DecodeError(f"{where}: {value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise DecodeError(f"{where}: {text[:40]!r} is not a quantity")
    number, exponent, suffix = match.groups()
    scale = Fraction(10) ** int(exponent) if exponent else _SUFFIX[suffix or ""]
    return Fraction(number) * scale


def device_gpu(device_id: str) -> str:
    """The GPU UUID of a device ID kubelet recorded for HAMi's plugin: `<uuid>::<n>` or `<uuid>-<n>`;
    any other ID is its own GPU."""
    uuid, sep, replica = device_id.partition("::")
    if not sep:
        uuid, sep, replica = device_id.rpartition("-")
    if sep and uuid and replica.isdigit():
        return uuid
    return device_id


# --- kubelet's files ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """kubelet_internal_checkpoint: the devices one container holds for one resource."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    """dra_manager_state: one claim kubelet prepared (or is preparing) for some pods."""

    namespace: str
    claim: str
    claim_uid: str
    pod_uids: frozenset[str]
    devices: tuple[PreparedDevice, ...]


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """containers.json: what one started container got from its devices."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    env: Mapping[str, str]
    cdi_devices: tuple[str, ...]
    mounts: tuple[str, ...]
    """Container paths."""
    device_nodes: tuple[str, ...]
    """Container paths."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The container annotations its device plugins returned (CDI names under `cdi.k8s.io/...`)."""


def _load(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"{what}: not JSON: {exc}") from None


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DecodeError(f"{where}: expected an object, got {json.dumps(value)[:60]}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeError(f"{where}: expected a list, got {json.dumps(value)[:60]}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"{where}: expected a string, got {json.dumps(value)[:60]}")
    return value


def decode_device_checkpoint(raw: bytes) -> tuple[DeviceEntry, ...]:
    """The entries of a `kubelet_internal_checkpoint`."""
    data = _obj(_obj(_load(raw, "kubelet_internal_checkpoint"), "checkpoint").get("Data"), "Data")
    entries = []
    for i, item in enumerate(_list(data.get("PodDeviceEntries"), "Data.PodDeviceEntries")):
        where = f"Data.PodDeviceEntries[{i}]"
        entry = _obj(item, where)
        ids: list[str] = []
        for numa, devices in sorted(_obj(entry.get("DeviceIDs"), f"{where}.DeviceIDs").items()):
            for j, raw_device in enumerate(_list(devices, f"{where}.DeviceIDs[{numa}]")):
                device = _str(raw_device, f"{where}.DeviceIDs[{numa}][{j}]")
                if device not in ids:
                    ids.append(device)
        entries.append(
            DeviceEntry(
                _str(entry.get("PodUID"), f"{where}.PodUID"),
                _str(entry.get("ContainerName"), f"{where}.ContainerName"),
                _str(entry.get("ResourceName"), f"{where}.ResourceName"),
                tuple(ids),
            )
        )
    return tuple(entries)


def decode_dra_checkpoint(raw: bytes) -> tuple[ClaimEntry, ...]:
    """The entries of a `dra_manager_state`."""
    data = _obj(_load(raw, "dra_manager_state"), "checkpoint").get("Data")
    content = _obj(_load(_str(data, "Data").encode(), "Data"), "Data")
    entries = []
    for i, item in enumerate(_list(content.get("Entries"), "Data.Entries")):
        where = f"Data.Entries[{i}]"
        entry = _obj(item, where)
        devices = []
        for driver, state in sorted(_obj(entry.get("DriverState"), f"{where}.DriverState").items()):
            at = f"{where}.DriverState[{driver}].Devices"
            for j, device in enumerate(_list(_obj(state, at).get("Devices"), at)):
                d = _obj(device, f"{at}[{j}]")
                devices.append(
                    PreparedDevice(
                        driver,
                        _str(d.get("PoolName", ""), f"{at}[{j}].PoolName"),
                        _str(d.get("DeviceName", ""), f"{at}[{j}].DeviceName"),
                    )
                )
        entries.append(
            ClaimEntry(
                _str(entry.get("Namespace", ""), f"{where}.Namespace"),
                _str(entry.get("ClaimName", ""), f"{where}.ClaimName"),
                _str(entry.get("ClaimUID", ""), f"{where}.ClaimUID"),
                frozenset(_obj(entry.get("PodUIDs"), f"{where}.PodUIDs")),
                tuple(devices),
            )
        )
    return tuple(entries)


def _paths(value: Any, key: str, where: str) -> tuple[str, ...]:
    return tuple(
        _str(_obj(item, f"{where}[{i}]").get(key), f"{where}[{i}].{key}")
        for i, item in enumerate(_list(value, where))
    )


def decode_containers(raw: bytes) -> tuple[ContainerRecord, ...]:
    """The records of a `containers.json`."""
    document = _obj(_load(raw, "containers.json"), "containers.json")
    records = []
    for i, item in enumerate(_list(document.get("containers"), "containers")):
        where = f"containers[{i}]"
        record = _obj(item, where)
        env: dict[str, str] = {}
        for j, entry in enumerate(_list(record.get("env"), f"{where}.env")):
            key, _, value = _str(entry, f"{where}.env[{j}]").partition("=")
            env.setdefault(key, value)
        records.append(
            ContainerRecord(
                pod_uid=_str(record.get("podUID"), f"{where}.podUID"),
                namespace=_str(record.get("namespace", ""), f"{where}.namespace"),
                pod=_str(record.get("pod", ""), f"{where}.pod"),
                container=_str(record.get("container"), f"{where}.container"),
                env=env,
                cdi_devices=tuple(
                    _str(d, f"{where}.cdiDevices[{j}]")
                    for j, d in enumerate(_list(record.get("cdiDevices"), f"{where}.cdiDevices"))
                ),
                mounts=_paths(record.get("mounts"), "containerPath", f"{where}.mounts"),
                device_nodes=_paths(record.get("deviceNodes"), "path", f"{where}.deviceNodes"),
                annotations={
                    str(k): _str(v, f"{where}.annotations[{k}]")
                    for k, v in _obj(record.get("annotations"), f"{where}.annotations").items()
                },
            )
        )
    return tuple(records)
