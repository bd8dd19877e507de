"""The learned task mix's edge: the pod store feeds `frag_mix.MixLearner` the GPU tasks of every pod it
sees for the first time (a listener: O(containers) per new pod, on the watch path, never the request
path), and a task recomputes the mix every `interval_s` against the cluster's most common GPU memory
(read from the GPU cache then, O(GPUs), when some task asks memory in MiB), handing a changed mix to
`on_change` (the extender's `mix`, the metrics) with one info line naming its shapes. The pods come
from the one pods reflector (`caches.ClusterCaches`); nothing here reads the API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hami_control.cache import ClusterCache
from hami_control.frag_mix import MixInUse, MixLearner, most_common_memory
from hami_control.pod_store import PodRecord

log = logging.getLogger(__name__)

MixListener = Callable[[MixInUse], None]


class MixFeed:
    """Observed pods in, the mix in use out (see the module docstring). Single event loop."""

    def __init__(self, learner: MixLearner, cache: ClusterCache, on_change: MixListener) -> None:
        self.learner = learner
        self.cache = cache
        self.on_change = on_change

    def pod_event(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A `PodStore` listener: a pod seen for the first time adds its GPU tasks, or under
        `--fragmentation-filter one` a pod asking no GPU one CPU-only task (later events of the same pod,
        and deletions, add nothing)."""
        if old is None and new is not None:
            if new.asks_gpu:
                self.learner.observe_pod(new.container_requests, new.sidecars, new.cpu_milli)
            elif self.learner.settings.cpu_only:
                self.learner.observe_cpu_only(new.cpu_milli)

    def gpu_memory(self) -> int:
        """The GPU memory (MiB) most of the cluster's registered GPUs have, 0 for none."""
        cache = self.cache
        return most_common_memory(
            gpu.info.devmem
            for name in cache.nodes()
            if (gpus := cache.node_gpus(name)) is not None
            for gpu in gpus.gpus
        )

    def refresh(self, now: float) -> MixInUse | None:
        """Recompute the mix now if it is due (`MixLearner.refresh`); a change goes to `on_change` and the
        log. Returns the new mix in use, if it changed."""
        learner = self.learner
        if learner.seen == 0:
            return None  # nothing observed: the prior stays, no need to read the GPUs
        changed = learner.refresh(now, self.gpu_memory() if learner.needs_memory else 0)
        if changed is not None:
            log.info("fragmentation policies now use the %s", changed.text())
            self.on_change(changed)
        return changed

    async def run(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Refresh every `interval_s` until cancelled."""
        interval = self.learner.settings.interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                self.refresh(clock())
            except Exception:  # a bug here must not end the learning, nor the process
                log.exception("recomputing the fragmentation task mix failed")


__all__ = [
    "MixFeed",
    "MixListener",
]
