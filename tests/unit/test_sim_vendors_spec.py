"""Vendor nodes in a local cluster's spec (hami_sim.cluster.spec), the scale-mode host spec
(hami_sim.nodehost), the stand-in's flags (hami_sim.vendors.cli) and the scheduler configuration a
cluster with vendor nodes runs with."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_sim.cluster.cluster import vendor_scheduler_config
from hami_sim.cluster.spec import ClusterSpec, SpecError, parse_inventory_spec
from hami_sim.nodehost import HostedNode, HostSpec, host_spec_data, parse_host_spec
from hami_sim.scheduler.config import parse_configuration
from hami_sim.vendors.cli import ArgsError, plugin_config, vendor_argv
from hami_sim.vendors.table import DeviceSpec, device_spec

FILE = {
    "npu-1": {"vendor": "ascend", "model": "910B4", "count": 8},
    "dcu-1": {"vendor": "hygon", "count": 4, "memory": 16384},
    "mix-1": {"vendor": "hygon", "nvidia": {"count": 2, "model": "NVIDIA A100-SXM4-40GB"}},
    "gpu-1": {"count": 1, "model": "NVIDIA A100-SXM4-40GB"},
    "ix-1": {"vendor": "iluvatar", "model": "MR-V100"},
}


def test_an_inventory_file_gives_nodes_of_any_vendor_with_nvidia_gpus_beside() -> None:
    nodes = {n.name: n for n in parse_inventory_spec(FILE, "f.yaml")}
    assert nodes["npu-1"].devices == DeviceSpec("ascend", "910B4", 8, 32768, 20, 4)
    assert nodes["dcu-1"].devices == DeviceSpec("hygon", "Z100L", 4, 16384, 100, 4)
    assert nodes["npu-1"].gpus == () and nodes["npu-1"].vendor == "ascend"
    assert len(nodes["mix-1"].gpus) == 2 and nodes["mix-1"].vendor == "hygon"
    assert nodes["gpu-1"].devices is None and nodes["gpu-1"].vendor == "nvidia"


def test_a_cluster_with_gated_vendors_enables_them_in_hami_control() -> None:
    spec = ClusterSpec(parse_inventory_spec(FILE, "f.yaml"))
    assert spec.vendor_gates == ("--enable-ascend", "--enable-iluvatar")
    assert spec.vendor_nodes == ("npu-1", "dcu-1", "mix-1", "ix-1")
    assert spec.nvidia_nodes == ("mix-1", "gpu-1")
    assert spec.describe().endswith("; 4 vendor nodes (ascend, hygon, iluvatar)")
    assert ClusterSpec(parse_inventory_spec({"d": {"vendor": "hygon"}})).vendor_gates == ()


def test_a_clusters_vendor_devices_survive_its_state_file() -> None:
    spec = ClusterSpec(parse_inventory_spec(FILE, "f.yaml"))
    again = ClusterSpec.from_data(spec.to_data())
    assert [(n.name, n.devices, n.gpus) for n in again.nodes] == [
        (n.name, n.devices, n.gpus) for n in spec.nodes
    ]


def test_mixed_mode_leaves_vendor_nodes_on_the_device_plugin_and_dra_mode_refuses_them() -> None:
    spec = ClusterSpec(parse_inventory_spec({"a": {"count": 1}, "d": {"vendor": "hygon"}}))
    assert [n.mode for n in spec.with_mode("mixed").nodes] == ["device-plugin", "device-plugin"]
    with pytest.raises(
        SpecError, match="node d: mode: a hygon node serves its devices through the device plugin"
    ):
        spec.with_mode("dra")


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"vendor": "tpu"}, "f.yaml: n1: vendor: expected nvidia or one of hygon"),
        ({"vendor": "hygon", "count": -2}, "f.yaml: n1: count: expected an integer >= 1, got -2"),
        (
            {"vendor": "hygon", "gpus": 2},
            "f.yaml: n1: unknown key 'gpus' (expected vendor, mode, model, count",
        ),
        (
            {"vendor": "hygon", "nvidia": {"count": 0}},
            "f.yaml: n1.nvidia.count: expected an integer >= 1, got 0",
        ),
        ({"vendor": "nvidia", "nvidia": {"count": 1}}, "f.yaml: n1: nvidia: a node of vendor nvidia lists"),
        ({"vendor": "ascend", "model": "910X"}, "f.yaml: n1: model: '910X' is not a known ascend product"),
    ],
)
def test_a_bad_vendor_entry_names_the_node_and_field(entry: Mapping[str, Any], error: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_inventory_spec({"n1": entry}, "f.yaml")
    assert str(raised.value).startswith(error)


def test_a_node_of_vendor_nvidia_is_an_ordinary_gpu_node() -> None:
    (node,) = parse_inventory_spec({"n1": {"vendor": "nvidia", "count": 2, "model": "NVIDIA A100-SXM4-40GB"}})
    assert node.devices is None and len(node.gpus) == 2


def test_the_stand_ins_flags_round_trip_and_bad_ones_name_the_flag(tmp_path: Path) -> None:
    devices = device_spec({"vendor": "metax", "mode": "gpu", "count": 3})
    argv = vendor_argv("mx-1", tmp_path, tmp_path / "kubeconfig", devices)
    config = plugin_config(argv)
    assert (config.node_name, config.devices, config.kubelet_dir) == ("mx-1", devices, tmp_path.resolve())
    assert config.socket_for("metax-tech.com/gpu") == tmp_path.resolve() / "metax-gpu-gpu.sock"
    with pytest.raises(ArgsError, match="--count: expected an integer >= 1, got 0"):
        plugin_config([*argv, "--count", "0"])
    with pytest.raises(ArgsError, match="the following arguments are required: --vendor"):
        plugin_config(["--node-name", "n", "--kubelet-dir", "/tmp"])


def test_a_host_spec_carries_a_nodes_vendor_stand_in_and_whether_it_runs_hami_node() -> None:
    spec = HostSpec((HostedNode("d", Path("/tmp/x/1"), (), daemon=False, vendor_args=("--vendor", "hygon")),))
    data = host_spec_data(spec)
    assert data["nodes"] == [
        {
            "name": "d",
            "kubeletDir": "/tmp/x/1",
            "nodeArgs": [],
            "daemon": False,
            "vendorArgs": ["--vendor", "hygon"],
        }
    ]
    assert parse_host_spec(data) == spec


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"daemon": "no"}, "s.json: nodes[0].daemon: expected true or false, got 'no'"),
        (
            {"vendorArgs": "--vendor"},
            "s.json: nodes[0].vendorArgs: expected a list of strings, got '--vendor'",
        ),
    ],
)
def test_a_bad_host_spec_vendor_field_is_named(change: Mapping[str, Any], error: str) -> None:
    data = {"nodes": [{"name": "d", "kubeletDir": "/tmp/x/1", **change}]}
    with pytest.raises(ValueError, match="^" + error.replace("[", r"\[").replace("]", r"\]")):
        parse_host_spec(data, "s.json")


def test_the_scheduler_of_a_cluster_with_vendor_nodes_leaves_every_vendors_resources_to_the_extender() -> (
    None
):
    config = parse_configuration(yaml.safe_load(vendor_scheduler_config()), "scheduler-config.yaml")
    (extender,) = config.extenders
    ignored = extender.ignored_resources
    for resource in (
        "nvidia.com/gpu",
        "hygon.com/dcumem",
        "huawei.com/Ascend910B4-memory",
        "cambricon.com/vmlu",
    ):
        assert resource in ignored
    names = [m.name for m in extender.managed_resources]
    assert len(names) == len(set(names))
