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
- kubelet's `kubelet_internal_checkpoint` (`Data.PodDeviceEntries[]`, `Data.RegisteredDevices`), its
  `dra_manager_state` (`Data` is a JSON string whose `Entries[]` hold `ClaimName`, `Namespace`,
  `PodUIDs`, `DriverState`) and the stand-in runtime's `containers.json` (`{"containers":[{"podUID",
  "container","env",...}]}`), read as plain JSON. Checksums are not verified: a file that parses is read
  for what it says.

The other accelerators HAMi shares (issue 26), written from HAMi v2.10's wire formats
(pkg/device/<vendor>/device.go, pkg/device/devices.go; reference/vendors.md) and the device-plugin
stand-ins' documented contract (docs/vendor-nodes.md), never from hami_control's devices package or
hami_sim.vendors. A `Family` is one of HAMi's device kinds: its common word (the `Type` of its devices and
the key of its pod annotations: DCU, MLU, Ascend910B4, MR-V100, Metax-SGPU, ...), its vendor, its
"-allocated" pod annotation, the resources a container asks it with, and what the stand-in's kubelet
device IDs and Allocate answers say about a device.

- Node inventories (`node_devices`), as HAMi's GetNodeDevices reads them: legacy strings
  (`DecodeNodeDevices`): `hami.io/node-dcu-register`, `hami.io/node-<chip>-register` (Iluvatar); Go's
  `json.Unmarshal` of `[]*DeviceInfo` (keys matched case-insensitively, integers only, unknown keys
  ignored): `hami.io/node-register-<Ascend chip>`, `hami.io/node-amd-register`,
  `hami.io/node-biren-register` and `hami.io/node-va-register` (both with Devcore forced to 100),
  `hami.io/node-register-xpu`; MetaX's list `metax-tech.com/node-gpu-devices` (`uuid`, `totalDevCount`,
  `totalVRam`, `totalCompute`, `healthy`; the index is the position) and Enflame's
  `enflame.com/gcu-drs-capacity` (`{"devices":[{"index","minor","capacity"}],"profiles":{"<s>g.<m>gb":
  "<id>"}}`: devices `<node>-enflame-drs-<index>` of `capacity` slices and the largest profile's memory);
  the Node's capacity, with the ids HAMi synthesises: Cambricon (`<node>-cambricon-mlu-<i>` per 100 of
  `cambricon.com/mlu.smlu.vcore`, memory from `...vmemory` x 256), MetaX GPU (`<node>-metax-<i>`),
  Mthreads (`<node>-mthreads-<i>` per 16 `mthreads.com/sgpu-core`, memory from `sgpu-memory` x 512),
  Enflame GCU (`<node>-GCU-<i>`), Kunlun XPU (`<node>-kunlun-<i>`), AWS Neuron (`<node>-AWSNeuron-<i>`,
  its cores a bit mask of `neuroncore / neuron` bits), capacities read as Go's `Quantity.AsInt64`.
- Pod annotations (`decode_vendor_allocation`): HAMi's `EncodePodSingleDevice`, `<id>,<type>,<MiB>,
  <cores>:` per device and `;` after each container, the same for every vendor (AWS Neuron's cores are a
  core mask).

Every decoder raises `DecodeError` naming what is wrong and where.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    model: str = ""
    """Its type as registered (NVML's name, e.g. `NVIDIA-A100-SXM4-40GB`): what `nvidia.com/use-gputype`
    matches."""


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
                str(item.get("type") or ""),
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
                fields[4],
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


def decode_registered_devices(raw: bytes) -> dict[str, tuple[str, ...]]:
    """A `kubelet_internal_checkpoint`'s `Data.RegisteredDevices`: resource -> the healthy device IDs its
    plugin registered."""
    data = _obj(_obj(_load(raw, "kubelet_internal_checkpoint"), "checkpoint").get("Data"), "Data")
    registered = _obj(data.get("RegisteredDevices"), "Data.RegisteredDevices")
    return {
        str(resource): tuple(
            _str(d, f"Data.RegisteredDevices[{resource}][{j}]")
            for j, d in enumerate(_list(ids, f"Data.RegisteredDevices[{resource}]"))
        )
        for resource, ids in sorted(registered.items())
    }


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


# === the other vendors ======================================================================================

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT64 = (0, (1 << 64) - 1)

DSMLU_ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
"""Cambricon's marker: "false" at filter, "true" once its plugin's second Allocate made the instance (the
dynamic-smlu plugin writes no bind phase)."""
METAX_APP_CLASS = "metax-tech.com/sgpu-app-class"


# --- families -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Family:
    """One of HAMi's device kinds besides NVIDIA."""

    word: str
    """HAMi's common word: the `Type` its requests carry and the `PodDevices` key."""
    vendor: str
    allocated: str
    """The "-allocated" pod annotation (HAMi's `SupportDevices`)."""
    to_allocate: str
    """The "-to-allocate" pod annotation ("" where HAMi writes none)."""
    count_resources: tuple[str, ...]
    """A container limiting one of these asks this family (HAMi's GenerateResourceRequests)."""
    share_resource: str
    """The resource whose kubelet device IDs are one per device share the container holds ("" when the
    IDs count something else: Cambricon's percent and 256 MiB units, AWS Neuron's cores)."""
    id_scheme: str = ""
    """How the stand-in's kubelet device IDs name an inventory device: `fake` (`<id>-fake-<n>`, Hygon),
    `suffix` (`<id>-<n>`), `bdf` (`<pci bdf>#<n>`, AMD); "" where they do not (the ids of vendors HAMi
    reads from the capacity are synthesised by HAMi, not the plugin's)."""
    visible_env: str = ""
    """The Allocate answer's env key listing the container's devices (by index, or by id for Biren)."""
    device_node: str = ""
    """A regex of the device nodes the Allocate answer gives per device (group 1: its index)."""


