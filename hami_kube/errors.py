"""The access layer's errors: one for the configuration, one for every failed API call."""

from __future__ import annotations


class KubeConfigError(RuntimeError):
    """No usable client configuration (bad kubeconfig, not in a cluster); the message says which."""


class KubeApiError(Exception):
    """A failed API call: `status` is the HTTP status, 0 when no response came back; `reason` the
    Status reason ("NotFound", "Expired") or the transport error's class; `message` what was said."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status or 'no response'} {reason}: {message}" if reason else message)

    @property
    def retriable(self) -> bool:
        """Whether the same call may succeed later: no response, 401 (a token being rotated), 408, 409
        (a conflict; re-read first), 429 and 5xx. Other 4xx (400, 403, 404, 422) will not."""
        return self.status in (0, 401, 408, 409, 429) or self.status >= 500

    @property
    def not_found(self) -> bool:
        """404: the object (or its namespace) does not exist."""
        return self.status == 404

    @property
    def gone(self) -> bool:
        """410: the resourceVersion asked for is older than the server's history (relist)."""
        return self.status == 410


__all__ = ["KubeApiError", "KubeConfigError"]
