"""The pod side of the stand-in: follow the pods bound to this node, admit them one at a time in
creation order (device Allocate per container, init containers first), prepare their ResourceClaims
(DRA), start their containers (PreStartContainer, the container runtime's record with CDI resolved),
then mark them Running, or Failed with kubelet's reason and message plus a Warning event; free the
devices and unprepare the claims of pods that end.

A pod whose claims cannot be prepared stays Pending (containers waiting in ContainerCreating) with a
`FailedPrepareDynamicResources` event, and is tried again with backoff, as kubelet's pod sync does.

Model: admission and restarts are modelled in `hami_control/protocol_model.py` (`Kubelet`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import quantity_value
from hami_kube.backoff import RetryPolicy
from hami_kube.client import JSONDict as JSON
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_kube.events import EventRecorder, EventSource
from hami_kube.reflector import ListSink, Reflector
from hami_sim.kubelet import resources as msg
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import AllocationError, DeviceManager, PreStartError
from hami_sim.kubelet.dra import claims as dra_claims
from hami_sim.kubelet.dra.cdi import CdiResolutionError
from hami_sim.kubelet.dra.manager import PREPARE_PREFIX, DraManager, PrepareError
from hami_sim.kubelet.node import RETRY, now_rfc3339, read_node
from hami_sim.kubelet.runtime import ContainerRecord, ContainerRuntime, container_record

log = logging.getLogger(__name__)

_TERMINAL = ("Succeeded", "Failed")
WATCH_SECONDS = 240
"""Server-side timeout of one pod watch; the reflector re-watches from the last resourceVersion."""
_WRITE_ATTEMPTS = 5
EVENTS_GRACE_S = 1.0
"""How long `stop()` lets queued Events out."""
FAILED_PREPARE = "FailedPrepareDynamicResources"
"""Kubelet's event reason when a pod's claims could not be prepared (pkg/kubelet/events)."""
CREATE_CONTAINER_ERROR = "CreateContainerError"
RUN_SECONDS = "sim.hami.io/run-seconds"
"""A stand-in-only pod annotation (it runs no containers): the pod's containers exit 0 that many seconds
after they started (docs/kubelet-standin.md, "Containers that finish")."""
MIN_RESTART_INTERVAL_S = 1.0
"""restartPolicy Always: kubelet's restart backoff (10 s doubling to 5 min) is skipped, but a container
restarts at most once per this many seconds, so `run-seconds: "0"` cannot spin."""


def run_seconds(pod: JSON) -> float | None:
    """The pod's `sim.hami.io/run-seconds` (None: absent, the containers run until the pod is deleted);
    `ValueError` naming the annotation and value for anything but a finite number >= 0."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(RUN_SECONDS)
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"annotation {RUN_SECONDS}: expected a number of seconds >= 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class AdmissionResult:
    """What the stand-in did with one pod."""

    namespace: str
    name: str
    uid: str
    admitted: bool
    reason: str = ""
    message: str = ""
    """For a rejected pod: the status message (`Pod was rejected: ...`); for a container that could
    not start (PreStartContainer failed): the waiting message."""


