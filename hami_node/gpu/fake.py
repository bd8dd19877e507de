"""A fake GPU backend: GPUs from an inventory file, faults injected by editing it or in process.

The file is read at construction (a bad file raises `InventoryError`), re-read by `init()`, and watched
while initialised: an edit is applied within milliseconds, a bad edit is logged and the previous
inventory kept. See docs/fake-gpus.md for the format and the faults.

Watching (watchdog, inotify on Linux): the file's directory, so editors that replace the file
(write a temp file, rename it over) and Kubernetes ConfigMap volumes (a `..data` symlink swapped) are
seen, plus the directory's parent, because an inotify watch dies with its directory: when the
directory is removed and created again, its watch is scheduled again and the file re-read. A change is
detected by comparing the file's bytes, so the noise of a busy directory costs one small read.

In-process faults (`inject_xid`, `set_lost`, `set_failing`) add to the file's; they never undo a fault
written in the file.

MIG: a GPU of a model in `hami_api.mig.MIG_MODELS` is MIG capable and offers that model's profiles and
placements. Its MIG devices start as the inventory's `mig.devices`; `create_mig_device` and
`destroy_mig_device` change them as NVML would (a placement must be one of the profile's and must not
overlap an existing instance, else INSUFFICIENT_RESOURCES; an instance in use cannot be destroyed). The
layout is persisted next to the inventory file, in `<inventory>.mig.json` (written atomically), so a
restarted daemon finds the instances it created, as on a real GPU; an edit of a GPU's `mig` section in
the inventory replaces that GPU's layout. GPU instance IDs are the lowest free from 1, each with one
compute instance (ID 0); MIG UUIDs are derived from the GPU's UUID, the GI ID and a per-GPU creation
counter, so they are deterministic and a re-created instance gets a new one. In-process MIG faults:
`fail_next_mig_create` (a create that fails at a chosen step, rolled back) and `set_mig_in_use`.

Thread-safety: every method may be called from any thread; `wait_event` blocks on a condition that
every state change notifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from hami_api.mig import GIProfile, MigModel, Placement
from hami_node.durable import write_atomic
from hami_node.gpu.backend import (
    DeviceLost,
    GPUEvent,
    GPUEventKind,
    GPUFailed,
    GPULink,
    GPUNotFound,
    GPUUsage,
    LibraryNotFound,
    MigAttributes,
    MigDevice,
    MigDisabled,
    MigError,
    MigInstanceNotFound,
    MigInUse,
    MigMode,
    MigPlacementRefused,
    MigProfileUnknown,
    NvmlFailed,
    PhysicalGPU,
    mig_disabled_message,
)
from hami_node.gpu.inventory import (
    FakeGpu,
    FakeMigInstance,
    Inventory,
    InventoryError,
    NvmlMode,
    parse_inventory_text,
)

log = logging.getLogger(__name__)

_MIB = 1024 * 1024

MIG_STATE_SUFFIX = ".mig.json"
"""The MIG layout of a file-backed fake lives in `<inventory file>` + this suffix."""
MigCreateStep = Literal["gpu-instance", "compute-instance", "uuid"]
"""Where `fail_next_mig_create` makes a create fail: creating the GPU instance, creating its compute
instance (the GPU instance is then destroyed again), or finding the MIG device's UUID (both are)."""
_INSUFFICIENT_RESOURCES = 23
_IN_USE = 19
_NOT_FOUND = 6
_UNKNOWN = 999


@dataclass(frozen=True, slots=True)
class _Instance:
    gi: int
    profile: GIProfile
    placement: Placement
    uuid: str


@dataclass(slots=True)
class _GpuMig:
    """One GPU's MIG layout: its instances, the creation counter, the inventory layout it came from."""

    instances: list[_Instance]
    serial: int
    seeded: tuple[FakeMigInstance, ...]


def fake_mig_uuid(parent_uuid: str, gpu_instance_id: int, serial: int) -> str:
    """A deterministic, uuid-shaped MIG UUID for the `serial`-th instance created on a GPU."""
    digest = hashlib.sha256(
        f"hami-py fake mig\0{parent_uuid}\0{gpu_instance_id}\0{serial}".encode()
    ).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


