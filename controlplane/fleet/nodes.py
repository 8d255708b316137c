"""The one place a node changes state.

Every transition is checked against ALLOWED, stamped into ``state_times`` and written to the
audit log, so a node's history can always be reconstructed and no code path can, say, revive
a terminated node or skip draining.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from controlplane.db.types import utcnow
from controlplane.models import AuditEvent, Node, NodeState, Replica, ReplicaDesiredState, ReplicaState

S = NodeState
ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    S.pending: frozenset({S.provisioning, S.terminating, S.failed}),
    S.provisioning: frozenset({S.booting, S.ready, S.terminating, S.failed}),
    S.booting: frozenset({S.ready, S.draining, S.terminating, S.failed}),
    S.ready: frozenset({S.draining, S.terminating, S.failed}),
    S.draining: frozenset({S.terminating, S.failed}),
    S.terminating: frozenset({S.terminated, S.failed}),
    S.terminated: frozenset(),
    # A failed node may still own a VM: it must go through terminating to release it.
    S.failed: frozenset({S.terminating, S.terminated}),
}
LIVE_STATES = frozenset({S.pending, S.provisioning, S.booting, S.ready, S.draining})
# A node leaving the fleet takes its engines with it: its replicas stop being wanted or routed.
ENDS_REPLICAS = {S.terminating: ReplicaState.stopped, S.terminated: ReplicaState.stopped,
                  S.failed: ReplicaState.failed}


class IllegalTransition(Exception):
    def __init__(self, node: Node, to: NodeState) -> None:
        super().__init__(f"node {node.id}: {node.state.value} → {to.value} is not allowed")
        self.node, self.to = node, to


def can_transition(current: NodeState, to: NodeState) -> bool:
    return to in ALLOWED[current]


def transition(session: Session, node: Node, to: NodeState, *, reason: str = "", actor: str = "system",
               error: str | None = None) -> bool:
    """Moves ``node`` to ``to``. Returns False (and changes nothing) if it is already there;
    raises IllegalTransition for a move the table forbids."""
    if node.state == to:
        return False
    if not can_transition(node.state, to):
        raise IllegalTransition(node, to)
    now = utcnow()
    before = node.state
    node.state = to
    node.state_times = {**(node.state_times or {}), to.value: now.isoformat()}
    if error is not None:
        node.error = error[:2000]
    if (ended := ENDS_REPLICAS.get(to)) is not None:
        session.execute(
            update(Replica)
            .where(Replica.node_id == node.id, Replica.state.not_in([ReplicaState.stopped, ReplicaState.failed]))
            .values(state=ended, desired_state=ReplicaDesiredState.stopped)
            .execution_options(synchronize_session="fetch")
        )
    session.add(
        AuditEvent(
            actor=actor,
            action=f"node.{to.value}",
            target_type="nodes",
            target_id=str(node.id),
            before={"state": before.value},
            after={"state": to.value, "reason": reason[:500]} if reason else {"state": to.value},
        )
    )
    return True
