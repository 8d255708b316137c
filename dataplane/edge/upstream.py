"""A lean HTTP/1.1 client for edge -> engine calls: keep-alive pool, httptools' C parser, no more.

The edge makes exactly one kind of call (POST JSON, read a JSON body or an SSE stream), and a
general client's per-request machinery was the largest CPU cost on the edge's hot path. This one
does only what that call needs:

* a pool of idle keep-alive connections per host:port; a connection goes back only after a
  complete response that allows keep-alive, and is dropped otherwise (``close()`` mid-response
  aborts it, which is how a client disconnect cancels the engine's work);
* a request on a *reused* connection that dies before any response byte is retried once on a
  fresh connection (the engine may have closed an idle connection), so that never reaches the
  breaker as a replica failure;
* timeouts: connect, first response byte, and idle time between body chunks;
* back-pressure: body bytes the reader has not taken are bounded (``buffer_bytes``); past the bound
  the engine's connection stops being read until the reader comes back for more, so a client that
  reads slowly slows the engine's socket (its own flow control) instead of growing the edge;
* an optional *sink*: a synchronous callable that takes body bytes straight from the parser while
  the reader is parked waiting. A streamed token then costs no future, no timer and no task
  wake-up; only what the sink refuses (the first and last events, usage, errors, anything while
  the client's socket is backed up) goes through ``iter_chunks``, in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import httptools


class UpstreamError(ConnectionError):
    """The replica could not be reached or broke the response."""


class ConnectFailed(UpstreamError):
    """No connection to the replica: the request never reached it."""


class UpstreamResponse:
    __slots__ = ("_buffered", "_chunks", "_conn", "_error", "_headers", "_idle_timeout", "_last_rx", "_limit", "_loop",
                 "_paused", "_sink", "_waiter", "_watchdog", "complete", "keep_alive", "pauses", "status")

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop, buffer_bytes: int = 256 * 1024) -> None:
        self._conn = conn
        self._loop = loop
        self._limit = buffer_bytes
        self._buffered = 0
        self._paused = False
        self.pauses = 0  # times the engine's connection was paused for this response
        self._headers: asyncio.Future = loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self._last_rx = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._idle_timeout = 0.0
        self._error: BaseException | None = None
        self.status = 0
        self.complete = False
        self.keep_alive = False

    # ---- parser side ----

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _on_headers(self, status: int) -> None:
        self.status = status
        if not self._headers.done():
            self._headers.set_result(None)

    def _on_body(self, data: bytes) -> None:
        self._last_rx = self._loop.time()
        w = self._waiter
        # The sink may take the bytes only while the reader is parked with nothing in hand or
        # queued; otherwise they would overtake bytes the reader has yet to forward.
        if self._sink is not None and w is not None and not w.done() and not self._chunks:
            try:
                if self._sink(data):
                    return
            except Exception as exc:  # a broken sink must surface in the reader, not in the parser
                self._sink = None
                self._chunks.append(data)
                self._fail(exc)
                return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > self._limit and not self._paused:
            self._pause()
        self._wake()

    def _pause(self) -> None:
        transport = self._conn.transport if self._conn is not None else None
        if transport is not None and not self._conn.closed:
            try:
                transport.pause_reading()
            except (RuntimeError, AttributeError):  # closing already
                return
            self._paused = True
            self.pauses += 1

    def _resume(self) -> None:
        if not self._paused:
            return
        self._paused = False
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.closed:
            try:
                conn.transport.resume_reading()
            except (RuntimeError, AttributeError):
                pass

    def _on_complete(self, keep_alive: bool) -> None:
        self.complete = True
        self.keep_alive = keep_alive
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.complete:
            return
        self._error = exc
        if not self._headers.done():
            self._headers.set_exception(exc)
        self._wake()

    @property
    def started(self) -> bool:
        return self._headers.done() and not self._headers.exception()

    # ---- caller side ----

    async def _wait_headers(self, limit_s: float) -> None:
        handle = self._loop.call_later(limit_s, self._headers_timeout)
        try:
            await self._headers
        finally:
            handle.cancel()

    def _headers_timeout(self) -> None:
        if not self._headers.done():
            self._error = TimeoutError("no response from upstream")
            self._headers.set_exception(TimeoutError("no response from upstream"))

    def set_sink(self, sink: Callable[[bytes], bool] | None) -> None:
        """Hand body bytes to ``sink`` while the reader waits; it returns False to refuse them, and
        refused bytes come out of ``iter_chunks`` as usual."""
        self._sink = sink

    async def iter_chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (already de-chunked) and not taken by the sink; raises on a
        broken stream, or when no byte arrived for ``idle_timeout`` while the reader waited."""
        if idle_timeout != self._idle_timeout:
            self._cancel_watchdog()
            self._idle_timeout = idle_timeout
        while True:
            if self._chunks:
                chunks = self._chunks
                self._buffered = 0
                yield chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
                continue
            if self.complete:
                return
            if self._error is not None:
                raise UpstreamError(f"upstream broke the response: {self._error!r}")
            if self._paused:
                self._resume()  # the reader is back for more: let the engine's bytes flow again
            self._waiter = self._loop.create_future()
            self._last_rx = self._loop.time()
            if self._watchdog is None:
                # One lazily re-armed timer per stream, not one per chunk: bytes the sink takes
                # never wake the reader, so the timer looks at when bytes last arrived instead.
                self._watchdog = self._loop.call_later(idle_timeout, self._check_idle)
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _check_idle(self) -> None:
        self._watchdog = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # the reader is busy (e.g. with a slow client), not waiting on us: its next wait re-arms
        idle = self._loop.time() - self._last_rx
        if idle >= self._idle_timeout:
            waiter.set_exception(TimeoutError("upstream stalled"))
        else:
            self._watchdog = self._loop.call_later(self._idle_timeout - idle, self._check_idle)

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def read(self, idle_timeout: float) -> bytes:
        parts = [chunk async for chunk in self.iter_chunks(idle_timeout)]
        return b"".join(parts)

    def close(self) -> None:
        """Give the connection back if the response is complete, else abort it."""
        self._cancel_watchdog()
        self._sink = None
        if self._paused:
            self._resume()
        conn = self._conn
        if conn is None:
            return
        self._conn = None  # type: ignore[assignment]
        if self.complete and self.keep_alive and self._error is None and not conn.closed:
            conn.response = None
            conn.pool.release(conn)
        else:
            conn.abort()


