"""Every registered node's GPUs as numpy arrays, so filter and prioritize look at 5,000 nodes at once.

`fit.fit_pod` walks one node's GPUs in Python (~100 µs a node with its sorting and frozen values), which
is 0.5 s for a 5,000-node filter. Most pods have one container that asks for GPUs, and for those the
answer of fit_pod can be computed for all nodes together: the verdict and the reasons of a single GPU
container do not depend on the order the GPU policy tries the GPUs (a node fits when at least `nums` of
its GPUs pass every rule; when it does not, every GPU was tried and each counts under the first rule it
breaks). `evaluate` does exactly that, rule by rule in `fit`'s order, over a `(nodes, width)` table.

Kept current from `ClusterCache.drain_changed()` by `GPUTable.sync`: only the nodes that changed since the
last sync are rewritten (O(GPUs of the node) each), so a filter never rebuilds anything.

Nodes with a GPU in HAMi's dynamic MIG mode are not answered by the table (its rules are per placement):
`Evaluation.slow` marks them and the caller fits them with `fit_pod`; a table without such nodes pays
nothing for it.

`simple_ask` answers None (and the caller uses `fit_pod` node by node) for what it does not cover:
several containers with GPUs (each container's choice changes what the next one sees), `numa-bind`,
and a namespace quota that could stop the pod part way (a quota that the whole pod fits under changes
nothing, since a node that fails had fewer than `nums` GPUs passing). Property tests check that every
answer equals `fit_pod`'s and `PodAsk.priority`'s, reasons and scores included.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from hami_api.resources import ContainerRequest
from hami_api.types import DeviceSelector, GPUPolicy, NodePolicy
from hami_control.fit import QuotaCheck, Reason, reasons_text
from hami_control.frag import (
    TaskMix,
    after_each_gpu,
    arrays,
    best_scores,
    fragmentation,
    free_milli_arrays,
    least_growth,
)
from hami_control.quota import QuotaUsage
from hami_control.score import MAX_SCORE, growth_score
from hami_control.usage import NodeGPUs

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
ObjectArray = npt.NDArray[np.object_]

# Reason codes, in the order `fit._reason` checks them (0 = the GPU passes, -1 = no GPU in that column).
_CODES: tuple[Reason, ...] = (
    Reason.CARD_NOT_HEALTH,
    Reason.CARD_CORDONED,
    Reason.CARD_TYPE_MISMATCH,
    Reason.CARD_UUID_MISMATCH,
    Reason.CARD_TIME_SLICING_EXHAUSTED,
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,  # mutex policy on a used GPU
    Reason.CARD_INSUFFICIENT_MEMORY,
    Reason.CARD_INSUFFICIENT_CORE,
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,  # 100 cores asked on a used GPU
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED,
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST,  # per node: the passing GPUs of a node short of them
)
_NCODES = len(_CODES)
_ALLOCATED = _NCODES - 1
_COLUMNS: tuple[tuple[str, type[np.generic]], ...] = (
    ("present", np.bool_),
    ("count", np.int64),
    ("used", np.int64),
    ("devmem", np.int64),
    ("usedmem", np.int64),
    ("devcore", np.int64),
    ("usedcores", np.int64),
    ("healthy", np.bool_),
    ("cordoned", np.bool_),
    ("type_id", np.int64),
    ("mode_id", np.int64),
    ("uuid_id", np.int64),
)
_INITIAL_WIDTH = 8
_INITIAL_ROWS = 64


class GPUTable:
    """One row per registered node, one column per GPU (inventory order); `width` grows with the
    largest node. Not thread-safe: the event loop that feeds the cache owns it."""

    def __init__(self) -> None:
        self.row_of: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._rows = 0
        self.width = _INITIAL_WIDTH
        self._types: dict[str, int] = {}
        self._modes: dict[str, int] = {}
        self._uuids: dict[str, int] = {}
        self._capacity = 0
        self._layout = 0
        """Bumped whenever a name gains or loses a row (invalidates the cached `rows` answer)."""
        self._last_rows: tuple[tuple[str, ...], int, IntArray] | None = None
        self.mig_rows = 0
        self._stale: set[int] = set()
        """Rows whose `_free` / `_free_total` no longer match the columns (`free_milli`)."""
        self.version = 0
        """Bumped for every row written, removed or touched (`changed_since`)."""
        self.epoch = 0
        """Bumped when the arrays are reallocated (wider or more rows): every row is new to `RowCache`."""
        self._log: list[int] = []
        """The rows written, removed or touched, one per version, from version `_log_start` + 1 on."""
        self._log_start = 0
        self.name_of: list[str] = []
        """The node name of each row in use (a freed row keeps its last name until reused)."""
        self.key_width = 1
        """Columns of `key_json`: the longest `"<name>":` of a row so far."""
        self._alloc(_INITIAL_ROWS, self.width)

    def _alloc(self, rows: int, width: int) -> None:
        """(Re)allocate every array as (rows, width), keeping what is there."""
        old_rows = self._capacity
        old_width = self.present.shape[1] if old_rows else 0
        for key, dtype in _COLUMNS:
            fresh = np.zeros((rows, width), dtype=dtype)
            if old_rows:
                fresh[:old_rows, :old_width] = getattr(self, key)
            setattr(self, key, fresh)
        gpus = np.zeros(rows, dtype=np.int64)
        sums = np.zeros((rows, 6), dtype=np.int64)
        mig = np.zeros(rows, dtype=np.bool_)
        if old_rows:
            gpus[:old_rows] = self.gpus
            sums[:old_rows] = self.sums
            mig[:old_rows] = self.mig
        self.gpus, self.sums, self.mig = gpus, sums, mig
        name_json: ObjectArray = np.full(rows, b'""', dtype=object)
        host_json: ObjectArray = np.full(rows, b'{"Host":"","Score":', dtype=object)
        key_json = np.full((rows, self.key_width), _SPACE, dtype=np.uint8)
        key_len = np.zeros(rows, dtype=np.int64)
        if old_rows:
            name_json[:old_rows] = self.name_json
            host_json[:old_rows] = self.host_json
            key_json[:old_rows] = self.key_json
            key_len[:old_rows] = self.key_len
        self.name_json, self.host_json = name_json, host_json
        self.key_json, self.key_len = key_json, key_len
        self._free = np.zeros((rows, width), dtype=np.int64)
        self._free_total = np.zeros(rows, dtype=np.int64)
        self._stale = set(range(self._rows))
        self._capacity = rows
        self.width = width
        self.epoch += 1

    # the arrays (set by _alloc; declared for the type checker)
    present: BoolArray
    count: IntArray
    used: IntArray
    devmem: IntArray
    usedmem: IntArray
    devcore: IntArray
    usedcores: IntArray
    healthy: BoolArray
    cordoned: BoolArray
    type_id: IntArray
    mode_id: IntArray
    uuid_id: IntArray
    gpus: IntArray
    sums: IntArray
    """(rows, 6): over all the node's GPUs, used, count, usedcores, devcore, usedmem, devmem."""
    mig: BoolArray
    """Per row: the node has a GPU in dynamic MIG mode (fitted node by node, see the module note)."""
    mig_rows: int
    """How many rows have `mig` set."""
    name_json: ObjectArray
    """Per row: the node's name as a JSON string (bytes), for answers written without a JSON encoder."""
    host_json: ObjectArray
    """Per row: `{"Host":<name>,"Score":` (bytes), the start of the node's HostPriority entry."""
    key_json: npt.NDArray[np.uint8]
    """(rows, key_width): per row `"<name>":` padded with spaces, for `members_json`."""
    key_len: IntArray
    """Per row: the length of `"<name>":` in `key_json`."""

    @staticmethod
    def _intern(table: dict[str, int], text: str) -> int:
        found = table.get(text)
        if found is None:
            found = table[text] = len(table)
        return found

    def __len__(self) -> int:
        return len(self.row_of)

    @property
    def layout(self) -> int:
        """Bumped whenever a name gains or loses a row (rows looked up before are stale)."""
        return self._layout

    @property
    def capacity(self) -> int:
        """Rows the arrays have room for."""
        return self._capacity

    @property
    def row_count(self) -> int:
        """Rows in use or freed (rows past it were never used)."""
        return self._rows

    def set_node(self, node: NodeGPUs) -> None:
        """Write (or rewrite) the node's row."""
        if len(node.gpus) > self.width:
            self._alloc(self._capacity, max(len(node.gpus), self.width * 2))
        row = self.row_of.get(node.name)
        if row is None:
            if self._free_rows:
                row = self._free_rows.pop()
            else:
                if self._rows == self._capacity:
                    self._alloc(self._capacity * 2, self.width)
                row = self._rows
                self._rows += 1
                self.name_of.append(node.name)
            self.row_of[node.name] = row
            self.name_of[row] = node.name
            self.name_json[row] = encoded = json_string(node.name)
            self.host_json[row] = b'{"Host":' + encoded + b',"Score":'
            self._set_key(row, encoded + b":")
            self._layout += 1
        self._changed(row)
        self._stale.add(row)
        self.present[row] = False
        self.mig_rows += int(node.has_mig) - int(self.mig[row])
        self.mig[row] = node.has_mig
        self.gpus[row] = len(node.gpus)
        every = node.gpus  # unhealthy GPUs included, as HAMi's node score counts them
        self.sums[row] = (
            sum(g.used for g in every),
            sum(g.info.count for g in every),
            sum(g.usedcores for g in every),
            sum(g.info.devcore for g in every),
            sum(g.usedmem for g in every),
            sum(g.info.devmem for g in every),
        )
        for col, g in enumerate(node.gpus):
            info = g.info
            self.present[row, col] = True
            self.count[row, col] = info.count
            self.used[row, col] = g.used
            self.devmem[row, col] = info.devmem
            self.usedmem[row, col] = g.usedmem
            self.devcore[row, col] = info.devcore
            self.usedcores[row, col] = g.usedcores
            self.healthy[row, col] = g.healthy
            self.cordoned[row, col] = g.cordoned
            self.type_id[row, col] = self._intern(self._types, info.type)
            self.mode_id[row, col] = self._intern(self._modes, info.mode)
            self.uuid_id[row, col] = self._intern(self._uuids, info.id)

    def remove_node(self, name: str) -> None:
        row = self.row_of.pop(name, None)
        if row is not None:
            self.present[row] = False
            self.mig_rows -= int(self.mig[row])
            self.mig[row] = False
            self.gpus[row] = 0
            self.sums[row] = 0
            self._stale.add(row)
            self._free_rows.append(row)
            self._layout += 1
            self._changed(row)

    def _set_key(self, row: int, key: bytes) -> None:
        if len(key) > self.key_width:
            wider = np.full((self._capacity, len(key)), _SPACE, dtype=np.uint8)
            wider[:, : self.key_width] = self.key_json
            self.key_json, self.key_width = wider, len(key)
        self.key_json[row] = _SPACE
        self.key_json[row, : len(key)] = np.frombuffer(key, dtype=np.uint8)
        self.key_len[row] = len(key)

    def members_json(self, rows: IntArray, value: bytes) -> bytes | None:
        """The JSON object members `"<name>":<value>` of the nodes of `rows`, comma-separated, written
        from `key_json` in one array copy: each key padded with spaces before its value (JSON's
        whitespace, nothing to a decoder). None when the padding would make them more than 5 % longer
        (names of very different lengths): the caller joins `name_json` instead."""
        k = len(rows)
        if not k:
            return b""
        keys = self._padded_keys(rows, len(value) + 1)
        if keys is None:
            return None
        width = self.key_width
        out = np.empty((k, width + len(value) + 1), dtype=np.uint8)
        out[:, :width] = keys
        out[:, width:] = np.frombuffer(value + b",", dtype=np.uint8)
        return out.reshape(-1)[:-1].tobytes()

    def _padded_keys(self, rows: IntArray, per_row: int) -> npt.NDArray[np.uint8] | None:
        """The `key_json` rows of `rows` (k x `key_width` bytes, each key padded with spaces), or None
        when, with `per_row` more bytes a row, the padding would make the text more than 5 % longer
        than the keys written exactly (names of very different lengths)."""
        k, width = len(rows), self.key_width
        exact = int(self.key_len[rows].sum()) + k * per_row
        if ((width + per_row) * k - exact) * 20 > exact:
            return None
        keys = self.key_json.view(f"V{width}").ravel()  # a row as one item: a faster gather
        gathered: npt.NDArray[np.uint8] = keys[rows].view(np.uint8).reshape(k, width)
        return gathered

    def priorities_json(self, rows: IntArray, scores: IntArray) -> bytes | None:
        """The HostPriorityList `[{"Host":"<name>","Score":<score>},...]` of the nodes of `rows` (each
        >= 0) with their `scores` (0..99), written from `key_json` in a few array operations: each name
        padded with spaces before its comma, each score written in two characters (JSON's whitespace,
        nothing to a decoder). None when the padding would make it more than 5 % longer (names of very
        different lengths): the caller joins `host_json` instead."""
        k = len(rows)
        if not k:
            return b"[]"
        per_row = len(_HOST) + len(_SCORE) + 2 + 2  # two characters of score, then `},`
        keys = self._padded_keys(rows, per_row)
        if keys is None:
            return None
        width = self.key_width
        out = np.empty((k, width + per_row), dtype=np.uint8)
        at = len(_HOST)
        out[:, :at] = np.frombuffer(_HOST, dtype=np.uint8)
        out[:, at : at + width] = keys
        out[np.arange(k), at + self.key_len[rows] - 1] = _SPACE  # the key's colon
        at += width
        out[:, at : at + len(_SCORE)] = np.frombuffer(_SCORE, dtype=np.uint8)
        at += len(_SCORE)
        tens = scores // 10
        out[:, at] = np.where(tens > 0, tens + _ZERO, _SPACE)
        out[:, at + 1] = scores % 10 + _ZERO
        out[:, at + 2 :] = np.frombuffer(b"},", dtype=np.uint8)
        flat = out.reshape(-1)
        flat[-1] = _CLOSE
        return b"[" + flat.tobytes()

    def _changed(self, row: int) -> None:
        self.version += 1
        log = self._log
        log.append(row)
        if len(log) > max(_LOG_MIN, 2 * self._capacity):  # older versions recompute every row instead
            drop = len(log) // 2
            del log[:drop]
            self._log_start += drop

    def touch(self, names: Iterable[str]) -> None:
        """Mark the rows of `names` changed without rewriting them (an input of a `RowCache` computation
        other than the GPUs changed there: the node's free CPU); names without a row are skipped."""
        for name in names:
            row = self.row_of.get(name)
            if row is not None:
                self._changed(row)

    def changed_since(self, version: int) -> IntArray | None:
        """The rows written, removed or touched after `version` (distinct, sorted), or None when the log
        no longer reaches back that far."""
        if version < self._log_start:
            return None
        changed: IntArray = np.unique(np.array(self._log[version - self._log_start :], dtype=np.int64))
        return changed

    def sync(self, changed: Iterable[str], lookup: Callable[[str], NodeGPUs | None]) -> None:
        """Rewrite the rows of `changed` nodes from `lookup` (the cache's `node_gpus`)."""
        for name in changed:
            node = lookup(name)
            if node is None:
                self.remove_node(name)
            else:
                self.set_node(node)

    def allowed(self, kind: str, predicate: Callable[[str], bool]) -> BoolArray:
        """Per interned id of the `kind` ("type", "mode", "uuid") strings, whether `predicate` accepts it."""
        table = {"type": self._types, "mode": self._modes, "uuid": self._uuids}[kind]
        ok = np.zeros(max(len(table), 1), dtype=np.bool_)
        for text, i in table.items():
            ok[i] = predicate(text)
        return ok

    def free_milli(self) -> tuple[IntArray, IntArray]:
        """`(row_count, width)` each GPU's free milli-GPUs (`frag.free_milli_arrays` of the columns) and
        `(row_count,)` their sum per row, kept from one call to the next: only the rows written since
        (`set_node`, `remove_node`) are computed again, so a filter over 5,000 nodes does not redo 40,000
        GPUs' arithmetic (read-only views; a freed row has none free)."""
        if self._stale:
            at = np.fromiter(self._stale, dtype=np.int64, count=len(self._stale))
            self._stale = set()
            free = free_milli_arrays(
                self.count[at],
                self.used[at],
                self.devmem[at],
                self.usedmem[at],
                self.devcore[at],
                self.usedcores[at],
                self.present[at] & self.healthy[at] & ~self.cordoned[at],
            )
            self._free[at] = free
            self._free_total[at] = free.sum(axis=1)
        n = self._rows
        free_view, total_view = self._free[:n], self._free_total[:n]
        free_view.flags.writeable = False
        total_view.flags.writeable = False
        return free_view, total_view

    def rows(self, names: Sequence[str]) -> IntArray:
        """Row per name, -1 for a node the table does not have (read-only). kube-scheduler sends the same
        candidate list pod after pod, so the last answer is kept until a node gains or loses a row."""
        key = tuple(names)
        last = self._last_rows
        if last is not None and last[1] == self._layout and last[0] == key:
            return last[2]
        rows = np.fromiter(map(self.row_of.get, key, repeat(-1)), dtype=np.int64, count=len(key))
        rows.flags.writeable = False
        self._last_rows = (key, self._layout, rows)
        return rows


