"""What hami_kube's client costs in resident memory: a fresh interpreter imports `hami_kube.client`,
connects with a kubeconfig holding a bearer token (`KubeApi.connect`), makes one GET against the local
API server (`hami-sim apiserver`, its own process) and reports its VmRSS, and whether any `kubernetes`
module got imported. The interpreter alone (`python -c pass`) and `import kubernetes.aio.config` are
measured the same way for scale. Each figure is the median of --rounds fresh processes. Usage:

    python bench/kube_memory.py [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import add_json_option, arg_parser, markdown_table, start_apiserver, write_json

RSS = (
    "import pathlib\n"
    "def rss():\n"
    "    for line in pathlib.Path('/proc/self/status').read_text().splitlines():\n"
    "        if line.startswith('VmRSS:'):\n"
    "            return int(line.split()[1]) / 1024\n"
)

CONNECT = RSS + (
    "import asyncio, sys\n"
    "from hami_kube.client import KubeApi\n"
    "async def main():\n"
    "    async with await KubeApi.connect(sys.argv[1]) as api:\n"
    "        await api.get('/api/v1/namespaces')\n"
    "asyncio.run(main())\n"
    "print(rss(), any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))\n"
)

CASES = {
    "python -c pass": RSS + "print(rss(), False)\n",
    "import kubernetes.aio.config": RSS
    + "import sys, kubernetes.aio.config\nprint(rss(), 'kubernetes' in sys.modules)\n",
    "import hami_kube.client + connect (token) + one GET": CONNECT,
}


def measure(code: str, kubeconfig: Path) -> tuple[float, bool]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(kubeconfig)], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), out[1] == "True"


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server, _url = start_apiserver(kubeconfig, Path(tmp) / "apiserver.log")
        try:
            results: dict[str, dict[str, object]] = {}
            for name, code in CASES.items():
                runs = [measure(code, kubeconfig) for _ in range(args.rounds)]
                results[name] = {
                    "rss_mib": statistics.median(r[0] for r in runs),
                    "kubernetes_imported": any(r[1] for r in runs),
                }
        finally:
            server.terminate()
            server.wait(timeout=10)
    rows = [
        (name, f"{result['rss_mib']:.1f} MiB", "yes" if result["kubernetes_imported"] else "no")
        for name, result in results.items()
    ]
    print("\n".join(markdown_table(("process", "VmRSS (median)", "`kubernetes` imported"), "lll", rows)))
    write_json(args.json, results)


if __name__ == "__main__":
    main()
