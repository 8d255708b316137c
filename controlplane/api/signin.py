"""Sign-in plumbing shared by the API guards and the console: who the caller is (address), how
an attempt is throttled, and how it is audited. The policy lives in services/signin_throttle.py."""

from __future__ import annotations

import uuid

from litestar.connection import ASGIConnection
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import ApiKey
from controlplane.services import audit
from controlplane.services.errors import TooManyAttempts, Unavailable
from controlplane.services.secrets import looks_like_api_key, sha256_hex
from controlplane.services.signin_throttle import (
    SigninThrottle,
    StoreUnavailable,
    Subject,
    Verdict,
    client_address,
)

API_KEY_PREFIX_LEN = 12  # "nmb_" + 8 id chars: the public prefix shown in listings


def caller_address(connection: ASGIConnection) -> str:
    return client_address(connection.client.host if connection.client else None)


def throttle(connection: ASGIConnection) -> SigninThrottle:
    return connection.app.state.signin_throttle


def api_key_account(secret: str) -> str:
    """The throttle's account for a presented key: its public prefix (never the secret part)."""
    secret = secret.strip()
    return secret[:API_KEY_PREFIX_LEN] if looks_like_api_key(secret) else "malformed"


def email_account(email: str) -> str:
    return email.strip().lower()[:320]


def typed_label(value: str) -> str:
    """An audit label for an account name nobody holds: a digest, since people type passwords there."""
    return "unknown:" + sha256_hex(value)[:12]


async def key_tenant(db: AsyncSession, account: str) -> uuid.UUID | None:
    """The tenant whose key carries this public prefix, for the audit row of a failed try."""
    if account == "malformed":
        return None
    return await db.scalar(select(ApiKey.tenant_id).where(ApiKey.prefix == account).limit(1))


async def begin(connection: ASGIConnection, sub: Subject, *, precount: bool) -> Verdict:
    """Refuses (429 + Retry-After) while the subject is backing off or locked."""
    try:
        verdict = await throttle(connection).begin(sub, precount=precount)
    except StoreUnavailable as exc:
        raise Unavailable("sign-in is unavailable: its throttle store cannot be reached") from exc
    if not verdict.allowed:
        raise TooManyAttempts(refusal_message(verdict), verdict.retry_after_s)
    return verdict


def wait_text(seconds: float) -> str:
    s = max(1, int(seconds + 0.999))
    if s < 90:
        return f"{s} second{'s' if s != 1 else ''}"
    m = (s + 59) // 60
    return f"{m} minute{'s' if m != 1 else ''}"


def refusal_message(verdict: Verdict) -> str:
    wait = wait_text(verdict.retry_after_s)
    if not verdict.locked:
        return f"Too many failed sign-in attempts: wait {wait} before trying again."
    if verdict.scope == "account":
        return (f"Too many failed sign-in attempts for this account from addresses it has not signed in from "
                f"before: it is locked for them for {wait}. Addresses it signed in from recently are not affected.")
    if verdict.scope == "address":
        return f"Too many failed sign-in attempts from your network address: sign-in is locked for {wait}."
    return f"Too many failed sign-in attempts: sign-in is locked for {wait}."


def failure_wait_message(verdict: Verdict) -> str:
    """After a failed try that costs a wait: what the next try must wait for."""
    wait = wait_text(verdict.retry_after_s)
    if verdict.locked:
        return refusal_message(verdict)
    return f"Wait {wait} before the next try."


async def audit_api_failure(connection: ASGIConnection, sub: Subject, verdict: Verdict, *, reason: str) -> None:
    """A failed bearer credential on a REST API, in its own transaction (guards run before the
    request's session exists)."""
    async with connection.app.state.sessionmaker() as db:
        tenant_id = await key_tenant(db, sub.account) if sub.kind == "api_key" else None
        record_failure(db, sub, verdict, channel="api", tenant_id=tenant_id, reason=reason,
                       account_label=sub.account, path=connection.url.path)
        await db.commit()


def record_failure(db: AsyncSession, sub: Subject, verdict: Verdict, *, channel: str, account_label: str,
                   tenant_id: uuid.UUID | None = None, reason: str = "bad credentials", **facts) -> None:
    common = dict(actor=f"anonymous@{sub.address}", kind=sub.kind, channel=channel, address=sub.address,
                  account=account_label, tenant_id=tenant_id)
    audit.record_signin(db, "signin.failure", **common, reason=reason, failures=verdict.failures,
                        next_try_in_s=round(verdict.retry_after_s, 1), **facts)
    if verdict.locked:
        audit.record_signin(db, "signin.locked", **common, scope=verdict.scope,
                            locked_for_s=round(verdict.retry_after_s, 1), failures=verdict.failures)


def record_success(db: AsyncSession, sub: Subject, *, actor: str, channel: str, account_label: str,
                   tenant_id: uuid.UUID | None = None, **facts) -> None:
    audit.record_signin(db, "signin.success", actor=actor, kind=sub.kind, channel=channel, address=sub.address,
                        account=account_label, tenant_id=tenant_id, **facts)
