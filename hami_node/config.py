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

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from hami_api.dra import DRIVER as DEFAULT_DRA_DRIVER
from hami_api.mig_alloc import AllowedMigProfiles, MigAllowlistError, parse_mig_profile_allowlist
from hami_api.settings import (
    DNS_SUBDOMAIN,
    LISTEN_ADDRESS,
    MAX_INT_DIGITS,
    ConfigError,
    HelpRequested,
    Invalid,
    ListenAddress,
    LogLevel,
    parse_listen_address,
    parse_number,
    parse_path,
    parse_qps,
    parse_resource_name,
    parse_text,
)
from hami_api.settings import parse_bool as _bool
from hami_api.settings import parse_enum as _enum
from hami_api.settings import parse_int as _int
from hami_api.settings_loader import (
    Loaded,
    Overrides,
    Setting,
    SettingsArgumentParser,
    SettingsLoader,
    dataclass_defaults,
)
from hami_kube.config import IN_CLUSTER_ENV
from hami_node.gpu.select import GPUBackendKind
from hami_node.nvidia import config as nvidia_config
from hami_node.nvidia.config import DeviceListStrategy, HamiCoreSummary, MigStrategy, PluginConfig

# --- values --------------------------------------------------------------------------------------------


class DaemonMode(StrEnum):
    """How kubelet learns of this node's GPUs (`--mode`): the device plugin (the HAMi scheduler extender
    places pods, the node's inventory annotation tells it the GPUs) or Dynamic Resource Allocation
    (ResourceSlices, kube-scheduler allocates claims, a kubelet DRA plugin prepares them;
    `hami_node.dra`). One mode per node: the scheduler cannot see the device plugin's allocations, so
    GPUs served both ways would be handed out twice."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


class TaintEffect(StrEnum):
    """The effect of the taint an unhealthy GPU gets in its ResourceSlice (`--dra-taint-effect`):
    NoSchedule keeps new claims off it; NoExecute also evicts the pods whose claims use it
    (resource.k8s.io/v1 DeviceTaint)."""

    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class OperatingMode(StrEnum):
    """How containers share a GPU: HAMi-core's libvgpu.so limits, MIG instances created per container
    (HAMi v2.10's dynamic MIG, `hami_node.mig_manager`), or MPS (HAMi-core's limits plus a connection
    to an MPS control daemon run outside hami-node, which needs `mps_root`; see `hami_node.mps`)."""

    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


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


HealthBind = ListenAddress
"""Where the health endpoint (`hami_node.healthz`) listens (`--health-bind`)."""


DEFAULT_HEALTH_PORT = 9396
"""The port the DaemonSet gives `--health-bind` (next to HAMi's 9394 monitor and 9395 scheduler metrics)."""

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins/"
DEFAULT_KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
POD_RESOURCES_AUTO = "auto"
"""`--pod-resources-socket auto`: kubelet's PodResources socket next to its device-plugin directory, when
one is there at start-up."""
"""kubelet's plugin watcher directory (dynamic-resource-allocation kubeletplugin KubeletRegistryDir)."""
DEFAULT_KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
"""The parent of each DRA driver's own directory (kubeletplugin KubeletPluginsDir)."""
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
    mig_profile_allowlist: tuple[AllowedMigProfiles, ...] | None = None
    """`nvidia.migProfileAllowlist` of the device config file (`--device-config-file`, the file HAMi's
    device plugin reads at /device-config.yaml); None without a file: in operating mode mig every base
    profile of a GPU is offered."""
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
    kube_api_qps: float = 50.0
    """Client-side rate limit of the daemon's Kubernetes client (requests per second, 0: none):
    kubelet's default (kubeAPIQPS), whose per-pod path the daemon shares; client-go's default 5 held an
    80-pod burst on one node back for 14 s."""
    kube_api_burst: int = 100
    """Requests allowed at once above `kube_api_qps` (kubelet's kubeAPIBurst)."""
    in_cluster_env: tuple[tuple[str, str], ...] = ()
    """The variables of `hami_kube.config.IN_CLUSTER_ENV` the environment sets (the API server's address
    in a pod), as (name, value): what the credentials loader reads when `kubeconfig` is None."""
    config_file: Path | None = None
    health_recovery_seconds: float = 60.0
    """A GPU quiet and answering for this long is healthy again; 0 = never recover."""
    register_interval_seconds: float = 30.0
    """How often the node's inventory annotation is checked (and written if it changed)."""
    allocate_wait_seconds: float = 5.0
    """Bound on the one read of the node's pods an Allocate makes when the pod watch does not show the
    pod kubelet is admitting (Allocate never waits for the watch itself)."""
    pod_resources_socket: str = POD_RESOURCES_AUTO
    """kubelet's PodResources socket, read at each lookup of the pod kubelet is admitting
    (`hami_node.plugin.kubelet_pods`), which lets pods asking as many GPUs be bound to this node
    together (the node says so with `hami.io/node-pod-identification`); `POD_RESOURCES_AUTO`:
    `pod_resources_auto_path` when a socket is there at start-up; "": not read (pods asking as many GPUs
    are bound here one at a time)."""
    health_checks: HealthChecks = HealthChecks()
    log_level: LogLevel = LogLevel.INFO
    health_bind: HealthBind | None = None
    """Address of the HTTP health endpoint (GET /healthz, /readyz) and the metrics (GET /metrics); None =
    not served. Off by default so several daemons can share a machine (hami-sim); the DaemonSet sets it."""
    legacy_metrics: bool = True
    """Also export HAMi's legacy metric names (HostGPUMemoryUsage, vGPU_device_memory_usage_in_bytes, ...)
    beside its current ones, as HAMi's vGPU monitor does with --legacy-metrics (off there by default)."""
    priority_feedback: bool = True
    """Run HAMi's priority feedback on the containers' shared regions every 5 s, as HAMi's vGPU monitor
    does (`hami_node.monitor.feedback`)."""
    fake_container_usage: bool = True
    """With the fake backend: simulate HAMi-core in the containers Allocate answered for (region files
    with moving usage, `hami_node.monitor.simulate`), so the metrics show live values."""
    mode: DaemonMode = DaemonMode.DEVICE_PLUGIN
    """Device plugin or DRA (`hami_node.dra`); one per node."""
    kubelet_registry_dir: Path = Path(DEFAULT_KUBELET_REGISTRY_DIR)
    """DRA mode: kubelet's plugin watcher directory, where the registration socket goes."""
    kubelet_plugins_dir: Path = Path(DEFAULT_KUBELET_PLUGINS_DIR)
    """DRA mode: the directory holding `<driver>/dra.sock` (and the checkpoint and lock file beside it)."""
    dra_driver_name: str = DEFAULT_DRA_DRIVER
    """DRA mode: the driver name (ResourceSlice spec.driver, the plugin's registered name, the
    attribute domain); HAMi-DRA's by default."""
    dra_taint_effect: TaintEffect = TaintEffect.NO_SCHEDULE
    """DRA mode: the effect of the taint an unhealthy GPU gets in the ResourceSlice."""
    dra_rolling_update_uid: str | None = None
    """DRA mode: this daemon pod's UID, for socket names two instances can hold at once during a rolling
    update of the DaemonSet (`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`, calls serialized through a
    file lock); None: the plain names (see docs/node-daemon.md, "DRA mode")."""
    warnings: tuple[str, ...] = ()
    """Settings accepted for compatibility that have no effect in this configuration, one message each;
    the daemon logs them at start-up."""
    nvidia: PluginConfig | None = None
    """NVIDIA's modes (`hami_node.nvidia`): the effective configuration of NVIDIA's device plugin when
    `--config-file` names NVIDIA's config file (`version: v1`); None: HAMi's device plugin (or DRA)."""

    @property
    def socket_path(self) -> Path:
        return self.kubelet_dir / self.socket_name

    @property
    def dra(self) -> bool:
        return self.mode is DaemonMode.DRA

    @property
    def dra_plugin_dir(self) -> Path:
        """The driver's own directory: `<plugins dir>/<driver>` (dra.sock, checkpoint, lock file)."""
        return self.kubelet_plugins_dir / self.dra_driver_name

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / "kubelet.sock"

    @property
    def pod_resources_auto_path(self) -> Path:
        """Where kubelet serves its PodResources API next to the device-plugin directory:
        `<root-dir>/pod-resources/kubelet.sock` (kubelet's DefaultKubeletPodResourcesDirName)."""
        return self.kubelet_dir.parent / "pod-resources" / "kubelet.sock"

    @property
    def oversubscribed(self) -> bool:
        return self.device_memory_scaling > 1

    @property
    def uses_cdi(self) -> bool:
        """A cdi-* device-list strategy is on: GPUs are named by CDI device names (and a spec written)."""
        return any(s.is_cdi for s in self.device_list_strategy)

    @property
    def unsupported(self) -> str | None:
        """Why hami-node cannot run this configuration, or None. Operating mode mig is HAMi v2.10's
        dynamic MIG (`hami_node.mig_manager`); NVIDIA's MIG strategies are refused here until their
        own support lands."""
        if self.mig_strategy is not MigStrategy.NONE:
            return (
                f"operating mode {self.operating_mode.value!r} / MIG strategy {self.mig_strategy.value!r}: "
                "MIG is not supported by hami-node yet; use operating mode hami-core (or mps) and MIG "
                "strategy none"
            )
        return None


# --- parsers ---------------------------------------------------------------------------------------------


def _number(low: float, inclusive: bool) -> Callable[[object], float]:
    return parse_number(low, inclusive=inclusive)


def _items(value: object, expected: str) -> list[object]:
    """A list from a YAML list or a comma-separated string; blank items dropped."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list):
        return [item.strip() if isinstance(item, str) else item for item in value]
    raise Invalid(expected)


def _strategies(value: object) -> tuple[DeviceListStrategy, ...]:
    names = ", ".join(s.value for s in DeviceListStrategy)
    expected = f"one or more of {names} (a list or a comma-separated string)"
    out: list[DeviceListStrategy] = []
    for item in _items(value, expected):
        if not isinstance(item, str) or item not in DeviceListStrategy._value2member_map_:
            raise Invalid(expected)
        strategy = DeviceListStrategy(item)
        if strategy not in out:
            out.append(strategy)
    if not out:
        raise Invalid(expected)
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
            raise Invalid(expected)
        if isinstance(item, int) and item >= 0:
            xids.add(item)
        elif isinstance(item, str) and item.isascii() and item.isdigit() and len(item) <= MAX_INT_DIGITS:
            xids.add(int(item))
        else:
            raise Invalid(expected)
    return XidList(all=every, xids=frozenset(xids))


def _filter_devices(value: object) -> FilterDevices:
    """HAMi's `{uuid: [...], index: [...]}`, or a list / comma string mixing UUIDs and indexes."""
    expected = "GPU UUIDs and indexes: {uuid: [...], index: [...]} or a comma-separated list"
    uuids: list[str] = []
    indexes: list[int] = []
    if isinstance(value, dict):
        unknown = set(value) - {"uuid", "index"}
        if unknown:
            raise Invalid(expected)
        raw_uuids = value.get("uuid") or []
        raw_indexes = value.get("index") or []
        if not isinstance(raw_uuids, list) or not isinstance(raw_indexes, list):
            raise Invalid(expected)
        for u in raw_uuids:
            if not isinstance(u, str) or not u.strip():
                raise Invalid(expected)
            uuids.append(u.strip())
        for i in raw_indexes:
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise Invalid(expected)
            indexes.append(i)
    elif value is None:
        pass
    else:
        for item in _items(value, expected):
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                indexes.append(item)
            elif isinstance(item, str) and item.isascii() and item.isdigit() and len(item) <= MAX_INT_DIGITS:
                indexes.append(int(item))
            elif isinstance(item, str) and item and not item.startswith("-"):
                uuids.append(item)
            else:
                raise Invalid(expected)
    return FilterDevices(tuple(dict.fromkeys(uuids)), tuple(dict.fromkeys(indexes)))


_node_name_text = parse_text("a node name (a lowercase DNS subdomain)", DNS_SUBDOMAIN)


def _node_name(value: object) -> str:
    text: str = _node_name_text(value)
    if len(text) > 253:
        raise Invalid("a node name (a lowercase DNS subdomain, at most 253 characters)")
    return text


_absolute_path_text = parse_text("an absolute path")


def _hook_path(value: object) -> str:
    text: str = _absolute_path_text(value)
    if not text.startswith("/"):
        raise Invalid("an absolute path")
    return posixpath.normpath(text)


_path = parse_path
_resource_name = parse_resource_name
_file_name_text = parse_text("a file name without '/'")


def _socket_name(value: object) -> str:
    text: str = _file_name_text(value)
    if "/" in text or text in (".", ".."):
        raise Invalid("a file name without '/'")
    return text


def _cdi_prefix(value: object) -> str:
    expected = "an annotation key prefix such as cdi.k8s.io/"
    if not isinstance(value, str) or not value.endswith("/"):
        raise Invalid(expected)
    if not DNS_SUBDOMAIN.fullmatch(value[:-1]):
        raise Invalid(expected)
    return value


def _health_bind(value: object) -> HealthBind | None:
    """`host:port`, `[ipv6]:port` or `:port` (port 0..65535); "" (or null in the file) = not served."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_listen_address(value, LISTEN_ADDRESS + ', or "" for none')


def _device_config_allowlist(value: object) -> tuple[AllowedMigProfiles, ...]:
    """The `nvidia.migProfileAllowlist` of HAMi's device config file (YAML), checked as HAMi's
    ValidateMigProfileAllowlist (`hami_api.mig_alloc.parse_mig_profile_allowlist`)."""
    path = Path(_path(value))
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise Invalid(f"a readable device config file ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise Invalid(f"a device config file in YAML ({str(err).splitlines()[0]})") from None
    nvidia = document.get("nvidia") if isinstance(document, dict) else None
    raw = nvidia.get("migProfileAllowlist") if isinstance(nvidia, dict) else None
    try:
        return parse_mig_profile_allowlist(raw)
    except MigAllowlistError as err:
        raise Invalid(f"a device config file with a valid allowlist ({path}: {err})") from None


_MODE_CHOICES = ", ".join(m.value for m in DaemonMode)


def _mode(value: object) -> DaemonMode:
    """`device-plugin` or `dra`. Anything naming both ("both", "device-plugin,dra", a list) is refused
    with the reason: one mode per node."""
    if isinstance(value, str) and value.strip() in DaemonMode._value2member_map_:
        return DaemonMode(value.strip())
    parts = _items(value, f"one of {_MODE_CHOICES}") if isinstance(value, str | list) else []
    if (isinstance(value, str) and value.strip().lower() in ("both", "all")) or len(parts) > 1:
        raise Invalid(
            f"one of {_MODE_CHOICES}: one mode per node, since the scheduler cannot see the device "
            "plugin's allocations and would hand the same GPUs out twice; choose device-plugin (the HAMi "
            "scheduler extender) or dra (ResourceSlices and claims)"
        )
    raise Invalid(f"one of {_MODE_CHOICES}")


_driver_name = parse_text(
    "a driver name (a lowercase DNS subdomain of at most 63 characters)", DNS_SUBDOMAIN, 63
)
_uid_text = parse_text("a pod UID (letters, digits and -)", re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*"), 128)


def _pod_resources_socket(value: object) -> str:
    """`auto`, an absolute path, or "" (or null in the file) for none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ""
    if isinstance(value, str) and value.strip() == POD_RESOURCES_AUTO:
        return POD_RESOURCES_AUTO
    expected = f'{POD_RESOURCES_AUTO}, an absolute path, or "" for none'
    if not isinstance(value, str) or not value.strip().startswith("/"):
        raise Invalid(expected)
    return posixpath.normpath(value.strip())


def _rolling_update_uid(value: object) -> str | None:
    """The pod's UID (the downward API's metadata.uid); "" (or null in the file) = rolling updates off."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text: str = _uid_text(value)
    return text


# --- the settings ----------------------------------------------------------------------------------------


_SETTINGS: tuple[Setting, ...] = (
    Setting("config_file", "--config-file", "CONFIG_FILE", "", _path,
            "config file (YAML or JSON), with HAMi's nodeconfig per-node overrides", "FILE"),
    Setting("node_name", "--node-name", "NODE_NAME", "nodeName", _node_name,
            "this node's name in the API server", "NAME", default_text="none, it is required"),
    Setting("device_split_count", "--device-split-count", "DEVICE_SPLIT_COUNT", "deviceSplitCount", _int(1),
            "virtual devices per GPU (containers that may share it)", "N", override_key="devicesplitcount"),
    Setting("device_memory_scaling", "--device-memory-scaling", "DEVICE_MEMORY_SCALING",
            "deviceMemoryScaling", _number(0, inclusive=False),
            "advertised GPU memory = real memory x this; above 1 oversubscribes", "X",
            override_key="devicememoryscaling"),
    Setting("device_cores_scaling", "--device-cores-scaling", "DEVICE_CORES_SCALING", "deviceCoreScaling",
            _number(0, inclusive=False), "advertised GPU compute = 100 x this", "X",
            override_key="devicecorescaling"),
    Setting("preconfigured_device_memory", "--preconfigured-device-memory",
            "HAMI_PRECONFIGURED_DEVICE_MEMORY", "preConfiguredDeviceMemory", _int(0),
            "MiB to advertise for GPUs whose memory NVML cannot tell (UMA); 0 = ask NVML", "MIB",
            override_key="preconfigureddevicememory"),
    Setting("enable_numa_topology", "--enable-numa-topology", "HAMI_ENABLE_NUMA_TOPOLOGY",
            "enableNumaTopology", _bool, "attach each GPU's NUMA node to its virtual devices", "BOOL",
            optional_bool=True, override_key="enablenumatopology"),
    Setting("enable_topology_score", "--enable-topology-score", "ENABLE_TOPOLOGY_SCORE",
            "enableTopologyScore", _bool,
            "publish the GPU pair link scores (hami.io/node-nvidia-score) for the topology-aware policy",
            "BOOL", optional_bool=True),
    Setting("lib_cuda_log_level", "--libcuda-log-level", "HAMI_LIBCUDA_LOG_LEVEL", "libCudaLogLevel",
            _int(0, 4), "LIBCUDA_LOG_LEVEL for containers (0 errors .. 4 debug)", "LEVEL",
            override_key="libcudaloglevel"),
    Setting("disable_core_limit", "--disable-core-limit", "DISABLE_CORE_LIMIT", "disableCoreLimit", _bool,
            "give containers GPU_CORE_UTILIZATION_POLICY=disable", "BOOL", optional_bool=True),
    Setting("operating_mode", "--operating-mode", "HAMI_OPERATING_MODE", "operatingMode",
            _enum(OperatingMode), "hami-core, mig or mps", "MODE", override_key="operatingmode"),
    Setting("mig_strategy", "--mig-strategy", "MIG_STRATEGY", "migStrategy", _enum(MigStrategy),
            "none, single or mixed", "STRATEGY", override_key="migstrategy"),
    Setting("mig_profile_allowlist", "--device-config-file", "HAMI_DEVICE_CONFIG_FILE", "deviceConfigFile",
            _device_config_allowlist, "HAMi's device config (its nvidia.migProfileAllowlist is read, for "
            "operating mode mig)", "FILE"),
    Setting("enable_get_preferred_allocation", "--enable-get-preferred-allocation",
            "HAMI_ENABLE_GET_PREFERRED_ALLOCATION", "enableGetPreferredAllocation", _bool,
            "HAMi compatibility, no effect: Allocate always answers with the GPUs kubelet records", "BOOL",
            optional_bool=True, override_key="enablegetpreferredallocation"),
    Setting("filter_devices", "--filter-devices", "HAMI_FILTER_DEVICES", "filterDevices", _filter_devices,
            "GPUs not to advertise: comma-separated UUIDs and/or indexes", "LIST", default_text="none",
            override_key="filterdevices"),
    Setting("device_list_strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY", "deviceListStrategy",
            _strategies,
            "envvar, volume-mounts, cdi-annotations and/or cdi-cri (comma-separated or repeated)", "STRATEGY",
            repeatable=True, default_text="envvar"),
    Setting("cdi_annotation_prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
            "cdiAnnotationPrefix", _cdi_prefix, "prefix of the CDI annotation key", "PREFIX"),
    Setting("cdi_spec_dir", "--cdi-spec-dir", "HAMI_CDI_SPEC_DIR", "cdiSpecDir", _path,
            "directory of the CDI spec written for the cdi-annotations and cdi-cri strategies", "DIR"),
    Setting("mps_root", "--mps-root", "MPS_ROOT", "mpsRoot", _hook_path,
            "host directory of the MPS control daemon's pipe and shm directories (operating mode mps)", "DIR",
            default_text="none"),
    Setting("hook_path", "--hook-path", "HOOK_PATH", "hookPath", _hook_path,
            "directory holding vgpu/libvgpu.so on the host and in containers", "DIR"),
    Setting("kubelet_dir", "--kubelet-dir", "HAMI_KUBELET_DIR", "kubeletDir", _path,
            "kubelet's device-plugin directory (kubelet.sock and the plugin socket)", "DIR",
            default_text=DEFAULT_KUBELET_DIR),
    Setting("resource_name", "--resource-name", "HAMI_RESOURCE_NAME", "resourceName", _resource_name,
            "the resource advertised to kubelet", "NAME"),
    Setting("socket_name", "--socket-name", "HAMI_SOCKET_NAME", "socketName", _socket_name,
            "the plugin's socket file name inside the kubelet directory", "NAME"),
    Setting("gpu_backend", "--gpu-backend", "HAMI_GPU_BACKEND", "gpuBackend", _enum(GPUBackendKind),
            "nvml (the real driver) or fake (an inventory file)", "BACKEND"),
    Setting("fake_inventory", "--fake-inventory", "HAMI_FAKE_INVENTORY", "fakeInventory", _path,
            "inventory file of the fake backend (YAML or JSON)", "FILE", relative_to_file=True),
    Setting("kube_api_qps", "--kube-api-qps", "HAMI_KUBE_API_QPS", "kubeAPIQPS", parse_qps,
            "requests per second to the API server, client-side (0: no limit)", "QPS", default_text="50"),
    Setting("kube_api_burst", "--kube-api-burst", "HAMI_KUBE_API_BURST", "kubeAPIBurst", _int(1),
            "requests to the API server allowed at once above --kube-api-qps", "N"),
    Setting("kubeconfig", "--kubeconfig", "KUBECONFIG", "kubeconfig", _path, "kubeconfig file", "FILE",
            default_text="in-cluster config", relative_to_file=True),
    Setting("health_recovery_seconds", "--health-recovery-seconds", "HAMI_HEALTH_RECOVERY_SECONDS",
            "healthRecoverySeconds", _number(0, inclusive=True),
            "an unhealthy GPU quiet and answering this long is healthy again; 0 = never", "SECONDS"),
    Setting("register_interval_seconds", "--register-interval-seconds", "HAMI_REGISTER_INTERVAL_SECONDS",
            "registerIntervalSeconds", _number(0, inclusive=False),
            "how often the node's GPU inventory annotation is checked", "SECONDS"),
    Setting("allocate_wait_seconds", "--allocate-wait-seconds", "HAMI_ALLOCATE_WAIT_SECONDS",
            "allocateWaitSeconds", _number(0, inclusive=True),
            "bound on the API read an Allocate makes for a pod the watch does not show yet", "SECONDS"),
    Setting("pod_resources_socket", "--pod-resources-socket", "HAMI_POD_RESOURCES_SOCKET",
            "podResourcesSocket", _pod_resources_socket,
            "kubelet's PodResources socket, read to tell which pod kubelet is admitting (pods asking as many "
            "GPUs may then be bound to the node together); auto: <kubelet dir>/../pod-resources/kubelet.sock "
            "if there at start-up; \"\" = not read", "PATH", default_text=POD_RESOURCES_AUTO),
    Setting("log_level", "--log-level", "HAMI_LOG_LEVEL", "logLevel", _enum(LogLevel),
            "the daemon's log level: debug, info, warning or error", "LEVEL"),
    Setting("health_bind", "--health-bind", "HAMI_HEALTH_BIND", "healthBind", _health_bind,
            "address of the HTTP health endpoint (GET /healthz, /readyz, /metrics); \"\" = none", "HOST:PORT",
            default_text="none; the DaemonSet uses 0.0.0.0:9396"),
    Setting("legacy_metrics", "--legacy-metrics", "HAMI_LEGACY_METRICS", "legacyMetrics", _bool,
            "also export HAMi's legacy metric names (HostGPUMemoryUsage, vGPU_device_memory_usage_in_bytes, "
            "...) at /metrics", "BOOL"),
    Setting("priority_feedback", "--priority-feedback", "HAMI_PRIORITY_FEEDBACK", "priorityFeedback", _bool,
            "switch low-priority containers' core limits while a higher-priority one runs on the GPU "
            "(HAMi's vGPU monitor feedback, through HAMi-core's shared regions)", "BOOL"),
    Setting("fake_container_usage", "--fake-container-usage", "HAMI_FAKE_CONTAINER_USAGE",
            "fakeContainerUsage", _bool,
            "fake backend: write simulated HAMi-core usage for allocated containers", "BOOL"),
    Setting("mode", "--mode", "HAMI_MODE", "mode", _mode,
            "how kubelet gets the GPUs: device-plugin or dra (one mode per node)", "MODE",
            override_key="mode"),
    Setting("kubelet_registry_dir", "--kubelet-registry-dir", "HAMI_KUBELET_REGISTRY_DIR",
            "kubeletRegistryDir", _path, "DRA mode: kubelet's plugin registration directory", "DIR",
            default_text=DEFAULT_KUBELET_REGISTRY_DIR),
    Setting("kubelet_plugins_dir", "--kubelet-plugins-dir", "HAMI_KUBELET_PLUGINS_DIR", "kubeletPluginsDir",
            _path, "DRA mode: kubelet's plugins directory (holds <driver>/dra.sock)", "DIR",
            default_text=DEFAULT_KUBELET_PLUGINS_DIR),
    Setting("dra_driver_name", "--dra-driver-name", "HAMI_DRA_DRIVER_NAME", "draDriverName", _driver_name,
            "DRA mode: the driver name (ResourceSlices, registration, attribute domain)", "NAME"),
    Setting("dra_taint_effect", "--dra-taint-effect", "HAMI_DRA_TAINT_EFFECT", "draTaintEffect",
            _enum(TaintEffect), "DRA mode: effect of an unhealthy GPU's taint: NoSchedule or NoExecute",
            "EFFECT"),
    Setting("dra_rolling_update_uid", "--dra-rolling-update-uid", "HAMI_DRA_ROLLING_UPDATE_UID",
            "draRollingUpdateUID", _rolling_update_uid,
            "DRA mode: this pod's UID, for per-instance socket names during a rolling update (kubelet "
            ">= 1.33); \"\" = the plain names", "UID", default_text="none"),
    Setting("disable_healthchecks", "--disable-healthchecks", "DP_DISABLE_HEALTHCHECKS",
            "disableHealthchecks", _xids, "all/xids, or Xids to ignore on top of 13,31,43,45,68,109", "XIDS",
            default_text="none"),
    Setting("enable_healthchecks", "--enable-healthchecks", "DP_ENABLE_HEALTHCHECKS", "enableHealthchecks",
            _xids, "all, or Xids always acted on (overrides the ignored ones)", "XIDS", default_text="none"),
)  # fmt: skip

_LOADER = SettingsLoader(
    _SETTINGS,
    prog="hami-node",
    description=(
        "hami-node: the GPU node daemon of hami-py (kubelet device plugin, GPU health, node "
        "inventory). Precedence: flags > environment > config file (nodeconfig entry for this "
        "node over the file's keys) > defaults."
    ),
    defaults=dataclass_defaults(NodeConfig),
    mapping_example="deviceSplitCount: 10, ...",
    overrides=Overrides(section="nodeconfig", selector="node_name", parse_name=_node_name, instance="node"),
)


def build_argument_parser(prog: str = "hami-node") -> SettingsArgumentParser:
    """The daemon's flags. Every flag defaults to "not given", so `load_config` can tell a flag from a
    default; the help shows each flag's environment variable and default."""
    return _LOADER.argument_parser(prog)


def load_config(argv: Sequence[str], env: Mapping[str, str], read_file: Callable[[Path], str]) -> NodeConfig:
    """Build and validate the daemon's config from the command line (without the program name), the
    environment and the config file named by --config-file / CONFIG_FILE (read through `read_file`).

    Raises `ConfigError` for any bad value and `HelpRequested` for --help.
    """
    nvidia_only, shared, hami_only = split_nvidia_argv(argv)
    nvidia_file = _nvidia_config_file(shared, env, read_file)
    if nvidia_file is not None:
        return _load_nvidia_mode(nvidia_only, shared, hami_only, env, read_file)
    if nvidia_only:
        flag = nvidia_only[0].partition("=")[0]
        raise ConfigError(
            "command line", flag,
            "is a flag of NVIDIA's device plugin, which hami-node serves when --config-file (CONFIG_FILE) "
            "names NVIDIA's config file (version: v1); give that file, or drop the flag to run HAMi's "
            "device plugin",
        )  # fmt: skip
    given = _LOADER.load([*shared, *hami_only], env, read_file)
    values = _check_common(given)
    _check_mps(given, values)
    mode_warnings = _check_mode(given, values)
    health = HealthChecks(
        disabled=values.pop("disable_healthchecks", XidList()),
        enabled=values.pop("enable_healthchecks", XidList()),
    )
    in_cluster = tuple((name, env[name]) for name in IN_CLUSTER_ENV if env.get(name))
    warnings = (*_ignored_settings(given, values), *mode_warnings)
    return NodeConfig(**values, health_checks=health, in_cluster_env=in_cluster, warnings=warnings)


def _check_common(given: Loaded) -> dict[str, Any]:
    """The node name and the GPU backend's inventory, in every mode; the given values by name."""
    if "node_name" not in given:
        raise ConfigError(
            "configuration",
            "node_name",
            "this node's name is not set: pass --node-name or set NODE_NAME (or nodeName in the file)",
        )
    values = given.values_by_name()
    backend = values.get("gpu_backend", GPUBackendKind.NVML)
    if backend is GPUBackendKind.FAKE and "fake_inventory" not in values:
        raise ConfigError(
            "configuration", "fake_inventory",
            f"the fake GPU backend ({given.describe('gpu_backend')}) needs an inventory file: pass "
            "--fake-inventory or set HAMI_FAKE_INVENTORY",
        )  # fmt: skip
    if backend is GPUBackendKind.NVML and "fake_inventory" in values:
        raise ConfigError(
            "configuration", "gpu_backend",
            f"a fake inventory ({given.describe('fake_inventory')}) is only used with the fake GPU "
            "backend: choose --gpu-backend fake or drop the inventory",
        )  # fmt: skip
    return values


# --- NVIDIA's modes --------------------------------------------------------------------------------------

_NVIDIA_SETTINGS = {s.flag: s for s in nvidia_config.NVIDIA_FLAG_SETTINGS}
_HAMI_FLAGS = frozenset(s.flag for s in _SETTINGS)
_SHARED_FLAGS = frozenset(_NVIDIA_SETTINGS) & _HAMI_FLAGS
"""Flags both NVIDIA's plugin and hami-node read (--config-file, --mig-strategy, --device-list-strategy,
--cdi-annotation-prefix, --mps-root): NVIDIA's in NVIDIA's modes, hami-node's otherwise."""
_SHARED_ENV = frozenset(_NVIDIA_SETTINGS[f].env for f in _SHARED_FLAGS if _NVIDIA_SETTINGS[f].env)
_NVIDIA_FILE_KEYS = ("version", "flags", "sharing", "resources", "imex")
"""Top-level keys of NVIDIA's config file v1; none is a hami-node setting."""
_HAMI_CORE_SLICING = (
    "device_split_count",
    "device_memory_scaling",
    "device_cores_scaling",
    "preconfigured_device_memory",
    "disable_core_limit",
)
"""hami-node's settings that slice GPUs with HAMi-core: refused beside NVIDIA's sharing on one node."""


def split_nvidia_argv(argv: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """The command line split into NVIDIA's own flags (with their values), the flags both read, and the
    rest (hami-node's). A value is the next argument unless written `--flag=value`; an optional-value
    flag (`--fail-on-init-error`) takes the next argument only when it is not a flag."""
    nvidia: list[str] = []
    shared: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, _ = arg.partition("=")
        setting = _NVIDIA_SETTINGS.get(name) if arg.startswith("--") else None
        if setting is None:
            rest.append(arg)
            i += 1
            continue
        taken = [arg]
        if not eq and i + 1 < len(argv):
            following = argv[i + 1]
            if not setting.optional_bool or not following.startswith("-"):
                taken.append(following)
        (shared if name in _SHARED_FLAGS else nvidia).extend(taken)
        i += len(taken)
    return nvidia, shared, rest


def _nvidia_config_file(
    shared: Sequence[str], env: Mapping[str, str], read_file: Callable[[Path], str]
) -> Path | None:
    """The config file when it is NVIDIA's (a mapping with a key of NVIDIA's config file v1), else None
    (no file, hami-node's own file, or one that does not read or parse: hami-node's loader then says
    what is wrong with it)."""
    named = env.get("CONFIG_FILE", "").strip() or None
    for i, arg in enumerate(shared):
        if arg == "--config-file" and i + 1 < len(shared):
            named = shared[i + 1]
        elif arg.startswith("--config-file="):
            named = arg.partition("=")[2]
    if not named:
        return None
    try:
        document = yaml.safe_load(read_file(Path(named)))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if isinstance(document, dict) and any(key in document for key in _NVIDIA_FILE_KEYS):
        return Path(named)
    return None


def _load_nvidia_mode(
    nvidia_only: Sequence[str],
    shared: Sequence[str],
    hami_only: Sequence[str],
    env: Mapping[str, str],
    read_file: Callable[[Path], str],
) -> NodeConfig:
    """NVIDIA's modes: NVIDIA's flags, environment and config file through NVIDIA's loader
    (`hami_node.nvidia.config.load_config`: its precedence, its validation texts), hami-node's own
    settings (node name, GPU backend, kubelet directory, health, logging) through hami-node's, without
    a file. HAMi-core slicing on the same GPUs is refused (`check_exclusive_with_hami_core`)."""
    hami_env = {k: v for k, v in env.items() if k not in _SHARED_ENV}
    given = _LOADER.load(hami_only, hami_env, read_file)
    values = _check_common(given)
    nvidia = nvidia_config.load_config([*shared, *nvidia_only], env, read_file)
    source = nvidia.config_file or "NVIDIA's config file"
    if values.get("mode", DaemonMode.DEVICE_PLUGIN) is DaemonMode.DRA:
        raise ConfigError(
            "configuration", "mode",
            f"{given.describe('mode')} asks for DRA, but {source} is NVIDIA's device plugin config; one "
            "mode per node: drop --mode dra to serve NVIDIA's resources, or drop the file for DRA",
        )  # fmt: skip
    operating = values.get("operating_mode", OperatingMode.HAMI_CORE)
    slicing = {name: given[name].where for name in _HAMI_CORE_SLICING if name in given}
    summary = HamiCoreSummary(operating.value, given.describe("operating_mode"), slicing)
    nvidia_config.check_exclusive_with_hami_core(nvidia, summary)
    warnings = list(nvidia.warnings)
    for name in (*slicing, *(["operating_mode"] if "operating_mode" in given else [])):
        warnings.append(
            f"{given.describe(name)}: no effect in NVIDIA's modes ({source}): kube-scheduler places pods "
            "on NVIDIA's whole GPUs, replicas or MIG devices"
        )
    values.pop("operating_mode", None)
    health = HealthChecks(
        disabled=values.pop("disable_healthchecks", XidList()),
        enabled=values.pop("enable_healthchecks", XidList()),
    )
    if nvidia.kubelet_socket != nvidia_config.DEFAULT_KUBELET_SOCKET and "kubelet_dir" not in given:
        values["kubelet_dir"] = Path(nvidia.kubelet_socket).parent
    values.update(
        config_file=Path(source),
        device_list_strategy=nvidia.flags.device_list_strategy,
        cdi_annotation_prefix=nvidia.flags.cdi_annotation_prefix,
        mps_root=nvidia.flags.mps_root or None,
    )
    in_cluster = tuple((name, env[name]) for name in IN_CLUSTER_ENV if env.get(name))
    return NodeConfig(
        **values, health_checks=health, in_cluster_env=in_cluster, warnings=tuple(warnings), nvidia=nvidia
    )


def _check_mps(given: Loaded, values: Mapping[str, Any]) -> None:
    """Operating mode mps needs an MPS root."""
    mode = values.get("operating_mode", OperatingMode.HAMI_CORE)
    if mode is OperatingMode.MPS and values.get("mps_root") is None:
        raise ConfigError(
            "configuration", "mps_root",
            f"operating mode mps ({given.describe('operating_mode')}) needs an MPS control daemon, "
            "which hami-node does not start: set --mps-root (MPS_ROOT, mpsRoot) to the host directory "
            "where it keeps <root>/<resource>/pipe and <root>/shm (NVIDIA's mps-control-daemon layout). "
            "HAMi v2.10 runs mps without a daemon, which is operating mode hami-core",
        )  # fmt: skip


_SERVES_DEVICE_PLUGIN = ("resource_name", "socket_name", "device_list_strategy", "cdi_annotation_prefix")
"""Settings that say how the device plugin is served to kubelet: given on the command line or in the
environment together with --mode dra they ask for both modes."""
_NO_EFFECT_IN_DRA = (
    "device_split_count",
    "device_cores_scaling",
    "enable_numa_topology",
    "enable_topology_score",
    "allocate_wait_seconds",
    "register_interval_seconds",
)
"""Device-plugin settings that change nothing in DRA mode (a DRA GPU is shared by consumable capacity,
not split count; no inventory annotation is written): a warning when set to a non-default value."""
_DRA_ONLY = (
    "kubelet_registry_dir",
    "kubelet_plugins_dir",
    "dra_driver_name",
    "dra_taint_effect",
    "dra_rolling_update_uid",
)


def _from_file(given: Loaded, name: str) -> bool:
    """Whether a setting came from the config file (a file shared by every node, whose nodeconfig may
    put other nodes in the other mode), not from this daemon's flags or environment."""
    where = given[name].where
    return not where.startswith(("flag ", "environment "))


def _check_mode(given: Loaded, values: Mapping[str, Any]) -> tuple[str, ...]:
    """One mode per node. Refuses flags or environment variables of the other mode (they mean both);
    the same settings from the shared config file, and device-plugin settings that do nothing in DRA
    mode, are warnings."""
    mode = values.get("mode", DaemonMode.DEVICE_PLUGIN)
    where = given.describe("mode")
    warnings: list[str] = []
    if mode is DaemonMode.DEVICE_PLUGIN:
        for name in _DRA_ONLY:
            if name not in given:
                continue
            if not _from_file(given, name):
                raise ConfigError(
                    "configuration", name,
                    f"{given.describe(name)} only applies in DRA mode, but the mode is device-plugin "
                    f"({where}); one mode per node: pass --mode dra (HAMI_MODE=dra) to serve this node's "
                    "GPUs through DRA, or drop it to keep the device plugin",
                )  # fmt: skip
            warnings.append(f"{given.describe(name)}: no effect, since the mode is device-plugin ({where})")
        return tuple(warnings)
    operating = values.get("operating_mode", OperatingMode.HAMI_CORE)
    if operating is OperatingMode.MPS:
        raise ConfigError(
            "configuration", "operating_mode",
            f"operating mode mps ({given.describe('operating_mode')}) is served by the device plugin "
            f"only, but the mode is dra ({where}): choose operating mode hami-core for DRA, or --mode "
            "device-plugin for MPS",
        )  # fmt: skip
    for name in _SERVES_DEVICE_PLUGIN:
        if name not in given:
            continue
        if not _from_file(given, name):
            flag = _LOADER.setting(name).flag
            raise ConfigError(
                "configuration", name,
                f"{given.describe(name)} configures the device plugin, but the mode is dra ({where}); "
                "one mode per node (the scheduler cannot see device-plugin allocations of GPUs DRA also "
                f"publishes): choose --mode device-plugin to serve the GPUs through the device plugin, "
                f"or drop {flag} to serve them through DRA",
            )  # fmt: skip
        warnings.append(f"{given.describe(name)}: no effect, since the mode is dra ({where})")
    defaults = dataclass_defaults(NodeConfig)
    for name in _NO_EFFECT_IN_DRA:
        if name in given and given[name].value != defaults[name]:
            warnings.append(f"{given.describe(name)}: no effect, since the mode is dra ({where})")
    return tuple(warnings)


def _ignored_settings(given: Loaded, values: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings given that change nothing in this configuration (kept for HAMi / NVIDIA compatibility,
    where they are accepted the same way), one warning each."""
    out: list[str] = []
    mode = values.get("operating_mode", OperatingMode.HAMI_CORE)
    if "mps_root" in given and mode is not OperatingMode.MPS:
        # A file shared by every node may set mpsRoot for the nodes its nodeconfig puts in mps mode.
        out.append(
            f"{given.describe('mps_root')}: the MPS root has no effect, since the operating mode is "
            f"{mode.value}, not mps"
        )
    strategies = values.get("device_list_strategy", (DeviceListStrategy.ENVVAR,))
    if "cdi_annotation_prefix" in given and DeviceListStrategy.CDI_ANNOTATIONS not in strategies:
        out.append(
            f"{given.describe('cdi_annotation_prefix')}: the CDI annotation prefix has no effect, since "
            "the device-list strategy does not include cdi-annotations"
        )
    if "enable_get_preferred_allocation" in given:
        out.append(
            f"{given.describe('enable_get_preferred_allocation')}: HAMi's switch between answering "
            "Allocate with the annotation's GPUs and with kubelet's has no effect: hami-node always steers "
            "kubelet with GetPreferredAllocation and answers with the GPUs kubelet records, refusing a "
            "disagreement with the scheduler"
        )
    return tuple(out)


NodeArgumentParser = SettingsArgumentParser
"""The parser `build_argument_parser` returns (the settings loader's)."""

__all__ = [
    "DEFAULT_CDI_ANNOTATION_PREFIX",
    "DEFAULT_CDI_SPEC_DIR",
    "DEFAULT_HEALTH_PORT",
    "DEFAULT_IGNORED_XIDS",
    "DEFAULT_KUBELET_DIR",
    "DEFAULT_KUBELET_PLUGINS_DIR",
    "DEFAULT_KUBELET_REGISTRY_DIR",
    "ConfigError",
    "DaemonMode",
    "DeviceListStrategy",
    "FilterDevices",
    "HealthBind",
    "HealthChecks",
    "HelpRequested",
    "MigStrategy",
    "NodeArgumentParser",
    "NodeConfig",
    "OperatingMode",
    "TaintEffect",
    "XidList",
    "build_argument_parser",
    "load_config",
    "split_nvidia_argv",
]
