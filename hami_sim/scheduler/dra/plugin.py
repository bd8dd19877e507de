"""kube-scheduler's DynamicResources plugin, the pure part: the claims, slices and classes it watches,
its assume cache of claims being allocated, and PreEnqueue, PreFilter, Filter, Score and Reserve for one
pod. The API writes of PreBind and Unreserve are in `binding.py`; the stand-in calls them.

Upstream: kubernetes/kubernetes `pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go`
(and `dra_manager.go`, `allocateddevices.go`) as of 1.34/1.35; `k8s.io/dynamic-resource-allocation/
resourceclaim/resourceclaim.go` (v0.35.0) for the claim of a pod.

- PreEnqueue: every claim of the pod exists (`resourceClaimName`, or the generated name in
  `pod.status.resourceClaimStatuses` for a template), is not being deleted and, when generated, is
  controlled by the pod. Otherwise the pod waits, without an attempt or an event, until a claim or the
  pod changes ("pod "ns/p": ResourceClaim not created yet", "could not find ResourceClaim "ns/c"").
- PreFilter: a claim allocated and reserved for 256 consumers other than this pod is in use; a claim
  being allocated for another pod (between its Reserve and the end of its PreBind) makes this one
  wait; a missing device class is unschedulable ("request gpu: device class X does not exist"). The
  allocator for the unallocated claims is built once per cycle, with the allocated state of every
  claim (allocated, assumed, or in flight).
- Filter, per node: run the allocator (an error, such as a failing CEL selector, aborts the cycle;
  "cannot allocate all claims" rejects the node); an allocated claim whose nodeSelector excludes the
  node -> "resourceclaim not available on the node".
- Score (1.35, KEP-4816): nodes where better-ranked `firstAvailable` sub-requests fit score higher
  (`8 - index` per chosen sub-request, normalized to 0..100). 1.34 has no DRA score.
- Reserve: the allocations chosen for the node become "in flight" (counted as allocated at once, so the
  next cycles cannot give the same capacity away); PreBind's successful writes turn them into assumed
  claims that the informer's newer copy replaces; a failure forgets them (Unreserve).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hami_sim.scheduler.dra.allocator import (
    DEFAULT_MAX_STEPS,
    AllocatedState,
    AllocationError,
    AllocationMemo,
    Allocator,
    NodeAllocation,
    claim_ref,
    new_share_id,
)
from hami_sim.scheduler.dra.inventory import Inventory
from hami_sim.scheduler.dra.selector import SelectorCache
from hami_sim.scheduler.fit import NodeInfo, node_selector_matches

Json = dict[str, Any]

FINALIZER: Final = "resource.kubernetes.io/delete-protection"
RESERVED_FOR_MAX_SIZE: Final = 256
FIRST_AVAILABLE_MAX_SIZE: Final = 8
MAX_NODE_SCORE: Final = 100
REASON_NOT_AVAILABLE: Final = "resourceclaim not available on the node"
REASON_IN_USE: Final = "resourceclaim in use"


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def key_of(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return claim_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


def allocation_of(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    allocation = (claim.get("status") or {}).get("allocation")
    return allocation if isinstance(allocation, Mapping) else None


def reserved_for(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in (claim.get("status") or {}).get("reservedFor") or () if isinstance(r, Mapping)]


def is_reserved_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    return any(str(r.get("uid") or "") == pod_uid for r in reserved_for(claim))


def has_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _version(obj: Mapping[str, Any]) -> int:
    raw = _meta(obj).get("resourceVersion")
    try:
        return int(str(raw))
    except ValueError:
        return -1


class ClaimGate(Exception):
    """The pod cannot be tried yet (PreEnqueue / PreFilter unschedulable); the message is kube's."""


