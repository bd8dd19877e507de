"""`meta.k8s.io/v1` Table output, what `kubectl get` asks for (columns as kube-apiserver prints them)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any

from hami_sim.apiserver.strategy import (
    EVENT,
    LEASE,
    NAMESPACE,
    NODE,
    POD,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    ResourceInfo,
)

JSON = dict[str, Any]

TABLE_MEDIA = "as=Table"


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a meta.k8s.io Table (kubectl get does)."""
    return TABLE_MEDIA in accept and "g=meta.k8s.io" in accept


def human_duration(seconds: float) -> str:
    """kube's `duration.HumanDuration`: 45s, 3m20s, 15m, 5h3m, 2d4h, 400d, 3y20d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: JSON, now: float) -> str:
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        created = datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return "<unknown>"
    return human_duration(now - created)


def _col(name: str, description: str, *, priority: int = 0, fmt: str = "", ctype: str = "string") -> JSON:
    return {"name": name, "type": ctype, "format": fmt, "description": description, "priority": priority}


_NAME = _col("Name", "Name must be unique within a namespace.", fmt="name")
_AGE = _col(
    "Age", "CreationTimestamp is a timestamp representing the server time when this object was created."
)


def _pod_cells(obj: JSON, now: float) -> list[Any]:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    ready = sum(1 for c in statuses if isinstance(c, dict) and c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses if isinstance(c, dict))
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for c in statuses:
        state = c.get("state") or {} if isinstance(c, dict) else {}
        waiting = state.get("waiting") or {}
        terminated = state.get("terminated") or {}
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated.get("reason"):
            reason = terminated["reason"]
    if obj.get("metadata", {}).get("deletionTimestamp"):
        reason = "Terminating"
    ips = status.get("podIP") or "<none>"
    gates = spec.get("readinessGates") or []
    return [
        obj["metadata"]["name"],
        f"{ready}/{total}",
        reason,
        str(restarts),
        _age(obj, now),
        ips,
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"0/{len(gates)}" if gates else "<none>",
    ]


_POD_COLUMNS = [
    _NAME,
    _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", "The aggregate status of the containers in this pod."),
    _col("Restarts", "The number of times the containers in this pod have been restarted."),
    _AGE,
    _col("IP", "IP address allocated to the pod.", priority=1),
    _col("Node", "Name of the node this pod is running on.", priority=1),
    _col("Nominated Node", "Name of the node the scheduler nominated for preemption.", priority=1),
    _col("Readiness Gates", "Pod readiness gates.", priority=1),
]


def _node_cells(obj: JSON, now: float) -> list[Any]:
    status = obj.get("status") or {}
    conditions = {
        c.get("type"): c.get("status") for c in status.get("conditions") or [] if isinstance(c, dict)
    }
    ready = conditions.get("Ready")
    state = "Ready" if ready == "True" else "NotReady" if ready == "False" else "Unknown"
    if (obj.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = obj.get("metadata", {}).get("labels") or {}
    roles = sorted(
        {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k}
        | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set())
    )
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        found = [a.get("address") for a in addresses if isinstance(a, dict) and a.get("type") == kind]
        return str(found[0]) if found else "<none>"

    return [
        obj["metadata"]["name"],
        state,
        ",".join(r for r in roles if r) or "<none>",
        _age(obj, now),
        info.get("kubeletVersion") or "",
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


_NODE_COLUMNS = [
    _NAME,
    _col("Status", "The status of the node"),
    _col("Roles", "The roles of the node"),
    _AGE,
    _col("Version", "Kubelet Version reported by the node."),
    _col("Internal-IP", "List of addresses reachable to the node.", priority=1),
    _col("External-IP", "List of addresses reachable to the node.", priority=1),
    _col("OS-Image", "OS Image reported by the node.", priority=1),
    _col("Kernel-Version", "Kernel Version reported by the node.", priority=1),
    _col("Container-Runtime", "Container Runtime Version reported by the node.", priority=1),
]


def _namespace_cells(obj: JSON, now: float) -> list[Any]:
    return [obj["metadata"]["name"], (obj.get("status") or {}).get("phase") or "", _age(obj, now)]


_NAMESPACE_COLUMNS = [_NAME, _col("Status", "The status of the namespace"), _AGE]


def _lease_cells(obj: JSON, now: float) -> list[Any]:
    return [obj["metadata"]["name"], (obj.get("spec") or {}).get("holderIdentity") or "", _age(obj, now)]


_LEASE_COLUMNS = [_NAME, _col("Holder", "The holder of the lease"), _AGE]


def _event_cells(obj: JSON, now: float) -> list[Any]:
    stamp = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp")
    last_seen = (
        _age({"metadata": {"creationTimestamp": stamp}}, now) if isinstance(stamp, str) else _age(obj, now)
    )
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    return [
        last_seen,
        obj.get("type") or "",
        obj.get("reason") or "",
        f"{kind}/{involved.get('name', '')}" if kind else str(involved.get("name", "")),
        obj.get("message") or "",
    ]


_EVENT_COLUMNS = [
    _col("Last Seen", "The time the event was last seen."),
    _col("Type", "The type of the event."),
    _col("Reason", "The short reason for the event."),
    _col("Object", "The object the event is about."),
    _col("Message", "A description of the event."),
]


def _claim_state(obj: JSON) -> str:
    """kubectl's STATE of a ResourceClaim (pkg/printers/internalversion/printers.go resourceClaimState)."""
    status = obj.get("status") or {}
    states = []
    if obj["metadata"].get("deletionTimestamp"):
        states.append("deleted")
    if status.get("allocation"):
        states.append("allocated")
    if status.get("reservedFor"):
        states.append("reserved")
    return ",".join(states) or "pending"


