"""The failover blocklist, stored in the database so every worker avoids the same places.

Rows are written when a launch fails (``infra.placement.block_for``) and read back as
``infra.placement.BlockEntry`` values before the next walk. Expired rows are ignored by
the query and pruned by the sweeper.

The table does not (yet) carry ``instance_type``/``spot``: a stored block therefore covers
every type and market of its zone/region. That errs on the cautious side across
operations; within one failover walk the narrow, in-memory block still lets the
on-demand fallback try the zone whose spot capacity just ran out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controlplane.models import BlockScope, CapacityBlock
from infra.placement import BlockEntry

_NARROW_COLUMNS = hasattr(CapacityBlock, "instance_type") and hasattr(CapacityBlock, "spot")


def active_blocks(session: Session, now: dt.datetime) -> list[BlockEntry]:
    rows = session.scalars(select(CapacityBlock).where(CapacityBlock.expires_at > now)).all()
    return [
        BlockEntry(
            scope=row.scope.value,
            cloud=row.cloud,
            region=row.region,
            zone=row.zone,
            expires_at=row.expires_at,
            reason=row.reason,
            instance_type=getattr(row, "instance_type", None),
            spot=getattr(row, "spot", None),
        )
        for row in rows
    ]


def add_blocks(session: Session, blocks: Iterable[BlockEntry]) -> None:
    for b in blocks:
        extra = {"instance_type": b.instance_type, "spot": b.spot} if _NARROW_COLUMNS else {}
        session.add(
            CapacityBlock(
                scope=BlockScope(b.scope),
                cloud=b.cloud,
                region=b.region,
                zone=b.zone,
                reason=b.reason[:500],
                expires_at=b.expires_at,
                **extra,
            )
        )


def earliest_expiry(blocks: Iterable[BlockEntry], now: dt.datetime) -> dt.datetime | None:
    """When the first active block lifts: the moment a blocked launch is worth retrying."""
    return min((b.expires_at for b in blocks if b.active(now)), default=None)


def prune_expired(session: Session, now: dt.datetime, keep: dt.timedelta = dt.timedelta(hours=1)) -> int:
    """Delete blocks that expired more than ``keep`` ago (kept a while for operators to read)."""
    result = session.execute(delete(CapacityBlock).where(CapacityBlock.expires_at < now - keep))
    return result.rowcount or 0
