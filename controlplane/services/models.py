"""Models and their quantization variants."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from controlplane.models import Model, ModelVariant, Pool
from controlplane.schemas.catalog import (
    ModelCreate,
    ModelOut,
    ModelUpdate,
    VariantCreate,
    VariantOut,
    VariantUpdate,
)
from controlplane.services import audit
from controlplane.services.errors import Conflict, FieldError, Invalid, NotFound
from controlplane.services.pagination import paginate
from controlplane.services.principal import Principal


def variant_out(v: ModelVariant, model_name: str) -> VariantOut:
    return VariantOut(
        id=v.id,
        model_id=v.model_id,
        model=model_name,
        tier=v.tier,
        quantization=v.quantization,
        model_path=v.model_path,
        engine_args=dict(v.engine_args or {}),
        gpu_count=v.gpu_count,
        gpu_memory_gb=v.gpu_memory_gb,
        gpu_types=v.gpu_types,
        context_length=v.context_length,
        size_gb=v.size_gb,
        created_at=v.created_at,
        profiled_tokens_per_s=dict(v.profiled_tokens_per_s or {}),
        output_token_weight=v.output_token_weight,
    )


def model_out(m: Model) -> ModelOut:
    return ModelOut(
        id=m.id,
        name=m.name,
        display_name=m.display_name,
        description=m.description,
        default_tier=m.default_tier,
        variants=[variant_out(v, m.name) for v in m.variants],
        created_at=m.created_at,
    )


def _with_variants():
    return select(Model).options(selectinload(Model.variants))


async def get(session: AsyncSession, model_id: uuid.UUID) -> Model:
    model = await session.scalar(_with_variants().where(Model.id == model_id))
    if model is None:
        raise NotFound("model", model_id)
    return model


async def list_models(session: AsyncSession, *, name: str | None, limit: int, offset: int):
    stmt = _with_variants().order_by(Model.name)
    if name:
        stmt = stmt.where(Model.name.contains(name, autoescape=True))
    return await paginate(session, stmt, limit, offset)


def _new_variant(body: VariantCreate) -> ModelVariant:
    return ModelVariant(
        tier=body.tier,
        quantization=body.quantization,
        model_path=body.model_path,
        engine_args=dict(body.engine_args),
        gpu_count=body.gpu_count,
        gpu_memory_gb=body.gpu_memory_gb,
        gpu_types=[t.lower() for t in body.gpu_types] if body.gpu_types else None,
        context_length=body.context_length,
        size_gb=body.size_gb,
        profiled_tokens_per_s={k.lower(): float(t) for k, t in body.profiled_tokens_per_s.items()},
        output_token_weight=body.output_token_weight,
    )


async def create(session: AsyncSession, principal: Principal, body: ModelCreate) -> Model:
    if await session.scalar(select(Model.id).where(Model.name == body.name)):
        raise Conflict("model name already exists", [FieldError("name", "already exists")])
    tiers = [v.tier for v in body.variants]
    if len(tiers) != len(set(tiers)):
        raise Invalid("duplicate tier", [FieldError("variants", "each tier may appear once")])
    if body.default_tier and tiers and body.default_tier not in tiers:
        raise Invalid("default_tier is not one of the variants", [FieldError("default_tier", "unknown tier")])
    model = Model(
        name=body.name,
        display_name=body.display_name or body.name,
        description=body.description,
        default_tier=body.default_tier or (tiers[0] if tiers else None),
        variants=[_new_variant(v) for v in body.variants],
    )
    session.add(model)
    await session.flush()
    audit.record(session, principal, "model.create", model, after=audit.snapshot(model))
    return await get(session, model.id)


async def update(session: AsyncSession, principal: Principal, model_id: uuid.UUID, body: ModelUpdate) -> Model:
    model = await get(session, model_id)
    before = audit.snapshot(model)
    if body.default_tier is not None and body.default_tier not in {v.tier for v in model.variants}:
        raise Invalid("default_tier is not one of the variants", [FieldError("default_tier", "unknown tier")])
    for field in ("display_name", "description", "default_tier"):
        if getattr(body, field) is not None:
            setattr(model, field, getattr(body, field))
    await session.flush()
    audit.record(session, principal, "model.update", model, before=before, after=audit.snapshot(model))
    return model


async def delete(session: AsyncSession, principal: Principal, model_id: uuid.UUID) -> None:
    model = await get(session, model_id)
    variant_ids = [v.id for v in model.variants]
    if variant_ids and await session.scalar(select(Pool.id).where(Pool.variant_id.in_(variant_ids))):
        raise Conflict("model is served by a pool; delete its pools first")
    before = audit.snapshot(model)
    await session.delete(model)
    await session.flush()
    audit.record(session, principal, "model.delete", model, before=before)


async def get_variant(session: AsyncSession, variant_id: uuid.UUID) -> ModelVariant:
    variant = await session.scalar(
        select(ModelVariant).where(ModelVariant.id == variant_id).options(selectinload(ModelVariant.model))
    )
    if variant is None:
        raise NotFound("variant", variant_id)
    return variant


async def add_variant(
    session: AsyncSession, principal: Principal, model_id: uuid.UUID, body: VariantCreate
) -> ModelVariant:
    model = await get(session, model_id)
    if any(v.tier == body.tier for v in model.variants):
        raise Conflict("tier already exists for this model", [FieldError("tier", "already exists")])
    variant = _new_variant(body)
    model.variants.append(variant)
    if model.default_tier is None:
        model.default_tier = variant.tier
    await session.flush()
    audit.record(session, principal, "variant.create", variant, after=audit.snapshot(variant))
    return await get_variant(session, variant.id)


async def update_variant(
    session: AsyncSession, principal: Principal, variant_id: uuid.UUID, body: VariantUpdate
) -> ModelVariant:
    variant = await get_variant(session, variant_id)
    before = audit.snapshot(variant)
    for field in VariantUpdate.__struct_fields__:
        value = getattr(body, field)
        if value is not None:
            if field == "profiled_tokens_per_s":
                value = {k.lower(): float(t) for k, t in value.items()}
            setattr(variant, field, dict(value) if isinstance(value, dict) else value)
    await session.flush()
    audit.record(session, principal, "variant.update", variant, before=before, after=audit.snapshot(variant))
    return variant


async def delete_variant(session: AsyncSession, principal: Principal, variant_id: uuid.UUID) -> None:
    variant = await get_variant(session, variant_id)
    if await session.scalar(select(Pool.id).where(Pool.variant_id == variant.id)):
        raise Conflict("variant is served by a pool; delete its pools first")
    before = audit.snapshot(variant)
    model = variant.model
    await session.delete(variant)
    await session.flush()
    if model.default_tier == variant.tier:
        remaining = await session.scalars(select(ModelVariant.tier).where(ModelVariant.model_id == model.id))
        model.default_tier = next(iter(remaining), None)
    audit.record(session, principal, "variant.delete", variant, before=before)
