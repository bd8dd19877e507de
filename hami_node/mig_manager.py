"""HAMi v2.10's dynamic MIG on the node: which profiles a GPU registers, the MIG instances created for
containers at Allocate, their runtime identity on the pod, and the reconciler that destroys the
instances no live pod holds.

The sources (HAMi v2.10, pkg/device-plugin/nvidiadevice/nvinternal/plugin/):

- register.go `getAPIDevices` / `discoverMigProfiles`: a GPU in mode mig registers `devmem` unscaled,
  `devcore` 100, `count` = the largest instance count of its allowlisted profiles and `migProfiles`
  (name, memory, core = ceil(MP * 100 / fullSM), slices, placements); a GPU no allowlist entry names is
  skipped (`skip MIG device with no discovered profile capacity`). `register_mig`.
- migmgr.go `MigInstanceManager`: instances keyed by {GPU, profile, placement start, size};
  `EnsureAllocation` creates exactly the reserved profile and placement (never another one),
  `AdoptAllocation`, `ReconcileActiveAllocations`, `Release`. `MigManager`.
- util.go `GetContainerDeviceStrArray`: the container's entries of `hami.io/vgpu-mig-allocations`
  (HAMi's count check), each ensured, the ones this call created rolled back on error.
  `container_mig_allocations`, `MigManager.ensure_container`.
- server.go `annotateMigRuntimeInfo`, `activeMigAllocationKeys`, `primeMigManagerFromAnnotations`,
  `runMigAnnotationReconciler` (every 5 s; API or annotation errors skip the round), and
  mig_startup.go `activeMigGPUUUIDs`. `with_runtime_identity`, `active_mig_keys`, `prime_from_pods`,
  `MigReconciler`, `active_mig_gpu_uuids`.

Where this differs from HAMi (docs/nvidia-sharing.md, "HAMi's dynamic MIG"):

- HAMi's startup `ResetIdleGPUs` enables MIG mode on idle GPUs and destroys every instance on them.
  This daemon never changes a GPU's MIG mode (a mig-mode GPU with MIG disabled is unhealthy with a
  message telling the administrator how to enable it) and destroys only instances it created or
  adopted from a live pod's annotation: instances someone else made are left alone.
- Instances are keyed by the GPU's UUID, not its NVML index (an index is not stable across reboots).
- HAMi's allowlist matches `models` as substrings of the NVML name, so its own chart's entries
  ("H100-SXM5-80GB", "H200-SXM5", "H200 NVL") never match the names NVML reports ("NVIDIA H100 80GB
  HBM3", "NVIDIA H200"). `allowlist_entry_for` tries HAMi's substring match first, then a token
  match that ignores form-factor words (SXM4, SXM5, PCIe, NVL, HBM3, ...).
- HAMi maps an allowlist name to a GI profile by its slice count only ("1g" is GI_1_SLICE), so an
  allowlisted "1g.10gb" on an A100-40GB registers the 1g.5gb profile under that name. Here a name is
  the GPU's profile of that exact name, else (for names like HAMi chart's "7g.79gb") the base profile
  with that slice count (`resolve_profile`); the register carries the GPU's real profile name.
- Without `--device-config-file` every base profile of the GPU is offered (HAMi always has its chart's
  allowlist).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami_api.errors import WireFormatError
from hami_api.mig import GIProfile, Placement, hami_core_percent
from hami_api.mig_alloc import (
    MIG_ALLOCATIONS,
    AllowedMigProfiles,
    MigAllocation,
    decode_mig_allocations,
)
from hami_api.resources import pod_container_names
from hami_api.types import MigProfile
from hami_node.cdi import MigCdiDevice
from hami_node.gpu.backend import (
    GPUBackend,
    MigDevice,
    MigDisabled,
    MigError,
    MigInstanceNotFound,
    MigPlacementRefused,
    MigProfileUnknown,
    PhysicalGPU,
    mig_disabled_message,
)

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 5.0
"""HAMi's runMigAnnotationReconciler period."""

# --- the register (pure) -------------------------------------------------------------------------------

_FORM_FACTOR = frozenset(
    {"NVIDIA", "SXM", "SXM2", "SXM4", "SXM5", "SXM6", "PCIE", "NVL", "HBM2", "HBM2E", "HBM3", "HBM3E"}
)
_TOKEN = re.compile(r"[A-Za-z0-9.]+")


