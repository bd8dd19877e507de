"""hami-node removes the directories of containers whose pod has been gone for 5 minutes, as HAMi's vGPU
monitor does (`pkg/monitor/nvidia/cudevshr.go`, `ContainerLister.Update`), on real directories under a
temp dir, with the clock passed in and the directories' modification times set (`os.utime`): no sleeping."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_kube.errors import KubeApiError
from hami_node.monitor.cleanup import STALE_AFTER_S, ContainerDir, StaleDirCleaner, stale_dirs
from hami_node.monitor.exporter import NodeMetrics
from hami_node.monitor.loop import ContainerMonitor
from hami_node.monitor.regions import RegionScanner
from hami_node.ports import PodName

NOW = 1_800_000_000.0


class Watch:
    """The pod watch's view (`ports.PodDirectory`): the UIDs it shows on the node."""

    def __init__(self, uids: Collection[str] = ()) -> None:
        self.uids = set(uids)

    def pod_name(self, uid: str) -> PodName | None:
        return PodName("default", f"pod-{uid}", ("main",)) if uid in self.uids else None


class Api:
    """The read of the node's pods: the UIDs the API server shows, or an error; counts the reads."""

    def __init__(self, uids: Collection[str] = (), error: KubeApiError | None = None) -> None:
        self.uids = set(uids)
        self.error = error
        self.reads = 0

    def __call__(self) -> set[str]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return set(self.uids)


def make_dir(root: Path, name: str, age_s: float, *, cache: bool = True) -> Path:
    """A container directory (with a region file, as HAMi-core leaves it) last modified `age_s` before NOW."""
    path = root / name
    path.mkdir(parents=True)
    if cache:
        (path / "0f1e2d3c.cache").write_bytes(b"\0" * 64)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def cleaner(
    root: Path,
    watch: Watch,
    api: Callable[[], Collection[str]],
    *,
    now: Callable[[], float] = lambda: NOW,
    removed: Callable[[int], None] | None = None,
) -> StaleDirCleaner:
    return StaleDirCleaner(root, "node-1", watch, api, clock=now, removed=removed)


def test_the_rule_is_hamis_gone_pod_and_modified_at_least_five_minutes_ago() -> None:
    dirs = [
        ContainerDir("gone-old_main", NOW - STALE_AFTER_S),  # exactly 5 minutes: removed (not After(now))
        ContainerDir("gone-young_main", NOW - STALE_AFTER_S + 1),  # 4:59: kept, its pod may not be listed yet
        ContainerDir("here_main", NOW - 86_400),  # the pod is on the node: kept however old
        ContainerDir("no-container-name_", NOW - 86_400),  # not <uid>_<container>: skipped, as HAMi does
        ContainerDir("nounderscore", NOW - 86_400),
        ContainerDir("_main", NOW - 86_400),
    ]
    stale = stale_dirs(dirs, lambda uid: uid == "here", NOW, STALE_AFTER_S)
    assert [d.name for d in stale] == ["gone-old_main"]
    assert STALE_AFTER_S == 300.0  # HAMi's resyncInterval default


def test_a_gone_pods_directory_is_removed_after_five_minutes_and_not_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    young = make_dir(tmp_path, "u-gone_main", 60)
    clock = [NOW]
    sweeper = cleaner(tmp_path, Watch(), Api(), now=lambda: clock[0])
    assert sweeper.sweep() == []
    assert young.is_dir()
    clock[0] = NOW + STALE_AFTER_S - 61  # 4:59 after its last change
    assert sweeper.sweep() == []
    assert young.is_dir()
    clock[0] = NOW + STALE_AFTER_S - 60  # 5:00
    with caplog.at_level(logging.INFO, logger="hami_node.monitor.cleanup"):
        assert sweeper.sweep() == [young]
    assert not young.exists()
    assert caplog.messages == [
        f"removed container directory {young}: pod u-gone is not on node node-1 and the directory was last "
        "modified 300 s ago (over 300 s)"
    ]


