"""One node daemon in DRA mode (`hami-node --mode dra`), run in this process through
`hami_node.main.start_daemon` (as hami_sim's node host runs it), against the local API server, with the
fake GPU backend, and kubelet's side of the DRA plugin protocols as plain gRPC clients on its Unix
sockets.

`DraRig` lays out a short directory (Unix socket paths are limited to 107 bytes) as the local cluster
does for a DRA node (`hami_sim.cluster`): the kubelet directory `k/` with `k/plugins_registry` and
`k/plugins`, the CDI directory, the hook directory and the inventory; it creates the Node, starts and
stops daemons, and reads the node's ResourceSlices as raw JSON. Objects come from `tests.builders`,
waits from `tests.waiting`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc

from hami_api import dra
from hami_node.config import NodeConfig, load_config
from hami_node.dra.api.health.v1alpha1 import api_pb2_grpc as health_grpc
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2_grpc as v1beta1_grpc
from hami_node.dra.server import DraPluginServers
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import FakeEvent, Inventory, NvmlMode, write_inventory
from hami_node.main import NodeDaemon, start_daemon
from tests.apiserver_util import http
from tests.builders import node
from tests.waiting import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
TIMEOUT = 20.0


@dataclass
class DraRig:
    """See the module docstring."""

    node: str
    base: Path
    kubeconfig: Path
    base_url: str
    inventory: Inventory
    daemons: list[NodeDaemon] = field(default_factory=list)

    @property
    def kubelet_dir(self) -> Path:
        return self.base / "k"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    @property
    def hook_path(self) -> Path:
        return self.base / "hook"

    @property
    def inventory_path(self) -> Path:
        return self.base / "inv" / "gpus.yaml"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{dra.DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / dra.DRIVER / "dra.sock"

    @property
    def daemon(self) -> NodeDaemon:
        return self.daemons[-1]

    @property
    def servers(self) -> DraPluginServers:
        servers = self.daemon.plugin
        assert isinstance(servers, DraPluginServers)
        return servers

    def args(self, *extra: str) -> list[str]:
        return [
            "--node-name", self.node,
            "--mode", "dra",
            "--kubeconfig", str(self.kubeconfig),
            "--gpu-backend", "fake",
            "--fake-inventory", str(self.inventory_path),
            "--hook-path", str(self.hook_path),
            "--kubelet-dir", str(self.kubelet_dir),
            "--kubelet-registry-dir", str(self.registry_dir),
            "--kubelet-plugins-dir", str(self.plugins_dir),
            "--cdi-spec-dir", str(self.cdi_dir),
            "--log-level", "debug",
            *extra,
        ]  # fmt: skip

    def config(self, *extra: str) -> NodeConfig:
        return load_config(self.args(*extra), {}, lambda path: path.read_text(encoding="utf-8"))

    def start(self, *extra: str) -> NodeDaemon:
        daemon = start_daemon(self.config(*extra))
        self.daemons.append(daemon)
        return daemon

    def stop_daemon(self) -> None:
        if self.daemons:
            self.daemons.pop().stop()

    def write_inventory(self, inventory: Inventory) -> None:
        self.inventory = inventory
        write_inventory(self.inventory_path, inventory)

    def emit_xid(self, event_id: str, gpu: str, xid: int) -> None:
        event = FakeEvent(event_id, GPUEventKind.XID, gpu, xid)
        self.write_inventory(replace(self.inventory, events=(*self.inventory.events, event)))

    def set_nvml(self, mode: NvmlMode) -> None:
        self.write_inventory(replace(self.inventory, nvml=mode))

    # --- the API server ------------------------------------------------------------------------------

    def slices(self) -> list[dict[str, Any]]:
        """The node's slices of the driver, as the API server holds them."""
        selector = quote(f"spec.nodeName={self.node},spec.driver={dra.DRIVER}")
        code, body = http(self.base_url, "GET", f"{SLICES}?fieldSelector={selector}")
        assert code == 200, body
        items: list[dict[str, Any]] = body["items"]
        return items

    def wait_slice(
        self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        """Until the node has exactly one slice and `check(slice)` holds; returns it."""

        def one() -> dict[str, Any] | None:
            found = self.slices()
            return found[0] if len(found) == 1 and check(found[0]) else None

        return wait_for(one, timeout, what, detail=lambda: f"the node's slices: {self.slices()}")

    def node_object(self) -> dict[str, Any]:
        code, body = http(self.base_url, "GET", f"/api/v1/nodes/{self.node}")
        assert code == 200, body
        result: dict[str, Any] = body
        return result

    # --- kubelet's side -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def channel(self, socket: Path) -> Iterator[grpc.Channel]:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            yield channel

    def registration(self, channel: grpc.Channel) -> reg_grpc.RegistrationStub:
        return reg_grpc.RegistrationStub(channel)

    def plugin_v1(self, channel: grpc.Channel) -> v1_grpc.DRAPluginStub:
        return v1_grpc.DRAPluginStub(channel)

    def plugin_v1beta1(self, channel: grpc.Channel) -> v1beta1_grpc.DRAPluginStub:
        return v1beta1_grpc.DRAPluginStub(channel)

    def health(self, channel: grpc.Channel) -> health_grpc.DRAResourceHealthStub:
        return health_grpc.DRAResourceHealthStub(channel)


def make_dra_rig(
    name: str,
    kubeconfig: Path,
    base_url: str,
    inventory: Inventory,
    *,
    annotations: Mapping[str, str] | None = None,
) -> Iterator[DraRig]:
    """A generator for a fixture: the directories, the inventory and the Node (with `annotations`);
    every daemon started is stopped and the directory removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    try:
        for sub in ("hook", "k", "inv"):
            (base / sub).mkdir()
        rig = DraRig(name, base, kubeconfig, base_url, inventory)
        write_inventory(rig.inventory_path, inventory)
        code, body = http(base_url, "POST", "/api/v1/nodes", node(name, annotations=annotations))
        assert code == 201, body
        try:
            yield rig
        finally:
            while rig.daemons:
                rig.stop_daemon()
    finally:
        shutil.rmtree(base, ignore_errors=True)


__all__ = ["SLICES", "TIMEOUT", "DraRig", "make_dra_rig"]
