"""The committed Device Plugin API stubs are exactly what hack/gen_proto.py generates."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATOR = REPO_ROOT / "hack" / "gen_proto.py"
STUB_DIR = REPO_ROOT / "hami_node" / "plugin" / "api"
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_committed_stubs_match_the_generator(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"hack/gen_proto.py failed:\n{result.stdout}{result.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(GENERATED_FILES)

    stale = []
    for name in GENERATED_FILES:
        fresh = (tmp_path / name).read_bytes()
        committed_path = STUB_DIR / name
        committed = committed_path.read_bytes() if committed_path.exists() else b""
        if fresh != committed:
            diff = difflib.unified_diff(
                committed.decode("utf-8", "replace").splitlines(),
                fresh.decode("utf-8", "replace").splitlines(),
                f"committed/{name}",
                f"generated/{name}",
                lineterm="",
                n=1,
            )
            stale.append(f"{name}:\n" + "\n".join(list(diff)[:40]))
    assert not stale, (
        "the generated Device Plugin stubs are out of date with proto/deviceplugin/v1beta1/api.proto "
        "(or grpcio-tools changed); run `python hack/gen_proto.py` and commit the result.\n\n"
        + "\n\n".join(stale)
    )


def test_generator_output_is_reproducible(tmp_path: Path) -> None:
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run(
            [sys.executable, str(GENERATOR), "--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
            check=True,
        )
        outputs.append({name: (out / name).read_bytes() for name in GENERATED_FILES})
    assert outputs[0] == outputs[1]


def test_grpc_module_imports_messages_from_the_package() -> None:
    text = (STUB_DIR / "api_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from hami_node.plugin.api import api_pb2 as " in text
    assert "\nimport api_pb2" not in text
