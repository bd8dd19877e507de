"""Fuzzing the config files and settings of both daemons through the one loader
(hami_api.settings_loader.parse_document, then hami_control.config.load_config and
hami_node.config.load_config with their settings tables): any file text, environment and command line
give a config or ConfigError naming the source and the key (HelpRequested for --help), never another
exception. tests/unit/test_*config.py fuzz the command line and a few variables; these fuzz the file
with every key of each table, hostile values, deep nesting and huge numbers, and the whole environment."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

import hami_control.config as control_config
import hami_node.config as node_config
from hami_api.settings import ConfigError, HelpRequested
from hami_api.settings_loader import parse_document
from tests.fuzz.strategies import (
    INT_EDGES,
    STRING_EDGES,
    YAML_DEPTHS,
    deep_json_text,
    fuzz_settings,
    json_values,
    mostly,
    texts,
)

FILE = Path("/etc/hami/config.yaml")
Loader = Callable[[Sequence[str], Mapping[str, str], Callable[[Path], str]], Any]
DAEMONS: dict[str, tuple[Loader, Any]] = {
    "hami-control": (control_config.load_config, control_config._LOADER),
    "hami-node": (node_config.load_config, node_config._LOADER),
}
_DEEP = "[" * 100_000 + "]" * 100_000


def check_document(text: str) -> None:
    try:
        document = parse_document(text, str(FILE))
    except ConfigError as err:
        assert err.source == str(FILE)
        assert str(err)
        return
    for path in document.lines:
        assert document.line(path) is not None


@fuzz_settings
@given(deep_json_text(YAML_DEPTHS) | texts | st.text(max_size=300))
@example(_DEEP)  # PyYAML recursed once per level: RecursionError
@example("a: " + "9" * 5000)  # PyYAML's int() refuses over 4,300 digits: ValueError
@example("a: 0x" + "f" * 5000)
@example("a: 0o" + "7" * 5000)
@example("a: 1_" + "0" * 5000)
@example("a: 1:" + "0" * 5000)  # YAML 1.1 sexagesimal
@example("a: !!float " + "9" * 5000)
@example("a: !!python/object:os.system echo")
def test_any_config_file_text_parses_or_is_refused_naming_the_file(text: str) -> None:
    check_document(text)


_values = st.sampled_from(STRING_EDGES + tuple(str(i) for i in INT_EDGES)) | json_values(leaves=5)


def _files(loader: Any) -> st.SearchStrategy[str]:
    keys = [s.key for s in loader.settings if s.key]
    document: st.SearchStrategy[Any] = st.dictionaries(
        st.sampled_from([*keys, "unknownKey"]), _values, max_size=5
    )
    overrides = loader.overrides
    if overrides is not None:
        entry_keys = [s.override_key for s in loader.settings if s.override_key]
        entries = st.lists(
            st.dictionaries(
                st.sampled_from(["name", *entry_keys]), mostly(st.just("node-a"), _values), max_size=4
            ),
            max_size=2,
        )
        document = st.builds(lambda d, e: {**d, overrides.section: e}, document, mostly(entries, _values))
    return (
        document.map(json.dumps)
        | document.map(lambda d: yaml.safe_dump(d, allow_unicode=True))
        | deep_json_text(YAML_DEPTHS)
    )


def _env(loader: Any) -> st.SearchStrategy[dict[str, str]]:
    names = sorted({s.env for s in loader.settings if s.env} - {"CONFIG_FILE", "KUBECONFIG"})
    return st.dictionaries(
        st.sampled_from(names), st.sampled_from(STRING_EDGES) | st.text(max_size=20), max_size=4
    )


def _argv(loader: Any) -> st.SearchStrategy[list[str]]:
    flags = sorted(s.flag for s in loader.settings if s.flag and s.flag != "--config-file")
    arg = st.builds(lambda f, v: f"{f}={v}", st.sampled_from(flags), st.sampled_from(STRING_EDGES) | texts)
    return st.lists(arg | st.sampled_from(flags), max_size=3)


def check_daemon(daemon: str, text: str, env: dict[str, str], argv: list[str]) -> None:
    load, _ = DAEMONS[daemon]
    env = {**env, "CONFIG_FILE": str(FILE), "NODE_NAME": "node-a"}

    def read_file(path: Path) -> str:
        if path != FILE:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return text

    try:
        load(argv, env, read_file)
    except ConfigError as err:
        assert err.source and str(err)
        assert "Traceback" not in str(err)
    except HelpRequested:
        pass


@fuzz_settings
@given(st.data())
def test_any_control_config_file_environment_and_flags_give_a_config_or_a_clear_error(
    data: st.DataObject,
) -> None:
    _, loader = DAEMONS["hami-control"]
    check_daemon("hami-control", data.draw(_files(loader)), data.draw(_env(loader)), data.draw(_argv(loader)))


@fuzz_settings
@given(st.data())
def test_any_node_config_file_environment_and_flags_give_a_config_or_a_clear_error(
    data: st.DataObject,
) -> None:
    _, loader = DAEMONS["hami-node"]
    check_daemon("hami-node", data.draw(_files(loader)), data.draw(_env(loader)), data.draw(_argv(loader)))


# Regressions: int() of a setting of over 4,300 digits raised ValueError instead of ConfigError.
_HUGE = "9" * 5000


@pytest.mark.parametrize(
    ("daemon", "argv", "env"),
    [
        ("hami-control", [f"--default-cores={_HUGE}"], {}),
        ("hami-control", [], {"HAMI_KUBE_API_BURST": _HUGE}),
        ("hami-node", [f"--device-split-count={_HUGE}"], {}),
        ("hami-node", [], {"DP_DISABLE_HEALTHCHECKS": _HUGE}),
        ("hami-node", [], {"HAMI_FILTER_DEVICES": f"0,{_HUGE}"}),
    ],
    ids=["control-flag", "control-env", "node-flag", "node-xids", "node-filter-devices"],
)
def test_a_setting_of_thousands_of_digits_is_refused_naming_it(
    daemon: str, argv: list[str], env: dict[str, str]
) -> None:
    check_daemon(daemon, "", env, argv)
