"""Provisioning tasks. Each is idempotent and safe to run on many workers at once.

``reconcile`` and ``sweep`` write operations, then fan them out as ``execute_operation``
messages so launches run in parallel across workers; ``dispatch_operations`` (on beat)
re-sends whatever is due, which is how retries and crashed workers' leftovers resume.
A duplicate message is harmless: the operation's lease lets only one worker act.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import launcher, provisioning, sweeper, terminator
from controlplane.fleet import reconcile as fleet_reconcile
from controlplane.models import OperationKind
from controlplane.tasks import runtime
from controlplane.tasks.app import app

EXECUTORS = {OperationKind.launch: launcher.execute, OperationKind.terminate: terminator.execute}


def _fan_out(operations: Iterable[tuple[uuid.UUID, OperationKind]]) -> int:
    expires = runtime.settings().reconcile_interval_s * 4
    n = 0
    for op_id, kind in operations:
        execute_operation.apply_async((str(op_id), kind.value), expires=expires)
        n += 1
    return n


@app.task(name="nimbus.reconcile")
def reconcile() -> dict[str, int]:
    settings = runtime.settings()
    with session_scope(settings) as session:
        result = fleet_reconcile.fleet_tick(session, settings, utcnow())
    # After commit: the operations must exist before a worker looks for them.
    sent = _fan_out(result.operations)
    return {"skipped": int(result.skipped), "pools": result.pools, "placed": result.placed,
            "launched": result.launched, "stopped": result.stopped, "terminated": result.terminated,
            "moves": result.moves, "sent": sent}


@app.task(name="nimbus.dispatch_operations")
def dispatch_operations() -> int:
    settings = runtime.settings()
    with session_scope(settings) as session:
        due = provisioning.due_operations(session, utcnow())
    return _fan_out(due)


@app.task(name="nimbus.execute_operation")
def execute_operation(op_id: str, kind: str) -> str:
    return EXECUTORS[OperationKind(kind)](runtime.settings(), runtime.providers(), uuid.UUID(op_id))


@app.task(name="nimbus.sweep")
def sweep() -> dict[str, int]:
    result = sweeper.sweep(runtime.settings(), runtime.providers())
    _fan_out(result.operations)
    return {"orphans": len(result.orphans), "lost": len(result.lost), "stale": len(result.stale)}
