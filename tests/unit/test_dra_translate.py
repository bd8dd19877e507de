"""hami_control.dra_translate and the webhook's translation of GPU pods to DRA claims: every translated
pod's claims ask what the device-plugin path would have given the pod after HAMi's defaults
(hypothesis, against the same webhook without translation), template names are deterministic and
injective, the CEL selectors mean what HAMi's annotations mean (evaluated), and every denial names the
field and says what to write instead."""

from __future__ import annotations

import base64
import json
from typing import Any

import cel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.dra import DEVICE_CLASS, DRIVER
from hami_api.errors import WireFormatError
from hami_api.resources import RequestDefaults, pod_requests
from hami_api.types import DeviceSelector
from hami_control.config import ControlConfig, DRATranslation, PrivilegedPolicy, ServerSettings
from hami_control.dra_translate import (
    ANNOTATION,
    CEL_MAX_LENGTH,
    MAX_DEVICES,
    ClaimRecord,
    GPUClaim,
    cel_string,
    claim_name,
    claims_usage,
    decode_claims,
    encode_claims,
    template_difference,
    type_selector,
    uuid_selector,
)
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.webhook import Decision, handle_admission_review, review_pod
from hami_sim.apiserver.patch import json_patch
from tests.builders import FixedQuota, admission_review, as_body, container, gpu_pod, pod

CONFIG = ControlConfig(server=ServerSettings(insecure_http=True))
MODELS = (("NVIDIA A100-PCIE-40GB", 40960), ("NVIDIA A100-SXM4-80GB", 81920), ("Tesla T4", 15360))
DRA = CONFIG.with_settings(dra_translation=DRATranslation.NAMESPACE, dra_gpu_memory=MODELS)
UNLIMITED = FixedQuota(QuotaLimits())
Pod = dict[str, Any]


def translated(obj: Pod, config: ControlConfig = DRA, quota: Any = UNLIMITED) -> Decision:
    return review_pod(obj, "CREATE", config, quota, "team", translate=True)


def patched(obj: Pod, decision: Decision) -> Pod:
    assert decision.allowed, decision.message
    result: Pod = json_patch(obj, list(decision.patch))
    return result


def template_requests(claim: GPUClaim) -> dict[str, Any]:
    request: dict[str, Any] = claim.template_spec()["spec"]["devices"]["requests"][0]
    return request


# --- the shape of a translated pod --------------------------------------------------------------------------


def test_a_shared_gpu_pod_becomes_one_claim_from_a_template_of_its_size() -> None:
    obj = gpu_pod("infer", gpumem=4000, gpucores=30, namespace="team")
    decision = translated(obj)
    out = patched(obj, decision)
    main = out["spec"]["containers"][0]
    assert main["resources"] == {"claims": [{"name": "gpu-main"}]}  # no nvidia.com/* left
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpu-main", "resourceClaimTemplateName": "hami-gpu-1x-4000mi-30c"}
    ]
    assert out["spec"]["schedulerName"] == "hami-scheduler"
    assert json.loads(out["metadata"]["annotations"][ANNOTATION]) == [
        {"container": "main", "claim": "gpu-main", "template": "hami-gpu-1x-4000mi-30c",
         "gpus": 1, "memory": 4000, "cores": 30}
    ]  # fmt: skip
    (claim,) = decision.claims
    assert claim.template("team") == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "hami-gpu-1x-4000mi-30c",
            "namespace": "team",
            "labels": {
                "app.kubernetes.io/managed-by": "hami-control",
                "app.kubernetes.io/part-of": "hami-py",
            },
        },
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "hami-core-gpu.project-hami.io", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "4000Mi", "cores": "30"}}}}]}}},
    }  # fmt: skip
    assert decision.quota_usage == QuotaUsage(4000, 30)


def test_a_whole_gpu_asks_no_capacity_so_the_request_policy_defaults_take_the_whole_device() -> None:
    decision = translated(gpu_pod("train", gpus=1))
    (claim,) = decision.claims
    assert claim.template_name == "hami-gpu-1x-100c"
    assert "capacity" not in template_requests(claim)["exactly"]
    assert decision.quota_usage == QuotaUsage(0, 100)  # HAMi counts a whole GPU's memory as 0 at admission


