"""`hami-sim demo`: the whole system on one machine, in under a minute.

Brings up a small local cluster (3 nodes x 4 fake GPUs of two models: two A100 80 GB nodes and one T4
node; and, beside them, a node of 2 Huawei Ascend 910B4 NPUs and one of 2 Hygon DCUs, each served by a
stand-in for its vendor's device plugin, `hami_sim.vendors`: HAMi's other accelerators, docs/vendors.md;
and two nodes in NVIDIA's own sharing modes, hami-node reading NVIDIA's config file: an A100 40GB with MIG
strategy mixed and three MIG devices, a T4 time-sliced 4 ways, `examples/demo-nvidia/config/`), applies
the workloads in `examples/demo/`, `examples/demo-vendors/` and `examples/demo-nvidia/` through the
official client, as a user would (the webhook, the scheduler stand-ins, the extender, the kubelet
stand-ins, the node daemons and the vendor plugins all take their real part), and prints:

- for each pod its outcome: the node and GPUs it got, or why it was refused or is pending, in plain words;
- a per-GPU usage table (slices, memory, cores) with bars, `kubectl hami top`'s (hami_control.status);
- the environment one container received from the node daemon's Allocate (what HAMi-core enforces).

Then it tears the cluster down (`--keep` leaves it running for `kubectl --kubeconfig
.hami-sim/kubeconfig ...` and `hami-sim down`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hami_api import dra
from hami_api.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, decode_pod_allocation
from hami_api.types import NVIDIA, PodAllocation
from hami_control.config import ControlConfig, DeviceSettings
from hami_control.status.dra import claim_shares, dra_gpus, pod_claim_names
from hami_control.status.snapshot import Snapshot
from hami_control.status.top import build_top, render_top

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "demo"
VENDOR_EXAMPLES = EXAMPLES.parent / "demo-vendors"
"""Pods of the other vendors, applied when the cluster has their nodes (device-plugin and mixed modes)."""
NVIDIA_EXAMPLES = EXAMPLES.parent / "demo-nvidia"
"""Pods asking NVIDIA's resources (a time-slice, MIG devices), applied when the cluster has the nodes in
NVIDIA's modes of `NVIDIA_INVENTORY` (device-plugin and mixed modes)."""
NVIDIA_INVENTORY = NVIDIA_EXAMPLES / "config" / "inventory.yaml"
"""The nodes in NVIDIA's modes, as a `hami-sim up --inventory` file naming NVIDIA's config files."""


DEMO_CONFIG = ControlConfig(devices=DeviceSettings(enable_ascend=True))
"""How the demo reads its cluster: hami-control's settings with Ascend on, as the cluster runs it."""


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
        return _vendor_allocation(annotations)
    try:
        return decode_pod_allocation(text)
    except ValueError:
        return None


def _vendor_allocation(annotations: Mapping[str, str]) -> PodAllocation | None:
    """The devices of another vendor the pod got (its vendor's allocated annotation), if any."""
    for vendor in DEMO_CONFIG.registry.others:
        text = annotations.get(vendor.names.allocated) if vendor.names.allocated else None
        if text:
            try:
                return decode_pod_allocation(text, vendor.names.allocated)
            except ValueError:
                return None
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


def _nvidia_asks(pod: Any) -> list[tuple[str, str, str]]:
    """(container, resource, count) of the NVIDIA resources a pod asks that HAMi does not manage
    (`nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`): what NVIDIA's plugin serves."""
    out = []
    for c in pod.spec.containers:
        limits = (c.resources.limits if c.resources else None) or {}
        for key, value in sorted(limits.items()):
            if key.startswith("nvidia.com/") and (key.startswith("nvidia.com/mig-") or "." in key[11:]):
                out.append((c.name, key, str(value)))
    return out


