"""Pure Allocate logic of the device plugin: virtual device IDs, which pending pod a kubelet request is
for, the container's response (HAMi v2.10's envs and mounts), and GetPreferredAllocation's choice.

Nothing here reads the clock, the environment, files or the network: the caller passes the pod, its
decoded `hami.io/vgpu-devices-to-allocate`, the GPUs and their health, the config, and the random ids
(the shared-cache file name, the CDI annotation id), and gets data back.

How Allocate is answered (HAMi's device plugin, nvinternal/plugin/server.go `Allocate`):

1. `match_pending_pod(pending, len(request.devices_ids))` names the pod whose next unallocated device
   container asks for exactly that many GPUs (kubelet calls Allocate once per container, init containers
   first). `NoPendingPod` means the pod watch has not shown it (the caller reads the API server once
   before it fails with `NoPendingPod.error(node)`). Two candidates raise `AmbiguousPodError`.
2. `grant_container(pod, match, device_ids, gpus=)` decides which GPUs the container really gets: the
   GPUs of the devices kubelet chose, which must be the GPUs the scheduler accounted it on. Kubelet
   records those devices in its checkpoint and PodResources, so the container must see the same GPUs:
   the scheduler's slices move to kubelet's GPUs only when the pod then holds no more on any GPU than
   the scheduler accounted (kubelet reused another of the pod's init devices, see
   `hami_api.containers`); otherwise `DeviceMismatchError` names the pod, the container and both GPUs.
   Never a silent swap.
3. `container_allocate_response(pod, allocation, entry, device_ids, gpus=, config=, cache_id=)` checks the
   request (count, known device IDs on the entry's GPUs, known and healthy GPUs) and builds the response;
   `to_proto(response)` turns it into the gRPC message.
Model: the lookup is modelled in `hami_control/protocol_model.py` (`ProtocolModel._lookup`).
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from uuid import NAMESPACE_URL, uuid5

from hami_api.containers import footprint_growth, pod_container_kinds
from hami_api.errors import RequestError
from hami_api.resources import pod_containers
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_node import mps
from hami_node.cdi import CDI_KIND, qualified_name
from hami_node.config import DeviceListStrategy, NodeConfig, OperatingMode
from hami_node.plugin.api import api_pb2
from hami_node.plugin.api.constants import HEALTHY, UNHEALTHY

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
"""NVIDIA_VISIBLE_DEVICES under the volume-mounts strategy; one /dev/null mount per GPU below it."""
CDI_PLUGIN_NAME = "nvidia-device-plugin"
"""The plugin name in the CDI annotation key `<prefix><plugin>_<id>`, as NVIDIA's plugin writes it."""
VGPU_LOCK_DIR = "/tmp/vgpulock"
LD_SO_PRELOAD = "/etc/ld.so.preload"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_CDI_NAME = re.compile(r"[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?")

# --- GPUs and their virtual devices ----------------------------------------------------------------------


