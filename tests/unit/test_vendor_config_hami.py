"""HAMi's own device config tests, transcribed: pkg/scheduler/config/config_test.go (v2.10.0), each case
naming its Go test and sub-case, run through hami-control's `parse_device_config` / `load_device_config`
/ `build_registry` (hami_control/devices/config.py, registry.py) and, where a case is about the flag,
`load_config` with `--device-config-file`.

HAMi's `Config` is a struct yaml.v2 fills (pkg/scheduler/config/config.go); ours is the document read by
the settings loader, each vendor module reading its own section. What a Go case checks on the struct
(`assert.DeepEqual` of a vendor config) is checked here on the vendor the registry builds from it (its
resource names, its Ascend `VNPUConfig`) and, for the sections hami-control does not read itself
(`nvidia:`), on the section as parsed. Where HAMi accepts what hami-control refuses or turns off on
purpose (docs/vendors.md, "Turning vendors on" and "Known differences from HAMi"), the case asserts
ours and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami_api.resources import ResourceNames
from hami_api.settings import ConfigError, LogLevel
from hami_control.config import ControlConfig, load_config
from hami_control.devices.ascend import Ascend, Template, VNPUConfig
from hami_control.devices.base import DeviceRequest, Vendor
from hami_control.devices.config import DeviceConfig, load_device_config, parse_device_config
from hami_control.devices.registry import ENTRIES, Registry, RegistryOptions, build_registry

SOURCE = "/etc/hami/device-config.yaml"

# config_test.go loadTestConfig(), verbatim.
TEST_CONFIG = """\
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
cambricon:
  resourceCountName: cambricon.com/vmlu
  resourceMemoryName: cambricon.com/mlu.smlu.vmemory
  resourceCoreName: cambricon.com/mlu.smlu.vcore
hygon:
  resourceCountName: hygon.com/dcunum
  resourceMemoryName: hygon.com/dcumem
  resourceCoreName: hygon.com/dcucores
metax:
  resourceCountName: "metax-tech.com/gpu"
enflame:
  resourceNameGCU: "enflame.com/gcu"
  resourceNameDRSGCU: "enflame.com/drs-gcu"
  resourceNameGCUMemory: "enflame.com/gcu-memory"
  resourceNameGCUCore: "enflame.com/gcu-core"
mthreads:
  resourceCountName: "mthreads.com/vgpu"
  resourceMemoryName: "mthreads.com/sgpu-memory"
  resourceCoreName: "mthreads.com/sgpu-core"
iluvatars:
- chipName: MR-V100
  commonWord: MR-V100
  resourceCountName: iluvatar.ai/MR-V100-vgpu
  resourceMemoryName: iluvatar.ai/MR-V100.vMem
  resourceCoreName: iluvatar.ai/MR-V100.vCore
- chipName: MR-V50
  commonWord: MR-V50
  resourceCountName: iluvatar.ai/MR-V50-vgpu
  resourceMemoryName: iluvatar.ai/MR-V50.vMem
  resourceCoreName: iluvatar.ai/MR-V50.vCore
- chipName: BI-V150
  commonWord: BI-V150
  resourceCountName: iluvatar.ai/BI-V150-vgpu
  resourceMemoryName: iluvatar.ai/BI-V150.vMem
  resourceCoreName: iluvatar.ai/BI-V150.vCore
- chipName: BI-V100
  commonWord: BI-V100
  resourceCountName: iluvatar.ai/BI-V100-vgpu
  resourceMemoryName: iluvatar.ai/BI-V100.vMem
  resourceCoreName: iluvatar.ai/BI-V100.vCore
kunlun:
  resourceCountName: "kunlunxin.com/xpu"
