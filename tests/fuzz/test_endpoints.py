"""Endpoint fuzzing: malformed requests to the real servers, each followed by proof they still serve.

- hami-control (a real process, HTTPS on loopback, against the local API server): the webhooks,
  /filter, /prioritize, /bind and /metrics get invalid JSON, 100,000-deep nesting, oversized bodies,
  wrong content types, truncated TLS handshakes and half-sent requests. A bad request is answered 4xx,
  an AdmissionReview denial, or (extender verbs) the verb's own error answer as kube-scheduler expects,
  never a 5xx; afterwards a good request of every kind succeeds and the process is alive.
- hami-node's gRPC services on real Unix sockets (the device plugin; the DRA plugin and its
  registration service in a node daemon in DRA mode): raw bytes that are not the message, messages
  with unknown fields or wrong wire types, garbage instead of HTTP/2. The answer is a gRPC status and
  the next good call works.
- The local API server stand-in (our test infrastructure) gets a few of the same.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api import dra
from hami_sim.apiserver import ApiServerRunner
from tests.apiserver_util import http
from tests.builders import admission_review, as_body, gpu_info, gpu_pod, node
from tests.control_process_util import ControlProcess, start_control
from tests.control_server_util import KeepAliveClient
from tests.fuzz.strategies import fuzz_settings, json_values, nested_text

WEBHOOK_LIMIT = 3 * 1024 * 1024  # hami-control's default --max-request-body (3Mi)
EXTENDER_LIMIT = 64 * 1024 * 1024  # hami_control.server.EXTENDER_MAX_BODY
POST_ROUTES = ("/webhook", "/webhook/dra", "/filter", "/prioritize", "/bind")


@pytest.fixture(scope="module")
def apiserver_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    with ApiServerRunner() as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
        code, body = http(
            runner.base_url, "POST", "/api/v1/nodes", node("gpu-a", [gpu_info(0, id="GPU-a-0", devmem=16000)])
        )
        assert code == 201, body
        yield runner.base_url, kubeconfig


@pytest.fixture(scope="module")
def control(
    tmp_path_factory: pytest.TempPathFactory, apiserver_url: tuple[str, Path]
) -> Iterator[ControlProcess]:
    process = start_control(tmp_path_factory.mktemp("control"), apiserver_url[1])
    try:
        yield process
    finally:
        code = process.stop()
        # The log may hold tracebacks that are not failures: aiohttp's own for requests its parser
        # refuses (answered 400), and "internal error serving" for a client that left mid-body
        # (ConnectionResetError in read_body; nobody is left to answer).
        assert code == 0, f"hami-control did not stop cleanly:\n{process.log()}"


def client(control: ControlProcess) -> KeepAliveClient:
    return KeepAliveClient(control.port, control.ca.client_context())


GOOD_REVIEW = as_body(admission_review(gpu_pod("p", gpus=1, gpumem=1000), namespace="default"))
GOOD_FILTER = as_body({"Pod": gpu_pod("p", gpus=1, gpumem=1000), "NodeNames": ["gpu-a"]})


def assert_serving(control: ControlProcess) -> None:
    """A good request of every kind succeeds on a fresh connection, and the process is alive."""
    assert control.proc.poll() is None, control.log()
    with client(control) as c:
        assert c.request("GET", "/readyz")[0] == 200
        status, body = c.request("POST", "/webhook", GOOD_REVIEW, {"Content-Type": "application/json"})
        assert status == 200, body
        assert json.loads(body)["response"]["allowed"] is True
        status, body = c.request("POST", "/filter", GOOD_FILTER, {"Content-Type": "application/json"})
        assert status == 200, body
        assert json.loads(body)["Error"] == "" and json.loads(body)["NodeNames"] == ["gpu-a"]
        status, body = c.request("POST", "/prioritize", GOOD_FILTER, {"Content-Type": "application/json"})
        assert status == 200 and json.loads(body)[0]["Host"] == "gpu-a", body
        status, body = c.request("GET", "/metrics")
        assert status == 200 and b"hami" in body


def assert_refused(route: str, status: int, body: bytes) -> None:
    """4xx, or the answer of a verb that refused the request (never a 5xx, never an internal error)."""
    assert status < 500, (route, status, body[:300])
    assert b"internal error" not in body, (route, body[:300])
    if status >= 400:
        return
    answer = json.loads(body)
    if route.startswith("/webhook"):
        assert answer["response"]["allowed"] is False, answer
    elif route == "/prioritize":
        assert answer == [], answer
    else:
        assert answer["Error"], answer


DEEP_ARRAYS = nested_text(100_000).encode()
DEEP_OBJECTS = ('{"a":' * 100_000 + "1" + "}" * 100_000).encode()
BAD_BODIES = {
    "empty": b"",
    "invalid-json": b'{"apiVersion": ',
    "not-utf8": b"\xff\xfe\x00{",
    "json-scalar": b"42",
    "json-null": b"null",
    "nul-bytes": b"\x00" * 64,
    "deep-arrays": DEEP_ARRAYS,
    "deep-objects": DEEP_OBJECTS,
    "deep-cut-off": b"[" * 100_000,
    "huge-number": b'{"NodeNames": [' + b"9" * 5000 + b"]}",
    "duplicate-keys": b'{"Pod": {}, "Pod": 1, "NodeNames": ["gpu-a"], "NodeNames": 7}',
    "nan": b'{"NodeNames": [NaN]}',
}


@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_malformed_body_is_refused_and_the_server_keeps_serving(
    control: ControlProcess, route: str, name: str
) -> None:
    with client(control) as c:
        status, body = c.request("POST", route, BAD_BODIES[name], {"Content-Type": "application/json"})
    assert_refused(route, status, body)


@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""]
)
def test_a_wrong_content_type_does_not_break_the_server(
    control: ControlProcess, route: str, content_type: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    with client(control) as c:
        status, body = c.request("POST", route, b"a=1&b=2", headers)
        assert_refused(route, status, body)
        # what kube-apiserver and kube-scheduler send decides the answer, not the label on it
        status, _ = c.request("POST", "/webhook", GOOD_REVIEW, headers)
        assert status == 200


def test_deep_node_objects_echoed_by_filter_are_answered(control: ControlProcess) -> None:
    """kube-scheduler without nodeCacheCapable sends whole Nodes, and /filter answers with them: a Node
    nested deeper than orjson writes (255 levels) is refused, not answered with a 500."""
    deep_node = {"metadata": {"name": "gpu-a"}, "status": json.loads(nested_text(400))}
    args = {"Pod": gpu_pod("p", gpus=1, gpumem=1000), "Nodes": {"items": [deep_node]}}
    with client(control) as c:
        for route in ("/filter", "/prioritize"):
            status, body = c.request("POST", route, as_body(args), {"Content-Type": "application/json"})
            assert status < 500, body[:300]
    assert_serving(control)


@pytest.mark.parametrize("route", POST_ROUTES)
def test_an_oversized_body_is_refused_from_its_content_length(control: ControlProcess, route: str) -> None:
    limit = WEBHOOK_LIMIT if route.startswith("/webhook") else EXTENDER_LIMIT
    with tls_socket(control) as sock:
        sock.sendall(
            f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {limit + 1}\r\n\r\n".encode()
        )
        head = read_until_closed_or(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_a_webhook_body_over_the_limit_sent_in_full_is_refused(control: ControlProcess) -> None:
    body = b'{"a": "' + b"x" * WEBHOOK_LIMIT + b'"}'
    with client(control) as c:
        status, _ = c.request("POST", "/webhook", body, {"Content-Type": "application/json"})
    assert status == 413
    assert_serving(control)


def test_a_chunked_body_over_the_limit_is_refused(control: ControlProcess) -> None:
    chunk = b"x" * (1024 * 1024)
    with tls_socket(control) as sock:
        sock.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(5):
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server may close once it has refused
        head = read_until_closed_or(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert_serving(control)


@pytest.mark.parametrize(
    ("method", "path", "headers", "expect"),
    [
        ("POST", "/metrics", {}, 405),
        ("DELETE", "/webhook", {}, 405),
        ("GET", "/filter", {}, 405),
        ("GET", "/nowhere", {}, 404),
        ("GET", "/metrics", {"Accept-Encoding": "gzip;q=abc, br, *;q=-1"}, 200),
        ("GET", "/metrics", {"Accept": "application/openmetrics-text; version=99"}, 200),
    ],
)
def test_odd_requests_for_the_other_routes_get_their_status(
    control: ControlProcess, method: str, path: str, headers: dict[str, str], expect: int
) -> None:
    with client(control) as c:
        status, _ = c.request(method, path, None, headers)
    assert status == expect


# --- below HTTP: TLS and the request line -------------------------------------------------------------


class tls_socket:
    """A TLS connection to hami-control, closed on exit."""

    def __init__(self, control: ControlProcess) -> None:
        raw = socket.create_connection(("127.0.0.1", control.port), timeout=10)
        self.sock = control.ca.client_context().wrap_socket(raw, server_hostname="localhost")

    def __enter__(self) -> ssl.SSLSocket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def read_until_closed_or(sock: socket.socket, marker: bytes, limit: float = 10.0) -> bytes:
    data = b""
    deadline = time.monotonic() + limit
    while marker not in data and time.monotonic() < deadline:
        try:
            more = sock.recv(65536)
        except OSError:  # a timeout, a TLS error, a reset: the server is done with us
            break
        if not more:
            break
        data += more
    return data


def client_hello() -> bytes:
    """The first bytes of a real TLS handshake (a ClientHello), made with a memory BIO."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize(
    "opening",
    [
        b"",  # connect and close
        b"\x16\x03\x01",  # a TLS record header, cut short
        b"half-hello",  # replaced below by half of a real ClientHello
        b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",  # plain HTTP on the TLS port
        b"\x00" * 4096,
        b"\x16\x03\x03\xff\xff" + b"\x01" * 1000,  # a record that claims 64 KiB and stops
    ],
    ids=["connect-close", "record-header", "half-client-hello", "plain-http", "zeros", "long-record"],
)
def test_a_truncated_or_foreign_tls_handshake_leaves_the_server_serving(
    control: ControlProcess, opening: bytes
) -> None:
    if opening == b"half-hello":
        hello = client_hello()
        opening = hello[: len(hello) // 2]
    with socket.create_connection(("127.0.0.1", control.port), timeout=10) as raw:
        if opening:
            raw.sendall(opening)
        raw.shutdown(socket.SHUT_WR)
        read_until_closed_or(raw, b"\x00never\x00", limit=2.0)
    assert_serving(control)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + GOOD_REVIEW[:10],
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Len",
        b"POST /bind HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
        b"POST /prioritize HTTP/1.1\r\n" + b"X-Long: " + b"a" * 100_000 + b"\r\n\r\n",
        b"GARBAGE /\x00\xff HTTP/9.9\r\n\r\n",
        b"POST /webhook HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /webhook HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
    ],
    ids=[
        "body-cut-short",
        "header-cut-short",
        "chunk-cut-short",
        "huge-header",
        "bad-request-line",
        "negative-length",
        "two-lengths",
    ],
)
def test_a_half_sent_or_broken_request_leaves_the_server_serving(
    control: ControlProcess, request_bytes: bytes
) -> None:
    with tls_socket(control) as sock:
        # The server may answer 400 and close before the whole request is sent (a header over aiohttp's
        # 8190-byte limit): the rest of the write then fails, which is the server's right.
        with contextlib.suppress(OSError):
            sock.sendall(request_bytes)
        with contextlib.suppress(OSError):  # a TLS close_notify: the client is gone mid-request
            sock.shutdown(socket.SHUT_WR)
        answer = read_until_closed_or(sock, b"\r\n\r\n", limit=2.0)
    assert not answer.startswith(b"HTTP/1.1 5"), answer[:200]
    assert_serving(control)