def json_string(text: str) -> bytes:
    """`text` as a JSON string, in a bytes object of its own size (orjson's answer keeps the ~4 KB buffer
    it wrote into: 20 MB for 5,000 kept node names)."""
    return b'"' + orjson.dumps(text)[1:-1] + b'"'


_SPACE = ord(" ")
_COMMA = ord(",")
_ZERO = ord("0")
_CLOSE = ord("]")
_HOST = b'{"Host":'
_SCORE = b',"Score":'
_LOG_MIN = 4096
"""`GPUTable`'s change log keeps at least this many versions (and twice its rows)."""


_NO_CPU = np.iinfo(np.int64).min
"""`FreeCPU`'s allocatable of a node whose allocatable CPU is unknown (no node has it)."""


class FreeCPU:
    """Each node's free CPU (milli-cores: its allocatable less what the watched pods on it request, as
    kube-scheduler counts it) as numpy arrays, so `/cpu-filter` and `--fragmentation-filter one` read
    5,000 nodes' at once. One slot per node name ever asked; `update` rewrites the slots of the nodes
    whose allocatable or requests changed (the cache's and the pod store's `drain_cpu_changed`), and a
    name asked for the first time is read from `lookup`. `of` answers the same as `lookup` node by node.
    Not thread-safe: the event loop that feeds the cache owns it."""

    def __init__(self, lookup: Callable[[str], tuple[int | None, int]], unknown: int) -> None:
        self.lookup = lookup
        """name -> (allocatable, None when unknown; requested)."""
        self.unknown = unknown
        """The free CPU `of` answers for a node whose allocatable is unknown."""
        self.slot_of: dict[str, int] = {}
        self._allocatable = np.zeros(_INITIAL_ROWS, dtype=np.int64)
        self._requested = np.zeros(_INITIAL_ROWS, dtype=np.int64)
        self._last: tuple[tuple[str, ...], IntArray] | None = None

    def update(self, changed: Iterable[str]) -> None:
        """Read the nodes of `changed` again (those never asked are read when first asked)."""
        for name in changed:
            slot = self.slot_of.get(name)
            if slot is not None:
                self._write(slot, name)

    def _write(self, slot: int, name: str) -> None:
        allocatable, requested = self.lookup(name)
        self._allocatable[slot] = _NO_CPU if allocatable is None else allocatable
        self._requested[slot] = requested

    def _slots(self, names: Sequence[str]) -> IntArray:
        """Slot per name, new names given one. Slots never move, so the last answer is kept for the next
        request with the same names (kube-scheduler sends the same candidate list pod after pod)."""
        key = tuple(names)
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        for name in key:
            if name not in self.slot_of:
                slot = len(self.slot_of)
                if slot == len(self._allocatable):
                    self._allocatable = np.concatenate([self._allocatable, np.zeros_like(self._allocatable)])
                    self._requested = np.concatenate([self._requested, np.zeros_like(self._requested)])
                self.slot_of[name] = slot
                self._write(slot, name)
        slots = np.fromiter(map(self.slot_of.__getitem__, key), dtype=np.int64, count=len(key))
        slots.flags.writeable = False
        self._last = (key, slots)
        return slots

    def of(self, names: Sequence[str]) -> IntArray:
        """Free CPU per node of `names` (`unknown` where the allocatable is)."""
        slots = self._slots(names)
        allocatable = self._allocatable[slots]
        free: IntArray = np.where(allocatable == _NO_CPU, self.unknown, allocatable - self._requested[slots])
        return free