vnpus:
  hamiVnpuCore: false
  configs:
  - chipName: 910A
    commonWord: Ascend910A
    resourceName: huawei.com/Ascend910A
    resourceMemoryName: huawei.com/Ascend910A-memory
    memoryAllocatable: 32768
    memoryCapacity: 32768
    aiCore: 30
    templates:
      - name: vir02
        memory: 2184
        aiCore: 2
      - name: vir04
        memory: 4369
        aiCore: 4
      - name: vir08
        memory: 8738
        aiCore: 8
      - name: vir16
        memory: 17476
        aiCore: 16
  - chipName: 910B2
    commonWord: Ascend910B2
    resourceName: huawei.com/Ascend910B2
    resourceMemoryName: huawei.com/Ascend910B2-memory
    memoryAllocatable: 65536
    memoryCapacity: 65536
    aiCore: 24
    aiCPU: 6
    templates:
      - name: vir03_1c_8g
        memory: 8192
        aiCore: 3
        aiCPU: 1
      - name: vir06_1c_16g
        memory: 16384
        aiCore: 6
        aiCPU: 1
      - name: vir12_3c_32g
        memory: 32768
        aiCore: 12
        aiCPU: 3
  - chipName: 910B3
    commonWord: Ascend910B3
    resourceName: huawei.com/Ascend910B3
    resourceMemoryName: huawei.com/Ascend910B3-memory
    memoryAllocatable: 65536
    memoryCapacity: 65536
    aiCore: 20
    aiCPU: 7
    templates:
      - name: vir05_1c_16g
        memory: 16384
        aiCore: 5
        aiCPU: 1
      - name: vir10_3c_32g
        memory: 32768
        aiCore: 10
        aiCPU: 3
  - chipName: 910B4
    commonWord: Ascend910B4
    resourceName: huawei.com/Ascend910B4
    resourceMemoryName: huawei.com/Ascend910B4-memory
    memoryAllocatable: 32768
    memoryCapacity: 32768
    aiCore: 20
    aiCPU: 7
    templates:
      - name: vir05_1c_8g
        memory: 8192
        aiCore: 5
        aiCPU: 1
      - name: vir10_3c_16g
        memory: 16384
        aiCore: 10
        aiCPU: 3
  - chipName: 310P3
    commonWord: Ascend310P
    resourceName: huawei.com/Ascend310P
    resourceMemoryName: huawei.com/Ascend310P-memory
    memoryAllocatable: 21527
    memoryCapacity: 24576
    aiCore: 8
    aiCPU: 7
    templates:
      - name: vir01
        memory: 3072
        aiCore: 1
        aiCPU: 1
      - name: vir02
        memory: 6144
        aiCore: 2
        aiCPU: 2
      - name: vir04
        memory: 12288
        aiCore: 4
        aiCPU: 4
"""

HAMI_ORDER = [
    "NVIDIA", "MLU", "DCU", "GCU", "Enflame", "Mthreads", "Metax-GPU", "Metax-SGPU", "kunlun", "XPU",
    "AWSNeuron", "AMD", "Vastai", "Biren",
]  # fmt: skip
"""config_test.go setupTest's expectedDevices, in InitDevicesWithConfig's order (its DevicesToHandle)."""


def _reader(text: str) -> Callable[[Path], str]:
    return lambda _path: text


def _file(text: str) -> DeviceConfig:
    """`text` as the file `--device-config-file` names."""
    return load_device_config(Path(SOURCE), _reader(text))


def _registry(text: str, *, ascend: bool = False, iluvatar: bool = False) -> Registry:
    return build_registry(_file(text), RegistryOptions(enable_ascend=ascend, enable_iluvatar=iluvatar))


def _vendor(registry: Registry, word: str) -> Vendor:
    vendor = registry.get(word)
    assert vendor is not None, f"{word} is not in {[v.names.common_word for v in registry]}"
    return vendor


def _names(registry: Registry, word: str) -> tuple[str, str, str]:
    names = _vendor(registry, word).names
    return names.count, names.memory, names.cores


def _control(argv: list[str], files: dict[str, str]) -> ControlConfig:
    """hami-control's load_config over an in-memory file system (plain HTTP: no TLS files needed)."""

    def read(path: Path) -> str:
        if str(path) not in files:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return files[str(path)]

    return load_config(["--insecure-http", *argv], {}, read)


# --- Test_LoadConfig: yaml.Unmarshal(loadTestConfig()) then DeepEqual per vendor ------------------------


