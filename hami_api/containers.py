"""How kubelet runs a pod's GPU containers, as far as the GPUs go. Pure.

Shared by the scheduler (which must account each container on the GPU kubelet will really give it)
and the node daemon (which checks, at Allocate, that the devices kubelet chose agree with that).

Kinds (`ContainerKind`), in the allocation annotation's order (init containers first, then the app
containers, each in spec order, which is also the order kubelet admits them in):
- `INIT`: a regular init container runs alone, to completion, before the next one starts;
- `SIDECAR`: a restartable init container (`restartPolicy: Always`) starts in init order and keeps
  running beside every later init container and all app containers;
- `APP`: the app containers run together once the init containers are done.

Device reuse, kubelet's `devicesToReuse` (kubernetes pkg/kubelet/cm/devicemanager/manager.go,
`Allocate` and `devicesToAllocate`): kubelet keeps one pool of reusable devices per pod. A container
first takes devices from that pool, and only asks the device plugin (GetPreferredAllocation) for the
rest. A regular init container then puts all its devices into the pool; a sidecar or an app container
takes its devices out of it. When the pool holds more devices than the container asks for, kubelet
takes them in Go map order, which is random: `ReusePool.offer` reports that as an inexact offer.

Footprint (`footprint_slices`): what a pod holds on each GPU at its busiest moment. The pod's phases
are each init container (with the sidecars started before it) and the app phase (every sidecar and
app container); per GPU the footprint is the largest of those phases, slots, memory and cores
compared separately. Checking every phase against the node is the same as checking the footprint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hami_api.resources import pod_containers
from hami_api.types import GPUSlice, PodAllocation


class ContainerKind(StrEnum):
    INIT = "init"
    SIDECAR = "sidecar"
    APP = "app"

    @property
    def concurrent(self) -> bool:
        """Whether the container runs beside the containers admitted after it (sidecars, apps)."""
        return self is not ContainerKind.INIT


def container_kind(container: Mapping[str, Any], init: bool) -> ContainerKind:
    """The kind of one container (`init`: it is listed in `initContainers`)."""
    if not init:
        return ContainerKind.APP
    return ContainerKind.SIDECAR if container.get("restartPolicy") == "Always" else ContainerKind.INIT


def pod_container_kinds(pod: Mapping[str, Any]) -> tuple[ContainerKind, ...]:
    """The kind of every container, in allocation order. Raises `RequestError` on a malformed spec."""
    return tuple(container_kind(c, init) for c, init in pod_containers(pod))


def kinds_of(inits: Sequence[bool], sidecars: Iterable[int] = ()) -> tuple[ContainerKind, ...]:
    """Kinds from per-container init flags and the indexes of the sidecars among them."""
    restartable = frozenset(sidecars)
    return tuple(
        ContainerKind.APP if not init else ContainerKind.SIDECAR if i in restartable else ContainerKind.INIT
        for i, init in enumerate(inits)
    )


def init_kinds(count: int, total: int) -> tuple[ContainerKind, ...]:
    """`count` plain init containers followed by app containers, `total` in all."""
    return tuple(ContainerKind.INIT if i < count else ContainerKind.APP for i in range(total))


# --- kubelet's reuse pool -------------------------------------------------------------------------------

Token = tuple[int, int]
"""A device as kubelet first handed it out: (index of the container it was new for, its position among
that container's new devices). Later containers that reuse the device hold the same token."""


@dataclass(slots=True)
class ReusePool:
    """Kubelet's per-pod pool of devices to reuse, over tokens, advanced one container at a time in
    admission order: `offer` what the next container draws, then `settle` what it took."""

    tokens: list[Token] = field(default_factory=list)

    def offer(self, count: int) -> tuple[tuple[Token, ...], bool]:
        """The pooled devices a container asking `count` devices draws, and whether kubelet takes
        exactly those (True: the pool holds at most `count`, all taken) or any `count` of them
        (False: kubelet iterates a Go map, so which ones is random)."""
        return tuple(self.tokens), len(self.tokens) <= count

    def settle(
        self, index: int, kind: ContainerKind, taken: Sequence[Token], count: int
    ) -> tuple[Token, ...]:
        """Record that container `index` of `kind` holds `taken` from the pool plus new devices up to
        `count`; returns the tokens of its new devices."""
        new = tuple((index, j) for j in range(count - len(taken)))
        if kind is ContainerKind.INIT:
            self.tokens.extend(new)
        else:
            drop = set(taken)
            self.tokens = [t for t in self.tokens if t not in drop]
        return new


# --- footprint --------------------------------------------------------------------------------------------

Held = tuple[int, int, int]
"""(slots, MiB, cores) held on one GPU."""


def _phases(allocation: PodAllocation, kinds: Sequence[ContainerKind]) -> list[dict[str, Held]]:
    """Per phase, what the pod holds on each GPU (see the module docstring)."""

    def add(phase: dict[str, Held], slices: Iterable[GPUSlice]) -> None:
        for s in slices:
            slots, mem, cores = phase.get(s.uuid, (0, 0, 0))
            phase[s.uuid] = (slots + 1, mem + s.usedmem, cores + s.usedcores)

    phases: list[dict[str, Held]] = []
    running: list[GPUSlice] = []  # sidecars started so far
    app: list[GPUSlice] = []
    for index, container in enumerate(allocation):
        kind = kinds[index] if index < len(kinds) else ContainerKind.APP
        if kind is ContainerKind.INIT:
            phase: dict[str, Held] = {}
            add(phase, running)
            add(phase, container.devices)
            phases.append(phase)
        elif kind is ContainerKind.SIDECAR:
            running.extend(container.devices)
        else:
            app.extend(container.devices)
    last: dict[str, Held] = {}
    add(last, running)
    add(last, app)
    phases.append(last)
    return phases


def footprint(allocation: PodAllocation, kinds: Sequence[ContainerKind]) -> dict[str, Held]:
    """Per GPU, the most the pod holds at once: (slots, MiB, cores), each the largest over the phases.
    Entries past `kinds` count as app containers."""
    out: dict[str, Held] = {}
    for phase in _phases(allocation, kinds):
        for uuid, (slots, mem, cores) in phase.items():
            a, b, c = out.get(uuid, (0, 0, 0))
            out[uuid] = (max(a, slots), max(b, mem), max(c, cores))
    return out


def footprint_slices(allocation: PodAllocation, kinds: Sequence[ContainerKind]) -> tuple[GPUSlice, ...]:
    """The footprint as slices, one per slot held, for usage bookkeeping: per GPU (in order of first
    appearance) the app phase's slices (sidecars, then apps) as they are, with any larger init phase's
    extra memory and cores on the first of them and any extra slots as empty slices."""
    if all(kind is ContainerKind.APP for kind in kinds):  # no init phase, no sidecars
        return _app_slices(allocation)
    held = footprint(allocation, kinds)
    by_gpu: dict[str, list[GPUSlice]] = {}
    vendor: dict[str, str] = {}
    order: list[str] = []
    sidecar_slices = [
        s
        for i, c in enumerate(allocation)
        if i < len(kinds) and kinds[i] is ContainerKind.SIDECAR
        for s in c.devices
    ]
    app_slices = [
        s
        for i, c in enumerate(allocation)
        if i >= len(kinds) or kinds[i] is ContainerKind.APP
        for s in c.devices
    ]
    for container in allocation:
        for s in container.devices:
            if s.uuid not in vendor:
                vendor[s.uuid] = s.vendor
                order.append(s.uuid)
    for s in (*sidecar_slices, *app_slices):
        by_gpu.setdefault(s.uuid, []).append(s)
    out: list[GPUSlice] = []
    for uuid in order:
        slots, mem, cores = held[uuid]
        base = by_gpu.get(uuid, [])
        extra_mem = mem - sum(s.usedmem for s in base)
        extra_cores = cores - sum(s.usedcores for s in base)
        if base:
            first = base[0]
            out.append(GPUSlice(uuid, first.usedmem + extra_mem, first.usedcores + extra_cores, first.vendor))
            out.extend(base[1:])
        else:
            out.append(GPUSlice(uuid, extra_mem, extra_cores, vendor[uuid]))
        out.extend(GPUSlice(uuid, 0, 0, vendor[uuid]) for _ in range(slots - max(len(base), 1)))
    return tuple(out)


def _app_slices(allocation: PodAllocation) -> tuple[GPUSlice, ...]:
    """`footprint_slices` of a pod whose containers all run together (the one phase: every slice as it
    is), grouped by GPU in order of first appearance."""
    slices = [s for container in allocation for s in container.devices]
    if len({s.uuid for s in slices}) == len(slices):
        return tuple(slices)
    by_gpu: dict[str, list[GPUSlice]] = {}
    for s in slices:
        by_gpu.setdefault(s.uuid, []).append(s)
    return tuple(s for group in by_gpu.values() for s in group)


def footprint_growth(
    granted: PodAllocation, accounted: PodAllocation, kinds: Sequence[ContainerKind]
) -> tuple[str, ...]:
    """What `granted` holds beyond `accounted` on some GPU, one text per GPU that grew ("GPU-x: 6000
    MiB > 4000 MiB"); empty when the footprint of `granted` fits inside that of `accounted` everywhere."""
    before = footprint(accounted, kinds)
    grown: list[str] = []
    for uuid, (slots, mem, cores) in footprint(granted, kinds).items():
        had = before.get(uuid)
        if had is None:
            grown.append(f"{uuid}: nothing of the pod was accounted there")
            continue
        parts = [
            f"{what} {now}{unit} > {then}{unit}"
            for what, now, then, unit in (
                ("slots", slots, had[0], ""),
                ("memory", mem, had[1], " MiB"),
                ("cores", cores, had[2], " %"),
            )
            if now > then
        ]
        if parts:
            grown.append(f"{uuid}: {', '.join(parts)}")
    return tuple(grown)


__all__ = [
    "ContainerKind",
    "Held",
    "ReusePool",
    "Token",
    "container_kind",
    "footprint",
    "footprint_growth",
    "footprint_slices",
    "init_kinds",
    "kinds_of",
    "pod_container_kinds",
]
