"""Kubernetes API protobuf messages for the stand-in API server (`hami_sim.apiserver.kubeproto`).

Two steps, one script:

    python hack/gen_kube_proto.py            # proto/k8s.io/... -> hami_sim/apiserver/kubeproto_descriptors.py
    python hack/gen_kube_proto.py --out DIR  # write the generated module into DIR instead
    python hack/gen_kube_proto.py --import-from API APIMACHINERY --tag v0.36.3
                                             # rewrite proto/k8s.io/... from upstream checkouts, then generate

Generating (the default) compiles the `.proto` files under `proto/` with `grpc_tools.protoc` into one
`FileDescriptorSet` (no source info, so the output depends only on the protos and grpcio-tools) and writes it
base64-encoded into a Python module. The server builds its message classes from that set at run time.

Importing writes `proto/k8s.io/<module path>/generated.proto` for the messages the stand-in serves (the
kinds in `ROOTS` and every message they reach), wire-compatible with upstream's go-to-protobuf output:
package, message and field names, numbers, types and labels are upstream's (compiled from the checkouts'
`generated.proto`). Each field also carries the facts of its Go struct field (from the `json:` tag and
type in the checkouts' `types.go`) that kube-apiserver's JSON depends on: `json_name` is the JSON key,
and `(kubejson.omitempty)`, `(kubejson.inline)` and `(kubejson.pointer)` say whether a zero value is left
out, whether the message's fields are written into its parent's object, and whether the Go field is a
pointer (absent on the wire when nil). Comments are not copied. The checkouts are read, never kept.
"""

from __future__ import annotations

import argparse
import base64
import importlib.resources
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
OPTIONS_PROTO = "kubejson/options.proto"
MODULE_NAME = "kubeproto_descriptors.py"
MODULE_DIR = REPO_ROOT / "hami_sim" / "apiserver"

# (module path of the Go package, proto package). The API groups the stand-in serves, and what they use.
PACKAGES = (
    ("k8s.io/apimachinery/pkg/api/resource", "k8s.io.apimachinery.pkg.api.resource"),
    ("k8s.io/apimachinery/pkg/runtime", "k8s.io.apimachinery.pkg.runtime"),
    ("k8s.io/apimachinery/pkg/runtime/schema", "k8s.io.apimachinery.pkg.runtime.schema"),
    ("k8s.io/apimachinery/pkg/util/intstr", "k8s.io.apimachinery.pkg.util.intstr"),
    ("k8s.io/apimachinery/pkg/apis/meta/v1", "k8s.io.apimachinery.pkg.apis.meta.v1"),
    ("k8s.io/api/core/v1", "k8s.io.api.core.v1"),
    ("k8s.io/api/coordination/v1", "k8s.io.api.coordination.v1"),
    ("k8s.io/api/admissionregistration/v1", "k8s.io.api.admissionregistration.v1"),
    ("k8s.io/api/events/v1", "k8s.io.api.events.v1"),
    ("k8s.io/api/resource/v1", "k8s.io.api.resource.v1"),
)

# The request bodies the stand-in decodes: its kinds, Binding, DeleteOptions, and the envelope.
ROOTS = (
    "k8s.io.api.core.v1.Pod",
    "k8s.io.api.core.v1.Node",
    "k8s.io.api.core.v1.Namespace",
    "k8s.io.api.core.v1.Event",
    "k8s.io.api.core.v1.ResourceQuota",
    "k8s.io.api.core.v1.LimitRange",
    "k8s.io.api.core.v1.Secret",
    "k8s.io.api.core.v1.ConfigMap",
    "k8s.io.api.core.v1.Binding",
    "k8s.io.api.coordination.v1.Lease",
    "k8s.io.api.admissionregistration.v1.MutatingWebhookConfiguration",
    "k8s.io.api.events.v1.Event",
    "k8s.io.api.resource.v1.DeviceClass",
    "k8s.io.api.resource.v1.ResourceSlice",
    "k8s.io.api.resource.v1.ResourceClaim",
    "k8s.io.api.resource.v1.ResourceClaimTemplate",
    "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "k8s.io.apimachinery.pkg.runtime.Unknown",
)

# Messages whose JSON is their Go type's own MarshalJSON (the server converts them by hand), so their
# fields need no JSON facts.
CUSTOM_JSON = frozenset(
    {
        "k8s.io.apimachinery.pkg.api.resource.Quantity",
        "k8s.io.apimachinery.pkg.api.resource.QuantityValue",
        "k8s.io.apimachinery.pkg.apis.meta.v1.Time",
        "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime",
        "k8s.io.apimachinery.pkg.apis.meta.v1.Duration",
        "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1",
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString",
        "k8s.io.apimachinery.pkg.runtime.RawExtension",
        "k8s.io.apimachinery.pkg.runtime.TypeMeta",
        "k8s.io.apimachinery.pkg.runtime.Unknown",
    }
)

