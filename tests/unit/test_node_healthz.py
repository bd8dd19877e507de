"""hami_node.healthz: the /healthz and /readyz endpoint over real sockets on loopback (status, reasons,
HEAD, unknown paths, a failing check, a port in use, a clean stop), and its wiring in the daemon:
a real `start_daemon` with fake GPUs answers 503 naming what is missing until kubelet (the stand-in)
appears, then 200."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_node.config import load_config
from hami_node.gpu.inventory import generate_inventory
from hami_node.healthz import HealthServer, HealthServerError, Probe, evaluate
from hami_node.main import NodeDaemon, StartupError, start_daemon
from tests.builders import node
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import NodeRig, make_rig
from tests.waiting import closed_by_peer, wait_for

NODE = "healthz-node"


def get(port: int, path: str, method: str = "GET", host: str = "127.0.0.1") -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


class Flag:
    """A check whose answer the test sets."""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason

    def __call__(self) -> str | None:
        return self.reason


@contextlib.contextmanager
def serving(server: HealthServer) -> Iterator[HealthServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# --- the server on its own ----------------------------------------------------------------------------


def test_evaluate_lists_every_failing_probe_in_order() -> None:
    assert evaluate([]) == (200, "ok\n")
    assert evaluate([Probe("a", Flag()), Probe("b", Flag())]) == (200, "ok\n")
    status, body = evaluate([Probe("a", Flag("down")), Probe("b", Flag()), Probe("c", Flag("late"))])
    assert (status, body) == (503, "a: down\nc: late\n")


def test_healthz_and_readyz_follow_their_checks() -> None:
    live, registered, inventory = Flag("the gRPC server is not serving"), Flag("not registered"), Flag("no")
    server = HealthServer(
        "127.0.0.1",
        0,
        live=[Probe("plugin", live)],
        ready=[Probe("kubelet", registered), Probe("inv", inventory)],
        poll_interval_s=0.05,
    )
    with serving(server):
        port = server.port
        assert port > 0
        assert get(port, "/healthz") == (503, "plugin: the gRPC server is not serving\n")
        assert get(port, "/readyz") == (503, "kubelet: not registered\ninv: no\n")
        live.reason = None
        registered.reason = None
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (503, "inv: no\n")
        inventory.reason = None
        assert get(port, "/readyz") == (200, "ok\n")
        assert get(port, "/readyz?verbose=1") == (200, "ok\n")  # kubelet may add a query
        # A probe turning bad turns the answer at once (no caching).
        registered.reason = "kubelet restarted"
        assert get(port, "/readyz") == (503, "kubelet: kubelet restarted\n")


def test_head_unknown_path_and_other_methods() -> None:
    server = HealthServer("127.0.0.1", 0, live=[], ready=[Probe("x", Flag("not yet"))], poll_interval_s=0.05)
    with serving(server):
        assert get(server.port, "/healthz", "HEAD") == (200, "")
        assert get(server.port, "/readyz", "HEAD") == (503, "")
        status, body = get(server.port, "/metrics")
        assert status == 404
        assert "/healthz" in body
        assert get(server.port, "/healthz", "POST")[0] == 501


def test_a_check_that_raises_fails_with_its_exception(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> str | None:
        raise RuntimeError("boom")

    server = HealthServer("127.0.0.1", 0, live=[Probe("plugin", broken)], ready=[], poll_interval_s=0.05)
    with serving(server):
        status, body = get(server.port, "/healthz")
    assert status == 503
    assert body == "plugin: check failed: RuntimeError('boom')\n"
    assert "health check plugin failed" in caplog.text


def test_port_in_use_names_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer("127.0.0.1", port, live=[], ready=[])
        with pytest.raises(HealthServerError, match=rf"--health-bind 127\.0\.0\.1:{port}: cannot listen"):
            server.start()
        server.stop()  # nothing started: a no-op


def test_stop_closes_the_socket_and_is_idempotent() -> None:
    server = HealthServer("127.0.0.1", 0, live=[], ready=[], poll_interval_s=0.05)
    server.start()
    port = server.port
    assert get(port, "/healthz") == (200, "ok\n")
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    server.stop()
    server.stop()
    assert server.port == 0
    assert refused(port)


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    server = HealthServer("::1", 0, live=[], ready=[], poll_interval_s=0.05)
    with serving(server):
        assert get(server.port, "/healthz", host="::1") == (200, "ok\n")


def test_a_request_sent_a_byte_at_a_time_is_cut_at_the_header_timeout() -> None:
    """The deadline holds across reads: a byte every 20 ms never lets one read time out, yet the
    connection is closed once the whole request has taken longer than the header timeout."""
    server = HealthServer("127.0.0.1", 0, live=[], ready=[], poll_interval_s=0.05, header_timeout_s=0.5)
    with serving(server):
        # Before the connect: the server's deadline starts once it has accepted the connection, which
        # may be before create_connection returns here.
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            request = b"GET /healthz HTTP/1.0\r\nX-Slow: " + b"a" * 2000 + b"\r\n\r\n"
            closed = False
            for byte in request:
                try:
                    sock.send(bytes([byte]))
                except ConnectionError:
                    closed = True
                    break
                if closed_by_peer(sock, 0.02):  # False on any answer bytes: only EOF or a reset counts
                    closed = True
                    break
                assert time.monotonic() - started < 10, "the slow request was never cut"
            assert closed
            assert time.monotonic() - started >= 0.5
        # An honest probe is still answered.
        assert get(server.port, "/healthz") == (200, "ok\n")


def test_connections_over_the_cap_evict_the_oldest_still_reading_or_are_refused() -> None:
    server = HealthServer("127.0.0.1", 0, live=[], ready=[], poll_interval_s=0.05, max_connections=3)
    with serving(server), contextlib.ExitStack() as stack:
        slow = [
            stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            for _ in range(3)
        ]
        for sock in slow:
            sock.sendall(b"GET /hea")
        # A probe over the cap evicts the oldest slow connection and is answered.
        assert get(server.port, "/healthz") == (200, "ok\n")
        assert server.evicted == 1
        assert closed_by_peer(slow[0], 10.0)
        wait_for(lambda: server.evicted == 1 and server.refused == 0, what="no more evictions")
    # Three connections past their request (their answers blocked by a check that waits): a fourth is refused.
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def blocked() -> str | None:
        entered.release()
        gate.wait(10)
        return None

    server = HealthServer(
        "127.0.0.1", 0, live=[Probe("slow", blocked)], ready=[], poll_interval_s=0.05, max_connections=3
    )
    with serving(server), concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = [pool.submit(get, server.port, "/healthz") for _ in range(3)]
        for _ in range(3):
            assert entered.acquire(timeout=10)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as fourth:
            assert closed_by_peer(fourth, 10.0)
        assert server.refused == 1
        gate.set()
        assert [a.result(10) for a in answers] == [(200, "ok\n")] * 3


# --- wired into the daemon ------------------------------------------------------------------------------


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    """One node whose kubelet stand-in is not started yet (its directory does not exist)."""
    yield from make_rig(NODE, apiserver.kubeconfig, generate_inventory(2, seed=NODE), start_kubelet=False)


def daemon_config(rig: NodeRig, bind: str) -> Any:
    args = [*rig.base_args(), "--log-level", "info", "--health-bind", bind]
    return load_config(args, {}, lambda path: path.read_text(encoding="utf-8"))


def wait_answer(port: int, path: str, expected: tuple[int, str], timeout: float = 20.0) -> None:
    """Until GET `path` answers `expected` (status, body)."""
    wait_for(
        lambda: get(port, path) == expected,
        timeout,
        f"GET {path} to answer {expected!r}",
        detail=lambda: f"it answers {get(port, path)!r}",
    )


def test_daemon_is_unready_until_kubelet_registers_it(rig: NodeRig, core_v1: Any) -> None:
    # The Node exists (so the inventory annotation can be written) but kubelet is not running yet.
    core_v1.create_node(node(NODE, ready=None))
    daemon: NodeDaemon = start_daemon(daemon_config(rig, "127.0.0.1:0"))
    try:
        assert daemon.health_endpoint is not None
        port = daemon.health_endpoint.port
        # Without kubelet's directory the plugin does not serve yet; the inventory is written anyway.
        wait_answer(port, "/readyz", (503, "kubelet: not registered with kubelet\n"))
        assert get(port, "/healthz") == (503, "device plugin: the gRPC server is not serving\n")

        rig.kubelet.start()
        rig.wait_devices(lambda r: r.connected and r.allocatable == 20, 20.0)
        wait_answer(port, "/readyz", (200, "ok\n"))
        assert get(port, "/healthz") == (200, "ok\n")
    finally:
        daemon.stop()
    assert refused(port)


def test_daemon_without_health_bind_serves_no_endpoint(rig: NodeRig) -> None:
    config = load_config(rig.base_args(), {}, lambda path: path.read_text(encoding="utf-8"))
    assert config.health_bind is None
    daemon = start_daemon(config)
    try:
        assert daemon.health_endpoint is None
        assert "health endpoint" not in [name for name, _ in daemon.stops]
    finally:
        daemon.stop()


def test_daemon_with_the_port_taken_fails_start_up_naming_it(rig: NodeRig, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=rf"--health-bind 127\.0\.0\.1:{port}: cannot listen"):
            start_daemon(daemon_config(rig, f"127.0.0.1:{port}"))
