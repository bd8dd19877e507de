"""Mutating admission webhooks, called the way kube-apiserver calls them.

`WebhookDispatcher.mutate` takes the stored `admissionregistration.k8s.io/v1`
MutatingWebhookConfiguration objects (plain dicts) and one request's `AdmissionAttributes`, calls every
matching webhook in turn over HTTPS, applies their JSONPatches and returns the mutated object, or raises
`AdmissionRejected` carrying the status kube-apiserver would answer with.

Kube behaviour kept: configurations in name order, webhooks in list order, each seeing the object as
mutated so far; `rules` (operations, apiGroups, apiVersions, resources with `*`, `pods/*`, `*/*`,
scope), `namespaceSelector` (not for cluster-scoped objects other than namespaces), `objectSelector`
(object or old object labels); webhook configuration objects themselves are never sent to webhooks;
the first known version in `admissionReviewVersions` (v1, v1beta1) is sent; `timeoutSeconds` (default
10, clamped to 1..30, also sent as `?timeout=Ns`); the server certificate is verified against
`clientConfig.caBundle` (system roots without one) and the host name (`<service>.<namespace>.svc` for
service references); a v1 response must echo the request uid and carry `allowed`; patches must be
`JSONPatch`; `failurePolicy` (default Fail) decides what a failed call does; a dry-run request is refused
by webhooks whose `sideEffects` is not None/NoneOnDryRun. Error messages and codes are kube's.

`matchConditions` are CEL, evaluated as kube-apiserver does
(staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go `Match`, called by
webhook/generic/webhook.go `ShouldCallHook` after the rules and selectors): with the variables `object`,
`oldObject` (null when absent) and `request` (the AdmissionRequest without its objects); any condition
false skips the webhook; all true calls it; an evaluation error (a missing field, a result that is not a
bool, an expression that does not compile) with none false follows `failurePolicy`: Ignore skips the
webhook, Fail refuses the request with kube's 403 (`pods "name" is forbidden: ...`). The CEL library is
the one the DRA selectors use (`cel`, with the Kubernetes functions of hami_sim.scheduler.dra.selector);
`authorizer` and the cost budget are not served. The literal expressions `true` and `false` are answered
without CEL.

Simplifications: `reinvocationPolicy: IfNeeded` is treated as Never; `matchPolicy` is irrelevant because the
stand-in serves one version per resource. A service reference cannot use cluster DNS: it goes through
the `service_resolver` given to the dispatcher (without one, the call fails and `failurePolicy` applies).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import ssl
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import aiohttp

from hami_sim.apiserver.patch import PatchError, json_patch
from hami_sim.apiserver.selectors import SelectorError, label_selector_from_object

__all__ = [
    "AdmissionAttributes",
    "AdmissionRejected",
    "MatchConditionError",
    "ServiceResolver",
    "WebhookDispatcher",
]

log = logging.getLogger(__name__)

ServiceResolver = Callable[[str, str, int], str]
"""(namespace, name, port) -> base URL such as `https://127.0.0.1:8443` for a webhook service."""

DEFAULT_TIMEOUT_SECONDS = 10
MAX_TIMEOUT_SECONDS = 30
_REVIEW_VERSIONS = ("v1", "v1beta1")
_EXEMPT_RESOURCES = frozenset(
    {
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    }
)
_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


@dataclass(frozen=True)
class AdmissionAttributes:
    """One API request as admission sees it. `kind` is (group, version, kind), `resource` is
    (group, version, resource). `obj` is the new object (None for DELETE/CONNECT), `old_obj` the
    stored one (UPDATE/DELETE). `namespace_labels` are the labels of the request's namespace (for a
    namespace CREATE/UPDATE the object's own labels are used instead)."""

    operation: str
    kind: tuple[str, str, str]
    resource: tuple[str, str, str]
    sub_resource: str = ""
    namespace: str = ""
    name: str = ""
    obj: Mapping[str, Any] | None = None
    old_obj: Mapping[str, Any] | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    user: str = "system:admin"
    dry_run: bool = False
    groups: tuple[str, ...] = ("system:masters", "system:authenticated")
    options: Mapping[str, Any] | None = None
    """The request's CreateOptions/UpdateOptions/DeleteOptions; derived from `operation` when None."""


