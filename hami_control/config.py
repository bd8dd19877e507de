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

import argparse
import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import yaml

from hami_api.annotations import decode_gpu_policy
from hami_api.errors import QuantityError, WireFormatError
from hami_api.quantity import parse_quantity
from hami_api.resources import RequestDefaults, ResourceNames
from hami_api.settings import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from hami_api.settings import RESOURCE_NAME as _RESOURCE_NAME
from hami_api.settings import ConfigError, HelpRequested, LogLevel, parse_int
from hami_api.settings import Invalid as _Invalid
from hami_api.settings import parse_bool as _bool
from hami_api.settings import parse_enum as _enum
from hami_api.settings import shown as _shown
from hami_api.settings import suggest as _suggest
from hami_api.types import CorePolicy, GPUPolicy, NodePolicy

# --- values ----------------------------------------------------------------------------------------------


class PrivilegedPolicy(StrEnum):
    """What the webhook does with a privileged container that asks for GPU resources. A privileged
    container sees every GPU of the node, so HAMi can neither share nor limit its GPU.

    - `deny` (HAMi >= 2.5): refuse the pod with a message saying why and what to do.
    - `skip` (HAMi <= 2.4): leave the container alone (no defaults, no env); the client gets a warning.
    """

    DENY = "deny"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where the HTTPS server listens. `host` "" means every address; port 0 picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


