"""A sync gRPC server on a Unix socket, the way the node daemon's kubelet plugins serve (the device plugin,
`plugin.server`; the DRA plugin's registration and DRA sockets, `dra.server`): bound with a check of the
path's length and of the bind itself, and its socket removed on stop only if it is still the file this
server bound (never a socket another instance bound since)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107
"""The longest Unix socket path Linux takes (sun_path is 108 bytes with the terminating NUL)."""

SocketIdentity = tuple[int, int, int]

MAX_RECEIVE_MESSAGE_BYTES = 1024 * 1024
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
)
"""Channel arguments of every server `start_unix_server` makes: kubelet's messages are a few KB, so a
request over 1 MiB is refused (RESOURCE_EXHAUSTED) before it is decoded. No `grpc.max_concurrent_streams`:
grpcio's sync server keeps the stream of a request it could not deserialize counted against that cap, so
with a cap a client sending a few dozen malformed messages locks its own connection out (REFUSED_STREAM on
every later call; tests/fuzz/test_endpoints.py found it); the sync server's thread pool bounds the work
that runs at once instead."""


class UnixServerError(Exception):
    """The server cannot serve on its socket; the message says why."""


def socket_identity(path: Path) -> SocketIdentity | None:
    """(device, inode, ctime) of the file at `path` now, None when there is none: a file made anew
    differs even when the inode number is reused."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def start_unix_server(
    socket_path: Path,
    add_services: Callable[[grpc.Server], None],
    *,
    max_workers: int,
    thread_name_prefix: str,
) -> tuple[grpc.Server, SocketIdentity | None]:
    """A started server with `add_services` on `unix://<socket_path>` (a stale file there is replaced),
    and the identity of the socket it bound. Raises `UnixServerError`."""
    if len(str(socket_path)) > MAX_SOCKET_PATH:
        raise UnixServerError(
            f"socket path {socket_path} is {len(str(socket_path))} bytes; Unix sockets allow at most "
            f"{MAX_SOCKET_PATH}"
        )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        options=SERVER_OPTIONS,
    )
    add_services(server)
    try:
        port = server.add_insecure_port(f"unix://{socket_path}")
    except RuntimeError as err:
        server.stop(None)
        raise UnixServerError(f"cannot serve on {socket_path}: {err}") from None
    if port != 1:
        server.stop(None)
        raise UnixServerError(f"cannot serve on {socket_path}: bind failed")
    server.start()
    return server, socket_identity(socket_path)


def remove_own_socket(socket_path: Path, identity: SocketIdentity | None) -> None:
    """Remove the socket if it is still the one with `identity` (never a socket bound by someone since)."""
    if identity is None or socket_identity(socket_path) != identity:
        return
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("cannot remove %s: %s", socket_path, err)


__all__ = [
    "MAX_RECEIVE_MESSAGE_BYTES",
    "MAX_SOCKET_PATH",
    "SERVER_OPTIONS",
    "SocketIdentity",
    "UnixServerError",
    "remove_own_socket",
    "socket_identity",
    "start_unix_server",
]