def test_every_container_of_a_gone_pod_goes_and_only_those(tmp_path: Path) -> None:
    gone = [make_dir(tmp_path, f"u-gone_{c}", 3600) for c in ("main", "sidecar")]
    running = make_dir(tmp_path, "u-running_main", 3600)
    finished = make_dir(tmp_path, "u-succeeded_main", 3600)  # a Succeeded pod still exists: kept
    odd = make_dir(tmp_path, "not-a-container", 3600)
    (tmp_path / "u-file_main").write_text("a file, not a directory")
    api = Api({"u-running", "u-succeeded"})
    removed = cleaner(tmp_path, Watch({"u-running", "u-succeeded"}), api).sweep()
    assert removed == gone
    assert [p.name for p in sorted(tmp_path.iterdir())] == [
        "not-a-container",
        "u-file_main",
        "u-running_main",
        "u-succeeded_main",
    ]
    assert running.is_dir() and finished.is_dir() and odd.is_dir()


def test_a_pod_the_watch_does_not_show_but_the_api_does_keeps_its_directory(tmp_path: Path) -> None:
    """The watch has not listed yet (the daemon just started) or lags: the API read before any removal
    keeps the directory of every pod still on the node."""
    running = make_dir(tmp_path, "u-running_main", 86_400)
    gone = make_dir(tmp_path, "u-gone_main", 86_400)
    api = Api({"u-running"})
    assert cleaner(tmp_path, Watch(), api).sweep() == [gone]
    assert running.is_dir()
    assert api.reads == 1  # one read of the node's pods for the whole round


def test_nothing_is_removed_when_the_api_read_fails_and_it_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = make_dir(tmp_path, "u-gone_main", 3600)
    api = Api(error=KubeApiError(503, "ServiceUnavailable", "the server is shutting down"))
    sweeper = cleaner(tmp_path, Watch(), api)
    with caplog.at_level(logging.WARNING, logger="hami_node.monitor.cleanup"):
        assert sweeper.sweep() == []
    assert gone.is_dir()
    assert "pods of node node-1 failed, nothing removed this round (1 candidate(s))" in caplog.text
    api.error = None
    assert sweeper.sweep() == [gone]


def test_no_api_read_while_nothing_is_stale(tmp_path: Path) -> None:
    make_dir(tmp_path, "u-running_main", 86_400)
    make_dir(tmp_path, "u-new_main", 10)  # made at Allocate, its pod not in the watch yet
    api = Api()
    assert cleaner(tmp_path, Watch({"u-running"}), api).sweep() == []
    assert api.reads == 0
    assert cleaner(tmp_path / "absent", Watch(), api).sweep() == []  # no containers dir yet


def test_removals_are_counted_in_the_node_metrics(tmp_path: Path) -> None:
    for i in range(3):
        make_dir(tmp_path, f"u-gone{i}_main", 3600)
    metrics = NodeMetrics("node-1")

    def removed_total() -> float:
        for family in text_string_to_metric_families(metrics.render()[1].decode()):
            for sample in family.samples:
                if sample.name == "hami_node_stale_container_dirs_removed_total":
                    return sample.value
        raise AssertionError("hami_node_stale_container_dirs_removed_total is not exported")

    assert removed_total() == 0
    cleaner(tmp_path, Watch(), Api(), removed=metrics.container_dirs_removed).sweep()
    assert removed_total() == 3


def test_the_container_monitor_cleans_every_round_and_a_failed_cleaning_does_not_end_the_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = make_dir(tmp_path, "u-gone_main", 3600)
    sweeper = cleaner(tmp_path, Watch(), Api())
    monitor = ContainerMonitor(RegionScanner(tmp_path), feedback=False, cleaner=sweeper)
    assert monitor.active  # cleaning alone is a reason to run
    assert monitor.step() == []
    assert not gone.exists()

    def broken() -> set[str]:
        raise RuntimeError("boom")

    make_dir(tmp_path, "u-gone2_main", 3600)
    failing = cleaner(tmp_path, Watch(), broken)
    monitor = ContainerMonitor(RegionScanner(tmp_path), feedback=True, cleaner=failing)
    with caplog.at_level(logging.ERROR, logger="hami_node.monitor.loop"):
        assert monitor.step() == []  # the feedback part still ran (nothing to write)
    assert "removing stale container directories failed" in caplog.text


def test_a_containers_path_that_cannot_be_listed_is_logged_once_and_removes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "containers"
    root.write_text("a file where the directory should be")
    sweeper = cleaner(root, Watch(), Api())
    with caplog.at_level(logging.WARNING, logger="hami_node.monitor.cleanup"):
        assert sweeper.sweep() == []
        assert sweeper.sweep() == []
    assert [r.getMessage() for r in caplog.records] == [
        f"stale container directories: cannot list {root}: Not a directory"
    ]
    assert root.is_file()
