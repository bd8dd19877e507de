"""GPU backends (NVML and a fake inventory) behind one small interface.

`backend` holds the interface (`GpuBackend`), its values (`GpuInfo`, `GpuEvent`, `TopologyLevel`,
`GpuLink`) and errors; `select.open_backend` builds one; `topology` turns links into HAMi's pair
scores. The implementations (`nvml`, `fake`) are imported only when chosen, so a node without a driver
never imports pynvml and a real node never imports watchdog here.
"""

from hami_node.gpu.backend import (
    DeviceLost,
    GpuBackend,
    GpuBackendError,
    GpuEvent,
    GpuEventKind,
    GpuFailed,
    GpuInfo,
    GpuLink,
    GpuNotFound,
    LibraryNotFound,
    NvmlFailed,
    TopologyLevel,
)
from hami_node.gpu.select import BACKEND_KINDS, BackendConfigError, BackendKind, open_backend

__all__ = [
    "BACKEND_KINDS",
    "BackendConfigError",
    "BackendKind",
    "DeviceLost",
    "GpuBackend",
    "GpuBackendError",
    "GpuEvent",
    "GpuEventKind",
    "GpuFailed",
    "GpuInfo",
    "GpuLink",
    "GpuNotFound",
    "LibraryNotFound",
    "NvmlFailed",
    "TopologyLevel",
    "open_backend",
]