def _tokens(text: str) -> set[str]:
    return {t.upper() for t in _TOKEN.findall(text)} - _FORM_FACTOR


def allowlist_entry_for(entries: Sequence[AllowedMigProfiles], nvml_name: str) -> AllowedMigProfiles | None:
    """The allowlist entry for a GPU NVML names so: HAMi's `containsModel` first (the first entry with a
    model that is a substring of the name), else the first entry with a model whose words, form-factor
    words left out, are all words of the name ("H100-SXM5-80GB" matches "NVIDIA H100 80GB HBM3", "H200
    NVL" matches "NVIDIA H200"; "H100-SXM5-94GB" does not match an 80GB H100). None when none matches."""
    for entry in entries:
        if any(model and model in nvml_name for model in entry.models):
            return entry
    words = _tokens(nvml_name)
    for entry in entries:
        for model in entry.models:
            wanted = _tokens(model)
            if wanted and wanted <= words:
                return entry
    return None


def _slice_key(profile: str) -> str:
    """HAMi's profileSliceKey: "3g.20gb" -> "3g"."""
    head, dot, _ = profile.partition(".")
    return head if dot and head else profile


def resolve_profile(profiles: Sequence[GIProfile], name: str) -> GIProfile | None:
    """The GPU's profile an allowlist or allocation names: the one of that exact name, else the base
    profile with the same slice key (HAMi's profileNameToGIProfileID: "7g.79gb" is the 7-slice one).
    None when neither exists."""
    for profile in profiles:
        if profile.name == name:
            return profile
    key = _slice_key(name)
    for profile in profiles:
        if profile.is_base and _slice_key(profile.name) == key:
            return profile
    return None


@dataclass(frozen=True, slots=True)
class MigRegistration:
    """What a mig-mode GPU registers: its `profiles` (HAMi's migProfiles), `count` (the largest instance
    count among them), and `problem` when the GPU cannot take MIG instances now (MIG mode disabled or
    pending): the GPU is then registered unhealthy with that message."""

    profiles: tuple[MigProfile, ...]
    count: int
    problem: str | None = None


def register_mig(
    gi_profiles: Sequence[GIProfile],
    model: str,
    allowlist: Sequence[AllowedMigProfiles] | None,
    problem: str | None = None,
) -> MigRegistration | None:
    """HAMi's discoverMigProfiles for one GPU: the allowlisted profiles (every base profile when
    `allowlist` is None) with their placements and `core = ceil(MP * 100 / fullSM)`; None when the GPU
    registers nothing (no allowlist entry for `model`, or none of its profiles exists on the GPU)."""
    full_sm = max((p.multiprocessors for p in gi_profiles if p.is_base), default=0)
    if allowlist is None:
        chosen = [p for p in gi_profiles if p.is_base]
    else:
        entry = allowlist_entry_for(allowlist, model)
        if entry is None:
            return None
        chosen = []
        for name in entry.profiles:
            found = resolve_profile(gi_profiles, name)
            if found is None:
                log.info("skip MIG profile placement discovery: profile %s not on %s", name, model)
            elif found not in chosen:
                chosen.append(found)
    if not chosen or full_sm <= 0:
        return None
    profiles = tuple(
        MigProfile(
            name=p.name,
            memory_mb=p.memory_mib,
            core=hami_core_percent(p, full_sm),
            slice_count=p.slices,
            placements=tuple(pl.wire() for pl in p.placements),
        )
        for p in chosen
    )
    return MigRegistration(profiles, max(p.instance_count for p in chosen), problem)


def discover_registrations(
    backend: GPUBackend, gpus: Iterable[PhysicalGPU], allowlist: Sequence[AllowedMigProfiles] | None
) -> dict[str, MigRegistration]:
    """Every GPU's registration read from the backend (HAMi's getAPIDevices in mode mig): a GPU whose
    MIG mode is not enabled registers with the problem naming the command that enables it (this daemon
    never changes MIG mode); a GPU that registers nothing is logged with HAMi's text and left out; one
    whose MIG queries fail is logged and left out."""
    out: dict[str, MigRegistration] = {}
    for gpu in gpus:
        try:
            mode = backend.mig_mode(gpu.uuid)
            profiles = backend.mig_profiles(gpu.uuid)
        except Exception as err:
            log.error("MIG queries of GPU %s failed, not registered: %s", gpu.uuid, err)
            continue
        problem = None if mode.current and mode.pending else mig_disabled_message(gpu.uuid, gpu.index, mode)
        registration = register_mig(profiles, gpu.model, allowlist, problem)
        if registration is None:
            log.info(
                "skip MIG device with no discovered profile capacity: id %s, model %s", gpu.uuid, gpu.model
            )
            continue
        if problem is not None:
            log.error("GPU %s in operating mode mig is unhealthy: %s", gpu.uuid, problem)
        out[gpu.uuid] = registration
    return out


