"""`hami-sim nodes`: the kubelet stand-ins and node daemons of many nodes in one process, the local
cluster's scale mode.

One process per kubelet and per node daemon costs about 60 MiB and a second of start-up each; at
hundreds of nodes that is too much for a laptop. The host runs the very same objects instead:

- one `hami_sim.kubelet.Kubelet` per node, all on one asyncio loop sharing one `kubernetes.aio`
  client (its connection pool sized for one pod watch per node);
- one `hami_node.main.start_daemon(config)` per node, each with the `NodeConfig` that `load_config`
  builds from the same flags `hami-node` gets as a process (`daemon_argv`), each with its own gRPC
  server on its own Unix socket. Daemons are thread-based: they are started and stopped on a thread
  pool so the loop keeps answering kubelet Registration meanwhile.

One thing differs, on Linux: watchdog's `Observer` takes an inotify instance of its own, and a node
daemon makes two (the fake GPU inventory's watch and the kubelet directory's), while the kernel allows
128 instances per user (fs.inotify.max_user_instances) - some 60 daemons. The host therefore gives each
daemon (`start_daemon(config, observer_factory=...)`, the daemon's seam for it) observers of the same
inotify emitters sharing a few instances of the process (`shared_inotify_observers`): same events, at
most 8 instances.

`--role` picks what the process hosts: `kubelets`, `daemons` or `all`. The local cluster runs two
hosts (one per role), so a kubelet and its node daemon still talk gRPC across processes.

A node of another vendor (hami_sim.vendors) has its device-plugin stand-in (`vendorArgs`: the flags of
`hami-sim vendor-plugin`) among the daemons, on the host's loop with one API client shared by all the
stand-ins, and a hami-node daemon only when it also has NVIDIA GPUs (`daemon: false` otherwise).

The spec file (JSON or YAML; `write_host_spec` writes it) lists the nodes:

```yaml
kubeconfig: /path/kubeconfig          # optional; --kubeconfig wins
cpu: "8"                              # capacity of the Nodes the kubelets create (optional)
memory: 32Gi
pods: "110"
nodes:
  - name: gpu-node-1
    kubeletDir: /tmp/hami-sim-0a1b2c3d4e/1      # keep <dir>/pod-resources/kubelet.sock under 100 bytes
    nodeArgs: [--gpu-backend, fake, --fake-inventory, /path/gpus.yaml, --device-split-count, "10"]
  - name: dcu-1
    kubeletDir: /tmp/hami-sim-0a1b2c3d4e/2
    daemon: false                               # no hami-node: no NVIDIA GPUs
    vendorArgs: [--node-name, dcu-1, --kubelet-dir, /tmp/hami-sim-0a1b2c3d4e/2, --vendor, hygon]
```

With `--control-socket PATH` the host answers one-line commands on a Unix socket: `stop NODE`,
`start NODE`, `restart NODE` (this host's parts of that node; a restart is a stop and a fresh start, as
a process restart would be), `kill NODE`, `ping` and `ports`. The answer is `ok` or `error: <why>`;
`ports` answers a JSON object of the port each running node daemon's health endpoint (/metrics,
/healthz, /readyz; `--health-bind` in its `nodeArgs`) listens on. `host_command` sends one.

Health ports: each daemon binds the port its flags give. Should that port have been taken between the
pick and the bind, the daemon takes a free port of the kernel's instead (logged; `ports` tells it), and
keeps that port across its restarts in this host. A daemon's endpoint costs one mostly idle thread: 250
took 0.6% of a core and 5 MiB together.

`kill NODE` drops this host's parts of the node as close to a crash (SIGKILL) as an in-process part can
get: a node daemon's Kubernetes client is closed first, so its last writes (the pod tracker's queued
bind-phase patches, the reporter's) never reach the API server, then its threads and sockets are
stopped; a kubelet stand-in stops with its queued Events dropped. What a real crash would leave behind
and this does not: the Unix socket files (they are removed) and half-done work of other threads. `start
NODE` brings them back.

SIGTERM/SIGINT stop every hosted part (daemons first flush their last patches) and exit 0. SIGUSR1
writes every thread's stack to the log (faulthandler), for a host that seems stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import faulthandler
import functools
import gc
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hami_api.settings import DNS_SUBDOMAIN
from hami_node.durable import write_atomic
from hami_node.ports import ObserverFactory

log = logging.getLogger("hami_sim.nodehost")

READY_MARKER = "hami-sim nodes ready"
"""What the host logs once every hosted part has started (the local cluster waits for it)."""

_MAX_SOCKET_PATH = 100
KUBELET_LONGEST_SOCKET = Path("plugins_registry", "hami-core-gpu.project-hami.io-reg.sock")
"""The longest socket path under a kubelet stand-in's directory, relative to it: a DRA-mode node daemon's
registration socket (`<registry dir>/<driver>-reg.sock`, hami_api.dra.DRIVER), longer than the
PodResources socket (`pod-resources/kubelet.sock`); spelled out here so that a host of node daemons does
not import the kubelet stand-in."""
_START_CONCURRENCY = 2
"""Node daemons started at once. Starting is CPU-bound under one GIL shared with every daemon already
running: 300 daemons were all registered after 28 s with 2, 41 s with 4, 69 s with 8 and 171 s with 16
(more at once only adds contention and registration timeouts)."""
_GC_THRESHOLD = 50_000
_KUBELET_CONCURRENCY = 32
"""Kubelet stand-ins started at once (asyncio, cheap)."""
_STOP_CONCURRENCY = 32
_OBSERVER_TIMEOUT_S = 10.0
_INOTIFY_INSTANCES = 8
_PORT_IN_USE = "Address already in use"
_T = TypeVar("_T")


class SpecError(ValueError):
    """A bad host spec; the message names the file, the entry and the field."""


class Role(StrEnum):
    ALL = "all"
    KUBELETS = "kubelets"
    DAEMONS = "daemons"

    @property
    def kubelets(self) -> bool:
        return self is not Role.DAEMONS

    @property
    def daemons(self) -> bool:
        return self is not Role.KUBELETS


@dataclass(frozen=True)
class HostedNode:
    """One node: its name, its kubelet directory (plays /var/lib/kubelet/device-plugins) and the
    hami-node flags besides the three the host adds (`--node-name`, `--kubelet-dir`, `--kubeconfig`)."""

    name: str
    kubelet_dir: Path
    node_args: tuple[str, ...] = ()
    daemon: bool = True
    """Whether the node runs a hami-node daemon (a node of another vendor without NVIDIA GPUs does not)."""
    vendor_args: tuple[str, ...] = ()
    """`hami-sim vendor-plugin` flags of the node's vendor device-plugin stand-in (none: no stand-in)."""


