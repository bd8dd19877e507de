"""The kubelet DRA plugin's gRPC side: registration, DRAPlugin v1 and v1beta1, DRAResourceHealth, on real
Unix sockets (`hami_node.unixgrpc`), kept serving while the daemon runs.

Sockets (the upstream helper's, k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go):

- `<registry dir>/<driver>-reg.sock`: `pluginregistration.Registration`. kubelet's plugin watcher finds
  it (inotify, and at kubelet start by walking the directory: pkg/kubelet/pluginmanager/pluginwatcher),
  calls GetInfo (type `DRAPlugin`, the driver name, the absolute path of dra.sock, and the services
  `v1.DRAPlugin`, `v1beta1.DRAPlugin` (kubelet takes the first it supports, so v1 wins where it
  exists) and `v1alpha1.DRAResourceHealth` (newer kubelets open the health stream only for a plugin that
  lists it: the v1alpha1 package's DRAResourceHealthService), then NotifyRegistrationStatus, which is
  logged (an error when registration failed, and the call answers an error, as the helper's
  registrationserver.go).
- `<plugins dir>/<driver>/dra.sock`: DRAPlugin v1 and v1beta1 (the same calls; v1 also returns share
  IDs) and `v1alpha1.DRAResourceHealth` (`NodeWatchResources`: the full device list at once, again on
  every health change, and every `health_resend_s` so kubelet never times a device out to Unknown).

A kubelet restart needs nothing: kubelet re-registers the sockets it finds (the watcher does not delete
them). A socket removed while we serve (by hand, or a wiped directory) deregisters the plugin, so it is
served again at once: a watch of the socket's directory and its parent (as the device plugin's manager
watches kubelet's directory) restarts the server whose socket is gone, and a poll every
`fallback_poll_s` is the safety net.

Rolling updates (`--dra-rolling-update-uid`, the pod's UID): the helper's RollingUpdate names,
`<driver>-<uid>-reg.sock` (shortened by a hash of the UID when the path would be too long:
`rolling_registration_name`) and `dra-<uid>.sock`, so the old and the new daemon serve side by side
(kubelet >= 1.33 keeps both and uses the newest connected one); calls are serialized across them by
`serialize.lock` (`prepare.ClaimPreparer`). Off by default: older kubelets keep one endpoint per driver
and a DaemonSet's default rolling update (maxSurge 0) stops the old pod before the new one starts, so
the plain names are the ones that work everywhere.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from hami_api.dra import device_name
from hami_node.config import NodeConfig
from hami_node.devices import DeviceState, GPUStatus, StateStreams
from hami_node.dra.api.health.v1alpha1 import api_pb2 as health_pb2
from hami_node.dra.api.health.v1alpha1 import api_pb2_grpc as health_grpc
from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2 as v1beta1_pb2
from hami_node.dra.api.v1beta1 import api_pb2_grpc as v1beta1_grpc
from hami_node.dra.claims import ClaimRef
from hami_node.dra.prepare import ClaimPreparer, Outcome
from hami_node.dra.slices import taint_value
from hami_node.unixgrpc import (
    MAX_SOCKET_PATH,
    SocketIdentity,
    UnixServerError,
    remove_own_socket,
    socket_identity,
    start_unix_server,
)

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
"""`PluginInfo.type` of a DRA plugin (pluginregistration/v1 constants.go)."""
V1_SERVICE = "v1.DRAPlugin"
V1BETA1_SERVICE = "v1beta1.DRAPlugin"
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
SUPPORTED_SERVICES = (V1_SERVICE, V1BETA1_SERVICE, HEALTH_SERVICE)
"""What GetInfo lists, in this order (the helper's order, draplugin.go Start)."""
DRA_SOCKET = "dra.sock"


class DraServerError(UnixServerError):
    """A DRA socket cannot be served."""


# --- socket names -------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def rolling_registration_name(registry_dir: Path, driver: str, uid: str) -> str:
    """The helper's RollingUpdateRegistrarSocketFile: the first of `<driver>-<uid>-reg.sock`,
    `<driver>-<base64url(sha256(uid))[:8 bytes]>-reg.sock` and `dra-<base64url(sha256(driver NUL
    uid))[:16 bytes]>-reg.sock` whose full path fits a Unix socket (108 bytes with the NUL)."""
    uid_hash = hashlib.sha256(uid.encode()).digest()
    both_hash = hashlib.sha256(f"{driver}\x00{uid}".encode()).digest()
    candidates = (
        f"{driver}-{uid}-reg.sock",
        f"{driver}-{_b64(uid_hash[:8])}-reg.sock",
        f"dra-{_b64(both_hash[:16])}-reg.sock",
    )
    for name in candidates:
        if len(str(registry_dir / name)) <= MAX_SOCKET_PATH + 1:
            return name
    return candidates[-1]


def registration_socket(config: NodeConfig) -> Path:
    """`<registry dir>/<driver>-reg.sock`, or the rolling-update name."""
    directory = Path(os.path.abspath(config.kubelet_registry_dir))
    uid = config.dra_rolling_update_uid
    if uid:
        return directory / rolling_registration_name(directory, config.dra_driver_name, uid)
    return directory / f"{config.dra_driver_name}-reg.sock"


def dra_socket(config: NodeConfig) -> Path:
    """`<plugins dir>/<driver>/dra.sock`, or `dra-<uid>.sock` there with rolling updates."""
    directory = Path(os.path.abspath(config.dra_plugin_dir))
    uid = config.dra_rolling_update_uid
    return directory / (f"dra-{uid}.sock" if uid else DRA_SOCKET)


# --- servicers ----------------------------------------------------------------------------------------------


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """`pluginregistration.Registration`; `registered` says whether kubelet's last word was success."""

    def __init__(self, driver: str, endpoint: Path, on_status: Callable[[bool], None] | None = None) -> None:
        self._driver = driver
        self._endpoint = str(endpoint)
        self._on_status = on_status

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=self._endpoint,
            supported_versions=SUPPORTED_SERVICES,
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        if self._on_status is not None:
            self._on_status(request.plugin_registered)
        if not request.plugin_registered:
            log.error(
                "kubelet did not register DRA driver %s: %s", self._driver, request.error or "no reason given"
            )
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        log.info("kubelet registered DRA driver %s (endpoint %s)", self._driver, self._endpoint)
        return reg_pb2.RegistrationStatusResponse()


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class _PrepareCalls:
    """NodePrepareResources / NodeUnprepareResources of one API version over a `ClaimPreparer`: every
    claim of the request gets an entry; nothing but an unexpected bug fails the call."""

    def __init__(self, preparer: ClaimPreparer, pb: Any, share_ids: bool) -> None:
        self._preparer = preparer
        self._pb = pb
        self._share_ids = share_ids

    def prepare(self, request: Any) -> Any:
        refs = _refs(request.claims)
        try:
            outcomes = self._preparer.prepare(refs)
        except Exception as err:  # a bug: every claim gets the error, kubelet retries
            log.exception("NodePrepareResources failed")
            outcomes = {ref.uid: Outcome(error=f"internal error in hami-node: {err!r}") for ref in refs}
        response = self._pb.NodePrepareResourcesResponse()
        for ref in refs:
            outcome = outcomes[ref.uid]
            entry = response.claims[ref.uid]
            if outcome.claim is None:
                entry.error = outcome.error
                log.warning("NodePrepareResources: %s", outcome.error)
                continue
            for device in outcome.claim.devices:
                fields: dict[str, Any] = {
                    "request_names": [device.request],
                    "pool_name": outcome.claim.pool,
                    "device_name": device.device,
                    "cdi_device_ids": [device.cdi_id],
                }
                if self._share_ids and device.share_id is not None:
                    fields["share_id"] = device.share_id
                entry.devices.append(self._pb.Device(**fields))
        return response

    def unprepare(self, request: Any) -> Any:
        refs = _refs(request.claims)
        try:
            errors = self._preparer.unprepare(refs)
        except Exception as err:
            log.exception("NodeUnprepareResources failed")
            errors = {ref.uid: f"internal error in hami-node: {err!r}" for ref in refs}
        response = self._pb.NodeUnprepareResourcesResponse()
        for ref in refs:
            response.claims[ref.uid].error = errors.get(ref.uid, "")
        return response


class DRAPluginV1(v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        self._calls = _PrepareCalls(preparer, v1_pb2, share_ids=True)

    def NodePrepareResources(
        self, request: v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1_pb2.NodePrepareResourcesResponse:
        response: v1_pb2.NodePrepareResourcesResponse = self._calls.prepare(request)
        return response

    def NodeUnprepareResources(
        self, request: v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1_pb2.NodeUnprepareResourcesResponse:
        response: v1_pb2.NodeUnprepareResourcesResponse = self._calls.unprepare(request)
        return response


class DRAPluginV1beta1(v1beta1_grpc.DRAPluginServicer):
    """The same calls for 1.32/1.33 kubelets; v1beta1 has no share IDs."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._calls = _PrepareCalls(preparer, v1beta1_pb2, share_ids=False)

    def NodePrepareResources(
        self, request: v1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1_pb2.NodePrepareResourcesResponse:
        response: v1beta1_pb2.NodePrepareResourcesResponse = self._calls.prepare(request)
        return response

    def NodeUnprepareResources(
        self, request: v1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1_pb2.NodeUnprepareResourcesResponse:
        response: v1beta1_pb2.NodeUnprepareResourcesResponse = self._calls.unprepare(request)
        return response


Partitions = Callable[[GPUStatus], Sequence[str]]
"""The names of a GPU's published MIG partitions (`SlicePublisher.partitions`): empty for a GPU out of
MIG mode."""


def health_response(
    gpus: tuple[GPUStatus, ...],
    pool: str,
    now_s: int,
    timeout_s: int,
    partitions: Partitions | None = None,
) -> health_pb2.NodeWatchResourcesResponse:
    """The full device list with each GPU's health (the reason, as its slice taint says it); a GPU in
    MIG mode is listed as its partitions, each with the GPU's health."""
    devices = []
    for gpu in gpus:
        reason = taint_value(gpu)
        names = list(partitions(gpu)) if partitions is not None and gpu.info.mig_enabled else []
        for name in names or [device_name(gpu.info.minor)]:
            devices.append(
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=name),
                    health=health_pb2.HEALTHY if reason is None else health_pb2.UNHEALTHY,
                    last_updated_time=now_s,
                    health_check_timeout_seconds=timeout_s,
                    message=reason or "",
                )
            )
    return health_pb2.NodeWatchResourcesResponse(devices=devices)


class HealthServicer(health_grpc.DRAResourceHealthServicer):
    """`v1alpha1.DRAResourceHealth`: see the module docstring. `now` is the wall clock."""

    def __init__(
        self,
        state: DeviceState,
        pool: str,
        *,
        resend_s: float = 10.0,
        now: Callable[[], float] = time.time,
        partitions: Partitions | None = None,
    ) -> None:
        self._state = state
        self._pool = pool
        self._resend_s = resend_s
        self._now = now
        self._partitions = partitions
        self.streams = StateStreams(state)

    def shutdown(self) -> None:
        """End every stream now (they return normally)."""
        self.streams.shutdown()

    def fresh(self) -> HealthServicer:
        """A servicer like this one with no stream ended: a stopped one ends its streams for good."""
        return HealthServicer(
            self._state, self._pool, resend_s=self._resend_s, now=self._now, partitions=self._partitions
        )

    def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.NodeWatchResourcesResponse]:
        timeout = max(1, int(3 * self._resend_s))
        sent: int | None = None
        sent_at = 0.0
        for version, gpus in self.streams.follow(context, self._resend_s):
            now = self._now()
            if version != sent or now - sent_at >= self._resend_s:
                yield health_response(gpus, self._pool, int(now), timeout, self._partitions)
                sent, sent_at = version, now


# --- serving both sockets --------------------------------------------------------------------------------


@dataclass
class _Served:
    name: str
    path: Path
    add_services: Callable[[grpc.Server], None]
    server: grpc.Server | None = None
    identity: SocketIdentity | None = None


class DraPluginServers:
    """Serves the DRA socket (first: kubelet may dial it as soon as it sees the registration socket)
    and the registration socket, and serves a socket again when it is removed; see the module
    docstring. `start()` raises `DraServerError`; `stop()` removes both sockets."""

    def __init__(
        self,
        config: NodeConfig,
        state: DeviceState,
        preparer: ClaimPreparer,
        *,
        observer_factory: Callable[[], BaseObserver] = Observer,
        max_workers: int = 8,
        health_resend_s: float = 10.0,
        fallback_poll_s: float = 10.0,
        stop_grace_s: float = 0.5,
        partitions: Partitions | None = None,
    ) -> None:
        self.preparer = preparer
        self.registration_socket = registration_socket(config)
        self.dra_socket = dra_socket(config)
        self.health = HealthServicer(state, config.node_name, resend_s=health_resend_s, partitions=partitions)
        self.registration = RegistrationServicer(config.dra_driver_name, self.dra_socket, self._status)
        v1 = DRAPluginV1(preparer)
        v1beta1 = DRAPluginV1beta1(preparer)

        def dra_services(server: grpc.Server) -> None:
            v1_grpc.add_DRAPluginServicer_to_server(v1, server)
            v1beta1_grpc.add_DRAPluginServicer_to_server(v1beta1, server)
            health_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)

        self._served = (
            _Served("DRA", self.dra_socket, dra_services),
            _Served(
                "registration",
                self.registration_socket,
                lambda server: reg_grpc.add_RegistrationServicer_to_server(self.registration, server),
            ),
        )
        self._max_workers = max_workers
        self._fallback_poll_s = fallback_poll_s
        self._stop_grace_s = stop_grace_s
        self._observer_factory = observer_factory
        self._observer: BaseObserver | None = None
        self._watches: dict[str, tuple[ObservedWatch, tuple[int, int]]] = {}
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._registered = False
        self._registrations = 0
        self._restarts = 0

    # --- public -------------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return all(s.server is not None for s in self._served)

    @property
    def registered(self) -> bool:
        """kubelet's last NotifyRegistrationStatus said registered (reset when a socket is served anew)."""
        with self._cond:
            return self._registered

    @property
    def registrations(self) -> int:
        with self._cond:
            return self._registrations

    @property
    def restarts(self) -> int:
        """How many times a socket was served again after it went missing."""
        with self._cond:
            return self._restarts

    def wait_registered(self, after: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._registrations > after, timeout_s)

    def wait_restarts(self, after: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._restarts > after, timeout_s)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("DRA plugin servers already started")
        try:
            for served in self._served:
                self._serve(served)
        except DraServerError:
            self._stop_servers()
            raise
        observer = self._observer_factory()
        observer.daemon = True
        self._observer = observer
        self._schedule_watches()
        observer.start()
        self._thread = threading.Thread(target=self._run, name="hami-dra-sockets", daemon=True)
        self._thread.start()

    def request_restart(self, reason: str = "restart requested (SIGHUP)") -> None:
        """Serve both sockets anew (kubelet deregisters and registers the plugin again). Safe from a signal
        handler: it only puts a message on a reentrant queue."""
        self._inbox.put(f"restart:{reason}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (health streams end first), remove both sockets, stop watching. Idempotent."""
        self._inbox.put("stop")
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            if observer.is_alive():
                observer.join(timeout_s)
        self._stop_servers()

    # --- internals --------------------------------------------------------------------------------------

    def _status(self, registered: bool) -> None:
        with self._cond:
            self._registered = registered
            if registered:
                self._registrations += 1
            self._cond.notify_all()

    def _serve(self, served: _Served) -> None:
        served.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            served.server, served.identity = start_unix_server(
                served.path, served.add_services, max_workers=self._max_workers, thread_name_prefix="hami-dra"
            )
        except UnixServerError as err:
            raise DraServerError(f"DRA plugin ({served.name} socket): {err}") from None
        log.info("DRA plugin serving its %s socket %s", served.name, served.path)

    def _stop_one(self, served: _Served) -> None:
        server, served.server = served.server, None
        if server is None:
            return
        if served.name == "DRA":
            self.health.shutdown()
        server.stop(self._stop_grace_s).wait(self._stop_grace_s + 5.0)
        remove_own_socket(served.path, served.identity)

    def _stop_servers(self) -> None:
        for served in reversed(self._served):
            self._stop_one(served)
        with self._cond:
            self._registered = False

    def _run(self) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=self._fallback_poll_s)
            except queue.Empty:
                item = "poll"
            if item == "stop":
                return
            try:
                if item.startswith("restart:"):
                    log.info("DRA plugin restart: %s", item.removeprefix("restart:"))
                    self._stop_servers()
                self._schedule_watches()
                self._check()
            except Exception:
                log.exception("DRA plugin socket watch: unexpected error")

    def _check(self) -> None:
        """Serve again every socket that is gone or is no longer the file we bound."""
        for served in self._served:
            if served.server is not None and socket_identity(served.path) == served.identity:
                continue
            if served.server is not None:
                log.warning("DRA plugin: %s socket %s is gone; serving it again", served.name, served.path)
            with contextlib.suppress(Exception):
                self._stop_one(served)
            if served.name == "registration":
                with self._cond:
                    self._registered = False
            else:
                self.health = self.health.fresh()  # the add_services closure reads `self.health`
            try:
                self._serve(served)
            except DraServerError as err:
                log.error("%s (retrying in %.0f s)", err, self._fallback_poll_s)
                continue
            with self._cond:
                self._restarts += 1
                self._cond.notify_all()

    def _schedule_watches(self) -> None:
        observer = self._observer
        if observer is None:
            return
        handler = _SocketDirHandler(self._inbox)
        for served in self._served:
            for directory in (served.path.parent, served.path.parent.parent):
                key = str(directory)
                identity = _dir_identity(directory)
                old = self._watches.get(key)
                if old is not None and old[1] == identity:
                    continue
                if old is not None:  # the directory was made anew: an inotify watch dies with its directory
                    with contextlib.suppress(KeyError):
                        observer.unschedule(old[0])
                    del self._watches[key]
                if identity is None:
                    continue
                try:
                    watch = observer.schedule(handler, key, event_filter=list(_WATCHED_EVENTS))
                    self._watches[key] = (watch, identity)
                except OSError as err:
                    log.warning("cannot watch %s: %s", directory, err)


