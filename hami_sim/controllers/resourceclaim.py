"""kube-controller-manager's ResourceClaim controller, for the local cluster.

What it does, as `pkg/controller/resourceclaim/controller.go` (kubernetes/kubernetes) does:

- **Pods** (`syncPod`): for each `spec.resourceClaims[]` entry with a `resourceClaimTemplateName`, the
  claim is created from the template unless the pod already has one (named in
  `status.resourceClaimStatuses`, owned by the pod) or an orphan exists (a claim controlled by the pod
  with the annotation `resource.kubernetes.io/pod-claim-name: <claim>`, created before a crash). New
  claims take the template's labels, annotations and spec, `generateName: <pod>-<claim>-` (both parts
  shortened proportionally past 57 characters), and an owner reference to the pod with `controller` and
  `blockOwnerDeletion`. The names land in `status.resourceClaimStatuses` (upstream applies the pod's
  status; the local API server has no server-side apply, so this is a merge patch of the whole list).
  A failure is a `FailedResourceClaimCreation` Warning on the pod and a retry with backoff. Pods marked
  for deletion are left alone. A scheduled pod whose claim is allocated but not reserved for it gets
  reserved (`reserveForPod`).
- **Claims** (`syncClaim`): `status.reservedFor` entries of pods that are gone, replaced (other UID) or
  done (Succeeded/Failed, or deleted before being scheduled) are removed; when the last one goes, a claim
  carrying the scheduler's `resource.kubernetes.io/delete-protection` finalizer is deallocated (allocation
  cleared), then the finalizer is removed. A claim being deleted, unreserved, loses the finalizer (and its
  allocation) so that the deletion completes. An unreserved claim generated for a pod that is done or
  replaced is deleted.
- **Garbage collection** of generated claims: kube's garbage collector deletes a claim whose owning pod
  is gone (`ownerReferences`); the local cluster has no garbage collector, so this controller does that
  for claims (after a GET confirms the pod is gone or replaced, as the controller double-checks pods it
  has not seen).

One asyncio task per worker on the caller's loop, fed by two reflectors (pods, claims) through one
queue with client-go's workqueue guarantees (`hami_kube.workqueue`): a key waits at most once and is
never synced by two workers at once (two workers syncing one pod made two claims for it, issue 31).
A third reflector keeps the templates, which upstream reads from its informer's lister
(`templateLister`): a claim costs no read of its template. A template the watch has not delivered yet
(the webhook creates one just before the pod that needs it, on another watch) is read from the API
server instead, so that this race is no failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi, PatchType
from hami_kube.errors import KubeApiError
from hami_kube.events import EventRecorder, EventSource
from hami_kube.reflector import ListSink, Reflector
from hami_kube.workqueue import WorkQueue
from hami_sim.controllers import WORKERS

log = logging.getLogger(__name__)

JSON = dict[str, Any]

FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
GROUP_PATH = "/apis/resource.k8s.io/v1"
MAX_GENERATE_BASE = 57
"""Leaves room for a hyphen and five random characters in a 63-character name (controller.go)."""

RETRY = RetryPolicy(initial=0.005, maximum=60.0, factor=2.0, jitter=0.0)
"""The workqueue's default per-item exponential backoff: 5 ms doubling up to 1000 s (here capped at
60 s so a local run recovers quickly)."""


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def is_pod_done(pod: Mapping[str, Any]) -> bool:
    """controller.go isPodDone: no container runs now or ever will."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return True
    return bool(pod["metadata"].get("deletionTimestamp")) and not (pod.get("spec") or {}).get("nodeName")


def owning_pod(claim: Mapping[str, Any]) -> tuple[str, str]:
    """(name, uid) of the pod that controls the claim, or ("", "")."""
    for owner in claim["metadata"].get("ownerReferences") or []:
        if owner.get("controller") and owner.get("apiVersion") == "v1" and owner.get("kind") == "Pod":
            return str(owner.get("name", "")), str(owner.get("uid", ""))
    return "", ""


