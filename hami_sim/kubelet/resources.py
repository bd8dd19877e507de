"""Resource names and kubelet's error texts (pure): what the device manager accepts and says."""

from __future__ import annotations

import re
from typing import Final

import grpc

from hami_node.plugin.api import constants

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_REQUESTS_PREFIX: Final = "requests."
_NATIVE_NAMESPACE: Final = "kubernetes.io/"


def _is_qualified_name(name: str) -> bool:
    """apimachinery's IsQualifiedName: `[prefix/]name`, prefix a DNS-1123 subdomain (<= 253),
    name <= 63 characters of `[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]`."""
    parts = name.split("/")
    if len(parts) == 1:
        prefix, short = "", parts[0]
    elif len(parts) == 2:
        prefix, short = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    else:
        return False
    return bool(short) and len(short) <= 63 and _QUALIFIED_NAME_PART.fullmatch(short) is not None


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: `domain/name` outside the `kubernetes.io/` namespace, not
    a quota `requests.` name, and still a qualified name once prefixed with `requests.`."""
    if "/" not in name or _NATIVE_NAMESPACE in name or name.startswith(_REQUESTS_PREFIX):
        return False
    return _is_qualified_name(_REQUESTS_PREFIX + name)


# ------------------------------------------------------------------------------ kubelet's messages


def unsupported_version(version: str) -> str:
    supported = "[" + " ".join(f'"{v}"' for v in constants.SUPPORTED_VERSIONS) + "]"
    return f'requested API version "{version}" is not supported by kubelet. Supported version is {supported}'


def invalid_resource_name(name: str) -> str:
    return f'the ResourceName "{name}" is invalid'


def unregistered_device(resource: str) -> str:
    return f"cannot allocate unregistered device {resource}"


def no_healthy_devices(resource: str) -> str:
    return f"no healthy devices present; cannot allocate unhealthy devices {resource}"


def previously_allocated_unhealthy(resource: str) -> str:
    return f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"


def devices_unavailable(resource: str, requested: int, available: int) -> str:
    return (
        f"requested number of devices unavailable for {resource}. "
        f"Requested: {requested}, Available: {available}"
    )


def endpoint_stopped(resource: str) -> str:
    # Kubelet formats the endpoint struct with %v; the resource name is the readable part of it.
    return f"endpoint {resource} has been stopped"


def admission_failure(error: str) -> str:
    """The admission message kubelet's topology/device admit handler gives (also the event message)."""
    return f"Allocate failed due to {error}, which is unexpected"


def insufficient_resource(resource: str, requested: int, used: int, capacity: int) -> str:
    return (
        f"Node didn't have enough resource: {resource}, requested: {requested}, "
        f"used: {used}, capacity: {capacity}"
    )


UNEXPECTED_ADMISSION_ERROR: Final = "UnexpectedAdmissionError"
REJECTED_PREFIX: Final = "Pod was rejected: "

# Go's codes.Code.String() for each gRPC status (Python spells CANCELLED with two Ls).
_GO_CODE_NAMES: Final = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def go_rpc_error(code: grpc.StatusCode | None, details: str | None) -> str:
    """A gRPC failure as grpc-go's status error prints it: `rpc error: code = Unknown desc = boom`."""
    name = _GO_CODE_NAMES.get(code, "Unknown") if code is not None else "Unknown"
    return f"rpc error: code = {name} desc = {details or ''}"
