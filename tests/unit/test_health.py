"""hami_node.health: Xid events -> Unhealthy (NVIDIA's ignored Xids and DP_* variables), recovery after
a quiet period, fencing when NVML fails and recovery from it, all driven step by step with the
in-process fake backend and a fake clock (no thread, no sleeps); one test runs the real thread."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from hami_node.config import FilterDevices, NodeConfig, load_config
from hami_node.devices import REPORTED_UNHEALTHY, DeviceState
from hami_node.gpu import GPUEvent, GPUEventKind, GPUFailed, NvmlFailed, PhysicalGPU
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import Inventory, NvmlMode, generate_inventory, write_inventory
from hami_node.health import DEVICE_LOST_REASON, MONITORING_FAILED_REASON, HealthMonitor

TIMEOUT = 5.0
INVENTORY = generate_inventory(4, seed="node-a")
A, B, C, D = (g.uuid for g in INVENTORY.gpus)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def config(env: Mapping[str, str] | None = None) -> NodeConfig:
    """A config through the real loader, so DP_* variables are parsed as in production."""
    return load_config([], {"NODE_NAME": "node-a", **(env or {})}, lambda p: "")


class Rig:
    """A fake backend, the device state and a monitor stepped by hand on a fake clock."""

    def __init__(
        self, backend: FakeBackend | None = None, cfg: NodeConfig | None = None, **monitor: float
    ) -> None:
        self.backend = backend or FakeBackend(INVENTORY)
        self.config = cfg or config()
        self.state = DeviceState(self.config)
        self.clock = Clock()
        self.monitor = HealthMonitor(
            self.backend,
            self.state,
            self.config,
            now=self.clock,
            event_wait_s=0.0,
            probe_interval_s=monitor.get("probe_interval_s", 5.0),
            relist_interval_s=monitor.get("relist_interval_s", 30.0),
        )

    def step(self, advance: float = 0.0) -> float:
        self.clock.advance(advance)
        return self.monitor.step()

    def health(self) -> dict[str, str | None]:
        return {g.uuid: g.reason for g in self.state.gpus()}

    def unhealthy(self) -> set[str]:
        return {g.uuid for g in self.state.gpus() if not g.healthy}


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    assert r.step() == 0.0  # connects: init + list
    yield r
    r.monitor.stop()


# --- connecting --------------------------------------------------------------------------------------


def test_first_step_lists_the_gpus(rig: Rig) -> None:
    assert rig.monitor.connected
    assert rig.state.listed
    assert rig.health() == {A: None, B: None, C: None, D: None}
    assert rig.state.fenced is None


# --- Xid events -------------------------------------------------------------------------------------


def test_critical_xid_marks_that_gpu_unhealthy(rig: Rig) -> None:
    version = rig.state.version
    rig.backend.inject_xid(B, 79)
    rig.step()
    assert rig.health() == {A: None, B: "Xid 79", C: None, D: None}
    assert rig.state.version == version + 1
    devices = rig.state.virtual_devices()
    assert [d.id for d in devices if not d.healthy] == [f"{B}-{i}" for i in range(10)]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored_by_default(rig: Rig, xid: int) -> None:
    rig.backend.inject_xid(A, xid)
    rig.step()
    assert rig.unhealthy() == set()


def test_xid_without_a_gpu_marks_every_gpu(rig: Rig) -> None:
    rig.backend.inject_xid(None, 48)
    rig.step()
    assert rig.health() == {A: "Xid 48", B: "Xid 48", C: "Xid 48", D: "Xid 48"}


def test_device_lost_and_monitoring_failed_mark_the_gpu_ecc_does_not(rig: Rig) -> None:
    rig.backend.set_lost(A, True)
    rig.backend.inject_event(GPUEvent(B, GPUEventKind.MONITORING_FAILED))
    rig.backend.inject_event(GPUEvent(C, GPUEventKind.ECC_DOUBLE_BIT))
    rig.backend.inject_event(GPUEvent(D, GPUEventKind.ECC_SINGLE_BIT))
    for _ in range(4):
        rig.step()
    assert rig.health() == {A: DEVICE_LOST_REASON, B: MONITORING_FAILED_REASON, C: None, D: None}


def test_events_for_gpus_not_advertised_are_ignored() -> None:
    cfg = dataclasses.replace(config(), filter_devices=FilterDevices(uuids=(A,)))
    r = Rig(cfg=cfg)
    r.step()
    r.backend.inject_xid(A, 79)
    r.step()
    assert set(r.health()) == {B, C, D}
    assert r.unhealthy() == set()
    r.monitor.stop()


@pytest.mark.parametrize(
    ("env", "xid", "acted"),
    [
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, 79, False),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, 48, False),
        ({"DP_DISABLE_HEALTHCHECKS": "48,63"}, 63, False),
        ({"DP_DISABLE_HEALTHCHECKS": "48,63"}, 79, True),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, True),
        ({"DP_ENABLE_HEALTHCHECKS": "13"}, 31, False),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, 31, True),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, 79, True),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, 48, False),
    ],
)
def test_dp_healthcheck_variables(env: dict[str, str], xid: int, acted: bool) -> None:
    r = Rig(cfg=config(env))
    r.step()
    r.backend.inject_xid(A, xid)
    r.step()
    assert r.unhealthy() == ({A} if acted else set())
    r.monitor.stop()


def test_xid_checks_off_still_act_on_a_lost_gpu() -> None:
    r = Rig(cfg=config({"DP_DISABLE_HEALTHCHECKS": "all"}))
    r.step()
    r.backend.set_lost(C, True)
    r.step()
    assert r.health()[C] == DEVICE_LOST_REASON
    r.monitor.stop()


# --- recovery ---------------------------------------------------------------------------------------


def test_a_quiet_gpu_that_answers_returns_to_service(rig: Rig) -> None:
    rig.backend.inject_xid(B, 79)
    rig.step()
    version = rig.state.version
    rig.step(30.0)  # probed, answers, but not quiet long enough
    rig.step(29.9)
    assert rig.unhealthy() == {B}
    rig.step(0.1)  # 60 s quiet (the default), the last probe answers
    assert rig.unhealthy() == set()
    assert rig.state.version == version + 1


def test_a_new_xid_restarts_the_quiet_period(rig: Rig) -> None:
    rig.backend.inject_xid(B, 79)
    rig.step()
    rig.clock.advance(40.0)
    rig.backend.inject_xid(B, 94)
    rig.step()
    rig.step(30.0)  # 70 s after the first, 30 s after the second
    assert rig.health()[B] == "Xid 79"  # the first reason stays
    rig.step(30.0)
    assert rig.unhealthy() == set()


def test_ignored_xids_do_not_restart_the_quiet_period(rig: Rig) -> None:
    rig.backend.inject_xid(B, 79)
    rig.step()
    rig.clock.advance(50.0)
    rig.backend.inject_xid(B, 13)
    rig.step()
    rig.step(10.0)
    assert rig.unhealthy() == set()


def test_a_lost_gpu_recovers_only_once_it_answers_for_the_quiet_period(rig: Rig) -> None:
    rig.backend.set_lost(A, True)
    rig.step()
    for _ in range(20):  # probes fail every 5 s: the quiet period keeps restarting
        rig.step(5.0)
    assert rig.unhealthy() == {A}
    rig.backend.set_lost(A, False)
    rig.step(5.0)  # the first good probe; the last failure was 5 s ago
    rig.step(54.0)
    assert rig.unhealthy() == {A}
    rig.step(6.0)
    assert rig.unhealthy() == set()


def test_recovery_off_when_the_period_is_zero() -> None:
    r = Rig(cfg=config({"HAMI_HEALTH_RECOVERY_SECONDS": "0"}))
    r.step()
    r.backend.inject_xid(A, 79)
    r.step()
    r.step(3600.0)
    assert r.unhealthy() == {A}
    r.monitor.stop()


class ListsUnhealthy(FakeBackend):
    """A backend whose listing says a GPU is unhealthy without any event (and whose probe agrees)."""

    def __init__(self, inventory: Inventory) -> None:
        super().__init__(inventory)
        self.bad: set[str] = set()

    def list_gpus(self) -> list[PhysicalGPU]:
        return [dataclasses.replace(g, healthy=g.uuid not in self.bad) for g in super().list_gpus()]

    def probe(self, uuid: str) -> None:
        super().probe(uuid)
        if uuid in self.bad:
            raise GPUFailed(uuid, f"GPU {uuid} reports an error")


def test_relisting_catches_a_gpu_the_backend_lists_unhealthy() -> None:
    backend = ListsUnhealthy(INVENTORY)
    r = Rig(backend=backend, relist_interval_s=30.0)
    r.step()
    backend.bad.add(D)
    r.step(29.0)
    assert r.unhealthy() == set()
    r.step(1.0)  # relist due
    assert r.health()[D] == REPORTED_UNHEALTHY
    r.step(120.0)  # probe still fails
    assert r.unhealthy() == {D}
    backend.bad.clear()
    r.step(5.0)
    r.step(60.0)
    assert r.unhealthy() == set()
    r.monitor.stop()


# --- fencing ------------------------------------------------------------------------------------------


def test_nvml_failing_fences_every_gpu_and_recovers_with_backoff(rig: Rig) -> None:
    rig.backend.inject_xid(C, 79)
    rig.step()
    rig.backend.set_failing(True)
    delay = rig.step()
    connected = rig.monitor.connected
    assert not connected
    reason = rig.state.fenced
    assert reason is not None and "NVML is failing" in reason
    assert rig.unhealthy() == {A, B, C, D}
    assert all(not d.healthy for d in rig.state.virtual_devices())  # kubelet: 0 allocatable
    assert all(not g.health for g in rig.state.inventory())
    assert delay == pytest.approx(1.0)

    assert rig.step(0.5) == pytest.approx(0.5)  # not due yet: no attempt
    assert rig.monitor.failures == 1
    delays = []
    for _ in range(7):
        delay = rig.step(delay)  # each attempt fails again; the wait doubles up to 30 s
        delays.append(delay)
    assert delays == pytest.approx([2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0])
    assert rig.monitor.failures == 8

    rig.backend.set_failing(False)
    assert rig.step(delay) == 0.0
    assert rig.monitor.connected and rig.monitor.failures == 0
    assert rig.state.fenced is None
    assert rig.health() == {A: None, B: None, C: "Xid 79", D: None}  # its own fault stays


def test_retry_now_skips_the_backoff(rig: Rig) -> None:
    rig.backend.set_failing(True)
    rig.step()
    rig.backend.set_failing(False)
    rig.monitor.retry_now()
    assert rig.step() == 0.0
    assert rig.monitor.connected


def test_no_driver_at_start_fences_then_recovers_when_the_driver_appears(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write_inventory(path, dataclasses.replace(INVENTORY, nvml=NvmlMode.ABSENT))
    backend = FakeBackend(path, watch=False)
    r = Rig(backend=backend)
    try:
        assert r.step() == pytest.approx(1.0)
        assert not r.state.listed
        reason = r.state.fenced
        assert reason is not None and "no GPU driver" in reason
        assert r.state.gpus() == ()
        write_inventory(path, INVENTORY)  # re-read by the next init()
        assert r.step(1.0) == 0.0
        assert r.state.fenced is None
        assert r.health() == {A: None, B: None, C: None, D: None}
    finally:
        r.monitor.stop()


class Broken(FakeBackend):
    """A backend whose event wait raises something unexpected once."""

    def __init__(self, inventory: Inventory) -> None:
        super().__init__(inventory)
        self.raise_once = True

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        if self.raise_once:
            self.raise_once = False
            raise KeyError("bug")
        return super().wait_event(timeout_s)


def holds_within(state: DeviceState, condition: Callable[[], bool], timeout_s: float = TIMEOUT) -> bool:
    """Whether `condition` holds within `timeout_s`, re-checked on every change of `state` (the
    state's own change signal, so no polling: `tests.waiting.wait_for` is for state only a poll
    can read)."""
    deadline = time.monotonic() + timeout_s
    version = state.version
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        version = state.wait_for_change(version, remaining)
    return True


def test_an_unexpected_backend_error_fences_and_the_loop_recovers() -> None:
    backend = Broken(INVENTORY)
    state = DeviceState(config())
    monitor = HealthMonitor(
        backend, state, config(), event_wait_s=0.01, backoff_initial_s=60.0, backoff_max_s=60.0
    )
    monitor.start()
    try:
        assert state.listed
        # The first wait raises; the loop fences, and re-initialises when the backoff is over.
        assert holds_within(state, lambda: state.fenced is not None)
        reason = state.fenced
        assert reason is not None and "unexpected error" in reason
        monitor.retry_now()
        assert holds_within(state, lambda: state.fenced is None)
        assert monitor.connected
    finally:
        monitor.stop()


# --- the thread -------------------------------------------------------------------------------------


def test_the_thread_reacts_to_events_and_nvml_failure_within_a_second() -> None:
    backend = FakeBackend(INVENTORY)
    state = DeviceState(config())
    monitor = HealthMonitor(
        backend, state, config(), event_wait_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.1
    )
    monitor.start()
    try:
        assert state.listed and monitor.connected
        version = state.version
        backend.inject_xid(A, 79)
        version = state.wait_for_change(version, 1.0)
        assert {g.uuid for g in state.gpus() if not g.healthy} == {A}

        backend.set_failing(True)
        version = state.wait_for_change(version, 1.0)
        reason = state.fenced
        assert reason is not None
        backend.set_failing(False)
        state.wait_for_change(version, 1.0)
        assert state.fenced is None
        assert {g.uuid for g in state.gpus() if not g.healthy} == {A}
    finally:
        monitor.stop()
    with pytest.raises(NvmlFailed):  # stop() shut the backend down
        backend.list_gpus()


def test_backoff_must_be_sane() -> None:
    with pytest.raises(ValueError, match="backoff"):
        HealthMonitor(FakeBackend(INVENTORY), DeviceState(config()), config(), backoff_initial_s=0)
    with pytest.raises(ValueError, match="backoff"):
        HealthMonitor(
            FakeBackend(INVENTORY),
            DeviceState(config()),
            config(),
            backoff_initial_s=5,
            backoff_max_s=1,
        )
