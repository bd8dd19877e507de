"""`hami-sim demo`: the whole system on one machine, in under a minute.

Brings up a small local cluster (3 nodes x 4 fake GPUs of two models: two A100 80 GB nodes and one T4
node), applies the workloads in `examples/demo/` through the official client, as a user would (the
webhook, the scheduler stand-in, the extender, the kubelet stand-ins and the node daemons all take their
real part), and prints:

- for each pod its outcome: the node and GPUs it got, or why it was refused or is pending, in plain words;
- a per-GPU usage table (slices, memory, cores) with bars;
- the environment one container received from the node daemon's Allocate (what HAMi-core enforces).

Then it tears the cluster down (`--keep` leaves it running for `kubectl --kubeconfig
.hami-sim/kubeconfig ...` and `hami-sim down`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hami_api import dra
from hami_api.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_REGISTER,
    decode_node_register,
    decode_pod_allocation,
)
from hami_api.types import GPUInfo, PodAllocation

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "demo"
BAR = 20


@dataclass
class Outcome:
    namespace: str
    name: str
    text: str
    ok: bool


def _progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def _documents(directory: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                yield doc


def _quantities_as_strings(doc: dict[str, Any]) -> dict[str, Any]:
    """YAML reads `nvidia.com/gpu: 1` as a number; the API takes it, the official client's strict models
    want quantities as strings (as `kubectl` sends them after its own conversion)."""
    spec = doc.get("spec") or {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = container.get("resources") or {}
            for section in ("limits", "requests"):
                values = resources.get(section)
                if isinstance(values, dict):
                    resources[section] = {k: str(v) for k, v in values.items()}
    hard = spec.get("hard")
    if isinstance(hard, dict):
        spec["hard"] = {k: str(v) for k, v in hard.items()}
    return doc


def _create(api_client: Any, doc: dict[str, Any]) -> str | None:
    """Create one object; the API server's refusal message (a webhook denial) or None."""
    from kubernetes import client
    from kubernetes.client import ApiException

    core: Any = client.CoreV1Api(api_client)
    doc = _quantities_as_strings(doc)
    kind = doc.get("kind")
    namespace = (doc.get("metadata") or {}).get("namespace") or "default"
    try:
        if kind == "Namespace":
            core.create_namespace(doc)
        elif kind == "ResourceQuota":
            core.create_namespaced_resource_quota(namespace, doc)
        elif kind == "Pod":
            core.create_namespaced_pod(namespace, doc)
        else:
            return f"kind {kind} is not part of the demo"
    except ApiException as err:
        import json

        try:
            return str(json.loads(err.body or "{}").get("message") or err.reason)
        except ValueError:
            return str(err.reason)
    return None


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _allocation(pod: Any) -> PodAllocation | None:
    annotations = pod.metadata.annotations or {}
    text = annotations.get(DEVICES_ALLOCATED) or annotations.get(DEVICES_TO_ALLOCATE)
    if not text:
        return None
    try:
        return decode_pod_allocation(text)
    except ValueError:
        return None


def _pending_reason(core: Any, pod: Any) -> str:
    events = core.list_namespaced_event(
        pod.metadata.namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
    )
    warnings = [e for e in events.items if e.type == "Warning"]
    if warnings:
        latest = max(warnings, key=lambda e: str(e.last_timestamp or e.event_time or ""))
        return f"pending: {latest.reason}: {latest.message}"
    return "pending: not scheduled yet"


