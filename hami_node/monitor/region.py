"""HAMi-core's shared region (the `*.cache` file of one container): a pure decoder and encoder.

HAMi-core (libvgpu.so, `src/multiprocess/multiprocess_memory_limit.h`) keeps each container's GPU
accounting in one file it mmaps, `CUDA_DEVICE_MEMORY_SHARED_CACHE`; hami-node points that variable at
`<hook>/vgpu/<cache id>.cache` inside the container, which is `<hook>/vgpu/containers/<pod uid>_<container>/
<cache id>.cache` on the host. HAMi's vGPU monitor reads these files (`pkg/monitor/nvidia/cudevshr.go`,
the `v1` layout in `pkg/monitor/nvidia/v1/spec.go`); this module reads the same bytes.

The layout (`shared_region_t`, linux/amd64 glibc, little endian, `sem_t` 32 bytes; offsets as HAMi's
`TestSharedRegionTLayoutMatchesCABI` locks them):

============  ======  ===================================================================
offset        type    field
============  ======  ===================================================================
0             int32   initialized_flag: `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG` 19920718
4, 8          uint32  major_version, minor_version (1.1 since HAMi-core 2024-08, 1.2 since 2026-04)
12            int32   sm_init_flag
16            uint64  owner_pid
24            32 B    sem (a `sem_t`; never read here)
56            uint64  device_num
64            96 B    uuids[16] (NUL-terminated "GPU-..." strings)
1600, 1728    uint64  limit[16] (memory bytes), sm_limit[16] (percent)
1856          1960 B  procs[1024] (`shrreg_proc_slot_t`, below)
2008896       int32   proc_num, utilization_switch, recent_kernel, priority (4 x int32)
2008912       uint64  last_kernel_time (Unix seconds)
2008920       32 B    sem_postinit (1.2) / unused[4] (1.1)
============  ======  ===================================================================

A process slot: pid, hostpid (int32); used[16] (`device_memory_t`: context_size, module_size,
data_size, offset, total, 3 unused uint64); monitorused[16] (uint64); device_util[16] (`device_util_t`:
dec_util, enc_util, sm_util, 3 unused uint64); status (int32, 4 bytes padding); seqlock (1.2) or
unused (1.1), then 2 unused uint64: 1960 bytes.

HAMi-core builds between 2026-01-29 and 2026-04-24 (commits 1988c5d..e200da2) wrote version 1.1 with
another field order (seqlock after hostpid, sem_postinit after sem), same size; HAMi-core 1.2 moved the
fields back "to be compatible with older cache file format" (b69b1ea). Nothing in the header tells that
layout apart; the plausibility checks below (device count, UUID text, process count) refuse what it
reads as, rather than export garbage. Layouts before 1.x (no version fields) are refused too.

`decode` raises `RegionFormatError` saying what was found and what is known; it never guesses.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from enum import Enum

Buffer = bytes | bytearray | memoryview | mmap.mmap
"""What the decoder reads: a file's bytes or a mapping of it."""
WritableBuffer = bytearray | memoryview | mmap.mmap

MAGIC = 19920718
"""HAMi-core's `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`: the region is initialised."""
MAJOR_VERSION = 1
KNOWN_MINOR_VERSIONS = (1, 2)
"""The versions whose layout this module knows (HAMi-core's MAJOR_VERSION/MINOR_VERSION)."""
MAX_DEVICES = 16
"""CUDA_DEVICE_MAX_COUNT."""
MAX_PROCS = 1024
"""SHARED_REGION_MAX_PROCESS_NUM."""
UUID_BYTES = 96

_HEADER = struct.Struct("<iIIiQ")  # initialized_flag, major, minor, sm_init_flag, owner_pid
_DEVICE_NUM = struct.Struct("<Q")
_U64X16 = struct.Struct("<16Q")
_SLOT = struct.Struct("<ii" + "5Q24x" * MAX_DEVICES + "16Q" + "3Q24x" * MAX_DEVICES + "i4x24x")
_TAIL = struct.Struct("<iiiiQ")  # proc_num, utilization_switch, recent_kernel, priority, last_kernel_time

