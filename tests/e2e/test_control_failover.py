"""High availability on hami-sim: two `hami-control` replicas with `--leader-elect`
(`ClusterSpec.control_replicas=2`); the leader is killed (SIGKILL) in the middle of a burst of GPU pods.
Kubernetes would move the extender Service's endpoint to the pod the new leader labels; here the
cluster's Service-like proxy on the control URL (hami_sim.cluster.service) sends new connections to the
replica that leads, which is what the scheduler stand-in and the webhook reach. The new leader takes
over within the lease duration, every pod ends up Running, no GPU is ever over its limits, and the
killed replica comes back as a follower."""

from __future__ import annotations

import json
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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    spec = ClusterSpec.uniform(1, 4, "NVIDIA A100-SXM4-80GB", control_args=LEASE, control_replicas=2)
    with Cluster.up(spec, tmp_path / ".hami-sim") as running:
        yield running


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


def test_killing_the_leader_mid_burst_loses_no_pod(cluster: Cluster) -> None:
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api_client)
    try:
        leader = cluster.wait_leader(20)
        follower = next(r for r in cluster.control_replicas if r != leader)
        port_a, port_b = cluster.procs[leader].port or 0, cluster.procs[follower].port or 0
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
        cluster.kill("hami-control")  # the leader, SIGKILL
        killed = time.monotonic()
        assert not cluster.procs[leader].alive()
        for name in names[12:]:
            create(core, name)
        wait_for(lambda: extender_ready(port_b, cluster.ca_file) == 200, 15, "replica B to take over")
        took_over = time.monotonic() - killed
        assert took_over < 3 + 2 + 2, f"take-over after {took_over:.1f} s with a 3 s lease"
        assert cluster.wait_leader(15, other_than=leader) == follower

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
        cluster.start_component(leader)  # back, as a follower of the new leader
        wait_for(lambda: extender_ready(port_a, cluster.ca_file) == 503, 30, "replica A following again")
        assert cluster.leader() == follower
        table = cluster.status().render()
        assert f"hami-control leader: {follower}" in table
        assert all(name in table for name in ("hami-control-0", "hami-control-1", "control-service"))
    finally:
        api_client.close()
