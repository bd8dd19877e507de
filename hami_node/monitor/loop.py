"""The container monitor's round, every 5 s as HAMi's `watchAndFeedback` (`cmd/vGPUmonitor/feedback.go`):

0. with a cleaner, remove the directories of containers whose pod has been gone from the node for 5
   minutes (`cleanup.StaleDirCleaner`, HAMi's `ContainerLister.Update` in the same loop);
1. with the fake backend's simulator, write the simulated containers' usage and hand each fake GPU's
   sum to the backend (`FakeBackend.set_usage`);
2. with priority feedback on, read every container's region, compute HAMi's feedback
   (`feedback.observe`) and store the changed fields in place (`regions.apply_all`).

One thread; `step()` is one round (tests call it without the thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from hami_node.monitor.cleanup import StaleDirCleaner
from hami_node.monitor.feedback import FeedbackInput, FieldWrite, observe
from hami_node.monitor.regions import RegionScanner, apply_all
from hami_node.monitor.simulate import ContainerSimulator

log = logging.getLogger(__name__)

INTERVAL_S = 5.0
"""HAMi's feedback period (`time.NewTicker(time.Second * 5)`)."""


class ContainerMonitor:
    """See the module docstring. `live(pod_uid)`: whether the pod is on this node (the simulator stops
    writing containers of pods that are gone); `set_usage`: where the simulator's per-GPU sums go;
    `written`: told of each round's feedback writes (metrics); `cleaner`: removes stale container
    directories each round."""

    def __init__(
        self,
        scanner: RegionScanner,
        *,
        feedback: bool,
        simulator: ContainerSimulator | None = None,
        live: Callable[[str], bool] = lambda uid: True,
        set_usage: Callable[[dict[str, tuple[int, int]]], None] | None = None,
        written: Callable[[Sequence[FieldWrite]], None] | None = None,
        interval_s: float = INTERVAL_S,
        cleaner: StaleDirCleaner | None = None,
    ) -> None:
        self._scanner = scanner
        self._feedback = feedback
        self._simulator = simulator
        self._live = live
        self._set_usage = set_usage
        self._written = written
        self._interval_s = interval_s
        self._cleaner = cleaner
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Whether there is anything to do (feedback on, containers to simulate, or directories to clean)."""
        return self._feedback or self._simulator is not None or self._cleaner is not None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("container monitor already started")
        self._thread = threading.Thread(target=self._run, name="hami-container-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except Exception:  # a bad round must not end monitoring
                log.exception("container monitor: round failed")
            self._stopping.wait(self._interval_s)

    def step(self) -> list[FieldWrite]:
        """One round; returns the feedback writes made."""
        if self._cleaner is not None:
            try:
                self._cleaner.sweep()
            except Exception:  # the rest of the round still runs
                log.exception("container monitor: removing stale container directories failed")
        if self._simulator is not None:
            usage = self._simulator.tick(self._live)
            if self._set_usage is not None:
                self._set_usage(usage)
        if not self._feedback:
            return []
        regions = self._scanner.scan()
        writes = observe([FeedbackInput.of(str(c.path), c.region) for c in regions])
        if writes:
            apply_all(writes)
            log.debug("priority feedback: %s", ", ".join(f"{w.key} {w.field.name}={w.value}" for w in writes))
            if self._written is not None:
                self._written(writes)
        return writes


__all__ = ["INTERVAL_S", "ContainerMonitor"]