def _nvidia_outcome(pod: Any, env_of: Callable[[Any, str], dict[str, str]] | None) -> str:
    """`Running on ts-a; notebook: nvidia.com/gpu.shared 1 -> NVIDIA_VISIBLE_DEVICES=GPU-...`."""
    parts = []
    for container, key, count in _nvidia_asks(pod):
        visible = ""
        if env_of is not None:
            try:
                visible = env_of(pod, container).get("NVIDIA_VISIBLE_DEVICES", "")
            except Exception:  # the outcome line goes on without it
                visible = ""
        parts.append(
            f"{container}: {key} {count}" + (f" -> NVIDIA_VISIBLE_DEVICES={visible}" if visible else "")
        )
    return f"Running on {pod.spec.node_name} (NVIDIA's plugin, {pod.spec.scheduler_name}); " + "; ".join(
        parts
    )


def _outcomes(
    core: Any,
    created: list[tuple[str, str]],
    refused: list[Outcome],
    resource: Any = None,
    env_of: Callable[[Any, str], dict[str, str]] | None = None,
) -> list[Outcome]:
    """Each pod's outcome line; `env_of(pod, container)` is a container's environment (for the
    NVIDIA_VISIBLE_DEVICES of pods on NVIDIA's plugin)."""
    out = list(refused)
    for namespace, name in created:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Running" and _nvidia_asks(pod):
            out.append(Outcome(namespace, name, _nvidia_outcome(pod, env_of), True))
            continue
        if resource is not None and pod.spec.resource_claims and pod.status.phase == "Running":
            results = pod_claim_results(core, resource, pod)
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
                    gpus = ", ".join(
                        f"{s.uuid[-8:]}{'' if s.vendor == NVIDIA else f' ({s.vendor})'} {s.usedmem} MiB "
                        f"{s.usedcores}%"
                        for s in slices.devices
                    )
                    parts.append(f"{container}: {gpus}")
            out.append(
                Outcome(namespace, name, f"Running on {pod.spec.node_name}; " + "; ".join(parts), True)
            )
        else:
            out.append(Outcome(namespace, name, _pending_reason(core, pod), False))
    return out


def _json(core: Any, obj: Any) -> Any:
    """An official-client object as the API server's JSON (what the status code reads)."""
    return core.api_client.sanitize_for_serialization(obj)


def _dra_objects(core: Any, resource: Any) -> tuple[list[Any], list[Any]]:
    """Our driver's ResourceSlices and every ResourceClaim, as JSON."""
    slices = _json(core, resource.list_resource_slice(field_selector=f"spec.driver={dra.DRIVER}"))
    claims = _json(core, resource.list_resource_claim_for_all_namespaces())
    return slices.get("items") or [], claims.get("items") or []


def pod_claim_results(core: Any, resource: Any, pod: Any) -> list[tuple[str, str, int, int]]:
    """(claim, device uuid or name, MiB, cores) of the pod's allocated claims."""
    slices, claims = _dra_objects(core, resource)
    gpus = dra_gpus(slices)
    names = set(pod_claim_names(_json(core, pod)))
    mine = [
        c
        for c in claims
        if c["metadata"]["namespace"] == pod.metadata.namespace and c["metadata"]["name"] in names
    ]
    return [(s.claim, gpus[s.device].info.id, s.memory, s.cores) for s in claim_shares(mine, gpus)]


