"""hami-control's only link to the Kubernetes API: a small asyncio client, list+watch reflectors, and the
watch-driven caches the webhook (and later the extender) read: pods and ResourceQuotas.

Client. Credentials come from `kubernetes.aio.config` (a kubeconfig file, or the pod's service account
in a cluster), so every way of authenticating the official client knows (tokens, client certificates,
exec plugins, token refresh) works. The requests themselves go over one plain `aiohttp` session and the
answers are parsed with orjson into plain Kubernetes JSON dicts: the official client's pydantic models
would cost ~70 µs per pod and an object graph the pure modules do not want (they take dicts).

Reflectors. Each cache is fed by a `Reflector`: list (all namespaces), then watch from the list's
resourceVersion with bookmarks. A watch that ends (server timeout, dropped connection) resumes from the
last resourceVersion seen; 410 Gone (that version left the server's history) relists at once; any
other error waits with exponential backoff and jitter. `synced` is set after the first list; /readyz
waits for it.

Quota usage (`PodCache`, `ClusterQuotaView`). Each pod's quota usage is computed once per watch event
(`quota.pod_quota_usage`) and added to / removed from its namespace's running total, so a quota check
is two dictionary lookups, never a walk over pods. Every non-terminal pod counts (Pending included);
Succeeded and Failed pods and deleted pods do not.

Assumed admissions. Between the webhook allowing a pod and the watch showing it there is a window
(the API server still has to store it, then the event has to arrive). A burst of creates inside that
window would each see the same usage and could overshoot the quota together. So the webhook route calls
`ClusterQuotaView.assume()` for every pod it admits (not for dry runs), synchronously, before it
answers: the usage is recorded against the namespace under the pod's name (or, for `generateName` pods,
whose final name is chosen by the API server after admission, under the generateName prefix). The
entry is dropped when the watch shows a new pod of that name (or one with that generateName), or after
`assume_ttl_s` (60 s) when the pod never appears (another webhook denied it, the create failed). A
check therefore counts watched usage + assumed usage: a burst cannot overshoot; a failed create holds
its quota for at most the TTL.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import aiohttp
import orjson

from hami_api import annotations as ann
from hami_api.resources import ContainerRequest, pod_requests
from hami_control.config import ControlConfig
from hami_control.quota import (
    QuotaLimitError,
    QuotaLimits,
    QuotaUsage,
    allocation_quota_usage,
    limits_from_resource_quota,
    pod_quota_usage,
)

log = logging.getLogger(__name__)

JSONDict = dict[str, Any]


# --- errors and backoff -----------------------------------------------------------------------------------


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
    def gone(self) -> bool:
        """410: the resourceVersion asked for is older than the server's history (relist)."""
        return self.status == 410


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: the n-th failure in a row waits
    `min(maximum, initial * factor**(n-1))`, shortened by up to `jitter` (a random fraction)."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"retry policy: need 0 < initial <= maximum, got {self.initial}, {self.maximum}")
        if self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"retry policy: need factor >= 1 and 0 <= jitter < 1, got {self}")

    def delay(self, failures: int, rng: random.Random) -> float:
        """The wait after `failures` (>= 1) failures in a row."""
        base = min(self.maximum, self.initial * self.factor ** min(failures - 1, 64))
        return base * (1 - self.jitter * rng.random())


DEFAULT_RETRY = RetryPolicy()


# --- the client -------------------------------------------------------------------------------------------


def _status_of(body: bytes) -> tuple[str, str]:
    """(reason, message) of a metav1.Status body, or ("", the text)."""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", body.decode(errors="replace")[:500]
    if isinstance(status, dict):
        return str(status.get("reason") or ""), str(status.get("message") or "")
    return "", str(status)[:500]


