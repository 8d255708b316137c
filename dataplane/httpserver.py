"""A minimal HTTP/1.1 server: asyncio protocol + httptools parser, nothing else. The simulator
and the edge both serve through it.

Why not ASGI on uvicorn: a streamed token through ASGI costs a coroutine wake-up plus
uvicorn's ``send`` (about 35-40 us of CPU per event, measured), which caps one process at
roughly 200 concurrent streams, and a whole request/response cycle through uvicorn cost the
edge about a fifth of its CPU at peak load (py-spy). Here a handler writes straight into the
socket's transport (about 8-10 us per event).

Scope: keep-alive with an idle timeout, ``Expect: 100-continue``, Content-Length and chunked
bodies with a size limit, chunked responses for streams, pipelined requests answered in order,
write flow control (``await conn.drain()`` while the client reads slower than we write), and a
graceful shutdown that lets in-flight responses finish.

Hostile clients (see ``ServerOptions`` for the limits and their defaults):

* every phase of reading a request has a deadline: a new connection and a request's head must
  arrive within ``header_timeout_s``, its body within ``body_timeout_s`` (408 either way), an idle
  keep-alive connection is closed after ``keep_alive_s``; so a slowloris client, a Content-Length
  larger than the body or an unterminated chunked body cannot hold a connection;
* the request head is bounded in bytes and in header count (431), the URL in bytes (414), and
  HTTP/1.1 requests must carry exactly one ``Host`` (400);
* a response the client stops reading for ``send_timeout_s`` is cut (the handler's close callbacks
  run, which is how the edge aborts the engine's work);
* connections are capped in total and per client address; past a cap a new connection gets a 503
  with ``Retry-After`` and is closed, so a flood from one address cannot lock everyone else out;
* an ``early`` hook sees each request's head before its body is read and may answer it at once
  (the edge answers an unauthenticated request with 401 without reading, let alone decoding, its
  body);
* an error answer is followed by a lingering close (our side shut down for writing, the client's
  remaining bytes read and dropped for a moment) so the client gets the answer, not a reset.

Deadlines are checked by one sweeper per server rather than one timer per request: the hot path
only stores a timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
import msgspec

log = logging.getLogger("nimbus.http")
_json = msgspec.json.Encoder()
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Content Too Large",
            414: b"URI Too Long", 422: b"Unprocessable Content", 429: b"Too Many Requests",
            431: b"Request Header Fields Too Large", 499: b"Client Closed Request", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}
JSON_TYPE = b"application/json"
MAX_BODY = 64 << 20
_INF = float("inf")

# What an error answer looks like: (status, message) -> (content type, body).
ErrorRenderer = Callable[[int, str], tuple[bytes, bytes]]
# A response an ``early`` hook may give instead of reading the body: (status, header lines, body).
EarlyAnswer = tuple[int, bytes, bytes]


def plain_error(status: int, message: str) -> tuple[bytes, bytes]:
    return b"text/plain; charset=utf-8", message.encode()


@dataclass(frozen=True)
class ServerOptions:
    max_body: int = MAX_BODY
    # Larger bodies for some paths (URL prefix, byte limit, whole-body deadline in s): file uploads,
    # whose route checks its own size, without raising every other route's limits.
    body_limits: tuple[tuple[bytes, int, float], ...] = ()
    # What a client whose body is too large gets (the edge answers in OpenAI's error shape).
    too_large_type: bytes = b"text/plain"
    too_large_body: bytes = b"request body too large"
    # Every other error the server answers itself (400, 408, 414, 431, 503); plain text unless set.
    render_error: ErrorRenderer | None = None
    # An idle keep-alive connection is closed after this long (uvicorn's default is 5 s; load
    # balancers keep theirs for 60 s, so ours must outlive theirs or they race on reuse).
    keep_alive_s: float = 75.0
    # A new connection's first request head, and any request head once its first byte arrived, must
    # be complete within this (nginx's client_header_timeout is 60 s; Go servers commonly use 10 s;
    # an honest client sends a head in one packet).
    header_timeout_s: float = 10.0
    # A request's whole body must arrive within this after its head (nginx's client_body_timeout is
    # 60 s *between reads*; a whole-body deadline also stops a client that sends a byte a second).
    # 30 s carries a 64 MiB body at ~18 Mbit/s.
    body_timeout_s: float = 30.0
    # A response the client has not read for this long (writes paused the whole time) is cut.
    # None: never (the engine simulator, whose only client is the edge).
    send_timeout_s: float | None = None
    # The request line plus all header lines (nginx's large_client_header_buffers is 4 x 8 KiB).
    max_header_bytes: int = 32 << 10
    max_url_bytes: int = 8 << 10
    max_headers: int = 100  # Apache's LimitRequestFields default
    require_host: bool = True  # RFC 9112 3.2: a 1.1 request without exactly one Host is a 400
    # Requests parsed ahead of the one being answered (pipelining); past it the connection stops
    # taking new ones and closes after answering those it has.
    max_pipelined: int = 16
    # Connection caps (nginx's limit_conn); None: no cap. Past a cap a new connection gets 503.
    max_connections: int | None = None
    max_connections_per_client: int | None = None
    shed_retry_after_s: int = 1
    # How long a connection we answered with an error keeps reading (and dropping) the client's bytes.
    linger_s: float = 2.0
    # Called with (connection, method, raw URL, headers), all bytes, once a request's head is complete,
    # before its body is read; an answer it returns is sent at once and the connection closed.
    early: Callable[[Connection, bytes, bytes, dict[bytes, bytes]], EarlyAnswer | None] | None = None


class Request:
    __slots__ = ("body", "conn", "early_checked", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, conn: Connection, method: str, path: str, headers: dict[bytes, bytes], body: bytes,
                 keep_alive: bool = True, query: bytes = b"", early_checked: bool = False):
        self.conn, self.method, self.path, self.headers, self.body = conn, method, path, headers, body
        self.keep_alive = keep_alive
        self.query = query
        # The ``early`` hook already saw this request's head (it is not run for pipelined requests).
        self.early_checked = early_checked

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


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request we answer with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Where a connection is, for its deadline.
_FRESH, _IDLE, _HEAD, _BODY, _BUSY, _LINGER = range(6)


class Connection(asyncio.Protocol):
    """One client connection. A response is complete when ``write_response`` or
    ``end_chunked`` runs, not when the handler coroutine returns, so a handler may hand a
    stream to the engine and return. The socket keeps being read while a response is in
    progress, so a client that goes away is noticed at once (and its request aborted)."""

    def __init__(self, dispatch: Handler, options: ServerOptions, registry: set[Connection] | None = None,
                 server: HttpServer | None = None):
        self._dispatch = dispatch
        self._options = options
        self._registry = registry
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self._counted = False  # in the server's per-client counts
        self._max_headers = options.max_headers
        self.transport: asyncio.Transport | None = None
        self.client: str = ""
        self.closed = False
        self._close_callbacks: list[Callable[[], None]] = []
        self._current: Request | None = None
        self._queue: deque[Request] = deque()  # pipelined requests wait their turn
        self._queued_bytes = 0
        self._streaming = False
        self._task: asyncio.Future | None = None
        self._paused = False
        self._drained: asyncio.Future | None = None
        self._shutting_down = False
        self._phase = _FRESH
        self.deadline = _INF
        self._in_message = False
        self._head_done = False
        self._head_bytes = 0  # bytes received while a request head was incomplete
        self._stopped = False  # no more requests are parsed on this connection
        self._pending_error: tuple[int, str] | None = None  # answered once the responses before it are done
        self._early_checked = False
        self._max_body = options.max_body
        self._reset_message()

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) and peer else str(peer or "")
        server = self._server
        if server is not None:
            verdict = server.admit(self)
            if verdict is not True:
                if verdict == "shed":
                    self._shed()
                else:
                    self._stopped = True
                    transport.abort()  # shedding too many at once: drop the new one outright
                return
        if self._registry is not None:
            self._registry.add(self)
        self.deadline = self._loop.time() + self._options.header_timeout_s

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return  # lingering, shed, or past an error: the bytes are dropped
        if not self._head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "upgrades are not supported")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):
                self._refuse(cause.status, cause.message)
            else:
                log.error("http parser callback failed: %r", cause)
                self._refuse(400, "malformed request")
        except httptools.HttpParserError:
            self._refuse(400, "malformed request")
        else:
            if not self._head_done and self._in_message and self._head_bytes > self._options.max_header_bytes:
                self._refuse(431, "request header fields too large")

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._stopped = True
        if self._server is not None:
            self._server.forget(self)
        if self._registry is not None:
            self._registry.discard(self)
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
        timeout = self._options.send_timeout_s
        if timeout is not None and self._phase == _BUSY:
            self.deadline = self._loop.time() + timeout

    def resume_writing(self) -> None:
        self._paused = False
        if self._phase == _BUSY:
            self.deadline = _INF
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

    # -- deadlines ---------------------------------------------------------------------------
    def expire(self, now: float) -> None:
        """The sweeper found this connection past its deadline."""
        phase = self._phase
        if self.closed or self.transport is None:
            return
        if phase == _BUSY:
            if self._paused and self._options.send_timeout_s is not None:
                log.info("client %s stopped reading for %.0f s; closing", self.client, self._options.send_timeout_s)
                self.transport.abort()  # its unread buffer is dropped; close callbacks abort the work
            else:
                self.deadline = _INF
        elif phase in (_HEAD, _BODY):
            self._refuse(408, "request head not received in time" if phase == _HEAD
                         else "request body not received in time")
        elif phase == _LINGER:
            self.transport.abort()
        else:  # fresh or idle: nothing half-sent, just close
            self.transport.close()

    # -- httptools callbacks -----------------------------------------------------------------
    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._nheaders = 0
        self._body: list[bytes] = []
        self._body_size = 0

    def on_message_begin(self) -> None:
        # _reset_message, inlined: this runs once per request
        self._url = b""
        self._headers = {}
        self._nheaders = 0
        self._body = []
        self._body_size = 0
        self._in_message = True
        self._head_done = False
        self._early_checked = False
        if self._phase in (_FRESH, _IDLE):
            self._phase = _HEAD
            self.deadline = self._loop.time() + self._options.header_timeout_s

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._options.max_url_bytes:
            raise _Refused(414, "request URL too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        # The head's size is bounded in data_received (bytes while it is incomplete) and measured
        # exactly in on_headers_complete when that bound is not enough; only the count is kept here.
        n = self._nheaders = self._nheaders + 1
        if n > self._max_headers:
            raise _Refused(431, f"more than {self._max_headers} header fields")
        name = name.lower()
        if name == b"host" and name in self._headers:
            raise _Refused(400, "more than one Host header")
        self._headers[name] = value

    def on_headers_complete(self) -> None:
        self._head_done = True
        opts = self._options
        headers = self._headers
        if self._head_bytes > opts.max_header_bytes and len(self._url) + sum(
                len(k) + len(v) + 4 for k, v in headers.items()) > opts.max_header_bytes:
            raise _Refused(431, "request header fields too large")
        self._head_bytes = 0
        if opts.require_host and b"host" not in headers and self._parser.get_http_version() == "1.1":
            raise _Refused(400, "an HTTP/1.1 request needs a Host header")
        self._max_body, body_timeout_s = opts.max_body, opts.body_timeout_s
        for prefix, limit, timeout in opts.body_limits:  # usually one entry (uploads); none on most servers
            if self._url.startswith(prefix):
                self._max_body, body_timeout_s = limit, timeout
                break
        if self._phase == _HEAD:
            self._phase = _BODY
            self.deadline = self._loop.time() + body_timeout_s
        if opts.early is not None and self._current is None and not self._queue:
            self._early_checked = True
            answer = opts.early(self, self._parser.get_method(), self._url, headers)
            if answer is not None:
                self._answer_and_close(*answer)
                raise _Refused(0, "answered early")
        if headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body:
            raise _Refused(413, "request body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._head_done = False
        self._head_bytes = 0
        path, _, query = self._url.partition(b"?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(self, self._parser.get_method().decode(), path.decode("latin-1"), self._headers, body,
                          self._parser.should_keep_alive() and not self._shutting_down, query, self._early_checked)
        if self._current is None:
            self._phase = _BUSY
            self.deadline = _INF
            self._start(request)
        else:
            self._queue.append(request)
            self._queued_bytes += len(body)
            if len(self._queue) >= self._options.max_pipelined or self._queued_bytes > self._options.max_body:
                # Enough is parsed ahead; answer those and close, reading nothing more.
                self._stopped = True
                request.keep_alive = False

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
            request = self._queue.popleft()
            self._queued_bytes -= len(request.body)
            self._start(request)
        elif self._pending_error is not None:
            self._refuse(*self._pending_error)
        elif self._shutting_down or self._stopped:
            self.transport.close()
        else:
            now = self._loop.time()
            if self._in_message:  # the next request began while this one was answered
                self._phase = _BODY if self._head_done else _HEAD
                self.deadline = now + (self._options.body_timeout_s if self._head_done
                                       else self._options.header_timeout_s)
            else:
                self._phase = _IDLE
                self.deadline = now + self._options.keep_alive_s

    def shutdown(self) -> None:
        """Finish the response in progress (if any), then close."""
        self._shutting_down = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    # -- errors ------------------------------------------------------------------------------
    def _refuse(self, status: int, message: str) -> None:
        """Answer a request we will not serve, then close. Status 0: already answered."""
        self._stopped = True
        if status == 0 or self.closed or self.transport is None:
            return
        if self.busy:  # answer in order, after the responses before it
            self._pending_error = (status, message)
            return
        if status == 413:
            content_type, body = self._options.too_large_type, self._options.too_large_body
        else:
            render = self._options.render_error or plain_error
            content_type, body = render(status, message)
        self._answer_and_close(status, b"content-type: %s\r\n" % content_type, body)

    def _answer_and_close(self, status: int, headers: bytes, body: bytes) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
            status, _REASONS.get(status, b"Unknown"), headers, len(body), body))
        self._linger()

    def _linger(self) -> None:
        """Close without a reset: shut our side for writing once the answer is out, and drop what
        the client still sends for up to ``linger_s`` (or until it closes)."""
        self._stopped = True
        self._phase = _LINGER
        self.deadline = self._loop.time() + self._options.linger_s
        transport = self.transport
        try:
            if transport.can_write_eof():
                transport.write_eof()
            else:
                transport.close()
        except (OSError, RuntimeError):
            transport.close()

    def _shed(self) -> None:
        """Over a connection cap: a 503 that says when to come back, then close."""
        opts = self._options
        render = opts.render_error or plain_error
        content_type, body = render(503, "too many connections; retry shortly")
        self._stopped = True
        self._answer_and_close(503, b"content-type: %s\r\nretry-after: %d\r\n" % (content_type, opts.shed_retry_after_s),
                               body)
        # Lingering shed connections are bounded by the server: past its bound they are dropped.
        self.deadline = self._loop.time() + min(opts.linger_s, 1.0)


class HttpServer:
    """A listening socket and its connections, with connection caps, the deadline sweeper and a
    graceful shutdown."""

    def __init__(self, options: ServerOptions, connections: set[Connection]) -> None:
        self.server: asyncio.Server | None = None
        self.options = options
        self.connections = connections
        self.per_client: dict[str, int] = {}
        self.shedding: set[Connection] = set()
        self.shed_total = 0
        self._sweeper: asyncio.Task | None = None

    # -- caps --------------------------------------------------------------------------------
    def admit(self, conn: Connection) -> bool | str:
        """Count a new connection in (True), or say it is over a cap: "shed" (answer 503) or "drop"
        (so many are being shed already that this one is closed without an answer)."""
        opts = self.options
        total_cap, client_cap = opts.max_connections, opts.max_connections_per_client
        count = self.per_client.get(conn.client, 0)
        if (total_cap is not None and len(self.connections) >= total_cap) or (
                client_cap is not None and count >= client_cap):
            self.shed_total += 1
            if len(self.shedding) >= max(64, (total_cap or 1024) // 8):
                return "drop"
            self.shedding.add(conn)
            return "shed"
        self.per_client[conn.client] = count + 1
        conn._counted = True
        return True

    def forget(self, conn: Connection) -> None:
        if conn._counted:
            conn._counted = False
            left = self.per_client.get(conn.client, 1) - 1
            if left > 0:
                self.per_client[conn.client] = left
            else:
                self.per_client.pop(conn.client, None)
        self.shedding.discard(conn)

    # -- deadlines ---------------------------------------------------------------------------
    def sweep_interval(self) -> float:
        o = self.options
        shortest = min(x for x in (o.keep_alive_s, o.header_timeout_s, o.body_timeout_s, o.send_timeout_s or _INF,
                                   o.linger_s) if x > 0)
        return max(0.02, min(1.0, shortest / 5))

    def sweep(self, now: float) -> None:
        for conn in [c for c in self.connections if c.deadline <= now]:
            conn.expire(now)
        for conn in [c for c in self.shedding if c.deadline <= now]:
            if conn.transport is not None:
                conn.transport.abort()
            self.shedding.discard(conn)

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.sweep_interval()
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep(loop.time())
            except Exception:  # never let one bad connection stop the deadlines of all others
                log.exception("connection sweep failed")

    def start_sweeper(self) -> None:
        self._sweeper = asyncio.ensure_future(self._sweep_forever())

    # -- lifecycle ---------------------------------------------------------------------------
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
        for conn in list(self.connections) + list(self.shedding):
            if conn.transport is not None:
                conn.transport.close()
        self._stop_sweeper()

    def _stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def close(self) -> None:
        self.server.close()
        self._stop_sweeper()


def fd_limit(raise_soft: bool = False) -> int:
    """This process's open-file limit; ``raise_soft`` lifts the soft limit to the hard one first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_soft and soft != hard and hard != resource.RLIM_INFINITY:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def serve(dispatch: Handler, host: str, port: int, options: ServerOptions | None = None) -> HttpServer:
    loop = asyncio.get_running_loop()
    opts = options or ServerOptions()
    connections: set[Connection] = set()
    http = HttpServer(opts, connections)
    http.server = await loop.create_server(lambda: Connection(dispatch, opts, connections, http), host, port,
                                           reuse_address=True, backlog=4096)
    http.start_sweeper()
    return http
