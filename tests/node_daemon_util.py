"""Running `hami-node` as a separate process against the kubelet stand-in and the local API server.

`NodeDaemonProcess` starts `python -m hami_node.main` with its output in a log file (printed when the
process is stopped, so pytest shows it with a failing test), waits for conditions with deadlines, and
stops it with SIGTERM, then SIGKILL after a deadline. `NodeRig` bundles one node: a short socket
directory, a fake GPU inventory file, a hook directory, the kubelet stand-in and the daemon.

The readers below decode what hami-node wrote. Pods come from `tests.builders`, waits from
`tests.waiting`, `create_and_bind` from `tests.apiserver_util`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import FakeEvent, Inventory, NvmlMode, write_inventory
from hami_sim.kubelet import KubeletConfig, KubeletRunner, Snapshot

RESOURCE = "nvidia.com/gpu"
NAMESPACE = "default"
REPO_ROOT = Path(__file__).resolve().parents[1]

_ENV_KEEP = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV", "SYSTEMROOT")
_ENV_KEEP_PREFIXES = ("LC_", "PYTHON")


def daemon_env() -> dict[str, str]:
    """The test process's environment without anything `hami-node` reads as a setting (NODE_NAME,
    KUBECONFIG, HAMI_*, DP_*, ...): only what Python itself needs."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def daemon_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hami_node.main", *args]


