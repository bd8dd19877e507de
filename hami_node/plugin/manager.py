"""The plugin's life cycle: serve, register, and do it again whenever kubelet restarts.

`PluginManager` runs one thread that owns the `PluginServer`:

1. Start the server on `<kubelet_dir>/<socket_name>`, then register on `kubelet.sock` (only once the
   server answers a self-dial: `registration.register`).
2. Kubelet restarts wipe every socket in its directory and create kubelet.sock again. A `watchdog`
   observer watches the kubelet directory and its parent (an inotify watch dies with its directory;
   the parent's watch sees the directory come back and the directory's watch is scheduled again).
   When kubelet.sock is created (or moved in, or "modified" into a different file), the old server is
   stopped first (its ListAndWatch stream ends), a new one serves and registers: well within 1 s.
   Our own socket vanishing while we serve (someone removed it) restarts the same way.
3. `request_restart()` (SIGHUP) restarts the same way; the caller's signal handler only calls it, which
   puts a message on a reentrant queue: the work is done in the manager thread.
4. Kubelet absent at start (no directory or no kubelet.sock): wait for the watch to report it; as a
   safety net against a lost watch, look again every `fallback_poll_s`. No busy loop.
5. A failed start or registration is retried with backoff (`retry_initial_s` doubling up to
   `retry_max_s`), the server restarted with it; a new kubelet.sock retries at once.
6. `stop()` (SIGTERM): stop the server (streams end, the socket is removed), the observer and the thread.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from hami_node.config import NodeConfig
from hami_node.devices import DeviceState
from hami_node.plugin.registration import (
    DIAL_TIMEOUT_S,
    REGISTER_TIMEOUT_S,
    RegistrationError,
    register,
)
from hami_node.plugin.server import PluginServer, PluginServerError
from hami_node.ports import PluginObserver, PodSource

log = logging.getLogger(__name__)

_Identity = tuple[int, int, int]

_STOP = "stop"
_RESTART = "restart"
_KUBELET_SOCKET = "kubelet-socket"
_REWATCH = "rewatch"
_PLUGIN_SOCKET_GONE = "plugin-socket-gone"


def _identity(path: Path) -> _Identity | None:
    """Which file is at `path` now (device, inode, ctime): a re-created socket differs."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Serving(Protocol):
    """What the manager needs of a plugin server: HAMi's `PluginServer`, or one of NVIDIA's resources
    (`hami_node.nvidia.plugin.NvidiaPluginServer`)."""

    @property
    def socket_path(self) -> Path: ...

    @property
    def serving(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, grace_s: float = ...) -> None: ...


