"""Simulated HAMi-core containers for the fake GPU backend: region files with live, plausible usage.

On a node with fake GPUs nothing runs HAMi-core, so nothing writes the shared region files HAMi's
monitor (and `hami_node.monitor.exporter`) reads. When hami-node answers Allocate for a container on
fake GPUs (`add`, called from the device plugin through `ports.PluginObserver.container_allocated`), the
simulator creates the container's region file where HAMi-core would (`<hook>/vgpu/containers/<pod
uid>_<container>/<cache id>.cache`), initialised as HAMi-core initialises it (version 1.2, priority from
`CUDA_TASK_PRIORITY` else 1, `utilization_switch` 1, `recent_kernel` 2). Every `tick` (the container
monitor's round, 5 s) it writes one process's usage into each live container's file:

- memory: a fraction of the container's limit on each device that moves slowly and deterministically,
  `0.5 + 0.3 * sin(2 pi (t / period + phase))` (period 10 minutes; phase from the file path, so
  containers differ), rounded down to whole MiB, so always within the limit;
- SM utilisation: the same fraction of the core limit (of 100 when the limit is 0, i.e. none);
- a kernel launch: `recent_kernel` 2 and `last_kernel_time` now, unless the priority feedback blocks
  the container (`recent_kernel` -1): then it launches nothing and its utilisation is 0, as HAMi-core's
  rate limiter waits.

Only the pieces HAMi-core would change are written (the header through process slot 0, and the tail,
with `utilization_switch` and `recent_kernel` as read just before), in place; the file is sparse, so a
simulated container costs a few KiB of disk, not the region's 2 MB. `tick` returns each fake GPU's sum
(memory bytes, utilisation capped at 100), which the daemon hands to `FakeBackend.set_usage`, so the
per-GPU metrics agree with the containers'. A container whose pod is no longer on the node stops being
written (and counted) and is forgotten after `forget_after_s`.

Turned off with `--fake-container-usage=false` (`HAMI_FAKE_CONTAINER_USAGE`, file key
`fakeContainerUsage`); never used with the NVML backend.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hami_node.monitor.region import (
    MAX_DEVICES,
    OFFSET_PROC_NUM,
    REGION_SIZE,
    DeviceMemory,
    DeviceUtil,
    ProcSlot,
    SharedRegion,
    encode_parts,
)

log = logging.getLogger(__name__)

PERIOD_S = 600.0
MIB = 1024 * 1024
DEFAULT_PRIORITY = 1
"""HAMi-core's priority when CUDA_TASK_PRIORITY is unset (`multiprocess_memory_limit.c`)."""
SIMULATED_PID = 1
_TAIL = struct.Struct("<iiiiQ")  # proc_num, utilization_switch, recent_kernel, priority, last_kernel_time


@dataclass(frozen=True, slots=True)
class SimulatedDevice:
    """One device of a simulated container: the GPU, its memory limit (bytes) and core limit (%)."""

    uuid: str
    memory_limit_bytes: int
    core_limit_percent: int


@dataclass(slots=True)
class _Container:
    pod_uid: str
    path: Path
    devices: tuple[SimulatedDevice, ...]
    priority: int
    phase: float
    gone_since: float | None = None


def usage_fraction(now: float, phase: float, period_s: float = PERIOD_S) -> float:
    """The share of its limits a simulated container uses at wall time `now`: 0.2..0.8."""
    return 0.5 + 0.3 * math.sin(2 * math.pi * (now / period_s + phase))


