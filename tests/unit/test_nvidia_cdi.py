"""NVIDIA's CDI spec in NVIDIA's modes (`hami_node.nvidia.cdi`), and HAMi's dynamic MIG devices in
hami-core mode's spec (`hami_node.cdi.CdiSpecWriter` listening to `MigManager`, `mig_container_response`).

The names are nvcdi's device namer's (nvidia-container-toolkit pkg/nvcdi/namer.go: `uuid` -> GPU-/MIG-
UUIDs, `index` -> `0`, `0:1`), a MIG device's nodes are its parent's and its GI/CI capability nodes
(k8s-device-plugin internal/rm/nvml_devices.go `nvmlMigDevice.GetPaths`, internal/mig/mig-dp.go), the
kind and file are internal/cdi/cdi.go's, and every name Allocate hands out under a cdi-* strategy is
defined by the spec.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hami_api.mig_alloc import MigAllocation
from hami_api.types import MigPlacement
from hami_node.allocation import mig_container_response
from hami_node.cdi import (
    CDI_KIND,
    SPEC_FILE_NAME,
    CdiError,
    CdiSpecWriter,
    encode_spec,
    remove_stale,
    written_by_us,
)
from hami_node.config import NodeConfig
from hami_node.config import load_config as node_load_config
from hami_node.devices import DeviceState
from hami_node.gpu.fake import FakeBackend
from hami_node.mig_manager import MigAllocateError, MigManager
from hami_node.nvidia.cdi import (
    NvidiaCdiSpec,
    build_nvidia_spec,
    default_mig_minor,
    mig_capability_paths,
    parse_mig_minors,
)
from hami_node.nvidia.config import DeviceIDStrategy, DeviceListStrategy, load_config
from hami_node.nvidia.daemon import NvidiaPlugins
from hami_node.nvidia.device_map import Device
from hami_node.nvidia.plugin import NvidiaDevices, adapt_devices
from hami_node.nvidia.replicas import container_allocate_response
from tests.cdi_util import spec_problems

A100 = "NVIDIA A100-SXM4-40GB"
INVENTORY: dict[str, Any] = {
    "gpus": [
        {"uuid": "GPU-aaaa", "model": "Tesla T4", "memory": 15360},
        {
            "uuid": "GPU-bbbb",
            "model": A100,
            "memory": 40960,
            "mig": {
                "enabled": True,
                "devices": [{"profile": "3g.20gb", "start": 4}, {"profile": "1g.5gb", "start": 0}],
            },
        },
    ]
}
MINORS = """\
config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu1/gi2/access 159
gpu1/gi2/ci0/access 160
not a line
"""
UUID = DeviceIDStrategy.UUID
INDEX = DeviceIDStrategy.INDEX


def backend(tmp_path: Path) -> FakeBackend:
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(INVENTORY))
    fake = FakeBackend(path, watch=False)
    fake.init()
    return fake


def served(tmp_path: Path, *flags: str) -> NvidiaDevices:
    fake = backend(tmp_path)
    config = load_config(["--mig-strategy=mixed", *flags], {}, lambda _p: "")
    return NvidiaDevices(config, adapt_devices(fake, fake.list_gpus()))


def all_devices(nv: NvidiaDevices) -> list[Device]:
    return [d for r in nv.resources for d in nv.map[r]]


# --- capability minors ----------------------------------------------------------------------------------


def test_the_drivers_fixed_layout_gives_gi_and_ci_access_minors() -> None:
    assert default_mig_minor(0, 0) == 3 and default_mig_minor(0, 0, 0) == 4
    assert default_mig_minor(0, 0, 7) == 11 and default_mig_minor(0, 1) == 12
    assert default_mig_minor(1, 0) == 3 + 135 and default_mig_minor(1, 2, 0) == 3 + 135 + 18 + 1


def test_an_id_outside_the_drivers_layout_names_the_id_and_value() -> None:
    with pytest.raises(ValueError, match=r"GPU instance ID: expected 0\.\.14, got 15"):
        default_mig_minor(0, 15)
    with pytest.raises(ValueError, match=r"compute instance ID: expected 0\.\.7, got 8"):
        default_mig_minor(0, 1, 8)


def test_mig_minors_file_is_parsed_and_unknown_lines_skipped() -> None:
    minors = parse_mig_minors(MINORS)
    assert minors[(0, 1, None)] == 12 and minors[(0, 1, 0)] == 13 and minors[(1, 2, 0)] == 160
    assert len(minors) == 6


def test_capability_paths_come_from_the_minors_file_when_there_is_one() -> None:
    minors = parse_mig_minors(MINORS)
    assert mig_capability_paths(1, 2, 0, minors) == (
        "/dev/nvidia-caps/nvidia-cap159",
        "/dev/nvidia-caps/nvidia-cap160",
    )
    assert mig_capability_paths(0, 1, 0) == ("/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")


def test_a_gpu_instance_missing_from_the_minors_file_is_nvidias_error_naming_the_capability() -> None:
    with pytest.raises(CdiError, match=r"missing MIG GPU instance capability path: .*/gpu0/mig/gi5/access"):
        mig_capability_paths(0, 5, 0, parse_mig_minors(MINORS))


@given(st.integers(0, 31), st.integers(0, 14), st.integers(0, 7))
def test_default_minors_of_distinct_instances_never_collide(gpu: int, gi: int, ci: int) -> None:
    minors = {default_mig_minor(g, i, c) for g in (gpu,) for i in range(15) for c in (None, *range(8))}
    assert len(minors) == 15 * 9
    assert default_mig_minor(gpu, gi) < default_mig_minor(gpu, gi, ci) < default_mig_minor(gpu, gi) + 9


# --- the spec ---------------------------------------------------------------------------------------------


def test_mig_devices_carry_their_parents_node_and_gi_ci_capability_nodes(tmp_path: Path) -> None:
    nv = served(tmp_path)
    migs = [d for d in all_devices(nv) if d.is_mig]
    assert len(migs) == 2
    for device in migs:
        parent, gi_cap, ci_cap = device.paths
        assert parent == "/dev/nvidia1"
        assert gi_cap.startswith("/dev/nvidia-caps/nvidia-cap") and ci_cap.startswith("/dev/nvidia-caps/")
        gi = device.gpu_instance_id
        assert gi is not None and gi_cap.endswith(f"cap{default_mig_minor(1, gi)}")


def test_the_spec_names_gpus_and_mig_devices_by_uuid_with_their_nodes(tmp_path: Path) -> None:
    nv = served(tmp_path)
    spec = build_nvidia_spec(all_devices(nv), UUID, ["/dev/nvidiactl"])
    assert spec is not None and spec["kind"] == CDI_KIND == "k8s.device-plugin.nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names[0] == "GPU-aaaa" and sorted(n[:4] for n in names[1:]) == ["MIG-", "MIG-"]
    assert spec["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    assert [len(d["containerEdits"]["deviceNodes"]) for d in spec["devices"]] == [1, 3, 3]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
    }
    assert spec_problems(spec) == []
    assert written_by_us(encode_spec(spec))


def test_the_index_strategy_names_gpus_i_and_mig_devices_i_colon_j(tmp_path: Path) -> None:
    nv = served(tmp_path, "--device-id-strategy=index")
    spec = build_nvidia_spec(all_devices(nv), INDEX, [])
    assert spec is not None
    assert sorted(d["name"] for d in spec["devices"]) == ["0", "1:0", "1:1"]
    assert spec["cdiVersion"] == "0.5.0"  # a device name starting with a digit
    assert spec_problems(spec) == []


def test_replicas_are_defined_once_by_the_device_they_replicate() -> None:
    replicas = [Device(f"GPU-a::{r}", "0", "GPU-a", paths=("/dev/nvidia0",), replicas=4) for r in range(4)]
    spec = build_nvidia_spec(replicas, UUID, [])
    assert spec is not None and [d["name"] for d in spec["devices"]] == ["GPU-a"]


def test_no_device_is_no_spec_and_a_device_without_a_node_is_refused_naming_it() -> None:
    assert build_nvidia_spec([], UUID, []) is None
    with pytest.raises(CdiError, match="device GPU-x: no device node"):
        build_nvidia_spec([Device("GPU-x", "0", "GPU-x")], UUID, [])
    with pytest.raises(CdiError, match="'GPU x' cannot be named in a CDI spec"):
        build_nvidia_spec([Device("GPU x", "0", "GPU x", paths=("/dev/nvidia0",))], UUID, [])


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
def test_every_cdi_name_allocate_hands_out_is_defined_by_the_spec(
    tmp_path: Path, strategy: str, id_strategy: str
) -> None:
    nv = served(tmp_path, f"--device-list-strategy={strategy}", f"--device-id-strategy={id_strategy}")
    flags = nv.config.flags
    spec = build_nvidia_spec(all_devices(nv), flags.device_id_strategy, [])
    assert spec is not None
    defined = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    for resource in nv.resources:
        by_id = nv.by_id(resource)
        for device_id in by_id:
            answer = container_allocate_response([device_id], by_id, flags, cdi_response_id="r1")
            response = answer.response
            if DeviceListStrategy.CDI_CRI in flags.device_list_strategy:
                names = list(response.cdi_devices)
            else:
                (key,) = response.annotations
                assert key == "cdi.k8s.io/nvidia-device-plugin_r1"
                names = response.annotations[key].split(",")
            assert names and set(names) <= defined, (names, defined)
            assert "NVIDIA_VISIBLE_DEVICES" not in response.envs


# --- the file -----------------------------------------------------------------------------------------------


def test_the_spec_file_is_nvidias_name_rewritten_only_on_change_and_cleaned_up_by_hami_core_mode(
    tmp_path: Path,
) -> None:
    nv = served(tmp_path)
    spec_dir = tmp_path / "cdi"
    writer = NvidiaCdiSpec(spec_dir, UUID, lambda p: p == "/dev/nvidiactl")
    writer.write(all_devices(nv))
    assert writer.path == spec_dir / SPEC_FILE_NAME == spec_dir / "k8s.device-plugin.nvidia.com-gpu.json"
    first = writer.path.stat().st_mtime_ns, writer.path.stat().st_ino
    writer.write(all_devices(nv))
    assert (writer.path.stat().st_mtime_ns, writer.path.stat().st_ino) == first
    writer.write([d for d in all_devices(nv) if not d.is_mig])
    assert [d["name"] for d in json.loads(writer.path.read_bytes())["devices"]] == ["GPU-aaaa"]
    # hami-node started later without a CDI strategy removes it as its own.
    assert remove_stale(spec_dir, spec_too=True) == [writer.path]


def test_a_spec_directory_that_cannot_be_written_is_a_cdi_error_naming_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = NvidiaCdiSpec(blocker / "cdi", UUID, lambda _p: False)
    with pytest.raises(CdiError, match=r"cannot write the CDI spec .*file/cdi/k8s.device-plugin.nvidia.com"):
        writer.write([Device("GPU-a", "0", "GPU-a", paths=("/dev/nvidia0",))])


def test_nvidia_plugins_write_the_spec_of_the_served_devices_with_a_cdi_strategy(tmp_path: Path) -> None:
    fake = backend(tmp_path)
    nvidia = load_config(["--mig-strategy=mixed", "--device-list-strategy=cdi-cri"], {}, lambda _p: "")
    config = replace(
        NodeConfig(node_name="n1"),
        cdi_spec_dir=tmp_path / "cdi",
        kubelet_dir=tmp_path / "kubelet",
        nvidia=nvidia,
    )
    state = DeviceState(config)
    state.set_gpus(fake.list_gpus(), 0.0)
    plugins = NvidiaPlugins(config, state, fake, exists=lambda _p: True)
    plugins._write_cdi_spec(plugins.build())
    assert plugins.cdi_spec is not None
    spec = json.loads(plugins.cdi_spec.path.read_bytes())
    assert len(spec["devices"]) == 3 and spec_problems(spec) == []
    assert spec["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidiactl"}


# --- HAMi's dynamic MIG under a cdi-* strategy (hami-core mode's spec, `hami_node.cdi.CdiSpecWriter`) -----


def mig_backend(tmp_path: Path) -> FakeBackend:
    path = tmp_path / "mig.yaml"
    path.write_text(
        yaml.safe_dump({"gpus": [{"uuid": "GPU-a", "model": A100, "memory": 40960, "mig": True}]})
    )
    fake = FakeBackend(path, watch=False)
    fake.init()
    return fake


def reservation(start: int, profile: str = "1g.5gb", size: int = 1) -> MigAllocation:
    return MigAllocation(0, 0, "GPU-a", profile, MigPlacement(start, size))


def spec_writer(tmp_path: Path, fake: FakeBackend, manager: MigManager) -> CdiSpecWriter:
    config = node_load_config(
        ["--node-name", "n1", "--device-list-strategy", "cdi-cri", "--operating-mode", "mig"],
        env={},
        read_file=lambda _p: "",
    )
    state = DeviceState(config)
    state.set_gpus(fake.list_gpus(), 0.0)
    return CdiSpecWriter(state, tmp_path / "cdi", lambda _p: True, mig=manager, mig_minors=lambda: None)


def test_a_created_mig_instance_is_in_the_spec_before_ensure_container_returns_and_gone_after_release(
    tmp_path: Path,
) -> None:
    fake = mig_backend(tmp_path)
    manager = MigManager(fake)
    writer = spec_writer(tmp_path, fake, manager)
    (inst,) = manager.ensure_container([reservation(6)])
    spec = json.loads(writer.path.read_bytes())
    assert [d["name"] for d in spec["devices"]] == ["GPU-a", inst.mig_uuid]
    nodes = [n["path"] for n in spec["devices"][1]["containerEdits"]["deviceNodes"]]
    gi_cap, ci_cap = mig_capability_paths(0, inst.gpu_instance_id, inst.compute_instance_id)
    assert nodes == ["/dev/nvidia0", gi_cap, ci_cap]
    assert spec_problems(spec) == [] and written_by_us(writer.path.read_bytes())
    manager.release(inst.key)
    assert [d["name"] for d in json.loads(writer.path.read_bytes())["devices"]] == ["GPU-a"]


def test_a_spec_that_cannot_be_written_fails_the_allocation_and_rolls_the_instance_back(
    tmp_path: Path,
) -> None:
    fake = mig_backend(tmp_path)
    manager = MigManager(fake)
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise CdiError("cannot write the CDI spec /x: read-only file system")

    manager.add_listener(failing)
    with pytest.raises(MigAllocateError, match="read-only file system"):
        manager.ensure_container([reservation(6)])
    assert manager.managed() == {} and fake.mig_devices("GPU-a") == ()


def test_mig_response_under_cdi_cri_names_the_mig_devices_and_sets_no_env() -> None:
    config = node_load_config(
        ["--node-name", "n", "--device-list-strategy", "cdi-cri"], env={}, read_file=lambda _p: ""
    )
    response = mig_container_response(["MIG-1", "MIG-2"], config)
    assert response.cdi_devices == (
        "k8s.device-plugin.nvidia.com/gpu=MIG-1",
        "k8s.device-plugin.nvidia.com/gpu=MIG-2",
    )
    assert dict(response.envs) == {} and response.mounts == ()


def test_mig_response_under_cdi_annotations_has_one_stable_annotation_with_the_names() -> None:
    config = node_load_config(
        ["--node-name", "n", "--device-list-strategy", "cdi-annotations,envvar"],
        env={},
        read_file=lambda _p: "",
    )
    response = mig_container_response(["MIG-1"], config)
    (key,) = response.annotations
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and len(key.split("/")[1]) <= 63
    assert response.annotations[key] == "k8s.device-plugin.nvidia.com/gpu=MIG-1"
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-1"}
    assert mig_container_response(["MIG-1"], config).annotations == response.annotations
