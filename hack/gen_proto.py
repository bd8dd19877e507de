"""Generate the Python stubs for the kubelet Device Plugin API v1beta1.

The one generator for ``hami_node/plugin/api/api_pb2{.py,.pyi,_grpc.py}``:

    python hack/gen_proto.py            # regenerate the committed stubs in place
    python hack/gen_proto.py --out DIR  # write the three files into DIR instead

The proto is copied into a scratch tree at ``hami_node/plugin/api/api.proto`` before
``grpc_tools.protoc`` runs, so the generated gRPC module imports its messages as
``from hami_node.plugin.api import api_pb2`` without any post-processing. protoc only
sees relative paths, so the output does not depend on where the repository or the
scratch directory lives: it is byte-for-byte reproducible for a given grpcio-tools.
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_SOURCE = REPO_ROOT / "proto" / "deviceplugin" / "v1beta1" / "api.proto"
PACKAGE_DIR = Path("hami_node") / "plugin" / "api"
STUB_DIR = REPO_ROOT / PACKAGE_DIR
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
EXPECTED_GRPC_IMPORT = "from hami_node.plugin.api import api_pb2 as "


def well_known_protos_dir() -> Path:
    """The include directory of the well-known protos bundled with grpc_tools."""
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the Device Plugin proto and write the stubs into ``out_dir``."""
    if not PROTO_SOURCE.is_file():
        raise SystemExit(f"gen_proto: proto source not found: {PROTO_SOURCE}")
    with tempfile.TemporaryDirectory(prefix="hami-gen-proto-") as scratch_name:
        scratch = Path(scratch_name)
        src = scratch / "src"
        gen = scratch / "gen"
        (src / PACKAGE_DIR).mkdir(parents=True)
        gen.mkdir()
        shutil.copyfile(PROTO_SOURCE, src / PACKAGE_DIR / "api.proto")
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
            (PACKAGE_DIR / "api.proto").as_posix(),
        ]
        result = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"gen_proto: protoc failed with exit code {result.returncode}:\n{result.stderr}")
        grpc_module = (gen / PACKAGE_DIR / "api_pb2_grpc.py").read_text(encoding="utf-8")
        if EXPECTED_GRPC_IMPORT not in grpc_module:
            raise SystemExit(
                f"gen_proto: api_pb2_grpc.py lacks the import {EXPECTED_GRPC_IMPORT!r}; "
                "protoc changed its output layout"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED_FILES:
            target = out_dir / name
            target.write_bytes((gen / PACKAGE_DIR / name).read_bytes())
            written.append(target)
        return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        default=STUB_DIR,
        help=f"directory for the generated files (default: {STUB_DIR.relative_to(REPO_ROOT)})",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
