"""The DRA plugin's checkpoint: the claims it has prepared, kept in one file so that NodePrepareResources
is idempotent across restarts (a claim prepared before answers with what it got then, and its shared
cache is never wiped) and NodeUnprepareResources knows what to remove after the claim object is gone.

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
by its UID alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami_node.dra.claims import MigRecord, PreparedClaim, PreparedDevice

KIND = "HamiDraCheckpoint"
VERSION = 1
FILE_NAME = "checkpoint.json"


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


__all__ = ["FILE_NAME", "KIND", "VERSION", "Checkpoint", "CheckpointError", "checksum", "decode", "encode"]