@dataclass
class CycleState:
    """What PreFilter found for one pod, used by Filter, Score, Reserve and PreBind."""

    pod: Json
    claims: list[Json]
    """Every claim of the pod, in `spec.resourceClaims` order (the copies seen at PreFilter)."""
    available_on: list[Mapping[str, Any] | None]
    """Per claim: the nodeSelector of its allocation (allocated claims only)."""
    to_allocate: list[int]
    """Indices (in `claims`) of the claims the scheduler allocates."""
    allocator: Allocator | None
    node_allocations: dict[str, NodeAllocation] = field(default_factory=dict)
    allocations: dict[int, Json] = field(default_factory=dict)
    """Set by Reserve: claim index -> the allocation to write."""

    @property
    def pod_uid(self) -> str:
        return str(_meta(self.pod).get("uid") or "")


class DynamicResources:
    """The plugin's state, fed by the stand-in's informers (ResourceClaims, ResourceSlices,
    DeviceClasses). Every informer method returns True when the change may make a waiting pod
    schedulable (the events kube registers for the plugin)."""

    def __init__(
        self,
        *,
        share_id: Callable[[], str] = new_share_id,
        max_steps: int = DEFAULT_MAX_STEPS,
    ) -> None:
        self.inventory = Inventory()
        self.classes: dict[str, Json] = {}
        self.claims: dict[str, Json] = {}
        """The informer's claims by namespace/name."""
        self.assumed: dict[str, Json] = {}
        """Claims written by PreBind that the informer has not shown yet (kube's assume cache)."""
        self.in_flight: dict[str, Json] = {}
        """Claims between Reserve and the end of PreBind, by key, with the allocation they will get."""
        self.allocated = AllocatedState()
        self.memo = AllocationMemo()
        """Each node's search outcome for the claims' specs while nothing it reads changed (the stand-in's
        shortcut: `AllocationMemo`)."""
        self.selectors = SelectorCache()
        self.share_id = share_id
        self.max_steps = max_steps

    # --- the effective view (informer + assume cache) ------------------------------------------------

    def claim(self, key: str) -> Json | None:
        """The claim as the scheduler sees it: the assumed copy while it is newer than the informer's."""
        return self.assumed.get(key) or self.claims.get(key)

    def _swap(self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        if before is not None:
            self.allocated.remove(before)
        if after is not None:
            self.allocated.add(after)

    # --- informers -----------------------------------------------------------------------------------

    def set_claim(self, claim: Json) -> bool:
        key = key_of(claim)
        before = self.claim(key)
        old = self.claims.get(key)
        self.claims[key] = claim
        assumed = self.assumed.get(key)
        if assumed is not None and (
            _version(claim) >= _version(assumed) >= 0 or _meta(claim).get("uid") != _meta(assumed).get("uid")
        ):
            del self.assumed[key]
        self._swap(before, self.claim(key))
        if old is None:
            return True  # created: a pod may have been waiting for it
        if allocation_of(old) is not None and allocation_of(claim) is None:
            return True  # deallocated: its devices are free again
        return len(reserved_for(claim)) < len(reserved_for(old))

    def delete_claim(self, claim: Mapping[str, Any]) -> bool:
        key = key_of(claim)
        before = self.claim(key)
        self.claims.pop(key, None)
        self.assumed.pop(key, None)
        self._swap(before, None)
        return False  # kube registers no event for a deleted claim

    def replace_claims(self, items: Sequence[Json]) -> None:
        seen = {key_of(c) for c in items}
        for key in [k for k in self.claims if k not in seen]:
            self.delete_claim(self.claims[key])
        for claim in items:
            self.set_claim(claim)

    def set_slice(self, slice_: Json) -> bool:
        return self.inventory.set_slice(slice_)

    def delete_slice(self, slice_: Mapping[str, Any]) -> bool:
        self.inventory.delete_slice(str(_meta(slice_).get("name") or ""))
        return False

    def replace_slices(self, items: Sequence[Json]) -> None:
        self.inventory.replace(items)

    def set_class(self, class_: Json) -> bool:
        name = str(_meta(class_).get("name") or "")
        changed = self.classes.get(name) != class_
        self.classes[name] = class_
        return changed

    def delete_class(self, class_: Mapping[str, Any]) -> bool:
        self.classes.pop(str(_meta(class_).get("name") or ""), None)
        return False

    def replace_classes(self, items: Iterable[Json]) -> None:
        self.classes = {str(_meta(c).get("name") or ""): c for c in items}

    # --- PreEnqueue ------------------------------------------------------------------------------------

    def pod_claims(self, pod: Mapping[str, Any]) -> list[Json]:
        """The pod's claims (upstream's `foreachPodResourceClaim`); ClaimGate when one is missing, being
        deleted or not the pod's own."""
        meta = _meta(pod)
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        out: list[Json] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            pod_claim = str(entry.get("name") or "")
            must_own = False
            if entry.get("resourceClaimName"):
                claim_name = str(entry["resourceClaimName"])
            elif entry.get("resourceClaimTemplateName"):
                status = next((s for s in statuses if s.get("name") == pod_claim), None)
                if status is None:
                    raise ClaimGate(f'pod "{namespace}/{name}": ResourceClaim not created yet')
                if not status.get("resourceClaimName"):
                    continue  # intentionally not created: nothing to do for it
                claim_name, must_own = str(status["resourceClaimName"]), True
            else:
                raise ClaimGate(
                    f'pod "{namespace}/{name}", spec.resourceClaim "{pod_claim}": '
                    "none of the supported fields are set"
                )
            claim = self.claim(claim_key(namespace, claim_name))
            if claim is None:
                raise ClaimGate(f'could not find ResourceClaim "{namespace}/{claim_name}"')
            if _meta(claim).get("deletionTimestamp"):
                raise ClaimGate(f'resourceclaim "{claim_name}" is being deleted')
            if must_own and not _controlled_by(claim, str(meta.get("uid") or "")):
                raise ClaimGate(
                    f"ResourceClaim {namespace}/{claim_name} was not created for pod {namespace}/{name} "
                    "(pod is not owner)"
                )
            out.append(claim)
        return out

    # --- PreFilter ---------------------------------------------------------------------------------

    def pre_filter(self, pod: Mapping[str, Any]) -> CycleState | None:
        """The cycle state (None: the pod has no claims, the plugin skips it). ClaimGate when the pod is
        unschedulable on every node."""
        claims = self.pod_claims(pod)
        if not claims:
            return None
        uid = str(_meta(pod).get("uid") or "")
        available_on: list[Mapping[str, Any] | None] = []
        to_allocate: list[int] = []
        for index, claim in enumerate(claims):
            allocation = allocation_of(claim)
            if allocation is not None:
                if len(reserved_for(claim)) >= RESERVED_FOR_MAX_SIZE and not is_reserved_for(claim, uid):
                    raise ClaimGate(REASON_IN_USE)
                selector = allocation.get("nodeSelector")
                available_on.append(selector if isinstance(selector, Mapping) else None)
                continue
            available_on.append(None)
            to_allocate.append(index)
            if key_of(claim) in self.in_flight:
                raise ClaimGate(f"resource claim {claim_ref(claim)} is in the process of being allocated")
            self._check_classes(claim)
        allocator = None
        if to_allocate:
            allocator = Allocator(
                [claims[i] for i in to_allocate],
                self.inventory,
                self.classes,
                self.allocated,
                selectors=self.selectors,
                share_id=self.share_id,
                max_steps=self.max_steps,
                memo=self.memo,
            )
        return CycleState(dict(pod), claims, available_on, to_allocate, allocator)

    def _check_classes(self, claim: Mapping[str, Any]) -> None:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            name = str(request.get("name") or "")
            if isinstance(request.get("exactly"), Mapping):
                wanted = [(name, request["exactly"].get("deviceClassName"))]
            elif request.get("firstAvailable"):
                wanted = [
                    (f"{name}/{s.get('name')}", s.get("deviceClassName")) for s in request["firstAvailable"]
                ]
            else:
                raise ClaimGate(f"resource claim {claim_ref(claim)}, request {name}: unknown request type")
            for request_name, class_name in wanted:
                if not class_name:
                    raise AllocationError(f"request {request_name}: unsupported request type")
                if class_name not in self.classes:
                    raise ClaimGate(f"request {request_name}: device class {class_name} does not exist")

    # --- Filter and Score ---------------------------------------------------------------------------

    def filter(self, state: CycleState, node: NodeInfo) -> list[str]:
        """The reasons the node cannot take the pod's claims (empty: it can). AllocationError aborts the
        cycle."""
        if state.allocator is not None:
            outcome = state.allocator.allocate(node.name, node.labels)
            if not outcome.fits:
                return [outcome.reason]
            state.node_allocations[node.name] = outcome
        for selector in state.available_on:
            if selector is not None and not node_selector_matches(selector, node.name, node.labels):
                return [REASON_NOT_AVAILABLE]
        return []

    def scores(self, state: CycleState, nodes: Iterable[str]) -> dict[str, int]:
        """1.35's Score + NormalizeScore: per node the rank of the firstAvailable sub-requests chosen."""
        raw: dict[str, int] = {}
        for node in nodes:
            outcome = state.node_allocations.get(node)
            score = 0
            if outcome is not None:
                for index, chosen in zip(state.to_allocate, outcome.chosen_requests(), strict=True):
                    score += _sub_request_score(state.claims[index], chosen)
            raw[node] = score
        best = max(raw.values(), default=0)
        if best == 0:
            return raw
        return {node: MAX_NODE_SCORE * score // best for node, score in raw.items()}

    # --- Reserve / Unreserve ----------------------------------------------------------------------------

    def reserve(self, state: CycleState, node: str) -> None:
        """Keep the allocations chosen for `node` as in flight (counted as allocated from now on)."""
        outcome = state.node_allocations.get(node)
        allocations = (outcome.allocations if outcome is not None else None) or []
        if len(allocations) != len(state.to_allocate):
            raise AllocationError(
                f"internal error, have {len(allocations)} allocations, "
                f"{len(state.to_allocate)} claims to allocate"
            )
        for index, allocation in zip(state.to_allocate, allocations, strict=True):
            claim = copy.deepcopy(state.claims[index])
            finalizers = claim.setdefault("metadata", {}).setdefault("finalizers", [])
            if FINALIZER not in finalizers:
                finalizers.append(FINALIZER)
            claim.setdefault("status", {})["allocation"] = allocation
            state.allocations[index] = allocation
            self.in_flight[key_of(claim)] = claim
            self.allocated.add(claim)

    def bound(self, claim: Json) -> None:
        """PreBind wrote `claim` (allocated, reserved): assume it until the informer shows it."""
        key = key_of(claim)
        self._drop_in_flight(key)
        before = self.claim(key)
        if _version(claim) > _version(self.claims.get(key) or {}):
            self.assumed[key] = claim
        self._swap(before, self.claim(key))

    def unreserve(self, state: CycleState) -> None:
        """Forget what Reserve kept and what PreBind assumed (kube's Unreserve + AssumedClaimRestore)."""
        for index in state.to_allocate:
            key = key_of(state.claims[index])
            self._drop_in_flight(key)
            before = self.claim(key)
            if self.assumed.pop(key, None) is not None:
                self._swap(before, self.claim(key))

    def _drop_in_flight(self, key: str) -> None:
        claim = self.in_flight.pop(key, None)
        if claim is not None:
            self.allocated.remove(claim)


def _controlled_by(claim: Mapping[str, Any], pod_uid: str) -> bool:
    return any(
        isinstance(ref, Mapping) and ref.get("controller") is True and str(ref.get("uid") or "") == pod_uid
        for ref in _meta(claim).get("ownerReferences") or ()
    )


def _sub_request_score(claim: Mapping[str, Any], chosen: frozenset[str]) -> int:
    """The claim's score from the result names of its picked devices (`request/sub` for a
    firstAvailable sub-request)."""
    score = 0
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        for i, sub in enumerate(request.get("firstAvailable") or ()):
            if f"{request.get('name')}/{sub.get('name')}" in chosen:
                score += FIRST_AVAILABLE_MAX_SIZE - i
    return score