def run_daemon_once(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `hami-node` to completion (start-up errors): exit code, stdout and stderr as text."""
    return subprocess.run(
        daemon_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=daemon_env(),
        cwd=REPO_ROOT,
        check=False,
    )


class NodeDaemonProcess:
    """One `hami-node` process; `stop()` ends it (SIGTERM, then SIGKILL) and prints its log."""

    def __init__(self, args: Sequence[str], log_path: Path) -> None:
        self.args = list(args)
        self.log_path = log_path
        self._log: IO[bytes] | None = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.process: subprocess.Popen[bytes] = subprocess.Popen(
            daemon_command(*args),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=daemon_env(),
            cwd=REPO_ROOT,
        )
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def describe(self, limit: int = 6000) -> str:
        """Exit status and the tail of the log, for assertion messages."""
        status = "running" if self.alive() else f"exited with {self.process.returncode}"
        text = self.log_text()
        tail = text[-limit:] if len(text) > limit else text
        return f"hami-node (pid {self.pid}) {status}; log {self.log_path}:\n{tail}"

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; SIGKILL after `timeout`. Returns the exit code (negative: signal)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10.0)
        self.returncode = self.process.returncode
        return self.returncode

    def stop(self, timeout: float = 15.0) -> int:
        code = self.terminate(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
            print(f"--- hami-node log ({self.log_path}, exit {code}) ---")
            print(self.log_text())
        return code


# --- one node -----------------------------------------------------------------------------------------


@dataclass
class NodeRig:
    """One node: the kubelet stand-in, the inventory file, the hook dir and (once started) the daemon."""

    node: str
    base: Path
    kubeconfig: Path
    inventory: Inventory
    kubelet: KubeletRunner
    daemons: list[NodeDaemonProcess] = field(default_factory=list)

    # Each watched directory apart: the daemon watches the kubelet directory and its parent, and the
    # inventory's directory and its parent; its own log must be in none of them (at debug level every
    # write would be an inotify event it logs).

    @property
    def kubelet_dir(self) -> Path:
        return self.base / "k" / "dp"

    @property
    def inventory_path(self) -> Path:
        return self.base / "inv" / "gpus.yaml"

    @property
    def hook_path(self) -> Path:
        return self.base / "hook"

    @property
    def plugin_socket(self) -> Path:
        return self.kubelet_dir / "hami-nvidia-gpu.sock"

    @property
    def uuids(self) -> list[str]:
        return [gpu.uuid for gpu in self.inventory.gpus]

    @property
    def daemon(self) -> NodeDaemonProcess:
        return self.daemons[-1]

    def write_inventory(self, inventory: Inventory) -> None:
        self.inventory = inventory
        write_inventory(self.inventory_path, inventory)

    def emit_xid(self, event_id: str, gpu: str, xid: int) -> None:
        event = FakeEvent(event_id, GPUEventKind.XID, gpu, xid)
        self.write_inventory(replace(self.inventory, events=(*self.inventory.events, event)))

    def set_nvml(self, mode: NvmlMode) -> None:
        self.write_inventory(replace(self.inventory, nvml=mode))

    def base_args(self) -> list[str]:
        return [
            "--node-name", self.node,
            "--kubelet-dir", str(self.kubelet_dir),
            "--kubeconfig", str(self.kubeconfig),
            "--gpu-backend", "fake",
            "--fake-inventory", str(self.inventory_path),
            "--hook-path", str(self.hook_path),
            "--log-level", "debug",
        ]  # fmt: skip

    def start_daemon(self, *extra: str, split: int = 10, wait: bool = True) -> NodeDaemonProcess:
        """Start `hami-node` with the base flags plus `extra`; with `wait`, until the stand-in has every
        virtual device registered and Healthy."""
        args = [*self.base_args(), "--device-split-count", str(split), *extra]
        log_path = self.base / "logs" / f"hami-node-{len(self.daemons)}.log"
        daemon = NodeDaemonProcess(args, log_path)
        self.daemons.append(daemon)
        if wait:
            count = split * len(self.inventory.gpus)
            self.wait_devices(lambda r: r.connected and r.allocatable == count == r.capacity, 30.0)
        return daemon

    def wait_devices(self, predicate: Callable[[Any], bool], timeout: float = 10.0) -> Snapshot:
        """Wait until the stand-in's `nvidia.com/gpu` resource satisfies `predicate(ResourceState)`."""

        def check(snapshot: Snapshot) -> bool:
            resource = snapshot.resource(RESOURCE)
            return resource is not None and predicate(resource)

        try:
            return self.kubelet.wait_for_devices(check, timeout)
        except TimeoutError:
            resource = self.kubelet.snapshot().resource(RESOURCE)
            daemon = self.daemon.describe() if self.daemons else "no daemon started"
            raise AssertionError(
                f"the stand-in's {RESOURCE} did not reach the expected state within {timeout}s; "
                f"now: {_describe_resource(resource)}\n{daemon}"
            ) from None

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        self.kubelet.stop()


def _describe_resource(resource: Any) -> str:
    if resource is None:
        return "not registered"
    return (
        f"connected={resource.connected} capacity={resource.capacity} allocatable={resource.allocatable} "
        f"registrations={resource.registrations} updates={resource.updates}"
    )


def healthy_ids(resource: Any, gpu: str) -> set[str]:
    return {d for d in resource.healthy if d.startswith(gpu + "-")}


def unhealthy_ids(resource: Any, gpu: str) -> set[str]:
    return {d for d in resource.unhealthy if d.startswith(gpu + "-")}


def virtual_ids(gpu: str, split: int) -> set[str]:
    return {f"{gpu}-{i}" for i in range(split)}


def make_rig(
    node: str, kubeconfig: Path, inventory: Inventory, *, start_kubelet: bool = True
) -> Iterator[NodeRig]:
    """A generator for a fixture: the directory (short: Unix socket paths are limited), the inventory,
    the stand-in (which creates the Node; not started without `start_kubelet`); everything is stopped
    and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    try:
        for sub in ("hook", "k", "inv", "logs"):
            (base / sub).mkdir()
        write_inventory(base / "inv" / "gpus.yaml", inventory)
        config = KubeletConfig(node, base / "k" / "dp", kubeconfig=kubeconfig, create_node=True)
        kubelet = KubeletRunner(config)
        if start_kubelet:
            kubelet.start()
        rig = NodeRig(node, base, kubeconfig, inventory, kubelet)
        try:
            yield rig
        finally:
            rig.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def node_rig(
    node: str, kubeconfig: Path, inventory: Inventory, *, start_kubelet: bool = True
) -> Iterator[NodeRig]:
    """`make_rig` as a context manager, for tests that need to act before the stand-in starts."""
    yield from make_rig(node, kubeconfig, inventory, start_kubelet=start_kubelet)


# --- pods scheduled the way the extender binds them ------------------------------------------------------


# --- reading what hami-node wrote ----------------------------------------------------------------------


def node_inventory(node_obj: Any) -> tuple[GPUInfo, ...] | None:
    """The node's `hami.io/node-nvidia-register`, decoded; None when absent."""
    text = (node_obj.metadata.annotations or {}).get(ann.NODE_REGISTER)
    return None if text is None else ann.decode_node_register(text)


def inventory_health(node_obj: Any) -> dict[str, bool] | None:
    gpus = node_inventory(node_obj)
    return None if gpus is None else {g.id: g.health for g in gpus}


def bind_phase(pod_obj: Any) -> str | None:
    return (pod_obj.metadata.annotations or {}).get(ann.BIND_PHASE)


def pod_patches(runner: Any, name: str) -> list[dict[str, Any]]:
    """PATCH requests on pod `name` itself (not its status: that is the kubelet stand-in)."""
    return [
        r
        for r in runner.requests(10_000)
        if r["verb"] == "patch" and r["resource"] == "pods" and r["subresource"] == "" and r["name"] == name
    ]