def test_whole_gpus_need_no_distinct_attribute_since_each_share_consumes_a_whole_device() -> None:
    (claim,) = translated(gpu_pod("train", gpus=2)).claims
    assert "constraints" not in claim.template_spec()["spec"]["devices"]
    (sliced,) = translated(gpu_pod("train", gpus=2, gpumem=1000)).claims
    assert sliced.template_spec()["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": "hami-core-gpu.project-hami.io/uuid"}
    ]


def test_zero_cores_are_written_since_the_cores_default_is_the_whole_gpu() -> None:
    (claim,) = translated(gpu_pod(gpumem=2000)).claims
    assert template_requests(claim)["exactly"]["capacity"]["requests"] == {"memory": "2000Mi", "cores": "0"}
    assert claim.template_name == "hami-gpu-1x-2000mi-0c"


def test_two_gpus_get_distinct_devices_through_distinct_attribute_on_the_uuid() -> None:
    (claim,) = translated(gpu_pod(gpus=2, gpumem=10000, gpucores=50)).claims
    spec = claim.template_spec()["spec"]["devices"]
    assert spec["requests"][0]["exactly"]["count"] == 2
    assert spec["constraints"] == [{"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/uuid"}]
    (one,) = translated(gpu_pod(gpus=1, gpumem=10000)).claims
    assert "constraints" not in one.template_spec()["spec"]["devices"]


def test_numa_bind_with_several_gpus_adds_match_attribute_on_the_numa_node() -> None:
    obj = gpu_pod(gpus=2, gpumem=1000, annotations={"nvidia.com/numa-bind": "true"})
    (claim,) = translated(obj).claims
    assert claim.template_spec()["spec"]["devices"]["constraints"][1] == {
        "requests": ["gpu"],
        "matchAttribute": f"{DRIVER}/numaNode",
    }
    assert claim.template_name.startswith("hami-gpu-2x-1000mi-0c-")
    (single,) = translated(gpu_pod(gpus=1, gpumem=1000, annotations={"nvidia.com/numa-bind": "true"})).claims
    assert single.template_name == "hami-gpu-1x-1000mi-0c"  # one GPU is always on one node