def _fixed(*families: Family) -> dict[str, Family]:
    return {f.word: f for f in families}


FAMILIES: Mapping[str, Family] = _fixed(
    Family(
        "DCU", "hygon", "hami.io/dcu-devices-allocated", "hami.io/dcu-devices-to-allocate",
        ("hygon.com/dcunum",), "hygon.com/dcunum", "fake", device_node=r"/dev/dri/card([0-9]+)",
    ),
    Family(
        "MLU", "cambricon", "hami.io/cambricon-mlu-devices-allocated",
        "hami.io/cambricon-mlu-devices-to-allocate", ("cambricon.com/vmlu",), "",
        device_node=r"/dev/cambricon_dev([0-9]+)",
    ),
    Family(
        "Metax-GPU", "metax", "hami.io/metax-gpu-devices-allocated", "hami.io/metax-gpu-devices-to-allocate",
        ("metax-tech.com/gpu",), "metax-tech.com/gpu", visible_env="METAX_VISIBLE_DEVICES",
    ),
    Family(
        "Metax-SGPU", "metax", "hami.io/metax-sgpu-devices-allocated",
        "hami.io/metax-sgpu-devices-to-allocate", ("metax-tech.com/sgpu",), "metax-tech.com/sgpu", "suffix",
        "METAX_VISIBLE_DEVICES",
    ),
    Family(
        "Mthreads", "mthreads", "hami.io/mthreads-vgpu-devices-allocated", "", ("mthreads.com/vgpu",),
        "mthreads.com/vgpu", visible_env="MTHREADS_VISIBLE_DEVICES",
    ),
    Family(
        "Enflame", "enflame", "hami.io/enflame-vgpu-devices-allocated", "",
        ("enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"), "enflame.com/drs-gcu",
        visible_env="ENFLAME_VISIBLE_DEVICES",
    ),
    Family(
        "GCU", "enflame", "hami.io/enflame-gcu-devices-allocated", "hami.io/enflame-gcu-devices-to-allocate",
        ("enflame.com/gcu",), "enflame.com/gcu", visible_env="ENFLAME_VISIBLE_DEVICES",
    ),
    Family(
        "XPU", "kunlun", "hami.io/xpu-devices-allocated", "hami.io/xpu-devices-to-allocate",
        ("kunlunxin.com/vxpu",), "kunlunxin.com/vxpu", "suffix", "XPU_VISIBLE_DEVICES",
    ),
    Family(
        "kunlun", "kunlun", "hami.io/kunlun-allocated", "", ("kunlunxin.com/xpu",), "kunlunxin.com/xpu",
        visible_env="XPU_VISIBLE_DEVICES",
    ),
    Family(
        "AWSNeuron", "awsneuron", "hami.io/aws-neuron-devices-allocated", "",
        ("aws.amazon.com/neuron", "aws.amazon.com/neuroncore"), "",
    ),
    Family(
        "AMD", "amd", "hami.io/amd-devices-allocated", "hami.io/amd-devices-to-allocate",
        ("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"), "amd.com/gpu", "bdf",
        device_node=r"/dev/dri/card([0-9]+)",
    ),
    Family(
        "Vastai", "vastai", "hami.io/Vastai-devices-allocated", "hami.io/Vastai-devices-to-allocate",
        ("vastaitech.com/va",), "vastaitech.com/va", "suffix", "VASTAI_VISIBLE_DEVICES",
    ),
    Family(
        "Biren", "biren", "hami.io/Biren-devices-allocated", "hami.io/Biren-devices-to-allocate",
        ("birentech.com/gpu",), "birentech.com/gpu", "suffix", "BR_PHY_CARDS",
    ),
)  # fmt: skip
"""The families with one common word (the chart's device config)."""

ILUVATAR_CHIPS = ("MR-V100", "MR-V50", "BI-V150", "BI-V100")
"""The chart's `iluvatars[]` common words (one family each)."""
ASCEND_PREFIX = "Ascend"
"""Every Ascend common word of the chart's `vnpus` starts so (Ascend910A ... Ascend910C, Ascend310P)."""


def ascend_family(word: str) -> Family:
    return Family(
        word, "ascend", f"hami.io/{word}-devices-allocated", f"hami.io/{word}-devices-to-allocate",
        (f"huawei.com/{word}",), f"huawei.com/{word}", "suffix", "ASCEND_VISIBLE_DEVICES",
    )  # fmt: skip


def iluvatar_family(word: str) -> Family:
    return Family(
        word, "iluvatar", f"hami.io/{word}-devices-allocated", f"hami.io/{word}-devices-to-allocate",
        (f"iluvatar.ai/{word}-vgpu",), f"iluvatar.ai/{word}-vgpu", "suffix", "IX_VISIBLE_DEVICES",
    )  # fmt: skip


_PER_CHIP_ALLOCATED = re.compile(r"hami\.io/(.+)-devices-allocated")


