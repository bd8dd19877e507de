"""hami_control.webhook: HAMi v2.10's admission rules, one table per rule; every patch is applied with the
stand-in API server's RFC 6902 implementation and the resulting pod is checked, patches are minimal; the
AdmissionReview envelope (v1 and v1beta1, 400/413, denials); and hypothesis-generated pods, garbage
included, always get a valid answer."""

from __future__ import annotations

import base64
import copy
import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_api.resources import ResourceNames
from hami_control import webhook
from hami_control.config import ControlConfig, PrivilegedPolicy, ServerSettings
from hami_control.quota import QuotaLimits, QuotaUsage, pod_quota_usage
from hami_control.webhook import (
    Decision,
    DecisionSummary,
    escape_pointer_token,
    handle_admission_review,
    json_patch_diff,
    review_pod,
)
from hami_sim.apiserver.patch import json_patch
from tests.builders import admission_review, as_body, container, pod

GPU, MEM, PCT, CORES, PRIO = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)
CONFIG = ControlConfig(server=ServerSettings(insecure_http=True))
Pod = dict[str, Any]


class View:
    """A QuotaView with fixed numbers; `calls` counts the questions."""

    def __init__(self, limits: QuotaLimits | None = None, used: QuotaUsage | None = None) -> None:
        self._limits = limits or QuotaLimits()
        self._used = used or QuotaUsage()
        self.calls = 0

    def limits(self, namespace: str) -> QuotaLimits:
        self.calls += 1
        return self._limits

    def used(self, namespace: str) -> QuotaUsage:
        self.calls += 1
        return self._used


class BrokenView:
    def limits(self, namespace: str) -> QuotaLimits:
        raise RuntimeError("cache exploded")

    def used(self, namespace: str) -> QuotaUsage:
        raise RuntimeError("cache exploded")


NO_QUOTA = View()
team_pod = functools.partial(pod, "p", namespace="ai-team")
"""The pod the webhook reviews: ai-team/p with the given containers (and `pod`'s other arguments)."""


def review(
    the_pod: Pod, config: ControlConfig = CONFIG, view: Any = NO_QUOTA, operation: str = "CREATE"
) -> Decision:
    before = copy.deepcopy(the_pod)
    decision = review_pod(the_pod, operation, config, view)
    assert the_pod == before, "the rules must never edit the request's object"
    return decision


def admitted(the_pod: Pod, config: ControlConfig = CONFIG, view: Any = NO_QUOTA) -> Pod:
    """The pod as the API server stores it: the decision must allow, and its patch must apply."""
    decision = review(the_pod, config, view)
    assert decision.allowed, decision.message
    result: Pod = json_patch(the_pod, list(decision.patch))
    assert result["metadata"] == the_pod["metadata"]
    # the webhook is idempotent: its own output needs nothing more
    assert review(result, config, View()).patch == ()
    return result


def denied(the_pod: Pod, config: ControlConfig = CONFIG, view: Any = NO_QUOTA) -> Decision:
    decision = review(the_pod, config, view)
    assert not decision.allowed
    assert decision.patch == ()
    return decision


def limits_of(the_pod: Pod, index: int = 0, key: str = "containers") -> dict[str, Any]:
    limits: dict[str, Any] = the_pod["spec"][key][index]["resources"]["limits"]
    return limits


def env_of(the_pod: Pod, index: int = 0, key: str = "containers") -> dict[str, str]:
    return {e["name"]: e["value"] for e in the_pod["spec"][key][index].get("env", [])}


# --- pods the webhook leaves alone ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_pod", "config", "operation"),
    [
        (team_pod(container(limits={"cpu": "1", "memory": "1Gi"})), CONFIG, "CREATE"),
        (team_pod(container()), CONFIG, "CREATE"),
        (team_pod(container(limits={GPU: "0"})), CONFIG, "CREATE"),  # asks no GPU
        (team_pod(container(limits={GPU: "1"}), schedulerName="volcano"), CONFIG, "CREATE"),
        (
            team_pod(container(limits={GPU: "1"}), schedulerName="default-scheduler"),
            CONFIG.with_settings(force_overwrite_default_scheduler=False),
            "CREATE",
        ),
        (team_pod(container(limits={GPU: "1"})), CONFIG, "UPDATE"),
        (team_pod(container(limits={GPU: "1"})), CONFIG, "DELETE"),
        (
            team_pod(container(limits={GPU: "1", CORES: "100"}), schedulerName="hami-scheduler"),
            CONFIG,
            "CREATE",
        ),
        (
            team_pod(container(limits={GPU: "1", MEM: "1000"}), schedulerName="hami-scheduler"),
            CONFIG,
            "CREATE",
        ),
    ],
)
def test_left_alone(the_pod: Pod, config: ControlConfig, operation: str) -> None:
    decision = review(the_pod, config, operation=operation)
    assert decision.allowed
    assert decision.patch == ()
    assert decision.code == 200


def test_another_schedulers_pod_is_not_even_checked() -> None:
    """HAMi's gate comes first: a pod for another scheduler is not HAMi's business, bad values included."""
    decision = review(team_pod(container(limits={MEM: "-5"}), schedulerName="volcano", nodeName="n1"))
    assert decision.allowed
    assert decision.patch == ()


# --- the scheduler name ------------------------------------------------------------------------------------


