"""Registering the device plugin with kubelet (`Registration.Register` on kubelet.sock).

Kubelet's Register handler dials the plugin's socket back (10 s, blocking) and calls
GetDevicePluginOptions before it returns, so the plugin must already be serving: `register()` first
checks that by calling GetDevicePluginOptions on our own socket (`check_serving`), then calls Register
with version v1beta1, the socket's file name as endpoint, the resource name, and the same options
GetDevicePluginOptions answers. Every step has a bounded timeout and fails with a `RegistrationError`
that says which step and why ("kubelet is not serving: .../kubelet.sock does not exist", "kubelet is not
serving: nothing accepted a connection on .../kubelet.sock within 15 s", "kubelet (...) refused to
register nvidia.com/gpu at endpoint ...: UNAVAILABLE: ...").

Readiness is never probed with a bare connection: a gRPC server that accepts a connection which sends no
HTTP/2 client preface logs an error for it (kubelet's grpc-go: "failed to receive the preface from
client"). The socket file is checked with `stat`, and the only connections made are gRPC calls, which
wait for the socket to accept (`wait_for_ready`) under a deadline.
"""

from __future__ import annotations

import logging
import stat
import threading
from pathlib import Path

import grpc

from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.plugin.api.constants import VERSION
from hami_node.plugin.server import plugin_options

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0
"""How long to wait for a socket to accept a connection (NVIDIA's plugin uses 5 s)."""
REGISTER_TIMEOUT_S = 15.0
"""Deadline of the Register call: above kubelet's own 10 s dial back to the plugin."""

CHANNEL_OPTIONS = (
    # gRPC shares subchannels between channels to the same address by default, so one failed dial
    # (kubelet not up yet) would put the next registration into that subchannel's reconnect backoff
    # (1 s and growing). Each dial here gets its own, and retries fast while it waits.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
)
"""Options of the channels that dial kubelet.sock and our own socket."""


class RegistrationError(Exception):
    """Registering with kubelet failed; the message says which step and why."""


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(err, "code", None)
    return code() if callable(code) else None


def _describe(err: grpc.RpcError) -> str:
    """`CODE: details` of a failed call (the errors raised by calls are also `grpc.Call`s)."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    name = code().name if callable(code) else "error"
    return f"{name}: {details() if callable(details) else err}"


def _require_socket(socket_path: Path, what: str) -> None:
    """The socket file must exist: looked at with `stat`, never by connecting to it."""
    try:
        mode = socket_path.stat().st_mode
    except FileNotFoundError:
        raise RegistrationError(f"{what}: {socket_path} does not exist") from None
    except OSError as err:
        raise RegistrationError(f"{what}: cannot look at {socket_path}: {err.strerror or err}") from None
    if not stat.S_ISSOCK(mode):
        raise RegistrationError(f"{what}: {socket_path} is not a socket")


def _connectivity(channel: grpc.Channel, wait_s: float = 1.0) -> grpc.ChannelConnectivity | None:
    """The channel's current connectivity (None when gRPC does not say within `wait_s`). Only used to
    explain a failed call: a subscription makes closing the channel take ~0.2 s."""
    seen: list[grpc.ChannelConnectivity] = []
    event = threading.Event()

    def note(state: grpc.ChannelConnectivity) -> None:
        seen.append(state)
        event.set()

    channel.subscribe(note, try_to_connect=False)
    try:
        event.wait(wait_s)
    finally:
        channel.unsubscribe(note)
    return seen[0] if seen else None


def _timed_out(
    channel: grpc.Channel, socket_path: Path, what: str, timeout_s: float, call: str
) -> RegistrationError | None:
    """The error for a call that hit its deadline while nothing had accepted a connection (else None)."""
    if _connectivity(channel) is grpc.ChannelConnectivity.READY:
        return None
    return RegistrationError(
        f"{what}: nothing accepted a connection on {socket_path} within {timeout_s:g} s "
        f"(waited to call {call})"
    )


def check_serving(socket_path: Path, timeout_s: float = DIAL_TIMEOUT_S) -> None:
    """Call GetDevicePluginOptions on our own socket, as kubelet is about to.
    Raises `RegistrationError` when the plugin does not answer within `timeout_s`."""
    what = "the plugin is not serving"
    _require_socket(socket_path, what)
    # No channel_ready_future: its connectivity poller makes closing the channel take 0.2 s.
    with grpc.insecure_channel(f"unix://{socket_path}", options=CHANNEL_OPTIONS) as channel:
        try:
            api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                api_pb2.Empty(), timeout=timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as err:
            if _code(err) is grpc.StatusCode.DEADLINE_EXCEEDED:
                unreachable = _timed_out(channel, socket_path, what, timeout_s, "GetDevicePluginOptions")
                if unreachable is not None:
                    raise unreachable from None
            raise RegistrationError(
                f"the plugin on {socket_path} does not answer GetDevicePluginOptions: {_describe(err)}"
            ) from None


def register(
    kubelet_socket: Path,
    plugin_socket: Path,
    resource_name: str,
    *,
    dial_timeout_s: float = DIAL_TIMEOUT_S,
    register_timeout_s: float = REGISTER_TIMEOUT_S,
) -> None:
    """Register the plugin serving on `plugin_socket` (in kubelet's directory) for `resource_name`.
    Raises `RegistrationError`."""
    if plugin_socket.parent.resolve() != kubelet_socket.parent.resolve():
        raise RegistrationError(
            f"the plugin socket {plugin_socket} is not in kubelet's directory {kubelet_socket.parent}"
        )
    check_serving(plugin_socket, dial_timeout_s)
    what = "kubelet is not serving"
    _require_socket(kubelet_socket, what)
    request = api_pb2.RegisterRequest(
        version=VERSION,
        endpoint=plugin_socket.name,
        resource_name=resource_name,
        options=plugin_options(),
    )
    with grpc.insecure_channel(f"unix://{kubelet_socket}", options=CHANNEL_OPTIONS) as channel:
        try:
            api_pb2_grpc.RegistrationStub(channel).Register(
                request, timeout=register_timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as err:
            if _code(err) is grpc.StatusCode.DEADLINE_EXCEEDED:
                unreachable = _timed_out(channel, kubelet_socket, what, register_timeout_s, "Register")
                if unreachable is not None:
                    raise unreachable from None
            raise RegistrationError(
                f"kubelet ({kubelet_socket}) refused to register {resource_name} at endpoint "
                f"{plugin_socket.name}: {_describe(err)}"
            ) from None
    log.info(
        "registered %s with kubelet (%s, endpoint %s)", resource_name, kubelet_socket, plugin_socket.name
    )


__all__ = [
    "CHANNEL_OPTIONS",
    "DIAL_TIMEOUT_S",
    "REGISTER_TIMEOUT_S",
    "RegistrationError",
    "check_serving",
    "register",
]
