"""The node daemon's settings: one typed, frozen `NodeConfig`, filled from flags, environment, an optional
config file (YAML or JSON) and defaults, in that order of precedence, and validated once at start-up.

`load_config(argv, env, read_file)` is pure: the caller passes the command line, the environment and a
function that reads a file, so tests drive every source without touching the process.

The config file holds the settings under camelCase keys (`deviceSplitCount: 10`, `hookPath: /usr/local`)
and may carry HAMi's per-node overrides, `nodeconfig: [{name, devicesplitcount, ...}]` (the keys of
HAMi's `/config/config.json`, lowercase). The entry whose `name` equals this node's name is merged over
the file's own keys; flags and environment still win over both. Every entry is validated, not only this
node's, so a typo in the shared ConfigMap is caught on every node.

Environment: the names HAMi and NVIDIA's plugin use keep their names (`NODE_NAME`, `DEVICE_SPLIT_COUNT`,
`HOOK_PATH`, `DEVICE_LIST_STRATEGY`, `DP_DISABLE_HEALTHCHECKS`, ...); hami-py's own settings are prefixed
`HAMI_` (`HAMI_GPU_BACKEND`, `HAMI_KUBELET_DIR`, ...). An empty variable counts as unset.

Any bad value raises `ConfigError`, whose message names the source (flag, environment variable, or file
and line), the key and the value, e.g.
`node-config.yaml line 7: nodeconfig[1].devicesplitcount: expected an integer >= 1, got "ten"`.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml

from hami_api.settings import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from hami_api.settings import RESOURCE_NAME as _RESOURCE_NAME
from hami_api.settings import ConfigError, HelpRequested, LogLevel
from hami_api.settings import Invalid as _Invalid
from hami_api.settings import parse_bool as _bool
from hami_api.settings import parse_enum as _enum
from hami_api.settings import parse_int as _int
from hami_api.settings import shown as _shown
from hami_api.settings import suggest as _suggest
from hami_node.gpu.select import GPUBackendKind

# --- values --------------------------------------------------------------------------------------------


class OperatingMode(StrEnum):
    """How containers share a GPU: HAMi-core's libvgpu.so limits, MIG instances (refused at start-up: not
    supported yet), or MPS (HAMi-core's limits plus a connection to an MPS control daemon run outside
    hami-node, which needs `mps_root`; see `hami_node.mps`)."""

    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


class MigStrategy(StrEnum):
    """HAMi's nodeconfig `migstrategy` (NVIDIA's MIG strategies); carried, not acted on yet."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceListStrategy(StrEnum):
    """How the container runtime learns which GPUs to expose (NVIDIA's `deviceListStrategy`)."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"

    @property
    def is_cdi(self) -> bool:
        return self in (DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI)


DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Xids NVIDIA's plugin ignores by default: application errors after which the GPU is still healthy
(graphics exception, page fault, GPU stopped processing, preemptive cleanup, video processor exception,
context switch timeout)."""


@dataclass(frozen=True, slots=True)
class XidList:
    """One of DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS as written: `all` (or `xids`), or Xids."""

    all: bool = False
    xids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class HealthChecks:
    """Which Xid critical errors mark a GPU unhealthy, with NVIDIA's meaning of the two variables:

    - `DP_DISABLE_HEALTHCHECKS`: `all` or `xids` turns Xid checks off; otherwise a list of Xids to ignore
      on top of `DEFAULT_IGNORED_XIDS`.
    - `DP_ENABLE_HEALTHCHECKS`: Xids acted on whatever else says (the defaults and the disabled list,
      even when everything is disabled); `all` acts on every Xid, the default ones included.
    """

    disabled: XidList = XidList()
    enabled: XidList = XidList()

    def acts_on(self, xid: int) -> bool:
        """Whether an Xid critical error with this code marks the GPU unhealthy."""
        if self.enabled.all or xid in self.enabled.xids:
            return True
        if self.disabled.all:
            return False
        return xid not in self.ignored_xids

    @property
    def ignored_xids(self) -> frozenset[int]:
        """The Xids ignored one by one (meaningful unless `all_disabled`)."""
        if self.enabled.all:
            return frozenset()
        return (DEFAULT_IGNORED_XIDS | self.disabled.xids) - self.enabled.xids

    @property
    def all_disabled(self) -> bool:
        """No Xid is acted on at all: the health loop need not watch Xid events."""
        return self.disabled.all and not self.enabled.all and not self.enabled.xids


