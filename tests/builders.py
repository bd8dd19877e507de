"""Builders for the objects the tests send and feed: pods, containers, nodes, GPUs, allocations,
AdmissionReviews, ResourceQuotas and ConfigMaps. This is the one place they are defined; tests call
them with keyword arguments for what matters to them and leave the rest at the defaults below.

Every Kubernetes object is plain JSON (a dict as the API server sends it): the pure functions take it
as it is, `hami_kube` sends it as it is, and the official client sends a dict body unchanged.
An optional field is left out unless a test asks for it, so a builder's output holds little more than
what the test said.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_api import annotations as ann
from hami_api import dra
from hami_api.resources import ResourceNames
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, MigProfile, PodAllocation
from hami_control.cache import ClusterCache
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.usage import NodeGPUs, with_slices
from hami_node.gpu.backend import PhysicalGPU

Json = dict[str, Any]

RESOURCES = ResourceNames()
"""HAMi's default resource names (nvidia.com/gpu, nvidia.com/gpumem, ...)."""
IMAGE = "busybox:1.36"
"""The image of a container built here unless a test names another (nothing pulls it)."""
T4 = "NVIDIA-Tesla T4"
"""The GPU type of a `gpu_info` unless a test names another."""

# --- containers and pods ------------------------------------------------------------------------------


def gpu_limits(
    gpus: int | str | None = None,
    *,
    gpumem: int | str | None = None,
    gpumem_percentage: int | str | None = None,
    gpucores: int | str | None = None,
    priority: int | str | None = None,
) -> dict[str, str]:
    """HAMi's resources as container limits (or requests), each value as the API server stores it
    (a string); a resource left at None is not set."""
    values = (
        (RESOURCES.count, gpus),
        (RESOURCES.memory, gpumem),
        (RESOURCES.memory_percentage, gpumem_percentage),
        (RESOURCES.cores, gpucores),
        (RESOURCES.priority, priority),
    )
    return {name: str(value) for name, value in values if value is not None}


def container(
    name: str | None = "main",
    *,
    gpus: int | str | None = None,
    gpumem: int | str | None = None,
    gpumem_percentage: int | str | None = None,
    gpucores: int | str | None = None,
    priority: int | str | None = None,
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    image: str | None = IMAGE,
    env: Mapping[str, str] | Sequence[Any] | None = None,
    restart_policy: str | None = None,
    **fields: Any,
) -> Json:
    """A container. HAMi's resources go into `limits` with any other `limits` given (values as given:
    a test of quantity parsing may pass numbers); `requests` as given; `env` as name/value pairs from
    a mapping, else as given (a list of EnvVar objects, or the bad input a test needs);
    `restart_policy="Always"` makes an init container a sidecar; `fields` are any other container
    fields, spelled as in the JSON (`args=[...]`, `ports=[...]`). `image=None` leaves the image out,
    `name=None` the name (an unnamed container, as a Go unit test may write one).
    `resources` is present only when a limit or request is."""
    body: Json = {}
    if name is not None:
        body["name"] = name
    if image is not None:
        body["image"] = image
    all_limits = {
        **gpu_limits(
            gpus, gpumem=gpumem, gpumem_percentage=gpumem_percentage, gpucores=gpucores, priority=priority
        ),
        **(limits or {}),
    }
    resources: Json = {}
    if all_limits or limits is not None:
        resources["limits"] = all_limits
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        body["resources"] = resources
    if isinstance(env, Mapping):
        body["env"] = [{"name": k, "value": v} for k, v in env.items()]
    elif env is not None:
        body["env"] = env
    if restart_policy is not None:
        body["restartPolicy"] = restart_policy
    body.update(fields)
    return body


