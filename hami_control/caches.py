"""Everything hami-control watches, wired once: one `hami_kube` reflector per resource (pods, nodes,
ResourceQuotas; list, then watch with bookmarks; resume, relist on 410, backoff), each feeding one store:
pods the pod store (which derives quota usage and tells the extender's GPU cache what each pod holds),
nodes the GPU cache, ResourceQuotas the quota cache. `synced` is set after the first lists; /readyz
waits for it.

With DRA translation on, the ResourceClaimTemplates hami-control keeps (label
`app.kubernetes.io/managed-by=hami-control`) are watched into `dra_templates.TemplateStore` too. That
watch is not part of readiness: until it has listed, the webhook creates the templates a pod needs and
takes 409 AlreadyExists as success, so the device-plugin path never waits for a DRA API (a cluster that
does not serve resource.k8s.io/v1 only fails the pods that would be translated, with the API's error).

The garbage collector is paused while the caches list (the first lists and a leader's relist, for at
most `collector_pause_limit_s`: an API server that does not answer must not keep it off for good, since
failed requests leave cycles behind): a list of 150,000 pods
creates millions of objects that live on, and each of the collector's full passes walks them all (a
fifth of the list's CPU at 3,000 nodes: 2.9 against 2.35 s). The pages and records are not cyclic
(reference counting frees what is dropped: a full collection after the first sync at 3,000 nodes found
no garbage among 290,000 objects, in 0.14 s). With `freeze_when_synced` (hami-control's process) what
the first sync kept is then frozen (`gc.freeze`: out of the collector's reach for good, so that no full
collection over it pauses the loop in the middle of a filter) before the collector runs again, with no
collection first: one would walk all of it once more."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Sequence

from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, DRATranslation
from hami_control.dra_templates import TEMPLATES_PATH, TemplateStore
from hami_control.dra_translate import TEMPLATE_SELECTOR
from hami_control.gpu_sinks import GPUNodeSink
from hami_control.pod_store import PodStore
from hami_control.quota_store import ClusterQuotaView, QuotaCache
from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.reflector import Lister, Reflector

log = logging.getLogger(__name__)


class _CollectorPause:
    """The garbage collector off while any holder pauses it, back on after the last one resumes (if it
    was on when the first paused)."""

    def __init__(self) -> None:
        self.holders = 0
        self.was_enabled = False

    def pause(self) -> None:
        if self.holders == 0:
            self.was_enabled = gc.isenabled()
            gc.disable()
        self.holders += 1

    def resume(self) -> None:
        if self.holders == 0:
            return
        self.holders -= 1
        if self.holders == 0 and self.was_enabled:
            gc.enable()


_COLLECTOR = _CollectorPause()


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
        freeze_when_synced: bool = False,
        collector_pause_limit_s: float = 120.0,
    ) -> None:
        self.config = config
        self.freeze_when_synced = freeze_when_synced
        self.collector_pause_limit_s = collector_pause_limit_s
        self.gpus = ClusterCache(config.requests.names, config.registry.vendors)
        self.pods = PodStore(config, self.gpus)
        self.quotas = QuotaCache(config) if config.quota.enforce else None
        self.quota_view = ClusterQuotaView(self.pods, self.quotas)
        self.gpu_nodes = GPUNodeSink(self.gpus)
        self.reflectors = [
            Reflector(api, "pods", "/api/v1/pods", self.pods, retry=retry, watch_timeout_s=watch_timeout_s),
            Reflector(
                api, "nodes", "/api/v1/nodes", self.gpu_nodes, retry=retry, watch_timeout_s=watch_timeout_s
            ),
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
        self.templates: TemplateStore | None = None
        self.template_reflector: Reflector | None = None
        if config.dra.translation is not DRATranslation.OFF:
            self.templates = TemplateStore()
            self.template_reflector = Reflector(
                api,
                "resourceclaimtemplates",
                TEMPLATES_PATH,
                self.templates,
                retry=retry,
                watch_timeout_s=watch_timeout_s,
                params={"labelSelector": TEMPLATE_SELECTOR},
            )
        self._tasks: list[asyncio.Task[None]] = []
        self._collector_paused = False
        self._collector_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._tasks:
            return
        started = time.monotonic()
        self._pause_collector()
        for reflector in self.reflectors:
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{reflector.name}"))
        if self.template_reflector is not None:
            name = f"watch-{self.template_reflector.name}"
            self._tasks.append(asyncio.create_task(self.template_reflector.run(), name=name))
        self._tasks.append(asyncio.create_task(self._report_synced(started), name="watch-synced"))

    def _pause_collector(self) -> None:
        """Off until the lists are in, or `collector_pause_limit_s` at most (on the running loop)."""
        if not self._collector_paused:
            self._collector_paused = True
            _COLLECTOR.pause()
            loop = asyncio.get_running_loop()
            self._collector_timer = loop.call_later(self.collector_pause_limit_s, self._resume_collector)

    def _resume_collector(self, *, freeze: bool = False) -> None:
        if self._collector_timer is not None:
            self._collector_timer.cancel()
            self._collector_timer = None
        if self._collector_paused:
            self._collector_paused = False
            if freeze:
                gc.freeze()
            _COLLECTOR.resume()

    async def _report_synced(self, started: float) -> None:
        await self.wait_synced()
        if self._collector_paused:
            self._resume_collector(freeze=self.freeze_when_synced)
        elif self.freeze_when_synced:  # the pause ran out before the lists were in
            gc.collect()
            gc.freeze()
        quotas = f", {len(self.quotas)} ResourceQuotas" if self.quotas is not None else ""
        log.info(
            "caches synced in %.0f ms: %d pods, %d GPU nodes%s",
            (time.monotonic() - started) * 1000,
            len(self.pods),
            self.gpus.stats().nodes,
            quotas,
        )

    async def wait_synced(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))

    async def resync(self, names: Sequence[str] = ("pods", "nodes")) -> None:
        """Rebuild the named caches from a fresh list (a new leader does, before it answers): their
        reflectors are restarted without a resourceVersion, and this returns once they have listed."""
        for reflector in self.reflectors:
            if reflector.name not in names:
                continue
            task = next((t for t in self._tasks if t.get_name() == f"watch-{reflector.name}"), None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._tasks.remove(task)
            reflector.resource_version = None
            reflector.synced.clear()
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"watch-{reflector.name}"))
        self._pause_collector()
        try:
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors if r.name in names))
        finally:
            self._resume_collector()

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def readiness(self) -> dict[str, bool]:
        return {r.name: r.synced.is_set() for r in self.reflectors}

    async def stop(self) -> None:
        self._resume_collector()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "ClusterCaches",
]
