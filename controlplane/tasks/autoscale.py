"""Autoscaler tick: decide every pool's replica count; the fleet tick places the replicas."""

from __future__ import annotations

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import autoscaling
from controlplane.tasks import runtime
from controlplane.tasks.app import app


@app.task(name="nimbus.autoscale")
def autoscale() -> dict[str, int]:
    settings = runtime.settings()
    with session_scope(settings) as session:
        return autoscaling.autoscale_tick(session, settings, utcnow())
