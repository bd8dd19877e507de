"""The shared region files on the host: finding them, reading them, writing feedback fields in place.

Where (HAMi's `ContainerLister.Update` / `loadCache`, `pkg/monitor/nvidia/cudevshr.go`): each
directory `<hook>/vgpu/containers/<pod uid>_<container name>/` holds the container's region, the one
file named `*.cache` in it (a directory with several is refused, as HAMi refuses it; one with none is
a container that has not started CUDA yet and is skipped silently).

A file this daemon cannot decode (`region.RegionFormatError`, an unreadable file) is logged once, one
line naming the path, what was found and what is known, and again only when what is found changes; it
yields no values at all.

Reading maps the file read-only and decodes from the mapping (only the header, the UUIDs, the limits
and the `proc_num` live process slots are touched, not all 2 MB). Writing maps it read-write and stores
each int32 field at its offset, after checking the header again, as HAMi's monitor does through its
own mapping.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hami_node.monitor.feedback import FieldWrite
from hami_node.monitor.region import RegionFormatError, SharedRegion, check_header, decode, write_int32

log = logging.getLogger(__name__)

CACHE_SUFFIX = ".cache"


@dataclass(frozen=True, slots=True)
class ContainerRegion:
    """One container's decoded region: `path` its file."""

    pod_uid: str
    container: str
    path: Path
    region: SharedRegion


def containers_dir(vgpu_dir: str | Path) -> Path:
    """`<hook>/vgpu/containers`: where hami-node creates each container's directory at Allocate."""
    return Path(vgpu_dir) / "containers"


def read_region(path: Path) -> SharedRegion:
    """Decode one region file. Raises `RegionFormatError` or `OSError`."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise RegionFormatError("an empty file", "a HAMi-core region")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return decode(data, size)


def apply_writes(path: Path, writes: Iterable[FieldWrite]) -> None:
    """Store `writes` (fields of this one file) in place. Raises `RegionFormatError` (the file changed
    into something unknown since it was read) or `OSError`."""
    todo = list(writes)
    if not todo:
        return
    with open(path, "r+b") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise RegionFormatError("an empty file", "a HAMi-core region")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_WRITE) as data:
            check_header(data, size)
            for write in todo:
                write_int32(data, write.field, write.value)


class RegionScanner:
    """Reads every container's region under `root` (`containers_dir`). Thread-safe: the exporter scrapes
    and the monitor loop scans from their own threads; a bad file is logged once across both."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._problems: dict[Path, str] = {}
        self._seen: set[Path] = set()
        self._scan_lock = threading.Lock()
        """One scan at a time (a scrape and the monitor's round), so each sees whole results."""

    def refused(self) -> int:
        """How many files or directories the last scan could not read."""
        with self._lock:
            return len(self._problems)

    def scan(self) -> list[ContainerRegion]:
        """Every decodable region under the root, by directory name."""
        with self._scan_lock:
            with self._lock:
                self._seen = set()
            found = self._scan()
            with self._lock:  # forget problems of what is gone, so they are logged again if they return
                for path in [p for p in self._problems if p not in self._seen]:
                    del self._problems[path]
            return found

    def _scan(self) -> list[ContainerRegion]:
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as err:
            self._problem(self.root, f"cannot be listed: {err.strerror or err}")
            return []
        found: list[ContainerRegion] = []
        for entry in entries:
            if not entry.is_dir():
                continue
            pod_uid, sep, container = entry.name.partition("_")
            if not (pod_uid and sep and container):
                self._problem(Path(entry.path), "not <pod uid>_<container>: skipped")
                continue
            path = self._cache_file(Path(entry.path))
            if path is None:
                continue
            try:
                region = read_region(path)
            except RegionFormatError as err:
                self._problem(path, f"unknown shared region layout: {err.found}; known: {err.known}")
                continue
            except OSError as err:
                self._problem(path, f"cannot be read: {err.strerror or err}")
                continue
            self._ok(path)
            found.append(ContainerRegion(pod_uid, container, path, region))
        return found

    def _cache_file(self, directory: Path) -> Path | None:
        try:
            names = sorted(
                n for n in os.listdir(directory) if n.endswith(CACHE_SUFFIX) and "libvgpu.so" not in n
            )
        except OSError as err:
            self._problem(directory, f"cannot be listed: {err.strerror or err}")
            return None
        if len(names) > 1:
            self._problem(directory, f"{len(names)} {CACHE_SUFFIX} files ({', '.join(names)}), expected one")
            return None
        return directory / names[0] if names else None

    def _problem(self, path: Path, message: str) -> None:
        with self._lock:
            self._seen.add(path)
            if self._problems.get(path) == message:
                return
            self._problems[path] = message
        log.warning("HAMi-core region %s: %s; no values read from it", path, message)

    def _ok(self, path: Path) -> None:
        with self._lock:
            if self._problems.pop(path, None) is not None:
                log.info("HAMi-core region %s: readable again", path)


def apply_all(writes: Sequence[FieldWrite]) -> int:
    """Apply feedback writes grouped by file (`FieldWrite.key` is the path); failures are logged.
    Returns how many files were written."""
    by_path: dict[str, list[FieldWrite]] = {}
    for write in writes:
        by_path.setdefault(write.key, []).append(write)
    done = 0
    for key, group in by_path.items():
        try:
            apply_writes(Path(key), group)
        except (RegionFormatError, OSError) as err:
            log.warning("priority feedback: cannot write %s: %s", key, err)
            continue
        done += 1
    return done


__all__ = [
    "CACHE_SUFFIX",
    "ContainerRegion",
    "RegionScanner",
    "apply_all",
    "apply_writes",
    "containers_dir",
    "read_region",
]
