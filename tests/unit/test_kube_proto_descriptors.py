"""The committed Kubernetes message descriptors are exactly what hack/gen_kube_proto.py generates from
proto/k8s.io/... (and proto/kubejson/options.proto)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATOR = REPO_ROOT / "hack" / "gen_kube_proto.py"
MODULE = REPO_ROOT / "hami_sim" / "apiserver" / "kubeproto_descriptors.py"


def _generate(out: Path, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"hack/gen_kube_proto.py failed:\n{result.stdout}{result.stderr}"
    return (out / MODULE.name).read_text(encoding="utf-8")


def test_committed_descriptors_match_the_generator(tmp_path: Path) -> None:
    fresh = _generate(tmp_path, REPO_ROOT)
    assert fresh == MODULE.read_text(encoding="utf-8"), (
        "hami_sim/apiserver/kubeproto_descriptors.py is out of date with proto/k8s.io/... (or grpcio-tools "
        "changed); run `python hack/gen_kube_proto.py` and commit the result."
    )


def test_generator_output_does_not_depend_on_where_it_runs(tmp_path: Path) -> None:
    assert _generate(tmp_path / "a", REPO_ROOT) == _generate(tmp_path / "b", tmp_path)