def test_load_config_nvidia_config() -> None:
    """Test_LoadConfig / "NVIDIA Config". hami-control accepts HAMi's `nvidia:` section as written (every
    NvidiaConfig key) but takes NVIDIA's names and defaults from its own settings (docs/vendors.md,
    "Turning vendors on"), whose defaults are these values; so the section is checked as parsed and the
    NVIDIA vendor against it."""
    config = parse_device_config(TEST_CONFIG, SOURCE)
    assert dict(config.section("nvidia").value) == {
        "resourceCountName": "nvidia.com/gpu",
        "resourceMemoryName": "nvidia.com/gpumem",
        "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
        "resourceCoreName": "nvidia.com/gpucores",
        "resourcePriorityName": "nvidia.com/priority",
        "overwriteEnv": False,
        "defaultMemory": 0,
        "defaultCores": 0,
        "defaultGPUNum": 1,
    }
    nvidia = _vendor(build_registry(config), "NVIDIA")
    assert (nvidia.names.count, nvidia.names.memory, nvidia.names.cores) == (
        "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
    )  # fmt: skip
    assert set(nvidia.names.extra_resources) == {"nvidia.com/gpumem-percentage", "nvidia.com/priority"}
    control = ControlConfig().requests.defaults
    assert (control.default_memory, control.default_cores, control.default_gpu_num) == (0, 0, 1)


