"""Label selectors (query syntax and metav1.LabelSelector) and field selectors."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_sim.apiserver.selectors import (
    EVERYTHING,
    NOTHING,
    FieldRequirement,
    FieldSelector,
    LabelSelector,
    Requirement,
    SelectorError,
    label_selector_from_object,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "x", "tier": "gpu", "hami.io/gpus": "2", "empty": ""}

PARSE_CASES = [
    ("", "", True),
    ("   ", "", True),
    ("app=x", "app=x", True),
    ("app==x", "app=x", True),
    ("app = x", "app=x", True),
    ("app!=x", "app!=x", False),
    ("missing!=x", "missing!=x", True),
    ("app in (x, y)", "app in (x,y)", True),
    ("app in (y)", "app in (y)", False),
    ("app notin (y,z)", "app notin (y,z)", True),
    ("missing notin (y)", "missing notin (y)", True),
    ("app", "app", True),
    ("!app", "!app", False),
    ("!missing", "!missing", True),
    ("app=x,tier=gpu", "app=x,tier=gpu", True),
    ("app=x , tier!=gpu", "app=x,tier!=gpu", False),
    ("hami.io/gpus>1", "hami.io/gpus>1", True),
    ("hami.io/gpus<2", "hami.io/gpus<2", False),
    ("app>1", "app>1", False),
    ("empty=", "empty=", True),
    ("empty in (,a)", "empty in (,a)", True),
    ("app in (a,)", "app in (,a)", False),
    ("x in (in, notin)", "x in (in,notin)", False),
    ("app=in", "app=in", False),
    ("a.b-c/d_e.f=g", "a.b-c/d_e.f=g", False),
]


@pytest.mark.parametrize(("text", "canonical", "matches"), PARSE_CASES)
def test_parse_label_selector(text: str, canonical: str, matches: bool) -> None:
    selector = parse_label_selector(text)
    assert str(selector) == canonical
    assert selector.matches(LABELS) is matches
    assert parse_label_selector(canonical) == selector


PARSE_ERRORS = [
    ("app=x,", "found '', expected: identifier after ','"),
    (",app", "found ',', expected: !, identifier, or 'end of string'"),
    ("app x", "found 'x', expected: =, !=, ==, >, <, in, notin"),
    ("app=x y", "found 'y', expected: ',' or 'end of string'"),
    ("app in x", "found 'x', expected: '('"),
    ("app in (x y)", "found 'y', expected: ',' or ')'"),
    ("app in (x", "found '', expected: ',', or identifier"),
    ("app in ()", "for 'in', 'notin' operators, values set can't be empty"),
    ("!", "found '', expected: identifier"),
    ("app=(", "found '(', expected: identifier"),
    ("a/b/c=x", 'unable to parse requirement: key: Invalid value: "a/b/c"'),
    ("-app=x", "name part must consist of alphanumeric characters"),
    ("Upper.Case/app=x", "prefix part a lowercase RFC 1123 subdomain"),
    ("/app=x", "prefix part must be non-empty"),
    ("a" * 64 + "=x", "name part must be no more than 63 characters"),
    ("app=" + "v" * 64, "must be no more than 63 characters"),
    ("app=-x", 'unable to parse requirement: values[0][app]: Invalid value: "-x": a valid label must be'),
    ("app>x", "the value must be an integer"),
]


@pytest.mark.parametrize(("text", "message"), PARSE_ERRORS)
def test_parse_label_selector_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_label_selector(text)
    assert message in str(caught.value)


def test_everything_and_nothing() -> None:
    assert EVERYTHING.matches({}) and EVERYTHING.matches(LABELS) and EVERYTHING.empty
    assert not NOTHING.matches({}) and not NOTHING.matches(LABELS) and not NOTHING.empty
    assert LabelSelector().matches(None)


OBJECT_CASES: list[tuple[dict[str, Any] | None, bool]] = [
    (None, True),
    ({}, True),
    ({"matchLabels": {"app": "x"}}, True),
    ({"matchLabels": {"app": "y"}}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
    ({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
    ({"matchLabels": {}, "matchExpressions": []}, True),
]


@pytest.mark.parametrize(("selector", "matches"), OBJECT_CASES)
def test_label_selector_from_object(selector: dict[str, Any] | None, matches: bool) -> None:
    assert label_selector_from_object(selector).matches(LABELS) is matches


OBJECT_ERRORS: list[tuple[Any, str]] = [
    ({"matchLabels": {"app": 1}}, "label keys and values must be strings"),
    ({"matchLabels": ["app"]}, "matchLabels must be an object"),
    ({"matchLabels": {"bad key": "x"}}, 'key: Invalid value: "bad key"'),
    (
        {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]},
        "'Equals' is not a valid label selector operator",
    ),
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "values set can't be empty"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "values set must be empty"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key must be a string"),
    ({"matchExpressions": {"key": "a"}}, "matchExpressions must be a list"),
    ({"matchExpressions": ["a"]}, "matchExpressions[0] must be an object"),
    (
        {"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]},
        "values must be a list of strings",
    ),
    ({"matchLabel": {}}, "unknown fields: matchLabel"),
]


@pytest.mark.parametrize(("selector", "message"), OBJECT_ERRORS)
def test_label_selector_from_object_errors(selector: Any, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        label_selector_from_object(selector)
    assert message in str(caught.value)


# ------------------------------------------------------------------------------------------ hypothesis

label_keys = st.sampled_from(["app", "tier", "hami.io/gpu", "k8s.io/x_y", "a1"])
label_values = st.sampled_from(["", "x", "y", "gpu", "1", "2", "a.b-c_d"])
label_sets = st.dictionaries(label_keys, label_values, max_size=5)


@st.composite
def requirements(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    op = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!", ">", "<"]))
    if op in ("in", "notin"):
        values = draw(st.lists(label_values, min_size=1, max_size=3))
    elif op in (">", "<"):
        values = [str(draw(st.integers(-5, 5)))]
    elif op in ("exists", "!"):
        values = []
    else:
        values = [draw(label_values)]
    return draw(label_keys), op, values


def render(key: str, op: str, values: list[str]) -> str:
    if op == "exists":
        return f" {key} "
    if op == "!":
        return f"! {key}"
    if op in ("in", "notin"):
        members = " , " if values == [""] else " , ".join(values)  # "()" would be the empty set
        return f"{key} {op} ( {members} )"
    return f"{key} {op} {values[0]}"


def expected_match(labels: dict[str, str], key: str, op: str, values: list[str]) -> bool:
    present = key in labels
    value = labels.get(key)
    if op in ("=", "==", "in"):
        return present and value in values
    if op in ("!=", "notin"):
        return not present or value not in values
    if op == "exists":
        return present
    if op == "!":
        return not present
    if not present or value is None or not value.lstrip("-").isdigit():
        return False
    return int(value) > int(values[0]) if op == ">" else int(value) < int(values[0])


@given(label_sets, st.lists(requirements(), max_size=4))
def test_parsed_selectors_match_like_kubernetes(
    labels: dict[str, str], reqs: list[tuple[str, str, list[str]]]
) -> None:
    text = ",".join(render(*r) for r in reqs)
    selector = parse_label_selector(text)
    assert selector.matches(labels) is all(expected_match(labels, *r) for r in reqs)
    assert parse_label_selector(str(selector)) == selector


@given(label_sets, label_sets)
def test_match_labels_object_is_a_subset_test(labels: dict[str, str], wanted: dict[str, str]) -> None:
    selector = label_selector_from_object({"matchLabels": wanted})
    assert selector.matches(labels) is all(labels.get(k) == v for k, v in wanted.items())


@given(
    st.from_regex(
        r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?", fullmatch=True
    )
)
def test_qualified_keys_are_accepted(key: str) -> None:
    if ".." not in key and ".-" not in key and "-." not in key.split("/", maxsplit=1)[0]:
        assert Requirement.make(key, "exists").key == key


@given(st.text(min_size=1, max_size=70))
def test_arbitrary_text_parses_or_raises_selector_error(text: str) -> None:
    with contextlib.suppress(SelectorError):
        parse_label_selector(text)


# ------------------------------------------------------------------------------------- field selectors

POD_FIELDS = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.unschedulable"}
POD = {
    "metadata": {"name": "p", "namespace": "default"},
    "spec": {"nodeName": "n1"},
    "status": {"phase": "Running"},
}

FIELD_CASES = [
    ("", True),
    ("metadata.name=p", True),
    ("metadata.name==p", True),
    ("metadata.name!=p", False),
    ("spec.nodeName=n1,status.phase=Running", True),
    ("spec.nodeName=n1,status.phase!=Running", False),
    ("spec.nodeName=", False),
    ("spec.nodeName!=", True),
    ("spec.unschedulable=", True),  # a missing field compares as ""
    ("metadata.namespace=other", False),
    (",metadata.name=p,", True),
]


@pytest.mark.parametrize(("text", "matches"), FIELD_CASES)
def test_field_selector(text: str, matches: bool) -> None:
    assert parse_field_selector(text, POD_FIELDS).matches(POD) is matches


def test_field_selector_values_are_strings_of_the_path() -> None:
    node = {"spec": {"unschedulable": True}, "status": {"count": 3}}
    fields = {"spec.unschedulable", "status.count"}
    assert parse_field_selector("spec.unschedulable=true", fields).matches(node)
    assert parse_field_selector("status.count=3", fields).matches(node)
    assert parse_field_selector("spec.unschedulable=false", fields).matches(
        {"spec": {"unschedulable": False}}
    )


def test_field_selector_escapes_and_helpers() -> None:
    selector = parse_field_selector(r"metadata.name=a\,b\=c\\d", POD_FIELDS)
    assert selector.matches({"metadata": {"name": "a,b=c\\d"}})
    assert parse_field_selector(str(selector), POD_FIELDS) == selector
    assert selector.required_value("metadata.name") == "a,b=c\\d"
    assert selector.required_value("spec.nodeName") is None
    assert FieldSelector().empty and FieldSelector().matches({})


FIELD_ERRORS = [
    ("spec.foo=1", "field label not supported: spec.foo"),
    ("metadata.name", "invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
    ("metadata.name=a=b", "unescaped '='"),
    (r"metadata.name=a\x", "invalid escape sequence"),
]


@pytest.mark.parametrize(("text", "message"), FIELD_ERRORS)
def test_field_selector_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_field_selector(text, POD_FIELDS)
    assert message in str(caught.value)


@given(st.text(alphabet="ab,=\\ !", max_size=12))
def test_field_selector_values_round_trip(value: str) -> None:
    selector = FieldSelector((FieldRequirement("metadata.name", "=", value),))
    parsed = parse_field_selector(str(selector), POD_FIELDS)
    assert parsed == selector
    assert parsed.matches({"metadata": {"name": value}})
