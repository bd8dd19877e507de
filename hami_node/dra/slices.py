"""Pure: this node's GPUs as a ResourceSlice (`resource.k8s.io/v1`), and the comparisons the publisher
(`publisher.SlicePublisher`) makes against what the API server stores.

One pool per node, named after the node, in one slice (several when a GPU is in MIG mode: its partitions
in NVIDIA's split layout, `node_slice_specs` and the MIG section below): `generateName:
<node>-<driver>-`, an owner reference to the Node (controller: true, so the slices go with the Node),
`spec.nodeName`, the pool's `generation` bumped on every change (consumers use only the highest
generation) and `resourceSliceCount: 1` (the helper's convention, k8s.io/dynamic-resource-allocation
resourceslice/resourceslicecontroller.go; there the generation is bumped only when more than one
write is needed, here on every write, as the issue asks).

Devices, in the order the daemon prefers, which is the GPUs' NVML index order (PCI bus order): the
scheduler's allocator is first-fit in slice order (structured/internal/experimental
allocator_experimental.go), so earlier GPUs fill first. One device per GPU, named
`hami_api.dra.device_name(minor)` (HAMi-DRA's `hami-gpu-<minor>`), with

- attributes `type` (hami-gpu), `uuid`, `minor`, `index`, `productName` (NVML's name, as NVIDIA's and
  HAMi's DRA drivers publish it), `driverVersion` (a strict semver: NVML's "535.104.05" is published as
  535.104.5), `pcieBusID` and `numaNode` where known;
- capacities `memory` in bytes (the advertised MiB, so 1 Mi aligned: `aligned_memory`) and `cores`
  (100), each with HAMi-DRA's request policy: default the whole (a claim that names no capacity takes
  the GPU), memory 1Mi..whole in 1Mi steps, cores 0..100 in steps of 1; and
  `allowMultipleAllocations: true` (KEP-5075 consumable capacity).

Without consumable capacity (the API server dropped `allowMultipleAllocations`: gate
`DRAConsumableCapacity` off, `consumable_dropped`) the same devices are published without the policy
and without the flag: each GPU then goes to one claim whole.

An unhealthy GPU carries the taint `<driver>/unhealthy=<reason>` (`taint_value`: `xid-79`, `gpu-lost`,
`nvml-failing`, ...) with the configured effect and the time it was first seen; recovery removes it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api import dra
from hami_api.errors import QuantityError
from hami_api.mig import GIProfile, Placement
from hami_api.quantity import canonical_quantity, parse_quantity
from hami_node.config import NodeConfig
from hami_node.devices import REPORTED_UNHEALTHY, GPUStatus, advertised_memory_mib
from hami_node.health import DEVICE_LOST_REASON, MONITORING_FAILED_REASON

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
TAINT_NAME = "unhealthy"
MEMORY_STEP = dra.MIB
MAX_DEVICES_WITH_TAINTS = 64
"""A slice holds at most 128 devices, 64 when any has taints (resource/v1 ResourceSliceSpec)."""

_XID = re.compile(r"Xid (\d+)")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

JSON = dict[str, Any]


# --- values ----------------------------------------------------------------------------------------------


def aligned_memory(total_bytes: int, step: int = MEMORY_STEP) -> int:
    """Memory in bytes rounded down to a multiple of `step` (1 Mi): the capacity's value must be
    step-aligned for its request policy to be valid (min + k*step = max)."""
    if total_bytes < 0 or step <= 0:
        raise ValueError(f"need total_bytes >= 0 and step > 0, got {total_bytes}, {step}")
    return total_bytes - total_bytes % step


def driver_semver(text: str | None) -> str | None:
    """NVML's driver version as the strict semver a `version` attribute must be: three numeric parts
    without leading zeros ("535.104.05" -> "535.104.5", "550.54" -> "550.54.0"); None for anything
    else (the attribute is then left out)."""
    if not text:
        return None
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def taint_key(driver: str) -> str:
    return f"{driver}/{TAINT_NAME}"


def taint_value(gpu: GPUStatus) -> str | None:
    """Why a GPU is unhealthy, as a taint value (a label value): `xid-<n>`, `gpu-lost`,
    `monitoring-failed`, `reported-unhealthy`, `nvml-failing` or `unhealthy`; None when healthy."""
    if gpu.healthy:
        return None
    if gpu.fenced is not None:
        return "nvml-failing"
    fault = gpu.fault or ""
    match = _XID.fullmatch(fault)
    if match is not None:
        return f"xid-{match.group(1)}"
    known = {
        DEVICE_LOST_REASON: "gpu-lost",
        MONITORING_FAILED_REASON: "monitoring-failed",
        REPORTED_UNHEALTHY: "reported-unhealthy",
    }
    return known.get(fault, "unhealthy")


def _memory_quantity(total_bytes: int) -> str:
    """Bytes as the API server writes them, in binary units when whole MiB ("80Gi")."""
    if total_bytes % dra.MIB == 0:
        return canonical_quantity(f"{total_bytes // dra.MIB}Mi")
    return canonical_quantity(total_bytes)


# --- devices -----------------------------------------------------------------------------------------------


def device_attributes(gpu: GPUStatus) -> JSON:
    info = gpu.info
    attributes: JSON = {
        dra.ATTR_TYPE: {"string": dra.DEVICE_TYPE},
        dra.ATTR_UUID: {"string": info.uuid},
        dra.ATTR_MINOR: {"int": info.minor},
        dra.ATTR_INDEX: {"int": info.index},
        dra.ATTR_PRODUCT_NAME: {"string": info.model[:64]},
    }
    version = driver_semver(info.driver_version)
    if version is not None:
        attributes[dra.ATTR_DRIVER_VERSION] = {"version": version}
    if info.pci_bus_id:
        attributes[dra.ATTR_PCI_BUS_ID] = {"string": info.pci_bus_id[:64]}
    if info.numa_node is not None and info.numa_node >= 0:
        attributes[dra.ATTR_NUMA_NODE] = {"int": info.numa_node}
    return attributes


def device_capacity(memory_bytes: int, *, consumable: bool) -> JSON:
    """`memory` (bytes) and `cores` (100), with HAMi-DRA's request policies when `consumable`. A GPU too
    small for a valid memory range (below 2 Mi: min + step must not exceed the value) gets none."""
    memory: JSON = {"value": _memory_quantity(memory_bytes)}
    cores: JSON = {"value": "100"}
    if consumable:
        if memory_bytes >= 2 * MEMORY_STEP:
            memory["requestPolicy"] = {
                "default": _memory_quantity(memory_bytes),
                "validRange": {"min": "1Mi", "max": _memory_quantity(memory_bytes), "step": "1Mi"},
            }
        cores["requestPolicy"] = {"default": "100", "validRange": {"min": "0", "max": "100", "step": "1"}}
    return {dra.CAPACITY_MEMORY: memory, dra.CAPACITY_CORES: cores}


def slice_device(
    gpu: GPUStatus,
    config: NodeConfig,
    *,
    consumable: bool,
    taint_since: str = "",
) -> JSON:
    """One GPU as a slice device. `taint_since` is the RFC 3339 time an unhealthy GPU's taint was first
    seen ("" leaves timeAdded to the API server)."""
    memory = aligned_memory(advertised_memory_mib(gpu.info, config) * dra.MIB)
    device: JSON = {
        "name": dra.device_name(gpu.info.minor),
        "attributes": device_attributes(gpu),
        "capacity": device_capacity(memory, consumable=consumable),
    }
    if consumable:
        device["allowMultipleAllocations"] = True
    value = taint_value(gpu)
    if value is not None:
        taint: JSON = {
            "key": taint_key(config.dra_driver_name),
            "value": value,
            "effect": config.dra_taint_effect.value,
        }
        if taint_since:
            taint["timeAdded"] = taint_since
        device["taints"] = [taint]
    return device


def slice_devices(
    gpus: Iterable[GPUStatus],
    config: NodeConfig,
    *,
    consumable: bool,
    taint_since: Mapping[tuple[str, str], str] | None = None,
) -> list[JSON]:
    """Every GPU in the order given (the backend's, by index) as a device; `taint_since` maps
    (device name, taint value) to the time that taint was first seen."""
    since = taint_since or {}
    out = []
    for gpu in gpus:
        name = dra.device_name(gpu.info.minor)
        out.append(
            slice_device(
                gpu, config, consumable=consumable, taint_since=since.get((name, taint_value(gpu) or ""), "")
            )
        )
    return out


# --- the slice ---------------------------------------------------------------------------------------------


def slice_spec(node: str, driver: str, devices: Sequence[JSON], generation: int) -> JSON:
    return {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "devices": list(devices),
    }


def new_slice(node: str, node_uid: str, driver: str, spec: JSON) -> JSON:
    """A slice to create: generateName `<node>-<driver>-`, owned by the Node (controller)."""
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{node}-{driver}-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": spec,
    }


def updated_slice(stored: Mapping[str, Any], spec: JSON) -> JSON:
    """The stored slice with a new spec (its metadata, resourceVersion included, kept: an update of
    another version is refused with 409)."""
    body = copy.deepcopy(dict(stored))
    body["spec"] = spec
    return body


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str:
    """A name or timestamp from a stored object; "" for anything that is not a string."""
    return value if isinstance(value, str) else ""


def generation(slice_: Mapping[str, Any]) -> int:
    value = _map(_map(slice_.get("spec")).get("pool")).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pool_name(slice_: Mapping[str, Any]) -> str:
    return _text(_map(_map(slice_.get("spec")).get("pool")).get("name"))


def pick_slice(
    slices: Iterable[Mapping[str, Any]], pool: str
) -> tuple[Mapping[str, Any] | None, list[Mapping[str, Any]]]:
    """Of the node's slices of our driver: the one to keep (our pool's, highest generation, then
    oldest, then first by name) and the others, to delete (duplicates, older generations, other pools)."""
    ours = [s for s in slices if pool_name(s) == pool]
    others = [s for s in slices if pool_name(s) != pool]
    if not ours:
        return None, others

    def rank(s: Mapping[str, Any]) -> tuple[int, str, str]:
        meta = _map(s.get("metadata"))
        return -generation(s), _text(meta.get("creationTimestamp")), _text(meta.get("name"))

    ours.sort(key=rank)
    return ours[0], [*ours[1:], *others]


def _canonical(value: object) -> object:
    """A quantity's exact value (so "80Gi" and "85899345920" compare equal); anything else as is."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        try:
            return parse_quantity(value)
        except QuantityError:
            return value
    return value


