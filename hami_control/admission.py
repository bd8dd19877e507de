"""The webhook as a service: `POST /webhook` bodies -> the pure review (`webhook.handle_admission_review`)
against the cluster's quota view, and the usage of every pod it admits assumed until the watch shows the
pod (`pod_store`: a burst of creates cannot overshoot a quota together); metrics observed.

The review and the assumption run synchronously on the event loop, without an await, so no other review
can slip in between a quota check and its assumption. A pod translated to DRA may need
ResourceClaimTemplates that do not exist yet (`dra_templates.TemplateKeeper`): only then does the
answer wait, for their creation, and if that fails the pod is denied and its assumed usage withdrawn.
Dry runs create nothing (the DRA webhook entry declares `sideEffects: NoneOnDryRun`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable

from hami_control.config import ControlConfig
from hami_control.dra_templates import TemplateError, TemplateKeeper
from hami_control.metrics import ControlMetrics
from hami_control.pod_store import Admission
from hami_control.quota_store import ClusterQuotaView
from hami_control.server import AdmissionHandler, WebhookAnswer
from hami_control.webhook import AdmissionResult, DecisionSummary, denied_result, handle_admission_review


def admission_handler(
    config: ControlConfig,
    view: ClusterQuotaView,
    metrics: ControlMetrics | None = None,
    *,
    dra_route: bool = False,
    templates: TemplateKeeper | None = None,
) -> AdmissionHandler:
    """The `server.webhook_route` handler (`dra_route`: the one of `/webhook/dra`): review, assume an
    admitted GPU pod's quota usage (not for dry runs), make sure a translated pod's templates exist
    (`templates`; needed whenever `config.dra.translation` is not off), observe the decision."""

    def answer(result: AdmissionResult, started: float) -> WebhookAnswer:
        summary = result.summary
        if metrics is not None and result.status == 200:
            metrics.observe_webhook(time.perf_counter() - started, summary.allowed)
        return WebhookAnswer(result.status, result.body, summary.fields(), summary.exception)

    async def after_templates(
        result: AdmissionResult, admission: Admission | None, started: float
    ) -> WebhookAnswer:
        summary = result.summary
        assert templates is not None
        try:
            await templates.ensure(summary.namespace, summary.claims)
        except TemplateError as err:
            if admission is not None:
                view.withdraw(admission)
            result = denied_result(result, err.code, err.message)
        return answer(result, started)

    def admit(body: bytes) -> WebhookAnswer | Awaitable[WebhookAnswer]:
        started = time.perf_counter()
        result = handle_admission_review(body, config, view, dra_route=dra_route)
        summary: DecisionSummary = result.summary
        admission = None
        if summary.allowed and summary.quota_usage is not None and not summary.dry_run:
            admission = view.assume(
                summary.namespace, summary.name, summary.generate_name, summary.quota_usage
            )
        if summary.allowed and summary.claims and not summary.dry_run:
            try:
                if templates is None:
                    raise TemplateError(500, "hami-control keeps no ResourceClaimTemplates here (a bug)")
                if templates.missing(summary.namespace, summary.claims):
                    return after_templates(result, admission, started)
            except TemplateError as err:
                if admission is not None:
                    view.withdraw(admission)
                result = denied_result(result, err.code, err.message)
        return answer(result, started)

    return admit


__all__ = ["admission_handler"]
