"""Keeps this node's ResourceSlices equal to its GPUs (`slices` builds them: one slice, or with GPUs in MIG
mode the pool of `slices.node_slice_specs`, compared and written as `slices.plan_pool` says, every slice
of the pool with one generation): published at start, after every
change of the GPUs or their health, and again whenever it is deleted (kubelet wipes a node's slices when
it starts, and a driver's slices after 30 s without a connected plugin: k8s.io/kubernetes
pkg/kubelet/cm/dra/manager.go, defaultWipingDelay) or changed by someone else.

One thread does every write. It is woken by the device state (`DeviceState.wait_for_change`) and by the
watch of the node's slices of the driver (`kubeapi.watch_node_slices`, a `hami_kube` reflector with the
field selectors `spec.nodeName`, `spec.driver`, whose deliveries land in `slices_listed` /
`slice_event`). Each turn compares what the API server holds with what the GPUs say and writes only the
difference: extra slices (other pools, duplicates, older generations) deleted with UID and
resourceVersion preconditions, the pool's slice created or updated with the generation bumped. A slice
written is kept in the local store at once (the helper's MutationCache), so a late watch event never
leads to a second create; unless the watch has already delivered its deletion (kubelet's wipe at start
can delete the slice between the create and its answer): a deleted slice is never put back. A 409
(someone wrote in between) re-reads the slices and tries again; other failures retry with `hami_kube`'s
backoff.

Consumable capacity: the first slice is published with it; when the stored slice comes back without
`allowMultipleAllocations` (`slices.consumable_dropped`), the cluster does not have it (gate
`DRAConsumableCapacity`), so whole GPUs are published from then on, and that is said once in a warning
log line and a Warning Event `DRAConsumableCapacityUnavailable` on the Node.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hami_api.annotations import NODE_PAIR_SCORE, NODE_REGISTER
from hami_api.dra import device_name
from hami_api.mig import GIProfile
from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.errors import KubeApiError
from hami_kube.events import rfc3339
from hami_node.config import NodeConfig
from hami_node.devices import DeviceState, GPUStatus
from hami_node.dra import slices as sl
from hami_node.gpu import GPUBackendError

log = logging.getLogger(__name__)

NO_CONSUMABLE_CAPACITY_REASON = "DRAConsumableCapacityUnavailable"
NODE_EVENT_NAMESPACE = "default"
"""A Node is not namespaced; its Events go to default (as kubelet's and HAMi's)."""


class SliceApi(Protocol):
    """The calls the publisher makes (`hami_node.kubeapi.NodeApi` is one). Errors: `KubeApiError`."""

    def get_node(self, name: str) -> Mapping[str, Any]: ...

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]: ...

    def list_resource_slices(self, field_selector: str) -> list[dict[str, Any]]: ...

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def update_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete_resource_slice(self, name: str, uid: str = "", resource_version: str = "") -> None: ...


class NodeEvents(Protocol):
    """Where the Event goes (`hami_kube.blocking.ThreadedEventRecorder`): fire and forget."""

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, kind: str = "Pod"
    ) -> None: ...


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def _version(obj: Mapping[str, Any]) -> int | None:
    meta = obj.get("metadata")
    text = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _newer(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` may replace `old` in the store: not when both carry numeric resourceVersions and
    `new`'s is older (a watch event late behind our own write). resourceVersions are opaque, so any
    other pair counts as newer."""
    if old is None:
        return True
    a, b = _version(old), _version(new)
    return a is None or b is None or b >= a


