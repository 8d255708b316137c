"""Spare replicas on the fleet tick, on Postgres (``controlplane.fleet.spares``): free GPU slots of
billed nodes fill with spares, a scale-up promotes them before placing anything, a scale-down
keeps warm replicas as spares where their node stays, placement and consolidation evict them, a
node holding only spares is released, and a pool at zero keeps none.

The fleet is seeded straight into the database by the reconcile bench (ready 8-GPU nodes with
live-looking agents hosting ready 1-GPU replicas), as in test_reconcile.py.
"""

from __future__ import annotations

from sqlalchemy import select, update

from bench.controlplane.reconcile import seed
from controlplane.db.engine import session_scope
from controlplane.models import Node, NodeState, Replica, ReplicaDesiredState, ReplicaState
from controlplane.services.fleet import replica_out
from tests.provisioning.helpers import tick
from tests.provisioning.test_gpu_packing import assert_no_gpu_twice
from tests.provisioning.test_reconcile import set_desired

RUN, STOP = ReplicaDesiredState.running, ReplicaDesiredState.stopped


def replicas(settings, pool_id) -> list[Replica]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Replica).where(Replica.pool_id == pool_id).order_by(Replica.created_at)))


def wanted(settings, pool_id, *, spare: bool) -> list[Replica]:
    return [r for r in replicas(settings, pool_id) if r.desired_state == RUN and r.spare == spare
            and r.state not in (ReplicaState.stopped, ReplicaState.failed)]


def agents_report_ready(settings) -> None:
    """What the agents report once the engines they were told to start are up."""
    with session_scope(settings) as s:
        s.execute(update(Replica).where(Replica.desired_state == RUN, Replica.state == ReplicaState.pending)
                  .values(state=ReplicaState.ready))


def agents_report_stopped(settings) -> None:
    with session_scope(settings) as s:
        s.execute(update(Replica).where(Replica.desired_state == STOP).values(state=ReplicaState.stopped))


def test_free_slots_fill_with_spares_and_a_scale_up_promotes_them_before_placing(settings):
    [pool] = seed(settings, 1, 3).pool_ids  # 3 replicas on one 8-GPU node: 5 GPUs billed and idle
    result = tick(settings)
    assert (result.spares, result.placed, result.launched, result.stopped) == (5, 0, 0, 0)
    spares = wanted(settings, pool, spare=True)
    assert sorted(g for r in spares for g in r.gpu_ids) == [3, 4, 5, 6, 7]
    assert len(wanted(settings, pool, spare=False)) == 3  # the pool's size is unchanged
    assert all(replica_out(r).spare for r in spares)  # the admin API says which ones are spares
    agents_report_ready(settings)
    assert tick(settings).spares == 0  # full: nothing more to fill

    set_desired(settings, pool, 5)
    result = tick(settings)
    assert (result.promoted, result.placed, result.launched) == (2, 0, 0)  # two replicas ready at once
    assert len(wanted(settings, pool, spare=False)) == 5 and len(wanted(settings, pool, spare=True)) == 3

    # Past what spares hold: the three left are promoted and the rest placed on a new node, never
    # onto the GPUs the promoted ones hold.
    set_desired(settings, pool, 10)
    result = tick(settings)
    assert (result.promoted, result.placed, result.launched) == (3, 2, 1)
    assert len(wanted(settings, pool, spare=False)) == 10 and wanted(settings, pool, spare=True) == []
    assert_no_gpu_twice(settings)


def test_a_scale_down_keeps_warm_replicas_as_spares_until_placement_wants_their_gpus(settings):
    a, b = seed(settings, 2, 4).pool_ids  # a full 8-GPU node: four replicas of each pool
    set_desired(settings, a, 2)
    result = tick(settings)
    assert (result.demoted, result.stopped, result.spares) == (2, 0, 0)
    kept = wanted(settings, a, spare=True)
    assert len(kept) == 2 and all(r.state == ReplicaState.ready for r in kept)  # still serving

    set_desired(settings, b, 6)
    result = tick(settings)
    assert (result.placed, result.evicted, result.launched) == (2, 2, 0)  # into the spares' GPUs, no new VM
    evicted = [r for r in replicas(settings, a) if r.spare and r.desired_state == STOP]
    assert len(evicted) == 2 and all(r.stop_reason.startswith("evicted: its GPUs were placed") for r in evicted)
    new = [r for r in wanted(settings, b, spare=False) if r.state == ReplicaState.pending]
    assert sorted(g for r in new for g in r.gpu_ids) == sorted(g for r in evicted for g in r.gpu_ids)
    assert_no_gpu_twice(settings)  # the new engines wait on their agent for the spares to stop


