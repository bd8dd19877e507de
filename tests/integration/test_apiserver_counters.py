"""Request counters and the request log, in process and over HTTP."""

from __future__ import annotations

from typing import Any

from tests.apiserver_util import bind, http
from tests.builders import pod
from tests.conftest import ApiServerHandle


def test_counters_per_verb_resource_and_subresource(apiserver: ApiServerHandle, core_v1: Any) -> None:
    runner = apiserver.runner
    runner.reset_counters()
    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.read_namespaced_pod("p", "default")
    core_v1.list_namespaced_pod("default")
    bind(core_v1, "default", "p", "n1")
    core_v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core_v1.delete_namespaced_pod("p", "default")
    assert runner.counters() == {
        ("create", "pods", ""): 1,
        ("get", "pods", ""): 1,
        ("list", "pods", ""): 1,
        ("create", "pods", "binding"): 1,
        ("patch", "pods", "status"): 1,
        ("patch", "pods", ""): 1,
        ("delete", "pods", ""): 1,
    }
    assert runner.writes() == 5
    code, body = http(apiserver.base_url, "GET", "/hami-sim/counters")
    assert code == 200
    assert body["writes"] == 5 and body["total"] == 7
    assert {"verb": "create", "resource": "pods", "subresource": "binding", "count": 1} in body["counters"]
    code, body = http(apiserver.base_url, "GET", "/hami-sim/requests?limit=2")
    assert code == 200
    assert [(r["verb"], r["resource"], r["name"], r["code"]) for r in body["items"]] == [
        ("patch", "pods", "p", 200),
        ("delete", "pods", "p", 200),
    ]
    assert body["items"][0]["namespace"] == "default"
    recent = runner.requests(limit=1)
    assert recent[0]["verb"] == "delete" and recent[0]["userAgent"].startswith("OpenAPI-Generator")


def test_failed_requests_are_counted_with_their_code(apiserver: ApiServerHandle) -> None:
    http(apiserver.base_url, "GET", "/api/v1/namespaces/default/pods/ghost")
    items = apiserver.runner.requests()
    assert (items[-1]["verb"], items[-1]["code"]) == ("get", 404)


def test_reset_over_http(apiserver: ApiServerHandle) -> None:
    http(apiserver.base_url, "GET", "/api/v1/nodes")
    assert http(apiserver.base_url, "POST", "/hami-sim/reset-counters")[0] == 200
    assert apiserver.runner.counters() == {}
    assert http(apiserver.base_url, "GET", "/hami-sim/requests")[1] == {"items": []}
