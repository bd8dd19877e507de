"""Annotation keys and their codecs, byte-compatible with HAMi v2.10.

Every `decode_*` is strict and total: it returns a fully typed value or raises `WireFormatError` naming
the annotation, the position in the value and the offending text; nothing is half-decoded. Every
`encode_*` writes HAMi's canonical form, so `decode(encode(x)) == x` and, for a canonical string `s`,
`encode(decode(s)) == s`. Encoders raise `ValueError` for values no decoder could read back (a UUID
containing a separator, an int out of Go's range): that is a bug in the caller, not bad input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import orjson

from hami_api._wire import (
    INT32,
    INT64,
    UINT32,
    UINT64,
    JSONFloat,
    JSONObject,
    Where,
    check_token,
    format_go_time_string,
    format_local_datetime,
    format_rfc3339,
    go_json_string,
    json_bool,
    json_int,
    json_list,
    json_object,
    json_pairs,
    json_str,
    load_json,
    parse_bool,
    parse_go_time_string,
    parse_int,
    parse_local_datetime,
    parse_rfc3339,
)
from hami_api.types import (
    BindPhase,
    ContainerAllocation,
    CorePolicy,
    DeviceSelector,
    GPUInfo,
    GPUPairScore,
    GPUPolicy,
    GPUSlice,
    Handshake,
    HandshakeKind,
    MigPlacement,
    MigProfile,
    NodeLock,
    NodePolicy,
    PodAllocation,
    ScoringWeights,
)

# --- keys --------------------------------------------------------------------------------------------

# Node annotations
NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_PAIR_SCORE = "hami.io/node-nvidia-score"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"
NODE_POD_IDENTIFICATION = "hami.io/node-pod-identification"
"""Ours, beyond HAMi: `NODE_POD_IDENTIFICATION_PODRESOURCES` when the node's daemon answers an Allocate
only with the pod kubelet's PodResources API shows it admitting (`hami_node.plugin.kubelet_pods`), so
hami-control may bind pods asking as many GPUs to the node together; absent: they are told apart by
their GPU counts, and bound there one at a time."""
NODE_POD_IDENTIFICATION_PODRESOURCES = "podresources"

# Pod annotations written by the scheduler and the device plugin
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
VGPU_NODE = "hami.io/vgpu-node"  # also set as a pod label
VGPU_TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"  # mig mode only; not decoded here
BIND_NODE_LOCK = "hami.io/bind-node-lock"
"""Ours, beyond HAMi: `BIND_NODE_LOCK_NONE` on a pod whose bind took no `hami.io/mutex.lock` (hami-control's
binder writes it on the Binding), so the node daemon has no lock of it to release and skips reading the
Node; a pod without it (bound by HAMi's scheduler) gets its lock released as HAMi's plugin does."""
BIND_NODE_LOCK_NONE = "none"

# Pod annotations written by users
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
CORE_POLICY = "hami.io/core-policy"

# Labels
SCHEDULER_ROLE_LABEL = "hami.io/scheduler-role"  # "leader" on the extender pod that leads
WEBHOOK_IGNORE_LABEL = "hami.io/webhook"  # "ignore" keeps a namespace/pod out of the webhook
WEBHOOK_IGNORE_VALUE = "ignore"

OPERATING_MODES = ("hami-core", "mig", "mps")
LEGACY_DEFAULT_MODE = "hami-core"  # the mode a 7-field legacy register entry implies


# --- hami.io/node-nvidia-register ----------------------------------------------------------------------

_GPU_KEYS = (
    "id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "migProfiles", "health",
    "custominfo",
)  # fmt: skip
_MIG_KEYS = ("name", "memoryMB", "core", "sliceCount", "placements")
_PLACEMENT_KEYS = ("start", "size")


def _in_range(value: int, bounds: tuple[int, int], what: str) -> int:
    if isinstance(value, bool) or not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{what} {value!r} is outside {bounds[0]}..{bounds[1]}")
    return value


def _encode_mig_profile(profile: MigProfile) -> str:
    placements = ",".join(
        f'{{"start":{_in_range(p.start, UINT32, "placement start")},'
        f'"size":{_in_range(p.size, UINT32, "placement size")}}}'
        for p in profile.placements
    )
    return (
        f'{{"name":{go_json_string(profile.name)},'
        f'"memoryMB":{_in_range(profile.memory_mb, INT32, "memoryMB")},'
        f'"core":{_in_range(profile.core, INT32, "core")},'
        f'"sliceCount":{_in_range(profile.slice_count, UINT32, "sliceCount")},'
        f'"placements":[{placements}]}}'
    )


def _encode_gpu(gpu: GPUInfo) -> str:
    # Go's `omitempty`: zero numbers, empty strings, false and empty lists are left out.
    members: list[str] = [f'"id":{go_json_string(check_token(gpu.id, "GPU id", ""))}']
    for key, value, bounds in (
        ("index", gpu.index, UINT64),
        ("count", gpu.count, INT32),
        ("devmem", gpu.devmem, INT32),
        ("devcore", gpu.devcore, INT32),
    ):
        if _in_range(value, bounds, key):
            members.append(f'"{key}":{value}')
    if gpu.type:
        members.append(f'"type":{go_json_string(gpu.type)}')
    if _in_range(gpu.numa, INT64, "numa"):
        members.append(f'"numa":{gpu.numa}')
    if gpu.mode:
        members.append(f'"mode":{go_json_string(gpu.mode)}')
    if gpu.mig_profiles:
        members.append(f'"migProfiles":[{",".join(_encode_mig_profile(p) for p in gpu.mig_profiles)}]')
    if gpu.health:
        members.append('"health":true')
    return "{" + ",".join(members) + "}"


def encode_node_register(gpus: Sequence[GPUInfo]) -> str:
    """The current (>= v2.8) JSON form, byte-identical to Go's json.Marshal of HAMi's DeviceInfo list.
    (One exception nobody reads differently: a MIG profile without placements is written `[]` where Go
    writes `null` for a nil slice; both decode to no placements.)"""
    return "[" + ",".join(_encode_gpu(gpu) for gpu in gpus) + "]"


def encode_node_register_legacy(gpus: Sequence[GPUInfo]) -> str:
    """The legacy (<= v2.7) text form, 9 fields per GPU, as Go's EncodeNodeDevices wrote it."""
    entries = []
    for gpu in gpus:
        if gpu.id.lstrip()[:1] in ("[", "{"):
            raise ValueError(f"GPU id {gpu.id!r} would read back as JSON in the legacy form")
        fields = (
            check_token(gpu.id, "GPU id", ",:"),
            str(_in_range(gpu.count, INT32, "count")),
            str(_in_range(gpu.devmem, INT32, "devmem")),
            str(_in_range(gpu.devcore, INT32, "devcore")),
            check_token(gpu.type, "GPU type", ",:") if gpu.type else "",
            str(_in_range(gpu.numa, INT64, "numa")),
            "true" if gpu.health else "false",
            str(_in_range(gpu.index, (0, INT64[1]), "index")),
            check_token(gpu.mode, "GPU mode", ",:") if gpu.mode else "",
        )
        if gpu.mig_profiles:
            raise ValueError(f"GPU {gpu.id!r}: the legacy register form cannot carry MIG profiles")
        entries.append(",".join(fields) + ":")
    return "".join(entries)


def _decode_placement(where: Where, value: Any) -> MigPlacement:
    m = json_object(where, "placement", value, _PLACEMENT_KEYS)
    return MigPlacement(
        start=json_int(where, "start", m.get("start", 0), UINT32),
        size=json_int(where, "size", m.get("size", 0), UINT32),
    )


def _decode_mig_profile(where: Where, value: Any) -> MigProfile:
    m = json_object(where, "migProfile", value, _MIG_KEYS)
    placements = json_list(where, "placements", m.get("placements", []))
    return MigProfile(
        name=json_str(where, "name", m.get("name", "")),
        memory_mb=json_int(where, "memoryMB", m.get("memoryMB", 0), INT32),
        core=json_int(where, "core", m.get("core", 0), INT32),
        slice_count=json_int(where, "sliceCount", m.get("sliceCount", 0), UINT32),
        placements=tuple(_decode_placement(where.at(f"placement {i}"), p) for i, p in enumerate(placements)),
    )


def _decode_gpu_json(where: Where, value: Any) -> GPUInfo:
    m = json_object(where, "device", value, _GPU_KEYS)
    gpu_id = json_str(where, "id", m.get("id", ""))
    if not gpu_id:
        where.fail("", "is missing or empty", "id")
    profiles = json_list(where, "migProfiles", m.get("migProfiles", []))
    return GPUInfo(
        id=gpu_id,
        index=json_int(where, "index", m.get("index", 0), UINT64),
        count=json_int(where, "count", m.get("count", 0), INT32),
        devmem=json_int(where, "devmem", m.get("devmem", 0), INT32),
        devcore=json_int(where, "devcore", m.get("devcore", 0), INT32),
        type=json_str(where, "type", m.get("type", "")),
        numa=json_int(where, "numa", m.get("numa", 0), INT64),
        mode=json_str(where, "mode", m.get("mode", "")),
        health=json_bool(where, "health", m.get("health", False)),
        mig_profiles=tuple(
            _decode_mig_profile(where.at(f"migProfile {i}"), p) for i, p in enumerate(profiles)
        ),
        custom=_custom_text(where, m.get("custominfo")),
    )


def _plain(value: Any) -> Any:
    """A decoded JSON value as Go's `map[string]any` holds it: objects as dicts (a later duplicate key
    wins), every number as a float64."""
    if isinstance(value, JSONObject):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, JSONFloat) or (isinstance(value, int) and not isinstance(value, bool)):
        return float(value)
    return value