def _normal_capacity(capacity: object) -> object:
    if not isinstance(capacity, Mapping):
        return capacity
    out: JSON = {}
    for name, entry in capacity.items():
        if not isinstance(entry, Mapping):
            out[name] = entry
            continue
        normal: JSON = {k: v for k, v in entry.items() if k not in ("value", "requestPolicy")}
        normal["value"] = _canonical(entry.get("value"))
        policy = entry.get("requestPolicy")
        if isinstance(policy, Mapping):
            normal_policy: JSON = {k: v for k, v in policy.items() if k not in ("default", "validRange")}
            if "default" in policy:
                normal_policy["default"] = _canonical(policy["default"])
            valid = policy.get("validRange")
            if isinstance(valid, Mapping):
                normal_policy["validRange"] = {k: _canonical(v) for k, v in valid.items()}
            normal["requestPolicy"] = normal_policy
        out[name] = normal
    return out


def normal_device(device: Mapping[str, Any]) -> JSON:
    """A device for comparison: quantities as exact values, taints without timeAdded (the API server may
    round or add it; the helper's DevicesDeepEqual ignores it too), false/empty fields dropped."""
    out: JSON = {}
    for key, value in device.items():
        if key == "capacity":
            out[key] = _normal_capacity(value)
        elif key == "taints" and isinstance(value, list):
            taints = [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in value if isinstance(t, Mapping)
            ]
            if taints:
                out[key] = taints
        elif value not in (None, False, [], {}):
            out[key] = value
    return out


