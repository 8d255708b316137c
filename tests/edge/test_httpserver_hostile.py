"""``dataplane.httpserver`` on its own against hostile bytes (in-process, fast), and the pure pieces of
the edge's door: the address throttle, the connection caps' defaults, the JSON depth bound."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane import httpserver
from dataplane.edge import errors
from dataplane.edge.door import AddressThrottle, connection_caps, render_error
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.validation import json_depth, parse_json
from tests.edge.hostile import connect, read_until_closed, request, send_quietly, statuses

FUZZ = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


class ServerThread:
    """An ``httpserver`` with a tiny handler, in a thread of its own, with the given options."""

    def __init__(self, **options) -> None:
        self.options = httpserver.ServerOptions(**{"header_timeout_s": 0.3, "body_timeout_s": 0.3,
                                                   "keep_alive_s": 0.5, "linger_s": 0.3,
                                                   "render_error": render_error, "max_body": 4096, **options})
        self.closed_callbacks = 0
        self.handled = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self._ready.wait(5)

    async def _handle(self, req: httpserver.Request) -> None:
        self.handled += 1
        if req.path == "/stream":  # a large stream, written as fast as the client allows
            def gone() -> None:
                self.closed_callbacks += 1
            req.conn.on_close(gone)
            req.conn.start_chunked(200, b"text/plain")
            for _ in range(2000):
                req.conn.write_chunk(b"x" * 65536)
                await req.conn.drain()
                if req.conn.closed:
                    return
            req.conn.end_chunked()
        else:
            req.send(200, b"ok:" + req.path.encode() + b":" + str(len(req.body)).encode())

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.server = await httpserver.serve(self._handle, "127.0.0.1", 0, self.options)
            self.port = self.server.server.sockets[0].getsockname()[1]
            self._ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def stop(self) -> None:
        async def down() -> None:
            await self.server.shutdown(0.2)

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread()
    yield s
    s.stop()


@st.composite
def hostile_bytes(draw) -> bytes:
    good = request(b"POST", b"/x", [(b"Host", b"h"), (b"Content-Length", b"2")], b"ab")
    kind = draw(st.sampled_from(["random", "mutated", "split_headers", "chunked"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "mutated":  # flip, drop or insert bytes in a valid request
        raw = bytearray(good * draw(st.integers(1, 3)))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            op = draw(st.sampled_from(["flip", "drop", "insert"]))
            if op == "flip":
                raw[i] = draw(st.integers(0, 255))
            elif op == "drop":
                del raw[i]
            else:
                raw.insert(i, draw(st.sampled_from([0, 10, 13, 32, 58, 255])))
        return bytes(raw)
    if kind == "split_headers":
        n = draw(st.integers(0, 150))
        size = draw(st.integers(0, 600))
        return b"GET / HTTP/1.1\r\nHost: h\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * size) for i in range(n)) + (
            b"\r\n" if draw(st.booleans()) else b"")
    chunks = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=4))
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + draw(st.sampled_from([b"0\r\n\r\n", b"", b"0\r\n"]))
    return request(b"POST", b"/c", [(b"Host", b"h"), (b"Transfer-Encoding", b"chunked")], body)


def test_hostile_bytes_never_get_a_5xx_or_an_open_connection(server):
    sockets = []

    @settings(FUZZ, max_examples=500)
    @given(hostile_bytes())
    def one(raw: bytes) -> None:
        sock = connect(server.port)
        send_quietly(sock, raw)
        sockets.append((sock, raw))

    one()
    time.sleep(1.2)  # past every deadline: head, body, keep-alive, linger
    seen: dict[int, int] = {}
    for sock, raw in sockets:
        data, closed, _ = read_until_closed(sock, 0.2)
        sock.close()
        assert closed, raw[:200]
        for code in statuses(data):
            assert code < 500, (raw[:200], data[:300])
            seen[code] = seen.get(code, 0) + 1
    assert seen.get(200) and seen.get(400) and seen.get(408) and seen.get(431), seen
    assert not server.server.connections  # nothing left behind
    sock = connect(server.port)  # still serving
    sock.sendall(request(b"GET", b"/after", [(b"Host", b"h"), (b"Connection", b"close")]))
    data, _, _ = read_until_closed(sock, 2.0)
    assert statuses(data) == [200]


def test_a_client_that_stops_reading_is_cut_after_the_send_timeout():
    s = ServerThread(send_timeout_s=0.5)
    try:
        sock = connect(s.port, rcvbuf=4096)
        sock.sendall(request(b"GET", b"/stream", [(b"Host", b"h")]))
        t0 = time.monotonic()
        while s.closed_callbacks == 0 and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        assert s.closed_callbacks == 1  # the handler's close callback ran (the edge aborts the engine there)
        assert 0.4 < elapsed < 2.0
        sock.close()
    finally:
        s.stop()


def test_early_hook_answers_from_the_head_and_keeps_the_body_unread():
    seen = []

    def early(conn, method, url, headers):
        seen.append((method, url))
        if url.partition(b"?")[0] == b"/deny":
            return 401, b"content-type: application/json\r\n", b'{"error":{}}'
        return None

    s = ServerThread(early=early)
    try:
        sock = connect(s.port)
        sock.sendall(b"POST /deny?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 4000\r\n\r\n")  # no body sent
        data, closed, elapsed = read_until_closed(sock, 2.0)
        assert statuses(data) == [401] and closed and elapsed < 0.5
        sock = connect(s.port)
        sock.sendall(request(b"POST", b"/ok", [(b"Host", b"h"), (b"Content-Length", b"3"), (b"Connection", b"close")],
                             b"abc"))
        data, _, _ = read_until_closed(sock, 2.0)
        assert b"ok:/ok:3" in data
        assert seen == [(b"POST", b"/deny?q=1"), (b"POST", b"/ok")]
        assert s.handled == 1
    finally:
        s.stop()


def test_per_client_cap_sheds_with_503_and_counts_free_up():
    s = ServerThread(max_connections_per_client=3, header_timeout_s=5)
    try:
        held = [connect(s.port) for _ in range(3)]
        time.sleep(0.1)
        data, closed, _ = read_until_closed(connect(s.port), 2.0)
        assert statuses(data) == [503] and b"retry-after: 1" in data.lower() and closed
        for sock in held:
            sock.close()
        time.sleep(0.1)
        sock = connect(s.port)
        sock.sendall(request(b"GET", b"/x", [(b"Host", b"h"), (b"Connection", b"close")]))
        data, _, _ = read_until_closed(sock, 2.0)
        assert statuses(data) == [200]
        assert s.server.per_client == {} or sum(s.server.per_client.values()) <= 1
    finally:
        s.stop()


def test_address_throttle_refills_and_forgets_old_addresses():
    now = [0.0]
    t = AddressThrottle(rate_per_s=2, burst=3, max_addresses=2, clock=lambda: now[0])
    assert [t.spend("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert t.spend("a") == pytest.approx(0.5)
    now[0] += 0.5
    assert t.spend("a") == 0.0
    t.spend("b")
    t.spend("c")  # "a" is the least recently seen: dropped, and starts full again
    assert t.spend("a") == 0.0 and len(t._buckets) == 2


def test_connection_caps_follow_the_fd_limit_unless_set():
    assert connection_caps(EdgeSettings(), 20000) == (9872, 2468)
    assert connection_caps(EdgeSettings(), 1024) == (384, 96)
    assert connection_caps(EdgeSettings(max_connections=100, max_connections_per_client=7), 1024) == (100, 7)


def test_json_depth_is_exact_and_the_bound_is_checked_without_recursion():
    assert json_depth(1, 10) == 0
    assert json_depth({"a": [1, {"b": []}]}, 10) == 4
    deep = b'{"a":' * 64 + b"1" + b"}" * 64
    assert parse_json(deep, 1 << 20, 64)
    with pytest.raises(errors.EdgeError) as exc:
        parse_json(b'{"x":' + deep + b"}", 1 << 20, 64)
    assert exc.value.status == 400 and exc.value.code == "json_too_deep"
    with pytest.raises(errors.EdgeError) as exc:
        parse_json(b"[" * 500_000 + b"]" * 500_000, 1 << 21, 64)
    assert exc.value.code == "json_too_deep"
