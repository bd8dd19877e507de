"""hami_node.nvidia.config: NVIDIA's config file v1 and flags. Transcribed from NVIDIA/k8s-device-plugin
v0.20.0 api/config/v1/{config,flags,replicas,resources}_test.go (each case names its Go test and
sub-case), plus precedence, validateFlags' texts, the line of every error, and properties."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.settings import ConfigError
from hami_node.nvidia.config import (
    ALL_DEVICES,
    AllocationPolicy,
    DeviceIDStrategy,
    DeviceListStrategy,
    FileFlags,
    HamiCoreSummary,
    Imex,
    MigStrategy,
    NvidiaConfig,
    PluginConfig,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
    SharingStrategy,
    check_exclusive_with_hami_core,
    is_gpu_index,
    is_mig_index,
    is_uuid_ref,
    load_config,
    load_config_file,
    parse_config_text,
    pattern_matches,
)

UUID = "4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"


def with_devices(devices: str) -> str:
    return with_resource(f'{{"name": "gpu", "replicas": 2, "devices": {devices}}}')


def devices_of(devices: str) -> ReplicatedDevices:
    return parse_config_text(with_devices(devices)).sharing.time_slicing.resources[0].devices


def with_resource(resource: str) -> str:
    return f'{{"sharing": {{"timeSlicing": {{"resources": [{resource}]}}}}}}'


def load(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, file: str | None = None, **kw: bool
) -> PluginConfig:
    files = {"/etc/nvidia/config.yaml": file} if file is not None else {}

    def read(path: Path) -> str:
        if str(path) not in files:
            raise FileNotFoundError(2, "No such file or directory")
        return files[str(path)]

    args = [*(["--config-file", "/etc/nvidia/config.yaml"] if file is not None else []), *argv]
    return load_config(args, env or {}, read, **kw)


# --- config_test.go ------------------------------------------------------------------------------------


def test_mps_fail_requests_greater_than_one_defaults_to_true() -> None:
    """config_test.go TestNewConfigDefaultsMPSFailRequestsGreaterThanOne."""
    config = load(
        env={"MPS_ROOT": "/run/nvidia/mps"},
        file="version: v1\nsharing:\n  mps:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 2\n",
    )
    assert config.sharing.mps is not None
    assert config.sharing.mps.fail_requests_greater_than_one is True


def test_mps_fail_requests_greater_than_one_explicit_false_is_kept() -> None:
    """config_test.go TestNewConfigHonorsExplicitMPSFailRequestsGreaterThanOneFalse."""
    config = load(
        env={"MPS_ROOT": "/run/nvidia/mps"},
        file="version: v1\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 2\n",
    )
    assert config.sharing.mps is not None
    assert config.sharing.mps.fail_requests_greater_than_one is False


# --- flags_test.go TestUnmarshalFlags --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param("{}", FileFlags(), id="test case 1: {}"),
        pytest.param('{"gfd": {}}', FileFlags(), id="test case 2: gfd {} (dropped by the plugin)"),
        pytest.param('{"gfd": {"sleepInterval": 0}}', FileFlags(), id="test case 3: sleepInterval 0"),
        pytest.param('{"gfd": {"sleepInterval": "0s"}}', FileFlags(), id="test case 4: sleepInterval 0s"),
        pytest.param('{"gfd": {"sleepInterval": 5}}', FileFlags(), id="test case 5: sleepInterval 5"),
        pytest.param('{"gfd": {"sleepInterval": "5s"}}', FileFlags(), id="test case 6: sleepInterval 5s"),
        pytest.param('{"gfd": {"sleepInterval": "infinite"}}', FileFlags(), id="test case 7: infinite"),
        pytest.param(
            '{"plugin": {"deviceListStrategy": "envvar"}}',
            FileFlags(device_list_strategy=("envvar",)),
            id="test case 8: deviceListStrategy string",
        ),
        pytest.param(
            '{"plugin": {"deviceListStrategy": ["envvar", "cdi-annotations"]}}',
            FileFlags(device_list_strategy=("envvar", "cdi-annotations")),
            id="test case 9: deviceListStrategy list",
        ),
    ],
)
def test_flags_unmarshal_as_nvidia_does(flags: str, expected: FileFlags) -> None:
    """flags_test.go TestUnmarshalFlags (test case 0, empty JSON, is a JSON syntax error with no YAML
    equivalent: an empty `flags:` is null, i.e. no flags)."""
    assert parse_config_text(f'{{"flags": {flags}}}').flags == expected


def test_flags_with_a_bad_sleep_interval_are_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r'flags\.gfd\.sleepInterval: time: invalid duration "soon"'):
        parse_config_text('{"flags": {"gfd": {"sleepInterval": "soon"}}}')


def test_a_device_list_strategy_of_another_type_gives_nvidias_error_with_the_raw_value() -> None:
    with pytest.raises(ConfigError, match=r'invalid deviceListStrategy: \{"a":1\}'):
        parse_config_text('{"flags": {"plugin": {"deviceListStrategy": {"a": 1}}}}')


# --- replicas_test.go --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "kind"),
    [
        pytest.param("0", "gpuIndex", id="test case 0"),
        pytest.param("0:0", "migIndex", id="test case 1"),
        pytest.param(f"GPU-{UUID}", "uuid", id="test case 2"),
        pytest.param("MIG-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2", "uuid", id="test case 3"),
        pytest.param("MIG-GPU-662077db-fa3f-0d8f-9502-21ab0ef058a2/10/0", "uuid", id="test case 4"),
    ],
)
def test_replicated_device_ref_is_exactly_one_kind(ref: str, kind: str) -> None:
    """replicas_test.go TestReplicatedDeviceRef."""
    assert (is_gpu_index(ref), is_mig_index(ref), is_uuid_ref(ref)) == (
        kind == "gpuIndex",
        kind == "migIndex",
        kind == "uuid",
    )


@pytest.mark.parametrize(
    ("devices", "document"),
    [
        pytest.param(ALL_DEVICES, "all", id="test case 1: all"),
        pytest.param(ReplicatedDevices(all=False, count=2), 2, id="test case 2: count"),
        pytest.param(
            ReplicatedDevices(all=False, refs=("0", "0:0", f"GPU-{UUID}")),
            ["0", "0:0", f"GPU-{UUID}"],
            id="test case 3: list",
        ),
    ],
)
def test_replicated_devices_marshal_as_nvidia_does(devices: ReplicatedDevices, document: object) -> None:
    """replicas_test.go TestMarshalReplicatedDevices (test case 0, the empty union, cannot be built)."""
    assert devices.to_document() == document


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        pytest.param(
            "null", "devices set as '' but the only valid string input is 'all'", id="test case 0: empty"
        ),
        pytest.param(
            '"not-all"', "devices set as 'not-all' but the only valid string input is 'all'", id="test case 1"
        ),
        pytest.param("-2", "devices set as '-2' but a count of devices must be > 0", id="test case 2"),
        pytest.param("2.0", "unrecognized type for devices spec: 2.0", id="test case 3"),
        pytest.param("[-1]", "unsupported type for device in devices list: , string", id="test case 4"),
        pytest.param('["-1"]', "unsupported type for device in devices list: -1, string", id="test case 5"),
        pytest.param(
            '["invalid-UUID"]', "unsupported type for device in devices list: invalid-UUID", id="test case 6"
        ),
        pytest.param(
            '["GPU-UUID"]', "unsupported type for device in devices list: GPU-UUID", id="test case 7"
        ),
        pytest.param(
            '["MIG-UUID"]', "unsupported type for device in devices list: MIG-UUID", id="test case 8"
        ),
        pytest.param(
            f'["MIG-GPU-{UUID}"]',
            f"unsupported type for device in devices list: MIG-GPU-{UUID}",
            id="test case 9",
        ),
        pytest.param("true", "unrecognized type for devices spec: true", id="a bool"),
    ],
)
def test_bad_replicated_devices_give_nvidias_error_at_the_devices_key(devices: str, message: str) -> None:
    """replicas_test.go TestUnmarshalReplicatedDevices, the error cases."""
    with pytest.raises(ConfigError, match=r"sharing\.timeSlicing\.resources\[0\]\.devices") as err:
        parse_config_text(with_devices(devices))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param('"all"', ALL_DEVICES, id="test case 10"),
        pytest.param("2", ReplicatedDevices(all=False, count=2), id="test case 11"),
        pytest.param("[0]", ReplicatedDevices(all=False, refs=("0",)), id="test case 12"),
        pytest.param('["0"]', ReplicatedDevices(all=False, refs=("0",)), id="test case 13"),
        pytest.param('["0:0"]', ReplicatedDevices(all=False, refs=("0:0",)), id="test case 14"),
        pytest.param(
            f'["GPU-{UUID}"]', ReplicatedDevices(all=False, refs=(f"GPU-{UUID}",)), id="test case 15"
        ),
        pytest.param(
            f'["MIG-{UUID}"]', ReplicatedDevices(all=False, refs=(f"MIG-{UUID}",)), id="test case 16"
        ),
        pytest.param(
            f'["MIG-GPU-{UUID}/0/0"]',
            ReplicatedDevices(all=False, refs=(f"MIG-GPU-{UUID}/0/0",)),
            id="test case 17",
        ),
        pytest.param(
            f'[0, "0:0", "GPU-{UUID}"]',
            ReplicatedDevices(all=False, refs=("0", "0:0", f"GPU-{UUID}")),
            id="test case 18",
        ),
        pytest.param(
            f'["0", "0:0", "GPU-{UUID}"]',
            ReplicatedDevices(all=False, refs=("0", "0:0", f"GPU-{UUID}")),
            id="test case 19",
        ),
    ],
)
def test_good_replicated_devices_parse_as_nvidia_does(devices: str, expected: ReplicatedDevices) -> None:
    """replicas_test.go TestUnmarshalReplicatedDevices, the good cases."""
    assert devices_of(devices) == expected


@pytest.mark.parametrize(
    ("resource", "message"),
    [
        pytest.param("null", "no resource name specified", id="test case 0: empty"),
        pytest.param("{}", "no resource name specified", id="test case 1"),
        pytest.param('{"name": "valid"}', "no replicas specified", id="test case 2"),
        pytest.param('{"name": "valid", "devices": "all"}', "no replicas specified", id="test case 3"),
        pytest.param(
            '{"name": "valid", "devices": "all", "rename": "valid-shared"}',
            "no replicas specified",
            id="test case 4",
        ),
        pytest.param(
            '{"name": "valid", "replicas": -1}', "number of replicas must be >= 2 (got -1)", id="test case 7"
        ),
        pytest.param(
            '{"name": "valid", "replicas": 0}', "number of replicas must be >= 2 (got 0)", id="test case 8"
        ),
        pytest.param(
            '{"name": "$invalid$", "replicas": 2, "rename": "valid-shared"}',
            "incorrect format for resource name 'nvidia.com/$invalid$': [a lowercase RFC 1123 subdomain",
            id="test case 11",
        ),
        pytest.param(
            '{"name": "valid", "replicas": 2, "rename": "$invalid$"}',
            "incorrect format for resource name 'nvidia.com/$invalid$'",
            id="test case 12",
        ),
        pytest.param(
            '{"name": "valid", "replicas": "4"}',
            "json: cannot unmarshal string into sharing.timeSlicing.resources[0].replicas of type int",
            id="replicas as a string",
        ),
        pytest.param(
            '{"name": "' + "a" * 53 + '", "replicas": 2}',
            "fully-qualified resource name must be 63 characters or less: nvidia.com/" + "a" * 53,
            id="a name over 63 characters",
        ),
    ],
)
def test_bad_replicated_resource_gives_nvidias_error(resource: str, message: str) -> None:
    """replicas_test.go TestUnmarshalReplicatedResource, the error cases (Go's trailing commas in cases
    2-8 are JSON errors there; here the same objects without them reach the check each case is about)."""
    with pytest.raises(ConfigError, match=r"sharing\.timeSlicing\.resources\[0\]") as err:
        parse_config_text(with_resource(resource))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        pytest.param(
            '{"name": "valid", "devices": "all", "replicas": 2}',
            ReplicatedResource("nvidia.com/valid", 2),
            id="test case 5",
        ),
        pytest.param(
            '{"name": "valid", "devices": "all", "replicas": 2, "rename": "valid-shared"}',
            ReplicatedResource("nvidia.com/valid", 2, "nvidia.com/valid-shared"),
            id="test case 6",
        ),
        pytest.param(
            '{"name": "valid", "replicas": 2}', ReplicatedResource("nvidia.com/valid", 2), id="test case 9"
        ),
        pytest.param(
            '{"name": "valid", "replicas": 2, "rename": "valid-shared"}',
            ReplicatedResource("nvidia.com/valid", 2, "nvidia.com/valid-shared"),
            id="test case 10",
        ),
        pytest.param(
            '{"name": "nvidia.com/gpu", "replicas": 4}',
            ReplicatedResource("nvidia.com/gpu", 4),
            id="already qualified",
        ),
    ],
)
def test_good_replicated_resource_parses_as_nvidia_does(resource: str, expected: ReplicatedResource) -> None:
    """replicas_test.go TestUnmarshalReplicatedResource, the good cases."""
    assert parse_config_text(with_resource(resource)).sharing.time_slicing.resources == (expected,)


@pytest.mark.parametrize(
    ("time_slicing", "message"),
    [
        pytest.param("null", "no resources specified", id="test case 0: empty"),
        pytest.param("{}", "no resources specified", id="test case 1"),
        pytest.param('{"resources": []}', "no resources specified", id="test case 2"),
        pytest.param(
            '{"resources": [{"name": "$invalid$", "replicas": 2}]}', "incorrect format", id="test case 5"
        ),
    ],
)
def test_bad_replicated_resources_give_nvidias_error(time_slicing: str, message: str) -> None:
    """replicas_test.go TestUnmarshalReplicatedResources, the error cases."""
    with pytest.raises(ConfigError, match=r"sharing\.timeSlicing") as err:
        parse_config_text(f'{{"sharing": {{"timeSlicing": {time_slicing}}}}}')
    assert message in str(err.value)


def test_good_replicated_resources_parse_as_nvidia_does() -> None:
    """replicas_test.go TestUnmarshalReplicatedResources, test cases 3 and 4."""
    one = parse_config_text('{"sharing": {"timeSlicing": {"resources": [{"name": "valid", "replicas": 2}]}}}')
    assert one.sharing.time_slicing == ReplicatedResources((ReplicatedResource("nvidia.com/valid", 2),))
    two = parse_config_text(
        '{"sharing": {"timeSlicing": {"resources": [{"name": "valid1", "replicas": 2}, '
        '{"name": "valid2", "replicas": 2}]}}}'
    )
    assert two.sharing.time_slicing.resources == (
        ReplicatedResource("nvidia.com/valid1", 2),
        ReplicatedResource("nvidia.com/valid2", 2),
    )


def test_rename_by_default_renames_to_dot_shared_unless_renamed() -> None:
    """replicas.go ReplicatedResources.UnmarshalJSON: renameByDefault fills `<name>.shared`."""
    config = parse_config_text(
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 4}\n    - {name: mig-1g.5gb, replicas: 2, rename: mine}\n"
    )
    assert [r.rename for r in config.sharing.time_slicing.resources] == [
        "nvidia.com/gpu.shared",
        "nvidia.com/mine",
    ]


# --- resources_test.go TestResourcePatternMatches ---------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        pytest.param("1g.24gb", "1g.24gb", True, id="exact match"),
        pytest.param("1g.24gb", "2g.48gb", False, id="no match on different string"),
        pytest.param("1g.24gb", "1g.24gb-me", False, id="does not substring match with suffix"),
        pytest.param("1g.24gb", "1g.24gb+me.all", False, id="does not substring match with plus suffix"),
        pytest.param("1g.24gb", "x1g.24gb", False, id="does not substring match with prefix"),
        pytest.param("1g.24gb-me", "1g.24gb-me", True, id="dash-me suffix matches its own pattern"),
        pytest.param(
            "1g.24gb+me.all", "1g.24gb+me.all", True, id="plus-me.all suffix matches its own pattern"
        ),
        pytest.param("*", "1g.24gb-me", True, id="wildcard matches everything"),
        pytest.param("1g.*", "1g.24gb", True, id="wildcard prefix match"),
        pytest.param("1g.*", "2g.48gb", False, id="wildcard prefix does not match different prefix"),
        pytest.param("1g.24gb+gfx", "1g.24gb+gfx", True, id="gfx suffix matches its own pattern"),
        pytest.param("1g.24gb", "1g.24gb+gfx", False, id="base pattern does not match +gfx suffix"),
        pytest.param("1g.24gb+gfx", "1g.24gb", False, id="gfx pattern does not match base"),
        pytest.param("1g.24gb+gfx", "1g.24gb-me", False, id="gfx pattern does not match -me suffix"),
        pytest.param("2g.48gb+gfx", "2g.48gb+gfx", True, id="2g gfx suffix matches its own pattern"),
        pytest.param("2g.48gb", "2g.48gb+gfx", False, id="2g base does not match +gfx suffix"),
        pytest.param("*gb", "1g.24gb", True, id="wildcard suffix match"),
        pytest.param("*gb", "1g.24gb-me", False, id="wildcard suffix does not match -me suffix"),
    ],
)
def test_resource_pattern_matches_the_whole_name(pattern: str, text: str, expected: bool) -> None:
    """resources_test.go TestResourcePatternMatches (v0.20.0: anchored)."""
    assert pattern_matches(pattern, text) is expected


# --- the file: versions, lines, unknown keys ------------------------------------------------------------


def test_an_unknown_version_is_refused_with_nvidias_text_and_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text("flags: {}\nversion: v2\n", "cfg.yaml")
    assert str(err.value) == "cfg.yaml line 2: version: unknown version: v2"


def test_an_empty_version_is_v1() -> None:
    assert parse_config_text('version: ""').version == "v1"


def test_an_error_names_the_file_line_of_the_bad_key() -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 1\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "/etc/nvidia/config.yaml")
    assert str(err.value) == (
        "/etc/nvidia/config.yaml line 6: sharing.timeSlicing.resources[0].replicas: "
        "number of replicas must be >= 2 (got 1)"
    )


def test_malformed_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config_text("version: v1\nflags: [\n", "cfg.yaml")
    assert err.value.line is not None
    assert "is not valid YAML or JSON" in str(err.value)


def test_unknown_keys_are_ignored_with_a_warning_that_suggests_the_key() -> None:
    config = parse_config_text("version: v1\nflags:\n  migStrategi: mixed\n", "cfg.yaml")
    assert config.flags.mig_strategy is None
    assert config.warnings == (
        "cfg.yaml line 3: flags.migStrategi: unknown key, ignored as NVIDIA's plugin ignores it "
        '(did you mean "migStrategy"?)',
    )


def test_struct_keys_match_case_insensitively_as_go_json_does() -> None:
    assert parse_config_text("Flags:\n  MIGStrategy: single\n").flags.mig_strategy == "single"


def test_a_repeated_key_is_refused_with_both_lines() -> None:
    with pytest.raises(ConfigError, match="appears twice"):
        parse_config_text("version: v1\nversion: v1\n")


def test_customised_resources_are_parsed_then_dropped_with_nvidias_warning() -> None:
    config = load(file="resources:\n  gpus:\n  - {pattern: '*', name: gpu}\n")
    assert (
        "Customizing the 'resources' field is not yet supported in the config. Ignoring..." in config.warnings
    )


def test_a_resource_pattern_without_a_name_gives_nvidias_error() -> None:
    with pytest.raises(ConfigError, match="resources must have a 'name' field set"):
        parse_config_text("resources:\n  gpus:\n  - {pattern: '*'}\n")


def test_rename_and_devices_are_reset_with_nvidias_warnings() -> None:
    """DisableResourceNamingInConfig."""
    config = load(
        file="sharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: gpu, replicas: 4, rename: mine, devices: [0]}\n"
    )
    assert config.sharing.time_slicing.resources == (ReplicatedResource("nvidia.com/gpu", 4),)
    assert config.warnings == (
        "Setting the 'rename' field in sharing.timeSlicing.resources is not yet supported in the config. "
        "Ignoring...",
        "Customizing the 'devices' field in sharing.timeSlicing.resources is not yet supported in the "
        "config. Ignoring...",
    )


README_EXAMPLE = """
version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: ["envvar", "cdi-cri"]
    deviceIDStrategy: "uuid"
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
"""


def test_a_users_mixed_time_slicing_file_loads_unchanged() -> None:
    config = load(file=README_EXAMPLE)
    assert config.flags.mig_strategy is MigStrategy.MIXED
    assert config.flags.device_list_strategy == (DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI)
    assert config.sharing.strategy is SharingStrategy.TIME_SLICING
    assert not config.sharing.fails_requests_greater_than_one
    assert [(r.name, r.replicas) for r in config.sharing.time_slicing.resources] == [
        ("nvidia.com/gpu", 4),
        ("nvidia.com/mig-1g.5gb", 2),
    ]
    assert config.warnings == ()


# --- precedence and validateFlags -------------------------------------------------------------------------


def test_defaults_are_nvidias_flag_defaults() -> None:
    flags = load().flags
    assert (
        flags.mig_strategy,
        flags.fail_on_init_error,
        flags.nvidia_driver_root,
        flags.nvidia_dev_root,
    ) == (
        MigStrategy.NONE,
        True,
        "/",
        "/",
    )
    assert flags.device_list_strategy == (DeviceListStrategy.ENVVAR,)
    assert flags.device_id_strategy is DeviceIDStrategy.UUID
    assert flags.shared_devices_allocation_policy is AllocationPolicy.DISTRIBUTED


def test_the_file_wins_over_the_default() -> None:
    assert load(file="flags: {migStrategy: single}").flags.mig_strategy is MigStrategy.SINGLE


def test_the_environment_wins_over_the_file() -> None:
    config = load(env={"MIG_STRATEGY": "mixed"}, file="flags: {migStrategy: single}")
    assert config.flags.mig_strategy is MigStrategy.MIXED


def test_a_flag_wins_over_the_environment_and_the_file() -> None:
    config = load(
        ["--mig-strategy", "none"], env={"MIG_STRATEGY": "mixed"}, file="flags: {migStrategy: single}"
    )
    assert config.flags.mig_strategy is MigStrategy.NONE


def test_an_alias_flag_sets_its_flag() -> None:
    assert load(["--nvidia-driver-root", "/run/nvidia/driver"]).flags.nvidia_dev_root == "/run/nvidia/driver"


def test_device_list_strategy_from_the_environment_is_comma_separated() -> None:
    flags = load(env={"DEVICE_LIST_STRATEGY": "volume-mounts,cdi-annotations"}).flags
    assert flags.device_list_strategy == (
        DeviceListStrategy.VOLUME_MOUNTS,
        DeviceListStrategy.CDI_ANNOTATIONS,
    )


def test_an_unknown_mig_strategy_names_the_file_line() -> None:
    with pytest.raises(ConfigError) as err:
        load(file="version: v1\nflags:\n  migStrategy: both\n")
    assert str(err.value) == (
        "/etc/nvidia/config.yaml line 3: flags.migStrategy: unknown MIG strategy: both "
        "(choose none, single, mixed)"
    )


def test_an_unknown_mig_strategy_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        load(env={"MIG_STRATEGY": "both"})
    assert str(err.value).startswith("environment MIG_STRATEGY: unknown MIG strategy: both")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device-list-strategy", "files"],
            "invalid --device-list-strategy option: invalid strategy: files",
        ),
        (["--device-id-strategy", "name"], "invalid --device-id-strategy option: name"),
        (
            ["--shared-devices-allocation-policy", "spread"],
            "invalid --shared-devices-allocation-policy option: spread",
        ),
        (["--device-discovery-strategy", "pci"], "invalid --device-discovery-strategy option pci"),
        (
            ["--imex-channel-ids", "1"],
            "invalid IMEX channel IDs: invalid IMEX config: channelIDs must be [] or [0]; found [1]",
        ),
    ],
)
def test_validate_flags_refuses_with_nvidias_text_naming_the_flag(argv: list[str], message: str) -> None:
    """cmd/nvidia-device-plugin/main.go validateFlags."""
    with pytest.raises(ConfigError) as err:
        load(argv)
    assert message in str(err.value)
    assert str(err.value).startswith(f"command line {argv[0]}")


def test_cdi_without_nvml_is_refused() -> None:
    with pytest.raises(
        ConfigError, match="CDI --device-list-strategy options are only supported on NVML-based"
    ):
        load(["--device-list-strategy", "cdi-cri"], has_nvml=False)


MPS = "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n"


def test_mps_without_an_mps_root_is_refused() -> None:
    with pytest.raises(ConfigError, match="using MPS requires --mps-root to be specified"):
        load(file=MPS)


def test_mps_with_the_mixed_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="using --mig-strategy=mixed is not supported with MPS"):
        load(["--mig-strategy", "mixed", "--mps-root", "/run/mps"], file=MPS)


def test_a_missing_config_file_gives_nvidias_error() -> None:
    def read(path: Path) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    with pytest.raises(ConfigError, match="error opening config file: No such file or directory"):
        load_config(["--config-file", "/nope.yaml"], {}, read)


def test_load_config_file_reads_a_file_from_disk(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(README_EXAMPLE)
    assert load_config_file(path).flags.mig_strategy == "mixed"


# --- one sharing mode per node ---------------------------------------------------------------------------


def test_time_slicing_with_hami_core_slicing_is_refused_saying_which_to_choose() -> None:
    config = load(file=README_EXAMPLE)
    hami = HamiCoreSummary(slicing_settings={"device_split_count": "flag --device-split-count"})
    with pytest.raises(ConfigError) as err:
        check_exclusive_with_hami_core(config, hami)
    text = str(err.value)
    assert "time-slicing (nvidia.com/gpu x4, nvidia.com/mig-1g.5gb x2)" in text
    assert "device_split_count (flag --device-split-count)" in text
    assert "choose one" in text


def test_a_mig_strategy_with_hamis_dynamic_mig_is_refused() -> None:
    config = load(["--mig-strategy", "single"])
    with pytest.raises(ConfigError, match="HAMi's operating mode mig"):
        check_exclusive_with_hami_core(config, HamiCoreSummary("mig", "nodeconfig[0].operatingmode"))


def test_whole_gpus_beside_hami_settings_are_accepted() -> None:
    check_exclusive_with_hami_core(load(), HamiCoreSummary(slicing_settings={"device_split_count": "x"}))


def test_nvidia_sharing_alone_is_accepted() -> None:
    check_exclusive_with_hami_core(load(file=README_EXAMPLE), HamiCoreSummary())


# --- properties ----------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?", fullmatch=True).filter(
    lambda n: ".." not in n and ".-" not in n and "-." not in n
)
resources = st.builds(
    ReplicatedResource,
    name=names.map(lambda n: f"nvidia.com/{n}"),
    replicas=st.integers(2, 64),
    rename=st.one_of(st.just(""), names.map(lambda n: f"nvidia.com/{n}.shared")),
    devices=st.one_of(
        st.just(ALL_DEVICES),
        st.integers(1, 8).map(lambda n: ReplicatedDevices(all=False, count=n)),
        st.lists(
            st.one_of(st.integers(0, 7).map(str), st.just("0:1"), st.just(f"GPU-{UUID}")), min_size=1
        ).map(lambda refs: ReplicatedDevices(all=False, refs=tuple(refs))),
    ),
)
replicated = st.builds(
    ReplicatedResources,
    resources=st.lists(resources, min_size=1, max_size=3).map(tuple),
    rename_by_default=st.just(False),
    fail_requests_greater_than_one=st.one_of(st.none(), st.booleans()),
)
configs = st.builds(
    NvidiaConfig,
    flags=st.builds(
        FileFlags,
        mig_strategy=st.one_of(st.none(), st.sampled_from(["none", "single", "mixed"])),
        fail_on_init_error=st.one_of(st.none(), st.booleans()),
        device_list_strategy=st.one_of(
            st.none(),
            st.lists(st.sampled_from(list(DeviceListStrategy)), min_size=1).map(
                lambda s: tuple(x.value for x in s)
            ),
        ),
        device_id_strategy=st.one_of(st.none(), st.sampled_from(["uuid", "index"])),
        shared_devices_allocation_policy=st.one_of(st.none(), st.sampled_from(["distributed", "packed"])),
    ),
    sharing=st.builds(Sharing, time_slicing=replicated, mps=st.one_of(st.none(), replicated)),
    imex=st.builds(Imex, channel_ids=st.sampled_from([(), (0,)]), required=st.booleans()),
)


@given(configs, st.booleans())
def test_any_valid_config_round_trips_through_yaml_and_json(config: NvidiaConfig, as_json: bool) -> None:
    import yaml

    document = config.to_document()
    text = json.dumps(document) if as_json else yaml.safe_dump(document)
    back = parse_config_text(text)
    assert (back.version, back.flags, back.sharing, back.imex) == (
        config.version,
        config.flags,
        config.sharing,
        config.imex,
    )


BAD_VALUES: list[tuple[tuple[str | int, ...], object]] = [
    (("flags", "migStrategy"), 3),
    (("flags", "failOnInitError"), "yes please"),
    (("flags", "plugin", "deviceListStrategy"), {"x": 1}),
    (("flags", "plugin", "deviceIDStrategy"), ["uuid"]),
    (("sharing", "timeSlicing", "renameByDefault"), "true"),
    (("sharing", "timeSlicing", "failRequestsGreaterThanOne"), 1),
    (("sharing", "timeSlicing", "resources", 0, "replicas"), 1),
    (("sharing", "timeSlicing", "resources", 0, "replicas"), 2.5),
    (("sharing", "timeSlicing", "resources", 0, "name"), "Not_A_Name"),
    (("sharing", "timeSlicing", "resources", 0, "devices"), "some"),
    (("sharing", "timeSlicing", "resources", 0, "devices"), 0),
    (("imex", "channelIDs"), "0"),
    (("imex", "required"), "no"),
    (("version",), "v0"),
]


@given(st.sampled_from(BAD_VALUES), st.booleans())
def test_any_invalid_field_gives_an_error_naming_it(
    bad: tuple[tuple[str | int, ...], object], as_json: bool
) -> None:
    import yaml

    path, value = bad
    document: dict[str, object] = {
        "version": "v1",
        "flags": {"migStrategy": "none", "plugin": {"deviceIDStrategy": "uuid"}},
        "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
        "imex": {"channelIDs": [], "required": False},
    }
    target: object = document
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    text = json.dumps(document) if as_json else yaml.safe_dump(document)
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "cfg")
    expected_key = ".".join(str(p) for p in path).replace(".0.", "[0].")
    assert err.value.key == expected_key
    assert err.value.line is not None