# On Linux (inotify) a write ends with a close event; reacting to "modified" too would read half-written
# files. Elsewhere there is no close event, so "modified" is all we get.
_CLOSE_EVENTS = sys.platform.startswith("linux")

_PARENT_EVENTS: tuple[type[FileSystemEvent], ...] = (DirCreatedEvent, DirDeletedEvent, DirMovedEvent)
"""What the inventory watcher takes from the parent directory's watch (the directory made, removed,
moved), asked of inotify alone: in the local cluster every node's inventory directory sits in one parent
that every daemon watched, and each open and close of any node's directory reached them all (issue 29)."""

_DIR_EVENTS: tuple[type[FileSystemEvent], ...] = (
    *_PARENT_EVENTS,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileClosedEvent,
    *(() if _CLOSE_EVENTS else (FileModifiedEvent,)),
)
"""What `_DirWatcher._handle` acts on in the file's directory (no opens, no reads' closes)."""


class FakeBackend:
    """The `GPUBackend` of a node without GPUs (tests, the local cluster, demos).

    `source` is the inventory file, or an `Inventory` for in-process tests (then nothing is watched).
    `watch=False` reads the file only at construction and at `init()`. A watched edit that does not
    parse is rejected only when the file still holds it `settle_s` later (it may be half-written).
    """

    def __init__(
        self,
        source: Path | Inventory,
        *,
        watch: bool = True,
        settle_s: float = 0.1,
        observer_factory: Callable[[], BaseObserver] = Observer,
    ) -> None:
        self._observer_factory = observer_factory
        self._path = Path(os.path.abspath(source)) if isinstance(source, Path) else None
        self._watch = watch and self._path is not None
        self._cond = threading.Condition()
        self._file_lock = threading.Lock()
        self._timer_lock = threading.Lock()
        self._settle_timer: threading.Timer | None = None
        self._settle_s = settle_s
        self._raw: bytes | None = None
        self._missing_logged = False
        self._fired: set[str] = set()
        self._queue: deque[GPUEvent] = deque()
        self._initialised = False
        self._in_process_failing = False
        self._in_process_lost: set[str] = set()
        self._reloads = 0
        self._last_error: str | None = None
        self._watcher: _DirWatcher | None = None
        self._usage: dict[str, tuple[int, int]] = {}
        self._mig: dict[str, _GpuMig] = {}
        self._mig_fail: dict[str, MigCreateStep] = {}
        self._mig_busy: set[tuple[str, int]] = set()
        self._state_path = Path(str(self._path) + MIG_STATE_SUFFIX) if self._path is not None else None
        if isinstance(source, Inventory):
            self._inventory = source
        else:
            assert self._path is not None
            try:
                raw = self._read()
            except OSError as exc:
                raise InventoryError(
                    str(source), "whole file", f"cannot be read: {exc.strerror or exc}"
                ) from None
            if raw is None:
                raise InventoryError(str(source), "whole file", "does not exist")
            self._inventory = self._parse(raw, str(source))
            self._raw = raw
        self._lost = self._effective_lost(self._inventory)
        self._queue_new_events(self._inventory)
        self._mig = self._load_mig_state()
        self._seed_mig(self._inventory)

    # --- GPUBackend ---------------------------------------------------------------------------------

    def init(self) -> None:
        with self._cond:
            if self._initialised:
                return
        if self._watch and self._watcher is None:
            assert self._path is not None
            watcher = _DirWatcher(self._path, self._on_file_event, self._observer_factory)
            try:
                watcher.start()
            except OSError as exc:  # e.g. the inotify watch limit
                log.warning("fake inventory %s: cannot be watched (%s); read only at init()", self._path, exc)
                watcher.stop()
            else:
                self._watcher = watcher
        self._check_file()  # after the watch starts, so no edit falls in between
        try:
            with self._cond:
                self._raise_if_failing()
                self._initialised = True
                self._cond.notify_all()
        except NvmlFailed:
            self._stop_watcher()
            raise

    def shutdown(self) -> None:
        with self._cond:
            self._initialised = False
            self._cond.notify_all()
        self._stop_watcher()

    def list_gpus(self) -> list[PhysicalGPU]:
        with self._cond:
            self._raise_if_unusable()
            return [gpu.info(lost=gpu.uuid in self._in_process_lost) for gpu in self._inventory.gpus]

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while True:
                self._raise_if_unusable()
                if self._queue:
                    return self._queue.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def links(self, uuids: Sequence[str]) -> dict[tuple[str, str], GPULink]:
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"links: a GPU is listed twice in {list(uuids)}")
        with self._cond:
            self._raise_if_unusable()
            for uuid in uuids:
                self._usable_gpu(uuid, check_health=False)
            inventory = self._inventory
            return {(a, b): inventory.link(a, b) for a in uuids for b in uuids if a != b}

    def usage(self, uuid: str) -> GPUUsage:
        """The GPU's total memory from the inventory; used memory and utilisation as last `set_usage`
        (the simulated containers' sum, `hami_node.monitor.simulate`), 0 before."""
        with self._cond:
            self._raise_if_unusable()
            gpu = self._usable_gpu(uuid, check_health=False)
            used, util = self._usage.get(uuid, (0, 0))
            total = gpu.memory_mib * _MIB
            return GPUUsage(min(used, total), total, min(util, 100), 0)

    def set_usage(self, usage: dict[str, tuple[int, int]]) -> None:
        """What the GPUs do now: UUID -> (memory used in bytes, utilisation percent); GPUs not named
        read 0."""
        with self._cond:
            self._usage = dict(usage)

    def probe(self, uuid: str) -> None:
        with self._cond:
            self._raise_if_unusable()
            self._usable_gpu(uuid, check_health=True)

    # --- MIG -----------------------------------------------------------------------------------------

    def mig_mode(self, uuid: str) -> MigMode:
        with self._cond:
            self._raise_if_unusable()
            gpu = self._usable_gpu(uuid, check_health=False)
            return self._mode(gpu)

    def mig_profiles(self, uuid: str) -> tuple[GIProfile, ...]:
        with self._cond:
            self._raise_if_unusable()
            model = self._usable_gpu(uuid, check_health=False).mig_model
            return model.profiles if model is not None else ()

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        with self._cond:
            self._raise_if_unusable()
            gpu = self._usable_gpu(uuid, check_health=False)
            state = self._mig.get(uuid)
            if not gpu.mig_enabled or state is None:
                return ()
            ordered = sorted(state.instances, key=lambda i: i.gi)
            return tuple(self._device(uuid, j, instance) for j, instance in enumerate(ordered))

    def create_mig_device(self, uuid: str, profile: str, placement: Placement) -> MigDevice:
        with self._cond:
            self._raise_if_unusable()
            gpu = self._usable_gpu(uuid, check_health=False)
            model = self._creatable(gpu, profile, placement)
            found = model.profile(profile)
            if found is None:
                names = ", ".join(p.name for p in model.profiles)
                raise MigProfileUnknown(
                    uuid,
                    f"GPU {gpu.index} ({uuid}, {gpu.model}) has no MIG profile {profile!r} "
                    f"(profiles: {names})",
                    profile=profile,
                    placement=placement,
                )
            state = self._mig.setdefault(uuid, _GpuMig([], 0, gpu.mig_devices))
            self._check_placement(gpu, state, found, placement)
            step = self._mig_fail.pop(uuid, None)
            what = f"{found.name} at {placement} on GPU {gpu.index} ({uuid})"
            if step == "gpu-instance":
                raise MigError(
                    uuid,
                    f"creating the GPU instance {what} failed (injected fault)",
                    profile=profile,
                    placement=placement,
                    code=_UNKNOWN,
                )
            used = {i.gi for i in state.instances}
            gi = next(n for n in range(1, len(used) + 2) if n not in used)
            instance = _Instance(gi, found, placement, fake_mig_uuid(uuid, gi, state.serial))
            if step is not None:  # the GPU instance (and maybe the compute instance) existed: rolled back
                stage = "its compute instance" if step == "compute-instance" else "its MIG device's UUID"
                raise MigError(
                    uuid,
                    f"creating {stage} for {what} failed (injected fault); "
                    f"the GPU instance {gi} was destroyed",
                    profile=profile,
                    placement=placement,
                    code=_UNKNOWN,
                )
            state.instances.append(instance)
            state.serial += 1
            try:
                self._save_mig()
            except OSError as exc:
                state.instances.remove(instance)
                state.serial -= 1
                raise MigError(
                    uuid,
                    f"creating {what}: the MIG state file cannot be written ({exc}); nothing created",
                    profile=profile,
                    placement=placement,
                ) from None
            ordered = sorted(state.instances, key=lambda i: i.gi)
            return self._device(uuid, ordered.index(instance), instance)

    def destroy_mig_device(self, uuid: str, gpu_instance_id: int) -> None:
        with self._cond:
            self._raise_if_unusable()
            gpu = self._usable_gpu(uuid, check_health=False)
            state = self._mig.get(uuid) if gpu.mig_enabled else None
            instance = next((i for i in state.instances if i.gi == gpu_instance_id), None) if state else None
            if state is None or instance is None:
                raise MigInstanceNotFound(
                    uuid, f"no GPU instance {gpu_instance_id} on GPU {gpu.index} ({uuid})", code=_NOT_FOUND
                )
            if (uuid, gpu_instance_id) in self._mig_busy:
                raise MigInUse(
                    uuid,
                    f"GPU instance {gpu_instance_id} ({instance.profile.name} at {instance.placement}) "
                    f"on GPU {gpu.index} ({uuid}) is in use by running processes; not destroyed",
                    profile=instance.profile.name,
                    placement=instance.placement,
                    code=_IN_USE,
                )
            state.instances.remove(instance)
            try:
                self._save_mig()
            except OSError as exc:
                state.instances.append(instance)
                raise MigError(
                    uuid,
                    f"destroying GPU instance {gpu_instance_id} on GPU {gpu.index} ({uuid}): the MIG "
                    f"state file cannot be written ({exc}); not destroyed",
                ) from None
            self._mig_busy.discard((uuid, gpu_instance_id))

    def fail_next_mig_create(self, uuid: str, step: MigCreateStep) -> None:
        """Make the next `create_mig_device` on this GPU fail at `step` (rolled back, as NVML's caller
        must); later creates succeed again."""
        with self._cond:
            if self._inventory.gpu(uuid) is None:
                raise GPUNotFound(uuid, f"no GPU {uuid} in the fake inventory")
            self._mig_fail[uuid] = step

    def set_mig_in_use(self, uuid: str, gpu_instance_id: int, in_use: bool) -> None:
        """Mark a GPU instance as used by processes (destroying it then raises `MigInUse`) or not."""
        with self._cond:
            if in_use:
                self._mig_busy.add((uuid, gpu_instance_id))
            else:
                self._mig_busy.discard((uuid, gpu_instance_id))

    @property
    def mig_state_path(self) -> Path | None:
        """Where the MIG layout is persisted; None for an in-process inventory."""
        return self._state_path

    # --- in-process fault injection and test helpers -----------------------------------------------

    def inject_xid(self, uuid: str | None, code: int) -> None:
        """Queue an Xid event (uuid None: "all GPUs")."""
        self.inject_event(GPUEvent(uuid, GPUEventKind.XID, xid=code))

    def inject_event(self, event: GPUEvent) -> None:
        with self._cond:
            self._queue.append(event)
            self._cond.notify_all()

    def set_lost(self, uuid: str, lost: bool) -> None:
        """Mark a GPU lost (queues a DEVICE_LOST event once) or clear the in-process mark."""
        with self._cond:
            if self._inventory.gpu(uuid) is None:
                raise GPUNotFound(uuid, f"no GPU {uuid} in the fake inventory")
            if lost:
                self._in_process_lost.add(uuid)
            else:
                self._in_process_lost.discard(uuid)
            self._update_lost(self._inventory)
            self._cond.notify_all()

    def set_failing(self, failing: bool) -> None:
        """Make every call raise `NvmlFailed` (True) or stop doing so (False; the file may still)."""
        with self._cond:
            self._in_process_failing = failing
            self._cond.notify_all()

    @property
    def inventory(self) -> Inventory:
        """The inventory in force (the last good read of the file)."""
        with self._cond:
            return self._inventory

    @property
    def reloads(self) -> int:
        """How many changed contents of the file were read since start (applied or rejected)."""
        with self._cond:
            return self._reloads

    @property
    def last_error(self) -> str | None:
        """Why the last changed content was rejected; None when it was applied."""
        with self._cond:
            return self._last_error

    def wait_for_reload(self, after: int, timeout_s: float) -> bool:
        """Wait until `reloads` exceeds `after` (read it before editing the file). False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._reloads > after, timeout_s)

    # --- internals -----------------------------------------------------------------------------------

    def _raise_if_failing(self) -> None:
        mode = self._inventory.nvml
        if mode is NvmlMode.ABSENT:
            raise LibraryNotFound()
        if mode is NvmlMode.FAILING or self._in_process_failing:
            raise NvmlFailed("NVML is failing (fake inventory: nvml: failing)", code=999)

    def _raise_if_unusable(self) -> None:
        self._raise_if_failing()
        if not self._initialised:
            raise NvmlFailed("NVML is not initialised (call init() first)", code=1)

    def _usable_gpu(self, uuid: str, *, check_health: bool) -> FakeGpu:
        gpu = self._inventory.gpu(uuid)
        if gpu is None:
            raise GPUNotFound(uuid, f"no GPU {uuid} in the fake inventory", code=6)
        if uuid in self._lost:
            raise DeviceLost(uuid, f"GPU {uuid} is lost (fake inventory)", code=15)
        if check_health and not gpu.healthy:
            raise GPUFailed(uuid, f"GPU {uuid} is unhealthy (fake inventory: health: false)", code=999)
        return gpu

    @staticmethod
    def _mode(gpu: FakeGpu) -> MigMode:
        if gpu.mig_model is None:
            return MigMode(False, False)
        pending = gpu.mig_enabled if gpu.mig_pending is None else gpu.mig_pending
        return MigMode(gpu.mig_enabled, pending)

    def _creatable(self, gpu: FakeGpu, profile: str, placement: Placement) -> MigModel:
        model = gpu.mig_model
        if model is None:
            raise MigDisabled(
                gpu.uuid,
                f"GPU {gpu.index} ({gpu.uuid}) is a {gpu.model}, which is not MIG capable",
                profile=profile,
                placement=placement,
                code=3,
            )
        if not gpu.mig_enabled:
            raise MigDisabled(
                gpu.uuid,
                mig_disabled_message(gpu.uuid, gpu.index, self._mode(gpu)),
                profile=profile,
                placement=placement,
                code=3,
            )
        return model

    @staticmethod
    def _check_placement(gpu: FakeGpu, state: _GpuMig, profile: GIProfile, placement: Placement) -> None:
        what = f"{profile.name} at {placement} on GPU {gpu.index} ({gpu.uuid})"
        if placement not in profile.placements:
            possible = ", ".join(str(p) for p in profile.placements)
            raise MigPlacementRefused(
                gpu.uuid,
                f"invalid placement for {what}: not one of the profile's possible placements ({possible})",
                profile=profile.name,
                placement=placement,
                code=2,
            )
        for other in state.instances:
            if other.placement.overlaps(placement):
                raise MigPlacementRefused(
                    gpu.uuid,
                    f"cannot create {what}: it overlaps GPU instance {other.gi} ({other.profile.name} at "
                    f"{other.placement}) (NVML error {_INSUFFICIENT_RESOURCES}: Insufficient Resources)",
                    profile=profile.name,
                    placement=placement,
                    code=_INSUFFICIENT_RESOURCES,
                )
        if sum(1 for i in state.instances if i.profile.name == profile.name) >= profile.instance_count:
            raise MigPlacementRefused(
                gpu.uuid,
                f"cannot create {what}: {profile.name} fits at most {profile.instance_count} time(s) "
                f"(NVML error {_INSUFFICIENT_RESOURCES}: Insufficient Resources)",
                profile=profile.name,
                placement=placement,
                code=_INSUFFICIENT_RESOURCES,
            )

    @staticmethod
    def _device(parent: str, index: int, instance: _Instance) -> MigDevice:
        p = instance.profile
        return MigDevice(
            parent_uuid=parent,
            uuid=instance.uuid,
            index=index,
            gpu_instance_id=instance.gi,
            compute_instance_id=0,
            profile=p.name,
            placement=instance.placement,
            attributes=MigAttributes(
                memory_mib=p.memory_mib,
                multiprocessors=p.multiprocessors,
                gi_slices=p.slices,
                ci_slices=p.slices,
                copy_engines=p.copy_engines,
                decoders=p.decoders,
                encoders=p.encoders,
                jpeg_engines=p.jpeg_engines,
                ofa_engines=p.ofa_engines,
            ),
        )

    def _seed_mig(self, inventory: Inventory) -> bool:
        """Bring the MIG layouts in line with the inventory: a GPU whose `mig.devices` differ from the ones
        its layout came from (or that has none yet) starts again from them; GPUs no longer MIG capable or
        MIG enabled lose theirs (a real GPU loses its instances when MIG is disabled). True if changed."""
        changed = False
        for uuid in list(self._mig):
            gpu = inventory.gpu(uuid)
            if gpu is None or not gpu.mig_enabled or gpu.mig_model is None:
                del self._mig[uuid]
                changed = True
        for gpu in inventory.gpus:
            model = gpu.mig_model
            if not gpu.mig_enabled or model is None:
                continue
            state = self._mig.get(gpu.uuid)
            if state is not None and state.seeded == gpu.mig_devices:
                continue
            fresh = _GpuMig([], 0, gpu.mig_devices)
            for gi, device in enumerate(gpu.mig_devices, start=1):
                profile = model.profile(device.profile)
                placement = profile.placement_at(device.start) if profile is not None else None
                assert profile is not None and placement is not None  # the inventory parser checked
                fresh.instances.append(
                    _Instance(gi, profile, placement, fake_mig_uuid(gpu.uuid, gi, fresh.serial))
                )
                fresh.serial += 1
            self._mig[gpu.uuid] = fresh
            changed = True
        return changed

    def _state_data(self) -> dict[str, Any]:
        gpus: dict[str, Any] = {}
        for uuid, state in sorted(self._mig.items()):
            gpus[uuid] = {
                "serial": state.serial,
                "seeded": [{"profile": d.profile, "start": d.start} for d in state.seeded],
                "devices": [
                    {"gi": i.gi, "profile": i.profile.name, "start": i.placement.start, "uuid": i.uuid}
                    for i in sorted(state.instances, key=lambda i: i.gi)
                ],
            }
        return {"version": 1, "gpus": gpus}

    def _save_mig(self) -> None:
        if self._state_path is not None:
            write_atomic(self._state_path, json.dumps(self._state_data(), indent=2) + "\n", mode=0o600)

    def _save_mig_logged(self) -> None:
        try:
            self._save_mig()
        except OSError as exc:
            log.error("fake MIG state %s cannot be written: %s", self._state_path, exc)

    def _load_mig_state(self) -> dict[str, _GpuMig]:
        """The persisted layouts (only of GPUs of the inventory that have MIG enabled). Raises
        InventoryError naming the state file and the entry when it does not parse."""
        path = self._state_path
        if path is None:
            return {}
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise InventoryError(str(path), "whole file", f"cannot be read: {exc}") from None
        try:
            return _parse_mig_state(json.loads(text), self._inventory, str(path))
        except json.JSONDecodeError as exc:
            raise InventoryError(
                str(path), f"line {exc.lineno}, column {exc.colno}", f"not valid JSON: {exc.msg}"
            ) from None
        except ValueError as exc:
            raise InventoryError(str(path), "whole file", f"not valid JSON: {exc}") from None

    def _effective_lost(self, inventory: Inventory) -> set[str]:
        return {g.uuid for g in inventory.gpus if g.lost or g.uuid in self._in_process_lost}

    def _update_lost(self, inventory: Inventory) -> None:
        """Recompute lost GPUs; each GPU that became lost queues one DEVICE_LOST event."""
        lost = self._effective_lost(inventory)
        for uuid in sorted(lost - self._lost):
            self._queue.append(GPUEvent(uuid, GPUEventKind.DEVICE_LOST))
        self._lost = lost

    def _queue_new_events(self, inventory: Inventory) -> None:
        for event in inventory.events:
            if event.id in self._fired:
                continue
            self._fired.add(event.id)
            self._queue.append(GPUEvent(event.gpu, event.kind, xid=event.xid))

    def _read(self) -> bytes | None:
        assert self._path is not None
        try:
            return self._path.read_bytes()
        except FileNotFoundError:
            return None

    @staticmethod
    def _parse(raw: bytes, source: str) -> Inventory:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InventoryError(source, "whole file", f"is not UTF-8 text: {exc.reason}") from None
        return parse_inventory_text(text, source)

    def _on_file_event(self) -> None:
        """The watcher's callback: a read may land in the middle of someone's write, so a content that
        does not parse is only rejected if the file still holds it `settle_s` later."""
        self._check_file(settle=True)

    def _check_file(self, *, settle: bool = False) -> None:
        """Re-read the file; apply it when its bytes changed. Runs on the watcher's thread, the settle
        timer's or in init; `_file_lock` keeps an older read from being applied after a newer one."""
        if self._path is None:
            return
        with self._file_lock:
            try:
                raw = self._read()
            except OSError as exc:
                log.warning(
                    "fake inventory %s: cannot be read (%s); keeping the previous inventory", self._path, exc
                )
                return
            if raw is None:
                if not self._missing_logged:
                    log.warning("fake inventory %s: file is gone; keeping the previous inventory", self._path)
                    self._missing_logged = True
                return
            self._missing_logged = False
            with self._cond:
                if raw == self._raw:
                    return
            try:
                inventory = self._parse(raw, str(self._path))
            except InventoryError as exc:
                if settle:
                    self._settle_later()
                else:
                    self._reject(raw, exc)
                return
            self._accept(raw, inventory)

    def _settle_later(self) -> None:
        with self._timer_lock:
            if self._settle_timer is not None and self._settle_timer.is_alive():
                return  # one pending re-read covers every bad read before it
            timer = threading.Timer(self._settle_s, self._check_file)
            timer.daemon = True
            timer.name = "fake-inventory-settle"
            self._settle_timer = timer
            timer.start()

    def _reject(self, raw: bytes, error: InventoryError) -> None:
        with self._cond:
            self._raw = raw
            self._reloads += 1
            self._last_error = str(error)
            log.error("fake inventory: bad edit ignored, keeping the previous inventory: %s", error)
            self._cond.notify_all()

    def _accept(self, raw: bytes, inventory: Inventory) -> None:
        with self._cond:
            self._raw = raw
            self._reloads += 1
            self._last_error = None
            self._inventory = inventory
            self._update_lost(inventory)
            self._queue_new_events(inventory)
            if self._seed_mig(inventory):
                self._save_mig_logged()
            log.info(
                "fake inventory %s: %d GPUs, nvml %s, %d lost",
                self._path,
                len(inventory.gpus),
                inventory.nvml.value,
                len(self._lost),
            )
            self._cond.notify_all()

    def _stop_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()  # joins the observer: no new settle timer after this
        with self._timer_lock:
            timer, self._settle_timer = self._settle_timer, None
        if timer is not None:
            timer.cancel()
            timer.join()


