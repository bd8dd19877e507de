"""The CDI (Container Device Interface) spec for this node's GPUs, for the `cdi-annotations` and `cdi-cri`
device-list strategies: Allocate names each GPU as `k8s.device-plugin.nvidia.com/gpu=<GPU-UUID>`
(`qualified_name`), and the container runtime (containerd >= 1.7, CRI-O >= 1.24, or the NVIDIA runtime
in CDI mode) resolves that name through a spec file in its CDI spec directories (`/etc/cdi`,
`/var/run/cdi`). This module builds and keeps that file.

The kind is NVIDIA's device plugin's and HAMi's (vendor `k8s.device-plugin.nvidia.com`, class `gpu`),
and so is the file name (`k8s.device-plugin.nvidia.com-gpu.json`, CDI's `GenerateSpecName(vendor,
class)`): a node moved from HAMi gets HAMi's spec replaced, never a second spec defining the same device
names (a runtime refuses devices defined twice).

What the spec holds, and why only that:

- one device per GPU, named by its UUID, whose edit is the GPU's device node `/dev/nvidia<minor>`;
- with HAMi's dynamic MIG (operating mode mig), one device per live MIG instance, named by its MIG UUID,
  whose edits are its GPU's node and its GPU and compute instance capability nodes
  `/dev/nvidia-caps/nvidia-cap<N>` (N from the driver's `/proc/driver/nvidia-caps/mig-minors`, or its
  fixed layout without one: `default_mig_minor`), as NVIDIA's device plugin names a MIG device
  (internal/rm/nvml_devices.go `nvmlMigDevice.GetPaths`). The spec is rewritten synchronously after
  each instance is created (before Allocate hands its name out) or destroyed (`CdiSpecWriter.refresh`);
- common edits applied with any of them: the control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools`, those that exist) and `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's generator
  (nvcdi) writes, so a runtime hook in legacy mode does not inject every GPU because the image says
  `NVIDIA_VISIBLE_DEVICES=all`.

HAMi-core's per-container edits (CUDA_DEVICE_MEMORY_LIMIT_*, the cache directory mount, ld.so.preload,
MPS) stay in the Allocate response: kubelet hands a response's envs and mounts to the runtime with every
device-list strategy, so they reach the container without a per-allocation spec, and a spec file per
container would have to outlive the daemon for kubelet's container restarts. The spec holds only what is
the same for every container that gets a GPU. It does not carry the driver's user-space files
(libcuda.so, nvidia-smi): see docs/install.md, "CDI".

DRA mode (`hami_node.dra`) writes through the same functions one transient spec per prepared claim:
kind `k8s.gpu.hami.io/claim`, file `k8s.gpu.hami.io-claim_<claimUID>.json` (CDI's
GenerateTransientSpecName), devices named `<claimUID>-<device>-<shareID or whole>` (never reused: a
runtime may cache specs, and a claim UID is never reused), built by `build_claim_spec` from the edits the
DRA plugin computes; `remove_spec` deletes it on NodeUnprepareResources.

The file is written atomically and durably (`hami_node.durable.write_atomic`), rewritten when
the GPU list changes (a GPU gone is no longer defined), removed when the node has no GPU (a CDI spec must
define at least one device), and never removed when the daemon stops: kubelet restarts the containers of
admitted pods without calling Allocate, and the runtime resolves their CDI names again then. At start-up
the temporary files of an interrupted write are removed and, when no CDI strategy is configured, a spec
this daemon wrote (`written_by_us`; NVIDIA's or HAMi's file of the same name is left alone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hami_node.durable import TMP_SUFFIX, fsync_directory, is_temporary, remove_durably, write_atomic

if TYPE_CHECKING:
    from hami_node.devices import DeviceState

log = logging.getLogger(__name__)

CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_CLASS = "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
"""The CDI kind of NVIDIA's device plugin and HAMi: a GPU's CDI name is `<kind>=<uuid>`."""
SPEC_FILE_NAME = f"{CDI_VENDOR}-{CDI_CLASS}.json"
"""CDI's GenerateSpecName(vendor, class), as NVIDIA's device plugin and HAMi name their spec."""
DEFAULT_SPEC_DIR = "/var/run/cdi"

CLAIM_VENDOR = "k8s.gpu.hami.io"
CLAIM_CLASS = "claim"
CLAIM_KIND = f"{CLAIM_VENDOR}/{CLAIM_CLASS}"
"""The CDI kind of the DRA plugin's per-claim specs (NVIDIA's DRA driver's is `k8s.gpu.nvidia.com/claim`)."""

CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
"""Released CDI spec versions a reader accepts, oldest first (CDI 1.1.0 reads 0.3.0 and later)."""

COMMON_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Device nodes every CUDA container needs besides its GPUs' own nodes."""
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"

_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
"""CDI's ValidateDeviceName (pkg/parser/parser.go): letters, digits, `_ - . :`; alphanumeric ends."""
_SPEC_KEYS = frozenset({"cdiVersion", "kind", "devices", "containerEdits"})


MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
NVIDIA_CAPS_DIR = "/dev/nvidia-caps"
GPU_INSTANCES_PER_GPU = 15
"""The driver's mig-minors layout: GPU instance IDs 0..14 per GPU."""
COMPUTE_INSTANCES_PER_GI = 8
"""... and compute instance IDs 0..7 per GPU instance."""
_FIRST_GPU_MINOR = 3
"""`config 1`, `monitor 2`, then `gpu0/gi0/access 3`."""
MigMinors = Mapping[tuple[int, int, int | None], int]
"""Parsed mig-minors: (gpu minor, GPU instance ID, compute instance ID or None for the GI) -> minor."""
_MINORS_LINE = re.compile(r"gpu([0-9]+)/gi([0-9]+)(?:/ci([0-9]+))?/access\s+([0-9]+)")


class CdiError(Exception):
    """The spec cannot be built or written; the message says what to fix."""


class CdiGpu(Protocol):
    """What the spec needs of a GPU (`hami_node.devices.GPUStatus` fits): its UUID and the N of
    /dev/nvidiaN."""

    @property
    def uuid(self) -> str: ...

    @property
    def minor(self) -> int: ...


@dataclass(frozen=True, slots=True)
class MigCdiDevice:
    """A MIG device of HAMi's dynamic MIG for the spec: its UUID (the CDI name), its GPU's UUID, and its
    GPU and compute instance IDs (which give its capability nodes)."""

    uuid: str
    gpu_uuid: str
    gpu_instance_id: int
    compute_instance_id: int