def _dir_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory: a directory made anew differs (its ctime changes with every entry,
    so it is left out)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


_WATCHED_EVENTS = (FileDeletedEvent, DirDeletedEvent, FileMovedEvent, DirMovedEvent, DirCreatedEvent)
"""What `_SocketDirHandler` acts on. Passed to the observer, which asks inotify for these alone
(IN_DELETE, IN_MOVE, IN_CREATE): the opens, closes, writes and attribute changes of the files in the
plugin directory (the lock file, a spec written by another plugin) no longer wake watchdog's threads."""


class _SocketDirHandler(FileSystemEventHandler):
    """Any deletion or move in a watched directory: look at the sockets (cheap stats)."""

    def __init__(self, inbox: queue.SimpleQueue[str]) -> None:
        self._inbox = inbox

    def on_deleted(self, event: FileSystemEvent) -> None:
        self._inbox.put("changed")

    def on_moved(self, event: FileSystemEvent) -> None:
        self._inbox.put("changed")

    def on_created(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            self._inbox.put("changed")


__all__ = [
    "DRA_SOCKET",
    "HEALTH_SERVICE",
    "PLUGIN_TYPE",
    "SUPPORTED_SERVICES",
    "V1BETA1_SERVICE",
    "V1_SERVICE",
    "DRAPluginV1",
    "DRAPluginV1beta1",
    "DraPluginServers",
    "DraServerError",
    "HealthServicer",
    "Partitions",
    "RegistrationServicer",
    "dra_socket",
    "health_response",
    "registration_socket",
    "rolling_registration_name",
]
