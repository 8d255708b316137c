"""A minimal HTTP/1.1 server: asyncio protocol + httptools parser, nothing else.

Why not ASGI on uvicorn: a streamed token through ASGI costs a coroutine wake-up plus
uvicorn's ``send`` (about 35-40 us of CPU per event, measured), which caps one process at
roughly 200 concurrent streams. Here the engine's step loop writes each stream's SSE event
straight into the socket's transport (about 8-10 us), so one core carries several hundred
streams while keeping to the timing model. See ``bench/sim/efficiency.py``.

Scope: keep-alive, ``Expect: 100-continue``, Content-Length bodies, chunked responses for
streams, pipelined requests answered in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import httptools
import msgspec

log = logging.getLogger("nimbus.sim.http")
_json = msgspec.json.Encoder()
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found",
            405: b"Method Not Allowed", 500: b"Internal Server Error", 503: b"Service Unavailable"}
JSON_TYPE = b"application/json"
MAX_BODY = 64 << 20


class Request:
    __slots__ = ("body", "conn", "headers", "keep_alive", "method", "path")

    def __init__(self, conn: Connection, method: str, path: str, headers: dict[bytes, bytes], body: bytes,
                 keep_alive: bool = True):
        self.conn, self.method, self.path, self.headers, self.body = conn, method, path, headers, body
        self.keep_alive = keep_alive

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


class Connection(asyncio.Protocol):
    """One client connection. A response is complete when ``write_response`` or
    ``end_chunked`` runs, not when the handler coroutine returns, so a handler may hand a
    stream to the engine and return. The socket keeps being read while a response is in
    progress, so a client that goes away is noticed at once (and its request aborted)."""

    def __init__(self, dispatch: Callable[[Request], Awaitable[None]]):
        self._dispatch = dispatch
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._close_callbacks: list[Callable[[], None]] = []
        self._current: Request | None = None
        self._queue: deque[Request] = deque()  # pipelined requests wait their turn
        self._streaming = False
        self._task: asyncio.Future | None = None
        self.on_message_begin()

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b"upgrades are not supported")
        except httptools.HttpParserError:
            self._fail(400, b"malformed request")

    def connection_lost(self, exc) -> None:
        self.closed = True
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing abort must not take the server down
                log.exception("close callback failed")

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` if the client goes away before the response is complete."""
        self._close_callbacks.append(callback)

    # -- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > MAX_BODY:
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        request = Request(self, self._parser.get_method().decode(), path, self._headers, b"".join(self._body),
                          self._parser.should_keep_alive())
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
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.path)
            if self._current is request and not self._streaming:
                self.write_response(500, b"Internal Server Error", b"text/plain")

    # -- writing -----------------------------------------------------------------------------
    def _head(self, status: int, content_type: bytes, extra: bytes, framing: bytes, close: bool = False) -> bytes:
        reason = _REASONS.get(status, b"Unknown")
        keep = not close and (self._current is None or self._current.keep_alive)
        return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%sconnection: %s\r\n\r\n"
                % (status, reason, content_type, extra, framing, b"keep-alive" if keep else b"close"))

    def write_response(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        if self.closed or self._streaming:
            return
        self.transport.write(self._head(status, content_type, extra, b"content-length: %d\r\n" % len(body)) + body)
        self._complete()

    def start_chunked(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        if self.closed:
            return
        self._streaming = True
        self.transport.write(self._head(status, content_type, extra, b"transfer-encoding: chunked\r\n"))

    def write_chunk(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunked(self) -> None:
        if self.closed or not self._streaming:
            return
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

    def _fail(self, status: int, message: bytes) -> None:
        if self.transport and not self.closed:
            framing = b"content-length: %d\r\n" % len(message)
            self.transport.write(self._head(status, b"text/plain", b"", framing, close=True) + message)
            self.transport.close()


async def serve(dispatch: Callable[[Request], Awaitable[None]], host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Connection(dispatch), host, port, reuse_address=True, backlog=4096)
