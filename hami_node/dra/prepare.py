"""NodePrepareResources and NodeUnprepareResources, the I/O around the pure core (`claims`): reading the
claims and their pods, the serialization lock, the checkpoint, the claims' CDI specs and directories.

Prepare, as the upstream helper does it (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go
`NodePrepareResources`, `getResourceClaims`): every claim is read from the API server *before* the
serialization lock is taken (slow calls never hold it), must have the UID kubelet names ("got replaced")
and be allocated ("not allocated"); the pods in its `status.reservedFor` are read too, for the
container-visible GPU order (`claims.assign_indices`). Then, under the lock: the checkpoint is read; a
claim already in it answers with what it got then (its CDI spec written again if it went missing, its
directory kept: Prepare never wipes a prepared claim's shared cache, which the pods already using it
hold); the others are prepared: their spec written (`hami_node.cdi`, atomic), their directory
`<hook>/vgpu/claims/<uid>` created (mode 0777, as HAMi's cache directories), and the checkpoint saved.
Every failure is the claim's own error; the call itself never fails for one claim.

Unprepare, under the lock: the claim's spec file and directory are removed by its UID (so a claim the
checkpoint does not know, e.g. after a lost checkpoint, is cleaned up too, and an unknown one is
simply done) and its entry dropped.

The lock is a mutex plus `flock` on `<plugin dir>/serialize.lock`, and the checkpoint is read at the start
of each call: two daemon instances during a rolling update (the upstream helper's RollingUpdate, whose
instances "must be entirely stateless across method calls") share the state through the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hami_api.mig import Placement
from hami_kube.errors import KubeApiError
from hami_node.cdi import (
    claim_spec_file_name,
    encode_spec,
    remove_spec,
    remove_stale_claim_temps,
    write_spec,
)
from hami_node.config import NodeConfig
from hami_node.devices import GPUStatus
from hami_node.dra import checkpoint as ckpt
from hami_node.dra import slices as sl
from hami_node.dra.claims import (
    ClaimError,
    ClaimGpu,
    ClaimPlan,
    ClaimRef,
    Indices,
    MigRecord,
    PreparedClaim,
    PreparedDevice,
    Share,
    allocation_shares,
    assign_indices,
    cdi_device_name,
    check_claim,
    check_devices,
    claim_dir,
    claim_gpus,
    claim_spec,
    container_uses,
    gpu_order,
    is_pod_private,
    mig_claim_spec,
    prepare_claim,
    reserved_pods,
)
from hami_node.durable import write_atomic
from hami_node.gpu import GPUBackend, GPUBackendError, MigDevice, MigInstanceNotFound

log = logging.getLogger(__name__)

LOCK_FILE = "serialize.lock"
"""The upstream helper's lock file name (kubeletplugin/draplugin.go, RollingUpdate)."""
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class ClaimSource(Protocol):
    """The reads Prepare makes (`hami_node.kubeapi.NodeApi` is one). Errors: `KubeApiError`."""

    def get_resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: prepared, or the error kubelet shows."""

    claim: PreparedClaim | None = None
    error: str = ""


class ClaimPreparer:
    """Prepares and unprepares claims; thread-safe (calls are serialized). `gpus` lists this node's GPUs
    now (`DeviceState.gpus`); `device_exists` says which control device nodes exist (for the specs);
    `license_present` whether HAMi's license file is there."""

    def __init__(
        self,
        config: NodeConfig,
        gpus: Callable[[], Sequence[GPUStatus]],
        source: ClaimSource,
        *,
        common_nodes: Callable[[], Sequence[str]] = lambda: (),
        license_present: Callable[[], bool] = lambda: False,
        backend: GPUBackend | None = None,
    ) -> None:
        self._config = config
        self._backend = backend
        """Creates and destroys the MIG devices of claims of MIG partitions (None: such claims fail)."""
        self._gpus = gpus
        self._source = source
        self._common_nodes = common_nodes
        self._license_present = license_present
        self._dir = config.dra_plugin_dir
        self._cdi_dir = config.cdi_spec_dir
        self._mutex = threading.Lock()
        self.prepared = 0
        """Claims prepared (newly) since start."""
        self._forbidden_logged = False
        self.unprepared = 0

    @property
    def checkpoint_path(self) -> Path:
        return self._dir / ckpt.FILE_NAME

    def start(self) -> None:
        """Create the plugin directory, remove the temporary files of interrupted spec writes, and check
        the checkpoint once (a bad one is moved aside now, with an error in the log). Raises OSError."""
        self._dir.mkdir(parents=True, exist_ok=True)
        for path in remove_stale_claim_temps(self._cdi_dir):
            log.info("removed %s, left by an interrupted write", path)
        with self._serialized():
            claims = self._load().claims
        if claims:
            log.info("DRA checkpoint %s: %d prepared claims", self.checkpoint_path, len(claims))

    # --- prepare ----------------------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """One outcome per claim UID of `refs`."""
        out: dict[str, Outcome] = {}
        fetched: dict[str, tuple[ClaimRef, Mapping[str, Any]]] = {}
        for ref in refs:
            if ref.uid in out or ref.uid in fetched:
                continue
            error = _bad_uid(ref)
            if error:
                out[ref.uid] = Outcome(error=error)
                continue
            try:
                claim = self._source.get_resource_claim(ref.namespace, ref.name)
                check_claim(claim, ref)
            except KubeApiError as err:
                out[ref.uid] = Outcome(error=f"claim {ref.key}: cannot read it: {err}")
            except ClaimError as err:
                out[ref.uid] = Outcome(error=str(err))
            else:
                fetched[ref.uid] = (ref, claim)
        pods = self._read_pods(fetched, out)
        with self._serialized():
            out.update(self._prepare_locked(fetched, pods))
        return out

    def _read_pods(
        self, fetched: dict[str, tuple[ClaimRef, Mapping[str, Any]]], out: dict[str, Outcome]
    ) -> list[Mapping[str, Any]]:
        """The pods the claims are reserved for (each read once); a claim whose pod cannot be read
        fails (kubelet retries), a pod that is gone or was replaced is left out."""
        pods: dict[tuple[str, str], Mapping[str, Any] | None] = {}
        for uid, (ref, claim) in list(fetched.items()):
            for name, pod_uid in reserved_pods(claim):
                key = (ref.namespace, name)
                if key not in pods:
                    try:
                        pod = self._source.get_pod(ref.namespace, name)
                    except KubeApiError as err:
                        if err.status == 403:
                            self._pods_forbidden(err)
                        elif not err.not_found:
                            out[uid] = Outcome(
                                error=f"claim {ref.key}: cannot read pod {ref.namespace}/{name}: {err}"
                            )
                            del fetched[uid]
                            break
                        pod = None
                    pods[key] = pod
                pod = pods[key]
                if pod is not None and (pod.get("metadata") or {}).get("uid") != pod_uid:
                    pods[key] = None
        return [pod for pod in pods.values() if pod is not None]

    def _pods_forbidden(self, err: KubeApiError) -> None:
        """Without `get` on pods the claims are prepared with their own indices, unchecked against the
        containers (right for a container with one HAMi claim, as the webhook's translations have)."""
        if not self._forbidden_logged:
            self._forbidden_logged = True
            log.warning(
                "cannot read the pods claims are reserved for (%s): claims keep their own GPU indices and a "
                "container combining several HAMi claims is not checked; grant get on pods to hami-node",
                err,
            )

    def _prepare_locked(
        self, fetched: Mapping[str, tuple[ClaimRef, Mapping[str, Any]]], pods: Sequence[Mapping[str, Any]]
    ) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {}
        checkpoint = self._load()
        gpus = claim_gpus(self._gpus(), self._config)
        pool = self._config.node_name
        new: dict[str, tuple[ClaimRef, tuple[Share, ...], bool]] = {}
        mig_new: dict[str, tuple[ClaimRef, tuple[Share, ...], bool]] = {}
        for uid, (ref, claim) in fetched.items():
            stored = checkpoint.claims.get(uid)
            if stored is not None:
                out[uid] = self._keep(stored)
                continue
            try:
                shares = allocation_shares(claim, ref.key, driver=self._config.dra_driver_name, pool=pool)
                if any(sl.parse_mig_device_name(s.device) is not None for s in shares):
                    mig_new[uid] = (ref, shares, is_pod_private(claim))
                    continue
                check_devices(ref.key, pool, shares, gpus)
            except ClaimError as err:
                out[uid] = Outcome(error=str(err))
                continue
            new[uid] = (ref, shares, is_pod_private(claim))
        for uid, (ref, shares, private) in mig_new.items():
            outcome = self._prepare_mig(ref, pool, shares, private)
            out[uid] = outcome
            if outcome.claim is not None:
                checkpoint = checkpoint.with_claim(outcome.claim)
        if not new:
            if mig_new:
                return self._save_prepared(checkpoint, mig_new, out)
            return out
        indices = self._indices(new, checkpoint, pods, gpus)
        for uid, (ref, shares, private) in new.items():
            if uid in indices.errors:
                out[uid] = Outcome(error=f"claim {ref.key}: {indices.errors[uid]}")
                continue
            try:
                prepared = prepare_claim(
                    ref, pool, shares, gpus, indices.indices[uid], sole=indices.sole[uid], private=private
                )
                self._write(prepared)
            except ClaimError as err:
                out[uid] = Outcome(error=str(err))
                continue
            except OSError as err:
                out[uid] = Outcome(error=f"claim {ref.key}: cannot write its CDI spec or directory: {err}")
                continue
            checkpoint = checkpoint.with_claim(prepared)
            out[uid] = Outcome(prepared)
        return self._save_prepared(checkpoint, {**new, **mig_new}, out)

    def _save_prepared(
        self,
        checkpoint: ckpt.Checkpoint,
        new: Mapping[str, tuple[ClaimRef, tuple[Share, ...], bool]],
        out: dict[str, Outcome],
    ) -> dict[str, Outcome]:
        """Save the checkpoint with the newly prepared claims; if it cannot be saved, each of them fails
        (and the MIG devices made for them are destroyed: nothing would know them)."""
        try:
            self._save(checkpoint)
        except OSError as err:
            message = f"cannot save the DRA checkpoint {self.checkpoint_path}: {err}"
            log.error("%s", message)
            for uid in new:
                done = out[uid].claim
                if done is not None:
                    if done.mig and self._backend is not None:
                        for error in release_mig_devices(
                            self._backend, [(m.parent_uuid, m.gpu_instance_id) for m in done.mig]
                        ):
                            log.error("claim %s: cannot roll back its MIG device: %s", done.key, error)
                    out[uid] = Outcome(error=f"claim {new[uid][0].key}: {message}")
            return out
        for uid in new:
            done = out[uid].claim
            if done is not None:
                self.prepared += 1
                log.info(
                    "prepared claim %s (%s): %s",
                    done.key,
                    uid,
                    ", ".join(f"{d.device} #{d.index} {d.memory_mib}MiB {d.cores}%" for d in done.devices),
                )
        return out

    def _indices(
        self,
        new: Mapping[str, tuple[ClaimRef, tuple[Share, ...], bool]],
        checkpoint: ckpt.Checkpoint,
        pods: Sequence[Mapping[str, Any]],
        gpus: Mapping[str, ClaimGpu],
    ) -> Indices:
        plans: dict[str, ClaimPlan] = {}
        by_name: dict[str, dict[str, str]] = {}
        for uid, stored in checkpoint.claims.items():
            if stored.mig:
                continue  # MIG partitions carry no HAMi-core indices
            plans[uid] = ClaimPlan(
                stored.key,
                tuple((d.request, d.device) for d in stored.devices),
                stored.private,
                stored.indices(),
            )
            by_name.setdefault(stored.namespace, {})[stored.name] = uid
        for uid, (ref, shares, private) in new.items():
            plans[uid] = ClaimPlan(ref.key, tuple((s.request, s.device) for s in shares), private)
            by_name.setdefault(ref.namespace, {})[ref.name] = uid
        uses = [
            use
            for pod in pods
            for use in container_uses(
                pod, by_name.get((pod.get("metadata") or {}).get("namespace") or "default", {})
            )
        ]
        order = {name: gpu_order(gpu) for name, gpu in gpus.items()}
        for plan in plans.values():  # a prepared claim's GPU may be gone since: it sorts last
            for _, device in plan.devices:
                order.setdefault(device, ((1 << 64,), device, 0))
        return assign_indices(plans, uses, order)

    def _keep(self, claim: PreparedClaim) -> Outcome:
        """A claim prepared before: the same answer; its spec written again if it is missing (a node
        reboot empties /var/run/cdi), its directory created if missing, never emptied."""
        try:
            if not (self._cdi_dir / claim_spec_file_name(claim.uid)).exists():
                log.warning("claim %s: its CDI spec was missing; written again", claim.key)
                self._write(claim)
            elif not claim.mig:
                self._make_dir(claim.uid)
        except (OSError, ClaimError) as err:
            return Outcome(error=f"claim {claim.key}: cannot write its CDI spec or directory: {err}")
        return Outcome(claim)

    def _prepare_mig(self, ref: ClaimRef, pool: str, shares: Sequence[Share], private: bool) -> Outcome:
        """A claim of MIG partitions: each partition's MIG device made (or found, on a retry), the
        claim's CDI spec written; on any failure the devices made for it are destroyed."""
        if self._backend is None:
            return Outcome(error=f"claim {ref.key}: MIG partitions are not served by this hami-node")
        try:
            others = [s.device for s in shares if sl.parse_mig_device_name(s.device) is None]
            if others:
                raise ClaimError(
                    f"claim {ref.key}: devices {', '.join(others)} are GPU shares and the others MIG "
                    "partitions; one claim holds one kind: split the requests into two claims"
                )
            uuids = {g.info.minor: g.uuid for g in self._gpus() if g.info.mig_enabled}
            targets = [mig_target(s.device, self._backend, uuids) for s in shares]
            made = ensure_mig_devices(self._backend, targets)
        except ClaimError as err:
            message = str(err)
            return Outcome(error=message if message.startswith("claim ") else f"claim {ref.key}: {message}")
        devices = tuple(
            PreparedDevice(
                request=share.request,
                device=share.device,
                share_id=share.share_id,
                gpu=mig.parent_uuid,
                minor=target.minor,
                index=i,
                memory_mib=mig.memory_mib,
                cores=100,
                cdi_name=cdi_device_name(ref.uid, share.device, share.share_id),
                mig=MigRecord(
                    mig.parent_uuid,
                    mig.gpu_instance_id,
                    mig.uuid,
                    mig.profile,
                    mig.placement.start,
                    mig.placement.size,
                ),
            )
            for i, (share, target, mig) in enumerate(zip(shares, targets, made, strict=True))
        )
        prepared = PreparedClaim(ref.namespace, ref.name, ref.uid, pool, devices, sole=True, private=private)
        try:
            self._write(prepared)
        except (OSError, ClaimError) as err:
            for error in release_mig_devices(
                self._backend, [(m.parent_uuid, m.gpu_instance_id) for m in made]
            ):
                log.error("claim %s: cannot roll back its MIG device: %s", ref.key, error)
            return Outcome(error=f"claim {ref.key}: cannot write its CDI spec: {err}")
        return Outcome(prepared)

    def _write(self, claim: PreparedClaim) -> None:
        if claim.mig:
            spec = mig_claim_spec(claim, self._common_nodes())
            write_spec(self._cdi_dir, encode_spec(spec), claim_spec_file_name(claim.uid))
            return
        spec = claim_spec(claim, self._config, self._common_nodes(), license_present=self._license_present())
        self._make_dir(claim.uid)
        write_spec(self._cdi_dir, encode_spec(spec), claim_spec_file_name(claim.uid))

    def _make_dir(self, uid: str) -> None:
        path = claim_dir(self._config, uid)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)

    # --- unprepare -------------------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID: "" when done (also for a claim never prepared here), else the error."""
        out: dict[str, str] = {}
        with self._serialized():
            checkpoint = self._load()
            before = checkpoint
            for ref in refs:
                error = _bad_uid(ref)
                if error:
                    out[ref.uid] = error
                    continue
                stored = checkpoint.claims.get(ref.uid)
                if stored is not None and stored.mig:
                    errors = self._release_mig(stored)
                    if errors:
                        out[ref.uid] = f"claim {ref.key}: cannot destroy its MIG devices: {'; '.join(errors)}"
                        continue
                try:
                    removed = remove_spec(self._cdi_dir, claim_spec_file_name(ref.uid))
                    directory = claim_dir(self._config, ref.uid)
                    if os.path.isdir(directory):
                        shutil.rmtree(directory)
                except OSError as err:
                    out[ref.uid] = f"claim {ref.key}: cannot remove its CDI spec or directory: {err}"
                    continue
                out[ref.uid] = ""
                known = ref.uid in checkpoint.claims
                checkpoint = checkpoint.without(ref.uid)
                if known or removed:
                    self.unprepared += 1
                    log.info("unprepared claim %s (%s)", ref.key, ref.uid)
            if checkpoint != before:
                try:
                    self._save(checkpoint)
                except OSError as err:
                    message = f"cannot save the DRA checkpoint {self.checkpoint_path}: {err}"
                    log.error("%s", message)
                    return {uid: error or f"claim {uid}: {message}" for uid, error in out.items()}
        return out

    def _release_mig(self, claim: PreparedClaim) -> list[str]:
        """Destroy the MIG devices of a prepared claim (one already gone counts as destroyed)."""
        if self._backend is None:
            return ["MIG partitions are not served by this hami-node"]
        errors = release_mig_devices(self._backend, [(m.parent_uuid, m.gpu_instance_id) for m in claim.mig])
        if not errors:
            log.info("claim %s: destroyed MIG devices %s", claim.key, ", ".join(m.uuid for m in claim.mig))
        return errors

    # --- the lock and the checkpoint ------------------------------------------------------------------

    @contextlib.contextmanager
    def _serialized(self) -> Iterator[None]:
        with self._mutex:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _load(self) -> ckpt.Checkpoint:
        """The checkpoint (empty when there is none); a bad one is moved aside to `<file>.bad`."""
        path = self.checkpoint_path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return ckpt.Checkpoint()
        try:
            return ckpt.decode(data)
        except ckpt.CheckpointError as err:
            aside = path.with_name(f"{path.name}.bad")
            log.error(
                "DRA checkpoint %s cannot be used (%s): moved to %s, starting without it (claims prepared "
                "again get the same answer; Unprepare finds a claim's files by its UID)",
                path,
                err,
                aside,
            )
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            return ckpt.Checkpoint()

    def _save(self, checkpoint: ckpt.Checkpoint) -> None:
        write_atomic(self.checkpoint_path, ckpt.encode(checkpoint), mode=0o600)


