"""Start, inspect, restart and stop a whole local cluster: the API server stand-in, hami-control (webhook
and scheduler extender over HTTPS, registered as a MutatingWebhookConfiguration), the kube-scheduler
stand-in, and per node a kubelet stand-in and a real hami-node with fake GPUs, or for a node of another
vendor that vendor's device-plugin stand-in (`hami_sim.vendors`; both on a node with NVIDIA GPUs beside).
Every part is its own process started with `sys.executable -m ...` (in scale mode all kubelets share one
process and all node daemons and vendor stand-ins another: `hami_sim.nodehost`); they talk through the
real protocols only. A cluster with vendor nodes runs hami-control with the vendors' `--enable-ascend` /
`--enable-iluvatar` and the scheduler with every vendor's resources in the extender's managed resources
(`scheduler-config.yaml` in the state directory: daemonset/scheduler's lists NVIDIA's only).

Files: `<state>/` holds `kubeconfig`, `cluster.json` (pids, ports, paths, the spec), `ca.crt`,
`tls/`, `nodes/<node>/gpus.yaml` (each node's fake inventory: edit it to inject faults) and `logs/`.
Every node daemon serves its health endpoint (/healthz, /readyz, /metrics) on a port of its own on
127.0.0.1 (`Cluster.node_metrics_url`), unless the spec turns that off (`ClusterSpec.node_metrics`).
Unix sockets live under a short directory in /tmp (`run_dir`), because socket paths are limited to
107 bytes. `down` removes all of it but the logs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import urllib3

from hami_api import dra
from hami_api.annotations import NODE_REGISTER
from hami_node.dra.slices import mig_device_class_self
from hami_node.durable import write_atomic
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import (
    FakeEvent,
    FakeGpu,
    Inventory,
    InventoryError,
    NvmlMode,
    load_inventory,
    write_inventory,
)
from hami_sim.cluster import monitoring, service
from hami_sim.cluster.process import Proc, stop_all
from hami_sim.cluster.spec import ClusterSpec, NodeSpec, SpecError, node_inventory
from hami_sim.nodehost import (
    KUBELET_LONGEST_SOCKET,
    READY_MARKER,
    HostedNode,
    HostSpec,
    daemon_argv,
    host_command,
    write_host_spec,
)
from hami_sim.tls import client_ssl_context, generate_ca, generate_serving_cert
from hami_sim.vendors import READY_MARKER as VENDOR_READY_MARKER
from hami_sim.vendors.cli import vendor_argv

log = logging.getLogger("hami_sim.cluster")

APISERVER = "apiserver"
CONTROL = "hami-control"
"""hami-control; with several replicas (`ClusterSpec.control_replicas`), the one that leads now."""
CONTROL_SERVICE = "control-service"
"""With several hami-control replicas: the Service-like proxy on the control URL (cluster/service.py)."""
LEASE_NAMESPACE = "kube-system"
"""Where several hami-control replicas elect their leader (`--leader-elect-namespace`)."""
SCHEDULER = "scheduler"
DEFAULT_SCHEDULER = "default-scheduler"
"""With nodes in NVIDIA's modes: the scheduler stand-in for profile `default-scheduler`, without extender,
as the cluster's own kube-scheduler beside HAMi's: pods asking NVIDIA's resources (`nvidia.com/gpu.shared`,
`nvidia.com/mig-1g.5gb`) are not the webhook's, keep `schedulerName: default-scheduler` and are placed by
NodeResourcesFit from the Node's allocatable, as with NVIDIA's plugin."""
DEFAULT_SCHEDULER_CONFIG = "default-scheduler-config.yaml"
CONTROLLER_MANAGER = "controller-manager"
PROMETHEUS = "prometheus"
"""With `ClusterSpec.monitoring`: Prometheus scraping the cluster with the install's rules (monitoring.py)."""
KUBELET_HOST = "kubelets"
DAEMON_HOST = "hami-nodes"
KUBELET_PREFIX = "kubelet/"
DAEMON_PREFIX = "hami-node/"
VENDOR_PREFIX = "vendor/"
"""`vendor/<node>`: the device-plugin stand-in of a node of another vendor (hami_sim.vendors)."""
DAEMONS_PER_HOST = 250
"""Scale mode puts at most this many node daemons in one process: hundreds of thread-based daemons
under one GIL slow each other down more than linearly (500 nodes were all ready after 168 s with one
process, 40 s with two)."""

GPU_RESOURCE = "nvidia.com/gpu"
WEBHOOK_CONFIG_NAME = "hami-webhook"
IGNORE_LABEL = "hami.io/webhook"
DRA_NAMESPACE_LABEL = "hami.io/dra"
"""Namespaces labelled hami.io/dra=enabled have their GPU pods translated to claims (mixed clusters)."""
PORT_IN_USE = "Address already in use"
"""What a process logs when its port was taken between the pick and its bind (it is started again on
another port, at most `_PORT_ATTEMPTS` times)."""
_PORT_ATTEMPTS = 3
STATE_FILE = "cluster.json"
STATE_VERSION = 1

_READY: dict[str, re.Pattern[str]] = {
    APISERVER: re.compile(r"hami-sim apiserver ready at (http://\S+)"),
    CONTROL: re.compile(r"serving \S.* on https://127\.0\.0\.1:(\d+)"),
    CONTROL_SERVICE: re.compile(re.escape(service.READY_MARKER)),
    SCHEDULER: re.compile(r"hami-sim scheduler ready"),
    DEFAULT_SCHEDULER: re.compile(r"hami-sim scheduler ready"),
    CONTROLLER_MANAGER: re.compile(r"hami-sim controller-manager ready"),
    PROMETHEUS: re.compile(re.escape(monitoring.READY_LINE)),
    KUBELET_HOST: re.compile(re.escape(READY_MARKER)),
    DAEMON_HOST: re.compile(re.escape(READY_MARKER)),
    KUBELET_PREFIX: re.compile(r"hami-sim kubelet ready"),
    DAEMON_PREFIX: re.compile(r"hami-node running on node"),
    VENDOR_PREFIX: re.compile(re.escape(VENDOR_READY_MARKER)),
}
_STOP_ORDER = (
    (PROMETHEUS, SCHEDULER, DEFAULT_SCHEDULER, "daemons"),
    ("kubelets", "controls", CONTROLLER_MANAGER),
    (APISERVER,),
)
"""down, in stages (each stage at once): the scheduler (no new binds) and the node daemons while their
kubelets still answer (a plugin whose kubelet vanished first may sit in a registration attempt until
its dial timeout); then the kubelets and hami-control; the API server last (the others write their
last patches to it)."""

_T = TypeVar("_T")

