#!/usr/bin/env python3
"""Install HAMi-core on the node: the init container of the hami-node DaemonSet runs this (as
`hami-core-install`) before the daemon starts.

It does what HAMi's `vgpu-init.sh` (the postStart hook of HAMi's device plugin) does, with three fixes:

- Files are replaced atomically (a temporary file in the same directory, then rename), never rewritten in
  place: containers that run now keep the library they mapped (HAMi issue #753: `cp` over a running
  `libvgpu.so` crashed them).
- `<hook>/vgpu/libvgpu.so` is the library the image ships under its versioned name
  (`libvgpu.so.<version>`, HAMi's build) when there is one: hami-node always mounts
  `<hook>/vgpu/libvgpu.so`, while HAMi's plugin preferred the versioned file.
- `<hook>/vgpu/ld.so.preload` is written for the hook path in use, not copied (HAMi issues #1713, #2017:
  a copied file always named /usr/local/vgpu).

It also creates `<hook>/vgpu/containers` and the lock directory `/tmp/vgpulock` (mode 1777: HAMi-core in
containers of any user creates its lock files there). Files that are already right are left alone, so a
restart changes nothing. Settings come from the environment: `HOOK_PATH` (default /usr/local, as
hami-node), `HAMI_CORE_SOURCE` (default /k8s-vgpu/lib/nvidia, where the image keeps HAMi-core),
`HAMI_VGPU_LOCK_DIR` (default /tmp/vgpulock). Exit status 1 with one line naming the problem when the
image holds no libvgpu.so or a path cannot be written.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

DEFAULT_SOURCE = "/k8s-vgpu/lib/nvidia"
DEFAULT_HOOK_PATH = "/usr/local"
DEFAULT_LOCK_DIR = "/tmp/vgpulock"
LIBRARY = "libvgpu.so"
PRELOAD = "ld.so.preload"
_VERSIONED = re.compile(r"libvgpu\.so\.(.+)")


class InstallError(Exception):
    """What the user must fix (the message names the path)."""


def _version_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key for `libvgpu.so.<version>` names: numeric parts compare as numbers (v2.10.0 > v2.9.1)."""
    match = _VERSIONED.fullmatch(name)
    version = match.group(1) if match else ""
    parts = re.split(r"[.\-+]", version.lstrip("v"))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def choose_library(source: Path) -> Path:
    """The library to install as `libvgpu.so`: the newest `libvgpu.so.<version>` in `source`, else
    `libvgpu.so`."""
    versioned = sorted(
        (p for p in source.iterdir() if p.is_file() and _VERSIONED.fullmatch(p.name)),
        key=lambda p: _version_key(p.name),
    )
    if versioned:
        return versioned[-1]
    plain = source / LIBRARY
    if plain.is_file():
        return plain
    raise InstallError(f"{source}: no {LIBRARY} or {LIBRARY}.<version> in the image (HAMi-core is missing)")


def install_bytes(data: bytes, dest: Path, mode: int) -> bool:
    """Make `dest` hold `data` with `mode`; atomically, and only if it differs. True when it changed."""
    try:
        if dest.is_file() and dest.read_bytes() == data:
            if dest.stat().st_mode & 0o7777 != mode:
                dest.chmod(mode)
                return True
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise InstallError(f"{dest}: cannot install: {err.strerror or err}") from None
    return True


def install(source: Path, hook_path: str, lock_dir: Path) -> list[str]:
    """Install HAMi-core from `source` into `<hook_path>/vgpu`; returns one line per action."""
    if not source.is_dir():
        raise InstallError(f"{source}: not a directory (HAMi-core is missing from the image)")
    dest = Path(hook_path) / "vgpu"
    library = choose_library(source)
    done: list[str] = []

    def put(data: bytes, target: Path, mode: int, what: str) -> None:
        changed = install_bytes(data, target, mode)
        done.append(f"{'installed' if changed else 'unchanged'}: {target} ({what})")

    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        relative = path.relative_to(source)
        if relative.as_posix() in (LIBRARY, PRELOAD):
            continue  # written below
        put(path.read_bytes(), dest / relative, path.stat().st_mode & 0o777, f"from {path}")
    put(library.read_bytes(), dest / LIBRARY, 0o755, f"from {library}")
    put(f"{dest / LIBRARY}\n".encode(), dest / PRELOAD, 0o644, "preloads libvgpu.so in containers")
    for directory, mode in ((dest / "containers", 0o755), (lock_dir, 0o1777)):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if directory.stat().st_mode & 0o7777 != mode:
                directory.chmod(mode)
        except OSError as err:
            raise InstallError(f"{directory}: cannot create: {err.strerror or err}") from None
        done.append(f"directory: {directory} (mode {mode:o})")
    return done


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    hook_path = env.get("HOOK_PATH") or DEFAULT_HOOK_PATH
    if not hook_path.startswith("/"):
        print(f"hami-core-install: HOOK_PATH must be an absolute path, got {hook_path!r}", file=sys.stderr)
        return 1
    source = Path(env.get("HAMI_CORE_SOURCE") or DEFAULT_SOURCE)
    lock_dir = Path(env.get("HAMI_VGPU_LOCK_DIR") or DEFAULT_LOCK_DIR)
    try:
        lines = install(source, hook_path, lock_dir)
    except InstallError as err:
        print(f"hami-core-install: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
