"""The control plane's settings: one typed, frozen `ControlConfig`, filled from flags, environment, an
optional YAML (or JSON) file and defaults, in that order of precedence, and validated once at start-up.

`load_config(argv, env, read_file)` is pure: the caller passes the command line, the environment and a
function that reads a file, so tests drive every source without touching the process.

Names follow HAMi where HAMi has one: flags of `cmd/scheduler` (`--scheduler-name`,
`--force-overwrite-default-scheduler`, `--node-scheduler-policy`, `--gpu-scheduler-policy`,
`--default-mem`, `--default-cores`, `--default-gpu`, `--resource-name`, `--resource-mem`, ...) and, in the
file, the keys of HAMi's `NvidiaConfig` (`resourceCountName`, `defaultMemory`, `defaultGPUNum`,
`gpuCorePolicy`, `runtimeClassName`, `overwriteEnv`, `memoryFactor`, ...). The file is flat (HAMi's
`device-config.yaml` nests these under `nvidia:` among node settings; copy the ones you need). Environment
variables are `HAMI_<FLAG>` (`HAMI_SCHEDULER_NAME`), except `KUBECONFIG` and `CONFIG_FILE`; an empty
variable counts as unset.

Any bad value raises `ConfigError`, whose message names the source (command line, environment variable,
or file and line), the key and the value, e.g.
`control.yaml line 4: defaultCores: expected an integer from 0 to 100, got 150`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hami_api.annotations import decode_gpu_policy
from hami_api.errors import QuantityError, WireFormatError
from hami_api.quantity import parse_quantity
from hami_api.resources import RequestDefaults, ResourceNames
from hami_api.settings import (
    DNS_SUBDOMAIN,
    ConfigError,
    HelpRequested,
    Invalid,
    ListenAddress,
    LogLevel,
    Parser,
    parse_int,
    parse_listen_address,
    parse_number,
    parse_path,
    parse_qps,
    parse_resource_name,
    parse_text,
)
from hami_api.settings import parse_bool as _bool
from hami_api.settings import parse_enum as _enum
from hami_api.settings_loader import (
    Loaded,
    Setting,
    SettingsArgumentParser,
    SettingsLoader,
    dataclass_defaults,
)
from hami_api.types import CorePolicy, GPUPolicy, NodePolicy

if TYPE_CHECKING:
    from hami_control.devices.registry import Registry
from hami_control.connections import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TLS_HANDSHAKE_TIMEOUT_S,
    ConnectionLimits,
)
from hami_control.frag import MixError, TaskMix
from hami_control.frag_mix import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MIN_TASKS,
    DEFAULT_WINDOW,
    OBSERVED,
    OBSERVED_DEFAULT,
    LearningSettings,
    MixSetting,
    ObservedMix,
    configured_mix,
    parse_mix_setting,
)
from hami_kube.config import IN_CLUSTER_ENV
from hami_kube.election import LeaseSettings

# --- values ----------------------------------------------------------------------------------------------


class PrivilegedPolicy(StrEnum):
    """What the webhook does with a privileged container that asks for GPU resources. A privileged
    container sees every GPU of the node, so HAMi can neither share nor limit its GPU.

    - `deny` (HAMi >= 2.5): refuse the pod with a message saying why and what to do.
    - `skip` (HAMi <= 2.4): leave the container alone (no defaults, no env); the client gets a warning.
    """

    DENY = "deny"
    SKIP = "skip"


BindAddress = ListenAddress
"""Where the HTTPS server listens (`--bind`)."""

DEFAULT_BIND = ListenAddress("0.0.0.0", 9443)


MIB = 1024 * 1024
DEFAULT_MAX_REQUEST_BODY = 3 * MIB
"""kube-apiserver caps a request at 3 MiB, so no AdmissionReview it sends is larger (object + oldObject of
a 1.5 MiB etcd object stay below it)."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTPS server (webhook, extender, health and metrics routes)."""

    bind: BindAddress = DEFAULT_BIND
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    insecure_http: bool = False
    """Serve plain HTTP (local use only); otherwise both TLS files are required."""
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY
    """Bytes; a larger request body is answered 413."""
    header_read_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_read_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    tls_handshake_timeout_s: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """The connection limits (`hami_control.connections`, where each default is explained)."""

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            header_timeout_s=self.header_read_timeout_s,
            body_timeout_s=self.body_read_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            tls_handshake_timeout_s=self.tls_handshake_timeout_s,
            max_connections=self.max_connections,
        )


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """How a pod's GPU request is read, by the webhook, the extender and the quota alike: the resource
    names and the defaults `hami_api.resources` normalises requests with (`default_gpu_num`: the
    `nvidia.com/gpu` added to a container that asks only for gpumem / gpucores / gpumem-percentage;
    `default_memory`: MiB per GPU for a container that names neither gpumem nor gpumem-percentage, 0 =
    the whole GPU; `memory_factor`: gpumem is in units of this many MiB, HAMi's memoryFactor)."""

    names: ResourceNames = field(default_factory=ResourceNames)
    defaults: RequestDefaults = field(default_factory=RequestDefaults)


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """What the mutating webhook does to the pods it admits."""

    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    """Take over pods that name `default-scheduler` (an empty name is always taken over)."""
    core_policy: CorePolicy = CorePolicy.DEFAULT
    """GPU_CORE_UTILIZATION_POLICY for GPU containers; a pod's `hami.io/core-policy` annotation wins."""
    runtime_class_name: str | None = None
    """Set as `spec.runtimeClassName` of GPU pods that have none."""
    overwrite_env: bool = False
    """Give containers without a GPU `NVIDIA_VISIBLE_DEVICES=none`."""
    privileged_policy: PrivilegedPolicy = PrivilegedPolicy.DENY


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """Namespace GPU quotas."""

    enforce: bool = True
    """Check namespace ResourceQuotas (`limits.<gpumem>`, `limits.<gpucores>`) at admission and fit."""


