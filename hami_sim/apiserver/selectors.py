"""Label and field selectors as kube-apiserver parses and applies them (pure, no I/O).

Label selectors: the query-string syntax (`labelSelector=`), parsed like
k8s.io/apimachinery/pkg/labels, and metav1.LabelSelector objects (`matchLabels`/`matchExpressions`).
Field selectors: `fieldSelector=` terms `field=value`, `field==value`, `field!=value` over the dotted path
of the object, restricted to the fields a resource supports.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "EVERYTHING",
    "NOTHING",
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "SelectorError",
    "label_selector_from_object",
    "parse_field_selector",
    "parse_label_selector",
    "validate_label_key",
    "validate_label_value",
]


class SelectorError(ValueError):
    """A selector that does not parse or names an unsupported field (kube-like message)."""


# ------------------------------------------------------------------------------------------ validation

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)


def _key_problem(key: str) -> str | None:
    parts = key.split("/")
    if len(parts) > 2:
        return "a qualified name must consist of an optional DNS subdomain prefix and '/' and a name"
    if len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > 253:
            return "prefix part must be no more than 253 characters"
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return (
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character"
            )
    else:
        name = parts[0]
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _NAME.fullmatch(name):
        return f"name part {_NAME_RULE}"
    return None


def _value_problem(value: str) -> str | None:
    if len(value) > 63:
        return "must be no more than 63 characters"
    if value and not _NAME.fullmatch(value):
        return f"a valid label must be an empty string or {_NAME_RULE}"
    return None


def validate_label_key(key: str, field: str = "key") -> None:
    """Raise SelectorError unless `key` is a qualified name (optional DNS prefix + '/' + name)."""
    problem = _key_problem(key)
    if problem:
        raise SelectorError(f'unable to parse requirement: {field}: Invalid value: "{key}": {problem}')


def validate_label_value(value: str, field: str = "value") -> None:
    """Raise SelectorError unless `value` is a valid label value (empty or a name, <= 63 chars)."""
    problem = _value_problem(value)
    if problem:
        raise SelectorError(f'unable to parse requirement: {field}: Invalid value: "{value}": {problem}')


# ----------------------------------------------------------------------------------- label selectors

Operator = Literal["=", "!=", "in", "notin", "exists", "!", "gt", "lt"]
_SET_OPS = ("in", "notin")
_ONE_VALUE_OPS = ("=", "!=", "gt", "lt")


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector. `values` is sorted and de-duplicated."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    @staticmethod
    def make(key: str, operator: Operator, values: Collection[str] = ()) -> Requirement:
        """A validated requirement (kube's NewRequirement)."""
        validate_label_key(key)
        vals = tuple(sorted(set(values)))
        if operator in _SET_OPS and not vals:
            raise SelectorError(
                "unable to parse requirement: values: Invalid value: []: "
                "for 'in', 'notin' operators, values set can't be empty"
            )
        if operator in _ONE_VALUE_OPS and len(vals) != 1:
            raise SelectorError(
                f"unable to parse requirement: values: Invalid value: {list(vals)}: "
                "exact-match compatibility requires one single value"
            )
        if operator in ("exists", "!") and vals:
            raise SelectorError(
                f"unable to parse requirement: values: Invalid value: {list(vals)}: "
                "values set must be empty for exists and does not exist"
            )
        if operator in ("gt", "lt"):
            if not re.fullmatch(r"[-+]?[0-9]+", vals[0]):
                raise SelectorError(
                    f'unable to parse requirement: values[0]: Invalid value: "{vals[0]}": '
                    "for 'Gt', 'Lt' operators, the value must be an integer"
                )
        else:
            for i, value in enumerate(vals):
                validate_label_value(value, f"values[{i}][{key}]")
        return Requirement(key, operator, vals)

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        present = self.key in labels
        if op in ("=", "in"):
            return present and labels[self.key] in self.values
        if op in ("!=", "notin"):
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        try:
            have = int(labels[self.key])
        except ValueError:
            return False
        want = int(self.values[0])
        return have > want if op == "gt" else have < want

    def __str__(self) -> str:
        op = self.operator
        if op == "exists":
            return self.key
        if op == "!":
            return f"!{self.key}"
        if op in _SET_OPS:
            members = "," if self.values == ("",) else ",".join(self.values)
            return f"{self.key} {op} ({members})"
        symbol = {"gt": ">", "lt": "<"}.get(op, op)
        return f"{self.key}{symbol}{self.values[0]}"


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements. `LabelSelector()` matches everything; `NOTHING` matches nothing."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True when the selector matches every label set."""
        return not self.nothing and not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)

_SPECIAL = "!=(),<>"
_Token = tuple[str, str]  # (kind, literal); kinds: id ! = == != ( ) , > < end


