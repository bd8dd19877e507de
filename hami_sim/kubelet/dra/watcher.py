"""Kubelet's plugin watcher and its reconciler, as a stand-in for DRA plugins (kubernetes
pkg/kubelet/pluginmanager: pluginwatcher/plugin_watcher.go, reconciler/reconciler.go, cache/).

- At start the registration directory is created (0755) and walked; every Unix socket found there or
  in a subdirectory, and every one created later, is a plugin to register (the desired state of the
  world). Names starting with "." are ignored, as are files that are not sockets. A socket removed
  (or moved away) leaves the desired state.
- The reconciler unregisters what is registered but no longer desired, or desired again as a new file
  (a plugin that re-created its socket), then registers what is desired and not registered
  (`registration.register_plugin`). A failed registration of a socket is tried again with exponential
  backoff (kubelet's goroutinemap: 0.5 s doubling up to 2 min 2 s).
- Kubelet watches with fsnotify and reconciles every second; the stand-in watches with watchdog (one
  observer per watcher, from the caller's `observer_factory` so that a process hosting many nodes can
  share inotify instances, see hami_sim.nodehost) and reconciles when something changed or a backoff
  ran out. Kubelet stamps a socket with the time its create event arrived; the stand-in with the file's
  identity (inode, ctime), so that a create event and the start-up walk seeing the same socket do not
  register it twice.
- Not modelled: the connection monitor newer kubelets run on registered sockets (re-registering a
  plugin that comes back on a socket file that never went away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from hami_kube.backoff import RetryPolicy
from hami_node.ports import ObserverFactory
from hami_sim.kubelet.dra.registration import (
    DIAL_TIMEOUT_SECONDS,
    PluginInfo,
    RegisterHandler,
    RegistrationFailed,
    register_plugin,
)

log = logging.getLogger(__name__)

REGISTER_RETRY = RetryPolicy(initial=0.5, maximum=122.0, factor=2.0, jitter=0.0)
"""nestedpendingoperations' exponential backoff of a failed registration (500 ms doubling to 2m2s)."""

OBSERVER_STOP_SECONDS = 10.0
_RNG = random.Random()  # REGISTER_RETRY has no jitter: the draw does not matter

_Identity = tuple[int, int, int]


