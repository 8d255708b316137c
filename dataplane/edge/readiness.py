"""Model-level readiness, for whatever steers traffic between regions (Route 53 health checks,
load balancers): ``GET /health/models/{model}`` for one model (``name`` or ``name:tier``) and
``GET /health/ready`` for every model this edge's snapshot says it serves. 200 when the edge can
serve it, else 503; both with a JSON body saying why. ``/health`` stays the process's liveness
(always 200 while it answers): a check that restarts or replaces edges must use that one, never
these, or a model outage would take the edges down with it.

A model is servable when the edge holds a snapshot no older than ``health_snapshot_max_age_s``
(from a control plane; a standalone config never ages) and one of its variants has a ready replica
that passes the edge's own health probes, whose breaker admits requests and whose region is not
failing (the router's own filter), or has no ready replica but a scale-to-zero pool (the edge
holds requests while one starts). Reasons: ``no_snapshot``, ``snapshot_stale``,
``unknown_model``, ``no_healthy_replica``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from dataplane.edge.catalog import Catalog, Variant
    from dataplane.edge.service import EdgeService


def _variant_state(service: EdgeService, catalog: Catalog, variant: Variant, now: float) -> dict[str, Any]:
    pools = catalog.pools_by_variant.get(variant.id, [])
    ready = [r for p in pools for r in catalog.ready_by_pool.get(p.id, ())]
    healthy = service.router.eligible(catalog, ready, now, degrade=False)
    by_region: dict[str, int] = {}
    for c in healthy:
        by_region[c.replica.region] = by_region.get(c.replica.region, 0) + 1
    cold = not ready and any(p.kind == "scale_to_zero" for p in pools)
    out: dict[str, Any] = {"tier": variant.tier, "ready_replicas": len(ready), "healthy_replicas": len(healthy),
                           "healthy_by_region": by_region, "ok": bool(healthy) or cold}
    if cold:
        out["scale_to_zero"] = True
    return out


def _snapshot_problem(service: EdgeService) -> tuple[str | None, float | None]:
    if service.catalog is None:
        return "no_snapshot", None
    if not hasattr(service.source, "last_ok"):  # a static config: never stale
        return None, None
    age = service.snapshot_age()
    limit = service.settings.health_snapshot_max_age_s
    if limit > 0 and (age < 0 or age > limit):
        return "snapshot_stale", round(age, 1)
    return None, round(age, 1)


def model_state(service: EdgeService, catalog: Catalog, name: str, now: float) -> dict[str, Any]:
    """One model: every variant when ``name`` has no tier, else that tier's; ok when any is."""
    model_name, _, tier = name.partition(":")
    model = catalog.models.get(model_name)
    variants = [] if model is None else [v for t, v in model.variants.items() if not tier or t == tier]
    if not variants:
        return {"ok": False, "reason": "unknown_model"}
    tiers = {v.tier: _variant_state(service, catalog, v, now) for v in variants}
    ok = any(t["ok"] for t in tiers.values())
    out: dict[str, Any] = {"ok": ok, "tiers": tiers}
    if not ok:
        out["reason"] = "no_healthy_replica"
    return out


def model_health(service: EdgeService, name: str) -> tuple[int, bytes]:
    problem, age = _snapshot_problem(service)
    body: dict[str, Any] = {"model": name, "snapshot_age_s": age}
    if problem is not None:
        body.update(ok=False, reason=problem)
        return 503, msgspec.json.encode(body)
    assert service.catalog is not None
    state = model_state(service, service.catalog, name, time.monotonic())
    body.update(state)
    return (200 if state["ok"] else 503), msgspec.json.encode(body)


def region_health(service: EdgeService) -> tuple[int, bytes]:
    """Every model with a pool in the snapshot: this region is ready when each is servable."""
    problem, age = _snapshot_problem(service)
    body: dict[str, Any] = {"region": service.settings.region, "snapshot_age_s": age}
    if problem is not None:
        body.update(ok=False, reason=problem)
        return 503, msgspec.json.encode(body)
    catalog = service.catalog
    assert catalog is not None
    now = time.monotonic()
    models = {name: model_state(service, catalog, name, now) for name, m in catalog.models.items()
              if any(catalog.pools_by_variant.get(v.id) for v in m.variants.values())}
    failing = sorted(name for name, s in models.items() if not s["ok"])
    body.update(ok=not failing, models=models)
    if failing:
        body.update(reason="no_healthy_replica", failing=failing)
    return (503 if failing else 200), msgspec.json.encode(body)
