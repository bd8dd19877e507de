"""The object store: objects by resource, one cluster-wide resourceVersion, a bounded event history
per resource and the fan-out of events to watchers.

The store belongs to the server's event loop: call it only from that loop's thread. Stored objects
are immutable by convention: every write stores a new top-level dict and a new metadata dict, and
nobody modifies a stored object in place (sub-dicts may be shared between versions).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import logging
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from hami_sim.apiserver import errors
from hami_sim.apiserver.strategy import RESOURCES, ResourceInfo, field_value

JSON = dict[str, Any]

log = logging.getLogger(__name__)

DEFAULT_HISTORY = 10_000
DEFAULT_WATCH_QUEUE = 20_000


class LabelMatcher(Protocol):
    def matches(self, labels: dict[str, str]) -> bool: ...


class FieldMatcher(Protocol):
    def matches(self, obj: JSON) -> bool: ...


class Stored:
    """One version of an object and its JSON encoding (encoded once, served many times)."""

    __slots__ = ("obj", "raw", "rv")

    def __init__(self, obj: JSON, rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self.raw = orjson.dumps(obj)


class Event:
    """A change of one object, kept in the history and sent to watchers."""

    __slots__ = ("_lines", "old", "rv", "stored", "type")

    def __init__(self, etype: str, stored: Stored, old: Stored | None) -> None:
        self.type = etype
        self.stored = stored
        self.old = old
        self.rv = stored.rv
        self._lines: dict[str, bytes] = {}

    def line(self, etype: str) -> bytes:
        """The event as one line of a watch stream, as `etype` (a selector may turn MODIFIED into
        ADDED or DELETED)."""
        line = self._lines.get(etype)
        if line is None:
            raw = self.raw_for(etype)
            line = b'{"type":"' + etype.encode() + b'","object":' + raw + b"}\n"
            self._lines[etype] = line
        return line

    def obj_for(self, etype: str) -> JSON:
        if etype == "DELETED" and self.type == "MODIFIED" and self.old is not None:
            # The object left the watcher's selection: kube sends the previous state at the new rv.
            return {**self.old.obj, "metadata": {**self.old.obj["metadata"], "resourceVersion": str(self.rv)}}
        return self.stored.obj

    def raw_for(self, etype: str) -> bytes:
        if etype == "DELETED" and self.type == "MODIFIED" and self.old is not None:
            return orjson.dumps(self.obj_for(etype))
        return self.stored.raw


class Watcher:
    """One open watch: its filter and a bounded queue of (type, event) the stream writer drains."""

    __slots__ = (
        "closed",
        "field_selector",
        "index_value",
        "info",
        "label_selector",
        "max_queue",
        "namespace",
        "overflowed",
        "queue",
        "wake",
    )

    def __init__(  # noqa: PLR0917
        self,
        info: ResourceInfo,
        namespace: str | None,
        label_selector: LabelMatcher | None,
        field_selector: FieldMatcher | None,
        index_value: str | None,
        max_queue: int,
    ) -> None:
        self.info = info
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.index_value = index_value
        self.max_queue = max_queue
        self.queue: collections.deque[tuple[str, Event]] = collections.deque()
        self.wake = asyncio.Event()
        self.closed = False
        self.overflowed = False

    def selects(self, obj: JSON) -> bool:
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        if self.label_selector is not None and not self.label_selector.matches(
            obj["metadata"].get("labels") or {}
        ):
            return False
        return self.field_selector is None or self.field_selector.matches(obj)

    def offer(self, event: Event) -> None:
        """Queue the event as this watcher sees it (kube cacher semantics for selectors)."""
        if self.closed:
            return
        new_in = self.selects(event.stored.obj)
        if event.type == "MODIFIED":
            old_in = event.old is not None and self.selects(event.old.obj)
            if new_in:
                etype = "MODIFIED" if old_in else "ADDED"
            elif old_in:
                etype = "DELETED"
            else:
                return
        elif new_in:
            etype = event.type
        else:
            return
        self.push(etype, event)

    def push(self, etype: str, event: Event) -> None:
        if len(self.queue) >= self.max_queue:
            # Too far behind: end the stream; the client re-watches from its last resourceVersion.
            self.overflowed = True
            self.close()
            return
        self.queue.append((etype, event))
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class _ResourceState:
    __slots__ = ("by_index", "history", "horizon", "objects", "unindexed")

    def __init__(self, history_size: int) -> None:
        # namespace ("" for cluster-scoped) -> name -> current version
        self.objects: dict[str, dict[str, Stored]] = {}
        self.history: collections.deque[Event] = collections.deque(maxlen=history_size)
        # Every event of this resource with rv > horizon is in `history`.
        self.horizon = 0
        self.unindexed: set[Watcher] = set()
        self.by_index: dict[str, set[Watcher]] = {}


def _index_value(info: ResourceInfo, obj: JSON) -> str:
    if info.watch_index_field == "metadata.name":
        return str(obj["metadata"].get("name", ""))
    return field_value(obj, info.watch_index_field)


class Store:
    """All objects, by resource. Raises `errors.ApiError` for NotFound/AlreadyExists/Expired."""

    def __init__(
        self, *, history_size: int = DEFAULT_HISTORY, watch_queue: int = DEFAULT_WATCH_QUEUE
    ) -> None:
        self._rv = 0
        self._history_size = history_size
        self.watch_queue = watch_queue
        self._state: dict[ResourceInfo, _ResourceState] = {r: _ResourceState(history_size) for r in RESOURCES}

    @property
    def resource_version(self) -> int:
        """The last resourceVersion handed out (cluster-wide)."""
        return self._rv

    # -- reads ---------------------------------------------------------------------------------

    def get(self, info: ResourceInfo, namespace: str, name: str) -> Stored:
        stored = self._state[info].objects.get(namespace, {}).get(name)
        if stored is None:
            raise errors.not_found(info.group, info.plural, name)
        return stored

    def find(self, info: ResourceInfo, namespace: str, name: str) -> Stored | None:
        return self._state[info].objects.get(namespace, {}).get(name)

    def list(
        self,
        info: ResourceInfo,
        namespace: str | None,
        label_selector: LabelMatcher | None = None,
        field_selector: FieldMatcher | None = None,
    ) -> builtins.list[Stored]:
        """Current objects sorted by (namespace, name), filtered; `namespace=None` means all."""
        objects = self._state[info].objects
        if namespace is not None:
            groups: Iterable[tuple[str, dict[str, Stored]]] = [(namespace, objects.get(namespace, {}))]
        else:
            groups = sorted(objects.items())
        out: builtins.list[Stored] = []
        for _ns, by_name in groups:
            for _name, stored in sorted(by_name.items()):
                obj = stored.obj
                if label_selector is not None and not label_selector.matches(
                    obj["metadata"].get("labels") or {}
                ):
                    continue
                if field_selector is not None and not field_selector.matches(obj):
                    continue
                out.append(stored)
        return out

    def count(self, info: ResourceInfo) -> int:
        return sum(len(by_name) for by_name in self._state[info].objects.values())

    # -- writes --------------------------------------------------------------------------------

    def _next(self, obj: JSON) -> Stored:
        self._rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self._rv)}}
        return Stored(obj, self._rv)

    def create(self, info: ResourceInfo, obj: JSON) -> Stored:
        meta = obj["metadata"]
        namespace = meta.get("namespace", "") if info.namespaced else ""
        name = meta["name"]
        state = self._state[info]
        by_name = state.objects.setdefault(namespace, {})
        if name in by_name:
            raise errors.already_exists(info.group, info.plural, name)
        stored = self._next(obj)
        by_name[name] = stored
        self._emit(info, state, Event("ADDED", stored, None))
        return stored

    def update(self, info: ResourceInfo, obj: JSON, old: Stored) -> Stored:
        """Replace `old` (the current version, checked by the caller) with `obj`."""
        meta = obj["metadata"]
        namespace = meta.get("namespace", "") if info.namespaced else ""
        state = self._state[info]
        stored = self._next(obj)
        state.objects[namespace][meta["name"]] = stored
        self._emit(info, state, Event("MODIFIED", stored, old))
        return stored

    def delete(self, info: ResourceInfo, namespace: str, name: str) -> Stored:
        """Remove the object; returns its last state at the deletion's resourceVersion."""
        state = self._state[info]
        by_name = state.objects.get(namespace)
        old = by_name.get(name) if by_name else None
        if old is None or by_name is None:
            raise errors.not_found(info.group, info.plural, name)
        del by_name[name]
        if not by_name:
            del state.objects[namespace]
        stored = self._next(old.obj)
        self._emit(info, state, Event("DELETED", stored, old))
        return stored

    def delete_namespace_contents(self, namespace: str) -> None:
        """Remove every namespaced object in `namespace` (what kube's namespace controller does)."""
        for info, state in self._state.items():
            if info.namespaced and namespace in state.objects:
                for name in sorted(state.objects[namespace]):
                    self.delete(info, namespace, name)

    def _emit(self, info: ResourceInfo, state: _ResourceState, event: Event) -> None:
        history = state.history
        if len(history) == history.maxlen:
            state.horizon = history[0].rv
        history.append(event)
        for watcher in state.unindexed:
            watcher.offer(event)
        if state.by_index:
            value = _index_value(info, event.stored.obj)
            watchers = state.by_index.get(value)
            if watchers:
                for watcher in watchers:
                    watcher.offer(event)
            if event.old is not None:
                old_value = _index_value(info, event.old.obj)
                if old_value != value:
                    watchers = state.by_index.get(old_value)
                    if watchers:
                        for watcher in watchers:
                            watcher.offer(event)

    # -- watch ---------------------------------------------------------------------------------

    def watch(  # noqa: PLR0917
        self,
        info: ResourceInfo,
        namespace: str | None,
        resource_version: int | None,
        label_selector: LabelMatcher | None = None,
        field_selector: FieldMatcher | None = None,
        index_value: str | None = None,
    ) -> Watcher:
        """Open a watcher. `resource_version=None` (unset or "0"): synthetic ADDED events for current
        objects, then live events; otherwise every event after it (410 Expired when it is older than
        the history kept). `index_value`: the value of `info.watch_index_field` that the field
        selector requires, if it requires one (lets writes skip unrelated watchers)."""
        state = self._state[info]
        watcher = Watcher(info, namespace, label_selector, field_selector, index_value, self.watch_queue)
        if resource_version is None:
            for stored in self.list(info, namespace, label_selector, field_selector):
                watcher.queue.append(("ADDED", Event("ADDED", stored, None)))
        else:
            if resource_version < state.horizon:
                raise errors.ApiError(
                    410,
                    "Expired",
                    f"too old resource version: {resource_version} ({state.horizon})",
                )
            backlog: builtins.list[Event] = []
            for event in reversed(state.history):
                if event.rv <= resource_version:
                    break
                backlog.append(event)
            for event in reversed(backlog):
                watcher.offer(event)
        if watcher.queue:
            watcher.wake.set()
        if index_value is None:
            state.unindexed.add(watcher)
        else:
            state.by_index.setdefault(index_value, set()).add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        watcher.close()
        state = self._state[watcher.info]
        if watcher.index_value is None:
            state.unindexed.discard(watcher)
        else:
            watchers = state.by_index.get(watcher.index_value)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del state.by_index[watcher.index_value]

    def watchers(self) -> builtins.list[Watcher]:
        out: builtins.list[Watcher] = []
        for state in self._state.values():
            out.extend(state.unindexed)
            for watchers in state.by_index.values():
                out.extend(watchers)
        return out

    def oldest_resource_version(self, info: ResourceInfo) -> int:
        """Watches from this resourceVersion or later are served (older ones get 410)."""
        return self._state[info].horizon
