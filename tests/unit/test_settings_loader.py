"""hami_api.settings_loader: the one loader of both daemons' settings. Precedence (flags > environment >
file's per-instance entry > file > defaults), --help, the file's lines in errors, unknown keys with "did
you mean", and a bad value from any source named with its key and value; the shared value parsers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.settings import (
    INT_PATTERN,
    ConfigError,
    HelpRequested,
    Invalid,
    ListenAddress,
    parse_bool,
    parse_int,
    parse_listen_address,
    parse_number,
    parse_path,
    parse_resource_name,
    parse_text,
)
from hami_api.settings_loader import (
    Overrides,
    Setting,
    SettingsLoader,
    key_text,
    parse_document,
)

FILE = Path("/etc/demo/demo.yaml")


def _words(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str) or not value.strip():
        raise Invalid("comma-separated words")
    return tuple(w.strip() for w in value.split(",") if w.strip())


SETTINGS = (
    Setting("config_file", "--config-file", "CONFIG_FILE", "", parse_path, "config file", "FILE"),
    Setting("name", "--name", "DEMO_NAME", "name", parse_text("a name"), "this instance", "NAME"),
    Setting("count", "--count", "DEMO_COUNT", "count", parse_int(1), "how many (100%)", "N",
            override_key="cnt"),
    Setting("verbose", "--verbose", "DEMO_VERBOSE", "verbose", parse_bool, "talk", "BOOL", optional_bool=True,
            override_key="verbose"),
    Setting("words", "--word", "DEMO_WORDS", "words", _words, "words", "WORD", repeatable=True,
            default_text="none"),
    Setting("data", "--data", "", "data", parse_path, "a data file", "FILE", relative_to_file=True),
)  # fmt: skip
DEFAULTS = {"count": 3, "verbose": False, "data": None}


def loader(overrides: bool = True) -> SettingsLoader:
    return SettingsLoader(
        SETTINGS if overrides else tuple(s for s in SETTINGS if not s.override_key),
        prog="demo",
        description="a demo daemon",
        defaults=DEFAULTS,
        mapping_example="count: 3, ...",
        overrides=Overrides("instances", "name", parse_text("a name"), "instance") if overrides else None,
    )


def load(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, text: str | None = None
) -> dict[str, object]:
    files = {} if text is None else {str(FILE): text}

    def read(path: Path) -> str:
        if str(path) not in files:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return files[str(path)]

    args = [*argv, *(["--config-file", str(FILE)] if text is not None else [])]
    return loader().load(args, dict(env or {}), read).values_by_name()


def error(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, text: str | None = None
) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(argv, env, text)
    return info.value


# --- precedence ---------------------------------------------------------------------------------------------


@given(
    flag=st.none() | st.integers(1, 99),
    env=st.none() | st.integers(1, 99),
    entry=st.none() | st.integers(1, 99),
    top=st.none() | st.integers(1, 99),
)
def test_flags_beat_environment_beat_the_instance_entry_beat_the_file(
    flag: int | None, env: int | None, entry: int | None, top: int | None
) -> None:
    argv = ["--name", "a", *(["--count", str(flag)] if flag is not None else [])]
    environ = {"DEMO_COUNT": str(env)} if env is not None else {}
    text = "name: ignored-by-the-flag\n"
    text += f"count: {top}\n" if top is not None else ""
    text += "instances:\n- name: b\n  cnt: 77\n- name: a\n" + (
        f"  cnt: {entry}\n" if entry is not None else ""
    )
    expected = next((v for v in (flag, env, entry, top) if v is not None), None)
    assert load(argv, environ, text).get("count") == expected  # None: not given, the default applies


def test_the_instance_entry_is_chosen_by_the_selector_from_any_source() -> None:
    text = "instances:\n- name: a\n  cnt: 5\n- name: b\n  cnt: 6\n"
    assert load(["--name", "a"], text=text)["count"] == 5
    assert load(env={"DEMO_NAME": "b"}, text=text)["count"] == 6
    assert load(text="name: b\n" + text)["count"] == 6
    assert "count" not in load(["--name", "c"], text=text)
    assert "count" not in load(text=text)  # no selector: no entry applies


def test_an_empty_variable_counts_as_unset() -> None:
    assert load(env={"DEMO_COUNT": "", "DEMO_NAME": "  "}, text="count: 2\n") == {
        "config_file": FILE,
        "count": 2,
    }


def test_config_file_named_by_the_environment() -> None:
    read: list[Path] = []

    def reader(path: Path) -> str:
        read.append(path)
        return "count: 4\n"

    given = loader().load([], {"CONFIG_FILE": "/x/y.yaml"}, reader)
    assert read == [Path("/x/y.yaml")]
    assert given["count"].value == 4 and given["count"].where == "/x/y.yaml line 1: count"


def test_where_each_value_came_from() -> None:
    given = loader().load(
        ["--count", "2", "--config-file", str(FILE)],
        {"DEMO_VERBOSE": "true"},
        lambda _: "words: [a, b]\ninstances:\n- name: n\n\n  verbose: false\n",
    )
    assert given["count"].where == "flag --count"
    assert given["verbose"].where == "environment DEMO_VERBOSE"
    assert given["words"].where == f"{FILE} line 1: words"
    assert given.describe("data") == "the default of --data"
    with_entry = loader().load(
        ["--name", "n", "--config-file", str(FILE)],
        {},
        lambda _: "instances:\n- name: n\n\n  verbose: false\n",
    )
    assert with_entry["verbose"].where == f"{FILE} line 4: instances[0].verbose"


# --- flags --------------------------------------------------------------------------------------------------


def test_boolean_flags_take_an_optional_value_and_repeatable_flags_join() -> None:
    assert load(["--verbose"])["verbose"] is True
    assert load(["--verbose=false"])["verbose"] is False
    assert load(["--verbose", "0"])["verbose"] is False
    assert load(["--word", "a", "--word", "b,c"])["words"] == ("a", "b", "c")


def test_help_names_each_flags_variable_and_default() -> None:
    with pytest.raises(HelpRequested) as info:
        load(["--help"])
    text = " ".join(info.value.text.split())
    assert text.startswith("usage: demo")
    assert "a demo daemon" in text
    assert "--count N how many (100%) (env DEMO_COUNT; default 3)" in text  # "%" survives argparse
    assert "--verbose [BOOL] talk (env DEMO_VERBOSE; default false)" in text
    assert "--word WORD words (env DEMO_WORDS; default none)" in text
    assert "--data FILE a data file (default none)" in text  # no variable
    assert loader().argument_parser("other").format_help().startswith("usage: other")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "command line: unrecognized arguments: --bogus"),
        (["--cou", "1"], "command line: unrecognized arguments: --cou 1"),  # no abbreviations
        (["--count"], "command line: argument --count: expected one argument"),
        (["extra"], "command line: unrecognized arguments: extra"),
    ],
)
def test_a_bad_command_line_is_a_config_error(argv: list[str], message: str) -> None:
    assert str(error(argv)) == message


def test_flags_not_given_are_absent() -> None:
    assert vars(loader().argument_parser().parse_args([])) == {}


# --- a bad value names the source, the key and the value ----------------------------------------------------


# YAML takes any text in a double-quoted scalar but control characters, surrogates and non-characters.
_YAML_TEXT = st.text(st.characters(exclude_categories=("Cc", "Cs", "Cn")), max_size=12)


def _positive_int(text: str) -> bool:
    return INT_PATTERN.fullmatch(text.strip()) is not None and int(text.strip()) >= 1


@given(_YAML_TEXT.filter(lambda t: not _positive_int(t)))
def test_a_bad_value_names_the_key_and_the_value_in_every_source(text: str) -> None:
    shown = json.dumps(text, ensure_ascii=False)
    if text.strip():  # an empty variable is unset
        env_err = error(env={"DEMO_COUNT": text})
        assert str(env_err) == f"environment DEMO_COUNT: expected an integer >= 1, got {shown}"
        assert (env_err.source, env_err.key, env_err.value) == ("environment", "DEMO_COUNT", shown)
    flag_err = error([f"--count={text}"])
    assert str(flag_err) == f"command line --count: expected an integer >= 1, got {shown}"
    assert (flag_err.key, flag_err.value) == ("--count", shown)
    file_err = error(text="\ncount: " + json.dumps(text, ensure_ascii=False) + "\n")
    assert str(file_err) == f"{FILE} line 2: count: expected an integer >= 1, got {shown}"
    assert (file_err.key, file_err.line, file_err.value) == ("count", 2, shown)


def test_a_bad_value_in_an_instance_entry_names_its_path_and_line() -> None:
    err = error(text="instances:\n- name: a\n- name: b\n  # a comment\n  cnt: zero\n")
    assert str(err) == f'{FILE} line 5: instances[1].cnt: expected an integer >= 1, got "zero"'
    assert (err.key, err.line, err.value) == ("instances[1].cnt", 5, '"zero"')


# --- the file -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cont: 1\n", 'line 1: cont: unknown key (did you mean "count"?)'),
        ("\nCOUNT: 1\n", 'line 2: COUNT: unknown key (did you mean "count"?)'),
        ("instance: []\n", 'line 1: instance: unknown key (did you mean "instances"?)'),
        ("colour: red\n", "line 1: colour: unknown key"),
        ("count: 1\ncount: 2\n", "line 2: count: appears twice (also on line 1)"),
        ("instances:\n- name: a\n  cnt: 1\n  cnt: 2\n",
         "line 4: instances[0].cnt: appears twice (also on line 3)"),
        ("a: [1\n", "line 2: is not valid YAML or JSON"),
        ("\n\n- 1\n", "line 3: expected a mapping of settings (count: 3, ...), got [1]"),
        ("1: 2\n", "line 1: 1: keys must be strings"),
        ("instances: {name: a}\n",
         'line 1: instances: expected a list of per-instance entries, got {"name": "a"}'),
        ("instances:\n- a\n", 'line 2: instances[0]: expected a mapping with a name, got "a"'),
        ("instances:\n- cnt: 1\n", "line 2: instances[0]: has no name (the instance it applies to)"),
        ("instances:\n- name: ''\n", 'line 2: instances[0].name: expected a name, got ""'),
        ("instances:\n- name: a\n- name: a\n",
         'line 3: instances[1].name: "a" is already configured by instances[0]'),
        ("instances:\n- name: a\n  count: 1\n",
         'line 3: instances[0].count: unknown instances key (did you mean "cnt"?)'),
        ("instances:\n- name: a\n  words: x\n", "line 3: instances[0].words: unknown instances key"),
    ],
)  # fmt: skip
def test_file_errors_name_the_file_the_line_and_the_key(text: str, message: str) -> None:
    err = str(error(text=text))
    assert err.startswith(f"{FILE} "), err
    assert message in err, err


def test_unreadable_files() -> None:
    assert str(error(["--config-file", "/nope"])) == "/nope: cannot be read: No such file or directory"

    def not_utf8(_: Path) -> str:
        return b"\xff".decode()

    with pytest.raises(ConfigError, match=r"^/x: is not UTF-8 text"):
        loader().load(["--config-file", "/x"], {}, not_utf8)


def test_an_empty_or_null_file_sets_nothing() -> None:
    for text in ("", "# nothing\n", "null\n", "~\n", "{}\n"):
        assert load(text=text) == {"config_file": FILE}


def test_relative_paths_in_the_file_are_relative_to_it_but_not_on_the_command_line() -> None:
    assert load(text="data: d/x.bin\n")["data"] == Path("/etc/demo/d/x.bin")
    assert load(text="data: /abs.bin\n")["data"] == Path("/abs.bin")
    assert load(["--data", "d/x.bin"])["data"] == Path("d/x.bin")


def test_every_instance_entry_is_validated_not_only_the_chosen_one() -> None:
    err = error(["--name", "a"], text="instances:\n- name: a\n- name: b\n  cnt: 0\n")
    assert err.key == "instances[1].cnt"


def test_without_overrides_the_section_is_an_unknown_key() -> None:
    def read(_: Path) -> str:
        return "instances: []\n"

    with pytest.raises(ConfigError, match="instances: unknown key"):
        loader(overrides=False).load(["--config-file", "/f"], {}, read)


def test_document_lines_and_key_paths() -> None:
    doc = parse_document("a:\n  b:\n  - x\n  - {c: 1}\n", "f")
    assert doc.line(("a",)) == 1 and doc.line(("a", "b", 1, "c")) == 4
    assert doc.line(("a", "b", 7)) == 2  # the nearest enclosing key
    assert key_text(("nodeconfig", 1, "devicesplitcount")) == "nodeconfig[1].devicesplitcount"
    assert parse_document("", "f").value is None


# --- the table itself ---------------------------------------------------------------------------------------


def test_a_table_that_cannot_work_is_refused() -> None:
    base = SETTINGS[0]
    with pytest.raises(ValueError, match="same flag"):
        SettingsLoader([base, Setting("other", base.flag, "", "", parse_path, "")], prog="p", description="")
    with pytest.raises(ValueError, match="same file key"):
        SettingsLoader(
            [
                base,
                Setting("a", "--a", "", "k", parse_path, ""),
                Setting("b", "--b", "", "k", parse_path, ""),
            ],
            prog="p",
            description="",
        )
    with pytest.raises(ValueError, match="file setting"):
        SettingsLoader([SETTINGS[1]], prog="p", description="")
    with pytest.raises(ValueError, match="no overrides"):
        SettingsLoader(SETTINGS, prog="p", description="")
    with pytest.raises(ValueError, match="selector"):
        SettingsLoader(SETTINGS, prog="p", description="", overrides=Overrides("i", "nope", parse_path, "x"))
    with pytest.raises(ValueError, match="reads no file"):
        SettingsLoader(SETTINGS[1:3], prog="p", description="", file_setting=None)
    with pytest.raises(ValueError, match="no read_file"):
        loader().load(["--config-file", "/f"], {})


def test_a_loader_without_a_file_reads_flags_and_environment() -> None:
    only = SettingsLoader(
        [Setting("n", "--n", "N", "", parse_int(0), "a number", "N")],
        prog="p",
        description="",
        file_setting=None,
    )
    assert only.load([], {"N": "2"})["n"].value == 2
    assert only.load(["--n", "3"], {"N": "2"})["n"].value == 3
    assert "n" not in only.load([], {})


# --- the shared value parsers -------------------------------------------------------------------------------


@given(
    st.one_of(
        st.just(""),
        st.sampled_from(["localhost", "0.0.0.0", "hami-control.hami-system.svc"]),
        st.ip_addresses(v=6).map(str),
    ),
    st.integers(0, 65535),
)
def test_listen_addresses_parse_back_from_their_text(host: str, port: int) -> None:
    address = ListenAddress(host, port)
    assert parse_listen_address(str(address)) == address
    assert parse_listen_address(f"  {address}  ") == address


@pytest.mark.parametrize(
    "text", ["9443", "host:", ":65536", "[::1]9443", "[nothex]:1", "bad host:1", "a:-1", ""]
)
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(Invalid, match="HOST:PORT"):
        parse_listen_address(text)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_numbers_are_finite_and_above_the_bound(number: float) -> None:
    positive = parse_number(0, inclusive=False)
    for value in (number, repr(number)):
        if number > 0 and number != float("inf"):
            assert positive(value) == number
        else:
            with pytest.raises(Invalid, match="a number > 0"):
                positive(value)
    assert parse_number(0, inclusive=True)(0) == 0.0
    with pytest.raises(Invalid, match="seconds"):
        parse_number(0, inclusive=False, expected="a number of seconds")(True)


def test_resource_names_and_paths() -> None:
    assert parse_resource_name(" nvidia.com/gpu ") == "nvidia.com/gpu"
    with pytest.raises(Invalid, match=r"such as nvidia\.com/gpu"):
        parse_resource_name("gpu")
    with pytest.raises(Invalid, match=r"outside kubernetes\.io"):
        parse_resource_name("node.kubernetes.io/gpu")
    assert parse_path(" /a/b ") == Path("/a/b")
    for bad in ("", "  ", "x" * 5000, 3):
        with pytest.raises(Invalid, match="a path"):
            parse_path(bad)


def test_a_path_with_a_nul_character_is_refused_with_the_reason() -> None:
    with pytest.raises(Invalid, match="without a NUL character"):
        parse_path("/etc/hami\x00/device-config.yaml")
