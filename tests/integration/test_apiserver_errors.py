"""Bad requests get a metav1.Status naming the problem; the server never crashes on input."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.apiserver_util import http
from tests.conftest import ApiServerHandle

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "image": "i"}]},
}
PODS = "/api/v1/namespaces/default/pods"


def assert_status(result: tuple[int, Any], code: int, reason: str, *fragments: str) -> None:
    status, body = result
    assert status == code, body
    assert isinstance(body, dict), body
    assert (body["kind"], body["apiVersion"], body["status"], body["code"]) == (
        "Status",
        "v1",
        "Failure",
        code,
    )
    assert body["reason"] == reason, body
    for fragment in fragments:
        assert fragment in body["message"], body["message"]


@pytest.mark.parametrize(
    ("body", "content_type", "code", "reason", "fragment"),
    [
        ("{not json", "application/json", 400, "BadRequest", "as JSON"),
        ("[1, 2]", "application/json", 400, "BadRequest", "must be a JSON object"),
        ("", "application/json", 400, "BadRequest", "empty"),
        ({**POD, "kind": "Node"}, "application/json", 400, "BadRequest", '"Node"'),
        ({**POD, "apiVersion": "v2"}, "application/json", 400, "BadRequest", '"v2"'),
        ({**POD, "metadata": "x"}, "application/json", 400, "BadRequest", "metadata"),
        (
            {**POD, "metadata": {"name": "p", "labels": {"a": 1}}},
            "application/json",
            400,
            "BadRequest",
            "labels",
        ),
        ({**POD, "metadata": {"name": "Not_Valid"}}, "application/json", 422, "Invalid", "RFC 1123"),
        ({**POD, "spec": {"containers": []}}, "application/json", 422, "Invalid", "spec.containers"),
        ({**POD, "spec": {"containers": [{"name": "c"}]}}, "application/json", 422, "Invalid", "image"),
        ("\x00\x01", "application/vnd.kubernetes.protobuf", 400, "BadRequest", "protobuf magic"),
        ("k8s\x00\x01", "application/vnd.kubernetes.protobuf", 400, "BadRequest", "runtime.Unknown"),
        ("name: p", "text/plain", 415, "UnsupportedMediaType", "application/vnd.kubernetes.protobuf"),
    ],
)
def test_bad_create(  # noqa: PLR0917
    apiserver: ApiServerHandle, body: Any, content_type: str, code: int, reason: str, fragment: str
) -> None:
    assert_status(http(apiserver.base_url, "POST", PODS, body, content_type), code, reason, fragment)


def test_yaml_body_is_accepted(apiserver: ApiServerHandle) -> None:
    code, body = http(
        apiserver.base_url,
        "POST",
        PODS,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: y}\nspec: {containers: [{name: c, image: i}]}\n",
        "application/yaml",
    )
    assert code == 201 and body["metadata"]["name"] == "y"


def test_kind_and_api_version_may_be_omitted(apiserver: ApiServerHandle) -> None:
    body = {k: v for k, v in POD.items() if k not in ("kind", "apiVersion")}
    code, created = http(apiserver.base_url, "POST", PODS, body)
    assert code == 201 and (created["kind"], created["apiVersion"]) == ("Pod", "v1")


def test_bad_selectors(apiserver: ApiServerHandle) -> None:
    assert_status(http(apiserver.base_url, "GET", PODS + "?labelSelector=a%20in%20(b"), 400, "BadRequest")
    assert_status(
        http(apiserver.base_url, "GET", PODS + "?fieldSelector=spec.foo%3Dx"), 400, "BadRequest", "spec.foo"
    )
    assert_status(http(apiserver.base_url, "GET", PODS + "?watch=1&labelSelector=%3D%3Dx"), 400, "BadRequest")


def test_bad_patches(apiserver: ApiServerHandle) -> None:
    assert http(apiserver.base_url, "POST", PODS, POD)[0] == 201
    url = PODS + "/p"
    assert_status(
        http(apiserver.base_url, "PATCH", url, "{", "application/merge-patch+json"), 400, "BadRequest"
    )
    assert_status(
        http(apiserver.base_url, "PATCH", url, [1], "application/merge-patch+json"), 400, "BadRequest"
    )
    assert_status(
        http(
            apiserver.base_url,
            "PATCH",
            url,
            [{"op": "remove", "path": "/metadata/nope"}],
            "application/json-patch+json",
        ),
        422,
        "Invalid",
    )
    assert_status(
        http(
            apiserver.base_url,
            "PATCH",
            url,
            [{"op": "frobnicate", "path": "/x"}],
            "application/json-patch+json",
        ),
        422,
        "Invalid",
    )
    assert_status(
        http(apiserver.base_url, "PATCH", url, {"kind": "Node"}, "application/merge-patch+json"),
        400,
        "BadRequest",
    )
    assert_status(
        http(apiserver.base_url, "PATCH", url, {"metadata": {"name": "q"}}, "application/merge-patch+json"),
        400,
        "BadRequest",
        "does not match the name",
    )
    assert_status(http(apiserver.base_url, "PATCH", url, {}, "text/plain"), 415, "UnsupportedMediaType")
    assert_status(
        http(apiserver.base_url, "PATCH", PODS + "/ghost", {}, "application/merge-patch+json"),
        404,
        "NotFound",
    )


def test_put_name_mismatch(apiserver: ApiServerHandle) -> None:
    assert http(apiserver.base_url, "POST", PODS, POD)[0] == 201
    assert_status(
        http(apiserver.base_url, "PUT", PODS + "/p", {**POD, "metadata": {"name": "other"}}),
        400,
        "BadRequest",
        "does not match the name on the URL",
    )


@pytest.mark.parametrize(
    ("method", "path", "code", "reason"),
    [
        ("GET", "/api/v1/widgets", 404, "NotFound"),
        ("GET", "/apis/nope.io/v1/things", 404, "NotFound"),
        ("GET", "/api/v2", 404, "NotFound"),
        ("GET", "/api/v1/namespaces/default/nodes", 404, "NotFound"),
        ("GET", "/api/v1/pods/p", 404, "NotFound"),
        ("GET", "/api/v1/namespaces/default/pods/p/log", 404, "NotFound"),
        ("GET", "/nowhere", 404, "NotFound"),
        ("POST", "/api/v1/namespaces/default/pods/p", 405, "MethodNotAllowed"),
        ("PUT", "/api/v1/namespaces/default/pods", 405, "MethodNotAllowed"),
        ("GET", PODS + "?watch=1&resourceVersion=abc", 400, "BadRequest"),
        ("POST", PODS + "?dryRun=Some", 400, "BadRequest"),
    ],
)
def test_bad_paths(apiserver: ApiServerHandle, method: str, path: str, code: int, reason: str) -> None:
    assert_status(http(apiserver.base_url, method, path, POD if method != "GET" else None), code, reason)


def test_internal_error_is_500_and_the_server_keeps_running(
    apiserver: ApiServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    store = apiserver.runner.store

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="hami_sim.apiserver.server"):
        store.list = broken  # an instance attribute shadows the method
        try:
            assert_status(http(apiserver.base_url, "GET", PODS), 500, "InternalError", "boom")
        finally:
            del store.list
    assert any("internal error" in r.getMessage() and r.exc_info for r in caplog.records)
    assert http(apiserver.base_url, "GET", PODS)[0] == 200


def test_body_over_3mib_gets_413(apiserver: ApiServerHandle) -> None:
    """kube-apiserver refuses request bodies over 3 MiB; so do we, with a Status, not a 500."""
    big = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "big", "annotations": {"x": "a" * (3 * 1024 * 1024)}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    status, body = http(apiserver.base_url, "POST", PODS, big)
    assert status == 413
    assert body["reason"] == "RequestEntityTooLarge"
    assert "limit is 3145728" in body["message"]
