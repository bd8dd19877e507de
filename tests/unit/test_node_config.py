"""hami_node.config: sources and precedence, HAMi's nodeconfig merge, NVIDIA's healthcheck variables, and an
error naming source, key, value (and file line) for every bad setting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_node.config import (
    DEFAULT_IGNORED_XIDS,
    ConfigError,
    DeviceListStrategy,
    FilterDevices,
    HealthBind,
    HealthChecks,
    HelpRequested,
    MigStrategy,
    NodeConfig,
    OperatingMode,
    XidList,
    build_argument_parser,
    load_config,
)
from hami_node.gpu.select import GPUBackendKind

CONFIG = Path("/etc/hami/node-config.yaml")


def load(
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    node: str | None = "node-a",
) -> NodeConfig:
    """load_config with an in-memory file system; --node-name node-a unless told otherwise."""
    store = dict(files or {})

    def read(path: Path) -> str:
        if str(path) not in store:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return store[str(path)]

    args = [*argv] if node is None else ["--node-name", node, *argv]
    return load_config(args, dict(env or {}), read)


def load_file(text: str, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> NodeConfig:
    return load(["--config-file", str(CONFIG), *argv], env, {str(CONFIG): text})


def file_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_file(text)
    return str(info.value)


# --- defaults and sources --------------------------------------------------------------------------------


def test_defaults() -> None:
    config = load()
    assert config == NodeConfig(node_name="node-a")
    assert config.device_split_count == 10
    assert config.device_memory_scaling == 1.0
    assert config.device_cores_scaling == 1.0
    assert config.preconfigured_device_memory == 0
    assert config.enable_numa_topology is False
    assert config.lib_cuda_log_level == 1
    assert config.disable_core_limit is False
    assert config.operating_mode is OperatingMode.HAMI_CORE
    assert config.mig_strategy is MigStrategy.NONE
    assert config.device_list_strategy == (DeviceListStrategy.ENVVAR,)
    assert config.cdi_annotation_prefix == "cdi.k8s.io/"
    assert config.hook_path == "/usr/local"
    assert config.kubelet_dir == Path("/var/lib/kubelet/device-plugins/")
    assert config.resource_name == "nvidia.com/gpu"
    assert config.socket_name == "hami-nvidia-gpu.sock"
    assert config.socket_path == Path("/var/lib/kubelet/device-plugins/hami-nvidia-gpu.sock")
    assert config.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert config.gpu_backend is GPUBackendKind.NVML
    assert config.fake_inventory is None and config.kubeconfig is None and config.config_file is None
    assert config.health_recovery_seconds == 60
    assert config.register_interval_seconds == 30
    assert config.allocate_wait_seconds == 5
    assert config.filter_devices == FilterDevices()
    assert config.health_checks.ignored_xids == {13, 31, 43, 45, 68, 109}


def test_every_setting_from_flags() -> None:
    config = load(
        [
            "--device-split-count", "4", "--device-memory-scaling", "1.5", "--device-cores-scaling", "2",
            "--preconfigured-device-memory", "65536", "--enable-numa-topology", "--libcuda-log-level", "3",
            "--disable-core-limit=true", "--operating-mode", "mps", "--mig-strategy", "mixed",
            "--enable-get-preferred-allocation", "--filter-devices", "GPU-x,2",
            "--device-list-strategy", "volume-mounts", "--cdi-annotation-prefix", "cdi.example.com/",
            "--hook-path", "/opt/hami/", "--kubelet-dir", "/tmp/kubelet", "--resource-name", "hami.io/gpu",
            "--socket-name", "x.sock", "--gpu-backend", "fake", "--fake-inventory", "/tmp/inv.yaml",
            "--kubeconfig", "/tmp/kc", "--health-recovery-seconds", "0", "--register-interval-seconds",
            "0.5", "--allocate-wait-seconds", "2", "--disable-healthchecks", "79",
            "--enable-healthchecks", "13", "--mps-root", "/run/nvidia/mps/", "--cdi-spec-dir", "/etc/cdi",
        ]
    )  # fmt: skip
    assert config == NodeConfig(
        node_name="node-a",
        device_split_count=4,
        device_memory_scaling=1.5,
        device_cores_scaling=2.0,
        preconfigured_device_memory=65536,
        enable_numa_topology=True,
        lib_cuda_log_level=3,
        disable_core_limit=True,
        operating_mode=OperatingMode.MPS,
        mig_strategy=MigStrategy.MIXED,
        enable_get_preferred_allocation=True,
        filter_devices=FilterDevices(("GPU-x",), (2,)),
        device_list_strategy=(DeviceListStrategy.VOLUME_MOUNTS,),
        cdi_annotation_prefix="cdi.example.com/",
        hook_path="/opt/hami",
        kubelet_dir=Path("/tmp/kubelet"),
        resource_name="hami.io/gpu",
        socket_name="x.sock",
        gpu_backend=GPUBackendKind.FAKE,
        fake_inventory=Path("/tmp/inv.yaml"),
        kubeconfig=Path("/tmp/kc"),
        health_recovery_seconds=0.0,
        register_interval_seconds=0.5,
        allocate_wait_seconds=2.0,
        health_checks=HealthChecks(XidList(xids=frozenset({79})), XidList(xids=frozenset({13}))),
        mps_root="/run/nvidia/mps",
        cdi_spec_dir=Path("/etc/cdi"),
        warnings=(
            "flag --cdi-annotation-prefix: the CDI annotation prefix has no effect, since the device-list "
            "strategy does not include cdi-annotations",
            "flag --enable-get-preferred-allocation: HAMi's switch between answering Allocate with the "
            "annotation's GPUs and with kubelet's has no effect: hami-node always steers kubelet with "
            "GetPreferredAllocation and answers with the GPUs kubelet records, refusing a disagreement "
            "with the scheduler",
        ),
    )
    assert config.oversubscribed


def test_every_setting_from_environment() -> None:
    env = {
        "NODE_NAME": "node-b",
        "DEVICE_SPLIT_COUNT": "5",
        "DEVICE_MEMORY_SCALING": "0.9",
        "DEVICE_CORES_SCALING": "1.5",
        "HAMI_PRECONFIGURED_DEVICE_MEMORY": "1024",
        "HAMI_ENABLE_NUMA_TOPOLOGY": "true",
        "HAMI_LIBCUDA_LOG_LEVEL": "0",
        "DISABLE_CORE_LIMIT": "1",
        "HAMI_OPERATING_MODE": "mig",
        "MIG_STRATEGY": "single",
        "HAMI_ENABLE_GET_PREFERRED_ALLOCATION": "True",
        "HAMI_FILTER_DEVICES": "0, GPU-y",
        "DEVICE_LIST_STRATEGY": "envvar,cdi-cri",
        "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/",
        "HOOK_PATH": "/usr/local",
        "HAMI_KUBELET_DIR": "/k",
        "HAMI_RESOURCE_NAME": "nvidia.com/vgpu",
        "HAMI_SOCKET_NAME": "s.sock",
        "HAMI_GPU_BACKEND": "fake",
        "HAMI_FAKE_INVENTORY": "/inv.json",
        "KUBECONFIG": "/kc",
        "HAMI_HEALTH_RECOVERY_SECONDS": "10",
        "HAMI_REGISTER_INTERVAL_SECONDS": "1",
        "HAMI_ALLOCATE_WAIT_SECONDS": "0",
        "DP_DISABLE_HEALTHCHECKS": "all",
        "DP_ENABLE_HEALTHCHECKS": "79",
        "HAMI_CDI_SPEC_DIR": "/run/cdi",
    }
    config = load(env=env, node=None)
    assert config.cdi_spec_dir == Path("/run/cdi")
    assert config.node_name == "node-b"
    assert config.device_split_count == 5
    assert config.device_memory_scaling == 0.9 and not config.oversubscribed
    assert config.device_cores_scaling == 1.5
    assert config.preconfigured_device_memory == 1024
    assert config.enable_numa_topology is True
    assert config.lib_cuda_log_level == 0
    assert config.disable_core_limit is True
    assert config.operating_mode is OperatingMode.MIG
    assert config.mig_strategy is MigStrategy.SINGLE
    assert config.enable_get_preferred_allocation is True
    assert config.filter_devices == FilterDevices(("GPU-y",), (0,))
    assert config.device_list_strategy == (DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI)
    assert config.kubelet_dir == Path("/k")
    assert config.resource_name == "nvidia.com/vgpu"
    assert config.socket_path == Path("/k/s.sock")
    assert config.gpu_backend is GPUBackendKind.FAKE and config.fake_inventory == Path("/inv.json")
    assert config.kubeconfig == Path("/kc")
    assert config.health_recovery_seconds == 10
    assert config.register_interval_seconds == 1
    assert config.allocate_wait_seconds == 0
    assert config.health_checks == HealthChecks(XidList(all=True), XidList(xids=frozenset({79})))


def test_every_setting_from_the_file() -> None:
    config = load_file(
        """
