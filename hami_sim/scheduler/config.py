"""`KubeSchedulerConfiguration` (`kubescheduler.config.k8s.io/v1`) read the way kube-scheduler reads it
(pure; the file is read by `load_configuration`).

- Decoding is strict, as kube-scheduler's (`serializer.EnableStrict`): an unknown field, a duplicate key or
  a value of the wrong type is an error naming the field (`extenders[0].weightt`).
- Defaults are kube's: one profile `default-scheduler` when none is given, `podInitialBackoffSeconds` 1,
  `podMaxBackoffSeconds` 10, `parallelism` 16, leader election on with a `leases` lock in `kube-system`,
  an extender's `httpTimeout` 5 s. An extender's `weight` has no default.
- Validation is kube's `ValidateKubeSchedulerConfiguration` for what the stand-in reads, with its messages
  (`extenders[0].weight: Invalid value: 0: must have a positive weight applied to it`,
  `extenders: Invalid value: "found 2 extenders implementing bind": only one extender can implement
  bind`, duplicate or non-extended managed resource names, backoff and percentage ranges, a required and
  unique `schedulerName`). The stand-in adds one rule of its own: an extender needs an http(s) `urlPrefix`.

`scheduler_config()` then picks one profile by `schedulerName` and applies the stand-in's overrides (the
extender URL and CA: the local cluster serves the extender on loopback, not at the Service's name).
Plugins, pluginConfig, clientConnection rates, profiling and leader election are read and checked but not
modelled; `SchedulerConfig.notes` lists what was set and is ignored.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hami_sim.kubelet.resources import is_extended_resource_name

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "default-scheduler"
DEFAULT_PROFILE = "hami-scheduler"
"""The profile the stand-in runs unless told otherwise (the one the shipped file defines)."""
DEFAULT_EXTENDER_TIMEOUT_S = 5.0
"""kube-scheduler's `DefaultExtenderTimeout` when `httpTimeout` is unset or 0."""


class ConfigError(ValueError):
    """A configuration that kube-scheduler would refuse; the message names the file and every bad field."""


# --- the decoded configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderTLSConfig:
    insecure: bool = False
    server_name: str = ""
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    cert_data: bytes = b""
    key_data: bytes = b""
    ca_data: bytes = b""


@dataclass(frozen=True, slots=True)
class ManagedResource:
    name: str
    ignored_by_scheduler: bool = False


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """One `extenders[i]` entry. `index` is its position in the file (for messages)."""

    url_prefix: str
    filter_verb: str = ""
    preempt_verb: str = ""
    prioritize_verb: str = ""
    bind_verb: str = ""
    weight: int = 0
    enable_https: bool = False
    tls: ExtenderTLSConfig | None = None
    http_timeout_s: float = DEFAULT_EXTENDER_TIMEOUT_S
    node_cache_capable: bool = False
    managed_resources: tuple[ManagedResource, ...] = ()
    ignorable: bool = False
    index: int = 0

    @property
    def name(self) -> str:
        """kube-scheduler names an extender by its URL prefix."""
        return self.url_prefix

    @property
    def ignored_resources(self) -> frozenset[str]:
        """Resources kube-scheduler's own NodeResourcesFit must not check (`ignoredByScheduler`)."""
        return frozenset(r.name for r in self.managed_resources if r.ignored_by_scheduler)

    def is_interested(self, pod: Mapping[str, Any]) -> bool:
        """kube's `HTTPExtender.IsInterested`: every pod when no managed resources are listed; otherwise
        pods whose containers or init containers request or limit one of them."""
        if not self.managed_resources:
            return True
        managed = {r.name for r in self.managed_resources}
        spec = pod.get("spec") or {}
        for section in ("containers", "initContainers"):
            for container in spec.get(section) or ():
                resources = container.get("resources") or {}
                for kind in ("requests", "limits"):
                    if managed.intersection(resources.get(kind) or ()):
                        return True
        return False


@dataclass(frozen=True, slots=True)
class LeaderElection:
    leader_elect: bool = True
    resource_lock: str = "leases"
    resource_name: str = "kube-scheduler"
    resource_namespace: str = "kube-system"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Profile:
    scheduler_name: str
    percentage_of_nodes_to_score: int | None = None
    has_plugins: bool = False