def spec_matches(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the stored slice's spec says what `desired` says, the pool's generation aside."""
    spec = _map(stored.get("spec"))
    pool = _map(spec.get("pool"))
    want_pool = _map(desired.get("pool"))
    if spec.get("driver") != desired.get("driver") or spec.get("nodeName") != desired.get("nodeName"):
        return False
    if pool.get("name") != want_pool.get("name") or pool.get("resourceSliceCount") != want_pool.get(
        "resourceSliceCount"
    ):
        return False
    have = spec.get("devices") or []
    want = desired.get("devices") or []
    if not isinstance(have, list) or len(have) != len(want):
        return False
    return all(
        isinstance(h, Mapping) and normal_device(h) == normal_device(w)
        for h, w in zip(have, want, strict=True)
    )


def consumable_dropped(desired: Sequence[Mapping[str, Any]], stored: Mapping[str, Any]) -> bool:
    """Whether the API server dropped `allowMultipleAllocations` from a device we published with it:
    the cluster has no consumable capacity (gate DRAConsumableCapacity off), as the helper detects it
    (resourceslicecontroller.go DroppedFieldsError.DisabledFeatures)."""
    wanted = {d.get("name") for d in desired if d.get("allowMultipleAllocations") is True}
    if not wanted:
        return False
    devices = _list(_map(stored.get("spec")).get("devices"))
    by_name = {d.get("name"): d for d in devices if isinstance(d, Mapping) and isinstance(d.get("name"), str)}
    return any(
        name in by_name and by_name[name].get("allowMultipleAllocations") is not True for name in wanted
    )


def stored_taint_times(stored: Mapping[str, Any] | None) -> dict[tuple[str, str], str]:
    """(device, taint value) -> timeAdded of our taints in a stored slice, to keep them across writes."""
    out: dict[tuple[str, str], str] = {}
    if stored is None:
        return out
    for device in _list(_map(stored.get("spec")).get("devices")):
        if not isinstance(device, Mapping):
            continue
        for taint in _list(device.get("taints")):
            if isinstance(taint, Mapping) and isinstance(taint.get("timeAdded"), str):
                out[(_text(device.get("name")), _text(taint.get("value")))] = taint["timeAdded"]
    return out


def label_value_ok(value: str) -> bool:
    return len(value) <= 63 and (value == "" or _LABEL_VALUE.fullmatch(value) is not None)


__all__ = [
    "MAX_DEVICES_WITH_TAINTS",
    "MEMORY_STEP",
    "MIG_DEVICE_CLASS",
    "MIG_DEVICE_CLASS_SELF",
    "MIG_DEVICE_TYPE",
    "SLICES_PATH",
    "TAINT_NAME",
    "MigGpu",
    "PoolPlan",
    "aligned_memory",
    "consumable_dropped",
    "counter_name",
    "counter_set_name",
    "device_attributes",
    "device_capacity",
    "driver_semver",
    "generation",
    "label_value_ok",
    "memory_slice_counter",
    "mig_capacities",
    "mig_counter_set",
    "mig_device_class",
    "mig_device_class_self",
    "mig_device_name",
    "mig_partition",
    "mig_partitions",
    "mig_slice_specs",
    "new_slice",
    "node_slice_specs",
    "normal_device",
    "parse_mig_device_name",
    "pick_slice",
    "plan_pool",
    "pool_name",
    "pool_spec_matches",
    "rfc1123",
    "slice_device",
    "slice_devices",
    "slice_spec",
    "spec_matches",
    "stored_taint_times",
    "taint_key",
    "taint_partitions",
    "taint_value",
    "updated_slice",
]


# --- MIG partitions (KEP-4815 partitionable devices) --------------------------------------------------------
#
# A GPU in MIG mode is published as NVIDIA's DRA driver publishes it with its `DynamicMIG` gate
# (NVIDIA/k8s-dra-driver-gpu 22407113, cmd/gpu-kubelet-plugin: partitions.go, mig.go, nvlib.go
# `inspectMigProfilesAndPlacements`, driver.go `generateSplitResourceSlices`):
#
# - one counter set per GPU, `gpu-<minor>-counter-set`, holding per capacity the largest value any
#   profile offers (`multiprocessors`, `copy-engines`, `decoders`, `encoders`, `jpeg-engines`,
#   `ofa-engines`, `memory` in bytes: the camelCase capacity names made DNS labels) and one counter
#   `memory-slice-<i>` = 1 per memory slice (as many as the largest placement spans);
# - one device per profile and possible placement, `gpu-<minor>-mig-<profile>-<giProfileId>-<start>`
#   (the profile without dots, other characters outside [a-z0-9-.] made '-': `1g.5gb+me` gives
#   `1g5gb-me`), attributes `type: mig`, `parentUUID`, `profile`, `productName`, `driverVersion`,
#   capacities `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`,
#   `memory` (MiB x 2^20), consuming those as counters plus `memory-slice-<start..start+size-1>`.
#   NVIDIA skips profiles whose compute instance differs from the GPU instance and the CI profile
#   1_SLICE_REV1; `hami_api.mig`'s profiles are GPU instances with one compute instance spanning them,
#   so every one is published (on A100: 7+7+4+3+2+1+1 = 25 partitions per GPU);
# - the full GPU is not published while MIG mode is enabled (NVIDIA: on Ampere MIG mode cannot be
#   left without a GPU reset, so only partitions are allocatable; hami-node never changes MIG mode).
#
# Layout: the split one of Kubernetes >= 1.35 ("Only one of Devices and SharedCounters can be set in a
# ResourceSlice"): slice 0 holds every counter set, then one slice per GPU with its devices; the pool is
# the node. NVIDIA publishes the combined layout to API servers older than 1.35; the local cluster's
# stand-ins behave as 1.36 (DRAPartitionableDevices beta, on), so hami-node publishes split only.

MIG_DEVICE_TYPE = "mig"
MIG_DEVICE_CLASS = "mig.nvidia.com"
MIG_DEVICE_CLASS_SELECTOR = "device.driver == '{driver}' && device.attributes['{driver}'].type == 'mig'"
"""NVIDIA's DeviceClass `mig.nvidia.com` (deployments/helm/.../deviceclass-mig.yaml), for `driver`."""

_MIG_CAPACITIES = (
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
    "memory",
)
_NOT_RFC1123 = re.compile(r"[^a-z0-9-.]")
_CAMEL_1 = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_2 = re.compile(r"([A-Z]+)([A-Z][a-z])")


def rfc1123(name: str) -> str:
    """NVIDIA's `toRFC1123Compliant`: lower case, characters outside [a-z0-9-.] made '-', leading and
    trailing '-' and a trailing '.' dropped, at most 253 characters."""
    name = _NOT_RFC1123.sub("-", name.lower()).strip("-")
    name = name.removesuffix(".")
    return name[:253]


def counter_name(capacity: str) -> str:
    """NVIDIA's `camelToDNSName`: `copyEngines` -> `copy-engines`."""
    return rfc1123(_CAMEL_2.sub(r"\1-\2", _CAMEL_1.sub(r"\1-\2", capacity)))


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def memory_slice_counter(i: int) -> str:
    return f"memory-slice-{i}"


def mig_device_name(minor: int, profile: GIProfile, start: int) -> str:
    """`MigSpecTuple.ToCanonicalName`: `gpu-0-mig-1g5gb-19-6`, `gpu-0-mig-1g5gb-me-20-0`."""
    return f"gpu-{minor}-mig-{rfc1123(profile.name.replace('.', ''))}-{profile.profile_id}-{start}"


def parse_mig_device_name(name: str) -> tuple[int, int, int] | None:
    """(parent minor, GI profile ID, placement start) of a partition's name (NVIDIA's
    `NewMigSpecTupleFromCanonicalName`), None for any other name."""
    found = _MIG_NAME.match(name)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-[a-z0-9.-]+?-(\d+)-(\d+)$")


def _count(value: int) -> str:
    """An integer as Go's `resource.NewQuantity(v, BinarySI)` prints it."""
    return _memory_quantity(value) if value >= dra.MIB else str(value)


def mig_capacities(profile: GIProfile) -> dict[str, int]:
    """NVIDIA's `CommonCapacitiesMig`: the GPU instance profile's engines and memory in bytes."""
    return {
        "multiprocessors": profile.multiprocessors,
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegEngines": profile.jpeg_engines,
        "ofaEngines": profile.ofa_engines,
        "memory": profile.memory_mib * dra.MIB,
    }


@dataclass(frozen=True, slots=True)
class MigGpu:
    """What the partitions of one MIG-mode GPU are made of: the GPU and its profiles (the backend's
    `mig_profiles(uuid)`)."""

    minor: int
    uuid: str
    product_name: str
    driver_version: str | None
    profiles: tuple[GIProfile, ...]

    def maxima(self) -> dict[str, int]:
        """Per capacity, the largest value over every profile with a placement."""
        out = dict.fromkeys(_MIG_CAPACITIES, 0)
        for profile in self.profiles:
            if profile.placements:
                for name, value in mig_capacities(profile).items():
                    out[name] = max(out[name], value)
        return out

    def memory_slices(self) -> int:
        return max((p.size for profile in self.profiles for p in profile.placements), default=0)


def _counters(values: Mapping[str, int], slices: Iterable[int]) -> JSON:
    counters: JSON = {counter_name(name): {"value": _count(value)} for name, value in values.items()}
    for i in slices:
        counters[memory_slice_counter(i)] = {"value": "1"}
    return counters


def mig_counter_set(gpu: MigGpu) -> JSON:
    """`PartSharedCounterSets`: the GPU's one counter set."""
    return {
        "name": counter_set_name(gpu.minor),
        "counters": _counters(gpu.maxima(), range(gpu.memory_slices())),
    }


def mig_partition(gpu: MigGpu, profile: GIProfile, placement: Placement) -> JSON:
    """One partition (`MigSpec.PartGetDevice`)."""
    attributes: JSON = {
        "type": {"string": MIG_DEVICE_TYPE},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": profile.name},
        "productName": {"string": gpu.product_name[:64]},
    }
    version = driver_semver(gpu.driver_version)
    if version is not None:
        attributes["driverVersion"] = {"version": version}
    capacities = mig_capacities(profile)
    return {
        "name": mig_device_name(gpu.minor, profile, placement.start),
        "attributes": attributes,
        "capacity": {name: {"value": _count(value)} for name, value in capacities.items()},
        "consumesCounters": [
            {"counterSet": counter_set_name(gpu.minor), "counters": _counters(capacities, placement.slices())}
        ],
    }


def mig_partitions(gpu: MigGpu) -> list[JSON]:
    """Every partition of the GPU, sorted by name as NVIDIA's slice is (the scheduler is first-fit in
    slice order)."""
    devices = [
        mig_partition(gpu, profile, placement) for profile in gpu.profiles for placement in profile.placements
    ]
    return sorted(devices, key=lambda d: str(d["name"]))


def mig_slice_specs(node: str, driver: str, gpus: Sequence[MigGpu], generation: int) -> list[JSON]:
    """The split layout: slice 0 with every GPU's counter set, then one slice per GPU with its
    partitions; one pool (the node), `resourceSliceCount` = 1 + GPUs. Empty without MIG GPUs."""
    usable = [g for g in gpus if g.memory_slices()]
    if not usable:
        return []
    pool = {"name": node, "generation": generation, "resourceSliceCount": 1 + len(usable)}
    specs: list[JSON] = [
        {
            "driver": driver,
            "nodeName": node,
            "pool": dict(pool),
            "sharedCounters": [mig_counter_set(g) for g in usable],
        }
    ]
    for gpu in usable:
        specs.append({"driver": driver, "nodeName": node, "pool": dict(pool), "devices": mig_partitions(gpu)})
    return specs


def mig_device_class(driver: str) -> JSON:
    """NVIDIA's DeviceClass `mig.nvidia.com`, selecting this driver's partitions."""
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": MIG_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": MIG_DEVICE_CLASS_SELECTOR.format(driver=driver)}}]},
    }