GPU_FAULTS = ("xid", "ecc-double-bit", "unhealthy", "lost", "nvml-failing", "nvml-absent")
"""What `Cluster.inject_gpu_fault` injects through a node's fake inventory (docs/fake-gpus.md):
`xid` (an Xid event, code `xid`, default 79: fallen off the bus) and `ecc-double-bit` (an uncorrectable
ECC event) fire once and make the GPU unhealthy at once; `unhealthy` (`health: false`: NVML calls about
the GPU such as nvmlDeviceGetMemoryInfo fail, so its probe fails and it cannot recover; hami-node lists
it unhealthy at its next relist, every 30 s, or at once after an event) and `lost` (`lost: true`: the
GPU stops answering, NVML_ERROR_GPU_IS_LOST, with one device-lost event) stay until cleared;
`nvml-failing` (every NVML call fails) and `nvml-absent` (the driver is gone) are about the whole node
(gpu_index None)."""
_NODE_FAULTS = ("nvml-failing", "nvml-absent")
_SIGNALS_THAT_END = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class ClusterError(Exception):
    """The cluster (or one component) could not be started, restarted or stopped. `component` names
    the culprit when there is one; `pids` are the processes that were started (all stopped again)."""

    def __init__(self, message: str, *, component: str | None = None, pids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.component = component
        self.pids = pids


class NoCluster(ClusterError):
    """No cluster.json in the state directory."""


def default_scheduler_config() -> Path:
    """daemonset/scheduler/kube-scheduler-config.yaml of the checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "daemonset" / "scheduler" / "kube-scheduler-config.yaml"


def run_dir_for(state_dir: Path) -> Path:
    """A short directory for the sockets of the cluster kept in `state_dir` (one per state directory)."""
    base = Path("/tmp") if os.access("/tmp", os.W_OK) else Path(tempfile.gettempdir())
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return base / f"hami-sim-{digest}"


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    port: int | None
    log: Path


@dataclass(frozen=True)
class NodeStatus:
    name: str
    ready: bool
    gpus: str | None
    """allocatable nvidia.com/gpu (virtual devices), None when absent."""
    registered: bool
    """hami-node's inventory annotation is on the Node (device-plugin mode), or its ResourceSlice is
    published (DRA mode)."""
    mode: str = "device-plugin"
    metrics_url: str | None = None
    """The node daemon's /metrics (`Cluster.node_metrics_url`); None when it serves none."""
    vendor: str = "nvidia"
    """The vendor of the node's other devices (hami_sim.vendors); `gpus` is then its count resource's
    allocatable unless the node also has NVIDIA GPUs, and `registered` includes its plugin's inventory."""
    nvidia: bool = True
    """Whether the node has NVIDIA GPUs (a hami-node daemon, hami-control's cache counts it)."""
    nvidia_mode: bool = False
    """hami-node serves NVIDIA's sharing modes (NVIDIA's config file): `gpus` lists the NVIDIA resources
    allocatable, `registered` is its device plugins' resources on the Node (no HAMi register annotation),
    and hami-control's cache never counts it."""

    @property
    def hami(self) -> bool:
        """hami-control's extender counts this node (NVIDIA GPUs on HAMi's device plugin)."""
        return self.mode != "dra" and self.nvidia and not self.nvidia_mode

    @property
    def ok(self) -> bool:
        if self.mode == "dra":
            return self.ready and self.registered
        return self.ready and self.registered and self.gpus not in (None, "0")


@dataclass(frozen=True)
class ClusterStatus:
    components: tuple[ComponentStatus, ...]
    nodes: tuple[NodeStatus, ...] | None
    """None when the API server does not answer."""
    control_nodes: int | None
    """Nodes in hami-control's cache (hami_scheduler_cache_nodes); None when it does not answer."""
    leader: str | None = None
    """With several hami-control replicas: the one the Lease names (None: none, or one replica)."""

    @property
    def ok(self) -> bool:
        return (
            all(c.alive for c in self.components)
            and self.nodes is not None
            and all(n.ok for n in self.nodes)
            # DRA nodes, nodes in NVIDIA's modes and nodes without NVIDIA GPUs never count in the
            # extender's NVIDIA cache
            and self.control_nodes == sum(n.hami for n in self.nodes)
        )

    def render(self, *, all_nodes: bool = False, wide: bool = False) -> str:
        """The tables `hami-sim status` prints: components, then nodes (all of them when `all_nodes` or
        at most 50, else those not ready and a summary); `wide` adds each node daemon's /metrics URL."""
        rows = [("COMPONENT", "PID", "ALIVE", "PORT", "LOG")]
        rows += [
            (c.name, str(c.pid), "yes" if c.alive else "NO", str(c.port) if c.port else "-", str(c.log))
            for c in self.components
        ]
        out = [_table(rows), ""]
        if self.leader is not None:
            out += [f"{CONTROL} leader: {self.leader}", ""]
        if self.nodes is None:
            out.append("nodes: unknown (the API server does not answer)")
            return "\n".join(out)
        shown = [n for n in self.nodes if all_nodes or len(self.nodes) <= 50 or not n.ok]
        if shown:
            node_rows: list[tuple[str, ...]] = [
                ("NODE", "MODE", "READY", "GPU ALLOCATABLE", "REGISTERED", "METRICS")
            ]
            node_rows += [
                (
                    n.name,
                    n.mode
                    + (
                        f" ({n.vendor})"
                        if n.vendor != "nvidia"
                        else " (NVIDIA's config)"
                        if n.nvidia_mode
                        else ""
                    ),
                    "True" if n.ready else "False",
                    n.gpus or "-",
                    ("yes" if n.registered else "no") + (" (ResourceSlice)" if n.mode == "dra" else ""),
                    n.metrics_url or "-",
                )
                for n in shown
            ]
            if not wide:
                node_rows = [row[:-1] for row in node_rows]
            out += [_table(node_rows), ""]
        ready = sum(n.ok for n in self.nodes)
        seen = "unknown" if self.control_nodes is None else str(self.control_nodes)
        dra_nodes = sum(n.mode == "dra" for n in self.nodes)
        ways = f"{GPU_RESOURCE}" + (f" or a ResourceSlice ({dra_nodes} in DRA mode)" if dra_nodes else "")
        out.append(f"nodes: {ready}/{len(self.nodes)} ready with {ways}; in hami-control's cache: {seen}")
        return "\n".join(out)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


class Cluster:
    """A running local cluster. `Cluster.up(spec, state_dir)` starts one; `Cluster.load(state_dir)`
    finds one started earlier (by another process too). Use as a context manager to `down()` at exit."""

    def __init__(
        self,
        spec: ClusterSpec,
        state_dir: Path,
        *,
        run_dir: Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.state_dir = state_dir.resolve()
        self.run_dir = run_dir or run_dir_for(self.state_dir)
        self.procs: dict[str, Proc] = {}
        self.apiserver_url = ""
        self.control_port = 0
        self.node_health_ports: dict[str, int] = {}
        """Each node daemon's health endpoint port on 127.0.0.1 (empty when `spec.node_metrics` is off)."""
        self._rebinds: dict[str, int] = {}
        self._progress = progress or log.info
        self._t0 = time.monotonic()
        self._last_progress = ""
        self._inventory_lock = threading.Lock()

    # --- paths ----------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "ca.crt"

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def control_url(self) -> str:
        return f"https://127.0.0.1:{self.control_port}"

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.spec.nodes]

    def node_metrics_url(self, node: str) -> str:
        """`http://127.0.0.1:<port>/metrics` of the node daemon of `node` (its health endpoint also serves
        /healthz and /readyz). `ClusterError` for an unknown node, or when the cluster runs without
        (`ClusterSpec.node_metrics` off)."""
        if node not in self.node_names:
            raise ClusterError(f"node: no node {node!r}; the nodes are: {', '.join(self.node_names)}")
        url = self._metrics_url_or_none(node)
        if url is None:
            raise ClusterError(
                f"node {node}: its daemon serves no metrics (the cluster runs with node_metrics off)"
            )
        return url

    @property
    def prometheus_dir(self) -> Path:
        """Prometheus's configuration, target files and data (`ClusterSpec.monitoring`)."""
        return self.state_dir / "prometheus"

    @property
    def prometheus_url(self) -> str:
        """`http://127.0.0.1:<port>` of the cluster's Prometheus; `ClusterError` when it runs without."""
        proc = self.procs.get(PROMETHEUS)
        if proc is None or not proc.port:
            raise ClusterError("the cluster runs without Prometheus (hami-sim up --monitoring starts one)")
        return f"http://127.0.0.1:{proc.port}"

    def _metrics_url_or_none(self, node: str) -> str | None:
        port = self.node_health_ports.get(node)
        return None if port is None else f"http://127.0.0.1:{port}/metrics"

    def inventory_path(self, node: str) -> Path:
        """The node's fake GPU inventory; hami-node applies edits within milliseconds (see
        docs/fake-gpus.md; write a new file and rename it over this one). A node without NVIDIA GPUs has
        none."""
        return self.state_dir / "nodes" / node / "gpus.yaml"

    def node_spec(self, node: str) -> NodeSpec:
        found = next((n for n in self.spec.nodes if n.name == node), None)
        if found is None:
            raise ClusterError(f"node: no node {node!r}; the nodes are: {', '.join(self.node_names)}")
        return found

    @property
    def scheduler_config(self) -> Path:
        """The scheduler stand-in's KubeSchedulerConfiguration: the spec's, else with vendor nodes the one
        `up` writes (daemonset/scheduler's with every vendor's managed resources), else daemonset's."""
        if self.spec.scheduler_config is not None:
            return self.spec.scheduler_config
        if self.spec.vendor_nodes:
            return self.state_dir / "scheduler-config.yaml"
        return default_scheduler_config()

    # --- GPU faults (the fake inventory) ------------------------------------------------------------

    def inject_gpu_fault(self, node: str, gpu_index: int | None, kind: str, *, xid: int = 79) -> None:
        """Inject one of `GPU_FAULTS` on GPU `gpu_index` of `node` by editing its fake inventory (hami-node
        applies it within milliseconds; docs/fake-gpus.md). `nvml-failing` and `nvml-absent` are about the
        whole node: `gpu_index` None. Event faults (`xid`, `ecc-double-bit`) fire once each call; they
        stay in the file until `clear_gpu_fault`, and a node daemon started meanwhile fires them again at
        its start (as it reads every event of the file then). `ClusterError` for a bad node, GPU or kind."""
        if kind not in GPU_FAULTS:
            raise ClusterError(f"kind: expected one of {', '.join(GPU_FAULTS)}, got {kind!r}")
        if (kind in _NODE_FAULTS) != (gpu_index is None):
            raise ClusterError(
                f"gpu_index: {kind} is about " + ("the whole node: give None" if kind in _NODE_FAULTS else
                "one GPU: give its index") + f", got {gpu_index!r}"
            )  # fmt: skip

        def edit(inventory: Inventory) -> Inventory:
            if kind in _NODE_FAULTS:
                mode = NvmlMode.FAILING if kind == "nvml-failing" else NvmlMode.ABSENT
                return replace(inventory, nvml=mode)
            gpu = _inventory_gpu(inventory, node, gpu_index)
            if kind in ("unhealthy", "lost"):
                changed = replace(gpu, healthy=False) if kind == "unhealthy" else replace(gpu, lost=True)
                return replace(inventory, gpus=tuple(changed if g is gpu else g for g in inventory.gpus))
            event_id = f"hami-sim-{kind}-{gpu.index}-{uuid.uuid4().hex[:12]}"
            event = FakeEvent(event_id, GPUEventKind(kind), gpu.uuid, xid if kind == "xid" else None)
            return replace(inventory, events=(*inventory.events, event))

        self._edit_inventory(node, edit)

    def clear_gpu_fault(self, node: str, gpu_index: int | None) -> None:
        """Undo `inject_gpu_fault` on GPU `gpu_index` of `node` (`health: true`, `lost: false`, its events
        removed from the file), or with None the node-wide ones (`nvml: ok`, events about all GPUs
        removed). Whether the GPU is advertised again is then the node daemon's health recovery's call
        (hami-node --health-recovery-seconds)."""

        def edit(inventory: Inventory) -> Inventory:
            if gpu_index is None:
                events = tuple(e for e in inventory.events if e.gpu is not None)
                return replace(inventory, nvml=NvmlMode.OK, events=events)
            gpu = _inventory_gpu(inventory, node, gpu_index)
            fixed = replace(gpu, healthy=True, lost=False)
            gpus = tuple(fixed if g is gpu else g for g in inventory.gpus)
            events = tuple(e for e in inventory.events if e.gpu != gpu.uuid)
            return replace(inventory, gpus=gpus, events=events)

        self._edit_inventory(node, edit)

    def _edit_inventory(self, node: str, edit: Callable[[Inventory], Inventory]) -> None:
        if node not in self.node_names:
            raise ClusterError(f"node: no node {node!r}; the nodes are: {', '.join(self.node_names)}")
        path = self.inventory_path(node)
        with self._inventory_lock:
            try:
                inventory = load_inventory(path)
            except InventoryError as exc:
                raise ClusterError(f"cannot read the fake inventory of {node}: {exc}") from None
            write_inventory(path, edit(inventory))

    def nvidia_config_path(self, node: str) -> Path:
        """NVIDIA's config file of a node in NVIDIA's modes (`NodeSpec.nvidia_config`), as hami-node reads it
        with `--config-file`."""
        return self.state_dir / "nodes" / node / "nvidia.yaml"

    def node_config_path(self, node: str) -> Path:
        """The node config (HAMi's `nodeconfig` with the node's `operatingmode`) of a node whose operating
        mode is not hami-core, as hami-node reads it with `--config-file`."""
        return self.state_dir / "nodes" / node / "node-config.yaml"

    def kubelet_dir(self, node: str) -> Path:
        return self.run_dir / str(self.node_names.index(node) + 1)

    def log_path(self, component: str) -> Path:
        """The log of a component (in scale mode, a node's parts log to their host's)."""
        return self._proc_for(component)[0].log

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    @property
    def control_replicas(self) -> list[str]:
        """hami-control's processes: `hami-control`, or `hami-control-0`, `hami-control-1`, ... ."""
        count = self.spec.control_replicas
        return [CONTROL] if count == 1 else [f"{CONTROL}-{i}" for i in range(count)]

    @property
    def components(self) -> list[str]:
        """Every restartable name: the processes, and in scale mode the per-node parts too. With several
        hami-control replicas, `hami-control` (not listed) also names the current leader."""
        names = list(self.procs)
        if self.spec.scale_mode:
            names += [f"{prefix}{n.name}" for n in self.spec.nodes for prefix in _node_parts(n)]
        return names

    # --- up ---------------------------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        spec: ClusterSpec,
        state_dir: str | os.PathLike[str] = ".hami-sim",
        *,
        progress: Callable[[str], None] | None = None,
    ) -> Cluster:
        """Start every component and wait until each node is Ready with allocatable nvidia.com/gpu,
        carries hami-node's inventory annotation and is in hami-control's cache (a vendor node: its
        plugin's count resource allocatable and its inventory annotation written). On failure stop what
        was started and raise `ClusterError` naming the component and why (its last log lines)."""
        cluster = cls(spec, Path(state_dir), progress=progress)
        if spec.monitoring:
            try:
                monitoring.prometheus_binary()  # before anything is made or started
            except monitoring.MonitoringError as exc:
                raise ClusterError(str(exc), component=PROMETHEUS) from None
        cluster._refuse_running()
        cluster._prepare()
        try:
            cluster._start_all()
        except BaseException as exc:
            pids = tuple(p.pid for p in cluster.procs.values())
            cluster._stop_everything(grace_s=5.0)
            if isinstance(exc, ClusterError):
                exc.pids = pids
            raise
        return cluster

    def _say(self, message: str) -> None:
        if message != self._last_progress:
            self._last_progress = message
            self._progress(f"[{time.monotonic() - self._t0:5.1f}s] {message}")

    def _refuse_running(self) -> None:
        try:
            old = Cluster.load(self.state_dir)
        except NoCluster:
            return
        except ClusterError:
            old = None
        if old is not None and any(p.alive() for p in old.procs.values()):
            raise ClusterError(
                f"a cluster is already running in {self.state_dir} (hami-sim down --state-dir "
                f"{self.state_dir} first)"
            )
        if old is not None:
            old._remove_files()

    def _prepare(self) -> None:
        longest = self.kubelet_dir(self.node_names[-1]) / KUBELET_LONGEST_SOCKET
        if len(str(self.run_dir)) + 12 > 100 or len(str(longest)) > 100:
            raise ClusterError(f"the socket directory {self.run_dir} is too long for Unix sockets")
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(mode=0o700, parents=True)
        for sub in ("nodes", "tls", "prometheus"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "tls").mkdir(mode=0o700)
        self.kubeconfig.unlink(missing_ok=True)
        ca_cert, ca_key = generate_ca("hami-sim local cluster CA")
        cert, key = generate_serving_cert(
            ca_cert, ca_key, ["localhost"], ["127.0.0.1"], common_name="hami-control"
        )
        _write_private(self.state_dir / "tls" / "ca.key", ca_key)
        _write_private(self.state_dir / "tls" / "hami-control.key", key)
        write_atomic(self.state_dir / "tls" / "hami-control.crt", cert, mode=0o644)
        write_atomic(self.ca_file, ca_cert, mode=0o644)
        for node in self.spec.nodes:
            path = self.inventory_path(node.name)
            (path.parent / "hook").mkdir(parents=True)
            if node.gpus:
                write_inventory(path, node_inventory(node))
        if self.spec.node_metrics:
            for node in self.spec.nodes:
                if node.gpus:
                    self.node_health_ports[node.name] = _free_port(self._taken_ports())
        if self.spec.vendor_nodes and self.spec.scheduler_config is None:
            write_atomic(self.scheduler_config, vendor_scheduler_config(), mode=0o644)
        for node in self.spec.nodes:
            if node.nvidia_config is not None:
                write_atomic(self.nvidia_config_path(node.name), node.nvidia_config.encode(), mode=0o644)
            if node.operating_mode != "hami-core":
                write_atomic(self.node_config_path(node.name), _node_config(node), mode=0o644)
        if self.spec.nvidia_mode_nodes:
            write_atomic(self.state_dir / DEFAULT_SCHEDULER_CONFIG, _DEFAULT_SCHEDULER_CONFIG, mode=0o644)
        if self.spec.scale_mode:
            for host in self._hosts():
                write_host_spec(self._host_spec_path(host), self._host_spec(host))

    def _hosted(self, node: str) -> HostedNode:
        spec = self.node_spec(node)
        vendor_args: tuple[str, ...] = ()
        if spec.devices is not None:
            vendor_args = tuple(vendor_argv(node, self.kubelet_dir(node), self.kubeconfig, spec.devices))
        if not spec.gpus:
            return HostedNode(node, self.kubelet_dir(node), (), daemon=False, vendor_args=vendor_args)
        args = [
            "--gpu-backend",
            "fake",
            "--fake-inventory",
            str(self.inventory_path(node)),
            "--hook-path",
            str(self.inventory_path(node).parent / "hook"),
        ]
        if spec.nvidia_mode:
            # NVIDIA's config file as the user wrote it; no HAMi-core slicing beside it (refused).
            args += ["--config-file", str(self.nvidia_config_path(node))]
        else:
            args += ["--device-split-count", str(self.spec.split)]
        if spec.operating_mode != "hami-core":
            args += ["--config-file", str(self.node_config_path(node))]
        if node in self.node_health_ports:
            args += ["--health-bind", f"127.0.0.1:{self.node_health_ports[node]}"]
        if node in self.spec.dra_nodes:
            # The kubelet directory plays /var/lib/kubelet/device-plugins; DRA's directories sit beside
            # its sockets, where the kubelet stand-in watches them (KubeletConfig's defaults).
            kubelet_dir = self.kubelet_dir(node)
            args += [
                "--mode", "dra",
                "--kubelet-registry-dir", str(kubelet_dir / "plugins_registry"),
                "--kubelet-plugins-dir", str(kubelet_dir / "plugins"),
                "--cdi-spec-dir", str(kubelet_dir / "cdi"),
            ]  # fmt: skip
        args += self.spec.node_args
        return HostedNode(node, self.kubelet_dir(node), tuple(args), vendor_args=vendor_args)

    def _hosts(self) -> list[str]:
        """Scale mode's host processes: one for the kubelets, one per `DAEMONS_PER_HOST` node daemons."""
        count = -(-len(self.spec.nodes) // DAEMONS_PER_HOST)
        daemons = [DAEMON_HOST] if count == 1 else [f"{DAEMON_HOST}-{k}" for k in range(1, count + 1)]
        return [KUBELET_HOST, *daemons]

    def _host_nodes(self, host: str) -> list[str]:
        """The nodes a host serves (daemon hosts take every n-th node)."""
        hosts = self._hosts()[1:]
        if host == KUBELET_HOST:
            return self.node_names
        return self.node_names[hosts.index(host) :: len(hosts)]

    def _host_of(self, component: str) -> tuple[str, str] | None:
        """(host, node) for `kubelet/<node>`, `hami-node/<node>` or `vendor/<node>` in scale mode."""
        for prefix in (KUBELET_PREFIX, DAEMON_PREFIX, VENDOR_PREFIX):
            node = component.removeprefix(prefix)
            if component.startswith(prefix) and node in self.node_names:
                if prefix == KUBELET_PREFIX:
                    return KUBELET_HOST, node
                daemon_hosts = self._hosts()[1:]
                return daemon_hosts[self.node_names.index(node) % len(daemon_hosts)], node
        return None

    def _host_spec_path(self, host: str) -> Path:
        return self.state_dir / "nodes" / f"{host}.json"

    def _host_spec(self, host: str) -> HostSpec:
        return HostSpec(
            tuple(self._hosted(n) for n in self._host_nodes(host)),
            kubeconfig=self.kubeconfig,
            cpu=self.spec.node_cpu,
            memory=self.spec.node_memory,
        )

    def _argv(self, name: str) -> list[str]:
        py = sys.executable
        if name == APISERVER:
            return [
                py,
                "-m",
                "hami_sim.main",
                APISERVER,
                "--port",
                "0",
                "--kubeconfig-out",
                str(self.kubeconfig),
                *self.spec.apiserver_args,
            ]
        if name == PROMETHEUS:
            proc = self.procs[PROMETHEUS]
            assert proc.port is not None
            try:
                return monitoring.argv(monitoring.prometheus_binary(), self.prometheus_dir, proc.port)
            except monitoring.MonitoringError as exc:
                raise ClusterError(str(exc), component=PROMETHEUS) from None
        if name == CONTROLLER_MANAGER:
            return [
                py, "-m", "hami_sim.main", CONTROLLER_MANAGER, "--kubeconfig", str(self.kubeconfig),
                *self.spec.controller_manager_args,
            ]  # fmt: skip
        if name == CONTROL_SERVICE:
            argv = [py, "-m", "hami_sim.main", "service-proxy", "--port", str(self.control_port)]
            argv += ["--ca-file", str(self.ca_file)]
            for replica in self.control_replicas:
                argv += ["--endpoint", f"{replica}={self.procs[replica].port}"]
            return argv
        if name in self.control_replicas:
            tls = self.state_dir / "tls"
            port = self.control_port if name == CONTROL else self.procs[name].port
            argv = [py, "-m", "hami_control.main", "serve", "--bind", f"127.0.0.1:{port}"]
            argv += [
                "--tls-cert-file",
                str(tls / "hami-control.crt"),
                "--tls-key-file",
                str(tls / "hami-control.key"),
            ]
            argv += ["--kubeconfig", str(self.kubeconfig)]
            if self.spec.node_scheduler_policy:
                argv += ["--node-scheduler-policy", self.spec.node_scheduler_policy]
            if self.spec.gpu_scheduler_policy:
                argv += ["--gpu-scheduler-policy", self.spec.gpu_scheduler_policy]
            argv += list(self.spec.vendor_gates)
            if self.spec.dra_nodes:
                # An all-DRA cluster translates every GPU pod; a mixed one the namespaces labelled
                # hami.io/dra=enabled (the second webhook entry, as daemonset/overlays/dra has it).
                all_dra = len(self.spec.dra_nodes) == len(self.spec.nodes)
                argv += ["--dra-translation", "all" if all_dra else "namespace"]
            if name != CONTROL:
                # The Lease holder starts with the pod name (hami_control.leader.default_identity); no
                # --pod-namespace, so no replica tries to label a pod that does not exist here.
                argv += ["--leader-elect", "--leader-elect-namespace", LEASE_NAMESPACE, "--pod-name", name]
            return argv + list(self.spec.control_args)
        if name == SCHEDULER:
            config = self.scheduler_config
            return [
                py, "-m", "hami_sim.main", SCHEDULER, "--kubeconfig", str(self.kubeconfig),
                "--config", str(config), "--extender-url", self.control_url,
                "--extender-ca-file", str(self.ca_file), *self.spec.scheduler_args,
            ]  # fmt: skip
        if name == DEFAULT_SCHEDULER:
            return [
                py, "-m", "hami_sim.main", SCHEDULER, "--kubeconfig", str(self.kubeconfig),
                "--config", str(self.state_dir / DEFAULT_SCHEDULER_CONFIG), "--profile", DEFAULT_SCHEDULER,
                *self.spec.scheduler_args,
            ]  # fmt: skip
        if self.spec.scale_mode and name in self._hosts():
            role = "kubelets" if name == KUBELET_HOST else "daemons"
            return [
                py, "-m", "hami_sim.main", "nodes", "--spec", str(self._host_spec_path(name)),
                "--kubeconfig", str(self.kubeconfig), "--role", role,
                "--control-socket", str(self._host_socket(name)),
            ]  # fmt: skip
        if name.startswith(KUBELET_PREFIX):
            node = name.removeprefix(KUBELET_PREFIX)
            sized = next(n for n in self.spec.nodes if n.name == node)
            return [
                py, "-m", "hami_sim.main", "kubelet", "--node-name", node,
                "--dir", str(self.kubelet_dir(node)), "--kubeconfig", str(self.kubeconfig), "--create-node",
                "--cpu", sized.cpu or self.spec.node_cpu, "--memory", sized.memory or self.spec.node_memory,
            ]  # fmt: skip
        if name.startswith(DAEMON_PREFIX):
            node = name.removeprefix(DAEMON_PREFIX)
            return [py, "-m", "hami_node.main", *daemon_argv(self._hosted(node), self.kubeconfig)]
        if name.startswith(VENDOR_PREFIX):
            node = name.removeprefix(VENDOR_PREFIX)
            return [py, "-m", "hami_sim.main", "vendor-plugin", *self._hosted(node).vendor_args]
        raise ClusterError(f"unknown component {name!r}")

    def _host_socket(self, host: str) -> Path:
        return self.run_dir / f"{host}.sock"

    def _node_process_names(self) -> list[str]:
        if self.spec.scale_mode:
            return self._hosts()
        return [f"{prefix}{n.name}" for n in self.spec.nodes for prefix in _node_parts(n)]

    def _launch(self, name: str, *, append: bool = False, port: int | None = None) -> Proc:
        proc = self.procs.get(name)
        if proc is None:
            log_name = name.replace("/", "-")
            proc = Proc(name, [], self.logs_dir / f"{log_name}.log")
            self.procs[name] = proc
        if port is not None:
            proc.port = port
        if self.spec.scale_mode and name in self._hosts()[1:]:
            # the ports the daemons have now (a host that took another port for one keeps it)
            write_host_spec(self._host_spec_path(name), self._host_spec(name))
        if name.startswith(DAEMON_PREFIX):
            proc.port = self.node_health_ports.get(name.removeprefix(DAEMON_PREFIX))
        proc.argv = self._argv(name)
        proc.start(append=append)
        self._save()
        return proc

    def _start_all(self) -> None:
        deadline = self._t0 + self.spec.up_timeout_s
        self._say(f"starting a local cluster: {self.spec.describe()}; state in {self.state_dir}")
        api = self._launch(APISERVER)
        self.apiserver_url = self._wait_marker(api, deadline).group(1)
        port = re.search(r":(\d+)$", self.apiserver_url)
        api.port = int(port.group(1)) if port else None
        self._save()
        self._say(f"apiserver ready at {self.apiserver_url}")
        # Everything else starts at once (start-up is mostly imports: CPU-bound, so overlap pays). The
        # scheduler needs the extender's URL up front: pick hami-control's port now.
        self.control_port = _free_port(self._taken_ports())
        if self.spec.control_replicas == 1:
            self._launch(CONTROL, port=self.control_port)
        else:
            for replica in self.control_replicas:
                self._launch(replica, port=_free_port(self._taken_ports()))
            self._launch(CONTROL_SERVICE, port=self.control_port)
        self._launch(SCHEDULER)
        if self.spec.nvidia_mode_nodes:
            self._launch(DEFAULT_SCHEDULER)
        if self.spec.dra_nodes:
            self._launch(CONTROLLER_MANAGER)
        if self.spec.scale_mode:
            mode = f"scale mode: {len(self._hosts())} processes for the nodes"
        else:
            mode = "one process per kubelet and per daemon"
        self._say(f"starting hami-control, the scheduler, kubelets and hami-node daemons ({mode})")
        for name in self._node_process_names():
            self._launch(name)
        self._wait_control_serving(deadline)
        self._wait_control_ready(deadline)
        replicas = self.spec.control_replicas
        self._say(
            f"hami-control serving on {self.control_url}"
            + (f" ({replicas} replicas, leader {self.leader()})" if replicas > 1 else "")
        )
        self._register_webhook()
        self._say(f"webhook {WEBHOOK_CONFIG_NAME} registered (failurePolicy Fail)")
        self._wait_marker(self.procs[SCHEDULER], deadline)
        self._say("scheduler ready")
        if self.spec.nvidia_mode_nodes:
            self._wait_marker(self.procs[DEFAULT_SCHEDULER], deadline)
            self._say(f"{DEFAULT_SCHEDULER} ready (pods of the nodes in NVIDIA's modes)")
        if self.spec.dra_nodes:
            self._wait_marker(self.procs[CONTROLLER_MANAGER], deadline)
            self._create_device_class()
            self._say(f"controller-manager ready; DeviceClass {dra.DEVICE_CLASS} created")
        self.wait_ready(deadline - time.monotonic())
        if self.spec.scale_mode and self.node_health_ports:
            for host in self._hosts()[1:]:
                self._wait_marker(self.procs[host], deadline)  # its control socket answers from then on
                self._read_host_ports(host)
        if self.spec.monitoring:
            self._start_prometheus(deadline)
        self._say(
            f"cluster up in {time.monotonic() - self._t0:.1f} s: {self.spec.describe()}; "
            f"kubeconfig {self.kubeconfig}"
        )

    def _control_target_ports(self) -> dict[str, int]:
        """Each hami-control replica's port (the one replica's is the control URL's)."""
        if self.spec.control_replicas == 1:
            return {CONTROL: self.control_port}
        return {r: p.port for r in self.control_replicas if (p := self.procs.get(r)) and p.port}

    def _start_prometheus(self, deadline: float) -> None:
        """Prometheus with the install's scrape setup and rules (monitoring.py), once every target runs."""
        try:
            monitoring.write_config(self.prometheus_dir, self.ca_file, self.spec.monitoring_interval_s)
        except monitoring.MonitoringError as exc:
            raise ClusterError(str(exc), component=PROMETHEUS) from None
        proc = self._launch(PROMETHEUS, port=_free_port(self._taken_ports()))
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._wait_marker(proc, deadline, only=True)
                break
            except ClusterError:
                # A port taken between the pick and Prometheus's bind: another one, as for the others.
                taken = "address already in use" in proc.new_output() and not proc.alive()
                if not taken or attempt + 1 == _PORT_ATTEMPTS:
                    raise
                self._say(f"port {proc.port} was taken meanwhile; {PROMETHEUS} tries another")
                proc = self._launch(PROMETHEUS, append=True, port=_free_port(self._taken_ports()))
        self._say(
            f"Prometheus at {self.prometheus_url} (scrapes and evaluates the rules every "
            f"{self.spec.monitoring_interval_s:g} s; its Alerts page shows the alerts)"
        )

    def _wait_control_serving(self, deadline: float) -> None:
        """Wait for hami-control's "serving" line (each replica's, then the proxy's); should a port have
        been taken meanwhile, pick another and start it again (and what has its port: the scheduler has
        the control URL, the proxy the replicas' ports)."""
        front = CONTROL if self.spec.control_replicas == 1 else CONTROL_SERVICE
        names = [r for r in self.control_replicas if r != CONTROL] + [front]
        for name in names:
            for attempt in range(3):
                proc = self.procs[name]
                try:
                    self._wait_marker(proc, deadline)
                    break
                except ClusterError as exc:
                    if (
                        exc.component != name
                        or "Address already in use" not in proc.new_output()
                        or attempt == 2
                    ):
                        raise
                port = _free_port(self._taken_ports())
                self._say(f"port {proc.port} was taken meanwhile; {name} tries {port}")
                if name == front:
                    stop_all([self.procs[SCHEDULER]], 5.0)
                    self.control_port = port
                    self._launch(name, append=True, port=port)
                    self._launch(SCHEDULER, append=True)
                else:
                    stop_all([self.procs[front]], 5.0)
                    self._launch(name, append=True, port=port)
                    self._launch(front, append=True)
        self._save()

    # --- waiting ----------------------------------------------------------------------------------

    def _taken_ports(self) -> set[int]:
        """Every port this cluster has given out (picked, perhaps not bound yet)."""
        ports = {p.port for p in self.procs.values() if p.port} | set(self.node_health_ports.values())
        return ports | {self.control_port}

    def _rebind_daemon(self, proc: Proc) -> bool:
        """A node daemon that exited because its health port was taken between the pick and its bind:
        start it again on another free port (at most `_PORT_ATTEMPTS` times a run), as hami-control is
        (`_wait_control_serving`). True when it was started again."""
        if not proc.name.startswith(DAEMON_PREFIX) or self._rebinds.get(proc.name, 0) >= _PORT_ATTEMPTS:
            return False
        output = proc.new_output()
        if PORT_IN_USE not in output or "--health-bind" not in output:
            return False
        node = proc.name.removeprefix(DAEMON_PREFIX)
        self._rebinds[proc.name] = self._rebinds.get(proc.name, 0) + 1
        old = self.node_health_ports[node]
        self.node_health_ports[node] = _free_port(self._taken_ports())
        self._say(f"port {old} was taken meanwhile; {proc.name} tries {self.node_health_ports[node]}")
        self._launch(proc.name, append=True)
        return True

    def _check_alive(self, what: str, procs: Sequence[Proc] | None = None) -> None:
        for proc in self.procs.values() if procs is None else procs:
            if not proc.alive() and not self._rebind_daemon(proc):
                raise ClusterError(
                    f"{proc.name} {proc.why_dead()} while waiting for {what}; last lines of {proc.log}:\n"
                    f"{proc.tail()}",
                    component=proc.name,
                )

    def _wait(
        self,
        condition: Callable[[], _T | None],
        deadline: float,
        what: str,
        culprit: str | None,
        max_delay: float = 0.25,
        *,
        alive: Sequence[Proc] | None = None,
    ) -> _T:
        """Poll `condition` until it is truthy; `ClusterError` at `deadline` or when one of `alive`
        (None: every component) is dead."""
        delay = 0.02
        while True:
            self._check_alive(what, alive)
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                message = f"timed out waiting for {what}"
                proc = self.procs.get(culprit or "")
                if proc is not None:
                    message += f"; last lines of {proc.log}:\n{proc.tail()}"
                raise ClusterError(message, component=culprit)
            time.sleep(delay)
            delay = min(delay * 2, max_delay)

    def _wait_marker(self, proc: Proc, deadline: float, *, only: bool = False) -> re.Match[str]:
        """Wait for `proc`'s ready line; `only`: fail when it dies (else when any component does)."""
        if proc.name.startswith(DAEMON_HOST):
            pattern = _READY[DAEMON_HOST]
        elif proc.name in self.control_replicas:
            pattern = _READY[CONTROL]
        else:
            pattern = _READY[proc.name if proc.name in _READY else proc.name.split("/")[0] + "/"]
        return self._wait(
            lambda: pattern.search(proc.new_output()),
            deadline,
            f"{proc.name} to start",
            proc.name,
            alive=[proc] if only else None,
        )

    def _wait_control_ready(self, deadline: float, replica: str | None = None) -> None:
        """Wait for /readyz (watch caches synced): of `replica` on its own port, or else of every
        replica and then, with several, for one to lead as the proxy on the control URL sees it."""
        names = [replica] if replica is not None else self.control_replicas
        with self._control_pool() as pool:

            def answers(url: str) -> bool:
                try:
                    return pool.request("GET", url, timeout=5.0, retries=False).status == 200
                except urllib3.exceptions.HTTPError:
                    return False

            for name in names:
                url = f"https://127.0.0.1:{self.procs[name].port}/readyz"
                what = f"{name} /readyz to answer 200"
                only = [self.procs[name]] if replica is not None else None
                self._wait(partial(answers, url), deadline, what, name, alive=only)
            if replica is None and self.spec.control_replicas > 1:
                url = self.control_url + service.LEADER_PATH
                what = f"a {CONTROL} replica to lead, through {CONTROL_SERVICE}"
                self._wait(lambda: answers(url), deadline, what, CONTROL_SERVICE)

    @contextmanager
    def _control_pool(self) -> Iterator[urllib3.PoolManager]:
        context = client_ssl_context(self.ca_file.read_bytes())
        with urllib3.PoolManager(ssl_context=context) as pool:
            yield pool

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every node is Ready with allocatable nvidia.com/gpu and hami-node's annotation,
        and hami-control's cache holds them all. `ClusterError` on timeout or a dead component."""
        deadline = time.monotonic() + timeout_s
        names = self.node_names
        # DRA nodes, nodes in NVIDIA's modes and nodes without NVIDIA GPUs never count in the extender's
        # NVIDIA cache
        cached = len(self.spec.hami_nodes)
        with urllib3.PoolManager() as api, self._control_pool() as control:

            def check() -> bool:
                nodes = self._node_statuses(api)
                ready = sum(n.ok for n in nodes or ())
                # /metrics lists every GPU: ask it only once the API server shows every node ready.
                seen = self._control_cache_nodes(control) if ready == len(names) else None
                cache = "" if seen is None else f"; in hami-control's cache: {seen}"
                self._say(f"nodes ready: {ready}/{len(names)}{cache}")
                return ready == len(names) and seen == cached

            culprit = KUBELET_HOST if self.spec.scale_mode else None
            # A node list of hundreds of nodes is big: poll it less often in a big cluster.
            max_delay = min(2.0, max(0.25, len(names) / 250))
            what = f"{len(names)} nodes to be Ready with {GPU_RESOURCE}"
            self._wait(check, deadline, what, culprit, max_delay)

    def _node_statuses(self, pool: urllib3.PoolManager) -> tuple[NodeStatus, ...] | None:
        try:
            response = pool.request("GET", self.apiserver_url + "/api/v1/nodes", timeout=10.0, retries=False)
        except urllib3.exceptions.HTTPError:
            return None
        if response.status != 200:
            return None
        by_name = {item["metadata"]["name"]: item for item in json.loads(response.data).get("items") or []}
        sliced = self._nodes_with_slices(pool) if self.spec.dra_nodes else set()
        dra_nodes = set(self.spec.dra_nodes)
        out = []
        for spec in self.spec.nodes:
            name = spec.name
            node = by_name.get(name) or {}
            status = node.get("status") or {}
            conditions = status.get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            allocatable = status.get("allocatable") or {}
            gpus = allocatable.get(GPU_RESOURCE)
            if name in dra_nodes:
                out.append(NodeStatus(name, ready, gpus, name in sliced, "dra"))
                continue
            if spec.nvidia_mode:
                # NVIDIA's plugins register one resource each (nvidia.com/gpu, nvidia.com/gpu.shared,
                # nvidia.com/mig-<profile>); no HAMi annotation.
                served = {
                    k: v for k, v in sorted(allocatable.items()) if k.startswith("nvidia.com/") and v != "0"
                }
                text = ",".join(f"{k.removeprefix('nvidia.com/')}={v}" for k, v in served.items()) or None
                out.append(NodeStatus(name, ready, text, bool(served), nvidia_mode=True))
                continue
            annotations = node.get("metadata", {}).get("annotations") or {}
            registered = bool(annotations.get(NODE_REGISTER)) if spec.gpus else True
            if spec.devices is not None:
                devices = spec.devices
                count = allocatable.get(devices.count_resource)
                register = devices.name(devices.table.register) if devices.table.register else ""
                registered = registered and count not in (None, "0")
                registered = registered and (not register or bool(annotations.get(register)))
                if not spec.gpus:
                    gpus = count
                out.append(
                    NodeStatus(name, ready, gpus, registered, vendor=devices.vendor, nvidia=bool(spec.gpus))
                )
                continue
            out.append(NodeStatus(name, ready, gpus, registered))
        if self.node_health_ports:
            out = [replace(n, metrics_url=self._metrics_url_or_none(n.name)) for n in out]
        return tuple(out)

    def _nodes_with_slices(self, pool: urllib3.PoolManager) -> set[str]:
        """Nodes whose hami-node published a ResourceSlice of our driver."""
        url = f"{self.apiserver_url}/apis/resource.k8s.io/v1/resourceslices"
        url += f"?fieldSelector=spec.driver={dra.DRIVER}"
        try:
            response = pool.request("GET", url, timeout=10.0, retries=False)
        except urllib3.exceptions.HTTPError:
            return set()
        if response.status != 200:
            return set()
        items = json.loads(response.data).get("items") or []
        return {
            str((i.get("spec") or {}).get("nodeName")) for i in items if (i.get("spec") or {}).get("devices")
        }

    def _create_device_class(self) -> None:
        """HAMi-DRA's DeviceClass and the MIG partitions' `mig.<driver>`, as `daemonset/overlays/dra`
        installs them (an existing one is kept)."""
        gpu_class: dict[str, Any] = {
            "apiVersion": dra.API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": dra.DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": dra.DEVICE_CLASS_SELECTOR}}]},
        }
        for body in (gpu_class, mig_device_class_self(dra.DRIVER)):
            with urllib3.PoolManager() as pool:
                response = pool.request(
                    "POST",
                    f"{self.apiserver_url}/apis/resource.k8s.io/v1/deviceclasses",
                    body=json.dumps(body),
                    headers={"Content-Type": "application/json"},
                    timeout=10.0,
                    retries=False,
                )
            if response.status not in (201, 409):
                name = (body.get("metadata") or {}).get("name")
                raise ClusterError(f"creating DeviceClass {name}: HTTP {response.status}: {response.data!r}")

    def _control_cache_nodes(self, pool: urllib3.PoolManager) -> int | None:
        try:
            response = pool.request("GET", self.control_url + "/metrics", timeout=10.0, retries=False)
        except urllib3.exceptions.HTTPError:
            return None
        if response.status != 200:
            return None
        found = re.search(
            r"^hami_scheduler_cache_nodes(?:\{\})? (\S+)$", response.data.decode(), re.MULTILINE
        )
        return int(float(found.group(1))) if found else None

    def _register_webhook(self) -> None:
        not_ignored = {"matchExpressions": [{"key": IGNORE_LABEL, "operator": "NotIn", "values": ["ignore"]}]}
        body: dict[str, Any] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIG_NAME},
            "webhooks": [
                {
                    "name": "vgpu.hami.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": self.control_url + "/webhook",
                        "caBundle": base64.b64encode(self.ca_file.read_bytes()).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "objectSelector": not_ignored,
                    "namespaceSelector": not_ignored,
                }
            ],
        }
        if self.spec.dra_nodes and len(self.spec.dra_nodes) < len(self.spec.nodes):
            # Mixed: namespaces labelled hami.io/dra=enabled go to /webhook/dra, the others to /webhook.
            dp_entry = body["webhooks"][0]
            dra_ns = {"key": DRA_NAMESPACE_LABEL, "operator": "In", "values": ["enabled"]}
            dp_entry["namespaceSelector"] = {
                "matchExpressions": [*not_ignored["matchExpressions"], {**dra_ns, "operator": "NotIn"}]
            }
            body["webhooks"].append(
                {
                    **dp_entry,
                    "name": "dra.vgpu.hami.io",
                    "sideEffects": "NoneOnDryRun",
                    "timeoutSeconds": 10,
                    "clientConfig": {**dp_entry["clientConfig"], "url": self.control_url + "/webhook/dra"},
                    "namespaceSelector": {"matchExpressions": [*not_ignored["matchExpressions"], dra_ns]},
                }
            )
        url = self.apiserver_url + "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        with urllib3.PoolManager() as pool:
            response = pool.request(
                "POST", url, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
                timeout=10.0, retries=False,
            )  # fmt: skip
        if response.status not in (200, 201):
            raise ClusterError(
                f"cannot register the MutatingWebhookConfiguration: {response.status} "
                f"{response.data[:300].decode(errors='replace')}",
                component=APISERVER,
            )

    # --- state file -------------------------------------------------------------------------------

    def _save(self) -> None:
        data = {
            "version": STATE_VERSION,
            "stateDir": str(self.state_dir),
            "runDir": str(self.run_dir),
            "kubeconfig": str(self.kubeconfig),
            "caFile": str(self.ca_file),
            "apiserverUrl": self.apiserver_url,
            "controlPort": self.control_port,
            "nodeHealthPorts": dict(self.node_health_ports),
            "components": {name: p.to_data() for name, p in self.procs.items()},
            "spec": self.spec.to_data(),
        }
        write_atomic(self.state_file, (json.dumps(data, indent=1) + "\n").encode())
        if self.spec.monitoring:
            control = self._control_target_ports()
            monitoring.write_targets(self.prometheus_dir, control, self.node_health_ports)

    @classmethod
    def load(
        cls, state_dir: str | os.PathLike[str] = ".hami-sim", *, progress: Callable[[str], None] | None = None
    ) -> Cluster:
        """The cluster recorded in `<state_dir>/cluster.json` (`NoCluster` when there is none)."""
        state = Path(state_dir).resolve()
        path = state / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise NoCluster(f"no cluster in {state} (no {STATE_FILE}; start one with hami-sim up)") from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from None
        try:
            if data.get("version") != STATE_VERSION:
                raise ClusterError(f"{path}: unknown version {data.get('version')!r}")
            cluster = cls(
                ClusterSpec.from_data(data["spec"]), state, run_dir=Path(data["runDir"]), progress=progress
            )
            cluster.apiserver_url = str(data.get("apiserverUrl") or "")
            cluster.control_port = int(data.get("controlPort") or 0)
            ports = data.get("nodeHealthPorts") or {}
            cluster.node_health_ports = {str(node): int(port) for node, port in ports.items()}
            cluster.procs = {name: Proc.from_data(name, p) for name, p in data["components"].items()}
        except (KeyError, TypeError, ValueError, SpecError) as exc:
            raise ClusterError(f"{path}: malformed ({exc})") from None
        return cluster

    # --- status -----------------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        components = tuple(
            ComponentStatus(name, p.pid, p.alive(), p.port, p.log) for name, p in self.procs.items()
        )
        nodes: tuple[NodeStatus, ...] | None = None
        seen: int | None = None
        if self.apiserver_url:
            with urllib3.PoolManager() as pool:
                nodes = self._node_statuses(pool)
        if self.control_port and self.ca_file.exists():
            with self._control_pool() as pool:
                seen = self._control_cache_nodes(pool)
        leader = None
        if self.spec.control_replicas > 1 and self.apiserver_url:
            with contextlib.suppress(ClusterError):
                leader = self.leader()
        return ClusterStatus(components, nodes, seen, leader)

    # --- leader election --------------------------------------------------------------------------

    def lease(self) -> tuple[str, str]:
        """(namespace, name) of the Lease the hami-control replicas elect their leader with."""
        namespace, name = LEASE_NAMESPACE, CONTROL
        args = list(self.spec.control_args)
        for i, arg in enumerate(args):  # the last one given wins, as in hami-control's flag parsing
            for flag in ("--leader-elect-namespace", "--leader-elect-lease"):
                value = arg.removeprefix(flag + "=") if arg.startswith(flag + "=") else None
                if arg == flag and i + 1 < len(args):
                    value = args[i + 1]
                if value is not None and flag.endswith("namespace"):
                    namespace = value
                elif value is not None:
                    name = value
        return namespace, name

    def leader(self) -> str:
        """The hami-control replica the leader Lease names (`hami-control-<i>`; with one replica,
        `hami-control`). The Lease may still name a replica that died until another takes it over
        (`wait_leader`). `ClusterError` when no replica holds it."""
        if self.spec.control_replicas == 1:
            return CONTROL
        namespace, name = self.lease()
        url = f"{self.apiserver_url}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        try:
            with urllib3.PoolManager() as pool:
                response = pool.request("GET", url, timeout=10.0, retries=False)
        except urllib3.exceptions.HTTPError as exc:
            message = f"cannot read the Lease {namespace}/{name}: {exc}"
            raise ClusterError(message, component=APISERVER) from None
        holder = ""
        if response.status == 200:
            holder = str((json.loads(response.data).get("spec") or {}).get("holderIdentity") or "")
        elif response.status != 404:
            raise ClusterError(f"reading the Lease {namespace}/{name}: HTTP {response.status}")
        replica = holder.rsplit("_", 1)[0]  # <pod name>_<random suffix> (default_identity)
        if replica not in self.control_replicas:
            raise ClusterError(f"no {CONTROL} replica holds the Lease {namespace}/{name} (holder {holder!r})")
        return replica

    def wait_leader(self, timeout_s: float = 60.0, *, other_than: str | None = None) -> str:
        """Wait until a running replica (not `other_than`) holds the Lease and answers the extender
        (/readyz/extender 200), and return it."""
        deadline = time.monotonic() + timeout_s
        with self._control_pool() as pool:

            def leading() -> str | None:
                try:
                    name = self.leader()
                except ClusterError:
                    return None
                if name == other_than or not self.procs[name].alive():
                    return None
                url = f"https://127.0.0.1:{self.procs[name].port}{service.LEADER_PATH}"
                try:
                    ok = pool.request("GET", url, timeout=5.0, retries=False).status == 200
                except urllib3.exceptions.HTTPError:
                    return None
                return name if ok else None

            what = f"a {CONTROL} replica{f' other than {other_than}' if other_than else ''} to lead"
            return self._wait(leading, deadline, what, None, alive=())

    # --- restart ----------------------------------------------------------------------------------

    def _resolve(self, component: str) -> str:
        """`hami-control` with several replicas is the current leader; any other name stays."""
        if component == CONTROL and self.spec.control_replicas > 1:
            return self.leader()
        return component

    def _proc_for(self, component: str) -> tuple[Proc, str | None]:
        """The process that runs `component`, and the node to command in it (scale mode), if any."""
        if component in self.procs:
            return self.procs[component], None
        found = self._host_of(component) if self.spec.scale_mode else None
        if found is not None and found[0] in self.procs:
            return self.procs[found[0]], found[1]
        raise ClusterError(f"no component {component!r}; the components are: {', '.join(self.components)}")

    def stop_component(self, component: str, *, grace_s: float = 10.0) -> None:
        """Stop one component (SIGTERM, SIGKILL after `grace_s`); in scale mode a node's kubelet or
        hami-node is stopped inside its host process."""
        component = self._resolve(component)
        proc, node = self._proc_for(component)
        if component == APISERVER:
            raise ClusterError("the apiserver holds the whole cluster in memory: stop it with down")
        if node is not None:
            self._host_command(proc, f"stop {node}")
            return
        stop_all([proc], grace_s)

    def start_component(self, component: str, *, timeout_s: float = 60.0) -> None:
        """Start a stopped component again and wait until it is up (hami-control: serving and ready, on
        the port it had; with several replicas, `hami-control-<i>` serving and ready on its own port)."""
        component = self._resolve(component)
        proc, node = self._proc_for(component)
        if node is not None:
            self._host_command(proc, f"start {node}")
            return
        if proc.alive():
            raise ClusterError(
                f"{component} is running (pid {proc.pid}); restart it instead", component=component
            )
        if component == APISERVER:
            raise ClusterError("the apiserver holds the whole cluster in memory: start a new cluster with up")
        deadline = time.monotonic() + timeout_s
        self._launch(component, append=True)
        self._wait_marker(proc, deadline, only=True)
        if self.spec.scale_mode and component in self._hosts()[1:] and self.node_health_ports:
            self._read_host_ports(component)
        if component in self.control_replicas:
            self._wait_control_ready(deadline, component)

    def restart(self, component: str, *, grace_s: float = 10.0, timeout_s: float = 60.0) -> None:
        """Stop and start one component: `hami-control`, `scheduler`, `kubelet/<node>`, `hami-node/<node>`
        (in scale mode also the hosts `kubelets` and `hami-nodes`), `hami-control-<i>` and
        `control-service` with several replicas. The apiserver cannot restart."""
        component = self._resolve(component)
        proc, node = self._proc_for(component)
        if component == APISERVER:
            raise ClusterError("the apiserver holds the whole cluster in memory: it cannot be restarted")
        if node is not None:
            self._host_command(proc, f"restart {node}", timeout_s)
            return
        stop_all([proc], grace_s)
        self.start_component(component, timeout_s=timeout_s)

    def kill(self, component: str, sig: signal.Signals = signal.SIGKILL, *, timeout_s: float = 10.0) -> None:
        """Send `sig` (default SIGKILL: no grace, no last writes) to a component and, for a signal that
        ends a process, wait until it is gone; `start_component` brings it back. `hami-control` is the
        leader when there are several replicas. In scale mode a node's `kubelet/<node>` or
        `hami-node/<node>` is dropped inside its host as abruptly as an in-process part can be
        (hami_sim.nodehost: `kill`; only SIGKILL). The apiserver cannot be killed (it holds the cluster)."""
        component = self._resolve(component)
        proc, node = self._proc_for(component)
        if component == APISERVER:
            raise ClusterError("the apiserver holds the whole cluster in memory: it cannot be killed")
        if node is not None:
            if sig != signal.SIGKILL:
                raise ClusterError(f"{component} runs inside {proc.name}: only SIGKILL can drop it")
            self._host_command(proc, f"kill {node}", timeout_s)
            return
        if not proc.alive():
            raise ClusterError(f"{component} is not running", component=component)
        proc.signal(sig)
        if sig in _SIGNALS_THAT_END and not proc.wait_gone(timeout_s):
            raise ClusterError(
                f"{component} (pid {proc.pid}) still runs {timeout_s:g} s after {sig.name}",
                component=component,
            )

    def _host_command(self, host: Proc, command: str, timeout_s: float = 60.0) -> str:
        try:
            answer = host_command(self._host_socket(host.name), command, timeout_s)
        except OSError as exc:
            raise ClusterError(
                f"{host.name} does not answer {command!r}: {exc}", component=host.name
            ) from None
        if answer != "ok" and not (command == "ports" and answer.startswith("{")):
            raise ClusterError(f"{host.name}: {command}: {answer}", component=host.name)
        if (
            command.startswith(("start ", "restart "))
            and host.name != KUBELET_HOST
            and self.node_health_ports
        ):
            self._read_host_ports(host.name)
        return answer

    def _read_host_ports(self, host: str) -> None:
        """Record the health ports the daemons of a scale-mode host listen on: the picked ones, or where a
        port was taken meanwhile, the one the host took instead (hami_sim.nodehost: `ports`)."""
        answer = self._host_command(self.procs[host], "ports")
        try:
            ports = {str(node): int(port) for node, port in json.loads(answer).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise ClusterError(
                f"{host}: ports: unexpected answer {answer[:200]!r} ({exc})", component=host
            ) from None
        changed = {
            n: p for n, p in ports.items() if n in self.node_health_ports and self.node_health_ports[n] != p
        }
        if changed:
            self.node_health_ports.update(changed)
            self._save()

    # --- down -------------------------------------------------------------------------------------

    def down(self, grace_s: float = 10.0) -> list[str]:
        """Stop every component (SIGTERM, SIGKILL after `grace_s`) and remove the sockets, the socket
        directory and the state files (the logs stay). Returns the components that needed SIGKILL."""
        killed = self._stop_everything(grace_s)
        self._say("cluster down" + (f" (killed after {grace_s:g} s: {', '.join(killed)})" if killed else ""))
        return killed

    def _stop_everything(self, grace_s: float) -> list[str]:
        killed: list[str] = []
        for stage in _STOP_ORDER:
            procs = [p for part in stage for p in self._stage_procs(part)]
            grace = grace_s
            if self.spec.scale_mode and ("daemons" in stage or "kubelets" in stage):
                grace += 0.02 * len(self.spec.nodes)  # a host stops hundreds of parts
            killed += stop_all(procs, grace)
        rest = [p for p in self.procs.values() if p.alive()]  # none, unless a name was not staged
        killed += stop_all(rest, grace_s)
        left = [f"{p.name} (pid {p.pid})" for p in self.procs.values() if p.alive()]
        if left:
            raise ClusterError(f"still running after SIGKILL: {', '.join(left)}")
        self._remove_files()
        return killed

    def _stage_procs(self, part: str) -> list[Proc]:
        if part == "daemons":
            return [
                p for n, p in self.procs.items() if n.startswith((DAEMON_PREFIX, DAEMON_HOST, VENDOR_PREFIX))
            ]
        if part == "controls":
            return [p for n, p in self.procs.items() if n in self.control_replicas or n == CONTROL_SERVICE]
        if part == "kubelets":
            return [p for n, p in self.procs.items() if n.startswith(KUBELET_PREFIX) or n == KUBELET_HOST]
        return [self.procs[part]] if part in self.procs else []

    def _remove_files(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for sub in ("nodes", "tls", "prometheus"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        for path in (
            self.state_file,
            self.kubeconfig,
            self.ca_file,
            self.state_dir / "scheduler-config.yaml",
            self.state_dir / DEFAULT_SCHEDULER_CONFIG,
        ):
            path.unlink(missing_ok=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()


def _node_parts(node: NodeSpec) -> tuple[str, ...]:
    """The per-node components of `node`: its kubelet, hami-node when it has NVIDIA GPUs, its vendor's
    device-plugin stand-in when it has other devices."""
    return (
        KUBELET_PREFIX,
        *((DAEMON_PREFIX,) if node.gpus else ()),
        *((VENDOR_PREFIX,) if node.devices is not None else ()),
    )


_DEFAULT_SCHEDULER_CONFIG = b"""\
# The cluster's own kube-scheduler beside HAMi's (hami-sim: nodes in NVIDIA's modes): profile
# default-scheduler, no extender. Pods asking NVIDIA's resources keep schedulerName default-scheduler
# (hami-control's webhook leaves them alone) and NodeResourcesFit places them from Node allocatable.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
"""


def _node_config(node: NodeSpec) -> bytes:
    """HAMi's node config for `node` (hami-node --config-file): `nodeconfig: [{name, operatingmode}]`."""
    import yaml

    data = {"nodeconfig": [{"name": node.name, "operatingmode": node.operating_mode}]}
    text: str = yaml.safe_dump(data, sort_keys=False)
    return text.encode()


def vendor_scheduler_config() -> bytes:
    """daemonset/scheduler's KubeSchedulerConfiguration with every vendor's resources (hami-control's
    device registry, Ascend and Iluvatar included) among the extender's managed resources, ignored by
    kube-scheduler's own fit, as HAMi's chart lists them: without them kube-scheduler never asks the
    extender about a vendor pod and refuses it for resources (`hygon.com/dcumem`) no Node lists."""
    import yaml

    from hami_control.devices.config import load_device_config
    from hami_control.devices.registry import RegistryOptions, build_registry

    data = yaml.safe_load(default_scheduler_config().read_text(encoding="utf-8"))
    registry = build_registry(
        load_device_config(None, lambda p: p.read_text(encoding="utf-8")),
        RegistryOptions(enable_ascend=True, enable_iluvatar=True),
    )
    for extender in data.get("extenders") or []:
        managed = extender.setdefault("managedResources", [])
        listed = {m.get("name") for m in managed}
        for resource in registry.resources():
            if resource not in listed:
                managed.append({"name": resource, "ignoredByScheduler": True})
    text: str = yaml.safe_dump(data, sort_keys=False)
    return text.encode()


def _free_port(taken: set[int] | None = None) -> int:
    """A loopback TCP port free right now (the kernel's pick), none of `taken`."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in (taken or ()):
            return port


def _inventory_gpu(inventory: Inventory, node: str, index: int | None) -> FakeGpu:
    found = next((g for g in inventory.gpus if g.index == index), None)
    if found is None:
        indexes = ", ".join(str(g.index) for g in inventory.gpus)
        raise ClusterError(f"gpu_index: node {node} has no GPU with index {index!r} (it has {indexes})")
    return found


def _write_private(path: Path, data: bytes) -> None:
    write_atomic(path, data, mode=0o600)
