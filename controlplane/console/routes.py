"""Everything the app factory needs to mount the console: one router, the template config and the
vendored static files."""

from __future__ import annotations

from pathlib import Path

from litestar import Router
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from controlplane.console.operator import OperatorAuthController, OperatorConsoleController
from controlplane.console.tenant import TenantAuthController, TenantConsoleController
from controlplane.console.web import EXCEPTION_HANDLERS, add_security_headers

HERE = Path(__file__).parent

console_router = Router(
    path="/",
    route_handlers=[TenantAuthController, TenantConsoleController, OperatorAuthController, OperatorConsoleController],
    exception_handlers=EXCEPTION_HANDLERS,
    after_request=add_security_headers,
    include_in_schema=False,
)

console_static = create_static_files_router(
    path="/console/static", directories=[HERE / "static"], include_in_schema=False, name="console-static",
    after_request=add_security_headers,
)

console_template_config = TemplateConfig(directory=HERE / "templates", engine=JinjaTemplateEngine)
