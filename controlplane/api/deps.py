"""Dependencies: the database session and who the caller is."""

from __future__ import annotations

import hmac
from collections.abc import AsyncGenerator

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api import signin
from controlplane.config import Settings
from controlplane.services.errors import Forbidden, Unauthorized
from controlplane.services.keys import KeyVerifier
from controlplane.services.principal import ADMIN, Principal
from controlplane.services.signin_throttle import Subject

# Authentication runs in guards: Litestar calls a route's guards before it reads and decodes the
# body (``data``) and before it resolves dependencies, so a caller without valid credentials gets
# its 401 (or 429 while throttled) without the body being read.


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


async def admin_guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Runs before every admin route, whether or not the handler asks for the principal. Failed
    tokens are throttled and audited like the console's operator sign-in."""
    expected = connection.app.state.settings.admin_token.get_secret_value()
    token = bearer(connection)
    if not expected:
        raise Forbidden("the admin API is disabled: set NIMBUS_ADMIN_TOKEN")
    if token is None:
        raise Unauthorized("admin token required")
    sub = Subject("admin_token", "admin", signin.caller_address(connection))
    begun = await signin.begin(connection, sub, precount=False)
    if not hmac.compare_digest(token.encode(), expected.encode()):
        verdict = await signin.throttle(connection).failed(sub, begun)
        await signin.audit_api_failure(connection, sub, verdict, reason="bad admin token")
        raise Unauthorized("admin token required")
    await signin.throttle(connection).succeeded(sub, begun)


async def provide_admin() -> Principal:
    return ADMIN  # admin_guard has already authenticated the caller


async def tenant_guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Tenant API: the key is verified (in its own session) before the body is read; failed keys
    are throttled and audited like keys tried at the console."""
    secret = bearer(connection)
    if secret is None:
        raise Unauthorized("missing or malformed API key")
    sub = Subject("api_key", signin.api_key_account(secret), signin.caller_address(connection))
    begun = await signin.begin(connection, sub, precount=False)
    verifier: KeyVerifier = connection.app.state.key_verifier
    try:
        async with connection.app.state.sessionmaker() as db:
            principal = await verifier.verify(db, secret, scope="manage")
    except Unauthorized as exc:
        verdict = await signin.throttle(connection).failed(sub, begun)
        await signin.audit_api_failure(connection, sub, verdict, reason=exc.detail)
        raise
    await signin.throttle(connection).succeeded(sub, begun)
    connection.state.principal = principal


async def provide_tenant(request: Request) -> Principal:
    return request.state.principal  # set by tenant_guard


async def provide_settings(state: State) -> Settings:
    return state.settings


async def provide_key_verifier(state: State) -> KeyVerifier:
    return state.key_verifier