def _outcomes(
    core: Any, created: list[tuple[str, str]], refused: list[Outcome], resource: Any = None
) -> list[Outcome]:
    out = list(refused)
    for namespace, name in created:
        pod = core.read_namespaced_pod(name, namespace)
        if resource is not None and pod.spec.resource_claims and pod.status.phase == "Running":
            results = pod_claim_results(resource, pod)
            parts = [f"{claim}: {uuid[-8:]} {mem} MiB {cores}%" for claim, uuid, mem, cores in results]
            text = f"Running on {pod.spec.node_name} through DRA; " + "; ".join(parts)
            out.append(Outcome(namespace, name, text, True))
            continue
        allocation = _allocation(pod)
        if pod.status.phase == "Running" and allocation is not None:
            names = [c.name for c in (pod.spec.init_containers or [])] + [c.name for c in pod.spec.containers]
            parts = []
            for container, slices in zip(names, allocation.containers, strict=False):
                if slices.devices:
                    gpus = ", ".join(f"{s.uuid[-8:]} {s.usedmem} MiB {s.usedcores}%" for s in slices.devices)
                    parts.append(f"{container}: {gpus}")
            out.append(
                Outcome(namespace, name, f"Running on {pod.spec.node_name}; " + "; ".join(parts), True)
            )
        else:
            out.append(Outcome(namespace, name, _pending_reason(core, pod), False))
    return out


def _bar(used: int, total: int) -> str:
    filled = round(BAR * used / total) if total > 0 else 0
    return "#" * min(filled, BAR) + "." * (BAR - min(filled, BAR))


def _quantity_int(value: Any) -> int:
    from hami_api.quantity import quantity_value

    return quantity_value(str(value))


def dra_gpus(resource: Any) -> dict[str, tuple[str, GPUInfo]]:
    """The GPUs DRA nodes publish (our driver's ResourceSlices), by device `<pool>/<device>`, as GPUInfo:
    uuid, model, memory (MiB), cores 100, index from the `minor` attribute; `count` is 0 (no slots)."""
    out: dict[str, tuple[str, GPUInfo]] = {}
    for item in resource.list_resource_slice(field_selector=f"spec.driver={dra.DRIVER}").items:
        node = item.spec.node_name or ""
        for device in item.spec.devices or []:
            attrs = device.attributes or {}

            def attr(name: str, attrs: Any = attrs) -> Any:
                value = attrs.get(name)
                return None if value is None else (value.string or value.int or value.version)

            memory = (device.capacity or {}).get(dra.CAPACITY_MEMORY)
            info = GPUInfo(
                id=str(attr(dra.ATTR_UUID) or device.name),
                index=int(attr(dra.ATTR_MINOR) or 0),
                count=0,
                devmem=_quantity_int(memory.value) // dra.MIB if memory is not None else 0,
                devcore=100,
                type=str(attr(dra.ATTR_PRODUCT_NAME) or "?"),
                numa=0,
                mode="hami-core",
                health=not device.taints,
            )
            out[f"{item.spec.pool.name}/{device.name}"] = (node, info)
    return out


def dra_usage(resource: Any, gpus: dict[str, tuple[str, GPUInfo]]) -> dict[str, list[int]]:
    """Per device `<pool>/<device>`: [shares, MiB, cores] that allocated claims consume (a result without
    consumedCapacity, a cluster without consumable capacity, takes the whole GPU)."""
    used: dict[str, list[int]] = {key: [0, 0, 0] for key in gpus}
    for claim in resource.list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        for result in (allocation.devices.results or []) if allocation and allocation.devices else []:
            key = f"{result.pool}/{result.device}"
            if result.driver != dra.DRIVER or key not in used:
                continue
            consumed = result.consumed_capacity or {}
            gpu = gpus[key][1]
            mem = consumed.get(dra.CAPACITY_MEMORY)
            cores = consumed.get(dra.CAPACITY_CORES)
            used[key][0] += 1
            used[key][1] += _quantity_int(mem) // dra.MIB if mem is not None else gpu.devmem
            used[key][2] += _quantity_int(cores) if cores is not None else gpu.devcore
    return used