OFFSET_DEVICE_NUM = 56
OFFSET_UUIDS = 64
OFFSET_LIMIT = OFFSET_UUIDS + MAX_DEVICES * UUID_BYTES  # 1600
OFFSET_SM_LIMIT = OFFSET_LIMIT + 8 * MAX_DEVICES  # 1728
OFFSET_PROCS = OFFSET_SM_LIMIT + 8 * MAX_DEVICES  # 1856
SLOT_SIZE = _SLOT.size  # 1960
OFFSET_PROC_NUM = OFFSET_PROCS + MAX_PROCS * SLOT_SIZE  # 2008896
OFFSET_UTILIZATION_SWITCH = OFFSET_PROC_NUM + 4
OFFSET_RECENT_KERNEL = OFFSET_PROC_NUM + 8
OFFSET_PRIORITY = OFFSET_PROC_NUM + 12
OFFSET_LAST_KERNEL_TIME = OFFSET_PROC_NUM + 16  # 2008912
REGION_SIZE = OFFSET_LAST_KERNEL_TIME + 8 + 32  # 2008952: sizeof(shared_region_t)

_INT32 = struct.Struct("<i")


class RegionField(Enum):
    """The int32 fields HAMi's monitor writes back (priority feedback), by offset."""

    UTILIZATION_SWITCH = OFFSET_UTILIZATION_SWITCH
    RECENT_KERNEL = OFFSET_RECENT_KERNEL

    @property
    def offset(self) -> int:
        return int(self.value)


class RegionFormatError(ValueError):
    """The bytes are not a region layout this module knows: `found` says what they hold, `known` what
    would have been accepted."""

    def __init__(self, found: str, known: str) -> None:
        super().__init__(f"{found}; known: {known}")
        self.found = found
        self.known = known


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One process's memory on one device, bytes (`device_memory_t`; `data` is HAMi-core's data_size,
    what HAMi calls the buffer size)."""

    context: int = 0
    module: int = 0
    data: int = 0
    offset: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class DeviceUtil:
    """One process's utilisation of one device, percent (`device_util_t`)."""

    dec: int = 0
    enc: int = 0
    sm: int = 0


def _memories() -> tuple[DeviceMemory, ...]:
    return (DeviceMemory(),) * MAX_DEVICES


def _utils() -> tuple[DeviceUtil, ...]:
    return (DeviceUtil(),) * MAX_DEVICES


def _zeros() -> tuple[int, ...]:
    return (0,) * MAX_DEVICES


@dataclass(frozen=True, slots=True)
class ProcSlot:
    """One process using the region (`shrreg_proc_slot_t`); `status` 0 is a slot HAMi skips."""

    pid: int
    hostpid: int = 0
    used: tuple[DeviceMemory, ...] = field(default_factory=_memories)
    monitorused: tuple[int, ...] = field(default_factory=_zeros)
    device_util: tuple[DeviceUtil, ...] = field(default_factory=_utils)
    status: int = 1


def _uuids() -> tuple[str, ...]:
    return ("",) * MAX_DEVICES


@dataclass(frozen=True, slots=True)
class SharedRegion:
    """A decoded region. Per-device tuples have `MAX_DEVICES` entries; `uuids` "" where unset; `procs`
    the first `proc_num` slots. `last_kernel_time` is Unix seconds (0: no kernel yet)."""

    major_version: int = MAJOR_VERSION
    minor_version: int = 2
    sm_init_flag: int = 0
    owner_pid: int = 0
    device_num: int = 0
    uuids: tuple[str, ...] = field(default_factory=_uuids)
    limit: tuple[int, ...] = field(default_factory=_zeros)
    sm_limit: tuple[int, ...] = field(default_factory=_zeros)
    procs: tuple[ProcSlot, ...] = ()
    utilization_switch: int = 0
    recent_kernel: int = 0
    priority: int = 0
    last_kernel_time: int = 0

    @property
    def version(self) -> str:
        return f"{self.major_version}.{self.minor_version}"

    def devices(self) -> range:
        """The device indexes in use (`device_num`, at most `MAX_DEVICES`)."""
        return range(min(self.device_num, MAX_DEVICES))

    def _live(self) -> list[ProcSlot]:
        return [p for p in self.procs if p.status != 0]

    def memory(self, idx: int) -> DeviceMemory:
        """Device `idx`'s memory summed over the live processes, as HAMi's `DeviceMemory*` do."""
        live = self._live()
        return DeviceMemory(
            context=sum(p.used[idx].context for p in live),
            module=sum(p.used[idx].module for p in live),
            data=sum(p.used[idx].data for p in live),
            offset=sum(p.used[idx].offset for p in live),
            total=sum(p.used[idx].total for p in live),
        )

    def sm_util(self, idx: int) -> int:
        """Device `idx`'s SM utilisation summed over the live processes (HAMi's `DeviceSmUtil`)."""
        return sum(p.device_util[idx].sm for p in self._live())