def _custom_text(where: Where, value: Any) -> str:
    """HAMi's `custominfo` (any JSON object) as `GPUInfo.custom`: canonical JSON, keys sorted."""
    if value is None:
        return ""
    members = json_pairs(where, "custominfo", value)
    if not members:
        return ""
    return json.dumps(_plain(members), sort_keys=True, separators=(",", ":"))


def _decode_gpu_legacy(where: Where, segment: str) -> GPUInfo:
    items = segment.split(",")
    if len(items) not in (7, 9):
        where.fail(
            segment,
            f"has {len(items)} fields, expected 7 or 9 "
            "(UUID,count,devmem,devcore,type,numa,health[,index,mode])",
        )
    if not items[0]:
        where.fail(segment, "has an empty UUID")
    return GPUInfo(
        id=items[0],
        count=parse_int(where, "count", items[1], INT32),
        devmem=parse_int(where, "devmem", items[2], INT32),
        devcore=parse_int(where, "devcore", items[3], INT32),
        type=items[4],
        numa=parse_int(where, "numa", items[5], INT64),
        health=parse_bool(where, "health", items[6]),
        index=parse_int(where, "index", items[7], (0, INT64[1])) if len(items) == 9 else 0,
        mode=items[8] if len(items) == 9 else LEGACY_DEFAULT_MODE,
    )