@dataclass(frozen=True, slots=True)
class SimpleAsk:
    """A pod that `evaluate` covers: one container asks for GPUs."""

    request: ContainerRequest
    type_ok: BoolArray | None
    """Per interned type id whether the selector allows it (None: no constraint); modes and UUIDs alike."""
    mode_ok: BoolArray | None
    uuid_ok: BoolArray | None
    mutex: bool
    key: Hashable = None
    """What decides the verdicts besides the table (the request, the selector, the mutex policy): equal
    keys evaluate alike (`RowCache`)."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The answer for the candidates: `fits` and `unresolvable` have one entry per candidate in the
    caller's order; the rest is over the selected rows, for `failure_counts` and `score_inputs`."""

    fits: BoolArray
    unresolvable: BoolArray
    code: IntArray
    """(selected rows, width): per GPU the reason code (0 passes, -1 no GPU)."""
    mem: IntArray
    """(selected rows, width): MiB one slice of the request takes on each GPU."""
    selected: slice | IntArray
    """The table rows computed over: all of them (a slice, no copies) when the candidates are most of
    the table, else the candidates' rows."""
    pick: IntArray | None
    """Candidates' positions in the selected rows (None: the selection is the candidates)."""
    too_few: BoolArray
    uniform_mem: int | None = None
    """MiB of one slice on any GPU when it does not depend on the GPU (not a percentage)."""
    slow: BoolArray | None = None
    """Per candidate (the caller's order): a node with a MIG-mode GPU, which `fits` does not answer: the
    caller fits it with `fit_pod`. None when the table has no such node."""

    def failure_counts(self, table: GPUTable, candidates: IntArray) -> IntArray:
        """(len(candidates), codes + 1) for the given candidate positions: GPUs that failed per reason
        code as fit_pod counts them (HAMi's walk over every GPU), the passing GPUs of a node short of
        them as AllocatedCardsInsufficientRequest, none for a node with too few GPUs; the last column
        is the node's GPU count, the denominator of HAMi's text. See `reason_text`."""
        at = candidates if self.pick is None else self.pick[candidates]
        code = self.code[at]
        n = len(at)
        keys = (np.arange(n, dtype=np.int64) * (_NCODES + 1))[:, None] + (code + 1)
        tally = np.bincount(keys.ravel(), minlength=n * (_NCODES + 1)).reshape(n, _NCODES + 1)
        counts = np.empty((n, _NCODES + 1), dtype=np.int64)
        counts[:, :_ALLOCATED] = tally[:, 2 : _ALLOCATED + 2]
        counts[:, _ALLOCATED] = tally[:, 1]  # code 0: the GPU passes
        rows = np.arange(table.row_count)[self.selected][at]
        counts[:, _NCODES] = table.gpus[rows]
        counts[self.too_few[at], :_NCODES] = 0
        return counts


