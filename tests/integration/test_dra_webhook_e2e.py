"""End to end: `hami-control --dra-translation namespace` as a real process serving TLS, registered with the
local API server (resource.k8s.io/v1) the way daemonset/overlays/dra registers it: two webhook entries,
the namespaces labelled hami.io/dra=enabled sent to /webhook/dra and the others to /webhook. Pods created
through the official client in a labelled namespace come out using claims from templates the webhook
created (one per ask, shared), the claim controller stand-in makes their claims and deletes them with
their pods (nothing per pod is left), quota denials reach the client as for device-plugin pods, dry runs
create nothing, and other namespaces keep the device-plugin path."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException

from hami_control.dra_translate import ANNOTATION, decode_claims
from hami_kube.client import KubeApi
from hami_sim.controllers.resourceclaim import ResourceClaimController
from tests.builders import gpu_pod, resource_quota
from tests.conftest import ApiServerHandle
from tests.control_process_util import ControlProcess, raw_pod, start_control
from tests.control_server_util import LoopThread
from tests.waiting import wait_for

DRA_LABEL = {"hami.io/dra": "enabled"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def control(tmp_path: Path, apiserver: ApiServerHandle) -> Iterator[ControlProcess]:
    control = start_control(
        tmp_path, apiserver.kubeconfig, "--dra-translation", "namespace", "--dra-gpu-memory", "Tesla T4=15360"
    )
    try:
        yield control
    finally:
        code = control.stop()
        print(control.log())
        assert code == 0, "hami-control did not stop cleanly on SIGTERM"


def webhook(name: str, url: str, ca: bytes, selector: client.V1LabelSelector, side_effects: str) -> Any:
    return client.V1MutatingWebhook(
        name=name,
        admission_review_versions=["v1"],
        side_effects=side_effects,
        failure_policy="Fail",
        timeout_seconds=10,
        namespace_selector=selector,
        client_config=client.AdmissionregistrationV1WebhookClientConfig(
            url=url, ca_bundle=base64.b64encode(ca).decode()
        ),
        rules=[
            client.V1RuleWithOperations(
                operations=["CREATE"], api_groups=[""], api_versions=["v1"], resources=["pods"]
            )
        ],
    )


def register(api_client: client.ApiClient, control: ControlProcess) -> None:
    """The two entries of daemonset/overlays/dra: exclusive namespace selectors."""
    not_dra = client.V1LabelSelector(
        match_expressions=[
            client.V1LabelSelectorRequirement(key="hami.io/dra", operator="NotIn", values=["enabled"])
        ]
    )
    dra = client.V1LabelSelector(match_labels=DRA_LABEL)
    client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name="hami-webhook"),
            webhooks=[
                webhook("vgpu.hami.io", control.url("/webhook"), control.ca.cert, not_dra, "None"),
                webhook(
                    "dra.vgpu.hami.io", control.url("/webhook/dra"), control.ca.cert, dra, "NoneOnDryRun"
                ),
            ],
        )
    )


def namespace(core_v1: Any, name: str, labels: dict[str, str] | None = None) -> None:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))


def templates(api_client: client.ApiClient, ns: str) -> list[str]:
    items = client.ResourceV1Api(api_client).list_namespaced_resource_claim_template(ns).items
    return sorted(t.metadata.name for t in items)


def test_pods_of_a_labelled_namespace_use_claims_from_shared_templates(
    control: ControlProcess, apiserver: ApiServerHandle, api_client: client.ApiClient, core_v1: Any
) -> None:
    namespace(core_v1, "ml", DRA_LABEL)
    namespace(core_v1, "plain")
    register(api_client, control)

    core_v1.create_namespaced_pod("ml", gpu_pod("infer-1", gpumem=4000, gpucores=30))
    stored = raw_pod(core_v1, "ml", "infer-1")
    main = stored["spec"]["containers"][0]
    assert main["resources"] == {"claims": [{"name": "gpu-main"}]}
    assert stored["spec"]["resourceClaims"] == [
        {"name": "gpu-main", "resourceClaimTemplateName": "hami-gpu-1x-4000mi-30c"}
    ]
    assert stored["spec"]["schedulerName"] == "hami-scheduler"
    (entry,) = decode_claims(stored["metadata"]["annotations"][ANNOTATION])
    assert (entry.gpus, entry.memory, entry.cores) == (1, 4000, 30)
    template = client.ResourceV1Api(api_client).read_namespaced_resource_claim_template(
        "hami-gpu-1x-4000mi-30c", "ml"
    )
    assert template.spec.spec.devices.requests[0].exactly.capacity.requests == {
        "memory": "4000Mi",
        "cores": "30",
    }

    # The same ask reuses the template; another ask (a percentage of the one T4 model) gets its own.
    core_v1.create_namespaced_pod("ml", gpu_pod("infer-2", gpumem=4000, gpucores=30))
    core_v1.create_namespaced_pod(
        "ml", gpu_pod("notebook", gpumem_percentage=50, annotations={"nvidia.com/use-gputype": "T4"})
    )
    shared, percentage = templates(api_client, "ml")
    assert shared == "hami-gpu-1x-4000mi-30c"
    assert percentage.startswith("hami-gpu-1x-7680mi-0c-")  # 50 % of 15360 MiB, with the model's selector
    assert apiserver.runner.counters()[("create", "resourceclaimtemplates", "")] == 2

    # Another namespace keeps the device-plugin path.
    core_v1.create_namespaced_pod("plain", gpu_pod("classic", gpumem=4000))
    classic = raw_pod(core_v1, "plain", "classic")
    assert classic["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "resourceClaims" not in classic["spec"]
    assert templates(api_client, "plain") == []
    log = control.log()
    assert "pod=ml/infer-1" in log and "translated to DRA: hami-gpu-1x-4000mi-30c" in log


def test_claims_come_from_the_templates_and_go_with_their_pods(
    control: ControlProcess, apiserver: ApiServerHandle, api_client: client.ApiClient, core_v1: Any
) -> None:
    namespace(core_v1, "ml", DRA_LABEL)
    register(api_client, control)
    loop = LoopThread()
    api = loop.call(lambda: KubeApi.connect(apiserver.kubeconfig))
    controller = ResourceClaimController(api)
    loop.call(controller.start)
    try:
        resource_v1 = client.ResourceV1Api(api_client)
        for name in ("a", "b"):
            core_v1.create_namespaced_pod("ml", gpu_pod(name, gpus=2, gpumem=8000, gpucores=50))

        def claims() -> list[Any]:
            return list(resource_v1.list_namespaced_resource_claim("ml").items)

        wait_for(lambda: len(claims()) == 2, 10, "a claim per pod from the shared template")
        claim = claims()[0]
        assert claim.spec.devices.requests[0].exactly.count == 2
        assert claim.spec.devices.constraints[0].distinct_attribute == "hami-core-gpu.project-hami.io/uuid"
        assert claim.metadata.owner_references[0].kind == "Pod"
        for name in ("a", "b"):
            core_v1.delete_namespaced_pod(name, "ml")
        wait_for(lambda: claims() == [], 10, "the pods' claims to go with them")
        assert templates(api_client, "ml") == ["hami-gpu-2x-8000mi-50c"]  # one per ask, not per pod
    finally:
        loop.call(controller.stop)
        loop.call(api.close)
        loop.close()


def test_the_second_translated_pod_over_the_quota_is_refused_with_403(
    control: ControlProcess, api_client: client.ApiClient, core_v1: Any
) -> None:
    namespace(core_v1, "ml", DRA_LABEL)
    core_v1.create_namespaced_resource_quota("ml", resource_quota({"limits.nvidia.com/gpumem": "6000"}))
    register(api_client, control)

    def refused() -> bool:
        try:
            core_v1.create_namespaced_pod("ml", gpu_pod("probe", gpumem=999999))
        except ApiException as err:
            return err.status == 403
        core_v1.delete_namespaced_pod("probe", "ml")
        return False

    wait_for(refused, 10, "the quota of ml to be enforced")
    core_v1.create_namespaced_pod("ml", gpu_pod("first", gpumem=4000))
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("ml", gpu_pod("second", gpumem=4000))
    assert err.value.status == 403
    assert (
        "namespace ml: GPU memory quota exceeded (used 4000 / limit 6000 MiB, this pod asks 4000)"
        in json.loads(err.value.body)["message"]
    )


def test_a_dry_run_creates_no_template_and_a_percentage_without_a_model_is_refused(
    control: ControlProcess, api_client: client.ApiClient, core_v1: Any
) -> None:
    namespace(core_v1, "ml", DRA_LABEL)
    register(api_client, control)
    core_v1.create_namespaced_pod("ml", gpu_pod("dry", gpumem=1234), dry_run="All")
    assert templates(api_client, "ml") == []
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("ml", gpu_pod("pct", gpumem_percentage=50))
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert "container 'main': nvidia.com/gpumem-percentage 50 cannot be translated to a DRA claim" in message
    assert "Write nvidia.com/gpumem: <MiB per GPU> instead" in message
    assert "(hami-control knows Tesla T4 15360 MiB)" in message


def test_the_dra_examples_and_device_class_are_accepted_and_the_translated_example_translated(
    control: ControlProcess, api_client: client.ApiClient, core_v1: Any
) -> None:
    """What a user applies from examples/dra, after daemonset/overlays/dra's DeviceClass."""
    register(api_client, control)
    resource_v1 = client.ResourceV1Api(api_client)
    files = [REPO / "daemonset" / "overlays" / "dra" / "deviceclass.yaml"]
    files += sorted((REPO / "examples" / "dra").glob("*.yaml"))
    for doc in (d for path in files for d in yaml.safe_load_all(path.read_text())):
        kind, ns = doc["kind"], doc["metadata"].get("namespace")
        if kind == "Namespace":
            core_v1.create_namespace(doc)
        elif kind == "DeviceClass":
            resource_v1.create_device_class(doc)
        elif kind == "ResourceClaimTemplate":
            resource_v1.create_namespaced_resource_claim_template(ns, doc)
        else:
            assert kind == "Pod", kind
            core_v1.create_namespaced_pod(ns, doc)
    slice_pod = raw_pod(core_v1, "dra-demo", "inference-slice")
    assert slice_pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "gpu-4000mi-30c"}
    ]
    assert ANNOTATION not in (slice_pod["metadata"].get("annotations") or {})  # its own claims: not sent
    translated = raw_pod(core_v1, "dra-demo", "inference-translated")
    assert translated["spec"]["resourceClaims"] == [
        {"name": "gpu-server", "resourceClaimTemplateName": "hami-gpu-1x-4000mi-30c"}
    ]
    assert "hami-gpu-1x-4000mi-30c" in templates(api_client, "dra-demo")
