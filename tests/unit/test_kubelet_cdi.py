"""The kubelet stand-in's container runtime side of CDI: reading spec files (JSON and YAML) with
clear errors for bad ones, resolving device names as CDI's cache does (priorities, conflicts, spec
edits once), applying the edits as CDI applies them to an OCI spec, and the record of what a
container gets from device plugins and DRA together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami_node.plugin.api import api_pb2
from hami_sim.kubelet.dra.cdi import (
    CdiResolutionError,
    CdiSpecError,
    ContainerEdits,
    ContainerView,
    load_registry,
    parse_spec,
    read_spec,
)
from hami_sim.kubelet.runtime import (
    ContainerRuntime,
    container_record,
    device_plugin_view,
    read_containers,
)
from tests.builders import pod

KIND = "k8s.gpu.hami.io/claim"


def spec(*devices: dict[str, Any], version: str = "0.5.0", kind: str = KIND, **top: Any) -> dict[str, Any]:
    return {"cdiVersion": version, "kind": kind, "devices": list(devices), **top}


def device(name: str, *env: str, **edits: Any) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"env": list(env), **edits}}


def write(directory: Path, name: str, content: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_spec_is_read_from_json_and_from_yaml(tmp_path: Path) -> None:
    as_json = write(tmp_path, "a.json", spec(device("uid-gpu-0", "A=1"), containerEdits={"env": ["C=0"]}))
    as_yaml = write(
        tmp_path,
        "b.yaml",
        "cdiVersion: 0.6.0\nkind: vendor.com/class.dotted\ndevices:\n"
        "- name: d0\n  annotations: {k: v}\n  containerEdits:\n    mounts:\n"
        "    - {hostPath: /h, containerPath: /c, options: [ro, bind]}\n",
    )
    first, second = read_spec(as_json), read_spec(as_yaml)
    assert (first.kind, first.devices["uid-gpu-0"].env, first.edits.env) == (KIND, ("A=1",), ("C=0",))
    assert second.qualified("d0") == "vendor.com/class.dotted=d0"
    assert second.devices["d0"].mounts == (
        {"hostPath": "/h", "containerPath": "/c", "options": ["ro", "bind"]},
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (spec(device("d", "A=1"), version="0.2.9"), 'cdiVersion: invalid version "0.2.9"'),
        (spec(device("0d", "A=1"), version="0.4.0"), "cdiVersion: the spec version must be at least v0.5.0"),
        (
            spec(device("d", "A=1"), version="0.5.0", annotations={"a": "b"}),
            "at least v0.6.0 (it says 0.5.0)",
        ),
        (
            spec(
                device("d", mounts=[{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]),
                version="0.3.0",
            ),
            "at least v0.4.0",
        ),
        (spec(device("d", "A=1"), kind="nokind"), 'kind: invalid class "" in "nokind"'),
        (spec(device("d", "A=1"), kind="1vendor/c"), 'kind: invalid vendor "1vendor"'),
        (spec(), "devices: invalid spec, no devices"),
        (spec(device("d", "A=1"), device("d", "B=2")), 'devices[1].name: invalid spec, multiple device "d"'),
        (spec(device("-d", "A=1")), 'devices[0].name: invalid device name "-d"'),
        (spec(device("d")), 'devices[0].containerEdits: device "d": invalid device, empty device edits'),
        (
            spec(device("d", "NOVALUE")),
            'devices[0].containerEdits.env[0]: invalid environment variable "NOVALUE"',
        ),
        (spec(device("d", "=x")), 'invalid environment variable "=x"'),
        (
            spec(device("d", deviceNodes=[{"hostPath": "/dev/x"}])),
            "deviceNodes[0].path: expected a string, got null",
        ),
        (
            spec(device("d", deviceNodes=[{"path": "/dev/x", "type": "z"}])),
            'device "/dev/x": invalid type "z"',
        ),
        (
            spec(device("d", deviceNodes=[{"path": "/dev/x", "major": -1}])),
            "invalid (negative) device number -1",
        ),
        (
            spec(device("d", deviceNodes=[{"path": "/dev/x", "permissions": "rx"}])),
            'invalid permissions "rx"',
        ),
        (
            spec(device("d", mounts=[{"hostPath": "/h"}])),
            "mounts[0].containerPath: expected a string, got null",
        ),
        (
            spec(device("d", hooks=[{"hookName": "later", "path": "/x"}])),
            'hooks[0].hookName: invalid hook name "later"',
        ),
        (spec(device("d", "A=1", extra=1)), 'devices[0].containerEdits: unknown field "extra"'),
        (
            spec(device("d", "A=1"), containerEdits={"env": "A=1"}),
            'containerEdits.env: expected a list, got "A=1"',
        ),
        ({"cdiVersion": "0.5.0", "kind": KIND, "devices": [], "bogus": True}, 'unknown field "bogus"'),
    ],
)
def test_a_bad_spec_is_refused_naming_the_file_the_field_and_the_value(document: Any, message: str) -> None:
    with pytest.raises(CdiSpecError) as err:
        parse_spec(document, "/cdi/x.json")
    assert str(err.value).startswith("CDI spec /cdi/x.json: ")
    assert message in str(err.value)


def test_a_spec_that_does_not_parse_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "cdiVersion: [unclosed\n")
    with pytest.raises(CdiSpecError, match=rf"^CDI spec {path}: does not parse"):
        read_spec(path)


def test_resolution_applies_spec_edits_once_then_each_devices_edits_in_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        "claims.json",
        spec(device("a", "A=1"), device("b", "B=2"), containerEdits={"env": ["COMMON=1"]}),
    )
    registry = load_registry([tmp_path])
    edits = registry.resolve([f"{KIND}=b", f"{KIND}=a"])
    assert edits.env == ("COMMON=1", "B=2", "A=1")
    with pytest.raises(CdiResolutionError, match=f"^unresolvable CDI devices {KIND}=c, other.com/x=y$"):
        registry.resolve([f"{KIND}=a", f"{KIND}=c", "other.com/x=y"])


def test_a_broken_spec_makes_its_devices_unresolvable_and_the_error_says_why(tmp_path: Path) -> None:
    write(tmp_path, "good.json", spec(device("a", "A=1")))
    write(tmp_path, "bad.json", spec(device("b", "NOVALUE")))
    write(tmp_path, "ignored.txt", "not a spec")
    registry = load_registry([tmp_path])
    assert sorted(registry.devices) == [f"{KIND}=a"]
    with pytest.raises(CdiResolutionError) as err:
        registry.resolve([f"{KIND}=b"])
    assert f"unresolvable CDI devices {KIND}=b (spec problems: {tmp_path / 'bad.json'}: " in str(err.value)
    assert 'invalid environment variable "NOVALUE"' in str(err.value)


def test_a_later_spec_directory_wins_and_two_specs_of_one_directory_conflict(tmp_path: Path) -> None:
    low, high = tmp_path / "etc", tmp_path / "run"
    write(low, "x.json", spec(device("a", "FROM=etc"), device("b", "FROM=etc")))
    write(high, "y.json", spec(device("a", "FROM=run")))
    write(high, "z.json", spec(device("c", "FROM=z")))
    write(high, "zz.json", spec(device("c", "FROM=zz")))
    registry = load_registry([low, high, tmp_path / "missing"])
    assert registry.resolve([f"{KIND}=a", f"{KIND}=b"]).env == ("FROM=run", "FROM=etc")
    with pytest.raises(CdiResolutionError, match="conflicting device"):
        registry.resolve([f"{KIND}=c"])


def test_edits_replace_env_keys_mounts_and_device_nodes_and_sort_mounts_by_depth() -> None:
    view = ContainerView(
        env=["A=old", "KEEP=1"],
        mounts=[{"containerPath": "/usr/lib/x/y", "hostPath": "/h1", "options": []}],
        device_nodes=[{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"}],
    )
    view.apply(
        ContainerEdits(
            env=("A=new", "B=2"),
            device_nodes=({"path": "/dev/nvidia0", "permissions": "rwm"}, {"path": "/dev/nvidiactl"}),
            mounts=(
                {"containerPath": "/usr/lib/x/y", "hostPath": "/h2"},
                {"containerPath": "/etc/ld.so.preload", "hostPath": "/p", "options": ["ro"]},
            ),
            additional_gids=(0, 44),
        )
    )
    assert view.env == ["A=new", "KEEP=1", "B=2"]
    assert [(d["path"], d["hostPath"], d.get("permissions")) for d in view.device_nodes] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rwm"),
        ("/dev/nvidiactl", "/dev/nvidiactl", None),
    ]
    assert [(m["containerPath"], m["hostPath"]) for m in view.mounts] == [
        ("/etc/ld.so.preload", "/p"),
        ("/usr/lib/x/y", "/h2"),
    ]
    assert view.additional_gids == [44]


def _response(envs: dict[str, str], **fields: Any) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(envs=envs, **fields)


def test_device_plugin_answers_merge_by_resource_name_with_the_first_value_winning() -> None:
    responses = {
        "nvidia.com/gpu": _response(
            {"CUDA_DEVICE_MEMORY_LIMIT_0": "4000m", "SHARED": "gpu"},
            mounts=[
                api_pb2.Mount(
                    container_path="/usr/local/vgpu/libvgpu.so", host_path="/h/libvgpu.so", read_only=True
                )
            ],
            devices=[
                api_pb2.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")
            ],
            cdi_devices=[api_pb2.CDIDevice(name="k8s.device-plugin.nvidia.com/gpu=GPU-0")],
        ),
        "example.com/a": _response({"SHARED": "a"}),
    }
    view, cdi, _ = device_plugin_view(responses)
    assert view.env == ["SHARED=a", "CUDA_DEVICE_MEMORY_LIMIT_0=4000m"]
    assert view.mounts == [
        {"containerPath": "/usr/local/vgpu/libvgpu.so", "hostPath": "/h/libvgpu.so", "options": ["ro"]}
    ]
    assert view.device_nodes == [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"}]
    assert cdi == ["k8s.device-plugin.nvidia.com/gpu=GPU-0"]


def test_the_runtime_record_puts_cdi_edits_over_device_plugin_answers_and_reads_back(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    write(
        cdi_dir,
        "k8s.gpu.hami.io-claim_uid.json",
        spec(device("uid-gpu-0", "CUDA_DEVICE_MEMORY_LIMIT_0=2000m")),
    )
    p = pod("p", namespace="ns", uid="pod-uid")
    responses = {"nvidia.com/gpu": _response({"CUDA_DEVICE_MEMORY_LIMIT_0": "4000m", "X": "1"})}
    record = container_record(p, "main", responses, [f"{KIND}=uid-gpu-0"], [cdi_dir])
    assert record.env_map == {"CUDA_DEVICE_MEMORY_LIMIT_0": "2000m", "X": "1"}
    assert record.cdi_devices == (f"{KIND}=uid-gpu-0",)
    with pytest.raises(CdiResolutionError, match=f"unresolvable CDI devices {KIND}=nope"):
        container_record(p, "main", responses, [f"{KIND}=nope"], [cdi_dir])
    runtime = ContainerRuntime(tmp_path / "containers.json")
    runtime.record_pod("pod-uid", [record])
    assert read_containers(runtime.path).env("pod-uid", "main") == record.env_map
    assert read_containers(runtime.path).get("pod-uid", "main") == record
    runtime.remove_pod("pod-uid")
    assert read_containers(runtime.path).records == ()
    assert read_containers(tmp_path / "none.json").env("pod-uid", "main") == {}
