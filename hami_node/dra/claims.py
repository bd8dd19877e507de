"""Pure core of NodePrepareResources: a ResourceClaim's allocation -> HAMi-core limits -> the claim's CDI
spec. No I/O: the caller passes the claim and pod objects it read, this node's GPUs, the claims already
prepared and the config, and gets data back (`prepare.ClaimPreparer` does the reads and writes).

**From allocation to limits.** Of `status.allocation.devices.results`, the results whose driver is ours
and whose pool is this node's are this node's shares (`allocation_shares`); each names a device
(`hami-gpu-<minor>`), a `shareID` when the device allows multiple allocations, and `consumedCapacity`
(`memory` in bytes, `cores` in percent; a result without it is a whole GPU: the cluster has no
consumable capacity, so the device was exclusive). A GPU's limits within a claim are the sum of the
claim's shares on it: `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m` and `CUDA_DEVICE_SM_LIMIT_<i>=<cores>`, the
whole GPU's memory and 100 cores for a whole GPU.

**The index `<i>`.** HAMi-core reads `_<i>` as the CUDA device index in the container. A container sees
the GPUs whose device nodes its claims inject, and CUDA numbers them by PCI bus id (the spec sets
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA's default "fastest first" never reorders them). So `<i>` is the
rank of the GPU, by PCI bus id (then minor), among the GPUs the container sees (`gpu_order`); HAMi's
DRA driver numbers them in Go map order instead. The plugin sees claims, not containers: kubelet injects
a claim's CDI devices into every container naming the claim, so a claim's env must be right for each of
them. Hence (`assign_indices`):

- a claim's GPUs are numbered 0..n-1 in that order (its own view) unless it is *pod-private* (created
  for one pod from a ResourceClaimTemplate: a Pod is its controller), when the containers of its pod
  decide: with two such claims in one container the second claim's GPUs follow the first's, so their
  indices agree by construction;
- every container of the pods the claim is reserved for (read from the API server before preparing) is
  checked: each of its HAMi claims must give each GPU it injects the index the container sees it at.
  A container combining claims whose indices cannot agree (a shared claim, whose indices must stay its
  own for the other pods using it; a container naming one request of a multi-GPU claim; two claims
  giving one container shares of the same GPU, which HAMi-core limits once) gets a per-claim error
  naming the pod, the container and the claims, and what to write instead.

A pod started later with an already prepared shared claim causes no prepare call, so it is not checked:
a shared claim keeps its own indices, right for any container that uses it alone.

`CUDA_DEVICE_SM_LIMIT` (the default for every device) is set too when every container using the claim
sees one GPU. `CUDA_DEVICE_MEMORY_SHARED_CACHE` is one file per claim, `<hook>/vgpu/claims/<uid>/
<uid>.cache` (the claim's directory, mounted read-write at the same path): HAMi-core keeps one shared
region per process for all its devices, so a value per device would overwrite itself in a container
with several GPUs; the containers (and pods) sharing a claim share its region, as they share its limits.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_api import dra
from hami_api.errors import QuantityError
from hami_api.quantity import quantity_value
from hami_node.allocation import (
    SHARED_CACHE_ENV,
    SM_LIMIT_ENV,
    Mount,
    hami_core_env,
    hami_core_mounts,
    memory_limit,
    memory_limit_env,
    sm_limit_env,
    vgpu_dir,
)
from hami_node.cdi import VISIBLE_DEVICES_VOID, build_claim_spec, claim_device_id, device_node
from hami_node.config import NodeConfig
from hami_node.devices import GPUStatus, advertised_memory_mib

MIB = dra.MIB
WHOLE = "whole"
"""The CDI device name's last part for a result without a share ID (an exclusive device)."""
DEVICE_ORDER_ENV = "CUDA_DEVICE_ORDER=PCI_BUS_ID"
"""CUDA numbers devices by PCI bus id, as the limits' indices do (its default puts the fastest first)."""
MOUNT_OPTIONS_RO = ("ro", "nosuid", "nodev", "bind")
MOUNT_OPTIONS_RW = ("rw", "nosuid", "nodev", "bind")


