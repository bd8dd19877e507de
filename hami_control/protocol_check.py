"""An explicit-state model checker: breadth-first search over every interleaving of a model's actions,
with states kept as canonical frozen values (hashable tuples), so a state reached by two orders is
explored once. Pure: no I/O, no clock.

What it checks, in every reachable state:
- **safety**: `TransitionSystem.violations(state)` names the properties the state breaks (the first one
  found ends the search; breadth-first, so its trace is a shortest one);
- **liveness** (after a complete search without safety violations): from every reachable state a state
  where `TransitionSystem.done(state)` holds is reachable, checked on the explored graph by a backward
  search from the done states. A state that cannot get there is reported with the trace that reaches it.

A counterexample is the sequence of action labels from the initial state. The model of the
bind/Allocate protocol (`protocol_model`) is the one user; `tests/unit/test_protocol_model.py` runs it.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)


class TransitionSystem(Protocol[S]):
    """What the checker explores."""

    def initial(self) -> S: ...

    def successors(self, state: S) -> Iterable[tuple[str, S]]:
        """(action label, next state) for every action enabled in `state`."""
        ...

    def violations(self, state: S) -> Iterable[tuple[str, str]]:
        """(property, message) for every safety property `state` breaks."""
        ...

    def done(self, state: S) -> bool:
        """Whether `state` is one the liveness property wants reachable from everywhere."""
        ...


@dataclass(frozen=True, slots=True)
class Counterexample:
    """A property that fails, why, and the actions from the initial state to a state that shows it."""

    property: str
    message: str
    trace: tuple[str, ...]

    def __str__(self) -> str:
        steps = "\n".join(f"  {i:3d}. {step}" for i, step in enumerate(self.trace, 1))
        return f"{self.property}: {self.message}\n  after {len(self.trace)} step(s):\n{steps}"


@dataclass(frozen=True, slots=True)
class CheckResult:
    states: int
    """Distinct states reached."""
    transitions: int
    """Edges explored (state, action, next state)."""
    done_states: int
    """Reached states where the liveness goal holds."""
    complete: bool
    """False when the search stopped early (a safety violation, or `max_states`)."""
    counterexamples: tuple[Counterexample, ...]

    @property
    def ok(self) -> bool:
        return self.complete and not self.counterexamples

    def first(self, prop: str) -> Counterexample | None:
        """The first counterexample of property `prop`, if any."""
        return next((c for c in self.counterexamples if c.property == prop), None)


class _Graph(Generic[S]):
    def __init__(self) -> None:
        self.ids: dict[S, int] = {}
        self.parent: list[int] = []
        self.action: list[str] = []
        self.edges: list[tuple[int, ...]] = []

    def add(self, parent: int, action: str) -> None:
        """The next state (its index in `ids` already set) is reached from `parent` by `action`."""
        self.parent.append(parent)
        self.action.append(action)
        self.edges.append(())

    def trace(self, index: int) -> tuple[str, ...]:
        steps: list[str] = []
        while self.parent[index] >= 0:
            steps.append(self.action[index])
            index = self.parent[index]
        return tuple(reversed(steps))


def check(system: TransitionSystem[S], *, max_states: int = 2_000_000) -> CheckResult:
    """Explore every state of `system` reachable from its initial state (breadth first) and check its
    properties; see the module docstring."""
    with _without_gc():
        return _check(system, max_states)


@contextmanager
def _without_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: a search builds millions of objects (the states) that live
    until its end and form no cycles, so the collector's passes over them would free nothing and cost
    time (30 to 40% more)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check(system: TransitionSystem[S], max_states: int) -> CheckResult:
    graph: _Graph[S] = _Graph()
    ids = graph.ids
    start = system.initial()
    ids[start] = 0
    graph.add(-1, "")
    # the states by index, in the order found: the queue of the breadth-first search is the states
    # from `index` on
    states: list[S] = [start]
    transitions = 0
    done: list[int] = []
    index = 0
    while index < len(states):
        state = states[index]
        for prop, message in system.violations(state):
            counter = Counterexample(prop, message, graph.trace(index))
            return CheckResult(len(states), transitions, len(done), False, (counter,))
        if system.done(state):
            done.append(index)
        targets: list[int] = []
        for label, nxt in system.successors(state):
            target = ids.setdefault(nxt, len(states))  # one lookup, the state's hash computed once
            if target == len(states):  # a new state
                graph.add(index, label)
                states.append(nxt)
            targets.append(target)
        transitions += len(targets)
        graph.edges[index] = tuple(targets)
        if len(states) > max_states:
            return CheckResult(len(states), transitions, len(done), False, ())
        index += 1
    stuck = _cannot_reach(graph.edges, done)
    counters: tuple[Counterexample, ...] = ()
    if stuck is not None:
        counters = (
            Counterexample(
                "liveness",
                "from this state no state where every pod is settled can be reached",
                graph.trace(stuck),
            ),
        )
    return CheckResult(len(states), transitions, len(done), True, counters)


def _cannot_reach(edges: list[tuple[int, ...]], goals: list[int]) -> int | None:
    """The first state (in search order, so with a shortest trace) from which no goal is reachable."""
    back: list[list[int]] = [[] for _ in edges]
    for source, targets in enumerate(edges):
        for target in targets:
            back[target].append(source)
    reaches = bytearray(len(edges))
    queue: deque[int] = deque(goals)
    for goal in goals:
        reaches[goal] = 1
    while queue:
        index = queue.popleft()
        for source in back[index]:
            if not reaches[source]:
                reaches[source] = 1
                queue.append(source)
    first = reaches.find(0)
    return first if first >= 0 else None


__all__ = ["CheckResult", "Counterexample", "TransitionSystem", "check"]
