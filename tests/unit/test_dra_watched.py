"""hami_node.dra.watched.WatchedPods: the pods of the node's pod watch that NodePrepareResources may take
instead of reading a new claim's pod: only after the first list, while the watch is healthy, with the
reserved UID, and with every template claim's generated name in the pod's status; otherwise None (the
caller reads the pod)."""

from __future__ import annotations

from typing import Any

from hami_node.dra.claims import claim_names_resolved
from hami_node.dra.watched import WatchedPods
from tests.builders import claim_refs, container, pod

UID = "99999999-0000-4000-8000-000000000009"
OTHER = "88888888-0000-4000-8000-000000000008"
TEMPLATE = [{"name": "gpu", "resourceClaimTemplateName": "t"}]


def claim_pod(uid: str = UID, *, resolved: bool = True, name: str = "p") -> dict[str, Any]:
    return pod(
        name,
        container("main", resources=claim_refs("gpu")),
        namespace="default",
        uid=uid,
        node_name="n1",
        resourceClaims=TEMPLATE,
        claim_statuses={"gpu": f"{name}-gpu-x"} if resolved else None,
    )


def test_a_listed_pod_with_the_reserved_uid_is_answered_and_any_other_uid_or_name_is_not() -> None:
    pods = WatchedPods()
    listed = claim_pod()
    pods.pods_listed([listed, pod("plain", namespace="default", uid=OTHER, node_name="n1")])
    assert pods.pod("default", "p", UID) is listed
    assert pods.pod("default", "p", OTHER) is None  # reservedFor names another pod of that name
    assert pods.pod("default", "q", UID) is None  # not in the watch
    assert pods.pod("other", "p", UID) is None
    assert pods.pod("default", "plain", OTHER) is None  # names no claim: not kept


def test_nothing_is_answered_before_the_first_list_nor_after_the_watch_stopped() -> None:
    pods = WatchedPods()
    pods.pod_event("ADDED", claim_pod())
    assert not pods.synced and pods.pod("default", "p", UID) is None
    pods.pods_listed([claim_pod()])
    assert pods.synced and pods.pod("default", "p", UID) is not None
    pods.forget()
    assert not pods.synced and pods.pod("default", "p", UID) is None


def test_nothing_is_answered_while_the_watch_is_failing() -> None:
    failing = [True]
    pods = WatchedPods(healthy=lambda: not failing[0])
    pods.pods_listed([claim_pod()])
    assert pods.pod("default", "p", UID) is None
    failing[0] = False
    assert pods.pod("default", "p", UID) is not None


def test_a_pod_whose_template_claim_has_no_generated_name_yet_is_not_answered() -> None:
    pods = WatchedPods()
    pods.pods_listed([claim_pod(resolved=False)])
    assert pods.pod("default", "p", UID) is None
    pods.pod_event("MODIFIED", claim_pod())  # the claim controller wrote the status
    assert pods.pod("default", "p", UID) is not None
    assert not claim_names_resolved(claim_pod(resolved=False)) and claim_names_resolved(claim_pod())
    direct = pod("d", namespace="default", resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}])
    assert claim_names_resolved(direct)  # a claim named in the spec needs no status


def test_events_add_replace_and_delete_by_name_and_a_late_delete_of_an_older_pod_keeps_the_new_one() -> None:
    pods = WatchedPods()
    pods.pods_listed([])
    pods.pod_event("ADDED", claim_pod(OTHER))
    assert pods.pod("default", "p", OTHER) is not None
    pods.pod_event("ADDED", claim_pod(UID))  # recreated under the same name
    assert pods.pod("default", "p", OTHER) is None and pods.pod("default", "p", UID) is not None
    pods.pod_event("DELETED", claim_pod(OTHER))
    assert pods.pod("default", "p", UID) is not None
    pods.pod_event("DELETED", claim_pod(UID))
    assert pods.pod("default", "p", UID) is None
    pods.pod_event("ADDED", claim_pod(UID))
    pods.pods_listed([])  # a relist without it: gone
    assert pods.pod("default", "p", UID) is None
