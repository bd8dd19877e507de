"""Removing the directories of containers whose pod is gone from the node, as HAMi's vGPU monitor does.

HAMi's rule (`pkg/monitor/nvidia/cudevshr.go`, `ContainerLister.Update`, run every 5 s by
`watchAndFeedback` in `cmd/vGPUmonitor/feedback.go`): for each directory `<pod uid>_<container>` under
`<hook>/containers`, when the pod UID is not among the pods its informer holds for this node (field
selector `spec.nodeName=<node>`, every phase: a Succeeded or Failed pod that still exists keeps its
directory),
the directory is removed (`os.RemoveAll`, with the log line "Removing dirname ... in monitorpath")
unless its modification time plus `resyncInterval` (5 minutes, `HAMI_RESYNC_INTERVAL`) is still after
now. The delay covers a pod not listed yet: the directory is made at Allocate, before the pod runs. A
name that is not `<uid>_<container>` is skipped.

Ours: the same rule, with the same delay (`STALE_AFTER_S`) and period (the container monitor's round,
5 s), and one more guard on the side of keeping. The pod watch (`ports.PodDirectory`) only proposes:
before removing anything, the cleaner reads the node's pods from the API server once
(`read_node_pods`, `spec.nodeName=<node>`) and keeps every directory whose pod that read shows. So a
watch that has not listed yet (at start; HAMi waits for its informer's first sync instead) or that lags
never costs a running container its directory, which is mounted into it. When the read fails, nothing is
removed in that round. Each removal is logged (path, pod UID, age) and counted (`removed`, the metric
`hami_node_stale_container_dirs_removed_total`).

`stale_dirs` is the rule alone (pure); `StaleDirCleaner.sweep` does the listing, the read and the
removal, with the clock passed in (tests use their own; no sleeping).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from hami_kube.errors import KubeApiError
from hami_node.ports import PodDirectory

log = logging.getLogger(__name__)

STALE_AFTER_S = 300.0
"""HAMi's `resyncInterval` default (5 minutes): how old a gone pod's directory must be to be removed."""


@dataclass(frozen=True, slots=True)
class ContainerDir:
    """One directory under the containers dir: its name and modification time (seconds since the epoch)."""

    name: str
    mtime: float

    @property
    def pod_uid(self) -> str | None:
        """The pod UID of a `<uid>_<container>` name, None for any other name."""
        uid, sep, container = self.name.partition("_")
        return uid if uid and sep and container else None


def stale_dirs(
    dirs: Iterable[ContainerDir], on_node: Callable[[str], bool], now: float, stale_after_s: float
) -> list[ContainerDir]:
    """HAMi's rule: the directories named `<uid>_<container>` whose pod is not `on_node` and whose
    modification time is at least `stale_after_s` before `now`, by name."""
    out = []
    for entry in dirs:
        uid = entry.pod_uid
        if uid is None or on_node(uid):
            continue
        if entry.mtime + stale_after_s > now:  # HAMi: ModTime().Add(resyncInterval).After(time.Now())
            continue
        out.append(entry)
    return sorted(out, key=lambda e: e.name)


def list_dirs(root: Path) -> list[ContainerDir]:
    """The directories under `root` (none when it does not exist). Raises `OSError` when it cannot be
    listed."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            out.append(ContainerDir(entry.name, entry.stat(follow_symlinks=False).st_mtime))
        except FileNotFoundError:  # removed meanwhile
            continue
    return out


class StaleDirCleaner:
    """Removes the directories of gone pods' containers under `root` (`regions.containers_dir`).

    `pods`: the pod watch (a UID it shows is on the node, nothing more to check); `read_node_pods`: the
    UIDs of every pod on this node, read from the API server now (raises `KubeApiError`); `clock`: seconds
    since the epoch, compared with the directories' modification times; `removed`: told how many
    directories each sweep removed (the metric). Not thread-safe: one caller (the container monitor)."""

    def __init__(
        self,
        root: Path,
        node_name: str,
        pods: PodDirectory,
        read_node_pods: Callable[[], Collection[str]],
        *,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
        removed: Callable[[int], None] | None = None,
    ) -> None:
        if not stale_after_s >= 0:
            raise ValueError(f"stale_after_s: expected seconds >= 0, got {stale_after_s!r}")
        self.root = root
        self.node_name = node_name
        self._pods = pods
        self._read_node_pods = read_node_pods
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._removed = removed
        self._list_error = ""

    def sweep(self) -> list[Path]:
        """One round: remove what HAMi's rule finds stale and the API read confirms gone; returns the
        directories removed."""
        try:
            dirs = list_dirs(self.root)
        except OSError as err:
            why = f"{err.strerror or err}"
            if why != self._list_error:  # once per distinct error, not every 5 s
                log.warning("stale container directories: cannot list %s: %s", self.root, why)
            self._list_error = why
            return []
        self._list_error = ""
        now = self._clock()
        watched = self._pods
        candidates = stale_dirs(dirs, lambda uid: watched.pod_name(uid) is not None, now, self._stale_after_s)
        if not candidates:
            return []
        try:
            present = set(self._read_node_pods())
        except KubeApiError as err:
            log.warning(
                "stale container directories: reading the pods of node %s failed, nothing removed this round "
                "(%d candidate(s)): %s",
                self.node_name,
                len(candidates),
                err,
            )
            return []
        removed = [path for entry in candidates if (path := self._remove(entry, present, now)) is not None]
        if removed and self._removed is not None:
            self._removed(len(removed))
        return removed

    def _remove(self, entry: ContainerDir, present: Collection[str], now: float) -> Path | None:
        uid = entry.pod_uid
        path = self.root / entry.name
        if uid is None or uid in present:
            return None  # the API shows the pod: the watch lags (or has not listed yet); keep it
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("stale container directories: cannot remove %s: %s", path, err.strerror or err)
            return None
        log.info(
            "removed container directory %s: pod %s is not on node %s and the directory was last modified "
            "%.0f s ago (over %.0f s)",
            path,
            uid,
            self.node_name,
            now - entry.mtime,
            self._stale_after_s,
        )
        return path


__all__ = ["STALE_AFTER_S", "ContainerDir", "StaleDirCleaner", "list_dirs", "stale_dirs"]
