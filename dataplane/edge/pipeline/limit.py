"""Stage 5: the tenant's limits (RPM, TPM, concurrency), shared by the region's edges through
Redis and falling back to a local share of them when Redis is away. The lease it takes is
settled with the tokens really used in ``account.finish``."""

from __future__ import annotations

from dataplane.edge.limits import to_error
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord


async def apply_limits(edge: EdgeParts, rec: RequestRecord, reserved_tokens: int, cache_state: str) -> None:
    tenant = rec.tenant
    assert tenant is not None
    limiter = edge.limiter
    decision = await limiter.admit(tenant, rec.request_id, reserved_tokens)
    if limiter.redis is not None and not limiter.redis_usable and not tenant.limits.unlimited:
        edge.metrics.limits_fallback.inc()
    rec.rate_headers = {**decision.headers, "x-nimbus-cache": cache_state}
    if not decision.allowed:
        edge.metrics.child(edge.metrics.rate_limited, decision.reason).inc()
        raise to_error(decision)
    rec.lease = decision.lease