@pytest.mark.parametrize(
    ("case", "word", "expected"),
    [
        ("Cambricon Config", "MLU",
         ("cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore")),
        ("Hygon Config", "DCU", ("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores")),
        ("Mthreads Config", "Mthreads",
         ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")),
        ("Metax Config", "Metax-GPU", ("metax-tech.com/gpu", "", "")),
        ("Enflame Config", "GCU", ("enflame.com/gcu", "", "")),
        ("Enflame Config", "Enflame",
         ("enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core")),
        ("Kunlun Config", "kunlun", ("kunlunxin.com/xpu", "", "")),
    ],
)  # fmt: skip
def test_load_config_vendor_sections(case: str, word: str, expected: tuple[str, str, str]) -> None:
    """Test_LoadConfig / "Cambricon Config", "Hygon Config", "Mthreads Config", "Metax Config", "Enflame
    Config", "Kunlun Config": each section's resource names reach the vendor built from it (Enflame's
    one section makes two vendors, GCU and DRS, as InitGCUDevice and InitEnflameDevice)."""
    assert _names(_registry(TEST_CONFIG), word) == expected, case


def test_load_config_keys_a_section_leaves_out_get_the_charts_value_not_hamis_empty_one() -> None:
    """Test_LoadConfig / "Metax Config" and "Kunlun Config" compare with structs holding only
    resourceCountName: HAMi's MetaxConfig and KunlunConfig leave the sGPU's and the vXPU's names empty
    (so no container can ask them). On purpose, a key missing inside a section gets the chart's value
    here (docs/vendors.md, "Turning vendors on"), so Metax-SGPU and XPU keep their usual names."""
    registry = _registry(TEST_CONFIG)
    assert _names(registry, "Metax-SGPU") == (
        "metax-tech.com/sgpu",
        "metax-tech.com/vmemory",
        "metax-tech.com/vcore",
    )
    assert _names(registry, "XPU") == ("kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory", "")


def test_load_config_vnpus() -> None:
    """Test_LoadConfig: `configData.VNPUs` DeepEqual createVNPUConfigs(): hamiVnpuCore false and five
    chips with their templates (sorted by memory, as InitDevices sorts them)."""
    registry = _registry(TEST_CONFIG, ascend=True)
    chips = [v for v in registry if isinstance(v, Ascend)]
    assert [c.hami_vnpu_core for c in chips] == [False] * 5
    assert [c.config for c in chips] == [
        VNPUConfig(
            chip_name="910A", common_word="Ascend910A", resource_name="huawei.com/Ascend910A",
            resource_memory_name="huawei.com/Ascend910A-memory", memory_allocatable=32768,
            memory_capacity=32768, ai_core=30,
            templates=(
                Template("vir02", 2184, 2), Template("vir04", 4369, 4), Template("vir08", 8738, 8),
                Template("vir16", 17476, 16),
            ),
        ),
        VNPUConfig(
            chip_name="910B2", common_word="Ascend910B2", resource_name="huawei.com/Ascend910B2",
            resource_memory_name="huawei.com/Ascend910B2-memory", memory_allocatable=65536,
            memory_capacity=65536, ai_core=24, ai_cpu=6,
            templates=(
                Template("vir03_1c_8g", 8192, 3, 1), Template("vir06_1c_16g", 16384, 6, 1),
                Template("vir12_3c_32g", 32768, 12, 3),
            ),
        ),
        VNPUConfig(
            chip_name="910B3", common_word="Ascend910B3", resource_name="huawei.com/Ascend910B3",
            resource_memory_name="huawei.com/Ascend910B3-memory", memory_allocatable=65536,
            memory_capacity=65536, ai_core=20, ai_cpu=7,
            templates=(Template("vir05_1c_16g", 16384, 5, 1), Template("vir10_3c_32g", 32768, 10, 3)),
        ),
        VNPUConfig(
            chip_name="910B4", common_word="Ascend910B4", resource_name="huawei.com/Ascend910B4",
            resource_memory_name="huawei.com/Ascend910B4-memory", memory_allocatable=32768,
            memory_capacity=32768, ai_core=20, ai_cpu=7,
            templates=(Template("vir05_1c_8g", 8192, 5, 1), Template("vir10_3c_16g", 16384, 10, 3)),
        ),
        VNPUConfig(
            chip_name="310P3", common_word="Ascend310P", resource_name="huawei.com/Ascend310P",
            resource_memory_name="huawei.com/Ascend310P-memory", memory_allocatable=21527,
            memory_capacity=24576, ai_core=8, ai_cpu=7,
            templates=(
                Template("vir01", 3072, 1, 1), Template("vir02", 6144, 2, 2), Template("vir04", 12288, 4, 4),
            ),
        ),
    ]  # fmt: skip


def test_load_config_iluvatars() -> None:
    """Test_LoadConfig: `configData.IluvatarConfig` DeepEqual createIluvatarConfigs(): four chips, each
    its common word and three resource names."""
    registry = _registry(TEST_CONFIG, iluvatar=True)
    for chip in ("MR-V100", "MR-V50", "BI-V150", "BI-V100"):
        assert _names(registry, chip) == (
            f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem", f"iluvatar.ai/{chip}.vCore",
        )  # fmt: skip


# --- Test_InitDevicesWithConfig_Success / Test_GetDevices: setupTest's 14 devices -------------------------


def test_init_devices_with_config_success() -> None:
    """Test_InitDevicesWithConfig_Success: loadTestConfig() gives every device of setupTest's
    expectedDevices, each under its common word, in HAMi's order (Ascend and Iluvatar off: the Go test
    leaves --enable-ascend / --enable-iluvatar false). HAMi also builds AWSNeuron, AMD, Vastai and Biren,
    whose sections the file lacks, with empty resource names (so no pod can ask them); on purpose they are
    simply off here, and the registry says why (docs/vendors.md, "Turning vendors on")."""
    registry = _registry(TEST_CONFIG)
    missing = ["AWSNeuron", "AMD", "Vastai", "Biren"]
    assert [v.names.common_word for v in registry] == [w for w in HAMI_ORDER if w not in missing]
    assert dict(registry.left_out) == {
        "awsneuron": f"off (no awsneuron: section in {SOURCE})",
        "amd": f"off (no amd: section in {SOURCE})",
        "vastai": f"off (no vastai: section in {SOURCE})",
        "biren": f"off (no biren: section in {SOURCE})",
        "vnpus": "off (--enable-ascend=false)",
        "iluvatars": "off (--enable-iluvatar=false)",
    }


def test_init_devices_with_config_success_with_every_section() -> None:
    """Test_InitDevicesWithConfig_Success, with the four sections loadTestConfig() lacks added (the
    chart's values): all of setupTest's 14 expectedDevices, as HAMi's DevicesToHandle."""
    extra = (
        "awsneuron:\n  resourceCountName: aws.amazon.com/neuron\n"
        "  resourceCoreName: aws.amazon.com/neuroncore\n"
        "amd:\n  resourceCountName: amd.com/gpu\n"
        "vastai:\n  resourceCountName: vastaitech.com/va\n"
        "biren:\n  resourceCountName: birentech.com/gpu\n"
    )
    registry = _registry(TEST_CONFIG + extra)
    assert [v.names.common_word for v in registry] == HAMI_ORDER
    assert [key for key, _ in registry.left_out] == ["vnpus", "iluvatars"]


def test_get_devices() -> None:
    """Test_GetDevices: device.GetDevices() holds every initialised device, by common word (ours:
    `Registry.get` / `by_word`)."""
    registry = _registry(TEST_CONFIG)
    assert len(registry.by_word) == len(registry.vendors) > 0
    for vendor in registry:
        assert registry.get(vendor.names.common_word) is vendor


def test_init_devices_with_ascend_and_iluvatar_enabled() -> None:
    """InitDevicesWithConfig (config.go): after the table, `ascend.InitDevices(config.VNPUs)` and
    `iluvatar.InitIluvatarDevice(config.IluvatarConfig)` add one device per chip when their flags are on
    (no Go test enables them on loadTestConfig(); this is its other branch)."""
    registry = _registry(TEST_CONFIG, ascend=True, iluvatar=True)
    words = [v.names.common_word for v in registry]
    assert words[-9:] == [
        "Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend310P",
        "MR-V100", "MR-V50", "BI-V150", "BI-V100",
    ]  # fmt: skip


# --- Test_InitDevicesWithConfig_InvalidConfig / Test_validateConfig ------------------------------------


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("Test_InitDevicesWithConfig_InvalidConfig", "iluvatars: []\n"),
        ("Test_validateConfig / Empty config", "iluvatars: []\n"),
        ("Test_validateConfig / Empty config (an empty file)", ""),
    ],
)
def test_an_empty_config_leaves_nvidia_alone_where_hami_refuses_it(case: str, text: str) -> None:
    """Test_InitDevicesWithConfig_InvalidConfig and Test_validateConfig / "Empty config": HAMi refuses a
    config with every section empty ("all configurations are empty"), since its NVIDIA names would be
    empty too and it would handle no device. hami-control's NVIDIA names come from its own settings, so
    such a file leaves NVIDIA on and every other vendor off (a vendor whose section the file lacks is off,
    docs/vendors.md), each listed with the reason for the start-up log. Not in the docs' list of
    differences: reported."""
    registry = _registry(text, ascend=True, iluvatar=True)
    assert [v.names.common_word for v in registry] == ["NVIDIA"], case
    # `iluvatars: []` is a section with no chip: nothing to leave out; every other vendor is listed
    left = {key for key, _ in registry.left_out}
    assert left >= {e.key for e in ENTRIES if e.key != "iluvatars"}


