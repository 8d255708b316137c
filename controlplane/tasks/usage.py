"""Usage rollup task: the edges' Redis stream into minute buckets (see services.usage_rollup)."""

from __future__ import annotations

import redis

from controlplane.db.engine import session_scope
from controlplane.services import usage_rollup
from controlplane.tasks import runtime
from controlplane.tasks.app import app


@app.task(name="nimbus.rollup_usage")
def rollup_usage() -> dict[str, int]:
    settings = runtime.settings()
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        result = usage_rollup.rollup(client, lambda: session_scope(settings), settings.usage_stream)
    finally:
        client.close()
    return {"read": result.read, "counted": result.counted, "reclaimed": result.reclaimed}
