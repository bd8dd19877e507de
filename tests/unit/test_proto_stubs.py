"""The committed gRPC stubs (Device Plugin API, PodResources API, the DRA plugin, plugin registration and
DRA resource health APIs) are exactly what hack/gen_proto.py generates."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATOR = REPO_ROOT / "hack" / "gen_proto.py"
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
# (proto source, package directory of its stubs)
TARGETS = {
    "deviceplugin": ("proto/deviceplugin/v1beta1/api.proto", "hami_node/plugin/api"),
    "podresources": ("proto/podresources/v1/api.proto", "hami_node/plugin/podresources"),
    "dra-v1": ("proto/dra/v1/api.proto", "hami_node/dra/api/v1"),
    "dra-v1beta1": ("proto/dra/v1beta1/api.proto", "hami_node/dra/api/v1beta1"),
    "pluginregistration": ("proto/pluginregistration/v1/api.proto", "hami_node/dra/api/registration"),
    "dra-health-v1alpha1": ("proto/dra-health/v1alpha1/api.proto", "hami_node/dra/api/health/v1alpha1"),
}


def _generate(out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    result = _generate(out, REPO_ROOT)
    assert result.returncode == 0, f"hack/gen_proto.py failed:\n{result.stdout}{result.stderr}"
    return out


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_committed_stubs_match_the_generator(generated: Path, target: str) -> None:
    proto, package_dir = TARGETS[target]
    fresh_dir = generated / package_dir
    assert sorted(p.name for p in fresh_dir.iterdir()) == sorted(GENERATED_FILES)

    stale = []
    for name in GENERATED_FILES:
        fresh = (fresh_dir / name).read_bytes()
        committed_path = REPO_ROOT / package_dir / name
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
        f"the generated stubs in {package_dir} are out of date with {proto} "
        "(or grpcio-tools changed); run `python hack/gen_proto.py` and commit the result.\n\n"
        + "\n\n".join(stale)
    )


def test_generator_writes_nothing_but_the_targets_stubs(generated: Path) -> None:
    written = sorted(str(p.relative_to(generated)) for p in generated.rglob("*") if p.is_file())
    assert written == sorted(f"{d}/{name}" for _, d in TARGETS.values() for name in GENERATED_FILES)


def test_generator_output_is_reproducible(tmp_path: Path) -> None:
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run
        result = _generate(out, tmp_path)
        assert result.returncode == 0, result.stderr
        outputs.append({str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_grpc_module_imports_messages_from_the_package(target: str) -> None:
    package_dir = TARGETS[target][1]
    text = (REPO_ROOT / package_dir / "api_pb2_grpc.py").read_text(encoding="utf-8")
    assert f"from {package_dir.replace('/', '.')} import api_pb2 as " in text
    assert "\nimport api_pb2" not in text


def test_one_target_can_be_generated_alone(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path), "--target", "podresources"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [f"hami_node/plugin/podresources/{name}" for name in sorted(GENERATED_FILES)]
