"""The ResourceClaimTemplates the webhook keeps for pods it translates to DRA (`dra_translate`): which
exist (a watch of the templates labelled `app.kubernetes.io/managed-by=hami-control`, `TemplateStore`)
and creating the missing ones before a translated pod is admitted (`TemplateKeeper`, through
`hami_kube`).

A template is created once per namespace and ask, then reused by every pod of that ask, so nothing is
made per pod. Creating is the webhook's only call out, and the webhook must answer within its timeout:

- a template the watch shows with the expected spec, or one this process created or verified in the
  last `confirm_ttl_s` (until the watch shows it), costs nothing: the admission answers at once;
- otherwise one POST, all the pod's templates at once, within `DRASettings.template_timeout_s`;
  concurrent admissions that need the same template share one POST; 409 AlreadyExists is success
  once a GET shows the expected spec;
- a template of that name with another spec is never used: someone else's (a user could otherwise
  pre-create `hami-gpu-1x-4000mi-30c` asking for four whole GPUs, and every translated pod of that
  namespace would get them while its quota counted 4000 MiB), or one the API server stripped (no
  consumable capacity: `capacity` and `distinctAttribute` dropped, so every claim would take whole
  GPUs). The pod is denied with what differs.

A namespace deleted and created again loses its templates: the watch's DELETED events clear them, so
the next pod there creates them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hami_api.dra import API_VERSION
from hami_control.dra_translate import GPUClaim, template_difference
from hami_kube.client import JSONDict
from hami_kube.errors import KubeApiError
from hami_kube.reflector import replace_all

log = logging.getLogger(__name__)

TemplateKey = tuple[str, str]
"""(namespace, name)."""

TEMPLATES_PATH = f"/apis/{API_VERSION}/resourceclaimtemplates"
"""Every namespace's ResourceClaimTemplates (the watch)."""


