from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.admin.tenants import LimitParam, OffsetParam
from controlplane.api.routing import delete, get, patch, post
from controlplane.schemas.catalog import (
    ModelCreate,
    ModelOut,
    ModelUpdate,
    VariantCreate,
    VariantOut,
    VariantUpdate,
)
from controlplane.schemas.common import Page
from controlplane.services import models
from controlplane.services.principal import Principal


class ModelController(Controller):
    path = "/"

    @get("/models")
    async def list_models(
        self,
        db: AsyncSession,
        name: Annotated[str | None, Parameter(max_length=128, default=None)] = None,
        limit: LimitParam = 50,
        offset: OffsetParam = 0,
    ) -> Page[ModelOut]:
        rows, total = await models.list_models(db, name=name, limit=limit, offset=offset)
        return Page(items=[models.model_out(m) for m in rows], total=total, limit=limit, offset=offset)

    @post("/models")
    async def create_model(self, db: AsyncSession, principal: Principal, data: ModelCreate) -> ModelOut:
        return models.model_out(await models.create(db, principal, data))

    @get("/models/{model_id:uuid}")
    async def get_model(self, db: AsyncSession, model_id: uuid.UUID) -> ModelOut:
        return models.model_out(await models.get(db, model_id))

    @patch("/models/{model_id:uuid}")
    async def update_model(self, db: AsyncSession, principal: Principal, model_id: uuid.UUID, data: ModelUpdate) -> ModelOut:
        await models.update(db, principal, model_id, data)
        return models.model_out(await models.get(db, model_id))

    @delete("/models/{model_id:uuid}")
    async def delete_model(self, db: AsyncSession, principal: Principal, model_id: uuid.UUID) -> None:
        await models.delete(db, principal, model_id)

    @post("/models/{model_id:uuid}/variants")
    async def add_variant(
        self, db: AsyncSession, principal: Principal, model_id: uuid.UUID, data: VariantCreate
    ) -> VariantOut:
        v = await models.add_variant(db, principal, model_id, data)
        return models.variant_out(v, v.model.name)

    @get("/variants/{variant_id:uuid}")
    async def get_variant(self, db: AsyncSession, variant_id: uuid.UUID) -> VariantOut:
        v = await models.get_variant(db, variant_id)
        return models.variant_out(v, v.model.name)

    @patch("/variants/{variant_id:uuid}")
    async def update_variant(
        self, db: AsyncSession, principal: Principal, variant_id: uuid.UUID, data: VariantUpdate
    ) -> VariantOut:
        v = await models.update_variant(db, principal, variant_id, data)
        return models.variant_out(v, v.model.name)

    @delete("/variants/{variant_id:uuid}")
    async def delete_variant(self, db: AsyncSession, principal: Principal, variant_id: uuid.UUID) -> None:
        await models.delete_variant(db, principal, variant_id)