_FAST_GPU_INTS = (("index", UINT64), ("count", INT32), ("devmem", INT32), ("devcore", INT32), ("numa", INT64))
_FAST_GPU_KEYS = frozenset(("id", "type", "mode", "health", "migProfiles", *(k for k, _ in _FAST_GPU_INTS)))


def _decode_register_fast(text: str) -> tuple[GPUInfo, ...] | None:
    """The JSON register as HAMi's device plugin writes it (exact-case keys, no MIG profiles or custom
    info, nothing null, every number an int in range, distinct ids), decoded without the strict path's
    per-field bookkeeping (a node list decodes thousands); None for anything else, which the strict
    decoder then reads or refuses with its reason. Both give the same GPUs for every text this accepts
    (`tests/unit/test_annotations_fast_paths.py`)."""
    try:
        items = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(items) is not list:
        return None
    gpus: list[GPUInfo] = []
    seen: set[str] = set()
    for item in items:
        if type(item) is not dict or not item.keys() <= _FAST_GPU_KEYS:
            return None
        gpu_id, gpu_type, mode = item.get("id"), item.get("type", ""), item.get("mode", "")
        health, profiles = item.get("health", False), item.get("migProfiles", [])
        if type(gpu_id) is not str or not gpu_id or gpu_id in seen or type(gpu_type) is not str:
            return None
        if type(mode) is not str or type(health) is not bool or profiles != []:
            return None
        numbers: list[int] = []
        for key, (low, high) in _FAST_GPU_INTS:
            value = item.get(key, 0)
            if type(value) is not int or not low <= value <= high:
                return None
            numbers.append(value)
        seen.add(gpu_id)
        index, count, devmem, devcore, numa = numbers
        gpus.append(GPUInfo(gpu_id, index, count, devmem, devcore, gpu_type, numa, mode, health))
    return tuple(gpus)