# --- random bodies over one keep-alive connection -----------------------------------------------------

_bodies = (
    st.binary(max_size=2000)
    | json_values(leaves=40).map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries(
        {},
        optional={
            "Pod": json_values(leaves=10),
            "NodeNames": json_values(leaves=10),
            "Nodes": json_values(leaves=10),
            "PodName": json_values(leaves=3),
            "PodNamespace": json_values(leaves=3),
            "PodUID": json_values(leaves=3),
            "Node": json_values(leaves=3),
            "apiVersion": st.sampled_from(["admission.k8s.io/v1"]),
            "kind": st.sampled_from(["AdmissionReview"]),
            "request": json_values(leaves=20),
        },
    ).map(lambda v: json.dumps(v).encode())
)


@fuzz_settings
@given(route=st.sampled_from(POST_ROUTES), body=_bodies)
def test_random_bodies_on_every_route_are_answered_below_500(
    control: ControlProcess, route: str, body: bytes
) -> None:
    with client(control) as c:
        status, answer = c.request("POST", route, body, {"Content-Type": "application/json"})
    assert_refused_or_answered(route, status, answer)


def assert_refused_or_answered(route: str, status: int, body: bytes) -> None:
    assert status < 500, (route, status, body[:300])
    assert b"internal error" not in body, (route, body[:300])


