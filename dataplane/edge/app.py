"""A bare ASGI application around ``EdgeService``: no framework on the hot path, so the edge adds
as little as possible to every request and every token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from dataplane.edge import errors
from dataplane.edge.service import EdgeService, send_json
from dataplane.edge.validation import CHAT, COMPLETION

log = logging.getLogger("nimbus.edge.app")

INFERENCE_ROUTES = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}


class EdgeApp:
    def __init__(self, service: EdgeService) -> None:
        self.service = service

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.service.start()
                except Exception as exc:  # surface the reason instead of a silent exit
                    log.exception("edge failed to start")
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.service.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive, send) -> None:
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            kind = INFERENCE_ROUTES.get(path)
            if kind is not None:
                if method != "POST":
                    raise errors.EdgeError(405, "Use POST.", code="method_not_allowed")
                raw = await self._read_body(receive, self.service.settings.max_body_bytes)
                await self._with_disconnect(self.service.handle_inference(kind, headers, raw, send), receive)
            elif path == "/v1/models" and method == "GET":
                await send_json(send, 200, self.service.list_models(headers.get("authorization")))
            elif path == "/health":
                await send_json(send, 200, b'{"status":"ok"}')
            elif path == "/ready":
                ready = self.service.catalog is not None
                await send_json(send, 200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
            elif path == "/metrics":
                self.service.metrics.snapshot_age.set(self.service.snapshot_age())
                body = self.service.metrics.render()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
                await send({"type": "http.response.body", "body": body})
            else:
                raise errors.EdgeError(404, f"No route for {method} {path}.", code="not_found")
        except errors.EdgeError as exc:
            await send_json(send, exc.status, exc.body(), exc.headers)

    @staticmethod
    async def _read_body(receive, limit: int) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                raise errors.EdgeError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")
            chunks.append(body)
            if not message.get("more_body"):
                return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    @staticmethod
    async def _with_disconnect(work, receive) -> None:
        """Run the request; if the client disconnects first, cancel it (which aborts the upstream call).
        A done-callback rather than ``asyncio.wait``: this runs once per request on the hot path."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(receive())

        def on_message(fut: asyncio.Future) -> None:
            if not fut.cancelled() and fut.exception() is None and fut.result().get("type") == "http.disconnect":
                if not task.done():
                    task.cancel()

        watcher.add_done_callback(on_message)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            watcher.remove_done_callback(on_message)
            watcher.cancel()
