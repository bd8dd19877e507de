"""A vendor node's fake devices and what its plugin publishes about them, pure: the devices
(`node_devices`, deterministic ids from the node name), the Node annotations and labels the plugin
writes (`node_metadata`: the inventory HAMi's scheduler side reads, in the vendor's form, and the
handshake's `Reported` value), and the devices ListAndWatch advertises per resource (`advertised`).

Ids follow each plugin: Hygon's `DCU-<serial>` with `<id>-fake-<i>` virtual devices (dcu-vgpu-device-
plugin register.go/server.go generateFakeDevs), Ascend's die id with `<id>-<i>` (ascend-device-plugin
server.go apiDevices), Cambricon's `real-mlu-counts-<uuid>`, `<uuid>-vcore-<i>`, `<uuid>-vmemory-<i>`
(cambricon.go GetDevices/generateFakeDevs), AMD's `<bdf>#<i>` (amd-device-plugin plugin.go
ListAndWatch). Where HAMi reads the node's capacity instead of an inventory, the device's `uuid` is the id
HAMi's scheduler side synthesises (`<node>-cambricon-mlu-<i>`, `<node>-metax-<i>`, `<node>-mthreads-<i>`,
`<node>-GCU-<i>`, `<node>-enflame-drs-<i>`, `<node>-kunlun-<i>`, `<node>-AWSNeuron-<i>`), which is what the
pod annotations then name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hami_sim.vendors.table import DeviceSpec, Handshake, Register, Units

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The label AWS Neuron's inventory reads (the cloud provider sets it; the stand-in does here)."""
ASCEND_VNPU_CORE = "hami-vnpu-core"
"""ascend-device-plugin server.go VNPUNodeSelectorAnnotation: whether the node runs hami-vnpu-core."""
HYGON_MODE = "hami"
"""dcu-vgpu-device-plugin util.go `mode`, the 9th field of its legacy inventory."""


@dataclass(frozen=True)
class Device:
    """One fake physical device: `uuid` is the id HAMi's scheduler knows it by (what pod annotations
    name), `plugin_id` the plugin's own id of it (the base of its ListAndWatch ids), `index` its
    physical index (Ascend's PhyID, a DCU's dri card, ...)."""

    uuid: str
    index: int
    plugin_id: str
    memory_mib: int
    cores: int
    bdf: str = ""
    rocr_uuid: str = ""


def _hex(node: str, what: str, index: int, length: int) -> str:
    return hashlib.sha256(f"{node}/{what}/{index}".encode()).hexdigest()[:length]


