"""The fleet tick's row writes: new nodes, placed replicas, replica stops, consolidation records.

Each function is the one author of its change, so the rules live once: a node row and its launch
operation are written before any cloud call (write-before-launch, so the sweeper can tell ours
from leaks); a replica row exists before its agent hears of it; a replica told to stop leaves the
edge's routing at once and keeps its GPUs until its agent reports the engine stopped.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.fleet.capacity import ConsolidationAction, NewNode
from controlplane.fleet.provisioning import launch_key
from controlplane.models import (
    AutoscalerDecision,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)

R = ReplicaState


def add_node(session: Session, new: NewNode, now: dt.datetime, settings: Settings, *, pool_id: uuid.UUID | None,
             reason: str = "placement") -> tuple[Node, Operation]:
    """A pending node of the planned shape (added to the session), and its launch operation, which
    the caller adds only after the nodes are flushed: it references its node, and no relationship
    tells the flush to order them. Callers batch: every new node, one flush, every operation."""
    o = new.offer
    node = Node(
        id=uuid.uuid4(),
        state=NodeState.pending,
        spot=o.spot,
        gpus_total=o.gpu_count,
        dedicated_tenant_id=uuid.UUID(new.dedicated_tenant_id) if new.dedicated_tenant_id else None,
        launch_spec={"cloud": o.cloud, "region": o.region, "instance_type": o.instance_type, "gpu_type": o.gpu_type,
                     "gpu_count": o.gpu_count, "gpu_memory_gb": o.gpu_memory_gb, "spot": o.spot,
                     "price_per_hour": o.price_per_hour, "zones": list(new.zones), "reason": reason[:200]},
        launch_token=uuid.uuid4().hex,
        state_times={NodeState.pending.value: now.isoformat()},
        metrics={},
    )
    session.add(node)
    op = Operation(
        id=uuid.uuid4(),
        kind=OperationKind.launch,
        state=OperationState.pending,
        pool_id=pool_id,
        node_id=node.id,
        idempotency_key=launch_key(node.id),
        history=[],
        deadline_at=now + dt.timedelta(seconds=settings.launch_deadline_s),
    )
    return node, op


def add_replica(session: Session, pool: Pool, node: Node, gpu_ids: tuple[int, ...], now: dt.datetime, *,
                replaces: Replica | None = None) -> Replica:
    replica = Replica(
        id=uuid.uuid4(), node_id=node.id, pool_id=pool.id, variant_id=pool.variant_id, state=R.pending,
        desired_state=ReplicaDesiredState.running, gpu_ids=sorted(gpu_ids),
        replaces_id=replaces.id if replaces is not None else None, created_at=now, metrics={}, ready_breakdown={},
        restarts=0,
    )
    session.add(replica)
    return replica


def stop_replica(replica: Replica, nodes: dict[uuid.UUID, Node], now: dt.datetime, settings: Settings, *,
                 reason: str) -> None:
    """Tell a replica to drain and stop. The edge stops routing to it with the next snapshot
    (``draining``); its agent finishes in-flight requests, stops the engine and reports it."""
    if replica.desired_state == ReplicaDesiredState.stopped:
        return
    replica.desired_state = ReplicaDesiredState.stopped
    replica.drain_deadline_at = now + dt.timedelta(seconds=settings.drain_timeout_s)
    node = nodes.get(replica.node_id)
    if replica.state == R.pending and (node is None or node.agent_url is None):
        replica.state = R.stopped  # no agent has seen it: nothing runs
    elif replica.state in (R.pending, R.starting, R.ready):
        replica.state = R.draining
    replica.stop_reason = reason[:200]


def record_consolidation(session: Session, node: Node, action: ConsolidationAction, pools: dict[uuid.UUID, Pool],
                         now: dt.datetime) -> None:
    """The move is shown where operators look: on the node, and as a decision of every pool it moves."""
    node.metrics = {**(node.metrics or {}), "consolidation": {
        "at": now.isoformat(), "kind": action.kind, "reason": action.reason,
        "savings_per_hour": round(action.savings_per_hour, 4), "disruption_cost": round(action.disruption_cost, 4),
        "score": round(action.score, 3), "moves": len(action.moves)}}
    for pool_id in sorted({m.pool_id for m in action.moves}):
        size = pools[uuid.UUID(pool_id)].desired_replicas  # a move changes where, never how many
        session.add(AutoscalerDecision(
            pool_id=uuid.UUID(pool_id), created_at=now, current_replicas=size, target_replicas=size,
            action="consolidate", reasons=[action.reason],
            signals={"node_id": action.node_id, "kind": action.kind, "score": round(action.score, 3),
                     "savings_per_hour": round(action.savings_per_hour, 4)},
        ))
