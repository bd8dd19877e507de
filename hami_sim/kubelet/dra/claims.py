"""Kubelet's rules about a pod's ResourceClaims (pure, over plain JSON objects).

- `claim_name`: k8s.io/dynamic-resource-allocation/resourceclaim `Name`: `resourceClaimName` as is; for
  `resourceClaimTemplateName`, the name the claim controller wrote to `pod.status.resourceClaimStatuses`
  (an entry without a name means the claim was deliberately not created: nothing to do), an error while
  it has not been written yet.
- `check_owner`: resourceclaim `IsForPod` (a generated claim must be controlled by the pod);
  `is_reserved_for_pod`: `IsReservedForPod` (the pod's UID in `status.reservedFor`).
- `allocation_drivers`: the drivers of a claim's allocation results (pkg/kubelet/cm/dra/claiminfo.go
  `newClaimInfoFromClaim`, which fails with "not allocated").
- `container_claim_requests` and `cdi_device_ids`: pkg/kubelet/cm/dra/manager.go `GetResources` and
  claiminfo.go `cdiDevicesAsList`: every container that lists a pod claim in `resources.claims` gets the
  CDI device IDs of every device prepared for the claim, or, when it names a `request`, those of the
  devices whose request names contain it or are empty. Kubelet walks Go maps there (claims, drivers);
  the stand-in keeps the pod's claim order and sorts drivers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami_sim.kubelet.dra.checkpoint import ClaimInfoState

JSON = Mapping[str, Any]


class ClaimError(Exception):
    """A pod's claim cannot be used; the message is kubelet's (it lands in the pod's event)."""


def _meta(obj: JSON) -> JSON:
    return obj.get("metadata") or {}


def pod_claims(pod: JSON) -> list[JSON]:
    """`pod.spec.resourceClaims` (kubelet ignores `status.extendedResourceClaimStatus` without the
    DRAExtendedResource gate; so does the stand-in)."""
    return [c for c in (pod.get("spec") or {}).get("resourceClaims") or [] if isinstance(c, Mapping)]


def claim_name(pod: JSON, pod_claim: JSON) -> tuple[str | None, bool]:
    """(name of the ResourceClaim, whether its owner must be checked); name None: nothing to prepare.
    Raises `ClaimError` with resourceclaim.Name's text."""
    meta = _meta(pod)
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"]), False
    if pod_claim.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("name") == pod_claim.get("name"):
                generated = status.get("resourceClaimName")
                return (str(generated) if generated else None), True
        raise ClaimError(f'pod "{namespace}/{name}": ResourceClaim not created yet')
    raise ClaimError(
        f'pod "{namespace}/{name}", spec.resourceClaim "{pod_claim.get("name", "")}": '
        "none of the supported fields are set"
    )


def check_owner(pod: JSON, claim: JSON) -> None:
    """resourceclaim.IsForPod: a claim made from a template must be in the pod's namespace and
    controlled by the pod."""
    pod_meta, claim_meta = _meta(pod), _meta(claim)
    controlled = any(
        ref.get("controller") is True and ref.get("uid") == pod_meta.get("uid")
        for ref in claim_meta.get("ownerReferences") or []
    )
    if claim_meta.get("namespace") != pod_meta.get("namespace") or not controlled:
        raise ClaimError(
            f"ResourceClaim {claim_meta.get('namespace')}/{claim_meta.get('name')} was not created for pod "
            f"{pod_meta.get('namespace')}/{pod_meta.get('name')} (pod is not owner)"
        )


def is_reserved_for_pod(pod: JSON, claim: JSON) -> bool:
    uid = _meta(pod).get("uid")
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in reserved)


def not_reserved_message(pod: JSON, claim_name: str, claim: JSON) -> str:
    meta = _meta(pod)
    return (
        f"pod {meta.get('name')} ({meta.get('uid')}) is not allowed to use ResourceClaim "
        f"{claim_name} ({_meta(claim).get('uid')})"
    )


def allocation_drivers(claim: JSON) -> list[str]:
    """The drivers with results in the claim's allocation, in first-result order; `ClaimError` "not
    allocated" without an allocation."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError("not allocated")
    drivers: dict[str, None] = {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if isinstance(result, Mapping) and result.get("driver"):
            drivers.setdefault(str(result["driver"]), None)
    return list(drivers)


def container_claim_requests(pod: JSON, container: JSON) -> list[tuple[str, list[str]]]:
    """(ResourceClaim name, request names) for each pod claim the container lists in
    `resources.claims`, in the pod's claim order; a request name "" stands for the whole claim.
    Raises `ClaimError` as `claim_name` does."""
    wanted: dict[str, list[str]] = {}
    for ref in (container.get("resources") or {}).get("claims") or []:
        if isinstance(ref, Mapping) and ref.get("name"):
            wanted.setdefault(str(ref["name"]), []).append(str(ref.get("request") or ""))
    result: list[tuple[str, list[str]]] = []
    for pod_claim in pod_claims(pod):
        requests = wanted.get(str(pod_claim.get("name", "")))
        if requests is None:
            continue
        name, _ = claim_name(pod, pod_claim)
        if name is not None:
            result.append((name, requests))
    return result


def cdi_device_ids(info: ClaimInfoState, request: str) -> list[str]:
    """claiminfo.go cdiDevicesAsList: the CDI IDs of the claim's devices for `request` ("" = all)."""
    ids: list[str] = []
    for driver in sorted(info.driver_state):
        for device in info.driver_state[driver]:
            if not request or not device.request_names or request in device.request_names:
                ids.extend(device.cdi_device_ids)
    return ids


def container_cdi_device_ids(
    pod: JSON, container: JSON, claims: Mapping[tuple[str, str], ClaimInfoState]
) -> list[str]:
    """GetResources: the CDI device IDs kubelet hands the runtime for this container. A claim the
    cache does not hold is kubelet's internal error."""
    namespace = str(_meta(pod).get("namespace") or "")
    ids: list[str] = []
    for name, requests in container_claim_requests(pod, container):
        info = claims.get((namespace, name))
        if info is None:
            raise ClaimError(
                f"internal error: unable to get claim info for ResourceClaim {name} in namespace {namespace}"
            )
        for request in requests:
            ids.extend(cdi_device_ids(info, request))
    return ids


def containers(pod: JSON) -> Sequence[JSON]:
    """Init containers, then app containers, in spec order."""
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def go_quoted_list(values: Iterable[str]) -> str:
    """A string slice as Go's `%q` prints it: `["a" "b"]`."""
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"
