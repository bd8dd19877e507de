"""hami_control.config: defaults, the three sources and their precedence, cross-field checks, and an error
naming source, key and value (and the file line) for every bad setting; --help and bad flags never exit."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.resources import RequestDefaults, ResourceNames
from hami_api.types import CorePolicy, GPUPolicy, NodePolicy
from hami_control.config import (
    DEFAULT_MAX_REQUEST_BODY,
    BindAddress,
    ConfigError,
    ControlConfig,
    HelpRequested,
    LogLevel,
    PrivilegedPolicy,
    build_argument_parser,
    load_config,
)

CONFIG = Path("/etc/hami/control.yaml")
TLS = ("--tls-cert-file", "/tls/tls.crt", "--tls-key-file", "/tls/tls.key")


def load(
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    insecure: bool = True,
) -> ControlConfig:
    """load_config with an in-memory file system; --insecure-http unless told otherwise."""
    store = dict(files or {})

    def read(path: Path) -> str:
        if str(path) not in store:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return store[str(path)]

    args = ["--insecure-http", *argv] if insecure else list(argv)
    return load_config(args, dict(env or {}), read)


def load_file(text: str, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> ControlConfig:
    return load(["--config-file", str(CONFIG), *argv], env, {str(CONFIG): text})


def error(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, insecure: bool = True
) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(argv, env, insecure=insecure)
    return info.value


def file_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_file(text)
    return info.value


# --- defaults and sources --------------------------------------------------------------------------------


def test_defaults() -> None:
    config = load()
    assert config == ControlConfig().with_settings(insecure_http=True)
    assert config.server.bind == BindAddress("0.0.0.0", 9443)
    assert str(config.server.bind) == "0.0.0.0:9443"
    assert config.webhook.scheduler_name == "hami-scheduler"
    assert config.webhook.force_overwrite_default_scheduler is True
    assert (
        config.requests.defaults.default_gpu_num,
        config.requests.defaults.default_memory,
        config.requests.defaults.default_cores,
        config.requests.defaults.memory_factor,
    ) == (
        1,
        0,
        0,
        1,
    )
    assert config.webhook.core_policy is CorePolicy.DEFAULT
    assert config.webhook.runtime_class_name is None
    assert config.webhook.overwrite_env is False
    assert config.webhook.privileged_policy is PrivilegedPolicy.DENY
    assert config.requests.names == ResourceNames()
    assert config.quota.enforce is True
    assert config.scheduling.node_policy is NodePolicy.BINPACK
    assert config.scheduling.gpu_policy == (GPUPolicy.SPREAD,)
    assert config.kube.kubeconfig is None
    assert config.log_level is LogLevel.INFO
    assert config.server.max_request_body == DEFAULT_MAX_REQUEST_BODY == 3 * 1024 * 1024
    assert config.requests.defaults == RequestDefaults()


def test_every_flag() -> None:
    config = load(
        [
            "--bind", "127.0.0.1:0",
            "--scheduler-name", "gpu-scheduler",
            "--force-overwrite-default-scheduler=false",
            "--default-gpu", "2",
            "--default-mem", "2048",
            "--default-cores", "25",
            "--memory-factor", "1024",
            "--gpu-core-policy", "force",
            "--runtime-class-name", "nvidia",
            "--overwrite-env",
            "--privileged-policy", "skip",
            "--resource-name", "acme.com/gpu",
            "--resource-mem", "acme.com/gpumem",
            "--resource-mem-percentage", "acme.com/gpumem-percentage",
            "--resource-cores", "acme.com/gpucores",
            "--resource-priority", "acme.com/priority",
            "--enforce-quota", "false",
            "--node-scheduler-policy", "spread",
            "--gpu-scheduler-policy", "binpack,numa",
            "--kubeconfig", "/root/.kube/config",
            "--log-level", "debug",
            "--max-request-body", "1Mi",
        ]
    )  # fmt: skip
    assert config.server.bind == BindAddress("127.0.0.1", 0)
    assert config.webhook.scheduler_name == "gpu-scheduler"
    assert config.webhook.force_overwrite_default_scheduler is False
    assert config.requests.defaults == RequestDefaults(2048, 25, 2, 1024)
    assert config.webhook.core_policy is CorePolicy.FORCE
    assert config.webhook.runtime_class_name == "nvidia"
    assert config.webhook.overwrite_env is True
    assert config.webhook.privileged_policy is PrivilegedPolicy.SKIP
    assert config.requests.names == ResourceNames(
        "acme.com/gpu",
        "acme.com/gpumem",
        "acme.com/gpumem-percentage",
        "acme.com/gpucores",
        "acme.com/priority",
    )
    assert config.quota.enforce is False
    assert config.scheduling.node_policy is NodePolicy.SPREAD
    assert config.scheduling.gpu_policy == (GPUPolicy.BINPACK, GPUPolicy.NUMA)
    assert config.kube.kubeconfig == Path("/root/.kube/config")
    assert config.log_level is LogLevel.DEBUG
    assert config.server.max_request_body == 1024 * 1024


def test_environment() -> None:
    config = load(
        env={
            "HAMI_SCHEDULER_NAME": "env-scheduler",
            "HAMI_DEFAULT_MEM": "1000",
            "HAMI_OVERWRITE_ENV": "true",
            "HAMI_RESOURCE_CORES": "acme.com/cores",
            "KUBECONFIG": "/k/config",
            "HAMI_MAX_REQUEST_BODY": "65536",
            "HAMI_LOG_LEVEL": "",  # empty counts as unset
            "UNRELATED": "x",
        }
    )
    assert config.webhook.scheduler_name == "env-scheduler"
    assert config.requests.defaults.default_memory == 1000
    assert config.webhook.overwrite_env is True
    assert config.requests.names.cores == "acme.com/cores"
    assert config.kube.kubeconfig == Path("/k/config")
    assert config.server.max_request_body == 65536
    assert config.log_level is LogLevel.INFO


def test_file_keys_follow_hamis_nvidia_config() -> None:
    config = load_file(
        "schedulerName: file-scheduler\n"
        "defaultMemory: 3000\n"
        "defaultCores: 10\n"
        "defaultGPUNum: 3\n"
        "memoryFactor: 2\n"
        "gpuCorePolicy: disable\n"
        'runtimeClassName: ""\n'
        "overwriteEnv: true\n"
        "resourceCountName: hami.io/vgpu\n"
        "resourcePriorityName: hami.io/priority\n"
        "enforceQuota: false\n"
        "gpuSchedulerPolicy: topology-aware\n"
        "nodeSchedulerPolicy: spread\n"
        "maxRequestBody: 2Mi\n"
        "bind: '[::1]:8443'\n"
    )
    assert config.webhook.scheduler_name == "file-scheduler"
    assert config.requests.defaults == RequestDefaults(3000, 10, 3, 2)
    assert config.webhook.core_policy is CorePolicy.DISABLE
    assert config.webhook.runtime_class_name is None  # HAMi's "" means none
    assert config.webhook.overwrite_env is True
    assert config.requests.names == ResourceNames(count="hami.io/vgpu", priority="hami.io/priority")
    assert config.quota.enforce is False
    assert config.scheduling.gpu_policy == (GPUPolicy.TOPOLOGY_AWARE,)
    assert config.scheduling.node_policy is NodePolicy.SPREAD
    assert config.server.max_request_body == 2 * 1024 * 1024
    assert config.server.bind == BindAddress("::1", 8443)
    assert str(config.server.bind) == "[::1]:8443"
    assert config.config_file == CONFIG


def test_json_file_and_empty_file() -> None:
    assert load_file('{"defaultCores": 5}').requests.defaults.default_cores == 5
    assert load_file("").requests.defaults.default_cores == 0
    assert load_file("# only a comment\n").webhook.scheduler_name == "hami-scheduler"
    assert load_file("null\n") == ControlConfig().with_settings(insecure_http=True, config_file=CONFIG)


def test_precedence_flags_over_env_over_file_over_defaults() -> None:
    text = "schedulerName: from-file\ndefaultCores: 7\ndefaultMemory: 70\n"
    env = {"HAMI_SCHEDULER_NAME": "from-env", "HAMI_DEFAULT_CORES": "8"}
    config = load_file(text, ["--scheduler-name", "from-flag"], env)
    assert config.webhook.scheduler_name == "from-flag"
    assert config.requests.defaults.default_cores == 8
    assert config.requests.defaults.default_memory == 70
    assert config.requests.defaults.default_gpu_num == 1


def test_config_file_from_environment_and_relative_paths_resolve_against_it() -> None:
    files = {str(CONFIG): "kubeconfig: kube/config\ntlsCertFile: tls.crt\ntlsKeyFile: /abs/tls.key\n"}
    config = load([], {"CONFIG_FILE": str(CONFIG)}, files, insecure=False)
    assert config.kube.kubeconfig == Path("/etc/hami/kube/config")
    assert config.server.tls_cert_file == Path("/etc/hami/tls.crt")
    assert config.server.tls_key_file == Path("/abs/tls.key")
    assert config.server.insecure_http is False


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--overwrite-env"], True),
        (["--overwrite-env=true"], True),
        (["--overwrite-env", "1"], True),
        (["--overwrite-env=False"], False),
        (["--overwrite-env", "f"], False),
        ([], False),
    ],
)
def test_boolean_flags_take_an_optional_value(argv: list[str], expected: bool) -> None:
    assert load(argv).webhook.overwrite_env is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:9443", BindAddress("0.0.0.0", 9443)),
        (":8443", BindAddress("", 8443)),
        ("localhost:443", BindAddress("localhost", 443)),
        ("[::]:9443", BindAddress("::", 9443)),
        ("127.0.0.1:65535", BindAddress("127.0.0.1", 65535)),
    ],
)
def test_bind_forms(text: str, expected: BindAddress) -> None:
    assert load(["--bind", text]).server.bind == expected


# --- TLS -------------------------------------------------------------------------------------------------


def test_tls_files_are_required_unless_insecure_http() -> None:
    config = load(TLS, insecure=False)
    assert config.server.tls_cert_file == Path("/tls/tls.crt")
    assert config.server.tls_key_file == Path("/tls/tls.key")
    err = error([], insecure=False)
    assert err.source == "configuration"
    assert "--tls-cert-file and --tls-key-file" in str(err)
    assert "--insecure-http" in str(err)


def test_a_tls_file_without_its_pair() -> None:
    assert "pass --tls-key-file too" in str(error(["--tls-cert-file", "/c"], insecure=False))
    assert "pass --tls-cert-file too" in str(error(["--tls-key-file", "/k"], insecure=False))


def test_insecure_http_with_tls_files_is_ambiguous() -> None:
    err = error(TLS)
    assert "choose one" in str(err)
    assert "flag --insecure-http" in str(err)
    assert "flag --tls-cert-file" in str(err)


# --- bad values name source, key and value ------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--bind", "9443", "HOST:PORT"),
        ("--bind", "host:99999", "HOST:PORT"),
        ("--bind", "[nothex]:1", "HOST:PORT"),
        ("--bind", "bad host:1", "HOST:PORT"),
        ("--scheduler-name", "Hami_Scheduler", "DNS subdomain"),
        ("--default-gpu", "0", "an integer from 1"),
        ("--default-mem", "-1", "an integer from 0"),
        ("--default-mem", "1.5", "an integer from 0"),
        ("--default-cores", "101", "an integer from 0 to 100"),
        ("--memory-factor", "0", "an integer from 1"),
        ("--gpu-core-policy", "none", "one of default, force, disable"),
        ("--runtime-class-name", "Nvidia!", "RuntimeClass"),
        ("--overwrite-env", "yes", "true or false"),
        ("--privileged-policy", "allow", "one of deny, skip"),
        ("--resource-name", "gpu", "extended resource name"),
        ("--resource-mem", "kubernetes.io/gpumem", "outside kubernetes.io"),
        ("--node-scheduler-policy", "random", "one of binpack, spread"),
        ("--gpu-scheduler-policy", "binpack,fastest", "comma chain"),
        ("--log-level", "trace", "one of debug, info"),
        ("--max-request-body", "10", "from 1Ki to 1Gi"),
        ("--max-request-body", "2Gi", "from 1Ki to 1Gi"),
        ("--max-request-body", "lots", "from 1Ki to 1Gi"),
    ],
)
def test_bad_flag_values(flag: str, value: str, expected: str) -> None:
    err = error([flag, value])
    assert err.source == "command line"
    assert err.key == flag
    assert expected in err.reason
    assert f'got "{value}"' in str(err)
    assert str(err).startswith(f"command line {flag}: expected ")


def test_bad_environment_value_names_the_variable() -> None:
    err = error([], {"HAMI_DEFAULT_CORES": "lots"})
    assert str(err) == 'environment HAMI_DEFAULT_CORES: expected an integer from 0 to 100, got "lots"'
    assert err.value == '"lots"'


def test_bad_file_value_names_file_line_key_and_value() -> None:
    err = file_error("schedulerName: ok\n\ndefaultCores: 150\n")
    assert str(err) == f"{CONFIG} line 3: defaultCores: expected an integer from 0 to 100, got 150"
    assert (err.source, err.key, err.line, err.value) == (str(CONFIG), "defaultCores", 3, "150")


def test_file_problems() -> None:
    err = file_error("defaultcores: 1\n")
    assert "line 1: defaultcores: unknown key" in str(err)
    assert 'did you mean "defaultCores"' in str(err)
    assert 'did you mean "schedulerName"' in str(file_error("schedulerNam: x\n"))
    assert "appears twice (also on line 1)" in str(file_error("defaultCores: 1\ndefaultCores: 2\n"))
    assert file_error("defaultCores: 1\ndefaultCores: 2\n").line == 2
    bad_yaml = file_error("a: [1, 2\nb: c\n")
    assert "is not valid YAML or JSON" in str(bad_yaml)
    assert bad_yaml.line is not None
    assert "expected a mapping of settings" in str(file_error("- 1\n- 2\n"))
    assert str(file_error("# settings\n- 1\n- 2\n")) == (
        f"{CONFIG} line 2: expected a mapping of settings (schedulerName: hami-scheduler, ...), got [1, 2]"
    )
    assert "keys must be strings" in str(file_error("1: 2\n"))
    assert str(file_error("defaultCores: 1\n2: 2\n")) == f"{CONFIG} line 2: 2: keys must be strings"
    assert "overwriteEnv: expected true or false" in str(file_error("overwriteEnv: maybe\n"))


def test_unreadable_file() -> None:
    with pytest.raises(ConfigError) as info:
        load(["--config-file", "/nope.yaml"])
    assert str(info.value) == "/nope.yaml: cannot be read: No such file or directory"

    def not_utf8(path: Path) -> str:
        return b"\xff".decode()

    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(["--insecure-http", "--config-file", "/x"], {}, not_utf8)


def test_resource_names_must_differ() -> None:
    err = error(["--resource-mem", "nvidia.com/gpu"])
    assert err.source == "configuration"
    assert "flag --resource-mem" in str(err)
    assert "the default of --resource-name" in str(err)
    assert "five different names" in str(err)


# --- the command line itself -------------------------------------------------------------------------------


def test_help_is_returned_not_printed() -> None:
    with pytest.raises(HelpRequested) as info:
        load(["--help"])
    text = info.value.text
    assert text.startswith("usage: hami-control")
    for flag in (
        "--bind",
        "--scheduler-name",
        "--privileged-policy",
        "--enforce-quota",
        "--max-request-body",
    ):
        assert flag in text
    flat = " ".join(text.split())  # argparse wraps lines
    assert "(env HAMI_SCHEDULER_NAME; default hami-scheduler)" in flat
    assert "(env HAMI_BIND; default 0.0.0.0:9443)" in flat
    assert "(env HAMI_DEFAULT_CORES; default 0)" in flat


@pytest.mark.parametrize(
    "argv", [["--no-such-flag"], ["--bind"], ["positional"], ["--sched", "x"], ["--default-gpu=1", "extra"]]
)
def test_a_bad_command_line_raises_config_error_not_system_exit(argv: list[str]) -> None:
    err = error(argv)
    assert err.source == "command line"
    assert str(err).startswith("command line")


def test_parser_defaults_are_not_given() -> None:
    assert vars(build_argument_parser().parse_args([])) == {}


def test_config_error_pickles() -> None:
    err = ConfigError("file.yaml", "defaultCores", "expected x", 3, "150")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err)
    assert again.line == 3
    assert str(ConfigError("configuration", "", "does not fit")) == "configuration: does not fit"


@given(st.lists(st.text(max_size=20), max_size=6))
def test_any_command_line_gives_a_config_or_a_clear_error(argv: list[str]) -> None:
    try:
        config = load(argv)
    except (ConfigError, HelpRequested):
        return
    assert isinstance(config, ControlConfig)


@given(st.dictionaries(st.sampled_from(["HAMI_DEFAULT_CORES", "HAMI_BIND", "HAMI_ENFORCE_QUOTA"]), st.text()))
def test_any_environment_gives_a_config_or_a_clear_error(env: dict[str, str]) -> None:
    try:
        load([], env)
    except ConfigError as err:
        assert err.source == "environment"
        assert err.key in env


# --- binder timeouts ---------------------------------------------------------------------------------------


def test_binder_timeouts_defaults_and_sources() -> None:
    config = load()
    assert (config.binder.allocate_timeout_s, config.binder.bind_wait_s) == (30.0, 10.0)
    flags = load(["--allocate-timeout", "12.5", "--bind-wait-timeout=3"])
    assert (flags.binder.allocate_timeout_s, flags.binder.bind_wait_s) == (12.5, 3.0)
    envs = load(env={"HAMI_ALLOCATE_TIMEOUT": "45", "HAMI_BIND_WAIT_TIMEOUT": " 0.5 "})
    assert (envs.binder.allocate_timeout_s, envs.binder.bind_wait_s) == (45.0, 0.5)
    from_file = load_file("allocateTimeout: 20\nbindWaitTimeout: 1.5\n", ["--bind-wait-timeout", "2"])
    assert (from_file.binder.allocate_timeout_s, from_file.binder.bind_wait_s) == (20.0, 2.0)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf", ""])
def test_binder_timeouts_must_be_positive_seconds(value: str) -> None:
    for flag in ("--allocate-timeout", "--bind-wait-timeout"):
        err = error([f"{flag}={value}"])
        assert err.key == flag
        assert "a number of seconds > 0" in err.reason
    err = file_error("bindWaitTimeout: 0\n")
    assert (
        str(err)
        == f"{CONFIG} line 1: bindWaitTimeout: expected a number of seconds > 0, such as 30 or 2.5, got 0"
    )
    assert "allocateTimeout: expected a number of seconds" in str(file_error("allocateTimeout: true\n"))
    env_err = error([], {"HAMI_ALLOCATE_TIMEOUT": "-3"})
    assert str(env_err).startswith("environment HAMI_ALLOCATE_TIMEOUT: expected a number of seconds > 0")


def test_binder_timeouts_in_help() -> None:
    with pytest.raises(HelpRequested) as info:
        load(["--help"])
    flat = " ".join(info.value.text.split())
    assert "(env HAMI_ALLOCATE_TIMEOUT; default 30)" in flat
    assert "(env HAMI_BIND_WAIT_TIMEOUT; default 10)" in flat


# --- settings that would change nothing (issue 13, item 6) --------------------------------------------------


def test_leader_election_settings_without_leader_elect_are_named_in_warnings() -> None:
    config = load(
        ["--leader-elect-lease", "other", "--leader-elect-retry-period", "3"],
        env={"POD_NAMESPACE": "hami-system", "HAMI_LEADER_ELECT_RENEW_DEADLINE": "12"},
    )
    assert config.warnings == (
        "flag --leader-elect-lease: has no effect without --leader-elect",
        "environment HAMI_LEADER_ELECT_RENEW_DEADLINE: has no effect without --leader-elect",
        "flag --leader-elect-retry-period: has no effect without --leader-elect",
    )  # POD_NAMESPACE is set by the downward API in every pod: not named
    file_config = load_file("leaderElectNamespace: kube-system\n")
    assert file_config.warnings == (
        f"{CONFIG} line 1: leaderElectNamespace: has no effect without --leader-elect",
    )
    assert load(["--leader-elect", "--leader-elect-lease", "other"]).warnings == ()
    assert load().warnings == ()


def test_the_pods_own_name_and_namespace_come_from_the_downward_api_or_flags() -> None:
    config = load(env={"POD_NAME": "hami-control-7d9f-abcde", "POD_NAMESPACE": "gpu-system"})
    assert (config.kube.pod_name, config.kube.pod_namespace) == ("hami-control-7d9f-abcde", "gpu-system")
    assert config.election.namespace == "gpu-system"  # the Lease defaults to the pod's namespace
    flagged = load(["--pod-name", "a", "--pod-namespace", "b"], env={"POD_NAME": "x"})
    assert (flagged.kube.pod_name, flagged.kube.pod_namespace) == ("a", "b")
    assert (load().kube.pod_name, load().kube.pod_namespace) == ("", "")
    with pytest.raises(ConfigError, match="POD_NAME"):
        load(env={"POD_NAME": "Not_A_Name"})


BURST_ZERO = '--kube-api-burst: expected an integer from 1 to 2147483647, got "0"'


def test_kube_api_rate_limit_defaults_to_kube_schedulers_and_is_read_from_flag_env_and_file() -> None:
    assert (load().kube.qps, load().kube.burst) == (50.0, 100)
    flagged = load(["--kube-api-qps", "20", "--kube-api-burst", "40"]).kube
    assert (flagged.qps, flagged.burst) == (20.0, 40)
    assert load(env={"HAMI_KUBE_API_BURST": "7"}).kube.burst == 7
    assert load_file("kubeAPIQPS: 0\n").kube.qps == 0.0  # no limit
    with pytest.raises(ConfigError, match=r"--kube-api-qps.*requests per second >= 0.*-1"):
        load(["--kube-api-qps", "-1"])
    with pytest.raises(ConfigError, match=BURST_ZERO):
        load(["--kube-api-burst", "0"])


def test_credentials_env_keeps_only_what_the_credentials_loader_reads() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOME": "/root"}
    assert load(env=env).kube.environ == {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    assert load().kube.environ == {}


def test_with_settings_changes_settings_by_their_table_names_and_refuses_other_names() -> None:
    changed = ControlConfig().with_settings(
        scheduler_name="s", enforce_quota=False, memory_factor=1024, leader_elect_lease="l", kube_api_qps=1
    )
    assert changed.webhook.scheduler_name == "s" and changed.quota.enforce is False
    assert changed.requests.defaults == RequestDefaults(memory_factor=1024)
    assert (changed.election.lease, changed.kube.qps) == ("l", 1)
    assert ControlConfig().with_settings() == ControlConfig()
    with pytest.raises(TypeError, match="not hami-control settings: bogus"):
        ControlConfig().with_settings(bogus=1)


def test_election_settings_give_hami_kubes_lease_settings() -> None:
    settings = load(["--leader-elect", "--leader-elect-lease", "x"]).election.lease_settings("me")
    assert (settings.name, settings.namespace, settings.identity) == ("x", "hami-system", "me")
    assert (settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s) == (
        15.0,
        10.0,
        2.0,
    )


# --- the HTTPS server's connection limits (issue 16, hardened endpoints) ------------------------------------

_LIMIT_FLAGS = (
    ("--header-read-timeout", "HAMI_HEADER_READ_TIMEOUT", "headerReadTimeout", "header_read_timeout_s"),
    ("--body-read-timeout", "HAMI_BODY_READ_TIMEOUT", "bodyReadTimeout", "body_read_timeout_s"),
    ("--idle-timeout", "HAMI_IDLE_TIMEOUT", "idleTimeout", "idle_timeout_s"),
    (
        "--tls-handshake-timeout",
        "HAMI_TLS_HANDSHAKE_TIMEOUT",
        "tlsHandshakeTimeout",
        "tls_handshake_timeout_s",
    ),
)


def test_connection_limits_default_to_the_go_servers_admins_know() -> None:
    server = load().server
    assert (
        server.header_read_timeout_s,
        server.body_read_timeout_s,
        server.idle_timeout_s,
        server.tls_handshake_timeout_s,
        server.max_connections,
    ) == (15.0, 30.0, 90.0, 10.0, 1024)
    assert server.connection_limits.header_timeout_s == 15.0
    assert server.connection_limits.max_connections == 1024


def test_connection_limits_come_from_flags_environment_and_file() -> None:
    for flag, env, key, field in _LIMIT_FLAGS:
        assert getattr(load([flag, "2.5"]).server, field) == 2.5
        assert getattr(load(env={env: "3"}).server, field) == 3.0
        assert getattr(load_file(f"{key}: 4\n").server, field) == 4.0
    assert load(["--max-connections", "64"]).server.max_connections == 64
    assert load(env={"HAMI_MAX_CONNECTIONS": "128"}).server.max_connections == 128
    limits = load_file("maxConnections: 256\nheaderReadTimeout: 5\n").server.connection_limits
    assert (limits.max_connections, limits.header_timeout_s) == (256, 5.0)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_bad_connection_timeouts_name_the_setting(value: str) -> None:
    for flag, env, key, _ in _LIMIT_FLAGS:
        err = error([f"{flag}={value}"])
        assert err.key == flag
        assert str(err).startswith(f"command line {flag}: expected a number of seconds > 0")
        assert str(error([], {env: value})).startswith(f"environment {env}: expected a number of seconds > 0")
        assert str(file_error(f"{key}: {value}\n")).startswith(
            f"{CONFIG} line 1: {key}: expected a number of seconds > 0"
        )
    err = file_error("headerReadTimeout: 0\n")
    assert (
        str(err)
        == f"{CONFIG} line 1: headerReadTimeout: expected a number of seconds > 0, such as 30 or 2.5, got 0"
    )


@pytest.mark.parametrize("value", ["0", "-5", "many", "1.5", "2000000"])
def test_bad_max_connections_names_the_setting(value: str) -> None:
    err = error(["--max-connections", value])
    assert err.key == "--max-connections"
    assert str(err) == f'command line --max-connections: expected an integer from 1 to 1000000, got "{value}"'
    assert "maxConnections: expected an integer from 1" in str(file_error("maxConnections: 0\n"))


def test_connection_limits_in_help() -> None:
    with pytest.raises(HelpRequested) as info:
        load(["--help"])
    flat = " ".join(info.value.text.split())
    for _, env, _, _ in _LIMIT_FLAGS:
        assert f"(env {env}; default" in flat
    assert "(env HAMI_MAX_CONNECTIONS; default 1024)" in flat
