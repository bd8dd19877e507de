"""The invariants the chaos checker holds the cluster to, over one `Snapshot` of what the API server and
the kubelet stand-ins' state files said. Pure: no I/O, no clock; `checker.InvariantChecker` reads the
snapshots and decides which findings persist long enough to be violations.

Each finding is a `Violation(kind, subject, message, evidence, at)`; the evidence names the pod, node
or GPU, the numbers, and which sources disagree. Kinds:

- `gpu-memory-overcommit`, `gpu-cores-overcommit`, `gpu-slots-overcommit` (subject `<node>/<gpu uuid>`
  or, DRA, `<pool>/<device>`): what live pods (phase neither Succeeded nor Failed, still in the API)
  hold on a GPU exceeds what its node registered (`hami.io/node-nvidia-register`: devmem MiB, devcore,
  count) or what its ResourceSlice offers (capacities `memory`, `cores`; one claim only on a device
  without `allowMultipleAllocations`). A pod holds its footprint (the most it holds at once: each
  regular init container with the sidecars started before it, then every sidecar and app container
  together), from `hami.io/vgpu-devices-allocated` on pods carrying `hami.io/vgpu-node`, as HAMi's
  scheduler counts it. Cores follow HAMi: a slice with 0 cores sets no limit and takes none; a slice
  with all of a 100-core GPU's cores (exclusive) shares the GPU with no other slot.
  DRA: every allocated claim's results on the device, `consumedCapacity` (none: the whole device).
- `container-gpu-mismatch`, `container-memory-mismatch` (subject `<ns>/<pod>/<container>`): for a
  container the runtime started (a record in `containers.json`) of a live pod, the GPUs kubelet
  recorded (`kubelet_internal_checkpoint`, or for DRA the claim's devices in `dra_manager_state`), the
  GPUs its env and device nodes name (`NVIDIA_VISIBLE_DEVICES`, the volume-mounts paths, CDI names
  `<vendor>/gpu=<uuid>` from the CRI field or `cdi.k8s.io/` annotations; DRA: `/dev/nvidia<minor>`)
  and the GPUs of its pod's annotation entry (DRA: its claims' allocation results) must be the same;
  `CUDA_DEVICE_MEMORY_LIMIT_<i>` must be the annotation's MiB on the i-th GPU (DRA: the claims'
  consumed memory, GPUs in PCI bus order).
- `bind-phase-stuck` (subject `<ns>/<pod>`): `hami.io/bind-phase=allocating` for longer than the bind
  timeout after `hami.io/bind-time`.
- `bound-without-allocation`: a live pod with `spec.nodeName` that asks a HAMi resource but carries no
  allocation annotation (the device-plugin path: kubelet cannot be told which GPU it has).
- `annotation-undecodable`: an annotation the checker cannot read (named in the message).
- `quota-exceeded` (subject the namespace): the namespace's live pods hold more GPU memory or cores
  than a ResourceQuota's `limits.nvidia.com/gpumem` / `limits.nvidia.com/gpucores` allows (the only
  keys HAMi honours; per pod max(sum of regular containers, largest init container), per-GPU values x
  GPUs; DRA pods: what their own claims ask per allocated device, a whole GPU's memory counting 0 MiB
  as hami-control counts a translated pod).
- `state-unreadable` (subject `<node>/<file>`): a kubelet state file that does not parse.

The other vendors (issue 26; each violation's evidence names its `vendor`), decoded with `decoding`'s
vendor decoders:

- `vendor-memory-overcommit`, `vendor-cores-overcommit`, `vendor-slots-overcommit` (subject
  `<node>/<device id>`): what live pods placed by HAMi (`hami.io/vgpu-node`) hold on a device, from each
  vendor's "-allocated" annotation, exceeds what its node's inventory says (devmem, devcore, count). A pod
  holds its footprint (the most it holds at once over its init phases, as for NVIDIA). Slots: one per
  share; an Enflame DRS share takes its profile's slices. Cores: a share with all of a 100-core device's
  cores shares it with no other (HAMi's exclusive rule; MetaX online pods, which record no cores, aside);
  AWS Neuron's cores are bit masks: two pods never hold the same core, nor a core the device lacks; AMD's
  compute units (`hami.io/amd-cu-allocated`, its plugin's record; subject `<node>/<id>/compute-units`)
  are held by one pod each, within the device's count.
- `vendor-device-missing` (subject `<ns>/<pod>`): a bound live pod's annotation names a device its node's
  inventory does not have (or HAMi placed it on another node than the one it is bound to).
- `bound-without-allocation` (as for NVIDIA): a bound live pod limits a vendor's count resource, its
  node has that vendor's devices, and it carries no "-allocated" annotation of the vendor.
- `vendor-kubelet-mismatch` (subject `<ns>/<pod>/<container>/<resource>`): for a container the runtime
  started, what kubelet's checkpoint holds for the vendor's resource disagrees with the annotation: as
  many device IDs as the container's shares (an Enflame share: its slices; AWS Neuron cores: the mask's
  bits; Cambricon: the 256 MiB units and percent its share holds; Mthreads: its vGPUs, and its cores and
  512 MiB units), each one a device the plugin
  registered (`RegisteredDevices`, when the resource has any) and, where the stand-in's IDs name a
  device (`Family.id_scheme`: Hygon, Ascend, Iluvatar, MetaX sGPU, Kunlun vXPU, AMD, Vastai, Biren), a
  device of the node. Which of the node's devices the IDs name need not be the annotation's: the vendors'
  plugins offer no GetPreferredAllocation, kubelet picks IDs on its own and the plugin answers Allocate
  from the annotation (`kubelet_device_disagreements` counts those, for the report).
- `vendor-container-mismatch` (subject `<ns>/<pod>/<container>`): the devices the Allocate answer gave the
  started container (its env's visible devices or its device nodes, by index through the node's
  inventory; AWS Neuron's cores; AMD's `HIP_DEVICE_MEMORY_LIMIT` and `HSA_CU_MASK` sizes) are not the
  annotation's.
- `annotation-undecodable`: a vendor inventory or pod annotation the checker cannot read.

At the end of a run (`final_findings`):
- `pod-not-settled`: a pod neither Running nor Succeeded without a reason a person can act on (Pending:
  a PodScheduled=False condition or a FailedScheduling event with its message, or a waiting container
  with reason and message; Failed: status reason and message, e.g. kubelet's UnexpectedAdmissionError,
  or a container that exited non-zero with a reason).
- `pod-in-bind-phase`: a live pod still `hami.io/bind-phase=allocating` (a pod kubelet rejected before
  Allocate keeps the annotation, but a Failed pod holds nothing: its reason is what matters).
- `allocation-leaked` (subject `<node>/<file>/<pod uid>` or `claim/<ns>/<name>/<pod uid>`): a kubelet
  checkpoint entry, a DRA checkpoint entry, a container record or a claim reservation for a pod the API
  server no longer has.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hami_sim.chaos.decoding import (
    AMD_CU_ALLOCATED,
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    METAX_APP_CLASS,
    MIB,
    NODE_REGISTER,
    VGPU_NODE,
    Allocation,
    ClaimEntry,
    ContainerRecord,
    DecodeError,
    DeviceEntry,
    Family,
    Gpu,
    Slice,
    VendorAllocation,
    VendorDevice,
    VendorSlice,
    allocated_without_bind_phase,
    decode_allocation,
    decode_amd_cu_allocated,
    decode_hsa_cu_mask,
    decode_register,
    decode_vendor_allocation,
    device_gpu,
    device_of_kubelet_id,
    enflame_slices,
    family_of_resource,
    neuron_core_mask,
    node_devices,
    parse_quantity,
    pod_vendor_allocations,
    runtime_devices,
)

JSON = Mapping[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
HAMI_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
QUOTA_MEMORY_KEY = "limits.nvidia.com/gpumem"
QUOTA_CORES_KEY = "limits.nvidia.com/gpucores"
DRA_DRIVER = "hami-core-gpu.project-hami.io"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
MEMORY_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT_"
TERMINAL = frozenset({"Succeeded", "Failed"})
_DEVICE_NODE = re.compile(r"/dev/nvidia([0-9]+)")
_LIMIT = re.compile(r"([0-9]+)([kKmMgG]?)")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its kind, what it is about, a sentence, the evidence, and when
    (the checker's clock) it was seen."""

    kind: str
    subject: str
    message: str
    evidence: dict[str, Any]
    at: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)


