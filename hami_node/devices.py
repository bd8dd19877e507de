"""The node's device state: its GPUs, each GPU's health and why, and what follows from them (the virtual
devices kubelet sees, the inventory the scheduler sees), with change notification.

One `DeviceState` per daemon. The health loop (`hami_node.health`) writes it; the gRPC plugin reads it
(ListAndWatch streams every change, Allocate checks health) and `InventoryPublisher` hands every changed
inventory to the reporter. Every method is thread-safe; readers get immutable snapshots.

Health has two layers:

- a GPU's own fault (an Xid, the GPU lost, its events not watchable, the backend listing it unhealthy),
  with the clock time of the last sign of it, from which the health loop counts the quiet period before
  the GPU may return to service;
- fencing: NVML itself fails, so no GPU can be trusted. Every GPU reads unhealthy until NVML answers
  again; the GPUs' own faults are kept underneath and still apply after fencing ends.

Each change bumps `version` and wakes `wait_for_change`. Nothing here reads the clock: callers pass
the time of a fault.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from hami_api.types import GPUInfo
from hami_node.allocation import VirtualDevice, list_virtual_devices
from hami_node.config import FilterDevices, NodeConfig, OperatingMode
from hami_node.gpu.backend import PhysicalGPU
from hami_node.mig_manager import MigRegistration
from hami_node.ports import InventorySink

log = logging.getLogger(__name__)

REPORTED_UNHEALTHY = "reported unhealthy by the GPU backend"
"""The fault of a GPU the backend lists as unhealthy (the fake's `health: false`, a lost GPU)."""


@dataclass(frozen=True, slots=True)
class GPUStatus:
    """One physical GPU of this node with its health (an `allocation.GPULike`).

    `fault` is the GPU's own fault (None when it has none) and `fault_at` the clock time of its last
    sign; `fenced` is the node-wide NVML failure, None when NVML answers.
    """

    info: PhysicalGPU
    fault: str | None = None
    fault_at: float | None = None
    fenced: str | None = None

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def index(self) -> int:
        return self.info.index

    @property
    def numa_node(self) -> int | None:
        return self.info.numa_node

    @property
    def healthy(self) -> bool:
        return self.fault is None and self.fenced is None

    @property
    def reason(self) -> str | None:
        """Why the GPU is unhealthy (fencing first), None when it is healthy."""
        if self.fenced is not None:
            return f"NVML failing: {self.fenced}"
        return self.fault


# --- pure conversions --------------------------------------------------------------------------------


def filter_gpus(gpus: Iterable[PhysicalGPU], rule: FilterDevices) -> tuple[PhysicalGPU, ...]:
    """The GPUs this node advertises: all but those HAMi's `filterdevices` excludes (by UUID or index)."""
    return tuple(gpu for gpu in gpus if not rule.excludes(gpu.uuid, gpu.index))


def gpu_type(model: str) -> str:
    """HAMi's inventory `type`: the NVML name, prefixed `NVIDIA-` unless it starts with NVIDIA."""
    return model if model.startswith("NVIDIA") else f"NVIDIA-{model}"


def advertised_memory_mib(info: PhysicalGPU, config: NodeConfig) -> int:
    """The GPU memory the schedulers are told, in MiB: real MiB x device_memory_scaling, truncated; a GPU
    whose memory the backend cannot tell (0 MiB, unified-memory parts) counts as
    `preconfigured_device_memory` MiB, HAMi's fallback. (The inventory's devmem and, in DRA mode, the
    ResourceSlice's memory capacity.)"""
    memory = info.memory_mib
    if memory <= 0 and config.preconfigured_device_memory > 0:
        memory = config.preconfigured_device_memory
    return int(memory * config.device_memory_scaling)


def inventory_entry(gpu: GPUStatus, config: NodeConfig, mig: MigRegistration | None = None) -> GPUInfo:
    """One GPU as `hami.io/node-nvidia-register` carries it (HAMi's getAPIDevices); devmem is
    `advertised_memory_mib`. In operating mode mig with the GPU's `mig` registration (HAMi register.go):
    devmem unscaled, devcore 100, count the largest instance count, migProfiles; unhealthy while the
    registration names a problem (MIG mode disabled)."""
    numa = gpu.info.numa_node
    if config.operating_mode is OperatingMode.MIG and mig is not None:
        memory = gpu.info.memory_mib
        if memory <= 0 and config.preconfigured_device_memory > 0:
            memory = config.preconfigured_device_memory
        return GPUInfo(
            id=gpu.uuid,
            index=gpu.info.index,
            count=mig.count,
            devmem=memory,
            devcore=100,
            type=gpu_type(gpu.info.model),
            numa=0 if numa is None or numa < 0 else numa,
            mode=config.operating_mode.value,
            health=gpu.healthy and mig.problem is None,
            mig_profiles=mig.profiles,
        )
    return GPUInfo(
        id=gpu.uuid,
        index=gpu.info.index,
        count=config.device_split_count,
        devmem=advertised_memory_mib(gpu.info, config),
        devcore=int(100 * config.device_cores_scaling),
        type=gpu_type(gpu.info.model),
        numa=0 if numa is None or numa < 0 else numa,
        mode=config.operating_mode.value,
        health=gpu.healthy,
    )


# --- the state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Gpu:
    info: PhysicalGPU
    fault: str | None = None
    fault_at: float | None = None


class DeviceState:
    """The GPUs of this node and their health; see the module docstring. Thread-safe."""

    def __init__(self, config: NodeConfig) -> None:
        self._config = config
        self._cond = threading.Condition(threading.RLock())
        self._gpus: dict[str, _Gpu] = {}
        self._fenced: str | None = None
        self._listed = False
        self._version = 0
        self._devices_cache: tuple[int, tuple[VirtualDevice, ...]] | None = None
        self._mig: dict[str, MigRegistration] = {}

    @property
    def config(self) -> NodeConfig:
        return self._config

    # --- writers (the health loop) --------------------------------------------------------------

    def set_gpus(self, gpus: Iterable[PhysicalGPU], at: float) -> bool:
        """Replace the GPU list with a fresh listing (filtered by `filter_devices`). GPUs already known
        keep their faults; a GPU the backend lists as unhealthy gets `REPORTED_UNHEALTHY` (at `at`)
        unless it has a fault already. Returns whether anything changed."""
        listed = filter_gpus(gpus, self._config.filter_devices)
        with self._cond:
            fresh: dict[str, _Gpu] = {}
            for info in listed:
                if info.uuid in fresh:
                    log.warning("GPU %s is listed twice by the backend; keeping the first", info.uuid)
                    continue
                old = self._gpus.get(info.uuid)
                gpu = _Gpu(info) if old is None else replace(old, info=info)
                if not info.healthy and gpu.fault is None:
                    gpu = replace(gpu, fault=REPORTED_UNHEALTHY, fault_at=at)
                    log.warning("GPU %s: %s", info.uuid, REPORTED_UNHEALTHY)
                fresh[info.uuid] = gpu
            changed = fresh != self._gpus or not self._listed
            gone = self._gpus.keys() - fresh.keys()
            if gone:
                log.warning("GPUs no longer listed: %s", ", ".join(sorted(gone)))
            self._gpus = fresh
            self._listed = True
            if changed:
                self._bump()
            return changed

    def set_mig(self, registrations: dict[str, MigRegistration]) -> bool:
        """Operating mode mig: each GPU's registration (`mig_manager.register_mig`); a GPU without one
        is left out of the inventory (HAMi: `skip MIG device with no discovered profile capacity`), a
        registration's problem makes its GPU unhealthy. Returns whether anything changed."""
        with self._cond:
            if registrations == self._mig:
                return False
            self._mig = dict(registrations)
            self._bump()
            return True

    def mig_registration(self, uuid: str) -> MigRegistration | None:
        with self._cond:
            return self._mig.get(uuid)

    def mark_unhealthy(self, uuid: str | None, reason: str, at: float) -> tuple[str, ...]:
        """Record a fault on one GPU (uuid None: every GPU) at clock time `at`. A GPU already faulty
        keeps its first reason but its quiet period starts again. Returns the UUIDs that turned faulty
        now; an unknown UUID is ignored (e.g. a filtered-out GPU)."""
        with self._cond:
            targets = list(self._gpus) if uuid is None else [uuid] if uuid in self._gpus else []
            newly: list[str] = []
            for u in targets:
                gpu = self._gpus[u]
                if gpu.fault is None:
                    self._gpus[u] = replace(gpu, fault=reason, fault_at=at)
                    newly.append(u)
                else:
                    self._gpus[u] = replace(gpu, fault_at=at)
            if newly:
                self._bump()
            return tuple(newly)

    def note_fault(self, uuid: str, at: float) -> None:
        """A faulty GPU still misbehaves (a failed probe): its quiet period starts again at `at`."""
        with self._cond:
            gpu = self._gpus.get(uuid)
            if gpu is not None and gpu.fault is not None:
                self._gpus[uuid] = replace(gpu, fault_at=at)

    def mark_healthy(self, uuid: str) -> bool:
        """Clear a GPU's own fault. Returns whether it had one."""
        with self._cond:
            gpu = self._gpus.get(uuid)
            if gpu is None or gpu.fault is None:
                return False
            self._gpus[uuid] = _Gpu(gpu.info)
            self._bump()
            return True

    def fence(self, reason: str) -> bool:
        """NVML fails: every GPU reads unhealthy until `unfence`. Returns whether this changed anything
        (a new reason while already fenced is recorded without a change notification)."""
        with self._cond:
            was = self._fenced
            self._fenced = reason
            if was is None:
                self._bump()
            return was is None

    def unfence(self) -> bool:
        """NVML answers again. Returns whether the node was fenced."""
        with self._cond:
            if self._fenced is None:
                return False
            self._fenced = None
            self._bump()
            return True

    def wake(self) -> None:
        """Wake every `wait_for_change` so it re-checks its `cancelled` condition (no change)."""
        with self._cond:
            self._cond.notify_all()

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    # --- readers ---------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Bumped by every change."""
        with self._cond:
            return self._version

    @property
    def fenced(self) -> str | None:
        """Why the node is fenced (NVML failing), None when it is not."""
        with self._cond:
            return self._fenced

    @property
    def listed(self) -> bool:
        """Whether the backend has listed the GPUs at least once."""
        with self._cond:
            return self._listed

    def gpus(self) -> tuple[GPUStatus, ...]:
        """Every GPU in backend order with its health."""
        with self._cond:
            return self._snapshot()

    def snapshot(self) -> tuple[int, tuple[GPUStatus, ...]]:
        """(version, gpus), read together."""
        with self._cond:
            return self._version, self._snapshot()

    def gpu(self, uuid: str) -> GPUStatus | None:
        with self._cond:
            gpu = self._gpus.get(uuid)
            if gpu is None:
                return None
            return GPUStatus(gpu.info, gpu.fault or self._mig_problem(uuid), gpu.fault_at, self._fenced)

    def _snapshot(self) -> tuple[GPUStatus, ...]:
        return tuple(
            GPUStatus(g.info, g.fault or self._mig_problem(g.info.uuid), g.fault_at, self._fenced)
            for g in self._gpus.values()
        )

    def _mig_problem(self, uuid: str) -> str | None:
        registration = self._mig.get(uuid)
        return None if registration is None else registration.problem

    def virtual_devices(self, gpus: Iterable[GPUStatus] | None = None) -> tuple[VirtualDevice, ...]:
        """What kubelet is told: `device_split_count` devices per GPU with its health (NUMA when
        enabled), of `gpus` or of the current GPUs."""
        if gpus is not None:
            return list_virtual_devices(
                gpus, self._config.device_split_count, self._config.enable_numa_topology
            )
        with self._cond:  # cached per version: GetPreferredAllocation asks on every call
            cached = self._devices_cache
            if cached is None or cached[0] != self._version:
                devices = list_virtual_devices(
                    self.gpus(), self._config.device_split_count, self._config.enable_numa_topology
                )
                cached = self._devices_cache = (self._version, devices)
            return cached[1]

    def inventory(self, gpus: Iterable[GPUStatus] | None = None) -> tuple[GPUInfo, ...]:
        """What the scheduler is told (`hami.io/node-nvidia-register`), of `gpus` or the current GPUs."""
        with self._cond:
            listed = self._snapshot() if gpus is None else tuple(gpus)
            mig = dict(self._mig)
        if self._config.operating_mode is OperatingMode.MIG:
            return tuple(
                inventory_entry(gpu, self._config, mig[gpu.uuid]) for gpu in listed if gpu.uuid in mig
            )
        return tuple(inventory_entry(gpu, self._config) for gpu in listed)

    def wait_for_change(
        self, after: int, timeout_s: float | None = None, cancelled: Callable[[], bool] | None = None
    ) -> int:
        """Block until `version` differs from `after`, `timeout_s` passes, or `cancelled()` turns true
        (checked on every `wake`). Returns the version then."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._version != after or (cancelled is not None and cancelled()), timeout_s
            )
            return self._version


class StreamContext(Protocol):
    """What `StateStreams.follow` needs of a gRPC server stream's context (`grpc.ServicerContext`)."""

    def add_callback(self, callback: Callable[[], None]) -> bool: ...


class StateStreams:
    """The gRPC streams that follow the device state (the device plugin's ListAndWatch, the DRA plugin's
    NodeWatchResources): `follow` yields the state at once and again after each change, until the client
    goes away or `shutdown()`; the stream then returns normally. Counts the open streams."""

    def __init__(self, state: DeviceState) -> None:
        self._state = state
        self._stopping = threading.Event()
        self._cond = threading.Condition()
        self._streams = 0

    def shutdown(self) -> None:
        """End every stream now and refuse new ones."""
        self._stopping.set()
        self._state.wake()

    @property
    def open_streams(self) -> int:
        with self._cond:
            return self._streams

    def wait_streams(self, count: int, timeout_s: float) -> bool:
        """Wait until exactly `count` streams are open (for tests). False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._streams == count, timeout_s)

    def _count(self, delta: int) -> None:
        with self._cond:
            self._streams += delta
            self._cond.notify_all()

    def follow(
        self, context: StreamContext, every_s: float | None = None
    ) -> Iterator[tuple[int, tuple[GPUStatus, ...]]]:
        """(version, gpus) at once, then after every change (and at least every `every_s` when given;
        a wake without a change may repeat a version), until the client is gone or `shutdown()`."""
        gone = threading.Event()

        def client_gone() -> None:
            gone.set()
            self._state.wake()

        if not context.add_callback(client_gone):
            return

        def cancelled() -> bool:
            return gone.is_set() or self._stopping.is_set()

        self._count(1)
        try:
            first = True
            while first or not cancelled():  # the state first, whatever happens
                first = False
                version, gpus = self._state.snapshot()
                yield version, gpus
                self._state.wait_for_change(version, every_s, cancelled)
        finally:
            self._count(-1)


class InventoryPublisher:
    """Hands the inventory to an `InventorySink` at start and on every change of it (health included),
    from its own thread; the sink coalesces and writes. `stop()` joins the thread."""

    def __init__(self, state: DeviceState, sink: InventorySink) -> None:
        self._state = state
        self._sink = sink
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: tuple[GPUInfo, ...] | None = None
        self._count = 0
        self._count_cond = threading.Condition()

    @property
    def published(self) -> int:
        """How many inventories were handed to the sink."""
        with self._count_cond:
            return self._count

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("inventory publisher already started")
        self._thread = threading.Thread(target=self._run, name="hami-inventory-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._state.wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        version = -1
        while not self._stopping.is_set():
            current, gpus = self._state.snapshot()
            # Nothing before the first listing or fencing: an empty inventory would read "no GPUs".
            known = self._state.listed or self._state.fenced is not None
            if current != version:
                version = current
                inventory = self._state.inventory(gpus)
                if known and inventory != self._published:
                    self._publish(inventory)
            self._state.wait_for_change(version, None, self._stopping.is_set)

    def _publish(self, inventory: tuple[GPUInfo, ...]) -> None:
        try:
            self._sink.publish(inventory)
        except Exception:  # the sink must not kill the publisher; the next change tries again
            log.exception("publishing the GPU inventory failed")
            return
        self._published = inventory
        with self._count_cond:
            self._count += 1
            self._count_cond.notify_all()

    def wait_published(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` inventories were published (for tests). False on timeout."""
        with self._count_cond:
            return self._count_cond.wait_for(lambda: self._count > after, timeout_s)


__all__ = [
    "REPORTED_UNHEALTHY",
    "DeviceState",
    "GPUStatus",
    "InventoryPublisher",
    "StateStreams",
    "StreamContext",
    "advertised_memory_mib",
    "filter_gpus",
    "gpu_type",
    "inventory_entry",
]
