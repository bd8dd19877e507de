"""Screenshots of the Prometheus UI with an alert firing on the local cluster, for docs/observability.md.

Brings up a one-node local cluster with Prometheus beside it (`hami-sim up --monitoring`: the install's
scrape setup and rules, every second), runs a GPU pod, injects one Xid (79) on a fake GPU, waits until
`HamiGPUXidError` fires, and has headless Chromium take two screenshots:

- `prometheus-alerts.png`: the Alerts page (the firing alert, the pending HamiGPUUnhealthy, the rest
  inactive);
- `prometheus-xid.png`: the Graph page with the `ALERTS` series and the dashboard's Xid panel query.

    python hack/prometheus_screenshot.py [--out-dir docs/images] [--chromium chromium]

Needs `prometheus` (hack/setup.sh installs Debian's package as root) and Chromium (Debian's package:
apt-get install --no-install-recommends chromium; not installed by hack/setup.sh, as nothing else uses
it). About 20 s on two cores. Debian's Prometheus 2.42 serves its classic UI under /classic/; another
build's /alerts and /graph are used when there is no /classic/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hami_api.annotations import DEVICES_ALLOCATED  # noqa: E402
from hami_sim.cluster import Cluster, ClusterSpec  # noqa: E402

DASHBOARD = REPO / "daemonset" / "components" / "monitoring" / "hami-dashboard.json"
NODE = "gpu-node-1"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"prometheus_screenshot: timed out waiting for {what}")
        time.sleep(0.3)


def api(url: str, path: str, **params: str) -> object:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as response:
        return json.loads(response.read())["data"]


def ui_prefix(url: str) -> str:
    """'/classic' where the build serves its classic UI there (Debian's), else ''."""
    try:
        with urllib.request.urlopen(f"{url}/classic/alerts", timeout=10):
            return "/classic"
    except urllib.error.HTTPError:
        return ""


def xid_query() -> str:
    (panel,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("title") == "Xid errors"]
    expr: str = panel["targets"][0]["expr"]
    return expr.replace('{node=~"$node"}', "").replace("$__rate_interval", "1m")


def screenshot(chromium: str, url: str, out: Path, size: str, profile: Path) -> None:
    argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}"]
    argv += ["--virtual-time-budget=8000", f"--screenshot={out}", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"prometheus_screenshot: chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--chromium", default="chromium", help="the Chromium binary (default: %(default)s)")
    args = parser.parse_args(argv)
    chromium = shutil.which(args.chromium)
    if chromium is None:
        raise SystemExit(f"prometheus_screenshot: no {args.chromium} on PATH (apt-get install chromium)")
    from kubernetes import client, config

    from tests.builders import gpu_pod

    with tempfile.TemporaryDirectory() as tmp:
        spec = ClusterSpec.uniform(1, 2, monitoring=True, monitoring_interval_s=1.0)
        with Cluster.up(spec, Path(tmp) / ".hami-sim", progress=print) as cluster:
            url = cluster.prometheus_url

            def scraped() -> bool:
                targets = api(url, "/api/v1/targets")["activeTargets"]  # type: ignore[index]
                return bool(targets) and all(t["health"] == "up" for t in targets)

            wait(scraped, 30, "every target scraped")
            api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
            core = client.CoreV1Api(api_client)
            core.create_namespaced_pod("default", gpu_pod("inference", gpumem=4000, gpucores=30))

            def running() -> bool:
                got = core.read_namespaced_pod("inference", "default")
                return bool(got.status.phase == "Running" and DEVICES_ALLOCATED in got.metadata.annotations)

            wait(running, 60, "the GPU pod to run")
            api_client.close()
            cluster.inject_gpu_fault(NODE, 1, "xid", xid=79)

            def firing() -> bool:
                alerts = api(url, "/api/v1/alerts")["alerts"]  # type: ignore[index]
                return any(
                    a["labels"]["alertname"] == "HamiGPUXidError" and a["state"] == "firing" for a in alerts
                )

            wait(firing, 30, "HamiGPUXidError to fire")
            time.sleep(5)  # a few more points on the graph
            prefix = ui_prefix(url)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            profile = Path(tmp) / "chromium"
            screenshot(
                chromium, f"{url}{prefix}/alerts", args.out_dir / "prometheus-alerts.png", "1400,900", profile
            )
            graph = urllib.parse.urlencode(
                {
                    "g0.expr": "ALERTS",
                    "g0.tab": "1",
                    "g1.expr": xid_query(),
                    "g1.tab": "0",
                    "g1.range_input": "1m",
                }
            )
            screenshot(
                chromium,
                f"{url}{prefix}/graph?{graph}",
                args.out_dir / "prometheus-xid.png",
                "1400,1250",
                profile,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