def family_of_allocated(annotation: str) -> Family | None:
    """The family whose "-allocated" pod annotation `annotation` is (None: not a vendor's)."""
    for family in FAMILIES.values():
        if family.allocated == annotation:
            return family
    match = _PER_CHIP_ALLOCATED.fullmatch(annotation)
    if match is None:
        return None
    word = match.group(1)
    if word.startswith(ASCEND_PREFIX):
        return ascend_family(word)
    if word in ILUVATAR_CHIPS:
        return iluvatar_family(word)
    return None


def family_of_resource(resource: str) -> Family | None:
    """The family a container limiting `resource` asks (None: no vendor's count resource)."""
    for family in FAMILIES.values():
        if resource in family.count_resources:
            return family
    if resource.startswith(f"huawei.com/{ASCEND_PREFIX}") and not resource.endswith(("-memory", "-core")):
        return ascend_family(resource.removeprefix("huawei.com/"))
    for chip in ILUVATAR_CHIPS:
        if resource == f"iluvatar.ai/{chip}-vgpu":
            return iluvatar_family(chip)
    return None


# --- Go's scalars -------------------------------------------------------------------------------------------


_GO_INT = re.compile(r"[+-]?[0-9]+")


def go_parse_int(text: str, bounds: tuple[int, int], where: str) -> int:
    """strconv.ParseInt(text, 10, bits) / Atoi: an optional sign and decimal digits, within `bounds`."""
    if not _GO_INT.fullmatch(text):
        raise DecodeError(f"{where}: {text[:40]!r} is not an integer")
    value = int(text)
    if not bounds[0] <= value <= bounds[1]:
        raise DecodeError(f"{where}: {text[:40]} is out of range")
    return value


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_parse_bool(text: str, where: str) -> bool:
    """strconv.ParseBool."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DecodeError(f"{where}: {text[:40]!r} is not a boolean")


def _fold(key: str) -> str:
    """Go's encoding/json key folding for the ASCII field names it matches (bytes.EqualFold): ASCII letters
    fold to lower case, U+017F (long s) to "s" and U+212A (Kelvin sign) to "k"; other characters stay."""
    out = []
    for ch in key:
        if ch == "\u017f":
            out.append("s")
        elif ch == "\u212a":
            out.append("k")
        elif ch.isascii():
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def go_json(text: str, where: str) -> Any:
    """JSON as Go reads it: no NaN or Infinity; objects as lists of (key, value) pairs in document order
    (duplicate keys: the last one wins, as Go assigns them in turn). Integers stay `int`, other numbers
    `float`."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"{where}: not JSON: {exc}") from None


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs."""


def _go_fields(obj: Any, fields: Mapping[str, str], where: str) -> dict[str, Any]:
    """A JSON object decoded into a Go struct with json tags `fields` (folded tag -> our name): each key
    matched case-insensitively, the last wins, unknown keys ignored; `null` leaves the field out."""
    if not isinstance(obj, _Pairs):
        raise DecodeError(f"{where}: expected an object, got {_short(obj)}")
    out: dict[str, Any] = {}
    for key, value in obj:
        name = fields.get(_fold(key))
        if name is not None and value is not None:
            out[name] = (key, value)
    return out


def _go_int(field: tuple[str, Any] | None, bounds: tuple[int, int], where: str) -> int:
    if field is None:
        return 0
    key, value = field
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"{where}.{key}: expected an integer, got {_short(value)}")
    if not bounds[0] <= value <= bounds[1]:
        raise DecodeError(f"{where}.{key}: {value} is out of range")
    return value


def _go_str(field: tuple[str, Any] | None, where: str) -> str:
    if field is None:
        return ""
    key, value = field
    if not isinstance(value, str):
        raise DecodeError(f"{where}.{key}: expected a string, got {_short(value)}")
    return value


def _go_bool(field: tuple[str, Any] | None, where: str) -> bool:
    if field is None:
        return False
    key, value = field
    if not isinstance(value, bool):
        raise DecodeError(f"{where}.{key}: expected a boolean, got {_short(value)}")
    return value


def _plain(value: Any) -> Any:
    """A decoded JSON value with objects as dicts (the last of duplicate keys wins)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _short(value: Any) -> str:
    return json.dumps(_plain(value), default=str)[:60]


def go_as_int64(value: object, where: str) -> int | None:
    """`resource.Quantity.AsInt64()` of a capacity value: the integer, or None when it is not one exactly
    (a fraction, out of int64). Raises DecodeError for what is no quantity."""
    number = parse_quantity(value, where)
    if number.denominator != 1 or not INT64[0] <= number.numerator <= INT64[1]:
        return None
    return number.numerator


# --- devices ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Profile:
    """An Enflame DRS profile `<size>g.<memory>gb`: the slices it takes, its memory and its cores."""

    size: int
    memory_gb: int
    core_percent: int


@dataclass(frozen=True, slots=True)
class VendorDevice:
    """One device of another vendor as HAMi's scheduler side reads it from its node."""

    family: str
    """The common word of the inventory it came from."""
    vendor: str
    id: str
    index: int
    count: int
    devmem: int
    """MiB (GCU: 100, a percentage HAMi writes for it)."""
    devcore: int
    """The vendor's unit (percent; Ascend AI cores; AMD compute units; Mthreads cores; AWS Neuron: the
    mask of its cores)."""
    type: str
    health: bool = True
    bdf: str = ""
    """AMD: its PCI address (`custominfo.pciBDF`)."""
    profiles: tuple[Profile, ...] = ()
    """Enflame DRS: the node's profiles."""
    cores_per: int = 0
    """AWS Neuron: NeuronCores per device."""
    minor: str = ""
    """Enflame DRS: its minor number (`minor`, trimmed; the index where empty, as HAMi reads it)."""


