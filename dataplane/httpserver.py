"""A minimal HTTP/1.1 server: asyncio protocol + httptools parser, nothing else. The simulator
and the edge both serve through it.

Why not ASGI on uvicorn: a streamed token through ASGI costs a coroutine wake-up plus
uvicorn's ``send`` (about 35-40 us of CPU per event, measured), which caps one process at
roughly 200 concurrent streams, and a whole request/response cycle through uvicorn cost the
edge about a fifth of its CPU at peak load (py-spy). Here a handler writes straight into the
socket's transport (about 8-10 us per event).

Scope: keep-alive with an idle timeout, ``Expect: 100-continue``, Content-Length bodies with a
size limit, chunked responses for streams, pipelined requests answered in order, write flow
control (``await conn.drain()`` while the client reads slower than we write), and a graceful
shutdown that lets in-flight responses finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
import msgspec

log = logging.getLogger("nimbus.http")
_json = msgspec.json.Encoder()
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Content Too Large",
            429: b"Too Many Requests", 499: b"Client Closed Request", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}
JSON_TYPE = b"application/json"
MAX_BODY = 64 << 20


@dataclass(frozen=True)
class ServerOptions:
    max_body: int = MAX_BODY
    # What a client whose body is too large gets (the edge answers in OpenAI's error shape).
    too_large_type: bytes = b"text/plain"
    too_large_body: bytes = b"request body too large"
    # An idle keep-alive connection is closed after this long (uvicorn's default is 5 s; load
    # balancers keep theirs for 60 s, so ours must outlive theirs or they race on reuse).
    keep_alive_s: float = 75.0


class Request:
    __slots__ = ("body", "conn", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, conn: Connection, method: str, path: str, headers: dict[bytes, bytes], body: bytes,
                 keep_alive: bool = True, query: bytes = b""):
        self.conn, self.method, self.path, self.headers, self.body = conn, method, path, headers, body
        self.keep_alive = keep_alive
        self.query = query

    # -- whole responses ---------------------------------------------------------------------
    def send(self, status: int, body: bytes, content_type: bytes = b"text/plain; charset=utf-8") -> None:
        self.conn.write_response(status, body, content_type)

    def json(self, status: int, payload) -> None:
        self.conn.write_response(status, _json.encode(payload), JSON_TYPE)

    # -- streams -----------------------------------------------------------------------------
    def start_sse(self) -> None:
        self.conn.start_chunked(200, b"text/event-stream", b"cache-control: no-cache\r\n")

    def sse(self, payload) -> None:
        self.conn.write_chunk(b"data: " + _json.encode(payload) + b"\n\n")

    def sse_raw(self, event: bytes) -> None:
        """An already encoded ``data: ...\\n\\n`` event (the hot path of token streaming)."""
        self.conn.write_chunk(event)

    def sse_done(self) -> None:
        self.conn.write_chunk(b"data: [DONE]\n\n")
        self.conn.end_chunked()

    @property
    def disconnected(self) -> bool:
        return self.conn.closed


Handler = Callable[[Request], Awaitable[None]]


def render_headers(pairs) -> bytes:
    """``[(name, value), ...]`` (bytes) as header lines."""
    return b"".join(b"%s: %s\r\n" % (name, value) for name, value in pairs)


class Connection(asyncio.Protocol):
    """One client connection. A response is complete when ``write_response`` or
    ``end_chunked`` runs, not when the handler coroutine returns, so a handler may hand a
    stream to the engine and return. The socket keeps being read while a response is in
    progress, so a client that goes away is noticed at once (and its request aborted)."""

    def __init__(self, dispatch: Handler, options: ServerOptions, registry: set[Connection] | None = None):
        self._dispatch = dispatch
        self._options = options
        self._registry = registry
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._close_callbacks: list[Callable[[], None]] = []
        self._current: Request | None = None
        self._queue: deque[Request] = deque()  # pipelined requests wait their turn
        self._streaming = False
        self._task: asyncio.Future | None = None
        self._paused = False
        self._drained: asyncio.Future | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._shutting_down = False
        self.on_message_begin()

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if self._registry is not None:
            self._registry.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b"text/plain", b"upgrades are not supported")
        except httptools.HttpParserError:
            if self._body_size > self._options.max_body:
                self._fail(413, self._options.too_large_type, self._options.too_large_body)
            else:
                self._fail(400, b"text/plain", b"malformed request")

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._registry is not None:
            self._registry.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing abort must not take the server down
                log.exception("close callback failed")

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def drain(self) -> None:
        """Wait while the client is slower than we write (the transport's buffer is over its high
        mark); returns at once otherwise, and when the client is gone."""
        if self._paused and not self.closed:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    @property
    def writable(self) -> bool:
        """The client is there and keeping up: a write now will not grow our buffer past its mark."""
        return not self._paused and not self.closed

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` if the client goes away before the response is complete."""
        self._close_callbacks.append(callback)

    # -- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._options.max_body:
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self._url.partition(b"?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(self, self._parser.get_method().decode(), path.decode("latin-1"), self._headers, body,
                          self._parser.should_keep_alive() and not self._shutting_down, query)
        if self._current is None:
            self._start(request)
        else:
            self._queue.append(request)

    def _start(self, request: Request) -> None:
        self._current = request
        self._task = asyncio.ensure_future(self._run(request))

    async def _run(self, request: Request) -> None:
        try:
            await self._dispatch(request)
        except asyncio.CancelledError:
            pass  # the client went away (an ``on_close`` callback cancelled the handler)
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.path)
            if self._current is request and not self._streaming:
                self.write_response(500, b"Internal Server Error", b"text/plain")
            elif self._current is request and self.transport is not None:
                self.transport.close()  # a stream cut short: closing is the only honest signal left

    # -- writing -----------------------------------------------------------------------------
    def _head(self, status: int, headers: bytes, framing: bytes) -> bytes:
        reason = _REASONS.get(status, b"Unknown")
        keep = self._current is None or self._current.keep_alive
        return (b"HTTP/1.1 %d %s\r\n%s%sconnection: %s\r\n\r\n"
                % (status, reason, headers, framing, b"keep-alive" if keep else b"close"))

    def write_response(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        self.write_raw_response(status, b"content-type: %s\r\n%s" % (content_type, extra), body)

    def write_raw_response(self, status: int, headers: bytes, body: bytes) -> None:
        """A whole response; ``headers`` are rendered header lines (content-type included)."""
        if self.closed or self._streaming:
            return
        self.transport.write(self._head(status, headers, b"content-length: %d\r\n" % len(body)) + body)
        self._complete()

    def start_chunked(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        self.start_raw_chunked(status, b"content-type: %s\r\n%s" % (content_type, extra))

    def start_raw_chunked(self, status: int, headers: bytes) -> None:
        if self.closed:
            return
        self._streaming = True
        self.transport.write(self._head(status, headers, b"transfer-encoding: chunked\r\n"))

    def write_chunk(self, data: bytes) -> None:
        if not self.closed and data:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunked(self, tail: bytes = b"") -> None:
        if self.closed or not self._streaming:
            return
        if tail:
            self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        else:
            self.transport.write(b"0\r\n\r\n")
        self._streaming = False
        self._complete()

    def _complete(self) -> None:
        self._close_callbacks.clear()
        keep_alive = self._current is None or self._current.keep_alive
        self._current = None
        if not keep_alive:
            self.transport.close()
        elif self._queue:
            self._start(self._queue.popleft())
        else:
            self._arm_idle_timer()

    def _arm_idle_timer(self) -> None:
        if self._shutting_down:
            self.transport.close()
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(self._options.keep_alive_s, self._close_if_idle)

    def _close_if_idle(self) -> None:
        if not self.busy and not self.closed and self.transport is not None:
            self.transport.close()

    def shutdown(self) -> None:
        """Finish the response in progress (if any), then close."""
        self._shutting_down = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    def _fail(self, status: int, content_type: bytes, message: bytes) -> None:
        if self.transport and not self.closed:
            head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
                status, _REASONS.get(status, b"Unknown"), content_type, len(message))
            self.transport.write(head + message)
            self.transport.close()


class HttpServer:
    """A listening socket and its connections, with a graceful shutdown."""

    def __init__(self, server: asyncio.Server, connections: set[Connection]) -> None:
        self.server = server
        self.connections = connections

    def busy(self) -> int:
        return sum(1 for c in self.connections if c.busy)

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting, let the responses in progress finish for up to ``grace_s``, close the rest."""
        self.server.close()
        for conn in list(self.connections):
            conn.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.busy() and loop.time() < deadline:  # noqa: ASYNC110 (once, at shutdown)
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()

    def close(self) -> None:
        self.server.close()


async def serve(dispatch: Handler, host: str, port: int, options: ServerOptions | None = None) -> HttpServer:
    loop = asyncio.get_running_loop()
    opts = options or ServerOptions()
    connections: set[Connection] = set()
    server = await loop.create_server(lambda: Connection(dispatch, opts, connections), host, port,
                                      reuse_address=True, backlog=4096)
    return HttpServer(server, connections)