def test_the_server_still_serves_after_the_fuzzing(control: ControlProcess) -> None:
    assert_serving(control)


# --- hami-node's gRPC services on Unix sockets ----------------------------------------------------------

DEVICE_PLUGIN_METHODS = (
    "/v1beta1.DevicePlugin/GetDevicePluginOptions",
    "/v1beta1.DevicePlugin/Allocate",
    "/v1beta1.DevicePlugin/GetPreferredAllocation",
    "/v1beta1.DevicePlugin/PreStartContainer",
)
DRA_METHODS = (
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
)
# Bytes that are not the message: cut-off fields, wrong wire types, unknown fields, groups nested past
# protobuf's recursion limit, a length that runs past the end, a varint that never ends.
BAD_MESSAGES = {
    "garbage": b"\xff\xff\xff\xff",
    "cut-off-string": b"\x0a\x05ab",
    "wrong-wire-type-varint-for-message": b"\x0a\x00\x08\x01" + b"\x0a\x02\x08\x01",
    "wrong-wire-type-fixed64": b"\x09" + b"\x00" * 8,
    "unknown-fields": b"\xa0\x06\x01\xaa\x06\x03abc\xb5\x06\x00\x00\x00\x00",
    "deep-groups": b"\x0b" * 200 + b"\x0c" * 200,
    "deep-messages": b"\x0a\x7f" * 120,
    "huge-length": b"\x0a\xff\xff\xff\xff\x0f",
    "endless-varint": b"\x08" + b"\xff" * 20,
    "empty": b"",
}