def simple_ask(
    table: GPUTable,
    requests: Sequence[tuple[ContainerRequest | None, bool]],
    selector: DeviceSelector,
    policy: Sequence[GPUPolicy],
    quota: QuotaCheck | None,
) -> SimpleAsk | None:
    """The ask `evaluate` can answer, or None when `fit_pod` must be used node by node."""
    asking = [r for r, _ in requests if r is not None]
    if len(asking) != 1 or selector.numa_bind:
        return None
    request = asking[0]
    if quota is not None:
        if request.memreq == 0 and request.mem_percentage is not None:
            return None  # memory per GPU depends on the GPU: leave it to fit_pod
        whole = QuotaUsage(request.memory_on(0) * request.nums, request.coresreq * request.nums)
        if not quota(whole):
            return None
    mutex = GPUPolicy.MUTEX in policy
    has_types = bool(selector.use_types or selector.nouse_types)
    has_uuids = bool(selector.use_uuids or selector.nouse_uuids)
    return SimpleAsk(
        request,
        table.allowed("type", selector.type_allowed) if has_types else None,
        table.allowed("mode", selector.mode_allowed) if selector.modes else None,
        table.allowed("uuid", selector.uuid_allowed) if has_uuids else None,
        mutex,
        (request, selector, mutex),
    )


