"""Admin REST API under /admin/v1, guarded by the admin bearer token."""

from litestar import Router
from litestar.di import Provide

from controlplane.api.admin.catalog import CatalogController
from controlplane.api.admin.fleet import FleetController
from controlplane.api.admin.models import ModelController
from controlplane.api.admin.pools import PoolController
from controlplane.api.admin.tenants import TenantController
from controlplane.api.deps import admin_guard, provide_admin

admin_router = Router(
    path="/admin/v1",
    route_handlers=[TenantController, ModelController, PoolController, CatalogController, FleetController],
    dependencies={"principal": Provide(provide_admin)},
    guards=[admin_guard],
    tags=["admin"],
    security=[{"AdminToken": []}],
)
