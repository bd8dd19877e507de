"""The webhook as a service: `POST /webhook` bodies -> the pure review (`webhook.handle_admission_review`)
against the cluster's quota view, and the usage of every pod it admits assumed until the watch shows the
pod (`pod_store`: a burst of creates cannot overshoot a quota together); metrics observed.

The handler runs synchronously on the event loop, without an await, so no other review can slip in
between a quota check and its assumption."""

from __future__ import annotations

import time

from hami_control.config import ControlConfig
from hami_control.metrics import ControlMetrics
from hami_control.quota_store import ClusterQuotaView
from hami_control.server import AdmissionHandler, WebhookAnswer
from hami_control.webhook import handle_admission_review


def admission_handler(
    config: ControlConfig, view: ClusterQuotaView, metrics: ControlMetrics | None = None
) -> AdmissionHandler:
    """The `server.webhook_route` handler: review, assume an admitted GPU pod's quota usage (not for dry
    runs), observe the decision."""

    def admit(body: bytes) -> WebhookAnswer:
        started = time.perf_counter()
        result = handle_admission_review(body, config, view)
        summary = result.summary
        if summary.allowed and summary.quota_usage is not None and not summary.dry_run:
            view.assume(summary.namespace, summary.name, summary.generate_name, summary.quota_usage)
        if metrics is not None and result.status == 200:
            metrics.observe_webhook(time.perf_counter() - started, summary.allowed)
        return WebhookAnswer(result.status, result.body, summary.fields(), summary.exception)

    return admit


__all__ = ["admission_handler"]
