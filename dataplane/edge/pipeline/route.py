"""Stage 8: which replica. The router's policy picks among the eligible replicas (filters, then
the scorers of ``scoring.py``); dispatching books the request on it, and ``release`` gives the
place back when the request is over, whatever its end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dataplane.edge.breaker import OPEN
from dataplane.edge.catalog import BATCH
from dataplane.edge.fairness import RollingPeak
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.policies import Candidate, RouteRequest
from dataplane.edge.router import Ticket
from dataplane.edge.sse import token_counts


def engine_counted(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt, cached) tokens as the engine counted them, for the prefix index's self-correction
    (``release``'s ``reported``)."""
    if not usage:
        return None
    prompt, _, cached = token_counts(usage)
    return prompt, cached


def dispatch(edge: EdgeParts, rec: RequestRecord, route_req: RouteRequest, candidates: list[Candidate], now: float, *,
             keep_free: float, preempts: bool) -> Ticket | None:
    """The request on a replica now, or None when none should take it yet."""
    tenant, variant, req = rec.tenant, rec.variant, rec.req
    assert tenant is not None and variant is not None and req is not None
    router, metrics = edge.router, edge.metrics
    batch = rec.priority == BATCH
    peak = edge.interactive_peaks.get(variant.id)
    decision = router.choose(route_req, candidates, now, keep_free=keep_free, preempts_batch=preempts,
                             interactive_peak=peak.recent(now) if peak is not None else 0.0)
    if decision is None:
        if batch:
            # Held back by pacing: try again when it ends, not only when something finishes.
            until = router.batch_paced_until(candidates, now)
            if until is not None:
                edge.admission.pump_at(variant.id, until - now)
        return None
    catalog = edge.catalog
    assert catalog is not None
    ticket = router.dispatch(catalog, decision, route_req, req.reserved_tokens, now, batch=batch)
    if not req.stream:  # its first byte is its last: its prefill is presumed over in time
        asyncio.get_running_loop().call_later(router.presumed_ttft_s(ticket), prefill_presumed_over, edge, ticket)
    rid = ticket.replica.id
    load = router.load(rid)
    if not batch:
        if peak is None:
            peak = edge.interactive_peaks[variant.id] = RollingPeak(edge.settings.interactive_peak_window_s, now)
        peak.observe(load.inflight - load.batch_inflight, now)
    ticket.tenant_id = tenant.id
    if candidates[0].degraded:  # every candidate of one answer shares its tier
        metrics.child(metrics.degraded_dispatches, req.model, candidates[0].degraded).inc()
    metrics.child(metrics.inflight, rid).set(load.inflight)
    rec.ticket = ticket
    metrics.child(metrics.routed, req.model, rid, decision.policy).inc()
    metrics.child(metrics.est_prefix_hit_tokens, req.model, rid).inc(decision.predicted_cached_tokens)
    return ticket


def prefill_presumed_over(edge: EdgeParts, ticket: Ticket) -> None:
    # Batch work held off the replica by this interactive request's prefill may start now.
    if edge.router.prefill_over(ticket) is not None and not ticket.batch:
        edge.admission.pump(ticket.replica.variant_id)


def release(edge: EdgeParts, rec: RequestRecord, ticket: Ticket, ok: bool | None,
            reported: tuple[int, int] | None = None) -> None:
    """``ok``: True served, False the replica's failure, None neither (judged elsewhere)."""
    router, metrics = edge.router, edge.metrics
    now = time.monotonic()
    if not ticket.closed and not ticket.batch:  # batch work never took a place in the guard
        edge.share_guards.of(ticket.replica.variant_id).released(ticket.tenant_id, now)
    rid = ticket.replica.id
    breaker = router.breakers.get(rid)
    before = breaker.state if breaker is not None else None
    completion = token_counts(rec.usage)[1] if ok and rec.usage else None
    router.release(ticket, ok, now, reported, completion)
    if breaker is not None and breaker.state != before:
        metrics.child(metrics.breaker_open, rid).set(1 if breaker.state == OPEN else 0)
    metrics.child(metrics.inflight, rid).set(router.load(rid).inflight)
    edge.admission.pump(ticket.replica.variant_id)