@pytest.mark.parametrize(
    ("case", "text", "words"),
    [
        ("Valid config",
         "nvidia:\n  resourceCountName: nvidia.com/gpu\n  resourceMemoryName: nvidia.com/gpumem\n"
         "  resourceMemoryPercentageName: nvidia.com/gpumem-percentage\n"
         "  resourceCoreName: nvidia.com/gpucores\n"
         "  resourcePriorityName: nvidia.com/priority\n  overwriteEnv: false\n  defaultMemory: 0\n"
         "  defaultCores: 0\n  defaultGPUNum: 1\n",
         ["NVIDIA"]),
        ("Vastai only", "vastai:\n  resourceCountName: vastaitech.com/vgpu\n", ["NVIDIA", "Vastai"]),
        ("Biren only", "biren:\n  resourceCountName: birentech.com/gpu\n", ["NVIDIA", "Biren"]),
    ],
)  # fmt: skip
def test_validate_config(case: str, text: str, words: list[str]) -> None:
    """Test_validateConfig / "Valid config", "Vastai only", "Biren only": accepted; the one vendor the
    file names is on (beside NVIDIA, always on here), with the file's count name."""
    registry = _registry(text)
    assert [v.names.common_word for v in registry] == words, case
    if len(words) > 1:
        assert _vendor(registry, words[1]).names.count == text.rsplit(": ", maxsplit=1)[-1].strip()