class _Rejected(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _key(pod: JSON) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def extended_limits(container: Mapping[str, Any]) -> dict[str, int]:
    """The container's extended-resource limits as integers (requests equal limits for these)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    result: dict[str, int] = {}
    for name, value in limits.items():
        if not msg.is_extended_resource_name(name):
            continue
        try:
            result[name] = quantity_value(value)
        except QuantityError as exc:
            raise _Rejected("UnexpectedAdmissionError", f"container {container.get('name')}: {exc}") from exc
    return result


def _pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Pod-level need per extended resource: max(largest init container, sum of app containers)."""
    app: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in extended_limits(container).items():
            app[name] = app.get(name, 0) + value
    need = dict(app)
    for container in spec.get("initContainers") or []:
        for name, value in extended_limits(container).items():
            need[name] = max(need.get(name, 0), value)
    return need


class PodAdmitter:
    """Follows `spec.nodeName=<node>` pods through a list+watch and admits them serially."""

    def __init__(
        self,
        config: KubeletConfig,
        manager: DeviceManager,
        api: KubeApi,
        *,
        dra: DraManager | None = None,
        runtime: ContainerRuntime | None = None,
    ) -> None:
        self.config = config
        self._manager = manager
        self._api = api
        self._dra = dra
        self._runtime = runtime or ContainerRuntime(config.containers_path)
        self._starts: dict[str, None] = {}
        """Pods whose start is to be tried again (claims that could not be prepared), in order."""
        self._start_failures: dict[str, int] = {}
        self._start_timers: dict[str, asyncio.TimerHandle] = {}
        self._exit_timers: dict[str, asyncio.TimerHandle] = {}
        """Pods whose containers exit after `sim.hami.io/run-seconds`, and when."""
        self._exits: dict[str, None] = {}
        """Pods whose containers have exited, to be handled next, in order."""
        self._start_retry = RetryPolicy(
            initial=config.prepare_retry_initial, maximum=config.prepare_retry_max
        )
        self._pods: dict[str, JSON] = {}
        self._pending: dict[str, tuple[str, int]] = {}
        self._seen: set[str] = set()
        self._active: set[str] = set()
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._results: dict[tuple[str, str], AdmissionResult] = {}
        self._results_changed = asyncio.Condition()
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._rng = random.Random()
        self._in_flight: str | None = None
        """The pod whose admission or start is awaiting now (the pod worker busy with it)."""
        self._deletions: dict[str, asyncio.Task[None]] = {}
        """Pods marked for deletion whose object this kubelet deletes (with grace 0), by UID."""
        self._deleted: set[str] = set()
        """Pods whose deletion was confirmed (the API server answered), until their watch event."""
        self._events = EventRecorder(api, EventSource("kubelet", config.node_name))
        """Kubelet's event recorder: source kubelet, host (and reportingInstance) the node."""
        self._unwritten: dict[str, tuple[JSON, JSON]] = {}
        """Per pod UID, the latest status not written yet (the pod, the status): kubelet's status manager
        keeps it until the API server has it, also after the pod left this kubelet (a pod that ended)."""
        self._status_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        """Per pod UID, the lock that keeps its status writes in order and how many writers hold or wait
        for it (the lock goes with the last one)."""

    async def start(self) -> None:
        node = self.config.node_name
        self._events.start()
        self._tasks = [
            asyncio.create_task(self._follow(), name=f"pods-{node}"),
            asyncio.create_task(self._work(), name=f"admit-{node}"),
            asyncio.create_task(self._sync_statuses(), name=f"status-{node}"),
        ]

    async def stop(self, *, events_grace_s: float = EVENTS_GRACE_S) -> None:
        """Stop following and admitting pods; queued Events get `events_grace_s` to be written."""
        for timer in (*self._start_timers.values(), *self._exit_timers.values()):
            timer.cancel()
        self._start_timers.clear()
        self._exit_timers.clear()
        tasks, self._tasks = self._tasks, []
        tasks += list(self._deletions.values())
        self._deletions.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._events.stop(events_grace_s)

    async def wait_synced(self, seconds: float) -> None:
        """Wait until the first list of this node's pods has been read."""
        await asyncio.wait_for(self._synced.wait(), seconds)

    @property
    def synced(self) -> bool:
        """Whether the first list of this node's pods has been read (kubelet's sourcesReady)."""
        return self._synced.is_set()

    def active_uids(self) -> set[str] | None:
        """The UIDs of the active pods, None until the first pod list was read (the DRA manager's
        reconcile waits for kubelet's sourcesReady too)."""
        return set(self._active) if self.synced else None

    def active_pods(self) -> list[JSON]:
        """Kubelet's GetActivePods: the pods handed to admission that are not rejected and not terminal
        (kubelet's filterOutInactivePods), a pod still being admitted included. Deleted pods are gone
        at once here (a pod marked for deletion is stopped at once, before this kubelet deletes it)."""
        return [self._pods[uid] for uid in self._active if uid in self._pods]

    def pod_by_name(self, namespace: str, name: str) -> JSON | None:
        """Kubelet's podManager.GetPodByName: any pod of this node handed to admission, rejected and
        terminal ones included (until deleted); None for an unknown one or one still queued."""
        for uid, pod in self._pods.items():
            if uid not in self._pending and _key(pod) == (namespace, name):
                return pod
        return None

    def result(self, namespace: str, name: str) -> AdmissionResult | None:
        return self._results.get((namespace, name))

    async def wait_for_result(
        self,
        namespace: str,
        name: str,
        seconds: float,
        predicate: Callable[[AdmissionResult], bool] | None = None,
    ) -> AdmissionResult:
        """The admission result of pod namespace/name (the first one for which `predicate` holds, when
        given: a pod tried again gets a new result), waiting up to `seconds` for it."""

        def ready() -> bool:
            result = self._results.get((namespace, name))
            return result is not None and (predicate is None or predicate(result))

        async with self._results_changed:
            await asyncio.wait_for(self._results_changed.wait_for(ready), seconds)
        return self._results[(namespace, name)]

    async def _record(self, result: AdmissionResult) -> None:
        async with self._results_changed:
            self._results[(result.namespace, result.name)] = result
            self._results_changed.notify_all()

    # ------------------------------------------------------------------------------ watch

    async def _follow(self) -> None:
        """Kubelet's pod source: this node's pods (`spec.nodeName=<node>`) through one reflector."""
        node = self.config.node_name
        reflector = Reflector(
            self._api,
            f"node {node}: pods",
            "/api/v1/pods",
            ListSink(self._replace, self._apply),
            retry=RETRY,
            params={"fieldSelector": f"spec.nodeName={node}"},
            watch_timeout_s=WATCH_SECONDS,
        )
        watching = asyncio.create_task(reflector.run(), name=f"pods-{node}-reflector")
        try:
            await reflector.synced.wait()
            self._synced.set()
            self._runtime.retain_pods(self._active)
            await watching
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    def _apply(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            self._forget(obj)
        else:
            self._upsert(obj)

    def _replace(self, items: Sequence[JSON]) -> None:
        current = {str(p["metadata"]["uid"]) for p in items}
        for uid in list(self._pods):
            if uid not in current:
                self._forget(self._pods[uid])
        for pod in sorted(items, key=lambda p: str(p["metadata"].get("creationTimestamp") or "")):
            self._upsert(pod)

    def _upsert(self, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        self._pods[uid] = pod
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if meta.get("deletionTimestamp") or phase in _TERMINAL:
            self._end(uid)
            self._seen.add(uid)
            if meta.get("deletionTimestamp"):
                self._delete_when_stopped(uid)
            return
        if uid in self._seen:
            return
        self._seen.add(uid)
        if phase == "Running":
            # Admitted by an earlier run of this node; its devices come from the checkpoint. Its
            # containers kept running meanwhile: they exit when they would have.
            self._active.add(uid)
            self._schedule_exit(uid, pod, _started_at(pod))
            return
        self._pending[uid] = (str(meta.get("creationTimestamp") or ""), next(self._seq))
        self._wake.set()

    def _forget(self, pod: JSON) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._pods.pop(uid, None)
        self._deleted.discard(uid)
        task = self._deletions.pop(uid, None)
        if task is not None:
            task.cancel()
        self._end(uid)

    # ------------------------------------------------------------------------------ deletion

    def _delete_when_stopped(self, uid: str) -> None:
        """The pod is marked for deletion (graceful deletion, pkg/registry/core/pod/strategy.go): its
        containers are stopped (`_end`, a pod not admitted yet is never admitted); once the pod worker is
        done with it, the status manager deletes the object with grace 0 and a UID precondition
        (pkg/kubelet/status/status_manager.go `syncPod`, `canBeDeleted`; pkg/kubelet/pod_workers.go)."""
        if uid in self._deleted or uid in self._deletions or uid == self._in_flight:
            return  # deleted already, being deleted, or deleted when the pod worker is done with it
        pod = self._pods.get(uid)
        if pod is None:
            return
        self._deletions[uid] = asyncio.get_running_loop().create_task(
            self._delete_pod(uid, pod), name=f"delete-{uid}"
        )

    async def _delete_pod(self, uid: str, pod: JSON) -> None:
        namespace, name = _key(pod)
        backoff = RETRY.backoff(self._rng)
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            # canBeDeleted waits until the pod's resources are reclaimed, its claims unprepared included
            # (pkg/kubelet/kubelet_pods.go PodCouldHaveRunningContainers:
            # PodMightNeedToUnprepareResources); the unprepare is tried again with its own backoff.
            while True:
                if self._dra is not None and self._dra.pod_might_need_to_unprepare(uid):
                    await asyncio.sleep(backoff.next())
                    continue
                try:
                    await self._api.request("DELETE", path, options)
                    break
                except KubeApiError as exc:
                    if exc.status in (404, 409):  # gone already, or another pod by that name now
                        break
                    delay = backoff.next()
                    log.warning(
                        "node %s: cannot delete pod %s/%s (retry in %.1f s): %s",
                        self.config.node_name,
                        namespace,
                        name,
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)
            self._deleted.add(uid)
            log.info("node %s: pod %s/%s stopped and deleted", self.config.node_name, namespace, name)
        finally:
            self._deletions.pop(uid, None)

    def _end(self, uid: str) -> None:
        """The pod is gone or terminal: it is not admitted any more, its devices are freed, its claims
        unprepared (in the background) and its containers forgotten by the runtime."""
        self._pending.pop(uid, None)
        self._active.discard(uid)
        self._forget_start(uid)
        self._exits.pop(uid, None)
        timer = self._exit_timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        # The containers stop first, then their devices are freed: kubelet frees a pod's devices only once
        # the pod is no longer active, i.e. after its containers stopped (pkg/kubelet/cm/devicemanager/
        # manager.go `UpdateAllocatedDevices`), and writes them before the runtime starts a container
        # (`allocateContainerResources` ends with `writeCheckpoint`). So on disk a container never shows
        # without the devices kubelet recorded for it, at its start or at its end.
        self._runtime.remove_pod(uid)
        self._manager.remove_pod(uid)
        if self._dra is not None:
            self._dra.pod_gone(uid)

    def _forget_start(self, uid: str) -> None:
        self._starts.pop(uid, None)
        self._start_failures.pop(uid, None)
        timer = self._start_timers.pop(uid, None)
        if timer is not None:
            timer.cancel()

    # ------------------------------------------------------------------------------ admission

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending or self._starts or self._exits:
                if self._exits:  # first: a pod that ends frees its devices for the next
                    uid = next(iter(self._exits))
                    del self._exits[uid]
                    pod = self._pods.get(uid)
                    if pod is not None and uid in self._active:
                        await self._containers_exited(uid, pod)
                    continue
                if self._pending:
                    uid = min(self._pending, key=self._pending.__getitem__)
                    del self._pending[uid]
                    start_only = False
                else:
                    uid = next(iter(self._starts))
                    del self._starts[uid]
                    start_only = True
                pod = self._pods.get(uid)
                if pod is not None and (not start_only or uid in self._active):
                    await self._admit_or_reject(uid, pod, start_only=start_only)

    async def _admit_or_reject(self, uid: str, pod: JSON, *, start_only: bool = False) -> None:
        """Admit the pod (or, `start_only`, try again to start an admitted one); a failure nobody
        foresaw rejects this pod, logged with its traceback, and does not end the node's admission loop
        (every later pod would stay Pending)."""
        self._in_flight = uid
        try:
            if start_only:
                await self._start(uid, pod)
            else:
                await self._admit(uid, pod)
        except Exception as exc:
            namespace, name = _key(pod)
            log.exception("node %s: admitting pod %s/%s failed", self.config.node_name, namespace, name)
            with contextlib.suppress(Exception):
                await self._reject(
                    uid,
                    pod,
                    msg.UNEXPECTED_ADMISSION_ERROR,
                    msg.admission_failure(f"{type(exc).__name__}: {exc}"),
                )
        finally:
            self._in_flight = None
            current = self._pods.get(uid)
            if current is not None and (current.get("metadata") or {}).get("deletionTimestamp"):
                self._end(uid)  # marked meanwhile: what the admission allocated since is dropped
                self._delete_when_stopped(uid)

    async def _admit(self, uid: str, pod: JSON) -> None:
        spec = pod.get("spec") or {}
        self._active.add(uid)
        self._manager.retain_pods(self._active)
        try:
            await self._check_other_extended_resources(uid, spec)
            for container in spec.get("initContainers") or []:
                restartable = container.get("restartPolicy") == "Always"
                await self._manager.allocate(
                    uid, container["name"], extended_limits(container), init=True, restartable=restartable
                )
            for container in spec.get("containers") or []:
                await self._manager.allocate(uid, container["name"], extended_limits(container))
        except (AllocationError, _Rejected) as exc:
            if isinstance(exc, AllocationError):
                reason, message = msg.UNEXPECTED_ADMISSION_ERROR, msg.admission_failure(str(exc))
            else:
                reason, message = exc.reason, exc.message
            await self._reject(uid, pod, reason, message)
            return
        if self._gone_meanwhile(uid):
            return
        await self._start(uid, pod)

    def _gone_meanwhile(self, uid: str) -> bool:
        """Whether the pod was deleted (or ended) while its admission or start awaited a plugin. Then
        what was allocated or recorded since is dropped again (`_end` is idempotent), as kubelet's pod
        worker stops syncing a pod it is told is deleted (pkg/kubelet/pod_workers.go) and its
        housekeeping removes what an orphaned pod still holds (HandlePodCleanups)."""
        if uid in self._active:
            return False
        self._end(uid)
        return True

    async def _start(self, uid: str, pod: JSON) -> None:
        """Kubelet's SyncPod for an admitted pod: prepare its claims (DRA) before anything else, then
        each container (init containers first): PreStartContainer, then the runtime creates it with
        its devices and resolved CDI edits; then the pod is Running."""
        namespace, name = _key(pod)
        if self._dra is not None and dra_claims.pod_claims(pod):
            try:
                await self._dra.prepare_pod(pod)
            except PrepareError as exc:
                await self._prepare_failed(uid, pod, PREPARE_PREFIX + str(exc))
                return
        records: list[ContainerRecord] = []
        for container in dra_claims.containers(pod):
            try:
                await self._manager.pre_start_container(uid, container["name"])
            except PreStartError as exc:
                await self._cannot_start(uid, pod, container["name"], str(exc))
                return
            try:
                records.append(self._container_record(uid, pod, container))
            except (dra_claims.ClaimError, CdiResolutionError) as exc:
                message = f"failed to create containerd container: CDI device injection failed: {exc}"
                await self._cannot_start(uid, pod, container["name"], message, CREATE_CONTAINER_ERROR)
                return
        if self._gone_meanwhile(uid):
            return
        self._forget_start(uid)
        self._runtime.record_pod(uid, records)
        await self._write_status(pod, _running_status(pod))
        log.info("node %s: pod %s/%s admitted and running", self.config.node_name, namespace, name)
        self._schedule_exit(uid, pod, datetime.now(UTC))
        await self._record(AdmissionResult(namespace, name, uid, True))

    def _container_record(self, uid: str, pod: JSON, container: Mapping[str, Any]) -> ContainerRecord:
        """What the runtime gives the container: its devices' Allocate answers and its claims' CDI IDs."""
        name = container["name"]
        responses = {
            resource: response
            for resource in self._manager.container_devices(uid, name)
            if (response := self._manager.pod_response(uid, name, resource)) is not None
        }
        cdi_ids = self._dra.container_cdi_ids(pod, container) if self._dra is not None else []
        return container_record(pod, name, responses, cdi_ids, self.config.cdi_dirs)

    # ------------------------------------------------------------------------------ containers that end

    def _schedule_exit(self, uid: str, pod: JSON, started: datetime | None, minimum: float = 0.0) -> None:
        """With `sim.hami.io/run-seconds`, the containers exit 0 that long after `started` (now when
        unknown), at the earliest in `minimum` seconds; a bad value is a warning and the pod runs on."""
        try:
            seconds = run_seconds(pod)
        except ValueError as exc:
            namespace, name = _key(pod)
            log.warning(
                "node %s: pod %s/%s: %s; it runs until deleted", self.config.node_name, namespace, name, exc
            )
            return
        if seconds is None:
            return
        elapsed = (datetime.now(UTC) - started).total_seconds() if started is not None else 0.0
        old = self._exit_timers.pop(uid, None)
        if old is not None:
            old.cancel()
        delay = max(minimum, seconds - elapsed)
        self._exit_timers[uid] = asyncio.get_running_loop().call_later(delay, self._exited, uid)

    def _exited(self, uid: str) -> None:
        self._exit_timers.pop(uid, None)
        if uid in self._active:
            self._exits[uid] = None
            self._wake.set()

    async def _containers_exited(self, uid: str, pod: JSON) -> None:
        """The containers exited 0. restartPolicy Always: restarted in place with restartCount + 1 (its
        devices stay; kubelet's CrashLoopBackOff is skipped, see MIN_RESTART_INTERVAL_S). Never and
        OnFailure: the pod Succeeded and leaves the active pods; its claims are unprepared and its
        devices freed at once. Kubelet frees a terminated pod's devices at the next Allocate
        (pkg/kubelet/cm/devicemanager/manager.go: UpdateAllocatedDevices drops every pod not among the
        active ones before allocating), which the next pod sees the same way."""
        namespace, name = _key(pod)
        node = self.config.node_name
        if ((pod.get("spec") or {}).get("restartPolicy") or "Always") == "Always":
            status = _restarted_status(pod)
            await self._write_status(pod, status)
            restarts = max((c["restartCount"] for c in status["containerStatuses"]), default=0)
            log.info(
                "node %s: pod %s/%s: containers exited 0, restarted (restarts: %d)",
                node,
                namespace,
                name,
                restarts,
            )
            self._schedule_exit(uid, pod, None, MIN_RESTART_INTERVAL_S)
            return
        await self._write_status(pod, _succeeded_status(pod))
        log.info("node %s: pod %s/%s: containers exited 0, pod Succeeded", node, namespace, name)
        self._end(uid)

    async def _prepare_failed(self, uid: str, pod: JSON, error: str) -> None:
        """The pod's claims could not be prepared: Pending, a Warning event, and another try later."""
        namespace, name = _key(pod)
        failures = self._start_failures.get(uid, 0) + 1
        self._start_failures[uid] = failures
        delay = self._start_retry.delay(failures, self._rng)
        log.warning(
            "node %s: pod %s/%s: failed to prepare dynamic resources (retry in %.1f s): %s",
            self.config.node_name,
            namespace,
            name,
            delay,
            error,
        )
        if failures == 1:
            await self._write_status(pod, _creating_status(pod))
        self._event(pod, FAILED_PREPARE, f"Failed to prepare dynamic resources: {error}")
        await self._record(AdmissionResult(namespace, name, uid, False, FAILED_PREPARE, error))
        timer = self._start_timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        self._start_timers[uid] = asyncio.get_running_loop().call_later(delay, self._start_again, uid)

    def _start_again(self, uid: str) -> None:
        self._start_timers.pop(uid, None)
        if uid in self._active:
            self._starts[uid] = None
            self._wake.set()

    async def _check_other_extended_resources(self, uid: str, spec: Mapping[str, Any]) -> None:
        """Kubelet's general predicate for extended resources no device plugin provides: the Node's
        allocatable must hold the pod's need next to the admitted pods'. Like kubelet
        (`removeMissingExtendedResources`), a resource the Node does not list at all is ignored: that
        is how HAMi's nvidia.com/gpumem and gpucores, which no plugin advertises, get admitted."""
        need = {
            k: v
            for k, v in _pod_requests(spec).items()
            if v > 0 and not self._manager.is_device_plugin_resource(k)
        }
        if not need:
            return
        try:
            node = await read_node(self._api, self.config.node_name) or {}
        except KubeApiError:
            node = {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for resource, requested in sorted(need.items()):
            if resource not in allocatable:
                continue
            try:
                capacity = quantity_value(allocatable.get(resource, 0))
            except QuantityError:
                capacity = 0
            used = sum(
                _pod_requests(self._pods[other].get("spec") or {}).get(resource, 0)
                for other in self._active
                if other != uid and other in self._pods
            )
            if requested + used > capacity:
                raise _Rejected(
                    f"OutOf{resource}", msg.insufficient_resource(resource, requested, used, capacity)
                )

    async def _reject(self, uid: str, pod: JSON, reason: str, message: str) -> None:
        namespace, name = _key(pod)
        self._end(uid)
        log.warning(
            "node %s: pod %s/%s rejected: %s: %s", self.config.node_name, namespace, name, reason, message
        )
        status = {"phase": "Failed", "reason": reason, "message": msg.REJECTED_PREFIX + message}
        await self._write_status(pod, status)
        self._event(pod, reason, message)
        await self._record(
            AdmissionResult(namespace, name, uid, False, reason, msg.REJECTED_PREFIX + message)
        )

    async def _cannot_start(
        self, uid: str, pod: JSON, container: str, message: str, reason: str = "CreateContainerConfigError"
    ) -> None:
        namespace, name = _key(pod)
        self._forget_start(uid)
        log.warning(
            "node %s: pod %s/%s container %s cannot start: %s",
            self.config.node_name,
            namespace,
            name,
            container,
            message,
        )
        status = _waiting_status(pod, container, reason, message)
        await self._write_status(pod, status)
        self._event(pod, "Failed", f"Error: {message}")
        await self._record(AdmissionResult(namespace, name, uid, False, reason, message))

    async def _write_status(self, pod: JSON, status: JSON) -> None:
        """Kubelet's status manager: the pod's status is its latest (an older one not written yet is
        dropped), written now with a few quick retries; when the API server does not take it, it is
        kept and written again every `status_sync_period` (10 s) until it does or the pod is gone
        (404), also after the pod left this kubelet. Giving up instead left a pod that had ended
        Running in the API for good, holding its GPUs and claims in the scheduler's and hami-control's
        eyes (issue 31: a 409 window made the Succeeded write fail five times)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._unwritten[uid] = (pod, status)
        await self._flush_status(uid, _WRITE_ATTEMPTS)

    async def _flush_status(self, uid: str, attempts: int) -> None:
        """Write the pod's latest status (and a newer one set meanwhile); after `attempts` failures it
        stays for the next sync."""
        lock, users = self._status_locks.get(uid) or (asyncio.Lock(), 0)
        self._status_locks[uid] = (lock, users + 1)
        try:
            await self._flush_status_locked(uid, attempts, lock)
        finally:
            lock, users = self._status_locks[uid]
            if users > 1:
                self._status_locks[uid] = (lock, users - 1)
            else:
                del self._status_locks[uid]

    async def _flush_status_locked(self, uid: str, attempts: int, lock: asyncio.Lock) -> None:
        async with lock:
            failures = 0
            while (entry := self._unwritten.get(uid)) is not None:
                pod, status = entry
                namespace, name = _key(pod)
                try:
                    await self._api.patch(
                        f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}
                    )
                except KubeApiError as exc:
                    failures += 1
                    if exc.status != 404 and failures < attempts:
                        await asyncio.sleep(RETRY.delay(failures, self._rng))
                        continue
                    if exc.status == 404:
                        self._drop_status(uid, entry)
                    log.warning(
                        "node %s: cannot write status of %s/%s%s: %s",
                        self.config.node_name,
                        namespace,
                        name,
                        "" if exc.status == 404 else f" (again in {self.config.status_sync_period:g} s)",
                        exc,
                    )
                    break
                self._drop_status(uid, entry)

    def _drop_status(self, uid: str, entry: tuple[JSON, JSON]) -> None:
        if self._unwritten.get(uid) is entry:
            del self._unwritten[uid]

    async def _sync_statuses(self) -> None:
        """Kubelet's status manager's periodic sync: every status the API server has not taken yet."""
        while True:
            await asyncio.sleep(self.config.status_sync_period)
            for uid in list(self._unwritten):
                await self._flush_status(uid, 1)

    def _event(self, pod: JSON, reason: str, message: str) -> None:
        """A Warning Event about the pod, as kubelet's recorder writes it (source kubelet on this node)."""
        namespace, name = _key(pod)
        meta = pod.get("metadata") or {}
        self._events.record(
            namespace,
            name,
            str(meta.get("uid") or ""),
            "Warning",
            reason,
            message,
            resource_version=str(meta.get("resourceVersion") or ""),
        )


def _conditions(
    pod: JSON,
    ready: bool,
    initialized: bool = True,
    sandbox: bool = True,
    not_ready: str = "ContainersNotReady",
) -> list[JSON]:
    now = now_rfc3339()
    old = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}

    def condition(kind: str, status: bool, reason: str | None = None) -> JSON:
        previous = old.get(kind)
        value = "True" if status else "False"
        since = previous.get("lastTransitionTime") if previous and previous.get("status") == value else now
        result: JSON = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": since}
        if reason is not None and not status:
            result["reason"] = reason
        return result

    return [
        condition("PodReadyToStartContainers", sandbox),
        condition("Initialized", initialized, "ContainersNotInitialized"),
        condition("Ready", ready, not_ready),
        condition("ContainersReady", ready, not_ready),
        condition("PodScheduled", True),
    ]


def _container_id(pod: JSON, container: str) -> str:
    return f"hami-sim://{(pod.get('metadata') or {}).get('uid', '')}/{container}"


def _running_status(pod: JSON) -> JSON:
    spec = pod.get("spec") or {}
    now = now_rfc3339()
    init_statuses = []
    for c in spec.get("initContainers") or []:
        base = {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": _container_id(pod, c["name"]),
            "restartCount": 0,
        }
        if c.get("restartPolicy") == "Always":
            init_statuses.append(
                {**base, "ready": True, "started": True, "state": {"running": {"startedAt": now}}}
            )
        else:
            terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            init_statuses.append(
                {**base, "ready": True, "started": False, "state": {"terminated": terminated}}
            )
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": _container_id(pod, c["name"]),
            "restartCount": 0,
            "ready": True,
            "started": True,
            "state": {"running": {"startedAt": now}},
        }
        for c in spec.get("containers") or []
    ]
    status: JSON = {
        "phase": "Running",
        "conditions": _conditions(pod, ready=True),
        "containerStatuses": statuses,
        "startTime": (pod.get("status") or {}).get("startTime") or now,
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return status


def _started_at(pod: JSON) -> datetime | None:
    """When the pod's containers (last) started, from its container statuses; None when unknown."""
    times = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        text = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        with contextlib.suppress(TypeError, ValueError):
            times.append(datetime.fromisoformat(str(text).replace("Z", "+00:00")))
    return max(times) if times else None


def _statuses_by_name(pod: JSON, key: str) -> dict[str, JSON]:
    return {str(c.get("name")): c for c in (pod.get("status") or {}).get(key) or []}


def _restarted_status(pod: JSON) -> JSON:
    """restartPolicy Always after the containers exited 0: each running again, restartCount + 1, the
    exit in lastState (kubelet's status after a container restart)."""
    status = _running_status(pod)
    old = _statuses_by_name(pod, "containerStatuses")
    now = now_rfc3339()
    for entry in status["containerStatuses"]:
        before = old.get(entry["name"]) or {}
        started = ((before.get("state") or {}).get("running") or {}).get("startedAt") or now
        entry["restartCount"] = int(before.get("restartCount") or 0) + 1
        entry["lastState"] = {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": started,
                "finishedAt": now,
                "containerID": entry["containerID"],
            }
        }
    if "initContainerStatuses" in status and (pod.get("status") or {}).get("initContainerStatuses"):
        status["initContainerStatuses"] = (pod.get("status") or {})["initContainerStatuses"]
    return status


def _succeeded_status(pod: JSON) -> JSON:
    """Every container terminated with exit code 0 (reason Completed; restartable init containers,
    sidecars, stopped with them): the pod Succeeded, not Ready (reason PodCompleted) and its sandbox gone,
    as kubelet reports a pod whose containers all completed (pkg/kubelet/status generateAPIPodStatus)."""
    now = now_rfc3339()
    previous = pod.get("status") or {}

    def terminated(c: JSON, statuses: dict[str, JSON]) -> JSON:
        before = statuses.get(str(c["name"])) or {}
        state = before.get("state") or {}
        if "terminated" in state:  # an init container that ran to completion
            return {**before, "ready": False, "started": False}
        started = (state.get("running") or {}).get("startedAt") or now
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": _container_id(pod, c["name"]),
            "restartCount": int(before.get("restartCount") or 0),
            "ready": False,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": now,
                    "containerID": _container_id(pod, c["name"]),
                }
            },
        }

    spec = pod.get("spec") or {}
    apps = _statuses_by_name(pod, "containerStatuses")
    inits = _statuses_by_name(pod, "initContainerStatuses")
    status: JSON = {
        "phase": "Succeeded",
        "conditions": _conditions(pod, ready=False, sandbox=False, not_ready="PodCompleted"),
        "containerStatuses": [terminated(c, apps) for c in spec.get("containers") or []],
        "startTime": previous.get("startTime") or now,
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [terminated(c, inits) for c in spec["initContainers"]]
    return status


def _creating_status(pod: JSON) -> JSON:
    """Pending before any container was created (kubelet's status while SyncPod fails before the
    sandbox): every container waits in ContainerCreating (init containers in PodInitializing)."""
    spec = pod.get("spec") or {}

    def waiting(c: JSON, reason: str) -> JSON:
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "restartCount": 0,
            "ready": False,
            "started": False,
            "state": {"waiting": {"reason": reason}},
        }

    status: JSON = {
        "phase": "Pending",
        "conditions": _conditions(
            pod, ready=False, initialized=not spec.get("initContainers"), sandbox=False
        ),
        "containerStatuses": [waiting(c, "ContainerCreating") for c in spec.get("containers") or []],
        "startTime": (pod.get("status") or {}).get("startTime") or now_rfc3339(),
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [waiting(c, "PodInitializing") for c in spec["initContainers"]]
    return status


def _waiting_status(pod: JSON, failed: str, reason: str, message: str) -> JSON:
    """Pending, with `failed` waiting on `reason` (PreStartContainer refused) and the rest not started."""
    spec = pod.get("spec") or {}
    is_init = any(c["name"] == failed for c in spec.get("initContainers") or [])

    def waiting(c: JSON) -> JSON:
        state = (
            {"reason": reason, "message": message} if c["name"] == failed else {"reason": "PodInitializing"}
        )
        return {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "restartCount": 0,
            "ready": False,
            "started": False,
            "state": {"waiting": state},
        }

    status: JSON = {
        "phase": "Pending",
        "conditions": _conditions(pod, ready=False, initialized=not is_init),
        "containerStatuses": [waiting(c) for c in spec.get("containers") or []],
        "startTime": (pod.get("status") or {}).get("startTime") or now_rfc3339(),
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [waiting(c) for c in spec["initContainers"]]
    return status
