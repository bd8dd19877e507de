"""Whether the cluster had room, at the end of a chaos run, for a pod that did not settle: the report tells
a real loss (room was there and the pod was not placed, or it cannot be placed for another reason than room)
from a wait (the cluster was full for what it asks). Pure: it reads what the checker read
(`invariants.Snapshot`) and the DeviceClasses.

Device-plugin pods, with the checker's own decoders: each GPU as its node registered it (memory, cores,
slots, health, model) less what the live pods placed by HAMi hold (their allocation annotations, each at
its busiest phase). A container asks `nvidia.com/gpu` GPUs, each with its `nvidia.com/gpumem` MiB, or its
`nvidia.com/gpumem-percentage` of the GPU's memory, or neither: the whole memory (HAMi's `defaultMemory: 0`),
and `nvidia.com/gpucores` (100: the GPU alone); `nvidia.com/use-gputype`, `nouse-gputype`,
`use-gpuuuid` and `nouse-gpuuuid` pick the GPUs. Each regular init container must fit alone; the sidecars
and app containers together. One node with room is enough; the search takes the fullest GPU that fits
first (a heuristic: it can miss a packing that exists, never invents one).

DRA pods: the pod's claims against the node's ResourceSlices less the allocated claims, with the
scheduler stand-in's allocator (kube-scheduler's structured allocator, `hami_sim.scheduler.dra`), node
by node. A claim already allocated needs its node to take the pod; a claim that was never created is a
loss whatever the room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami_sim.chaos.decoding import DecodeError, Gpu, parse_quantity
from hami_sim.chaos.invariants import (
    Held,
    Snapshot,
    _holdings,
    _Out,
    is_live,
    pod_containers,
    registered_gpus,
)
from hami_sim.scheduler.dra.allocator import AllocatedState, AllocationError, Allocator
from hami_sim.scheduler.dra.plugin import ClaimGate, DynamicResources, allocation_of

JSON = Mapping[str, Any]

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
USE_TYPE = "nvidia.com/use-gputype"
NOUSE_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = "nvidia.com/use-gpuuuid"
NOUSE_UUID = "nvidia.com/nouse-gpuuuid"


@dataclass(frozen=True)
class Room:
    """The answer for one pod: `room` True when it could have been placed at the end (a real loss),
    False when the cluster was full for it (a wait); `detail` says where or why."""

    room: bool
    detail: str


# --- device-plugin pods ---------------------------------------------------------------------------------


@dataclass
class _Free:
    gpu: Gpu
    node: str
    slots: int
    mem: int
    cores: int
    holders: int
    exclusive: bool


@dataclass(frozen=True)
class _Ask:
    count: int
    mem: int | None
    """MiB per GPU; None: a percentage (`percent`) or the whole memory."""
    percent: int
    cores: int


def _int(value: Any) -> int:
    try:
        return int(parse_quantity(value, "limit"))
    except DecodeError:
        return 0


def _container_ask(container: JSON) -> _Ask | None:
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    if not isinstance(limits, Mapping):
        return None
    count = _int(limits.get(GPU, 0))
    if count <= 0:
        return None
    mem = _int(limits[GPUMEM]) if GPUMEM in limits else None
    percent = _int(limits[GPUMEM_PERCENT]) if GPUMEM_PERCENT in limits else 100
    return _Ask(count, mem, percent, _int(limits.get(GPUCORES, 0)))


def _listed(annotations: JSON, key: str) -> list[str]:
    return [v.strip() for v in str(annotations.get(key) or "").split(",") if v.strip()]


def _allowed(gpu: Gpu, annotations: JSON) -> bool:
    model = gpu.model.lower()
    use, nouse = _listed(annotations, USE_TYPE), _listed(annotations, NOUSE_TYPE)
    if use and not any(t.lower() in model for t in use):
        return False
    if any(t.lower() in model for t in nouse):
        return False
    uuids, nouuids = _listed(annotations, USE_UUID), _listed(annotations, NOUSE_UUID)
    return (not uuids or gpu.id in uuids) and gpu.id not in nouuids


def _fits(free: _Free, ask: _Ask) -> bool:
    mem = ask.mem if ask.mem is not None else free.gpu.devmem * ask.percent // 100
    if free.slots < 1 or free.mem < mem or free.exclusive or not free.gpu.healthy:
        return False
    if ask.cores >= 100:
        return free.holders == 0
    return free.cores >= ask.cores


def _take(free: _Free, ask: _Ask) -> None:
    free.slots -= 1
    free.mem -= ask.mem if ask.mem is not None else free.gpu.devmem * ask.percent // 100
    free.cores -= ask.cores
    free.holders += 1
    free.exclusive = free.exclusive or ask.cores >= 100


def _place(gpus: list[_Free], asks: Sequence[_Ask], annotations: JSON) -> bool:
    """Place every ask on `gpus` (changed in place), each on distinct GPUs, fullest fitting GPU first."""
    for ask in asks:
        candidates = sorted(
            (f for f in gpus if _allowed(f.gpu, annotations) and _fits(f, ask)),
            key=lambda f: (f.mem, f.gpu.id),
        )
        if len(candidates) < ask.count:
            return False
        for free in candidates[: ask.count]:
            _take(free, ask)
    return True


def _free_gpus(snapshot: Snapshot) -> dict[str, list[_Free]]:
    held: dict[str, list[tuple[str, Held]]] = _holdings(snapshot.pods, _Out(snapshot.at))
    by_node: dict[str, list[_Free]] = {}
    for uuid, (node, gpu) in sorted(registered_gpus(snapshot.nodes).items()):
        holders = [h for _, h in held.get(uuid, [])]
        by_node.setdefault(node, []).append(
            _Free(
                gpu,
                node,
                gpu.count - sum(h.slots for h in holders),
                gpu.devmem - sum(h.mem for h in holders),
                gpu.devcore - sum(h.cores for h in holders),
                len(holders),
                any(h.exclusive for h in holders),
            )
        )
    return by_node


def device_plugin_room(pod: JSON, snapshot: Snapshot) -> Room:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    phases: list[list[_Ask]] = []
    together: list[_Ask] = []
    for container, kind in pod_containers(pod):
        ask = _container_ask(container)
        if ask is None:
            continue
        if kind == "init":
            phases.append([ask])
        else:
            together.append(ask)
    phases.append(together)
    wanted = "; ".join(
        f"{a.count} GPU x {a.mem if a.mem is not None else f'{a.percent}%'} MiB, {a.cores} cores"
        for a in together
    )
    for node, gpus in sorted(_free_gpus(snapshot).items()):
        if all(_place([replace(g) for g in gpus], phase, annotations) for phase in phases):
            return Room(True, f"{node} had room for it ({wanted})")
    return Room(False, f"no node had room for {wanted or 'it'}")


# --- DRA pods ---------------------------------------------------------------------------------------------


def dra_room(pod: JSON, snapshot: Snapshot, device_classes: Sequence[JSON]) -> Room:
    plugin = DynamicResources()
    plugin.replace_classes([dict(c) for c in device_classes])
    plugin.replace_slices([dict(s) for s in snapshot.resource_slices])
    plugin.replace_claims([dict(c) for c in snapshot.resource_claims])
    try:
        claims = plugin.pod_claims(pod)
    except ClaimGate as gate:
        return Room(True, f"not a matter of room: {gate}")
    allocated = [c for c in claims if allocation_of(c) is not None]
    if allocated:
        return Room(
            True, f"{len(allocated)} of its claims allocated already: the pod was not placed on their node"
        )
    live_claims = [c for c in snapshot.resource_claims if allocation_of(c) is not None]
    allocator = Allocator(claims, plugin.inventory, plugin.classes, AllocatedState.of(live_claims))
    nodes = sorted(
        {str((s.get("spec") or {}).get("nodeName") or "") for s in snapshot.resource_slices} - {""}
    )
    labels = {
        str((n.get("metadata") or {}).get("name")): dict((n.get("metadata") or {}).get("labels") or {})
        for n in snapshot.nodes
    }
    reason = "no node publishes devices"
    for node in nodes:
        try:
            outcome = allocator.allocate(node, labels.get(node, {}))
        except AllocationError as err:
            return Room(True, f"not a matter of room: {err}")
        if outcome.fits:
            return Room(True, f"{node} had room for its claims")
        reason = outcome.reason
    return Room(False, f"no node had room for its claims ({reason})")


# --- either -----------------------------------------------------------------------------------------------


def room_for(pod: JSON, snapshot: Snapshot, device_classes: Sequence[JSON] = ()) -> Room:
    """Whether the cluster of `snapshot` had room for `pod` (not placed): its claims' (a DRA pod) or its
    GPUs' (a device-plugin pod)."""
    if not is_live(pod):
        return Room(True, "not live")
    if (pod.get("spec") or {}).get("resourceClaims"):
        return dra_room(pod, snapshot, device_classes)
    return device_plugin_room(pod, snapshot)


__all__ = ["Room", "device_plugin_room", "dra_room", "room_for"]