def templates_path(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/resourceclaimtemplates"


class TemplateStore:
    """The specs of the ResourceClaimTemplates hami-control keeps, by (namespace, name). A `WatchSink`
    for the reflector of `TEMPLATES_PATH` (label selector `dra_translate.TEMPLATE_SELECTOR`); single
    event loop. `on_deleted` listeners hear of every template that goes."""

    def __init__(self) -> None:
        self._specs: dict[TemplateKey, Any] = {}
        self._fresh: dict[TemplateKey, Any] = {}
        self.on_deleted: list[Callable[[TemplateKey], None]] = []

    def __len__(self) -> int:
        return len(self._specs)

    def spec(self, key: TemplateKey) -> Any | None:
        return self._specs.get(key)

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> TemplateKey:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    def replace(self, items: Sequence[JSONDict]) -> None:
        replace_all(self, items)

    def begin_replace(self) -> None:
        self._fresh = {}

    def add_page(self, items: Sequence[JSONDict]) -> None:
        for obj in items:
            self._fresh[self._key(obj)] = obj.get("spec")

    def end_replace(self) -> None:
        fresh, self._fresh = self._fresh, {}
        gone = set(self._specs) - set(fresh)
        self._specs = fresh
        for key in gone:
            self._deleted(key)

    def apply(self, kind: str, obj: JSONDict) -> None:
        key = self._key(obj)
        if kind == "DELETED":
            self._specs.pop(key, None)
            self._deleted(key)
        else:
            self._specs[key] = obj.get("spec")

    def _deleted(self, key: TemplateKey) -> None:
        for listener in self.on_deleted:
            listener(key)


class TemplateApi(Protocol):
    """What the keeper calls (`hami_kube.client.KubeApi` is one)."""

    async def request(
        self, method: str, path: str, body: object = None, *, timeout_s: float | None = None
    ) -> JSONDict: ...


class TemplateError(Exception):
    """A template a translated pod needs and cannot have: `code` 403 (one of that name asks something
    else) or 500 (the API server did not create it in time); `message` says which and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TemplateKeeper:
    """Makes sure the templates a translated pod names exist (see the module docstring)."""

    def __init__(
        self,
        api: TemplateApi,
        store: TemplateStore | None,
        *,
        timeout_s: float,
        confirm_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.store = store
        self.timeout_s = timeout_s
        self.confirm_ttl_s = confirm_ttl_s
        self.clock = clock
        self.created = 0
        """Templates this process created (for logs and tests)."""
        self._verified: dict[TemplateKey, float] = {}
        """Created or found with the expected spec, not yet shown by the watch: when that was."""
        self._inflight: dict[TemplateKey, asyncio.Task[None]] = {}
        if store is not None:
            store.on_deleted.append(self._forget)

    def _forget(self, key: TemplateKey) -> None:
        """A template the watch saw go: the next pod that needs it creates it again."""
        self._verified.pop(key, None)

    def missing(self, namespace: str, claims: Sequence[GPUClaim]) -> list[GPUClaim]:
        """The claims whose templates are not known to exist with the expected spec (no call made).
        Raises `TemplateError` for one the watch shows with another spec."""
        now = self.clock()
        out: list[GPUClaim] = []
        for claim in claims:
            key = (namespace, claim.template_name)
            stored = self.store.spec(key) if self.store is not None else None
            if stored is not None:
                self._verified.pop(key, None)
                self._check(key, stored, claim)
                continue
            verified = self._verified.get(key)
            if verified is not None and now - verified < self.confirm_ttl_s:
                continue
            out.append(claim)
        return out

    async def ensure(self, namespace: str, claims: Sequence[GPUClaim]) -> None:
        """Create the missing templates of `claims` in `namespace`, all within `timeout_s`. Raises
        `TemplateError`."""
        missing = self.missing(namespace, claims)
        if not missing:
            return
        tasks = [self._task(namespace, claim) for claim in missing]
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.gather(*(asyncio.shield(t) for t in tasks))
        except TimeoutError:
            names = ", ".join(c.template_name for c in missing)
            raise TemplateError(
                500,
                f"hami-control could not create the ResourceClaimTemplates {names} in namespace {namespace} "
                f"within {self.timeout_s:g} s; try again",
            ) from None

    def _task(self, namespace: str, claim: GPUClaim) -> asyncio.Task[None]:
        key = (namespace, claim.template_name)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._create(key, claim), name=f"template-{namespace}/{key[1]}")
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return task

    def _done(self, key: TemplateKey, task: asyncio.Task[None]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled() and task.exception() is not None:
            log.debug("ResourceClaimTemplate %s/%s: %s", key[0], key[1], task.exception())

    async def _create(self, key: TemplateKey, claim: GPUClaim) -> None:
        namespace, name = key
        path = templates_path(namespace)
        try:
            created = await self.api.request(
                "POST", path, claim.template(namespace), timeout_s=self.timeout_s
            )
            self.created += 1
            log.info("created ResourceClaimTemplate %s/%s", namespace, name)
            stored = created.get("spec")
        except KubeApiError as err:
            if err.status != 409:
                raise TemplateError(
                    500, f"hami-control could not create the ResourceClaimTemplate {namespace}/{name}: {err}"
                ) from None
            try:
                stored = (await self.api.request("GET", f"{path}/{name}", timeout_s=self.timeout_s)).get(
                    "spec"
                )
            except KubeApiError as get_err:
                raise TemplateError(
                    500,
                    f"hami-control could not read the ResourceClaimTemplate {namespace}/{name}: {get_err}",
                ) from None
        self._check(key, stored, claim)
        self._verified[key] = self.clock()

    @staticmethod
    def _check(key: TemplateKey, stored: Any, claim: GPUClaim) -> None:
        difference = template_difference(stored, claim.template_spec())
        if difference is not None:
            namespace, name = key
            remedy = (
                ""
                if difference.dropped
                else f". Delete it (kubectl delete resourceclaimtemplate -n {namespace} {name}) and "
                "hami-control creates it again"
            )
            raise TemplateError(
                403,
                f"the ResourceClaimTemplate {namespace}/{name} that this pod's translation to DRA uses is "
                f"not the one hami-control writes: {difference}{remedy}",
            )

    async def stop(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "TEMPLATES_PATH",
    "TemplateError",
    "TemplateKeeper",
    "TemplateStore",
    "templates_path",
]
