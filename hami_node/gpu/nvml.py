"""The real GPU backend: NVML through the `pynvml` module of NVIDIA's `nvidia-ml-py` distribution.

The only module of the project that imports pynvml. NVML errors become `hami_node.gpu.backend` errors:
the library missing -> `LibraryNotFound`; NVML as a whole failing (uninitialised, driver not loaded,
driver/library mismatch, a function missing from an old driver, the event wait failing) ->
`NvmlFailed`; a call about one GPU failing -> `DeviceLost` (NVML_ERROR_GPU_IS_LOST), `GPUNotFound` or
`GPUFailed`.

Events, as NVIDIA's device plugin: one event set for XidCriticalError | DoubleBitEcc | SingleBitEcc,
intersected with what each GPU supports. A GPU that supports none of them (NOT_SUPPORTED) is logged as
too old and not watched; a GPU whose registration fails otherwise gets a MONITORING_FAILED (or
DEVICE_LOST) event, returned by the first `wait_event`.

NUMA node: /sys/bus/pci/devices/<bus id>/numa_node (what HAMi and NVIDIA's plugin read: the host node
the PCI device hangs off), negative -> None; when sysfs has no entry, NVML's nvmlDeviceGetNumaNodeId.

Thread-safety: NVML is thread-safe and pynvml guards its symbol cache with a lock, so `wait_event`
(which blocks in C with the GIL released) may run in its own thread while other threads call
`list_gpus`, `probe` and `links`. `init` and `shutdown` must not overlap other calls: shutdown frees
the event set a concurrent `wait_event` would be blocked in. Stop the event thread first; it returns
within its `timeout_s`. `links` holds the backend's lock, so it never overlaps `init` or `shutdown` and
may be called from any thread.

Links (`links`, for HAMi's pair scores in `hami_node.gpu.topology`), read as HAMi's device plugin reads
them: nvmlDeviceGetTopologyCommonAncestor per pair; per GPU, link indexes 0 to 17 (go-nvml's
NVLINK_MAX_LINKS, 18, which HAMi iterates; pynvml's constant is larger): nvmlDeviceGetNvLinkState,
and for an enabled link its remote PCI bus id (nvmlDeviceGetNvLinkRemotePciInfo) and remote device
type (nvmlDeviceGetNvLinkRemoteDeviceType, for NVSwitch). A link NVML answers NOT_SUPPORTED or
INVALID_ARGUMENT for is skipped (also FUNCTION_NOT_FOUND: an old driver without NVLink calls). Where
HAMi drops the whole score when a pair has no common ancestor, that pair here has no PCIe entry and
the others are still scored.

MIG (read as NVIDIA's device plugin and GPU feature discovery read it, created as HAMi v2.10's
EnsureAllocation creates it; shared notes section 7): profiles by nvmlDeviceGetGpuInstanceProfileInfo
for every NVML_GPU_INSTANCE_PROFILE_* enum (version 1 of the struct, which go-nvml uses and which
answers with MIG mode off; NOT_SUPPORTED and INVALID_ARGUMENT mean "no such profile") and
nvmlDeviceGetGpuInstancePossiblePlacements; names by go-nvlib's rule (`hami_api.mig.profile_name`).
MIG devices by nvmlDeviceGetMigDeviceHandleByIndex over 0..nvmlDeviceGetMaxMigDeviceCount-1 (NOT_FOUND
and INVALID_ARGUMENT slots skipped), each with its GPU instance's profile and placement
(nvmlDeviceGetGpuInstanceById, nvmlGpuInstanceGetInfo) and nvmlDeviceGetAttributes. Create: the
placement checked against the possible ones, nvmlDeviceCreateGpuInstanceWithPlacement (the placement
passed byref), the compute instance profile of the same slice count with shared engines,
nvmlGpuInstanceCreateComputeInstance, then the MIG UUID found by GPU instance ID; any failure destroys
what was created (compute instance, then GPU instance). Destroy: every compute instance of the GPU
instance, then the GPU instance. MIG mode is never changed.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml

from hami_api.mig import (
    CI_ENGINE_PROFILE_SHARED,
    CI_PROFILE_COUNT,
    GI_PROFILE_COUNT,
    GIProfile,
    Placement,
    ci_profile_enum_for,
    profile_name,
)
from hami_node.gpu.backend import (
    DeviceLost,
    GPUBackendError,
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
    TopologyLevel,
    mig_disabled_message,
)
from hami_node.gpu.topology import MAX_NVLINKS, NvLinkPorts, nvlink_count

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_NO_INSTANCE = 0xFFFFFFFF
_MAX_WAIT_MS = 0xFFFFFFFF

HEALTH_EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
"""The events registered on every GPU (as NVIDIA's device plugin), intersected with its supported types."""

# Codes that say NVML as a whole is unusable, whatever GPU the call was about.
_GLOBAL_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# Codes that say "this GPU or driver does not have that feature".
_UNSUPPORTED_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
    }
)

