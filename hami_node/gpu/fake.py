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

Thread-safety: every method may be called from any thread; `wait_event` blocks on a condition that
every state change notifies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

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

from hami_node.gpu.backend import (
    DeviceLost,
    GPUEvent,
    GPUEventKind,
    GPUFailed,
    GPULink,
    GPUNotFound,
    GPUUsage,
    LibraryNotFound,
    NvmlFailed,
    PhysicalGPU,
)
from hami_node.gpu.inventory import FakeGpu, Inventory, InventoryError, NvmlMode, parse_inventory_text

log = logging.getLogger(__name__)

_MIB = 1024 * 1024

# On Linux (inotify) a write ends with a close event; reacting to "modified" too would read half-written
# files. Elsewhere there is no close event, so "modified" is all we get.
_CLOSE_EVENTS = sys.platform.startswith("linux")


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
            self._observer.schedule(self, self._parent)
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
                    self._dir_watch = self._observer.schedule(self, self._dir)
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