def known_versions() -> str:
    return ", ".join(f"{MAJOR_VERSION}.{m}" for m in KNOWN_MINOR_VERSIONS) + f" ({REGION_SIZE} bytes)"


def check_header(data: Buffer, size: int | None = None) -> tuple[int, int]:
    """(major, minor) of a region this module knows; raises `RegionFormatError` otherwise. `size` is the
    file's size when `data` is a prefix of it."""
    size = len(data) if size is None else size
    if size < _HEADER.size:
        raise RegionFormatError(f"{size} bytes, too short for the region header", known_versions())
    flag, major, minor, _sm, _owner = _HEADER.unpack_from(data, 0)
    if flag != MAGIC:
        raise RegionFormatError(
            f"initialized_flag {flag}, not HAMi-core's {MAGIC} (not a HAMi-core region, or not initialised)",
            known_versions(),
        )
    if major != MAJOR_VERSION or minor not in KNOWN_MINOR_VERSIONS:
        raise RegionFormatError(f"version {major}.{minor}", known_versions())
    if size < REGION_SIZE:
        raise RegionFormatError(
            f"version {major}.{minor} but {size} bytes, less than its {REGION_SIZE} (an older layout, or "
            "a truncated file)",
            known_versions(),
        )
    return int(major), int(minor)


def _uuid(raw: bytes, idx: int, version: str) -> str:
    text = raw.split(b"\0", 1)[0]
    if not all(0x20 < b < 0x7F for b in text):
        raise RegionFormatError(
            f"version {version} with uuid[{idx}] not printable ASCII ({text[:40]!r}); a layout that moved "
            "fields (HAMi-core 2026-01..04 builds writing 1.1)?",
            known_versions(),
        )
    return text.decode("ascii")


def _slot(data: Buffer, offset: int) -> ProcSlot:
    values = _SLOT.unpack_from(data, offset)
    pid, hostpid = values[0], values[1]
    pos = 2
    used = []
    for _ in range(MAX_DEVICES):
        used.append(DeviceMemory(*values[pos : pos + 5]))
        pos += 5
    monitorused = tuple(values[pos : pos + MAX_DEVICES])
    pos += MAX_DEVICES
    utils = []
    for _ in range(MAX_DEVICES):
        utils.append(DeviceUtil(*values[pos : pos + 3]))
        pos += 3
    return ProcSlot(pid, hostpid, tuple(used), monitorused, tuple(utils), values[pos])


def decode(data: Buffer, size: int | None = None) -> SharedRegion:
    """The region in `data` (a file's bytes, or an mmap of it). Raises `RegionFormatError` for a layout
    it does not know (magic, version, size) or values no HAMi-core writes (more than 16 devices, a
    process count outside 0..1024, a UUID that is not text)."""
    major, minor = check_header(data, size)
    version = f"{major}.{minor}"
    _flag, _major, _minor, sm_init_flag, owner_pid = _HEADER.unpack_from(data, 0)
    (device_num,) = _DEVICE_NUM.unpack_from(data, OFFSET_DEVICE_NUM)
    if device_num > MAX_DEVICES:
        raise RegionFormatError(
            f"version {version} with device_num {device_num} (at most {MAX_DEVICES})", known_versions()
        )
    proc_num, utilization_switch, recent_kernel, priority, last_kernel_time = _TAIL.unpack_from(
        data, OFFSET_PROC_NUM
    )
    if not 0 <= proc_num <= MAX_PROCS:
        raise RegionFormatError(
            f"version {version} with proc_num {proc_num} (0..{MAX_PROCS})", known_versions()
        )
    uuids = tuple(
        _uuid(bytes(data[OFFSET_UUIDS + i * UUID_BYTES : OFFSET_UUIDS + (i + 1) * UUID_BYTES]), i, version)
        for i in range(MAX_DEVICES)
    )
    return SharedRegion(
        major_version=major,
        minor_version=minor,
        sm_init_flag=sm_init_flag,
        owner_pid=owner_pid,
        device_num=device_num,
        uuids=uuids,
        limit=_U64X16.unpack_from(data, OFFSET_LIMIT),
        sm_limit=_U64X16.unpack_from(data, OFFSET_SM_LIMIT),
        procs=tuple(_slot(data, OFFSET_PROCS + i * SLOT_SIZE) for i in range(proc_num)),
        utilization_switch=utilization_switch,
        recent_kernel=recent_kernel,
        priority=priority,
        last_kernel_time=last_kernel_time,
    )


