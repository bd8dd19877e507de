"""hami_node.dra.checkpoint: the prepared claims round-trip through the file's bytes (version 1, the
document earlier hami-nodes wrote; version 2, the journal), a journal cut short by a crash keeps its whole
records, and a file that is not one this version wrote (corrupt, edited, older or newer) is refused
saying why."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.dra.checkpoint import (
    KIND,
    VERSION,
    Checkpoint,
    CheckpointError,
    Journal,
    _line,
    checksum,
    decode,
    decode_journal,
    encode,
    encode_del,
    encode_journal,
    encode_put,
    journal_header,
)
from hami_node.dra.claims import MigRecord, PreparedClaim, PreparedDevice

UID = "11111111-1111-4111-8111-111111111111"


def device(n: int, share: str | None = "s") -> PreparedDevice:
    return PreparedDevice(
        "gpu", f"hami-gpu-{n}", share, f"GPU-{n}", n, 0, 4000, 30, f"{UID}-hami-gpu-{n}-{share or 'whole'}"
    )


CLAIM = PreparedClaim("default", "claim", UID, "n1", (device(0), device(1, None)), sole=False, private=True)


def test_a_checkpoint_round_trips_through_its_bytes() -> None:
    checkpoint = Checkpoint({UID: CLAIM})
    assert decode(encode(checkpoint)) == checkpoint
    assert decode(encode(Checkpoint())) == Checkpoint()


def test_the_file_says_what_it_is_its_version_and_its_checksum() -> None:
    doc = json.loads(encode(Checkpoint({UID: CLAIM})))
    assert doc["kind"] == KIND == "HamiDraCheckpoint"
    assert doc["version"] == VERSION == 1
    assert doc["checksum"].startswith("sha256:")
    assert doc["claims"][UID]["devices"][1] == {
        "request": "gpu", "device": "hami-gpu-1", "shareID": None, "gpu": "GPU-1", "minor": 1, "index": 0,
        "memoryMiB": 4000, "cores": 30, "cdiName": f"{UID}-hami-gpu-1-whole",
    }  # fmt: skip


def test_claims_are_written_in_uid_order_so_equal_checkpoints_are_equal_bytes() -> None:
    other = PreparedClaim("ns", "b", "00000000-0000-4000-8000-000000000000", "n1", (device(2),))
    a = Checkpoint({UID: CLAIM, other.uid: other})
    b = Checkpoint({other.uid: other, UID: CLAIM})
    assert encode(a) == encode(b)


def test_adding_and_removing_claims() -> None:
    checkpoint = Checkpoint().with_claim(CLAIM)
    assert checkpoint.claims == {UID: CLAIM}
    assert checkpoint.without(UID) == Checkpoint()
    assert checkpoint.without("unknown") == checkpoint


def edited(change: str) -> bytes:
    doc = json.loads(encode(Checkpoint({UID: CLAIM})))
    if change == "memory":
        doc["claims"][UID]["devices"][0]["memoryMiB"] = 80000
    elif change == "version-0":
        doc["version"] = 0
    elif change == "version-2":
        doc["version"] = 2
    elif change == "kind":
        doc["kind"] = "Other"
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not JSON"),
        (b'{"kind": "HamiDraCheckpoint", "vers', "not JSON"),
        (b"[]", "not a hami-node DRA checkpoint"),
        (edited("kind"), "not a hami-node DRA checkpoint (kind 'Other')"),
        (edited("memory"), "checksum mismatch: the file was changed or cut short"),
        (edited("version-0"), "version 0 is not one hami-node wrote (this one reads 1)"),
        (edited("version-2"), "version 2 is newer than this hami-node reads (1)"),
    ],
)
def test_a_bad_file_is_refused_saying_why(data: bytes, reason: str) -> None:
    with pytest.raises(CheckpointError) as info:
        decode(data)
    assert str(info.value).startswith(reason)


def test_a_wrongly_typed_field_under_a_valid_checksum_is_refused_naming_it() -> None:
    doc = json.loads(encode(Checkpoint({UID: CLAIM})))
    doc["claims"][UID]["devices"][0]["index"] = "zero"
    doc["checksum"] = checksum(VERSION, doc["claims"])
    with pytest.raises(
        CheckpointError, match=rf"claims\[{UID}\].devices\[0\].index: unexpected value 'zero'"
    ):
        decode(json.dumps(doc).encode())


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused_never_crash(data: bytes) -> None:
    with contextlib.suppress(CheckpointError):
        decode(data)


# --- version 2: the journal ---------------------------------------------------------------------------------

UIDS = [f"{n:08x}-0000-4000-8000-000000000000" for n in range(4)]
MIG = MigRecord("GPU-0", 1, "MIG-1", "1g.5gb", 6, 1)
claims_st = st.builds(
    PreparedClaim,
    namespace=st.sampled_from(["default", "ns"]),
    name=st.text("abc-", min_size=1, max_size=8),
    uid=st.sampled_from(UIDS),
    pool=st.just("n1"),
    devices=st.lists(
        st.builds(
            PreparedDevice,
            request=st.sampled_from(["gpu", "gpu/a"]),
            device=st.sampled_from(["hami-gpu-0", "hami-gpu-1"]),
            share_id=st.one_of(st.none(), st.text("0123456789abcdef-", max_size=12)),
            gpu=st.text(min_size=1, max_size=10),
            minor=st.integers(0, 15),
            index=st.integers(0, 15),
            memory_mib=st.integers(0, 1 << 20),
            cores=st.integers(0, 100),
            cdi_name=st.text(max_size=20),
            mig=st.one_of(st.none(), st.just(MIG)),
        ),
        max_size=3,
    ).map(tuple),
    sole=st.booleans(),
    private=st.booleans(),
)
ops_st = st.lists(st.one_of(claims_st, st.sampled_from(UIDS)), max_size=12)
"""A claim: prepared (put); a UID: unprepared (del)."""


def replayed(ops: list[PreparedClaim | str]) -> tuple[bytes, list[dict[str, PreparedClaim]]]:
    """The journal of `ops` and the claims after each record (the first: none)."""
    data = journal_header()
    states: list[dict[str, PreparedClaim]] = [{}]
    for op in ops:
        state = dict(states[-1])
        if isinstance(op, str):
            data += encode_del(op)
            state.pop(op, None)
        else:
            data += encode_put(op)
            state[op.uid] = op
        states.append(state)
    return data, states


@given(ops_st)
def test_a_journal_replays_to_the_claims_its_records_leave(ops: list[PreparedClaim | str]) -> None:
    data, states = replayed(ops)
    journal = decode_journal(data)
    assert journal == Journal(states[-1], len(data), len(ops))
    assert decode_journal(encode_journal(journal.claims)) == Journal(
        states[-1], len(encode_journal(states[-1])), len(states[-1])
    )


@given(ops_st, st.data())
def test_records_appended_after_a_read_are_replayed_from_where_they_start(
    ops: list[PreparedClaim | str], data: st.DataObject
) -> None:
    whole, states = replayed(ops)
    lines = whole.splitlines(keepends=True)
    cut = data.draw(st.integers(1, len(lines)))
    offset = sum(len(line) for line in lines[:cut])
    first = decode_journal(whole[:offset])
    rest = decode_journal(whole[offset:], first.claims, offset=offset)
    assert rest == Journal(states[-1], len(whole), len(ops) - (cut - 1))


@given(ops_st, st.data())
def test_a_journal_cut_anywhere_after_its_header_keeps_its_whole_records_and_says_why(
    ops: list[PreparedClaim | str], data: st.DataObject
) -> None:
    """A crash between (or during) appends: what was written whole is read, the rest is dropped with a
    reason, never an exception."""
    whole, states = replayed(ops)
    header = len(journal_header())
    cut = data.draw(st.integers(header, len(whole)))
    journal = decode_journal(whole[:cut])
    complete = whole[:cut].count(b"\n") - 1
    assert journal.claims == states[complete] and journal.records == complete
    assert journal.length == whole[:cut].rfind(b"\n") + 1
    assert bool(journal.torn) == (journal.length != cut)
    if journal.torn:
        assert "no end of line: the write was cut short" in journal.torn


def test_a_torn_last_line_that_ends_in_a_newline_is_dropped_saying_why() -> None:
    data, _ = replayed([CLAIM])
    journal = decode_journal(data[:-10] + b"\n")
    assert journal.claims == {} and journal.records == 0 and journal.length == len(journal_header())
    assert journal.torn.startswith(f"record 1 at byte {len(journal_header())}: CRC mismatch")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty: no header"),
        (b"d5a026b0 {", "header: no end of line"),
        (b'00000000 {"kind":"HamiDraCheckpoint","version":2}\n', "header: CRC mismatch"),
        (b"xyz\n", "header: not a journal record"),
        (
            _line(b'{"kind":"Other","version":2}'),
            "header: not a hami-node DRA checkpoint journal",
        ),
        (_line(b'{"kind":"HamiDraCheckpoint","version":3}'), "header: version 3 is newer than this"),
        (_line(b'{"kind":"HamiDraCheckpoint","version":1}'), "header: version 1 is not one hami-node wrote"),
        (
            journal_header() + _line(b'{"put":{"uid":"u"}}') + encode_del("u"),
            "record 1 at byte 50: claims[u].devices: unexpected value None, with 1 more lines after it",
        ),
        (
            journal_header() + _line(b'{"put":1,"del":"u"}') + encode_del("u"),
            "record 1 at byte 50: expected one",
        ),
        (journal_header() + _line(b"[]") + encode_del("u"), "record 1 at byte 50: expected a JSON object"),
        (
            journal_header() + _line(b'{"del":7}') + encode_del("u"),
            "record 1 at byte 50: del: unexpected value 7",
        ),
        (
            journal_header() + b"zzzzzzzz {}\n" + encode_del("u"),
            "record 1 at byte 50: CRC b'zzzzzzzz' is not",
        ),
    ],
)
def test_a_bad_journal_is_refused_saying_why(data: bytes, reason: str) -> None:
    with pytest.raises(CheckpointError) as info:
        decode_journal(data)
    assert str(info.value).startswith(reason)


@given(st.binary(max_size=300))
def test_any_bytes_after_a_header_decode_or_are_refused_never_crash(data: bytes) -> None:
    with contextlib.suppress(CheckpointError):
        decode_journal(journal_header() + data)
    with contextlib.suppress(CheckpointError):
        decode_journal(data)
