"""HAMi-core's shared region: the pure decoder/encoder (layout, round trip, refusal of what it does not
know) and the file side (reading through a mapping, in-place field writes, the scanner's one log line
per bad file)."""

from __future__ import annotations

import logging
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_node.monitor import region as r
from hami_node.monitor.feedback import FieldWrite
from hami_node.monitor.region import (
    MAX_DEVICES,
    REGION_SIZE,
    DeviceMemory,
    DeviceUtil,
    ProcSlot,
    RegionField,
    RegionFormatError,
    SharedRegion,
    decode,
    encode,
)
from hami_node.monitor.regions import RegionScanner, apply_writes, read_region

GPU_A = "GPU-0b3c1d2e-1111-2222-3333-444455556666"
GPU_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"


def region_on(uuids: list[str], **kw: object) -> SharedRegion:
    pad = MAX_DEVICES - len(uuids)
    fields: dict[str, object] = {
        "device_num": len(uuids),
        "uuids": tuple(uuids) + ("",) * pad,
        "limit": tuple(4000 * 2**20 for _ in uuids) + (0,) * pad,
        "sm_limit": tuple(30 for _ in uuids) + (0,) * pad,
    }
    fields.update(kw)
    return SharedRegion(**fields)  # type: ignore[arg-type]


def test_offsets_match_hami_s_layout_test_for_linux_amd64() -> None:
    # HAMi pkg/monitor/nvidia/v1/spec_test.go, TestSharedRegionTLayoutMatchesCABI.
    assert (r.OFFSET_DEVICE_NUM, r.OFFSET_UUIDS, r.OFFSET_LIMIT, r.OFFSET_SM_LIMIT) == (56, 64, 1600, 1728)
    assert (r.OFFSET_PROCS, r.OFFSET_PROC_NUM) == (1856, 2008896)
    assert (r.OFFSET_UTILIZATION_SWITCH, r.OFFSET_RECENT_KERNEL, r.OFFSET_PRIORITY) == (
        2008900,
        2008904,
        2008908,
    )
    assert r.OFFSET_LAST_KERNEL_TIME == 2008912
    assert REGION_SIZE == 2008952
    assert r.SLOT_SIZE == 1960


def test_encoded_fields_sit_at_their_c_offsets() -> None:
    proc = ProcSlot(
        pid=7,
        hostpid=4242,
        used=(DeviceMemory(1, 2, 3, 4, 10),) + (DeviceMemory(),) * 15,
        device_util=(DeviceUtil(5, 6, 77),) + (DeviceUtil(),) * 15,
        status=1,
    )
    data = encode(region_on([GPU_A], procs=(proc,), priority=3, recent_kernel=2, last_kernel_time=1234))
    assert struct.unpack_from("<iII", data, 0) == (r.MAGIC, 1, 2)
    assert data[64 : 64 + len(GPU_A)] == GPU_A.encode()
    assert struct.unpack_from("<Q", data, 1600)[0] == 4000 * 2**20
    slot = 1856
    assert struct.unpack_from("<ii", data, slot) == (7, 4242)
    assert struct.unpack_from("<5Q", data, slot + 8) == (1, 2, 3, 4, 10)
    # device_util[0].sm_util: after pid/hostpid (8), used (16 x 64), monitorused (16 x 8), dec, enc.
    assert struct.unpack_from("<Q", data, slot + 8 + 1024 + 128 + 16)[0] == 77
    assert struct.unpack_from("<i", data, slot + 1928)[0] == 1  # status
    assert struct.unpack_from("<iiiiQ", data, 2008896) == (1, 0, 2, 3, 1234)


uuid_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=95)
u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
memory = st.builds(DeviceMemory, u64, u64, u64, u64, u64)
util = st.builds(DeviceUtil, u64, u64, u64)
slot_st = st.builds(
    ProcSlot,
    pid=i32,
    hostpid=i32,
    used=st.tuples(*[memory] * MAX_DEVICES),
    monitorused=st.tuples(*[u64] * MAX_DEVICES),
    device_util=st.tuples(*[util] * MAX_DEVICES),
    status=i32,
)
region_st = st.builds(
    SharedRegion,
    major_version=st.just(1),
    minor_version=st.sampled_from(r.KNOWN_MINOR_VERSIONS),
    sm_init_flag=i32,
    owner_pid=u64,
    device_num=st.integers(0, MAX_DEVICES),
    uuids=st.tuples(*[uuid_text] * MAX_DEVICES),
    limit=st.tuples(*[u64] * MAX_DEVICES),
    sm_limit=st.tuples(*[u64] * MAX_DEVICES),
    procs=st.lists(slot_st, max_size=3).map(tuple),
    utilization_switch=i32,
    recent_kernel=i32,
    priority=i32,
    last_kernel_time=u64,
)


@settings(max_examples=40, deadline=None)
@given(region_st)
def test_decode_inverts_encode(region: SharedRegion) -> None:
    assert decode(encode(region)) == region


@settings(max_examples=20, deadline=None)
@given(region_st)
def test_the_encoded_pieces_written_into_zeros_are_the_whole_encoding(region: SharedRegion) -> None:
    buf = bytearray(REGION_SIZE)
    for offset, part in r.encode_parts(region):
        buf[offset : offset + len(part)] = part
    assert bytes(buf) == encode(region)
    assert sum(len(part) for _, part in r.encode_parts(region)) < REGION_SIZE // 100


