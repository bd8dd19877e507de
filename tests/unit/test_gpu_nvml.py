"""Contract tests of the nvml backend against a pure-Python NVML *library*.

`FakeNvmlLib` is installed as `pynvml.nvmlLib` before `nvmlInit()`, so the real pynvml wrappers run:
ctypes structs, out-params through byref(), error codes -> NVMLError subclasses. Each attribute mimics
the C function of the same name (python-stack.md §2, approach 1). Nothing is mocked above pynvml.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from hami_api.mig import A100_SXM4_80GB, GIProfile, MigModel, Placement, ci_profile_enum_for, mig_model
from hami_node.gpu import (
    DeviceLost,
    GPUEvent,
    GPUEventKind,
    GPUFailed,
    GPULink,
    GPUNotFound,
    GPUUsage,
    LibraryNotFound,
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
)
from hami_node.gpu.nvml import HEALTH_EVENT_MASK, NvmlBackend, sysfs_pci_address

SUCCESS: int = pynvml.NVML_SUCCESS
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
HANDLE_BASE = 0x1000
EVENT_SET = 0xE000


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_bytes: int = 81920 * 1024 * 1024
    minor: int = 0
    bus_id: str = "00000000:07:00.0"
    numa: int | None = 0  # None: nvmlDeviceGetNumaNodeId answers NOT_SUPPORTED
    mig: int = pynvml.NVML_DEVICE_MIG_DISABLE
    supported_events: int = pynvml.nvmlEventTypeAll
    lost: bool = False
    fail: dict[str, int] = field(default_factory=dict)  # C function name -> NVML error code
    nvlinks: list[FakeNvLink] | None = None  # None: no NVLink (every link call answers NOT_SUPPORTED)
    utilization: tuple[int, int] | None = (37, 12)  # (gpu, memory) %; None: NOT_SUPPORTED


@dataclass
class FakeNvLink:
    """One NVLink of a device: its state, remote PCI bus id and remote device type, or an error code
    for each of the three calls. Link indexes past the device's list answer INVALID_ARGUMENT."""

    state: int = pynvml.NVML_FEATURE_ENABLED
    remote: str = ""
    kind: int = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    state_ret: int = pynvml.NVML_SUCCESS
    remote_ret: int = pynvml.NVML_SUCCESS
    kind_ret: int = pynvml.NVML_SUCCESS


def _out(p: Any) -> Any:
    """The object behind a byref() out-parameter."""
    return p._obj


def _set_pointer(p: Any, address: int) -> None:
    """Write a handle (a pointer value) through a byref() out-parameter."""
    value = ctypes.c_void_p(address)
    ctypes.memmove(ctypes.addressof(_out(p)), ctypes.addressof(value), ctypes.sizeof(value))


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class _CFunction:
    """A callable that tolerates pynvml setting `restype`/`argtypes` on it, like a ctypes function."""

    def __init__(self, fn: Callable[..., int]) -> None:
        self._fn = fn
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)


