"""Internal API for edges (snapshot, activation). Agents' endpoints live in api/agents.py."""

from __future__ import annotations

import hmac
import time
import uuid

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.deps import bearer
from controlplane.services import edge_snapshot
from controlplane.services.errors import Forbidden, NotFound, Unauthorized

# Many edges poll every ~2 s; build the snapshot at most this often per API process.
_SNAPSHOT_MAX_AGE_S = 1.0


def edge_guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Before the body is read (guards run first), so an unauthenticated body is never decoded."""
    expected = connection.app.state.settings.edge_token.get_secret_value()
    if not expected:
        raise Forbidden("the edge API is disabled: set NIMBUS_EDGE_TOKEN")
    token = bearer(connection)
    if token is None or not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("edge token required")


async def provide_edge() -> str:
    return "edge"  # edge_guard has authenticated the caller


class ActivationRequest(msgspec.Struct):
    pool_id: uuid.UUID
    variant_id: uuid.UUID


class EdgeController(Controller):
    path = "/internal/v1/edge"
    tags = ["internal"]
    guards = [edge_guard]
    dependencies = {"edge": Provide(provide_edge)}
    include_in_schema = False

    @get("/snapshot")
    async def snapshot(self, request: Request, state: State, db: AsyncSession, edge: str) -> Response:
        cached = getattr(state, "edge_snapshot", None)
        if cached is None or time.monotonic() - cached[0] > _SNAPSHOT_MAX_AGE_S:
            snap = await db.run_sync(edge_snapshot.build, state.settings.semantic_cache_threshold_default)
            cached = (time.monotonic(), snap["etag"], msgspec.json.encode(snap))
            state.edge_snapshot = cached
        _, etag, body = cached
        quoted = f'"{etag}"'
        if request.headers.get("if-none-match") in (quoted, etag):
            return Response(content=b"", status_code=304, headers={"ETag": quoted})
        return Response(content=body, media_type="application/json", headers={"ETag": quoted})

    @post("/activate", status_code=202)
    async def activate(self, db: AsyncSession, edge: str, data: ActivationRequest) -> dict[str, str]:
        pool = await db.run_sync(edge_snapshot.request_activation, data.pool_id, data.variant_id)
        if pool is None:
            raise NotFound("pool", data.pool_id)
        return {"status": "activation requested"}
