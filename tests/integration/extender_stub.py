"""HAMi's scheduler extender as kube-scheduler sees it, for the scheduler stand-in's tests: an HTTPS server
on its own loop that records every call, answers /filter from a policy and /prioritize from scores, and
binds (a Binding POSTed to the API server) on /bind, with binds that can be held."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from hami_sim.tls import server_ssl_context


@dataclass(frozen=True)
class Call:
    verb: str
    pod: str
    body: dict[str, Any]
    at: float


FilterPolicy = Callable[[str, list[str]], dict[str, Any]]


def accept_all(pod: str, names: list[str]) -> dict[str, Any]:
    return {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}


class ExtenderStub:
    """HAMi's extender as kube-scheduler sees it, on its own loop: /filter answers from `policy`,
    /prioritize from `scores`, /bind POSTs a Binding with annotations to the API server (held while
    `hold_binds()` is in effect)."""

    def __init__(self, api_url: str, cert: tuple[bytes, bytes]) -> None:
        self.api_url = api_url
        self.policy: FilterPolicy = accept_all
        self.scores: dict[str, int] = {}
        self.calls: list[Call] = []
        self._cond = threading.Condition()
        self._cert = cert
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gate: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        self.port = ready.result(10)

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.close()

    async def _main(self, ready: concurrent.futures.Future[int]) -> None:
        self._gate = asyncio.Event()
        self._gate.set()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/filter", self._filter)
        app.router.add_post("/prioritize", self._prioritize)
        app.router.add_post("/bind", self._bind)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(*self._cert))
        await site.start()
        async with aiohttp.ClientSession() as session:
            self._session = session
            ready.set_result(runner.addresses[0][1])
            await self._stop.wait()
            self._gate.set()
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _record(self, verb: str, pod: str, body: dict[str, Any]) -> None:
        with self._cond:
            self.calls.append(Call(verb, pod, body, time.monotonic()))
            self._cond.notify_all()

    def calls_of(self, verb: str, pod: str | None = None) -> list[Call]:
        with self._cond:
            return [c for c in self.calls if c.verb == verb and (pod is None or c.pod == pod)]

    def wait_calls(self, verb: str, pod: str, count: int = 1, timeout: float = 10.0) -> list[Call]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(found := [c for c in self.calls if c.verb == verb and c.pod == pod]) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {count} {verb} calls for {pod} within {timeout}s: {self.calls}")
                self._cond.wait(remaining)
            return found

    def hold_binds(self) -> None:
        assert self._loop is not None and self._gate is not None
        self._loop.call_soon_threadsafe(self._gate.clear)

    def release_binds(self) -> None:
        assert self._loop is not None and self._gate is not None
        self._loop.call_soon_threadsafe(self._gate.set)

    async def _filter(self, request: web.Request) -> web.Response:
        body = await request.json()
        pod = body["Pod"]["metadata"]["name"]
        self._record("filter", pod, body)
        return web.json_response(self.policy(pod, list(body["NodeNames"] or [])))

    async def _prioritize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record("prioritize", body["Pod"]["metadata"]["name"], body)
        return web.json_response([{"Host": n, "Score": self.scores.get(n, 0)} for n in body["NodeNames"]])

    async def _bind(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record("bind", body["PodName"], body)
        assert self._gate is not None
        await self._gate.wait()
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": body["PodName"],
                "namespace": body["PodNamespace"],
                "uid": body["PodUID"],
                "annotations": {"hami.io/vgpu-node": body["Node"], "hami.io/bind-phase": "allocating"},
            },
            "target": {"kind": "Node", "name": body["Node"]},
        }
        url = f"{self.api_url}/api/v1/namespaces/{body['PodNamespace']}/pods/{body['PodName']}/binding"
        async with self._session.post(url, json=binding) as response:
            if response.status >= 300:
                return web.json_response({"Error": f"binding: {response.status} {await response.text()}"})
        return web.json_response({"Error": ""})
