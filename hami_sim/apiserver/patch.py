"""The three PATCH flavours kube-apiserver accepts, on plain JSON values (pure, no I/O).

- `json_merge_patch`: RFC 7386 (`application/merge-patch+json`).
- `json_patch`: RFC 6902 (`application/json-patch+json`).
- `strategic_merge_patch`: Kubernetes' strategic merge patch (`application/strategic-merge-patch+json`)
  for the core objects the stand-in serves. Kubernetes reads the patch strategy of each field from Go
  struct tags; here a small schema table (`_ROOT`) lists the lists that merge instead of being replaced.
  The table is kind-agnostic: the union of pods, nodes, namespaces, events, resourcequotas, leases,
  mutatingwebhookconfigurations and pod templates (`spec.template`, `spec.jobTemplate`).

None of the functions mutates its inputs: results never share containers with the target or the patch.
Every malformed patch raises `PatchError` naming the problem and where it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["PatchError", "json_merge_patch", "json_patch", "strategic_merge_patch"]


class PatchError(ValueError):
    """A patch that cannot be applied: malformed, or not matching the document."""


# --------------------------------------------------------------------------------------------- helpers


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value. A round trip through orjson is several times faster than walking
    the value in Python (a pod: ~15 µs against ~150 µs), and JSON values survive it unchanged."""
    if isinstance(value, dict | list):
        try:
            return orjson.loads(orjson.dumps(value))
        except TypeError:  # not plain JSON (e.g. a tuple inside or a non-string key): walk it
            return _walk_copy(value)
    return value


def _walk_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _walk_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk_copy(v) for v in value]
    return value


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True != 1; objects compare by keys and values."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------- RFC 7386


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes a key, any other patch value replaces."""
    if not isinstance(patch, dict):
        return _copy(patch)
    result: dict[str, Any] = _copy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------------------------- RFC 6902

_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})
_POINTER_TOKEN = re.compile(r"(?:[^~]|~[01])*")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


def _parse_pointer(pointer: Any, member: str) -> list[str]:
    if not isinstance(pointer, str):
        raise PatchError(f"{member!r} must be a string JSON pointer, got {_short(pointer)}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"{member} {pointer!r} is not a JSON pointer: it must be empty or start with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        if not _POINTER_TOKEN.fullmatch(token):
            raise PatchError(
                f"{member} {pointer!r}: invalid escape in {token!r} ('~' must be followed by 0 or 1)"
            )
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


def _array_index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-":
        if allow_end:
            return length
        raise PatchError("'-' (the end of the array) is only valid as the target of add, move or copy")
    if not _ARRAY_INDEX.fullmatch(token):
        raise PatchError(f"{token!r} is not a valid array index")
    index = int(token)
    limit = length if allow_end else length - 1
    if index > limit:
        raise PatchError(f"array index {index} is out of range (array length {length})")
    return index


def _walk(doc: Any, tokens: list[str]) -> Any:
    """The value at `tokens` (all of them must exist)."""
    node = doc
    for depth, token in enumerate(tokens):
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path not found (no key {token!r} at /{'/'.join(tokens[:depth])})")
            node = node[token]
        elif isinstance(node, list):
            node = node[_array_index(token, len(node), allow_end=False)]
        else:
            raise PatchError(f"path not found (/{'/'.join(tokens[:depth])} is not an object or array)")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(last, len(parent), allow_end=True), value)
    else:
        raise PatchError("path not found (the parent is not an object or array)")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    """Remove the value at `tokens` from `doc` and return it."""
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError("path not found")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_array_index(last, len(parent), allow_end=False))
    raise PatchError("path not found (the parent is not an object or array)")


def _replace(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError("path not found")
        parent[last] = value
    elif isinstance(parent, list):
        parent[_array_index(last, len(parent), allow_end=False)] = value
    else:
        raise PatchError("path not found (the parent is not an object or array)")
    return doc


def _apply_op(doc: Any, op: Mapping[str, Any]) -> Any:
    kind = op["op"]
    tokens = _parse_pointer(op["path"], "path")
    if kind in ("add", "replace", "test") and "value" not in op:
        raise PatchError("missing 'value'")
    if kind == "add":
        return _add(doc, tokens, _copy(op["value"]))
    if kind == "remove":
        _remove(doc, tokens)
        return doc
    if kind == "replace":
        return _replace(doc, tokens, _copy(op["value"]))
    if kind == "test":
        actual = _walk(doc, tokens)
        if not json_equal(actual, op["value"]):
            raise PatchError(f"test failed: value is {_short(actual)}, expected {_short(op['value'])}")
        return doc
    # move and copy
    if "from" not in op:
        raise PatchError("missing 'from'")
    source = _parse_pointer(op["from"], "from")
    if kind == "copy":
        return _add(doc, tokens, _copy(_walk(doc, source)))
    if source == tokens:
        _walk(doc, source)
        return doc
    if tokens[: len(source)] == source:
        raise PatchError(f"cannot move {op['from']!r} into one of its own children")
    value = _remove(doc, source)
    return _add(doc, tokens, value)


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902. `ops` is a list of operation objects; op numbers in errors count from 0."""
    if not isinstance(ops, list):
        raise PatchError(f"json patch must be a JSON array of operations, got {type(ops).__name__}")
    doc = _copy(target)
    for number, op in enumerate(ops):
        if not isinstance(op, dict):
            raise PatchError(f"json patch op {number}: must be an object, got {_short(op)}")
        kind = op.get("op")
        if kind not in _OPS:
            raise PatchError(
                f"json patch op {number}: 'op' must be one of {', '.join(sorted(_OPS))}, got {_short(kind)}"
            )
        if "path" not in op:
            raise PatchError(f"json patch op {number} ({kind}): missing 'path'")
        try:
            doc = _apply_op(doc, op)
        except PatchError as err:
            raise PatchError(f"json patch op {number} ({kind} {op['path']}): {err}") from None
    return doc


