"""The error types of the wire contract.

Every decoder in `hami_api` raises `WireFormatError` (an annotation that does not parse) and the request
parser raises `RequestError` (a pod resource value that cannot be used). Both are `ValueError`s whose
message names where the problem is and the offending text, so a caller can log or return it verbatim.
"""

from __future__ import annotations

_MAX_SHOWN = 160


def _shown(text: str) -> str:
    """repr() of `text`, shortened so one bad 200 KiB annotation does not flood a log line."""
    if len(text) > _MAX_SHOWN:
        return repr(text[:_MAX_SHOWN]) + f"... ({len(text)} chars)"
    return repr(text)


class WireFormatError(ValueError):
    """An annotation value that does not decode.

    `annotation` is the annotation key, `position` where in the value the problem is ("device 2",
    "container 1, device 0", "whole value", "line 1, column 17"), `field` the part that is wrong (may be
    empty), `text` the offending text and `reason` what is wrong with it.
    """

    def __init__(self, annotation: str, position: str, text: str, reason: str, field: str = "") -> None:
        self.annotation = annotation
        self.position = position
        self.text = text
        self.reason = reason
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        subject = f"{self.field} {_shown(self.text)}" if self.field else _shown(self.text)
        return f"{self.annotation}: {self.position}: {subject} {self.reason}"

    def __reduce__(self) -> tuple[type[WireFormatError], tuple[str, str, str, str, str]]:
        return (type(self), (self.annotation, self.position, self.text, self.reason, self.field))


class QuantityError(ValueError):
    """A string that is not a Kubernetes resource.Quantity (or one this contract cannot represent)."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"quantity {_shown(self.text)} {self.reason}"

    def __reduce__(self) -> tuple[type[QuantityError], tuple[str, str]]:
        return (type(self), (self.text, self.reason))


class RequestError(ValueError):
    """A container's HAMi resource value that cannot be turned into a GPU request.

    `container` is the container name, `init` whether it is an init container, `resource` the resource
    name (or the spec field, for a malformed container), `value` the offending value as text.
    """

    def __init__(self, container: str, resource: str, value: str, reason: str, init: bool = False) -> None:
        self.container = container
        self.resource = resource
        self.value = value
        self.reason = reason
        self.init = init
        super().__init__(str(self))

    def __str__(self) -> str:
        kind = "init container" if self.init else "container"
        return f"{kind} {self.container!r}: {self.resource} {_shown(self.value)} {self.reason}"

    def __reduce__(self) -> tuple[type[RequestError], tuple[str, str, str, str, bool]]:
        return (type(self), (self.container, self.resource, self.value, self.reason, self.init))