class FakeNvmlLib:
    """Mimics libnvidia-ml.so.1's C ABI for the functions the backend calls.

    `missing` names functions the "old driver" lacks (-> FunctionNotFound); `broken` makes every call
    answer that code; `topology[(i, j)]` is the common ancestor level; each device's `nvlinks` its links.
    """

    def __init__(self, devices: list[FakeDevice]) -> None:
        self.devices = devices
        self.missing: set[str] = set()
        self.broken: int | None = None
        self.topology: dict[tuple[int, int], int] = {}
        self.events: queue.Queue[tuple[int, int, int, int, int]] = queue.Queue()
        self.registered: dict[int, int] = {}
        self.calls: list[str] = []
        self.initialised = 0

    def __getattr__(self, name: str) -> _CFunction:
        impl = getattr(type(self), "c_" + name, None)
        if impl is None or name in self.missing:
            raise AttributeError(name)
        bound = impl.__get__(self)

        def call(*args: Any) -> int:
            self.calls.append(name)
            if self.broken is not None and name not in ("nvmlShutdown", "nvmlErrorString"):
                return self.broken
            result: int = bound(*args)
            return result

        return _CFunction(call)

    def _device(self, handle: Any, function: str) -> tuple[int, FakeDevice] | int:
        index = (_address(handle) - HANDLE_BASE) // 16
        if not 0 <= index < len(self.devices):
            return INVALID_ARGUMENT
        device = self.devices[index]
        if device.lost:
            return GPU_IS_LOST
        if function in device.fail:
            return device.fail[function]
        return index, device

    # --- the C functions (arguments as pynvml passes them) ---

    def c_nvmlInitWithFlags(self, flags: int) -> int:
        self.initialised += 1
        return SUCCESS

    def c_nvmlShutdown(self) -> int:
        self.initialised -= 1
        return SUCCESS

    def c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = b"580.95.05"
        return SUCCESS

    def c_nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _out(count).value = len(self.devices)
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> int:
        if not 0 <= index.value < len(self.devices):
            return INVALID_ARGUMENT
        _set_pointer(handle, HANDLE_BASE + 16 * index.value)
        return SUCCESS

    def c_nvmlDeviceGetHandleByUUID(self, uuid: Any, handle: Any) -> int:
        for index, device in enumerate(self.devices):
            if device.uuid.encode() == uuid.value:
                if device.lost:
                    return GPU_IS_LOST
                _set_pointer(handle, HANDLE_BASE + 16 * index)
                return SUCCESS
        return NOT_FOUND

    def c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetUUID")
        if isinstance(found, int):
            return found
        buf.value = found[1].uuid.encode()
        return SUCCESS

    def c_nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetName")
        if isinstance(found, int):
            return found
        buf.value = found[1].name.encode()
        return SUCCESS

    def c_nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMemoryInfo")
        if isinstance(found, int):
            return found
        out = _out(memory)
        out.total, out.used = found[1].memory_bytes, 512 * 1024 * 1024
        out.free = out.total - out.used
        return SUCCESS

    def c_nvmlDeviceGetUtilizationRates(self, handle: Any, rates: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetUtilizationRates")
        if isinstance(found, int):
            return found
        if found[1].utilization is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = _out(rates)
        out.gpu, out.memory = found[1].utilization
        return SUCCESS

    def c_nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMinorNumber")
        if isinstance(found, int):
            return found
        _out(minor).value = found[1].minor
        return SUCCESS

    def c_nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetPciInfo_v3")
        if isinstance(found, int):
            return found
        _out(info).busId = found[1].bus_id.encode()
        return SUCCESS

    def c_nvmlDeviceGetNumaNodeId(self, handle: Any, node: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if isinstance(found, int):
            return found
        if found[1].numa is None:
            return NOT_SUPPORTED
        _out(node).value = found[1].numa
        return SUCCESS

    def c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMigMode")
        if isinstance(found, int):
            return found
        _out(current).value = _out(pending).value = found[1].mig
        return SUCCESS

    def _nvlink(self, handle: Any, link: int, function: str) -> FakeNvLink | int:
        found = self._device(handle, function)
        if isinstance(found, int):
            return found
        links = found[1].nvlinks
        if links is None:
            return NOT_SUPPORTED
        if not 0 <= link < len(links):
            return INVALID_ARGUMENT
        return links[link]

    def c_nvmlDeviceGetNvLinkState(self, handle: Any, link: int, active: Any) -> int:
        found = self._nvlink(handle, link, "nvmlDeviceGetNvLinkState")
        if isinstance(found, int):
            return found
        if found.state_ret != SUCCESS:
            return found.state_ret
        _out(active).value = found.state
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: int, info: Any) -> int:
        found = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo_v2")
        if isinstance(found, int):
            return found
        if found.remote_ret != SUCCESS:
            return found.remote_ret
        _out(info).busId = found.remote.encode()
        return SUCCESS

    def c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int, kind: Any) -> int:
        found = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if isinstance(found, int):
            return found
        if found.kind_ret != SUCCESS:
            return found.kind_ret
        _out(kind).value = found.kind
        return SUCCESS

    def c_nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any, level: Any) -> int:
        ia, ib = self._device(a, "topology"), self._device(b, "topology")
        if isinstance(ia, int):
            return ia
        if isinstance(ib, int):
            return ib
        key = (min(ia[0], ib[0]), max(ia[0], ib[0]))
        _out(level).value = self.topology.get(key, pynvml.NVML_TOPOLOGY_SYSTEM)
        return SUCCESS

    def c_nvmlEventSetCreate(self, event_set: Any) -> int:
        _set_pointer(event_set, EVENT_SET)
        return SUCCESS

    def c_nvmlEventSetFree(self, event_set: Any) -> int:
        return SUCCESS

    def c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, types: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        if isinstance(found, int):
            return found
        _out(types).value = found[1].supported_events
        return SUCCESS

    def c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        found = self._device(handle, "nvmlDeviceRegisterEvents")
        if isinstance(found, int):
            return found
        assert _address(event_set) == EVENT_SET
        self.registered[found[0]] = types.value
        return SUCCESS

    def c_nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> int:
        assert _address(event_set) == EVENT_SET
        try:
            index, kind, payload, gi, ci = self.events.get(timeout=timeout_ms.value / 1000)
        except queue.Empty:
            return TIMEOUT
        out = _out(data)
        address = ctypes.c_void_p(HANDLE_BASE + 16 * index)
        ctypes.memmove(
            ctypes.addressof(out) + type(out).device.offset, ctypes.addressof(address), ctypes.sizeof(address)
        )
        out.eventType, out.eventData, out.gpuInstanceId, out.computeInstanceId = kind, payload, gi, ci
        return SUCCESS

    def emit(
        self, index: int, kind: int, payload: int = 0, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF
    ) -> None:
        self.events.put((index, kind, payload, gi, ci))


UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(4)]


def four_gpus() -> list[FakeDevice]:
    return [
        FakeDevice(UUIDS[0], minor=0, bus_id="00000000:07:00.0", numa=0),
        FakeDevice(UUIDS[1], minor=1, bus_id="00000000:0F:00.0", numa=0),
        FakeDevice(UUIDS[2], minor=2, bus_id="00000000:87:00.0", numa=1, mig=pynvml.NVML_DEVICE_MIG_ENABLE),
        FakeDevice(
            UUIDS[3],
            name="Tesla V100-PCIE-32GB",
            memory_bytes=32768 * 1024**2,
            minor=3,
            bus_id="00000001:90:00.0",
        ),
    ]


@pytest.fixture
def lib() -> Iterator[FakeNvmlLib]:
    """Install a FakeNvmlLib as pynvml's library; restore pynvml's module state afterwards."""
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    saved_refcount = pynvml._nvmlLib_refcount
    fake = FakeNvmlLib(four_gpus())
    pynvml.nvmlLib = fake
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
        pynvml._nvmlLib_refcount = saved_refcount


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """An empty sysfs root: no PCI entries, so NUMA comes from NVML unless a test writes one."""
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def backend(lib: FakeNvmlLib, sysfs: Path) -> Iterator[NvmlBackend]:
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        yield nvml
    finally:
        nvml.shutdown()


def write_numa(sysfs: Path, address: str, value: str) -> None:
    device = sysfs / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True, exist_ok=True)
    (device / "numa_node").write_text(value + "\n")


# --- inventory -------------------------------------------------------------------------------------


def test_lists_every_gpu_with_its_properties(backend: NvmlBackend) -> None:
    gpus = backend.list_gpus()
    assert gpus[0] == PhysicalGPU(
        index=0,
        uuid=UUIDS[0],
        model="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        minor=0,
        numa_node=0,
        pci_bus_id="00000000:07:00.0",
        mig_enabled=False,
        healthy=True,
        driver_version="580.95.05",
    )
    assert [g.uuid for g in gpus] == UUIDS
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.mig_enabled for g in gpus] == [False, False, True, False]
    assert gpus[3].model == "Tesla V100-PCIE-32GB"
    assert gpus[3].memory_mib == 32768
    assert gpus[3].pci_bus_id == "00000001:90:00.0"