def test_every_gpu_container_gets_its_own_claim_init_containers_included() -> None:
    obj = pod(
        "p",
        container("a", gpus=1, gpumem=1000),
        container("b", gpus=1, gpumem=1000),
        container("plain", limits={"cpu": "1"}),
        init=[container("setup", gpus=1, gpumem=500, gpucores=10)],
    )
    decision = translated(obj)
    out = patched(obj, decision)
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpu-setup", "resourceClaimTemplateName": "hami-gpu-1x-500mi-10c"},
        {"name": "gpu-a", "resourceClaimTemplateName": "hami-gpu-1x-1000mi-0c"},
        {"name": "gpu-b", "resourceClaimTemplateName": "hami-gpu-1x-1000mi-0c"},
    ]
    assert out["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "gpu-setup"}]}
    assert out["spec"]["containers"][2]["resources"] == {"limits": {"cpu": "1"}}
    # One template per distinct ask; claims held for the pod's life, so the init container counts too.
    assert sorted(c.template_name for c in decision.claims) == [
        "hami-gpu-1x-1000mi-0c",
        "hami-gpu-1x-500mi-10c",
    ]
    assert decision.quota_usage == QuotaUsage(2500, 10)


def test_other_resources_and_claims_of_a_container_are_kept_and_priority_becomes_env() -> None:
    main = container("main", gpus=1, gpumem=3000, priority=1, limits={"cpu": "2", "memory": "1Gi"},
                     requests={"cpu": "1", "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})  # fmt: skip
    side = container("side", priority=0)
    obj = pod("p", main, side)
    out = patched(obj, translated(obj))
    first, second = out["spec"]["containers"]
    assert first["resources"] == {
        "limits": {"cpu": "2", "memory": "1Gi"},
        "requests": {"cpu": "1"},
        "claims": [{"name": "gpu-main"}],
    }
    assert {"name": "CUDA_TASK_PRIORITY", "value": "1"} in first["env"]
    assert second["resources"] == {}  # its only resource was nvidia.com/priority
    assert {"name": "CUDA_TASK_PRIORITY", "value": "0"} in second["env"]


def test_a_pod_already_using_resource_claims_is_not_translated() -> None:
    obj = gpu_pod(gpumem=1000, resourceClaims=[{"name": "mine", "resourceClaimName": "c"}])
    decision = translated(obj)
    assert decision.allowed and not decision.claims
    out = patched(obj, decision)
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "1000"
    assert ANNOTATION not in out["metadata"].get("annotations", {})
    assert "pod already uses resourceClaims: not translated to DRA" in decision.notes


def test_a_pod_without_gpu_is_left_as_the_device_plugin_path_leaves_it() -> None:
    obj = pod("p", container("a", limits={"cpu": "1"}))
    assert translated(obj) == review_pod(obj, "CREATE", DRA, UNLIMITED, "team")


def test_the_annotation_a_user_wrote_is_replaced() -> None:
    forged = encode_claims([ClaimRecord("main", "gpu-main", "x", 1, 1, 0)])
    obj = gpu_pod(gpumem=9000, annotations={ANNOTATION: forged})
    out = patched(obj, translated(obj))
    (entry,) = decode_claims(out["metadata"]["annotations"][ANNOTATION])
    assert (entry.memory, entry.template) == (9000, "hami-gpu-1x-9000mi-0c")


def test_a_pod_without_metadata_gets_it_whole() -> None:
    obj = {"spec": {"containers": [container(gpus=1, gpumem=100)]}}
    out = patched(obj, translated(obj))
    assert set(out["metadata"]) == {"annotations"}


# --- gpumem-percentage --------------------------------------------------------------------------------------


def test_a_percentage_is_translated_when_use_gputype_picks_models_of_one_size() -> None:
    obj = gpu_pod(gpumem_percentage=25, gpucores=20, annotations={"nvidia.com/use-gputype": "A100-SXM4"})
    (claim,) = translated(obj).claims
    assert (claim.memory, claim.cores) == (81920 // 4, 20)


def test_a_whole_percentage_needs_no_model() -> None:
    (claim,) = translated(gpu_pod(gpumem_percentage=100)).claims
    assert (claim.memory, claim.cores, claim.template_name) == (None, 100, "hami-gpu-1x-100c")


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        ({}, "because the pod names no GPU model (annotation nvidia.com/use-gputype)"),
        ({"nvidia.com/use-gputype": "A100"}, "matches GPU models of different memory sizes "
         "(NVIDIA A100-PCIE-40GB 40960 MiB, NVIDIA A100-SXM4-80GB 81920 MiB)"),
        ({"nvidia.com/use-gputype": "H100"},
         "nvidia.com/use-gputype 'H100' matches no GPU model whose memory hami-control knows"),
    ],
    ids=["no model", "two sizes", "unknown model"],
)  # fmt: skip
def test_a_percentage_no_model_size_fixes_is_denied_saying_what_to_write(
    annotations: dict[str, str], why: str
) -> None:
    decision = translated(gpu_pod(gpumem_percentage=50, annotations=annotations))
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith(
        "container 'main': nvidia.com/gpumem-percentage 50 cannot be translated to a DRA claim"
    )
    assert why in decision.message
    assert "Write nvidia.com/gpumem: <MiB per GPU> instead" in decision.message


def test_nouse_gputype_can_narrow_use_gputype_to_one_size() -> None:
    obj = gpu_pod(gpumem_percentage=50, annotations={"nvidia.com/use-gputype": "A100",
                                                     "nvidia.com/nouse-gputype": "40GB"})  # fmt: skip
    (claim,) = translated(obj).claims
    assert claim.memory == 40960


def test_without_a_model_table_the_denial_says_so() -> None:
    config = DRA.with_settings(dra_gpu_memory=())
    decision = translated(gpu_pod(gpumem_percentage=50, annotations={"nvidia.com/use-gputype": "T4"}), config)
    assert "its draGPUMemory setting is empty" in decision.message


# --- other denials ------------------------------------------------------------------------------------------


def test_more_gpus_than_a_claim_holds_is_denied() -> None:
    decision = translated(gpu_pod(gpus=MAX_DEVICES + 1))
    assert decision.code == 403
    assert decision.message == (
        "container 'main': nvidia.com/gpu 33 is more GPUs than one DRA claim can hold (32); "
        "ask for at most 32"
    )
    assert translated(gpu_pod(gpus=MAX_DEVICES)).allowed


def test_a_mode_the_dra_driver_does_not_serve_is_denied() -> None:
    decision = translated(gpu_pod(annotations={"nvidia.com/vgpu-mode": "mig"}))
    assert decision.code == 403
    assert "annotation nvidia.com/vgpu-mode 'mig' does not allow hami-core" in decision.message
    assert translated(gpu_pod(annotations={"nvidia.com/vgpu-mode": "mig,hami-core"})).allowed


def test_a_bad_numa_bind_value_is_invalid() -> None:
    decision = translated(gpu_pod(annotations={"nvidia.com/numa-bind": "maybe"}))
    assert (decision.code, decision.reason) == (422, "Invalid")
    assert "nvidia.com/numa-bind" in decision.message


def test_a_skipped_privileged_gpu_container_is_denied() -> None:
    config = DRA.with_settings(privileged_policy=PrivilegedPolicy.SKIP)
    obj = pod("p", container("a", gpus=1), container("root", gpus=1, securityContext={"privileged": True}))
    decision = translated(obj, config)
    assert decision.code == 403
    assert decision.message.startswith("container 'root' is privileged and left alone by hami-control's")


def test_a_selector_over_kube_apiservers_limit_is_denied_naming_the_annotation() -> None:
    uuids = ",".join(f"GPU-{i:036d}" for i in range(300))
    decision = translated(gpu_pod(annotations={"nvidia.com/use-gpuuuid": uuids}))
    assert decision.code == 403
    assert decision.message.startswith("annotation nvidia.com/use-gpuuuid lists too much for a DRA selector")
    assert str(CEL_MAX_LENGTH) in decision.message


def test_the_policy_annotations_draw_a_warning() -> None:
    decision = translated(gpu_pod(annotations={"hami.io/gpu-scheduler-policy": "binpack"}))
    assert decision.warnings == (
        "annotation hami.io/gpu-scheduler-policy has no effect on a pod translated to DRA: kube-scheduler "
        "allocates its claims",
    )


def test_quota_is_checked_on_the_translated_ask() -> None:
    quota = FixedQuota(QuotaLimits(memory=10000), QuotaUsage(8000, 0))
    decision = translated(
        gpu_pod(gpumem_percentage=10, annotations={"nvidia.com/use-gputype": "T4"}), DRA, quota
    )
    assert decision.allowed  # 1536 MiB
    decision = translated(
        gpu_pod(gpumem_percentage=20, annotations={"nvidia.com/use-gputype": "T4"}), DRA, quota
    )
    assert decision.message == (
        "namespace team: GPU memory quota exceeded (used 8000 / limit 10000 MiB, this pod asks 3072)"
    )


# --- which route translates ---------------------------------------------------------------------------------


def review(config: ControlConfig, *, dra_route: bool) -> dict[str, Any]:
    body = as_body(admission_review(gpu_pod(gpumem=1000), namespace="team"))
    result = handle_admission_review(body, config, UNLIMITED, dra_route=dra_route)
    response: dict[str, Any] = result.body["response"]
    return response


@pytest.mark.parametrize(
    ("mode", "dra_route", "outcome"),
    [
        (DRATranslation.NAMESPACE, True, "translated"),
        (DRATranslation.NAMESPACE, False, "device plugin"),
        (DRATranslation.ALL, False, "translated"),
        (DRATranslation.ALL, True, "translated"),
        (DRATranslation.OFF, False, "device plugin"),
        (DRATranslation.OFF, True, "denied"),
    ],
)
def test_the_route_and_the_setting_decide_whether_a_pod_is_translated(
    mode: DRATranslation, dra_route: bool, outcome: str
) -> None:
    response = review(CONFIG.with_settings(dra_translation=mode), dra_route=dra_route)
    if outcome == "denied":
        assert not response["allowed"]
        assert "hami-control runs with --dra-translation off" in response["status"]["message"]
        return
    ops = json.loads(base64.b64decode(response["patch"]))
    assert any(op["path"] == "/spec/resourceClaims" for op in ops) is (outcome == "translated")


# --- properties ---------------------------------------------------------------------------------------------

PERCENT = st.one_of(st.none(), st.integers(1, 100))


@st.composite
def gpu_containers(draw: st.DrawFn, name: str) -> Pod:
    return container(
        name,
        gpus=draw(st.one_of(st.none(), st.integers(1, 4))),
        gpumem=draw(st.one_of(st.none(), st.integers(1, 40000))),
        gpumem_percentage=draw(PERCENT),
        gpucores=draw(st.one_of(st.none(), st.integers(0, 100))),
    )


@st.composite
def gpu_pods(draw: st.DrawFn) -> Pod:
    regular = [draw(gpu_containers(f"c{i}")) for i in range(draw(st.integers(1, 3)))]
    inits = [draw(gpu_containers(f"i{i}")) for i in range(draw(st.integers(0, 2)))]
    annotations = draw(
        st.sampled_from([{}, {"nvidia.com/use-gputype": "T4"}, {"nvidia.com/use-gputype": "a100"}])
    )
    return pod("p", *regular, init=inits, annotations=annotations, namespace="team")


DEFAULTS = st.builds(
    RequestDefaults,
    default_memory=st.sampled_from([0, 1000]),
    default_cores=st.sampled_from([0, 20]),
    default_gpu_num=st.integers(1, 2),
    memory_factor=st.sampled_from([1, 2]),
)


@settings(max_examples=300)
@given(gpu_pods(), DEFAULTS)
def test_every_translated_claim_asks_what_the_device_plugin_path_would_after_defaults(
    obj: Pod, defaults: RequestDefaults
) -> None:
    """The same webhook without translation gives the pod its defaults (gpucores=100 for a whole GPU,
    defaultGPUNum, defaultMemory, memoryFactor); its requests are the ask. The translated pod asks the
    same per container, through its template, and records it in its annotation."""
    config = DRA.with_settings(
        **{f.name: getattr(defaults, f.name) for f in defaults.__dataclass_fields__.values()}
    )
    plain = review_pod(obj, "CREATE", config, UNLIMITED, "team")
    decision = translated(obj, config)
    if not plain.allowed:
        assert not decision.allowed
        return
    asks = pod_requests(patched(obj, plain), config.requests.names, config.requests.defaults)
    if not decision.allowed:  # only a percentage that no model size fixes may be refused
        assert "nvidia.com/gpumem-percentage" in decision.message
        assert any(a is not None and a.memreq == 0 and a.mem_percentage not in (None, 100) for a in asks)
        return
    out = patched(obj, decision)
    templates = {c.template_name: c for c in decision.claims}
    claimed = {c["name"]: c["resourceClaimTemplateName"] for c in out["spec"].get("resourceClaims", [])}
    records = decode_claims(out["metadata"]["annotations"][ANNOTATION]) if claimed else ()
    containers = [*out["spec"].get("initContainers", []), *out["spec"]["containers"]]
    assert len(records) == sum(a is not None for a in asks)
    for ask, entry in zip([a for a in asks if a is not None], records, strict=True):
        claim = templates[claimed[entry.claim]]
        assert claim.template_name == entry.template
        assert (claim.gpus, claim.cores) == (ask.nums, ask.coresreq) == (entry.gpus, entry.cores)
        if ask.memreq:
            assert claim.memory == ask.memreq
        elif ask.mem_percentage in (None, 100):
            assert claim.memory is None
        else:
            size = 15360 if "T4" in json.dumps(obj["metadata"]) else None
            assert size is not None and claim.memory == max(1, size * ask.mem_percentage // 100)
        assert claim.memory == entry.memory
        requests = template_requests(claim)["exactly"]
        assert requests["deviceClassName"] == DEVICE_CLASS
        assert requests["count"] == ask.nums
        if claim.memory is None and ask.coresreq == 100:  # a whole GPU: the request policy's defaults
            assert "capacity" not in requests
            continue
        assert requests["capacity"]["requests"]["cores"] == str(ask.coresreq)
        assert requests["capacity"]["requests"].get("memory") == (
            None
            if claim.memory is None
            else f"{claim.memory}Mi"
            if claim.memory % 1024
            else f"{claim.memory // 1024}Gi"
        )
    for c in containers:
        assert not set(c.get("resources", {}).get("limits", {})) & config.requests.names.all
        assert not set(c.get("resources", {}).get("requests", {})) & config.requests.names.all
    assert decision.quota_usage == (claims_usage(records) if records else None)


CLAIM_SIZES = st.builds(
    GPUClaim,
    st.integers(1, 32),
    st.one_of(st.none(), st.integers(1, 2**31 - 1)),
    st.integers(0, 100),
)


@settings(max_examples=300)
@given(CLAIM_SIZES, CLAIM_SIZES)
def test_template_names_are_deterministic_injective_dns_names(a: GPUClaim, b: GPUClaim) -> None:
    assert GPUClaim(a.gpus, a.memory, a.cores).template_name == a.template_name
    assert (a.template_name == b.template_name) == (a == b)
    assert len(a.template_name) <= 63
    assert a.template_name.replace("-", "").isalnum() and a.template_name.islower()


def test_constraints_give_the_name_a_hash_of_them() -> None:
    plain = GPUClaim(1, 1000, 10)
    typed = GPUClaim(1, 1000, 10, selectors=(type_selector(["a100"], use=True),))
    other = GPUClaim(1, 1000, 10, selectors=(type_selector(["t4"], use=True),))
    assert plain.template_name == "hami-gpu-1x-1000mi-10c"
    assert typed.template_name.startswith("hami-gpu-1x-1000mi-10c-")
    assert len({plain.template_name, typed.template_name, other.template_name}) == 3
    assert GPUClaim(2, 1000, 10, same_numa=True).template_name != GPUClaim(2, 1000, 10).template_name


@given(
    st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True), min_size=2, unique=True)
)
def test_claim_names_are_dns_labels_unique_per_container(names: list[str]) -> None:
    claims = [claim_name(n) for n in names]
    assert len(set(claims)) == len(claims)
    for claim in claims:
        assert len(claim) <= 63 and claim[0].isalnum() and claim[-1].isalnum(), claim


# --- the selectors, evaluated -------------------------------------------------------------------------------


def evaluate(expression: str, product: str, uuid: str) -> bool:
    """CEL as kube-scheduler evaluates a selector on a device (the `cel` package; `lowerAscii` as in
    cel-go's strings extension, which Kubernetes' CEL environment includes)."""
    context = cel.Context()
    context.add_function(
        "lowerAscii", lambda text: "".join(c.lower() if "A" <= c <= "Z" else c for c in text)
    )
    context.add_variable(
        "device", {"driver": DRIVER, "attributes": {DRIVER: {"productName": product, "uuid": uuid}}}
    )
    result = cel.evaluate(expression, context)
    assert isinstance(result, bool)
    return result


TYPE_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=12)


