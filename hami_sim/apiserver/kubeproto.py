"""Kubernetes API objects as kube-apiserver reads them: protobuf request bodies, and quantities.

kube-apiserver decodes every request body into its Go type and writes the Go type's JSON, so what it
stores and returns is that JSON, not what the client sent. Two consequences are modelled here, both
driven by the message descriptors of `proto/k8s.io/...` (compiled into `kubeproto_descriptors`):

- `decode_protobuf`: a body of `application/vnd.kubernetes.protobuf` (what client-go and kubectl send
  for built-in kinds) is the magic `k8s\\x00` and a `runtime.Unknown` (typeMeta, raw, contentEncoding,
  contentType) whose `raw` is the object's message. It becomes the JSON the Go type would marshal to:
  JSON keys and ",omitempty" / ",inline" / pointer facts from the protos' field options, and the types
  with their own MarshalJSON (Quantity, Time, MicroTime, Duration, IntOrString, RawExtension, FieldsV1).
- `normalize_quantities`: every `resource.Quantity` in a JSON object becomes the canonical text Go's
  `Quantity` marshals to (`hami_api.quantity.canonical_quantity`): `nvidia.com/gpu: 1` is stored and
  returned as "1", `memory: 1024Mi` as "1Gi", `4000` as "4k".

Pure apart from the descriptors it loads once.
"""

from __future__ import annotations

import base64
import datetime
import functools
import re
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from hami_api.errors import QuantityError
from hami_api.quantity import canonical_quantity
from hami_sim.apiserver import kubeproto_descriptors

JSON = dict[str, Any]

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
_TIME = "k8s.io.apimachinery.pkg.apis.meta.v1.Time"
_MICRO_TIME = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime"
_DURATION = "k8s.io.apimachinery.pkg.apis.meta.v1.Duration"
_FIELDS_V1 = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1"
_INT_OR_STRING = "k8s.io.apimachinery.pkg.util.intstr.IntOrString"
_RAW_EXTENSION = "k8s.io.apimachinery.pkg.runtime.RawExtension"
_UNKNOWN = "k8s.io.apimachinery.pkg.runtime.Unknown"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1"

# kubejson/options.proto
_OMITEMPTY, _INLINE, _POINTER = 51001, 51002, 51003

# Go's messages for a quantity that does not parse (k8s.io/apimachinery/pkg/api/resource/quantity.go).
GO_FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
GO_SUFFIX = "unable to parse quantity's suffix"
_GO_SCAN = re.compile(r"[+-]?[0-9]*(?:\.[0-9]*)?(?P<suffix>[eEinumkKMGTP]*[-+]?[0-9]*)")
_GO_SUFFIX = re.compile(r"|[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+")


class ProtobufError(ValueError):
    """A protobuf body that cannot be read; the message says why."""


class QuantityFieldError(ValueError):
    """A quantity that does not parse, at a JSON field path."""

    def __init__(self, path: str, value: Any, reason: str) -> None:
        self.path = path
        self.value = value
        self.reason = reason
        super().__init__(f"{reason} ({path}: {_show(value)})")


def _show(value: Any) -> str:
    return orjson.dumps(value).decode() if isinstance(value, str | int | float | bool) else repr(value)


def go_quantity_error(value: Any) -> str:
    """What Go's `Quantity.UnmarshalJSON` says about a JSON value it cannot take."""
    if not isinstance(value, str):
        return GO_FORMAT_WRONG
    text = value.strip()
    scanned = _GO_SCAN.fullmatch(text)
    if not text or scanned is None:
        return GO_FORMAT_WRONG
    if _GO_SUFFIX.fullmatch(scanned["suffix"]) is None:
        return GO_SUFFIX
    try:
        canonical_quantity(text)
    except QuantityError as err:  # a corner Go takes but hami_api refuses ("." or an exponent past 1000)
        return str(err)
    return GO_FORMAT_WRONG