def test_numa_prefers_sysfs_and_maps_negative_to_none(lib: FakeNvmlLib, sysfs: Path) -> None:
    write_numa(sysfs, "0000:07:00.0", "1")  # sysfs says 1, NVML says 0: sysfs wins
    write_numa(sysfs, "0000:0f:00.0", "-1")  # no NUMA affinity
    lib.devices[3].numa = None  # NVML NOT_SUPPORTED and no sysfs entry
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        assert [g.numa_node for g in nvml.list_gpus()] == [1, None, 1, None]
    finally:
        nvml.shutdown()


def test_old_driver_without_numa_or_mig_functions(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.missing |= {"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetMigMode"}
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        gpus = nvml.list_gpus()
    finally:
        nvml.shutdown()
    assert [g.numa_node for g in gpus] == [None] * 4
    assert [g.mig_enabled for g in gpus] == [False] * 4


def test_sysfs_address_from_nvml_bus_id() -> None:
    assert sysfs_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_pci_address("00000001:90:00.0") == "0001:90:00.0"
    assert sysfs_pci_address("garbage") is None


def test_a_gpu_lost_after_being_seen_stays_listed_unhealthy(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    before = backend.list_gpus()
    lib.devices[1].lost = True
    after = backend.list_gpus()
    assert [g.uuid for g in after] == UUIDS
    assert after[1] == replace(before[1], healthy=False)
    assert all(g.healthy for i, g in enumerate(after) if i != 1)


def test_a_gpu_unreadable_from_the_start_is_left_out(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.devices[2].fail["nvmlDeviceGetName"] = pynvml.NVML_ERROR_UNKNOWN
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        assert [g.uuid for g in nvml.list_gpus()] == [UUIDS[0], UUIDS[1], UUIDS[3]]
    finally:
        nvml.shutdown()


# --- probe and links ----------------------------------------------------------------------------------


def test_probe_answers_normally_then_raises_device_lost(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    backend.probe(UUIDS[0])
    lib.devices[0].lost = True
    with pytest.raises(DeviceLost) as info:
        backend.probe(UUIDS[0])
    assert info.value.uuid == UUIDS[0]
    assert info.value.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert "GPU is lost" in str(info.value)


def test_usage_reads_memory_and_utilisation_and_none_where_not_supported(
    backend: NvmlBackend, lib: FakeNvmlLib
) -> None:
    assert backend.usage(UUIDS[0]) == GPUUsage(512 * 1024 * 1024, lib.devices[0].memory_bytes, 37, 12)
    lib.devices[1].utilization = None
    assert backend.usage(UUIDS[1]) == GPUUsage(512 * 1024 * 1024, lib.devices[1].memory_bytes, None, None)
    lib.devices[2].fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(GPUFailed):
        backend.usage(UUIDS[2])
    backend.shutdown()
    with pytest.raises(NvmlFailed):
        backend.usage(UUIDS[0])


def test_probe_maps_other_errors(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    with pytest.raises(GPUNotFound) as not_found:
        backend.probe("GPU-nope")
    assert not_found.value.uuid == "GPU-nope"
    lib.devices[2].fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(GPUFailed) as failed:
        backend.probe(UUIDS[2])
    assert type(failed.value) is GPUFailed
    assert failed.value.code == pynvml.NVML_ERROR_UNKNOWN


def direct(count: int, remote: str) -> list[FakeNvLink]:
    """`count` enabled links to the GPU at `remote`."""
    return [FakeNvLink(remote=remote) for _ in range(count)]


def test_links_pcie_levels_and_direct_nvlinks(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    """Each pair's common ancestor, and each GPU's NVLinks matched to the other's bus id (NVML's case
    and 8-digit domain do not matter, as in HAMi's BusID)."""
    lib.devices[0].nvlinks = [*direct(4, "00000000:0f:00.0"), FakeNvLink(pynvml.NVML_FEATURE_DISABLED)]
    lib.devices[1].nvlinks = direct(4, "0000:07:00.0")
    lib.topology[(0, 1)] = pynvml.NVML_TOPOLOGY_SINGLE
    lib.topology[(0, 2)] = pynvml.NVML_TOPOLOGY_NODE
    lib.topology[(1, 2)] = pynvml.NVML_TOPOLOGY_MULTIPLE
    lib.topology[(2, 3)] = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    lib.topology[(1, 3)] = pynvml.NVML_TOPOLOGY_INTERNAL
    links = backend.links(UUIDS)
    assert len(links) == 12
    assert (
        links[(UUIDS[0], UUIDS[1])] == links[(UUIDS[1], UUIDS[0])] == GPULink(TopologyLevel.SINGLE_SWITCH, 4)
    )
    assert links[(UUIDS[2], UUIDS[0])] == GPULink(TopologyLevel.NUMA_NODE, 0)
    assert links[(UUIDS[1], UUIDS[2])] == GPULink(TopologyLevel.MULTI_SWITCH, 0)
    assert links[(UUIDS[3], UUIDS[2])] == GPULink(TopologyLevel.HOST_BRIDGE, 0)
    assert links[(UUIDS[1], UUIDS[3])] == GPULink(TopologyLevel.SAME_BOARD, 0)
    assert links[(UUIDS[0], UUIDS[3])] == GPULink(TopologyLevel.SYSTEM, 0)
    assert backend.links(UUIDS[:1]) == {} and backend.links([]) == {}
    with pytest.raises(ValueError, match="twice"):
        backend.links([UUIDS[0], UUIDS[0]])


def test_links_read_at_most_hamis_18_link_indexes(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    """go-nvml's NVLINK_MAX_LINKS (18) bounds HAMi's loop; pynvml's constant is larger."""
    lib.devices[0].nvlinks = direct(20, "00000000:0F:00.0")
    lib.devices[1].nvlinks = direct(20, "00000000:07:00.0")
    assert backend.links(UUIDS[:2])[(UUIDS[0], UUIDS[1])].nvlinks == 18
    asked = [c for c in lib.calls if c == "nvmlDeviceGetNvLinkState"]
    assert len(asked) == 2 * 18


def test_links_without_nvlink_or_with_an_old_driver(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    """NOT_SUPPORTED (no NVLink) and FUNCTION_NOT_FOUND (an old driver) mean no NVLinks, not an error."""
    lib.topology[(0, 1)] = pynvml.NVML_TOPOLOGY_SYSTEM
    assert backend.links(UUIDS[:2])[(UUIDS[0], UUIDS[1])] == GPULink(TopologyLevel.SYSTEM, 0)
    lib.missing.add("nvmlDeviceGetNvLinkState")
    assert backend.links(UUIDS[:2])[(UUIDS[1], UUIDS[0])] == GPULink(TopologyLevel.SYSTEM, 0)


def test_links_pair_without_a_common_ancestor_has_no_pcie_entry(
    backend: NvmlBackend, lib: FakeNvmlLib
) -> None:
    lib.devices[2].fail["topology"] = NOT_SUPPORTED
    links = backend.links(UUIDS[:3])
    assert links[(UUIDS[0], UUIDS[2])] == GPULink(None, 0)
    assert links[(UUIDS[0], UUIDS[1])] == GPULink(TopologyLevel.SYSTEM, 0)


def test_links_errors_name_the_gpu(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.devices[1].lost = True
    with pytest.raises(DeviceLost) as lost:
        backend.links(UUIDS[:2])
    assert lost.value.uuid == UUIDS[1]
    lib.devices[1].lost = False
    with pytest.raises(GPUNotFound):
        backend.links([UUIDS[0], "GPU-nope"])
    lib.devices[0].nvlinks = [FakeNvLink(state_ret=pynvml.NVML_ERROR_UNKNOWN)]
    with pytest.raises(GPUFailed, match="nvmlDeviceGetNvLinkState") as failed:
        backend.links(UUIDS[:2])
    assert failed.value.uuid == UUIDS[0]
    lib.broken = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NvmlFailed):
        backend.links(UUIDS[:2])


def test_links_wait_for_nothing_and_shutdown_waits_for_links(lib: FakeNvmlLib, sysfs: Path) -> None:
    nvml = NvmlBackend(sysfs_root=sysfs)
    with pytest.raises(NvmlFailed, match="not initialised"):
        nvml.links(UUIDS[:2])
    nvml.init()
    nvml.shutdown()
    with pytest.raises(NvmlFailed, match="not initialised"):
        nvml.links(UUIDS[:2])


# HAMi's own cases (pkg/device/nvidia/links_test.go, Test_GetNVLink and Test_countNvSwitchLinks), as
# inputs and expected outputs: the links of dev1 and dev2, and dev1's NVLink count to dev2 (None: an
# error). HAMi's mocks answer every link index below 18; a state mock enables the first n links and
# disables the rest, a remote-type mock makes the first n links SWITCH and the rest GPU.
DEV2_BUS = "00000000:2a:00.0"
SWITCH_BUS = "00000000:07:00.0"
ENABLED, DISABLED = pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED
SWITCH, GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
UNKNOWN_ERROR = pynvml.NVML_ERROR_UNKNOWN


def hami_links(
    enabled: int = 18,
    switches: int = 0,
    state_error: tuple[int, int] | None = None,
    *,
    remote: str = SWITCH_BUS,
    kind_error: tuple[int, int] | None = None,
) -> list[FakeNvLink]:
    """18 links as HAMi's mocks describe them: makeNvLinkStateFunc(enabled) (or, with `state_error`
    (link, code), makeNvLinkStateErrorFunc: that link fails, every other one enabled),
    makeRemoteDeviceTypeFunc(switches) (or makeRemoteDeviceTypeErrorFunc: that link fails, every other
    one SWITCH) and makeRemotePciInfoFunc(remote)."""
    links = []
    for i in range(18):
        link = FakeNvLink(ENABLED if i < enabled else DISABLED, remote, SWITCH if i < switches else GPU)
        if state_error is not None:
            link.state = ENABLED
            link.state_ret = state_error[1] if i == state_error[0] else SUCCESS
        if kind_error is not None:
            link.kind = SWITCH
            link.kind_ret = kind_error[1] if i == kind_error[0] else SUCCESS
        links.append(link)
    return links


HAMI_NVLINK_CASES: list[tuple[str, list[FakeNvLink] | None, list[FakeNvLink] | None, int | None]] = [
    # Test_GetNVLink
    ("direct_connect_18_links", hami_links(18, remote=DEV2_BUS), None, 18),
    ("direct_connect_partial", hami_links(4, remote=DEV2_BUS), None, 4),
    ("nvswitch_full_mesh_18", hami_links(18, 18), hami_links(18, 18), 18),
    ("nvswitch_asymmetric", hami_links(18, 18), hami_links(4, 4), 4),
    ("one_side_no_nvswitch", hami_links(18, 18), hami_links(0, 0), 0),
    ("no_nvlink_anywhere", hami_links(0), hami_links(0), 0),
    ("dev1_nvlink_state_error", hami_links(0, 0, (0, UNKNOWN_ERROR)), None, None),
    ("dev1_nvswitch_count_error", hami_links(18, kind_error=(0, UNKNOWN_ERROR)), None, None),
    ("nvswitch_asymmetric_swapped", hami_links(4, 4), hami_links(18, 18), 4),
    ("one_side_no_nvswitch_swapped", hami_links(0, 0), hami_links(18, 18), 0),
    ("dev2_nvswitch_state_error", hami_links(18, 18), hami_links(0, 0, (0, UNKNOWN_ERROR)), None),
    ("dev2_nvswitch_count_error", hami_links(18, 18), hami_links(18, kind_error=(0, UNKNOWN_ERROR)), None),
    # Test_countNvSwitchLinks, through a peer with 18 switch links (the count is the smaller of the two)
    ("all_links_via_nvswitch", hami_links(18, 18), hami_links(18, 18), 18),
    ("no_links_enabled", hami_links(0, 0), hami_links(18, 18), 0),
    ("links_enabled_but_not_switch", hami_links(18, 0), hami_links(18, 18), 0),
    ("mixed_switch_and_gpu", hami_links(18, 10), hami_links(18, 18), 10),
    ("nvlink_state_not_supported_skipped", hami_links(18, 18, (0, NOT_SUPPORTED)), hami_links(18, 18), 17),
    ("nvlink_state_unexpected_error", hami_links(18, 18, (0, UNKNOWN_ERROR)), hami_links(18, 18), None),
    ("remote_type_not_supported_skipped", hami_links(kind_error=(0, NOT_SUPPORTED)), hami_links(18, 18), 17),
    ("remote_type_unexpected_error", hami_links(18, kind_error=(0, UNKNOWN_ERROR)), hami_links(18, 18), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("dev1", "dev2", "expected"), [c[1:] for c in HAMI_NVLINK_CASES], ids=[c[0] for c in HAMI_NVLINK_CASES]
)
def test_nvlink_count_in_hamis_cases(
    lib: FakeNvmlLib,
    sysfs: Path,
    dev1: list[FakeNvLink] | None,
    dev2: list[FakeNvLink] | None,
    expected: int | None,
) -> None:
    lib.devices[:] = [
        FakeDevice(UUIDS[0], minor=0, bus_id="00000000:1A:00.0", nvlinks=dev1),
        FakeDevice(UUIDS[1], minor=1, bus_id="00000000:2A:00.0", nvlinks=dev2),
    ]
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        if expected is None:
            with pytest.raises(GPUFailed) as info:
                nvml.links(UUIDS[:2])
            assert info.value.code == UNKNOWN_ERROR
        else:
            assert nvml.links(UUIDS[:2])[(UUIDS[0], UUIDS[1])] == GPULink(TopologyLevel.SYSTEM, expected)
    finally:
        nvml.shutdown()


# --- events ----------------------------------------------------------------------------------------


def test_registers_health_events_intersected_with_supported(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.devices[1].supported_events = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState
    lib.devices[3].fail["nvmlDeviceGetSupportedEventTypes"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        assert lib.registered == {
            0: HEALTH_EVENT_MASK,
            1: pynvml.nvmlEventTypeXidCriticalError,
            2: HEALTH_EVENT_MASK,
        }
        # "too old" is logged, not an event: nothing is pending
        assert nvml.wait_event(0) is None
    finally:
        nvml.shutdown()
    assert HEALTH_EVENT_MASK == 0b1011


def test_xid_79_arrives_through_event_set_wait(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.emit(2, pynvml.nvmlEventTypeXidCriticalError, 79)
    assert backend.wait_event(5) == GPUEvent(UUIDS[2], GPUEventKind.XID, xid=79)
    assert "nvmlEventSetWait_v2" in lib.calls


def test_event_from_another_thread_wakes_the_waiter(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    got: list[GPUEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(backend.wait_event(10)))
    waiter.start()
    try:
        lib.emit(0, pynvml.nvmlEventTypeDoubleBitEccError)
    finally:
        waiter.join(10)
    assert got == [GPUEvent(UUIDS[0], GPUEventKind.ECC_DOUBLE_BIT)]


def test_ecc_and_mig_instance_fields(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.emit(1, pynvml.nvmlEventTypeSingleBitEccError)
    lib.emit(2, pynvml.nvmlEventTypeXidCriticalError, 48, gi=1, ci=0)
    assert backend.wait_event(5) == GPUEvent(UUIDS[1], GPUEventKind.ECC_SINGLE_BIT)
    event = backend.wait_event(5)
    assert event == GPUEvent(UUIDS[2], GPUEventKind.XID, xid=48, gpu_instance_id=1, compute_instance_id=0)
    assert str(event) == f"Xid 48 on {UUIDS[2]} (GI 1, CI 0)"


def test_timeout_returns_none(backend: NvmlBackend) -> None:
    start = time.monotonic()
    assert backend.wait_event(0.05) is None
    assert time.monotonic() - start >= 0.04


def test_event_whose_gpu_cannot_be_read_applies_to_all(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.emit(3, pynvml.nvmlEventTypeXidCriticalError, 79)
    lib.devices[3].lost = True
    assert backend.wait_event(5) == GPUEvent(None, GPUEventKind.XID, xid=79)


def test_registration_failure_marks_that_gpu(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.devices[0].fail["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_UNKNOWN
    lib.devices[1].fail["nvmlDeviceGetSupportedEventTypes"] = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        assert nvml.wait_event(0) == GPUEvent(UUIDS[0], GPUEventKind.MONITORING_FAILED)
        assert nvml.wait_event(0) == GPUEvent(UUIDS[1], GPUEventKind.DEVICE_LOST)
        assert nvml.wait_event(0) is None
    finally:
        nvml.shutdown()


def test_wait_failure_is_nvml_failed(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.broken = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(NvmlFailed) as info:
        backend.wait_event(1)
    assert info.value.code == pynvml.NVML_ERROR_UNKNOWN
    assert "nvmlEventSetWait_v2" in str(info.value)


def test_no_gpus_supporting_events_still_times_out_and_wakes_on_shutdown(
    lib: FakeNvmlLib, sysfs: Path
) -> None:
    for device in lib.devices:
        device.supported_events = pynvml.nvmlEventTypePState
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    assert nvml.wait_event(0.01) is None
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            nvml.wait_event(30)
        except NvmlFailed as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    nvml.shutdown()
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(errors) == 1 and "not initialised" in str(errors[0])


# --- errors ----------------------------------------------------------------------------------------


def test_calls_before_init_raise_nvml_failed(lib: FakeNvmlLib, sysfs: Path) -> None:
    nvml = NvmlBackend(sysfs_root=sysfs)
    for call in (nvml.list_gpus, lambda: nvml.wait_event(0), lambda: nvml.probe(UUIDS[0])):
        with pytest.raises(NvmlFailed, match="not initialised"):
            call()
    nvml.shutdown()  # safe without init


def test_init_failure_maps_and_leaves_nothing(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.broken = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    nvml = NvmlBackend(sysfs_root=sysfs)
    with pytest.raises(NvmlFailed) as info:
        nvml.init()
    assert type(info.value) is NvmlFailed
    assert info.value.code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert "Driver Not Loaded" in str(info.value)
    lib.broken = None
    nvml.init()  # a retry works
    assert len(nvml.list_gpus()) == 4
    nvml.shutdown()
    assert lib.initialised == 0


def test_event_set_failure_during_init_shuts_nvml_down(lib: FakeNvmlLib, sysfs: Path) -> None:
    lib.missing.add("nvmlEventSetCreate")
    nvml = NvmlBackend(sysfs_root=sysfs)
    with pytest.raises(NvmlFailed, match="Function Not Found"):
        nvml.init()
    assert lib.initialised == 0


def test_nvml_failing_entirely_while_running(backend: NvmlBackend, lib: FakeNvmlLib) -> None:
    lib.broken = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(NvmlFailed):
        backend.list_gpus()
    with pytest.raises(NvmlFailed):
        backend.probe(UUIDS[0])  # an NVML-wide code is not blamed on the GPU
    lib.broken = None
    assert len(backend.list_gpus()) == 4


def test_library_not_found_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real case on a machine without the NVIDIA driver: CDLL("libnvidia-ml.so.1") fails."""
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has libnvidia-ml; see test_real_nvml_when_present")
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    nvml = NvmlBackend()
    with pytest.raises(LibraryNotFound) as info:
        nvml.init()
    assert isinstance(info.value, NvmlFailed)
    assert str(info.value).startswith("no GPU driver on this node: libnvidia-ml.so.1 not found")
    assert pynvml.nvmlLib is None
    nvml.shutdown()


def test_real_nvml_when_present() -> None:
    """On a GPU machine, the same backend against the real driver (skipped elsewhere)."""
    if ctypes.util.find_library("nvidia-ml") is None:
        pytest.skip("no NVIDIA driver on this machine")
    nvml = NvmlBackend()
    nvml.init()
    try:
        gpus = nvml.list_gpus()
        assert gpus, "the driver is there but lists no GPU"
        for gpu in gpus:
            assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.memory_mib > 0 and gpu.healthy
            nvml.probe(gpu.uuid)
        links = nvml.links([g.uuid for g in gpus])
        assert len(links) == len(gpus) * (len(gpus) - 1)
        assert all(0 <= link.nvlinks <= 18 for link in links.values())
        nvml.wait_event(0.1)  # any real event, or none, is fine
    finally:
        nvml.shutdown()


# --- MIG ---------------------------------------------------------------------------------------------
# The MIG C functions, backed by hami_api.mig's tables for the device's NVML name (a name without a
# table answers NOT_SUPPORTED to the profile calls). Handles: GI GI_BASE + 256 * gpu + gi id, CI
# CI_BASE + 256 * gpu + gi id (one CI per GI, id 0), MIG device MIG_BASE + 256 * gpu + gi id. MIG
# device slots j are the GI ids (sparse: empty slots answer NOT_FOUND), up to 7.

GI_BASE, CI_BASE, MIG_BASE = 0x100000, 0x200000, 0x300000
INSUFFICIENT_RESOURCES: int = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
IN_USE: int = pynvml.NVML_ERROR_IN_USE
MAX_MIG = 7


@dataclass
class FakeInstance:
    profile: GIProfile
    start: int
    ci: bool = False
    busy: bool = False


class MigNvmlLib(FakeNvmlLib):
    """FakeNvmlLib plus MIG: `instances[gpu][gi id]`; `fail_ci` makes compute instance creation fail."""

    def __init__(self, devices: list[FakeDevice]) -> None:
        super().__init__(devices)
        self.instances: dict[int, dict[int, FakeInstance]] = {i: {} for i in range(len(devices))}
        self.fail_ci: int | None = None

    def _model(self, index: int) -> MigModel | None:
        return mig_model(self.devices[index].name)

    def _split(self, handle: Any, base: int) -> tuple[int, int] | None:
        offset = _address(handle) - base
        if not 0 <= offset < 256 * len(self.devices):
            return None
        return offset // 256, offset % 256

    def c_nvmlDeviceGetIndex(self, handle: Any, index: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetIndex")
        if isinstance(found, int):
            return found
        _out(index).value = found[0]
        return SUCCESS

    def c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMigMode")
        if isinstance(found, int):
            return found
        if self._model(found[0]) is None and found[1].mig == pynvml.NVML_DEVICE_MIG_DISABLE:
            return NOT_SUPPORTED
        _out(current).value = _out(pending).value = found[1].mig
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: int, info: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
        if isinstance(found, int):
            return found
        if not 0 <= enum < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            return INVALID_ARGUMENT
        model = self._model(found[0])
        profile = model.profile_by_enum(enum) if model is not None else None
        if profile is None:
            return NOT_SUPPORTED
        out = _out(info)
        out.id, out.sliceCount, out.instanceCount = profile.profile_id, profile.slices, profile.instance_count
        out.multiprocessorCount, out.copyEngineCount = profile.multiprocessors, profile.copy_engines
        out.decoderCount, out.encoderCount = profile.decoders, profile.encoders
        out.jpegCount, out.ofaCount, out.memorySizeMB = (
            profile.jpeg_engines,
            profile.ofa_engines,
            profile.memory_mib,
        )
        return SUCCESS

    def _profile_by_id(self, index: int, profile_id: int) -> GIProfile | None:
        model = self._model(index)
        return model.profile_by_id(profile_id) if model is not None else None

    def c_nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: int, array: Any, count: Any
    ) -> int:
        found = self._device(handle, "nvmlDeviceGetGpuInstancePossiblePlacements_v2")
        if isinstance(found, int):
            return found
        profile = self._profile_by_id(found[0], profile_id)
        if profile is None:
            return NOT_SUPPORTED
        _out(count).value = len(profile.placements)
        if array is not None:
            for i, placement in enumerate(profile.placements):
                array[i].start, array[i].size = placement.start, placement.size
        return SUCCESS

    def c_nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement: Any, gi: Any
    ) -> int:
        found = self._device(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
        if isinstance(found, int):
            return found
        index, device = found
        profile = self._profile_by_id(index, profile_id)
        if device.mig != pynvml.NVML_DEVICE_MIG_ENABLE or profile is None:
            return NOT_SUPPORTED
        asked = Placement(_out(placement).start, _out(placement).size)
        if asked not in profile.placements:
            return INVALID_ARGUMENT
        used = self.instances[index]
        if any(Placement(i.start, i.profile.placements[0].size).overlaps(asked) for i in used.values()):
            return INSUFFICIENT_RESOURCES
        gi_id = next(n for n in range(1, MAX_MIG + 2) if n not in used)
        used[gi_id] = FakeInstance(profile, asked.start)
        _set_pointer(gi, GI_BASE + 256 * index + gi_id)
        return SUCCESS

    def _instance(self, handle: Any, base: int) -> tuple[int, int, FakeInstance] | int:
        split = self._split(handle, base)
        if split is None or split[1] not in self.instances[split[0]]:
            return INVALID_ARGUMENT
        return split[0], split[1], self.instances[split[0]][split[1]]

    def c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int, gi: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetGpuInstanceById")
        if isinstance(found, int):
            return found
        if gi_id not in self.instances[found[0]]:
            return NOT_FOUND
        _set_pointer(gi, GI_BASE + 256 * found[0] + gi_id)
        return SUCCESS

    def c_nvmlGpuInstanceGetInfo(self, gi: Any, info: Any) -> int:
        found = self._instance(gi, GI_BASE)
        if isinstance(found, int):
            return found
        _, gi_id, instance = found
        out = _out(info)
        out.id, out.profileId = gi_id, instance.profile.profile_id
        out.placement.start, out.placement.size = instance.start, instance.profile.placements[0].size
        return SUCCESS

    def c_nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: Any, enum: int, engines: int, info: Any
    ) -> int:
        found = self._instance(gi, GI_BASE)
        if isinstance(found, int):
            return found
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(enum)
        if slices is None or slices > found[2].profile.slices:
            return NOT_SUPPORTED
        out = _out(info)
        out.id, out.sliceCount, out.instanceCount = enum, slices, found[2].profile.slices // slices
        return SUCCESS

    def c_nvmlGpuInstanceCreateComputeInstance(self, gi: Any, profile_id: int, ci: Any) -> int:
        found = self._instance(gi, GI_BASE)
        if isinstance(found, int):
            return found
        if self.fail_ci is not None:
            return self.fail_ci
        index, gi_id, instance = found
        instance.ci = True
        _set_pointer(ci, CI_BASE + 256 * index + gi_id)
        return SUCCESS

    def c_nvmlComputeInstanceGetInfo_v2(self, ci: Any, info: Any) -> int:
        found = self._instance(ci, CI_BASE)
        if isinstance(found, int) or not found[2].ci:
            return INVALID_ARGUMENT
        _out(info).id = 0
        return SUCCESS

    def c_nvmlGpuInstanceGetComputeInstances(self, gi: Any, profile_id: int, array: Any, count: Any) -> int:
        found = self._instance(gi, GI_BASE)
        if isinstance(found, int):
            return found
        index, gi_id, instance = found
        if instance.ci and profile_id == ci_profile_enum_for(instance.profile.slices):
            ctypes.memmove(
                ctypes.addressof(array), ctypes.addressof(ctypes.c_void_p(CI_BASE + 256 * index + gi_id)), 8
            )
            _out(count).value = 1
        else:
            _out(count).value = 0
        return SUCCESS

    def c_nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        found = self._instance(ci, CI_BASE)
        if isinstance(found, int) or not found[2].ci:
            return INVALID_ARGUMENT
        if found[2].busy:
            return IN_USE
        found[2].ci = False
        return SUCCESS

    def c_nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        found = self._instance(gi, GI_BASE)
        if isinstance(found, int):
            return found
        index, gi_id, instance = found
        if instance.ci:
            return IN_USE
        del self.instances[index][gi_id]
        return SUCCESS

    def c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if isinstance(found, int):
            return found
        _out(count).value = MAX_MIG
        return SUCCESS

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, j: Any, mig: Any) -> int:
        found = self._device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if isinstance(found, int):
            return found
        if not 0 <= j.value < MAX_MIG:
            return INVALID_ARGUMENT
        gi_id = j.value + 1
        instance = self.instances[found[0]].get(gi_id)
        if instance is None or not instance.ci:
            return NOT_FOUND
        _set_pointer(mig, MIG_BASE + 256 * found[0] + gi_id)
        return SUCCESS

    def _mig(self, handle: Any) -> tuple[int, int, FakeInstance] | None:
        found = self._instance(handle, MIG_BASE)
        return None if isinstance(found, int) else found

    def c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return super().c_nvmlDeviceGetUUID(handle, buf, size)
        buf.value = f"MIG-{mig[0]:08x}-0000-0000-0000-{mig[1]:012x}".encode()
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceId(self, handle: Any, gi: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return INVALID_ARGUMENT
        _out(gi).value = mig[1]
        return SUCCESS

    def c_nvmlDeviceGetComputeInstanceId(self, handle: Any, ci: Any) -> int:
        if self._mig(handle) is None:
            return INVALID_ARGUMENT
        _out(ci).value = 0
        return SUCCESS

    def c_nvmlDeviceGetAttributes_v2(self, handle: Any, attrs: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return INVALID_ARGUMENT
        p, out = mig[2].profile, _out(attrs)
        out.multiprocessorCount, out.sharedCopyEngineCount = p.multiprocessors, p.copy_engines
        out.sharedDecoderCount, out.sharedEncoderCount = p.decoders, p.encoders
        out.sharedJpegCount, out.sharedOfaCount = p.jpeg_engines, p.ofa_engines
        out.gpuInstanceSliceCount = out.computeInstanceSliceCount = p.slices
        out.memorySizeMB = p.memory_mib
        return SUCCESS


@pytest.fixture
def mig_backend(lib: FakeNvmlLib, sysfs: Path) -> Iterator[tuple[NvmlBackend, MigNvmlLib]]:
    """GPU 2 (A100-SXM4-80GB) has MIG enabled, GPUs 0 and 1 are A100s with MIG off, 3 is a V100."""
    fake = MigNvmlLib(four_gpus())
    pynvml.nvmlLib = fake
    pynvml._nvmlGetFunctionPointer_cache.clear()
    nvml = NvmlBackend(sysfs_root=sysfs)
    nvml.init()
    try:
        yield nvml, fake
    finally:
        nvml.shutdown()


def test_mig_mode_and_profiles_through_real_pynvml_wrappers(
    mig_backend: tuple[NvmlBackend, MigNvmlLib],
) -> None:
    backend, _ = mig_backend
    assert backend.mig_mode(UUIDS[2]) == MigMode(True, True)
    assert backend.mig_mode(UUIDS[0]) == MigMode(False, False)
    assert backend.mig_mode(UUIDS[3]) == MigMode(False, False)
    in_enum_order = tuple(sorted(A100_SXM4_80GB.profiles, key=lambda p: p.nvml_enum))
    assert backend.mig_profiles(UUIDS[2]) == in_enum_order  # names by go-nvlib's rule
    assert backend.mig_profiles(UUIDS[0]) == in_enum_order  # MIG off: still answered (struct v1)
    assert backend.mig_profiles(UUIDS[3]) == ()


def test_mig_create_list_and_destroy(mig_backend: tuple[NvmlBackend, MigNvmlLib]) -> None:
    backend, fake = mig_backend
    assert backend.mig_devices(UUIDS[2]) == ()
    a = backend.create_mig_device(UUIDS[2], "3g.40gb", Placement(4, 4))
    b = backend.create_mig_device(UUIDS[2], "1g.10gb", Placement(0, 1))
    assert (a.gpu_instance_id, a.compute_instance_id, a.profile, a.placement) == (
        1,
        0,
        "3g.40gb",
        Placement(4, 4),
    )
    assert a.uuid == "MIG-00000002-0000-0000-0000-000000000001" and a.index == 0
    assert (a.attributes.memory_mib, a.attributes.multiprocessors, a.attributes.gi_slices) == (40192, 42, 3)
    assert backend.mig_devices(UUIDS[2]) == (a, b)
    backend.destroy_mig_device(UUIDS[2], 1)
    assert backend.mig_devices(UUIDS[2]) == (b,)
    assert list(fake.instances[2]) == [2]


def test_mig_overlap_is_refused_by_nvml_with_insufficient_resources(
    mig_backend: tuple[NvmlBackend, MigNvmlLib],
) -> None:
    backend, fake = mig_backend
    backend.create_mig_device(UUIDS[2], "4g.40gb", Placement(0, 4))
    with pytest.raises(MigPlacementRefused, match=r"2g\.20gb at \{2,2\} on GPU GPU-0+2.*NVML error 23") as e:
        backend.create_mig_device(UUIDS[2], "2g.20gb", Placement(2, 2))
    assert e.value.code == INSUFFICIENT_RESOURCES and e.value.uuid == UUIDS[2]
    assert len(fake.instances[2]) == 1


def test_mig_placement_not_possible_is_refused_before_nvml(
    mig_backend: tuple[NvmlBackend, MigNvmlLib],
) -> None:
    backend, fake = mig_backend
    with pytest.raises(MigPlacementRefused, match=r"not one of the profile's possible placements"):
        backend.create_mig_device(UUIDS[2], "3g.40gb", Placement(2, 4))
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake.calls


def test_mig_compute_instance_failure_destroys_the_gpu_instance(
    mig_backend: tuple[NvmlBackend, MigNvmlLib],
) -> None:
    backend, fake = mig_backend
    fake.fail_ci = INSUFFICIENT_RESOURCES
    with pytest.raises(MigError, match=r"creating the compute instance of 2g\.20gb"):
        backend.create_mig_device(UUIDS[2], "2g.20gb", Placement(2, 2))
    assert fake.instances[2] == {}
    assert "nvmlGpuInstanceDestroy" in fake.calls


def test_mig_create_on_disabled_and_unknown_profile(mig_backend: tuple[NvmlBackend, MigNvmlLib]) -> None:
    backend, _ = mig_backend
    with pytest.raises(
        MigDisabled, match=r"MIG mode is disabled on GPU 0 \(GPU-00000000.*nvidia-smi -i 0 -mig 1"
    ):
        backend.create_mig_device(UUIDS[0], "1g.10gb", Placement(0, 1))
    with pytest.raises(MigProfileUnknown, match=r"no MIG profile '1g.5gb'"):
        backend.create_mig_device(UUIDS[2], "1g.5gb", Placement(0, 1))


def test_mig_destroy_in_use_and_unknown(mig_backend: tuple[NvmlBackend, MigNvmlLib]) -> None:
    backend, fake = mig_backend
    backend.create_mig_device(UUIDS[2], "7g.80gb", Placement(0, 8))
    fake.instances[2][1].busy = True
    with pytest.raises(MigInUse, match="in use"):
        backend.destroy_mig_device(UUIDS[2], 1)
    assert 1 in fake.instances[2]
    with pytest.raises(MigInstanceNotFound):
        backend.destroy_mig_device(UUIDS[2], 5)