class KubeApi:
    """GET and watch against the API server with plain JSON dicts. Create with `await
    KubeApi.connect(kubeconfig)` inside the event loop that will use it; `await close()` at the end."""

    def __init__(
        self,
        host: str,
        ssl_context: ssl.SSLContext | None,
        *,
        configuration: Any = None,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.host = host.rstrip("/")
        self._configuration = configuration
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        connector = aiohttp.TCPConnector(limit=16, ssl=ssl_context if ssl_context is not None else False)
        self._session = aiohttp.ClientSession(connector=connector, headers={"Accept": "application/json"})

    @classmethod
    async def connect(cls, kubeconfig: Path | None, **options: Any) -> KubeApi:
        """A client from a kubeconfig file, or from the in-cluster service account when None.
        Raises `KubeConfigError`."""
        from kubernetes.aio import config as kube_config
        from kubernetes.aio.client.configuration import Configuration

        if kubeconfig is not None and not kubeconfig.is_file():  # noqa: ASYNC240 - start-up only
            raise KubeConfigError(f"kubeconfig {kubeconfig} (--kubeconfig): no such file")
        configuration: Any = Configuration()
        loader: Any = kube_config
        try:
            if kubeconfig is None:
                loader.load_incluster_config(client_configuration=configuration)
            else:
                await loader.load_kube_config(
                    config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
                )
        except (loader.ConfigException, OSError, ValueError, TypeError, KeyError) as err:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig)"
            raise KubeConfigError(f"cannot build a Kubernetes client from {where}: {err}") from None
        host = str(configuration.host or "")
        if not host.startswith(("http://", "https://")):
            raise KubeConfigError(f"kubeconfig {kubeconfig}: server {host!r} is not an http(s) URL")
        context: ssl.SSLContext | None = None
        if host.startswith("https://"):
            try:
                context = ssl.create_default_context(
                    cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
                )
                if configuration.cert_file:
                    context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
            except (OSError, ssl.SSLError, ValueError) as err:
                raise KubeConfigError(f"kubeconfig {kubeconfig}: TLS settings unusable: {err}") from None
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        return cls(host, context, configuration=configuration, **options)

    async def _headers(self) -> dict[str, str]:
        configuration = self._configuration
        if configuration is None:
            return {}
        token = await configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            return {"Authorization": str(token)}
        basic = configuration.get_basic_auth_token()
        return {"Authorization": str(basic)} if basic else {}

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict:
        """GET `path` (e.g. /api/v1/pods) as a JSON object; raises `KubeApiError`."""
        timeout = aiohttp.ClientTimeout(total=self._request_timeout_s, connect=self._connect_timeout_s)
        try:
            async with self._session.get(
                self.host + path, params=params, headers=await self._headers(), timeout=timeout
            ) as response:
                data = await response.read()
                if response.status != 200:
                    reason, message = _status_of(data)
                    raise KubeApiError(response.status, reason or str(response.reason), message)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeApiError(0, type(err).__name__, str(err) or type(err).__name__) from None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as err:
            raise KubeApiError(0, "BadResponse", f"GET {path}: response is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise KubeApiError(0, "BadResponse", f"GET {path}: response is not a JSON object")
        return body

    @contextlib.asynccontextmanager
    async def watch(
        self, path: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[AsyncIterator[JSONDict]]:
        """Open a watch of `path` after `resource_version` (bookmarks on); the server ends it after
        `timeout_s`. Yields an async iterator of events (`{"type", "object"}` dicts). A stream silent far
        beyond the bookmark interval counts as dead (read timeout)."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._connect_timeout_s, sock_read=timeout_s + 30.0
        )
        try:
            async with self._session.get(
                self.host + path, params=params, headers=await self._headers(), timeout=timeout
            ) as response:
                if response.status != 200:
                    reason, message = _status_of(await response.read())
                    raise KubeApiError(response.status, reason or str(response.reason), message)
                yield _events(response, path)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeApiError(0, type(err).__name__, str(err) or type(err).__name__) from None


async def _events(response: aiohttp.ClientResponse, path: str) -> AsyncIterator[JSONDict]:
    """Split the watch stream into JSON lines (objects may be larger than aiohttp's line limit, so the
    split is done here)."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line.strip():
                yield _decode_event(line, path)
    if buffer.strip():
        yield _decode_event(buffer, path)


def _decode_event(line: bytes, path: str) -> JSONDict:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event is not JSON ({err})") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeApiError(0, "BadWatchEvent", f"watch {path}: event has no object: {line[:200]!r}")
    return event


# --- reflectors -------------------------------------------------------------------------------------------


class WatchSink(Protocol):
    """What a reflector feeds (called on the event loop)."""

    def replace(self, items: Sequence[JSONDict]) -> None:
        """The complete set of objects now (after a list or relist): replaces what was known."""
        ...

    def apply(self, kind: str, obj: JSONDict) -> None:
        """One change: `kind` is ADDED, MODIFIED or DELETED."""
        ...


class Lister(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSONDict: ...

    def watch(
        self, path: str, resource_version: str, timeout_s: int
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JSONDict]]: ...


class Reflector:
    """List, then watch, one resource across all namespaces into a `WatchSink`, until cancelled."""

    def __init__(
        self,
        api: Lister,
        name: str,
        path: str,
        sink: WatchSink,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.name = name
        self.path = path
        self.sink = sink
        self.retry = retry
        self.watch_timeout_s = watch_timeout_s
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        """The last version seen (list, event or bookmark); None before the first list and after a 410."""
        self.lists = 0
        self.watches = 0
        self.failures = 0
        """Failed attempts in a row (0 while healthy)."""
        self._rng = rng or random.Random()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                progressed = await self._attempt()
            except KubeApiError as err:
                progressed = False
                if err.gone:
                    log.info("%s watch: %s; relisting", self.name, err.message or "resourceVersion too old")
                    self.resource_version = None
                    continue
                self._log_failure(err)
            except asyncio.CancelledError:
                raise
            except Exception:
                progressed = False
                log.exception("%s watch failed unexpectedly", self.name)
            if progressed or time.monotonic() - started >= 1.0:
                if self.failures > 1:
                    log.info("%s watch: working again after %d failed attempts", self.name, self.failures)
                self.failures = 0
            else:
                self.failures += 1
                await asyncio.sleep(self.retry.delay(self.failures, self._rng))

    def _log_failure(self, err: KubeApiError) -> None:
        n = self.failures + 1  # warn on the 1st, 2nd, 4th, 8th ... failure in a row
        level = logging.WARNING if n & (n - 1) == 0 else logging.DEBUG
        log.log(level, "%s watch failed (%d in a row): %s", self.name, n, err)

    async def _attempt(self) -> bool:
        """One list (when needed) and one watch; True when something was delivered."""
        progressed = False
        if self.resource_version is None:
            body = await self.api.get(self.path)
            items = body.get("items")
            version = (body.get("metadata") or {}).get("resourceVersion")
            if not isinstance(items, list) or not isinstance(version, str) or not version:
                raise KubeApiError(0, "BadResponse", f"list {self.path} without items or resourceVersion")
            self.sink.replace([item for item in items if isinstance(item, dict)])
            self.resource_version = version
            self.lists += 1
            self.synced.set()
            progressed = True
        timeout = int(self.watch_timeout_s * self._rng.uniform(1.0, 1.5))
        async with self.api.watch(self.path, self.resource_version, timeout) as events:
            self.watches += 1
            async for event in events:
                progressed = self._on_event(event) or progressed
        return progressed

    def _on_event(self, event: JSONDict) -> bool:
        kind = event.get("type")
        obj: JSONDict = event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            raise KubeApiError(
                code if isinstance(code, int) else 0, str(obj.get("reason") or ""), str(obj.get("message"))
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.sink.apply(kind, obj)
            except Exception:
                log.exception("%s watch: the cache failed on a %s event", self.name, kind)
        elif kind != "BOOKMARK":
            log.warning("%s watch: ignoring an event of type %r", self.name, kind)
            return False
        if isinstance(version, str) and version:
            self.resource_version = version
        return bool(kind != "BOOKMARK")


# --- the pod cache ----------------------------------------------------------------------------------------

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
KEPT_ANNOTATIONS = (
    ann.DEVICES_TO_ALLOCATE,
    ann.DEVICES_ALLOCATED,
    ann.VGPU_NODE,
    ann.VGPU_TIME,
    ann.BIND_PHASE,
    ann.BIND_TIME,
)
"""The pod annotations the cache keeps (HAMi's allocation and bind bookkeeping)."""

PodKey = tuple[str, str]
"""(namespace, name)."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the control plane keeps of one pod (the rest of the object is dropped)."""

    namespace: str
    name: str
    uid: str
    phase: str
    node_name: str
    scheduler_name: str
    resource_version: str
    requests: tuple[ContainerRequest | None, ...]
    """Per container, init containers first; empty when the pod's resources do not parse."""
    annotations: Mapping[str, str]
    """The `KEPT_ANNOTATIONS` the pod carries."""
    usage: QuotaUsage
    """What the pod counts against its namespace's GPU quota (zero when terminal or GPU-less)."""
    init_containers: int = 0

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def asks_gpu(self) -> bool:
        return any(r is not None for r in self.requests)


_ZERO = QuotaUsage()


def pod_record(pod: Mapping[str, Any], config: ControlConfig) -> PodRecord:
    """Distil a pod (plain JSON) into a `PodRecord`. Never raises on bad resources or annotations: a pod
    whose GPU resources do not parse asks nothing, a bad allocation annotation falls back to the request."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    raw_annotations = meta.get("annotations") or {}
    kept = {k: str(raw_annotations[k]) for k in KEPT_ANNOTATIONS if k in raw_annotations}
    phase = str(status.get("phase") or "Pending")
    try:
        requests = pod_requests(pod, config.resource_names, config.request_defaults)
        usage = _ZERO if phase in TERMINAL_PHASES else pod_quota_usage(pod, config)
    except ValueError as err:
        log.debug(
            "pod %s/%s: GPU resources not understood (%s); counted as asking none", namespace, name, err
        )
        requests, usage = (), _ZERO
    init_containers = len(spec.get("initContainers") or ()) if isinstance(spec, Mapping) else 0
    allocated = kept.get(ann.DEVICES_ALLOCATED)
    if allocated and phase not in TERMINAL_PHASES:
        try:
            allocation = ann.decode_pod_allocation(allocated, ann.DEVICES_ALLOCATED)
            usage = allocation_quota_usage(allocation, init_containers)
        except ValueError as err:
            log.debug("pod %s/%s: %s; quota counts its request instead", namespace, name, err)
    return PodRecord(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        phase=phase,
        node_name=str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else "",
        scheduler_name=str(spec.get("schedulerName") or "") if isinstance(spec, Mapping) else "",
        resource_version=str(meta.get("resourceVersion") or ""),
        requests=requests,
        annotations=kept,
        usage=usage,
        init_containers=init_containers,
    )


PodListener = Callable[[PodRecord | None, PodRecord | None], None]
"""Called with (old, new) on every change: (None, new) added, (old, None) deleted."""


@dataclass(slots=True)
class _Assumed:
    """One admitted pod not yet seen by the watch: keyed by its name, or by its generateName prefix."""

    key: str
    by_name: bool
    usage: QuotaUsage
    expires_at: float
    live: bool = True


class _AssumedInNamespace:
    """A namespace's assumed admissions with their running total. Entries are found by name (dict) or
    generateName (FIFO per prefix) and expire in admission order, so every operation is O(1) amortised
    however many admissions wait (a dropped entry is only marked; its expiry unlinks it)."""

    __slots__ = ("by_generate_name", "by_name", "order", "total")

    def __init__(self) -> None:
        self.total = _ZERO
        self.order: collections.deque[_Assumed] = collections.deque()
        self.by_name: dict[str, _Assumed] = {}
        self.by_generate_name: dict[str, collections.deque[_Assumed]] = {}

    def add(self, entry: _Assumed) -> None:
        if entry.by_name:
            old = self.by_name.get(entry.key)
            if old is not None:
                self.drop(old)
            self.by_name[entry.key] = entry
        else:
            self.by_generate_name.setdefault(entry.key, collections.deque()).append(entry)
        self.order.append(entry)
        self.total += entry.usage

    def drop(self, entry: _Assumed) -> None:
        if not entry.live:
            return
        entry.live = False
        self.total -= entry.usage
        if entry.by_name:
            if self.by_name.get(entry.key) is entry:
                del self.by_name[entry.key]
        else:
            queue = self.by_generate_name.get(entry.key)
            if queue is not None:
                while queue and not queue[0].live:
                    queue.popleft()
                if not queue:
                    del self.by_generate_name[entry.key]

    def expire(self, now: float) -> None:
        order = self.order
        while order and (order[0].expires_at <= now or not order[0].live):
            self.drop(order.popleft())

    def seen(self, name: str, generate_name: str) -> None:
        entry = self.by_name.get(name)
        if entry is None and generate_name:
            queue = self.by_generate_name.get(generate_name)
            entry = next((e for e in queue if e.live), None) if queue else None
        if entry is not None:
            self.drop(entry)

    @property
    def empty(self) -> bool:
        return not self.order


class PodCache:
    """Every pod of the cluster as a `PodRecord`, and each namespace's quota usage kept as a running
    total (see the module docstring, also for the assumed admissions). A `WatchSink` for a `Reflector`."""

    def __init__(
        self,
        config: ControlConfig,
        *,
        assume_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.assume_ttl_s = assume_ttl_s
        self.clock = clock
        self._pods: dict[PodKey, PodRecord] = {}
        self._used: dict[str, QuotaUsage] = {}
        self._assumed: dict[str, _AssumedInNamespace] = {}
        self._listeners: list[PodListener] = []

    # reading

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, namespace: str, name: str) -> PodRecord | None:
        return self._pods.get((namespace, name))

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def used(self, namespace: str) -> QuotaUsage:
        """The namespace's usage: watched non-terminal pods plus admissions not yet seen by the watch."""
        used = self._used.get(namespace, _ZERO)
        assumed = self._assumed.get(namespace)
        if assumed is not None:
            assumed.expire(self.clock())
            if assumed.empty:
                del self._assumed[namespace]
            else:
                used += assumed.total
        return used

    def assumed(self, namespace: str) -> int:
        """How many admissions of the namespace are still waiting for the watch (for tests and logs)."""
        assumed = self._assumed.get(namespace)
        if assumed is None:
            return 0
        assumed.expire(self.clock())
        return sum(1 for a in assumed.order if a.live)

    def add_listener(self, listener: PodListener) -> None:
        self._listeners.append(listener)

    # admissions

    def assume(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> None:
        """Count `usage` for a pod the webhook just admitted until the watch shows it (or the TTL ends).
        `name` is "" for pods named by `generate_name` (the API server picks the name after admission)."""
        if usage.memory <= 0 and usage.cores <= 0:
            return
        if name and (namespace, name) in self._pods:
            return  # already visible (cannot happen for a CREATE, but never count twice)
        key, by_name = (name, True) if name else (generate_name, False)
        assumed = self._assumed.get(namespace)
        if assumed is None:
            assumed = self._assumed[namespace] = _AssumedInNamespace()
        assumed.add(_Assumed(key, by_name, usage, self.clock() + self.assume_ttl_s))

    def _seen(self, pod: Mapping[str, Any], namespace: str, name: str) -> None:
        """A pod appeared in the watch: drop the admission assumed for it (by name, else by generateName)."""
        assumed = self._assumed.get(namespace)
        if assumed is None:
            return
        assumed.seen(name, str((pod.get("metadata") or {}).get("generateName") or ""))
        assumed.expire(self.clock())
        if assumed.empty:
            del self._assumed[namespace]

    # the watch

    def replace(self, items: Sequence[JSONDict]) -> None:
        fresh: dict[PodKey, PodRecord] = {}
        for pod in items:
            record = pod_record(pod, self.config)
            fresh[record.key] = record
            if record.key not in self._pods:
                self._seen(pod, record.namespace, record.name)
        old_pods, self._pods = self._pods, fresh
        self._used = {}
        for record in fresh.values():
            self._add_usage(record)
        if self._listeners:
            for key, old in old_pods.items():
                if key not in fresh:
                    self._notify(old, None)
            for key, new in fresh.items():
                old_record = old_pods.get(key)
                if old_record is None or old_record.resource_version != new.resource_version:
                    self._notify(old_record, new)

    def apply(self, kind: str, obj: JSONDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._pods.get(key)
        if kind == "DELETED":
            if old is None:
                return
            del self._pods[key]
            self._remove_usage(old)
            self._notify(old, None)
            return
        record = pod_record(obj, self.config)
        if old is None:
            self._seen(obj, record.namespace, record.name)
        else:
            self._remove_usage(old)
        self._pods[key] = record
        self._add_usage(record)
        self._notify(old, record)

    def _add_usage(self, record: PodRecord) -> None:
        if record.usage.memory or record.usage.cores:
            self._used[record.namespace] = self._used.get(record.namespace, _ZERO) + record.usage

    def _remove_usage(self, record: PodRecord) -> None:
        if record.usage.memory or record.usage.cores:
            left = self._used.get(record.namespace, _ZERO) - record.usage
            if left.memory or left.cores:
                self._used[record.namespace] = left
            else:
                self._used.pop(record.namespace, None)

    def _notify(self, old: PodRecord | None, new: PodRecord | None) -> None:
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("a pod cache listener failed")


# --- the ResourceQuota cache ------------------------------------------------------------------------------


class QuotaCache:
    """Each namespace's GPU limits, the tightest over its ResourceQuotas (recomputed per event for that
    namespace only). A quota whose GPU values do not parse is logged and left out. A `WatchSink`."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self._quotas: dict[PodKey, QuotaLimits] = {}
        self._limits: dict[str, QuotaLimits] = {}

    def limits(self, namespace: str) -> QuotaLimits:
        return self._limits.get(namespace, _UNLIMITED)

    def __len__(self) -> int:
        return len(self._quotas)

    def _limits_of(self, obj: Mapping[str, Any]) -> QuotaLimits:
        try:
            return limits_from_resource_quota(obj, self.config)
        except QuotaLimitError as err:
            log.warning("%s; this quota's GPU limits are ignored", err)
            return _UNLIMITED

    def _recompute(self, namespace: str) -> None:
        limits = _UNLIMITED
        for (ns, _name), quota in self._quotas.items():
            if ns == namespace:
                limits = limits.tightest(quota)
        if limits.unlimited:
            self._limits.pop(namespace, None)
        else:
            self._limits[namespace] = limits

    def replace(self, items: Sequence[JSONDict]) -> None:
        self._quotas = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            self._quotas[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = self._limits_of(
                obj
            )
        self._limits = {}
        for namespace in {ns for ns, _ in self._quotas}:
            self._recompute(namespace)

    def apply(self, kind: str, obj: JSONDict) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == "DELETED":
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = self._limits_of(obj)
        self._recompute(key[0])


_UNLIMITED = QuotaLimits()


class ClusterQuotaView:
    """The `quota.QuotaView` the webhook reads: limits from the ResourceQuota cache, usage from the pod
    cache (watched + assumed). With quota enforcement off it answers "unlimited" and watches no quotas."""

    def __init__(self, pods: PodCache, quotas: QuotaCache | None) -> None:
        self.pods = pods
        self.quotas = quotas

    def limits(self, namespace: str) -> QuotaLimits:
        return self.quotas.limits(namespace) if self.quotas is not None else _UNLIMITED

    def used(self, namespace: str) -> QuotaUsage:
        return self.pods.used(namespace)

    def assume(self, namespace: str, name: str, generate_name: str, usage: QuotaUsage) -> None:
        self.pods.assume(namespace, name, generate_name, usage)


# --- everything watched -----------------------------------------------------------------------------------


class ClusterCaches:
    """The reflectors and caches hami-control runs: pods always, ResourceQuotas when quotas are enforced.
    `start()` launches them on the running loop; `readiness()` is what /readyz reports."""

    def __init__(
        self,
        api: Lister,
        config: ControlConfig,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        watch_timeout_s: int = 300,
    ) -> None:
        self.config = config
        self.pods = PodCache(config)
        self.quotas = QuotaCache(config) if config.enforce_quota else None
        self.quota_view = ClusterQuotaView(self.pods, self.quotas)
        self.reflectors = [
            Reflector(api, "pods", "/api/v1/pods", self.pods, retry=retry, watch_timeout_s=watch_timeout_s)
        ]
        if self.quotas is not None:
            self.reflectors.append(
                Reflector(
                    api,
                    "resourcequotas",
                    "/api/v1/resourcequotas",
                    self.quotas,
                    retry=retry,
                    watch_timeout_s=watch_timeout_s,
                )
            )
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self._tasks:
            return
        started = time.monotonic()
        for reflector in self.reflectors:
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{reflector.name}"))
        self._tasks.append(asyncio.create_task(self._report_synced(started), name="watch-synced"))

    async def _report_synced(self, started: float) -> None:
        await self.wait_synced()
        quotas = f", {len(self.quotas)} ResourceQuotas" if self.quotas is not None else ""
        log.info(
            "caches synced in %.0f ms: %d pods%s", (time.monotonic() - started) * 1000, len(self.pods), quotas
        )

    async def wait_synced(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def readiness(self) -> dict[str, bool]:
        return {r.name: r.synced.is_set() for r in self.reflectors}

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "DEFAULT_RETRY",
    "KEPT_ANNOTATIONS",
    "ClusterCaches",
    "ClusterQuotaView",
    "KubeApi",
    "KubeApiError",
    "KubeConfigError",
    "Lister",
    "PodCache",
    "PodListener",
    "PodRecord",
    "QuotaCache",
    "Reflector",
    "RetryPolicy",
    "WatchSink",
    "pod_record",
]
