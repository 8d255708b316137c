"""The edge's HTTP front: routes on ``dataplane.httpserver`` (no framework on the hot path, so the
edge adds as little as possible to every request and every token) around ``EdgeService``."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from urllib.parse import unquote

from dataplane import httpserver
from dataplane.edge import batch_api, door, errors, readiness, routes
from dataplane.edge.routes import Route
from dataplane.edge.service import EdgeService
from dataplane.edge.writer import ConnectionWriter, respond_json

log = logging.getLogger("nimbus.edge.app")

# In-flight streams get this long to finish when the edge is told to stop.
SHUTDOWN_GRACE_S = 30.0


class EdgeApp:
    def __init__(self, service: EdgeService) -> None:
        self.service = service
        s = service.settings
        self.throttle = door.AddressThrottle(s.unauth_rate_per_s, s.unauth_burst)
        self.check_credentials = door.CredentialCheck(lambda: self.service.catalog, edge_token=s.edge_token)
        self.batch_api_forwarder = batch_api.BatchApiForwarder(s.control_plane_url, s.edge_token)
        self._handlers = {route.handler: getattr(self, route.handler)
                          for route in (*routes.ROUTES.values(), *(r for _, r in routes.PREFIX_ROUTES))}

    def early(self, conn: httpserver.Connection, method: bytes, url: bytes,
              headers: dict[bytes, bytes]) -> httpserver.EarlyAnswer | None:
        """Before an inference request's body is read: without valid credentials it is answered now."""
        auth = headers.get(b"authorization")
        check = self.check_credentials
        if auth in check._passed and check._catalog is self.service.catalog:  # a key that passed already
            return None
        path = url.partition(b"?")[0]
        if method != b"POST" or path not in routes.CREDENTIALS_FIRST:
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
        writer = ConnectionWriter(request.conn)
        try:
            found = routes.match(path)
            if found is None:
                raise errors.EdgeError(404, f"No route for {method} {path}.", code="not_found")
            route, rest = found
            if method not in route.methods:
                raise errors.EdgeError(405, f"Use {' or '.join(sorted(route.methods))}.", code="method_not_allowed",
                                       headers={"allow": ", ".join(sorted(route.methods))})
            pending = self._handlers[route.handler](request, writer, route, rest)
            if pending is not None:
                await pending
        except errors.EdgeError as exc:
            if exc.status == 401:
                exc = door.authentication_error(exc, self.throttle, request.conn.client)
                self.service.metrics.child(self.service.metrics.unauthenticated, str(exc.status)).inc()
            respond_json(writer, exc.status, exc.body(), exc.headers)

    # ------------------------------------------------------------------ handlers (routes.py names them)
    # A handler answers at once, or returns what is left to await (no coroutine for the many
    # answers that need none).

    def inference(self, request: httpserver.Request, writer: ConnectionWriter, route: Route,
                  _: str) -> Awaitable[None]:
        assert route.kind is not None
        if not request.early_checked:  # a pipelined request: the early check did not run
            exc = self.check_credentials(request.headers.get(b"authorization"))
            if exc is not None:
                raise exc
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.items()}
        # A client that goes away cancels its request, which aborts the upstream call.
        task = asyncio.current_task()
        assert task is not None
        request.conn.on_close(task.cancel)
        return self.service.handle_inference(route.kind, headers, request.body, writer)

    def list_models(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        respond_json(writer, 200, self.service.list_models(_authorization(request)))

    def retrieve_model(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, model_id: str) -> None:
        respond_json(writer, 200, self.service.retrieve_model(_authorization(request), unquote(model_id)))

    async def batch_api(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        status, kind, body = await self.batch_api_forwarder.forward(self.service.catalog, request)
        writer.respond(status, [(b"content-type", kind)], body)

    def health(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        respond_json(writer, 200, b'{"status":"ok"}')

    def region_health(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        status, body = readiness.region_health(self.service)
        respond_json(writer, status, body, {"cache-control": "no-store"})

    def model_health(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, name: str) -> None:
        status, body = readiness.model_health(self.service, unquote(name))
        respond_json(writer, status, body, {"cache-control": "no-store"})

    def ready(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        ready = self.service.catalog is not None
        respond_json(writer, 200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))

    def metrics(self, request: httpserver.Request, writer: ConnectionWriter, _: Route, __: str) -> None:
        self.service.metrics.snapshot_age.set(self.service.snapshot_age())
        request.conn.write_response(200, self.service.metrics.render(), b"text/plain; version=0.0.4")

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
            await self.batch_api_forwarder.stop()
            await self.service.stop()


def _authorization(request: httpserver.Request) -> str | None:
    auth = request.headers.get(b"authorization")
    return auth.decode("latin-1") if auth else None
