"""GPU backends (NVML and a fake inventory) behind one small interface.

`backend` holds the interface (`GPUBackend`), its values (`PhysicalGPU`, `GPUEvent`, `TopologyLevel`,
`GPULink`, `MigMode`, `MigDevice`) and errors; `select.open_backend` builds one; `topology` turns links
into HAMi's pair scores. The implementations (`nvml`, `fake`) are imported only when chosen, so a node
without a driver never imports pynvml and a real node never imports watchdog here.
"""

from hami_node.gpu.backend import (
    DeviceLost,
    GPUBackend,
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
)
from hami_node.gpu.select import BackendConfigError, GPUBackendKind, open_backend

__all__ = [
    "BackendConfigError",
    "DeviceLost",
    "GPUBackend",
    "GPUBackendError",
    "GPUBackendKind",
    "GPUEvent",
    "GPUEventKind",
    "GPUFailed",
    "GPULink",
    "GPUNotFound",
    "GPUUsage",
    "LibraryNotFound",
    "MigAttributes",
    "MigDevice",
    "MigDisabled",
    "MigError",
    "MigInUse",
    "MigInstanceNotFound",
    "MigMode",
    "MigPlacementRefused",
    "MigProfileUnknown",
    "NvmlFailed",
    "PhysicalGPU",
    "TopologyLevel",
    "open_backend",
]
