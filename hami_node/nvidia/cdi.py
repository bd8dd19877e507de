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

When the mig-minors file is absent (the fake backend, a node without MIG), the capability minors follow
the driver's fixed layout (`default_mig_minor`): `config 1`, `monitor 2`, then per GPU minor g 15 GPU
instances of 9 minors each (the GI's access node, then its 8 compute instances).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from hami_node.cdi import (
    CDI_KIND,
    SPEC_FILE_NAME,
    VISIBLE_DEVICES_VOID,
    CdiError,
    common_device_nodes,
    encode_spec,
    minimum_version,
    write_spec,
)
from hami_node.nvidia.config import DeviceIDStrategy
from hami_node.nvidia.device_map import Device

log = logging.getLogger(__name__)

MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
NVIDIA_CAPS_DIR = "/dev/nvidia-caps"
GPU_INSTANCES_PER_GPU = 15
"""The driver's mig-minors layout: GPU instance IDs 0..14 per GPU."""
COMPUTE_INSTANCES_PER_GI = 8
"""... and compute instance IDs 0..7 per GPU instance."""
_FIRST_GPU_MINOR = 3
"""`config 1`, `monitor 2`, then `gpu0/gi0/access 3`."""
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
MigMinors = Mapping[tuple[int, int, int | None], int]
"""Parsed mig-minors: (gpu minor, GPU instance ID, compute instance ID or None for the GI) -> minor."""
_MINORS_LINE = re.compile(r"gpu([0-9]+)/gi([0-9]+)(?:/ci([0-9]+))?/access\s+([0-9]+)")


# --- MIG capability device nodes --------------------------------------------------------------------------


def default_mig_minor(gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> int:
    """The capability minor of a GPU instance (`compute_instance` None) or of one of its compute instances
    in the driver's fixed mig-minors layout. Raises `ValueError` for an ID outside it."""
    if gpu_minor < 0:
        raise ValueError(f"gpu minor: expected >= 0, got {gpu_minor}")
    if not 0 <= gpu_instance < GPU_INSTANCES_PER_GPU:
        raise ValueError(f"GPU instance ID: expected 0..{GPU_INSTANCES_PER_GPU - 1}, got {gpu_instance}")
    if compute_instance is not None and not 0 <= compute_instance < COMPUTE_INSTANCES_PER_GI:
        raise ValueError(
            f"compute instance ID: expected 0..{COMPUTE_INSTANCES_PER_GI - 1}, got {compute_instance}"
        )
    per_gi = 1 + COMPUTE_INSTANCES_PER_GI
    gi_minor = _FIRST_GPU_MINOR + gpu_minor * GPU_INSTANCES_PER_GPU * per_gi + gpu_instance * per_gi
    return gi_minor if compute_instance is None else gi_minor + 1 + compute_instance


def parse_mig_minors(text: str) -> dict[tuple[int, int, int | None], int]:
    """The driver's `/proc/driver/nvidia-caps/mig-minors`: (gpu minor, GI, CI or None) -> capability
    minor. Lines that are neither a GI nor a CI access line (`config 1`, `monitor 2`, anything else) are
    skipped, as NVIDIA's GetMigCapabilityDevicePaths skips what it cannot parse."""
    out: dict[tuple[int, int, int | None], int] = {}
    for line in text.splitlines():
        match = _MINORS_LINE.fullmatch(line.strip())
        if match is None:
            continue
        gpu, gi, ci, minor = match.groups()
        out[(int(gpu), int(gi), None if ci is None else int(ci))] = int(minor)
    return out


def read_mig_minors(path: str = MIG_MINORS_PATH) -> dict[tuple[int, int, int | None], int] | None:
    """The parsed mig-minors file, or None when there is none (no MIG-capable driver, a fake node)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_mig_minors(f.read())
    except FileNotFoundError:
        return None


def mig_capability_paths(
    gpu_minor: int,
    gpu_instance: int,
    compute_instance: int,
    minors: MigMinors | None = None,
) -> tuple[str, str]:
    """The GPU instance's and the compute instance's capability device nodes
    (`/dev/nvidia-caps/nvidia-cap<N>`), from `minors` (`parse_mig_minors`) or, without it, the driver's
    fixed layout. Raises `CdiError` when `minors` lacks one, with NVIDIA's text (nvml_devices.go)."""
    if minors is None:
        gi = default_mig_minor(gpu_minor, gpu_instance)
        ci = default_mig_minor(gpu_minor, gpu_instance, compute_instance)
    else:
        found_gi = minors.get((gpu_minor, gpu_instance, None))
        if found_gi is None:
            raise CdiError(
                "missing MIG GPU instance capability path: /proc/driver/nvidia/capabilities/"
                f"gpu{gpu_minor}/mig/gi{gpu_instance}/access"
            )
        found_ci = minors.get((gpu_minor, gpu_instance, compute_instance))
        if found_ci is None:
            raise CdiError(
                "missing MIG compute instance capability path: /proc/driver/nvidia/capabilities/"
                f"gpu{gpu_minor}/mig/gi{gpu_instance}/ci{compute_instance}/access"
            )
        gi, ci = found_gi, found_ci
    return f"{NVIDIA_CAPS_DIR}/nvidia-cap{gi}", f"{NVIDIA_CAPS_DIR}/nvidia-cap{ci}"


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
