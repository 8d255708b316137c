"""Stage 7: when a request may take a replica.

Scale from zero first (a variant with no ready replica asks the control plane for one and holds
the request until the snapshot shows it). Then the request waits in its variant's fair queue
(``admission.py``, virtual-token-counter order, deadline-first within a tenant) until the
fair-share guard lets its tenant take a slot and ``route`` finds a replica for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from dataplane.edge import errors
from dataplane.edge.catalog import BATCH, INTERACTIVE, Tenant, Variant
from dataplane.edge.fairness import Waiter
from dataplane.edge.pipeline import route
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.policies import RouteRequest
from dataplane.edge.router import Ticket

# ---------------------------------------------------------------------- scale from zero

def is_cold(edge: EdgeParts, rec: RequestRecord) -> bool:
    """No replica of the variant is ready for this tenant."""
    assert rec.tenant is not None and rec.variant is not None
    catalog = edge.catalog
    return catalog is None or not catalog.candidates(rec.tenant.id, rec.variant.id)


async def activate(edge: EdgeParts, rec: RequestRecord) -> None:
    tenant, variant, req = rec.tenant, rec.variant, rec.req
    assert tenant is not None and variant is not None and req is not None
    edge.signals.holding(variant.served_model_name, 1)  # backlog for the autoscaler
    try:
        await _activate(edge, tenant, variant, req.model)
    finally:
        edge.signals.holding(variant.served_model_name, -1)


async def _activate(edge: EdgeParts, tenant: Tenant, variant: Variant, model: str) -> None:
    """Ask the control plane for replicas and hold the request until the snapshot shows one
    ready, or the bound passes."""
    s = edge.settings
    deadline = time.monotonic() + s.activation_timeout_s
    while True:
        catalog = edge.current_catalog()
        if catalog.candidates(tenant.id, variant.id):
            return
        now = time.monotonic()
        if now >= deadline:
            raise errors.unavailable(f"The model `{model}` is starting; retry shortly.", 10.0,
                                     code="model_cold_start")
        for pool in catalog.usable_pools(tenant.id, variant.id):
            if now - edge.activation_sent.get(pool.id, -1e9) >= s.activation_repeat_s:
                edge.activation_sent[pool.id] = now
                edge.metrics.child(edge.metrics.activations, model).inc()
                edge.spawn(edge.source.activate(pool.id, variant.id))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(edge.catalog_changed.wait(), min(deadline - now, s.activation_repeat_s))


# ---------------------------------------------------------------------- the fair queue

def dispatch_deadline(edge: EdgeParts, rec: RequestRecord, route_req: RouteRequest) -> float:
    """The last moment this request can leave the queue and still meet its pool's TTFT SLO: its
    arrival plus the SLO, less the prefill the router's TTFT model predicts for its prompt alone.
    None of that applies to batch work or to a pool without an SLO: they keep arrival order."""
    catalog = edge.catalog
    if rec.priority == BATCH or catalog is None or rec.tenant is None or rec.variant is None:
        return math.inf
    slo_s = catalog.ttft_slo_s(rec.tenant.id, rec.variant.id)
    if slo_s is None:
        return math.inf
    prefill_s = edge.router.ttft_model.predict(0.0, route_req.prompt_tokens, 0) / 1000
    return rec.t0 + slo_s - prefill_s


async def acquire(edge: EdgeParts, rec: RequestRecord, route_req: RouteRequest, excluded: set[str]) -> Ticket:
    """Wait until the request holds a replica (``rec.ticket``); raises when the queue refuses
    it (full, or waited too long)."""
    tenant, variant, req = rec.tenant, rec.variant, rec.req
    assert tenant is not None and variant is not None and req is not None
    queue = edge.admission.queue(variant.id)
    # The fair-share guard keeps interactive tenants from crowding each other out. Batch-class
    # work is not its business: it already yields to every interactive tenant (the reserve
    # below, and preemption inside engines that schedule by priority), so holding it back for
    # them as well left a fifth of the fleet's spare capacity idle (bench/batch: 0.67 of the
    # spare tokens used with the guard, 0.79 without, interactive p99 1.12x either way).
    guarded = rec.priority != BATCH
    guard = edge.share_guards.of(variant.id)
    if guarded:
        guard.seen(tenant.id, time.monotonic())
    # Batch work leaves a share of every replica's slots to interactive traffic.
    keep_free = edge.settings.interactive_reserved_share if rec.priority == BATCH else 0.0
    # ...and where the engines preempt by priority, interactive work may take the slots batch work holds.
    preempts = rec.priority == INTERACTIVE and variant.priority_scheduling is not None

    deadline = dispatch_deadline(edge, rec, route_req)

    def try_dispatch(now: float) -> Ticket | None:
        catalog = edge.catalog
        if catalog is None:
            return None
        candidates = edge.router.eligible(catalog, catalog.candidates(tenant.id, variant.id), now, excluded)
        if guarded:
            free = sum(max(0, c.capacity - c.running + (c.load.batch_inflight if preempts else 0))
                       for c in candidates)
            if not guard.allows(tenant.id, free, sum(c.capacity for c in candidates), now):
                return None
        ticket = route.dispatch(edge, rec, route_req, candidates, now, keep_free=keep_free, preempts=preempts)
        if ticket is None:
            return None
        if guarded:
            guard.acquired(tenant.id, now)
        queue.charge_admit(tenant.id, tenant.weight, route_req.prompt_tokens)
        if now > deadline and not rec.dispatched_late:  # once, should a retry dispatch it again
            rec.dispatched_late = True
            edge.metrics.child(edge.metrics.dispatched_late, req.model, rec.priority).inc()
        return ticket

    t_wait = time.monotonic()
    waiter = Waiter(tenant.id, tenant.weight, rec.priority, route_req.prompt_tokens, t_wait, try_dispatch,
                    deadline=deadline)
    try:
        ticket = await edge.admission.admit(variant.id, waiter)
    finally:  # dispatched, timed out or given up: it waited this long either way
        waited = time.monotonic() - t_wait
        edge.signals.queue_wait(variant.served_model_name, waited)
    rec.queue_ms = (rec.queue_ms or 0.0) + waited * 1000
    edge.metrics.child(edge.metrics.queue_time, req.model, rec.priority).observe(waited)
    edge.metrics.queue_depth.set(edge.admission.queued())
    rec.replica = ticket.replica
    return ticket
