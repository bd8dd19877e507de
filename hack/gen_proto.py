"""Generate the Python stubs of the kubelet gRPC APIs we speak.

The one generator for these targets (each ``api_pb2{.py,.pyi,_grpc.py}`` in the package that uses it):

- ``deviceplugin``: ``proto/deviceplugin/v1beta1/api.proto`` -> ``hami_node/plugin/api/``
- ``podresources``: ``proto/podresources/v1/api.proto`` -> ``hami_node/plugin/podresources/``
- ``dra-v1``: ``proto/dra/v1/api.proto`` -> ``hami_node/dra/api/v1/``
- ``dra-v1beta1``: ``proto/dra/v1beta1/api.proto`` -> ``hami_node/dra/api/v1beta1/``
- ``pluginregistration``: ``proto/pluginregistration/v1/api.proto`` -> ``hami_node/dra/api/registration/``
- ``dra-health-v1alpha1``: ``proto/dra-health/v1alpha1/api.proto`` -> ``hami_node/dra/api/health/v1alpha1/``

    python hack/gen_proto.py                       # regenerate every committed stub in place
    python hack/gen_proto.py --out DIR             # write them under DIR, laid out as in the repository
    python hack/gen_proto.py --target podresources # only one target (with or without --out)

For each target the proto is copied into a scratch tree at ``<package>/api.proto`` before
``grpc_tools.protoc`` runs, so the generated gRPC module imports its messages as
``from <package> import api_pb2`` without any post-processing. protoc only sees relative paths, so the
output does not depend on where the repository or the scratch directory lives: it is byte-for-byte
reproducible for a given grpcio-tools.
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


@dataclass(frozen=True)
class Target:
    name: str
    proto: Path
    """The source, relative to the repository root."""
    package_dir: Path
    """Where the stubs live, relative to the repository root (and to `--out`)."""

    @property
    def expected_grpc_import(self) -> str:
        return f"from {'.'.join(self.package_dir.parts)} import api_pb2 as "


TARGETS = (
    Target("deviceplugin", Path("proto/deviceplugin/v1beta1/api.proto"), Path("hami_node/plugin/api")),
    Target("podresources", Path("proto/podresources/v1/api.proto"), Path("hami_node/plugin/podresources")),
    Target("dra-v1", Path("proto/dra/v1/api.proto"), Path("hami_node/dra/api/v1")),
    Target("dra-v1beta1", Path("proto/dra/v1beta1/api.proto"), Path("hami_node/dra/api/v1beta1")),
    Target(
        "pluginregistration",
        Path("proto/pluginregistration/v1/api.proto"),
        Path("hami_node/dra/api/registration"),
    ),
    Target(
        "dra-health-v1alpha1",
        Path("proto/dra-health/v1alpha1/api.proto"),
        Path("hami_node/dra/api/health/v1alpha1"),
    ),
)


def well_known_protos_dir() -> Path:
    """The include directory of the well-known protos bundled with grpc_tools."""
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def generate(target: Target, out_dir: Path) -> list[Path]:
    """Run protoc on the target's proto and write its stubs into ``out_dir`` (the files themselves,
    not a package tree)."""
    source = REPO_ROOT / target.proto
    if not source.is_file():
        raise SystemExit(f"gen_proto: {target.name}: proto source not found: {source}")
    with tempfile.TemporaryDirectory(prefix="hami-gen-proto-") as scratch_name:
        scratch = Path(scratch_name)
        src = scratch / "src"
        gen = scratch / "gen"
        (src / target.package_dir).mkdir(parents=True)
        gen.mkdir()
        shutil.copyfile(source, src / target.package_dir / "api.proto")
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            "src",
            "-I",
            str(well_known_protos_dir()),
            "--python_out=gen",
            "--pyi_out=gen",
            "--grpc_python_out=gen",
            (target.package_dir / "api.proto").as_posix(),
        ]
        result = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(
                f"gen_proto: {target.name}: protoc failed with exit code {result.returncode}:\n"
                f"{result.stderr}"
            )
        grpc_module = (gen / target.package_dir / "api_pb2_grpc.py").read_text(encoding="utf-8")
        if target.expected_grpc_import not in grpc_module:
            raise SystemExit(
                f"gen_proto: {target.name}: api_pb2_grpc.py lacks the import "
                f"{target.expected_grpc_import!r}; protoc changed its output layout"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED_FILES:
            destination = out_dir / name
            destination.write_bytes((gen / target.package_dir / name).read_bytes())
            written.append(destination)
        return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="root under which each target's package directory is written (default: the repository)",
    )
    parser.add_argument(
        "--target",
        choices=[t.name for t in TARGETS],
        action="append",
        help="generate only this target (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    chosen = [t for t in TARGETS if args.target is None or t.name in args.target]
    for target in chosen:
        for path in generate(target, args.out / target.package_dir):
            sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