# --- Test_InitDefaultDevices / Test_GlobalFlagSet ----------------------------------------------------------


def test_init_default_devices() -> None:
    """Test_InitDefaultDevices: without a file HAMi initialises from built-in values (DevicesMap and
    DevicesToHandle non-empty). Ours: without --device-config-file, the chart's device-config.yaml shipped
    in the package, every vendor on but the flag-gated Ascend and Iluvatar."""
    registry = build_registry(load_device_config(None, _reader("")))
    assert len(registry.vendors) > 1 and registry.resources()
    assert [v.names.common_word for v in registry] == HAMI_ORDER
    assert [v.names.common_word for v in _control([], {}).registry] == HAMI_ORDER


def test_global_flag_set_device_config_file() -> None:
    """Test_GlobalFlagSet: `-device-config-file=test-config-file.yaml` names the device config file
    (ours: `--device-config-file`, read at start-up through the settings loader, and its vendors built
    then). HAMi's `-debug=true` has no counterpart: hami-control's verbosity is `--log-level` (below)."""
    config = _control(
        ["--device-config-file=test-config-file.yaml", "--log-level=debug"],
        {"test-config-file.yaml": TEST_CONFIG},
    )
    assert config.devices.config_file == Path("test-config-file.yaml")
    assert config.device_config_text == TEST_CONFIG
    assert config.log_level is LogLevel.DEBUG
    assert [v.names.common_word for v in config.registry][:3] == ["NVIDIA", "MLU", "DCU"]
    assert "Vastai" not in config.registry.by_word


def test_global_flag_set_device_config_file_that_cannot_be_read_stops_start_up() -> None:
    """config.go LoadConfig / InitDevices: an unreadable file is fatal (klog.Fatalf "Failed to load
    device config file"); ours stops start-up with a ConfigError naming the file (no Go test)."""
    with pytest.raises(ConfigError) as err:
        _control(["--device-config-file=/nope/device-config.yaml"], {})
    assert str(err.value) == "/nope/device-config.yaml: cannot be read: No such file or directory"


# --- config.go LoadConfig's yaml.Unmarshal: what yaml.v2 accepts or refuses (no Go test) ---------------


def test_a_file_that_is_not_yaml_stops_start_up_naming_file_and_line() -> None:
    """config.go LoadConfig: yaml.Unmarshal's error is fatal; ours names the file and the line."""
    with pytest.raises(ConfigError) as err:
        _file("hygon: [\n")
    assert str(err.value).startswith(f"{SOURCE} line 2: is not valid YAML or JSON")


def test_a_value_of_the_wrong_type_stops_start_up_naming_key_line_and_value() -> None:
    """config.go LoadConfig: yaml.v2 refuses `memoryFactor: two` for an int32 field ("cannot unmarshal
    !!str"); so do we, naming the key, its line and the value."""
    with pytest.raises(ConfigError) as err:
        _registry(TEST_CONFIG.replace("  resourceCoreName: hygon.com/dcucores\n", "  memoryFactor: two\n"))
    assert str(err.value) == f'{SOURCE} line 18: hygon.memoryFactor: must be an integer, got "two"'


def test_an_unknown_key_in_a_section_is_refused_where_hami_ignores_it() -> None:
    """config.go LoadConfig: yaml.v2's Unmarshal (not UnmarshalStrict) drops a key no field has, so a
    typo silently leaves HAMi with an empty resource name. On purpose, hami-control refuses it with a
    suggestion (docs/vendors.md, "Turning vendors on")."""
    typo = TEST_CONFIG.replace(
        "  resourceCountName: hygon.com/dcunum\n", "  resourceCountNam: hygon.com/dcunum\n"
    )
    with pytest.raises(ConfigError) as err:
        _registry(typo)
    assert str(err.value) == (
        f"{SOURCE} line 16: hygon.resourceCountNam: is not a known key here "
        '(did you mean "resourceCountName"?)'
    )