def decode_node_register(
    text: str, annotation: str = NODE_REGISTER, form: Literal["any", "json", "legacy"] = "any"
) -> tuple[GPUInfo, ...]:
    """Either form: a JSON array (unknown keys ignored, as Go does) or legacy `UUID,...:` entries.
    `[]` is a node with no GPUs. A GPU id listed twice is rejected. Other vendors' inventories use one
    form only (`form`; HAMi's UnMarshalNodeDevices / DecodeNodeDevices) under their own `annotation`."""
    where = Where(annotation)
    looks_json = text.lstrip()[:1] in ("[", "{")
    if form == "json" and not looks_json:
        where.fail(text, "is not a JSON array of devices")
    if form == "legacy" and looks_json:
        where.fail(text, "is not the legacy 'id,count,devmem,devcore,type,numa,health[,index,mode]:' form")
    fast = _decode_register_fast(text) if looks_json else None
    if fast is not None:
        return fast
    if looks_json:
        items = json_list(where, "", load_json(where, text))
        gpus = tuple(_decode_gpu_json(where.at(f"device {i}"), item) for i, item in enumerate(items))
    elif ":" in text:
        segments = [s for s in text.split(":") if s]  # Go skips empty segments
        gpus = tuple(_decode_gpu_legacy(where.at(f"device {i}"), s) for i, s in enumerate(segments))
    else:
        where.fail(text, "is neither a JSON array nor the legacy 'UUID,count,devmem,...:' form")
    seen: set[str] = set()
    for i, gpu in enumerate(gpus):
        if gpu.id in seen:
            where.at(f"device {i}").fail(gpu.id, "appears twice", "id")
        seen.add(gpu.id)
    return gpus


# --- hami.io/node-nvidia-score -------------------------------------------------------------------------


def encode_pair_scores(scores: Sequence[GPUPairScore]) -> str:
    """`[{"uuid":"GPU-a","score":{"GPU-b":60}}]`; map keys sorted, as Go writes them. A GPU without
    peers gets `"score":{}`, as HAMi's device plugin writes it (its map is never nil)."""
    entries = []
    for entry in scores:
        uuid = go_json_string(check_token(entry.uuid, "GPU uuid", ""))
        pairs = sorted((peer, _in_range(s, INT64, "score")) for peer, s in entry.scores)
        score = ",".join(f"{go_json_string(p)}:{s}" for p, s in pairs)
        entries.append(f'{{"uuid":{uuid},"score":{{{score}}}}}')
    return "[" + ",".join(entries) + "]"


def decode_pair_scores(text: str) -> tuple[GPUPairScore, ...]:
    where = Where(NODE_PAIR_SCORE)
    result = []
    for i, item in enumerate(json_list(where, "", load_json(where, text))):
        at = where.at(f"device {i}")
        m = json_object(at, "entry", item, ("uuid", "score"))
        uuid = json_str(at, "uuid", m.get("uuid", ""))
        if not uuid:
            at.fail("", "is missing or empty", "uuid")
        scores: dict[str, int] = {}
        for peer, value in json_pairs(at, "score", m.get("score", JSONObject())):
            # Go stores a null map value as 0
            score = 0 if value is None else json_int(at.at(f"peer {peer}"), "score", value, INT64)
            scores[json_str(at, "peer uuid", peer)] = score
        result.append(GPUPairScore.of(uuid, scores))
    return tuple(result)


# --- hami.io/node-handshake ----------------------------------------------------------------------------

_HANDSHAKE_PREFIXES = (
    (HandshakeKind.REQUESTING, "Requesting_"),
    (HandshakeKind.DELETED, "Deleted_"),
    (HandshakeKind.REPORTED, "Reported "),
)


def encode_handshake(handshake: Handshake) -> str:
    """REQUESTING/DELETED take a naive local time; REPORTED an aware one (Go's time.String())."""
    if handshake.kind is HandshakeKind.REPORTED:
        return "Reported " + format_go_time_string(handshake.at)
    if handshake.at.tzinfo is not None:
        raise ValueError(f"{handshake.kind} handshake takes a naive local time, got {handshake.at!r}")
    return f"{handshake.kind}_{format_local_datetime(handshake.at)}"