def _parse_mig_state(data: object, inventory: Inventory, source: str) -> dict[str, _GpuMig]:
    """Decode `<inventory>.mig.json`. Entries of GPUs no longer in the inventory, not MIG enabled or of
    a model without a MIG table are dropped; anything malformed raises InventoryError."""

    def fail(where: str, reason: str) -> InventoryError:
        return InventoryError(source, where, reason)

    if not isinstance(data, Mapping) or data.get("version") != 1 or not isinstance(data.get("gpus"), Mapping):
        raise fail("whole file", 'expected {"version": 1, "gpus": {...}} (written by the fake backend)')
    layouts: dict[str, _GpuMig] = {}
    for uuid, entry in data["gpus"].items():
        where = f"gpus.{uuid}"
        gpu = inventory.gpu(str(uuid))
        model = gpu.mig_model if gpu is not None and gpu.mig_enabled else None
        if model is None:
            continue
        if not isinstance(entry, Mapping):
            raise fail(where, "expected a mapping with serial, seeded and devices")
        serial = entry.get("serial")
        if not isinstance(serial, int) or isinstance(serial, bool) or serial < 0:
            raise fail(f"{where}.serial", f"expected an integer >= 0, got {serial!r}")
        seeded = _state_list(entry.get("seeded"), f"{where}.seeded", fail)
        devices = _state_list(entry.get("devices"), f"{where}.devices", fail)
        state = _GpuMig(
            [], serial, tuple(FakeMigInstance(str(d["profile"]), int(d["start"])) for d in seeded)
        )
        for i, device in enumerate(devices):
            at = f"{where}.devices[{i}]"
            profile = model.profile(str(device["profile"]))
            placement = profile.placement_at(int(device["start"])) if profile is not None else None
            gi, mig_uuid = device.get("gi"), device.get("uuid")
            if profile is None or placement is None:
                raise fail(
                    at,
                    f"{device['profile']!r} at start {device['start']!r} is not a placement of {model.name}",
                )
            if not isinstance(gi, int) or isinstance(gi, bool) or gi < 0 or not isinstance(mig_uuid, str):
                raise fail(at, f"expected an integer gi and a string uuid, got gi {gi!r}, uuid {mig_uuid!r}")
            if any(o.gi == gi or o.placement.overlaps(placement) for o in state.instances):
                raise fail(at, f"GPU instance {gi} at {placement} clashes with an earlier one")
            state.instances.append(_Instance(gi, profile, placement, mig_uuid))
        layouts[str(uuid)] = state
    return layouts