@dataclass(frozen=True, slots=True)
class FilterDevices:
    """GPUs this node must not advertise (HAMi's nodeconfig `filterdevices`), by UUID or by index."""

    uuids: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()

    def excludes(self, uuid: str, index: int | None = None) -> bool:
        return uuid in self.uuids or (index is not None and index in self.indexes)


@dataclass(frozen=True, slots=True)
class HealthBind:
    """Where the health endpoint (`hami_node.healthz`) listens. `host` "" means every address; port 0
    picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


DEFAULT_HEALTH_PORT = 9396
"""The port the DaemonSet gives `--health-bind` (next to HAMi's 9394 monitor and 9395 scheduler metrics)."""

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins/"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything the node daemon can be told. Paths inside containers (`hook_path`) are POSIX strings;
    paths on this machine are `Path`s."""

    node_name: str
    device_split_count: int = 10
    """Virtual devices (containers sharing it) per GPU."""
    device_memory_scaling: float = 1.0
    """Advertised memory = real memory x this; above 1 oversubscribes (CUDA_OVERSUBSCRIBE=true)."""
    device_cores_scaling: float = 1.0
    """Advertised compute = 100 x this."""
    preconfigured_device_memory: int = 0
    """MiB to advertise for GPUs whose memory NVML cannot tell (UMA parts); 0 = ask NVML."""
    enable_numa_topology: bool = False
    """Attach each GPU's NUMA node to its virtual devices, for kubelet's Topology Manager."""
    enable_topology_score: bool = True
    """Publish HAMi's GPU pair link scores (`hami.io/node-nvidia-score`) for the topology-aware policy
    (HAMi: only with ENABLE_TOPOLOGY_SCORE=true)."""
    lib_cuda_log_level: int = 1
    """LIBCUDA_LOG_LEVEL given to containers (HAMi-core: 0 errors .. 4 debug)."""
    disable_core_limit: bool = False
    """Give containers GPU_CORE_UTILIZATION_POLICY=disable (no compute limit)."""
    operating_mode: OperatingMode = OperatingMode.HAMI_CORE
    mig_strategy: MigStrategy = MigStrategy.NONE
    enable_get_preferred_allocation: bool = False
    """HAMi's nodeconfig switch between answering Allocate with the annotation's GPUs and with the GPUs of
    the IDs kubelet chose. Accepted for compatibility and without effect: hami-node always steers
    kubelet with GetPreferredAllocation and always answers with the GPUs kubelet records, refusing
    a disagreement with the scheduler (docs/node-daemon.md, Allocate)."""
    filter_devices: FilterDevices = FilterDevices()
    device_list_strategy: tuple[DeviceListStrategy, ...] = (DeviceListStrategy.ENVVAR,)
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    cdi_spec_dir: Path = Path(DEFAULT_CDI_SPEC_DIR)
    """Where the CDI spec of this node's GPUs is written with a cdi-* device-list strategy (and a spec
    left by such a run removed without one)."""
    mps_root: str | None = None
    """Host directory of the MPS control daemon's pipe and shm directories (NVIDIA's `mpsRoot`), seen
    at the same path by hami-node; required by operating mode mps, ignored (with a warning) in the
    others."""
    hook_path: str = "/usr/local"
    """Where HAMi-core lives on the host and in containers (`<hook>/vgpu/libvgpu.so`)."""
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    resource_name: str = "nvidia.com/gpu"
    socket_name: str = "hami-nvidia-gpu.sock"
    gpu_backend: GPUBackendKind = GPUBackendKind.NVML
    fake_inventory: Path | None = None
    kubeconfig: Path | None = None
    """None: in-cluster config."""
    config_file: Path | None = None
    health_recovery_seconds: float = 60.0
    """A GPU quiet and answering for this long is healthy again; 0 = never recover."""
    register_interval_seconds: float = 30.0
    """How often the node's inventory annotation is checked (and written if it changed)."""
    allocate_wait_seconds: float = 5.0
    """Bound on the one read of the node's pods an Allocate makes when the pod watch does not show the
    pod kubelet is admitting (Allocate never waits for the watch itself)."""
    health_checks: HealthChecks = HealthChecks()
    log_level: LogLevel = LogLevel.INFO
    health_bind: HealthBind | None = None
    """Address of the HTTP health endpoint (GET /healthz, /readyz); None = not served. Off by default so
    several daemons can share a machine (hami-sim); the DaemonSet sets it."""
    warnings: tuple[str, ...] = ()
    """Settings accepted for compatibility that have no effect in this configuration, one message each;
    the daemon logs them at start-up."""

    @property
    def socket_path(self) -> Path:
        return self.kubelet_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    @property
    def oversubscribed(self) -> bool:
        return self.device_memory_scaling > 1