_TOPOLOGY_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: TopologyLevel.SAME_BOARD,
    pynvml.NVML_TOPOLOGY_SINGLE: TopologyLevel.SINGLE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: TopologyLevel.MULTI_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: TopologyLevel.HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: TopologyLevel.NUMA_NODE,
    pynvml.NVML_TOPOLOGY_SYSTEM: TopologyLevel.SYSTEM,
}


def _code(err: pynvml.NVMLError) -> int:
    return int(getattr(err, "value", pynvml.NVML_ERROR_UNKNOWN))


def _mapped(
    err: pynvml.NVMLError, what: str, uuid: str | None = None, *, lookup: bool = False
) -> GPUBackendError:
    """Our error for an NVML error raised by `what`; `uuid` names the GPU the call was about,
    `lookup` says the call looked the GPU up by UUID (so NOT_FOUND means "no such GPU")."""
    code = _code(err)
    if isinstance(err, pynvml.NVMLError_LibraryNotFound) or code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return LibraryNotFound(code=code)
    message = f"NVML {what} failed: {err} (NVML error {code})"
    if uuid is None or code in _GLOBAL_CODES:
        return NvmlFailed(message, code=code)
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return DeviceLost(uuid, message, code=code)
    if lookup and code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
        return GPUNotFound(uuid, f"no GPU {uuid}: {message}", code=code)
    return GPUFailed(uuid, message, code=code)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def sysfs_pci_address(bus_id: str) -> str | None:
    """NVML's bus id ("00000000:3B:00.0") as sysfs names the device ("0000:3b:00.0"); None if odd."""
    domain, sep, rest = bus_id.strip().partition(":")
    if not sep:
        return None
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return None