@dataclass(frozen=True)
class NodeFiles:
    """One kubelet stand-in's state files (None: the file does not exist)."""

    device_entries: tuple[DeviceEntry, ...] | None = None
    registered_devices: Mapping[str, tuple[str, ...]] | None = None
    """kubelet_internal_checkpoint's RegisteredDevices: resource -> the healthy device IDs registered."""
    claim_entries: tuple[ClaimEntry, ...] | None = None
    containers: tuple[ContainerRecord, ...] | None = None
    errors: Mapping[str, str] = field(default_factory=dict)
    """File name -> why it could not be read."""


@dataclass(frozen=True)
class Snapshot:
    """What the checker read in one pass. `wall_time` is Unix time (bind-time is in Unix seconds);
    `at` is the checker's clock."""

    pods: Sequence[JSON] = ()
    nodes: Sequence[JSON] = ()
    resource_claims: Sequence[JSON] = ()
    resource_slices: Sequence[JSON] = ()
    resource_quotas: Sequence[JSON] = ()
    kubelet: Mapping[str, NodeFiles] = field(default_factory=dict)
    events: Sequence[JSON] = ()
    wall_time: float = 0.0
    at: float = 0.0


class _Out:
    """Collects findings of one pass (first finding per key wins)."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.found: dict[tuple[str, str], Violation] = {}

    def add(self, kind: str, subject: str, message: str, **evidence: Any) -> None:
        self.found.setdefault((kind, subject), Violation(kind, subject, message, evidence, self.at))


# --- pods ---------------------------------------------------------------------------------------------------


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: JSON) -> JSON:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def _spec(obj: JSON) -> JSON:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: JSON) -> JSON:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def pod_key(pod: JSON) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_uid(pod: JSON) -> str:
    return str(_meta(pod).get("uid") or "")


def is_live(pod: JSON) -> bool:
    return _status(pod).get("phase") not in TERMINAL


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_containers(pod: JSON) -> list[tuple[JSON, str]]:
    """Every container in allocation order (init containers first) with its kind: init, sidecar, app."""
    out: list[tuple[JSON, str]] = []
    for c in _list(_spec(pod).get("initContainers")):
        if isinstance(c, Mapping):
            out.append((c, "sidecar" if c.get("restartPolicy") == "Always" else "init"))
    out.extend((c, "app") for c in _list(_spec(pod).get("containers")) if isinstance(c, Mapping))
    return out


def pod_allocation(pod: JSON) -> Allocation | None:
    """The pod's allocation annotation (allocated, else to-allocate); None when it has none.
    Raises DecodeError."""
    ann = _annotations(pod)
    text = ann.get(DEVICES_ALLOCATED) or ""
    name = DEVICES_ALLOCATED
    if not text:
        text, name = ann.get(DEVICES_TO_ALLOCATE) or "", DEVICES_TO_ALLOCATE
    if not text:
        return None
    return decode_allocation(str(text), name)


@dataclass
class Held:
    """What one pod holds on one GPU at its busiest."""

    slots: int = 0
    mem: int = 0
    cores: int = 0
    exclusive: bool = False

    def widen(self, other: Held) -> None:
        self.slots = max(self.slots, other.slots)
        self.mem = max(self.mem, other.mem)
        self.cores = max(self.cores, other.cores)
        self.exclusive = self.exclusive or other.exclusive


def footprint(allocation: Allocation, kinds: Sequence[str]) -> dict[str, Held]:
    """Per GPU, the most the pod holds at once over its phases (each regular init container with the
    sidecars started before it; then every sidecar and app container)."""

    def phase(slices: Iterable[Slice]) -> dict[str, Held]:
        out: dict[str, Held] = {}
        for s in slices:
            held = out.setdefault(s.uuid, Held())
            held.slots += 1
            held.mem += s.mem
            held.cores += s.cores
            held.exclusive = held.exclusive or s.cores >= 100
        return out

    phases: list[dict[str, Held]] = []
    sidecars: list[Slice] = []
    apps: list[Slice] = []
    for index, slices in enumerate(allocation):
        kind = kinds[index] if index < len(kinds) else "app"
        if kind == "init":
            phases.append(phase([*sidecars, *slices]))
        elif kind == "sidecar":
            sidecars.extend(slices)
        else:
            apps.extend(slices)
    phases.append(phase([*sidecars, *apps]))
    total: dict[str, Held] = {}
    for p in phases:
        for uuid, held in p.items():
            total.setdefault(uuid, Held()).widen(held)
    return total


# --- GPUs: device-plugin path -------------------------------------------------------------------------------


def registered_gpus(nodes: Iterable[JSON], out: _Out | None = None) -> dict[str, tuple[str, Gpu]]:
    """Every registered GPU by UUID: (node, GPU)."""
    gpus: dict[str, tuple[str, Gpu]] = {}
    for node in nodes:
        name = str(_meta(node).get("name") or "")
        text = _annotations(node).get(NODE_REGISTER)
        if not text:
            continue
        try:
            for gpu in decode_register(str(text)):
                gpus[gpu.id] = (name, gpu)
        except DecodeError as err:
            if out is not None:
                out.add(
                    "annotation-undecodable", f"node/{name}", str(err), node=name, annotation=NODE_REGISTER
                )
    return gpus


def _holdings(pods: Iterable[JSON], out: _Out) -> dict[str, list[tuple[str, Held]]]:
    """Per GPU, (pod, what it holds) of every live pod placed by HAMi."""
    per_gpu: dict[str, list[tuple[str, Held]]] = {}
    for pod in pods:
        if not is_live(pod) or not _annotations(pod).get(VGPU_NODE):
            continue
        try:
            allocation = pod_allocation(pod)
        except DecodeError as err:
            out.add("annotation-undecodable", pod_key(pod), str(err), pod=pod_key(pod))
            continue
        if allocation is None:
            continue
        kinds = [kind for _, kind in pod_containers(pod)]
        for uuid, held in footprint(allocation, kinds).items():
            per_gpu.setdefault(uuid, []).append((pod_key(pod), held))
    return per_gpu


def check_gpu_capacity(pods: Iterable[JSON], gpus: Mapping[str, tuple[str, Gpu]], out: _Out) -> None:
    for uuid, holders in sorted(_holdings(pods, out).items()):
        if uuid not in gpus:
            continue  # never registered: nothing to hold it against
        node, gpu = gpus[uuid]
        slots = sum(h.slots for _, h in holders)
        mem = sum(h.mem for _, h in holders)
        cores = sum(h.cores for _, h in holders)
        evidence = {
            "node": node,
            "gpu": uuid,
            "registered": {"count": gpu.count, "devmem": gpu.devmem, "devcore": gpu.devcore},
            "held": {"slots": slots, "mem": mem, "cores": cores},
            "pods": [{"pod": p, "slots": h.slots, "mem": h.mem, "cores": h.cores} for p, h in holders],
            "sources": [f"node {node} {NODE_REGISTER}", f"pods' {DEVICES_ALLOCATED}"],
        }
        subject = f"{node}/{uuid}"
        if mem > gpu.devmem:
            out.add(
                "gpu-memory-overcommit",
                subject,
                f"GPU {uuid} on {node}: {mem} MiB held of {gpu.devmem}",
                **evidence,
            )
        exclusive = gpu.devcore == 100 and slots > 1 and any(h.exclusive for _, h in holders)
        if cores > gpu.devcore or exclusive:
            why = "an exclusive (100-core) slice shares it" if cores <= gpu.devcore else f"{cores} cores held"
            out.add(
                "gpu-cores-overcommit", subject, f"GPU {uuid} on {node}: {why} of {gpu.devcore}", **evidence
            )
        if slots > gpu.count:
            out.add(
                "gpu-slots-overcommit",
                subject,
                f"GPU {uuid} on {node}: {slots} slots held of {gpu.count}",
                **evidence,
            )


# --- GPUs: DRA ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraDevice:
    pool: str
    name: str
    node: str
    memory: Fraction
    """Bytes."""
    cores: Fraction
    shared: bool
    minor: int | None
    bus_id: str


def _attribute(device: JSON, name: str) -> Any:
    attrs = device.get("attributes")
    raw = attrs.get(name) if isinstance(attrs, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    for kind in ("int", "string", "version", "bool"):
        if kind in raw:
            return raw[kind]
    return None


def _capacity(device: JSON, name: str, where: str) -> Fraction | None:
    caps = device.get("capacity")
    entry = caps.get(name) if isinstance(caps, Mapping) else None
    if not isinstance(entry, Mapping) or "value" not in entry:
        return None
    return parse_quantity(entry["value"], f"{where}.capacity.{name}")


def dra_devices(slices: Iterable[JSON], out: _Out) -> dict[tuple[str, str], DraDevice]:
    """Our driver's devices, (pool, device) -> device, from each pool's newest generation."""
    newest: dict[str, int] = {}
    ours = [s for s in slices if _spec(s).get("driver") == DRA_DRIVER]
    for s in ours:
        pool = _spec(s).get("pool") or {}
        newest[str(pool.get("name"))] = max(
            newest.get(str(pool.get("name")), 0), int(pool.get("generation") or 0)
        )
    devices: dict[tuple[str, str], DraDevice] = {}
    for s in ours:
        spec = _spec(s)
        pool = spec.get("pool") or {}
        if int(pool.get("generation") or 0) != newest[str(pool.get("name"))]:
            continue
        for device in _list(spec.get("devices")):
            if not isinstance(device, Mapping):
                continue
            where = f"resourceslice {_meta(s).get('name')} device {device.get('name')}"
            try:
                memory = _capacity(device, "memory", where) or Fraction(0)
                cores = _capacity(device, "cores", where)
            except DecodeError as err:
                out.add("annotation-undecodable", where, str(err))
                continue
            minor = _attribute(device, "minor")
            key = (str(pool.get("name")), str(device.get("name")))
            devices[key] = DraDevice(
                key[0],
                key[1],
                str(spec.get("nodeName") or ""),
                memory,
                Fraction(100) if cores is None else cores,
                bool(device.get("allowMultipleAllocations")),
                minor if isinstance(minor, int) else None,
                str(_attribute(device, "pcieBusID") or ""),
            )
    return devices


@dataclass(frozen=True)
class Share:
    claim: str
    request: str
    pool: str
    device: str
    memory: Fraction
    cores: Fraction


def claim_key(claim: JSON) -> str:
    return pod_key(claim)


def claim_shares(claim: JSON, devices: Mapping[tuple[str, str], DraDevice]) -> list[Share]:
    """The claim's results of our driver, each with what it consumes (no consumedCapacity: the whole
    device). Raises DecodeError."""
    allocation = _status(claim).get("allocation")
    results = (
        (allocation or {}).get("devices", {}).get("results") if isinstance(allocation, Mapping) else None
    )
    shares = []
    for i, result in enumerate(_list(results)):
        if not isinstance(result, Mapping) or result.get("driver") != DRA_DRIVER:
            continue
        key = (str(result.get("pool")), str(result.get("device")))
        device = devices.get(key)
        consumed = result.get("consumedCapacity")
        consumed = consumed if isinstance(consumed, Mapping) else {}
        where = f"resourceclaim {claim_key(claim)} result {i}.consumedCapacity"
        memory = parse_quantity(consumed["memory"], f"{where}.memory") if "memory" in consumed else None
        cores = parse_quantity(consumed["cores"], f"{where}.cores") if "cores" in consumed else None
        if not consumed:
            memory = device.memory if device else Fraction(0)
            cores = device.cores if device else Fraction(100)
        shares.append(
            Share(
                claim_key(claim),
                str(result.get("request") or ""),
                key[0],
                key[1],
                memory or Fraction(0),
                cores or Fraction(0),
            )
        )
    return shares


def check_dra_capacity(
    claims: Iterable[JSON], devices: Mapping[tuple[str, str], DraDevice], out: _Out
) -> None:
    per_device: dict[tuple[str, str], list[Share]] = {}
    for claim in claims:
        try:
            for share in claim_shares(claim, devices):
                per_device.setdefault((share.pool, share.device), []).append(share)
        except DecodeError as err:
            out.add("annotation-undecodable", f"claim/{claim_key(claim)}", str(err), claim=claim_key(claim))
    for key, shares in sorted(per_device.items()):
        device = devices.get(key)
        if device is None:
            continue
        memory = sum((s.memory for s in shares), Fraction(0))
        cores = sum((s.cores for s in shares), Fraction(0))
        holders = sorted({s.claim for s in shares})
        evidence = {
            "node": device.node,
            "pool": device.pool,
            "device": device.name,
            "capacity": {"memoryMiB": float(device.memory / MIB), "cores": float(device.cores)},
            "held": {"memoryMiB": float(memory / MIB), "cores": float(cores), "claims": len(holders)},
            "claims": [
                {
                    "claim": s.claim,
                    "request": s.request,
                    "memoryMiB": float(s.memory / MIB),
                    "cores": float(s.cores),
                }
                for s in shares
            ],
            "sources": ["resourceslice capacity", "resourceclaims' status.allocation"],
        }
        subject = f"{device.pool}/{device.name}"
        if memory > device.memory:
            out.add(
                "gpu-memory-overcommit",
                subject,
                f"device {subject}: {float(memory / MIB)} MiB held of {float(device.memory / MIB)}",
                **evidence,
            )
        if cores > device.cores:
            out.add(
                "gpu-cores-overcommit",
                subject,
                f"device {subject}: {float(cores)} cores held of {float(device.cores)}",
                **evidence,
            )
        if not device.shared and len(holders) > 1:
            out.add(
                "gpu-slots-overcommit",
                subject,
                f"device {subject} allows one claim, {len(holders)} hold it",
                **evidence,
            )


# --- containers ---------------------------------------------------------------------------------------------


def runtime_gpus(record: ContainerRecord) -> list[str]:
    """The GPUs a device-plugin container's env, mounts and CDI names give it, in env order."""
    gpus: list[str] = []
    visible = record.env.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible == VOLUME_MOUNTS_ROOT:
        gpus.extend(
            m[len(VOLUME_MOUNTS_ROOT) + 1 :] for m in record.mounts if m.startswith(VOLUME_MOUNTS_ROOT + "/")
        )
    elif visible not in ("", "void", "none", "all"):
        gpus.extend(v for v in visible.split(",") if v)
    names = list(record.cdi_devices)
    for key, value in sorted(record.annotations.items()):
        if key.startswith(CDI_ANNOTATION_PREFIX):
            names.extend(value.split(","))
    for name in names:
        kind, sep, device = name.partition("=")
        if sep and kind.endswith("/gpu") and device not in gpus:
            gpus.append(device)
    return list(dict.fromkeys(gpus))


