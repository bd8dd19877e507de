"""Pods translated to DRA in hami-control's caches: the quota counts them from `hami.io/dra-claims` (and
denies the second translated pod exactly as it denies the second device-plugin pod, before and after the
watch shows the first), the annotation can never lower what a pod's HAMi resources count, the extender
passes them through, and the GPU cache never counts them (their claims are kube-scheduler's)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from hami_control.admission import admission_handler
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, DRATranslation, ServerSettings
from hami_control.dra_templates import TemplateKeeper, TemplateStore
from hami_control.dra_translate import ANNOTATION, ClaimRecord, GPUClaim, encode_claims
from hami_control.extender import filter_pod, read_pod_ask
from hami_control.pod_store import PodStore, pod_record
from hami_control.quota import QuotaUsage
from hami_control.quota_store import ClusterQuotaView, QuotaCache
from hami_control.server import WebhookAnswer
from hami_kube.client import JSONDict
from hami_sim.apiserver.patch import json_patch
from tests.builders import admission_review, as_body, gpu_info, gpu_pod, node, resource_quota

CONFIG = ControlConfig(server=ServerSettings(insecure_http=True)).with_settings(
    dra_translation=DRATranslation.NAMESPACE
)
NAMESPACE = "team"


class NoCalls:
    """The API of a keeper whose templates all exist: any call is a test failure."""

    async def request(
        self, method: str, path: str, body: object = None, *, timeout_s: float | None = None
    ) -> JSONDict:
        raise AssertionError(f"unexpected {method} {path}")


class Cluster:
    """The webhook's stores as hami-control wires them (pods, ResourceQuotas, templates), fed by hand."""

    def __init__(self, gpumem_limit: str) -> None:
        self.gpus = ClusterCache(CONFIG.requests.names)
        self.pods = PodStore(CONFIG, self.gpus)
        self.quotas = QuotaCache(CONFIG)
        self.quotas.replace([resource_quota({"limits.nvidia.com/gpumem": gpumem_limit}, namespace=NAMESPACE)])
        self.view = ClusterQuotaView(self.pods, self.quotas)
        self.templates = TemplateStore()
        keeper = TemplateKeeper(NoCalls(), self.templates, timeout_s=1)
        self.plain = admission_handler(CONFIG, self.view)
        self.dra = admission_handler(CONFIG, self.view, dra_route=True, templates=keeper)
        self.created = 0

    def submit(self, obj: dict[str, Any], *, dra: bool) -> tuple[bool, str, dict[str, Any]]:
        """Review `obj`; (allowed, denial message, the pod as the API server would store it)."""
        for template in GPUClaim(1, 4000, 0), GPUClaim(1, 4000, 30):  # they exist already
            self.templates.apply("ADDED", template.template(NAMESPACE))
        answer = (self.dra if dra else self.plain)(as_body(admission_review(obj, namespace=NAMESPACE)))
        assert isinstance(answer, WebhookAnswer)
        response = answer.body["response"]  # type: ignore[index]
        if not response["allowed"]:
            return False, response["status"]["message"], obj
        ops = json.loads(base64.b64decode(response.get("patch", "W10=")))
        self.created += 1
        stored = json_patch(obj, ops)
        stored["metadata"]["uid"] = f"uid-{self.created}"
        return True, "", stored

    def watch_shows(self, stored: dict[str, Any], phase: str = "Pending") -> None:
        self.pods.apply("ADDED", {**stored, "status": {"phase": phase}})


@pytest.mark.parametrize("dra", [False, True], ids=["device plugin", "translated"])
@pytest.mark.parametrize("watched", [False, True], ids=["assumed", "watched"])
def test_the_second_translated_pod_is_denied_as_the_second_device_plugin_pod(
    dra: bool, watched: bool
) -> None:
    cluster = Cluster("6000")
    allowed, _, first = cluster.submit(gpu_pod("first", gpumem=4000, namespace=NAMESPACE), dra=dra)
    assert allowed
    if dra:
        assert ANNOTATION in first["metadata"]["annotations"]
        assert "nvidia.com/gpumem" not in json.dumps(first["spec"])
    if watched:
        cluster.watch_shows(first)
        assert cluster.pods.admitted(NAMESPACE) == 0  # the watch replaced the assumption: counted once
    assert cluster.pods.used(NAMESPACE) == QuotaUsage(4000, 0)
    allowed, message, _ = cluster.submit(gpu_pod("second", gpumem=4000, namespace=NAMESPACE), dra=dra)
    assert not allowed
    assert (
        message
        == "namespace team: GPU memory quota exceeded (used 4000 / limit 6000 MiB, this pod asks 4000)"
    )
    # Once the first pod has finished, the second fits.
    cluster.watch_shows(first, phase="Succeeded")
    assert cluster.submit(gpu_pod("second", gpumem=4000, namespace=NAMESPACE), dra=dra)[0]