def pod_claim_results(resource: Any, pod: Any) -> list[tuple[str, str, int, int]]:
    """(claim, device uuid or name, MiB, cores) of the pod's allocated claims."""
    names = [c.resource_claim_name for c in pod.status.resource_claim_statuses or [] if c.resource_claim_name]
    names += [c.resource_claim_name for c in pod.spec.resource_claims or [] if c.resource_claim_name]
    gpus = dra_gpus(resource)
    out = []
    for name in names:
        claim = resource.read_namespaced_resource_claim(name, pod.metadata.namespace)
        allocation = claim.status.allocation if claim.status else None
        for result in (allocation.devices.results or []) if allocation and allocation.devices else []:
            node_gpu = gpus.get(f"{result.pool}/{result.device}")
            gpu = node_gpu[1] if node_gpu else None
            consumed = result.consumed_capacity or {}
            mem = consumed.get(dra.CAPACITY_MEMORY)
            cores = consumed.get(dra.CAPACITY_CORES)
            out.append(
                (
                    name,
                    gpu.id if gpu else result.device,
                    _quantity_int(mem) // dra.MIB if mem is not None else (gpu.devmem if gpu else 0),
                    _quantity_int(cores) if cores is not None else 100,
                )
            )
    return out


def usage_table(core: Any, resource: Any = None) -> str:
    """Per GPU: slices, memory and cores in use (from the node inventory and the pods' allocations; on
    DRA nodes from the ResourceSlices and the claims' allocations, when `resource` (ResourceV1Api) is
    given: there, slices are the claims' shares and have no fixed count)."""
    gpus: dict[str, tuple[str, GPUInfo]] = {}
    for node in core.list_node().items:
        text = (node.metadata.annotations or {}).get(NODE_REGISTER)
        if text:
            for gpu in decode_node_register(text):
                gpus[gpu.id] = (node.metadata.name, gpu)
    used: dict[str, list[int]] = {uuid: [0, 0, 0] for uuid in gpus}
    if resource is not None:
        dra_nodes = dra_gpus(resource)
        gpus.update(dra_nodes)
        used.update(dra_usage(resource, dra_nodes))
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.status.phase in ("Succeeded", "Failed") or not pod.spec.node_name:
            continue
        allocation = _allocation(pod)
        inits = pod.spec.init_containers or []
        for index, container in enumerate(allocation.containers if allocation else ()):
            if index < len(inits) and inits[index].restart_policy != "Always":
                continue  # plain init containers have finished once the pod runs (sidecars run on)
            for s in container.devices:
                if s.uuid in used:
                    used[s.uuid][0] += 1
                    used[s.uuid][1] += s.usedmem
                    used[s.uuid][2] += s.usedcores
    lines = [f"{'node':<8} {'GPU':<10} {'model':<24} {'slices':>6}  {'memory (MiB)':<36} {'cores':<30}"]
    for uuid, (node, gpu) in sorted(gpus.items(), key=lambda item: (item[1][0], item[1][1].index)):
        slots, mem, cores = used[uuid]
        count = str(gpu.count) if gpu.count else "-"
        lines.append(
            f"{node:<8} {gpu.id[-8:]:<10} {gpu.type[:24]:<24} {slots:>3}/{count:<2}  "
            f"{_bar(mem, gpu.devmem)} {mem:>6}/{gpu.devmem:<6}  {_bar(cores, gpu.devcore)} {cores:>3}%"
        )
    return "\n".join(lines)


