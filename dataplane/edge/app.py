"""The edge's HTTP front: routes on ``dataplane.httpserver`` (no framework on the hot path, so the
edge adds as little as possible to every request and every token) around ``EdgeService``."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any
from urllib.parse import unquote

from dataplane import httpserver
from dataplane.edge import batch_api, door, errors, readiness
from dataplane.edge.service import EdgeService, send_json
from dataplane.edge.validation import INFERENCE_ROUTES

log = logging.getLogger("nimbus.edge.app")

EARLY_ROUTES = frozenset(path.encode() for path in INFERENCE_ROUTES)
# In-flight streams get this long to finish when the edge is told to stop.
SHUTDOWN_GRACE_S = 30.0


class ConnectionSend:
    """``EdgeService`` speaks ASGI-shaped messages (``http.response.start`` / ``.body`` with
    ``more_body``); this writes them straight to the client's connection: a single body becomes a
    Content-Length response, ``more_body`` turns it into a chunked stream, and a slow reader
    pauses the writer (flow control) instead of growing the edge's memory."""

    __slots__ = ("conn", "headers", "status", "streaming")

    def __init__(self, conn: httpserver.Connection) -> None:
        self.conn = conn
        self.status = 200
        self.headers = b""
        self.streaming = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = httpserver.render_headers(message.get("headers", ()))
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        conn = self.conn
        if not self.streaming:
            if not more:
                conn.write_raw_response(self.status, self.headers, body)
                return
            self.streaming = True
            conn.start_raw_chunked(self.status, self.headers)
        if more:
            conn.write_chunk(body)
            await conn.drain()
        else:
            conn.end_chunked(body)

    def write_now(self, body: bytes) -> bool:
        """Write one chunk of a started stream synchronously (no coroutine: the streamed-token hot
        path). False when the stream has not started or the client is gone or backed up; the caller
        then sends through ``__call__``, which waits for the drain."""
        if not self.streaming or not self.conn.writable:
            return False
        self.conn.write_chunk(body)
        return True


class EdgeApp:
    def __init__(self, service: EdgeService) -> None:
        self.service = service
        s = service.settings
        self.throttle = door.AddressThrottle(s.unauth_rate_per_s, s.unauth_burst)
        self.check_credentials = door.CredentialCheck(lambda: self.service.catalog, edge_token=s.edge_token)
        self.batch_api = batch_api.BatchApiForwarder(s.control_plane_url, s.edge_token)

    def early(self, conn: httpserver.Connection, method: bytes, url: bytes,
              headers: dict[bytes, bytes]) -> httpserver.EarlyAnswer | None:
        """Before an inference request's body is read: without valid credentials it is answered now."""
        auth = headers.get(b"authorization")
        check = self.check_credentials
        if auth in check._passed and check._catalog is self.service.catalog:  # a key that passed already
            return None
        path = url.partition(b"?")[0]
        if method != b"POST" or (path not in EARLY_ROUTES and path != b"/v1/files"):  # uploads: before 100 MiB
            return None
        exc = self.check_credentials(auth)
        if exc is None:
            return None
        exc = door.authentication_error(exc, self.throttle, conn.client)
        self.service.metrics.child(self.service.metrics.unauthenticated, str(exc.status)).inc()
        return exc.status, httpserver.render_headers([(b"content-type", httpserver.JSON_TYPE)] + [
            (k.encode(), v.encode()) for k, v in exc.headers.items()]), exc.body()

    async def dispatch(self, request: httpserver.Request) -> None:
        path, method = request.path, request.method
        send = ConnectionSend(request.conn)
        try:
            kind = INFERENCE_ROUTES.get(path)
            if kind is not None:
                if method != "POST":
                    raise errors.EdgeError(405, "Use POST.", code="method_not_allowed")
                if not request.early_checked:  # a pipelined request: the early check did not run
                    exc = self.check_credentials(request.headers.get(b"authorization"))
                    if exc is not None:
                        raise exc
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.items()}
                # A client that goes away cancels its request, which aborts the upstream call.
                task = asyncio.current_task()
                assert task is not None
                request.conn.on_close(task.cancel)
                await self.service.handle_inference(kind, headers, request.body, send)
            elif path == "/v1/models" and method == "GET":
                auth = request.headers.get(b"authorization")
                await send_json(send, 200, self.service.list_models(auth.decode("latin-1") if auth else None))
            elif path.startswith("/v1/models/") and len(path) > len("/v1/models/") and method == "GET":
                auth = request.headers.get(b"authorization")
                await send_json(send, 200, self.service.retrieve_model(auth.decode("latin-1") if auth else None,
                                                                       unquote(path[len("/v1/models/"):])))
            elif batch_api.routes(path):
                status, kind, body = await self.batch_api.forward(self.service.catalog, request)
                await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
                await send({"type": "http.response.body", "body": body})
            elif path == "/health":
                await send_json(send, 200, b'{"status":"ok"}')
            elif path.startswith("/health/") and method == "GET":
                if path == "/health/ready":
                    status, body = readiness.region_health(self.service)
                elif path.startswith("/health/models/") and len(path) > len("/health/models/"):
                    status, body = readiness.model_health(self.service, unquote(path[len("/health/models/"):]))
                else:
                    raise errors.EdgeError(404, f"No route for {method} {path}.", code="not_found")
                await send_json(send, status, body, {"cache-control": "no-store"})
            elif path == "/ready":
                ready = self.service.catalog is not None
                await send_json(send, 200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
            elif path == "/metrics":
                self.service.metrics.snapshot_age.set(self.service.snapshot_age())
                request.conn.write_response(200, self.service.metrics.render(), b"text/plain; version=0.0.4")
            else:
                raise errors.EdgeError(404, f"No route for {method} {path}.", code="not_found")
        except errors.EdgeError as exc:
            if exc.status == 401:
                exc = door.authentication_error(exc, self.throttle, request.conn.client)
                self.service.metrics.child(self.service.metrics.unauthenticated, str(exc.status)).inc()
            await send_json(send, exc.status, exc.body(), exc.headers)

    def server_options(self, fd_limit: int | None = None) -> httpserver.ServerOptions:
        return door.server_options(self.service.settings, self.early,
                                   httpserver.fd_limit() if fd_limit is None else fd_limit)

    async def serve_forever(self, host: str, port: int) -> None:
        """Start the service (snapshot, limits, usage), serve until SIGTERM/SIGINT, then stop
        accepting, let in-flight requests finish and flush usage."""
        await self.service.start()
        server = await httpserver.serve(self.dispatch, host, port, self.server_options(httpserver.fd_limit(True)))
        log.info("edge listening on %s:%d", host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await server.shutdown(SHUTDOWN_GRACE_S)
            await self.batch_api.stop()
            await self.service.stop()
