"""kube-scheduler's DynamicResources plugin, the pure part (hami_sim.scheduler.dra.plugin): a pod's claims
(PreEnqueue), PreFilter's verdicts, Filter per node, the 1.35 score, and the in-flight and assumed
allocations that keep capacity taken between cycles until the informer shows the write."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from hami_api import dra
from hami_sim.scheduler.dra.allocator import REASON_CANNOT_ALLOCATE, AllocationError
from hami_sim.scheduler.dra.plugin import (
    FINALIZER,
    REASON_NOT_AVAILABLE,
    ClaimGate,
    CycleState,
    DynamicResources,
)
from hami_sim.scheduler.fit import NodeInfo
from tests.builders import (
    device_class,
    device_request,
    dra_claim,
    gpu_share,
    hami_gpu_device,
    node,
    pod,
    resource_slice,
)

Json = dict[str, Any]
NS = "default"


def plugin_with(*claims: Json, slices: tuple[Json, ...] | None = None) -> DynamicResources:
    counter = itertools.count()
    plugin = DynamicResources(share_id=lambda: f"share-{next(counter)}")
    plugin.replace_classes([device_class()])
    plugin.replace_slices(
        list(slices) if slices is not None else [resource_slice("n1", hami_gpu_device(0, memory_mib=10240))]
    )
    plugin.replace_claims(list(claims))
    return plugin


def claim_pod(
    name: str = "p", *, uid: str = "uid-p", claim: str = "c", template: bool = False, statuses: Any = None
) -> Json:
    ref = (
        {"name": "gpu", "resourceClaimTemplateName": "t"}
        if template
        else {"name": "gpu", "resourceClaimName": claim}
    )
    body = pod(name, namespace=NS, uid=uid, resourceClaims=[ref])
    if statuses is not None:
        body["status"] = {"resourceClaimStatuses": statuses}
    return body


def info(name: str, **labels: str) -> NodeInfo:
    node_info = NodeInfo(name)
    node_info.set_node(node(name, labels=labels or None))
    return node_info


def allocation_on(state: CycleState, node_name: str) -> Json:
    """The allocation Filter found for the pod's first claim on `node_name`."""
    allocations = state.node_allocations[node_name].allocations
    assert allocations is not None
    return allocations[0]


def versioned(claim: Json, version: int) -> Json:
    out = copy.deepcopy(claim)
    out["metadata"]["resourceVersion"] = str(version)
    return out


# --- PreEnqueue -----------------------------------------------------------------------------------


def test_a_pod_waits_for_a_named_claim_and_for_its_generated_claim_in_kube_words() -> None:
    plugin = plugin_with()
    with pytest.raises(ClaimGate, match=r'^could not find ResourceClaim "default/c"$'):
        plugin.pod_claims(claim_pod())
    with pytest.raises(ClaimGate, match=r'^pod "default/p": ResourceClaim not created yet$'):
        plugin.pod_claims(claim_pod(template=True))


def test_a_generated_claim_must_be_controlled_by_the_pod() -> None:
    owner = claim_pod(uid="uid-p")
    mine = dra_claim("p-gpu-x", gpu_share(), uid="c1", owner_pod=owner)
    plugin = plugin_with(mine)
    statuses = [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]
    assert plugin.pod_claims(claim_pod(template=True, statuses=statuses)) == [mine]
    with pytest.raises(ClaimGate, match=r"was not created for pod default/q \(pod is not owner\)"):
        plugin.pod_claims(claim_pod("q", uid="uid-q", template=True, statuses=statuses))


