"""The HTTP face of the stand-in API server: one aiohttp handler that routes kube REST paths, the
handlers for each verb, watch streaming, `metav1.Status` errors and the request log and counters.

Plain HTTP on loopback (no TLS, no authentication: any bearer token is accepted).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from aiohttp import web

from hami_sim.apiserver import deletion, discovery, errors, kubeproto, strategy, tables
from hami_sim.apiserver.errors import ApiError, bad_request
from hami_sim.apiserver.faults import (
    Decision,
    FaultConfig,
    FaultInjector,
    FaultRequest,
    FaultSpecError,
    parse_config,
    stale_key,
)
from hami_sim.apiserver.patch import PatchError, json_merge_patch, json_patch, strategic_merge_patch
from hami_sim.apiserver.resource_v1 import DEFAULT_FEATURE_GATES, FeatureGates
from hami_sim.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from hami_sim.apiserver.store import DEFAULT_HISTORY, DEFAULT_WATCH_QUEUE, Store, Stored, Watcher
from hami_sim.apiserver.strategy import (
    MUTATING_WEBHOOK_CONFIGURATION,
    NAMESPACE,
    POD,
    STARTUP_NAMESPACES,
    ResourceInfo,
)

JSON = dict[str, Any]

log = logging.getLogger(__name__)

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
DEFAULT_WATCH_TIMEOUT = 1800.0
DEFAULT_REQUEST_LOG = 10_000
_MAX_BODY = 3 * 1024 * 1024
"""Largest request body accepted, as kube-apiserver (3 MiB); larger ones get 413."""
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_JSON_TYPES = ("application/json", "")
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)
_PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})


def now_rfc3339(now: float) -> str:
    return datetime.datetime.fromtimestamp(int(now), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_response(body: JSON | bytes, status: int = 200) -> web.Response:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return web.Response(body=raw, status=status, content_type="application/json")


def _error_response(error: ApiError) -> web.Response:
    response = _json_response(error.status(), error.code)
    if error.retry_after_s > 0:
        response.headers["Retry-After"] = str(error.retry_after_s)
    return response


def _request_verb(method: str, name: str, sub: str, watching: bool) -> str:
    """kube-apiserver's verb of a resource request (as `_dispatch` routes it), for the fault rules."""
    if method == "GET":
        return "watch" if watching else ("get" if name else "list")
    if method == "DELETE" and not name:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "")


def _quote(value: Any) -> str:
    return orjson.dumps(value).decode() if isinstance(value, str | int | float | bool) else repr(value)


def _cannot_be_handled(declared: tuple[str, str], kind: str, err: Exception) -> ApiError:
    """kube's 400 for a body that does not decode into its Go type (apiserver/pkg/endpoints/handlers/
    rest.go transformDecodeError): `Pod in version "v1" cannot be handled as a Pod: <why>`."""
    body_kind, api_version = declared
    if body_kind:
        version = api_version.rpartition("/")[2]
        return bad_request(f'{body_kind} in version "{version}" cannot be handled as a {kind}: {err}')
    return bad_request(f"the object provided is unrecognized (must be of type {kind}): {err}")