def generate_name(pod_name: str, claim_name: str) -> str:
    """`<pod>-<claim>-`, both parts cut in proportion when longer than 57 characters (controller.go)."""
    base = f"{pod_name}-{claim_name}-"
    if len(base) <= MAX_GENERATE_BASE:
        return base
    return (
        pod_name[: len(pod_name) * MAX_GENERATE_BASE // len(base)]
        + "-"
        + claim_name[: len(claim_name) * MAX_GENERATE_BASE // len(base)]
    )


def claim_from_template(pod: Mapping[str, Any], pod_claim: str, template: Mapping[str, Any]) -> JSON:
    """The ResourceClaim the controller creates for one pod claim from its template."""
    meta = pod["metadata"]
    tmeta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(tmeta.get("annotations") or {})
    annotations[POD_CLAIM_ANNOTATION] = pod_claim
    claim_meta: JSON = {
        "generateName": generate_name(meta["name"], pod_claim),
        "namespace": meta.get("namespace", "default"),
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "annotations": annotations,
    }
    if tmeta.get("labels"):
        claim_meta["labels"] = dict(tmeta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": (template.get("spec") or {}).get("spec") or {},
    }


def pod_claim_name(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(claim name or None when not created yet, whether the claim must be owned by the pod):
    `resourceclaim.Name` (k8s.io/dynamic-resource-allocation/resourceclaim)."""
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"]), False
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == pod_claim.get("name"):
            name = status.get("resourceClaimName")
            return (str(name) if name else None), True
    return None, True


def is_for_pod(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    return owning_pod(claim)[1] == str(pod["metadata"].get("uid", ""))


class ResourceClaimController:
    """`await start()` (waits for the first lists), `await stop()` at the end."""

    def __init__(self, api: KubeApi, *, workers: int = WORKERS, rng: random.Random | None = None) -> None:
        self.api = api
        self.workers = workers
        self.pods: dict[str, JSON] = {}
        self.claims: dict[str, JSON] = {}
        self.templates: dict[str, JSON] = {}
        self.deleted_pod_uids: set[str] = set()
        self.created = 0
        self.deleted = 0
        self.deallocated = 0
        self._rng = rng or random.Random()
        self._queue: WorkQueue[str] = WorkQueue()
        self._failures: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._events = EventRecorder(api, EventSource("resourceclaim-controller"))
        self._reflectors = [
            Reflector(api, "pods", "/api/v1/pods", ListSink(self._replace_pods, self._on_pod)),
            Reflector(
                api,
                "resourceclaims",
                f"{GROUP_PATH}/resourceclaims",
                ListSink(self._replace_claims, self._on_claim),
            ),
            Reflector(
                api,
                "resourceclaimtemplates",
                f"{GROUP_PATH}/resourceclaimtemplates",
                ListSink(self._replace_templates, self._on_template),
            ),
        ]

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, sync_timeout_s: float = 30.0) -> None:
        self._events.start()
        self._tasks = [asyncio.create_task(r.run(), name=f"reflector-{r.name}") for r in self._reflectors]
        async with asyncio.timeout(sync_timeout_s):
            for reflector in self._reflectors:
                await reflector.synced.wait()
        self._tasks += [
            asyncio.create_task(self._worker(), name=f"resourceclaim-worker-{i}") for i in range(self.workers)
        ]
        log.info("resourceclaim controller started: %d pods, %d claims", len(self.pods), len(self.claims))

    async def stop(self) -> None:
        self._queue.shut_down()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._events.stop()

    # -- informers ------------------------------------------------------------------------------

    def _enqueue(self, key: str) -> None:
        self._queue.add(key)

    def _enqueue_pod_claims(self, pod: Mapping[str, Any], *, owned: bool = False) -> None:
        """The claims the pod's status names; with `owned`, every claim the pod controls as well (what
        kube's garbage collector goes by: a claim created for the pod whose name never reached its
        status, because the pod went first, is otherwise never looked at again)."""
        namespace = pod["metadata"].get("namespace", "")
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            name, _ = pod_claim_name(pod, pod_claim)
            if name:
                self._enqueue(f"claim:{namespace}/{name}")
        if owned:
            uid = str(pod["metadata"].get("uid", ""))
            for key, claim in self.claims.items():
                if owning_pod(claim)[1] == uid:
                    self._enqueue(f"claim:{key}")

    def _replace_pods(self, items: Sequence[JSON]) -> None:
        """A (re)list. The pods it no longer has (deleted, or replaced under their name, while the watch
        was down) are deletions, as client-go's `DeltaFIFO.Replace` delivers them
        (`DeletedFinalStateUnknown`, tools/cache/delta_fifo.go) and the controller's delete handler
        takes them: their claims are synced again, each reservation checked by a GET of its pod (not
        marked deleted: a list may lag behind). Without this a claim reserved for a pod deleted in a
        watch gap stayed reserved for good (a 10,000-pod chaos run, four claims)."""
        old = self.pods
        self.pods = {_key(p): p for p in items}
        for key, pod in old.items():
            now = self.pods.get(key)
            vanished = now is None or now["metadata"].get("uid") != pod["metadata"].get("uid")
            if vanished and (pod.get("spec") or {}).get("resourceClaims"):
                self._enqueue_pod_claims(pod, owned=True)
        for pod in items:
            if (pod.get("spec") or {}).get("resourceClaims"):
                if not is_pod_done(pod):
                    self._enqueue(f"pod:{_key(pod)}")
                self._enqueue_pod_claims(pod)

    def _on_pod(self, kind: str, pod: JSON) -> None:
        key = _key(pod)
        if kind == "DELETED":
            self.pods.pop(key, None)
            self.deleted_pod_uids.add(str(pod["metadata"].get("uid", "")))
        else:
            self.pods[key] = pod
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return
        done = kind == "DELETED" or is_pod_done(pod)
        if not done:
            self._enqueue(f"pod:{key}")
        self._enqueue_pod_claims(pod, owned=done)

    def _replace_claims(self, items: Sequence[JSON]) -> None:
        self.claims = {_key(c): c for c in items}
        for claim in items:
            self._enqueue(f"claim:{_key(claim)}")

    def _on_claim(self, kind: str, claim: JSON) -> None:
        key = _key(claim)
        if kind == "DELETED":
            self.claims.pop(key, None)
            return
        self.claims[key] = claim
        self._enqueue(f"claim:{key}")

    def _replace_templates(self, items: Sequence[JSON]) -> None:
        self.templates = {_key(t): t for t in items}

    def _on_template(self, kind: str, template: JSON) -> None:
        if kind == "DELETED":
            self.templates.pop(_key(template), None)
        else:
            self.templates[_key(template)] = template

    async def _template(self, namespace: str, name: str) -> JSON:
        """From the watch's copy, else read (not delivered yet); KubeApiError (404) when there is none."""
        cached = self.templates.get(f"{namespace}/{name}")
        if cached is not None:
            return cached
        return await self.api.get(f"{GROUP_PATH}/namespaces/{namespace}/resourceclaimtemplates/{name}")

    # -- work -----------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                if key.startswith("pod:"):
                    await self.sync_pod(key[4:])
                else:
                    await self.sync_claim(key[6:])
                self._failures.pop(key, None)
            except KubeApiError as err:
                self._retry_later(key, err)
            except Exception:
                log.exception("resourceclaim controller: syncing %s failed", key)
                self._retry_later(key, None)
            finally:
                self._queue.done(key)

    def _retry_later(self, key: str, err: KubeApiError | None) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = RETRY.delay(failures, self._rng)
        if err is not None:
            log.info("resourceclaim controller: %s: %s (retry in %.2fs)", key, err, delay)
        self._queue.add_after(key, delay)

    async def sync_pod(self, key: str) -> None:
        """Create the pod's missing claims and reserve its allocated claims once it is scheduled; a pod
        that is done needs neither (controller.go `podNeedsClaims`: "pod has terminated"), so its claims,
        deleted when it ended, are not made again and it is never reserved again (kubernetes#141274).
        Creating them again made a loop with `sync_claim`, which deletes the claims of a pod that is
        done: a create, a pod status patch and a delete per finished pod, again at every event or
        relist, until the controller fell minutes behind (issue 31)."""
        pod = self.pods.get(key)
        if pod is None or pod["metadata"].get("deletionTimestamp") or is_pod_done(pod):
            return
        namespace = pod["metadata"].get("namespace", "default")
        new_statuses: dict[str, str] = {}
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            try:
                created = await self._handle_claim(pod, pod_claim)
            except KubeApiError as err:
                self._events.record(
                    namespace,
                    pod["metadata"]["name"],
                    str(pod["metadata"].get("uid", "")),
                    "Warning",
                    "FailedResourceClaimCreation",
                    f"PodResourceClaim {pod_claim.get('name')}: {err}",
                )
                raise
            if created is not None:
                new_statuses[str(pod_claim.get("name"))] = created
        if new_statuses:
            existing = {
                s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
            }
            existing.update(new_statuses)
            statuses = [{"name": n, "resourceClaimName": c} for n, c in existing.items()]
            log.info("pod %s: resourceClaimStatuses %s", key, statuses)
            self.pods[key] = await self.api.patch(
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/status",
                {"status": {"resourceClaimStatuses": statuses}},
                PatchType.MERGE,
            )
        if (pod.get("spec") or {}).get("nodeName"):
            await self._reserve_scheduled(self.pods[key])

    async def _handle_claim(self, pod: JSON, pod_claim: Mapping[str, Any]) -> str | None:
        """The name of a claim created (or found orphaned) for this pod claim, or None."""
        name, must_own = pod_claim_name(pod, pod_claim)
        namespace = pod["metadata"].get("namespace", "default")
        if name:
            existing = self.claims.get(f"{namespace}/{name}")
            if existing is None:
                existing = await self._read_claim(namespace, name)
            if existing is not None and (not must_own or is_for_pod(pod, existing)):
                return None
        template_name = pod_claim.get("resourceClaimTemplateName")
        if not template_name:
            return None
        claim = self._find_orphan(pod, str(pod_claim.get("name")))
        if claim is None:
            template = await self._template(namespace, str(template_name))
            body = claim_from_template(pod, str(pod_claim.get("name")), template)
            claim = await self.api.request(
                "POST", f"{GROUP_PATH}/namespaces/{namespace}/resourceclaims", body
            )
            self.claims[_key(claim)] = claim
            self.created += 1
            log.info(
                "created ResourceClaim %s/%s for pod %s/%s (%s), pod claim %s",
                namespace,
                claim["metadata"]["name"],
                namespace,
                pod["metadata"].get("name"),
                pod["metadata"].get("uid"),
                pod_claim.get("name"),
            )
        return str(claim["metadata"]["name"])

    async def _read_claim(self, namespace: str, name: str) -> JSON | None:
        """The claim a pod's status names but the cache lacks, read from the API server (None: 404).
        kube's handleClaim trusts its lister here and re-creates the claim ("perhaps it was deleted
        accidentally"; pkg/controller/resourceclaim/controller.go). A real lister lags etcd by the watch
        cache's delay; the local API server's stale-list fault repeats a list answer seconds old, after
        which a restarted controller would make a second claim for a pod already bound with the first
        one reserved, and kubelet would refuse the pod for good. One consistent read before a duplicate
        is made keeps that fault from doing what no real cache does. (The duplicate claims the e2e
        chaos run of seed 11 showed had another cause: two workers syncing one pod, see the module
        docstring.)"""
        claim = await self.api.get_if_exists(f"{GROUP_PATH}/namespaces/{namespace}/resourceclaims/{name}")
        if claim is not None:
            self.claims.setdefault(_key(claim), claim)
        return claim

    def _find_orphan(self, pod: Mapping[str, Any], pod_claim: str) -> JSON | None:
        uid = pod["metadata"].get("uid")
        namespace = pod["metadata"].get("namespace", "default")
        for claim in self.claims.values():
            meta = claim["metadata"]
            if meta.get("namespace") != namespace or owning_pod(claim)[1] != uid:
                continue
            if (meta.get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == pod_claim:
                return claim
        return None

    async def _reserve_scheduled(self, pod: JSON) -> None:
        namespace = pod["metadata"].get("namespace", "default")
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            name, _ = pod_claim_name(pod, pod_claim)
            claim = self.claims.get(f"{namespace}/{name}") if name else None
            if claim is None:
                continue
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            if status.get("allocation") and all(r.get("uid") != pod["metadata"]["uid"] for r in reserved):
                ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
                updated = {**claim, "status": {**status, "reservedFor": [*reserved, ref]}}
                self.claims[_key(claim)] = await self._update_status(updated)

    async def _update_status(self, claim: JSON) -> JSON:
        meta = claim["metadata"]
        path = f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status"
        return await self.api.request("PUT", path, claim)

    async def _update(self, claim: JSON) -> JSON:
        meta = claim["metadata"]
        path = f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
        return await self.api.request("PUT", path, claim)

    async def _pod_is_gone(self, namespace: str, name: str, uid: str) -> bool:
        """True when the pod is not in the cache and the API server confirms it is gone or replaced."""
        if uid in self.deleted_pod_uids:
            return True
        cached = self.pods.get(f"{namespace}/{name}")
        if cached is not None:
            return str(cached["metadata"].get("uid", "")) != uid
        pod = await self.api.get_if_exists(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod is None or str(pod["metadata"].get("uid", "")) != uid

    async def _valid_reservations(self, claim: JSON) -> list[JSON]:
        namespace = claim["metadata"]["namespace"]
        valid: list[JSON] = []
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("apiGroup") or ref.get("resource") != "pods":
                raise ValueError(f"unsupported ReservedFor entry: {ref}")
            uid = str(ref.get("uid", ""))
            if await self._pod_is_gone(namespace, str(ref.get("name", "")), uid):
                continue
            pod = self.pods.get(f"{namespace}/{ref.get('name')}")
            if pod is not None and is_pod_done(pod):
                continue
            valid.append(ref)
        return valid

    async def sync_claim(self, key: str) -> None:
        claim = self.claims.get(key)
        if claim is None:
            return
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = await self._valid_reservations(claim)
        finalizers = list(claim["metadata"].get("finalizers") or [])
        if len(valid) < len(reserved):
            log.info(
                "ResourceClaim %s: reservedFor %s -> %s",
                key,
                [r.get("name") for r in reserved],
                [r.get("name") for r in valid],
            )
            new_status = {**status, "reservedFor": valid or None}
            if not valid and FINALIZER in finalizers:
                new_status["allocation"] = None
                self.deallocated += 1
            claim = await self._update_status({**claim, "status": {k: v for k, v in new_status.items() if v}})
            if FINALIZER in (claim["metadata"].get("finalizers") or []) and not claim["status"].get(
                "allocation"
            ):
                claim = await self._drop_finalizer(claim)
        elif FINALIZER in finalizers and claim["metadata"].get("deletionTimestamp") and not valid:
            if status.get("allocation"):
                claim = await self._update_status({**claim, "status": {}})
                self.deallocated += 1
            claim = await self._drop_finalizer(claim)
        if claim is not None:
            self.claims[key] = claim
            if not valid:
                await self._delete_if_unused(claim)

    async def _drop_finalizer(self, claim: JSON) -> JSON | None:
        finalizers = [f for f in claim["metadata"].get("finalizers") or [] if f != FINALIZER]
        updated = await self._update({**claim, "metadata": {**claim["metadata"], "finalizers": finalizers}})
        if claim["metadata"].get("deletionTimestamp") and not finalizers:
            return None  # the API server deleted it with its last finalizer
        return updated

    async def _delete_if_unused(self, claim: JSON) -> None:
        """An unreserved claim generated for a pod that is done, replaced or gone is deleted (the
        controller for done/replaced pods; kube's garbage collector for pods that are gone)."""
        pod_name, pod_uid = owning_pod(claim)
        meta = claim["metadata"]
        if not pod_name or meta.get("deletionTimestamp"):
            return
        pod = self.pods.get(f"{meta['namespace']}/{pod_name}")
        if pod is not None and pod["metadata"].get("uid") == pod_uid and not is_pod_done(pod):
            return
        if pod is None and not await self._pod_is_gone(meta["namespace"], pod_name, pod_uid):
            return
        try:
            await self.api.request(
                "DELETE", f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
            )
        except KubeApiError as err:
            if err.status != 404:
                raise
            return
        self.deleted += 1
