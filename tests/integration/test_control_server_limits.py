"""hami-control's HTTPS server under slow, idle and surplus clients (issue 16, hardened endpoints), over real
TLS on 127.0.0.1 with short limits: a client trickling its headers or its body is cut after the timeout, an
idle or handshake-less connection is closed, connections over the cap evict the slowest or are refused
without disturbing the honest keep-alive connections, and a 4 MiB review gets a 413 that says why."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_control.cache import ClusterCache
from hami_control.connections import ConnectionLimits, ConnectionStats
from hami_control.metrics import ControlMetrics
from hami_control.server import (
    DEFAULT_MAX_BODY,
    CertificateReloader,
    ControlServer,
    Routes,
    WebhookAnswer,
    health_routes,
    webhook_route,
)
from tests.builders import admission_review, as_body
from tests.control_server_util import CA, KeepAliveClient, LoopThread, write_pair
from tests.waiting import closed_by_peer, wait_for

FAST = ConnectionLimits(
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    idle_timeout_s=1.0,
    tls_handshake_timeout_s=0.5,
    max_connections=4,
)


@dataclass
class Rig:
    port: int
    server: ControlServer
    loop: LoopThread
    ca: CA

    def client(self) -> KeepAliveClient:
        return KeepAliveClient(self.port, self.ca.client_context())

    def raw(self) -> ssl.SSLSocket:
        """A TLS connection that has done its handshake and sent nothing."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return self.ca.client_context().wrap_socket(sock, server_hostname="localhost")

    @property
    def stats(self) -> ConnectionStats:
        return self.server.stats


def _allow(body: bytes) -> WebhookAnswer:
    uid = json.loads(body)["request"]["uid"]
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    }
    return WebhookAnswer(200, answer, {"uid": uid})


def _start(tmp_path: Path, limits: ConnectionLimits) -> Iterator[Rig]:
    ca = CA.new()
    cert_file, key_file = write_pair(tmp_path / "certs", ca.serving("limits"))
    reloader = CertificateReloader(cert_file, key_file)
    reloader.load()
    routes = Routes()
    health_routes(routes, dict)
    webhook_route(routes, _allow, max_body=DEFAULT_MAX_BODY)
    loop = LoopThread()
    server = ControlServer(routes, "127.0.0.1", 0, ssl_context=reloader.context, limits=limits)
    try:
        port = loop.call(server.start)
        yield Rig(port, server, loop, ca)
    finally:
        loop.call(server.stop)
        loop.close()


started = contextlib.contextmanager(_start)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from _start(tmp_path, FAST)


def _trickle(
    sock: socket.socket, data: bytes, *, every_s: float = 0.02, deadline_s: float = 10.0
) -> tuple[int, bytes]:
    """Send `data` a byte at a time (every `every_s`) until the server closes the connection or answers;
    (bytes sent, what the server answered). AssertionError if neither happens by the deadline."""
    answer = b""
    deadline = time.monotonic() + deadline_s
    for sent, byte in enumerate(data):
        try:
            sock.send(bytes([byte]))
        except (ConnectionError, ssl.SSLError):
            return sent, answer
        readable, _, _ = select.select([sock], [], [], every_s)
        if readable:
            try:
                chunk = sock.recv(65536)
            except (ConnectionError, ssl.SSLError):
                return sent + 1, answer
            if not chunk:
                return sent + 1, answer
            answer += chunk
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"the server neither answered nor closed within {deadline_s} s (answer {answer!r})")


def test_headers_sent_a_byte_at_a_time_are_cut_after_the_header_timeout(rig: Rig) -> None:
    started = time.monotonic()
    with contextlib.closing(rig.raw()) as sock:
        request = b"POST /webhook HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 5000 + b"\r\n\r\n"
        sent, answer = _trickle(sock, request)
    elapsed = time.monotonic() - started
    assert answer == b""  # closed without an answer, as Go closes on ReadHeaderTimeout
    assert sent < len(request)
    assert elapsed >= FAST.header_timeout_s
    wait_for(lambda: rig.stats.header_timeouts == 1, what="the header timeout counted")
    wait_for(lambda: rig.stats.open == 0, what="the connection released")


