"""HAMi's own webhook tests, transcribed: pkg/scheduler/webhook_test.go (v2.10.0), each case naming its Go
test and sub-case, run through `review_pod` with hami-control's quota view.

The Go quota tests call `fitResourceQuota(pod)` on a QuotaManager filled by hand (`qm.Quotas[ns] =
&DeviceQuota{resource: &Quota{Used, Limit, LimitSet}}`); here the same namespaces are a quota view whose
limits come from a ResourceQuota object (`spec.hard["limits.<resource>"]`, which is how HAMi's
`addQuota` sets LimitSet) through `limits_from_resource_quota`, and whose usage is HAMi's `Used`
(`QuotaUsage.memory/cores` for NVIDIA, `QuotaUsage.others` for the other vendors). The device config of
each Go test (`config.InitDevicesWithConfig(sConfig)`) is the same YAML given to `load_config` with
`--device-config-file`.

The decision (allowed or not) matches HAMi's in every case. HAMi denies a quota overrun with
"exceeding resource quota" (admission.Denied); ours is a 403 that names the namespace, the resource, the
used amount, the limit and the ask, on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from hami_control.config import ControlConfig, load_config
from hami_control.quota import QuotaLimits, QuotaUsage, limits_from_resource_quota
from hami_control.webhook import Decision, review_pod
from tests.builders import FixedQuota, Json, gpu_limits, pod

SOURCE = "/etc/hami/device-config.yaml"
SCHEDULER = "hami-scheduler"
NO_QUOTA = FixedQuota(QuotaLimits())

NVIDIA_SECTION = """\
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
"""
"""The NvidiaConfig of TestFitResourceQuota and its siblings (accepted, not read: hami-control's NVIDIA
names are its own settings, whose defaults are these)."""

CAMBRICON = """\
cambricon:
  resourceCountName: cambricon.com/mlu
  resourceMemoryName: cambricon.com/mlu.smlu.vmemory
  resourceCoreName: cambricon.com/mlu.smlu.vcore
"""
"""The CambriconConfig of TestFitResourceQuotaNonNvidia and TestFitResourceQuotaCountsEveryDevice
(`cambricon.com/mlu`: the --cambricon-mlu-name default, where the chart says `vmlu`)."""

CAMBRICON_HYGON = (
    CAMBRICON
    + """\
hygon:
  resourceCountName: hygon.com/dcunum
  resourceMemoryName: hygon.com/dcumem
  resourceCoreName: hygon.com/dcucores
  memoryFactor: 2
"""
)
"""TestFitResourceQuotaNonNvidia's CambriconConfig and HygonConfig (Hygon scales memory by 2)."""

ASCEND_910B = """\
vnpus:
  configs:
  - commonWord: Ascend910B
    resourceName: huawei.com/Ascend910B
    resourceMemoryName: huawei.com/Ascend910B-memory
    resourceCoreName: huawei.com/Ascend910B-core
    memoryCapacity: 65536
    memoryAllocatable: 65536
    memoryFactor: 4
"""
"""TestFitResourceQuotaAscendMemoryFactor's VNPUs: one chip, no templates, memory factor 4."""

HAMI_IO = [
    "--resource-name=hami.io/gpu", "--resource-mem=hami.io/gpumem",
    "--resource-mem-percentage=hami.io/gpumem-percentage", "--resource-cores=hami.io/gpucores",
]  # fmt: skip
"""The NvidiaConfig named hami.io/* of TestPodHasNodeName and its siblings, as hami-control's flags."""


def control(device_config: str | None = None, *flags: str) -> ControlConfig:
    """hami-control configured as a Go test's `config.InitDevicesWithConfig(sConfig)` (the YAML as the
    file --device-config-file names; None: no file, the chart's values) and `config.SchedulerName =
    "hami-scheduler"` (hami-control's default)."""
    files = {} if device_config is None else {SOURCE: device_config}
    argv = ["--insecure-http", *flags]
    if device_config is not None:
        argv.append(f"--device-config-file={SOURCE}")
    config = load_config(argv, {}, lambda path: files[str(path)])
    assert config.webhook.scheduler_name == SCHEDULER
    return config


