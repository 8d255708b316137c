"""The fleet tick's reads and row writes on Postgres: the fleet is read as plain rows (never an ORM
object per pool, node or replica), the rows equal what the ORM reads, the changes to them are
written in batches, and a node released in the tick ends its replicas whatever was recorded for
them before. The random fleets come from the differential check (bench/controlplane/reconcile_diff.py).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter

import pytest
from sqlalchemy import event, select

from bench.controlplane.reconcile import churn, measure_tick, reset, seed
from bench.controlplane.reconcile_diff import NOW, seed_case
from controlplane.db.engine import session_scope, sync_sessionmaker
from controlplane.db.types import utcnow
from controlplane.fleet import reads, reconcile, writes
from controlplane.models import (
    AuditEvent,
    Node,
    NodeState,
    Operation,
    OperationKind,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from tests.conftest import truncate_all

FLEET_CLASSES = {"Pool", "Node", "Replica", "ModelVariant"}


def loaded_by_class(settings, run) -> Counter:
    """ORM objects loaded (by class name) while ``run(session)`` runs in one session."""
    loaded: Counter = Counter()
    with session_scope(settings) as s:
        event.listen(s, "loaded_as_persistent", lambda session, obj: loaded.update([type(obj).__name__]))
        run(s)
    return loaded


def test_a_tick_loads_no_pool_node_or_replica_as_an_orm_object(settings):
    """The fleet is read column-only: a steady tick at 30 pools × 4 replicas (15 nodes) loads the
    catalog's rows and nothing else, in ten statements; a churn tick (replicas placed and told to
    stop, new nodes) loads no fleet row either. Before, every pool, node and replica was an ORM
    object (136 here), and the session's flush scanned them all."""
    seeded = seed(settings, 30, 4)
    measure_tick(settings)  # warm-up
    reset(settings, seeded)
    steady = loaded_by_class(settings, lambda s: reconcile.fleet_tick(s, settings, utcnow()))
    assert not FLEET_CLASSES & set(steady), steady
    reset(settings, seeded)
    assert measure_tick(settings).statements == 10
    reset(settings, seeded)
    churn(settings, seeded, 0.2, random.Random(3))
    churned = {}

    def run(s):
        churned["result"] = reconcile.fleet_tick(s, settings, utcnow())

    loaded = loaded_by_class(settings, run)
    result = churned["result"]  # the shrinking pools' replicas stay as spares, the new ones take their GPUs
    assert (result.placed, result.stopped + result.demoted) == (6, 6)
    assert not FLEET_CLASSES & set(loaded), loaded


@pytest.mark.parametrize("case", range(12))
def test_the_fleet_rows_equal_what_the_orm_reads(settings, db_url, case):
    """For random fleets (every node state, partial launch specs, moves, stopped replicas), the
    rows the tick reads hold exactly the values of the ORM objects it used to load, in the same
    order (pools and replicas by id), and no more rows."""
    with session_scope(settings) as s:
        seed_case(s, random.Random(f"reads:{case}"))
    with session_scope(settings) as s:
        fleet = reads.read_fleet(s)
        pools = s.scalars(select(Pool).order_by(Pool.id)).all()
        nodes = {n.id: n for n in s.scalars(select(Node).where(Node.state.in_(reads.FLEET_NODE_STATES)))}
        replicas = s.scalars(select(Replica).where(Replica.node_id.in_(list(nodes)),
                                                   Replica.state.not_in(reads.ENDED)).order_by(Replica.id)).all()
        assert list(fleet.pools) == [p.id for p in pools]
        for p in pools:
            row = fleet.pools[p.id]
            for c in reads.POOL_COLUMNS:
                source = p.variant if c.table.name == "model_variants" else p
                assert getattr(row, c.key) == getattr(source, c.key), c.key
        assert set(fleet.nodes) == set(nodes)
        for node_id, n in nodes.items():
            row = fleet.nodes[node_id]
            assert [getattr(row, c.key) for c in reads.NODE_COLUMNS] == [
                frozenset(getattr(n, c.key)) if c.key == "cached_models" else getattr(n, c.key)
                for c in reads.NODE_COLUMNS]
            assert row.key == str(n.id) and not row.metrics_loaded
        reads.load_node_metrics(s, fleet.nodes.values())
        assert {k: n.metrics for k, n in fleet.nodes.items()} == {k: n.metrics for k, n in nodes.items()}
        assert [r.id for r in fleet.replicas] == [r.id for r in replicas]
        for row, r in zip(fleet.replicas, replicas, strict=True):
            for c in reads.REPLICA_COLUMNS:
                expected = getattr(r, c.key)
                assert getattr(row, c.key) == (tuple(expected) if c.key == "gpu_ids" else expected), c.key
            assert (row.key, row.pool_key) == (str(r.id), str(r.pool_id))
        by_node = fleet.on_node()
        assert {k: [r.id for r in v] for k, v in by_node.items()} == {
            k: [r.id for r in replicas if r.node_id == k] for k in {r.node_id for r in replicas}}
    truncate_all(db_url)


