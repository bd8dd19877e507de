"""hami-node in NVIDIA's modes: the device plugins NVIDIA's k8s-device-plugin (v0.20.0) serves for its
config file v1: one plugin per served resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`,
`nvidia.com/gpu.shared`, ...), each on its own socket (`nvidia-gpu.sock`, `nvidia-mig-1g.5gb.sock`,
`nvidia-gpu.shared.sock`; `internal/plugin/server.go` getPluginSocketPath).

In these modes pods go through kube-scheduler alone: no webhook, no extender, no pod annotation. So:

- ListAndWatch lists the resource's devices (`device_map.build_device_map`: whole GPUs, MIG devices by
  strategy, time-slicing / MPS replicas `<uuid>::<n>`), each healthy as its GPU is in the node daemon's
  `DeviceState` (a GPU's fault, or the node's NVML fencing, fans out to its replicas and MIG devices,
  `device_map.with_health`); the list again on every change.
- GetPreferredAllocation: NVIDIA's greedy policy (distributed or packed, `replicas.preferred_allocation`)
  for replicas and MIG devices; for whole GPUs gpuallocator's best-effort, NVLink-aligned set
  (`replicas.aligned_allocation`, `aligned.best_effort_allocate`) from the GPUs' pair scores.
- Allocate answers from kubelet's device IDs alone, as NVIDIA's plugin does (`server.go` Allocate:
  ValidateRequest, then getAllocateResponse): NVIDIA_VISIBLE_DEVICES with the GPUs' or MIG devices'
  UUIDs (or indexes), CDI, device specs; an invalid request fails with NVIDIA's text, which kubelet
  shows as the pod's UnexpectedAdmissionError. With sharing.mps, the MPS pipe and shm mounts of
  `hami_node.mps`.

`adapt_devices` reads the GPUs' MIG layout from the GPU backend (`mig_profiles`, `mig_devices`) once at
start, as NVIDIA's plugin does (it rebuilds on restart).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import grpc

from hami_node.allocation import ContainerResponse, Mount, to_proto
from hami_node.cdi import CdiError
from hami_node.devices import DeviceState, GPUStatus, StateStreams
from hami_node.gpu.backend import GPUBackend, GPUBackendError, MigDevice, PhysicalGPU
from hami_node.mps import CONTAINER_ROOT, CONTAINER_SHM, PIPE_DIRECTORY_ENV, pipe_dir, shm_dir
from hami_node.nvidia.aligned import PairScore
from hami_node.nvidia.cdi import MigMinors, mig_capability_paths
from hami_node.nvidia.config import PluginConfig, SharingStrategy
from hami_node.nvidia.device_map import (
    Device,
    DeviceMap,
    MigAttributes,
    NvidiaDevice,
    build_device_map,
    plugin_socket_name,
    served_resources,
    with_health,
)
from hami_node.nvidia.labels import Labels, node_labels
from hami_node.nvidia.replicas import (
    InvalidRequest,
    PreferredAllocationError,
    aligned_allocation,
    allocate_error,
    container_allocate_response,
    preferred_allocation,
    uses_aligned_allocation,
    validate_request,
)
from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.api.constants import HEALTHY, UNHEALTHY
from hami_node.plugin.server import PluginServerError
from hami_node.ports import PluginObserver
from hami_node.unixgrpc import SocketIdentity, UnixServerError, remove_own_socket, start_unix_server

log = logging.getLogger(__name__)

LABEL_FAMILIES = ("nvidia.com/gpu.", "nvidia.com/mig", "nvidia.com/mps.")
"""The label prefixes `labels.node_labels` writes (GFD's resource labeler); the others GFD writes (CUDA,
driver) are left alone."""


# --- the backend's GPUs and MIG devices as NVIDIA's devices ----------------------------------------------


def _mig_device(gpu: PhysicalGPU, mig: MigDevice, minors: MigMinors | None) -> NvidiaDevice:
    a = mig.attributes
    try:
        caps = mig_capability_paths(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id, minors)
    except (CdiError, ValueError) as err:
        raise GPUBackendError(f"GPU {gpu.uuid} MIG device {mig.uuid}: {err}") from None
    return NvidiaDevice(
        uuid=mig.uuid,
        index=gpu.index,
        product_name=gpu.model,
        memory_mib=mig.memory_mib,
        minor=gpu.minor,
        parent_uuid=gpu.uuid,
        mig_index=mig.index,
        mig_profile=mig.profile,
        mig_attributes=MigAttributes(
            memory_mib=a.memory_mib,
            multiprocessors=a.multiprocessors,
            gi_slices=a.gi_slices,
            ci_slices=a.ci_slices,
            copy_engines=a.copy_engines,
            decoders=a.decoders,
            encoders=a.encoders,
            jpeg_engines=a.jpeg_engines,
            ofa_engines=a.ofa_engines,
        ),
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
        mig_capable=True,
        mig_enabled=False,
        healthy=gpu.healthy,
        numa_node=gpu.numa_node,
        paths=(f"/dev/nvidia{gpu.minor}", *caps),
    )


def adapt_devices(
    backend: GPUBackend, gpus: Sequence[PhysicalGPU], mig_minors: MigMinors | None = None
) -> list[NvidiaDevice]:
    """The GPUs (and, for those in MIG mode, their MIG devices) as `NvidiaDevice`s. A GPU is MIG capable
    when its backend knows MIG profiles for it. A MIG device's paths are its parent's node and its GPU and
    compute instance capability nodes (nvml_devices.go `nvmlMigDevice.GetPaths`), their minors from the
    driver's mig-minors file (`mig_minors`, `hami_node.nvidia.cdi.read_mig_minors`) or, without it, the
    driver's fixed layout. Raises `GPUBackendError` when the MIG layout of a GPU in MIG mode cannot be
    read or a capability minor is missing."""
    out: list[NvidiaDevice] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        try:
            capable = bool(backend.mig_profiles(gpu.uuid))
        except GPUBackendError:
            capable = False
        out.append(
            NvidiaDevice(
                uuid=gpu.uuid,
                index=gpu.index,
                product_name=gpu.model,
                memory_mib=gpu.memory_mib,
                minor=gpu.minor,
                mig_capable=capable or gpu.mig_enabled,
                mig_enabled=gpu.mig_enabled,
                healthy=gpu.healthy,
                numa_node=gpu.numa_node,
                paths=(f"/dev/nvidia{gpu.minor}",),
            )
        )
        if gpu.mig_enabled:
            out.extend(_mig_device(gpu, m, mig_minors) for m in backend.mig_devices(gpu.uuid))
    return out


class NvidiaDevices:
    """The node's NVIDIA resources: the device map built once from the devices and the plugin config
    (raises `device_map.DeviceMapError` with NVIDIA's texts), and each resource's devices with their
    health from the node daemon's GPUs."""

    def __init__(
        self,
        config: PluginConfig,
        devices: Sequence[NvidiaDevice],
        pair_score: PairScore = lambda _a, _b: 0,
    ) -> None:
        self.config = config
        self.devices = tuple(devices)
        self.pair_score = pair_score
        """The GPUs' pair scores for the aligned allocation of whole GPUs (`aligned.pair_scorer`)."""
        self.map: DeviceMap = build_device_map(devices, config.flags.mig_strategy, config.sharing.replicated)
        self._gpu_uuids = frozenset(d.uuid for d in devices if not d.is_mig)

    @property
    def resources(self) -> tuple[str, ...]:
        """The resources a plugin is started for (those with devices)."""
        return served_resources(self.map)

    def by_id(self, resource: str) -> dict[str, Device]:
        return {d.id: d for d in self.map.get(resource, ())}

    def with_health(self, resource: str, gpus: Sequence[GPUStatus]) -> tuple[Device, ...]:
        """The resource's devices, unhealthy where their GPU is unhealthy or no longer listed."""
        healthy = {g.uuid for g in gpus if g.healthy}
        bad = self._gpu_uuids - healthy
        return with_health(self.map, bad).get(resource, ())

    def labels(self) -> tuple[Labels, tuple[str, ...]]:
        """GPU feature discovery's labels for these devices (`labels.node_labels`) and its warnings."""
        return node_labels(self.devices, self.config.flags.mig_strategy, self.config.sharing)


def devices_to_proto(devices: Sequence[Device]) -> list[api_pb2.Device]:
    """ListAndWatch's list (`Devices.GetPluginDevices`): ID, health, NUMA node when known."""
    out = []
    for d in devices:
        device = api_pb2.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
        if d.numa_node is not None:
            device.topology.nodes.append(api_pb2.NUMANode(ID=d.numa_node))
        out.append(device)
    return out


def mps_response(response: ContainerResponse, mps_root: str, resource: str) -> ContainerResponse:
    """NVIDIA's MPS additions (`internal/plugin/server.go` updateResponseForMPS): the daemon's pipe
    directory and /dev/shm mounted, CUDA_MPS_PIPE_DIRECTORY set."""
    container_pipe = pipe_dir(CONTAINER_ROOT, resource)
    mounts = (
        *response.mounts,
        Mount(container_pipe, pipe_dir(mps_root, resource), False),
        Mount(CONTAINER_SHM, shm_dir(mps_root), False),
    )
    envs = {**response.envs, PIPE_DIRECTORY_ENV: container_pipe}
    return ContainerResponse(envs, mounts, response.annotations, response.cdi_devices)


# --- the servicer --------------------------------------------------------------------------------------


class NvidiaPluginServicer(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service of one NVIDIA resource; see the module docstring."""

    def __init__(
        self,
        resource: str,
        devices: NvidiaDevices,
        state: DeviceState,
        *,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        node_exists: Callable[[str], bool] = lambda _path: False,
        observer: PluginObserver | None = None,
    ) -> None:
        self.resource = resource
        self._devices = devices
        self._state = state
        self._config = devices.config
        self._new_id = new_id
        self._node_exists = node_exists
        self._observer = observer
        self.streams = StateStreams(state)

    def shutdown(self) -> None:
        self.streams.shutdown()

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        # NVIDIA's plugin offers GetPreferredAllocation for every resource (server.go).
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent: tuple[Device, ...] | None = None
        for _, gpus in self.streams.follow(context):
            devices = self._devices.with_health(self.resource, gpus)
            if devices != sent:
                if self._observer is not None:
                    self._observer.list_and_watch_sent()
                yield api_pb2.ListAndWatchResponse(devices=devices_to_proto(devices))
                sent = devices

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        devices = self._devices.map.get(self.resource, ())
        policy = self._config.flags.shared_devices_allocation_policy
        responses = []
        for container in request.container_requests:
            available = list(container.available_deviceIDs)
            required = list(container.must_include_deviceIDs)
            try:
                if uses_aligned_allocation(devices, available):
                    chosen = aligned_allocation(
                        devices, available, required, container.allocation_size, self._devices.pair_score
                    )
                else:
                    chosen = preferred_allocation(
                        devices, available, required, container.allocation_size, policy
                    )
            except PreferredAllocationError as err:
                context.abort(grpc.StatusCode.UNKNOWN, str(err))
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(chosen)))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        started = time.monotonic()
        ok = False
        try:
            responses = []
            for container in request.container_requests:
                result = self.allocate_container(list(container.devices_ids))
                if isinstance(result, str):
                    log.warning("Allocate %s: %s", list(container.devices_ids), result)
                    context.abort(grpc.StatusCode.UNKNOWN, result)
                responses.append(result)
            ok = True
            return api_pb2.AllocateResponse(container_responses=responses)
        finally:
            if self._observer is not None:
                self._observer.allocate_done(time.monotonic() - started, ok)

    def allocate_container(self, ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse | str:
        """One container's response from kubelet's IDs, or NVIDIA's error text."""
        by_id = self._devices.by_id(self.resource)
        try:
            validate_request(by_id, ids, self._config.sharing)
        except InvalidRequest as err:
            return allocate_error(self.resource, err)
        answer = container_allocate_response(
            ids,
            by_id,
            self._config.flags,
            cdi_response_id=self._new_id(),
            imex_channels=[str(c) for c in self._config.imex.channel_ids],
            node_exists=self._node_exists,
        )
        response = answer.response
        if self._config.sharing.strategy is SharingStrategy.MPS and self._config.flags.mps_root:
            response = mps_response(response, self._config.flags.mps_root, self.resource)
        proto = to_proto(response)
        for spec in answer.device_specs:
            proto.devices.append(
                api_pb2.DeviceSpec(
                    container_path=spec.container_path, host_path=spec.host_path, permissions=spec.permissions
                )
            )
        log.info("Allocate %s: %s -> %s", self.resource, list(ids), dict(response.envs))
        return proto

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class NvidiaPluginServer:
    """One resource's DevicePlugin service on `unix://<kubelet_dir>/<nvidia-...sock>`. One use: `start()`,
    then `stop()` (ListAndWatch streams end first, the socket is removed)."""

    def __init__(self, kubelet_dir: Path, servicer: NvidiaPluginServicer, *, max_workers: int = 8) -> None:
        self.servicer = servicer
        self._socket_path = kubelet_dir / plugin_socket_name(servicer.resource)
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
        if self._server is not None:
            raise RuntimeError("plugin server already started")
        try:
            self._server, self._identity = start_unix_server(
                self._socket_path,
                lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server),
                max_workers=self._max_workers,
                thread_name_prefix="nvidia-dp",
            )
        except UnixServerError as err:
            raise PluginServerError(str(err)) from None
        log.info("device plugin for %s serving on %s", self.servicer.resource, self._socket_path)

    def stop(self, grace_s: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.servicer.shutdown()
        server.stop(grace_s).wait(grace_s + 5.0)
        remove_own_socket(self._socket_path, self._identity)


def label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """The merge patch that makes the Node's GFD sharing labels the desired ones: changed ones set, stale
    ones of the families this labeler writes (`LABEL_FAMILIES`) removed, every other label untouched.
    Empty when nothing changes."""
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in current:
        if key.startswith(LABEL_FAMILIES) and key not in desired:
            patch[key] = None
    return patch


__all__ = [
    "LABEL_FAMILIES",
    "NvidiaDevices",
    "NvidiaPluginServer",
    "NvidiaPluginServicer",
    "adapt_devices",
    "devices_to_proto",
    "label_patch",
    "mps_response",
]
