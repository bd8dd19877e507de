"""The DRA plugin's checkpoint: the claims it has prepared, kept on disk so that NodePrepareResources is
idempotent across restarts (a claim prepared before answers with what it got then, and its shared cache
is never wiped) and NodeUnprepareResources knows what to remove after the claim object is gone.

## Version 2: an append-only journal (what this hami-node writes)

File `<plugins dir>/<driver>/state/claims.journal` (a subdirectory: the daemon watches the plugin
directory itself for its sockets, not below it), one record per line, each line
`<crc32 of the JSON, 8 hex digits> <JSON>`:

```
1c291ca3 {"kind":"HamiDraCheckpoint","version":2}
5b0e8a55 {"put":{"uid":"<claimUID>","namespace":"ns","name":"claim","pool":"node-a",...,"devices":[...]}}
0d4f1e2b {"del":"<claimUID>"}
```

The first line is the header; then each Prepare appends one `put` per claim it prepared (the claim's
object as in version 1, with its `uid`) and each Unprepare one `del` per claim it knew, in one `write`
followed by `fdatasync`, so the cost of a call does not grow with the claims prepared before it. When
the records outnumber twice the live claims (and 64), the file is written again whole with one `put`
per claim (`encode_journal`, atomically: `hami_node.durable.write_atomic`). Replaying the records in
order gives the claims (`decode_journal`). The CRC makes a line cut short or edited detectable: the
last line, if bad, is a write a crash interrupted (never answered to kubelet: the answer waits for the
`fdatasync`) and is dropped with its reason (`Journal.torn`); a bad line with good lines after it
means the file was changed, and `decode_journal` refuses the whole file (`CheckpointError`), as a bad
version 1 file is refused.

## Version 1: one JSON document (what earlier hami-nodes wrote; read once at start-up)

File `<plugins dir>/<driver>/checkpoint.json`, JSON:

```json
{"kind": "HamiDraCheckpoint", "version": 1, "checksum": "sha256:<hex>",
 "claims": {"<claimUID>": {"namespace": "ns", "name": "claim", "pool": "node-a", "sole": true,
                            "private": true,
                            "devices": [{"request": "gpu", "device": "hami-gpu-0", "shareID": "<uuid>",
                                         "gpu": "GPU-...", "minor": 0, "index": 0, "memoryMiB": 4000,
                                         "cores": 30, "cdiName": "<claimUID>-hami-gpu-0-<uuid>"}]}}}
```

A MIG partition's device also has `"mig": {"parentUUID": "GPU-...", "gpuInstanceID": 1, "uuid": "MIG-...",
"profile": "1g.5gb", "start": 6, "size": 1}`: the GPU instance Unprepare destroys, kept so that
Unprepare and a restarted daemon find it (an optional key: version 1 still).

`checksum` is the SHA-256 of the canonical JSON (sorted keys, no spaces) of `{"version", "claims"}`, as
kubelet's checkpoints carry one (pkg/kubelet/checkpointmanager): a file cut short or edited by hand is
refused rather than half-read. `decode` raises `CheckpointError` for a bad file, a wrong checksum, or a
version other than `VERSION` (naming it: older than any hami-node wrote, or newer than this one reads).
The daemon then moves the file aside and starts empty (`prepare.ClaimPreparer`): a claim prepared again
gets the same answer (its indices and names follow from the claim), and Unprepare finds a claim's files
by its UID alone. A version 1 file found at start-up is taken over: its claims are written to the
journal, then the file is removed (`prepare.ClaimPreparer.start`).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from hami_node.dra.claims import MigRecord, PreparedClaim, PreparedDevice

KIND = "HamiDraCheckpoint"
VERSION = 1
"""The version of `FILE_NAME` (what earlier hami-nodes wrote)."""
FILE_NAME = "checkpoint.json"
JOURNAL_VERSION = 2
STATE_DIR = "state"
JOURNAL_FILE = "claims.journal"
COMPACT_MIN_RECORDS = 64
"""The journal is written again whole once its records outnumber max(this, 2 x live claims)."""


class CheckpointError(ValueError):
    """The checkpoint cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Prepared claims by UID."""

    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)

    def with_claim(self, claim: PreparedClaim) -> Checkpoint:
        return Checkpoint({**self.claims, claim.uid: claim})

    def without(self, uid: str) -> Checkpoint:
        return Checkpoint({k: v for k, v in self.claims.items() if k != uid})


def _mig_json(mig: MigRecord) -> dict[str, Any]:
    return {
        "parentUUID": mig.parent_uuid,
        "gpuInstanceID": mig.gpu_instance_id,
        "uuid": mig.uuid,
        "profile": mig.profile,
        "start": mig.start,
        "size": mig.size,
    }


def _device_json(device: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request": device.request,
        "device": device.device,
        "shareID": device.share_id,
        "gpu": device.gpu,
        "minor": device.minor,
        "index": device.index,
        "memoryMiB": device.memory_mib,
        "cores": device.cores,
        "cdiName": device.cdi_name,
    }
    if device.mig is not None:
        out["mig"] = _mig_json(device.mig)
    return out


def _claim_json(claim: PreparedClaim) -> dict[str, Any]:
    return {
        "namespace": claim.namespace,
        "name": claim.name,
        "pool": claim.pool,
        "sole": claim.sole,
        "private": claim.private,
        "devices": [_device_json(d) for d in claim.devices],
    }


def checksum(version: object, claims: object) -> str:
    """`sha256:<hex>` of the canonical JSON of {version, claims}."""
    canonical = json.dumps({"version": version, "claims": claims}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes (claims sorted by UID, so equal checkpoints encode equally)."""
    claims = {uid: _claim_json(checkpoint.claims[uid]) for uid in sorted(checkpoint.claims)}
    doc = {"kind": KIND, "version": VERSION, "checksum": checksum(VERSION, claims), "claims": claims}
    return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CheckpointError(f"{where}.{key}: unexpected value {value!r}")
    return value