# ------------------------------------------------------------------------------ strategic merge patch


@dataclass(frozen=True)
class _Field:
    """Patch metadata of one field. For lists: `merge` False -> the patch replaces the list;
    `merge` True with `key` "" -> a set of scalars; with a `key` -> maps merged by that key."""

    merge: bool = False
    key: str = ""
    fields: Mapping[str, _Field] = field(default_factory=dict)


def _keyed(key: str, fields: Mapping[str, _Field] | None = None) -> _Field:
    return _Field(merge=True, key=key, fields=fields or {})


def _nested(fields: Mapping[str, _Field]) -> _Field:
    return _Field(fields=fields)


_SET = _Field(merge=True)

_OBJECT_META = {"ownerReferences": _keyed("uid"), "finalizers": _SET}
_CONTAINER = {
    "ports": _keyed("containerPort"),
    "env": _keyed("name"),
    "volumeMounts": _keyed("mountPath"),
    "volumeDevices": _keyed("devicePath"),
    "resources": _nested({"claims": _keyed("name")}),
}
_POD_SPEC = {
    "containers": _keyed("name", _CONTAINER),
    "initContainers": _keyed("name", _CONTAINER),
    "ephemeralContainers": _keyed("name", _CONTAINER),
    "volumes": _keyed("name"),
    "imagePullSecrets": _keyed("name"),
    "hostAliases": _keyed("ip"),
    "topologySpreadConstraints": _keyed("topologyKey"),
    "schedulingGates": _keyed("name"),
    "resourceClaims": _keyed("name"),
}
_POD_TEMPLATE = _nested({"metadata": _nested(_OBJECT_META), "spec": _nested(_POD_SPEC)})
_NODE_SPEC = {"podCIDRs": _SET}
_SPEC = {
    **_POD_SPEC,
    **_NODE_SPEC,
    "template": _POD_TEMPLATE,
    "jobTemplate": _nested({"spec": _nested({"template": _POD_TEMPLATE})}),
}
# Pod, node, namespace and workload status. containerStatuses has no patch strategy in Kubernetes
# (it is replaced as a whole), so it is deliberately absent.
_STATUS = {
    "conditions": _keyed("type"),
    "podIPs": _keyed("ip"),
    "hostIPs": _keyed("ip"),
    "addresses": _keyed("type"),
}
_ROOT: Mapping[str, _Field] = {
    "metadata": _nested(_OBJECT_META),
    "spec": _nested(_SPEC),
    "status": _nested(_STATUS),
    "webhooks": _keyed("name"),
}

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_DELETE_PREFIX = "$deleteFromPrimitiveList/"
_ORDER_PREFIX = "$setElementOrder/"
_NO_FIELD = _Field()


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _smp(where: str, problem: str) -> PatchError:
    return PatchError(f"strategic merge patch at {where or '<root>'}: {problem}")


