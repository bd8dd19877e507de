"""The Node's GPU annotations kept current (`NodeReporter`, the `ports.InventorySink` of the health code):
the inventory, `hami.io/node-nvidia-register`, and the GPU pair scores, `hami.io/node-nvidia-score`.

- Form: HAMi v2.10's JSON array (`hami_api.annotations.encode_node_register`), byte-identical to Go's.
- When: a published change is written within about `coalesce_s` (0.1 s; bursts become one write, well
  inside the 1 s goal), and the Node is re-checked every `check_interval_s` (30 s, HAMi's cadence,
  `--register-interval-seconds`) so an annotation someone wiped or changed is restored.
- How: GET the Node and compare with what it carries now (not with our last write); only when one
  differs, one merge patch of the annotations that differ. A steady state costs one GET per interval
  and no writes. Errors (API server down, Node not registered yet) are retried with backoff on this thread;
  nothing here blocks the caller of `publish()` or the plugin.
- Pair scores (when given a `topology` reader, which `--enable-topology-score` / HAMi's
  `ENABLE_TOPOLOGY_SCORE` turns off): HAMi's per-pair link scores of the published GPUs
  (`hami_node.gpu.topology`), read again at every write and every check, so a link that changes shows
  within one interval. When they cannot be read (NVML failing, a GPU lost), the last value read stays
  and the failure is logged; nothing is written before the first read. Asymmetric pairs (an NVLink
  seen from one side only) score 0, as in HAMi; each new set of them is logged and reported once as a
  Warning Event `AsymmetricGPUP2PLink` on the Node (namespace default, source hami-device-plugin, as
  HAMi's device plugin writes it), handed to the daemon's event recorder (`hami_kube.events`), which
  writes it on its own and never holds up the annotations; a recorder that raises is tried again at
  the next check. With the option off nothing is written and an existing score
  annotation is left as it is (HAMi does the same).
- Fixed annotations (`fixed`): kept as given beside the inventory, written or removed with it (None:
  kept absent): `hami.io/node-pod-identification` says whether this daemon tells the pods kubelet
  admits apart through kubelet's PodResources API (`hami_node.plugin.kubelet_pods`).
- `hami.io/node-handshake`: not written. HAMi v2.10's device plugin no longer writes it: its scheduler
  writes `Requesting_<time>` itself and judges the node by its allocatable `nvidia.com/gpu` and by this
  register annotation (HAMi pkg/scheduler/scheduler.go, node registration). Writing the legacy
  `Reported <time>` heartbeat would cost a Node write every 30 s on every GPU node for nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_kube.backoff import DEFAULT_RETRY, RetryPolicy
from hami_kube.errors import KubeApiError
from hami_node.gpu.backend import GPUBackendError
from hami_node.gpu.topology import AsymmetricPair, TopologyScores

log = logging.getLogger(__name__)

TopologyReader = Callable[[Sequence[str]], TopologyScores]
"""The pair scores of these GPUs (`hami_node.gpu.topology.read_pair_scores` over the backend). Raises
`GPUBackendError` when the links cannot be read."""

ASYMMETRIC_LINK_REASON = "AsymmetricGPUP2PLink"
ASYMMETRIC_LINK_MESSAGE = (
    "One or more GPU pairs on this node have asymmetric P2P link data; affected pairs scored 0 "
    "(possible NVLink hardware or driver issue)"
)
"""HAMi's Event reason and message (register.go); the pairs follow the message."""
EVENT_SOURCE = "hami-device-plugin"
"""The `source.component` of the Event (HAMi's device plugin); it goes to namespace default, as a Node
is not namespaced."""


class NodeAnnotationClient(Protocol):
    """The API calls the reporter makes (`kubeapi.NodeApi` is one). Errors: `KubeApiError`."""

    def get_node(self, name: str) -> Mapping[str, Any]: ...

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Mapping[str, Any]: ...


class NodeEvents(Protocol):
    """Where the Event goes (`hami_kube.blocking.ThreadedEventRecorder` with source `EVENT_SOURCE` is
    one): fire and forget."""

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, kind: str = "Pod"
    ) -> None: ...