class ClaimError(Exception):
    """One claim cannot be prepared; the message names the claim and says why (kubelet shows it)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Share:
    """One allocation result of ours: `memory_bytes` / `cores` are its consumed capacity, None when the
    result has none (a whole GPU)."""

    request: str
    device: str
    share_id: str | None = None
    memory_bytes: int | None = None
    cores: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimGpu:
    """What the prepare core needs of one of this node's GPUs; `memory_mib` is what a whole-GPU
    allocation gets (the memory capacity the slice publishes)."""

    device: str
    uuid: str
    minor: int
    pci_bus_id: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class MigRecord:
    """The MIG device behind a prepared MIG partition: its GPU instance on the parent GPU (what
    Unprepare destroys), and its MIG UUID (what the container sees)."""

    parent_uuid: str
    gpu_instance_id: int
    uuid: str
    profile: str
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One result as prepared: the GPU, its container-visible `index`, the claim's limits on that GPU
    (the sum of the claim's shares on it), and the CDI device defined for the result. A MIG partition
    (`mig` set) has no HAMi-core limits: `memory_mib` is the MIG device's, `cores` 100."""

    request: str
    device: str
    share_id: str | None
    gpu: str
    minor: int
    index: int
    memory_mib: int
    cores: int
    cdi_name: str
    mig: MigRecord | None = None

    @property
    def cdi_id(self) -> str:
        return claim_device_id(self.cdi_name)


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim as prepared (what the checkpoint keeps): `sole` says whether the claim's CDI edits also
    set the default `CUDA_DEVICE_SM_LIMIT` (every container using it sees one GPU); `private` whether it
    belongs to one pod (its indices may follow that pod's containers)."""

    namespace: str
    name: str
    uid: str
    pool: str
    devices: tuple[PreparedDevice, ...]
    sole: bool = False
    private: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def indices(self) -> dict[str, int]:
        """device name -> its container-visible index."""
        return {d.device: d.index for d in self.devices}

    def uses(self, request: str | None) -> tuple[str, ...]:
        """The devices a container naming this claim (and `request`, when given) gets, in result order."""
        return tuple(dict.fromkeys(d.device for d in self.devices if request is None or d.request == request))

    @property
    def mig(self) -> tuple[MigRecord, ...]:
        """The MIG devices the claim holds (empty for a claim of GPU shares)."""
        return tuple(d.mig for d in self.devices if d.mig is not None)


# --- reading a claim ---------------------------------------------------------------------------------------


_MAX_SHOWN = 80


def _shown(value: object) -> str:
    """A value from the claim for a message: repr, shortened; a value nested past the recursion limit
    (the API server's JSON may nest 1,024 levels, repr() stops near 1,000) by its type."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep to show>"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def base_request(name: str) -> str:
    """The request a result or a container's claim reference names: `r` of a sub-request `r/s`
    (k8s.io/dynamic-resource-allocation resourceclaim.BaseRequestRef)."""
    return name.split("/", 1)[0]


def check_claim(claim: Mapping[str, Any], ref: ClaimRef) -> None:
    """The claim read for `ref` must be the one kubelet means and be allocated (the upstream helper's
    checks, kubeletplugin/draplugin.go getResourceClaims). Raises `ClaimError`."""
    uid = _map(claim.get("metadata")).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref.key} got replaced: its UID is {_shown(uid)}, kubelet asked for {ref.uid}"
        )
    if not _map(_map(claim.get("status")).get("allocation")):
        raise ClaimError(f"claim {ref.key} is not allocated")


def _capacity(consumed: Mapping[str, Any], name: str, driver: str) -> object | None:
    """A consumed capacity by its plain or driver-qualified name."""
    value: object | None = consumed.get(name)
    return value if value is not None else consumed.get(dra.qualified(name, driver))


def _quantity(value: object, what: str) -> int:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ClaimError(f"{what}: expected a quantity, got {_shown(value)}")
    try:
        return quantity_value(value)
    except QuantityError as err:
        raise ClaimError(f"{what}: {err}") from None


def _share(result: Mapping[str, Any], where: str, driver: str) -> Share:
    device = result.get("device")
    request = result.get("request")
    if not isinstance(device, str) or not device:
        raise ClaimError(f"{where}.device: expected a device name, got {_shown(device)}")
    if not isinstance(request, str) or not request:
        raise ClaimError(f"{where}.request: expected a request name, got {_shown(request)}")
    share_id = result.get("shareID")
    if share_id is not None and (not isinstance(share_id, str) or not share_id):
        raise ClaimError(f"{where}.shareID: expected a share ID, got {_shown(share_id)}")
    consumed = result.get("consumedCapacity")
    memory: int | None = None
    cores: int | None = None
    if consumed is not None:
        if not isinstance(consumed, Mapping):
            raise ClaimError(f"{where}.consumedCapacity: expected a mapping, got {_shown(consumed)}")
        raw_memory = _capacity(consumed, dra.CAPACITY_MEMORY, driver)
        if raw_memory is not None:
            memory = _quantity(raw_memory, f"{where}.consumedCapacity.memory")
            if memory < MIB:
                raise ClaimError(
                    f"{where}.consumedCapacity.memory: {raw_memory} is less than 1Mi; HAMi-core reads a "
                    "0 MiB limit as no limit"
                )
        raw_cores = _capacity(consumed, dra.CAPACITY_CORES, driver)
        if raw_cores is not None:
            cores = _quantity(raw_cores, f"{where}.consumedCapacity.cores")
            if not 0 <= cores <= 100:
                raise ClaimError(f"{where}.consumedCapacity.cores: expected 0..100, got {raw_cores}")
    return Share(base_request(request), device, share_id, memory, cores)


def allocation_shares(claim: Mapping[str, Any], key: str, *, driver: str, pool: str) -> tuple[Share, ...]:
    """The claim's results for `driver` in `pool` (this node's), in result order. Raises `ClaimError`
    when there are none (allocated elsewhere, or to another driver only) or one is malformed."""
    devices = _map(_map(_map(claim.get("status")).get("allocation")).get("devices"))
    shares: list[Share] = []
    elsewhere: list[str] = []
    for i, result in enumerate(_list(devices.get("results"))):
        if not isinstance(result, Mapping) or result.get("driver") != driver:
            continue
        if result.get("pool") != pool:
            elsewhere.append(str(result.get("pool")))
            continue
        shares.append(_share(result, f"claim {key}: status.allocation.devices.results[{i}]", driver))
    if not shares:
        where = f" (pools {', '.join(sorted(set(elsewhere)))})" if elsewhere else ""
        raise ClaimError(f"claim {key} has no device of driver {driver} on this node's pool {pool}{where}")
    return tuple(shares)


def is_pod_private(claim: Mapping[str, Any]) -> bool:
    """Whether a Pod controls the claim: made for that pod from a ResourceClaimTemplate (the claim
    controller sets it as controller owner), so no other pod can use it."""
    for owner in _list(_map(claim.get("metadata")).get("ownerReferences")):
        if isinstance(owner, Mapping) and owner.get("kind") == "Pod" and owner.get("controller") is True:
            return owner.get("apiVersion") == "v1"
    return False


def reserved_pods(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pods in `status.reservedFor`, as (name, uid)."""
    out: list[tuple[str, str]] = []
    for entry in _list(_map(claim.get("status")).get("reservedFor")):
        if not isinstance(entry, Mapping) or entry.get("resource") != "pods" or entry.get("apiGroup"):
            continue
        name, uid = entry.get("name"), entry.get("uid")
        if isinstance(name, str) and isinstance(uid, str):
            out.append((name, uid))
    return tuple(out)