def memory_limits(env: Mapping[str, str]) -> list[int] | str:
    """CUDA_DEVICE_MEMORY_LIMIT_0.._n-1 in MiB, or the bad value."""
    limits: list[int] = []
    while (value := env.get(f"{MEMORY_LIMIT_ENV}{len(limits)}")) is not None:
        match = _LIMIT.fullmatch(value)
        if match is None:
            return f"{MEMORY_LIMIT_ENV}{len(limits)}={value}"
        number, unit = int(match.group(1)), match.group(2).lower()
        limits.append({"k": number // 1024, "g": number * 1024}.get(unit, number) if unit else number // MIB)
    return limits


def _container_index(pod: JSON, container: str) -> int | None:
    return next((i for i, (c, _) in enumerate(pod_containers(pod)) if c.get("name") == container), None)


def _check_dp_container(
    pod: JSON, record: ContainerRecord, entries: Sequence[DeviceEntry], out: _Out
) -> None:
    subject = f"{pod_key(pod)}/{record.container}"
    kubelet = sorted({device_gpu(d) for e in entries if e.resource == GPU_RESOURCE for d in e.device_ids})
    runtime = runtime_gpus(record)
    try:
        allocation = pod_allocation(pod) or ()
    except DecodeError:
        return  # reported by the capacity check
    index = _container_index(pod, record.container)
    slices = allocation[index] if index is not None and index < len(allocation) else ()
    annotated = sorted({s.uuid for s in slices})
    if not (kubelet or runtime or annotated):
        return
    if not kubelet == sorted(runtime) == annotated:
        out.add(
            "container-gpu-mismatch",
            subject,
            f"container {subject}: kubelet recorded {kubelet}, its env names {sorted(runtime)}, "
            f"its pod's annotation {annotated}",
            pod=pod_key(pod),
            container=record.container,
            kubelet_checkpoint=kubelet,
            runtime=runtime,
            annotation=annotated,
            path="device-plugin",
        )
        return
    limits = memory_limits(record.env)
    expected: dict[str, int] = {}
    for s in slices:
        expected[s.uuid] = expected.get(s.uuid, 0) + s.mem
    if (
        isinstance(limits, list)
        and len(limits) == len(runtime)
        and not record.env.get("NVIDIA_VISIBLE_DEVICES", "").startswith("/")
    ):
        got: dict[str, int] | list[int] = dict(zip(runtime, limits, strict=True))
        want: dict[str, int] | list[int] = expected
    else:
        got, want = limits if isinstance(limits, list) else [], sorted(expected.values())
        got = sorted(got)
    if isinstance(limits, str) or got != want:
        out.add(
            "container-memory-mismatch",
            subject,
            f"container {subject}: memory limits {got if not isinstance(limits, str) else limits} MiB, "
            f"its pod's annotation {want}",
            pod=pod_key(pod),
            container=record.container,
            env=got if not isinstance(limits, str) else limits,
            annotation=want,
            path="device-plugin",
        )


def _pod_claim_names(pod: JSON) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name."""
    names: dict[str, str] = {}
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in _list(_status(pod).get("resourceClaimStatuses"))
        if isinstance(s, Mapping)
    }
    for entry in _list(_spec(pod).get("resourceClaims")):
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
        if name:
            names[str(entry.get("name"))] = str(name)
    return names


def _container_claims(pod: JSON, container: str) -> list[tuple[str, str]]:
    """(claim name, request or "") the container names."""
    names = _pod_claim_names(pod)
    spec: JSON = next((c for c, _ in pod_containers(pod) if c.get("name") == container), {})
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return []
    out = []
    for ref in _list(resources.get("claims")):
        if isinstance(ref, Mapping) and str(ref.get("name")) in names:
            out.append((names[str(ref.get("name"))], str(ref.get("request") or "")))
    return out


@dataclass(frozen=True)
class DraView:
    devices: Mapping[tuple[str, str], DraDevice]
    claims: Mapping[str, JSON]
    """ns/name -> claim."""

    def by_minor(self, node: str) -> dict[int, DraDevice]:
        return {d.minor: d for d in self.devices.values() if d.node == node and d.minor is not None}


def _request_matches(result_request: str, wanted: str) -> bool:
    return not wanted or result_request == wanted or result_request.startswith(wanted + "/")


def _dra_kubelet(
    refs: Sequence[tuple[str, str]], namespace: str, uid: str, entries: Sequence[ClaimEntry]
) -> set[tuple[str, str]]:
    """The devices kubelet recorded for the container's claims ("?" names a claim it has no entry of)."""
    kubelet: set[tuple[str, str]] = set()
    for claim_name, _ in refs:
        found = [
            e for e in entries if e.namespace == namespace and e.claim == claim_name and uid in e.pod_uids
        ]
        if not found:
            kubelet.add(("?", f"claim {claim_name} not in dra_manager_state"))
        for entry in found:
            kubelet.update((d.pool, d.device) for d in entry.devices if d.driver == DRA_DRIVER)
    return kubelet


def _device_node_devices(record: ContainerRecord, by_minor: Mapping[int, DraDevice]) -> list[tuple[str, str]]:
    out = []
    for path in record.device_nodes:
        match = _DEVICE_NODE.fullmatch(path)
        if match is None:
            continue
        minor = int(match.group(1))
        device = by_minor.get(minor)
        out.append((device.pool, device.name) if device else ("?", path))
    return sorted(out)


def _check_dra_container(
    pod: JSON,
    record: ContainerRecord,
    entries: Sequence[ClaimEntry],
    *,
    view: DraView,
    by_minor: Mapping[int, DraDevice],
    out: _Out,
) -> None:
    refs = _container_claims(pod, record.container)
    namespace = str(_meta(pod).get("namespace") or "")
    every: list[Share] = []
    mine: list[Share] = []
    used: list[tuple[str, str]] = []
    for claim_name, request in refs:
        claim = view.claims.get(f"{namespace}/{claim_name}")
        try:
            shares = claim_shares(claim, view.devices) if claim else []
        except DecodeError:
            return  # reported by the capacity check
        if shares:
            used.append((claim_name, request))
            every.extend(shares)
            mine.extend(s for s in shares if _request_matches(s.request, request))
    if not every:
        return
    kubelet = sorted(_dra_kubelet(used, namespace, pod_uid(pod), entries))
    runtime = _device_node_devices(record, by_minor)
    allocated = sorted({(s.pool, s.device) for s in mine})
    subject = f"{pod_key(pod)}/{record.container}"
    if runtime != allocated or kubelet != sorted({(s.pool, s.device) for s in every}):
        out.add(
            "container-gpu-mismatch",
            subject,
            f"container {subject}: kubelet recorded {kubelet} for its claims, its device nodes name "
            f"{runtime}, its claims' allocation {allocated}",
            pod=pod_key(pod),
            container=record.container,
            kubelet_checkpoint=[list(k) for k in kubelet],
            runtime=[list(r) for r in runtime],
            claim_allocation=[list(a) for a in allocated],
            path="dra",
        )
        return
    order = sorted(allocated, key=lambda k: (view.devices[k].bus_id, view.devices[k].minor or 0))
    want = [int(sum((s.memory for s in mine if (s.pool, s.device) == k), Fraction(0)) // MIB) for k in order]
    limits = memory_limits(record.env)
    if limits != want:
        out.add(
            "container-memory-mismatch",
            subject,
            f"container {subject}: memory limits {limits} MiB, its claims' consumed memory {want}",
            pod=pod_key(pod),
            container=record.container,
            env=limits,
            claim_allocation=want,
            path="dra",
        )


def check_containers(snapshot: Snapshot, view: DraView, out: _Out) -> None:
    pods = {pod_uid(p): p for p in snapshot.pods if is_live(p)}
    for node, files in sorted(snapshot.kubelet.items()):
        by_minor = view.by_minor(node)
        held: dict[tuple[str, str], list[DeviceEntry]] = {}
        for entry in files.device_entries or ():
            held.setdefault((entry.pod_uid, entry.container), []).append(entry)
        for record in files.containers or ():
            pod = pods.get(record.pod_uid)
            if pod is None:
                continue
            if _container_claims(pod, record.container):
                claims = files.claim_entries or ()
                _check_dra_container(pod, record, claims, view=view, by_minor=by_minor, out=out)
            else:
                _check_dp_container(pod, record, held.get((record.pod_uid, record.container), []), out)


# --- bind phase, bound pods ---------------------------------------------------------------------------------


def asks_hami(pod: JSON) -> bool:
    for container, _ in pod_containers(pod):
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            values = resources.get(part)
            if isinstance(values, Mapping) and any(name in values for name in HAMI_RESOURCES):
                return True
    return False


def pod_vendors(pod: JSON) -> list[str]:
    """The vendors whose devices the pod asks (`nvidia` for HAMi's NVIDIA resources), in name order."""
    vendors = {"nvidia"} if asks_hami(pod) else set()
    for container, _ in pod_containers(pod):
        resources = container.get("resources")
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        for name in limits if isinstance(limits, Mapping) else ():
            family = family_of_resource(str(name))
            if family is not None:
                vendors.add(family.vendor)
    return sorted(vendors)


def check_bind(pods: Iterable[JSON], wall_time: float, bind_timeout_s: float, out: _Out) -> None:
    for pod in pods:
        if not is_live(pod):
            continue
        ann = _annotations(pod)
        key = pod_key(pod)
        if ann.get(BIND_PHASE) == "allocating" and not allocated_without_bind_phase(ann):
            raw = str(ann.get(BIND_TIME) or "")
            if not raw.isdigit():
                out.add("annotation-undecodable", key, f"{BIND_TIME} {raw!r} is not unix seconds", pod=key)
            elif wall_time - int(raw) > bind_timeout_s:
                out.add(
                    "bind-phase-stuck",
                    key,
                    f"pod {key}: {BIND_PHASE}=allocating for {wall_time - int(raw):.0f} s "
                    f"(timeout {bind_timeout_s:.0f} s)",
                    pod=key,
                    bind_time=int(raw),
                    now=wall_time,
                    node=_spec(pod).get("nodeName"),
                )
        if (
            _spec(pod).get("nodeName")
            and asks_hami(pod)
            and not (ann.get(DEVICES_ALLOCATED) or ann.get(DEVICES_TO_ALLOCATE))
        ):
            out.add(
                "bound-without-allocation",
                key,
                f"pod {key} is bound to {_spec(pod).get('nodeName')} and asks for GPUs "
                f"but has no {DEVICES_ALLOCATED}",
                pod=key,
                node=_spec(pod).get("nodeName"),
                phase=_status(pod).get("phase"),
            )


# --- quotas -------------------------------------------------------------------------------------------------


def quota_limits(quotas: Iterable[JSON], out: _Out) -> dict[str, dict[str, tuple[Fraction, str]]]:
    """Per namespace, per key, the smallest hard limit and the quota that sets it."""
    limits: dict[str, dict[str, tuple[Fraction, str]]] = {}
    for quota in quotas:
        hard = _spec(quota).get("hard")
        if not isinstance(hard, Mapping):
            continue
        namespace = str(_meta(quota).get("namespace") or "")
        for key in (QUOTA_MEMORY_KEY, QUOTA_CORES_KEY):
            if key not in hard:
                continue
            try:
                value = parse_quantity(hard[key], f"resourcequota {pod_key(quota)} spec.hard[{key}]")
            except DecodeError as err:
                out.add("annotation-undecodable", f"resourcequota/{pod_key(quota)}", str(err))
                continue
            current = limits.setdefault(namespace, {}).get(key)
            if current is None or value < current[0]:
                limits[namespace][key] = (value, pod_key(quota))
    return limits


def allocation_usage(allocation: Allocation, kinds: Sequence[str]) -> tuple[int, int]:
    """(MiB, cores): max(sum over regular containers, largest init container), each separately."""
    mem = cores = 0
    init_mem = init_cores = 0
    for index, slices in enumerate(allocation):
        m, c = sum(s.mem for s in slices), sum(s.cores for s in slices)
        if index < len(kinds) and kinds[index] != "app":
            init_mem, init_cores = max(init_mem, m), max(init_cores, c)
        else:
            mem, cores = mem + m, cores + c
    return max(mem, init_mem), max(cores, init_cores)


def claims_by_owner(claims: Iterable[JSON]) -> dict[str, list[JSON]]:
    """Pod uid -> the claims it owns (generated for it from a template)."""
    owned: dict[str, list[JSON]] = {}
    for claim in claims:
        for ref in _list(_meta(claim).get("ownerReferences")):
            if isinstance(ref, Mapping) and ref.get("kind", "Pod") == "Pod" and ref.get("uid"):
                owned.setdefault(str(ref["uid"]), []).append(claim)
    return owned


def pod_usage(
    pod: JSON, owned: Sequence[JSON], devices: Mapping[tuple[str, str], DraDevice]
) -> tuple[Fraction, Fraction]:
    """(MiB, cores) the pod holds against its namespace's quota. A device-plugin pod: its allocation
    annotation (the MiB chosen). A DRA pod: what its own claims (those it controls) ask per allocated
    device, as hami-control counts a translated pod: a device with no memory asked (the whole GPU)
    counts 0 MiB, as HAMi counts a whole-GPU ask before a GPU is chosen; no cores asked counts 100.
    Raises DecodeError."""
    allocation = pod_allocation(pod) if _annotations(pod).get(VGPU_NODE) else None
    if allocation is not None:
        mem, cores = allocation_usage(allocation, [k for _, k in pod_containers(pod)])
        return Fraction(mem), Fraction(cores)
    total_mem = total_cores = Fraction(0)
    for claim in owned:
        asked = claim_asks(claim)
        for share in claim_shares(claim, devices):
            asked_mem, asked_cores = asked.get(share.request, (None, None))
            total_mem += Fraction(0) if asked_mem is None else asked_mem / MIB
            total_cores += Fraction(100) if asked_cores is None else asked_cores
    return total_mem, total_cores


def claim_asks(claim: JSON) -> dict[str, tuple[Fraction | None, Fraction | None]]:
    """Per request name (`<request>/<sub-request>` for firstAvailable), the memory (bytes) and cores
    each device of it asks (None: not asked, the device's default). Raises DecodeError."""
    devices = _spec(claim).get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    asks: dict[str, tuple[Fraction | None, Fraction | None]] = {}

    def ask(name: str, exactly: Any) -> None:
        capacity = exactly.get("capacity") if isinstance(exactly, Mapping) else None
        wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
        wanted = wanted if isinstance(wanted, Mapping) else {}
        where = f"resourceclaim {claim_key(claim)} request {name}"
        asks[name] = (
            parse_quantity(wanted["memory"], f"{where}.memory") if "memory" in wanted else None,
            parse_quantity(wanted["cores"], f"{where}.cores") if "cores" in wanted else None,
        )

    for request in _list(requests):
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name") or "")
        ask(name, request.get("exactly"))
        for sub in _list(request.get("firstAvailable")):
            if isinstance(sub, Mapping):
                ask(f"{name}/{sub.get('name')}", sub)
    return asks


def check_quotas(snapshot: Snapshot, devices: Mapping[tuple[str, str], DraDevice], out: _Out) -> None:
    limits = quota_limits(snapshot.resource_quotas, out)
    if not limits:
        return
    owned = claims_by_owner(snapshot.resource_claims)
    for namespace, keys in sorted(limits.items()):
        used_mem = used_cores = Fraction(0)
        holders = []
        for pod in snapshot.pods:
            if not is_live(pod) or _meta(pod).get("namespace") != namespace:
                continue
            try:
                mem, cores = pod_usage(pod, owned.get(pod_uid(pod), []), devices)
            except DecodeError:
                continue  # reported by the capacity checks
            if mem or cores:
                used_mem, used_cores = used_mem + mem, used_cores + cores
                holders.append({"pod": pod_key(pod), "memMiB": float(mem), "cores": float(cores)})
        for key, used in ((QUOTA_MEMORY_KEY, used_mem), (QUOTA_CORES_KEY, used_cores)):
            if key in keys and used > keys[key][0]:
                limit, quota = keys[key]
                out.add(
                    "quota-exceeded",
                    f"{namespace}/{key}",
                    f"namespace {namespace}: live pods hold {float(used)} of {key}, "
                    f"ResourceQuota {quota} allows {float(limit)}",
                    namespace=namespace,
                    key=key,
                    quota=quota,
                    limit=float(limit),
                    used=float(used),
                    pods=holders,
                    sources=["resourcequota spec.hard", f"pods' {DEVICES_ALLOCATED} / claims' allocation"],
                )


# --- passes -------------------------------------------------------------------------------------------------


def check_files(snapshot: Snapshot, out: _Out) -> None:
    for node, files in sorted(snapshot.kubelet.items()):
        for name, error in sorted(files.errors.items()):
            out.add(
                "state-unreadable", f"{node}/{name}", f"node {node}: {name}: {error}", node=node, file=name
            )


def findings(
    snapshot: Snapshot,
    *,
    bind_timeout_s: float,
    known_gpus: Mapping[str, tuple[str, Gpu]] | None = None,
    known_devices: Mapping[DeviceKey, VendorDevice] | None = None,
) -> list[Violation]:
    """Every invariant broken in this snapshot. `known_gpus` are GPUs seen registered before (a GPU
    dropped from its node's annotation is still held to what it had); `known_devices` the same for the
    other vendors' devices."""
    out = _Out(snapshot.at)
    vendor_checks(snapshot, out, known_devices)
    gpus = dict(known_gpus or {})
    gpus.update(registered_gpus(snapshot.nodes, out))
    check_gpu_capacity(snapshot.pods, gpus, out)
    devices = dra_devices(snapshot.resource_slices, out)
    check_dra_capacity(snapshot.resource_claims, devices, out)
    claims = {claim_key(c): c for c in snapshot.resource_claims}
    check_containers(snapshot, DraView(devices, claims), out)
    check_bind(snapshot.pods, snapshot.wall_time, bind_timeout_s, out)
    check_quotas(snapshot, devices, out)
    check_files(snapshot, out)
    return list(out.found.values())


# === the other vendors ======================================================================================

DeviceKey = tuple[str, str]
"""(node, device id)."""
_AMD_LIMIT = re.compile(r"([0-9]+)m")


# --- inventories --------------------------------------------------------------------------------------------


def vendor_devices(nodes: Iterable[JSON], out: _Out | None = None) -> dict[DeviceKey, VendorDevice]:
    """Every node's vendor devices by (node, id); sources that do not decode are reported."""
    found: dict[DeviceKey, VendorDevice] = {}
    for node in nodes:
        inventory = node_devices(node)
        for device in inventory.devices:
            found[(inventory.node, device.id)] = device
        for source, error in sorted(inventory.errors.items()):
            if out is not None:
                out.add(
                    "annotation-undecodable",
                    f"node/{inventory.node}/{source}",
                    error,
                    node=inventory.node,
                    annotation=source,
                )
    return found


# --- pods ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """One family's allocation on one live pod."""

    pod: JSON
    family: Family
    annotation: str
    allocation: VendorAllocation

    @property
    def key(self) -> str:
        return pod_key(self.pod)


def placed_pods(pods: Iterable[JSON], out: _Out) -> list[Placed]:
    """Every live pod's vendor allocations (pods HAMi placed: `hami.io/vgpu-node`)."""
    placed = []
    for pod in pods:
        annotations = _annotations(pod)
        if not is_live(pod) or not annotations.get(VGPU_NODE):
            continue
        for _, (family, text) in sorted(pod_vendor_allocations(annotations).items()):
            try:
                allocation = decode_vendor_allocation(text, family.allocated)
            except DecodeError as err:
                key = pod_key(pod)
                out.add(
                    "annotation-undecodable",
                    f"{key}/{family.allocated}",
                    str(err),
                    pod=key,
                    annotation=family.allocated,
                    vendor=family.vendor,
                )
                continue
            placed.append(Placed(pod, family, family.allocated, allocation))
    return placed


@dataclass
class Hold:
    """What one pod holds on one device at its busiest."""

    slots: int = 0
    mem: int = 0
    cores: int = 0
    mask: int = 0
    """AWS Neuron: the cores (bits) it holds."""
    exclusive: bool = False

    def widen(self, other: Hold) -> None:
        self.slots = max(self.slots, other.slots)
        self.mem = max(self.mem, other.mem)
        self.cores = max(self.cores, other.cores)
        self.mask |= other.mask
        self.exclusive = self.exclusive or other.exclusive


def _slots(device: VendorDevice | None, piece: VendorSlice) -> int:
    return enflame_slices(device, piece) if device is not None and device.family == "Enflame" else 1


def vendor_footprint(
    allocation: VendorAllocation, kinds: Sequence[str], devices: Mapping[str, VendorDevice]
) -> dict[str, Hold]:
    """Per device id, the most the pod holds at once: each regular init container with the sidecars
    started before it, then every sidecar and app container together. `devices`: the node's, by id."""

    def phase(slices: Iterable[VendorSlice]) -> dict[str, Hold]:
        held: dict[str, Hold] = {}
        for s in slices:
            device = devices.get(s.id)
            hold = held.setdefault(s.id, Hold())
            hold.slots += _slots(device, s)
            hold.mem += s.mem
            hold.cores += s.cores
            hold.mask |= s.cores
            hold.exclusive = hold.exclusive or (
                device is not None and device.devcore == 100 and s.cores >= 100
            )
        return held

    phases: list[dict[str, Hold]] = []
    sidecars: list[VendorSlice] = []
    apps: list[VendorSlice] = []
    for index, slices in enumerate(allocation):
        kind = kinds[index] if index < len(kinds) else "app"
        if kind == "init":
            phases.append(phase([*sidecars, *slices]))
        elif kind == "sidecar":
            sidecars.extend(slices)
        else:
            apps.extend(slices)
    phases.append(phase([*sidecars, *apps]))
    total: dict[str, Hold] = {}
    for p in phases:
        for device_id, hold in p.items():
            total.setdefault(device_id, Hold()).widen(hold)
    return total


def _node_of(pod: JSON) -> str:
    return str(_annotations(pod).get(VGPU_NODE) or "")


def _by_node(devices: Mapping[DeviceKey, VendorDevice], node: str) -> dict[str, VendorDevice]:
    return {d.id: d for (n, _), d in devices.items() if n == node}


# --- capacity -----------------------------------------------------------------------------------------------


@dataclass
class _Holder:
    pod: str
    hold: Hold
    online: bool


def check_amd_compute_units(
    placed: Sequence[Placed], devices: Mapping[DeviceKey, VendorDevice], out: _Out
) -> None:
    """AMD: the compute units live pods hold on a device (`hami.io/amd-cu-allocated`, the plugin's record)
    are each held by one pod at most, and the device has them."""
    owners: dict[DeviceKey, dict[int, str]] = {}
    for p in placed:
        if p.family.word != "AMD" or AMD_CU_ALLOCATED not in _annotations(p.pod):
            continue
        try:
            held = decode_amd_cu_allocated(str(_annotations(p.pod)[AMD_CU_ALLOCATED]))
        except DecodeError as err:
            out.add(
                "annotation-undecodable", f"{p.key}/{AMD_CU_ALLOCATED}", str(err), pod=p.key, vendor="amd"
            )
            continue
        node = _node_of(p.pod)
        for device_id, units in sorted(held.items()):
            key = (node, device_id)
            taken = owners.setdefault(key, {})
            device = devices.get(key)
            clash = sorted(u for u in units if u in taken)
            beyond = sorted(u for u in units if device is not None and u >= device.devcore)
            if clash or beyond:
                why = (
                    f"compute units {clash[:8]} also held by {taken[clash[0]]}"
                    if clash
                    else f"compute units {beyond[:8]} beyond the device's {device.devcore if device else '?'}"
                )
                out.add(
                    "vendor-cores-overcommit",
                    f"{node}/{device_id}/compute-units",
                    f"AMD device {device_id} on {node}: pod {p.key} holds {why}",
                    vendor="amd",
                    node=node,
                    device=device_id,
                    pod=p.key,
                    units=sorted(units),
                    sources=[f"pods' {AMD_CU_ALLOCATED}"],
                )
            for u in units:
                taken.setdefault(u, p.key)


def check_vendor_capacity(
    placed: Sequence[Placed], devices: Mapping[DeviceKey, VendorDevice], out: _Out
) -> None:
    holders: dict[DeviceKey, list[_Holder]] = {}
    for p in placed:
        node = _node_of(p.pod)
        kinds = [kind for _, kind in pod_containers(p.pod)]
        online = _annotations(p.pod).get(METAX_APP_CLASS) == "online"
        for device_id, hold in vendor_footprint(p.allocation, kinds, _by_node(devices, node)).items():
            holders.setdefault((node, device_id), []).append(_Holder(p.key, hold, online))
    for key, held in sorted(holders.items()):
        device = devices.get(key)
        if device is None:
            continue  # never registered: nothing to hold it against (vendor-device-missing says so)
        _check_device(key, device, held, out)


def _check_device(key: DeviceKey, device: VendorDevice, held: Sequence[_Holder], out: _Out) -> None:
    node, device_id = key
    slots = sum(h.hold.slots for h in held)
    mem = sum(h.hold.mem for h in held)
    cores = sum(h.hold.cores for h in held)
    subject = f"{node}/{device_id}"
    evidence = {
        "vendor": device.vendor,
        "family": device.family,
        "node": node,
        "device": device_id,
        "inventory": {"count": device.count, "devmem": device.devmem, "devcore": device.devcore},
        "held": {"slots": slots, "mem": mem, "cores": cores},
        "pods": [
            {"pod": h.pod, "slots": h.hold.slots, "mem": h.hold.mem, "cores": h.hold.cores} for h in held
        ],
        "sources": [f"node {node} {device.family} inventory", f"pods' {device.family} allocation"],
    }
    what = f"{device.family} device {device_id} on {node}"
    if mem > device.devmem:
        out.add("vendor-memory-overcommit", subject, f"{what}: {mem} MiB held of {device.devmem}", **evidence)
    if device.family == "AWSNeuron":
        why = _neuron_cores(device, held)
        if why:
            out.add("vendor-cores-overcommit", subject, f"{what}: {why}", **evidence)
    else:
        shared = [h for h in held if not h.online]
        exclusive = device.devcore == 100 and len(shared) > 1 and any(h.hold.exclusive for h in shared)
        if cores > device.devcore or exclusive:
            why = (
                "an exclusive (100-core) share shares it"
                if cores <= device.devcore
                else f"{cores} cores held"
            )
            out.add("vendor-cores-overcommit", subject, f"{what}: {why} of {device.devcore}", **evidence)
    if slots > device.count:
        out.add(
            "vendor-slots-overcommit", subject, f"{what}: {slots} slots held of {device.count}", **evidence
        )


def _neuron_cores(device: VendorDevice, held: Sequence[_Holder]) -> str:
    """Why the pods' core masks on an AWS Neuron device overcommit it ("" when they do not)."""
    seen = 0
    for h in held:
        if h.hold.mask & ~device.devcore:
            return f"pod {h.pod} holds core mask {h.hold.mask:#x}, the device has {device.devcore:#x}"
        if h.hold.mask & seen:
            return f"pod {h.pod} holds core mask {h.hold.mask:#x}, of which {h.hold.mask & seen:#x} is taken"
        seen |= h.hold.mask
    return ""


# --- bound pods ---------------------------------------------------------------------------------------------


def _limits(container: JSON) -> Mapping[str, Any]:
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    return limits if isinstance(limits, Mapping) else {}


def asked_families(pod: JSON) -> dict[str, Family]:
    """The vendor families the pod's containers limit a count resource of."""
    asked: dict[str, Family] = {}
    for container, _ in pod_containers(pod):
        for resource in _limits(container):
            family = family_of_resource(str(resource))
            if family is not None:
                asked[family.word] = family
    return asked


def check_bound(
    pods: Iterable[JSON], placed: Sequence[Placed], devices: Mapping[DeviceKey, VendorDevice], out: _Out
) -> None:
    by_pod: dict[str, list[Placed]] = {}
    for p in placed:
        by_pod.setdefault(p.key, []).append(p)
    for pod in pods:
        node = str(_spec(pod).get("nodeName") or "")
        if not node or not is_live(pod):
            continue
        key = pod_key(pod)
        mine = by_pod.get(key, [])
        on_node = _by_node(devices, node)
        vendors_on_node = {d.vendor for d in on_node.values()}
        have = {p.family.word for p in mine}
        annotations = _annotations(pod)
        for word, family in sorted(asked_families(pod).items()):
            if word in have or family.allocated in annotations or family.vendor not in vendors_on_node:
                continue
            out.add(
                "bound-without-allocation",
                key,
                f"pod {key} is bound to {node} and asks {family.vendor} devices "
                f"({', '.join(family.count_resources)}) but has no {family.allocated}",
                pod=key,
                node=node,
                vendor=family.vendor,
                phase=(pod.get("status") or {}).get("phase"),
            )
        for p in mine:
            ids = sorted({s.id for c in p.allocation for s in c})
            missing = [i for i in ids if i not in on_node]
            placed_on = _node_of(pod)
            if missing or (ids and placed_on != node):
                why = (
                    f"names {missing}, which {node}'s inventory lacks"
                    if missing
                    else f"was placed on {placed_on} by HAMi"
                )
                out.add(
                    "vendor-device-missing",
                    key,
                    f"pod {key} bound to {node}: its {p.annotation} {why}",
                    pod=key,
                    node=node,
                    placed_on=placed_on,
                    vendor=p.family.vendor,
                    annotation=p.annotation,
                    devices=ids,
                    missing=missing,
                    inventory=sorted(on_node),
                )


# --- containers ---------------------------------------------------------------------------------------------


def _container(pod: JSON, index: int) -> JSON:
    return pod_containers(pod)[index][0]


def _expected_ids(
    family: Family, container: JSON, slices: Sequence[VendorSlice], node: Mapping[str, VendorDevice]
) -> dict[str, int]:
    """Resource -> how many device IDs kubelet should hold for the container's shares."""
    limits = _limits(container)
    if family.word == "AWSNeuron":
        if "aws.amazon.com/neuron" in limits:
            return {"aws.amazon.com/neuron": len(slices)}
        return {"aws.amazon.com/neuroncore": sum(bin(s.cores).count("1") for s in slices)}
    if family.word == "MLU":
        out = {}
        if "cambricon.com/mlu.smlu.vmemory" in limits:
            out["cambricon.com/mlu.smlu.vmemory"] = sum(s.mem for s in slices) // 256
        if "cambricon.com/mlu.smlu.vcore" in limits:
            out["cambricon.com/mlu.smlu.vcore"] = sum(s.cores for s in slices)
        return out
    out = {family.share_resource: sum(_slots(node.get(s.id), s) for s in slices)}
    if family.word == "Mthreads":  # its cores and 512 MiB units are resources of their own
        if "mthreads.com/sgpu-memory" in limits:
            out["mthreads.com/sgpu-memory"] = sum(s.mem for s in slices) // 512
        if "mthreads.com/sgpu-core" in limits:
            out["mthreads.com/sgpu-core"] = sum(s.cores for s in slices)
    return out


@dataclass
class KubeletView:
    """What kubelet holds for one node: entries by (pod uid, container), and the registered devices."""

    entries: dict[tuple[str, str], list[DeviceEntry]] = field(default_factory=dict)
    registered: Mapping[str, Sequence[str]] = field(default_factory=dict)


def _kubelet_views(snapshot: Snapshot) -> dict[str, KubeletView]:
    views: dict[str, KubeletView] = {}
    for node, files in snapshot.kubelet.items():
        view = KubeletView(registered=files.registered_devices or {})
        for entry in files.device_entries or ():
            view.entries.setdefault((entry.pod_uid, entry.container), []).append(entry)
        views[node] = view
    return views


def kubelet_device_disagreements(snapshot: Snapshot, devices: Mapping[DeviceKey, VendorDevice]) -> int:
    """Started vendor containers whose kubelet device IDs name other devices of the node than the
    annotation's (not a violation: see the module docstring)."""
    count = 0
    for check in _started(snapshot, devices):
        named = {
            device_of_kubelet_id(check.family, i, list(check.node_devices.values()))
            for e in check.entries
            for i in e.device_ids
            if e.resource == check.family.share_resource
        }
        named.discard(None)
        if named and named != {s.id for s in check.slices}:
            count += 1
    return count


@dataclass(frozen=True)
class _Started:
    pod: JSON
    family: Family
    container: str
    index: int
    slices: tuple[VendorSlice, ...]
    node: str
    node_devices: Mapping[str, VendorDevice]
    entries: Sequence[DeviceEntry]
    registered: Mapping[str, Sequence[str]]
    env: Mapping[str, str]
    device_nodes: tuple[str, ...]


def _started(snapshot: Snapshot, devices: Mapping[DeviceKey, VendorDevice]) -> list[_Started]:
    """Each started container (a record in containers.json) of a live pod, with its share of each vendor
    family that gave it devices."""
    pods = {pod_uid(p): p for p in snapshot.pods if is_live(p)}
    views = _kubelet_views(snapshot)
    out: list[_Started] = []
    for node, files in sorted(snapshot.kubelet.items()):
        on_node = _by_node(devices, node)
        view = views.get(node, KubeletView())
        for record in files.containers or ():
            pod = pods.get(record.pod_uid)
            if pod is None or str(_spec(pod).get("nodeName") or "") != node:
                continue
            index = _container_index(pod, record.container)
            if index is None:
                continue
            for _, (family, text) in sorted(pod_vendor_allocations(_annotations(pod)).items()):
                try:
                    allocation = decode_vendor_allocation(text, family.allocated)
                except DecodeError:
                    continue  # reported by the capacity checks
                slices = allocation[index] if index < len(allocation) else ()
                if not slices:
                    continue
                out.append(
                    _Started(
                        pod,
                        family,
                        record.container,
                        index,
                        slices,
                        node,
                        on_node,
                        view.entries.get((record.pod_uid, record.container), []),
                        view.registered,
                        record.env,
                        record.device_nodes,
                    )
                )
    return out


def check_vendor_containers(snapshot: Snapshot, devices: Mapping[DeviceKey, VendorDevice], out: _Out) -> None:
    for check in _started(snapshot, devices):
        _check_kubelet(check, out)
        _check_runtime(check, out)


def _check_kubelet(check: _Started, out: _Out) -> None:
    family = check.family
    key = pod_key(check.pod)
    container = _container(check.pod, check.index)
    held = {e.resource: e.device_ids for e in check.entries}
    for resource, want in sorted(_expected_ids(family, container, check.slices, check.node_devices).items()):
        ids = held.get(resource, ())
        problems = []
        if len(ids) != want:
            problems.append(f"holds {len(ids)} device IDs, its shares need {want}")
        registered = check.registered.get(resource) or ()
        unknown = [i for i in ids if registered and i not in registered]
        if unknown:
            problems.append(f"holds {unknown[:4]} the plugin did not register")
        if family.id_scheme and resource == family.share_resource:
            devices = list(check.node_devices.values())
            stray = [i for i in ids if device_of_kubelet_id(family, i, devices) is None]
            if stray:
                problems.append(f"holds {stray[:4]}, which name no device of {check.node}")
        if problems:
            subject = f"{key}/{check.container}/{resource}"
            out.add(
                "vendor-kubelet-mismatch",
                subject,
                f"container {key}/{check.container}: kubelet {'; '.join(problems)}",
                pod=key,
                container=check.container,
                node=check.node,
                vendor=family.vendor,
                resource=resource,
                kubelet_checkpoint=list(ids),
                annotation=[f"{s.id},{s.mem},{s.cores}" for s in check.slices],
                sources=["kubelet_internal_checkpoint", family.allocated],
            )


def _check_runtime(check: _Started, out: _Out) -> None:
    family = check.family
    key = pod_key(check.pod)
    named = runtime_devices(family, check.env, check.device_nodes, list(check.node_devices.values()))
    want = sorted({s.id for s in check.slices})
    problems = []
    if named is not None and sorted(set(named)) != want:
        problems.append(f"its Allocate answer names {sorted(set(named))}, its pod's annotation {want}")
    if family.word == "AWSNeuron":
        for s in check.slices:
            device = check.node_devices.get(s.id)
            mask = neuron_core_mask(check.env, device) if device is not None else None
            if mask is not None and mask != s.cores:
                problems.append(f"its cores on {s.id} are mask {mask:#x}, its pod's annotation {s.cores:#x}")
    if family.word == "AMD" and "HSA_CU_MASK" in check.env:
        try:
            masks = decode_hsa_cu_mask(check.env["HSA_CU_MASK"])
        except DecodeError as err:
            problems.append(str(err))
        else:
            got = [len(masks.get(i, ())) for i in range(len(check.slices))]
            if got != [s.cores for s in check.slices]:
                problems.append(f"HSA_CU_MASK gives {got} compute units, its pod's annotation "
                                f"{[s.cores for s in check.slices]}")  # fmt: skip
    if family.word == "AMD" and "HIP_DEVICE_MEMORY_LIMIT" in check.env:
        limit = check.env["HIP_DEVICE_MEMORY_LIMIT"]
        match = _AMD_LIMIT.fullmatch(limit)
        if match is None or int(match.group(1)) != check.slices[0].mem:
            problems.append(
                f"HIP_DEVICE_MEMORY_LIMIT={limit}, its pod's annotation {check.slices[0].mem} MiB"
            )
    if problems:
        subject = f"{key}/{check.container}"
        out.add(
            "vendor-container-mismatch",
            subject,
            f"container {subject}: {'; '.join(problems)}",
            pod=key,
            container=check.container,
            node=check.node,
            vendor=family.vendor,
            runtime=named,
            annotation=want,
            env={k: v for k, v in check.env.items() if family.visible_env and k == family.visible_env},
            sources=["containers.json", family.allocated],
        )


# --- a vendor pass ------------------------------------------------------------------------------------------


def vendor_checks(
    snapshot: Snapshot, out: _Out, known_devices: Mapping[DeviceKey, VendorDevice] | None = None
) -> None:
    """The other vendors' invariants over this snapshot. `known_devices` were seen in an inventory before
    (a device that left its node's inventory is still held to what it had)."""
    devices = dict(known_devices or {})
    devices.update(vendor_devices(snapshot.nodes, out))
    placed = placed_pods(snapshot.pods, out)
    check_vendor_capacity(placed, devices, out)
    check_amd_compute_units(placed, devices, out)
    check_bound(snapshot.pods, placed, devices, out)
    check_vendor_containers(snapshot, devices, out)


# --- the end of a run ---------------------------------------------------------------------------------------


def _events_for(events: Iterable[JSON], pod: JSON) -> list[JSON]:
    uid, key = pod_uid(pod), pod_key(pod)
    out = []
    for event in events:
        obj = event.get("involvedObject") or event.get("regarding") or {}
        if not isinstance(obj, Mapping) or obj.get("kind", "Pod") != "Pod":
            continue
        if obj.get("uid") == uid or (
            not obj.get("uid") and f"{obj.get('namespace')}/{obj.get('name')}" == key
        ):
            out.append(event)
    return out


def actionable_reason(pod: JSON, events: Iterable[JSON]) -> str | None:
    """The reason a person can act on for a pod that is neither Running nor Succeeded, or None."""
    status = _status(pod)
    phase = status.get("phase")
    statuses = [*_list(status.get("initContainerStatuses")), *_list(status.get("containerStatuses"))]
    if phase == "Failed":
        if status.get("reason") and status.get("message"):
            return f"{status['reason']}: {status['message']}"
        for cs in statuses:
            term = ((cs or {}).get("state") or {}).get("terminated") or {}
            if term.get("exitCode") and term.get("reason"):
                return f"container {cs.get('name')} {term['reason']} (exit {term['exitCode']})"
        return None
    if phase != "Pending":
        return None
    for condition in _list(status.get("conditions")):
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("message")
        ):
            return f"{condition.get('reason')}: {condition['message']}"
    for event in _events_for(events, pod):
        if event.get("reason") == "FailedScheduling" and (event.get("message") or event.get("note")):
            return f"FailedScheduling: {event.get('message') or event.get('note')}"
    for cs in statuses:
        waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting.get("message"):
            return f"container {cs.get('name')} {waiting['reason']}: {waiting['message']}"
    return None


def _leaks(snapshot: Snapshot, out: _Out) -> None:
    uids = {pod_uid(p) for p in snapshot.pods}
    for node, files in sorted(snapshot.kubelet.items()):
        for entry in files.device_entries or ():
            if entry.pod_uid not in uids:
                out.add(
                    "allocation-leaked",
                    f"{node}/kubelet_internal_checkpoint/{entry.pod_uid}",
                    f"node {node}: kubelet still holds {list(entry.device_ids)} for gone pod {entry.pod_uid}",
                    node=node,
                    pod_uid=entry.pod_uid,
                    container=entry.container,
                    devices=list(entry.device_ids),
                )
        for claim in files.claim_entries or ():
            for uid in sorted(claim.pod_uids - uids):
                out.add(
                    "allocation-leaked",
                    f"{node}/dra_manager_state/{uid}",
                    f"node {node}: claim {claim.namespace}/{claim.claim} still prepared for gone pod {uid}",
                    node=node,
                    pod_uid=uid,
                    claim=f"{claim.namespace}/{claim.claim}",
                )
        for record in files.containers or ():
            if record.pod_uid not in uids:
                out.add(
                    "allocation-leaked",
                    f"{node}/containers.json/{record.pod_uid}",
                    f"node {node}: container {record.namespace}/{record.pod}/{record.container} "
                    "of a gone pod is still recorded",
                    node=node,
                    pod_uid=record.pod_uid,
                    pod=f"{record.namespace}/{record.pod}",
                )
    for resource_claim in snapshot.resource_claims:
        for ref in _list(_status(resource_claim).get("reservedFor")):
            if not isinstance(ref, Mapping) or ref.get("resource") != "pods":
                continue
            gone = str(ref.get("uid") or "")
            if gone not in uids:
                out.add(
                    "allocation-leaked",
                    f"claim/{claim_key(resource_claim)}/{gone}",
                    f"claim {claim_key(resource_claim)} reserved for gone pod {ref.get('name')} ({gone})",
                    claim=claim_key(resource_claim),
                    pod_uid=gone,
                    pod=ref.get("name"),
                )


def final_findings(snapshot: Snapshot) -> list[Violation]:
    """What must hold once a run is over (see the module docstring)."""
    out = _Out(snapshot.at)
    for pod in snapshot.pods:
        key = pod_key(pod)
        phase = _status(pod).get("phase")
        ann = _annotations(pod)
        if is_live(pod) and ann.get(BIND_PHASE) == "allocating" and not allocated_without_bind_phase(ann):
            out.add(
                "pod-in-bind-phase",
                key,
                f"pod {key} ({phase}) is still {BIND_PHASE}=allocating",
                pod=key,
                phase=phase,
            )
        if phase in ("Running", "Succeeded"):
            continue
        reason = actionable_reason(pod, snapshot.events)
        if reason is None:
            out.add(
                "pod-not-settled",
                key,
                f"pod {key} ended {phase} with no reason a person can act on",
                pod=key,
                phase=phase,
                vendor=",".join(pod_vendors(pod)),
                node=_spec(pod).get("nodeName"),
                conditions=_list(_status(pod).get("conditions")),
                events=[
                    {"reason": e.get("reason"), "message": e.get("message")}
                    for e in _events_for(snapshot.events, pod)
                ],
            )
    _leaks(snapshot, out)
    return list(out.found.values())
