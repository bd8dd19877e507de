"""hami-node's NVIDIA modes, without processes: the one loader recognising NVIDIA's config file and
splitting NVIDIA's flags from hami-node's, the refusal of HAMi-core slicing beside NVIDIA's sharing, the
servicer's Allocate from kubelet's IDs (NVIDIA's server.go Allocate / ValidateRequest), and the label
patch."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.config import ConfigError, NodeConfig, load_config, split_nvidia_argv
from hami_node.devices import DeviceState
from hami_node.nvidia.config import MigStrategy, SharingStrategy
from hami_node.nvidia.device_map import NvidiaDevice
from hami_node.nvidia.plugin import NvidiaDevices, NvidiaPluginServicer, label_patch

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""
FILES = {Path("/etc/nvidia.yaml"): TIME_SLICING, Path("/etc/hami.yaml"): "deviceSplitCount: 4\n"}
BASE = ["--node-name", "n1"]


def read(path: Path) -> str:
    return FILES[path]


def test_an_nvidia_config_file_turns_on_nvidias_modes_with_nvidias_flags_and_env() -> None:
    config = load_config(
        [
            *BASE,
            "--config-file",
            "/etc/nvidia.yaml",
            "--fail-on-init-error=false",
            "--device-id-strategy",
            "index",
        ],
        {"MIG_STRATEGY": "mixed"},
        read,
    )
    assert config.nvidia is not None
    assert config.nvidia.flags.mig_strategy is MigStrategy.MIXED
    assert config.nvidia.flags.fail_on_init_error is False
    assert config.nvidia.flags.device_id_strategy.value == "index"
    assert config.nvidia.sharing.strategy is SharingStrategy.TIME_SLICING
    assert config.mig_strategy is MigStrategy.NONE and config.unsupported is None
    assert config.config_file == Path("/etc/nvidia.yaml")


def test_hami_nodes_own_config_file_keeps_hamis_device_plugin() -> None:
    config = load_config([*BASE, "--config-file", "/etc/hami.yaml"], {}, read)
    assert config.nvidia is None and config.device_split_count == 4


def test_an_nvidia_only_flag_without_nvidias_config_file_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"command line --device-id-strategy: is a flag of NVIDIA's"):
        load_config([*BASE, "--device-id-strategy", "index"], {}, read)


def test_hami_core_slicing_beside_time_slicing_is_refused_saying_which_to_choose() -> None:
    with pytest.raises(ConfigError, match=r"choose one: keep NVIDIA's config file and drop HAMi's settings"):
        load_config([*BASE, "--config-file", "/etc/nvidia.yaml", "--device-split-count", "5"], {}, read)


def test_an_unknown_mig_strategy_names_the_flag_and_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_config([*BASE, "--config-file", "/etc/nvidia.yaml", "--mig-strategy", "bogus"], {}, read)
    assert "--mig-strategy" in str(err.value) and "unknown MIG strategy: bogus" in str(err.value)


def test_a_malformed_nvidia_config_file_names_the_file_and_the_key() -> None:
    files = {Path("/etc/bad.yaml"): "version: v1\nsharing:\n  timeSlicing:\n    resources: 3\n"}
    with pytest.raises(ConfigError) as err:
        load_config([*BASE, "--config-file", "/etc/bad.yaml"], {}, files.__getitem__)
    assert "/etc/bad.yaml" in str(err.value) and "resources" in str(err.value)


def test_dra_mode_with_nvidias_config_file_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"one mode per node"):
        load_config([*BASE, "--config-file", "/etc/nvidia.yaml", "--mode", "dra"], {}, read)


@given(
    st.lists(
        st.sampled_from(
            [
                "--node-name",
                "x",
                "--mig-strategy=mixed",
                "--fail-on-init-error",
                "--pass-device-specs",
                "true",
                "--log-level",
                "debug",
            ]
        )
    )
)
def test_splitting_the_command_line_loses_and_invents_no_argument(argv: list[str]) -> None:
    nvidia, shared, rest = split_nvidia_argv(argv)
    assert sorted(nvidia + shared + rest) == sorted(argv)


def _devices() -> NvidiaDevices:
    config = load_config([*BASE, "--config-file", "/etc/nvidia.yaml"], {}, read).nvidia
    assert config is not None
    gpu = NvidiaDevice(uuid="GPU-a", index=0, product_name="Tesla T4", memory_mib=15360)
    return NvidiaDevices(config, [gpu])


def test_allocate_answers_from_kubelets_ids_and_refuses_two_replicas_with_nvidias_text() -> None:
    devices = _devices()
    servicer = NvidiaPluginServicer("nvidia.com/gpu", devices, DeviceState(NodeConfig(node_name="n1")))
    answer = servicer.allocate_container(["GPU-a::1"])
    assert not isinstance(answer, str) and dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    assert servicer.allocate_container(["GPU-a::0", "GPU-a::1"]) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: maximum request size for shared '
        "resources is 1; found 2"
    )
    assert servicer.allocate_container(["GPU-z::0"]) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-z::0'
    )


def test_the_label_patch_sets_changed_labels_removes_stale_gfd_ones_and_keeps_others() -> None:
    current = {
        "nvidia.com/gpu.replicas": "2",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/cuda.driver.major": "550",
        "kubernetes.io/hostname": "n1",
    }
    desired = {"nvidia.com/gpu.replicas": "4"}
    assert label_patch(current, desired) == {"nvidia.com/gpu.replicas": "4", "nvidia.com/mig.strategy": None}
    assert label_patch(desired, desired) == {}