def _lex(text: str) -> Iterator[_Token]:
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in _SPECIAL:
            two = text[i : i + 2]
            if two in ("==", "!="):
                yield (two, two)
                i += 2
            else:
                yield (ch, ch)
                i += 1
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] not in _SPECIAL:
                i += 1
            yield ("id", text[start:i])
    yield ("end", "")


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = list(_lex(text))
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        if token[0] != "end":
            self.pos += 1
        return token

    @staticmethod
    def expected(token: _Token, what: str) -> SelectorError:
        return SelectorError(f"found '{token[1]}', expected: {what}")

    def parse(self) -> LabelSelector:
        requirements: list[Requirement] = []
        while True:
            kind, _ = self.peek()
            if kind == "end":
                break
            if kind not in ("id", "!"):
                raise self.expected(self.peek(), "!, identifier, or 'end of string'")
            requirements.append(self.requirement())
            kind, _ = self.peek()
            if kind == "end":
                break
            if kind != ",":
                raise self.expected(self.peek(), "',' or 'end of string'")
            self.take()
            if self.peek()[0] == "end":
                raise self.expected(self.peek(), "identifier after ','")
        return LabelSelector(tuple(requirements))

    def requirement(self) -> Requirement:
        if self.peek()[0] == "!":
            self.take()
            token = self.take()
            if token[0] != "id":
                raise self.expected(token, "identifier")
            return Requirement.make(token[1], "!")
        key = self.take()[1]
        token = self.peek()
        if token[0] in ("end", ","):
            return Requirement.make(key, "exists")
        self.take()
        if token[0] == "id" and token[1] in _SET_OPS:
            operator: Operator = "in" if token[1] == "in" else "notin"
            return Requirement.make(key, operator, self.value_set())
        single: dict[str, Operator] = {"=": "=", "==": "=", "!=": "!=", ">": "gt", "<": "lt"}
        if token[0] not in single:
            raise self.expected(token, "=, !=, ==, >, <, in, notin")
        return Requirement.make(key, single[token[0]], [self.exact_value()])

    def exact_value(self) -> str:
        token = self.peek()
        if token[0] in ("end", ","):
            return ""
        self.take()
        if token[0] != "id":
            raise self.expected(token, "identifier")
        return token[1]

    def value_set(self) -> list[str]:
        """`(v1, v2, ...)`; empty members (`(a,)`, `(a,,b)`) are the empty string, as in kube."""
        token = self.take()
        if token[0] != "(":
            raise self.expected(token, "'('")
        values: list[str] = []
        need_value, seen_comma = True, False
        while True:
            token = self.take()
            kind = token[0]
            if kind == "id" and need_value:
                values.append(token[1])
                need_value = False
            elif kind == "id":
                raise self.expected(token, "',' or ')'")
            elif kind == ",":
                if need_value:
                    values.append("")
                need_value, seen_comma = True, True
            elif kind == ")":
                if need_value and seen_comma:
                    values.append("")
                return values
            else:
                raise self.expected(token, "',', or identifier")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the `labelSelector` query syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`,
    `a`, `!a`, `a>1`, `a<1`, comma-joined. An empty or blank string selects everything."""
    if not text.strip():
        return EVERYTHING
    return _LabelParser(text).parse()


_EXPRESSION_OPS: dict[str, Operator] = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def label_selector_from_object(sel: Mapping[str, Any] | None) -> LabelSelector:
    """A metav1.LabelSelector (`{matchLabels, matchExpressions}`). None or `{}` selects everything,
    as for webhook namespaceSelector/objectSelector."""
    if not sel:
        return EVERYTHING
    if not isinstance(sel, Mapping):
        raise SelectorError(f"label selector must be an object, got {type(sel).__name__}")
    unknown = set(sel) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise SelectorError(f"label selector has unknown fields: {', '.join(sorted(unknown))}")
    requirements: list[Requirement] = []
    match_labels = sel.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError("matchLabels must be an object of label keys to values")
    for key, value in match_labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SelectorError(f"matchLabels[{key!r}]: label keys and values must be strings, got {value!r}")
        requirements.append(Requirement.make(key, "=", [value]))
    expressions = sel.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError("matchExpressions must be a list")
    for i, expr in enumerate(expressions):
        if not isinstance(expr, Mapping):
            raise SelectorError(f"matchExpressions[{i}] must be an object, got {expr!r}")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str):
            raise SelectorError(f"matchExpressions[{i}].key must be a string, got {key!r}")
        if op not in _EXPRESSION_OPS:
            raise SelectorError(
                f"matchExpressions[{i}].operator: {op!r} is not a valid label selector operator"
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"matchExpressions[{i}].values must be a list of strings, got {values!r}")
        requirements.append(Requirement.make(key, _EXPRESSION_OPS[op], values))
    return LabelSelector(tuple(requirements))


# ----------------------------------------------------------------------------------- field selectors


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    operator: Literal["=", "!="]
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        equal = field_value(obj, self.field) == self.value
        return equal if self.operator == "=" else not equal

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.field}{self.operator}{escaped}"


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of field terms; `FieldSelector()` matches everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def required_value(self, field: str) -> str | None:
        """The value an `=` term pins `field` to (for index look-ups), or None."""
        for r in self.requirements:
            if r.field == field and r.operator == "=":
                return r.value
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path as a field selector sees it: missing -> "", booleans lower-case."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            current.append(ch)
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _unescape(value: str, selector: str) -> str:
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            nxt = value[i + 1 : i + 2]
            if nxt not in ("\\", ",", "="):
                raise SelectorError(
                    f"invalid field selector: invalid escape sequence: '\\{nxt}' in {selector!r}"
                )
            out.append(nxt)
            i += 2
            continue
        if ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped {ch!r} in value of {selector!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def parse_field_selector(text: str, supported: Collection[str]) -> FieldSelector:
    """Parse `fieldSelector`: comma-joined `field=value`, `field==value`, `field!=value` terms
    (`\\`, `\\,`, `\\=` escape in values). Fields outside `supported` are rejected."""
    requirements: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        if not term:
            continue
        found = next(
            ((i, op) for i in range(len(term)) for op in ("!=", "==", "=") if term.startswith(op, i)), None
        )
        if found is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        i, op = found
        name, value = term[:i], _unescape(term[i + len(op) :], text)
        if name not in supported:
            raise SelectorError(f"field label not supported: {name}")
        requirements.append(FieldRequirement(name, "!=" if op == "!=" else "=", value))
    return FieldSelector(tuple(requirements))
