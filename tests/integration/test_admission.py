"""WebhookDispatcher against a real webhook server: aiohttp over TLS on 127.0.0.1, certificates from
hami_sim.tls. The server counts its calls, so 'not called' is proven, not assumed."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from hami_sim.apiserver.admission import AdmissionAttributes, AdmissionRejected, WebhookDispatcher
from hami_sim.tls import generate_ca, generate_serving_cert, server_ssl_context
from tests.builders import gpu_pod

SERVICE_HOST = "hami-webhook.kube-system.svc"
SLOW_HANDLER_BOUND = 10.0  # seconds a slow handler may hang before giving up on its own


@dataclass(frozen=True)
class Pki:
    ca_bundle: str  # base64 PEM, as in clientConfig.caBundle
    wrong_ca_bundle: str
    server_cert: bytes
    server_key: bytes


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca_cert, ca_key = generate_ca("hami-test-ca")
    wrong_ca, _ = generate_ca("some-other-ca")
    cert, key = generate_serving_cert(ca_cert, ca_key, [SERVICE_HOST], ["127.0.0.1"])
    return Pki(base64.b64encode(ca_cert).decode(), base64.b64encode(wrong_ca).decode(), cert, key)


@dataclass
class WebhookServer:
    """Routes: /mutate (adds an annotation), /deny, /deny-coded, /slow, /wrong-uid, /allow."""

    base_url: str = ""
    calls: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.calls]

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.calls.append((request.path, review, dict(request.query)))
        behaviour = request.match_info["behaviour"]
        req = review["request"]
        response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        if behaviour == "mutate":
            key = f"mutated-{len(self.calls)}"
            ops = [{"op": "add", "path": f"/metadata/annotations/{key}", "value": request.path}]
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
            if review["apiVersion"] == "admission.k8s.io/v1":
                response["patchType"] = "JSONPatch"
        elif behaviour == "deny":
            response.update(allowed=False, status={"message": "no GPUs for you"})
        elif behaviour == "deny-coded":
            response.update(allowed=False, status={"code": 422, "reason": "Invalid", "message": "bad gpumem"})
        elif behaviour == "slow":
            self.slow_started.set()
            await asyncio.wait_for(self.release.wait(), SLOW_HANDLER_BOUND)
        elif behaviour == "wrong-uid":
            response["uid"] = "not-the-request-uid"
        return web.json_response(
            {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
        )


@asynccontextmanager
async def webhook_server(pki: Pki) -> AsyncIterator[WebhookServer]:
    server = WebhookServer()
    app = web.Application()
    app.router.add_post("/{behaviour}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner, "127.0.0.1", 0, ssl_context=server_ssl_context(pki.server_cert, pki.server_key)
    )
    await site.start()
    host, port = runner.addresses[0][:2]
    server.base_url = f"https://{host}:{port}"
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


Scenario = Callable[[WebhookServer, WebhookDispatcher], Awaitable[None]]


def run(pki: Pki, scenario: Scenario, **dispatcher_args: Any) -> None:
    async def main() -> None:
        async with webhook_server(pki) as server, WebhookDispatcher(**dispatcher_args) as dispatcher:
            await scenario(server, dispatcher)

    asyncio.run(main())


def webhook(name: str, url: str, ca_bundle: str, **overrides: Any) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
    }
    hook.update(overrides)
    return hook


def configuration(name: str, *hooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": list(hooks),
    }


POD = gpu_pod("p", namespace="default", labels={"app": "x"}, annotations={})


def pod_attrs(**overrides: Any) -> AdmissionAttributes:
    values: dict[str, Any] = {
        "operation": "CREATE",
        "kind": ("", "v1", "Pod"),
        "resource": ("", "v1", "pods"),
        "namespace": "default",
        "name": "p",
        "obj": copy.deepcopy(POD),
        "namespace_labels": {"kubernetes.io/metadata.name": "default"},
    }
    values.update(overrides)
    return AdmissionAttributes(**values)


def test_patch_applied_and_review_is_kubes(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        attrs = pod_attrs()
        hooks = [configuration("hami", webhook("mutate.hami.io", f"{server.base_url}/mutate", pki.ca_bundle))]
        result = await dispatcher.mutate(hooks, attrs)
        assert result["metadata"]["annotations"] == {"mutated-1": "/mutate"}
        assert attrs.obj == POD  # the request's object is not touched
        assert server.paths() == ["/mutate"]
        _, review, query = server.calls[0]
        assert query == {"timeout": "10s"}
        assert review["apiVersion"] == "admission.k8s.io/v1"
        assert review["kind"] == "AdmissionReview"
        req = review["request"]
        assert len(req["uid"]) == 36
        assert req["kind"] == req["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
        assert req["resource"] == req["requestResource"] == {"group": "", "version": "v1", "resource": "pods"}
        assert (req["operation"], req["namespace"], req["name"]) == ("CREATE", "default", "p")
        assert req["userInfo"]["username"] == "system:admin"
        assert req["object"] == POD
        assert req["oldObject"] is None
        assert req["dryRun"] is False
        assert req["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        assert "subResource" not in req

    run(pki, scenario)


def test_configurations_run_in_name_order_each_seeing_the_last_patch(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        url = f"{server.base_url}/mutate"
        configs = [
            configuration("b-second", webhook("b.hami.io", url, pki.ca_bundle)),
            configuration(
                "a-first",
                webhook("a1.hami.io", url, pki.ca_bundle),
                webhook("a2.hami.io", url, pki.ca_bundle),
            ),
        ]
        result = await dispatcher.mutate(configs, pod_attrs())
        assert result["metadata"]["annotations"] == {
            "mutated-1": "/mutate",
            "mutated-2": "/mutate",
            "mutated-3": "/mutate",
        }
        seen = [review["request"]["object"]["metadata"]["annotations"] for _, review, _ in server.calls]
        assert seen == [{}, {"mutated-1": "/mutate"}, {"mutated-1": "/mutate", "mutated-2": "/mutate"}]

    run(pki, scenario)


@pytest.mark.parametrize("policy", ["Fail", None])
def test_wrong_ca_rejects_with_500_when_failure_policy_fails(pki: Pki, policy: str | None) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("mutate.hami.io", f"{server.base_url}/mutate", pki.wrong_ca_bundle)
        if policy:
            hook["failurePolicy"] = policy  # None: v1's default, Fail
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        err = caught.value
        assert (err.code, err.reason) == (500, "InternalError")
        assert err.message.startswith('Internal error occurred: failed calling webhook "mutate.hami.io": ')
        assert "certificate" in err.message
        assert err.to_status()["details"] == {"causes": [{"message": err.message.split(": ", 1)[1]}]}
        assert server.calls == []

    run(pki, scenario)


def test_wrong_ca_with_failure_policy_ignore_lets_the_request_through(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        url = f"{server.base_url}/mutate"
        configs = [
            configuration("a", webhook("broken.hami.io", url, pki.wrong_ca_bundle, failurePolicy="Ignore")),
            configuration("b", webhook("good.hami.io", url, pki.ca_bundle)),
        ]
        result = await dispatcher.mutate(configs, pod_attrs())
        assert result["metadata"]["annotations"] == {"mutated-1": "/mutate"}
        assert server.paths() == ["/mutate"]

    run(pki, scenario)


def test_host_name_is_verified(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        url = server.base_url.replace("127.0.0.1", "localhost") + "/mutate"  # not in the certificate
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate(
                [configuration("hami", webhook("m.hami.io", url, pki.ca_bundle))], pod_attrs()
            )
        assert caught.value.code == 500
        assert "localhost" in caught.value.message
        assert server.calls == []

    run(pki, scenario)


def test_invalid_ca_bundle_is_a_call_failure(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("m.hami.io", f"{server.base_url}/mutate", "not base64!")
        with pytest.raises(AdmissionRejected, match="unable to load root certificates") as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert caught.value.code == 500
        assert server.calls == []

    run(pki, scenario)


def test_service_reference_goes_through_the_resolver_and_verifies_the_service_name(pki: Pki) -> None:
    resolved: list[tuple[str, str, int]] = []
    holder: dict[str, str] = {}

    def resolver(namespace: str, name: str, port: int) -> str:
        resolved.append((namespace, name, port))
        return holder["base_url"]

    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        holder["base_url"] = server.base_url
        service = {"namespace": "kube-system", "name": "hami-webhook", "path": "/mutate", "port": 8443}
        hook = webhook("svc.hami.io", "", pki.ca_bundle)
        hook["clientConfig"] = {"service": service, "caBundle": pki.ca_bundle}
        result = await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert result["metadata"]["annotations"] == {"mutated-1": "/mutate"}
        assert resolved == [("kube-system", "hami-webhook", 8443)]
        # a service whose DNS name is not in the certificate fails verification
        hook["clientConfig"] = {"service": {**service, "name": "other"}, "caBundle": pki.ca_bundle}
        with pytest.raises(AdmissionRejected, match=r"other\.kube-system\.svc"):
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert server.paths() == ["/mutate"]

    run(pki, scenario, service_resolver=resolver)


def test_service_reference_without_resolver_fails_the_call(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("svc.hami.io", "", pki.ca_bundle)
        hook["clientConfig"] = {"service": {"namespace": "kube-system", "name": "hami-webhook"}}
        with pytest.raises(AdmissionRejected, match="no resolver for service kube-system/hami-webhook:443"):
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        hook["failurePolicy"] = "Ignore"
        assert await dispatcher.mutate([configuration("hami", hook)], pod_attrs()) == POD
        assert server.calls == []

    run(pki, scenario)


def test_timeout_seconds_is_honoured(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("slow.hami.io", f"{server.base_url}/slow", pki.ca_bundle, timeoutSeconds=1)
        started = time.monotonic()
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        elapsed = time.monotonic() - started
        assert server.slow_started.is_set()
        assert 0.9 <= elapsed < SLOW_HANDLER_BOUND / 2
        assert caught.value.code == 500
        assert "context deadline exceeded" in caught.value.message
        assert server.calls[0][2] == {"timeout": "1s"}
        server.release.set()

    run(pki, scenario)


def test_namespace_selector(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        selector = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "In", "values": ["enable"]}]}
        hook = webhook("m.hami.io", f"{server.base_url}/mutate", pki.ca_bundle, namespaceSelector=selector)
        configs = [configuration("hami", hook)]
        assert await dispatcher.mutate(configs, pod_attrs()) == POD
        assert server.calls == []
        result = await dispatcher.mutate(configs, pod_attrs(namespace_labels={"hami.io/webhook": "enable"}))
        assert "mutated-1" in result["metadata"]["annotations"]
        # cluster-scoped objects are not subject to the namespace selector
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {}}}
        node_rule = {
            "operations": ["UPDATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["nodes"],
        }
        hook["rules"] = [node_rule]
        attrs = AdmissionAttributes(
            "UPDATE", ("", "v1", "Node"), ("", "v1", "nodes"), name="n1", obj=node, old_obj=node
        )
        result = await dispatcher.mutate(configs, attrs)
        assert "mutated-2" in result["metadata"]["annotations"]
        assert server.calls[1][1]["request"]["options"]["kind"] == "UpdateOptions"
        assert server.calls[1][1]["request"]["oldObject"] == node

    run(pki, scenario)


def test_object_selector(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        selector = {"matchExpressions": [{"key": "hami.io/skip", "operator": "DoesNotExist"}]}
        hook = webhook("m.hami.io", f"{server.base_url}/mutate", pki.ca_bundle, objectSelector=selector)
        skipped = copy.deepcopy(POD)
        skipped["metadata"]["labels"]["hami.io/skip"] = "true"
        assert await dispatcher.mutate([configuration("hami", hook)], pod_attrs(obj=skipped)) == skipped
        assert server.calls == []
        await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert server.paths() == ["/mutate"]

    run(pki, scenario)


RULE = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}


@pytest.mark.parametrize(
    ("rule", "overrides", "called"),
    [
        ({**RULE, "operations": ["UPDATE"]}, {}, False),
        ({**RULE, "operations": ["*"]}, {}, True),
        ({**RULE, "apiGroups": ["apps"]}, {}, False),
        ({**RULE, "apiVersions": ["v2"]}, {}, False),
        ({**RULE, "resources": ["nodes"]}, {}, False),
        ({**RULE, "resources": ["*"]}, {}, True),
        ({**RULE, "resources": ["pods/status"]}, {}, False),
        ({**RULE, "resources": ["pods/status"]}, {"sub_resource": "status"}, True),
        ({**RULE, "resources": ["pods/*"]}, {"sub_resource": "status"}, True),
        ({**RULE, "resources": ["pods"]}, {"sub_resource": "status"}, False),
        ({**RULE, "resources": ["*"]}, {"sub_resource": "status"}, False),
        ({**RULE, "resources": ["*/*"]}, {"sub_resource": "status"}, True),
        ({**RULE, "scope": "Cluster"}, {}, False),
        ({**RULE, "scope": "Namespaced"}, {}, True),
    ],
)
def test_rules(pki: Pki, rule: dict[str, Any], overrides: dict[str, Any], called: bool) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("m.hami.io", f"{server.base_url}/allow", pki.ca_bundle, rules=[rule])
        assert await dispatcher.mutate([configuration("hami", hook)], pod_attrs(**overrides)) == POD
        assert len(server.calls) == (1 if called else 0)
        if called and overrides.get("sub_resource"):
            assert server.calls[0][1]["request"]["subResource"] == "status"

    run(pki, scenario)


def test_denial_is_kubes_forbidden(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("deny.hami.io", f"{server.base_url}/deny", pki.ca_bundle, failurePolicy="Ignore")
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        err = caught.value
        assert (err.code, err.reason) == (403, "Forbidden")
        assert (
            err.message
            == 'pods "p" is forbidden: admission webhook "deny.hami.io" denied the request: no GPUs for you'
        )
        assert err.details == {"group": "", "kind": "pods", "name": "p"}
        hook["clientConfig"]["url"] = f"{server.base_url}/deny-coded"
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs(name=""))
        assert (caught.value.code, caught.value.reason) == (422, "Invalid")
        assert caught.value.message.endswith(
            '"Unknown" is forbidden: admission webhook "deny.hami.io" denied the request: bad gpumem'
        )
        assert len(server.calls) == 2

    run(pki, scenario)


def test_v1beta1_only_webhook_gets_a_v1beta1_review(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook(
            "old.hami.io", f"{server.base_url}/mutate", pki.ca_bundle, admissionReviewVersions=["v1beta1"]
        )
        result = await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert result["metadata"]["annotations"] == {"mutated-1": "/mutate"}  # patch without patchType
        assert server.calls[0][1]["apiVersion"] == "admission.k8s.io/v1beta1"
        hook["admissionReviewVersions"] = ["v2", "v1", "v1beta1"]
        await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert server.calls[1][1]["apiVersion"] == "admission.k8s.io/v1"
        hook["admissionReviewVersions"] = ["v2"]
        with pytest.raises(AdmissionRejected, match="does not accept known AdmissionReview versions"):
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert len(server.calls) == 2

    run(pki, scenario)


def test_response_with_the_wrong_uid_is_an_error(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("uid.hami.io", f"{server.base_url}/wrong-uid", pki.ca_bundle)
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs())
        assert caught.value.code == 500
        assert 'received invalid webhook response: expected response.uid="' in caught.value.message
        assert 'got "not-the-request-uid"' in caught.value.message
        hook["failurePolicy"] = "Ignore"
        assert await dispatcher.mutate([configuration("hami", hook)], pod_attrs()) == POD
        assert len(server.calls) == 2

    run(pki, scenario)


def test_dry_run_is_refused_by_webhooks_with_side_effects(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        hook = webhook("fx.hami.io", f"{server.base_url}/mutate", pki.ca_bundle, sideEffects="Unknown")
        with pytest.raises(AdmissionRejected) as caught:
            await dispatcher.mutate([configuration("hami", hook)], pod_attrs(dry_run=True))
        assert (caught.value.code, caught.value.reason) == (400, "BadRequest")
        assert caught.value.message == 'admission webhook "fx.hami.io" does not support dry run'
        assert server.calls == []
        hook["sideEffects"] = "None"
        await dispatcher.mutate([configuration("hami", hook)], pod_attrs(dry_run=True))
        request = server.calls[0][1]["request"]
        assert request["dryRun"] is True
        assert request["options"]["dryRun"] == ["All"]

    run(pki, scenario)


def test_a_webhook_configuration_is_not_sent_to_a_catch_all_webhook(pki: Pki) -> None:
    async def scenario(server: WebhookServer, dispatcher: WebhookDispatcher) -> None:
        rule = {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}
        hook = webhook("all.hami.io", f"{server.base_url}/mutate", pki.ca_bundle, rules=[rule])
        config = configuration("hami", hook)
        group = "admissionregistration.k8s.io"
        attrs = AdmissionAttributes(
            "CREATE",
            (group, "v1", "MutatingWebhookConfiguration"),
            (group, "v1", "mutatingwebhookconfigurations"),
            name="hami",
            obj=config,
        )
        assert await dispatcher.mutate([config], attrs) == config
        assert server.calls == []

    run(pki, scenario)
