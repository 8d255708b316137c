"""Litestar application factory for the control plane."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from litestar import Litestar, MediaType, Response, get
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from controlplane.api.admin import admin_router
from controlplane.api.agents import agents_router
from controlplane.api.batch_api import BatchApiController
from controlplane.api.bodies import MAX_BODY_BYTES, NimbusRequest
from controlplane.api.deps import provide_db, provide_key_verifier, provide_settings
from controlplane.api.errors import EXCEPTION_HANDLERS
from controlplane.api.internal import EdgeController
from controlplane.api.tenant import TenantSelfController
from controlplane.config import Settings, get_settings
from controlplane.console.routes import console_router, console_static, console_template_config
from controlplane.db.engine import make_async_engine, make_async_sessionmaker
from controlplane.services.keys import KeyVerifier
from controlplane.services.signin_throttle import SigninThrottle

log = logging.getLogger("nimbus.api")


@get("/healthz", include_in_schema=False)
async def healthz(state: State) -> dict[str, str]:
    async with state.sessionmaker() as session:
        await session.execute(text("SELECT 1"))
    return {"status": "ok"}


@get("/metrics", include_in_schema=False, media_type=MediaType.TEXT)
async def metrics() -> Response:
    return Response(content=generate_latest(), media_type=CONTENT_TYPE_LATEST)


def create_app(settings: Settings | None = None, extra_handlers: list | None = None) -> Litestar:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: Litestar):
        engine = make_async_engine(settings)
        app.state.engine = engine
        app.state.sessionmaker = make_async_sessionmaker(engine)
        try:
            yield
        finally:
            try:
                await app.state.signin_throttle.aclose()
            finally:
                await engine.dispose()

    openapi = OpenAPIConfig(
        title="Nimbus control plane",
        version="1.0.0",
        path="/schema",
        components=Components(
            security_schemes={
                "AdminToken": SecurityScheme(type="http", scheme="bearer", description="NIMBUS_ADMIN_TOKEN"),
                "TenantKey": SecurityScheme(type="http", scheme="bearer", description="A tenant API key"),
            }
        ),
    )
    return Litestar(
        route_handlers=[
            healthz, metrics, admin_router, TenantSelfController, EdgeController, BatchApiController, agents_router, console_router, console_static,
            *(extra_handlers or []),
        ],
        template_config=console_template_config,
        dependencies={
            "db": Provide(provide_db),
            "settings": Provide(provide_settings),
            "key_verifier": Provide(provide_key_verifier),
        },
        state=State({"settings": settings, "key_verifier": KeyVerifier(ttl=settings.key_cache_seconds),
                     "signin_throttle": SigninThrottle(settings.signin_throttle, settings.redis_url)}),
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        openapi_config=openapi,
        cors_config=CORSConfig(allow_origins=[]),
        request_max_body_size=MAX_BODY_BYTES,  # routes that need more (the catalog import) say so
        request_class=NimbusRequest,  # JSON bodies: nesting-depth limit before decoding
    )