# --- the node's pool: whole GPUs and MIG partitions ------------------------------------------------------

MIG_DEVICE_CLASS_SELF = f"mig.{dra.DRIVER}"
"""The DeviceClass of MIG partitions published under hami-node's own driver (NVIDIA's `mig.nvidia.com`
selects `gpu.nvidia.com`'s, so a cluster may run both drivers side by side)."""


def mig_device_class_self(driver: str = dra.DRIVER) -> JSON:
    """`mig.<driver>`: NVIDIA's `mig.nvidia.com` selector for hami-node's driver."""
    body = mig_device_class(driver)
    body["metadata"] = {"name": f"mig.{driver}"}
    return body


def taint_partitions(devices: Sequence[JSON], taint: JSON | None) -> list[JSON]:
    """The partitions of one GPU with the GPU's taint (an unhealthy GPU's partitions are unhealthy)."""
    if taint is None:
        return list(devices)
    return [{**d, "taints": [dict(taint)]} for d in devices]


def node_slice_specs(
    node: str,
    driver: str,
    whole: Sequence[JSON],
    mig_gpus: Sequence[MigGpu],
    generation: int,
    *,
    mig_taints: Mapping[str, JSON] | None = None,
) -> list[JSON]:
    """Every slice of the node's pool. Without a MIG GPU, one slice with the whole GPUs (`slice_spec`,
    `resourceSliceCount: 1`, as before). With one: NVIDIA's split layout (`mig_slice_specs`: the counter
    sets' slice first, then one slice per MIG GPU with its partitions) plus, when the node also has GPUs
    out of MIG mode, one slice with those (second); `resourceSliceCount` counts them all. `mig_taints`
    maps a MIG GPU's UUID to its taint (put on each of its partitions)."""
    mig = mig_slice_specs(node, driver, mig_gpus, generation)
    if not mig:
        return [slice_spec(node, driver, whole, generation)]
    taints = mig_taints or {}
    usable = [g for g in mig_gpus if g.memory_slices()]
    count = len(mig) + (1 if whole else 0)
    for spec in mig:
        spec["pool"]["resourceSliceCount"] = count
    for spec, gpu in zip(mig[1:], usable, strict=True):
        spec["devices"] = taint_partitions(spec["devices"], taints.get(gpu.uuid))
    out = [mig[0]]
    if whole:
        out.append(
            {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                "devices": list(whole),
            }
        )
    return [*out, *mig[1:]]