@dataclass(frozen=True)
class HamiQuotas:
    """HAMi's QuotaManager.Quotas as a quota view: namespace -> resource -> (Used, Limit or None for an
    entry with LimitSet false). The limits go through a ResourceQuota object and
    `limits_from_resource_quota` (so the vendor's memory factor is applied as HAMi's FitQuota does)."""

    config: ControlConfig
    quotas: Mapping[str, Mapping[str, tuple[int, int | None]]]

    def limits(self, namespace: str) -> QuotaLimits:
        entries = self.quotas.get(namespace, {})
        hard = {f"limits.{name}": str(limit) for name, (_, limit) in entries.items() if limit is not None}
        quota = {"metadata": {"namespace": namespace, "name": "quota"}, "spec": {"hard": hard}}
        return limits_from_resource_quota(quota, self.config)

    def used(self, namespace: str) -> QuotaUsage:
        names = self.config.requests.names
        entries = self.quotas.get(namespace, {})
        others = tuple(
            sorted((n, u) for n, (u, _) in entries.items() if n not in (names.memory, names.cores))
        )
        memory = entries.get(names.memory, (0, None))[0]
        cores = entries.get(names.cores, (0, None))[0]
        return QuotaUsage(memory, cores, others)


def one_container(
    namespace: str,
    limits: Mapping[str, str],
    *,
    name: str = "test-pod",
    init: Sequence[Mapping[str, str]] = (),
    annotations: Mapping[str, str] | None = None,
) -> Json:
    """A pod like the Go tests' (spec.schedulerName hami-scheduler): one container `container1` with these
    limits, after init containers `init1`, `init2`, ... with theirs."""
    return pod(
        name,
        {"name": "container1", "resources": {"limits": dict(limits)}},
        namespace=namespace,
        scheduler_name=SCHEDULER,
        annotations=annotations,
        init=[{"name": f"init{i + 1}", "resources": {"limits": dict(v)}} for i, v in enumerate(init)],
    )


def exceeded(namespace: str, resource: str, used: int, limit: int, asked: int) -> str:
    """Our denial of a vendor resource's quota (HAMi: "exceeding resource quota")."""
    return (
        f"namespace {namespace}: {resource} quota exceeded "
        f"(used {used} / limit {limit}, this pod asks {asked})"
    )


def gpu_memory_exceeded(namespace: str, used: int, limit: int, asked: int) -> str:
    """Our denial of NVIDIA's memory quota (HAMi: "exceeding resource quota")."""
    return (
        f"namespace {namespace}: GPU memory quota exceeded "
        f"(used {used} / limit {limit} MiB, this pod asks {asked})"
    )


def assert_decision(decision: Decision, fit: bool, message: str = "") -> None:
    """HAMi's fit: allowed; not fit: a 403 with our message."""
    if fit:
        assert decision.allowed, decision.message
    else:
        assert (decision.allowed, decision.code, decision.message) == (False, 403, message)


# --- TestHandle / TestPodHasNodeName / TestPodHasDifferentScheduler ----------------------------------------


