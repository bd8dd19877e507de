"""The chaos checker's own decoders read what hami-py's writers write: hami_api's annotation encoders and
the kubelet stand-in's checkpoint and container-record writers serve as oracles here (and only here: the
checker itself never imports them)."""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api import annotations as A
from hami_api.quantity import parse_quantity as hami_parse_quantity
from hami_api.types import ContainerAllocation, GPUInfo, GPUSlice, PodAllocation
from hami_node.plugin.api import api_pb2
from hami_sim.chaos import decoding as D
from hami_sim.kubelet import checkpoint as kcp
from hami_sim.kubelet import runtime
from hami_sim.kubelet.dra import checkpoint as dcp

_TOKEN = st.characters(exclude_characters=",:;", categories=("L", "N", "P", "S", "Zs"))
token = st.text(_TOKEN, min_size=1, max_size=20)
int32 = st.integers(-(2**31), 2**31 - 1)
nonneg32 = st.integers(0, 2**31 - 1)

gpu_json = st.builds(
    GPUInfo,
    id=st.text(min_size=1, max_size=30),
    index=st.integers(0, 2**32),
    count=int32,
    devmem=int32,
    devcore=int32,
    type=st.text(max_size=20),
    numa=st.integers(-(2**31), 2**31),
    mode=st.text(max_size=10),
    health=st.booleans(),
)
gpu_legacy = st.builds(
    GPUInfo,
    id=token.filter(lambda s: s.lstrip()[:1] not in ("[", "{")),
    index=st.integers(0, 2**32),
    count=int32,
    devmem=int32,
    devcore=int32,
    type=st.text(_TOKEN, max_size=20),
    numa=st.integers(0, 2**31),
    mode=st.text(_TOKEN, max_size=10),
    health=st.booleans(),
)


def _unique(gpus: list[GPUInfo]) -> bool:
    return len({g.id for g in gpus}) == len(gpus)


def _expected(gpus: list[GPUInfo]) -> tuple[D.Gpu, ...]:
    return tuple(D.Gpu(g.id, g.count, g.devmem, g.devcore, g.health, g.type) for g in gpus)


@given(st.lists(gpu_json, max_size=4).filter(_unique))
def test_register_json_decodes_as_hami_api_encodes_it(gpus: list[GPUInfo]) -> None:
    assert D.decode_register(A.encode_node_register(gpus)) == _expected(gpus)


@given(st.lists(gpu_legacy, min_size=1, max_size=4).filter(_unique))
def test_register_legacy_decodes_as_hami_api_encodes_it(gpus: list[GPUInfo]) -> None:
    assert D.decode_register(A.encode_node_register_legacy(gpus)) == _expected(gpus)


allocations = st.builds(
    PodAllocation,
    st.lists(
        st.builds(
            ContainerAllocation,
            st.lists(
                st.builds(
                    GPUSlice, uuid=token, usedmem=nonneg32, usedcores=nonneg32, vendor=st.just("NVIDIA")
                ),
                max_size=3,
            ).map(tuple),
        ),
        max_size=5,
    ).map(tuple),
)


@given(allocations)
def test_allocation_decodes_as_hami_api_encodes_it(allocation: PodAllocation) -> None:
    decoded = D.decode_allocation(A.encode_pod_allocation(allocation))
    assert decoded == tuple(
        tuple(D.Slice(s.uuid, s.usedmem, s.usedcores) for s in c.devices) for c in allocation.containers
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("GPU-0,NVIDIA,100,0:", "does not end with ';'"),
        ("GPU-0,NVIDIA,100:;", "is not '<uuid>,<vendor>,<MiB>,<cores>'"),
        ("GPU-0,NVIDIA,-1,0:;", "must be non-negative integers"),
        ("GPU-0,NVIDIA,1,0;", "does not end with ':'"),
    ],
)
def test_a_bad_allocation_is_an_error_naming_the_annotation(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment) as err:
        D.decode_allocation(text)
    assert D.DEVICES_ALLOCATED in str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[{}]", "id: expected a non-empty string"),
        ('[{"id":"g","count":"2"}]', "count: expected an integer"),
        ("[", "not JSON"),
    ],
)
def test_a_bad_register_is_an_error_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment):
        D.decode_register(text)


@pytest.mark.parametrize(
    "text", ["16Gi", "4000Mi", "100", "0", "1.5k", "500m", "1e3", "2E-2", ".5", "12345678901234Ki"]
)
def test_quantities_read_as_hami_api_reads_them(text: str) -> None:
    assert D.parse_quantity(text, "q") == Fraction(hami_parse_quantity(text))


def test_a_bad_quantity_is_an_error_naming_where() -> None:
    with pytest.raises(D.DecodeError, match=r"claim x: '4 Gi' is not a quantity"):
        D.parse_quantity("4 Gi", "claim x")