def evaluate(table: GPUTable, rows: IntArray, ask: SimpleAsk) -> Evaluation:
    """fit_pod's verdict and reasons for each candidate row (all rows >= 0).

    When the candidates are at least half the table, everything is computed over the whole table (numpy
    views, no copies) and the per-node answers are picked out afterwards; else over copies of the
    candidates' rows."""
    t = table
    req = ask.request
    sel: slice | IntArray
    if 2 * len(rows) >= t.row_count:
        sel, pick = slice(0, t.row_count), rows
    else:
        sel, pick = rows, None
    present = t.present[sel]
    count, used = t.count[sel], t.used[sel]
    devmem, usedmem = t.devmem[sel], t.usedmem[sel]
    devcore, usedcores = t.devcore[sel], t.usedcores[sel]
    healthy = t.healthy[sel]
    gpus = t.gpus[sel]

    type_bad = np.zeros_like(present)
    if ask.type_ok is not None:
        type_bad |= ~ask.type_ok[t.type_id[sel]]
    if ask.mode_ok is not None:
        type_bad |= ~ask.mode_ok[t.mode_id[sel]]
    type_bad &= present
    uuid_bad = np.zeros_like(present)
    if ask.uuid_ok is not None:
        uuid_bad = ~ask.uuid_ok[t.uuid_id[sel]] & ~type_bad & present

    if req.memreq > 0:
        mem = np.full(present.shape, req.memreq, dtype=np.int64)
    elif req.mem_percentage is not None:
        mem = devmem * req.mem_percentage // 100
    else:
        mem = np.zeros(present.shape, dtype=np.int64)
    cores = req.coresreq

    # Assign codes from the last rule to the first, so the first rule a GPU breaks is what stays.
    code = np.zeros(present.shape, dtype=np.int64)
    if cores == 0:
        code[(usedcores >= devcore) & (devcore > 0)] = 10
    if cores == 100:
        code[(devcore == 100) & (used > 0)] = 9
    code[devcore - usedcores < cores] = 8
    code[devmem - usedmem < mem] = 7
    if ask.mutex:
        code[used > 0] = 6
    code[count <= used] = 5
    code[uuid_bad] = 4
    code[type_bad] = 3
    code[t.cordoned[sel]] = 2
    code[~healthy] = 1
    code[~present] = -1

    passing = np.count_nonzero(code == 0, axis=1)
    too_few = gpus < req.nums
    unresolvable = too_few
    if ask.type_ok is not None or ask.mode_ok is not None or ask.uuid_ok is not None:
        eligible = np.count_nonzero(present & ~type_bad & ~uuid_bad, axis=1)
        unresolvable = too_few | (eligible < req.nums)
    fits = (passing >= req.nums) & ~unresolvable
    if pick is not None:
        fits, unresolvable = fits[pick], unresolvable[pick]
    uniform = req.memreq if req.memreq > 0 else (0 if req.mem_percentage is None else None)
    slow = None
    if t.mig_rows:
        slow = t.mig[rows]
        fits = fits & ~slow
    return Evaluation(fits, unresolvable, code, mem, sel, pick, too_few, uniform, slow)


def score_inputs(table: GPUTable, ev: Evaluation) -> tuple[IntArray, tuple[IntArray, ...]]:
    """For `node_scores`: the MiB of one slice on each candidate (-1 when a percentage request meets
    passing GPUs of different sizes, so the score needs fit_pod's actual choice), and the sums over
    the GPUs that `score.node_usage` reads (used, count, usedcores, devcore, usedmem, devmem)."""
    t, sel = table, ev.selected
    if ev.uniform_mem is not None:
        slice_mem = np.full(len(ev.code), ev.uniform_mem, dtype=np.int64)
    else:
        passing = ev.code == 0
        big = np.iinfo(np.int64).max
        low = np.where(passing, ev.mem, big).min(axis=1)
        high = np.where(passing, ev.mem, -1).max(axis=1)
        slice_mem = np.where(low == high, high, -1)
    kept = t.sums[sel]
    sums = tuple(kept[:, k] for k in range(6))
    if ev.pick is not None:
        return slice_mem[ev.pick], tuple(x[ev.pick] for x in sums)
    return slice_mem, sums