def test_an_unknown_top_level_key_is_refused_where_hami_ignores_it() -> None:
    """config.go Config: yaml.v2 ignores a top-level key no field has (`iluvatar:` for `iluvatars:`); on
    purpose, hami-control refuses it with a suggestion."""
    with pytest.raises(ConfigError) as err:
        _file(TEST_CONFIG.replace("iluvatars:", "iluvatar:"))
    assert 'iluvatar: is not a device config section (did you mean "iluvatars"?)' in str(err.value)


def test_an_unknown_key_in_the_nvidia_section_is_refused_too() -> None:
    """As above for `nvidia:`, which hami-control accepts (HAMi's NvidiaConfig keys) but does not read."""
    typo = TEST_CONFIG.replace("  defaultGPUNum: 1\n", "  defaultGPUNumber: 1\n")
    with pytest.raises(ConfigError) as err:
        _registry(typo)
    assert str(err.value).startswith(f"{SOURCE} line 10: nvidia.defaultGPUNumber: is not a known key here")


# --- Test_Resourcereqs: device.Resourcereqs on an NVIDIA-only config named hami.io/* ----------------------

HAMI_IO = [
    "--resource-name=hami.io/gpu",
    "--resource-mem=hami.io/gpumem",
    "--resource-mem-percentage=hami.io/gpumem-percentage",
    "--resource-cores=hami.io/gpucores",
]
NVIDIA_HAMI_IO = (
    "nvidia:\n  resourceCountName: hami.io/gpu\n  resourceMemoryName: hami.io/gpumem\n"
    "  resourceMemoryPercentageName: hami.io/gpumem-percentage\n  resourceCoreName: hami.io/gpucores\n"
    "  defaultMemory: 0\n  defaultCores: 0\n  defaultGPUNum: 1\n"
)
GPU = {"hami.io/gpu": "1", "hami.io/gpucores": "30", "hami.io/gpumem": "1000"}
CPU = {"cpu": "1"}
MEMORY = {"memory": "2000"}
ASKED = {"NVIDIA": DeviceRequest(nums=1, type="NVIDIA", memreq=1000, mem_percentage=101, coresreq=30)}


def _containers(*limits: dict[str, str]) -> dict[str, Any]:
    return {"spec": {"containers": [{"resources": {"limits": dict(values)}} for values in limits]}}


@pytest.mark.parametrize(
    ("case", "limits", "want"),
    [
        ("don't resource", [CPU], ({},)),
        ("one container use gpu", [GPU], (ASKED,)),
        ("two container only one container use gpu", [GPU, CPU], (ASKED, {})),
        ("three containers gpu container first", [GPU, CPU, MEMORY], (ASKED, {}, {})),
        ("three containers gpu container in the middle", [CPU, GPU, MEMORY], ({}, ASKED, {})),
        ("three containers gpu container last", [CPU, MEMORY, GPU], ({}, {}, ASKED)),
    ],
)
def test_resourcereqs(
    case: str, limits: list[dict[str, str]], want: tuple[dict[str, DeviceRequest], ...]
) -> None:
    """Test_Resourcereqs: one request mapping per container, the NVIDIA one where a container asks
    (MemPercentagereq 101: unset). The NVIDIA names are hami-control's own settings (the flags), the file's
    `nvidia:` section being accepted but not read; the file names no other vendor, so none is on."""
    config = _control([*HAMI_IO, f"--device-config-file={SOURCE}"], {SOURCE: NVIDIA_HAMI_IO})
    assert config.requests.names == ResourceNames(
        "hami.io/gpu", "hami.io/gpumem", "hami.io/gpumem-percentage", "hami.io/gpucores"
    )
    assert [v.names.common_word for v in config.registry] == ["NVIDIA"]
    assert config.registry.pod_requests(_containers(*limits)) == want, case
