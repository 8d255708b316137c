"""How the edge answers a client: a typed response writer.

A response is either whole (``respond``: status, headers and body at once, sent with a
Content-Length) or a stream (``start_stream``, then ``write`` / ``write_now`` per chunk, then
``end``). ``ConnectionWriter`` puts either straight on the client's connection
(``dataplane.httpserver``); a slow reader pauses the writer (flow control) instead of growing the
edge's memory.
"""

from __future__ import annotations

from typing import Protocol

from dataplane import httpserver

Headers = list[tuple[bytes, bytes]]

JSON_HEADERS: Headers = [(b"content-type", httpserver.JSON_TYPE)]
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ResponseWriter(Protocol):
    def respond(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole response."""

    def start_stream(self, status: int, headers: Headers) -> None:
        """The head of a streamed (chunked) response."""

    async def write(self, chunk: bytes) -> None:
        """One chunk of a started stream; waits while the client is behind."""

    def write_now(self, chunk: bytes) -> bool:
        """One chunk without waiting (the streamed-token hot path); False, and nothing written,
        when the stream has not started or the client is gone or behind: then ``write``."""

    def end(self, tail: bytes = b"") -> None:
        """The stream's last bytes."""


def header_pairs(pairs: dict[str, str]) -> Headers:
    return [(k.encode(), v.encode()) for k, v in pairs.items()]


def respond_json(writer: ResponseWriter, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
    writer.respond(status, JSON_HEADERS + header_pairs(extra) if extra else JSON_HEADERS, body)


class ConnectionWriter:
    __slots__ = ("conn", "streaming")

    def __init__(self, conn: httpserver.Connection) -> None:
        self.conn = conn
        self.streaming = False

    def respond(self, status: int, headers: Headers, body: bytes) -> None:
        self.conn.write_raw_response(status, httpserver.render_headers(headers), body)

    def start_stream(self, status: int, headers: Headers) -> None:
        self.streaming = True
        self.conn.start_raw_chunked(status, httpserver.render_headers(headers))

    async def write(self, chunk: bytes) -> None:
        self.conn.write_chunk(chunk)
        await self.conn.drain()

    def write_now(self, chunk: bytes) -> bool:
        if not self.streaming or not self.conn.writable:
            return False
        self.conn.write_chunk(chunk)
        return True

    def end(self, tail: bytes = b"") -> None:
        self.conn.end_chunked(tail)
