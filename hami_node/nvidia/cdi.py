"""The CDI spec of NVIDIA's devices in NVIDIA's modes, as NVIDIA's k8s-device-plugin (v0.20.0) writes it
when a `cdi-annotations` or `cdi-cri` device-list strategy is configured (internal/cdi/cdi.go
`CreateSpecFile`, through the container toolkit's nvcdi library):

- kind `k8s.device-plugin.nvidia.com/gpu`, file `<spec dir>/k8s.device-plugin.nvidia.com-gpu.json`
  (cdi.go `cdiRoot = "/var/run/cdi"`, CDI's `GenerateNameForSpec` + `.json`); hami-node's
  `--cdi-spec-dir` moves it, as for its own spec (`hami_node.cdi`, same kind and file name: one file
  defines each name whichever mode wrote it);
- one device per GPU and per MIG device, named by the device ID strategy as nvcdi's device namer does
  (nvcdi/namer.go): `uuid` -> the GPU's `GPU-...` or the MIG device's `MIG-...` UUID, `index` -> `0` for
  GPU 0 and `0:1` for MIG device 1 of GPU 0. These are the names Allocate hands out
  (`replicas.container_allocate_response`: `k8s.device-plugin.nvidia.com/gpu=<name>` in the
  `cdi.k8s.io/nvidia-device-plugin_<uuid>` annotation or as CRI CDIDevices);
- a GPU's edit is its device node `/dev/nvidia<minor>`; a MIG device's are its parent's node and its GPU
  instance's and compute instance's capability nodes `/dev/nvidia-caps/nvidia-cap<N>`
  (internal/rm/nvml_devices.go `nvmlMigDevice.GetPaths`; N from the driver's
  `/proc/driver/nvidia-caps/mig-minors`, internal/mig/mig-dp.go);
- common edits: the control nodes that exist and `NVIDIA_VISIBLE_DEVICES=void` (nvcdi wrapper.go
  `GetCommonEdits`).

Differences, on purpose: the devices are the ones this node serves (the device map's GPUs and MIG
devices), where nvcdi lists every GPU not in MIG mode and every MIG device. So under the `none` MIG
strategy a GPU in MIG mode, which NVIDIA's plugin hands out as a whole GPU but nvcdi leaves out of its
spec (the runtime then fails to resolve the name), is defined here. The driver's user-space files and
nvidia-ctk hooks are not in the spec (as in `hami_node.cdi`: see docs/install.md, "CDI"); IMEX channel
specs (`k8s.device-plugin.nvidia.com/imex-channel`) are not written.

The MIG capability nodes (`mig_capability_paths`, from the driver's mig-minors file or its fixed layout)
live in `hami_node.cdi`, which uses them for HAMi's dynamic MIG too; they are re-exported here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hami_node.cdi import (
    CDI_KIND,
    COMPUTE_INSTANCES_PER_GI,
    GPU_INSTANCES_PER_GPU,
    MIG_MINORS_PATH,
    NVIDIA_CAPS_DIR,
    SPEC_FILE_NAME,
    VISIBLE_DEVICES_VOID,
    CdiError,
    MigMinors,
    common_device_nodes,
    default_mig_minor,
    encode_spec,
    mig_capability_paths,
    minimum_version,
    parse_mig_minors,
    read_mig_minors,
    write_spec,
)
from hami_node.nvidia.config import DeviceIDStrategy
from hami_node.nvidia.device_map import Device

log = logging.getLogger(__name__)

_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


# --- the spec ------------------------------------------------------------------------------------------


def cdi_device_name(device: Device, id_strategy: DeviceIDStrategy) -> str:
    """nvcdi's device namer: the GPU's or MIG device's UUID (`uuid`), or its index `<i>` / `<i>:<j>`
    (`index`). A replica is named by the device it is a replica of."""
    return device.uuid if id_strategy is DeviceIDStrategy.UUID else device.index


def build_nvidia_spec(
    devices: Iterable[Device], id_strategy: DeviceIDStrategy, common_nodes: Iterable[str]
) -> dict[str, Any] | None:
    """The spec for these devices (each underlying GPU or MIG device once, in the order first met; its
    edits its `paths`), None when there is none. Raises `CdiError` for a name CDI refuses, a device with
    no device node, or two devices with one name."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for device in devices:
        name = cdi_device_name(device, id_strategy)
        if name in seen:
            continue
        seen.add(name)
        if not _DEVICE_NAME.fullmatch(name):
            raise CdiError(
                f"device {name!r} cannot be named in a CDI spec: a CDI device name has only letters, "
                "digits and _ - . : and starts and ends with a letter or digit"
            )
        if not device.paths:
            raise CdiError(f"device {name}: no device node to put in the CDI spec")
        nodes = [{"path": p} for p in dict.fromkeys(device.paths)]
        out.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
    if not out:
        return None
    edits: dict[str, Any] = {"env": [VISIBLE_DEVICES_VOID]}
    common = list(common_nodes)
    if common:
        edits["deviceNodes"] = [{"path": p} for p in common]
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": out, "containerEdits": edits}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


class NvidiaCdiSpec:
    """Writes NVIDIA's spec for the devices served (`write`), before any plugin hands out a CDI name. The
    file is rewritten only when its bytes change, and left when the daemon stops (kubelet restarts
    admitted pods' containers without Allocate and the runtime resolves their names again), as
    `hami_node.cdi.CdiSpecWriter` does for hami-core mode; a later start without a CDI strategy removes
    it (`hami_node.cdi.remove_stale`, which recognises this spec as hami-node's)."""

    def __init__(self, spec_dir: Path, id_strategy: DeviceIDStrategy, exists: Callable[[str], bool]) -> None:
        self._dir = spec_dir
        self._strategy = id_strategy
        self._exists = exists
        self._written: bytes | None = None

    @property
    def path(self) -> Path:
        return self._dir / SPEC_FILE_NAME

    def write(self, devices: Iterable[Device]) -> dict[str, Any] | None:
        """Write the spec of `devices` (removing the file when there is none); returns the spec. Raises
        `CdiError` naming the file when it cannot be built or written."""
        spec = build_nvidia_spec(devices, self._strategy, common_device_nodes(self._exists))
        data = b"" if spec is None else encode_spec(spec)
        if data == self._written:
            return spec
        try:
            if spec is None:
                self.path.unlink(missing_ok=True)
                log.info("no device to define: removed the CDI spec %s", self.path)
            else:
                write_spec(self._dir, data)
                names = ", ".join(d["name"] for d in spec["devices"])
                log.info("wrote NVIDIA's CDI spec %s: %s", self.path, names)
        except OSError as err:
            raise CdiError(f"cannot write the CDI spec {self.path}: {err}") from None
        self._written = data
        return spec


__all__ = [
    "COMPUTE_INSTANCES_PER_GI",
    "GPU_INSTANCES_PER_GPU",
    "MIG_MINORS_PATH",
    "NVIDIA_CAPS_DIR",
    "MigMinors",
    "NvidiaCdiSpec",
    "build_nvidia_spec",
    "cdi_device_name",
    "default_mig_minor",
    "mig_capability_paths",
    "parse_mig_minors",
    "read_mig_minors",
]