MIB = 1024 * 1024
DEFAULT_MAX_REQUEST_BODY = 3 * MIB
"""kube-apiserver caps a request at 3 MiB, so no AdmissionReview it sends is larger (object + oldObject of
a 1.5 MiB etcd object stay below it)."""


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Everything the control plane (webhook and scheduler extender) can be told."""

    bind: BindAddress = BindAddress("0.0.0.0", 9443)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    insecure_http: bool = False
    """Serve plain HTTP (local use only); otherwise both TLS files are required."""
    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    """Take over pods that name `default-scheduler` (an empty name is always taken over)."""
    default_gpu_num: int = 1
    """`nvidia.com/gpu` added to a container that asks only for gpumem / gpucores / gpumem-percentage."""
    default_memory: int = 0
    """MiB per GPU for a container that names neither gpumem nor gpumem-percentage; 0 = the whole GPU."""
    default_cores: int = 0
    memory_factor: int = 1
    """gpumem is in units of this many MiB (HAMi's memoryFactor)."""
    core_policy: CorePolicy = CorePolicy.DEFAULT
    """GPU_CORE_UTILIZATION_POLICY for GPU containers; a pod's `hami.io/core-policy` annotation wins."""
    runtime_class_name: str | None = None
    """Set as `spec.runtimeClassName` of GPU pods that have none."""
    overwrite_env: bool = False
    """Give containers without a GPU `NVIDIA_VISIBLE_DEVICES=none`."""
    privileged_policy: PrivilegedPolicy = PrivilegedPolicy.DENY
    resource_names: ResourceNames = field(default_factory=ResourceNames)
    enforce_quota: bool = True
    """Check namespace ResourceQuotas (`limits.<gpumem>`, `limits.<gpucores>`) at admission and fit."""
    node_scheduler_policy: NodePolicy = NodePolicy.BINPACK
    gpu_scheduler_policy: tuple[GPUPolicy, ...] = (GPUPolicy.SPREAD,)
    kubeconfig: Path | None = None
    """None: in-cluster config."""
    config_file: Path | None = None
    log_level: LogLevel = LogLevel.INFO
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY
    """Bytes; a larger request body is answered 413."""
    allocate_timeout_s: float = 30.0
    """Seconds a bound pod may stay unanswered by the node daemon (no `hami.io/bind-phase` success or
    failed) before the binder stops holding its node's pending window for it."""
    bind_wait_s: float = 10.0
    """Seconds a /bind waits for the node's pending window (or a foreign node lock) before it fails and
    kube-scheduler retries; keep it below the extender's httpTimeout (30 s in HAMi's chart)."""
    leader_elect: bool = False
    """Elect one replica (a coordination.k8s.io Lease) to answer the extender; every replica serves the
    webhook. Off: this process always answers (a single replica)."""
    leader_elect_namespace: str = "hami-system"
    leader_elect_lease: str = "hami-control"
    leader_elect_lease_duration_s: float = 15.0
    leader_elect_renew_deadline_s: float = 10.0
    leader_elect_retry_period_s: float = 2.0
    pod_name: str = ""
    """This replica's pod (the downward API's POD_NAME): the leader label goes on it, events name it as
    their source instance and the Lease holder starts with it; "" outside a pod."""
    pod_namespace: str = ""
    """This replica's namespace (the downward API's POD_NAMESPACE); "" outside a pod."""
    warnings: tuple[str, ...] = ()
    """Settings given that have no effect in this configuration, one message each; logged at start-up."""
    request_defaults: RequestDefaults = field(init=False, repr=False, compare=False)
    """The defaults `hami_api.resources` normalises requests with (derived; built once, since every
    admission reads it)."""

    def __post_init__(self) -> None:
        defaults = RequestDefaults(
            default_memory=self.default_memory,
            default_cores=self.default_cores,
            default_gpu_num=self.default_gpu_num,
            memory_factor=self.memory_factor,
        )
        object.__setattr__(self, "request_defaults", defaults)


# --- errors ----------------------------------------------------------------------------------------------


_Parser = Callable[[object], Any]

_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")
_INT32_MAX = 2**31 - 1


def _int(low: int, high: int = _INT32_MAX) -> _Parser:
    return parse_int(low, high)


def _text(expected: str, pattern: re.Pattern[str] | None = None, max_len: int = 253) -> _Parser:
    def parse(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(expected)
        text = value.strip()
        if (pattern is not None and not pattern.fullmatch(text)) or len(text) > max_len:
            raise _Invalid(expected)
        return text

    return parse


_object_name = _text("a lowercase DNS subdomain such as hami-system", _DNS_SUBDOMAIN)
_scheduler_name = _text("a scheduler name (a lowercase DNS subdomain such as hami-scheduler)", _DNS_SUBDOMAIN)


def _runtime_class(value: object) -> str | None:
    """A RuntimeClass name; "" (HAMi's default in the file) or null means none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    parsed: str = _text("a RuntimeClass name (a lowercase DNS subdomain), or empty for none", _DNS_SUBDOMAIN)(
        value
    )
    return parsed


def _path(value: object) -> Path:
    return Path(_text("a path", max_len=4096)(value))


def _resource_name(value: object) -> str:
    expected = "an extended resource name outside kubernetes.io, such as nvidia.com/gpu"
    text: str = _text(expected, _RESOURCE_NAME)(value)
    domain = text.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise _Invalid(expected)
    return text


def _bind(value: object) -> BindAddress:
    """`host:port`, `[ipv6]:port` or `:port`; port 0..65535."""
    expected = "HOST:PORT, [IPv6]:PORT or :PORT with a port from 0 to 65535"
    if not isinstance(value, str):
        raise _Invalid(expected)
    text = value.strip()
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
    return BindAddress(host, int(port))


def _gpu_policy(value: object) -> tuple[GPUPolicy, ...]:
    expected = "one or a comma chain of " + ", ".join(p.value for p in GPUPolicy)
    if not isinstance(value, str):
        raise _Invalid(expected)
    try:
        return decode_gpu_policy(value)
    except WireFormatError:
        raise _Invalid(expected) from None


def _seconds(value: object) -> float:
    """A positive, finite number of seconds, as a number or its decimal text ("30", "2.5")."""
    expected = "a number of seconds > 0, such as 30 or 2.5"
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
    if not math.isfinite(number) or number <= 0:
        raise _Invalid(expected)
    return number


def _byte_size(value: object) -> int:
    """Bytes as an integer or a quantity ("3Mi", "4M"): 1 KiB to 1 GiB."""
    expected = "a size in bytes from 1Ki to 1Gi, such as 3Mi or 3145728"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _Invalid(expected)
    try:
        size = parse_quantity(value.strip() if isinstance(value, str) else value)
    except QuantityError:
        raise _Invalid(expected) from None
    if size.denominator != 1 or not 1024 <= size <= 1024 * MIB:
        raise _Invalid(expected)
    return size.numerator


# --- the settings ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Setting:
    name: str
    """ControlConfig field, or `resource_<field>` for one of the five ResourceNames."""
    flag: str
    env: str
    key: str
    """Key in the config file ("" = not allowed there)."""
    parse: _Parser
    help: str
    metavar: str = "VALUE"
    optional_bool: bool = False
    default_text: str = ""


_SETTINGS: tuple[_Setting, ...] = (
    _Setting("config_file", "--config-file", "CONFIG_FILE", "", _path,
             "config file (YAML or JSON) with the settings below under their file keys", "FILE", False,
             "none"),
    _Setting("bind", "--bind", "HAMI_BIND", "bind", _bind, "address the HTTPS server listens on",
             "HOST:PORT"),
    _Setting("tls_cert_file", "--tls-cert-file", "HAMI_TLS_CERT_FILE", "tlsCertFile", _path,
             "TLS certificate (PEM); reloaded when it changes", "FILE", False, "none"),
    _Setting("tls_key_file", "--tls-key-file", "HAMI_TLS_KEY_FILE", "tlsKeyFile", _path,
             "TLS private key (PEM); reloaded when it changes", "FILE", False, "none"),
    _Setting("insecure_http", "--insecure-http", "HAMI_INSECURE_HTTP", "insecureHttp", _bool,
             "serve plain HTTP instead of HTTPS (local use only)", "BOOL", True),
    _Setting("scheduler_name", "--scheduler-name", "HAMI_SCHEDULER_NAME", "schedulerName", _scheduler_name,
             "schedulerName given to GPU pods", "NAME"),
    _Setting("force_overwrite_default_scheduler", "--force-overwrite-default-scheduler",
             "HAMI_FORCE_OVERWRITE_DEFAULT_SCHEDULER", "forceOverwriteDefaultScheduler", _bool,
             "also take over GPU pods that name default-scheduler", "BOOL", True),
    _Setting("default_gpu_num", "--default-gpu", "HAMI_DEFAULT_GPU", "defaultGPUNum", _int(1),
             "nvidia.com/gpu added to containers asking only for GPU memory or cores", "N"),
    _Setting("default_memory", "--default-mem", "HAMI_DEFAULT_MEM", "defaultMemory", _int(0),
             "MiB per GPU when a container names no GPU memory; 0 = the whole GPU", "MIB"),
    _Setting("default_cores", "--default-cores", "HAMI_DEFAULT_CORES", "defaultCores", _int(0, 100),
             "percent of a GPU's compute when a container names no gpucores", "PERCENT"),
    _Setting("memory_factor", "--memory-factor", "HAMI_MEMORY_FACTOR", "memoryFactor", _int(1),
             "gpumem is counted in units of this many MiB", "N"),
    _Setting("core_policy", "--gpu-core-policy", "HAMI_GPU_CORE_POLICY", "gpuCorePolicy", _enum(CorePolicy),
             "GPU_CORE_UTILIZATION_POLICY of GPU containers: default, force or disable", "POLICY"),
    _Setting("runtime_class_name", "--runtime-class-name", "HAMI_RUNTIME_CLASS_NAME", "runtimeClassName",
             _runtime_class, "runtimeClassName given to GPU pods that have none", "NAME", False, "none"),
    _Setting("overwrite_env", "--overwrite-env", "HAMI_OVERWRITE_ENV", "overwriteEnv", _bool,
             "give containers without a GPU NVIDIA_VISIBLE_DEVICES=none", "BOOL", True),
    _Setting("privileged_policy", "--privileged-policy", "HAMI_PRIVILEGED_POLICY", "privilegedPolicy",
             _enum(PrivilegedPolicy),
             "privileged containers asking for GPUs: deny the pod, or skip the container (HAMi <= 2.4)",
             "POLICY"),
    _Setting("resource_count", "--resource-name", "HAMI_RESOURCE_NAME", "resourceCountName", _resource_name,
             "resource counting GPUs", "NAME", False, "nvidia.com/gpu"),
    _Setting("resource_memory", "--resource-mem", "HAMI_RESOURCE_MEM", "resourceMemoryName",
             _resource_name, "resource for GPU memory in MiB", "NAME", False, "nvidia.com/gpumem"),
    _Setting("resource_memory_percentage", "--resource-mem-percentage", "HAMI_RESOURCE_MEM_PERCENTAGE",
             "resourceMemoryPercentageName", _resource_name, "resource for GPU memory in percent", "NAME",
             False, "nvidia.com/gpumem-percentage"),
    _Setting("resource_cores", "--resource-cores", "HAMI_RESOURCE_CORES", "resourceCoreName",
             _resource_name, "resource for GPU compute in percent", "NAME", False, "nvidia.com/gpucores"),
    _Setting("resource_priority", "--resource-priority", "HAMI_RESOURCE_PRIORITY", "resourcePriorityName",
             _resource_name, "resource for the task priority (CUDA_TASK_PRIORITY)", "NAME", False,
             "nvidia.com/priority"),
    _Setting("enforce_quota", "--enforce-quota", "HAMI_ENFORCE_QUOTA", "enforceQuota", _bool,
             "check namespace ResourceQuotas limits.<gpumem> and limits.<gpucores>", "BOOL", True),
    _Setting("node_scheduler_policy", "--node-scheduler-policy", "HAMI_NODE_SCHEDULER_POLICY",
             "nodeSchedulerPolicy", _enum(NodePolicy), "binpack or spread", "POLICY"),
    _Setting("gpu_scheduler_policy", "--gpu-scheduler-policy", "HAMI_GPU_SCHEDULER_POLICY",
             "gpuSchedulerPolicy", _gpu_policy,
             "binpack, spread, topology-aware, numa or mutex (or a comma chain)", "POLICY", False, "spread"),
    _Setting("kubeconfig", "--kubeconfig", "KUBECONFIG", "kubeconfig", _path, "kubeconfig file", "FILE",
             False, "in-cluster config"),
    _Setting("log_level", "--log-level", "HAMI_LOG_LEVEL", "logLevel", _enum(LogLevel),
             "debug, info, warning or error", "LEVEL"),
    _Setting("max_request_body", "--max-request-body", "HAMI_MAX_REQUEST_BODY", "maxRequestBody", _byte_size,
             "largest request body accepted (bytes or a quantity such as 3Mi)", "SIZE", False, "3Mi"),
    _Setting("allocate_timeout_s", "--allocate-timeout", "HAMI_ALLOCATE_TIMEOUT", "allocateTimeout", _seconds,
             "seconds a bound pod may wait for the node daemon's Allocate before its node takes the "
             "next pod with the same GPU count", "SECONDS", False, "30"),
    _Setting("bind_wait_s", "--bind-wait-timeout", "HAMI_BIND_WAIT_TIMEOUT", "bindWaitTimeout",
             _seconds, "seconds a bind waits for its node to be free before kube-scheduler retries it",
             "SECONDS", False, "10"),
    _Setting("leader_elect", "--leader-elect", "HAMI_LEADER_ELECT", "leaderElect", _bool,
             "elect one replica (a Lease) to answer the extender; all replicas serve the webhook",
             "BOOL", True, "false"),
    _Setting("leader_elect_namespace", "--leader-elect-namespace", "POD_NAMESPACE", "leaderElectNamespace",
             _object_name, "namespace of the leader Lease (the downward API's POD_NAMESPACE)", "NAMESPACE",
             False, "hami-system"),
    _Setting("pod_name", "--pod-name", "POD_NAME", "", _object_name,
             "this replica's pod (the downward API's POD_NAME): the leader label, event source", "NAME",
             False, "none"),
    _Setting("pod_namespace", "--pod-namespace", "POD_NAMESPACE", "", _object_name,
             "this replica's namespace (the downward API's POD_NAMESPACE)", "NAMESPACE", False, "none"),
    _Setting("leader_elect_lease", "--leader-elect-lease", "HAMI_LEADER_ELECT_LEASE", "leaderElectLease",
             _object_name, "name of the leader Lease", "NAME", False, "hami-control"),
    _Setting("leader_elect_lease_duration_s", "--leader-elect-lease-duration",
             "HAMI_LEADER_ELECT_LEASE_DURATION", "leaderElectLeaseDuration", _seconds,
             "seconds a lease lasts without renewal", "SECONDS", False, "15"),
    _Setting("leader_elect_renew_deadline_s", "--leader-elect-renew-deadline",
             "HAMI_LEADER_ELECT_RENEW_DEADLINE", "leaderElectRenewDeadline", _seconds,
             "seconds the leader keeps trying to renew before it steps down", "SECONDS", False, "10"),
    _Setting("leader_elect_retry_period_s", "--leader-elect-retry-period", "HAMI_LEADER_ELECT_RETRY_PERIOD",
             "leaderElectRetryPeriod", _seconds, "seconds between election attempts", "SECONDS", False, "2"),
)  # fmt: skip

_BY_NAME = {s.name: s for s in _SETTINGS}
_BY_FILE_KEY = {s.key: s for s in _SETTINGS if s.key}
_RESOURCE_FIELDS = {
    "resource_count": "count",
    "resource_memory": "memory",
    "resource_memory_percentage": "memory_percentage",
    "resource_cores": "cores",
    "resource_priority": "priority",
}
_PATHS_RELATIVE_TO_FILE = frozenset({"tls_cert_file", "tls_key_file", "kubeconfig"})


def _default_text(setting: _Setting) -> str:
    if setting.default_text:
        return setting.default_text
    value = ControlConfig.__dataclass_fields__[setting.name].default
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- command line ----------------------------------------------------------------------------------------


class ControlArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting: `ConfigError` for a bad command line,
    `HelpRequested` for --help."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError("command line", "", message)

    def print_help(self, file: Any = None) -> None:
        raise HelpRequested(self.format_help())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ConfigError("command line", "", message or f"exit {status}")


def build_argument_parser(prog: str = "hami-control") -> ControlArgumentParser:
    """The control plane's flags. Every flag defaults to "not given", so `load_config` can tell a flag
    from a default; the help shows each flag's environment variable and default. Boolean flags take an
    optional value (`--overwrite-env`, `--enforce-quota=false`)."""
    parser = ControlArgumentParser(
        prog=prog,
        description=(
            "hami-control: the mutating admission webhook and scheduler extender of hami-py. "
            "Precedence: flags > environment > config file > defaults."
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
        else:
            parser.add_argument(s.flag, dest=s.name, metavar=s.metavar, help=help_text)
    return parser


# --- config file -----------------------------------------------------------------------------------------


def _key_lines(source: str, node: yaml.Node) -> dict[str, int]:
    """Line (1-based) of every top-level key; a repeated key is an error (YAML would keep the last)."""
    lines: dict[str, int] = {}
    if not isinstance(node, yaml.MappingNode):
        return lines
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in lines:
            raise ConfigError(
                source, key_node.value, f"appears twice (also on line {lines[key_node.value]})", line
            )
        lines[key_node.value] = line
    return lines


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    where: str
    """Where it came from, for cross-field errors ("flag --x", "environment X", "file line N: key")."""


def _read_file_layer(path: Path, read_file: Callable[[Path], str]) -> dict[str, _Value]:
    source = str(path)
    try:
        text = read_file(path)
    except OSError as err:
        raise ConfigError(source, "", f"cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(source, "", f"is not UTF-8 text ({err.reason})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines = _key_lines(source, node) if node is not None else {}
        document = yaml.constructor.SafeConstructor().construct_document(node) if node is not None else {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(source, "", f"is not valid YAML or JSON: {problem}", line) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(source, "", f"expected a mapping of settings, got {_shown(document)}", 1)
    values: dict[str, _Value] = {}
    for key, raw in document.items():
        if not isinstance(key, str):
            raise ConfigError(source, str(key), "keys must be strings")
        line = lines.get(key)
        setting = _BY_FILE_KEY.get(key)
        if setting is None:
            raise ConfigError(source, key, "unknown key" + _suggest(key, list(_BY_FILE_KEY)), line)
        try:
            value = setting.parse(raw)
        except _Invalid as bad:
            shown = _shown(raw)
            raise ConfigError(source, key, f"expected {bad.expected}, got {shown}", line, shown) from None
        if setting.name in _PATHS_RELATIVE_TO_FILE and not value.is_absolute():
            value = path.parent / value
        values[setting.name] = _Value(value, f"{source} line {line}: {key}")
    return values


# --- load ------------------------------------------------------------------------------------------------


def _parse_given(setting: _Setting, raw: object, source: str) -> _Value:
    key = setting.flag if source == "command line" else setting.env
    try:
        value = setting.parse(raw)
    except _Invalid as bad:
        shown = _shown(raw)
        raise ConfigError(source, key, f"expected {bad.expected}, got {shown}", None, shown) from None
    return _Value(value, f"flag {setting.flag}" if source == "command line" else f"environment {key}")


def load_config(
    argv: Sequence[str], env: Mapping[str, str], read_file: Callable[[Path], str]
) -> ControlConfig:
    """Build and validate the config from the command line (without the program name), the environment
    and the config file named by --config-file / CONFIG_FILE (read through `read_file`).

    Raises `ConfigError` for any bad value or combination and `HelpRequested` for --help.
    """
    given = vars(build_argument_parser().parse_args(list(argv)))
    flags = {name: _parse_given(_BY_NAME[name], raw, "command line") for name, raw in given.items()}
    envs = {
        s.name: _parse_given(s, env[s.env], "environment") for s in _SETTINGS if env.get(s.env, "").strip()
    }
    config_file = flags.get("config_file") or envs.get("config_file")
    file_values = _read_file_layer(config_file.value, read_file) if config_file else {}
    merged: dict[str, _Value] = {**file_values, **envs, **flags}
    return _validated(merged)


def _validated(merged: Mapping[str, _Value]) -> ControlConfig:
    values = {name: v.value for name, v in merged.items() if name not in _RESOURCE_FIELDS}

    names: dict[str, str] = {}
    for name, attribute in _RESOURCE_FIELDS.items():
        if name in merged:
            names[attribute] = merged[name].value
    resource_names = ResourceNames(**names)
    by_value: dict[str, str] = {}
    for name, attribute in _RESOURCE_FIELDS.items():
        value = getattr(resource_names, attribute)
        if value in by_value:
            raise ConfigError(
                "configuration",
                name,
                f"{_describe(merged, name)} and {_describe(merged, by_value[value])} both name the resource "
                f"{value}; the five GPU resources need five different names",
            )
        by_value[value] = name

    insecure = values.get("insecure_http", False)
    cert, key = merged.get("tls_cert_file"), merged.get("tls_key_file")
    if insecure and (cert or key):
        given = cert or key
        assert given is not None
        raise ConfigError(
            "configuration",
            "insecure_http",
            f"plain HTTP ({_describe(merged, 'insecure_http')}) was asked for together with a TLS file "
            f"({given.where}): choose one",
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
    defaults = ControlConfig.__dataclass_fields__
    timing = {
        key: values.get(key, defaults[key].default)
        for key in (
            "leader_elect_lease_duration_s",
            "leader_elect_renew_deadline_s",
            "leader_elect_retry_period_s",
        )
    }
    lease, renew, retry = timing.values()
    if not lease > renew > 1.2 * retry or retry < 1:
        raise ConfigError(
            "configuration",
            "leader_elect_lease_duration_s",
            f"leader election needs lease duration > renew deadline > 1.2 x retry period and a retry period "
            f"of at least 1 s; got {_describe(merged, 'leader_elect_lease_duration_s')} = {lease}, "
            f"{_describe(merged, 'leader_elect_renew_deadline_s')} = {renew}, "
            f"{_describe(merged, 'leader_elect_retry_period_s')} = {retry}",
        )
    return ControlConfig(**values, resource_names=resource_names, warnings=_ignored_settings(merged))


_LEADER_SETTINGS = (
    "leader_elect_namespace",
    "leader_elect_lease",
    "leader_elect_lease_duration_s",
    "leader_elect_renew_deadline_s",
    "leader_elect_retry_period_s",
)


def _ignored_settings(merged: Mapping[str, _Value]) -> tuple[str, ...]:
    """Settings given that change nothing: the leader election's without --leader-elect (its timings are
    still checked, so turning it on later cannot fail). POD_NAMESPACE is not named: the downward API sets
    it in every pod."""
    leader = merged.get("leader_elect")
    if leader is not None and leader.value:
        return ()
    out: list[str] = []
    for name in _LEADER_SETTINGS:
        given = merged.get(name)
        if given is None or given.where == "environment POD_NAMESPACE":
            continue
        out.append(f"{given.where}: has no effect without --leader-elect")
    return tuple(out)


def _describe(merged: Mapping[str, _Value], name: str) -> str:
    return merged[name].where if name in merged else f"the default of {_BY_NAME[name].flag}"


__all__ = [
    "DEFAULT_MAX_REQUEST_BODY",
    "BindAddress",
    "ConfigError",
    "ControlArgumentParser",
    "ControlConfig",
    "HelpRequested",
    "LogLevel",
    "PrivilegedPolicy",
    "build_argument_parser",
    "load_config",
]
