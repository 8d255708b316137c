"""The scaffold the launcher and the terminator share: claim, act on the cloud, apply under lease.

Three steps, and no transaction is open while a cloud answers:

1. **claim** (a short transaction): lease the operation (``SKIP LOCKED``) and snapshot, detached
   from the session, everything the cloud step needs; or say why there is nothing to do;
2. **act** (no transaction): the cloud calls. It returns ``None`` when it found mid-way that its
   lease was lost (another worker owns the operation now);
3. **apply** (a short transaction): write the result, only while the operation still carries this
   worker's lease token (``leases.held``), so a stale worker's result is dropped.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.db.engine import session_scope


@dataclass(frozen=True)
class ClaimedOperation:
    """What every claimed operation carries: which one, under which lease, which attempt, for which node."""

    op_id: uuid.UUID
    lease: uuid.UUID
    attempt: int
    node_id: uuid.UUID


Job = TypeVar("Job", bound=ClaimedOperation)
Outcome = TypeVar("Outcome")


def run(settings: Settings, clock: Callable[[], dt.datetime],
        claim: Callable[[Session, dt.datetime], Job | str],
        act: Callable[[Job], Outcome | None],
        apply: Callable[[Session, Job, Outcome, dt.datetime], str]) -> str:
    """Carry one operation through the three steps. Returns what happened, for logs and tests."""
    with session_scope(settings) as session:
        job = claim(session, clock())
    if isinstance(job, str):
        return job
    outcome = act(job)
    if outcome is None:
        return "lease lost"
    with session_scope(settings) as session:
        return apply(session, job, outcome, clock())