# --- GPUs and their order --------------------------------------------------------------------------------


def claim_gpus(gpus: Iterable[GPUStatus], config: NodeConfig) -> dict[str, ClaimGpu]:
    """This node's GPUs by device name (`hami_api.dra.device_name(minor)`); a whole GPU's memory is the
    advertised memory (`devices.advertised_memory_mib`, what the slice publishes). A GPU in MIG mode is
    not one: only its partitions are published (`slices.node_slice_specs`)."""
    out: dict[str, ClaimGpu] = {}
    for gpu in gpus:
        if gpu.info.mig_enabled:
            continue
        name = dra.device_name(gpu.info.minor)
        out[name] = ClaimGpu(
            name, gpu.uuid, gpu.info.minor, gpu.info.pci_bus_id, advertised_memory_mib(gpu.info, config)
        )
    return out


def check_devices(key: str, pool: str, shares: Iterable[Share], gpus: Mapping[str, ClaimGpu]) -> None:
    """Every share must be on one of this node's GPUs. Raises `ClaimError`."""
    for share in shares:
        if share.device not in gpus:
            raise ClaimError(
                f"claim {key}: device {share.device} of pool {pool} is not one of this node's GPUs"
            )


_PCI = re.compile(r"(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.([0-9A-Fa-f]+)")


