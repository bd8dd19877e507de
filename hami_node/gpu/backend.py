"""The one interface between the node daemon and its GPUs, with the typed values and errors it speaks.

Two implementations: `hami_node.gpu.nvml.NvmlBackend` (the real driver through NVML) and
`hami_node.gpu.fake.FakeBackend` (an inventory file with fault injection). Nothing of NVML leaks past
this interface: callers see `PhysicalGPU`, `GPUEvent`, `TopologyLevel`, `GPULink` and the errors below.

Errors, from the caller's point of view:

- `NvmlFailed`: the backend as a whole does not answer (init failed, every call failing, the event wait
  broke). The node's GPUs cannot be trusted: fence them all and retry `init()` with backoff.
- `LibraryNotFound` (a `NvmlFailed`): there is no GPU driver on this node at all.
- `GPUFailed`: a call about one GPU failed; that GPU is not usable now, the others may be.
- `DeviceLost` (a `GPUFailed`): NVML says the GPU is lost (fell off the bus, Xid 79).
- `GPUNotFound` (a `GPUFailed`): no GPU with that UUID.
- `MigError` (a `GPUFailed`): a MIG query, create or destroy on that GPU failed; its subclasses say why
  (`MigDisabled`, `MigProfileUnknown`, `MigPlacementRefused`, `MigInUse`, `MigInstanceNotFound`). A MIG
  error says nothing about the GPU's health: the GPU stays in service.

MIG (`mig_mode`, `mig_profiles`, `mig_devices`, `create_mig_device`, `destroy_mig_device`): the backends
read the MIG layout and create or destroy GPU instances (each with one compute instance spanning it, the
way HAMi v2.10's EnsureAllocation does), but never change a GPU's MIG mode: that needs an idle GPU and
often a reset, which is the administrator's (`nvidia-smi -i <gpu> -mig 1`). A create on a GPU whose MIG
mode is disabled raises `MigDisabled` naming the GPU and the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import NamedTuple, Protocol

from hami_api.mig import GIProfile, Placement


@dataclass(frozen=True, slots=True)
class PhysicalGPU:
    """One physical GPU as its backend sees it.

    `memory_mib` is the total memory in MiB, `minor` the N of /dev/nvidiaN, `numa_node` the host NUMA
    node the GPU hangs off (None when unknown), `pci_bus_id` NVML's form ("00000000:07:00.0").
    `healthy` is False when the backend already knows the GPU is unusable while listing it (the fake's
    `health: false` or `lost: true`; for NVML, a GPU that stopped answering and is reported with the
    last values it answered with), so device IDs stay stable while the GPU is down. `driver_version`
    is the kernel driver's version as NVML writes it ("550.54.15"), None when unknown.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int
    numa_node: int | None
    pci_bus_id: str
    mig_enabled: bool = False
    healthy: bool = True
    driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """What one GPU is doing now (for metrics): memory in bytes, as NVML's nvmlDeviceGetMemoryInfo;
    `utilization_percent` the share of the last sample period a kernel ran and
    `memory_utilization_percent` the memory controller's busy share (nvmlDeviceGetUtilizationRates),
    None where the GPU does not report them."""

    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None = None
    memory_utilization_percent: int | None = None


class GPUEventKind(StrEnum):
    """What an event reports. The value is the name used in the fake inventory file and in logs."""

    XID = "xid"
    """An Xid critical error; `GPUEvent.xid` holds the code (e.g. 79: fallen off the bus)."""
    ECC_DOUBLE_BIT = "ecc-double-bit"
    """An uncorrectable (double bit) ECC error."""
    ECC_SINGLE_BIT = "ecc-single-bit"
    """A corrected (single bit) ECC error; informational."""
    DEVICE_LOST = "device-lost"
    """The GPU stopped answering (NVML_ERROR_GPU_IS_LOST), or the fake GPU was marked `lost`."""
    MONITORING_FAILED = "monitoring-failed"
    """Events cannot be watched for this GPU (registration or reading the event failed): NVIDIA's
    device plugin marks such a GPU unhealthy."""


