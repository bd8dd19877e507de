"""CEL device selectors as kube-scheduler evaluates them, on `common-expression-language` (import `cel`,
a Rust CEL interpreter) plus the Kubernetes functions DRA selectors use. Pure: no I/O, no clock.

Upstream: `k8s.io/dynamic-resource-allocation/cel/compile.go` (v0.35.0). The only variable is `device`:

- `device.driver` (string), `device.allowMultipleAllocations` (bool);
- `device.attributes["<domain>"].<id>`: int, bool, string, or a semantic version (a `version` attribute);
- `device.capacity["<domain>"].<id>`: a quantity (the capacity's `value`).

Names without a domain belong to the driver's domain (`memory` on driver `d` is
`device.capacity["d"].memory`). An unknown domain reads as an empty map, so
`device.attributes["other.example.com"].x` is a "no such key" runtime error, as upstream.

The subset of the Kubernetes CEL environment (`k8s.io/apiserver/pkg/cel/library`) served here:

- CEL's core: operators, `in`, `size`, `has`, the macros `all`/`exists`/`exists_one`/`map`/`filter`,
  conversions, and the string functions `contains`, `startsWith`, `endsWith`, `matches` (the Rust
  `regex` crate: RE2 syntax as cel-go's);
- cel-go's string extensions `charAt`, `indexOf`, `lastIndexOf`, `substring`, `replace`, `split`, `join`,
  `lowerAscii`, `upperAscii`, `trim`, `reverse`; `math.*` (`math.greatest`, `math.least`, ...) and
  `sets.contains` / `sets.equivalent` / `sets.intersects` (from `cel.stdlib`);
- quantities (`library/quantity.go`): `quantity(s)`, `isQuantity(s)`, `q.compareTo(q)`,
  `q.isGreaterThan(q)`, `q.isLessThan(q)`, `q.asInteger()`, `q.isInteger()`, `q.asApproximateFloat()`,
  `q.sign()`, `q.add(q|int)`, `q.sub(q|int)`; `==` compares quantities by value (`1Gi == 1024Mi`);
- semantic versions (`library/semverlib.go`): `semver(s)`, `semver(s, true)` (normalize: `v` prefix,
  missing minor/patch, leading zeros), `isSemver(s[, true])`, `v.major()`, `v.minor()`, `v.patch()`,
  `v.compareTo(v)`, `v.isGreaterThan(v)`, `v.isLessThan(v)`; `==` ignores build metadata.

Not served: `cel.bind` (the interpreter has no bindings macro), the list library (`isSorted`, `sum`,
`min`, `max`), `url`, `ip`/`cidr`, `format`, regex `find`/`findAll`, the runtime cost limit
(`CELSelectorExpressionMaxCost`) and compile-time type checking: a reference to an unknown function
fails when it is evaluated, not when it is compiled. `"d" in device.attributes` is true for the driver's
domain and for every domain the expression indexes with a string literal (they are the empty maps that
upstream's lookup default gives; upstream's `in` says false for a domain the device lacks).

Quantities and versions are CEL maps with one key (`@quantity`: the exact value as `n/d`, `@semver`: the
version without build metadata), so `==` compares them by value; the functions above check the key.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import cel

from hami_api.errors import QuantityError
from hami_api.quantity import parse_quantity

QUANTITY_KEY: Final = "@quantity"
SEMVER_KEY: Final = "@semver"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Json = dict[str, Any]


class SelectorError(Exception):
    """A selector that cannot be compiled, or failed when evaluated; `kind` is "compile" or "runtime",
    `detail` what went wrong (upstream's `CEL compile error: <detail>` / `CEL runtime error: <detail>`)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"CEL {kind} error: {detail}")
        self.kind = kind
        self.detail = detail


# --- quantities ----------------------------------------------------------------------------------------


def quantity_value(value: Fraction) -> Json:
    """A quantity as the selectors see it."""
    return {QUANTITY_KEY: f"{value.numerator}/{value.denominator}"}


def _q(arg: Any, function: str) -> Fraction:
    if isinstance(arg, dict) and QUANTITY_KEY in arg:
        return Fraction(str(arg[QUANTITY_KEY]))
    raise TypeError(f"no such overload: {function} needs a quantity, got {type(arg).__name__}")


def _q_or_int(arg: Any, function: str) -> Fraction:
    if isinstance(arg, int) and not isinstance(arg, bool):
        return Fraction(arg)
    return _q(arg, function)


def _quantity(text: Any) -> Json:
    if not isinstance(text, str):
        raise TypeError("no such overload: quantity needs a string")
    try:
        return quantity_value(parse_quantity(text))
    except QuantityError as err:
        raise ValueError(f"quantities must match the regular expression: {err}") from None


def _is_quantity(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def _cmp(a: Fraction | tuple[Any, ...], b: Fraction | tuple[Any, ...]) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


def _as_integer(q: Any) -> int:
    value = _q(q, "asInteger")
    if value.denominator != 1 or not INT64_MIN <= value.numerator <= INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return value.numerator


def _is_integer(q: Any) -> bool:
    value = _q(q, "isInteger")
    return value.denominator == 1 and INT64_MIN <= value.numerator <= INT64_MAX


# --- semantic versions (semver 2.0.0, blang/semver's Parse and ParseTolerant) ---------------------------

_NUM = r"0|[1-9][0-9]*"
_IDENT = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?(?:\+(?P<build>{_IDENT}(?:\.{_IDENT})*))?"
)


@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def __str__(self) -> str:
        pre = f"-{'.'.join(self.pre)}" if self.pre else ""
        return f"{self.major}.{self.minor}.{self.patch}{pre}"

    def key(self) -> tuple[Any, ...]:
        """Precedence (semver 2.0.0 §11): a release ranks above its prereleases; numeric identifiers
        below alphanumeric ones and compared as numbers."""
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """blang/semver's `Parse` (strict), or with `normalize` the apiserver library's tolerant form: a
    leading `v`, missing minor/patch and leading zeros are accepted. ValueError when it does not parse."""
    candidate = text
    if normalize:
        candidate = candidate.strip().removeprefix("v")
        cut = min((i for i in (candidate.find("-"), candidate.find("+")) if i >= 0), default=len(candidate))
        parts = candidate[:cut].split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
            candidate = ".".join(parts) + candidate[cut:]
    match = _SEMVER.fullmatch(candidate)
    if match is None:
        raise ValueError(f"invalid semantic version {text!r}")
    pre = tuple(match["pre"].split(".")) if match["pre"] else ()
    for identifier in pre:
        if identifier.isdigit() and len(identifier) > 1 and identifier.startswith("0"):
            raise ValueError(f"invalid semantic version {text!r}: numeric prerelease with a leading zero")
    return Semver(int(match["major"]), int(match["minor"]), int(match["patch"]), pre)


def semver_value(version: Semver) -> Json:
    return {SEMVER_KEY: str(version)}


def _v(arg: Any, function: str) -> Semver:
    if isinstance(arg, dict) and SEMVER_KEY in arg:
        return parse_semver(str(arg[SEMVER_KEY]))
    raise TypeError(f"no such overload: {function} needs a semver, got {type(arg).__name__}")


def _semver(text: Any, normalize: bool = False) -> Json:
    if not isinstance(text, str):
        raise TypeError("no such overload: semver needs a string")
    return semver_value(parse_semver(text, bool(normalize)))


def _is_semver(text: Any, normalize: bool = False) -> bool:
    if not isinstance(text, str):
        return False
    try:
        parse_semver(text, bool(normalize))
    except ValueError:
        return False
    return True


# --- functions shared by quantities and versions --------------------------------------------------------


def _ordered(a: Any, b: Any, function: str) -> int:
    if isinstance(a, dict) and SEMVER_KEY in a:
        return _cmp(_v(a, function).key(), _v(b, function).key())
    return _cmp(_q(a, function), _q(b, function))


def _compare_to(a: Any, b: Any) -> int:
    return _ordered(a, b, "compareTo")


def _is_greater_than(a: Any, b: Any) -> bool:
    return _ordered(a, b, "isGreaterThan") > 0


def _is_less_than(a: Any, b: Any) -> bool:
    return _ordered(a, b, "isLessThan") < 0


def _sign(q: Any) -> int:
    value = _q(q, "sign")
    return (value > 0) - (value < 0)


KUBERNETES_FUNCTIONS: Final[Mapping[str, Callable[..., Any]]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "asInteger": _as_integer,
    "isInteger": _is_integer,
    "asApproximateFloat": lambda q: float(_q(q, "asApproximateFloat")),
    "sign": _sign,
    "add": lambda a, b: quantity_value(_q(a, "add") + _q_or_int(b, "add")),
    "sub": lambda a, b: quantity_value(_q(a, "sub") - _q_or_int(b, "sub")),
    "semver": _semver,
    "isSemver": _is_semver,
    "major": lambda v: _v(v, "major").major,
    "minor": lambda v: _v(v, "minor").minor,
    "patch": lambda v: _v(v, "patch").patch,
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
}
"""The Kubernetes CEL functions a selector may call (quantities, semver, comparisons)."""


@cache
def _cel() -> Any:
    """The CEL library, imported at the first selector: `import cel` also loads its command line's
    dependencies (about 190 ms), which every `hami-sim` sub-command would pay at start otherwise."""
    import cel

    return cel


@cache
def functions() -> Mapping[str, Callable[..., Any]]:
    """Every function a selector may call (beyond CEL's core): cel-go's strings, math and sets
    extensions, then the Kubernetes ones."""
    stdlib = _cel().stdlib
    return {
        **stdlib.EXTENSIONS["strings"],
        **stdlib.EXTENSIONS["math"],
        **stdlib.EXTENSIONS["sets"],
        **KUBERNETES_FUNCTIONS,
    }


# --- compiled selectors ------------------------------------------------------------------------------

_STRING = r"""(?:[rR]?(?:'''(?:.|\n)*?'''|\"\"\"(?:.|\n)*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))"""
_INDEXED_DOMAIN = re.compile(rf"\b(?:attributes|capacity)\s*\[\s*({_STRING})\s*\]")


def _literal_text(literal: str) -> str | None:
    """The value of a plain string literal (None for one with escapes: no domain has them)."""
    body = literal[1:] if literal[0] in "rR" else literal
    quote = body[:3] if body[:3] in ("'''", '"""') else body[0]
    text = body[len(quote) : -len(quote)]
    return None if "\\" in text else text


_CEL_TYPES = {int: "int", float: "double", str: "string", bytes: "bytes", list: "list", dict: "map"}


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled expression (or why it does not compile), with the domains it indexes by a literal."""

    expression: str
    program: cel.Program | None
    error: str
    domains: frozenset[str]

    def matches(self, device: DeviceView) -> bool:
        """Evaluate for one device: True/False, or SelectorError (compile error, runtime error, result
        not a bool)."""
        if self.program is None:
            raise SelectorError("compile", self.error)
        context = device.context(self.domains)
        try:
            result = self.program.execute(context)
        except (RuntimeError, ValueError, TypeError, KeyError, OverflowError) as err:
            detail = f"no such key: {err.args[0]}" if isinstance(err, KeyError) and err.args else str(err)
            raise SelectorError("runtime", detail) from None
        if not isinstance(result, bool):
            kind = _CEL_TYPES.get(type(result), type(result).__name__)
            raise SelectorError("runtime", f"CEL result of type {kind} could not be converted to bool")
        return result


def compile_selector(expression: str) -> Selector:
    """Compile once; the result (or the compile error) is reused for every device."""
    domains = frozenset(
        text
        for literal in _INDEXED_DOMAIN.findall(expression)
        if (text := _literal_text(literal)) is not None
    )
    try:
        program = _cel().compile(expression)
    except (ValueError, RuntimeError) as err:
        return Selector(expression, None, f"compilation failed: {err}", domains)
    return Selector(expression, program, "", domains)


class SelectorCache:
    """Compiled selectors by expression, least recently used dropped beyond `size` (upstream's scheduler
    keeps an LRU of 10; a larger one costs little here)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[str, Selector] = OrderedDict()
        self.compiled = 0

    def get(self, expression: str) -> Selector:
        selector = self._entries.get(expression)
        if selector is not None:
            self._entries.move_to_end(expression)
            return selector
        selector = compile_selector(expression)
        self.compiled += 1
        self._entries[expression] = selector
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return selector


# --- the device variable ----------------------------------------------------------------------------


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    """`domain/id` -> (domain, id); an unqualified name belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def attribute_value(attribute: Mapping[str, Any]) -> Any:
    """A DeviceAttribute's one value as CEL sees it; ValueError for none or a bad version."""
    if "int" in attribute:
        return int(attribute["int"])
    if "bool" in attribute:
        return bool(attribute["bool"])
    if "string" in attribute:
        return str(attribute["string"])
    if "version" in attribute:
        try:
            return semver_value(parse_semver(str(attribute["version"])))
        except ValueError as err:
            raise ValueError(f"parse semantic version: {err}") from None
    raise ValueError("unsupported attribute value")


class DeviceView:
    """The `device` variable of one device, built on first use and kept (a device in a ResourceSlice
    never changes; a new slice version is a new DeviceView)."""

    __slots__ = ("_base", "_contexts", "_error", "allow_multiple", "attributes", "capacity", "driver")

    def __init__(
        self,
        driver: str,
        attributes: Mapping[str, Mapping[str, Any]],
        capacity: Mapping[str, Fraction],
        allow_multiple: bool,
    ) -> None:
        self.driver = driver
        self.attributes = attributes
        self.capacity = capacity
        self.allow_multiple = allow_multiple
        self._base: Json | None = None
        self._contexts: dict[frozenset[str], cel.Context] = {}
        self._error = ""

    def variable(self) -> Json:
        """The `device` value (its attribute and capacity maps by domain). SelectorError when an
        attribute cannot be represented (upstream fails the evaluation the same way)."""
        if self._base is None:
            attributes: dict[str, Json] = {self.driver: {}}
            for name, attribute in self.attributes.items():
                domain, ident = split_qualified(name, self.driver)
                try:
                    value = attribute_value(attribute)
                except ValueError as err:
                    self._error = f"attribute {name}: {err}"
                    raise SelectorError("runtime", self._error) from None
                attributes.setdefault(domain, {})[ident] = value
            capacity: dict[str, Json] = {self.driver: {}}
            for name, value in self.capacity.items():
                domain, ident = split_qualified(name, self.driver)
                capacity.setdefault(domain, {})[ident] = quantity_value(value)
            self._base = {
                "driver": self.driver,
                "allowMultipleAllocations": self.allow_multiple,
                "attributes": attributes,
                "capacity": capacity,
            }
        return self._base

    def context(self, domains: frozenset[str]) -> cel.Context:
        context = self._contexts.get(domains)
        if context is None:
            base = self.variable()
            device = base
            missing_a = domains - base["attributes"].keys()
            missing_c = domains - base["capacity"].keys()
            if missing_a or missing_c:
                device = {
                    **base,
                    "attributes": {**base["attributes"], **{key: {} for key in missing_a}},
                    "capacity": {**base["capacity"], **{key: {} for key in missing_c}},
                }
            context = _cel().Context(variables={"device": device}, functions=dict(functions()))
            self._contexts[domains] = context
        return context