nodeName: node-a
deviceSplitCount: 3
deviceMemoryScaling: 2
deviceCoreScaling: 0.5
preConfiguredDeviceMemory: 100
enableNumaTopology: yes
libCudaLogLevel: "4"
disableCoreLimit: false
operatingMode: hami-core
migStrategy: none
enableGetPreferredAllocation: false
filterDevices: {uuid: [GPU-z], index: [1, 3]}
deviceListStrategy: [cdi-annotations, cdi-cri]
cdiAnnotationPrefix: cdi.k8s.io/
hookPath: /usr/local/
kubeletDir: /var/lib/kubelet/device-plugins
resourceName: nvidia.com/gpu
socketName: hami.sock
gpuBackend: fake
fakeInventory: inventory.yaml
kubeconfig: /root/.kube/config
healthRecoverySeconds: 120
registerIntervalSeconds: 15
allocateWaitSeconds: 7.5
disableHealthchecks: [48, 79]
enableHealthchecks: "31"
""",
        argv=(),
    )
    assert config.device_split_count == 3
    assert config.device_memory_scaling == 2.0
    assert config.device_cores_scaling == 0.5
    assert config.preconfigured_device_memory == 100
    assert config.enable_numa_topology is True
    assert config.lib_cuda_log_level == 4
    assert config.filter_devices == FilterDevices(("GPU-z",), (1, 3))
    assert config.device_list_strategy == (DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI)
    assert config.hook_path == "/usr/local"
    assert config.socket_name == "hami.sock"
    # relative paths in the file are relative to the file's directory
    assert config.fake_inventory == Path("/etc/hami/inventory.yaml")
    assert config.kubeconfig == Path("/root/.kube/config")
    assert config.config_file == CONFIG
    assert config.health_recovery_seconds == 120
    assert config.register_interval_seconds == 15
    assert config.allocate_wait_seconds == 7.5
    assert config.health_checks.acts_on(31) and not config.health_checks.acts_on(79)
    assert not config.health_checks.acts_on(48) and config.health_checks.acts_on(94)


@pytest.mark.parametrize(
    ("flag", "env", "file", "expected"),
    [
        (None, None, None, 10),
        (None, None, "7", 7),
        (None, "6", "7", 6),
        ("5", "6", "7", 5),
        ("5", None, "7", 5),
        ("5", None, None, 5),
    ],
)
def test_precedence_flags_env_file_defaults(
    flag: str | None, env: str | None, file: str | None, expected: int
) -> None:
    argv = ["--device-split-count", flag] if flag else []
    environ = {"DEVICE_SPLIT_COUNT": env} if env else {}
    text = f"deviceSplitCount: {file}\n" if file else "{}\n"
    assert load_file(text, argv, environ).device_split_count == expected


def test_precedence_for_paths_strings_and_lists() -> None:
    text = "hookPath: /from/file\ndeviceListStrategy: cdi-cri\nnodeName: node-file\n"
    config = load_file(text, env={"HOOK_PATH": "/from/env", "DEVICE_LIST_STRATEGY": "volume-mounts"})
    assert config.hook_path == "/from/env"
    assert config.device_list_strategy == (DeviceListStrategy.VOLUME_MOUNTS,)
    assert config.node_name == "node-a"  # the flag beats the file's nodeName
    config = load_file(text, argv=["--hook-path", "/from/flag", "--device-list-strategy", "envvar"])
    assert config.hook_path == "/from/flag"
    assert config.device_list_strategy == (DeviceListStrategy.ENVVAR,)


def test_node_name_from_the_file_and_missing() -> None:
    config = load(["--config-file", str(CONFIG)], files={str(CONFIG): "nodeName: node-c\n"}, node=None)
    assert config.node_name == "node-c"
    with pytest.raises(ConfigError) as info:
        load(node=None)
    assert str(info.value) == (
        "configuration: this node's name is not set: pass --node-name or set NODE_NAME "
        "(or nodeName in the file)"
    )


def test_config_file_from_environment_and_empty_variables_are_unset() -> None:
    config = load(
        env={"CONFIG_FILE": str(CONFIG), "DEVICE_SPLIT_COUNT": "", "HOOK_PATH": "  "},
        files={str(CONFIG): "deviceSplitCount: 2\n"},
    )
    assert config.device_split_count == 2
    assert config.hook_path == "/usr/local"
    assert config.config_file == CONFIG


def test_empty_file_and_json_file() -> None:
    assert load_file("") == NodeConfig("node-a", config_file=CONFIG)
    assert load_file("null\n") == NodeConfig("node-a", config_file=CONFIG)  # YAML's empty document
    assert load_file('{"deviceSplitCount": 20, "hookPath": "/h"}').device_split_count == 20


def test_boolean_flags_take_an_optional_value() -> None:
    assert load(["--enable-numa-topology"]).enable_numa_topology is True
    assert (
        load(["--enable-numa-topology=false"], {"HAMI_ENABLE_NUMA_TOPOLOGY": "true"}).enable_numa_topology
        is False
    )
    assert load(["--disable-core-limit", "F"]).disable_core_limit is False


def test_device_list_strategy_forms() -> None:
    assert load(
        ["--device-list-strategy", "envvar", "--device-list-strategy", "cdi-cri"]
    ).device_list_strategy == (
        DeviceListStrategy.ENVVAR,
        DeviceListStrategy.CDI_CRI,
    )
    assert load(env={"DEVICE_LIST_STRATEGY": "cdi-cri, envvar,cdi-cri"}).device_list_strategy == (
        DeviceListStrategy.CDI_CRI,
        DeviceListStrategy.ENVVAR,
    )
    assert load_file("deviceListStrategy: volume-mounts").device_list_strategy == (
        DeviceListStrategy.VOLUME_MOUNTS,
    )


# --- HAMi's nodeconfig ------------------------------------------------------------------------------------

NODECONFIG = """\
deviceSplitCount: 4
mpsRoot: /run/nvidia/mps
deviceMemoryScaling: 1
nodeconfig:
  - name: node-b
    devicesplitcount: 20
  - name: node-a
    operatingmode: mps
    devicesplitcount: 8
    devicememoryscaling: 1.8
    devicecorescaling: 2
    preconfigureddevicememory: 4096
    enablenumatopology: true
    libcudaloglevel: "3"
    migstrategy: mixed
    filterdevices:
      uuid: [GPU-aaa]
      index: [0]
    enablegetpreferredallocation: true