class AdmissionRejected(Exception):
    """The request is refused: `code`, `reason` and `message` are those of the metav1.Status that
    kube-apiserver would return (`to_status()` builds it)."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            status["details"] = self.details
        return status


class _CallError(Exception):
    """A failed webhook call (kube's ErrCallingWebhook reason): subject to failurePolicy."""


def _quote(text: str) -> str:
    """Go's %q for the plain strings that appear in kube messages."""
    return json.dumps(text, ensure_ascii=False)


def _internal_error(cause: str) -> AdmissionRejected:
    return AdmissionRejected(
        500, "InternalError", f"Internal error occurred: {cause}", {"causes": [{"message": cause}]}
    )


def _denial(attrs: AdmissionAttributes, webhook: str, result: Any) -> AdmissionRejected:
    """kube's webhookerrors.ToStatusErr for `allowed: false`."""
    result = result if isinstance(result, Mapping) else {}
    code = result.get("code") if isinstance(result.get("code"), int) and result.get("code") else 403
    reason = str(result.get("reason") or "")
    detail = str(result.get("message") or "") or reason
    denied_by = f"admission webhook {_quote(webhook)} denied the request"
    message = f"{denied_by}: {detail}" if detail else f"{denied_by} without explanation"
    group, _, resource = attrs.resource
    name = attrs.name or "Unknown"
    details = result.get("details") if isinstance(result.get("details"), Mapping) else None
    if details is None:
        if code == 500:
            details = {"causes": [{"message": message}]}
        else:
            details = {"group": group, "kind": resource, "name": name}
    if code == 500:
        message = f"Internal error occurred: {message}"
    else:
        group_resource = f"{resource}.{group}" if group else resource
        message = f"{group_resource} {_quote(name)} is forbidden: {message}"
    if not reason:
        reason = "InternalError" if code == 500 else "Forbidden"
    return AdmissionRejected(code, reason, message, details)


# ------------------------------------------------------------------------------------------- matching


def _string_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _CallError(f"invalid webhook configuration: {where} must be a list of strings, got {value!r}")
    return value


def _rule_matches(rule: Any, attrs: AdmissionAttributes, where: str) -> bool:
    if not isinstance(rule, Mapping):
        raise _CallError(f"invalid webhook configuration: {where} must be an object")
    group, version, resource = attrs.resource

    def allows(key: str, value: str) -> bool:
        listed = _string_list(rule.get(key), f"{where}.{key}")
        return "*" in listed or value in listed

    if not (
        allows("operations", attrs.operation)
        and allows("apiGroups", group)
        and allows("apiVersions", version)
    ):
        return False
    for entry in _string_list(rule.get("resources"), f"{where}.resources"):
        res, _, sub = entry.partition("/")
        if (res in ("*", resource)) and (sub in ("*", attrs.sub_resource)):
            break
    else:
        return False
    scope = rule.get("scope") or "*"
    is_namespace = group == "" and resource == "namespaces"
    if scope == "Namespaced":
        return not is_namespace and attrs.namespace != ""
    if scope == "Cluster":
        return is_namespace or attrs.namespace == ""
    return True


def _labels_of(obj: Mapping[str, Any] | None) -> Mapping[str, str] | None:
    if obj is None:
        return None
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _should_call(hook: Mapping[str, Any], attrs: AdmissionAttributes, obj: Mapping[str, Any] | None) -> bool:
    name = hook.get("name", "")
    rules = hook.get("rules") or []
    if not isinstance(rules, list):
        raise _CallError(f"invalid webhook configuration: webhooks[{name}].rules must be a list")
    if not any(_rule_matches(rule, attrs, f"rules[{i}]") for i, rule in enumerate(rules)):
        return False
    try:
        ns_selector = label_selector_from_object(hook.get("namespaceSelector"))
        obj_selector = label_selector_from_object(hook.get("objectSelector"))
    except SelectorError as err:
        raise _CallError(f"invalid webhook configuration: {err}") from None
    group, _, resource = attrs.resource
    if not ns_selector.empty:
        if (
            group == ""
            and resource == "namespaces"
            and not attrs.sub_resource
            and attrs.operation
            in (
                "CREATE",
                "UPDATE",
            )
        ):
            ns_labels: Mapping[str, str] | None = _labels_of(obj)
        elif attrs.namespace or (group == "" and resource == "namespaces"):
            ns_labels = attrs.namespace_labels
        else:
            ns_labels = None  # cluster-scoped: namespaceSelector does not apply
        if ns_labels is not None and not ns_selector.matches(ns_labels):
            return False
    if not obj_selector.empty:
        new, old = _labels_of(obj), _labels_of(attrs.old_obj)
        if not (
            (new is not None and obj_selector.matches(new)) or (old is not None and obj_selector.matches(old))
        ):
            return False
    return match_conditions(hook, attrs, obj)


class MatchConditionError(Exception):
    """A matchCondition that could not be evaluated (and none was false): kube's failing-closed case."""


@lru_cache(maxsize=256)
def _compiled(expression: str) -> Any:
    """The compiled program of one expression, or the compile error's text (a str)."""
    import cel

    try:
        return cel.compile(expression)
    except (ValueError, RuntimeError) as err:
        return f"compilation failed: {err}"


def _evaluate(expression: str, variables: Mapping[str, Any]) -> bool:
    """One condition: True/False, or MatchConditionError (kube's `expression '...' resulted in error`)."""
    if expression == "true":
        return True
    if expression == "false":
        return False
    import cel

    from hami_sim.scheduler.dra.selector import functions

    program = _compiled(expression)
    if isinstance(program, str):
        raise MatchConditionError(f"expression '{expression}' resulted in error: {program}")
    try:
        result = program.execute(cel.Context(variables=dict(variables), functions=dict(functions())))
    except (RuntimeError, ValueError, TypeError, KeyError, OverflowError) as err:
        detail = f"no such key: {err.args[0]}" if isinstance(err, KeyError) and err.args else str(err)
        raise MatchConditionError(f"expression '{expression}' resulted in error: {detail}") from None
    if not isinstance(result, bool):
        raise MatchConditionError(f"expression '{expression}' resulted in error: the result is not a bool")
    return result


def match_conditions(
    hook: Mapping[str, Any], attrs: AdmissionAttributes, obj: Mapping[str, Any] | None
) -> bool:
    """Whether the webhook's `matchConditions` select this request (kube's matcher.go `Match`): False as
    soon as one is false; True when all are true (or there are none); MatchConditionError when one could
    not be evaluated and none is false (the caller applies failurePolicy). `obj` is the object as mutated
    so far (what the webhook would be sent)."""
    conditions = hook.get("matchConditions") or []
    if not conditions:
        return True
    if not isinstance(conditions, list):
        raise MatchConditionError("matchConditions must be a list")
    variables: dict[str, Any] | None = None
    errors: list[str] = []
    for condition in conditions:
        if not isinstance(condition, Mapping) or not isinstance(condition.get("expression"), str):
            errors.append(f"matchCondition {condition!r} has no expression")
            continue
        expression = condition["expression"].strip()
        if variables is None and expression not in ("true", "false"):
            request = _review_request("", attrs, None)
            for key in ("uid", "object", "oldObject"):
                request.pop(key, None)
            variables = {"object": obj, "oldObject": attrs.old_obj, "request": request}
        try:
            if not _evaluate(expression, variables or {}):
                log.debug("webhook %s: matchCondition %s false", hook.get("name"), condition.get("name"))
                return False
        except MatchConditionError as err:
            errors.append(str(err))
    if errors:
        raise MatchConditionError(errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    return True


# ------------------------------------------------------------------------------------------- dispatch


@dataclass(frozen=True)
class _Endpoint:
    url: str
    server_hostname: str | None
    host_header: str | None


class WebhookDispatcher:
    """Calls mutating webhooks. It owns one aiohttp ClientSession (created on first use, bound to
    that event loop) and one SSLContext per (caBundle, server name); `close()` releases them."""

    def __init__(self, *, service_resolver: ServiceResolver | None = None) -> None:
        self._service_resolver = service_resolver
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ssl_contexts: dict[tuple[str, str | None], ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._loop = None

    async def __aenter__(self) -> WebhookDispatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def mutate(
        self, configurations: Sequence[Mapping[str, Any]], attrs: AdmissionAttributes
    ) -> dict[str, Any]:
        """Run every matching mutating webhook and return the (possibly patched) object: a new dict,
        `attrs.obj` is not changed. Returns {} for requests without an object (DELETE, CONNECT)."""
        obj: dict[str, Any] | None = json.loads(json.dumps(attrs.obj)) if attrs.obj is not None else None
        group, _, resource = attrs.resource
        if group == "admissionregistration.k8s.io" and resource in _EXEMPT_RESOURCES:
            return obj if obj is not None else {}
        ordered = sorted(configurations, key=lambda c: str((c.get("metadata") or {}).get("name", "")))
        for config in ordered:
            for hook in config.get("webhooks") or []:
                if isinstance(hook, Mapping):
                    obj = await self._admit(hook, attrs, obj)
        return obj if obj is not None else {}

    async def _admit(
        self, hook: Mapping[str, Any], attrs: AdmissionAttributes, obj: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        name = str(hook.get("name", ""))
        ignore = hook.get("failurePolicy") == "Ignore"
        try:
            if not _should_call(hook, attrs, obj):
                return obj
            if attrs.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
                raise AdmissionRejected(
                    400, "BadRequest", f"admission webhook {_quote(name)} does not support dry run"
                )
            response = await self._call(hook, attrs, obj)
        except MatchConditionError as err:
            if ignore:
                log.warning("Failed evaluating match conditions, skipping webhook %s: %s", name, err)
                return obj
            # kube's ShouldCallHook: a Forbidden error naming the resource (webhook/generic/webhook.go).
            log.warning("Failed evaluating match conditions, failing closed %s: %s", name, err)
            group, _, resource = attrs.resource
            group_resource = f"{resource}.{group}" if group else resource
            raise AdmissionRejected(
                403,
                "Forbidden",
                f"{group_resource} {_quote(attrs.name)} is forbidden: {err}",
                {"name": attrs.name, "group": group, "kind": resource},
            ) from None
        except _CallError as err:
            cause = f"failed calling webhook {_quote(name)}: {err}"
            if ignore:
                log.warning("Failed calling webhook, failing open %s: %s", name, cause)
                return obj
            log.warning("Failed calling webhook, failing closed %s: %s", name, cause)
            raise _internal_error(cause) from None
        for warning in response.get("warnings") or []:
            log.info("webhook %s warning: %s", name, warning)
        if not response["allowed"]:
            raise _denial(attrs, name, response.get("status"))
        patch = response.get("patch")
        if not patch:
            return obj
        if obj is None:
            raise _internal_error(f"webhook {_quote(name)} returned a patch for a request without an object")
        try:
            ops = json.loads(base64.b64decode(patch, validate=True))
        except (binascii.Error, ValueError) as err:
            raise _internal_error(
                f"webhook {_quote(name)} returned a patch that is not base64 JSON: {err}"
            ) from None
        try:
            patched = json_patch(obj, ops)
        except PatchError as err:
            raise _internal_error(str(err)) from None
        if not isinstance(patched, dict):
            raise _internal_error(f"webhook {_quote(name)}: the patched object is not a JSON object")
        return patched

    # ------------------------------------------------------------------------------------ the call

    def _endpoint(self, client_config: Any) -> _Endpoint:
        if not isinstance(client_config, Mapping):
            raise _CallError("could not get REST client: clientConfig is missing")
        url, service = client_config.get("url"), client_config.get("service")
        if isinstance(url, str) and url:
            if not url.startswith("https://"):
                raise _CallError(f"could not get REST client: webhook URL {url!r} must use the https scheme")
            return _Endpoint(url, None, None)
        if not isinstance(service, Mapping):
            raise _CallError("could not get REST client: clientConfig needs a url or a service")
        namespace, svc_name = str(service.get("namespace", "")), str(service.get("name", ""))
        port = service.get("port") or 443
        path = str(service.get("path") or "/")
        if not isinstance(port, int) or not path.startswith("/"):
            raise _CallError(f"could not get REST client: invalid service reference {dict(service)!r}")
        if self._service_resolver is None:
            raise _CallError(
                f"could not get REST client: no resolver for service {namespace}/{svc_name}:{port} "
                "(the stand-in has no cluster DNS)"
            )
        try:
            base = self._service_resolver(namespace, svc_name, port)
        except Exception as err:
            raise _CallError(
                f"could not get REST client: resolving service {namespace}/{svc_name}: {err}"
            ) from err
        host = f"{svc_name}.{namespace}.svc"
        return _Endpoint(base.rstrip("/") + path, host, f"{host}:{port}")

    def _ssl_context(self, ca_bundle: Any, server_hostname: str | None) -> ssl.SSLContext:
        bundle = ca_bundle if isinstance(ca_bundle, str) else ""
        cached = self._ssl_contexts.get((bundle, server_hostname))
        if cached is not None:
            return cached
        try:
            pem = base64.b64decode(bundle, validate=True).decode("ascii") if bundle else None
            context = ssl.create_default_context(cadata=pem)
        except (binascii.Error, UnicodeDecodeError, ValueError, ssl.SSLError) as err:
            raise _CallError(f"could not get REST client: unable to load root certificates: {err}") from None
        self._ssl_contexts[(bundle, server_hostname)] = context
        return context

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("WebhookDispatcher is bound to the event loop that first used it")
        return self._session

    async def _call(
        self, hook: Mapping[str, Any], attrs: AdmissionAttributes, obj: dict[str, Any] | None
    ) -> dict[str, Any]:
        versions = _string_list(hook.get("admissionReviewVersions"), "admissionReviewVersions")
        version = next((v for v in versions if v in _REVIEW_VERSIONS), None)
        if version is None:
            raise _CallError(
                "could not create admission objects: webhook does not accept known AdmissionReview "
                "versions (v1, v1beta1)"
            )
        client_config = hook.get("clientConfig")
        endpoint = self._endpoint(client_config)
        context = self._ssl_context(
            client_config.get("caBundle") if isinstance(client_config, Mapping) else None,
            endpoint.server_hostname,
        )
        timeout = hook.get("timeoutSeconds")
        timeout = DEFAULT_TIMEOUT_SECONDS if not isinstance(timeout, int) else timeout
        timeout = min(max(timeout, 1), MAX_TIMEOUT_SECONDS)
        uid = str(uuid.uuid4())
        review = {
            "apiVersion": f"admission.k8s.io/{version}",
            "kind": "AdmissionReview",
            "request": _review_request(uid, attrs, obj),
        }
        url = f"{endpoint.url}{'&' if '?' in endpoint.url else '?'}timeout={timeout}s"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if endpoint.host_header:
            headers["Host"] = endpoint.host_header
        try:
            async with self._client().post(
                url,
                data=json.dumps(review).encode(),
                headers=headers,
                ssl=context,
                server_hostname=endpoint.server_hostname,
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as resp:
                body = await resp.read()
                status = resp.status
        except TimeoutError:
            raise _CallError(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
        except (aiohttp.ClientError, OSError) as err:
            raise _CallError(f'failed to call webhook: Post "{url}": {_describe(err)}') from None
        if status != 200:
            excerpt = body[:256].decode("utf-8", "replace")
            raise _CallError(f"failed to call webhook: the server responded with status {status}: {excerpt}")
        try:
            answer = json.loads(body)
        except ValueError as err:
            raise _CallError(f"failed to call webhook: the response is not JSON: {err}") from None
        return _verify_response(answer, uid, version)


def _describe(err: BaseException) -> str:
    """A short, Go-flavoured description of a connection failure."""
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        cause = err.certificate_error
        detail = getattr(cause, "verify_message", None) or str(cause)
        return f"tls: failed to verify certificate: {detail}"
    if isinstance(err, aiohttp.ClientConnectorSSLError):
        return f"tls: {err.os_error}"
    if isinstance(err, aiohttp.ClientConnectorError):
        os_error = err.os_error
        errno = os_error.errno or 0
        detail = os.strerror(errno) if errno > 0 else (os_error.strerror or str(os_error))
        return f"dial tcp {err.host}:{err.port}: {detail.lower()}"
    return str(err) or type(err).__name__


def _review_request(uid: str, attrs: AdmissionAttributes, obj: Mapping[str, Any] | None) -> dict[str, Any]:
    group, version, kind = attrs.kind
    r_group, r_version, resource = attrs.resource
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": r_group, "version": r_version, "resource": resource}
    options: Mapping[str, Any] | None = attrs.options
    if options is None and attrs.operation in _OPTIONS_KIND:
        options = {"kind": _OPTIONS_KIND[attrs.operation], "apiVersion": "meta.k8s.io/v1"}
        if attrs.dry_run:
            options = {**options, "dryRun": ["All"]}
    request: dict[str, Any] = {
        "uid": uid,
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "operation": attrs.operation,
        "userInfo": {"username": attrs.user, "groups": list(attrs.groups)},
        "object": obj,
        "oldObject": attrs.old_obj,
        "dryRun": attrs.dry_run,
        "options": options,
    }
    if attrs.sub_resource:
        request["subResource"] = request["requestSubResource"] = attrs.sub_resource
    if attrs.name:
        request["name"] = attrs.name
    if attrs.namespace:
        request["namespace"] = attrs.namespace
    return request


def _verify_response(answer: Any, uid: str, version: str) -> dict[str, Any]:
    """kube's VerifyAdmissionResponse for a mutating webhook."""

    def invalid(problem: str) -> _CallError:
        return _CallError(f"received invalid webhook response: {problem}")

    response = answer.get("response") if isinstance(answer, Mapping) else None
    if not isinstance(response, Mapping):
        raise invalid("webhook response was absent")
    if version == "v1":
        if response.get("uid") != uid:
            raise invalid(f"expected response.uid={_quote(uid)}, got {_quote(str(response.get('uid', '')))}")
        got = f"{answer.get('apiVersion', '')}, Kind={answer.get('kind', '')}"
        if (answer.get("apiVersion"), answer.get("kind")) != ("admission.k8s.io/v1", "AdmissionReview"):
            raise invalid(
                f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {got}"
            )
    if not isinstance(response.get("allowed"), bool):
        raise invalid(f"response.allowed must be true or false, got {response.get('allowed')!r}")
    patch, patch_type = response.get("patch"), response.get("patchType")
    if patch is not None and not isinstance(patch, str):
        raise invalid("response.patch must be a base64 string")
    if version == "v1":
        if patch and patch_type is None:
            raise invalid("webhook returned response.patch but not response.patchType")
        if not patch and patch_type is not None:
            raise invalid("webhook returned response.patchType but not response.patch")
    elif patch:
        patch_type = "JSONPatch"
    if patch and patch_type != "JSONPatch":
        raise _CallError(f"unsupported patch type {_quote(str(patch_type))}")
    return dict(response)