def socket_identity(path: str) -> _Identity | None:
    """(device, inode, ctime) of the Unix socket at `path`; None for anything else or nothing."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _hidden(path: str) -> bool:
    return os.path.basename(path).startswith(".")


@dataclass
class _Registered:
    identity: _Identity
    driver: str
    endpoint: str


@dataclass
class _Attempts:
    failures: int = 0
    not_before: float = 0.0


class PluginWatcher:
    """Watches `directory` for plugin sockets and keeps what is registered in line with them, calling
    `register(info, service)` (may raise `registration.RegistrationRefused`) and
    `deregister(driver, endpoint)`. Runs on the caller's loop; the watchdog observer on its threads."""

    def __init__(
        self,
        directory: Path,
        register: RegisterHandler,
        deregister: Callable[[str, str], Awaitable[None]],
        *,
        observer_factory: ObserverFactory | None = None,
        dial_timeout: float = DIAL_TIMEOUT_SECONDS,
        name: str = "",
    ) -> None:
        self.directory = Path(os.path.abspath(directory))
        self._register = register
        self._deregister = deregister
        self._observer_factory = observer_factory or Observer
        self._dial_timeout = dial_timeout
        self._name = name
        self._desired: dict[str, _Identity] = {}
        self._registered: dict[str, _Registered] = {}
        self._attempts: dict[str, _Attempts] = {}
        self._operations: dict[str, asyncio.Task[None]] = {}
        self._observer: BaseObserver | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._reconciler: asyncio.Task[None] | None = None
        self.failures: dict[str, str] = {}
        """The last registration failure per socket path (cleared by a success)."""

    # ------------------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        observer = self._observer_factory()
        observer.daemon = True
        observer.schedule(_Events(self), str(self.directory), recursive=True, event_filter=list(EVENTS))
        observer.start()
        self._observer = observer
        self._walk(self.directory)
        self._reconciler = asyncio.create_task(self._run(), name=f"plugin-watcher-{self._name}")
        log.info("node %s: watching %s for plugin sockets", self._name, self.directory)

    async def stop(self) -> None:
        """Stop watching and registering; what is registered stays registered (the caller closes it)."""
        observer, self._observer = self._observer, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = [t for t in (self._reconciler, *self._operations.values()) if t is not None]
        self._reconciler = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._operations.clear()
        if observer is not None:
            await asyncio.to_thread(_stop_observer, observer)

    def registered(self) -> dict[str, tuple[str, str]]:
        """Socket path -> (driver, endpoint) of every registered plugin."""
        return {path: (r.driver, r.endpoint) for path, r in self._registered.items()}

    # ------------------------------------------------------------------------------ desired state

    def _walk(self, directory: Path) -> None:
        for root, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                self._created(os.path.join(root, name))

    def _created(self, path: str) -> None:
        if _hidden(path):
            return
        identity = socket_identity(path)
        if identity is None or self._desired.get(path) == identity:
            return
        log.debug("node %s: plugin socket %s appeared", self._name, path)
        self._desired[path] = identity
        self._attempts.pop(path, None)
        self._wake.set()

    def _deleted(self, path: str) -> None:
        if self._desired.pop(path, None) is not None:
            log.debug("node %s: plugin socket %s went away", self._name, path)
            self._attempts.pop(path, None)
            self._wake.set()

    def event(self, kind: str, path: str) -> None:
        """A filesystem event (called on the loop): `created`, `deleted` or `dir` (a new directory)."""
        if kind == "created":
            self._created(path)
        elif kind == "deleted":
            self._deleted(path)
        elif kind == "dir" and not _hidden(path):
            self._walk(Path(path))

    def _post(self, kind: str, path: str) -> None:
        """From the observer's thread onto the loop (dropped once the loop is closed)."""
        loop = self._loop
        if loop is None or self._observer is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.event, kind, path)

    # ------------------------------------------------------------------------------ reconciler

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._reconcile()

    async def _reconcile(self) -> None:
        """reconciler.go reconcile: unregistrations first, then registrations."""
        for path, plugin in list(self._registered.items()):
            if self._desired.get(path) != plugin.identity and path not in self._operations:
                del self._registered[path]
                log.info("node %s: unregistering plugin %s at %s", self._name, plugin.driver, path)
                await self._deregister(plugin.driver, plugin.endpoint)
        loop = asyncio.get_running_loop()
        now = loop.time()
        next_try: float | None = None
        for path, identity in self._desired.items():
            registered = self._registered.get(path)
            if (registered is not None and registered.identity == identity) or path in self._operations:
                continue
            attempts = self._attempts.get(path)
            if attempts is not None and attempts.not_before > now:
                next_try = min(next_try or attempts.not_before, attempts.not_before)
                continue
            self._operations[path] = loop.create_task(
                self._operation(path, identity), name=f"register-plugin-{self._name}"
            )
        if next_try is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(next_try, self._wake.set)

    async def _operation(self, path: str, identity: _Identity) -> None:
        def add_to_actual_state(info: PluginInfo) -> None:
            self._registered[path] = _Registered(identity, info.driver, info.endpoint)

        try:
            info = await register_plugin(
                path, add_to_actual_state, self._register, dial_timeout=self._dial_timeout
            )
        except RegistrationFailed as exc:
            attempts = self._attempts.setdefault(path, _Attempts())
            attempts.failures += 1
            delay = REGISTER_RETRY.delay(attempts.failures, _RNG)
            attempts.not_before = asyncio.get_running_loop().time() + delay
            self.failures[path] = str(exc)
            log.warning(
                "node %s: registering the plugin at %s failed (retry in %.1f s): %s",
                self._name,
                path,
                delay,
                exc,
            )
        except Exception:
            log.exception("node %s: registering the plugin at %s failed", self._name, path)
            attempts = self._attempts.setdefault(path, _Attempts())
            attempts.failures += 1
            attempts.not_before = asyncio.get_running_loop().time() + REGISTER_RETRY.maximum
        else:
            self._attempts.pop(path, None)
            self.failures.pop(path, None)
            log.info("node %s: registered plugin %s (socket %s)", self._name, info.driver, path)
        finally:
            if self._operations.get(path) is asyncio.current_task():
                del self._operations[path]
            self._wake.set()


def _stop_observer(observer: BaseObserver) -> None:
    observer.stop()
    if observer.is_alive():
        observer.join(OBSERVER_STOP_SECONDS)


EVENTS: tuple[type[FileSystemEvent], ...] = (
    DirCreatedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
)
"""What `_Events` acts on, asked of inotify alone. Kubelet's plugin watcher acts on fsnotify's Create and
Remove only (pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go), and fsnotify's inotify backend
never asks for opens or closes (backend_inotify.go): neither does the stand-in, whose kubelets share one
process in scale mode."""


class _Events(FileSystemEventHandler):
    """Turns watchdog's events into `created` / `deleted` / `dir` for the watcher's loop."""

    def __init__(self, watcher: PluginWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        if isinstance(event, DirCreatedEvent):
            self._watcher._post("dir", src)
        elif isinstance(event, FileCreatedEvent):
            self._watcher._post("created", src)
        elif isinstance(event, FileDeletedEvent):
            self._watcher._post("deleted", src)
        elif isinstance(event, FileMovedEvent):
            self._watcher._post("deleted", src)
            self._watcher._post("created", os.fsdecode(event.dest_path))
