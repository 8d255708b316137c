"""The snapshot edges pull: everything an edge needs to authenticate, limit and route without
reaching Postgres. Format documented in dataplane/edge/snapshot.py (the consumer)."""

from __future__ import annotations

import hashlib
import json
import uuid

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, selectinload

from controlplane.db.types import utcnow
from controlplane.models import (
    ApiKey,
    Cloud,
    Model,
    Pool,
    PoolKind,
    Region,
    Replica,
    ReplicaState,
    Tenant,
)
from controlplane.services import usage

_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_budget")


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def priority_scheduling(engine_args: dict) -> str | None:
    """How the variant's engines order the ``priority`` field, from its SGLang flags: None when they
    run without ``--enable-priority-scheduling`` (SGLang may then abort a request that carries one),
    else "low_first" with ``--schedule-low-priority-values-first``, "high_first" otherwise."""
    if not _flag_on(engine_args, "enable_priority_scheduling"):
        return None
    return "low_first" if _flag_on(engine_args, "schedule_low_priority_values_first") else "high_first"


def _flag_on(engine_args: dict, name: str) -> bool:
    """Is SGLang flag ``name`` set in a variant's engine_args (spelled with _ or -)?"""
    return bool(engine_args.get(name) or engine_args.get(name.replace("_", "-")))


def build(session: Session, semantic_threshold_default: float = 1.0) -> dict:
    now = utcnow()
    used = usage.month_to_date_tokens(session, now)
    tenants = session.scalars(
        select(Tenant).where(Tenant.deleted_at.is_(None)).options(selectinload(Tenant.quota)).order_by(Tenant.id)
    ).all()
    keys = session.scalars(
        select(ApiKey)
        .join(Tenant)
        .where(
            ApiKey.revoked_at.is_(None),
            Tenant.deleted_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now),
        )
        .order_by(ApiKey.id)
    ).all()
    pools = session.scalars(select(Pool).order_by(Pool.id)).all()
    served_variant_ids = {p.variant_id for p in pools}
    models = session.scalars(select(Model).options(selectinload(Model.variants)).order_by(Model.name)).all()
    replicas = session.scalars(
        select(Replica)
        .where(Replica.state.in_([ReplicaState.ready, ReplicaState.draining]))
        .options(selectinload(Replica.node))
        .order_by(Replica.id)
    ).all()
    regions = session.execute(select(Cloud.name, Region.name).join(Region.cloud).order_by(Cloud.name, Region.name))
    body = {
        "tenants": [
            {
                "id": str(t.id),
                "name": t.name,
                "status": t.status.value,
                "weight": t.weight,
                "limits": {
                    **{f: getattr(t.quota, f) if t.quota else None for f in _LIMIT_FIELDS},
                    "monthly_tokens_used": used.get(t.id, 0),
                },
                "response_cache": t.response_cache,
                "semantic_cache": {
                    "models": list(t.semantic_cache_models),
                    "threshold": t.semantic_cache_threshold if t.semantic_cache_threshold is not None
                    else semantic_threshold_default,
                } if t.semantic_cache_models else None,
            }
            for t in tenants
        ],
        "keys": [
            {
                "id": str(k.id),
                "tenant_id": str(k.tenant_id),
                "prefix": k.prefix,
                "sha256": k.sha256,
                "scopes": list(k.scopes),
                "expires_at": _iso(k.expires_at),
                "priority": k.priority.value,
                "allowed_models": k.allowed_models,
            }
            for k in keys
        ],
        "models": [
            {
                "name": m.name,
                "default_tier": m.default_tier,
                "variants": [
                    {
                        "id": str(v.id),
                        "tier": v.tier,
                        "context_length": v.context_length,
                        "served_model_name": served_model_name(m.name, v.tier),
                        "priority_scheduling": priority_scheduling(v.engine_args or {}),
                        "task": "embed" if _flag_on(v.engine_args or {}, "is_embedding") else "generate",
                    }
                    for v in m.variants
                    if v.id in served_variant_ids
                ],
            }
            for m in models
            if any(v.id in served_variant_ids for v in m.variants)
        ],
        "pools": [
            {
                "id": str(p.id),
                "variant_id": str(p.variant_id),
                "kind": p.kind.value if isinstance(p.kind, PoolKind) else p.kind,
                "dedicated_tenant_id": str(p.dedicated_tenant_id) if p.dedicated_tenant_id else None,
                "ttft_slo_ms": p.ttft_slo_ms,
            }
            for p in pools
        ],
        "replicas": [
            {
                "id": str(r.id),
                "pool_id": str(r.pool_id),
                "variant_id": str(r.variant_id),
                "region": f"{r.node.cloud}/{r.node.region}",
                "url": r.url,
                "state": r.state.value,
                "max_running_requests": r.max_running_requests,
                "max_total_tokens": r.max_total_tokens,
                "metrics": {
                    k: (r.metrics or {}).get(k)
                    for k in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate")
                    if (r.metrics or {}).get(k) is not None
                },
            }
            for r in replicas
            if r.url
        ],
        "regions": [{"name": f"{c}/{r}", "rtt_ms": None} for c, r in regions],
    }
    etag = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
    return {"etag": etag, "generated_at": now.isoformat(), **body}


def served_model_name(model: str, tier: str) -> str:
    """The name an engine replica serves a variant under (its --served-model-name)."""
    return f"{model}-{tier}"


def request_activation(session: Session, pool_id: uuid.UUID, variant_id: uuid.UUID) -> Pool | None:
    pool = session.get(Pool, pool_id)
    if pool is None or pool.variant_id != variant_id:
        return None
    pool.activation_requested_at = utcnow()
    pool.last_request_at = pool.activation_requested_at
    return pool


__all__ = ["build", "request_activation", "served_model_name"]