def container_env(cluster: Any, core: Any, namespace: str, name: str, container: str) -> dict[str, str]:
    """The environment the kubelet stand-in gave `container` from its devices: the node daemon's Allocate
    (device plugin) or its claims' CDI specs (DRA), as the stand-in's runtime recorded it."""
    from hami_sim.kubelet.config import CONTAINERS_FILE
    from hami_sim.kubelet.runtime import read_containers

    pod = core.read_namespaced_pod(name, namespace)
    containers = read_containers(cluster.kubelet_dir(pod.spec.node_name) / CONTAINERS_FILE)
    return containers.env(pod.metadata.uid, container)


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    from hami_sim.cluster import Cluster, ClusterError, ClusterSpec, GPUSpec, NodeSpec

    started = time.monotonic()
    a100, t4 = GPUSpec("NVIDIA A100-SXM4-80GB"), GPUSpec("NVIDIA Tesla T4", 15360)
    spec = ClusterSpec(
        nodes=(
            NodeSpec("gpu-a", (a100,) * 4),
            NodeSpec("gpu-b", (a100,) * 4),
            NodeSpec("gpu-t4", (t4,) * 4),
        ),
        split=args.split,
    ).with_mode(args.mode)
    how = {"device-plugin": "", "dra": " in DRA mode", "mixed": ", gpu-b in DRA mode"}[args.mode]
    print(
        f"== Bringing up a local cluster: 3 nodes x 4 fake GPUs (2 x A100 80GB nodes, 1 x T4 node){how}",
        flush=True,
    )
    try:
        cluster = Cluster.up(spec, args.state_dir, progress=_progress)
    except ClusterError as err:
        print(f"hami-sim demo: {err}", file=sys.stderr)
        return 1
    try:
        api_client: Any = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api(api_client)
        resource: Any = client.ResourceV1Api(api_client) if spec.dra_nodes else None
        if args.mode == "mixed":
            _progress("namespace ai-team goes through DRA (labelled hami.io/dra=enabled)")
        print(f"== Cluster up in {time.monotonic() - started:.1f} s; applying {args.examples}/", flush=True)
        created: list[tuple[str, str]] = []
        refused: list[Outcome] = []
        for doc in _documents(args.examples):
            meta = doc.get("metadata") or {}
            if args.mode == "mixed" and doc.get("kind") == "Namespace" and meta.get("name") == "ai-team":
                meta.setdefault("labels", {})["hami.io/dra"] = "enabled"
            message = _create(api_client, doc)
            if doc.get("kind") != "Pod":
                continue
            namespace, name = meta.get("namespace") or "default", meta.get("name") or "?"
            if message is None:
                created.append((namespace, name))
            else:
                refused.append(Outcome(namespace, name, f"refused at creation: {message}", False))

        def settled() -> bool:
            for namespace, name in created:
                pod = core.read_namespaced_pod(name, namespace)
                if pod.status.phase != "Running" and not _pending_reason(core, pod).startswith(
                    "pending: Failed"
                ):
                    return False
            return True

        _progress("waiting for the pods to be scheduled, bound and allocated")
        _wait(settled, args.wait)
        print("\n== Pods", flush=True)
        for outcome in _outcomes(core, created, refused, resource):
            mark = "ok " if outcome.ok else "-- "
            print(f"{mark}{outcome.namespace}/{outcome.name}: {outcome.text}")
        print("\n== GPU usage (slices, memory, cores)")
        print(usage_table(core, resource))
        source = "its claim's CDI spec" if args.mode in ("dra", "mixed") else "Allocate"
        print(f"\n== What HAMi-core gets: the environment of ai-team/inference-a's container (from {source})")
        try:
            env = container_env(cluster, core, "ai-team", "inference-a", "server")
            for key in sorted(env):
                print(f"  {key}={env[key]}")
        except Exception as err:  # the demo goes on: say what is missing
            print(f"  (not available: {err})")
        print(f"\n== Done in {time.monotonic() - started:.1f} s")
        if args.keep:
            print(
                f"The cluster keeps running: kubectl --kubeconfig {cluster.kubeconfig} get pods -A -o wide; "
                "hami-sim down to stop it."
            )
        return 0
    finally:
        if not args.keep:
            _progress("tearing the cluster down")
            cluster.down()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="bring up a small local cluster, run the example workloads, show where they landed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".hami-sim"))
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="directory of YAML workloads")
    parser.add_argument("--split", type=int, default=10, help="slices per GPU (default: %(default)s)")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="seconds to wait for pods (default: %(default)s)"
    )
    parser.add_argument(
        "--mode",
        choices=("device-plugin", "dra", "mixed"),
        default="device-plugin",
        help="the nodes' mode: device-plugin (the extender), dra (the workloads translated to claims by the "
        "webhook, allocated by the scheduler) or mixed (gpu-b in DRA mode, namespace ai-team translated) "
        "(default: %(default)s)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.set_defaults(handler=run)
    return parser


__all__ = ["add_parser", "container_env", "run", "usage_table"]