def decode_handshake(text: str) -> Handshake:
    """Anything else (including a bare "Requesting") raises; HAMi's scheduler answers such a value by
    writing a fresh `Requesting_<now>`, which is the caller's decision to make."""
    where = Where(NODE_HANDSHAKE)
    for kind, prefix in _HANDSHAKE_PREFIXES:
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            if kind is HandshakeKind.REPORTED:
                return Handshake(kind, parse_go_time_string(where, "time", rest))
            return Handshake(kind, parse_local_datetime(where, "time", rest))
    where.fail(text, "is not 'Requesting_<time>', 'Reported <time>' or 'Deleted_<time>'")


# --- hami.io/vgpu-devices-to-allocate, hami.io/vgpu-devices-allocated ----------------------------------


def encode_pod_allocation(allocation: PodAllocation) -> str:
    """`uuid,NVIDIA,mem,cores:` per device, `;` after each container; an empty container is just `;`."""
    out = []
    for container in allocation.containers:
        for s in container.devices:
            uuid = check_token(s.uuid, "GPU uuid", ",:;")
            vendor = check_token(s.vendor, "vendor", ",:;")
            mem = _in_range(s.usedmem, (0, INT32[1]), "usedmem")
            cores = _in_range(s.usedcores, (0, INT32[1]), "usedcores")
            out.append(f"{uuid},{vendor},{mem},{cores}:")
        out.append(";")
    return "".join(out)


def _decode_slice(where: Where, entry: str) -> GPUSlice:
    fields = entry.split(",")
    if len(fields) != 4:
        where.fail(entry, f"has {len(fields)} fields, expected 4 (uuid,vendor,memory,cores)")
    uuid, vendor, mem, cores = fields
    if not uuid:
        where.fail(entry, "has an empty GPU uuid")
    if not vendor:
        where.fail(entry, "has an empty vendor")
    return GPUSlice(
        uuid=uuid,
        vendor=vendor,
        usedmem=parse_int(where, "memory", mem, (0, INT32[1])),
        usedcores=parse_int(where, "cores", cores, (0, INT32[1])),
    )


def _decode_container(where: Where, piece: str) -> ContainerAllocation:
    if not piece:
        return ContainerAllocation()
    if not piece.endswith(":"):
        where.fail(piece, "does not end with ':' (each device is 'uuid,vendor,mem,cores:')")
    entries = piece[:-1].split(":")
    for i, entry in enumerate(entries):
        if not entry:
            where.at(f"device {i}").fail(piece, "is an empty device entry ('::')")
    return ContainerAllocation(
        tuple(_decode_slice(where.at(f"device {i}"), e) for i, e in enumerate(entries))
    )


_INT32_DIGITS = len(str(INT32[1]))


def _decode_pod_allocation_fast(text: str) -> PodAllocation | None:
    """Either allocation annotation in its well-formed shape (every device `uuid,vendor,mem,cores:` with
    plain decimal numbers in range), decoded without the strict path's per-entry bookkeeping (a pod
    list decodes one a pod); None for anything else, which the strict decoder then reads or refuses with
    its reason. Both give the same allocation for every text this accepts
    (`tests/unit/test_annotations_fast_paths.py`)."""
    if not text.endswith(";"):
        return None
    containers: list[ContainerAllocation] = []
    for piece in text[:-1].split(";"):
        if not piece:
            containers.append(_EMPTY_CONTAINER)
            continue
        if not piece.endswith(":"):
            return None
        devices: list[GPUSlice] = []
        for entry in piece[:-1].split(":"):
            fields = entry.split(",")
            if len(fields) != 4:
                return None
            uuid, vendor, mem, cores = fields
            if not uuid or not vendor:
                return None
            if not (mem.isascii() and mem.isdigit() and cores.isascii() and cores.isdigit()):
                return None
            if len(mem) > _INT32_DIGITS or len(cores) > _INT32_DIGITS:
                return None
            usedmem, usedcores = int(mem), int(cores)
            if usedmem > INT32[1] or usedcores > INT32[1]:
                return None
            devices.append(GPUSlice(uuid, usedmem, usedcores, vendor))
        containers.append(ContainerAllocation(tuple(devices)))
    return PodAllocation(tuple(containers))


_EMPTY_CONTAINER = ContainerAllocation()


