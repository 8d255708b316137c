"""Stage 10: what the request cost, counted once.

``meter`` writes the request's usage event into the spool before the response's last bytes go
out, so an edge killed after answering has the event on disk (``usage.py``). ``finish`` runs
exactly once per request, whatever happened: it frees the replica, settles the limits' lease
with the tokens used, and feeds the estimators, the fair queue and the metrics.
"""

from __future__ import annotations

import os
import time

from dataplane.edge.pipeline import route
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.signals import rejection_reason
from dataplane.edge.sse import token_counts
from dataplane.edge.usage import make_event


def counts(rec: RequestRecord) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens: the engine's count, or what we know went through."""
    prompt, completion, cached = token_counts(rec.usage)
    req = rec.req
    if req is not None and rec.usage is None and rec.ticket is not None:
        # No usage from the engine (aborted or broken): meter what we know went through.
        prompt, completion = req.prompt_tokens_est, rec.chunks
    return prompt, completion, cached


def meter_stream_end(edge: EdgeParts, rec: RequestRecord, upstream_error: bool) -> None:
    """The chunk carrying ``[DONE]`` is about to go out: the request is answered."""
    rec.status, rec.http_status = ("error" if upstream_error else "ok"), 200
    meter(edge, rec)


def meter(edge: EdgeParts, rec: RequestRecord) -> None:
    """The request's usage event, once, into the spool."""
    usage = edge.usage
    if rec.metered or rec.tenant is None or usage is None:
        return  # unauthenticated: nobody to bill
    rec.metered = True
    prompt, completion, cached = counts(rec)
    request_id = rec.request_id
    if rec.batch_line and (rec.status == "client_abort" or rec.http_status == 429 or rec.http_status >= 500):
        # An attempt the batch runner may send again (controlplane.batches.runner): metered as
        # itself, so that the line's id, which usage counts once, is left for the answer it keeps.
        request_id = f"{request_id}~{os.urandom(4).hex()}"
    usage.record(make_event(
        request_id=request_id, tenant_id=rec.tenant.id, key_id=rec.key.id if rec.key else None,
        variant_id=rec.variant.id if rec.variant else None, model=rec.model,
        region=rec.replica.region if rec.replica else None, replica_id=rec.replica.id if rec.replica else None,
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
        queue_ms=rec.queue_ms, ttft_ms=rec.ttft_ms, duration_ms=(time.monotonic() - rec.t0) * 1000,
        status=rec.status, http_status=rec.http_status, ts=rec.ts, cache=rec.cache,
    ))


def finish(edge: EdgeParts, rec: RequestRecord) -> None:
    metrics = edge.metrics
    now = time.monotonic()
    if rec.ticket is not None and not rec.ticket.closed:
        route.release(edge, rec, rec.ticket, None)
    prompt, completion, cached = counts(rec)
    req = rec.req
    if rec.usage is not None and req is not None:
        edge.estimator.observe(len(req.prompt_text), prompt)
        edge.index.calibrate(edge.estimator.chars_per_token)
    if rec.lease is not None:
        edge.spawn(edge.limiter.settle(rec.lease, prompt + completion))
    model = rec.model or "unknown"
    duration = now - rec.t0
    if rec.variant is not None and rec.http_status in (429, 503):
        edge.signals.rejected(rec.variant.served_model_name, rejection_reason(rec.http_status, rec.error_code))
    metrics.child(metrics.requests, model, rec.priority, rec.status, str(rec.http_status)).inc()
    metrics.child(metrics.duration, model, rec.priority).observe(duration)
    if rec.replica is not None and rec.usage is not None:
        rid = rec.replica.id
        metrics.child(metrics.prompt_tokens, model, rid).inc(prompt)
        metrics.child(metrics.cached_tokens, model, rid).inc(cached)
        metrics.child(metrics.completion_tokens, model, rid).inc(completion)
    if rec.tenant is not None and rec.variant is not None and completion:
        edge.admission.queue(rec.variant.id).charge_output(rec.tenant.id, rec.tenant.weight, completion)
    meter(edge, rec)
