"""Helpers for the hami-control server tests: certificates on disk (plain files or laid out like a
Kubernetes Secret volume with its `..data` symlink), a server on its own event loop in a thread, and a
raw keep-alive HTTPS client that can tell which certificate a connection got."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import os
import ssl
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from cryptography import x509

from hami_sim.tls import client_ssl_context, generate_ca, generate_serving_cert

T = TypeVar("T")


@dataclass(frozen=True)
class CA:
    cert: bytes
    key: bytes

    @classmethod
    def new(cls, name: str = "hami-control-test-ca") -> CA:
        return cls(*generate_ca(name))

    def serving(self, common_name: str) -> tuple[bytes, bytes]:
        return generate_serving_cert(
            self.cert, self.key, ["localhost"], ["127.0.0.1"], common_name=common_name
        )

    def client_context(self) -> ssl.SSLContext:
        return client_ssl_context(self.cert)


def write_pair(directory: Path, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    """Write tls.crt/tls.key in place (what a hand-run rotation does)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair[0])
    key.write_bytes(pair[1])
    return cert, key


class SecretVolume:
    """A directory laid out as kubelet lays out a Secret volume: `tls.crt -> ..data/tls.crt`,
    `..data -> ..<timestamp>/`; `update()` writes a new timestamped directory and swaps `..data`
    atomically (rename of a symlink), then removes the old one, as kubelet's AtomicWriter does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.root / "tls.key"

    def update(self, pair: tuple[bytes, bytes]) -> None:
        self.generation += 1
        data_dir = self.root / f"..2026_11_22_00_00_{self.generation:02d}.000000001"
        data_dir.mkdir()
        (data_dir / "tls.crt").write_bytes(pair[0])
        (data_dir / "tls.key").write_bytes(pair[1])
        link = self.root / "..data"
        old = os.readlink(link) if link.is_symlink() else None
        tmp = self.root / "..data_tmp"
        os.symlink(data_dir.name, tmp)
        os.replace(tmp, link)
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if old is not None:
            for child in (self.root / old).iterdir():
                child.unlink()
            (self.root / old).rmdir()


def peer_certificate(sock: Any) -> x509.Certificate:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value)


class KeepAliveClient:
    """One HTTP/1.1 keep-alive connection (http.client), with the certificate it was served."""

    def __init__(self, port: int, context: ssl.SSLContext | None) -> None:
        if context is None:
            self.conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        else:
            self.conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
        self.conn.connect()
        self.sock = self.conn.sock

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, response.read()

    def post_chunked(self, path: str, chunk: bytes, count: int) -> http.client.HTTPResponse:
        """POST `count` copies of `chunk` with `Transfer-Encoding: chunked` (no Content-Length); the
        response, its body not read yet."""
        self.conn.putrequest("POST", path)
        self.conn.putheader("Transfer-Encoding", "chunked")
        self.conn.endheaders()
        for _ in range(count):
            self.conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.conn.send(b"0\r\n\r\n")
        return self.conn.getresponse()

    @property
    def same_socket(self) -> bool:
        """Whether every request so far went over the first connection (http.client reconnects
        silently when the server closed it)."""
        return self.conn.sock is self.sock

    def certificate(self) -> x509.Certificate:
        return peer_certificate(self.conn.sock)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> KeepAliveClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LoopThread:
    """An asyncio loop on a daemon thread: `call(coro_fn)` runs a coroutine there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="control-test-loop", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 20.0) -> T:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run_sync(self, fn: Callable[[], T], timeout: float = 20.0) -> T:
        async def invoke() -> T:
            return fn()

        return self.call(invoke, timeout)

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if not self.loop.is_closed():
            self.call(cancel_all)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


__all__ = [
    "CA",
    "KeepAliveClient",
    "LoopThread",
    "SecretVolume",
    "common_name",
    "peer_certificate",
    "write_pair",
]