# --- errors ----------------------------------------------------------------------------------------------


_Parser = Callable[[object], Any]
_T = TypeVar("_T", bound=StrEnum)


def _number(low: float, inclusive: bool) -> Callable[[object], float]:
    expected = f"a number {'>=' if inclusive else '>'} {low:g}"

    def parse(value: object) -> float:
        if isinstance(value, bool):
            raise _Invalid(expected)
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise _Invalid(expected) from None
        else:
            raise _Invalid(expected)
        if not math.isfinite(number) or number < low or (number == low and not inclusive):
            raise _Invalid(expected)
        return number

    return parse


def _items(value: object, expected: str) -> list[object]:
    """A list from a YAML list or a comma-separated string; blank items dropped."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list):
        return [item.strip() if isinstance(item, str) else item for item in value]
    raise _Invalid(expected)


def _strategies(value: object) -> tuple[DeviceListStrategy, ...]:
    names = ", ".join(s.value for s in DeviceListStrategy)
    expected = f"one or more of {names} (a list or a comma-separated string)"
    out: list[DeviceListStrategy] = []
    for item in _items(value, expected):
        if not isinstance(item, str) or item not in DeviceListStrategy._value2member_map_:
            raise _Invalid(expected)
        strategy = DeviceListStrategy(item)
        if strategy not in out:
            out.append(strategy)
    if not out:
        raise _Invalid(expected)
    return tuple(out)


def _xids(value: object) -> XidList:
    """NVIDIA's DP_*_HEALTHCHECKS: comma list, case-insensitive `all`/`xids`; blank items skipped.
    (NVIDIA silently skips malformed items; here they are an error.)"""
    expected = "all, xids, or a comma-separated list of Xid numbers"
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    xids: set[int] = set()
    every = False
    for item in _items(value, expected):
        if isinstance(item, str) and item.lower() in ("all", "xids"):
            every = True
            continue
        if isinstance(item, bool):
            raise _Invalid(expected)
        if isinstance(item, int) and item >= 0:
            xids.add(item)
        elif isinstance(item, str) and item.isascii() and item.isdigit():
            xids.add(int(item))
        else:
            raise _Invalid(expected)
    return XidList(all=every, xids=frozenset(xids))


def _filter_devices(value: object) -> FilterDevices:
    """HAMi's `{uuid: [...], index: [...]}`, or a list / comma string mixing UUIDs and indexes."""
    expected = "GPU UUIDs and indexes: {uuid: [...], index: [...]} or a comma-separated list"
    uuids: list[str] = []
    indexes: list[int] = []
    if isinstance(value, dict):
        unknown = set(value) - {"uuid", "index"}
        if unknown:
            raise _Invalid(expected)
        raw_uuids = value.get("uuid") or []
        raw_indexes = value.get("index") or []
        if not isinstance(raw_uuids, list) or not isinstance(raw_indexes, list):
            raise _Invalid(expected)
        for u in raw_uuids:
            if not isinstance(u, str) or not u.strip():
                raise _Invalid(expected)
            uuids.append(u.strip())
        for i in raw_indexes:
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise _Invalid(expected)
            indexes.append(i)
    elif value is None:
        pass
    else:
        for item in _items(value, expected):
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                indexes.append(item)
            elif isinstance(item, str) and item.isascii() and item.isdigit():
                indexes.append(int(item))
            elif isinstance(item, str) and item and not item.startswith("-"):
                uuids.append(item)
            else:
                raise _Invalid(expected)
    return FilterDevices(tuple(dict.fromkeys(uuids)), tuple(dict.fromkeys(indexes)))


def _text(expected: str, pattern: re.Pattern[str] | None = None) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(expected)
        text = value.strip()
        if pattern is not None and not pattern.fullmatch(text):
            raise _Invalid(expected)
        return text

    return parse


def _node_name(value: object) -> str:
    text = _text("a node name (a lowercase DNS subdomain)", _DNS_SUBDOMAIN)(value)
    if len(text) > 253:
        raise _Invalid("a node name (a lowercase DNS subdomain, at most 253 characters)")
    return text


def _hook_path(value: object) -> str:
    text = _text("an absolute path")(value)
    if not text.startswith("/"):
        raise _Invalid("an absolute path")
    return posixpath.normpath(text)


def _path(value: object) -> Path:
    return Path(_text("a path")(value))


