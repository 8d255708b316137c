"""Pools: desired state for one model variant. Validated against the catalog and tenant quotas."""

from __future__ import annotations

import uuid

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.autoscaler import schedule
from controlplane.db.types import utcnow
from controlplane.models import (
    Cloud,
    InstanceType,
    ModelVariant,
    Pool,
    PoolKind,
    Region,
    Replica,
    SpotPolicy,
    Tenant,
)
from controlplane.models.catalog import Zone
from controlplane.schemas.fleet import Placement, PoolCreate, PoolOut, PoolUpdate, ScheduleWindow
from controlplane.services import audit
from controlplane.services import models as model_service
from controlplane.services.errors import Conflict, FieldError, Invalid, NotFound
from controlplane.services.pagination import paginate
from controlplane.services.principal import Principal


def pool_out(p: Pool, replicas_by_state: dict[str, int] | None = None) -> PoolOut:
    return PoolOut(
        id=p.id,
        name=p.name,
        variant_id=p.variant_id,
        model=p.variant.model.name,
        tier=p.variant.tier,
        kind=p.kind.value,
        min_replicas=p.min_replicas,
        max_replicas=p.max_replicas,
        desired_replicas=p.desired_replicas,
        ttft_slo_ms=p.ttft_slo_ms,
        placement=[msgspec.convert(x, Placement) for x in p.placement],
        spot_policy=p.spot_policy.value,
        spot_base_on_demand=p.spot_base_on_demand,
        idle_timeout_s=p.idle_timeout_s,
        dedicated_tenant_id=p.dedicated_tenant_id,
        paused=p.paused,
        capacity_status=p.capacity_status,
        replicas_by_state=replicas_by_state or {},
        created_at=p.created_at,
        updated_at=p.updated_at,
        schedule=[msgspec.convert(w, ScheduleWindow) for w in p.schedule or []],
        schedule_timezone=p.schedule_timezone or "UTC",
        scheduled_min_replicas=scheduled_min_now(p),
    )


def scheduled_min_now(p: Pool) -> int | None:
    """The floor the pool's schedule sets at this moment (None without an active window)."""
    if not p.schedule:
        return None
    floor = schedule.scheduled_floor(schedule.parse(p.schedule), schedule.zone(p.schedule_timezone),
                                     utcnow().timestamp())
    return floor.min_replicas if floor.window is not None else None