def gpu_order(gpu: ClaimGpu) -> tuple[tuple[int, ...], str, int]:
    """The order CUDA (with CUDA_DEVICE_ORDER=PCI_BUS_ID) and NVML number GPUs in: by PCI bus id
    (domain, bus, device, function as numbers), then minor; an id that does not parse sorts by its text
    after those that do."""
    match = _PCI.fullmatch(gpu.pci_bus_id.strip())
    if match is None:
        return (1 << 64,), gpu.pci_bus_id, gpu.minor
    numbers = tuple(int(part or "0", 16) for part in match.groups())
    return numbers, "", gpu.minor


# --- indices ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerUse:
    """One container naming HAMi claims of ours: (claim UID, request or None for the whole claim)."""

    pod: str
    container: str
    claims: tuple[tuple[str, str | None], ...]


def _pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entry name -> the ResourceClaim's object name (`resourceClaimName`, or for a
    template the generated name in `status.resourceClaimStatuses`)."""
    names: dict[str, str] = {}
    for entry in _list(_map(pod.get("spec")).get("resourceClaims")):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            claim = entry.get("resourceClaimName")
            if isinstance(claim, str) and claim:
                names[entry["name"]] = claim
    for status in _list(_map(pod.get("status")).get("resourceClaimStatuses")):
        if isinstance(status, Mapping) and isinstance(status.get("name"), str):
            claim = status.get("resourceClaimName")
            if isinstance(claim, str) and claim:
                names.setdefault(status["name"], claim)
    return names


def claim_names_resolved(pod: Mapping[str, Any]) -> bool:
    """Whether every claim the pod asks through a template has its entry in
    `status.resourceClaimStatuses` (the claim controller writes it once it made the claim; the scheduler
    waits for it). The pod's other claim references are immutable (`spec.resourceClaims`, the
    containers' `resources.claims`), so a copy of the pod with this UID that has these entries names
    the same claims as the pod read now."""
    statuses = {
        s.get("name")
        for s in _list(_map(pod.get("status")).get("resourceClaimStatuses"))
        if isinstance(s, Mapping)
    }
    return all(
        entry.get("name") in statuses
        for entry in _list(_map(pod.get("spec")).get("resourceClaims"))
        if isinstance(entry, Mapping) and entry.get("resourceClaimTemplateName")
    )


def container_uses(pod: Mapping[str, Any], claims_by_name: Mapping[str, str]) -> tuple[ContainerUse, ...]:
    """The pod's init and app containers that name claims of `claims_by_name` (object name -> UID, the
    pod's namespace's claims of ours), with the claims they name."""
    meta = _map(pod.get("metadata"))
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    names = _pod_claim_names(pod)
    spec = _map(pod.get("spec"))
    out: list[ContainerUse] = []
    for container in [*_list(spec.get("initContainers")), *_list(spec.get("containers"))]:
        if not isinstance(container, Mapping):
            continue
        refs: list[tuple[str, str | None]] = []
        for ref in _list(_map(container.get("resources")).get("claims")):
            if not isinstance(ref, Mapping):
                continue
            uid = claims_by_name.get(names.get(str(ref.get("name")), ""))
            request = ref.get("request")
            if uid is not None:
                refs.append((uid, base_request(request) if isinstance(request, str) and request else None))
        if refs:
            out.append(ContainerUse(key, str(container.get("name", "?")), tuple(dict.fromkeys(refs))))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """A claim to number: `uses(request)` gives the devices a container naming it gets; `fixed` holds the
    indices of a claim already prepared (they cannot change); `private` as `PreparedClaim.private`."""

    key: str
    devices: tuple[tuple[str, str], ...]
    """(request, device) per result, in result order."""
    private: bool = False
    fixed: Mapping[str, int] | None = None

    def uses(self, request: str | None) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for r, d in self.devices if request is None or r == request))


@dataclass(frozen=True, slots=True)
class Indices:
    """`assign_indices`' answer: per claim UID its device -> index and whether it is `sole`, or an error."""

    indices: dict[str, dict[str, int]] = field(default_factory=dict)
    sole: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def _ranked(devices: Iterable[str], order: Mapping[str, tuple[Any, ...]]) -> dict[str, int]:
    return {d: i for i, d in enumerate(sorted(dict.fromkeys(devices), key=lambda d: order[d]))}


