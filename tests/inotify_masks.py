"""The event masks this process's inotify watches ask for, read from /proc (Linux only): what a watch
really gets from the kernel, whatever the library in between says."""

from __future__ import annotations

import os
from pathlib import Path

IN_ACCESS = 0x1
IN_CLOSE_WRITE = 0x8
IN_CLOSE_NOWRITE = 0x10
IN_OPEN = 0x20
READS_AND_CLOSES = IN_ACCESS | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_OPEN
"""What every read or listing of a directory's entries produces."""


def inotify_masks(directory: Path) -> list[int]:
    """The masks of this process's inotify watches on `directory` (by inode), one per watch."""
    inode = os.stat(directory).st_ino
    masks: list[int] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
                lines = info.read().splitlines()
        except OSError:
            continue  # closed meanwhile
        for line in lines:
            if not line.startswith("inotify "):
                continue
            fields = dict(part.split(":", 1) for part in line.split()[1:] if ":" in part)
            if int(fields.get("ino", "0"), 16) == inode:
                masks.append(int(fields["mask"], 16))
    return masks