def call_raw(channel: Any, method: str, payload: bytes) -> Any:
    """One unary call with `payload` as the request's bytes: the response bytes, or the grpc.RpcError."""
    try:
        return channel.unary_unary(method)(payload, timeout=10)
    except grpc.RpcError as err:
        return err


def assert_grpc_answer(method: str, outcome: Any) -> None:
    """An answer or a gRPC status; UNKNOWN is what grpc sends when the servicer itself raised."""
    if isinstance(outcome, grpc.RpcError):
        code, details = outcome.code(), outcome.details() or ""  # type: ignore[attr-defined]
        if method.endswith("/NotifyRegistrationStatus") and details.startswith("failed registration process"):
            return  # kubelet said registration failed: the error the upstream helper returns for it
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE), (method, outcome)
        assert "Exception calling application" not in details, (method, details)
    else:
        assert isinstance(outcome, bytes)


class NoPendingPods:
    """A `hami_node.ports.PodSource` with no pod waiting for devices: Allocate fails with
    NoPendingPodError, which the plugin answers as a gRPC status."""

    def match(self, device_count: int) -> Any:
        from hami_node.allocation import match_pending_pod

        found = match_pending_pod((), device_count)
        assert not hasattr(found, "pod")
        raise found.error("node-a")  # type: ignore[union-attr]

    def steering_gpus(self, device_count: int) -> tuple[str, ...]:
        return ()

    def pod_object(self, pod: Any) -> dict[str, object]:
        raise AssertionError("no pod is pending")

    def allocated(self, match: Any, granted: Any = None) -> None:
        raise AssertionError("no pod is pending")


