"""The agent's own HTTP endpoints (a bare ASGI app: three read-only routes need no framework).

- ``GET /health``: 200 while serving, **503 once draining** (load balancers and the control
  plane stop sending work); the body names the node, its state and each replica's state.
- ``GET /status``: everything the agent knows (replicas with pids, ports, restarts, timings).
- ``GET /metrics``: Prometheus text of the agent's own registry (see ``metrics.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class AgentHttp:
    def __init__(self, status: Callable[[], dict], registry: CollectorRegistry) -> None:
        self.status = status
        self.registry = registry

    async def __call__(self, scope, receive, send) -> None:
        # Served with lifespan="off" (agent._serve_http): only HTTP scopes arrive.
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method not in ("GET", "HEAD"):
            await self._send(send, 405, b'{"detail":"method not allowed"}', "application/json")
        elif path == "/health":
            status = self.status()
            code = 503 if status["draining"] else 200
            body = {"status": "draining" if status["draining"] else "ok", "node_id": status["node_id"],
                    "replicas": {r["id"]: r["state"] for r in status["replicas"]},
                    "restarts": sum(r["restarts"] for r in status["replicas"])}
            await self._send(send, code, json.dumps(body).encode(), "application/json")
        elif path == "/status":
            await self._send(send, 200, json.dumps(self.status(), default=str).encode(), "application/json")
        elif path == "/metrics":
            await self._send(send, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        else:
            await self._send(send, 404, b'{"detail":"not found"}', "application/json")

    @staticmethod
    async def _send(send, status: int, body: bytes, content_type: str) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