def test_a_pod_needing_only_the_scheduler_name_gets_exactly_one_op() -> None:
    decision = review(team_pod(container(limits={GPU: "1", MEM: "3000"})))
    assert decision.patch == ({"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},)


@pytest.mark.parametrize(
    ("spec", "op"),
    [({}, "add"), ({"schedulerName": ""}, "replace"), ({"schedulerName": "default-scheduler"}, "replace")],
)
def test_scheduler_name_is_taken_over(spec: dict[str, Any], op: str) -> None:
    the_pod = team_pod(container(limits={GPU: "2", MEM: "1000"}), **spec)
    decision = review(the_pod)
    assert decision.patch == ({"op": op, "path": "/spec/schedulerName", "value": "hami-scheduler"},)
    assert admitted(the_pod)["spec"]["schedulerName"] == "hami-scheduler"


def test_configured_scheduler_name() -> None:
    config = CONFIG.with_settings(scheduler_name="gpu-sched")
    assert (
        admitted(team_pod(container(limits={GPU: "1", MEM: "9"})), config)["spec"]["schedulerName"]
        == "gpu-sched"
    )
    # a pod already naming it is processed (defaults still apply) but keeps its name
    result = admitted(team_pod(container(limits={GPU: "1"}), schedulerName="gpu-sched"), config)
    assert result["spec"]["schedulerName"] == "gpu-sched"
    assert limits_of(result)[CORES] == "100"


# --- defaults: GPU count and the exclusive default ------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # gpumem / gpucores / gpumem-percentage without nvidia.com/gpu: add the default GPU number
        ({MEM: "4000"}, {MEM: "4000", GPU: "1"}),
        ({CORES: "30"}, {CORES: "30", GPU: "1"}),
        ({PCT: "50"}, {PCT: "50", GPU: "1"}),
        ({PCT: "100"}, {PCT: "100", GPU: "1", CORES: "100"}),
        ({MEM: "4000", CORES: "0"}, {MEM: "4000", CORES: "0", GPU: "1"}),
        # a bare GPU (no memory, or 100 %) without cores: a whole GPU
        ({GPU: "1"}, {GPU: "1", CORES: "100"}),
        ({GPU: 2}, {GPU: 2, CORES: "100"}),
        ({GPU: "1", PCT: "100"}, {GPU: "1", PCT: "100", CORES: "100"}),
        ({GPU: "1", PCT: "0"}, {GPU: "1", PCT: "0"}),
        ({GPU: "1", PCT: "60"}, {GPU: "1", PCT: "60"}),
        ({GPU: "1", MEM: "2000"}, {GPU: "1", MEM: "2000"}),
        ({GPU: "1", MEM: "0"}, {GPU: "1", MEM: "0"}),
        ({GPU: "1", CORES: "20"}, {GPU: "1", CORES: "20"}),
        ({GPU: "1", PCT: "100", CORES: "50"}, {GPU: "1", PCT: "100", CORES: "50"}),
        ({GPU: "1", "cpu": "2"}, {GPU: "1", "cpu": "2", CORES: "100"}),
    ],
)
def test_resource_defaults(limits: dict[str, Any], expected: dict[str, Any]) -> None:
    result = admitted(team_pod(container(limits=limits)))
    assert limits_of(result) == expected


def test_default_gpu_number_is_configurable() -> None:
    result = admitted(team_pod(container(limits={MEM: "1000"})), CONFIG.with_settings(default_gpu_num=2))
    assert limits_of(result)[GPU] == "2"


def test_defaults_add_missing_parents_in_one_op() -> None:
    # the request section names gpumem, limits does not exist: one op adds the whole limits object
    the_pod = team_pod({"name": "c", "resources": {"requests": {MEM: "1000"}}})
    decision = review(the_pod)
    assert decision.patch[0] == {
        "op": "add",
        "path": "/spec/containers/0/resources/limits",
        "value": {GPU: "1"},
    }
    assert len(decision.patch) == 2  # + schedulerName
    assert admitted(the_pod)["spec"]["containers"][0]["resources"] == {
        "requests": {MEM: "1000"},
        "limits": {GPU: "1"},
    }


def test_null_limits_are_replaced() -> None:
    the_pod = team_pod({"name": "c", "resources": {"limits": None, "requests": {GPU: "1"}}})
    result = admitted(the_pod)
    assert limits_of(result) == {CORES: "100"}


def test_resource_names_are_escaped_as_json_pointers() -> None:
    decision = review(team_pod(container(limits={GPU: "1"})))
    assert decision.patch[0] == {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
        "value": "100",
    }
    assert escape_pointer_token("a~b/c") == "a~0b~1c"
    assert escape_pointer_token("~1") == "~01"


def test_configured_resource_names() -> None:
    names = ResourceNames("acme.com/gpu", "acme.com/mem", "acme.com/pct", "acme.com/cores", "acme.com/prio")
    config = CONFIG.with_settings(resource_names=names)
    result = admitted(team_pod(container(limits={"acme.com/mem": "100", "acme.com/prio": "1"})), config)
    assert limits_of(result) == {"acme.com/mem": "100", "acme.com/prio": "1", "acme.com/gpu": "1"}
    assert env_of(result) == {"CUDA_TASK_PRIORITY": "1"}
    # nvidia.com names mean nothing under this config
    assert review(team_pod(container(limits={GPU: "1"})), config).patch == ()


# --- multi-container and init containers --------------------------------------------------------------


def test_every_container_is_handled_and_only_changed_ones_are_patched() -> None:
    the_pod = team_pod(
        container("a", limits={GPU: "1", MEM: "1000"}),
        container("b", limits={"cpu": "1"}),
        container("c", limits={MEM: "2000"}),
        container("d", limits={GPU: "2"}),
    )
    decision = review(the_pod)
    paths = [op["path"] for op in decision.patch]
    assert paths == [
        "/spec/containers/2/resources/limits/nvidia.com~1gpu",
        "/spec/containers/3/resources/limits/nvidia.com~1gpucores",
        "/spec/schedulerName",
    ]
    result = admitted(the_pod)
    assert limits_of(result, 0) == {GPU: "1", MEM: "1000"}
    assert limits_of(result, 1) == {"cpu": "1"}
    assert limits_of(result, 2) == {MEM: "2000", GPU: "1"}
    assert limits_of(result, 3) == {GPU: "2", CORES: "100"}