_DEVICE_INFO_FIELDS = {
    "id": "id",
    "index": "index",
    "count": "count",
    "devmem": "devmem",
    "devcore": "devcore",
    "type": "type",
    "numa": "numa",
    "mode": "mode",
    "health": "health",
    "devicevendor": "devicevendor",
    "custominfo": "custominfo",
    "migprofiles": "migprofiles",
    "migtemplate": "migtemplate",
}


def decode_device_info_json(
    text: str, annotation: str, family: Family, *, devcore: int | None = None
) -> tuple[VendorDevice, ...]:
    """Go's `json.Unmarshal` of `[]*DeviceInfo` (HAMi's UnMarshalNodeDevices); `devcore` overrides each
    device's (Biren and Vastai force 100). A `null` element is refused (HAMi would dereference it)."""
    raw = go_json(text, annotation)
    if raw is None:
        return ()
    if not isinstance(raw, list) or isinstance(raw, _Pairs):
        raise DecodeError(f"{annotation}: expected a JSON array, got {_short(raw)}")
    devices = []
    for i, item in enumerate(raw):
        where = f"{annotation}[{i}]"
        if item is None:
            raise DecodeError(f"{where}: null device")
        fields = _go_fields(item, _DEVICE_INFO_FIELDS, where)
        _go_int(fields.get("numa"), INT64, where)
        _go_str(fields.get("mode"), where)
        _go_str(fields.get("devicevendor"), where)
        for name in ("migprofiles", "migtemplate"):
            found = fields.get(name)
            if found is not None and (not isinstance(found[1], list) or isinstance(found[1], _Pairs)):
                raise DecodeError(f"{where}.{found[0]}: expected an array, got {_short(found[1])}")
        custom = fields.get("custominfo")
        bdf = ""
        if custom is not None:
            if not isinstance(custom[1], _Pairs):
                raise DecodeError(f"{where}.{custom[0]}: expected an object, got {_short(custom[1])}")
            value = dict(custom[1]).get("pciBDF")
            bdf = value if isinstance(value, str) else ""
        devices.append(
            VendorDevice(
                family.word,
                family.vendor,
                _go_str(fields.get("id"), where),
                _go_int(fields.get("index"), UINT64, where),
                _go_int(fields.get("count"), INT32, where),
                _go_int(fields.get("devmem"), INT32, where),
                devcore if devcore is not None else _go_int(fields.get("devcore"), INT32, where),
                _go_str(fields.get("type"), where),
                _go_bool(fields.get("health"), where),
                bdf,
            )
        )
    return tuple(devices)


def decode_legacy_inventory(text: str, annotation: str, family: Family) -> tuple[VendorDevice, ...]:
    """HAMi's DecodeNodeDevices: `id,count,devmem,devcore,type,numa,health[,index,mode]:` per device."""
    if ":" not in text:
        raise DecodeError(f"{annotation}: {text[:60]!r} has no device separator ':'")
    devices = []
    for i, entry in enumerate(e for e in text.split(":") if e):
        where = f"{annotation} device {i}"
        if "," not in entry:
            raise DecodeError(f"{where}: {entry[:60]!r} is not 'id,count,devmem,devcore,type,numa,health'")
        items = entry.split(",")
        if len(items) not in (7, 9):
            raise DecodeError(f"{where}: {entry[:60]!r} has {len(items)} fields, expected 7 or 9")
        count = go_parse_int(items[1], INT32, f"{where} count")
        devmem = go_parse_int(items[2], INT32, f"{where} devmem")
        devcore = go_parse_int(items[3], INT32, f"{where} devcore")
        health = go_parse_bool(items[6], f"{where} health")
        go_parse_int(items[5], INT64, f"{where} numa")
        index = 0
        if len(items) == 9:
            index = go_parse_int(items[7], INT64, f"{where} index")
            if index < 0:
                raise DecodeError(f"{where} index: {index} is negative")
        devices.append(
            VendorDevice(
                family.word, family.vendor, items[0], index, count, devmem, devcore, items[4], health
            )
        )
    return tuple(devices)


_METAX_FIELDS = {
    "uuid": "uuid",
    "bdf": "bdf",
    "model": "model",
    "totaldevcount": "count",
    "totalcompute": "compute",
    "totalvram": "vram",
    "availabledevcount": "available_count",
    "availablecompute": "available_compute",
    "availablevram": "available_vram",
    "numa": "numa",
    "healthy": "healthy",
    "qospolicy": "qos",
    "linkzone": "link_zone",
}


def decode_metax_sgpu(text: str, annotation: str) -> tuple[VendorDevice, ...]:
    """MetaX's `[]*MetaxSDeviceInfo` and HAMi's convertMetaxSDeviceToHAMIDevice (index = position)."""
    family = FAMILIES["Metax-SGPU"]
    raw = go_json(text, annotation)
    if raw is None:
        return ()
    if not isinstance(raw, list) or isinstance(raw, _Pairs):
        raise DecodeError(f"{annotation}: expected a JSON array, got {_short(raw)}")
    devices = []
    for i, item in enumerate(raw):
        where = f"{annotation}[{i}]"
        if item is None:
            raise DecodeError(f"{where}: null device")
        fields = _go_fields(item, _METAX_FIELDS, where)
        for name in ("bdf", "model", "qos"):
            _go_str(fields.get(name), where)
        for name in ("available_count", "available_compute", "available_vram", "numa", "link_zone"):
            _go_int(fields.get(name), INT32, where)
        devices.append(
            VendorDevice(
                family.word,
                family.vendor,
                _go_str(fields.get("uuid"), where),
                i,
                _go_int(fields.get("count"), INT32, where),
                _go_int(fields.get("vram"), INT32, where),
                _go_int(fields.get("compute"), INT32, where),
                family.word,
                _go_bool(fields.get("healthy"), where),
            )
        )
    return tuple(devices)


