"""Checking a CDI spec the way a container runtime's CDI library does: the official JSON schema (vendored
in tests/data/cdi, spec v1.1.0) plus the rules the schema leaves to the library (`cdi_library_errors`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = Path(__file__).resolve().parent / "data" / "cdi"

# specs-go/version.go: the released versions, newest last; a reader refuses any other.
RELEASED = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
# pkg/parser/parser.go: validateVendorOrClassName and ValidateDeviceName.
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


@cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


def schema_errors(spec: Any) -> list[str]:
    """The JSON schema's complaints about `spec` (empty when valid)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(spec)]


def _required_version(spec: Mapping[str, Any]) -> str:
    """specs-go/version.go requiredVersion, for the fields the checks below can meet."""
    devices = spec.get("devices") or []
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in devices)]
    if any(e.get("netDevices") for e in edits):
        return "1.1.0"
    if any(e.get("intelRdt") or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        return "0.6.0"
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices):
        return "0.5.0"
    if any(n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def cdi_library_errors(spec: Mapping[str, Any]) -> list[str]:
    """What the CDI library (pkg/cdi/spec.go validate, device.go validate, container-edits.go Validate,
    specs-go/version.go ValidateVersion) refuses in a spec the schema accepts."""
    errors: list[str] = []
    version = str(spec.get("cdiVersion", "")).removeprefix("v")
    if version not in RELEASED:
        errors.append(f"invalid version {version!r}")
    elif RELEASED.index(version) < RELEASED.index(_required_version(spec)):
        errors.append(f"the spec version must be at least v{_required_version(spec)}")
    vendor, _, cls = str(spec.get("kind", "")).partition("/")
    if not _VENDOR_OR_CLASS.fullmatch(vendor) or not _VENDOR_OR_CLASS.fullmatch(cls):
        errors.append(f"invalid kind {spec.get('kind')!r}")
    devices = spec.get("devices") or []
    if not devices:
        errors.append("invalid spec, no devices")
    names: set[str] = set()
    for device in devices:
        name = str(device.get("name", ""))
        if not _DEVICE_NAME.fullmatch(name):
            errors.append(f"invalid device name {name!r}")
        if name in names:
            errors.append(f"invalid spec, multiple device {name!r}")
        names.add(name)
        if not any(device.get("containerEdits", {}).values()):
            errors.append(f"invalid device {name!r}, empty device edits")
    for edits in [spec.get("containerEdits") or {}, *(d.get("containerEdits") or {} for d in devices)]:
        errors.extend(f"invalid environment variable {v!r}" for v in edits.get("env", []) if v.find("=") <= 0)
        errors.extend(
            "invalid (empty) device path" for n in edits.get("deviceNodes", []) if not n.get("path")
        )
    return errors


def spec_problems(spec: Any) -> list[str]:
    """Everything a CDI-enabled runtime would refuse in `spec` (empty when it loads)."""
    problems = schema_errors(spec)
    return problems or cdi_library_errors(spec)


__all__ = ["RELEASED", "cdi_library_errors", "schema_errors", "spec_problems"]
