"""Node state machine: the table is enforced and every move is stamped and audited."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.fleet.nodes import ALLOWED, IllegalTransition, transition
from controlplane.models import (
    AuditEvent,
    Cloud,
    Model,
    ModelVariant,
    Node,
    NodeState,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)


@pytest.fixture
def node(settings):
    with session_scope(settings) as s:
        s.add(Cloud(name="aws"))
        m = Model(name=f"m-{uuid.uuid4().hex[:6]}", variants=[
            ModelVariant(tier="bf16", model_path="x", gpu_memory_gb=10, context_length=10)])
        s.add(m)
        s.flush()
        p = Pool(name=f"p-{uuid.uuid4().hex[:6]}", variant_id=m.variants[0].id)
        s.add(p)
        s.flush()
        n = Node(launch_token=uuid.uuid4().hex, gpus_total=2)
        s.add(n)
        s.flush()
        s.add(Replica(node_id=n.id, pool_id=p.id, variant_id=p.variant_id, state=ReplicaState.ready, gpu_ids=[0]))
        return n.id


def test_happy_path_is_stamped_and_audited(settings, node) -> None:
    path = [NodeState.provisioning, NodeState.booting, NodeState.ready, NodeState.draining,
            NodeState.terminating, NodeState.terminated]
    with session_scope(settings) as s:
        n = s.get(Node, node)
        for to in path:
            assert transition(s, n, to, reason="test")
        assert transition(s, n, NodeState.terminated) is False  # idempotent
    with session_scope(settings) as s:
        n = s.get(Node, node)
        assert n.state == NodeState.terminated
        assert set(n.state_times) == {p.value for p in path}
        actions = s.scalars(select(AuditEvent.action).where(AuditEvent.target_id == str(node))).all()
        assert sorted(actions) == sorted(f"node.{p.value}" for p in path)


@pytest.mark.parametrize("frm,to", [
    (NodeState.terminated, NodeState.ready),
    (NodeState.ready, NodeState.provisioning),
    (NodeState.draining, NodeState.ready),
    (NodeState.pending, NodeState.ready),
])
def test_illegal_moves_raise(settings, node, frm, to) -> None:
    with session_scope(settings) as s:
        n = s.get(Node, node)
        n.state = frm
        with pytest.raises(IllegalTransition):
            transition(s, n, to)


def test_terminated_is_final_and_every_live_state_can_terminate() -> None:
    assert ALLOWED[NodeState.terminated] == frozenset()
    for state, targets in ALLOWED.items():
        if state not in (NodeState.terminated, NodeState.terminating):
            assert NodeState.terminating in targets or NodeState.terminated in targets


@pytest.mark.parametrize("to, ended", [(NodeState.terminating, ReplicaState.stopped),
                                       (NodeState.failed, ReplicaState.failed)])
def test_a_node_leaving_the_fleet_takes_its_replicas_with_it(settings, node, to, ended) -> None:
    """Its engines go with the VM: the replicas stop being routed (the edge snapshot reads ready
    replicas) and wanted (the fleet tick places replacements)."""
    with session_scope(settings) as s:
        n = s.get(Node, node)
        n.state = NodeState.ready
        transition(s, n, to, reason="test")
    with session_scope(settings) as s:
        [r] = s.scalars(select(Replica).where(Replica.node_id == node)).all()
        assert (r.state, r.desired_state) == (ended, ReplicaDesiredState.stopped)