def decode_pod_allocation(text: str, annotation: str = DEVICES_TO_ALLOCATE) -> PodAllocation:
    """Decode either allocation annotation (pass `annotation` so errors name the right key), including
    the blanked forms the plugin writes after consuming entries (`;GPU-b,NVIDIA,5000,0:;`, `;;`).
    "" is a pod with no entries."""
    where = Where(annotation)
    if not text:
        return PodAllocation()
    fast = _decode_pod_allocation_fast(text)
    if fast is not None:
        return fast
    if not text.endswith(";"):
        where.fail(text[-40:], "does not end with ';' (each container's entry is closed by ';')")
    pieces = text[:-1].split(";")
    return PodAllocation(
        tuple(_decode_container(where.at(f"container {i}"), p) for i, p in enumerate(pieces))
    )


# --- hami.io/vgpu-node, hami.io/vgpu-time, hami.io/bind-time, hami.io/bind-phase -----------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_object_name(text: str) -> bool:
    return len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def encode_vgpu_node(node: str) -> str:
    if not _is_object_name(node):
        raise ValueError(f"node name {node!r} is not a DNS-1123 subdomain")
    return node


def decode_vgpu_node(text: str) -> str:
    if not _is_object_name(text):
        Where(VGPU_NODE).fail(text, "is not a node name (DNS-1123 subdomain)")
    return text


def encode_unix_time(seconds: int) -> str:
    """hami.io/vgpu-time and hami.io/bind-time: whole unix seconds in decimal."""
    return str(_in_range(seconds, (0, INT64[1]), "unix time"))


def decode_unix_time(text: str, annotation: str = BIND_TIME) -> int:
    return parse_int(Where(annotation), "", text, (0, INT64[1]))


def encode_bind_phase(phase: BindPhase) -> str:
    return phase.value


def decode_bind_phase(text: str) -> BindPhase:
    return _enum(Where(BIND_PHASE), text, BindPhase)


# --- hami.io/mutex.lock --------------------------------------------------------------------------------


def encode_node_lock(lock: NodeLock) -> str:
    """`<RFC3339>,<namespace>,<pod>`; just `<RFC3339>` when namespace and pod are empty (legacy)."""
    stamp = format_rfc3339(lock.time)
    if not lock.namespace and not lock.pod:
        return stamp
    for what, name in (("namespace", lock.namespace), ("pod name", lock.pod)):
        if not _is_object_name(name):
            raise ValueError(f"{what} {name!r} is not a DNS-1123 name")
    return f"{stamp},{lock.namespace},{lock.pod}"


def decode_node_lock(text: str) -> NodeLock:
    where = Where(NODE_LOCK)
    if "," not in text:
        return NodeLock(parse_rfc3339(where, "time", text))
    parts = text.split(",")
    if len(parts) != 3:
        where.fail(text, f"has {len(parts)} comma-separated parts, expected 3 (time,namespace,pod)")
    stamp, namespace, pod = parts
    for field, name in (("namespace", namespace), ("pod", pod)):
        if not _is_object_name(name):
            where.fail(name, "is not a Kubernetes object name", field)
    return NodeLock(parse_rfc3339(where, "time", stamp), namespace, pod)


# --- comma lists: hami.io/device-cordon and the GPU selectors ------------------------------------------


def encode_comma_list(items: Sequence[str]) -> str:
    for item in items:
        if not item or item != item.strip() or "," in item:
            raise ValueError(f"list item {item!r} is empty, padded or contains ','")
    return ",".join(items)


def decode_comma_list(text: str) -> tuple[str, ...]:
    """Items split on ',', trimmed, empties and repeats dropped (HAMi trims too). Always succeeds:
    an empty or blank value is the empty list, which for the selectors means "no constraint"."""
    items: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if item and item not in items:
            items.append(item)
    return tuple(items)


def encode_device_cordon(uuids: Sequence[str]) -> str:
    return encode_comma_list(uuids)


def decode_device_cordon(text: str) -> tuple[str, ...]:
    """hami.io/device-cordon: GPUs (by UUID) excluded from new allocations."""
    return decode_comma_list(text)


def encode_numa_bind(enabled: bool) -> str:
    return "true" if enabled else "false"


def decode_numa_bind(text: str) -> bool:
    """Go's strconv.ParseBool; HAMi quietly reads a bad value as false, this rejects it."""
    return parse_bool(Where(NUMA_BIND), "", text)


def encode_vgpu_mode(modes: Sequence[str]) -> str:
    return encode_comma_list(modes)


