"""hami-control's writes to the API: Bindings (with the allocation annotations), and how its Events are
recorded (`hami_kube.events.EventRecorder`, client-go's event recorder, with hami-control's limits)."""

from __future__ import annotations

from collections.abc import Mapping

from hami_control.binder import BindRejected
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_kube.events import EventLimits, EventRecorder, EventSource


class KubeBindingWriter:
    """`binder.BindingWriter` over the API: one POST pods/<name>/binding whose annotations the API
    server copies onto the pod, with the pod's UID as precondition (a pod deleted and re-created under
    the same name gets 409, not someone else's GPUs)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        try:
            await self.api.bind(namespace, name, node, uid=uid, annotations=annotations)
        except KubeApiError as err:
            raise BindRejected(err.status, err.reason, err.message) from None

    async def lock(self, node: str, annotation: str, value: str) -> None:
        """`binder.NodeLocker`: the lock annotation on the Node by a merge patch, as HAMi's nodelock
        writes it (pkg/util/nodelock `setNodeLock`)."""
        body = {"metadata": {"annotations": {annotation: value}}}
        try:
            await self.api.patch(f"/api/v1/nodes/{node}", body)
        except KubeApiError as err:
            raise BindRejected(err.status, err.reason, err.message) from None

    async def unlock(self, node: str, annotation: str) -> None:
        """`binder.NodeLocker`: the lock annotation removed (HAMi's ReleaseNodeLock)."""
        body = {"metadata": {"annotations": {annotation: None}}}
        try:
            await self.api.patch(f"/api/v1/nodes/{node}", body)
        except KubeApiError as err:
            raise BindRejected(err.status, err.reason, err.message) from None


EVENT_COMPONENT = "hami-scheduler"
"""The `source.component` and `reportingComponent` of hami-control's Events (HAMi's scheduler name)."""

EVENT_LIMITS = EventLimits(per_object_s=10.0, per_second=20.0, burst=50, queue=1000)
"""hami-control's events on top of client-go's correlation: per pod and reason at most one per 10 s, 20
a second overall (burst 50), so a storm of unschedulable pods never competes with the binds for the
client's rate limit."""


def event_recorder(api: KubeApi, instance: str) -> EventRecorder:
    """hami-control's `binder.EventRecorder`: core/v1 Events on the pods from `hami-scheduler`,
    `reportingInstance` this pod, with `EVENT_LIMITS` (not started)."""
    return EventRecorder(api, EventSource(EVENT_COMPONENT, reporting_instance=instance), limits=EVENT_LIMITS)


__all__ = ["EVENT_COMPONENT", "EVENT_LIMITS", "KubeBindingWriter", "event_recorder"]