@pytest.fixture(scope="module")
def device_plugin() -> Iterator[Path]:
    import shutil
    import tempfile

    from hami_node.config import NodeConfig
    from hami_node.devices import DeviceState
    from hami_node.plugin.server import PluginServer

    base = Path(tempfile.mkdtemp(prefix="hf-", dir="/tmp"))  # Unix socket paths: ~107 bytes at most
    (base / "hook").mkdir()
    config = NodeConfig(
        node_name="node-a", kubelet_dir=base, hook_path=str(base / "hook"), device_split_count=3
    )
    server = PluginServer(config, DeviceState(config), NoPendingPods())
    server.start()
    try:
        yield server.socket_path
    finally:
        close_channels(server.socket_path)
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def dra_plugin(apiserver_url: tuple[str, Path]) -> Iterator[tuple[Path, Path]]:
    from hami_node.gpu.inventory import generate_inventory
    from tests.dra_node_util import make_dra_rig
    from tests.waiting import wait_for

    rigs = make_dra_rig(
        "dra-fuzz", apiserver_url[1], apiserver_url[0], generate_inventory(2, seed="dra-fuzz")
    )
    rig = next(rigs)
    try:
        rig.start()
        wait_for(lambda: rig.dra_socket.exists() and rig.registration_socket.exists(), 20, "the DRA sockets")
        yield rig.registration_socket, rig.dra_socket
    finally:
        close_channels(rig.registration_socket, rig.dra_socket)
        rigs.close()


_CHANNELS: dict[Path, Any] = {}


def grpc_channel(path: Path) -> Any:
    """One channel per socket for the module (a fresh HTTP/2 connection per call would make these tests
    slow); the fixtures close them. A call that broke the connection is seen by the next good call."""
    if path not in _CHANNELS:
        channel = grpc.insecure_channel(f"unix://{path}")
        grpc.channel_ready_future(channel).result(timeout=10)
        _CHANNELS[path] = channel
    return _CHANNELS[path]


def close_channels(*paths: Path) -> None:
    for path in paths:
        channel = _CHANNELS.pop(path, None)
        if channel is not None:
            channel.close()


def assert_device_plugin_serves(path: Path) -> None:
    from hami_node.plugin.api import api_pb2, api_pb2_grpc

    channel = grpc_channel(path)
    options = api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
    assert options.get_preferred_allocation_available


def assert_dra_plugin_serves(registration: Path, dra_socket: Path) -> None:
    from hami_node.dra.api.registration import api_pb2 as reg_pb2
    from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
    from hami_node.dra.api.v1 import api_pb2 as v1_pb2
    from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc

    channel = grpc_channel(registration)
    info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=10)
    assert info.name == dra.DRIVER
    channel = grpc_channel(dra_socket)
    answer = v1_grpc.DRAPluginStub(channel).NodePrepareResources(
        v1_pb2.NodePrepareResourcesRequest(), timeout=10
    )
    assert dict(answer.claims) == {}


@pytest.mark.parametrize("name", sorted(BAD_MESSAGES))
@pytest.mark.parametrize("method", DEVICE_PLUGIN_METHODS)
def test_the_device_plugin_answers_bytes_that_are_not_its_message_with_a_status(
    device_plugin: Path, method: str, name: str
) -> None:
    channel = grpc_channel(device_plugin)
    assert_grpc_answer(method, call_raw(channel, method, BAD_MESSAGES[name]))
    assert_device_plugin_serves(device_plugin)


