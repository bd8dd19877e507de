"""MPS (CUDA Multi-Process Service) operating mode: where a container finds the MPS control daemon.

HAMi v2.10's `operatingmode: mps` only labels the node's GPUs `mps` in `hami.io/node-nvidia-register`
(pods choose them with `nvidia.com/vgpu-mode`) and gives containers HAMi-core's envs and mounts: its
device plugin's MPS hooks (`plugin/mps.go`) are empty, so nothing connects a container to an MPS server.
hami-node does what NVIDIA's device plugin does for its MPS sharing (`internal/plugin/mps.go`,
`cmd/mps-control-daemon/mps/root.go`) on top of HAMi-core's setup, with the MPS control daemon run
outside hami-node (NVIDIA's `mps-control-daemon`, or anything keeping the same layout under the MPS
root on the host):

- `<root>/<resource>/pipe`: the daemon's pipe directory, mounted at `/mps/<resource>/pipe` in the
  container, which gets `CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe`;
- `<root>/shm`: the daemon's /dev/shm (a tmpfs), mounted at `/dev/shm` in the container;
- `<root>/<resource>/.started`: written by the daemon once it runs and has its limits set, removed when
  it stops. hami-node reads it (at the same path in its own container) before answering Allocate, and
  fails the container's Allocate while it is missing, so no container starts believing it shares a GPU
  through MPS when no MPS server is there.
"""

from __future__ import annotations

import os
import posixpath

CONTAINER_ROOT = "/mps"
"""Where NVIDIA's plugin puts the MPS pipe directory in containers (`mps.ContainerRoot`)."""
CONTAINER_SHM = "/dev/shm"
PIPE_DIRECTORY_ENV = "CUDA_MPS_PIPE_DIRECTORY"


def pipe_dir(root: str, resource: str) -> str:
    """`<root>/<resource>/pipe`: the per-resource pipe directory under an MPS root."""
    return posixpath.join(root, resource, "pipe")


def shm_dir(root: str) -> str:
    """`<root>/shm`: the MPS daemon's /dev/shm on the host (one for every resource)."""
    return posixpath.join(root, "shm")


def started_file(root: str, resource: str) -> str:
    """`<root>/<resource>/.started`: present while the MPS control daemon for `resource` runs."""
    return posixpath.join(root, resource, ".started")


def daemon_started(root: str | None, resource: str) -> bool:
    """Whether the MPS control daemon for `resource` runs (its .started file exists); False without a
    root. The one function here that reads the file system."""
    return root is not None and os.path.exists(started_file(root, resource))


__all__ = [
    "CONTAINER_ROOT",
    "CONTAINER_SHM",
    "PIPE_DIRECTORY_ENV",
    "daemon_started",
    "pipe_dir",
    "shm_dir",
    "started_file",
]
