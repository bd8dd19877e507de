"""`hami-sim service-proxy`: the local cluster's stand-in for the Services in front of several hami-control
replicas (`ClusterSpec.control_replicas` > 1).

In a real cluster the webhook Service `hami-webhook` sends to every Ready replica and the extender Service
`hami-scheduler-extender` only to the elected one (the pod labelled `hami.io/scheduler-role=leader`,
daemonset/base/control/services.yaml); kube-proxy picks an endpoint per new connection from the ready
endpoints the EndpointSlice controller publishes, and established connections stay where they are
(conntrack). The local cluster has one URL for both (the scheduler stand-in's extender URL and the
webhook's), so this proxy sends each new connection to the leader: the replica whose
`/readyz/extender` answers 200 (hami_control/leader.py: 200 only while it leads and its caches are
synced). While no replica leads (a take-over under way) it sends to a replica whose `/readyz` answers 200,
as the webhook Service still would; with none ready it closes the connection at once (a Service without
endpoints rejects connections). Bytes pass through untouched, TLS included.

The probes play kubelet's readiness probes plus the endpoint update, `--probe-period` apart (default
0.25 s; kubelet's periodSeconds is 10 s, shortened here so a take-over is seen within a lease period).
They are HTTP GETs of hami-control's own health routes, as kubelet's prober makes them (no credentials,
no retry), sent through hami_kube's one HTTP client (`KubeApi.probe`), one client per replica.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hami_kube.client import KubeApi

log = logging.getLogger("hami_sim.service")

READY_MARKER = "hami-sim service-proxy ready"
LEADER_PATH = "/readyz/extender"
READY_PATH = "/readyz"
_PROBE_TIMEOUT_S = 1.0
_BUFFER = 65536


@dataclass(frozen=True)
class Endpoint:
    """One replica: its component name and its loopback port."""

    name: str
    port: int


def parse_endpoint(text: str) -> Endpoint:
    """`NAME=PORT` (the replica listens on 127.0.0.1:PORT); `ValueError` naming the value."""
    name, sep, port = text.partition("=")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--endpoint: expected NAME=PORT (e.g. hami-control-0=9443), got {text!r}")
    return Endpoint(name, int(port))


class ServiceProxy:
    """Listens on 127.0.0.1:`port` and forwards each new connection to the endpoint `choose()` names."""

    def __init__(
        self, port: int, endpoints: list[Endpoint], ssl_context: ssl.SSLContext, probe_period_s: float = 0.25
    ) -> None:
        self.port = port
        self.endpoints = endpoints
        self.probe_period_s = probe_period_s
        self._ssl = ssl_context
        self.leader: Endpoint | None = None
        self.ready: list[Endpoint] = []
        self._round_robin = itertools.count()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._probing: asyncio.Task[None] | None = None
        self._shown: str | None = None

    def choose(self) -> Endpoint | None:
        """The leader; else one of the ready replicas (in turn); else None."""
        if self.leader is not None:
            return self.leader
        if self.ready:
            return self.ready[next(self._round_robin) % len(self.ready)]
        return None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self._probing = asyncio.create_task(self._probe_forever(), name="probes")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in (self._probing, *self._connections) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    # --- probes ---------------------------------------------------------------------------------

    async def _probe_forever(self) -> None:
        # here, not at import: every `hami-sim` command loads this module's parser
        from hami_kube.client import KubeApi, component_user_agent

        agent = component_user_agent("hami-sim-service-proxy")
        clients = [
            KubeApi(f"https://127.0.0.1:{e.port}", self._ssl, qps=0, max_connections=2, user_agent=agent)
            for e in self.endpoints
        ]
        try:
            while True:
                await self.probe_once(clients)
                await asyncio.sleep(self.probe_period_s)
        finally:
            for client in clients:
                await client.close()

    async def probe_once(self, clients: list[KubeApi]) -> None:
        """Ask every endpoint (through its client, in `endpoints`' order) whether it leads, and (should
        none lead) whether it is ready."""

        async def answering(path: str) -> list[Endpoint]:
            answers = await asyncio.gather(*(c.probe(path, _PROBE_TIMEOUT_S) for c in clients))
            return [e for e, status in zip(self.endpoints, answers, strict=True) if status == 200]

        leaders = await answering(LEADER_PATH)
        ready = leaders or await answering(READY_PATH)
        # Two replicas that both say they lead (one about to find it lost the lease): the first keeps it.
        self.leader = leaders[0] if leaders else None
        self.ready = ready
        shown = (
            f"leader {self.leader.name}"
            if self.leader
            else (f"no leader; ready: {', '.join(e.name for e in ready)}" if ready else "no endpoint ready")
        )
        if shown != self._shown:
            self._shown = shown
            log.info("endpoints: %s", shown)

    # --- forwarding -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._connections.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        endpoint = self.choose()
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if endpoint is not None:
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", endpoint.port)
        if upstream is None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        up_reader, up_writer = upstream
        pipes = [
            asyncio.create_task(_pipe(reader, up_writer)),
            asyncio.create_task(_pipe(up_reader, writer)),
        ]
        try:
            # Either side closing ends the connection (HTTP clients and servers do not half-close).
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            for w in (writer, up_writer):
                w.close()
            for pipe in pipes:
                with contextlib.suppress(asyncio.CancelledError):
                    await pipe


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(_BUFFER):
            writer.write(data)
            await writer.drain()


# --- the command ----------------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "service-proxy",
        help="forward a port to the leading (or a ready) hami-control replica, as its Services would",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--port", type=int, required=True, help="the port to listen on (127.0.0.1)")
    parser.add_argument(
        "--endpoint",
        action="append",
        required=True,
        metavar="NAME=PORT",
        help="a replica listening on 127.0.0.1:PORT (repeat for each)",
    )
    parser.add_argument("--ca-file", type=Path, required=True, help="the CA that signed the replicas' certs")
    parser.add_argument(
        "--probe-period",
        type=float,
        default=0.25,
        metavar="SECONDS",
        help="seconds between readiness probes (default: %(default)s)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from hami_sim.tls import client_ssl_context

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        endpoints = [parse_endpoint(e) for e in args.endpoint]
        if not 0 < args.port < 65536:
            raise ValueError(f"--port: expected a TCP port, got {args.port}")
        if not args.probe_period > 0:
            raise ValueError(f"--probe-period: must be positive, got {args.probe_period}")
        context = client_ssl_context(args.ca_file.read_bytes())
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    proxy = ServiceProxy(args.port, endpoints, context, args.probe_period)
    try:
        asyncio.run(_serve(proxy))
    except OSError as exc:
        log.error("cannot listen on 127.0.0.1:%d: %s", args.port, exc)
        return 1
    return 0


async def _serve(proxy: ServiceProxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await proxy.start()
    names = ", ".join(f"{e.name}=127.0.0.1:{e.port}" for e in proxy.endpoints)
    log.info("%s on 127.0.0.1:%d (endpoints %s)", READY_MARKER, proxy.port, names)
    try:
        await stop.wait()
    finally:
        await proxy.stop()