def test_turning_spares_off_stops_those_there_are(settings):
    [pool] = seed(settings, 1, 2).pool_ids
    assert tick(settings).spares == 4  # twice its two replicas' capacity
    off = settings.model_copy(update={"spare_replicas_enabled": False})
    result = tick(off)
    assert (result.stopped, result.spares) == (4, 0)
    assert wanted(settings, pool, spare=True) == [] and len(wanted(settings, pool, spare=False)) == 2
    assert {r.stop_reason for r in replicas(settings, pool) if r.spare} == {"spare replicas are turned off"}


def test_a_node_holding_only_spares_is_released_and_a_pool_at_zero_keeps_none(settings):
    settings = settings.model_copy(update={"empty_node_ttl_s": 0})
    [pool] = seed(settings, 1, 9).pool_ids  # 8 replicas on one node, 1 on another
    tick(settings)  # the second node's 7 idle GPUs take spares
    agents_report_ready(settings)
    by_node: dict = {}
    for r in wanted(settings, pool, spare=False) + wanted(settings, pool, spare=True):
        by_node.setdefault(r.node_id, []).append(r)
    [(lone_node, on_lone)] = [(n, rs) for n, rs in by_node.items() if sum(not r.spare for r in rs) == 1]
    assert sum(r.spare for r in on_lone) == 7

    set_desired(settings, pool, 8)  # the surplus is the lone replica: its node would hold only spares
    result = tick(settings)
    assert (result.stopped, result.demoted) == (1, 0)
    agents_report_stopped(settings)  # the lone replica drained: what is left there is spares only
    # They serve, so they drain before their node goes: never a VM terminated under live engines.
    assert tick(settings).terminated == 0
    with session_scope(settings) as s:
        left = s.scalars(select(Replica).where(Replica.node_id == lone_node, Replica.spare.is_(True))).all()
        assert len(left) == 7 and all(r.desired_state == STOP and r.state == ReplicaState.draining for r in left)
        assert all(r.stop_reason.startswith("its node is released") for r in left)
    agents_report_stopped(settings)
    assert tick(settings).terminated == 1
    with session_scope(settings) as s:
        assert s.get(Node, lone_node).state in (NodeState.terminating, NodeState.terminated)
        assert all(r.state in (ReplicaState.stopped, ReplicaState.failed) or r.desired_state == STOP
                   for r in s.scalars(select(Replica).where(Replica.node_id == lone_node)))

    set_desired(settings, pool, 0)
    tick(settings)
    assert wanted(settings, pool, spare=True) == [] and wanted(settings, pool, spare=False) == []


def test_a_node_whose_replica_has_a_warm_spare_elsewhere_is_emptied_by_promotion(settings):
    """A lone replica on one node, a ready spare of its pool on a node that stays billed for
    others: the spare takes over (no copy loads anywhere), the lone replica stays on as a spare,
    and its node, holding only spares, drains them and goes. The pool keeps its size throughout."""
    settings = settings.model_copy(update={"empty_node_ttl_s": 0})
    [pool] = seed(settings, 1, 9).pool_ids  # 8 replicas on one node, 1 on another
    with session_scope(settings) as s:
        rows = list(s.scalars(select(Replica).where(Replica.pool_id == pool)))
        by_node: dict = {}
        for r in rows:
            by_node.setdefault(r.node_id, []).append(r)
        [(full_node, on_full)] = [(n, rs) for n, rs in by_node.items() if len(rs) == 8]
        [lone_node] = [n for n in by_node if n != full_node]
        gone = on_full[0]  # one engine of the full node ended: a GPU there is free
        gone.desired_state, gone.state = STOP, ReplicaState.stopped
    set_desired(settings, pool, 8)
    result = tick(settings)  # spares on the free GPUs of both nodes, still loading: nothing swaps
    assert result.swapped == 0 and result.spares == 8
    agents_report_ready(settings)

    result = tick(settings)
    assert result.swapped == 1
    regular = wanted(settings, pool, spare=False)
    assert len(regular) == 8 and all(r.node_id == full_node for r in regular)  # the pool keeps its size
    with session_scope(settings) as s:
        on_lone = s.scalars(select(Replica).where(Replica.node_id == lone_node)).all()
        # everything there is a spare now, draining before its node goes
        assert all(r.spare for r in on_lone)
        assert all(r.desired_state == STOP for r in on_lone)
    agents_report_stopped(settings)
    assert tick(settings).terminated == 1
    with session_scope(settings) as s:
        assert s.get(Node, lone_node).state in (NodeState.terminating, NodeState.terminated)
    assert_no_gpu_twice(settings)