def _socket_name(value: object) -> str:
    text = _text("a file name without '/'")(value)
    if "/" in text or text in (".", ".."):
        raise _Invalid("a file name without '/'")
    return text


def _resource_name(value: object) -> str:
    text = _text("an extended resource name such as nvidia.com/gpu", _RESOURCE_NAME)(value)
    domain = text.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or len(text) > 253:
        raise _Invalid("an extended resource name outside kubernetes.io, such as nvidia.com/gpu")
    return text


def _cdi_prefix(value: object) -> str:
    expected = "an annotation key prefix such as cdi.k8s.io/"
    if not isinstance(value, str) or not value.endswith("/"):
        raise _Invalid(expected)
    if not _DNS_SUBDOMAIN.fullmatch(value[:-1]):
        raise _Invalid(expected)
    return value


_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")


def _health_bind(value: object) -> HealthBind | None:
    """`host:port`, `[ipv6]:port` or `:port` (port 0..65535); "" (or null in the file) = not served."""
    expected = 'HOST:PORT, [IPv6]:PORT or :PORT with a port from 0 to 65535, or "" for none'
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Invalid(expected)
    text = value.strip()
    if not text:
        return None
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Invalid(expected) from None
    else:
        host, sep, port = text.rpartition(":")
        if host and not _HOSTNAME.fullmatch(host):
            raise _Invalid(expected)
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise _Invalid(expected)
    return HealthBind(host, int(port))


# --- the settings ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Setting:
    name: str
    """NodeConfig field (or a pseudo-field: config_file, disable_healthchecks, enable_healthchecks)."""
    flag: str
    env: str
    key: str
    """camelCase key at the top of the config file ("" = not allowed there)."""
    node_key: str | None
    """HAMi nodeconfig key, when a node entry may override it."""
    parse: _Parser
    help: str
    metavar: str = "VALUE"
    optional_bool: bool = False
    repeatable: bool = False
    shown_default: str = ""


