"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and Kubernetes strategic merge patch."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_sim.apiserver.patch import (
    PatchError,
    json_equal,
    json_merge_patch,
    json_patch,
    strategic_merge_patch,
)

# ------------------------------------------------------------------------------------------ strategies

scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
keys = st.text(alphabet="ab/~c-0", min_size=1, max_size=4)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)


def merge_diff(source: Any, target: Any) -> Any:
    """The RFC 7386 patch that turns `source` into `target` (neither holds null)."""
    if not (isinstance(source, dict) and isinstance(target, dict)):
        return target
    patch: dict[str, Any] = {k: None for k in source if k not in target}
    for key, value in target.items():
        if key not in source:
            patch[key] = value
        elif not json_equal(source[key], value):
            patch[key] = merge_diff(source[key], value)
    return patch


# ------------------------------------------------------------------------------------------- RFC 7386

RFC7386_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "expected"), RFC7386_EXAMPLES)
def test_json_merge_patch_rfc_examples(target: Any, patch: Any, expected: Any) -> None:
    assert json_merge_patch(target, patch) == expected


@given(json_objects, json_objects)
def test_merge_patch_of_a_diff_reproduces_the_target(source: dict[str, Any], target: dict[str, Any]) -> None:
    before = copy.deepcopy(source)
    assert json_equal(json_merge_patch(source, merge_diff(source, target)), target)
    assert source == before


@given(json_values, json_values)
def test_merge_patch_replaces_non_objects(source: Any, target: Any) -> None:
    if not isinstance(target, dict):
        assert json_equal(json_merge_patch(source, target), target)


def test_merge_patch_result_shares_nothing_with_inputs() -> None:
    target = {"a": {"b": [1]}, "keep": {"x": 1}}
    patch = {"n": {"m": [2]}}
    result = json_merge_patch(target, patch)
    result["a"]["b"].append(9)
    result["keep"]["x"] = 2
    result["n"]["m"].append(9)
    assert target == {"a": {"b": [1]}, "keep": {"x": 1}}
    assert patch == {"n": {"m": [2]}}


# ------------------------------------------------------------------------------------------- RFC 6902

RFC6902_EXAMPLES = [
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"baz": "qux", "foo": "bar"}),
    (
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
    ),
    ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
    (
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
    ),
    (
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
    ),
    (
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
    ),
    (
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
        {"baz": "qux", "foo": ["a", 2, "c"]},
    ),
    (
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
    ),
    (
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
    ),
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
    ({}, [{"op": "add", "path": "/a~1b~0c", "value": 1}], {"a/b~c": 1}),
    ({"a": 1}, [{"op": "replace", "path": "", "value": [1]}], [1]),
    ({"a": 1}, [{"op": "add", "path": "", "value": {"b": 2}}], {"b": 2}),
    ({"a": {"b": 1}}, [{"op": "copy", "from": "/a", "path": "/c"}], {"a": {"b": 1}, "c": {"b": 1}}),
    ({"a": [1, 2]}, [{"op": "move", "from": "/a/0", "path": "/a/-"}], {"a": [2, 1]}),
    ({"a": 1}, [{"op": "move", "from": "/a", "path": "/a"}], {"a": 1}),
    ({"a": 1.0}, [{"op": "test", "path": "/a", "value": 1}], {"a": 1.0}),
    ({"a": None}, [{"op": "test", "path": "/a", "value": None}], {"a": None}),
    ({"a": [1]}, [{"op": "add", "path": "/a/1", "value": 2}], {"a": [1, 2]}),
    ({"a": []}, [], {"a": []}),
]


@pytest.mark.parametrize(("target", "ops", "expected"), RFC6902_EXAMPLES)
def test_json_patch_rfc_examples(target: Any, ops: list[Any], expected: Any) -> None:
    before = copy.deepcopy(target)
    assert json_patch(target, ops) == expected
    assert target == before