class MigSource(Protocol):
    """What the spec writer needs of HAMi's dynamic MIG (`hami_node.mig_manager.MigManager` fits): the
    live MIG devices, and a call after each change."""

    def cdi_devices(self) -> list[MigCdiDevice]: ...

    def add_listener(self, listener: Callable[[], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class SpecGpu:
    """A plain `CdiGpu`."""

    uuid: str
    minor: int


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


# --- pure ------------------------------------------------------------------------------------------------


def qualified_name(uuid: str) -> str:
    """The fully qualified CDI name Allocate returns for a GPU: `<vendor>/<class>=<uuid>`."""
    return f"{CDI_KIND}={uuid}"


def device_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest released CDI version that has every feature the spec uses, by the rules of CDI's
    MinimumRequiredVersion (specs-go/version.go) for the fields this module writes: annotations (or a dot
    in the class) need 0.6.0, a device name starting with a digit or a device node's hostPath need 0.5.0,
    else 0.3.0. Writing the minimum rather than the newest lets runtimes with an older CDI library
    (containerd 1.7) read the spec; a 1.1.0 reader accepts it all the same."""
    devices = spec.get("devices") or []
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in devices)]
    _, _, cls = str(spec.get("kind", "")).partition("/")
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in cls:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def claim_spec_file_name(claim_uid: str) -> str:
    """The transient spec file of one claim: CDI's GenerateTransientSpecName(vendor, class, uid) plus
    `.json` (pkg/cdi/spec.go): `k8s.gpu.hami.io-claim_<claimUID>.json`."""
    return f"{CLAIM_VENDOR}-{CLAIM_CLASS}_{claim_uid}.json"


def claim_device_id(name: str) -> str:
    """The fully qualified CDI device ID of a device of a claim spec: `k8s.gpu.hami.io/claim=<name>`."""
    return f"{CLAIM_KIND}={name}"


def build_claim_spec(
    devices: Sequence[tuple[str, Mapping[str, Any]]], common_edits: Mapping[str, Any]
) -> dict[str, Any]:
    """One claim's spec: a device per (name, containerEdits) pair, in that order, and `common_edits`
    applied whenever any of them is injected; empty edit lists are left out. Raises `CdiError` for a
    device name CDI refuses, a name given twice, or no device at all."""
    if not devices:
        raise CdiError("a CDI spec must define at least one device")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name, edits in devices:
        if not _DEVICE_NAME.fullmatch(name):
            raise CdiError(
                f"{name!r} cannot name a CDI device: a CDI device name has only letters, digits and "
                "_ - . : and starts and ends with a letter or digit"
            )
        if name in seen:
            raise CdiError(f"CDI device {name} is defined twice")
        seen.add(name)
        out.append({"name": name, "containerEdits": _compact(edits)})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CLAIM_KIND, "devices": out}
    common = _compact(common_edits)
    if common:
        spec["containerEdits"] = common
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _compact(edits: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) for key, value in edits.items() if value}


def build_spec(
    gpus: Iterable[CdiGpu],
    common_nodes: Sequence[str],
    mig: Iterable[MigCdiDevice] = (),
    minors: MigMinors | None = None,
) -> dict[str, Any] | None:
    """The spec for these GPUs (in their order) with `common_nodes` as common edits, then HAMi's dynamic
    MIG devices `mig` (named by MIG UUID; edits their GPU's node and their GI/CI capability nodes,
    `mig_capability_paths` with `minors`); None when there is no GPU (a spec without devices is invalid).
    A MIG device on a GPU not listed is left out. Raises `CdiError` for a UUID that is not a valid CDI
    device name, or two devices with one UUID."""
    devices: list[dict[str, Any]] = []
    seen: set[str] = set()
    gpus = list(gpus)
    minor_of = {g.uuid: g.minor for g in gpus}
    for gpu in gpus:
        if not _DEVICE_NAME.fullmatch(gpu.uuid):
            raise CdiError(
                f"GPU {gpu.uuid!r} cannot be named in a CDI spec: a CDI device name has only letters, "
                "digits and _ - . : and starts and ends with a letter or digit"
            )
        if gpu.uuid in seen:
            raise CdiError(f"GPU {gpu.uuid} is listed twice")
        seen.add(gpu.uuid)
        devices.append(
            {"name": gpu.uuid, "containerEdits": {"deviceNodes": [{"path": device_node(gpu.minor)}]}}
        )
    if not devices:
        return None
    for m in mig:
        parent = minor_of.get(m.gpu_uuid)
        if parent is None:
            continue
        if not _DEVICE_NAME.fullmatch(m.uuid):
            raise CdiError(f"MIG device {m.uuid!r} cannot be named in a CDI spec")
        if m.uuid in seen:
            raise CdiError(f"MIG device {m.uuid} is listed twice")
        seen.add(m.uuid)
        try:
            caps = mig_capability_paths(parent, m.gpu_instance_id, m.compute_instance_id, minors)
        except ValueError as err:
            raise CdiError(f"MIG device {m.uuid} on GPU {m.gpu_uuid}: {err}") from None
        nodes = [{"path": p} for p in (device_node(parent), *caps)]
        devices.append({"name": m.uuid, "containerEdits": {"deviceNodes": nodes}})
    edits: dict[str, Any] = {"env": [VISIBLE_DEVICES_VOID]}
    if common_nodes:
        edits["deviceNodes"] = [{"path": path} for path in common_nodes]
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": devices, "containerEdits": edits}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def encode_spec(spec: Mapping[str, Any]) -> bytes:
    """The file's bytes: JSON, two-space indent, a final newline (stable, so unchanged specs compare
    equal)."""
    return (json.dumps(spec, indent=2) + "\n").encode()


def written_by_us(data: bytes) -> bool:
    """Whether a spec file's bytes have the shape `build_spec` or, in NVIDIA's modes,
    `hami_node.nvidia.cdi.build_nvidia_spec` writes (our kind; each device a /dev/nvidiaN node, a MIG
    device's followed by its two /dev/nvidia-caps/nvidia-capN nodes; common edits only the void env and
    control nodes). NVIDIA's and HAMi's specs for the same kind carry the driver's mounts and hooks, so
    they never pass."""
    try:
        spec = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's recursion limit
        return False
    if not isinstance(spec, dict) or spec.get("kind") != CDI_KIND or set(spec) - _SPEC_KEYS:
        return False
    edits = spec.get("containerEdits")
    devices = spec.get("devices")
    if not isinstance(edits, dict) or not isinstance(devices, list) or set(edits) - {"env", "deviceNodes"}:
        return False
    if edits.get("env") != [VISIBLE_DEVICES_VOID]:
        return False
    nodes = edits.get("deviceNodes", [])
    if not isinstance(nodes, list) or any(n not in [{"path": p} for p in COMMON_DEVICE_NODES] for n in nodes):
        return False
    for device in devices:
        if not isinstance(device, dict) or set(device) != {"name", "containerEdits"}:
            return False
        node = device["containerEdits"]
        if not isinstance(node, dict) or set(node) != {"deviceNodes"}:
            return False
        nodes = node["deviceNodes"]
        if (
            not isinstance(nodes, list)
            or len(nodes) not in (1, 3)
            or not all(isinstance(n, dict) for n in nodes)
        ):
            return False
        if any(set(n) != {"path"} or not isinstance(n["path"], str) for n in nodes):
            return False
        if not re.fullmatch(r"/dev/nvidia[0-9]+", nodes[0]["path"]):
            return False
        if any(not re.fullmatch(r"/dev/nvidia-caps/nvidia-cap[0-9]+", n["path"]) for n in nodes[1:]):
            return False
    return True


def common_device_nodes(exists: Callable[[str], bool]) -> tuple[str, ...]:
    """The `COMMON_DEVICE_NODES` for which `exists(path)` holds, in that order."""
    return tuple(path for path in COMMON_DEVICE_NODES if exists(path))


# --- files -----------------------------------------------------------------------------------------------


def write_spec(spec_dir: Path, data: bytes, file_name: str = SPEC_FILE_NAME) -> Path:
    """Write a spec file (the node's, or `file_name`: a claim's) atomically and durably
    (`hami_node.durable.write_atomic`, mode 0644: its temporary file is hidden and ends in .tmp, so a
    runtime scanning the directory for *.json and *.yaml never reads it half-written). Creates
    `spec_dir` if needed. Raises OSError."""
    return write_atomic(spec_dir / file_name, data)


def remove_spec(spec_dir: Path, file_name: str) -> bool:
    """Remove one spec file (a claim's); whether it was there. Raises OSError for what cannot be removed."""
    return remove_durably(spec_dir / file_name)


def remove_stale_claim_temps(spec_dir: Path) -> list[Path]:
    """Remove the temporary files of interrupted writes of claim specs (recognised by name; the specs
    themselves belong to prepared claims and stay). A missing directory is nothing to do."""
    removed: list[Path] = []
    try:
        names = os.listdir(spec_dir)
    except FileNotFoundError:
        return removed
    prefix = f".{CLAIM_VENDOR}-{CLAIM_CLASS}_"
    for name in names:
        if name.startswith(prefix) and name.endswith(TMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                (spec_dir / name).unlink()
                removed.append(spec_dir / name)
    return removed


def remove_stale(spec_dir: Path, *, spec_too: bool) -> list[Path]:
    """Remove what a previous run of this daemon left in `spec_dir`: temporary files of an interrupted
    write (recognised by name) and, with `spec_too`, the spec file if `written_by_us` (a spec of the same
    name written by NVIDIA's or HAMi's device plugin is left alone). Returns what was removed; a missing
    directory is nothing to do. Raises OSError for what cannot be read or removed."""
    removed: list[Path] = []
    try:
        names = os.listdir(spec_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        ours = is_temporary(name, SPEC_FILE_NAME)
        if name == SPEC_FILE_NAME and spec_too:
            try:
                ours = written_by_us((spec_dir / name).read_bytes())
            except FileNotFoundError:
                continue
            if not ours:
                log.info("left %s alone: it was not written by hami-node", spec_dir / name)
        if ours:
            path = spec_dir / name
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    if removed:
        fsync_directory(spec_dir)
    return removed


# --- keeping it current ----------------------------------------------------------------------------------


class CdiSpecWriter:
    """Keeps `<spec_dir>/k8s.device-plugin.nvidia.com-gpu.json` equal to the node's GPU list.

    `start()` removes stale temporary files and writes the spec for the GPUs listed now (so the plugin
    never hands out a CDI name the runtime cannot resolve), raising `CdiError` when that fails; then a
    thread rewrites it on every change of the GPU list (health changes do not change the spec) and
    retries a failed write every `retry_s`. Before the GPUs are first listed (NVML failing at start) the
    file is left as it is. `stop()` joins the thread and leaves the file (see the module docstring).
    """

    def __init__(
        self,
        state: DeviceState,
        spec_dir: Path,
        device_exists: Callable[[str], bool],
        *,
        retry_s: float = 5.0,
        mig: MigSource | None = None,
        mig_minors: Callable[[], MigMinors | None] = read_mig_minors,
    ) -> None:
        self._state = state
        self._dir = spec_dir
        self._exists = device_exists
        self._retry_s = retry_s
        self._mig = mig
        self._mig_minors = mig_minors
        self._sync_lock = threading.Lock()
        if mig is not None:
            mig.add_listener(self.refresh)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._written: bytes | None = None
        """What the file holds now (b"" = no file), None = unknown."""
        self._writes = 0
        self._cond = threading.Condition()

    @property
    def path(self) -> Path:
        return self._dir / SPEC_FILE_NAME

    @property
    def writes(self) -> int:
        """How many times the file was written or removed."""
        with self._cond:
            return self._writes

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("CDI spec writer already started")
        try:
            for path in remove_stale(self._dir, spec_too=False):
                log.info("removed %s, left by an interrupted write", path)
        except OSError as err:
            raise CdiError(f"cannot clean the CDI spec directory {self._dir}: {err}") from None
        with contextlib.suppress(OSError):
            if not written_by_us(self.path.read_bytes()):
                log.warning(
                    "%s was written by another producer (HAMi's or NVIDIA's device plugin?); hami-node "
                    "replaces it: one spec defines each CDI device",
                    self.path,
                )
        if self._state.listed:
            try:
                self._sync()
            except OSError as err:
                raise CdiError(f"cannot write the CDI spec {self.path}: {err}") from None
        self._thread = threading.Thread(target=self._run, name="hami-cdi-spec", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._state.wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def wait_writes(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` writes happened (for tests). False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._writes > after, timeout_s)

    def _run(self) -> None:
        version = self._state.version
        failed = False
        while not self._stopping.is_set():
            timeout = self._retry_s if failed else None
            current = self._state.wait_for_change(version, timeout, self._stopping.is_set)
            if self._stopping.is_set():
                return
            if current == version and not failed:
                continue
            version = current
            if not self._state.listed:
                continue
            try:
                self._sync()
                failed = False
            except (OSError, CdiError) as err:
                if not failed:
                    log.error("cannot update the CDI spec %s (retrying): %s", self.path, err)
                failed = True

    def refresh(self) -> None:
        """Rewrite the spec now, synchronously (HAMi's dynamic MIG calls it after creating or destroying
        an instance, before Allocate hands the MIG device's CDI name out). Raises `CdiError` naming the
        file."""
        if not self._state.listed:
            return
        try:
            self._sync()
        except OSError as err:
            raise CdiError(f"cannot write the CDI spec {self.path}: {err}") from None

    def _sync(self) -> None:
        with self._sync_lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        gpus = [SpecGpu(g.uuid, g.info.minor) for g in self._state.gpus()]
        mig = self._mig.cdi_devices() if self._mig is not None else []
        minors = self._mig_minors() if mig else None
        spec = build_spec(gpus, common_device_nodes(self._exists), mig, minors)
        data = b"" if spec is None else encode_spec(spec)
        if data == self._written:
            return
        if spec is None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            log.info("no GPU left: removed the CDI spec %s", self.path)
        else:
            write_spec(self._dir, data)
            log.info("wrote the CDI spec %s: %s", self.path, ", ".join(d["name"] for d in spec["devices"]))
        with self._cond:
            self._written = data
            self._writes += 1
            self._cond.notify_all()


def cdi_spec_writer(
    state: DeviceState,
    spec_dir: Path,
    device_exists: Callable[[str], bool],
    *,
    enabled: bool,
    mig: MigSource | None = None,
) -> CdiSpecWriter | None:
    """The spec writer when a cdi-* device-list strategy is `enabled` (with `mig`, HAMi's dynamic MIG
    devices too, the spec rewritten on each of its changes). Without one, a spec a CDI run of this daemon
    left is removed (it would define the GPUs for nothing; a failure to remove it is logged, never fatal)
    and None is returned."""
    if enabled:
        return CdiSpecWriter(state, spec_dir, device_exists, mig=mig)
    try:
        for path in remove_stale(spec_dir, spec_too=True):
            log.info("removed the CDI spec %s: no cdi-* device-list strategy is configured", path)
    except OSError as exc:
        log.warning("cannot remove a stale CDI spec from %s: %s", spec_dir, exc)
    return None


__all__ = [
    "CDI_CLASS",
    "CDI_KIND",
    "CDI_VENDOR",
    "CDI_VERSIONS",
    "CLAIM_CLASS",
    "CLAIM_KIND",
    "CLAIM_VENDOR",
    "COMMON_DEVICE_NODES",
    "COMPUTE_INSTANCES_PER_GI",
    "DEFAULT_SPEC_DIR",
    "GPU_INSTANCES_PER_GPU",
    "MIG_MINORS_PATH",
    "NVIDIA_CAPS_DIR",
    "SPEC_FILE_NAME",
    "VISIBLE_DEVICES_VOID",
    "CdiError",
    "CdiGpu",
    "CdiSpecWriter",
    "MigCdiDevice",
    "MigMinors",
    "MigSource",
    "SpecGpu",
    "build_claim_spec",
    "build_spec",
    "cdi_spec_writer",
    "claim_device_id",
    "claim_spec_file_name",
    "common_device_nodes",
    "default_mig_minor",
    "device_node",
    "encode_spec",
    "mig_capability_paths",
    "minimum_version",
    "parse_mig_minors",
    "qualified_name",
    "read_mig_minors",
    "remove_spec",
    "remove_stale",
    "remove_stale_claim_temps",
    "write_spec",
    "written_by_us",
]