def _merge_map(
    original: dict[str, Any], patch: Mapping[str, Any], schema: _Field, where: str
) -> dict[str, Any]:
    """Merge `patch` into `original` (owned by the caller, updated in place) and return the result."""
    if _DIRECTIVE in patch:
        directive = patch[_DIRECTIVE]
        if directive == "replace":
            return _merge_map({}, {k: v for k, v in patch.items() if k != _DIRECTIVE}, schema, where)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise _smp(
                where, f"unknown $patch directive {_short(directive)} (expected replace, delete or merge)"
            )
    if _RETAIN_KEYS in patch:
        _retain_keys(original, patch, where)
    done: set[str] = set()
    for key, value in patch.items():
        if key.startswith(_ORDER_PREFIX):
            done.add(_set_element_order(original, patch, key, value, schema=schema, where=where))
    for key, value in patch.items():
        if (
            key in done
            or key in (_DIRECTIVE, _RETAIN_KEYS)
            or key.startswith((_ORDER_PREFIX, _DELETE_PREFIX))
        ):
            continue
        if key.startswith("$"):
            raise _smp(where, f"unknown directive {key!r}")
        path = f"{where}.{key}" if where else key
        if value is None:
            original.pop(key, None)
            continue
        sub = schema.fields.get(key, _NO_FIELD)
        current = original.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            original[key] = _merge_map(current, value, sub, path)
        elif isinstance(current, list) and isinstance(value, list):
            original[key] = _merge_list(current, value, sub, path)
        else:
            original[key] = _fresh(value, sub, path)
    for key, value in patch.items():
        if key.startswith(_DELETE_PREFIX):
            _delete_from_primitive_list(original, key, value, where)
    return original


def _fresh(value: Any, schema: _Field, where: str) -> Any:
    """A patch value for a field the target lacks: its directives are applied against nothing."""
    if isinstance(value, dict):
        return _merge_map({}, value, schema, where)
    if isinstance(value, list):
        return _merge_list([], value, schema, where)
    return value


def _retain_keys(original: dict[str, Any], patch: Mapping[str, Any], where: str) -> None:
    keys = patch[_RETAIN_KEYS]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise _smp(where, "$retainKeys must be a list of field names")
    for key, value in patch.items():
        if key.startswith("$") or value is None:
            continue
        if key not in keys:
            raise _smp(where, f"field {key!r} is set but missing from $retainKeys")
    for key in [k for k in original if k not in keys]:
        del original[key]


def _delete_from_primitive_list(original: dict[str, Any], key: str, value: Any, where: str) -> None:
    name = key[len(_DELETE_PREFIX) :]
    if not name or not isinstance(value, list) or not all(_is_scalar(v) for v in value):
        raise _smp(where, f"{key} must name a field and be a list of scalars")
    current = original.get(name)
    if isinstance(current, list):
        original[name] = [item for item in current if not any(json_equal(item, v) for v in value)]


def _merge_list(original: list[Any], patch: list[Any], schema: _Field, where: str) -> list[Any]:
    if not schema.merge:
        copied: list[Any] = _copy(patch)
        return copied
    if not original and not patch:
        return original
    if not schema.key:
        return _merge_scalar_list(original, patch, where)
    key = schema.key
    for item in patch:
        if not isinstance(item, dict):
            raise _smp(where, f"list items must be objects, got {_short(item)}")
    result, keep, replace = _list_directives(list(original), patch, key, where)
    if replace:
        return [_merge_map({}, item, schema, where) for item in keep]
    for item in keep:
        if key not in item:
            raise _smp(where, f"list item does not contain the merge key {key!r}: {_short(item)}")
        label = f"{where}[{key}={item[key]}]"
        for index, current in enumerate(result):
            if isinstance(current, dict) and json_equal(current.get(key), item[key]):
                result[index] = _merge_map(current, item, schema, label)
                break
        else:
            result.append(_merge_map({}, item, schema, label))
    return result