def _bad_uid(ref: ClaimRef) -> str:
    """A UID that cannot name a file safely (Kubernetes UIDs are UUIDs) is refused."""
    if _UID.fullmatch(ref.uid):
        return ""
    return f"claim {ref.key}: UID {ref.uid!r} is not a Kubernetes UID"


__all__ = ["LOCK_FILE", "ClaimPreparer", "ClaimSource", "Outcome"]


# --- MIG partitions: the instance behind an allocated partition ------------------------------------------
#
# A claim allocated a partition `gpu-<minor>-mig-<profile>-<giProfileId>-<start>` (hami_node.dra.slices)
# gets its GPU instance (with one compute instance spanning it) at NodePrepareResources and loses it at
# NodeUnprepareResources, as NVIDIA's DRA driver does with DynamicMIG (cmd/gpu-kubelet-plugin
# device_state.go: prepare creates, unprepare destroys; a MIG device that already exists at the same
# profile and placement is the one an interrupted earlier Prepare made, so a retry takes it). All or
# nothing per claim: when one partition of a claim cannot be created, those created for it are destroyed
# before the error goes back.


@dataclass(frozen=True, slots=True)
class MigTarget:
    """The MIG device an allocated partition asks for."""

    device: str
    parent_uuid: str
    profile: str
    placement: Placement
    minor: int = 0