def node_scores(
    slice_mem: IntArray, sums: tuple[IntArray, ...], request: ContainerRequest, policy: NodePolicy
) -> IntArray:
    """`score.node_priority` of each candidate with `request.nums` slices of `slice_mem` MiB placed on
    the node's GPUs (`score_inputs`): the same float operations in the same order as `score.node_usage`, so
    the same rounding. Meaningless where the node does not fit or `slice_mem` is -1."""
    used, count, usedcores, devcore, usedmem, devmem = sums
    nums = request.nums

    def ratio(part: IntArray, total: IntArray) -> npt.NDArray[np.float64]:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = part / total
        return np.where(total <= 0, 0.0, np.clip(r, 0.0, 1.0))

    slots = ratio(used + nums, count)
    cores = ratio(usedcores + nums * request.coresreq, devcore)
    mem = ratio(usedmem + nums * slice_mem, devmem)
    usage = MAX_SCORE * (slots + cores + mem) / 3
    score = usage if policy is NodePolicy.BINPACK else MAX_SCORE - usage
    return np.rint(np.clip(score, 0.0, float(MAX_SCORE))).astype(np.int64)


def _free_before_after(
    table: GPUTable, ev: Evaluation, request: ContainerRequest
) -> tuple[IntArray, IntArray, BoolArray]:
    """Per candidate of `ev` and GPU (the policy's pick order where there is one): the free milli-GPUs
    before and after one slice of `request` (`frag.free_milli_arrays`), and whether the GPU passes."""
    t, sel = table, ev.selected
    in_service = t.present[sel] & t.healthy[sel] & ~t.cordoned[sel]
    count, used, devmem = t.count[sel], t.used[sel], t.devmem[sel]
    usedmem, devcore, usedcores = t.usedmem[sel], t.devcore[sel], t.usedcores[sel]
    free = free_milli_arrays(count, used, devmem, usedmem, devcore, usedcores, in_service)
    newfree = free_milli_arrays(
        count, used + 1, devmem, usedmem + ev.mem, devcore, usedcores + request.coresreq, in_service
    )
    passing = ev.code == 0
    if ev.pick is not None:
        return free[ev.pick], newfree[ev.pick], passing[ev.pick]
    return free, newfree, passing


def fragmentation_scores(
    table: GPUTable, ev: Evaluation, request: ContainerRequest, mix: TaskMix
) -> tuple[IntArray, BoolArray]:
    """`score.node_priority` under the fragmentation node policy for a one-GPU pod placed by the
    fragmentation GPU policy, for each candidate: fit_pod takes the passing GPU whose slice grows the
    node's fragmentation least (`frag.gpu_growth`), and the score is `score.growth_score` of that growth.
    Same per-row float operations as the node-by-node path. Also a mask of the candidates to score node
    by node instead: GPUs tied on a least growth other than 0 that would take different amounts (GPUs of
    different sizes, where fit_pod's pick depends on NUMA order). Meaningless where the node does not fit."""
    free, newfree, passing = _free_before_after(table, ev, request)
    growth = np.where(passing, after_each_gpu(free, newfree, mix) - fragmentation(free, mix)[:, None], np.inf)
    least = growth.min(axis=1, initial=np.inf)
    tied = passing & (growth == least[:, None])
    taken = free - newfree
    big = np.iinfo(np.int64).max
    low = np.where(tied, taken, big).min(axis=1, initial=big)
    high = np.where(tied, taken, -1).max(axis=1, initial=-1)
    finite = np.isfinite(least)
    safe_least = np.where(finite, least, 0.0)
    scores = np.array(
        [round(growth_score(g, int(k))) for g, k in zip(safe_least.tolist(), low.tolist(), strict=True)],
        dtype=np.int64,
    )
    # The amount taken matters only when the least growth is not 0: growth_score(0, any) is 5. Small task
    # shapes (a learned mix of small pods) leave most GPUs tied at 0, which would all go node by node.
    return scores, finite & (low != high) & (np.round(safe_least, 6) != 0)


def fragmentation_growth(  # noqa: PLR0917 (the table, the ask and the hosts, named)
    table: GPUTable,
    ev: Evaluation,
    request: ContainerRequest,
    mix: TaskMix,
    cpu_free: IntArray,
    cpu_asked: int,
) -> FloatArray:
    """Per candidate of `ev` (its order): `frag.least_growth`, the least growth of the node's fragmentation
    for `mix` with the pod's slice on one of its passing GPUs (or `request.nums` whole GPUs), a shape hosted
    only where the node's free CPU (`cpu_free`, per candidate) takes its CPU, before and after the pod's
    `cpu_asked`. What `--fragmentation-filter best` keeps the least of. Meaningless where the node does
    not fit."""
    free, newfree, passing = _free_before_after(table, ev, request)
    return least_growth(free, newfree, passing, request.nums, mix, cpu_free, cpu_asked)


def fragmentation_best_scores(  # noqa: PLR0917 (the table, the ask and the hosts, named)
    table: GPUTable,
    ev: Evaluation,
    request: ContainerRequest,
    mix: TaskMix,
    cpu_free: IntArray,
    cpu_asked: int,
) -> IntArray:
    """Per candidate of `ev` (its order): `frag.best_scores`, FGD's score of the pod's best placement on
    the node with CPU in the measure. What `--fragmentation-filter one` answers the best node of.
    Meaningless where the node does not fit."""
    free, newfree, passing = _free_before_after(table, ev, request)
    a = arrays(mix)
    parts = (free, newfree, passing, cpu_free[:, None] >= a.cpu, (cpu_free - cpu_asked)[:, None] >= a.cpu)
    distinct = distinct_rows(parts) if len(free) > _DISTINCT_FROM else None
    if distinct is None:
        return best_scores(free, newfree, passing, request.nums, mix, cpu_free, cpu_asked)
    # Candidates alike in every input score alike (`best_scores` is row by row, the same float operations
    # whatever the rows around): score one of each kind (an idle cluster has a handful of kinds).
    first, which = distinct
    f, nf, ok, cpu = free[first], newfree[first], passing[first], cpu_free[first]
    result: IntArray = best_scores(f, nf, ok, request.nums, mix, cpu, cpu_asked)[which]
    return result