async def replicas_by_state(session: AsyncSession, pool_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    out: dict[uuid.UUID, dict[str, int]] = {pid: {} for pid in pool_ids}
    if not pool_ids:
        return out
    rows = await session.execute(
        select(Replica.pool_id, Replica.state, func.count())
        .where(Replica.pool_id.in_(pool_ids))
        .group_by(Replica.pool_id, Replica.state)
    )
    for pool_id, state, n in rows:
        out[pool_id][state.value] = n
    return out


async def get(session: AsyncSession, pool_id: uuid.UUID) -> Pool:
    pool = await session.get(Pool, pool_id)
    if pool is None:
        raise NotFound("pool", pool_id)
    await session.refresh(pool, ["variant"])
    await session.refresh(pool.variant, ["model"])
    return pool


async def list_pools(
    session: AsyncSession, *, variant_id: uuid.UUID | None, tenant_id: uuid.UUID | None, limit: int, offset: int
) -> tuple[list[Pool], int]:
    stmt = select(Pool).order_by(Pool.name)
    if variant_id:
        stmt = stmt.where(Pool.variant_id == variant_id)
    if tenant_id:
        stmt = stmt.where(Pool.dedicated_tenant_id == tenant_id)
    pools, total = await paginate(session, stmt, limit, offset)
    for p in pools:
        await session.refresh(p.variant, ["model"])
    return pools, total


async def _fitting_types(session: AsyncSession, variant: ModelVariant, placement: list[Placement]) -> list[str]:
    """Instance types in the placement regions that can hold one replica of the variant."""
    fits: list[str] = []
    for i, pref in enumerate(placement):
        region = await session.scalar(
            select(Region).join(Cloud).where(Cloud.name == pref.cloud, Region.name == pref.region)
        )
        if region is None:
            raise Invalid(
                "placement names a region that is not in the catalog",
                [FieldError(f"placement[{i}].region", f"{pref.cloud}/{pref.region} is not in the catalog")],
            )
        if pref.zones:
            known = set(await session.scalars(select(Zone.name).where(Zone.region_id == region.id)))
            unknown = sorted(set(pref.zones) - known)
            if unknown:
                raise Invalid(
                    "placement names zones that are not in the catalog",
                    [FieldError(f"placement[{i}].zones", f"unknown zones: {', '.join(unknown)}")],
                )
        for t in await session.scalars(select(InstanceType).where(InstanceType.region_id == region.id)):
            if (
                t.gpu_count >= variant.gpu_count
                and t.gpu_memory_gb >= variant.gpu_memory_gb
                and (not variant.gpu_types or t.gpu_type in variant.gpu_types)
            ):
                fits.append(f"{pref.cloud}/{pref.region}/{t.name}")
    return fits


async def _validate(session: AsyncSession, pool: Pool, variant: ModelVariant, placement: list[Placement]) -> None:
    errors: list[FieldError] = []
    if pool.min_replicas > pool.max_replicas:
        errors.append(FieldError("min_replicas", "must be less than or equal to max_replicas"))
    if pool.kind == PoolKind.scale_to_zero and pool.min_replicas != 0:
        errors.append(FieldError("min_replicas", "a scale_to_zero pool must have min_replicas 0"))
    if pool.kind == PoolKind.warm and pool.max_replicas == 0:
        errors.append(FieldError("max_replicas", "a warm pool needs max_replicas of at least 1"))
    if pool.spot_policy == SpotPolicy.on_demand and pool.spot_base_on_demand:
        errors.append(FieldError("spot_base_on_demand", "only meaningful with a spot policy"))
    try:
        schedule.parse(pool.schedule or [], max_replicas=pool.max_replicas)
        schedule.zone(pool.schedule_timezone)
    except schedule.ScheduleError as exc:
        errors.append(FieldError(exc.field, exc.message))
    if errors:
        raise Invalid("invalid pool", errors)
    if not await _fitting_types(session, variant, placement):
        raise Invalid(
            "no instance type in the placement regions fits this variant",
            [FieldError("placement", f"need {variant.gpu_count}× GPU with ≥{variant.gpu_memory_gb} GB each")],
        )
    if pool.dedicated_tenant_id is not None:
        tenant = await session.get(Tenant, pool.dedicated_tenant_id)
        if tenant is None or tenant.deleted_at is not None:
            raise Invalid("dedicated tenant does not exist", [FieldError("dedicated_tenant_id", "unknown tenant")])
        await session.refresh(tenant, ["quota"])
        max_gpus = tenant.quota.max_gpus if tenant.quota else None
        if max_gpus is not None and pool.min_replicas * variant.gpu_count > max_gpus:
            raise Invalid(
                "the pool's floor exceeds the tenant's GPU quota",
                [FieldError("min_replicas", f"needs {pool.min_replicas * variant.gpu_count} GPUs; quota {max_gpus}")],
            )


async def create(session: AsyncSession, principal: Principal, body: PoolCreate) -> Pool:
    if await session.scalar(select(Pool.id).where(Pool.name == body.name)):
        raise Conflict("pool name already taken", [FieldError("name", "already taken")])
    try:
        variant = await model_service.get_variant(session, body.variant_id)
    except NotFound:
        raise Invalid("variant does not exist", [FieldError("variant_id", "unknown variant")]) from None
    pool = Pool(
        name=body.name,
        variant_id=variant.id,
        dedicated_tenant_id=body.dedicated_tenant_id,
        kind=PoolKind(body.kind),
        min_replicas=body.min_replicas,
        max_replicas=body.max_replicas,
        desired_replicas=body.min_replicas,
        ttft_slo_ms=body.ttft_slo_ms,
        placement=[msgspec.to_builtins(p) for p in body.placement],
        spot_policy=SpotPolicy(body.spot_policy),
        spot_base_on_demand=body.spot_base_on_demand,
        idle_timeout_s=body.idle_timeout_s,
        schedule=[msgspec.to_builtins(w) for w in body.schedule],
        schedule_timezone=body.schedule_timezone,
    )
    await _validate(session, pool, variant, body.placement)
    session.add(pool)
    await session.flush()
    audit.record(session, principal, "pool.create", pool, after=audit.snapshot(pool))
    return await get(session, pool.id)


async def update(session: AsyncSession, principal: Principal, pool_id: uuid.UUID, body: PoolUpdate) -> Pool:
    pool = await get(session, pool_id)
    before = audit.snapshot(pool)
    placement = body.placement if body.placement is not None else [msgspec.convert(x, Placement) for x in pool.placement]
    if body.schedule is not None:
        pool.schedule = [msgspec.to_builtins(w) for w in body.schedule]
    for field in ("min_replicas", "max_replicas", "ttft_slo_ms", "spot_base_on_demand", "idle_timeout_s", "paused",
                  "schedule_timezone"):
        if getattr(body, field) is not None:
            setattr(pool, field, getattr(body, field))
    if body.kind is not None:
        pool.kind = PoolKind(body.kind)
    if body.spot_policy is not None:
        pool.spot_policy = SpotPolicy(body.spot_policy)
    pool.placement = [msgspec.to_builtins(p) for p in placement]
    await _validate(session, pool, pool.variant, placement)
    pool.desired_replicas = min(max(pool.desired_replicas, pool.min_replicas), pool.max_replicas)
    await session.flush()
    audit.record(session, principal, "pool.update", pool, before=before, after=audit.snapshot(pool))
    return pool


async def delete(session: AsyncSession, principal: Principal, pool_id: uuid.UUID) -> None:
    """Deleting a pool whose engines still run would orphan them: scale it to zero first.

    (Nodes are shared and belong to no pool: an emptied node is released by the fleet loop.)"""
    from controlplane.models import ReplicaState

    pool = await get(session, pool_id)
    live = await session.scalar(
        select(func.count()).select_from(Replica).where(
            Replica.pool_id == pool.id, Replica.state.not_in([ReplicaState.stopped, ReplicaState.failed])
        )
    )
    if live:
        raise Conflict(f"pool still has {live} live replica(s); set max_replicas to 0 and wait for them to stop")
    before = audit.snapshot(pool)
    await session.delete(pool)
    await session.flush()
    audit.record(session, principal, "pool.delete", pool, before=before)