def _state_list(
    value: object, where: str, fail: Callable[[str, str], InventoryError]
) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        raise fail(where, f"expected a list, got {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("profile"), str):
            raise fail(f"{where}[{i}]", f"expected {{profile, start, ...}}, got {item!r}")
        start = item.get("start")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise fail(f"{where}[{i}].start", f"expected an integer >= 0, got {start!r}")
    return value


class _DirWatcher(FileSystemEventHandler):
    """Calls `on_change` when something in the file's directory may have changed the file."""

    def __init__(
        self, path: Path, on_change: Callable[[], None], observer_factory: Callable[[], BaseObserver]
    ) -> None:
        self._file = str(path)
        self._dir = os.path.dirname(self._file)
        self._parent = os.path.dirname(self._dir)
        self._on_change = on_change
        self._observer: BaseObserver = observer_factory()
        self._observer.daemon = True
        self._dir_watch: ObservedWatch | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._parent != self._dir:
            self._observer.schedule(self, self._parent, event_filter=list(_PARENT_EVENTS))
        self._schedule_dir()
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()
        if self._observer.is_alive():
            self._observer.join(timeout=5)

    def _schedule_dir(self) -> None:
        with self._lock:
            if self._dir_watch is not None:
                with contextlib.suppress(KeyError):
                    self._observer.unschedule(self._dir_watch)
                self._dir_watch = None
            if os.path.isdir(self._dir):
                try:
                    self._dir_watch = self._observer.schedule(self, self._dir, event_filter=list(_DIR_EVENTS))
                except OSError as exc:
                    log.warning("fake inventory: cannot watch %s: %s", self._dir, exc)

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            self._handle(event)
        except Exception:
            log.exception("fake inventory: error while handling %s", event)

    def _handle(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if self._dir in (src, dest):
            # The directory itself (seen from the parent watch): removed, created or moved.
            if isinstance(event, DirCreatedEvent | DirDeletedEvent | DirMovedEvent):
                self._schedule_dir()
                self._on_change()
            return
        if isinstance(event, FileMovedEvent | DirMovedEvent):
            # A rename in the directory: the file replaced (write-then-rename), or a ConfigMap's
            # ..data symlink swapped. Either way a complete file.
            if self._dir in (os.path.dirname(src), os.path.dirname(dest)):
                self._on_change()
            return
        if src != self._file:
            return  # other files: temp files before their rename, our own reads' noise
        if isinstance(event, FileModifiedEvent):
            if not _CLOSE_EVENTS:
                self._on_change()  # no close events on this platform; a half-written read settles
            return  # mid-write; the close event follows
        if isinstance(event, FileCreatedEvent | FileDeletedEvent | FileClosedEvent):
            self._on_change()