_SETTINGS: tuple[_Setting, ...] = (
    _Setting("config_file", "--config-file", "CONFIG_FILE", "", None, _path,
             "config file (YAML or JSON), with HAMi's nodeconfig per-node overrides", "FILE"),
    _Setting("node_name", "--node-name", "NODE_NAME", "nodeName", None, _node_name,
             "this node's name in the API server", "NAME",
             shown_default="none, it is required"),
    _Setting("device_split_count", "--device-split-count", "DEVICE_SPLIT_COUNT", "deviceSplitCount",
             "devicesplitcount", _int(1), "virtual devices per GPU (containers that may share it)", "N"),
    _Setting("device_memory_scaling", "--device-memory-scaling", "DEVICE_MEMORY_SCALING",
             "deviceMemoryScaling", "devicememoryscaling", _number(0, inclusive=False),
             "advertised GPU memory = real memory x this; above 1 oversubscribes", "X"),
    _Setting("device_cores_scaling", "--device-cores-scaling", "DEVICE_CORES_SCALING", "deviceCoreScaling",
             "devicecorescaling", _number(0, inclusive=False), "advertised GPU compute = 100 x this", "X"),
    _Setting("preconfigured_device_memory", "--preconfigured-device-memory",
             "HAMI_PRECONFIGURED_DEVICE_MEMORY", "preConfiguredDeviceMemory", "preconfigureddevicememory",
             _int(0), "MiB to advertise for GPUs whose memory NVML cannot tell (UMA); 0 = ask NVML",
             "MIB"),
    _Setting("enable_numa_topology", "--enable-numa-topology", "HAMI_ENABLE_NUMA_TOPOLOGY",
             "enableNumaTopology", "enablenumatopology", _bool,
             "attach each GPU's NUMA node to its virtual devices", "BOOL", optional_bool=True),
    _Setting("enable_topology_score", "--enable-topology-score", "ENABLE_TOPOLOGY_SCORE",
             "enableTopologyScore", None, _bool,
             "publish the GPU pair link scores (hami.io/node-nvidia-score) for the topology-aware policy",
             "BOOL", optional_bool=True),
    _Setting("lib_cuda_log_level", "--libcuda-log-level", "HAMI_LIBCUDA_LOG_LEVEL", "libCudaLogLevel",
             "libcudaloglevel", _int(0, 4), "LIBCUDA_LOG_LEVEL for containers (0 errors .. 4 debug)",
             "LEVEL"),
    _Setting("disable_core_limit", "--disable-core-limit", "DISABLE_CORE_LIMIT", "disableCoreLimit", None,
             _bool, "give containers GPU_CORE_UTILIZATION_POLICY=disable", "BOOL", optional_bool=True),
    _Setting("operating_mode", "--operating-mode", "HAMI_OPERATING_MODE", "operatingMode", "operatingmode",
             _enum(OperatingMode), "hami-core, mig or mps", "MODE"),
    _Setting("mig_strategy", "--mig-strategy", "MIG_STRATEGY", "migStrategy", "migstrategy",
             _enum(MigStrategy), "none, single or mixed", "STRATEGY"),
    _Setting("enable_get_preferred_allocation", "--enable-get-preferred-allocation",
             "HAMI_ENABLE_GET_PREFERRED_ALLOCATION", "enableGetPreferredAllocation",
             "enablegetpreferredallocation", _bool,
             "HAMi compatibility, no effect: Allocate always answers with the GPUs kubelet records", "BOOL",
             optional_bool=True),
    _Setting("filter_devices", "--filter-devices", "HAMI_FILTER_DEVICES", "filterDevices", "filterdevices",
             _filter_devices, "GPUs not to advertise: comma-separated UUIDs and/or indexes", "LIST"),
    _Setting("device_list_strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY",
             "deviceListStrategy", None, _strategies,
             "envvar, volume-mounts, cdi-annotations and/or cdi-cri (comma-separated or repeated)",
             "STRATEGY", repeatable=True, shown_default="envvar"),
    _Setting("cdi_annotation_prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
             "cdiAnnotationPrefix", None, _cdi_prefix, "prefix of the CDI annotation key", "PREFIX"),
    _Setting("cdi_spec_dir", "--cdi-spec-dir", "HAMI_CDI_SPEC_DIR", "cdiSpecDir", None, _path,
             "directory of the CDI spec written for the cdi-annotations and cdi-cri strategies", "DIR"),
    _Setting("mps_root", "--mps-root", "MPS_ROOT", "mpsRoot", None, _hook_path,
             "host directory of the MPS control daemon's pipe and shm directories (operating mode mps)",
             "DIR", shown_default="none"),
    _Setting("hook_path", "--hook-path", "HOOK_PATH", "hookPath", None, _hook_path,
             "directory holding vgpu/libvgpu.so on the host and in containers", "DIR"),
    _Setting("kubelet_dir", "--kubelet-dir", "HAMI_KUBELET_DIR", "kubeletDir", None, _path,
             "kubelet's device-plugin directory (kubelet.sock and the plugin socket)", "DIR"),
    _Setting("resource_name", "--resource-name", "HAMI_RESOURCE_NAME", "resourceName", None, _resource_name,
             "the resource advertised to kubelet", "NAME"),
    _Setting("socket_name", "--socket-name", "HAMI_SOCKET_NAME", "socketName", None, _socket_name,
             "the plugin's socket file name inside the kubelet directory", "NAME"),
    _Setting("gpu_backend", "--gpu-backend", "HAMI_GPU_BACKEND", "gpuBackend", None, _enum(GPUBackendKind),
             "nvml (the real driver) or fake (an inventory file)", "BACKEND"),
    _Setting("fake_inventory", "--fake-inventory", "HAMI_FAKE_INVENTORY", "fakeInventory", None, _path,
             "inventory file of the fake backend (YAML or JSON)", "FILE"),
    _Setting("kubeconfig", "--kubeconfig", "KUBECONFIG", "kubeconfig", None, _path,
             "kubeconfig file", "FILE",
             shown_default="in-cluster config"),
    _Setting("health_recovery_seconds", "--health-recovery-seconds", "HAMI_HEALTH_RECOVERY_SECONDS",
             "healthRecoverySeconds", None, _number(0, inclusive=True),
             "an unhealthy GPU quiet and answering this long is healthy again; 0 = never", "SECONDS"),
    _Setting("register_interval_seconds", "--register-interval-seconds", "HAMI_REGISTER_INTERVAL_SECONDS",
             "registerIntervalSeconds", None, _number(0, inclusive=False),
             "how often the node's GPU inventory annotation is checked", "SECONDS"),
    _Setting("allocate_wait_seconds", "--allocate-wait-seconds", "HAMI_ALLOCATE_WAIT_SECONDS",
             "allocateWaitSeconds", None, _number(0, inclusive=True),
             "bound on the API read an Allocate makes for a pod the watch does not show yet", "SECONDS"),
    _Setting("log_level", "--log-level", "HAMI_LOG_LEVEL", "logLevel", None, _enum(LogLevel),
             "the daemon's log level: debug, info, warning or error", "LEVEL"),
    _Setting("health_bind", "--health-bind", "HAMI_HEALTH_BIND", "healthBind", None, _health_bind,
             "address of the HTTP health endpoint (GET /healthz, /readyz); \"\" = none", "HOST:PORT",
             shown_default="none; the DaemonSet uses 0.0.0.0:9396"),
    _Setting("disable_healthchecks", "--disable-healthchecks", "DP_DISABLE_HEALTHCHECKS",
             "disableHealthchecks", None, _xids,
             "all/xids, or Xids to ignore on top of 13,31,43,45,68,109", "XIDS", shown_default="none"),
    _Setting("enable_healthchecks", "--enable-healthchecks", "DP_ENABLE_HEALTHCHECKS",
             "enableHealthchecks", None, _xids,
             "all, or Xids always acted on (overrides the ignored ones)", "XIDS", shown_default="none"),
)  # fmt: skip

