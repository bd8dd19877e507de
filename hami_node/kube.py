"""The node daemon's only link to the Kubernetes API: a client for the few calls it makes, a resilient
watch of the pods bound to this node, and the retry policy the writers share.

Threading model. The daemon is thread-based (the gRPC server runs its handlers on a thread pool), so
this module uses the official *sync* client (`kubernetes` 37) from daemon threads: `PodWatch` runs its
list/watch loop on its own thread, and the writers (`pods.PodTracker`, `reporter.NodeReporter`) call
`KubeClient` from theirs. The client's urllib3 pool is thread-safe. Nothing here is ever called from
an RPC handler, so an API server that is slow or down can delay annotations, never kubelet.

Cost. Responses are read raw (`_preload_content=False`) and parsed with orjson into plain Kubernetes
JSON dicts; no pydantic models are built. The `kubernetes` package itself (about 0.9 s and 50 MB to
import with `CoreV1Api`) is imported only when a `KubeClient` is made, so modules that need only
`KubeApiError` or `RetryPolicy` stay cheap to import.

Errors. Every failed call raises `KubeApiError` (HTTP status, or 0 when no response came back);
`retriable` says whether trying again later can help.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import orjson

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSONDict = dict[str, Any]

# --- errors and retries ---------------------------------------------------------------------------------


class KubeApiError(Exception):
    """A Kubernetes API call that failed. `status` is the HTTP status, 0 when no response came back
    (connection refused, reset, timed out); `reason` the Status reason ("NotFound", "Expired") or the
    transport error's class; `message` what the server (or the transport) said."""

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
        return self.status == 404

    @property
    def gone(self) -> bool:
        """410: the resourceVersion a watch asked for is older than the server's history."""
        return self.status == 410


class KubeConfigError(RuntimeError):
    """No usable client configuration (bad kubeconfig, not in a cluster)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter: the n-th consecutive failure waits
    `min(maximum, initial * factor**(n-1))`, shortened by a random fraction up to `jitter`, so nodes
    that lost the API server together do not come back in lockstep."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"retry policy: need 0 < initial <= maximum, got {self.initial}, {self.maximum}")
        if self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"retry policy: need factor >= 1 and 0 <= jitter < 1, got {self}")

    def backoff(self, rng: random.Random | None = None) -> Backoff:
        return Backoff(self, rng)


DEFAULT_RETRY = RetryPolicy()


class Backoff:
    """The state of one retry loop (not shared between threads): `next()` after a failure, `reset()`
    after a success."""

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        p = self.policy
        delay = min(p.maximum, p.initial * p.factor ** min(self.failures, 64))
        self.failures += 1
        return delay * (1 - p.jitter * self._rng.random())

    def reset(self) -> int:
        """Back to the first delay; returns how many failures in a row there were."""
        failures, self.failures = self.failures, 0
        return failures

    def report_level(self) -> int:
        """The log level for the failure about to be counted: WARNING for the 1st, 2nd, 4th, 8th ... in
        a row, DEBUG for the others, so an API server that stays down does not flood the log."""
        n = self.failures + 1
        return logging.WARNING if n & (n - 1) == 0 else logging.DEBUG


# --- the client -------------------------------------------------------------------------------------------


def _status_of(body: bytes | str | None) -> tuple[str, str]:
    """(reason, message) of a metav1.Status body, or ("", the text)."""
    if not body:
        return "", ""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return "", text[:500]
    if isinstance(status, dict):
        return str(status.get("reason") or ""), str(status.get("message") or "")
    return "", str(status)[:500]


def _wrap(exc: BaseException) -> KubeApiError:
    """Any error of the client or its transport as a `KubeApiError`."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, KubeApiError):
        return exc
    if isinstance(exc, ApiException):
        reason, message = _status_of(exc.body)
        return KubeApiError(int(exc.status or 0), reason or str(exc.reason or ""), message or str(exc.reason))
    return KubeApiError(0, type(exc).__name__, str(exc) or type(exc).__name__)