def _phase(path: Path) -> float:
    digest = hashlib.sha256(str(path).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def initial_region(devices: Sequence[SimulatedDevice], priority: int) -> SharedRegion:
    """The region as HAMi-core initialises it for these devices (no process yet)."""
    if not 0 < len(devices) <= MAX_DEVICES:
        raise ValueError(f"a container has 1..{MAX_DEVICES} devices, not {len(devices)}")
    pad = MAX_DEVICES - len(devices)
    return SharedRegion(
        device_num=len(devices),
        uuids=tuple(d.uuid for d in devices) + ("",) * pad,
        limit=tuple(d.memory_limit_bytes for d in devices) + (0,) * pad,
        sm_limit=tuple(d.core_limit_percent for d in devices) + (0,) * pad,
        utilization_switch=1,
        recent_kernel=2,
        priority=priority,
        sm_init_flag=1,
    )


def running_region(
    base: SharedRegion, devices: Sequence[SimulatedDevice], fraction: float, now: int, blocked: bool
) -> SharedRegion:
    """`base` with one process using `fraction` of each device's limits (pure)."""
    used = []
    utils = []
    for d in devices:
        total = int(d.memory_limit_bytes * fraction) // MIB * MIB
        context = min(total, 300 * MIB)
        module = min(total - context, 64 * MIB)
        data = total - context - module
        used.append(DeviceMemory(context=context, module=module, data=data, offset=0, total=total))
        sm = 0 if blocked else int((d.core_limit_percent or 100) * fraction)
        utils.append(DeviceUtil(sm=sm))
    pad = MAX_DEVICES - len(devices)
    proc = ProcSlot(
        pid=SIMULATED_PID,
        hostpid=0,
        used=tuple(used) + (DeviceMemory(),) * pad,
        monitorused=tuple(u.total for u in used) + (0,) * pad,
        device_util=tuple(utils) + (DeviceUtil(),) * pad,
        status=1,
    )
    return replace(
        base,
        procs=(proc,),
        owner_pid=SIMULATED_PID,
        recent_kernel=base.recent_kernel if blocked else 2,
        last_kernel_time=base.last_kernel_time if blocked else now,
    )


class ContainerSimulator:
    """See the module docstring. Thread-safe (`add` from gRPC threads, `tick` from the monitor loop)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        period_s: float = PERIOD_S,
        forget_after_s: float = 600.0,
    ) -> None:
        self._clock = clock
        self._period_s = period_s
        self._forget_after_s = forget_after_s
        self._lock = threading.Lock()
        self._containers: dict[Path, _Container] = {}

    def add(self, pod_uid: str, path: Path, devices: Sequence[SimulatedDevice], priority: int) -> None:
        """Create the container's region file (replacing one there) and simulate it from now on."""
        region = initial_region(devices, priority)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, REGION_SIZE)  # sparse: only the pieces written take disk space
            for offset, part in encode_parts(region):
                os.pwrite(fd, part, offset)
        finally:
            os.close(fd)
        with self._lock:
            self._containers[path] = _Container(pod_uid, path, tuple(devices), priority, _phase(path))
        log.info("simulating HAMi-core for pod %s in %s", pod_uid, path)

    def tick(self, live: Callable[[str], bool]) -> dict[str, tuple[int, int]]:
        """One round: write each live container's usage; returns GPU UUID -> (memory bytes, util %)."""
        now = self._clock()
        totals: dict[str, tuple[int, int]] = {}
        with self._lock:
            containers = list(self._containers.values())
        for c in containers:
            if not live(c.pod_uid):
                c.gone_since = now if c.gone_since is None else c.gone_since
                if now - c.gone_since >= self._forget_after_s:
                    with self._lock:
                        self._containers.pop(c.path, None)
                continue
            c.gone_since = None
            try:
                region = self._write(c, now)
            except OSError as err:
                log.warning("simulated container %s: cannot write its region: %s", c.path, err)
                continue
            for i, d in enumerate(c.devices):
                mem, util = totals.get(d.uuid, (0, 0))
                proc = region.procs[0]
                totals[d.uuid] = (mem + proc.used[i].total, min(100, util + proc.device_util[i].sm))
        return totals

    def _write(self, c: _Container, now: float) -> SharedRegion:
        fd = os.open(c.path, os.O_RDWR)
        try:
            tail = os.pread(fd, _TAIL.size, OFFSET_PROC_NUM)
            if len(tail) < _TAIL.size:
                raise OSError(f"{c.path} is shorter than a region")
            _procs, switch, recent, _priority, last_kernel = _TAIL.unpack(tail)
            base = replace(
                initial_region(c.devices, c.priority),
                recent_kernel=recent,
                utilization_switch=switch,
                last_kernel_time=last_kernel,
            )
            fraction = usage_fraction(now, c.phase, self._period_s)
            region = running_region(base, c.devices, fraction, int(now), blocked=recent < 0)
            for offset, part in encode_parts(region):
                os.pwrite(fd, part, offset)
        finally:
            os.close(fd)
        return region

    def simulated(self) -> list[Path]:
        with self._lock:
            return sorted(self._containers)


__all__ = [
    "DEFAULT_PRIORITY",
    "PERIOD_S",
    "ContainerSimulator",
    "SimulatedDevice",
    "initial_region",
    "running_region",
    "usage_fraction",
]