def parse_profile(name: str) -> tuple[int, int]:
    """Enflame's parseProfile: `<size>g.<memory>gb` -> (size, memory GB); (0, 0) or (size, 0) where it
    does not parse."""
    parts = name.strip().lower().split(".")
    if len(parts) < 2:
        return 0, 0
    size_text = parts[0].strip().removesuffix("g")
    if not _GO_INT.fullmatch(size_text) or not INT64[0] <= int(size_text) <= INT64[1]:
        return 0, 0
    memory_text = parts[1].strip().removesuffix("gb")
    if not _GO_INT.fullmatch(memory_text) or not INT64[0] <= int(memory_text) <= INT64[1]:
        return int(size_text), 0
    return int(size_text), int(memory_text)


def _clamp32(value: int) -> int:
    return max(INT32[0], min(INT32[1], value))


def _drs_capacity(value: Any, where: str) -> int:
    """Enflame's parseDRSCapacity: a JSON number (truncated, within int32) or a numeric string (Atoi,
    clamped to int32)."""
    if isinstance(value, bool) or value is None or isinstance(value, list):
        raise DecodeError(f"{where}: {_short(value)} is not a capacity")
    if isinstance(value, int | float):
        if not INT32[0] <= value <= INT32[1]:
            raise DecodeError(f"{where}: {value} is out of range")
        return int(value)
    if isinstance(value, str):
        return _clamp32(go_parse_int(value.strip(), INT64, where))
    raise DecodeError(f"{where}: {_short(value)} is not a capacity")


_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)
"""What Go's strings.TrimSpace trims (unicode.IsSpace)."""


def decode_enflame_drs(text: str, annotation: str, node: str) -> tuple[VendorDevice, ...]:
    """Enflame's DRS capacity JSON as HAMi's EnflameDevices.GetNodeDevices reads it."""
    family = FAMILIES["Enflame"]
    raw = go_json(text, annotation)
    top = _go_fields(raw, {"devices": "devices", "profiles": "profiles"}, annotation)
    profiles: dict[str, str] = {}
    if "profiles" in top:
        key, value = top["profiles"]
        if not isinstance(value, _Pairs):
            raise DecodeError(f"{annotation}.{key}: expected an object, got {_short(value)}")
        for name, profile_id in value:
            if profile_id is not None and not isinstance(profile_id, str):
                raise DecodeError(f"{annotation}.{key}[{name}]: expected a string, got {_short(profile_id)}")
            profiles[name] = profile_id or ""
    sizes = [parse_profile(name) for name in profiles]
    max_slice = max([0, *(s for s, _ in sizes)])
    max_memory = max([0, *(m for _, m in sizes)])
    if max_slice <= 0:
        raise DecodeError(f"{annotation}: no valid DRS profile in {sorted(profiles)[:4]}")
    if max_memory <= 0:
        max_memory = max_slice
    candidates = sorted(
        {
            Profile(size, memory, math.ceil(size * 100 / max_slice))
            for size, memory in sizes
            if size > 0 and memory > 0
        },
        key=lambda p: (p.size, p.memory_gb),
    )
    entries: list[Any] = []
    if "devices" in top:
        key, value = top["devices"]
        if not isinstance(value, list) or isinstance(value, _Pairs):
            raise DecodeError(f"{annotation}.{key}: expected an array, got {_short(value)}")
        entries = value
    devices = []
    for i, item in enumerate(entries):
        where = f"{annotation}.devices[{i}]"
        if item is None:
            fields: dict[str, Any] = {}
        else:
            fields = _go_fields(item, {"index": "index", "minor": "minor", "capacity": "capacity"}, where)
        index_text = _go_str(fields.get("index"), where)
        minor = _go_str(fields.get("minor"), where).strip(_GO_SPACE)
        index = i
        if _GO_INT.fullmatch(index_text) and INT64[0] <= int(index_text) <= INT64[1]:
            index = int(index_text)
        raw_capacity = fields["capacity"][1] if "capacity" in fields else None
        capacity = _drs_capacity(raw_capacity, f"{where}.capacity")
        if capacity <= 0:
            raise DecodeError(f"{where}.capacity: {capacity} is not positive")
        devices.append(
            VendorDevice(
                family.word,
                family.vendor,
                f"{node}-enflame-drs-{index}",
                index,
                capacity,
                _int32(max_memory * 1024),
                100,
                family.word,
                True,
                profiles=tuple(candidates),
                minor=minor or str(index),
            )
        )
    return tuple(devices)


def _int32(value: int) -> int:
    """Go's int32(x) of an int64: wraps."""
    value &= (1 << 32) - 1
    return value - (1 << 32) if value >= 1 << 31 else value


# --- capacity-based inventories -----------------------------------------------------------------------------


def _capacity(capacity: Mapping[str, Any], name: str, where: str) -> int | None:
    if name not in capacity:
        return None
    return go_as_int64(capacity[name], f"{where}.status.capacity[{name}]")