class _Conn(asyncio.Protocol):
    def __init__(self, pool: _HostPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.used = 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.response is not None:
                self.response._fail(exc)
            self.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response._fail(exc or ConnectionResetError("upstream closed the connection"))

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # httptools callbacks
    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response._on_headers(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._on_body(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response._on_complete(self.parser.should_keep_alive())


class _HostPool:
    def __init__(self, host: str, port: int, max_idle: int) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.idle: list[_Conn] = []

    def release(self, conn: _Conn) -> None:
        if len(self.idle) < self.max_idle:
            conn.parser = httptools.HttpResponseParser(conn)
            self.idle.append(conn)
        else:
            conn.abort()

    def take_idle(self) -> _Conn | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self, limit_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(limit_s):
                _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc
        return conn


class UpstreamClient:
    def __init__(self, max_idle_per_host: int = 256, buffer_bytes: int = 256 * 1024) -> None:
        self.max_idle_per_host = max_idle_per_host
        self.buffer_bytes = buffer_bytes
        self._pools: dict[str, tuple[_HostPool, bytes]] = {}

    def _pool(self, base_url: str) -> tuple[_HostPool, bytes]:
        found = self._pools.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            host, port = parts.hostname or "127.0.0.1", parts.port or 80
            found = (_HostPool(host, port, self.max_idle_per_host), f"{host}:{port}".encode())
            self._pools[base_url] = found
        return found

    async def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str], *,
                   connect_timeout: float, first_byte_timeout: float) -> UpstreamResponse:
        pool, host_header = self._pool(base_url)
        head = [b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", host_header,
                b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        request = b"".join(head) + body
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = pool.take_idle() if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await pool.connect(connect_timeout)
            resp = UpstreamResponse(conn, loop, self.buffer_bytes)
            conn.response = resp
            conn.used += 1
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                await resp._wait_headers(first_byte_timeout)
                return resp
            except TimeoutError:
                resp.close()
                raise
            except asyncio.CancelledError:
                resp.close()  # the client left: abort, which cancels the engine's work
                raise
            except Exception as exc:
                resp.close()
                if reused and not resp._chunks:
                    continue  # a stale keep-alive connection: try once on a fresh one
                raise UpstreamError(f"upstream failed before answering: {exc!r}") from exc
        raise UpstreamError("unreachable")

    def close(self) -> None:
        for pool, _ in self._pools.values():
            for conn in pool.idle:
                conn.abort()
            pool.idle.clear()