class FragmentationFilter(StrEnum):
    """What /filter answers for a pod under the fragmentation node policy (docs/extender.md).

    - `all`: every node the pod fits on; kube-scheduler's score (its own + /prioritize) chooses.
    - `best`: only the fitting nodes where the node's fragmentation grows least, with each node's free
      CPU in the measure (allocatable less the requests of the pods on it) and each learned task shape
      with its pod's CPU request; kube-scheduler's score chooses among them (docs/planning.md, "A
      decisive extender").
    - `one`: the one fitting node of FGD's best score (the paper's simulator score over the learned mix
      with each shape's CPU and the CPU-only share, each node's free CPU in the measure), the first by
      name among equal ones, so kube-scheduler has nothing left to choose; and the second extender entry
      (`/cpu-filter`) answers the same for pods that ask no GPU (docs/planning.md, "The install")."""

    ALL = "all"
    BEST = "best"
    ONE = "one"

    @property
    def measures_cpu(self) -> bool:
        """Whether the measure takes each node's free CPU (and the learned shapes their pods' CPU)."""
        return self is not FragmentationFilter.ALL


class FailedNodes(StrEnum):
    """Which failed nodes /filter names (in `FailedNodes` / `FailedAndUnresolvableNodes`, each with its
    reason) when the pod fits somewhere (docs/extender.md, "Failed nodes").

    - `when-none-fit` (the default): only when no candidate fits. kube-scheduler reads an extender's
      failed nodes into the pod's node statuses (`findNodesThatPassExtenders`,
      pkg/scheduler/schedule_one.go), which only a pod left with no feasible node uses (its FitError,
      the FailedScheduling event's "0/N nodes are available", and preemption); with a feasible node
      `schedulePod` only counts them in a log line's `evaluatedNodes`. A hard pod's answer at 5,000
      nodes shrinks from ~300 KB to the fitting nodes' names.
    - `always`: every failed node with its reason, as HAMi answers. Set it when another filtering
      extender comes after hami-control's in kube-scheduler's list and may leave the pod no node: the
      event and preemption then see hami-control's reasons too."""

    ALWAYS = "always"
    WHEN_NONE_FIT = "when-none-fit"


@dataclass(frozen=True, slots=True)
class SchedulingSettings:
    """The extender's default policies (a pod's `hami.io/node-scheduler-policy` and
    `hami.io/gpu-scheduler-policy` annotations win)."""

    node_policy: NodePolicy = NodePolicy.BINPACK
    gpu_policy: tuple[GPUPolicy, ...] = (GPUPolicy.SPREAD,)
    fragmentation_mix: MixSetting = OBSERVED_DEFAULT
    """The task mix the fragmentation policies measure against: fixed (`frag.parse_mix`), or learned from
    the GPU pods observed with a prior (`frag_mix.ObservedMix`, the default: OpenB's mix until enough
    pods were seen)."""
    fragmentation_mix_window: int = DEFAULT_WINDOW
    """Learned mix: the last this many GPU tasks (GPU containers) observed."""
    fragmentation_mix_min_tasks: int = DEFAULT_MIN_TASKS
    """Learned mix: the prior stays in use until the window holds this many tasks."""
    fragmentation_mix_interval_s: float = DEFAULT_INTERVAL_S
    """Learned mix: seconds between two recomputations, at least."""
    fragmentation_filter: FragmentationFilter = FragmentationFilter.ALL
    """`best`: /filter keeps only the least fragmenting nodes (`FragmentationFilter`)."""
    failed_nodes: FailedNodes = FailedNodes.WHEN_NONE_FIT
    """Whether /filter names the failed nodes of a pod that fits somewhere (`FailedNodes`)."""

    @property
    def configured_mix(self) -> TaskMix:
        """The fixed mix, or the learned one's prior (what a pod's ask gets without a learned mix)."""
        return configured_mix(self.fragmentation_mix)

    @property
    def mix_learning(self) -> LearningSettings | None:
        """How to learn the mix; None when it is fixed."""
        if not isinstance(self.fragmentation_mix, ObservedMix):
            return None
        return LearningSettings(
            window=self.fragmentation_mix_window,
            min_tasks=self.fragmentation_mix_min_tasks,
            interval_s=self.fragmentation_mix_interval_s,
            cpu=self.fragmentation_filter.measures_cpu,
            cpu_only=self.fragmentation_filter is FragmentationFilter.ONE,
        )


class DRATranslation(StrEnum):
    """Which GPU pods the webhook rewrites to Dynamic Resource Allocation claims
    (`dra_translate`, docs/dra.md).

    - `off`: none; `POST /webhook/dra` denies GPU pods with a message naming this setting.
    - `namespace`: the pods sent to `POST /webhook/dra`, the webhook entry whose namespaceSelector picks
      the namespaces labelled `hami.io/dra=enabled` (daemonset/overlays/dra); `/webhook` translates none.
    - `all`: every GPU pod, on both paths (a cluster whose GPU nodes all run hami-node in DRA mode).
    """

    OFF = "off"
    NAMESPACE = "namespace"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class DRASettings:
    """The webhook's translation of HAMi resources into ResourceClaims (`dra_translate`)."""

    translation: DRATranslation = DRATranslation.OFF
    gpu_memory: tuple[tuple[str, int], ...] = ()
    """(GPU model, memory in MiB) pairs: what a `gpumem-percentage` is a percentage of, for a pod whose
    `nvidia.com/use-gputype` picks models of one size (names as the ResourceSlices' `productName`)."""
    template_timeout_s: float = 2.0
    """Seconds an admission may spend creating the ResourceClaimTemplates it needs (the webhook's own
    timeout is 10 s in daemonset/overlays/dra)."""


@dataclass(frozen=True, slots=True)
class DeviceSettings:
    """The accelerators besides NVIDIA (HAMi's device config and its vendor flags)."""

    config_file: Path | None = None
    """HAMi's `device-config.yaml` (None: the chart's values, `hami_control/devices/device-config.yaml`)."""
    enable_ascend: bool = False
    enable_iluvatar: bool = False


