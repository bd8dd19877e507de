"""Kubernetes protobuf bodies -> the JSON kube-apiserver writes (hami_sim.apiserver.kubeproto).

The messages come from proto/k8s.io/...; their JSON keys and shapes are checked against the official
client's models (generated from kube's OpenAPI), and converted objects must validate as those models."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from kubernetes import client

from hami_sim.apiserver import kubeproto
from hami_sim.apiserver.kubeproto import (
    MAGIC,
    ProtobufError,
    QuantityFieldError,
    decode_protobuf,
    go_duration,
)

CORE = "k8s.io.api.core.v1"
META = "k8s.io.apimachinery.pkg.apis.meta.v1"

# (message, the official client's model): every kind the stand-in decodes, and the envelope's payloads.
ROOTS = [
    (f"{CORE}.Pod", client.V1Pod),
    (f"{CORE}.Node", client.V1Node),
    (f"{CORE}.Namespace", client.V1Namespace),
    (f"{CORE}.Event", client.CoreV1Event),
    (f"{CORE}.ResourceQuota", client.V1ResourceQuota),
    (f"{CORE}.LimitRange", client.V1LimitRange),
    (f"{CORE}.Secret", client.V1Secret),
    (f"{CORE}.ConfigMap", client.V1ConfigMap),
    (f"{CORE}.Binding", client.V1Binding),
    ("k8s.io.api.coordination.v1.Lease", client.V1Lease),
    (
        "k8s.io.api.admissionregistration.v1.MutatingWebhookConfiguration",
        client.V1MutatingWebhookConfiguration,
    ),
    ("k8s.io.api.events.v1.Event", client.EventsV1Event),
    (f"{META}.DeleteOptions", client.V1DeleteOptions),
]

# Go types with their own JSON (a string, a number or any JSON), and what the client's models call them.
_SCALAR_MODELS = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity": ("str",),
    f"{META}.Time": ("datetime",),
    f"{META}.MicroTime": ("datetime",),
    f"{META}.Duration": ("str",),
    f"{META}.FieldsV1": ("object",),
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": ("object",),
    "k8s.io.apimachinery.pkg.runtime.RawExtension": ("object",),
}


def _model(type_text: str) -> type[Any] | None:
    names = re.findall(r"[A-Z]\w+", type_text)
    return getattr(client, names[-1], None) if names else None


def _walk(
    message: Descriptor, model: type[Any], path: str, seen: set[tuple[str, str]], problems: list[str]
) -> None:
    if (message.full_name, model.__name__) in seen:
        return
    seen.add((message.full_name, model.__name__))
    keys = dict((json, attr) for attr, json in model.attribute_map.items())
    for field in kubeproto.schema().fields(message):
        target = field.descriptor.message_type
        if field.inline:
            assert target is not None
            _walk(target, model, path, seen, problems)
            continue
        where = f"{path}.{field.json}"
        if field.json not in keys:
            problems.append(f"{where}: no such key in {model.__name__}")
            continue
        type_text = model.openapi_types[keys[field.json]]
        if field.is_map:
            target = field.map_value.message_type
            if not type_text.lower().startswith("dict"):
                problems.append(f"{where}: a map, but {model.__name__} says {type_text}")
        elif field.repeated and not type_text.lower().startswith("list"):
            problems.append(f"{where}: a list, but {model.__name__} says {type_text}")
        if target is None:
            continue
        if target.full_name in _SCALAR_MODELS:
            if not type_text.endswith(_SCALAR_MODELS[target.full_name]) and not type_text.endswith(
                ("str]", "str)", "object]", "object)")
            ):
                problems.append(f"{where}: {target.full_name} but {model.__name__} says {type_text}")
            continue
        sub = _model(type_text)
        if sub is None:
            problems.append(f"{where}: {model.__name__} has no model for {type_text}")
            continue
        _walk(target, sub, where, seen, problems)


def test_every_field_has_the_json_key_and_shape_of_the_official_models() -> None:
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for name, model in ROOTS:
        _walk(kubeproto.schema().message(name), model, name.rsplit(".", 1)[1], seen, problems)
    assert len(seen) > 150  # the walk reached the whole of PodSpec, not only the top
    # An alpha field that k8s.io/api v0.36 has and the client's 1.37 models no longer have.
    skew = ["Pod.status.nodeAllocatableResourceClaimStatuses.resources: no such key in "
            "V1NodeAllocatableResourceClaimStatus"]  # fmt: skip
    assert problems == skew


# --- building protobuf bodies ---------------------------------------------------------------------------


def message(full_name: str, **fields: Any) -> Any:
    s = kubeproto.schema()
    return s.message_class(s.message(full_name))(**fields)


def envelope(obj: Message, api_version: str, kind: str, **extra: Any) -> bytes:
    unknown = message(
        "k8s.io.apimachinery.pkg.runtime.Unknown",
        typeMeta=message("k8s.io.apimachinery.pkg.runtime.TypeMeta", apiVersion=api_version, kind=kind),
        raw=obj.SerializeToString(),
        **extra,
    )
    return MAGIC + unknown.SerializeToString()


def quantity(text: str) -> Any:
    return message("k8s.io.apimachinery.pkg.api.resource.Quantity", string=text)


def meta(**fields: Any) -> Any:
    # What Go's marshaller writes for ObjectMeta: every non-pointer field, zero or not.
    values: dict[str, Any] = {
        "name": "",
        "generateName": "",
        "namespace": "",
        "selfLink": "",
        "uid": "",
        "resourceVersion": "",
        "generation": 0,
        "creationTimestamp": message(f"{META}.Time"),
    }
    values.update(fields)
    return message(f"{META}.ObjectMeta", **values)


def test_a_pod_decodes_to_what_go_marshals() -> None:
    container = message(
        f"{CORE}.Container",
        name="main",
        image="busybox:1.36",
        resources=message(
            f"{CORE}.ResourceRequirements",
            limits={"nvidia.com/gpu": quantity("1"), "memory": quantity("1024Mi")},
        ),
        ports=[message(f"{CORE}.ContainerPort", name="", containerPort=8080, protocol="TCP", hostPort=0)],
        readinessProbe=message(
            f"{CORE}.Probe",
            handler=message(
                f"{CORE}.ProbeHandler",
                httpGet=message(
                    f"{CORE}.HTTPGetAction",
                    path="/healthz",
                    port=message("k8s.io.apimachinery.pkg.util.intstr.IntOrString", type=1, strVal="http"),
                ),
            ),
            periodSeconds=0,
        ),
        env=[
            message(
                f"{CORE}.EnvVar",
                name="SECRET",
                value="",
                valueFrom=message(
                    f"{CORE}.EnvVarSource",
                    secretKeyRef=message(
                        f"{CORE}.SecretKeySelector",
                        localObjectReference=message(f"{CORE}.LocalObjectReference", name="creds"),
                        key="token",
                    ),
                ),
            )
        ],
        terminationMessagePath="",
        stdin=False,
    )
    spec = message(
        f"{CORE}.PodSpec",
        containers=[container],
        automountServiceAccountToken=False,  # a pointer: written although false
        hostNetwork=False,  # a value with omitempty: left out
        nodeSelector={"gpu": "on"},
        volumes=[
            message(
                f"{CORE}.Volume",
                name="scratch",
                volumeSource=message(
                    f"{CORE}.VolumeSource",
                    emptyDir=message(f"{CORE}.EmptyDirVolumeSource", sizeLimit=quantity("2048Mi")),
                ),
            )
        ],
    )
    status = message(
        f"{CORE}.PodStatus",
        phase="Pending",
        conditions=[
            message(
                f"{CORE}.PodCondition",
                type="PodScheduled",
                status="True",
                lastProbeTime=message(f"{META}.Time"),
                lastTransitionTime=message(f"{META}.Time", seconds=1767323045),
            )
        ],
        containerStatuses=[
            message(f"{CORE}.ContainerStatus", name="main", ready=False, restartCount=0, image="", imageID="")
        ],
    )
    pod = message(
        f"{CORE}.Pod",
        metadata=meta(name="gpu-pod", namespace="default", labels={"app": "demo"}),
        spec=spec,
        status=status,
    )
    decoded = decode_protobuf(envelope(pod, "v1", "Pod"))
    assert decoded == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "gpu-pod",
            "namespace": "default",
            "creationTimestamp": None,
            "labels": {"app": "demo"},
        },
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "2Gi"}}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
                    ],
                    "resources": {"limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
                }
            ],
            "nodeSelector": {"gpu": "on"},
            "automountServiceAccountToken": False,
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
            # ContainerStatus.ready, restartCount and image have no omitempty: Go writes their zeros; state
            # and lastState are structs, which omitempty never leaves out.
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {},
                    "lastState": {},
                    "ready": False,
                    "restartCount": 0,
                    "image": "",
                    "imageID": "",
                }
            ],
        },
    }
    assert client.V1Pod.from_dict(decoded) is not None


def test_special_types_bytes_and_nil_lists() -> None:
    secret = message(
        f"{CORE}.Secret",
        metadata=meta(name="s"),
        data={"tls.crt": b"\x00cert"},
        type="kubernetes.io/tls",
        immutable=False,
    )
    assert decode_protobuf(envelope(secret, "v1", "Secret")) == {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": "s", "creationTimestamp": None},
        "data": {"tls.crt": base64.b64encode(b"\x00cert").decode()},
        "type": "kubernetes.io/tls",
        "immutable": False,
    }
    lease = message(
        "k8s.io.api.coordination.v1.Lease",
        metadata=meta(
            name="l",
            managedFields=[
                message(
                    f"{META}.ManagedFieldsEntry",
                    manager="m",
                    operation="Update",
                    fieldsType="FieldsV1",
                    fieldsV1=message(f"{META}.FieldsV1", Raw=b'{"f:spec":{}}'),
                )
            ],
        ),
        spec=message(
            "k8s.io.api.coordination.v1.LeaseSpec",
            holderIdentity="a",
            leaseDurationSeconds=15,
            renewTime=message(f"{META}.MicroTime", seconds=1767323045, nanos=250_000_999),
        ),
    )
    assert decode_protobuf(envelope(lease, "coordination.k8s.io/v1", "Lease"))["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-01-02T03:04:05.250000Z",
    }
    managed = decode_protobuf(envelope(lease, "coordination.k8s.io/v1", "Lease"))["metadata"]["managedFields"]
    assert managed == [
        {"manager": "m", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}
    ]
    # PodSpec.containers has no omitempty: an empty (nil) list is written as null.
    empty = message(f"{CORE}.Pod", metadata=meta(name="p"), spec=message(f"{CORE}.PodSpec"))
    assert decode_protobuf(envelope(empty, "v1", "Pod"))["spec"] == {"containers": None}


def test_delete_options_and_binding_decode() -> None:
    options = message(
        f"{META}.DeleteOptions",
        preconditions=message(f"{META}.Preconditions", uid="u-1"),
        propagationPolicy="Background",
        gracePeriodSeconds=0,
    )
    assert decode_protobuf(envelope(options, "v1", "DeleteOptions")) == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": "u-1"},
        "propagationPolicy": "Background",
    }
    binding = message(
        f"{CORE}.Binding",
        metadata=meta(name="p", annotations={"hami.io/a": "1"}),
        target=message(
            f"{CORE}.ObjectReference",
            kind="Node",
            name="n1",
            namespace="",
            uid="",
            apiVersion="",
            resourceVersion="",
            fieldPath="",
        ),
    )
    assert decode_protobuf(envelope(binding, "v1", "Binding")) == {
        "kind": "Binding",
        "apiVersion": "v1",
        "metadata": {"name": "p", "creationTimestamp": None, "annotations": {"hami.io/a": "1"}},
        "target": {"kind": "Node", "name": "n1"},
    }


def truncated_pod() -> bytes:
    type_meta = message("k8s.io.apimachinery.pkg.runtime.TypeMeta", apiVersion="v1", kind="Pod")
    unknown = message("k8s.io.apimachinery.pkg.runtime.Unknown", typeMeta=type_meta, raw=b"\x0a\x05")
    return MAGIC + unknown.SerializeToString()


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"\x00\x01", "protobuf magic"),
        (MAGIC + b"\x01", "not a runtime.Unknown"),
        (lambda: envelope(message(f"{CORE}.Pod"), "v1", "Deployment"), 'no kind "Deployment"'),
        (lambda: envelope(message(f"{CORE}.Pod"), "", ""), "names no kind"),
        (lambda: envelope(message(f"{CORE}.Pod"), "v1", "Pod", contentEncoding="gzip"), "contentEncoding"),
        (
            lambda: envelope(message(f"{CORE}.Pod"), "v1", "Pod", contentType="application/json"),
            "contentType",
        ),
        (truncated_pod, "does not decode"),
    ],
)
def test_bodies_that_cannot_be_read_say_why(body: Any, error: str) -> None:
    with pytest.raises(ProtobufError, match=re.escape(error)):
        decode_protobuf(body() if callable(body) else body)


def test_a_bad_quantity_in_a_protobuf_body_names_the_field() -> None:
    limits = {"nvidia.com/gpu": quantity("lots")}
    container = message(
        f"{CORE}.Container", name="c", resources=message(f"{CORE}.ResourceRequirements", limits=limits)
    )
    pod = message(f"{CORE}.Pod", spec=message(f"{CORE}.PodSpec", containers=[container]))
    with pytest.raises(QuantityFieldError) as info:
        decode_protobuf(envelope(pod, "v1", "Pod"))
    assert info.value.path == "spec.containers[0].resources.limits[nvidia.com/gpu]"
    assert info.value.value == "lots"
    assert "quantities must match the regular expression" in info.value.reason


@pytest.mark.parametrize(
    ("nanoseconds", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5µs"),
        (1_500_000, "1.5ms"),
        (1_000_000_000, "1s"),
        (90_000_000_000, "1m30s"),
        (3_600_000_000_000, "1h0m0s"),
        (3_723_500_000_000, "1h2m3.5s"),
        (-2_000_000_000, "-2s"),
    ],
)
def test_go_duration_strings(nanoseconds: int, text: str) -> None:
    assert go_duration(nanoseconds) == text