@settings(max_examples=60, deadline=None)
@given(region_st, st.integers(0, REGION_SIZE - 1))
def test_a_truncated_region_is_refused_never_decoded(region: SharedRegion, length: int) -> None:
    with pytest.raises(RegionFormatError):
        decode(encode(region)[:length])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_is_refused_with_what_was_found(data: bytes) -> None:
    padded = data + bytes(REGION_SIZE - len(data))
    try:
        region = decode(padded)
    except RegionFormatError as err:
        assert err.found and "1.1, 1.2" in err.known
    else:  # only bytes that start like a real region decode
        assert struct.unpack_from("<i", padded)[0] == r.MAGIC
        assert region.major_version == 1 and region.minor_version in r.KNOWN_MINOR_VERSIONS


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "found"),
    [
        (0, "<i", 0, "initialized_flag 0, not HAMi-core's 19920718"),
        (4, "<I", 2, "version 2.2"),
        (8, "<I", 7, "version 1.7"),
        (8, "<I", 0, "version 1.0"),
        (56, "<Q", 17, "device_num 17 (at most 16)"),
        (2008896, "<i", -1, "proc_num -1"),
        (2008896, "<i", 1025, "proc_num 1025"),
        (64, "<B", 0x01, "uuid[0] not printable ASCII"),
    ],
)
def test_values_no_hami_core_writes_are_refused_naming_them(
    offset: int, fmt: str, value: int, found: str
) -> None:
    data = bytearray(encode(region_on([GPU_A])))
    struct.pack_into(fmt, data, offset, value)
    with pytest.raises(RegionFormatError) as caught:
        decode(bytes(data))
    assert found in caught.value.found


def test_a_short_file_of_a_known_version_is_refused_as_an_older_layout_or_truncated() -> None:
    data = encode(region_on([GPU_A]))[: REGION_SIZE - 32]
    with pytest.raises(RegionFormatError) as caught:
        decode(data)
    assert f"{REGION_SIZE - 32} bytes, less than its {REGION_SIZE}" in caught.value.found


def test_a_longer_file_decodes_its_region_prefix() -> None:
    region = region_on([GPU_A], procs=(ProcSlot(3),))
    assert decode(encode(region) + bytes(4096)) == region


def test_usage_sums_live_processes_only_as_hami_does() -> None:
    def proc(total: int, sm: int, status: int) -> ProcSlot:
        return ProcSlot(
            pid=total,
            used=(DeviceMemory(1, 2, 3, 0, total),) + (DeviceMemory(),) * 15,
            device_util=(DeviceUtil(sm=sm),) + (DeviceUtil(),) * 15,
            status=status,
        )

    region = region_on([GPU_A], procs=(proc(100, 10, 1), proc(50, 5, 0), proc(30, 3, 2)))
    assert region.memory(0) == DeviceMemory(2, 4, 6, 0, 130)
    assert region.sm_util(0) == 13


def test_a_region_file_is_read_through_a_mapping_and_fields_written_in_place(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    region = region_on([GPU_A, GPU_B], procs=(ProcSlot(9),), recent_kernel=2, utilization_switch=1)
    path.write_bytes(encode(region))
    assert read_region(path) == region
    before = path.read_bytes()
    apply_writes(
        path,
        [
            FieldWrite(str(path), RegionField.RECENT_KERNEL, -1),
            FieldWrite(str(path), RegionField.UTILIZATION_SWITCH, 0),
        ],
    )
    after = path.read_bytes()
    assert read_region(path) == replace(region, recent_kernel=-1, utilization_switch=0)
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed and all(r.OFFSET_UTILIZATION_SWITCH <= i < r.OFFSET_PRIORITY for i in changed)


def test_writes_are_refused_into_a_file_that_is_no_longer_a_known_region(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    path.write_bytes(bytes(REGION_SIZE))
    with pytest.raises(RegionFormatError):
        apply_writes(path, [FieldWrite(str(path), RegionField.RECENT_KERNEL, -1)])
    assert path.read_bytes() == bytes(REGION_SIZE)


def test_scanner_reads_each_container_and_logs_a_bad_file_once_with_path_found_and_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = tmp_path / "uid-1_main"
    good.mkdir()
    (good / "abc.cache").write_bytes(encode(region_on([GPU_A])))
    (good / "libvgpu.so").write_bytes(b"")
    bad = tmp_path / "uid-2_side"
    bad.mkdir()
    data = bytearray(encode(region_on([GPU_A])))
    struct.pack_into("<I", data, 8, 9)
    (bad / "def.cache").write_bytes(bytes(data))
    (tmp_path / "uid-3_idle").mkdir()  # CUDA not started yet: no file, nothing said
    scanner = RegionScanner(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hami_node.monitor.regions"):
        first = scanner.scan()
        second = scanner.scan()
    assert [(c.pod_uid, c.container) for c in first] == [("uid-1", "main")]
    assert [c.region for c in second] == [c.region for c in first]
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 1, lines
    assert str(bad / "def.cache") in lines[0] and "version 1.9" in lines[0] and "known: 1.1, 1.2" in lines[0]
    assert scanner.refused() == 1


def test_scanner_refuses_a_directory_with_two_region_files(tmp_path: Path) -> None:
    directory = tmp_path / "uid-1_main"
    directory.mkdir()
    for name in ("a.cache", "b.cache"):
        (directory / name).write_bytes(encode(region_on([GPU_A])))
    assert RegionScanner(tmp_path).scan() == []


def test_scanner_of_a_missing_directory_finds_nothing(tmp_path: Path) -> None:
    assert RegionScanner(tmp_path / "none").scan() == []