_HEADER = """\
// Wire-compatible with {module}/generated.proto at {tag}:
// the package, message and field names, numbers, types and labels are upstream's, for the messages
// hami-sim's API server decodes. json_name and the kubejson options are the facts of each field's Go
// declaration (JSON key, ",omitempty", ",inline", pointer type) that kube-apiserver's JSON depends on.
// Written by `python hack/gen_kube_proto.py --import-from ...`; regenerate, do not edit."""


def well_known_protos_dir() -> Path:
    """The include directory of the well-known protos bundled with grpc_tools."""
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def _protoc(include: Iterable[Path], files: Iterable[str], cwd: Path) -> bytes:
    out = cwd / "set.binpb"
    cmd = [sys.executable, "-m", "grpc_tools.protoc"]
    for path in include:
        cmd += ["-I", str(path)]
    cmd += ["--include_imports", f"--descriptor_set_out={out}", *files]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"gen_kube_proto: protoc failed ({result.returncode}):\n{result.stderr}")
    return out.read_bytes()


# --- generate: proto/ -> the descriptor module ---------------------------------------------------------


def proto_files(root: Path = PROTO_ROOT) -> list[str]:
    """The Kubernetes protos under `root` (relative, sorted), without the options file."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "k8s.io").rglob("*.proto"))


def descriptor_set(root: Path = PROTO_ROOT) -> bytes:
    """The FileDescriptorSet of the protos under `root`, ready for a private pool: the options file and
    descriptor.proto are dropped (the options stay in each field's FieldOptions as unknown fields)."""
    with tempfile.TemporaryDirectory(prefix="hami-kube-proto-") as scratch:
        # Copy so that protoc sees only relative paths: the output must not depend on where we run.
        src = Path(scratch) / "src"
        shutil.copytree(root, src)
        raw = _protoc(
            [Path("src"), well_known_protos_dir()], [f"src/{f}" for f in proto_files(src)], Path(scratch)
        )
    files = descriptor_pb2.FileDescriptorSet.FromString(raw)
    kept = descriptor_pb2.FileDescriptorSet()
    for file in files.file:
        if file.name in (OPTIONS_PROTO, "google/protobuf/descriptor.proto"):
            continue
        dependencies = [d for d in file.dependency if d != OPTIONS_PROTO]
        del file.dependency[:]
        file.dependency.extend(dependencies)
        kept.file.append(file)
    return kept.SerializeToString(deterministic=True)


def render_module(data: bytes) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    lines = "\n".join(f'    "{chunk}"' for chunk in textwrap.wrap(encoded, 100))
    sources = "\n".join(f"#   proto/{f}" for f in proto_files())
    return (
        '"""The Kubernetes API messages the stand-in API server decodes: a serialized FileDescriptorSet.\n\n'
        "Generated by `python hack/gen_kube_proto.py` from proto/k8s.io/...; do not edit.\n"
        '"""\n\n'
        f"# Sources:\n{sources}\n\n"
        f"DESCRIPTOR_SET_BASE64 = (\n{lines}\n)\n"
    )


def generate(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / MODULE_NAME
    target.write_text(render_module(descriptor_set()), encoding="utf-8")
    return target


# --- import: upstream checkouts -> proto/k8s.io/... ----------------------------------------------------


@dataclass(frozen=True)
class GoField:
    json_name: str
    omitempty: bool
    inline: bool
    pointer: bool


_STRUCT = re.compile(r"^type (\w+) struct \{")
_FIELD = re.compile(r"^\s+(?:(\w+)\s+)?(\S+)\s+`([^`]*)`")
_TAG = re.compile(r'(\w+):"([^"]*)"')


def go_struct_fields(package_dir: Path) -> dict[str, dict[int, GoField]]:
    """Every struct field with a protobuf tag in the package's Go files: struct -> field number -> facts."""
    structs: dict[str, dict[int, GoField]] = {}
    for path in sorted(package_dir.glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        current: str | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            if match := _STRUCT.match(line):
                current = match.group(1)
                continue
            if line.startswith("}"):
                current = None
                continue
            if current is None or line.lstrip().startswith("//"):
                continue
            field = _FIELD.match(line)
            if field is None:
                continue
            go_name, go_type, tag_text = field.groups()
            tags = dict(_TAG.findall(tag_text))
            if "protobuf" not in tags or tags["protobuf"] == "-":
                continue
            number = int(tags["protobuf"].split(",")[1])
            json_parts = tags.get("json", "").split(",")
            name = json_parts[0] or (go_name or go_type.lstrip("*").rsplit(".", 1)[-1])
            inline = "inline" in json_parts[1:] or (go_name is None and json_parts[0] == "")
            structs.setdefault(current, {})[number] = GoField(
                json_name="" if inline else name,
                omitempty="omitempty" in json_parts[1:],
                inline=inline,
                pointer=go_type.startswith("*"),
            )
    return structs


_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def _type_name(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    name = field.type_name.lstrip(".")
    return (
        name[len(package) + 1 :]
        if name.startswith(package + ".") and "." not in name[len(package) + 1 :]
        else "." + name
    )


def import_protos(api_dir: Path, apimachinery_dir: Path, tag: str, out_root: Path = PROTO_ROOT) -> list[Path]:
    """Rewrite `out_root/k8s.io/...` from upstream checkouts of k8s.io/api and k8s.io/apimachinery."""
    checkouts = {"k8s.io/api": api_dir, "k8s.io/apimachinery": apimachinery_dir}

    def source_dir(module: str) -> Path:
        repo = "k8s.io/api" if module.startswith("k8s.io/api/") else "k8s.io/apimachinery"
        return checkouts[repo] / module[len(repo) + 1 :]

    with tempfile.TemporaryDirectory(prefix="hami-kube-import-") as scratch:
        src = Path(scratch) / "src"
        for module, _ in PACKAGES:
            (src / module).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_dir(module) / "generated.proto", src / module / "generated.proto")
        files = [f"{module}/generated.proto" for module, _ in PACKAGES]
        upstream = descriptor_pb2.FileDescriptorSet.FromString(_protoc([src], files, src))

    messages: dict[str, tuple[str, descriptor_pb2.DescriptorProto]] = {}
    for file in upstream.file:
        for message in file.message_type:
            messages[f"{file.package}.{message.name}"] = (file.package, message)

    reached: set[str] = set()
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        if name not in messages:
            raise SystemExit(f"gen_kube_proto: message {name} is not in the upstream protos")
        reached.add(name)
        package, message = messages[name]
        entries = {f"{name}.{n.name}": n for n in message.nested_type}
        for field in message.field:
            if field.type != descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
                continue
            target = field.type_name.lstrip(".")
            if target in entries:  # a map: follow its value type
                value = entries[target].field[1]
                if value.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
                    pending.append(value.type_name.lstrip("."))
            else:
                pending.append(target)

    written = []
    for module, package in PACKAGES:
        go = go_struct_fields(source_dir(module))
        names = [n for n in sorted(reached) if messages[n][0] == package]
        if not names:
            continue
        body, imports = _render_package(package, names, messages, go)
        header = _HEADER.format(module=module, tag=tag)
        import_lines = "".join(f'import "{i}";\n' for i in sorted(imports))
        text = f'{header}\n\nsyntax = "proto2";\n\npackage {package};\n\n{import_lines}\n{body}'
        target = out_root / module / "generated.proto"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def _render_package(
    package: str,
    names: list[str],
    messages: dict[str, tuple[str, descriptor_pb2.DescriptorProto]],
    go: dict[str, dict[int, GoField]],
) -> tuple[str, set[str]]:
    imports: set[str] = set()
    blocks = []
    module_of = {p: m for m, p in PACKAGES}
    for name in names:
        _, message = messages[name]
        entries = {f"{name}.{n.name}": n for n in message.nested_type}
        facts = go.get(message.name, {})
        lines = [f"message {message.name} {{"]
        for field in message.field:
            target = field.type_name.lstrip(".")
            if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
                value_type = entries[target].field[1] if target in entries else field
                referenced = value_type.type_name.lstrip(".")
                if referenced:
                    other = referenced.rsplit(".", 1)[0]
                    if other != package:
                        imports.add(f"{module_of[other]}/generated.proto")
            if target in entries:
                key, value = entries[target].field
                declaration = f"map<{_type_name(key, package)}, {_type_name(value, package)}> {field.name}"
            else:
                label = "repeated" if field.label == field.LABEL_REPEATED else "optional"
                declaration = f"{label} {_type_name(field, package)} {field.name}"
            options = []
            if name not in CUSTOM_JSON:
                fact = facts.get(field.number)
                if fact is None:
                    raise SystemExit(
                        f"gen_kube_proto: no Go field with protobuf number {field.number} for {name}"
                    )
                if not fact.inline and fact.json_name != field.name:
                    options.append(f'json_name = "{fact.json_name}"')
                for flag in ("omitempty", "inline", "pointer"):
                    if getattr(fact, flag):
                        options.append(f"(kubejson.{flag}) = true")
                        imports.add(OPTIONS_PROTO)
            suffix = f" [{', '.join(options)}]" if options else ""
            lines.append(f"  {declaration} = {field.number}{suffix};")
        lines.append("}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n", imports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=MODULE_DIR, help="directory for the generated module")
    parser.add_argument(
        "--import-from",
        nargs=2,
        type=Path,
        metavar=("API", "APIMACHINERY"),
        help="checkouts of k8s.io/api and k8s.io/apimachinery to rewrite proto/k8s.io/... from first",
    )
    parser.add_argument(
        "--tag", default="", help="the upstream tag of the checkouts (recorded in the protos)"
    )
    args = parser.parse_args(argv)
    if args.import_from:
        if not args.tag:
            parser.error("--import-from needs --tag")
        for path in import_protos(args.import_from[0], args.import_from[1], args.tag):
            sys.stdout.write(f"wrote {path}\n")
    sys.stdout.write(f"wrote {generate(args.out)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