def test_consolidation_reuses_the_sizing_slots_only_where_nothing_changed(settings, db_url, monkeypatch):
    """Consolidation takes the node slots sizing built unless the node or one of its replicas
    changed since (rows written, replicas placed, move ends): across random fleets and two ticks
    each, what it takes always equals the slots built afresh, and it does take some."""
    fresh = reconcile.consolidation_slots
    calls = Counter()

    def checked(fleet, shapes, in_flight, sized=None, touched=frozenset()):
        got = fresh(fleet, shapes, in_flight, sized, touched)
        want = fresh(fleet, shapes, in_flight)
        assert got == want, [(g, w) for g, w in zip(got, want, strict=True) if g != w]
        if sized is not None:
            calls["reused"] += sum(1 for s in got if any(s is b for b in sized[0].values()))
        calls["slots"] += len(got)
        return got

    monkeypatch.setattr(reconcile, "consolidation_slots", checked)
    moves = 0
    for case in range(25):
        with session_scope(settings) as s:
            overrides = seed_case(s, random.Random(f"slots:{case}"))
        tick_settings = settings.model_copy(update={**overrides, "consolidation_enabled": True})
        for k in range(2):
            with session_scope(tick_settings) as s:
                moves += reconcile.fleet_tick(s, tick_settings, NOW + dt.timedelta(seconds=30 * k)).moves
        truncate_all(db_url)
    assert calls["reused"] > 0 and calls["reused"] < calls["slots"], calls
    assert moves > 0


def test_row_writes_batch_by_columns_and_skip_equal_values(settings):
    """``RowWrites``: an equal value records nothing; rows given the same values share one
    ``UPDATE … WHERE id IN``; rows given different values of the same columns share one
    executemany; ``updated_at`` moves with the write, as with the ORM."""
    seeded = seed(settings, 5, 0)
    with session_scope(settings) as s:
        fleet = reads.read_fleet(s)
    rows = [fleet.pools[p] for p in seeded.pool_ids]
    changes = writes.RowWrites()
    changes.set(rows[0], desired_replicas=rows[0].desired_replicas, capacity_status=None)  # equal: nothing
    assert changes.pending() == 0 and not changes.touched
    later = NOW + dt.timedelta(minutes=1)
    for row in rows:
        changes.set(row, last_reconciled_at=later)
    for i, row in enumerate(rows[:2]):
        changes.set(row, capacity_status=f"reason {i}")
    assert changes.pending() == 5 and changes.touched == set(seeded.pool_ids)
    statements = []
    engine = sync_sessionmaker(settings).kw["bind"]
    listen = lambda conn, cur, statement, params, ctx, many: statements.append((statement, many))  # noqa: E731
    event.listen(engine, "before_cursor_execute", listen)
    try:
        with session_scope(settings) as s:
            changes.flush(s)
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert changes.pending() == 0
    assert sorted(many for _, many in statements) == [False, True], statements  # one IN, one executemany
    with session_scope(settings) as s:
        got = {p.id: (p.capacity_status, p.last_reconciled_at, p.updated_at > seeded.at)
               for p in s.scalars(select(Pool))}
    assert got == {p: (f"reason {i}" if i < 2 else None, later, True) for i, p in enumerate(seeded.pool_ids)}


def test_a_released_node_ends_its_replicas_whatever_was_recorded_for_them(settings):
    """A replica told to stop (``draining``, recorded, not written yet) on a node the same tick
    releases ends ``stopped`` with its node: the recorded drain is written before the node's
    transition ends the replicas, never after it (which would revive a drain on a VM going away).
    The node's own recorded changes go with its ORM object, in one write."""
    seeded = seed(settings, 1, 2)  # two ready replicas on one ready node with an agent
    now = utcnow()
    with session_scope(settings) as s:
        fleet = reads.read_fleet(s)
        changes = writes.RowWrites()
        [node] = fleet.nodes.values()
        first, second = fleet.replicas
        writes.stop_replica(first, fleet.nodes, now, settings, reason="scale down", changes=changes)
        assert first.state == ReplicaState.draining and changes.pending(Replica.__table__) == 1
        changes.set(node, empty_since=now)
        [op] = writes.release_nodes(s, changes, [(node, "test")], fleet.replicas, now, settings)
        assert changes.pending() == 0  # the drain was written first; the node's change went to its object
        assert node.state == NodeState.terminating
        assert [(r.state, r.desired_state) for r in fleet.replicas] == [
            (ReplicaState.stopped, ReplicaDesiredState.stopped)] * 2
        changes.flush(s)
    with session_scope(settings) as s:
        rows = {r.id: r for r in s.scalars(select(Replica))}
        assert {(r.state, r.desired_state) for r in rows.values()} == {
            (ReplicaState.stopped, ReplicaDesiredState.stopped)}
        assert rows[first.id].stop_reason == "scale down" and rows[second.id].stop_reason is None
        db_node = s.get(Node, seeded.node_ids[0])
        assert db_node.state == NodeState.terminating and db_node.empty_since == now
        assert db_node.drain_deadline_at == now
        [terminate] = s.scalars(select(Operation)).all()
        assert terminate.kind == OperationKind.terminate and terminate.node_id == db_node.id
        assert [e.action for e in s.scalars(select(AuditEvent))] == ["node.terminating"]
    assert op.kind == OperationKind.terminate


def test_the_tick_pauses_the_cyclic_collector_and_leaves_it_as_it_found_it(settings):
    import gc

    seed(settings, 2, 2)
    seen = []
    real = reconcile.read_fleet

    def spy(session):
        seen.append(gc.isenabled())
        return real(session)

    reconcile.read_fleet = spy  # (monkeypatch would do; kept explicit to restore the collector too)
    try:
        assert gc.isenabled()
        measure_tick(settings)
        assert gc.isenabled() and seen == [False]
        gc.disable()  # a caller that runs without the collector keeps it off
        measure_tick(settings)
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(RuntimeError), reconcile.collector_paused():
            raise RuntimeError("a tick that fails")
        assert gc.isenabled()
    finally:
        reconcile.read_fleet = real
        gc.enable()