@dataclass(frozen=True, slots=True)
class KubeSchedulerConfiguration:
    """The whole file, defaulted and validated."""

    profiles: tuple[Profile, ...]
    extenders: tuple[ExtenderConfig, ...] = ()
    parallelism: int = 16
    percentage_of_nodes_to_score: int | None = None
    pod_initial_backoff_s: int = 1
    pod_max_backoff_s: int = 10
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    kubeconfig: str = ""
    """`clientConnection.kubeconfig` (used when no --kubeconfig is given)."""
    source: str = "<config>"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What one stand-in runs: one profile, the extenders (overrides applied), the queue's backoff."""

    scheduler_name: str
    extenders: tuple[ExtenderConfig, ...] = ()
    percentage_of_nodes_to_score: int | None = None
    """The profile's value, else the file's; None or 0: kube's adaptive percentage."""
    pod_initial_backoff_s: float = 1.0
    pod_max_backoff_s: float = 10.0
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    kubeconfig: str = ""
    source: str = "<config>"
    notes: tuple[str, ...] = ()
    """Settings read from the file that the stand-in does not model (logged at start)."""

    @property
    def ignored_resources(self) -> frozenset[str]:
        out: set[str] = set()
        for extender in self.extenders:
            out |= extender.ignored_resources
        return frozenset(out)


# --- decoding helpers ---------------------------------------------------------------------------------