@pytest.mark.parametrize(
    ("device", "gpu"),
    [
        ("GPU-a-b-3", "GPU-a-b"),
        ("GPU-a::12", "GPU-a"),
        ("GPU-a", "GPU-a"),
        ("GPU-a-", "GPU-a-"),
        ("MIG-x-y", "MIG-x-y"),
    ],
)
def test_a_device_id_names_its_gpu(device: str, gpu: str) -> None:
    assert D.device_gpu(device) == gpu


def test_the_device_checkpoint_reads_as_the_stand_in_writes_it() -> None:
    entries = [
        kcp.PodDeviceEntry(
            "uid-1",
            "main",
            "nvidia.com/gpu",
            {-1: ("GPU-0-1", "GPU-1-4")},
            api_pb2.ContainerAllocateResponse(),
        ),
        kcp.PodDeviceEntry(
            "uid-2",
            "init",
            "nvidia.com/gpu",
            {0: ("GPU-0-2",), 1: ("GPU-1-0",)},
            api_pb2.ContainerAllocateResponse(),
        ),
    ]
    raw = kcp.encode_checkpoint(entries, {"nvidia.com/gpu": ["GPU-0-1"]})
    assert D.decode_device_checkpoint(raw) == (
        D.DeviceEntry("uid-1", "main", "nvidia.com/gpu", ("GPU-0-1", "GPU-1-4")),
        D.DeviceEntry("uid-2", "init", "nvidia.com/gpu", ("GPU-0-2", "GPU-1-0")),
    )
    assert D.decode_device_checkpoint(kcp.encode_checkpoint([], {})) == ()


def test_the_dra_checkpoint_reads_as_the_stand_in_writes_it() -> None:
    entry = dcp.ClaimInfoState(
        "claim-uid",
        "c",
        "default",
        {"pod-a", "pod-b"},
        {"hami-core-gpu.project-hami.io": (dcp.PreparedDevice("n1", "hami-gpu-0", cdi_device_ids=("k=x",)),)},
    )
    assert D.decode_dra_checkpoint(dcp.encode_checkpoint([entry])) == (
        D.ClaimEntry(
            "default",
            "c",
            "claim-uid",
            frozenset({"pod-a", "pod-b"}),
            (D.PreparedDevice("hami-core-gpu.project-hami.io", "n1", "hami-gpu-0"),),
        ),
    )
    assert D.decode_dra_checkpoint(dcp.encode_checkpoint(None)) == ()


def test_the_container_record_reads_as_the_runtime_writes_it() -> None:
    record = runtime.ContainerRecord(
        pod_uid="uid-1",
        namespace="default",
        pod="p",
        container="main",
        cdi_devices=("k8s.device-plugin.nvidia.com/gpu=GPU-0",),
        env=("NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=4000m", "A=b=c"),
        mounts=({"containerPath": "/usr/local/vgpu", "hostPath": "/h", "options": []},),
        device_nodes=({"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"},),
        annotations={"cdi.k8s.io/x": "k8s.device-plugin.nvidia.com/gpu=GPU-0"},
    )
    (decoded,) = D.decode_containers(runtime.encode_containers([record]))
    assert decoded == D.ContainerRecord(
        "uid-1",
        "default",
        "p",
        "main",
        {"NVIDIA_VISIBLE_DEVICES": "GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0": "4000m", "A": "b=c"},
        ("k8s.device-plugin.nvidia.com/gpu=GPU-0",),
        ("/usr/local/vgpu",),
        ("/dev/nvidia0",),
        {"cdi.k8s.io/x": "k8s.device-plugin.nvidia.com/gpu=GPU-0"},
    )


@pytest.mark.parametrize(
    ("decode", "raw", "fragment"),
    [
        (D.decode_device_checkpoint, b"{", "kubelet_internal_checkpoint: not JSON"),
        (
            D.decode_device_checkpoint,
            b'{"Data":{"PodDeviceEntries":[{"PodUID":1}]}}',
            r"PodDeviceEntries\[0\].PodUID",
        ),
        (D.decode_dra_checkpoint, b'{"Data":3}', "Data: expected a string"),
        (D.decode_containers, b'{"containers":[{"podUID":"u"}]}', r"containers\[0\].container"),
    ],
)
def test_a_bad_state_file_is_an_error_naming_the_field(decode: object, raw: bytes, fragment: str) -> None:
    assert callable(decode)
    with pytest.raises(D.DecodeError, match=fragment):
        decode(raw)


CHECKER_MODULES = ("checker.py", "invariants.py", "decoding.py")


@pytest.mark.parametrize("module", CHECKER_MODULES)
def test_the_checker_imports_nothing_of_ours_but_itself(module: str) -> None:
    """A bug in hami_api's codecs, hami_kube's client or the stand-ins' writers cannot hide a violation."""
    path = Path(D.__file__).parent / module
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    ours = {name for name in imported if name.split(".")[0].startswith("hami_")}
    assert ours <= {"hami_sim.chaos.decoding", "hami_sim.chaos.invariants"}, ours