def usage_table(core: Any, resource: Any = None) -> str:
    """`kubectl hami top`'s table (hami_control.status): per GPU, slices, memory and cores in use, health
    and pods, as hami-control counts them from the node inventory and the pods' allocations; on DRA nodes
    (when `resource`, ResourceV1Api, is given) from the ResourceSlices and the claims' allocations, where
    slices are the claims' shares and have no fixed count."""
    # hami-control's cache warns about nodes without its register annotation: the nodes in NVIDIA's
    # modes have none by design (kube-scheduler alone places their pods); not news in the demo's output.
    logging.getLogger("hami_control.cache").setLevel(logging.ERROR)
    nodes = _json(core, core.list_node()).get("items") or []
    pods = _json(core, core.list_pod_for_all_namespaces()).get("items") or []
    slices, claims = _dra_objects(core, resource) if resource is not None else ([], [])
    snapshot = Snapshot.of(DEMO_CONFIG, nodes, pods, (), slices, claims)
    return render_top(build_top(snapshot))


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
    from hami_sim.cluster.spec import SpecError, load_inventory_spec
    from hami_sim.vendors.table import device_spec

    started = time.monotonic()
    a100, t4 = GPUSpec("NVIDIA A100-SXM4-80GB"), GPUSpec("NVIDIA Tesla T4", 15360)
    vendors = args.mode != "dra" and not args.no_vendors  # a vendor's node serves through its plugin
    others = (
        (
            NodeSpec("npu-a", (), devices=device_spec({"vendor": "ascend", "model": "910B4", "count": 2})),
            NodeSpec("dcu-a", (), devices=device_spec({"vendor": "hygon", "count": 2})),
        )
        if vendors
        else ()
    )
    nvidia_modes = args.mode != "dra" and not args.no_nvidia_modes  # NVIDIA's plugin: no DRA
    try:
        nvidia_nodes = load_inventory_spec(NVIDIA_INVENTORY) if nvidia_modes else ()
    except SpecError as err:
        print(f"hami-sim demo: {err}", file=sys.stderr)
        return 1
    spec = ClusterSpec(
        nodes=(
            NodeSpec("gpu-a", (a100,) * 4),
            NodeSpec("gpu-b", (a100,) * 4),
            NodeSpec("gpu-t4", (t4,) * 4),
            *others,
            *nvidia_nodes,
        ),
        split=args.split,
    ).with_mode(args.mode)
    how = {"device-plugin": "", "dra": " in DRA mode", "mixed": ", gpu-b in DRA mode"}[args.mode]
    beside = "; an Ascend 910B4 node and a Hygon DCU node, 2 devices each" if vendors else ""
    if nvidia_modes:
        beside += "; NVIDIA's modes: mig-a (A100 40GB, MIG strategy mixed), ts-a (T4, time-sliced x4)"
    print(
        f"== Bringing up a local cluster: 3 nodes x 4 fake GPUs (2 x A100 80GB nodes, 1 x T4 node){how}"
        f"{beside}",
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
        extra_dirs = []
        if args.examples == EXAMPLES:
            extra_dirs += [VENDOR_EXAMPLES] if vendors else []
            extra_dirs += [NVIDIA_EXAMPLES] if nvidia_modes else []
        applying = ", ".join(f"{d}/" for d in (args.examples, *extra_dirs))
        print(f"== Cluster up in {time.monotonic() - started:.1f} s; applying {applying}", flush=True)
        created: list[tuple[str, str]] = []
        refused: list[Outcome] = []
        documents = list(_documents(args.examples))
        for directory in extra_dirs:
            documents += list(_documents(directory))
        for doc in documents:
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

        def env_of(pod: Any, container: str) -> dict[str, str]:
            return container_env(cluster, core, pod.metadata.namespace, pod.metadata.name, container)

        for outcome in _outcomes(core, created, refused, resource, env_of):
            mark = "ok " if outcome.ok else "-- "
            print(f"{mark}{outcome.namespace}/{outcome.name}: {outcome.text}")
        print("\n== Device usage (slices, memory, cores; NVIDIA's GPUs and the other vendors' devices)")
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
    parser.add_argument(
        "--no-vendors",
        action="store_true",
        help="leave out the Ascend and Hygon nodes and their pods (NVIDIA only)",
    )
    parser.add_argument(
        "--no-nvidia-modes",
        action="store_true",
        help="leave out the nodes in NVIDIA's own sharing modes (mig-a: MIG strategy mixed, ts-a: "
        "time-slicing) and their pods (always left out with --mode dra)",
    )
    parser.set_defaults(handler=run)
    return parser


__all__ = ["add_parser", "container_env", "run", "usage_table"]