def _mig(obj: object, where: str) -> MigRecord | None:
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{where}: expected an object")
    return MigRecord(
        parent_uuid=_field(obj, "parentUUID", str, where),
        gpu_instance_id=_field(obj, "gpuInstanceID", int, where),
        uuid=_field(obj, "uuid", str, where),
        profile=_field(obj, "profile", str, where),
        start=_field(obj, "start", int, where),
        size=_field(obj, "size", int, where),
    )


def _device(obj: object, where: str) -> PreparedDevice:
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{where}: expected an object")
    share = obj.get("shareID")
    if share is not None and not isinstance(share, str):
        raise CheckpointError(f"{where}.shareID: unexpected value {share!r}")
    return PreparedDevice(
        request=_field(obj, "request", str, where),
        device=_field(obj, "device", str, where),
        share_id=share,
        gpu=_field(obj, "gpu", str, where),
        minor=_field(obj, "minor", int, where),
        index=_field(obj, "index", int, where),
        memory_mib=_field(obj, "memoryMiB", int, where),
        cores=_field(obj, "cores", int, where),
        cdi_name=_field(obj, "cdiName", str, where),
        mig=_mig(obj.get("mig"), f"{where}.mig"),
    )


def _claim(uid: str, obj: object) -> PreparedClaim:
    where = f"claims[{uid}]"
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{where}: expected an object")
    devices = _field(obj, "devices", list, where)
    return PreparedClaim(
        namespace=_field(obj, "namespace", str, where),
        name=_field(obj, "name", str, where),
        uid=uid,
        pool=_field(obj, "pool", str, where),
        devices=tuple(_device(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)),
        sole=_field(obj, "sole", bool, where),
        private=_field(obj, "private", bool, where),
    )


def decode(data: bytes) -> Checkpoint:
    """The checkpoint in a file's bytes. Raises `CheckpointError`."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:  # RecursionError: nested past Python's recursion limit
        raise CheckpointError(f"not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise CheckpointError(
            f"not a hami-node DRA checkpoint (kind {doc.get('kind') if isinstance(doc, dict) else None!r})"
        )
    version = doc.get("version")
    if version != VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise CheckpointError(f"version {version} is newer than this hami-node reads ({VERSION})")
        raise CheckpointError(f"version {version!r} is not one hami-node wrote (this one reads {VERSION})")
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointError("claims: expected an object")
    if doc.get("checksum") != checksum(version, claims):
        raise CheckpointError("checksum mismatch: the file was changed or cut short")
    return Checkpoint({uid: _claim(uid, obj) for uid, obj in claims.items()})


# --- version 2: the journal -----------------------------------------------------------------------------


def _line(payload: bytes) -> bytes:
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def journal_header() -> bytes:
    """The journal's first line."""
    return _line(orjson.dumps({"kind": KIND, "version": JOURNAL_VERSION}))


def encode_put(claim: PreparedClaim) -> bytes:
    """The line recording a prepared claim."""
    return _line(orjson.dumps({"put": {"uid": claim.uid, **_claim_json(claim)}}))


def encode_del(uid: str) -> bytes:
    """The line recording an unprepared claim."""
    return _line(orjson.dumps({"del": uid}))