def test_handle() -> None:
    """TestHandle: a pod asking `nvidia.com/gpu: 1` (securityContext without privileged) is allowed."""
    p = pod(
        "test-pod",
        {"name": "container1", "securityContext": {}, "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        namespace="default",
    )
    decision = review_pod(p, "CREATE", ControlConfig(), NO_QUOTA)
    assert decision.allowed
    assert {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER} in decision.patch


def test_pod_has_node_name() -> None:
    """TestPodHasNodeName: a GPU pod (`hami.io/gpu: 1`, HAMi's names for NVIDIA) with spec.nodeName set
    is denied (HAMi: "pod has node assigned")."""
    p = pod(
        "test-pod",
        {"name": "container1", "resources": {"limits": {"hami.io/gpu": "1"}}},
        namespace="default",
        node_name="test-node",
    )
    decision = review_pod(p, "CREATE", control(None, *HAMI_IO), NO_QUOTA)
    assert (decision.allowed, decision.code) == (False, 403)
    assert decision.message.startswith("pod has node assigned (spec.nodeName 'test-node')")


def test_pod_has_node_name_with_a_vendor_resource() -> None:
    """TestPodHasNodeName with a DCU instead of a GPU: a vendor's MutateAdmission finding its resource
    makes hasResource true, so spec.nodeName denies the pod as for a GPU (webhook.go Handle)."""
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000"}
    p = pod(
        "test-pod",
        {"name": "container1", "resources": {"limits": limits}},
        namespace="default",
        node_name="test-node",
    )
    decision = review_pod(p, "CREATE", control(), NO_QUOTA)
    assert (decision.allowed, decision.code) == (False, 403)
    assert decision.message.startswith("pod has node assigned (spec.nodeName 'test-node')")


def test_pod_has_different_scheduler() -> None:
    """TestPodHasDifferentScheduler: a pod naming another scheduler is allowed untouched (HAMi: "pod
    already has different scheduler assigned")."""
    p = pod(
        "test-pod",
        {"name": "container1", "resources": {"limits": {"hami.io/gpu": "1"}}},
        namespace="default",
        scheduler_name="different-scheduler",
    )
    decision = review_pod(p, "CREATE", control(None, *HAMI_IO), NO_QUOTA)
    assert decision.allowed and decision.patch == ()
    assert decision.notes == ("scheduler 'different-scheduler' named: left alone",)


def test_pod_has_different_scheduler_with_a_vendor_resource() -> None:
    """TestPodHasDifferentScheduler with a DCU instead of a GPU: the scheduler-name gate comes before any
    vendor's MutateAdmission (webhook.go Handle), so the pod is left alone too."""
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000"}
    p = pod(
        "test-pod",
        {"name": "container1", "resources": {"limits": limits}},
        namespace="default",
        scheduler_name="different-scheduler",
    )
    decision = review_pod(p, "CREATE", control(), NO_QUOTA)
    assert decision.allowed and decision.patch == ()


# --- TestFitResourceQuota: NVIDIA, and an Ascend resource no device handles ---------------------------------

DEFAULT_QUOTA = {"default": {"nvidia.com/gpumem": (1000, 2000), "nvidia.com/gpucores": (200, 400)}}


@pytest.mark.parametrize(
    ("case", "limits", "init", "fit", "asked"),
    [
        ("quota passed", gpu_limits("1", gpumem="100"), [], True, 100),
        ("quota exceeded", gpu_limits("1", gpumem="1024"), [], False, 1024),
        ("request multiple gpus", gpu_limits("2", gpumem="1024"), [], False, 2048),
        ("request multiple gpus within quota", gpu_limits("2", gpumem="400"), [], True, 800),
        ("InitContainers run sequentially: max init fits quota, but simple sum would exceed",
         gpu_limits("1", gpumem="500"),
         [gpu_limits("1", gpumem="800"), gpu_limits("1", gpumem="800")], True, 800),
        ("InitContainer request exceeds quota directly",
         gpu_limits("1", gpumem="100"), [gpu_limits("1", gpumem="1500")], False, 1500),
    ],
)  # fmt: skip
def test_fit_resource_quota(
    case: str, limits: dict[str, str], init: list[dict[str, str]], fit: bool, asked: int
) -> None:
    """TestFitResourceQuota (NVIDIA sub-cases): namespace `default` holds 1000 of 2000 MiB and 200 of 400
    cores; a pod's memory is per-GPU memory x GPUs, the regular containers summed, the init containers at
    their largest (max(sum, largest init))."""
    config = control(NVIDIA_SECTION)
    decision = review_pod(
        one_container("default", limits, init=init), "CREATE", config, HamiQuotas(config, DEFAULT_QUOTA)
    )
    assert_decision(decision, fit, gpu_memory_exceeded("default", 1000, 2000, asked))
    if fit:  # what the pod counts against the quota: HAMi's memoryReq
        assert decision.quota_usage == QuotaUsage(memory=asked), case


def test_fit_resource_quota_request_ascend() -> None:
    """TestFitResourceQuota / "request ascend": with NVIDIA alone configured, `huawei.com/Ascend910B` is
    no device's resource: the pod fits (nothing counts) and is left to the default scheduler."""
    config = control(NVIDIA_SECTION, "--enable-ascend")  # on, but the file has no vnpus: section
    assert [v.names.common_word for v in config.registry] == ["NVIDIA"]
    limits = {"huawei.com/Ascend910B": "1", "huawei.com/Ascend910B-memory": "1024"}
    decision = review_pod(
        one_container("default", limits), "CREATE", config, HamiQuotas(config, DEFAULT_QUOTA)
    )
    assert decision.allowed and decision.patch == ()


# --- TestFitResourceQuotaNonNvidia / TestFitResourceQuotaCountsEveryDevice: Cambricon and Hygon ------------

NON_NVIDIA_QUOTAS = {
    # One MLU vmemory unit is 256 MiB: a limit of 100 units is 25600 MiB.
    "mlu-mem": {"cambricon.com/mlu.smlu.vmemory": (0, 100)},
    "mlu-core": {"cambricon.com/mlu.smlu.vcore": (20, 50)},
    # Hygon's memoryFactor 2 scales the request, and the limit with it: 1000 x 2 = 2000.
    "dcu-mem": {"hygon.com/dcumem": (0, 1000)},
}


def mlu_pod(namespace: str, vmemory: str, vcore: str = "", count: str = "1") -> Json:
    """webhook_test.go mluPod: one MLU (`cambricon.com/mlu`) with this vmemory and, if given, vcore."""
    limits = {"cambricon.com/mlu": count, "cambricon.com/mlu.smlu.vmemory": vmemory}
    if vcore:
        limits["cambricon.com/mlu.smlu.vcore"] = vcore
    return one_container(namespace, limits, name="mlu-pod")


def dcu_pod(namespace: str, dcumem: str) -> Json:
    """TestFitResourceQuotaNonNvidia's dcuPod: one DCU with this dcumem."""
    return one_container(namespace, {"hygon.com/dcunum": "1", "hygon.com/dcumem": dcumem}, name="dcu-pod")


@pytest.mark.parametrize(
    ("case", "p", "fit", "message"),
    [
        ("mlu memory within quota", mlu_pod("mlu-mem", "50"), True, ""),
        ("mlu memory over quota", mlu_pod("mlu-mem", "200"), False,
         exceeded("mlu-mem", "cambricon.com/mlu.smlu.vmemory", 0, 25600, 51200)),
        ("mlu cores over quota", mlu_pod("mlu-core", "1", "60"), False,
         exceeded("mlu-core", "cambricon.com/mlu.smlu.vcore", 20, 50, 60)),
        ("mlu in a namespace with no quota", mlu_pod("unquotaed", "10000"), True, ""),
        ("dcu memory within quota once the factor is applied", dcu_pod("dcu-mem", "800"), True, ""),
        ("dcu memory over quota", dcu_pod("dcu-mem", "1200"), False,
         exceeded("dcu-mem", "hygon.com/dcumem", 0, 2000, 2400)),
    ],
)  # fmt: skip
def test_fit_resource_quota_non_nvidia(case: str, p: Json, fit: bool, message: str) -> None:
    """TestFitResourceQuotaNonNvidia: a namespace limit on another vendor's memory or cores holds (memory
    x the vendor's factor on both sides: Cambricon's 256 MiB units, Hygon's memoryFactor 2)."""
    config = control(NVIDIA_SECTION + CAMBRICON_HYGON)
    assert [v.names.common_word for v in config.registry] == ["NVIDIA", "MLU", "DCU"]
    decision = review_pod(p, "CREATE", config, HamiQuotas(config, NON_NVIDIA_QUOTAS))
    assert_decision(decision, fit, message)


def test_fit_resource_quota_non_nvidia_limits_from_a_resource_quota() -> None:
    """TestFitResourceQuotaNonNvidia's limits as HAMi's addQuota reads them from a ResourceQuota: only
    `limits.<memory or cores resource>` of a configured vendor, memory x its factor."""
    config = control(NVIDIA_SECTION + CAMBRICON_HYGON)
    quota = {
        "metadata": {"namespace": "mlu-mem", "name": "q"},
        "spec": {"hard": {
            "limits.cambricon.com/mlu.smlu.vmemory": "100", "limits.hygon.com/dcumem": "1000",
            "limits.cambricon.com/mlu.smlu.vcore": "50", "requests.hygon.com/dcumem": "1",
            "limits.cambricon.com/mlu": "4",
        }},
    }  # fmt: skip
    limits = limits_from_resource_quota(quota, config)
    assert limits.others == (
        ("cambricon.com/mlu.smlu.vcore", 50),
        ("cambricon.com/mlu.smlu.vmemory", 25600),
        ("hygon.com/dcumem", 2000),
    )  # fmt: skip


def test_fit_resource_quota_counts_every_device() -> None:
    """TestFitResourceQuotaCountsEveryDevice: two MLUs of 40 units each ask 2 x 40 x 256 = 20480 MiB,
    past the 60-unit (15360 MiB) limit, although one device fits."""
    config = control(NVIDIA_SECTION + CAMBRICON)
    assert [v.names.common_word for v in config.registry] == ["NVIDIA", "MLU"]
    quotas = HamiQuotas(config, {"mlu-multi": {"cambricon.com/mlu.smlu.vmemory": (0, 60)}})
    decision = review_pod(mlu_pod("mlu-multi", "40", count="2"), "CREATE", config, quotas)
    assert_decision(decision, False, exceeded("mlu-multi", "cambricon.com/mlu.smlu.vmemory", 0, 15360, 20480))
    one = review_pod(mlu_pod("mlu-multi", "40"), "CREATE", config, quotas)
    assert one.allowed


# --- TestFitResourceQuotaAscendMemoryFactor ---------------------------------------------------------------

HAMI_CORE = {"huawei.com/vnpu-mode": "hami-core"}


def ascend_pod(memory: str, annotations: Mapping[str, str] | None = HAMI_CORE) -> Json:
    """The Go test's ascendPod: one Ascend910B, this memory and `-core: 1`. Its `-core` is allowed only
    under hami-core (ascend MutateAdmission: "... is only supported in hami-core (soft split) mode"),
    which also keeps the memory as asked instead of a template's: the Go test calls fitResourceQuota
    directly, past MutateAdmission; through the whole webhook the pod needs `huawei.com/vnpu-mode:
    hami-core` to reach the quota check with the numbers the test means."""
    limits = {
        "huawei.com/Ascend910B": "1",
        "huawei.com/Ascend910B-memory": memory,
        "huawei.com/Ascend910B-core": "1",
    }
    return one_container("ascend", limits, name="ascend-pod", annotations=annotations)


def test_fit_resource_quota_ascend_memory_factor() -> None:
    """TestFitResourceQuotaAscendMemoryFactor: memory factor 4 scales the request and the limit alike:
    4096 x 4 = 16384 fits the 8192 x 4 = 32768 limit; 8192 x 4 reaches it exactly (fits, the Go test's
    comment); 8193 x 4 = 32772 does not."""
    config = control(NVIDIA_SECTION + ASCEND_910B, "--enable-ascend")
    assert [v.names.common_word for v in config.registry] == ["NVIDIA", "Ascend910B"]
    quotas = HamiQuotas(config, {"ascend": {"huawei.com/Ascend910B-memory": (0, 8192)}})
    assert review_pod(ascend_pod("4096"), "CREATE", config, quotas).allowed
    assert review_pod(ascend_pod("8192"), "CREATE", config, quotas).allowed
    decision = review_pod(ascend_pod("8193"), "CREATE", config, quotas)
    assert_decision(decision, False, exceeded("ascend", "huawei.com/Ascend910B-memory", 0, 32768, 32772))


def test_fit_resource_quota_ascend_memory_factor_needs_ascend_enabled() -> None:
    """TestFitResourceQuotaAscendMemoryFactor's guard ("the ascend backend was not registered, the test
    would pass vacuously"): without --enable-ascend the chip is off and its pod is left alone."""
    config = control(NVIDIA_SECTION + ASCEND_910B)
    assert config.registry.get("Ascend910B") is None
    quotas = HamiQuotas(config, {"ascend": {"huawei.com/Ascend910B-memory": (0, 8192)}})
    decision = review_pod(ascend_pod("8193"), "CREATE", config, quotas)
    assert decision.allowed and decision.patch == ()


def test_fit_resource_quota_ascend_pod_without_hami_core_through_the_whole_webhook() -> None:
    """TestFitResourceQuotaAscendMemoryFactor's pod as written (no vnpu-mode annotation) through HAMi's
    Handle: ascend MutateAdmission refuses its `-core` before any quota check (admission.Errored 500
    with the error's text); so does ours."""
    config = control(NVIDIA_SECTION + ASCEND_910B, "--enable-ascend")
    quotas = HamiQuotas(config, {"ascend": {"huawei.com/Ascend910B-memory": (0, 8192)}})
    decision = review_pod(ascend_pod("4096", annotations=None), "CREATE", config, quotas)
    assert (decision.allowed, decision.code, decision.message) == (
        False, 500, "huawei.com/Ascend910B-core is only supported in hami-core (soft split) mode",
    )  # fmt: skip


# --- TestNonGPUPodAllowedAdmission / TestEmptyContainersDenied / TestSchedulerNameEmptyNoOverwrite --------


def test_non_gpu_pod_allowed_admission() -> None:
    """TestNonGPUPodAllowedAdmission: with ForceOverwriteDefaultScheduler false, a pod with no GPU
    resource (cpu, memory) is allowed, its scheduler untouched."""
    config = control(None, *HAMI_IO, "--force-overwrite-default-scheduler=false")
    p = pod(
        "non-gpu-pod",
        {"name": "cpu-only", "image": "busybox", "resources": {"limits": {"cpu": "1", "memory": "256Mi"}}},
        namespace="default",
    )
    decision = review_pod(p, "CREATE", config, NO_QUOTA)
    assert decision.allowed and decision.patch == ()


def test_empty_containers_denied() -> None:
    """TestEmptyContainersDenied: a pod without containers is denied, with HAMi's text."""
    p = pod("empty-pod", namespace="default", containers=[])
    decision = review_pod(p, "CREATE", ControlConfig(), NO_QUOTA)
    assert (decision.allowed, decision.code, decision.message) == (False, 403, "pod has no containers")


def test_scheduler_name_empty_no_overwrite() -> None:
    """TestSchedulerNameEmptyNoOverwrite: ForceOverwriteDefaultScheduler false only spares
    `default-scheduler`; a GPU pod with no scheduler name gets `/spec/schedulerName` = hami-scheduler."""
    config = control(None, *HAMI_IO, "--force-overwrite-default-scheduler=false")
    p = pod(
        "test-pod", {"name": "container1", "resources": {"limits": {"hami.io/gpu": "1"}}}, namespace="default"
    )
    decision = review_pod(p, "CREATE", config, NO_QUOTA)
    assert decision.allowed
    assert {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER} in decision.patch


# --- TestFitResourceQuota_InitContainerPeakSequence ------------------------------------------------------


def test_fit_resource_quota_init_container_peak_sequence() -> None:
    """TestFitResourceQuota_InitContainerPeakSequence: 30000 MiB limit (cores entry without a limit);
    a pod with init 20000 and app 10000 asks its peak, 20000."""
    config = control(NVIDIA_SECTION)

    def make_pod(name: str) -> Json:
        return one_container(
            "default", gpu_limits("1", gpumem="10000"), name=name, init=[gpu_limits("1", gpumem="20000")]
        )

    def quotas(used: int) -> HamiQuotas:
        return HamiQuotas(
            config, {"default": {"nvidia.com/gpumem": (used, 30000), "nvidia.com/gpucores": (0, None)}}
        )

    # Step 1: pod1 is allowed (peak 20000 <= 30000), and counts 20000 (its peak) until it runs
    step1 = review_pod(make_pod("pod1"), "CREATE", config, quotas(0))
    assert step1.allowed and step1.quota_usage == QuotaUsage(memory=20000)
    # Step 2: pod2, the same, is denied (20000 held + 20000 asked > 30000)
    step2 = review_pod(make_pod("pod2"), "CREATE", config, quotas(20000))
    assert_decision(step2, False, gpu_memory_exceeded("default", 20000, 30000, 20000))
    # Step 3: pod1's init container finished, it holds its app's 10000: pod2 fits (10000 + 20000 = 30000)
    assert review_pod(make_pod("pod2"), "CREATE", config, quotas(10000)).allowed
