"""Two `hami-control` replicas with `--leader-elect` against the local API server: exactly one answers
the extender (the other says "not leader" and its /readyz/extender is 503), both serve the webhook, the
leader labels its pod `hami.io/scheduler-role=leader`; a killed leader is replaced within about the lease
duration, and a cleanly stopped one releases the lease and is replaced within the lease duration."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.builders import container, pod
from tests.conftest import ApiServerHandle
from tests.control_process_util import ControlProcess, start_control
from tests.control_server_util import KeepAliveClient
from tests.waiting import wait_for

TIMING = (
    "--leader-elect-lease-duration",
    "3",
    "--leader-elect-renew-deadline",
    "2",
    "--leader-elect-retry-period",
    "1",
)
NAMESPACE = "hami-system"


@pytest.fixture
def replicas(tmp_path: Path, apiserver: ApiServerHandle, core_v1: Any) -> Iterator[dict[str, ControlProcess]]:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    started: dict[str, ControlProcess] = {}
    try:
        for name in ("control-a", "control-b"):
            replica = pod(name, container("c", image="hami"), labels={"app": "hami-control"})
            core_v1.create_namespaced_pod(NAMESPACE, replica)
            started[name] = start_control(
                tmp_path,
                apiserver.kubeconfig,
                "--leader-elect",
                *TIMING,
                env={"POD_NAME": name, "POD_NAMESPACE": NAMESPACE},
                name=name,
            )
        yield started
    finally:
        for process in started.values():
            process.stop()
            print(process.log())


def answers_extender(process: ControlProcess) -> bool:
    with KeepAliveClient(process.port, process.ca.client_context()) as c:
        status, body = c.request("POST", "/filter", json.dumps({"Pod": {}, "NodeNames": []}).encode())
        return status == 200 and "not leader" not in json.loads(body)["Error"]


def extender_ready(process: ControlProcess) -> int:
    with KeepAliveClient(process.port, process.ca.client_context()) as c:
        return c.request("GET", "/readyz/extender")[0]


def leader_of(replicas: dict[str, ControlProcess]) -> str | None:
    alive = {n: p for n, p in replicas.items() if p.proc.poll() is None}
    leading = [n for n, p in alive.items() if answers_extender(p)]
    return leading[0] if len(leading) == 1 else None


def labelled(core_v1: Any) -> set[str]:
    pods = core_v1.list_namespaced_pod(NAMESPACE, label_selector="hami.io/scheduler-role=leader").items
    return {p.metadata.name for p in pods}


def test_one_leader_answers_the_extender_and_a_killed_one_is_replaced(
    replicas: dict[str, ControlProcess], core_v1: Any
) -> None:
    leader = wait_for(lambda: leader_of(replicas), 15, "exactly one leader")
    follower = next(n for n in replicas if n != leader)
    assert extender_ready(replicas[leader]) == 200
    assert extender_ready(replicas[follower]) == 503
    with KeepAliveClient(replicas[follower].port, replicas[follower].ca.client_context()) as c:
        assert c.request("GET", "/readyz")[0] == 200  # the webhook is served by every replica
        answer = json.loads(c.request("POST", "/bind", b'{"PodName": "p"}')[1])
        assert answer["Error"].startswith("not leader")
    wait_for(lambda: labelled(core_v1) == {leader}, 10, "the leader's pod label")
    lease = client.CoordinationV1Api(core_v1.api_client).read_namespaced_lease("hami-control", NAMESPACE)
    assert lease.spec.holder_identity.startswith(leader)

    killed = time.monotonic()
    replicas[leader].proc.send_signal(signal.SIGKILL)
    replicas[leader].proc.wait(10)
    wait_for(lambda: answers_extender(replicas[follower]), 15, "the follower to take over")
    took = time.monotonic() - killed
    assert took < 3 + 2 + 2, f"take-over took {took:.1f} s with a 3 s lease"
    wait_for(lambda: follower in labelled(core_v1), 10, "the new leader's label")


def test_a_cleanly_stopped_leader_releases_the_lease_and_is_replaced_within_the_lease_duration(
    replicas: dict[str, ControlProcess],
) -> None:
    leader = wait_for(lambda: leader_of(replicas), 15, "exactly one leader")
    follower = next(n for n in replicas if n != leader)
    assert replicas[leader].stop() == 0
    stopped = time.monotonic()
    wait_for(lambda: answers_extender(replicas[follower]), 10, "the follower to take over")
    assert "released the lease" in replicas[leader].log()
    assert time.monotonic() - stopped < 3, "a released lease is taken at the next retry, not after expiry"
