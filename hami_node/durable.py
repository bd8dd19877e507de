"""Durable, atomic file writes: the one way hami-py writes a checkpoint or a state file.

`write_atomic(path, data)`: the bytes go to a temporary file in the same directory (hidden,
`.<name>.<random>.tmp`, created 0600 so nobody reads it early, and so that a runtime scanning a CDI
directory for *.json and *.yaml never picks it up), are flushed and fsynced, the file gets its mode, is
renamed over the target, and the directory is fsynced. A reader sees the old bytes or the new ones,
never a part; after a crash or a power cut the file holds one of them (POSIX rename is atomic; without
the file's fsync the rename can reach the disk before the data, leaving an empty or short file, and
without the directory's fsync the rename itself can be lost). Kubelet writes its checkpoints the same way
(k8s.io/kubernetes pkg/kubelet/util/store/filestore.go `writeFile`: a temporary file, Sync, rename), less
the directory's fsync, which this adds. `remove_durably` is the matching removal.

Who writes through it: hami-node's CDI specs and DRA checkpoint (`hami_node.cdi`,
`hami_node.dra.prepare`) and the fake GPU inventory (`hami_node.gpu.inventory`); the local cluster's
kubelet stand-in (device-manager and DRA checkpoints, containers.json), its API server's kubeconfig and
the node host's spec (`hami_sim`). It lives here because hami_node is the lowest package every writer
may import (docs/architecture.md): hami_api is pure (no I/O), hami_kube is the Kubernetes access layer
(the only files it touches are the credentials it reads), and hami_control writes no files (its
certificates go to a Secret); hami_sim imports hami_node.

A reader that finds a file it cannot decode reports the path and what is wrong and does not use it
(each reader says how it recovers: from the API, or as kubelet does).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TMP_SUFFIX = ".tmp"
"""The suffix of the temporary file of a write in progress (`is_temporary`)."""


def temporary_prefix(file_name: str) -> str:
    """The prefix of the temporary files of writes of `file_name`: `.<file_name>.`."""
    return f".{file_name}."


def is_temporary(name: str, file_name: str | None = None) -> bool:
    """Whether `name` is the temporary file of an interrupted write (of `file_name`, when given)."""
    prefix = temporary_prefix(file_name) if file_name is not None else "."
    return name.startswith(prefix) and name.endswith(TMP_SUFFIX)


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so that a rename, creation or removal in it survives a crash. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644) -> Path:
    """Write `data` (str: UTF-8) to `path` atomically and durably (the module's docstring), with
    permissions `mode`; creates the directory if needed. Returns the path. Raises OSError (the
    temporary file is removed then; the old file, if any, is untouched)."""
    target = Path(path)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=temporary_prefix(target.name), suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)
    return target


def remove_durably(path: str | os.PathLike[str]) -> bool:
    """Remove a file and fsync its directory; whether it was there. Raises OSError for what cannot be
    removed."""
    target = Path(path)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    fsync_directory(target.parent)
    return True


__all__ = [
    "TMP_SUFFIX",
    "fsync_directory",
    "is_temporary",
    "remove_durably",
    "temporary_prefix",
    "write_atomic",
]
