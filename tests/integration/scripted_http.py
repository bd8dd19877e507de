"""A tiny HTTP/1.1 server on loopback that answers from a script: what the local API server cannot do
on demand (answer 429 or 5xx with Retry-After, close a connection instead of answering)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import orjson


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: bytes = b"{}"
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False
    """Close the connection instead of answering (the server went away mid-call)."""


def retry_after(status: int, seconds: str) -> Answer:
    status_body = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "message": "slow down"}
    return Answer(status, orjson.dumps(status_body), (("Retry-After", seconds),))


@dataclass
class ScriptedServer:
    """HTTP/1.1 on loopback answering each request with the next `Answer` of the script (200 {} once
    the script is done); `requests` records (method, path, body)."""

    script: list[Answer]
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode().split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int(headers.get("Content-Length", "0"))
                body = await reader.readexactly(length) if length else b""
                self.requests.append((method, target.split("?")[0], body))
                answer = self.script.pop(0) if self.script else Answer()
                if answer.drop:
                    return
                extra = "".join(f"{k}: {v}\r\n" for k, v in answer.headers)
                writer.write(
                    f"HTTP/1.1 {answer.status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(answer.body)}\r\n{extra}\r\n".encode()
                    + answer.body
                )
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
