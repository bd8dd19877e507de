"""End to end: a MutatingWebhookConfiguration registered through the client, a webhook over TLS,
and a pod that comes out of `create` mutated (or refused)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client
from kubernetes.client import ApiException

from hami_sim.tls import generate_ca, generate_serving_cert, server_ssl_context
from tests.builders import gpu_pod, pod


@dataclass
class Webhook:
    url: str
    ca_bundle: str
    calls: list[dict[str, Any]] = field(default_factory=list)


async def _review(request: web.Request, calls: list[dict[str, Any]]) -> web.Response:
    review = await request.json()
    calls.append(review)
    req = review["request"]
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    if request.path == "/mutate":
        ops = [
            {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"},
            {"op": "add", "path": "/metadata/annotations", "value": {"hami.io/mutated": "yes"}},
        ]
        response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode())
    else:
        response.update(allowed=False, status={"code": 403, "message": "no GPUs for you"})
    return web.json_response(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    )


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    ca_cert, ca_key = generate_ca("test-webhook-ca")
    cert, key = generate_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])
    calls: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    ready: list[int] = []
    started = threading.Event()
    stop = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        return await _review(request, calls)

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/{what}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(cert, key))
        await site.start()
        ready.append(int(runner.addresses[0][1]))
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield Webhook(f"https://127.0.0.1:{ready[0]}", base64.b64encode(ca_cert).decode(), calls)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def register(api_client: client.ApiClient, name: str, url: str, ca_bundle: str) -> None:
    client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name=name),
            webhooks=[
                client.V1MutatingWebhook(
                    name=f"{name}.hami.io",
                    admission_review_versions=["v1"],
                    side_effects="None",
                    client_config=client.AdmissionregistrationV1WebhookClientConfig(
                        url=url, ca_bundle=ca_bundle
                    ),
                    rules=[
                        client.V1RuleWithOperations(
                            operations=["CREATE"], api_groups=[""], api_versions=["v1"], resources=["pods"]
                        )
                    ],
                    namespace_selector=client.V1LabelSelector(
                        match_expressions=[
                            client.V1LabelSelectorRequirement(
                                key="kubernetes.io/metadata.name", operator="NotIn", values=["kube-system"]
                            )
                        ]
                    ),
                )
            ],
        )
    )


def test_pod_comes_out_mutated(webhook: Webhook, api_client: client.ApiClient, core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("before"))
    assert webhook.calls == []  # no configuration yet: no call
    register(api_client, "hami", webhook.url + "/mutate", webhook.ca_bundle)
    created = core_v1.create_namespaced_pod("default", gpu_pod("p", gpus=1))
    assert created.spec.scheduler_name == "hami-scheduler"
    assert created.metadata.annotations == {"hami.io/mutated": "yes"}
    assert created.spec.restart_policy == "Always"  # defaulting ran before (and after) admission
    stored = core_v1.read_namespaced_pod("p", "default")
    assert stored.spec.scheduler_name == "hami-scheduler"
    assert len(webhook.calls) == 1
    request = webhook.calls[0]["request"]
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", "default", "p")
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"
    # The namespace selector excludes kube-system: not called there.
    assert core_v1.create_namespaced_pod("kube-system", pod("sys")).spec.scheduler_name == "default-scheduler"
    assert len(webhook.calls) == 1


def test_denial_is_returned_as_status(webhook: Webhook, api_client: client.ApiClient, core_v1: Any) -> None:
    register(api_client, "deny", webhook.url + "/deny", webhook.ca_bundle)
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("default", pod("p"))
    assert err.value.status == 403
    body = json.loads(err.value.body or "{}")
    assert body["kind"] == "Status" and "no GPUs for you" in body["message"]
    assert core_v1.list_namespaced_pod("default").items == []