def _uuid(node: str, what: str, index: int) -> str:
    h = _hex(node, what, index, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_SYNTHESISED = {
    "cambricon": "cambricon-mlu",
    "metax/gpu": "metax",
    "mthreads": "mthreads",
    "enflame/gcu": "GCU",
    "enflame/drs": "enflame-drs",
    "kunlun/xpu": "kunlun",
    "awsneuron": "AWSNeuron",
}
"""Vendors HAMi reads from the node's capacity or an index-keyed inventory: the infix of the id its
scheduler side gives device `i` (`<node>-<infix>-<i>`)."""


def node_devices(node: str, spec: DeviceSpec) -> tuple[Device, ...]:
    """The node's devices of `spec`, ids derived from the node name (the same on every start)."""
    key = spec.table.key
    out = []
    for i in range(spec.count):
        plugin_id = _plugin_id(node, spec, i)
        infix = _SYNTHESISED.get(key)
        uuid = f"{node}-{infix}-{i}" if infix else plugin_id
        bdf = f"0000:{0x17 + i:02x}:00.0"
        rocr = f"GPU-{_hex(node, 'rocr', i, 16)}" if spec.vendor == "amd" else ""
        out.append(Device(uuid, i, plugin_id, spec.memory_mib, spec.cores, bdf, rocr))
    return tuple(out)


def _plugin_id(node: str, spec: DeviceSpec, i: int) -> str:
    vendor = spec.vendor
    if vendor == "hygon":
        return f"DCU-{int(_hex(node, 'serial', i, 12), 16) % 10**12:012d}"
    if vendor == "ascend":
        return _hex(node, "die", i, 40).upper()
    if vendor == "cambricon":
        return f"MLU-{_uuid(node, 'mlu', i)}"
    if vendor == "amd":
        return _hex(node, "amdsmi", i, 32)
    prefix = {"metax": "GPU", "iluvatar": "GPU", "kunlun": "XPU", "mthreads": "MT", "enflame": "GCU"}
    return f"{prefix.get(vendor, vendor.upper())}-{_uuid(node, vendor, i)}"


# --- ListAndWatch ------------------------------------------------------------------------------------


def units(spec: DeviceSpec, kind: Units, device: Device) -> int:
    """How many devices of a resource of `kind` one physical device gives."""
    if kind is Units.SPLIT:
        return spec.split
    if kind is Units.WHOLE:
        return 1
    if kind is Units.PERCENT:
        return 100
    if kind is Units.CORES:
        return device.cores
    if kind is Units.MEMORY_256:
        return device.memory_mib // 256
    return device.memory_mib // 512


def _advertised_id(spec: DeviceSpec, resource: str, kind: Units, device: Device, j: int) -> str:
    base = device.plugin_id
    if spec.vendor == "hygon":
        return f"{base}-fake-{j}"
    if spec.vendor == "cambricon":
        if kind is Units.WHOLE:
            return f"real-mlu-counts-{base}"
        return f"{base}-{resource.rsplit('.', 1)[-1]}-{j + 1}"
    if spec.vendor == "amd":
        return f"{device.bdf}#{j}"
    if kind is Units.WHOLE:
        return base
    if kind is Units.SPLIT:
        return f"{base}-{j}"
    suffix = {Units.CORES: "core", Units.PERCENT: "vcore"}.get(kind, "mem")
    return f"{base}-{suffix}-{j}"


def advertised(spec: DeviceSpec, devices: tuple[Device, ...]) -> dict[str, tuple[str, ...]]:
    """Resource -> the device ids ListAndWatch sends for it (all healthy), in the table's order."""
    out: dict[str, tuple[str, ...]] = {}
    for resource in spec.table.resources:
        name = spec.name(resource.name)
        out[name] = tuple(
            _advertised_id(spec, name, resource.units, d, j)
            for d in devices
            for j in range(units(spec, resource.units, d))
        )
    return out


# --- the Node ----------------------------------------------------------------------------------------


def go_time_string(now: datetime) -> str:
    """Go's `time.Now().String()` (`2006-01-02 15:04:05.999999999 -0700 MST`) of an aware `now`, without
    the monotonic clock reading."""
    fraction = f"{now.microsecond:06d}".rstrip("0")
    offset = now.strftime("%z") or "+0000"
    zone = now.tzname() or "UTC"
    return now.strftime("%Y-%m-%d %H:%M:%S") + (f".{fraction}" if fraction else "") + f" {offset} {zone}"


def handshake_value(form: Handshake, now: datetime) -> str:
    """The plugin's `Reported` handshake value at `now` (aware)."""
    if form is Handshake.ASCEND:
        return "Reported_" + (now + timedelta(seconds=1)).strftime("%Y.%m.%d %H:%M:%S")
    if form is Handshake.DOTTED:
        return "Reported_" + now.strftime("%Y.%m.%d %H:%M:%S")
    return "Reported " + go_time_string(now)


def go_device_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """HAMi's DeviceInfo as Go's json.Marshal writes it: its fields in declaration order, zero values
    left out (`omitempty`); `custominfo` keys sorted (Go sorts map keys)."""
    order = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "devicevendor")
    out = {k: info[k] for k in order if info.get(k)}
    custom = info.get("custominfo")
    if custom:
        out["custominfo"] = {k: custom[k] for k in sorted(custom)}
    return out


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def inventory_text(spec: DeviceSpec, devices: tuple[Device, ...]) -> str:
    """The inventory annotation's value in the vendor's form ("" for a vendor with none)."""
    form = spec.table.register_form
    vendor = spec.vendor
    if form is Register.LEGACY:
        kind = f"DCU-{spec.model}" if vendor == "hygon" else spec.common_word
        mode = HYGON_MODE if vendor == "hygon" else ""
        cores = 100 if vendor == "hygon" else spec.cores
        return "".join(
            f"{d.uuid},{spec.split},{d.memory_mib},{cores},{kind},0,true,{d.index},{mode}:" for d in devices
        )
    if form is Register.JSON:
        return _json([go_device_info(_json_device(spec, d)) for d in devices])
    if form is Register.METAX_SGPU:
        return _json(
            [
                {
                    "uuid": d.uuid,
                    "bdf": d.bdf,
                    "model": spec.model,
                    "totalDevCount": spec.split,
                    "totalCompute": d.cores,
                    "totalVRam": d.memory_mib,
                    "availableDevCount": spec.split,
                    "availableCompute": d.cores,
                    "availableVRam": d.memory_mib,
                    "numa": 0,
                    "healthy": True,
                    "qosPolicy": "",
                    "linkZone": 0,
                }
                for d in devices
            ]
        )
    if form is Register.ENFLAME_DRS:
        profiles = dict(spec.product.extra.get("profiles") or {})
        entries = [{"index": str(d.index), "minor": str(d.index), "capacity": spec.split} for d in devices]
        return _json({"devices": entries, "profiles": profiles})
    return ""


