"""hami_node.cdi: the CDI spec for the cdi-annotations / cdi-cri strategies (issue 13, item 5): valid by the
CDI schema and library rules, naming exactly the devices Allocate returns, written atomically, rewritten
when GPUs go away, removed when none is left, and stale files of ours (only ours) removed."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_pod_allocation
from hami_node.allocation import NodeGPU, container_allocate_response
from hami_node.cdi import (
    CDI_KIND,
    CDI_VERSIONS,
    SPEC_FILE_NAME,
    CdiError,
    CdiSpecWriter,
    SpecGpu,
    build_spec,
    common_device_nodes,
    encode_spec,
    minimum_version,
    remove_stale,
    write_spec,
    written_by_us,
)
from hami_node.config import DeviceListStrategy, NodeConfig
from hami_node.devices import DeviceState
from tests.builders import container, physical_gpu, pod
from tests.cdi_util import RELEASED, SCHEMA_DIR, cdi_library_errors, schema_errors, spec_problems

A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
B = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
C = "GPU-3d8e1f2a-1111-2222-3333-444455556666"
COMMON = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
TIMEOUT = 5.0


# --- the checker checks --------------------------------------------------------------------------------


def test_the_checker_accepts_cdis_good_example_and_refuses_its_bad_one() -> None:
    good = json.loads((SCHEMA_DIR / "good-spec-example.json").read_text())
    assert spec_problems(good) == []
    assert schema_errors(json.loads((SCHEMA_DIR / "bad-explicit-empty.json").read_text()))
    assert cdi_library_errors({**good, "cdiVersion": "0.4.0"}) == ["the spec version must be at least v0.5.0"]
    assert cdi_library_errors({**good, "cdiVersion": "2.0.0"}) == ["invalid version '2.0.0'"]


# --- the spec ----------------------------------------------------------------------------------------


def test_spec_has_one_device_per_gpu_with_its_node_and_the_common_edits() -> None:
    spec = build_spec([SpecGpu(A, 0), SpecGpu(B, 3)], COMMON)
    assert spec == {
        "cdiVersion": "0.3.0",
        "kind": "k8s.device-plugin.nvidia.com/gpu",
        "devices": [
            {"name": A, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": B, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}},
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": p} for p in COMMON],
        },
    }
    assert spec_problems(spec) == []
    assert SPEC_FILE_NAME == "k8s.device-plugin.nvidia.com-gpu.json"  # CDI's GenerateSpecName(vendor, class)
    assert written_by_us(encode_spec(spec))


@given(
    st.lists(
        st.tuples(st.from_regex(r"\A(GPU|MIG)-[0-9a-f]{1,8}(-[0-9a-f]{1,8}){0,4}\Z"), st.integers(0, 255)),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[0],
    ),
    st.lists(st.sampled_from(COMMON), unique=True),
)
def test_every_spec_loads_in_a_cdi_runtime(gpus: list[tuple[str, int]], common: list[str]) -> None:
    spec = build_spec([SpecGpu(u, m) for u, m in gpus], common)
    assert spec is not None
    assert spec_problems(json.loads(encode_spec(spec))) == []
    assert spec["cdiVersion"] in CDI_VERSIONS and set(CDI_VERSIONS) <= set(RELEASED)


def test_the_names_allocate_returns_are_the_names_the_spec_defines() -> None:
    spec = build_spec([SpecGpu(A, 0), SpecGpu(B, 1), SpecGpu(C, 2)], COMMON)
    assert spec is not None
    defined = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    config = NodeConfig(
        node_name="n",
        device_list_strategy=(DeviceListStrategy.CDI_CRI, DeviceListStrategy.CDI_ANNOTATIONS),
    )
    response = container_allocate_response(
        pod("p", container("c"), namespace="ns", uid="u"),
        decode_pod_allocation(f"{A},NVIDIA,1000,10:{C},NVIDIA,1000,10:;"),
        0,
        [f"{A}-0", f"{C}-0"],
        gpus=[NodeGPU(A), NodeGPU(B), NodeGPU(C)],
        config=config,
        cache_id="cache",
    )
    assert set(response.cdi_devices) == {f"{CDI_KIND}={A}", f"{CDI_KIND}={C}"} <= defined
    (names,) = response.annotations.values()
    assert set(names.split(",")) <= defined


def test_no_gpu_means_no_spec_and_a_bad_uuid_is_refused() -> None:
    assert build_spec([], COMMON) is None
    with pytest.raises(CdiError, match="cannot be named in a CDI spec"):
        build_spec([SpecGpu("GPU-a/b", 0)], COMMON)
    with pytest.raises(CdiError, match="listed twice"):
        build_spec([SpecGpu(A, 0), SpecGpu(A, 1)], COMMON)


def test_minimum_version_follows_cdis_rules() -> None:
    base = build_spec([SpecGpu(A, 0)], ())
    assert base is not None and base["cdiVersion"] == "0.3.0" and "deviceNodes" not in base["containerEdits"]
    digit = replace_device(base, name="0")
    assert minimum_version(digit) == "0.5.0"
    host = replace_device(base, deviceNodes=[{"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0"}])
    assert minimum_version(host) == "0.5.0"
    assert minimum_version({**base, "annotations": {"a": "b"}}) == "0.6.0"
    for spec in (digit, host, {**base, "annotations": {"a": "b"}}):
        assert cdi_library_errors({**spec, "cdiVersion": minimum_version(spec)}) == []


def replace_device(spec: dict[str, object], **change: object) -> dict[str, object]:
    devices = json.loads(json.dumps(spec["devices"]))
    if "name" in change:
        devices[0]["name"] = change["name"]
    if "deviceNodes" in change:
        devices[0]["containerEdits"]["deviceNodes"] = change["deviceNodes"]
    return {**spec, "devices": devices}


def test_common_nodes_are_those_that_exist() -> None:
    assert common_device_nodes(lambda p: p != "/dev/nvidia-uvm-tools") == COMMON[:2]
    assert common_device_nodes(lambda p: True) == COMMON


def test_written_by_us_tells_our_spec_from_nvidias() -> None:
    ours = build_spec([SpecGpu(A, 0)], COMMON)
    assert ours is not None
    nvidia = {
        **ours,
        "containerEdits": {**ours["containerEdits"], "mounts": [{"hostPath": "/l", "containerPath": "/l"}]},
    }
    assert written_by_us(encode_spec(ours))
    assert not written_by_us(encode_spec(nvidia))
    assert not written_by_us(encode_spec({**ours, "kind": "nvidia.com/gpu"}))
    assert not written_by_us(b"not json")


# --- files -------------------------------------------------------------------------------------------


def test_write_spec_replaces_the_file_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    spec_dir = tmp_path / "run" / "cdi"
    first = encode_spec(build_spec([SpecGpu(A, 0)], COMMON) or {})
    path = write_spec(spec_dir, first)
    assert path == spec_dir / SPEC_FILE_NAME and path.read_bytes() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    inode = path.stat().st_ino
    second = encode_spec(build_spec([SpecGpu(B, 1)], COMMON) or {})
    write_spec(spec_dir, second)
    assert path.read_bytes() == second and path.stat().st_ino != inode  # renamed over, not rewritten
    assert os.listdir(spec_dir) == [SPEC_FILE_NAME]


def test_remove_stale_removes_only_our_files(tmp_path: Path) -> None:
    ours = encode_spec(build_spec([SpecGpu(A, 0)], COMMON) or {})
    (tmp_path / SPEC_FILE_NAME).write_bytes(ours)
    (tmp_path / f".{SPEC_FILE_NAME}.x1y2.tmp").write_bytes(b"{")
    (tmp_path / "nvidia.yaml").write_text("kind: nvidia.com/gpu\n")
    (tmp_path / "other.json.tmp").write_text("{}")
    assert remove_stale(tmp_path, spec_too=False) == [tmp_path / f".{SPEC_FILE_NAME}.x1y2.tmp"]
    assert remove_stale(tmp_path, spec_too=True) == [tmp_path / SPEC_FILE_NAME]
    assert sorted(os.listdir(tmp_path)) == ["nvidia.yaml", "other.json.tmp"]
    # A spec of the same name written by NVIDIA's or HAMi's device plugin is not ours to remove.
    theirs = json.loads(ours)
    theirs["containerEdits"]["hooks"] = [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}]
    (tmp_path / SPEC_FILE_NAME).write_text(json.dumps(theirs))
    assert remove_stale(tmp_path, spec_too=True) == []
    assert remove_stale(tmp_path / "missing", spec_too=True) == []


# --- the writer --------------------------------------------------------------------------------------


def written(path: Path) -> list[tuple[str, str]]:
    spec = json.loads(path.read_bytes())
    assert spec_problems(spec) == []
    return [(d["name"], d["containerEdits"]["deviceNodes"][0]["path"]) for d in spec["devices"]]


def test_writer_follows_the_gpu_list_and_leaves_the_spec_when_stopped(tmp_path: Path) -> None:
    state = DeviceState(NodeConfig(node_name="n"))
    state.set_gpus([physical_gpu(A, 0), physical_gpu(B, 1), physical_gpu(C, 2, minor=7)], at=0.0)
    (tmp_path / f".{SPEC_FILE_NAME}.old.tmp").write_text("{")
    writer = CdiSpecWriter(state, tmp_path, lambda p: True)
    writer.start()
    try:
        # Written before start() returns: the plugin never hands out a name the runtime cannot resolve.
        assert written(writer.path) == [(A, "/dev/nvidia0"), (B, "/dev/nvidia1"), (C, "/dev/nvidia7")]
        assert os.listdir(tmp_path) == [SPEC_FILE_NAME]
        count = writer.writes

        state.mark_unhealthy(B, "Xid 79", at=1.0)  # health is not in the spec: nothing to write
        state.set_gpus([physical_gpu(A, 0), physical_gpu(C, 2, minor=7)], at=2.0)  # B went away
        assert writer.wait_writes(count, TIMEOUT)
        assert written(writer.path) == [(A, "/dev/nvidia0"), (C, "/dev/nvidia7")]
        assert writer.writes == count + 1

        state.set_gpus([], at=3.0)  # no GPU left: a spec must define a device, so there is none
        assert writer.wait_writes(count + 1, TIMEOUT)
        assert not writer.path.exists()

        state.set_gpus([physical_gpu(B, 1)], at=4.0)
        assert writer.wait_writes(count + 2, TIMEOUT)
        assert written(writer.path) == [(B, "/dev/nvidia1")]
    finally:
        writer.stop()
    assert written(writer.path) == [(B, "/dev/nvidia1")]  # kubelet's container restarts still resolve


def test_writer_start_fails_when_the_spec_cannot_be_written(tmp_path: Path) -> None:
    state = DeviceState(NodeConfig(node_name="n"))
    state.set_gpus([physical_gpu(A, 0)], at=0.0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = CdiSpecWriter(state, blocker / "cdi", lambda p: True)
    with pytest.raises(CdiError, match=r"cannot (write|clean)"):
        writer.start()
    writer.stop()


def test_writer_waits_for_the_first_listing(tmp_path: Path) -> None:
    state = DeviceState(NodeConfig(node_name="n"))  # NVML failing at start: nothing listed yet
    writer = CdiSpecWriter(state, tmp_path, lambda p: True)
    writer.start()
    try:
        assert not writer.path.exists()
        state.set_gpus([physical_gpu(A, 0)], at=0.0)
        assert writer.wait_writes(0, TIMEOUT)
        assert written(writer.path) == [(A, "/dev/nvidia0")]
    finally:
        writer.stop()


def test_config_default_dir_is_var_run_cdi() -> None:
    assert NodeConfig(node_name="n").cdi_spec_dir == Path("/var/run/cdi")
    assert replace(NodeConfig(node_name="n"), cdi_spec_dir=Path("/etc/cdi")).cdi_spec_dir == Path("/etc/cdi")
