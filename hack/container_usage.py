"""Live per-container GPU memory on the local cluster, for docs/observability.md: brings up the demo's
cluster (`hami-sim demo`'s 3 nodes: two with 4 A100 80GB, one with 4 T4), applies the demo's workloads
(examples/demo/), scrapes every node daemon's /metrics (`Cluster.node_metrics_url`) every `--interval`
seconds for `--seconds`, and draws each running container's `hami_vgpu_memory_used_bytes` against its
`hami_vgpu_memory_limit_bytes` (one panel per container and GPU) into a PNG. It then prints
`kubectl hami top` (the console script, on the cluster's kubeconfig) and tears the cluster down.

    python hack/container_usage.py [--out docs/images/container-memory.png] [--seconds 45]

The values are the fake backend's simulated HAMi-core containers (hami_node/monitor/simulate.py): each
moves along `0.5 + 0.3 sin(2 pi (t / 10 min + phase))` of its limit, the phase drawn from its region
file's path (pod UID, cache id), so a run shows the same shapes with other phases. matplotlib is not a
dependency of hami-py: run it with a Python that has it (pip install matplotlib). It takes about a
minute and a half on two cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec  # noqa: E402
from hami_sim.demo import EXAMPLES, _create, _documents  # noqa: E402

GIB = 1024**3
Key = tuple[str, str, str, str]
"""(node, namespace/pod, container, GPU index in the container)."""


def scrape(url: str, node: str) -> dict[Key, tuple[float, float]]:
    """(used, limit) bytes per container and GPU on one node's /metrics."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    used: dict[Key, float] = {}
    limit: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in ("hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes"):
                continue
            labels = sample.labels
            key = (
                node,
                f"{labels['namespace']}/{labels['pod']}",
                labels["container"],
                labels["vdevice_index"],
            )
            (used if sample.name == "hami_vgpu_memory_used_bytes" else limit)[key] = float(sample.value)
    return {k: (v, limit[k]) for k, v in used.items() if k in limit}


def run_workload(cluster: Cluster) -> None:
    from kubernetes import client, config

    api_client: Any = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api_client)
    pods = []
    for doc in _documents(EXAMPLES):
        if _create(api_client, doc) is None and doc.get("kind") == "Pod":
            meta = doc["metadata"]
            pods.append((meta.get("namespace") or "default", meta["name"]))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if all(core.read_namespaced_pod(name, ns).status.phase == "Running" for ns, name in pods):
            break  # (the webhook refuses two of the demo's pods at creation: not in `pods`)
        time.sleep(1)
    api_client.close()


def sample(cluster: Cluster, seconds: float, interval: float) -> dict[Key, list[tuple[float, float, float]]]:
    series: dict[Key, list[tuple[float, float, float]]] = {}
    start = time.monotonic()
    while (now := time.monotonic() - start) <= seconds:
        for node in cluster.node_names:
            for key, (used, limit) in scrape(cluster.node_metrics_url(node), node).items():
                series.setdefault(key, []).append((now, used, limit))
        time.sleep(max(0.0, interval - (time.monotonic() - start - now)))
    return series


def draw(series: dict[Key, list[tuple[float, float, float]]], out: Path, seconds: float) -> None:
    keys = sorted(series)
    cols = 4
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        node, pod, container, index = key
        t = [p[0] for p in series[key]]
        used = [p[1] / GIB for p in series[key]]
        limit = [p[2] / GIB for p in series[key]]
        ax.fill_between(t, used, color="tab:blue", alpha=0.25)
        ax.plot(t, used, color="tab:blue", label="used")
        ax.plot(t, limit, color="tab:red", linestyle="--", label="limit (gpumem)")
        ax.set_ylim(0, max(limit) * 1.1)
        ax.set_xlim(0, seconds)
        ax.set_title(f"{pod} / {container} (GPU {index})\non {node}", fontsize=9)
        ax.set_ylabel("GiB", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=8)
    fig.suptitle(
        "hami_vgpu_memory_used_bytes vs hami_vgpu_memory_limit_bytes from each node daemon's /metrics\n"
        "(local cluster, the demo's workload; simulated HAMi-core containers)",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "container-memory.png")
    parser.add_argument(
        "--seconds", type=float, default=45.0, help="how long to scrape (default: %(default)s)"
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between scrapes (default: %(default)s)"
    )
    args = parser.parse_args()
    a100, t4 = GPUSpec("NVIDIA A100-SXM4-80GB"), GPUSpec("NVIDIA Tesla T4", 15360)
    spec = ClusterSpec(
        nodes=(NodeSpec("gpu-a", (a100,) * 4), NodeSpec("gpu-b", (a100,) * 4), NodeSpec("gpu-t4", (t4,) * 4))
    )
    with (
        tempfile.TemporaryDirectory(prefix="hami-usage-") as tmp,
        Cluster.up(spec, Path(tmp) / "state") as cluster,
    ):
        print("cluster up; applying examples/demo/", file=sys.stderr)
        run_workload(cluster)
        print(f"scraping {len(cluster.node_names)} node daemons for {args.seconds:g} s", file=sys.stderr)
        series = sample(cluster, args.seconds, args.interval)
        draw(series, args.out, args.seconds)
        print(f"wrote {args.out} ({len(series)} containers x GPUs)", file=sys.stderr)
        script = Path(sys.executable).parent / "kubectl-hami"
        top = subprocess.run(
            [str(script), "top", "--kubeconfig", str(cluster.kubeconfig)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        print("$ kubectl hami top")
        print(top.stdout + top.stderr, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