def test_translated_and_device_plugin_pods_share_one_quota() -> None:
    cluster = Cluster("10000")
    _, _, translated = cluster.submit(gpu_pod("a", gpumem=4000, gpucores=30, namespace=NAMESPACE), dra=True)
    cluster.watch_shows(translated, phase="Running")
    _, _, plain = cluster.submit(gpu_pod("b", gpumem=4000, gpucores=30, namespace=NAMESPACE), dra=False)
    cluster.watch_shows(plain, phase="Running")
    assert cluster.pods.used(NAMESPACE) == QuotaUsage(8000, 60)
    assert not cluster.submit(gpu_pod("c", gpumem=4000, namespace=NAMESPACE), dra=True)[0]
    cluster.pods.apply("DELETED", translated)
    assert cluster.pods.used(NAMESPACE) == QuotaUsage(4000, 30)


def test_a_dry_run_neither_assumes_nor_needs_templates() -> None:
    cluster = Cluster("6000")
    keeper = TemplateKeeper(NoCalls(), TemplateStore(), timeout_s=1)  # knows no template; must not call
    admit = admission_handler(CONFIG, cluster.view, dra_route=True, templates=keeper)
    body = as_body(
        admission_review(gpu_pod("dry", gpumem=4000, namespace=NAMESPACE), namespace=NAMESPACE, dry_run=True)
    )
    answer = admit(body)
    assert isinstance(answer, WebhookAnswer)
    assert answer.body["response"]["allowed"]  # type: ignore[index]
    assert cluster.pods.admitted(NAMESPACE) == 0


# --- the pod store ------------------------------------------------------------------------------------------


def translated_pod(records: str, *, phase: str = "Running", **limits: Any) -> dict[str, Any]:
    obj = gpu_pod("t", gpus=limits.pop("gpus", None), namespace=NAMESPACE, uid="u1", phase=phase,
                  annotations={ANNOTATION: records}, node_name="n1", **limits)  # fmt: skip
    obj["spec"]["resourceClaims"] = [
        {"name": "gpu-main", "resourceClaimTemplateName": "hami-gpu-1x-4000mi-30c"}
    ]
    return obj


RECORDS = encode_claims(
    [ClaimRecord("i", "gpu-i", "t1", 1, 1000, 10), ClaimRecord("main", "gpu-main", "t2", 2, 4000, 30)]
)


def test_a_translated_pod_counts_every_claim_of_its_annotation() -> None:
    record = pod_record(translated_pod(RECORDS), CONFIG)
    assert record.usage == QuotaUsage(1000 + 8000, 10 + 60)
    assert not record.asks_gpu and record.held is None
    assert pod_record(translated_pod(RECORDS, phase="Failed"), CONFIG).usage == QuotaUsage()


def test_the_annotation_never_lowers_what_hami_resources_count() -> None:
    small = encode_claims([ClaimRecord("main", "gpu-main", "t", 1, 1, 0)])
    record = pod_record(translated_pod(small, gpus=1, gpumem=20000), CONFIG)
    assert record.usage == QuotaUsage(20000, 0)


@pytest.mark.parametrize("text", ["{", "[]x", '[{"container": "main"}]'])
def test_an_annotation_that_does_not_decode_counts_nothing(text: str) -> None:
    assert pod_record(translated_pod(text), CONFIG).usage == QuotaUsage()


# --- the extender and the GPU cache ------------------------------------------------------------------------


def test_the_extender_passes_a_translated_pod_through_and_the_gpu_cache_does_not_count_it() -> None:
    gpus = ClusterCache(CONFIG.requests.names)
    store = PodStore(CONFIG, gpus)
    gpus.node_upserted(node("n1", [gpu_info(0)]))
    obj = translated_pod(RECORDS)
    assert read_pod_ask(obj, CONFIG) is None
    result = filter_pod({"Pod": obj, "NodeNames": ["n1", "dra-node"]}, gpus, CONFIG)
    assert result["NodeNames"] == ["n1", "dra-node"] and not result["FailedNodes"]
    before = gpus.node_usage("n1")
    store.apply("ADDED", obj)  # bound to n1 and running: its claims are not the extender's slices
    assert list(gpus.holdings()) == []
    assert gpus.node_usage("n1") == before
    assert store.used(NAMESPACE) == QuotaUsage(9000, 70)