JSON_PATCH_ERRORS = [
    ({"a": 1}, {"op": "add"}, "json patch must be a JSON array"),
    ({"a": 1}, ["add"], "json patch op 0: must be an object"),
    ({"a": 1}, [{"path": "/a"}], "json patch op 0: 'op' must be one of"),
    ({"a": 1}, [{"op": "frob", "path": "/a"}], "json patch op 0: 'op' must be one of"),
    ({"a": 1}, [{"op": "add", "value": 1}], "json patch op 0 (add): missing 'path'"),
    ({"a": 1}, [{"op": "add", "path": "/b"}], "json patch op 0 (add /b): missing 'value'"),
    ({"a": 1}, [{"op": "add", "path": 5, "value": 1}], "'path' must be a string"),
    ({"a": 1}, [{"op": "add", "path": "b", "value": 1}], "must be empty or start with '/'"),
    ({"a": 1}, [{"op": "add", "path": "/~2", "value": 1}], "invalid escape"),
    (
        {"metadata": {"labels": {}}},
        [
            {"op": "test", "path": "/metadata", "value": {"labels": {}}},
            {"op": "replace", "path": "/metadata/labels/x", "value": "y"},
        ],
        "json patch op 1 (replace /metadata/labels/x): path not found",
    ),
    ({"a": 1}, [{"op": "remove", "path": "/b"}], "json patch op 0 (remove /b): path not found"),
    ({"a": 1}, [{"op": "remove", "path": ""}], "cannot remove the whole document"),
    ({"a": 1}, [{"op": "add", "path": "/x/y", "value": 1}], "path not found"),
    ({"a": 1}, [{"op": "add", "path": "/a/y", "value": 1}], "path not found"),
    ({"a": [1]}, [{"op": "add", "path": "/a/2", "value": 1}], "out of range"),
    ({"a": [1]}, [{"op": "replace", "path": "/a/1", "value": 1}], "out of range"),
    ({"a": [1]}, [{"op": "replace", "path": "/a/-", "value": 1}], "'-'"),
    ({"a": [1, 2]}, [{"op": "remove", "path": "/a/01"}], "not a valid array index"),
    ({"a": [1, 2]}, [{"op": "remove", "path": "/a/-1"}], "not a valid array index"),
    ({"a": [1]}, [{"op": "test", "path": "/a/0", "value": True}], "json patch op 0 (test /a/0): test failed"),
    ({"a": "x"}, [{"op": "test", "path": "/a", "value": "y"}], "test failed: value is 'x', expected 'y'"),
    ({"a": 1}, [{"op": "move", "path": "/b"}], "missing 'from'"),
    ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}], "into one of its own children"),
    ({"a": 1}, [{"op": "copy", "from": "/nope", "path": "/b"}], "path not found"),
]


@pytest.mark.parametrize(("target", "ops", "message"), JSON_PATCH_ERRORS)
def test_json_patch_errors(target: Any, ops: Any, message: str) -> None:
    before = copy.deepcopy(target)
    with pytest.raises(PatchError) as caught:
        json_patch(target, ops)
    assert message in str(caught.value)
    assert target == before


def test_json_patch_values_are_copied() -> None:
    value = {"x": [1]}
    ops = [{"op": "add", "path": "/a", "value": value}, {"op": "add", "path": "/a/x/-", "value": 2}]
    assert json_patch({}, ops) == {"a": {"x": [1, 2]}}
    assert value == {"x": [1]}


@given(json_objects, keys, json_values)
def test_json_patch_add_then_remove_is_identity(doc: dict[str, Any], key: str, value: Any) -> None:
    pointer = "/" + key.replace("~", "~0").replace("/", "~1")
    added = json_patch(doc, [{"op": "add", "path": pointer, "value": value}])
    assert json_equal(added[key], value)
    if key not in doc:
        assert json_equal(json_patch(added, [{"op": "remove", "path": pointer}]), doc)


