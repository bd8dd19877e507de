"""The kubelet Device Plugin v1beta1 service for HAMi's virtual devices, on a sync `grpc.server`.

- GetDevicePluginOptions: `plugin_options()` (no PreStartContainer; GetPreferredAllocation offered).
- ListAndWatch: the full device list first (`DeviceState.virtual_devices`: split count x GPUs, IDs
  `<GPU-UUID>-<i>`, NUMA when enabled), then the full list again on every change of it. The stream
  ends when the client goes away or the server stops (`PluginServer.stop` ends it before the gRPC
  server shuts down, so kubelet sees the old stream end before we register again).
- GetPreferredAllocation: steers kubelet to IDs on the GPUs the scheduler chose for the container kubelet
  is admitting (`PodSource.admitting`), else spreads (`allocation.preferred_allocation`); what it found
  is kept for the Allocate kubelet sends next for the devices it answered (`_remember`).
- Allocate: per container request, the pending pod from `PodSource.match` (what the GetPreferredAllocation
  just before found, else a lookup: the watch's cache, kubelet's PodResources list when read; on a
  miss one read of the node's pods, never a wait), the GPUs the container really gets from
  `allocation.grant_container` (kubelet's devices must be on the GPUs the scheduler accounted, or on
  other GPUs of the pod within its footprint), HAMi's response from `allocation.container_allocate_
  response` with a fresh random (version 4) UUID as its cache id, the container's cache directory
  created on the host, then `PodSource.allocated`. Any failure: `PodSource.failed(pod, reason)` (a GPU
  mismatch also gets a Warning Event `AllocateGPUMismatch`) and the RPC fails with UNKNOWN and a
  message naming what went wrong and the pod (kubelet shows it in the pod's status).
  In operating mode mig (HAMi v2.10's dynamic MIG, `MigSupport`), the container's reservations in
  `hami.io/vgpu-mig-allocations` are created as MIG instances (`mig_manager.MigManager`), their
  runtime identity patched onto the pod, and the answer is `NVIDIA_VISIBLE_DEVICES=MIG-...` with no
  HAMi-core envs or mounts.
  IDs containing "MIG" get a plain NVIDIA answer (`NVIDIA_VISIBLE_DEVICES` = the IDs), as HAMi does;
  this daemon never advertises such IDs, so only a stale kubelet checkpoint could send one.
- PreStartContainer: empty (not required).
Model: Allocate is modelled in `hami_control/protocol_model.py` (`kubelet-admit`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hami_api.mig_alloc import decode_mig_allocations, encode_mig_allocations
from hami_api.resources import pod_container_names, pod_containers
from hami_api.types import ContainerAllocation
from hami_kube.errors import KubeApiError
from hami_node.allocation import (
    REASON_GPU_MISMATCH,
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerResponse,
    DeviceMismatchError,
    PendingPod,
    PodMatch,
    PreferredAllocationError,
    container_allocate_response,
    container_cache_dir,
    grant_container,
    mig_container_response,
    preferred_allocation,
    to_proto,
    virtual_devices_to_proto,
)
from hami_node.config import NodeConfig
from hami_node.devices import DeviceState, StateStreams
from hami_node.mig_manager import (
    MigAllocateError,
    MigManager,
    MigReconciler,
    container_mig_allocations,
    mig_annotation,
    with_runtime_identity,
)
from hami_node.mps import daemon_started
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.pods import MigPodApi, record_mig_identity
from hami_node.ports import AllocatedContainer, PluginObserver, PodSource
from hami_node.unixgrpc import SocketIdentity, UnixServerError, remove_own_socket, start_unix_server

log = logging.getLogger(__name__)

ADMISSION_TTL_S = 5.0
"""How long what a GetPreferredAllocation found waits for its Allocate (kubelet sends it at once)."""

TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"
"""HAMi-core's priority variable, which the webhook sets from `nvidia.com/priority` (HAMi's
`MutateAdmission`)."""


_IDS = random.Random()
"""Seeded from the OS once: a cache id needs to be unique on the node, not unguessable (HAMi's uuid.New
reads the OS's random source for each; here that read cost a syscall per Allocate)."""


def new_cache_id() -> str:
    """A random (version 4) UUID string, HAMi-core's `<id>.cache` name."""
    return str(uuid.UUID(int=_IDS.getrandbits(128), version=4))


def plugin_options() -> api_pb2.DevicePluginOptions:
    """What GetDevicePluginOptions answers and RegisterRequest.options carries (the same values)."""
    return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


@dataclass(frozen=True, slots=True)
class MigSupport:
    """What Allocate needs in operating mode mig (HAMi's dynamic MIG): the instance manager, the API
    calls that record the runtime identity on the pod, and the reconciler (one round before a retry)."""

    manager: MigManager
    api: MigPodApi
    reconciler: MigReconciler | None = None


class PluginServerError(UnixServerError):
    """The plugin's gRPC server cannot serve (e.g. its socket cannot be bound)."""


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service. `new_id` makes the containers' cache ids (a uuid4 string each);
    `observer` hears of Allocates, allocated containers and ListAndWatch updates (metrics)."""

    def __init__(
        self,
        state: DeviceState,
        pods: PodSource,
        config: NodeConfig,
        *,
        new_id: Callable[[], str] = new_cache_id,
        observer: PluginObserver | None = None,
        mig: MigSupport | None = None,
    ) -> None:
        self._state = state
        self._pods = pods
        self._config = config
        self._mig = mig
        self._new_id = new_id
        self._observer = observer
        self.streams = StateStreams(state)
        """The ListAndWatch streams."""
        self._admission_lock = threading.Lock()
        self._admission: tuple[frozenset[str], PodMatch, float] | None = None
        """(devices answered, the container found, when) of the last GetPreferredAllocation."""

    def shutdown(self) -> None:
        """End every ListAndWatch stream now (they return normally) and refuse new ones."""
        self.streams.shutdown()

    # --- RPCs -------------------------------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return plugin_options()

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent = None
        for _, gpus in self.streams.follow(context):
            devices = self._state.virtual_devices(gpus)
            if devices != sent:
                healthy = sum(1 for d in devices if d.healthy)
                log.debug("ListAndWatch: %d devices (%d healthy)", len(devices), healthy)
                if self._observer is not None:
                    self._observer.list_and_watch_sent()
                yield api_pb2.ListAndWatchResponse(devices=virtual_devices_to_proto(devices))
                sent = devices

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        listed = [d.id for d in self._state.virtual_devices()]
        responses = []
        for container in request.container_requests:
            size = container.allocation_size
            try:
                admitting = self._pods.admitting(size)
            except Exception:  # steering is a preference: without it, spread
                log.exception("GetPreferredAllocation: finding the pending pod's GPUs failed")
                admitting = None
            desired = admitting.container.uuids if admitting is not None else ()
            try:
                chosen = preferred_allocation(
                    list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs),
                    size,
                    desired,
                    listed,
                )
            except PreferredAllocationError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"GetPreferredAllocation: {err}")
            if len(request.container_requests) == 1:
                self._remember(chosen, admitting)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def _remember(self, chosen: Sequence[str], admitting: PodMatch | None) -> None:
        """Keep what a GetPreferredAllocation found for the Allocate kubelet sends next: kubelet's
        devicesToAllocate asks for the preference and then calls Allocate with the devices it chose,
        nothing in between (pkg/kubelet/cm/devicemanager/manager.go `allocateContainerResources`)."""
        with self._admission_lock:
            self._admission = None if admitting is None else (frozenset(chosen), admitting, time.monotonic())

    def _admitted(self, ids: Sequence[str]) -> PodMatch | None:
        """The container the last GetPreferredAllocation found, when kubelet now allocates exactly the
        devices it answered (in any order: kubelet sends a Go set's keys) within `ADMISSION_TTL_S`;
        taken once."""
        with self._admission_lock:
            admission, self._admission = self._admission, None
        if admission is None:
            return None
        chosen, match, at = admission
        if chosen != frozenset(ids) or time.monotonic() - at > ADMISSION_TTL_S:
            return None
        return match

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        started = time.monotonic()
        ok = False
        try:
            response = self._allocate(request, context)
            ok = True
            return response
        finally:
            if self._observer is not None:
                self._observer.allocate_done(time.monotonic() - started, ok)

    def _allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            if not ids:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "Allocate: a container request with no devices"
                )
            if any("MIG" in device_id for device_id in ids):
                log.warning("Allocate: MIG device IDs %s: plain NVIDIA response (as HAMi)", ids)
                responses.append(api_pb2.ContainerAllocateResponse(envs={VISIBLE_DEVICES_ENV: ",".join(ids)}))
                continue
            admitted = self._admitted(ids) if len(request.container_requests) == 1 else None
            result = self._allocate_container(ids, admitted)
            if isinstance(result, str):
                context.abort(grpc.StatusCode.UNKNOWN, result)
            responses.append(result)
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    # --- Allocate, one container -------------------------------------------------------------------

    def _allocate_container(
        self, ids: Sequence[str], admitted: PodMatch | None = None
    ) -> api_pb2.ContainerAllocateResponse | str:
        """The container's response, or the message to fail Allocate with (the pod is reported).
        `admitted`: the container its GetPreferredAllocation found (`PodSource.match`)."""
        pod: PendingPod | None = None
        event_reason = ""
        try:
            match = self._pods.match(len(ids), admitted)
            pod = match.pod
            pod_object = self._pods.pod_object(pod)
            license_file = posixpath.join(self._config.hook_path, "vgpu", "license")
            gpus = self._state.gpus()
            granted = grant_container(pod_object, pod, match.entry, ids, gpus=gpus)
            if self._mig is not None:
                response = self._mig_response(pod, pod_object, match.entry, granted)
                self._pods.allocated(match, granted)
                log.info("Allocate: pod %s entry %d: MIG %s", pod.key, match.entry, response.envs)
                return to_proto(response)
            cache_id = self._new_id()
            response = container_allocate_response(
                pod_object,
                pod.with_allocated(match.entry, granted).current,
                match.entry,
                ids,
                gpus=gpus,
                config=self._config,
                cache_id=cache_id,
                license_present=os.path.exists(license_file),
                mps_started=daemon_started(self._config.mps_root, self._config.resource_name),
            )
            cache_dir = self._make_cache_dir(pod_object, match.entry)
            self._pods.allocated(match, granted)
            if self._observer is not None:
                self._observer.container_allocated(
                    AllocatedContainer(
                        pod.uid,
                        pod_container_names(pod_object)[match.entry],
                        cache_dir,
                        posixpath.join(cache_dir, f"{cache_id}.cache"),
                        tuple((s.uuid, s.usedmem, s.usedcores) for s in granted),
                        _task_priority(pod_object, match.entry),
                    )
                )
        except DeviceMismatchError as err:
            message, event_reason = err.message, REASON_GPU_MISMATCH
        except AllocationError as err:
            message = err.message
        except MigAllocateError as err:
            message = f"pod {pod.key if pod is not None else '?'}: {err}"
        except KubeApiError as err:
            message = f"pod {pod.key if pod is not None else '?'}: record MIG runtime placement: {err}"
        except OSError as err:
            where = pod.key if pod is not None else "?"
            message = f"pod {where}: cannot create the container's cache directory: {err}"
        except Exception as err:
            log.exception("Allocate %s: unexpected error", ids)
            where = f"pod {pod.key}" if pod is not None else "no pod matched yet"
            message = f"{where}: internal error in hami-node Allocate: {err!r}"
        else:
            log.info(
                "Allocate: pod %s entry %d: %s",
                match.pod.key,
                match.entry,
                ", ".join(f"{s.uuid} {s.usedmem}MiB {s.usedcores}%" for s in granted),
            )
            return to_proto(response)
        log.warning("Allocate %s failed: %s", list(ids), message)
        try:
            self._pods.failed(pod, message, event_reason)
        except Exception:
            log.exception("reporting the failed allocation of %s", pod.key if pod else "a pod")
        return message

    def _mig_response(
        self, pod: PendingPod, pod_object: dict[str, object], entry: int, granted: ContainerAllocation
    ) -> ContainerResponse:
        """HAMi's dynamic MIG (util.go GetContainerDeviceStrArray, server.go annotateMigRuntimeInfo):
        the container's reservations, each instance ensured (on a refusal, one reconcile round with
        this node's pods and one more try: an instance of a pod deleted since the last round may
        still hold the placement), the runtime identity patched onto the pod, and the MIG UUIDs
        answered. Whatever this call created is destroyed again when a later step fails."""
        mig = self._mig
        assert mig is not None
        allocations = container_mig_allocations(pod_object, entry, len(granted))
        for allocation, chosen in zip(allocations, granted, strict=True):
            if allocation.gpu_uuid != chosen.uuid:
                raise MigAllocateError(
                    f"MIG reservation GPU {allocation.gpu_uuid} does not match allocated GPU {chosen.uuid}"
                )
        before = set(mig.manager.managed())
        try:
            instances = mig.manager.ensure_container(allocations)
        except MigAllocateError:
            if mig.reconciler is None:
                raise
            mig.reconciler.reconcile_once()
            before = set(mig.manager.managed())
            instances = mig.manager.ensure_container(allocations)
        created = [inst for inst in instances if inst.key not in before]

        def identify(current: Mapping[str, Any]) -> str:
            decoded = decode_mig_allocations(mig_annotation(current))
            return encode_mig_allocations(with_runtime_identity(decoded, mig.manager.runtime))

        try:
            record_mig_identity(mig.api, pod_object, identify)
        except BaseException:
            mig.manager.rollback(created)
            raise
        log.debug("pod %s: MIG instances %s", pod.key, [i.mig_uuid for i in instances])
        return mig_container_response([inst.mig_uuid for inst in instances], self._config)

    def _make_cache_dir(self, pod_object: dict[str, object], entry: int) -> str:
        """HAMi's per-container directory mounted at `<hook>/vgpu`, mode 0777; returns its path."""
        meta = pod_object.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        name = pod_container_names(pod_object)[entry]
        path = container_cache_dir(self._config, uid if isinstance(uid, str) else "", name)
        try:
            os.mkdir(path)  # its parent is there but for the node's first container
        except FileNotFoundError:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            pass
        os.chmod(path, 0o777)
        return path


def _task_priority(pod_object: dict[str, object], entry: int) -> int | None:
    """The container's `CUDA_TASK_PRIORITY` (a literal env value), None when unset or not a number."""
    container, _init = pod_containers(pod_object)[entry]
    for env in container.get("env") or ():
        if isinstance(env, dict) and env.get("name") == TASK_PRIORITY_ENV:
            try:
                return int(str(env.get("value")))
            except ValueError:
                return None
    return None


class PluginServer:
    """The DevicePlugin service on `unix://<kubelet_dir>/<socket_name>`. One use: `start()`, then
    `stop()` (which ends ListAndWatch streams first and removes the socket); make a new one to serve
    again."""

    def __init__(
        self,
        config: NodeConfig,
        state: DeviceState,
        pods: PodSource,
        *,
        max_workers: int = 8,
        new_id: Callable[[], str] = new_cache_id,
        observer: PluginObserver | None = None,
        mig: MigSupport | None = None,
    ) -> None:
        self._config = config
        self._socket_path = config.socket_path
        self.servicer = DevicePluginServicer(state, pods, config, new_id=new_id, observer=observer, mig=mig)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._identity: SocketIdentity | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Bind the socket (a stale file there is replaced) and serve. Raises `PluginServerError`."""
        if self._server is not None:
            raise RuntimeError("plugin server already started")
        try:
            self._server, self._identity = start_unix_server(
                self._socket_path,
                lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server),
                max_workers=self._max_workers,
                thread_name_prefix="hami-dp",
            )
        except UnixServerError as err:
            raise PluginServerError(str(err)) from None
        log.info("device plugin serving on %s", self._socket_path)

    def stop(self, grace_s: float = 0.5) -> None:
        """End the ListAndWatch streams, stop the server (in-flight RPCs get `grace_s`), remove the
        socket. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        self.servicer.shutdown()
        server.stop(grace_s).wait(grace_s + 5.0)
        self._remove_socket()
        log.info("device plugin on %s stopped", self._socket_path)

    def _remove_socket(self) -> None:
        """Remove our socket if it is still there (never a socket someone else bound since)."""
        remove_own_socket(self._socket_path, self._identity)


__all__ = [
    "DevicePluginServicer",
    "MigSupport",
    "PluginServer",
    "PluginServerError",
    "new_cache_id",
    "plugin_options",
]
