"""The API writes of kube-scheduler's DynamicResources plugin: PreBind (allocate and reserve each claim
of the pod) and Unreserve (take the pod out of `reservedFor` after a failed bind). I/O through
`hami_kube.KubeApi`; the plugin's state is updated through `DynamicResources.bound`.

Upstream: `dynamicresources.go` `PreBind` / `bindClaim` / `Unreserve` (1.34/1.35). For each claim not yet
reserved for the pod, with conflicts retried on a fresh copy (client-go's `retry.DefaultRetry`: 5 tries):

1. a claim being deleted fails ("claim ns/c got deleted in the meantime"); a claim the scheduler
   allocates that got an allocation meanwhile fails ("... got allocated elsewhere in the meantime");
2. the finalizer `resource.kubernetes.io/delete-protection` is added by an update of the claim;
3. `status.allocation` (when the scheduler allocated it) and the pod appended to `status.reservedFor`
   ({resource: pods, name, uid}) are written by one update of `/status`.

A claim already allocated (shared with another pod) only gets the pod appended to `reservedFor`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_sim.scheduler.dra.allocator import claim_ref
from hami_sim.scheduler.dra.plugin import (
    FINALIZER,
    CycleState,
    DynamicResources,
    allocation_of,
    is_reserved_for,
)

Json = dict[str, Any]
CLAIMS_PATH: Final = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
CONFLICT_RETRIES: Final = 5


class ClaimBindError(Exception):
    """PreBind could not allocate or reserve a claim; the pod goes back to the queue (backoff)."""


def claim_path(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return CLAIMS_PATH.format(namespace=meta.get("namespace") or "default", name=meta.get("name"))


async def pre_bind(client: KubeApi, plugin: DynamicResources, state: CycleState) -> None:
    """Allocate and reserve every claim of the pod that is not reserved for it yet. Raises ClaimBindError;
    the caller then calls `unreserve`."""
    uid = state.pod_uid
    for index, claim in enumerate(state.claims):
        if is_reserved_for(claim, uid):
            continue
        written = await _bind_claim(client, claim, state.allocations.get(index), state.pod)
        plugin.bound(written)
        state.claims[index] = written


async def _bind_claim(
    client: KubeApi, claim: Json, allocation: Mapping[str, Any] | None, pod: Mapping[str, Any]
) -> Json:
    meta = pod.get("metadata") or {}
    consumer = {"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}
    path = claim_path(claim)
    current = copy.deepcopy(claim)
    for attempt in range(CONFLICT_RETRIES):
        try:
            if attempt:
                current = await client.get(path)
            if (current.get("metadata") or {}).get("deletionTimestamp"):
                raise ClaimBindError(f"claim {claim_ref(current)} got deleted in the meantime")
            if allocation is not None:
                if allocation_of(current) is not None:
                    raise ClaimBindError(
                        f"claim {claim_ref(current)} got allocated elsewhere in the meantime"
                    )
                finalizers = current.setdefault("metadata", {}).setdefault("finalizers", [])
                if FINALIZER not in finalizers:
                    finalizers.append(FINALIZER)
                    try:
                        current = await client.request("PUT", path, current)
                    except KubeApiError as err:
                        if err.status == 409:
                            raise
                        raise ClaimBindError(f"add finalizer to claim {claim_ref(current)}: {err}") from None
                current.setdefault("status", {})["allocation"] = copy.deepcopy(dict(allocation))
            status = current.setdefault("status", {})
            status["reservedFor"] = [*(status.get("reservedFor") or ()), consumer]
            try:
                return await client.request("PUT", f"{path}/status", current)
            except KubeApiError as err:
                if err.status == 409:
                    raise
                what = "allocation and reservation" if allocation is not None else "reservation"
                raise ClaimBindError(f"add {what} to claim {claim_ref(current)}: {err}") from None
        except KubeApiError as err:
            if err.status != 409 or attempt == CONFLICT_RETRIES - 1:
                raise ClaimBindError(f"claim {claim_ref(claim)}: {err}") from None
    raise ClaimBindError(f"claim {claim_ref(claim)}: conflicts")  # not reached


async def unreserve(client: KubeApi, plugin: DynamicResources, state: CycleState) -> list[str]:
    """Forget the in-flight and assumed allocations, and take the pod out of `reservedFor` of every claim
    reserved for it (upstream patches `{"$patch": "delete", "uid": ...}`; here a read and an update of
    `/status`, retried on conflict). Returns the errors (the pod is retried anyway)."""
    plugin.unreserve(state)
    uid = state.pod_uid
    errors: list[str] = []
    for claim in state.claims:
        if allocation_of(claim) is None or not is_reserved_for(claim, uid):
            continue
        path = claim_path(claim)
        for attempt in range(CONFLICT_RETRIES):
            try:
                current = await client.get(path)
                if not is_reserved_for(current, uid):
                    break
                status = current.setdefault("status", {})
                status["reservedFor"] = [r for r in status.get("reservedFor") or () if r.get("uid") != uid]
                await client.request("PUT", f"{path}/status", current)
                break
            except KubeApiError as err:
                if err.not_found:
                    break
                if err.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    errors.append(f"unreserve {claim_ref(claim)}: {err}")
                    break
    return errors
