"""A replica moved once is moved again: the tick must go on. Its row still names the original of
its first move (``replaces_id``), which has long left the fleet; while the second move is in flight
it is an end of that move. Until this was fixed, consolidation looked that first original up and
every tick raised KeyError (the whole fleet tick, every pool, for as long as the move lasted).
Found by the differential check (bench/controlplane/reconcile_diff.py, SQLite seed 7, case 65)."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import insert, select, update

from bench.controlplane.reconcile import seed
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import reconcile
from controlplane.models import Replica, ReplicaDesiredState, ReplicaState


def test_a_replica_moved_before_can_be_moved_again(settings):
    settings = settings.model_copy(update={"consolidation_enabled": True, "consolidation_settle_s": 0})
    seeded = seed(settings, 1, 2)  # one pool, two ready replicas on one ready 8-GPU node
    now = utcnow()
    with session_scope(settings) as s:
        moved_before, other = s.scalars(select(Replica).order_by(Replica.gpu_ids)).all()
        # Its first move is over: that original stopped and left the fleet's reads.
        s.execute(update(Replica).where(Replica.id == moved_before.id).values(replaces_id=uuid.uuid4()))
        copy = {c.key: getattr(moved_before, c.key) for c in Replica.__table__.columns}
        copy.update(id=uuid.uuid4(), replaces_id=moved_before.id, state=ReplicaState.pending, gpu_ids=[5],
                    url=None, port=None, created_at=now - dt.timedelta(seconds=10), updated_at=now)
        s.execute(insert(Replica), [copy])
    with session_scope(settings) as s:
        result = reconcile.fleet_tick(s, settings, now)
    assert not result.skipped and (result.placed, result.stopped, result.moves) == (0, 0, 0)
    with session_scope(settings) as s:
        states = {r.id: (r.state, r.desired_state) for r in s.scalars(select(Replica))}
    running = ReplicaDesiredState.running
    assert states == {moved_before.id: (ReplicaState.ready, running), other.id: (ReplicaState.ready, running),
                      copy["id"]: (ReplicaState.pending, running)}
    assert len(seeded.node_ids) == 1