def mig_target(device: str, backend: GPUBackend, uuid_by_minor: Mapping[int, str]) -> MigTarget:
    """The partition's GPU, profile and placement, from its name and the GPU's profiles. ClaimError
    naming the device when the name is not a partition's, the GPU is unknown, or the GPU has no such
    profile or placement."""
    parsed = sl.parse_mig_device_name(device)
    if parsed is None:
        raise ClaimError(f"device {device}: not a MIG partition (gpu-<minor>-mig-<profile>-<id>-<start>)")
    minor, profile_id, start = parsed
    uuid = uuid_by_minor.get(minor)
    if uuid is None:
        raise ClaimError(f"device {device}: no GPU with minor {minor} on this node")
    for profile in backend.mig_profiles(uuid):
        if profile.profile_id == profile_id:
            placement = profile.placement_at(start)
            if placement is None:
                raise ClaimError(
                    f"device {device}: profile {profile.name} of GPU {uuid} has no placement at {start} "
                    f"(possible: {', '.join(str(p) for p in profile.placements)})"
                )
            return MigTarget(device, uuid, profile.name, placement, minor)
    raise ClaimError(f"device {device}: GPU {uuid} has no MIG profile with ID {profile_id}")


def ensure_mig_devices(backend: GPUBackend, targets: Sequence[MigTarget]) -> list[MigDevice]:
    """The MIG device of every target, created unless one with its profile and placement exists
    (idempotent across retries). On a failure the devices created by this call are destroyed and
    ClaimError names the GPU, the partition and why."""
    created: list[MigDevice] = []
    out: list[MigDevice] = []
    try:
        for target in targets:
            existing = next(
                (
                    m
                    for m in backend.mig_devices(target.parent_uuid)
                    if m.profile == target.profile and m.placement == target.placement
                ),
                None,
            )
            if existing is None:
                existing = backend.create_mig_device(target.parent_uuid, target.profile, target.placement)
                created.append(existing)
            out.append(existing)
    except GPUBackendError as err:
        for device in reversed(created):
            try:
                backend.destroy_mig_device(device.parent_uuid, device.gpu_instance_id)
            except GPUBackendError as undo:
                log.error(
                    "cannot roll back MIG device %s on GPU %s: %s", device.uuid, device.parent_uuid, undo
                )
        raise ClaimError(f"MIG device for {target.device} on GPU {target.parent_uuid}: {err}") from None
    return out


def release_mig_devices(backend: GPUBackend, devices: Sequence[tuple[str, int]]) -> list[str]:
    """Destroy the MIG devices (parent UUID, GPU instance ID) a claim held; one already gone counts as
    destroyed. Returns the errors (an instance still in use stays, and Unprepare reports it)."""
    errors: list[str] = []
    for parent, gpu_instance_id in devices:
        try:
            backend.destroy_mig_device(parent, gpu_instance_id)
        except MigInstanceNotFound:
            continue
        except GPUBackendError as err:
            errors.append(f"GPU {parent} instance {gpu_instance_id}: {err}")
    return errors


def mig_env(devices: Sequence[MigDevice]) -> dict[str, str]:
    """What the container gets: NVIDIA_VISIBLE_DEVICES with the MIG UUIDs (no HAMi-core limits: MIG
    isolates in hardware)."""
    return {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices)}
