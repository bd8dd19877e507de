"""The stale container directory cleaner against the local API server, wired as the daemon wires it
(`hami_node.main`): the pod watch feeding the tracker proposes, the daemon's read of the node's pods
(`_node_pod_uids`, a real LIST through `NodeApi`) confirms. Directories are real, their modification
times set with `os.utime`, the clock passed in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hami_kube.backoff import RetryPolicy
from hami_node.kubeapi import NodeApi, watch_node_pods
from hami_node.main import _node_pod_uids
from hami_node.monitor.cleanup import StaleDirCleaner
from hami_node.pods import PodTracker
from tests.apiserver_util import bind
from tests.builders import pod
from tests.waiting import wait_for

NODE = "n1"
NOW = 1_800_000_000.0


@pytest.fixture
def kube(apiserver: Any) -> Iterator[NodeApi]:
    api = NodeApi.connect(apiserver.kubeconfig)
    yield api
    api.close()


def _uid(core_v1: Any, name: str) -> str:
    return str(core_v1.read_namespaced_pod(name, "default").metadata.uid)


def _dir(root: Path, uid: str, age_s: float) -> Path:
    path = root / f"{uid}_main"
    path.mkdir(parents=True)
    (path / "region.cache").write_bytes(b"\0" * 64)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def test_the_dirs_of_pods_gone_from_the_node_go_and_those_of_its_pods_stay(
    kube: NodeApi, core_v1: Any, tmp_path: Path
) -> None:
    for name, node_name in (("running", NODE), ("finished", NODE), ("deleted", NODE), ("moved", "n2")):
        core_v1.create_namespaced_pod("default", pod(name))
        bind(core_v1, "default", name, node_name)
    uids = {name: _uid(core_v1, name) for name in ("running", "finished", "deleted", "moved")}
    core_v1.patch_namespaced_pod_status("finished", "default", {"status": {"phase": "Succeeded"}})
    core_v1.delete_namespaced_pod("deleted", "default", grace_period_seconds=0)
    tracker = PodTracker(NODE, kube, retry=RetryPolicy(initial=0.05, maximum=0.3))
    watch = watch_node_pods(kube.bridge, NODE, tracker, retry=RetryPolicy(initial=0.05, maximum=0.3))
    watch.start()
    try:
        assert watch.wait_synced(10)
        wait_for(lambda: tracker.pod_name(uids["running"]) is not None, what="the watch to list the pods")
        root = tmp_path / "containers"
        dirs = {name: _dir(root, uid, 3600) for name, uid in uids.items()}
        young = _dir(root, "not-listed-yet", 30)  # a pod just allocated: too young to judge
        removed: list[int] = []
        cleaner = StaleDirCleaner(
            root,
            NODE,
            tracker,
            partial(_node_pod_uids, kube, NODE),
            clock=lambda: NOW,
            removed=removed.append,
        )
        assert sorted(cleaner.sweep()) == sorted([dirs["deleted"], dirs["moved"]])
        assert dirs["running"].is_dir() and dirs["finished"].is_dir() and young.is_dir()
        assert removed == [2]
        assert cleaner.sweep() == []  # nothing left to remove
    finally:
        watch.stop()