def test_init_containers_are_handled_like_hami() -> None:
    the_pod = team_pod(
        container("app", limits={"cpu": "1"}),
        init=(container("warmup", limits={MEM: "5000", PRIO: "0"}), container("plain")),
    )
    decision = review(the_pod)
    assert [op["path"] for op in decision.patch] == [
        "/spec/initContainers/0/resources/limits/nvidia.com~1gpu",
        "/spec/initContainers/0/env",
        "/spec/schedulerName",
    ]
    result = admitted(the_pod)
    assert limits_of(result, 0, "initContainers") == {MEM: "5000", PRIO: "0", GPU: "1"}
    assert env_of(result, 0, "initContainers") == {"CUDA_TASK_PRIORITY": "0"}
    assert result["spec"]["schedulerName"] == "hami-scheduler"


def test_null_init_containers_stay_null() -> None:
    the_pod = team_pod(container(limits={GPU: "1", MEM: "1"}), initContainers=None)
    assert review(the_pod).patch == ({"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},)


# --- environment --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "value"), [("0", "0"), ("1", "1"), (1, "1"), ("0.5", "1"), ("2k", "2000"), ("100m", "1")]
)
def test_priority_becomes_cuda_task_priority(priority: Any, value: str) -> None:
    result = admitted(team_pod(container(limits={GPU: "1", MEM: "1", PRIO: priority})))
    assert env_of(result) == {"CUDA_TASK_PRIORITY": value}


def test_priority_env_appends_to_existing_env_and_replaces_a_same_named_entry() -> None:
    env = [{"name": "A", "value": "1"}]
    the_pod = team_pod(container(limits={GPU: "1", MEM: "1", PRIO: "1"}, env=env))
    assert review(the_pod).patch[0] == {
        "op": "add",
        "path": "/spec/containers/0/env/-",
        "value": {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    }
    assert admitted(the_pod)["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    ]
    stale = team_pod(
        container(limits={GPU: "1", MEM: "1", PRIO: "1"}, env=[{"name": "CUDA_TASK_PRIORITY", "value": "0"}])
    )
    assert review(stale).patch[0] == {"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "1"}
    assert env_of(admitted(stale)) == {"CUDA_TASK_PRIORITY": "1"}
    same = team_pod(
        container(limits={GPU: "1", MEM: "1", PRIO: "1"}, env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}])
    )
    assert len(review(same).patch) == 1  # only the scheduler name


def test_an_env_entry_from_a_reference_is_replaced_by_a_value() -> None:
    ref = {"name": "CUDA_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    result = admitted(team_pod(container(limits={GPU: "1", MEM: "1", PRIO: "0"}, env=[ref])))
    assert result["spec"]["containers"][0]["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]


def test_priority_without_a_gpu_sets_env_but_not_the_scheduler() -> None:
    """As HAMi: the priority env goes to any container naming it; only a GPU takes the pod over."""
    the_pod = team_pod(container(limits={PRIO: "1"}))
    result = admitted(the_pod)
    assert env_of(result) == {"CUDA_TASK_PRIORITY": "1"}
    assert "schedulerName" not in result["spec"]


@pytest.mark.parametrize(
    ("global_policy", "annotation", "expected"),
    [
        ("default", None, None),
        ("force", None, "force"),
        ("disable", None, "disable"),
        ("default", "force", "force"),
        ("force", "default", None),
        ("force", "disable", "disable"),
        ("default", " force ", "force"),
    ],
)
def test_core_policy(global_policy: str, annotation: str | None, expected: str | None) -> None:
    from hami_api.types import CorePolicy

    config = CONFIG.with_settings(core_policy=CorePolicy(global_policy))
    annotations = None if annotation is None else {"hami.io/core-policy": annotation}
    result = admitted(
        team_pod(container("gpu", limits={GPU: "1", MEM: "1"}), container("cpu"), annotations=annotations),
        config,
    )
    assert env_of(result, 0).get("GPU_CORE_UTILIZATION_POLICY") == expected
    assert "GPU_CORE_UTILIZATION_POLICY" not in env_of(result, 1)  # containers without a GPU: no env


def test_bad_core_policy_annotation() -> None:
    decision = denied(team_pod(container(limits={GPU: "1"}), annotations={"hami.io/core-policy": "none"}))
    assert decision.code == 422
    assert decision.reason == "Invalid"
    assert "hami.io/core-policy" in decision.message
    assert "'none'" in decision.message
    decision = denied(team_pod(container(limits={GPU: "1"}), annotations={"hami.io/core-policy": 3}))
    assert "is not a string" in decision.message
    # a pod without a GPU does not use the annotation, so it is not judged
    assert review(team_pod(container(), annotations={"hami.io/core-policy": "none"})).allowed


def test_overwrite_env_hides_gpus_from_containers_without_one() -> None:
    config = CONFIG.with_settings(overwrite_env=True)
    cpu_only = admitted(
        team_pod(container("a"), container("b", env=[{"name": "X", "value": "y"}]), init=(container("i"),)),
        config,
    )
    assert env_of(cpu_only, 0) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert env_of(cpu_only, 1) == {"X": "y", "NVIDIA_VISIBLE_DEVICES": "none"}
    assert env_of(cpu_only, 0, "initContainers") == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert "schedulerName" not in cpu_only["spec"]
    mixed = admitted(team_pod(container("gpu", limits={GPU: "1", MEM: "1"}), container("side")), config)
    assert env_of(mixed, 0) == {}
    assert env_of(mixed, 1) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    # without the option nothing is added
    assert review(team_pod(container("a"))).patch == ()


# --- runtime class --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "spec", "gpu", "expected"),
    [
        ("nvidia", {}, True, "nvidia"),
        ("nvidia", {"runtimeClassName": None}, True, "nvidia"),
        ("nvidia", {"runtimeClassName": ""}, True, "nvidia"),
        ("nvidia", {"runtimeClassName": "kata"}, True, "kata"),
        ("nvidia", {}, False, None),
        (None, {}, True, None),
    ],
)
def test_runtime_class(configured: str | None, spec: dict[str, Any], gpu: bool, expected: str | None) -> None:
    config = CONFIG.with_settings(runtime_class_name=configured)
    limits = {GPU: "1", MEM: "1"} if gpu else {"cpu": "1"}
    result = admitted(team_pod(container(limits=limits), **spec), config)
    assert result["spec"].get("runtimeClassName") == expected


# --- denials -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [{"containers": []}, {"containers": None}, {}])
def test_no_containers(spec: dict[str, Any]) -> None:
    the_pod = {"metadata": {"name": "p"}, "spec": spec}
    decision = denied(the_pod)
    assert (decision.code, decision.reason, decision.message) == (403, "Forbidden", "pod has no containers")


def test_node_name_with_a_gpu_is_denied() -> None:
    decision = denied(team_pod(container(limits={MEM: "1000"}), nodeName="node-1"))
    assert decision.code == 403
    assert decision.message.startswith("pod has node assigned (spec.nodeName 'node-1')")
    assert "hami-scheduler" in decision.message
    # without a GPU, nodeName is fine
    assert review(team_pod(container(limits={PRIO: "1"}), nodeName="node-1")).allowed


AS_ROOT = {"privileged": True}


@pytest.mark.parametrize(
    ("containers", "init", "label", "asks"),
    [
        ([container("p", limits={GPU: "1"}, securityContext=AS_ROOT)], (), "container 'p'", GPU),
        ([container("c", limits={MEM: "1"})], (container("i", limits={MEM: "9"}, securityContext=AS_ROOT),),
         "init container 'i'", MEM),
        ([container("ok", limits={GPU: "1"}), container("p", limits={CORES: "5"}, securityContext=AS_ROOT)],
         (), "container 'p'", CORES),
    ],
)  # fmt: skip
def test_privileged_gpu_container_is_denied(
    containers: list[dict[str, Any]], init: tuple[dict[str, Any], ...], label: str, asks: str
) -> None:
    decision = denied(team_pod(*containers, init=init))
    assert decision.code == 403
    assert decision.message.startswith(f"{label} is privileged and asks for {asks}")
    assert "securityContext.privileged" in decision.message
    assert "--privileged-policy" in decision.message


def test_privileged_container_without_gpu_in_a_gpu_pod_is_allowed() -> None:
    the_pod = team_pod(
        container("gpu", limits={GPU: "1", MEM: "1"}), container("side", securityContext={"privileged": True})
    )
    assert admitted(the_pod)["spec"]["schedulerName"] == "hami-scheduler"
    # privileged: false, or a non-boolean, is not privileged
    assert review(
        team_pod(container(limits={GPU: "1", MEM: "1"}, securityContext={"privileged": False}))
    ).allowed
    assert review(
        team_pod(container(limits={GPU: "1", MEM: "1"}, securityContext={"privileged": "true"}))
    ).allowed


def test_privileged_policy_skip_gives_hamis_old_behaviour_with_a_warning() -> None:
    config = CONFIG.with_settings(privileged_policy=PrivilegedPolicy.SKIP)
    # the skipped container is untouched and does not take the pod over
    lone = team_pod(container("p", limits={GPU: "1"}, securityContext={"privileged": True}))
    decision = review(lone, config)
    assert decision.allowed
    assert decision.patch == ()
    assert decision.warnings == (
        "container 'p' is privileged: its GPU request is not shared or limited by HAMi",
    )
    # another GPU container still takes the pod over; the skipped one gets no defaults
    mixed = team_pod(
        container("p", limits={GPU: "1"}, securityContext={"privileged": True}),
        container("g", limits={MEM: "10"}),
    )
    result = admitted(mixed, config)
    assert limits_of(result, 0) == {GPU: "1"}
    assert limits_of(result, 1) == {MEM: "10", GPU: "1"}
    assert result["spec"]["schedulerName"] == "hami-scheduler"


def test_privileged_policy_skip_still_counts_the_skipped_container_in_the_quota() -> None:
    config = CONFIG.with_settings(privileged_policy=PrivilegedPolicy.SKIP)
    the_pod = team_pod(
        container("p", limits={GPU: "1", MEM: "5000"}, securityContext={"privileged": True}),
        container("g", limits={MEM: "1000"}),
    )
    decision = review(the_pod, config, View(QuotaLimits(memory=5500)))
    assert decision.message.endswith("this pod asks 6000)")


def test_privileged_policy_skip_denies_a_privileged_gpu_pod_saying_why_it_would_stay_pending() -> None:
    config = CONFIG.with_settings(privileged_policy=PrivilegedPolicy.SKIP)
    decision = denied(
        team_pod(container("p", limits={MEM: "4000"}, securityContext={"privileged": True})), config
    )
    assert decision.code == 403
    assert "container 'p' is privileged and skipped" in decision.message
    assert "Pending" in decision.message
    assert decision.warnings  # the warning still reaches the client


@pytest.mark.parametrize(
    ("limits", "resource", "value", "reason"),
    [
        ({MEM: "abc"}, MEM, "abc", "is not a quantity"),
        ({MEM: "-1"}, MEM, "-1", "must not be negative"),
        ({GPU: "1", MEM: "1.5"}, MEM, "1.5", "must be a whole number"),
        ({GPU: "1", MEM: "1Ti"}, MEM, "1Ti", "is above 2147483647"),
        ({GPU: "-1"}, GPU, "-1", "must not be negative"),
        ({GPU: "one"}, GPU, "one", "is not a quantity"),
        ({GPU: True}, GPU, "True", "is not a quantity"),
        ({GPU: "1", PCT: "101"}, PCT, "101", "must be between 0 and 100"),
        ({PCT: "150"}, PCT, "150", "must be between 0 and 100"),
        ({PCT: "-3"}, PCT, "-3", "must be between 0 and 100"),
        ({GPU: "1", PCT: "3000000000"}, PCT, "3000000000", "must be between 0 and 100"),
        ({GPU: "1", CORES: "101"}, CORES, "101", "must be between 0 and 100"),
        ({CORES: "-5"}, CORES, "-5", "must not be negative"),
        ({GPU: "1", PRIO: "-1"}, PRIO, "-1", "must not be negative"),
        ({PRIO: "high"}, PRIO, "high", "not a valid"),
        ({GPU: "0", MEM: "4000"}, GPU, "0", "is 0 while the container asks for nvidia.com/gpumem"),
        (
            {GPU: 0, CORES: "10", PCT: "5"},
            GPU,
            "0",
            "asks for nvidia.com/gpumem-percentage, nvidia.com/gpucores",
        ),
    ],
)
def test_bad_values_are_denied_naming_container_resource_and_value(
    limits: dict[str, Any], resource: str, value: str, reason: str
) -> None:
    decision = denied(team_pod(container("trainer", limits=limits)))
    assert (decision.code, decision.reason) == (422, "Invalid")
    assert decision.message.startswith(f"container 'trainer': {resource} '{value}'")
    assert reason in decision.message


def test_bad_value_in_an_init_container_says_so() -> None:
    decision = denied(team_pod(container(), init=(container("setup", limits={MEM: "x"}),)))
    assert decision.message.startswith("init container 'setup': nvidia.com/gpumem 'x'")


def test_memory_factor_overflow_is_denied() -> None:
    decision = denied(
        team_pod(container("c", limits={GPU: "1", MEM: "3000000"})), CONFIG.with_settings(memory_factor=1024)
    )
    assert "x memoryFactor 1024 overflows" in decision.message


@pytest.mark.parametrize(
    ("the_pod", "fragment"),
    [
        (
            team_pod({"name": "c", "resources": "lots"}),
            "container 'c': resources \"'lots'\" is not an object",
        ),
        (
            team_pod({"name": "c", "resources": {"limits": [1]}}),
            "container 'c': resources.limits '[1]' is not an object",
        ),
        (team_pod(container("c", limits={PRIO: "1"}, env="X=1")), "container 'c': env 'X=1' is not a list"),
        ({"spec": {"containers": "c"}}, "spec.containers 'c' is not a list"),
        (
            {"spec": {"containers": [container()], "initContainers": {}}},
            "spec.initContainers '{}' is not a list",
        ),
        ({"spec": {"containers": ["c"]}}, "spec.containers[0] 'c' is not an object"),
        (
            {"spec": {"containers": [container()], "schedulerName": 7}},
            "spec.schedulerName '7' is not a string",
        ),
        ({"spec": 5}, "spec '5' is not an object"),
        ({"metadata": "m", "spec": {"containers": [container()]}}, "metadata 'm' is not an object"),
        (team_pod(container(limits={GPU: "1"}), nodeName=["n"]), "spec.nodeName \"['n']\" is not a string"),
    ],
)
def test_malformed_pods_are_denied_with_the_field(the_pod: Pod, fragment: str) -> None:
    decision = denied(the_pod)
    assert decision.code == 422
    assert fragment in decision.message


def test_a_non_object_is_not_a_pod() -> None:
    decision = review_pod([], "CREATE", CONFIG, NO_QUOTA)  # type: ignore[arg-type]
    assert (decision.allowed, decision.code) == (False, 422)


# --- quota ---------------------------------------------------------------------------------------------


def test_quota_denial() -> None:
    view = View(QuotaLimits(memory=40000), QuotaUsage(38000, 0))
    decision = denied(team_pod(container(limits={MEM: "4000"})), view=view)
    assert (decision.code, decision.reason) == (403, "Forbidden")
    assert decision.message == (
        "namespace ai-team: GPU memory quota exceeded (used 38000 / limit 40000 MiB, this pod asks 4000)"
    )


def test_quota_counts_the_mutated_pod() -> None:
    """The bare GPU becomes gpucores=100 before the check, as in HAMi."""
    view = View(QuotaLimits(cores=150), QuotaUsage(0, 100))
    decision = denied(team_pod(container(limits={GPU: "1"})), view=view)
    assert decision.message == (
        "namespace ai-team: GPU cores quota exceeded (used 100 / limit 150 %, this pod asks 100)"
    )


def test_quota_follows_hamis_usage_rule() -> None:
    view = View(QuotaLimits(memory=10000), QuotaUsage(0, 0))
    # init peak 10000 = limit: fits; 2 GPUs x 3000 + 3000 = 9000 regular
    fits = team_pod(container("a", limits={GPU: "2", MEM: "3000"}), container("b", limits={MEM: "3000"}),
               init=(container("i", limits={MEM: "10000"}),))  # fmt: skip
    decision = review(fits, view=view)
    assert decision.allowed
    assert decision.quota_usage == QuotaUsage(10000, 0)
    over = team_pod(container("a", limits={GPU: "2", MEM: "3000"}), container("b", limits={MEM: "4001"}))
    assert "this pod asks 10001" in denied(over, view=view).message


def test_quota_uses_the_request_namespace_and_memory_factor() -> None:
    asked: list[str] = []

    class Recording(View):
        def limits(self, namespace: str) -> QuotaLimits:
            asked.append(namespace)
            return QuotaLimits(memory=2048)

    config = CONFIG.with_settings(memory_factor=1024)
    decision = review_pod(
        team_pod(container(limits={MEM: "3"})), "CREATE", config, Recording(), namespace="team-b"
    )
    assert not decision.allowed
    assert decision.message.startswith("namespace team-b: GPU memory quota exceeded")
    assert "this pod asks 3072" in decision.message
    assert asked == ["team-b"]


def test_quota_can_be_turned_off_and_is_not_consulted_for_other_pods() -> None:
    view = View(QuotaLimits(memory=0), QuotaUsage(100, 0))
    assert review(
        team_pod(container(limits={MEM: "4000"})), CONFIG.with_settings(enforce_quota=False), view
    ).allowed
    assert view.calls == 0
    assert review(team_pod(container(limits={PRIO: "1"})), CONFIG, view).allowed
    assert view.calls == 0
    # percentage-only memory counts 0 MiB at admission (as HAMi), so a memory quota does not stop it
    assert review(team_pod(container(limits={PCT: "50"})), CONFIG, view).allowed


def test_allowed_gpu_pods_report_their_usage() -> None:
    assert review(team_pod(container(limits={GPU: "2", MEM: "100", CORES: "10"}))).quota_usage == QuotaUsage(
        200, 20
    )
    assert review(team_pod(container(limits={"cpu": "1"}))).quota_usage is None


# --- the minimal-patch differ ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "ops"),
    [
        ({"a": 1}, {"a": 1}, []),
        ({"a": 1}, {"a": 2}, [{"op": "replace", "path": "/a", "value": 2}]),
        ({"a": 1}, {"a": True}, [{"op": "replace", "path": "/a", "value": True}]),
        ({}, {"a/b": {"c": 1}}, [{"op": "add", "path": "/a~1b", "value": {"c": 1}}]),
        ({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}, [{"op": "add", "path": "/a/y", "value": 2}]),
        ({"a": 1, "b": 2}, {"a": 1}, [{"op": "remove", "path": "/b"}]),
        ([1], [1, 2, 3], [{"op": "add", "path": "/-", "value": 2}, {"op": "add", "path": "/-", "value": 3}]),
        ([1, 2], [1], [{"op": "replace", "path": "", "value": [1]}]),
        ({"a": None}, {"a": {"b": 1}}, [{"op": "replace", "path": "/a", "value": {"b": 1}}]),
        ({"a": [1, {"k": "v"}]}, {"a": [1, {"k": "w"}]}, [{"op": "replace", "path": "/a/1/k", "value": "w"}]),
    ],
)
def test_json_patch_diff(before: Any, after: Any, ops: list[dict[str, Any]]) -> None:
    assert json_patch_diff(before, after) == ops
    assert json_patch(before, ops) == after


# --- the AdmissionReview envelope ------------------------------------------------------------------------


def team_review(obj: Any, version: str = "v1", **request: Any) -> bytes:
    """The AdmissionReview the API server sends for `obj` in namespace ai-team (`request` overrides)."""
    return as_body(admission_review(obj, version=version, **{"namespace": "ai-team", **request}))


def handle(body: bytes, config: ControlConfig = CONFIG, view: Any = NO_QUOTA) -> webhook.AdmissionResult:
    result = handle_admission_review(body, config, view)
    json.dumps(result.body)  # always serialisable
    return result


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_envelope_answers_in_the_request_version_with_its_uid(version: str) -> None:
    the_pod = team_pod(container(limits={GPU: "1"}))
    result = handle(team_review(the_pod, version))
    assert result.status == 200
    assert result.body["apiVersion"] == f"admission.k8s.io/{version}"
    assert result.body["kind"] == "AdmissionReview"
    response = result.body["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops == list(review(the_pod).patch)
    patched = json_patch(the_pod, ops)
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1", CORES: "100"}
    assert set(response) == {"uid", "allowed", "patchType", "patch"}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_envelope_denial(version: str) -> None:
    view = View(QuotaLimits(memory=40000), QuotaUsage(38000, 0))
    result = handle(team_review(team_pod(container(limits={GPU: "1", MEM: "4000"})), version), view=view)
    assert result.status == 200
    response = result.body["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"] == {
        "metadata": {},
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "message": (
            "namespace ai-team: GPU memory quota exceeded (used 38000 / limit 40000 MiB, this pod asks 4000)"
        ),
    }


def test_envelope_allowed_without_patch_has_no_patch_fields() -> None:
    result = handle(team_review(team_pod(container())))
    assert result.body["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_envelope_warnings() -> None:
    config = CONFIG.with_settings(privileged_policy=PrivilegedPolicy.SKIP)
    result = handle(
        team_review(team_pod(container("p", limits={GPU: "1"}, securityContext={"privileged": True}))), config
    )
    assert result.body["response"]["warnings"] == [
        "container 'p' is privileged: its GPU request is not shared or limited by HAMi"
    ]


@pytest.mark.parametrize(
    "request_fields",
    [
        {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
        {"kind": {"group": "example.com", "version": "v1", "kind": "Pod"}},
        {"subResource": "status"},
        {"operation": "UPDATE"},
        {"operation": "DELETE", "object": None},
        {"operation": "CONNECT", "object": None},
    ],
)
def test_envelope_allows_what_it_does_not_mutate(request_fields: dict[str, Any]) -> None:
    obj = request_fields.pop("object", team_pod(container(limits={GPU: "1"})))
    result = handle(team_review(obj, **request_fields))
    assert result.status == 200
    assert result.body["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def bad_review(**changes: Any) -> bytes:
    review_doc = json.loads(team_review(team_pod(container())))
    for key, value in changes.items():
        if key.startswith("request_"):
            review_doc["request"][key.removeprefix("request_")] = value
        else:
            review_doc[key] = value
    return json.dumps(review_doc).encode()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "request body is not valid JSON"),
        (b"{", "request body is not valid JSON"),
        (b"\xff\xfe", "request body is not valid JSON"),
        (b"[1, 2]", "must be an AdmissionReview object"),
        (b"null", "must be an AdmissionReview object"),
        (bad_review(apiVersion="admission.k8s.io/v2"), "apiVersion 'admission.k8s.io/v2' is not one of"),
        (bad_review(apiVersion=None), "apiVersion 'None' is not one of"),
        (bad_review(kind="Pod"), "kind 'Pod' is not AdmissionReview"),
        (bad_review(request=None), "AdmissionReview has no request"),
        (bad_review(request="x"), "AdmissionReview has no request"),
        (bad_review(request_uid=""), "request.uid is missing"),
        (bad_review(request_uid=5), "request.uid is missing"),
        (bad_review(request_operation=None), "request.operation 'None' is not a string"),
        (bad_review(request_kind="Pod"), "request.kind 'Pod' is not a group/version/kind"),
        (bad_review(request_namespace=3), "request.namespace '3' is not a string"),
        (bad_review(request_object=None), "request.object must be the pod being created"),
        (bad_review(request_object=[1]), "request.object must be the pod being created"),
    ],
)
def test_envelope_rejects_bad_reviews_with_400(body: bytes, fragment: str) -> None:
    result = handle(body)
    assert result.status == 400
    assert result.body["kind"] == "Status"
    assert result.body["code"] == 400
    assert result.body["reason"] == "BadRequest"
    assert fragment in result.body["message"]
    assert result.summary.http_status == 400
    assert not result.summary.allowed
    assert "Traceback" not in result.body["message"]


def test_envelope_rejects_large_bodies_with_413() -> None:
    config = CONFIG.with_settings(max_request_body=2048)
    body = team_review(team_pod(container(env=[{"name": "X", "value": "y" * 4096}])))
    result = handle(body, config)
    assert result.status == 413
    assert result.body["reason"] == "RequestEntityTooLarge"
    assert f"request body of {len(body)} bytes is over the limit of 2048 bytes" == result.body["message"]
    assert handle(team_review(team_pod(container())), config).status == 200


def test_an_exception_in_the_rules_denies_a_gpu_pod_without_a_traceback() -> None:
    result = handle(team_review(team_pod(container(limits={GPU: "1"}))), view=BrokenView())
    assert result.status == 200
    response = result.body["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert response["status"]["reason"] == "InternalError"
    assert "RuntimeError" in response["status"]["message"]
    assert "cache exploded" not in response["status"]["message"]
    assert isinstance(result.summary.exception, RuntimeError)
    assert "exception" in result.summary.fields()


def test_an_exception_in_the_rules_allows_a_pod_without_gpu_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(*args: Any, **kwargs: Any) -> Decision:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(webhook, "review_pod", boom)
    result = handle(team_review(team_pod(container(limits={"cpu": "1"}))))
    assert result.body["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    assert isinstance(result.summary.exception, ZeroDivisionError)
    gpu = handle(team_review(team_pod(container(limits={"cpu": "1", MEM: "1"}))))
    assert gpu.body["response"]["allowed"] is False
    # a pod too broken to tell is treated as a GPU pod (fail closed)
    broken = handle(team_review({"spec": {"containers": [5]}}))
    assert broken.body["response"]["allowed"] is False


def test_an_exception_in_the_envelope_is_a_500_status(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(body: bytes) -> Any:
        raise KeyError("oops")

    monkeypatch.setattr(webhook, "_parse_review", boom)
    result = handle(team_review(team_pod(container())))
    assert result.status == 500
    assert result.body["reason"] == "InternalError"
    assert result.body["message"] == "internal error in hami-control (KeyError)"
    assert isinstance(result.summary.exception, KeyError)


def test_decision_summary_for_the_log() -> None:
    the_pod = team_pod(container(limits={MEM: "4000"}))
    allowed = handle(team_review(the_pod, dryRun=True)).summary
    assert (allowed.namespace, allowed.name, allowed.allowed, allowed.dry_run) == ("ai-team", "p", True, True)
    assert allowed.patch_ops == 2
    assert allowed.patch_bytes > 0
    assert allowed.quota_usage == QuotaUsage(4000, 0)
    assert str(allowed).startswith(
        f"admission ai-team/p CREATE uid=705ab4f5-6393-11e8-b7cc-42010a800002: allowed, "
        f"patch 2 ops/{allowed.patch_bytes} bytes (container 'main': nvidia.com/gpu=1 added"
    )
    fields = allowed.fields()
    assert fields["pod"] == "ai-team/p"
    assert fields["allowed"] is True
    assert fields["dry_run"] is True
    assert fields["patch_ops"] == 2

    generated = copy.deepcopy(the_pod)
    generated["metadata"] = {"generateName": "job-"}
    summary = handle(team_review(generated, namespace="")).summary
    assert (summary.name, summary.generate_name, summary.pod) == ("", "job-", "/job-*")

    view = View(QuotaLimits(memory=1), QuotaUsage())
    denied_summary = handle(team_review(the_pod), view=view).summary
    assert not denied_summary.allowed
    assert denied_summary.code == 403
    assert denied_summary.quota_usage is None
    assert "denied 403: namespace ai-team: GPU memory quota exceeded" in str(denied_summary)
    assert denied_summary.fields()["code"] == 403

    bad = handle(b"nope").summary
    assert str(bad).startswith("admission -: HTTP 400: request body is not valid JSON")
    assert bad.fields()["http_status"] == 400
    assert DecisionSummary().pod == "-"


# --- hypothesis: any pod gets a valid answer -------------------------------------------------------------

_QUANTITY_TEXT = st.one_of(
    st.sampled_from(["0", "1", "2", "100", "101", "4000", "-1", "1.5", "100m", "2Gi", "1e3", "", "x", "0.5"]),
    st.integers(-5, 5000).map(str),
    st.text(max_size=6),
)
_VALUE = st.one_of(
    _QUANTITY_TEXT,
    st.integers(-3, 300),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
    st.just([]),
    st.just({}),
)
_RESOURCE_KEY = st.sampled_from([GPU, MEM, PCT, CORES, PRIO, "cpu", "memory", "example.com/foo"])
_RESOURCE_LIST = st.one_of(st.dictionaries(_RESOURCE_KEY, _VALUE, max_size=5), st.none(), st.just("bad"))
_RESOURCES = st.one_of(
    st.fixed_dictionaries({}, optional={"limits": _RESOURCE_LIST, "requests": _RESOURCE_LIST}),
    st.none(),
    st.just([1]),
)
_ENV = st.one_of(
    st.none(),
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["CUDA_TASK_PRIORITY", "NVIDIA_VISIBLE_DEVICES", "A"])},
                optional={"value": st.text(max_size=3)},
            ),
            st.integers(),
        ),
        max_size=3,
    ),
    st.just("FOO=bar"),
)
_CONTAINER = st.one_of(
    st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=5), st.integers())},
        optional={
            "resources": _RESOURCES,
            "env": _ENV,
            "securityContext": st.one_of(
                st.fixed_dictionaries(
                    {}, optional={"privileged": st.one_of(st.booleans(), st.none(), st.text())}
                ),
                st.none(),
                st.integers(),
            ),
        },
    ),
    st.integers(),
    st.none(),
)
_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.one_of(st.lists(_CONTAINER, max_size=3), st.none(), st.just("c")),
        "initContainers": st.one_of(st.lists(_CONTAINER, max_size=2), st.none(), st.just({})),
        "schedulerName": st.one_of(
            st.sampled_from(["", "default-scheduler", "hami-scheduler", "other"]), st.integers()
        ),
        "nodeName": st.one_of(st.sampled_from(["", "node-1"]), st.none(), st.integers()),
        "runtimeClassName": st.one_of(st.sampled_from(["", "kata"]), st.none(), st.integers()),
    },
)
_POD: st.SearchStrategy[Any] = st.fixed_dictionaries(
    {"spec": st.one_of(_SPEC, st.none(), st.integers())},
    optional={
        "metadata": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.one_of(st.text(max_size=5), st.integers()),
                    "namespace": st.one_of(st.text(max_size=5), st.integers()),
                    "generateName": st.one_of(st.text(max_size=5), st.integers()),
                    "annotations": st.one_of(
                        st.dictionaries(
                            st.sampled_from(["hami.io/core-policy", "x"]),
                            st.one_of(
                                st.sampled_from(["default", "force", "disable", "none"]), st.integers()
                            ),
                        ),
                        st.none(),
                        st.just([]),
                    ),
                },
            ),
            st.none(),
            st.just("m"),
        )
    },
)
_PLAUSIBLE_VALUE = st.one_of(
    st.integers(0, 8).map(str),
    st.sampled_from(["100", "50", "3000", "0", "16000", "101", "-1"]),
    st.integers(0, 100),
)
_PLAUSIBLE_CONTAINER = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"])},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.dictionaries(_RESOURCE_KEY, _PLAUSIBLE_VALUE, max_size=4),
                "requests": st.dictionaries(_RESOURCE_KEY, _PLAUSIBLE_VALUE, max_size=2),
            },
        ),
        "env": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["CUDA_TASK_PRIORITY", "GPU_CORE_UTILIZATION_POLICY", "X"])},
                optional={"value": st.sampled_from(["0", "1", "force", "none"])},
            ),
            max_size=2,
        ),
        "securityContext": st.fixed_dictionaries({"privileged": st.booleans()}),
    },
)
_PLAUSIBLE_POD = st.builds(
    lambda containers, init, scheduler, policy: team_pod(
        *containers,
        init=tuple(init),
        annotations=None if policy is None else {"hami.io/core-policy": policy},
        **({} if scheduler is None else {"schedulerName": scheduler}),
    ),
    st.lists(_PLAUSIBLE_CONTAINER, min_size=1, max_size=3),
    st.lists(_PLAUSIBLE_CONTAINER, max_size=2),
    st.sampled_from([None, "", "default-scheduler", "hami-scheduler", "other"]),
    st.sampled_from([None, "default", "force", "disable"]),
)
_CONFIG = st.builds(
    lambda env, priv, quota, runtime: CONFIG.with_settings(
        overwrite_env=env, privileged_policy=priv, enforce_quota=quota, runtime_class_name=runtime
    ),
    st.booleans(),
    st.sampled_from(list(PrivilegedPolicy)),
    st.booleans(),
    st.sampled_from([None, "nvidia"]),
)
_VIEW = st.builds(
    lambda m, c, um, uc: View(QuotaLimits(m, c), QuotaUsage(um, uc)),
    st.one_of(st.none(), st.integers(0, 20000)),
    st.one_of(st.none(), st.integers(0, 400)),
    st.integers(0, 20000),
    st.integers(0, 400),
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(_PLAUSIBLE_POD, _POD), st.sampled_from(["v1", "v1beta1"]), _CONFIG, _VIEW)
def test_any_pod_gets_a_valid_answer(the_pod: Pod, version: str, config: ControlConfig, view: View) -> None:
    before = copy.deepcopy(the_pod)
    result = handle(team_review(the_pod, version), config, view)
    assert result.summary.exception is None, repr(result.summary.exception)
    if result.status == 400:  # only a CREATE without an object dict; never for these pods
        pytest.fail(result.body["message"])
    assert result.status == 200
    response = result.body["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert isinstance(response["allowed"], bool)
    if response["allowed"]:
        assert "status" not in response
        if "patch" in response:
            assert response["patchType"] == "JSONPatch"
            ops = json.loads(base64.b64decode(response["patch"]))
            assert ops
            patched = json_patch(the_pod, ops)
            # the usage the webhook checked is the stored pod's usage, as the caches will count it
            if result.summary.quota_usage is not None:
                assert result.summary.quota_usage == pod_quota_usage(patched, config)
            # idempotent: the webhook has nothing more to say about its own output
            again = review_pod(patched, "CREATE", config, View())
            assert again.allowed
            assert again.patch == ()
    else:
        assert "patch" not in response
        assert response["status"]["code"] in (403, 422)
        assert response["status"]["message"]
        assert "Traceback" not in response["status"]["message"]
    assert the_pod == before


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.integers() | st.text(max_size=5),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
            max_leaves=12,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_body_gets_an_http_answer(body: bytes) -> None:
    result = handle(body)
    assert result.status in (200, 400)
    assert result.summary.exception is None
    json.dumps(result.body)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "uid": st.one_of(st.text(max_size=5), st.integers(), st.none()),
            "operation": st.one_of(st.sampled_from(["CREATE", "UPDATE"]), st.integers()),
            "kind": st.one_of(
                st.fixed_dictionaries(
                    {"kind": st.sampled_from(["Pod", "Node"]), "group": st.sampled_from(["", "x"])}
                ),
                st.none(),
            ),
        },
        optional={
            "object": _POD,
            "namespace": st.one_of(st.text(max_size=3), st.integers()),
            "subResource": st.one_of(st.text(max_size=3), st.none()),
        },
    )
)
def test_any_request_gets_an_http_answer(request_doc: dict[str, Any]) -> None:
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request_doc}
    ).encode()
    result = handle(body)
    assert result.status in (200, 400)
    assert result.summary.exception is None