@dataclass(frozen=True)
class HostSpec:
    nodes: tuple[HostedNode, ...]
    kubeconfig: Path | None = None
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, node in enumerate(self.nodes):
            where = f"nodes[{i}]"
            if not DNS_SUBDOMAIN.fullmatch(node.name) or len(node.name) > 253:
                raise SpecError(f"{where}.name: expected a DNS subdomain (a Node name), got {node.name!r}")
            if node.name in seen:
                raise SpecError(f"{where}.name: node {node.name!r} is listed twice")
            seen.add(node.name)
            sock = node.kubelet_dir / KUBELET_LONGEST_SOCKET
            if not node.kubelet_dir.is_absolute():
                raise SpecError(
                    f"{where}.kubeletDir: expected an absolute path, got {str(node.kubelet_dir)!r}"
                )
            if len(str(sock)) > _MAX_SOCKET_PATH:
                raise SpecError(
                    f"{where}.kubeletDir: {str(node.kubelet_dir)!r} is too long for Unix sockets "
                    f"(keep {sock} under {_MAX_SOCKET_PATH} bytes)"
                )


def daemon_argv(node: HostedNode, kubeconfig: Path) -> list[str]:
    """The `hami-node` command line of one node: what a separate process gets, and what the host
    passes to `load_config`."""
    from hami_sim.kubelet.config import POD_RESOURCES_DIR, POD_RESOURCES_SOCKET

    return [
        "--node-name",
        node.name,
        "--kubelet-dir",
        str(node.kubelet_dir),
        "--kubeconfig",
        str(kubeconfig),
        # where the kubelet stand-in serves its PodResources API (`KubeletConfig.pod_resources_socket`)
        "--pod-resources-socket",
        str(node.kubelet_dir / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET),
        *node.node_args,
    ]


# --- the spec file -------------------------------------------------------------------------------


