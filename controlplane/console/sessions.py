"""Console sessions: start, load, end; cookies; CSRF; the sealed playground key.

The cookie carries a random token only. The row is found by the token's SHA-256, so a database
dump cannot be replayed as a cookie. Every state-changing request must echo the session's CSRF
token (synchronizer pattern) on top of SameSite=Strict cookies.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import os
import secrets
import uuid
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from litestar.datastructures import Cookie
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.types import utcnow
from controlplane.models import ApiKey, TenantStatus
from controlplane.models.console import ConsoleSession
from controlplane.schemas.tenancy import KeyCreate
from controlplane.services import keys, tenants
from controlplane.services.errors import NotFound
from controlplane.services.principal import Principal
from controlplane.services.secrets import sha256_hex

TENANT_COOKIE = "nimbus_console"
OPERATOR_COOKIE = "nimbus_operator"
LOGIN_CSRF_COOKIE = "nimbus_login_csrf"
COOKIE_PATH = "/console"
SESSION_TTL = dt.timedelta(hours=8)
PLAYGROUND_KEY_TTL = dt.timedelta(hours=1)
PLAYGROUND_KEY_NAME = "console-session"
# Renew the playground key when less than this is left, so a stream never starts on a dying key.
_RENEW_MARGIN = dt.timedelta(minutes=5)


def cookie(name: str, value: str, max_age: int | None) -> Cookie:
    # Secure is always set: browsers still accept it on http://localhost and http://127.0.0.1.
    return Cookie(key=name, value=value, max_age=max_age, path=COOKIE_PATH, httponly=True, secure=True,
                  samesite="strict")


def expired_cookie(name: str) -> Cookie:
    return cookie(name, "", 0)


@dataclass(frozen=True)
class Live:
    """A loaded session plus the browser's token (needed to unseal the playground key)."""

    row: ConsoleSession
    token: str

    @property
    def principal(self) -> Principal:
        if self.row.kind == "operator":
            return Principal(kind="admin")
        return Principal(kind="tenant", tenant_id=self.row.tenant_id, key_id=self.row.signin_key_id,
                         key_prefix=self.row.signin_label, scopes=frozenset(self.row.scopes))


async def start(db: AsyncSession, *, kind: str, tenant_id: uuid.UUID | None = None,
                signin_key_id: uuid.UUID | None = None, signin_label: str = "",
                scopes: frozenset[str] = frozenset()) -> Live:
    """A brand-new session (a fresh token at every sign-in, so a planted cookie is useless)."""
    token = secrets.token_urlsafe(32)
    row = ConsoleSession(
        token_sha256=sha256_hex(token), kind=kind, tenant_id=tenant_id, signin_key_id=signin_key_id,
        signin_label=signin_label, scopes=sorted(scopes), csrf_token=secrets.token_urlsafe(32),
        expires_at=utcnow() + SESSION_TTL,
    )
    db.add(row)
    await db.flush()
    return Live(row, token)


async def load(db: AsyncSession, token: str | None, kind: str) -> Live | None:
    """The live session for this cookie, or None if it is unknown, expired, or its grounds are gone
    (tenant deleted or suspended, sign-in key revoked or expired)."""
    if not token:
        return None
    row = await db.scalar(
        select(ConsoleSession).where(
            ConsoleSession.token_sha256 == sha256_hex(token), ConsoleSession.kind == kind,
            ConsoleSession.expires_at > utcnow(),
        )
    )
    if row is None:
        return None
    if kind == "tenant":
        try:
            tenant = await tenants.get(db, row.tenant_id)
        except NotFound:
            return None
        if tenant.status != TenantStatus.active:
            return None
        if row.signin_key_id is not None:
            key = await db.get(ApiKey, row.signin_key_id)
            if key is None or key.revoked_at is not None or (key.expires_at and key.expires_at <= utcnow()):
                return None
    return Live(row, token)


async def end(db: AsyncSession, live: Live) -> None:
    """Sign out: the playground key is revoked with the session, not left to expire."""
    if live.row.playground_key_id is not None:
        await keys.revoke(db, live.principal, live.row.tenant_id, live.row.playground_key_id)
    await db.execute(delete(ConsoleSession).where(ConsoleSession.id == live.row.id))


async def sweep_expired(db: AsyncSession) -> int:
    """Deletes expired sessions (their playground keys have expired on their own by then)."""
    result = await db.execute(delete(ConsoleSession).where(ConsoleSession.expires_at <= utcnow()))
    return result.rowcount or 0


def csrf_ok(live: Live, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(presented.encode(), live.row.csrf_token.encode())


# ---------------------------------------------------------------- the playground key
def _aead(token: str) -> AESGCM:
    return AESGCM(hashlib.sha256(b"nimbus-console-seal\0" + token.encode()).digest())


def seal(live: Live, secret: str) -> str:
    nonce = os.urandom(12)
    sealed = _aead(live.token).encrypt(nonce, secret.encode(), live.row.id.bytes)
    return base64.urlsafe_b64encode(nonce + sealed).decode()


def unseal(live: Live, blob: str) -> str:
    raw = base64.urlsafe_b64decode(blob.encode())
    return _aead(live.token).decrypt(raw[:12], raw[12:], live.row.id.bytes).decode()


async def playground_key(db: AsyncSession, live: Live) -> tuple[str, dt.datetime]:
    """The session's inference key (secret, created_at), minted or renewed when needed.

    It has the inference scope only and a one-hour expiry; a renewal revokes the old one.
    """
    row = live.row
    if row.playground_key_id is not None and row.playground_key_sealed:
        key = await db.get(ApiKey, row.playground_key_id)
        if key is not None and key.revoked_at is None and key.expires_at - utcnow() > _RENEW_MARGIN:
            return unseal(live, row.playground_key_sealed), key.created_at
        if key is not None:
            await keys.revoke(db, live.principal, row.tenant_id, key.id)
    key, secret = await keys.create(
        db, live.principal, row.tenant_id,
        KeyCreate(name=PLAYGROUND_KEY_NAME, scopes=["inference"], expires_at=utcnow() + PLAYGROUND_KEY_TTL),
    )
    row.playground_key_id = key.id
    row.playground_key_sealed = seal(live, secret)
    await db.flush()
    return secret, key.created_at