@pytest.mark.parametrize("name", sorted(BAD_MESSAGES))
@pytest.mark.parametrize("method", DRA_METHODS)
def test_the_dra_plugin_answers_bytes_that_are_not_its_message_with_a_status(
    dra_plugin: tuple[Path, Path], method: str, name: str
) -> None:
    registration, dra_socket = dra_plugin
    path = registration if "Registration" in method else dra_socket
    channel = grpc_channel(path)
    assert_grpc_answer(method, call_raw(channel, method, BAD_MESSAGES[name]))
    assert_dra_plugin_serves(registration, dra_socket)


@pytest.mark.parametrize(
    "opening",
    [
        b"",
        b"GET / HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04",
        b"\xff" * 4096,
    ],
    ids=["connect-close", "http1", "half-http2-preface", "garbage"],
)
def test_garbage_instead_of_http2_on_the_sockets_leaves_the_plugins_serving(
    device_plugin: Path, dra_plugin: tuple[Path, Path], opening: bytes
) -> None:
    for path in (device_plugin, *dra_plugin):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(5)
            raw.connect(str(path))
            if opening:
                raw.sendall(opening)
            raw.shutdown(socket.SHUT_WR)
            read_until_closed_or(raw, b"\x00never\x00", limit=2.0)
    assert_device_plugin_serves(device_plugin)
    assert_dra_plugin_serves(*dra_plugin)


def _with_unknown_fields(message: bytes, extra: bytes) -> bytes:
    return message + extra


@fuzz_settings
@given(
    method=st.sampled_from(DEVICE_PLUGIN_METHODS + DRA_METHODS),
    payload=st.binary(max_size=300)
    | st.builds(_with_unknown_fields, st.sampled_from(list(BAD_MESSAGES.values())), st.binary(max_size=40)),
)
def test_random_bytes_to_every_grpc_method_get_an_answer_or_a_status(
    device_plugin: Path, dra_plugin: tuple[Path, Path], method: str, payload: bytes
) -> None:
    if method.startswith("/v1beta1.DevicePlugin"):
        path = device_plugin
    else:
        path = dra_plugin[0] if "Registration" in method else dra_plugin[1]
    channel = grpc_channel(path)
    assert_grpc_answer(method, call_raw(channel, method, payload))


def test_the_plugins_still_serve_after_the_fuzzing(
    device_plugin: Path, dra_plugin: tuple[Path, Path]
) -> None:
    close_channels(device_plugin, *dra_plugin)  # new connections, not only the ones kept open
    assert_device_plugin_serves(device_plugin)
    assert_dra_plugin_serves(*dra_plugin)


# --- the local API server stand-in (our test infrastructure) ------------------------------------------

APISERVER_BODIES = {
    "invalid-json": b'{"metadata": ',
    "deep-arrays": DEEP_ARRAYS,
    "deep-objects": DEEP_OBJECTS,
    "not-utf8": b"\xff\xfe{",
    "json-scalar": b"7",
    "huge-number": b'{"metadata": {"name": "p", "generation": ' + b"9" * 5000 + b"}}",
    "wrong-kind": b'{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "p"}}',
}


@pytest.mark.parametrize("name", sorted(APISERVER_BODIES))
@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", "/api/v1/namespaces/default/pods", "application/json"),
        ("PUT", "/api/v1/nodes/gpu-a", "application/json"),
        ("PATCH", "/api/v1/nodes/gpu-a", "application/merge-patch+json"),
        ("PATCH", "/api/v1/nodes/gpu-a", "application/json-patch+json"),
        ("POST", "/api/v1/namespaces/default/pods", "text/plain"),
    ],
)
def test_the_local_api_server_refuses_malformed_bodies_and_keeps_serving(
    apiserver_url: tuple[str, Path], method: str, path: str, content_type: str, name: str
) -> None:
    base_url = apiserver_url[0]
    status, body = http(base_url, method, path, APISERVER_BODIES[name], content_type=content_type)
    assert 400 <= status < 500, (status, body)
    status, node_object = http(base_url, "GET", "/api/v1/nodes/gpu-a")
    assert status == 200 and node_object["metadata"]["name"] == "gpu-a"