def encode_journal(claims: Mapping[str, PreparedClaim]) -> bytes:
    """A whole journal holding `claims` (the header, then one `put` per claim in UID order)."""
    return journal_header() + b"".join(encode_put(claims[uid]) for uid in sorted(claims))


@dataclass(slots=True)
class Journal:
    """What `decode_journal` read: the claims, the length of the valid records (where the next append
    goes), how many records follow the header, and why a bad last line was dropped ("" when none)."""

    claims: dict[str, PreparedClaim]
    length: int
    records: int
    torn: str = ""


def _record(line: bytes) -> dict[str, Any]:
    """A line's JSON object (without its newline). Raises CheckpointError saying what is wrong."""
    crc, sep, payload = line.partition(b" ")
    if not sep or len(crc) != 8:
        raise CheckpointError("not a journal record (<crc32> <JSON>)")
    try:
        expected = int(crc, 16)
    except ValueError:
        raise CheckpointError(f"CRC {crc[:8]!r} is not hexadecimal") from None
    if zlib.crc32(payload) != expected:
        raise CheckpointError("CRC mismatch: the record was cut short or changed")
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as err:
        raise CheckpointError(f"not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise CheckpointError("expected a JSON object")
    return doc


def _check_header(doc: Mapping[str, Any]) -> None:
    if doc.get("kind") != KIND:
        raise CheckpointError(f"not a hami-node DRA checkpoint journal (kind {doc.get('kind')!r})")
    version = doc.get("version")
    if version != JOURNAL_VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > JOURNAL_VERSION:
            raise CheckpointError(f"version {version} is newer than this hami-node reads ({JOURNAL_VERSION})")
        raise CheckpointError(
            f"version {version!r} is not one hami-node wrote in a journal (this one reads {JOURNAL_VERSION})"
        )


def _apply(doc: Mapping[str, Any], claims: dict[str, PreparedClaim]) -> None:
    if doc.keys() == {"put"}:
        obj = doc["put"]
        uid = obj.get("uid") if isinstance(obj, Mapping) else None
        if not isinstance(uid, str) or not uid:
            raise CheckpointError(f"put.uid: unexpected value {uid!r}")
        claims[uid] = _claim(uid, obj)
    elif doc.keys() == {"del"}:
        uid = doc["del"]
        if not isinstance(uid, str) or not uid:
            raise CheckpointError(f"del: unexpected value {uid!r}")
        claims.pop(uid, None)
    else:
        raise CheckpointError(f"expected one key, put or del, got {sorted(doc)}")


def decode_journal(
    data: bytes, claims: Mapping[str, PreparedClaim] | None = None, *, offset: int = 0
) -> Journal:
    """Replay a journal's bytes. With `offset` 0 `data` is the whole file (its header first); otherwise
    `data` is what follows byte `offset` of a file already read into `claims` (records appended since).
    A bad last line is dropped (`Journal.torn` says why); raises `CheckpointError` for a bad header or a
    bad line followed by others. `Journal.length` counts from the file's start."""
    out = dict(claims or {})
    pos = 0
    records = 0
    lines = data.split(b"\n")
    last = len(lines) - 1  # the text after the last newline: empty unless a write was cut short
    for i, line in enumerate(lines):
        where = f"record {records + 1} at byte {offset + pos}" if offset or i else "header"
        try:
            if i == last:
                if line:
                    raise CheckpointError("no end of line: the write was cut short")
                break
            doc = _record(line)
            if offset == 0 and i == 0:
                _check_header(doc)
            else:
                _apply(doc, out)
                records += 1
        except CheckpointError as err:
            if offset == 0 and i == 0:
                raise CheckpointError(f"header: {err}") from None
            if i < last - 1 or (i == last - 1 and lines[last]):
                raise CheckpointError(
                    f"{where}: {err}, with {last - i - 1} more lines after it: the file was changed"
                ) from None
            return Journal(out, offset + pos, records, f"{where}: {err}")
        pos += len(line) + 1
    if offset == 0 and pos == 0:
        raise CheckpointError("empty: no header")
    return Journal(out, offset + pos, records)


__all__ = [
    "COMPACT_MIN_RECORDS",
    "FILE_NAME",
    "JOURNAL_FILE",
    "JOURNAL_VERSION",
    "KIND",
    "STATE_DIR",
    "VERSION",
    "Checkpoint",
    "CheckpointError",
    "Journal",
    "checksum",
    "decode",
    "decode_journal",
    "encode",
    "encode_del",
    "encode_journal",
    "encode_put",
    "journal_header",
]
