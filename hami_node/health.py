"""The health loop: GPU events -> device health, recovery after a quiet period, fencing when NVML fails.

`HealthMonitor` owns the GPU backend's life cycle (`init`/`shutdown`) and runs in its own thread:

- Events (`backend.wait_event`): an Xid critical error marks that GPU unhealthy when
  `config.health_checks` acts on its code (NVIDIA's defaults ignore 13, 31, 43, 45, 68, 109;
  `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS` as NVIDIA means them). DEVICE_LOST and
  MONITORING_FAILED mark the GPU too, whatever the DP_* variables say (those govern Xids only: a lost
  GPU is unusable either way). ECC events are logged only, as NVIDIA's plugin does (an uncorrectable
  ECC error comes with its own Xid). An event without a UUID marks every GPU. `DeviceState` wakes
  ListAndWatch at once, so kubelet hears of it well within 1 s.
- Recovery (NVIDIA's plugin never clears a mark): a faulty GPU is probed (`backend.probe`) every
  `probe_interval_s`; a failed probe or a new acted-on Xid starts its quiet period again. Once it has
  been quiet for `config.health_recovery_seconds` and a last probe answers normally, it is Healthy
  again. `health_recovery_seconds` 0 turns recovery off.
- Fencing: when NVML itself fails (`NvmlFailed`, `LibraryNotFound`, at `init()` or any later call),
  every GPU reads Unhealthy (kubelet has 0 allocatable; the inventory shows every GPU unhealthy). The
  loop shuts the backend down and retries `init()` + `list_gpus()` with exponential backoff
  (`backoff_initial_s` doubling up to `backoff_max_s`) until NVML answers, then lifts the fence.
- Every `relist_interval_s` the GPUs are listed again, which catches a backend that lists a GPU as
  unhealthy without an event, GPUs that appear or vanish, and NVML failing outside the event wait.

The clock is injected (`now`, monotonic seconds): tests drive `step()` with a fake clock and no thread.
The thread waits only in `backend.wait_event(event_wait_s)` and, while fenced, on an Event (so `stop`
and `retry_now` wake it at once).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from hami_node.config import NodeConfig
from hami_node.devices import DeviceState
from hami_node.gpu.backend import (
    GPUBackend,
    GPUBackendError,
    GPUEvent,
    GPUEventKind,
    LibraryNotFound,
    NvmlFailed,
)

log = logging.getLogger(__name__)

DEVICE_LOST_REASON = "GPU lost (fell off the bus or stopped answering)"
MONITORING_FAILED_REASON = "its health events cannot be watched"


def xid_reason(xid: int) -> str:
    return f"Xid {xid}"


class HealthMonitor:
    """Watches the backend and keeps `state` current; see the module docstring.

    `start()` makes the first connection attempt synchronously (so the state is listed, or fenced, when
    it returns) and then runs the loop in a thread; `stop()` ends the thread and shuts the backend down.
    """

    def __init__(
        self,
        backend: GPUBackend,
        state: DeviceState,
        config: NodeConfig,
        *,
        now: Callable[[], float] = time.monotonic,
        event_wait_s: float = 0.5,
        probe_interval_s: float = 5.0,
        relist_interval_s: float = 30.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        on_xid: Callable[[str, int], None] | None = None,
    ) -> None:
        """`on_xid(uuid, code)` hears of every Xid event, acted on or not (an event for all GPUs once
        per GPU): the metrics count them."""
        if backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError(
                f"backoff must satisfy 0 < initial <= max, got initial={backoff_initial_s}, "
                f"max={backoff_max_s}"
            )
        self._backend = backend
        self._state = state
        self._config = config
        self._now = now
        self._event_wait_s = max(0.0, event_wait_s)
        self._probe_interval_s = probe_interval_s
        self._relist_interval_s = relist_interval_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._on_xid = on_xid
        self._connected = False
        self._backoff_s = backoff_initial_s
        self._retry_at = -math.inf
        self._next_relist = math.inf
        self._probed: dict[str, float] = {}
        self._failures = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # --- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("health monitor already started")
        self._step_guarded()
        self._thread = threading.Thread(target=self._run, name="hami-health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (it wakes within `event_wait_s`) and shut the backend down."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("health loop did not stop within %.1f s", timeout_s)
                return  # never shut the backend down under a running call
        self._backend.shutdown()
        self._connected = False

    def retry_now(self) -> None:
        """While fenced: try NVML again now instead of at the end of the backoff."""
        self._retry_at = -math.inf
        self._wake.set()

    @property
    def connected(self) -> bool:
        """Whether NVML answers (the backend is initialised and the GPUs listed)."""
        return self._connected

    @property
    def failures(self) -> int:
        """Consecutive failed attempts to reach NVML (0 while connected)."""
        return self._failures

    @property
    def retry_at(self) -> float:
        """Clock time of the next attempt to reach NVML while fenced."""
        return self._retry_at

    def _run(self) -> None:
        while not self._stopping.is_set():
            delay = self._step_guarded()
            if delay > 0 and not self._stopping.is_set():
                self._wake.wait(delay)
                self._wake.clear()

    def _step_guarded(self) -> float:
        try:
            return self.step()
        except Exception as err:  # a backend bug must not kill health checking: treat it as NVML failing
            log.exception("health loop: unexpected error")
            self._lose_nvml(f"unexpected error: {err}")
            return self._delay()

    # --- one iteration ------------------------------------------------------------------------------

    def step(self) -> float:
        """One turn of the loop: connect while disconnected, else wait for one event (up to
        `event_wait_s`), handle it, re-list when due and probe faulty GPUs. Returns how long to wait
        before the next turn (0: go on; >0 while fenced, until the next attempt)."""
        if not self._connected:
            return self._connect()
        try:
            event = self._backend.wait_event(self._event_wait_s)
            now = self._now()
            if event is not None:
                self._handle(event, now)
            if now >= self._next_relist:
                self._relist(now)
            self._check_recovery(now)
        except NvmlFailed as err:
            self._lose_nvml(str(err))
            return self._delay()
        return 0.0

    def _delay(self) -> float:
        return max(0.0, self._retry_at - self._now()) if not self._connected else 0.0

    def _connect(self) -> float:
        now = self._now()
        if now < self._retry_at:
            return self._retry_at - now
        try:
            self._backend.init()
            gpus = self._backend.list_gpus()
        except GPUBackendError as err:
            self._backend.shutdown()
            self._failed_attempt(err)
            return self._delay()
        now = self._now()
        self._connected = True  # before the state changes, so whoever sees the change sees this
        self._failures = 0
        self._backoff_s = self._backoff_initial_s
        self._retry_at = -math.inf
        self._next_relist = now + self._relist_interval_s
        self._probed.clear()
        self._state.set_gpus(gpus, now)
        was_fenced = self._state.unfence()
        healthy = sum(1 for g in self._state.gpus() if g.healthy)
        if was_fenced:
            log.warning("NVML answers again: %d GPUs (%d healthy); fence lifted", len(gpus), healthy)
        else:
            log.info("GPU backend ready: %d GPUs (%d healthy)", len(gpus), healthy)
        return 0.0

    def _failed_attempt(self, err: GPUBackendError) -> None:
        reason = str(err)
        self._failures += 1
        delay = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
        self._retry_at = self._now() + delay
        newly = self._state.fence(reason)
        level = logging.WARNING if newly or self._failures == 1 else logging.DEBUG
        if isinstance(err, LibraryNotFound):
            level = logging.ERROR if self._failures == 1 else logging.DEBUG
        log.log(
            level,
            "NVML does not answer (%s): every GPU is fenced (Unhealthy); attempt %d, retrying in %.1f s",
            reason,
            self._failures,
            delay,
        )

    def _lose_nvml(self, reason: str) -> None:
        """NVML failed while connected: fence, release the backend and retry after the first backoff."""
        self._connected = False
        self._backend.shutdown()
        self._failures = 1
        self._backoff_s = min(self._backoff_initial_s * 2, self._backoff_max_s)
        self._retry_at = self._now() + self._backoff_initial_s
        self._state.fence(reason)
        log.warning(
            "NVML failed (%s): every GPU is fenced (Unhealthy); retrying in %.1f s",
            reason,
            self._backoff_initial_s,
        )

    # --- events, re-listing, recovery ----------------------------------------------------------------

    def _handle(self, event: GPUEvent, now: float) -> None:
        if event.kind is GPUEventKind.XID and event.xid is not None and self._on_xid is not None:
            for uuid in [event.uuid] if event.uuid else [g.uuid for g in self._state.gpus()]:
                self._on_xid(uuid, event.xid)
        if event.kind is GPUEventKind.XID:
            if event.xid is None or not self._config.health_checks.acts_on(event.xid):
                log.info("%s: ignored (application error or health checks off for it)", event)
                return
            reason = xid_reason(event.xid)
        elif event.kind is GPUEventKind.DEVICE_LOST:
            reason = DEVICE_LOST_REASON
        elif event.kind is GPUEventKind.MONITORING_FAILED:
            reason = MONITORING_FAILED_REASON
        else:
            log.info("%s: noted (not a health event)", event)
            return
        newly = self._state.mark_unhealthy(event.uuid, reason, now)
        if newly:
            log.warning("%s: GPU(s) %s marked Unhealthy", event, ", ".join(newly))
        else:
            log.info("%s: no healthy GPU affected (already Unhealthy, or not advertised)", event)

    def _relist(self, now: float) -> None:
        self._next_relist = now + self._relist_interval_s
        self._state.set_gpus(self._backend.list_gpus(), now)

    def _check_recovery(self, now: float) -> None:
        recovery = self._config.health_recovery_seconds
        if recovery <= 0:
            return
        for gpu in self._state.gpus():
            if gpu.fault is None or gpu.fault_at is None:
                continue
            quiet_over = now - gpu.fault_at >= recovery
            if not quiet_over and now - self._probed.get(gpu.uuid, -math.inf) < self._probe_interval_s:
                continue
            self._probed[gpu.uuid] = now
            try:
                self._backend.probe(gpu.uuid)
            except NvmlFailed:
                raise
            except GPUBackendError as err:
                self._state.note_fault(gpu.uuid, now)
                log.debug("GPU %s still failing its probe (%s): quiet period starts again", gpu.uuid, err)
                continue
            if quiet_over and self._state.mark_healthy(gpu.uuid):
                self._probed.pop(gpu.uuid, None)
                log.warning(
                    "GPU %s healthy again: quiet and answering for %.1f s (was: %s)",
                    gpu.uuid,
                    now - gpu.fault_at,
                    gpu.fault,
                )


__all__ = ["DEVICE_LOST_REASON", "MONITORING_FAILED_REASON", "HealthMonitor", "xid_reason"]