def _go_value(value: Any) -> str:
    """A value as kube's field errors print it (%#v-like: strings quoted)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(text: str) -> float:
    """Go's `time.ParseDuration` (what `metav1.Duration` uses), in seconds: "30s", "1m30s", "500ms",
    "-1.5h", "0". Raises ValueError."""
    rest = text
    sign = 1.0
    if rest[:1] in "+-" and rest:
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"invalid duration {_go_value(text)}")
    total = 0.0
    pos = 0
    while pos < len(rest):
        match = _DURATION_PART.match(rest, pos)
        if match is None or match.group(1) in ("", "."):
            unit_missing = match is None and re.fullmatch(r"[0-9.]+", rest[pos:]) is not None
            reason = "missing unit in duration" if unit_missing else "invalid duration"
            raise ValueError(f"time: {reason} {_go_value(text)}")
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return sign * total


class _Decoder:
    """Strict decoding into Python values, collecting errors with kube's field paths."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.errors.append(f"{path}: Invalid value: {_go_value(value)}: {detail}")

    def required(self, path: str) -> None:
        self.errors.append(f"{path}: Required value")

    def obj(self, value: Any, path: str, known: Sequence[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.invalid(
                path,
                value if not isinstance(value, list | dict) else type(value).__name__,
                "must be an object",
            )
            return {}
        for key in value:
            if key not in known:
                self.errors.append(
                    f'strict decoding error: unknown field "{path}.{key}"'
                    if path
                    else f'strict decoding error: unknown field "{key}"'
                )
        return value

    def string(self, obj: Mapping[str, Any], key: str, path: str, default: str = "") -> str:
        value = obj.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.invalid(_join(path, key), value, "must be a string")
            return default
        return value

    def boolean(self, obj: Mapping[str, Any], key: str, path: str, default: bool = False) -> bool:
        value = obj.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.invalid(_join(path, key), value, "must be a boolean (true or false)")
            return default
        return value

    def integer(self, obj: Mapping[str, Any], key: str, path: str, default: int | None) -> int | None:
        value = obj.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.invalid(_join(path, key), value, "must be an integer")
            return default
        return value

    def duration(self, obj: Mapping[str, Any], key: str, path: str, default: float) -> float:
        value = obj.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.invalid(_join(path, key), value, 'must be a duration string such as "30s"')
            return default
        try:
            return parse_duration(value)
        except ValueError as err:
            self.invalid(_join(path, key), value, str(err))
            return default

    def data(self, obj: Mapping[str, Any], key: str, path: str) -> bytes:
        """A Go `[]byte` field: base64 in YAML/JSON."""
        text = self.string(obj, key, path)
        if not text:
            return b""
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            self.invalid(_join(path, key), text[:40], "must be base64-encoded data")
            return b""

    def items(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.invalid(path, type(value).__name__, "must be a list")
            return []
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- the sections -------------------------------------------------------------------------------------

_TOP = (
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
)
_LEADER = (
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
)
_CLIENT = ("kubeconfig", "acceptContentTypes", "contentType", "qps", "burst")
_PROFILE = ("schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig")
_EXTENDER = (
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
)
_TLS = ("insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData")
_MANAGED = ("name", "ignoredByScheduler")


def _leader_election(d: _Decoder, value: Any) -> LeaderElection:
    path = "leaderElection"
    raw = d.obj(value, path, _LEADER)
    base = LeaderElection()
    le = LeaderElection(
        leader_elect=d.boolean(raw, "leaderElect", path, base.leader_elect),
        resource_lock=d.string(raw, "resourceLock", path) or base.resource_lock,
        resource_name=d.string(raw, "resourceName", path) or base.resource_name,
        resource_namespace=d.string(raw, "resourceNamespace", path) or base.resource_namespace,
        lease_duration_s=d.duration(raw, "leaseDuration", path, base.lease_duration_s),
        renew_deadline_s=d.duration(raw, "renewDeadline", path, base.renew_deadline_s),
        retry_period_s=d.duration(raw, "retryPeriod", path, base.retry_period_s),
    )
    if le.leader_elect:
        for key, seconds in (
            ("leaseDuration", le.lease_duration_s),
            ("renewDeadline", le.renew_deadline_s),
            ("retryPeriod", le.retry_period_s),
        ):
            if seconds <= 0:
                d.invalid(f"{path}.{key}", raw.get(key), "must be greater than zero")
        if le.lease_duration_s <= le.renew_deadline_s:
            d.invalid(
                f"{path}.leaseDuration",
                raw.get("leaseDuration", "15s"),
                "LeaseDuration must be greater than RenewDeadline",
            )
        if le.renew_deadline_s <= le.retry_period_s * 1.2:
            d.invalid(
                f"{path}.renewDeadline",
                raw.get("renewDeadline", "10s"),
                "RenewDeadline must be greater than retryPeriod*JitterFactor",
            )
        if le.resource_lock != "leases":
            d.invalid(f"{path}.resourceLock", le.resource_lock, 'resourceLock value must be "leases"')
    return le


def _percentage(d: _Decoder, raw: Mapping[str, Any], path: str) -> int | None:
    value = d.integer(raw, "percentageOfNodesToScore", path, None)
    if value is not None and not 0 <= value <= 100:
        d.invalid(_join(path, "percentageOfNodesToScore"), value, "not in valid range [0-100]")
    return value


def _profiles(d: _Decoder, value: Any) -> tuple[Profile, ...]:
    items = d.items(value, "profiles")
    if value is None or (isinstance(value, list) and not items):
        return (Profile(DEFAULT_SCHEDULER_NAME),)
    profiles: list[Profile] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"profiles[{i}]"
        raw = d.obj(item, path, _PROFILE)
        name = d.string(raw, "schedulerName", path)
        if not name and len(items) == 1 and raw.get("schedulerName") is None:
            name = DEFAULT_SCHEDULER_NAME
        if not name:
            d.required(f"{path}.schedulerName")
        elif name in seen:
            d.errors.append(f'{path}.schedulerName: Duplicate value: "profiles[{seen[name]}].schedulerName"')
        else:
            seen[name] = i
        if raw.get("plugins") is not None and not isinstance(raw["plugins"], dict):
            d.invalid(f"{path}.plugins", type(raw["plugins"]).__name__, "must be an object")
        if raw.get("pluginConfig") is not None:
            for j, plugin in enumerate(d.items(raw["pluginConfig"], f"{path}.pluginConfig")):
                pc = d.obj(plugin, f"{path}.pluginConfig[{j}]", ("name", "args"))
                if not d.string(pc, "name", f"{path}.pluginConfig[{j}]"):
                    d.required(f"{path}.pluginConfig[{j}].name")
        profiles.append(
            Profile(
                scheduler_name=name,
                percentage_of_nodes_to_score=_percentage(d, raw, path),
                has_plugins=bool(raw.get("plugins") or raw.get("pluginConfig")),
            )
        )
    return tuple(profiles)


def _tls(d: _Decoder, value: Any, path: str) -> ExtenderTLSConfig | None:
    if value is None:
        return None
    raw = d.obj(value, path, _TLS)
    return ExtenderTLSConfig(
        insecure=d.boolean(raw, "insecure", path),
        server_name=d.string(raw, "serverName", path),
        cert_file=d.string(raw, "certFile", path),
        key_file=d.string(raw, "keyFile", path),
        ca_file=d.string(raw, "caFile", path),
        cert_data=d.data(raw, "certData", path),
        key_data=d.data(raw, "keyData", path),
        ca_data=d.data(raw, "caData", path),
    )


def _extenders(d: _Decoder, value: Any) -> tuple[ExtenderConfig, ...]:
    out: list[ExtenderConfig] = []
    binders = 0
    managed_seen: set[str] = set()
    for i, item in enumerate(d.items(value, "extenders")):
        path = f"extenders[{i}]"
        raw = d.obj(item, path, _EXTENDER)
        url = d.string(raw, "urlPrefix", path)
        if not url:
            d.required(f"{path}.urlPrefix")
        elif not re.match(r"https?://[^/\s]+", url):
            d.invalid(f"{path}.urlPrefix", url, "must be an http:// or https:// URL")
        managed: list[ManagedResource] = []
        for j, res in enumerate(d.items(raw.get("managedResources"), f"{path}.managedResources")):
            rpath = f"{path}.managedResources[{j}]"
            rraw = d.obj(res, rpath, _MANAGED)
            name = d.string(rraw, "name", rpath)
            if not is_extended_resource_name(name):
                d.invalid(f"{rpath}.name", name, "is an invalid extended resource name")
            if name in managed_seen:
                d.invalid(f"{rpath}.name", name, "duplicate extender managed resource name")
            managed_seen.add(name)
            managed.append(ManagedResource(name, d.boolean(rraw, "ignoredByScheduler", rpath)))
        timeout = d.duration(raw, "httpTimeout", path, 0.0)
        if timeout < 0:
            d.invalid(f"{path}.httpTimeout", raw.get("httpTimeout"), "must not be negative")
        extender = ExtenderConfig(
            url_prefix=url.rstrip("/"),
            filter_verb=d.string(raw, "filterVerb", path),
            preempt_verb=d.string(raw, "preemptVerb", path),
            prioritize_verb=d.string(raw, "prioritizeVerb", path),
            bind_verb=d.string(raw, "bindVerb", path),
            weight=d.integer(raw, "weight", path, 0) or 0,
            enable_https=d.boolean(raw, "enableHTTPS", path),
            tls=_tls(d, raw.get("tlsConfig"), f"{path}.tlsConfig"),
            http_timeout_s=timeout if timeout > 0 else DEFAULT_EXTENDER_TIMEOUT_S,
            node_cache_capable=d.boolean(raw, "nodeCacheCapable", path),
            managed_resources=tuple(managed),
            ignorable=d.boolean(raw, "ignorable", path),
            index=i,
        )
        if extender.prioritize_verb and extender.weight <= 0:
            d.invalid(f"{path}.weight", extender.weight, "must have a positive weight applied to it")
        if extender.bind_verb:
            binders += 1
        out.append(extender)
    if binders > 1:
        d.invalid(
            "extenders",
            f"found {binders} extenders implementing bind",
            "only one extender can implement bind",
        )
    return tuple(out)


def parse_configuration(document: Any, source: str = "<config>") -> KubeSchedulerConfiguration:
    """Decode, default and validate one KubeSchedulerConfiguration document. Raises ConfigError listing
    every problem."""
    d = _Decoder()
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: not a KubeSchedulerConfiguration: the document is not a YAML mapping")
    raw = d.obj(document, "", _TOP)
    api_version = raw.get("apiVersion")
    kind = raw.get("kind")
    if api_version != API_VERSION:
        supported = f"only {API_VERSION} is supported"
        if api_version is None:
            d.required("apiVersion")
        else:
            d.invalid("apiVersion", api_version, supported)
    if kind != KIND:
        if kind is None:
            d.required("kind")
        else:
            d.invalid("kind", kind, f"must be {KIND}")
    client = d.obj(raw.get("clientConnection"), "clientConnection", _CLIENT)
    kubeconfig = d.string(client, "kubeconfig", "clientConnection")
    parallelism = d.integer(raw, "parallelism", "", 16)
    if parallelism is not None and parallelism <= 0:
        d.invalid("parallelism", parallelism, "should be an integer value greater than zero")
    for flag in ("enableProfiling", "enableContentionProfiling", "delayCacheUntilActive"):
        d.boolean(raw, flag, "")
    initial = d.integer(raw, "podInitialBackoffSeconds", "", 1)
    maximum = d.integer(raw, "podMaxBackoffSeconds", "", 10)
    if initial is not None and initial <= 0:
        d.invalid("podInitialBackoffSeconds", initial, "must be greater than 0")
    if initial is not None and maximum is not None and maximum < initial:
        d.invalid(
            "podMaxBackoffSeconds", maximum, "must be greater than or equal to PodInitialBackoffSeconds"
        )
    config = KubeSchedulerConfiguration(
        profiles=_profiles(d, raw.get("profiles")),
        extenders=_extenders(d, raw.get("extenders")),
        parallelism=parallelism or 16,
        percentage_of_nodes_to_score=_percentage(d, raw, ""),
        pod_initial_backoff_s=initial or 1,
        pod_max_backoff_s=maximum or 10,
        leader_election=_leader_election(d, raw.get("leaderElection")),
        kubeconfig=kubeconfig,
        source=source,
    )
    if d.errors:
        raise ConfigError(f"{source}: invalid KubeSchedulerConfiguration: " + "; ".join(d.errors))
    return config


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (kube's strict decoding does)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f'strict decoding error: duplicate field "{key}" (line {key_node.start_mark.line + 1})'
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_configuration_text(text: str, source: str = "<config>") -> KubeSchedulerConfiguration:
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    return parse_configuration(document, source)


def load_configuration(path: str | Path) -> KubeSchedulerConfiguration:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text") from None
    return parse_configuration_text(text, str(path))


def _override(
    extender: ExtenderConfig, extender_url: str | None, extender_ca_file: str | None
) -> ExtenderConfig:
    if extender_url is not None:
        if not re.match(r"https?://[^/\s]+", extender_url):
            raise ConfigError(f"--extender-url {extender_url!r}: must be an http:// or https:// URL")
        extender = replace(extender, url_prefix=extender_url.rstrip("/"))
    if extender_ca_file is not None:
        tls = extender.tls or ExtenderTLSConfig()
        extender = replace(extender, tls=replace(tls, ca_file=extender_ca_file, ca_data=b""))
    return extender


def scheduler_config(
    config: KubeSchedulerConfiguration,
    profile: str = DEFAULT_PROFILE,
    *,
    extender_url: str | None = None,
    extender_ca_file: str | None = None,
) -> SchedulerConfig:
    """The stand-in's view: the profile named `profile` and the extenders, with `extender_url`
    (replaces `urlPrefix`) and `extender_ca_file` (replaces `tlsConfig.caFile`/`caData`) applied to
    every extender. The overrides need one endpoint: a single extender, or several entries sharing one
    `urlPrefix` (the fragmentation component's second entry, `cpu-filter`/`cpu-prioritize`, calls the
    same hami-control Service as the first). Raises ConfigError."""
    chosen = next((p for p in config.profiles if p.scheduler_name == profile), None)
    if chosen is None:
        names = ", ".join(p.scheduler_name for p in config.profiles)
        raise ConfigError(
            f'--profile "{profile}": {config.source} has no profile with that schedulerName '
            f"(profiles: {names})"
        )
    extenders = config.extenders
    if extender_url is not None or extender_ca_file is not None:
        prefixes = sorted({e.url_prefix for e in extenders})
        if len(prefixes) != 1:
            raise ConfigError(
                f"--extender-url/--extender-ca-file: {config.source} has {len(extenders)} extenders "
                f"at {len(prefixes)} URL prefixes ({', '.join(prefixes) or 'none'}); the overrides need "
                "one extender, or extenders sharing one urlPrefix"
            )
        extenders = tuple(_override(extender, extender_url, extender_ca_file) for extender in extenders)
    notes: list[str] = []
    if chosen.has_plugins:
        notes.append(f"profile {profile}: plugins/pluginConfig are not modelled (fixed filters and scoring)")
    if config.leader_election.leader_elect:
        notes.append(
            "leaderElection.leaderElect is true: the stand-in does not elect a leader "
            f"(lease {config.leader_election.resource_namespace}/{config.leader_election.resource_name})"
        )
    for extender in extenders:
        if extender.preempt_verb:
            notes.append(f"extenders[{extender.index}].preemptVerb: no preemption in the stand-in")
    percentage = chosen.percentage_of_nodes_to_score
    if percentage is None:
        percentage = config.percentage_of_nodes_to_score
    return SchedulerConfig(
        scheduler_name=profile,
        extenders=extenders,
        percentage_of_nodes_to_score=percentage,
        pod_initial_backoff_s=float(config.pod_initial_backoff_s),
        pod_max_backoff_s=float(config.pod_max_backoff_s),
        leader_election=config.leader_election,
        kubeconfig=config.kubeconfig,
        source=config.source,
        notes=tuple(notes),
    )


def load_scheduler_config(
    path: str | Path,
    profile: str = DEFAULT_PROFILE,
    *,
    extender_url: str | None = None,
    extender_ca_file: str | None = None,
) -> SchedulerConfig:
    """`load_configuration` + `scheduler_config`. Raises ConfigError."""
    return scheduler_config(
        load_configuration(path), profile, extender_url=extender_url, extender_ca_file=extender_ca_file
    )
