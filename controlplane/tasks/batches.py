"""Batch API task: run the batches waiting for a worker (``controlplane.batches.runner``).

It is routed to its own queue, ``batches``, served by its own worker: one batch can take hours,
and the fleet's ticks must never wait behind it."""

from __future__ import annotations

from controlplane.batches import runner
from controlplane.tasks import runtime
from controlplane.tasks.app import app

QUEUE = "batches"


@app.task(name="nimbus.run_batches")
def run_batches() -> dict[str, int]:
    return {"batches": runner.run_batches(runtime.settings())}
