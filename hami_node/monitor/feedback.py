"""HAMi's priority feedback, as a pure function over decoded regions.

HAMi's vGPU monitor (`cmd/vGPUmonitor/feedback.go`, `Observe`, every 5 s) looks at every container's
shared region and writes two of its fields back, which HAMi-core reads before each kernel launch:

1. Every region with `recent_kernel` > 0 has it decremented (HAMi-core sets it to 2 at each kernel
   launch, so it reads "launched a kernel within the last ~2 rounds"). A region still > 0 afterwards
   counts as active on each of its GPUs (valid UUIDs) at its `priority` (HAMi-core's, from
   `CUDA_TASK_PRIORITY`, which HAMi's webhook sets from `nvidia.com/priority`: 0 is the highest;
   negative priorities are not counted).
2. Blocking: a region sharing a GPU with an active region of a strictly higher priority (a smaller
   number) gets `recent_kernel` = -1, which HAMi-core's rate limiter waits on before launching kernels
   (`multiprocess_utilization_watcher.c`: `while (get_recent_kernel() < 0) sleep`); once that is over,
   -1 goes back to 0.
3. Core limit switch: a region sharing a GPU with an active region of higher priority, or with more
   than one active region of its own priority, gets `utilization_switch` = 1 (HAMi-core enforces its
   core limit); otherwise 0 (the limit is off: the container may use the whole GPU while alone).

`observe` returns the writes that change a field (the last value HAMi would store per field), never
touching the other bytes; `hami_node.monitor.regions.apply_writes` stores them in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hami_node.monitor.region import RegionField, SharedRegion


@dataclass(frozen=True, slots=True)
class FeedbackInput:
    """What feedback reads of one region: `key` names it (the file's path); `uuids` its device UUIDs
    by index ("" where unset)."""

    key: str
    uuids: tuple[str, ...]
    priority: int
    recent_kernel: int
    utilization_switch: int

    @classmethod
    def of(cls, key: str, region: SharedRegion) -> FeedbackInput:
        return cls(key, region.uuids, region.priority, region.recent_kernel, region.utilization_switch)


@dataclass(frozen=True, slots=True)
class FieldWrite:
    """Store `value` in `field` of the region `key`."""

    key: str
    field: RegionField
    value: int


def _higher_active(active: dict[str, list[int]], priority: int, uuids: Sequence[str]) -> bool:
    """HAMi's CheckBlocking: an active region of a smaller priority number on one of the GPUs."""
    for uuid in uuids:
        counts = active.get(uuid) if uuid else None
        if counts is not None and any(counts[p] > 0 for p in range(min(priority, len(counts)))):
            return True
    return False


def _contended(active: dict[str, list[int]], priority: int, uuids: Sequence[str]) -> bool:
    """HAMi's CheckPriority: a higher-priority active region, or more than one active at this one."""
    if _higher_active(active, priority, uuids):
        return True
    for uuid in uuids:
        counts = active.get(uuid) if uuid else None
        if counts is not None and 0 <= priority < len(counts) and counts[priority] > 1:
            return True
    return False


def observe(regions: Sequence[FeedbackInput]) -> list[FieldWrite]:
    """The field writes of one feedback round over `regions` (see the module docstring), in region
    order, only where the stored value changes."""
    active: dict[str, list[int]] = {}
    recent: list[int] = []
    for region in regions:
        rk = region.recent_kernel
        if rk > 0:
            rk -= 1
            if rk > 0 and region.priority >= 0:
                for uuid in region.uuids:
                    if not uuid:
                        continue
                    counts = active.setdefault(uuid, [])
                    while region.priority >= len(counts):
                        counts.append(0)
                    counts[region.priority] += 1
        recent.append(rk)
    writes: list[FieldWrite] = []
    for region, decremented in zip(regions, recent, strict=True):
        rk = decremented
        if _higher_active(active, region.priority, region.uuids):
            if rk >= 0:
                rk = -1
        elif rk < 0:
            rk = 0
        if rk != region.recent_kernel:
            writes.append(FieldWrite(region.key, RegionField.RECENT_KERNEL, rk))
        switch = 1 if _contended(active, region.priority, region.uuids) else 0
        if switch != region.utilization_switch:
            writes.append(FieldWrite(region.key, RegionField.UTILIZATION_SWITCH, switch))
    return writes


__all__ = ["FeedbackInput", "FieldWrite", "observe"]
