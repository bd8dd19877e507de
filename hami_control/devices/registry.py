"""The vendor registry: one explicit table of vendor modules (after kube-scheduler's plugin registry,
pkg/scheduler/framework/plugins/registry.go), built once at start-up from the device config, in HAMi's
order (pkg/scheduler/config/config.go `InitDevicesWithConfig`: NVIDIA, Cambricon, Hygon, Enflame GCU and
DRS, Mthreads, Metax GPU and sGPU, Kunlun and vXPU, AWS Neuron, AMD, Vastai, Biren, then the Ascend
vNPU chips and the Iluvatar chips).

Which vendors are on, as in HAMi:
- Ascend and Iluvatar only with `--enable-ascend` / `--enable-iluvatar` (both off by default, as HAMi's
  flags and the chart's `devices.ascend.enabled` / `devices.iluvatar.enabled`);
- without `--device-config-file`, every other vendor, with the chart's values;
- with a file, the vendors whose section the file has: HAMi builds a vendor from a missing section with
  empty resource names, which no container can name, so its pods go to the default scheduler; here the
  vendor is simply left out (and said so at start-up). A key missing inside a section gets the chart's
  value (HAMi: the empty value).
NVIDIA is always on; its names and defaults come from hami-control's own settings (flags, environment,
`--config-file`), and the file's `nvidia:` section is accepted (HAMi's `NvidiaConfig` keys, most of them
hami-node's) but not read here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami_api.resources import RequestDefaults, ResourceNames, pod_containers
from hami_api.settings import ConfigError
from hami_control.devices.base import DeviceRequest, Vendor
from hami_control.devices.config import DeviceConfig
from hami_control.devices.nvidia import Nvidia, mig_profile_allowlist


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of the table: the device config key and the module whose `build(config)` makes the
    vendors; `gate` names the `--enable-<gate>` flag the vendor needs ("" = none)."""

    key: str
    module: str
    gate: str = ""


ENTRIES: tuple[Entry, ...] = (
    Entry("cambricon", "hami_control.devices.cambricon"),
    Entry("hygon", "hami_control.devices.hygon"),
    Entry("enflame", "hami_control.devices.enflame"),
    Entry("mthreads", "hami_control.devices.mthreads"),
    Entry("metax", "hami_control.devices.metax"),
    Entry("kunlun", "hami_control.devices.kunlun"),
    Entry("awsneuron", "hami_control.devices.awsneuron"),
    Entry("amd", "hami_control.devices.amd"),
    Entry("vastai", "hami_control.devices.vastai"),
    Entry("biren", "hami_control.devices.biren"),
    Entry("vnpus", "hami_control.devices.ascend", gate="ascend"),
    Entry("iluvatars", "hami_control.devices.iluvatar", gate="iluvatar"),
)
"""Every vendor after NVIDIA, in HAMi's order."""

NVIDIA_KEYS = frozenset(
    {
        "resourceCountName", "resourceMemoryName", "resourceCoreName", "resourceMemoryPercentageName",
        "resourcePriorityName", "overwriteEnv", "defaultMemory", "defaultCores", "defaultGPUNum",
        "memoryFactor", "disableCoreLimit", "migProfileAllowlist", "gpuCorePolicy", "runtimeClassName",
        "deviceSplitCount", "deviceMemoryScaling", "deviceCoreScaling", "preConfiguredDeviceMemory",
        "libCudaLogLevel", "enableNumaTopology",
    }
)  # fmt: skip
"""HAMi's NvidiaConfig keys (pkg/device/nvidia/device.go, v2.10.0)."""


class _Builder(Protocol):
    def __call__(self, config: DeviceConfig) -> tuple[Vendor, ...]: ...


_NAMES = ResourceNames()
_DEFAULTS = RequestDefaults()


@dataclass(frozen=True, slots=True)
class RegistryOptions:
    enable_ascend: bool = False
    enable_iluvatar: bool = False
    nvidia_resources: ResourceNames = _NAMES
    nvidia_defaults: RequestDefaults = _DEFAULTS


@dataclass(frozen=True, slots=True)
class Registry:
    """The vendors in force, NVIDIA first, and the ones left out with the reason (for the start-up log)."""

    vendors: tuple[Vendor, ...]
    left_out: tuple[tuple[str, str], ...] = ()
    by_word: Mapping[str, Vendor] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_word", {v.names.common_word: v for v in self.vendors})

    def __iter__(self) -> Iterator[Vendor]:
        return iter(self.vendors)

    def get(self, common_word: str) -> Vendor | None:
        return self.by_word.get(common_word)

    @property
    def others(self) -> tuple[Vendor, ...]:
        """The vendors the generic path decides (every one but NVIDIA)."""
        return tuple(v for v in self.vendors if not v.native)

    def resources(self) -> tuple[str, ...]:
        """Every resource name of every vendor (the extender's managed resources, quota)."""
        return tuple(dict.fromkeys(r for v in self.vendors for r in v.names.resources))

    def container_requests(self, container: Mapping[str, Any]) -> dict[str, DeviceRequest]:
        """HAMi's Resourcereqs for one container: common word -> request, for each vendor it asks."""
        out = {}
        for vendor in self.vendors:
            request = vendor.request(container)
            if request is not None and request.nums > 0:
                out[vendor.names.common_word] = request
        return out

    def pod_requests(self, pod: Mapping[str, Any]) -> tuple[dict[str, DeviceRequest], ...]:
        """One mapping per container, init containers first (HAMi's PodDeviceRequests)."""
        return tuple(self.container_requests(c) for c, _ in pod_containers(pod))


def build_registry(config: DeviceConfig, options: RegistryOptions = RegistryOptions()) -> Registry:
    """Build every vendor in HAMi's order. Raises `ConfigError` for a bad section (named key and line)
    or two vendors claiming one common word."""
    nvidia = config.section("nvidia")
    nvidia.ignored = NVIDIA_KEYS  # accepted, not read here; a typo gets a suggestion from them
    mig_profile_allowlist(nvidia)  # HAMi's InitNvidiaDevice refuses a bad one (ValidateMigProfileAllowlist)
    nvidia.finish()
    vendors: list[Vendor] = [Nvidia(options.nvidia_resources, options.nvidia_defaults)]
    left_out: list[tuple[str, str]] = []
    gates = {"ascend": options.enable_ascend, "iluvatar": options.enable_iluvatar}
    for entry in ENTRIES:
        if entry.gate and not gates[entry.gate]:
            left_out.append((entry.key, f"off (--enable-{entry.gate}=false)"))
            continue
        if config.file_given and not config.given(entry.key):
            left_out.append((entry.key, f"off (no {entry.key}: section in {config.source})"))
            continue
        module = importlib.import_module(entry.module)
        builder: _Builder = module.build
        vendors.extend(builder(config))
    seen: dict[str, str] = {}
    for vendor in vendors:
        word = vendor.names.common_word
        if word in seen:
            raise ConfigError(config.source, vendor.names.family, f"common word {word!r} is used twice")
        seen[word] = vendor.names.family
    return Registry(tuple(vendors), tuple(left_out))


def registry_for(vendors: Sequence[Vendor]) -> Registry:
    """A registry of the given vendors (tests, tools)."""
    return Registry(tuple(vendors))


__all__ = ["ENTRIES", "Entry", "Registry", "RegistryOptions", "build_registry", "registry_for"]