def _transport_errors() -> tuple[type[BaseException], ...]:
    import urllib3
    from kubernetes.client.exceptions import OpenApiException

    return (OpenApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


class WatchStream:
    """One open watch response: iterate it for events (plain dicts, `{"type", "object"}`) until the
    server ends the stream. `interrupt()` may be called from another thread to end a blocked read."""

    def __init__(self, response: Any, errors: tuple[type[BaseException], ...]) -> None:
        self._response = response
        self._errors = errors
        self._interrupted = False

    def __iter__(self) -> Iterator[JSONDict]:
        buffer = b""
        try:
            for chunk in self._response.stream(65536, decode_content=True):
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        break
                    line, buffer = buffer[:end], buffer[end + 1 :]
                    if line.strip():
                        yield self._decode(line)
        except self._errors as exc:
            if self._interrupted:
                return
            raise _wrap(exc) from None
        if buffer.strip() and not self._interrupted:
            yield self._decode(buffer)

    @staticmethod
    def _decode(line: bytes) -> JSONDict:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise KubeApiError(
                0, "BadWatchEvent", f"watch event is not JSON ({err}): {line[:200]!r}"
            ) from None
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise KubeApiError(0, "BadWatchEvent", f"watch event has no object: {line[:200]!r}")
        return event

    def interrupt(self) -> None:
        """End the stream from another thread: shuts the socket for reading, so a blocked read returns."""
        self._interrupted = True
        with contextlib.suppress(ValueError, RuntimeError, OSError):  # already released or closed
            self._response.shutdown()

    def close(self) -> None:
        self._response.close()
        self._response.release_conn()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class KubeClient:
    """The calls the node daemon makes, each returning plain Kubernetes JSON or raising `KubeApiError`.
    Thread-safe. The official client's own retries are off: callers retry with their `RetryPolicy`."""

    def __init__(
        self, api_client: Any, *, request_timeout_s: float = 15.0, connect_timeout_s: float = 5.0
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._timeout = (connect_timeout_s, request_timeout_s)
        self._connect_timeout = connect_timeout_s
        self._errors = _transport_errors()

    @classmethod
    def from_config(cls, kubeconfig: Path | None, **options: Any) -> KubeClient:
        """A client from a kubeconfig file (`--kubeconfig` / `KUBECONFIG`, resolved by the caller), or
        from the in-cluster service account when `kubeconfig` is None. Raises `KubeConfigError`."""
        from kubernetes import client
        from kubernetes import config as kube_config

        config: Any = kube_config
        configuration = client.Configuration()
        try:
            if kubeconfig is None:
                config.load_incluster_config(client_configuration=configuration)
            else:
                config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        except (config.ConfigException, OSError, ValueError, TypeError) as err:
            where = (
                f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig/KUBECONFIG)"
            )
            raise KubeConfigError(f"cannot build a Kubernetes client from {where}: {err}") from None
        return cls.from_configuration(configuration, **options)

    @classmethod
    def from_configuration(cls, configuration: Any, **options: Any) -> KubeClient:
        """A client for an official-client `Configuration` (its retries are turned off)."""
        from kubernetes import client

        configuration.retries = False
        return cls(client.ApiClient(configuration), **options)

    def close(self) -> None:
        """Close pooled connections (open watches should be stopped first)."""
        self.api_client.close()

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> JSONDict:
        try:
            response = method(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
            try:
                data = response.data
            finally:
                response.release_conn()
        except self._errors as exc:
            raise _wrap(exc) from None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as err:
            raise KubeApiError(0, "BadResponse", f"response is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise KubeApiError(0, "BadResponse", f"response is not a JSON object: {str(body)[:200]}")
        return body

    def get_node(self, name: str) -> JSONDict:
        return self._call(self._core.read_node, name)

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> JSONDict:
        """Merge-patch the Node's annotations (None deletes a key). With `resource_version` the patch
        applies only to that version of the Node (409 Conflict otherwise)."""
        meta: JSONDict = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return self._call(self._core.patch_node, name, {"metadata": meta}, _content_type=MERGE_PATCH)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> JSONDict:
        """Merge-patch a pod's annotations (None deletes a key)."""
        return self._call(
            self._core.patch_namespaced_pod,
            name,
            namespace,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type=MERGE_PATCH,
        )

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> JSONDict:
        """Create a core/v1 Event (a Warning on this Node, e.g.)."""
        return self._call(self._core.create_namespaced_event, namespace, dict(event))

    def list_pods(self, field_selector: str) -> tuple[list[JSONDict], str]:
        """Pods of all namespaces matching `field_selector`, and the list's resourceVersion."""
        body = self._call(self._core.list_pod_for_all_namespaces, field_selector=field_selector)
        items = body.get("items") or []
        version = (body.get("metadata") or {}).get("resourceVersion") or ""
        if not isinstance(items, list) or not version:
            raise KubeApiError(0, "BadResponse", "pod list without items or resourceVersion")
        return [item for item in items if isinstance(item, dict)], str(version)

    def watch_pods(self, field_selector: str, resource_version: str, timeout_s: int) -> WatchStream:
        """Open a watch of pods matching `field_selector` after `resource_version`, with bookmarks; the
        server ends it after `timeout_s`. A socket that stays silent well beyond that counts as dead."""
        try:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=field_selector,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=(self._connect_timeout, timeout_s + 30),
            )
        except self._errors as exc:
            raise _wrap(exc) from None
        return WatchStream(response, self._errors)


# --- the pod watch ----------------------------------------------------------------------------------------


class PodEventHandler(Protocol):
    """Receives the pods bound to this node (`pods.PodTracker` is one). Called from the watch thread."""

    def pods_listed(self, pods: Sequence[JSONDict]) -> None:
        """The complete set of pods now (after a list or relist): replaces what was known."""
        ...

    def pod_event(self, kind: str, pod: JSONDict) -> None:
        """One change: `kind` is ADDED, MODIFIED or DELETED."""
        ...


class PodWatch:
    """Lists, then watches, the pods with `spec.nodeName=<node>` and feeds them to a handler, forever:

    - a watch that ends (server timeout, dropped connection) resumes from the last resourceVersion seen
      (events and bookmarks), so nothing is missed or delivered twice;
    - 410 Gone (that version left the server's history) relists and starts again;
    - any other error waits with backoff (`RetryPolicy`) and tries again; an attempt that delivered
      something or lasted a while resets the backoff.

    `start()` returns at once; `wait_synced()` waits for the first list. `stop()` interrupts a blocked
    read and joins the thread."""

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        handler: PodEventHandler,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.handler = handler
        self.field_selector = f"spec.nodeName={node_name}"
        self._retry = retry
        self._watch_timeout_s = watch_timeout_s
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self.resource_version: str | None = None
        """The last version seen (list, event or bookmark); None before the first list and after a 410."""
        self.lists = 0
        """Completed lists (the first one, then relists)."""
        self.watches = 0
        """Watch requests opened."""

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"hami-pod-watch-{self.node_name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.interrupt()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the pod watch thread did not stop within %.1fs", timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether the first list has been delivered (waiting up to `timeout`)."""
        return self._synced.wait(timeout)

    def _run(self) -> None:
        backoff = self._retry.backoff()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                progressed = self._attempt()
            except KubeApiError as err:
                progressed = False
                if err.gone:
                    log.info("pod watch on %s: %s; relisting", self.node_name, err.message)
                    self.resource_version = None
                else:
                    log.log(backoff.report_level(), "pod watch on %s failed: %s", self.node_name, err)
            except Exception:
                progressed = False
                log.exception("pod watch on %s failed unexpectedly", self.node_name)
            if progressed or time.monotonic() - started >= 1.0:
                if (failures := backoff.reset()) > 1:
                    log.info(
                        "pod watch on %s: working again after %d failed attempts", self.node_name, failures
                    )
            else:
                self._stop.wait(backoff.next())

    def _attempt(self) -> bool:
        """One list (when needed) and one watch; True when something was delivered."""
        progressed = False
        if self.resource_version is None:
            pods, version = self.client.list_pods(self.field_selector)
            self._deliver_list(pods)
            self.resource_version = version
            self.lists += 1
            self._synced.set()
            progressed = True
        timeout = int(self._watch_timeout_s * random.uniform(1.0, 1.5))
        stream = self.client.watch_pods(self.field_selector, self.resource_version, timeout)
        self.watches += 1
        with self._lock:
            self._stream = stream
        if self._stop.is_set():
            stream.interrupt()
        try:
            with stream:
                for event in stream:
                    if self._stop.is_set():
                        break
                    progressed = self._on_event(event) or progressed
        finally:
            with self._lock:
                self._stream = None
        return progressed

    def _on_event(self, event: JSONDict) -> bool:
        kind = event.get("type")
        obj: JSONDict = event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            raise KubeApiError(
                code if isinstance(code, int) else 0,
                str(obj.get("reason") or ""),
                str(obj.get("message") or obj),
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.handler.pod_event(kind, obj)
            except Exception:
                log.exception("pod watch on %s: the handler failed on a %s event", self.node_name, kind)
        elif kind != "BOOKMARK":
            log.warning("pod watch on %s: ignoring an event of type %r", self.node_name, kind)
            return False
        if isinstance(version, str) and version:
            self.resource_version = version
        return bool(kind != "BOOKMARK")

    def _deliver_list(self, pods: list[JSONDict]) -> None:
        try:
            self.handler.pods_listed(pods)
        except Exception:
            log.exception(
                "pod watch on %s: the handler failed on a list of %d pods", self.node_name, len(pods)
            )


__all__ = [
    "DEFAULT_RETRY",
    "MERGE_PATCH",
    "Backoff",
    "KubeApiError",
    "KubeClient",
    "KubeConfigError",
    "PodEventHandler",
    "PodWatch",
    "RetryPolicy",
    "WatchStream",
]