def _string(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError(f"{where}: expected a string, got {value!r}")
    return str(value)


def parse_host_spec(data: object, source: str = "<spec>") -> HostSpec:
    """A `HostSpec` from decoded JSON/YAML; `SpecError` names `source` and the bad field."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: expected a mapping with a `nodes` list, got {type(data).__name__}")
    unknown = sorted(set(data) - {"kubeconfig", "cpu", "memory", "pods", "nodes"})
    if unknown:
        raise SpecError(f"{source}: unknown key {unknown[0]!r}")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise SpecError(f"{source}: nodes: expected a non-empty list, got {raw_nodes!r}")
    nodes: list[HostedNode] = []
    for i, raw in enumerate(raw_nodes):
        where = f"{source}: nodes[{i}]"
        if not isinstance(raw, Mapping):
            raise SpecError(f"{where}: expected a mapping, got {raw!r}")
        extra = sorted(set(raw) - {"name", "kubeletDir", "nodeArgs", "daemon", "vendorArgs"})
        if extra:
            raise SpecError(f"{where}: unknown key {extra[0]!r}")
        args = raw.get("nodeArgs", [])
        if not isinstance(args, list):
            raise SpecError(f"{where}.nodeArgs: expected a list of strings, got {args!r}")
        vendor_args = raw.get("vendorArgs", [])
        if not isinstance(vendor_args, list):
            raise SpecError(f"{where}.vendorArgs: expected a list of strings, got {vendor_args!r}")
        daemon = raw.get("daemon", True)
        if not isinstance(daemon, bool):
            raise SpecError(f"{where}.daemon: expected true or false, got {daemon!r}")
        nodes.append(
            HostedNode(
                name=_string(raw.get("name"), f"{where}.name"),
                kubelet_dir=Path(_string(raw.get("kubeletDir"), f"{where}.kubeletDir")),
                node_args=tuple(_string(a, f"{where}.nodeArgs[{j}]") for j, a in enumerate(args)),
                daemon=daemon,
                vendor_args=tuple(_string(a, f"{where}.vendorArgs[{j}]") for j, a in enumerate(vendor_args)),
            )
        )
    kubeconfig = data.get("kubeconfig")
    try:
        return HostSpec(
            nodes=tuple(nodes),
            kubeconfig=Path(_string(kubeconfig, f"{source}: kubeconfig")) if kubeconfig is not None else None,
            cpu=_string(data.get("cpu", "8"), f"{source}: cpu"),
            memory=_string(data.get("memory", "32Gi"), f"{source}: memory"),
            pods=_string(data.get("pods", "110"), f"{source}: pods"),
        )
    except SpecError as exc:
        message = str(exc)
        raise SpecError(message if message.startswith(source) else f"{source}: {message}") from None


def load_host_spec(path: Path) -> HostSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read the spec {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return parse_host_spec(data, str(path))


def host_spec_data(spec: HostSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    if spec.kubeconfig is not None:
        data["kubeconfig"] = str(spec.kubeconfig)
    data["nodes"] = [
        {
            "name": n.name,
            "kubeletDir": str(n.kubelet_dir),
            "nodeArgs": list(n.node_args),
            **({} if n.daemon else {"daemon": False}),
            **({"vendorArgs": list(n.vendor_args)} if n.vendor_args else {}),
        }
        for n in spec.nodes
    ]
    return data


def write_host_spec(path: Path, spec: HostSpec) -> None:
    """Write the spec as JSON (atomically and durably: `hami_node.durable.write_atomic`)."""
    write_atomic(path, json.dumps(host_spec_data(spec), indent=1) + "\n", mode=0o644)


# --- inotify --------------------------------------------------------------------------------------


def shared_inotify_observers() -> ObserverFactory | None:
    """Observers for the node daemons of this process that share a few inotify instances (see the
    module docstring); None off Linux (watchdog's own observers then)."""
    if not sys.platform.startswith("linux"):
        return None
    from watchdog.observers.api import BaseObserver
    from watchdog.observers.inotify import InotifyEmitter
    from watchdog.observers.inotify_c import InotifyFD

    instances: list[InotifyFD] = []
    lock = threading.Lock()
    made = itertools.count()

    def next_instance() -> InotifyFD:
        """Round robin over up to `_INOTIFY_INSTANCES` instances: each has one lock that every watch
        added or removed takes, and hundreds of daemons stopping at once queue on it."""
        with lock:
            n = next(made)
            if len(instances) < _INOTIFY_INSTANCES:
                instance = InotifyFD()
                instance.start()
                instances.append(instance)
            return instances[n % len(instances)]

    class SharedInotifyObserver(BaseObserver):
        """watchdog's InotifyObserver, but its emitters use one of the process's shared inotify
        instances instead of one of its own. Its threads wait up to `timeout` for an event before
        looking whether they should stop (events and stop() wake them at once): 10 s rather than
        watchdog's 1 s, because hundreds of daemons' idle wake-ups fight over one GIL."""

        def __init__(self, *, timeout: float = _OBSERVER_TIMEOUT_S) -> None:
            super().__init__(InotifyEmitter, timeout=timeout, inotify_fd=next_instance())

    return SharedInotifyObserver


# --- the host ------------------------------------------------------------------------------------


class HostError(Exception):
    """A hosted part could not be started or stopped (the message names the node)."""


def _read_file(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def process_stats() -> tuple[int, float]:
    """(threads, RSS MiB) of this process, from /proc (Linux; (0, 0.0) elsewhere)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0, 0.0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    threads = int(fields.get("Threads", "0").strip() or 0)
    rss_kib = int((fields.get("VmRSS", "0 kB").split() or ["0"])[0])
    return threads, rss_kib / 1024


class NodeHost:
    """The hosted parts of every node of `spec`, on the caller's loop: `await start()`, commands,
    `await stop()`. Daemons start `concurrency` at a time on a thread pool (they are thread-based and
    block), so the loop keeps serving the kubelets meanwhile; they stop many at a time."""

    def __init__(
        self,
        spec: HostSpec,
        kubeconfig: Path,
        role: Role = Role.ALL,
        *,
        concurrency: int = _START_CONCURRENCY,
    ) -> None:
        self.spec = spec
        self.kubeconfig = kubeconfig
        self.role = role
        self._nodes = {n.name: n for n in spec.nodes}
        self._concurrency = max(1, concurrency)
        self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="hami-nodehost")
        self._api: Any = None
        self._observers: ObserverFactory | None = None
        self._kubelets: dict[str, Any] = {}
        self._daemons: dict[str, Any] = {}
        self._vendors: dict[str, Any] = {}
        """Running vendor device-plugin stand-ins (`hami_sim.vendors.plugin.VendorPlugin`) by node name."""
        self._vendor_api: Any = None
        self._health_ports: dict[str, int] = {}
        """The port each daemon's health endpoint took (kept across its restarts in this host)."""
        self._node_locks = {name: asyncio.Lock() for name in self._nodes}

    @property
    def kubelets(self) -> Mapping[str, Any]:
        """Running kubelet stand-ins by node name."""
        return self._kubelets

    @property
    def daemons(self) -> Mapping[str, Any]:
        """Running node daemons (`hami_node.main.NodeDaemon`) by node name."""
        return self._daemons

    @property
    def vendors(self) -> Mapping[str, Any]:
        """Running vendor device-plugin stand-ins by node name."""
        return self._vendors

    async def start(self) -> None:
        """Start every hosted part (kubelets first, so daemons find kubelet.sock); on any failure stop
        what started and raise `HostError`."""
        if self._observers is None:
            self._observers = shared_inotify_observers()
        try:
            if self.role.kubelets:
                self._api = await self._shared_client()
                await self._each(self._start_kubelet, concurrency=_KUBELET_CONCURRENCY)
            if self.role.daemons:
                await self._each(self._start_daemon, names=[n for n, h in self._nodes.items() if h.daemon])
                vendor_nodes = [n for n, h in self._nodes.items() if h.vendor_args]
                await self._each(self._start_vendor, names=vendor_nodes, concurrency=_KUBELET_CONCURRENCY)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every hosted part (daemons first); never raises for one part failing to stop.

        A daemon's stop mostly waits (its health loop wakes within 0.5 s), so many stop at once."""
        vendors = list(self._vendors)
        await self._each(self._stop_vendor, names=vendors, strict=False, concurrency=_STOP_CONCURRENCY)
        if self._vendor_api is not None:
            await self._vendor_api.close()
            self._vendor_api = None
        daemons = list(self._daemons)
        if daemons:
            stopping = min(_STOP_CONCURRENCY, len(daemons))
            with ThreadPoolExecutor(stopping, thread_name_prefix="hami-nodehost-stop") as pool:
                stop = functools.partial(self._stop_daemon, pool=pool)
                await self._each(stop, names=daemons, strict=False, concurrency=stopping)
        kubelets = list(self._kubelets)
        await self._each(self._stop_kubelet, names=kubelets, strict=False, concurrency=_KUBELET_CONCURRENCY)
        if self._api is not None:
            await self._api.close()
            self._api = None
        self._pool.shutdown(wait=True)

    async def command(self, line: str) -> str:
        """Run one control command (`stop|start|restart NODE`, `ping`); returns `ok` or `error: ...`."""
        words = line.split()
        if words == ["ping"]:
            return "ok"
        if words == ["ports"]:
            return json.dumps({n: self._health_ports[n] for n in self._daemons if n in self._health_ports})
        if len(words) != 2 or words[0] not in ("stop", "start", "restart", "kill"):
            return (
                f"error: unknown command {line.strip()!r} (expected stop|start|restart|kill NODE, ping or "
                "ports)"
            )
        verb, name = words
        if name not in self._nodes:
            return f"error: no node {name!r} in this host"
        try:
            async with self._node_locks[name]:
                if verb == "kill" and not await self._kill_node(name):
                    return f"error: node {name}: nothing of it runs in this host"
                if verb in ("stop", "restart"):
                    await self._stop_node(name)
                if verb in ("start", "restart"):
                    await self._start_node(name)
        except HostError as exc:
            return f"error: {exc}"
        return "ok"

    async def _stop_node(self, name: str) -> None:
        if self.role.daemons:
            await self._stop_vendor(name)
            await self._stop_daemon(name)
        if self.role.kubelets:
            await self._stop_kubelet(name)

    async def _kill_node(self, name: str) -> bool:
        """Drop this host's parts of the node abruptly (see `kill NODE`); False when none runs."""
        killed = False
        if self.role.daemons and (vendor := self._vendors.pop(name, None)) is not None:
            log.warning("node %s: killing the vendor device-plugin stand-in", name)
            await vendor.stop()
            killed = True
        if self.role.daemons and (daemon := self._daemons.pop(name, None)) is not None:
            log.warning("node %s: killing the node daemon (no last writes)", name)
            await self._in_pool(functools.partial(_crash_daemon, daemon))
            killed = True
        if self.role.kubelets and (kubelet := self._kubelets.pop(name, None)) is not None:
            log.warning("node %s: killing the kubelet stand-in (queued Events dropped)", name)
            await kubelet.stop(abrupt=True)
            killed = True
        return killed

    async def _start_node(self, name: str) -> None:
        if self.role.kubelets and name not in self._kubelets:
            await self._start_kubelet(name)
        if self.role.daemons and name not in self._daemons and self._nodes[name].daemon:
            await self._start_daemon(name)
        if self.role.daemons and name not in self._vendors and self._nodes[name].vendor_args:
            await self._start_vendor(name)

    async def _each(
        self,
        action: Callable[[str], Awaitable[None]],
        *,
        names: Sequence[str] | None = None,
        strict: bool = True,
        concurrency: int | None = None,
    ) -> None:
        """`action` for every node, at most `concurrency` at a time; raises the first error if `strict`."""
        gate = asyncio.Semaphore(concurrency or self._concurrency)

        async def one(name: str) -> None:
            async with gate:
                await action(name)

        results = await asyncio.gather(
            *(one(n) for n in (self._nodes if names is None else names)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors[1:] if strict else errors:
            log.error("%s", error, exc_info=not isinstance(error, HostError))
        if strict and errors:
            raise errors[0]

    async def _shared_client(self) -> Any:
        from hami_kube.client import KubeApi, component_user_agent
        from hami_kube.errors import KubeConfigError
        from hami_sim.kubelet.standin import KUBE_API_BURST, KUBE_API_QPS, USER_AGENT_COMPONENT

        nodes = len(self._nodes)
        try:
            # Each kubelet holds one pod watch open; leave room for status patches and events. Each
            # kubelet has its own rate limit: the shared client has all of theirs together.
            return await KubeApi.connect(
                self.kubeconfig,
                max_connections=2 * nodes + 32,
                qps=KUBE_API_QPS * max(nodes, 1),
                burst=KUBE_API_BURST * max(nodes, 1),
                user_agent=component_user_agent(USER_AGENT_COMPONENT),
            )
        except KubeConfigError as exc:
            raise HostError(f"cannot load the kubeconfig {self.kubeconfig}: {exc}") from None

    def _kubelet_config(self, name: str) -> Any:
        from hami_sim.kubelet.config import KubeletConfig

        node = self._nodes[name]
        return KubeletConfig(
            node_name=name,
            directory=node.kubelet_dir,
            kubeconfig=self.kubeconfig,
            create_node=True,
            cpu=self.spec.cpu,
            memory=self.spec.memory,
            pods=self.spec.pods,
        )

    async def _start_kubelet(self, name: str) -> None:
        from hami_sim.kubelet.standin import Kubelet

        try:
            kubelet = Kubelet(self._kubelet_config(name), self._api, observer_factory=self._observers)
            await kubelet.start()
        except (OSError, ValueError) as exc:
            raise HostError(f"node {name}: cannot start the kubelet stand-in: {exc}") from None
        self._kubelets[name] = kubelet

    async def _stop_kubelet(self, name: str) -> None:
        kubelet = self._kubelets.pop(name, None)
        if kubelet is not None:
            await kubelet.stop()

    async def _in_pool(self, fn: Callable[[], _T], pool: ThreadPoolExecutor | None = None) -> _T:
        return await asyncio.get_running_loop().run_in_executor(pool or self._pool, fn)

    def _daemon_config(self, name: str) -> Any:
        from hami_node.config import ConfigError, HelpRequested, load_config

        argv = daemon_argv(self._nodes[name], self.kubeconfig)
        try:
            config = load_config(argv, {}, _read_file)
        except (ConfigError, HelpRequested) as exc:
            raise HostError(f"node {name}: hami-node: {exc}") from None
        port = self._health_ports.get(name)
        if config.health_bind is not None and port is not None:
            config = dataclasses.replace(
                config, health_bind=dataclasses.replace(config.health_bind, port=port)
            )
        return config

    async def _start_daemon(self, name: str) -> None:
        from hami_node.main import StartupError, start_daemon

        config = self._daemon_config(name)
        observers = self._observers
        try:
            try:
                daemon = await self._in_pool(lambda: start_daemon(config, observer_factory=observers))
            except StartupError as exc:
                if config.health_bind is None or _PORT_IN_USE not in str(exc):
                    raise
                # Taken between the pick and the bind: the kernel's pick cannot be (`ports` tells it).
                log.warning("node %s: %s; taking a free port instead", name, exc)
                taken = dataclasses.replace(config.health_bind, port=0)
                config = dataclasses.replace(config, health_bind=taken)
                daemon = await self._in_pool(lambda: start_daemon(config, observer_factory=observers))
        except StartupError as exc:
            raise HostError(f"node {name}: hami-node: {exc}") from None
        self._daemons[name] = daemon
        if daemon.health_endpoint is not None:
            self._health_ports[name] = daemon.health_endpoint.port

    async def _start_vendor(self, name: str) -> None:
        from hami_kube.errors import KubeApiError
        from hami_sim.vendors.cli import ArgsError, plugin_config
        from hami_sim.vendors.plugin import VendorPlugin

        try:
            config = plugin_config(self._nodes[name].vendor_args)
        except ArgsError as exc:
            raise HostError(f"node {name}: vendor-plugin: {exc}") from None
        plugin = VendorPlugin(config, await _vendor_client(self))
        try:
            await plugin.start()
        except (OSError, TimeoutError, KubeApiError) as exc:
            raise HostError(f"node {name}: cannot start the vendor device-plugin stand-in: {exc}") from None
        self._vendors[name] = plugin

    async def _stop_vendor(self, name: str) -> None:
        plugin = self._vendors.pop(name, None)
        if plugin is not None:
            await plugin.stop()

    async def _stop_daemon(self, name: str, pool: ThreadPoolExecutor | None = None) -> None:
        daemon = self._daemons.pop(name, None)
        if daemon is not None:
            await self._in_pool(daemon.stop, pool)


async def _vendor_client(host: NodeHost) -> Any:
    """The one API client of the host's vendor stand-ins (made at the first one)."""
    from hami_kube.client import KubeApi, component_user_agent
    from hami_kube.errors import KubeConfigError
    from hami_sim.vendors.plugin import USER_AGENT_COMPONENT

    if host._vendor_api is None:
        try:
            host._vendor_api = await KubeApi.connect(
                host.kubeconfig,
                max_connections=16 + 2 * len(host._nodes),
                user_agent=component_user_agent(USER_AGENT_COMPONENT),
            )
        except KubeConfigError as exc:
            raise HostError(f"cannot load the kubeconfig {host.kubeconfig}: {exc}") from None
    return host._vendor_api


def _crash_daemon(daemon: Any) -> None:
    """Stop a `hami_node.main.NodeDaemon` with its Kubernetes client closed first (see `kill NODE`)."""
    for part, stop in daemon.stops:
        if part == "kubernetes client":
            try:
                stop()
            except Exception:
                log.exception("closing a killed daemon's Kubernetes client failed")
    daemon.stop()


# --- control socket ------------------------------------------------------------------------------


async def serve_commands(host: NodeHost, path: Path) -> asyncio.AbstractServer:
    """Answer `host.command` on a Unix socket at `path` (one line in, one line out per connection)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode(errors="replace")
            answer = await host.command(line)
            writer.write(answer.encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket of an earlier run
    return await asyncio.start_unix_server(handle, path=str(path))


def host_command(path: Path, command: str, timeout_s: float = 60.0) -> str:
    """Send one command to a host's control socket and return its answer line (`ok` or `error: ...`).
    Raises `OSError` when the host does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(path))
        conn.sendall(command.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


# --- the command ---------------------------------------------------------------------------------


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "nodes",
        help="run the kubelet stand-ins and node daemons of many nodes in one process",
        description="Run, in one process, a kubelet stand-in and/or a hami-node daemon (fake GPUs or "
        "whatever the spec's flags say) for every node of a spec file: the local cluster's scale mode. "
        "SIGTERM/SIGINT stop them all.",
    )
    parser.add_argument("--spec", required=True, type=Path, help="the nodes (JSON or YAML; see the docs)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig of the API server (default: the spec's)")
    parser.add_argument(
        "--role",
        choices=[r.value for r in Role],
        default=Role.ALL.value,
        help="what to host: kubelets, daemons or all (default: %(default)s)",
    )
    parser.add_argument(
        "--control-socket",
        type=Path,
        metavar="PATH",
        help="answer stop/start/restart NODE on this Unix socket",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=_START_CONCURRENCY,
        metavar="N",
        help="node daemons started at once (default: %(default)s; more only adds GIL contention)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the host and the kubelet stand-ins (default: %(default)s); each node "
        "daemon's comes from its flags",
    )
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("hami_sim", "hami_node"):
        logging.getLogger(name).setLevel(args.log_level)
    try:
        spec = load_host_spec(args.spec)
    except SpecError as exc:
        log.error("%s", exc)
        return 2
    kubeconfig = args.kubeconfig or spec.kubeconfig
    if kubeconfig is None:
        log.error("--kubeconfig: needed (the spec %s names none)", args.spec)
        return 2
    if not kubeconfig.is_file():
        log.error("--kubeconfig: no such file: %s", kubeconfig)
        return 2
    if args.concurrency < 1:
        log.error("--concurrency must be at least 1, got %d", args.concurrency)
        return 2
    if args.control_socket is not None and len(str(args.control_socket)) > _MAX_SOCKET_PATH:
        log.error("--control-socket: %s is too long for a Unix socket", args.control_socket)
        return 2
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Hundreds of parts allocate a lot while they start and stop; collect less often (a full
    # collection of a big heap stalls every thread).
    gc.set_threshold(_GC_THRESHOLD, 50, 100)
    host = NodeHost(spec, kubeconfig, Role(args.role), concurrency=args.concurrency)
    try:
        return asyncio.run(_serve(host, args.control_socket))
    except (HostError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 1


async def _serve(host: NodeHost, control_socket: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    starting = asyncio.ensure_future(host.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # SIGTERM during start-up: let start finish (it cannot be half-cancelled)
        await asyncio.wait({starting})
    stopping.cancel()
    starting.result()  # raises HostError (start stopped what it had started)
    server = await serve_commands(host, control_socket) if control_socket is not None else None
    # Everything made so far lives as long as the process: take it out of the collector's reach, so
    # that full collections (which hold the GIL every thread needs) walk only what is new.
    gc.freeze()
    threads, rss = process_stats()
    log.info(
        "%s: %d kubelets, %d node daemons, %d vendor plugins in %.1f s (%d threads, %d of them Python's; "
        "RSS %.0f MiB)",
        READY_MARKER,
        len(host.kubelets),
        len(host.daemons),
        len(host.vendors),
        time.monotonic() - started,
        threads,
        threading.active_count(),
        rss,
    )
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()
            if control_socket is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(control_socket)
        await host.stop()
    return 0
