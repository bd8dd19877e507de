"""NodePrepareResources and NodeUnprepareResources, the I/O around the pure core (`claims`): reading the
claims and their pods, the serialization lock, the checkpoint (`checkpoint`: a journal), the claims' CDI
specs and directories.

Prepare, as the upstream helper does it (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go
`NodePrepareResources`, `getResourceClaims`): every claim is read from the API server *before* the
serialization lock is taken (slow calls never hold it), must have the UID kubelet names ("got replaced")
and be allocated ("not allocated"); the pods in its `status.reservedFor` are needed too, for the
container-visible GPU order (`claims.assign_indices`: a container naming several claims sees their GPUs in
one order, and a claim private to its pod takes the indices its containers see; kubelet's Prepare request
names no container, so the pod is where that is read): taken from the node's pod watch when it holds the
pod with the reserved UID (`watched.WatchedPods`; no API call), read otherwise. Then, under the lock: the
checkpoint is brought up to date (below); a claim already in it answers with what it got then (its CDI
spec written again if it went missing, its directory kept: Prepare never wipes a prepared claim's shared
cache, which the pods already using it hold); the others are prepared: their spec written
(`hami_node.cdi`, atomic), their directory `<hook>/vgpu/claims/<uid>` created (mode 0777, as HAMi's cache
directories), and one journal record per claim appended and synced before the answer. Every failure is
the claim's own error; the call itself never fails for one claim.

Unprepare, under the lock: the claim's spec file and directory are removed by its UID (so a claim the
checkpoint does not know, e.g. after a lost checkpoint, is cleaned up too, and an unknown one is
simply done) and a `del` record appended for a claim the checkpoint knew.

The lock is a mutex plus `flock` on `<plugin dir>/serialize.lock` (the file kept open: opening it on
every call was two inotify events for the daemon's socket watch). Every call stats the journal under
the lock and trusts the claims it holds in memory only while the file is the one it last read or wrote
(device, inode, size, mtime): records another instance appended are read from where it left off, a
file written anew is read whole. So two daemon instances during a rolling update (the upstream helper's
RollingUpdate, whose instances "must be entirely stateless across method calls") share the state
through the file, and a call's cost does not grow with the claims prepared before it.

What each sync protects (`hami_node.durable`; a crash or power cut at any point):
- the journal's `fdatasync` after each append: a claim answered prepared (or unprepared) is in the
  journal after a restart, so Prepare again answers the same and Unprepare finds its MIG devices;
- the journal written whole (first start, compaction, a version 1 file taken over): `write_atomic`'s
  file fsync (the new file is whole before it replaces the old) and directory fsync (the rename holds);
- a torn tail is cut off (`ftruncate` + `fsync`) before the next append, so no good record ever follows
  a bad one;
- a claim's CDI spec: `write_atomic` (file, then directory), so the spec the runtime reads is never
  empty or short: `_keep` writes a spec again only when it is missing;
- the version 1 file is removed (`remove_durably`) only after the journal holding its claims is synced.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import threading
from collections import ChainMap
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
    ContainerUse,
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
from hami_node.durable import is_temporary, remove_durably, write_atomic
from hami_node.gpu import GPUBackend, GPUBackendError, MigDevice, MigInstanceNotFound

log = logging.getLogger(__name__)

LOCK_FILE = "serialize.lock"
"""The upstream helper's lock file name (kubeletplugin/draplugin.go, RollingUpdate)."""
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class ClaimSource(Protocol):
    """The reads Prepare makes (`hami_node.kubeapi.NodeApi` is one). Errors: `KubeApiError`."""

    def get_resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class PodLookup(Protocol):
    """Pods from memory (`watched.WatchedPods`, fed by the node's pod watch): the pod with that UID when
    it can stand for the pod read now, else None (never waits)."""

    def pod(self, namespace: str, name: str, uid: str) -> Mapping[str, Any] | None: ...


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
        watched: PodLookup | None = None,
    ) -> None:
        self._config = config
        self._watched = watched
        """The node's pods from its pod watch, asked before a pod is read (None: always read)."""
        self._backend = backend
        """Creates and destroys the MIG devices of claims of MIG partitions (None: such claims fail)."""
        self._gpus = gpus
        self._source = source
        self._common_nodes = common_nodes
        self._license_present = license_present
        self._dir = config.dra_plugin_dir
        self._cdi_dir = config.cdi_spec_dir
        self._mutex = threading.Lock()
        self._lock_fd: int | None = None
        self._lock_identity: tuple[int, int] | None = None
        self._claims: dict[str, PreparedClaim] = {}
        """The journal's claims, as of `_identity`."""
        self._names: dict[str, dict[str, str]] = {}
        """Namespace -> claim name -> UID of the claims of GPU shares in `_claims` (for `_indices`)."""
        self._identity: tuple[int, int, int, int] | None = None
        """(device, inode, size, mtime ns) of the journal when last read or written; None: read it."""
        self._length = 0
        """Bytes of valid records in the journal (where the next append goes)."""
        self._records = 0
        """Records after the header."""
        self.prepared = 0
        """Claims prepared (newly) since start."""
        self.pods_read = 0
        """Pods read from the API server for new claims since start."""
        self.pods_watched = 0
        """Pods of new claims taken from the pod watch instead (`watched`) since start."""
        self._forbidden_logged = False
        self.unprepared = 0

    @property
    def watched(self) -> PodLookup | None:
        """The pods from the node's pod watch that Prepare asks before reading a pod."""
        return self._watched

    @property
    def checkpoint_path(self) -> Path:
        """The journal (`checkpoint`, version 2)."""
        return self._dir / ckpt.STATE_DIR / ckpt.JOURNAL_FILE

    @property
    def legacy_checkpoint_path(self) -> Path:
        """Where hami-nodes before the journal kept their checkpoint (version 1), read at start-up."""
        return self._dir / ckpt.FILE_NAME

    def start(self) -> None:
        """Create the plugin directory, remove the temporary files of interrupted spec and journal
        writes, take over a version 1 checkpoint, and read the journal once (a bad file is moved aside
        now, with an error in the log). Raises OSError."""
        self._dir.mkdir(parents=True, exist_ok=True)
        for path in remove_stale_claim_temps(self._cdi_dir):
            log.info("removed %s, left by an interrupted write", path)
        state = self.checkpoint_path.parent
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(state):
                if is_temporary(name, ckpt.JOURNAL_FILE):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(state / name)
                    log.info("removed %s, left by an interrupted write", state / name)
        with self._serialized():
            self._take_over_legacy()
            self._sync()
            claims = len(self._claims)
        if claims:
            log.info("DRA checkpoint %s: %d prepared claims", self.checkpoint_path, claims)

    def close(self) -> None:
        """Close the lock file and forget the state (a later call reads the journal again)."""
        with self._mutex:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = self._lock_identity = None
            self._identity = None

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
        # A claim prepared before answers from the checkpoint: its pods are not read. The claims in
        # memory are a glance without the lock (the dict is replaced, never changed in place); one
        # unprepared meanwhile is sent back by `_prepare_locked`, and prepared after its pods are read.
        glance = self._claims
        unread = {uid: f for uid, f in fetched.items() if uid in glance}
        to_read = {uid: f for uid, f in fetched.items() if uid not in glance}
        pods = self._read_pods(to_read, out)
        with self._serialized():
            done, retry = self._prepare_locked({**unread, **to_read}, pods, set(unread))
        out.update(done)
        if retry:
            pods = self._read_pods(retry, out)
            with self._serialized():
                done, _ = self._prepare_locked(retry, pods, set())
            out.update(done)
        return out

    def _read_pods(
        self, fetched: dict[str, tuple[ClaimRef, Mapping[str, Any]]], out: dict[str, Outcome]
    ) -> list[Mapping[str, Any]]:
        """The pods the claims are reserved for (each once): from the pod watch when it has the pod
        with the reserved UID (`watched`), else read; a claim whose pod cannot be read fails (kubelet
        retries), a pod that is gone or was replaced is left out."""
        pods: dict[tuple[str, str], Mapping[str, Any] | None] = {}
        for uid, (ref, claim) in list(fetched.items()):
            for name, pod_uid in reserved_pods(claim):
                key = (ref.namespace, name)
                if key not in pods and self._watched is not None:
                    seen = self._watched.pod(ref.namespace, name, pod_uid)
                    if seen is not None:
                        self.pods_watched += 1
                        pods[key] = seen
                if key not in pods:
                    self.pods_read += 1
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
        self,
        fetched: Mapping[str, tuple[ClaimRef, Mapping[str, Any]]],
        pods: Sequence[Mapping[str, Any]],
        unread: set[str],
    ) -> tuple[dict[str, Outcome], dict[str, tuple[ClaimRef, Mapping[str, Any]]]]:
        """The outcomes, and the claims of `unread` (whose pods were not read) that turn out to be new:
        to be prepared again once their pods are read."""
        out: dict[str, Outcome] = {}
        retry: dict[str, tuple[ClaimRef, Mapping[str, Any]]] = {}
        self._sync()
        stored_claims = self._claims
        gpus = claim_gpus(self._gpus(), self._config)
        pool = self._config.node_name
        new: dict[str, tuple[ClaimRef, tuple[Share, ...], bool]] = {}
        mig_new: dict[str, tuple[ClaimRef, tuple[Share, ...], bool]] = {}
        for uid, (ref, claim) in fetched.items():
            stored = stored_claims.get(uid)
            if stored is not None:
                out[uid] = self._keep(stored)
                continue
            if uid in unread:
                retry[uid] = (ref, claim)
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
            out[uid] = self._prepare_mig(ref, pool, shares, private)
        if not new:
            if mig_new:
                return self._save_prepared(mig_new, out), retry
            return out, retry
        indices = self._indices(new, pods, gpus)
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
            out[uid] = Outcome(prepared)
        return self._save_prepared({**new, **mig_new}, out), retry

    def _save_prepared(
        self, new: Mapping[str, tuple[ClaimRef, tuple[Share, ...], bool]], out: dict[str, Outcome]
    ) -> dict[str, Outcome]:
        """Record the newly prepared claims in the journal; if that fails, each of them fails (and the
        MIG devices made for them are destroyed: nothing would know them)."""
        ready = [claim for uid in new if (claim := out[uid].claim) is not None]
        try:
            if ready:
                self._commit(put=ready)
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
        pods: Sequence[Mapping[str, Any]],
        gpus: Mapping[str, ClaimGpu],
    ) -> Indices:
        """The new claims' indices, checked against the containers of their pods: the plans are the new
        claims and the prepared ones those containers name (their indices fixed), never every claim
        prepared on the node. MIG partitions carry no HAMi-core indices and are in neither."""
        plans: dict[str, ClaimPlan] = {}
        new_names: dict[str, dict[str, str]] = {}
        for uid, (ref, shares, private) in new.items():
            plans[uid] = ClaimPlan(ref.key, tuple((s.request, s.device) for s in shares), private)
            new_names.setdefault(ref.namespace, {})[ref.name] = uid
        uses: list[ContainerUse] = []
        for pod in pods:
            namespace = (pod.get("metadata") or {}).get("namespace") or "default"
            names = ChainMap(new_names.get(namespace, {}), self._names.get(namespace, {}))
            uses.extend(container_uses(pod, names))
        for use in uses:
            for uid, _ in use.claims:
                stored = self._claims.get(uid) if uid not in plans else None
                if stored is not None:
                    plans[uid] = ClaimPlan(
                        stored.key,
                        tuple((d.request, d.device) for d in stored.devices),
                        stored.private,
                        stored.indices(),
                    )
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
            self._sync()
            checkpoint = self._claims
            gone: list[str] = []
            for ref in refs:
                error = _bad_uid(ref)
                if error:
                    out[ref.uid] = error
                    continue
                stored = checkpoint.get(ref.uid)
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
                known = ref.uid in checkpoint and ref.uid not in gone
                if known:
                    gone.append(ref.uid)
                if known or removed:
                    self.unprepared += 1
                    log.info("unprepared claim %s (%s)", ref.key, ref.uid)
            if gone:
                try:
                    self._commit(delete=gone)
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
            fd = self._lock_file()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _lock_file(self) -> int:
        """The open lock file; opened again when the file at its path is another one (removed, or the
        directory made anew), so that every instance locks the same file."""
        path = self._dir / LOCK_FILE
        try:
            st = os.stat(path)
            identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            identity = None
        if self._lock_fd is not None and identity == self._lock_identity:
            return self._lock_fd
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        st = os.fstat(fd)
        self._lock_fd, self._lock_identity = fd, (st.st_dev, st.st_ino)
        return fd

    def _sync(self) -> None:
        """Bring `_claims` up to the journal (under the lock): nothing to do while the file is the one
        last read or written; records appended since (by another instance) are read from where they
        start; a file written anew, or changed otherwise, is read whole. A bad file is moved aside to
        `<file>.bad` (the claims start empty); a torn last record is cut off, its reason logged."""
        path = self.checkpoint_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if self._identity is not None or self._claims:
                log.warning("DRA checkpoint %s is gone; starting without it", path)
            self._set_state({}, None, 0, 0)
            return
        identity = _identity(st)
        if identity == self._identity:
            return
        known = self._identity
        grown = known is not None and identity[:2] == known[:2] and st.st_size > self._length
        try:
            with open(path, "rb") as f:
                if grown:
                    f.seek(self._length)
                data = f.read()
            if grown:
                journal = ckpt.decode_journal(data, self._claims, offset=self._length)
                journal.records += self._records
            else:
                journal = ckpt.decode_journal(data)
        except ckpt.CheckpointError as err:
            self._move_aside(path, str(err))
            self._set_state({}, None, 0, 0)
            return
        if journal.torn:
            log.warning(
                "DRA checkpoint %s: the last record was not written whole (%s; a write a crash or a full "
                "disk interrupted, never answered): ignored, the file cut back to %d bytes",
                path,
                journal.torn,
                journal.length,
            )
            with open(path, "r+b") as f:
                f.truncate(journal.length)
                os.fsync(f.fileno())
            identity = _identity(os.stat(path))
        self._set_state(journal.claims, identity, journal.length, journal.records)

    def _set_state(
        self,
        claims: dict[str, PreparedClaim],
        identity: tuple[int, int, int, int] | None,
        length: int,
        records: int,
    ) -> None:
        self._claims = claims
        self._names = {}
        for uid, claim in claims.items():
            if not claim.mig:
                self._names.setdefault(claim.namespace, {})[claim.name] = uid
        self._identity, self._length, self._records = identity, length, records

    def _move_aside(self, path: Path, reason: str) -> None:
        aside = path.with_name(f"{path.name}.bad")
        log.error(
            "DRA checkpoint %s cannot be used (%s): moved to %s, starting without it (claims prepared "
            "again get the same answer; Unprepare finds a claim's files by its UID)",
            path,
            reason,
            aside,
        )
        with contextlib.suppress(OSError):
            os.replace(path, aside)

    def _take_over_legacy(self) -> None:
        """A version 1 checkpoint (an earlier hami-node's): its claims become the journal's (it is the
        newest state: this version removes it once taken over, so one there was written after), then
        it is removed. A bad one is moved aside."""
        legacy = self.legacy_checkpoint_path
        try:
            data = legacy.read_bytes()
        except FileNotFoundError:
            return
        try:
            claims = dict(ckpt.decode(data).claims)
        except ckpt.CheckpointError as err:
            self._move_aside(legacy, str(err))
            return
        self._rewrite(claims)
        remove_durably(legacy)
        log.info(
            "DRA checkpoint: took over %d prepared claims from %s (version %d) into %s",
            len(claims),
            legacy,
            ckpt.VERSION,
            self.checkpoint_path,
        )

    def _rewrite(self, claims: dict[str, PreparedClaim]) -> None:
        """Write the journal whole, holding `claims` (atomically and durably)."""
        data = ckpt.encode_journal(claims)
        write_atomic(self.checkpoint_path, data, mode=0o600)
        self._set_state(claims, _identity(os.stat(self.checkpoint_path)), len(data), len(claims))

    def _commit(self, *, put: Sequence[PreparedClaim] = (), delete: Sequence[str] = ()) -> None:
        """Append the records of prepared (`put`) and unprepared (`delete`) claims and sync them; then
        the claims in memory follow. Written whole again when the records outnumber twice the live
        claims. Raises OSError (the journal is cut back to its valid records, the claims unchanged)."""
        claims = dict(self._claims)
        for claim in put:
            claims[claim.uid] = claim
        for uid in delete:
            claims.pop(uid, None)
        records = self._records + len(put) + len(delete)
        if self._identity is None or records > max(ckpt.COMPACT_MIN_RECORDS, 2 * len(claims)):
            self._rewrite(claims)  # no journal yet (or it was moved aside), or time to compact
            return
        data = b"".join(ckpt.encode_put(c) for c in put) + b"".join(ckpt.encode_del(u) for u in delete)
        path = self.checkpoint_path
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fdatasync(fd)
            except OSError:
                self._identity = None  # read again next time, whatever is there
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._length)
                    os.fsync(fd)
                raise
            identity = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        if identity[:2] != self._identity[:2]:
            self._identity = None  # another file took the path meanwhile (not under our lock): reread
            return
        added = [c for c in put if not c.mig]
        for claim in added:
            self._names.setdefault(claim.namespace, {})[claim.name] = claim.uid
        for uid in delete:
            old = self._claims.get(uid)
            if old is not None and self._names.get(old.namespace, {}).get(old.name) == uid:
                del self._names[old.namespace][old.name]
        self._claims = claims
        self._identity, self._length, self._records = identity, self._length + len(data), records


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _bad_uid(ref: ClaimRef) -> str:
    """A UID that cannot name a file safely (Kubernetes UIDs are UUIDs) is refused."""
    if _UID.fullmatch(ref.uid):
        return ""
    return f"claim {ref.key}: UID {ref.uid!r} is not a Kubernetes UID"


__all__ = ["LOCK_FILE", "ClaimPreparer", "ClaimSource", "Outcome", "PodLookup"]


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
