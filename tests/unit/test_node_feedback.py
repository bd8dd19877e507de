"""HAMi's priority feedback (`cmd/vGPUmonitor/feedback.go`, `Observe`): the pure function, and the
container monitor's round on synthetic region files written with the encoder."""

from __future__ import annotations

from pathlib import Path

from hami_node.monitor.feedback import FeedbackInput, FieldWrite, observe
from hami_node.monitor.loop import ContainerMonitor
from hami_node.monitor.region import MAX_DEVICES, RegionField, SharedRegion, encode
from hami_node.monitor.regions import RegionScanner, read_region

RK, SW = RegionField.RECENT_KERNEL, RegionField.UTILIZATION_SWITCH


def inp(key: str, uuids: list[str], priority: int, rk: int, sw: int = 1) -> FeedbackInput:
    return FeedbackInput(key, tuple(uuids) + ("",) * (MAX_DEVICES - len(uuids)), priority, rk, sw)


def fields(writes: list[FieldWrite]) -> dict[tuple[str, str], int]:
    return {(w.key, w.field.name): w.value for w in writes}


def test_a_high_priority_task_running_blocks_the_low_priority_one_and_switches_its_core_limit_on() -> None:
    writes = observe([inp("high", ["g0"], 0, 2, sw=1), inp("low", ["g0"], 1, 2, sw=0)])
    assert fields(writes) == {
        ("high", "RECENT_KERNEL"): 1,  # decremented; alone at the top: the limit goes off
        ("high", "UTILIZATION_SWITCH"): 0,
        ("low", "RECENT_KERNEL"): -1,  # blocked
        ("low", "UTILIZATION_SWITCH"): 1,
    }


def test_tasks_on_different_gpus_do_not_affect_each_other() -> None:
    writes = observe([inp("high", ["g0"], 0, 2, sw=0), inp("low", ["g1"], 1, 2, sw=0)])
    assert fields(writes) == {("high", "RECENT_KERNEL"): 1, ("low", "RECENT_KERNEL"): 1}


def test_two_active_tasks_of_one_priority_on_a_gpu_get_their_core_limits_without_blocking() -> None:
    writes = observe([inp("a", ["g0"], 1, 2, sw=0), inp("b", ["g0"], 1, 2, sw=0)])
    assert fields(writes) == {
        ("a", "RECENT_KERNEL"): 1,
        ("a", "UTILIZATION_SWITCH"): 1,
        ("b", "RECENT_KERNEL"): 1,
        ("b", "UTILIZATION_SWITCH"): 1,
    }


def test_a_task_whose_last_kernel_is_old_does_not_count_as_running() -> None:
    # recent_kernel 1 decrements to 0: not active (HAMi counts only what is still > 0).
    writes = observe([inp("high", ["g0"], 0, 1, sw=0), inp("low", ["g0"], 1, 0, sw=0)])
    assert fields(writes) == {("high", "RECENT_KERNEL"): 0}


def test_a_blocked_task_is_released_once_the_high_priority_task_stops() -> None:
    writes = observe([inp("high", ["g0"], 0, 0, sw=0), inp("low", ["g0"], 1, -1, sw=1)])
    assert fields(writes) == {("low", "RECENT_KERNEL"): 0, ("low", "UTILIZATION_SWITCH"): 0}


def test_contention_on_any_of_a_task_s_gpus_blocks_it() -> None:
    # HAMi's TestCheckBlocking_MultiDevice: "two devices, contention on the second".
    writes = observe([inp("high", ["g1"], 0, 2, sw=0), inp("low", ["g0", "g1"], 1, 2, sw=0)])
    assert fields(writes)[("low", "RECENT_KERNEL")] == -1


def test_negative_priorities_are_not_counted() -> None:
    writes = observe([inp("odd", ["g0"], -1, 2, sw=0), inp("low", ["g0"], 1, 2, sw=0)])
    assert ("low", "RECENT_KERNEL") in fields(writes) and fields(writes)[("low", "RECENT_KERNEL")] == 1
    assert ("low", "UTILIZATION_SWITCH") not in fields(writes)


def test_nothing_is_written_when_nothing_changes() -> None:
    assert observe([inp("idle", ["g0"], 1, 0, sw=0)]) == []
    assert observe([]) == []


def write_region(root: Path, name: str, uuid: str, *, priority: int, rk: int, sw: int) -> Path:
    directory = root / name
    directory.mkdir()
    path = directory / "c.cache"
    region = SharedRegion(
        device_num=1,
        uuids=(uuid,) + ("",) * (MAX_DEVICES - 1),
        priority=priority,
        recent_kernel=rk,
        utilization_switch=sw,
    )
    path.write_bytes(encode(region))
    return path


def test_the_monitor_round_writes_the_feedback_into_the_region_files(tmp_path: Path) -> None:
    high = write_region(tmp_path, "uid-h_main", "GPU-a", priority=0, rk=2, sw=1)
    low = write_region(tmp_path, "uid-l_main", "GPU-a", priority=1, rk=2, sw=1)
    other = write_region(tmp_path, "uid-o_main", "GPU-b", priority=1, rk=2, sw=1)
    seen: list[FieldWrite] = []
    monitor = ContainerMonitor(RegionScanner(tmp_path), feedback=True, written=seen.extend)

    monitor.step()
    assert (read_region(high).recent_kernel, read_region(high).utilization_switch) == (1, 0)
    assert (read_region(low).recent_kernel, read_region(low).utilization_switch) == (-1, 1)
    assert (read_region(other).recent_kernel, read_region(other).utilization_switch) == (1, 0)
    assert len(seen) == 5

    # No new kernel from the high-priority task: next round it is idle, and the low one is released.
    monitor.step()
    assert (read_region(high).recent_kernel, read_region(high).utilization_switch) == (0, 0)
    assert (read_region(low).recent_kernel, read_region(low).utilization_switch) == (0, 0)


def test_feedback_off_writes_nothing(tmp_path: Path) -> None:
    path = write_region(tmp_path, "uid-h_main", "GPU-a", priority=0, rk=2, sw=1)
    before = path.read_bytes()
    assert ContainerMonitor(RegionScanner(tmp_path), feedback=False).step() == []
    assert path.read_bytes() == before
