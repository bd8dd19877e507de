"""The API server stand-in's webhook `matchConditions`, evaluated with CEL as kube-apiserver does
(staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go `Match`, and
webhook/generic/webhook.go `ShouldCallHook` for what an error does):

- the variables `object`, `oldObject` (null on CREATE) and `request` (kind, resource, operation,
  namespace, name, userInfo, dryRun, options);
- any condition false: the webhook is skipped, even when another errs; all true: it is called;
- an error (a missing field, a non-bool result, an expression that does not compile) and none false:
  failurePolicy Ignore skips the webhook, Fail refuses the request with kube's 403 Forbidden.

The dispatch tests point the webhook at a port nothing listens on: a webhook that is called fails the
call, so "called" shows as the failed call's 500, "skipped" as the object coming back unchanged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hami_sim.apiserver.admission import (
    AdmissionAttributes,
    AdmissionRejected,
    MatchConditionError,
    WebhookDispatcher,
    match_conditions,
)
from tests.builders import container, pod

GPU_POD = pod("p", container(gpus=1))
CPU_POD = pod("p", container(requests={"cpu": "1"}))


def create(obj: dict[str, Any], namespace: str = "team-a", user: str = "alice") -> AdmissionAttributes:
    return AdmissionAttributes(
        "CREATE", ("", "v1", "Pod"), ("", "v1", "pods"), namespace=namespace, name="p", obj=obj, user=user
    )


def hook(*expressions: str, failure_policy: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "probe.example.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "timeoutSeconds": 1,
        "clientConfig": {"url": "https://127.0.0.1:9/mutate"},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "matchConditions": [{"name": f"c{i}", "expression": e} for i, e in enumerate(expressions)],
    }
    if failure_policy is not None:
        body["failurePolicy"] = failure_policy
    return body


def matches(obj: dict[str, Any], *expressions: str, attrs: AdmissionAttributes | None = None) -> bool:
    return match_conditions(hook(*expressions), attrs or create(obj), obj)


def test_no_conditions_match_everything() -> None:
    assert matches(CPU_POD)


def test_object_fields_and_macros() -> None:
    gpu = (
        "object.spec.containers.exists(c, has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits)"
    )
    assert matches(GPU_POD, gpu)
    assert not matches(CPU_POD, gpu)
    assert matches(CPU_POD, "!has(object.spec.schedulerName) || object.spec.schedulerName == ''")


def test_request_and_old_object_are_bound() -> None:
    assert matches(CPU_POD, "request.operation == 'CREATE'", "request.namespace == 'team-a'")
    assert matches(CPU_POD, "request.userInfo.username == 'alice'", "request.resource.resource == 'pods'")
    assert matches(CPU_POD, "oldObject == null")
    assert not matches(CPU_POD, "request.namespace == 'kube-system'")


def test_all_must_be_true() -> None:
    assert not matches(CPU_POD, "true", "false")
    assert not matches(CPU_POD, "1 == 1", "object.metadata.name == 'other'")


def test_a_false_condition_wins_over_an_error() -> None:
    assert not matches(CPU_POD, "object.spec.missing == 1", "false")


@pytest.mark.parametrize(
    ("expression", "detail"),
    [
        ("object.spec.missing == 1", "no such key"),
        ("object.metadata.name", "not a bool"),
        ("1 +", "compilation failed"),
    ],
)
def test_an_error_with_none_false_is_an_error(expression: str, detail: str) -> None:
    with pytest.raises(MatchConditionError, match=detail) as caught:
        matches(CPU_POD, "true", expression)
    assert str(caught.value).startswith(f"expression '{expression}' resulted in error")


def mutate(webhook: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with WebhookDispatcher() as dispatcher:
            config = {"metadata": {"name": "probe"}, "webhooks": [webhook]}
            return await dispatcher.mutate([config], create(obj))

    return asyncio.run(run())


def test_a_false_condition_skips_the_webhook_and_a_true_one_calls_it() -> None:
    assert mutate(hook("has(object.spec.nodeName)"), CPU_POD) == CPU_POD  # skipped: nothing called
    with pytest.raises(AdmissionRejected) as called:
        mutate(hook("!has(object.spec.nodeName)"), CPU_POD)
    assert called.value.code == 500 and 'failed calling webhook "probe.example.com"' in called.value.message


def test_an_error_follows_failure_policy_ignore_skips() -> None:
    assert mutate(hook("object.spec.missing == 1", failure_policy="Ignore"), CPU_POD) == CPU_POD


@pytest.mark.parametrize("policy", [None, "Fail"])
def test_an_error_follows_failure_policy_fail_refuses_with_kubes_forbidden(policy: str | None) -> None:
    with pytest.raises(AdmissionRejected) as refused:
        mutate(hook("object.spec.missing == 1", failure_policy=policy), CPU_POD)
    assert (refused.value.code, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message.startswith(
        "pods \"p\" is forbidden: expression 'object.spec.missing == 1' resulted in error: no such key"
    )