def decode_vgpu_mode(text: str) -> tuple[str, ...]:
    where = Where(VGPU_MODE)
    modes = decode_comma_list(text)
    if not modes:
        where.fail(text, f"names no mode (one or more of {', '.join(OPERATING_MODES)})")
    for mode in modes:
        if mode not in OPERATING_MODES:
            where.fail(mode, f"is not an operating mode ({', '.join(OPERATING_MODES)})", "mode")
    return modes


def decode_device_selector(annotations: Mapping[str, str]) -> DeviceSelector:
    """All GPU constraints of a pod from its annotations; absent keys mean no constraint."""

    def listed(key: str) -> tuple[str, ...]:
        return decode_comma_list(annotations[key]) if key in annotations else ()

    return DeviceSelector(
        use_types=listed(USE_GPU_TYPE),
        nouse_types=listed(NOUSE_GPU_TYPE),
        use_uuids=listed(USE_GPU_UUID),
        nouse_uuids=listed(NOUSE_GPU_UUID),
        modes=decode_vgpu_mode(annotations[VGPU_MODE]) if VGPU_MODE in annotations else (),
        numa_bind=decode_numa_bind(annotations[NUMA_BIND]) if NUMA_BIND in annotations else False,
    )


# --- scheduling policies -------------------------------------------------------------------------------


_E = TypeVar("_E", BindPhase, NodePolicy, GPUPolicy, CorePolicy)


def _enum(where: Where, text: str, kind: type[_E]) -> _E:
    try:
        return kind(text)
    except ValueError:
        where.fail(text, f"is not one of {', '.join(m.value for m in kind)}")


def encode_node_policy(policy: NodePolicy) -> str:
    return policy.value


def decode_node_policy(text: str) -> NodePolicy:
    return _enum(Where(NODE_SCHEDULER_POLICY), text.strip(), NodePolicy)


def encode_gpu_policy(chain: Sequence[GPUPolicy]) -> str:
    """A policy or comma chain such as `binpack,numa` (order matters: earlier keys sort first)."""
    if not chain:
        raise ValueError("a GPU policy chain needs at least one policy")
    return ",".join(p.value for p in chain)


def decode_gpu_policy(text: str) -> tuple[GPUPolicy, ...]:
    """Parts trimmed, repeats dropped, every part must be a known policy (HAMi's own validation)."""
    where = Where(GPU_SCHEDULER_POLICY)
    chain: list[GPUPolicy] = []
    for i, part in enumerate(text.split(",")):
        policy = _enum(where.at(f"part {i}"), part.strip(), GPUPolicy)
        if policy not in chain:
            chain.append(policy)
    return tuple(chain)


def encode_scoring_weights(weights: ScoringWeights) -> str:
    values = {
        k: _in_range(v, (0, INT64[1]), k)
        for k, v in (("slot", weights.slot), ("core", weights.core), ("memory", weights.memory))
    }
    if not any(values.values()):
        raise ValueError("at least one scoring weight must be positive")
    return ",".join(f"{k}={v}" for k, v in values.items())


def decode_scoring_weights(text: str) -> ScoringWeights:
    """`slot=1,core=1,memory=3`: all three keys, any order, whitespace around parts ignored,
    non-negative integers, at least one positive."""
    where = Where(DEVICE_SCORING_WEIGHTS)
    parts = text.split(",")
    if len(parts) != 3:
        where.fail(text, "must list exactly slot, core and memory weights ('slot=1,core=1,memory=3')")
    weights: dict[str, int] = {}
    for i, part in enumerate(parts):
        at = where.at(f"part {i}")
        key, sep, value = part.strip().partition("=")
        key = key.strip()
        if not sep:
            at.fail(part, "is not a key=value pair")
        if key not in ("slot", "core", "memory"):
            at.fail(key, "is not a weight (slot, core, memory)", "key")
        if key in weights:
            at.fail(key, "appears twice", "key")
        weights[key] = parse_int(at, key, value.strip(), (0, INT64[1]))
    if not any(weights.values()):
        where.fail(text, "has no positive weight")
    return ScoringWeights(slot=weights["slot"], core=weights["core"], memory=weights["memory"])


def encode_core_policy(policy: CorePolicy) -> str:
    return policy.value


def decode_core_policy(text: str) -> CorePolicy:
    return _enum(Where(CORE_POLICY), text.strip(), CorePolicy)
