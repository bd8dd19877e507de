"""The kubelet stand-in's plugin watcher asks inotify for what kubelet's fsnotify-based watcher gets
(creates, removes, moves), never for opens, reads or closes (issue 29: the stand-in's kubelets share one
process in scale mode, and every listing of a watched directory otherwise woke its watcher)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from hami_sim.kubelet.dra.watcher import PluginWatcher
from tests.inotify_masks import READS_AND_CLOSES, inotify_masks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads inotify watches from /proc")
def test_the_plugin_registry_watch_asks_inotify_for_no_reads_opens_or_closes(tmp_path: Path) -> None:
    registry = tmp_path / "plugins_registry"

    async def register(*_: Any) -> None:
        return None

    async def deregister(*_: Any) -> None:
        return None

    async def go() -> list[int]:
        watcher = PluginWatcher(registry, register, deregister, name="node-a")
        await watcher.start()
        try:
            return inotify_masks(registry)
        finally:
            await watcher.stop()

    masks = asyncio.run(go())
    assert masks, "no inotify watch on the registry directory"
    assert all(mask & READS_AND_CLOSES == 0 for mask in masks), [hex(m) for m in masks]