def _pointers(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    found = [(prefix, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _pointers(v, f"{prefix}/{k.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _pointers(v, f"{prefix}/{i}")
    return found


@given(json_values)
def test_json_patch_test_and_copy_every_pointer(doc: Any) -> None:
    for pointer, value in _pointers(doc):
        assert json_equal(json_patch(doc, [{"op": "test", "path": pointer, "value": value}]), doc)
        copied = json_patch({"doc": doc}, [{"op": "copy", "from": "/doc" + pointer, "path": "/copy"}])
        assert json_equal(copied["copy"], value)


# ------------------------------------------------------------------------------ strategic merge patch


def merge_subject() -> dict[str, Any]:
    """The document the strategic-merge tests patch: a pod with a list of each kind such a patch
    treats differently (merged by a key, primitive, replaced). Written out whole on purpose: the
    tests read its exact shape (`tests.builders.pod` builds pods to send)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"app": "x", "tier": "gpu"},
            "annotations": {"a": "1"},
            "finalizers": ["one", "two"],
            "ownerReferences": [{"uid": "u1", "kind": "ReplicaSet", "name": "rs"}],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "args": ["a", "b"],
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "volumeMounts": [{"mountPath": "/data", "name": "data"}],
                },
                {"name": "sidecar", "image": "busybox"},
            ],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
            ],
            "containerStatuses": [{"name": "main", "ready": False}, {"name": "sidecar", "ready": False}],
        },
    }


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = obj["spec"]["containers"]
    return result


def test_smp_labels_and_annotations_merge_and_null_deletes() -> None:
    out = strategic_merge_patch(
        merge_subject(), {"metadata": {"labels": {"tier": None, "new": "y"}, "annotations": None}}
    )
    assert out["metadata"]["labels"] == {"app": "x", "new": "y"}
    assert "annotations" not in out["metadata"]


def test_smp_containers_merge_by_name_keeping_order() -> None:
    patch = {
        "spec": {"containers": [{"name": "sidecar", "image": "busybox:2"}, {"name": "extra", "image": "e"}]}
    }
    out = strategic_merge_patch(merge_subject(), patch)
    assert [c["name"] for c in containers(out)] == ["main", "sidecar", "extra"]
    assert containers(out)[1] == {"name": "sidecar", "image": "busybox:2"}
    assert containers(out)[0] == containers(merge_subject())[0]


def test_smp_env_merges_by_name_and_other_lists_replace() -> None:
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "args": ["z"],
                    "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                }
            ]
        }
    }
    main = containers(strategic_merge_patch(merge_subject(), patch))[0]
    assert main["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "3"},
        {"name": "C", "value": "4"},
    ]
    assert main["args"] == ["z"]


def test_smp_ports_volume_mounts_volumes_owner_references() -> None:
    patch = {
        "metadata": {
            "ownerReferences": [{"uid": "u1", "name": "rs2"}, {"uid": "u2", "kind": "Job", "name": "j"}]
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}],
                    "volumeMounts": [{"mountPath": "/data", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "cache", "emptyDir": {}}],
        },
    }
    out = strategic_merge_patch(merge_subject(), patch)
    main = containers(out)[0]
    assert main["ports"] == [{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}]
    assert main["volumeMounts"] == [{"mountPath": "/data", "name": "data", "readOnly": True}]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["data", "cache"]
    assert out["metadata"]["ownerReferences"] == [
        {"uid": "u1", "kind": "ReplicaSet", "name": "rs2"},
        {"uid": "u2", "kind": "Job", "name": "j"},
    ]


def test_smp_tolerations_and_container_statuses_are_replaced() -> None:
    patch = {
        "spec": {"tolerations": [{"key": "other", "operator": "Exists"}]},
        "status": {"containerStatuses": [{"name": "main", "ready": True}]},
    }
    out = strategic_merge_patch(merge_subject(), patch)
    assert out["spec"]["tolerations"] == [{"key": "other", "operator": "Exists"}]
    assert out["status"]["containerStatuses"] == [{"name": "main", "ready": True}]


def test_smp_conditions_merge_by_type() -> None:
    patch = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}],
        }
    }
    out = strategic_merge_patch(merge_subject(), patch)
    assert out["status"]["phase"] == "Running"
    assert out["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True"},
        {"type": "Initialized", "status": "True"},
    ]


def test_smp_node_status_conditions_and_addresses() -> None:
    node = {
        "metadata": {"name": "n1"},
        "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": "n1"},
            ],
            "conditions": [{"type": "Ready", "status": "False"}],
            "capacity": {"cpu": "4"},
        },
    }
    patch = {
        "spec": {"podCIDRs": ["10.0.1.0/24"], "taints": []},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "capacity": {"nvidia.com/gpu": "8"},
        },
    }
    out = strategic_merge_patch(node, patch)
    assert out["spec"] == {"podCIDRs": ["10.0.0.0/24", "10.0.1.0/24"], "taints": []}
    assert out["status"]["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.2"},
        {"type": "Hostname", "address": "n1"},
    ]
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert out["status"]["capacity"] == {"cpu": "4", "nvidia.com/gpu": "8"}


def test_smp_finalizers_are_a_set_with_delete_list() -> None:
    out = strategic_merge_patch(merge_subject(), {"metadata": {"finalizers": ["three", "one"]}})
    assert out["metadata"]["finalizers"] == ["one", "two", "three"]
    out = strategic_merge_patch(
        merge_subject(), {"metadata": {"$deleteFromPrimitiveList/finalizers": ["one", "zzz"]}}
    )
    assert out["metadata"]["finalizers"] == ["two"]


def test_smp_patch_delete_on_list_items() -> None:
    patch = {
        "spec": {
            "containers": [
                {"name": "main", "env": [{"name": "A", "$patch": "delete"}]},
                {"name": "sidecar", "$patch": "delete"},
            ]
        }
    }
    out = strategic_merge_patch(merge_subject(), patch)
    assert [c["name"] for c in containers(out)] == ["main"]
    assert containers(out)[0]["env"] == [{"name": "B", "value": "2"}]


def test_smp_patch_replace_on_a_list() -> None:
    patch = {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "i"}]}}
    assert containers(strategic_merge_patch(merge_subject(), patch)) == [{"name": "only", "image": "i"}]


def test_smp_patch_replace_and_delete_on_maps() -> None:
    out = strategic_merge_patch(
        merge_subject(), {"metadata": {"labels": {"$patch": "replace", "only": "this"}}}
    )
    assert out["metadata"]["labels"] == {"only": "this"}
    out = strategic_merge_patch(merge_subject(), {"metadata": {"annotations": {"$patch": "delete"}}})
    assert out["metadata"]["annotations"] == {}
    out = strategic_merge_patch(merge_subject(), {"metadata": {"labels": {"$patch": "merge", "b": "2"}}})
    assert out["metadata"]["labels"] == {"app": "x", "tier": "gpu", "b": "2"}
    assert strategic_merge_patch(merge_subject(), {"$patch": "replace", "kind": "Pod"}) == {"kind": "Pod"}


def test_smp_directives_in_new_fields_are_applied_not_stored() -> None:
    target = {"metadata": {"name": "p"}}
    patch = {
        "spec": {
            "containers": [
                {"name": "a", "$patch": "delete"},
                {"name": "b", "env": [{"name": "X", "value": "1"}]},
            ]
        }
    }
    assert strategic_merge_patch(target, patch)["spec"] == {
        "containers": [{"name": "b", "env": [{"name": "X", "value": "1"}]}]
    }


def test_smp_set_element_order() -> None:
    patch = {
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    out = strategic_merge_patch(merge_subject(), patch)
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "PodScheduled", "status": "True"},
    ]
    # the order directive alone reorders; server-only items keep their place
    patch = {"spec": {"$setElementOrder/containers": [{"name": "sidecar"}, {"name": "main"}]}}
    assert [c["name"] for c in containers(strategic_merge_patch(merge_subject(), patch))] == [
        "sidecar",
        "main",
    ]
    order: dict[str, Any] = {"metadata": {"$setElementOrder/finalizers": ["two", "one"]}}
    assert strategic_merge_patch(merge_subject(), order)["metadata"]["finalizers"] == ["two", "one"]


def test_smp_retain_keys_clears_unlisted_fields() -> None:
    patch = {
        "spec": {
            "volumes": [{"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]
        }
    }
    assert strategic_merge_patch(merge_subject(), patch)["spec"]["volumes"] == [
        {"name": "data", "hostPath": {"path": "/x"}}
    ]


def test_smp_webhooks_merge_by_name_and_pod_templates() -> None:
    config = {"webhooks": [{"name": "a", "timeoutSeconds": 10}, {"name": "b", "timeoutSeconds": 10}]}
    out = strategic_merge_patch(config, {"webhooks": [{"name": "b", "timeoutSeconds": 5}]})
    assert out["webhooks"] == [{"name": "a", "timeoutSeconds": 10}, {"name": "b", "timeoutSeconds": 5}]
    deployment = {
        "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}]}}}
    }
    out = strategic_merge_patch(
        deployment, {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "2"}]}}}}
    )
    assert out["spec"]["template"]["spec"]["containers"] == [{"name": "a", "image": "2"}, {"name": "b"}]


def test_smp_type_changes_replace() -> None:
    assert strategic_merge_patch({"a": {"b": 1}}, {"a": [1]}) == {"a": [1]}
    assert strategic_merge_patch({"a": 1}, {"a": {"b": None, "c": 2}}) == {"a": {"c": 2}}
    assert strategic_merge_patch(None, {"a": 1}) == {"a": 1}


SMP_ERRORS = [
    ({"a": 1}, [{"op": "add"}], "strategic merge patch must be a JSON object"),
    ([1], {"a": 1}, "needs an object to patch"),
    (
        merge_subject(),
        {"metadata": {"$patch": "explode"}},
        "strategic merge patch at metadata: unknown $patch directive 'explode'",
    ),
    (
        merge_subject(),
        {"spec": {"containers": [{"image": "x"}]}},
        "spec.containers: list item does not contain the merge key 'name'",
    ),
    (
        merge_subject(),
        {"spec": {"containers": [{"$patch": "delete"}]}},
        "$patch: delete item has no merge key 'name'",
    ),
    (
        merge_subject(),
        {"spec": {"containers": [{"name": "main", "$patch": "nope"}]}},
        "unknown $patch directive 'nope'",
    ),
    (merge_subject(), {"spec": {"containers": ["main"]}}, "spec.containers: list items must be objects"),
    (
        merge_subject(),
        {"spec": {"containers": [{"name": "main", "env": [{"value": "1"}]}]}},
        "spec.containers[name=main].env",
    ),
    (
        merge_subject(),
        {"metadata": {"finalizers": [{"a": 1}]}},
        "metadata.finalizers: expected a list of scalars",
    ),
    (merge_subject(), {"metadata": {"$retainKeys": "name"}}, "$retainKeys must be a list"),
    (
        merge_subject(),
        {"metadata": {"$retainKeys": ["name"], "labels": {}}},
        "field 'labels' is set but missing from $retainKeys",
    ),
    (
        merge_subject(),
        {"metadata": {"$deleteFromPrimitiveList/finalizers": "one"}},
        "must name a field and be a list of scalars",
    ),
    (merge_subject(), {"metadata": {"$deleteFromPrimitiveList/": ["one"]}}, "must name a field"),
    (
        merge_subject(),
        {"status": {"$setElementOrder/conditions": {"type": "Ready"}}},
        "must name a field and be a list",
    ),
    (
        merge_subject(),
        {"status": {"$setElementOrder/conditions": ["Ready"]}},
        "must be an object with 'type'",
    ),
    (merge_subject(), {"metadata": {"$frobnicate": 1}}, "unknown directive '$frobnicate'"),
]


@pytest.mark.parametrize(("target", "patch", "message"), SMP_ERRORS)
def test_smp_errors(target: Any, patch: Any, message: str) -> None:
    before = copy.deepcopy(target)
    with pytest.raises(PatchError) as caught:
        strategic_merge_patch(target, patch)
    assert message in str(caught.value)
    assert target == before


def test_smp_does_not_mutate_or_share_inputs() -> None:
    target, patch = (
        merge_subject(),
        {
            "metadata": {"labels": {"n": "1"}},
            "spec": {"containers": [{"name": "new", "env": [{"name": "E"}]}]},
        },
    )
    target_before, patch_before = copy.deepcopy(target), copy.deepcopy(patch)
    out = strategic_merge_patch(target, patch)
    out["metadata"]["labels"]["x"] = "y"
    out["metadata"]["finalizers"].append("z")
    containers(out)[0]["env"].append({"name": "Z"})
    containers(out)[2]["env"].append({"name": "Z"})
    assert target == target_before
    assert patch == patch_before


plain_keys = st.text(alphabet="xyz", min_size=1, max_size=3)  # never a schema field nor a directive
plain_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(plain_keys, c, max_size=3), max_leaves=12
)
plain_patches = st.recursive(
    st.one_of(scalars, st.none(), st.lists(plain_values, max_size=3)),
    lambda c: st.dictionaries(plain_keys, c, max_size=3),
    max_leaves=12,
)


@given(
    st.dictionaries(plain_keys, plain_values, max_size=4),
    st.dictionaries(plain_keys, plain_patches, max_size=4),
)
def test_smp_without_schema_lists_or_directives_is_a_merge_patch(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    assert json_equal(strategic_merge_patch(target, patch), json_merge_patch(target, patch))
    assert target == before_target
    assert patch == before_patch


@given(json_objects, json_values)
def test_no_function_mutates_its_inputs(target: dict[str, Any], patch: Any) -> None:
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    json_merge_patch(target, patch)
    for function in (json_patch, strategic_merge_patch):
        with contextlib.suppress(PatchError):
            function(target, patch)
    assert target == before_target
    assert patch == before_patch
