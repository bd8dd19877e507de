"""API errors as kube-apiserver reports them: a `metav1.Status` body with a reason and an HTTP code."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


class ApiError(Exception):
    """An error answered to the client as a `metav1.Status` with `status: Failure`."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str = "",
        group: str = "",
        kind: str = "",
        causes: list[JSON] | None = None,
        retry_after_s: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes
        self.retry_after_s = retry_after_s
        """details.retryAfterSeconds; the answer then carries a `Retry-After` header too
        (apiserver pkg/endpoints/handlers/responsewriters/writers.go ErrorNegotiated)."""

    def status(self) -> JSON:
        """The `metav1.Status` body for this error."""
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details: JSON = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after_s > 0:
            details["retryAfterSeconds"] = self.retry_after_s
        if details:
            body["details"] = details
        return body


def qualified(group: str, plural: str) -> str:
    """`pods`, or `leases.coordination.k8s.io` for a resource outside the core group."""
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{qualified(group, plural)} "{name}" not found',
        name=name,
        group=group,
        kind=plural,
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(group, plural)} "{name}" already exists',
        name=name,
        group=group,
        kind=plural,
    )


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {why}',
        name=name,
        group=group,
        kind=plural,
    )


STALE_OBJECT = "the object has been modified; please apply your changes to the latest version and try again"


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(group: str, kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; `causes` are (field, reason type, detail), e.g.
    ("metadata.name", "Required value", "")."""
    parts = [
        f"{field}: {rtype}: {detail}" if detail else f"{field}: {rtype}" for field, rtype, detail in causes
    ]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    cause_type = {
        "Required value": "FieldValueRequired",
        "Invalid value": "FieldValueInvalid",
        "Forbidden": "FieldValueForbidden",
        "Duplicate value": "FieldValueDuplicate",
        "Unsupported value": "FieldValueNotSupported",
        "Not found": "FieldValueNotFound",
        "Too many": "FieldValueTooMany",
        "Too long": "FieldValueTooLong",
    }
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {joined}',
        name=name,
        group=group,
        kind=kind,
        causes=[
            {
                "reason": cause_type.get(rtype, "FieldValueInvalid"),
                "message": f"{rtype}: {detail}",
                "field": field,
            }
            for field, rtype, detail in causes
        ],
    )


def success_status(
    code: int = 200, *, name: str = "", group: str = "", kind: str = "", uid: str = ""
) -> JSON:
    """A `metav1.Status` with `status: Success` (answer to a binding, or a delete that returns no object)."""
    body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}
    details: JSON = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if kind:
        details["kind"] = kind
    if uid:
        details["uid"] = uid
    if details:
        body["details"] = details
    return body
