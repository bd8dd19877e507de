"""The Node's GPU inventory annotation, `hami.io/node-nvidia-register`, kept current (`NodeReporter`, the
`ports.InventorySink` of the health code).

- Form: HAMi v2.10's JSON array (`hami_api.annotations.encode_node_register`), byte-identical to Go's.
- When: a published change is written within about `coalesce_s` (0.1 s; bursts become one write, well
  inside the 1 s goal), and the Node is re-checked every `check_interval_s` (30 s, HAMi's cadence,
  `--register-interval-seconds`) so an annotation someone wiped or changed is restored.
- How: GET the Node and compare with what it carries now (not with our last write); only when it
  differs, one merge patch of that annotation alone. A steady state costs one GET per interval and no
  writes. Errors (API server down, Node not registered yet) are retried with backoff on this thread;
  nothing here blocks the caller of `publish()` or the plugin.
- `hami.io/node-handshake`: not written. HAMi v2.10's device plugin no longer writes it: its scheduler
  writes `Requesting_<time>` itself and judges the node by its allocatable `nvidia.com/gpu` and by this
  register annotation (reference/hami.md §1). Writing the legacy `Reported <time>` heartbeat would cost
  a Node write every 30 s on every GPU node for nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_node.kube import DEFAULT_RETRY, KubeApiError, RetryPolicy

log = logging.getLogger(__name__)


class NodeAnnotationClient(Protocol):
    """The API calls the reporter makes (`kube.KubeClient` is one). Errors: `KubeApiError`."""

    def get_node(self, name: str) -> Mapping[str, Any]: ...

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]: ...


class NodeReporter:
    """`ports.InventorySink`: `publish()` the inventory on every change; a thread of its own writes it.

    `start()` / `stop()`; `wait_synced()` waits until the Node carries the latest published value."""

    def __init__(
        self,
        client: NodeAnnotationClient,
        node_name: str,
        *,
        check_interval_s: float = 30.0,
        coalesce_s: float = 0.1,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        if check_interval_s <= 0 or coalesce_s < 0:
            raise ValueError(
                f"need check_interval_s > 0 and coalesce_s >= 0, got {check_interval_s}, {coalesce_s}"
            )
        self.client = client
        self.node_name = node_name
        self.check_interval_s = check_interval_s
        self.coalesce_s = coalesce_s
        self._retry = retry
        self._cond = threading.Condition()
        self._desired: str | None = None
        self._generation = 0
        """Bumped by every publish() that changes the value."""
        self._synced_generation = 0
        """The generation the Node is known to carry."""
        self._changed_at = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.checks = 0
        """Completed checks of the Node (with or without a write)."""
        self.writes = 0
        """Patches sent."""

    def publish(self, gpus: Sequence[GPUInfo]) -> None:
        text = ann.encode_node_register(gpus)
        with self._cond:
            if text == self._desired:
                return
            self._desired = text
            self._generation += 1
            self._changed_at = time.monotonic()
            self._cond.notify_all()

    @property
    def desired(self) -> str | None:
        """The annotation value last published (None before the first publish)."""
        with self._cond:
            return self._desired

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="hami-node-reporter", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the node reporter thread did not stop within %.1fs", timeout)

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the Node is known to carry the latest published value; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._desired is None or self._synced_generation != self._generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def wait_checks(self, count: int, timeout: float) -> bool:
        """Wait until at least `count` checks have completed; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.checks < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # -- the thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._retry.backoff()
        next_check = 0.0  # check as soon as there is something to write
        retry_at = 0.0
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    due = next_check
                    if self._synced_generation != self._generation:
                        due = min(due, self._changed_at + self.coalesce_s)
                    due = max(due, retry_at)
                    if self._desired is not None and now >= due:
                        break
                    self._cond.wait(None if self._desired is None else due - now)
                text, generation = self._desired, self._generation
            assert text is not None
            try:
                self._sync(text)
            except KubeApiError as err:
                level = backoff.report_level()
                delay = backoff.next()
                retry_at = time.monotonic() + delay
                log.log(level, "node %s: writing %s failed, retrying in %.1fs: %s",
                        self.node_name, ann.NODE_REGISTER, delay, err)  # fmt: skip
                continue
            except Exception:
                delay = backoff.next()
                retry_at = time.monotonic() + delay
                log.exception("node %s: writing %s failed unexpectedly", self.node_name, ann.NODE_REGISTER)
                continue
            if (failures := backoff.reset()) > 1:
                log.info("node %s: the API server answers again after %d failures", self.node_name, failures)
            retry_at = 0.0
            next_check = time.monotonic() + self.check_interval_s
            with self._cond:
                self.checks += 1
                self._synced_generation = max(self._synced_generation, generation)
                self._cond.notify_all()

    def _sync(self, text: str) -> None:
        node = self.client.get_node(self.node_name)
        meta = node.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        current = annotations.get(ann.NODE_REGISTER) if isinstance(annotations, Mapping) else None
        if current == text:
            return
        self.client.patch_node_annotations(self.node_name, {ann.NODE_REGISTER: text})
        with self._cond:
            self.writes += 1
        if current is None:
            log.info("node %s: wrote %s (%d bytes)", self.node_name, ann.NODE_REGISTER, len(text))
        else:
            log.info("node %s: updated %s", self.node_name, ann.NODE_REGISTER)


__all__ = ["NodeAnnotationClient", "NodeReporter"]