class NvmlBackend:
    """The `GPUBackend` on a node with NVIDIA GPUs. `sysfs_root` is for tests (default /sys)."""

    def __init__(self, *, sysfs_root: Path = Path("/sys")) -> None:
        self._sysfs_root = sysfs_root
        self._lock = threading.Lock()
        self._initialised = False
        self._event_set: Any = None
        self._watched = 0
        self._pending: deque[GPUEvent] = deque()
        self._stopped = threading.Event()
        self._last_seen: dict[int, PhysicalGPU] = {}

    # --- life cycle ---------------------------------------------------------------------------------

    def init(self) -> None:
        with self._lock:
            if self._initialised:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise _mapped(err, "nvmlInit") from None
            try:
                self._event_set, self._watched, pending = self._register_events()
            except GPUBackendError:
                self._shutdown_nvml()
                raise
            self._pending = deque(pending)
            self._stopped = threading.Event()
            self._initialised = True
        log.info("NVML initialised: %s", self._driver_text())

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            self._stopped.set()
            event_set, self._event_set = self._event_set, None
            if event_set is not None:
                try:
                    pynvml.nvmlEventSetFree(event_set)
                except pynvml.NVMLError as err:
                    log.warning("NVML nvmlEventSetFree failed: %s", err)
            self._shutdown_nvml()

    @staticmethod
    def _shutdown_nvml() -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("NVML nvmlShutdown failed: %s", err)

    @staticmethod
    def _driver_text() -> str:
        try:
            return f"driver {_text(pynvml.nvmlSystemGetDriverVersion())}"
        except pynvml.NVMLError as err:
            return f"driver version unknown ({err})"

    def _register_events(self) -> tuple[Any, int, list[GPUEvent]]:
        """Create the event set and register every GPU on it. Returns (set, GPUs watched, events
        for GPUs that cannot be watched). Raises NvmlFailed when NVML as a whole fails."""
        try:
            event_set = pynvml.nvmlEventSetCreate()
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            raise _mapped(err, "event set creation") from None
        watched = 0
        pending: list[GPUEvent] = []
        try:
            for index in range(count):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                except pynvml.NVMLError as err:
                    if _code(err) in _GLOBAL_CODES:
                        raise _mapped(err, f"GPU {index} lookup") from None
                    log.error("GPU %d: cannot be looked up to watch its events: %s", index, err)
                    continue
                if self._register_one(event_set, handle, uuid, pending):
                    watched += 1
        except GPUBackendError:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError as err:
                log.warning("NVML nvmlEventSetFree failed: %s", err)
            raise
        return event_set, watched, pending

    @staticmethod
    def _register_one(event_set: Any, handle: Any, uuid: str, pending: list[GPUEvent]) -> bool:
        try:
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
            mask = HEALTH_EVENT_MASK & supported
            if mask:
                pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
        except pynvml.NVMLError as err:
            code = _code(err)
            if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                log.warning("%s is too old to support health checking (events not supported)", uuid)
                return False
            if code in _GLOBAL_CODES:
                raise _mapped(err, f"event registration of {uuid}") from None
            log.error("%s: cannot watch its events (%s); it will be reported unhealthy", uuid, err)
            kind = (
                GPUEventKind.DEVICE_LOST
                if code == pynvml.NVML_ERROR_GPU_IS_LOST
                else GPUEventKind.MONITORING_FAILED
            )
            pending.append(GPUEvent(uuid, kind))
            return False
        if not mask:
            log.warning("%s is too old to support health checking (no Xid or ECC events)", uuid)
            return False
        return True

    # --- queries ------------------------------------------------------------------------------------

    def _require_init(self) -> None:
        if not self._initialised:
            raise NvmlFailed(
                "NVML is not initialised (call init() first)", code=pynvml.NVML_ERROR_UNINITIALIZED
            )

    def list_gpus(self) -> list[PhysicalGPU]:
        self._require_init()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            raise _mapped(err, "nvmlDeviceGetCount") from None
        driver = self._driver_version()
        gpus: list[PhysicalGPU] = []
        for index in range(count):
            try:
                info = self._read_gpu(index, driver)
            except pynvml.NVMLError as err:
                if _code(err) in _GLOBAL_CODES:
                    raise _mapped(err, f"reading GPU {index}") from None
                last = self._last_seen.get(index)
                if last is None:
                    log.error("GPU %d cannot be read and was never seen; left out: %s", index, err)
                    continue
                log.warning("%s (GPU %d) cannot be read (%s); listed as unhealthy", last.uuid, index, err)
                gpus.append(replace(last, healthy=False))
                continue
            with self._lock:
                self._last_seen[index] = info
            gpus.append(info)
        return gpus

    @staticmethod
    def _driver_version() -> str | None:
        """The driver's version, None when NVML cannot tell (never fails the listing: a failing NVML
        fails the calls that follow)."""
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as err:
            log.debug("driver version unknown: %s", err)
            return None

    def _read_gpu(self, index: int, driver_version: str | None = None) -> PhysicalGPU:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pci_bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        return PhysicalGPU(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            model=_text(pynvml.nvmlDeviceGetName(handle)),
            memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
            minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
            numa_node=self._numa_node(handle, pci_bus_id),
            pci_bus_id=pci_bus_id,
            mig_enabled=self._mig_enabled(handle),
            driver_version=driver_version,
        )

    def _numa_node(self, handle: Any, pci_bus_id: str) -> int | None:
        address = sysfs_pci_address(pci_bus_id)
        if address is not None:
            path = self._sysfs_root / "bus" / "pci" / "devices" / address / "numa_node"
            try:
                node = int(path.read_text().strip())
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable (%s); NUMA node from NVML", path, exc)
            else:
                return node if node >= 0 else None
        try:
            node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        except pynvml.NVMLError as err:
            if _code(err) in _UNSUPPORTED_CODES:
                return None
            raise
        return node if node >= 0 else None

    @staticmethod
    def _mig_enabled(handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if _code(err) in _UNSUPPORTED_CODES:
                return False
            raise
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _handle(self, uuid: str) -> Any:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError as err:
            raise _mapped(err, "nvmlDeviceGetHandleByUUID", uuid, lookup=True) from None

    def probe(self, uuid: str) -> None:
        self._require_init()
        handle = self._handle(uuid)
        try:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as err:
            raise _mapped(err, "nvmlDeviceGetMemoryInfo", uuid) from None

    def usage(self, uuid: str) -> GPUUsage:
        """nvmlDeviceGetMemoryInfo and nvmlDeviceGetUtilizationRates (what HAMi's vGPU monitor exports
        per GPU); utilisation NOT_SUPPORTED reads as None. Holds the backend's lock, as `links`: the
        metrics endpoint calls it from its own thread."""
        gpu: int | None = None
        mem: int | None = None
        with self._lock:
            self._require_init()
            handle = self._handle(uuid)
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as err:
                raise _mapped(err, "nvmlDeviceGetMemoryInfo", uuid) from None
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            except pynvml.NVMLError as err:
                if _code(err) not in _UNSUPPORTED_CODES:
                    raise _mapped(err, "nvmlDeviceGetUtilizationRates", uuid) from None
            else:
                gpu, mem = int(rates.gpu), int(rates.memory)
        return GPUUsage(int(memory.used), int(memory.total), gpu, mem)

    def links(self, uuids: Sequence[str]) -> dict[tuple[str, str], GPULink]:
        """HAMi's per-pair reading (links.go): the PCIe common ancestor of each pair, and each GPU's
        enabled NVLinks (state, remote PCI device, remote device type; a link NVML answers NOT_SUPPORTED
        or INVALID_ARGUMENT for is skipped), matched to the peer's bus id or counted through NVSwitches.
        Holds the backend's lock, so `shutdown` waits for it."""
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"links: a GPU is listed twice in {list(uuids)}")
        with self._lock:
            self._require_init()
            handles = {uuid: self._handle(uuid) for uuid in uuids}
            bus_ids = {uuid: self._bus_id(uuid, handle) for uuid, handle in handles.items()}
            ports = {uuid: self._nvlink_ports(uuid, handle) for uuid, handle in handles.items()}
            links: dict[tuple[str, str], GPULink] = {}
            for a in uuids:
                for b in uuids:
                    if a != b:
                        level = self._common_ancestor(a, handles[a], b, handles[b])
                        links[(a, b)] = GPULink(level, nvlink_count(ports[a], bus_ids[b], ports[b]))
            return links

    @staticmethod
    def _bus_id(uuid: str, handle: Any) -> str:
        try:
            return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        except pynvml.NVMLError as err:
            raise _mapped(err, "nvmlDeviceGetPciInfo", uuid) from None

    @staticmethod
    def _common_ancestor(uuid_a: str, handle_a: Any, uuid_b: str, handle_b: Any) -> TopologyLevel | None:
        try:
            level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handle_a, handle_b))
        except pynvml.NVMLError as err:
            if _code(err) in _UNSUPPORTED_CODES - _GLOBAL_CODES:
                log.debug("no PCIe topology between %s and %s: %s", uuid_a, uuid_b, err)
                return None
            raise _mapped(err, f"nvmlDeviceGetTopologyCommonAncestor({uuid_a}, {uuid_b})", uuid_a) from None
        found = _TOPOLOGY_LEVELS.get(level)
        if found is None:
            log.debug("unknown NVML topology level %d between %s and %s; not scored", level, uuid_a, uuid_b)
        return found

    @staticmethod
    def _nvlink_ports(uuid: str, handle: Any) -> NvLinkPorts:
        """The GPU's enabled NVLinks: each one's remote PCI bus id (where NVML tells it) and how many
        reach an NVSwitch."""
        remote: list[str] = []
        switch = 0
        for link in range(MAX_NVLINKS):
            try:
                enabled = pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError as err:
                if _code(err) in _UNSUPPORTED_CODES:
                    continue
                raise _mapped(err, f"nvmlDeviceGetNvLinkState(link {link})", uuid) from None
            if not enabled:
                continue
            try:
                remote.append(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except pynvml.NVMLError as err:
                if _code(err) not in _UNSUPPORTED_CODES:
                    raise _mapped(err, f"nvmlDeviceGetNvLinkRemotePciInfo(link {link})", uuid) from None
            try:
                kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            except pynvml.NVMLError as err:
                if _code(err) not in _UNSUPPORTED_CODES:
                    raise _mapped(err, f"nvmlDeviceGetNvLinkRemoteDeviceType(link {link})", uuid) from None
                continue
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
        return NvLinkPorts(tuple(remote), switch)

    # --- MIG ----------------------------------------------------------------------------------------

    def mig_mode(self, uuid: str) -> MigMode:
        with self._lock:
            self._require_init()
            return self._mig_mode(uuid, self._handle(uuid))

    def mig_profiles(self, uuid: str) -> tuple[GIProfile, ...]:
        with self._lock:
            self._require_init()
            handle = self._handle(uuid)
            if self._mig_mode(uuid, handle) == MigMode(False, False) and not self._mig_capable(uuid, handle):
                return ()
            return self._profiles(uuid, handle)

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        with self._lock:
            self._require_init()
            handle = self._handle(uuid)
            if not self._mig_mode(uuid, handle).current:
                return ()
            return self._mig_devices(uuid, handle, self._profiles(uuid, handle))

    def create_mig_device(self, uuid: str, profile: str, placement: Placement) -> MigDevice:
        with self._lock:
            self._require_init()
            handle = self._handle(uuid)
            mode = self._mig_mode(uuid, handle)
            if not mode.current:
                index = self._index_of(handle)
                message = (
                    mig_disabled_message(uuid, index, mode)
                    if mode.pending or self._mig_capable(uuid, handle)
                    else f"GPU {uuid} is not MIG capable"
                )
                raise MigDisabled(uuid, message, profile=profile, placement=placement)
            profiles = self._profiles(uuid, handle)
            found = next((p for p in profiles if p.name == profile), None)
            if found is None:
                names = ", ".join(p.name for p in profiles)
                raise MigProfileUnknown(
                    uuid,
                    f"GPU {uuid} has no MIG profile {profile!r} (profiles: {names})",
                    profile=profile,
                    placement=placement,
                )
            what = f"{found.name} at {placement} on GPU {uuid}"
            if placement not in found.placements:
                possible = ", ".join(str(p) for p in found.placements)
                raise MigPlacementRefused(
                    uuid,
                    f"invalid placement for {what}: not one of the profile's possible placements "
                    f"({possible})",
                    profile=profile,
                    placement=placement,
                )
            return self._create(uuid, handle, found, placement, what)

    def destroy_mig_device(self, uuid: str, gpu_instance_id: int) -> None:
        with self._lock:
            self._require_init()
            handle = self._handle(uuid)
            what = f"GPU instance {gpu_instance_id} on GPU {uuid}"
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except pynvml.NVMLError as err:
                if _code(err) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    raise MigInstanceNotFound(uuid, f"no {what}: {err}", code=_code(err)) from None
                raise self._mig_error(err, f"looking up {what}", uuid) from None
            for ci in self._compute_instances(uuid, gi, what):
                self._destroy(uuid, pynvml.nvmlComputeInstanceDestroy, ci, f"a compute instance of {what}")
            self._destroy(uuid, pynvml.nvmlGpuInstanceDestroy, gi, what)

    # MIG internals (called with the lock held)

    @staticmethod
    def _mig_mode(uuid: str, handle: Any) -> MigMode:
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if _code(err) in _UNSUPPORTED_CODES - _GLOBAL_CODES:
                return MigMode(False, False)
            raise _mapped(err, "nvmlDeviceGetMigMode", uuid) from None
        enable = pynvml.NVML_DEVICE_MIG_ENABLE
        return MigMode(int(current) == enable, int(pending) == enable)

    @staticmethod
    def _mig_capable(uuid: str, handle: Any) -> bool:
        """GetMigMode answers on a MIG-capable GPU (disabled or not) and NOT_SUPPORTED elsewhere."""
        try:
            pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as err:
            if _code(err) in _UNSUPPORTED_CODES - _GLOBAL_CODES:
                return False
            raise _mapped(err, "nvmlDeviceGetMigMode", uuid) from None
        return True

    @staticmethod
    def _index_of(handle: Any) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetIndex(handle))
        except pynvml.NVMLError:
            return None

    @staticmethod
    def _mig_error(err: pynvml.NVMLError, what: str, uuid: str, **kw: Any) -> GPUBackendError:
        code = _code(err)
        if code in _GLOBAL_CODES or code == pynvml.NVML_ERROR_GPU_IS_LOST:
            return _mapped(err, what, uuid)
        message = f"{what} failed: {err} (NVML error {code})"
        if code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
            return MigPlacementRefused(uuid, message, code=code, **kw)
        if code == pynvml.NVML_ERROR_IN_USE:
            return MigInUse(uuid, message, code=code, **kw)
        return MigError(uuid, message, code=code, **kw)

    def _profiles(self, uuid: str, handle: Any) -> tuple[GIProfile, ...]:
        try:
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        except pynvml.NVMLError as err:
            raise _mapped(err, "nvmlDeviceGetMemoryInfo", uuid) from None
        profiles: list[GIProfile] = []
        for enum in range(GI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
            except pynvml.NVMLError as err:
                if _code(err) in _UNSUPPORTED_CODES - _GLOBAL_CODES:
                    continue
                raise self._mig_error(
                    err, f"nvmlDeviceGetGpuInstanceProfileInfo(enum {enum})", uuid
                ) from None
            try:
                name = profile_name(enum, int(info.memorySizeMB), total)
            except ValueError:
                log.debug("%s: GI profile enum %d has no go-nvlib name; skipped", uuid, enum)
                continue
            profiles.append(
                GIProfile(
                    name=name,
                    profile_id=int(info.id),
                    nvml_enum=enum,
                    slices=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    memory_mib=int(info.memorySizeMB),
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                    placements=self._placements(uuid, handle, int(info.id), name),
                )
            )
        return tuple(profiles)

    def _placements(self, uuid: str, handle: Any, profile_id: int, name: str) -> tuple[Placement, ...]:
        count = ctypes.c_uint(0)
        what = f"nvmlDeviceGetGpuInstancePossiblePlacements({name})"
        try:
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        except pynvml.NVMLError as err:
            raise self._mig_error(err, what, uuid) from None
        return tuple(Placement(int(array[i].start), int(array[i].size)) for i in range(count.value))

    def _mig_devices(self, uuid: str, handle: Any, profiles: Sequence[GIProfile]) -> tuple[MigDevice, ...]:
        try:
            maximum = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except pynvml.NVMLError as err:
            raise self._mig_error(err, "nvmlDeviceGetMaxMigDeviceCount", uuid) from None
        devices: list[MigDevice] = []
        for j in range(maximum):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except pynvml.NVMLError as err:
                if _code(err) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise self._mig_error(err, f"nvmlDeviceGetMigDeviceHandleByIndex({j})", uuid) from None
            devices.append(self._mig_device(uuid, handle, j, mig, profiles))
        return tuple(devices)

    def _mig_device(
        self, uuid: str, handle: Any, index: int, mig: Any, profiles: Sequence[GIProfile]
    ) -> MigDevice:
        what = f"MIG device {index} of GPU {uuid}"
        try:
            mig_uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
            gi_id = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(pynvml.nvmlDeviceGetComputeInstanceId(mig))
            attrs = pynvml.nvmlDeviceGetAttributes(mig)
            gi_info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        except pynvml.NVMLError as err:
            raise self._mig_error(err, f"reading {what}", uuid) from None
        profile = next((p for p in profiles if p.profile_id == int(gi_info.profileId)), None)
        return MigDevice(
            parent_uuid=uuid,
            uuid=mig_uuid,
            index=index,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            profile=profile.name if profile is not None else f"profile-id-{int(gi_info.profileId)}",
            placement=Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
            attributes=MigAttributes(
                memory_mib=int(attrs.memorySizeMB),
                multiprocessors=int(attrs.multiprocessorCount),
                gi_slices=int(attrs.gpuInstanceSliceCount),
                ci_slices=int(attrs.computeInstanceSliceCount),
                copy_engines=int(attrs.sharedCopyEngineCount),
                decoders=int(attrs.sharedDecoderCount),
                encoders=int(attrs.sharedEncoderCount),
                jpeg_engines=int(attrs.sharedJpegCount),
                ofa_engines=int(attrs.sharedOfaCount),
            ),
        )

    def _create(
        self, uuid: str, handle: Any, profile: GIProfile, placement: Placement, what: str
    ) -> MigDevice:
        kw: dict[str, Any] = {"profile": profile.name, "placement": placement}
        c_placement = pynvml.c_nvmlGpuInstancePlacement_t()
        c_placement.start, c_placement.size = placement.start, placement.size
        try:
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, profile.profile_id, ctypes.byref(c_placement)
            )
        except pynvml.NVMLError as err:
            raise self._mig_error(err, f"creating the GPU instance {what}", uuid, **kw) from None
        ci: Any = None
        try:
            gi_id = int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile_enum_for(profile.slices), CI_ENGINE_PROFILE_SHARED, version=1
            )
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
            pynvml.nvmlComputeInstanceGetInfo(ci)
            for device in self._mig_devices(uuid, handle, [profile]):
                if device.gpu_instance_id == gi_id:
                    return replace(device, profile=profile.name, placement=placement)
            raise MigError(uuid, f"created {what} (GPU instance {gi_id}) but no MIG device has it", **kw)
        except (pynvml.NVMLError, GPUBackendError, ValueError) as exc:
            self._roll_back(uuid, gi, ci, what)
            if isinstance(exc, pynvml.NVMLError):
                raise self._mig_error(exc, f"creating the compute instance of {what}", uuid, **kw) from None
            if isinstance(exc, MigError):
                raise
            raise MigError(uuid, f"creating {what} failed: {exc}", **kw) from None

    @staticmethod
    def _roll_back(uuid: str, gi: Any, ci: Any, what: str) -> None:
        """Destroy what a failed create made (compute instance first); failures are logged."""
        if ci is not None:
            try:
                pynvml.nvmlComputeInstanceDestroy(ci)
            except pynvml.NVMLError as err:
                log.error("%s: rolling back the compute instance of %s failed: %s", uuid, what, err)
        try:
            pynvml.nvmlGpuInstanceDestroy(gi)
        except pynvml.NVMLError as err:
            log.error("%s: rolling back the GPU instance %s failed: %s", uuid, what, err)

    def _compute_instances(self, uuid: str, gi: Any, what: str) -> list[Any]:
        found: list[Any] = []
        for enum in range(CI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, enum, CI_ENGINE_PROFILE_SHARED, version=1
                )
            except pynvml.NVMLError as err:
                if _code(err) in _UNSUPPORTED_CODES - _GLOBAL_CODES:
                    continue
                raise self._mig_error(err, f"reading the compute instance profiles of {what}", uuid) from None
            count = ctypes.c_uint(0)
            array = (pynvml.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            try:
                pynvml.nvmlGpuInstanceGetComputeInstances(gi, int(info.id), array, ctypes.byref(count))
            except pynvml.NVMLError as err:
                raise self._mig_error(err, f"listing the compute instances of {what}", uuid) from None
            found.extend(array[i] for i in range(count.value))
        return found

    def _destroy(self, uuid: str, destroy: Any, handle: Any, what: str) -> None:
        try:
            destroy(handle)
        except pynvml.NVMLError as err:
            if _code(err) == pynvml.NVML_ERROR_IN_USE:
                raise MigInUse(
                    uuid, f"{what} is in use by running processes; not destroyed ({err})", code=_code(err)
                ) from None
            raise self._mig_error(err, f"destroying {what}", uuid) from None

    # --- events -------------------------------------------------------------------------------------

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._lock:
                self._require_init()
                if self._pending:
                    return self._pending.popleft()
                event_set, watched, stopped = self._event_set, self._watched, self._stopped
            remaining = deadline - time.monotonic()
            if watched == 0:
                # Nothing registered: NVML would only time out. Sleep, but wake on shutdown.
                if remaining > 0:
                    stopped.wait(remaining)
                self._require_init()
                return None
            timeout_ms = min(_MAX_WAIT_MS, max(0, round(remaining * 1000)))
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                return None
            except pynvml.NVMLError as err:
                raise _mapped(err, "nvmlEventSetWait_v2") from None
            event = self._decode(data)
            if event is not None:
                return event
            if time.monotonic() >= deadline:
                return None

    @staticmethod
    def _decode(data: Any) -> GPUEvent | None:
        event_type = int(data.eventType)
        if event_type == pynvml.nvmlEventTypeXidCriticalError:
            kind = GPUEventKind.XID
        elif event_type == pynvml.nvmlEventTypeDoubleBitEccError:
            kind = GPUEventKind.ECC_DOUBLE_BIT
        elif event_type == pynvml.nvmlEventTypeSingleBitEccError:
            kind = GPUEventKind.ECC_SINGLE_BIT
        else:
            log.debug("ignoring NVML event type 0x%x", event_type)
            return None
        uuid: str | None
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as err:
            log.warning("NVML event %s: its GPU cannot be identified (%s); applies to all GPUs", kind, err)
            uuid = None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return GPUEvent(
            uuid,
            kind,
            xid=int(data.eventData) if kind is GPUEventKind.XID else None,
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if ci == _NO_INSTANCE else ci,
        )