@settings(max_examples=200)
@given(st.lists(TYPE_TEXT, min_size=1, max_size=3), st.lists(TYPE_TEXT, max_size=2), TYPE_TEXT)
def test_type_selectors_mean_what_hamis_use_and_nouse_gputype_mean(
    use: list[str], nouse: list[str], product: str
) -> None:
    selector = DeviceSelector(use_types=tuple(use), nouse_types=tuple(nouse))
    verdict = evaluate(type_selector(use, use=True), product, "GPU-0")
    if nouse:
        verdict = verdict and evaluate(type_selector(nouse, use=False), product, "GPU-0")
    assert verdict is selector.type_allowed(product)


@settings(max_examples=200)
@given(st.lists(TYPE_TEXT, min_size=1, max_size=3), st.booleans(), TYPE_TEXT)
def test_uuid_selectors_mean_what_use_and_nouse_gpuuuid_mean(uuids: list[str], use: bool, uuid: str) -> None:
    selector = DeviceSelector(use_uuids=tuple(uuids)) if use else DeviceSelector(nouse_uuids=tuple(uuids))
    candidates = [uuid, uuids[0]]
    for candidate in candidates:
        assert evaluate(uuid_selector(uuids, use=use), "x", candidate) is selector.uuid_allowed(candidate)