def _view(
    use: ContainerUse, plans: Mapping[str, ClaimPlan], order: Mapping[str, tuple[Any, ...]]
) -> dict[str, int] | str:
    """The container's GPUs -> the index it sees each at, or why it cannot get consistent limits."""
    owner: dict[str, str] = {}
    for uid, request in use.claims:
        for device in plans[uid].uses(request):
            if owner.setdefault(device, uid) != uid:
                return (
                    f"container {use.container!r} of pod {use.pod} gets GPU {device} from claims "
                    f"{plans[owner[device]].key} and {plans[uid].key}; HAMi-core has one limit per GPU, "
                    "so put both shares in one claim"
                )
    return _ranked(owner, order)


def _combination_error(use: ContainerUse, plans: Mapping[str, ClaimPlan]) -> str:
    names = ", ".join(
        plans[uid].key + (f" (request {request!r})" if request is not None else "")
        for uid, request in use.claims
    )
    return (
        f"container {use.container!r} of pod {use.pod} uses {names}: the GPU indices of HAMi-core's "
        "limits (CUDA_DEVICE_MEMORY_LIMIT_<i>) cannot agree with the order the container sees its GPUs in. "
        "A claim shared with other pods, or one already prepared, keeps its own indices 0..n-1, and a "
        "container naming one request of a claim sees only some of its GPUs: give the container one "
        "claim with all its GPUs (several requests in one claim), or claims made for the pod from "
        "ResourceClaimTemplates"
    )


