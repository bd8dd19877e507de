"""hami_node.nvidia.labels: GPU feature discovery's labels for these modes. Transcribed from
NVIDIA/k8s-device-plugin v0.20.0 internal/lm/mig-strategy_test.go (TestMigStrategyNoneLabels,
TestMigStrategySingleLabels) and resource_test.go (TestGPUResourceLabeler, TestSanitise,
TestMigResourceLabeler), with NVIDIA's mocks (internal/resource/testing): a full GPU is MOCKMODEL, 300 MiB,
compute 8.0; a MIG-enabled GPU reports compute 0.0; NewMigDevice(gi, ci, gb) is profile `<gi>g.<gb>gb`."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from hami_node.nvidia.config import MigStrategy, ReplicatedResource, ReplicatedResources, Sharing
from hami_node.nvidia.device_map import MigAttributes, NvidiaDevice
from hami_node.nvidia.labels import (
    Labels,
    gpu_resource_labels,
    mig_resource_labels,
    node_labels,
    resource_labels,
    sanitise,
)

_ids = itertools.count()


def full_gpu() -> NvidiaDevice:
    """rt.NewFullGPU."""
    n = next(_ids)
    return NvidiaDevice(f"GPU-{n}", n, "MOCKMODEL", 300, compute_capability=(8, 0))


def mig_enabled(*migs: tuple[int, int, int, dict[str, int]]) -> list[NvidiaDevice]:
    """rt.NewMigEnabledDevice(rt.NewMigDevice(gi, ci, gb, attributes), ...): the GPU and its MIG devices."""
    n = next(_ids)
    parent = NvidiaDevice(
        f"GPU-{n}", n, "MOCKMODEL", 300, compute_capability=(0, 0), mig_capable=True, mig_enabled=True
    )
    out = [parent]
    for j, (gi, ci, gb, extra) in enumerate(migs):
        attrs = MigAttributes(
            memory_mib=gb,
            multiprocessors=extra.get("multiprocessors", 0),
            gi_slices=gi,
            ci_slices=ci,
            copy_engines=extra.get("engines.copy", 0),
            decoders=extra.get("engines.decoder", 0),
            encoders=extra.get("engines.encoder", 0),
            jpeg_engines=extra.get("engines.jpeg", 0),
            ofa_engines=extra.get("engines.ofa", 0),
        )
        out.append(
            NvidiaDevice(
                f"MIG-{n}-{j}",
                n,
                "MOCKMODEL",
                gb,
                parent_uuid=parent.uuid,
                mig_index=j,
                mig_profile=f"{gi}g.{gb}gb",
                mig_attributes=attrs,
            )
        )
    return out


def ts(*resources: ReplicatedResource) -> Sharing:
    return Sharing(ReplicatedResources(resources))


GPU_X2 = ReplicatedResource("nvidia.com/gpu", 2)
GPU_RENAMED = ReplicatedResource("nvidia.com/gpu", 2, "nvidia.com/gpu.shared")
MIG_1G = "nvidia.com/mig-1g.1gb"
AMPERE = {
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.family": "ampere",
}


def gpu_labels(count: int, replicas: int, strategy: str, product: str, memory: int = 300) -> Labels:
    return {
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.product": product,
    }


SHARED_TWO = {**AMPERE, **gpu_labels(2, 2, "time-slicing", "MOCKMODEL-SHARED")}


def mig_attrs(prefix: str, engines: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)) -> Labels:
    """multiprocessors, copy, decoder, encoder, jpeg, ofa."""
    mp, copy, dec, enc, jpeg, ofa = engines
    return {
        f"{prefix}.multiprocessors": str(mp),
        f"{prefix}.slices.gi": "1",
        f"{prefix}.slices.ci": "2",
        f"{prefix}.engines.copy": str(copy),
        f"{prefix}.engines.decoder": str(dec),
        f"{prefix}.engines.encoder": str(enc),
        f"{prefix}.engines.jpeg": str(jpeg),
        f"{prefix}.engines.ofa": str(ofa),
    }


# --- mig-strategy_test.go TestMigStrategyNoneLabels --------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "sharing", "expected"),
    [
        pytest.param([], Sharing(), {}, id="no devices returns empty labels"),
        pytest.param(
            [full_gpu()], Sharing(), {**AMPERE, **gpu_labels(1, 1, "none", "MOCKMODEL")},
            id="single non-mig device returns non-mig (none) labels",
        ),
        pytest.param(
            [full_gpu()], ts(GPU_X2), {**AMPERE, **gpu_labels(1, 2, "time-slicing", "MOCKMODEL-SHARED")},
            id="sharing is applied to single device",
        ),
        pytest.param(
            [full_gpu(), full_gpu()], ts(GPU_X2), SHARED_TWO,
            id="sharing is applied to multiple devices",
        ),
        pytest.param(
            mig_enabled(), ts(GPU_X2), gpu_labels(1, 0, "none", "MOCKMODEL"),
            id="sharing is not applied to single MIG device; replicas is zero",
        ),
        pytest.param(
            [*mig_enabled(), *mig_enabled()], ts(GPU_X2), gpu_labels(2, 0, "none", "MOCKMODEL"),
            id="sharing is not applied to multiple MIG device; replicas is zero",
        ),
        pytest.param(
            [*mig_enabled(), full_gpu()], ts(GPU_X2), SHARED_TWO,
            id="sharing is applied to MIG device and non-MIG device",
        ),
    ],
)  # fmt: skip
def test_mig_strategy_none_labels(devices: list[NvidiaDevice], sharing: Sharing, expected: Labels) -> None:
    assert resource_labels(devices, MigStrategy.NONE, sharing) == (expected, ())


# --- mig-strategy_test.go TestMigStrategySingleLabels ------------------------------------------------------

SINGLE = {"nvidia.com/mig.strategy": "single"}
INVALID = {**gpu_labels(0, 0, "", "MOCKMODEL-MIG-INVALID", memory=0), **SINGLE}
ENGINES = {
    "multiprocessors": 12,
    "engines.copy": 13,
    "engines.decoder": 14,
    "engines.encoder": 15,
    "engines.jpeg": 16,
    "engines.ofa": 17,
}


@pytest.mark.parametrize(
    ("devices", "expected", "reason"),
    [
        pytest.param([], {}, None, id="no devices returns empty labels"),
        pytest.param(
            [full_gpu()], {**AMPERE, **gpu_labels(1, 1, "none", "MOCKMODEL"), **SINGLE}, None,
            id="single non-mig device returns non-mig (none) labels",
        ),
        pytest.param(
            [full_gpu(), full_gpu()], {**AMPERE, **gpu_labels(2, 1, "none", "MOCKMODEL"), **SINGLE}, None,
            id="multiple non-mig device returns non-mig (none) labels",
        ),
        pytest.param(
            mig_enabled((1, 2, 100, {})),
            {
                **gpu_labels(1, 1, "none", "MOCKMODEL-MIG-1g.100gb", 100), **SINGLE,
                **mig_attrs("nvidia.com/gpu"),
            },
            None,
            id="single mig-enabled device returns mig labels",
        ),
        pytest.param(
            [*mig_enabled((1, 2, 100, ENGINES)), *mig_enabled((1, 2, 100, ENGINES))],
            {
                **gpu_labels(2, 1, "none", "MOCKMODEL-MIG-1g.100gb", 100), **SINGLE,
                **mig_attrs("nvidia.com/gpu", (12, 13, 14, 15, 16, 17)),
            },
            None,
            id="multiple mig-enabled devices returns mig labels",
        ),
        pytest.param(
            mig_enabled(), INVALID, "at least one MIG device is enabled but empty",
            id="empty mig devices returns MIG invalid label",
        ),
        pytest.param(
            mig_enabled((1, 2, 100, {}), (3, 4, 100, {})), INVALID,
            "more than one MIG device type present on node",
            id="mixed mig config returns MIG invalid label",
        ),
        pytest.param(
            [*mig_enabled((1, 2, 100, {})), full_gpu()], {**AMPERE, **INVALID},
            "devices with MIG enabled and disable detected",
            id="mixed mig enabled and disabled returns invalid config",
        ),
        pytest.param(
            [*mig_enabled((1, 2, 100, {})), full_gpu(), *mig_enabled()], {**AMPERE, **INVALID},
            "at least one MIG device is enabled but empty",
            id="enabled, disabled, and empty returns invalid config",
        ),
    ],
)  # fmt: skip
def test_mig_strategy_single_labels(
    devices: list[NvidiaDevice], expected: Labels, reason: str | None
) -> None:
    warnings = (
        () if reason is None else (f"Invalid configuration detected for mig-strategy=single: {reason}",)
    )
    assert resource_labels(devices, MigStrategy.SINGLE, Sharing()) == (expected, warnings)


# --- resource_test.go TestGPUResourceLabeler ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "sharing", "expected"),
    [
        pytest.param(0, Sharing(), {}, id="zero count returns empty"),
        pytest.param(1, Sharing(), gpu_labels(1, 1, "none", "MOCKMODEL"), id="no sharing"),
        pytest.param(
            1, ts(ReplicatedResource("nvidia.com/not-gpu", 2)), gpu_labels(1, 1, "none", "MOCKMODEL"),
            id="time-slicing ignores non-matching resource",
        ),
        pytest.param(
            1, ts(GPU_X2), gpu_labels(1, 2, "time-slicing", "MOCKMODEL-SHARED"),
            id="time-slicing appends suffix and doubles count",
        ),
        pytest.param(
            1, ts(ReplicatedResource("nvidia.com/gpu", 2, "nvidia.com/gpu.shared")),
            gpu_labels(1, 2, "time-slicing", "MOCKMODEL"),
            id="time-slicing renamed does not append suffix and doubles count",
        ),
        pytest.param(
            1, Sharing(mps=ReplicatedResources((ReplicatedResource("nvidia.com/not-gpu", 2),))),
            gpu_labels(1, 1, "none", "MOCKMODEL"), id="mps ignores non-matching resource",
        ),
        pytest.param(
            1, Sharing(mps=ReplicatedResources((GPU_X2,))), gpu_labels(1, 2, "mps", "MOCKMODEL-SHARED"),
            id="mps appends suffix and doubles count",
        ),
        pytest.param(
            1, Sharing(mps=ReplicatedResources((GPU_RENAMED,))),
            gpu_labels(1, 2, "mps", "MOCKMODEL"), id="mps renamed does not append suffix and doubles count",
        ),
    ],
)  # fmt: skip
def test_gpu_resource_labeler(count: int, sharing: Sharing, expected: Labels) -> None:
    labels = gpu_resource_labels(full_gpu(), count, sharing)
    assert labels == ({**expected, **AMPERE} if expected else {})


# --- resource_test.go TestSanitise -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a space separated string", "a-space-separated-string"),
        ("some(thing)else", "somethingelse"),
        ("some ( thing )else", "some-thing-else"),
        ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
        (" input  with multiple   spaces   ", "input-with-multiple-spaces"),
        ("some [ / thing / ]else", "some-thing-else"),
        ("some / thing /else", "some-thing-else"),
        ("some-thing.else_new", "some-thing.else_new"),
    ],
)
def test_sanitise(text: str, expected: str) -> None:
    assert sanitise(text) == expected


# --- resource_test.go TestMigResourceLabeler ---------------------------------------------------------------

MIG_300 = mig_enabled((1, 2, 300, {}))[1]


def mig_labels(prefix: str, replicas: int, strategy: str, product: str) -> Labels:
    return {
        f"{prefix}.count": "1",
        f"{prefix}.replicas": str(replicas),
        f"{prefix}.sharing-strategy": strategy,
        f"{prefix}.memory": "300",
        f"{prefix}.product": product,
        **mig_attrs(prefix),
    }


@pytest.mark.parametrize(
    ("resource", "count", "sharing", "expected"),
    [
        pytest.param("nvidia.com/gpu", 0, Sharing(), {}, id="zero count returns empty"),
        pytest.param(
            "nvidia.com/gpu", 1, Sharing(), mig_labels("nvidia.com/gpu", 1, "none", "MOCKMODEL-MIG-1g.300gb"),
            id="no sharing",
        ),
        pytest.param(
            "nvidia.com/gpu", 1, ts(GPU_X2),
            mig_labels("nvidia.com/gpu", 2, "time-slicing", "MOCKMODEL-MIG-1g.300gb-SHARED"),
            id="shared appends suffix and doubles count",
        ),
        pytest.param(
            "nvidia.com/gpu", 1, ts(ReplicatedResource("nvidia.com/gpu", 2, "nvidia.com/gpu.shared")),
            mig_labels("nvidia.com/gpu", 2, "time-slicing", "MOCKMODEL-MIG-1g.300gb"),
            id="renamed does not append suffix and doubles count",
        ),
        pytest.param(
            "nvidia.com/mig-1g.1gb", 1,
            ts(GPU_RENAMED, ReplicatedResource(MIG_1G, 2)),
            mig_labels("nvidia.com/mig-1g.1gb", 2, "time-slicing", "MOCKMODEL-MIG-1g.300gb-SHARED"),
            id="mig mixed appends shared",
        ),
        pytest.param(
            MIG_1G, 1, ts(ReplicatedResource(MIG_1G, 2, f"{MIG_1G}.shared")),
            mig_labels("nvidia.com/mig-1g.1gb", 2, "time-slicing", "MOCKMODEL-MIG-1g.300gb"),
            id="mig mixed rename does not append",
        ),
    ],
)  # fmt: skip
def test_mig_resource_labeler(resource: str, count: int, sharing: Sharing, expected: Labels) -> None:
    assert mig_resource_labels(resource, MIG_300, count, sharing) == expected


# --- mixed, and the node-wide labels ----------------------------------------------------------------------


def test_mixed_labels_each_mig_type_under_its_resource_with_time_slicing() -> None:
    devices = [*mig_enabled((1, 2, 5, {}), (1, 2, 5, {}), (2, 2, 10, {}))]
    labels, warnings = resource_labels(
        devices, MigStrategy.MIXED, ts(ReplicatedResource("nvidia.com/mig-1g.5gb", 4))
    )
    assert warnings == ()
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "MOCKMODEL-MIG-1g.5gb-SHARED"
    assert labels["nvidia.com/mig-2g.10gb.product"] == "MOCKMODEL-MIG-2g.10gb"
    assert labels["nvidia.com/gpu.replicas"] == "0"


def test_a_mig_profile_with_plus_is_labelled_with_a_dot() -> None:
    devices = mig_enabled((1, 2, 5, {}))
    me = [devices[0], replace(devices[1], mig_profile="1g.5gb+me")]
    labels, _ = resource_labels(me, MigStrategy.MIXED, Sharing())
    assert labels["nvidia.com/mig-1g.5gb.me.product"] == "MOCKMODEL-MIG-1g.5gb.me"


def test_node_labels_say_mig_capable_and_mps_capable() -> None:
    gpu = full_gpu()
    mps = Sharing(mps=ReplicatedResources((GPU_X2,), fail_requests_greater_than_one=True))
    labels, _ = node_labels([gpu], MigStrategy.NONE, mps)
    assert (labels["nvidia.com/mig.capable"], labels["nvidia.com/mps.capable"]) == ("false", "true")
    labels, warnings = node_labels(mig_enabled((1, 2, 5, {})), MigStrategy.SINGLE, mps)
    assert (labels["nvidia.com/mig.capable"], labels["nvidia.com/mps.capable"]) == ("true", "false")
    assert warnings == ("MPS sharing is not supported for mig devices",)