def _go_div(a: int, b: int) -> int:
    """Go's integer division (truncates toward zero)."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


_SYNTHESISED = {
    "MLU": "cambricon-mlu",
    "Metax-GPU": "metax",
    "Mthreads": "mthreads",
    "GCU": "GCU",
    "kunlun": "kunlun",
    "AWSNeuron": "AWSNeuron",
}
"""The infix of the id HAMi gives device `i` of a capacity-read family: `<node>-<infix>-<i>`."""


def capacity_devices(node: str, capacity: Mapping[str, Any]) -> list[VendorDevice]:
    """The devices HAMi synthesises from the Node's capacity (Cambricon, MetaX GPU, Mthreads, Enflame GCU,
    Kunlun XPU, AWS Neuron). Raises DecodeError for a capacity that is no quantity."""
    where = f"node/{node}"
    out: list[VendorDevice] = []

    def add(word: str, i: int, count: int, devmem: int, devcore: int, **more: Any) -> None:
        family = FAMILIES[word]
        infix = _SYNTHESISED[word]
        out.append(
            VendorDevice(word, family.vendor, f"{node}-{infix}-{i}", i, count, devmem, devcore, word, **more)
        )

    cards = _capacity(capacity, "cambricon.com/mlu.smlu.vcore", where)
    if cards:
        memory = _capacity(capacity, "cambricon.com/mlu.smlu.vmemory", where) or 0
        for i in range(-(-cards // 100) if cards > 0 else 0):
            add("MLU", i, 100, _int32(_go_div(memory * 256 * 100, cards)), 100)
    count = _capacity(capacity, "metax-tech.com/gpu", where)
    for i in range(max(count or 0, 0)):
        add("Metax-GPU", i, 1, 65536, 100)
    cores = _capacity(capacity, "mthreads.com/sgpu-core", where)
    if cores:
        memory = _capacity(capacity, "mthreads.com/sgpu-memory", where) or 0
        for i in range(-(-cores // 16) if cores > 0 else 0):
            add("Mthreads", i, 100, _int32(_go_div(memory * 512 * 16, cores)), 16)
    count = _capacity(capacity, "enflame.com/gcu", where)
    for i in range(max(count or 0, 0)):
        add("GCU", i, 1, 100, 100)
    count = _capacity(capacity, "kunlunxin.com/xpu", where)
    for i in range(max(count or 0, 0)):
        add("kunlun", i, 100, 98304, 100)
    count = _capacity(capacity, "aws.amazon.com/neuron", where)
    if count:
        total = _capacity(capacity, "aws.amazon.com/neuroncore", where) or 0
        per = _go_div(total, count) if count > 0 else 0
        per = max(per, 0)
        mask = (1 << min(per, 64)) - 1
        for i in range(max(count, 0)):
            add("AWSNeuron", i, _int32(per), 0, _int32(mask), cores_per=per)
    return out


# --- a node's devices ---------------------------------------------------------------------------------------


_ASCEND_REGISTER = re.compile(rf"hami\.io/node-register-({ASCEND_PREFIX}.*)")


_Reader = Callable[[str, str], tuple[VendorDevice, ...]]
"""Decodes an inventory annotation's (text, name)."""


def _inventory_readers(node: str) -> list[tuple[Callable[[str], bool], _Reader]]:
    """(matches the annotation's name, decodes it) for every vendor inventory annotation."""

    def exact(name: str) -> Callable[[str], bool]:
        return lambda key: key == name

    def legacy(word: str) -> _Reader:
        family = FAMILIES.get(word) or iluvatar_family(word)
        return lambda text, key: decode_legacy_inventory(text, key, family)

    def device_info(family: Family, devcore: int | None = None) -> _Reader:
        return lambda text, key: decode_device_info_json(text, key, family, devcore=devcore)

    readers: list[tuple[Callable[[str], bool], _Reader]] = [
        (exact("hami.io/node-dcu-register"), legacy("DCU")),
        *((exact(f"hami.io/node-{chip}-register"), legacy(chip)) for chip in ILUVATAR_CHIPS),
        (exact("hami.io/node-amd-register"), device_info(FAMILIES["AMD"])),
        (exact("hami.io/node-biren-register"), device_info(FAMILIES["Biren"], 100)),
        (exact("hami.io/node-va-register"), device_info(FAMILIES["Vastai"], 100)),
        (exact("hami.io/node-register-xpu"), device_info(FAMILIES["XPU"])),
        (exact("metax-tech.com/node-gpu-devices"), decode_metax_sgpu),
        (exact("enflame.com/gcu-drs-capacity"), lambda text, key: decode_enflame_drs(text, key, node)),
    ]
    readers.append(
        (
            lambda key: _ASCEND_REGISTER.fullmatch(key) is not None,
            lambda text, key: decode_device_info_json(
                text, key, ascend_family(key.removeprefix("hami.io/node-register-"))
            ),
        )
    )
    return readers


@dataclass(frozen=True)
class NodeInventory:
    """A node's devices of other vendors, and what could not be read (source -> why)."""

    node: str
    devices: tuple[VendorDevice, ...]
    errors: Mapping[str, str]