"""


def test_nodeconfig_entry_for_this_node_is_merged_over_the_file() -> None:
    config = load_file(NODECONFIG)
    assert config.operating_mode is OperatingMode.MPS
    assert config.device_split_count == 8
    assert config.device_memory_scaling == 1.8
    assert config.device_cores_scaling == 2.0
    assert config.preconfigured_device_memory == 4096
    assert config.enable_numa_topology is True
    assert config.lib_cuda_log_level == 3
    assert config.mig_strategy is MigStrategy.MIXED
    assert config.filter_devices == FilterDevices(("GPU-aaa",), (0,))
    assert config.filter_devices.excludes("GPU-aaa") and config.filter_devices.excludes("GPU-b", 0)
    assert not config.filter_devices.excludes("GPU-b", 1)
    assert config.enable_get_preferred_allocation is True


def test_nodeconfig_of_other_nodes_is_not_applied() -> None:
    config = load(["--config-file", str(CONFIG)], files={str(CONFIG): NODECONFIG}, node="node-c")
    assert config.device_split_count == 4
    assert config.operating_mode is OperatingMode.HAMI_CORE
    assert (
        load(
            ["--config-file", str(CONFIG)], files={str(CONFIG): NODECONFIG}, node="node-b"
        ).device_split_count
        == 20
    )


def test_environment_and_flags_beat_the_nodeconfig_entry() -> None:
    assert load_file(NODECONFIG, env={"DEVICE_SPLIT_COUNT": "2"}).device_split_count == 2
    assert load_file(NODECONFIG, argv=["--device-split-count", "1"]).device_split_count == 1


def test_hami_config_json_as_shipped() -> None:
    text = (
        '{"nodeconfig": [{"name": "node-a", "operatingmode": "hami-core", "devicememoryscaling": 1.8, '
        '"devicesplitcount": 10, "migstrategy": "none", "filterdevices": {"uuid": [], "index": []}}]}'
    )
    config = load_file(text)
    assert config.device_memory_scaling == 1.8
    assert config.filter_devices == FilterDevices()


# --- errors: the source, the key, the value, and the line -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nodeconfig:\n  - name: node-x\n    devicesplitcount: 2\n  - name: node-a\n"
            "    devicememoryscaling: 1\n\n    devicesplitcount: ten\n",
            'node-config.yaml line 7: nodeconfig[1].devicesplitcount: expected an integer >= 1, got "ten"',
        ),
        ("deviceSplitCount: 0\n", "line 1: deviceSplitCount: expected an integer >= 1, got 0"),
        ("\n\ndeviceSplitCount: 2.5\n", "line 3: deviceSplitCount: expected an integer >= 1, got 2.5"),
        ("deviceSplitCount: true\n", "line 1: deviceSplitCount: expected an integer >= 1, got true"),
        ("deviceMemoryScaling: 0\n", "line 1: deviceMemoryScaling: expected a number > 0, got 0"),
        ("deviceMemoryScaling: -1\n", "line 1: deviceMemoryScaling: expected a number > 0, got -1"),
        ("deviceMemoryScaling: .nan\n", "line 1: deviceMemoryScaling: expected a number > 0, got nan"),
        ("deviceCoreScaling: lots\n", 'line 1: deviceCoreScaling: expected a number > 0, got "lots"'),
        (
            "preConfiguredDeviceMemory: -5\n",
            "line 1: preConfiguredDeviceMemory: expected an integer >= 0, got -5",
        ),
        ("enableNumaTopology: maybe\n", 'line 1: enableNumaTopology: expected true or false, got "maybe"'),
        ("libCudaLogLevel: 5\n", "line 1: libCudaLogLevel: expected an integer from 0 to 4, got 5"),
        ("disableCoreLimit: null\n", "line 1: disableCoreLimit: expected true or false, got null"),
        ("operatingMode: vgpu\n", 'line 1: operatingMode: expected one of hami-core, mig, mps, got "vgpu"'),
        ("migStrategy: all\n", 'line 1: migStrategy: expected one of none, single, mixed, got "all"'),
        (
            "deviceListStrategy: [envvar, cdi]\n",
            "line 1: deviceListStrategy: expected one or more of envvar, volume-mounts, cdi-annotations, "
            'cdi-cri (a list or a comma-separated string), got ["envvar", "cdi"]',
        ),
        (
            "deviceListStrategy: []\n",
            "line 1: deviceListStrategy: expected one or more of envvar, volume-mounts, cdi-annotations, "
            "cdi-cri (a list or a comma-separated string), got []",
        ),
        (
            "cdiAnnotationPrefix: cdi.k8s.io\n",
            "line 1: cdiAnnotationPrefix: expected an annotation key prefix such as cdi.k8s.io/, "
            'got "cdi.k8s.io"',
        ),
        ("hookPath: usr/local\n", 'line 1: hookPath: expected an absolute path, got "usr/local"'),
        ("kubeletDir: ''\n", 'line 1: kubeletDir: expected a path, got ""'),
        (
            "resourceName: gpu\n",
            'line 1: resourceName: expected an extended resource name such as nvidia.com/gpu, got "gpu"',
        ),
        (
            "resourceName: kubernetes.io/gpu\n",
            "line 1: resourceName: expected an extended resource name outside kubernetes.io, such as "
            'nvidia.com/gpu, got "kubernetes.io/gpu"',
        ),
        ("socketName: a/b.sock\n", "line 1: socketName: expected a file name without '/', got \"a/b.sock\""),
        ("gpuBackend: cuda\n", 'line 1: gpuBackend: expected one of nvml, fake, got "cuda"'),
        ("healthRecoverySeconds: -1\n", "line 1: healthRecoverySeconds: expected a number >= 0, got -1"),
        ("registerIntervalSeconds: 0\n", "line 1: registerIntervalSeconds: expected a number > 0, got 0"),
        ("allocateWaitSeconds: soon\n", 'line 1: allocateWaitSeconds: expected a number >= 0, got "soon"'),
        (
            "disableHealthchecks: 13,x\n",
            "line 1: disableHealthchecks: expected all, xids, or a comma-separated list of Xid numbers, "
            'got "13,x"',
        ),
        (
            "filterDevices: {uuids: [a]}\n",
            "line 1: filterDevices: expected GPU UUIDs and indexes: {uuid: [...], index: [...]} or a "
            'comma-separated list, got {"uuids": ["a"]}',
        ),
        (
            "nodeName: Node_A\n",
            'line 1: nodeName: expected a node name (a lowercase DNS subdomain), got "Node_A"',
        ),
        ("devicesplitcount: 3\n", 'line 1: devicesplitcount: unknown key (did you mean "deviceSplitCount"?)'),
        ("deviceSplitCont: 3\n", 'line 1: deviceSplitCont: unknown key (did you mean "deviceSplitCount"?)'),
        ("colour: blue\n", "line 1: colour: unknown key"),
        (
            "deviceSplitCount: 2\ndeviceSplitCount: 3\n",
            "line 2: deviceSplitCount: appears twice (also on line 1)",
        ),
        ("- 1\n- 2\n", "line 1: expected a mapping of settings (deviceSplitCount: 10, ...), got [1, 2]"),
        (
            "nodeconfig: {name: node-a}\n",
            'line 1: nodeconfig: expected a list of per-node entries, got {"name": "node-a"}',
        ),
        (
            "nodeconfig:\n  - devicesplitcount: 2\n",
            "line 2: nodeconfig[0]: has no name (the node it applies to)",
        ),
        ("nodeconfig:\n  - node-a\n", 'line 2: nodeconfig[0]: expected a mapping with a name, got "node-a"'),
        (
            "nodeconfig:\n  - name: 7\n",
            "line 2: nodeconfig[0].name: expected a node name (a lowercase DNS subdomain), got 7",
        ),
        (
            "nodeconfig:\n  - name: node-a\n  - name: node-a\n",
            'line 3: nodeconfig[1].name: "node-a" is already configured by nodeconfig[0]',
        ),
        (
            "nodeconfig:\n  - name: node-a\n    devicesplitcnt: 2\n",
            'line 3: nodeconfig[0].devicesplitcnt: unknown nodeconfig key (did you mean "devicesplitcount"?)',
        ),
        (
            "nodeconfig:\n  - name: node-a\n    deviceSplitCount: 2\n",
            "line 3: nodeconfig[0].deviceSplitCount: unknown nodeconfig key "
            '(did you mean "devicesplitcount"?)',
        ),
        (
            "nodeconfig:\n- name: node-a\n  filterdevices:\n    uuid: [GPU-a]\n    index: [x]\n",
            "line 3: nodeconfig[0].filterdevices: expected GPU UUIDs and indexes: "
            '{uuid: [...], index: [...]} or a comma-separated list, got {"uuid": ["GPU-a"], "index": ["x"]}',
        ),
        (
            "nodeconfig:\n- name: node-a\n  operatingmode: core\n",
            'line 3: nodeconfig[0].operatingmode: expected one of hami-core, mig, mps, got "core"',
        ),
        (
            "nodeconfig:\n- name: node-a\n  enablenumatopology: 2\n",
            "line 3: nodeconfig[0].enablenumatopology: expected true or false, got 2",
        ),
        (
            "nodeconfig:\n- name: node-a\n  libcudaloglevel: debug\n",
            'line 3: nodeconfig[0].libcudaloglevel: expected an integer from 0 to 4, got "debug"',
        ),
    ],
)
def test_file_errors_name_file_line_key_and_value(text: str, message: str) -> None:
    error = file_error(text)
    assert error.startswith(str(CONFIG) + " ")
    assert error.endswith(message)


def test_file_error_attributes() -> None:
    with pytest.raises(ConfigError) as info:
        load_file("nodeconfig:\n  - name: node-z\n    devicesplitcount: ten\n")
    err = info.value
    assert (err.source, err.key, err.line, err.value) == (
        str(CONFIG),
        "nodeconfig[0].devicesplitcount",
        3,
        '"ten"',
    )
    assert err.reason == 'expected an integer >= 1, got "ten"'


def test_every_nodeconfig_entry_is_validated_not_only_this_nodes() -> None:
    error = file_error("nodeconfig:\n- name: node-a\n- name: node-z\n  devicememoryscaling: zero\n")
    assert error.endswith('line 4: nodeconfig[1].devicememoryscaling: expected a number > 0, got "zero"')


def test_syntax_errors_give_the_line() -> None:
    error = file_error("deviceSplitCount: 2\nhookPath: [unclosed\n")
    assert error.startswith(f"{CONFIG} line 3: is not valid YAML or JSON")
    error = file_error('{"deviceSplitCount": 2,\n "hookPath" "/x"}')
    assert error.startswith(f"{CONFIG} line 2: is not valid YAML or JSON")


def test_unreadable_file() -> None:
    with pytest.raises(ConfigError) as info:
        load(["--config-file", "/nope.yaml"])
    assert str(info.value) == "/nope.yaml: cannot be read: No such file or directory"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            (),
            {"DEVICE_SPLIT_COUNT": "ten"},
            'environment DEVICE_SPLIT_COUNT: expected an integer >= 1, got "ten"',
        ),
        (
            (),
            {"DEVICE_MEMORY_SCALING": "inf"},
            'environment DEVICE_MEMORY_SCALING: expected a number > 0, got "inf"',
        ),
        (
            (),
            {"HAMI_ENABLE_NUMA_TOPOLOGY": "on"},
            'environment HAMI_ENABLE_NUMA_TOPOLOGY: expected true or false, got "on"',
        ),
        ((), {"HOOK_PATH": "local"}, 'environment HOOK_PATH: expected an absolute path, got "local"'),
        (
            (),
            {"NODE_NAME": "Bad Name"},
            'environment NODE_NAME: expected a node name (a lowercase DNS subdomain), got "Bad Name"',
        ),
        (
            (),
            {"DP_DISABLE_HEALTHCHECKS": "-68"},
            "environment DP_DISABLE_HEALTHCHECKS: expected all, xids, or a comma-separated list of Xid "
            'numbers, got "-68"',
        ),
        (
            (),
            {"DEVICE_LIST_STRATEGY": "envvar,nope"},
            "environment DEVICE_LIST_STRATEGY: expected one or more of envvar, volume-mounts, "
            'cdi-annotations, cdi-cri (a list or a comma-separated string), got "envvar,nope"',
        ),
        (
            ("--device-split-count", "ten"),
            {},
            'command line --device-split-count: expected an integer >= 1, got "ten"',
        ),
        (
            ("--libcuda-log-level", "-1"),
            {},
            'command line --libcuda-log-level: expected an integer from 0 to 4, got "-1"',
        ),
        (("--gpu-backend", "cuda"), {}, 'command line --gpu-backend: expected one of nvml, fake, got "cuda"'),
        (
            ("--device-list-strategy", "envvar", "--device-list-strategy", "x"),
            {},
            "command line --device-list-strategy: expected one or more of envvar, volume-mounts, "
            'cdi-annotations, cdi-cri (a list or a comma-separated string), got "envvar,x"',
        ),
        (("--bogus",), {}, "command line: unrecognized arguments: --bogus"),
        (("--device-split",), {}, "command line: unrecognized arguments: --device-split"),
        (("--device-split-count",), {}, "command line: argument --device-split-count: expected one argument"),
        (
            ("--gpu-backend", "fake"),
            {},
            "configuration: the fake GPU backend (flag --gpu-backend) needs an inventory file: pass "
            "--fake-inventory or set HAMI_FAKE_INVENTORY",
        ),
        (
            (),
            {"HAMI_GPU_BACKEND": "fake"},
            "configuration: the fake GPU backend (environment HAMI_GPU_BACKEND) needs an inventory file: "
            "pass --fake-inventory or set HAMI_FAKE_INVENTORY",
        ),
        (
            ("--fake-inventory", "/inv.yaml"),
            {},
            "configuration: a fake inventory (flag --fake-inventory) is only used with the fake GPU backend: "
            "choose --gpu-backend fake or drop the inventory",
        ),
    ],
)
def test_flag_and_environment_errors(argv: Sequence[str], env: Mapping[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(argv, env)
    assert str(info.value) == message


def test_cross_field_error_names_the_file_line() -> None:
    error = file_error("\ngpuBackend: fake\n")
    assert error == (
        f"configuration: the fake GPU backend ({CONFIG} line 2: gpuBackend) needs an inventory file: "
        "pass --fake-inventory or set HAMI_FAKE_INVENTORY"
    )


def test_help_is_returned_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpRequested) as info:
        load(["--help"])
    assert "--device-split-count N" in info.value.text
    assert "DP_DISABLE_HEALTHCHECKS" in info.value.text
    assert "default 10" in info.value.text
    assert capsys.readouterr() == ("", "")


def test_parser_flags_have_help() -> None:
    parser = build_argument_parser()
    for action in parser._actions:
        assert action.help, action.option_strings


# --- DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS -------------------------------------------------------

PROBE = (11, 13, 31, 43, 45, 48, 68, 79, 109, 555)


def health(disable: str | None, enable: str | None) -> HealthChecks:
    env = {}
    if disable is not None:
        env["DP_DISABLE_HEALTHCHECKS"] = disable
    if enable is not None:
        env["DP_ENABLE_HEALTHCHECKS"] = enable
    return load(env=env).health_checks


@pytest.mark.parametrize(
    ("disable", "enable", "acted_on", "all_disabled"),
    [
        # NVIDIA's table (internal/rm/health_test.go), plus extra lists and overrides
        (None, None, {11, 48, 79, 555}, False),
        ("", "", {11, 48, 79, 555}, False),
        ("all", None, set(), True),
        ("xids", None, set(), True),
        ("ALL", None, set(), True),
        ("13,all", None, set(), True),
        (None, "all", set(PROBE), False),
        ("all", "all", set(PROBE), False),
        ("11", "11", {11, 48, 79, 555}, False),
        ("11", None, {48, 79, 555}, False),
        ("48, 79,", None, {11, 555}, False),
        (",555", None, {11, 48, 79}, False),
        (None, "13,109", {11, 13, 48, 79, 109, 555}, False),
        ("all", "79", {79}, False),
        ("79", "79", {11, 48, 79, 555}, False),
    ],
)
def test_healthcheck_variables(
    disable: str | None, enable: str | None, acted_on: set[int], all_disabled: bool
) -> None:
    checks = health(disable, enable)
    assert {x for x in PROBE if checks.acts_on(x)} == acted_on
    assert checks.all_disabled is all_disabled


def test_ignored_xids_resolved() -> None:
    assert health(None, None).ignored_xids == DEFAULT_IGNORED_XIDS
    assert health("48", "13").ignored_xids == (DEFAULT_IGNORED_XIDS | {48}) - {13}
    assert health(None, "all").ignored_xids == frozenset()


def test_healthcheck_precedence_flag_over_env() -> None:
    checks = load(["--disable-healthchecks", "48"], {"DP_DISABLE_HEALTHCHECKS": "all"}).health_checks
    assert checks == HealthChecks(disabled=XidList(xids=frozenset({48})))


# --- parsers under hypothesis -------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=10**6))
def test_any_positive_split_count_from_env_or_flag(n: int) -> None:
    assert load(env={"DEVICE_SPLIT_COUNT": str(n)}).device_split_count == n
    assert load(["--device-split-count", f" {n} "]).device_split_count == n


@given(st.text(min_size=1).filter(lambda s: not s.strip().lstrip("+").isdigit() and s.strip() != ""))
def test_non_integers_are_rejected_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(env={"DEVICE_SPLIT_COUNT": text})
    assert info.value.source == "environment"
    assert info.value.key == "DEVICE_SPLIT_COUNT"
    assert str(info.value).startswith("environment DEVICE_SPLIT_COUNT: expected an integer >= 1, got ")


@given(st.lists(st.integers(min_value=0, max_value=2**32), max_size=6), st.booleans())
def test_xid_lists_round_trip(xids: list[int], with_all: bool) -> None:
    text = ",".join([*map(str, xids), *(["all"] if with_all else [])])
    checks = health(text, None)
    assert checks.disabled == XidList(all=with_all, xids=frozenset(xids))
    for xid in xids:
        assert not checks.acts_on(xid)


# --- the health endpoint address (--health-bind) -------------------------------------------------------


def test_health_bind_is_off_by_default() -> None:
    assert load().health_bind is None
    assert "--health-bind HOST:PORT" in build_argument_parser().format_help()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:9396", HealthBind("0.0.0.0", 9396)),
        (" 127.0.0.1:0 ", HealthBind("127.0.0.1", 0)),
        (":9396", HealthBind("", 9396)),
        ("[::]:9396", HealthBind("::", 9396)),
        ("[::1]:65535", HealthBind("::1", 65535)),
        ("localhost:8080", HealthBind("localhost", 8080)),
        ("", None),
    ],
)
def test_health_bind_forms(text: str, expected: HealthBind | None) -> None:
    assert load(["--health-bind", text]).health_bind == expected


def test_health_bind_shown_as_written() -> None:
    assert str(HealthBind("0.0.0.0", 9396)) == "0.0.0.0:9396"
    assert str(HealthBind("::", 9396)) == "[::]:9396"


@pytest.mark.parametrize("text", ["9396", "0.0.0.0", "0.0.0.0:", "0.0.0.0:65536", "0.0.0.0:-1", "[nope]:1",
                                  "[::1]9396", "bad host:1", "a:b"])  # fmt: skip
def test_bad_health_bind_is_rejected_naming_flag_and_value(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(["--health-bind", text])
    assert str(info.value).startswith("command line --health-bind: expected HOST:PORT, [IPv6]:PORT or :PORT")
    assert info.value.value == f'"{text}"'


def test_health_bind_sources_and_disabling() -> None:
    # environment and file; an empty flag (or an empty / null file value) turns the endpoint off.
    assert load(env={"HAMI_HEALTH_BIND": "0.0.0.0:9396"}).health_bind == HealthBind("0.0.0.0", 9396)
    assert load_file("healthBind: 127.0.0.1:9000\n").health_bind == HealthBind("127.0.0.1", 9000)
    assert load_file('healthBind: ""\n', env={}).health_bind is None
    assert load_file("healthBind: null\n").health_bind is None
    assert load(["--health-bind", ""], {"HAMI_HEALTH_BIND": ":9396"}).health_bind is None
    # An empty variable counts as unset (as every variable): the file's value stays.
    assert load_file("healthBind: :9000\n", env={"HAMI_HEALTH_BIND": ""}).health_bind == HealthBind("", 9000)


def test_bad_health_bind_in_the_file_names_line_and_key() -> None:
    message = file_error("deviceSplitCount: 4\nhealthBind: 9396\n")
    assert message.startswith(f"{CONFIG} line 2: healthBind: expected HOST:PORT")
    assert "nodeconfig" not in message
    # Not a per-node (nodeconfig) key.
    assert "unknown nodeconfig key" in file_error("nodeconfig:\n  - name: node-a\n    healthBind: :1\n")


# --- options that would change nothing (issue 13, item 6) ---------------------------------------------------


def test_mps_mode_without_an_mps_root_is_refused_naming_the_mps_root_settings() -> None:
    for argv, files in (
        (["--operating-mode", "mps"], None),
        (
            ["--config-file", str(CONFIG)],
            {str(CONFIG): "nodeconfig:\n- name: node-a\n  operatingmode: mps\n"},
        ),
    ):
        with pytest.raises(ConfigError) as info:
            load(argv, files=files)
        assert info.value.key == "mps_root"
        message = str(info.value)
        assert "operating mode mps" in message and "--mps-root" in message and "MPS_ROOT" in message
        assert "does not start" in message
    config = load(["--operating-mode", "mps"], env={"MPS_ROOT": "/run/nvidia/mps"})
    assert config.operating_mode is OperatingMode.MPS and config.mps_root == "/run/nvidia/mps"
    assert config.warnings == ()


def test_mps_root_outside_mps_mode_is_accepted_with_a_warning() -> None:
    config = load_file("mpsRoot: /run/nvidia/mps\n")
    assert config.mps_root == "/run/nvidia/mps"
    assert config.warnings == (
        f"{CONFIG} line 1: mpsRoot: the MPS root has no effect, since the operating mode is hami-core, "
        "not mps",
    )
    with pytest.raises(ConfigError, match="expected an absolute path"):
        load(["--mps-root", "relative/dir"])


def test_cdi_annotation_prefix_warns_only_without_the_cdi_annotations_strategy() -> None:
    config = load(env={"CDI_ANNOTATION_PREFIX": "cdi.example.com/"})
    assert config.warnings == (
        "environment CDI_ANNOTATION_PREFIX: the CDI annotation prefix has no effect, since the device-list "
        "strategy does not include cdi-annotations",
    )
    with_cdi = load(
        ["--device-list-strategy", "cdi-annotations"], env={"CDI_ANNOTATION_PREFIX": "cdi.example.com/"}
    )
    assert with_cdi.warnings == () and with_cdi.cdi_annotation_prefix == "cdi.example.com/"


def test_cdi_spec_dir_defaults_to_var_run_cdi_and_is_settable() -> None:
    assert load().cdi_spec_dir == Path("/var/run/cdi")
    assert load_file("cdiSpecDir: /etc/cdi\n").cdi_spec_dir == Path("/etc/cdi")
    assert "--cdi-spec-dir" in build_argument_parser().format_help()


def test_enable_get_preferred_allocation_is_accepted_with_a_warning_that_it_changes_nothing() -> None:
    config = load(["--enable-get-preferred-allocation", "true"])
    assert config.enable_get_preferred_allocation is True
    (warning,) = config.warnings
    assert warning.startswith("flag --enable-get-preferred-allocation: HAMi's switch")
    assert "has no effect" in warning and "answers with the GPUs kubelet records" in warning
    assert load().warnings == ()


# --- what the daemon takes from the config ------------------------------------------------------------------


def test_the_in_cluster_api_server_address_comes_from_the_environment_through_the_config() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOME": "/root"}
    assert load(env=env).in_cluster_env == (
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
    )
    assert load(env={"KUBERNETES_SERVICE_HOST": ""}).in_cluster_env == ()


def test_mig_strategy_is_named_unsupported_and_operating_mode_mig_is_not() -> None:
    assert load().unsupported is None
    assert load(["--operating-mode", "mig"]).unsupported is None  # HAMi's dynamic MIG (issue 27)
    reason = load(["--mig-strategy", "single"]).unsupported
    assert reason is not None and "MIG is not supported by hami-node yet" in reason


def test_uses_cdi_follows_the_device_list_strategy() -> None:
    assert not load().uses_cdi
    assert not load(["--device-list-strategy", "envvar,volume-mounts"]).uses_cdi
    assert load(["--device-list-strategy", "envvar,cdi-cri"]).uses_cdi
    assert load(["--device-list-strategy", "cdi-annotations"]).uses_cdi


BURST_ZERO = '--kube-api-burst: expected an integer >= 1, got "0"'


def test_kube_api_rate_limit_defaults_to_kubelets_and_is_read_from_flag_and_env() -> None:
    assert (load().kube_api_qps, load().kube_api_burst) == (50.0, 100)
    assert load(["--kube-api-qps", "0"]).kube_api_qps == 0.0  # no limit
    assert load(env={"HAMI_KUBE_API_BURST": "9"}).kube_api_burst == 9
    with pytest.raises(ConfigError, match=BURST_ZERO):
        load(["--kube-api-burst", "0"])
