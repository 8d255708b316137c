"""Dependencies: the database session and who the caller is."""

from __future__ import annotations

import hmac
from collections.abc import AsyncGenerator

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.config import Settings
from controlplane.services.errors import Forbidden, Unauthorized
from controlplane.services.keys import KeyVerifier
from controlplane.services.principal import ADMIN, Principal


async def provide_db(state: State) -> AsyncGenerator[AsyncSession, None]:
    """One transaction per request: committed when the handler returns, rolled back if it raises."""
    async with state.sessionmaker() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        else:
            await session.commit()


def bearer(request: ASGIConnection) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def admin_guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Runs before every admin route, whether or not the handler asks for the principal."""
    expected = connection.app.state.settings.admin_token.get_secret_value()
    token = bearer(connection)
    if not expected:
        raise Forbidden("the admin API is disabled: set NIMBUS_ADMIN_TOKEN")
    if token is None or not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("admin token required")


async def provide_admin() -> Principal:
    return ADMIN  # admin_guard has already authenticated the caller


async def provide_tenant(request: Request, db: AsyncSession, key_verifier: KeyVerifier) -> Principal:
    return await key_verifier.verify(db, bearer(request), scope="manage")


async def provide_settings(state: State) -> Settings:
    return state.settings


async def provide_key_verifier(state: State) -> KeyVerifier:
    return state.key_verifier