def node_devices(node_obj: Mapping[str, Any]) -> NodeInventory:
    """Every vendor device of a Node (JSON as the API server sends it), from each inventory annotation
    and from its capacity. A source that does not decode is named in `errors` and contributes nothing
    (HAMi skips it)."""
    meta = node_obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = str(meta.get("name") or "")
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    status = node_obj.get("status")
    capacity = status.get("capacity") if isinstance(status, Mapping) else None
    capacity = capacity if isinstance(capacity, Mapping) else {}
    devices: list[VendorDevice] = []
    errors: dict[str, str] = {}
    readers = _inventory_readers(name)
    for key in sorted(k for k in annotations if isinstance(k, str)):
        reader = next((decode for matches, decode in readers if matches(key)), None)
        if reader is None:
            continue
        text = annotations[key]
        try:
            if not isinstance(text, str):
                raise DecodeError(f"{key}: expected a string, got {_short(text)}")
            devices.extend(reader(text, key))
        except DecodeError as exc:
            errors[key] = str(exc)
    try:
        devices.extend(capacity_devices(name, capacity))
    except DecodeError as exc:
        errors["status.capacity"] = str(exc)
    return NodeInventory(name, tuple(devices), errors)


# --- pod annotations ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VendorSlice:
    """One container's share of one device, as HAMi's pod annotation writes it."""

    id: str
    type: str
    mem: int
    cores: int


VendorAllocation = tuple[tuple[VendorSlice, ...], ...]
"""Per container (init containers first), its slices."""


def decode_vendor_allocation(text: str, annotation: str) -> VendorAllocation:
    """HAMi's pod device string: `<id>,<type>,<MiB>,<cores>:` per device, `;` after each container.
    Stricter than HAMi's DecodePodDevices (which skips what has no comma): exactly the four fields HAMi
    writes, non-negative int32 numbers, every container closed by `;`."""
    if not text:
        return ()
    if not text.endswith(";"):
        raise DecodeError(f"{annotation}: {text[-60:]!r} does not end with ';'")
    containers: list[tuple[VendorSlice, ...]] = []
    for c, piece in enumerate(text[:-1].split(";")):
        where = f"{annotation} container {c}"
        if not piece:
            containers.append(())
            continue
        if not piece.endswith(":"):
            raise DecodeError(f"{where}: {piece[-60:]!r} does not end with ':'")
        slices = []
        for i, entry in enumerate(piece[:-1].split(":")):
            fields = entry.split(",")
            at = f"{where} device {i}"
            if len(fields) != 4 or not fields[0]:
                raise DecodeError(f"{at}: {entry[:80]!r} is not '<id>,<type>,<MiB>,<cores>'")
            mem = go_parse_int(fields[2], INT32, f"{at} memory")
            cores = go_parse_int(fields[3], INT32, f"{at} cores")
            if mem < 0 or cores < 0:
                raise DecodeError(f"{at}: {entry[:80]!r}: memory and cores must not be negative")
            slices.append(VendorSlice(fields[0], fields[1], mem, cores))
        containers.append(tuple(slices))
    return tuple(containers)


def encode_vendor_allocation(allocation: Iterable[Sequence[VendorSlice]]) -> str:
    """HAMi's EncodePodSingleDevice (what the checker's tests decode back)."""
    return "".join(
        "".join(f"{s.id},{s.type},{s.mem},{s.cores}:" for s in slices) + ";" for slices in allocation
    )


def pod_vendor_allocations(annotations: Mapping[str, Any]) -> dict[str, tuple[Family, str]]:
    """The pod's "-allocated" annotations of other vendors: family word -> (family, text)."""
    out: dict[str, tuple[Family, str]] = {}
    for key, value in annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        family = family_of_allocated(key)
        if family is not None:
            out[family.word] = (family, value)
    return out


def allocated_without_bind_phase(annotations: Mapping[str, Any]) -> bool:
    """Whether a pod left `hami.io/bind-phase: allocating` is allocated all the same: its only vendor is
    Cambricon, whose dynamic-smlu plugin writes no bind phase (HAMi lets its dsmlu lock expire), and the
    plugin has made its instance (`CAMBRICON_DSMLU_ASSIGNED: "true"`)."""
    if annotations.get(DSMLU_ASSIGNED) != "true":
        return False
    others = set(pod_vendor_allocations(annotations)) - {"MLU"}
    return not others and not annotations.get("hami.io/vgpu-devices-allocated")


# --- kubelet device IDs and Allocate answers ----------------------------------------------------------------


_SUFFIX_ID = re.compile(r"(.+)-([0-9]+)")
_FAKE = re.compile(r"(.+)-fake-([0-9]+)")
_BDF = re.compile(r"(.+)#([0-9]+)")


def device_of_kubelet_id(family: Family, device_id: str, devices: Sequence[VendorDevice]) -> str | None:
    """The inventory device (its id) a kubelet device ID of the stand-in names, by the family's scheme;
    None when the ID names none of `devices` (or the family's IDs name no device: see `id_scheme`)."""
    pattern = {"fake": _FAKE, "suffix": _SUFFIX_ID, "bdf": _BDF}.get(family.id_scheme)
    if pattern is None:
        return None
    match = pattern.fullmatch(device_id)
    if match is None:
        return None
    base = match.group(1)
    for device in devices:
        if (device.bdf if family.id_scheme == "bdf" else device.id) == base:
            return device.id
    return None