@given(st.text())
def test_any_annotation_text_is_one_cel_string_literal(text: str) -> None:
    assert cel.evaluate(cel_string(text), cel.Context()) == text


# --- the annotation -----------------------------------------------------------------------------------------


def test_the_annotation_round_trips_and_sums_every_claim() -> None:
    records = [ClaimRecord("i", "gpu-i", "t1", 1, 500, 10), ClaimRecord("c", "gpu-c", "t2", 2, None, 100)]
    assert decode_claims(encode_claims(records)) == tuple(records)
    assert claims_usage(records) == QuotaUsage(500, 210)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "hami.io/dra-claims: whole value: '{' is not JSON"),
        ("{}", "hami.io/dra-claims: whole value: '{}' is not a JSON list"),
        ('[{"container": "a"}]', "hami.io/dra-claims: entry 0: "),
        ('[{"container":"a","claim":"b","template":"t","gpus":0,"memory":1,"cores":0}]',
         "hami.io/dra-claims: entry 0: gpus '0' is not an integer >= 1"),
        ('[{"container":"a","claim":"b","template":"t","gpus":1,"memory":-1,"cores":0}]',
         "hami.io/dra-claims: entry 0: memory '-1' is not an integer >= 1 or null"),
        ('[{"container":"a","claim":"","template":"t","gpus":1,"memory":1,"cores":0}]',
         "hami.io/dra-claims: entry 0: claim \"''\" is not a name"),
    ],
)  # fmt: skip
def test_a_bad_annotation_is_refused_naming_the_entry_and_key(text: str, message: str) -> None:
    with pytest.raises(WireFormatError) as err:
        decode_claims(text)
    assert str(err.value).startswith(message)