# --- pods and their annotation (pure) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class MigKey:
    """One scheduler reservation (HAMi's migAllocationKey, by GPU UUID instead of index)."""

    gpu_uuid: str
    profile: str
    start: int
    size: int

    @classmethod
    def of(cls, allocation: MigAllocation) -> MigKey:
        return cls(
            allocation.gpu_uuid, allocation.profile, allocation.placement.start, allocation.placement.size
        )

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.size)

    def __str__(self) -> str:
        return f"{self.profile} at {{{self.start},{self.size}}} on {self.gpu_uuid}"


class MigAllocateError(Exception):
    """A MIG Allocate (or reconcile, or adoption) cannot go on; the message says why, naming the GPU,
    the profile or the pod."""


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def live_pod(pod: Mapping[str, Any]) -> bool:
    """HAMi's rule for a pod that holds its MIG instances: not being deleted, not Succeeded or Failed."""
    if _meta(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase not in ("Succeeded", "Failed")


def mig_annotation(pod: Mapping[str, Any]) -> str:
    annotations = _meta(pod).get("annotations")
    value = annotations.get(MIG_ALLOCATIONS, "") if isinstance(annotations, Mapping) else ""
    return value if isinstance(value, str) else ""


def active_mig_gpu_uuids(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """HAMi's activeMigGPUUUIDs: the physical GPUs (`GPU-` UUIDs) live pods' MIG allocations name;
    a pod whose annotation does not decode is skipped."""
    out: set[str] = set()
    for pod in pods:
        if not live_pod(pod):
            continue
        try:
            allocations = decode_mig_allocations(mig_annotation(pod))
        except WireFormatError:
            continue
        out.update(a.gpu_uuid for a in allocations if a.gpu_uuid.startswith("GPU-"))
    return out


def active_mig_keys(pods: Iterable[Mapping[str, Any]]) -> set[MigKey]:
    """HAMi's activeMigAllocationKeys: every reservation of the live pods. Raises `MigAllocateError`
    (`decode MIG allocations for pod <ns>/<name>: ...`) for an annotation that does not decode: the
    reconciler must then destroy nothing."""
    out: set[MigKey] = set()
    for pod in pods:
        if not live_pod(pod):
            continue
        try:
            allocations = decode_mig_allocations(mig_annotation(pod))
        except WireFormatError as err:
            raise MigAllocateError(f"decode MIG allocations for pod {_pod_key(pod)}: {err}") from None
        out.update(MigKey.of(a) for a in allocations)
    return out


def container_mig_allocations(
    pod: Mapping[str, Any], container_index: int, requested: int
) -> tuple[MigAllocation, ...]:
    """The container's reservations ordered by device index (HAMi's GetContainerDeviceStrArray; the
    index counts init containers first). Raises `MigAllocateError` with HAMi's texts: `decode scheduler
    MIG allocations: ...`, `container <name> has <n> MIG reservations, requested <m> devices`."""
    names = pod_container_names(dict(pod))
    name = names[container_index] if 0 <= container_index < len(names) else f"#{container_index}"
    try:
        allocations = decode_mig_allocations(mig_annotation(pod))
    except WireFormatError as err:
        raise MigAllocateError(f"decode scheduler MIG allocations: {err}") from None
    mine = sorted(
        (a for a in allocations if a.container_index == container_index), key=lambda a: a.device_index
    )
    if len(mine) != requested:
        raise MigAllocateError(
            f"container {name} has {len(mine)} MIG reservations, requested {requested} devices"
        )
    return tuple(mine)


# --- the instances --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A live GPU instance with its compute instance, as this daemon tracks it (HAMi's migInstance)."""

    key: MigKey
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int


def with_runtime_identity(
    allocations: Sequence[MigAllocation], runtime: Callable[[MigKey], MigInstance | None]
) -> tuple[MigAllocation, ...]:
    """HAMi's annotateMigRuntimeInfo without the patch: every entry whose instance is live gets its MIG
    UUID and GPU/compute instance IDs. Raises `MigAllocateError` (`no realised MIG allocation found for
    pod`) when none is live."""
    out: list[MigAllocation] = []
    updated = False
    for a in allocations:
        inst = runtime(MigKey.of(a))
        if inst is None:
            out.append(a)
            continue
        out.append(
            replace(
                a,
                mig_uuid=inst.mig_uuid,
                gpu_instance_id=inst.gpu_instance_id,
                compute_instance_id=inst.compute_instance_id,
            )
        )
        updated = True
    if not updated:
        raise MigAllocateError("no realised MIG allocation found for pod")
    return tuple(out)


class MigManager:
    """The one authority over the MIG instances this daemon created or adopted (HAMi's
    MigInstanceManager), over the backend's MIG calls. Thread-safe: one lock per GPU around creation
    and destruction, a short one around the table."""

    def __init__(self, backend: GPUBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._instances: dict[MigKey, MigInstance] = {}
        self._profiles: dict[str, tuple[GIProfile, ...]] = {}
        self._listeners: list[Callable[[], None]] = []
        self.created = 0
        self.destroyed = 0

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` after the instances change: when `ensure_container` has its instances (before
        Allocate answers; a listener's error there fails the call and rolls back what it created), and
        after an instance is released or adopted (errors logged). The CDI spec writer
        (`hami_node.cdi.CdiSpecWriter.refresh`) listens, so a MIG device's CDI name is defined before it
        is handed out."""
        with self._lock:
            self._listeners.append(listener)

    def cdi_devices(self) -> list[MigCdiDevice]:
        """The tracked instances as the CDI spec names them (MIG UUID, GPU, GI and CI IDs), by key."""
        return [
            MigCdiDevice(i.mig_uuid, k.gpu_uuid, i.gpu_instance_id, i.compute_instance_id)
            for k, i in sorted(self.managed().items())
        ]

    def _notify(self) -> None:
        """Call the listeners; the first error is raised (as `MigAllocateError`)."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception as err:
                raise MigAllocateError(
                    f"MIG instances changed, but updating the CDI spec failed: {err}"
                ) from None

    def _notify_logged(self) -> None:
        try:
            self._notify()
        except MigAllocateError as err:
            log.error("%s", err)

    def _gpu_lock(self, uuid: str) -> threading.Lock:
        with self._lock:
            return self._gpu_locks.setdefault(uuid, threading.Lock())

    def _gi_profiles(self, uuid: str) -> tuple[GIProfile, ...]:
        with self._lock:
            cached = self._profiles.get(uuid)
        if cached is None:
            cached = self._backend.mig_profiles(uuid)
            with self._lock:
                self._profiles[uuid] = cached
        return cached

    def managed(self) -> dict[MigKey, MigInstance]:
        """The instances tracked now."""
        with self._lock:
            return dict(self._instances)

    def runtime(self, key: MigKey) -> MigInstance | None:
        """HAMi's AllocationRuntimeInfo."""
        with self._lock:
            return self._instances.get(key)

    def ensure(self, key: MigKey) -> tuple[MigInstance, bool]:
        """HAMi's EnsureAllocation: the instance of exactly this profile and placement, created when it
        is not tracked yet; returns it and whether this call created it. Raises `MigAllocateError`
        naming the GPU, the profile and the placement (nothing is left half-created: the backend's
        create is all or nothing)."""
        with self._gpu_lock(key.gpu_uuid):
            with self._lock:
                found = self._instances.get(key)
            if found is not None:
                return found, False
            try:
                mode = self._backend.mig_mode(key.gpu_uuid)
                if not mode.current or mode.pending != mode.current:
                    raise MigAllocateError(mig_disabled_message(key.gpu_uuid, None, mode))
                profile = resolve_profile(self._gi_profiles(key.gpu_uuid), key.profile)
                if profile is None:
                    raise MigAllocateError(f"unsupported MIG profile {key.profile!r} on GPU {key.gpu_uuid}")
                if key.placement not in profile.placements:
                    raise MigAllocateError(
                        f"scheduler selected invalid placement {{Start:{key.start} Size:{key.size}}} for "
                        f"profile {key.profile} on GPU {key.gpu_uuid} (possible: "
                        f"{', '.join(str(p) for p in profile.placements)})"
                    )
                device = self._backend.create_mig_device(key.gpu_uuid, profile.name, key.placement)
            except MigAllocateError:
                raise
            except (MigDisabled, MigProfileUnknown, MigPlacementRefused, MigError) as err:
                raise MigAllocateError(
                    f"create GI profile={key.profile} placement={{Start:{key.start} Size:{key.size}}} on "
                    f"GPU {key.gpu_uuid}: {err}"
                ) from None
            except Exception as err:  # GPUFailed, NvmlFailed
                raise MigAllocateError(f"create MIG instance {key}: {err}") from None
            inst = MigInstance(key, device.uuid, device.gpu_instance_id, device.compute_instance_id)
            with self._lock:
                self._instances[key] = inst
                self.created += 1
            log.info(
                "created scheduler-reserved MIG allocation %s: %s (GI %d, CI %d)",
                key,
                inst.mig_uuid,
                inst.gpu_instance_id,
                inst.compute_instance_id,
            )
            return inst, True

    def release(self, key: MigKey) -> None:
        """HAMi's Release (by key): destroy the tracked instance; one already gone counts as destroyed.
        An untracked key is a no-op. Raises `MigAllocateError` (the instance stays tracked)."""
        with self._gpu_lock(key.gpu_uuid):
            with self._lock:
                inst = self._instances.get(key)
            if inst is None:
                return
            self._destroy(inst)
            with self._lock:
                self._instances.pop(key, None)
                self.destroyed += 1
            log.info("released MIG allocation %s (%s)", key, inst.mig_uuid)
        self._notify_logged()

    def _destroy(self, inst: MigInstance) -> None:
        try:
            self._backend.destroy_mig_device(inst.key.gpu_uuid, inst.gpu_instance_id)
        except MigInstanceNotFound:
            return
        except Exception as err:
            raise MigAllocateError(
                f"destroy GI {inst.gpu_instance_id} ({inst.mig_uuid}) on GPU {inst.key.gpu_uuid}: {err}"
            ) from None

    def ensure_container(self, allocations: Sequence[MigAllocation]) -> tuple[MigInstance, ...]:
        """Every reservation of one container ensured, in order; when one fails, the instances this call
        created are destroyed again (last first) and the error raised (HAMi's rollback)."""
        created: list[MigKey] = []
        out: list[MigInstance] = []
        try:
            for a in allocations:
                inst, new = self.ensure(MigKey.of(a))
                if new:
                    created.append(inst.key)
                out.append(inst)
            self._notify()
        except BaseException:
            for key in reversed(created):
                try:
                    self.release(key)
                except MigAllocateError as err:
                    log.error("failed to roll back partial MIG allocation %s: %s", key, err)
            raise
        return tuple(out)

    def rollback(self, instances: Iterable[MigInstance]) -> None:
        """Destroy these instances (a later step of Allocate failed); errors are logged."""
        for inst in reversed(list(instances)):
            try:
                self.release(inst.key)
            except MigAllocateError as err:
                log.error("failed to roll back MIG allocation %s: %s", inst.key, err)

    def adopt(self, allocation: MigAllocation) -> None:
        """HAMi's AdoptAllocation: track a live pod's instance after a restart, once the backend shows a
        MIG device with the annotated GI ID, placement, MIG UUID, CI ID and profile. Raises
        `MigAllocateError` (`annotated MIG allocation <uuid> profile=<p> placement={Start:s Size:n} is
        not live`)."""
        key = MigKey.of(allocation)
        with self._gpu_lock(key.gpu_uuid):
            try:
                devices = self._backend.mig_devices(key.gpu_uuid)
                profile = resolve_profile(self._gi_profiles(key.gpu_uuid), key.profile)
            except Exception as err:
                raise MigAllocateError(f"list MIG devices of GPU {key.gpu_uuid}: {err}") from None
            match = next((d for d in devices if _same(d, allocation, profile)), None)
            if match is None:
                raise MigAllocateError(
                    f"annotated MIG allocation {allocation.mig_uuid} profile={key.profile} "
                    f"placement={{Start:{key.start} Size:{key.size}}} is not live"
                )
            with self._lock:
                self._instances[key] = MigInstance(
                    key, match.uuid, match.gpu_instance_id, match.compute_instance_id
                )
        self._notify_logged()

    def reconcile(self, active: set[MigKey]) -> list[MigKey]:
        """HAMi's ReconcileActiveAllocations: destroy every tracked instance whose key is not active;
        returns the keys destroyed. Stops at the first failure (`MigAllocateError`), keeping the rest."""
        gone: list[MigKey] = []
        for key in sorted(self.managed().keys() - active):
            self.release(key)
            gone.append(key)
        return gone


def _same(device: MigDevice, a: MigAllocation, profile: GIProfile | None) -> bool:
    return (
        device.gpu_instance_id == a.gpu_instance_id
        and device.compute_instance_id == a.compute_instance_id
        and device.uuid == a.mig_uuid
        and device.placement == Placement(a.placement.start, a.placement.size)
        and (profile is None or device.profile == profile.name)
    )


def prime_from_pods(manager: MigManager, pods: Iterable[Mapping[str, Any]], gpus: set[str]) -> list[str]:
    """HAMi's primeMigManagerFromAnnotations over this node's pods: every live pod's reservations on
    this daemon's GPUs adopted. Unlike HAMi, which stops at the first problem, each problem is reported
    and the rest adopted; returns the problems (HAMi's texts: `active pod <ns>/<name> MIG allocation
    lacks runtime identity`, `adopt pod <ns>/<name> MIG allocation: ...`). A pod still waiting for its
    Allocate has no runtime identity yet and is not a problem."""
    problems: list[str] = []
    for pod in pods:
        if not live_pod(pod):
            continue
        key = _pod_key(pod)
        try:
            allocations = decode_mig_allocations(mig_annotation(pod))
        except WireFormatError as err:
            problems.append(f"decode MIG allocations for pod {key}: {err}")
            continue
        for a in allocations:
            if a.gpu_uuid not in gpus:
                continue
            if not a.runtime_ready:
                if _allocating(pod):
                    continue
                problems.append(f"active pod {key} MIG allocation lacks runtime identity")
                continue
            try:
                manager.adopt(a)
            except MigAllocateError as err:
                problems.append(f"adopt pod {key} MIG allocation: {err}")
    return problems


def _allocating(pod: Mapping[str, Any]) -> bool:
    annotations = _meta(pod).get("annotations")
    phase = annotations.get("hami.io/bind-phase") if isinstance(annotations, Mapping) else None
    return phase == "allocating"


class MigReconciler:
    """HAMi's runMigAnnotationReconciler: every `interval_s`, this node's pods are listed and the
    instances no live pod holds destroyed. An API error or an undecodable annotation skips the round
    (`periodic MIG reconciliation skipped`): reconciling is destructive."""

    def __init__(
        self,
        manager: MigManager,
        list_pods: Callable[[], Sequence[Mapping[str, Any]]],
        interval_s: float = RECONCILE_INTERVAL_S,
    ) -> None:
        self._manager = manager
        self._list_pods = list_pods
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self.rounds = 0
        self.skipped = 0

    def reconcile_once(self) -> list[MigKey]:
        """One round; returns the keys destroyed ([] when skipped)."""
        try:
            active = active_mig_keys(self._list_pods())
            gone = self._manager.reconcile(active)
        except Exception as err:
            log.info("periodic MIG reconciliation skipped: %s", err)
            with self._cond:
                self.skipped += 1
                self.rounds += 1
                self._cond.notify_all()
            return []
        with self._cond:
            self.rounds += 1
            self._cond.notify_all()
        return gone

    def wait_rounds(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` rounds have run; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.rounds > after, timeout_s)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="hami-mig-reconcile", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.reconcile_once()


__all__ = [
    "RECONCILE_INTERVAL_S",
    "MigAllocateError",
    "MigInstance",
    "MigKey",
    "MigManager",
    "MigReconciler",
    "MigRegistration",
    "active_mig_gpu_uuids",
    "active_mig_keys",
    "allowlist_entry_for",
    "container_mig_allocations",
    "discover_registrations",
    "live_pod",
    "mig_annotation",
    "prime_from_pods",
    "register_mig",
    "resolve_profile",
    "with_runtime_identity",
]