def canonical(value: Any, path: str) -> str:
    """The canonical text of a quantity read from JSON (Go trims spaces around it; a JSON number is
    read through its text). Raises `QuantityFieldError`."""
    try:
        if isinstance(value, str):
            return _canonical_text(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return canonical_quantity(value)
    except QuantityError:
        pass
    raise QuantityFieldError(path, value, go_quantity_error(value))


@functools.lru_cache(maxsize=4096)
def _canonical_text(text: str) -> str:
    # Every write goes through here, with the same few texts ("1", "4k", "500m"): remembered.
    return canonical_quantity(text.strip())


# --- the schema --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message and its Go JSON facts."""

    descriptor: FieldDescriptor
    json: str
    omitempty: bool
    inline: bool
    pointer: bool

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def is_map(self) -> bool:
        message = self.descriptor.message_type
        return message is not None and message.GetOptions().map_entry

    @property
    def map_value(self) -> FieldDescriptor:
        """The value field of a map's entry message."""
        entry = self.descriptor.message_type
        assert entry is not None
        value: FieldDescriptor = entry.fields_by_name["value"]
        return value

    @property
    def repeated(self) -> bool:
        return bool(self.descriptor.is_repeated)


class Schema:
    """The message descriptors and each field's JSON facts."""

    def __init__(self, serialized: bytes) -> None:
        files = descriptor_pb2.FileDescriptorSet.FromString(serialized)
        self.pool = descriptor_pool.DescriptorPool()
        self._facts: dict[str, dict[str, tuple[bool, bool, bool]]] = {}
        for file in files.file:
            self.pool.Add(file)
            for message in file.message_type:
                facts = self._facts.setdefault(f"{file.package}.{message.name}", {})
                for field in message.field:
                    unknown = UnknownFieldSet(field.options)
                    flags = {unknown[i].field_number: bool(unknown[i].data) for i in range(len(unknown))}
                    facts[field.name] = (
                        flags.get(_OMITEMPTY, False),
                        flags.get(_INLINE, False),
                        flags.get(_POINTER, False),
                    )
        self._fields: dict[str, tuple[Field, ...]] = {}
        self._kinds: dict[tuple[str, str], Descriptor] = {}

    def message(self, full_name: str) -> Descriptor:
        return self.pool.FindMessageTypeByName(full_name)

    def fields(self, message: Descriptor) -> tuple[Field, ...]:
        cached = self._fields.get(message.full_name)
        if cached is None:
            facts = self._facts.get(message.full_name, {})
            cached = tuple(
                Field(f, f.json_name, *facts.get(f.name, (False, False, False))) for f in message.fields
            )
            self._fields[message.full_name] = cached
        return cached

    def kind(self, api_version: str, kind: str) -> Descriptor | None:
        """The message of a kind: core `v1` is k8s.io.api.core.v1, `<group>.k8s.io/<v>` is
        k8s.io.api.<group>.<v>; meta kinds (DeleteOptions) are found under any version."""
        key = (api_version, kind)
        found = self._kinds.get(key)
        if found is None:
            found = self._find_kind(api_version, kind)
            if found is not None:  # only known kinds are kept: clients choose these strings
                self._kinds[key] = found
        return found

    def _find_kind(self, api_version: str, kind: str) -> Descriptor | None:
        group, _, version = api_version.rpartition("/")
        candidates = []
        if group in ("", "core"):
            candidates.append(f"k8s.io.api.core.{version}.{kind}")
        elif group.endswith(".k8s.io"):
            candidates.append(f"k8s.io.api.{group.removesuffix('.k8s.io')}.{version}.{kind}")
        candidates.append(f"{_META}.{kind}")
        for name in candidates:
            try:
                return self.message(name)
            except KeyError:
                continue
        return None

    def message_class(self, message: Descriptor) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(message)
        return cls


@functools.cache
def schema() -> Schema:
    return Schema(base64.b64decode("".join(kubeproto_descriptors.DESCRIPTOR_SET_BASE64)))


# --- protobuf -> JSON ------------------------------------------------------------------------------------


def _envelope(body: bytes) -> Any:
    if not body.startswith(MAGIC):
        raise ProtobufError(f"the body does not start with the protobuf magic {MAGIC!r}")
    s = schema()
    envelope = s.message_class(s.message(_UNKNOWN))()
    try:
        envelope.ParseFromString(body[len(MAGIC) :])
    except DecodeError as err:
        raise ProtobufError(f"the body is not a runtime.Unknown message: {err}") from None
    return envelope


def envelope_kind(body: bytes) -> tuple[str, str]:
    """(kind, apiVersion) a protobuf body declares; ("", "") when it cannot be read."""
    try:
        type_meta = _envelope(body).typeMeta
    except ProtobufError:
        return "", ""
    return str(type_meta.kind), str(type_meta.apiVersion)


def decode_protobuf(body: bytes) -> JSON:
    """The JSON object (with kind and apiVersion) of a Kubernetes protobuf body. Raises `ProtobufError`
    or `QuantityFieldError`."""
    s = schema()
    envelope = _envelope(body)
    type_meta: Any = envelope.typeMeta
    api_version, kind = str(type_meta.apiVersion), str(type_meta.kind)
    encoding: str = envelope.contentEncoding
    content_type: str = envelope.contentType
    if encoding:
        raise ProtobufError(f'unsupported contentEncoding "{encoding}" in the protobuf envelope')
    if content_type not in ("", CONTENT_TYPE):
        raise ProtobufError(f'unsupported contentType "{content_type}" in the protobuf envelope')
    if not kind or not api_version:
        raise ProtobufError(
            f'the protobuf envelope names no kind (apiVersion "{api_version}", kind "{kind}")'
        )
    message = s.kind(api_version, kind)
    if message is None:
        raise ProtobufError(f'no kind "{kind}" is registered for version "{api_version}"')
    decoded = s.message_class(message)()
    try:
        decoded.ParseFromString(envelope.raw)
    except DecodeError as err:
        raise ProtobufError(f"the {kind} in the protobuf envelope does not decode: {err}") from None
    converted = _message_json(s, decoded, "")
    if not isinstance(converted, dict):
        raise ProtobufError(f"a {kind} is not a JSON object")
    return {"kind": kind, "apiVersion": api_version, **converted}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _message_json(s: Schema, message: Message, path: str) -> Any:
    """What the message's Go type marshals to."""
    full = message.DESCRIPTOR.full_name
    special = _SPECIAL.get(full)
    if special is not None:
        return special(message, path)
    out: JSON = {}
    descriptor: Descriptor = message.DESCRIPTOR  # type: ignore[assignment]  # upb or pure descriptor
    for field in s.fields(descriptor):
        key = _join(path, field.json)
        value = getattr(message, field.name)
        if field.is_map:
            if not value:
                if not field.omitempty:
                    out[field.json] = None
                continue
            value_field = field.map_value
            out[field.json] = {
                k: _scalar_or_message(s, value_field, v, f"{key}[{k}]") for k, v in sorted(value.items())
            }
        elif field.repeated:
            if not value:
                if not field.omitempty:
                    out[field.json] = None
                continue
            out[field.json] = [
                _scalar_or_message(s, field.descriptor, v, f"{key}[{i}]") for i, v in enumerate(value)
            ]
        elif field.descriptor.message_type is not None:
            present = message.HasField(field.name)
            if field.pointer and not present:
                if not field.omitempty:
                    out[field.json] = None
                continue
            converted = _message_json(s, value, path if field.inline else key)
            if field.inline:
                if isinstance(converted, dict):
                    out.update(converted)
                continue
            out[field.json] = converted
        else:
            if field.pointer:
                if not message.HasField(field.name):
                    if not field.omitempty:
                        out[field.json] = None
                    continue
            elif field.omitempty and not value:
                continue
            out[field.json] = _scalar(field.descriptor, value)
    return out


def _scalar_or_message(s: Schema, field: FieldDescriptor, value: Any, path: str) -> Any:
    if field.message_type is not None:
        return _message_json(s, value, path)
    return _scalar(field, value)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def _time(message: Any, _path: str) -> str | None:
    # metav1.Time: a zero time marshals to an empty message and back to JSON null; RFC 3339, seconds.
    if not message.seconds and not message.nanos:
        return None
    moment = datetime.datetime.fromtimestamp(message.seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(message: Any, _path: str) -> str | None:
    # metav1.MicroTime: RFC3339Micro, "2006-01-02T15:04:05.000000Z07:00" in UTC.
    if not message.seconds and not message.nanos:
        return None
    moment = datetime.datetime.fromtimestamp(message.seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{message.nanos // 1000:06d}Z"


def _duration(message: Any, _path: str) -> str:
    return go_duration(int(message.duration))


def _quantity(message: Any, path: str) -> str:
    # resource.Quantity's protobuf form is its string; an empty message is the zero quantity.
    if not message.HasField("string"):
        return "0"
    return canonical(message.string, path)


def _int_or_string(message: Any, _path: str) -> int | str:
    return str(message.strVal) if message.type == 1 else int(message.intVal)


def _raw_json(raw: bytes, path: str) -> Any:
    if not raw:
        return None
    if raw.startswith(MAGIC):
        return decode_protobuf(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtobufError(f"{path or 'raw'}: embedded object is neither JSON nor protobuf") from None


def _raw_extension(message: Any, path: str) -> Any:
    return _raw_json(bytes(message.raw), path)


def _fields_v1(message: Any, path: str) -> Any:
    return _raw_json(bytes(message.Raw), path)


_SPECIAL: dict[str, Any] = {
    _TIME: _time,
    _MICRO_TIME: _micro_time,
    _DURATION: _duration,
    QUANTITY: _quantity,
    _INT_OR_STRING: _int_or_string,
    _RAW_EXTENSION: _raw_extension,
    _FIELDS_V1: _fields_v1,
}


def go_duration(nanoseconds: int) -> str:
    """Go's `time.Duration.String()`: "1h2m3.5s", "1.5ms", "0s"."""
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    n = abs(nanoseconds)
    if n < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if n >= size or unit == "ns":
                return sign + _decimal(n, size) + unit
    hours, rest = divmod(n, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _decimal(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _decimal(value: int, unit: int) -> str:
    whole, fraction = divmod(value, unit)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


# --- quantities in JSON ------------------------------------------------------------------------------


def _can_hold_quantity(s: Schema, message: Descriptor, seen: frozenset[str] = frozenset()) -> bool:
    if message.full_name == QUANTITY:
        return True
    if message.full_name in seen or message.full_name in _SPECIAL:
        return False
    for field in s.fields(message):
        target = field.descriptor.message_type
        if target is None:
            continue
        if field.is_map:
            target = field.map_value.message_type
            if target is None:
                continue
        if _can_hold_quantity(s, target, seen | {message.full_name}):
            return True
    return False


@functools.cache
def _quantity_keys(full_name: str) -> tuple[tuple[str, Field, Descriptor], ...]:
    """The JSON keys of a message (inline fields flattened) that can hold a quantity: (key, field, the
    message or map value type it holds)."""
    s = schema()
    out: list[tuple[str, Field, Descriptor]] = []
    for field in s.fields(s.message(full_name)):
        target = field.descriptor.message_type
        if target is None:
            continue
        if field.inline:
            out.extend(_quantity_keys(target.full_name))
            continue
        if field.is_map:
            target = field.map_value.message_type
            if target is None:
                continue
        if _can_hold_quantity(s, target):
            out.append((field.json, field, target))
    return tuple(out)


def normalize_quantities(message: str, obj: JSON) -> None:
    """Rewrite every quantity in `obj` (a JSON object of message `message`, a full protobuf name) to its
    canonical text, in place. Values of the wrong JSON shape are left for other checks. Raises
    `QuantityFieldError` naming the first quantity that does not parse."""
    _normalize(message, obj, "")


def _normalize(message: str, obj: Any, path: str) -> None:
    if not isinstance(obj, dict):
        return
    for key, field, target in _quantity_keys(message):
        value = obj.get(key)
        if value is None:
            continue
        where = _join(path, key)
        if field.is_map:
            if isinstance(value, dict):
                for name, item in value.items():
                    if target.full_name != QUANTITY:
                        _normalize(target.full_name, item, f"{where}[{name}]")
                    else:  # a null map value is Go's zero Quantity
                        value[name] = "0" if item is None else canonical(item, f"{where}[{name}]")
        elif field.repeated:
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if target.full_name == QUANTITY:
                        value[i] = canonical(item, f"{where}[{i}]")
                    else:
                        _normalize(target.full_name, item, f"{where}[{i}]")
        elif target.full_name == QUANTITY:
            obj[key] = canonical(value, where)
        else:
            _normalize(target.full_name, value, where)
