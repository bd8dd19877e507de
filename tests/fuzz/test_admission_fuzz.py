"""Fuzzing AdmissionReview bodies (hami_control.webhook.handle_admission_review, both routes, with and
without DRA translation) and the `hami.io/dra-claims` annotation (hami_control.dra_translate).

tests/unit/test_webhook.py fuzzes plausible pods and shallow random bodies; these reach deeper: every
level of the review and the pod is replaced by hostile values, HAMi annotations get arbitrary text, JSON
nests past orjson's and Python's limits. The answer is always 200 (a review, allowed or denied), 400 or
413, never the 500 of an exception, and its body is JSON that orjson (the server's encoder) can write."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from hami_api.errors import WireFormatError
from hami_control.config import ControlConfig, DRATranslation, ServerSettings
from hami_control.dra_translate import ANNOTATION as DRA_CLAIMS
from hami_control.dra_translate import decode_claims, encode_claims
from hami_control.quota import QuotaLimits, QuotaUsage
from hami_control.webhook import handle_admission_review
from tests.fuzz.strategies import (
    deep_json_text,
    fuzz_settings,
    json_values,
    mostly,
    mutated,
    nested_text,
    pod_objects,
    texts,
)

_BASE = ControlConfig(server=ServerSettings(insecure_http=True))
CONFIGS = {mode: _BASE.with_settings(dra_translation=mode) for mode in DRATranslation}


class View:
    def limits(self, namespace: str) -> QuotaLimits:
        return QuotaLimits(memory=20000, cores=300)

    def used(self, namespace: str) -> QuotaUsage:
        return QuotaUsage(memory=1000, cores=10)


_value = json_values(leaves=5)
_request = st.fixed_dictionaries(
    {
        "uid": mostly(st.just("u-1"), texts | _value),
        "kind": mostly(
            st.fixed_dictionaries({"group": st.just(""), "version": st.just("v1"), "kind": st.just("Pod")}),
            _value,
        ),
        "operation": mostly(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]), _value),
    },
    optional={
        "object": mostly(pod_objects, _value),
        "oldObject": pod_objects | _value,
        "namespace": st.just("ai-team") | texts | _value,
        "name": texts | _value,
        "subResource": st.sampled_from(["", "status"]) | _value,
        "dryRun": st.booleans() | _value,
        "resource": _value,
    },
)
reviews = st.fixed_dictionaries(
    {
        "apiVersion": mostly(st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]), _value),
        "kind": mostly(st.just("AdmissionReview"), _value),
        "request": mostly(_request, _value),
    }
)
bodies = (
    reviews.map(lambda r: json.dumps(r).encode())
    | mutated(reviews.map(json.dumps)).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | deep_json_text().map(str.encode)
    | st.binary(max_size=300)
)

_DEEP_POD = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE",'
    b'"kind":{"group":"","version":"v1","kind":"Pod"},"object":{"metadata":{"annotations":{"hami.io/dra-claims":'
    + json.dumps("[" + nested_text(300) + "]").encode()
    + b'}},"spec":{"containers":[{"name":"a","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}'
)


@fuzz_settings
@given(bodies, st.sampled_from(list(DRATranslation)), st.booleans())
@example(_DEEP_POD, DRATranslation.OFF, False)
@example(b"[" * 100_000 + b"]" * 100_000, DRATranslation.OFF, False)
def test_any_admission_review_body_gets_an_answer_and_never_an_internal_error(
    body: bytes, mode: DRATranslation, dra_route: bool
) -> None:
    result = handle_admission_review(body, CONFIGS[mode], View(), dra_route=dra_route)
    assert result.summary.exception is None, repr(result.summary.exception)
    assert result.status in (200, 400, 413), result.body
    orjson.dumps(result.body)  # what the server writes
    if result.status == 200:
        response = result.body["response"]
        assert isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["code"] in (403, 422), response
            assert "Traceback" not in response["status"]["message"]
    else:
        assert result.body["message"]


@fuzz_settings
@given(reviews)
def test_a_review_leaves_the_request_it_was_given_unchanged(review: dict[str, Any]) -> None:
    """Decoding the body is the webhook's only copy: the caller's bytes give the same review again."""
    body = json.dumps(review).encode()
    first = handle_admission_review(body, CONFIGS[DRATranslation.ALL], View())
    again = handle_admission_review(body, CONFIGS[DRATranslation.ALL], View())
    assert first.status == again.status
    assert first.body == again.body


_record = st.dictionaries(
    st.sampled_from(["container", "claim", "template", "gpus", "memory", "cores", "x"]),
    st.sampled_from(["a", "", 0, 1, -1, None, 2**63, 1.5, True]) | _value,
    max_size=7,
)
claims_text = (
    st.lists(_record, max_size=3).map(json.dumps) | mutated(st.lists(_record, max_size=3).map(json.dumps))
) | deep_json_text()


@fuzz_settings
@given(claims_text | texts)
@example("[" + nested_text(300) + "]")  # orjson reads 1,024 levels but writes only 255
def test_dra_claims_annotation_decodes_or_is_refused_and_round_trips(text: str) -> None:
    try:
        records = decode_claims(text)
    except WireFormatError as err:
        assert err.annotation == DRA_CLAIMS
        assert str(err)
        return
    assert decode_claims(encode_claims(records)) == records
    assert copy.deepcopy(records) == records