def _check_finalizers(info: ResourceInfo, new: JSON, old: JSON) -> bool:
    """An object being deleted takes no new finalizers (apimachinery ValidateObjectMetaUpdate); answers
    whether this update removes its last one (then the object goes)."""
    old_meta, new_meta = old["metadata"], new["metadata"]
    if not old_meta.get("deletionTimestamp"):
        return False
    if "deletionGracePeriodSeconds" in old_meta:
        new_meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
    added = set(new_meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
    if added:
        raise errors.invalid(
            info.group,
            info.kind,
            str(new_meta.get("name", "")),
            [
                (
                    "metadata.finalizers",
                    "Forbidden",
                    "no new finalizers can be added if the object is being deleted",
                )
            ],
        )
    # ShouldDeleteDuringUpdate (apiserver/pkg/registry/generic/registry/store.go): no finalizer left and
    # no grace pending (a pod being deleted gracefully stays until its kubelet deletes it).
    return not new_meta.get("finalizers") and not old_meta.get("deletionGracePeriodSeconds")


def _normalize_quantities(body: JSON, kind: str) -> None:
    """Every quantity in a decoded body becomes the text Go's Quantity marshals to, as kube-apiserver's
    decoding into the Go type does; one that does not parse is kube's 400 "cannot be handled as"."""
    body_kind, api_version = body.get("kind"), body.get("apiVersion")
    if not isinstance(body_kind, str) or not isinstance(api_version, str):
        return
    message = kubeproto.schema().kind(api_version, body_kind)
    if message is None:
        return
    try:
        kubeproto.normalize_quantities(message.full_name, body)
    except kubeproto.QuantityFieldError as err:
        raise _cannot_be_handled((body_kind, api_version), kind, err) from None


_RECORD_FIELDS = (
    "time",
    "verb",
    "resource",
    "subresource",
    "namespace",
    "name",
    "code",
    "durationMs",
    "userAgent",
)

# (time, verb, resource, subresource, namespace, name, code, duration ms, user agent)
RequestRecord = tuple[float, str, str, str, str, str, int, float, str]


class RequestStats:
    """Counters per (verb, resource, subresource) and a bounded log of the latest requests."""

    def __init__(self, log_size: int = DEFAULT_REQUEST_LOG) -> None:
        self.counters: dict[tuple[str, str, str], int] = collections.defaultdict(int)
        self.log: collections.deque[RequestRecord] = collections.deque(maxlen=log_size)

    def record(self, rec: RequestRecord) -> None:
        self.counters[(rec[1], rec[2], rec[3])] += 1
        self.log.append(rec)

    def reset(self) -> None:
        self.counters.clear()
        self.log.clear()

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        return dict(self.counters)

    def writes(self) -> int:
        return sum(n for (verb, _r, _s), n in self.counters.items() if verb in WRITE_VERBS)

    def counters_json(self) -> JSON:
        items = [
            {"verb": verb, "resource": resource, "subresource": sub, "count": n}
            for (verb, resource, sub), n in sorted(self.counters.items())
        ]
        return {"counters": items, "total": sum(self.counters.values()), "writes": self.writes()}

    def requests_json(self, limit: int) -> JSON:
        recent = list(self.log)[-limit:] if limit > 0 else []
        return {"items": [dict(zip(_RECORD_FIELDS, r, strict=True)) for r in recent]}


@dataclass(slots=True)
class _Ctx:
    """What the router learned about a request (for the log and the handlers)."""

    verb: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    recorded: bool = False


class _Drop:
    """A watch to cut (fault drop-watch) after `remaining` more lines: its connection is closed without
    the chunked stream's end, as a proxy or a crashed server would drop it."""

    __slots__ = ("remaining", "request")

    def __init__(self, request: web.BaseRequest, remaining: int) -> None:
        self.request = request
        self.remaining = remaining

    def cut(self) -> None:
        transport = self.request.transport
        if transport is not None:
            transport.close()


class Admission:
    """Glue to the mutating webhook dispatcher (created lazily: most runs register no webhook)."""

    def __init__(self, service_resolver: Callable[[str, str, int], str] | None = None) -> None:
        self._dispatcher: Any = None
        self._service_resolver = service_resolver

    async def mutate_pod(self, store: Store, pod: JSON, dry_run: bool) -> JSON:
        configurations = [s.obj for s in store.list(MUTATING_WEBHOOK_CONFIGURATION, None)]
        if not configurations:
            return pod
        from hami_sim.apiserver import admission

        if self._dispatcher is None:
            self._dispatcher = admission.WebhookDispatcher(service_resolver=self._service_resolver)
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        ns_obj = store.find(NAMESPACE, "", namespace)
        ns_labels = dict((ns_obj.obj["metadata"].get("labels") or {}) if ns_obj else {})
        attrs = admission.AdmissionAttributes(
            operation="CREATE",
            kind=("", "v1", "Pod"),
            resource=("", "v1", "pods"),
            sub_resource="",
            namespace=namespace,
            name=meta.get("name", ""),
            obj=pod,
            old_obj=None,
            namespace_labels=ns_labels,
            dry_run=dry_run,
        )
        try:
            mutated: JSON = await self._dispatcher.mutate(configurations, attrs)
        except admission.AdmissionRejected as rejected:
            raise ApiError(rejected.code, rejected.reason, rejected.message) from None
        return mutated

    async def close(self) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.close()
            self._dispatcher = None


class ApiServer:
    """The stand-in kube-apiserver: a store, the REST handlers and request stats. Build the aiohttp
    application with `make_app()`; everything runs on that application's event loop."""

    def __init__(
        self,
        *,
        history_size: int = DEFAULT_HISTORY,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
        request_log_size: int = DEFAULT_REQUEST_LOG,
        bookmark_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        webhook_service_resolver: Callable[[str, str, int], str] | None = None,
        feature_gates: FeatureGates = DEFAULT_FEATURE_GATES,
        faults: FaultConfig | None = None,
    ) -> None:
        """`faults`: fault-injection rules to start with (`hami_sim.apiserver.faults`; changed later
        through /hami-sim/faults)."""
        self.faults = FaultInjector(faults or FaultConfig())
        self._last_lists: dict[tuple[str, ...], tuple[list[Any], str]] = {}
        """The last list answer per (resource, namespace, selectors), kept only while a stale-list rule
        is set: what a stale list serves again."""
        self.store = Store(history_size=history_size, watch_queue=watch_queue)
        self.feature_gates = feature_gates
        self.stats = RequestStats(request_log_size)
        self.bookmark_interval = bookmark_interval
        self.clock = clock
        self.admission = Admission(webhook_service_resolver)
        self.server_address = "127.0.0.1:0"
        self._closing = False
        self._watch_tasks: set[Watcher] = set()
        self._snapshots: dict[str, tuple[list[Any], str, float]] = {}
        self._snapshot_ids = 0
        now = clock()
        for name in STARTUP_NAMESPACES:
            body: JSON = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            self._prepare_new(NAMESPACE, body, "", now)
            self.store.create(NAMESPACE, body)

    # -- application ---------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """An aiohttp Application serving every path (for embedding; `make_server` is leaner)."""
        self._closing = False
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_shutdown.append(self._on_shutdown)
        return app

    def make_server(self) -> web.Server:
        """A low-level aiohttp server calling `handle` for every request (no router, no middlewares).
        A handler is cancelled when its client disconnects, which ends abandoned watches at once.
        Serving again after `close()` (a restarted runner) reopens watches."""
        self._closing = False

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            # The low-level server has no client_max_size option of its own: passing one makes aiohttp
            # drop every handler option (access_log=None included) and log a warning per connection.
            loop = asyncio.get_running_loop()
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=_MAX_BODY)

        return web.Server(
            self.handle, request_factory=make_request, handler_cancellation=True, access_log=None
        )

    async def _on_shutdown(self, _app: web.Application) -> None:
        await self.close()

    async def close(self) -> None:
        """End every watch stream and the webhook client (the store stays readable)."""
        self._closing = True
        for watcher in self.store.watchers():
            watcher.close()
        await self.admission.close()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        ctx = _Ctx()
        try:
            response = await self._route(request, ctx)
        except ApiError as error:
            response = _error_response(error)
        except web.HTTPRequestEntityTooLarge:
            response = _error_response(
                ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {_MAX_BODY}")
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("internal error serving %s %s", request.method, request.path_qs)
            response = _error_response(
                ApiError(500, "InternalError", f"Internal error occurred: {exc!r}"[:500])
            )
        if not ctx.recorded and ctx.verb:
            self._record(request, ctx, response.status, started)
        return response

    def _record(self, request: web.BaseRequest, ctx: _Ctx, code: int, started: float) -> None:
        ctx.recorded = True
        self.stats.record(
            (
                self.clock(),
                ctx.verb,
                ctx.resource,
                ctx.subresource,
                ctx.namespace,
                ctx.name,
                code,
                round((time.perf_counter() - started) * 1000.0, 3),
                request.headers.get("User-Agent", ""),
            )
        )

    # -- routing -------------------------------------------------------------------------------

    async def _route(self, request: web.BaseRequest, ctx: _Ctx) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if not parts:
            return _json_response(
                {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/openapi/v3", "/version"]}
            )
        head = parts[0]
        if head in ("api", "apis"):
            return await self._route_api(request, ctx, parts, method)
        if method != "GET" and head != "hami-sim":
            raise ApiError(
                405, "MethodNotAllowed", f"the server does not allow this method on {request.path}"
            )
        if head == "version" and len(parts) == 1:
            return _json_response(discovery.version())
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok", content_type="text/plain")
        if head == "openapi":
            return self._openapi(parts)
        if head == "hami-sim" and len(parts) == 2:
            return await self._hami_sim(request, parts[1], method)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _openapi(self, parts: list[str]) -> web.Response:
        if parts[1:] == ["v3"]:
            return _json_response(discovery.openapi_v3_index())
        if len(parts) > 2 and parts[1] == "v3":
            doc = discovery.openapi_v3_document("/".join(parts[2:]))
            if doc is not None:
                return _json_response(doc)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    async def _hami_sim(self, request: web.BaseRequest, what: str, method: str) -> web.Response:
        if what == "faults":
            return await self._faults_endpoint(request, method)
        if what == "counters" and method == "GET":
            body = self.stats.counters_json()
            body["resourceVersion"] = str(self.store.resource_version)
            return _json_response(body)
        if what == "requests" and method == "GET":
            try:
                limit = int(request.query.get("limit", "100"))
            except ValueError:
                raise bad_request(f"limit must be an integer, got {request.query.get('limit')!r}") from None
            return _json_response(self.stats.requests_json(limit))
        if what == "reset-counters" and method == "POST":
            self.stats.reset()
            return _json_response(errors.success_status())
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    async def _faults_endpoint(self, request: web.BaseRequest, method: str) -> web.Response:
        """GET the rules and what was injected; PUT `{"seed", "rules"}` to replace them (a 400 naming
        the field and value leaves the old ones); DELETE to clear them (the counters stay)."""
        if method == "PUT":
            raw = await request.read()
            try:
                if request.content_type in _YAML_TYPES:
                    body = yaml.safe_load(raw)
                else:
                    body = orjson.loads(raw) if raw.strip() else {}
            except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
                raise bad_request(f"couldn't decode the fault rules: {exc}") from None
            try:
                config = parse_config(body)
            except FaultSpecError as err:
                raise bad_request(f"fault rules: {err}") from None
            self.set_faults(config)
        elif method == "DELETE":
            self.faults.clear()
            self._last_lists.clear()
            log.info("fault rules cleared")
        elif method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on /hami-sim/faults")
        return _json_response(self.faults.to_json())

    def set_faults(self, config: FaultConfig) -> None:
        """Replace the fault rules (counters and the random source start again from the seed)."""
        self.faults.replace(config)
        self._last_lists.clear()
        log.info("fault rules set: seed %d, %s", config.seed,
                 ", ".join(f"{r.name} ({r.fault})" for r in config.rules) or "none")  # fmt: skip

    async def _fault_for(
        self, request: web.BaseRequest, ctx: _Ctx, info: ResourceInfo | None, verb: str
    ) -> Decision | None:
        """Decide whether a resource request gets a fault. Answers conflict, throttle and error by raising
        their `ApiError`, delays a watch's opening for `slow`, and returns slow (the answer is held back
        after the request was served: a client that gives up may miss a write that landed), drop-watch,
        gone and stale-list for the handlers."""
        query = request.query
        resumed = (
            verb == "watch"
            and query.get("resourceVersion", "") not in ("", "0")
            and query.get("sendInitialEvents", "") not in ("true", "1")
        )
        stale_available = (
            verb == "list" and not query.get("continue") and self._stale_key(request, ctx) in self._last_lists
        )
        decision = self.faults.decide(
            FaultRequest(
                verb=verb,
                resource=ctx.resource,
                subresource=ctx.subresource,
                namespace=ctx.namespace,
                user_agent=request.headers.get("User-Agent", ""),
                resumed=resumed,
                stale_available=stale_available,
            )
        )
        if decision is None:
            return None
        rule = decision.rule
        log.info("fault %s (%s) injected: %s %s", rule.name, rule.fault, verb, request.path_qs)
        group = info.group if info is not None else ""
        if rule.fault == "conflict":
            # apiserver pkg/registry/generic/registry/store.go: NewConflict(..., OptimisticLockErrorMsg)
            raise errors.conflict(group, ctx.resource, ctx.name, errors.STALE_OBJECT)
        if rule.fault == "throttle":
            # apimachinery NewTooManyRequests; the Retry-After header as server/filters/
            # priority-and-fairness.go tooManyRequests and responsewriters ErrorNegotiated set it.
            raise ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                           retry_after_s=rule.retry_after_s)  # fmt: skip
        if rule.fault == "error":
            if rule.retry_after_s > 0:
                # apiserver pkg/storage/errors/storage.go: a storage timeout is NewServerTimeout(res, verb, 2)
                raise ApiError(
                    500,
                    "ServerTimeout",
                    f"The {verb} operation against {errors.qualified(group, ctx.resource)} could not be "
                    "completed at this time, please try again.",
                    name=verb,
                    group=group,
                    kind=ctx.resource,
                    retry_after_s=rule.retry_after_s,
                )
            raise ApiError(
                500,
                "InternalError",
                f"Internal error occurred: injected fault {rule.name}",
                causes=[{"message": f"injected fault {rule.name}"}],
            )
        if rule.fault == "slow" and verb == "watch":
            await asyncio.sleep(rule.delay_s)  # the watch opens late
            return None
        return decision

    @staticmethod
    def _stale_key(request: web.BaseRequest, ctx: _Ctx) -> tuple[str, ...]:
        query = request.query
        return stale_key(
            ctx.resource, ctx.namespace, query.get("labelSelector", ""), query.get("fieldSelector", "")
        )

    def _discovery(self, parts: list[str]) -> web.StreamResponse | tuple[str, str, list[str]]:
        """A discovery document for /api, /apis, /apis/<group> and /api(s)/.../<version>; otherwise the
        (group, version, rest of the path) of a resource request."""
        if parts[0] == "api":
            group = ""
            if len(parts) == 1:
                return _json_response(discovery.api_versions(self.server_address))
            version, rest = parts[1], parts[2:]
        else:
            if len(parts) == 1:
                return _json_response(discovery.api_group_list())
            group = parts[1]
            if len(parts) == 2:
                doc = discovery.api_group(group)
                if doc is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return _json_response(doc)
            version, rest = parts[2], parts[3:]
        if not rest:
            listing = discovery.resource_list(group, version)
            if listing is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _json_response(listing)
        return group, version, rest

    async def _route_api(
        self, request: web.BaseRequest, ctx: _Ctx, parts: list[str], method: str
    ) -> web.StreamResponse:
        located = self._discovery(parts)
        if isinstance(located, web.StreamResponse):
            return located
        group, version, rest = located
        legacy_watch = rest[0] == "watch"
        if legacy_watch:
            rest = rest[1:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, plural, tail = rest[1], rest[2], rest[3:]
        elif rest:
            plural, tail = rest[0], rest[1:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = tail[0] if tail else ""
        sub = tail[1] if len(tail) > 1 else ""
        ctx.resource, ctx.subresource, ctx.namespace, ctx.name = plural, sub, namespace or "", name
        if group == "" and plural == "bindings" and namespace is not None and not name and method == "POST":
            ctx.verb, ctx.resource, ctx.subresource = "create", "pods", "binding"
            slow = await self._fault_for(request, ctx, None, "create") if self.faults.active else None
            return await self._held_back(self._bind(request, namespace, ""), slow)
        info = discovery.resource_for(group, version, plural)
        if info is None or len(tail) > 2 or (sub and sub not in info.subresources):
            ctx.verb = method.lower()
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if (namespace is not None and not info.namespaced) or (
            info.namespaced and name and namespace is None
        ):
            ctx.verb = method.lower()
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        watching = legacy_watch or request.query.get("watch", "") in ("1", "true", "True")
        fault: Decision | None = None
        if self.faults.active:
            verb = _request_verb(method, name, sub, watching)
            if verb:
                ctx.verb = verb
                fault = await self._fault_for(request, ctx, info, verb)
        if fault is None or fault.rule.fault != "slow":
            return await self._dispatch(request, ctx, info, namespace, name, sub, method, watching, fault)
        return await self._held_back(
            self._dispatch(request, ctx, info, namespace, name, sub, method, watching), fault
        )

    @staticmethod
    async def _held_back(
        serve: Coroutine[Any, Any, web.StreamResponse], slow: Decision | None
    ) -> web.StreamResponse:
        """Serve the request, then hold its answer (or its error) back for a slow fault's delay."""
        if slow is None:
            return await serve
        try:
            response = await serve
        except ApiError:
            await asyncio.sleep(slow.rule.delay_s)
            raise
        await asyncio.sleep(slow.rule.delay_s)
        return response

    async def _dispatch(  # noqa: PLR0917 - the parts of one routed request
        self,
        request: web.BaseRequest,
        ctx: _Ctx,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        sub: str,
        method: str,
        watching: bool,
        fault: Decision | None = None,
    ) -> web.StreamResponse:
        """The verb of a routed resource request (kube-apiserver's request info: get, list, watch, create,
        update, patch, delete, deletecollection)."""
        if method == "GET":
            if watching:
                ctx.verb = "watch"
                return await self._watch(request, ctx, info, namespace, name, fault)
            if name:
                ctx.verb = "get"
                return self._get(request, info, namespace or "", name)
            ctx.verb = "list"
            return self._list(request, info, namespace, fault)
        if method == "POST":
            ctx.verb = "create"
            if name and sub == "binding":
                return await self._bind(request, namespace or "", name)
            if name:
                raise ApiError(405, "MethodNotAllowed", f"POST is not supported on {request.path}")
            return await self._create(request, info, namespace)
        if method == "PUT" and name and sub != "binding":
            ctx.verb = "update"
            return await self._update(request, info, namespace or "", name, sub)
        if method == "PATCH" and name and sub != "binding":
            ctx.verb = "patch"
            return await self._patch(request, info, namespace or "", name, sub)
        if method == "DELETE" and not sub:
            if name:
                ctx.verb = "delete"
                return await self._delete(request, info, namespace or "", name)
            ctx.verb = "deletecollection"
            return self._delete_collection(request, info, namespace)
        ctx.verb = method.lower()
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on {request.path}")

    # -- helpers -------------------------------------------------------------------------------

    async def _read_object(self, request: web.BaseRequest, what: str, kind: str) -> JSON:
        """The request body as a JSON object: JSON, YAML, or Kubernetes protobuf (decoded into the JSON
        the Go type marshals to, as kube-apiserver's protobuf serializer does). `kind` is the kind the
        URL expects, for kube's "cannot be handled as" message."""
        raw = await request.read()
        ctype = request.content_type
        if not raw:
            raise bad_request(f"the request body of {what} is empty")
        if ctype == kubeproto.CONTENT_TYPE:
            try:
                return kubeproto.decode_protobuf(raw)
            except kubeproto.ProtobufError as err:
                raise bad_request(
                    f"the object provided is unrecognized (must be of type {kind}): {err}"
                ) from None
            except kubeproto.QuantityFieldError as err:
                raise _cannot_be_handled(kubeproto.envelope_kind(raw), kind, err) from None
        if ctype in _YAML_TYPES:
            try:
                body = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise bad_request(f"couldn't decode the request body of {what} as YAML: {exc}") from None
        elif ctype in _JSON_TYPES or ctype.endswith("+json") or ctype == "application/octet-stream":
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise bad_request(f"couldn't decode the request body of {what} as JSON: {exc}") from None
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f'the body of the request was in an unknown format "{ctype}" - accepted media types include: '
                f"application/json, application/yaml, {kubeproto.CONTENT_TYPE}",
            )
        if not isinstance(body, dict):
            raise bad_request(f"the request body of {what} must be a JSON object, got {type(body).__name__}")
        return body

    @staticmethod
    def _dry_run(request: web.BaseRequest) -> bool:
        values = request.query.getall("dryRun", [])
        for value in values:
            if value != "All":
                raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        return bool(values)

    @staticmethod
    def _selectors(
        request: web.BaseRequest, info: ResourceInfo
    ) -> tuple[LabelSelector | None, FieldSelector | None]:
        query = request.query
        label_text = query.get("labelSelector", "")
        field_text = query.get("fieldSelector", "")
        label: LabelSelector | None = None
        field: FieldSelector | None = None
        try:
            if label_text:
                label = parse_label_selector(label_text)
                if label.empty:
                    label = None
            if field_text:
                field = parse_field_selector(field_text, info.field_labels)
                if field.empty:
                    field = None
        except SelectorError as exc:
            raise bad_request(f"unable to parse requirement: {exc}") from None
        return label, field

    def _prepare_new(self, info: ResourceInfo, body: JSON, namespace: str, now: float) -> None:
        meta = strategy.check_metadata(info, body)
        if info.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise errors.invalid(
                    info.group,
                    info.kind,
                    "",
                    [("metadata.name", "Required value", "name or generateName is required")],
                )
            name = prefix + "".join(random.choice(_GENERATE_ALPHABET) for _ in range(5))
            meta["name"] = name
        if not isinstance(name, str):
            raise bad_request(f"metadata.name must be a string, got {name!r}")
        strategy.validate_name(info, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339(now)
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(key, None)
        strategy.prepare_for_create(info, body, self.feature_gates)

    def _object_response(
        self, request: web.BaseRequest, info: ResourceInfo, stored: Stored, status: int
    ) -> web.Response:
        if tables.wants_table(request.headers.get("Accept", "")):
            table = tables.to_table(
                info,
                [stored.obj],
                now=self.clock(),
                resource_version=str(stored.rv),
                include_object=request.query.get("includeObject", "Metadata"),
            )
            return _json_response(table, status)
        return _json_response(stored.raw, status)

    @staticmethod
    def _check_namespace(body: JSON, namespace: str) -> None:
        meta = body.get("metadata")
        body_ns = meta.get("namespace") if isinstance(meta, dict) else None
        if body_ns and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )

    # -- paged lists ---------------------------------------------------------------------------
    # A list with `limit` keeps the whole filtered result (references to immutable stored objects, so
    # cheap) as a snapshot under a continue token: every page then comes from the same point in time,
    # as etcd's do at the list's resourceVersion. Snapshots live 60 s; an unknown or expired token is
    # 410 Expired, as kube-apiserver answers it, and the client lists again.

    _SNAPSHOT_TTL_S = 60.0

    def _remember_snapshot(self, items: list[Any], rv: str, offset: int) -> str:
        now = time.monotonic()
        for key in [k for k, (_, _, born) in self._snapshots.items() if now - born > self._SNAPSHOT_TTL_S]:
            del self._snapshots[key]
        self._snapshot_ids += 1
        key = f"{rv}-{self._snapshot_ids}"
        self._snapshots[key] = (items, rv, now)
        return f"{key}:{offset}"

    def _next_page(self, token: str, limit: int) -> tuple[list[Any], str, str]:
        key, _, offset_text = token.rpartition(":")
        snapshot = self._snapshots.get(key)
        if snapshot is None or not offset_text.isdigit():
            raise ApiError(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result. You can "
                "start a new list without the continue parameter.",
            )
        items, rv, _ = snapshot
        offset = int(offset_text)
        end = offset + limit if limit > 0 else len(items)
        if end >= len(items):
            del self._snapshots[key]
            return items[offset:], rv, ""
        return items[offset:end], rv, f"{key}:{end}"

    # -- verbs ---------------------------------------------------------------------------------

    def _get(self, request: web.BaseRequest, info: ResourceInfo, namespace: str, name: str) -> web.Response:
        return self._object_response(request, info, self.store.get(info, namespace, name), 200)

    def _list(
        self,
        request: web.BaseRequest,
        info: ResourceInfo,
        namespace: str | None,
        fault: Decision | None = None,
    ) -> web.Response:
        label, field = self._selectors(request, info)
        token = request.query.get("continue", "")
        limit_text = request.query.get("limit", "")
        try:
            limit = int(limit_text) if limit_text else 0
        except ValueError:
            raise bad_request(f"limit must be an integer, got {limit_text!r}") from None
        if token:
            items, rv, next_token = self._next_page(token, limit)
        else:
            key = stale_key(
                info.plural,
                namespace or "",
                request.query.get("labelSelector", ""),
                request.query.get("fieldSelector", ""),
            )
            if fault is not None and key in self._last_lists:
                # stale-list: the previous answer again, with its older resourceVersion, as a watch cache
                # that lags behind etcd serves it (the client's watch from there catches up).
                items, rv = self._last_lists[key]
            else:
                items = self.store.list(info, namespace, label, field)
                rv = str(self.store.resource_version)
                if self.faults.has("stale-list"):
                    self._last_lists[key] = (items, rv)
            next_token = ""
            if 0 < limit < len(items) and not tables.wants_table(request.headers.get("Accept", "")):
                next_token = self._remember_snapshot(items, rv, limit)
                items = items[:limit]
        if next_token:
            head = orjson.dumps(
                {
                    "kind": info.list_kind,
                    "apiVersion": info.api_version,
                    "metadata": {"resourceVersion": rv, "continue": next_token},
                }
            )
            return _json_response(head[:-1] + b',"items":[' + b",".join(s.raw for s in items) + b"]}")
        if tables.wants_table(request.headers.get("Accept", "")):
            table = tables.to_table(
                info,
                [s.obj for s in items],
                now=self.clock(),
                resource_version=rv,
                include_object=request.query.get("includeObject", "Metadata"),
            )
            return _json_response(table)
        head = orjson.dumps(
            {"kind": info.list_kind, "apiVersion": info.api_version, "metadata": {"resourceVersion": rv}}
        )
        body = head[:-1] + b',"items":[' + b",".join(s.raw for s in items) + b"]}"
        return _json_response(body)

    async def _create(
        self, request: web.BaseRequest, info: ResourceInfo, namespace: str | None
    ) -> web.Response:
        if info.namespaced and namespace is None:
            raise ApiError(405, "MethodNotAllowed", f"POST is not supported on {request.path}")
        dry_run = self._dry_run(request)
        body = await self._read_object(request, f"a {info.kind}", info.kind)
        strategy.check_body_type(info, body)
        _normalize_quantities(body, info.kind)
        if namespace is not None:
            self._check_namespace(body, namespace)
        self._prepare_new(info, body, namespace or "", self.clock())
        if info.namespaced and self.store.find(NAMESPACE, "", namespace or "") is None:
            raise errors.not_found("", "namespaces", namespace or "")
        if info is POD:
            mutated = await self.admission.mutate_pod(self.store, body, dry_run)
            if mutated is not body:
                body = mutated
                strategy.check_body_type(info, body)
                try:
                    kubeproto.normalize_quantities("k8s.io.api.core.v1.Pod", body)
                except kubeproto.QuantityFieldError as err:
                    # kube decodes the patched object into its Go type; a failure is an internal error
                    # (apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go).
                    raise ApiError(500, "InternalError", f"Internal error occurred: {err}") from None
                meta = strategy.check_metadata(info, body)
                meta["namespace"] = namespace
                strategy.finish_pod_after_admission(body)
        if dry_run:
            if self.store.find(info, namespace or "", body["metadata"]["name"]) is not None:
                raise errors.already_exists(info.group, info.plural, body["metadata"]["name"])
            return self._object_response(request, info, Stored(body, 0), 201)
        stored = self.store.create(info, body)
        return self._object_response(request, info, stored, 201)

    def _commit_update(  # noqa: PLR0917
        self, request: web.BaseRequest, info: ResourceInfo, new: JSON, old: Stored, sub: str, dry_run: bool
    ) -> web.Response:
        name = old.obj["metadata"]["name"]
        expected = new["metadata"].get("resourceVersion")
        if expected not in (None, "") and expected != old.obj["metadata"]["resourceVersion"]:
            raise errors.conflict(info.group, info.plural, name, errors.STALE_OBJECT)
        result = strategy.prepare_for_update(info, new, old.obj, sub, self.feature_gates)
        result["metadata"] = {**result["metadata"], "resourceVersion": old.obj["metadata"]["resourceVersion"]}
        finishing = _check_finalizers(info, result, old.obj)
        if result == old.obj:
            # kube does not write (nor bump resourceVersion) when nothing changed.
            return self._object_response(request, info, old, 200)
        if dry_run:
            return self._object_response(request, info, Stored(result, old.rv), 200)
        stored = self.store.update(info, result, old)
        if finishing:
            # The last finalizer of an object being deleted is gone: the registry deletes it
            # (apiserver/pkg/registry/generic/registry/store.go, Update -> deleteWithoutFinalizers).
            meta = stored.obj["metadata"]
            stored = self.store.delete(info, meta.get("namespace", ""), meta["name"])
        return self._object_response(request, info, stored, 200)

    async def _update(
        self, request: web.BaseRequest, info: ResourceInfo, namespace: str, name: str, sub: str
    ) -> web.Response:
        dry_run = self._dry_run(request)
        body = await self._read_object(request, f"a {info.kind}", info.kind)
        old = self.store.get(info, namespace, name)
        strategy.check_body_type(info, body)
        _normalize_quantities(body, info.kind)
        meta = strategy.check_metadata(info, body)
        strategy.check_url_name(info, str(meta.get("name") or ""), name)
        if info.namespaced:
            self._check_namespace(body, namespace)
        return self._commit_update(request, info, body, old, sub, dry_run)

    async def _patch(
        self, request: web.BaseRequest, info: ResourceInfo, namespace: str, name: str, sub: str
    ) -> web.Response:
        dry_run = self._dry_run(request)
        ctype = request.content_type
        if ctype not in _PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f'the body of the request was in an unknown format "{ctype}" - accepted media types include: '
                + ", ".join(_PATCH_TYPES)
                + " (server-side apply is not supported by the hami-sim API server)",
            )
        raw = await request.read()
        try:
            patch = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"couldn't decode the patch as JSON: {exc}") from None
        old = self.store.get(info, namespace, name)
        try:
            if ctype == "application/json-patch+json":
                result = json_patch(old.obj, patch)
            elif ctype == "application/merge-patch+json":
                if not isinstance(patch, dict):
                    raise bad_request("a merge patch must be a JSON object")
                result = json_merge_patch(old.obj, patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request("a strategic merge patch must be a JSON object")
                result = strategic_merge_patch(old.obj, patch)
        except PatchError as exc:
            raise ApiError(
                422, "Invalid", f"the patch could not be applied to {info.qualified} {name!r}: {exc}"
            ) from None
        if not isinstance(result, dict) or not isinstance(result.get("metadata"), dict):
            raise ApiError(422, "Invalid", f"the patched {info.kind} {name!r} is not an object with metadata")
        strategy.check_body_type(info, result)
        message = kubeproto.schema().kind(info.api_version, info.kind)
        if message is not None:
            try:
                kubeproto.normalize_quantities(message.full_name, result)
            except kubeproto.QuantityFieldError as err:
                # kube decodes the patched JSON into the Go type; a failure is 422 on the field "patch"
                # (apiserver/pkg/endpoints/handlers/patch.go), here naming the quantity's own field.
                raise errors.invalid(
                    info.group,
                    info.kind,
                    name,
                    [(err.path, "Invalid value", f"{_quote(err.value)}: {err.reason}")],
                ) from None
        meta = strategy.check_metadata(info, result)
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if info.namespaced:
            self._check_namespace(result, namespace)
        return self._commit_update(request, info, result, old, sub, dry_run)

    async def _delete(
        self, request: web.BaseRequest, info: ResourceInfo, namespace: str, name: str
    ) -> web.Response:
        query_dry_run = self._dry_run(request)
        raw = await request.read()
        old = self.store.get(info, namespace, name)
        body: Any = None
        if raw.strip():
            try:
                if request.content_type == kubeproto.CONTENT_TYPE:
                    body = kubeproto.decode_protobuf(raw)
                else:
                    body = orjson.loads(raw)
            except (orjson.JSONDecodeError, kubeproto.ProtobufError) as exc:
                raise bad_request(f"couldn't decode DeleteOptions: {exc}") from None
        options = deletion.parse_options(body, request.query)
        dry_run = query_dry_run or options.dry_run
        if options.preconditions is not None:
            self._check_delete_preconditions(info, name, old.obj["metadata"], options.preconditions)
        if info is NAMESPACE and name in _PROTECTED_NAMESPACES:
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                name=name,
                kind="namespaces",
            )
        if info is NAMESPACE:
            outcome = deletion.Outcome(delete=True)
        else:
            # Graceful deletion (pods) and finalizers: the object may stay, marked, and the answer is the
            # object (deletion.py; apiserver/pkg/registry/generic/registry/store.go Delete,
            # handlers/delete.go).
            outcome = deletion.plan(
                old.obj,
                graceful=info is POD,
                requested=options.grace_period_seconds,
                now=self.clock(),
                fmt=now_rfc3339,
            )
        if not outcome.delete:
            if outcome.write is None or outcome.write == old.obj:
                return self._object_response(request, info, old, 200)
            if dry_run:
                return self._object_response(request, info, Stored(outcome.write, old.rv), 200)
            return self._object_response(request, info, self.store.update(info, outcome.write, old), 200)
        if dry_run:
            stored = old
        else:
            if info is NAMESPACE:
                self.store.delete_namespace_contents(name)
            stored = self.store.delete(info, namespace, name)
        if info.delete_returns_object:
            return self._object_response(request, info, stored, 200)
        return _json_response(
            errors.success_status(
                name=name, group=info.group, kind=info.plural, uid=str(stored.obj["metadata"].get("uid", ""))
            )
        )

    @staticmethod
    def _check_delete_preconditions(info: ResourceInfo, name: str, meta: JSON, pre: Any) -> None:
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise errors.conflict(
                info.group,
                info.plural,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, "
                f"UID in object meta: {meta.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise errors.conflict(
                info.group,
                info.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )

    def _delete_collection(
        self, request: web.BaseRequest, info: ResourceInfo, namespace: str | None
    ) -> web.Response:
        if info is NAMESPACE:
            raise ApiError(405, "MethodNotAllowed", "deletecollection is not supported on namespaces")
        dry_run = self._dry_run(request)
        label, field = self._selectors(request, info)
        items = self.store.list(info, namespace, label, field)
        deleted = items
        if not dry_run:
            deleted = [
                self.store.delete(info, s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"])
                for s in items
            ]
        head = orjson.dumps(
            {
                "kind": info.list_kind,
                "apiVersion": info.api_version,
                "metadata": {"resourceVersion": str(self.store.resource_version)},
            }
        )
        return _json_response(head[:-1] + b',"items":[' + b",".join(s.raw for s in deleted) + b"]}")

    async def _bind(self, request: web.BaseRequest, namespace: str, name: str) -> web.Response:
        """pods/binding: assign the pod to a node, copying the Binding's annotations onto the pod."""
        dry_run = self._dry_run(request)
        body = await self._read_object(request, "a Binding", "Binding")
        strategy.check_body_type(POD, body, expected_kind="Binding")
        meta = strategy.check_metadata(POD, body)
        if name and meta.get("name") and meta["name"] != name:
            raise bad_request(f"name in URL ({name}) does not match name in Binding object ({meta['name']})")
        name = name or str(meta.get("name") or "")
        if not name:
            raise errors.invalid("", "Binding", "", [("metadata.name", "Required value", "")])
        self._check_namespace(body, namespace)
        target = body.get("target")
        if not isinstance(target, dict) or not target.get("name"):
            raise errors.invalid("", "Binding", name, [("target.name", "Required value", "")])
        if target.get("kind") not in (None, "", "Node"):
            raise errors.invalid(
                "",
                "Binding",
                name,
                [("target.kind", "Invalid value", f'"{target["kind"]}": must be empty or "Node"')],
            )
        node = str(target["name"])
        old = self.store.get(POD, namespace, name)
        pod = old.obj
        pod_meta = pod["metadata"]
        if meta.get("uid") and meta["uid"] != pod_meta.get("uid"):
            raise errors.conflict(
                "",
                "pods",
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {pod_meta.get('uid')}",
            )
        if meta.get("resourceVersion") and meta["resourceVersion"] != pod_meta.get("resourceVersion"):
            raise errors.conflict("", "pods", name, errors.STALE_OBJECT)
        if pod_meta.get("deletionTimestamp"):
            raise errors.conflict(
                "", "pods", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise errors.conflict("", "pods", name, f'pod {name} is already assigned to node "{current}"')
        annotations = meta.get("annotations") or {}
        new_meta = dict(pod_meta)
        if annotations:
            new_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **annotations}
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        previous = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if previous is not None and previous.get("status") == "True":
            conditions.append(previous)
        else:
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_rfc3339(self.clock()),
                }
            )
        status["conditions"] = conditions
        new_pod = {**pod, "metadata": new_meta, "spec": {**pod["spec"], "nodeName": node}, "status": status}
        if not dry_run:
            self.store.update(POD, new_pod, old)
        return _json_response(errors.success_status(201), 201)

    # -- watch ---------------------------------------------------------------------------------

    async def _watch(  # noqa: PLR0917
        self,
        request: web.BaseRequest,
        ctx: _Ctx,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        fault: Decision | None = None,
    ) -> web.StreamResponse:
        started = time.perf_counter()
        query = request.query
        label, field = self._selectors(request, info)
        if name:
            by_name = parse_field_selector(f"metadata.name={name}", info.field_labels)
            field = by_name if field is None else FieldSelector(field.requirements + by_name.requirements)
        rv_text = query.get("resourceVersion", "")
        send_initial = query.get("sendInitialEvents", "") in ("true", "1")
        resource_version: int | None
        if rv_text in ("", "0") or send_initial:
            resource_version = None
        else:
            try:
                resource_version = int(rv_text)
            except ValueError:
                raise bad_request(
                    f'resourceVersion: Invalid value: "{rv_text}": must be an integer'
                ) from None
        timeout_text = query.get("timeoutSeconds", "")
        try:
            timeout = float(timeout_text) if timeout_text else DEFAULT_WATCH_TIMEOUT
        except ValueError:
            raise bad_request(f'timeoutSeconds: Invalid value: "{timeout_text}": must be a number') from None
        bookmarks = query.get("allowWatchBookmarks", "") in ("true", "1")
        want_table = tables.wants_table(request.headers.get("Accept", ""))
        include_object = query.get("includeObject", "Metadata")
        index_value = field.required_value(info.watch_index_field) if field is not None else None
        expired: ApiError | None = None
        watcher: Watcher | None = None
        if fault is not None and fault.rule.fault == "gone" and resource_version is not None:
            # watch_cache_history.go: "too old resource version: %d (%d)"; as an ERROR event in the
            # stream (cacher.go Watch) or, with goneAs "status", as the HTTP answer itself.
            expired = ApiError(
                410,
                "Expired",
                f"too old resource version: {resource_version} "
                f"({max(resource_version, self.store.resource_version)})",
            )
            if fault.gone_status:
                raise expired
        else:
            try:
                watcher = self.store.watch(info, namespace, resource_version, label, field, index_value)
            except ApiError as error:
                if error.code != 410:
                    raise
                expired = error
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._record(request, ctx, 200, started)
        if expired is not None or watcher is None:
            assert expired is not None
            await self._write(response, orjson.dumps({"type": "ERROR", "object": expired.status()}) + b"\n")
            return response
        if self._closing:
            watcher.close()
        drop_after = fault.drop_after if fault is not None and fault.rule.fault == "drop-watch" else None
        try:
            await self._stream(
                response,
                watcher,
                info,
                timeout,
                bookmarks,
                send_initial,
                want_table,
                include_object,
                _Drop(request, drop_after) if drop_after is not None else None,
            )
        finally:
            self.store.unwatch(watcher)
        return response

    @staticmethod
    async def _write(response: web.StreamResponse, data: bytes) -> bool:
        try:
            await response.write(data)
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def _send(self, response: web.StreamResponse, lines: list[bytes], drop: _Drop | None) -> bool:
        """Write watch lines; False when the stream is over (the client went, or drop-watch cut it after
        its count of lines)."""
        if drop is not None and len(lines) >= drop.remaining:
            lines = lines[: drop.remaining]
            if lines:
                await self._write(response, b"".join(lines))
            drop.cut()
            return False
        if drop is not None:
            drop.remaining -= len(lines)
        return not lines or await self._write(response, b"".join(lines))

    def _bookmark(self, info: ResourceInfo, initial_end: bool = False) -> bytes:
        meta: JSON = {"resourceVersion": str(self.store.resource_version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            orjson.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta},
                }
            )
            + b"\n"
        )

    def _encode(
        self, info: ResourceInfo, etype: str, event: Any, want_table: bool, include_object: str
    ) -> bytes:
        if not want_table:
            line: bytes = event.line(etype)
            return line
        obj = event.obj_for(etype)
        table = tables.to_table(
            info, [obj], now=self.clock(), resource_version=str(event.rv), include_object=include_object
        )
        return orjson.dumps({"type": etype, "object": table}) + b"\n"

    async def _stream(  # noqa: PLR0917
        self,
        response: web.StreamResponse,
        watcher: Watcher,
        info: ResourceInfo,
        timeout_s: float,
        bookmarks: bool,
        send_initial: bool,
        want_table: bool,
        include_object: str,
        drop: _Drop | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        next_bookmark = loop.time() + self.bookmark_interval
        queue = watcher.queue
        if drop is not None and drop.remaining <= 0:
            drop.cut()
            return
        if send_initial:
            # Initial ADDED events are already queued; mark their end for watch-list clients.
            lines = [self._encode(info, t, e, want_table, include_object) for t, e in queue]
            queue.clear()
            if bookmarks:
                lines.append(self._bookmark(info, initial_end=True))
            if not await self._send(response, lines, drop):
                return
        while True:
            if not queue and not watcher.closed:
                now = loop.time()
                wait_until = min(deadline, next_bookmark) if bookmarks else deadline
                if wait_until > now:
                    watcher.wake.clear()
                    try:
                        async with asyncio.timeout(wait_until - now):
                            await watcher.wake.wait()
                    except TimeoutError:
                        pass
            if queue:
                batch = [queue.popleft() for _ in range(min(len(queue), 500))]
                lines = [self._encode(info, t, e, want_table, include_object) for t, e in batch]
                if not await self._send(response, lines, drop):
                    return
                continue
            if watcher.closed:
                if watcher.overflowed:
                    log.warning("watch on %s closed: the client fell more than %d events behind",
                                info.qualified, watcher.max_queue)  # fmt: skip
                break
            now = loop.time()
            if now >= deadline:
                if bookmarks and not await self._send(response, [self._bookmark(info)], drop):
                    return
                break
            if bookmarks and now >= next_bookmark:
                next_bookmark = now + self.bookmark_interval
                if not await self._send(response, [self._bookmark(info)], drop):
                    return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