_BY_NAME = {s.name: s for s in _SETTINGS}
_BY_FILE_KEY = {s.key: s for s in _SETTINGS if s.key}
_BY_NODE_KEY = {s.node_key: s for s in _SETTINGS if s.node_key}
_NODE_KEYS = ("name", *_BY_NODE_KEY)
_PATHS_RELATIVE_TO_FILE = frozenset({"fake_inventory", "kubeconfig"})


def _default_text(setting: _Setting) -> str:
    if setting.shown_default:
        return setting.shown_default
    defaults = NodeConfig.__dataclass_fields__
    if setting.name not in defaults or setting.name == "node_name":
        return "none"
    value = defaults[setting.name].default
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, FilterDevices) or value is None:
        return "none"
    if isinstance(value, Path):
        return DEFAULT_KUBELET_DIR if setting.name == "kubelet_dir" else str(value)
    return str(value)


# --- command line ----------------------------------------------------------------------------------------


class NodeArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting: `ConfigError` for a bad command line,
    `HelpRequested` for --help."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError("command line", "", message)

    def print_help(self, file: Any = None) -> None:
        raise HelpRequested(self.format_help())


def build_argument_parser(prog: str = "hami-node") -> NodeArgumentParser:
    """The daemon's flags. Every flag defaults to "not given", so `load_config` can tell a flag from a
    default; the help shows each flag's environment variable and default."""
    parser = NodeArgumentParser(
        prog=prog,
        description=(
            "hami-node: the GPU node daemon of hami-py (kubelet device plugin, GPU health, node "
            "inventory). Precedence: flags > environment > config file (nodeconfig entry for this "
            "node over the file's keys) > defaults."
        ),
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    for s in _SETTINGS:
        help_text = f"{s.help} (env {s.env}; default {_default_text(s)})".replace("%", "%%")
        if s.optional_bool:
            parser.add_argument(
                s.flag, dest=s.name, nargs="?", const="true", metavar=s.metavar, help=help_text
            )
        elif s.repeatable:
            parser.add_argument(s.flag, dest=s.name, action="append", metavar=s.metavar, help=help_text)
        else:
            parser.add_argument(s.flag, dest=s.name, metavar=s.metavar, help=help_text)
    return parser


# --- config file -----------------------------------------------------------------------------------------

_Key = tuple[str | int, ...]


def _key_text(path: _Key) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True, slots=True)
class _Document:
    source: str
    value: Any
    lines: Mapping[_Key, int]

    def line(self, path: _Key) -> int | None:
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def fail(self, path: _Key, reason: str, value: str | None = None) -> NoReturn:
        raise ConfigError(self.source, _key_text(path), reason, self.line(path), value)