def _claim_cells(obj: JSON, now: float) -> list[Any]:
    return [obj["metadata"]["name"], _claim_state(obj), _age(obj, now)]


_CLAIM_COLUMNS = [_NAME, _col("State", "A summary of the claim's state"), _AGE]


def _slice_cells(obj: JSON, now: float) -> list[Any]:
    spec = obj.get("spec") or {}
    return [
        obj["metadata"]["name"],
        spec.get("nodeName") or "",
        spec.get("driver") or "",
        (spec.get("pool") or {}).get("name") or "",
        _age(obj, now),
    ]


_SLICE_COLUMNS = [
    _NAME,
    _col("Node", "The node providing the devices"),
    _col("Driver", "The driver providing the devices"),
    _col("Pool", "The pool of the devices"),
    _AGE,
]


def _generic_cells(obj: JSON, now: float) -> list[Any]:
    return [obj["metadata"]["name"], _age(obj, now)]


_PRINTERS: dict[ResourceInfo, tuple[list[JSON], Callable[[JSON, float], list[Any]]]] = {
    POD: (_POD_COLUMNS, _pod_cells),
    NODE: (_NODE_COLUMNS, _node_cells),
    NAMESPACE: (_NAMESPACE_COLUMNS, _namespace_cells),
    LEASE: (_LEASE_COLUMNS, _lease_cells),
    EVENT: (_EVENT_COLUMNS, _event_cells),
    RESOURCE_CLAIM: (_CLAIM_COLUMNS, _claim_cells),
    RESOURCE_SLICE: (_SLICE_COLUMNS, _slice_cells),
}


def _row_object(obj: JSON, include_object: str) -> JSON | None:
    if include_object == "Object":
        return obj
    if include_object == "None":
        return None
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def to_table(
    info: ResourceInfo,
    objects: Iterable[JSON],
    *,
    now: float,
    resource_version: str,
    include_object: str = "Metadata",
    headers: bool = True,
) -> JSON:
    columns, cells = _PRINTERS.get(info, ([_NAME, _AGE], _generic_cells))
    table: JSON = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns if headers else [],
        "rows": [{"cells": cells(obj, now), "object": _row_object(obj, include_object)} for obj in objects],
    }
    return table