def runtime_devices(
    family: Family, env: Mapping[str, str], device_nodes: Sequence[str], devices: Sequence[VendorDevice]
) -> list[str] | None:
    """The devices (ids) a started container's Allocate answer names, by the family's env key or device
    nodes (indexes, or Biren's ids), mapped through the node's inventory (an index no device has keeps
    a `?index` placeholder); None when the answer names none this way."""
    by_index = {d.index: d.id for d in devices if d.vendor == family.vendor}
    if family.word == "AWSNeuron":
        return _neuron_runtime(env, devices)
    if family.word == "Enflame" and family.visible_env in env:
        # gcushare-device-plugin (EnflameTechnology/gcushare pkg/server/server.go makeContainerResponse)
        # answers the pod's `enflame.com/gcu-assigned-minor`: a minor number, not an index.
        by_minor = {d.minor: d.id for d in devices if d.family == "Enflame" and d.minor}
        listed = [v.strip() for v in env[family.visible_env].split(",") if v.strip()]
        return [by_minor.get(v, f"?{v}") for v in listed]
    if family.visible_env and family.visible_env in env:
        listed = [v.strip() for v in env[family.visible_env].split(",") if v.strip()]
        if family.word == "Biren":
            return listed
        return [_by_index(by_index, v) for v in listed]
    if family.device_node:
        pattern = re.compile(family.device_node)
        found = [m.group(1) for p in device_nodes if (m := pattern.fullmatch(p)) is not None]
        return [_by_index(by_index, v) for v in dict.fromkeys(found)] if found else None
    return None


def _by_index(by_index: Mapping[int, str], text: str) -> str:
    if text.isdigit() and int(text) in by_index:
        return by_index[int(text)]
    return f"?{text}"


def _neuron_runtime(env: Mapping[str, str], devices: Sequence[VendorDevice]) -> list[str] | None:
    """AWS Neuron: `AWS_NEURON_VISIBLE_DEVICES` (device indexes) or `NEURON_RT_VISIBLE_CORES` (core
    indexes: device = core / cores per device)."""
    neuron = [d for d in devices if d.family == "AWSNeuron"]
    by_index = {d.index: d.id for d in neuron}
    if "AWS_NEURON_VISIBLE_DEVICES" in env:
        listed = [v.strip() for v in env["AWS_NEURON_VISIBLE_DEVICES"].split(",") if v.strip()]
        return [_by_index(by_index, v) for v in listed]
    if "NEURON_RT_VISIBLE_CORES" in env:
        per = max((d.cores_per for d in neuron), default=0)
        out: list[str] = []
        for v in (v.strip() for v in env["NEURON_RT_VISIBLE_CORES"].split(",")):
            if not v:
                continue
            name = _by_index(by_index, str(int(v) // per)) if v.isdigit() and per > 0 else f"?{v}"
            if name not in out:
                out.append(name)
        return out
    return None


def neuron_core_mask(env: Mapping[str, str], device: VendorDevice) -> int | None:
    """AWS Neuron: the mask of `device`'s cores a container's `NEURON_RT_VISIBLE_CORES` names (None when
    it names cores by device)."""
    text = env.get("NEURON_RT_VISIBLE_CORES")
    if text is None or device.cores_per <= 0:
        return None
    mask = 0
    for v in (v.strip() for v in text.split(",")):
        if v.isdigit() and int(v) // device.cores_per == device.index:
            mask |= 1 << (int(v) % device.cores_per)
    return mask


AMD_CU_ALLOCATED = "hami.io/amd-cu-allocated"
"""amd-device-plugin's record on a pod of the compute units its containers hold: `{"<device id>": "<CU
list>"}` (docs/vendor-nodes.md)."""
_CU_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def decode_cu_list(text: str, where: str) -> frozenset[int]:
    """amd-device-plugin's CU list (`0-3,8,10-12`) as the set of compute units."""
    units: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        match = _CU_RANGE.fullmatch(part)
        if match is None:
            raise DecodeError(f"{where}: {part[:30]!r} is not a compute unit or a range of them")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low or high - low > 1 << 16:
            raise DecodeError(f"{where}: {part[:30]!r} is not a range of compute units")
        units.update(range(low, high + 1))
    return frozenset(units)


def decode_amd_cu_allocated(text: str) -> dict[str, frozenset[int]]:
    """`hami.io/amd-cu-allocated`: device id -> its compute units."""
    raw = _plain(go_json(text, AMD_CU_ALLOCATED))
    if not isinstance(raw, dict):
        raise DecodeError(f"{AMD_CU_ALLOCATED}: expected a JSON object, got {_short(raw)}")
    out = {}
    for device, units in raw.items():
        if not isinstance(units, str):
            raise DecodeError(f"{AMD_CU_ALLOCATED}[{device}]: expected a CU list, got {_short(units)}")
        out[str(device)] = decode_cu_list(units, f"{AMD_CU_ALLOCATED}[{device}]")
    return out


def decode_hsa_cu_mask(text: str) -> dict[int, frozenset[int]]:
    """`HSA_CU_MASK` (`<i>:<CU list>` per device, `;`-separated): the container's i-th device -> its
    compute units."""
    out: dict[int, frozenset[int]] = {}
    for part in (p for p in text.split(";") if p.strip()):
        index, sep, units = part.partition(":")
        if not sep or not index.strip().isdigit():
            raise DecodeError(f"HSA_CU_MASK: {part[:40]!r} is not '<device index>:<CU list>'")
        out[int(index)] = decode_cu_list(units, "HSA_CU_MASK")
    return out


def enflame_slices(device: VendorDevice, piece: VendorSlice) -> int:
    """The DRS slices an Enflame share takes: the profile whose memory and cores it holds; 1 when none
    matches (HAMi's default for an unknown drsSlice)."""
    for profile in device.profiles:
        if profile.memory_gb * 1024 == piece.mem and profile.core_percent == piece.cores:
            return max(profile.size, 1)
    return 1