def pod(
    name: str | None = "p",
    *containers: Mapping[str, Any],
    namespace: str | None = None,
    uid: str | None = None,
    generate_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    init: Sequence[Mapping[str, Any]] = (),
    scheduler_name: str | None = None,
    node_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    phase: str | None = None,
    resource_version: str | None = None,
    deletion_timestamp: str | None = None,
    claim_statuses: Mapping[str, str] | None = None,
    **spec: Any,
) -> Json:
    """A Pod. Without `containers` and `init`, one plain `container()`; `init` are its init
    containers (a sidecar is an init container with `restart_policy="Always"`); `phase` sets
    `status.phase`; `claim_statuses` sets `status.resourceClaimStatuses` (pod claim name -> the
    generated ResourceClaim's name); `spec` are any other pod spec fields, spelled as in the JSON
    (`tolerations=[...]`, `resourceClaims=[...]`). `name=None` leaves the name out (with
    `generate_name`, or to build an invalid pod)."""
    meta: Json = {}
    for key, value in (
        ("name", name),
        ("generateName", generate_name),
        ("namespace", namespace),
        ("uid", uid),
        ("resourceVersion", resource_version),
        ("deletionTimestamp", deletion_timestamp),
    ):
        if value is not None:
            meta[key] = value
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    body: Json = {}
    if scheduler_name is not None:
        body["schedulerName"] = scheduler_name
    if node_name is not None:
        body["nodeName"] = node_name
    if node_selector is not None:
        body["nodeSelector"] = dict(node_selector)
    if init:
        body["initContainers"] = [dict(c) for c in init]
    body["containers"] = [dict(c) for c in containers] or ([] if init else [container()])
    body.update(spec)
    obj: Json = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if phase is not None:
        obj["status"] = {"phase": phase}
    if claim_statuses is not None:
        obj.setdefault("status", {})["resourceClaimStatuses"] = [
            {"name": k, "resourceClaimName": v} for k, v in claim_statuses.items()
        ]
    return obj


def gpu_pod(
    name: str | None = "p",
    *,
    gpus: int | str | None = 1,
    gpumem: int | str | None = None,
    gpumem_percentage: int | str | None = None,
    gpucores: int | str | None = None,
    priority: int | str | None = None,
    image: str | None = IMAGE,
    **fields: Any,
) -> Json:
    """A pod of one container `main` asking for `gpus` GPUs (and the GPU memory, percentage, cores and
    priority given); `fields` are `pod`'s keyword arguments."""
    main = container(
        gpus=gpus,
        gpumem=gpumem,
        gpumem_percentage=gpumem_percentage,
        gpucores=gpucores,
        priority=priority,
        image=image,
    )
    return pod(name, main, **fields)


def binding(
    pod_name: str,
    node_name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
) -> Json:
    """A pods/binding body: what a scheduler (here, hami-control) POSTs to place a pod on a node; the
    API server copies `annotations` onto the pod, and checks `uid` / `resource_version` (preconditions)
    when given."""
    meta: Json = {"name": pod_name}
    if uid is not None:
        meta["uid"] = uid
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


def resource_quota(hard: Mapping[str, Any], *, name: str = "gpu", namespace: str | None = None) -> Json:
    """A ResourceQuota with `hard` limits (`{"limits.nvidia.com/gpumem": "40000"}`)."""
    meta: Json = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta, "spec": {"hard": dict(hard)}}


