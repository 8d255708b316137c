"""The fleet tick's row writes: new nodes, placed replicas, replica stops, node releases,
consolidation records, and the column changes to the rows the tick read.

Each function is the one author of its change, so the rules live once: a node row and its launch
operation are written before any cloud call (write-before-launch, so the sweeper can tell ours
from leaks); a replica row exists before its agent hears of it; a replica told to stop leaves the
edge's routing at once and keeps its GPUs until its agent reports the engine stopped.

The tick reads the fleet as plain rows (:mod:`controlplane.fleet.reads`), not ORM objects, so
their changes go through :class:`RowWrites`: it records each changed column and writes them all
at once, one ``UPDATE … WHERE id IN`` per set of equal values and one executemany per set of
columns otherwise, whatever the fleet's size. New rows are still ORM objects added to the session.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.fleet.capacity import ConsolidationAction, NewNode
from controlplane.fleet.nodes import ENDS_REPLICAS
from controlplane.fleet.provisioning import begin_termination, launch_key
from controlplane.fleet.reads import NodeRow, PoolRow, ReplicaRow, node_row, replica_row
from controlplane.models import (
    AutoscalerDecision,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)

R = ReplicaState
ID_CHUNK = 5000  # ids per ``UPDATE … WHERE id IN``: far below every driver's parameter limit


class RowWrites:
    """The column changes to rows the tick read as plain values, written in batches.

    ``set`` changes a row in memory and records the columns whose value changed (an equal value
    records nothing, as the ORM writes only changed attributes). ``flush`` writes them: per table
    and set of changed columns, one ``UPDATE … WHERE id IN (…)`` when every row got the same
    values (the reconcile stamp of every pool), an executemany by id otherwise. ``updated_at``
    follows from the column's ``onupdate``, as with the ORM.

    ``touched`` keeps the id of every row changed in memory this tick, written or not (``set``, and
    ``touch`` for rows whose change the database made itself): what the tick rebuilds its derived
    views of (``reconcile.consolidation_slots``).
    """

    def __init__(self) -> None:
        self._pending: dict[Table, dict[uuid.UUID, dict[str, Any]]] = {}
        self.touched: set[uuid.UUID] = set()

    def set(self, row: Any, **values: Any) -> None:
        changed: dict[str, Any] | None = None
        for key, value in values.items():
            if getattr(row, key) == value:
                continue
            setattr(row, key, value)
            if changed is None:
                changed = self._pending.setdefault(row.table, {}).setdefault(row.id, {})
                self.touched.add(row.id)
            changed[key] = value

    def touch(self, row: Any) -> None:
        """``row`` changed in memory to follow a write made otherwise (nothing to write here)."""
        self.touched.add(row.id)

    def take(self, row: Any) -> dict[str, Any]:
        """The changes recorded for ``row``, no longer to be written here (its ORM object writes them)."""
        return self._pending.get(row.table, {}).pop(row.id, {})

    def pending(self, table: Table | None = None) -> int:
        """Rows with changes not written yet (of ``table``, or of every table)."""
        return sum(len(rows) for t, rows in self._pending.items() if table is None or t is table)

    def flush(self, session: Session, table: Table | None = None) -> None:
        """Write the recorded changes (of ``table`` only, if given). Rows the session itself
        added must be flushed first: callers flush the session, then this."""
        for t in [t for t in self._pending if table is None or t is table]:
            by_columns: dict[tuple[str, ...], list[tuple[uuid.UUID, dict[str, Any]]]] = defaultdict(list)
            for row_id, values in self._pending.pop(t).items():
                if values:
                    by_columns[tuple(sorted(values))].append((row_id, values))
            for group in by_columns.values():
                first = group[0][1]
                if all(values == first for _, values in group):
                    ids = [row_id for row_id, _ in group]
                    for start in range(0, len(ids), ID_CHUNK):
                        session.execute(update(t).where(t.c.id.in_(ids[start:start + ID_CHUNK])).values(first))
                else:
                    session.execute(update(t).where(t.c.id == bindparam("row_id_")),
                                    [{"row_id_": row_id, **values} for row_id, values in group])


def add_node(session: Session, new: NewNode, now: dt.datetime, settings: Settings, *, pool_id: uuid.UUID | None,
             reason: str = "placement") -> tuple[NodeRow, Operation]:
    """A pending node of the planned shape (added to the session; returned as the tick's row of
    it), and its launch operation, which the caller adds only after the nodes are flushed: it
    references its node, and no relationship tells the flush to order them. Callers batch: every
    new node, one flush, every operation."""
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
    return node_row(node), op


def add_replica(session: Session, pool: PoolRow, node: NodeRow, gpu_ids: tuple[int, ...], now: dt.datetime, *,
                replaces: ReplicaRow | None = None, spare: bool = False) -> ReplicaRow:
    """A pending replica of ``pool`` on ``gpu_ids`` of ``node`` (added to the session; returned as
    the tick's row of it); ``spare``: above the pool's size, on GPUs billed anyway (``fleet.spares``)."""
    replica = Replica(
        id=uuid.uuid4(), node_id=node.id, pool_id=pool.id, variant_id=pool.variant_id, state=R.pending,
        desired_state=ReplicaDesiredState.running, gpu_ids=sorted(gpu_ids),
        replaces_id=replaces.id if replaces is not None else None, created_at=now, metrics={}, ready_breakdown={},
        restarts=0, spare=spare,
    )
    session.add(replica)
    return replica_row(replica)


def stop_replica(replica: Replica | ReplicaRow, nodes: Mapping[uuid.UUID, Node | NodeRow], now: dt.datetime,
                 settings: Settings, *, reason: str, changes: RowWrites | None = None) -> None:
    """Tell a replica to drain and stop. The edge stops routing to it with the next snapshot
    (``draining``); its agent finishes in-flight requests, stops the engine and reports it.
    ``replica`` is an ORM object, or the tick's row of it with ``changes`` to record the write."""
    if replica.desired_state == ReplicaDesiredState.stopped:
        return
    values: dict[str, Any] = {"desired_state": ReplicaDesiredState.stopped,
                              "drain_deadline_at": now + dt.timedelta(seconds=settings.drain_timeout_s)}
    node = nodes.get(replica.node_id)
    if replica.state == R.pending and (node is None or node.agent_url is None):
        values["state"] = R.stopped  # no agent has seen it: nothing runs
    elif replica.state in (R.pending, R.starting, R.ready):
        values["state"] = R.draining
    values["stop_reason"] = reason[:200]
    if changes is None:
        for key, value in values.items():
            setattr(replica, key, value)
    else:
        changes.set(replica, **values)


def release_nodes(session: Session, changes: RowWrites, releases: Sequence[tuple[NodeRow, str]],
                  replicas: Iterable[ReplicaRow], now: dt.datetime, settings: Settings) -> list[Operation]:
    """Begin the termination of nodes the tick read as rows (``provisioning.begin_termination``,
    so through ``nodes.transition``): their ORM objects are loaded in one statement, take the
    row's unwritten changes, and move; the rows follow, and so do the rows of the replicas the
    transition ended (its UPDATE ends them in the database). Returns the operations begun."""
    if not releases:
        return []
    ids = {row.id for row, _ in releases}
    # The transition ends the node's replicas with an UPDATE: the changes recorded for replicas
    # go first, as the ORM's autoflush wrote them first (a drain written after would revive them).
    if changes.pending(Replica.__table__):
        changes.flush(session, Replica.__table__)
    orm = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_(list(ids))))}
    ops: list[Operation] = []
    ended: dict[uuid.UUID, ReplicaState] = {}
    for row, reason in releases:
        node = orm[row.id]
        for key, value in changes.take(row).items():
            setattr(node, key, value)
        if (op := begin_termination(session, node, now, settings, reason=reason)) is not None:
            ops.append(op)
        row.state, row.drain_deadline_at = node.state, node.drain_deadline_at
        changes.touch(row)
        if (to := ENDS_REPLICAS.get(node.state)) is not None:
            ended[row.id] = to
    for r in replicas:
        if (to := ended.get(r.node_id)) is not None and r.state not in (R.stopped, R.failed):
            r.state, r.desired_state = to, ReplicaDesiredState.stopped
            changes.touch(r)
    return ops


def record_consolidation(session: Session, changes: RowWrites, node: NodeRow, action: ConsolidationAction,
                         pools: Mapping[uuid.UUID, PoolRow], now: dt.datetime) -> None:
    """The move is shown where operators look: on the node, and as a decision of every pool it
    moves. The node's metrics must be loaded (``reads.load_node_metrics``)."""
    assert node.metrics_loaded, "load the node's metrics first"
    changes.set(node, metrics={**(node.metrics or {}), "consolidation": {
        "at": now.isoformat(), "kind": action.kind, "reason": action.reason,
        "savings_per_hour": round(action.savings_per_hour, 4), "disruption_cost": round(action.disruption_cost, 4),
        "score": round(action.score, 3), "moves": len(action.moves)}})
    for pool_id in sorted({m.pool_id for m in action.moves}):
        size = pools[uuid.UUID(pool_id)].desired_replicas  # a move changes where, never how many
        session.add(AutoscalerDecision(
            pool_id=uuid.UUID(pool_id), created_at=now, current_replicas=size, target_replicas=size,
            action="consolidate", reasons=[action.reason],
            signals={"node_id": action.node_id, "kind": action.kind, "score": round(action.score, 3),
                     "savings_per_hour": round(action.savings_per_hour, 4)},
        ))
