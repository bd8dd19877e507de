"""hami_control.dra_templates against the local API server (resource.k8s.io/v1): a translated pod's
templates are created once and shared by concurrent admissions, 409 AlreadyExists counts when the
template is the expected one, someone else's template or one an API server without consumable
capacity stripped is refused with what differs, the watch forgets deleted templates so they are
created again, and an API server that does not answer is given up on within the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from hami_control.admission import admission_handler
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, DRATranslation, ServerSettings
from hami_control.dra_templates import TEMPLATES_PATH, TemplateError, TemplateKeeper, TemplateStore
from hami_control.dra_translate import TEMPLATE_SELECTOR, GPUClaim
from hami_control.pod_store import PodStore
from hami_control.quota_store import ClusterQuotaView
from hami_control.server import WebhookAnswer
from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi
from hami_kube.reflector import Reflector
from hami_sim.apiserver.resource_v1 import FeatureGates
from hami_sim.apiserver.runner import ApiServerRunner
from tests.builders import admission_review, as_body, gpu_pod
from tests.conftest import ApiServerHandle
from tests.control_server_util import LoopThread
from tests.waiting import wait_for

SHARED = GPUClaim(1, 4000, 30)
TWO = GPUClaim(2, 10000, 50)


@dataclass
class Rig:
    runner: ApiServerRunner
    loop: LoopThread
    api: KubeApi
    resource_v1: client.ResourceV1Api

    def keeper(self, store: TemplateStore | None = None, timeout_s: float = 5.0) -> TemplateKeeper:
        return TemplateKeeper(self.api, store, timeout_s=timeout_s)

    def ensure(self, keeper: TemplateKeeper, namespace: str, *claims: GPUClaim) -> None:
        self.loop.call(lambda: keeper.ensure(namespace, claims))

    def creates(self) -> int:
        return self.runner.counters().get(("create", "resourceclaimtemplates", ""), 0)

    def names(self, namespace: str) -> list[str]:
        items = self.resource_v1.list_namespaced_resource_claim_template(namespace).items
        return sorted(t.metadata.name for t in items)


@contextlib.contextmanager
def rig_for(runner: ApiServerRunner, kubeconfig: Path) -> Iterator[Rig]:
    loop = LoopThread()
    api = loop.call(lambda: KubeApi.connect(kubeconfig))
    try:
        with client.ApiClient(client.Configuration(host=runner.base_url)) as api_client:
            core = client.CoreV1Api(api_client)
            for name in ("team", "other"):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
            yield Rig(runner, loop, api, client.ResourceV1Api(api_client))
    finally:
        loop.call(api.close)
        loop.close()


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[Rig]:
    with rig_for(apiserver.runner, apiserver.kubeconfig) as made:
        yield made


def test_templates_are_created_once_and_shared_by_concurrent_admissions(rig: Rig) -> None:
    keeper = rig.keeper()

    async def burst() -> None:
        await asyncio.gather(*(keeper.ensure("team", [SHARED, TWO]) for _ in range(10)))

    rig.loop.call(burst)
    assert rig.creates() == 2 and keeper.created == 2
    assert rig.names("team") == sorted([TWO.template_name, SHARED.template_name])
    stored = rig.resource_v1.read_namespaced_resource_claim_template(SHARED.template_name, "team")
    assert stored.metadata.labels["app.kubernetes.io/managed-by"] == "hami-control"
    assert stored.spec.spec.devices.requests[0].exactly.capacity.requests == {
        "memory": "4000Mi",
        "cores": "30",
    }
    # Known now: no more calls; another namespace gets its own.
    rig.ensure(keeper, "team", SHARED)
    rig.ensure(keeper, "other", SHARED)
    assert rig.creates() == 3
    assert rig.names("other") == [SHARED.template_name]


def test_an_identical_template_made_by_someone_else_is_used(rig: Rig) -> None:
    template = SHARED.template("team")
    del template["metadata"]["labels"]
    rig.resource_v1.create_namespaced_resource_claim_template("team", template)
    keeper = rig.keeper()
    rig.ensure(keeper, "team", SHARED)  # 409, then a GET shows the expected spec
    assert keeper.created == 0


def test_someone_elses_template_of_that_name_is_refused(rig: Rig) -> None:
    greedy = GPUClaim(4, None, 100).template("team")
    greedy["metadata"]["name"] = SHARED.template_name
    rig.resource_v1.create_namespaced_resource_claim_template("team", greedy)
    with pytest.raises(TemplateError) as err:
        rig.ensure(rig.keeper(), "team", SHARED)
    assert err.value.code == 403
    name = SHARED.template_name
    assert str(err.value) == (
        f"the ResourceClaimTemplate team/{name} that this pod's translation to DRA uses is not the one "
        "hami-control writes: spec.spec.devices.requests[0].exactly.count is 4, not 1. Delete it "
        f"(kubectl delete resourceclaimtemplate -n team {name}) and hami-control creates it again"
    )


def test_the_watch_forgets_a_deleted_template_so_it_is_created_again(rig: Rig) -> None:
    store = TemplateStore()
    reflector = Reflector(
        rig.api, "resourceclaimtemplates", TEMPLATES_PATH, store,
        retry=RetryPolicy(initial=0.01, maximum=0.05), params={"labelSelector": TEMPLATE_SELECTOR},
    )  # fmt: skip
    task = rig.loop.submit(reflector.run())
    try:
        keeper = rig.keeper(store)
        rig.ensure(keeper, "team", SHARED)
        wait_for(
            lambda: rig.loop.run_sync(lambda: store.spec(("team", SHARED.template_name))), 10, "the watch"
        )
        rig.ensure(keeper, "team", SHARED)
        assert rig.creates() == 1
        rig.resource_v1.delete_namespaced_resource_claim_template(SHARED.template_name, "team")
        wait_for(
            lambda: rig.loop.run_sync(lambda: store.spec(("team", SHARED.template_name)) is None),
            10,
            "DELETED",
        )
        rig.ensure(keeper, "team", SHARED)
        assert rig.creates() == 2
        assert rig.names("team") == [SHARED.template_name]
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            task.result(10)


def test_a_template_the_watch_shows_with_another_spec_is_refused_without_a_call(rig: Rig) -> None:
    store = TemplateStore()
    stripped = SHARED.template("team")
    del stripped["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    rig.loop.run_sync(lambda: store.apply("ADDED", stripped))
    with pytest.raises(TemplateError) as err:
        rig.ensure(rig.keeper(store), "team", SHARED)
    assert "exactly.capacity is missing: the API server dropped it" in str(err.value)
    assert rig.creates() == 0


def test_without_consumable_capacity_the_stripped_template_is_refused(tmp_path: Path) -> None:
    gates = FeatureGates.parse("DRAConsumableCapacity=false")
    with ApiServerRunner(feature_gates=gates) as runner, rig_for(
        runner, runner.write_kubeconfig(tmp_path / "kubeconfig")
    ) as gated:  # fmt: skip
        with pytest.raises(TemplateError) as err:
            gated.ensure(gated.keeper(), "team", SHARED)
        assert err.value.code == 403
        assert str(err.value).startswith(
            f"the ResourceClaimTemplate team/{SHARED.template_name} that this pod's translation to DRA uses "
            "is not the one hami-control writes: spec.spec.devices.requests[0].exactly.capacity is missing: "
            "the API server dropped it, so it does not serve consumable capacity"
        )
        assert "Delete it" not in str(err.value)
        with pytest.raises(TemplateError) as err:  # distinctAttribute dropped: the server refuses the rest
            gated.ensure(gated.keeper(), "team", TWO)
        assert err.value.code == 500 and "422" in str(err.value)


def test_an_api_server_that_does_not_answer_is_given_up_on_within_the_deadline(rig: Rig) -> None:
    connections: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    async def start() -> asyncio.Server:
        return await asyncio.start_server(hold, "127.0.0.1", 0)

    server = rig.loop.call(start)
    port = server.sockets[0].getsockname()[1]
    silent = rig.loop.call(lambda: _client(f"http://127.0.0.1:{port}"))
    try:
        keeper = TemplateKeeper(silent, None, timeout_s=0.3)
        with pytest.raises(TemplateError) as err:
            rig.loop.call(lambda: keeper.ensure("team", [SHARED]))
        assert err.value.code == 500
        assert str(err.value) == (
            f"hami-control could not create the ResourceClaimTemplates {SHARED.template_name} in namespace "
            "team within 0.3 s; try again"
        )
        rig.loop.call(keeper.stop)
    finally:
        rig.loop.call(silent.close)

        async def close() -> None:
            for writer in connections:
                writer.close()
            server.close()
            await server.wait_closed()

        rig.loop.call(close)


async def _client(url: str) -> KubeApi:
    return KubeApi(url, None, qps=0)


def test_a_pod_whose_templates_cannot_be_had_is_denied_and_its_quota_usage_withdrawn(tmp_path: Path) -> None:
    """Through the webhook's handler: the review admits and assumes the pod's usage at once; the
    template then turns out stripped (no consumable capacity), so the answer is a denial naming why, and
    the assumed usage is given back."""
    gates = FeatureGates.parse("DRAConsumableCapacity=false")
    config = ControlConfig(server=ServerSettings(insecure_http=True)).with_settings(
        dra_translation=DRATranslation.NAMESPACE
    )
    with ApiServerRunner(feature_gates=gates) as runner, rig_for(
        runner, runner.write_kubeconfig(tmp_path / "kubeconfig")
    ) as gated:  # fmt: skip
        pods = PodStore(config, ClusterCache(config.requests.names))
        view = ClusterQuotaView(pods, None)
        admit = admission_handler(config, view, dra_route=True, templates=gated.keeper())
        body = as_body(admission_review(gpu_pod("p", gpumem=4000), namespace="team"))

        async def review() -> WebhookAnswer:
            answer = admit(body)
            assert inspect.isawaitable(answer)  # it had to create a template
            result: WebhookAnswer = await answer
            return result

        answer = gated.loop.call(review)
        response = answer.body["response"]  # type: ignore[index]
        assert not response["allowed"]
        assert response["status"]["code"] == 403
        assert "exactly.capacity is missing: the API server dropped it" in response["status"]["message"]
        assert answer.log_fields["allowed"] is False
        assert gated.loop.run_sync(lambda: pods.admitted("team")) == 0
