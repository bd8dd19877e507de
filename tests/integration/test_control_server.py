"""hami-control's HTTPS server on 127.0.0.1: routes, health and readiness, the webhook route's limits,
and serving certificates that rotate without dropping a connection."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hami_control.caches import ClusterCaches
from hami_control.config import ControlConfig, ServerSettings
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.server import (
    CertificateError,
    CertificateReloader,
    ControlServer,
    Routes,
    WebhookAnswer,
    health_routes,
    webhook_route,
)
from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi
from hami_sim.apiserver import ApiServerRunner
from tests.builders import admission_review, as_body, gpu_pod
from tests.control_server_util import (
    CA,
    KeepAliveClient,
    LoopThread,
    SecretVolume,
    common_name,
    write_pair,
)
from tests.waiting import wait_for

MAX_BODY = 3 * 1024 * 1024


@dataclass
class Rig:
    """A running server: its port, the loop it runs on, its reloader, and the state tests flip."""

    port: int
    loop: LoopThread
    reloader: CertificateReloader | None
    ca: CA
    ready: dict[str, bool] = field(default_factory=dict)
    reviews: list[bytes] = field(default_factory=list)

    def client(self) -> KeepAliveClient:
        return KeepAliveClient(self.port, self.ca.client_context() if self.reloader else None)


def _admit(reviews: list[bytes]) -> Any:
    """A stand-in for the pure handler: allows everything, 400 for a body that is not JSON."""

    def admit(body: bytes) -> WebhookAnswer:
        reviews.append(body)
        try:
            review = json.loads(body)
        except ValueError as err:
            return WebhookAnswer(400, {"error": f"not JSON: {err}"}, {"error": "bad json"})
        uid = review["request"]["uid"]
        response = {"uid": uid, "allowed": True}
        return WebhookAnswer(
            200,
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response},
            {"uid": uid, "allowed": True},
        )

    return admit


def _start(tmp_path: Path, *, tls: bool, interval_s: float = 3600.0) -> Iterator[Rig]:
    ca = CA.new()
    loop = LoopThread()
    reloader: CertificateReloader | None = None
    if tls:
        cert_file, key_file = write_pair(tmp_path / "certs", ca.serving("first"))
        reloader = CertificateReloader(cert_file, key_file, interval_s=interval_s)
        reloader.load()
    rig = Rig(0, loop, reloader, ca)
    routes = Routes()
    health_routes(routes, lambda: dict(rig.ready))
    webhook_route(routes, _admit(rig.reviews), max_body=MAX_BODY)
    server = ControlServer(
        routes, "127.0.0.1", 0, ssl_context=reloader.context if reloader else None, max_body=MAX_BODY
    )
    rig.port = loop.call(server.start)
    poller = loop.submit(reloader.run()) if reloader is not None else None
    try:
        yield rig
    finally:
        if poller is not None:
            poller.cancel()
        loop.call(server.stop)
        loop.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from _start(tmp_path, tls=True)


def test_healthz_and_readyz_follow_the_caches(rig: Rig) -> None:
    rig.ready.update(pods=False, resourcequotas=False)
    with rig.client() as c:
        assert c.request("GET", "/healthz") == (200, b"ok\n")
        status, body = c.request("GET", "/readyz")
        assert status == 503
        assert body == b"not ready: waiting for pods, resourcequotas\n"
        rig.ready["pods"] = True
        assert c.request("GET", "/readyz") == (503, b"not ready: waiting for resourcequotas\n")
        rig.ready["resourcequotas"] = True
        assert c.request("GET", "/readyz") == (200, b"ok\n")
        assert c.same_socket


def test_unknown_path_and_wrong_method(rig: Rig) -> None:
    with rig.client() as c:
        status, body = c.request("GET", "/nope")
        assert (status, body) == (404, b"no route for /nope\n")
        status, body = c.request("GET", "/webhook")
        assert status == 405 and b"allowed: POST" in body
        status, _ = c.request("POST", "/healthz", b"{}")
        assert status == 405


def test_webhook_answers_json_and_logs_one_line_per_decision(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hami_control.webhook.decisions")
    with rig.client() as c:
        for i in range(3):
            status, body = c.request(
                "POST",
                "/webhook",
                as_body(admission_review({}, uid=f"uid-{i}")),
                {"Content-Type": "application/json"},
            )
            assert status == 200
            answer = json.loads(body)
            assert answer["response"] == {"uid": f"uid-{i}", "allowed": True}
        assert c.same_socket
    lines = [r.getMessage() for r in caplog.records if r.name == "hami_control.webhook.decisions"]
    assert len(lines) == 3
    assert lines[0].startswith("webhook=decision status=200 uid=uid-0 allowed=true ms=")


def test_webhook_bad_json_is_400(rig: Rig) -> None:
    with rig.client() as c:
        status, body = c.request("POST", "/webhook", b"{not json")
        assert status == 400
        assert "not JSON" in json.loads(body)["error"]


def test_webhook_body_over_3_mib_is_413(rig: Rig) -> None:
    big = b'{"x": "' + b"a" * MAX_BODY + b'"}'
    with rig.client() as c:
        status, body = c.request("POST", "/webhook", big)
        assert status == 413
        assert f"over the limit of {MAX_BODY} bytes".encode() in body
    # Without Content-Length (chunked), the limit holds while reading.
    with rig.client() as c:
        response = c.post_chunked("/webhook", b"a" * (1024 * 1024), 4)
        assert response.status == 413
        response.read()
    # Exactly at the limit is read and handed over.
    at_limit = as_body(admission_review({}))
    at_limit += b" " * (MAX_BODY - len(at_limit))
    with rig.client() as c:
        assert c.request("POST", "/webhook", at_limit)[0] == 200
    assert rig.reviews[-1] == at_limit


def test_plain_http_only_when_asked(tmp_path: Path) -> None:
    for plain in _start(tmp_path, tls=False):
        with plain.client() as c:
            assert c.request("GET", "/healthz") == (200, b"ok\n")


def test_rotation_keeps_open_connections_and_serves_the_new_cert(rig: Rig, tmp_path: Path) -> None:
    assert rig.reloader is not None
    old = rig.client()
    try:
        assert old.request("GET", "/healthz")[0] == 200
        first = old.certificate()
        assert common_name(first) == "first"

        write_pair(tmp_path / "certs", rig.ca.serving("second"))
        assert rig.loop.run_sync(rig.reloader.check) is True

        with rig.client() as new:
            assert new.request("GET", "/healthz")[0] == 200
            second = new.certificate()
        assert common_name(second) == "second"
        assert second.serial_number != first.serial_number
        # The keep-alive connection opened before the rotation still works, on the same socket, and
        # still holds the certificate it was handed.
        status, _ = old.request("POST", "/webhook", as_body(admission_review({})))
        assert status == 200
        assert old.request("GET", "/healthz")[0] == 200
        assert old.same_socket
        assert old.certificate().serial_number == first.serial_number
    finally:
        old.close()


def test_bad_new_certificate_keeps_the_old_one(rig: Rig, tmp_path: Path) -> None:
    assert rig.reloader is not None
    reloader = rig.reloader
    with rig.client() as c:
        c.request("GET", "/healthz")
        first_serial = c.certificate().serial_number
    certs = tmp_path / "certs"
    # Garbage PEM, then a certificate whose key is someone else's: neither is served.
    (certs / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    assert rig.loop.run_sync(reloader.check) is False
    other_cert, _ = rig.ca.serving("mismatched")
    (certs / "tls.crt").write_bytes(other_cert)
    assert rig.loop.run_sync(reloader.check) is False
    assert reloader.failures == 2
    with rig.client() as c:
        assert c.request("GET", "/healthz")[0] == 200
        assert c.certificate().serial_number == first_serial
    # A file that disappears (mid-rotation) is also survived.
    (certs / "tls.key").unlink()
    assert rig.loop.run_sync(reloader.check) is False
    # The next good pair is picked up.
    write_pair(certs, rig.ca.serving("third"))
    assert rig.loop.run_sync(reloader.check) is True
    with rig.client() as c:
        c.request("GET", "/healthz")
        assert common_name(c.certificate()) == "third"
    assert reloader.current is not None and reloader.current.subject == "third"


def test_secret_volume_symlink_swap_is_picked_up_by_the_poller(tmp_path: Path) -> None:
    """The reloader's own poll loop, against kubelet's `..data` symlink swap."""
    ca = CA.new()
    volume = SecretVolume(tmp_path / "secret")
    volume.update(ca.serving("gen-1"))
    loop = LoopThread()
    reloader = CertificateReloader(volume.cert_file, volume.key_file, interval_s=0.05)
    reloader.load()
    routes = Routes()
    health_routes(routes, dict)
    server = ControlServer(routes, "127.0.0.1", 0, ssl_context=reloader.context)
    port = loop.call(server.start)
    poller = loop.submit(reloader.run())
    try:
        with KeepAliveClient(port, ca.client_context()) as old:
            old.request("GET", "/healthz")
            assert common_name(old.certificate()) == "gen-1"
            volume.update(ca.serving("gen-2"))
            wait_for(lambda: reloader.reloads == 1, what="the reload after the ..data swap")
            with KeepAliveClient(port, ca.client_context()) as new:
                assert new.request("GET", "/healthz")[0] == 200
                assert common_name(new.certificate()) == "gen-2"
            assert old.request("GET", "/healthz")[0] == 200
            assert old.same_socket
    finally:
        poller.cancel()
        loop.call(server.stop)
        loop.close()


def test_start_up_with_bad_certificates_is_a_clear_error(tmp_path: Path) -> None:
    missing = CertificateReloader(tmp_path / "none.crt", tmp_path / "none.key")
    with pytest.raises(CertificateError, match=r"cannot read .*none\.crt"):
        missing.load()
    ca = CA.new()
    cert_file, key_file = write_pair(tmp_path, ca.serving("x"))
    key_file.write_bytes(CA.new().serving("y")[1])
    with pytest.raises(CertificateError, match="cannot be served"):
        CertificateReloader(cert_file, key_file).load()
    cert_file.write_text("not a pem")
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        CertificateReloader(cert_file, key_file).load()


def test_client_without_the_ca_is_refused(rig: Rig) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        KeepAliveClient(rig.port, ssl.create_default_context())


# --- readiness and the watch caches against the local API server ------------------------------------------


class GatedApi(KubeApi):
    """The real client, with a gate the test closes to hold the next watch back (to make the watch miss
    events, or miss so many that its resourceVersion expires)."""

    gate: asyncio.Event

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        await self.gate.wait()
        async with super().watch(path, resource_version, timeout_s, params) as events:
            yield events


def control_config() -> ControlConfig:
    return ControlConfig(server=ServerSettings(insecure_http=True))


def close_watches(runner: ApiServerRunner) -> None:
    """End every open watch stream from the server side (as an API server restart would)."""

    def close() -> None:
        for watcher in runner.store.watchers():
            watcher.close()

    runner.call(close)


@dataclass
class CacheRig:
    runner: ApiServerRunner
    loop: LoopThread
    api: GatedApi
    caches: ClusterCaches
    port: int
    core_v1: Any

    def pods(self) -> int:
        return self.loop.run_sync(lambda: len(self.caches.pods))

    def used(self, namespace: str = "default") -> QuotaUsage:
        return self.loop.run_sync(lambda: self.caches.quota_view.used(namespace))


@pytest.fixture
def cache_rig(tmp_path: Path) -> Iterator[CacheRig]:
    with ApiServerRunner(history_size=5) as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        loop = LoopThread()

        async def setup() -> tuple[GatedApi, ClusterCaches, ControlServer]:
            api = await GatedApi.connect(kubeconfig)
            api.gate = asyncio.Event()
            api.gate.set()
            caches = ClusterCaches(api, control_config(), retry=RetryPolicy(initial=0.01, maximum=0.05))
            routes = Routes()
            health_routes(routes, caches.readiness)
            server = ControlServer(routes, "127.0.0.1", 0, ssl_context=None)
            await server.start()
            return api, caches, server

        api, caches, server = loop.call(setup)
        configuration = client.Configuration(host=runner.base_url)
        try:
            with client.ApiClient(configuration) as api_client:
                yield CacheRig(runner, loop, api, caches, server.port, client.CoreV1Api(api_client))
        finally:

            async def teardown() -> None:
                await server.stop()
                await caches.stop()
                await api.close()

            loop.call(teardown)
            loop.close()


def test_readyz_turns_ready_and_the_collector_runs_again_when_the_caches_have_synced(
    cache_rig: CacheRig,
) -> None:
    cache_rig.core_v1.create_namespaced_pod("default", gpu_pod("before", gpumem=4000))
    assert gc.isenabled()
    with KeepAliveClient(cache_rig.port, None) as c:
        status, body = c.request("GET", "/readyz")
        assert (status, body) == (503, b"not ready: waiting for nodes, pods, resourcequotas\n")

        def start() -> bool:
            cache_rig.caches.start()
            return gc.isenabled()

        assert cache_rig.loop.run_sync(start) is False  # paused while the caches list
        wait_for(lambda: c.request("GET", "/readyz")[0] == 200, what="/readyz to answer 200")
        assert c.request("GET", "/healthz")[0] == 200
        wait_for(gc.isenabled, what="the garbage collector to run again after the sync")
    assert cache_rig.pods() == 1
    assert cache_rig.used() == QuotaUsage(memory=4000, cores=0)


def test_watch_resumes_from_its_version_and_relists_after_410(cache_rig: CacheRig) -> None:
    rig = cache_rig
    rig.loop.run_sync(rig.caches.start)
    pods_reflector = rig.caches.reflectors[0]
    wait_for(lambda: rig.caches.synced, what="the first list")
    assert pods_reflector.lists == 1
    rig.core_v1.create_namespaced_pod("default", gpu_pod("a", gpumem=4000))
    wait_for(lambda: rig.pods() == 1, what="pod a in the cache")

    # A dropped watch resumes from the last version seen: no relist, nothing missed.
    rig.loop.run_sync(rig.api.gate.clear)
    close_watches(rig.runner)
    rig.core_v1.create_namespaced_pod("default", gpu_pod("b", gpumem=1000))
    rig.core_v1.delete_namespaced_pod("a", "default")
    rig.loop.run_sync(rig.api.gate.set)
    wait_for(lambda: rig.pods() == 1 and rig.used() == QuotaUsage(1000, 0), what="b in, a out")
    assert pods_reflector.lists == 1

    # Held back while more events happen than the server keeps (history 5): 410, then a relist.
    rig.loop.run_sync(rig.api.gate.clear)
    close_watches(rig.runner)
    for i in range(8):
        rig.core_v1.create_namespaced_pod("default", gpu_pod(f"burst-{i}", gpumem=500))
    rig.loop.run_sync(rig.api.gate.set)
    wait_for(lambda: pods_reflector.lists == 2, what="the relist after 410")
    wait_for(lambda: rig.pods() == 9, what="all pods after the relist")
    assert rig.used() == QuotaUsage(1000 + 8 * 500, 0)


def test_quota_cache_tracks_resource_quotas_and_terminal_pods(cache_rig: CacheRig) -> None:
    rig = cache_rig
    rig.loop.run_sync(rig.caches.start)
    wait_for(lambda: rig.caches.synced, what="the first list")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "150"}},
    }
    rig.core_v1.create_namespaced_resource_quota("default", quota)
    view = rig.caches.quota_view
    wait_for(
        lambda: rig.loop.run_sync(lambda: view.limits("default")) == QuotaLimits(8000, 150), what="limits"
    )
    assert rig.loop.run_sync(lambda: view.limits("other")).unlimited
    rig.core_v1.create_namespaced_pod("default", gpu_pod("p", gpumem=3000))
    wait_for(lambda: rig.used() == QuotaUsage(3000, 0), what="p counted")
    rig.core_v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"}})
    wait_for(lambda: rig.used() == QuotaUsage(0, 0), what="a finished pod no longer counted")
    rig.core_v1.delete_namespaced_resource_quota("gpu", "default")
    wait_for(lambda: rig.loop.run_sync(lambda: view.limits("default")).unlimited, what="quota gone")


def test_lists_come_in_pages_into_the_caches(cache_rig: CacheRig) -> None:
    rig = cache_rig
    for i in range(5):
        rig.core_v1.create_namespaced_pod("default", gpu_pod(f"p{i}", gpumem=4000))
    for reflector in rig.caches.reflectors:
        reflector.page_size = 2
    rig.loop.run_sync(rig.caches.start)
    wait_for(lambda: rig.caches.synced, what="the first list")
    assert rig.pods() == 5
    assert rig.used() == QuotaUsage(memory=5 * 4000, cores=0)
    assert rig.caches.reflectors[0].lists == 1
    # A relist in pages drops what the new list no longer has.
    rig.core_v1.delete_namespaced_pod("p0", "default")
    rig.loop.call(lambda: rig.caches.resync(("pods",)))
    assert rig.pods() == 4
