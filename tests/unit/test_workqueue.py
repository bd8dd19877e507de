"""hami_kube.workqueue: client-go's workqueue guarantees (a key waits at most once, is never held by two
workers, and a key added while held is handed out again after `done`), by example and by a model."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_kube.workqueue import WorkQueue


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_a_key_added_twice_while_waiting_is_handed_out_once() -> None:
    async def go() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        for key in ("a", "b", "a", "a"):
            queue.add(key)
        return [await queue.get(), await queue.get()] if len(queue) == 2 else []

    assert run(go()) == ["a", "b"]


def test_a_key_added_while_held_waits_for_done_then_comes_back_once() -> None:
    async def go() -> tuple[int, int, str, int]:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("pod")
        held = await queue.get()
        queue.add("pod")
        queue.add("pod")
        waiting_while_held = len(queue)
        queue.done(held)
        waiting_after_done = len(queue)
        again = await queue.get()
        queue.done(again)
        return waiting_while_held, waiting_after_done, again, len(queue)

    assert run(go()) == (0, 1, "pod", 0)


def test_a_second_worker_does_not_get_a_key_the_first_holds() -> None:
    async def go() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        got: list[str] = []

        async def worker() -> None:
            key = await queue.get()
            got.append(key)

        queue.add("pod")
        first = await queue.get()
        second = asyncio.create_task(worker())
        queue.add("pod")
        for _ in range(20):
            await asyncio.sleep(0)
        before_done = list(got)
        queue.done(first)
        await asyncio.wait_for(second, 5)
        return [*before_done, "|", *got]

    assert run(go()) == ["|", "pod"]


def test_add_after_queues_the_key_later_and_shut_down_cancels_pending_timers() -> None:
    async def go() -> tuple[int, str, int]:
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("retry", 0.01)
        at_once = len(queue)
        key = await asyncio.wait_for(queue.get(), 5)
        queue.done(key)
        queue.add_after("late", 60)
        queue.shut_down()
        queue.add("after-shutdown")
        return at_once, key, len(queue)

    assert run(go()) == (0, "retry", 0)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abc")),
        st.tuples(st.just("get"), st.just("")),
        st.tuples(st.just("done"), st.integers(0, 3)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_no_key_is_held_twice_and_every_add_is_seen_by_a_later_get(ops: list[tuple[str, object]]) -> None:
    """Model: `pending` (added since the key was last handed out); after the ops, draining the queue
    (done for every held key, get until empty) hands out every pending key exactly once."""

    async def go() -> None:
        queue: WorkQueue[str] = WorkQueue()
        held: list[str] = []
        pending: set[str] = set()
        for op, arg in ops:
            if op == "add":
                queue.add(str(arg))
                pending.add(str(arg))
            elif op == "get" and len(queue):
                key = await queue.get()
                assert key not in held, f"{key} handed to a second worker"
                assert key in pending
                pending.discard(key)
                held.append(key)
            elif op == "done" and held:
                queue.done(held.pop(int(str(arg)) % len(held)))
            assert len(queue) == len({k for k in pending if k not in held})
        for key in held:
            queue.done(key)
        drained: list[str] = []
        while len(queue):
            key = await queue.get()
            drained.append(key)
            queue.done(key)
        assert sorted(drained) == sorted(pending)

    asyncio.run(go())