_DISTINCT_FROM = 64
"""Candidates from which `fragmentation_best_scores` looks for alike ones first (below, scoring all costs
less than looking)."""


@lru_cache(maxsize=8)
def _hash_weights(width: int) -> IntArray:
    weights: IntArray = np.random.default_rng(width).integers(1, 2**62, size=width, dtype=np.int64) | 1
    weights.flags.writeable = False
    return weights


def distinct_rows(parts: Sequence[npt.NDArray[np.int64] | BoolArray]) -> tuple[IntArray, IntArray] | None:
    """For per-row arrays `(N, ...)` side by side: (the first row of each distinct kind, the kind of each
    row), so that `f(x[first])[which]` is `f(x)` for a row-by-row `f`. Keyed by a 64-bit hash of each
    row, then checked row by row: None (compute every row) in the unlikely case two different rows share
    a hash."""
    rows = np.concatenate([p.reshape(len(p), -1).astype(np.int64, copy=False) for p in parts], axis=1)
    keys = rows @ _hash_weights(rows.shape[1])  # wraps around on overflow: a hash
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    which = which.ravel()
    if not np.array_equal(rows[first][which], rows):
        return None
    return first, which


def free_milli_rows(table: GPUTable, rows: IntArray) -> IntArray:
    """`(len(rows), width)`: each GPU's free milli-GPUs (`frag.free_milli_arrays`) on the nodes of `rows`;
    a row of -1 (a node the table does not have) has none free. From the table's kept `free_milli`."""
    free, _ = table.free_milli()
    if not len(free):
        return np.zeros((len(rows), table.width), dtype=np.int64)
    result: IntArray = np.where((rows >= 0)[:, None], free[np.maximum(rows, 0)], 0)
    return result


def free_total_rows(table: GPUTable, rows: IntArray) -> IntArray:
    """`(len(rows),)`: the free milli-GPUs of each node of `rows` (`free_milli_rows(...).sum(axis=1)`,
    from the table's kept sums), 0 for a row of -1."""
    _, total = table.free_milli()
    if not len(total):
        return np.zeros(len(rows), dtype=np.int64)
    result: IntArray = np.where(rows >= 0, total[np.maximum(rows, 0)], 0)
    return result


def group_rows(rows: IntArray) -> tuple[IntArray, IntArray]:
    """(distinct rows, index of each row's distinct row): `np.unique(rows, axis=0, return_inverse=True)`
    but on one packed integer key per row (a 1-D sort, ~20x faster on thousands of rows)."""
    if len(rows) == 0:
        return rows, np.zeros(0, dtype=np.int64)
    base = int(rows.max()) + 1
    if base > 1 and rows.shape[1] * np.log2(base) >= 62:
        patterns, which = np.unique(rows, axis=0, return_inverse=True)
        return patterns, which.ravel()
    weights = base ** np.arange(rows.shape[1], dtype=np.int64)
    keys = rows @ weights
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], which.ravel()