def encode_parts(region: SharedRegion) -> list[tuple[int, bytes]]:
    """The region's bytes as (offset, bytes) pieces: the header through the last live process slot, and
    the tail from `proc_num`; everything else is zero. Writing these into a zero-filled (or sparse)
    file of `REGION_SIZE` bytes gives `encode(region)`. Raises ValueError for what the layout cannot
    hold."""
    if len(region.procs) > MAX_PROCS:
        raise ValueError(f"{len(region.procs)} processes, at most {MAX_PROCS}")
    for name in ("uuids", "limit", "sm_limit"):
        if len(getattr(region, name)) != MAX_DEVICES:
            raise ValueError(f"{name} must have {MAX_DEVICES} entries")
    head = bytearray(OFFSET_PROCS + len(region.procs) * SLOT_SIZE)
    _HEADER.pack_into(
        head, 0, MAGIC, region.major_version, region.minor_version, region.sm_init_flag, region.owner_pid
    )
    _DEVICE_NUM.pack_into(head, OFFSET_DEVICE_NUM, region.device_num)
    for i, text in enumerate(region.uuids):
        raw = text.encode("ascii")
        if len(raw) >= UUID_BYTES or b"\0" in raw:
            raise ValueError(f"uuid[{i}] {text!r} does not fit {UUID_BYTES} bytes with its NUL")
        head[OFFSET_UUIDS + i * UUID_BYTES : OFFSET_UUIDS + i * UUID_BYTES + len(raw)] = raw
    _U64X16.pack_into(head, OFFSET_LIMIT, *region.limit)
    _U64X16.pack_into(head, OFFSET_SM_LIMIT, *region.sm_limit)
    for i, proc in enumerate(region.procs):
        values: list[int] = [proc.pid, proc.hostpid]
        for mem in proc.used:
            values += [mem.context, mem.module, mem.data, mem.offset, mem.total]
        values += list(proc.monitorused)
        for util in proc.device_util:
            values += [util.dec, util.enc, util.sm]
        values.append(proc.status)
        try:
            _SLOT.pack_into(head, OFFSET_PROCS + i * SLOT_SIZE, *values)
        except struct.error as err:
            raise ValueError(f"process slot {i}: a value does not fit its field: {err}") from None
    tail = _TAIL.pack(
        len(region.procs),
        region.utilization_switch,
        region.recent_kernel,
        region.priority,
        region.last_kernel_time,
    )
    return [(0, bytes(head)), (OFFSET_PROC_NUM, tail)]


def encode(region: SharedRegion) -> bytes:
    """The region's bytes (`REGION_SIZE`), as HAMi-core lays them out: for tests and the fake backend's
    simulated containers. Raises ValueError for what the layout cannot hold."""
    buf = bytearray(REGION_SIZE)
    for offset, part in encode_parts(region):
        buf[offset : offset + len(part)] = part
    return bytes(buf)


def write_int32(buf: WritableBuffer, field_: RegionField, value: int) -> None:
    """Store one int32 field in place (a 4-byte aligned store, as HAMi's `atomic.StoreInt32`)."""
    _INT32.pack_into(buf, field_.offset, value)


def read_int32(buf: Buffer, field_: RegionField) -> int:
    return int(_INT32.unpack_from(buf, field_.offset)[0])


__all__ = [
    "KNOWN_MINOR_VERSIONS",
    "MAGIC",
    "MAJOR_VERSION",
    "MAX_DEVICES",
    "MAX_PROCS",
    "REGION_SIZE",
    "DeviceMemory",
    "DeviceUtil",
    "ProcSlot",
    "RegionField",
    "RegionFormatError",
    "SharedRegion",
    "check_header",
    "decode",
    "encode",
    "encode_parts",
    "known_versions",
    "read_int32",
    "write_int32",
]
