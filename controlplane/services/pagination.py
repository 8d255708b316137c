from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession


async def paginate(session: AsyncSession, stmt: Select, limit: int, offset: int) -> tuple[list[Any], int]:
    """One page of ``stmt`` plus the total count of rows it matches."""
    total = await session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery()))
    rows = (await session.scalars(stmt.limit(limit).offset(offset))).unique().all()
    return list(rows), int(total or 0)
