"""Annotation codecs: HAMi's literal examples, round trips, and malformed values."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api import annotations as A
from hami_api.errors import WireFormatError
from hami_api.types import (
    BindPhase,
    ContainerAllocation,
    CorePolicy,
    DeviceSelector,
    GPUInfo,
    GPUPairScore,
    GPUPolicy,
    GPUSlice,
    Handshake,
    HandshakeKind,
    MigPlacement,
    MigProfile,
    NodeLock,
    NodePolicy,
    PodAllocation,
    ScoringWeights,
)

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# --- literal examples from reference/hami.md -----------------------------------------------------------

REGISTER_EXAMPLE = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)


def test_register_json_example() -> None:
    gpus = A.decode_node_register(REGISTER_EXAMPLE)
    v100 = "NVIDIA-Tesla V100-PCIE-32GB"
    assert gpus == (
        GPUInfo("GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec", 0, 10, 32768, 100, v100, 0, "hami-core", True),
        GPUInfo("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 1, 10, 32768, 100, v100, 1, "hami-core", True),
    )
    assert A.encode_node_register(gpus) == REGISTER_EXAMPLE


def test_register_json_omitempty() -> None:
    assert A.encode_node_register([GPUInfo("GPU-x")]) == '[{"id":"GPU-x"}]'
    assert A.encode_node_register([]) == "[]"
    assert A.decode_node_register("[]") == ()
    assert A.decode_node_register('[{"id":"GPU-x"}]') == (GPUInfo("GPU-x"),)


def test_register_json_key_order_and_mig_profiles() -> None:
    gpu = GPUInfo(
        id="GPU-a",
        index=2,
        count=7,
        devmem=81920,
        devcore=100,
        type="NVIDIA-A100-SXM4-80GB",
        numa=1,
        mode="mig",
        health=True,
        mig_profiles=(
            MigProfile("1g.10gb", 9728, 14, 1, (MigPlacement(0, 1), MigPlacement(1, 1))),
            MigProfile("7g.80gb", 81920, 100, 7, ()),
        ),
    )
    text = A.encode_node_register([gpu])
    assert text == (
        '[{"id":"GPU-a","index":2,"count":7,"devmem":81920,"devcore":100,"type":"NVIDIA-A100-SXM4-80GB",'
        '"numa":1,"mode":"mig","migProfiles":[{"name":"1g.10gb","memoryMB":9728,"core":14,"sliceCount":1,'
        '"placements":[{"start":0,"size":1},{"start":1,"size":1}]},'
        '{"name":"7g.80gb","memoryMB":81920,"core":100,"sliceCount":7,"placements":[]}],"health":true}]'
    )
    assert A.decode_node_register(text) == (gpu,)


def test_register_json_like_go_decoder() -> None:
    # unknown keys ignored, keys case-insensitive, null leaves the field unset, later duplicates win,
    # whitespace allowed, placements:null is no placements; custominfo kept as Go's map[string]any holds it
    # (numbers as float64), in canonical JSON
    text = (
        ' [ {"ID": "GPU-a", "Count": 4, "devmem": null, "customInfo": {"x": [1, 2.5]},'
        ' "devicevendor": "NVIDIA",'
        ' "migProfiles": [{"name": "p", "placements": null, "extra": 1}], "health": false, "health": true} ] '
    )
    assert A.decode_node_register(text) == (
        GPUInfo(
            "GPU-a",
            count=4,
            health=True,
            mig_profiles=(MigProfile("p", 0, 0, 0, ()),),
            custom='{"x":[1.0,2.5]}',
        ),
    )


def test_register_json_escapes_like_go() -> None:
    gpu = GPUInfo("GPU-<a>&b", type='NVIDIA "quoted" \\ \u2028 é \x01 \x7f')
    text = A.encode_node_register([gpu])
    assert text == (
        '[{"id":"GPU-\\u003ca\\u003e\\u0026b","type":"NVIDIA \\"quoted\\" \\\\ \\u2028 é \\u0001 \x7f"}]'
    )
    assert A.decode_node_register(text) == (gpu,)


def test_register_json_lone_surrogate_becomes_replacement_char() -> None:
    assert A.decode_node_register('[{"id":"GPU-\\ud800"}]') == (GPUInfo("GPU-\ufffd"),)


LEGACY_FIRST = "GPU-3d8e...,10,143771,100,NVIDIA-NVIDIA H20-3e,1,true,3,hami-core:"
H20 = "NVIDIA-NVIDIA H20-3e"


def test_register_legacy_example() -> None:
    assert A.decode_node_register(LEGACY_FIRST) == (
        GPUInfo("GPU-3d8e...", 3, 10, 143771, 100, H20, 1, "hami-core", True),
    )
    full = LEGACY_FIRST + "GPU-6e86...,10,143771,100,NVIDIA-NVIDIA H20-3e,0,false,4,hami-core:"
    assert A.decode_node_register(full)[1] == GPUInfo(
        "GPU-6e86...", 4, 10, 143771, 100, H20, 0, "hami-core", False
    )
    # the reference's own example is elided after the second UUID: it must fail on device 1, not half-decode
    with pytest.raises(WireFormatError) as info:
        A.decode_node_register(LEGACY_FIRST + "GPU-6e86...,10,...:")
    assert info.value.position == "device 1"


def test_register_legacy_seven_fields_and_go_bools() -> None:
    gpus = A.decode_node_register("GPU-a,10,1000,100,T4,0,True::GPU-b,2,500,50,T4,-1,0:")
    assert gpus == (
        GPUInfo("GPU-a", 0, 10, 1000, 100, "T4", 0, "hami-core", True),
        GPUInfo("GPU-b", 0, 2, 500, 50, "T4", -1, "hami-core", False),
    )


def test_register_legacy_encoding() -> None:
    gpu = GPUInfo("GPU-3d8e...", 3, 10, 143771, 100, H20, 1, "hami-core", True)
    assert A.encode_node_register_legacy([gpu]) == LEGACY_FIRST


ALLOCATION_EXAMPLE = "GPU-0fc3...,NVIDIA,3000,0:;GPU-0fc3...,NVIDIA,5000,0:;"


def test_allocation_two_container_example() -> None:
    alloc = A.decode_pod_allocation(ALLOCATION_EXAMPLE)
    assert alloc == PodAllocation(
        (
            ContainerAllocation((GPUSlice("GPU-0fc3...", 3000, 0),)),
            ContainerAllocation((GPUSlice("GPU-0fc3...", 5000, 0),)),
        )
    )
    assert alloc.containers[0].devices[0].vendor == "NVIDIA"
    assert A.encode_pod_allocation(alloc) == ALLOCATION_EXAMPLE
    assert A.decode_pod_allocation(ALLOCATION_EXAMPLE, A.DEVICES_ALLOCATED) == alloc


def test_allocation_blanked_forms() -> None:
    alloc = A.decode_pod_allocation(ALLOCATION_EXAMPLE)
    first = alloc.next_pending()
    assert first == 0
    once = alloc.with_blanked(first)
    assert A.encode_pod_allocation(once) == ";GPU-0fc3...,NVIDIA,5000,0:;"
    assert A.decode_pod_allocation(";GPU-0fc3...,NVIDIA,5000,0:;") == once
    assert once.next_pending() == 1 and not once.fully_consumed
    twice = once.with_blanked(1)
    assert A.encode_pod_allocation(twice) == ";;"
    assert (
        A.decode_pod_allocation(";;")
        == twice
        == PodAllocation((ContainerAllocation(), ContainerAllocation()))
    )
    assert twice.fully_consumed and twice.next_pending() is None
    # Go's plugin re-encodes the empty piece after the final ';', so entries can grow; still decodes
    grown = A.decode_pod_allocation(";GPU-0fc3...,NVIDIA,5000,0:;;")
    assert len(grown) == 3 and grown.next_pending() == 1
    assert A.decode_pod_allocation(";;;;").fully_consumed


def test_allocation_multi_device_and_empty_containers() -> None:
    text = ";GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,1000,30:;;GPU-c,NVIDIA,0,100:;"
    alloc = A.decode_pod_allocation(text)
    assert len(alloc) == 4
    assert alloc.containers[1].uuids == ("GPU-a", "GPU-b")
    assert [i for i, _ in alloc.non_empty()] == [1, 3]
    assert [s.uuid for s in alloc.slices()] == ["GPU-a", "GPU-b", "GPU-c"]
    assert A.encode_pod_allocation(alloc) == text
    assert A.decode_pod_allocation("") == PodAllocation()
    with pytest.raises(IndexError):
        alloc.with_blanked(4)


def test_node_lock_examples() -> None:
    lock = A.decode_node_lock("2026-08-21T10:15:30+08:00,default,train-0")
    assert lock == NodeLock(datetime(2026, 8, 21, 2, 15, 30, tzinfo=UTC), "default", "train-0")
    assert lock.time.utcoffset() == timedelta(hours=8)
    assert A.encode_node_lock(lock) == "2026-08-21T10:15:30+08:00,default,train-0"
    utc = NodeLock(datetime(2026, 8, 21, 2, 15, 30, tzinfo=UTC), "ns", "p")
    assert A.encode_node_lock(utc) == "2026-08-21T02:15:30Z,ns,p"
    # legacy: just the time
    assert A.decode_node_lock("2026-08-21T02:15:30Z") == NodeLock(
        datetime(2026, 8, 21, 2, 15, 30, tzinfo=UTC)
    )
    assert (
        A.encode_node_lock(NodeLock(datetime(2026, 8, 21, 2, 15, 30, tzinfo=UTC))) == "2026-08-21T02:15:30Z"
    )
    # Go's parser takes fractional seconds
    assert A.decode_node_lock("2026-08-21T02:15:30.5Z,a,b").time.microsecond == 500000


def test_scoring_weights_example() -> None:
    assert A.decode_scoring_weights("slot=1,core=1,memory=3") == ScoringWeights(1, 1, 3)
    assert A.decode_scoring_weights(" memory = 3, core=0 ,slot=1 ") == ScoringWeights(1, 0, 3)
    assert A.encode_scoring_weights(ScoringWeights(1, 1, 3)) == "slot=1,core=1,memory=3"
    assert ScoringWeights() == ScoringWeights(1, 1, 1)


def test_handshake_forms() -> None:
    req = A.decode_handshake("Requesting_2026-08-21 10:15:30")
    assert req == Handshake(HandshakeKind.REQUESTING, datetime(2026, 8, 21, 10, 15, 30))
    assert A.encode_handshake(req) == "Requesting_2026-08-21 10:15:30"
    deleted = A.decode_handshake("Deleted_2026-08-21 10:16:30")
    assert deleted == Handshake(HandshakeKind.DELETED, datetime(2026, 8, 21, 10, 16, 30))
    assert A.encode_handshake(deleted) == "Deleted_2026-08-21 10:16:30"
    # legacy plugin heartbeat: Go's time.Now().String(), monotonic clock reading included
    reported = A.decode_handshake("Reported 2024-03-01 08:00:05.123456789 +0800 CST m=+30.000000001")
    cst = timezone(timedelta(hours=8))
    assert reported == Handshake(HandshakeKind.REPORTED, datetime(2024, 3, 1, 8, 0, 5, 123456, tzinfo=cst))
    assert A.encode_handshake(reported) == "Reported 2024-03-01 08:00:05.123456 +0800 +08"
    utc = Handshake(HandshakeKind.REPORTED, datetime(2024, 3, 1, 0, 0, 5, tzinfo=UTC))
    assert A.encode_handshake(utc) == "Reported 2024-03-01 00:00:05 +0000 UTC"


def test_pair_scores_example() -> None:
    text = '[{"uuid":"GPU-a","score":{"GPU-c":40,"GPU-b":100}},{"uuid":"GPU-b"}]'
    scores = A.decode_pair_scores(text)
    assert scores == (GPUPairScore("GPU-a", (("GPU-b", 100), ("GPU-c", 40))), GPUPairScore("GPU-b"))
    assert scores[0].as_dict() == {"GPU-b": 100, "GPU-c": 40}
    # A GPU without peers gets an empty map, never a missing one: HAMi's device plugin always makes it.
    assert A.encode_pair_scores(scores) == (
        '[{"uuid":"GPU-a","score":{"GPU-b":100,"GPU-c":40}},{"uuid":"GPU-b","score":{}}]'
    )
    assert A.decode_pair_scores('[{"uuid":"GPU-a","score":{"GPU-b":null}}]')[0].scores == (("GPU-b", 0),)


def test_pair_scores_of_a_single_gpu_node_are_written_as_hami_writes_them() -> None:
    """HAMi's calculateGPUScore makes every GPU's score map, so a one-GPU node reads `"score":{}`."""
    assert A.encode_pair_scores([GPUPairScore("GPU-a")]) == '[{"uuid":"GPU-a","score":{}}]'
    assert A.encode_pair_scores([]) == "[]"


def test_small_values() -> None:
    assert A.decode_vgpu_node("gpu-node-1.example") == "gpu-node-1.example"
    assert A.decode_unix_time("1724200000") == 1724200000
    assert A.decode_unix_time("1724200000", A.VGPU_TIME) == 1724200000
    assert A.encode_unix_time(1724200000) == "1724200000"
    assert A.decode_bind_phase("allocating") is BindPhase.ALLOCATING
    assert A.decode_bind_phase("success") is BindPhase.SUCCESS
    assert A.decode_bind_phase("failed") is BindPhase.FAILED
    assert A.decode_device_cordon("GPU-a, GPU-b,,GPU-a") == ("GPU-a", "GPU-b")
    assert A.decode_device_cordon("") == ()
    assert A.encode_device_cordon(["GPU-a", "GPU-b"]) == "GPU-a,GPU-b"
    assert A.decode_node_policy("binpack") is NodePolicy.BINPACK
    assert A.decode_node_policy(" spread ") is NodePolicy.SPREAD
    assert A.decode_gpu_policy("binpack,numa") == (GPUPolicy.BINPACK, GPUPolicy.NUMA)
    assert A.decode_gpu_policy("mutex, topology-aware,mutex") == (GPUPolicy.MUTEX, GPUPolicy.TOPOLOGY_AWARE)
    assert A.decode_core_policy("force") is CorePolicy.FORCE
    assert A.decode_numa_bind("true") and not A.decode_numa_bind("0")
    assert A.decode_vgpu_mode("hami-core") == ("hami-core",)


def test_device_selector() -> None:
    sel = A.decode_device_selector(
        {
            A.USE_GPU_TYPE: "Tesla V100-PCIE-32GB, a10",
            A.NOUSE_GPU_UUID: "GPU-bad",
            A.NUMA_BIND: "true",
            A.VGPU_MODE: "hami-core",
            "unrelated": "x",
        }
    )
    assert sel == DeviceSelector(
        use_types=("Tesla V100-PCIE-32GB", "a10"),
        nouse_uuids=("GPU-bad",),
        modes=("hami-core",),
        numa_bind=True,
    )
    v100 = GPUInfo("GPU-ok", type="NVIDIA-Tesla V100-PCIE-32GB", mode="hami-core")
    assert sel.allows(v100)
    assert sel.allows(GPUInfo("GPU-2", type="NVIDIA A10", mode="hami-core"))
    assert not sel.allows(GPUInfo("GPU-3", type="NVIDIA-T4", mode="hami-core"))
    assert not sel.allows(GPUInfo("GPU-bad", type="NVIDIA-Tesla V100-PCIE-32GB", mode="hami-core"))
    assert not sel.allows(GPUInfo("GPU-ok", type="NVIDIA-Tesla V100-PCIE-32GB", mode="mig"))
    assert sel.allows(GPUInfo("GPU-ok", type="NVIDIA-Tesla V100-PCIE-32GB", mode=""))
    none = A.decode_device_selector({A.USE_GPU_TYPE: " ", A.USE_GPU_UUID: ""})
    assert none == DeviceSelector() and none.allows(GPUInfo("GPU-x", type="anything"))
    only = A.decode_device_selector({A.USE_GPU_UUID: "GPU-a,GPU-b", A.NOUSE_GPU_TYPE: "t4"})
    assert only.allows(GPUInfo("GPU-a", type="A100")) and not only.allows(GPUInfo("GPU-c", type="A100"))
    assert not only.allows(GPUInfo("GPU-a", type="NVIDIA-Tesla T4"))


# --- malformed values: each raises naming annotation, position and text --------------------------------

Decoder = Callable[[str], object]

MALFORMED: list[tuple[Decoder, str, str, str, str]] = [
    # (decoder, value, annotation, position, offending text)
    (A.decode_pod_allocation, "GPU-a,NVIDIA,abc,0:;", A.DEVICES_TO_ALLOCATE, "container 0, device 0", "abc"),
    (
        A.decode_pod_allocation,
        "GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,2,x:;",
        A.DEVICES_TO_ALLOCATE,
        "container 1, device 0",
        "x",
    ),
    (A.decode_pod_allocation, "GPU-a,NVIDIA,-1,0:;", A.DEVICES_TO_ALLOCATE, "container 0, device 0", "-1"),
    (
        A.decode_pod_allocation,
        "GPU-a,NVIDIA,1,2147483648:;",
        A.DEVICES_TO_ALLOCATE,
        "container 0, device 0",
        "2147483648",
    ),
    (A.decode_pod_allocation, "GPU-a,NVIDIA,1,0:", A.DEVICES_TO_ALLOCATE, "whole value", "GPU-a,NVIDIA,1,0:"),
    (A.decode_pod_allocation, "GPU-a,NVIDIA,1,0;", A.DEVICES_TO_ALLOCATE, "container 0", "GPU-a,NVIDIA,1,0"),
    (
        A.decode_pod_allocation,
        "GPU-a,NVIDIA,1:;",
        A.DEVICES_TO_ALLOCATE,
        "container 0, device 0",
        "GPU-a,NVIDIA,1",
    ),
    (
        A.decode_pod_allocation,
        "GPU-a,NVIDIA,1,0,9:;",
        A.DEVICES_TO_ALLOCATE,
        "container 0, device 0",
        "GPU-a,NVIDIA,1,0,9",
    ),
    (A.decode_pod_allocation, ",NVIDIA,1,0:;", A.DEVICES_TO_ALLOCATE, "container 0, device 0", ",NVIDIA,1,0"),
    (A.decode_pod_allocation, "GPU-a,,1,0:;", A.DEVICES_TO_ALLOCATE, "container 0, device 0", "GPU-a,,1,0"),
    (
        A.decode_pod_allocation,
        "GPU-a,NVIDIA,1,0::;",
        A.DEVICES_TO_ALLOCATE,
        "container 0, device 1",
        "GPU-a,NVIDIA,1,0::",
    ),
    (A.decode_pod_allocation, "GPU-a,NVIDIA, 1,0:;", A.DEVICES_TO_ALLOCATE, "container 0, device 0", " 1"),
    (A.decode_node_register, "", A.NODE_REGISTER, "whole value", ""),
    (A.decode_node_register, "garbage", A.NODE_REGISTER, "whole value", "garbage"),
    (A.decode_node_register, "null", A.NODE_REGISTER, "whole value", "null"),
    (A.decode_node_register, "[1,", A.NODE_REGISTER, "line 1, column 4", "[1,"),
    (A.decode_node_register, "[NaN]", A.NODE_REGISTER, "whole value", "[NaN]"),
    (A.decode_node_register, "[1]", A.NODE_REGISTER, "device 0", "1"),
    (A.decode_node_register, "[null]", A.NODE_REGISTER, "device 0", "null"),
    (A.decode_node_register, '{"id":"GPU-a"}', A.NODE_REGISTER, "whole value", '{"id":"GPU-a"}'),
    (A.decode_node_register, '[{"id":"a"},{"id":"b","devmem":"1"}]', A.NODE_REGISTER, "device 1", '"1"'),
    (A.decode_node_register, '[{"id":"a","devmem":1.0}]', A.NODE_REGISTER, "device 0", "1.0"),
    (A.decode_node_register, '[{"id":"a","devmem":1e3}]', A.NODE_REGISTER, "device 0", "1e3"),
    (A.decode_node_register, '[{"id":"a","count":2147483648}]', A.NODE_REGISTER, "device 0", "2147483648"),
    (A.decode_node_register, '[{"id":"a","index":-1}]', A.NODE_REGISTER, "device 0", "-1"),
    (A.decode_node_register, '[{"id":"a","health":"true"}]', A.NODE_REGISTER, "device 0", '"true"'),
    (A.decode_node_register, '[{"id":"a","health":1}]', A.NODE_REGISTER, "device 0", "1"),
    (A.decode_node_register, '[{"id":7}]', A.NODE_REGISTER, "device 0", "7"),
    (A.decode_node_register, '[{"count":1}]', A.NODE_REGISTER, "device 0", ""),
    (A.decode_node_register, '[{"id":"a"},{"id":"a"}]', A.NODE_REGISTER, "device 1", "a"),
    (A.decode_node_register, '[{"id":"a","migProfiles":{}}]', A.NODE_REGISTER, "device 0", "{}"),
    (
        A.decode_node_register,
        '[{"id":"a","migProfiles":[{"name":"p","placements":[{"start":-1}]}]}]',
        A.NODE_REGISTER,
        "device 0, migProfile 0, placement 0",
        "-1",
    ),
    (A.decode_node_register, "GPU-a,10,1000,100,T4,0,true:GPU-b,1:", A.NODE_REGISTER, "device 1", "GPU-b,1"),
    (A.decode_node_register, "GPU-a,10,x,100,T4,0,true:", A.NODE_REGISTER, "device 0", "x"),
    (A.decode_node_register, "GPU-a,10,1,100,T4,0,yes:", A.NODE_REGISTER, "device 0", "yes"),
    (A.decode_node_register, "GPU-a,10,1,100,T4,zero,true:", A.NODE_REGISTER, "device 0", "zero"),
    (A.decode_node_register, "GPU-a,10,1,100,T4,0,true,-3,hami-core:", A.NODE_REGISTER, "device 0", "-3"),
    (A.decode_node_register, ",10,1,100,T4,0,true:", A.NODE_REGISTER, "device 0", ",10,1,100,T4,0,true"),
    (A.decode_pair_scores, '[{"uuid":"a","score":{"b":"x"}}]', A.NODE_PAIR_SCORE, "device 0, peer b", '"x"'),
    (A.decode_pair_scores, '[{"uuid":"a","score":[1]}]', A.NODE_PAIR_SCORE, "device 0", "[1]"),
    (A.decode_pair_scores, '[{"uuid":"a","score":{"b":""}}]', A.NODE_PAIR_SCORE, "device 0, peer b", '""'),
    (
        A.decode_pair_scores,
        '[{"uuid":"a","score":{"b":false}}]',
        A.NODE_PAIR_SCORE,
        "device 0, peer b",
        "false",
    ),
    (A.decode_pair_scores, '[{"score":{}}]', A.NODE_PAIR_SCORE, "device 0", ""),
    (A.decode_pair_scores, "{}", A.NODE_PAIR_SCORE, "whole value", "{}"),
    (A.decode_handshake, "Requesting", A.NODE_HANDSHAKE, "whole value", "Requesting"),
    (A.decode_handshake, "Requesting_yesterday", A.NODE_HANDSHAKE, "whole value", "yesterday"),
    (
        A.decode_handshake,
        "Requesting_2026-13-01 10:00:00",
        A.NODE_HANDSHAKE,
        "whole value",
        "2026-13-01 10:00:00",
    ),
    (
        A.decode_handshake,
        "Requesting_2026-08-21T10:00:00",
        A.NODE_HANDSHAKE,
        "whole value",
        "2026-08-21T10:00:00",
    ),
    (A.decode_handshake, "Deleted_", A.NODE_HANDSHAKE, "whole value", ""),
    (
        A.decode_handshake,
        "Reported 2026-08-21 10:00:00",
        A.NODE_HANDSHAKE,
        "whole value",
        "2026-08-21 10:00:00",
    ),
    (A.decode_handshake, "Hello", A.NODE_HANDSHAKE, "whole value", "Hello"),
    (A.decode_node_lock, "yesterday,ns,pod", A.NODE_LOCK, "whole value", "yesterday"),
    (A.decode_node_lock, "2026-08-21T10:00:00Z,ns", A.NODE_LOCK, "whole value", "2026-08-21T10:00:00Z,ns"),
    (
        A.decode_node_lock,
        "2026-08-21T10:00:00Z,ns,pod,x",
        A.NODE_LOCK,
        "whole value",
        "2026-08-21T10:00:00Z,ns,pod,x",
    ),
    (A.decode_node_lock, "2026-08-21T10:00:00Z,,pod", A.NODE_LOCK, "whole value", ""),
    (A.decode_node_lock, "2026-08-21T10:00:00Z,ns,Pod_1", A.NODE_LOCK, "whole value", "Pod_1"),
    (A.decode_node_lock, "2026-08-21 10:00:00Z,ns,p", A.NODE_LOCK, "whole value", "2026-08-21 10:00:00Z"),
    (
        A.decode_node_lock,
        "2026-08-21T10:00:00+25:00,ns,p",
        A.NODE_LOCK,
        "whole value",
        "2026-08-21T10:00:00+25:00",
    ),
    (A.decode_node_lock, "2026-08-21T10:00:00z,ns,p", A.NODE_LOCK, "whole value", "2026-08-21T10:00:00z"),
    (A.decode_node_lock, "2026-02-30T10:00:00Z", A.NODE_LOCK, "whole value", "2026-02-30T10:00:00Z"),
    (A.decode_vgpu_node, "", A.VGPU_NODE, "whole value", ""),
    (A.decode_vgpu_node, "Node_1", A.VGPU_NODE, "whole value", "Node_1"),
    (A.decode_unix_time, "", A.BIND_TIME, "whole value", ""),
    (A.decode_unix_time, "12.5", A.BIND_TIME, "whole value", "12.5"),
    (A.decode_unix_time, "-5", A.BIND_TIME, "whole value", "-5"),
    (A.decode_unix_time, "١٢", A.BIND_TIME, "whole value", "١٢"),
    (A.decode_bind_phase, "Success", A.BIND_PHASE, "whole value", "Success"),
    (A.decode_bind_phase, "", A.BIND_PHASE, "whole value", ""),
    (A.decode_node_policy, "pack", A.NODE_SCHEDULER_POLICY, "whole value", "pack"),
    (A.decode_gpu_policy, "binpack,foo", A.GPU_SCHEDULER_POLICY, "part 1", "foo"),
    (A.decode_gpu_policy, "", A.GPU_SCHEDULER_POLICY, "part 0", ""),
    (A.decode_gpu_policy, "binpack,", A.GPU_SCHEDULER_POLICY, "part 1", ""),
    (A.decode_scoring_weights, "slot=1,core=1", A.DEVICE_SCORING_WEIGHTS, "whole value", "slot=1,core=1"),
    (A.decode_scoring_weights, "slot=1,core=1,gpu=1", A.DEVICE_SCORING_WEIGHTS, "part 2", "gpu"),
    (A.decode_scoring_weights, "slot=1,slot=1,memory=1", A.DEVICE_SCORING_WEIGHTS, "part 1", "slot"),
    (A.decode_scoring_weights, "slot=1,core=-1,memory=1", A.DEVICE_SCORING_WEIGHTS, "part 1", "-1"),
    (A.decode_scoring_weights, "slot=1,core=x,memory=1", A.DEVICE_SCORING_WEIGHTS, "part 1", "x"),
    (A.decode_scoring_weights, "slot=1,core=1.5,memory=1", A.DEVICE_SCORING_WEIGHTS, "part 1", "1.5"),
    (A.decode_scoring_weights, "slot=1,core,memory=1", A.DEVICE_SCORING_WEIGHTS, "part 1", "core"),
    (
        A.decode_scoring_weights,
        "slot=0,core=0,memory=0",
        A.DEVICE_SCORING_WEIGHTS,
        "whole value",
        "slot=0,core=0,memory=0",
    ),
    (A.decode_core_policy, "none", A.CORE_POLICY, "whole value", "none"),
    (A.decode_numa_bind, "yes", A.NUMA_BIND, "whole value", "yes"),
    (A.decode_vgpu_mode, "", A.VGPU_MODE, "whole value", ""),
    (A.decode_vgpu_mode, "hami-core,vgpu", A.VGPU_MODE, "whole value", "vgpu"),
]


@pytest.mark.parametrize(("decode", "value", "annotation", "position", "text"), MALFORMED)
def test_malformed_values(decode: Decoder, value: str, annotation: str, position: str, text: str) -> None:
    with pytest.raises(WireFormatError) as info:
        decode(value)
    err = info.value
    assert (err.annotation, err.position, err.text) == (annotation, position, text)
    message = str(err)
    assert message.startswith(f"{annotation}: {position}: ")
    assert repr(text) in message
    assert isinstance(err, ValueError)


def test_error_message_shape() -> None:
    with pytest.raises(WireFormatError) as info:
        A.decode_pod_allocation("GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,abc,0:;")
    assert (
        str(info.value)
        == "hami.io/vgpu-devices-to-allocate: container 1, device 0: memory 'abc' is not an integer"
    )
    assert info.value.field == "memory"


def test_error_names_the_annotation_it_was_given() -> None:
    with pytest.raises(WireFormatError) as info:
        A.decode_pod_allocation("x", A.DEVICES_ALLOCATED)
    assert info.value.annotation == A.DEVICES_ALLOCATED
    with pytest.raises(WireFormatError) as info:
        A.decode_unix_time("x", A.VGPU_TIME)
    assert info.value.annotation == A.VGPU_TIME


def test_long_text_is_shortened_in_message() -> None:
    with pytest.raises(WireFormatError) as info:
        A.decode_node_register("x" * 100_000)
    assert len(info.value.text) == 100_000
    assert len(str(info.value)) < 400


def test_selector_errors_propagate() -> None:
    with pytest.raises(WireFormatError) as info:
        A.decode_device_selector({A.NUMA_BIND: "maybe"})
    assert info.value.annotation == A.NUMA_BIND


@pytest.mark.parametrize(
    ("encode", "value"),
    [
        (A.encode_pod_allocation, PodAllocation((ContainerAllocation((GPUSlice("GPU,a", 1, 0),)),))),
        (A.encode_pod_allocation, PodAllocation((ContainerAllocation((GPUSlice("GPU-a", -1, 0),)),))),
        (A.encode_pod_allocation, PodAllocation((ContainerAllocation((GPUSlice("", 1, 0),)),))),
        (A.encode_node_register, [GPUInfo("")]),
        (A.encode_node_register, [GPUInfo("GPU-a", count=2**31)]),
        (A.encode_node_register_legacy, [GPUInfo("GPU:a")]),
        (A.encode_node_register_legacy, [GPUInfo("[GPU-a")]),
        (A.encode_node_lock, NodeLock(datetime(2026, 1, 1), "ns", "p")),  # naive time
        (A.encode_node_lock, NodeLock(datetime(2026, 1, 1, tzinfo=UTC), "ns", "")),
        (A.encode_handshake, Handshake(HandshakeKind.REQUESTING, datetime(2026, 1, 1, tzinfo=UTC))),
        (A.encode_handshake, Handshake(HandshakeKind.REPORTED, datetime(2026, 1, 1))),
        (A.encode_scoring_weights, ScoringWeights(0, 0, 0)),
        (A.encode_gpu_policy, []),
        (A.encode_vgpu_node, "Node_1"),
        (A.encode_unix_time, -1),
        (A.encode_device_cordon, ["GPU-a", " GPU-b"]),
    ],
)
def test_encoders_refuse_unencodable_values(encode: Callable[[Any], str], value: object) -> None:
    with pytest.raises(ValueError):
        encode(value)


# --- round trips ----------------------------------------------------------------------------------------

_NOT_SURROGATE: list[Any] = ["L", "M", "N", "P", "S", "Z", "Cc", "Cf", "Co"]
_TOKEN_ALPHABET = st.characters(exclude_characters=",:;", categories=_NOT_SURROGATE)
token = st.text(_TOKEN_ALPHABET, min_size=1, max_size=20)
int32 = st.integers(-(2**31), INT32_MAX)
nonneg32 = st.integers(0, INT32_MAX)
uint32 = st.integers(0, 2**32 - 1)

mig_profiles = st.builds(
    MigProfile,
    name=st.text(max_size=12),
    memory_mb=int32,
    core=int32,
    slice_count=uint32,
    placements=st.lists(st.builds(MigPlacement, uint32, uint32), max_size=3).map(tuple),
)

gpu_json = st.builds(
    GPUInfo,
    id=st.text(min_size=1, max_size=30),
    index=st.integers(0, 2**64 - 1),
    count=int32,
    devmem=int32,
    devcore=int32,
    type=st.text(max_size=30),
    numa=st.integers(-(2**63), INT64_MAX),
    mode=st.text(max_size=10),
    health=st.booleans(),
    mig_profiles=st.lists(mig_profiles, max_size=2).map(tuple),
)

gpu_legacy = st.builds(
    GPUInfo,
    id=token.filter(lambda s: s.lstrip()[:1] not in ("[", "{")),
    index=st.integers(0, INT64_MAX),
    count=int32,
    devmem=int32,
    devcore=int32,
    type=st.text(_TOKEN_ALPHABET, max_size=20),
    numa=st.integers(-(2**63), INT64_MAX),
    mode=st.text(_TOKEN_ALPHABET, max_size=10),
    health=st.booleans(),
)


def _unique_ids(gpus: list[GPUInfo]) -> bool:
    return len({g.id for g in gpus}) == len(gpus)


@given(st.lists(gpu_json, max_size=4).filter(_unique_ids))
def test_register_json_round_trip(gpus: list[GPUInfo]) -> None:
    text = A.encode_node_register(gpus)
    assert A.decode_node_register(text) == tuple(gpus)
    assert A.encode_node_register(A.decode_node_register(text)) == text
    # and it is what Go's encoding/json would produce: valid JSON with HAMi's key order
    for obj in json.loads(text):
        keys = list(obj)
        assert keys == [
            k
            for k in (
                "id",
                "index",
                "count",
                "devmem",
                "devcore",
                "type",
                "numa",
                "mode",
                "migProfiles",
                "health",
            )
            if k in keys
        ]


@given(st.lists(gpu_legacy, max_size=4).filter(_unique_ids))
def test_register_legacy_round_trip(gpus: list[GPUInfo]) -> None:
    text = A.encode_node_register_legacy(gpus)
    if not gpus:
        return  # "" is not a valid legacy value (Go: "missing device separator")
    assert A.decode_node_register(text) == tuple(gpus)
    assert A.encode_node_register_legacy(A.decode_node_register(text)) == text


gpu_slices = st.builds(
    GPUSlice, uuid=token, usedmem=nonneg32, usedcores=nonneg32, vendor=st.just("NVIDIA") | token
)
pod_allocations = st.builds(
    PodAllocation,
    st.lists(st.builds(ContainerAllocation, st.lists(gpu_slices, max_size=3).map(tuple)), max_size=5).map(
        tuple
    ),
)


@given(pod_allocations)
def test_allocation_round_trip(alloc: PodAllocation) -> None:
    text = A.encode_pod_allocation(alloc)
    assert A.decode_pod_allocation(text) == alloc
    assert A.encode_pod_allocation(A.decode_pod_allocation(text)) == text
    pending = alloc.next_pending()
    if pending is not None:
        blanked = alloc.with_blanked(pending)
        assert A.decode_pod_allocation(A.encode_pod_allocation(blanked)) == blanked
        assert len(blanked.non_empty()) == len(alloc.non_empty()) - 1


zones = st.sampled_from(
    [
        UTC,
        timezone(timedelta(hours=8)),
        timezone(timedelta(hours=-5, minutes=-30)),
        timezone(timedelta(minutes=45)),
    ]
)
whole_seconds = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 30)).map(
    lambda d: d.replace(microsecond=0)
)
dns_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)


@given(whole_seconds, zones, dns_names, dns_names, st.booleans())
def test_node_lock_round_trip(moment: datetime, zone: timezone, ns: str, pod: str, legacy: bool) -> None:
    lock = NodeLock(moment.replace(tzinfo=zone), *(("", "") if legacy else (ns, pod)))
    text = A.encode_node_lock(lock)
    decoded = A.decode_node_lock(text)
    assert decoded == lock and decoded.time.utcoffset() == lock.time.utcoffset()
    assert A.encode_node_lock(decoded) == text


@given(st.sampled_from([HandshakeKind.REQUESTING, HandshakeKind.DELETED]), whole_seconds)
def test_handshake_local_round_trip(kind: HandshakeKind, moment: datetime) -> None:
    handshake = Handshake(kind, moment)
    text = A.encode_handshake(handshake)
    assert A.decode_handshake(text) == handshake
    assert A.encode_handshake(A.decode_handshake(text)) == text


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)), zones)
def test_handshake_reported_round_trip(moment: datetime, zone: timezone) -> None:
    handshake = Handshake(HandshakeKind.REPORTED, moment.replace(tzinfo=zone))
    text = A.encode_handshake(handshake)
    assert A.decode_handshake(text) == handshake
    assert A.encode_handshake(A.decode_handshake(text)) == text


pair_scores = st.builds(
    GPUPairScore.of,
    st.text(min_size=1, max_size=10),
    st.dictionaries(st.text(max_size=10), st.integers(-(2**63), INT64_MAX), max_size=4),
)


@given(st.lists(pair_scores, max_size=4))
def test_pair_scores_round_trip(scores: list[GPUPairScore]) -> None:
    text = A.encode_pair_scores(scores)
    assert A.decode_pair_scores(text) == tuple(scores)
    assert A.encode_pair_scores(A.decode_pair_scores(text)) == text


list_items = (
    st.text(st.characters(exclude_characters=",", categories=_NOT_SURROGATE), min_size=1, max_size=15)
    .map(str.strip)
    .filter(bool)
)


@given(st.lists(list_items, max_size=5, unique=True))
def test_comma_lists_round_trip(items: list[str]) -> None:
    for encode, decode in (
        (A.encode_device_cordon, A.decode_device_cordon),
        (A.encode_comma_list, A.decode_comma_list),
    ):
        text = encode(items)
        assert decode(text) == tuple(items)
        assert encode(decode(text)) == text


@given(st.lists(st.sampled_from(A.OPERATING_MODES), min_size=1, unique=True))
def test_vgpu_mode_round_trip(modes: list[str]) -> None:
    text = A.encode_vgpu_mode(modes)
    assert A.decode_vgpu_mode(text) == tuple(modes)
    assert A.encode_vgpu_mode(A.decode_vgpu_mode(text)) == text


@given(st.lists(st.sampled_from(list(GPUPolicy)), min_size=1, unique=True))
def test_gpu_policy_round_trip(chain: list[GPUPolicy]) -> None:
    text = A.encode_gpu_policy(chain)
    assert A.decode_gpu_policy(text) == tuple(chain)
    assert A.encode_gpu_policy(A.decode_gpu_policy(text)) == text


@given(
    st.builds(ScoringWeights, *[st.integers(0, INT64_MAX)] * 3).filter(lambda w: w.slot or w.core or w.memory)
)
def test_scoring_weights_round_trip(weights: ScoringWeights) -> None:
    text = A.encode_scoring_weights(weights)
    assert A.decode_scoring_weights(text) == weights
    assert A.encode_scoring_weights(A.decode_scoring_weights(text)) == text


@given(st.integers(0, INT64_MAX))
def test_unix_time_round_trip(seconds: int) -> None:
    text = A.encode_unix_time(seconds)
    assert A.decode_unix_time(text) == seconds
    assert A.encode_unix_time(A.decode_unix_time(text)) == text


@given(dns_names)
def test_vgpu_node_round_trip(node: str) -> None:
    assert A.decode_vgpu_node(A.encode_vgpu_node(node)) == node


@given(st.booleans())
def test_numa_bind_round_trip(value: bool) -> None:
    assert A.decode_numa_bind(A.encode_numa_bind(value)) is value


@pytest.mark.parametrize(
    ("encode", "decode", "values"),
    [
        (A.encode_bind_phase, A.decode_bind_phase, list(BindPhase)),
        (A.encode_node_policy, A.decode_node_policy, list(NodePolicy)),
        (A.encode_core_policy, A.decode_core_policy, list(CorePolicy)),
    ],
)
def test_enum_round_trips(
    encode: Callable[[Any], str], decode: Callable[[str], Any], values: list[Any]
) -> None:
    for value in values:
        text = encode(value)
        assert decode(text) is value
        assert encode(decode(text)) == text


@given(st.text(max_size=60))
def test_decoders_are_total(text: str) -> None:
    """Any string either decodes or raises WireFormatError; never another exception."""
    decoders: list[Decoder] = [
        A.decode_node_register,
        A.decode_pair_scores,
        A.decode_handshake,
        A.decode_pod_allocation,
        A.decode_vgpu_node,
        A.decode_unix_time,
        A.decode_bind_phase,
        A.decode_node_lock,
        A.decode_device_cordon,
        A.decode_numa_bind,
        A.decode_vgpu_mode,
        A.decode_node_policy,
        A.decode_gpu_policy,
        A.decode_scoring_weights,
        A.decode_core_policy,
    ]
    for decode in decoders:
        with contextlib.suppress(WireFormatError):
            decode(text)


@given(
    st.sampled_from(["[", '[{"id":"a",', "GPU-a,1,", "Requesting_2026-", "2026-08-21T", "a,b,c:;"]),
    st.text(max_size=30),
)
def test_decoders_are_total_near_valid_prefixes(prefix: str, rest: str) -> None:
    for decode in (A.decode_node_register, A.decode_pod_allocation, A.decode_handshake, A.decode_node_lock):
        with contextlib.suppress(WireFormatError):
            decode(prefix + rest)
