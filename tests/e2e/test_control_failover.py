"""High availability on hami-sim: two `hami-control` replicas with `--leader-elect`; the leader is killed
(SIGKILL) in the middle of a burst of GPU pods. Kubernetes would move the extender Service's endpoint to
the pod the new leader labels; here a TCP forwarder takes the dead leader's port and forwards to the
other replica, which is what the scheduler stand-in and the webhook then reach. The new leader takes
over within the lease duration, every pod ends up Running, and no GPU is ever over its limits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    decode_node_register,
    decode_pod_allocation,
)
from hami_sim.cluster import Cluster, ClusterSpec
from hami_sim.tls import client_ssl_context
from tests.builders import gpu_pod
from tests.waiting import wait_for

LEASE = ("--leader-elect", "--leader-elect-namespace", "kube-system", "--leader-elect-lease-duration", "3",
         "--leader-elect-renew-deadline", "2", "--leader-elect-retry-period", "1")  # fmt: skip


class Forwarder:
    """127.0.0.1:`port` -> 127.0.0.1:`target`, byte for byte (TLS passes through), on its own loop."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.server: asyncio.Server | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self.ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _serve(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port, reuse_address=True)

    def start(self) -> None:
        self.thread.start()
        assert self.ready.wait(10)

    def stop(self) -> None:
        async def close() -> None:
            if self.server is not None:
                self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    spec = ClusterSpec.uniform(1, 4, "NVIDIA A100-SXM4-80GB", control_args=LEASE)
    with Cluster.up(spec, tmp_path / ".hami-sim") as running:
        yield running


def replica(cluster: Cluster, port: int, log: Path) -> subprocess.Popen[bytes]:
    tls = cluster.state_dir / "tls"
    argv = [sys.executable, "-m", "hami_control.main", "serve", "--bind", f"127.0.0.1:{port}",
            "--tls-cert-file", str(tls / "hami-control.crt"), "--tls-key-file", str(tls / "hami-control.key"),
            "--kubeconfig", str(cluster.kubeconfig), *LEASE]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "KUBECONFIG", "POD_"))}
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def extender_ready(port: int, ca: Path) -> int:
    context = client_ssl_context(ca.read_bytes())
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/readyz/extender", context=context, timeout=5
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def create(core: Any, name: str) -> None:
    """Create, retrying while the webhook is unreachable (failurePolicy Fail refuses GPU pods then)."""

    def attempt() -> bool:
        try:
            core.create_namespaced_pod("default", gpu_pod(name, gpumem=8000))
        except ApiException as err:
            return bool(err.status == 409)
        return True

    wait_for(attempt, 30, f"pod {name} to be created")


def test_killing_the_leader_mid_burst_loses_no_pod(cluster: Cluster, tmp_path: Path) -> None:
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api_client)
    port_a = cluster.control_port
    port_b = free_port()
    b = replica(cluster, port_b, tmp_path / "replica-b.log")
    forwarder: Forwarder | None = None
    try:
        wait_for(lambda: extender_ready(port_a, cluster.ca_file) == 200, 20, "replica A leading")
        wait_for(lambda: extender_ready(port_b, cluster.ca_file) == 503, 30, "replica B following")
        names = [f"burst-{i:02d}" for i in range(30)]
        for name in names[:12]:
            create(core, name)
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in core.list_namespaced_pod("default").items) >= 3,
            30,
            "the burst under way",
        )
        os.kill(cluster.pids()["hami-control"], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: port_free(port_a), 10, "the killed leader's port to close")
        forwarder = Forwarder(port_a, port_b)  # the Service's endpoint moves to the new leader
        forwarder.start()
        for name in names[12:]:
            create(core, name)
        wait_for(lambda: extender_ready(port_b, cluster.ca_file) == 200, 15, "replica B to take over")
        took_over = time.monotonic() - killed
        assert took_over < 3 + 2 + 2, f"take-over after {took_over:.1f} s with a 3 s lease"

        def all_running() -> bool:
            pods = core.list_namespaced_pod("default").items
            return len(pods) == 30 and all(
                p.status.phase == "Running" and (p.metadata.annotations or {}).get(BIND_PHASE) == "success"
                for p in pods
            )

        wait_for(all_running, 90, "all 30 pods Running after the fail-over")
        node = core.list_node().items[0]
        sizes = {
            g.id: (g.devmem, g.count) for g in decode_node_register(node.metadata.annotations[NODE_REGISTER])
        }
        used: dict[str, list[int]] = {}
        for pod in core.list_namespaced_pod("default").items:
            for container in decode_pod_allocation(pod.metadata.annotations[DEVICES_ALLOCATED]).containers:
                for s in container.devices:
                    slot = used.setdefault(s.uuid, [0, 0])
                    slot[0] += 1
                    slot[1] += s.usedmem
        for uuid, (slots, mem) in used.items():
            assert slots <= sizes[uuid][1] and mem <= sizes[uuid][0], (uuid, slots, mem)
        print(json.dumps({"take_over_s": round(took_over, 2), "per_gpu": used}))
    finally:
        if forwarder is not None:
            forwarder.stop()
        b.send_signal(signal.SIGTERM)
        try:
            b.wait(15)
        except subprocess.TimeoutExpired:
            b.kill()
            b.wait(5)
        api_client.close()
