"""hami_node.dra.checkpoint: the prepared claims round-trip through the file's bytes, and a file that is not
one this version wrote (corrupt, cut short, edited, older or newer) is refused saying why."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.dra.checkpoint import KIND, VERSION, Checkpoint, CheckpointError, checksum, decode, encode
from hami_node.dra.claims import PreparedClaim, PreparedDevice

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
