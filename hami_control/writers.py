"""hami-control's writes to the API: Bindings (with the allocation annotations) and Events, the latter
rate-limited and written by a background task like client-go's event recorder."""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hami_control.binder import BindRejected
from hami_kube.client import JSONDict, KubeApi
from hami_kube.errors import KubeApiError

log = logging.getLogger(__name__)


class KubeBindingWriter:
    """`binder.BindingWriter` over the API: one POST pods/<name>/binding whose annotations the API
    server copies onto the pod, with the pod's UID as precondition (a pod deleted and re-created under
    the same name gets 409, not someone else's GPUs)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        metadata: JSONDict = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)
        except KubeApiError as err:
            raise BindRejected(err.status, err.reason, err.message) from None


@dataclass(frozen=True, slots=True)
class EventLimits:
    """Event rate limits: per pod and reason at most one event per `per_object_s`; overall a token
    bucket of `burst` events refilled at `per_second`. Dropped events are counted, never queued."""

    per_object_s: float = 10.0
    per_second: float = 20.0
    burst: int = 50
    queue: int = 1000


class KubeEventRecorder:
    """`binder.EventRecorder` over the API: core/v1 Events on the pod, written by one background task so
    a slow API server never delays a bind. Rate-limited (`EventLimits`); `sent`/`dropped` count them."""

    def __init__(
        self,
        api: KubeApi,
        *,
        component: str = "hami-scheduler",
        instance: str = "",
        limits: EventLimits = EventLimits(),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.component = component
        self.instance = instance
        self.limits = limits
        self.clock = clock
        self.wall_clock = wall_clock
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._last: collections.OrderedDict[tuple[str, str, str], float] = collections.OrderedDict()
        self._tokens = float(limits.burst)
        self._refilled = clock()
        self._queue: asyncio.Queue[JSONDict] = asyncio.Queue(limits.queue)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="events")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _admit(self, key: tuple[str, str, str]) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.limits.per_object_s:
            return False
        self._tokens = min(
            float(self.limits.burst), self._tokens + (now - self._refilled) * self.limits.per_second
        )
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > 10_000:
            self._last.popitem(last=False)
        return True

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        if not self._admit((namespace, name, reason)):
            self.dropped += 1
            return
        stamp = datetime.datetime.fromtimestamp(self.wall_clock(), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        event: JSONDict = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", event)
                self.sent += 1
            except KubeApiError as err:
                self.failed += 1
                log.debug(
                    "event %s on %s not written: %s", event["reason"], event["involvedObject"]["name"], err
                )


__all__ = [
    "EventLimits",
    "KubeBindingWriter",
    "KubeEventRecorder",
]