class SlicePublisher:
    """See the module docstring. `now` is the wall clock (taints' timeAdded)."""

    def __init__(
        self,
        config: NodeConfig,
        state: DeviceState,
        api: SliceApi,
        *,
        events: NodeEvents | None = None,
        now: Callable[[], float] = time.time,
        retry: RetryPolicy = DEFAULT_RETRY,
        rng: random.Random | None = None,
        mig_profiles: Callable[[str], Sequence[GIProfile]] | None = None,
    ) -> None:
        self._config = config
        self._mig_profiles = mig_profiles
        """A GPU's MIG profiles (the backend's `mig_profiles`): with it, GPUs in MIG mode are published as
        their partitions (`slices.node_slice_specs`); without it, as whole GPUs (as before)."""
        self._profiles: dict[str, tuple[GIProfile, ...]] = {}
        self._mig_taint_since: dict[tuple[str, str], str] = {}
        self._node = config.node_name
        self._driver = config.dra_driver_name
        self._state = state
        self._api = api
        self._events = events
        self._now = now
        self._backoff = retry.backoff(rng)
        self._lock = threading.Lock()
        self._store: dict[str, dict[str, Any]] = {}
        self._deleted: dict[str, int | None] = {}
        """Slices whose deletion the watch delivered since the last list, with its resourceVersion."""
        self._kicked = threading.Event()
        self._listed = threading.Event()
        """Set once the slices the API server holds are known (the watch's first list, or a relist):
        before that a create could duplicate a slice of an earlier run."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._node_uid: str | None = None
        self._consumable = True
        self._taint_since: dict[tuple[str, str], str] = {}
        self._cond = threading.Condition()
        self._writes = 0
        self._synced = False

    # --- public ---------------------------------------------------------------------------------------

    @property
    def consumable(self) -> bool:
        """Whether slices are published with consumable capacity (False once the cluster dropped it)."""
        return self._consumable

    @property
    def writes(self) -> int:
        """Creates, updates and deletes made."""
        with self._cond:
            return self._writes

    @property
    def synced(self) -> bool:
        """Whether the API server has held the node's slice as the GPUs say at least once."""
        with self._cond:
            return self._synced

    def wait_writes(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` writes were made (for tests). False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._writes > after, timeout_s)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("slice publisher already started")
        self._thread = threading.Thread(target=self._run, name="hami-dra-slices", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._state.wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def kick(self) -> None:
        """Look again now."""
        self._kicked.set()
        self._state.wake()

    # --- the watch (the client's loop thread): store and kick, nothing else -------------------------

    def slices_listed(self, items: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self._store = {_name(s): s for s in items if _name(s)}
            self._deleted.clear()
        self._listed.set()
        self.kick()

    def slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if not name:
            return
        with self._lock:
            if kind == "DELETED":
                self._deleted[name] = _version(obj)
                if _newer(self._store.get(name), obj):
                    self._store.pop(name, None)
            elif _newer(self._store.get(name), obj):
                self._store[name] = obj
        self.kick()

    # --- the thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            version = self._state.version
            self._kicked.clear()
            delay: float | None = None
            try:
                again = self._sync()
            except KubeApiError as err:
                delay = self._backoff.next()
                log.log(
                    self._backoff.report_level(),
                    "publishing the ResourceSlice: %s; retrying in %.1f s",
                    err,
                    delay,
                )
            except Exception:  # never stop publishing: retry after the backoff
                delay = self._backoff.next()
                log.exception("publishing the ResourceSlice failed; retrying in %.1f s", delay)
            else:
                self._backoff.reset()
                if again:
                    continue
            self._state.wait_for_change(
                version, delay, lambda: self._stopping.is_set() or self._kicked.is_set()
            )

    def _sync(self) -> bool:
        """One comparison and the writes it needs. Returns True to look again at once (after a 409, or
        after switching to whole GPUs)."""
        if not self._state.listed or not self._listed.is_set():
            return False  # GPUs or slices not known yet: no slice rather than an empty or a second one
        if self._node_uid is None:
            self._node_uid = self._adopt_node()
        with self._lock:
            current = list(self._store.values())
        ours = [s for s in current if sl.pool_name(s) == self._node]
        devices = self._devices(ours)
        desired = sl.node_slice_specs(
            self._node, self._driver, devices, self._mig_gpus(), 0, mig_taints=self._mig_taints()
        )
        plan = sl.plan_pool(current, self._node, desired)
        stored_now: list[Mapping[str, Any]] = list(plan.kept)
        try:
            for obj in plan.deletes:
                meta = obj.get("metadata") or {}
                self._api.delete_resource_slice(
                    _name(obj), str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
                )
                log.info(
                    "deleted ResourceSlice %s (pool %s, generation %d): not this node's current slice",
                    _name(obj),
                    sl.pool_name(obj),
                    sl.generation(obj),
                )
                self._forget(obj)
                self._count_write()
            for keep, spec in plan.writes:
                if keep is None:
                    stored = self._api.create_resource_slice(
                        sl.new_slice(self._node, self._node_uid, self._driver, spec)
                    )
                    log.info(
                        "created ResourceSlice %s: %d devices, generation %d",
                        _name(stored),
                        len(spec.get("devices") or []),
                        plan.generation,
                    )
                else:
                    stored = self._api.update_resource_slice(_name(keep), sl.updated_slice(keep, spec))
                    log.info("updated ResourceSlice %s: generation %d", _name(stored), plan.generation)
                self._remember(stored)
                self._count_write()
                stored_now.append(stored)
        except KubeApiError as err:
            if err.status == 409:
                self._relist()
                return True
            raise
        if self._consumable and any(sl.consumable_dropped(devices, s) for s in stored_now):
            self._no_consumable_capacity(
                next(_name(s) for s in stored_now if sl.consumable_dropped(devices, s))
            )
            return True
        with self._cond:
            self._synced = True
            self._cond.notify_all()
        return False

    def _adopt_node(self) -> str:
        """The Node's UID (the slice's owner); and the device plugin's inventory annotations removed
        from it, if a device-plugin run left them: without them the HAMi scheduler extender does not
        count the node as a GPU node, so it never places a device-plugin pod on GPUs DRA hands out."""
        meta = self._api.get_node(self._node).get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            raise KubeApiError(0, "BadResponse", f"Node {self._node} has no UID")
        stale = [key for key in (NODE_REGISTER, NODE_PAIR_SCORE) if key in (meta.get("annotations") or {})]
        if stale:
            try:
                self._api.patch_node_annotations(self._node, dict.fromkeys(stale))
            except KubeApiError as err:  # the slice matters more: publish it anyway
                log.warning(
                    "cannot remove the device plugin's annotations %s from Node %s (%s): the HAMi scheduler "
                    "extender may still count this node's GPUs; remove them, or grant patch on nodes",
                    ", ".join(stale),
                    self._node,
                    err,
                )
            else:
                log.info(
                    "removed the device plugin's annotations %s from Node %s", ", ".join(stale), self._node
                )
        return uid

    def _mig_gpus(self) -> list[sl.MigGpu]:
        """This node's GPUs in MIG mode with their profiles (read once per GPU; a GPU whose profiles
        cannot be read is left out this turn, with an error in the log)."""
        if self._mig_profiles is None:
            return []
        out: list[sl.MigGpu] = []
        for gpu in self._state.gpus():
            if not gpu.info.mig_enabled:
                continue
            profiles = self._profiles.get(gpu.uuid)
            if profiles is None:
                try:
                    profiles = tuple(self._mig_profiles(gpu.uuid))
                except GPUBackendError as err:
                    log.error(
                        "GPU %s: cannot read its MIG profiles (%s): its partitions are not published",
                        gpu.uuid,
                        err,
                    )
                    continue
                self._profiles[gpu.uuid] = profiles
            out.append(sl.MigGpu(gpu.info.minor, gpu.uuid, gpu.info.model, gpu.info.driver_version, profiles))
        return out

    def partitions(self, gpu: GPUStatus) -> list[str]:
        """The names of the partitions published for a GPU in MIG mode (empty for another GPU, or while
        its profiles cannot be read): the devices its health stands for (`server.health_response`)."""
        if self._mig_profiles is None or not gpu.info.mig_enabled:
            return []
        profiles = self._profiles.get(gpu.uuid)
        if profiles is None:
            try:
                profiles = tuple(self._mig_profiles(gpu.uuid))
            except GPUBackendError:
                return []
            self._profiles[gpu.uuid] = profiles
        return [
            sl.mig_device_name(gpu.info.minor, profile, placement.start)
            for profile in profiles
            for placement in profile.placements
        ]

    def _mig_taints(self) -> dict[str, dict[str, Any]]:
        """The taint of each unhealthy GPU in MIG mode (put on its partitions)."""
        out: dict[str, dict[str, Any]] = {}
        now = rfc3339(self._now())
        for gpu in self._state.gpus():
            value = sl.taint_value(gpu)
            if gpu.info.mig_enabled and value is not None:
                key = (gpu.uuid, value)
                since = self._mig_taint_since.setdefault(key, now)
                out[gpu.uuid] = {
                    "key": sl.taint_key(self._driver),
                    "value": value,
                    "effect": self._config.dra_taint_effect.value,
                    "timeAdded": since,
                }
        self._mig_taint_since = {k: v for k, v in self._mig_taint_since.items() if k[0] in out}
        return out

    def _devices(self, ours: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        gpus = [g for g in self._state.gpus() if not g.info.mig_enabled or self._mig_profiles is None]
        times: dict[tuple[str, str], str] = {}
        for stored in ours:
            times.update(sl.stored_taint_times(stored))
        now = rfc3339(self._now())
        current: dict[tuple[str, str], str] = {}
        for gpu in gpus:
            value = sl.taint_value(gpu)
            if value is not None:
                key = (device_name(gpu.info.minor), value)
                current[key] = times.get(key) or self._taint_since.get(key) or now
        self._taint_since = current
        return sl.slice_devices(gpus, self._config, consumable=self._consumable, taint_since=current)

    def _no_consumable_capacity(self, name: str) -> None:
        self._consumable = False
        message = (
            f"the API server dropped allowMultipleAllocations from ResourceSlice {name}: this cluster has "
            "no DRA consumable capacity (feature gate DRAConsumableCapacity, alpha and off in Kubernetes "
            "1.34/1.35, on from 1.36). Publishing whole GPUs instead: each GPU goes to one claim, with "
            "all its memory and cores"
        )
        log.warning("%s", message)
        if self._events is not None:
            try:
                self._events.record(
                    NODE_EVENT_NAMESPACE,
                    self._node,
                    self._node_uid or "",
                    "Warning",
                    NO_CONSUMABLE_CAPACITY_REASON,
                    message,
                    kind="Node",
                )
            except Exception:  # an Event is best effort
                log.exception("recording the Event about consumable capacity failed")

    def _relist(self) -> None:
        items = self._api.list_resource_slices(f"spec.nodeName={self._node},spec.driver={self._driver}")
        with self._lock:
            self._store = {_name(s): s for s in items if _name(s)}
            self._deleted.clear()
        self._listed.set()

    def _remember(self, obj: dict[str, Any]) -> None:
        name = _name(obj)
        with self._lock:
            if name in self._deleted:
                deleted, written = self._deleted[name], _version(obj)
                if deleted is None or written is None or deleted >= written:
                    return  # deleted after this write: kept, it would stand for a slice that is gone
            if _newer(self._store.get(name), obj):
                self._store[name] = obj

    def _forget(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._store.pop(_name(obj), None)

    def _count_write(self) -> None:
        with self._cond:
            self._writes += 1
            self._cond.notify_all()


__all__ = ["NO_CONSUMABLE_CAPACITY_REASON", "NodeEvents", "SliceApi", "SlicePublisher"]
