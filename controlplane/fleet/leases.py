"""Row leases: claim with ``SELECT … FOR UPDATE SKIP LOCKED``, apply only under the same token.

A worker claims rows in a short transaction and stamps them with a fresh token and an
expiry; it then talks to a cloud with no transaction open, and finally applies what it
learnt only if the row still carries its token (otherwise its lease expired and another
worker took over: the stale result is dropped). A crashed worker's lease simply runs
out. On SQLite ``FOR UPDATE`` is a no-op; the embedded mode runs one worker.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TypeVar

from sqlalchemy import ColumnElement, Select, or_, select
from sqlalchemy.orm import Session

from controlplane.models.fleet import Leased

L = TypeVar("L", bound=Leased)


def lease_free(model: type[Leased], now: dt.datetime) -> ColumnElement[bool]:
    return or_(model.lock_expires_at.is_(None), model.lock_expires_at <= now)


def claimable(model: type[L], now: dt.datetime, *where: ColumnElement[bool]) -> Select[tuple[L]]:
    """Rows nobody holds, locked for this transaction; rows other transactions hold are skipped."""
    return select(model).where(lease_free(model, now), *where).with_for_update(of=model, skip_locked=True)


def stamp(rows: list[L], now: dt.datetime, seconds: float) -> uuid.UUID:
    """Give ``rows`` one fresh lease token; returns it."""
    token = uuid.uuid4()
    for row in rows:
        row.lock_token = token
        row.lock_expires_at = now + dt.timedelta(seconds=seconds)
    return token


def release(row: Leased) -> None:
    row.lock_token = None
    row.lock_expires_at = None


def held(session: Session, model: type[L], row_id: uuid.UUID, token: uuid.UUID) -> L | None:
    """The row, locked, if it still carries ``token``; ``None`` when the lease was lost.

    Equivalent to ``UPDATE … WHERE id = ? AND lock_token = ?``: the row lock taken here keeps
    anyone from re-leasing it before this transaction commits.
    """
    return session.scalar(
        select(model).where(model.id == row_id, model.lock_token == token).with_for_update(of=model)
    )
