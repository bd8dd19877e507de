"""hami_node.config for the DRA mode: `--mode` and the DRA settings from every source, and the refusal of a
configuration that asks for both modes (one mode per node), naming the setting and what to choose."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from hami_api.dra import DRIVER
from hami_node.config import (
    DEFAULT_KUBELET_PLUGINS_DIR,
    DEFAULT_KUBELET_REGISTRY_DIR,
    ConfigError,
    DaemonMode,
    NodeConfig,
    TaintEffect,
    build_argument_parser,
    load_config,
)

CONFIG = Path("/etc/hami/node-config.yaml")


def dra_config(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, file: str | None = None
) -> NodeConfig:
    """load_config for node-a, with `file` as the config file when given."""
    args = ["--node-name", "node-a", *argv]
    if file is not None:
        args += ["--config-file", str(CONFIG)]

    def read(path: Path) -> str:
        assert file is not None and path == CONFIG
        return file

    return load_config(args, dict(env or {}), read)


def refusal(argv: Sequence[str] = (), env: Mapping[str, str] | None = None, file: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        dra_config(argv, env, file)
    return str(info.value)


def test_the_default_mode_is_the_device_plugin_with_upstream_dra_defaults() -> None:
    config = dra_config()
    assert config.mode is DaemonMode.DEVICE_PLUGIN
    assert not config.dra
    assert (
        config.kubelet_registry_dir
        == Path(DEFAULT_KUBELET_REGISTRY_DIR)
        == Path("/var/lib/kubelet/plugins_registry")
    )
    assert config.kubelet_plugins_dir == Path(DEFAULT_KUBELET_PLUGINS_DIR) == Path("/var/lib/kubelet/plugins")
    assert config.dra_driver_name == DRIVER
    assert config.dra_taint_effect is TaintEffect.NO_SCHEDULE
    assert config.dra_rolling_update_uid is None


def test_dra_mode_and_its_settings_from_flags() -> None:
    config = dra_config(
        [
            "--mode", "dra",
            "--kubelet-registry-dir", "/k/reg",
            "--kubelet-plugins-dir", "/k/plugins",
            "--dra-driver-name", "gpu.example.com",
            "--dra-taint-effect", "NoExecute",
            "--dra-rolling-update-uid", "0c4b0b9e-1f6c-4f0e-9c0e-2a3b4c5d6e7f",
        ]
    )  # fmt: skip
    assert config.dra
    assert config.kubelet_registry_dir == Path("/k/reg")
    assert config.dra_plugin_dir == Path("/k/plugins/gpu.example.com")
    assert config.dra_driver_name == "gpu.example.com"
    assert config.dra_taint_effect is TaintEffect.NO_EXECUTE
    assert config.dra_rolling_update_uid == "0c4b0b9e-1f6c-4f0e-9c0e-2a3b4c5d6e7f"
    assert config.warnings == ()


def test_dra_mode_from_the_environment_and_the_file_with_a_per_node_override() -> None:
    assert dra_config(env={"HAMI_MODE": "dra", "HAMI_DRA_TAINT_EFFECT": "NoExecute"}).dra
    shared = "mode: device-plugin\nnodeconfig:\n  - name: node-a\n    mode: dra\n  - name: node-b\n"
    assert dra_config(file=shared).mode is DaemonMode.DRA
    assert dra_config(file="mode: dra\nkubeletPluginsDir: /p\n").dra_plugin_dir == Path("/p") / DRIVER


def test_an_empty_rolling_update_uid_means_the_plain_socket_names() -> None:
    assert dra_config(["--mode", "dra"], {"HAMI_DRA_ROLLING_UPDATE_UID": ""}).dra_rolling_update_uid is None


@pytest.mark.parametrize("mode", ["both", "device-plugin,dra", "dra,device-plugin", "all"])
def test_a_mode_naming_both_is_refused_saying_to_choose_one(mode: str) -> None:
    message = refusal(["--mode", mode])
    assert message.startswith("command line --mode: expected one of device-plugin, dra: one mode per node")
    assert "choose device-plugin" in message and f'got "{mode}"' in message


def test_an_unknown_mode_is_refused_with_the_choices() -> None:
    assert refusal(env={"HAMI_MODE": "csi"}) == (
        'environment HAMI_MODE: expected one of device-plugin, dra, got "csi"'
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--resource-name", "nvidia.com/gpu"], "flag --resource-name"),
        (["--socket-name", "x.sock"], "flag --socket-name"),
        (["--device-list-strategy", "cdi-cri"], "flag --device-list-strategy"),
        (["--cdi-annotation-prefix", "cdi.k8s.io/"], "flag --cdi-annotation-prefix"),
    ],
)
def test_device_plugin_flags_with_dra_mode_ask_for_both_and_are_refused(argv: list[str], named: str) -> None:
    message = refusal(["--mode", "dra", *argv])
    assert message.startswith(f"configuration: {named} configures the device plugin, but the mode is dra")
    assert "one mode per node" in message
    assert "choose --mode device-plugin" in message and f"or drop {argv[0]}" in message


def test_a_device_plugin_variable_with_dra_mode_is_refused_too() -> None:
    message = refusal(env={"HAMI_MODE": "dra", "HAMI_RESOURCE_NAME": "nvidia.com/gpu"})
    assert message.startswith("configuration: environment HAMI_RESOURCE_NAME configures the device plugin")
    assert "(environment HAMI_MODE)" in message


def test_device_plugin_keys_of_a_shared_file_only_warn_in_dra_mode() -> None:
    config = dra_config(["--mode", "dra"], file="resourceName: nvidia.com/gpu\ndeviceSplitCount: 4\n")
    assert config.dra
    assert config.warnings == (
        f"{CONFIG} line 1: resourceName: no effect, since the mode is dra (flag --mode)",
        f"{CONFIG} line 2: deviceSplitCount: no effect, since the mode is dra (flag --mode)",
    )


def test_device_plugin_settings_at_their_defaults_do_not_warn_in_dra_mode() -> None:
    assert dra_config(["--mode", "dra"], file="deviceSplitCount: 10\ndeviceCoreScaling: 1\n").warnings == ()


@pytest.mark.parametrize(
    "argv",
    [
        ["--dra-driver-name", "gpu.example.com"],
        ["--kubelet-registry-dir", "/k/reg"],
        ["--kubelet-plugins-dir", "/k/plugins"],
        ["--dra-taint-effect", "NoExecute"],
        ["--dra-rolling-update-uid", "abc"],
    ],
)
def test_dra_flags_without_dra_mode_are_refused_saying_to_pass_mode_dra(argv: list[str]) -> None:
    message = refusal(argv)
    assert message.startswith(f"configuration: flag {argv[0]} only applies in DRA mode, but the mode is")
    assert "(the default of --mode)" in message and "pass --mode dra" in message


def test_dra_keys_of_a_shared_file_only_warn_in_device_plugin_mode() -> None:
    config = dra_config(file="draTaintEffect: NoExecute\n")
    where = f"{CONFIG} line 1: draTaintEffect"
    assert config.warnings == (
        f"{where}: no effect, since the mode is device-plugin (the default of --mode)",
    )


def test_operating_mode_mps_is_refused_in_dra_mode() -> None:
    message = refusal(["--mode", "dra", "--operating-mode", "mps", "--mps-root", "/run/mps"])
    assert message.startswith("configuration: operating mode mps (flag --operating-mode) is served by the")
    assert "choose operating mode hami-core for DRA, or --mode device-plugin" in message


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dra-driver-name", "Not_A_Domain"], "a driver name (a lowercase DNS subdomain of at most 63"),
        (["--dra-driver-name", "a" * 64], "a driver name (a lowercase DNS subdomain of at most 63"),
        (["--dra-taint-effect", "PreferNoSchedule"], "one of NoSchedule, NoExecute"),
        (["--dra-rolling-update-uid", "../x"], "a pod UID (letters, digits and -)"),
    ],
)
def test_bad_dra_values_name_the_flag_and_what_is_expected(argv: list[str], expected: str) -> None:
    message = refusal(["--mode", "dra", *argv])
    assert message.startswith(f"command line {argv[0]}: expected {expected}")


def test_help_lists_the_mode_and_the_dra_settings() -> None:
    text = build_argument_parser().format_help()
    for flag in (
        "--mode",
        "--kubelet-registry-dir",
        "--kubelet-plugins-dir",
        "--dra-driver-name",
        "--dra-taint-effect",
    ):
        assert flag in text
    assert "HAMI_MODE" in text