class GPULike(Protocol):
    """What this module needs to know of a physical GPU (`hami_node.gpu.PhysicalGPU` fits, as does
    `NodeGPU`): its UUID, whether it is healthy now, and its NUMA node (None when unknown)."""

    @property
    def uuid(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def numa_node(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class NodeGPU:
    """A plain `GPULike`."""

    uuid: str
    healthy: bool = True
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class VirtualDevice:
    """One of the `device_split_count` devices a GPU is advertised as. `numa_node` is set only when NUMA
    topology is enabled and the GPU's node is known (negative nodes read as 0, as HAMi does)."""

    id: str
    gpu_uuid: str
    replica: int
    healthy: bool
    numa_node: int | None = None


class InvalidDeviceID(ValueError):
    """A kubelet device ID that is not one of this node's virtual devices."""

    def __init__(self, device_id: str, reason: str) -> None:
        self.device_id = device_id
        self.reason = reason
        super().__init__(f"device ID {device_id!r} {reason}")


_NVIDIA_REPLICA_SEPARATOR = "::"
"""NVIDIA's k8s-device-plugin names a time-slicing replica `<GPU-UUID>::<n>` (`rm.NewAnnotatedID`)."""


def virtual_device_id(gpu_uuid: str, replica: int) -> str:
    """`<GPU-UUID>-<replica>`, HAMi's virtual device ID (the only form this plugin advertises)."""
    return f"{gpu_uuid}-{replica}"


def _decimal(text: str) -> int | None:
    """A plain ASCII decimal without leading zeros ("0" itself is fine), else None."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


def split_virtual_device_id(device_id: str) -> tuple[str, int] | None:
    """(GPU UUID, replica) of an ID shaped `<uuid>::<n>` (NVIDIA's plugin's replica ID, which kubelet's
    checkpoint may still hold on a node moved from it) or `<uuid>-<n>` (HAMi's), else None. Syntax
    only; n is plain ASCII decimal without leading zeros and the UUID is non-empty.

    An ID with `::` is read only as NVIDIA's form, split at its first `::` as NVIDIA's plugin does
    (`AnnotatedID.Split`): tried first because a UUID contains `-`, so `GPU-x::-1` is not `GPU-x::`'s
    replica 1. Otherwise the replica follows the last `-`.
    """
    uuid, sep, replica = device_id.partition(_NVIDIA_REPLICA_SEPARATOR)
    if not sep:
        uuid, sep, replica = device_id.rpartition("-")
    number = _decimal(replica)
    if not sep or not uuid or number is None:
        return None
    return uuid, number


def parse_virtual_device_id(
    device_id: str, known_gpus: Collection[str], split_count: int | None = None
) -> tuple[str, int]:
    """(GPU UUID, replica) of one of this node's virtual device IDs, in HAMi's `<GPU-UUID>-<n>` or
    NVIDIA's `<GPU-UUID>::<n>` form (`split_virtual_device_id`); `InvalidDeviceID` otherwise. With
    `split_count`, the replica must also be below it."""
    parts = split_virtual_device_id(device_id)
    if parts is None:
        raise InvalidDeviceID(device_id, "is not of the form <GPU-UUID>-<n> or <GPU-UUID>::<n>")
    uuid, replica = parts
    if uuid not in known_gpus:
        raise InvalidDeviceID(device_id, f"names GPU {uuid}, which this node does not have")
    if split_count is not None and replica >= split_count:
        raise InvalidDeviceID(device_id, f"has replica {replica}, but each GPU has {split_count}")
    return uuid, replica


def list_virtual_devices(
    gpus: Iterable[GPULike], split_count: int, numa_topology: bool = False
) -> tuple[VirtualDevice, ...]:
    """Every GPU as `split_count` devices `<uuid>-0 .. <uuid>-<n-1>`, in GPU order, each with its GPU's
    health (unhealthy GPUs stay listed, as Unhealthy, so kubelet's capacity does not move)."""
    if split_count < 1:
        raise ValueError(f"split_count must be >= 1, got {split_count}")
    devices: list[VirtualDevice] = []
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise ValueError(f"GPU {gpu.uuid} is listed twice")
        seen.add(gpu.uuid)
        numa = max(gpu.numa_node, 0) if numa_topology and gpu.numa_node is not None else None
        devices.extend(
            VirtualDevice(virtual_device_id(gpu.uuid, i), gpu.uuid, i, gpu.healthy, numa)
            for i in range(split_count)
        )
    return tuple(devices)


def virtual_devices_to_proto(devices: Iterable[VirtualDevice]) -> list[api_pb2.Device]:
    """ListAndWatch's device list."""
    out = []
    for d in devices:
        device = api_pb2.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
        if d.numa_node is not None:
            device.topology.nodes.append(api_pb2.NUMANode(ID=d.numa_node))
        out.append(device)
    return out


# --- errors ----------------------------------------------------------------------------------------------


class AllocationError(Exception):
    """Allocate must fail (and the pod be marked bind-phase=failed). The message says what went wrong and
    for which pod; `pod` is `namespace/name` when one pod is concerned, else ""."""

    def __init__(self, message: str, pod: str = "") -> None:
        self.message = message
        self.pod = pod
        super().__init__(message)


class NoPendingPodError(AllocationError):
    """No pod is waiting for devices on this node."""


class ForeignPodError(AllocationError):
    """Kubelet is admitting a GPU pod the HAMi scheduler did not place (no allocation to hand out)."""


class CountMismatchError(AllocationError):
    """Kubelet asked for a number of devices no waiting container was scheduled."""


class AmbiguousPodError(AllocationError):
    """More than one pending pod fits the request; `pods` names them."""

    def __init__(self, message: str, pods: tuple[str, ...]) -> None:
        super().__init__(message)
        self.pods = pods


class UnknownDeviceError(AllocationError):
    """A device ID kubelet sent, or a GPU the scheduler chose, is not on this node."""


class UnhealthyGPUError(AllocationError):
    """The GPU the scheduler chose is unhealthy now."""


REASON_GPU_MISMATCH = "AllocateGPUMismatch"
"""Event reason (Warning): kubelet chose devices on other GPUs than the scheduler's, and the container
cannot move there."""
REASON_GPU_REASSIGNED = "AllocateGPUReassigned"
"""Event reason (Normal): a container got another GPU of its pod than planned, within what the
scheduler accounted for the pod."""


class DeviceMismatchError(AllocationError):
    """Kubelet chose devices on other GPUs than the scheduler accounted the container on, and the
    container cannot be moved there within what the scheduler accounted for its pod. `container` is
    the container's name, `kubelet_gpus` and `scheduled_gpus` the two GPU lists."""

    def __init__(
        self,
        message: str,
        pod: str,
        container: str,
        kubelet_gpus: tuple[str, ...],
        scheduled_gpus: tuple[str, ...],
    ) -> None:
        super().__init__(message, pod)
        self.container = container
        self.kubelet_gpus = kubelet_gpus
        self.scheduled_gpus = scheduled_gpus


class PreferredAllocationError(ValueError):
    """A GetPreferredAllocation request that cannot be answered (kubelet never sends one)."""


# --- which pending pod ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to this node that still waits for devices: its decoded to-allocate annotation and the
    entries (container indexes, init containers first) this daemon has already allocated."""

    namespace: str
    name: str
    uid: str
    allocation: PodAllocation
    """What the scheduler chose and accounted (`hami.io/vgpu-devices-to-allocate`)."""
    allocated: frozenset[int] = frozenset()
    granted: PodAllocation | None = None
    """What the containers allocated so far really got, when any of them moved to another GPU of the
    pod (`grant_container`); None while every container got the scheduler's GPUs."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def current(self) -> PodAllocation:
        """The allocation as it stands: the scheduler's, with the moves of `grant_container` applied."""
        return self.allocation if self.granted is None else self.granted

    def next_entry(self) -> int | None:
        """Index of the first entry with devices not yet allocated: the container kubelet admits next."""
        return next(
            (i for i, c in enumerate(self.allocation.containers) if c.devices and i not in self.allocated),
            None,
        )

    def with_allocated(self, entry: int, granted: ContainerAllocation | None = None) -> PendingPod:
        """The pod once `entry` is allocated; `granted` is what the container got when that differs
        from the scheduler's choice (the same slices in another order are no difference)."""
        if granted is None or same_slices(granted, self.current.containers[entry]):
            return replace(self, allocated=self.allocated | {entry})
        containers = list(self.current.containers)
        containers[entry] = granted
        return replace(self, allocated=self.allocated | {entry}, granted=PodAllocation(tuple(containers)))


def same_slices(a: ContainerAllocation, b: ContainerAllocation) -> bool:
    """Whether two container allocations hold the same slices, in any order."""

    def key(s: GPUSlice) -> tuple[str, int, int, str]:
        return (s.uuid, s.usedmem, s.usedcores, s.vendor)

    return sorted(a.devices, key=key) == sorted(b.devices, key=key)


@dataclass(frozen=True, slots=True)
class PodMatch:
    """The pod a request is for, and the allocation entry (container) it serves."""

    pod: PendingPod
    entry: int

    @property
    def container(self) -> ContainerAllocation:
        """The scheduler's slices for the entry (earlier moves of other containers do not change it)."""
        return self.pod.current.containers[self.entry]

    @property
    def completes_pod(self) -> bool:
        """After this entry no container of the pod waits for devices: time to patch bind-phase=success."""
        return self.pod.with_allocated(self.entry).next_entry() is None


@dataclass(frozen=True, slots=True)
class NoPendingPod:
    """No known pending pod fits a request for `count` devices (yet): the watch may lag, so wait and
    retry. `waiting` lists the pods that do wait, with the GPU count of their next container."""

    count: int
    waiting: tuple[tuple[str, int], ...] = ()

    def error(self, node: str) -> AllocationError:
        """The error to fail Allocate with once waiting is over."""
        if not self.waiting:
            return NoPendingPodError(
                f"kubelet asked for {self.count} device(s), but no pod bound to node {node} is waiting "
                "for GPUs (was the pod scheduled by the HAMi scheduler?)"
            )
        listed = ", ".join(f"{key} (next container: {n} GPU(s))" for key, n in self.waiting)
        return CountMismatchError(
            f"kubelet asked for {self.count} device(s), but no pod pending on node {node} has a "
            f"container waiting for {self.count} GPU(s); waiting: {listed}",
            self.waiting[0][0] if len(self.waiting) == 1 else "",
        )


def match_pending_pod(pending: Iterable[PendingPod], count: int) -> PodMatch | NoPendingPod:
    """The one pending pod whose next unallocated device container asks for exactly `count` GPUs.

    The scheduler keeps the pods pending on one node at a time apart by those counts, so two candidates
    mean something is wrong: `AmbiguousPodError`, rather than a guess.
    """
    if count < 1:
        raise ValueError(f"a request for {count} devices cannot be matched")
    matches: list[PodMatch] = []
    waiting: list[tuple[str, int]] = []
    for pod in pending:
        entry = pod.next_entry()
        if entry is None:
            continue
        asked = len(pod.allocation.containers[entry])
        waiting.append((pod.key, asked))
        if asked == count:
            matches.append(PodMatch(pod, entry))
    if len(matches) > 1:
        keys = tuple(sorted(m.pod.key for m in matches))
        raise AmbiguousPodError(
            f"{len(keys)} pods pending on this node have a container waiting for {count} GPU(s): "
            f"{', '.join(keys)}; refusing to guess which one kubelet is admitting",
            keys,
        )
    if matches:
        return matches[0]
    return NoPendingPod(count, tuple(sorted(waiting)))


def steering_gpus(pending: Iterable[PendingPod], count: int) -> tuple[str, ...]:
    """The GPUs chosen for the container a GetPreferredAllocation of `count` devices is for, or ()
    when no single pending pod fits (then the choice is spread over GPUs)."""
    try:
        found = match_pending_pod(pending, count)
    except (AmbiguousPodError, ValueError):
        return ()
    return found.container.uuids if isinstance(found, PodMatch) else ()


# --- the container's response ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerResponse:
    """The contents of a ContainerAllocateResponse (do not mutate the mappings)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def to_proto(response: ContainerResponse) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(response.envs),
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in response.mounts
        ],
        annotations=dict(response.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in response.cdi_devices],
    )


def _pod_identity(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    uid = meta.get("uid")
    return key, uid if isinstance(uid, str) else ""


def _disables_control(container: Mapping[str, Any]) -> bool:
    """HAMi: any env entry CUDA_DISABLE_CONTROL whose value Go's ParseBool reads as true."""
    env = container.get("env")
    if not isinstance(env, Sequence) or isinstance(env, str):
        return False
    return any(
        isinstance(e, Mapping) and e.get("name") == DISABLE_CONTROL_ENV and e.get("value") in _GO_TRUE
        for e in env
    )


def _visible_devices(
    uuids: Sequence[str], config: NodeConfig, cdi_id: str
) -> tuple[dict[str, str], list[Mount], dict[str, str], list[str]]:
    """NVIDIA's device-list strategies: (envs, mounts, annotations, CDI devices). With only CDI
    strategies, no env or mounts are added."""
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []
    strategies = config.device_list_strategy
    names = [qualified_name(uuid) for uuid in uuids]  # the names the CDI spec defines (hami_node.cdi)
    if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
        key = f"{config.cdi_annotation_prefix}{CDI_PLUGIN_NAME}_{cdi_id}"
        annotations[key] = ",".join(names)
    if DeviceListStrategy.CDI_CRI in strategies:
        cdi_devices.extend(names)
    if DeviceListStrategy.ENVVAR in strategies:
        envs[VISIBLE_DEVICES_ENV] = ",".join(uuids)
    if DeviceListStrategy.VOLUME_MOUNTS in strategies:
        envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
        mounts.extend(Mount(f"{VOLUME_MOUNTS_ROOT}/{uuid}", "/dev/null", False) for uuid in uuids)
    return envs, mounts, annotations, cdi_devices


def mig_container_response(
    mig_uuids: Sequence[str], config: NodeConfig, cdi_id: str | None = None
) -> ContainerResponse:
    """The answer for a container of HAMi's dynamic MIG (operating mode mig): the container sees its MIG
    devices, with none of HAMi-core's envs or mounts (HAMi server.go `Allocate`, `operatingMode ==
    "mig"`), through the device-list strategies as a whole GPU does (`_visible_devices`):
    `NVIDIA_VISIBLE_DEVICES=MIG-...`, one /dev/null mount each under volume-mounts, and under the CDI
    strategies the MIG devices' CDI names `k8s.device-plugin.nvidia.com/gpu=MIG-...`, which the node's
    CDI spec defines (`hami_node.cdi`: the spec writer listens to the MIG manager and rewrites the spec
    before Allocate answers). `cdi_id` is the CDI annotation's id (default: derived from the MIG UUIDs,
    so a repeated Allocate answers the same)."""
    if not mig_uuids:
        raise ValueError("mig_uuids: a MIG container gets at least one MIG device")
    if cdi_id is None:
        cdi_id = uuid5(NAMESPACE_URL, "hami-mig:" + ",".join(mig_uuids)).hex
    envs, mounts, annotations, cdi_devices = _visible_devices(mig_uuids, config, cdi_id)
    return ContainerResponse(envs, tuple(mounts), annotations, tuple(cdi_devices))


@dataclass(frozen=True, slots=True)
class _Request:
    """One kubelet container request, checked against the pod and its allocation entry."""

    key: str
    uid: str
    container: Mapping[str, Any]
    name: str
    what: str
    slices: tuple[GPUSlice, ...]
    kubelet_gpus: tuple[str, ...]

    def check_gpus(self, gpus: Sequence[GPULike]) -> None:
        """The scheduler's GPUs must be on this node and healthy."""
        by_uuid = {gpu.uuid: gpu for gpu in gpus}
        for s in self.slices:
            gpu = by_uuid.get(s.uuid)
            if gpu is None:
                raise UnknownDeviceError(
                    f"{self.what}: assigned GPU {s.uuid}, which this node does not have", self.key
                )
            if not gpu.healthy:
                raise UnhealthyGPUError(f"{self.what}: assigned GPU {s.uuid}, which is unhealthy", self.key)

    def mismatch(self, why: str) -> DeviceMismatchError:
        scheduled = tuple(s.uuid for s in self.slices)
        return DeviceMismatchError(
            f"{self.what}: kubelet chose device(s) on GPU(s) {', '.join(self.kubelet_gpus)}, but the "
            f"scheduler placed the container on {', '.join(scheduled)}; {why}. Refusing to give the "
            "container GPUs other than the ones kubelet records (its checkpoint and PodResources)",
            self.key,
            self.name,
            self.kubelet_gpus,
            scheduled,
        )


def _container_request(
    pod: Mapping[str, Any],
    allocation: PodAllocation,
    entry: int,
    device_ids: Sequence[str],
    gpus: Sequence[GPULike],
) -> _Request:
    key, uid = _pod_identity(pod)
    try:
        containers = pod_containers(pod)
    except RequestError as err:
        raise AllocationError(f"pod {key}: {err}", key) from None
    if not 0 <= entry < len(allocation.containers) or not allocation.containers[entry].devices:
        raise AllocationError(f"pod {key}: allocation entry {entry} has no GPUs to allocate", key)
    if entry >= len(containers):
        raise AllocationError(
            f"pod {key}: its allocation names GPUs for container #{entry}, but the pod has only "
            f"{len(containers)} containers",
            key,
        )
    container = containers[entry][0]
    name = str(container.get("name", "?"))
    what = f"pod {key}, {'init container' if containers[entry][1] else 'container'} {name!r}"
    slices = allocation.containers[entry].devices
    if len(device_ids) != len(slices):
        raise CountMismatchError(
            f"{what}: the scheduler assigned {len(slices)} GPU(s) but kubelet asked for "
            f"{len(device_ids)} device(s)",
            key,
        )
    known = {gpu.uuid for gpu in gpus}
    kubelet_gpus: list[str] = []
    for device_id in device_ids:
        try:
            kubelet_gpus.append(parse_virtual_device_id(device_id, known)[0])
        except InvalidDeviceID as err:
            raise UnknownDeviceError(f"{what}: kubelet {err}", key) from None
    return _Request(key, uid, container, name, what, slices, tuple(kubelet_gpus))


def grant_container(
    pod: Mapping[str, Any],
    pending: PendingPod,
    entry: int,
    device_ids: Sequence[str],
    *,
    gpus: Sequence[GPULike],
) -> ContainerAllocation:
    """The slices the container of `entry` really gets for the devices kubelet chose: the scheduler's
    slices, on kubelet's GPUs (in kubelet's order).

    When kubelet's GPUs are the scheduler's, that is the scheduler's choice. When they differ (kubelet
    took, from the pod's pool of init devices, others than the scheduler expected: `hami_api.containers`),
    the move is accepted only if the pod then holds no more on any GPU than the scheduler accounted for
    it (`footprint_growth` against `pending.allocation`); else `DeviceMismatchError`. Also raises what
    `container_allocate_response` raises for a malformed request.
    """
    req = _container_request(pod, pending.current, entry, device_ids, gpus)
    req.check_gpus(gpus)
    left = list(req.slices)
    placed: list[GPUSlice | None] = []
    for uuid in req.kubelet_gpus:
        same = next((s for s in left if s.uuid == uuid), None)
        if same is not None:
            left.remove(same)
        placed.append(same)
    if not left:
        return ContainerAllocation(tuple(s for s in placed if s is not None))
    moved = iter(left)
    out = tuple(
        s if s is not None else replace(next(moved), uuid=uuid)
        for s, uuid in zip(placed, req.kubelet_gpus, strict=True)
    )
    granted = ContainerAllocation(out)
    try:
        kinds = pod_container_kinds(pod)
    except RequestError as err:
        raise AllocationError(f"pod {req.key}: {err}", req.key) from None
    after = pending.with_allocated(entry, granted).current
    grown = footprint_growth(after, pending.allocation, kinds)
    if grown:
        raise req.mismatch(
            "moving it there would make the pod hold more than the scheduler accounted for it ("
            + "; ".join(grown)
            + ")"
        )
    return granted


def _mps_client(config: NodeConfig, started: bool, what: str, key: str) -> tuple[dict[str, str], list[Mount]]:
    """Operating mode mps: the env and mounts that connect a container to the MPS control daemon under
    `config.mps_root` (NVIDIA's device plugin's, `hami_node.mps`). `started`: the daemon's .started
    file exists; without it the container must not start (`AllocationError`)."""
    if config.mps_root is None:
        raise ValueError("operating mode mps without an MPS root")
    resource = config.resource_name
    if not started:
        raise AllocationError(
            f"{what}: operating mode mps, but the MPS control daemon for {resource} is not running "
            f"({mps.started_file(config.mps_root, resource)} does not exist)",
            key,
        )
    pipe = mps.pipe_dir(mps.CONTAINER_ROOT, resource)
    return {mps.PIPE_DIRECTORY_ENV: pipe}, [
        Mount(pipe, mps.pipe_dir(config.mps_root, resource), False),
        Mount(mps.CONTAINER_SHM, mps.shm_dir(config.mps_root), False),
    ]


# --- HAMi-core's env and mounts (the device plugin's Allocate and the DRA plugin's CDI edits) ----------

MEMORY_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT"
"""HAMi-core's memory limit: `_<i>` per device (the CUDA index in the container), `<MiB>m`."""
SM_LIMIT_ENV = "CUDA_DEVICE_SM_LIMIT"
"""HAMi-core's compute limit in percent: the default for every device; `_<i>` per device wins when > 0
(HAMi-core `do_init_device_sm_limits`)."""
SHARED_CACHE_ENV = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
"""The file HAMi-core keeps its shared accounting region in (one per container, or per DRA claim)."""


def vgpu_dir(config: NodeConfig) -> str:
    """`<hook>/vgpu`: HAMi-core's directory, the same path on the host and in containers."""
    return posixpath.join(config.hook_path, "vgpu")


def memory_limit_env(index: int) -> str:
    return f"{MEMORY_LIMIT_ENV}_{index}"


def sm_limit_env(index: int) -> str:
    return f"{SM_LIMIT_ENV}_{index}"


def memory_limit(mib: int) -> str:
    """A CUDA_DEVICE_MEMORY_LIMIT value: MiB with HAMi-core's `m` suffix."""
    return f"{mib}m"


def hami_core_env(config: NodeConfig) -> dict[str, str]:
    """The env every HAMi-core container gets besides its limits: LIBCUDA_LOG_LEVEL, CUDA_OVERSUBSCRIBE
    when memory is oversubscribed, GPU_CORE_UTILIZATION_POLICY=disable when the core limit is off."""
    envs: dict[str, str] = {}
    if config.device_memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    envs["LIBCUDA_LOG_LEVEL"] = str(config.lib_cuda_log_level)
    if config.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    return envs


def hami_core_mounts(
    config: NodeConfig,
    cache_dir: Mount,
    *,
    lib_path: str | None = None,
    preload: bool = True,
    license_present: bool = False,
) -> list[Mount]:
    """HAMi-core's mounts, in HAMi's order: libvgpu.so (ro; host `lib_path`, default
    `<hook>/vgpu/libvgpu.so`), the directory holding the shared cache (`cache_dir`), /tmp/vgpulock (rw),
    /etc/ld.so.preload from `<hook>/vgpu/ld.so.preload` (ro; unless `preload` is off: the container set
    CUDA_DISABLE_CONTROL), and with `license_present` HAMi's license and validator (ro)."""
    vgpu = vgpu_dir(config)
    mounts = [
        Mount(f"{vgpu}/libvgpu.so", lib_path or f"{vgpu}/libvgpu.so", True),
        cache_dir,
        Mount(VGPU_LOCK_DIR, VGPU_LOCK_DIR, False),
    ]
    if preload:
        mounts.append(Mount(LD_SO_PRELOAD, f"{vgpu}/ld.so.preload", True))
    if license_present:
        mounts.append(Mount("/tmp/license", f"{vgpu}/license", True))
        mounts.append(Mount("/usr/bin/vgpuvalidator", f"{vgpu}/vgpuvalidator", True))
    return mounts


def container_allocate_response(
    pod: Mapping[str, Any],
    allocation: PodAllocation,
    entry: int,
    device_ids: Sequence[str],
    *,
    gpus: Sequence[GPULike],
    config: NodeConfig,
    cache_id: str,
    cdi_id: str | None = None,
    lib_path: str | None = None,
    license_present: bool = False,
    mps_started: bool = False,
) -> ContainerResponse:
    """HAMi's response for the container of allocation entry `entry` (init containers first).

    `pod` is the pod as Kubernetes JSON; `device_ids` the virtual IDs kubelet sent; `gpus` this node's
    GPUs with their current health; `cache_id` a fresh uuid4 string (the container's
    CUDA_DEVICE_MEMORY_SHARED_CACHE file name); `cdi_id` the CDI annotation id (default `cache_id`);
    `lib_path` the host path of libvgpu.so (HAMi prefers `<hook>/vgpu/libvgpu.so.<version>` when that
    exists; default `<hook>/vgpu/libvgpu.so`); `license_present` whether `<hook>/vgpu/license` exists;
    `mps_started` (operating mode mps) whether the MPS control daemon's .started file exists.

    `allocation` is the pod's allocation as it stands (`PendingPod.current`, after `grant_container`):
    kubelet's devices must be on the entry's GPUs.

    Raises `CountMismatchError`, `UnknownDeviceError`, `DeviceMismatchError`, `UnhealthyGPUError` or
    `AllocationError`.
    """
    req = _container_request(pod, allocation, entry, device_ids, gpus)
    uid, container, name = req.uid, req.container, req.name
    slices = req.slices
    req.check_gpus(gpus)
    if sorted(req.kubelet_gpus) != sorted(s.uuid for s in slices):
        raise req.mismatch("the allocation names other GPUs")

    uuids = list(dict.fromkeys(s.uuid for s in slices))
    if not cache_id or "/" in cache_id:
        raise ValueError(f"cache id {cache_id!r} is not a file name")
    cdi = cache_id if cdi_id is None else cdi_id
    if config.uses_cdi and (
        not _CDI_NAME.fullmatch(f"{CDI_PLUGIN_NAME}_{cdi}") or len(CDI_PLUGIN_NAME) + 1 + len(cdi) > 63
    ):
        raise ValueError(f"CDI annotation id {cdi!r} does not make a valid annotation key")
    envs, mounts, annotations, cdi_devices = _visible_devices(uuids, config, cdi)

    vgpu = vgpu_dir(config)
    for i, s in enumerate(slices):
        envs[memory_limit_env(i)] = memory_limit(s.usedmem)
    envs[SM_LIMIT_ENV] = str(slices[0].usedcores)
    envs[SHARED_CACHE_ENV] = f"{vgpu}/{cache_id}.cache"
    envs.update(hami_core_env(config))
    cache_dir = Mount(vgpu, f"{vgpu}/containers/{uid}_{name}", False)
    mounts.extend(
        hami_core_mounts(
            config,
            cache_dir,
            lib_path=lib_path,
            preload=not _disables_control(container),
            license_present=license_present,
        )
    )
    if config.operating_mode is OperatingMode.MPS:
        mps_envs, mps_mounts = _mps_client(config, mps_started, req.what, req.key)
        envs.update(mps_envs)
        mounts.extend(mps_mounts)
    return ContainerResponse(envs, tuple(mounts), annotations, tuple(cdi_devices))


def container_cache_dir(config: NodeConfig, pod_uid: str, container_name: str) -> str:
    """The host directory mounted at `<hook>/vgpu` for one container; the caller (re)creates it, mode
    0777, before answering Allocate, as HAMi does."""
    return f"{vgpu_dir(config)}/containers/{pod_uid}_{container_name}"


# --- GetPreferredAllocation --------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _gpu_of(device_id: str) -> str:
    """The GPU of a `<GPU-UUID>-<n>` or `<GPU-UUID>::<n>` ID (an ID of neither form is its own GPU).
    Cached: every GetPreferredAllocation names the node's IDs again (80 with 8 GPUs split 10)."""
    parts = split_virtual_device_id(device_id)
    return device_id if parts is None else parts[0]


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    desired_gpus: Sequence[str] = (),
    listed: Iterable[str] = (),
) -> tuple[str, ...]:
    """Exactly `size` distinct IDs from `available`, `must_include` first.

    Steering: for each GPU in `desired_gpus` (the GPUs the scheduler chose for the container, see
    `steering_gpus`; one entry per device) an available ID on that GPU is taken, unless a must-include
    ID already covers it (a desired GPU with no available ID is left to the spread). The rest is
    spread: each pick goes to the GPU picked least in this round (must-include IDs count), then the one
    with the fewest replicas in use (counted against `listed`, all advertised IDs, when given; else the
    one with the most available IDs), then the first in `available` order.
    """
    avail = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    avail_set = set(avail)
    missing = [m for m in must if m not in avail_set]
    if missing:
        raise PreferredAllocationError(f"must-include devices {missing} are not among the available ones")
    if not len(must) <= size <= len(avail):
        raise PreferredAllocationError(
            f"cannot choose {size} devices from {len(avail)} available with {len(must)} required"
        )

    selected = list(must)
    chosen = set(must)
    free: dict[str, list[str]] = {}
    for device_id in avail:
        if device_id not in chosen:
            free.setdefault(_gpu_of(device_id), []).append(device_id)
    order = {gpu: i for i, gpu in enumerate(dict.fromkeys(_gpu_of(d) for d in avail))}
    listed_count = Counter(_gpu_of(d) for d in listed)
    avail_count = Counter(_gpu_of(d) for d in avail)
    in_use = {
        gpu: (listed_count[gpu] - avail_count[gpu]) if listed_count else -avail_count[gpu] for gpu in order
    }
    picked = Counter(_gpu_of(m) for m in must)

    def take(gpu: str) -> None:
        device_id = free[gpu].pop(0)
        selected.append(device_id)
        picked[gpu] += 1

    covered = Counter(picked)
    for gpu in desired_gpus:
        if len(selected) >= size:
            break
        if covered[gpu] > 0:
            covered[gpu] -= 1
        elif free.get(gpu):
            take(gpu)
    while len(selected) < size:
        gpu = min(
            (g for g, ids in free.items() if ids),
            key=lambda g: (picked[g], in_use[g], order[g]),
        )
        take(gpu)
    return tuple(selected)


__all__ = [
    "CDI_KIND",
    "CDI_PLUGIN_NAME",
    "MEMORY_LIMIT_ENV",
    "REASON_GPU_MISMATCH",
    "REASON_GPU_REASSIGNED",
    "SHARED_CACHE_ENV",
    "SM_LIMIT_ENV",
    "VISIBLE_DEVICES_ENV",
    "VOLUME_MOUNTS_ROOT",
    "AllocationError",
    "AmbiguousPodError",
    "ContainerResponse",
    "CountMismatchError",
    "DeviceMismatchError",
    "ForeignPodError",
    "GPULike",
    "InvalidDeviceID",
    "Mount",
    "NoPendingPod",
    "NoPendingPodError",
    "NodeGPU",
    "PendingPod",
    "PodMatch",
    "PreferredAllocationError",
    "UnhealthyGPUError",
    "UnknownDeviceError",
    "VirtualDevice",
    "container_allocate_response",
    "container_cache_dir",
    "grant_container",
    "hami_core_env",
    "hami_core_mounts",
    "list_virtual_devices",
    "match_pending_pod",
    "memory_limit",
    "memory_limit_env",
    "parse_virtual_device_id",
    "preferred_allocation",
    "same_slices",
    "sm_limit_env",
    "split_virtual_device_id",
    "steering_gpus",
    "to_proto",
    "vgpu_dir",
    "virtual_device_id",
    "virtual_devices_to_proto",
]