def assign_indices(
    plans: Mapping[str, ClaimPlan], uses: Sequence[ContainerUse], order: Mapping[str, tuple[Any, ...]]
) -> Indices:
    """The container-visible index of every device of every claim in `plans` that has no `fixed`
    indices (see the module docstring), checked against every container in `uses`. `order` gives each
    device's sort key (`gpu_order`). Errors are per claim, for the claims being prepared."""
    result = Indices()
    views: list[tuple[ContainerUse, dict[str, int] | str]] = [(u, _view(u, plans, order)) for u in uses]
    for uid, plan in plans.items():
        if plan.fixed is not None:
            continue
        chosen = _ranked(plan.uses(None), order)
        seen_by: list[tuple[ContainerUse, dict[str, int]]] = [
            (u, v) for u, v in views if isinstance(v, dict) and any(c == uid for c, _ in u.claims)
        ]
        if plan.private and seen_by:
            from_containers: dict[str, int] = {}
            for use, seen in seen_by:
                for device in (d for c, r in use.claims if c == uid for d in plan.uses(r)):
                    from_containers.setdefault(device, seen[device])
            chosen.update(from_containers)
        result.indices[uid] = chosen
        counts = {len(seen) for _, seen in seen_by}
        result.sole[uid] = counts == {1} if seen_by else len(chosen) == 1

    def index_of(uid: str) -> Mapping[str, int]:
        fixed = plans[uid].fixed
        return fixed if fixed is not None else result.indices[uid]

    for use, view in views:
        if isinstance(view, str):
            message = view
        elif all(
            index_of(uid).get(d) == view[d] for uid, request in use.claims for d in plans[uid].uses(request)
        ):
            continue
        else:
            message = _combination_error(use, plans)
        for uid, _ in use.claims:
            if plans[uid].fixed is None:
                result.errors.setdefault(uid, message)
    for uid in result.errors:
        result.indices.pop(uid, None)
        result.sole.pop(uid, None)
    return result


# --- limits and the prepared claim ----------------------------------------------------------------------


def gpu_limits(shares: Sequence[Share], gpu: ClaimGpu) -> tuple[int, int]:
    """The claim's (memory MiB, cores) on one GPU: the sum of its shares there (a share without consumed
    capacity is the whole GPU: its memory and 100 cores), capped at the GPU's memory and 100 cores."""
    memory = 0
    cores = 0
    for share in shares:
        memory += gpu.memory_mib if share.memory_bytes is None else share.memory_bytes // MIB
        cores += 100 if share.cores is None else share.cores
    return min(memory, gpu.memory_mib) if gpu.memory_mib > 0 else memory, min(cores, 100)


def cdi_device_name(claim_uid: str, device: str, share_id: str | None) -> str:
    """`<claimUID>-<device>-<shareID or whole>`: unique per claim and result, never reused."""
    return f"{claim_uid}-{device}-{share_id or WHOLE}"


def prepare_claim(
    ref: ClaimRef,
    pool: str,
    shares: Sequence[Share],
    gpus: Mapping[str, ClaimGpu],
    indices: Mapping[str, int],
    *,
    sole: bool,
    private: bool,
) -> PreparedClaim:
    """The prepared form of one claim whose indices are chosen. Raises `ClaimError` for a device that
    is not one of `gpus` (this node's, by device name)."""
    check_devices(ref.key, pool, shares, gpus)
    by_device: dict[str, list[Share]] = {}
    for share in shares:
        by_device.setdefault(share.device, []).append(share)
    limits = {device: gpu_limits(group, gpus[device]) for device, group in by_device.items()}
    devices = tuple(
        PreparedDevice(
            request=share.request,
            device=share.device,
            share_id=share.share_id,
            gpu=gpus[share.device].uuid,
            minor=gpus[share.device].minor,
            index=indices[share.device],
            memory_mib=limits[share.device][0],
            cores=limits[share.device][1],
            cdi_name=cdi_device_name(ref.uid, share.device, share.share_id),
        )
        for share in shares
    )
    return PreparedClaim(ref.namespace, ref.name, ref.uid, pool, devices, sole=sole, private=private)


# --- the claim's CDI spec ----------------------------------------------------------------------------------


def claim_dir(config: NodeConfig, claim_uid: str) -> str:
    """`<hook>/vgpu/claims/<claimUID>`: the claim's directory on the host and in its containers."""
    return posixpath.join(vgpu_dir(config), "claims", claim_uid)


def shared_cache_file(config: NodeConfig, claim_uid: str) -> str:
    return posixpath.join(claim_dir(config, claim_uid), f"{claim_uid}.cache")


