"""Allocate as the vendors' plugins answer it, pure: which pod on the node is being allocated
(`pending_pods`), and for one container request what the container gets (`Answer`: env, mounts, device
nodes) and what the plugin writes on the pod (`Outcome.patch`, and whether the pod is done).

Which pod (HAMi pkg/util/util.go GetPendingPod, v2.10): the pod HAMi's node lock names, if any; else a
pod bound to this node (`hami.io/vgpu-node`), Pending and not being deleted, with `hami.io/bind-time`
and `hami.io/bind-phase` allocating (HAMi also takes success: a pod whose other vendor's plugin already
finished). HAMi takes the first such pod the list returns, whatever it asks; here only pods that still
have work for this vendor are candidates (its to-allocate annotation names devices, or its marker is
"false"), a pod some plugin already reported `success` for first (the kubelet admits one pod at a time:
that is the pod it is in the middle of), then oldest `hami.io/bind-time` (then namespace/name):
hami-control lets pods of different vendors be allocated on one node at the same time (its pending
window is per vendor, it writes no node lock, and it releases a pod's window when the first of its
plugins writes success), so HAMi's first-pod rule would hand one vendor's plugin another pod.

Each Allocate request carries one container (kubelet allocates container by container); its devices
come from the pod annotation, not from the kubelet's device ids, which only have to be as many
(`device number not matched` otherwise, as dcu-vgpu-device-plugin, amd-device-plugin and
ascend-device-plugin check). The answers (docs/vendor-nodes.md has the table):

- Hygon (dcu-vgpu-device-plugin server.go Allocate): no env; /dev/kfd, /dev/mkfd and per DCU
  /dev/dri/card<i> and /dev/dri/renderD<128+i>; a container with one DCU and less than its memory also
  gets its vdev config directory at /etc/vdev/docker/ and the driver at /opt/hygondriver; /opt/hyhal;
- Ascend (ascend-device-plugin allocate.go buildContainerAllocateResponse): `ASCEND_VISIBLE_DEVICES`
  (the physical ids), `ASCEND_VNPU_SPECS` (the template HAMi chose, from `huawei.com/<cw>`);
- Cambricon (cambricon-k8s-device-plugin server.go allocateDynamicSmlu, PrepareResponse): the MLU's
  /dev/cambricon_dev<slot>, /dev/cambricon_ipcm<slot> and the sMLU instance's
  /dev/cambricon-caps/cap_dev<slot>_mi<instance>, from `CAMBRICON_DSMLU_PROFILE`
  (`<slot>_<vcore>_<vmemory>`); the first Allocate of the pod (its vcore or vmemory resource) creates the
  instance, the second writes `CAMBRICON_DSMLU_ASSIGNED: "true"` and `CAMBRICON_DSMLU_PROFILE_INSTANCE`;
- AMD (amd-device-plugin plugin.go Allocate): `ROCR_VISIBLE_DEVICES` (ROCr uuids), `HSA_CU_MASK`
  (`<i>:<CU list>` per device, the first free compute units after what the node's other pods hold in
  `hami.io/amd-cu-allocated`), `HIP_DEVICE_MEMORY_LIMIT=<MiB>m`, `LD_AUDIT`; /dev/kfd and the dri
  nodes; the pod's `hami.io/amd-cu-allocated` gets the container's units;
- AWS Neuron (no public plugin source; AWS's docs, aws-neuron-sdk deploy/infrastructure/scheduler-
  flow.rst and the older neuron-k8-scheduler-ext.rst): `AWS_NEURON_VISIBLE_DEVICES` (device indexes)
  for a container asking devices, else `NEURON_RT_VISIBLE_CORES` (core indexes from the core mask HAMi
  chose) and the cores' devices /dev/neuron<i>;
- Enflame DRS (gcushare-device-plugin, see `_gcushare`): `ENFLAME_VISIBLE_DEVICES` = the pod's
  `enflame.com/gcu-assigned-minor`, `TOPS_VISIBLE_DEVICES` = `DRS-<instance UUID>`;
- every other vendor (no public source of its HAMi-mode plugin: MetaX, Mthreads, Enflame GCU, Kunlun,
  Vastai): `<visible_env>` = the device indexes (Mthreads and Kunlun XPU as HAMi's
  `mthreads.com/gpu-index` and `BAIDU_COM_DEVICE_IDX` say for the last container), an assumed key.

After the answer (the `HAMI` flow) the container's entry in the to-allocate annotation is blanked and,
once none is left, `hami.io/bind-phase: success` is written (HAMi's PodAllocationTrySuccess looks at
the plugin's own to-allocate annotation only, so a pod that also asks NVIDIA GPUs reads success before
hami-node has allocated them; hami-node still takes it while kubelet admits it); an error writes
`failed`. The `ALLOCATED`
flow counts the containers done (in the plugin's memory) and flips its marker (AWS `NEURON_ALLOCATED`)
and the bind phase when the last is done; Enflame DRS keeps gcushare's record on the pod instead
(`assigned-containers`, `enflame.com/gcu-assigned`) and writes the bind phase too, which gcushare does
not (hami-control's pending window waits for it; docs/vendor-nodes.md "Known gaps"). Cambricon
writes no bind phase (its plugin does not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import NAMESPACE_URL, uuid5

from hami_api._wire import go_json_string
from hami_api.annotations import (
    BIND_PHASE,
    BIND_TIME,
    VGPU_NODE,
    decode_pod_allocation,
    encode_pod_allocation,
)
from hami_api.errors import QuantityError, WireFormatError
from hami_api.quantity import quantity_value
from hami_api.resources import pod_container_names, pod_containers
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_sim.vendors.inventory import Device
from hami_sim.vendors.table import DeviceSpec, Flow, Units

ALLOCATING = "allocating"
SUCCESS = "success"
FAILED = "failed"
DSMLU_PROFILE = "CAMBRICON_DSMLU_PROFILE"
DSMLU_PROFILE_INSTANCE = "CAMBRICON_DSMLU_PROFILE_INSTANCE"
AMD_CU_ALLOCATED = "hami.io/amd-cu-allocated"
"""amd-device-plugin utils/types.go CuAllocation: `{"<device uuid>": "<CU list>"}` per pod."""
AMD_LD_AUDIT = "/usr/local/vgpu/libamvgpu.so"
AWS_NEURON_IDS = "AWS_NEURON_IDS"
ENFLAME_ASSIGNED_CONTAINERS = "assigned-containers"
ENFLAME_ASSIGNED_MINOR = "enflame.com/gcu-assigned-minor"
ENFLAME_ASSIGNED_INDEX = "enflame.com/gcu-assigned-index"
ENFLAME_ASSIGNED_TIME = "enflame.com/gcu-assigned-time"
HYGON_VDEV_DIR = "/usr/local/vgpu/dcu"
HYGON_DRIVER = "/opt/hygondriver"

Json = Mapping[str, Any]


class AllocateFailed(Exception):
    """Allocate cannot answer; the message goes back to the kubelet (and the pod's bind phase fails)."""


@dataclass(frozen=True)
class Answer:
    """What one container gets: env, mounts (container path, host path, read-only) and device nodes
    (container path, host path, permissions)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str, bool], ...] = ()
    devices: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """One container's Allocate: its answer, the pod annotations to write (merge patch), whether the
    pod has nothing left for this plugin (`done`: write bind-phase success, flip the marker), and the
    containers done so far (the `ALLOCATED` flow's count)."""

    answer: Answer
    patch: Mapping[str, str] = field(default_factory=dict)
    done: bool = False
    consumed: int = 0
    container: str = ""
    success: bool = False
    """Write `hami.io/bind-phase: success` (the plugin's own part is done)."""


# --- which pod -----------------------------------------------------------------------------------------


def _meta(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def annotations_of(obj: Json) -> Mapping[str, str]:
    annotations = _meta(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def pod_key(pod: Json) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_uid(pod: Json) -> str:
    return str(_meta(pod).get("uid") or "")


def _phase(pod: Json) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, Mapping) else ""


def _allocation(pod: Json, key: str) -> PodAllocation | None:
    text = annotations_of(pod).get(key) if key else None
    if not isinstance(text, str):
        return None
    try:
        return decode_pod_allocation(text, key)
    except WireFormatError:
        return None


def requests_dsmlu(pod: Json) -> bool:
    """podutils.go requestsDynamicSmlu: a container limits a `cambricon.com/...vcore|.vmemory` above 0."""
    spec = pod.get("spec")
    for c in (spec.get("containers") or []) if isinstance(spec, Mapping) else []:
        limits = (c.get("resources") or {}).get("limits") or {}
        for name, value in limits.items():
            if (
                name.startswith("cambricon.com/")
                and name.endswith((".vcore", ".vmemory"))
                and _positive(value)
            ):
                return True
    return False


def _positive(value: Any) -> bool:
    try:
        return float(str(value)) > 0
    except ValueError:
        return False


def has_work(pod: Json, spec: DeviceSpec, consumed: int = 0) -> bool:
    """Whether `pod` still has containers for this plugin (`consumed`: the `ALLOCATED` flow's count)."""
    table = spec.table
    annotations = annotations_of(pod)
    if table.flow is Flow.DSMLU:
        return annotations.get(table.marker) == "false" and requests_dsmlu(pod)
    if table.flow is Flow.HAMI:
        allocation = _allocation(pod, spec.name(table.to_allocate))
        return allocation is not None and any(len(c) for c in allocation.containers)
    if spec.vendor == "enflame":
        return bool(_gcushare_open(pod, spec)) and ENFLAME_ASSIGNED_TIME in annotations
    if table.marker and annotations.get(table.marker) == "true":
        return False
    allocation = _allocation(pod, spec.name(table.allocated))
    return allocation is not None and sum(1 for c in allocation.containers if len(c)) > consumed


def pending_pods(
    pods: Sequence[Json],
    node: str,
    spec: DeviceSpec,
    *,
    lock_pod: str = "",
    consumed: Mapping[str, int] | None = None,
) -> list[Json]:
    """The pods bound to `node` with work for this plugin: the one the node lock names (`lock_pod`,
    `<ns>/<name>`) first, then a pod another plugin already reported (`success`: the kubelet admits one
    pod at a time, so the pod it is in the middle of), then oldest bind time first."""
    table = spec.table
    done = consumed or {}
    out = []
    for pod in pods:
        meta = _meta(pod)
        if meta.get("deletionTimestamp") or _phase(pod) not in ("", "Pending"):
            continue
        annotations = annotations_of(pod)
        if table.flow is not Flow.DSMLU:
            phases = (ALLOCATING,) if table.flow is Flow.ALLOCATED else (ALLOCATING, SUCCESS)
            if BIND_TIME not in annotations or annotations.get(BIND_PHASE) not in phases:
                continue
            if annotations.get(VGPU_NODE) != node:
                continue
        if has_work(pod, spec, done.get(pod_uid(pod), 0)):
            out.append(pod)

    def order(pod: Json) -> tuple[int, int, int, str]:
        annotations = annotations_of(pod)
        try:
            stamp = int(annotations.get(BIND_TIME, "0"))
        except ValueError:
            stamp = 0
        locked = 0 if lock_pod and pod_key(pod) == lock_pod else 1
        started = 0 if annotations.get(BIND_PHASE) == SUCCESS else 1
        return (locked, started, stamp, pod_key(pod))

    return sorted(out, key=order)


def is_primary(spec: DeviceSpec, resource: str) -> bool:
    """Whether Allocate on `resource` does the vendor's work (else it answers an empty response without
    looking for a pod: Mthreads' sgpu-core and sgpu-memory, Cambricon's real-mlu-counts)."""
    return next((r.primary for r in spec.table.resources if spec.name(r.name) == resource), False)


def pick_pod(
    pods: Sequence[Json],
    node: str,
    spec: DeviceSpec,
    *,
    lock_pod: str = "",
    consumed: Mapping[str, int] | None = None,
) -> Json:
    """The pod being allocated; `AllocateFailed` with the plugin's message when there is none (and, for
    Cambricon's dynamic-smlu, when there are several)."""
    found = pending_pods(pods, node, spec, lock_pod=lock_pod, consumed=consumed)
    if spec.table.flow is Flow.DSMLU:
        if len(found) > 1:
            raise AllocateFailed("number of dynamic smlu candidate pods large than one")
        if not found:
            raise AllocateFailed(
                "failed to get dynamic smlu candidate pods, err no dynamic smlu candidate pod found"
            )
    if not found:
        raise AllocateFailed(f"get pending pod error: no binding pod found on node {node}")
    return found[0]


# --- one container --------------------------------------------------------------------------------------


def _index_of(devices: Sequence[Device], uuid: str) -> Device:
    found = next((d for d in devices if d.uuid == uuid), None)
    if found is None:
        raise AllocateFailed(f"unknown uuid: {uuid}")
    return found


def _indexes(devices: Sequence[Device], slices: Sequence[GPUSlice]) -> list[Device]:
    return [_index_of(devices, s.uuid) for s in slices]


def _next_container(allocation: PodAllocation) -> int:
    return next((i for i, c in enumerate(allocation.containers) if len(c)), -1)


def _names(pod: Json) -> tuple[str, ...]:
    try:
        return pod_container_names(pod)
    except ValueError:
        return ()


def allocate_container(
    pod: Json,
    node: str,
    spec: DeviceSpec,
    devices: Sequence[Device],
    *,
    resource: str,
    device_ids: Sequence[str],
    node_pods: Sequence[Json] = (),
    consumed: int = 0,
    instance: int = 0,
) -> Outcome:
    """One container request of Allocate on `resource` for `pod` (already picked). `node_pods` are the
    node's pods (AMD reads the compute units they hold); `consumed`: the `ALLOCATED` flow's count of
    containers done before; `instance`: the sMLU instance number Cambricon's first call creates.
    `AllocateFailed` for anything the plugin refuses."""
    table = spec.table
    if table.flow is Flow.DSMLU:
        return _dsmlu(pod, spec, instance)
    primary = is_primary(spec, resource)
    if spec.vendor == "awsneuron" and resource.endswith("neuroncore"):
        primary = not _asks(pod, consumed, spec, "aws.amazon.com/neuron")
    if not primary:
        return Outcome(Answer(), consumed=consumed)
    if table.flow is Flow.HAMI:
        return _hami(pod, spec, devices, device_ids=device_ids, node_pods=node_pods)
    if spec.vendor == "enflame":
        return _gcushare(
            pod, node, spec, resource=resource, device_ids=device_ids, node_pods=node_pods, consumed=consumed
        )
    return _by_allocated(pod, spec, devices, consumed)


def _asks(pod: Json, consumed: int, spec: DeviceSpec, resource: str) -> bool:
    """Whether the container the `ALLOCATED` flow takes next limits `resource`."""
    allocation = _allocation(pod, spec.name(spec.table.allocated))
    if allocation is None:
        return False
    entries = [i for i, c in enumerate(allocation.containers) if len(c)]
    if consumed >= len(entries):
        return False
    containers = pod_containers(pod)
    index = entries[consumed]
    if index >= len(containers):
        return False
    limits = (containers[index][0].get("resources") or {}).get("limits") or {}
    return resource in limits


def _hami(
    pod: Json,
    spec: DeviceSpec,
    devices: Sequence[Device],
    *,
    device_ids: Sequence[str],
    node_pods: Sequence[Json],
) -> Outcome:
    table = spec.table
    key = spec.name(table.to_allocate)
    allocation = _allocation(pod, key)
    if allocation is None:
        raise AllocateFailed(
            f"decode device annotations: device {spec.common_word} not found in pod annotations"
        )
    index = _next_container(allocation)
    if index < 0:
        raise AllocateFailed("get next container devices: no pending device allocation found")
    slices = allocation.containers[index].devices
    if len(slices) != len(device_ids):
        raise AllocateFailed(
            f"device number not matched: annotation has {len(slices)}, request has {len(device_ids)}"
        )
    names = _names(pod)
    container = names[index] if index < len(names) else ""
    patch: dict[str, str] = {}
    answer = _answer(pod, spec, devices, slices, container=container, node_pods=node_pods, patch=patch)
    left = list(allocation.containers)
    left[index] = ContainerAllocation()
    erased = PodAllocation(tuple(left))
    patch[key] = encode_pod_allocation(erased)
    done = _next_container(erased) < 0
    return Outcome(answer, patch, done, container=container, success=done)


def _by_allocated(pod: Json, spec: DeviceSpec, devices: Sequence[Device], consumed: int) -> Outcome:
    table = spec.table
    allocation = _allocation(pod, spec.name(table.allocated))
    if allocation is None:
        raise AllocateFailed(f"annotation {spec.name(table.allocated)} not set or invalid")
    entries = [i for i, c in enumerate(allocation.containers) if len(c)]
    if consumed >= len(entries):
        raise AllocateFailed("no pending device allocation found")
    index = entries[consumed]
    names = _names(pod)
    container = names[index] if index < len(names) else ""
    patch: dict[str, str] = {}
    slices = allocation.containers[index].devices
    answer = _answer(pod, spec, devices, slices, container=container, node_pods=(), patch=patch)
    done = consumed + 1 == len(entries)
    if done and table.marker:
        patch[table.marker] = "true"
    return Outcome(answer, patch, done, consumed + 1, container, done)


# --- Enflame DRS: gcushare-device-plugin -----------------------------------------------------------------


def _assigned_records(pod: Json) -> dict[str, dict[str, Any]]:
    """gcushare's `assigned-containers`: container name -> its record (`allocated`, `request`,
    `profileID`, `profileName`, `instanceID`, `instanceUUID`); an unreadable one is an error, as
    PodExistContainerCanBind's json.Unmarshal."""
    raw = annotations_of(pod).get(ENFLAME_ASSIGNED_CONTAINERS)
    if not raw:
        return {}
    try:
        records = json.loads(raw)
    except ValueError:
        records = None
    if not isinstance(records, dict) or not all(isinstance(r, dict) for r in records.values()):
        raise AllocateFailed(
            f"unmarshal assigned containers to map of pod {pod_key(pod)} failed, detail: {raw}"
        )
    return {str(k): dict(v) for k, v in records.items()}


def _drs_limit(c: Mapping[str, Any], resource: str) -> int | None:
    limits = (c.get("resources") or {}).get("limits") or {}
    if resource not in limits:
        return None
    try:
        return quantity_value(limits[resource])
    except QuantityError:
        return 0


def _gcushare_open(pod: Json, spec: DeviceSpec) -> list[tuple[str, int]]:
    """The pod's containers (spec order, init containers not looked at) that limit the DRS resource and
    are not yet `allocated` in `assigned-containers`: (name, limit). A pod whose record cannot be read
    counts as having work (its Allocate then fails as gcushare's does)."""
    resource = spec.name(spec.table.resources[0].name)
    try:
        records = _assigned_records(pod)
    except AllocateFailed:
        records = {}
    pod_spec = pod.get("spec")
    out = []
    for c in (pod_spec.get("containers") or []) if isinstance(pod_spec, Mapping) else []:
        limit = _drs_limit(c, resource)
        name = str(c.get("name") or "")
        if limit is None or records.get(name, {}).get("allocated") is True:
            continue
        out.append((name, limit))
    return out


def _drs_instance(pod: Json, node: str, node_pods: Sequence[Json], index: str) -> tuple[str, str]:
    """The DRS instance the stand-in "creates" (drs.CreateDRSInstance asks the driver; there is none):
    the lowest instance id that no live pod on the node holds on this GCU (`enflame.com/gcu-assigned-
    index`), and a UUID made from the node, the GCU and that id."""
    taken: set[str] = set()
    others = [p for p in node_pods if pod_uid(p) != pod_uid(pod) and _phase(p) not in ("Succeeded", "Failed")]
    for other in [*others, pod]:
        if annotations_of(other).get(ENFLAME_ASSIGNED_INDEX) != index:
            continue
        try:
            records = _assigned_records(other)
        except AllocateFailed:
            continue
        taken.update(str(r["instanceID"]) for r in records.values() if r.get("instanceID"))
    instance = next(str(i) for i in range(len(taken) + 1) if str(i) not in taken)
    made = uuid5(NAMESPACE_URL, f"hami-sim/enflame-drs/{node}/{index}/{instance}")
    return instance, str(made)


_RECORD_FIELDS = ("allocated", "request", "profileID", "profileName", "instanceID", "instanceUUID")
"""gcushare pkg/structs/structs.go AllocateRecord's JSON fields, in its order (all omitempty)."""


def _records_json(records: Mapping[str, Mapping[str, Any]]) -> str:
    """Go's json.Marshal of gcushare's `map[string]AllocateRecord`: keys sorted, fields in struct order."""
    parts = []
    for name in sorted(records):
        record = records[name]
        fields = []
        for key in _RECORD_FIELDS:
            value = record.get(key)
            if value is None:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, int):
                text = str(value)
            else:
                text = go_json_string(str(value))
            fields.append(f'"{key}":{text}')
        parts.append(f"{go_json_string(name)}:{{{','.join(fields)}}}")
    return "{" + ",".join(parts) + "}"


def _gcushare(
    pod: Json,
    node: str,
    spec: DeviceSpec,
    *,
    resource: str,
    device_ids: Sequence[str],
    node_pods: Sequence[Json],
    consumed: int,
) -> Outcome:
    """gcushare-device-plugin (EnflameTechnology/gcushare gcushare-device-plugin/pkg/server/server.go
    Allocate, makeContainerResponse; pkg/resource/pod.go PodExistContainerCanBind,
    GetGCUIDFromPodAnnotation): the container is the first (spec order) that limits the resource by as
    many as the kubelet asks and is not `allocated` in `assigned-containers`; a record with a profile
    gets a DRS instance made; the record becomes `allocated` (with `instanceID`, `instanceUUID`) and
    `enflame.com/gcu-assigned` becomes "true" with the pod's last container (else stays as it is). The
    answer: `ENFLAME_VISIBLE_DEVICES` = the pod's `enflame.com/gcu-assigned-minor`, and
    `TOPS_VISIBLE_DEVICES` = `DRS-<instance UUID>` when an instance was made."""
    wanted = len(device_ids)
    open_ = _gcushare_open(pod, spec)
    records = _assigned_records(pod)
    chosen = next((name for name, limit in open_ if limit == wanted), None)
    if chosen is None:
        raise AllocateFailed(f"invalid allocation request: unable to find pod request {resource}: {wanted}")
    annotations = annotations_of(pod)
    record = dict(records.get(chosen, {}))
    record["allocated"] = True
    marker = spec.table.marker
    assigned = "true" if len(open_) == 1 else annotations.get(marker, "")
    instance_uuid = ""
    if record.get("profileName") is not None and record.get("profileID") is not None:
        index = annotations.get(ENFLAME_ASSIGNED_INDEX, "")
        record["instanceID"], instance_uuid = _drs_instance(pod, node, node_pods, index)
        record["instanceUUID"] = instance_uuid
    records[chosen] = record
    patch = {
        marker: assigned,
        ENFLAME_ASSIGNED_CONTAINERS: _records_json(records),
    }
    minor = annotations.get(ENFLAME_ASSIGNED_MINOR, "")
    if not minor:
        raise AllocateFailed(f"pod {pod_key(pod)} has not been assigned device")
    envs = {"ENFLAME_VISIBLE_DEVICES": minor}
    if instance_uuid:
        envs["TOPS_VISIBLE_DEVICES"] = f"DRS-{instance_uuid}"
    done = len(open_) == 1
    return Outcome(Answer(envs), patch, done, consumed + 1, chosen, done)


def _answer(
    pod: Json,
    spec: DeviceSpec,
    devices: Sequence[Device],
    slices: Sequence[GPUSlice],
    *,
    container: str,
    node_pods: Sequence[Json],
    patch: dict[str, str],
) -> Answer:
    vendor = spec.vendor
    chosen = _indexes(devices, slices)
    listed = ",".join(str(d.index) for d in chosen)
    if vendor == "hygon":
        return _hygon(pod, chosen, slices, container)
    if vendor == "ascend":
        return _ascend(pod, spec, chosen, slices)
    if vendor == "amd":
        return _amd(pod, chosen, slices, node_pods, patch)
    if vendor == "biren":
        # biren-device-plugin plugin.go Allocate (runc): the cards by id, /dev/biren/<id> each.
        ids = [d.uuid for d in chosen]
        return Answer(
            {"BR_PHY_CARDS": ",".join(ids)}, (), tuple((f"/dev/biren/{i}",) * 2 + ("rw",) for i in ids)
        )
    if vendor == "awsneuron":
        if any(s.usedcores == 0 for s in slices) or _limits(pod, container).get("aws.amazon.com/neuron"):
            return Answer({"AWS_NEURON_VISIBLE_DEVICES": listed})
        cores = [
            str(d.cores * d.index + bit)
            for d, s in zip(chosen, slices, strict=True)
            for bit in range(d.cores)
            if s.usedcores >> bit & 1
        ]
        # aws-neuron-sdk deploy/infrastructure/scheduler-flow.rst (no public plugin source): cores 2,3
        # are answered `--device=/dev/neuron1 --env NEURON_RT_VISIBLE_CORES=2,3`.
        nodes = tuple((f"/dev/neuron{d.index}", f"/dev/neuron{d.index}", "rw") for d in chosen)
        return Answer({"NEURON_RT_VISIBLE_CORES": ",".join(cores)}, (), nodes)
    return Answer({spec.table.visible_env: listed})


def _limits(pod: Json, container: str) -> Mapping[str, Any]:
    for c, _init in pod_containers(pod):
        if c.get("name") == container:
            return (c.get("resources") or {}).get("limits") or {}
    return {}


def _hygon(pod: Json, chosen: Sequence[Device], slices: Sequence[GPUSlice], container: str) -> Answer:
    nodes = [("/dev/kfd", "/dev/kfd", "rwm"), ("/dev/mkfd", "/dev/mkfd", "rwm")]
    for d in chosen:
        for path in (f"/dev/dri/card{d.index}", f"/dev/dri/renderD{128 + d.index}"):
            nodes.append((path, path, "rw"))
    mounts: list[tuple[str, str, bool]] = []
    if len(slices) == 1 and slices[0].usedmem < chosen[0].memory_mib:
        vdev = f"{HYGON_VDEV_DIR}/{pod_uid(pod)}_{container}_{chosen[0].index}"
        mounts += [("/etc/vdev/docker/", vdev, False), (HYGON_DRIVER, HYGON_DRIVER, False)]
    mounts.append(("/opt/hyhal", "/opt/hyhal", True))
    return Answer({}, tuple(mounts), tuple(nodes))


def _ascend(pod: Json, spec: DeviceSpec, chosen: Sequence[Device], slices: Sequence[GPUSlice]) -> Answer:
    key = spec.name(spec.table.allocated)
    raw = annotations_of(pod).get(key)
    if raw is None:
        raise AllocateFailed(f"build runtimeInfo lookup: annotation {key} not set")
    try:
        infos = json.loads(raw)
        temps = {str(i.get("UUID")): str(i.get("temp") or "") for i in infos if isinstance(i, Mapping)}
    except (ValueError, TypeError, AttributeError):
        raise AllocateFailed(f"build runtimeInfo lookup: annotation {key} value {raw} invalid") from None
    envs = {"ASCEND_VISIBLE_DEVICES": ",".join(str(d.index) for d in chosen)}
    spec_name = next((temps[s.uuid] for s in slices if temps.get(s.uuid)), "")
    if spec_name:
        envs["ASCEND_VNPU_SPECS"] = spec_name
    return Answer(envs)


def _cu_list(bits: Sequence[int]) -> str:
    """`0-3,8,10-12` (amd-device-plugin plugin.go allocationToIDList); "0" for none."""
    if not bits:
        return "0"
    parts = []
    start = prev = bits[0]
    for b in [*bits[1:], -2]:
        if b == prev + 1:
            prev = b
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = b
    return ",".join(parts)


def _cu_bits(text: str) -> set[int]:
    out: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            out.update(range(int(low), int(high or low) + 1))
        except ValueError:
            continue
    return out


def _amd(
    pod: Json,
    chosen: Sequence[Device],
    slices: Sequence[GPUSlice],
    node_pods: Sequence[Json],
    patch: dict[str, str],
) -> Answer:
    held: dict[str, set[int]] = {}
    live = [p for p in node_pods if pod_uid(p) != pod_uid(pod) and _phase(p) not in ("Succeeded", "Failed")]
    for other in [*live, pod]:
        raw = annotations_of(other).get(AMD_CU_ALLOCATED)
        if not raw:
            continue
        try:
            lists = json.loads(raw)
        except ValueError:
            raise AllocateFailed(f"parse existing {AMD_CU_ALLOCATED}: {raw!r}") from None
        for uuid, text in lists.items() if isinstance(lists, Mapping) else ():
            held.setdefault(str(uuid), set()).update(_cu_bits(str(text)))
    mine = json.loads(annotations_of(pod).get(AMD_CU_ALLOCATED) or "{}")
    masks = []
    for i, (d, s) in enumerate(zip(chosen, slices, strict=True)):
        taken = held.setdefault(d.uuid, set())
        free = [b for b in range(d.cores) if b not in taken][: s.usedcores]
        if len(free) < s.usedcores or s.usedcores <= 0:
            raise AllocateFailed(
                f"allocate cu for {d.uuid}: insufficient free CUs: "
                f"need={s.usedcores} free={d.cores - len(taken)}"
            )
        taken.update(free)
        masks.append(f"{i}:{_cu_list(free)}")
        merged = sorted(_cu_bits(str(mine.get(d.uuid, ""))) | set(free))
        mine[d.uuid] = _cu_list(merged)
    patch[AMD_CU_ALLOCATED] = json.dumps(mine, separators=(",", ":"), sort_keys=True)
    envs = {
        "HSA_CU_MASK": ";".join(masks),
        "ROCR_VISIBLE_DEVICES": ",".join(d.rocr_uuid for d in chosen),
        "HIP_DEVICE_MEMORY_LIMIT": f"{slices[0].usedmem}m",
        "LD_AUDIT": AMD_LD_AUDIT,
    }
    nodes = [("/dev/kfd", "/dev/kfd", "rw")]
    for d in chosen:
        for path in (f"/dev/dri/card{d.index}", f"/dev/dri/renderD{128 + d.index}"):
            nodes.append((path, path, "rw"))
    mounts = ((AMD_LD_AUDIT, "/usr/local/vgpu/libamvgpu.so", True),)
    return Answer(envs, mounts, tuple(nodes))


def dsmlu_slot(pod: Json) -> tuple[int, int, int]:
    """podutils.go GetProfileFromAnnotation: `<slot>_<vcore>_<vmemory>` of `CAMBRICON_DSMLU_PROFILE`."""
    value = annotations_of(pod).get(DSMLU_PROFILE)
    if value is None:
        raise AllocateFailed(f"get profile from annotation pod annotation {DSMLU_PROFILE} not found")
    parts = value.split("_")
    if len(parts) != 3:
        raise AllocateFailed(f"get profile from annotation invalid pod annotation {value}")
    try:
        slot, vcore, vmemory = (int(p) for p in parts)
    except ValueError:
        raise AllocateFailed(f"get profile from annotation invalid pod annotation {value}") from None
    return slot, vcore, vmemory


def _dsmlu(pod: Json, spec: DeviceSpec, instance: int) -> Outcome:
    slot, _vcore, _vmemory = dsmlu_slot(pod)
    if not 0 <= slot < spec.count:
        raise AllocateFailed(f"failed GetDeviceUUIDByIndex {slot}")
    nodes = (
        (f"/dev/cambricon_dev{slot}", f"/dev/cambricon_dev{slot}", "rw"),
        (f"/dev/cambricon_ipcm{slot}", f"/dev/cambricon_ipcm{slot}", "rw"),
        (
            f"/dev/cambricon-caps/cap_dev{slot}_mi{instance}",
            f"/dev/cambricon-caps/cap_dev{slot}_mi{instance}",
            "rw",
        ),
    )
    return Outcome(Answer({}, (), nodes))


def dsmlu_assigned(pod: Json, instance: int, profile_id: int = 0) -> dict[str, str]:
    """What Cambricon's second Allocate of a pod writes: assigned, and `<profile>_<instance handle>_
    <slot>_<instance>` (the handle is `instance << 8 | slot`, cndev's)."""
    slot, _vcore, _vmemory = dsmlu_slot(pod)
    handle = instance << 8 | slot
    return {
        "CAMBRICON_DSMLU_ASSIGNED": "true",
        DSMLU_PROFILE_INSTANCE: f"{profile_id}_{handle}_{slot}_{instance}",
    }


def bind_phase(phase: str) -> dict[str, str]:
    return {BIND_PHASE: phase}


def resource_units(spec: DeviceSpec, resource: str) -> Units | None:
    return next((r.units for r in spec.table.resources if spec.name(r.name) == resource), None)


__all__ = [
    "ALLOCATING",
    "AMD_CU_ALLOCATED",
    "FAILED",
    "SUCCESS",
    "AllocateFailed",
    "Answer",
    "Outcome",
    "allocate_container",
    "annotations_of",
    "bind_phase",
    "dsmlu_assigned",
    "dsmlu_slot",
    "has_work",
    "is_primary",
    "pending_pods",
    "pick_pod",
    "pod_key",
    "pod_uid",
    "requests_dsmlu",
]