@dataclass(frozen=True, slots=True)
class GPUEvent:
    """One health event. `uuid` None means "all GPUs" (the event could not be tied to one GPU).

    `xid` is set only for `GPUEventKind.XID`. `gpu_instance_id` / `compute_instance_id` name the MIG
    instance the event is about, None for the whole GPU.
    """

    uuid: str | None
    kind: GPUEventKind
    xid: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def __str__(self) -> str:
        where = self.uuid or "all GPUs"
        what = f"Xid {self.xid}" if self.kind is GPUEventKind.XID else self.kind.value
        if self.gpu_instance_id is not None:
            where += f" (GI {self.gpu_instance_id}, CI {self.compute_instance_id})"
        return f"{what} on {where}"


class TopologyLevel(IntEnum):
    """The PCIe path between two GPUs: NVML's common-ancestor level (nvmlGpuTopologyLevel_t), closest
    first. The integers are ours, not NVML's; NVLink is counted apart (`GPULink.nvlinks`)."""

    SAME_BOARD = 10
    """On the same board (NVML_TOPOLOGY_INTERNAL)."""
    SINGLE_SWITCH = 20
    """Below one PCIe switch (NVML_TOPOLOGY_SINGLE)."""
    MULTI_SWITCH = 30
    """Below several PCIe switches, no host bridge in between (NVML_TOPOLOGY_MULTIPLE)."""
    HOST_BRIDGE = 40
    """Below the same host bridge (NVML_TOPOLOGY_HOSTBRIDGE)."""
    NUMA_NODE = 50
    """Same NUMA node, different host bridges (NVML_TOPOLOGY_NODE)."""
    SYSTEM = 60
    """Across NUMA nodes, through the CPU interconnect (NVML_TOPOLOGY_SYSTEM)."""

    @property
    def label(self) -> str:
        """The name used in the fake inventory file and in logs: "same-board", "numa-node", ..."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def from_label(cls, text: str) -> TopologyLevel:
        """Parse a label ("single-switch", "numa-node"; "_" accepted for "-", any case). Raises ValueError."""
        key = text.strip().upper().replace("-", "_")
        try:
            return cls[key]
        except KeyError:
            choices = ", ".join(level.label for level in cls)
            raise ValueError(f"unknown topology level {text!r} (one of {choices})") from None


@dataclass(frozen=True, slots=True)
class GPULink:
    """How one GPU reaches another, as seen from the first (what HAMi's device plugin reads per pair).

    `level` is the PCIe common ancestor (None: NVML could not tell). `nvlinks` is the number of this
    GPU's enabled NVLinks that reach the other GPU, directly or through NVSwitches (then the smaller
    of the two GPUs' switch link counts). NVML answers per GPU, so the two directions of a pair may
    disagree (an NVLink enabled on one side only); `hami_node.gpu.topology` scores such a pair 0.
    """

    level: TopologyLevel | None
    nvlinks: int = 0


class MigMode(NamedTuple):
    """A GPU's MIG mode (nvmlDeviceGetMigMode): `current` is in force, `pending` applies after the next
    GPU reset. Both False on a GPU that is not MIG capable."""

    current: bool
    pending: bool


@dataclass(frozen=True, slots=True)
class MigAttributes:
    """What a MIG device offers (nvmlDeviceGetAttributes on its handle; the source of GPU feature
    discovery's `.memory`, `.multiprocessors`, `.slices.gi|ci`, `.engines.*` labels)."""

    memory_mib: int
    multiprocessors: int
    gi_slices: int
    ci_slices: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device: a GPU instance and the compute instance in it, as a container sees it.

    `uuid` is the MIG UUID ("MIG-<uuid>"; the legacy form "MIG-GPU-<uuid>/<gi>/<ci>" on drivers before
    R470) that NVIDIA_VISIBLE_DEVICES takes; `parent_uuid` the GPU's. `index` is j of
    nvmlDeviceGetMigDeviceHandleByIndex(gpu, j): the j of NVIDIA's `<gpu>:<j>` device index.
    `profile` is go-nvlib's name of the GPU instance's profile ("3g.20gb"), `placement` where the GPU
    instance sits.
    """

    parent_uuid: str
    uuid: str
    index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    placement: Placement
    attributes: MigAttributes

    @property
    def memory_mib(self) -> int:
        return self.attributes.memory_mib


# --- errors ---------------------------------------------------------------------------------------


class GPUBackendError(Exception):
    """Base of every error a GPU backend raises at run time.

    `code` is the NVML return code behind it, when there is one (for logs).
    """

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlFailed(GPUBackendError):
    """NVML as a whole does not answer: fence every GPU and retry `init()` with backoff."""


class LibraryNotFound(NvmlFailed):
    """No GPU driver on this node: libnvidia-ml.so.1 cannot be loaded."""

    DEFAULT_MESSAGE = (
        "no GPU driver on this node: libnvidia-ml.so.1 not found (is the NVIDIA driver installed and "
        "the driver root mounted into this container? use --gpu-backend fake for a node without GPUs)"
    )

    def __init__(self, message: str = DEFAULT_MESSAGE, *, code: int | None = None) -> None:
        super().__init__(message, code=code)


class GPUFailed(GPUBackendError):
    """A call about one GPU (`uuid`) failed; that GPU is not usable now, the others may be."""

    def __init__(self, uuid: str, message: str, *, code: int | None = None) -> None:
        super().__init__(message, code=code)
        self.uuid = uuid


class DeviceLost(GPUFailed):
    """The GPU is lost: it fell off the bus or stopped answering (NVML_ERROR_GPU_IS_LOST)."""


class GPUNotFound(GPUFailed):
    """No GPU with this UUID."""


class MigError(GPUFailed):
    """A MIG query, create or destroy on GPU `uuid` failed. `profile` and `placement` name what was
    asked, when something was; the message names the GPU and them."""

    def __init__(
        self,
        uuid: str,
        message: str,
        *,
        profile: str | None = None,
        placement: Placement | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__(uuid, message, code=code)
        self.profile = profile
        self.placement = placement


class MigDisabled(MigError):
    """The GPU is not MIG capable, or its MIG mode is disabled (or only pending): nothing can be created
    on it until an administrator enables MIG mode (the backends never change it)."""


class MigProfileUnknown(MigError):
    """The GPU has no GPU instance profile of that name."""


class MigPlacementRefused(MigError):
    """The placement is not one of the profile's possible placements, or it overlaps an instance that
    exists (NVML_ERROR_INSUFFICIENT_RESOURCES): nothing was created."""


class MigInUse(MigError):
    """The instance cannot be destroyed: processes still use it (NVML_ERROR_IN_USE). It is left as it
    was."""


class MigInstanceNotFound(MigError):
    """No GPU instance with that ID on the GPU."""


def mig_disabled_message(uuid: str, index: int | None, mode: MigMode) -> str:
    """Why nothing can be created on a GPU whose MIG mode is not enabled, and the command that fixes it."""
    where = f"GPU {uuid}" if index is None else f"GPU {index} ({uuid})"
    gpu_flag = "" if index is None else f"-i {index} "
    if mode.pending:
        return (
            f"MIG mode is pending on {where} (enabled after a GPU reset); reset it with "
            f"nvidia-smi {gpu_flag}-r once no process uses it"
        )
    return (
        f"MIG mode is disabled on {where}; enable it with nvidia-smi {gpu_flag}-mig 1 "
        "(an administrator's step)"
    )


# --- the interface --------------------------------------------------------------------------------


class GPUBackend(Protocol):
    """What the node daemon needs from its GPUs.

    Life cycle: `init()`, then any of the queries, then `shutdown()`. After `NvmlFailed` the caller
    may `shutdown()` and `init()` again (with backoff) until it succeeds. Concurrency: `wait_event`
    blocks and runs in the caller's own event thread, concurrently with `list_gpus`, `probe` and
    `links` from other threads; `init` and `shutdown` must not overlap any other call (stop the
    event thread first: it wakes at least every `timeout_s`), except `links` and `usage`, which may be
    called from any thread at any time: they hold `init` and `shutdown` off while they run, and raise
    `NvmlFailed` when the backend is not initialised.
    """

    def init(self) -> None:
        """Connect to the GPUs and start watching for events.

        Raises `LibraryNotFound` (no driver) or `NvmlFailed`; a failed init leaves nothing to release.
        """
        ...

    def shutdown(self) -> None:
        """Release everything `init` took. Idempotent, safe after a failed `init`; never raises."""
        ...

    def list_gpus(self) -> list[PhysicalGPU]:
        """Every physical GPU, ordered by index. Raises `NvmlFailed`."""
        ...

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        """Block until the next health event, or return None after `timeout_s` seconds without one.

        Events that happened since `init()` are queued, none is lost between calls.
        Raises `NvmlFailed` when waiting itself fails (treat as "all GPUs in doubt").
        """
        ...

    def links(self, uuids: Sequence[str]) -> dict[tuple[str, str], GPULink]:
        """The link from each of these GPUs to each other one: a key (a, b) for every ordered pair of
        different UUIDs, the link as GPU a sees it. Raises `GPUFailed` (and subclasses) when one of the
        GPUs cannot be read, `NvmlFailed`, `ValueError` when a UUID is listed twice."""
        ...

    def usage(self, uuid: str) -> GPUUsage:
        """The GPU's memory use and utilisation now (for metrics, never for health).

        Raises `GPUFailed` (and subclasses) or `NvmlFailed`.
        """
        ...

    def probe(self, uuid: str) -> None:
        """A cheap health check: returns when the GPU answers NVML normally, raises otherwise.

        Raises `DeviceLost`, `GPUNotFound`, `GPUFailed` (this GPU is not fine) or `NvmlFailed`.
        """
        ...

    # --- MIG ---

    def mig_mode(self, uuid: str) -> MigMode:
        """The GPU's MIG mode; (False, False) when it is not MIG capable. Raises `GPUFailed` (and
        subclasses) or `NvmlFailed`."""
        ...

    def mig_profiles(self, uuid: str) -> tuple[GIProfile, ...]:
        """The GPU instance profiles the GPU offers, each with its possible placements (NVML:
        GetGpuInstanceProfileInfo per profile enum, GetGpuInstancePossiblePlacements), in enum order;
        empty when the GPU is not MIG capable. Answers whether or not MIG mode is enabled. Raises
        `GPUFailed` (and subclasses) or `NvmlFailed`."""
        ...

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        """The MIG devices on the GPU now, ordered by `index`; empty when MIG mode is not enabled.
        Raises `GPUFailed` (and subclasses) or `NvmlFailed`."""
        ...

    def create_mig_device(self, uuid: str, profile: str, placement: Placement) -> MigDevice:
        """Create a GPU instance of `profile` at `placement` and one compute instance spanning it
        (shared engines), and return the MIG device. All or nothing: on any failure whatever was
        created is destroyed again (compute instance, then GPU instance) before the error is raised.

        Raises `MigDisabled`, `MigProfileUnknown`, `MigPlacementRefused`, `MigError`, `GPUFailed` or
        `NvmlFailed`.
        """
        ...

    def destroy_mig_device(self, uuid: str, gpu_instance_id: int) -> None:
        """Destroy the GPU instance `gpu_instance_id` and its compute instances (those first).

        Raises `MigInstanceNotFound`, `MigInUse` (left as it was), `MigError`, `GPUFailed` or
        `NvmlFailed`.
        """
        ...
