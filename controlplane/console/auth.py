"""Who is at the console: sign-in checks and the dependencies that load a session per request."""

from __future__ import annotations

import hmac

from litestar import Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.config import Settings
from controlplane.console import sessions
from controlplane.models import Tenant, TenantStatus
from controlplane.services.errors import ServiceError
from controlplane.services.keys import KeyVerifier
from controlplane.services.principal import Principal
from controlplane.services.secrets import hash_password, sha256_hex, verify_password

# Compared against when the email is unknown, so a miss costs the same scrypt time as a hit.
_DUMMY_HASH = hash_password("not-a-real-password")


class SignInRequired(Exception):
    """Raised by the session dependencies; the console answers with a redirect to sign-in."""

    def __init__(self, login_path: str) -> None:
        super().__init__(login_path)
        self.login_path = login_path


class CsrfRejected(Exception):
    pass


async def tenant_by_key(db: AsyncSession, verifier: KeyVerifier, secret: str) -> Principal | None:
    """A key may open the console only if it holds the 'manage' scope."""
    try:
        return await verifier.verify(db, secret.strip(), scope="manage")
    except ServiceError:
        return None


async def tenant_by_password(db: AsyncSession, email: str, password: str) -> Tenant | None:
    return (await check_password(db, email, password))[1]


async def check_password(db: AsyncSession, email: str, password: str) -> tuple[Tenant | None, Tenant | None]:
    """(the tenant holding this email, if any; that tenant if the password is right and it is active)."""
    tenant = await db.scalar(
        select(Tenant).where(Tenant.email == email.strip().lower(), Tenant.deleted_at.is_(None))
    )
    ok = verify_password(password, tenant.password_hash if tenant else _DUMMY_HASH)
    if tenant is None or not ok or tenant.status != TenantStatus.active:
        return tenant, None
    return tenant, tenant


def admin_token_ok(settings: Settings, presented: str) -> bool:
    expected = settings.admin_token.get_secret_value()
    return bool(expected) and hmac.compare_digest(presented.strip().encode(), expected.encode())


def admin_token_fingerprint(settings: Settings) -> str:
    """Stored with an operator session so that rotating (or clearing) the admin token ends it."""
    return sha256_hex("nimbus-operator-session\0" + settings.admin_token.get_secret_value())[:32]


async def provide_tenant_session(request: Request, db: AsyncSession) -> sessions.Live:
    live = await sessions.load(db, request.cookies.get(sessions.TENANT_COOKIE), "tenant")
    if live is None:
        raise SignInRequired("/console/login")
    return live


async def provide_operator_session(request: Request, db: AsyncSession) -> sessions.Live:
    live = await sessions.load(db, request.cookies.get(sessions.OPERATOR_COOKIE), "operator")
    settings = request.app.state.settings
    if live is None or not settings.admin_token.get_secret_value() or not hmac.compare_digest(
        live.row.signin_label, admin_token_fingerprint(settings)
    ):
        raise SignInRequired("/console/admin/login")
    return live


async def checked_form(request: Request, live: sessions.Live) -> dict[str, str]:
    """The submitted form, after its CSRF token (form field or X-CSRF-Token header) is verified."""
    form = await request.form()
    presented = request.headers.get("x-csrf-token") or form.get("_csrf")
    if not sessions.csrf_ok(live, presented):
        raise CsrfRejected()
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def checked_login_form(request: Request) -> dict[str, str]:
    """Sign-in forms have no session yet: a double-submit token guards them against login CSRF."""
    form = await request.form()
    cookie = request.cookies.get(sessions.LOGIN_CSRF_COOKIE) or ""
    presented = form.get("_csrf") or ""
    if not cookie or not isinstance(presented, str) or not hmac.compare_digest(cookie.encode(), presented.encode()):
        raise CsrfRejected()
    return {k: v for k, v in form.items() if isinstance(v, str)}
