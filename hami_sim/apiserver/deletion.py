"""What a DELETE does to an object, as kube-apiserver's registry decides it: delete it now, keep it
marked (graceful deletion, pending finalizers), or leave a deletion already under way as it is.

Pods are deleted gracefully (pkg/registry/core/pod/strategy.go `CheckGracefulDelete`): a pod bound to a
node and not terminal is only marked (`metadata.deletionTimestamp` = now + grace,
`metadata.deletionGracePeriodSeconds` = grace) and stays until a DELETE with grace 0, normally its
kubelet's once its containers stopped. Other kinds have no graceful deletion: with finalizers they are
marked (grace 0) until the finalizers are gone, without them deleted at once
(staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go `BeforeDelete`;
staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go `Delete`,
`updateForGracefulDeletionAndFinalizers`, `markAsDeleting`).

Pure: the caller reads the options off the request and writes the outcome to the store.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami_sim.apiserver.errors import ApiError, bad_request

JSON = dict[str, Any]

_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class DeleteOptions:
    """The parts of a DeleteOptions the stand-in acts on."""

    grace_period_seconds: int | None = None
    dry_run: bool = False
    preconditions: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Outcome:
    """`write`: the object to store (None: nothing changes); `delete`: remove it now (after `write`).
    Neither: a deletion already under way is left as it is, and the answer is the current object."""

    write: JSON | None = None
    delete: bool = False


def _grace_value(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{where}: expected an integer number of seconds, got {value!r}")
    return value


def _dry_run_value(value: Any) -> bool:
    if value in (None, []):
        return False
    if value == ["All"]:
        return True
    raise ApiError(
        422, "Invalid", f'DeleteOptions.dryRun: Unsupported value: {value!r}: supported values: "All"'
    )


def parse_options(body: Any, query: Mapping[str, str]) -> DeleteOptions:
    """The request's DeleteOptions: its body when it has one, else its query parameters, as kube's
    handler reads them (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go `DeleteResource`).
    A `dryRun` query parameter is read by the caller either way."""
    if body is not None:
        if not isinstance(body, dict):
            raise bad_request("couldn't decode DeleteOptions: the body is not a JSON object")
        pre = body.get("preconditions")
        return DeleteOptions(
            grace_period_seconds=_grace_value(
                body.get("gracePeriodSeconds"), "DeleteOptions.gracePeriodSeconds"
            ),
            dry_run=_dry_run_value(body.get("dryRun")),
            preconditions=pre if isinstance(pre, dict) else None,
        )
    text = query.get("gracePeriodSeconds")
    grace = None
    if text is not None:
        try:
            grace = int(text)
        except ValueError:
            raise bad_request(
                f"gracePeriodSeconds: expected an integer number of seconds, got {text!r}"
            ) from None
    return DeleteOptions(grace_period_seconds=grace)


def pod_grace_period(pod: JSON, requested: int | None) -> int:
    """The grace a first DELETE gives the pod (pod strategy `CheckGracefulDelete`): the request's, else
    `spec.terminationGracePeriodSeconds` (0 when unset); 0 for a pod not bound to a node or already
    Succeeded or Failed; a negative value is 1."""
    spec = pod.get("spec") or {}
    period = requested if requested is not None else int(spec.get("terminationGracePeriodSeconds") or 0)
    if not spec.get("nodeName"):
        period = 0
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        period = 0
    return 1 if period < 0 else period


def _parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _marked(obj: JSON, **changes: Any) -> JSON:
    meta = obj["metadata"]
    new_meta = {**meta, **changes}
    if not meta.get("deletionTimestamp") and int(meta.get("generation") or 0) > 0:
        new_meta["generation"] = int(meta["generation"]) + 1
    return {**obj, "metadata": new_meta}


def plan(
    obj: JSON, *, graceful: bool, requested: int | None, now: float, fmt: Callable[[float], str]
) -> Outcome:
    """What a DELETE with grace `requested` does to `obj` at time `now` (`fmt` writes a time as RFC 3339);
    `graceful`: the kind supports graceful deletion (pods)."""
    meta = obj["metadata"]
    finalizers = bool(meta.get("finalizers"))
    if requested is not None and requested < 0:
        requested = 1  # BeforeDelete: negative values are 1 s on the delete path
    stamp = meta.get("deletionTimestamp")
    if graceful and stamp:
        current = int(meta.get("deletionGracePeriodSeconds") or 0)
        if current > 0:
            if requested is None or requested >= current:
                return Outcome()  # graceful deletion pending: only a shorter grace changes it
            if requested == 0 and not finalizers:
                return Outcome(delete=True)
            deadline = _parse_time(str(stamp)) - current + requested
            return Outcome(
                write=_marked(obj, deletionTimestamp=fmt(deadline), deletionGracePeriodSeconds=requested)
            )
        graceful = False  # marked with grace 0 before (an update that landed, a delete that did not)
    elif graceful:
        period = pod_grace_period(obj, requested)
        if period == 0 and not finalizers:
            return Outcome(delete=True)
        return Outcome(
            write=_marked(obj, deletionTimestamp=fmt(now + period), deletionGracePeriodSeconds=period)
        )
    if not finalizers:
        return Outcome(delete=True)
    # markAsDeleting: the object waits on its finalizers, marked now (or earlier) with grace 0.
    changes: dict[str, Any] = {"deletionGracePeriodSeconds": 0}
    if not stamp or _parse_time(str(stamp)) > now:
        changes["deletionTimestamp"] = fmt(now)
    return Outcome(write=_marked(obj, **changes))