class ReasonTexts:
    """HAMi's FailedNodes texts (`reason_text`) by id, each with its JSON string and its reason words (the
    filter-reason counters'), interned by failure pattern (a row of `Evaluation.failure_counts`)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], int] = {}
        self._by_text: dict[str, int] = {}
        self.texts: list[str] = []
        self.json: list[bytes] = []
        """Per id: the text as a JSON string."""
        self.words: list[tuple[str, ...]] = []
        """Per id: the reason words of the text (`node_reasons`)."""

    def __len__(self) -> int:
        return len(self.texts)

    def intern(self, pattern: Sequence[int]) -> int:
        key = tuple(pattern)
        found = self._ids.get(key)
        if found is None:
            text = reason_text(key)
            found = self._by_text.get(text)
            if found is None:
                found = self._by_text[text] = len(self.texts)
                self.texts.append(text)
                self.json.append(json_string(text))
                self.words.append(tuple(node_reasons(key)))
            self._ids[key] = found
        return found


RowArrays = tuple[npt.NDArray[Any], ...]
"""What a `RowCache` computation answers: arrays with one entry per row asked."""


class RowCache:
    """Per-row results of computations over the table (per key: an ask's verdicts, its scores, ...), each
    kept current through the table's change log (`GPUTable.changed_since`): a request recomputes only the
    rows written, removed or touched since the last request with that key, and every row after the arrays
    were reallocated. A computation must be row by row (a row's result depends on that row's inputs and
    the key only), which is what makes a kept row's result the one a fresh computation gives; the property
    tests compare the two. Bounded: the `entries` keys used last. Not thread-safe (the event loop's)."""

    def __init__(self, table: GPUTable, entries: int = 16) -> None:
        self.table = table
        self.entries = entries
        self._kept: dict[Hashable, tuple[int, int, RowArrays]] = {}
        """key -> (table epoch, table version, arrays over the table's capacity)."""
        self.texts = ReasonTexts()
        """The reason texts the `verdicts` computations intern (kept while their ids are in use)."""

    def get(self, key: Hashable, compute: Callable[[IntArray], RowArrays]) -> RowArrays:
        """The arrays of `key`, indexed by row and current for every row in use: `compute(rows)` answers
        the arrays for the given rows (distinct, sorted), in that order. Read-only."""
        t = self.table
        version = t.version  # what is touched while computing (free CPU read anew) is caught up next time
        kept = self._kept.pop(key, None)
        if kept is not None and kept[0] == t.epoch:
            arrays = kept[2]
            if kept[1] != t.version:
                changed = t.changed_since(kept[1])
                if changed is None:
                    arrays = self._full(compute)
                elif len(changed):
                    for whole, part in zip(arrays, compute(changed), strict=True):
                        whole.flags.writeable = True
                        whole[changed] = part
                        whole.flags.writeable = False
        else:
            arrays = self._full(compute)
        self._kept[key] = (t.epoch, version, arrays)
        while len(self._kept) > self.entries:
            del self._kept[next(iter(self._kept))]
        return arrays

    def _full(self, compute: Callable[[IntArray], RowArrays]) -> RowArrays:
        t = self.table
        n = t.row_count
        out: list[npt.NDArray[Any]] = []
        for part in compute(np.arange(n, dtype=np.int64)):
            whole = np.zeros(t.capacity, dtype=part.dtype)
            whole[:n] = part
            whole.flags.writeable = False
            out.append(whole)
        return tuple(out)

    def verdicts(self, ask: SimpleAsk) -> tuple[BoolArray, BoolArray, IntArray]:
        """Per row, `evaluate`'s verdict for `ask`: (fits, unresolvable, the id of its FailedNodes text in
        `texts`, -1 where it fits). A row with a MIG-mode GPU does not fit here (`Evaluation.slow`)."""
        texts = self.texts
        if len(texts) > _MAX_TEXTS:  # never in practice: start over rather than grow without end
            self._kept.clear()
            texts = self.texts = ReasonTexts()
        table = self.table

        def compute(rows: IntArray) -> RowArrays:
            ev = evaluate(table, rows, ask)
            fits = ev.fits
            text = np.full(len(rows), -1, dtype=np.int64)
            failing = np.flatnonzero(~fits)
            if len(failing):
                patterns, which = group_rows(ev.failure_counts(table, failing))
                ids = np.array([texts.intern(p) for p in patterns.tolist()], dtype=np.int64)
                text[failing] = ids[which]
            return fits, ev.unresolvable, text

        fits, unresolvable, text = self.get(("verdicts", ask.key), compute)
        return fits, unresolvable, text

    def scores(self, ask: SimpleAsk, policy: NodePolicy) -> tuple[IntArray, BoolArray]:
        """Per row, `node_scores` of `ask` under the binpack or spread `policy`, and whether the row must
        be scored from fit_pod's choice instead (a percentage over passing GPUs of different sizes; a
        row with a MIG-mode GPU, which never fits here, too). Meaningless where the row does not fit."""
        table = self.table

        def compute(rows: IntArray) -> RowArrays:
            ev = evaluate(table, rows, ask)
            slice_mem, sums = score_inputs(table, ev)
            return node_scores(slice_mem, sums, ask.request, policy), slice_mem < 0

        score, exact = self.get(("scores", ask.key, policy), compute)
        return score, exact

    def fragmentation_scores(self, ask: SimpleAsk, mix: TaskMix) -> tuple[IntArray, BoolArray]:
        """Per row, `fragmentation_scores` of `ask` under `mix` (its score, and its mask of rows to score
        node by node; a row with a MIG-mode GPU never fits here). Meaningless where the row does not
        fit."""
        table = self.table

        def compute(rows: IntArray) -> RowArrays:
            return fragmentation_scores(table, evaluate(table, rows, ask), ask.request, mix)

        score, slow = self.get(("fragmentation", ask.key, mix), compute)
        return score, slow

    def host_fragmentation(
        self,
        ask: SimpleAsk,
        mix: TaskMix,
        cpu_free: Callable[[Sequence[str]], IntArray],
        cpu_asked: int,
        one: bool,
    ) -> FloatArray | IntArray:
        """Per row, with each node's free CPU (`cpu_free` of the rows' node names, touched in the table
        when it changes) in the measure: `fragmentation_best_scores` (`one`) or `fragmentation_growth`
        of `ask` under `mix`. Meaningless where the row does not fit."""
        table = self.table

        def compute(rows: IntArray) -> RowArrays:
            ev = evaluate(table, rows, ask)
            names = [table.name_of[r] for r in rows.tolist()]
            cpu = cpu_free(names)
            if one:
                return (fragmentation_best_scores(table, ev, ask.request, mix, cpu, cpu_asked),)
            return (fragmentation_growth(table, ev, ask.request, mix, cpu, cpu_asked),)

        (values,) = self.get(("host", one, ask.key, mix, cpu_asked), compute)
        return values


_MAX_TEXTS = 1 << 16


def reason_text(counts: Sequence[int]) -> str:
    """HAMi's FailedNodes text from one row of `Evaluation.failure_counts` (`fit.reasons_text`)."""
    return reasons_text(_merged(counts), int(counts[_NCODES]))


def _merged(counts: Sequence[int]) -> list[tuple[Reason, int]]:
    merged: dict[Reason, int] = {}
    for k in range(_NCODES):
        if counts[k]:
            merged[_CODES[k]] = merged.get(_CODES[k], 0) + int(counts[k])
    return list(merged.items())


def node_reasons(counts: Sequence[int]) -> dict[str, int]:
    """Reason word -> failed GPUs, for the filter-reason counters."""
    out = {reason.value: n for reason, n in _merged(counts)}
    return out or {Reason.NODE_INSUFFICIENT_DEVICE.value: int(counts[_NCODES])}


__all__ = [
    "Evaluation",
    "FreeCPU",
    "GPUTable",
    "ReasonTexts",
    "RowCache",
    "SimpleAsk",
    "distinct_rows",
    "evaluate",
    "fragmentation_best_scores",
    "fragmentation_growth",
    "fragmentation_scores",
    "free_milli_rows",
    "free_total_rows",
    "group_rows",
    "node_reasons",
    "node_scores",
    "reason_text",
    "score_inputs",
    "simple_ask",
]
