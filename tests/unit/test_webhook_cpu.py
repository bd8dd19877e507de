"""The fragmentation component's `cpu.hami.io` entry in hami-control (`POST /webhook/cpu`):
`webhook.review_cpu_pod` and its envelope `handle_cpu_admission_review`.

Under the component's settings (node policy fragmentation, `--fragmentation-filter one`) a pod that asks
no GPU gets `spec.schedulerName: hami-scheduler` (add, or replace `default-scheduler`), so the second
extender entry places it; everything else is allowed untouched: a pod under other settings, in kube-system
or hami-control's namespace, asking a GPU, a vendor's device or ResourceClaims, bound, a DaemonSet's, or
naming another scheduler. Nothing is ever denied, whatever the pod (a property)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.types import NodePolicy
from hami_control.config import (
    ControlConfig,
    ElectionSettings,
    FragmentationFilter,
    KubeSettings,
    SchedulingSettings,
    ServerSettings,
    WebhookSettings,
)
from hami_control.webhook import (
    CPU_WEBHOOK_PATH,
    handle_cpu_admission_review,
    review_cpu_pod,
    steers_cpu_only,
)
from hami_sim.apiserver.patch import json_patch
from tests.builders import admission_review, as_body, container, pod

INSTALL = ControlConfig(
    server=ServerSettings(insecure_http=True),
    scheduling=SchedulingSettings(
        node_policy=NodePolicy.FRAGMENTATION, fragmentation_filter=FragmentationFilter.ONE
    ),
)
DEFAULTS = ControlConfig(server=ServerSettings(insecure_http=True))
HAMI = "hami-scheduler"


def steered(obj: dict[str, Any], config: ControlConfig = INSTALL, namespace: str = "default") -> str | None:
    """The schedulerName the pod has after the entry (None: none), checking the decision allows it."""
    decision = review_cpu_pod(obj, "CREATE", config, namespace)
    assert decision.allowed and decision.code == 200
    after = json_patch(obj, list(decision.patch)) if decision.patch else obj
    name: str | None = after["spec"].get("schedulerName")
    return name


def test_the_route_is_the_component_s() -> None:
    assert CPU_WEBHOOK_PATH == "/webhook/cpu"


def test_only_the_component_s_settings_steer() -> None:
    assert steers_cpu_only(INSTALL)
    assert not steers_cpu_only(DEFAULTS)
    for node_policy, filter_ in (
        (NodePolicy.FRAGMENTATION, FragmentationFilter.BEST),
        (NodePolicy.FRAGMENTATION, FragmentationFilter.ALL),
        (NodePolicy.BINPACK, FragmentationFilter.ONE),
    ):
        config = replace(
            INSTALL, scheduling=SchedulingSettings(node_policy=node_policy, fragmentation_filter=filter_)
        )
        assert not steers_cpu_only(config)
        assert steered(pod("p", container(requests={"cpu": "1"})), config) is None


def test_a_cpu_only_pod_without_a_scheduler_gets_hami_scheduler() -> None:
    assert steered(pod("p", container(requests={"cpu": "2", "memory": "1Gi"}))) == HAMI
    assert steered(pod("p", container())) == HAMI  # no resources at all


def test_default_scheduler_is_replaced_as_the_api_server_defaults_it_before_admission() -> None:
    obj = pod("p", container(requests={"cpu": "1"}), scheduler_name="default-scheduler")
    decision = review_cpu_pod(obj, "CREATE", INSTALL, "default")
    assert decision.patch == ({"op": "replace", "path": "/spec/schedulerName", "value": HAMI},)
    # Unless the install keeps default-scheduler pods (as for GPU pods).
    keep = replace(INSTALL, webhook=WebhookSettings(force_overwrite_default_scheduler=False))
    assert steered(obj, keep) == "default-scheduler"


def test_another_scheduler_or_hami_scheduler_already_named_is_left_alone() -> None:
    assert steered(pod("p", container(), scheduler_name="volcano")) == "volcano"
    decision = review_cpu_pod(pod("p", container(), scheduler_name=HAMI), "CREATE", INSTALL, "default")
    assert decision.allowed and not decision.patch


def test_gpu_vendor_and_claim_pods_are_left_to_their_entry() -> None:
    for obj in (
        pod("p", container(gpus=1)),
        pod("p", container(gpumem=3000)),
        pod("p", container(), init=[container("i", gpucores=20)]),
        pod("p", container(requests={"nvidia.com/gpumem-percentage": "50"})),
        pod("p", container(), resourceClaims=[{"name": "c", "resourceClaimTemplateName": "t"}]),
    ):
        assert steered(obj) is None, obj
    vendors = INSTALL.registry.others
    if vendors:
        resource = vendors[0].names.resources[0]
        assert steered(pod("p", container(limits={resource: "1"}))) is None


def test_kube_system_and_hami_control_s_namespace_are_never_steered() -> None:
    obj = pod("p", container(requests={"cpu": "1"}))
    assert steered(obj, namespace="kube-system") is None
    assert steered(obj, namespace="hami-system") is None  # the election namespace's default
    own = replace(
        INSTALL,
        kube=KubeSettings(pod_namespace="gpu-ops"),
        election=ElectionSettings(namespace="gpu-ops"),
    )
    assert steered(obj, own, namespace="gpu-ops") is None
    assert steered(obj, own, namespace="hami-system") == HAMI


def test_bound_and_daemonset_pods_are_not_steered() -> None:
    assert steered(pod("p", container(), node_name="n1")) is None
    owned = pod("p", container())
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}
    ]
    assert steered(owned) is None
    owned["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    assert steered(owned) == HAMI


def test_only_create_is_steered() -> None:
    decision = review_cpu_pod(pod("p", container()), "UPDATE", INSTALL, "default")
    assert decision.allowed and not decision.patch


def answer(body: bytes, config: ControlConfig = INSTALL) -> tuple[int, dict[str, Any]]:
    result = handle_cpu_admission_review(body, config)
    return result.status, result.body


def test_the_envelope_answers_a_json_patch_with_the_request_uid() -> None:
    review = admission_review(pod("p", container(requests={"cpu": "1"})), namespace="default")
    status, body = answer(as_body(review))
    assert status == 200
    response = body["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        review["request"]["uid"],
        True,
        "JSONPatch",
    )
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": HAMI}
    ]
    # Not the install: allowed, no patch.
    status, body = answer(as_body(review), DEFAULTS)
    assert status == 200 and body["response"] == {"uid": review["request"]["uid"], "allowed": True}


def test_the_envelope_refuses_what_is_not_a_review_like_the_gpu_entry() -> None:
    assert answer(b"not json")[0] == 400
    assert answer(as_body({"kind": "AdmissionReview"}))[0] == 400
    small = replace(INSTALL, server=ServerSettings(insecure_http=True, max_request_body=10))
    assert answer(as_body(admission_review(pod())), small)[0] == 413


def test_a_pod_that_breaks_the_rules_is_allowed_untouched() -> None:
    # A spec whose containers are not a list: no exception reaches the client, nothing is denied.
    broken = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": 7}}
    status, body = answer(as_body(admission_review(broken, namespace="default")))
    assert status == 200 and body["response"]["allowed"] is True


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    spec=st.dictionaries(
        st.sampled_from(["containers", "initContainers", "schedulerName", "nodeName", "resourceClaims"]),
        JSON,
    ),
    metadata=st.dictionaries(st.sampled_from(["name", "namespace", "ownerReferences", "labels"]), JSON),
)
def test_any_pod_is_allowed_and_at_most_its_scheduler_name_changes(
    spec: dict[str, Any], metadata: dict[str, Any]
) -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    status, body = answer(as_body(admission_review(obj, namespace="default")))
    assert status == 200 and body["response"]["allowed"] is True
    if "patch" in body["response"]:
        (op,) = json.loads(base64.b64decode(body["response"]["patch"]))
        assert (op["path"], op["value"]) == ("/spec/schedulerName", HAMI)