def _json_device(spec: DeviceSpec, d: Device) -> dict[str, Any]:
    vendor = spec.vendor
    info: dict[str, Any] = {
        "id": d.uuid,
        "index": d.index,
        "count": spec.split,
        "devmem": d.memory_mib,
        "devcore": d.cores,
        "type": spec.model,
        "numa": 0,
        "health": True,
    }
    if vendor == "ascend":
        info["type"] = spec.common_word
        if spec.common_word.startswith("Ascend910"):
            # register.go getDeviceNetworkID: 910C dies all share HCCS; else 0 for devices 0-3, 1 above.
            info["custominfo"] = {"NetworkID": 0 if spec.common_word == "Ascend910C" or d.index <= 3 else 1}
    elif vendor in ("kunlun", "vastai", "biren"):
        # HAMi's scheduler matches devices whose Type contains the request's (the common word):
        # biren-device-plugin register.go writes DeviceType "Biren".
        info["type"] = spec.common_word
    elif vendor == "amd":
        info["devicevendor"] = "amd"
        info["custominfo"] = {"pciBDF": d.bdf}
    return info


def node_metadata(
    spec: DeviceSpec, devices: tuple[Device, ...], now: datetime
) -> tuple[dict[str, str], dict[str, str]]:
    """(annotations, labels) the plugin writes on its Node at `now` (aware)."""
    table = spec.table
    annotations: dict[str, str] = {}
    if table.register:
        annotations[spec.name(table.register)] = inventory_text(spec, devices)
    if table.handshake:
        annotations[spec.name(table.handshake)] = handshake_value(table.handshake_form, now)
    if spec.vendor == "ascend":
        annotations[ASCEND_VNPU_CORE] = "false"
    labels = {INSTANCE_TYPE_LABEL: spec.model} if spec.vendor == "awsneuron" else {}
    return annotations, labels


__all__ = [
    "ASCEND_VNPU_CORE",
    "INSTANCE_TYPE_LABEL",
    "Device",
    "advertised",
    "go_device_info",
    "go_time_string",
    "handshake_value",
    "inventory_text",
    "node_devices",
    "node_metadata",
    "units",
]