@functools.cache
def _registry(
    settings: DeviceSettings, names: ResourceNames, defaults: RequestDefaults, text: str | None
) -> Registry:
    from hami_control.devices.config import load_device_config, parse_device_config
    from hami_control.devices.registry import RegistryOptions, build_registry

    if settings.config_file is None or text is None:
        config = load_device_config(None, lambda _: "")
    else:
        config = parse_device_config(text, str(settings.config_file))
    options = RegistryOptions(settings.enable_ascend, settings.enable_iluvatar, names, defaults)
    return build_registry(config, options)


def device_registry(
    settings: DeviceSettings = DeviceSettings(),
    requests: RequestSettings = RequestSettings(),
    text: str | None = None,
) -> Registry:
    """The vendor registry for these settings (`text`: the device config file's content, read by the
    caller). Built once per distinct input. Raises `ConfigError` naming the file, key and line."""
    return _registry(settings, requests.names, requests.defaults, text)


@dataclass(frozen=True, slots=True)
class BinderSettings:
    """The bind protocol's waits."""

    allocate_timeout_s: float = 30.0
    """Seconds a bound pod may stay unanswered by the node daemon (no `hami.io/bind-phase` success or
    failed) before the binder stops holding its node's pending window for it."""
    bind_wait_s: float = 10.0
    """Seconds a /bind waits for the node's pending window (or a foreign node lock) before it fails and
    kube-scheduler retries; keep it below the extender's httpTimeout (30 s in HAMi's chart)."""


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    """Leader election for the extender (a coordination.k8s.io Lease)."""

    enabled: bool = False
    """Elect one replica to answer the extender; every replica serves the webhook. Off: this process
    always answers (a single replica)."""
    namespace: str = "hami-system"
    lease: str = "hami-control"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def lease_settings(self, identity: str) -> LeaseSettings:
        """The `hami_kube.election` settings of this replica (`identity`: the Lease holder it writes)."""
        return LeaseSettings(
            namespace=self.namespace,
            name=self.lease,
            identity=identity,
            lease_duration_s=self.lease_duration_s,
            renew_deadline_s=self.renew_deadline_s,
            retry_period_s=self.retry_period_s,
        )


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """hami-control's Kubernetes client, and the replica it runs as."""

    kubeconfig: Path | None = None
    """None: the in-cluster service account."""
    credentials_env: tuple[tuple[str, str], ...] = ()
    """What the credentials loader reads of the environment when `kubeconfig` is None: KUBECONFIG and
    the API server's address in a pod (`hami_kube.config.IN_CLUSTER_ENV`), as (name, value)."""
    qps: float = 50.0
    """Client-side rate limit (requests per second, <= 0: none): kube-scheduler's default, since
    hami-control binds pods on its behalf; client-go's default 5 would hold an 80-pod burst's Bindings
    back for 15 s."""
    burst: int = 100
    """Requests allowed at once above `qps` (kube-scheduler's default)."""
    pod_name: str = ""
    """This replica's pod (the downward API's POD_NAME): the leader label goes on it, events name it as
    their source instance and the Lease holder starts with it; "" outside a pod."""
    pod_namespace: str = ""
    """This replica's namespace (the downward API's POD_NAMESPACE); "" outside a pod."""

    @property
    def environ(self) -> dict[str, str]:
        return dict(self.credentials_env)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Everything the control plane (webhook and scheduler extender) can be told, grouped by the part it
    configures."""

    server: ServerSettings = ServerSettings()
    requests: RequestSettings = RequestSettings()
    webhook: WebhookSettings = WebhookSettings()
    quota: QuotaSettings = QuotaSettings()
    scheduling: SchedulingSettings = SchedulingSettings()
    binder: BinderSettings = BinderSettings()
    election: ElectionSettings = ElectionSettings()
    kube: KubeSettings = KubeSettings()
    dra: DRASettings = DRASettings()
    devices: DeviceSettings = DeviceSettings()
    config_file: Path | None = None
    log_level: LogLevel = LogLevel.INFO
    warnings: tuple[str, ...] = ()
    """Settings given that have no effect in this configuration, one message each; logged at start-up."""
    device_config_text: str | None = field(default=None, repr=False)
    """The device config file's content as read at start-up (None: none given)."""

    @property
    def registry(self) -> Registry:
        """Every vendor in force (`hami_control.devices.registry`), NVIDIA first."""
        return device_registry(self.devices, self.requests, self.device_config_text)

    def with_settings(self, **changes: Any) -> ControlConfig:
        """A copy with some settings changed, named as in the settings table (`scheduler_name`,
        `enforce_quota`, `memory_factor`, `leader_elect_lease` ...; `resource_names` for all five
        resource names), for callers that configure hami-control in code (tests, benchmarks). Not
        validated beyond the types' own checks; raises `TypeError` for a name that is no setting."""
        groups: dict[str, Any] = {}
        for group, (_, fields) in _GROUPS.items():
            given = {f: changes.pop(name) for name, f in fields.items() if name in changes}
            if given:
                groups[group] = dataclasses.replace(getattr(self, group), **given)
        names = changes.pop("resource_names", self.requests.names)
        given = {name: changes.pop(name) for name in _REQUEST_DEFAULTS if name in changes}
        defaults = dataclasses.replace(self.requests.defaults, **given)
        if names is not self.requests.names or given:
            groups["requests"] = RequestSettings(names, defaults)
        unknown = set(changes) - {"config_file", "log_level", "warnings"}
        if unknown:
            raise TypeError(f"not hami-control settings: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **groups, **changes)


_GROUPS: dict[str, tuple[type, dict[str, str]]] = {
    "server": (ServerSettings, {n: n for n in (
        "bind", "tls_cert_file", "tls_key_file", "insecure_http", "max_request_body", "header_read_timeout_s",
        "body_read_timeout_s", "idle_timeout_s", "tls_handshake_timeout_s", "max_connections")}),
    "webhook": (WebhookSettings, {n: n for n in (
        "scheduler_name", "force_overwrite_default_scheduler", "core_policy", "runtime_class_name",
        "overwrite_env", "privileged_policy")}),
    "quota": (QuotaSettings, {"enforce_quota": "enforce"}),
    "scheduling": (SchedulingSettings, {
        "node_scheduler_policy": "node_policy", "gpu_scheduler_policy": "gpu_policy",
        "fragmentation_mix": "fragmentation_mix", "fragmentation_mix_window": "fragmentation_mix_window",
        "fragmentation_mix_min_tasks": "fragmentation_mix_min_tasks",
        "fragmentation_mix_interval_s": "fragmentation_mix_interval_s",
        "fragmentation_filter": "fragmentation_filter", "filter_failed_nodes": "failed_nodes"}),
    "binder": (BinderSettings, {"allocate_timeout_s": "allocate_timeout_s", "bind_wait_s": "bind_wait_s"}),
    "election": (ElectionSettings, {
        "leader_elect": "enabled", "leader_elect_namespace": "namespace", "leader_elect_lease": "lease",
        "leader_elect_lease_duration_s": "lease_duration_s",
        "leader_elect_renew_deadline_s": "renew_deadline_s",
        "leader_elect_retry_period_s": "retry_period_s"}),
    "kube": (KubeSettings, {
        "kubeconfig": "kubeconfig", "kube_api_qps": "qps", "kube_api_burst": "burst",
        "pod_name": "pod_name", "pod_namespace": "pod_namespace"}),
    "dra": (DRASettings, {
        "dra_translation": "translation", "dra_gpu_memory": "gpu_memory",
        "dra_template_timeout_s": "template_timeout_s"}),
    "devices": (DeviceSettings, {
        "device_config_file": "config_file", "enable_ascend": "enable_ascend",
        "enable_iluvatar": "enable_iluvatar"}),
}  # fmt: skip
"""ControlConfig's groups: group -> (its type, setting name -> its field). The request settings are
built apart (`parse_resource_names`, `_REQUEST_DEFAULTS`); the rest are ControlConfig's own fields."""

_REQUEST_DEFAULTS = ("default_gpu_num", "default_memory", "default_cores", "memory_factor")
"""Settings that are fields of `RequestDefaults` under their own names."""


def credentials_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `env` the credentials loader reads (`KubeSettings.credentials_env`)."""
    return tuple((name, env[name]) for name in ("KUBECONFIG", *IN_CLUSTER_ENV) if env.get(name))


def _setting_defaults() -> dict[str, Any]:
    """Each setting's default, by setting name (for --help and for checks of settings not given)."""
    defaults: dict[str, Any] = dataclass_defaults(ControlConfig)
    for group_type, fields in _GROUPS.values():
        of_group = dataclass_defaults(group_type)
        defaults |= {name: of_group[f] for name, f in fields.items() if f in of_group}
    request_defaults = RequestDefaults()
    defaults |= {name: getattr(request_defaults, name) for name in _REQUEST_DEFAULTS}
    return defaults


# --- parsers ---------------------------------------------------------------------------------------------

_INT32_MAX = 2**31 - 1


def _int(low: int, high: int = _INT32_MAX) -> Parser:
    return parse_int(low, high)


_object_name = parse_text("a lowercase DNS subdomain such as hami-system", DNS_SUBDOMAIN, 253)
_scheduler_name = parse_text(
    "a scheduler name (a lowercase DNS subdomain such as hami-scheduler)", DNS_SUBDOMAIN, 253
)
_runtime_class_name = parse_text(
    "a RuntimeClass name (a lowercase DNS subdomain), or empty for none", DNS_SUBDOMAIN, 253
)


def _runtime_class(value: object) -> str | None:
    """A RuntimeClass name; "" (HAMi's default in the file) or null means none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    parsed: str = _runtime_class_name(value)
    return parsed


def _gpu_policy(value: object) -> tuple[GPUPolicy, ...]:
    expected = "one or a comma chain of " + ", ".join(p.value for p in GPUPolicy)
    if not isinstance(value, str):
        raise Invalid(expected)
    try:
        return decode_gpu_policy(value)
    except WireFormatError:
        raise Invalid(expected) from None


def _mix(value: object) -> MixSetting:
    expected = (
        f"{OBSERVED}, {OBSERVED}:MIX (learned, MIX the prior) or a task mix MIX = [Nx]MILLI:WEIGHT,... "
        "(e.g. 1000:50,500:30,2x1000:20)"
    )
    if not isinstance(value, str):
        raise Invalid(expected)
    try:
        return parse_mix_setting(value)
    except MixError as err:
        raise Invalid(f"{expected}: {err}") from None


_path = parse_path
_bind = parse_listen_address
_resource_name = parse_resource_name
_seconds = parse_number(0, inclusive=False, expected="a number of seconds > 0, such as 30 or 2.5")
"""A positive, finite number of seconds, as a number or its decimal text ("30", "2.5")."""


def _byte_size(value: object) -> int:
    """Bytes as an integer or a quantity ("3Mi", "4M"): 1 KiB to 1 GiB."""
    expected = "a size in bytes from 1Ki to 1Gi, such as 3Mi or 3145728"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise Invalid(expected)
    try:
        size = parse_quantity(value.strip() if isinstance(value, str) else value)
    except QuantityError:
        raise Invalid(expected) from None
    if size.denominator != 1 or not 1024 <= size <= 1024 * MIB:
        raise Invalid(expected)
    return size.numerator


_GPU_MEMORY_EXPECTED = "GPU models with their memory in MiB (MODEL=MIB,MODEL=MIB, or a mapping in the file)"


def _gpu_memory(value: object) -> tuple[tuple[str, int], ...]:
    """`--dra-gpu-memory`: {model: MiB} in the file, "model=MiB,model=MiB" as text; models unique
    (ignoring case, as the use-gputype match does), sizes whole MiB >= 1."""
    if isinstance(value, str):
        pairs: list[tuple[object, object]] = []
        for part in value.split(","):
            if not part.strip():
                continue
            before, sep, after = part.rpartition("=")
            if not sep:
                raise Invalid(_GPU_MEMORY_EXPECTED)
            pairs.append((before, after))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise Invalid(_GPU_MEMORY_EXPECTED)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for raw_model, size in pairs:
        if not isinstance(raw_model, str) or not raw_model.strip() or "," in raw_model or "=" in raw_model:
            raise Invalid(_GPU_MEMORY_EXPECTED)
        name = raw_model.strip()
        if name.lower() in seen:
            raise Invalid(f"{_GPU_MEMORY_EXPECTED}, each model once ({name!r} is listed twice)")
        seen.add(name.lower())
        try:
            mib = parse_int(1, _INT32_MAX)(size)
        except Invalid:
            raise Invalid(f"{_GPU_MEMORY_EXPECTED}; {name}: a whole number of MiB >= 1") from None
        out.append((name, mib))
    return tuple(sorted(out))


# --- the settings ----------------------------------------------------------------------------------------


_SETTINGS: tuple[Setting, ...] = (
    Setting("config_file", "--config-file", "CONFIG_FILE", "", _path,
            "config file (YAML or JSON) with the settings below under their file keys", "FILE",
            default_text="none"),
    Setting("bind", "--bind", "HAMI_BIND", "bind", _bind, "address the HTTPS server listens on", "HOST:PORT"),
    Setting("tls_cert_file", "--tls-cert-file", "HAMI_TLS_CERT_FILE", "tlsCertFile", _path,
            "TLS certificate (PEM); reloaded when it changes", "FILE", default_text="none",
            relative_to_file=True),
    Setting("tls_key_file", "--tls-key-file", "HAMI_TLS_KEY_FILE", "tlsKeyFile", _path,
            "TLS private key (PEM); reloaded when it changes", "FILE", default_text="none",
            relative_to_file=True),
    Setting("insecure_http", "--insecure-http", "HAMI_INSECURE_HTTP", "insecureHttp", _bool,
            "serve plain HTTP instead of HTTPS (local use only)", "BOOL", optional_bool=True),
    Setting("scheduler_name", "--scheduler-name", "HAMI_SCHEDULER_NAME", "schedulerName", _scheduler_name,
            "schedulerName given to GPU pods", "NAME"),
    Setting("force_overwrite_default_scheduler", "--force-overwrite-default-scheduler",
            "HAMI_FORCE_OVERWRITE_DEFAULT_SCHEDULER", "forceOverwriteDefaultScheduler", _bool,
            "also take over GPU pods that name default-scheduler", "BOOL", optional_bool=True),
    Setting("default_gpu_num", "--default-gpu", "HAMI_DEFAULT_GPU", "defaultGPUNum", _int(1),
            "nvidia.com/gpu added to containers asking only for GPU memory or cores", "N"),
    Setting("default_memory", "--default-mem", "HAMI_DEFAULT_MEM", "defaultMemory", _int(0),
            "MiB per GPU when a container names no GPU memory; 0 = the whole GPU", "MIB"),
    Setting("default_cores", "--default-cores", "HAMI_DEFAULT_CORES", "defaultCores", _int(0, 100),
            "percent of a GPU's compute when a container names no gpucores", "PERCENT"),
    Setting("memory_factor", "--memory-factor", "HAMI_MEMORY_FACTOR", "memoryFactor", _int(1),
            "gpumem is counted in units of this many MiB", "N"),
    Setting("core_policy", "--gpu-core-policy", "HAMI_GPU_CORE_POLICY", "gpuCorePolicy", _enum(CorePolicy),
            "GPU_CORE_UTILIZATION_POLICY of GPU containers: default, force or disable", "POLICY"),
    Setting("runtime_class_name", "--runtime-class-name", "HAMI_RUNTIME_CLASS_NAME", "runtimeClassName",
            _runtime_class, "runtimeClassName given to GPU pods that have none", "NAME", default_text="none"),
    Setting("overwrite_env", "--overwrite-env", "HAMI_OVERWRITE_ENV", "overwriteEnv", _bool,
            "give containers without a GPU NVIDIA_VISIBLE_DEVICES=none", "BOOL", optional_bool=True),
    Setting("privileged_policy", "--privileged-policy", "HAMI_PRIVILEGED_POLICY", "privilegedPolicy",
            _enum(PrivilegedPolicy),
            "privileged containers asking for GPUs: deny the pod, or skip the container (HAMi <= 2.4)",
            "POLICY"),
    Setting("resource_count", "--resource-name", "HAMI_RESOURCE_NAME", "resourceCountName", _resource_name,
            "resource counting GPUs", "NAME", default_text="nvidia.com/gpu"),
    Setting("resource_memory", "--resource-mem", "HAMI_RESOURCE_MEM", "resourceMemoryName", _resource_name,
            "resource for GPU memory in MiB", "NAME", default_text="nvidia.com/gpumem"),
    Setting("resource_memory_percentage", "--resource-mem-percentage", "HAMI_RESOURCE_MEM_PERCENTAGE",
            "resourceMemoryPercentageName", _resource_name, "resource for GPU memory in percent", "NAME",
            default_text="nvidia.com/gpumem-percentage"),
    Setting("resource_cores", "--resource-cores", "HAMI_RESOURCE_CORES", "resourceCoreName", _resource_name,
            "resource for GPU compute in percent", "NAME", default_text="nvidia.com/gpucores"),
    Setting("resource_priority", "--resource-priority", "HAMI_RESOURCE_PRIORITY", "resourcePriorityName",
            _resource_name, "resource for the task priority (CUDA_TASK_PRIORITY)", "NAME",
            default_text="nvidia.com/priority"),
    Setting("enforce_quota", "--enforce-quota", "HAMI_ENFORCE_QUOTA", "enforceQuota", _bool,
            "check namespace ResourceQuotas limits.<gpumem> and limits.<gpucores>", "BOOL",
            optional_bool=True),
    Setting("node_scheduler_policy", "--node-scheduler-policy", "HAMI_NODE_SCHEDULER_POLICY",
            "nodeSchedulerPolicy", _enum(NodePolicy), "binpack, spread or fragmentation", "POLICY"),
    Setting("gpu_scheduler_policy", "--gpu-scheduler-policy", "HAMI_GPU_SCHEDULER_POLICY",
            "gpuSchedulerPolicy", _gpu_policy,
            "binpack, spread, topology-aware, numa, mutex or fragmentation (or a comma chain)", "POLICY",
            default_text="spread"),
    Setting("fragmentation_mix", "--fragmentation-mix", "HAMI_FRAGMENTATION_MIX", "fragmentationMix", _mix,
            "task mix of the fragmentation policies: observed (learned from the GPU pods seen), "
            "observed:MIX (learned, MIX until enough pods were seen) or a fixed MIX = [Nx]MILLI:WEIGHT,... "
            "(milli-GPUs per task shape; MILLI/CPU: with its pod's cores, for --fragmentation-filter best)",
            "MIX", default_text="observed, OpenB's GPU task mix until then"),
    Setting("fragmentation_mix_window", "--fragmentation-mix-window", "HAMI_FRAGMENTATION_MIX_WINDOW",
            "fragmentationMixWindow", _int(1, 1_000_000),
            "learned mix: from the last this many GPU tasks (GPU containers) observed", "TASKS",
            default_text=str(DEFAULT_WINDOW)),
    Setting("fragmentation_mix_min_tasks", "--fragmentation-mix-min-tasks",
            "HAMI_FRAGMENTATION_MIX_MIN_TASKS", "fragmentationMixMinTasks", _int(1, 1_000_000),
            "learned mix: the prior stays in use until this many GPU tasks were observed", "TASKS",
            default_text=str(DEFAULT_MIN_TASKS)),
    Setting("fragmentation_mix_interval_s", "--fragmentation-mix-interval", "HAMI_FRAGMENTATION_MIX_INTERVAL",
            "fragmentationMixInterval", _seconds, "learned mix: seconds between two recomputations",
            "SECONDS", default_text=f"{DEFAULT_INTERVAL_S:g}"),
    Setting("fragmentation_filter", "--fragmentation-filter", "HAMI_FRAGMENTATION_FILTER",
            "fragmentationFilter", _enum(FragmentationFilter),
            "fragmentation node policy: /filter answers all fitting nodes, or best: only the least "
            "fragmenting ones, node CPU in the measure", "FILTER", default_text="all"),
    Setting("filter_failed_nodes", "--filter-failed-nodes", "HAMI_FILTER_FAILED_NODES", "filterFailedNodes",
            _enum(FailedNodes),
            "which failed nodes /filter names with their reasons: when-none-fit (only for a pod that fits "
            "nowhere: all kube-scheduler reads) or always (as HAMi)", "WHEN", default_text="when-none-fit"),
    Setting("kubeconfig", "--kubeconfig", "KUBECONFIG", "kubeconfig", _path, "kubeconfig file", "FILE",
            default_text="in-cluster config", relative_to_file=True),
    Setting("kube_api_qps", "--kube-api-qps", "HAMI_KUBE_API_QPS", "kubeAPIQPS", parse_qps,
            "requests per second to the API server, client-side (0: no limit)", "QPS", default_text="50"),
    Setting("kube_api_burst", "--kube-api-burst", "HAMI_KUBE_API_BURST", "kubeAPIBurst", _int(1),
            "requests to the API server allowed at once above --kube-api-qps", "N", default_text="100"),
    Setting("log_level", "--log-level", "HAMI_LOG_LEVEL", "logLevel", _enum(LogLevel),
            "debug, info, warning or error", "LEVEL"),
    Setting("max_request_body", "--max-request-body", "HAMI_MAX_REQUEST_BODY", "maxRequestBody", _byte_size,
            "largest request body accepted (bytes or a quantity such as 3Mi)", "SIZE", default_text="3Mi"),
    Setting("header_read_timeout_s", "--header-read-timeout", "HAMI_HEADER_READ_TIMEOUT", "headerReadTimeout",
            _seconds, "seconds a connection may take to send a request's line and headers before it is "
            "closed (Go's ReadHeaderTimeout)", "SECONDS", default_text="15"),
    Setting("body_read_timeout_s", "--body-read-timeout", "HAMI_BODY_READ_TIMEOUT", "bodyReadTimeout",
            _seconds, "seconds a request's body may take to arrive after its headers (408 after it)",
            "SECONDS", default_text="30"),
    Setting("idle_timeout_s", "--idle-timeout", "HAMI_IDLE_TIMEOUT", "idleTimeout", _seconds,
            "seconds a kept-alive connection may stay idle between requests (Go's IdleTimeout)", "SECONDS",
            default_text="90"),
    Setting("tls_handshake_timeout_s", "--tls-handshake-timeout", "HAMI_TLS_HANDSHAKE_TIMEOUT",
            "tlsHandshakeTimeout", _seconds, "seconds a new connection may take to finish its TLS handshake",
            "SECONDS", default_text="10"),
    Setting("max_connections", "--max-connections", "HAMI_MAX_CONNECTIONS", "maxConnections",
            _int(1, 1_000_000), "open connections at most; a new one over it evicts the one waiting longest "
            "for its headers, or is refused when none waits", "N", default_text="1024"),
    Setting("allocate_timeout_s", "--allocate-timeout", "HAMI_ALLOCATE_TIMEOUT", "allocateTimeout", _seconds,
            "seconds a bound pod may wait for the node daemon's Allocate before its node takes the "
            "next pod with the same GPU count", "SECONDS", default_text="30"),
    Setting("bind_wait_s", "--bind-wait-timeout", "HAMI_BIND_WAIT_TIMEOUT", "bindWaitTimeout", _seconds,
            "seconds a bind waits for its node to be free before kube-scheduler retries it", "SECONDS",
            default_text="10"),
    Setting("leader_elect", "--leader-elect", "HAMI_LEADER_ELECT", "leaderElect", _bool,
            "elect one replica (a Lease) to answer the extender; all replicas serve the webhook", "BOOL",
            optional_bool=True, default_text="false"),
    Setting("leader_elect_namespace", "--leader-elect-namespace", "POD_NAMESPACE", "leaderElectNamespace",
            _object_name, "namespace of the leader Lease (the downward API's POD_NAMESPACE)", "NAMESPACE",
            default_text="hami-system"),
    Setting("pod_name", "--pod-name", "POD_NAME", "", _object_name,
            "this replica's pod (the downward API's POD_NAME): the leader label, event source", "NAME",
            default_text="none"),
    Setting("pod_namespace", "--pod-namespace", "POD_NAMESPACE", "", _object_name,
            "this replica's namespace (the downward API's POD_NAMESPACE)", "NAMESPACE", default_text="none"),
    Setting("leader_elect_lease", "--leader-elect-lease", "HAMI_LEADER_ELECT_LEASE", "leaderElectLease",
            _object_name, "name of the leader Lease", "NAME", default_text="hami-control"),
    Setting("leader_elect_lease_duration_s", "--leader-elect-lease-duration",
            "HAMI_LEADER_ELECT_LEASE_DURATION", "leaderElectLeaseDuration", _seconds,
            "seconds a lease lasts without renewal", "SECONDS", default_text="15"),
    Setting("leader_elect_renew_deadline_s", "--leader-elect-renew-deadline",
            "HAMI_LEADER_ELECT_RENEW_DEADLINE", "leaderElectRenewDeadline", _seconds,
            "seconds the leader keeps trying to renew before it steps down", "SECONDS", default_text="10"),
    Setting("leader_elect_retry_period_s", "--leader-elect-retry-period", "HAMI_LEADER_ELECT_RETRY_PERIOD",
            "leaderElectRetryPeriod", _seconds, "seconds between election attempts", "SECONDS",
            default_text="2"),
    Setting("dra_translation", "--dra-translation", "HAMI_DRA_TRANSLATION", "draTranslation",
            _enum(DRATranslation),
            "rewrite GPU pods to DRA ResourceClaims: off, namespace (pods of namespaces labelled "
            "hami.io/dra=enabled, sent to /webhook/dra) or all", "MODE"),
    Setting("dra_gpu_memory", "--dra-gpu-memory", "HAMI_DRA_GPU_MEMORY", "draGPUMemory", _gpu_memory,
            "GPU models' memory in MiB (MODEL=MIB,...), for gpumem-percentage under DRA", "MODEL=MIB,...",
            repeatable=True, default_text="none"),
    Setting("dra_template_timeout_s", "--dra-template-timeout", "HAMI_DRA_TEMPLATE_TIMEOUT",
            "draTemplateTimeout", _seconds,
            "seconds an admission may spend creating the ResourceClaimTemplates it needs", "SECONDS",
            default_text="2"),
    Setting("device_config_file", "--device-config-file", "HAMI_DEVICE_CONFIG_FILE", "deviceConfigFile",
            _path, "HAMi's device-config.yaml: the resource names and options of every vendor besides "
            "NVIDIA (a vendor whose section the file lacks is off)", "FILE",
            default_text="the chart's", relative_to_file=True),
    Setting("enable_ascend", "--enable-ascend", "HAMI_ENABLE_ASCEND", "enableAscend", _bool,
            "schedule Huawei Ascend NPUs (the vnpus: section)", "BOOL", optional_bool=True),
    Setting("enable_iluvatar", "--enable-iluvatar", "HAMI_ENABLE_ILUVATAR", "enableIluvatar", _bool,
            "schedule Iluvatar GPUs (the iluvatars: section)", "BOOL", optional_bool=True),
)  # fmt: skip

_RESOURCE_FIELDS = {
    "resource_count": "count",
    "resource_memory": "memory",
    "resource_memory_percentage": "memory_percentage",
    "resource_cores": "cores",
    "resource_priority": "priority",
}

_LOADER = SettingsLoader(
    _SETTINGS,
    prog="hami-control",
    description=(
        "hami-control: the mutating admission webhook and scheduler extender of hami-py. "
        "Precedence: flags > environment > config file > defaults."
    ),
    defaults=_setting_defaults(),
    mapping_example="schedulerName: hami-scheduler, ...",
)


def build_argument_parser(prog: str = "hami-control") -> SettingsArgumentParser:
    """The control plane's flags. Every flag defaults to "not given", so `load_config` can tell a flag
    from a default; the help shows each flag's environment variable and default. Boolean flags take an
    optional value (`--overwrite-env`, `--enforce-quota=false`)."""
    return _LOADER.argument_parser(prog)


def load_config(
    argv: Sequence[str], env: Mapping[str, str], read_file: Callable[[Path], str]
) -> ControlConfig:
    """Build and validate the config from the command line (without the program name), the environment
    and the config file named by --config-file / CONFIG_FILE (read through `read_file`).

    Raises `ConfigError` for any bad value or combination and `HelpRequested` for --help.
    """
    return _validated(_LOADER.load(argv, env, read_file), env, read_file)


def _validated(
    given: Loaded, env: Mapping[str, str], read_file: Callable[[Path], str] = Path.read_text
) -> ControlConfig:
    """The typed config, once the settings that must fit together do."""
    values = given.values_by_name()
    _check_tls(given)
    _check_leader_timing(given)
    _check_mix_learning(given)
    groups: dict[str, Any] = {}
    for group, (group_type, fields) in _GROUPS.items():
        groups[group] = group_type(**{f: values[name] for name, f in fields.items() if name in values})
    groups["kube"] = dataclasses.replace(groups["kube"], credentials_env=credentials_env(env))
    defaults = RequestDefaults(**{name: values[name] for name in _REQUEST_DEFAULTS if name in values})
    requests = RequestSettings(parse_resource_names(given), defaults)
    text = _device_config_text(groups["devices"], read_file)
    device_registry(groups["devices"], requests, text)  # a bad device config stops start-up here
    return ControlConfig(
        **groups,
        requests=requests,
        config_file=values.get("config_file"),
        log_level=values.get("log_level", LogLevel.INFO),
        warnings=_ignored_settings(given),
        device_config_text=text,
    )


def _device_config_text(settings: DeviceSettings, read_file: Callable[[Path], str]) -> str | None:
    path = settings.config_file
    if path is None:
        return None
    try:
        return read_file(path)
    except OSError as err:
        raise ConfigError(str(path), "", f"cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "", f"is not UTF-8 text ({err.reason})") from None


def parse_resource_names(given: Loaded) -> ResourceNames:
    """The five resource names, which must differ."""
    names = {attribute: given[name].value for name, attribute in _RESOURCE_FIELDS.items() if name in given}
    resource_names = ResourceNames(**names)
    by_value: dict[str, str] = {}
    for name, attribute in _RESOURCE_FIELDS.items():
        value = getattr(resource_names, attribute)
        if value in by_value:
            raise ConfigError(
                "configuration",
                name,
                f"{given.describe(name)} and {given.describe(by_value[value])} both name the resource "
                f"{value}; the five GPU resources need five different names",
            )
        by_value[value] = name
    return resource_names


def _check_tls(given: Loaded) -> None:
    """Both TLS files, or plain HTTP."""
    insecure = "insecure_http" in given and given["insecure_http"].value
    cert, key = given.get("tls_cert_file"), given.get("tls_key_file")
    if insecure and (cert or key):
        tls_file = cert or key
        assert tls_file is not None
        raise ConfigError(
            "configuration",
            "insecure_http",
            f"plain HTTP ({given.describe('insecure_http')}) was asked for together with a TLS file "
            f"({tls_file.where}): choose one",
        )
    if not insecure and (cert is None or key is None):
        if cert is None and key is None:
            reason = (
                "the server needs a TLS certificate and key: pass --tls-cert-file and --tls-key-file "
                "(or --insecure-http for local use)"
            )
        else:
            have, missing = ("certificate", "--tls-key-file") if cert else ("key", "--tls-cert-file")
            reason = f"a TLS {have} without its pair: pass {missing} too"
        raise ConfigError("configuration", "tls_cert_file", reason)


_LEADER_TIMING = (
    "leader_elect_lease_duration_s",
    "leader_elect_renew_deadline_s",
    "leader_elect_retry_period_s",
)


def _check_leader_timing(given: Loaded) -> None:
    """client-go's rules (tools/leaderelection/leaderelection.go, NewLeaderElector: lease duration >
    renew deadline > JitterFactor 1.2 x retry period), and a retry period of at least 1 s. Checked even
    without --leader-elect, so turning it on cannot fail."""
    defaults = _setting_defaults()
    lease, renew, retry = (given[n].value if n in given else defaults[n] for n in _LEADER_TIMING)
    if not lease > renew > 1.2 * retry or retry < 1:
        duration, deadline, period = (given.describe(n) for n in _LEADER_TIMING)
        raise ConfigError(
            "configuration",
            "leader_elect_lease_duration_s",
            f"leader election needs lease duration > renew deadline > 1.2 x retry period and a retry period "
            f"of at least 1 s; got {duration} = {lease}, {deadline} = {renew}, {period} = {retry}",
        )


_LEADER_SETTINGS = ("leader_elect_namespace", "leader_elect_lease", *_LEADER_TIMING)


_DRA_SETTINGS = ("dra_gpu_memory", "dra_template_timeout_s")

_MIX_LEARNING = ("fragmentation_mix_window", "fragmentation_mix_min_tasks", "fragmentation_mix_interval_s")


def _check_mix_learning(given: Loaded) -> None:
    """The learned mix's minimum fits in its window (checked even with a fixed mix, so switching to
    `observed` cannot fail)."""
    defaults = _setting_defaults()
    window, least = (given[n].value if n in given else defaults[n] for n in _MIX_LEARNING[:2])
    if least > window:
        raise ConfigError(
            "configuration",
            "fragmentation_mix_min_tasks",
            f"the learned task mix needs its minimum within its window; got "
            f"{given.describe('fragmentation_mix_min_tasks')} = {least} > "
            f"{given.describe('fragmentation_mix_window')} = {window}",
        )


def _ignored_settings(given: Loaded) -> tuple[str, ...]:
    """Settings given that change nothing: the leader election's without --leader-elect (its timings are
    still checked, so turning it on later cannot fail), the learned mix's with a fixed
    --fragmentation-mix, the DRA translation's with --dra-translation off.
    POD_NAMESPACE is not named: the downward API sets it in every pod."""
    out: list[str] = []
    if not ("leader_elect" in given and given["leader_elect"].value):
        for name in _LEADER_SETTINGS:
            setting = given.get(name)
            if setting is None or setting.where == "environment POD_NAMESPACE":
                continue
            out.append(f"{setting.where}: has no effect without --leader-elect")
    mix = given["fragmentation_mix"].value if "fragmentation_mix" in given else OBSERVED_DEFAULT
    if not isinstance(mix, ObservedMix):
        for name in _MIX_LEARNING:
            setting = given.get(name)
            if setting is not None:
                out.append(f"{setting.where}: has no effect with a fixed --fragmentation-mix (not observed)")
    translation = given["dra_translation"].value if "dra_translation" in given else DRATranslation.OFF
    if translation is DRATranslation.OFF:
        for name in _DRA_SETTINGS:
            setting = given.get(name)
            if setting is not None:
                out.append(f"{setting.where}: has no effect with --dra-translation off")
    return tuple(out)


ControlArgumentParser = SettingsArgumentParser
"""The parser `build_argument_parser` returns (the settings loader's)."""

__all__ = [
    "DEFAULT_MAX_REQUEST_BODY",
    "BindAddress",
    "ConfigError",
    "ControlArgumentParser",
    "ControlConfig",
    "DRASettings",
    "DRATranslation",
    "HelpRequested",
    "LogLevel",
    "PrivilegedPolicy",
    "build_argument_parser",
    "load_config",
]