def cdi_mount(mount: Mount) -> dict[str, Any]:
    options = MOUNT_OPTIONS_RO if mount.read_only else MOUNT_OPTIONS_RW
    return {"hostPath": mount.host_path, "containerPath": mount.container_path, "options": list(options)}


def claim_spec(
    claim: PreparedClaim, config: NodeConfig, common_nodes: Sequence[str], *, license_present: bool = False
) -> dict[str, Any]:
    """The claim's transient CDI spec (`hami_node.cdi.build_claim_spec`): per result, the GPU's device node
    and the claim's limits on it under the GPU's index; common to the claim, the shared cache, HAMi-core's
    mounts (libvgpu.so ro, the claim's directory rw, /tmp/vgpulock rw, /etc/ld.so.preload ro), the
    control device nodes, NVIDIA_VISIBLE_DEVICES=void and CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    devices: list[tuple[str, dict[str, Any]]] = []
    for device in claim.devices:
        env = [
            f"{memory_limit_env(device.index)}={memory_limit(device.memory_mib)}",
            f"{sm_limit_env(device.index)}={device.cores}",
        ]
        if claim.sole:
            env.append(f"{SM_LIMIT_ENV}={device.cores}")
        devices.append((device.cdi_name, {"env": env, "deviceNodes": [{"path": device_node(device.minor)}]}))
    directory = claim_dir(config, claim.uid)
    mounts = hami_core_mounts(config, Mount(directory, directory, False), license_present=license_present)
    env = [
        f"{SHARED_CACHE_ENV}={shared_cache_file(config, claim.uid)}",
        VISIBLE_DEVICES_VOID,
        DEVICE_ORDER_ENV,
        *(f"{k}={v}" for k, v in hami_core_env(config).items()),
    ]
    common = {
        "env": env,
        "deviceNodes": [{"path": path} for path in common_nodes],
        "mounts": [cdi_mount(m) for m in mounts],
    }
    return build_claim_spec(devices, common)


def mig_claim_spec(claim: PreparedClaim, common_nodes: Sequence[str]) -> dict[str, Any]:
    """The CDI spec of a claim of MIG partitions: per partition its parent GPU's device node; common to
    the claim `NVIDIA_VISIBLE_DEVICES` with the MIG UUIDs (NVIDIA's container runtime hook resolves
    them to the GPU instance's capability nodes) and the control device nodes. No HAMi-core: MIG
    isolates memory and SMs in hardware. Raises `ClaimError` for a device without its MIG record."""
    devices: list[tuple[str, dict[str, Any]]] = []
    uuids: list[str] = []
    for device in claim.devices:
        if device.mig is None:
            raise ClaimError(f"claim {claim.key}: device {device.device} is not a prepared MIG partition")
        uuids.append(device.mig.uuid)
        devices.append((device.cdi_name, {"deviceNodes": [{"path": device_node(device.minor)}]}))
    common = {
        "env": [f"NVIDIA_VISIBLE_DEVICES={','.join(dict.fromkeys(uuids))}"],
        "deviceNodes": [{"path": path} for path in common_nodes],
    }
    return build_claim_spec(devices, common)


__all__ = [
    "DEVICE_ORDER_ENV",
    "WHOLE",
    "ClaimError",
    "ClaimGpu",
    "ClaimPlan",
    "ClaimRef",
    "ContainerUse",
    "Indices",
    "MigRecord",
    "PreparedClaim",
    "PreparedDevice",
    "Share",
    "allocation_shares",
    "assign_indices",
    "base_request",
    "cdi_device_name",
    "cdi_mount",
    "check_claim",
    "check_devices",
    "claim_dir",
    "claim_gpus",
    "claim_names_resolved",
    "claim_spec",
    "container_uses",
    "gpu_limits",
    "gpu_order",
    "is_pod_private",
    "mig_claim_spec",
    "prepare_claim",
    "reserved_pods",
    "shared_cache_file",
]