def test_a_silent_connection_is_cut_after_the_header_timeout(rig: Rig) -> None:
    with contextlib.closing(rig.raw()) as sock:
        assert closed_by_peer(sock, 10.0)
    assert rig.stats.header_timeouts == 1


def test_a_body_trickled_is_cut_after_the_body_timeout_with_a_408(rig: Rig) -> None:
    body = as_body(admission_review({}))
    with contextlib.closing(rig.raw()) as sock:
        sock.sendall(
            b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        sent, answer = _trickle(sock, body)
        while not closed_by_peer(sock, 10.0):  # the rest of the answer, then the close
            pass
    assert sent < len(body)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert b"Connection: close" in rest
    assert b"POST /webhook: the request body did not arrive within 0.5 s of its headers" in rest
    assert rig.stats.body_timeouts == 1


def test_a_4_mib_review_gets_413_naming_the_route_the_limit_and_the_setting(rig: Rig) -> None:
    big = b'{"x": "' + b"a" * (4 * 1024 * 1024) + b'"}'
    with rig.client() as c:
        status, body = c.request("POST", "/webhook", big, {"Content-Type": "application/json"})
        assert status == 413
        assert body.decode() == (
            f"POST /webhook: request body of {len(big)} bytes is over the limit of {DEFAULT_MAX_BODY} bytes "
            "(--max-request-body)\n"
        )
    # Without a Content-Length (chunked) the limit holds while reading: no more than it is buffered.
    with rig.client() as c:
        response = c.post_chunked("/webhook", b"a" * (1024 * 1024), 4)
        assert response.status == 413
        assert response.getheader("Connection") == "close"
        assert (
            f"request body of more than {DEFAULT_MAX_BODY} bytes is over the limit".encode()
            in response.read()
        )


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(rig: Rig) -> None:
    with rig.client() as c:
        assert c.request("GET", "/healthz") == (200, b"ok\n")
        assert closed_by_peer(c.sock, 10.0)
    assert rig.stats.header_timeouts == 0  # idle between requests is not a slow header


def test_a_connection_that_never_handshakes_is_closed_after_the_handshake_timeout(rig: Rig) -> None:
    with socket.create_connection(("127.0.0.1", rig.port), timeout=10) as sock:
        assert closed_by_peer(sock, 10.0)
    wait_for(lambda: rig.stats.tls_handshake_timeouts == 1, what="the handshake timeout counted")
    assert rig.stats.tls_handshake_failures == 0
    wait_for(lambda: rig.stats.open == 0, what="the connection released")


def test_a_connection_that_sends_no_tls_is_dropped_and_counted_as_a_failed_handshake(rig: Rig) -> None:
    with socket.create_connection(("127.0.0.1", rig.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP to the HTTPS port
        assert closed_by_peer(sock, 10.0)
    wait_for(lambda: rig.stats.tls_handshake_failures == 1, what="the failed handshake counted")
    assert rig.stats.tls_handshake_timeouts == 0


def test_the_metrics_export_what_the_limits_did(rig: Rig) -> None:
    metrics = ControlMetrics(ClusterCache())
    metrics.watch_connections(lambda: rig.server.stats, rig.server.limits)
    with rig.client() as c:
        assert c.request("GET", "/healthz") == (200, b"ok\n")
    wait_for(lambda: rig.stats.open == 0, what="the first connection released")  # one at a time: peak 1
    with contextlib.closing(rig.raw()) as sock:  # a handshake, then silence: cut at the header timeout
        assert closed_by_peer(sock, 10.0)
    wait_for(lambda: rig.stats.open == 0, what="both connections released")
    series = {
        (s.name, s.labels.get("reason", "")): s.value
        for family in text_string_to_metric_families(metrics.render()[0].decode())
        for s in family.samples
        if s.name.startswith("hami_control_connections_")
    }
    assert series == {
        ("hami_control_connections_open", ""): 0,
        ("hami_control_connections_max", ""): FAST.max_connections,
        ("hami_control_connections_peak", ""): 1,
        ("hami_control_connections_accepted_total", ""): 2,
        ("hami_control_connections_refused_total", ""): 0,
        ("hami_control_connections_dropped_total", "header_timeout"): 1,
        ("hami_control_connections_dropped_total", "body_timeout"): 0,
        ("hami_control_connections_dropped_total", "tls_handshake_timeout"): 0,
        ("hami_control_connections_dropped_total", "tls_handshake_failed"): 0,
        ("hami_control_connections_dropped_total", "evicted"): 0,
    }


def _try_raw(rig: Rig) -> ssl.SSLSocket | None:
    """A TLS connection, or None when the server refused it (closed before the handshake)."""
    try:
        return rig.raw()
    except OSError:  # ssl.SSLError and ConnectionError included
        return None


def test_connections_over_the_cap_evict_slow_ones_and_leave_honest_keep_alive_connections_alone(
    tmp_path: Path,
) -> None:
    limits = ConnectionLimits(header_timeout_s=10.0, max_connections=4, evict_after_s=0.2)
    with started(tmp_path, limits) as rig:
        honest = rig.client()
        slow: list[ssl.SSLSocket] = []
        try:
            assert honest.request("POST", "/webhook", as_body(admission_review({}, uid="before")))[0] == 200
            for _ in range(3):  # the cap, with the honest connection; each sends a partial request line
                sock = rig.raw()
                sock.sendall(b"POST /webh")
                slow.append(sock)
            oldest_since = time.monotonic()
            wait_for(
                lambda: time.monotonic() - oldest_since > 0.3, what="the slow connections to be evictable"
            )
            # A new honest connection evicts the slowest waiter and is served.
            with rig.client() as fresh:
                assert fresh.request("GET", "/healthz") == (200, b"ok\n")
            assert rig.stats.evicted == 1
            assert closed_by_peer(slow[0], 10.0)
            # A flood of slow connections: each is refused, or evicts a waiter of 0.2 s; never over the cap.
            for _ in range(12):
                extra = _try_raw(rig)
                if extra is not None:
                    with contextlib.suppress(OSError):
                        extra.sendall(b"POST /webh")
                    slow.append(extra)
                assert rig.stats.open <= limits.max_connections
            # The honest connection idles between requests, so it is never evicted: it answers on its socket.
            for i in range(3):
                status, body = honest.request(
                    "POST", "/webhook", as_body(admission_review({}, uid=f"during-{i}"))
                )
                assert status == 200 and json.loads(body)["response"]["uid"] == f"during-{i}"
            assert honest.same_socket
        finally:
            honest.close()
            for sock in slow:
                sock.close()
        wait_for(lambda: rig.stats.open == 0, what="every connection released")


def test_a_connection_over_the_cap_is_refused_before_its_handshake_when_none_waits_for_headers(
    tmp_path: Path,
) -> None:
    with started(tmp_path, ConnectionLimits(max_connections=2)) as rig:
        first, second = rig.client(), rig.client()
        try:
            assert first.request("GET", "/healthz")[0] == 200
            assert second.request("GET", "/healthz")[0] == 200
            with pytest.raises(OSError):  # closed during the TLS handshake
                rig.raw()
            assert rig.stats.refused == 1
            assert first.request("GET", "/healthz") == (200, b"ok\n") and first.same_socket
            assert second.request("GET", "/healthz") == (200, b"ok\n") and second.same_socket
        finally:
            first.close()
            second.close()
        wait_for(lambda: rig.stats.open == 0, what="both connections released")
        with rig.client() as again:
            assert again.request("GET", "/healthz")[0] == 200


def test_connections_in_their_tls_handshake_count_against_the_cap_until_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    limits = ConnectionLimits(max_connections=2, tls_handshake_timeout_s=0.5)
    with started(tmp_path, limits) as rig:
        with contextlib.ExitStack() as stack:
            silent = [
                stack.enter_context(socket.create_connection(("127.0.0.1", rig.port), timeout=10))
                for _ in range(2)
            ]
            wait_for(lambda: rig.stats.open == 2, what="both silent connections counted")
            with pytest.raises(OSError):
                rig.raw()
            for sock in silent:
                assert closed_by_peer(sock, 10.0)
        wait_for(lambda: rig.stats.open == 0, what="the silent connections released")
        with rig.client() as c:
            assert c.request("GET", "/healthz") == (200, b"ok\n")
