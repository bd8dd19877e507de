"""The rule that keeps a replica from answering the extender (`leader.extender_gate`): not leading, or
caches not listed yet, each with a reason naming what is missing; and `/readyz/extender` answering it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from hami_control.leader import LeaderElector, extender_gate
from hami_control.server import ControlServer, Routes, extender_routes
from hami_kube.client import KubeApi
from hami_kube.election import LeaseSettings

T = TypeVar("T")


async def _nothing() -> None:
    return None


async def elector() -> LeaderElector:
    """A real elector that never runs (no call reaches its client, which needs a loop to exist)."""
    api = KubeApi("http://127.0.0.1:1", None)
    return LeaderElector(
        LeaseSettings("hami-system", "hami-control", "replica-a"),
        api,
        on_elected=_nothing,
        on_deposed=_nothing,
    )


def test_a_synced_replica_without_election_answers() -> None:
    assert extender_gate(None, lambda: {"pods": True, "nodes": True})() is None


def test_a_replica_whose_caches_have_not_listed_names_them() -> None:
    gate = extender_gate(None, lambda: {"pods": True, "nodes": False, "resourcequotas": False})
    assert gate() == (
        "hami-control is starting: its caches are not synced yet (waiting for nodes, resourcequotas)"
    )


def test_a_follower_says_it_does_not_lead_until_it_leads() -> None:
    follower = asyncio.run(elector())
    gate = extender_gate(follower, lambda: {"pods": True})
    assert gate() == "not leader: replica-a does not lead the extender, ask the leader"
    follower.leading = True
    assert gate() is None


class _Verbs:
    def filter_json(self, body: bytes) -> bytes:
        return b"{}"

    def prioritize_json(self, body: bytes) -> bytes:
        return b"[]"

    async def bind(self, body: bytes) -> object:
        return {}


def _before_and_after_sync(
    method: str, path: str, read: Callable[[aiohttp.ClientResponse], Awaitable[T]]
) -> list[T]:
    """Serve the extender routes behind the gate (no election, a `pods` cache) and ask `method path`
    twice over one session: before the cache has synced and after; each answer as `read` takes it."""
    synced = {"pods": False}

    async def main() -> list[T]:
        routes = Routes()
        extender_routes(routes, _Verbs(), gate=extender_gate(None, lambda: synced))
        server = ControlServer(routes, "127.0.0.1", 0, ssl_context=None)
        await server.start()
        answers = []
        try:
            async with aiohttp.ClientSession() as session:
                for ready in (False, True):
                    synced["pods"] = ready
                    url = f"http://127.0.0.1:{server.port}{path}"
                    async with session.request(method, url, data=b"{}" if method == "POST" else None) as r:
                        answers.append(await read(r))
        finally:
            await server.stop()
        return answers

    return asyncio.run(main())


def test_readyz_extender_is_503_with_the_gates_reason_then_200() -> None:
    async def status_and_text(response: aiohttp.ClientResponse) -> tuple[int, str]:
        return response.status, await response.text()

    assert _before_and_after_sync("GET", "/readyz/extender", status_and_text) == [
        (503, "not ready: hami-control is starting: its caches are not synced yet (waiting for pods)\n"),
        (200, "ok\n"),
    ]


def test_a_refused_extender_call_closes_its_connection_and_an_answered_one_keeps_it() -> None:
    """A replica that may not answer (a follower) closes the connection after saying so: the scheduler's
    next call opens a new one, which the extender Service sends to the leader. (Found by `hami-sim
    chaos`: a scheduler kept its keep-alive connection to a deposed leader, which answered "not leader"
    to every filter, and a pod stayed Pending for good.)"""

    async def connection_and_error(response: aiohttp.ClientResponse) -> tuple[str | None, str | None]:
        answer = await response.json()
        return response.headers.get("Connection"), answer.get("Error")

    refused, answered = _before_and_after_sync("POST", "/filter", connection_and_error)
    assert refused == ("close", "hami-control is starting: its caches are not synced yet (waiting for pods)")
    assert answered[0] != "close"