def test_a_claim_being_deleted_holds_the_pod() -> None:
    doomed = dra_claim("c", gpu_share())
    doomed["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    with pytest.raises(ClaimGate, match=r'^resourceclaim "c" is being deleted$'):
        plugin_with(doomed).pod_claims(claim_pod())


# --- PreFilter, Filter, Score -------------------------------------------------------------------------


def test_a_missing_device_class_is_unschedulable_and_a_class_less_request_an_error() -> None:
    plugin = plugin_with(dra_claim("c", device_request(device_class_name="gone")))
    with pytest.raises(ClaimGate, match=r"^request gpu: device class gone does not exist$"):
        plugin.pre_filter(claim_pod())
    plugin = plugin_with(dra_claim("c", device_request(device_class_name="")))
    with pytest.raises(AllocationError, match=r"^request gpu: unsupported request type$"):
        plugin.pre_filter(claim_pod())


def test_filter_allocates_per_node_and_rejects_nodes_without_room() -> None:
    plugin = plugin_with(dra_claim("c", gpu_share("4Gi", "30")))
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    assert plugin.filter(state, info("n2")) == [REASON_CANNOT_ALLOCATE]
    assert plugin.filter(state, info("n1")) == []
    results = allocation_on(state, "n1")["devices"]["results"]
    assert [(r["device"], r["consumedCapacity"]) for r in results] == [
        (dra.device_name(0), {"memory": "4Gi", "cores": "30"})
    ]


def test_an_allocated_claim_keeps_the_pod_on_the_allocation_node() -> None:
    plugin = plugin_with(dra_claim("c", gpu_share()))
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    plugin.filter(state, info("n1"))
    allocated = dra_claim("c", gpu_share(), allocation=allocation_on(state, "n1"))
    plugin = plugin_with(allocated)
    second = plugin.pre_filter(claim_pod("q", uid="uid-q"))
    assert second is not None and second.allocator is None
    assert plugin.filter(second, info("n1")) == []
    assert plugin.filter(second, info("n2")) == [REASON_NOT_AVAILABLE]


def test_a_claim_reserved_for_256_other_consumers_is_in_use() -> None:
    plugin = plugin_with(dra_claim("c", gpu_share()))
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    plugin.filter(state, info("n1"))
    others = [{"resource": "pods", "name": f"o{i}", "uid": f"u{i}"} for i in range(256)]
    full = dra_claim("c", gpu_share(), allocation=allocation_on(state, "n1"), reserved_for=others)
    with pytest.raises(ClaimGate, match=r"^resourceclaim in use$"):
        plugin_with(full).pre_filter(claim_pod())
    assert plugin_with(full).pre_filter(claim_pod("o7", uid="u7")) is not None  # already reserved


def test_score_prefers_nodes_where_a_better_ranked_sub_request_fits() -> None:
    slices = (
        resource_slice("big", hami_gpu_device(0, memory_mib=81920)),
        resource_slice("small", hami_gpu_device(0, memory_mib=16384)),
    )
    request = device_request(
        first_available=[gpu_share("40Gi", "10", name="large"), gpu_share("8Gi", "10", name="any")]
    )
    plugin = plugin_with(dra_claim("c", request), slices=slices)
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    assert plugin.filter(state, info("big")) == [] and plugin.filter(state, info("small")) == []
    assert plugin.scores(state, ["big", "small"]) == {"big": 100, "small": 87}


def test_filter_builds_the_allocation_of_the_reserved_node_only_and_as_an_immediate_build_would() -> None:
    slices = tuple(resource_slice(f"n{i}", hami_gpu_device(0, memory_mib=10240)) for i in range(1, 4))
    plugin = plugin_with(dra_claim("c", gpu_share("4Gi", "30")), slices=slices)
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    assert [plugin.filter(state, info(f"n{i}")) for i in range(1, 4)] == [[], [], []]
    assert plugin.scores(state, ["n1", "n2", "n3"]) == {"n1": 0, "n2": 0, "n3": 0}
    plugin.reserve(state, "n2")
    results = state.allocations[0]["devices"]["results"]
    # one share ID drawn: the reserved node's (the counter starts at 0), none for n1 and n3
    assert [(r["pool"], r["shareID"]) for r in results] == [("n2", "share-0")]
    assert state.allocations[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n2"]


# --- Reserve, PreBind's bookkeeping, Unreserve ---------------------------------------------------------


def test_reserved_allocations_count_at_once_and_block_the_same_claim_for_others() -> None:
    first = dra_claim("a", gpu_share("6Gi", "30"))
    second = dra_claim("b", gpu_share("6Gi", "30"))
    plugin = plugin_with(first, second)
    state = plugin.pre_filter(claim_pod(claim="a"))
    assert state is not None and plugin.filter(state, info("n1")) == []
    plugin.reserve(state, "n1")
    assert state.claims[0]["metadata"].get("finalizers") is None  # the PreFilter copy is untouched
    assert plugin.in_flight["default/a"]["metadata"]["finalizers"] == [FINALIZER]
    other = plugin.pre_filter(claim_pod("q", uid="uid-q", claim="b"))
    assert other is not None
    assert plugin.filter(other, info("n1")) == [REASON_CANNOT_ALLOCATE]  # 6Gi + 6Gi > 10Gi
    with pytest.raises(ClaimGate, match=r"^resource claim default/a is in the process of being allocated$"):
        plugin.pre_filter(claim_pod("r", uid="uid-r", claim="a"))
    plugin.unreserve(state)
    assert plugin.in_flight == {} and plugin.allocated.capacity == {}
    again = plugin.pre_filter(claim_pod("q", uid="uid-q", claim="b"))
    assert again is not None and plugin.filter(again, info("n1")) == []


def test_a_written_claim_is_assumed_until_the_informer_shows_that_version() -> None:
    claim = versioned(dra_claim("a", gpu_share("6Gi", "30")), 5)
    plugin = plugin_with(claim)
    state = plugin.pre_filter(claim_pod(claim="a"))
    assert state is not None and plugin.filter(state, info("n1")) == []
    plugin.reserve(state, "n1")
    written = versioned(plugin.in_flight["default/a"], 7)
    written["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "uid-p"}]
    plugin.bound(written)
    key = (dra.DRIVER, "n1", dra.device_name(0))
    assert plugin.in_flight == {} and plugin.assumed == {"default/a": written}
    assert plugin.allocated.consumed(key)["cores"] == 30
    finalizer_only = versioned(claim, 6)  # an older event (PreBind's finalizer update) changes nothing
    finalizer_only["metadata"]["finalizers"] = [FINALIZER]
    plugin.set_claim(finalizer_only)
    assert plugin.claim("default/a") is written and plugin.allocated.consumed(key)["cores"] == 30
    plugin.set_claim(versioned(written, 7))
    assert plugin.assumed == {} and plugin.allocated.consumed(key)["cores"] == 30
    deallocated = versioned(claim, 9)
    assert plugin.set_claim(deallocated) is True  # the devices are free: waiting pods may fit
    assert plugin.allocated.capacity == {}


def test_a_deleted_claim_frees_its_capacity() -> None:
    plugin = plugin_with(dra_claim("c", gpu_share()))
    state = plugin.pre_filter(claim_pod())
    assert state is not None
    plugin.filter(state, info("n1"))
    allocated = dra_claim("c", gpu_share(), allocation=allocation_on(state, "n1"))
    plugin.set_claim(allocated)
    assert plugin.allocated.capacity != {}
    plugin.delete_claim(allocated)
    assert plugin.allocated.capacity == {} and plugin.claims == {}