def config_map(name: str, data: Mapping[str, str] | None = None) -> Json:
    """A ConfigMap (data `{"v": "1"}` unless given): the plainest object to create, watch and delete."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": dict(data) if data is not None else {"v": "1"},
    }


# --- HAMi's allocation annotations ----------------------------------------------------------------------


def allocation(*containers: Sequence[tuple[str, int, int]]) -> PodAllocation:
    """One entry per container (init containers first): (GPU uuid, MiB, cores) per device."""
    return PodAllocation(
        tuple(ContainerAllocation(tuple(GPUSlice(u, mem, cores) for u, mem, cores in c)) for c in containers)
    )


def allocation_annotations(
    node: str | None,
    choice: PodAllocation | str | None,
    *,
    bind_phase: str | None = "allocating",
    bound_at: int | None = None,
    keys: Sequence[str] = (ann.DEVICES_TO_ALLOCATE, ann.DEVICES_ALLOCATED),
) -> dict[str, str]:
    """HAMi's allocation annotations on a pod, each one optional: the allocation (encoded, or raw
    text) under each of `keys`, `hami.io/vgpu-node`, `hami.io/bind-phase`, and with `bound_at` (Unix
    seconds) `hami.io/vgpu-time` and `hami.io/bind-time`; a value set to None is not written. For
    exactly what hami-control writes on a Binding, use `hami_control.binder.binding_annotations`."""
    result: dict[str, str] = {}
    if choice is not None:
        text = choice if isinstance(choice, str) else ann.encode_pod_allocation(choice)
        result.update(dict.fromkeys(keys, text))
    if node is not None:
        result[ann.VGPU_NODE] = node
    if bound_at is not None:
        result[ann.VGPU_TIME] = str(bound_at)
    if bind_phase is not None:
        result[ann.BIND_PHASE] = bind_phase
    if bound_at is not None:
        result[ann.BIND_TIME] = str(bound_at)
    return result


# --- GPUs and nodes ----------------------------------------------------------------------------------------


def gpu_info(
    index: int = 0,
    *,
    id: str | None = None,
    count: int = 10,
    devmem: int = 16000,
    devcore: int = 100,
    type: str = T4,
    numa: int = 0,
    mode: str = "hami-core",
    health: bool = True,
    mig_profiles: Sequence[MigProfile] = (),
) -> GPUInfo:
    """One GPU as hami-node registers it: `GPU-<index>` (or `id`), split 10 ways, 16000 MiB, 100 %
    of its cores, a healthy T4 in hami-core mode unless told otherwise."""
    return GPUInfo(
        id=id if id is not None else f"GPU-{index}",
        index=index,
        count=count,
        devmem=devmem,
        devcore=devcore,
        type=type,
        numa=numa,
        mode=mode,
        health=health,
        mig_profiles=tuple(mig_profiles),
    )


def physical_gpu(
    uuid: str,
    index: int = 0,
    *,
    model: str = "NVIDIA A100-SXM4-80GB",
    memory_mib: int = 81920,
    minor: int | None = None,
    numa_node: int | None = 0,
    pci_bus_id: str | None = None,
    healthy: bool = True,
) -> PhysicalGPU:
    """One GPU as hami-node's GPU backend lists it: an 80 GB A100 on NUMA node 0, /dev/nvidia<index>
    (or `minor`), at PCI bus `00000000:0<index>:00.0` unless told otherwise."""
    return PhysicalGPU(
        index=index,
        uuid=uuid,
        model=model,
        memory_mib=memory_mib,
        minor=index if minor is None else minor,
        numa_node=numa_node,
        pci_bus_id=pci_bus_id if pci_bus_id is not None else f"00000000:0{index}:00.0",
        healthy=healthy,
    )


def fake_gpu(n: int, **fields: Any) -> Json:
    """One GPU entry of a fake inventory document (hami_node's fake backend): `GPU-<n>`, model "M",
    1024 MiB, and `fields` as the file spells them (`numa=1`, `health=False`)."""
    return {"uuid": f"GPU-{n}", "model": "M", "memory": 1024, **fields}


def fake_inventory(*gpus: Mapping[str, Any], **top: Any) -> Json:
    """A fake inventory document: its `gpus`, and `top` for the other top-level keys (`nvml=...`)."""
    return {"gpus": [dict(g) for g in gpus], **top}


def node(
    name: str,
    gpus: Sequence[GPUInfo] | None = None,
    *,
    register: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    allocatable: Mapping[str, Any] | None = None,
    capacity: Mapping[str, Any] | None = None,
    ready: bool | str | None = True,
    unschedulable: bool = False,
    taints: Sequence[Mapping[str, str]] = (),
    resource_version: str | None = None,
    status: Mapping[str, Any] | None = None,
) -> Json:
    """A Node. With `gpus`: their `hami.io/node-nvidia-register` annotation (or `register`, raw text)
    and `nvidia.com/gpu` allocatable as their slots (a value in `allocatable` wins); the Ready condition
    True (False with `ready=False`, a status as given with a string such as "Unknown", none with
    `ready=None`); `capacity` as given, else the same as `allocatable` (a kubelet that reserves
    nothing), their values as given (a test of quantity parsing may pass a non-string); `status` are
    further status fields as given, over those built (a section the keywords cannot spell, such as a
    malformed `{"allocatable": "oops"}`); the status is left out when nothing is in it (`ready=None`,
    no other status, `status` not given); `unschedulable` cordons the node; `taints` as given."""
    meta: Json = {"name": name}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if labels is not None:
        meta["labels"] = dict(labels)
    all_annotations = dict(annotations or {})
    if register is not None:
        all_annotations[ann.NODE_REGISTER] = register
    elif gpus is not None:
        all_annotations[ann.NODE_REGISTER] = ann.encode_node_register(gpus)
    if all_annotations or annotations is not None:
        meta["annotations"] = all_annotations
    state: Json = {}
    slots = {RESOURCES.count: str(sum(g.count for g in gpus))} if gpus is not None else {}
    if slots or allocatable is not None:
        state["allocatable"] = {**slots, **(allocatable or {})}
    if capacity is not None or "allocatable" in state:
        state["capacity"] = dict(capacity if capacity is not None else state["allocatable"])
    if ready is not None:
        condition = ready if isinstance(ready, str) else ("True" if ready else "False")
        state["conditions"] = [{"type": "Ready", "status": condition}]
    state.update(status or {})
    spec: Json = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    obj: Json = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if state or status is not None:
        obj["status"] = state
    if spec:
        obj["spec"] = spec
    return obj


def node_gpus(
    *gpus: GPUInfo,
    name: str = "n1",
    cordon: Iterable[str] = (),
    slices: Iterable[GPUSlice] = (),
) -> NodeGPUs:
    """hami-control's view of node `name`: its GPUs, those cordoned (by UUID) and `slices` already
    placed on them."""
    return with_slices(NodeGPUs.of(name, gpus, cordon), slices)


# --- admission ---------------------------------------------------------------------------------------------

REVIEW_UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
"""The request UID of an AdmissionReview unless a test names another (the one in Kubernetes' docs)."""
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
PODS_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}


def admission_review(
    obj: Any,
    *,
    operation: str = "CREATE",
    uid: str = REVIEW_UID,
    namespace: str | None = None,
    version: str = "v1",
    kind: Mapping[str, str] = POD_KIND,
    resource: Mapping[str, str] | None = PODS_RESOURCE,
    dry_run: bool | None = None,
    old_object: Any = None,
    **request: Any,
) -> Json:
    """An AdmissionReview request (`admission.k8s.io/<version>`) for `obj`, as the API server sends it
    to a webhook: CREATE unless told otherwise (an UPDATE carries `old_object`), `dryRun` when
    `dry_run` is given; `request` are any other request fields (`userInfo=...`, `subResource=...`)."""
    body: Json = {"uid": uid, "kind": dict(kind)}
    if resource is not None:
        body["resource"] = dict(resource)
    if namespace is not None:
        body["namespace"] = namespace
    body["operation"] = operation
    body["object"] = obj
    if old_object is not None:
        body["oldObject"] = old_object
    if dry_run is not None:
        body["dryRun"] = dry_run
    body.update(request)
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview", "request": body}


def as_body(obj: Any) -> bytes:
    """`obj` as a JSON request body."""
    return json.dumps(obj).encode()


@dataclass
class FixedQuota:
    """A `quota.QuotaView` with the same limits and usage in every namespace."""

    limit: QuotaLimits
    usage: QuotaUsage = field(default_factory=QuotaUsage)

    def limits(self, namespace: str) -> QuotaLimits:
        return self.limit

    def used(self, namespace: str) -> QuotaUsage:
        return self.usage


def gpu_usage(cache: ClusterCache, uuid: str, node: str = "n1") -> tuple[int, int, int]:
    """(slices, MiB, cores %) used on GPU `uuid` of `node`, as the cache counts them."""
    gpus = cache.node_gpus(node)
    assert gpus is not None, f"node {node} is not registered"
    g = gpus.gpu(uuid)
    assert g is not None, f"node {node} has no GPU {uuid}"
    return (g.used, g.usedmem, g.usedcores)


# --- DRA: ResourceSlices, DeviceClasses, ResourceClaims (resource.k8s.io/v1) ------------------------------


def dra_capacity(
    value: str,
    *,
    default: str | None = None,
    minimum: str | None = None,
    maximum: str | None = None,
    step: str | None = None,
    valid_values: Sequence[str] | None = None,
) -> Json:
    """A DeviceCapacity: `value`, with a requestPolicy when any policy field is given (`minimum` and
    `maximum`/`step` make a validRange, `valid_values` a validValues list)."""
    cap: Json = {"value": value}
    policy: Json = {}
    if default is not None:
        policy["default"] = default
    if minimum is not None or maximum is not None or step is not None:
        policy["validRange"] = {
            k: v for k, v in (("min", minimum), ("max", maximum), ("step", step)) if v is not None
        }
    if valid_values is not None:
        policy["validValues"] = list(valid_values)
    if policy:
        cap["requestPolicy"] = policy
    return cap


def hami_gpu_device(
    minor: int = 0,
    *,
    memory_mib: int = 81920,
    product: str = "NVIDIA-A100-SXM4-80GB",
    shareable: bool = True,
    uuid: str | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    **attributes: Any,
) -> Json:
    """One GPU as hami-node publishes it in DRA mode (hami_api.dra): `hami-gpu-<minor>`, type/uuid/minor/
    productName attributes (more as `name={"int": 1}`), consumable `memory` (default: the whole GPU,
    1 Mi..whole in 1 Mi steps) and `cores` (default 100, 0..100), shareable unless `shareable=False`
    (then no request policy, as the API requires)."""
    memory = f"{memory_mib}Mi"
    device: Json = {
        "name": dra.device_name(minor),
        "attributes": {
            dra.ATTR_TYPE: {"string": dra.DEVICE_TYPE},
            dra.ATTR_UUID: {"string": uuid or f"GPU-{minor:08d}-0000-0000-0000-000000000000"},
            dra.ATTR_MINOR: {"int": minor},
            dra.ATTR_PRODUCT_NAME: {"string": product},
            **attributes,
        },
        "capacity": {
            dra.CAPACITY_MEMORY: dra_capacity(
                memory, default=memory, minimum="1Mi", maximum=memory, step="1Mi"
            )
            if shareable
            else dra_capacity(memory),
            dra.CAPACITY_CORES: dra_capacity("100", default="100", minimum="0", maximum="100", step="1")
            if shareable
            else dra_capacity("100"),
        },
    }
    if shareable:
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = [dict(t) for t in taints]
    return device


def resource_slice(
    node_name: str | None = "n1",
    *devices: Mapping[str, Any],
    name: str | None = None,
    driver: str = dra.DRIVER,
    pool: str | None = None,
    generation: int = 1,
    slice_count: int = 1,
    all_nodes: bool = False,
    node_selector: Mapping[str, Any] | None = None,
    resource_version: str | None = None,
) -> Json:
    """A ResourceSlice of `devices` (default: two `hami_gpu_device`s) for `node_name` (None with
    `all_nodes` or `node_selector`); pool name = node name unless given, name `<node>-<driver>`."""
    spec: Json = {
        "driver": driver,
        "pool": {
            "name": pool or node_name or "cluster",
            "generation": generation,
            "resourceSliceCount": slice_count,
        },
        "devices": [dict(d) for d in devices] if devices else [hami_gpu_device(0), hami_gpu_device(1)],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    if all_nodes:
        spec["allNodes"] = True
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    meta: Json = {"name": name or f"{node_name or pool or 'cluster'}-{driver}"}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def device_class(
    name: str = dra.DEVICE_CLASS, *expressions: str, config: Sequence[Mapping[str, Any]] = ()
) -> Json:
    """A DeviceClass with CEL selectors (default: HAMi-DRA's) and optional `config` entries."""
    spec: Json = {
        "selectors": [{"cel": {"expression": e}} for e in expressions or (dra.DEVICE_CLASS_SELECTOR,)]
    }
    if config:
        spec["config"] = [dict(c) for c in config]
    return {"apiVersion": dra.API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def device_request(
    name: str = "gpu",
    *,
    device_class_name: str = dra.DEVICE_CLASS,
    count: int | None = None,
    mode: str | None = None,
    selectors: Sequence[str] = (),
    capacity: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    admin: bool | None = None,
    first_available: Sequence[Mapping[str, Any]] = (),
) -> Json:
    """A DeviceRequest: `exactly` from the keywords, or `firstAvailable` sub-requests (each built with
    this function; its `exactly` is unwrapped)."""
    if first_available:
        subs = [{"name": s["name"], **s["exactly"]} for s in first_available]
        return {"name": name, "firstAvailable": subs}
    exact: Json = {"deviceClassName": device_class_name}
    if count is not None:
        exact["count"] = count
    if mode is not None:
        exact["allocationMode"] = mode
    if selectors:
        exact["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity is not None:
        exact["capacity"] = {"requests": dict(capacity)}
    if tolerations:
        exact["tolerations"] = [dict(t) for t in tolerations]
    if admin is not None:
        exact["adminAccess"] = admin
    return {"name": name, "exactly": exact}


def dra_claim(
    name: str = "c",
    *requests: Mapping[str, Any],
    namespace: str = "default",
    uid: str | None = None,
    constraints: Sequence[Mapping[str, Any]] = (),
    config: Sequence[Mapping[str, Any]] = (),
    allocation: Mapping[str, Any] | None = None,
    reserved_for: Sequence[Mapping[str, Any]] = (),
    owner_pod: Mapping[str, Any] | None = None,
) -> Json:
    """A ResourceClaim with `requests` (default: one `device_request()`), optional constraints and
    config, and a status (`allocation`, `reserved_for`) when given; `owner_pod` makes the pod its
    controller (a claim generated from a template)."""
    devices: Json = {"requests": [dict(r) for r in requests] or [device_request()]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    meta: Json = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    if owner_pod is not None:
        owner_meta = owner_pod.get("metadata") or {}
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner_meta.get("name"),
                "uid": owner_meta.get("uid"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    claim: Json = {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": devices},
    }
    status: Json = {}
    if allocation is not None:
        status["allocation"] = dict(allocation)
    if reserved_for:
        status["reservedFor"] = [dict(r) for r in reserved_for]
    if status:
        claim["status"] = status
    return claim


def gpu_share(
    memory: str = "4000Mi", cores: str = "30", *, count: int | None = None, name: str = "gpu", **request: Any
) -> Json:
    """A request for a slice of HAMi GPUs (capacity memory + cores), as the webhook's templates write it."""
    return device_request(
        name, count=count, capacity={dra.CAPACITY_MEMORY: memory, dra.CAPACITY_CORES: cores}, **request
    )


# --- DRA (resource.k8s.io/v1) -------------------------------------------------------------------------


def claim_refs(*refs: str | tuple[str, str]) -> Json:
    """A container's `resources` naming pod claims: a name, or (name, request) for one request of it."""
    return {"claims": [{"name": r} if isinstance(r, str) else {"name": r[0], "request": r[1]} for r in refs]}


def dra_result(
    device: str,
    *,
    request: str = "gpu",
    pool: str = "n1",
    driver: str = dra.DRIVER,
    share_id: str | None = None,
    memory: str | None = None,
    cores: str | None = None,
) -> Json:
    """One `status.allocation.devices.results` entry; `memory` / `cores` make its consumedCapacity (as
    the scheduler writes it: both, or none for an exclusive device)."""
    result: Json = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id is not None:
        result["shareID"] = share_id
    consumed = {
        k: v for k, v in ((dra.CAPACITY_MEMORY, memory), (dra.CAPACITY_CORES, cores)) if v is not None
    }
    if consumed:
        result["consumedCapacity"] = consumed
    return result


def resource_claim(
    name: str = "claim",
    *,
    namespace: str = "default",
    uid: str = "11111111-1111-4111-8111-111111111111",
    results: Sequence[Mapping[str, Any]] | None = None,
    reserved_for: Sequence[tuple[str, str]] = (),
    owner_pod: tuple[str, str] | None = None,
    node: str = "n1",
) -> Json:
    """A ResourceClaim; with `results` it is allocated on `node` (status.allocation), `reserved_for`
    lists (pod name, pod uid); `owner_pod` (name, uid) makes it a claim generated for that pod from a
    template (the Pod as controller owner)."""
    meta: Json = {"name": name, "namespace": namespace, "uid": uid}
    if owner_pod is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner_pod[0], "uid": owner_pod[1], "controller": True}
        ]
    claim: Json = {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]}
        },
    }
    status: Json = {}
    if results is not None:
        status["allocation"] = {
            "devices": {"results": [dict(r) for r in results]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in reserved_for]
    if status:
        claim["status"] = status
    return claim
