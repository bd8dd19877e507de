"""Choose and build the GPU backend. Pure of the environment: the config (`hami_node.config`) reads
`--gpu-backend` / `HAMI_GPU_BACKEND` and `--fake-inventory` / `HAMI_FAKE_INVENTORY`; `main` passes them
here."""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from hami_node.gpu.backend import GPUBackend

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver


class GPUBackendKind(StrEnum):
    """Which GPU backend (`--gpu-backend`): NVML on a real node, or the fake inventory file."""

    NVML = "nvml"
    FAKE = "fake"


class BackendConfigError(ValueError):
    """A backend choice that cannot work (unknown kind, fake without inventory, nvml with one)."""


def device_node_exists(kind: GPUBackendKind) -> Callable[[str], bool]:
    """Whether a device node (`/dev/nvidiactl`, ...) exists, for the CDI spec. The fake backend's GPUs
    have no device nodes here: it names the control nodes a real node has."""
    if kind is GPUBackendKind.FAKE:
        return lambda _path: True
    return os.path.exists


def open_backend(
    kind: GPUBackendKind | str,
    fake_inventory: Path | None = None,
    *,
    observer_factory: Callable[[], BaseObserver] | None = None,
) -> GPUBackend:
    """The backend named `kind`, not yet initialised (call `init()`).

    Raises `BackendConfigError` for a bad combination and, for "fake", `InventoryError` when the
    inventory file is missing or bad (the message names the file, the entry and the field).
    """
    if kind == "nvml":
        if fake_inventory is not None:
            raise BackendConfigError(
                f"gpu backend: a fake inventory ({fake_inventory}) is only used with the fake backend, "
                "not with nvml; drop it or choose the fake backend"
            )
        from hami_node.gpu.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "fake":
        if fake_inventory is None:
            raise BackendConfigError(
                "gpu backend: the fake backend needs an inventory file (--fake-inventory FILE or "
                "HAMI_FAKE_INVENTORY; see docs/fake-gpus.md)"
            )
        from hami_node.gpu.fake import FakeBackend

        if observer_factory is None:
            return FakeBackend(fake_inventory)
        return FakeBackend(fake_inventory, observer_factory=observer_factory)
    raise BackendConfigError(
        f"gpu backend: expected one of {', '.join(k.value for k in GPUBackendKind)}, got {kind!r}"
    )
