"""The pod side of the stand-in: follow the pods bound to this node, admit them one at a time in
creation order (device Allocate per container, init containers first), then mark them Running, or
Failed with kubelet's reason and message plus a Warning event; free the devices of pods that end."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_api.errors import QuantityError
from hami_api.quantity import quantity_value
from hami_kube.client import JSONDict as JSON
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_kube.events import EventRecorder, EventSource
from hami_kube.reflector import ListSink, Reflector
from hami_sim.kubelet import resources as msg
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import AllocationError, DeviceManager, PreStartError
from hami_sim.kubelet.node import RETRY, now_rfc3339, read_node

log = logging.getLogger(__name__)

_TERMINAL = ("Succeeded", "Failed")
WATCH_SECONDS = 240
"""Server-side timeout of one pod watch; the reflector re-watches from the last resourceVersion."""
_WRITE_ATTEMPTS = 5
EVENTS_GRACE_S = 1.0
"""How long `stop()` lets queued Events out."""


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

    def __init__(self, config: KubeletConfig, manager: DeviceManager, api: KubeApi) -> None:
        self.config = config
        self._manager = manager
        self._api = api
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
        self._events = EventRecorder(api, EventSource("kubelet", config.node_name))
        """Kubelet's event recorder: source kubelet, host (and reportingInstance) the node."""

    async def start(self) -> None:
        node = self.config.node_name
        self._events.start()
        self._tasks = [
            asyncio.create_task(self._follow(), name=f"pods-{node}"),
            asyncio.create_task(self._work(), name=f"admit-{node}"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._events.stop(EVENTS_GRACE_S)

    async def wait_synced(self, seconds: float) -> None:
        """Wait until the first list of this node's pods has been read."""
        await asyncio.wait_for(self._synced.wait(), seconds)

    @property
    def synced(self) -> bool:
        """Whether the first list of this node's pods has been read (kubelet's sourcesReady)."""
        return self._synced.is_set()

    def active_pods(self) -> list[JSON]:
        """Kubelet's GetActivePods: the pods handed to admission that are not rejected and not terminal
        (kubelet's filterOutInactivePods), a pod still being admitted included. Deleted pods are gone
        at once here (the API server stand-in has no graceful deletion)."""
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

    async def wait_for_result(self, namespace: str, name: str, seconds: float) -> AdmissionResult:
        """The admission result of pod namespace/name, waiting up to `seconds` for it."""
        async with self._results_changed:
            await asyncio.wait_for(
                self._results_changed.wait_for(lambda: (namespace, name) in self._results), seconds
            )
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
            return
        if uid in self._seen:
            return
        self._seen.add(uid)
        if phase == "Running":
            # Admitted by an earlier run of this node; its devices come from the checkpoint.
            self._active.add(uid)
            return
        self._pending[uid] = (str(meta.get("creationTimestamp") or ""), next(self._seq))
        self._wake.set()

    def _forget(self, pod: JSON) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._pods.pop(uid, None)
        self._end(uid)

    def _end(self, uid: str) -> None:
        """The pod is gone or terminal: it is not admitted any more and its devices are freed."""
        self._pending.pop(uid, None)
        self._active.discard(uid)
        self._manager.remove_pod(uid)

    # ------------------------------------------------------------------------------ admission

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                uid = min(self._pending, key=self._pending.__getitem__)
                del self._pending[uid]
                pod = self._pods.get(uid)
                if pod is not None:
                    await self._admit_or_reject(uid, pod)

    async def _admit_or_reject(self, uid: str, pod: JSON) -> None:
        """Admit the pod; a failure nobody foresaw rejects this pod, logged with its traceback, and
        does not end the node's admission loop (every later pod would stay Pending)."""
        try:
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

    async def _admit(self, uid: str, pod: JSON) -> None:
        namespace, name = _key(pod)
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
        try:
            for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                await self._manager.pre_start_container(uid, container["name"])
        except PreStartError as exc:
            await self._cannot_start(uid, pod, container["name"], str(exc))
            return
        await self._write_status(pod, _running_status(pod))
        log.info("node %s: pod %s/%s admitted and running", self.config.node_name, namespace, name)
        await self._record(AdmissionResult(namespace, name, uid, True))

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
        self._active.discard(uid)
        self._manager.remove_pod(uid)
        log.warning(
            "node %s: pod %s/%s rejected: %s: %s", self.config.node_name, namespace, name, reason, message
        )
        status = {"phase": "Failed", "reason": reason, "message": msg.REJECTED_PREFIX + message}
        await self._write_status(pod, status)
        self._event(pod, reason, message)
        await self._record(
            AdmissionResult(namespace, name, uid, False, reason, msg.REJECTED_PREFIX + message)
        )

    async def _cannot_start(self, uid: str, pod: JSON, container: str, message: str) -> None:
        namespace, name = _key(pod)
        reason = "CreateContainerConfigError"
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
        namespace, name = _key(pod)
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                await self._api.patch(
                    f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}
                )
                return
            except KubeApiError as exc:
                if exc.status == 404 or attempt == _WRITE_ATTEMPTS - 1:
                    log.warning(
                        "node %s: cannot write status of %s/%s: %s",
                        self.config.node_name,
                        namespace,
                        name,
                        exc,
                    )
                    return
            await asyncio.sleep(RETRY.delay(attempt + 1, self._rng))

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


def _conditions(pod: JSON, ready: bool, initialized: bool = True) -> list[JSON]:
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
        condition("PodReadyToStartContainers", True),
        condition("Initialized", initialized, "ContainersNotInitialized"),
        condition("Ready", ready, "ContainersNotReady"),
        condition("ContainersReady", ready, "ContainersNotReady"),
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