# --- a stored template against the expected one -------------------------------------------------------------


def test_a_stored_template_with_the_servers_defaults_and_canonical_quantities_is_the_same() -> None:
    claim = GPUClaim(2, 1024, 30)
    stored = claim.template_spec()
    exactly = stored["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"]["requests"]["memory"] == "1Gi"  # written canonical already
    del exactly["allocationMode"]
    exactly["capacity"]["requests"]["memory"] = "1024Mi"
    assert template_difference(stored, claim.template_spec()) is None


def test_a_template_the_server_stripped_of_consumable_capacity_is_named_as_such() -> None:
    claim = GPUClaim(2, 4000, 30)
    stored = claim.template_spec()
    del stored["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    difference = template_difference(stored, claim.template_spec())
    assert difference is not None and difference.dropped
    assert str(difference).startswith(
        "spec.spec.devices.requests[0].exactly.capacity is missing: the API server dropped it, so it does "
        "not serve consumable capacity (Kubernetes 1.34/1.35 need the feature gate DRAConsumableCapacity"
    )


def test_someone_elses_template_of_that_name_is_a_difference() -> None:
    claim = GPUClaim(1, 4000, 30)
    greedy = GPUClaim(4, None, 100).template_spec()
    difference = template_difference(greedy, claim.template_spec())
    assert difference is not None and not difference.dropped
    assert str(difference) == "spec.spec.devices.requests[0].exactly.count is 4, not 1"
    extra = claim.template_spec()
    extra["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    assert str(template_difference(extra, claim.template_spec())) == (
        "spec.spec.devices.requests[0].exactly.adminAccess is not one hami-control writes"
    )
