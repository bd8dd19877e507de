"""A small scriptable DRA plugin for the kubelet stand-in's tests: real gRPC servers (sync grpc, their
own threads) on real Unix sockets, with the generated stubs: `pluginregistration.Registration` on
`<registry>/<name>-reg.sock` and DRAPlugin v1 and/or v1beta1 on `<plugins>/<driver>/dra.sock`, as the
upstream kubelet plugin helper serves them. It records what kubelet asked and can be told to fail."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2 as v1beta1_pb2
from hami_node.dra.api.v1beta1 import api_pb2_grpc as v1beta1_grpc

TIMEOUT = 10.0
DRIVER = "gpu.example.com"
CDI_KIND = "k8s.gpu.example.com/claim"
BOTH = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


@dataclass
class Script:
    """How the plugin answers: per claim name an error, claims left out of the answer, an answer for
    a claim nobody asked about, or the whole call failing with a gRPC status."""

    errors: dict[str, str] = field(default_factory=dict)
    skip: set[str] = field(default_factory=set)
    unknown_uid: bool = False
    abort: grpc.StatusCode | None = None
    unprepare_errors: dict[str, str] = field(default_factory=dict)
    bad_spec: bool = False
    """Write CDI specs a runtime refuses (an env entry without `=`)."""


@dataclass
class Calls:
    """What the plugin was asked, in order, under `lock`; `changed` is notified after each call."""

    lock: threading.Condition = field(default_factory=threading.Condition)
    methods: list[str] = field(default_factory=list)
    prepare: list[list[tuple[str, str, str]]] = field(default_factory=list)
    unprepare: list[list[tuple[str, str, str]]] = field(default_factory=list)
    statuses: list[tuple[bool, str]] = field(default_factory=list)


class _Record(grpc.ServerInterceptor):
    def __init__(self, calls: Calls) -> None:
        self._calls = calls

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        with self._calls.lock:
            self._calls.methods.append(details.method)
        return continuation(details)


class DraPlugin:
    """`serve()` starts the DRA server, then the registration server (whose socket kubelet watches);
    `stop()` removes both sockets. Claims are prepared as one device `gpu-0` each, with the CDI ID
    `<CDI_KIND>=<claim uid>-gpu-0` and, when `cdi_dir` is given, a transient CDI spec per claim that
    sets `CLAIM_<name>=<uid>` (unprepare removes it)."""

    def __init__(
        self,
        registry_dir: Path,
        plugins_dir: Path,
        *,
        driver: str = DRIVER,
        name: str | None = None,
        supported: Sequence[str] = BOTH,
        plugin_type: str = "DRAPlugin",
        services: Sequence[str] = ("v1", "v1beta1"),
        cdi_dir: Path | None = None,
        pool: str = "node-1",
    ) -> None:
        self.driver = driver
        self.registration_socket = registry_dir / f"{name or driver}-reg.sock"
        self.dra_socket = plugins_dir / (name or driver) / "dra.sock"
        self.supported = list(supported)
        self.plugin_type = plugin_type
        self.services = tuple(services)
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.script = Script()
        self.calls = Calls()
        self._dra: grpc.Server | None = None
        self._registration: grpc.Server | None = None

    # ------------------------------------------------------------------------------ life cycle

    def serve(self) -> DraPlugin:
        self.serve_dra()
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[_Record(self.calls)])
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        assert server.add_insecure_port(f"unix://{self.registration_socket}") == 1
        server.start()
        self._registration = server
        return self

    def serve_dra(self) -> None:
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[_Record(self.calls)])
        if "v1" in self.services:
            v1_grpc.add_DRAPluginServicer_to_server(_DraPluginServicer(self, v1_pb2), server)
        if "v1beta1" in self.services:
            v1beta1_grpc.add_DRAPluginServicer_to_server(_DraPluginServicer(self, v1beta1_pb2), server)
        assert server.add_insecure_port(f"unix://{self.dra_socket}") == 1
        server.start()
        self._dra = server

    def stop_dra(self) -> None:
        """Stop the DRA server only (the plugin crashed; its registration socket stays)."""
        server, self._dra = self._dra, None
        if server is not None:
            server.stop(grace=None).wait(TIMEOUT)

    def stop(self) -> None:
        """Stop both servers; their sockets go away (kubelet deregisters the plugin)."""
        server, self._registration = self._registration, None
        if server is not None:
            server.stop(grace=None).wait(TIMEOUT)
        self.stop_dra()

    # ------------------------------------------------------------------------------ waits

    def wait(self, predicate: Callable[[Calls], bool], what: str, timeout: float = TIMEOUT) -> Calls:
        with self.calls.lock:
            if not self.calls.lock.wait_for(lambda: predicate(self.calls), timeout):
                raise AssertionError(f"timed out waiting for {what}; calls: {self.calls.methods}")
        return self.calls

    def wait_statuses(self, count: int, timeout: float = TIMEOUT) -> list[tuple[bool, str]]:
        return list(
            self.wait(
                lambda c: len(c.statuses) >= count, f"{count} registration status(es)", timeout
            ).statuses
        )

    def record(self, attribute: str, value: Any) -> None:
        with self.calls.lock:
            getattr(self.calls, attribute).append(value)
            self.calls.lock.notify_all()

    # ------------------------------------------------------------------------------ CDI

    def cdi_id(self, uid: str) -> str:
        return f"{CDI_KIND}={uid}-gpu-0"

    def write_spec(self, name: str, uid: str) -> None:
        if self.cdi_dir is None:
            return
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        spec = {
            "cdiVersion": "0.5.0",
            "kind": CDI_KIND,
            "devices": [
                {
                    "name": f"{uid}-gpu-0",
                    "containerEdits": {
                        "env": [
                            "NOVALUE"
                            if self.script.bad_spec
                            else f"CLAIM_{name.upper().replace('-', '_')}={uid}"
                        ],
                        "deviceNodes": [{"path": "/dev/nvidia0"}],
                    },
                }
            ],
            "containerEdits": {
                "mounts": [
                    {
                        "hostPath": "/opt/libvgpu.so",
                        "containerPath": "/usr/local/vgpu/libvgpu.so",
                        "options": ["ro"],
                    }
                ]
            },
        }
        (self.cdi_dir / f"k8s.gpu.example.com-claim_{uid}.json").write_text(json.dumps(spec))

    def remove_spec(self, uid: str) -> None:
        if self.cdi_dir is not None:
            (self.cdi_dir / f"k8s.gpu.example.com-claim_{uid}.json").unlink(missing_ok=True)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: DraPlugin) -> None:
        self._plugin = plugin

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:
        p = self._plugin
        return reg_pb2.PluginInfo(
            type=p.plugin_type, name=p.driver, endpoint=str(p.dra_socket), supported_versions=p.supported
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        self._plugin.record("statuses", (request.plugin_registered, request.error))
        return reg_pb2.RegistrationStatusResponse()


class _DraPluginServicer(v1_grpc.DRAPluginServicer):
    """Serves one version's DRAPlugin (`module`: its api_pb2; v1beta1 has no share IDs)."""

    def __init__(self, plugin: DraPlugin, module: Any) -> None:
        self._plugin = plugin
        self._module = module

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        p, m = self._plugin, self._module
        claims = [(c.namespace, c.uid, c.name) for c in request.claims]
        p.record("prepare", claims)
        if p.script.abort is not None:
            context.abort(p.script.abort, "plugin says no")
        response = m.NodePrepareResourcesResponse()
        for _, uid, name in claims:
            if name in p.script.skip:
                continue
            if name in p.script.errors:
                response.claims[uid].error = p.script.errors[name]
                continue
            p.write_spec(name, uid)
            device = m.Device(
                request_names=["gpu"], pool_name=p.pool, device_name="gpu-0", cdi_device_ids=[p.cdi_id(uid)]
            )
            if m is v1_pb2:
                device.share_id = f"share-{uid}"
            response.claims[uid].devices.append(device)
        if p.script.unknown_uid:
            response.claims["not-asked-for"].CopyFrom(m.NodePrepareResourceResponse())
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        p, m = self._plugin, self._module
        claims = [(c.namespace, c.uid, c.name) for c in request.claims]
        p.record("unprepare", claims)
        response = m.NodeUnprepareResourcesResponse()
        for _, uid, name in claims:
            response.claims[uid].error = p.script.unprepare_errors.get(name, "")
            if name not in p.script.unprepare_errors:
                p.remove_spec(uid)
        return response