class NodeReporter:
    """`ports.InventorySink`: `publish()` the inventory on every change; a thread of its own writes it.

    `start()` / `stop()`; `wait_synced()` waits until the Node carries the latest published value.
    `topology` reads the pair scores (None: `hami.io/node-nvidia-score` is not written); `events`
    records the Event about asymmetric links (None: they are only logged)."""

    def __init__(
        self,
        client: NodeAnnotationClient,
        node_name: str,
        *,
        check_interval_s: float = 30.0,
        coalesce_s: float = 0.1,
        retry: RetryPolicy = DEFAULT_RETRY,
        topology: TopologyReader | None = None,
        events: NodeEvents | None = None,
        fixed: Mapping[str, str | None] | None = None,
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
        self._topology = topology
        self._events = events
        self._fixed = dict(fixed or {})
        """Annotations kept as given with the inventory (None: kept absent), e.g. whether this daemon
        tells pods apart through kubelet's PodResources API (`hami.io/node-pod-identification`)."""
        self._cond = threading.Condition()
        self._desired: str | None = None
        self._uuids: tuple[str, ...] = ()
        self._scores: str | None = None
        """The pair scores last read (kept while they cannot be read)."""
        self._asymmetric: tuple[AsymmetricPair, ...] = ()
        """The asymmetric pairs last read."""
        self._reported: tuple[AsymmetricPair, ...] = ()
        """The asymmetric pairs last reported with an Event."""
        self._logged: tuple[AsymmetricPair, ...] = ()
        """The asymmetric pairs last logged."""
        self._topology_error: str | None = None
        self._event_error: str | None = None
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
        self.events = 0
        """Events handed to the recorder."""

    def publish(self, gpus: Sequence[GPUInfo]) -> None:
        text = ann.encode_node_register(gpus)
        with self._cond:
            if text == self._desired:
                return
            self._desired = text
            self._uuids = tuple(gpu.id for gpu in gpus)
            self._generation += 1
            self._changed_at = time.monotonic()
            self._cond.notify_all()

    @property
    def desired(self) -> str | None:
        """The annotation value last published (None before the first publish)."""
        with self._cond:
            return self._desired

    @property
    def scores(self) -> str | None:
        """The `hami.io/node-nvidia-score` value last read (None: none read yet, or no `topology`)."""
        with self._cond:
            return self._scores

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
                text, generation, uuids = self._desired, self._generation, self._uuids
            assert text is not None
            self._read_scores(uuids)
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

    def _read_scores(self, uuids: Sequence[str]) -> None:
        """Read the pair scores of these GPUs; on failure keep the last ones and log (at warning when
        the reason is new)."""
        if self._topology is None:
            return
        try:
            scores = self._topology(uuids)
        except Exception as err:  # a backend bug must not stop the inventory: log it like a failure
            if not isinstance(err, GPUBackendError):
                log.exception("node %s: reading the GPU links failed unexpectedly", self.node_name)
            reason = str(err)
            level = logging.DEBUG if reason == self._topology_error else logging.WARNING
            self._topology_error = reason
            log.log(level, "node %s: GPU link scores not read (%s); %s", self.node_name, reason,
                    "keeping the last ones" if self._scores is not None else f"{ann.NODE_PAIR_SCORE} "
                    "is written once they can be read")  # fmt: skip
            return
        if self._topology_error is not None:
            log.info("node %s: GPU link scores read again", self.node_name)
            self._topology_error = None
        text = ann.encode_pair_scores(scores.scores)
        with self._cond:
            self._scores = text
            self._asymmetric = scores.asymmetric

    def _sync(self, text: str) -> None:
        node = self.client.get_node(self.node_name)
        meta = node.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        current: Mapping[str, Any] = annotations if isinstance(annotations, Mapping) else {}
        with self._cond:
            wanted: dict[str, str | None] = {**self._fixed, ann.NODE_REGISTER: text}
            if self._scores is not None:
                wanted[ann.NODE_PAIR_SCORE] = self._scores
            asymmetric = self._asymmetric
        changes = {key: value for key, value in wanted.items() if current.get(key) != value}
        if changes:
            self.client.patch_node_annotations(self.node_name, changes)
            with self._cond:
                self.writes += 1
            for key, value in changes.items():
                if value is None:
                    log.info("node %s: removed %s", self.node_name, key)
                    continue
                verb = "wrote" if current.get(key) is None else "updated"
                log.info("node %s: %s %s (%d bytes)", self.node_name, verb, key, len(value))
        if asymmetric != self._reported:
            self._report_asymmetric(meta if isinstance(meta, Mapping) else {}, asymmetric)

    def _report_asymmetric(self, meta: Mapping[str, Any], pairs: tuple[AsymmetricPair, ...]) -> None:
        """Log a new set of asymmetric pairs and raise HAMi's Warning Event on the Node; an Event the
        recorder does not take is tried again at the next check, and never fails the sync."""
        if not pairs:
            log.info("node %s: no asymmetric GPU links any more", self.node_name)
            self._reported = self._logged = pairs
            return
        listed = "; ".join(str(pair) for pair in pairs)
        if self._logged != pairs:
            self._logged = pairs
            log.warning("node %s: asymmetric P2P link data, scored 0 (possible NVLink hardware or driver "
                        "issue): %s", self.node_name, listed)  # fmt: skip
        if self._events is not None:
            uid = str(meta.get("uid") or "")
            message = f"{ASYMMETRIC_LINK_MESSAGE}: {listed}"
            try:
                self._events.record(
                    "", self.node_name, uid, "Warning", ASYMMETRIC_LINK_REASON, message, kind="Node"
                )
            except Exception as err:
                level = logging.DEBUG if str(err) == self._event_error else logging.WARNING
                self._event_error = str(err)
                log.log(level, "node %s: Event %s not recorded (tried again at the next check): %s",
                        self.node_name, ASYMMETRIC_LINK_REASON, err)  # fmt: skip
                return
            with self._cond:
                self.events += 1
        self._reported = pairs
        self._event_error = None


__all__ = [
    "ASYMMETRIC_LINK_MESSAGE",
    "ASYMMETRIC_LINK_REASON",
    "EVENT_SOURCE",
    "NodeAnnotationClient",
    "NodeEvents",
    "NodeReporter",
    "TopologyReader",
]