def _normal_counters(value: object) -> object:
    """Counter sets or consumptions for comparison: each counter's value as an exact quantity."""
    if not isinstance(value, list):
        return value
    out: list[object] = []
    for entry in value:
        if not isinstance(entry, Mapping):
            out.append(entry)
            continue
        normal = {k: v for k, v in entry.items() if k != "counters"}
        counters = entry.get("counters")
        if isinstance(counters, Mapping):
            normal["counters"] = {
                name: _canonical(c.get("value")) if isinstance(c, Mapping) else c
                for name, c in counters.items()
            }
        out.append(normal)
    return out


def pool_spec_matches(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """`spec_matches`, with the counter sets and each device's consumed counters compared too."""
    if not spec_matches(stored, desired):
        return False
    spec = _map(stored.get("spec"))
    if _normal_counters(spec.get("sharedCounters") or []) != _normal_counters(
        desired.get("sharedCounters") or []
    ):
        return False
    have = _list(spec.get("devices"))
    want = _list(desired.get("devices"))
    return all(
        _normal_counters(_map(h).get("consumesCounters") or [])
        == _normal_counters(w.get("consumesCounters") or [])
        for h, w in zip(have, want, strict=True)
    )


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What the publisher writes: `deletes` (slices of other pools, older generations, leftovers) and,
    unless the pool is in sync, `writes`: per desired spec, the stored slice to update (None: create),
    all with the new `generation`."""

    deletes: tuple[Mapping[str, Any], ...]
    writes: tuple[tuple[Mapping[str, Any] | None, JSON], ...]
    generation: int
    kept: tuple[Mapping[str, Any], ...] = ()


def plan_pool(slices: Sequence[Mapping[str, Any]], pool: str, desired: Sequence[JSON]) -> PoolPlan:
    """Compare the node's slices of our driver with the desired specs (their generation aside), as
    k8s.io/dynamic-resource-allocation's resourceslice controller does for a pool of several slices: in
    sync when the highest generation's slices match the specs one to one (older generations and other
    pools are deleted); otherwise every spec is written with the highest generation seen + 1, reusing
    stored slices (the highest generation first) before creating, and the unused ones are deleted."""
    ours = [s for s in slices if pool_name(s) == pool]
    others = [s for s in slices if pool_name(s) != pool]

    def rank(s: Mapping[str, Any]) -> tuple[int, str, str]:
        meta = _map(s.get("metadata"))
        return -generation(s), _text(meta.get("creationTimestamp")), _text(meta.get("name"))

    ours.sort(key=rank)
    highest = max((generation(s) for s in slices), default=0)
    if ours:
        top = generation(ours[0])
        current = [s for s in ours if generation(s) == top]
        unmatched = list(current)
        matched: list[Mapping[str, Any]] = []
        for spec in desired:
            hit = next((s for s in unmatched if pool_spec_matches(s, spec)), None)
            if hit is None:
                break
            unmatched.remove(hit)
            matched.append(hit)
        if len(matched) == len(desired) and not unmatched:
            stale = [s for s in ours if generation(s) != top]
            return PoolPlan((*others, *stale), (), top, tuple(matched))
    new_generation = highest + 1
    candidates = list(ours)
    reused: list[Mapping[str, Any] | None] = [None] * len(desired)

    def kind(spec: Mapping[str, Any]) -> bool:
        return bool(spec.get("sharedCounters"))

    # A stored slice goes first to a spec it already matches, then to one of its kind (counters or
    # devices), then to any: the fewest fields change.
    for fits in (
        pool_spec_matches,
        lambda s, spec: kind(_map(s.get("spec"))) == kind(spec),
        lambda s, spec: True,
    ):
        for i, spec in enumerate(desired):
            if reused[i] is None:
                hit = next((s for s in candidates if fits(s, spec)), None)
                if hit is not None:
                    candidates.remove(hit)
                    reused[i] = hit
    writes = tuple(
        (reuse, {**spec, "pool": {**spec["pool"], "generation": new_generation}})
        for reuse, spec in zip(reused, desired, strict=True)
    )
    return PoolPlan((*others, *candidates), writes, new_generation)