class PluginManager:
    """Serves and registers the device plugin, and keeps it registered; see the module docstring.

    `server_factory` builds each server (default: `PluginServer(config, state, pods)`). `resource_name`
    and `socket_name` default to the config's; NVIDIA's modes run one manager per resource with its own.
    """

    def __init__(
        self,
        config: NodeConfig,
        state: DeviceState,
        pods: PodSource,
        *,
        server_factory: Callable[[], Serving] | None = None,
        resource_name: str | None = None,
        socket_name: str | None = None,
        observer_factory: Callable[[], BaseObserver] = Observer,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 30.0,
        stop_grace_s: float = 0.5,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
        fallback_poll_s: float = 10.0,
        observer: PluginObserver | None = None,
    ) -> None:
        if retry_initial_s <= 0 or retry_max_s < retry_initial_s:
            raise ValueError(
                f"retry backoff must satisfy 0 < initial <= max, got {retry_initial_s}, {retry_max_s}"
            )
        self._config = config
        self._dir = Path(os.path.abspath(config.kubelet_dir))
        self._parent = self._dir.parent
        self._kubelet_socket = self._dir / config.kubelet_socket.name
        self._resource_name = resource_name or config.resource_name
        self._plugin_socket = self._dir / (socket_name or config.socket_name)
        self._factory: Callable[[], Serving] = server_factory or (
            lambda: PluginServer(config, state, pods, observer=observer)
        )
        self._plugin_observer = observer
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._stop_grace_s = stop_grace_s
        self._dial_timeout_s = dial_timeout_s
        self._register_timeout_s = register_timeout_s
        self._fallback_poll_s = fallback_poll_s

        # What the watch, signals and stop() tell the manager thread: (kind, detail). SimpleQueue.put
        # is reentrant, so a signal handler may call it.
        self._inbox: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

        self._server: Serving | None = None
        self._registered: _Identity | None = None
        self._registrations = 0
        self._restarts = 0
        self._cond = threading.Condition()
        self._backoff_s = retry_initial_s
        self._next_attempt = -math.inf
        self._waiting_logged = False

        self._observer_factory = observer_factory
        self._observer: BaseObserver | None = None
        self._handler = _KubeletDirHandler(self)
        self._parent_watch: ObservedWatch | None = None
        self._dir_watch: ObservedWatch | None = None
        self._thread: threading.Thread | None = None

    # --- public -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching and the manager thread; serving and registering happen in that thread."""
        if self._thread is not None:
            raise RuntimeError("plugin manager already started")
        observer = self._observer_factory()
        observer.daemon = True
        self._observer = observer
        self._schedule_watches()
        observer.start()
        self._thread = threading.Thread(target=self._run, name="hami-plugin-manager", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (the socket is removed) and watching; join the thread. Idempotent."""
        self._inbox.put((_STOP, ""))
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("plugin manager thread did not stop within %.1f s", timeout_s)
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            if observer.is_alive():
                observer.join(timeout_s)
        if thread is None:  # never started, or a second stop
            self._stop_server()

    def request_restart(self, reason: str = "restart requested (SIGHUP)") -> None:
        """Stop the server, serve again and re-register. Safe from a signal handler (it only puts a
        message on a reentrant queue); the manager thread does the work."""
        self._inbox.put((_RESTART, reason))

    @property
    def registrations(self) -> int:
        """How many times the plugin registered with kubelet."""
        with self._cond:
            return self._registrations

    @property
    def restarts(self) -> int:
        """How many times the server was stopped to serve again (kubelet restart, SIGHUP, failure)."""
        with self._cond:
            return self._restarts

    @property
    def registered(self) -> bool:
        with self._cond:
            return self._registered is not None

    @property
    def server(self) -> Serving | None:
        """The server serving now, if any."""
        return self._server

    def wait_registered(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` registrations happened. False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._registrations > after, timeout_s)

    # --- events from the watch (observer thread): flags and a kick, nothing else ------------------

    def _kubelet_socket_changed(self, what: str) -> None:
        self._inbox.put((_KUBELET_SOCKET, f"{self._kubelet_socket} {what} (kubelet restarted)"))

    def _plugin_socket_deleted(self) -> None:
        self._inbox.put((_PLUGIN_SOCKET_GONE, f"our socket {self._plugin_socket} was removed"))

    def _directory_changed(self, what: str) -> None:
        self._inbox.put((_REWATCH, f"{self._dir} {what}"))

    # --- the manager thread ---------------------------------------------------------------------

    def _run(self) -> None:
        timeout: float | None = 0.0
        try:
            while True:
                items = self._receive(timeout)
                if any(kind == _STOP for kind, _ in items):
                    break
                try:
                    timeout = self._turn(items)
                except Exception as err:  # never leave the node unserved: start over after a backoff
                    log.exception("plugin manager: unexpected error")
                    self._stop_server()
                    timeout = self._failed(f"unexpected error: {err!r}")
        finally:
            self._stop_server()

    def _turn(self, items: list[tuple[str, str]]) -> float | None:
        """Act on the inbox items, then serve and register if needed; returns `_ensure_registered`'s
        wait."""
        reasons: list[str] = []
        for kind, detail in items:
            if kind == _REWATCH:
                self._schedule_watches()
                reasons.append(detail)
            elif (
                kind == _RESTART
                or (kind == _KUBELET_SOCKET and self._kubelet_socket_is_new())
                or (kind == _PLUGIN_SOCKET_GONE and self._server_lost_socket())
            ):
                reasons.append(detail)
        if self._dir_watch is None or self._parent_watch is None:
            self._schedule_watches(only_missing=True)  # a directory that did not exist may now
        if reasons:
            self._restart("; ".join(dict.fromkeys(reasons)))
        return self._ensure_registered()

    def _kubelet_socket_is_new(self) -> bool:
        """Whether kubelet.sock is there and is not the one we registered with (an event may arrive
        after we already registered with the new kubelet; restarting again would be wasted)."""
        identity = _identity(self._kubelet_socket)
        with self._cond:
            return identity is not None and identity != self._registered

    def _server_lost_socket(self) -> bool:
        """Our own stop removes the socket too: only a socket gone under a live server counts."""
        return self._server is not None and not self._plugin_socket.exists()

    def _receive(self, timeout: float | None) -> list[tuple[str, str]]:
        """Everything in the inbox, waiting up to `timeout` (None: forever) for the first item."""
        items: list[tuple[str, str]] = []
        try:
            items.append(self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait())
        except queue.Empty:
            return items
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _restart(self, reason: str) -> None:
        log.info("device plugin restart: %s", reason)
        if self._server is not None:
            with self._cond:
                self._restarts += 1
        self._stop_server()
        self._next_attempt = -math.inf
        self._backoff_s = self._retry_initial_s

    def _stop_server(self) -> None:
        with self._cond:
            self._registered = None
        server, self._server = self._server, None
        if server is not None:
            server.stop(self._stop_grace_s)

    def _ensure_registered(self) -> float | None:
        """Serve and register when needed. Returns how long to wait for a kick before looking again
        (None: until kicked)."""
        with self._cond:
            if self._registered is not None:
                return None
        now = time.monotonic()
        if now < self._next_attempt:
            return self._next_attempt - now
        if not self._dir.is_dir():
            self._log_waiting(f"kubelet's directory {self._dir} does not exist")
            return self._fallback_poll_s
        if self._server is None:
            server = self._factory()
            try:
                server.start()
            except PluginServerError as err:
                return self._failed(f"cannot serve: {err}")
            self._server = server
        if not self._kubelet_socket.exists():
            self._log_waiting(f"{self._kubelet_socket} does not exist")
            return self._fallback_poll_s
        identity = _identity(self._kubelet_socket)
        try:
            register(
                self._kubelet_socket,
                self._server.socket_path,
                self._resource_name,
                dial_timeout_s=self._dial_timeout_s,
                register_timeout_s=self._register_timeout_s,
            )
        except RegistrationError as err:
            if self._plugin_observer is not None:
                self._plugin_observer.registration(False)
            self._stop_server()  # serve afresh next time: kubelet may have removed our socket
            return self._failed(str(err))
        if self._plugin_observer is not None:
            self._plugin_observer.registration(True)
        with self._cond:
            self._registered = identity
            self._registrations += 1
            self._cond.notify_all()
        self._backoff_s = self._retry_initial_s
        self._next_attempt = -math.inf
        self._waiting_logged = False
        return None

    def _failed(self, message: str) -> float:
        delay = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._retry_max_s)
        self._next_attempt = time.monotonic() + delay
        log.warning("device plugin registration: %s; retrying in %.1f s", message, delay)
        return delay

    def _log_waiting(self, why: str) -> None:
        if not self._waiting_logged:
            log.info("waiting for kubelet: %s", why)
            self._waiting_logged = True

    # --- watches ------------------------------------------------------------------------------------

    def _schedule_watches(self, only_missing: bool = False) -> None:
        """(Re)schedule the watch of the kubelet directory (only if it has none with `only_missing`),
        and of its parent if not yet watched."""
        observer = self._observer
        if observer is None:
            return
        if self._parent_watch is None and self._parent != self._dir and self._parent.is_dir():
            try:
                self._parent_watch = observer.schedule(
                    self._handler, str(self._parent), event_filter=list(PARENT_EVENTS)
                )
            except OSError as err:
                log.warning("cannot watch %s: %s", self._parent, err)
        if only_missing and self._dir_watch is not None:
            return
        if self._dir_watch is not None:
            with contextlib.suppress(KeyError):
                observer.unschedule(self._dir_watch)
            self._dir_watch = None
        if self._dir.is_dir():
            try:
                self._dir_watch = observer.schedule(
                    self._handler, str(self._dir), event_filter=list(DIR_EVENTS)
                )
            except OSError as err:
                log.warning("cannot watch %s: %s", self._dir, err)


PARENT_EVENTS: tuple[type[FileSystemEvent], ...] = (DirCreatedEvent, DirDeletedEvent, DirMovedEvent)
"""What the watch of the kubelet directory's parent acts on: the directory made, removed or moved. Given
to the observer, which asks inotify for these alone (IN_CREATE, IN_DELETE, IN_MOVE): the parent
(`/var/lib/kubelet`; in the local cluster's scale mode one directory holding every node's) also sees an
open and a close each time anything lists or reads one of its entries, and with every daemon of a
scale-mode process watching the same parent those reached every daemon: O(nodes) events for each, O(nodes
squared) in all (issue 29: 500 nodes did not run)."""

DIR_EVENTS: tuple[type[FileSystemEvent], ...] = (
    *PARENT_EVENTS,
    FileCreatedEvent,
    FileMovedEvent,
    FileModifiedEvent,
    FileDeletedEvent,
)
"""What the watch of the kubelet directory acts on (`_KubeletDirHandler._handle`): no opens and closes."""


class _KubeletDirHandler(FileSystemEventHandler):
    """Turns filesystem events in the kubelet directory (and of the directory itself) into flags."""

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager
        self._dir = str(manager._dir)
        self._kubelet_socket = str(manager._kubelet_socket)
        self._plugin_socket = str(manager._plugin_socket)

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            self._handle(event)
        except Exception:
            log.exception("kubelet directory watch: error handling %s", event)

    def _handle(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        manager = self._manager
        if self._dir in (src, dest) and isinstance(event, DirCreatedEvent | DirDeletedEvent | DirMovedEvent):
            manager._directory_changed(type(event).__name__.removeprefix("Dir").removesuffix("Event").lower())
            return
        if isinstance(event, FileCreatedEvent) and src == self._kubelet_socket:
            manager._kubelet_socket_changed("created")
        elif isinstance(event, FileMovedEvent) and dest == self._kubelet_socket:
            manager._kubelet_socket_changed("moved in")
        elif isinstance(event, FileModifiedEvent) and src == self._kubelet_socket:
            manager._kubelet_socket_changed("replaced")
        elif (isinstance(event, FileDeletedEvent) and src == self._plugin_socket) or (
            isinstance(event, FileMovedEvent) and src == self._plugin_socket
        ):
            manager._plugin_socket_deleted()


class Restartable(Protocol):
    """What SIGHUP restarts: the device plugin's `PluginManager`, or in DRA mode the DRA plugin's servers
    (`hami_node.dra.server.DraPluginServers`)."""

    def request_restart(self, reason: str = ...) -> None: ...


class SignalHandlers:
    """The daemon's signals: SIGHUP -> `manager.request_restart()`; SIGTERM and SIGINT -> shutdown,
    which the main thread awaits with `wait_for_shutdown()` and then stops everything (`manager.stop()`
    included, which removes the socket).

    The handlers only put a message on reentrant queues (`queue.SimpleQueue.put` is safe in a signal
    handler, unlike `threading.Event.set`, whose lock the interrupted main thread may hold).
    `install()` and `restore()` must run in the main thread; also usable as a context manager.
    """

    def __init__(self, manager: Restartable) -> None:
        self._manager = manager
        self._shutdown: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum, handler in (
            (signal.SIGHUP, self._on_hup),
            (signal.SIGTERM, self._on_term),
            (signal.SIGINT, self._on_term),
        ):
            self._previous[signum] = signal.signal(signum, handler)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __enter__(self) -> SignalHandlers:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def wait_for_shutdown(self, timeout_s: float | None = None) -> int | None:
        """Block until SIGTERM or SIGINT arrives (or `request_shutdown`); the signal number, or None
        after `timeout_s`."""
        try:
            return self._shutdown.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def request_shutdown(self, signum: int = signal.SIGTERM) -> None:
        """What SIGTERM does, for callers that are not signals."""
        self._shutdown.put(signum)

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self._manager.request_restart("SIGHUP")

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._shutdown.put(signum)


def install_signal_handlers(manager: Restartable, shutdown: threading.Event) -> Callable[[], None]:
    """`SignalHandlers` for a main thread that waits on an Event: SIGHUP -> `manager.request_restart()`,
    SIGTERM/SIGINT -> `shutdown.set()`, done by a small relay thread (never inside the handler). Call
    from the main thread; returns a function that restores the previous handlers and ends the relay."""
    handlers = SignalHandlers(manager)
    handlers.install()

    def relay() -> None:
        while handlers.wait_for_shutdown() != _RELAY_DONE:
            shutdown.set()

    thread = threading.Thread(target=relay, name="hami-signal-relay", daemon=True)
    thread.start()

    def restore() -> None:
        handlers.restore()
        handlers.request_shutdown(_RELAY_DONE)
        thread.join(5.0)

    return restore


_RELAY_DONE = -1


class PluginGroup:
    """Several plugin managers run as one (NVIDIA's modes: one per resource): started in order, stopped
    in reverse, restarted together; registered and serving when all are."""

    def __init__(self, managers: Sequence[PluginManager]) -> None:
        self.managers = tuple(managers)

    def start(self) -> None:
        for manager in self.managers:
            manager.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        for manager in reversed(self.managers):
            manager.stop(timeout_s)

    def request_restart(self, reason: str = "restart requested (SIGHUP)") -> None:
        for manager in self.managers:
            manager.request_restart(reason)

    @property
    def registered(self) -> bool:
        return all(m.registered for m in self.managers)

    @property
    def serving(self) -> bool:
        return all(m.server is not None and m.server.serving for m in self.managers)


__all__ = [
    "PluginGroup",
    "PluginManager",
    "Restartable",
    "Serving",
    "SignalHandlers",
    "install_signal_handlers",
]
