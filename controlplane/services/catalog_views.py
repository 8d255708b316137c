"""What a tenant may use: models served by shared pools or by pools dedicated to that tenant."""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import Model, ModelVariant, Pool, Replica, ReplicaState
from controlplane.schemas.usage import TenantModelOut


def visible_pools(tenant_id: uuid.UUID):
    """The one tenant-scoping predicate for pools; every tenant-facing pool query uses it."""
    return or_(Pool.dedicated_tenant_id.is_(None), Pool.dedicated_tenant_id == tenant_id)


async def models_for_tenant(session: AsyncSession, tenant_id: uuid.UUID) -> list[TenantModelOut]:
    rows = await session.execute(
        select(Model, ModelVariant, Pool)
        .join(ModelVariant, ModelVariant.model_id == Model.id)
        .join(Pool, Pool.variant_id == ModelVariant.id)
        .where(visible_pools(tenant_id))
    )
    ready = dict(
        (
            await session.execute(
                select(Replica.pool_id, func.count()).where(Replica.state == ReplicaState.ready).group_by(Replica.pool_id)
            )
        ).all()
    )
    by_model: dict[uuid.UUID, dict] = defaultdict(lambda: {"tiers": set(), "ctx": 0, "ready": 0, "dedicated": False})
    models: dict[uuid.UUID, Model] = {}
    for model, variant, pool in rows.tuples():
        models[model.id] = model
        acc = by_model[model.id]
        acc["tiers"].add(variant.tier)
        acc["ctx"] = max(acc["ctx"], variant.context_length)
        acc["ready"] += ready.get(pool.id, 0)
        acc["dedicated"] |= pool.dedicated_tenant_id is not None
    return sorted(
        (
            TenantModelOut(
                name=m.name, display_name=m.display_name, default_tier=m.default_tier,
                tiers=sorted(by_model[mid]["tiers"]), context_length=by_model[mid]["ctx"],
                ready_replicas=by_model[mid]["ready"], dedicated=by_model[mid]["dedicated"],
            )
            for mid, m in models.items()
        ),
        key=lambda x: x.name,
    )
