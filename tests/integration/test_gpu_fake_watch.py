"""The fake GPU backend with a real inventory file, edited while it runs (watched with watchdog).

Every wait is on a condition with a deadline: `wait_event(timeout)`, or `wait_for_reload`, which the
backend signals when it has read a changed file. Nothing sleeps to synchronise.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hami_node.gpu import (
    BackendConfigError,
    DeviceLost,
    GPUEvent,
    GPUEventKind,
    GPUFailed,
    GPULink,
    GPUNotFound,
    LibraryNotFound,
    NvmlFailed,
    TopologyLevel,
    open_backend,
)
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import (
    FakeEvent,
    Inventory,
    InventoryError,
    LinkGroup,
    NvmlMode,
    generate_inventory,
    load_inventory,
    parse_inventory_text,
    render_inventory,
    write_inventory,
)
from tests.inotify_masks import IN_CLOSE_WRITE, READS_AND_CLOSES, inotify_masks
from tests.waiting import wait_for

DEADLINE = 10.0
Edit = Callable[[Inventory], Inventory]


def with_gpu(inventory: Inventory, index: int, **changes: object) -> Inventory:
    gpus = list(inventory.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(inventory, gpus=tuple(gpus))


def with_events(inventory: Inventory, *events: FakeEvent) -> Inventory:
    return dataclasses.replace(inventory, events=inventory.events + events)


def write_in_place(path: Path, inventory: Inventory) -> None:
    """Truncate and rewrite the same inode, as `echo >` and most editors do."""
    with path.open("w", encoding="utf-8") as out:
        out.write(render_inventory(inventory))


def last_error(backend: FakeBackend) -> str | None:
    """A fresh read of the property (mypy would keep an earlier `is not None` narrowing)."""
    return backend.last_error


WRITERS = {"atomic": write_inventory, "in-place": write_in_place}


class Harness:
    def __init__(self, path: Path, backend: FakeBackend) -> None:
        self.path = path
        self.backend = backend

    def edit(self, change: Edit, how: str = "atomic") -> None:
        """Change the file and wait until the backend has applied it. An in-place write truncates the
        file first: on a loaded machine the truncated file may outlast the settle time and be read (and
        rejected) on its own, so a reload alone does not mean the new content is in force."""
        target = change(load_inventory(self.path))
        WRITERS[how](self.path, target)
        deadline = time.monotonic() + DEADLINE
        while self.backend.inventory != target:
            seen = self.backend.reloads
            if self.backend.inventory == target:
                break
            left = deadline - time.monotonic()
            assert left > 0 and self.backend.wait_for_reload(seen, left), "the edit was not picked up"

    def write_text(self, text: str) -> None:
        before = self.backend.reloads
        self.path.write_text(text)
        assert self.backend.wait_for_reload(before, DEADLINE), "the edit was not picked up"

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.backend.inventory.gpus]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    threads_before = set(threading.enumerate())
    directory = tmp_path / "inventory"
    directory.mkdir()
    path = directory / "gpus.yaml"
    write_inventory(path, generate_inventory(4, seed="node-a"))
    backend = FakeBackend(path)
    backend.init()
    try:
        yield Harness(path, backend)
    finally:
        backend.shutdown()
    leftover = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert not leftover, f"threads left running: {leftover}"


# --- faults through the file -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["atomic", "in-place"])
def test_mark_lost_and_bring_back(harness: Harness, how: str) -> None:
    backend, lost = harness.backend, harness.uuids[1]
    assert all(g.healthy for g in backend.list_gpus())
    harness.edit(lambda inv: with_gpu(inv, 1, lost=True), how)
    assert backend.wait_event(DEADLINE) == GPUEvent(lost, GPUEventKind.DEVICE_LOST)
    assert [g.healthy for g in backend.list_gpus()] == [True, False, True, True]
    with pytest.raises(DeviceLost) as info:
        backend.probe(lost)
    assert info.value.uuid == lost
    with pytest.raises(DeviceLost):
        backend.links([harness.uuids[0], lost])
    backend.probe(harness.uuids[0])

    harness.edit(lambda inv: with_gpu(inv, 1, lost=False), how)
    backend.probe(lost)
    assert all(g.healthy for g in backend.list_gpus())
    assert backend.wait_event(0) is None  # coming back is not an event


@pytest.mark.parametrize("how", ["atomic", "in-place"])
def test_xid_fires_exactly_once(harness: Harness, how: str) -> None:
    backend, target = harness.backend, harness.uuids[2]
    harness.edit(lambda inv: with_events(inv, FakeEvent("x1", GPUEventKind.XID, target, 79)), how)
    assert backend.wait_event(DEADLINE) == GPUEvent(target, GPUEventKind.XID, xid=79)
    # Re-reading a file that still holds x1 (plus another change) does not fire it again ...
    harness.edit(lambda inv: with_gpu(inv, 0, model="NVIDIA H100 80GB HBM3"), how)
    assert backend.list_gpus()[0].model == "NVIDIA H100 80GB HBM3"
    assert backend.wait_event(0) is None
    # ... a new id does, and an event for all GPUs has no uuid.
    harness.edit(lambda inv: with_events(inv, FakeEvent("x2", GPUEventKind.XID, None, 48)), how)
    assert backend.wait_event(DEADLINE) == GPUEvent(None, GPUEventKind.XID, xid=48)
    assert backend.wait_event(0) is None


def test_nvml_fails_entirely_and_comes_back(harness: Harness) -> None:
    backend = harness.backend
    outcome: list[BaseException | GPUEvent | None] = []

    def wait() -> None:
        try:
            outcome.append(backend.wait_event(60))
        except NvmlFailed as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        harness.edit(lambda inv: dataclasses.replace(inv, nvml=NvmlMode.FAILING))
    finally:
        waiter.join(DEADLINE)
    assert not waiter.is_alive(), "a blocked wait_event did not wake up when NVML failed"
    assert len(outcome) == 1 and isinstance(outcome[0], NvmlFailed)
    for call in (backend.list_gpus, lambda: backend.probe(harness.uuids[0]), lambda: backend.wait_event(0)):
        with pytest.raises(NvmlFailed, match="failing"):
            call()

    harness.edit(lambda inv: dataclasses.replace(inv, nvml=NvmlMode.OK))
    assert len(backend.list_gpus()) == 4
    assert backend.wait_event(0) is None


def test_driver_gone_and_reinit_after_failure(harness: Harness) -> None:
    backend = harness.backend
    harness.edit(lambda inv: dataclasses.replace(inv, nvml=NvmlMode.ABSENT), "in-place")
    with pytest.raises(LibraryNotFound, match="no GPU driver on this node"):
        backend.list_gpus()
    # The health loop's path: shutdown, then init with backoff until it works.
    backend.shutdown()
    with pytest.raises(LibraryNotFound):
        backend.init()
    write_inventory(harness.path, dataclasses.replace(load_inventory(harness.path), nvml=NvmlMode.OK))
    backend.init()  # re-reads the file itself: no watcher needed while uninitialised
    assert len(backend.list_gpus()) == 4


def test_bad_edit_is_logged_and_the_old_inventory_kept(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    backend = harness.backend
    before = backend.list_gpus()
    good = harness.path.read_text()
    bad = good.replace("memory: 81920", "memory: 80GB", 3)
    harness.write_text(bad)
    assert backend.last_error is not None
    assert backend.last_error.startswith(f"{harness.path}: gpus[0].memory: expected a positive integer (MiB)")
    assert any("bad edit ignored" in r.getMessage() for r in caplog.records)
    assert backend.list_gpus() == before

    harness.write_text("gpus: [unclosed\n")
    assert backend.last_error is not None and "not valid YAML" in backend.last_error
    assert backend.list_gpus() == before

    harness.write_text(render_inventory(with_gpu(parse_inventory_text(good), 3, memory_mib=40960)))
    assert last_error(backend) is None
    assert backend.list_gpus()[3].memory_mib == 40960


def test_unchanged_content_is_not_a_reload(harness: Harness) -> None:
    backend = harness.backend
    before = backend.reloads
    write_inventory(harness.path, load_inventory(harness.path))  # same bytes, new inode
    harness.edit(lambda inv: with_gpu(inv, 0, numa_node=1), "in-place")
    assert backend.reloads == before + 1


def test_directory_removed_and_recreated(harness: Harness) -> None:
    backend = harness.backend
    inventory = load_inventory(harness.path)
    shutil.rmtree(harness.path.parent)
    assert len(backend.list_gpus()) == 4  # the file is gone: the previous inventory stays
    before = backend.reloads
    harness.path.parent.mkdir()
    write_inventory(harness.path, with_gpu(inventory, 2, lost=True))
    assert backend.wait_for_reload(before, DEADLINE), "the recreated directory is not watched"
    assert backend.wait_event(DEADLINE) == GPUEvent(harness.uuids[2], GPUEventKind.DEVICE_LOST)
    # and the new directory's watch works for later edits
    harness.edit(lambda inv: with_gpu(inv, 2, lost=False), "in-place")
    backend.probe(harness.uuids[2])


def test_configmap_style_symlink_swap(tmp_path: Path) -> None:
    """A ConfigMap volume: gpus.yaml -> ..data/gpus.yaml, and an update swaps the ..data symlink."""
    directory = tmp_path / "config"
    (directory / "..v1").mkdir(parents=True)
    write_inventory(directory / "..v1" / "gpus.yaml", generate_inventory(2, "cm"))
    os.symlink("..v1", directory / "..data")
    os.symlink("..data/gpus.yaml", directory / "gpus.yaml")
    backend = FakeBackend(directory / "gpus.yaml")
    backend.init()
    try:
        before = backend.reloads
        (directory / "..v2").mkdir()
        write_inventory(directory / "..v2" / "gpus.yaml", generate_inventory(3, "cm"))
        os.symlink("..v2", directory / "..data_tmp")
        os.replace(directory / "..data_tmp", directory / "..data")
        assert backend.wait_for_reload(before, DEADLINE)
        assert len(backend.list_gpus()) == 3
    finally:
        backend.shutdown()


# --- start-up ------------------------------------------------------------------------------------


def test_bad_file_stops_start_up_naming_file_entry_and_field(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(render_inventory(generate_inventory(3, "n")).replace("memory: 81920", 'memory: "80GB"'))
    lines = path.read_text().splitlines()
    assert sum('"80GB"' in line for line in lines) == 3
    with pytest.raises(InventoryError) as info:
        open_backend("fake", path)
    assert str(info.value) == f'{path}: gpus[0].memory: expected a positive integer (MiB), got "80GB"'
    with pytest.raises(InventoryError, match="does not exist"):
        FakeBackend(tmp_path / "missing.yaml")


def test_events_in_the_file_at_start_fire_once(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    inventory = generate_inventory(2, "n")
    write_inventory(
        path, with_events(inventory, FakeEvent("boot", GPUEventKind.ECC_DOUBLE_BIT, inventory.gpus[0].uuid))
    )
    backend = open_backend("fake", path)
    backend.init()
    try:
        assert backend.wait_event(0) == GPUEvent(inventory.gpus[0].uuid, GPUEventKind.ECC_DOUBLE_BIT)
        assert backend.wait_event(0) is None
    finally:
        backend.shutdown()


def test_open_backend_rejects_bad_combinations(tmp_path: Path) -> None:
    with pytest.raises(BackendConfigError, match="the fake backend needs an inventory file"):
        open_backend("fake", None)
    with pytest.raises(BackendConfigError, match="only used with the fake backend"):
        open_backend("nvml", tmp_path / "gpus.yaml")
    with pytest.raises(BackendConfigError, match="expected one of nvml, fake, got 'cuda'"):
        open_backend("cuda", None)
    assert type(open_backend("nvml", None)).__name__ == "NvmlBackend"  # built, not initialised


def test_calls_need_init_and_shutdown_is_idempotent(tmp_path: Path) -> None:
    backend = FakeBackend(generate_inventory(1, "n"))
    with pytest.raises(NvmlFailed, match="not initialised"):
        backend.list_gpus()
    backend.shutdown()
    backend.init()
    backend.init()
    assert len(backend.list_gpus()) == 1
    backend.shutdown()
    backend.shutdown()


# --- in-process faults ---------------------------------------------------------------------------


@pytest.fixture
def in_process() -> Iterator[FakeBackend]:
    inventory = generate_inventory(4, "n", numa_nodes=2, nvlink=False)
    inventory = with_gpu(inventory, 3, healthy=False)
    backend = FakeBackend(inventory)
    backend.init()
    try:
        yield backend
    finally:
        backend.shutdown()


def test_inject_xid_wakes_a_waiter(in_process: FakeBackend) -> None:
    uuid = in_process.inventory.gpus[0].uuid
    got: list[GPUEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(in_process.wait_event(60)))
    waiter.start()
    in_process.inject_xid(uuid, 79)
    waiter.join(DEADLINE)
    assert got == [GPUEvent(uuid, GPUEventKind.XID, xid=79)]
    assert str(got[0]) == f"Xid 79 on {uuid}"


def test_set_lost_and_set_failing(in_process: FakeBackend) -> None:
    uuid = in_process.inventory.gpus[1].uuid
    in_process.set_lost(uuid, True)
    in_process.set_lost(uuid, True)  # already lost: no second event
    assert in_process.wait_event(0) == GPUEvent(uuid, GPUEventKind.DEVICE_LOST)
    assert in_process.wait_event(0) is None
    with pytest.raises(DeviceLost):
        in_process.probe(uuid)
    in_process.set_lost(uuid, False)
    in_process.probe(uuid)
    with pytest.raises(GPUNotFound):
        in_process.set_lost("GPU-nope", True)

    in_process.set_failing(True)
    with pytest.raises(NvmlFailed):
        in_process.list_gpus()
    in_process.shutdown()
    with pytest.raises(NvmlFailed):
        in_process.init()
    in_process.set_failing(False)
    in_process.init()
    assert len(in_process.list_gpus()) == 4


def test_unhealthy_gpu_and_links(in_process: FakeBackend) -> None:
    uuids = [g.uuid for g in in_process.inventory.gpus]
    assert [g.healthy for g in in_process.list_gpus()] == [True, True, True, False]
    with pytest.raises(GPUFailed, match="health: false") as info:
        in_process.probe(uuids[3])
    assert type(info.value) is GPUFailed
    links = in_process.links(uuids)
    assert len(links) == 12 and all(a != b for a, b in links)
    assert links[(uuids[0], uuids[1])] == GPULink(TopologyLevel.NUMA_NODE, 0)
    assert links[(uuids[0], uuids[2])] == GPULink(TopologyLevel.SYSTEM, 0)
    assert links[(uuids[2], uuids[3])] == GPULink(TopologyLevel.NUMA_NODE, 0)  # unhealthy still answers
    assert in_process.links(uuids[:1]) == {} and in_process.links([]) == {}
    with pytest.raises(GPUNotFound):
        in_process.links([uuids[0], "GPU-nope"])
    with pytest.raises(GPUNotFound):
        in_process.probe("GPU-nope")
    with pytest.raises(ValueError, match="twice"):
        in_process.links([uuids[0], uuids[0]])


def test_an_edit_of_the_links_applies(harness: Harness) -> None:
    backend, uuids = harness.backend, harness.uuids
    assert backend.links(uuids[:2])[(uuids[0], uuids[1])] == GPULink(TopologyLevel.NUMA_NODE, 12)
    one_sided = LinkGroup((0, 1), nvlinks=4, level=TopologyLevel.SINGLE_SWITCH, reverse_nvlinks=0)
    harness.edit(lambda inv: dataclasses.replace(inv, links=(*inv.links, one_sided)))
    assert backend.links(uuids[:2]) == {
        (uuids[0], uuids[1]): GPULink(TopologyLevel.SINGLE_SWITCH, 4),
        (uuids[1], uuids[0]): GPULink(TopologyLevel.SINGLE_SWITCH, 0),
    }


def test_wait_event_times_out(in_process: FakeBackend) -> None:
    assert in_process.wait_event(0.01) is None
    assert in_process.wait_event(-1) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads inotify watches from /proc")
def test_the_inventory_watches_ask_inotify_for_no_reads_opens_or_closes_of_other_files(
    harness: Harness,
) -> None:
    # Issue 29: every node's inventory directory sits in one parent in the local cluster, which every
    # daemon watched; each open and close of any node's directory then woke them all. The file's own
    # directory still asks for IN_CLOSE_WRITE (a write ends with it), never for opens or reads.
    directory = harness.path.parent
    for watched, allowed in ((directory, IN_CLOSE_WRITE), (directory.parent, 0)):
        masks = wait_for(lambda d=watched: inotify_masks(d), what=f"a watch on {watched}")
        unwanted = [hex(mask) for mask in masks if mask & READS_AND_CLOSES & ~allowed]
        assert not unwanted, (watched, unwanted)
    lost = harness.uuids[1]
    harness.edit(lambda inv: with_gpu(inv, 1, lost=True), "in-place")  # a write is still seen
    assert harness.backend.wait_event(DEADLINE) == GPUEvent(lost, GPUEventKind.DEVICE_LOST)