def _record_lines(source: str, node: yaml.Node, path: _Key, lines: dict[_Key, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                raise ConfigError(
                    source, _key_text((*path, key)), f"appears twice (also on line {seen[key]})", line
                )
            seen[key] = line
            lines[(*path, key)] = line
            _record_lines(source, value_node, (*path, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record_lines(source, item, (*path, i), lines)


def _load_document(text: str, source: str) -> _Document:
    """YAML (JSON is YAML too) with the line of every key and item, so errors point at the line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[_Key, int] = {}
        if node is None:
            return _Document(source, {}, lines)
        _record_lines(source, node, (), lines)
        value = yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(source, "", f"is not valid YAML or JSON: {problem}", line) from None
    return _Document(source, value, lines)


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    describe: Callable[[], str]
    """Where it came from, for cross-field errors ("flag --x", "environment X", "file line N: key")."""


def _parse_in_file(doc: _Document, setting: _Setting, path: _Key, raw: object, file_dir: Path) -> _Value:
    try:
        value = setting.parse(raw)
    except _Invalid as bad:
        doc.fail(path, f"expected {bad.expected}, got {_shown(raw)}", _shown(raw))
    if setting.name in _PATHS_RELATIVE_TO_FILE and not value.is_absolute():
        value = file_dir / value
    line = doc.line(path)
    return _Value(value, lambda: f"{doc.source} line {line}: {_key_text(path)}")


@dataclass(frozen=True, slots=True)
class _FileLayer:
    top: dict[str, _Value]
    node_entries: dict[str, dict[str, _Value]]


def _read_file_layer(path: Path, read_file: Callable[[Path], str]) -> _FileLayer:
    source = str(path)
    try:
        text = read_file(path)
    except OSError as err:
        raise ConfigError(source, "", f"cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(source, "", f"is not UTF-8 text ({err.reason})") from None
    doc = _load_document(text, source)
    if not isinstance(doc.value, dict):
        doc.fail((), f"expected a mapping of settings (deviceSplitCount: 10, ...), got {_shown(doc.value)}")
    file_dir = path.parent
    top: dict[str, _Value] = {}
    for key, raw in doc.value.items():
        if not isinstance(key, str):
            doc.fail((str(key),), "keys must be strings")
        if key == "nodeconfig":
            continue
        setting = _BY_FILE_KEY.get(key)
        if setting is None:
            doc.fail((key,), "unknown key" + _suggest(key, [*_BY_FILE_KEY, "nodeconfig"]))
        top[setting.name] = _parse_in_file(doc, setting, (key,), raw, file_dir)

    entries = doc.value.get("nodeconfig")
    node_entries: dict[str, dict[str, _Value]] = {}
    first_seen: dict[str, int] = {}
    if entries is None:
        return _FileLayer(top, node_entries)
    if not isinstance(entries, list):
        doc.fail(("nodeconfig",), f"expected a list of per-node entries, got {_shown(entries)}")
    for i, entry in enumerate(entries):
        at: _Key = ("nodeconfig", i)
        if not isinstance(entry, dict):
            doc.fail(at, f"expected a mapping with a name, got {_shown(entry)}")
        name = entry.get("name")
        if name is None:
            doc.fail(at, "has no name (the node it applies to)")
        try:
            name = _node_name(name)
        except _Invalid as bad:
            doc.fail((*at, "name"), f"expected {bad.expected}, got {_shown(name)}", _shown(name))
        if name in first_seen:
            doc.fail((*at, "name"), f'"{name}" is already configured by nodeconfig[{first_seen[name]}]')
        first_seen[name] = i
        values: dict[str, _Value] = {}
        for key, raw in entry.items():
            if key == "name":
                continue
            setting = _BY_NODE_KEY.get(key) if isinstance(key, str) else None
            if setting is None:
                doc.fail((*at, str(key)), "unknown nodeconfig key" + _suggest(str(key), _NODE_KEYS))
            values[setting.name] = _parse_in_file(doc, setting, (*at, key), raw, file_dir)
        node_entries[name] = values
    return _FileLayer(top, node_entries)


# --- load ------------------------------------------------------------------------------------------------


def _parse_flag(setting: _Setting, raw: object) -> _Value:
    if isinstance(raw, list):  # a repeatable flag
        raw = ",".join(str(r) for r in raw)
    try:
        value = setting.parse(raw)
    except _Invalid as bad:
        shown = _shown(raw)
        raise ConfigError(
            "command line", setting.flag, f"expected {bad.expected}, got {shown}", None, shown
        ) from None
    return _Value(value, lambda: f"flag {setting.flag}")


def _parse_env(setting: _Setting, raw: str) -> _Value:
    try:
        value = setting.parse(raw)
    except _Invalid as bad:
        shown = _shown(raw)
        raise ConfigError(
            "environment", setting.env, f"expected {bad.expected}, got {shown}", None, shown
        ) from None
    return _Value(value, lambda: f"environment {setting.env}")


def load_config(argv: Sequence[str], env: Mapping[str, str], read_file: Callable[[Path], str]) -> NodeConfig:
    """Build and validate the daemon's config from the command line (without the program name), the
    environment and the config file named by --config-file / CONFIG_FILE (read through `read_file`).

    Raises `ConfigError` for any bad value and `HelpRequested` for --help.
    """
    given = vars(build_argument_parser().parse_args(list(argv)))
    flags = {name: _parse_flag(_BY_NAME[name], raw) for name, raw in given.items()}
    envs = {s.name: _parse_env(s, env[s.env]) for s in _SETTINGS if env.get(s.env, "").strip()}

    config_file = flags.get("config_file") or envs.get("config_file")
    layer = _read_file_layer(config_file.value, read_file) if config_file else _FileLayer({}, {})

    node = flags.get("node_name") or envs.get("node_name") or layer.top.get("node_name")
    if node is None:
        raise ConfigError(
            "configuration",
            "node_name",
            "this node's name is not set: pass --node-name or set NODE_NAME (or nodeName in the file)",
        )
    merged: dict[str, _Value] = {**layer.top, **layer.node_entries.get(node.value, {}), **envs, **flags}

    values = {name: v.value for name, v in merged.items()}
    backend = values.get("gpu_backend", GPUBackendKind.NVML)
    if backend is GPUBackendKind.FAKE and "fake_inventory" not in values:
        where = merged["gpu_backend"].describe()
        raise ConfigError(
            "configuration", "fake_inventory",
            f"the fake GPU backend ({where}) needs an inventory file: pass --fake-inventory or set "
            "HAMI_FAKE_INVENTORY",
        )  # fmt: skip
    if backend is GPUBackendKind.NVML and "fake_inventory" in values:
        raise ConfigError(
            "configuration", "gpu_backend",
            f"a fake inventory ({merged['fake_inventory'].describe()}) is only used with the fake GPU "
            "backend: choose --gpu-backend fake or drop the inventory",
        )  # fmt: skip

    _check_mps(merged, values)
    health = HealthChecks(
        disabled=values.pop("disable_healthchecks", XidList()),
        enabled=values.pop("enable_healthchecks", XidList()),
    )
    return NodeConfig(**values, health_checks=health, warnings=_ignored_settings(merged, values))


def _check_mps(merged: Mapping[str, _Value], values: Mapping[str, Any]) -> None:
    """Operating mode mps needs an MPS root."""
    mode = values.get("operating_mode", OperatingMode.HAMI_CORE)
    if mode is OperatingMode.MPS and values.get("mps_root") is None:
        raise ConfigError(
            "configuration", "mps_root",
            f"operating mode mps ({merged['operating_mode'].describe()}) needs an MPS control daemon, "
            "which hami-node does not start: set --mps-root (MPS_ROOT, mpsRoot) to the host directory "
            "where it keeps <root>/<resource>/pipe and <root>/shm (NVIDIA's mps-control-daemon layout). "
            "HAMi v2.10 runs mps without a daemon, which is operating mode hami-core",
        )  # fmt: skip


def _ignored_settings(merged: Mapping[str, _Value], values: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings given that change nothing in this configuration (kept for HAMi / NVIDIA compatibility,
    where they are accepted the same way), one warning each."""
    out: list[str] = []
    mode = values.get("operating_mode", OperatingMode.HAMI_CORE)
    if "mps_root" in merged and mode is not OperatingMode.MPS:
        # A file shared by every node may set mpsRoot for the nodes its nodeconfig puts in mps mode.
        out.append(
            f"{merged['mps_root'].describe()}: the MPS root has no effect, since the operating mode is "
            f"{mode.value}, not mps"
        )
    strategies = values.get("device_list_strategy", (DeviceListStrategy.ENVVAR,))
    if "cdi_annotation_prefix" in merged and DeviceListStrategy.CDI_ANNOTATIONS not in strategies:
        out.append(
            f"{merged['cdi_annotation_prefix'].describe()}: the CDI annotation prefix has no effect, since "
            "the device-list strategy does not include cdi-annotations"
        )
    if "enable_get_preferred_allocation" in merged:
        out.append(
            f"{merged['enable_get_preferred_allocation'].describe()}: HAMi's switch between answering "
            "Allocate with the annotation's GPUs and with kubelet's has no effect: hami-node always steers "
            "kubelet with GetPreferredAllocation and answers with the GPUs kubelet records, refusing a "
            "disagreement with the scheduler"
        )
    return tuple(out)


__all__ = [
    "DEFAULT_CDI_ANNOTATION_PREFIX",
    "DEFAULT_CDI_SPEC_DIR",
    "DEFAULT_HEALTH_PORT",
    "DEFAULT_IGNORED_XIDS",
    "DEFAULT_KUBELET_DIR",
    "ConfigError",
    "DeviceListStrategy",
    "FilterDevices",
    "HealthBind",
    "HealthChecks",
    "HelpRequested",
    "MigStrategy",
    "NodeArgumentParser",
    "NodeConfig",
    "OperatingMode",
    "XidList",
    "build_argument_parser",
    "load_config",
]