def _merge_scalar_list(original: list[Any], patch: list[Any], where: str) -> list[Any]:
    """A merge list without a merge key: the union, in order, of scalars."""
    for item in (*original, *patch):
        if not _is_scalar(item):
            raise _smp(where, f"expected a list of scalars, got {_short(item)}")
    merged: list[Any] = []
    for item in (*original, *patch):
        if not any(json_equal(item, seen) for seen in merged):
            merged.append(item)
    return merged


def _list_directives(
    result: list[Any], patch: list[dict[str, Any]], key: str, where: str
) -> tuple[list[Any], list[dict[str, Any]], bool]:
    """Apply the `$patch` directives of a keyed list: the list after deletions, the items to merge, and
    whether the list is replaced."""
    keep: list[dict[str, Any]] = []
    replace = False
    for item in patch:
        directive = item.get(_DIRECTIVE)
        if directive is None:
            keep.append(item)
        elif directive == "delete":
            if key not in item:
                raise _smp(where, f"$patch: delete item has no merge key {key!r}: {_short(item)}")
            result = [o for o in result if not (isinstance(o, dict) and json_equal(o.get(key), item[key]))]
        elif directive == "replace":
            replace = True
        elif directive == "merge":
            keep.append({k: v for k, v in item.items() if k != _DIRECTIVE})
        else:
            raise _smp(
                where, f"unknown $patch directive {_short(directive)} (expected replace, delete or merge)"
            )
    return result, keep, replace


def _set_element_order(
    original: dict[str, Any], patch: Mapping[str, Any], key: str, order: Any, *, schema: _Field, where: str
) -> str:
    """Merge the list named by a `$setElementOrder/<name>` key and order it as Kubernetes does:
    listed items in the given order, items only on the server kept near their old neighbours.
    Returns the list's name (the caller then skips it)."""
    name = key[len(_ORDER_PREFIX) :]
    path = f"{where}.{name}" if where else name
    sub = schema.fields.get(name, _NO_FIELD)
    if not name or not isinstance(order, list):
        raise _smp(where, f"{key} must name a field and be a list")
    current, change = original.get(name), patch.get(name)
    if current is not None and not isinstance(current, list):
        current = None
    if change is not None and not isinstance(change, list):
        return ""  # not a list patch: the ordinary merge decides
    if not sub.merge:
        if change is not None:
            original[name] = _merge_list(current or [], change, sub, path)
        return name
    mkey = sub.key
    if mkey and not all(isinstance(o, dict) and mkey in o for o in order):
        raise _smp(path, f"every {key} item must be an object with {mkey!r}")
    if not mkey and not all(_is_scalar(o) for o in order):
        raise _smp(path, f"{key} must be a list of scalars")
    if current is None and change is None:
        return name
    merged = _merge_list(list(current or []), change or [], sub, path)

    def ident(item: Any) -> Any:
        return item.get(mkey) if mkey and isinstance(item, dict) else item

    def position(items: list[Any], item: Any) -> int:
        return next((i for i, o in enumerate(items) if json_equal(ident(o), ident(item))), -1)

    wanted = [o for o in merged if position(order, o) >= 0]
    server_only = [o for o in merged if position(order, o) < 0]
    wanted.sort(key=lambda o: position(order, o))
    old = current or []
    result: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(wanted):
        if j >= len(wanted):
            result.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            result.append(wanted[j])
            j += 1
        else:
            left, right = position(old, server_only[i]), position(old, wanted[j])
            if left >= 0 and right >= 0 and left < right:
                result.append(server_only[i])
                i += 1
            else:
                result.append(wanted[j])
                j += 1
    original[name] = result
    return name


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch of a core object.

    Maps merge recursively and `null` deletes. Lists listed in the schema table merge by their patch
    merge key (or as sets of scalars, e.g. `metadata.finalizers`); other lists are replaced. Directives:
    `$patch: replace|delete|merge` on maps and on items of keyed lists (`delete` needs the merge key,
    a `{"$patch": "replace"}` item replaces the whole list with the other items), `$retainKeys` (keys
    not listed are cleared), `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`.
    """
    if not isinstance(patch, dict):
        raise PatchError(f"strategic merge patch must be a JSON object, got {type(patch).__name__}")
    if target is None:
        target = {}
    if not isinstance(target, dict):
        raise PatchError(f"strategic merge patch needs an object to patch, got {type(target).__name__}")
    return _merge_map(_copy(target), patch, _Field(fields=_ROOT), "")
