from __future__ import annotations

from typing import Any

from litestar import Controller
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.bodies import CATALOG_MAX_BODY_BYTES
from controlplane.api.routing import get, post
from controlplane.schemas.catalog import CatalogImportResult, RegionOut
from controlplane.services import audit, catalog
from controlplane.services.principal import Principal


class CatalogController(Controller):
    path = "/catalog"

    @get("/regions")
    async def list_regions(self, db: AsyncSession) -> list[RegionOut]:
        return await db.run_sync(catalog.list_regions)

    @post("/import", status_code=200, request_max_body_size=CATALOG_MAX_BODY_BYTES)
    async def import_catalog(self, db: AsyncSession, principal: Principal, data: dict[str, Any]) -> CatalogImportResult:
        """Body: the cloud catalog JSON that Terraform outputs (see infra/catalog/schema.json)."""
        result = await db.run_sync(catalog.import_catalog, data)
        audit.record(db, principal, "catalog.import", "catalog", after={
            "clouds": result.clouds, "regions": result.regions, "removed_regions": result.removed_regions})
        return result
